"""Anonymous shared memory for the multi-process collectors, and passing it between processes.

:class:`SharedMemory` is a ``uint8`` tensor over a Linux ``memfd``: it never has a name
(nothing can be left behind in ``/dev/shm``, whatever happens to the processes) and the
kernel frees it once no process maps it. It reaches another process either as an
argument of ``multiprocessing.Process`` (pickled while the process starts: the
descriptor travels with it, as ``multiprocessing`` does for pipes), or as a descriptor
sent explicitly over a Unix socket (:func:`send_with_fd` / :class:`FdReader`): a worker
that sizes its batch buffer from its first transition creates the memory and sends
it to the parent once.

Without ``memfd`` (non-Linux), :class:`SharedMemory` falls back to torch's
``share_memory_()`` and the collectors send batches through their pipes instead.
"""

from __future__ import annotations

import array
import mmap
import os
import socket
import struct
from typing import Any

import torch
from torch import Tensor

__all__ = ["SharedMemory", "FdReader", "send_with_fd", "map_fd", "HAS_MEMFD"]

HAS_MEMFD = hasattr(os, "memfd_create")
_HDR = struct.Struct("!i")  # multiprocessing.Connection's framing: a 4-byte length


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
        >>> from steersman.collectors._shm import SharedMemory
        >>> mem = SharedMemory(16)
        >>> mem.tensor.shape, int(mem.tensor.sum())
        (torch.Size([16]), 0)
        >>> mem.close_fd()   # the mapping stays valid
        >>> mem.tensor[0] = 7
    """

    def __init__(self, nbytes: int, name: str = "steersman-collector", fd: int | None = None) -> None:
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


def send_with_fd(conn_fd: int, payload: bytes, fd: int) -> None:
    """Sends the framed message ``payload`` on the Unix socket ``conn_fd`` with the descriptor
    ``fd`` attached (``SCM_RIGHTS``); the peer reads it with :class:`FdReader`."""
    data = _HDR.pack(len(payload)) + payload
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=conn_fd)
    try:
        n = sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
        view = memoryview(data)[n:]
        while view:
            view = view[sock.send(view):]
    finally:
        sock.detach()  # the descriptor belongs to the connection


class FdReader:
    """Reads framed messages (``multiprocessing.Connection``'s format) from a Unix socket,
    collecting the descriptors that arrive with them in :attr:`fds`.

    ``os.read`` would silently drop descriptors attached to the bytes it reads; this
    reader uses ``recvmsg`` for every read, so none is lost.
    """

    __slots__ = ("_sock", "buf", "fds")

    def __init__(self, conn_fd: int) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=conn_fd)
        self.buf = b""
        self.fds: list[int] = []

    def recv(self) -> bytes:
        """The next message's payload. Raises ``EOFError`` when the peer has closed."""
        buf = self.buf
        while True:
            if len(buf) >= 4:
                need = 4 + _HDR.unpack_from(buf)[0]
                if len(buf) >= need:
                    self.buf = buf[need:]
                    return buf[4:need]
            data, anc, _, _ = self._sock.recvmsg(1 << 16, socket.CMSG_SPACE(16))
            for level, kind, cdata in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds = array.array("i")
                    fds.frombytes(cdata[: len(cdata) - len(cdata) % fds.itemsize])
                    self.fds.extend(fds)
            if not data:
                raise EOFError
            buf += data

    def detach(self) -> None:
        """Releases the socket object (the descriptor stays the connection's) and closes
        descriptors received but never claimed."""
        self._sock.detach()
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []
