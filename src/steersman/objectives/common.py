"""``LossModule``: the base of every loss.

A loss is an ``nn.Module`` from a batch (a TensorDict) to a TensorDict of scalars. Entries
whose name starts with ``loss_`` are summed for the backward pass; every other entry is a
diagnostic (already detached). What a subclass brings:

* ``_AcceptedKeys``: a dataclass of the batch keys it reads and writes, renamable with
  :meth:`LossModule.set_keys`;
* its networks as plain submodules (``self.actor_network``, ``self.value_network``...);
  target networks are frozen copies made by :meth:`LossModule.make_target` (initialised
  equal to the online network; updated by ``SoftUpdate``/``HardUpdate``);
* ``networks``: the names of its networks; each gets TorchRL's attributes
  ``<name>_params`` and ``target_<name>_params`` (see :func:`network_params`): TensorDicts
  whose leaves *are* the networks' tensors, so an in-place update through them changes
  what the loss computes;
* ``forward(td) -> TensorDict``, written top to bottom with the math visible.

A subclass ``__init__`` that ends in ``**common`` (passed on to its base) gets the base's
keyword-only parameters added to its signature, so ``inspect.signature`` and the docs
show every keyword it takes.

Lazy networks (``LazyLinear``, TorchRL's ``MLP`` without ``in_features``) are accepted:
building the loss touches no uninitialized parameter. What needs the parameters (target
copies, the stacked critic ensembles) is set up on the loss's first call, after a no-grad
pass of each lazy network over that batch (``get_dist_params`` for probabilistic actors:
no random draw). Build the optimizer from ``loss.parameters()`` after that first call;
or, as TorchRL's examples do, run the networks once on a reset TensorDict
(``policy(env.reset())``) before building the loss.

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
import inspect
import itertools
import warnings
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from ..tensordict import TensorDictBase
from ..tensordict.module_params import from_module, from_modules
from .utils import ValueEstimators, default_value_kwargs

NestedKey = str | tuple


#: Keywords TorchRL's losses take that change nothing here, with the reason. Passing them
#: works (they are accepted and ignored); the losses that take each one list it in their
#: signature.
TORCHRL_COMPAT_IGNORED: dict[str, str] = {
    "functional": "TorchRL's switch between functional and stateful calls of the networks "
    "(PPO, A2C); both compute the same loss, and networks are called directly here.",
    "separate_losses": "(SAC, DiscreteSAC, IQL, REDQ, TD3, TD3BC) the terms are always separated here, as "
    "with TorchRL's separate_losses=True: the critic ensemble holds its own copies of the "
    "critic's parameters, so no term reaches another's parameters (a critic that shares "
    "parameters with the actor gets a warning: TorchRL keeps them shared). PPO and A2C use it.",
    "deactivate_vmap": "TorchRL's Python loop over the critic ensemble instead of vmap; the "
    "values are the same, and the ensemble is always vmapped here.",
}


def torchrl_compat(loss: nn.Module, **given: Any) -> None:
    """Accepts the :data:`TORCHRL_COMPAT_IGNORED` keywords a loss was given (a programming
    error names any other)."""
    unknown = sorted(set(given) - set(TORCHRL_COMPAT_IGNORED))
    if unknown:
        raise TypeError(f"{type(loss).__name__}: {unknown} are not TorchRL-compatibility keywords")


def check_options(
    loss: nn.Module,
    *,
    loss_function: str | None = None,
    reduction: str | None = None,
    num_qvalue_nets: int | None = None,
    option: str = "loss_function",
) -> None:
    """The constructor checks every loss shares: the distance name (given as ``option``),
    the reduction and the ensemble size; a ValueError names the loss and the value."""
    name = type(loss).__name__
    if loss_function is not None and loss_function not in ("l2", "l1", "smooth_l1"):
        raise ValueError(f"{name}: {option} must be 'l2', 'l1' or 'smooth_l1', got {loss_function!r}")
    if reduction is not None and reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{name}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if num_qvalue_nets is not None and int(num_qvalue_nets) < 1:
        raise ValueError(f"{name}: num_qvalue_nets must be >= 1, got {num_qvalue_nets}")


def network_params(network: str, target: bool = False) -> property:
    """The class attribute ``<network>_params`` (``target=True``: ``target_<network>_params``),
    TorchRL's name for the parameters and buffers of ``self.<network>``; made for every
    name in a loss class's ``networks``.

    Reading it gives a :class:`~steersman.tensordict.TensorDictParams` whose leaves are the
    network's own tensors (for a stacked ensemble, the stacked ``TensorDictParams``
    itself). Without a target network the target attribute is the online parameters,
    detached (same storage), as in TorchRL.
    """
    kind = "target " if target else ""
    return property(lambda loss: loss._params_of(network, target), doc=f"The {kind}parameters of {network}.")


def _is_lazy(module: nn.Module) -> bool:
    return any(nn.parameter.is_lazy(t) for t in itertools.chain(module.parameters(), module.buffers()))


def _dry_run(module: nn.Module, td: TensorDictBase) -> None:
    """One no-grad pass of ``module`` over a shallow copy of ``td`` (materializes lazy layers);
    probabilistic modules only build their distribution parameters (no random draw)."""
    with torch.no_grad():
        if hasattr(module, "get_dist_params"):
            module.get_dist_params(td.copy())
        else:
            module(td.copy())


def _merged_signature(cls: type) -> inspect.Signature | None:
    """``cls.__init__``'s signature with its ``**common`` replaced by the base's keyword-only
    parameters; ``None`` when it has no ``**``."""
    init = cls.__dict__.get("__init__")
    if init is None:
        return None
    sig = inspect.signature(init)
    own = list(sig.parameters.values())
    if not own or own[-1].kind is not inspect.Parameter.VAR_KEYWORD:
        return None
    own = own[:-1]
    names = {p.name for p in own}
    base = inspect.signature(super(cls, cls).__init__)
    inherited = [p for p in base.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in names]
    return sig.replace(parameters=own + inherited)


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
    #: The loss's networks: each gets ``<name>_params``/``target_<name>_params`` attributes.
    networks: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for network in cls.__dict__.get("networks", ()):
            setattr(cls, f"{network}_params", network_params(network))
            setattr(cls, f"target_{network}_params", network_params(network, target=True))
        sig = _merged_signature(cls)
        if sig is not None:
            cls.__init__.__signature__ = sig

    def __init__(self) -> None:
        super().__init__()
        self.tensor_keys = self._AcceptedKeys()
        self._value_estimator: nn.Module | None = None
        #: the networks given a target by :meth:`make_target` (made or awaiting lazy parameters)
        self.target_names: list[str] = []
        self._deferred: list[tuple[nn.Module, Callable[[], Any], str | None]] = []
        self._lazy_hook: Any = None

    # ------------------------------------------------------------ lazy networks
    def when_initialized(self, module: nn.Module, setup: Callable[[], Any], *, stacked_as: str | None = None) -> None:
        """Runs ``setup()`` now, or, when ``module`` has uninitialized (lazy) parameters, on
        the loss's first call, after a no-grad pass of ``module`` over that batch, or when a
        state dict is loaded first (the lazy tensors take the stored shapes). ``stacked_as``:
        the state-dict name of ``module``'s stacked copies (an ensemble), if it is not a
        submodule of the loss."""
        if not _is_lazy(module):
            setup()
            return
        self._deferred.append((module, setup, stacked_as))
        if self._lazy_hook is None:
            self._lazy_hook = (
                self.register_forward_pre_hook(self._initialize_lazy, with_kwargs=True),
                self.register_load_state_dict_pre_hook(self._initialize_lazy_from_state),
            )

    def _initialize_lazy(self, _module: nn.Module, args: tuple, kwargs: dict) -> None:
        td = args[0] if args else next(iter(kwargs.values()))
        for module, _, _ in self._deferred:  # a batch the networks cannot read raises here; retried next call
            if _is_lazy(module):
                _dry_run(module, td)
        self._run_deferred()

    def _initialize_lazy_from_state(self, _module: nn.Module, state_dict: dict, prefix: str, *_: Any) -> None:
        names = {id(m): n for n, m in self._modules.items()}
        for module, _, stacked_as in self._deferred:
            root = f"{prefix}{stacked_as or names.get(id(module))}."
            for name, t in itertools.chain(module.named_parameters(), module.named_buffers()):
                stored = state_dict.get(root + name)
                if nn.parameter.is_lazy(t) and stored is not None:
                    t.materialize(stored.shape[1:] if stacked_as else stored.shape)  # values: loaded next
        if not any(_is_lazy(m) for m, _, _ in self._deferred):
            self._run_deferred()  # targets and stacks now exist, so their entries load too

    def _run_deferred(self) -> None:
        deferred, self._deferred = self._deferred, []
        for _, setup, _ in deferred:
            setup()
        for hook in self._lazy_hook:
            hook.remove()
        self._lazy_hook = None

    def _params_of(self, network: str, target: bool = False) -> TensorDictBase:
        """What :func:`network_params` attributes return (see there)."""
        prefix = "target_" if target else ""
        stacked = self._modules.get(f"{prefix}{network}_params")  # a stacked ensemble
        if stacked is not None:
            return stacked
        module = self._modules.get(prefix + network)
        if module is not None:
            return from_module(module, as_module=True)
        online = self._modules.get(network)
        pending = any(name in (network, f"{network}_params") for name in self.target_names)
        if self._deferred and (pending or not target) or (target and online is not None and _is_lazy(online)):
            raise RuntimeError(
                f"{type(self).__name__}.{prefix}{network}_params does not exist yet: the network has "
                "uninitialized (lazy) parameters; it is set up on the loss's first call (or run the "
                "network once on a batch before building the loss)"
            )
        if target and (online is not None or f"{network}_params" in self._modules):
            return self._params_of(network).detach()  # no target network: the online parameters (TorchRL)
        raise AttributeError(f"{type(self).__name__} has no network {network!r}")

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

    def _missing_key(self, td: TensorDictBase, name: str, key: NestedKey | None = None) -> KeyError:
        under = "" if key is None else ", read under 'next'"
        key = getattr(self.tensor_keys, name) if key is None else key
        present = sorted(str(k) if isinstance(k, str) else repr(k) for k in td.keys(include_nested=True, leaves_only=True))
        return KeyError(
            f"{type(self).__name__} needs {key!r} (its {name!r} key{under}) in the batch, which has "
            f"{present}. If your data stores it under another name, call "
            f"loss.set_keys({name}=<your key>)."
        )

    def _get_next(self, td: TensorDictBase, name: str) -> Any:
        """``td["next", tensor_keys.<name>]``, checked to be ``[*batch, 1]`` (without the
        trailing dim it would broadcast silently against the values)."""
        key = getattr(self.tensor_keys, name)
        full = ("next", key) if isinstance(key, str) else ("next", *key)
        value = td.get(full, None)
        if value is None:
            raise self._missing_key(td, name, full)
        if value.shape != (*td.batch_size, 1):
            raise ValueError(
                f"{type(self).__name__}: {full!r} has shape {list(value.shape)}, expected "
                f"{[*td.batch_size, 1]} (the batch shape plus a trailing singleton dim; add it with .unsqueeze(-1))"
            )
        return value

    # --------------------------------------------------------------- targets
    def make_target(self, name: str) -> nn.Module | None:
        """Registers ``target_<name>``: a frozen copy of ``self.<name>``, equal to it now
        (for a lazy network: on the loss's first call, see :meth:`when_initialized`).

        The copy's parameters have ``requires_grad=False``; it never receives gradients and
        changes only through ``SoftUpdate``/``HardUpdate``. For stacked ensemble parameters
        (a :class:`~steersman.tensordict.TensorDictParams` named ``<name>_params``) the
        target is ``target_<name>_params``, a detached clone.
        """
        online = getattr(self, name)
        if name not in self.target_names:
            self.target_names.append(name)
        if not isinstance(online, TensorDictBase) and _is_lazy(online):
            self.when_initialized(online, lambda: self.make_target(name))
            return None
        if isinstance(online, TensorDictBase):
            target = online.detach().clone()
            from ..tensordict import TensorDictParams

            target = TensorDictParams(target, no_convert=True)
        else:
            target = copy.deepcopy(online)
            for p in target.parameters():
                p.requires_grad_(False)
        setattr(self, "target_" + name, target)
        return target

    def target_pairs(self) -> list[tuple[TensorDictBase, TensorDictBase]]:
        """``(online, target)`` parameter TensorDicts for every target made by :meth:`make_target`."""
        pairs = []
        for name in self.target_names:
            if not hasattr(self, "target_" + name):
                continue  # a lazy network's target, made on the first call
            online, target = getattr(self, name), getattr(self, "target_" + name)
            if not isinstance(online, TensorDictBase):
                online, target = from_module(online), from_module(target)
            pairs.append((online, target))
        return pairs

    # -------------------------------------------------------- value estimator
    def _prioritized_options(self, use_prioritized_weights: str | bool, priority_key: NestedKey | None) -> None:
        """TorchRL's ``use_prioritized_weights`` (checked, stored) and its deprecated
        ``priority_key`` (warns; the same as ``set_keys(priority=...)``)."""
        name = type(self).__name__
        if use_prioritized_weights not in ("auto", True, False):
            raise ValueError(
                f"{name}: use_prioritized_weights must be 'auto', True or False, got {use_prioritized_weights!r}"
            )
        self.use_prioritized_weights = use_prioritized_weights
        if priority_key is not None:
            warnings.warn(f"{name}(priority_key=...) is deprecated; use loss.set_keys(priority=...)",
                          DeprecationWarning, stacklevel=3)
            self.set_keys(priority=priority_key)

    def _priority_weights(self, td: TensorDictBase, like: torch.Tensor) -> torch.Tensor | None:
        """The batch's ``priority_weight`` entry reshaped like the per-sample loss ``like``,
        when ``use_prioritized_weights`` is ``"auto"``/``True`` and the batch has one."""
        if getattr(self, "use_prioritized_weights", False) not in ("auto", True):
            return None
        weights = td.get(self.tensor_keys.priority_weight, None)
        if weights is None:
            return None
        if weights.numel() != like.numel():
            raise ValueError(
                f"{type(self).__name__}: {self.tensor_keys.priority_weight!r} has shape {list(weights.shape)}, "
                f"expected one importance weight per sample ({list(like.shape)})"
            )
        return weights.reshape(like.shape)

    def _deprecated_gamma(self, gamma: float | None) -> None:
        """Builds the default value estimator; ``gamma=`` (deprecated here, as in TorchRL) warns."""
        if gamma is not None:
            warnings.warn(
                f"{type(self).__name__}(gamma=...) is deprecated; use loss.make_value_estimator(gamma=...)",
                DeprecationWarning,
                stacklevel=3,
            )
        self.make_value_estimator(**({} if gamma is None else {"gamma": gamma}))

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

    # ------------------------------------------------------------- vmap randomness
    _vmap_randomness: str | None = None

    @property
    def vmap_randomness(self) -> str:
        """``torch.vmap``'s ``randomness`` for the loss's ensembles (stacked critics):
        ``"different"`` when one of its networks holds a random module (dropout, or a type
        registered with :func:`add_random_module`), else ``"error"``. Settable; losses with
        a critic ensemble resolve it from the critic when they are built (so a compiled
        first call does not walk the modules), others on first use."""
        if self._vmap_randomness is None:
            from .utils import RANDOM_MODULE_LIST

            roots = [m for m in (*self.__dict__.values(), *self.children()) if isinstance(m, nn.Module)]
            random = any(isinstance(sub, RANDOM_MODULE_LIST) for root in roots for sub in root.modules())
            self._vmap_randomness = "different" if random else "error"
        return self._vmap_randomness

    @vmap_randomness.setter
    def vmap_randomness(self, value: str) -> None:
        if value not in ("error", "different", "same"):
            raise ValueError(f"vmap_randomness must be 'error', 'different' or 'same', got {value!r}")
        self._vmap_randomness = value

    def forward(self, td: TensorDictBase) -> TensorDictBase:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__}.forward")


def add_random_module(module: type) -> None:
    """Registers a module type as random: a loss whose networks hold one vmaps its
    ensembles with ``randomness="different"`` (see :attr:`LossModule.vmap_randomness`).
    Dropout layers are registered already. Affects losses built afterwards.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> class NoisyIdentity(nn.Module):
        ...     def forward(self, x):
        ...         return x + torch.randn_like(x)
        >>> add_random_module(NoisyIdentity)
        >>> from steersman.objectives import utils
        >>> NoisyIdentity in utils.RANDOM_MODULE_LIST
        True
    """
    from . import utils

    if not (isinstance(module, type) and issubclass(module, nn.Module)):
        raise TypeError(f"add_random_module takes an nn.Module subclass, got {module!r}")
    if module not in utils.RANDOM_MODULE_LIST:
        utils.RANDOM_MODULE_LIST = (*utils.RANDOM_MODULE_LIST, module)


def _reset_parameters(module: nn.Module) -> nn.Module:
    for sub in module.modules():
        if sub._parameters and callable(getattr(sub, "reset_parameters", None)):
            sub.reset_parameters()
    return module


def register_critics(loss: LossModule, qvalue_network: nn.Module, num: int, delay: bool) -> None:
    """``loss.qvalue_network_params``: ``num`` stacked critics (batch ``[num]``); the first
    holds ``qvalue_network``'s weights, the others are copies re-initialised with each
    submodule's ``reset_parameters``. ``loss.qvalue_network`` becomes a parameter-free
    template (meta tensors, not a registered submodule) that the stacked parameters are
    swapped into by ``ensemble_call``. With ``delay``: ``loss.target_qvalue_network_params``.
    A lazy critic is stacked on the loss's first call (:meth:`LossModule.when_initialized`).
    """
    if delay and "qvalue_network_params" not in loss.target_names:
        loss.target_names.append("qvalue_network_params")
    object.__setattr__(loss, "qvalue_network", qvalue_network)  # the template until stacked

    def stack() -> None:
        members = [qvalue_network] + [_reset_parameters(copy.deepcopy(qvalue_network)) for _ in range(num - 1)]
        loss.qvalue_network_params = from_modules(*members, as_module=True)
        object.__setattr__(loss, "qvalue_network", copy.deepcopy(qvalue_network).to("meta"))
        if delay:
            loss.make_target("qvalue_network_params")

    if loss._vmap_randomness is None:  # resolved now, not on a first call that may be traced
        from .utils import RANDOM_MODULE_LIST

        random = any(isinstance(m, RANDOM_MODULE_LIST) for m in qvalue_network.modules())
        loss._vmap_randomness = "different" if random else "error"
    loss.when_initialized(qvalue_network, stack, stacked_as="qvalue_network_params")


def total_loss(losses: TensorDictBase) -> torch.Tensor:
    """Sum of the ``loss_*`` entries (and a lone ``loss``, DQN's) of a loss output.

    What ``.backward()`` is called on.
    """
    return sum(v for k, v in losses.items() if k == "loss" or k.startswith("loss_"))
