"""Observation transforms: dtype casts and the temporal ones (CatFrames, TimeMaxPool)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from steersman.data import Bounded, Composite, TensorSpec
from steersman.tensordict import TensorDictBase
from steersman.tensordict._utils import NestedKey

from ._utils import (
    as_trajectory,
    check_reset_key,
    episode_starts,
    expand_mask,
    map_bounded,
    missing_key,
    refuse_unless_default,
    reset_mask,
    start_index,
    time_windows,
    window_valid,
)
from .base import ObservationTransform

__all__ = ["DTypeCastTransform", "DoubleToFloat", "CatFrames", "TimeMaxPool"]


class DTypeCastTransform(ObservationTransform):
    """Casts entries from ``dtype_in`` to ``dtype_out`` (and actions/states back).

    Args:
        dtype_in: the dtype of the wrapped env's entries.
        dtype_out: the dtype seen outside (by the policy, in rollouts).
        in_keys, out_keys: output entries to cast. ``None`` (with ``in_keys_inv`` also
            None): every observation and reward entry of dtype ``dtype_in``, found from
            the specs (outside an env: every entry of that dtype).
        in_keys_inv, out_keys_inv: input entries (actions, states) the env reads as
            ``dtype_in``; the policy writes them as ``dtype_out``. ``None`` with
            ``in_keys`` None: every action and state entry of dtype ``dtype_in``.

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv, check_env_specs
        >>> from steersman.envs.transforms import DTypeCastTransform, TransformedEnv
        >>> base = CartPoleEnv(batch_size=[2], seed=0, dtype=torch.float64)
        >>> env = TransformedEnv(base, DTypeCastTransform(torch.float64, torch.float32))
        >>> check_env_specs(env)
        >>> td = env.rollout(3)
        >>> td["observation"].dtype, td["next", "reward"].dtype
        (torch.float32, torch.float32)
    """

    def __init__(self, dtype_in: torch.dtype, dtype_out: torch.dtype, in_keys: Any = None,
                 out_keys: Any = None, in_keys_inv: Any = None, out_keys_inv: Any = None) -> None:
        for name, dt in (("dtype_in", dtype_in), ("dtype_out", dtype_out)):
            if not isinstance(dt, torch.dtype):
                raise TypeError(f"{type(self).__name__}: {name} must be a torch.dtype, got {dt!r}")
        super().__init__(in_keys, out_keys, in_keys_inv, out_keys_inv)
        self.dtype_in = dtype_in
        self.dtype_out = dtype_out
        self.__dict__["_auto"] = in_keys is None and in_keys_inv is None
        self.__dict__["_resolved"] = False

    def _apply_transform(self, x: Tensor) -> Tensor:
        return x.to(self.dtype_out)

    def _inv_apply_transform(self, x: Tensor) -> Tensor:
        return x.to(self.dtype_in)

    def _transform_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        if spec.dtype != self.dtype_in:
            raise TypeError(
                f"{type(self).__name__}: the spec of {key!r} has dtype {spec.dtype}, expected "
                f"dtype_in={self.dtype_in}"
            )
        return spec.to(self.dtype_out)

    def _transform_inv_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        return self._transform_spec_leaf(spec, key)

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        if self.__dict__["_auto"] and not self.__dict__["_resolved"]:
            din, dout = self.dtype_in, self.dtype_out
            for k in tensordict.keys(include_nested=True, leaves_only=True):
                x = tensordict.get(k)
                if isinstance(x, Tensor) and x.dtype == din:
                    tensordict.set(k, x.to(dout))
            return tensordict
        return self._apply_pairs(tensordict, self._pairs)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        if self.__dict__["_auto"] and not self.__dict__["_resolved"]:
            return self._call(tensordict)
        return self._forward_pairs(tensordict)

    @property
    def _has_inv(self) -> bool:
        return bool(self.in_keys_inv) or self.__dict__.get("_auto", False)

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        if self.__dict__["_auto"]:
            keys = [k for p in ("full_observation_spec", "full_reward_spec")
                    for k, s in output_spec[p].items(include_nested=True, leaves_only=True)
                    if s.dtype == self.dtype_in]
            self.__dict__["_in_keys"] = keys
            self.__dict__["_out_keys"] = list(keys)
            self.__dict__["_pairs_cache"] = None
            self.__dict__["_resolved"] = True
        return super().transform_output_spec(output_spec)

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        if self.__dict__["_auto"]:
            keys = [k for p in ("full_action_spec", "full_state_spec")
                    for k, s in input_spec[p].items(include_nested=True, leaves_only=True)
                    if s.dtype == self.dtype_in]
            self.__dict__["_in_keys_inv"] = keys
            self.__dict__["_out_keys_inv"] = list(keys)
            self.__dict__["_pairs_inv_cache"] = None
        return super().transform_input_spec(input_spec)

    def __repr__(self) -> str:
        keys = "" if self.__dict__["_auto"] else f", in_keys={self.in_keys}, in_keys_inv={self.in_keys_inv}"
        return f"{type(self).__name__}(dtype_in={self.dtype_in}, dtype_out={self.dtype_out}{keys})"


class DoubleToFloat(DTypeCastTransform):
    """Casts float64 entries to float32 (and float32 actions back to float64).

    Args: as :class:`DTypeCastTransform`, with ``dtype_in=float64, dtype_out=float32``.

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv, check_env_specs
        >>> from steersman.envs.transforms import DoubleToFloat, TransformedEnv
        >>> env = TransformedEnv(CartPoleEnv(seed=0, dtype=torch.float64), DoubleToFloat())
        >>> check_env_specs(env)
        >>> env.observation_spec["observation"].dtype
        torch.float32
    """

    def __init__(self, in_keys: Any = None, out_keys: Any = None, in_keys_inv: Any = None,
                 out_keys_inv: Any = None) -> None:
        super().__init__(torch.float64, torch.float32, in_keys, out_keys, in_keys_inv, out_keys_inv)

    def __repr__(self) -> str:
        keys = "" if self.__dict__["_auto"] else f"in_keys={self.in_keys}, in_keys_inv={self.in_keys_inv}"
        return f"DoubleToFloat({keys})"


class _FrameBuffer(ObservationTransform):
    """Shared logic of the transforms that keep the last frames of each sub-env."""

    def __init__(self, in_keys: Any, out_keys: Any, done_key: NestedKey = "done") -> None:
        super().__init__(in_keys=in_keys, out_keys=out_keys)
        if not self.in_keys:
            raise ValueError(f"{type(self).__name__} needs in_keys")
        self.done_key = done_key
        self.__dict__["_buffers"] = {}

    # subclasses: _fresh(x) -> buffer, _push(buffer, x) -> buffer, _out(buffer) -> output
    def _fresh(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def _push(self, buf: Tensor, x: Tensor) -> Tensor:
        raise NotImplementedError

    def _out(self, buf: Tensor) -> Tensor:
        return buf

    def _buf_mask(self, mask: Tensor, buf: Tensor) -> Tensor:
        return expand_mask(mask, buf)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        pairs = self.__dict__["_reset_pairs"]
        if pairs is None:
            pairs = self._pairs
        mask = reset_mask(tensordict, tensordict_reset.batch_size)
        bufs = self.__dict__["_buffers"]
        for ik, ok in pairs:
            try:
                x = tensordict_reset.get(ik)
            except KeyError:
                raise missing_key(self, ik, tensordict_reset) from None
            fresh = self._fresh(x)
            old = bufs.get(ok)
            if mask is not None and old is not None and old.shape == fresh.shape:
                fresh = torch.where(self._buf_mask(mask, fresh), fresh, old)
            bufs[ok] = fresh
            tensordict_reset.set(ok, self._out(fresh))
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        bufs = self.__dict__["_buffers"]
        for ik, ok in self._pairs:
            try:
                x = next_tensordict.get(ik)
            except KeyError:
                raise missing_key(self, ik, next_tensordict) from None
            buf = bufs.get(ok)
            if buf is None:
                raise RuntimeError(f"{type(self).__name__}: reset the env before stepping it")
            buf = self._push(buf, x)
            bufs[ok] = buf
            next_tensordict.set(ok, self._out(buf))
        return next_tensordict

    def _frames(self, x: Tensor, starts_at: Tensor, tdim: int, n: int) -> list[Tensor]:
        return time_windows(x, starts_at, tdim, n)

    def _window_out(self, frames: list[Tensor], valid: list[Tensor]) -> Tensor:
        raise NotImplementedError

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Applies the transform to a trajectory (last batch dim = time).

        Frames are taken within episodes (episode boundaries from ``("next", done_key)``);
        the first frames of an episode are padded as at a reset. ``("next", in_key)``,
        when present, is transformed too.
        """
        td, added = as_trajectory(tensordict, self)
        tdim = td.batch_dims - 1
        starts_at = start_index(episode_starts(td, self.done_key))
        n = self._n_frames
        valid = window_valid(starts_at, n)
        for ik, ok in self._pairs:
            try:
                x = td.get(ik)
            except KeyError:
                raise missing_key(self, ik, td) from None
            frames = self._frames(x, starts_at, tdim, n)
            nxt = td.get(("next", *((ik,) if type(ik) is str else ik)), None)
            td.set(ok, self._window_out(frames, valid))
            if nxt is not None:
                nvalid = [v.clone() for v in valid[1:]] + [torch.ones_like(valid[0])]
                nframes = frames[1:] + [nxt]
                td.set(("next", *((ok,) if type(ok) is str else ok)), self._window_out(nframes, nvalid))
        return td.squeeze(0) if added else td


class CatFrames(_FrameBuffer):
    """Stacks the last ``N`` observations of each sub-env along ``dim`` (frame stacking).

    Args:
        N: the number of frames.
        dim: the (negative) dim to concatenate along, e.g. ``-3`` for ``[C, H, W]`` images.
        in_keys, out_keys: the entries (default ``["pixels"]``).
        padding: ``"same"`` (an episode starts with ``N`` copies of its first frame) or
            ``"constant"`` (``N - 1`` frames of ``padding_value``, then the first frame).
        padding_value: the constant of ``padding="constant"``.
        done_key: marks episode ends in trajectories (``forward``).

    In an env, reset sub-envs restart their stack (partial resets leave the other
    sub-envs' stacks alone). ``forward`` stacks a trajectory TensorDict (time = last
    batch dim) the same way, restarting at episode boundaries, so replay samples can
    be stacked after the fact. Output shape: ``dim`` is ``N`` times larger.

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv, check_env_specs
        >>> from steersman.envs.transforms import CatFrames, TransformedEnv
        >>> env = TransformedEnv(CartPoleEnv(batch_size=[2], seed=0), CatFrames(3, -1, in_keys=["observation"]))
        >>> check_env_specs(env)
        >>> td = env.reset()
        >>> td["observation"].shape                      # [2, 3 * 4]
        torch.Size([2, 12])
        >>> bool((td["observation"][:, :4] == td["observation"][:, 8:]).all())  # padded with the reset frame
        True
    """

    def __init__(self, N: int, dim: int, in_keys: Any = None, out_keys: Any = None,
                 padding: str = "same", padding_value: float = 0.0, done_key: NestedKey = "done",
                 as_inverse: bool = False, reset_key: NestedKey | None = None, *,
                 future: int = 0, mask_key: NestedKey | None = None) -> None:
        check_reset_key("CatFrames", reset_key)
        refuse_unless_default("CatFrames", "as_inverse", as_inverse, False,
                              "frames are stacked on the env's outputs only")
        refuse_unless_default("CatFrames", "future", future, 0, "only past frames are stacked")
        refuse_unless_default("CatFrames", "mask_key", mask_key, None,
                              "the padding of the first frames is given by padding/padding_value")
        if in_keys is None:
            in_keys = ["pixels"]
        super().__init__(in_keys, out_keys, done_key)
        if not isinstance(N, int) or N < 1:
            raise ValueError(f"CatFrames: N must be a positive int, got {N!r}")
        if not isinstance(dim, int) or dim >= 0:
            raise ValueError(f"CatFrames: dim must be a negative int (counted from the end), got {dim!r}")
        if padding not in ("same", "constant"):
            raise ValueError(f"CatFrames: padding must be 'same' or 'constant', got {padding!r}")
        self.N = N
        self.dim = dim
        self.padding = padding
        self.padding_value = padding_value

    @property
    def _n_frames(self) -> int:
        return self.N

    def _fresh(self, x: Tensor) -> Tensor:
        if self.padding == "same":
            return torch.cat([x] * self.N, self.dim)
        pad = torch.full_like(x, self.padding_value)
        return torch.cat([pad] * (self.N - 1) + [x], self.dim)

    def _push(self, buf: Tensor, x: Tensor) -> Tensor:
        d = x.shape[self.dim]
        return torch.cat([buf.narrow(self.dim, d, buf.shape[self.dim] - d), x], self.dim)

    def _window_out(self, frames: list[Tensor], valid: list[Tensor]) -> Tensor:
        if self.padding == "constant":
            frames = [
                f if bool(v.all()) else torch.where(expand_mask(v, f), f, torch.full_like(f, self.padding_value))
                for f, v in zip(frames, valid)
            ]
        return torch.cat(frames, self.dim)

    def _transform_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        if spec.ndim < -self.dim:
            raise ValueError(f"CatFrames: {key!r} has shape {list(spec.shape)}, no dim {self.dim}")
        out = map_bounded(spec, lambda t: torch.cat([t] * self.N, self.dim))
        if self.padding == "constant" and isinstance(out, Bounded):
            pv = torch.tensor(self.padding_value, dtype=out.dtype)
            out = Bounded(torch.minimum(out.low, pv), torch.maximum(out.high, pv), shape=out.shape,
                          device=out.device, dtype=out.dtype)
        return out

    def __repr__(self) -> str:
        return f"CatFrames(N={self.N}, dim={self.dim}, in_keys={self.in_keys}, out_keys={self.out_keys})"


class TimeMaxPool(_FrameBuffer):
    """The element-wise max of the last ``T`` observations of each sub-env.

    Args:
        in_keys, out_keys: the entries (default ``["observation"]``).
        T: the window length.
        done_key: marks episode ends in trajectories (``forward``).

    An episode starts with its first frame repeated (so the max is that frame).
    Shapes and specs are unchanged. ``forward`` pools a trajectory (time = last batch
    dim) within episodes.

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv, check_env_specs
        >>> from steersman.envs.transforms import TimeMaxPool, TransformedEnv
        >>> env = TransformedEnv(CartPoleEnv(batch_size=[2], seed=0), TimeMaxPool(["observation"], T=3))
        >>> check_env_specs(env)
        >>> env.rollout(4)["observation"].shape
        torch.Size([2, 4, 4])
    """

    def __init__(self, in_keys: Any = None, out_keys: Any = None, T: int = 1,
                 done_key: NestedKey = "done", reset_key: NestedKey | None = None) -> None:
        check_reset_key("TimeMaxPool", reset_key)
        if in_keys is None:
            in_keys = ["observation"]
        super().__init__(in_keys, out_keys, done_key)
        if not isinstance(T, int) or T < 1:
            raise ValueError(f"TimeMaxPool: T must be a positive int, got {T!r}")
        self.T = T

    @property
    def _n_frames(self) -> int:
        return self.T

    def _fresh(self, x: Tensor) -> Tensor:
        return x.unsqueeze(0).expand(self.T, *x.shape).clone()

    def _push(self, buf: Tensor, x: Tensor) -> Tensor:
        return torch.cat([buf[1:], x.unsqueeze(0)], 0)

    def _buf_mask(self, mask: Tensor, buf: Tensor) -> Tensor:
        return expand_mask(mask, buf[0]).unsqueeze(0)

    def _out(self, buf: Tensor) -> Tensor:
        return buf.amax(0)

    def _window_out(self, frames: list[Tensor], valid: list[Tensor]) -> Tensor:
        return torch.stack(frames, 0).amax(0)

    def __repr__(self) -> str:
        return f"TimeMaxPool(in_keys={self.in_keys}, out_keys={self.out_keys}, T={self.T})"

