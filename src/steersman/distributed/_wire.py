"""How TensorDicts cross Ray: as a flat list of NumPy arrays plus their layout, or (a
collector's batches, whose layout is the same every time) as one byte buffer.

Pickling a TensorDict walks its Python structure and pickles every tensor in-band (about
8 ms each way for a 256-transition sample on a busy 2-core machine, ten times the cost of
drawing it). Packed, the structure is a few tuples and the data travels as NumPy arrays,
which Ray serialises out of band (one copy; zero on the reading side for large ones).
Anything else (another TensorDict class, tensors on an accelerator, non-tensor entries,
dtypes NumPy lacks) is sent as it is.

A collector actor sends each batch as ONE contiguous NumPy byte buffer (:func:`pack_flat`:
every tensor at a 64-byte aligned offset), and the :class:`FlatLayout` that says where each
tensor lies only when the driver does not hold it yet: Ray serialises one buffer and a few
integers per reply instead of a nested structure of arrays. The driver copies the actors'
buffers straight into one freshly allocated batch (:func:`unpack_flat`, ``stack=True``:
``[n_actors, *batch]``, each tensor contiguous), so there is no per-actor TensorDict and no
``torch.stack``.
"""

from __future__ import annotations

import warnings
import zlib
from typing import Any

import numpy as np
import torch

from steersman.tensordict import TensorDict

__all__ = ["pack", "unpack", "FlatLayout", "flat_layout", "pack_flat", "unpack_flat"]

_TAG = "steersman-packed-td"


class _AsIs(Exception):
    """This TensorDict holds something the packed form does not carry."""


def _walk(td: TensorDict, prefix: tuple, out: list) -> None:
    for key, value in td.items():
        path = (*prefix, key)
        if type(value) is TensorDict:
            out.append((path, tuple(value.batch_size), None if value.device is None else str(value.device)))
            _walk(value, path, out)
        elif type(value) is torch.Tensor and value.device.type == "cpu" and value.dtype != torch.bfloat16 \
                and not value.is_sparse and not value.is_quantized and not value.is_complex():
            out.append((path, value.detach().numpy()))
        else:
            raise _AsIs


def pack(obj: Any) -> Any:
    """``obj`` in the packed form if it is a plain CPU ``TensorDict`` of tensors; else ``obj``."""
    if type(obj) is not TensorDict:
        return obj
    entries: list = []
    try:
        _walk(obj, (), entries)
    except _AsIs:
        return obj
    return (_TAG, tuple(obj.batch_size), None if obj.device is None else str(obj.device), entries)


def unpack(obj: Any, copy: bool = True) -> Any:
    """The TensorDict of a :func:`pack` result (other objects as they are). ``copy=False``:
    its tensors may be read-only views of the message (for a reader that only copies them
    out, e.g. a storage's ``extend``)."""
    if not (type(obj) is tuple and len(obj) == 4 and obj[0] == _TAG):
        return obj
    _, batch_size, device, entries = obj
    td = TensorDict({}, batch_size, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "non-writable array" with copy=False: only read
        for entry in entries:
            if len(entry) == 3:  # a nested TensorDict (its own batch size), set before its entries
                td.set(entry[0], TensorDict({}, entry[1], device=entry[2]))
            else:
                array = entry[1]
                if copy and not array.flags.writeable:
                    array = np.array(array)
                td.set(entry[0], torch.from_numpy(array))
    return td


_ALIGN = 64  # byte offset of every tensor in a flat buffer: any dtype can view its slice


def _flat_entries(td: TensorDict, prefix: tuple, out: list) -> None:
    """``(path, batch_size, device)`` for a nested TensorDict (before its entries) and
    ``(path, tensor)`` for a leaf, in the TensorDict's order; _AsIs for anything else."""
    for key, value in td.items():
        path = (*prefix, key)
        if type(value) is TensorDict and value.names_or_none() is None:
            out.append((path, tuple(value.batch_size), None if value.device is None else str(value.device)))
            _flat_entries(value, path, out)
        elif type(value) is torch.Tensor and value.device.type == "cpu" and value.layout == torch.strided \
                and not value.is_quantized:
            out.append((path, value))
        else:
            raise _AsIs


class FlatLayout:
    """Where every tensor of a TensorDict lies in one byte buffer (:func:`flat_layout`).

    ``entries``: in the TensorDict's order, ``(path, batch_size, device)`` for a nested
    TensorDict and ``(path, dtype, shape, offset, nbytes)`` for a tensor; ``nbytes``: the
    buffer's size; ``id``: a checksum of all this, equal in every process (a reader keeps
    the layout of an id and is sent the layout only when the id changes).
    """

    __slots__ = ("batch_size", "device", "entries", "nbytes", "id", "counts")

    def __init__(self, batch_size: tuple, device: str | None, entries: tuple, nbytes: int) -> None:
        self.batch_size, self.device, self.entries, self.nbytes = batch_size, device, entries, nbytes
        self.id = zlib.crc32(repr((batch_size, device, entries, nbytes)).encode())
        counts: dict[tuple, int] = {(): 0}  # entries directly under each TensorDict of the layout
        for entry in entries:
            counts[entry[0][:-1]] += 1
            if len(entry) == 3:
                counts[entry[0]] = 0
        self.counts = counts

    def __reduce__(self) -> tuple:
        return FlatLayout, (self.batch_size, self.device, self.entries, self.nbytes)

    def __repr__(self) -> str:
        return f"FlatLayout(batch_size={self.batch_size}, entries={len(self.entries)}, nbytes={self.nbytes})"


def flat_layout(td: Any) -> FlatLayout | None:
    """The :class:`FlatLayout` of a plain CPU ``TensorDict`` of tensors (no names); None for
    anything else (then send it with :func:`pack`)."""
    if type(td) is not TensorDict or td.names_or_none() is not None:
        return None
    found: list = []
    try:
        _flat_entries(td, (), found)
    except _AsIs:
        return None
    entries, offset = [], 0
    for entry in found:
        if len(entry) == 3:
            entries.append(entry)
        else:
            path, t = entry
            nbytes = t.numel() * t.element_size()
            entries.append((path, t.dtype, tuple(t.shape), offset, nbytes))
            offset += -(-nbytes // _ALIGN) * _ALIGN
    return FlatLayout(tuple(td.batch_size), None if td.device is None else str(td.device), tuple(entries), offset)


def _as_bytes(t: torch.Tensor) -> np.ndarray:
    """The bytes of a CPU tensor as a flat NumPy array (a view where it is contiguous)."""
    if _NP_DTYPES.get(t.dtype, 0) is None or t.dtype in _NO_NUMPY:
        return t.detach().reshape(-1).view(torch.uint8).numpy()
    try:
        return (t.detach() if t.requires_grad else t).numpy().reshape(-1).view(np.uint8)
    except TypeError:  # a dtype NumPy lacks
        _NP_DTYPES[t.dtype] = None
        return t.detach().reshape(-1).view(torch.uint8).numpy()


_NO_NUMPY = (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2) if hasattr(torch, "float8_e4m3fn") \
    else (torch.bfloat16,)


def pack_flat(td: TensorDict, layout: FlatLayout, out: np.ndarray) -> bool:
    """Copies the tensors of ``td`` into ``out`` (``layout.nbytes`` bytes) where ``layout``
    puts them; False (``out`` partly written) if ``td`` does not have that layout (another
    key, dtype, shape or batch size; the check costs a lookup per entry)."""
    if type(td) is not TensorDict or tuple(td.batch_size) != layout.batch_size \
            or len(td.keys()) != layout.counts[()]:
        return False
    for spec in layout.entries:
        value = td.get(spec[0], None)
        if len(spec) == 3:
            if type(value) is not TensorDict or tuple(value.batch_size) != spec[1] \
                    or len(value.keys()) != layout.counts[spec[0]] or value.names_or_none() is not None:
                return False
            continue
        if type(value) is not torch.Tensor or value.dtype != spec[1] or tuple(value.shape) != spec[2] \
                or value.device.type != "cpu" or value.layout != torch.strided:
            return False
        off, nbytes = spec[3], spec[4]
        if nbytes:
            out[off:off + nbytes] = _as_bytes(value)
    return True


def _np_dtype(dtype: torch.dtype) -> np.dtype | None:
    """NumPy's dtype for ``dtype``; None where NumPy has none (bfloat16...)."""
    if dtype in _NO_NUMPY:
        return None
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except TypeError:
        return None


def unpack_flat(layout: FlatLayout, buffers: list, stack: bool = False) -> TensorDict:
    """The TensorDict of one flat buffer (``stack=False``), or of several buffers of the same
    layout stacked along a new leading dim (``stack=True``: ``[len(buffers), *batch]``, as
    ``torch.stack`` of their TensorDicts would give). The tensors are writable, contiguous
    and the TensorDict's own (copied out of ``buffers``, which may be read-only)."""
    n = len(buffers)
    if not stack and n != 1:
        raise ValueError(f"unpack_flat: stack=False takes one buffer, got {n}")
    srcs = [np.frombuffer(b, dtype=np.uint8) for b in buffers]
    for src in srcs:
        if src.size != layout.nbytes:
            raise ValueError(f"unpack_flat: a buffer of {src.size} bytes for a layout of {layout.nbytes}")
    lead = (n,) if stack else ()
    out = np.empty(n * layout.nbytes, dtype=np.uint8)  # tensor by tensor: [n, *shape] blocks
    dtypes = _NP_DTYPES
    root: dict = {}
    dicts: dict[tuple, dict] = {(): root}
    for spec in layout.entries:
        path = spec[0]
        parent = dicts[path[:-1]]
        if len(spec) == 3:
            entries: dict = {}
            dicts[path] = entries
            parent[path[-1]] = TensorDict.from_trusted(
                entries, torch.Size(lead + spec[1]), None if spec[2] is None else torch.device(spec[2]))
            continue
        _, dtype, shape, off, nbytes = spec
        start = n * off
        for src in srcs:
            out[start:start + nbytes] = src[off:off + nbytes]
            start += nbytes
        block = out[n * off:n * (off + nbytes)]
        np_dtype = dtypes.get(dtype)
        if np_dtype is None:
            np_dtype = dtypes[dtype] = _np_dtype(dtype)
        if not nbytes:
            parent[path[-1]] = torch.empty(lead + shape, dtype=dtype)
        elif np_dtype is not None:
            parent[path[-1]] = torch.from_numpy(block.view(np_dtype).reshape(lead + shape))
        else:
            parent[path[-1]] = torch.from_numpy(block).view(dtype).view(lead + shape)
    device = None if layout.device is None else torch.device(layout.device)
    return TensorDict.from_trusted(root, torch.Size(lead + layout.batch_size), device)


_NP_DTYPES: dict = {}
