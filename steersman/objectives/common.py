"""``LossModule``: the base of every loss.

A loss is an ``nn.Module`` from a batch (a TensorDict) to a TensorDict of scalars. Entries
whose name starts with ``loss_`` are summed for the backward pass; every other entry is a
diagnostic (already detached). What a subclass brings:

* ``_AcceptedKeys``: a dataclass of the batch keys it reads and writes, renamable with
  :meth:`LossModule.set_keys`;
* its networks as plain submodules (``self.actor_network``, ``self.value_network``...);
  target networks are frozen copies made by :meth:`LossModule.make_target` (initialised
  equal to the online network; updated by ``SoftUpdate``/``HardUpdate``);
* ``forward(td) -> TensorDict``, written top to bottom with the math visible.

Example:
    >>> import torch
    >>> from dataclasses import dataclass
    >>> from steersman.tensordict import TensorDict
    >>> class MSELoss(LossModule):
    ...     @dataclass
    ...     class _AcceptedKeys:
    ...         prediction: str = "prediction"
    ...         target: str = "target"
    ...     def forward(self, td):
    ...         err = self._get(td, "prediction") - self._get(td, "target")
    ...         return TensorDict({"loss_mse": err.pow(2).mean()}, [])
    >>> loss = MSELoss().set_keys(prediction="pred")
    >>> out = loss(TensorDict({"pred": torch.ones(4), "target": torch.zeros(4)}, [4]))
    >>> out["loss_mse"].item()
    1.0
    >>> loss(TensorDict({"prediction": torch.ones(4), "target": torch.zeros(4)}, [4]))
    Traceback (most recent call last):
    ...
    KeyError: "MSELoss needs 'pred' (its 'prediction' key) in the batch, which has ['prediction', 'target']. If your data stores it under another name, call loss.set_keys(prediction=<your key>)."
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from ..tensordict import TensorDictBase
from ..tensordict.module_params import from_module
from .utils import ValueEstimators, default_value_kwargs

NestedKey = str | tuple


def _norm_key(key: Any) -> NestedKey:
    if isinstance(key, tuple) and len(key) == 1:
        return key[0]
    if not isinstance(key, (str, tuple)):
        raise TypeError(f"a key is a str or a tuple of str, got {type(key).__name__}: {key!r}")
    return key


class LossModule(nn.Module):
    """Base class of losses; see the module docstring for what a subclass defines."""

    @dataclass
    class _AcceptedKeys:
        """No keys: subclasses list theirs."""

    #: The estimator :meth:`make_value_estimator` builds when given no type.
    default_value_estimator: ValueEstimators | None = None
    #: The estimators :meth:`make_value_estimator` accepts (``None``: all of them).
    supported_value_estimators: tuple[ValueEstimators, ...] | None = None

    def __init__(self) -> None:
        super().__init__()
        self.tensor_keys = self._AcceptedKeys()
        self._value_estimator: nn.Module | None = None
        self._target_names: list[str] = []

    # ------------------------------------------------------------------ keys
    def set_keys(self, **kwargs: NestedKey) -> LossModule:
        """Renames the batch keys this loss reads/writes; returns ``self``.

        Names are the fields of ``loss._AcceptedKeys`` (``loss.tensor_keys`` shows the
        current values). Names the value estimator also knows are forwarded to it.
        """
        valid = [f.name for f in fields(self.tensor_keys)]
        unknown = sorted(set(kwargs) - set(valid))
        if unknown:
            raise ValueError(
                f"{type(self).__name__}.set_keys: unknown key name(s) {unknown}; valid names: {valid}"
            )
        for name, key in kwargs.items():
            setattr(self.tensor_keys, name, _norm_key(key))
        self._forward_keys_to_estimator()
        return self

    def _forward_keys_to_estimator(self) -> None:
        est = self._value_estimator
        if est is None or not hasattr(est, "tensor_keys"):
            return
        known = {f.name for f in fields(est.tensor_keys)}
        shared = {f.name: getattr(self.tensor_keys, f.name) for f in fields(self.tensor_keys) if f.name in known}
        if shared:
            est.set_keys(**shared)

    def _get(self, td: TensorDictBase, name: str) -> Any:
        """``td[self.tensor_keys.<name>]``, or a KeyError that says how to fix it."""
        key = getattr(self.tensor_keys, name)
        value = td.get(key, None)
        if value is None:
            raise self._missing_key(td, name)
        return value

    def _missing_key(self, td: TensorDictBase, name: str) -> KeyError:
        key = getattr(self.tensor_keys, name)
        present = sorted(str(k) if isinstance(k, str) else repr(k) for k in td.keys(include_nested=True, leaves_only=True))
        return KeyError(
            f"{type(self).__name__} needs {key!r} (its {name!r} key) in the batch, which has "
            f"{present}. If your data stores it under another name, call "
            f"loss.set_keys({name}=<your key>)."
        )

    # --------------------------------------------------------------- targets
    def make_target(self, name: str) -> nn.Module:
        """Registers ``target_<name>``: a frozen copy of ``self.<name>``, equal to it now.

        The copy's parameters have ``requires_grad=False``; it never receives gradients and
        changes only through ``SoftUpdate``/``HardUpdate``. For stacked ensemble parameters
        (a :class:`~steersman.tensordict.TensorDictParams` named ``<name>_params``) the
        target is ``target_<name>_params``, a detached clone.
        """
        online = getattr(self, name)
        if isinstance(online, TensorDictBase):
            target = online.detach().clone()
            from ..tensordict import TensorDictParams

            target = TensorDictParams(target, no_convert=True)
        else:
            target = copy.deepcopy(online)
            for p in target.parameters():
                p.requires_grad_(False)
        setattr(self, "target_" + name, target)
        if name not in self._target_names:
            self._target_names.append(name)
        return target

    def target_pairs(self) -> list[tuple[TensorDictBase, TensorDictBase]]:
        """``(online, target)`` parameter TensorDicts for every target made by :meth:`make_target`."""
        pairs = []
        for name in self._target_names:
            online, target = getattr(self, name), getattr(self, "target_" + name)
            if not isinstance(online, TensorDictBase):
                online, target = from_module(online), from_module(target)
            pairs.append((online, target))
        return pairs

    # -------------------------------------------------------- value estimator
    def _estimator_value_network(self) -> nn.Module | None:
        """The network the value estimator calls (override where it is not the critic)."""
        for name in ("critic_network", "value_network", "critic"):
            net = getattr(self, name, None)
            if isinstance(net, nn.Module):
                return net
        return None

    def make_value_estimator(self, value_type: ValueEstimators | None = None, **hyperparams: Any) -> LossModule:
        """Builds the value estimator (``ValueEstimators.GAE``, ``TD0``, ``TD1``, ``TDLambda``).

        ``hyperparams`` (``gamma``, ``lmbda``, ``average_gae``...) override the defaults of
        :func:`~steersman.objectives.utils.default_value_kwargs`. Returns ``self``.
        """
        from . import value

        value_type = value_type if value_type is not None else self.default_value_estimator
        if value_type is None:
            raise ValueError(f"{type(self).__name__} uses no value estimator")
        classes = {
            ValueEstimators.TD0: value.TD0Estimator,
            ValueEstimators.TD1: value.TD1Estimator,
            ValueEstimators.TDLambda: value.TDLambdaEstimator,
            ValueEstimators.GAE: value.GAE,
        }
        if value_type not in classes:
            raise ValueError(f"unknown value estimator {value_type!r}; valid: {list(classes)}")
        supported = self.supported_value_estimators
        if supported is not None and value_type not in supported:
            names = ", ".join(v.name for v in supported)
            raise NotImplementedError(
                f"{type(self).__name__} has no {value_type.name} value estimator (use {names})"
                + ("; GAE estimates advantages of a state-value critic" if value_type is ValueEstimators.GAE else "")
            )
        kwargs = {**default_value_kwargs(value_type), **hyperparams}
        kwargs.setdefault("value_network", self._estimator_value_network())
        # not a registered submodule: it holds the loss's own networks, which stay where they are
        object.__setattr__(self, "_value_estimator", classes[value_type](**kwargs))
        self._forward_keys_to_estimator()
        return self

    @property
    def value_estimator(self) -> nn.Module:
        """The value estimator; built with the defaults on first access."""
        if self._value_estimator is None:
            self.make_value_estimator()
        return self._value_estimator

    @value_estimator.setter
    def value_estimator(self, estimator: nn.Module) -> None:
        object.__setattr__(self, "_value_estimator", estimator)
        self._forward_keys_to_estimator()

    def forward(self, td: TensorDictBase) -> TensorDictBase:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__}.forward")


def total_loss(losses: TensorDictBase) -> torch.Tensor:
    """Sum of the ``loss_*`` entries (and a lone ``loss``, DQN's) of a loss output.

    What ``.backward()`` is called on.
    """
    return sum(v for k, v in losses.items() if k == "loss" or k.startswith("loss_"))
