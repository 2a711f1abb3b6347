"""File-backed (memory-mapped) tensors that other processes can open.

:class:`MemoryMappedTensor` is a :class:`torch.Tensor` subclass whose storage is either a
file mapped with ``MAP_SHARED`` (``filename`` is a path) or an anonymous shared-memory
segment (``filename is None``). Both kinds can be handed to other processes without
copying the data.

Operations on a ``MemoryMappedTensor`` return plain :class:`torch.Tensor` objects (the
subclass opts out of ``__torch_function__``), but views and indexing results still alias the
mapped storage, so in-place writes through them land in the file.

The module also provides :func:`save_tensor_file` / :func:`load_tensor_file`, which store the
raw bytes of a tensor (no header, no pickle); dtype and shape are kept by the caller.

Example:
    >>> import tempfile, os, torch
    >>> from steersman.tensordict.memmap import MemoryMappedTensor
    >>> path = os.path.join(tempfile.mkdtemp(), "x.memmap")
    >>> t = MemoryMappedTensor.zeros(2, 3, filename=path)
    >>> t[0] = 1.0
    >>> MemoryMappedTensor.from_filename(path, torch.float32, (2, 3)).sum().item()
    3.0
"""

from __future__ import annotations

import ctypes
import os
import uuid
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["MemoryMappedTensor", "save_tensor_file", "load_tensor_file"]

ShapeLike = int | Sequence[int] | torch.Size
PathLike = str | os.PathLike[str]


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------
def _parse_shape(shape: tuple[Any, ...]) -> torch.Size:
    """Accepts ``(2, 3)``, ``((2, 3),)``, ``([2, 3],)``, ``(torch.Size([2, 3]),)`` or ``()``."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
        shape = tuple(shape[0])
    if all(type(s) is int and s >= 0 for s in shape):  # the common case
        return torch.Size(shape)
    out = []
    for s in shape:
        if isinstance(s, torch.Tensor):
            if s.numel() != 1:
                raise TypeError(f"shape entries must be integers, got a tensor of shape {s.shape}")
            s = s.item()
        if isinstance(s, bool) or not isinstance(s, int):
            try:
                s = int(s.__index__())  # numpy ints and other integer-likes
            except AttributeError:
                raise TypeError(f"shape entries must be integers, got {s!r}") from None
        if s < 0:
            raise ValueError(f"shape entries must be non-negative, got {tuple(shape)}")
        out.append(s)
    return torch.Size(out)


def _numel(shape: torch.Size) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _element_size(dtype: torch.dtype) -> int:
    return dtype.itemsize


def _check_cpu_device(device: Any) -> None:
    if device is None:
        return
    device = torch.device(device)
    if device.type != "cpu":
        raise ValueError(
            f"MemoryMappedTensor lives in CPU memory (a mapped file or shared memory); "
            f"device={device} is not supported. Move the result with `.to(device)` instead."
        )


def _allocate_file(filename: str, nbytes: int, existsok: bool) -> None:
    """Create ``filename`` with exactly ``nbytes`` bytes (sparse, zero-filled when new).

    Uses ``O_EXCL`` when ``existsok`` is False so the existence check is race-free.
    An existing file is resized in place (not truncated to zero first), so data that other
    mappings of the same file hold in the kept range survives.
    """
    directory = os.path.dirname(filename)
    if directory:
        os.makedirs(directory, exist_ok=True)
    flags = os.O_RDWR | os.O_CREAT | (0 if existsok else os.O_EXCL)
    try:
        fd = os.open(filename, flags, 0o666)
    except FileExistsError:
        raise FileExistsError(
            f"The file {filename!r} already exists. Pass existsok=True to overwrite it."
        ) from None
    try:
        os.ftruncate(fd, nbytes)
    finally:
        os.close(fd)


def _copy_to_file(src: torch.Tensor, filename: str) -> MemoryMappedTensor:
    """``MemoryMappedTensor.from_tensor(src, filename=filename, existsok=True)`` for a
    detached, non-empty, dense CPU tensor whose folder exists (``memmap``'s loop).

    An existing file is resized in place (``torch.from_file`` only grows files); a
    missing one is created with the right size by ``torch.from_file`` itself.
    """
    numel = src.numel()
    try:
        os.truncate(filename, numel * src.dtype.itemsize)
    except FileNotFoundError:
        pass
    out = _map_file(filename, src.dtype, numel).view(src.shape)
    out.copy_(src)
    return MemoryMappedTensor._wrap(out, filename)


def _map_file(filename: str, dtype: torch.dtype, numel: int) -> torch.Tensor:
    """Map the first ``numel`` elements of an existing file as a flat 1-D tensor.

    Quirk: ``torch.from_file(..., shared=True)`` silently creates a missing file and grows a
    file that is too small (it ``ftruncate``s it). Callers make sure the file exists with
    the right size first so neither can happen by accident.
    """
    return torch.from_file(filename, shared=True, size=numel, dtype=dtype)


def _new_shared_flat(dtype: torch.dtype, numel: int) -> torch.Tensor:
    """A flat tensor in anonymous shared memory, without allocating private memory first."""
    nbytes = numel * _element_size(dtype)
    try:
        storage = torch.UntypedStorage._new_shared(nbytes)
    except (AttributeError, RuntimeError):  # pragma: no cover - very old / exotic builds
        return torch.empty(numel, dtype=dtype).share_memory_()
    return torch.empty(0, dtype=dtype).set_(storage, 0, (numel,), (1,))


def _as_cpu_dense(tensor: torch.Tensor) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.layout != torch.strided or getattr(tensor, "is_nested", False):
        raise TypeError(f"only dense strided tensors are supported, got layout {tensor.layout}")
    if tensor.device.type == "meta":
        raise ValueError("a meta tensor has no data to write")
    return tensor.detach().to("cpu").contiguous()


def _byte_view(tensor: torch.Tensor) -> memoryview:
    """A writable memoryview over the bytes of a contiguous CPU tensor (no copy, any dtype)."""
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * nbytes).from_address(tensor.data_ptr())).cast("B")


def _same_file(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


# --------------------------------------------------------------------------------------
# MemoryMappedTensor
# --------------------------------------------------------------------------------------
def _rebuild_from_file(
    filename: str,
    dtype: torch.dtype,
    shape: tuple[int, ...],
    stride: tuple[int, ...] | None = None,
    storage_offset: int = 0,
    storage_numel: int | None = None,
) -> MemoryMappedTensor:
    """Unpickling hook: re-open ``filename`` (no data copy) and restore the view geometry."""
    if stride is None:
        return MemoryMappedTensor.from_filename(filename, dtype, shape)
    if storage_numel is None:
        storage_numel = _numel(torch.Size(shape))
    base = MemoryMappedTensor.from_filename(filename, dtype, (storage_numel,))
    view = base.as_strided(shape, stride, storage_offset)
    return MemoryMappedTensor._wrap(view, filename)


def _rebuild_anonymous(tensor: torch.Tensor) -> MemoryMappedTensor:
    """Unpickling hook for anonymous (shared-memory) tensors."""
    return MemoryMappedTensor._wrap(tensor, None)


class MemoryMappedTensor(torch.Tensor):
    """A CPU tensor backed by a memory-mapped file or by anonymous shared memory.

    Create instances with the classmethod constructors (:meth:`from_tensor`, :meth:`empty`,
    :meth:`zeros`, :meth:`ones`, :meth:`full`, the ``*_like`` variants and
    :meth:`from_filename`), never with ``MemoryMappedTensor(...)`` directly.

    Pickling a file-backed instance stores only ``(filename, dtype, shape, ...)``; unpickling
    maps the same file again, so the data is shared, not copied. An anonymous instance
    pickles like a plain tensor (shared-memory handle under :mod:`torch.multiprocessing`,
    a data copy under plain :mod:`pickle`).

    Example:
        >>> import torch
        >>> t = MemoryMappedTensor.from_tensor(torch.arange(3))
        >>> t.filename is None, type(t + 1) is torch.Tensor
        (True, True)
    """

    __torch_function__ = torch._C._disabled_torch_function_impl

    _filename: str | None = None

    # ----------------------------------------------------------------- internals
    @classmethod
    def _wrap(cls, tensor: torch.Tensor, filename: str | None) -> MemoryMappedTensor:
        """Alias ``tensor``'s storage (and view geometry) as a ``MemoryMappedTensor``."""
        out = torch.Tensor._make_subclass(cls, tensor, False)  # (it detaches by itself)
        out._filename = filename
        return out

    @classmethod
    def _allocate(
        cls,
        shape: torch.Size,
        dtype: torch.dtype,
        filename: PathLike | None,
        existsok: bool,
    ) -> MemoryMappedTensor:
        numel = _numel(shape)
        if filename is None:
            flat = _new_shared_flat(dtype, numel)
            return cls._wrap(flat.view(shape), None)
        filename = os.fspath(filename)
        _allocate_file(filename, numel * _element_size(dtype), existsok)
        flat = _map_file(filename, dtype, numel)
        return cls._wrap(flat.view(shape), filename)

    @property
    def filename(self) -> str | None:
        """Path of the backing file, or ``None`` for anonymous shared memory."""
        return self._filename

    def _as_plain(self) -> torch.Tensor:
        """A plain ``torch.Tensor`` aliasing the same memory."""
        return self.as_subclass(torch.Tensor)

    # ------------------------------------------------------------- constructors
    @classmethod
    def from_tensor(
        cls,
        input: torch.Tensor,
        *,
        filename: PathLike | None = None,
        existsok: bool = False,
        copy_existing: bool = False,
        copy_data: bool = True,
        shape: ShapeLike | None = None,
    ) -> MemoryMappedTensor:
        """Create a memory-mapped copy of ``input``.

        Args:
            input: the tensor to copy (any device; data is copied to CPU). Non-tensor array
                likes are converted with :func:`torch.as_tensor`.
            filename: backing file; ``None`` uses anonymous shared memory.
            existsok: if False, an existing ``filename`` raises :class:`FileExistsError`.
            copy_existing: ``input`` may be a ``MemoryMappedTensor`` backed by *another*
                file only if this is True (guards against silently duplicating files).
            copy_data: if False only shape and dtype are taken from ``input``
                (the content is left zero for new files). Meta tensors never copy data.
            shape: shape of the result. If ``copy_data`` is True, ``input`` must have the
                same number of elements and is reshaped.

        If ``input`` already is a ``MemoryMappedTensor`` backed by ``filename`` (or both
        are anonymous) and no ``shape`` is given, ``input`` itself is returned.

        Example:
            >>> t = MemoryMappedTensor.from_tensor(torch.ones(2, dtype=torch.bool))
            >>> t.tolist()
            [True, True]
        """
        if not isinstance(input, torch.Tensor):
            input = torch.as_tensor(input)
        if isinstance(input, MemoryMappedTensor):
            fn = None if filename is None else os.fspath(filename)
            if shape is None and _same_file(input.filename, fn):
                return input
            if input.filename is not None and fn is not None and not copy_existing:
                raise RuntimeError(
                    f"input is already memory-mapped to {input.filename!r}; copying it to "
                    f"{fn!r} would duplicate the data on disk. Pass copy_existing=True to allow it."
                )
        if input.layout != torch.strided or getattr(input, "is_nested", False):
            raise TypeError(f"only dense strided tensors are supported, got layout {input.layout}")
        out_shape = input.shape if shape is None else _parse_shape((shape,))
        if copy_data and input.device.type != "meta" and _numel(out_shape) != input.numel():
            raise ValueError(
                f"shape {tuple(out_shape)} is incompatible with input of shape {tuple(input.shape)}"
            )
        out = cls._allocate(out_shape, input.dtype, filename, existsok)
        if copy_data and input.device.type != "meta" and out.numel() > 0:
            with torch.no_grad():
                out._as_plain().copy_(input.detach().reshape(out_shape))
        return out

    @classmethod
    def empty(
        cls,
        *shape: Any,
        dtype: torch.dtype | None = None,
        device: Any = None,
        filename: PathLike | None = None,
        existsok: bool = False,
    ) -> MemoryMappedTensor:
        """Uninitialised tensor (a new file reads as zeros).

        Example:
            >>> MemoryMappedTensor.empty(2, 3, dtype=torch.int64).shape
            torch.Size([2, 3])
        """
        _check_cpu_device(device)
        dtype = torch.get_default_dtype() if dtype is None else dtype
        return cls._allocate(_parse_shape(shape), dtype, filename, existsok)

    @classmethod
    def full(
        cls,
        *shape: Any,
        fill_value: Any,
        dtype: torch.dtype | None = None,
        device: Any = None,
        filename: PathLike | None = None,
        existsok: bool = False,
    ) -> MemoryMappedTensor:
        """Tensor filled with ``fill_value``; dtype is inferred like :func:`torch.full`.

        Example:
            >>> MemoryMappedTensor.full((2,), fill_value=7).tolist()
            [7, 7]
        """
        if dtype is None:
            dtype = torch.full((), fill_value).dtype
        out = cls.empty(*shape, dtype=dtype, device=device, filename=filename, existsok=existsok)
        out._as_plain().fill_(fill_value)
        return out

    @classmethod
    def zeros(
        cls,
        *shape: Any,
        dtype: torch.dtype | None = None,
        device: Any = None,
        filename: PathLike | None = None,
        existsok: bool = False,
    ) -> MemoryMappedTensor:
        """Tensor of zeros.

        Example:
            >>> MemoryMappedTensor.zeros(3).tolist()
            [0.0, 0.0, 0.0]
        """
        return cls.full(
            *shape,
            fill_value=0,
            dtype=dtype or torch.get_default_dtype(),
            device=device,
            filename=filename,
            existsok=existsok,
        )

    @classmethod
    def ones(
        cls,
        *shape: Any,
        dtype: torch.dtype | None = None,
        device: Any = None,
        filename: PathLike | None = None,
        existsok: bool = False,
    ) -> MemoryMappedTensor:
        """Tensor of ones.

        Example:
            >>> MemoryMappedTensor.ones(2, dtype=torch.uint8).tolist()
            [1, 1]
        """
        return cls.full(
            *shape,
            fill_value=1,
            dtype=dtype or torch.get_default_dtype(),
            device=device,
            filename=filename,
            existsok=existsok,
        )

    @classmethod
    def empty_like(
        cls,
        input: torch.Tensor,
        *,
        filename: PathLike | None = None,
        dtype: torch.dtype | None = None,
        existsok: bool = False,
    ) -> MemoryMappedTensor:
        """Uninitialised tensor with ``input``'s shape (and dtype unless given).

        Example:
            >>> MemoryMappedTensor.empty_like(torch.ones(2, 2)).shape
            torch.Size([2, 2])
        """
        return cls.empty(
            input.shape, dtype=dtype or input.dtype, filename=filename, existsok=existsok
        )

    @classmethod
    def zeros_like(
        cls,
        input: torch.Tensor,
        *,
        filename: PathLike | None = None,
        dtype: torch.dtype | None = None,
        existsok: bool = False,
    ) -> MemoryMappedTensor:
        """Zeros with ``input``'s shape and dtype.

        Example:
            >>> MemoryMappedTensor.zeros_like(torch.ones(2)).tolist()
            [0.0, 0.0]
        """
        return cls.zeros(
            input.shape, dtype=dtype or input.dtype, filename=filename, existsok=existsok
        )

    @classmethod
    def ones_like(
        cls,
        input: torch.Tensor,
        *,
        filename: PathLike | None = None,
        dtype: torch.dtype | None = None,
        existsok: bool = False,
    ) -> MemoryMappedTensor:
        """Ones with ``input``'s shape and dtype.

        Example:
            >>> MemoryMappedTensor.ones_like(torch.zeros(2, dtype=torch.int32)).tolist()
            [1, 1]
        """
        return cls.ones(
            input.shape, dtype=dtype or input.dtype, filename=filename, existsok=existsok
        )

    @classmethod
    def full_like(
        cls,
        input: torch.Tensor,
        fill_value: Any,
        *,
        filename: PathLike | None = None,
        dtype: torch.dtype | None = None,
        existsok: bool = False,
    ) -> MemoryMappedTensor:
        """``fill_value`` with ``input``'s shape and dtype.

        Example:
            >>> MemoryMappedTensor.full_like(torch.zeros(2), 0.5).tolist()
            [0.5, 0.5]
        """
        return cls.full(
            input.shape,
            fill_value=fill_value,
            dtype=dtype or input.dtype,
            filename=filename,
            existsok=existsok,
        )

    @classmethod
    def from_filename(
        cls,
        filename: PathLike,
        dtype: torch.dtype,
        shape: ShapeLike,
        index: Any = None,
    ) -> MemoryMappedTensor | torch.Tensor:
        """Map an existing file (e.g. one written by another process) without copying it.

        The file must exist and hold at least ``numel * itemsize`` bytes; it is never
        created or resized. ``index`` is applied to the mapped tensor: basic indexing
        (ints, slices, ...) yields a file-backed ``MemoryMappedTensor`` view, while advanced
        indexing (tensor / list indices) yields an in-memory copy, returned as a plain
        :class:`torch.Tensor` so that it is not mistaken for file-backed data.

        Example:
            >>> import tempfile, os
            >>> p = os.path.join(tempfile.mkdtemp(), "a.bin")
            >>> _ = MemoryMappedTensor.from_tensor(torch.arange(4), filename=p)
            >>> MemoryMappedTensor.from_filename(p, torch.int64, (2, 2), index=1).tolist()
            [2, 3]
        """
        filename = os.fspath(filename)
        shape = _parse_shape((shape,))
        numel = _numel(shape)
        needed = numel * _element_size(dtype)
        try:
            size = os.path.getsize(filename)
        except FileNotFoundError:
            raise FileNotFoundError(f"No such memory-mapped file: {filename!r}") from None
        if size < needed:
            raise ValueError(
                f"File {filename!r} has {size} bytes but shape {tuple(shape)} of {dtype} "
                f"needs {needed} bytes."
            )
        flat = _map_file(filename, dtype, numel)
        out = cls._wrap(flat.view(shape), filename)
        if index is None:
            return out
        sub = out[index]  # plain tensor: __torch_function__ is disabled
        if (
            numel
            and sub.numel()
            and sub.untyped_storage().data_ptr() != flat.untyped_storage().data_ptr()
        ):
            return sub
        return cls._wrap(sub, filename)

    # ----------------------------------------------------------- python protocol
    def __reduce_ex__(self, protocol: Any) -> tuple[Any, tuple[Any, ...]]:
        if self._filename is None:
            return _rebuild_anonymous, (self._as_plain(),)
        itemsize = self.element_size()
        storage_numel = self.untyped_storage().nbytes() // itemsize
        if self.is_contiguous() and self.storage_offset() == 0 and storage_numel == self.numel():
            return _rebuild_from_file, (self._filename, self.dtype, tuple(self.shape))
        return _rebuild_from_file, (
            self._filename,
            self.dtype,
            tuple(self.shape),
            tuple(self.stride()),
            self.storage_offset(),
            storage_numel,
        )

    def __deepcopy__(self, memo: dict[int, Any]) -> MemoryMappedTensor:
        # A deep copy gets its own memory; without a filename to write to, that is an
        # anonymous shared-memory segment.
        if id(self) in memo:
            return memo[id(self)]
        out = MemoryMappedTensor.from_tensor(self._as_plain(), filename=None)
        memo[id(self)] = out
        return out

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        body = repr(self._as_plain())
        prefix = "tensor("
        if body.startswith(prefix) and body.endswith(")"):
            body = body[len(prefix) : -1].replace("\n" + " " * len(prefix), "\n" + " " * 19)
        return f"MemoryMappedTensor({body}, filename={self._filename!r})"


# --------------------------------------------------------------------------------------
# raw tensor files
# --------------------------------------------------------------------------------------
def save_tensor_file(path: PathLike, tensor: torch.Tensor, *, fsync: bool = True) -> None:
    """Write the raw bytes of ``tensor`` to ``path`` atomically (temp file + ``os.replace``).

    The tensor is detached, moved to CPU and made contiguous first. The file has no
    header: the reader must know dtype and shape (see :func:`load_tensor_file`). Readers
    never observe a partially written file. With ``fsync=True`` the bytes are flushed to
    disk before the rename.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "t.bin")
        >>> save_tensor_file(p, torch.arange(3, dtype=torch.int16))
        >>> os.path.getsize(p)
        6
    """
    path = os.fspath(path)
    data = _as_cpu_dense(tensor)
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            view = _byte_view(data)
            written = 0
            while written < len(view):
                written += f.write(view[written:])
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def load_tensor_file(
    path: PathLike, dtype: torch.dtype, shape: ShapeLike, mmap: bool = True
) -> MemoryMappedTensor | torch.Tensor:
    """Load a raw tensor file written by :func:`save_tensor_file`.

    With ``mmap=True`` the file is mapped (a :class:`MemoryMappedTensor`, writes go to the
    file); with ``mmap=False`` it is read into a new, private plain tensor. The file size
    must match ``dtype`` and ``shape`` exactly.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "t.bin")
        >>> save_tensor_file(p, torch.eye(2))
        >>> load_tensor_file(p, torch.float32, (2, 2), mmap=False).tolist()
        [[1.0, 0.0], [0.0, 1.0]]
    """
    return _load_tensor_file(os.fspath(path), dtype, _parse_shape((shape,)), mmap)


def _load_tensor_file(path: str, dtype: torch.dtype, shape: torch.Size, mmap: bool) -> torch.Tensor:
    """:func:`load_tensor_file` for a ``str`` path and a parsed shape (``io.load``'s loop)."""
    numel = _numel(shape)
    needed = numel * dtype.itemsize
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise FileNotFoundError(f"No such tensor file: {path!r}") from None
    if size != needed:
        raise ValueError(
            f"Tensor file {path!r} has {size} bytes, expected {needed} for shape "
            f"{tuple(shape)} and dtype {dtype}."
        )
    return _open_sized(path, dtype, shape, numel, mmap)


def _open_sized(path: str, dtype: torch.dtype, shape: torch.Size, numel: int, mmap: bool) -> torch.Tensor:
    """Maps or reads a raw tensor file whose size the caller checked against ``shape``."""
    if mmap:  # the size was checked, so map directly (from_filename would stat again)
        return MemoryMappedTensor._wrap(_map_file(path, dtype, numel).view(shape), path)
    out = torch.empty(shape, dtype=dtype)
    view = _byte_view(out)
    with open(path, "rb") as f:
        read = 0
        while read < len(view):
            n = f.readinto(view[read:])
            if not n:
                raise ValueError(f"Tensor file {path!r} was truncated while reading.")
            read += n
    return out
