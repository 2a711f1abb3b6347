"""Small signal transforms: ``ExpandAs`` (broadcast an entry to another's shape) and
``SuccessReward`` (a sparse reward from a success flag)."""

from __future__ import annotations

import torch
from torch import Tensor

from steersman.data import Bounded, Categorical, Composite, TensorSpec, Unbounded
from steersman.tensordict import TensorDictBase
from steersman.tensordict._utils import NestedKey

from ._utils import key_list, missing_key, missing_spec_key
from .base import Transform

__all__ = ["ExpandAs", "SuccessReward"]


def _expand_right(x: Tensor, shape: torch.Size) -> Tensor:
    try:
        if x.ndim > len(shape):
            raise RuntimeError("more dims than the reference")
        return x.reshape(*x.shape, *([1] * (len(shape) - x.ndim))).expand(shape)
    except RuntimeError as err:
        raise ValueError(
            f"ExpandAs: an entry of shape {list(x.shape)} cannot be expanded to the right to "
            f"{list(shape)} (its dims must match the reference's leading dims, or be 1): {err}"
        ) from None


class ExpandAs(Transform):
    """Expands ``in_key`` to the right (new trailing dims) to the shape of ``ref_key``.

    Args:
        in_key: the entry to expand (e.g. a root ``"done"`` ``[*batch, 1]``).
        ref_key: the entry giving the shape (e.g. a per-agent reward).
        out_key: where the result goes (default: ``in_key``).

    ``x`` of shape ``[*s]`` becomes ``x[..., None, ...]`` expanded to the reference's
    ``[*s, *extra]``; ``x``'s dims must be the reference's leading dims or 1 (broadcast).
    Applies to the step and reset outputs where both entries exist; the spec follows (same
    dtype, the reference's shape; a new ``out_key`` is an observation entry).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs import ExpandAs
        >>> td = TensorDict({"done": torch.tensor([True, False]), "r": torch.zeros(2, 3)}, [2])
        >>> ExpandAs("done", "r", "done_r")(td)["done_r"].tolist()
        [[True, True, True], [False, False, False]]
    """

    def __init__(self, in_key: NestedKey, ref_key: NestedKey, out_key: NestedKey | None = None) -> None:
        super().__init__([in_key], [in_key if out_key is None else out_key])
        self.ref_key = key_list(ref_key, "ExpandAs", "ref_key")[0]

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        (ik, ok), = self._pairs
        x = tensordict.get(ik, None)
        ref = tensordict.get(self.ref_key, None)
        if x is None or ref is None:
            return tensordict
        tensordict.set(ok, _expand_right(x, ref.shape))
        return tensordict

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        (ik, _), = self._pairs
        if tensordict.get(ik, None) is None:
            raise missing_key(self, ik, tensordict)
        self._call(tensordict)
        nxt = tensordict.get("next", None)
        if isinstance(nxt, TensorDictBase):
            self._call(nxt)
        return tensordict

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        return self._call(tensordict_reset)

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        (ik, ok), = self._pairs
        parts = [output_spec[p] for p in ("full_observation_spec", "full_reward_spec", "full_done_spec")]
        src = next((p for p in parts if p.get(ik, None) is not None), None)
        ref = next((p[self.ref_key] for p in parts if p.get(self.ref_key, None) is not None), None)
        if src is None:
            raise missing_spec_key(self, ik, "output specs", [k for p in parts for k in p.keys(True, True)])
        if ref is None:
            raise missing_spec_key(self, self.ref_key, "output specs", [k for p in parts for k in p.keys(True, True)])
        spec = src[ik]
        if spec.dtype is torch.bool:
            new: TensorSpec = Categorical(2, shape=ref.shape, dtype=torch.bool, device=spec.device)
        else:
            new = Unbounded(shape=ref.shape, dtype=spec.dtype, device=spec.device)
        (src if ok == ik else output_spec["full_observation_spec"]).set(ok, new)
        return output_spec


class SuccessReward(Transform):
    """A sparse reward from a success flag: ``scale`` where ``success_key`` is True, else 0.

    Args:
        success_key: the bool (or 0/1) success entry of the step outputs.
        reward_key: the reward written (it replaces the env's reward if it is the same key).

    Keyword Args:
        scale: the reward on success (default 1.0).

    The reward has the success entry's shape and the default floating dtype; its spec is
    ``Bounded(min(0, scale), max(0, scale))``. It is written on steps only (there is no
    reward at reset).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs import SuccessReward
        >>> td = TensorDict({"success": torch.tensor([[True], [False]])}, [2])
        >>> SuccessReward(scale=5.0)(td)["reward"].tolist()
        [[5.0], [0.0]]
    """

    def __init__(self, success_key: NestedKey = "success", reward_key: NestedKey = "reward", *,
                 scale: float = 1.0) -> None:
        super().__init__([success_key], [reward_key])
        self.scale = float(scale)

    def _apply_transform(self, x: Tensor) -> Tensor:
        return x.to(torch.get_default_dtype()) * self.scale

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        (ik, ok), = self._pairs
        nxt = tensordict.get("next", None)
        if isinstance(nxt, TensorDictBase) and nxt.get(ik, None) is not None:
            nxt.set(ok, self._apply_transform(nxt.get(ik)))
            return tensordict
        return self._apply_pairs(tensordict, self._pairs)

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        (ik, ok), = self._pairs
        obs, rew, done = (output_spec[p] for p in ("full_observation_spec", "full_reward_spec", "full_done_spec"))
        src = next((p[ik] for p in (obs, done, rew) if p.get(ik, None) is not None), None)
        if src is None:
            raise missing_spec_key(self, ik, "output specs", [*obs.keys(True, True), *done.keys(True, True)])
        lo, hi = min(0.0, self.scale), max(0.0, self.scale)
        for part in (obs, done):  # a reward key that was an observation moves to the reward spec
            if ok != ik and part.get(ok, None) is not None:
                part.del_(ok)
        rew.set(ok, Bounded(lo, hi, shape=src.shape, dtype=torch.get_default_dtype(), device=src.device))
        return output_spec

    def __repr__(self) -> str:
        (ik, ok), = self._pairs
        return f"SuccessReward(success_key={ik!r}, reward_key={ok!r}, scale={self.scale})"


