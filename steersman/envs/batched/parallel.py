"""``ParallelEnv``: one worker process per sub-env, data in preallocated shared memory.

Design (see also ``_buffers`` and ``worker``):

* Buffers: one ``uint8 [num_workers, row_bytes]`` tensor in anonymous shared memory,
  laid out from the sub-env's specs; each spec leaf is a typed view. The parent writes
  actions there and reads observations/rewards/dones back; nothing is pickled per step.
* Commands: a 2-byte message per worker through its pipe (one wake-up per worker per
  step), a 1-byte reply. ``step_and_maybe_reset`` is a single command (the worker
  steps and resets its finished sub-envs), so rollouts cost one round trip per step.
* Waiting: ``select.poll`` over every worker's pipe *and* process sentinel, so a worker
  that raises is reported with its exception and one that dies with its exit code or
  signal, within milliseconds; an optional ``timeout`` bounds slow steps.
* Parent death: workers set ``PR_SET_PDEATHSIG`` (Linux), run a thread watching
  ``os.getppid()``, and exit on EOF of their pipe.
* Cleanup: ``close()`` (idempotent; also run by a ``weakref.finalize`` at garbage
  collection or interpreter exit) asks workers to close their envs, then terminates
  and kills stragglers. No named semaphore, lock or shared-memory file is ever
  created, so nothing can outlive the processes.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import pickle
import select
import signal
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from ..utils import _splitmix64
from ._base import BatchedEnvBase, CreateEnvFn, EnvWorkerError, make_creators
from ._buffers import SharedBuffer
from .worker import (
    CLOSE,
    DATA_COMMANDS,
    ERR,
    OK_RESET,
    SEED,
    STEP,
    STEP_RESET,
    FrameReader,
    frame,
    send_frame,
    unpack_error,
    worker_main,
)

__all__ = ["ParallelEnv", "default_start_method"]

_OK_RESET = OK_RESET[0]
_POLL_TICK_MS = 1000  # liveness is re-checked at least this often while waiting


def default_start_method() -> str:
    """``"forkserver"`` where available (Linux, macOS), else ``"spawn"``.

    Both start workers from a clean single-threaded process, so neither inherits
    torch's thread pools, CUDA state or locks held by other threads of the parent
    (``fork`` can deadlock on those). ``forkserver`` forks each worker from a server
    process that has already imported torch and steersman, so after the first
    ``ParallelEnv`` of a program (which starts the server, about as long as one
    ``spawn``) a worker starts in milliseconds instead of re-importing torch.
    """
    methods = multiprocessing.get_all_start_methods()
    return "forkserver" if "forkserver" in methods else "spawn"


# modules every worker needs, imported once by the forkserver instead of once per worker
_PRELOAD = ("torch", "steersman.envs", "steersman.envs.batched.worker")


def prepare_forkserver(preload: tuple[str, ...] = _PRELOAD) -> None:
    """Adds ``preload`` (default: torch and steersman's envs) to the forkserver's preloaded
    modules (once, before it starts). Keeps modules the user asked for; no effect once the
    server runs. Also used by the multi-process collectors."""
    try:
        from multiprocessing import forkserver

        server = forkserver._forkserver  # type: ignore[attr-defined]
        if getattr(server, "_forkserver_pid", None) is not None:
            return
        mods = list(getattr(server, "_preload_modules", None) or ["__main__"])
        if all(m in mods for m in preload):
            return
        server.set_forkserver_preload(mods + [m for m in preload if m not in mods])
    except Exception:  # noqa: BLE001 - a missing preload only costs start-up time
        pass


def stop_processes(procs: list, conns: list, close_message: bytes, close_timeout: float) -> None:
    """Stops worker processes: ``close_message`` on each pipe, a join until ``close_timeout``,
    then SIGTERM, then SIGKILL for the ones still alive. Never raises. Shared by
    :class:`ParallelEnv` and the multi-process collectors."""
    for conn in conns:
        try:
            conn.send_bytes(close_message)
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + close_timeout
    for p in procs:
        try:
            p.join(max(0.0, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001
            pass
    for stop in ("terminate", "kill"):
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


def close_quietly(objs: list) -> None:
    """``obj.close()`` on each pipe/process, ignoring errors (a process still running after
    SIGKILL cannot be closed: nothing more to do)."""
    for obj in objs:
        try:
            obj.close()
        except Exception:  # noqa: BLE001
            pass


def _shutdown(procs: list, conns: list, close_timeout: float, owner_pid: int) -> None:
    """Closes the workers: a close command, then SIGTERM, then SIGKILL; closes the pipes.

    Module-level (it is the env's ``weakref.finalize`` callback: it must not hold the env).
    Does nothing in a process forked from the owner (its exit must not stop the owner's
    workers).
    """
    if os.getpid() != owner_pid:
        return
    stop_processes(procs, conns, bytes((CLOSE, 0)), close_timeout)
    close_quietly(conns)
    close_quietly(procs)
    procs.clear()
    conns.clear()


_LIVE_ENVS: weakref.WeakSet = weakref.WeakSet()
_ATEXIT_REGISTERED = False


def _close_all_at_exit() -> None:
    """Closes the ParallelEnvs still open at interpreter exit, gracefully.

    Registered (once) after ``multiprocessing`` set up its own exit handler, so it runs
    first: the workers get a close command (their envs' ``close()`` runs) before
    ``multiprocessing`` would terminate the daemonic workers.
    """
    for env in list(_LIVE_ENVS):
        env._finalizer()


def _alive(p: Any) -> bool:
    try:
        return p.is_alive()
    except Exception:  # noqa: BLE001 - closed process object
        return False


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "stopped answering (its pipe closed)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return f"was killed by signal {name}"
    return f"exited with code {code}"


class ParallelEnv(BatchedEnvBase):
    """Batches ``num_workers`` envs, each in its own worker process, stepped in parallel.

    Behaves like one env of batch size ``[num_workers, *sub_batch]`` and returns the
    same data as a :class:`SerialEnv` with the same arguments (same seed: same
    rollouts). Actions and results travel through shared memory preallocated from the
    specs; each step sends one small message per worker and nothing is pickled.
    ``step_and_maybe_reset`` (used by ``rollout(..., break_when_any_done=False)`` and
    collectors) steps and resets finished sub-envs in one round trip.

    Reliability: a worker that raises (in ``_step``, ``_reset`` ...) is reported as
    :class:`EnvWorkerError` naming the worker, the exception type, its message and the
    worker traceback; one that dies (``os._exit``, a signal) with its exit code or
    signal, within milliseconds (waits watch every worker's process sentinel, never
    hang on a dead worker). The env is then closed. Workers exit when the parent
    dies, even by SIGKILL. ``close()`` is idempotent and also runs when the env is
    garbage collected or at interpreter exit. No shared-memory file, named semaphore
    or lock is created, so nothing outlives the workers.

    Args:
        num_workers: the number of worker processes (one sub-env each).
        create_env_fn: a callable returning an :class:`~steersman.envs.EnvBase` (a class,
            a module-level function, a ``functools.partial`` of one, an
            :class:`EnvCreator`), or a list of ``num_workers`` of them. It is pickled once
            per worker at start-up: lambdas and closures cannot be pickled by the
            default start method; use ``mp_start_method="fork"`` for those (see below).
            A probe env is built (then closed) in this process to read the specs.
        create_env_kwargs: keyword arguments for ``create_env_fn`` (a dict or a list of
            ``num_workers`` dicts).
        mp_start_method: ``"forkserver"`` (default where available, else ``"spawn"``;
            see :func:`default_start_method`), ``"spawn"`` or ``"fork"``. ``fork`` starts
            fastest and accepts any callable, but is unsafe once the parent has started
            threads (torch's intra-op pool, CUDA, data loaders ...): a forked worker can
            deadlock on a lock held by a thread that does not exist in it.
        shared_memory: exchange data through shared memory (default). ``False`` sends
            the same bytes through the pipes instead (slower; for platforms without
            shared memory).
        device: the device of the outputs (default: the sub-env's). Buffers are on CPU.
        num_sub_threads: ``torch.set_num_threads`` in each worker (default 1; ``None``
            leaves torch's default, which oversubscribes the cores with many workers).
        timeout: seconds a step/reset may take before the env fails with
            :class:`EnvWorkerError` (default ``None``: no limit; dead workers are
            detected regardless).
        start_timeout: seconds the workers may take to start and build their envs.
        close_timeout: seconds ``close()`` waits for workers to exit before terminating
            them.

    Workers are daemonic processes, so a sub-env cannot start processes of its own (a
    ParallelEnv of ParallelEnvs fails; batch inside the workers instead, e.g.
    ``ParallelEnv(n, functools.partial(SerialEnv, m, make_env))`` or a batched native
    env). With ``forkserver``, Python's fork server (one per program, started by the
    first ParallelEnv) stays until the program exits.

    Each worker seeds torch's, numpy's and ``random``'s global RNGs with a distinct
    seed drawn from this process's torch RNG at construction (so ``torch.manual_seed``
    before construction makes unseeded sub-envs reproducible and they never share a
    stream); ``set_seed`` seeds the sub-envs themselves, as in :class:`SerialEnv`.

    Raises:
        TypeError: ``create_env_fn`` is not callable, does not return an EnvBase, or
            cannot be pickled for the start method.
        ValueError: sub-envs with different specs (names the worker and the entry).
        EnvWorkerError: a worker fails to start, raises, dies or times out.
        EnvClosedError: the env is used after ``close()``.

    Example:
        >>> import functools
        >>> from steersman.envs import CartPoleEnv
        >>> from steersman.envs.batched import ParallelEnv
        >>> with ParallelEnv(2, functools.partial(CartPoleEnv, batch_size=[3])) as env:
        ...     _ = env.set_seed(0)
        ...     print(env.batch_size, env.reset()["observation"].shape)
        ...     print(env.rollout(10, break_when_any_done=False).batch_size)
        torch.Size([2, 3]) torch.Size([2, 3, 4])
        torch.Size([2, 3, 10])
        >>> env.is_closed
        True
    """

    def __init__(
        self,
        num_workers: int,
        create_env_fn: CreateEnvFn | Sequence[CreateEnvFn],
        create_env_kwargs: dict | Sequence[dict] | None = None,
        *,
        mp_start_method: str | None = None,
        shared_memory: bool = True,
        device: Any = None,
        num_sub_threads: int | None = 1,
        timeout: float | None = None,
        start_timeout: float = 120.0,
        close_timeout: float = 10.0,
    ) -> None:
        owner = type(self).__name__
        creators = make_creators(num_workers, create_env_fn, create_env_kwargs, owner)
        meta = creators[0].meta_data  # the probe env (built and closed here)
        method = mp_start_method or default_start_method()
        if method not in multiprocessing.get_all_start_methods():
            raise ValueError(
                f"{owner}: mp_start_method must be one of {multiprocessing.get_all_start_methods()}, "
                f"got {mp_start_method!r}"
            )
        self._setup(meta, num_workers, device)
        self.mp_start_method = method
        self.shared_memory = bool(shared_memory)
        self.timeout = timeout
        self._procs: list = []
        self._conns: list = []
        self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._conns,
                                           float(close_timeout), os.getpid())
        self._inflight: set[int] = set()  # workers sent a command whose reply is not read yet
        global _ATEXIT_REGISTERED
        if not _ATEXIT_REGISTERED:
            atexit.register(_close_all_at_exit)
            _ATEXIT_REGISTERED = True
        _LIVE_ENVS.add(self)
        lay = self._layout
        shape = (num_workers, lay.row_bytes)
        shm = SharedBuffer(shape) if self.shared_memory else None
        buf = shm.tensor if shm is not None else torch.zeros(shape, dtype=torch.uint8)
        self._bind_buffer(buf)
        self._buf_np = buf.numpy()
        self._in_range = lay.ranges["in"]
        self._out_range = (lay.ranges["next"][0], lay.ranges["root"][1])
        ctx = multiprocessing.get_context(method)
        if method == "forkserver":
            prepare_forkserver()
        worker_buf: Any = None
        if shm is not None:
            worker_buf = shm.tensor if method == "fork" else shm
        # PR_SET_PDEATHSIG fires when the *thread* that started the worker exits: arm it
        # only when that thread lives as long as the process (the main thread, or the
        # forkserver's); the getppid watchdog and pipe EOF cover the other cases.
        pdeathsig = method == "forkserver" or threading.current_thread() is threading.main_thread()
        expected_ppid = None if method == "forkserver" else os.getpid()
        base_seed = int(torch.randint(0, 2**62, ()).item())
        payloads: dict[int, Any] = {}
        for creator in creators:  # each distinct creator is pickled once, here
            if id(creator) in payloads:
                continue
            if method == "fork":
                payloads[id(creator)] = (creator, lay, meta)
                continue
            try:
                payloads[id(creator)] = pickle.dumps((creator, lay, meta))
            except (pickle.PicklingError, AttributeError, TypeError) as exc:
                raise TypeError(
                    f"{owner}: create_env_fn {creator.name} (or its kwargs) cannot be pickled, which "
                    f"the {method!r} start method needs ({exc}). Pass a module-level function, a "
                    "class, or a functools.partial of one, or use mp_start_method='fork' for "
                    "lambdas and closures"
                ) from exc
        try:
            for i in range(num_workers):
                parent_conn, child_conn = ctx.Pipe(duplex=True)
                close_fds = tuple(c.fileno() for c in self._conns) if method == "fork" else ()
                proc = ctx.Process(
                    target=worker_main,
                    args=(i, payloads[id(creators[i])], child_conn, worker_buf, expected_ppid,
                          pdeathsig, _splitmix64(base_seed + i) >> 1, num_sub_threads, close_fds),
                    name=f"{owner}-worker-{i}",
                    daemon=True,
                )
                try:
                    proc.start()
                except BaseException:
                    parent_conn.close()
                    raise
                finally:
                    child_conn.close()
                self._procs.append(proc)
                self._conns.append(parent_conn)
            self._fds = [c.fileno() for c in self._conns]
            self._readers = [FrameReader(fd) for fd in self._fds]
            self._poller = select.poll()
            self._fdmap: dict[int, tuple[int, bool]] = {}
            mask = select.POLLIN | select.POLLHUP | select.POLLERR
            for i, (p, c) in enumerate(zip(self._procs, self._conns)):
                self._poller.register(c.fileno(), mask)
                self._poller.register(p.sentinel, mask)
                self._fdmap[c.fileno()] = (i, True)
                self._fdmap[p.sentinel] = (i, False)
            for i, msg in sorted(self._collect(self._all_workers, start_timeout, "start-up").items()):
                if len(msg) > 1:  # the worker's env has other specs: it sent them and exited
                    diff = meta.mismatch(pickle.loads(msg[1:]))
                    raise ValueError(
                        f"{owner}: the env built by worker {i} differs from worker 0's: its {diff}; "
                        "every sub-env must have the same specs"
                    )
        except BaseException:
            self._is_closed = True
            self._finalizer()
            raise
        finally:
            if shm is not None:
                shm.release_fd()  # every worker has mapped the memory by now
        self._frames = {cmd: frame(bytes((cmd, 0))) for cmd in (STEP, STEP_RESET)}

    # ------------------------------------------------------------------ properties
    @property
    def worker_pids(self) -> list[int]:
        """The process ids of the workers (empty once closed)."""
        return [p.pid for p in self._procs]

    # ------------------------------------------------------------------ communication
    def _send(self, i: int, data: bytes, what: str) -> None:
        try:
            send_frame(self._fds[i], data)
        except OSError:
            self._dead(i, what)

    def _run(self, cmd: int, workers: Sequence[int], flags: int = 0, extra: bytes = b"") -> list[int]:
        if self._inflight:  # a previous wait was interrupted (e.g. KeyboardInterrupt): drain it
            self._collect(tuple(self._inflight), self.timeout, "an interrupted command")
        self._inflight.update(workers)
        if self.shared_memory or cmd not in DATA_COMMANDS:
            data = self._frames.get(cmd) if not (flags or extra) else None
            if data is None:
                data = frame(bytes((cmd, flags)) + extra)
            for i in workers:
                self._send(i, data, "a step or reset")
            replies = self._collect(workers, self.timeout, "a step or reset")
        else:
            lo, hi = self._in_range
            arr = self._buf_np
            for i in workers:
                self._send(i, frame(bytes((cmd, flags)) + arr[i, lo:hi].tobytes() + extra),
                           "a step or reset")
            replies = self._collect(workers, self.timeout, "a step or reset")
            lo, hi = self._out_range
            for i, msg in replies.items():
                arr[i, lo:hi] = memoryview(msg)[1:1 + hi - lo]
        if cmd != STEP_RESET:
            return []
        return [i for i, msg in replies.items() if msg[0] == _OK_RESET]

    def _seed_worker(self, idx: int, seed: int | None, static_seed: bool) -> int | None:
        if self._inflight:
            self._collect(tuple(self._inflight), self.timeout, "an interrupted command")
        self._inflight.add(idx)
        self._send(idx, frame(bytes((SEED, 0)) + pickle.dumps((seed, static_seed))), "set_seed")
        msg = self._collect((idx,), self.timeout, "set_seed")[idx]
        return pickle.loads(msg[1:])

    def _collect(self, workers: Sequence[int], timeout: float | None, what: str) -> dict[int, bytes]:
        """Waits for one reply from each of ``workers``; fails fast on errors and deaths."""
        out: dict[int, bytes] = {}
        left = set(workers)
        readers = self._readers
        fdmap = self._fdmap
        poll = self._poller.poll
        deadline = None if timeout is None else time.monotonic() + timeout
        while left:
            if deadline is None:
                wait_ms = _POLL_TICK_MS
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    i = min(left)
                    self._fail(EnvWorkerError(
                        f"{type(self).__name__} worker {i} (pid {self._procs[i].pid}) did not answer "
                        f"{what} within {timeout} s; the env was closed", worker_index=i,
                    ))
                wait_ms = min(_POLL_TICK_MS, max(1, int(remaining * 1000) + 1))
            events = poll(wait_ms)
            if not events:
                for i in sorted(left):
                    if not self._procs[i].is_alive():
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
                if msg[:1] == ERR:
                    self._worker_raised(i, msg, what)
                if i not in left:  # pragma: no cover - protocol violation
                    self._fail(EnvWorkerError(
                        f"{type(self).__name__} worker {i} sent an unexpected message during {what}",
                        worker_index=i))
                out[i] = msg
                left.discard(i)
                self._inflight.discard(i)
        return out

    # ------------------------------------------------------------------ failures
    def _fail(self, err: EnvWorkerError) -> None:
        try:
            self.close()
        finally:
            raise err

    def _worker_raised(self, i: int, msg: bytes, what: str) -> None:
        tname, text, tb = unpack_error(msg)
        hint = ""
        if what == "start-up" and "__main__" in text:
            hint = (" (the worker could not import create_env_fn from __main__, e.g. in a notebook: "
                    "define it in an importable module, or use mp_start_method='fork')")
        self._fail(EnvWorkerError(
            f"{type(self).__name__} worker {i} raised {tname}: {text}{hint} (during {what}); the env "
            f"was closed.\nWorker {i} traceback:\n{tb}",
            worker_index=i, exc_type=tname, exc_message=text, worker_traceback=tb,
        ))

    def _dead(self, i: int, what: str) -> None:
        proc, conn = self._procs[i], self._conns[i]
        try:  # it may have sent its exception just before exiting
            if conn.poll(0):
                msg = conn.recv_bytes()
                if msg[:1] == ERR:
                    self._worker_raised(i, msg, what)
        except (EOFError, OSError):
            pass
        proc.join(2.0)
        code = proc.exitcode
        self._fail(EnvWorkerError(
            f"{type(self).__name__} worker {i} (pid {proc.pid}) {_describe_exit(code)} during {what}; "
            "the env was closed",
            worker_index=i, exitcode=code,
        ))

    # ------------------------------------------------------------------ lifecycle
    def _close(self) -> None:
        _LIVE_ENVS.discard(self)
        self._finalizer()
        self._poller = None
        self._readers = []
        self._fds = []
        self._inflight = set()
        self._mask_view = None
        self._in_pairs = self._state_in_pairs = self._next_pairs = self._root_pairs = []
        self._buf_np = None

    def __reduce__(self) -> Any:
        raise TypeError(
            f"{type(self).__name__} cannot be pickled (it owns worker processes); pickle its "
            "create_env_fn (an EnvCreator) instead"
        )
