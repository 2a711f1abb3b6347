"""``AsyncEnvPool``: a pool of envs that can be stepped all together (an env of batch size
``[num_envs]``) or asynchronously, some envs at a time (``async_step_send`` /
``async_step_recv``): a caller sends work for the envs that are ready and receives the
results of whichever finish first.

Backends: ``"threading"`` (:class:`ThreadingAsyncEnvPool`: one thread per env, for envs
that release the GIL or wait on I/O) and ``"multiprocessing"``
(:class:`ProcessorAsyncEnvPool`: one worker process per env, on the machinery of
:class:`ParallelEnv`: shared-memory exchange, workers that die with the parent, a crashed
or failing worker reported as an :class:`EnvWorkerError` naming it).
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections.abc import Callable
from typing import Any

import torch

from steersman.tensordict import TensorDict, TensorDictBase

from ..common import EnvBase
from ._base import EnvWorkerError
from ._buffers import build_td
from .env_creator import EnvMetaData

__all__ = ["AsyncEnvPool", "ThreadingAsyncEnvPool", "ProcessorAsyncEnvPool"]

_ENV_INDEX = "env_index"
_STEP, _RESET, _STEP_RESET = "step", "reset", "step_and_maybe_reset"


def _makers(env_makers: Any, create_env_kwargs: Any) -> list[Callable[[], EnvBase]]:
    makers = list(env_makers) if isinstance(env_makers, (list, tuple)) else [env_makers]
    if not makers:
        raise ValueError("AsyncEnvPool needs at least one env maker")
    if create_env_kwargs is None:
        kws: list[dict] = [{}] * len(makers)
    elif isinstance(create_env_kwargs, dict):
        kws = [create_env_kwargs] * len(makers)
    else:
        kws = list(create_env_kwargs)
        if len(kws) != len(makers):
            raise ValueError(f"AsyncEnvPool: {len(kws)} create_env_kwargs for {len(makers)} env makers")
    out = []
    for i, (m, kw) in enumerate(zip(makers, kws)):
        if isinstance(m, EnvBase):
            if kw:
                raise ValueError(f"AsyncEnvPool: env {i} is an env instance; create_env_kwargs need a maker")
            out.append(m)
        elif callable(m):
            out.append((lambda m=m, kw=kw: m(**kw)) if kw else m)
        else:
            raise TypeError(f"AsyncEnvPool: env maker {i} is a {type(m).__name__}, not a callable or an EnvBase")
    return out


def _indices(td: TensorDictBase, n: int, owner: str) -> list[int]:
    idx = td.get(_ENV_INDEX, None)
    if idx is None:
        if td.batch_dims == 1 and td.batch_size[0] == n:
            return list(range(n))
        raise KeyError(f"{owner}: the TensorDict has no {_ENV_INDEX!r} entry saying which envs it is for "
                       f"(batch size {list(td.batch_size)})")
    vals = torch.as_tensor(idx).reshape(-1).tolist()
    bad = [v for v in vals if not 0 <= int(v) < n]
    if bad:
        raise IndexError(f"{owner}: env_index {bad} out of range for a pool of {n} envs")
    if len(set(vals)) != len(vals):
        raise ValueError(f"{owner}: env_index {vals} names an env twice in one send")
    return [int(v) for v in vals]


class AsyncEnvPool(EnvBase):
    """A pool of ``num_envs`` envs with a synchronous API (one env of batch size
    ``[num_envs]``) and an asynchronous one.

    Asynchronous use: ``async_step_send(td)`` starts a step of the envs named by
    ``td["env_index"]`` (one per element; ``td`` of batch size ``[k]`` or ``[]``);
    ``async_step_recv(min_get=1)`` waits until at least ``min_get`` sent envs have finished
    and returns the results of all finished ones, stacked (batch ``[m]``), with their
    ``"env_index"``. Same for ``async_reset_send``/``async_reset_recv`` and
    ``async_step_and_maybe_reset_send``/``_recv`` (the latter returns ``(transition,
    next_input)``). An env must be received before it is sent work again.

    Args:
        env_makers: a callable returning an env, an env, or a list of them (one per env).
        backend: ``"threading"`` (default) or ``"multiprocessing"``; ``"asyncio"`` is refused
            (no asyncio backend: the threading one serves the same purpose).
        stack: ``"dense"`` (default); ``"lazy"``/``"maybe_dense"`` are accepted and give the
            same dense stacks (the envs must share their specs).
        exchange: ``"queue"``/``"shm"``/``"auto"``: accepted; the multiprocessing backend
            always exchanges through shared memory.
        worker_affinity: per-worker CPU sets (multiprocessing, Linux): applied with
            ``os.sched_setaffinity`` in each worker.
        envs_per_worker: 1 only (one env per worker process).
        create_env_kwargs: keyword arguments for the makers (a dict or one per env).

    Every env must have the same specs and batch size ``[]`` (the pool's batch is
    ``[num_envs]``). Sync steps return the data without ``"env_index"``.

    Example:
        >>> import torch
        >>> from steersman.envs import AsyncEnvPool, PendulumEnv
        >>> pool = AsyncEnvPool([PendulumEnv, PendulumEnv, PendulumEnv], backend="threading")
        >>> pool.batch_size
        torch.Size([3])
        >>> td = pool.reset()
        >>> td["action"] = torch.zeros(3, 1)
        >>> td["env_index"] = torch.arange(3)
        >>> pool.async_step_send(td[1:])          # envs 1 and 2
        >>> out = pool.async_step_recv(min_get=2)
        >>> sorted(out["env_index"].tolist()), out["next", "observation"].shape
        ([1, 2], torch.Size([2, 3]))
        >>> pool.close()
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> AsyncEnvPool:
        if cls is AsyncEnvPool:
            backend = kwargs.get("backend", "threading")
            if backend == "threading":
                cls = ThreadingAsyncEnvPool
            elif backend == "multiprocessing":
                cls = ProcessorAsyncEnvPool
            elif backend == "asyncio":
                raise ValueError("AsyncEnvPool(backend='asyncio') is not provided by steersman; use 'threading' "
                                 "(envs stepped concurrently in threads) or 'multiprocessing'")
            else:
                raise ValueError(f"AsyncEnvPool: backend must be 'threading' or 'multiprocessing', got {backend!r}")
        return super().__new__(cls)

    def __init__(self, env_makers: Any, *, backend: str = "threading", stack: str = "dense",
                 exchange: str | None = None, worker_affinity: Any = None, envs_per_worker: int = 1,
                 create_env_kwargs: dict | list[dict] | None = None) -> None:
        if stack not in ("dense", "maybe_dense", "lazy"):
            raise ValueError(f"AsyncEnvPool: stack must be 'dense', 'maybe_dense' or 'lazy', got {stack!r}")
        if exchange not in (None, "queue", "shm", "auto"):
            raise ValueError(f"AsyncEnvPool: exchange must be 'queue', 'shm' or 'auto', got {exchange!r}")
        if envs_per_worker != 1:
            raise ValueError("AsyncEnvPool: envs_per_worker must be 1 here (one env per worker)")
        self.env_makers = _makers(env_makers, create_env_kwargs)
        self.num_envs = len(self.env_makers)
        self.backend = backend
        self.stack = stack
        self.envs_per_worker = 1
        self.worker_affinity = worker_affinity
        self.min_get = 1
        self._busy: dict[int, str] = {}
        self._lock = threading.Lock()
        meta = self._setup()
        if meta.batch_size != torch.Size([]):
            self._shutdown_quietly()
            raise ValueError(f"{type(self).__name__}: the envs must have batch size [], got {list(meta.batch_size)}")
        super().__init__(device=meta.device, batch_size=[self.num_envs])
        n = self.num_envs
        self.full_observation_spec = meta.specs["full_observation_spec"].expand(n)
        self.full_state_spec = meta.specs["full_state_spec"].expand(n)
        self.full_action_spec = meta.specs["full_action_spec"].expand(n)
        self.full_reward_spec = meta.specs["full_reward_spec"].expand(n)
        self.full_done_spec = meta.specs["full_done_spec"].expand(n)
        self._meta = meta

    # ------------------------------------------------------------------ backend API
    def _setup(self) -> EnvMetaData:
        raise NotImplementedError

    def _send(self, cmd: str, idx: list[int], td: TensorDictBase | None) -> None:
        raise NotImplementedError

    def _recv(self, cmd: str, min_get: int) -> list[tuple[int, Any]]:
        raise NotImplementedError

    def _shutdown_quietly(self) -> None:
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001 - construction already failed; that error is raised
            pass

    def shutdown(self) -> None:
        """Stops the threads or worker processes (``close`` calls it)."""

    @property
    def env_batch_sizes(self) -> list[torch.Size]:
        """The batch size of each env (all ``[]``)."""
        return [torch.Size([])] * self.num_envs

    # ------------------------------------------------------------------ async API
    def _split(self, td: TensorDictBase | None, cmd: str) -> tuple[list[int], TensorDictBase | None]:
        owner = f"{type(self).__name__}.async_{cmd}_send"
        if td is None:
            if cmd != _RESET:
                raise ValueError(f"{owner} needs a TensorDict with the actions and 'env_index'")
            idx = list(range(self.num_envs))  # every env
        else:
            if td.batch_dims == 0:
                td = td.unsqueeze(0)
            idx = _indices(td, self.num_envs, owner)
        with self._lock:
            busy = [i for i in idx if i in self._busy]
            if busy:
                raise RuntimeError(f"{owner}: envs {busy} have work in flight ({[self._busy[i] for i in busy]}); "
                                   "receive their results first")
            for i in idx:
                self._busy[i] = cmd
        return idx, td

    def _gather(self, cmd: str, min_get: int | None) -> list[tuple[int, Any]]:
        pending = [i for i, c in self._busy.items() if c == cmd]
        if not pending:
            raise RuntimeError(f"{type(self).__name__}.async_{cmd}_recv: nothing was sent")
        m = self.min_get if min_get is None else int(min_get)
        got = self._recv(cmd, min(max(m, 1), len(pending)))
        with self._lock:
            for i, _ in got:
                self._busy.pop(i, None)
        return sorted(got, key=lambda x: x[0])

    def _stack(self, items: list[tuple[int, TensorDictBase]]) -> TensorDictBase:
        out = torch.stack([td for _, td in items], 0)
        out.set(_ENV_INDEX, torch.tensor([i for i, _ in items], dtype=torch.int64))
        return out

    def async_step_send(self, tensordict: TensorDictBase) -> None:
        """Starts a step of the envs named by ``tensordict["env_index"]``."""
        idx, td = self._split(tensordict, _STEP)
        self._send(_STEP, idx, td)

    def async_step_recv(self, min_get: int | None = None) -> TensorDictBase:
        """The transitions (input + ``"next"``) of the finished envs (at least ``min_get``)."""
        return self._stack(self._gather(_STEP, min_get))

    def async_reset_send(self, tensordict: TensorDictBase | None = None, env_index: Any = None) -> None:
        """Starts a reset of the envs named by ``tensordict["env_index"]`` (all if None)."""
        if tensordict is None and env_index is not None:
            ei = torch.as_tensor(env_index).reshape(-1)
            tensordict = TensorDict({_ENV_INDEX: ei}, batch_size=[len(ei)])
        idx, td = self._split(tensordict, _RESET)
        self._send(_RESET, idx, td)

    def async_reset_recv(self, min_get: int | None = None) -> TensorDictBase:
        return self._stack(self._gather(_RESET, min_get))

    def async_step_and_maybe_reset_send(self, tensordict: TensorDictBase) -> None:
        idx, td = self._split(tensordict, _STEP_RESET)
        self._send(_STEP_RESET, idx, td)

    def async_step_and_maybe_reset_recv(self, min_get: int | None = None) -> tuple[TensorDictBase, TensorDictBase]:
        got = self._gather(_STEP_RESET, min_get)
        return (self._stack([(i, r[0]) for i, r in got]), self._stack([(i, r[1]) for i, r in got]))

    # ------------------------------------------------------------------ sync API
    def _all(self, cmd: str, td: TensorDictBase | None, idx: list[int]) -> list[tuple[int, Any]]:
        with self._lock:
            busy = [i for i in idx if i in self._busy]
            if busy:
                raise RuntimeError(f"{type(self).__name__}.{cmd}: envs {busy} have async work in flight; receive "
                                   "their results first")
            for i in idx:
                self._busy[i] = cmd
        self._send(cmd, idx, td)
        return self._gather(cmd, len(idx))

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        got = self._all(_STEP, tensordict.exclude(_ENV_INDEX), list(range(self.num_envs)))
        return torch.stack([r.get("next") for _, r in got], 0)

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        if kwargs:
            raise TypeError(f"{type(self).__name__}.reset takes no keyword arguments, got {sorted(kwargs)}")
        mask = self._reset_mask(tensordict)
        idx = list(range(self.num_envs)) if mask is None else mask.nonzero().flatten().tolist()
        if not idx:
            return tensordict.exclude("_reset") if tensordict is not None else TensorDict({}, self.batch_size)
        sub = None
        if tensordict is not None:
            sub = tensordict.exclude("_reset", _ENV_INDEX)
        got = dict(self._all(_RESET, sub, idx))
        if len(got) == self.num_envs:
            return torch.stack([got[i].exclude(_ENV_INDEX) for i in range(self.num_envs)], 0)
        template = next(iter(got.values()))
        rows = [got[i] if i in got else template.apply(torch.zeros_like) for i in range(self.num_envs)]
        return torch.stack(rows, 0)  # the rows not reset are replaced by their input in reset()

    def _set_seed(self, seed: int | None) -> None:
        raise NotImplementedError

    def close(self) -> None:
        if not self.is_closed:
            self.shutdown()
        super().close()

    def __del__(self) -> None:
        try:
            if not self.is_closed:
                self.shutdown()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _run_env(env: EnvBase, cmd: str, td: TensorDictBase | None) -> Any:
    if cmd == _STEP:
        return env.step(td)
    if cmd == _RESET:
        return env.reset(td)
    return env.step_and_maybe_reset(td)


class ThreadingAsyncEnvPool(AsyncEnvPool):
    """:class:`AsyncEnvPool` with one thread per env (the envs live in this process).

    An exception raised by an env is re-raised by the ``recv`` that collects it as an
    :class:`EnvWorkerError` naming the env index (the pool stays usable).
    """

    def _setup(self) -> EnvMetaData:
        self._envs: list[EnvBase] = []
        try:
            for i, m in enumerate(self.env_makers):
                env = m if isinstance(m, EnvBase) else m()
                if not isinstance(env, EnvBase):
                    raise TypeError(f"ThreadingAsyncEnvPool: env maker {i} returned a {type(env).__name__}, "
                                    "not an EnvBase")
                self._envs.append(env)
            metas = [EnvMetaData.from_env(e) for e in self._envs]
            for i, meta in enumerate(metas[1:], 1):
                diff = metas[0].mismatch(meta)
                if diff is not None:
                    raise ValueError(f"ThreadingAsyncEnvPool: env {i} differs from env 0: its {diff}; the envs of a "
                                     "pool must share their specs")
        except BaseException:
            for e in self._envs:
                e.close()
            raise
        self._executors = [cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"async-env-{i}")
                           for i in range(self.num_envs)]
        self._futures: dict[int, cf.Future] = {}
        return metas[0]

    def _send(self, cmd: str, idx: list[int], td: TensorDictBase | None) -> None:
        for k, i in enumerate(idx):
            sub = None if td is None else td[k].exclude(_ENV_INDEX)
            self._futures[i] = self._executors[i].submit(_run_env, self._envs[i], cmd, sub)

    def _recv(self, cmd: str, min_get: int) -> list[tuple[int, Any]]:
        pending = {self._futures[i]: i for i, c in self._busy.items() if c == cmd}
        done: set = set()
        while len(done) < min_get:
            finished, _ = cf.wait(set(pending) - done, return_when=cf.FIRST_COMPLETED)
            done |= finished
        done = {f for f in pending if f.done()}
        out, failed = [], None
        for f in done:
            i = pending[f]
            self._futures.pop(i, None)
            exc = f.exception()
            if exc is not None:
                if failed is None or i < failed[0]:
                    failed = (i, exc)
                with self._lock:
                    self._busy.pop(i, None)
                continue
            out.append((i, f.result()))
        if failed is not None:
            i, exc = failed
            with self._lock:
                for j, _ in out:
                    self._busy.pop(j, None)
            raise EnvWorkerError(f"ThreadingAsyncEnvPool env {i} ({type(self._envs[i]).__name__}) raised "
                                 f"{type(exc).__name__}: {exc}", worker_index=i) from exc
        return out

    def _set_seed(self, seed: int | None) -> None:
        for i, env in enumerate(self._envs):
            env.set_seed(None if seed is None else seed + i)

    def set_seed(self, seed: int | None = None, static_seed: bool = False) -> int | None:
        """Seeds env ``i`` with ``seed + i``."""
        self._set_seed(seed)
        return None if seed is None else seed + self.num_envs

    def shutdown(self) -> None:
        for ex in getattr(self, "_executors", []):
            ex.shutdown(wait=True, cancel_futures=True)
        self._executors = []
        for env in getattr(self, "_envs", []):
            env.close()


class ProcessorAsyncEnvPool(AsyncEnvPool):
    """:class:`AsyncEnvPool` with one worker process per env, on :class:`ParallelEnv`'s
    machinery: inputs and outputs travel through shared memory, each command is one small
    message to the env's worker, and the results of whichever workers answer first are
    received. Workers exit with the parent (even after SIGKILL); a worker that raises is
    reported as an :class:`EnvWorkerError` naming it (the pool stays open), one that dies
    with its exit code or signal (the pool is then closed).
    """

    def _setup(self) -> EnvMetaData:
        from .parallel import ParallelEnv

        makers = [(lambda e=m: e) if isinstance(m, EnvBase) else m for m in self.env_makers]
        self._penv = ParallelEnv(self.num_envs, makers, shared_memory=True)
        if self.worker_affinity is not None:
            import os

            for i, pid in enumerate(self._penv.worker_pids):
                cpus = self.worker_affinity(i) if callable(self.worker_affinity) else self.worker_affinity[i]
                if hasattr(os, "sched_setaffinity"):
                    os.sched_setaffinity(pid, set(cpus))
        p = self._penv
        specs = {name: getattr(p, name)[0].clone() for name in
                 ("full_observation_spec", "full_state_spec", "full_action_spec", "full_reward_spec",
                  "full_done_spec")}
        return EnvMetaData(specs, torch.Size([]), p.device, "ProcessorAsyncEnvPool")

    def _send(self, cmd: str, idx: list[int], td: TensorDictBase | None) -> None:
        from ._buffers import get_entry
        from .pool import frame
        from .worker import F_PARTIAL, F_STATE, RESET, STEP, STEP_RESET

        p = self._penv
        code = {_STEP: STEP, _RESET: RESET, _STEP_RESET: STEP_RESET}[cmd]
        flags = 0
        pairs = p._in_pairs if cmd != _RESET else p._state_in_pairs
        if td is not None and pairs:
            have = all(get_entry(td, k) is not None for k, _ in pairs)
            if cmd != _RESET and not have:
                missing = [k for k, _ in pairs if get_entry(td, k) is None]
                raise KeyError(f"ProcessorAsyncEnvPool.{cmd}: the tensordict has no entries {missing}")
            if have:
                for key, dst in pairs:
                    src = get_entry(td, key)
                    for j, i in enumerate(idx):
                        dst[i].copy_(src[j])
                if cmd == _RESET:
                    flags |= F_STATE
        if cmd == _RESET:
            p._mask_view.zero_()
            for i in idx:
                p._mask_view[i] = True
            flags |= F_PARTIAL
        msg = frame(bytes((code, flags)))
        for i in idx:
            p._pool.send(i, msg, f"async {cmd}")

    def _row(self, pairs: list, i: int) -> TensorDictBase:
        return build_td([(k, v[i].clone()) for k, v in pairs], torch.Size([]), self.device,
                        all(type(k) is str for k, _ in pairs))

    def _recv(self, cmd: str, min_get: int) -> list[tuple[int, Any]]:
        from .worker import OK_RESET

        p = self._penv
        pending = [i for i, c in self._busy.items() if c == cmd]
        replies: dict[int, bytes] = {}
        try:
            while len(replies) < min_get:
                left = [i for i in pending if i not in replies]
                replies.update(p._pool.wait(left, f"async {cmd}", p.timeout, first=True, keep_open=True))
        except EnvWorkerError:
            with self._lock:
                for i in pending:
                    if i not in p._pool.inflight:
                        self._busy.pop(i, None)
            raise
        out = []
        for i, msg in replies.items():
            if cmd == _RESET:
                out.append((i, self._row(p._root_pairs, i)))
                continue
            nxt = self._row(p._next_pairs, i)
            if cmd == _STEP:
                out.append((i, nxt))
                continue
            out.append((i, (nxt, msg[:1] == OK_RESET)))
        return out

    def _gather(self, cmd: str, min_get: int | None) -> list[tuple[int, Any]]:
        got = super()._gather(cmd, min_get)
        if cmd == _STEP:
            return [(i, self._with_input(i, nxt)) for i, nxt in got]
        if cmd == _STEP_RESET:
            res = []
            for i, (nxt, was_reset) in got:
                tr = self._with_input(i, nxt)
                td_ = self._row(self._penv._root_pairs, i) if was_reset else self._step_mdp(tr)
                res.append((i, (tr, td_)))
            return res
        return got

    def _with_input(self, i: int, nxt: TensorDictBase) -> TensorDictBase:
        inp = self._inputs.pop(i, None)
        td = inp.clone(False) if inp is not None else TensorDict({}, batch_size=[])
        td.set("next", nxt)
        return td

    _inputs: dict = {}

    def async_step_send(self, tensordict: TensorDictBase) -> None:
        self.__dict__.setdefault("_inputs", {})
        td = tensordict if tensordict.batch_dims else tensordict.unsqueeze(0)
        idx = _indices(td, self.num_envs, "ProcessorAsyncEnvPool.async_step_send")
        super().async_step_send(tensordict)
        for k, i in enumerate(idx):
            self._inputs[i] = td[k].exclude(_ENV_INDEX)

    def async_step_and_maybe_reset_send(self, tensordict: TensorDictBase) -> None:
        self.__dict__.setdefault("_inputs", {})
        td = tensordict if tensordict.batch_dims else tensordict.unsqueeze(0)
        idx = _indices(td, self.num_envs, "ProcessorAsyncEnvPool.async_step_and_maybe_reset_send")
        super().async_step_and_maybe_reset_send(tensordict)
        for k, i in enumerate(idx):
            self._inputs[i] = td[k].exclude(_ENV_INDEX)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        self.__dict__.setdefault("_inputs", {})
        td = tensordict.exclude(_ENV_INDEX)
        for i in range(self.num_envs):
            self._inputs[i] = td[i]
        got = self._all(_STEP, td, list(range(self.num_envs)))
        return torch.stack([r.get("next") for _, r in got], 0)

    def _set_seed(self, seed: int | None) -> None:
        self._penv.set_seed(seed)

    def set_seed(self, seed: int | None = None, static_seed: bool = False) -> int | None:
        return self._penv.set_seed(seed, static_seed)

    @property
    def worker_pids(self) -> list[int]:
        return self._penv.worker_pids

    def shutdown(self) -> None:
        p = getattr(self, "_penv", None)
        if p is not None and not p.is_closed:
            p.close()

