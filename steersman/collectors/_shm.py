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
import os
import socket
import struct

from steersman.envs.batched.shm import HAS_MEMFD, SharedMemory, map_fd

__all__ = ["SharedMemory", "FdReader", "send_with_fd", "map_fd", "HAS_MEMFD"]

_HDR = struct.Struct("!i")  # multiprocessing.Connection's framing: a 4-byte length


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
