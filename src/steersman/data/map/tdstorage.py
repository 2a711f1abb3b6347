"""``TensorMap`` / ``TensorDictMap``: dict-like maps keyed by TensorDict entries
(TorchRL's names): ``map[keys_td] = values_td``, ``map[keys_td]``, ``map.contains(keys_td)``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from steersman.tensordict import TensorDict, TensorDictBase
from steersman.tensordict.nn import TensorDictModuleBase

from ..replay_buffers.storages import LazyTensorStorage
from .hash import RandomProjectionHash, SipHash
from .query import QueryModule

__all__ = ["TensorDictMap", "TensorMap"]


class TensorMap:
    """Base of maps from keys to tensors: ``__getitem__``, ``__setitem__``,
    ``contains`` (a bool tensor, one entry per queried element), ``__contains__`` (all of
    them), ``clear`` and ``__len__``. Subclasses implement the first three."""

    def __getitem__(self, item: Any) -> Any:
        raise NotImplementedError

    def __setitem__(self, key: Any, value: Any) -> None:
        raise NotImplementedError

    def contains(self, item: Any) -> Tensor:
        raise NotImplementedError

    def __contains__(self, item: Any) -> bool:
        return bool(self.contains(item).all())

    def clear(self) -> None:
        raise NotImplementedError


class TensorDictMap(TensorDictModuleBase, TensorMap):
    """A map from the ``query_module``'s ``in_keys`` entries to the ``storage`` entries.

    ``map[keys] = values`` hashes each element of ``keys`` (a TensorDict ``[N]``) to an
    index and writes ``values[k]`` at that index of ``storage[k]`` for every storage
    key; ``map[keys]`` reads them back (a TensorDict ``[N]``, with the query's index
    and hash entries); ``map.contains(keys)`` is a bool ``[N]``. Reading a key never
    written raises a KeyError naming how many elements are unknown. Calling the map
    (``forward``) fills the values into the input TensorDict.

    Keyword Args:
        query_module (QueryModule): maps elements to storage indices.
        storage (dict key -> storage): one storage (e.g. ``LazyTensorStorage``) per
            stored entry.
        collate_fn (callable): applied to what the storages return (default identity).
        out_keys (list of keys): the entries to return (default: the storage keys).
        write_fn (callable): ``write_fn(old, new) -> value`` for indices already written
            (e.g. a running sum); default: overwrite.

    Examples:
        >>> from steersman.data import LazyTensorStorage
        >>> q = QueryModule(in_keys=["key1", "key2"], index_key="index")
        >>> m = TensorDictMap(query_module=q, storage={"out": LazyTensorStorage(1000)})
        >>> keys = TensorDict({"key1": torch.tensor([[-1.], [1.], [3.], [-3.]]),
        ...                    "key2": torch.tensor([[0.], [2.], [4.], [-4.]])}, batch_size=[4])
        >>> m[keys] = TensorDict({"out": torch.tensor([[10.], [20.], [30.], [40.]])}, batch_size=[4])
        >>> m[keys]["out"].flatten().tolist(), m.contains(keys).tolist(), len(m)
        ([10.0, 20.0, 30.0, 40.0], [True, True, True, True], 4)
    """

    def __init__(self, *, query_module: QueryModule, storage: dict[Any, Any],
                 collate_fn: Callable[[Any], Any] | None = None, out_keys: Sequence[Any] | None = None,
                 write_fn: Callable[[Any, Any], Any] | None = None) -> None:
        super().__init__()
        if not isinstance(query_module, QueryModule):
            raise TypeError(f"TensorDictMap: query_module must be a QueryModule, got {type(query_module).__name__}")
        if not isinstance(storage, dict) or not storage:
            raise TypeError("TensorDictMap: storage must be a non-empty dict {key: storage}")
        self.query_module = query_module
        self.storage = storage
        self.collate_fn = collate_fn if collate_fn is not None else (lambda x: x)
        self.write_fn = write_fn
        self.in_keys = list(query_module.in_keys)
        self.out_keys = list(out_keys) if out_keys is not None else list(storage)
        unknown = [k for k in self.out_keys if k not in storage]
        if unknown:
            raise ValueError(f"TensorDictMap: out_keys {unknown} have no storage; storages: {list(storage)}")
        self._written = torch.zeros(0, dtype=torch.bool)

    @property
    def max_size(self) -> int:
        return min(s.max_size for s in self.storage.values())

    @classmethod
    def from_tensordict_pair(cls, source: TensorDictBase, dest: TensorDictBase, in_keys: list[Any],
                             out_keys: list[Any] | None = None, max_size: int = 1000,
                             storage_constructor: type | None = None, hash_module: Callable | None = None,
                             collate_fn: Callable | None = None, write_fn: Callable | None = None,
                             consolidated: bool | None = None) -> TensorDictMap:
        """A map keyed by ``in_keys`` of TensorDicts like ``source`` to the ``out_keys``
        (default: all leaves) of TensorDicts like ``dest``; each stored entry gets a
        ``storage_constructor(max_size)`` (default :class:`LazyTensorStorage`); the hash
        is :class:`SipHash` for inputs of at most 16 features per key, else
        :class:`RandomProjectionHash`."""
        if hash_module is None:
            wide = any(source.get(k).reshape(source.batch_size.numel(), -1).shape[-1] > 16 for k in in_keys)
            hash_module = RandomProjectionHash() if wide else SipHash()
        query = QueryModule(in_keys=in_keys, hash_module=hash_module)
        keys = list(out_keys) if out_keys is not None else list(dest.keys(True, True))
        make = storage_constructor if storage_constructor is not None else LazyTensorStorage
        return cls(query_module=query, storage={k: make(max_size) for k in keys}, collate_fn=collate_fn,
                   write_fn=write_fn, out_keys=keys)

    def _index(self, item: TensorDictBase, extend: bool) -> Tensor:
        if not isinstance(item, TensorDictBase):
            raise TypeError(f"TensorDictMap: keys must be a TensorDict, got {type(item).__name__}")
        return self.query_module(item, extend=extend, clone=True).get(self.query_module.index_key)

    def contains(self, item: TensorDictBase) -> Tensor:
        index = self._index(item, extend=False)
        known = (index >= 0) & (index < self._written.numel())
        return known & self._written[index.clamp(0, max(self._written.numel() - 1, 0))] if self._written.numel() \
            else torch.zeros_like(index, dtype=torch.bool)

    def __len__(self) -> int:
        return int(self._written.sum())

    def __getitem__(self, item: TensorDictBase) -> TensorDictBase:
        q = self.query_module(item, extend=False, clone=True)
        index = q.get(self.query_module.index_key)
        found = self.contains(item)
        if not bool(found.all()):
            raise KeyError(f"TensorDictMap: {int((~found).sum())} of {found.numel()} queried elements were never "
                           f"written (keys {self.in_keys})")
        flat = index.reshape(-1)
        out = TensorDict({}, batch_size=item.batch_size)
        for k in self.out_keys:
            v = self.collate_fn(self.storage[k].get(flat))
            out.set(k, v.reshape(*item.batch_size, *v.shape[1:]))
        out.set(self.query_module.index_key, index)
        out.set(self.query_module.hash_key, q.get(self.query_module.hash_key))
        return out

    def __setitem__(self, item: TensorDictBase, value: TensorDictBase) -> None:
        if not isinstance(value, TensorDictBase) or value.batch_size != item.batch_size:
            raise ValueError(f"TensorDictMap: values must be a TensorDict with the keys' batch size "
                             f"{list(item.batch_size)}, got "
                             f"{list(value.batch_size) if isinstance(value, TensorDictBase) else type(value).__name__}")
        missing = [k for k in self.out_keys if value.get(k, None) is None]
        if missing:
            raise KeyError(f"TensorDictMap: values have no entries {missing}; the map stores {self.out_keys}")
        index = self._index(item, extend=True).reshape(-1)
        if index.numel() and int(index.max()) >= self.max_size:
            raise RuntimeError(f"TensorDictMap: full ({self.max_size} distinct keys); cannot store more")
        for k in self.out_keys:
            new = value.get(k).reshape(index.numel(), *value.get(k).shape[item.batch_dims:])
            if self.write_fn is not None:
                seen = self.contains(item).reshape(-1)
                if bool(seen.any()):
                    old = self.storage[k].get(index[seen])
                    new = new.clone()
                    new[seen] = self.write_fn(old, new[seen])
            self.storage[k].set(index, new)
        n = int(index.max()) + 1 if index.numel() else 0
        if n > self._written.numel():
            self._written = torch.cat([self._written, torch.zeros(n - self._written.numel(), dtype=torch.bool)])
        self._written[index] = True

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        found = self[tensordict]
        for k in self.out_keys:
            tensordict.set(k, found.get(k))
        return tensordict

    def clear(self) -> None:
        """Forgets every key (the storages keep their memory)."""
        self._written = torch.zeros(0, dtype=torch.bool)
        self.query_module.hash_to_int.load_state_dict({"keys": torch.zeros(0, dtype=torch.int64),
                                                       "values": torch.zeros(0, dtype=torch.int64)})
