"""Element-wise value maps on any entry (outputs and inputs): ClipTransform, SignTransform."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from steersman.data import Bounded, TensorSpec
from steersman.tensordict._utils import NestedKey

from .base import ObservationTransform

__all__ = ["ClipTransform", "SignTransform"]


def _dtype_limits(dtype: torch.dtype) -> tuple[float, float]:
    if dtype.is_floating_point:
        return -math.inf, math.inf
    info = torch.iinfo(dtype)
    return float(info.min), float(info.max)


class ClipTransform(ObservationTransform):
    """Clamps entries to ``[low, high]``: outputs (observations, rewards) and inputs (actions, states).

    Args:
        in_keys, out_keys: output entries to clip (results at ``out_keys``, default in place).
        in_keys_inv, out_keys_inv: input entries: the policy writes ``out_keys_inv`` and
            the env receives them clipped at ``in_keys_inv``.

    Keyword Args:
        low, high: the bounds (numbers); one may be None, not both; ``low < high``.

    One pair of bounds per transform (append several for several ranges). The specs
    of clipped outputs become ``Bounded`` (intersected with the old bounds); the
    policy-facing spec of a clipped input is the env's own (values inside it are left
    unchanged by the clip).

    Example:
        >>> import torch
        >>> from steersman.envs import PendulumEnv, check_env_specs
        >>> from steersman.envs.transforms import ClipTransform, TransformedEnv
        >>> env = TransformedEnv(PendulumEnv(seed=0), ClipTransform(in_keys=["observation"], low=-1.0, high=0.1))
        >>> check_env_specs(env)
        >>> bool((env.rollout(20)["observation"] <= 0.1).all())
        True
        >>> env.observation_spec["observation"].high
        tensor([0.1000, 0.1000, 0.1000])
    """

    def __init__(self, in_keys: Any = None, out_keys: Any = None, in_keys_inv: Any = None,
                 out_keys_inv: Any = None, *, low: float | None = None, high: float | None = None) -> None:
        for name, v in (("low", low), ("high", high)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or math.isnan(v)):
                raise TypeError(f"ClipTransform: {name} must be a number or None, got {v!r}")
        if low is None and high is None:
            raise ValueError("ClipTransform needs low and/or high (got neither)")
        if low is not None and high is not None and not low < high:
            raise ValueError(f"ClipTransform: low must be strictly lower than high, got low={low}, high={high}")
        super().__init__(in_keys, out_keys, in_keys_inv, out_keys_inv)
        if not self.in_keys and not self.in_keys_inv:
            raise ValueError("ClipTransform needs in_keys and/or in_keys_inv")
        self.low = low
        self.high = high

    def _apply_transform(self, x: Tensor) -> Tensor:
        return x.clamp(self.low, self.high)

    def _inv_apply_transform(self, x: Tensor) -> Tensor:
        return x.clamp(self.low, self.high)

    def _transform_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        dt = spec.dtype
        if dt == torch.bool:
            raise TypeError(f"ClipTransform: {key!r} is a bool entry; clipping needs numbers")
        if isinstance(spec, Bounded):
            lo, hi = spec.low, spec.high
        else:
            dmin, dmax = _dtype_limits(dt)
            lo = torch.full(spec.shape, dmin, dtype=dt, device=spec.device)
            hi = torch.full(spec.shape, dmax, dtype=dt, device=spec.device)
        lo, hi = lo.clamp(self.low, self.high), hi.clamp(self.low, self.high)
        return Bounded(lo.to(dt), hi.to(dt), shape=spec.shape, device=spec.device, dtype=dt)

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, low={self.low}, high={self.high})".replace("(, ", "(")


class SignTransform(ObservationTransform):
    """Replaces entries by their element-wise sign (-1, 0 or 1), keeping the dtype.

    Args:
        in_keys, out_keys: output entries (observations, rewards).
        in_keys_inv, out_keys_inv: input entries: the env receives the sign of what the
            policy writes (the policy-facing spec stays the env's).

    The spec of a transformed output becomes ``Bounded(-1, 1)`` (``[0, 1]`` for an
    unsigned dtype) of the same shape and dtype.

    Example:
        >>> import torch
        >>> from steersman.envs import PendulumEnv, check_env_specs
        >>> from steersman.envs.transforms import SignTransform, TransformedEnv
        >>> env = TransformedEnv(PendulumEnv(seed=0), SignTransform(in_keys=["observation"]))
        >>> check_env_specs(env)
        >>> obs = env.rollout(10)["observation"]
        >>> bool(((obs == -1) | (obs == 0) | (obs == 1)).all())
        True
    """

    def __init__(self, in_keys: Any = None, out_keys: Any = None, in_keys_inv: Any = None,
                 out_keys_inv: Any = None) -> None:
        super().__init__(in_keys, out_keys, in_keys_inv, out_keys_inv)
        if not self.in_keys and not self.in_keys_inv:
            raise ValueError("SignTransform needs in_keys and/or in_keys_inv")

    def _apply_transform(self, x: Tensor) -> Tensor:
        return x.sign()

    def _inv_apply_transform(self, x: Tensor) -> Tensor:
        return x.sign()

    def _transform_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        dt = spec.dtype
        if dt == torch.bool:
            raise TypeError(f"SignTransform: {key!r} is a bool entry; its sign is itself, nothing to do")
        low = 0 if dt == torch.uint8 else -1
        return Bounded(low, 1, shape=spec.shape, device=spec.device, dtype=dt)
