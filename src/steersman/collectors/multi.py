"""Multi-process collectors: one :class:`Collector` per worker process.

* :class:`MultiSyncDataCollector`: each batch gathers one batch from every worker
  (stacked along a new leading dim, or concatenated with ``cat_results``).
* :class:`MultiaSyncDataCollector`: yields each worker's batch as soon as it is ready;
  the worker starts its next batch before the yield.
* :class:`aSyncDataCollector`: one collector in a background process.

Design (the worker processes are a ``steersman.envs.batched.pool.WorkerPool``, as
:class:`~steersman.envs.ParallelEnv`'s):

* Start: ``forkserver`` (else ``spawn``) worker processes; the env factory, the policy
  and the settings are pickled once per worker (standard pickle, tensors by value;
  cloudpickle for lambdas and closures). Workers are not daemonic, so their envs may
  start processes of their own (e.g. a ``ParallelEnv`` per worker).
* Data: a worker writes its batches straight into anonymous shared memory (a memfd,
  sized from its first transition and sent to the parent once); each batch costs a
  one-byte message. The parent copies batches out (the ``stack``/``cat`` of the sync
  collector is that copy), so a worker can start the next batch at once.
* Policy weights: in shared memory with a version counter; ``update_policy_weights_()``
  writes them, each worker copies them into its policy before its next batch (a
  batch never mixes two versions).
* Failures: a worker that raises, dies or misses ``timeout`` (it is then killed at
  once) is reported as soon as it happens (:class:`CollectorWorkerError`, naming the
  worker, the exception type and message and the worker traceback, or the exit code
  or signal); the collector is then shut down. Workers exit when the parent dies, even
  by SIGKILL; ``shutdown()`` is idempotent and also runs at garbage collection and
  interpreter exit; nothing named (semaphore, lock, shared-memory file) is created.
"""

from __future__ import annotations

import math
import os
import pickle
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from steersman.envs import EnvBase, EnvWorkerError, next_seed
from steersman.envs.batched import EnvCreator
from steersman.envs.batched._base import make_creators
from steersman.envs.batched.pool import WorkerPool, check_start_method, dumps, frame
from steersman.tensordict import TensorDictBase
from steersman.tensordict.nn import ExplorationType

from ._policy import SharedWeights, weights_of
from ._shm import HAS_MEMFD, map_fd
from ._worker import COLLECT, LOAD, PROFILE, RESET, SEED, STATE, worker_main
from .base import BaseCollector, check_unsupported, run_hook
from .collector import Collector, finish_batch, td_from_state, td_state
from .utils import dense_copy
from .weight_update import MultiProcessedWeightUpdater, RemoteModuleWeightUpdater, WeightUpdaterBase

__all__ = [
    "MultiCollector",
    "MultiSyncDataCollector",
    "MultiaSyncDataCollector",
    "aSyncDataCollector",
    "MultiSyncCollector",
    "MultiAsyncCollector",
    "AsyncCollector",
    "CollectorWorkerError",
]

_FIRST = b"F"[0]


class CollectorWorkerError(EnvWorkerError):
    """A worker of a multi-process collector raised, died or stopped answering.

    Same attributes as :class:`~steersman.envs.EnvWorkerError`: ``worker_index``,
    ``exc_type``, ``exc_message``, ``worker_traceback``, ``exitcode``. The collector is
    shut down when this is raised.

    Example:
        >>> from steersman.collectors import CollectorWorkerError
        >>> err = CollectorWorkerError("worker 1 raised ValueError: boom", worker_index=1,
        ...                            exc_type="ValueError", exc_message="boom")
        >>> err.worker_index, err.exc_type
        (1, 'ValueError')
    """


def _creators(create_env_fn: Any, num_workers: int | None, kwargs: Any, owner: str) -> list[EnvCreator]:
    """One env factory (with its kwargs) per worker."""
    if num_workers is None and isinstance(create_env_fn, (list, tuple)):
        num_workers = len(create_env_fn)
    if num_workers is None:
        raise ValueError(f"{owner}: pass num_workers with a single create_env_fn (or a list of them)")
    return make_creators(num_workers, create_env_fn, kwargs, owner)


class _MultiCollector(BaseCollector):
    """The parent side of the multi-process collectors (see the module docstring)."""

    def __init__(
        self,
        create_env_fn: Callable[..., EnvBase] | Sequence[Callable[..., EnvBase]],
        policy: Callable[[TensorDictBase], TensorDictBase] | None = None,
        *,
        num_workers: int | None = None,
        frames_per_batch: int,
        total_frames: int = -1,
        device: Any = None,
        storing_device: Any = None,
        env_device: Any = None,
        policy_device: Any = None,
        create_env_kwargs: dict | Sequence[dict] | None = None,
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = 0,
        reset_at_each_iter: bool = False,
        postproc: Callable[[TensorDictBase], TensorDictBase] | None = None,
        split_trajs: bool | None = False,
        exploration_type: ExplorationType = ExplorationType.RANDOM,
        reset_when_done: bool = True,
        update_at_each_batch: bool = False,
        replay_buffer: Any = None,
        trust_policy: bool | None = False,
        compile_policy: bool | dict | None = False,
        no_cuda_sync: bool = False,
        set_truncated: bool = False,
        num_sub_threads: int | None = 1,
        mp_start_method: str | None = None,
        shared_memory: bool = True,
        timeout: float | None = None,
        start_timeout: float = 120.0,
        close_timeout: float = 10.0,
        cat_results: str | int | None = None,
        policy_factory: Callable[[], Callable] | None = None,
        weight_updater: WeightUpdaterBase | Callable[[], WeightUpdaterBase] | None = None,
        track_policy_version: bool = False,
        pre_collect_hook: Callable[[], None] | None = None,
        post_collect_hook: Callable[[TensorDictBase], None] | None = None,
        init_fn: Callable[[], None] | None = None,
        num_threads: int | None = None,
        collector_class: Any = None,
        worker_idx: int | None = None,
        use_buffers: bool | None = None,
        cudagraph_policy: bool | dict | None = False,
        trajs_per_batch: int | None = None,
        trajs_per_write: int | None = None,
        traj_format: str | None = None,
        compact_obs: bool = False,
        extend_buffer: bool = True,
        auto_register_policy_transforms: bool | None = None,
        preemptive_threshold: float | None = None,
        weight_sync_schemes: Any = None,
        weight_recv_schemes: Any = None,
        sync: bool | None = None,
    ) -> None:
        owner = type(self).__name__
        if sync is not None and bool(sync) != isinstance(self, MultiSyncDataCollector):
            raise ValueError(f"{owner}: sync={sync!r} contradicts the class (use MultiCollector(..., sync=...))")
        check_unsupported(owner, trajs_per_batch=trajs_per_batch, trajs_per_write=trajs_per_write,
                          compact_obs=compact_obs, extend_buffer=extend_buffer,
                          auto_register_policy_transforms=auto_register_policy_transforms,
                          preemptive_threshold=preemptive_threshold, weight_sync_schemes=weight_sync_schemes,
                          weight_recv_schemes=weight_recv_schemes)
        if collector_class not in (None, Collector):
            raise NotImplementedError(f"{owner}: collector_class={collector_class!r} is not supported: the workers "
                                      "run steersman.collectors.Collector")
        if policy_factory is not None and policy is not None:
            raise ValueError(f"{owner}: pass policy or policy_factory, not both")
        if num_threads is not None:
            torch.set_num_threads(int(num_threads))
        self.worker_idx = worker_idx
        self.pre_collect_hook = pre_collect_hook
        self.post_collect_hook = post_collect_hook
        self._policy_factory = policy_factory
        creators = _creators(create_env_fn, num_workers, create_env_kwargs, owner)
        self.num_workers = n = len(creators)
        if isinstance(frames_per_batch, bool) or not isinstance(frames_per_batch, int) or frames_per_batch < 1:
            raise ValueError(f"{owner}: frames_per_batch must be a positive int, got {frames_per_batch!r}")
        self.frames_per_batch = self.requested_frames_per_batch = frames_per_batch
        self._worker_frames = self._frames_per_worker(frames_per_batch)
        if total_frames is None or total_frames == -1:
            total: float = math.inf
        elif isinstance(total_frames, bool) or not isinstance(total_frames, int) or total_frames < 0:
            raise ValueError(f"{owner}: total_frames must be a non-negative int or -1, got {total_frames!r}")
        else:
            total = total_frames
            if total % frames_per_batch:
                total = -(-total // frames_per_batch) * frames_per_batch
                warnings.warn(f"{owner}: total_frames={total_frames} is not a multiple of frames_per_batch="
                              f"{frames_per_batch}; {total} frames will be collected")
        self.total_frames = total
        self.init_random_frames = int(init_random_frames or 0)
        self.postproc = postproc
        self.split_trajs = bool(split_trajs)
        self.replay_buffer = replay_buffer
        self.update_at_each_batch = bool(update_at_each_batch)
        self.exploration_type = exploration_type
        if cat_results is not None and cat_results != "stack" and not isinstance(cat_results, int):
            raise ValueError(f"{owner}: cat_results must be 'stack' or a dim (int), got {cat_results!r}")
        self.cat_results = "stack" if cat_results is None else cat_results
        self.policy = policy
        self.timeout = timeout
        self.mp_start_method = check_start_method(mp_start_method, owner)
        self.shared_memory = bool(shared_memory) and HAS_MEMFD
        storing = storing_device if storing_device is not None else device
        self.storing_device = torch.device(storing) if storing is not None else torch.device("cpu")
        if policy is not None and not callable(policy):
            raise TypeError(f"{owner}: policy must be callable (TensorDict -> TensorDict), got {type(policy).__name__}")
        worker_kwargs = {
            "frames_per_batch": self._worker_frames, "total_frames": -1, "device": device,
            "storing_device": "cpu", "env_device": env_device, "policy_device": policy_device,
            "max_frames_per_traj": max_frames_per_traj, "reset_at_each_iter": reset_at_each_iter,
            "exploration_type": exploration_type, "reset_when_done": reset_when_done,
            "trust_policy": trust_policy, "compile_policy": compile_policy, "no_cuda_sync": no_cuda_sync,
            "set_truncated": set_truncated, "return_same_td": True, "track_policy_version": track_policy_version,
        }
        # with a policy_factory, one local instance gives the layout of the shared weights
        w = weights_of(policy if policy_factory is None else policy_factory())
        self._weights = SharedWeights(w) if w is not None else None
        self._init_weight_updater(weight_updater)
        self._init_fn = init_fn
        # running state
        self._frames = 0
        self._iter = -1
        self._requested = 0  # async: batches asked of the workers so far
        self._ready: list[tuple[int, TensorDictBase]] = []  # async: batches gathered, not yet yielded
        self._worker_tds: list[TensorDictBase | None] = [None] * n
        self._memory: list[torch.Tensor | None] = [None] * n
        self._closed = False
        self._pool = WorkerPool(owner, CollectorWorkerError, "the collector was shut down", self.shutdown,
                                float(close_timeout), with_fds=True)
        try:
            self._start(creators, policy, worker_kwargs, num_sub_threads, float(start_timeout))
        except BaseException:
            self.shutdown()
            raise

    def _frames_per_worker(self, frames_per_batch: int) -> int:
        raise NotImplementedError

    # ------------------------------------------------------------------ start-up
    def _start(self, creators: list[EnvCreator], policy: Any, worker_kwargs: dict, num_sub_threads: int | None,
               start_timeout: float) -> None:
        owner = type(self).__name__
        payloads: dict[int, bytes] = {}
        for creator in creators:
            if id(creator) not in payloads:
                spec = {"create_env_fn": creator, "policy": policy, "kwargs": worker_kwargs,
                        "num_workers": self.num_workers, "policy_factory": self._policy_factory,
                        "init_fn": self._init_fn}
                payloads[id(creator)] = dumps(spec, owner, f"the env factory {creator.name}, its kwargs or the policy")
        base_seed = int(torch.randint(0, 2**62, ()).item())
        try:
            self._pool.start(
                worker_main, [(payloads[id(c)], self._weights, self.shared_memory) for c in creators],
                [next_seed(base_seed + i) for i in range(self.num_workers)], method=self.mp_start_method,
                daemon=False,  # its env may start processes (e.g. a ParallelEnv)
                num_threads=num_sub_threads, start_timeout=start_timeout,
                preload=("steersman.collectors._worker",))
        finally:
            if self._weights is not None:
                self._weights.close_fd()  # every worker has its own descriptor by now

    @property
    def worker_pids(self) -> list[int]:
        """The process ids of the workers (empty once shut down)."""
        return self._pool.pids

    # ------------------------------------------------------------------ communication
    def _send(self, i: int, payload: bytes, what: str) -> None:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__}: the collector was shut down")
        self._pool.send(i, frame(payload), what)

    @property
    def _inflight(self) -> set[int]:
        return self._pool.inflight

    def _wait(self, workers: set[int], what: str, first: bool = False) -> dict[int, bytes]:
        """Waits for the replies of ``workers`` (all of them, or the ``first`` one(s) ready);
        fails fast on errors, deaths and the timeout."""
        out = self._pool.wait(workers, what, self.timeout, first)
        for i, msg in out.items():
            self._on_reply(i, msg)
        return out

    def _on_reply(self, i: int, msg: bytes) -> None:
        """Maps a worker's batch memory from its first batch; copies piped bytes in."""
        if msg[0] == _FIRST:
            if self.shared_memory:
                layout = pickle.loads(msg[1:])
                fd = self._pool.readers[i].fds.pop(0)
                try:
                    mem = map_fd(fd, layout.nbytes)
                finally:
                    os.close(fd)
            else:
                layout, raw = pickle.loads(msg[1:])
                mem = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
            self._memory[i] = mem
            self._worker_tds[i] = layout.time_last(mem, torch.device("cpu"))
        elif not self.shared_memory and msg[:1] == b"B":
            self._memory[i].numpy()[:] = np.frombuffer(msg, dtype=np.uint8, offset=1)

    def _request(self, i: int, random: bool) -> None:
        """Asks worker ``i`` for its next batch (``random``: with random actions)."""
        self._send(i, bytes((COLLECT, 1 if random else 0)), "a batch")

    def _call(self, payload_of: Callable[[int], bytes], what: str) -> dict[int, bytes]:
        """Sends a command to every worker (idle ones) and returns their replies."""
        self._quiesce()
        for i in range(self.num_workers):
            self._send(i, payload_of(i), what)
        return self._wait(set(range(self.num_workers)), what)

    def _quiesce(self) -> None:
        """Waits for the batches in flight; keeps them to be yielded next."""
        while self._inflight:
            for i in sorted(self._wait(set(self._inflight), "a batch")):
                self._ready.append((i, dense_copy(self._worker_tds[i])))

    # ------------------------------------------------------------------ iteration
    def iterator(self) -> Iterator[TensorDictBase | None]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[TensorDictBase | None]:
        return self.iterator()

    def __len__(self) -> int:
        if self.total_frames != math.inf:
            return int(self.total_frames // self.frames_per_batch)
        raise RuntimeError(f"{type(self).__name__}: a collector without total_frames has no length")

    def _finish(self, batch: TensorDictBase) -> TensorDictBase | None:
        if self.storing_device.type != "cpu":
            batch = batch.to(self.storing_device)
        return finish_batch(batch, copy=False, split_trajs=self.split_trajs, postproc=self.postproc,
                            replay_buffer=self.replay_buffer)

    # ------------------------------------------------------------------ control
    def _default_weight_updater(self) -> WeightUpdaterBase:
        if self._policy_factory is not None:  # the workers' policies are not this process's
            return RemoteModuleWeightUpdater()
        return self._transport_weight_updater()

    def _transport_weight_updater(self) -> WeightUpdaterBase:
        """The updater that writes the workers' shared weights (holding no reference to the
        collector, so that garbage collection still stops the workers)."""
        ref = weakref.ref(self)
        return MultiProcessedWeightUpdater(get_server_weights=lambda: getattr(ref(), "policy", None),
                                           policy_weights=self._weights)

    def update_policy_weights_(self, policy_or_weights: Any = None, *, weights: Any = None,
                               policy: Any = None, worker_ids: Any = None) -> None:
        """Publishes new policy weights to every worker (through :attr:`weight_updater`;
        by default, one write into the shared memory all workers read).

        Args:
            policy_or_weights: a module, a TensorDict of weights or a ``state_dict``;
                default: the weights of the policy given at construction (the same object
                you train, typically).
            weights, policy: keyword forms (TorchRL's names).
            worker_ids: accepted for TorchRL compatibility; every worker reads the same
                weights.

        Each worker copies them into its policy before its next batch: with the sync
        collector, the next batch uses them; with the async one, batches already started
        (at most one per worker) still use the previous weights.
        """
        if self._closed:
            raise RuntimeError(f"{type(self).__name__}: the collector was shut down")
        if self._weights is None:
            raise ValueError(f"{type(self).__name__}.update_policy_weights_: the policy has no weights")
        super().update_policy_weights_(policy_or_weights, weights=weights, policy=policy, worker_ids=worker_ids)

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seeds the workers' envs in turn (worker ``i`` gets the seed returned by worker
        ``i - 1``); returns the last seed."""
        self._quiesce()
        for i in range(self.num_workers):
            self._send(i, bytes((SEED,)) + pickle.dumps((seed, static_seed)), "set_seed")
            seed = pickle.loads(self._wait({i}, "set_seed")[i][1:])
        return seed

    def _enable_profile(self, config: Any) -> None:
        bad = [w for w in config.workers if not 0 <= w < self.num_workers]
        if bad:
            raise ValueError(f"{type(self).__name__}.enable_profile: workers {bad} out of range "
                             f"(num_workers={self.num_workers})")
        self._quiesce()
        payload = bytes((PROFILE,)) + pickle.dumps(config)
        for i in sorted(set(config.workers)):
            self._send(i, payload, "enable_profile")
        self._wait(set(config.workers), "enable_profile")

    def reset(self) -> None:
        """Resets every worker's env; their next batches start new trajectories."""
        self._call(lambda i: bytes((RESET,)), "reset")

    def state_dict(self) -> dict:
        """``{"worker<i>": worker i's Collector state (with its torch RNG state), "frames",
        "iter", "requested", "ready": batches gathered but not yet yielded}``.

        Batches in flight are waited for first (they are yielded next, and saved under
        ``"ready"``), so a collector restored with :meth:`load_state_dict` yields the same
        batches, per worker, as this one.
        """
        replies = self._call(lambda i: bytes((STATE,)), "state_dict")
        out: dict = {f"worker{i}": pickle.loads(replies[i][1:]) for i in range(self.num_workers)}
        out.update(frames=self._frames, iter=self._iter, requested=self._requested,
                   ready=[(i, td_state(td)) for i, td in self._ready])
        if isinstance(self.policy, nn.Module):
            out["policy_state_dict"] = {k: v.clone() for k, v in self.policy.state_dict().items()}
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores a :meth:`state_dict` (from a collector built the same way)."""
        missing = [f"worker{i}" for i in range(self.num_workers) if f"worker{i}" not in state_dict]
        if missing:
            raise KeyError(f"{type(self).__name__}.load_state_dict: missing entries {missing}")
        self._quiesce()
        self._ready = []
        self._call(lambda i: bytes((LOAD,)) + pickle.dumps(state_dict[f"worker{i}"]), "load_state_dict")
        self._frames = int(state_dict.get("frames", 0))
        self._iter = int(state_dict.get("iter", -1))
        self._requested = int(state_dict.get("requested", self._frames // self.frames_per_batch))
        self._ready = [(i, td_from_state(s, None)) for i, s in state_dict.get("ready", [])]

    def shutdown(self) -> None:
        """Stops the workers (idempotent): a close command, then SIGTERM/SIGKILL for those
        that do not exit within ``close_timeout``; releases pipes and shared memory."""
        if self._closed:
            return
        self._closed = True
        self._pool.close()
        self._ready = []
        self._worker_tds = [None] * self.num_workers
        self._memory = [None] * self.num_workers  # unmaps the batch memory (and its descriptor)
        updater = getattr(self, "weight_updater", None)
        if isinstance(updater, MultiProcessedWeightUpdater) and updater.policy_weights is self._weights:
            updater.policy_weights = None  # releases the shared weights
        self._weights = None

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(num_workers={self.num_workers}, frames_per_batch={self.frames_per_batch}, "
                f"total_frames={self.total_frames}, frames={self._frames})")

    def __reduce__(self) -> Any:
        raise TypeError(f"{type(self).__name__} cannot be pickled (it owns worker processes)")


class MultiCollector(_MultiCollector):
    """TorchRL 0.14's multi-process collector: ``MultiCollector(..., sync=True)`` is a
    :class:`MultiSyncDataCollector`, ``sync=False`` (the default, as TorchRL's process
    backend) a :class:`MultiaSyncDataCollector`; both are ``MultiCollector`` instances.

    Args:
        *args, **kwargs: as :class:`MultiSyncDataCollector` / :class:`MultiaSyncDataCollector`.
        sync: gather one batch from every worker (``True``) or yield each worker's batch
            as soon as it is ready (``False``).

    Example:
        >>> from steersman.collectors import MultiCollector, MultiSyncDataCollector
        >>> from steersman.envs import CartPoleEnv
        >>> collector = MultiCollector([CartPoleEnv, CartPoleEnv], sync=True, frames_per_batch=8,
        ...                            total_frames=8)
        >>> isinstance(collector, MultiSyncDataCollector), [b.batch_size for b in collector]
        (True, [torch.Size([2, 4])])
        >>> collector.shutdown()
    """

    def __new__(cls, *args: Any, sync: bool | None = None, **kwargs: Any) -> Any:
        if cls is MultiCollector:  # Python then runs the chosen class's __init__
            cls = MultiSyncDataCollector if sync else MultiaSyncDataCollector
        return super().__new__(cls)


class MultiSyncDataCollector(MultiCollector):
    """Runs one :class:`~steersman.collectors.Collector` per worker process; each batch
    gathers one batch from every worker.

    Worker ``i`` collects ``frames_per_batch // num_workers`` frames per batch from its
    own env (``create_env_fn[i]``). The workers' ``[*env_batch, T]`` batches are stacked
    along a new leading dim (``cat_results="stack"``, the default: ``[num_workers,
    *env_batch, T]``) or concatenated along ``cat_results`` (an int). Trajectory ids are
    unique across workers (worker ``i`` hands out ``k * num_workers + i``). Workers
    collect only when a batch is asked for, so weights published with
    :meth:`update_policy_weights_` are used from the next batch on.

    Args:
        create_env_fn: a callable building the env (given ``num_workers``), or a list
            of them, one per worker: a class, a function, a ``functools.partial``, a
            lambda or closure (sent with cloudpickle when plain pickle cannot).
        policy: as for :class:`Collector` (pickled to every worker; its weights are
            shared through shared memory); ``None`` for random actions.

    Keyword Args:
        num_workers: the number of workers (with a single ``create_env_fn``).
        frames_per_batch: frames per yielded batch, a multiple of ``num_workers`` (and
            each worker's share a multiple of its env's number of sub-envs).
        total_frames, device, storing_device, env_device, policy_device, create_env_kwargs
            (a dict or one per worker), max_frames_per_traj, init_random_frames,
            reset_at_each_iter, postproc, split_trajs, exploration_type, reset_when_done,
            replay_buffer, trust_policy, compile_policy, no_cuda_sync, set_truncated: as for
            :class:`Collector` (``postproc``, ``split_trajs`` and ``replay_buffer`` act
            in this process on the gathered batch).
        update_at_each_batch: publish the policy's weights before every batch.
        cat_results: ``"stack"`` (default) or the dim along which to concatenate.
        num_sub_threads: ``torch.set_num_threads`` in each worker (default 1).
        mp_start_method: ``"forkserver"`` (default where available) or ``"spawn"``
            (``"fork"`` is unsafe once torch has started threads).
        shared_memory: exchange batches through shared memory (default; Linux). ``False``
            sends them through the pipes.
        timeout: seconds a batch may take before the collector fails, the late worker
            killed at once (default: none; dead workers are detected regardless).
        start_timeout, close_timeout: seconds for the workers to start / to exit on
            :meth:`shutdown` before they are terminated.

    Raises:
        CollectorWorkerError: a worker failed to start, raised, died or timed out (the
            message names the worker, the exception type and message).

    Example:
        >>> import functools
        >>> from steersman.collectors import MultiSyncDataCollector
        >>> from steersman.envs import CartPoleEnv
        >>> collector = MultiSyncDataCollector(
        ...     functools.partial(CartPoleEnv, batch_size=[2]), num_workers=2,
        ...     frames_per_batch=40, total_frames=80)
        >>> for batch in collector:
        ...     print(batch.batch_size)
        torch.Size([2, 2, 10])
        torch.Size([2, 2, 10])
        >>> collector.shutdown()
    """

    def _frames_per_worker(self, frames_per_batch: int) -> int:
        if frames_per_batch % self.num_workers:
            raise ValueError(
                f"MultiSyncDataCollector: frames_per_batch={frames_per_batch} is not a multiple of "
                f"num_workers={self.num_workers} (each worker collects the same share)"
            )
        return frames_per_batch // self.num_workers

    def iterator(self) -> Iterator[TensorDictBase | None]:
        """Yields gathered batches until ``total_frames`` are collected."""
        workers = range(self.num_workers)
        while self._frames < self.total_frames:
            self._iter += 1
            if self.update_at_each_batch and self._weights is not None:
                self.update_policy_weights_()
            run_hook(self.pre_collect_hook)
            self._quiesce()  # replies of an interrupted wait, if any
            parts = dict(self._ready)  # restored or drained batches: at most one per worker
            self._ready = []
            missing = [i for i in workers if i not in parts]
            if missing:
                random = self._frames < self.init_random_frames
                for i in missing:
                    self._request(i, random)
                self._wait(set(missing), "a batch")
                parts.update((i, self._worker_tds[i]) for i in missing)
            tds = [parts[i] for i in workers]
            if self.cat_results == "stack":
                out = torch.stack(tds, 0)
            else:
                out = torch.cat(tds, self.cat_results)
            self._frames += self.frames_per_batch
            run_hook(self.post_collect_hook, out)
            yield self._finish(out)


class MultiaSyncDataCollector(MultiCollector):
    """Runs one :class:`~steersman.collectors.Collector` per worker process and yields each
    worker's batch as soon as it is ready.

    Each batch holds ``frames_per_batch`` frames from one worker (``[*env_batch, T]``).
    A worker starts its next batch before its previous one is yielded, so batches may be
    collected with weights one :meth:`update_policy_weights_` old. Trajectory ids are
    unique across workers (worker ``i`` hands out ``k * num_workers + i``).

    Arguments: as :class:`MultiSyncDataCollector` (but ``frames_per_batch`` is per batch
    of one worker, and there is no ``cat_results``).

    Example:
        >>> import functools
        >>> from steersman.collectors import MultiaSyncDataCollector
        >>> from steersman.envs import CartPoleEnv
        >>> collector = MultiaSyncDataCollector([CartPoleEnv, CartPoleEnv], frames_per_batch=10,
        ...                                     total_frames=40)
        >>> [batch.batch_size for batch in collector]
        [torch.Size([10]), torch.Size([10]), torch.Size([10]), torch.Size([10])]
        >>> collector.shutdown()
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("cat_results") is not None:
            raise ValueError(f"{type(self).__name__}: cat_results is for MultiSyncDataCollector only")
        super().__init__(*args, **kwargs)

    def _frames_per_worker(self, frames_per_batch: int) -> int:
        return frames_per_batch

    def _total_batches(self) -> float:
        return self.total_frames / self.frames_per_batch

    def _request_next(self, i: int) -> None:
        """Asks worker ``i`` for the next batch: random actions while the batches asked so far
        hold fewer than ``init_random_frames`` frames (batch order, not timing, decides)."""
        random = self._requested * self.frames_per_batch < self.init_random_frames
        self._requested += 1
        self._request(i, random)

    def iterator(self) -> Iterator[TensorDictBase | None]:
        """Yields worker batches, in the order they are ready, until ``total_frames``."""
        total = self._total_batches()
        for i in range(self.num_workers):  # idle workers start at once
            if i not in self._inflight and self._requested < total and all(j != i for j, _ in self._ready):
                self._request_next(i)
        while self._frames < self.total_frames:
            self._iter += 1
            run_hook(self.pre_collect_hook)
            if self._ready:
                i, out = self._ready.pop(0)
            else:
                if not self._inflight:  # pragma: no cover - bookkeeping error
                    raise RuntimeError(f"{type(self).__name__}: no batch in flight")
                i = min(self._wait(set(self._inflight), "a batch", first=True))
                out = dense_copy(self._worker_tds[i])
            self._frames += self.frames_per_batch
            if self._requested < total:
                if self.update_at_each_batch and self._weights is not None:
                    self.update_policy_weights_()
                self._request_next(i)  # the worker goes on while the batch is used
            run_hook(self.post_collect_hook, out)
            yield self._finish(out)

    def _wait(self, workers: set[int], what: str, first: bool = False) -> dict[int, bytes]:
        out = super()._wait(workers, what, first)
        if first and len(out) > 1:  # several were ready at once: keep the others for later
            for i in sorted(out)[1:]:
                self._ready.append((i, dense_copy(self._worker_tds[i])))
        return out


class aSyncDataCollector(MultiaSyncDataCollector):
    """One :class:`~steersman.collectors.Collector` in a background process: batches are
    collected while the caller works on the previous one.

    Args:
        create_env_fn: a callable building the env (a lambda works too).
        policy: as for :class:`Collector`.
        **kwargs: as :class:`MultiaSyncDataCollector` (without ``num_workers``).

    Example:
        >>> from steersman.collectors import aSyncDataCollector
        >>> from steersman.envs import CartPoleEnv
        >>> collector = aSyncDataCollector(CartPoleEnv, frames_per_batch=10, total_frames=20)
        >>> [batch.batch_size for batch in collector]
        [torch.Size([10]), torch.Size([10])]
        >>> collector.shutdown()
    """

    def __init__(self, create_env_fn: Callable[..., EnvBase], policy: Any = None, **kwargs: Any) -> None:
        if "num_workers" in kwargs and kwargs["num_workers"] not in (None, 1):
            raise ValueError("aSyncDataCollector: runs one worker; use MultiaSyncDataCollector for more")
        kwargs.pop("num_workers", None)
        super().__init__([create_env_fn], policy, **kwargs)


# TorchRL 0.14's names for the same classes
MultiSyncCollector = MultiSyncDataCollector
MultiAsyncCollector = MultiaSyncDataCollector
AsyncCollector = aSyncDataCollector
