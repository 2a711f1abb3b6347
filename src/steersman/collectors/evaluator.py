"""``Evaluator``: episodes of a policy in an eval env, blocking or in the background.

:meth:`Evaluator.evaluate` loads the given weights into the eval policy, collects
``num_trajectories`` complete episodes with a collector (starting from fresh resets)
and returns their metrics: ``"<prefix>/reward"`` (mean episode return),
``"<prefix>/reward_std"``, ``"<prefix>/episode_length"`` (mean), ``"<prefix>/num_episodes"``,
``"<prefix>/fps"`` and ``"<prefix>/step"``. :meth:`Evaluator.trigger_eval` does the same
in a background thread (the weights are copied first, so training may go on);
:meth:`poll`/:meth:`wait` return the result, ``on_result`` receives it.

Episodes: a sub-env's episode ends at a done flag (``done_keys``) or after ``max_steps``
steps; its return is the sum of its rewards (``reward_keys``). Episodes are counted in
the order they finish; the first ``num_trajectories`` count.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from steersman.envs import EnvBase
from steersman.tensordict import TensorDict, TensorDictBase, from_module
from steersman.tensordict.nn import ExplorationType

__all__ = ["Evaluator"]

_BUSY = ("skip", "error", "queue")
_BACKENDS = ("thread", "process")


class Evaluator:
    """Runs evaluation episodes of a policy, synchronously or in a background thread.

    Args:
        env: an env, or a callable returning one (then built when first needed; with
            ``policy_factory``, in the evaluator's thread).
        policy: the eval policy (exclusive with ``policy_factory``).

    Keyword Args:
        policy_factory: ``(env) -> policy``, called once with the eval env.
        num_trajectories: episodes per evaluation (default 10).
        max_steps: an episode ends after this many steps (default: at done only).
        frames_per_batch: the internal collector's batch (default ``max_steps`` per
            sub-env, else 100 per sub-env).
        collector_cls: a collector class or its name in :mod:`steersman.collectors`
            (default :class:`Collector`; ``"process"`` backend: a one-worker
            :class:`MultiSyncDataCollector`).
        collector_kwargs: extra keywords of the collector.
        weight_sync_schemes: TorchRL's weight-sync schemes: accepted only as ``None``;
            weights reach the policy through ``update_policy_weights_`` here.
        log_prefix: prefix of the metric names (default ``"eval"``).
        reward_keys, done_keys: where rewards and done flags are read (defaults
            ``("next", "reward")``, ``("next", "done")``).
        device: where the policy runs (the collector's ``policy_device``).
        exploration_type: set during the episodes (default ``DETERMINISTIC``).
        metrics_fn: ``(batch) -> dict`` of extra metrics on each collected batch;
            averaged over the batches of an evaluation, named ``"<prefix>/<name>"``.
        dump_video: call ``dump()`` on the eval env's recorder transforms (those with a
            ``dump`` method) after each evaluation (default ``True``).
        on_result: called with a TensorDict of the metrics after each evaluation.
        busy_policy: :meth:`trigger_eval` while one runs: ``"skip"`` (returns False),
            ``"error"`` (raises ``RuntimeError``) or ``"queue"``.
        backend: ``"thread"`` (the collector in this process) or ``"process"`` (a
            one-worker multi-process collector: the env and the policy live in a child
            process; needs a callable ``env`` and ``policy_factory``). ``"ray"`` is
            refused: use :mod:`steersman.distributed` for Ray evaluation.
        init_fn: called in the child process before anything else (``"process"``).
        num_gpus, ray_kwargs: Ray options; only their defaults are accepted (no Ray
            backend here).

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> policy = TensorDictModule(lambda obs: (obs[..., 2] > 0).long(), ["observation"], ["action"])
        >>> ev = Evaluator(CartPoleEnv(batch_size=[4], seed=0), policy, num_trajectories=4, max_steps=50)
        >>> m = ev.evaluate(step=1)
        >>> m["eval/num_episodes"], m["eval/step"], 0 < m["eval/episode_length"] <= 50
        (4, 1, True)
        >>> ev.shutdown()
    """

    def __init__(
        self,
        env: EnvBase | Callable[[], EnvBase],
        policy: Callable | None = None,
        *,
        policy_factory: Callable[..., Callable] | None = None,
        num_trajectories: int = 10,
        max_steps: int | None = None,
        frames_per_batch: int | None = None,
        collector_cls: type | str | None = None,
        collector_kwargs: dict | None = None,
        weight_sync_schemes: dict | None = None,
        log_prefix: str = "eval",
        reward_keys: Any = ("next", "reward"),
        done_keys: Any = ("next", "done"),
        device: Any = None,
        exploration_type: ExplorationType = ExplorationType.DETERMINISTIC,
        metrics_fn: Callable[[TensorDictBase], dict[str, float]] | None = None,
        dump_video: bool = True,
        on_result: Callable[[TensorDictBase], None] | None = None,
        busy_policy: str = "skip",
        backend: str = "thread",
        init_fn: Callable[[], None] | None = None,
        num_gpus: int = 1,
        ray_kwargs: dict | None = None,
    ) -> None:
        if (policy is None) == (policy_factory is None):
            raise ValueError("Evaluator: give exactly one of policy and policy_factory")
        if backend == "ray" or ray_kwargs is not None or num_gpus != 1:
            raise ValueError(
                "Evaluator: backend='ray' (and its num_gpus/ray_kwargs) is not available here; "
                "use backend='thread' or 'process', or steersman.distributed for Ray"
            )
        if backend not in _BACKENDS:
            raise ValueError(f"Evaluator: backend must be one of {_BACKENDS}, got {backend!r}")
        if backend == "process" and (isinstance(env, EnvBase) or policy_factory is None):
            raise ValueError(
                "Evaluator(backend='process') builds the env and the policy in the child process: "
                "pass env as a callable and a policy_factory"
            )
        if weight_sync_schemes is not None:
            raise ValueError(
                "Evaluator: weight_sync_schemes are not supported here; weights are sent with "
                "evaluate(weights)/trigger_eval(weights) through update_policy_weights_"
            )
        if busy_policy not in _BUSY:
            raise ValueError(f"Evaluator: busy_policy must be one of {_BUSY}, got {busy_policy!r}")
        if int(num_trajectories) < 1:
            raise ValueError(f"Evaluator: num_trajectories must be >= 1, got {num_trajectories}")
        if max_steps is not None and int(max_steps) < 1:
            raise ValueError(f"Evaluator: max_steps must be >= 1 or None, got {max_steps}")
        self._env_arg, self._policy, self._policy_factory = env, policy, policy_factory
        self.num_trajectories = int(num_trajectories)
        self.max_steps = None if max_steps is None else int(max_steps)
        self.frames_per_batch = frames_per_batch
        self._collector_cls = collector_cls
        self._collector_kwargs = dict(collector_kwargs or {})
        self.log_prefix = log_prefix
        self.reward_key = _key(reward_keys)
        self.done_key = _key(done_keys)
        self.device = device
        self.exploration_type = exploration_type
        self.metrics_fn = metrics_fn
        self.dump_video = bool(dump_video)
        self.on_result = on_result
        self.busy_policy = busy_policy
        self.backend = backend
        self.init_fn = init_fn
        self._collector: Any = None
        self._env: EnvBase | None = None
        self._step = 0
        self._lock = threading.Lock()  # one evaluation at a time
        self._count_lock = threading.Lock()  # the pending counter
        self._requests: queue.Queue = queue.Queue()
        self._results: queue.Queue = queue.Queue()
        self._pending = 0
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._closed = False

    # ------------------------------------------------------------------ collector
    def _make_collector(self) -> Any:
        from . import Collector, MultiSyncDataCollector  # noqa: PLC0415 (package siblings)

        kw = dict(self._collector_kwargs)
        kw.setdefault("exploration_type", self.exploration_type)
        if self.max_steps is not None:
            kw.setdefault("max_frames_per_traj", self.max_steps)
        if self.device is not None:
            kw.setdefault("policy_device", self.device)
        cls = self._collector_cls
        if isinstance(cls, str):
            from steersman import collectors  # noqa: PLC0415

            if not hasattr(collectors, cls):
                raise ValueError(f"Evaluator: collector_cls {cls!r} is not a collector of steersman.collectors")
            cls = getattr(collectors, cls)
        if self.backend == "process":
            env_fn, factory, init_fn = self._env_arg, self._policy_factory, self.init_fn

            def make_env() -> EnvBase:
                if init_fn is not None:
                    init_fn()
                return env_fn()

            probe = env_fn()  # the batch size, for the batch of frames
            n = probe.batch_size.numel()
            probe.close()
            kw.setdefault("frames_per_batch", self._fpb(n))
            return (cls or MultiSyncDataCollector)([make_env], policy_factory=lambda: factory(env_fn()),
                                                  total_frames=-1, **kw)
        env = self._env_arg if isinstance(self._env_arg, EnvBase) else self._env_arg()
        self._env = env
        policy = self._policy if self._policy is not None else self._policy_factory(env)
        self._policy = policy
        kw.setdefault("frames_per_batch", self._fpb(env.batch_size.numel()))
        return (cls or Collector)(env, policy, total_frames=-1, **kw)

    def _fpb(self, n_envs: int) -> int:
        if self.frames_per_batch is not None:
            return int(self.frames_per_batch)
        return (self.max_steps or 100) * n_envs

    # ------------------------------------------------------------------ one evaluation
    def _run(self, weights: Any, step: int | None) -> dict[str, Any]:
        if self._collector is None:
            self._collector = self._make_collector()
        col = self._collector
        if weights is not None:
            col.update_policy_weights_(weights)
        col.reset()
        start = time.perf_counter()
        returns: list[float] = []
        lengths: list[int] = []
        custom: dict[str, list[float]] = {}
        acc = length = None
        frames = 0
        for batch in col:
            rew = batch.get(self.reward_key)
            done = batch.get(self.done_key)
            n_env = batch.batch_size[:-1].numel()
            rew = rew.reshape(n_env, batch.batch_size[-1], -1).sum(-1).to(torch.float64).cpu()
            done = done.reshape(n_env, batch.batch_size[-1], -1).any(-1).cpu()
            if acc is None:
                acc = torch.zeros(n_env, dtype=torch.float64)
                length = torch.zeros(n_env, dtype=torch.int64)
            frames += batch.numel()
            if self.metrics_fn is not None:
                for k, v in self.metrics_fn(batch).items():
                    custom.setdefault(k, []).append(float(v))
            for t in range(rew.shape[1]):  # episodes in the order they finish
                acc += rew[:, t]
                length += 1
                for i in done[:, t].nonzero().flatten().tolist():
                    returns.append(float(acc[i]))
                    lengths.append(int(length[i]))
                    acc[i] = 0.0
                    length[i] = 0
            if len(returns) >= self.num_trajectories:
                break
        elapsed = time.perf_counter() - start
        returns, lengths = returns[: self.num_trajectories], lengths[: self.num_trajectories]
        r = torch.tensor(returns, dtype=torch.float64)
        if step is None:
            step = self._step
        self._step = max(self._step, step) + 1
        p = self.log_prefix
        out: dict[str, Any] = {
            f"{p}/reward": float(r.mean()),
            f"{p}/reward_std": float(r.std()) if len(returns) > 1 else 0.0,
            f"{p}/num_episodes": len(returns),
            f"{p}/episode_length": sum(lengths) / len(lengths),
            f"{p}/fps": frames / max(elapsed, 1e-9),
            f"{p}/step": step,
        }
        for k, vals in custom.items():
            out[f"{p}/{k}"] = sum(vals) / len(vals)
        if self.dump_video and self._env is not None:
            for t in getattr(self._env, "transform", ()) or ():
                if hasattr(t, "dump"):
                    t.dump(step=step)
        if self.on_result is not None:
            self.on_result(TensorDict({k: torch.as_tensor(v) for k, v in out.items()}, batch_size=[]))
        return out

    # ------------------------------------------------------------------ public API
    def evaluate(self, weights: TensorDictBase | nn.Module | None = None, step: int | None = None, *,
                 weights_dict: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Runs one evaluation now (after any running one) and returns its metrics.

        Args:
            weights: policy weights to load first (a module, or a TensorDict as
                ``TensorDict.from_module(policy)``); ``None`` keeps the current ones.
            step: the step logged with the metrics (default: an internal counter).
            weights_dict: ``{"policy": weights}`` (TorchRL's multi-model form; only the
                ``"policy"`` entry is supported here).
        """
        weights = self._weights(weights, weights_dict)
        with self._lock:
            return self._run(weights, step)

    def trigger_eval(self, weights: TensorDictBase | nn.Module | None = None, step: int | None = None, *,
                     weights_dict: Mapping[str, Any] | None = None) -> bool:
        """Starts an evaluation in the background; False if skipped (``busy_policy="skip"``
        while one is pending). The weights are copied now."""
        if self._closed:
            raise RuntimeError("Evaluator: trigger_eval after shutdown()")
        if self.pending:
            if self.busy_policy == "skip":
                return False
            if self.busy_policy == "error":
                raise RuntimeError("Evaluator.trigger_eval: an evaluation is still running (busy_policy='error')")
        weights = self._weights(weights, weights_dict)
        if weights is not None:
            weights = weights.detach().clone().cpu()
        with self._count_lock:
            self._pending += 1
        self._requests.put((weights, step))
        if self._thread is None:
            self._thread = threading.Thread(target=self._worker, name="steersman-evaluator", daemon=True)
            self._thread.start()
        return True

    def _worker(self) -> None:
        while True:
            item = self._requests.get()
            if item is None:
                return
            try:
                with self._lock:
                    result = self._run(*item)
            except BaseException as err:  # noqa: BLE001 - handed to poll()/wait()
                result = err
            self._results.put(result)  # before the count drops: wait() never misses it
            with self._count_lock:
                self._pending -= 1

    @property
    def pending(self) -> bool:
        """True while a background evaluation is queued or running."""
        return self._pending > 0

    def poll(self, timeout: float = 0) -> dict[str, Any] | None:
        """The next finished background result, or None if none is ready within ``timeout``
        seconds. An evaluation that raised re-raises here."""
        try:
            result = self._results.get(timeout=timeout) if timeout else self._results.get_nowait()
        except queue.Empty:
            return None
        if isinstance(result, BaseException):
            raise result
        return result

    def wait(self, timeout: float | None = None) -> dict[str, Any] | None:
        """Blocks until a background result is ready (None after ``timeout`` seconds)."""
        if not self.pending and self._results.empty():
            return None
        try:
            result = self._results.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(result, BaseException):
            raise result
        return result

    @staticmethod
    def extract_weights(policy: nn.Module) -> TensorDictBase:
        """Detached CPU copies of ``policy``'s parameters and buffers (safe to hand to a thread)."""
        return from_module(policy).detach().clone().cpu()

    def _weights(self, weights: Any, weights_dict: Mapping[str, Any] | None) -> TensorDictBase | None:
        if weights_dict is not None:
            extra = sorted(set(weights_dict) - {"policy"})
            if extra:
                raise ValueError(f"Evaluator: weights_dict entries {extra} are not supported; only 'policy'")
            weights = weights_dict.get("policy", weights)
        if isinstance(weights, nn.Module):
            return self.extract_weights(weights)
        return weights

    def state_dict(self) -> dict[str, Any]:
        """The evaluator's progress (its step counter); refused while an evaluation runs."""
        if self.pending:
            raise RuntimeError("Evaluator.state_dict: an evaluation is running; wait() first")
        return {"step": self._step}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        if self.pending:
            raise RuntimeError("Evaluator.load_state_dict: an evaluation is running; wait() first")
        if "step" not in state_dict:
            raise KeyError(f"Evaluator.load_state_dict: no 'step' entry (got {sorted(state_dict)})")
        self._step = int(state_dict["step"])

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stops the background thread (after the running evaluation) and the collector."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._requests.put(None)
            self._thread.join(timeout)
        if self._collector is not None:
            self._collector.shutdown()


def _key(key: Any) -> Any:
    if isinstance(key, list):
        if len(key) != 1:
            raise ValueError(f"Evaluator: one reward/done key is supported, got {key}")
        key = key[0]
    return key
