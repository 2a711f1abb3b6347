"""Anonymous shared memory: :class:`SharedMemory`, a ``uint8`` tensor over a Linux
``memfd``. It never has a name (nothing can be left behind in ``/dev/shm``, whatever
happens to the processes) and the kernel frees it once no process maps it. Pickled while a
``multiprocessing`` process starts, it hands its descriptor to the child, which maps the
same memory. Without ``memfd`` (non-Linux) it falls back to torch's ``share_memory_()``.

Used by :class:`~steersman.envs.ParallelEnv` (its step buffer) and the multi-process
collectors (their batches).
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import torch
from torch import Tensor

__all__ = ["HAS_MEMFD", "SharedMemory", "map_fd"]

HAS_MEMFD = hasattr(os, "memfd_create")


def map_fd(fd: int, nbytes: int) -> Tensor:
    """Maps ``nbytes`` of the file ``fd`` shared and returns them as a ``uint8`` tensor
    (the mapping lives as long as the tensor; ``fd`` may be closed afterwards)."""
    mm = mmap.mmap(fd, max(nbytes, 1))
    return torch.frombuffer(mm, dtype=torch.uint8)[:nbytes]


def _rebuild(dupfd: Any, nbytes: int) -> SharedMemory:
    fd = dupfd.detach()
    try:
        return SharedMemory(nbytes, fd=fd)
    finally:
        os.close(fd)


class SharedMemory:
    """``nbytes`` of anonymous shared memory as a ``uint8`` tensor (:attr:`tensor`).

    Args:
        nbytes: the size.
        name: the memfd's name (shows in ``/proc/<pid>/maps``; it is not a file name).
        fd: map this existing descriptor instead of creating memory (the caller keeps
            ownership of ``fd``).

    Pickling (only while a ``multiprocessing`` process is being started) hands the
    descriptor to the child, which maps the same memory.

    Example:
        >>> from steersman.envs.batched.shm import SharedMemory
        >>> mem = SharedMemory(16)
        >>> mem.tensor.shape, int(mem.tensor.sum())
        (torch.Size([16]), 0)
        >>> mem.close_fd()   # the mapping stays valid
        >>> mem.tensor[0] = 7
    """

    def __init__(self, nbytes: int, name: str = "steersman-shm", fd: int | None = None) -> None:
        self.nbytes = int(nbytes)
        self._fd: int | None = None
        if fd is not None:
            self.tensor = map_fd(fd, self.nbytes)
        elif HAS_MEMFD:
            new = os.memfd_create(name, getattr(os, "MFD_CLOEXEC", 0))
            try:
                os.ftruncate(new, max(self.nbytes, 1))
                self.tensor = map_fd(new, self.nbytes)
            except BaseException:
                os.close(new)
                raise
            self._fd = new
        else:  # pragma: no cover - non-Linux
            self.tensor = torch.zeros(self.nbytes, dtype=torch.uint8).share_memory_()

    @property
    def fd(self) -> int | None:
        """The memfd's descriptor (None once closed, or without memfd)."""
        return self._fd

    def close_fd(self) -> None:
        """Closes the descriptor; the memory stays mapped here (and wherever it was sent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __reduce__(self) -> Any:
        if self._fd is None:
            return (_from_tensor, (self.tensor,))
        from multiprocessing.reduction import DupFd

        return (_rebuild, (DupFd(self._fd), self.nbytes))

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


def _from_tensor(t: Tensor) -> SharedMemory:  # pragma: no cover - non-Linux
    out = SharedMemory.__new__(SharedMemory)
    out.nbytes = t.numel()
    out._fd = None
    out.tensor = t
    return out
