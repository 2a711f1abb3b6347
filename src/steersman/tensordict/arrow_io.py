"""Tables in and out: ``from_arrow``/``to_arrow`` (pyarrow), ``from_pandas``,
``from_parquet``. One row per batch element, one column per entry.

pyarrow (and pandas for ``from_pandas``) are optional: they are imported when called.
Columns convert as: numbers and booleans → tensors ``[N]`` (numbers viewed without a
copy when they have no nulls and ``copy`` is not ``True``); fixed-size lists → tensors
``[N, *shape]`` (the shape kept in the field metadata by :func:`to_arrow`); structs →
nested TensorDicts; anything else (strings, ...) → a non-tensor stack of Python values.
"""

from __future__ import annotations

import json
import warnings
from typing import Any, Literal

import numpy as np
import torch

from ._utils import NestedKey
from .base import TensorDictBase, is_tensor_collection
from .nontensor import NonTensorStack, is_non_tensor
from .td import TensorDict

__all__ = ["from_arrow", "to_arrow", "from_pandas", "from_parquet"]

_SHAPE = b"steersman.shape"


def _pa() -> Any:
    try:
        import pyarrow
    except ImportError as err:
        raise ImportError("Arrow/Parquet conversion needs the 'pyarrow' package: pip install pyarrow") from err
    return pyarrow


def _to_array(pa: Any, key: str, value: Any, n: int) -> tuple[Any, dict | None]:
    if is_non_tensor(value):
        data = value.tolist() if isinstance(value, NonTensorStack) else [value.data] * n
        return pa.array(data), None
    if is_tensor_collection(value):
        children = [(k, *_to_array(pa, k, v, n)) for k, v in value.items()]
        fields = [pa.field(k, a.type, metadata=m) for k, a, m in children]
        return pa.StructArray.from_arrays([a for _, a, _ in children], fields=fields), None
    t = value.detach().cpu()
    if t.dim() == 1:
        return pa.array(t.numpy()), None
    inner = t.reshape(n, -1)
    arr = pa.FixedSizeListArray.from_arrays(pa.array(inner.reshape(-1).numpy()), inner.shape[1])
    return arr, {_SHAPE: json.dumps(list(t.shape[1:])).encode()}


def to_arrow(td: TensorDictBase) -> Any:
    """A ``pyarrow.Table`` with one row per element of ``td`` (which must have one batch
    dim): tensors ``[N]`` → columns, ``[N, *shape]`` → fixed-size lists (shape in the
    field metadata), nested TensorDicts → struct columns, non-tensors → value columns.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict, from_arrow, to_arrow
        >>> td = TensorDict(obs=torch.arange(6.).reshape(3, 2), r=torch.ones(3), batch_size=[3])
        >>> table = to_arrow(td)
        >>> table.num_rows, table.column_names
        (3, ['obs', 'r'])
        >>> from_arrow(table)["obs"].shape
        torch.Size([3, 2])
    """
    pa = _pa()
    if td.batch_dims != 1:
        raise ValueError(f"to_arrow: the TensorDict needs exactly one batch dim (rows), got batch_size "
                         f"{list(td.batch_size)}")
    n = td.batch_size[0]
    cols = [(k, *_to_array(pa, k, v, n)) for k, v in td.items()]
    schema = pa.schema([pa.field(k, a.type, metadata=m) for k, a, m in cols])
    return pa.Table.from_arrays([a for _, a, _ in cols], schema=schema)


def _tensor(col: Any, copy: bool | None) -> torch.Tensor:
    """A numeric Arrow array as a tensor: a DLPack view unless ``copy`` (or Arrow cannot)."""
    if not copy:
        try:
            with warnings.catch_warnings():  # pyarrow's unversioned capsule (its deprecation, not ours)
                warnings.simplefilter("ignore", DeprecationWarning)
                return torch.from_dlpack(col)
        except Exception:  # booleans (bit-packed), offsets, old pyarrow: copy
            pass
    return torch.from_numpy(np.array(col.to_numpy(zero_copy_only=False), copy=True))


def _column(pa: Any, name: Any, col: Any, field: Any, copy: bool | None, nulls: str,
            masks: dict) -> Any:
    import pyarrow.types as pt
    if hasattr(col, "num_chunks"):  # a ChunkedArray: one chunk is used as is (no copy)
        col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    typ = col.type
    if pt.is_struct(typ):
        n = len(col)
        out = TensorDict(batch_size=[n])
        for i in range(typ.num_fields):
            f = typ.field(i)
            out.set(f.name, _column(pa, (*name, f.name), col.field(i), f, copy, nulls, masks))
        return out
    numeric = pt.is_integer(typ) or pt.is_floating(typ) or pt.is_boolean(typ)
    if pt.is_fixed_size_list(typ) and (pt.is_integer(typ.value_type) or pt.is_floating(typ.value_type)):
        if col.null_count:
            raise ValueError(f"from_arrow: column {'.'.join(name)!r} has {col.null_count} null rows; "
                             "fixed-size list columns must be complete")
        values = _tensor(col.flatten(), copy)
        meta = (field.metadata or {}).get(_SHAPE) if field is not None else None
        shape = json.loads(meta) if meta else [typ.list_size]
        return values.reshape(len(col), *shape)
    if numeric:
        valid = None
        if col.null_count:
            if nulls == "raise":
                raise ValueError(f"from_arrow: column {'.'.join(name)!r} has {col.null_count} nulls; pass "
                                 "nulls='fill' (zeros) or nulls='mask' (and mask_key)")
            valid = torch.from_numpy(col.is_valid().to_numpy(zero_copy_only=False))
            col = col.fill_null(False if pt.is_boolean(typ) else 0)
            if nulls == "mask":
                masks[name] = valid
        return _tensor(col, copy)
    return NonTensorStack.from_list(col.to_pylist())


def from_arrow(table: Any, *, copy: bool | None = None, nulls: Literal["raise", "fill", "mask"] = "raise",
               mask_key: NestedKey | None = None, device: Any = None) -> TensorDict:
    """A TensorDict ``[num_rows]`` from a ``pyarrow.Table`` (or RecordBatch), one entry per
    column (see the module docs for the conversions; the reverse of :func:`to_arrow`).

    Keyword Args:
        copy: ``True``: always copy; default: view numeric columns when Arrow allows it.
        nulls: numeric columns with nulls: ``"raise"`` (default, naming the column),
            ``"fill"`` (zeros/False), or ``"mask"`` (zeros, plus a boolean validity
            tensor per such column under ``mask_key``).
        mask_key: where the validity masks go with ``nulls="mask"`` (required then).
        device: where the tensors go.
    """
    pa = _pa()
    if nulls not in ("raise", "fill", "mask"):
        raise ValueError(f"from_arrow: nulls must be 'raise', 'fill' or 'mask', got {nulls!r}")
    if nulls == "mask" and mask_key is None:
        raise ValueError("from_arrow: nulls='mask' needs mask_key (where the validity masks go)")
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    if not isinstance(table, pa.Table):
        raise TypeError(f"from_arrow: expected a pyarrow Table or RecordBatch, got {type(table).__name__}")
    masks: dict = {}
    out = TensorDict(batch_size=[table.num_rows])
    for field, col in zip(table.schema, table.columns):
        out.set(field.name, _column(pa, (field.name,), col, field, copy, nulls, masks))
    if masks:
        m = TensorDict(batch_size=[table.num_rows])
        for name, valid in masks.items():
            m.set(name, valid)
        out.set(mask_key, m)
    return out if device is None else out.to(device)


def _finish(td: TensorDict, *, batch_size: Any, auto_batch_size: bool, batch_dims: int | None,
            separator: str | None, dtype: torch.dtype | None, device: Any) -> TensorDict:
    if separator is not None:
        nested = TensorDict(batch_size=td.batch_size)
        for k, v in td.items():
            nested.set(tuple(k.split(separator)), v)
        td = nested
    if dtype is not None:
        td = td.apply(lambda t: t.to(dtype) if t.is_floating_point() else t)
    if batch_size is not None:
        td.batch_size = torch.Size(batch_size)
    elif auto_batch_size or batch_dims is not None:
        td.auto_batch_size_(batch_dims=batch_dims)
    return td if device is None else td.to(device)


def from_pandas(dataframe: Any, *, auto_batch_size: bool = False, batch_dims: int | None = None,
                device: Any = None, batch_size: Any = None, separator: str | None = None,
                dtype: torch.dtype | None = None) -> TensorDict:
    """A TensorDict ``[len(dataframe)]`` with one entry per column (the index is dropped;
    columns convert as in :func:`from_arrow`, nulls refused).

    Keyword Args:
        separator: split column names into nested keys (``"obs.x"`` → ``("obs", "x")``).
        dtype: cast the floating-point entries.
        batch_size, auto_batch_size, batch_dims: override the ``[rows]`` batch size.
        device: where the tensors go.

    Example:
        >>> import pandas as pd
        >>> df = pd.DataFrame({"obs.x": [0.0, 1.0], "obs.y": [2.0, 3.0], "name": ["a", "b"]})
        >>> td = from_pandas(df, separator=".")
        >>> td["obs", "y"].tolist(), td[1]["name"]
        ([2.0, 3.0], 'b')
    """
    pa = _pa()
    table = pa.Table.from_pandas(dataframe, preserve_index=False)
    return _finish(from_arrow(table, copy=True), batch_size=batch_size, auto_batch_size=auto_batch_size,
                   batch_dims=batch_dims, separator=separator, dtype=dtype, device=device)


def from_parquet(path: Any, *, auto_batch_size: bool = False, batch_dims: int | None = None,
                 device: Any = None, batch_size: Any = None, separator: str | None = None,
                 dtype: torch.dtype | None = None, columns: list[str] | None = None,
                 **kwargs: Any) -> TensorDict:
    """Reads a Parquet file (``pyarrow.parquet.read_table(path, columns=columns, **kwargs)``)
    into a TensorDict as :func:`from_pandas` does (same keyword arguments)."""
    _pa()
    import pyarrow.parquet as pq
    table = pq.read_table(str(path), columns=columns, **kwargs)
    return _finish(from_arrow(table, copy=True), batch_size=batch_size, auto_batch_size=auto_batch_size,
                   batch_dims=batch_dims, separator=separator, dtype=dtype, device=device)
