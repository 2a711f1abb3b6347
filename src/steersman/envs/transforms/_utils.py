"""Helpers shared by the transforms: key lists, reset masks, spec maps, episode windows."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from steersman.data import Bounded, Composite, TensorSpec, Unbounded
from steersman.tensordict import TensorDictBase
from steersman.tensordict._utils import NestedKey, unravel_key

__all__: list[str] = []


class TransformKeyError(KeyError):
    """A ``KeyError`` whose message prints as is (no quotes): names the transform and key."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def key_list(keys: Any, owner: str, what: str) -> list[NestedKey]:
    """``keys`` (None, a key, or a sequence of keys) as a list of unravelled keys."""
    if keys is None:
        return []
    if isinstance(keys, (str, tuple)):
        keys = [keys]
    out = []
    for k in keys:
        try:
            out.append(unravel_key(k))
        except (TypeError, KeyError, ValueError):
            raise TypeError(
                f"{owner}: {what} entry {k!r} is not a key (a string or a tuple of strings)"
            ) from None
    return out


def fmt_keys(td: Any) -> list:
    try:
        keys = td.keys(include_nested=True, leaves_only=True)
    except Exception:  # noqa: BLE001 (an exotic container: the top level will do)
        keys = td.keys()
    return sorted(keys, key=lambda k: k if type(k) is str else ".".join(k))


def missing_key(owner: Any, key: NestedKey, td: Any, what: str = "in_keys") -> TransformKeyError:
    name = owner if isinstance(owner, str) else type(owner).__name__
    return TransformKeyError(
        f"{name}: the key {key!r} (from its {what}) is not in the TensorDict; "
        f"its keys are {fmt_keys(td)}"
    )


def missing_spec_key(owner: Any, key: NestedKey, where: str, keys: Sequence) -> TransformKeyError:
    name = owner if isinstance(owner, str) else type(owner).__name__
    return TransformKeyError(
        f"{name}: the key {key!r} is not in the env's {where} (keys: {list(keys)}); "
        "check the transform's in_keys"
    )


RESET_KEY_REASON = "the partial-reset mask of steersman's envs is always the '_reset' entry"


def check_reset_key(owner: str, reset_key: Any) -> None:
    """TorchRL's ``reset_key``/``reset_keys``: only the ``"_reset"`` entry (at any level) is
    supported here; anything else raises a ``ValueError`` that says so."""
    keys = reset_key if isinstance(reset_key, list) else [reset_key]
    for k in keys:
        if k is None:
            continue
        last = k if isinstance(k, str) else k[-1]
        if last != "_reset":
            raise ValueError(f"{owner}: reset_key={k!r} is not supported: {RESET_KEY_REASON}")


def refuse_unless_default(owner: str, name: str, value: Any, default: Any, reason: str) -> None:
    """A TorchRL keyword accepted with its default value only; another value raises a
    ``ValueError`` naming it and why (never a ``TypeError``)."""
    if value is not default and value != default:
        raise ValueError(f"{owner}: {name}={value!r} is not supported: {reason}")


def reset_mask(td: TensorDictBase | None, batch_size: torch.Size) -> Tensor | None:
    """The ``"_reset"`` entry of ``td`` as a ``[*batch]`` bool tensor, or None (reset all)."""
    if td is None:
        return None
    m = td.get("_reset", None)
    if m is None:
        return None
    if m.shape != batch_size:
        m = m.reshape(batch_size)
    return m


def expand_mask(mask: Tensor, like: Tensor) -> Tensor:
    """``mask [*batch]`` viewed so that it broadcasts against ``like [*batch, *feature]``."""
    return mask.reshape(*mask.shape, *([1] * (like.ndim - mask.ndim)))


# ---------------------------------------------------------------------- specs
def leaf_keys(spec: Composite) -> list[NestedKey]:
    return list(spec.keys(include_nested=True, leaves_only=True))


def map_bounded(spec: TensorSpec, fn: Callable[[Tensor], Tensor], dtype: torch.dtype | None = None,
                monotone: bool = True) -> TensorSpec:
    """The spec of ``fn(x)`` for ``x`` in ``spec``.

    ``fn`` is applied to the bounds of a :class:`Bounded` spec (an element-wise monotone
    map or a structural one: reshape, crop, repeat); the bounds are re-sorted, so a
    decreasing map is fine. Other specs become :class:`Unbounded` of the new shape.
    ``monotone=False``: the bounds are dropped (Unbounded).
    """
    dtype = spec.dtype if dtype is None else dtype
    dev = spec.device
    if isinstance(spec, Bounded) and monotone:
        lo = fn(spec.low.to(dtype) if dtype.is_floating_point else spec.low)
        hi = fn(spec.high.to(dtype) if dtype.is_floating_point else spec.high)
        low, high = torch.minimum(lo, hi), torch.maximum(lo, hi)
        if dtype.is_floating_point:
            low, high = low.to(dtype), high.to(dtype)
        if not dtype.is_floating_point or not bool(low.isnan().any() | high.isnan().any()):
            return Bounded(low, high, shape=low.shape, device=dev, dtype=dtype)
    probe_dtype = spec.dtype if spec.dtype is not None else torch.float32
    try:  # a shape-only probe costs no memory...
        shape = fn(torch.zeros(spec.shape, dtype=probe_dtype, device="meta")).shape
    except RuntimeError:  # ...unless fn mixes in real tensors (ObservationNorm's loc/scale after init_stats)
        shape = fn(torch.zeros(spec.shape, dtype=probe_dtype, device=dev)).shape
    return Unbounded(shape=shape, device=dev, dtype=dtype)


def uniform_bounds(spec: TensorSpec) -> tuple[float, float] | None:
    """``(low, high)`` if ``spec`` is Bounded with the same bounds everywhere, else None."""
    if not isinstance(spec, Bounded):
        return None
    lo, hi = spec.low, spec.high
    if lo.numel() == 0:
        return None
    l0, h0 = lo.reshape(-1)[0], hi.reshape(-1)[0]
    if bool((lo == l0).all()) and bool((hi == h0).all()):
        return float(l0), float(h0)
    return None


# ---------------------------------------------------------------------- trajectories
def as_trajectory(td: TensorDictBase, owner: Any) -> tuple[TensorDictBase, bool]:
    """``td`` with at least one batch dim (the last one is time); True if one was added."""
    if td.batch_dims == 0:
        return td.unsqueeze(0), True
    return td, False


def episode_starts(td: TensorDictBase, done_key: NestedKey = "done") -> Tensor:
    """``[*batch, T]`` bool: True where a new episode starts in a trajectory ``td``.

    The time dim is the last batch dim. A step starts an episode if it is the first of
    the trajectory or if the previous step ended one (``("next", done_key)`` True).
    Without ``("next", done_key)`` the whole trajectory is one episode.
    """
    bs = td.batch_size
    dev = td.device
    done = td.get(("next", *((done_key,) if type(done_key) is str else done_key)), None)
    start = torch.zeros(bs, dtype=torch.bool, device=dev if done is None else done.device)
    start[..., 0] = True
    if done is not None:
        d = done.reshape(*bs, -1).any(-1)
        start[..., 1:] |= d[..., :-1]
    return start


def start_index(start: Tensor) -> Tensor:
    """``[*batch, T]`` int64: the time index where the episode holding each step began."""
    T = start.shape[-1]
    ar = torch.arange(T, device=start.device).expand(start.shape)
    idx = torch.where(start, ar, torch.zeros_like(ar))
    return idx.cummax(-1).values


def gather_time(x: Tensor, idx: Tensor, tdim: int) -> Tensor:
    """``x[..., idx[t], ...]`` along the time dim ``tdim`` (``idx`` of shape ``x.shape[:tdim+1]``)."""
    extra = x.ndim - idx.ndim
    i = idx.reshape(*idx.shape, *([1] * extra)).expand(x.shape)
    return x.gather(tdim, i)


def segment_cumsum(x: Tensor, starts_at: Tensor, tdim: int) -> Tensor:
    """Cumulative sum of ``x [*batch, T, *f]`` along time, restarting at every episode start."""
    cs = x.cumsum(tdim)
    before = cs - x  # exclusive cumsum
    return cs - gather_time(before, starts_at, tdim)


def time_windows(x: Tensor, starts_at: Tensor, tdim: int, n: int) -> list[Tensor]:
    """The ``n`` frames ending at each step, oldest first, clamped to the episode start.

    Returns a list of ``n`` tensors shaped like ``x``: frame ``k`` holds
    ``x[max(t - (n - 1 - k), start(t))]``.
    """
    T = x.shape[tdim]
    ar = torch.arange(T, device=x.device).expand(starts_at.shape)
    out = []
    for k in range(n):
        idx = torch.maximum(ar - (n - 1 - k), starts_at)
        out.append(gather_time(x, idx, tdim))
    return out


def window_valid(starts_at: Tensor, n: int) -> list[Tensor]:
    """For each frame ``k`` of :func:`time_windows`: True where it lies inside the episode."""
    T = starts_at.shape[-1]
    ar = torch.arange(T, device=starts_at.device).expand(starts_at.shape)
    return [(ar - (n - 1 - k)) >= starts_at for k in range(n)]
