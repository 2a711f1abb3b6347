"""Small helpers shared by the container classes: keys, batch shapes, indices.

Nothing here knows about a concrete TensorDict class, so every container file
can import it without cycles.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from typing import Any, Union

import numpy as np
import torch
from torch import Tensor

NestedKey = Union[str, tuple[str, ...]]  # noqa: UP007 (a runtime alias, py3.10-safe)

__all__ = [
    "NestedKey",
    "unravel_key",
    "unravel_key_list",
    "as_size",
    "missing_key_error",
    "normalize_index",
    "indexed_batch_size",
    "expand_right",
    "broadcast_shapes",
    "NO_DEFAULT",
]


class NO_DEFAULT:
    """Sentinel: no default was passed (``None`` is a valid default).

    A class rather than an instance so that ``torch.compile`` can trace through
    functions that use it as a default argument.
    """





def unravel_key(key: Any) -> NestedKey:
    """Flattens a nested key into a string or a flat tuple of strings.

    >>> unravel_key(("a", ("b", "c")))
    ('a', 'b', 'c')
    >>> unravel_key(("a",))
    'a'
    """
    if type(key) is str:
        return key
    if isinstance(key, tuple):
        out: list[str] = []
        for k in key:
            sub = unravel_key(k)
            if type(sub) is str:
                out.append(sub)
            else:
                out.extend(sub)
        if not out:
            raise KeyError("an empty tuple is not a valid key")
        return out[0] if len(out) == 1 else tuple(out)
    raise TypeError(
        f"keys must be strings or tuples of strings, got {key!r} of type {type(key).__name__}"
    )


def unravel_key_list(keys: Iterable[Any]) -> list[NestedKey]:
    """Unravels every key of a list (see :func:`unravel_key`)."""
    return [unravel_key(k) for k in keys]


def write_into_out(name: str, out: Any, result: Any) -> Any:
    """``result`` itself, or written into ``out`` in place (an ``out=`` keyword): a batch-size
    mismatch raises a ``ValueError`` naming ``name`` before anything is written."""
    if out is None:
        return result
    if out.batch_size != result.batch_size:
        raise ValueError(f"{name}: out has batch_size {list(out.batch_size)}, the result has "
                         f"{list(result.batch_size)}")
    out.update_(result)
    return out


def as_size(batch_size: Any) -> torch.Size:
    """Turns ``None``, an int, a list/tuple or a ``torch.Size`` into a ``torch.Size``."""
    if batch_size is None:
        return torch.Size(())
    if type(batch_size) is torch.Size:
        return batch_size
    if isinstance(batch_size, (int, np.integer)):
        return torch.Size((int(batch_size),))
    if isinstance(batch_size, Tensor):
        return torch.Size(batch_size.tolist())
    try:
        size = torch.Size([int(d) for d in batch_size])
    except (TypeError, ValueError) as err:
        raise TypeError(f"batch_size must be a sequence of ints, got {batch_size!r}") from err
    if any(d < 0 for d in size):
        raise ValueError(f"batch_size must be non-negative, got {list(size)}")
    return size


def missing_key_error(key: NestedKey, existing: Iterable[str], part: str | None = None) -> KeyError:
    """A KeyError that names the missing key and the closest existing keys.

    ``part``: the element of a nested key that is missing (default: its last one).
    """
    existing = [str(k) for k in existing]
    leaf = part if part is not None else key if type(key) is str else key[-1]
    close = difflib.get_close_matches(str(leaf), existing, n=3, cutoff=0.5)
    msg = f"key {key!r} not found."
    if close:
        msg += f" Did you mean {', '.join(repr(c) for c in close)}?"
    msg += f" Existing keys: {sorted(existing)}"
    return KeyError(msg)


def _index_ndim(item: Any) -> int:
    """How many batch dims one index element consumes."""
    if item is None:
        return 0
    if isinstance(item, Tensor) and item.dtype is torch.bool:
        return item.ndim
    return 1


def _convert_index_item(item: Any) -> Any:
    if isinstance(item, (list, np.ndarray)):
        item = torch.as_tensor(np.asarray(item) if isinstance(item, list) else item)
        if item.dtype not in (torch.bool,) and item.is_floating_point():
            raise IndexError(f"tensors used as indices must be long or bool, got {item.dtype}")
    elif isinstance(item, range):
        item = torch.arange(item.start, item.stop, item.step)
    elif isinstance(item, np.integer):
        item = int(item)
    elif isinstance(item, np.bool_):
        item = torch.tensor(bool(item))
    return item


def normalize_index(index: Any, batch_dims: int) -> Any:
    """Makes an index safe to apply to leaves that have feature dims after the batch dims.

    Lists and arrays become tensors, and ``Ellipsis`` is expanded into explicit
    slices so that it never reaches a leaf's feature dims. Raises ``IndexError`` if
    the index addresses more dims than the batch has.
    """
    items = index if type(index) is tuple else (index,)
    items = tuple(_convert_index_item(i) for i in items)
    used = 0
    n_ellipsis = 0
    for it in items:
        if it is Ellipsis:
            n_ellipsis += 1
        elif isinstance(it, (int, slice, Tensor)) or it is None:
            used += _index_ndim(it)
        else:
            raise TypeError(
                f"invalid index {it!r} of type {type(it).__name__}: use int, slice, None, "
                "Ellipsis, a list, a long tensor or a bool mask (or a string key)"
            )
    if n_ellipsis > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if used > batch_dims:
        raise IndexError(
            f"too many indices for the batch: the index addresses {used} dims but the "
            f"batch has {batch_dims} (index {index!r})"
        )
    if n_ellipsis:
        pos = next(i for i, it in enumerate(items) if it is Ellipsis)
        fill = (slice(None),) * (batch_dims - used)
        items = items[:pos] + fill + items[pos + 1 :]
    return items[0] if len(items) == 1 else items


def indexed_batch_size(batch_size: torch.Size, index: Any) -> torch.Size:
    """The batch size that results from indexing a batch of ``batch_size`` with ``index``."""
    if type(index) is int:
        if not -batch_size[0] <= index < batch_size[0]:
            raise IndexError(
                f"index {index} is out of range for batch dim 0 of size {batch_size[0]}"
            )
        return batch_size[1:]
    if type(index) is slice:
        return torch.Size((len(range(*index.indices(batch_size[0]))),)) + batch_size[1:]
    dummy = torch.zeros((), dtype=torch.uint8).expand(batch_size)
    if isinstance(index, Tensor) and index.device.type != "cpu":
        index = index.cpu()
    elif type(index) is tuple:
        index = tuple(
            i.cpu() if isinstance(i, Tensor) and i.device.type != "cpu" else i for i in index
        )
    return dummy[index].shape


def broadcast_shapes(*shapes: Sequence[int]) -> torch.Size:
    """``torch.broadcast_shapes`` in plain Python (raises RuntimeError on a mismatch).

    torch's version imports its symbolic-shape machinery (sympy) on first use, which
    costs seconds in every fresh process; spec and distribution constructors call this.
    """
    if torch.compiler.is_compiling():  # traced: torch's version is the one dynamo knows
        return torch.broadcast_shapes(*shapes)
    ndim = max([len(s) for s in shapes] or [0])
    out = [1] * ndim
    for s in shapes:
        for i, d in enumerate(s, ndim - len(s)):
            if d == 1:
                continue
            if out[i] == 1:
                out[i] = d
            elif out[i] != d:
                raise RuntimeError(f"shapes {[list(x) for x in shapes]} do not broadcast together")
    return torch.Size(out)


def expand_right(t: Tensor, shape: Sequence[int]) -> Tensor:
    """Appends singleton dims to ``t`` then expands it to ``shape`` (leading dims align)."""
    extra = len(shape) - t.ndim
    if extra < 0:
        raise ValueError(f"cannot expand a tensor of shape {list(t.shape)} to {list(shape)}")
    if extra:
        t = t.reshape(t.shape + (1,) * extra)
    return t.expand(shape)
