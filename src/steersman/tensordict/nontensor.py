"""Non-tensor entries: strings and arbitrary Python objects inside a TensorDict.

* :class:`NonTensorData` holds one value for the whole batch; indexing keeps it.
* :class:`NonTensorStack` holds one value per batch element (an object array);
  indexing, reshaping and stacking move the values like a tensor's elements.

Both follow the batch shape of the TensorDict that holds them, so every shape
operation of the container keeps them aligned with the tensors.
"""

from __future__ import annotations

import copy as _copy
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ._utils import NO_DEFAULT, as_size, indexed_batch_size
from .base import TensorDictBase
from .switches import STATE

__all__ = ["NonTensorData", "NonTensorStack", "MetaData", "is_non_tensor", "to_entry"]


def is_non_tensor(data: Any) -> bool:
    """True if ``data`` is a :class:`NonTensorData` or a :class:`NonTensorStack`."""
    return getattr(type(data), "_is_non_tensor", False)


class NonTensorData(TensorDictBase):
    """One Python value shared by every element of a batch.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> td = TensorDict({"obs": torch.zeros(3, 2), "env": "CartPole-v1"}, batch_size=[3])
        >>> td[0]["env"]
        'CartPole-v1'
        >>> td.get("env").batch_size
        torch.Size([3])
    """

    _is_non_tensor = True
    _is_stack = False
    __slots__ = ("data", "_batch_size", "_device")

    def __init__(self, data: Any, batch_size: Any = None, device: Any = None, names: Any = None) -> None:
        if isinstance(data, NonTensorData):
            data = data.data
        self.data = data
        self._batch_size = as_size(batch_size)
        self._device = None if device is None else torch.device(device)

    @property
    def batch_size(self) -> torch.Size:
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value: Any) -> None:
        self._batch_size = as_size(value)

    @property
    def device(self) -> torch.device | None:
        return self._device

    @property
    def names(self) -> list:
        return [None] * len(self._batch_size)

    def _keys_str(self):
        return ()

    def _get_str(self, key: str, default: Any) -> Any:
        if default is NO_DEFAULT:
            raise KeyError(f"non-tensor data has no key {key!r}")
        return default

    def _new_like(self, batch_size: torch.Size) -> NonTensorData:
        return NonTensorData(self.data, batch_size, self._device)

    def _index(self, index: Any) -> NonTensorData:
        return self._new_like(indexed_batch_size(self._batch_size, index))

    def _apply_batch(self, fn: Callable, batch_size: torch.Size, names: Any) -> NonTensorData:
        return self._new_like(batch_size)

    def _split_batch(self, fn: Callable, batch_sizes: list) -> list:
        return [self._new_like(b) for b in batch_sizes]

    def _map(self, fn: Callable, others: tuple, *, batch_size: Any = None, device: Any = NO_DEFAULT,
             clone_non_tensor: bool = False, **kwargs: Any) -> NonTensorData:
        out = NonTensorData(
            _copy.copy(self.data) if clone_non_tensor else self.data,
            self._batch_size if batch_size is None else batch_size,
            self._device if device is NO_DEFAULT else device,
        )
        return out

    def _map_(self, fn: Callable, others: tuple, **kwargs: Any) -> None:
        return None

    def _assign_at(self, index: Any, value: Any) -> None:
        value = value.data if isinstance(value, NonTensorData) else value
        if (type(index) is tuple and not index) or _same(value, self.data):
            self.data = value
            return
        raise ValueError(
            f"cannot write the non-tensor value {value!r} into part of a batch that shares "
            f"the value {self.data!r}; store per-element values as a NonTensorStack"
        )

    def _new_empty(self, batch_size: torch.Size) -> NonTensorData:
        return self._new_like(batch_size)

    def copy(self) -> NonTensorData:
        return self._new_like(self._batch_size)

    def lock_(self) -> NonTensorData:
        return self

    def unlock_(self) -> NonTensorData:
        return self

    def tolist(self) -> Any:
        out: Any = self.data
        for d in reversed(self._batch_size):
            out = [out] * d
        return out

    def to_object_array(self) -> np.ndarray:
        arr = np.empty(tuple(self._batch_size), dtype=object)
        if arr.ndim == 0:
            arr[()] = self.data
        else:
            arr.fill(self.data)
        return arr

    def __repr__(self) -> str:
        return f"NonTensorData(data={self.data!r}, batch_size={self._batch_size}, device={self._device})"

    def __eq__(self, other: Any) -> Any:  # type: ignore[override]
        other = other.data if isinstance(other, NonTensorData) else other
        return _same(self.data, other)

    __hash__ = TensorDictBase.__hash__


class MetaData(NonTensorData):
    """A value that belongs to the whole batch: stacking equal values keeps one ``MetaData``."""


class NonTensorStack(TensorDictBase):
    """One Python value per batch element, stored as a numpy object array.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> td = TensorDict({"seq": ["AC", "GG", "TA"], "gc": torch.tensor([0.5, 1.0, 0.0])}, [3])
        >>> td[td["gc"] > 0.4].get("seq").tolist()
        ['AC', 'GG']
    """

    _is_non_tensor = True
    _is_stack = True
    __slots__ = ("_values", "_device")

    def __init__(self, values: Any, batch_size: Any = None, device: Any = None) -> None:
        if not isinstance(values, np.ndarray) or values.dtype != object:
            values = _object_array(values, None if batch_size is None else as_size(batch_size))
        if batch_size is not None and tuple(values.shape) != tuple(as_size(batch_size)):
            raise ValueError(
                f"NonTensorStack values have shape {list(values.shape)} but batch_size is {list(batch_size)}"
            )
        self._values = values
        self._device = None if device is None else torch.device(device)

    @classmethod
    def from_list(cls, values: Sequence, device: Any = None) -> NonTensorStack:
        return cls(values, device=device)

    @property
    def batch_size(self) -> torch.Size:
        return torch.Size(self._values.shape)

    @batch_size.setter
    def batch_size(self, value: Any) -> None:
        value = as_size(value)
        if tuple(value) != self._values.shape:
            self._values = self._values.reshape(tuple(value))

    @property
    def device(self) -> torch.device | None:
        return self._device

    @property
    def names(self) -> list:
        return [None] * self._values.ndim

    @property
    def data(self) -> list:
        return self.tolist()

    def _keys_str(self):
        return ()

    def _get_str(self, key: str, default: Any) -> Any:
        if default is NO_DEFAULT:
            raise KeyError(f"non-tensor data has no key {key!r}")
        return default

    def _positions(self, fn: Callable) -> np.ndarray:
        pos = torch.arange(self._values.size).reshape(self._values.shape)
        return fn(pos)

    def _from_positions(self, pos: Tensor) -> TensorDictBase:
        vals = self._values.reshape(-1)[pos.numpy()]
        if not isinstance(vals, np.ndarray):  # a single element
            return NonTensorData(vals, torch.Size(()), self._device)
        return NonTensorStack(vals, device=self._device)

    def _index(self, index: Any) -> TensorDictBase:
        return self._from_positions(self._positions(lambda x: x[index]))

    def _apply_batch(self, fn: Callable, batch_size: torch.Size, names: Any) -> TensorDictBase:
        out = self._from_positions(self._positions(fn))
        if isinstance(out, NonTensorData):
            out = NonTensorStack(out.to_object_array(), device=self._device)
        return out

    def _split_batch(self, fn: Callable, batch_sizes: list) -> list:
        return [self._from_positions(p) for p in self._positions(fn)]

    def _map(self, fn: Callable, others: tuple, *, batch_size: Any = None, device: Any = NO_DEFAULT,
             clone_non_tensor: bool = False, **kwargs: Any) -> NonTensorStack:
        vals = self._values
        if clone_non_tensor:
            vals = vals.copy()
        if batch_size is not None and tuple(batch_size) != vals.shape:
            if len(batch_size) < vals.ndim and tuple(batch_size) == vals.shape[: len(batch_size)]:
                pass  # reductions of the batch keep the per-element values unchanged
            else:
                vals = vals.reshape(tuple(batch_size))
        return NonTensorStack(vals, device=self._device if device is NO_DEFAULT else device)

    def _map_(self, fn: Callable, others: tuple, **kwargs: Any) -> None:
        return None

    def _assign_at(self, index: Any, value: Any) -> None:
        if isinstance(value, NonTensorStack):
            src: Any = value._values
        elif isinstance(value, NonTensorData):
            src = value.data
        else:
            src = value
        pos = self._positions(lambda x: x if type(index) is tuple and not index else x[index]).numpy()
        flat = self._values.reshape(-1)
        if isinstance(src, np.ndarray):
            flat[pos] = src
        else:
            tmp = np.empty(pos.shape, dtype=object)
            tmp.fill(src) if tmp.ndim else tmp.__setitem__((), src)
            flat[pos] = tmp

    def _new_empty(self, batch_size: torch.Size) -> NonTensorStack:
        return NonTensorStack(np.empty(tuple(batch_size), dtype=object), device=self._device)

    def copy(self) -> NonTensorStack:
        return NonTensorStack(self._values.copy(), device=self._device)

    def lock_(self) -> NonTensorStack:
        return self

    def unlock_(self) -> NonTensorStack:
        return self

    def tolist(self) -> list:
        return self._values.tolist()

    def to_object_array(self) -> np.ndarray:
        return self._values

    def __repr__(self) -> str:
        return f"NonTensorStack({self.tolist()!r}, batch_size={self.batch_size}, device={self._device})"

    def __eq__(self, other: Any) -> Any:  # type: ignore[override]
        if isinstance(other, NonTensorStack):
            return self._values.shape == other._values.shape and self.tolist() == other.tolist()
        return False

    __hash__ = TensorDictBase.__hash__


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:
        return False


def _object_array(values: Any, batch_size: torch.Size | None) -> np.ndarray:
    """A nested list → an object array with the list nesting (up to ``batch_size`` dims)."""
    if batch_size is None:
        depth = 0
        v = values
        shape = []
        while isinstance(v, (list, tuple)) and not isinstance(v, str):
            shape.append(len(v))
            depth += 1
            if not v:
                break
            v = v[0]
        batch_size = torch.Size(shape)
    arr = np.empty(tuple(batch_size), dtype=object)
    if arr.ndim == 0:
        arr[()] = values
        return arr

    def fill(a, v, d):
        if d == len(batch_size) - 1:
            if len(v) != a.shape[0]:
                raise ValueError(f"a list of {len(v)} values does not fit batch dim {d} of size {a.shape[0]}")
            for i, x in enumerate(v):
                a[i] = x
            return
        if len(v) != a.shape[0]:
            raise ValueError(f"a list of {len(v)} values does not fit batch dim {d} of size {a.shape[0]}")
        for i, x in enumerate(v):
            fill(a[i], x, d + 1)

    fill(arr, values, 0)
    return arr


def to_entry(value: Any, batch_size: torch.Size, device: Any, key: Any) -> Any:
    """Converts a value that is not a tensor into a TensorDict entry.

    Numbers and booleans become tensors filled over the batch; numpy arrays and
    lists of numbers become tensors; a list of other values whose length matches
    the batch becomes a :class:`NonTensorStack`; anything else is a
    :class:`NonTensorData`.
    """
    if isinstance(value, (bool, numbers.Number, np.number, np.bool_)) and not isinstance(value, Tensor):
        t = torch.tensor(value, device=device)
        return t.expand(batch_size).clone() if len(batch_size) else t
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            return NonTensorStack(value, device=device)
        return torch.as_tensor(value, device=device)
    if isinstance(value, (list, tuple)) and value and not isinstance(value, str):
        if type(value) is list and STATE["list_to_stack"]:
            stacked = _stack_tensor_list(value)
            if stacked is not None:
                return stacked if device is None else stacked.to(device)
        if _all_numbers(value):
            try:
                return torch.tensor(value, device=device)
            except (TypeError, ValueError):
                pass
        if len(batch_size) and len(value) == batch_size[0]:
            depth = 1
            v = value[0]
            while depth < len(batch_size) and isinstance(v, (list, tuple)) and len(v) == batch_size[depth]:
                depth += 1
                v = v[0] if v else None
            return NonTensorStack(_object_array(value, batch_size[:depth]), device=device)._expand_to(batch_size)
    if isinstance(value, Tensor) or getattr(type(value), "_is_tensor_collection", False):
        return value
    return NonTensorData(value, batch_size, device)


def _stack_tensor_list(value: list) -> Tensor | None:
    """A list (of lists) of same-shape tensors as one stacked tensor; None otherwise."""
    if all(isinstance(v, Tensor) for v in value):
        try:
            return torch.stack(value)
        except RuntimeError:  # ragged: kept as a NonTensorStack
            return None
    if all(type(v) is list and v for v in value):
        parts = [_stack_tensor_list(v) for v in value]
        if all(p is not None for p in parts):
            try:
                return torch.stack(parts)
            except RuntimeError:
                return None
    return None


def _all_numbers(v: Any) -> bool:
    if isinstance(v, (list, tuple)):
        return all(_all_numbers(x) for x in v)
    return isinstance(v, (bool, numbers.Number, np.number, np.bool_))


def _expand_to(self: NonTensorStack, batch_size: torch.Size) -> NonTensorStack:
    vals = self._values
    if vals.shape == tuple(batch_size):
        return self
    extra = len(batch_size) - vals.ndim
    vals = np.broadcast_to(vals.reshape(vals.shape + (1,) * extra), tuple(batch_size)).copy()
    return NonTensorStack(vals, device=self._device)


NonTensorStack._expand_to = _expand_to  # type: ignore[attr-defined]


def stack_non_tensor(items: Sequence[Any], dim: int) -> TensorDictBase:
    """Stacks non-tensor entries: equal ``MetaData`` stay one value, others become a stack."""
    first = items[0]
    if all(type(x) is MetaData for x in items) and all(x.data is first.data for x in items):
        bs = first.batch_size
        return MetaData(first.data, bs[:dim] + (len(items),) + bs[dim:], first.device)
    if STATE["capture_non_tensor_stack"] and all(type(x) is NonTensorData for x in items) and all(
        _same(x.data, first.data) for x in items
    ):
        bs = first.batch_size
        return NonTensorData(first.data, bs[:dim] + (len(items),) + bs[dim:], first.device)
    arrays = [x.to_object_array() for x in items]
    return NonTensorStack(np.stack(arrays, dim), device=first.device)


def cat_non_tensor(items: Sequence[Any], dim: int) -> TensorDictBase:
    first = items[0]
    if all(type(x) is MetaData for x in items) and all(x.data is first.data for x in items):
        bs = list(first.batch_size)
        bs[dim] = sum(x.batch_size[dim] for x in items)
        return MetaData(first.data, bs, first.device)
    return NonTensorStack(np.concatenate([x.to_object_array() for x in items], dim), device=first.device)
