"""``NonTensor``: the spec of a non-tensor entry (a string, a dict, any Python object)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from steersman.tensordict import NonTensorData, is_non_tensor, is_tensor_collection

from .base import DEFAULT_SHAPE, ShapeLike, TensorSpec, ends_with

__all__ = ["NonTensor"]


class NonTensor(TensorSpec):
    """A non-tensor entry: text instructions, env info objects, anything not a tensor.

    Its values are :class:`~steersman.tensordict.NonTensorData` (or
    ``NonTensorStack``) of batch size ``shape``; ``rand``/``zero``/``one`` return
    ``example_data`` wrapped that way. ``is_in`` accepts such wrappers whose batch
    size ends with ``shape`` and plain Python objects (which carry no shape); it
    rejects tensors.

    Args:
        shape: the batch shape of the entry (default ``[1]``).
        device: default: torch's default device.
        dtype: unused (kept for API symmetry), default None.
        example_data: the value returned by ``rand``/``zero``/``one``.

    Example:
        >>> from steersman.data import NonTensor
        >>> spec = NonTensor(shape=(2,), example_data="go left")
        >>> v = spec.rand()
        >>> type(v).__name__, v.data, v.batch_size
        ('NonTensorData', 'go left', torch.Size([2]))
        >>> spec.is_in(v), spec.is_in("any text")
        (True, True)
        >>> spec.encode("a goal").batch_size
        torch.Size([2])
    """

    domain = "non_tensor"
    _eq_fields = ("example_data",)

    def __init__(self, shape: ShapeLike = DEFAULT_SHAPE, device: Any = None,
                 dtype: torch.dtype | None = None, example_data: Any = None, **kwargs: Any) -> None:
        super().__init__(DEFAULT_SHAPE if shape is None else shape, device=device, dtype=dtype)
        self.example_data = example_data

    def _cast(self, dtype: torch.dtype) -> TensorSpec:
        return self._replace(_dtype=dtype)

    def _repr_fields(self) -> list[str]:
        return [f"example_data={self.example_data!r}"]

    def rand(self, shape: ShapeLike = None) -> NonTensorData:
        return NonTensorData(self.example_data, batch_size=self._full_shape(shape), device=self._device)

    zero = rand
    one = rand

    def is_in(self, val: Any) -> bool:
        if isinstance(val, Tensor):
            return False
        if is_non_tensor(val):
            return ends_with(val.batch_size, self._shape)
        return not is_tensor_collection(val)

    def _check(self, val: Any) -> str | None:
        if isinstance(val, Tensor) or (is_tensor_collection(val) and not is_non_tensor(val)):
            return f"expected non-tensor data, got {type(val).__name__}"
        if is_non_tensor(val) and not ends_with(val.batch_size, self._shape):
            return f"batch size {list(val.batch_size)} does not end with the spec shape {list(self._shape)}"
        return None

    def project(self, val: Any) -> NonTensorData:
        """``val`` wrapped as non-tensor data of the spec's shape (kept if it already is)."""
        if is_non_tensor(val) and ends_with(val.batch_size, self._shape):
            return val
        data = val.data if is_non_tensor(val) and hasattr(val, "data") else val
        return NonTensorData(data, batch_size=self._shape, device=self._device)

    def encode(self, val: Any, *, ignore_device: bool = False) -> NonTensorData:
        if is_non_tensor(val):
            return val
        return NonTensorData(val, batch_size=self._shape, device=None if ignore_device else self._device)

    def to_numpy(self, val: Any, safe: bool = False) -> Any:
        """The Python value of ``val`` (a nested list for a ``NonTensorStack``)."""
        if safe:
            self.assert_is_in(val)
        if not is_non_tensor(val):
            return val
        return val.tolist() if getattr(type(val), "_is_stack", False) else val.data
