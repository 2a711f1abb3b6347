"""Writers: where each new item goes in the storage.

* :class:`RoundRobinWriter` writes at a cursor that wraps around (a circular buffer: the
  oldest items are overwritten first).
* :class:`TensorDictRoundRobinWriter` does the same and also records each item's slot in
  the item itself, under ``"index"``.
* :class:`TensorDictMaxValueWriter` keeps the ``max_size`` items with the largest rank
  (e.g. the best episodes by return): a new item replaces the lowest-ranked one only if it
  ranks higher.

``extend`` returns the slots written (a long tensor); with ``ndim=2`` storages (TorchRL's
``[time, n_envs]`` layout) the cursor moves over rows (time steps) and ``extend``/``add``
return TorchRL's ``[rows * n_envs, 2]`` ``(row, col)`` pair of every element written.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from steersman.tensordict import NestedKey, TensorDict, TensorDictBase, is_tensor_collection

from ._checkpoint import CheckpointError, get_field, prepared, read_component, write_component
from .storages import Storage, TensorStorage

__all__ = ["Writer", "RoundRobinWriter", "TensorDictRoundRobinWriter", "TensorDictMaxValueWriter",
           "ImmutableDatasetWriter"]


def _n_items(data: Any) -> int:
    if isinstance(data, Tensor):
        if data.ndim == 0:
            raise ValueError("extend needs a batch dim: got a 0-d tensor (use add for one item)")
        return data.shape[0]
    if is_tensor_collection(data):
        if not data.batch_size:
            raise ValueError("extend needs data with at least one batch dim (use add for a single item)")
        return data.batch_size[0]
    return len(data)


def _with_index(data: Any, pairs: bool = False) -> Any:
    """``data`` with an ``"index"`` entry (a placeholder, so a lazy storage allocates it;
    ``pairs``: one ``(row, col)`` pair per element, for ``ndim=2`` storages)."""
    if not isinstance(data, TensorDictBase):
        return data
    if data.is_locked:
        data = data.copy().unlock_()
    if "index" not in data.keys():
        shape = (*data.batch_size, 2) if pairs else data.batch_size
        data.set("index", torch.zeros(shape, dtype=torch.long, device=data.device))
    return data


class Writer:
    """Base class: a cursor and a write count over a registered storage.

    ``compilable`` is accepted for TorchRL compatibility and has no effect.
    """

    def __init__(self, compilable: bool = False) -> None:
        self._storage: Storage | None = None
        self._cursor = 0
        self._write_count = 0
        self._last_span: tuple[int, int] | None = None  # contiguous slots of the last extend

    def register_storage(self, storage: Storage) -> None:
        self._storage = storage

    @property
    def write_count(self) -> int:
        """Number of items ever written (``add`` counts 1, ``extend`` its batch length)."""
        return self._write_count

    def add(self, data: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def extend(self, data: Any) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _empty(self) -> None:
        self._cursor = 0
        self._write_count = 0

    def state_dict(self) -> dict[str, Any]:
        return {"_cursor": self._cursor, "_write_count": self._write_count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._cursor = int(state["_cursor"])
        self._write_count = int(state["_write_count"])

    def _checkpoint_state(self) -> tuple[dict, Any]:
        return {"cursor": self._cursor, "write_count": self._write_count}, None

    def _prepare_load(self, meta: dict, tensors: Any, path: Any) -> Any:
        cursor = get_field(meta, "cursor", int, path)
        count = get_field(meta, "write_count", int, path)
        if cursor < 0 or count < 0:
            raise CheckpointError(f"{path}: negative cursor or write count")
        return cursor, count

    def _commit_load(self, prepared: Any) -> None:
        self._cursor, self._write_count = prepared

    def dumps(self, path: Any) -> None:
        meta, tensors = self._checkpoint_state()
        write_component(path, type(self).__name__, meta, tensors)

    def loads(self, path: Any) -> None:
        meta, tensors = read_component(path, type(self).__name__)
        self._commit_load(prepared(path, self._prepare_load, meta, tensors, path))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(cursor={self._cursor}, full_storage={self._storage is not None and len(self._storage) == self._storage.max_size})"


class RoundRobinWriter(Writer):
    """Writes at a cursor that wraps around the storage (oldest items overwritten first).

    Args:
        compilable: accepted for TorchRL compatibility; no effect.
        track_generations: keep a generation counter per slot, bumped by every write to
            the slot and by ``empty``: a ``(index, generation)`` pair names one record,
            and :meth:`ReplayBuffer.update_if_present` patches only records whose pair
            still matches (sampled batches then carry ``"index_generation"``).

    Example:
        >>> import torch
        >>> from steersman.data.replay_buffers import LazyTensorStorage
        >>> w = RoundRobinWriter()
        >>> w.register_storage(LazyTensorStorage(4))
        >>> w.extend(torch.arange(3)).tolist(), w.extend(torch.arange(3)).tolist()
        ([0, 1, 2], [3, 0, 1])
    """

    def __init__(self, compilable: bool = False, track_generations: bool = False) -> None:
        super().__init__()
        self.track_generations = bool(track_generations)
        self._generations = torch.zeros(0, dtype=torch.long)

    def _bump(self, index: Any) -> None:
        """A new record in each slot of ``index`` (dim-0 slots)."""
        idx = torch.as_tensor(index, dtype=torch.long).reshape(-1).cpu()
        cap = self._storage._rows_capacity
        if self._generations.numel() < cap:
            self._generations = torch.cat([self._generations,
                                           torch.zeros(cap - self._generations.numel(), dtype=torch.long)])
        self._generations[idx] += 1

    def generations(self, index: Any) -> Tensor:
        """The current generation of the dim-0 slots ``index``."""
        idx = torch.as_tensor(index, dtype=torch.long).cpu()
        if self._generations.numel() < self._storage._rows_capacity:
            self._bump(torch.empty(0, dtype=torch.long))
        return self._generations[idx]

    def _empty(self) -> None:
        super()._empty()
        self._generations += 1  # every handle taken before is stale

    def _checkpoint_state(self) -> tuple[dict, Any]:
        meta, tensors = super()._checkpoint_state()
        if self.track_generations and self._generations.numel():
            return {**meta, "generations": True}, TensorDict({"generations": self._generations}, [])
        return meta, tensors

    def _prepare_load(self, meta: dict, tensors: Any, path: Any) -> Any:
        base = super()._prepare_load(meta, tensors, path)
        gens = None
        if meta.get("generations") is True:
            g = None if tensors is None else tensors.get("generations", None)
            if not isinstance(g, Tensor) or g.dtype is not torch.long or g.ndim != 1:
                raise CheckpointError(f"{path}: the slot generations are missing or malformed", file=path,
                                      field="generations")
            gens = g.clone()
        return base, gens

    def _commit_load(self, prepared: Any) -> None:
        base, gens = prepared
        super()._commit_load(base)
        if gens is not None:
            self._generations = gens
        else:
            self._generations += 1  # generations unknown: every earlier handle is stale

    def _mark(self, data: Any, index: Any) -> Any:
        return data

    def _pre(self, data: Any) -> Any:
        return data

    def add(self, data: Any) -> int:
        st = self._storage
        data = self._pre(data)
        if isinstance(st, TensorStorage):
            data = st._prepare(data, 0)
        cur = self._cursor
        if cur >= st._rows_capacity:  # capacity known only after the lazy init
            cur = self._cursor = 0
        data = self._mark(data, cur)
        filled = len(st) // st._row_len
        st._write(cur, data, max(filled, cur + 1))
        st._last_cursor = cur
        self._cursor = (cur + 1) % st._rows_capacity
        self._write_count += 1
        if self.track_generations:
            self._bump(cur)
        return cur if st.ndim == 1 else st._replicate(cur)

    def extend(self, data: Any) -> Tensor:
        st = self._storage
        data = self._pre(data)
        if isinstance(st, TensorStorage):
            data = st._prepare(data, 1)
        n = total = _n_items(data)
        dev = st._leaf_device() if isinstance(st, TensorStorage) else torch.device("cpu")
        self._last_span = None
        if n == 0:
            return torch.empty((0,) if st.ndim == 1 else (0, 2), dtype=torch.long, device=dev)
        cap = st._rows_capacity
        cur = self._cursor % cap
        if n > cap:  # only the last `cap` items survive
            cur = (cur + n - cap) % cap
            data = data[n - cap :]
            n = cap
        end = cur + n
        if end <= cap:
            index = torch.arange(cur, end, device=dev)
            data = self._mark(data, index)
            st._write(slice(cur, end), data, max(len(st) // st._row_len, end))
            self._last_span = (cur, end)
        else:
            index = torch.arange(cur, end, device=dev).remainder_(cap)
            data = self._mark(data, index)
            st._write(index, data, cap)
            self._last_span = None
        st._last_cursor = (end - 1) % cap
        self._cursor = end % cap
        self._write_count += total
        if self.track_generations:
            self._bump(index)
        return index if st.ndim == 1 else st._replicate(index).to(dev)


class TensorDictRoundRobinWriter(RoundRobinWriter):
    """A :class:`RoundRobinWriter` that also stores each item's slot under ``"index"``.

    The ``"index"`` entry is set on the data passed to ``extend``/``add`` (in place, unless
    it is locked), so after ``rb.extend(td)`` one can compute priorities on ``td`` and call
    ``rb.update_tensordict_priority(td)``.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.data.replay_buffers import LazyTensorStorage
        >>> w = TensorDictRoundRobinWriter()
        >>> w.register_storage(LazyTensorStorage(10))
        >>> td = TensorDict({"x": torch.zeros(3)}, [3])
        >>> _ = w.extend(td)
        >>> td["index"].tolist()
        [0, 1, 2]
    """

    def _pre(self, data: Any) -> Any:
        return _with_index(data, pairs=self._storage is not None and self._storage.ndim == 2)

    def _mark(self, data: Any, index: Any) -> Any:
        if not isinstance(data, TensorDictBase):
            return data
        st = self._storage
        bs = data.batch_size
        if st.ndim == 2:  # (row, col) pairs, written into the placeholder: it may be a
            # transposed view of the caller's "index" ([n_envs, T, 2]), which then gets them too
            idx = st._replicate(index).reshape(*bs, 2).to(data.device or "cpu")
            held = data.get("index", None)
            if isinstance(held, Tensor) and held.shape == idx.shape and held.dtype is torch.long:
                held.copy_(idx)
            else:
                data.set("index", idx)
            return data
        idx = torch.as_tensor(index)
        if idx.shape != bs:
            idx = idx.reshape(tuple(idx.shape) + (1,) * (len(bs) - idx.ndim)).expand(bs)
        data.set("index", idx)
        return data


class TensorDictMaxValueWriter(Writer):
    """Keeps the ``max_size`` items with the highest rank.

    Args:
        rank_key: the entry ranking the items (default ``("next", "reward")``); entries with
            more than one value per item are reduced with ``reduction``.
        reduction: ``"sum"``, ``"max"``, ``"min"`` or ``"mean"``.

    While the storage has room every item is written; once full, an item replaces the
    lowest-ranked stored item only if it ranks strictly higher. ``extend`` returns the slots
    of the items it wrote (items that did not make it are skipped); a TensorDict gets
    ``"index"`` set to the slot, or ``-1`` for an item that was not kept.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.data.replay_buffers import LazyTensorStorage
        >>> st = LazyTensorStorage(2)
        >>> w = TensorDictMaxValueWriter(rank_key="r")
        >>> w.register_storage(st)
        >>> _ = w.extend(TensorDict({"r": torch.tensor([1.0, 5.0, 3.0])}, [3]))
        >>> sorted(st.get(torch.arange(2))["r"].tolist())
        [3.0, 5.0]
    """

    def __init__(self, rank_key: NestedKey | None = None, reduction: str = "sum") -> None:
        super().__init__()
        if reduction not in ("sum", "max", "min", "mean"):
            raise ValueError(f"reduction must be 'sum', 'max', 'min' or 'mean', got {reduction!r}")
        self._rank_key = ("next", "reward") if rank_key is None else rank_key
        self._reduction = reduction
        self._ranks: Tensor | None = None

    def register_storage(self, storage: Storage) -> None:
        if not isinstance(storage, TensorStorage):
            raise TypeError("TensorDictMaxValueWriter needs a tensor storage (LazyTensorStorage, LazyMemmapStorage...)")
        if storage.ndim != 1:
            raise ValueError("TensorDictMaxValueWriter supports ndim=1 storages only")
        super().register_storage(storage)

    def _rank(self, data: Any, batch: bool) -> Tensor:
        if not isinstance(data, TensorDictBase):
            raise TypeError("TensorDictMaxValueWriter ranks TensorDicts; got " + type(data).__name__)
        try:
            r = data.get(self._rank_key)
        except KeyError:
            raise KeyError(f"the data has no rank entry {self._rank_key!r} (set rank_key=)") from None
        r = r.detach().to(torch.float64)
        r = r.reshape(r.shape[0], -1) if batch else r.reshape(1, -1)
        return getattr(r, self._reduction if self._reduction not in ("max", "min") else "a" + self._reduction)(1)

    def add(self, data: Any) -> int | None:
        index = self._extend(data, single=True)
        return int(index[0]) if index.numel() else None

    def extend(self, data: Any) -> Tensor:
        return self._extend(data, single=False)

    def _extend(self, data: Any, single: bool) -> Tensor:
        self._last_span = None
        st = self._storage
        data = st._prepare(_with_index(data), 0 if single else 1)
        ranks = self._rank(data, batch=not single)
        n = ranks.shape[0]
        dev = st._leaf_device()
        cap = st._rows_capacity
        if self._ranks is None or self._ranks.shape[0] != cap:
            self._ranks = torch.full((cap,), -torch.inf, dtype=torch.float64)
        filled = len(st)
        order = torch.argsort(ranks, descending=True, stable=True)
        free = cap - filled
        m = min(free, n)
        take_new = order[:m]
        slots = torch.arange(filled, filled + m)
        rest = order[m:]
        if rest.numel():
            cur = self._ranks.clone()
            cur[slots] = ranks[take_new]
            slot_order = torch.argsort(cur, stable=True)[: rest.numel()]
            better = ranks[rest] > cur[slot_order]
            j = int(better.sum())
            take_new = torch.cat([take_new, rest[:j]])
            slots = torch.cat([slots, slot_order[:j]])
        self._write_count += n
        keep_index = torch.full((n,), -1, dtype=torch.long)
        keep_index[take_new] = slots
        data.set("index", keep_index[0] if single else keep_index.to(dev))
        if take_new.numel() == 0:
            return slots.to(dev)
        if single:
            st._write(int(slots[0]), data, filled + m)
        else:
            st._write(slots.to(dev), data[take_new.to(dev)], filled + m)
        self._ranks[slots] = ranks[take_new]
        st._last_cursor = int(slots[-1])
        self._cursor = (filled + m) % cap
        return slots.to(dev)

    def _empty(self) -> None:
        super()._empty()
        self._ranks = None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "_ranks": None if self._ranks is None else self._ranks.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        r = state.get("_ranks")
        self._ranks = None if r is None else r.clone()

    def _checkpoint_state(self) -> tuple[dict, Any]:
        meta, _ = super()._checkpoint_state()
        tensors = None if self._ranks is None else TensorDict({"ranks": self._ranks}, [])
        return meta, tensors

    def _prepare_load(self, meta: dict, tensors: Any, path: Any) -> Any:
        base = super()._prepare_load(meta, tensors, path)
        ranks = None
        if tensors is not None:
            ranks = tensors.get("ranks", None)
            if not isinstance(ranks, Tensor) or ranks.ndim != 1 or not ranks.dtype.is_floating_point:
                raise CheckpointError(f"{path}: the ranks are missing or not a 1-D float tensor", file=path,
                                      field="ranks")
            ranks = ranks.to(torch.float64, copy=True)
        return base, ranks

    def _commit_load(self, prepared: Any) -> None:
        base, ranks = prepared
        super()._commit_load(base)
        self._ranks = ranks


class ImmutableDatasetWriter(Writer):
    """A writer that refuses every write: for read-only (offline) datasets.

    ``add``, ``extend`` and ``empty`` raise a ``RuntimeError`` and leave the buffer as it
    was; sampling and reading work as usual.

    Example:
        >>> import torch
        >>> from steersman.data import ImmutableDatasetWriter, LazyTensorStorage, ReplayBuffer
        >>> storage = LazyTensorStorage(10)
        >>> storage.set(torch.arange(4), torch.arange(4.0))
        >>> rb = ReplayBuffer(storage=storage, writer=ImmutableDatasetWriter(), batch_size=2)
        >>> rb.sample().shape
        torch.Size([2])
        >>> rb.add(torch.zeros(()))
        Traceback (most recent call last):
        ...
        RuntimeError: This dataset doesn't allow writing (ImmutableDatasetWriter).
    """

    WRITING_ERR = "This dataset doesn't allow writing (ImmutableDatasetWriter)."

    def add(self, data: Any) -> Any:
        raise RuntimeError(self.WRITING_ERR)

    def extend(self, data: Any) -> Tensor:
        raise RuntimeError(self.WRITING_ERR)

    def _empty(self) -> None:
        raise RuntimeError(self.WRITING_ERR)
