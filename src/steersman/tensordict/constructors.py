"""Building a TensorDict from other structures, and back.

Every ``from_*`` takes the same batch-size keywords: ``batch_size`` (set and checked),
``auto_batch_size=True`` (the longest shape prefix shared by every leaf, at most
``batch_dims`` dims; ``batch_dims`` alone also turns it on), else a batch size ``[]``;
and ``device`` (every leaf moved there).

==========================  =============================================================
``from_dict``               a nested ``dict``
``from_namedtuple``         a (nested) namedtuple, fields as keys
``from_tuple``              a (nested) tuple, keys ``"0"``, ``"1"`` ...
``from_pytree``             dicts, lists, tuples and namedtuples; ``to_pytree`` rebuilds
                            the same structure (list/tuple nodes keep their type in a
                            ``"_pytree_type"`` entry, as in tensordict)
``from_struct_array``       a numpy structured array (``to_struct_array`` back)
``from_json``               a JSON array of records (``to_json``); never executes code
``from_csv``                a CSV file with a header row (stdlib ``csv``, numbers only
                            become tensors)
``from_h5``                 an HDF5 file, as a :class:`PersistentTensorDict`
``from_any``                any of the above, by type
``fromkeys``                the same value under every key
``make_tensordict``         a dict and/or keyword arguments
``merge_tensordicts``       the keys of several TensorDicts in one
==========================  =============================================================

``from_pandas`` and ``from_parquet`` need pandas/pyarrow, which steersman does not
depend on; they are left out (see docs/compat.md).

Example:
    >>> import collections, torch
    >>> from steersman.tensordict import from_namedtuple, from_pytree
    >>> Pt = collections.namedtuple("Pt", ["x", "y"])
    >>> from_namedtuple(Pt(torch.zeros(3), torch.ones(3, 2)), auto_batch_size=True).batch_size
    torch.Size([3])
    >>> tree = {"a": [torch.zeros(3), (torch.ones(3), torch.ones(3))], "b": torch.zeros(3, 2)}
    >>> td = from_pytree(tree, batch_size=[3])
    >>> type(td.to_pytree()["a"][1]).__name__
    'tuple'
"""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ._utils import NO_DEFAULT, NestedKey, unravel_key
from .base import TensorDictBase, _is_non_tensor, is_tensor_collection
from .td import TensorDict

__all__ = [
    "from_any", "from_dict", "from_namedtuple", "from_tuple", "from_pytree", "to_pytree",
    "from_struct_array", "to_struct_array", "from_json", "to_json", "from_csv", "from_h5",
    "fromkeys", "make_tensordict", "merge_tensordicts", "to_namedtuple",
]

PYTREE_TYPE_KEY = "_pytree_type"


def _finish(td: TensorDictBase, auto_batch_size: bool | None, batch_dims: int | None,
            device: Any, batch_size: Any) -> TensorDictBase:
    if batch_size is not None:
        td.batch_size = batch_size
    elif auto_batch_size or batch_dims is not None:
        td.auto_batch_size_(batch_dims)
    if device is not None:
        td = td.to(device)
    return td


def from_dict(d: Mapping, *, auto_batch_size: bool | None = None, batch_dims: int | None = None,
              device: Any = None, batch_size: Any = None, names: Any = None) -> TensorDict:
    """A TensorDict from a nested dict (auto batch size unless ``auto_batch_size=False``).

    Example:
        >>> import torch
        >>> from_dict({"a": torch.zeros(3, 2), "b": {"c": torch.zeros(3)}}).batch_size
        torch.Size([3])
        >>> from_dict({"a": torch.zeros(3, 2)}, auto_batch_size=False).batch_size
        torch.Size([])
    """
    if not isinstance(d, Mapping) and not is_tensor_collection(d):
        raise TypeError(f"from_dict expects a dict, got {type(d).__name__}")
    if is_tensor_collection(d):
        d = d.to_dict()
    if auto_batch_size is False and batch_size is None and batch_dims is None:
        batch_size = torch.Size(())
    return TensorDict.from_dict(d, batch_size=batch_size, device=device, batch_dims=batch_dims, names=names)


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields")


def _leaf(value: Any, key: Any) -> Any:
    if isinstance(value, Tensor) or is_tensor_collection(value):
        return value
    if isinstance(value, np.ndarray) and value.dtype != object:
        return torch.as_tensor(value)
    from .nontensor import to_entry

    return to_entry(value, torch.Size(()), None, key)


def from_namedtuple(named_tuple: Any, *, auto_batch_size: bool = False, batch_dims: int | None = None,
                    device: Any = None, batch_size: Any = None) -> TensorDict:
    """A TensorDict whose keys are the fields of ``named_tuple`` (nested namedtuples nest)."""
    if not _is_namedtuple(named_tuple):
        raise TypeError(f"from_namedtuple expects a namedtuple, got {type(named_tuple).__name__}")

    def convert(nt: Any) -> TensorDict:
        out = {}
        for k, v in zip(nt._fields, nt):
            out[k] = convert(v) if _is_namedtuple(v) else _leaf(v, k)
        return TensorDict._from_dict_nocheck(out)

    return _finish(convert(named_tuple), auto_batch_size, batch_dims, device, batch_size)


def to_namedtuple(td: TensorDictBase, dest_cls: type | None = None) -> Any:
    """The entries of ``td`` as a namedtuple (nested containers nest); ``dest_cls``: the
    class of the root (built from the keys by default)."""
    from collections import namedtuple

    def convert(node: Any, cls: Any) -> Any:
        keys = list(node._keys_str())
        values = []
        for k in keys:
            v = node._get_str(k, NO_DEFAULT)
            values.append(convert(v, None) if is_tensor_collection(v) and not _is_non_tensor(v) else
                          (v.tolist() if _is_non_tensor(v) and getattr(type(v), "_is_stack", False) else
                           getattr(v, "data", v)))
        cls = cls or namedtuple("GenericDict", keys)
        return cls(*values)

    return convert(td, dest_cls)


def from_tuple(obj: tuple, *, auto_batch_size: bool = False, batch_dims: int | None = None,
               device: Any = None, batch_size: Any = None) -> TensorDict:
    """A TensorDict with keys ``"0"``, ``"1"``... from a (nested) tuple."""
    if not isinstance(obj, tuple):
        raise TypeError(f"from_tuple expects a tuple, got {type(obj).__name__}")

    def convert(t: tuple) -> TensorDict:
        return TensorDict._from_dict_nocheck(
            {str(i): convert(v) if isinstance(v, tuple) else _leaf(v, str(i)) for i, v in enumerate(t)})

    return _finish(convert(obj), auto_batch_size, batch_dims, device, batch_size)


# ----------------------------------------------------------------------------- pytrees
def _tree_to_dict(node: Any, path: str) -> Any:
    from .nontensor import MetaData

    if isinstance(node, Mapping):
        out = {}
        for k, v in node.items():
            if not isinstance(k, str):
                raise TypeError(f"from_pytree: dict keys must be strings, got {k!r} at {path or '<root>'}")
            out[k] = _tree_to_dict(v, f"{path}/{k}")
        return out
    if isinstance(node, (list, tuple)):
        out = {str(i): _tree_to_dict(v, f"{path}/{i}") for i, v in enumerate(node)}
        out[PYTREE_TYPE_KEY] = MetaData(type(node))
        return out
    if node is None:
        raise TypeError(f"from_pytree: None leaf at {path or '<root>'} has no tensor form")
    return _leaf(node, path)


def from_pytree(pytree: Any, *, batch_size: Any = None, auto_batch_size: bool = False,
                batch_dims: int | None = None) -> TensorDict:
    """A TensorDict from dicts, lists, tuples and namedtuples of tensors (see the module doc)."""
    if isinstance(pytree, Tensor) or not isinstance(pytree, (Mapping, list, tuple)):
        raise TypeError(f"from_pytree expects a dict, list or tuple, got {type(pytree).__name__}")
    td = TensorDict._from_dict_nocheck(_tree_to_dict(pytree, ""))
    return _finish(td, auto_batch_size, batch_dims, None, batch_size)


def to_pytree(td: TensorDictBase) -> Any:
    """The structure :func:`from_pytree` read, rebuilt (dicts for plain containers)."""
    keys = list(td._keys_str())
    kind = td._get_str(PYTREE_TYPE_KEY, None)
    values = {}
    for k in keys:
        if k == PYTREE_TYPE_KEY:
            continue
        v = td._get_str(k, NO_DEFAULT)
        if is_tensor_collection(v) and not _is_non_tensor(v):
            values[k] = to_pytree(v)
        elif _is_non_tensor(v):
            values[k] = v.tolist() if getattr(type(v), "_is_stack", False) else v.data
        else:
            values[k] = v
    if kind is None:
        return values
    cls = kind.data
    items = [values[str(i)] for i in range(len(values))]
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return cls(*items)
    return cls(items)


# ----------------------------------------------------------------------------- numpy
def from_struct_array(struct_array: np.ndarray, *, auto_batch_size: bool = False,
                      batch_dims: int | None = None, device: Any = None, batch_size: Any = None) -> TensorDict:
    """A TensorDict from a numpy structured array: one key per field (nested dtypes nest);
    the batch size is the array's shape unless given. The data is copied."""
    if not isinstance(struct_array, np.ndarray) or struct_array.dtype.names is None:
        raise TypeError("from_struct_array expects a numpy structured array (a dtype with named fields)")

    def convert(arr: np.ndarray) -> TensorDict:
        out = {}
        for name in arr.dtype.names:
            col = arr[name]
            out[name] = convert(col) if col.dtype.names is not None else torch.from_numpy(
                np.ascontiguousarray(col).copy())
        return TensorDict._from_dict_nocheck(out)

    td = convert(struct_array)
    if batch_size is None and not auto_batch_size and batch_dims is None:
        batch_size = struct_array.shape
        td.batch_size = batch_size
        return td.to(device) if device is not None else td
    return _finish(td, auto_batch_size, batch_dims, device, batch_size)


def to_struct_array(td: TensorDictBase) -> np.ndarray:
    """The TensorDict as a numpy structured array shaped like its batch (copied)."""
    bd = td.batch_dims

    def dtype_of(node: Any, prefix: tuple) -> list:
        fields = []
        for k in node._keys_str():
            v = node._get_str(k, NO_DEFAULT)
            if isinstance(v, Tensor):
                fields.append((k, v.detach().cpu().numpy().dtype, tuple(v.shape[bd:])))
            elif is_tensor_collection(v) and not _is_non_tensor(v):
                fields.append((k, dtype_of(v, prefix + (k,))))
            else:
                raise TypeError(f"to_struct_array: the non-tensor entry {prefix + (k,)!r} has no numpy field type")
        return fields

    out = np.empty(tuple(td.batch_size), dtype=dtype_of(td, ()))

    def fill(node: Any, dst: np.ndarray) -> None:
        for k in node._keys_str():
            v = node._get_str(k, NO_DEFAULT)
            if isinstance(v, Tensor):
                dst[k] = v.detach().cpu().numpy()
            else:
                fill(v, dst[k])

    fill(td, out)
    return out


# ----------------------------------------------------------------------------- files
def _records(td: TensorDictBase, separator: str | None) -> list[dict]:
    if td.batch_dims != 1:
        raise ValueError(f"to_json writes one record per element of a 1-D batch; batch_size is {list(td.batch_size)}")
    cols: dict[str, Any] = {}
    for key in td.keys(include_nested=True, leaves_only=True):
        name = key if isinstance(key, str) else None
        if name is None:
            if separator is None:
                raise ValueError(f"to_json: the nested entry {key!r} needs a separator (e.g. separator='.')")
            name = separator.join(key)
        v = td.get(key)
        if isinstance(v, Tensor):
            cols[name] = v.detach().cpu().tolist()
        elif _is_non_tensor(v):
            cols[name] = v.tolist() if getattr(type(v), "_is_stack", False) else [v.data] * td.batch_size[0]
    n = td.batch_size[0]
    return [{k: c[i] for k, c in cols.items()} for i in range(n)]


def to_json(td: TensorDictBase, path: str | Path, *, separator: str | None = None, lines: bool = False,
            **kwargs: Any) -> None:
    """Writes ``td`` (1-D batch) as a JSON array of records, one per element.

    Nested entries need ``separator`` (their column is the joined key). ``lines=True``
    writes JSON Lines. ``kwargs`` go to :func:`json.dump` (``indent`` ...).
    """
    records = _records(td, separator)
    with open(path, "w") as f:
        if lines:
            for r in records:
                f.write(json.dumps(r, **kwargs) + "\n")
        else:
            json.dump(records, f, **kwargs)


def _from_columns(cols: dict[str, list], n: int, separator: str | None, dtype: Any, source: str) -> TensorDict:
    from .nontensor import NonTensorStack

    td = TensorDict({}, batch_size=[n])
    for name, values in cols.items():
        key: NestedKey = tuple(name.split(separator)) if separator and separator in name else name
        if all(isinstance(v, (bool, int, float)) or (isinstance(v, list)) for v in values) and values:
            try:
                t = torch.tensor(values)
            except (TypeError, ValueError):
                t = None
            if t is not None:
                if dtype is not None and t.is_floating_point():
                    t = t.to(dtype)
                td.set(key, t)
                continue
        td.set(key, NonTensorStack(np.array(values + [None], dtype=object)[:-1]))
    return td


def from_json(path: str | Path, *, auto_batch_size: bool = False, batch_dims: int | None = None,
              device: Any = None, batch_size: Any = None, separator: str | None = None,
              dtype: torch.dtype | None = None, lines: bool = False, **kwargs: Any) -> TensorDict:
    """Reads a JSON array of records (or JSON Lines with ``lines=True``) into a TensorDict
    of batch ``[n_records]``: numeric columns become tensors (floats cast to ``dtype`` when
    given), other columns a ``NonTensorStack``. With ``separator``, a column
    ``"obs.x"`` becomes the nested key ``("obs", "x")``. Only JSON is parsed.

    Raises:
        ValueError: the file is not an array of records; a record lacks a column (named).
    """
    text = Path(path).read_text()
    try:
        records = [json.loads(line) for line in text.splitlines() if line.strip()] if lines else json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"from_json: {path} is not valid JSON{' Lines' if lines else ''}: {err}") from None
    if isinstance(records, dict):
        records = [records]
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ValueError(f"from_json: {path} must hold an array of records (objects)")
    names = list(records[0]) if records else []
    for i, r in enumerate(records):
        if set(r) != set(names):
            missing = sorted(set(names) ^ set(r))
            raise ValueError(f"from_json: record {i} of {path} differs in the columns {missing}")
    cols = {k: [r[k] for r in records] for k in names}
    td = _from_columns(cols, len(records), separator, dtype, str(path))
    if batch_size is not None or auto_batch_size or batch_dims is not None:
        return _finish(td, auto_batch_size, batch_dims, device, batch_size)
    return td.to(device) if device is not None else td


def from_csv(path: str | Path, *, auto_batch_size: bool = False, batch_dims: int | None = None,
             device: Any = None, batch_size: Any = None, separator: str | None = None,
             dtype: torch.dtype | None = None, **kwargs: Any) -> TensorDict:
    """Reads a CSV file with a header row into a TensorDict of batch ``[n_rows]``.

    Columns whose values all parse as numbers become tensors (int64 when all are
    integers, else float32 or ``dtype``); others stay strings in a ``NonTensorStack``.
    ``separator`` splits column names into nested keys. ``kwargs`` go to
    :func:`csv.reader` (``delimiter`` ...).
    """
    with open(path, newline="") as f:
        rows = list(csv.reader(f, **kwargs))
    if not rows:
        raise ValueError(f"from_csv: {path} is empty (a header row is needed)")
    header, body = rows[0], rows[1:]
    for i, r in enumerate(body):
        if len(r) != len(header):
            raise ValueError(f"from_csv: row {i + 1} of {path} has {len(r)} fields, the header {len(header)}")
    cols: dict[str, list] = {}
    for j, name in enumerate(header):
        raw = [r[j] for r in body]
        cols[name] = _parse_numbers(raw)
    td = _from_columns(cols, len(body), separator, dtype if dtype is not None else torch.float32, str(path))
    if batch_size is not None or auto_batch_size or batch_dims is not None:
        return _finish(td, auto_batch_size, batch_dims, device, batch_size)
    return td.to(device) if device is not None else td


def _parse_numbers(raw: list[str]) -> list:
    try:
        return [int(v) for v in raw]
    except ValueError:
        pass
    try:
        return [float(v) for v in raw]
    except ValueError:
        return raw


def from_h5(h5_file: Any, *, mode: str = "r", auto_batch_size: bool = False, batch_dims: int | None = None,
            batch_size: Any = None, non_tensor_as_stack: bool = False) -> TensorDictBase:
    """Opens an HDF5 file (path or open ``h5py`` file) as a :class:`PersistentTensorDict`.

    Without ``batch_size`` the batch size is the stored one, else the leading dims all
    entries share (``auto_batch_size`` is that behaviour); ``batch_dims`` keeps at most
    that many. ``non_tensor_as_stack`` is accepted for tensordict's signature:
    non-tensor entries are read as they were stored.
    """
    from .persistent import PersistentTensorDict

    kwargs: dict[str, Any] = {}
    if batch_size is not None:
        kwargs["batch_size"] = batch_size
    td = PersistentTensorDict.from_h5(h5_file, mode=mode, **kwargs)
    if batch_size is None and batch_dims is not None:  # the opened file's batch dims, cut
        td.batch_size = td.batch_size[:batch_dims]
    return td


# ----------------------------------------------------------------------------- others
def from_any(obj: Any, *, auto_batch_size: bool = False, batch_dims: int | None = None,
             device: Any = None, batch_size: Any = None) -> TensorDictBase:
    """A TensorDict from whatever ``obj`` is: a container (returned as is), a dict, a
    namedtuple, a tuple, a list (as a pytree), a dataclass instance, a numpy structured
    array, or an open ``h5py`` file/group.

    Raises:
        TypeError: for any other type (named).
    """
    kw = dict(auto_batch_size=auto_batch_size, batch_dims=batch_dims, device=device, batch_size=batch_size)
    if is_tensor_collection(obj):
        return _finish(obj, auto_batch_size, batch_dims, device, batch_size)
    if isinstance(obj, Mapping):
        return from_dict(obj, **kw)
    if _is_namedtuple(obj):
        return from_namedtuple(obj, **kw)
    if isinstance(obj, tuple):
        return from_tuple(obj, **kw)
    if isinstance(obj, list):
        return _finish(from_pytree(obj), auto_batch_size, batch_dims, device, batch_size)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = TensorDict._from_dict_nocheck({f.name: _leaf(getattr(obj, f.name), f.name)
                                             for f in dataclasses.fields(obj)})
        return _finish(out, auto_batch_size, batch_dims, device, batch_size)
    if isinstance(obj, np.ndarray) and obj.dtype.names is not None:
        return from_struct_array(obj, **kw)
    if type(obj).__module__.startswith("h5py"):
        return from_h5(obj, auto_batch_size=auto_batch_size, batch_dims=batch_dims, batch_size=batch_size)
    raise TypeError(
        f"from_any: cannot build a TensorDict from a {type(obj).__name__} (expected a dict, namedtuple, "
        "tuple, list, dataclass instance, numpy structured array, h5py file or TensorDict)"
    )


def fromkeys(keys: Sequence[NestedKey], value: Any = 0) -> TensorDict:
    """A TensorDict (batch ``[]``) with ``value`` (as a tensor) under every key.

    Example:
        >>> fromkeys(["a", ("b", "c")], 1)["b", "c"]
        tensor(1)
    """
    td = TensorDict({}, batch_size=[])
    for k in keys:
        td.set(unravel_key(k), value.clone() if isinstance(value, Tensor) else torch.as_tensor(value))
    return td


def make_tensordict(input_dict: Mapping | None = None, batch_size: Any = None, device: Any = None,
                    auto_batch_size: bool | None = None, **kwargs: Any) -> TensorDict:
    """A TensorDict from ``input_dict`` and/or keyword entries (batch ``[]`` unless
    ``batch_size`` is given or ``auto_batch_size=True``).

    Example:
        >>> import torch
        >>> make_tensordict(a=torch.zeros(3, 2), b=torch.zeros(3), auto_batch_size=True).batch_size
        torch.Size([3])
    """
    d = dict(input_dict or {})
    clash = sorted(set(d) & set(kwargs))
    if clash:
        raise ValueError(f"make_tensordict: {clash} given both in input_dict and as keywords")
    d.update(kwargs)
    if batch_size is None and not auto_batch_size:
        batch_size = torch.Size(())
    return TensorDict.from_dict(d, batch_size=batch_size, device=device)


def merge_tensordicts(*tensordicts: TensorDictBase,
                      callback_exist: Callable | Mapping[NestedKey, Callable] | None = None) -> TensorDictBase:
    """A new TensorDict with the keys of all inputs (batch size of the first; values not copied).

    For a key several inputs hold, the first input's value is kept, unless
    ``callback_exist`` (a function, or a dict of functions per key) combines the values
    of a leaf that every input holds: ``callback_exist(*values)``.

    Raises:
        RuntimeError: fewer than two inputs.
    """
    if len(tensordicts) < 2:
        raise RuntimeError(f"merge_tensordicts needs at least two TensorDicts, got {len(tensordicts)}")
    first = tensordicts[0]
    bd = first.batch_dims
    out = first.copy()
    callbacks = {unravel_key(k): v for k, v in callback_exist.items()} if isinstance(callback_exist, Mapping) else None
    seen = set(first.keys(include_nested=True, leaves_only=True))
    for other in tensordicts[1:]:
        if other.batch_size[:bd] != first.batch_size:
            raise ValueError(f"merge_tensordicts: batch size {list(other.batch_size)} does not start with "
                             f"the first's {list(first.batch_size)}")
        for key in other.keys(include_nested=True, leaves_only=True):
            if key not in seen:
                out.set(key, other.get(key))
                seen.add(key)
    if callback_exist is not None:
        for key in first.keys(include_nested=True, leaves_only=True):
            fn = callbacks.get(key) if callbacks is not None else callback_exist
            if fn is None:
                continue
            vals = [td.get(key, None) for td in tensordicts]
            if all(isinstance(v, Tensor) for v in vals):
                out.set(key, fn(*vals))
    return out


# ----------------------------------------------------------------------------- as methods
def _as_classmethod(fn: Callable) -> classmethod:
    def method(cls: type, *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    method.__name__, method.__qualname__, method.__doc__ = fn.__name__, f"TensorDict.{fn.__name__}", fn.__doc__
    return classmethod(method)


# TensorDict.from_any(...) etc. are the functions above; td.to_pytree() etc. likewise
for _fn in (from_any, from_namedtuple, from_tuple, from_pytree, from_struct_array, from_json, from_csv,
            from_h5, fromkeys):
    setattr(TensorDict, _fn.__name__, _as_classmethod(_fn))
for _fn in (to_pytree, to_struct_array, to_json, to_namedtuple):
    setattr(TensorDictBase, _fn.__name__, _fn)
