"""Rewards mapped to another form: BinarizeReward (0/1), LineariseRewards (multi-objective -> one)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from steersman.data import Binary, Bounded, TensorSpec, Unbounded
from steersman.tensordict import TensorDictBase
from steersman.tensordict._utils import NestedKey

from ._utils import missing_key
from .base import Transform

__all__ = ["BinarizeReward", "LineariseRewards"]


class BinarizeReward(Transform):
    """Maps each reward to 1 where it is positive and to 0 elsewhere.

    Args:
        in_keys, out_keys: the reward entries (default ``["reward"]``); their last dim
            must be 1.
        dtype: the dtype of the result (default ``torch.int8``).

    The reward spec becomes ``Binary(n=1)`` of the same shape (TorchRL's
    ``BinarizeReward``; as there, a negative reward maps to 0).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs.transforms import BinarizeReward
        >>> td = TensorDict(reward=torch.tensor([[-2.0], [0.0], [0.5]]), batch_size=[3])
        >>> BinarizeReward()(td)["reward"].squeeze(-1)
        tensor([0, 0, 1], dtype=torch.int8)
    """

    def __init__(self, in_keys: Any = None, out_keys: Any = None, dtype: torch.dtype = torch.int8) -> None:
        if not isinstance(dtype, torch.dtype) or dtype.is_complex:
            raise TypeError(f"BinarizeReward: dtype must be a real torch.dtype, got {dtype!r}")
        super().__init__(["reward"] if in_keys is None else in_keys, out_keys)
        self._pairs  # noqa: B018  (validates the lengths now)
        self.dtype = dtype

    def _apply_pairs(self, td: TensorDictBase, pairs: list) -> TensorDictBase:
        dt = self.dtype
        for ik, ok in pairs:
            x = td.get(ik, None)
            if x is None:
                raise missing_key(self, ik, td)
            if x.ndim == 0 or x.shape[-1] != 1:
                raise ValueError(
                    f"BinarizeReward: the reward {ik!r} must have a last dim of size 1, got shape {list(x.shape)}"
                )
            td.set(ok, (x > 0).to(dt))
        return td

    def _transform_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        if not spec.shape or spec.shape[-1] != 1:
            raise ValueError(
                f"BinarizeReward: the reward spec of {key!r} must have a last dim of size 1, "
                f"got shape {list(spec.shape)}"
            )
        return Binary(1, shape=spec.shape, device=spec.device, dtype=self.dtype)

    def __repr__(self) -> str:
        return f"BinarizeReward(in_keys={self.in_keys}, dtype={self.dtype})"


class LineariseRewards(Transform):
    """Turns a multi-objective reward ``[..., K]`` into one reward ``[..., 1]`` by a weighted sum.

    Args:
        in_keys: the multi-objective reward entries (the same weights for each).
        out_keys: where the sums go (default: ``in_keys``).
        weights: ``K`` weights (a sequence or a 1-D tensor; default all 1).

    The result keeps a floating reward's dtype (integer rewards give the default
    float dtype). A ``Bounded`` reward spec gives the bounds of the weighted sum;
    otherwise the result is ``Unbounded``.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs.transforms import LineariseRewards
        >>> td = TensorDict(reward=torch.tensor([[1.0, 2.0], [3.0, -1.0]]), batch_size=[2])
        >>> LineariseRewards(["reward"], weights=[0.5, 2.0])(td)["reward"]
        tensor([[ 4.5000],
                [-0.5000]])
    """

    def __init__(self, in_keys: Any, out_keys: Any = None, *, weights: Any = None) -> None:
        super().__init__(in_keys, out_keys)
        if not self.in_keys:
            raise ValueError("LineariseRewards needs in_keys (the multi-objective reward entries)")
        self._pairs  # noqa: B018  (validates the lengths now)
        if weights is not None:
            w = torch.as_tensor(weights)
            if w.ndim != 1 or w.numel() == 0:
                raise ValueError(f"LineariseRewards: weights must be a non-empty 1-D sequence, got shape "
                                 f"{list(w.shape)}")
            if w.is_complex() or w.dtype == torch.bool:
                raise TypeError(f"LineariseRewards: weights must be real numbers, got dtype {w.dtype}")
            if not w.is_floating_point():
                w = w.to(torch.get_default_dtype())
            if not bool(w.isfinite().all()):
                raise ValueError(f"LineariseRewards: weights must be finite, got {w.tolist()}")
            self.register_buffer("weights", w)
        else:
            self.register_buffer("weights", None)

    def _out_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return dtype if dtype.is_floating_point else torch.get_default_dtype()

    def _weights_for(self, n: int, dtype: torch.dtype, device: Any, key: NestedKey) -> Tensor:
        w = self.weights
        if w is None:
            return torch.ones(n, dtype=dtype, device=device)
        if w.numel() != n:
            raise ValueError(
                f"LineariseRewards: the reward {key!r} has {n} objectives (last dim) but "
                f"{w.numel()} weights were given"
            )
        return w.to(dtype=dtype, device=device)

    def _apply_pairs(self, td: TensorDictBase, pairs: list) -> TensorDictBase:
        for ik, ok in pairs:
            x = td.get(ik, None)
            if x is None:
                raise missing_key(self, ik, td)
            if x.ndim == 0:
                raise ValueError(f"LineariseRewards: the reward {ik!r} has no objective dim (a 0-d tensor)")
            dt = self._out_dtype(x.dtype)
            w = self._weights_for(x.shape[-1], dt, x.device, ik)
            td.set(ok, (x.to(dt) * w).sum(-1, keepdim=True))
        return td

    def _transform_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        if not spec.shape:
            raise ValueError(f"LineariseRewards: the reward spec of {key!r} has no objective dim (shape [])")
        dt = self._out_dtype(spec.dtype)
        w = self._weights_for(spec.shape[-1], dt, spec.device, key)
        shape = (*spec.shape[:-1], 1)
        if isinstance(spec, Bounded):
            lo, hi = spec.low.to(dt) * w, spec.high.to(dt) * w
            low = torch.minimum(lo, hi).sum(-1, keepdim=True)
            high = torch.maximum(lo, hi).sum(-1, keepdim=True)
            if bool(low.isfinite().all() & high.isfinite().all()):
                return Bounded(low, high, shape=shape, device=spec.device, dtype=dt)
        return Unbounded(shape=shape, device=spec.device, dtype=dt)

    def __repr__(self) -> str:
        w = None if self.weights is None else self.weights.tolist()
        return f"LineariseRewards(in_keys={self.in_keys}, out_keys={self.out_keys}, weights={w})"
