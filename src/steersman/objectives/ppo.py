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

import math
from typing import Any

import torch
import torch.distributions as D
from torch import Tensor, nn

from ..tensordict import TensorDictBase
from .actor_critic import ActorCriticLoss, actor_distribution
from .value import normalize_advantage

__all__ = ["PPOLoss", "ClipPPOLoss", "KLPENPPOLoss"]


def clipped_ppo_gain(log_ratio: Tensor, advantage: Tensor, clip_epsilon: Tensor) -> tuple[Tensor, Tensor]:
    """PPO's clipped surrogate per sample, ``min(r A, clip(r, 1 - eps, 1 + eps) A)`` with the
    ratio clipped in log space, and the clipped log-ratio (all ``[*B]``): the
    :class:`ClipPPOLoss` term, also for plain-tensor copies of the loss (fused updates)."""
    clipped = log_ratio.clamp(torch.log1p(-clip_epsilon), torch.log1p(clip_epsilon))
    return torch.minimum(log_ratio.exp() * advantage, clipped.exp() * advantage), clipped


class PPOLoss(ActorCriticLoss):
    """The unclipped PPO loss ``-mean(r A)``, plus entropy bonus and critic loss.

    Args: ``actor_network``, ``critic_network`` and the keywords of
    :class:`~steersman.objectives.actor_critic.ActorCriticLoss` (``entropy_coeff``,
    ``critic_coeff``, ``loss_critic_type``, ``gamma``, ``separate_losses``, ``reduction``,
    ``clip_value``...), plus:

    Keyword Args:
        normalize_advantage: standardize the advantage over the minibatch (left as is
            for a minibatch of one element).
        normalize_advantage_exclude_dims: batch dims kept apart when normalizing.
        log_explained_variance: add the ``explained_variance`` diagnostic of the critic.
        diagnostics: add the detached diagnostics (``entropy``, ``kl_approx``, ...) to
            every call's output. ``False`` returns the ``loss_*`` terms only, a few
            percent cheaper per update; :meth:`diagnose` computes them when wanted
            (e.g. once per collected batch for logging).
        delay_actor: decoupled proximal policy (PPO-EWMA, Hilton et al. 2021): a frozen
            copy of the actor (``target_actor_network_params``, moved by
            ``SoftUpdate``/``HardUpdate``) is the proximal policy ``π_prox`` the trust
            region acts on (the ratio ``r = π/π_prox`` is clipped, or the KL penalty is
            taken from ``π_prox``), while each sample stays weighted by ``π_prox/π_behav``
            (``π_behav``: the batch's log-probabilities), so the surrogate is
            ``-(π_prox/π_behav) · min(r A, clip(r) A)``. ``kl_approx`` and
            ``clip_fraction`` then describe ``r``.
        max_importance_ratio: cap the behaviour ratio ``π/π_behav`` at this value, by
            lifting the (gradient-free) behaviour log-probability: a capped sample keeps a
            rescaled policy gradient instead of none. Default ``None``: no cap.
        device: the device of the loss's own buffers (``clip_epsilon``, ``beta``); the
            networks are not moved (as in TorchRL).
        advantage_norm: see :class:`~steersman.objectives.actor_critic.ActorCriticLoss`;
            exclusive with ``normalize_advantage``.

    Outputs: ``loss_objective``, ``loss_entropy``, ``loss_critic`` and the diagnostics
    ``entropy``, ``kl_approx`` (``mean(log π_old - log π)``), ``explained_variance``,
    ``value_clip_fraction`` (with ``clip_value``).

    :meth:`diagnose` (no gradient, no state change) returns the same TensorDict with
    every diagnostic, whatever ``diagnostics`` is.
    """

    def __init__(
        self,
        actor_network: nn.Module | None = None,
        critic_network: nn.Module | None = None,
        *,
        normalize_advantage: bool = False,
        normalize_advantage_exclude_dims: tuple[int, ...] = (),
        log_explained_variance: bool = True,
        diagnostics: bool = True,
        delay_actor: bool = False,
        max_importance_ratio: float | None = None,
        device: torch.device | str | None = None,
        **common: Any,
    ) -> None:
        super().__init__(actor_network, critic_network, **common)
        name = type(self).__name__
        if normalize_advantage and self.advantage_norm is not None:
            raise ValueError(f"{name}: normalize_advantage=True and advantage_norm are exclusive (one standardizes "
                             "the advantage per minibatch, the other rescales it by running return statistics)")
        if max_importance_ratio is not None and not float(max_importance_ratio) > 0:
            raise ValueError(f"{name}: max_importance_ratio must be > 0, got {max_importance_ratio}")
        self.max_importance_ratio = None if max_importance_ratio is None else float(max_importance_ratio)
        self.delay_actor = bool(delay_actor)
        if self.delay_actor:
            self.make_target("actor_network")
        self._buffer_device = None if device is None else torch.device(device)
        self.normalize_advantage = bool(normalize_advantage)
        self.normalize_advantage_exclude_dims = tuple(normalize_advantage_exclude_dims)
        self.log_explained_variance = bool(log_explained_variance)
        self.diagnostics = bool(diagnostics)

    def _place_buffers(self) -> None:
        """Moves the loss's own buffers (not the networks') to ``device`` when it was given."""
        if self._buffer_device is not None:
            for name, buf in self._buffers.items():
                if buf is not None:
                    self._buffers[name] = buf.to(self._buffer_device)

    def _proximal_actor(self) -> nn.Module:
        target = getattr(self, "target_actor_network", None)
        return self.actor_network if target is None else target

    def _ratios(self, td: TensorDictBase) -> tuple[Tensor, Tensor, Tensor | None, D.Distribution]:
        """``(log r, log π_prox, log w or None, π)``: ``r = π/π_prox`` is what the trust
        region acts on and ``w`` the extra per-sample weight ``π_prox/π_behav`` (capped with
        ``max_importance_ratio``); without ``delay_actor`` ``π_prox`` is ``π_behav``."""
        log_prob, behaviour, dist = self._log_prob(td)
        log_is = None
        proximal = behaviour
        if self.delay_actor:
            with torch.no_grad():
                target = self._proximal_actor()
                proximal = actor_distribution(target, td.copy()).log_prob(self._get(td, "action"))
                proximal = proximal.reshape(log_prob.shape)
            log_is = proximal - behaviour
        log_ratio = log_prob - proximal
        if self.max_importance_ratio is not None:
            base = torch.zeros_like(log_ratio) if log_is is None else log_is
            log_is = torch.minimum(base, math.log(self.max_importance_ratio) - log_ratio.detach())
        return log_ratio, proximal, log_is, dist

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
        log_ratio, _, log_is, dist = self._ratios(td)
        gain = log_ratio.exp() * advantage
        out = {"loss_objective": -(gain if log_is is None else log_is.exp() * gain)}
        if diagnostics:
            out["kl_approx"] = (-log_ratio).detach().mean()
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
        actor_network: nn.Module | None = None,
        critic_network: nn.Module | None = None,
        *,
        clip_epsilon: float = 0.2,
        clip_value: bool | float | None = None,
        **common: Any,
    ) -> None:
        if not 0 < clip_epsilon < 1:
            raise ValueError(f"clip_epsilon must be in (0, 1), got {clip_epsilon}")
        if isinstance(clip_value, bool):
            clip_value = clip_epsilon if clip_value else None
        super().__init__(actor_network, critic_network, clip_value=clip_value, **common)
        # a buffer (as TorchRL): schedules anneal it in place (``loss.clip_epsilon.fill_(e)``)
        # and a compiled update does not recompile when it changes
        self.register_buffer("clip_epsilon", torch.tensor(float(clip_epsilon)))
        self._place_buffers()

    def _terms(self, td: TensorDictBase, diagnostics: bool, update_state: bool) -> TensorDictBase:
        td = td.copy()
        advantage = self._normalized_advantage(td)[..., 0]
        log_ratio, _, log_is, dist = self._ratios(td)
        gain, clipped_log_ratio = clipped_ppo_gain(log_ratio, advantage, self.clip_epsilon)
        out = {"loss_objective": -(gain if log_is is None else log_is.exp() * gain)}
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
        actor_network: nn.Module | None = None,
        critic_network: nn.Module | None = None,
        *,
        dtarg: float = 0.01,
        beta: float = 1.0,
        increment: float = 2.0,
        decrement: float = 0.5,
        samples_mc_kl: int = 1,
        **common: Any,
    ) -> None:
        super().__init__(actor_network, critic_network, **common)
        if not hasattr(self.actor_network, "build_dist_from_params"):
            raise TypeError(
                "KLPENPPOLoss: actor_network must rebuild the old distribution from stored "
                "parameters (a ProbabilisticTensorDictSequential with build_dist_from_params)"
            )
        if increment < 1 or decrement > 1:
            raise ValueError(f"KLPENPPOLoss: need increment >= 1 and decrement <= 1, got {increment}, {decrement}")
        self.dtarg = float(dtarg)
        self.register_buffer("beta", torch.tensor(float(beta)))
        self._place_buffers()
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
        if self.delay_actor:  # the penalty is taken from the proximal policy
            with torch.no_grad():
                target = self._proximal_actor()
                previous_dist = actor_distribution(target, td.copy())
        else:
            previous_dist = self._previous_dist(td)  # before the actor overwrites the parameters
        advantage = self._normalized_advantage(td)[..., 0]
        log_ratio, _, log_is, dist = self._ratios(td)
        kl = self._kl(previous_dist, dist)
        beta = self.beta.clone()  # this call's β; the buffer is updated below
        gain = log_ratio.exp() * advantage
        out = {"loss_objective": -((gain if log_is is None else log_is.exp() * gain) - beta * kl)}
        kl_mean = kl.detach().mean()
        if diagnostics:
            out["kl"] = kl_mean
            out["kl_approx"] = (-log_ratio).detach().mean()
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
