"""Greedy policies over action values: ``QValueModule``/``QValueActor`` and their
distributional versions (C51: a distribution over returns for each action).

A ``QValueModule`` reads ``"action_value"`` ``[*batch, n]`` and writes the greedy action
(an index for a ``Categorical`` spec, a one-hot vector for a ``OneHot`` spec), the action
values and ``"chosen_action_value"`` ``[*batch, 1]``. With an action mask, masked actions
get the lowest finite value of the dtype (as TorchRL; not ``-inf``, which would turn the
``one_hot * action_value`` products of one-hot losses into NaN) and are never chosen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..data import Categorical, Composite, MultiOneHot, OneHot, TensorSpec
from ..tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential

__all__ = [
    "QValueModule",
    "QValueActor",
    "DistributionalQValueModule",
    "DistributionalQValueActor",
]

_SPACES = {
    "one_hot": "one_hot",
    "one-hot": "one_hot",
    "categorical": "categorical",
    "mult_one_hot": "mult_one_hot",
    "mult-one-hot": "mult_one_hot",
}


def _action_leaf(spec: TensorSpec | None) -> TensorSpec | None:
    """The action spec inside ``spec`` (a Composite's ``"action"`` or ``(..., "action")``)."""
    if not isinstance(spec, Composite):
        return spec
    if "action" in spec.keys():
        return spec["action"]
    for key in spec.keys(True, True):
        if isinstance(key, tuple) and key[-1] == "action":
            return spec[key]
    raise KeyError(
        f"no 'action' entry in the spec (keys {list(spec.keys(True, True))}); pass the action "
        "spec itself or a Composite holding it under 'action'"
    )


def _space_of(spec: TensorSpec) -> str:
    if isinstance(spec, OneHot):
        return "one_hot"
    if isinstance(spec, MultiOneHot):
        return "mult_one_hot"
    if isinstance(spec, Categorical):
        return "categorical"
    raise ValueError(
        f"Q-value policies need a discrete action spec (OneHot, Categorical or MultiOneHot), got "
        f"{type(spec).__name__}"
    )


def resolve_action_space(action_space: Any, spec: TensorSpec | None) -> tuple[str, TensorSpec | None]:
    """The action space name (``"one_hot"``, ``"categorical"``, ``"mult_one_hot"``) and the
    action spec, from a name, a spec, or both (which must agree)."""
    if isinstance(action_space, TensorSpec):
        if spec is not None and spec is not action_space:
            raise ValueError("give the action spec once: as action_space or as spec")
        action_space, spec = None, action_space
    leaf = _action_leaf(spec)
    if action_space is None:
        if leaf is None:
            raise ValueError("give an action_space ('one_hot', 'categorical', ...) or an action spec")
        return _space_of(leaf), leaf
    name = _SPACES.get(str(action_space).lower())
    if name is None:
        raise ValueError(f"action_space must be one of {sorted(set(_SPACES.values()))}, got {action_space!r}")
    if leaf is not None and _space_of(leaf) != name:
        raise ValueError(f"action_space={action_space!r} does not match the spec {type(leaf).__name__}")
    return name, leaf


class QValueModule(TensorDictModuleBase):
    """Writes the greedy action of ``"action_value"`` and the value of that action.

    Args:
        action_space: ``"categorical"``, ``"one_hot"`` or ``"mult_one_hot"``, or an action
            spec. Exclusive with ``spec``.
        action_value_key: where the action values are read (default ``"action_value"``).
        action_mask_key: where a bool mask ``[*batch, n]`` of allowed actions is read
            (default: no mask).
        out_keys: ``[action, action_value, chosen_action_value]`` (default
            ``["action", action_value_key, "chosen_action_value"]``).
        var_nums: the sizes of the one-hot parts for ``"mult_one_hot"`` (default: from
            the spec).
        spec: the action spec (``Categorical``, ``OneHot``, ``MultiOneHot``) or a
            ``Composite`` holding it under ``"action"``.
        safe: project the action into the spec (actions are valid by construction; kept
            for TorchRL signatures).
        strict_shape: checks the action against ``spec`` (only with a spec): it must
            have shape ``[*batch, *event]`` (``event`` is ``[]`` for ``Categorical``,
            ``[1]`` for a ``Categorical`` of shape ``[1]``, ``[n]`` for ``OneHot``,
            ``[sum(nvec)]`` for ``MultiOneHot``; an env's batch dims in the spec are
            not required) and come from as many action values as the spec has actions.
            ``True`` (default) and ``None`` raise ``RuntimeError`` on a mismatch,
            ``"auto"`` reshapes the action to that shape when the element count allows
            (else raises), ``False`` skips the check.

    The action is an int64 index ``[*batch]`` for ``Categorical`` (``[*batch, 1]`` when
    the spec's shape is ``[1]``), a one-hot vector ``[*batch, n]`` of the spec's dtype
    for ``OneHot`` (int64 without a spec). Ties go to the lowest index.

    Example:
        >>> import torch
        >>> from steersman.data import Categorical, OneHot
        >>> q = QValueModule(spec=Categorical(4))
        >>> q(action_value=torch.tensor([[1.0, 3.0, 2.0, 0.0]]))
        (tensor([1]), tensor([[1., 3., 2., 0.]]), tensor([[3.]]))
        >>> masked = QValueModule(spec=OneHot(4), action_mask_key="mask")
        >>> action, _, chosen = masked(action_value=torch.tensor([1.0, 3.0, 2.0, 0.0]),
        ...                            mask=torch.tensor([True, False, True, True]))
        >>> action, chosen
        (tensor([False, False,  True, False]), tensor([2.]))
    """

    def __init__(
        self,
        action_space: str | TensorSpec | None = None,
        action_value_key: Any = None,
        action_mask_key: Any = None,
        out_keys: Sequence[Any] | None = None,
        var_nums: Sequence[int] | int | None = None,
        spec: TensorSpec | None = None,
        safe: bool = False,
        strict_shape: bool | str | None = True,
    ) -> None:
        super().__init__()
        if strict_shape not in (True, False, None, "auto"):
            raise ValueError(f"strict_shape must be True, False, None or 'auto', got {strict_shape!r}")
        self.strict_shape = strict_shape
        self.action_space, leaf = resolve_action_space(action_space, spec)
        action_value_key = "action_value" if action_value_key is None else action_value_key
        if out_keys is None:
            out_keys = ["action", action_value_key, "chosen_action_value"]
        out_keys = list(out_keys)
        if len(out_keys) != self._n_out:
            raise ValueError(f"{type(self).__name__} writes {self._n_out} entries; got out_keys {out_keys}")
        if out_keys[1] != action_value_key:
            raise ValueError(
                f"out_keys[1] must be the action-value key {action_value_key!r}, got {out_keys[1]!r}"
            )
        self.action_mask_key = action_mask_key
        self.in_keys = [action_value_key] + ([action_mask_key] if action_mask_key is not None else [])
        self.out_keys = out_keys
        self.spec = Composite({out_keys[0]: leaf}) if leaf is not None else None
        self.safe = bool(safe)
        if self.action_space == "mult_one_hot":
            if var_nums is None:
                if not isinstance(leaf, MultiOneHot):
                    raise ValueError("action_space='mult_one_hot' needs var_nums or a MultiOneHot spec")
                var_nums = leaf.nvec
            var_nums = [var_nums] if isinstance(var_nums, int) else [int(n) for n in var_nums]
        self.var_nums = var_nums
        self._dtype = leaf.dtype if isinstance(leaf, (OneHot, MultiOneHot)) else torch.long
        self._keepdim = isinstance(leaf, Categorical) and leaf.shape == (1,)
        # (number of action values, event shape of the action) the spec defines
        self._expected: tuple[int, tuple[int, ...]] | None = None
        if leaf is not None and strict_shape is not False:
            if isinstance(leaf, Categorical):
                self._expected = (leaf.n, (1,) if self._keepdim else ())
            elif isinstance(leaf, OneHot):
                self._expected = (leaf.n, (leaf.n,))
            elif isinstance(leaf, MultiOneHot):
                self._expected = (sum(leaf.nvec), (sum(leaf.nvec),))

    _n_out = 3

    @property
    def action_value_key(self) -> Any:
        return self.in_keys[0]

    def _read_values(self, tensordict: Any) -> Tensor:
        values = tensordict.get(self.action_value_key, None)
        if values is None:
            raise KeyError(
                f"{type(self).__name__} is missing the action values {self.action_value_key!r}; the "
                f"TensorDict holds {list(tensordict.keys(True, True))}"
            )
        if self.action_mask_key is not None:
            mask = tensordict.get(self.action_mask_key, None)
            if mask is None:
                raise KeyError(
                    f"{type(self).__name__} is missing the action mask {self.action_mask_key!r}"
                )
            values = torch.where(mask, values, torch.finfo(values.dtype).min)
        return values

    def _greedy(self, values: Tensor) -> tuple[Tensor, Tensor]:
        """(action, chosen value ``[*batch, 1]``) of the greedy policy on ``values`` ``[*batch, n]``."""
        if self.action_space == "mult_one_hot":
            parts = values.split(self.var_nums, -1)
            idx = [p.argmax(-1, keepdim=True) for p in parts]
            chosen = sum(p.gather(-1, i) for p, i in zip(parts, idx))
            onehots = [nn.functional.one_hot(i.squeeze(-1), n) for i, n in zip(idx, self.var_nums)]
            return torch.cat(onehots, -1).to(self._dtype), chosen
        idx = values.argmax(-1, keepdim=True)
        chosen = values.gather(-1, idx)
        if self.action_space == "one_hot":
            return nn.functional.one_hot(idx.squeeze(-1), values.shape[-1]).to(self._dtype), chosen
        return (idx if self._keepdim else idx.squeeze(-1)), chosen

    def _check_action(self, action: Tensor, values: Tensor) -> Tensor:
        """``strict_shape``: the action against the shape the spec implies."""
        n, event = self._expected
        target = values.shape[:-1] + event
        if action.shape == target and values.shape[-1] == n:
            return action
        if self.strict_shape == "auto" and values.shape[-1] == n and action.numel() == target.numel():
            return action.reshape(target)
        raise RuntimeError(
            f"{type(self).__name__}: action values of shape {list(values.shape)} give an action of "
            f"shape {list(action.shape)}, but the spec ({self.spec[self.out_keys[0]]!r}) expects "
            f"{n} action values and an action of shape {list(target)}"
            + ("" if self.strict_shape == "auto" else "; strict_shape='auto' reshapes when possible, "
               "strict_shape=False skips this check")
        )

    def forward(self, tensordict: Any) -> Any:
        values = self._read_values(tensordict)
        action, chosen = self._greedy(values)
        if self._expected is not None:
            action = self._check_action(action, values)
        tensordict.set(self.out_keys[0], action)
        tensordict.set(self.out_keys[1], values)
        tensordict.set(self.out_keys[2], chosen)
        return tensordict


class DistributionalQValueModule(QValueModule):
    """The greedy action of a distributional Q-network (C51).

    ``"action_value"`` holds log-probabilities ``[*batch, n_atoms, n]`` of the return
    over the ``support`` atoms for each action; the greedy action maximizes the expected
    return ``sum_atoms exp(log_p) * support``.

    Args:
        action_space, action_value_key, action_mask_key, var_nums, spec, safe: as
            :class:`QValueModule`.
        support: the atoms ``[n_atoms]``.
        out_keys: ``[action, action_value]`` (default ``["action", action_value_key]``).

    Example:
        >>> import torch
        >>> support = torch.tensor([0.0, 1.0])
        >>> q = DistributionalQValueModule("categorical", support=support)
        >>> log_p = torch.tensor([[0.9, 0.1], [0.1, 0.9]]).log()  # [n_atoms=2, n=2]
        >>> q(action_value=log_p)[0]  # action 0 expects 0.1, action 1 expects 0.9
        tensor(1)
    """

    _n_out = 2

    def __init__(
        self,
        action_space: str | TensorSpec | None,
        support: Tensor,
        action_value_key: Any = None,
        action_mask_key: Any = None,
        out_keys: Sequence[Any] | None = None,
        var_nums: Sequence[int] | int | None = None,
        spec: TensorSpec | None = None,
        safe: bool = False,
    ) -> None:
        action_value_key = "action_value" if action_value_key is None else action_value_key
        if out_keys is None:
            out_keys = ["action", action_value_key]
        super().__init__(action_space, action_value_key, action_mask_key, out_keys, var_nums, spec, safe)
        self.register_buffer("support", torch.as_tensor(support))

    def forward(self, tensordict: Any) -> Any:
        log_p = tensordict.get(self.action_value_key, None)
        if log_p is None:
            raise KeyError(
                f"{type(self).__name__} is missing the action values {self.action_value_key!r}"
            )
        if log_p.shape[-2] != self.support.shape[-1]:
            raise ValueError(
                f"{type(self).__name__}: action values of shape {list(log_p.shape)} need "
                f"{self.support.shape[-1]} atoms in dim -2 (the support's size)"
            )
        expected = (log_p.exp() * self.support.unsqueeze(-1)).sum(-2)  # [*batch, n]
        if self.action_mask_key is not None:
            mask = tensordict.get(self.action_mask_key)
            expected = torch.where(mask, expected, torch.finfo(expected.dtype).min)
        action, _ = self._greedy(expected)
        tensordict.set(self.out_keys[0], action)
        tensordict.set(self.out_keys[1], log_p)
        return tensordict


def _value_net(module: Any, in_keys: Any, action_value_key: Any, owner: str) -> TensorDictModuleBase:
    if isinstance(module, TensorDictModuleBase):
        if action_value_key not in module.out_keys:
            raise KeyError(
                f"{owner}: the module writes {module.out_keys}, not the action values "
                f"{action_value_key!r}"
            )
        return module
    return TensorDictModule(module, ["observation"] if in_keys is None else in_keys, [action_value_key])


class QValueActor(TensorDictSequential):
    """A Q-network followed by a :class:`QValueModule`: the greedy policy of the network.

    Args:
        module: the Q-network: a plain module (wrapped to read ``in_keys`` and write
            ``action_value_key``) or a TensorDict module writing ``action_value_key``.

    Keyword Args:
        in_keys: inputs of a plain module (default ``["observation"]``).
        spec: the action spec; ``action_space`` the space name (one of them).
        safe, strict_shape: see :class:`QValueModule`.
        action_value_key, action_key, chosen_action_value_key, action_mask_key: the keys
            (defaults ``"action_value"``, ``"action"``, ``"chosen_action_value"``, none).

    Shapes: ``[*batch, obs] -> action [*batch]`` (Categorical) or ``[*batch, n]``
    (OneHot); ``action_value`` ``[*batch, n]``; ``chosen_action_value`` ``[*batch, 1]``.

    Example:
        >>> import torch
        >>> from steersman.data import OneHot
        >>> from steersman.tensordict import TensorDict
        >>> actor = QValueActor(torch.nn.Linear(4, 3), spec=OneHot(3))
        >>> td = actor(TensorDict(observation=torch.randn(5, 4), batch_size=[5]))
        >>> td["action"].shape, td["action_value"].shape, td["chosen_action_value"].shape
        (torch.Size([5, 3]), torch.Size([5, 3]), torch.Size([5, 1]))
    """

    def __init__(
        self,
        module: Callable | nn.Module,
        *,
        in_keys: Any = None,
        spec: TensorSpec | None = None,
        safe: bool = False,
        action_space: str | TensorSpec | None = None,
        action_value_key: Any = None,
        action_key: Any = None,
        chosen_action_value_key: Any = None,
        action_mask_key: Any = None,
        strict_shape: bool | str | None = True,
    ) -> None:
        action_value_key = "action_value" if action_value_key is None else action_value_key
        out_keys = [
            "action" if action_key is None else action_key,
            action_value_key,
            "chosen_action_value" if chosen_action_value_key is None else chosen_action_value_key,
        ]
        net = _value_net(module, in_keys, action_value_key, type(self).__name__)
        qvalue = QValueModule(
            action_space, action_value_key, action_mask_key, out_keys, spec=spec, safe=safe,
            strict_shape=strict_shape,
        )
        super().__init__(net, qvalue)
        self.action_space = qvalue.action_space

    @property
    def spec(self) -> Composite | None:
        return self[-1].spec


class _LogSoftmaxAtoms(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.log_softmax(-2)


class DistributionalQValueActor(TensorDictSequential):
    """A distributional Q-network followed by a :class:`DistributionalQValueModule`.

    Args:
        module: the network, writing ``[*batch, n_atoms, n]`` at ``action_value_key``.
        support: the atoms ``[n_atoms]``.
        in_keys, spec, safe, var_nums, action_space, action_value_key, action_mask_key:
            as :class:`QValueActor`.
        make_log_softmax: apply a log-softmax over the atoms to the network's output.

    Example:
        >>> import torch
        >>> from steersman.data import Categorical
        >>> from steersman.modules import MLP
        >>> net = MLP(in_features=4, out_features=(5, 3), num_cells=[16])  # 5 atoms, 3 actions
        >>> actor = DistributionalQValueActor(net, support=torch.linspace(-1, 1, 5),
        ...                                   spec=Categorical(3))
        >>> actor(observation=torch.randn(2, 4))[0].shape
        torch.Size([2])
    """

    def __init__(
        self,
        module: Callable | nn.Module,
        support: Tensor,
        in_keys: Any = None,
        spec: TensorSpec | None = None,
        safe: bool = False,
        var_nums: Sequence[int] | int | None = None,
        action_space: str | TensorSpec | None = None,
        action_value_key: Any = "action_value",
        action_mask_key: Any = None,
        make_log_softmax: bool = True,
    ) -> None:
        net = _value_net(module, in_keys, action_value_key, type(self).__name__)
        head = DistributionalQValueModule(
            action_space, support, action_value_key, action_mask_key, None, var_nums, spec, safe
        )
        mods: list[Any] = [net]
        if make_log_softmax:
            mods.append(TensorDictModule(_LogSoftmaxAtoms(), [action_value_key], [action_value_key]))
        super().__init__(*mods, head)
        self.action_space = head.action_space
        self.register_buffer("support", head.support)

    @property
    def spec(self) -> Composite | None:
        return self[-1].spec
