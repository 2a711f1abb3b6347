"""A slice sampler that serves each newly completed window of a data stream once, first."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from steersman.tensordict import NestedKey, unravel_key

from .samplers import SliceSampler
from .storages import Storage, TensorStorage

__all__ = ["StreamingSliceSampler"]


class StreamingSliceSampler(SliceSampler):
    """Slices of ``slice_len`` steps, newest complete windows first.

    Written steps are cut, in write order, into back-to-back windows of ``slice_len`` steps
    that never cross a trajectory boundary (a set end flag, a change of trajectory id, or a
    jump in slot order). Each completed window is queued once; ``sample`` returns queued
    windows first (oldest first) and fills the rest of the batch with uniform slices as
    :class:`SliceSampler` does. A queued window whose slots were overwritten before it was
    sampled is dropped (per-slot write stamps).

    Keyword Args:
        slice_len: steps per slice (batches are ``k * slice_len`` steps).
        end_key: one end-of-trajectory flag (default ``("next", "done")``); or
        end_keys: several, OR-ed (not together with ``end_key``).
        traj_key: a trajectory id entry, used instead of end flags.
        cache_values, truncated_key, strict_length, compile, use_gpu: as :class:`SliceSampler`.
        init_key: marks the first step of every slice ``True`` in the sample info (OR-ed with
            the stored flag when the storage has one); ``None`` disables it.
        pad_output, span: only ``False`` (padding short fallback slices and spans are not
            provided).

    The queue is not part of checkpoints: after ``loads`` it starts empty.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.data.replay_buffers import LazyTensorStorage, TensorDictReplayBuffer
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=StreamingSliceSampler(slice_len=3))
        >>> done = torch.zeros(7, 1, dtype=torch.bool)
        >>> _ = rb.extend(TensorDict({"step": torch.arange(7), "next": {"done": done}}, [7]))
        >>> rb.sample(6)["step"].tolist()  # the two completed windows, in order
        [0, 1, 2, 3, 4, 5]
    """

    def __init__(self, *, slice_len: int, end_key: NestedKey | None = None,
                 end_keys: Sequence[NestedKey] | None = None, traj_key: NestedKey | None = None,
                 cache_values: bool = False, truncated_key: NestedKey | None = ("next", "truncated"),
                 init_key: NestedKey | None = "is_init", strict_length: bool = True, pad_output: bool = False,
                 compile: bool | dict = False, span: Any = False, use_gpu: Any = False) -> None:
        if end_key is not None and end_keys is not None:
            raise ValueError("pass end_key or end_keys, not both")
        if pad_output:
            raise NotImplementedError("StreamingSliceSampler(pad_output=True): padded fallback slices are not "
                                      "provided; use strict_length=False for shorter slices")
        if span:
            raise NotImplementedError("StreamingSliceSampler(span=...): slices that span trajectory edges are "
                                      "not provided")
        self._end_keys = None if end_keys is None else [unravel_key(k) for k in end_keys]
        if self._end_keys is not None and not self._end_keys:
            raise ValueError("end_keys must name at least one key")
        super().__init__(slice_len=slice_len, end_key=end_key if end_keys is None else self._end_keys[0],
                         traj_key=traj_key, cache_values=cache_values, truncated_key=truncated_key,
                         strict_length=strict_length, compile=compile, use_gpu=use_gpu)
        self.init_key = None if init_key is None else unravel_key(init_key)
        self._pending: list[tuple[int, int]] = []  # (slot, write stamp) of steps not yet cut
        self._window: list[tuple[int, int]] = []
        self._queue: collections.deque = collections.deque()
        self._stamp = torch.zeros(0, dtype=torch.long)
        self._writes = 0

    # ---------------------------------------------------------------- stream bookkeeping
    def _note(self, index: Any) -> None:
        self._cache = None
        idx = torch.as_tensor(index, dtype=torch.long).reshape(-1).cpu()
        if not idx.numel():
            return
        top = int(idx.max()) + 1
        if self._stamp.numel() < top:
            self._stamp = torch.cat([self._stamp, torch.zeros(top - self._stamp.numel(), dtype=torch.long)])
        stamps = torch.arange(self._writes + 1, self._writes + 1 + idx.numel())
        self._stamp[idx] = stamps
        self._writes += idx.numel()
        self._pending += list(zip(idx.tolist(), stamps.tolist()))  # each step with its write stamp

    def extend(self, index: Tensor) -> None:
        self._note(index)

    def add(self, index: Any) -> None:
        self._note(index)

    def mark_update(self, index: Any) -> None:
        self._note(index)

    def _empty(self) -> None:
        super()._empty()
        self._pending, self._window = [], []
        self._queue.clear()
        self._stamp.zero_()

    def _episode_ends(self, storage: Storage) -> Tensor:
        if self._end_keys is None or len(self._end_keys) == 1 or self.traj_key is not None:
            return super()._episode_ends(storage)
        self._ends = self._flags(storage, torch.arange(len(storage)))
        try:
            return super()._episode_ends(storage)
        finally:
            self._ends = None

    def _flags(self, storage: TensorStorage, slots: Tensor) -> Tensor:
        """The stored end flags (OR of the end keys) of ``slots``."""
        td = storage._storage
        keys = td.keys(include_nested=True, leaves_only=True)
        out = torch.zeros(slots.numel(), dtype=torch.bool)
        found = False
        for key in self._end_keys or [self.end_key]:
            if key in keys:
                out |= td.get(key)[slots].reshape(slots.numel(), -1).any(-1).cpu()
                found = True
        if not found:
            raise KeyError(f"the storage has none of the end entries {self._end_keys or [self.end_key]} "
                           "(pass end_key=, end_keys= or traj_key=)")
        return out

    def _traj_ids(self, storage: TensorStorage, slots: Tensor) -> Tensor | None:
        td = storage._storage
        keys = td.keys(include_nested=True, leaves_only=True)
        key = self.traj_key
        if key is None and self._auto_episode and "episode" in keys:
            key = "episode"
        if key is None:
            return None
        if key not in keys:
            raise KeyError(f"the storage has no trajectory-id entry {key!r}")
        return td.get(key)[slots].reshape(slots.numel(), -1)[:, 0].cpu()

    def _process(self, storage: TensorStorage) -> None:
        """Cuts the steps written since the last call into windows; queues the complete ones."""
        if not self._pending:
            return
        L = self.slice_len
        prev = self._window[-1:] if self._window else []
        slots = torch.tensor([p[0] for p in prev + self._pending])
        ids = self._traj_ids(storage, slots)
        ends = None if ids is not None else self._flags(storage, slots)
        rows = storage._rows_capacity
        offset = len(prev)
        for j in range(offset, slots.numel()):
            s = int(slots[j])
            step = self._pending[j - offset]
            if self._window:
                i = j - 1  # the previous step of the stream
                last = int(slots[i])
                same = (s == (last + 1) % rows) and (bool(ids[i] == ids[j]) if ids is not None else not bool(ends[i]))
                if not same:
                    self._window = []
            self._window.append(step)
            if len(self._window) == L:
                self._queue.append((self._window[0][0], torch.tensor([st for _, st in self._window])))
                self._window = []
        self._pending = []

    # ---------------------------------------------------------------- sampling
    def sample(self, storage: Storage, batch_size: int) -> tuple[Tensor, dict]:
        if not isinstance(storage, TensorStorage) or storage.ndim != 1 or not storage.initialized:
            raise TypeError("StreamingSliceSampler needs a one-dimensional tensor storage of TensorDicts")
        k, L = self._slice_shape(batch_size)
        if L != self.slice_len:
            raise ValueError(f"batch_size={batch_size} must be a multiple of slice_len={self.slice_len}")
        self._process(storage)
        n = len(storage)
        starts = []
        while self._queue and len(starts) < k:
            start, stamps = self._queue.popleft()
            slots = (start + torch.arange(L)) % storage._rows_capacity
            if bool((slots < n).all()) and torch.equal(self._stamp[slots], stamps):
                starts.append(start)
        parts = []
        if starts:
            parts.append(self._finish(storage, torch.tensor(starts), torch.full((len(starts),), L), L, n))
        if len(starts) < k:
            parts.append(super().sample(storage, (k - len(starts)) * L))
        index = torch.cat([p[0].reshape(-1) for p in parts])
        info: dict = {}
        for key in parts[0][1]:
            info[key] = torch.cat([p[1][key] for p in parts])
        if self.init_key is not None:
            if self.truncated_key is not None:  # the step after a slice's last step starts one
                last = info[self.truncated_key].reshape(-1)
                first = torch.zeros_like(last)
                first[0] = True
                first[1:] = last[:-1]
            else:
                first = torch.arange(index.numel()) % L == 0
            first = first.reshape(-1, 1)
            td = storage._storage
            if self.init_key in td.keys(include_nested=True, leaves_only=True):
                stored = td.get(self.init_key)[index.cpu()].reshape(index.numel(), -1).bool()
                first = stored | first
            info[self.init_key] = first
        return index, info

    def __repr__(self) -> str:
        return (f"StreamingSliceSampler(slice_len={self.slice_len}, queued={len(self._queue)}, "
                f"strict_length={self.strict_length})")
