"""One pool of worker processes, shared by :class:`~steersman.envs.ParallelEnv` and the
multi-process collectors (``steersman.collectors.multi``).

Worker side: :func:`bootstrap` (the process target: the parent watchdog, signals, torch
threads, global seeds, then the owner's worker function), :func:`serve` (the command
loop: a reply or a packed exception per message, ``CLOSE`` ends it).

Parent side: :class:`WorkerPool` starts the processes (``forkserver`` by default, see
:func:`default_start_method`), sends framed messages and waits for replies with
``select.poll`` over every pipe *and* process sentinel, so a worker that raises is
reported with its exception, one that dies with its exit code or signal, and one that
does not answer within the timeout is killed at once and reported. Closing (explicit,
at garbage collection, or at interpreter exit) sends ``CLOSE``, then SIGTERM, then
SIGKILL to the stragglers. No named semaphore, lock or shared-memory file is created.

Wire format: ``multiprocessing.Connection``'s framing (a 4-byte big-endian length, then
the payload), written and read straight on the descriptor. The first byte of a reply is
``K`` (or another owner-defined byte) for success, ``E`` + pickled ``(type name,
message, traceback)`` for an exception.

Workers exit when their parent dies, even by SIGKILL: ``PR_SET_PDEATHSIG`` (Linux), a
thread watching ``os.getppid()``, and EOF on their pipe.
"""

from __future__ import annotations

import array
import atexit
import ctypes
import multiprocessing
import os
import pickle
import random
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["WorkerPool", "bootstrap", "serve", "dumps", "default_start_method", "prepare_forkserver",
           "frame", "send_frame", "FrameReader", "pack_error", "unpack_error", "OK", "ERR", "CLOSE"]

OK = b"K"
ERR = b"E"
CLOSE = b"C"[0]  # the close command, first byte of a parent message in every protocol

#: the worker's parent-watchdog period (seconds).
WATCHDOG_PERIOD = 0.5
_POLL_TICK_MS = 1000  # liveness is re-checked at least this often while waiting


# ---------------------------------------------------------------------- framing
_HDR = struct.Struct("!i")


def frame(payload: bytes) -> bytes:
    """``payload`` with its length header (what ``Connection.send_bytes`` writes)."""
    return _HDR.pack(len(payload)) + payload


def send_frame(fd: int, data: bytes) -> None:
    """Writes a framed message completely (``os.write`` may write part of a large one)."""
    n = os.write(fd, data)
    if n < len(data):
        view = memoryview(data)[n:]
        while view:
            view = view[os.write(fd, view):]


class FrameReader:
    """Reads framed messages from a descriptor; keeps what it read past a message.

    With ``with_fds``, reads with ``recvmsg`` (the descriptor is a Unix socket) and keeps
    the descriptors that arrive with the bytes in :attr:`fds` (``os.read`` would drop
    them); otherwise with ``os.read``, one system call per message in the common case.
    """

    __slots__ = ("fd", "buf", "fds", "_sock", "_read")

    def __init__(self, fd: int, with_fds: bool = False) -> None:
        self.fd = fd
        self.buf = b""
        self.fds: list[int] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=fd) if with_fds else None
        self._read = self._read_with_fds if with_fds else os.read

    def _read_with_fds(self, fd: int, n: int) -> bytes:
        data, anc, _, _ = self._sock.recvmsg(n, socket.CMSG_SPACE(16))
        for level, kind, cdata in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(cdata[: len(cdata) - len(cdata) % fds.itemsize])
                self.fds.extend(fds)
        return data

    def recv(self) -> bytes:
        """The next message's payload. Raises ``EOFError`` when the peer has closed."""
        buf = self.buf
        need = 4
        while True:
            if len(buf) >= 4:
                need = 4 + _HDR.unpack_from(buf)[0]
                if len(buf) >= need:
                    self.buf = buf[need:]
                    return buf[4:need]
            chunk = self._read(self.fd, max(65536, need - len(buf)))
            if not chunk:
                raise EOFError
            buf += chunk

    def detach(self) -> None:
        """Releases the socket object (the descriptor stays the connection's) and closes
        descriptors received but never claimed."""
        if self._sock is not None:
            self._sock.detach()
            self._sock = None
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []


# ---------------------------------------------------------------------- errors
def pack_error(exc: BaseException) -> bytes:
    """``ERR`` + the pickled ``(type name, message, formatted traceback)`` (strings only)."""
    tname = type(exc).__qualname__
    mod = type(exc).__module__
    if mod not in ("builtins", None):
        tname = f"{mod}.{tname}"
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return ERR + pickle.dumps((tname, str(exc), tb))


def unpack_error(msg: bytes) -> tuple[str, str, str]:
    try:
        return pickle.loads(msg[1:])
    except Exception:  # noqa: BLE001 - a garbled message is still an error
        return ("UnknownError", repr(msg[:200]), "")


def dumps(obj: Any, owner: str, what: str) -> bytes:
    """``obj`` pickled for a worker: the standard pickler (tensors by value), or
    ``cloudpickle`` for what it cannot serialize (lambdas, closures, local functions) and
    for what refers to ``__main__`` (sent by value: a worker cannot import the ``__main__``
    of a notebook or of ``python -c``).

    Raises ``TypeError`` naming ``what`` when neither can."""
    data: bytes | None = None
    first: Exception | None = None
    try:
        data = pickle.dumps(obj)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        first = exc
    if data is not None and b"__main__" not in data:
        return data
    try:
        import cloudpickle

        return cloudpickle.dumps(obj)
    except Exception as exc:  # noqa: BLE001 - ImportError, or cloudpickle's many kinds
        if data is not None:
            return data
        hint = ("not even by cloudpickle" if not isinstance(exc, ImportError)
                else "and cloudpickle, which sends lambdas and closures, is not installed")
        raise TypeError(
            f"{owner}: {what} cannot be pickled ({first}), {hint}; the worker processes need it"
        ) from first


# ---------------------------------------------------------------------- worker side
def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """``prctl(PR_SET_PDEATHSIG, sig)`` on Linux: the kernel sends ``sig`` to this process
    when the thread that created it exits. Returns whether it was set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(1, int(sig), 0, 0, 0) == 0  # 1 == PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return False


def _watchdog(ppid: int, period: float) -> None:
    """Exits the process as soon as its parent is gone (it has been re-parented)."""
    while True:
        time.sleep(period)
        if os.getppid() != ppid:
            os._exit(70)


def start_parent_watchdog(expected_ppid: int | None, pdeathsig: bool) -> None:
    """Makes this worker exit when its parent dies, even by SIGKILL: the kernel's
    parent-death signal (Linux; armed only when the starting thread outlives the worker)
    and a daemon thread polling ``os.getppid()``; EOF on the pipe is the third way."""
    ppid = os.getppid()
    if pdeathsig:
        set_parent_death_signal(signal.SIGKILL)
    if expected_ppid is not None and ppid != expected_ppid:
        os._exit(70)  # the parent died before the signal was armed
    threading.Thread(target=_watchdog, args=(ppid, WATCHDOG_PERIOD), daemon=True,
                     name="steersman-parent-watchdog").start()


def bootstrap(target: Callable[..., None], idx: int, conn: Any, expected_ppid: int | None,
              pdeathsig: bool, seed: int, num_threads: int | None, close_fds: tuple[int, ...],
              args: tuple) -> None:
    """The worker process's target: parent watchdog, signals (Ctrl-C is the parent's),
    torch threads, global RNG seeds (torch, numpy, ``random``), then ``target(idx, conn,
    *args)``. ``close_fds``: the other workers' parent-side pipe ends (``fork`` only)."""
    start_parent_watchdog(expected_ppid, pdeathsig)
    for fd in close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % (2**32))
    target(idx, conn, *args)


def serve(fd: int, setup: Callable[[], tuple[Callable[[bytes], bytes | None], Callable[[], Any], bytes]]
          ) -> None:
    """The worker's life after :func:`bootstrap`: ``setup()`` builds what it serves and
    returns ``(handle, close, hello)``; ``hello`` is the first reply (a failing setup is
    reported packed instead). Then the command loop: ``handle(message)`` returns the reply
    (``None``: it has replied itself), an exception is sent packed; ``CLOSE`` runs
    ``close()``, replies and returns; so does EOF (the parent is gone)."""
    try:
        handle, close, hello = setup()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        send_frame(fd, frame(pack_error(exc)))
        return
    send_frame(fd, frame(hello))
    recv = FrameReader(fd).recv
    frames: dict[bytes, bytes] = {}
    closed = False
    try:
        while True:
            try:
                msg = recv()
            except (EOFError, OSError):
                return
            try:
                if msg[0] == CLOSE:
                    closed = True
                    close()
                    reply: bytes | None = OK
                else:
                    reply = handle(msg)
            except Exception as exc:  # noqa: BLE001 - reported to the parent
                reply = pack_error(exc)
            if reply is not None:
                data = frames.get(reply) if len(reply) == 1 else None
                if data is None:
                    data = frame(reply)
                    if len(reply) == 1:
                        frames[reply] = data
                try:
                    send_frame(fd, data)
                except OSError:
                    return
            if closed:
                return
    finally:
        if not closed:
            try:
                close()
            except Exception:  # noqa: BLE001 - the parent is gone or closing
                pass


# ---------------------------------------------------------------------- start-up
def default_start_method() -> str:
    """``"forkserver"`` where available (Linux, macOS), else ``"spawn"``.

    Both start workers from a clean single-threaded process, so neither inherits
    torch's thread pools, CUDA state or locks held by other threads of the parent
    (``fork`` can deadlock on those). ``forkserver`` forks each worker from a server
    process that has already imported torch and steersman, so after the first pool of a
    program (which starts the server, about as long as one ``spawn``) a worker starts in
    milliseconds instead of re-importing torch.
    """
    methods = multiprocessing.get_all_start_methods()
    return "forkserver" if "forkserver" in methods else "spawn"


def check_start_method(method: str | None, owner: str) -> str:
    """``method`` (default :func:`default_start_method`), checked to be available."""
    out = method or default_start_method()
    if out not in multiprocessing.get_all_start_methods():
        raise ValueError(
            f"{owner}: mp_start_method must be one of {multiprocessing.get_all_start_methods()}, got {method!r}"
        )
    return out


def prepare_forkserver(preload: Iterable[str]) -> None:
    """Adds ``preload`` to the forkserver's preloaded modules (once, before it starts).
    Keeps modules the user asked for; no effect once the server runs."""
    try:
        from multiprocessing import forkserver

        server = forkserver._forkserver  # type: ignore[attr-defined]
        if getattr(server, "_forkserver_pid", None) is not None:
            return
        mods = list(getattr(server, "_preload_modules", None) or ["__main__"])
        new = [m for m in preload if m not in mods]
        if new:
            server.set_forkserver_preload(mods + new)
    except Exception:  # noqa: BLE001 - a missing preload only costs start-up time
        pass


# ---------------------------------------------------------------------- shutdown
def _alive(p: Any) -> bool:
    try:
        return p.is_alive()
    except Exception:  # noqa: BLE001 - closed process object
        return False


def _signal_all(procs: Iterable, stop: str) -> None:
    alive = [p for p in procs if _alive(p)]
    for p in alive:
        try:
            getattr(p, stop)()
        except Exception:  # noqa: BLE001
            pass
    for p in alive:
        try:
            p.join(2.0)
        except Exception:  # noqa: BLE001
            pass


def _close_quietly(objs: Iterable) -> None:
    for obj in objs:
        try:
            obj.close()
        except Exception:  # noqa: BLE001 - a process alive after SIGKILL cannot be closed
            pass


def _shutdown(procs: list, conns: list, readers: list, close_timeout: float, owner_pid: int) -> None:
    """Stops the workers: ``CLOSE`` on each pipe, a join until ``close_timeout``, then
    SIGTERM, then SIGKILL; closes the pipes. Never raises.

    Module-level (the pool's ``weakref.finalize`` callback must not hold the pool). Does
    nothing in a process forked from the owner (its exit must not stop the owner's
    workers)."""
    if os.getpid() != owner_pid:
        return
    close_msg = frame(bytes((CLOSE, 0)))
    for conn in conns:
        try:
            send_frame(conn.fileno(), close_msg)
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + close_timeout
    for p in procs:
        try:
            p.join(max(0.0, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001
            pass
    _signal_all(procs, "terminate")
    _signal_all(procs, "kill")
    for r in readers:
        r.detach()
    _close_quietly(conns)
    _close_quietly(procs)
    procs.clear()
    conns.clear()
    readers.clear()


_LIVE: weakref.WeakSet = weakref.WeakSet()
_ATEXIT_REGISTERED = False


def _close_all_at_exit() -> None:
    """Closes the pools still open at interpreter exit, gracefully.

    Registered (once) after ``multiprocessing`` set up its own exit handler, so it runs
    first: the workers get ``CLOSE`` (their envs' ``close()`` runs) before
    ``multiprocessing`` terminates daemonic workers or joins the others."""
    for pool in list(_LIVE):
        pool.close()


def describe_exit(code: int | None) -> str:
    """``"exited with code 3"``, ``"was killed by signal SIGKILL"`` ..."""
    if code is None:
        return "stopped answering (its pipe closed)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return f"was killed by signal {name}"
    return f"exited with code {code}"


# ---------------------------------------------------------------------- the pool
class WorkerPool:
    """The parent side of a set of worker processes: start, send, wait, fail, close.

    Args:
        owner: the owner's name in messages (``"ParallelEnv"``, ``"MultiSyncDataCollector"``).
        error: the exception class raised for a failing worker (built with the message
            and ``worker_index``, ``exc_type``, ``exc_message``, ``worker_traceback``,
            ``exitcode`` keywords).
        what_closed: how the message says the owner was closed (``"the env was closed"``).
        on_fail: called (weakly bound) before a fatal error is raised: the owner's close.
        close_timeout: seconds :meth:`close` waits for workers to exit before SIGTERM.
        with_fds: read replies with :class:`FrameReader` ``with_fds`` (workers send
            descriptors).

    A worker that dies, or does not answer within the timeout, is fatal: the pool kills
    that worker at once, closes the others, calls ``on_fail`` and raises. A worker that
    raises is fatal too, unless :meth:`wait` is told ``keep_open``: then the other
    replies are collected first and the error is raised with every worker still running.
    """

    def __init__(self, owner: str, error: type[Exception], what_closed: str,
                 on_fail: Callable[[], Any] | None = None, close_timeout: float = 10.0,
                 with_fds: bool = False) -> None:
        self.owner = owner
        self.error = error
        self.what_closed = what_closed
        self._on_fail = weakref.WeakMethod(on_fail) if on_fail is not None else None
        self.with_fds = with_fds
        self.procs: list = []
        self.conns: list = []
        self.readers: list[FrameReader] = []
        self.fds: list[int] = []
        self.inflight: set[int] = set()  # workers sent a command whose reply is not read yet
        self.sent_at: list[float] = []  # when each worker was last sent a command (or started)
        self._poller: Any = None
        self._fdmap: dict[int, tuple[int, bool]] = {}
        self._finalizer = weakref.finalize(self, _shutdown, self.procs, self.conns, self.readers,
                                           float(close_timeout), os.getpid())
        global _ATEXIT_REGISTERED
        if not _ATEXIT_REGISTERED:
            atexit.register(_close_all_at_exit)
            _ATEXIT_REGISTERED = True
        _LIVE.add(self)

    @property
    def pids(self) -> list[int]:
        """The workers' process ids (empty once closed)."""
        return [p.pid for p in self.procs]

    def start(self, target: Callable[..., None], args: Sequence[tuple], seeds: Sequence[int], *,
              method: str, daemon: bool, num_threads: int | None, start_timeout: float,
              preload: Iterable[str] = ()) -> dict[int, bytes]:
        """Starts one process per entry of ``args`` running ``bootstrap(target, i, conn, ...,
        args[i])`` and waits for each one's first reply (returned). Closes the pool and
        raises on failure."""
        ctx = multiprocessing.get_context(method)
        if method == "forkserver":
            prepare_forkserver(("torch", "steersman.envs", *preload))
        # PR_SET_PDEATHSIG fires when the *thread* that started the worker exits: arm it
        # only when that thread lives as long as the process (the main thread, or the
        # forkserver's); the getppid watchdog and pipe EOF cover the other cases.
        pdeathsig = method == "forkserver" or threading.current_thread() is threading.main_thread()
        expected_ppid = None if method == "forkserver" else os.getpid()
        try:
            for i, (worker_args, seed) in enumerate(zip(args, seeds)):
                parent_conn, child_conn = ctx.Pipe(duplex=True)
                close_fds = tuple(self.fds) if method == "fork" else ()
                proc = ctx.Process(
                    target=bootstrap,
                    args=(target, i, child_conn, expected_ppid, pdeathsig, seed, num_threads, close_fds,
                          worker_args),
                    name=f"{self.owner}-worker-{i}", daemon=daemon,
                )
                try:
                    proc.start()
                except BaseException:
                    parent_conn.close()
                    raise
                finally:
                    child_conn.close()
                self.procs.append(proc)
                self.conns.append(parent_conn)
                self.fds.append(parent_conn.fileno())
                self.readers.append(FrameReader(parent_conn.fileno(), self.with_fds))
            self._poller = select.poll()
            mask = select.POLLIN | select.POLLHUP | select.POLLERR
            for i, (p, fd) in enumerate(zip(self.procs, self.fds)):
                self._poller.register(fd, mask)
                self._poller.register(p.sentinel, mask)
                self._fdmap[fd] = (i, True)
                self._fdmap[p.sentinel] = (i, False)
            workers = range(len(self.procs))
            self.inflight.update(workers)
            self.sent_at[:] = [time.monotonic()] * len(self.procs)
            return self.wait(workers, "start-up", start_timeout)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ messages
    def send(self, i: int, data: bytes, what: str) -> None:
        """Sends the framed message ``data`` to worker ``i`` (its reply is then awaited)."""
        self.inflight.add(i)
        self.sent_at[i] = time.monotonic()
        try:
            send_frame(self.fds[i], data)
        except OSError:
            self._dead(i, what)

    def wait(self, workers: Iterable[int], what: str, timeout: float | None, first: bool = False,
             keep_open: bool = False) -> dict[int, bytes]:
        """Waits for one reply from each of ``workers`` (or, with ``first``, for the replies
        ready when the first one is); fails fast on deaths, errors and the timeout.

        ``keep_open``: a worker that raised is reported after the others replied, with the
        pool left open (its exception did not end it)."""
        out: dict[int, bytes] = {}
        left = set(workers)
        readers = self.readers
        fdmap = self._fdmap
        poll = self._poller.poll
        raised: tuple[int, bytes] | None = None
        sent_at = self.sent_at
        while left and not (first and out):
            if timeout is None:
                wait_ms = _POLL_TICK_MS
            else:  # each worker has ``timeout`` seconds from when it was sent its command
                remaining = min(sent_at[i] for i in left) + timeout - time.monotonic()
                if remaining <= 0:
                    self._timed_out(left, what, timeout)
                wait_ms = min(_POLL_TICK_MS, max(1, int(remaining * 1000) + 1))
            events = poll(wait_ms)
            if not events:
                for i in sorted(left):
                    if not self.procs[i].is_alive():
                        self._dead(i, what)
                continue
            for fd, _ in events:
                i, is_conn = fdmap[fd]
                if not is_conn:
                    self._dead(i, what)
                try:
                    msg = readers[i].recv()
                except (EOFError, OSError):
                    self._dead(i, what)
                if i not in left:  # pragma: no cover - protocol violation
                    self._fail(self.error(f"{self.owner} worker {i} sent an unexpected message during "
                                          f"{what}; {self.what_closed}", worker_index=i))
                left.discard(i)
                self.inflight.discard(i)
                if msg[:1] == ERR:
                    if not keep_open:
                        self._raised(i, msg, what, fatal=True)
                    if raised is None or i < raised[0]:  # the lowest index, whatever the order
                        raised = (i, msg)
                    continue
                out[i] = msg
        if raised is not None:
            self._raised(*raised, what, fatal=False)
        return out

    # ------------------------------------------------------------------ failures
    def _fail(self, err: Exception) -> None:
        try:
            self.close()
            cb = self._on_fail() if self._on_fail is not None else None
            if cb is not None:
                cb()
        finally:
            raise err

    def _raised(self, i: int, msg: bytes, what: str, fatal: bool) -> None:
        tname, text, tb = unpack_error(msg)
        hint = ""
        if what == "start-up" and "__main__" in text:
            hint = (" (the worker could not import a function defined in __main__, e.g. in a notebook: "
                    "define it in an importable module)")
        state = self.what_closed if fatal else "nothing was closed, every worker still runs"
        err = self.error(
            f"{self.owner} worker {i} raised {tname}: {text}{hint} (during {what}); {state}.\n"
            f"Worker {i} traceback:\n{tb}",
            worker_index=i, exc_type=tname, exc_message=text, worker_traceback=tb,
        )
        if fatal:
            self._fail(err)
        raise err

    def _dead(self, i: int, what: str) -> None:
        proc, reader = self.procs[i], self.readers[i]
        try:  # it may have sent its exception just before exiting
            if self.conns[i].poll(0):
                msg = reader.recv()
                if msg[:1] == ERR:
                    self._raised(i, msg, what, fatal=True)
        except (EOFError, OSError):
            pass
        proc.join(2.0)
        code = proc.exitcode
        self._fail(self.error(
            f"{self.owner} worker {i} (pid {proc.pid}) {describe_exit(code)} during {what}; {self.what_closed}",
            worker_index=i, exitcode=code,
        ))

    def _timed_out(self, left: set[int], what: str, timeout: float) -> None:
        """Kills the workers that did not answer in time at once (SIGKILL also ends a
        stopped process), then fails."""
        now = time.monotonic()
        workers = sorted(i for i in left if now - self.sent_at[i] >= timeout)
        pids = [self.procs[i].pid for i in workers]
        for i in workers:
            try:
                self.procs[i].kill()
            except Exception:  # noqa: BLE001 - already gone
                pass
        i = workers[0]
        self._fail(self.error(
            f"{self.owner} worker {i} (pid {pids[0]}) did not answer {what} within {timeout} s and was "
            f"killed; {self.what_closed}", worker_index=i,
        ))

    def close(self) -> None:
        """Stops the workers and releases the pipes (idempotent)."""
        _LIVE.discard(self)
        self._finalizer()
        self._poller = None
        self.inflight.clear()
        self.fds.clear()
