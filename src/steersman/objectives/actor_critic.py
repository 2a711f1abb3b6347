"""``ActorCriticLoss``: what A2C and the PPO losses share.

The keyword arguments common to :class:`~steersman.objectives.A2CLoss`,
:class:`~steersman.objectives.PPOLoss`, :class:`~steersman.objectives.ClipPPOLoss` and
:class:`~steersman.objectives.KLPENPPOLoss` are declared and documented here, once; each
subclass lists only the keywords it adds and passes the rest on (its ``__init__``
signature shows all of them; see :mod:`steersman.objectives.common`).

Pieces shared by the losses: the advantage (from the batch or the value estimator), the
actor's log-probabilities, the entropy bonus, the (optionally clipped) critic loss and
the reduction of the ``loss_*`` terms.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributions as D
from torch import Tensor, nn

from ..tensordict import TensorDict, TensorDictBase
from ..tensordict.nn import ExplorationType, TanhNormal, set_exploration_type
from .common import LossModule, NestedKey, check_options, torchrl_compat
from .utils import ValueEstimators, distance_loss, reduce_loss

__all__ = ["ActorCriticLoss"]


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


UNSET: Any = _Unset()


def pick_coeff(name: str, new: Any, old: Any, default: float | None) -> float | None:
    """``entropy_coeff``/``entropy_coef`` (TorchRL accepts both spellings); ``None`` is a
    value (e.g. ``critic_coeff=None`` drops the critic loss), ``UNSET`` is not."""
    if new is not UNSET and old is not UNSET:
        raise TypeError(f"give {name} or {name[:-1]}, not both")
    value = new if new is not UNSET else old
    return default if value is UNSET else value


def actor_distribution(actor: nn.Module, td: TensorDictBase) -> D.Distribution:
    """``actor.get_dist(td)`` (writing the distribution parameters into ``td``).

    Under an explicit interaction type, so that ``get_dist`` sets none of its own (which
    ``torch.compile(fullgraph=True)`` cannot trace).
    """
    with set_exploration_type(ExplorationType.RANDOM):
        return actor.get_dist(td)


def policy_entropy(dist: D.Distribution, samples_mc_entropy: int = 1) -> Tensor:
    """``dist.entropy()``, or ``-mean(log_prob(x))`` over ``samples_mc_entropy`` draws when the
    distribution has no entropy; reparametrized draws where possible (differentiable).

    A :class:`~steersman.tensordict.nn.TanhNormal` has only a Monte-Carlo entropy: it gets
    ``samples_mc_entropy`` draws too (its own default, 16, would cost 16x the random numbers).
    """
    if isinstance(dist, TanhNormal):
        return dist.entropy(samples_mc_entropy)
    try:
        return dist.entropy()
    except NotImplementedError:
        x = dist.rsample((samples_mc_entropy,)) if dist.has_rsample else dist.sample((samples_mc_entropy,))
        return -dist.log_prob(x).mean(0)


def clip_value_loss(
    old_value: Tensor, value: Tensor, clip_value: float, target: Tensor, loss: Tensor, loss_type: str
) -> tuple[Tensor, Tensor]:
    """PPO2's clipped critic loss: ``max(loss, distance(target, old + clip(value - old, ±c)))``.

    Returns the element-wise loss and the fraction of clipped values (detached).
    """
    delta = value - old_value
    clipped = delta.clamp(-clip_value, clip_value)
    fraction = (clipped != delta).to(value.dtype).mean().detach()
    loss_clipped = distance_loss(target, old_value + clipped, loss_type)
    return torch.maximum(loss, loss_clipped), fraction


def explained_variance(value: Tensor, target: Tensor, eps: float = 1e-8) -> Tensor:
    """``1 - Var(target - value) / Var(target)`` (population variances; finite for one sample)."""
    return 1 - (target - value).var(correction=0) / target.var(correction=0).clamp_min(eps)


def _deprecated_alias(owner: str, name: str, value: Any, old: str, old_value: Any) -> Any:
    """``value``, or TorchRL's deprecated spelling ``old_value`` (warns); both is an error."""
    if old_value is None:
        return value
    if value is not None:
        raise TypeError(f"{owner}: {name} and {old} (its deprecated name) were both given; pass {name} only")
    warnings.warn(f"{owner}({old}=...) is deprecated; use {name}=...", DeprecationWarning, stacklevel=3)
    return old_value


def shared_parameter_names(critic: nn.Module, actor: nn.Module) -> list[str]:
    """Names (in ``critic``) of the parameters that are also parameters of ``actor``."""
    actor_ids = {id(p) for p in actor.parameters()}
    return [name for name, p in critic.named_parameters() if id(p) in actor_ids]


class ActorCriticLoss(LossModule):
    """Base of the on-policy actor-critic losses (A2C, PPO): the keywords they share.

    Args:
        actor_network: a probabilistic actor (``get_dist(td)``, e.g. a
            ``ProbabilisticTensorDictSequential``) reading the batch.
        critic_network: a module writing ``"state_value"`` (``[*B, 1]``); may be ``None``
            with ``critic_coeff=None``.

    Keyword Args:
        entropy_bonus: add ``loss_entropy`` (default ``True``).
        samples_mc_entropy: draws for the Monte-Carlo entropy when ``dist.entropy()``
            is not implemented (default 1).
        entropy_coeff (or entropy_coef): entropy weight (default 0.01).
        critic_coeff (or critic_coef): critic loss weight (default 1.0); ``None`` drops
            the critic loss.
        loss_critic_type: ``"l1"``, ``"l2"`` or ``"smooth_l1"`` (default).
        gamma: shortcut for ``make_value_estimator(gamma=...)``.
        separate_losses: parameters shared by actor and critic learn from the policy
            terms only (the critic loss does not reach them).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (``[*B]`` terms).
        clip_value: clip the critic's change from the batch's ``"state_value"`` (PPO2).
        functional: accepted for TorchRL compatibility and ignored (see
            :data:`~steersman.objectives.common.TORCHRL_COMPAT_IGNORED`).
        actor, critic: TorchRL's deprecated names of ``actor_network``/``critic_network``
            (warn); giving both spellings of one network is an error.
        advantage_key, value_target_key, value_key: TorchRL's deprecated way of renaming
            keys; the same as ``set_keys(advantage=..., value_target=..., value=...)``
            (warns; TorchRL 0.14 refuses them, earlier releases honoured them, as here).
        advantage_norm: a :class:`~steersman.modules.ValueNorm` (e.g.
            ``PercentileValueNorm``, DreamerV3's return scale): the advantage is divided by
            ``advantage_norm.scale()``, not re-centred. In training mode its statistics are
            updated with the value targets when the loss runs its own value estimator (the
            batch has no advantage), so repeated passes over a precomputed batch do not
            skew them; otherwise call ``advantage_norm.update(value_target)`` yourself.

    Parameters, as TorchRL names them: ``actor_network_params``, ``critic_network_params``
    and their ``target_*`` versions (no target networks here: the online parameters,
    detached), as TensorDicts that share storage with the networks.
    """

    @dataclass
    class _AcceptedKeys:
        """Batch keys; reward/done/terminated are read under ``"next"`` by the estimator."""

        advantage: NestedKey = "advantage"
        value_target: NestedKey = "value_target"
        value: NestedKey = "state_value"
        sample_log_prob: NestedKey = "action_log_prob"
        action: NestedKey = "action"
        reward: NestedKey = "reward"
        done: NestedKey = "done"
        terminated: NestedKey = "terminated"

    default_value_estimator = ValueEstimators.GAE
    networks = ("actor_network", "critic_network")

    def __init__(
        self,
        actor_network: nn.Module | None = None,
        critic_network: nn.Module | None = None,
        *,
        entropy_bonus: bool = True,
        samples_mc_entropy: int = 1,
        entropy_coeff: float = UNSET,
        entropy_coef: float = UNSET,
        critic_coeff: float | None = UNSET,
        critic_coef: float | None = UNSET,
        loss_critic_type: str = "smooth_l1",
        gamma: float | None = None,
        separate_losses: bool = False,
        reduction: str = "mean",
        clip_value: float | None = None,
        functional: bool = True,
        actor: nn.Module | None = None,
        critic: nn.Module | None = None,
        advantage_key: NestedKey | None = None,
        value_target_key: NestedKey | None = None,
        value_key: NestedKey | None = None,
        advantage_norm: nn.Module | None = None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        actor_network = _deprecated_alias(name, "actor_network", actor_network, "actor", actor)
        critic_network = _deprecated_alias(name, "critic_network", critic_network, "critic", critic)
        if actor_network is None:
            raise TypeError(f"{name} needs an actor_network (the policy)")
        if advantage_norm is not None and not (hasattr(advantage_norm, "scale") and hasattr(advantage_norm, "update")):
            raise TypeError(f"{name}: advantage_norm must be a ValueNorm (with update() and scale()), got "
                            f"{type(advantage_norm).__name__}")
        if not hasattr(actor_network, "get_dist"):
            raise TypeError(
                f"{name}: actor_network must build a distribution (a "
                f"ProbabilisticTensorDictSequential with get_dist), got {type(actor_network).__name__}"
            )
        entropy_coeff = pick_coeff("entropy_coeff", entropy_coeff, entropy_coef, 0.01)
        critic_coeff = pick_coeff("critic_coeff", critic_coeff, critic_coef, 1.0)
        if critic_network is None and critic_coeff is not None:
            raise ValueError(f"{name}: critic_network is required unless critic_coeff=None")
        check_options(self, loss_function=loss_critic_type, reduction=reduction, option="loss_critic_type")
        if clip_value is not None and clip_value <= 0:
            raise ValueError(f"{name}: clip_value must be positive, got {clip_value}")
        torchrl_compat(self, functional=functional)
        self.actor_network = actor_network
        self.critic_network = critic_network
        self.entropy_bonus = bool(entropy_bonus)
        self.samples_mc_entropy = int(samples_mc_entropy)
        self.entropy_coeff = float(entropy_coeff)
        self.critic_coeff = None if critic_coeff is None else float(critic_coeff)
        self.loss_critic_type = loss_critic_type
        self.separate_losses = bool(separate_losses)
        self.advantage_norm = advantage_norm
        renames = {"advantage": advantage_key, "value_target": value_target_key, "value": value_key}
        renames = {k: v for k, v in renames.items() if v is not None}
        if renames:
            warnings.warn(f"{name}(advantage_key/value_target_key/value_key=...) is deprecated; use "
                          f"loss.set_keys({', '.join(f'{k}=...' for k in renames)})", DeprecationWarning, stacklevel=2)
            self.set_keys(**renames)
        self.reduction = reduction
        self.clip_value = None if clip_value is None else float(clip_value)
        self.log_explained_variance = False  # PPO losses log it (TorchRL's option)
        # with separate_losses, parameters the critic shares with the actor are detached in
        # the critic loss: the shared trunk learns from the policy terms only
        self._shared_in_critic = (
            shared_parameter_names(critic_network, actor_network)
            if separate_losses and critic_network is not None
            else []
        )
        if gamma is not None:
            self.make_value_estimator(self.default_value_estimator, gamma=gamma)

    # TorchRL spells these entropy_coef / critic_coef too
    @property
    def entropy_coef(self) -> float:
        return self.entropy_coeff

    @property
    def critic_coef(self) -> float | None:
        return self.critic_coeff

    def _advantage(self, td: TensorDictBase) -> Tensor:
        """The batch's advantage, computed by the value estimator (no gradient) if absent."""
        advantage = td.get(self.tensor_keys.advantage, None)
        computed = advantage is None
        if computed:
            with torch.no_grad():
                self.value_estimator(td)
            advantage = self._get(td, "advantage")
        expected = (*td.batch_size, 1)
        if advantage.shape != expected:
            raise ValueError(
                f"{type(self).__name__}: {self.tensor_keys.advantage!r} has shape "
                f"{list(advantage.shape)}, expected {list(expected)} (batch dims and a trailing 1)"
            )
        if self.advantage_norm is not None:
            if computed and self.training:
                self.advantage_norm.update(self._get(td, "value_target"))
            advantage = advantage / self.advantage_norm.scale()
        return advantage

    def _log_prob(self, td: TensorDictBase) -> tuple[Tensor, Tensor, D.Distribution]:
        """``(log π(a|s), log π_old(a|s), π)``, each log-prob shaped ``[*B]``."""
        action = self._get(td, "action")
        prev_log_prob = self._get(td, "sample_log_prob")
        if prev_log_prob.requires_grad:
            raise RuntimeError(
                f"{type(self).__name__}: {self.tensor_keys.sample_log_prob!r} requires grad; it must "
                "come from the collecting policy (detached)"
            )
        dist = actor_distribution(self.actor_network, td)
        log_prob = dist.log_prob(action)
        if log_prob.shape != td.batch_size or prev_log_prob.shape != td.batch_size:
            raise ValueError(
                f"{type(self).__name__}: log-probabilities must have the batch shape "
                f"{list(td.batch_size)}; got {list(log_prob.shape)} from the actor's distribution and "
                f"{list(prev_log_prob.shape)} for {self.tensor_keys.sample_log_prob!r} (use a "
                "distribution whose log_prob sums over the action dims, e.g. TanhNormal or "
                "Independent(Normal, 1))"
            )
        return log_prob, prev_log_prob, dist

    def _critic_value(self, td: TensorDictBase) -> Tensor:
        critic = self.critic_network
        if self._shared_in_critic:
            params = dict(critic.named_parameters())
            detached = {name: params[name].detach() for name in self._shared_in_critic}
            out = torch.func.functional_call(critic, detached, (td.detach(),), strict=False)
        else:
            out = critic(td)
        return out.get(self.tensor_keys.value)

    def _critic_terms(self, td: TensorDictBase) -> tuple[Tensor, Tensor | None, Tensor, Tensor]:
        """``(critic_coeff * distance(V(s), target), clip fraction or None, V(s), target)``."""
        target = self._get(td, "value_target")
        old_value = self._get(td, "value") if self.clip_value is not None else None
        value = self._critic_value(td)
        if value.shape != target.shape:
            raise ValueError(
                f"{type(self).__name__}: the critic wrote {self.tensor_keys.value!r} of shape "
                f"{list(value.shape)}, expected {list(target.shape)} like "
                f"{self.tensor_keys.value_target!r} (one value per state, trailing dim 1)"
            )
        loss = distance_loss(target, value, self.loss_critic_type)
        fraction = None
        if old_value is not None:
            loss, fraction = clip_value_loss(old_value, value, self.clip_value, target, loss, self.loss_critic_type)
        return self.critic_coeff * loss, fraction, value, target

    def loss_critic(self, td: TensorDictBase) -> tuple[Tensor, Tensor | None]:
        """``critic_coeff * distance(V(s), value_target)`` per sample (``[*B, 1]``), and the
        value clip fraction (``None`` without ``clip_value``)."""
        loss, fraction, _, _ = self._critic_terms(td)
        return loss, fraction

    def _add_entropy_and_critic(
        self, out: dict[str, Tensor], td: TensorDictBase, dist: D.Distribution, diagnostics: bool = True
    ) -> None:
        """Adds ``loss_entropy``/``loss_critic`` and, with ``diagnostics``, ``entropy``,
        ``value_clip_fraction`` and ``explained_variance``."""
        if self.entropy_bonus:
            entropy = policy_entropy(dist, self.samples_mc_entropy)
            if diagnostics:
                out["entropy"] = entropy.detach().mean()
            out["loss_entropy"] = -self.entropy_coeff * entropy
        if self.critic_coeff is not None:
            loss, fraction, value, target = self._critic_terms(td)
            out["loss_critic"] = loss[..., 0]
            if fraction is not None and diagnostics:
                out["value_clip_fraction"] = fraction
            if self.log_explained_variance and diagnostics:
                out["explained_variance"] = explained_variance(value.detach(), target)

    def _output(self, out: dict[str, Tensor]) -> TensorDictBase:
        """Reduces the ``loss_*`` terms (``[*B]``) with ``self.reduction``."""
        return TensorDict(
            {k: reduce_loss(v, self.reduction) if k.startswith("loss_") else v for k, v in out.items()}, []
        )
