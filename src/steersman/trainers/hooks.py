"""The hooks of :class:`~steersman.trainers.Trainer` (TorchRL's names and hook points).

Each hook is a callable with ``state_dict``/``load_state_dict`` and a ``register(trainer)``
that attaches it at its hook point (see :mod:`steersman.trainers.trainer`).

Example:
    >>> import torch
    >>> from steersman.tensordict import TensorDict
    >>> td = TensorDict({"obs": torch.arange(40.).view(4, 10, 1)}, [4, 10])
    >>> BatchSubSampler(batch_size=20, sub_traj_len=5)(td).shape
    torch.Size([4, 5])
    >>> CountFramesLog(frame_skip=2)(td)
    {'n_frames': 80, 'log_pbar': False}
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import torch

from steersman.tensordict import TensorDictBase

__all__ = [
    "BatchSubSampler", "ClearCudaCache", "CountFramesLog", "EarlyStopping", "LRSchedulerHook",
    "LogScalar", "LogTiming", "LogValidationReward", "OptimizerHook", "ReplayBufferTrainer",
    "RewardNormalizer", "SelectKeys", "TargetNetUpdaterHook", "TrainerHookBase", "UTDRHook",
    "UpdateWeights", "ValueEstimatorHook", "mask_batch",
]


def mask_batch(batch: TensorDictBase) -> TensorDictBase:
    """The valid steps of a padded batch: ``batch[batch["collector", "mask"]]`` (flat).

    A batch without a ``("collector", "mask")`` entry is returned unchanged.
    """
    mask = batch.get(("collector", "mask"), None)
    if mask is None:
        return batch
    return batch[mask]


class TrainerHookBase:
    """Base of the hooks: a stateless ``state_dict`` and ``register`` to override."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass

    def register(self, trainer: Any, name: str | None = None) -> None:
        raise NotImplementedError(f"{type(self).__name__}.register is not implemented")


class BatchSubSampler(TrainerHookBase):
    """Random sub-trajectories of a ``[B, T]`` batch, ``batch_size`` elements in total.

    Returns ``[batch_size // L, L]`` with ``L = sub_traj_len`` (``T`` when 0), each row a
    contiguous full-length window of one trajectory (so ``min_sub_traj_len`` is accepted
    and always met; padded steps are not skipped: apply ``mask_batch`` logic in the loss if
    the collector pads). A flat ``[T]`` batch is one stream
    (windows of it), or ``batch_size`` random elements when ``sub_traj_len`` is 0.
    Registered at ``process_optim_batch``.
    """

    def __init__(self, batch_size: int, sub_traj_len: int = 0, min_sub_traj_len: int = 0) -> None:
        if batch_size <= 0 or sub_traj_len < 0:
            raise ValueError(f"BatchSubSampler: batch_size must be > 0 and sub_traj_len >= 0, "
                             f"got {batch_size} and {sub_traj_len}")
        self.batch_size = batch_size
        self.sub_traj_len = sub_traj_len
        self.min_sub_traj_len = min_sub_traj_len

    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        if batch.ndim == 1:
            if not self.sub_traj_len:
                return batch[torch.randint(batch.shape[0], (self.batch_size,))]
            batch = batch.unsqueeze(0)  # one time-ordered stream (a single-env collector)
        batch = batch.reshape(-1, batch.shape[-1]) if batch.ndim > 2 else batch
        n_traj, horizon = batch.shape
        length = self.sub_traj_len or horizon
        if length > horizon:
            raise ValueError(f"BatchSubSampler: sub_traj_len={length} exceeds the batch's time "
                             f"dimension {horizon}")
        rows = self.batch_size // length
        if rows == 0:
            raise ValueError(f"BatchSubSampler: batch_size={self.batch_size} < sub_traj_len={length}")
        traj = torch.randint(n_traj, (rows,))
        start = torch.randint(horizon - length + 1, (rows,))
        time_idx = start[:, None] + torch.arange(length)
        return batch[traj[:, None].expand(rows, length), time_idx]

    def register(self, trainer: Any, name: str = "batch_subsampler") -> None:
        trainer.register_op("process_optim_batch", self)
        trainer.register_module(name, self)


class ClearCudaCache(TrainerHookBase):
    """``torch.cuda.empty_cache()`` every ``interval`` calls (a no-op without CUDA)."""

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self.count = 0

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self.count += 1
        if self.count % self.interval == 0 and torch.cuda.is_available():
            torch.cuda.empty_cache()

    def register(self, trainer: Any, name: str = "clear_cuda") -> None:
        trainer.register_op("pre_optim_steps", self)


class CountFramesLog(TrainerHookBase):
    """Logs ``n_frames``: the running count of valid frames times ``frame_skip``."""

    def __init__(self, frame_skip: int, log_pbar: bool = False) -> None:
        self.frame_count = 0
        self.frame_skip = frame_skip
        self.log_pbar = log_pbar

    def __call__(self, batch: TensorDictBase) -> dict[str, Any]:
        mask = batch.get(("collector", "mask"), None)
        n = int(mask.sum()) if mask is not None else batch.numel()
        self.frame_count += n * self.frame_skip
        return {"n_frames": self.frame_count, "log_pbar": self.log_pbar}

    def state_dict(self) -> dict[str, Any]:
        return {"frame_count": self.frame_count}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.frame_count = state_dict["frame_count"]

    def register(self, trainer: Any, name: str = "count_frames_log") -> None:
        trainer.register_op("pre_steps_log", self)
        trainer.register_module(name, self)


class LogScalar(TrainerHookBase):
    """Logs a reduction (``"mean"``/``"sum"``/``"max"``/``"min"``) of ``batch[key]``.

    The name is ``logname`` (``str(key)`` by default); ``include_std`` adds ``<name>_std``.
    Only the valid steps count when the batch has a ``("collector", "mask")``.
    """

    _REDUCTIONS = ("mean", "sum", "max", "min")

    def __init__(self, key: Any = ("next", "reward"), logname: str | None = None,
                 log_pbar: bool = False, include_std: bool = True, reduction: str = "mean") -> None:
        if reduction not in self._REDUCTIONS:
            raise ValueError(f"LogScalar: reduction={reduction!r}, expected one of {self._REDUCTIONS}")
        self.key = key
        self.logname = logname if logname is not None else str(key)
        self.log_pbar = log_pbar
        self.include_std = include_std
        self.reduction = reduction

    def __call__(self, batch: TensorDictBase) -> dict[str, Any]:
        mask = batch.get(("collector", "mask"), None)
        value = batch.get(self.key)
        if mask is not None:
            value = value[mask]
        value = value.float()
        result = {self.logname: getattr(value, self.reduction)().item(), "log_pbar": self.log_pbar}
        if self.include_std:
            result[self.logname + "_std"] = value.std().item()
        return result

    def register(self, trainer: Any, name: str | None = None) -> None:
        trainer.register_op("pre_steps_log", self)
        trainer.register_module(name or f"log_{self.logname}", self)


class LogTiming(TrainerHookBase):
    """Logs wall times as ``<prefix>/<name>``: ``iteration`` (one collector batch with its
    optimization) and whatever code reports with :meth:`record`.

    ``percall=True`` logs means per call, ``False`` totals; ``erase=True`` clears them after
    each log. (TorchRL also times each hook separately; here that is left to ``record``.)
    """

    def __init__(self, prefix: str = "time", percall: bool = True, erase: bool = False) -> None:
        self.prefix = prefix
        self.percall = percall
        self.erase = erase
        self._total: dict[str, float] = defaultdict(float)
        self._count: dict[str, int] = defaultdict(int)
        self._last = time.perf_counter()

    def record(self, name: str, seconds: float) -> None:
        self._total[name] += seconds
        self._count[name] += 1

    def __call__(self, batch: Any = None) -> dict[str, float]:
        now = time.perf_counter()
        self.record("iteration", now - self._last)
        self._last = now
        out = {f"{self.prefix}/{k}": (v / self._count[k] if self.percall else v)
               for k, v in self._total.items()}
        if self.erase:
            self._total.clear()
            self._count.clear()
        return out

    def register(self, trainer: Any, name: str = "log_timing") -> None:
        trainer.register_op("post_steps_log", self)


class EarlyStopping(TrainerHookBase):
    """Stops training when the logged metric ``monitor`` stops improving.

    After ``wait_for`` frames, a run of more than ``patience`` frames without an improvement
    of at least ``min_delta`` (in direction ``mode``) calls ``trainer.request_stop``; so does a
    non-finite value when ``check_finite``. The metric is read from the trainer's log.
    """

    def __init__(self, *, monitor: Any = "r_evaluation", mode: str = "max", min_delta: float = 0.0,
                 patience: int = 100_000, wait_for: int = 1_000_000, check_finite: bool = True) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"EarlyStopping: mode={mode!r}, expected 'min' or 'max'")
        self.monitor = monitor if isinstance(monitor, str) else str(monitor)
        self.mode = mode
        self.min_delta = min_delta
        self.patience = patience
        self.wait_for = wait_for
        self.check_finite = check_finite
        self.best: float | None = None
        self.best_frame = 0
        self.trainer: Any = None

    def __call__(self) -> None:
        trainer = self.trainer
        values = trainer._log_dict.get(self.monitor)
        if not values:
            return
        value = float(values[-1])
        frames = trainer.collected_frames
        if self.check_finite and not math.isfinite(value):
            trainer.request_stop(f"EarlyStopping: {self.monitor} is {value}")
            return
        sign = 1.0 if self.mode == "max" else -1.0
        if self.best is None or sign * (value - self.best) > self.min_delta:
            self.best, self.best_frame = value, frames
        elif frames >= self.wait_for and frames - self.best_frame > self.patience:
            trainer.request_stop(f"EarlyStopping: {self.monitor} did not improve on {self.best} "
                                 f"for {frames - self.best_frame} frames")

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_frame": self.best_frame}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best = state_dict["best"]
        self.best_frame = state_dict["best_frame"]

    def register(self, trainer: Any, name: str = "early_stopping") -> None:
        self.trainer = trainer
        trainer.register_op("post_steps", self)
        trainer.register_module(name, self)


class LogValidationReward(TrainerHookBase):
    """Every ``record_interval`` calls, rolls ``policy_exploration`` out in ``environment``
    for ``record_frames // frame_skip`` steps and logs the episode reward sum as
    ``r_evaluation`` (TorchRL's name; plus ``suffix``) and the other ``log_keys``.
    """

    def __init__(self, *, record_interval: int, record_frames: int, frame_skip: int = 1,
                 policy_exploration: Callable, environment: Any = None,
                 exploration_type: Any = None, log_keys: list | None = None,
                 out_keys: dict | None = None, suffix: str | None = None, log_pbar: bool = False,
                 recorder: Any = None) -> None:
        from steersman.tensordict.nn.interaction import ExplorationType

        environment = environment if environment is not None else recorder
        if environment is None:
            raise ValueError("LogValidationReward: pass environment=")
        self.environment = environment
        self.policy_exploration = policy_exploration
        self.record_interval = record_interval
        self.record_frames = record_frames
        self.frame_skip = frame_skip
        self.exploration_type = exploration_type if exploration_type is not None else \
            ExplorationType.DETERMINISTIC
        self.log_keys = log_keys if log_keys is not None else [("next", "reward")]
        self.out_keys = out_keys if out_keys is not None else {("next", "reward"): "r_evaluation"}
        self.suffix = suffix
        self.log_pbar = log_pbar
        self.count = 0

    @torch.no_grad()
    def __call__(self, batch: Any = None) -> dict[str, Any] | None:
        from steersman.tensordict.nn.interaction import set_exploration_type

        self.count += 1
        if (self.count - 1) % self.record_interval != 0:
            return None
        with set_exploration_type(self.exploration_type):
            td = self.environment.rollout(self.record_frames // self.frame_skip,
                                          self.policy_exploration,
                                          break_when_any_done=False)
        out: dict[str, Any] = {"log_pbar": self.log_pbar}
        for key in self.log_keys:
            name = self.out_keys.get(key, str(key))
            if self.suffix:
                name = f"{name}_{self.suffix}"
            value = td.get(key).float()
            # rewards: mean per-episode sum over the rollout (its time dim is the last)
            out[name] = value.sum(td.ndim - 1).mean().item() if key == ("next", "reward") \
                else value.mean().item()
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.count = state_dict["count"]

    def register(self, trainer: Any, name: str = "recorder") -> None:
        trainer.register_module(name, self)
        trainer.register_op("post_steps_log", self)


class LRSchedulerHook(TrainerHookBase):
    """``scheduler.step()`` after each batch (``interval="batch"``) or optim step (``"optim"``)."""

    def __init__(self, scheduler: Any, interval: str = "batch") -> None:
        if interval not in ("batch", "optim"):
            raise ValueError(f"LRSchedulerHook: interval={interval!r}, expected 'batch' or 'optim'")
        self.scheduler = scheduler
        self.interval = interval

    def __call__(self) -> None:
        self.scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def register(self, trainer: Any, name: str = "lr_scheduler") -> None:
        trainer.register_op("post_steps" if self.interval == "batch" else "post_optim", self)
        trainer.register_module(name, self)


class OptimizerHook(TrainerHookBase):
    """Backward of the sum of the ``loss_*`` entries (or ``loss_components``), clip, step.

    Called at the ``optimizer`` point with ``(losses, clip_grad_norm, clip_norm, index)``;
    ``clip_grad_norm`` clips the total norm to ``clip_norm``, otherwise each gradient is
    clamped to ``[-clip_norm, clip_norm]``. Adds ``grad_norm_<index>`` to the losses.
    """

    def __init__(self, optimizer: torch.optim.Optimizer,
                 loss_components: Sequence[str] | None = None) -> None:
        if loss_components is not None and not loss_components:
            raise ValueError("OptimizerHook: loss_components must not be empty")
        self.optimizer = optimizer
        self.loss_components = loss_components

    def _params(self) -> list[torch.Tensor]:
        return [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]

    def __call__(self, losses: TensorDictBase, clip_grad_norm: bool = True,
                 clip_norm: float | None = None, index: int = 0) -> TensorDictBase:
        keys = self.loss_components if self.loss_components is not None else \
            [k for k in losses.keys() if isinstance(k, str) and k.startswith("loss")]
        missing = [k for k in keys if k not in losses.keys()]
        if missing:
            raise KeyError(f"OptimizerHook: loss components {missing} not in the losses "
                           f"{sorted(losses.keys())}")
        total = sum(losses.get(k).sum() for k in keys)
        total.backward()
        params = self._params()
        if clip_norm is not None and clip_grad_norm:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, clip_norm)
        else:
            if clip_norm is not None:
                torch.nn.utils.clip_grad_value_(params, clip_norm)
            grad_norm = torch.linalg.vector_norm(
                torch.stack([p.grad.norm() for p in params])) if params else torch.zeros(())
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        losses.set(f"grad_norm_{index}", grad_norm.detach().clone())
        return losses

    def register(self, trainer: Any, name: str = "optimizer") -> None:
        trainer.register_op("optimizer", self)


class ReplayBufferTrainer(TrainerHookBase):
    """Extends ``replay_buffer`` with each batch and samples from it at each optim step.

    ``flatten_tensordicts`` (or ``max_dims``) stores the valid steps only (masked and flat);
    ``iterate`` makes each ``sample`` draw one batch of a pass through the buffer and raises
    ``StopIteration`` (ending the optim steps) when the pass is over. Priorities are updated
    from the ``td_error`` the loss writes (``post_loss``).
    """

    def __init__(self, replay_buffer: Any, batch_size: int | None = None, memmap: bool = False,
                 device: Any = None, flatten_tensordicts: bool = False,
                 max_dims: Sequence[int] | None = None, iterate: bool = False) -> None:
        self.replay_buffer = replay_buffer
        self.batch_size = batch_size
        self.memmap = memmap
        self.device = device
        self.flatten_tensordicts = flatten_tensordicts or max_dims is not None
        self.max_dims = max_dims
        self.iterate = iterate
        self._iterator = None

    def extend(self, batch: TensorDictBase) -> None:
        if self.flatten_tensordicts:
            batch = mask_batch(batch)
            if batch.ndim > 1:
                batch = batch.reshape(-1)
        if self.device is not None:
            batch = batch.to(self.device)
        self.replay_buffer.extend(batch)
        self._iterator = None

    def sample(self, batch: Any = None) -> TensorDictBase:
        if self.iterate:
            if self._iterator is None:
                self._iterator = iter(self.replay_buffer)
            try:
                return next(self._iterator)
            except StopIteration:
                self._iterator = None
                raise
        if self.batch_size is not None:
            return self.replay_buffer.sample(self.batch_size)
        return self.replay_buffer.sample()

    def update_priority(self, batch: TensorDictBase) -> None:
        if hasattr(self.replay_buffer, "update_tensordict_priority"):
            self.replay_buffer.update_tensordict_priority(batch)

    def state_dict(self) -> dict[str, Any]:
        return {"replay_buffer": self.replay_buffer.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.replay_buffer.load_state_dict(state_dict["replay_buffer"])

    def register(self, trainer: Any, name: str = "replay_buffer") -> None:
        trainer.register_op("batch_process", self.extend)
        trainer.register_op("process_optim_batch", self.sample)
        trainer.register_op("post_loss", self.update_priority)
        trainer.register_module(name, self)


class RewardNormalizer(TrainerHookBase):
    """Normalizes ``reward_key`` with running (decayed) statistics of the collected rewards.

    ``update_reward_stats`` (``batch_process``) folds a batch into decayed sums
    (``sum``, ``ssq``, ``count``, each multiplied by ``decay`` first);
    ``normalize_reward`` (``process_optim_batch``) writes ``(r - mean) / std * scale``
    into a copy of the batch, ``std`` being the unbiased standard deviation (at least
    ``eps``).
    """

    def __init__(self, decay: float = 0.999, scale: float = 1.0, eps: float | None = None,
                 log_pbar: bool = False, reward_key: Any = None) -> None:
        self.decay = decay
        self.scale = scale
        self.eps = eps if eps is not None else torch.finfo(torch.float32).eps
        self.log_pbar = log_pbar
        self.reward_key = reward_key if reward_key is not None else ("next", "reward")
        self._sum = torch.zeros(())
        self._ssq = torch.zeros(())
        self._count = 0.0

    @property
    def mean(self) -> torch.Tensor:
        return self._sum / self._count

    @property
    def std(self) -> torch.Tensor:
        var = (self._ssq - self._count * self.mean**2) / max(self._count - 1.0, 1e-8)
        return var.clamp_min(self.eps**2).sqrt()

    @torch.no_grad()
    def update_reward_stats(self, batch: TensorDictBase) -> None:
        reward = batch.get(self.reward_key)
        mask = batch.get(("collector", "mask"), None)
        if mask is not None:
            reward = reward[mask]
        reward = reward.float()
        self._sum = self.decay * self._sum + reward.sum()
        self._ssq = self.decay * self._ssq + reward.pow(2).sum()
        self._count = self.decay * self._count + reward.numel()

    def normalize_reward(self, batch: TensorDictBase) -> TensorDictBase:
        if self._count == 0:
            raise RuntimeError("RewardNormalizer: normalize_reward called before any "
                               "update_reward_stats")
        batch = batch.clone(False)
        reward = batch.get(self.reward_key)
        batch.set(self.reward_key, (reward - self.mean) / self.std * self.scale)
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"sum": self._sum, "ssq": self._ssq, "count": self._count, "scale": self.scale}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._sum, self._ssq = state_dict["sum"], state_dict["ssq"]
        self._count, self.scale = float(state_dict["count"]), state_dict["scale"]

    def register(self, trainer: Any, name: str = "reward_normalizer") -> None:
        trainer.register_op("batch_process", self.update_reward_stats)
        trainer.register_op("process_optim_batch", self.normalize_reward)
        trainer.register_module(name, self)


class SelectKeys(TrainerHookBase):
    """Keeps only ``keys`` of each batch (``batch_process``)."""

    def __init__(self, keys: Sequence[Any]) -> None:
        if isinstance(keys, str):
            raise TypeError(f"SelectKeys: keys must be a sequence of keys, got the string {keys!r}")
        self.keys = list(keys)

    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        return batch.select(*self.keys)

    def register(self, trainer: Any, name: str = "select_keys") -> None:
        trainer.register_op("batch_process", self)


class TargetNetUpdaterHook(TrainerHookBase):
    """``target_params_updater.step()`` after each optim step (``post_optim``)."""

    def __init__(self, target_params_updater: Any) -> None:
        if not hasattr(target_params_updater, "step"):
            raise TypeError(f"TargetNetUpdaterHook: {type(target_params_updater).__name__} has "
                            "no step() (expected a SoftUpdate/HardUpdate)")
        self.target_params_updater = target_params_updater

    def __call__(self) -> None:
        self.target_params_updater.step()

    def register(self, trainer: Any, name: str = "target_net_updater") -> None:
        trainer.register_op("post_optim", self)


class UpdateWeights(TrainerHookBase):
    """``collector.update_policy_weights_()`` every ``update_weights_interval`` batches
    (``interval_unit="batches"``, at ``post_steps``) or optim steps (``"optim_steps"``).

    ``policy_weights_getter`` (called with no argument) gives the weights to send.
    """

    def __init__(self, collector: Any = None, update_weights_interval: int = 1,
                 policy_weights_getter: Callable | None = None,
                 weight_update_map: dict | None = None, trainer: Any = None, *,
                 sender: Any = None, interval_unit: str = "batches") -> None:
        if interval_unit not in ("batches", "optim_steps"):
            raise ValueError(f"UpdateWeights: interval_unit={interval_unit!r}, expected "
                             "'batches' or 'optim_steps'")
        if collector is None and trainer is not None:
            collector = trainer.collector
        self.collector = collector
        self.update_weights_interval = update_weights_interval
        self.policy_weights_getter = policy_weights_getter
        self.weight_update_map = weight_update_map
        self.sender = sender
        self.interval_unit = interval_unit
        self.counter = 0

    def __call__(self) -> None:
        self.counter += 1
        if self.counter % self.update_weights_interval:
            return
        target = self.sender if self.sender is not None else self.collector
        if self.policy_weights_getter is not None:
            target.update_policy_weights_(self.policy_weights_getter())
        else:
            target.update_policy_weights_()

    def state_dict(self) -> dict[str, Any]:
        return {"counter": self.counter}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.counter = state_dict["counter"]

    def register(self, trainer: Any, name: str = "update_weights") -> None:
        if self.collector is None:
            self.collector = trainer.collector
        trainer.register_op("post_steps" if self.interval_unit == "batches" else "post_optim", self)
        trainer.register_module(name, self)


class UTDRHook(TrainerHookBase):
    """Logs the update-to-data ratio: optim steps per collected frame (``utd_ratio``)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def __call__(self, batch: Any = None) -> dict[str, float] | None:
        frames = self.trainer.collected_frames
        if frames == 0:
            return None
        return {"utd_ratio": self.trainer._optim_count / frames, "log_pbar": False}

    def register(self, trainer: Any, name: str = "utdr_hook") -> None:
        self.trainer = trainer
        trainer.register_op("post_steps_log", self)


class ValueEstimatorHook(TrainerHookBase):
    """Runs ``value_estimator`` (a GAE, say) on each batch, with no grad (``batch_process``)."""

    def __init__(self, value_estimator: Callable[[TensorDictBase], TensorDictBase]) -> None:
        self.value_estimator = value_estimator

    @torch.no_grad()
    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        out = self.value_estimator(batch)
        return out if isinstance(out, TensorDictBase) else batch

    def register(self, trainer: Any, name: str = "value_estimator") -> None:
        trainer.register_op("batch_process", self)
