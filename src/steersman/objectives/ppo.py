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

from typing import Any

import torch
import torch.distributions as D
from torch import Tensor, nn

from ..tensordict import TensorDictBase
from .actor_critic import ActorCriticLoss
from .value import normalize_advantage

__all__ = ["PPOLoss", "ClipPPOLoss", "KLPENPPOLoss"]


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

    Outputs: ``loss_objective``, ``loss_entropy``, ``loss_critic`` and the diagnostics
    ``entropy``, ``kl_approx`` (``mean(log π_old - log π)``), ``explained_variance``,
    ``value_clip_fraction`` (with ``clip_value``).

    :meth:`diagnose` (no gradient, no state change) returns the same TensorDict with
    every diagnostic, whatever ``diagnostics`` is.
    """

    def __init__(
        self,
        actor_network: nn.Module,
        critic_network: nn.Module | None = None,
        *,
        normalize_advantage: bool = False,
        normalize_advantage_exclude_dims: tuple[int, ...] = (),
        log_explained_variance: bool = True,
        diagnostics: bool = True,
        **common: Any,
    ) -> None:
        super().__init__(actor_network, critic_network, **common)
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
        **common: Any,
    ) -> None:
        super().__init__(actor_network, critic_network, **common)
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
