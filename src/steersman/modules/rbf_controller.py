"""PILCO's radial-basis-function controller (Deisenroth & Rasmussen 2011) with exact
moment propagation of Gaussian state beliefs.

The controller is ``u = max_action * sin(f(x))`` with ``f(x) = sum_i beta_i k(x, c_i)``,
``k(x, c) = sigma^2 exp(-(x - c)^T L^(-1) (x - c) / 2)`` and ``L = diag(lengthscales^2)``
(``n_basis`` centres ``c_i``, weights ``beta_i [E]``). For a belief ``x ~ N(m, S)`` the
moments are closed-form (products of Gaussians), with ``nu_i = m - c_i``:

* ``E[f] = sum_i beta_i q_i``, ``q_i = sigma^2 |S L^(-1) + I|^(-1/2) exp(-nu_i^T (S + L)^(-1) nu_i / 2)``;
* ``E[f f^T] = beta^T Q beta``, ``Q_ij = sigma^4 |2 S L^(-1) + I|^(-1/2)
  exp(-(c_i - c_j)^T L^(-1) (c_i - c_j) / 4) exp(-(m - cbar_ij)^T (L / 2 + S)^(-1) (m - cbar_ij) / 2)``
  with ``cbar_ij = (c_i + c_j) / 2``;
* ``Cov[x, f] = sum_i q_i S (S + L)^(-1) (c_i - m) beta_i^T``;

then through ``a sin(.)`` for ``f ~ N(mu, V)``: ``E = a exp(-V_jj / 2) sin(mu_j)``,
``E[sin f_i sin f_j] = (exp(-(V_ii + V_jj - 2 V_ij) / 2) cos(mu_i - mu_j) - exp(-(V_ii + V_jj
+ 2 V_ij) / 2) cos(mu_i + mu_j)) / 2``, and ``Cov[x, u] = Cov[x, f] diag(a exp(-V_jj / 2) cos mu_j)``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["RBFController"]


class RBFController(nn.Module):
    """A Gaussian-belief-in, Gaussian-action-out RBF policy (see the module docstring).

    Args:
        input_dim: the state size ``D``.
        output_dim: the action size ``E``.
        max_action: the bound ``a`` of ``a * sin(f)`` (a number or ``[E]``); ``None``: no
            squashing (the RBF network's moments are returned).
        n_basis: the number of centres (default 10).

    ``forward(mean [*B, D], covariance [*B, D, D]) -> (action_mean [*B, E], action_covariance
    [*B, E, E], cross_covariance [*B, D, E])`` (the last is ``Cov[x, u]``). Parameters:
    ``centers [n_basis, D]``, ``weights [n_basis, E]``, ``lengthscales [D]``; the signal
    variance ``variance`` is 1.

    Example:
        >>> import torch
        >>> controller = RBFController(input_dim=4, output_dim=1, max_action=2.0, n_basis=5)
        >>> mean, cov = torch.randn(2, 4), torch.eye(4).expand(2, 4, 4) * 0.1
        >>> [t.shape for t in controller(mean, cov)]
        [torch.Size([2, 1]), torch.Size([2, 1, 1]), torch.Size([2, 4, 1])]
    """

    def __init__(self, input_dim: int, output_dim: int, max_action: float | Tensor | None, n_basis: int = 10) -> None:
        super().__init__()
        if n_basis < 1:
            raise ValueError(f"RBFController: n_basis must be >= 1, got {n_basis}")
        self.input_dim, self.output_dim, self.n_basis = input_dim, output_dim, n_basis
        self.max_action = max_action
        self.centers = nn.Parameter(torch.randn(n_basis, input_dim) * 0.5)
        self.weights = nn.Parameter(torch.randn(n_basis, output_dim) * 0.1)
        self.lengthscales = nn.Parameter(torch.ones(input_dim))
        self.variance = 1.0

    def forward(self, mean: Tensor, covariance: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The action's mean and covariance and the state-action cross-covariance."""
        d = self.input_dim
        if mean.shape[-1] != d or covariance.shape != (*mean.shape, d):
            raise ValueError(f"RBFController: expected mean [*B, {d}] and covariance [*B, {d}, {d}], got "
                             f"{list(mean.shape)} and {list(covariance.shape)}")
        f_mean, f_cov, f_cross = self.rbf_moments(mean, covariance)
        if self.max_action is None:
            return f_mean, f_cov, f_cross
        u_mean, u_cov, gain = self.squash_sin(f_mean, f_cov, self.max_action)
        return u_mean, u_cov, f_cross @ torch.diag_embed(gain)

    def rbf_moments(self, m: Tensor, s: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``E[f]`` ``[*B, E]``, ``Cov[f]`` ``[*B, E, E]``, ``Cov[x, f]`` ``[*B, D, E]``."""
        lam = self.lengthscales.pow(2).to(m)  # diag of L, [D]
        eye = torch.eye(self.input_dim, dtype=m.dtype, device=m.device)
        c = self.centers.to(m)
        beta = self.weights.to(m)
        nu = m.unsqueeze(-2) - c  # [*B, n, D]
        s_plus_l = s + torch.diag_embed(lam)
        solve = torch.linalg.solve(s_plus_l.unsqueeze(-3), nu.unsqueeze(-1)).squeeze(-1)  # (S + L)^-1 nu_i
        det1 = torch.linalg.det(s / lam + eye)  # |S L^-1 + I|
        q = self.variance * det1.rsqrt().unsqueeze(-1) * torch.exp(-0.5 * (nu * solve).sum(-1))  # [*B, n]
        f_mean = q @ beta
        # Q_ij
        diff = c.unsqueeze(1) - c.unsqueeze(0)  # [n, n, D]
        centre_term = torch.exp(-0.25 * (diff.pow(2) / lam).sum(-1))  # [n, n]
        cbar = (c.unsqueeze(1) + c.unsqueeze(0)) / 2  # [n, n, D]
        z = m[..., None, None, :] - cbar  # [*B, n, n, D]
        b = s + torch.diag_embed(lam / 2)
        zb = torch.linalg.solve(b[..., None, None, :, :], z.unsqueeze(-1)).squeeze(-1)
        det2 = torch.linalg.det(2 * s / lam + eye)
        big_q = self.variance ** 2 * det2.rsqrt()[..., None, None] * centre_term * torch.exp(-0.5 * (z * zb).sum(-1))
        f_cov = beta.T @ big_q @ beta - f_mean.unsqueeze(-1) * f_mean.unsqueeze(-2)
        f_cov = (f_cov + f_cov.transpose(-1, -2)) / 2
        # Cov[x, f] = S (S + L)^-1 sum_i q_i (c_i - m) beta_i^T
        weighted = (-nu * q.unsqueeze(-1)).transpose(-1, -2) @ beta  # [*B, D, E]
        f_cross = s @ torch.linalg.solve(s_plus_l, weighted)
        return f_mean, f_cov, f_cross

    @staticmethod
    def squash_sin(mean: Tensor, covariance: Tensor, max_action: float | Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Moments of ``a * sin(y)`` for ``y ~ N(mean [*B, E], covariance [*B, E, E])``:
        ``(mean [*B, E], covariance [*B, E, E], gain [*B, E])`` where
        ``Cov[y, a sin y] = covariance @ diag(gain)``.

        Example:
            >>> import torch
            >>> m, v, _ = RBFController.squash_sin(torch.zeros(1, 1), torch.zeros(1, 1, 1), 2.0)
            >>> m, v
            (tensor([[0.]]), tensor([[[0.]]]))
        """
        a = torch.as_tensor(max_action, dtype=mean.dtype, device=mean.device).expand(mean.shape[-1])
        var = covariance.diagonal(dim1=-2, dim2=-1)
        u_mean = a * torch.exp(-var / 2) * torch.sin(mean)
        vsum = var.unsqueeze(-1) + var.unsqueeze(-2)
        e_sin_sin = 0.5 * (torch.exp(-(vsum - 2 * covariance) / 2) * torch.cos(mean.unsqueeze(-1) - mean.unsqueeze(-2))
                           - torch.exp(-(vsum + 2 * covariance) / 2) * torch.cos(mean.unsqueeze(-1) + mean.unsqueeze(-2)))
        sin_mean = torch.exp(-var / 2) * torch.sin(mean)
        u_cov = (a.unsqueeze(-1) * a) * (e_sin_sin - sin_mean.unsqueeze(-1) * sin_mean.unsqueeze(-2))
        gain = a * torch.exp(-var / 2) * torch.cos(mean)
        return u_mean, u_cov, gain
