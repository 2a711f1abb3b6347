"""TorchRL's :class:`Trainer`: a collector, a loss and an optimizer driven by hooks.

The loop, per batch of the collector::

    batch = batch_process hooks(batch)          # returned TensorDicts replace the batch
    pre_steps_log hooks(batch)                  # returned dicts are logged
    pre_optim_steps hooks()
    repeat num_epochs x optim_steps_per_batch:
        sub = process_optim_batch hooks(batch)  # e.g. BatchSubSampler, ReplayBufferTrainer
        losses = loss_module(sub)
        post_loss hooks(sub)                    # e.g. replay-buffer priority updates
        losses = process_loss hooks(sub, losses)
        losses = optimizer hooks(losses, clip_grad_norm, clip_norm, index)
        post_optim hooks()                      # e.g. target-network updates
        post_optim_log hooks(sub)
    post_steps hooks()                          # e.g. weight updates of the collector
    post_steps_log hooks(batch)                 # e.g. validation reward

A hook is any callable registered with :meth:`Trainer.register_op` (or a
:class:`~steersman.trainers.TrainerHookBase` whose ``register`` does it).
"""

from __future__ import annotations

import pathlib
import random
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from steersman.tensordict import TensorDictBase
from steersman.tensordict.files import LoadError

__all__ = ["Trainer", "HOOK_POINTS"]

#: Hook points and whether their ops receive the batch (``True``) or nothing.
HOOK_POINTS = {
    "batch_process": True, "pre_optim_steps": False, "process_optim_batch": True,
    "post_loss": True, "process_loss": True, "optimizer": True, "post_steps": False,
    "post_optim": False, "pre_steps_log": True, "post_steps_log": True, "post_optim_log": True,
    "pre_epoch": True, "post_epoch": False, "pre_epoch_log": True, "post_epoch_log": True,
    "post_optim_complete_log": True, "setup": False, "shutdown": False,
}
_LOG_POINTS = ("pre_steps_log", "post_steps_log", "post_optim_log", "pre_epoch_log",
               "post_epoch_log")


class Trainer:
    """Collects data and trains a loss module, with every operation hooked in.

    Args (keyword-only, TorchRL's names):
        collector: an iterable of TensorDict batches (``[*B, T]``).
        total_frames: stop once this many frames were collected.
        frame_skip: frames counted per collected step.
        optim_steps_per_batch: optimization steps between two batches.
        loss_module: ``TensorDict -> TensorDict`` of loss components (keys ``loss_*``).
        optimizer: when given (and no ``optimization_stepper``), an
            :class:`~steersman.trainers.OptimizerHook` is registered for it.
        optimization_stepper: replaces the loss/optimizer hooks with one ``step`` call.
        replay_buffer, target_net_updater, batch_size: kept as attributes for hooks.
        learner_backend: only ``"local"`` here (``"ray"`` is refused with a reason).
        logger: a :class:`~steersman.record.Logger`; logged values go through
            ``logger.log_scalar`` every ``log_interval`` frames per key.
        clip_grad_norm, clip_norm: passed to optimizer hooks.
        progress_bar: accepted; no bar is drawn (a no-op here).
        seed: seeds torch, numpy, random and the collector.
        save_trainer_interval, save_trainer_file: save the trainer every that many frames.
        checkpoint, checkpoint_rotation, checkpoint_metadata: save through
            :mod:`steersman.checkpoint` instead of ``save_trainer_file``.
        num_epochs: passes over each batch.
        async_collection: refused (this trainer iterates its collector synchronously).
        log_timings: register a :class:`~steersman.trainers.LogTiming` hook.
        auto_log_optim_steps: log ``optim_steps`` after each batch's optimization.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> batches = [TensorDict({"x": torch.ones(4, 2)}, [4]) for _ in range(3)]
        >>> net = torch.nn.Linear(2, 1)
        >>> loss = lambda td: TensorDict({"loss_mse": net(td["x"]).pow(2).mean()}, [])
        >>> trainer = Trainer(collector=batches, total_frames=12, frame_skip=1,
        ...                   optim_steps_per_batch=2, loss_module=loss,
        ...                   optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
        >>> trainer.train()
        >>> trainer.collected_frames, trainer._optim_count
        (12, 6)
    """

    def __init__(
        self,
        *,
        collector: Any,
        total_frames: int,
        frame_skip: int = 1,
        optim_steps_per_batch: int | None = 1,
        loss_module: Callable[[TensorDictBase], TensorDictBase],
        optimizer: torch.optim.Optimizer | None = None,
        optimization_stepper: Any = None,
        replay_buffer: Any = None,
        target_net_updater: Any = None,
        batch_size: int | None = None,
        learner_backend: str = "local",
        learner_backend_options: dict | None = None,
        learner_poll_interval: float = 0.05,
        logger: Any = None,
        clip_grad_norm: bool = True,
        clip_norm: float | None = None,
        progress_bar: bool = True,
        seed: int | None = None,
        save_trainer_interval: int = 10000,
        log_interval: int = 10000,
        save_trainer_file: str | pathlib.Path | None = None,
        checkpoint: Any = None,
        checkpoint_rotation: Any = None,
        checkpoint_metadata: Callable[[Trainer], Mapping[str, Any]] | None = None,
        num_epochs: int = 1,
        async_collection: bool = False,
        log_timings: bool = False,
        auto_log_optim_steps: bool = True,
    ) -> None:
        if learner_backend != "local":
            raise ValueError(f"learner_backend={learner_backend!r}: only 'local' is supported; "
                             "use steersman.distributed for remote learners")
        if async_collection:
            raise ValueError("async_collection=True is not supported: the Trainer iterates its "
                             "collector synchronously (use an AsyncCollector as the collector)")
        if num_epochs < 1:
            raise ValueError(f"num_epochs must be >= 1, got {num_epochs}")
        self.collector = collector
        self.total_frames = total_frames
        self.frame_skip = frame_skip
        self.optim_steps_per_batch = optim_steps_per_batch
        self.loss_module = loss_module
        self.optimizer = optimizer
        self.replay_buffer = replay_buffer
        self.target_net_updater = target_net_updater
        self.batch_size = batch_size
        self.learner_backend = learner_backend
        self.learner_backend_options = learner_backend_options
        self.learner_poll_interval = learner_poll_interval
        self.logger = logger
        self.clip_grad_norm = clip_grad_norm
        self.clip_norm = clip_norm
        self.progress_bar = progress_bar
        self.save_trainer_interval = save_trainer_interval
        self._log_interval = log_interval
        self.save_trainer_file = save_trainer_file
        self.checkpoint = checkpoint
        self.checkpoint_rotation = checkpoint_rotation
        self.checkpoint_metadata = checkpoint_metadata
        self.num_epochs = num_epochs
        self.auto_log_optim_steps = auto_log_optim_steps
        self.collected_frames = 0
        self._optim_count = 0
        self._last_save = 0
        self._last_log: dict[str, int] = {}
        self._log_dict: dict[str, list] = defaultdict(list)
        self._stop_training = False
        self._stop_reason: str | None = None
        self._ops: dict[str, list] = {dest: [] for dest in HOOK_POINTS}
        self._modules: dict[str, Any] = {}
        if seed is not None:
            self.set_seed(seed)
        self.optimization_stepper = optimization_stepper
        if optimization_stepper is not None:
            optimization_stepper.register(self, name="optimization_stepper")
        elif optimizer is not None:
            from .hooks import OptimizerHook

            OptimizerHook(optimizer).register(self)
        if log_timings:
            from .hooks import LogTiming

            LogTiming().register(self)

    # ----------------------------------------------------------------- registration
    def register_op(self, dest: str, op: Callable, **kwargs: Any) -> None:
        """Call ``op`` at hook point ``dest`` (one of :data:`HOOK_POINTS`), with ``kwargs``."""
        if dest not in HOOK_POINTS:
            raise ValueError(f"register_op: unknown hook point {dest!r}; expected one of "
                             f"{sorted(HOOK_POINTS)}")
        if not callable(op):
            raise TypeError(f"register_op({dest!r}): op must be callable, got {type(op).__name__}")
        self._ops[dest].append((op, kwargs))

    register_hook = register_op

    def register_module(self, module_name: str, module: Any) -> None:
        """Make ``module``'s ``state_dict`` part of the trainer's state under ``module_name``."""
        if module_name in self._modules:
            raise RuntimeError(f"{module_name} is already registered, choose a different name.")
        self._modules[module_name] = module

    def request_stop(self, reason: str | None = None) -> None:
        """Stop training after the current batch (used by :class:`EarlyStopping`)."""
        self._stop_training = True
        self._stop_reason = reason

    def set_seed(self, seed: int) -> None:
        """Seed torch, numpy, random and the collector."""
        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)
        if hasattr(self.collector, "set_seed"):
            self.collector.set_seed(seed)

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """Counters, the loss module, the optimizer and every registered module's state."""
        state: dict[str, Any] = {"collected_frames": self.collected_frames,
                                 "_optim_count": self._optim_count, "_last_save": self._last_save}
        if isinstance(self.loss_module, torch.nn.Module):
            state["loss_module"] = self.loss_module.state_dict()
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.state_dict()
        if hasattr(self.collector, "state_dict"):
            state["collector"] = self.collector.state_dict()
        for name, module in self._modules.items():
            state[name] = module.state_dict()
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned; unknown modules raise a ``KeyError``."""
        expected = set(self._modules)
        missing = expected - set(state_dict)
        if missing:
            raise KeyError(f"Trainer.load_state_dict: no state for registered module(s) "
                           f"{sorted(missing)}")
        if "loss_module" in state_dict:
            self.loss_module.load_state_dict(state_dict["loss_module"])
        if "optimizer" in state_dict and self.optimizer is not None:
            self.optimizer.load_state_dict(state_dict["optimizer"])
        if "collector" in state_dict and hasattr(self.collector, "load_state_dict"):
            self.collector.load_state_dict(state_dict["collector"])
        for name, module in self._modules.items():
            module.load_state_dict(state_dict[name])
        self.collected_frames = int(state_dict.get("collected_frames", 0))
        self._optim_count = int(state_dict.get("_optim_count", 0))
        self._last_save = int(state_dict.get("_last_save", 0))

    def app_state(self) -> dict:
        """The state as ``{"state": state_dict()}`` (TorchRL's name)."""
        return {"state": self.state_dict()}

    def _trainer_checkpoint(self) -> Any:
        from steersman.checkpoint import Checkpoint

        if self.checkpoint is not None:
            return self.checkpoint
        return Checkpoint(trainer=self)

    def save_trainer(self, force_save: bool = False) -> None:
        """Save the trainer (atomically) when ``save_trainer_interval`` frames passed."""
        due = self.collected_frames - self._last_save >= self.save_trainer_interval
        if not (force_save or due):
            return
        if self.checkpoint_rotation is None and self.save_trainer_file is None:
            return
        self._last_save = self.collected_frames
        metadata = {"collected_frames": self.collected_frames, "optim_steps": self._optim_count}
        if self.checkpoint_metadata is not None:
            metadata.update(self.checkpoint_metadata(self))
        ckpt = self._trainer_checkpoint()
        if self.checkpoint_rotation is not None:
            self.checkpoint_rotation.save(ckpt, step=self.collected_frames, metadata=metadata)
        else:
            ckpt.save(self.save_trainer_file, metadata=metadata)

    def load_from_file(self, file: str | pathlib.Path, **kwargs: Any) -> Trainer:
        """Restore the trainer from a checkpoint written by :meth:`save_trainer`."""
        result = self._trainer_checkpoint().load(file, **kwargs)
        if "trainer" not in result.loaded and self.checkpoint is None:
            raise LoadError(f"{file}: holds no 'trainer' component", file=file, field="trainer")
        return self

    # ----------------------------------------------------------------- loop
    def _run(self, dest: str, *args: Any) -> Any:
        """Run the ops of ``dest``; a returned TensorDict replaces ``args[0]``."""
        out = args[0] if args else None
        for op, kwargs in self._ops[dest]:
            result = op(*args, **kwargs)
            if dest in _LOG_POINTS:
                if result is not None:
                    self._log(**result)
            elif isinstance(result, TensorDictBase) and args:
                out = result
                args = (result, *args[1:])
        return out

    def _log(self, log_pbar: bool = False, **kwargs: Any) -> None:
        for key, value in kwargs.items():
            self._log_dict[key].append(value)
            if self.collected_frames - self._last_log.get(key, 0) > self._log_interval or \
                    key not in self._last_log:
                self._last_log[key] = self.collected_frames
                if self.logger is not None and not isinstance(value, str):
                    self.logger.log_scalar(key, float(value), step=self.collected_frames)

    def optim_steps(self, batch: TensorDictBase) -> None:
        """Run ``num_epochs x optim_steps_per_batch`` optimization steps on ``batch``."""
        self._run("pre_optim_steps")
        average = None
        steps = 0
        for _ in range(self.num_epochs):
            self._run("pre_epoch_log", batch)
            epoch_batch = self._run("pre_epoch", batch)
            j = 0
            while self.optim_steps_per_batch is None or j < self.optim_steps_per_batch:
                j += 1
                try:
                    sub = self._run("process_optim_batch", epoch_batch)
                except StopIteration:
                    break
                if sub is None:
                    break
                self._optim_count += 1
                if self.optimization_stepper is not None:
                    losses = self.optimization_stepper.step(self, sub)
                else:
                    losses = self.loss_module(sub)
                    self._run("post_loss", sub)
                    for op, kwargs in self._ops["process_loss"]:
                        out = op(sub, losses, **kwargs)
                        if isinstance(out, TensorDictBase):
                            losses = out
                    for i, (op, kwargs) in enumerate(self._ops["optimizer"]):
                        out = op(losses, self.clip_grad_norm, self.clip_norm, i, **kwargs)
                        if isinstance(out, TensorDictBase):
                            losses = out
                    losses = losses.detach()
                self._run("post_optim")
                self._run("post_optim_log", sub)
                steps += 1
                average = losses.clone() if average is None else average.apply(
                    lambda a, x, n=steps: a + (x - a) / n, losses)
            self._run("post_epoch_log", batch)
            self._run("post_epoch")
        if steps:
            for op, kwargs in self._ops["post_optim_complete_log"]:
                out = op(self._optim_count, average, **kwargs)
                if out is not None:
                    self._log(**out)
            if self.auto_log_optim_steps:
                self._log(optim_steps=self._optim_count)
            for key, value in average.items():
                if value.numel() == 1:
                    self._log(**{key: value.item()})

    def train(self) -> None:
        """Iterate the collector until ``total_frames`` frames or a stop request."""
        self._run("setup")
        init_random = getattr(self.collector, "init_random_frames", 0) or 0
        for batch in self.collector:
            batch = self._run("batch_process", batch)
            mask = batch.get(("collector", "mask"), None)
            count = int(mask.sum()) if mask is not None else batch.numel()
            self.collected_frames += count * self.frame_skip
            self._run("pre_steps_log", batch)
            if self.collected_frames >= init_random:
                self.optim_steps(batch)
            self._run("post_steps")
            self._run("post_steps_log", batch)
            if self._stop_training or self.collected_frames >= self.total_frames:
                self.save_trainer(force_save=True)
                break
            self.save_trainer()
        self._run("shutdown")
        self.shutdown()

    def shutdown(self) -> None:
        """Shut the collector down (when it has a ``shutdown``)."""
        if hasattr(self.collector, "shutdown"):
            self.collector.shutdown()
