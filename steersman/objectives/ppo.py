"""PPO losses: ``PPOLoss`` (plain importance-weighted policy gradient), ``ClipPPOLoss``
(clipped ratio) and ``KLPENPPOLoss`` (adaptive KL penalty).

With ``r = π(a|s) / π_old(a|s) = exp(log_prob - sample_log_prob)`` and advantage ``A``:

* ``PPOLoss``:      ``loss_objective = -mean(r A)``
* ``ClipPPOLoss``:  ``loss_objective = -mean(min(r A, clip(r, 1-ε, 1+ε) A))``
* ``KLPENPPOLoss``: ``loss_objective = -mean(r A - β KL(π_old || π))``, and ``β`` grows
  (shrinks) when the KL is above (below) ``dtarg`` by a factor 1.5;

plus ``loss_entropy = -entropy_coeff * mean(H(π))`` and ``loss_critic = critic_coeff *
mean(distance(V(s), value_target))``. If the batch has no ``"advantage"``, the loss
computes it (and ``"value_target"``) with its value estimator (GAE by default, without
gradient) before the loss, as TorchRL does; usually you call ``loss.value_estimator(batch)``
once per collected batch, before the epochs.

The batch (``[*B]``) holds ``"observation"`` (what the networks read), ``"action"``,
``"action_log_prob"`` (``[*B]``, from the collecting policy), and either
``"advantage"``/``"value_target"`` (``[*B, 1]``) or what the estimator needs
(``("next", "reward" | "done" | "terminated")`` ``[*B, 1]`` and the next observation).

Example:
    >>> import torch
    >>> from steersman.tensordict import TensorDict
    >>> from steersman.tensordict.nn import (NormalParamExtractor, ProbabilisticTensorDictModule,
    ...     ProbabilisticTensorDictSequential, TensorDictModule, TanhNormal)
    >>> actor = ProbabilisticTensorDictSequential(
    ...     TensorDictModule(torch.nn.Sequential(torch.nn.Linear(3, 4), NormalParamExtractor()),
    ...                      ["observation"], ["loc", "scale"]),
    ...     ProbabilisticTensorDictModule(["loc", "scale"], ["action"], TanhNormal, return_log_prob=True))
    >>> critic = TensorDictModule(torch.nn.Linear(3, 1), ["observation"], ["state_value"])
    >>> loss = ClipPPOLoss(actor, critic, clip_epsilon=0.2)
    >>> batch = TensorDict({"observation": torch.randn(10, 3), "action": torch.rand(10, 2) * 2 - 1,
    ...                     "action_log_prob": torch.randn(10), "advantage": torch.randn(10, 1),
    ...                     "value_target": torch.randn(10, 1)}, [10])
    >>> out = loss(batch)
    >>> sorted(out.keys())
    ['ESS', 'clip_fraction', 'entropy', 'explained_variance', 'kl_approx', 'loss_critic', 'loss_entropy', 'loss_objective']
    >>> (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]).backward()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributions as D
from torch import Tensor, nn

from ..tensordict import TensorDict, TensorDictBase
from ..tensordict.nn import ExplorationType, TanhNormal, set_exploration_type
from .common import LossModule
from .utils import ValueEstimators, distance_loss, reduce_loss
from .value import normalize_advantage

__all__ = ["PPOLoss", "ClipPPOLoss", "KLPENPPOLoss"]

NestedKey = str | tuple


# ------------------------------------------------------------------ shared helpers
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


def shared_parameter_names(critic: nn.Module, actor: nn.Module) -> list[str]:
    """Names (in ``critic``) of the parameters that are also parameters of ``actor``."""
    actor_ids = {id(p) for p in actor.parameters()}
    return [name for name, p in critic.named_parameters() if id(p) in actor_ids]


class _ActorCriticTerms:
    """The pieces PPO and A2C share, as a mixin for ``LossModule`` subclasses holding
    ``actor_network``, ``critic_network`` and the attributes set by :meth:`_init_terms`."""

    def _init_terms(
        self,
        actor_network: nn.Module,
        critic_network: nn.Module | None,
        *,
        entropy_bonus: bool,
        samples_mc_entropy: int,
        entropy_coeff: float,
        critic_coeff: float | None,
        loss_critic_type: str,
        separate_losses: bool,
        reduction: str,
        clip_value: float | None,
        gamma: float | None,
    ) -> None:
        if not hasattr(actor_network, "get_dist"):
            raise TypeError(
                f"{type(self).__name__}: actor_network must build a distribution (a "
                f"ProbabilisticTensorDictSequential with get_dist), got {type(actor_network).__name__}"
            )
        if critic_network is None and critic_coeff is not None:
            raise ValueError(f"{type(self).__name__}: critic_network is required unless critic_coeff=None")
        if loss_critic_type not in ("l1", "l2", "smooth_l1"):
            raise ValueError(f"loss_critic_type must be 'l1', 'l2' or 'smooth_l1', got {loss_critic_type!r}")
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        if clip_value is not None and clip_value <= 0:
            raise ValueError(f"clip_value must be positive, got {clip_value}")
        self.actor_network = actor_network
        self.critic_network = critic_network
        self.entropy_bonus = bool(entropy_bonus)
        self.samples_mc_entropy = int(samples_mc_entropy)
        self.entropy_coeff = float(entropy_coeff)
        self.critic_coeff = None if critic_coeff is None else float(critic_coeff)
        self.loss_critic_type = loss_critic_type
        self.separate_losses = bool(separate_losses)
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
        if advantage is None:
            with torch.no_grad():
                self.value_estimator(td)
            advantage = self._get(td, "advantage")
        expected = (*td.batch_size, 1)
        if advantage.shape != expected:
            raise ValueError(
                f"{type(self).__name__}: {self.tensor_keys.advantage!r} has shape "
                f"{list(advantage.shape)}, expected {list(expected)} (batch dims and a trailing 1)"
            )
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


class PPOLoss(_ActorCriticTerms, LossModule):
    """The unclipped PPO loss ``-mean(r A)``, plus entropy bonus and critic loss.

    Args:
        actor_network: a probabilistic actor (``get_dist(td)``) reading the batch.
        critic_network: a module writing ``"state_value"`` (``[*B, 1]``).

    Keyword Args:
        entropy_bonus: add ``loss_entropy``.
        samples_mc_entropy: draws for the Monte-Carlo entropy when ``dist.entropy()``
            is not implemented.
        entropy_coeff (or entropy_coef): entropy weight (default 0.01).
        critic_coeff (or critic_coef): critic loss weight (default 1.0); ``None`` drops
            the critic loss.
        loss_critic_type: ``"l1"``, ``"l2"`` or ``"smooth_l1"`` (default).
        normalize_advantage: standardize the advantage over the minibatch (left as is
            for a minibatch of one element).
        normalize_advantage_exclude_dims: batch dims kept apart when normalizing.
        log_explained_variance: add the ``explained_variance`` diagnostic of the critic.
        diagnostics: add the detached diagnostics (``entropy``, ``kl_approx``, ...) to
            every call's output. ``False`` returns the ``loss_*`` terms only, a few
            percent cheaper per update; :meth:`diagnose` computes them when wanted
            (e.g. once per collected batch for logging).
        gamma: shortcut for ``make_value_estimator(gamma=...)``.
        separate_losses: parameters shared by actor and critic learn from the policy
            terms only (the critic loss does not reach them).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (``[*B]`` terms).
        clip_value: clip the critic's change from the batch's ``"state_value"`` (PPO2).
        functional: accepted for TorchRL compatibility; networks are called directly.

    Outputs: ``loss_objective``, ``loss_entropy``, ``loss_critic`` and the diagnostics
    ``entropy``, ``kl_approx`` (``mean(log π_old - log π)``), ``explained_variance``,
    ``value_clip_fraction`` (with ``clip_value``).

    :meth:`diagnose` (no gradient, no state change) returns the same TensorDict with
    every diagnostic, whatever ``diagnostics`` is.
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

    def __init__(
        self,
        actor_network: nn.Module,
        critic_network: nn.Module | None = None,
        *,
        entropy_bonus: bool = True,
        samples_mc_entropy: int = 1,
        entropy_coeff: float = UNSET,
        entropy_coef: float = UNSET,
        critic_coeff: float | None = UNSET,
        critic_coef: float | None = UNSET,
        loss_critic_type: str = "smooth_l1",
        normalize_advantage: bool = False,
        normalize_advantage_exclude_dims: tuple[int, ...] = (),
        log_explained_variance: bool = True,
        diagnostics: bool = True,
        gamma: float | None = None,
        separate_losses: bool = False,
        reduction: str = "mean",
        clip_value: float | None = None,
        functional: bool = True,
    ) -> None:
        super().__init__()
        self._init_terms(
            actor_network,
            critic_network,
            entropy_bonus=entropy_bonus,
            samples_mc_entropy=samples_mc_entropy,
            entropy_coeff=pick_coeff("entropy_coeff", entropy_coeff, entropy_coef, 0.01),
            critic_coeff=pick_coeff("critic_coeff", critic_coeff, critic_coef, 1.0),
            loss_critic_type=loss_critic_type,
            separate_losses=separate_losses,
            reduction=reduction,
            clip_value=clip_value,
            gamma=gamma,
        )
        self.normalize_advantage = bool(normalize_advantage)
        self.normalize_advantage_exclude_dims = tuple(normalize_advantage_exclude_dims)
        self.log_explained_variance = bool(log_explained_variance)
        self.diagnostics = bool(diagnostics)

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        return self._terms(td, self.diagnostics, update_state=True)

    @torch.no_grad()
    def diagnose(self, td: TensorDictBase) -> TensorDictBase:
        """The loss terms and every diagnostic for ``td``, without gradient and without
        updating any state (such as ``KLPENPPOLoss``'s ``beta``)."""
        return self._terms(td, True, update_state=False)

    def _normalized_advantage(self, td: TensorDictBase) -> Tensor:
        advantage = self._advantage(td)
        if not self.normalize_advantage:
            return advantage
        excluded = {d % advantage.ndim for d in self.normalize_advantage_exclude_dims}
        dims = tuple(d for d in range(advantage.ndim) if d not in excluded)
        return normalize_advantage(advantage, dims=dims)

    def _terms(self, td: TensorDictBase, diagnostics: bool, update_state: bool) -> TensorDictBase:
        td = td.copy()  # what the loss writes (advantage, values...) stays out of the caller's batch
        advantage = self._normalized_advantage(td)[..., 0]
        log_prob, prev_log_prob, dist = self._log_prob(td)
        ratio = (log_prob - prev_log_prob).exp()
        out = {"loss_objective": -(ratio * advantage)}
        if diagnostics:
            out["kl_approx"] = (prev_log_prob - log_prob).detach().mean()
        self._add_entropy_and_critic(out, td, dist, diagnostics)
        return self._output(out)


class ClipPPOLoss(PPOLoss):
    """PPO with the clipped surrogate ``-mean(min(r A, clip(r, 1-ε, 1+ε) A))``.

    Args: ``clip_epsilon`` (ε, default 0.2), ``clip_value`` (``True`` clips the critic
    with ε, a float with that value) and those of :class:`PPOLoss`.

    Outputs: those of :class:`PPOLoss` plus ``clip_fraction`` (share of clipped ratios)
    and ``ESS`` (normalized effective sample size of the ratios, in (0, 1]).
    """

    def __init__(
        self,
        actor_network: nn.Module,
        critic_network: nn.Module | None = None,
        *,
        clip_epsilon: float = 0.2,
        entropy_bonus: bool = True,
        samples_mc_entropy: int = 1,
        entropy_coeff: float = UNSET,
        entropy_coef: float = UNSET,
        critic_coeff: float | None = UNSET,
        critic_coef: float | None = UNSET,
        loss_critic_type: str = "smooth_l1",
        normalize_advantage: bool = False,
        normalize_advantage_exclude_dims: tuple[int, ...] = (),
        log_explained_variance: bool = True,
        diagnostics: bool = True,
        gamma: float | None = None,
        separate_losses: bool = False,
        reduction: str = "mean",
        clip_value: bool | float | None = None,
        functional: bool = True,
    ) -> None:
        if not 0 < clip_epsilon < 1:
            raise ValueError(f"clip_epsilon must be in (0, 1), got {clip_epsilon}")
        if clip_value is True:
            clip_value = clip_epsilon
        elif clip_value is False:
            clip_value = None
        super().__init__(
            actor_network,
            critic_network,
            entropy_bonus=entropy_bonus,
            samples_mc_entropy=samples_mc_entropy,
            entropy_coeff=entropy_coeff,
            entropy_coef=entropy_coef,
            critic_coeff=critic_coeff,
            critic_coef=critic_coef,
            loss_critic_type=loss_critic_type,
            normalize_advantage=normalize_advantage,
            normalize_advantage_exclude_dims=normalize_advantage_exclude_dims,
            log_explained_variance=log_explained_variance,
            diagnostics=diagnostics,
            gamma=gamma,
            separate_losses=separate_losses,
            reduction=reduction,
            clip_value=clip_value,
        )
        # a buffer (as TorchRL): schedules anneal it in place (``loss.clip_epsilon.fill_(e)``)
        # and a compiled update does not recompile when it changes
        self.register_buffer("clip_epsilon", torch.tensor(float(clip_epsilon)))

    def _terms(self, td: TensorDictBase, diagnostics: bool, update_state: bool) -> TensorDictBase:
        td = td.copy()
        advantage = self._normalized_advantage(td)[..., 0]
        log_prob, prev_log_prob, dist = self._log_prob(td)
        log_ratio = log_prob - prev_log_prob
        eps = self.clip_epsilon
        clipped_log_ratio = log_ratio.clamp(torch.log1p(-eps), torch.log1p(eps))
        gain = torch.minimum(log_ratio.exp() * advantage, clipped_log_ratio.exp() * advantage)
        out = {"loss_objective": -gain}
        if diagnostics:
            with torch.no_grad():
                lw = log_ratio.flatten()
                out["clip_fraction"] = (clipped_log_ratio != log_ratio).to(log_ratio.dtype).mean()
                out["kl_approx"] = (-lw).mean()
                out["ESS"] = (2 * lw.logsumexp(0) - (2 * lw).logsumexp(0)).exp() / lw.numel()
        self._add_entropy_and_critic(out, td, dist, diagnostics)
        return self._output(out)


class KLPENPPOLoss(PPOLoss):
    """PPO with an adaptive KL penalty: ``-mean(r A - β KL(π_old || π))``.

    ``π_old`` is rebuilt from the distribution parameters stored in the batch (e.g.
    ``"loc"``/``"scale"`` written by the collecting policy). After each call ``β`` is
    multiplied by ``increment`` if ``mean KL > 1.5 dtarg`` and by ``decrement`` if
    ``mean KL < dtarg / 1.5`` (the loss of this call uses the previous ``β``). Without a
    closed-form KL, ``samples_mc_kl`` draws from ``π_old`` estimate it.

    Args: ``dtarg`` (0.01), ``beta`` (1.0), ``increment`` (2.0), ``decrement`` (0.5),
    ``samples_mc_kl`` (1) and those of :class:`PPOLoss`. Outputs: those of
    :class:`PPOLoss` plus ``kl`` (mean KL, detached).
    """

    def __init__(
        self,
        actor_network: nn.Module,
        critic_network: nn.Module | None = None,
        *,
        dtarg: float = 0.01,
        beta: float = 1.0,
        increment: float = 2.0,
        decrement: float = 0.5,
        samples_mc_kl: int = 1,
        entropy_bonus: bool = True,
        samples_mc_entropy: int = 1,
        entropy_coeff: float = UNSET,
        entropy_coef: float = UNSET,
        critic_coeff: float | None = UNSET,
        critic_coef: float | None = UNSET,
        loss_critic_type: str = "smooth_l1",
        normalize_advantage: bool = False,
        normalize_advantage_exclude_dims: tuple[int, ...] = (),
        log_explained_variance: bool = True,
        diagnostics: bool = True,
        gamma: float | None = None,
        separate_losses: bool = False,
        reduction: str = "mean",
        clip_value: float | None = None,
        functional: bool = True,
    ) -> None:
        super().__init__(
            actor_network,
            critic_network,
            entropy_bonus=entropy_bonus,
            samples_mc_entropy=samples_mc_entropy,
            entropy_coeff=entropy_coeff,
            entropy_coef=entropy_coef,
            critic_coeff=critic_coeff,
            critic_coef=critic_coef,
            loss_critic_type=loss_critic_type,
            normalize_advantage=normalize_advantage,
            normalize_advantage_exclude_dims=normalize_advantage_exclude_dims,
            log_explained_variance=log_explained_variance,
            diagnostics=diagnostics,
            gamma=gamma,
            separate_losses=separate_losses,
            reduction=reduction,
            clip_value=clip_value,
        )
        if not hasattr(actor_network, "build_dist_from_params"):
            raise TypeError(
                "KLPENPPOLoss: actor_network must rebuild the old distribution from stored "
                "parameters (a ProbabilisticTensorDictSequential with build_dist_from_params)"
            )
        if increment < 1 or decrement > 1:
            raise ValueError(f"KLPENPPOLoss: need increment >= 1 and decrement <= 1, got {increment}, {decrement}")
        self.dtarg = float(dtarg)
        self.register_buffer("beta", torch.tensor(float(beta)))
        self.increment = float(increment)
        self.decrement = float(decrement)
        self.samples_mc_kl = int(samples_mc_kl)

    def _previous_dist(self, td: TensorDictBase) -> D.Distribution:
        try:
            return self.actor_network.build_dist_from_params(td)
        except KeyError as err:
            present = sorted(str(k) for k in td.keys(include_nested=True, leaves_only=True))
            raise KeyError(
                "KLPENPPOLoss needs the collecting policy's distribution parameters "
                f"{list(getattr(self.actor_network, 'dist_params_keys', []))} in the batch, which has "
                f"{present} (keep them when collecting: the policy writes them)"
            ) from err

    def _kl(self, previous: D.Distribution, current: D.Distribution) -> Tensor:
        try:
            return D.kl_divergence(previous, current)
        except NotImplementedError:
            x = previous.sample((self.samples_mc_kl,))
            return (previous.log_prob(x) - current.log_prob(x)).mean(0)

    def _terms(self, td: TensorDictBase, diagnostics: bool, update_state: bool) -> TensorDictBase:
        td = td.copy()
        previous_dist = self._previous_dist(td)  # before the actor overwrites the parameters
        advantage = self._normalized_advantage(td)[..., 0]
        log_prob, prev_log_prob, dist = self._log_prob(td)
        kl = self._kl(previous_dist, dist)
        beta = self.beta.clone()  # this call's β; the buffer is updated below
        out = {"loss_objective": -((log_prob - prev_log_prob).exp() * advantage - beta * kl)}
        kl_mean = kl.detach().mean()
        if diagnostics:
            out["kl"] = kl_mean
            out["kl_approx"] = (prev_log_prob - log_prob).detach().mean()
        if update_state:
            with torch.no_grad():
                new_beta = torch.where(
                    kl_mean > 1.5 * self.dtarg,
                    beta * self.increment,
                    torch.where(kl_mean < self.dtarg / 1.5, beta * self.decrement, beta),
                )
                self.beta.copy_(new_beta)
        self._add_entropy_and_critic(out, td, dist, diagnostics)
        return self._output(out)

    def extra_repr(self) -> str:
        return f"dtarg={self.dtarg}, increment={self.increment}, decrement={self.decrement}"
