"""Ensembles of replay buffers: sample from several buffers at once, with weights.

:class:`ReplayBufferEnsemble` holds member buffers (each with its own storage, sampler,
writer, transform and ``collate_fn``). A ``sample(B)`` picks ``k`` members (all of them with
``sample_from_all=True``, else ``num_buffer_sampled`` draws with replacement following the
weights ``p``), samples ``B // k`` items from each through the member's own pipeline, and
stacks the ``k`` sub-batches into ``[k, B // k, ...]``. TensorDict batches carry
``("index", "buffer_ids")`` and ``("index", "index")``: which member and which slot each item
came from.

:class:`StorageEnsemble`, :class:`SamplerEnsemble` and :class:`WriterEnsemble` hold the
members' parts, as in TorchRL; the ensemble reads through them, writes are routed to a
member (``ensemble[i].extend(...)``, or ``routing_key``/``routing_dim``).
"""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from steersman.tensordict import (
    NestedKey,
    TensorDict,
    TensorDictBase,
    is_tensor_collection,
    unravel_key,
)
from steersman.tensordict.files import write_json_atomic

from ._checkpoint import FORMAT, VERSION, CheckpointError, read_json
from .replay_buffers import ReplayBuffer, _TransformChain, stack_anything
from .samplers import Sampler
from .storages import Storage
from .writers import Writer

__all__ = ["ReplayBufferEnsemble", "StorageEnsemble", "SamplerEnsemble", "WriterEnsemble"]


class StorageEnsemble(Storage):
    """The storages of a :class:`ReplayBufferEnsemble`'s members (read-only as a whole).

    Args:
        *storages: the members' storages.
        transforms: one transform (or ``None``) per storage, applied to what is read from it.

    ``len(ensemble)`` is the number of storages (as in TorchRL); ``ensemble[i]`` is one of
    them. :meth:`get` takes a TensorDict with ``"buffer_ids"`` and ``"index"`` (as sampled by
    :class:`SamplerEnsemble`) and returns a list of ``(buffer_id, data)``, one per row.

    Example:
        >>> import torch
        >>> from steersman.data.replay_buffers import LazyTensorStorage
        >>> a, b = LazyTensorStorage(4), LazyTensorStorage(4)
        >>> a.set(torch.arange(2), torch.tensor([1.0, 2.0])); b.set(torch.arange(2), torch.tensor([5.0, 6.0]))
        >>> st = StorageEnsemble(a, b)
        >>> len(st), st[1] is b
        (2, True)
        >>> ids = TensorDict({"buffer_ids": torch.tensor([1, 0]), "index": torch.tensor([[0, 1], [1, 1]])}, [2])
        >>> [(i, x.tolist()) for i, x in st.get(ids)]
        [(1, [5.0, 6.0]), (0, [2.0, 2.0])]
    """

    def __init__(self, *storages: Storage, transforms: list | None = None) -> None:
        if not storages or not all(isinstance(s, Storage) for s in storages):
            raise TypeError(f"StorageEnsemble needs one or more Storage objects, got "
                            f"{[type(s).__name__ for s in storages]}")
        if transforms is not None and len(transforms) != len(storages):
            raise ValueError(f"transforms has {len(transforms)} entries for {len(storages)} storages")
        self._storages = tuple(storages)
        self.max_size = sum(s.max_size for s in storages)
        self._len = len(storages)
        self._last_cursor = None
        self.transforms = [t if isinstance(t, _TransformChain) else _TransformChain([] if t is None else [t])
                           for t in (transforms or [None] * len(storages))]
        self._checkpointer = None

    @property
    def storages(self) -> tuple[Storage, ...]:
        return self._storages

    def __len__(self) -> int:
        return len(self._storages)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, int):
            return self._storages[index]
        if isinstance(index, slice):
            return StorageEnsemble(*self._storages[index], transforms=self.transforms[index])
        return self.get(index)

    def get(self, index: Any) -> list:
        if not isinstance(index, TensorDictBase) or "buffer_ids" not in index.keys():
            raise TypeError("StorageEnsemble.get takes a TensorDict with 'buffer_ids' and 'index' entries "
                            f"(as sampled by a SamplerEnsemble), got {type(index).__name__}")
        out = []
        for bid, idx in zip(index.get("buffer_ids").reshape(-1).tolist(), index.get("index").unbind(0)):
            data = self._storages[bid].get(idx)
            tr = self.transforms[bid]
            out.append((bid, tr(data) if len(tr) else data))
        return out

    def set(self, cursor: Any, data: Any) -> None:
        raise RuntimeError("a StorageEnsemble is read-only: write to one member (ensemble[i].extend(...))")

    def _empty(self) -> None:
        for s in self._storages:
            s._empty()

    def state_dict(self) -> dict[str, Any]:
        return {str(i): s.state_dict() for i, s in enumerate(self._storages)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for i, s in enumerate(self._storages):
            s.load_state_dict(state[str(i)])

    def dumps(self, path: Any) -> None:
        """Each storage to ``path/<i>`` (see :class:`StorageEnsembleCheckpointer`)."""
        from .checkpointers import StorageEnsembleCheckpointer

        (self._checkpointer or StorageEnsembleCheckpointer()).dumps(self, path)

    def loads(self, path: Any) -> None:
        from .checkpointers import StorageEnsembleCheckpointer

        (self._checkpointer or StorageEnsembleCheckpointer()).loads(self, path)

    def __repr__(self) -> str:
        return f"StorageEnsemble(storages={list(self._storages)!r}, transforms={self.transforms!r})"


class SamplerEnsemble(Sampler):
    """The samplers of a :class:`ReplayBufferEnsemble`'s members and how members are chosen.

    Args:
        *samplers: one sampler per member.
        p: relative weights of the members (normalized); ``"sampleable"`` weighs each
            member by its current number of items (empty members are never chosen);
            default uniform.
        sample_from_all: every member, once per batch (not together with ``p``).
        num_buffer_sampled: number of members drawn (with replacement) per batch; default
            the number of members.

    :meth:`sample` on a :class:`StorageEnsemble` returns a TensorDict ``[k]`` with
    ``"buffer_ids"`` and ``"index"`` (``[k, B // k]``) and an info dict.

    Example:
        >>> import torch
        >>> from steersman.data.replay_buffers import LazyTensorStorage, RandomSampler
        >>> a, b = LazyTensorStorage(4), LazyTensorStorage(4)
        >>> a.set(torch.arange(3), torch.zeros(3)); b.set(torch.arange(2), torch.ones(2))
        >>> index, info = SamplerEnsemble(RandomSampler(), RandomSampler(), sample_from_all=True).sample(
        ...     StorageEnsemble(a, b), 6)
        >>> index["buffer_ids"].tolist(), index["index"].shape
        ([0, 1], torch.Size([2, 3]))
    """

    def __init__(self, *samplers: Sampler, p: Tensor | list[float] | Literal["sampleable"] | None = None,
                 sample_from_all: bool = False, num_buffer_sampled: int | None = None) -> None:
        if not samplers or not all(isinstance(s, Sampler) for s in samplers):
            raise TypeError(f"SamplerEnsemble needs one or more Sampler objects, got "
                            f"{[type(s).__name__ for s in samplers]}")
        self._samplers = tuple(samplers)
        n = len(samplers)
        if sample_from_all and p is not None:
            raise RuntimeError("sample_from_all=True samples every member; it cannot be combined with p")
        if isinstance(p, str):
            if p != "sampleable":
                raise ValueError(f"p must be weights or 'sampleable', got {p!r}")
        elif p is not None:
            p = torch.as_tensor(p, dtype=torch.float64).reshape(-1)
            if p.numel() != n or not bool(torch.isfinite(p).all()) or bool((p < 0).any()) or p.sum() <= 0:
                raise ValueError(f"p must hold {n} finite non-negative weights with a positive sum, got {p.tolist()}")
            p = p / p.sum()
        if num_buffer_sampled is not None and (isinstance(num_buffer_sampled, bool)
                                               or not isinstance(num_buffer_sampled, int) or num_buffer_sampled < 1):
            raise ValueError(f"num_buffer_sampled must be a positive integer, got {num_buffer_sampled!r}")
        self.p = p
        self.sample_from_all = sample_from_all
        self.num_buffer_sampled = num_buffer_sampled
        self.ran_out = False

    @property
    def samplers(self) -> tuple[Sampler, ...]:
        return self._samplers

    def __len__(self) -> int:
        return len(self._samplers)

    def __getitem__(self, i: int) -> Sampler:
        return self._samplers[i]

    def choose(self, lengths: Sequence[int], batch_size: int, generator: torch.Generator | None = None
               ) -> tuple[Tensor, int]:
        """(member ids drawn for one batch, items per member)."""
        n = len(self._samplers)
        if self.sample_from_all:
            ids = torch.arange(n)
        else:
            k = self.num_buffer_sampled or n
            if isinstance(self.p, str):
                w = torch.tensor([float(x) for x in lengths], dtype=torch.float64)
                if w.sum() <= 0:
                    raise RuntimeError("p='sampleable': every member of the ensemble is empty")
            else:
                w = self.p if self.p is not None else torch.ones(n, dtype=torch.float64)
            ids = torch.multinomial(w, k, replacement=True, generator=generator)
        if batch_size % ids.numel():
            raise ValueError(f"batch_size={batch_size} must be divisible by the {ids.numel()} buffers sampled "
                             "per batch (num_buffer_sampled)")
        return ids, batch_size // ids.numel()

    def sample(self, storage: Storage, batch_size: int) -> tuple[Any, dict]:
        if not isinstance(storage, StorageEnsemble) or len(storage) != len(self._samplers):
            raise TypeError(f"SamplerEnsemble.sample needs a StorageEnsemble of {len(self._samplers)} storages")
        ids, per = self.choose([len(s) for s in storage.storages], batch_size)
        indices, infos = [], []
        for bid in ids.tolist():
            index, info = self._samplers[bid].sample(storage[bid], per)
            indices.append(index)
            infos.append(info)
        self.ran_out = any(s.ran_out for s in self._samplers)
        out = TensorDict({"buffer_ids": ids, "index": torch.stack(indices)}, [ids.numel()])
        return out, {"infos": infos}

    def _empty(self) -> None:
        for s in self._samplers:
            s._empty()

    def _reset_epoch(self) -> None:
        self.ran_out = False
        for s in self._samplers:
            s._reset_epoch()

    def state_dict(self) -> dict[str, Any]:
        return {str(i): s.state_dict() for i, s in enumerate(self._samplers)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for i, s in enumerate(self._samplers):
            s.load_state_dict(state[str(i)])

    def __repr__(self) -> str:
        return (f"SamplerEnsemble(samplers={list(self._samplers)!r}, p={self.p!r}, "
                f"sample_from_all={self.sample_from_all}, num_buffer_sampled={self.num_buffer_sampled})")


class WriterEnsemble(Writer):
    """The writers of a :class:`ReplayBufferEnsemble`'s members. It does not write itself:
    write to a member (``ensemble[i].extend(data)``) or build the ensemble with
    ``routing_key``/``routing_dim``.

    Example:
        >>> from steersman.data.replay_buffers import RoundRobinWriter
        >>> w = WriterEnsemble(RoundRobinWriter(), RoundRobinWriter())
        >>> len(w)
        2
    """

    def __init__(self, *writers: Writer) -> None:
        if not writers or not all(isinstance(w, Writer) for w in writers):
            raise TypeError(f"WriterEnsemble needs one or more Writer objects, got {[type(w).__name__ for w in writers]}")
        super().__init__()
        self._writers = tuple(writers)

    @property
    def writers(self) -> tuple[Writer, ...]:
        return self._writers

    @property
    def write_count(self) -> int:
        return sum(w.write_count for w in self._writers)

    def __len__(self) -> int:
        return len(self._writers)

    def __getitem__(self, i: int) -> Writer:
        return self._writers[i]

    def register_storage(self, storage: Storage) -> None:
        if isinstance(storage, StorageEnsemble):
            for w, s in zip(self._writers, storage.storages):
                w.register_storage(s)

    def add(self, data: Any) -> Any:
        raise RuntimeError("a WriterEnsemble does not write: write to one member (ensemble[i].add(...))")

    def extend(self, data: Any) -> Tensor:
        raise RuntimeError("a WriterEnsemble does not write: write to one member (ensemble[i].extend(...))")

    def _empty(self) -> None:
        for w in self._writers:
            w._empty()

    def state_dict(self) -> dict[str, Any]:
        return {str(i): w.state_dict() for i, w in enumerate(self._writers)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for i, w in enumerate(self._writers):
            w.load_state_dict(state[str(i)])

    def __repr__(self) -> str:
        return f"WriterEnsemble(writers={list(self._writers)!r})"


def _stack(items: list) -> Any:
    """Default collate of an ensemble: stack the members' sub-batches along a new dim 0."""
    out = stack_anything(items)
    if out is items:
        raise TypeError("ReplayBufferEnsemble: the members' sub-batches cannot be stacked (different types or "
                        "shapes); give the members transforms that make them alike, or pass collate_fn")
    return out


class ReplayBufferEnsemble(ReplayBuffer):
    """Samples from several replay buffers at once (see the module docstring).

    Args:
        *rbs: the member buffers; or build from parts with ``storages``, ``samplers``,
            ``writers`` (and ``collate_fns``).
        transform: applied to the stacked batch (each member's own transform runs first,
            on its sub-batch).
        batch_size: default ``sample`` size; must be divisible by the number of members
            sampled per batch.
        collate_fn: joins the members' sub-batches (default: stack along a new dim 0).
        collate_fns: one ``collate_fn`` per member when built from parts.
        p, sample_from_all, num_buffer_sampled: see :class:`SamplerEnsemble`.
        routing_key: enables ``extend``: each record goes to the member whose id it holds
            under this key (records keep their order within a member).
        routing_dim: enables ``extend``: entry ``i`` along this batch dim goes to member
            ``i`` (the dim's size is the number of members). Not with ``routing_key``.
        generator: a CPU generator for choosing members (members draw items with their own).
        shared: only ``False``.
        **kwargs: other :class:`ReplayBuffer` keywords (``prefetch``, ``pin_memory``...).

    ``len(ensemble)`` is the number of members and ``ensemble[i]`` the i-th member, as in
    TorchRL; ``ensemble.extend`` without routing raises ``RuntimeError``.

    Shapes: ``sample(B)`` with ``k`` members drawn returns ``[k, B // k, *item]``.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.data.replay_buffers import LazyTensorStorage, TensorDictReplayBuffer
        >>> rb0 = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
        >>> rb1 = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
        >>> ens = ReplayBufferEnsemble(rb0, rb1, sample_from_all=True, batch_size=6)
        >>> _ = ens[0].extend(TensorDict({"x": torch.zeros(10)}, [10]))
        >>> _ = ens[1].extend(TensorDict({"x": torch.ones(10)}, [10]))
        >>> s = ens.sample()
        >>> s.shape, s["index", "buffer_ids"][:, 0].tolist(), s["x"][:, 0].tolist()
        (torch.Size([2, 3]), [0, 1], [0.0, 1.0])
    """

    def __init__(self, *rbs: ReplayBuffer, storages: StorageEnsemble | None = None,
                 samplers: SamplerEnsemble | None = None, writers: WriterEnsemble | None = None,
                 transform: Any = None, batch_size: int | None = None, collate_fn: Callable | None = None,
                 collate_fns: list[Callable] | None = None,
                 p: Tensor | list[float] | Literal["sampleable"] | None = None, sample_from_all: bool = False,
                 num_buffer_sampled: int | None = None, routing_key: NestedKey | None = None,
                 routing_dim: int | None = None, generator: torch.Generator | None = None, shared: bool = False,
                 **kwargs: Any) -> None:
        if rbs:
            if storages is not None or samplers is not None or writers is not None:
                raise RuntimeError("pass either replay buffers or storages/samplers/writers, not both")
            if not all(isinstance(rb, ReplayBuffer) for rb in rbs):
                raise TypeError(f"the members must be ReplayBuffers, got {[type(rb).__name__ for rb in rbs]}")
            members = list(rbs)
        else:
            if storages is None or samplers is None or writers is None:
                raise RuntimeError("pass replay buffers, or all of storages, samplers and writers")
            if not (len(storages) == len(samplers) == len(writers)):
                raise ValueError(f"storages, samplers and writers have {len(storages)}, {len(samplers)} and "
                                 f"{len(writers)} members")
            if collate_fns is not None and len(collate_fns) != len(storages):
                raise ValueError(f"collate_fns has {len(collate_fns)} entries for {len(storages)} members")
            members = [ReplayBuffer(storage=s, sampler=sa, writer=w,
                                    collate_fn=None if collate_fns is None else collate_fns[i])
                       for i, (s, sa, w) in enumerate(zip(storages.storages, samplers.samplers, writers.writers))]
            for rb, tr in zip(members, storages.transforms):
                rb._transform = tr
        if samplers is None:
            samplers = SamplerEnsemble(*[rb.sampler for rb in members], p=p, sample_from_all=sample_from_all,
                                       num_buffer_sampled=num_buffer_sampled)
        elif p is not None or sample_from_all or num_buffer_sampled is not None:
            raise RuntimeError("p, sample_from_all and num_buffer_sampled go to the SamplerEnsemble when it is passed")
        if routing_key is not None and routing_dim is not None:
            raise ValueError("pass routing_key or routing_dim, not both")
        if shared:
            raise NotImplementedError("ReplayBufferEnsemble(shared=True): share the members' LazyMemmapStorage "
                                      "folders instead")
        bad = sorted(k for k, v in kwargs.items() if k not in ("prefetch", "pin_memory", "compilable", "delayed_init",
                                                                 "transform_factory") or (k == "prefetch" and v))
        if bad:
            raise TypeError(f"ReplayBufferEnsemble does not take {bad}; prefetch is not provided for ensembles")
        self._members = members
        self._sample_unit = None
        self._storage = storages or StorageEnsemble(*[rb.storage for rb in members],
                                                    transforms=[rb.transform for rb in members])
        self._sampler = samplers
        self._writer = writers or WriterEnsemble(*[rb.writer for rb in members])
        self._collate_fn = collate_fn or _stack
        if generator is not None and (not isinstance(generator, torch.Generator) or generator.device.type != "cpu"):
            raise TypeError(f"generator must be a CPU torch.Generator, got {generator!r}")
        self._generator = generator
        self._pin_memory = False
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                       or batch_size < 1):
            raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
        self._batch_size = batch_size
        self._prefetch = 0
        self._prefetch_queue: Any = collections.deque()
        self._executor = None
        self._finalizer = None
        self._lock = threading.RLock()
        if kwargs.get("transform_factory") is not None:
            transform = kwargs["transform_factory"]()
        self._transform = _TransformChain([] if transform is None else
                                          list(transform) if isinstance(transform, (list, tuple)) else [transform])
        self.routing_key = None if routing_key is None else unravel_key(routing_key)
        self.routing_dim = routing_dim

    # ---------------------------------------------------------------- members
    def __len__(self) -> int:
        return len(self._members)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, int):
            return self._members[index]
        if isinstance(index, slice):
            return ReplayBufferEnsemble(*self._members[index], batch_size=self._batch_size)
        raise TypeError(f"index an ensemble with a member number or a slice, got {type(index).__name__}")

    @property
    def write_count(self) -> int:
        return sum(rb.write_count for rb in self._members)

    # ---------------------------------------------------------------- writes
    def _routed(self) -> None:
        if self.routing_key is None and self.routing_dim is None:
            raise RuntimeError("ReplayBufferEnsemble does not take writes: write to one member "
                               "(ensemble[i].extend(...)), or build it with routing_key or routing_dim")

    def extend(self, data: Any) -> TensorDict:
        """Routed writes; returns a TensorDict ``[N]`` with ``"buffer_ids"`` and ``"index"`` (the
        member and slot of each input record, in input order)."""
        self._routed()
        n = len(self._members)
        if self.routing_dim is not None:
            shape = data.batch_size if is_tensor_collection(data) else data.shape
            dim = self.routing_dim
            if not -len(shape) <= dim < len(shape) or shape[dim] != n:
                raise ValueError(f"routing_dim={dim}: the data's batch shape {list(shape)} must have the "
                                 f"{n} members along that dim")
            parts = data.unbind(dim)
            idx = [rb.extend(part) for rb, part in zip(self._members, parts)]
            ids = torch.cat([torch.full((i.numel(),), b, dtype=torch.long) for b, i in enumerate(idx)])
            return TensorDict({"buffer_ids": ids, "index": torch.cat([i.reshape(-1).cpu() for i in idx])},
                              [ids.numel()])
        if not is_tensor_collection(data) or self.routing_key not in data.keys(include_nested=True):
            raise KeyError(f"routing_key {self.routing_key!r} is not in the data written")
        flat = data.reshape(-1) if len(data.batch_size) != 1 else data
        route = flat.get(self.routing_key).reshape(flat.batch_size[0], -1)[:, 0].long().cpu()
        if route.numel() and (route.min() < 0 or route.max() >= n):
            raise ValueError(f"routing_key {self.routing_key!r} holds member ids {sorted(set(route.tolist()))}; "
                             f"this ensemble has members 0..{n - 1}")
        ids = torch.full_like(route, -1)
        index = torch.full_like(route, -1)
        for b in route.unique().tolist():
            where = (route == b).nonzero().squeeze(-1)
            index[where] = self._members[b].extend(flat[where]).reshape(-1).cpu().long()
            ids[where] = b
        return TensorDict({"buffer_ids": ids, "index": index}, [ids.numel()])

    def add(self, data: Any) -> Any:
        self._routed()
        if self.routing_dim is not None:
            raise RuntimeError("add() writes one record; with routing_dim use extend()")
        return self.extend(data.unsqueeze(0))[0]

    def __setitem__(self, index: Any, value: Any) -> None:
        raise RuntimeError("write to one member: ensemble[i][index] = value")

    def update_priority(self, index: Any, priority: Any) -> None:
        """``index`` is a sampled ``("index")`` TensorDict: priorities go to each member."""
        if not isinstance(index, TensorDictBase):
            raise TypeError("update_priority on an ensemble takes the sampled 'index' TensorDict "
                            "(with 'buffer_ids' and 'index')")
        ids = index.get("buffer_ids").reshape(-1)
        idx = index.get("index").reshape(ids.numel(), -1)
        prio = torch.as_tensor(priority).reshape(ids.numel(), -1)
        for b in ids.unique().tolist():
            rows = ids == b
            self._members[b].update_priority(idx[rows].reshape(-1), prio[rows].reshape(-1))

    def empty(self) -> None:
        for rb in self._members:
            rb.empty()

    # ---------------------------------------------------------------- reads
    def _sample(self, batch_size: int) -> tuple[Any, dict]:
        with self._lock:
            lengths = [len(rb) for rb in self._members]
            ids, per = self._sampler.choose(lengths, batch_size, self._generator)
            parts, infos = [], []
            for b in ids.tolist():
                data, info = self._members[b]._sample(per)
                parts.append(data)
                infos.append(info)
        self._sampler.ran_out = any(rb.sampler.ran_out for rb in self._members)
        try:
            index = torch.stack([torch.as_tensor(i["index"]).reshape(-1).cpu() for i in infos])
        except RuntimeError:
            raise RuntimeError("ReplayBufferEnsemble: the members returned different numbers of items for the "
                               "same sub-batch size (slice samplers of different shapes?)") from None
        bids = ids.unsqueeze(-1).expand(ids.numel(), index.shape[-1]).clone()
        out_index = TensorDict({"buffer_ids": bids, "index": index}, list(bids.shape))
        for part in parts:
            if isinstance(part, TensorDictBase) and "index" in part.keys():
                del part["index"]
        data = self._collate_fn(parts)
        if isinstance(data, TensorDictBase) and list(data.batch_size[:2]) == list(bids.shape):
            data.set("index", out_index.to(data.device) if data.device is not None else out_index)
        info: dict = {"index": out_index, "buffer_ids": ids}
        extra = [k for k in infos[0] if k != "index" and all(k in i for i in infos)]
        for k in extra:
            try:
                info[k] = torch.stack([torch.as_tensor(i[k]) for i in infos])
            except (RuntimeError, TypeError):
                info[k] = [i[k] for i in infos]
        if self._transform.transforms:
            data = self._transform(data)
        return data, info

    def __iter__(self):
        if self._batch_size is None:
            raise RuntimeError("cannot iterate over a replay buffer without a batch_size")
        self._sampler._reset_epoch()
        while not self._sampler.ran_out:
            yield self._sample(self._batch_size)[0]

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {"members": [rb.state_dict() for rb in self._members], "_batch_size": self._batch_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        members = state["members"]
        if len(members) != len(self._members):
            raise ValueError(f"the state holds {len(members)} members; this ensemble has {len(self._members)}")
        for rb, st in zip(self._members, members):
            rb.load_state_dict(st)
        self._batch_size = state.get("_batch_size", self._batch_size)

    def dumps(self, path: Any) -> None:
        """Each member's checkpoint under ``path/<i>`` plus ``ensemble.json``."""
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        for i, rb in enumerate(self._members):
            rb.dumps(root / str(i))
        write_json_atomic(root / "ensemble.json", {"format": FORMAT, "version": VERSION, "type": "ReplayBufferEnsemble",
                                                   "members": len(self._members)})

    def loads(self, path: Any) -> None:
        """Validates every member's checkpoint first, then loads them all (or none)."""
        root = Path(path)
        meta = read_json(root / "ensemble.json", root)
        if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("type") != "ReplayBufferEnsemble":
            raise CheckpointError(f"{root / 'ensemble.json'} is not a replay-buffer ensemble checkpoint",
                                  file=root / "ensemble.json", field="type")
        if meta.get("members") != len(self._members):
            raise CheckpointError(f"{root} holds {json.dumps(meta.get('members'))[:40]} members; this ensemble has "
                                  f"{len(self._members)}", file=root / "ensemble.json", field="members")
        ready = [rb._prepare_loads(root / str(i)) for i, rb in enumerate(self._members)]
        for rb, r in zip(self._members, ready):
            rb._commit_loads(r)

    def __repr__(self) -> str:
        return (f"ReplayBufferEnsemble(\n    storages={self._storage!r},\n    samplers={self._sampler!r},\n"
                f"    writers={self._writer!r},\n    batch_size={self._batch_size},\n    transform={self._transform!r})")
