"""Storage checkpointers: how a storage is written by ``dumps`` and read by ``loads``.

Set one with ``storage.checkpointer = FlatStorageCheckpointer()`` (or ``Storage``'s
``checkpointer=`` argument); ``storage.dumps``/``loads`` and a buffer's ``dumps``/``loads``
then go through it. Without one, a storage uses its kind's default
(:class:`TensorStorageCheckpointer`, :class:`ListStorageCheckpointer`), which writes
steersman's format: JSON metadata plus raw tensor files. Every checkpointer reads only JSON,
raw tensor files and HDF5 datasets: loading never executes code from the folder, and a
folder that does not fit the storage raises :class:`CheckpointError` with the storage
unchanged.

The TED checkpointers (:class:`FlatStorageCheckpointer`, :class:`NestedStorageCheckpointer`,
:class:`H5StorageCheckpointer`) store TED data without the ``"next"`` copies of shifted
entries (see :class:`TED2Flat`); data that is not TED (no ``"next"`` entry) is stored whole.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from steersman.tensordict import TensorDict, TensorDictBase

from ._checkpoint import (
    CheckpointError,
    get_field,
    inside,
    prepared,
    read_component,
    write_component,
)
from .ted import Flat2TED, TED2Flat

__all__ = [
    "StorageCheckpointerBase",
    "ListStorageCheckpointer",
    "TensorStorageCheckpointer",
    "CompressedListStorageCheckpointer",
    "FlatStorageCheckpointer",
    "NestedStorageCheckpointer",
    "H5StorageCheckpointer",
    "StorageEnsembleCheckpointer",
]


class StorageCheckpointerBase:
    """Base class: ``dumps(storage, path)`` writes, ``loads(storage, path)`` reads.

    Subclasses implement ``dumps`` and ``prepare(storage, path)``, which validates a folder
    and returns what the storage commits (nothing changes before that); ``loads`` is
    ``prepare`` then commit. Save hooks (``hook(tensors, path) -> tensors``) run on the
    tensors before they are written, load hooks (``hook(tensors) -> tensors``) on the
    tensors read, before validation.
    """

    _anonymous = False  # a storage's default: writes no checkpointer name (old folders stay compatible)

    @property
    def _name(self) -> str | None:
        return None if self._anonymous else type(self).__name__

    def __init__(self) -> None:
        self._save_hooks: list[Callable] = []
        self._load_hooks: list[Callable] = []

    def register_save_hook(self, hook: Callable) -> None:
        self._save_hooks.append(hook)

    def register_load_hook(self, hook: Callable) -> None:
        self._load_hooks.append(hook)

    def dumps(self, storage: Any, path: Any) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def prepare(self, storage: Any, path: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def loads(self, storage: Any, path: Any) -> None:
        storage._commit_load(self.prepare(storage, path))

    def _check_kind(self, storage: Any, kinds: tuple[type, ...]) -> None:
        if not isinstance(storage, kinds):
            raise TypeError(f"{type(self).__name__} checkpoints {' or '.join(k.__name__ for k in kinds)} storages, "
                            f"not a {type(storage).__name__}")

    def _write(self, storage: Any, path: Any, meta: dict, tensors: Any) -> None:
        for hook in self._save_hooks:
            tensors = hook(tensors, path)
        if self._name is not None:
            meta = {**meta, "checkpointer": self._name}
        write_component(path, type(storage).__name__, meta, tensors)

    def _read(self, storage: Any, path: Any) -> tuple[dict, Any]:
        meta, tensors = read_component(path, storage._checkpoint_types())
        saved = meta.get("checkpointer", None)
        plain = ("ListStorageCheckpointer", "TensorStorageCheckpointer")
        if saved is not None and saved != type(self).__name__ and not (self._anonymous and saved in plain):
            raise CheckpointError(f"{path} was written by a {str(saved)[:60]}; this storage's checkpointer is a "
                                  f"{type(self).__name__.lstrip('_')}", file=Path(path) / "meta.json", field="checkpointer")
        if tensors is not None:
            for hook in self._load_hooks:
                tensors = hook(tensors)
        return meta, tensors


class _PlainCheckpointer(StorageCheckpointerBase):
    """The storage's own format (JSON + raw tensor files)."""

    _kinds: tuple[type, ...] = ()

    def dumps(self, storage: Any, path: Any) -> None:
        self._check_kind(storage, self._kinds)
        meta, tensors = storage._checkpoint_state()
        self._write(storage, path, meta, tensors)

    def prepare(self, storage: Any, path: Any) -> Any:
        self._check_kind(storage, self._kinds)
        meta, tensors = self._read(storage, path)
        return prepared(path, storage._prepare_load, meta, tensors, path)


class ListStorageCheckpointer(_PlainCheckpointer):
    """The default of :class:`ListStorage`: tensors and TensorDicts to tensor files, JSON
    values inline (other Python objects are refused: loading never unpickles).

    Example:
        >>> import tempfile, torch
        >>> from steersman.data.replay_buffers import ListStorage
        >>> st = ListStorage(4); st.checkpointer = ListStorageCheckpointer()
        >>> st.set(range(2), [torch.ones(2), "two"])
        >>> with tempfile.TemporaryDirectory() as d:
        ...     st.dumps(d); other = ListStorage(4); other.checkpointer = ListStorageCheckpointer(); other.loads(d)
        >>> other.get(1), other.get(0).tolist()
        ('two', [1.0, 1.0])
    """

    def __init__(self) -> None:
        super().__init__()
        from .storages import ListStorage

        self._kinds = (ListStorage,)


class TensorStorageCheckpointer(_PlainCheckpointer):
    """The default of tensor storages (TensorDicts, tensors and pytrees of tensors): the
    filled rows as raw tensor files (memory-mapped on load) plus JSON metadata.

    Example:
        >>> import tempfile, torch
        >>> from steersman.data.replay_buffers import LazyTensorStorage
        >>> st = LazyTensorStorage(8); st.checkpointer = TensorStorageCheckpointer()
        >>> st.set(torch.arange(3), {"a": torch.arange(3.0)})
        >>> with tempfile.TemporaryDirectory() as d:
        ...     st.dumps(d); other = LazyTensorStorage(8); other.loads(d)
        >>> other.get(torch.arange(3))["a"].tolist()
        [0.0, 1.0, 2.0]
    """

    def __init__(self) -> None:
        super().__init__()
        from .storages import TensorStorage

        self._kinds = (TensorStorage,)


class CompressedListStorageCheckpointer(StorageCheckpointerBase):
    """Writes a :class:`CompressedListStorage`'s items as they are held: compressed byte
    blobs (one tensor file each) plus their shapes, dtypes and keys in JSON. Loading checks
    every blob decompresses to its recorded size before the storage changes; it needs the
    same ``decompression_fn`` as the writer's.

    Example:
        >>> import tempfile, torch
        >>> from steersman.data.replay_buffers import CompressedListStorage
        >>> st = CompressedListStorage(4); st.checkpointer = CompressedListStorageCheckpointer()
        >>> st.set(range(2), [torch.zeros(64), torch.ones(3, dtype=torch.int32)])
        >>> with tempfile.TemporaryDirectory() as d:
        ...     st.dumps(d)
        ...     other = CompressedListStorage(4); other.checkpointer = CompressedListStorageCheckpointer()
        ...     other.loads(d)
        >>> other.get(1).tolist(), other.get(0).shape
        ([1, 1, 1], torch.Size([64]))
    """

    def dumps(self, storage: Any, path: Any) -> None:
        from .list_storages import CompressedListStorage

        self._check_kind(storage, (CompressedListStorage,))
        entries, blobs = [], {}
        for i, rec in enumerate(storage._storage):
            if "tensor" in rec:
                leaves = {"": rec["tensor"]}
                entries.append({"kind": "tensor", **_leaf_meta(rec["tensor"])})
            else:
                leaves = rec["td"]
                entries.append({"kind": "td", "batch_size": rec["batch_size"],
                                "leaves": {k: _leaf_meta(v) for k, v in leaves.items()}})
            for j, v in enumerate(leaves.values()):
                blobs[f"{i}_{j}"] = v["blob"]
        meta = {"max_size": storage.max_size, "len": storage._len, "last_cursor": storage._last_cursor,
                "entries": entries}
        self._write(storage, path, meta, TensorDict(blobs, []) if blobs else None)

    def prepare(self, storage: Any, path: Any) -> Any:
        from .list_storages import CompressedListStorage

        self._check_kind(storage, (CompressedListStorage,))
        meta, tensors = self._read(storage, path)
        entries = get_field(meta, "entries", list, path)
        if len(entries) > storage.max_size:
            raise CheckpointError(f"{path} holds {len(entries)} items, more than max_size={storage.max_size}",
                                  file=path, field="entries")
        records = []
        for i, e in enumerate(entries):
            where = f"entries.{i}"
            if not isinstance(e, dict) or e.get("kind") not in ("tensor", "td"):
                raise CheckpointError(f"{path}: item {i} is not a compressed tensor or TensorDict", file=path,
                                      field=where)
            specs = {"": e} if e["kind"] == "tensor" else e.get("leaves")
            if not isinstance(specs, dict):
                raise CheckpointError(f"{path}: item {i} has no leaves", file=path, field=where)
            leaves = {}
            for j, (k, spec) in enumerate(specs.items()):
                blob = None if tensors is None else tensors.get(f"{i}_{j}", None)
                if not isinstance(blob, torch.Tensor) or blob.dtype is not torch.uint8:
                    raise CheckpointError(f"{path}: the compressed bytes of item {i} are missing", file=path,
                                          field=where)
                leaves[k] = _check_leaf(storage, spec, blob.clone(), path, where)
            if e["kind"] == "tensor":
                records.append({"tensor": leaves[""]})
            else:
                bs = e.get("batch_size")
                if not isinstance(bs, list) or not all(type(x) is int and x >= 0 for x in bs):
                    raise CheckpointError(f"{path}: item {i} has a bad batch_size {bs!r:.40}", file=path, field=where)
                records.append({"td": leaves, "batch_size": bs})
        last = meta.get("last_cursor")
        if last is not None and (type(last) is not int or not 0 <= last < max(len(records), 1)):
            raise CheckpointError(f"{path}: last_cursor {last!r:.40} is not a slot", file=path, field="last_cursor")
        return records, last


def _leaf_meta(rec: dict) -> dict:
    return {"shape": rec["shape"], "dtype": rec["dtype"]}


def _check_leaf(storage: Any, spec: Any, blob: torch.Tensor, path: Any, where: str) -> dict:
    shape, dtype = (spec.get("shape"), spec.get("dtype")) if isinstance(spec, dict) else (None, None)
    dt = getattr(torch, dtype, None) if isinstance(dtype, str) and dtype.isidentifier() else None
    if not isinstance(dt, torch.dtype) or not isinstance(shape, list) or not all(type(x) is int and x >= 0
                                                                               for x in shape):
        raise CheckpointError(f"{path}: a leaf of {where} has a bad shape/dtype ({shape!r:.40}, {dtype!r:.20})",
                              file=path, field=where)
    try:
        raw = storage.decompression_fn(blob)
    except Exception as err:  # noqa: BLE001 - any codec failure means a damaged blob
        raise CheckpointError(f"{path}: a blob of {where} does not decompress ({type(err).__name__}: {err})",
                              file=path, field=where) from None
    want = int(np.prod(shape)) * torch.empty((), dtype=dt).element_size()
    if raw.numel() != want:
        raise CheckpointError(f"{path}: a blob of {where} holds {raw.numel()} bytes, its shape {shape} and dtype "
                              f"{dtype} need {want}", file=path, field=where)
    return {"blob": blob, "shape": shape, "dtype": dtype}


class FlatStorageCheckpointer(StorageCheckpointerBase):
    """Writes a tensor storage of TED data in :class:`TED2Flat`'s compact form (``"next"``
    copies of shifted entries only at trajectory ends) and rebuilds it on load.

    Args:
        done_keys, reward_keys: see :class:`TED2Flat`.

    Example:
        >>> import tempfile, torch
        >>> from steersman import TensorDict
        >>> from steersman.data.replay_buffers import LazyTensorStorage
        >>> obs = torch.arange(6.0).unsqueeze(-1)
        >>> ted = TensorDict({"obs": obs, "next": {"obs": obs + 1, "done": (obs == 5)}}, [6])
        >>> st = LazyTensorStorage(10); st.checkpointer = FlatStorageCheckpointer(); st.set(torch.arange(6), ted)
        >>> with tempfile.TemporaryDirectory() as d:
        ...     st.dumps(d)
        ...     back = LazyTensorStorage(10); back.checkpointer = FlatStorageCheckpointer(); back.loads(d)
        >>> bool((back.get(torch.arange(6)) == ted).all())
        True
    """

    _to_flat = TED2Flat
    _from_flat = Flat2TED

    def __init__(self, done_keys: tuple | None = None, reward_keys: tuple | None = None, **kwargs: Any) -> None:
        super().__init__()
        opts = {k: v for k, v in (("done_keys", done_keys), ("reward_keys", reward_keys)) if v is not None}
        self._flat = TED2Flat(**opts, **kwargs)
        self._ted = Flat2TED(**opts, **kwargs)

    def _compact(self, storage: Any, meta: dict, tensors: Any) -> tuple[dict, Any]:
        ted = (tensors is not None and not meta.get("is_tensor", False) and meta.get("pytree") is None
               and isinstance(tensors.get("next", None), TensorDictBase))
        if ted:
            tensors = self._flat(tensors, last_cursor=storage._last_cursor,
                                 is_full=len(storage) >= storage.max_size)
        return {**meta, "ted_flat": ted}, tensors

    def _expand(self, meta: dict, tensors: Any, path: Any) -> Any:
        if get_field(meta, "ted_flat", bool, path):
            try:
                tensors = self._ted(tensors)
            except (ValueError, TypeError, RuntimeError, IndexError) as err:
                raise CheckpointError(f"{path}: the flat TED data does not fit together ({err})", file=path) from err
        return tensors

    def dumps(self, storage: Any, path: Any) -> None:
        from .storages import TensorStorage

        self._check_kind(storage, (TensorStorage,))
        if storage.ndim != 1:
            raise ValueError(f"{type(self).__name__} stores one-dimensional storages (TED steps in a row); "
                             f"this one has ndim={storage.ndim}")
        meta, tensors = self._compact(storage, *storage._checkpoint_state())
        self._write(storage, path, meta, tensors)

    def prepare(self, storage: Any, path: Any) -> Any:
        from .storages import TensorStorage

        self._check_kind(storage, (TensorStorage,))
        meta, tensors = self._read(storage, path)
        tensors = self._expand(meta, tensors, path)
        return prepared(path, storage._prepare_load, meta, tensors, path)


class NestedStorageCheckpointer(FlatStorageCheckpointer):
    """As :class:`FlatStorageCheckpointer`, plus the trajectory layout: ``traj_lengths`` (the
    number of steps of each trajectory, in storage order) is written with the data, so
    :meth:`load_trajectories` can give the checkpoint back as a :class:`TED2Nested`-style
    TensorDict of trajectories without a storage.

    Example:
        >>> import tempfile, torch
        >>> from steersman import TensorDict
        >>> from steersman.data.replay_buffers import LazyTensorStorage
        >>> done = torch.tensor([False, True, False, False, True]).unsqueeze(-1)
        >>> ted = TensorDict({"obs": torch.arange(5.0), "next": {"obs": torch.arange(5.0) + 1, "done": done}}, [5])
        >>> st = LazyTensorStorage(5); st.checkpointer = NestedStorageCheckpointer(); st.set(torch.arange(5), ted)
        >>> with tempfile.TemporaryDirectory() as d:
        ...     st.dumps(d); trajs = NestedStorageCheckpointer().load_trajectories(d)
        >>> [t.tolist() for t in trajs["obs"].unbind()]
        [[0.0, 1.0], [2.0, 3.0, 4.0]]
    """

    def _compact(self, storage: Any, meta: dict, tensors: Any) -> tuple[dict, Any]:
        meta, tensors = super()._compact(storage, meta, tensors)
        if meta["ted_flat"]:
            end = tensors.get("is_end")
            stops = end.nonzero().squeeze(-1) + 1
            meta["traj_lengths"] = torch.diff(stops, prepend=torch.zeros(1, dtype=torch.long)).tolist()
        return meta, tensors

    def load_trajectories(self, path: Any) -> TensorDict:
        """The checkpoint's trajectories: a TensorDict ``[n_traj]`` of jagged nested leaves."""
        from .storages import LazyTensorStorage
        from .ted import TED2Nested

        meta, tensors = read_component(path, LazyTensorStorage(1)._checkpoint_types())
        if meta.get("checkpointer") != type(self).__name__ or "traj_lengths" not in meta:
            raise CheckpointError(f"{path} was not written by a NestedStorageCheckpointer from TED data", file=path,
                                  field="checkpointer")
        ted = self._expand(meta, tensors, path)
        return TED2Nested(done_keys=self._flat.done_keys)(ted.to_tensordict())


class H5StorageCheckpointer(FlatStorageCheckpointer):
    """As :class:`FlatStorageCheckpointer`, with the data in one HDF5 file (``h5py``).

    Keyword Args:
        checkpoint_file: the file's name inside the folder passed to ``dumps``/``loads``
            (default ``"checkpoint.h5"``); a path ending in ``.h5`` is used as the file
            itself (its metadata goes next to it, ``<name>.meta.json``).
        done_keys, reward_keys: see :class:`TED2Flat`.
        h5_kwargs: a dict (or pairs) passed to ``h5py``'s ``create_dataset`` (e.g.
            ``{"compression": "gzip"}``).

    Loading reads the datasets as arrays (nothing in the file is executed); entries the
    metadata does not list are ignored.

    Example:
        >>> import tempfile, torch
        >>> from steersman.data.replay_buffers import LazyTensorStorage
        >>> st = LazyTensorStorage(4); st.checkpointer = H5StorageCheckpointer(h5_kwargs={"compression": "gzip"})
        >>> st.set(torch.arange(3), {"obs": torch.arange(6.0).reshape(3, 2)})
        >>> with tempfile.TemporaryDirectory() as d:
        ...     st.dumps(d)
        ...     back = LazyTensorStorage(4); back.checkpointer = H5StorageCheckpointer(); back.loads(d)
        >>> back.get(torch.arange(3))["obs"].tolist()
        [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    """

    def __init__(self, *, checkpoint_file: str = "checkpoint.h5", done_keys: tuple | None = None,
                 reward_keys: tuple | None = None, h5_kwargs: Any = None, **kwargs: Any) -> None:
        super().__init__(done_keys=done_keys, reward_keys=reward_keys, **kwargs)
        self.checkpoint_file = checkpoint_file
        self.h5_kwargs = dict(h5_kwargs or {})

    def _paths(self, path: Any) -> tuple[Path, Path]:
        path = Path(path)
        if path.suffix == ".h5":
            return path.parent / (path.name + ".meta"), path
        return path, path / self.checkpoint_file

    def dumps(self, storage: Any, path: Any) -> None:
        import h5py

        from .storages import TensorStorage

        self._check_kind(storage, (TensorStorage,))
        meta, tensors = self._compact(storage, *storage._checkpoint_state())
        for hook in self._save_hooks:
            tensors = hook(tensors, path)
        folder, file = self._paths(path)
        leaves = []
        folder.mkdir(parents=True, exist_ok=True)
        tmp = file.with_name(file.name + ".tmp")
        with h5py.File(tmp, "w") as f:
            if tensors is not None:
                for key in tensors.keys(include_nested=True, leaves_only=True):
                    parts = (key,) if isinstance(key, str) else key
                    if any("/" in p for p in parts):
                        raise ValueError(f"H5StorageCheckpointer: key {key!r} holds a '/', which HDF5 reads as a group")
                    t = tensors.get(key)
                    if t.dtype is torch.bfloat16:
                        raise TypeError(f"H5StorageCheckpointer: entry {key!r} is bfloat16, which HDF5 cannot store")
                    f.create_dataset("/".join(parts), data=t.detach().cpu().numpy(), **self.h5_kwargs)
                    leaves.append({"key": list(parts), "dtype": str(t.dtype).removeprefix("torch."),
                                   "shape": list(t.shape)})
        tmp.replace(file)
        write_component(folder, type(storage).__name__, {**meta, "checkpointer": self._name,
                                                         "h5_file": file.name, "leaves": leaves,
                                                         "tensor_batch": None if tensors is None else
                                                         list(tensors.batch_size)})

    def prepare(self, storage: Any, path: Any) -> Any:
        import h5py

        from .storages import TensorStorage

        self._check_kind(storage, (TensorStorage,))
        folder, _ = self._paths(path)
        meta, _ = self._read(storage, folder)
        name = get_field(meta, "h5_file", str, folder)
        if "/" in name or name in ("", ".", ".."):
            raise CheckpointError(f"{folder}: h5_file {name!r:.60} is not a file name", file=folder, field="h5_file")
        file = inside(folder if folder.is_dir() else folder.parent, (folder if folder.is_dir() else folder.parent)
                      / name)
        leaves = get_field(meta, "leaves", list, folder)
        tensors = None
        if meta.get("tensor_batch") is not None:
            tensors = TensorDict({}, get_field(meta, "tensor_batch", list, folder))
            try:
                with h5py.File(file, "r") as f:
                    for i, leaf in enumerate(leaves):
                        key, dtype, shape = leaf.get("key"), leaf.get("dtype"), leaf.get("shape")
                        dt = getattr(torch, dtype, None) if isinstance(dtype, str) and dtype.isidentifier() else None
                        if (not isinstance(key, list) or not key or not all(isinstance(p, str) for p in key)
                                or not isinstance(dt, torch.dtype)):
                            raise CheckpointError(f"{folder}: leaf {i} of the metadata is malformed", file=folder,
                                                  field=f"leaves.{i}")
                        ds = f.get("/".join(key))
                        if not isinstance(ds, h5py.Dataset) or list(ds.shape) != shape:
                            raise CheckpointError(f"{file}: dataset {'/'.join(key)!r} is missing or not of shape "
                                                  f"{shape}", file=file, field="/".join(key))
                        arr = np.asarray(ds[()])
                        if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "biuf":
                            raise CheckpointError(f"{file}: dataset {'/'.join(key)!r} is not numeric", file=file,
                                                  field="/".join(key))
                        tensors.set(tuple(key), torch.from_numpy(np.ascontiguousarray(arr)).to(dt))
            except (OSError, KeyError, TypeError, ValueError) as err:
                if isinstance(err, CheckpointError):
                    raise
                raise CheckpointError(f"{file} is not a readable HDF5 checkpoint ({type(err).__name__}: {err})",
                                      file=file) from None
            for hook in self._load_hooks:
                tensors = hook(tensors)
        tensors = self._expand(meta, tensors, folder)
        return prepared(folder, storage._prepare_load, meta, tensors, folder)


class StorageEnsembleCheckpointer(StorageCheckpointerBase):
    """Writes each storage of a :class:`StorageEnsemble` under ``path/<i>`` with that
    storage's own checkpointer; loading validates them all before any changes.

    Example:
        >>> import tempfile, torch
        >>> from steersman.data.replay_buffers import LazyTensorStorage, StorageEnsemble
        >>> a, b = LazyTensorStorage(4), LazyTensorStorage(4)
        >>> a.set(torch.arange(2), torch.ones(2)); b.set(torch.arange(1), torch.zeros(1))
        >>> with tempfile.TemporaryDirectory() as d:
        ...     StorageEnsemble(a, b).dumps(d)
        ...     c, e = LazyTensorStorage(4), LazyTensorStorage(4); StorageEnsemble(c, e).loads(d)
        >>> len(c), len(e)
        (2, 1)
    """

    def dumps(self, storage: Any, path: Any) -> None:
        from .ensemble import StorageEnsemble

        self._check_kind(storage, (StorageEnsemble,))
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        for i, st in enumerate(storage.storages):
            st.dumps(root / str(i))
        (root / "ensemble.json").write_text(json.dumps({"members": len(storage.storages)}))

    def prepare(self, storage: Any, path: Any) -> Any:
        from .ensemble import StorageEnsemble

        self._check_kind(storage, (StorageEnsemble,))
        root = Path(path)
        from ._checkpoint import read_json

        meta = read_json(root / "ensemble.json", root)
        if not isinstance(meta, dict) or meta.get("members") != len(storage.storages):
            raise CheckpointError(f"{root} does not hold {len(storage.storages)} storages", file=root,
                                  field="members")
        return [(st, _checkpointer_of(st).prepare(st, root / str(i))) for i, st in enumerate(storage.storages)]

    def loads(self, storage: Any, path: Any) -> None:
        for st, state in self.prepare(storage, path):
            st._commit_load(state)


def _checkpointer_of(storage: Any) -> StorageCheckpointerBase:
    """The storage's checkpointer, or its kind's default."""
    ck = getattr(storage, "_checkpointer", None)
    if ck is not None:
        return ck
    from .list_storages import CompressedListStorage
    from .storages import ListStorage

    if isinstance(storage, CompressedListStorage):
        return _DefaultCompressed()
    ck = ListStorageCheckpointer() if isinstance(storage, ListStorage) else TensorStorageCheckpointer()
    ck._anonymous = True
    return ck


class _DefaultCompressed(_PlainCheckpointer):
    """CompressedListStorage's historical default: the decompressed items in ListStorage's format."""

    _anonymous = True

    def __init__(self) -> None:
        super().__init__()
        from .list_storages import CompressedListStorage

        self._kinds = (CompressedListStorage,)
