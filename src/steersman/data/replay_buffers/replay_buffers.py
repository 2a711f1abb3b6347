"""Replay buffers: a storage, a sampler and a writer behind one object.

:class:`ReplayBuffer` composes the three parts (plus an optional transform applied to
sampled batches and a ``collate_fn``); :class:`TensorDictReplayBuffer` adds the sampled
indices (and the sampler's extras, e.g. importance weights) to each sampled TensorDict;
the ``Prioritized`` variants build a :class:`PrioritizedSampler` for you.

Concurrency: one writer and any number of sampling threads may use a buffer at once. A
lock covers every change of the buffer (writes, priority updates, empty/load) and the
choice + gather of the sampled items, so a batch is a consistent snapshot; transforms and
``collate_fn`` run outside the lock. ``prefetch=k`` keeps ``k`` batches being sampled in a
background thread.

Checkpoints: :meth:`ReplayBuffer.dumps` writes the buffer under a folder as JSON metadata
plus raw tensor files (no pickle), into a new sub-folder that becomes current only once
complete (an atomically replaced pointer file), so a process killed mid-way leaves the
previous checkpoint loadable. :meth:`ReplayBuffer.loads` validates everything before
changing the buffer.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import threading
import uuid
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from steersman.tensordict import NestedKey, TensorDictBase, is_tensor_collection, unravel_key
from steersman.tensordict import stack as td_stack
from steersman.tensordict.files import fsync_dir, temp_writer_alive, write_json_atomic

from ._checkpoint import (
    FORMAT,
    VERSION,
    CheckpointError,
    inside,
    prepared,
    read_component,
    read_json,
)
from .conditional import ConditionalUpdateResult
from .sample_units import SampleUnit
from .samplers import PrioritizedSampler, RandomSampler, Sampler, SliceSampler
from .storages import ListStorage, Storage, TensorStorage
from .writers import RoundRobinWriter, TensorDictRoundRobinWriter, Writer

__all__ = [
    "ReplayBuffer",
    "TensorDictReplayBuffer",
    "PrioritizedReplayBuffer",
    "TensorDictPrioritizedReplayBuffer",
    "stack_anything",
]

_POINTER = "LATEST.json"
_CKPT = re.compile(r"^ckpt-\d{6,}$")


def stack_anything(items: list) -> Any:
    """Default ``collate_fn`` for :class:`ListStorage`: stacks tensors or TensorDicts.

    Anything else (or a mix) is returned as the list itself.

    Example:
        >>> import torch
        >>> stack_anything([torch.zeros(2), torch.ones(2)]).shape
        torch.Size([2, 2])
        >>> stack_anything(["a", 1])
        ['a', 1]
    """
    if not isinstance(items, list) or not items:
        return items  # e.g. a LazyStackStorage's read, already stacked
    first = items[0]
    if isinstance(first, Tensor) and all(isinstance(x, Tensor) for x in items):
        try:
            return torch.stack(items)
        except RuntimeError:
            return items
    if is_tensor_collection(first) and all(is_tensor_collection(x) for x in items):
        return td_stack(items)
    return items


def _refuse_unsupported(**options: Any) -> None:
    """Raises ``NotImplementedError`` naming the first TorchRL-only option that is not ``None``."""
    for name, value in options.items():
        if value is not None:
            raise NotImplementedError(f"ReplayBuffer({name}=...) is a TorchRL feature steersman does not provide "
                                      f"(got {value!r}); leave it None")


class _Inverse:
    """Wraps a transform that should run on writes (``extend``/``add``) only."""

    def __init__(self, transform: Any) -> None:
        self.transform = transform

    def __call__(self, data: Any) -> Any:
        return data

    def inv(self, data: Any) -> Any:
        return self.transform(data)

    def __repr__(self) -> str:
        return f"inverse({self.transform!r})"


class _TransformChain:
    """Transforms applied in order to sampled data; their ``inv`` in reverse order on writes."""

    def __init__(self, transforms: list | None = None) -> None:
        self.transforms: list = list(transforms or [])

    def __len__(self) -> int:
        return len(self.transforms)

    def __getitem__(self, i: int) -> Any:
        return self.transforms[i]

    def __call__(self, data: Any) -> Any:
        for t in self.transforms:
            data = t(data)
        return data

    def has_inv(self) -> bool:
        return any(hasattr(t, "inv") for t in self.transforms)

    def inv(self, data: Any) -> Any:
        for t in reversed(self.transforms):
            inv = getattr(t, "inv", None)
            if inv is not None:
                data = inv(data)
        return data

    def __repr__(self) -> str:
        return f"[{', '.join(repr(t) for t in self.transforms)}]"


def _shutdown(executor: ThreadPoolExecutor, queue: collections.deque) -> None:
    for fut in queue:
        fut.cancel()
    queue.clear()
    executor.shutdown(wait=False, cancel_futures=True)


class ReplayBuffer:
    """A buffer of experience: a storage (memory), a sampler (which items) and a writer (where).

    Args:
        storage: default ``ListStorage(1000)``.
        sampler: default :class:`RandomSampler`.
        writer: default :class:`RoundRobinWriter`.
        collate_fn: applied to the gathered items (default: stack items of a
            :class:`ListStorage`; identity for tensor storages).
        pin_memory: pin sampled batches (when CUDA is available).
        prefetch: number of batches sampled ahead in a background thread (only used for
            ``sample()`` with the buffer's own ``batch_size``).
        transform: a callable (or list of callables) applied to each sampled batch; a
            transform with an ``inv`` method also sees every written batch through ``inv``.
        batch_size: default batch size of :meth:`sample` and of iteration.
        transform_factory: a callable returning the transform (called once, here); not
            together with ``transform``.
        generator: a CPU ``torch.Generator`` the sampler draws from (instead of torch's
            global generator, which is then left untouched): seeding it makes the sampled
            indices reproducible whatever else uses the global RNG. Not used by transforms.
        compilable, delayed_init: accepted for TorchRL compatibility; no effect (storages
            already allocate on the first write, and nothing here stops ``torch.compile``).
        shared: ``True`` (share with other processes through multiprocessing) is refused:
            pass the buffer's :class:`LazyMemmapStorage` folder instead.
        dim_extend: the dim of the data :meth:`extend` writes along (TorchRL's default
            ``storage.ndim - 1``). With an ``ndim=2`` storage it is ``1``: a ``[n_envs, T]``
            batch is written as ``T`` rows (time) of ``n_envs``, ``buffer[i]`` /
            ``buffer[i] = v`` index dim ``dim_extend`` of the stored data and ``buffer[:]``
            gives ``[n_envs, time]`` back (``buffer[env]``, an int, gives that env's
            ``[time]`` series; TorchRL's raises there). ``0`` writes the data's dim 0 as
            rows. :meth:`add` writes one row whatever ``dim_extend``. Tensor storages only.
        checkpointer: a storage checkpointer, set as ``storage.checkpointer`` (how
            :meth:`dumps`/:meth:`loads` write the storage).
        sample_unit: a :class:`SampleUnit` expanding each sampled index into the records
            read (default: one transition each).
        consume_after_n_samples, service_backend, service_backend_options, transport,
            transport_options: TorchRL features not provided here (use a
            :class:`ConsumingSampler`; remote buffers); only their default ``None`` is
            accepted, anything else raises a ``NotImplementedError`` that names the option.

    Shapes: with a tensor storage of items ``[*item]``, ``sample(B)`` returns ``[B, *item]``
    (slice samplers: ``[num_slices * slice_len, *item]``).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.data.replay_buffers import LazyTensorStorage
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(1000), batch_size=32)
        >>> rb.extend(TensorDict({"obs": torch.randn(100, 4), "action": torch.zeros(100, 1)}, [100])).shape
        torch.Size([100])
        >>> len(rb), rb.sample()["obs"].shape
        (100, torch.Size([32, 4]))
    """

    _default_writer = RoundRobinWriter
    _track_gen = False

    def __init__(self, *, storage: Storage | None = None, sampler: Sampler | None = None,
                 writer: Writer | None = None, collate_fn: Any = None, pin_memory: bool = False,
                 prefetch: int | None = None, transform: Any = None, batch_size: int | None = None,
                 transform_factory: Any = None, generator: torch.Generator | None = None, compilable: bool = False,
                 delayed_init: bool = False, shared: bool = False, dim_extend: int | None = None,
                 checkpointer: Any = None, consume_after_n_samples: int | None = None, sample_unit: Any = None,
                 service_backend: Any = None, service_backend_options: Any = None, transport: Any = None,
                 transport_options: Any = None) -> None:
        _refuse_unsupported(consume_after_n_samples=consume_after_n_samples, service_backend=service_backend,
                            service_backend_options=service_backend_options, transport=transport,
                            transport_options=transport_options)
        if shared:
            raise NotImplementedError("ReplayBuffer(shared=True): buffers are not shared through multiprocessing "
                                      "here; share a LazyMemmapStorage's folder (loads/dumps) instead")
        if dim_extend is not None and (isinstance(dim_extend, bool) or not isinstance(dim_extend, int)
                                       or dim_extend < 0):
            raise ValueError(f"dim_extend must be a non-negative integer or None, got {dim_extend!r}")
        if generator is not None and (not isinstance(generator, torch.Generator) or generator.device.type != "cpu"):
            raise TypeError(f"generator must be a CPU torch.Generator, got {generator!r}")
        if transform_factory is not None:
            if transform is not None:
                raise ValueError("pass either transform or transform_factory, not both")
            transform = transform_factory()
        if sample_unit is not None and not isinstance(sample_unit, SampleUnit):
            raise TypeError(f"sample_unit must be a SampleUnit, got {type(sample_unit).__name__}")
        self._sample_unit = sample_unit
        self._generator = generator
        self._storage = storage if storage is not None else ListStorage(1000)
        if not isinstance(self._storage, Storage):
            raise TypeError(f"storage must be a Storage, got {type(self._storage).__name__}")
        if checkpointer is not None:
            self._storage.checkpointer = checkpointer  # TypeError unless a StorageCheckpointerBase
        self._sampler = sampler if sampler is not None else RandomSampler()
        if not isinstance(self._sampler, Sampler):
            raise TypeError(f"sampler must be a Sampler, got {type(self._sampler).__name__}")
        self._writer = writer if writer is not None else self._default_writer()
        if not isinstance(self._writer, Writer):
            raise TypeError(f"writer must be a Writer, got {type(self._writer).__name__}")
        self._writer.register_storage(self._storage)
        self._dim_extend = self._storage.ndim - 1 if dim_extend is None else dim_extend
        if self._dim_extend and not isinstance(self._storage, TensorStorage):
            raise ValueError(f"dim_extend={self._dim_extend} needs a tensor storage (LazyTensorStorage, "
                             f"LazyMemmapStorage, TensorStorage), got a {type(self._storage).__name__}")
        self._track_gen = bool(getattr(self._writer, "track_generations", False))
        if isinstance(self._sampler, PrioritizedSampler) and self._sampler.max_capacity < self._storage.max_size:
            raise ValueError(
                f"the sampler's max_capacity ({self._sampler.max_capacity}) is smaller than the storage's "
                f"max_size ({self._storage.max_size})"
            )
        if isinstance(self._sampler, SliceSampler) and not isinstance(self._storage, TensorStorage):
            raise TypeError("slice samplers need a tensor storage (LazyTensorStorage, LazyMemmapStorage, TensorStorage)")
        if self._sampler._consumes and prefetch:
            raise ValueError("prefetch cannot be used with a ConsumingSampler: prefetched batches would consume "
                             "items that are never returned")
        if collate_fn is None and isinstance(self._storage, ListStorage):
            collate_fn = stack_anything
        self._collate_fn = collate_fn
        self._pin_memory = pin_memory and torch.cuda.is_available()
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
        self._batch_size = batch_size
        if prefetch is not None and (isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0):
            raise ValueError(f"prefetch must be a non-negative integer or None, got {prefetch!r}")
        self._prefetch = prefetch or 0
        self._prefetch_queue: collections.deque[Future] = collections.deque()
        self._executor: ThreadPoolExecutor | None = None
        self._finalizer: Any = None
        self._lock = threading.RLock()
        if transform is None:
            transforms: list = []
        elif isinstance(transform, (list, tuple)):
            transforms = list(transform)
        else:
            transforms = [transform]
        self._transform = _TransformChain(transforms)

    # ---------------------------------------------------------------- parts
    @property
    def storage(self) -> Storage:
        return self._storage

    @property
    def sampler(self) -> Sampler:
        return self._sampler

    @property
    def writer(self) -> Writer:
        return self._writer

    @property
    def transform(self) -> _TransformChain:
        return self._transform

    @property
    def batch_size(self) -> int | None:
        return self._batch_size

    @property
    def dim_extend(self) -> int:
        """The data dim :meth:`extend` writes along (``storage.ndim - 1`` by default)."""
        return self._dim_extend

    @property
    def write_count(self) -> int:
        """Number of items ever written (survives wrap-around; reset by :meth:`empty`)."""
        return self._writer.write_count

    def stats(self) -> dict[str, int | float | bool]:
        """A cheap snapshot of the buffer's state, for monitoring (TorchRL's ``stats()``).

        Keys: ``size`` (``len(self)``), ``write_count`` (items ever written),
        ``prefetch_queue_size`` (pending prefetched samples), ``initialized`` (whether
        the storage holds anything), ``capacity`` (the storage's ``max_size``) and
        ``utilization`` (``size / capacity``). Polled by
        :class:`~steersman.record.LoggerMonitor`.

        Example:
            >>> import torch
            >>> from steersman.data import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(10))
            >>> _ = rb.extend(torch.arange(4))
            >>> s = rb.stats()
            >>> s["size"], s["write_count"], s["capacity"], s["utilization"]
            (4, 4, 10, 0.4)
        """
        size = len(self)
        capacity = int(getattr(self._storage, "max_size", 0) or 0)
        return {"size": size, "write_count": int(self.write_count),
                "prefetch_queue_size": len(self._prefetch_queue),
                "initialized": len(self._storage) > 0, "capacity": capacity,
                "utilization": size / capacity if capacity else 0.0}

    def __len__(self) -> int:
        if self._sampler._consumes:
            return self._sampler._num_sampleable(self._storage)
        return len(self._storage)

    def insert_transform(self, index: int, transform: Any, *, invert: bool = False) -> None:
        """Inserts ``transform`` at position ``index`` of the sampled-batch transforms.

        ``invert=True`` makes it a write-time transform (applied on ``extend``/``add``).
        """
        self._transform.transforms.insert(index, _Inverse(transform) if invert else transform)

    def append_transform(self, transform: Any, *, invert: bool = False) -> ReplayBuffer:
        """Appends ``transform`` (see :meth:`insert_transform`); returns the buffer."""
        self._transform.transforms.append(_Inverse(transform) if invert else transform)
        return self

    # ---------------------------------------------------------------- writes
    def _flat(self, index: Any) -> Tensor:
        """Flat element indices from an ``"index"``-style value: for ndim=2, ``(rows, cols)``
        or ``[..., 2]`` pairs (flat indices pass as they are)."""
        st = self._storage
        if st.ndim == 2 and isinstance(st, TensorStorage):
            if isinstance(index, tuple):
                return (torch.as_tensor(index[0]) * st._W + torch.as_tensor(index[1])).reshape(-1)
            if isinstance(index, Tensor) and index.ndim >= 2 and index.shape[-1] == 2:
                return st._flat_index(index)
        return index

    def _transposed(self, data: Any) -> Any:
        """``data`` with dims ``dim_extend`` and 0 swapped (views; any pytree of tensors)."""
        d = self._dim_extend
        if isinstance(data, (Tensor, TensorDictBase)) or is_tensor_collection(data):
            nb = data.ndim if isinstance(data, Tensor) else len(data.batch_size)
            if nb <= d:
                raise ValueError(f"extend along dim_extend={d} needs data with more than {d} batch dims, got "
                                 f"batch shape {list(data.shape if isinstance(data, Tensor) else data.batch_size)}")
            return data.transpose(d, 0)
        if isinstance(data, (dict, list, tuple)):
            return pytree.tree_map(lambda t: t.transpose(d, 0) if isinstance(t, Tensor) else t, data)
        raise TypeError(f"extend along dim_extend={d} takes a TensorDict, a tensor or a pytree of tensors, "
                        f"got {type(data).__name__}")

    def add(self, data: Any) -> Any:
        """Writes one item (``ndim=2`` storages: one row, ``[n_envs]``); returns its slot
        (``ndim=2``: the ``[n_envs, 2]`` ``(row, col)`` pairs)."""
        if self._transform.transforms and self._transform.has_inv():
            data = self._transform.inv(data)
        with self._lock:
            if self._sampler._consumes:
                free = self._sampler.free_slots(self._storage)
                if free.numel():
                    slot = int(free[0])
                    if isinstance(self._writer, RoundRobinWriter):
                        data = self._writer._mark(self._writer._pre(data), slot)
                    self._storage.set(slot, data)
                    self._writer._write_count += 1
                    if self._tracks_generations():
                        self._writer._bump(slot)
                    self._sampler.add(torch.tensor([slot]))
                    return slot
            index = self._writer.add(data)
            if index is not None:
                self._sampler.add(self._storage._flat_index(torch.as_tensor(index)).reshape(-1))
        return index

    def extend(self, data: Any) -> Tensor:
        """Writes a batch (a TensorDict, tensor or pytree of tensors with a leading batch dim, or a
        list of items for a :class:`ListStorage`); returns the slots written (a long tensor;
        ``ndim=2`` storages: the ``[n, 2]`` ``(row, col)`` pair of every element written)."""
        if self._transform.transforms and self._transform.has_inv():
            data = self._transform.inv(data)
        with self._lock:
            if self._sampler._consumes:
                return self._extend_consumed(data)
            if self._dim_extend:
                self._check_capacity(data)
                # the caller's TensorDict gets its "index" placeholder before the swap, so the
                # writer's (row, col) pairs land in it through the transposed view
                pre = getattr(self._writer, "_pre", None)
                data = self._transposed(pre(data) if pre is not None else data)
            index = self._writer.extend(data)
            if index.numel():
                st = self._storage
                span = self._writer._last_span if st._row_len == 1 else None
                self._sampler._written(st._flat_index(index), span)
        return index

    def _check_capacity(self, data: Any) -> None:
        """Before the first write into an ``ndim=2`` storage: the prioritized sampler must
        have a slot for every element of the ``ceil(max_size / n_envs)`` rows."""
        st = self._storage
        if st.initialized or st.ndim != 2 or not isinstance(self._sampler, PrioritizedSampler):
            return
        shape = data.shape if isinstance(data, Tensor) else getattr(data, "batch_size", None)
        if shape is None or len(shape) <= self._dim_extend:
            return
        w = shape[0] if self._dim_extend == 1 else shape[1]
        need = -(-st.max_size // max(w, 1)) * w
        if need > self._sampler.max_capacity:
            raise ValueError(f"an ndim=2 storage of max_size={st.max_size} holds {need} elements in rows of "
                             f"n_envs={w}, more than the sampler's max_capacity={self._sampler.max_capacity}; "
                             f"give the sampler max_capacity={need} (nothing was written)")

    def _extend_consumed(self, data: Any) -> Tensor:
        """``extend`` with a consuming sampler: consumed slots first, then the writer's cursor."""
        free = self._sampler.free_slots(self._storage)
        n = len(data) if isinstance(data, list) else data.shape[0] if isinstance(data, (Tensor, TensorDictBase)) else 0
        k = min(n, free.numel())
        parts = []
        if k:
            head = data[:k]
            slots = free[:k]
            if isinstance(self._writer, RoundRobinWriter):
                head = self._writer._mark(self._writer._pre(head), slots)
            self._storage.set(slots, head)
            self._writer._write_count += k
            if self._tracks_generations():
                self._writer._bump(slots)
            parts.append(slots)
        if k < n or not k:
            rest = data[k:] if k else data
            parts.append(self._writer.extend(rest))
        index = torch.cat([p.reshape(-1).cpu().long() for p in parts])
        self._sampler.extend(self._storage._flat_index(index))
        if isinstance(self._writer, TensorDictRoundRobinWriter) and isinstance(data, TensorDictBase) \
                and not data.is_locked and len(data.batch_size) == 1:
            data.set("index", index.to(data.device) if data.device is not None else index)
        return index

    def __setitem__(self, index: Any, value: Any) -> None:
        if self._dim_extend:
            self._setitem_along(index, value)
            return
        with self._lock:
            self._storage.set(index, value)
            if isinstance(index, int):
                index = torch.tensor([index])
            elif isinstance(index, slice):
                index = torch.arange(*index.indices(len(self._storage)))
            if self._tracks_generations():
                self._writer._bump(torch.as_tensor(index).reshape(-1))
            self._sampler.mark_update(self._storage._flat_index(torch.as_tensor(index).reshape(-1)))

    def _setitem_along(self, index: Any, value: Any) -> None:
        """``buffer[index] = value`` with ``dim_extend > 0``: ``index`` picks along that dim
        of the stored data and ``value`` comes in the caller's layout (e.g. ``[k, time]``)."""
        d = self._dim_extend
        st = self._storage
        where = (slice(None),) * d + (index,)
        if not isinstance(index, int):
            value = self._transposed(value)
        with self._lock:
            st.set(where, value)
            if st.ndim == 2:
                flat = st._flat_grid()[where[:2]].reshape(-1)
            else:
                flat = torch.arange(len(st))
            if self._tracks_generations():
                self._writer._bump(torch.unique(flat // st._row_len))
            self._sampler.mark_update(flat)

    def _tracks_generations(self) -> bool:
        return self._track_gen

    def update_if_present(self, *, index: Tensor, generation: Tensor, patch: Any,
                          version_key: NestedKey | None = None, version: Any = None,
                          require_newer: bool = False) -> ConditionalUpdateResult:
        """Patches the records ``(index, generation)`` that are still live; others are untouched.

        A slot reused (``add``/``extend``/``buffer[i] = ...``) or emptied since the handle
        was taken has a new generation: its record is *stale* and is skipped. With
        ``version_key``/``version``, a live record is patched only if ``version >=`` (with
        ``require_newer``: ``>``) its stored version, which is then written with the patch;
        among several handles of one slot, only the row with the highest version (the last
        on ties) is applied. The whole patch is checked (keys, shapes, dtypes) before
        anything is written.

        Needs a tensor storage and a writer with ``track_generations=True``; sampled batches
        carry the handles under ``"index"`` and ``"index_generation"``.

        Returns:
            a :class:`ConditionalUpdateResult` aligned with ``index``.

        Example:
            >>> import torch
            >>> from steersman import TensorDict
            >>> from steersman.data.replay_buffers import LazyTensorStorage, TensorDictRoundRobinWriter
            >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4),
            ...                             writer=TensorDictRoundRobinWriter(track_generations=True))
            >>> _ = rb.extend(TensorDict({"v": torch.zeros(4)}, [4]))
            >>> batch = rb.sample(2)
            >>> _ = rb.extend(TensorDict({"v": torch.zeros(4)}, [4]))  # every slot reused
            >>> rb.update_if_present(index=batch["index"], generation=batch["index_generation"],
            ...                      patch={"v": torch.ones(2)}).stale_count
            2
        """
        if not self._tracks_generations():
            raise RuntimeError("update_if_present needs a writer that tracks slot generations "
                               "(RoundRobinWriter(track_generations=True))")
        st = self._storage
        if not isinstance(st, TensorStorage) or st.ndim != 1 or not isinstance(st._storage, TensorDictBase):
            raise RuntimeError("update_if_present needs a one-dimensional tensor storage of TensorDicts")
        index = torch.as_tensor(index).reshape(-1).long().cpu()
        generation = torch.as_tensor(generation).reshape(-1).long().cpu()
        n = index.numel()
        if generation.numel() != n:
            raise ValueError(f"generation has {generation.numel()} entries for {n} indices")
        items = list(patch.items(include_nested=True, leaves_only=True)) if isinstance(patch, TensorDictBase) \
            else list(dict(patch).items())
        stored_keys = st._storage.keys(include_nested=True, leaves_only=True)
        if (version_key is None) != (version is None):
            raise ValueError("pass version_key and version together")
        if isinstance(version_key, str) and "." in version_key:
            raise ValueError(f"version_key {version_key!r}: pass nested keys as tuples, not dotted strings")
        checked = []
        for key, value in items:
            key = unravel_key(key)
            if key not in stored_keys:
                raise KeyError(f"patch key {key!r} is not in the storage")
            if version_key is not None and key == unravel_key(version_key):
                raise ValueError(f"version_key {version_key!r} cannot be patched directly")
            col = st._storage.get(key)
            value = torch.as_tensor(value)
            if value.shape != (n, *col.shape[1:]):
                raise ValueError(f"patch entry {key!r} has shape {list(value.shape)}; expected {[n, *col.shape[1:]]}")
            if not torch.can_cast(value.dtype, col.dtype):
                raise ValueError(f"patch entry {key!r} is {value.dtype}; the storage holds {col.dtype}")
            checked.append((key, value))
        with self._lock:
            live = (index >= 0) & (index < len(st))
            live[live.clone()] &= self._writer.generations(index[live]) == generation[live]
            rejected = None
            apply = live.clone()
            if version_key is not None:
                vkey = unravel_key(version_key)
                if vkey not in stored_keys:
                    raise KeyError(f"version_key {version_key!r} is not in the storage")
                vcol = st._storage.get(vkey)
                if vcol[0].numel() != 1:
                    raise ValueError(f"version_key {version_key!r} must hold one scalar per record")
                ver = torch.as_tensor(version).reshape(-1).to(vcol.dtype).cpu()
                ver = ver.expand(n) if ver.numel() == 1 else ver
                if ver.numel() != n:
                    raise ValueError(f"version has {ver.numel()} entries for {n} indices")
                old = vcol[index.clamp(0, max(len(st) - 1, 0)).to(vcol.device)].reshape(n).cpu()
                ok = ver > old if require_newer else ver >= old
                apply = live & ok
                for slot in index[apply].unique().tolist():  # one winner per slot: highest version, last on ties
                    rows = (apply & (index == slot)).nonzero().squeeze(-1)
                    if rows.numel() > 1:
                        best = rows[ver[rows] == ver[rows].max()][-1]
                        apply[rows[rows != best]] = False
                rejected = live & ~apply
            rows = apply.nonzero().squeeze(-1)
            if rows.numel():
                slots = index[rows]
                for key, value in checked:
                    col = st._storage.get(key)
                    col[slots.to(col.device)] = value[rows].to(col.device, col.dtype)
                if version_key is not None:
                    vcol[slots.to(vcol.device)] = ver[rows].reshape(-1, *vcol.shape[1:]).to(vcol.device)
                self._sampler.mark_update(slots)
        return ConditionalUpdateResult(updated=apply, version_rejected=rejected, batch_size=[n])

    def update_priority(self, index: Any, priority: Any) -> None:
        """Sets the priorities of the items at ``index`` (no-op without a prioritized sampler).

        Raises ``ValueError`` on a negative/NaN/infinite priority and ``IndexError`` on an
        index that holds no item; nothing is changed then.
        """
        if self._dim_extend and isinstance(priority, Tensor) and priority.ndim > 1:
            # TorchRL: priorities in the caller's layout ([n_envs, T]) follow the stored order
            priority = priority.transpose(self._dim_extend, 0).reshape(-1)
        with self._lock:
            self._sampler.update_priority(self._flat(index), priority, storage=self._storage)

    def empty(self) -> None:
        """Removes every item (allocated memory is kept) and resets the sampler and writer."""
        with self._lock:
            self._clear_prefetch()
            self._writer._empty()  # first: a read-only writer refuses before anything changes
            self._storage._empty()
            self._sampler._empty()

    # ---------------------------------------------------------------- reads
    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, str) or (isinstance(index, tuple) and index and all(isinstance(k, str) for k in index)):
            with self._lock:
                data = self._storage.get(slice(None))
            return data.get(unravel_key(index))
        if self._dim_extend:
            d = self._dim_extend
            where = (slice(None),) * d + (index,)
            with self._lock:
                data = self._storage.get(slice(None))
                data = data[where] if isinstance(data, (Tensor, TensorDictBase)) else \
                    pytree.tree_map(lambda t: t[where], data)
            if not isinstance(index, int):  # an int drops the dim: that one env's series
                data = self._transposed(data)
            if self._transform.transforms:
                data = self._transform(data)
            return data
        with self._lock:
            data = self._storage.get(index)
        if self._collate_fn is not None and isinstance(data, list):
            data = self._collate_fn(data)
        if self._transform.transforms:
            data = self._transform(data)
        return data

    def _sample(self, batch_size: int) -> tuple[Any, dict]:
        with self._lock:
            if self._generator is None:
                index, info = self._sampler.sample(self._storage, batch_size)
            else:
                index, info = self._sample_with_generator(batch_size)
            if self._sample_unit is not None:
                index, info = self._sample_unit.expand(index, info, self._storage)
            data = self._storage._get_fast(index)
        st = self._storage
        if st.ndim == 1:
            info["index"] = index
            if self._track_gen:
                info["index_generation"] = self._writer.generations(index)
        else:  # TorchRL's (rows, cols)
            info["index"] = st._unflat(index)
            if self._track_gen:
                info["index_generation"] = self._writer.generations(info["index"][0])
        if self._collate_fn is not None:
            data = self._collate_fn(data)
        if self._pin_memory and hasattr(data, "pin_memory"):
            data = data.pin_memory()
        if self._transform.transforms:
            data = self._transform(data)
        return data, info

    def _sample_with_generator(self, batch_size: int) -> tuple[Tensor, dict]:
        """The sampler's draw taken from ``self._generator``; torch's global RNG is restored."""
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self._generator.get_state())
            out = self._sampler.sample(self._storage, batch_size)
            self._generator.set_state(torch.get_rng_state())
        return out

    def sample(self, batch_size: int | None = None, return_info: bool = False) -> Any:
        """A batch of stored items (and, with ``return_info``, a dict with ``"index"`` and the
        sampler's extras such as ``"_weight"``).

        Raises ``RuntimeError`` on an empty buffer.
        """
        if batch_size is None:
            batch_size = self._batch_size
            if batch_size is None:
                raise RuntimeError("no batch_size: pass one to sample() or to the buffer's constructor")
        elif isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if self._prefetch and batch_size == self._batch_size:
            data, info = self._prefetched(batch_size)
        else:
            data, info = self._sample(batch_size)
        return (data, info) if return_info else data

    # ---------------------------------------------------------------- prefetch
    def _prefetched(self, batch_size: int) -> tuple[Any, dict]:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="steersman-rb-prefetch")
            self._finalizer = weakref.finalize(self, _shutdown, self._executor, self._prefetch_queue)
        q = self._prefetch_queue
        while len(q) < self._prefetch:
            q.append(self._executor.submit(self._sample, batch_size))
        fut = q.popleft()
        try:
            out = fut.result()
        except BaseException:
            self._clear_prefetch()
            raise
        if not self._sampler.ran_out:
            q.append(self._executor.submit(self._sample, batch_size))
        return out

    def _clear_prefetch(self) -> None:
        q = self._prefetch_queue
        while q:
            fut = q.popleft()
            if not fut.cancel():
                try:
                    fut.result()
                except BaseException:  # noqa: BLE001 - a stale batch's error is irrelevant
                    pass

    def close(self) -> None:
        """Stops the prefetch thread (waits for it); the buffer stays usable."""
        self._clear_prefetch()
        ex, self._executor = self._executor, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if ex is not None:
            ex.shutdown(wait=True, cancel_futures=True)

    def __iter__(self):
        """Batches of ``batch_size`` until the sampler runs out (one epoch with a
        without-replacement sampler; endless with a random or prioritized one)."""
        if self._batch_size is None:
            raise RuntimeError("cannot iterate over a replay buffer without a batch_size")
        self._clear_prefetch()
        self._sampler._reset_epoch()
        epochs = hasattr(self._sampler, "drop_last")  # epoch-based: no prefetching past the epoch
        while True:
            if self._sampler.ran_out and not self._prefetch_queue:
                return
            if epochs:
                yield self._sample(self._batch_size)[0]
            else:
                yield self.sample()

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Components' states (tensors and Python values; for ``torch.save``)."""
        with self._lock:
            return {"_storage": self._storage.state_dict(), "_sampler": self._sampler.state_dict(),
                    "_writer": self._writer.state_dict(), "_batch_size": self._batch_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self._clear_prefetch()
            self._storage.load_state_dict(state["_storage"])
            self._sampler.load_state_dict(state["_sampler"])
            self._writer.load_state_dict(state["_writer"])
            self._batch_size = state.get("_batch_size", self._batch_size)

    def dumps(self, path: Any) -> None:
        """Writes a checkpoint under the folder ``path`` (created if needed), atomically.

        The data goes to a new ``ckpt-NNNNNN`` sub-folder (raw tensor files + JSON, fsynced);
        then ``LATEST.json`` is atomically replaced to point at it and older checkpoints are
        removed. A process killed at any point leaves the previous checkpoint loadable.
        Writes wait while the dump runs (it sees one consistent state).
        """
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        pointer = root / _POINTER
        current = None
        if pointer.exists():
            current = self._read_pointer(root)
        else:
            foreign = [p.name for p in root.iterdir() if not (_CKPT.match(p.name) or p.name.startswith("."))]
            if foreign:
                raise FileExistsError(
                    f"{root} is not empty and holds no replay-buffer checkpoint ({foreign[:3]}...); refusing to write there"
                )
        existing = [int(p.name[5:]) for p in root.iterdir() if _CKPT.match(p.name)]
        gen = max(existing, default=0) + 1
        name = f"ckpt-{gen:06d}"
        tmp = root / f".{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            with self._lock:
                self._storage.dumps(tmp / "storage")
                self._sampler.dumps(tmp / "sampler")
                self._writer.dumps(tmp / "writer")
                write_json_atomic(tmp / "buffer.json", {
                    "format": FORMAT, "version": VERSION, "type": type(self).__name__,
                    "storage": type(self._storage).__name__, "sampler": type(self._sampler).__name__,
                    "writer": type(self._writer).__name__, "len": len(self._storage),
                    "write_count": self.write_count, "batch_size": self._batch_size,
                })
            for dirpath, _, _ in os.walk(tmp, topdown=False):
                fsync_dir(Path(dirpath))
            os.rename(tmp, root / name)
            fsync_dir(root)
            write_json_atomic(pointer, {"format": FORMAT, "version": VERSION, "current": name})
            fsync_dir(root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        for p in root.iterdir():  # best effort: old checkpoints and leftovers of killed dumps
            if p.name != name and (_CKPT.match(p.name) or (p.name.startswith(".ckpt-") and p.name.endswith(".tmp"))):
                if p.name == current or _CKPT.match(p.name) or not temp_writer_alive(p.name):
                    shutil.rmtree(p, ignore_errors=True)

    @staticmethod
    def _read_pointer(root: Path) -> str:
        pointer = root / _POINTER
        ptr = read_json(pointer, root)
        if not isinstance(ptr, dict) or ptr.get("format") != FORMAT:
            raise CheckpointError(f"{pointer} is not a replay-buffer checkpoint pointer", file=pointer, field="format")
        current = ptr.get("current")
        if not isinstance(current, str) or not _CKPT.match(current):
            raise CheckpointError(f"{pointer} points at an invalid checkpoint name {current!r:.80}", file=pointer,
                                  field="current")
        return current

    def loads(self, path: Any) -> None:
        """Loads the checkpoint under ``path`` (written by :meth:`dumps`).

        Everything is read and validated first; only then is the buffer changed. A corrupted,
        foreign or incompatible folder, or one whose files or symlinks lead outside ``path``,
        raises :class:`CheckpointError` (a :class:`~steersman.tensordict.LoadError`, so a
        ``ValueError``) and leaves the buffer as it was.
        """
        self._commit_loads(self._prepare_loads(path))

    def _prepare_loads(self, path: Any) -> tuple[list, Any]:
        """Reads and validates the checkpoint under ``path``; changes nothing."""
        root = Path(path)
        if not (root / _POINTER).exists():
            raise CheckpointError(f"{root} holds no replay-buffer checkpoint ({_POINTER} is missing)", file=root)
        d = inside(root, root / self._read_pointer(root))
        meta = read_json(d / "buffer.json", root)
        if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise CheckpointError(f"{d / 'buffer.json'} is not replay-buffer metadata of version {VERSION}",
                                  file=d / "buffer.json", field="format")
        for part, obj in (("storage", self._storage), ("sampler", self._sampler), ("writer", self._writer)):
            saved = meta.get(part)
            ok = saved == type(obj).__name__ or (part == "storage" and saved in obj._checkpoint_types())
            if not ok:
                raise CheckpointError(f"{d} was written with a {saved!r:.80}; this buffer's {part} is a "
                                      f"{type(obj).__name__}", file=d / "buffer.json", field=part)
        parts = []
        for part, obj in (("sampler", self._sampler), ("writer", self._writer)):
            m, t = read_component(d / part, type(obj).__name__, root)
            parts.append((obj, prepared(d / part, obj._prepare_load, m, t, d / part)))
        inside(root, d / "storage")
        parts.insert(0, (self._storage, self._storage._prepare_loads(d / "storage")))
        return parts, meta.get("batch_size")

    def _commit_loads(self, ready: tuple[list, Any]) -> None:
        parts, bs = ready
        with self._lock:
            self._clear_prefetch()
            for obj, state in parts:
                obj._commit_load(state)
            if self._batch_size is None and type(bs) is int and bs > 0:
                self._batch_size = bs

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(\n    storage={self._storage!r},\n    sampler={self._sampler!r},\n"
                f"    writer={self._writer!r},\n    batch_size={self._batch_size},\n"
                f"    transform={self._transform!r},\n    collate_fn={getattr(self._collate_fn, '__name__', self._collate_fn)})")


class TensorDictReplayBuffer(ReplayBuffer):
    """A :class:`ReplayBuffer` of TensorDicts that adds the sampling info to each batch.

    Sampled batches get ``"index"`` (the flat slot of each item) and the sampler's extras
    (``"_weight"`` for prioritized samplers, truncation flags for slice samplers). The
    default writer is :class:`TensorDictRoundRobinWriter` (it also sets ``"index"`` on the
    data passed to ``extend``).

    Args:
        priority_key: the entry :meth:`update_tensordict_priority` reads priorities from
            (default ``"td_error"``).
        **kwargs: as :class:`ReplayBuffer`.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.data.replay_buffers import LazyTensorStorage
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=4)
        >>> _ = rb.extend(TensorDict({"obs": torch.arange(10.0)}, [10]))
        >>> s = rb.sample()
        >>> bool((s["obs"] == s["index"].float()).all())
        True
    """

    _default_writer = TensorDictRoundRobinWriter

    def __init__(self, *, priority_key: NestedKey = "td_error", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.priority_key = unravel_key(priority_key)

    def _sample(self, batch_size: int) -> tuple[Any, dict]:
        data, info = super()._sample(batch_size)
        if isinstance(data, TensorDictBase):
            if data.is_locked:
                data = data.copy().unlock_() if hasattr(data, "unlock_") else data
            bs = data.batch_size
            for key, val in info.items():
                if isinstance(val, tuple) and key == "index":  # ndim=2: [N, 2] (row, col) pairs
                    val = torch.stack(val, -1)
                if isinstance(val, Tensor):
                    if val.device != data.device and data.device is not None:
                        val = val.to(data.device)
                    if val.shape[: len(bs)] != bs and val.ndim <= len(bs):
                        val = val.reshape(tuple(val.shape) + (1,) * (len(bs) - val.ndim)).expand(bs)
                    data.set(key, val)
        return data, info

    def __setitem__(self, index: Any, value: Any) -> None:
        st = self._storage
        if self._dim_extend and isinstance(value, TensorDictBase) and isinstance(self._writer,
                                                                                  TensorDictRoundRobinWriter):
            value = value.copy() if value.is_locked else value
            if st.ndim == 2 and len(st):  # the (row, col) pair of each element, in the caller's layout
                flat = st._flat_grid()[(slice(None), index)]
                flat = flat if isinstance(index, int) else flat.transpose(0, 1)
                pairs = torch.stack([flat // st._W, flat % st._W], -1)
                if value.batch_size == flat.shape:  # else the write below names the mismatch
                    value.set("index", pairs)
            super().__setitem__(index, value)
            return
        if isinstance(value, TensorDictBase) and isinstance(self._writer, TensorDictRoundRobinWriter):
            value = value.copy() if value.is_locked else value
            if isinstance(index, int):
                slot = torch.tensor(index % max(len(self._storage), 1))
            else:
                slot = torch.as_tensor(index if not isinstance(index, slice)
                                       else range(*index.indices(len(self._storage))))
            bs = value.batch_size
            value.set("index", slot.reshape(tuple(slot.shape) + (1,) * (len(bs) - slot.ndim)).expand(bs).clone())
        super().__setitem__(index, value)

    def extend(self, data: Any) -> Tensor:
        index = super().extend(data)
        if (isinstance(self._sampler, PrioritizedSampler) and isinstance(data, TensorDictBase)
                and self.priority_key in data.keys(include_nested=True)):
            self.update_tensordict_priority(data)
        return index

    def add(self, data: Any) -> Any:
        index = super().add(data)
        if (isinstance(self._sampler, PrioritizedSampler) and isinstance(data, TensorDictBase)
                and self.priority_key in data.keys(include_nested=True) and index is not None):
            p = data.get(self.priority_key).detach().reshape(-1)
            slot = index if isinstance(index, Tensor) and index.ndim == 2 else torch.as_tensor([index])
            self.update_priority(self._storage._flat_index(slot),
                                 p.amax() if self._storage._row_len == 1 else p)
        return index

    def update_tensordict_priority(self, data: TensorDictBase) -> None:
        """Updates priorities from ``data[priority_key]`` at ``data["index"]``.

        Items with several priority values (trajectories) are reduced with the sampler's
        ``reduction``; a missing priority entry resets the items to the max priority.
        """
        if not isinstance(self._sampler, PrioritizedSampler):
            return
        index = data.get("index")
        st = self._storage
        if st.ndim == 2 and index.ndim >= 2 and index.shape[-1] == 2:  # (row, col) pairs
            flat = st._flat_index(index)
            prio = data.get(self.priority_key, None) if self.priority_key in data.keys(include_nested=True) else None
            if prio is None:
                prio = torch.full((flat.numel(),), self._sampler.max_priority, dtype=torch.float64)
            else:
                prio = prio.detach().reshape(flat.numel(), -1)
                prio = prio.reshape(-1) if prio.shape[1] == 1 else prio
            with self._lock:
                self._sampler.update_priority(flat, prio, storage=st)
            return
        if not data.batch_size:
            index = index.reshape(-1)[:1] if st._row_len == 1 else index.reshape(-1)
            n = index.numel()
        else:
            n = data.batch_size[0]
            index = index.reshape(-1) if st._row_len > 1 else index.reshape(n, -1)[:, 0]
        prio = data.get(self.priority_key, None) if self.priority_key in data.keys(include_nested=True) else None
        if prio is None:
            prio = torch.full((index.numel(),), self._sampler.max_priority, dtype=torch.float64)
        else:
            prio = prio.detach()
            if st._row_len > 1:
                prio = prio.reshape(index.numel(), -1)
            else:
                prio = prio.reshape(n, -1)
            if prio.shape[1] == 1:
                prio = prio.reshape(-1)
        keep = index >= 0
        if not bool(keep.all()):  # items a max-value writer did not keep
            index, prio = index[keep], prio[keep]
        self.update_priority(index, prio)


class PrioritizedReplayBuffer(ReplayBuffer):
    """A :class:`ReplayBuffer` with a :class:`PrioritizedSampler` over its storage.

    Args:
        alpha, beta, eps, dtype: see :class:`PrioritizedSampler`.
        storage, collate_fn, pin_memory, prefetch, transform, batch_size, generator,
            compilable, delayed_init, shared, dim_extend, sample_unit, transport,
            transport_options: as :class:`ReplayBuffer`.
        sampler: a ready :class:`PrioritizedSampler` to use instead of building one.
        sampler_device: ``None`` or a CPU device (priority trees live on the CPU).
        sync: only ``True`` (priorities updated on write) is provided.

    Example:
        >>> import torch
        >>> from steersman.data.replay_buffers import LazyTensorStorage
        >>> rb = PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(10))
        >>> idx = rb.extend(torch.arange(10.0).unsqueeze(-1))
        >>> rb.update_priority(idx, torch.linspace(0.1, 1.0, 10))
        >>> data, info = rb.sample(5, return_info=True)
        >>> data.shape, info["_weight"].shape, bool((info["_weight"] <= 1).all())
        (torch.Size([5, 1]), torch.Size([5]), True)
    """

    def __init__(self, *, alpha: float, beta: float, eps: float = 1e-8, dtype: torch.dtype = torch.float64,
                 storage: Storage | None = None, collate_fn: Any = None, pin_memory: bool = False,
                 prefetch: int | None = None, transform: Any = None, batch_size: int | None = None,
                 sampler: PrioritizedSampler | None = None, sampler_device: Any = None, sync: bool = True,
                 generator: torch.Generator | None = None, compilable: bool = False, delayed_init: bool = False,
                 shared: bool = False, dim_extend: int | None = None, sample_unit: Any = None,
                 transport: Any = None, transport_options: Any = None) -> None:
        storage = storage if storage is not None else ListStorage(1000)
        _check_prioritized_options(sampler, sampler_device, sync)
        sampler = sampler or PrioritizedSampler(storage.max_size, alpha, beta, eps, dtype)
        super().__init__(storage=storage, sampler=sampler, collate_fn=collate_fn, pin_memory=pin_memory,
                         prefetch=prefetch, transform=transform, batch_size=batch_size, generator=generator,
                         compilable=compilable, delayed_init=delayed_init, shared=shared, dim_extend=dim_extend,
                         sample_unit=sample_unit, transport=transport, transport_options=transport_options)


def _check_prioritized_options(sampler: Any, sampler_device: Any, sync: bool) -> None:
    """``sampler`` must be a PrioritizedSampler; trees live on the CPU; ``sync=False`` is refused."""
    if sampler is not None and not isinstance(sampler, PrioritizedSampler):
        raise TypeError(f"sampler must be a PrioritizedSampler, got {type(sampler).__name__}")
    if sampler is not None and sampler_device is not None:
        raise ValueError("pass either sampler or sampler_device, not both")
    if sampler_device is not None and torch.device(sampler_device).type != "cpu":
        raise ValueError(f"sampler_device={sampler_device!r}: priority trees live on the CPU here")
    if not sync:
        raise NotImplementedError("sync=False (writer processes with a catching-up learner sampler) is not "
                                  "provided; priorities are always updated on write")


class TensorDictPrioritizedReplayBuffer(TensorDictReplayBuffer):
    """A :class:`TensorDictReplayBuffer` with a :class:`PrioritizedSampler`.

    Sampled batches carry ``"index"`` and ``"_weight"`` (also under TorchRL 0.14's name
    ``"priority_weight"``, which the losses weight by); after computing a loss, write
    the new priorities under ``priority_key`` and call :meth:`update_tensordict_priority`.
    ``extend`` with data that already holds ``priority_key`` uses those priorities.

    Args:
        alpha, beta, eps, dtype, reduction: see :class:`PrioritizedSampler`.
        priority_key: default ``"td_error"``.
        storage, collate_fn, pin_memory, prefetch, transform, batch_size, writer, generator,
            compilable, shared, dim_extend, sample_unit, transport, transport_options: as
            :class:`ReplayBuffer`.
        sampler_device, sync: as :class:`PrioritizedReplayBuffer`.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.data.replay_buffers import LazyTensorStorage
        >>> rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(100), batch_size=8)
        >>> _ = rb.extend(TensorDict({"obs": torch.randn(50, 3)}, [50]))
        >>> batch = rb.sample()
        >>> batch["td_error"] = torch.rand(8)
        >>> rb.update_tensordict_priority(batch)
        >>> sorted(k for k in batch.keys() if k != "obs")
        ['_weight', 'index', 'priority_weight', 'td_error']
    """

    def __init__(self, *, alpha: float, beta: float, priority_key: NestedKey = "td_error", eps: float = 1e-8,
                 dtype: torch.dtype = torch.float64, storage: Storage | None = None, collate_fn: Any = None,
                 pin_memory: bool = False, prefetch: int | None = None, transform: Any = None,
                 reduction: str = "max", batch_size: int | None = None, writer: Writer | None = None,
                 max_priority_within_buffer: bool = False, sampler_device: Any = None, sync: bool = True,
                 generator: torch.Generator | None = None, compilable: bool = False, shared: bool = False,
                 dim_extend: int | None = None, sample_unit: Any = None, transport: Any = None,
                 transport_options: Any = None) -> None:
        storage = storage if storage is not None else ListStorage(1000)
        _check_prioritized_options(None, sampler_device, sync)
        sampler = PrioritizedSampler(storage.max_size, alpha, beta, eps, dtype, reduction,
                                     max_priority_within_buffer)
        super().__init__(priority_key=priority_key, storage=storage, sampler=sampler, collate_fn=collate_fn,
                         pin_memory=pin_memory, prefetch=prefetch, transform=transform, batch_size=batch_size,
                         writer=writer, generator=generator, compilable=compilable, shared=shared,
                         dim_extend=dim_extend, sample_unit=sample_unit, transport=transport,
                         transport_options=transport_options)

