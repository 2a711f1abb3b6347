"""Passing anonymous shared memory from a collector worker to its parent.

A worker sizes its batch buffer from its first transition, so it creates the memory
itself (:class:`SharedMemory`, a memfd: no name in ``/dev/shm``, freed by the kernel
once no process maps it) and sends the descriptor to the parent once, attached to a
message (:func:`send_with_fd`); the parent reads it with
``envs.batched.pool.FrameReader(fd, with_fds=True)`` and maps it (:func:`map_fd`).
Without ``memfd`` (non-Linux) the collectors send batches through their pipes instead.
"""

from __future__ import annotations

import array
import socket

from steersman.envs.batched.pool import frame
from steersman.envs.batched.shm import HAS_MEMFD, SharedMemory, map_fd

__all__ = ["SharedMemory", "send_with_fd", "map_fd", "HAS_MEMFD"]


def send_with_fd(conn_fd: int, payload: bytes, fd: int) -> None:
    """Sends the framed message ``payload`` on the Unix socket ``conn_fd`` with the descriptor
    ``fd`` attached (``SCM_RIGHTS``)."""
    data = frame(payload)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=conn_fd)
    try:
        n = sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
        view = memoryview(data)[n:]
        while view:
            view = view[sock.send(view):]
    finally:
        sock.detach()  # the descriptor belongs to the connection
