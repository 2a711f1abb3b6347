"""Optimization steppers: one ``step(trainer, batch)`` that computes the loss and updates.

A stepper given to :class:`~steersman.trainers.Trainer` (``optimization_stepper=``) replaces
the ``post_loss``/``process_loss``/``optimizer`` hooks of each optimization step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch

from steersman.tensordict import TensorDictBase

from .hooks import TrainerHookBase

__all__ = ["DefaultOptimizationStepper", "MixedPrecisionOptimizationStepper", "OptimizationStepper"]


def _total_loss(losses: TensorDictBase, components: Sequence[str] | None) -> torch.Tensor:
    keys = components if components is not None else \
        [k for k in losses.keys() if isinstance(k, str) and k.startswith("loss")]
    missing = [k for k in keys if k not in losses.keys()]
    if missing:
        raise KeyError(f"loss components {missing} not in the losses {sorted(losses.keys())}")
    return sum(losses.get(k).sum() for k in keys)


class OptimizationStepper(TrainerHookBase):
    """Base class: subclasses implement ``step(trainer, batch) -> detached losses``."""

    def step(self, trainer: Any, batch: TensorDictBase) -> TensorDictBase:
        raise NotImplementedError(f"{type(self).__name__}.step is not implemented")

    def register(self, trainer: Any, name: str = "optimization_stepper") -> None:
        self.trainer = trainer


class DefaultOptimizationStepper(OptimizationStepper):
    """The trainer's loss, ``post_loss`` hooks, then backward/clip/step of ``trainer.optimizer``."""

    def __init__(self, loss_components: Sequence[str] | None = None) -> None:
        self.loss_components = loss_components

    def step(self, trainer: Any, batch: TensorDictBase) -> TensorDictBase:
        from .hooks import OptimizerHook

        losses = trainer.loss_module(batch)
        trainer._run("post_loss", batch)
        hook = OptimizerHook(trainer.optimizer, self.loss_components)
        return hook(losses, trainer.clip_grad_norm, trainer.clip_norm, 0).detach()


class MixedPrecisionOptimizationStepper(OptimizationStepper):
    """Loss under ``torch.autocast`` (when ``mixed_precision``), gradient accumulation over
    ``gradient_accumulation_steps`` calls, total-norm clipping to ``clip_norm``.

    On CPU, bfloat16 autocast is used; float16 gradient scaling applies on CUDA only.
    ``optimizer_step_count`` counts the actual optimizer steps.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, mixed_precision: bool = False,
                 autocast_dtype: torch.dtype = torch.bfloat16, gradient_accumulation_steps: int = 1,
                 clip_norm: float | None = 1.0, device_type: str | None = None) -> None:
        if gradient_accumulation_steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be >= 1, got "
                             f"{gradient_accumulation_steps}")
        self.optimizer = optimizer
        self.mixed_precision = mixed_precision
        self.autocast_dtype = autocast_dtype
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.clip_norm = clip_norm
        self.device_type = device_type
        self.optimizer_step_count = 0
        self._micro = 0

    def step(self, trainer: Any, batch: TensorDictBase) -> TensorDictBase:
        device_type = self.device_type or ("cuda" if batch.device is not None
                                           and batch.device.type == "cuda" else "cpu")
        ctx = torch.autocast(device_type, dtype=self.autocast_dtype) if self.mixed_precision \
            else contextlib.nullcontext()
        with ctx:
            losses = trainer.loss_module(batch)
            total = _total_loss(losses, None)
        trainer._run("post_loss", batch)
        (total / self.gradient_accumulation_steps).backward()
        self._micro += 1
        if self._micro % self.gradient_accumulation_steps == 0:
            params = [p for g in self.optimizer.param_groups for p in g["params"]
                      if p.grad is not None]
            if self.clip_norm is not None:
                torch.nn.utils.clip_grad_norm_(params, self.clip_norm)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.optimizer_step_count += 1
        return losses.detach()

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer_step_count": self.optimizer_step_count, "micro": self._micro}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer_step_count = state_dict["optimizer_step_count"]
        self._micro = state_dict["micro"]
