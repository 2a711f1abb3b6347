"""World-model losses: ``WorldModelLoss`` (supervised heads of a
:class:`~steersman.modules.WorldModel`) and DreamerV3's categorical KL terms.

``WorldModelLoss`` runs the world model on real transitions and regresses (``distance``:
``"l2"``, ``"l1"``, ``"smooth_l1"``; means over every element):

* ``loss_reward``: the predicted ``("next", reward)`` on the data's reward;
* ``loss_done``: the predicted ``("next", done)`` (as float) on the data's done flag;
* ``loss_reconstruction``: the decoder's ``reconstructed_observation`` on ``observation``;
* ``loss_latent``: ``predicted_latent`` on ``target_latent``;

each times its weight. The data's reward/done are kept aside before the model writes its
predictions under the same keys (the batch is not modified).

For categorical latents ``[..., num_categoricals, num_classes]`` (DreamerV3, Hafner et al.
2023), with ``q`` the posterior, ``p`` the prior and ``sg`` a stopped gradient:

* :func:`categorical_kl_terms`: ``dynamics = KL(sg(q) || p)`` and ``representation =
  KL(q || sg(p))``, each summed over the categoricals, clamped below at ``free_nats`` and
  averaged; ``unimix`` mixes that fraction of uniform probability into both first;
* :func:`categorical_kl_balanced`: ``alpha * dynamics + (1 - alpha) * representation``
  with the ``free_bits`` clamp per categorical instead (DreamerV2's KL balancing).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..tensordict import TensorDict, TensorDictBase
from .common import LossModule, NestedKey, check_options
from .utils import distance_loss

__all__ = ["WorldModelLoss", "categorical_kl_terms", "categorical_kl_balanced"]


def _next(key: NestedKey) -> tuple:
    return ("next", key) if isinstance(key, str) else ("next", *key)


class WorldModelLoss(LossModule):
    """Supervised losses of a world model (see the module docstring).

    Args:
        world_model: a TensorDict module (e.g. :class:`~steersman.modules.WorldModel`)
            writing the predictions the chosen losses read.

    Keyword Args:
        losses: any of ``"reward"``, ``"done"``, ``"reconstruction"``, ``"latent"``
            (default ``["reward"]``).
        reward_loss, done_loss, reconstruction_loss, latent_loss: the distance of each
            (default ``"l2"``).
        reward_weight, done_weight, reconstruction_weight, latent_weight: the weights
            (default 1).

    Returns ``loss_<name>`` per chosen loss.

    Example:
        >>> import torch
        >>> from steersman.modules import WorldModel
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> encoder = TensorDictModule(torch.nn.Linear(8, 4), ["observation"], ["latent"])
        >>> dynamics = TensorDictModule(torch.nn.Bilinear(4, 2, 4), ["latent", "action"], [("next", "latent")])
        >>> reward = TensorDictModule(torch.nn.Linear(4, 1), [("next", "latent")], [("next", "reward")])
        >>> loss = WorldModelLoss(WorldModel(encoder, dynamics, reward))
        >>> batch = TensorDict({"observation": torch.randn(4, 8), "action": torch.randn(4, 2),
        ...                     "next": {"reward": torch.randn(4, 1)}}, [4])
        >>> list(loss(batch).keys())
        ['loss_reward']
    """

    @dataclass
    class _AcceptedKeys:
        """Batch keys (TorchRL's names); reward and done are read under ``"next"``."""

        reward: NestedKey = "reward"
        true_reward: NestedKey = "true_reward"
        done: NestedKey = "done"
        true_done: NestedKey = "true_done"
        terminated: NestedKey = "terminated"
        true_terminated: NestedKey = "true_terminated"
        observation: NestedKey = "observation"
        reconstructed_observation: NestedKey = "reconstructed_observation"
        predicted_latent: NestedKey = "predicted_latent"
        target_latent: NestedKey = "target_latent"

    networks = ("world_model",)
    _VALID = ("reward", "done", "reconstruction", "latent")

    def __init__(
        self,
        world_model: nn.Module,
        *,
        losses: list[str] | None = None,
        reward_loss: str = "l2",
        done_loss: str = "l2",
        reconstruction_loss: str = "l2",
        latent_loss: str = "l2",
        reward_weight: float = 1.0,
        done_weight: float = 1.0,
        reconstruction_weight: float = 1.0,
        latent_weight: float = 1.0,
    ) -> None:
        super().__init__()
        losses = ["reward"] if losses is None else list(losses)
        unknown = sorted(set(losses) - set(self._VALID))
        if unknown or not losses:
            raise ValueError(f"WorldModelLoss: unknown or no losses {unknown or losses}; choose from {list(self._VALID)}")
        for name, fn in (("reward_loss", reward_loss), ("done_loss", done_loss),
                         ("reconstruction_loss", reconstruction_loss), ("latent_loss", latent_loss)):
            check_options(self, loss_function=fn, option=name)
        self.world_model = world_model
        self.losses = losses
        self.reward_loss, self.done_loss = reward_loss, done_loss
        self.reconstruction_loss, self.latent_loss = reconstruction_loss, latent_loss
        self.reward_weight, self.done_weight = reward_weight, done_weight
        self.reconstruction_weight, self.latent_weight = reconstruction_weight, latent_weight

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        """The chosen losses on one batch of real transitions."""
        keys = self.tensor_keys
        truth = {}
        if "reward" in self.losses:
            truth["reward"] = self._get_required(td, _next(keys.reward), "reward")
        if "done" in self.losses:
            truth["done"] = self._get_required(td, _next(keys.done), "done")
        if "reconstruction" in self.losses:
            truth["observation"] = self._get_required(td, keys.observation, "observation")
        data = td.copy()
        for name in ("reward", "done", "terminated"):
            if name in truth or (name == "terminated" and "done" in truth):
                data = data.exclude(_next(getattr(keys, name)))  # the model writes its predictions there
        out = self.world_model(data)
        losses: dict[str, Tensor] = {}
        if "reward" in self.losses:
            pred = self._get_required(out, _next(keys.reward), "reward", "the world model's reward head")
            losses["loss_reward"] = self.reward_weight * distance_loss(pred, truth["reward"], self.reward_loss).mean()
        if "done" in self.losses:
            pred = self._get_required(out, _next(keys.done), "done", "the world model's done head")
            target = truth["done"].to(pred.dtype if pred.is_floating_point() else torch.float32)
            losses["loss_done"] = self.done_weight * distance_loss(pred.to(target.dtype), target, self.done_loss).mean()
        if "reconstruction" in self.losses:
            pred = self._get_required(out, keys.reconstructed_observation, "reconstructed_observation", "the decoder")
            losses["loss_reconstruction"] = self.reconstruction_weight * distance_loss(
                pred, truth["observation"], self.reconstruction_loss).mean()
        if "latent" in self.losses:
            pred = self._get_required(out, keys.predicted_latent, "predicted_latent", "the world model")
            target = self._get_required(out, keys.target_latent, "target_latent", "the world model")
            losses["loss_latent"] = self.latent_weight * distance_loss(pred, target, self.latent_loss).mean()
        return TensorDict(losses, [])

    def _get_required(self, td: TensorDictBase, key: NestedKey, name: str, writer: str | None = None) -> Tensor:
        value = td.get(key, None)
        if value is None:
            if writer is None:
                raise self._missing_key(td, name, key if isinstance(key, tuple) and key[0] == "next" else None)
            raise KeyError(f"WorldModelLoss: {writer} wrote no {key!r} (its {name!r} key); check its out_keys or "
                           f"call loss.set_keys({name}=<its key>)")
        return value


def _probs(logits: Tensor, unimix: float) -> Tensor:
    if not 0.0 <= unimix < 1.0:
        raise ValueError(f"unimix must be in [0, 1), got {unimix}")
    probs = logits.softmax(-1)
    return probs if not unimix else (1.0 - unimix) * probs + unimix / logits.shape[-1]


def categorical_kl_terms(posterior_logits: Tensor, prior_logits: Tensor, free_nats: float = 1.0,
                         unimix: float = 0.01) -> tuple[Tensor, Tensor]:
    """DreamerV3's ``(dynamics, representation)`` KL losses (see the module docstring) of
    logits ``[..., num_categoricals, num_classes]``: two scalars.

    Example:
        >>> import torch
        >>> q = torch.randn(2, 4, 8, requires_grad=True)
        >>> dyn, rep = categorical_kl_terms(q, q.detach().clone(), free_nats=0.0, unimix=0.0)
        >>> float(dyn.detach()), float(rep.detach())  # identical distributions
        (0.0, 0.0)
    """
    if posterior_logits.shape != prior_logits.shape:
        raise ValueError(f"categorical_kl_terms: posterior {list(posterior_logits.shape)} and prior "
                         f"{list(prior_logits.shape)} logits differ in shape")
    q, p = _probs(posterior_logits, unimix), _probs(prior_logits, unimix)
    log_q, log_p = q.log(), p.log()
    dynamics = (q.detach() * (log_q.detach() - log_p)).sum((-1, -2))
    representation = (q * (log_q - log_p.detach())).sum((-1, -2))
    if free_nats:
        dynamics, representation = dynamics.clamp_min(free_nats), representation.clamp_min(free_nats)
    return dynamics.mean(), representation.mean()


def categorical_kl_balanced(posterior_logits: Tensor, prior_logits: Tensor, alpha: float = 0.8,
                            free_bits: float = 1.0) -> Tensor:
    """``alpha * KL(sg(q) || p) + (1 - alpha) * KL(q || sg(p))`` of logits ``[...,
    num_categoricals, num_classes]``, each KL clamped below at ``free_bits`` per categorical
    and averaged: a scalar.

    Example:
        >>> import torch
        >>> q, p = torch.randn(4, 8, 16, requires_grad=True), torch.randn(4, 8, 16, requires_grad=True)
        >>> categorical_kl_balanced(q, p, alpha=0.8, free_bits=0.1).backward()
        >>> q.grad.shape, p.grad.shape
        (torch.Size([4, 8, 16]), torch.Size([4, 8, 16]))
    """
    if posterior_logits.shape != prior_logits.shape:
        raise ValueError(f"categorical_kl_balanced: posterior {list(posterior_logits.shape)} and prior "
                         f"{list(prior_logits.shape)} logits differ in shape")
    q = posterior_logits.softmax(-1).clamp_min(1e-8)
    p = prior_logits.softmax(-1).clamp_min(1e-8)
    dynamics = (q.detach() * (q.detach().log() - p.log())).sum(-1).clamp_min(free_bits).mean()
    representation = (q * (q.log() - p.detach().log())).sum(-1).clamp_min(free_bits).mean()
    return alpha * dynamics + (1.0 - alpha) * representation
