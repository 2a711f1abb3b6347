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

import contextlib
import enum
from collections.abc import Iterable, Iterator
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
#: Module types whose forward draws random numbers (extend with
#: :func:`~steersman.objectives.common.add_random_module`): see ``LossModule.vmap_randomness``.
RANDOM_MODULE_LIST: tuple[type, ...] = (torch.nn.modules.dropout._DropoutNd,)

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

    def __init__(self, loss_module: nn.Module) -> None:
        loss = loss_module
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
        loss_module: a loss with target networks (TorchRL's name; positional as usual).
        eps: weight kept by the target (TorchRL's name); or
        tau: weight given to the online network (``tau = 1 - eps``). Give one of the two.
    """

    def __init__(self, loss_module: nn.Module, *, eps: float | None = None, tau: float | None = None) -> None:
        super().__init__(loss_module)
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

    def __init__(self, loss_module: nn.Module, *, value_network_update_interval: int = 1000) -> None:
        super().__init__(loss_module)
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


def distance_loss(
    v1: torch.Tensor, v2: torch.Tensor, loss_function: str = "l2", strict_shape: bool = True
) -> torch.Tensor:
    """Element-wise distance (no reduction): ``"l2"`` (squared error), ``"l1"`` or ``"smooth_l1"``.

    ``strict_shape=False`` lets the two broadcast against each other (TorchRL's keyword);
    by default different shapes raise, as silent broadcasting hides bugs.

    Example:
        >>> distance_loss(torch.zeros(2, 1), torch.ones(3), strict_shape=False).shape
        torch.Size([2, 3])
    """
    if v1.shape != v2.shape:
        if strict_shape:
            raise ValueError(f"distance_loss: shapes differ, {tuple(v1.shape)} vs {tuple(v2.shape)} (no silent "
                             "broadcasting; strict_shape=False allows it)")
        v1, v2 = torch.broadcast_tensors(v1, v2)
    if loss_function == "l2":
        return (v1 - v2).pow(2)
    if loss_function == "l1":
        return (v1 - v2).abs()
    if loss_function == "smooth_l1":
        return torch.nn.functional.smooth_l1_loss(v1, v2, reduction="none")
    raise ValueError(f"loss_function must be one of 'l2', 'l1', 'smooth_l1', got {loss_function!r}")


def weighted_reduce(loss: torch.Tensor, reduction: str, weights: torch.Tensor | None) -> torch.Tensor:
    """:func:`reduce_loss` with importance weights (a prioritized buffer's), shaped like
    ``loss``: ``"mean"`` is ``sum(w * l) / sum(w)``, ``"sum"`` is ``sum(w * l)``, ``"none"``
    is ``w * l``. ``weights=None`` is the plain reduction.

    Example:
        >>> weighted_reduce(torch.tensor([1.0, 3.0]), "mean", torch.tensor([3.0, 1.0]))
        tensor(1.5000)
    """
    if weights is None:
        return reduce_loss(loss, reduction)
    weights = weights.detach().to(loss.dtype)
    if reduction == "mean":
        return (loss * weights).sum() / weights.sum()
    return reduce_loss(loss * weights, reduction)


def reduce_loss(loss: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """``"mean"``, ``"sum"`` or ``"none"`` reduction of an element-wise loss."""
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


# ------------------------------------------------------------------ TorchRL's small helpers
#: The batch keys TorchRL's losses read as a validity mask when the data carries one (the
#: collector's ``("collector", "mask")`` and the ``"shifted_valid"`` of shifted estimators).
AUTO_LOSS_MASK_KEYS: tuple[Any, ...] = (("collector", "mask"), "shifted_valid")


@contextlib.contextmanager
def hold_out_net(network: nn.Module) -> Iterator[None]:
    """Inside the ``with`` block, ``network``'s parameters have ``requires_grad=False`` (its
    outputs carry no gradient to them); each flag is restored on exit, even after an error.

    Example:
        >>> net = nn.Linear(2, 1)
        >>> with hold_out_net(net):
        ...     net(torch.ones(1, 2)).requires_grad
        False
        >>> net.weight.requires_grad
        True
    """
    params = list(network.parameters())
    flags = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in zip(params, flags):
            p.requires_grad_(flag)


@contextlib.contextmanager
def hold_out_params(params: Iterable[torch.Tensor] | Any) -> Iterator[Any]:
    """Yields ``params`` detached: a tuple of detached tensors for an iterable of tensors,
    ``params.detach()`` for a TensorDict (same storage, no gradient).

    Example:
        >>> net = nn.Linear(2, 1)
        >>> with hold_out_params(net.parameters()) as (w, b):
        ...     (w.requires_grad, w.data_ptr() == net.weight.data_ptr())
        (False, True)
    """
    if hasattr(params, "detach") and not isinstance(params, torch.Tensor):
        yield params.detach()
    else:
        yield tuple(p.detach() for p in params)


@torch.no_grad()
def next_state_value(
    tensordict: Any,
    operator: nn.Module | None = None,
    next_val_key: Any = "state_action_value",
    gamma: float = 0.99,
    pred_next_val: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """The bootstrapped target ``r + gamma ** n * (1 - terminated) * V(s')``, without gradient: ``[*B]``.

    ``r`` is ``("next", "reward")``; ``n`` is ``"steps_to_next_obs"`` when the batch has it
    (n-step returns) and 1 otherwise. ``V(s')`` is ``pred_next_val`` (``[*B]`` or
    ``[*B, 1]``), or ``operator``'s ``next_val_key`` output on ``tensordict["next"]``
    (``kwargs`` are passed to the call). Episodes end at ``("next", "terminated")``, or
    ``("next", "done")`` when the batch has no ``terminated`` entry: TorchRL reads only
    ``done`` and so cuts the bootstrap at truncations too (documented as a bug fix here).

    Example:
        >>> from steersman.tensordict import TensorDict
        >>> td = TensorDict({"next": {"reward": torch.ones(3, 1),
        ...     "done": torch.tensor([[False], [True], [True]]),
        ...     "terminated": torch.tensor([[False], [True], [False]])}}, [3])
        >>> next_state_value(td, gamma=0.5, pred_next_val=torch.tensor([2.0, 2.0, 4.0]))
        tensor([2., 1., 3.])
    """
    reward = tensordict.get(("next", "reward"), None)
    if reward is None:
        raise KeyError("next_state_value needs ('next', 'reward') in the batch")
    reward = reward.reshape(tensordict.batch_size)
    end = tensordict.get(("next", "terminated"), None)
    if end is None:
        end = tensordict.get(("next", "done"), None)
    if end is None:
        raise KeyError("next_state_value needs ('next', 'terminated') or ('next', 'done') in the batch")
    if pred_next_val is None:
        if operator is None:
            raise ValueError("next_state_value needs an operator or pred_next_val")
        next_td = tensordict.get("next").copy()
        pred_next_val = operator(next_td, **kwargs).get(next_val_key)
    value = pred_next_val.detach()
    if value.shape != reward.shape:
        if value.shape[-1:] == (1,) and value.shape[:-1] == reward.shape:
            value = value.squeeze(-1)
        else:
            raise ValueError(
                f"next_state_value: the next value has shape {list(value.shape)}, expected the batch "
                f"shape {list(reward.shape)} (or with a trailing 1)"
            )
    steps = tensordict.get("steps_to_next_obs", None)
    discount = gamma if steps is None else gamma ** steps.reshape(reward.shape).to(reward.dtype)
    return reward + discount * (~end.reshape(reward.shape)).to(reward.dtype) * value


def group_optimizers(*optimizers: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """One optimizer holding the parameter groups of all ``optimizers`` (which must be of one
    type); each group keeps its own hyper-parameters (lr...). Used to step an actor's and a
    critic's optimizers with one call.

    Example:
        >>> a = torch.optim.Adam(nn.Linear(1, 1).parameters(), lr=0.1)
        >>> b = torch.optim.Adam(nn.Linear(1, 1).parameters(), lr=0.2)
        >>> [g["lr"] for g in group_optimizers(a, b).param_groups]
        [0.1, 0.2]
    """
    if not optimizers:
        raise ValueError("group_optimizers needs at least one optimizer")
    cls = type(optimizers[0])
    kinds = sorted({type(o).__name__ for o in optimizers})
    if len(kinds) > 1:
        raise ValueError(f"group_optimizers: the optimizers must all be of one type, got {kinds}")
    groups = [dict(g) for o in optimizers for g in o.param_groups]
    grouped = cls([groups[0]])
    for group in groups[1:]:
        grouped.add_param_group(group)
    for o in optimizers:  # keep the running state (Adam moments...) of each parameter
        grouped.state.update(o.state)
    return grouped


class KLAdaptiveLR:
    """Scales an optimizer's learning rate to keep the policy's KL per update near ``target_kl``.

    After each update, :meth:`step` is given the measured KL (e.g. ``ClipPPOLoss``'s
    ``kl_approx``): above ``2 * target_kl`` every group's lr is divided by ``factor``;
    positive and below ``target_kl / 2`` it is multiplied by ``factor``; otherwise (and at
    exactly 0: a policy that did not move) it is kept. The lr stays in ``[min_lr, max_lr]``.
    The schedule of rsl_rl's PPO (Rudin et al., 2021).

    Example:
        >>> opt = torch.optim.Adam([nn.Parameter(torch.zeros(1))], lr=1e-3)
        >>> scheduler = KLAdaptiveLR(opt, target_kl=0.01, factor=2.0)
        >>> scheduler.step(kl=0.05)
        >>> opt.param_groups[0]["lr"]
        0.0005
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, target_kl: float, *, factor: float = 1.5,
        min_lr: float = 1e-5, max_lr: float = 1e-2,
    ) -> None:
        if not factor > 1.0:
            raise ValueError(f"KLAdaptiveLR: factor must be > 1, got {factor}")
        if not target_kl > 0.0:
            raise ValueError(f"KLAdaptiveLR: target_kl must be > 0, got {target_kl}")
        if not 0.0 <= min_lr <= max_lr:
            raise ValueError(f"KLAdaptiveLR: need 0 <= min_lr <= max_lr, got min_lr={min_lr}, max_lr={max_lr}")
        self.optimizer = optimizer
        self.target_kl, self.factor = float(target_kl), float(factor)
        self.min_lr, self.max_lr = float(min_lr), float(max_lr)

    def step(self, kl: float | torch.Tensor) -> None:
        """Rescales every parameter group's lr from the KL of the last update."""
        kl = float(kl)
        if kl > 2.0 * self.target_kl:
            scale = 1.0 / self.factor
        elif 0.0 < kl < 0.5 * self.target_kl:
            scale = self.factor
        else:
            return
        for group in self.optimizer.param_groups:
            group["lr"] = min(max(group["lr"] * scale, self.min_lr), self.max_lr)

    def state_dict(self) -> dict[str, float]:
        return {"target_kl": self.target_kl, "factor": self.factor, "min_lr": self.min_lr, "max_lr": self.max_lr}

    def load_state_dict(self, state: dict[str, float]) -> None:
        for k in ("target_kl", "factor", "min_lr", "max_lr"):
            setattr(self, k, float(state[k]))
