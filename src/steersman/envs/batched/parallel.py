"""``ParallelEnv``: one worker process per sub-env, data in preallocated shared memory.

Design (see also ``_buffers``, ``worker`` and ``pool``, the worker pool it shares with
the multi-process collectors):

* Buffers: one ``uint8 [num_workers, row_bytes]`` tensor in anonymous shared memory,
  laid out from the sub-env's specs; each spec leaf is a typed view. The parent writes
  actions there and reads observations/rewards/dones back; nothing is pickled per step.
* Commands: a 2-byte message per worker through its pipe (one wake-up per worker per
  step), a 1-byte reply. ``step_and_maybe_reset`` is a single command (the worker
  steps and resets its finished sub-envs), so rollouts cost one round trip per step.
* Processes, waits, failure reports, parent death and cleanup: ``pool.WorkerPool``.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import torch

from ..utils import _splitmix64
from ._base import BatchedEnvBase, CreateEnvFn, EnvWorkerError, apply_num_threads, make_creators
from .pool import WorkerPool, check_start_method, default_start_method, dumps, frame
from .shm import SharedMemory
from .worker import DATA_COMMANDS, OK_RESET, SEED, STEP, STEP_RESET, worker_main

__all__ = ["ParallelEnv", "default_start_method"]

_OK_RESET = OK_RESET[0]


class ParallelEnv(BatchedEnvBase):
    """Batches ``num_workers`` envs, each in its own worker process, stepped in parallel.

    Behaves like one env of batch size ``[num_workers, *sub_batch]`` and returns the
    same data as a :class:`SerialEnv` with the same arguments (same seed: same
    rollouts). Actions and results travel through shared memory preallocated from the
    specs; each step sends one small message per worker and nothing is pickled.
    ``step_and_maybe_reset`` (used by ``rollout(..., break_when_any_done=False)`` and
    collectors) steps and resets finished sub-envs in one round trip.

    Reliability: a worker that raises (in ``_step``, ``_reset`` ...: a bad action, a step
    before ``reset``) is reported as :class:`EnvWorkerError` naming the worker, the
    exception type, its message and the worker traceback, once every other worker has
    answered; the env stays open and usable (an exception does not end a worker). A
    worker that dies (``os._exit``, a signal) is reported with its exit code or signal
    within milliseconds (waits watch every worker's process sentinel, never hang on a
    dead worker), and one that does not answer within ``timeout`` is killed at once and
    reported; the env is then closed. Workers exit when the parent dies, even by
    SIGKILL. ``close()`` is idempotent and also runs when the env is
    garbage collected or at interpreter exit. No shared-memory file, named semaphore
    or lock is created, so nothing outlives the workers.

    Args:
        num_workers: the number of worker processes (one sub-env each).
        create_env_fn: a callable returning an :class:`~steersman.envs.EnvBase` (a class,
            a module-level function, a ``functools.partial`` of one, an
            :class:`EnvCreator`, a lambda or closure), or a list of ``num_workers`` of
            them. It is pickled once per distinct factory at start-up (with
            ``cloudpickle`` when the standard pickler cannot, for lambdas, closures and
            local functions, or when it refers to ``__main__``, e.g. a notebook's). A probe env is built (then closed) in this process to read the
            specs.
        create_env_kwargs: keyword arguments for ``create_env_fn`` (a dict or a list of
            ``num_workers`` dicts).
        mp_start_method: ``"forkserver"`` (default where available, else ``"spawn"``;
            see :func:`default_start_method`), ``"spawn"`` or ``"fork"``. ``fork`` starts
            fastest, but is unsafe once the parent has started
            threads (torch's intra-op pool, CUDA, data loaders ...): a forked worker can
            deadlock on a lock held by a thread that does not exist in it.
        shared_memory: exchange data through shared memory (default). ``False`` sends
            the same bytes through the pipes instead (slower; for platforms without
            shared memory).
        device: the device of the outputs (default: the sub-env's). Buffers are on CPU.
        num_sub_threads: ``torch.set_num_threads`` in each worker (default 1; ``None``
            leaves torch's default, which oversubscribes the cores with many workers).
        timeout: seconds a step/reset may take before the env fails with
            :class:`EnvWorkerError`, the late worker killed at once (default ``None``: no
            limit; dead workers are detected regardless).
        start_timeout: seconds the workers may take to start and build their envs.
        close_timeout: seconds ``close()`` waits for workers to exit before terminating
            them.

    TorchRL's other keyword arguments: ``serial_for_single=True`` with one worker returns
    a :class:`SerialEnv` (no process); ``use_buffers=False`` sends the bytes through the
    pipes (``shared_memory=False``); ``num_threads`` sets ``torch.set_num_threads`` in
    this process; ``shutdown_timeout`` is ``close_timeout``. ``pin_memory``,
    ``consolidate``, ``memmap``, ``share_individual_td``, ``non_blocking``,
    ``policy_proof``, ``metadata_from_workers``, ``daemon`` and ``allow_step_when_done``
    are accepted and have no effect here (``TORCHRL_NOOP_KWARGS`` in ``_base`` gives
    the reason for each).

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
            cannot be pickled (not even by cloudpickle).
        ValueError: sub-envs with different specs (names the worker and the entry).
        EnvWorkerError: a worker fails to start, raises, dies or times out (closed
            after all but a raise).
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

    def __new__(cls, num_workers: Any = None, create_env_fn: Any = None, create_env_kwargs: Any = None,
                *, serial_for_single: bool = False, device: Any = None, **kwargs: Any) -> Any:
        if serial_for_single and num_workers == 1:  # TorchRL: no process for a single env
            from .serial import SerialEnv

            return SerialEnv(1, create_env_fn, create_env_kwargs, device=device)
        return super().__new__(cls)

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
        serial_for_single: bool = False,
        use_buffers: bool | None = None,
        num_threads: int | None = None,
        shutdown_timeout: float | None = None,
        pin_memory: bool = False,
        consolidate: bool = True,
        memmap: bool = False,
        share_individual_td: bool | None = None,
        non_blocking: bool = False,
        policy_proof: Any = None,
        metadata_from_workers: bool | None = None,
        daemon: bool = False,
        allow_step_when_done: bool = False,
    ) -> None:
        owner = type(self).__name__
        apply_num_threads(num_threads, owner)
        if use_buffers is False:
            shared_memory = False  # TorchRL's "no shared buffers": the bytes go through the pipes
        if shutdown_timeout is not None:
            close_timeout = shutdown_timeout
        creators = make_creators(num_workers, create_env_fn, create_env_kwargs, owner)
        meta = creators[0].meta_data  # the probe env (built and closed here)
        method = check_start_method(mp_start_method, owner)
        self._setup(meta, num_workers, device)
        self.mp_start_method = method
        self.shared_memory = bool(shared_memory)
        self.timeout = timeout
        self._pool = WorkerPool(owner, EnvWorkerError, "the env was closed", self.close,
                                float(close_timeout))
        lay = self._layout
        shape = (num_workers, lay.row_bytes)
        # anonymous (a memfd on Linux): no name in /dev/shm at any time, freed by the kernel
        # when the last process mapping it exits; each worker maps it once at start-up
        shm = SharedMemory(shape[0] * shape[1], name="steersman-batched-env") if self.shared_memory else None
        buf = shm.tensor.view(shape) if shm is not None else torch.zeros(shape, dtype=torch.uint8)
        self._bind_buffer(buf)
        self._buf_np = buf.numpy()
        self._in_range = lay.ranges["in"]
        self._out_range = (lay.ranges["next"][0], lay.ranges["root"][1])
        payloads: dict[int, bytes] = {}
        try:
            for creator in creators:  # each distinct creator is pickled once, here
                if id(creator) not in payloads:
                    payloads[id(creator)] = dumps((creator, lay, meta), owner,
                                                  f"create_env_fn {creator.name} (or its kwargs)")
            base_seed = int(torch.randint(0, 2**62, ()).item())
            replies = self._pool.start(
                worker_main, [(payloads[id(c)], shm) for c in creators],
                [_splitmix64(base_seed + i) >> 1 for i in range(num_workers)], method=method,
                daemon=True, num_threads=num_sub_threads, start_timeout=start_timeout,
                preload=("steersman.envs.batched.worker",))
            for i, msg in sorted(replies.items()):
                if len(msg) > 1:  # the worker's env has other specs: it sent them and exited
                    diff = meta.mismatch(pickle.loads(msg[1:]))
                    raise ValueError(
                        f"{owner}: the env built by worker {i} differs from worker 0's: its {diff}; "
                        "every sub-env must have the same specs"
                    )
        except BaseException:
            self.close()
            raise
        finally:
            if shm is not None:
                shm.close_fd()  # every worker has mapped the memory by now
        self._frames = {cmd: frame(bytes((cmd, 0))) for cmd in (STEP, STEP_RESET)}

    # ------------------------------------------------------------------ properties
    @property
    def worker_pids(self) -> list[int]:
        """The process ids of the workers (empty once closed)."""
        return self._pool.pids

    # ------------------------------------------------------------------ communication
    def _run(self, cmd: int, workers: Sequence[int], flags: int = 0, extra: bytes = b"") -> list[int]:
        pool = self._pool
        if pool.inflight:  # a previous wait was interrupted (e.g. KeyboardInterrupt): drain it
            pool.wait(tuple(pool.inflight), "an interrupted command", self.timeout, keep_open=True)
        what = "a step or reset"
        if self.shared_memory or cmd not in DATA_COMMANDS:
            data = self._frames.get(cmd) if not (flags or extra) else None
            if data is None:
                data = frame(bytes((cmd, flags)) + extra)
            for i in workers:
                pool.send(i, data, what)
            replies = pool.wait(workers, what, self.timeout, keep_open=True)
        else:
            lo, hi = self._in_range
            arr = self._buf_np
            for i in workers:
                pool.send(i, frame(bytes((cmd, flags)) + arr[i, lo:hi].tobytes() + extra), what)
            replies = pool.wait(workers, what, self.timeout, keep_open=True)
            lo, hi = self._out_range
            for i, msg in replies.items():
                arr[i, lo:hi] = memoryview(msg)[1:1 + hi - lo]
        if cmd != STEP_RESET:
            return []
        return [i for i, msg in replies.items() if msg[0] == _OK_RESET]

    def _seed_worker(self, idx: int, seed: int | None, static_seed: bool) -> int | None:
        pool = self._pool
        if pool.inflight:
            pool.wait(tuple(pool.inflight), "an interrupted command", self.timeout, keep_open=True)
        pool.send(idx, frame(bytes((SEED, 0)) + pickle.dumps((seed, static_seed))), "set_seed")
        msg = pool.wait((idx,), "set_seed", self.timeout, keep_open=True)[idx]
        return pickle.loads(msg[1:])

    # ------------------------------------------------------------------ lifecycle
    def _close(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.close()
        self._mask_view = None
        self._in_pairs = self._state_in_pairs = self._next_pairs = self._root_pairs = []
        self._buf_np = None

    def __reduce__(self) -> Any:
        raise TypeError(
            f"{type(self).__name__} cannot be pickled (it owns worker processes); pickle its "
            "create_env_fn (an EnvCreator) instead"
        )
