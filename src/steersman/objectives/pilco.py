"""PILCO's saturating cost (Deisenroth & Rasmussen 2011, "PILCO: A Model-Based and
Data-Efficient Approach to Policy Search", eqs. 24-25).

``c(x) = 1 - exp(-(x - t)^T W (x - t) / 2)`` is near 0 at the target ``t`` and saturates
at 1 far from it. For a Gaussian state ``x ~ N(m, S)`` its expectation is closed-form::

    E[c(x)] = 1 - det(I + S W)^(-1/2) * exp(-(m - t)^T W (I + S W)^(-1) (m - t) / 2)

computed here in the symmetric form ``A = I + U S U`` with ``U = W^(1/2)`` (a Cholesky
factor of ``A`` gives the determinant and the solve), differentiable in ``m`` and ``S``:
what PILCO's policy search descends through the moment-matched rollout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..tensordict import TensorDict, TensorDictBase
from .common import LossModule, NestedKey, check_options

__all__ = ["ExponentialQuadraticCost"]


class ExponentialQuadraticCost(LossModule):
    """The expected saturating cost of Gaussian states (see the module docstring).

    Args:
        target: the target state ``[D]`` (or ``[*B, D]``); default the origin.
        weights: the precision ``W`` ``[D, D]`` (symmetric positive semi-definite);
            default the identity.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (``[*B]``).

    Reads the state mean ``[*B, D]`` at ``loc`` (default ``("observation", "mean")``) and its
    covariance ``[*B, D, D]`` at ``scale`` (``("observation", "var")``); returns
    ``loss_cost`` (renamable with ``set_keys(loss_cost=...)``). The loss has no parameters:
    its gradient goes to the moments, hence to the policy and model that produced them.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> cost = ExponentialQuadraticCost(reduction="none")
        >>> td = TensorDict({"observation": {"mean": torch.tensor([[0.0, 0.0], [3.0, 0.0]]),
        ...                                  "var": torch.zeros(2, 2, 2)}}, [2])
        >>> cost(td)["loss_cost"]  # 1 - exp(-|m|^2 / 2) for a point mass
        tensor([0.0000, 0.9889])
    """

    @dataclass
    class _AcceptedKeys:
        """The state mean and covariance, and the output's name."""

        loc: NestedKey = ("observation", "mean")
        scale: NestedKey = ("observation", "var")
        loss_cost: NestedKey = "loss_cost"

    def __init__(self, target: Tensor | None = None, weights: Tensor | None = None, reduction: str = "mean") -> None:
        super().__init__()
        check_options(self, reduction=reduction)
        if weights is not None:
            weights = torch.as_tensor(weights)
            if weights.dim() != 2 or weights.shape[0] != weights.shape[1]:
                raise ValueError(f"ExponentialQuadraticCost: weights must be a square [D, D] matrix, got "
                                 f"{list(weights.shape)}")
            if not torch.allclose(weights, weights.T):
                raise ValueError("ExponentialQuadraticCost: weights must be symmetric")
        self.register_buffer("target", None if target is None else torch.as_tensor(target))
        self.register_buffer("weights", weights)
        self.reduction = reduction

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        """``loss_cost`` for the Gaussian states in ``td``."""
        m = self._get(td, "loc")
        s = self._get(td, "scale")
        d = m.shape[-1]
        if s.shape != (*m.shape, d):
            raise ValueError(f"ExponentialQuadraticCost: the covariance has shape {list(s.shape)}, expected "
                             f"{[*m.shape, d]} for a mean of shape {list(m.shape)}")
        eye = torch.eye(d, dtype=m.dtype, device=m.device)
        w = self.weights.to(m) if self.weights is not None else eye
        t = self.target.to(m) if self.target is not None else torch.zeros(d, dtype=m.dtype, device=m.device)
        evals, evecs = torch.linalg.eigh(w)
        u = evecs @ torch.diag_embed(evals.clamp_min(0.0).sqrt()) @ evecs.T  # W^(1/2)
        a = eye + u @ s @ u  # >= I: positive definite, no jitter needed
        chol = torch.linalg.cholesky(a)
        v = (u @ (m - t).unsqueeze(-1))  # [*B, D, 1]
        quad = (v * torch.cholesky_solve(v, chol)).sum((-1, -2))
        log_det = 2.0 * chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        cost = 1.0 - torch.exp(-0.5 * log_det - 0.5 * quad)
        if self.reduction == "none":
            return TensorDict({self.tensor_keys.loss_cost: cost}, m.shape[:-1])
        return TensorDict({self.tensor_keys.loss_cost: cost.mean() if self.reduction == "mean" else cost.sum()}, [])
