"""How TensorDicts cross Ray: as a flat list of NumPy arrays plus their layout.

Pickling a TensorDict walks its Python structure and pickles every tensor in-band (about
8 ms each way for a 256-transition sample on a busy 2-core machine, ten times the cost of
drawing it). Packed, the structure is a few tuples and the data travels as NumPy arrays,
which Ray serialises out of band (one copy; zero on the reading side for large ones).
Anything else (another TensorDict class, tensors on an accelerator, non-tensor entries,
dtypes NumPy lacks) is sent as it is.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from steersman.tensordict import TensorDict

__all__ = ["pack", "unpack"]

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
