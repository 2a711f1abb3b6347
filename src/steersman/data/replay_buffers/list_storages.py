"""List storages with a twist: lazy stacking (:class:`LazyStackStorage`) and compression
(:class:`CompressedListStorage`).

Both keep one Python object per slot, like :class:`ListStorage`, and share its
fill-in-order rule, its ``dumps``/``loads`` format (tensors and TensorDicts in tensor
files, nothing unpickled) and its errors.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from steersman.tensordict import TensorDict, TensorDictBase, is_tensor_collection, lazy_stack

from ._checkpoint import CheckpointError
from .storages import ListStorage


def _check_items(data: Any, ok: Callable[[Any], bool], what: str, name: str) -> None:
    """Refuses a list/tuple with an item of the wrong kind before anything is written."""
    if isinstance(data, (list, tuple)):
        for i, x in enumerate(data):
            if not ok(x):
                raise TypeError(f"{name} holds {what}; item {i} is a {type(x).__name__}")

__all__ = ["LazyStackStorage", "CompressedListStorage"]


class LazyStackStorage(ListStorage):
    """A :class:`ListStorage` whose reads of several items return a lazy stack.

    Items share their batch size but their leaves may have different shapes (e.g. token
    sequences of different lengths) or different keys: a read of several items returns a :class:`~steersman.tensordict.LazyStackedTensorDict` over them
    (nothing is copied), so ``rb.sample(k)`` works where a dense stack would fail.

    Args:
        max_size: capacity (number of items); ``None`` means unbounded.

    Keyword Args:
        stack_dim: the batch dim of the lazy stack (negative counts from the end of the
            items' batch dims + 1). Default ``0``.
        device: ``None`` keeps items where they are; otherwise items move there on write.
        compilable: accepted for TorchRL compatibility; no effect (the storage holds a
            plain list either way).

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.data import ReplayBuffer, LazyStackStorage
        >>> rb = ReplayBuffer(storage=LazyStackStorage(100))
        >>> _ = rb.add(TensorDict(obs=torch.zeros(5)))
        >>> _ = rb.add(TensorDict(obs=torch.ones(7)))
        >>> both = rb[:]
        >>> type(both).__name__, both.batch_size, both[1]["obs"].shape
        ('LazyStackedTensorDict', torch.Size([2]), torch.Size([7]))
    """

    def __init__(self, max_size: int | None = None, *, compilable: bool = False, stack_dim: int = 0,
                 device: Any = None) -> None:
        super().__init__(2**62 if max_size is None else max_size)
        self.stack_dim = int(stack_dim)
        self.device = None if device is None else torch.device(device)

    def _set_one(self, cursor: int, item: Any) -> None:
        if not is_tensor_collection(item):
            raise TypeError(f"LazyStackStorage holds TensorDicts; got a {type(item).__name__} for slot {cursor}")
        if self.device is not None:
            item = item.to(self.device)
        super()._set_one(cursor, item)

    def set(self, cursor: Any, data: Any) -> None:
        if not isinstance(cursor, int):
            _check_items(data, is_tensor_collection, "TensorDicts", "LazyStackStorage")
        super().set(cursor, data)

    def _stack(self, items: list) -> Any:
        if not items:
            return items
        dim = self.stack_dim
        if dim < 0:
            dim += items[0].ndim + 1
        return lazy_stack(items, dim)

    def get(self, index: Any) -> Any:
        out = super().get(index)
        return self._stack(out) if isinstance(out, list) else out

    def _get_fast(self, index: Tensor) -> Any:
        return self._stack(super()._get_fast(index))

    def __repr__(self) -> str:
        return f"LazyStackStorage(max_size={self.max_size}, len={self._len}, stack_dim={self.stack_dim})"


def _zlib_compress(level: int) -> Callable[[Tensor], Tensor]:
    def compress(t: Tensor) -> Tensor:
        raw = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        return torch.frombuffer(bytearray(zlib.compress(raw, level)), dtype=torch.uint8)

    return compress


def _zlib_decompress(blob: Tensor) -> Tensor:
    raw = zlib.decompress(blob.numpy().tobytes())
    return torch.from_numpy(np.frombuffer(bytearray(raw), dtype=np.uint8))


class CompressedListStorage(ListStorage):
    """A :class:`ListStorage` that keeps each tensor compressed (zlib by default).

    Every tensor of an item (a tensor, or each leaf of a TensorDict) is stored as a
    compressed byte tensor plus its shape and dtype, and decompressed on read, so images
    and other redundant observations take a fraction of their memory. Reads return the
    same values, shapes, dtypes and TensorDict structure as written.

    Args:
        max_size: capacity (number of items).

    Keyword Args:
        compression_fn: ``Tensor -> uint8 Tensor``; default zlib (the stdlib) at
            ``compression_level``.
        decompression_fn: ``uint8 Tensor -> uint8 Tensor`` giving back the raw bytes;
            default zlib.
        compression_level: zlib level, 0 (none) to 9 (smallest). TorchRL's default codec
            is zstd (levels 1-22); levels above 9 are refused here. Default ``3``.
        device: where read tensors are placed. Default ``"cpu"``.
        compilable: accepted for TorchRL compatibility; no effect.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.data import ReplayBuffer, CompressedListStorage
        >>> rb = ReplayBuffer(storage=CompressedListStorage(100), batch_size=4)
        >>> frames = torch.zeros(10, 3, 84, 84, dtype=torch.uint8)
        >>> _ = rb.extend(TensorDict(obs=frames, batch_size=[10]))
        >>> rb.sample()["obs"].shape
        torch.Size([4, 3, 84, 84])
        >>> rb.storage.nbytes_compressed() < frames.numel()
        True
    """

    def __init__(self, max_size: int, *, compression_fn: Callable | None = None,
                 decompression_fn: Callable | None = None, compression_level: int = 3, device: Any = "cpu",
                 compilable: bool = False) -> None:
        if not 0 <= int(compression_level) <= 9:
            raise ValueError(f"compression_level must be in [0, 9] for zlib; got {compression_level}")
        super().__init__(max_size)
        self.compression_level = int(compression_level)
        self.compression_fn = compression_fn or _zlib_compress(self.compression_level)
        self.decompression_fn = decompression_fn or _zlib_decompress
        self.device = torch.device(device)

    # a packed item is plain data (tensors, lists, strings), so state_dict stays torch.save-able
    def _pack_tensor(self, t: Tensor) -> dict:
        return {"blob": self.compression_fn(t), "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}

    def _unpack_tensor(self, rec: dict) -> Tensor:
        raw = self.decompression_fn(rec["blob"])
        dtype = getattr(torch, rec["dtype"])
        return raw.view(dtype).reshape(rec["shape"]).to(self.device)

    def _pack(self, item: Any, cursor: int) -> dict:
        if isinstance(item, Tensor):
            return {"tensor": self._pack_tensor(item)}
        if isinstance(item, TensorDictBase):
            leaves = {"/".join((k,) if isinstance(k, str) else k): self._pack_tensor(v)
                      for k, v in item.items(True, True)}
            return {"td": leaves, "batch_size": list(item.batch_size)}
        raise TypeError(f"CompressedListStorage holds tensors and TensorDicts; got a {type(item).__name__} "
                        f"for slot {cursor}")

    def _unpack(self, rec: dict) -> Any:
        if "tensor" in rec:
            return self._unpack_tensor(rec["tensor"])
        td = TensorDict({}, rec["batch_size"], device=self.device)
        for k, v in rec["td"].items():
            td.set(tuple(k.split("/")), self._unpack_tensor(v))
        return td

    def set(self, cursor: Any, data: Any) -> None:
        if not isinstance(cursor, int):
            _check_items(data, lambda x: isinstance(x, (Tensor, TensorDictBase)), "tensors and TensorDicts",
                         "CompressedListStorage")
        super().set(cursor, data)

    def _set_one(self, cursor: int, item: Any) -> None:
        super()._set_one(cursor, self._pack(item, cursor))

    def get(self, index: Any) -> Any:
        out = super().get(index)
        return [self._unpack(r) for r in out] if isinstance(out, list) else self._unpack(out)

    def _get_fast(self, index: Tensor) -> Any:
        return [self._unpack(r) for r in super()._get_fast(index)]

    def nbytes_compressed(self) -> int:
        """Bytes held by the compressed blobs of all items."""
        def size(rec: dict) -> int:
            if "tensor" in rec:
                return rec["tensor"]["blob"].numel()
            return sum(v["blob"].numel() for v in rec["td"].values())

        return sum(size(r) for r in self._storage)

    # checkpoints hold the decompressed items in ListStorage's format (loading never unpickles)
    def _checkpoint_state(self) -> tuple[dict, TensorDictBase | None]:
        plain = ListStorage(self.max_size)
        plain._storage = [self._unpack(r) for r in self._storage]
        plain._len, plain._last_cursor = self._len, self._last_cursor
        return plain._checkpoint_state()

    def _prepare_load(self, meta: dict, tensors: Any, path: Any) -> Any:
        items, last = super()._prepare_load(meta, tensors, path)
        try:
            return [self._pack(x, i) for i, x in enumerate(items)], last
        except TypeError as err:
            raise CheckpointError(f"{path}: {err}", file=path) from err

    def _checkpoint_types(self) -> tuple[str, ...]:
        return ("CompressedListStorage", "ListStorage")

    def __repr__(self) -> str:
        return (f"CompressedListStorage(max_size={self.max_size}, len={self._len}, "
                f"compression_level={self.compression_level})")
