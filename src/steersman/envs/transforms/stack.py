"""Stack: several entries with the same spec stacked into one (e.g. per-agent entries)."""

from __future__ import annotations

from typing import Any

import torch

from steersman.data import Bounded, Composite, TensorSpec
from steersman.tensordict import TensorDictBase
from steersman.tensordict._utils import NestedKey, unravel_key

from ._utils import key_list, leaf_keys, missing_key, missing_spec_key
from .base import Transform

__all__ = ["Stack"]

_OUT = ("full_observation_spec", "full_reward_spec", "full_done_spec")


class Stack(Transform):
    """Stacks the ``in_keys`` entries (same shape and dtype) along a new dim into ``out_key``.

    Args:
        in_keys: the entries to stack (tensors, or TensorDicts with the same keys).
        out_key: the stacked entry.
        in_key_inv: the stacked entry the policy writes (inverse direction).
        out_keys_inv: the entries the env receives, unstacked from ``in_key_inv``.
        dim: where the new dim goes: negative (counted from the end of each entry;
            for a TensorDict entry, of its batch dims), or, with
            ``allow_positive_dim=True``, non-negative (counted after the env's batch dims).
        allow_positive_dim: accept a non-negative ``dim``.

    Keyword Args:
        del_keys: remove the ``in_keys`` entries (and their specs) after stacking.

    The stacked spec is the common spec with the new dim (``Bounded`` specs whose bounds
    differ get the stacked bounds). The entries must all be observations, all rewards
    or all done flags.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs.transforms import Stack
        >>> td = TensorDict(a=torch.zeros(2, 3), b=torch.ones(2, 3), batch_size=[2])
        >>> out = Stack(["a", "b"], "ab", dim=-2)(td)
        >>> out["ab"].shape, sorted(out.keys())
        (torch.Size([2, 2, 3]), ['ab'])
    """

    _check_spec_in_keys = False

    def __init__(self, in_keys: Any, out_key: NestedKey, in_key_inv: NestedKey | None = None,
                 out_keys_inv: Any = None, dim: int = -1, allow_positive_dim: bool = False, *,
                 del_keys: bool = True) -> None:
        in_keys = key_list(in_keys, "Stack", "in_keys")
        if len(in_keys) < 1:
            raise ValueError("Stack needs at least one in_key")
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise TypeError(f"Stack: dim must be an int, got {dim!r}")
        if dim >= 0 and not allow_positive_dim:
            raise ValueError(f"Stack: dim={dim} must be negative; pass allow_positive_dim=True for a dim counted "
                             "after the batch dims")
        out_keys_inv = key_list(out_keys_inv, "Stack", "out_keys_inv")
        if (in_key_inv is None) != (not out_keys_inv):
            raise ValueError("Stack: pass in_key_inv and out_keys_inv together (or neither)")
        super().__init__(in_keys, [unravel_key(out_key)])
        self.out_key = unravel_key(out_key)
        self.in_key_inv = None if in_key_inv is None else unravel_key(in_key_inv)
        self.unstack_keys = out_keys_inv
        self.dim = dim
        self.allow_positive_dim = allow_positive_dim
        self.del_keys = del_keys
        self.__dict__["_batch_dims"] = None
        self.__dict__["_at_reset"] = True

    # ------------------------------------------------------------------ data
    def _pos(self, value: Any, batch_dims: int) -> int:
        """The dim of ``torch.stack`` for one entry."""
        if self.dim >= 0:
            return batch_dims + self.dim
        nd = value.batch_dims if isinstance(value, TensorDictBase) else value.ndim
        return nd + 1 + self.dim

    def _stack(self, td: TensorDictBase) -> TensorDictBase:
        values = []
        for k in self.in_keys:
            v = td.get(k, None)
            if v is None:
                raise missing_key(self, k, td)
            values.append(v)
        nb = self.__dict__["_batch_dims"]
        nb = td.batch_dims if nb is None else nb
        try:
            stacked = torch.stack(values, self._pos(values[0], nb))
        except (RuntimeError, ValueError) as err:
            shapes = {str(k): list(v.shape) for k, v in zip(self.in_keys, values)}
            raise ValueError(f"Stack: the entries {shapes} cannot be stacked: {err}") from None
        td.set(self.out_key, stacked)
        if self.del_keys:
            for k in self.in_keys:
                if k != self.out_key:
                    td.del_(k)
        return td

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._stack(tensordict)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        if self.__dict__["_at_reset"]:
            return self._stack(tensordict_reset)
        return tensordict_reset

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Stacks at the root and under ``"next"`` (where the entries are)."""
        found = False
        if all(k in tensordict.keys(include_nested=True) for k in self.in_keys):
            self._stack(tensordict)
            found = True
        nxt = tensordict.get("next", None)
        if isinstance(nxt, TensorDictBase) and all(k in nxt.keys(include_nested=True) for k in self.in_keys):
            self._stack(nxt)
            found = True
        if not found:
            missing = next(k for k in self.in_keys if k not in tensordict.keys(include_nested=True))
            raise missing_key(self, missing, tensordict)
        return tensordict

    @property
    def _has_inv(self) -> bool:
        return self.in_key_inv is not None

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        if self.in_key_inv is None:
            return tensordict
        v = tensordict.get(self.in_key_inv, None)
        if v is None:
            raise missing_key(self, self.in_key_inv, tensordict, "in_key_inv")
        nb = self.__dict__["_batch_dims"]
        nb = tensordict.batch_dims if nb is None else nb
        pos = self.dim + nb if self.dim >= 0 else (
            (v.batch_dims if isinstance(v, TensorDictBase) else v.ndim) + self.dim)
        parts = v.unbind(pos)
        if len(parts) != len(self.unstack_keys):
            raise ValueError(f"Stack: {self.in_key_inv!r} has {len(parts)} entries along dim {self.dim}, "
                             f"expected {len(self.unstack_keys)} ({self.unstack_keys})")
        tensordict = tensordict.exclude(self.in_key_inv)
        for k, p in zip(self.unstack_keys, parts):
            tensordict.set(k, p)
        return tensordict

    # ------------------------------------------------------------------ specs
    def _stacked_spec(self, specs: list, keys: list, nb: int) -> TensorSpec:
        first = specs[0]
        for k, s in zip(keys[1:], specs[1:]):
            if s.shape != first.shape or s.dtype != first.dtype or type(s) is not type(first):
                raise ValueError(f"Stack: the specs of {keys[0]!r} and {k!r} differ ({first!r} vs {s!r}); "
                                 "stacked entries need the same shape, dtype and kind")
        pos = nb + self.dim if self.dim >= 0 else len(first.shape) + 1 + self.dim
        n = len(specs)
        if all(s == first for s in specs[1:]):
            new = first.unsqueeze(pos)
            shape = list(new.shape)
            shape[pos] = n
            return new.expand(*shape)
        if isinstance(first, Bounded):
            low = torch.stack([s.low for s in specs], pos)
            high = torch.stack([s.high for s in specs], pos)
            return Bounded(low, high, shape=low.shape, device=first.device, dtype=first.dtype)
        raise ValueError(f"Stack: the specs of {keys} differ and are not Bounded; they cannot be stacked")

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        nb = len(output_spec.shape)
        self.__dict__["_batch_dims"] = nb
        part = None
        for name in _OUT:
            if self.in_keys[0] in output_spec[name].keys(include_nested=True):
                part = name
                break
        if part is None:
            keys = [k for p in _OUT for k in leaf_keys(output_spec[p])]
            raise missing_spec_key(self, self.in_keys[0], "output specs", keys)
        spec = output_spec[part]
        specs = []
        for k in self.in_keys:
            s = spec.get(k, None)
            if s is None:
                raise missing_spec_key(self, k, f"{part.split('_')[1]} spec (with {self.in_keys[0]!r})",
                                       leaf_keys(spec))
            specs.append(s)
        stacked = self._stacked_spec(specs, self.in_keys, nb)
        if self.del_keys:
            for k in self.in_keys:
                spec.del_(k)
        spec.set(self.out_key, stacked)
        self.__dict__["_at_reset"] = part != "full_reward_spec"
        return output_spec

    def transform_action_spec(self, action_spec: Composite) -> Composite:
        if self.in_key_inv is None:
            return action_spec
        specs = []
        for k in self.unstack_keys:
            s = action_spec.get(k, None)
            if s is None:
                raise missing_spec_key(self, k, "action spec", leaf_keys(action_spec))
            specs.append(s)
        stacked = self._stacked_spec(specs, self.unstack_keys, len(action_spec.shape))
        for k in self.unstack_keys:
            action_spec.del_(k)
        action_spec.set(self.in_key_inv, stacked)
        return action_spec

    def transform_state_spec(self, state_spec: Composite) -> Composite:
        return state_spec

    def __repr__(self) -> str:
        return f"Stack(in_keys={self.in_keys}, out_key={self.out_key!r}, dim={self.dim})"
