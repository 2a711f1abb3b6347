"""Helpers shared by losses: the value-estimator enum, target-network updaters, distances.

``SoftUpdate(loss, tau=0.005)`` moves every target network of ``loss`` towards its online
network after each optimizer step (``target <- (1 - tau) * target + tau * online``);
``HardUpdate(loss, value_network_update_interval=N)`` copies it every ``N`` calls of
``step()``. Targets are the ones a loss registered with ``LossModule.make_target``.

Example:
    >>> import torch
    >>> from steersman.objectives.common import LossModule
    >>> class L(LossModule):
    ...     def __init__(self, net):
    ...         super().__init__()
    ...         self.value_network = net
    ...         self.make_target("value_network")
    >>> loss = L(torch.nn.Linear(2, 1))
    >>> updater = SoftUpdate(loss, tau=0.5)
    >>> with torch.no_grad():
    ...     _ = loss.value_network.bias.fill_(1.0)
    ...     _ = loss.target_value_network.bias.fill_(0.0)
    >>> updater.step()
    >>> loss.target_value_network.bias.item()
    0.5
"""

from __future__ import annotations

import enum
from typing import Any

import torch
from torch import nn


class ValueEstimators(enum.Enum):
    """Which return/advantage estimator a loss builds (TorchRL names)."""

    TD0 = "Bootstrapped TD (1-step return)"
    TD1 = "TD(1) (infinity-step return)"
    TDLambda = "TD(lambda)"
    GAE = "Generalized advantage estimate"



#: What a loss bootstrapping Q-value targets accepts (GAE needs a state-value critic).
Q_TARGET_ESTIMATORS = (ValueEstimators.TD0, ValueEstimators.TD1, ValueEstimators.TDLambda)

def default_value_kwargs(value_type: ValueEstimators) -> dict[str, Any]:
    """Default hyper-parameters of each estimator (``gamma=0.99``; ``lmbda=0.95`` where used)."""
    if value_type in (ValueEstimators.TD0, ValueEstimators.TD1):
        return {"gamma": 0.99, "differentiable": True}
    if value_type is ValueEstimators.TDLambda:
        return {"gamma": 0.99, "lmbda": 0.95, "differentiable": True}
    if value_type is ValueEstimators.GAE:
        return {"gamma": 0.99, "lmbda": 0.95}
    raise ValueError(f"unknown value estimator {value_type!r}")


class TargetNetUpdater:
    """Base of the updaters: collects ``(online, target)`` leaf lists of a loss."""

    def __init__(self, loss: nn.Module) -> None:
        if not loss.target_names:  # targets of lazy networks count: they are made on the first call
            raise ValueError(
                f"{type(loss).__name__} has no target networks to update "
                "(was it built with delay_*=False, or does the algorithm have none?)"
            )
        self.loss = loss
        self.initialized = False

    def _leaves(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        # re-read each time: a loss moved with .to(device) has new tensors
        online, target = [], []
        for on, tg in self.loss.target_pairs():
            for key in on.keys(include_nested=True, leaves_only=True):
                online.append(on.get(key))
                target.append(tg.get(key))
        return online, target

    @torch.no_grad()
    def init_(self) -> None:
        """Copies the online networks into the targets (they already start equal)."""
        online, target = self._leaves()
        torch._foreach_copy_(target, online)
        self.initialized = True

    def step(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class SoftUpdate(TargetNetUpdater):
    """Polyak averaging of the targets: ``target <- eps * target + (1 - eps) * online``.

    Args:
        loss: a loss with target networks.
        eps: weight kept by the target (TorchRL's name); or
        tau: weight given to the online network (``tau = 1 - eps``). Give one of the two.
    """

    def __init__(self, loss: nn.Module, *, eps: float | None = None, tau: float | None = None) -> None:
        super().__init__(loss)
        if (eps is None) == (tau is None):
            raise ValueError("SoftUpdate takes exactly one of eps= or tau=")
        self.tau = float(tau) if tau is not None else 1.0 - float(eps)
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"SoftUpdate: tau must be in (0, 1], got {self.tau} (eps = 1 - tau)")

    @property
    def eps(self) -> float:
        return 1.0 - self.tau

    @torch.no_grad()
    def step(self) -> None:
        """One Polyak step of every target network."""
        online, target = self._leaves()
        floats = [(t, o) for t, o in zip(target, online) if t.is_floating_point()]
        if floats:
            torch._foreach_lerp_([t for t, _ in floats], [o for _, o in floats], self.tau)
        others = [(t, o) for t, o in zip(target, online) if not t.is_floating_point()]
        for t, o in others:
            t.copy_(o)


class HardUpdate(TargetNetUpdater):
    """Copies the online networks into the targets every ``value_network_update_interval`` steps."""

    def __init__(self, loss: nn.Module, *, value_network_update_interval: int = 1000) -> None:
        super().__init__(loss)
        if value_network_update_interval < 1:
            raise ValueError(f"HardUpdate: value_network_update_interval must be >= 1, got {value_network_update_interval}")
        self.value_network_update_interval = int(value_network_update_interval)
        self.counter = 0

    @torch.no_grad()
    def step(self) -> None:
        """Counts one optimizer step; copies the weights when the interval is reached."""
        self.counter += 1
        if self.counter % self.value_network_update_interval == 0:
            online, target = self._leaves()
            torch._foreach_copy_(target, online)

    def state_dict(self) -> dict[str, int]:
        return {"counter": self.counter}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.counter = int(state["counter"])


def distance_loss(v1: torch.Tensor, v2: torch.Tensor, loss_function: str = "l2") -> torch.Tensor:
    """Element-wise distance (no reduction): ``"l2"`` (squared error), ``"l1"`` or ``"smooth_l1"``."""
    if v1.shape != v2.shape:
        raise ValueError(f"distance_loss: shapes differ, {tuple(v1.shape)} vs {tuple(v2.shape)} (no silent broadcasting)")
    if loss_function == "l2":
        return (v1 - v2).pow(2)
    if loss_function == "l1":
        return (v1 - v2).abs()
    if loss_function == "smooth_l1":
        return torch.nn.functional.smooth_l1_loss(v1, v2, reduction="none")
    raise ValueError(f"loss_function must be one of 'l2', 'l1', 'smooth_l1', got {loss_function!r}")


def reduce_loss(loss: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """``"mean"``, ``"sum"`` or ``"none"`` reduction of an element-wise loss."""
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
