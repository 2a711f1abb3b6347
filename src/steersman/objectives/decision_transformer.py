"""Decision Transformer losses: ``DTLoss`` (offline DT, Chen et al. 2021) and
``OnlineDTLoss`` (online DT, Zheng et al. 2022).

Both read context windows (``observation``, ``action``, ``return_to_go`` of shape
``[*B, L, ...]``, see :class:`~steersman.modules.DecisionTransformer`) and the dataset's
actions ``a`` at ``action_target``.

* ``DTLoss``: the actor's predicted actions ``a^`` at ``action_pred``,
  ``loss = mean(dist(a^, a))`` (``"l2"``: squared error).
* ``OnlineDTLoss`` (a stochastic actor ``pi``, ``alpha = exp(log_alpha)``):
  ``loss_log_likelihood = -mean log pi(a | context)``;
  the entropy ``H = -mean_k log pi(a_k)`` over ``samples_mc_entropy`` reparametrized draws
  ``a_k ~ pi``; ``loss_entropy = -alpha * H`` (``alpha`` detached);
  ``loss_alpha = alpha * (H - target_entropy)`` (``H`` detached: ``alpha`` falls while the
  entropy is above its target and rises below it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..tensordict import TensorDict, TensorDictBase
from ..tensordict.nn import ExplorationType, set_exploration_type
from .common import LossModule, NestedKey, check_options
from .sac import _clamp_log_alpha, _register_alpha
from .utils import distance_loss, reduce_loss

__all__ = ["DTLoss", "OnlineDTLoss"]


@dataclass
class _DTKeys:
    """``action_target``: the dataset's actions; ``action_pred``: where the actor writes its own."""

    action_target: NestedKey = "action"
    action_pred: NestedKey = "action"


class DTLoss(LossModule):
    """The offline Decision Transformer loss: the predicted actions regressed on the data's.

    Args:
        actor_network: a TensorDict module reading the context windows and writing the
            predicted actions ``[*B, L, act]`` at ``action_pred`` (e.g. a
            ``ProbabilisticActor`` with ``TanhDelta`` around a :class:`~steersman.modules.DTActor`).

    Keyword Args:
        loss_function: ``"l2"`` (default), ``"l1"`` or ``"smooth_l1"``.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (the element-wise loss).
        device: accepted for TorchRL compatibility; the loss lives where its actor is.

    Returns ``loss``.

    Example:
        >>> import torch
        >>> from steersman.modules import DTActor, ProbabilisticActor, TanhDelta
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> net = DTActor(4, 2, transformer_config=dict(n_embd=16, n_layer=1, n_head=2, n_inner=32,
        ...               activation="relu", n_positions=60, resid_pdrop=0.1, attn_pdrop=0.1))
        >>> actor = ProbabilisticActor(TensorDictModule(net, ["observation", "action", "return_to_go"], ["param"]),
        ...                            in_keys=["param"], distribution_class=TanhDelta)
        >>> loss = DTLoss(actor)
        >>> batch = TensorDict({"observation": torch.randn(8, 10, 4), "action": torch.rand(8, 10, 2) * 2 - 1,
        ...                     "return_to_go": torch.randn(8, 10, 1)}, [8, 10])
        >>> out = loss(batch)
        >>> out["loss"].shape
        torch.Size([])
    """

    _AcceptedKeys = _DTKeys
    networks = ("actor_network",)

    def __init__(
        self,
        actor_network: nn.Module,
        *,
        loss_function: str = "l2",
        reduction: str | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        reduction = reduction or "mean"
        check_options(self, loss_function=loss_function, reduction=reduction)
        self.actor_network = actor_network
        self.loss_function, self.reduction = loss_function, reduction

    @property
    def in_keys(self) -> list:
        keys = {*self.actor_network.in_keys, self.tensor_keys.action_target}
        return sorted(keys, key=str)

    @property
    def out_keys(self) -> list[str]:
        return ["loss"]

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        """``loss`` for one batch of context windows (see the module docstring)."""
        target = self._get(td, "action_target").detach()
        pred = self.actor_network(td.copy()).get(self.tensor_keys.action_pred)
        loss = distance_loss(pred, target, self.loss_function)
        if self.reduction == "none":
            return TensorDict({"loss": loss}, td.batch_size)
        return TensorDict({"loss": reduce_loss(loss, self.reduction)}, [])


class OnlineDTLoss(LossModule):
    """The online Decision Transformer loss: likelihood of the data's actions, an entropy
    bonus and a learned temperature.

    Args:
        actor_network: a stochastic actor with ``get_dist(td)`` over the windows (e.g. a
            ``ProbabilisticActor`` with ``TanhNormal`` around an
            :class:`~steersman.modules.OnlineDTActor`); ``log_prob`` of shape ``[*B, L]``.

    Keyword Args:
        alpha_init: the initial temperature (default 1).
        min_alpha, max_alpha: bounds of alpha (``None``: unbounded).
        fixed_alpha: keep alpha at ``alpha_init``.
        target_entropy: a number or ``"auto"`` (``-prod(action shape)`` from the actor's spec).
        samples_mc_entropy: draws of the Monte-Carlo entropy estimate (default 1).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (per-step terms ``[*B, L]``;
            no ``alpha``/``entropy`` entries).
        scalar_output_mode: accepted for TorchRL compatibility: ``None``/``"exclude"`` (the
            only behaviour here: with ``reduction="none"`` the scalars are left out).

    Returns ``loss_log_likelihood``, ``loss_entropy``, ``loss_alpha`` and the detached
    ``alpha`` and ``entropy``.

    Example:
        >>> import torch
        >>> from steersman.data import Bounded
        >>> from steersman.modules import OnlineDTActor, ProbabilisticActor, TanhNormal
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> net = OnlineDTActor(4, 2, transformer_config=dict(n_embd=16, n_layer=1, n_head=2, n_inner=32,
        ...                     activation="relu", n_positions=60, resid_pdrop=0.1, attn_pdrop=0.1))
        >>> actor = ProbabilisticActor(TensorDictModule(net, ["observation", "action", "return_to_go"],
        ...                            ["loc", "scale"]), in_keys=["loc", "scale"],
        ...                            spec=Bounded(-1.0, 1.0, shape=(2,)), distribution_class=TanhNormal)
        >>> loss = OnlineDTLoss(actor)
        >>> batch = TensorDict({"observation": torch.randn(8, 10, 4), "action": torch.rand(8, 10, 2) * 1.8 - 0.9,
        ...                     "return_to_go": torch.randn(8, 10, 1)}, [8, 10])
        >>> sorted(loss(batch).keys())
        ['alpha', 'entropy', 'loss_alpha', 'loss_entropy', 'loss_log_likelihood']
    """

    _AcceptedKeys = _DTKeys
    networks = ("actor_network",)

    def __init__(
        self,
        actor_network: nn.Module,
        *,
        alpha_init: float = 1.0,
        min_alpha: float | None = None,
        max_alpha: float | None = None,
        fixed_alpha: bool = False,
        target_entropy: str | float = "auto",
        samples_mc_entropy: int = 1,
        reduction: str | None = None,
        scalar_output_mode: str | None = None,
    ) -> None:
        super().__init__()
        reduction = reduction or "mean"
        check_options(self, reduction=reduction)
        if int(samples_mc_entropy) < 1:
            raise ValueError(f"OnlineDTLoss: samples_mc_entropy must be >= 1, got {samples_mc_entropy}")
        if scalar_output_mode not in (None, "exclude"):
            raise ValueError(
                "OnlineDTLoss: scalar_output_mode must be None or 'exclude' (reduction='none' leaves alpha and "
                f"entropy out), got {scalar_output_mode!r}"
            )
        self.actor_network = actor_network
        self.samples_mc_entropy = int(samples_mc_entropy)
        self.reduction = reduction
        entropy = _target_entropy(target_entropy, actor_network, self.tensor_keys.action_pred)
        _register_alpha(self, alpha_init, min_alpha, max_alpha, fixed_alpha, entropy)

    @property
    def alpha(self) -> Tensor:
        """The current temperature (detached; clamped into its bounds first)."""
        _clamp_log_alpha(self)
        return self.log_alpha.detach().exp()

    @property
    def in_keys(self) -> list:
        return sorted({*self.actor_network.in_keys, self.tensor_keys.action_target}, key=str)

    @property
    def out_keys(self) -> list[str]:
        return ["loss_log_likelihood", "loss_entropy", "loss_alpha", "alpha", "entropy"]

    def get_entropy_bonus(self, dist: torch.distributions.Distribution) -> Tensor:
        """``-mean_k log pi(a_k)`` over ``samples_mc_entropy`` reparametrized draws: ``[*B, L]``."""
        draws = dist.rsample((self.samples_mc_entropy,))
        return -dist.log_prob(draws).mean(0)

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        """The three terms for one batch of context windows (see the module docstring)."""
        target = self._get(td, "action_target")
        if target.requires_grad:
            raise RuntimeError("OnlineDTLoss: the target actions are part of a graph; detach them")
        alpha = self.alpha
        with set_exploration_type(ExplorationType.RANDOM):
            dist = self.actor_network.get_dist(td.select(*self.actor_network.in_keys))
        log_likelihood = dist.log_prob(target)
        entropy = self.get_entropy_bonus(dist)
        losses = {
            "loss_log_likelihood": -log_likelihood,
            "loss_entropy": -alpha * entropy,
            "loss_alpha": self.log_alpha.exp() * (entropy - self.target_entropy).detach(),
        }
        if self.reduction == "none":
            return TensorDict(losses, td.batch_size)
        out: dict[str, Any] = {k: reduce_loss(v, self.reduction) for k, v in losses.items()}
        out["alpha"] = alpha
        out["entropy"] = entropy.detach().mean()
        return TensorDict(out, [])


def _target_entropy(target_entropy: str | float, actor: nn.Module, action_key: NestedKey) -> float:
    """A number, or ``"auto"``: ``-prod(shape)`` of the actor spec's action entry."""
    if target_entropy != "auto":
        return float(target_entropy)
    spec = getattr(actor, "spec", None)
    if spec is not None and hasattr(spec, "keys"):  # a Composite: its action entry
        spec = spec.get(action_key, None)
    if spec is None:
        raise ValueError(
            "OnlineDTLoss: target_entropy='auto' needs the action's shape from the actor's spec; give the "
            "actor a spec (ProbabilisticActor(..., spec=...)) or pass a numeric target_entropy (e.g. -action_dim)"
        )
    return -float(math.prod(spec.shape))
