"""KL-coefficient controllers for RLHF (TorchRL's ``torchrl.data`` names).

In RLHF the reward of a sampled response is penalised by ``beta * KL(pi || pi_ref)``; a KL
controller owns ``beta`` (``coef``) and, optionally, writes it into a model's ``kl_coef``
attribute after every update.

* :class:`ConstantKLController`: ``beta`` never changes.
* :class:`AdaptiveKLController`: Ziegler et al. 2019 ("Fine-Tuning Language Models from
  Human Preferences", section 2.2). With ``KL`` the mean of the ``n`` observed KL values,

  .. code-block:: text

      e      = clip(KL / target - 1, -0.2, 0.2)
      beta  <- beta * (1 + e * n / horizon)

  so ``beta`` grows when the policy drifts further than ``target`` from the reference and
  shrinks when it stays closer.

Note (differs from TorchRL 0.14): TorchRL's ``AdaptiveKLController.update`` documents
``kl_values`` as KL values but reads them as KL *penalty rewards* ``-beta * KL`` (it divides
by ``-beta``), so passing actual KL values there always shrinks ``beta``. Here ``kl_values``
are the KL values, as documented and as in the paper.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["KLControllerBase", "ConstantKLController", "AdaptiveKLController"]


def _check_model(cls: type, model: Any) -> None:
    if model is not None and not hasattr(model, "kl_coef"):
        raise AttributeError(
            f"{cls.__name__}: model {type(model).__name__} has no attribute 'kl_coef' to control")


class KLControllerBase:
    """Base of the KL controllers: holds ``coef`` and the optional controlled ``model``."""

    coef: float
    model: Any

    def update(self, kl_values: Sequence[float] | torch.Tensor | None = None) -> float:
        raise NotImplementedError

    def _sync(self) -> None:
        if self.model is not None:
            self.model.kl_coef = self.coef

    def __repr__(self) -> str:
        return f"{type(self).__name__}(coef={self.coef})"


class ConstantKLController(KLControllerBase):
    """A KL coefficient that stays at ``kl_coef`` whatever it is updated with.

    Keyword Args:
        kl_coef: the coefficient multiplying the KL in the reward.
        model: optional module with a ``kl_coef`` attribute, set to ``kl_coef`` at
            construction and at every :meth:`update`.

    Example:
        >>> ctl = ConstantKLController(kl_coef=0.1)
        >>> ctl.update([0.5, 3.0])
        0.1
    """

    def __init__(self, *, kl_coef: float | None = None, model: Any = None) -> None:
        _check_model(type(self), model)
        self.model = model
        self.coef = kl_coef
        self._sync()

    def update(self, kl_values: Sequence[float] | torch.Tensor | None = None) -> float:
        """Returns the (unchanged) coefficient, re-writing it into the model if any."""
        self._sync()
        return self.coef


class AdaptiveKLController(KLControllerBase):
    """Adaptive KL coefficient of Ziegler et al. 2019 (section 2.2).

    ``update(kl_values)`` takes the ``n`` KL values observed since the last update (one per
    sample/step) and sets ``coef <- coef * (1 + clip(mean(kl_values) / target - 1, -0.2, 0.2)
    * n / horizon)``.

    Keyword Args:
        init_kl_coef: the starting coefficient.
        target: the KL the controller steers towards: larger observed KL raises the
            coefficient (pulling the policy back to the reference), smaller lowers it.
        horizon: how many steps a full (20%) correction is spread over; larger is gentler.
        model: optional module with a ``kl_coef`` attribute, kept equal to ``coef``.

    Example:
        >>> ctl = AdaptiveKLController(init_kl_coef=0.1, target=1.0, horizon=10)
        >>> round(ctl.update([2.0, 3.0]), 6)  # KL 2.5 > 1: error clipped to 0.2, 2 steps
        0.104
        >>> round(ctl.update([0.9]), 6)  # KL 0.9 < 1: error -0.1, 1 step
        0.10296
    """

    def __init__(self, *, init_kl_coef: float, target: float, horizon: int, model: Any = None) -> None:
        if not target > 0:
            raise ValueError(f"AdaptiveKLController: target must be > 0, got {target}")
        if not horizon > 0:
            raise ValueError(f"AdaptiveKLController: horizon must be > 0, got {horizon}")
        _check_model(type(self), model)
        self.model = model
        self.coef = float(init_kl_coef)
        self.target = float(target)
        self.horizon = horizon
        self._sync()

    def update(self, kl_values: Sequence[float] | torch.Tensor | None = None) -> float:
        """Applies the update rule to ``kl_values`` (a non-empty sequence or tensor of KL
        values) and returns the new coefficient."""
        if kl_values is None:
            raise ValueError("AdaptiveKLController.update: kl_values is required (the observed KL values)")
        kl = torch.as_tensor(kl_values, dtype=torch.float64).detach().reshape(-1)
        n_steps = kl.numel()
        if n_steps == 0:
            raise ValueError("AdaptiveKLController.update: kl_values is empty; expected at least one KL value")
        kl_mean = kl.mean().item()
        if not math.isfinite(kl_mean):
            raise ValueError(f"AdaptiveKLController.update: kl_values contain a non-finite value (mean {kl_mean})")
        error = min(max(kl_mean / self.target - 1.0, -0.2), 0.2)
        self.coef *= 1.0 + error * n_steps / self.horizon
        self._sync()
        return self.coef
