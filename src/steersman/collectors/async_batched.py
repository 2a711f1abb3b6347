"""``AsyncBatchedCollector``: envs stepped asynchronously, the policy run on whichever are ready.

The envs live in an :class:`~steersman.envs.AsyncEnvPool` (one thread or one process
each). The driver (the iterating thread) serves the policy: it waits until at least
``min_batch_size`` envs have finished their step (at most ``server_timeout`` seconds for
the ones after the first), runs one batched forward pass on up to ``max_batch_size`` of
the ready envs, and sends each its action. There is no barrier across envs: a slow env
does not hold the others back. Transitions are kept in the order they arrive; a batch is
``frames_per_batch`` of them, a TensorDict of batch size ``[frames_per_batch]`` with each
transition's ``"env_index"`` and the ``policy_version_key`` entry (the number of weight
updates the policy had received when it chose the action).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from steersman.envs import AsyncEnvPool, EnvBase
from steersman.tensordict import TensorDictBase
from steersman.tensordict.nn import ExplorationType, set_exploration_type

from ._policy import weights_of
from .base import BaseCollector
from .weight_update import VanillaWeightUpdater, WeightUpdaterBase

__all__ = ["AsyncBatchedCollector"]

_ENV_BACKENDS = ("threading", "multiprocessing")


class AsyncBatchedCollector(BaseCollector):
    """Collects from a pool of asynchronously stepped envs with a batching policy server.

    Args:
        create_env_fn: a list of callables, each returning an env of batch size ``[]``
            (their number is the number of envs).

    Keyword Args:
        policy / policy_factory: the policy, or a zero-argument callable returning it
            (exactly one).
        frames_per_batch: transitions per batch (required).
        total_frames: frames over the collector's life (``-1``: endless).
        max_batch_size: most envs in one forward pass (default 64).
        min_batch_size: envs to wait for before a forward pass (default 1: at once).
        server_timeout: seconds to wait, after the first ready env, for the others
            ``min_batch_size`` asks for (default 0.01).
        transport: ``None``, ``"auto"`` or ``"driver"``: observations and actions go
            through the driver (the only transport here); a transport object is refused.
        device: where the policy runs (inputs are moved there, actions back).
        backend / env_backend: the env pool's backend, ``"threading"`` (default) or
            ``"multiprocessing"``; ``"ray"``/``"monarch"`` are refused.
        env_exchange: ``"queue"``/``"shm"``/``"auto"``: as :class:`AsyncEnvPool`'s
            ``exchange`` (processes always use shared memory).
        envs_per_worker: 1 only.
        transition_chunk_size: ``"auto"`` or an int: accepted; transitions reach the
            driver one env step at a time.
        policy_backend: ``None`` or ``"threading"`` (the policy runs in the driver).
        reset_at_each_iter: reset every env at the start of each batch.
        postproc: applied to each batch before it is yielded.
        exploration_type: set around each forward pass (default ``RANDOM``).
        replay_buffer: extended with each batch; the iteration then yields ``None``.
        post_collect_hook: called with each batch.
        yield_completed_trajectories: yield one finished trajectory at a time (batch
            ``[T]``, time-ordered, of one env) once at least ``frames_per_batch``
            transitions were gathered since the last yield.
        weight_sync / weight_sync_model_id: ``None`` / ``"policy"``: weights go through
            :meth:`update_policy_weights_`.
        verbose: print a line per batch.
        create_env_kwargs: keyword arguments of the env makers (a dict or one per env).
        worker_affinity: CPU sets of the env worker processes (``"multiprocessing"``).
        driver_affinity: CPU set of this process (``os.sched_setaffinity``, Linux).
        server_config / device_config: TorchRL's structured configs: only ``None``.
        policy_version: the version stamped before any update (default 0).
        policy_version_key: where it is written (``None``: not written).

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> policy = TensorDictModule(lambda obs: (obs[..., 2] > 0).long(), ["observation"], ["action"])
        >>> col = AsyncBatchedCollector([CartPoleEnv] * 3, policy=policy, frames_per_batch=12, total_frames=24)
        >>> batches = list(col)
        >>> batches[0].batch_size, sorted(set(batches[0]["env_index"].tolist()))
        (torch.Size([12]), [0, 1, 2])
        >>> col.shutdown()
    """

    def __init__(
        self,
        create_env_fn: Sequence[Callable[[], EnvBase]],
        *,
        policy: Callable | None = None,
        policy_factory: Callable[[], Callable] | None = None,
        frames_per_batch: int,
        total_frames: int = -1,
        max_batch_size: int | None = None,
        min_batch_size: int | None = None,
        server_timeout: float | None = None,
        transport: Any = None,
        device: Any = None,
        backend: str | None = None,
        env_backend: str | None = None,
        env_exchange: str = "auto",
        envs_per_worker: int = 1,
        transition_chunk_size: int | str = "auto",
        policy_backend: str | None = None,
        reset_at_each_iter: bool = False,
        postproc: Callable[[TensorDictBase], TensorDictBase] | None = None,
        exploration_type: ExplorationType = ExplorationType.RANDOM,
        replay_buffer: Any = None,
        post_collect_hook: Callable[[TensorDictBase], None] | None = None,
        yield_completed_trajectories: bool = False,
        weight_sync: Any = None,
        weight_sync_model_id: str = "policy",
        verbose: bool = False,
        create_env_kwargs: dict | list[dict] | None = None,
        worker_affinity: Any = None,
        driver_affinity: Sequence[int] | None = None,
        server_config: Any = None,
        device_config: Any = None,
        policy_version: int = 0,
        policy_version_key: Any = "policy_version",
    ) -> None:
        name = type(self).__name__
        if (policy is None) == (policy_factory is None):
            raise ValueError(f"{name}: give exactly one of policy and policy_factory")
        if isinstance(create_env_fn, EnvBase) or callable(create_env_fn):
            raise TypeError(f"{name}: create_env_fn must be a list of env factories (one per env)")
        env_backend = env_backend or backend or "threading"
        if env_backend not in _ENV_BACKENDS:
            raise ValueError(f"{name}: env backend {env_backend!r} is not available here; use one of {_ENV_BACKENDS}")
        if policy_backend not in (None, "threading") or (backend not in (None, *_ENV_BACKENDS)):
            raise ValueError(f"{name}: the policy is served by the driver thread here; policy_backend must be "
                             f"None or 'threading' (got {policy_backend!r}, backend={backend!r})")
        if transport not in (None, "auto", "driver"):
            raise ValueError(f"{name}: transport objects are not supported; observations and actions go "
                             "through the driver (transport=None, 'auto' or 'driver')")
        for arg, val in (("server_config", server_config), ("device_config", device_config),
                         ("weight_sync", weight_sync)):
            if val is not None:
                raise ValueError(f"{name}: {arg} is not supported here; use max_batch_size/min_batch_size/"
                                 "server_timeout, device, and update_policy_weights_")
        if weight_sync_model_id != "policy":
            raise ValueError(f"{name}: only the 'policy' model is synced (weight_sync_model_id='policy')")
        if transition_chunk_size != "auto" and (not isinstance(transition_chunk_size, int) or transition_chunk_size < 1):
            raise ValueError(f"{name}: transition_chunk_size must be 'auto' or a positive int")
        if int(frames_per_batch) < 1:
            raise ValueError(f"{name}: frames_per_batch must be >= 1, got {frames_per_batch}")
        self.frames_per_batch = self.requested_frames_per_batch = int(frames_per_batch)
        self.total_frames = math.inf if total_frames in (None, -1, 0) else int(total_frames)
        self.max_batch_size = 64 if max_batch_size is None else int(max_batch_size)
        self.min_batch_size = 1 if min_batch_size is None else int(min_batch_size)
        self.server_timeout = 0.01 if server_timeout is None else float(server_timeout)
        if self.max_batch_size < 1 or self.min_batch_size < 1:
            raise ValueError(f"{name}: max_batch_size and min_batch_size must be >= 1")
        if driver_affinity is not None:
            os.sched_setaffinity(0, list(driver_affinity))
        self.env = AsyncEnvPool(list(create_env_fn), backend=env_backend, exchange=env_exchange,
                                worker_affinity=worker_affinity, envs_per_worker=envs_per_worker,
                                create_env_kwargs=create_env_kwargs)
        self.num_envs = self.env.num_envs
        self.policy = policy if policy is not None else policy_factory()
        self.device = None if device is None else torch.device(device)
        if self.device is not None and isinstance(self.policy, torch.nn.Module):
            self.policy.to(self.device)
        self.reset_at_each_iter = bool(reset_at_each_iter)
        self.postproc = postproc
        self.exploration_type = exploration_type
        self.replay_buffer = replay_buffer
        self.post_collect_hook = post_collect_hook
        self.yield_completed_trajectories = bool(yield_completed_trajectories)
        self.verbose = bool(verbose)
        self.policy_version_key = policy_version_key
        self._base_version = int(policy_version)
        self._frames = 0
        self._iter = -1
        self._ready: list[TensorDictBase] = []  # env inputs waiting for an action
        self._in_flight = 0
        self._started = False
        self._trajs: dict[int, list[TensorDictBase]] = {}  # unfinished trajectories by env
        self._completed: list[TensorDictBase] = []  # finished, not yielded yet
        self._closed = False
        self._init_weight_updater(None)

    def _default_weight_updater(self) -> WeightUpdaterBase:
        return VanillaWeightUpdater(policy_weights=weights_of(self.policy))

    # ------------------------------------------------------------------ the server loop
    def _start(self) -> None:
        self.env.async_reset_send()
        self._ready = list(self.env.async_reset_recv(min_get=self.num_envs).unbind(0))
        self._in_flight = 0
        self._started = True

    def _act(self) -> None:
        """One forward pass on up to ``max_batch_size`` ready envs; sends their actions."""
        batch, self._ready = self._ready[: self.max_batch_size], self._ready[self.max_batch_size:]
        td = torch.stack(batch, 0)
        with torch.no_grad(), set_exploration_type(self.exploration_type):
            x = td if self.device is None else td.to(self.device)
            out = self.policy(x)
            out = x if out is None else out
        if self.device is not None:
            out = out.to(self.env.device)
        if self.policy_version_key is not None:
            out.set(self.policy_version_key, torch.full((len(batch),), self.policy_version, dtype=torch.int64))
        self.env.async_step_and_maybe_reset_send(out)
        self._in_flight += len(batch)

    def _receive(self) -> list[TensorDictBase]:
        """Waits for finished envs (``min_batch_size``, with ``server_timeout``) and
        returns their transitions; their next inputs join the ready list."""
        want = min(self.min_batch_size, self._in_flight)
        got_t, got_n = [], []
        deadline = None
        while self._in_flight:
            n_min = 1 if not got_t else 0
            if n_min == 0 and (sum(t.batch_size[0] for t in got_t) >= want or time.monotonic() > deadline):
                break
            try:
                trans, nxt = self.env.async_step_and_maybe_reset_recv(min_get=max(n_min, 1))
            except RuntimeError:  # nothing in flight
                break
            got_t.append(trans)
            got_n.append(nxt)
            self._in_flight -= trans.batch_size[0]
            deadline = deadline or time.monotonic() + self.server_timeout
            if sum(t.batch_size[0] for t in got_t) >= want:
                break
        rows: list[TensorDictBase] = []
        for trans, nxt in zip(got_t, got_n):
            rows.extend(trans.unbind(0))
            self._ready.extend(nxt.unbind(0))
        return rows

    def _transitions(self) -> Iterator[TensorDictBase]:
        while True:
            while self._ready and (self._in_flight == 0 or len(self._ready) >= self.min_batch_size):
                self._act()
            yield from self._receive()

    @property
    def policy_version(self) -> int:
        return self._base_version + self._policy_version

    # ------------------------------------------------------------------ iteration
    def iterator(self) -> Iterator[TensorDictBase | None]:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__}: the collector was shut down")
        if not self._started:
            self._start()
        source = self._transitions()
        done_key = ("next", "done")
        while self._frames < self.total_frames:
            if self.reset_at_each_iter and self._iter >= 0:
                self._drain()
                self._start()
                source = self._transitions()
            if self.yield_completed_trajectories:
                batch = self._next_trajectory(source, done_key)
            else:
                rows = [next(source) for _ in range(self.frames_per_batch)]
                batch = torch.stack(rows, 0)
            self._frames += batch.numel()
            self._iter += 1
            if self.postproc is not None:
                batch = self.postproc(batch)
            if self.post_collect_hook is not None:
                self.post_collect_hook(batch)
            if self.verbose:
                print(f"{type(self).__name__}: batch {self._iter}, {self._frames} frames")
            if self.replay_buffer is not None:
                self.replay_buffer.extend(batch)
                yield None
            else:
                yield batch

    def _next_trajectory(self, source: Iterator[TensorDictBase], done_key: Any) -> TensorDictBase:
        gathered = 0
        while True:
            row = next(source)
            gathered += 1
            i = int(row["env_index"])
            self._trajs.setdefault(i, []).append(row)
            if bool(row.get(done_key).any()):  # finished trajectories wait in order
                self._completed.append(torch.stack(self._trajs.pop(i), 0))
            if gathered >= self.frames_per_batch and self._completed:
                return self._completed.pop(0)

    def _drain(self) -> None:
        while self._in_flight:
            trans, _ = self.env.async_step_and_maybe_reset_recv(min_get=self._in_flight)
            self._in_flight -= trans.batch_size[0]
        self._ready = []

    # ------------------------------------------------------------------ control
    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        return self.env.set_seed(seed, static_seed=static_seed)

    def reset(self) -> None:
        """Resets every env; the next transitions start new trajectories."""
        if self._started:
            self._drain()
        self._trajs, self._completed = {}, []
        self._start()

    def shutdown(self) -> None:
        """Stops the env pool (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._started:
                self._drain()
        finally:
            self.env.close()

    def state_dict(self) -> dict:
        """``{"frames", "iter", "policy_version"}`` and the policy's ``state_dict`` (a module)."""
        out: dict[str, Any] = {"frames": self._frames, "iter": self._iter, "policy_version": self.policy_version}
        if isinstance(self.policy, torch.nn.Module):
            out["policy_state_dict"] = {k: v.clone() for k, v in self.policy.state_dict().items()}
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        self._frames = int(state_dict["frames"])
        self._iter = int(state_dict["iter"])
        self._base_version = int(state_dict["policy_version"]) - self._policy_version
        if "policy_state_dict" in state_dict and isinstance(self.policy, torch.nn.Module):
            self.policy.load_state_dict(state_dict["policy_state_dict"])

    def __len__(self) -> int:
        if self.total_frames == math.inf:
            raise RuntimeError(f"{type(self).__name__}: a collector without total_frames has no length")
        return int(self.total_frames // self.frames_per_batch)
