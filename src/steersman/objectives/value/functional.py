"""Return and advantage estimates as pure functions of tensors.

Every input is shaped ``[*B, T, F]``: any leading batch dims, a time dim (``time_dim``,
``-2`` by default) and a trailing feature dim (usually 1, as ``reward`` and ``done`` have).
Several trajectories may follow each other along time:

* ``done`` ends a trajectory: the recursion does not cross it;
* ``terminated`` removes the bootstrap: ``next_state_value`` is ignored where it is set;
  a step that is done but not terminated (truncated) bootstraps from ``next_state_value``;
* the last step of the time dim bootstraps from its ``next_state_value`` (the trajectory
  goes on past the batch).

With ``γ`` the discount and ``λ`` the mixing weight, ``Vₜ = state_value``,
``V'ₜ = next_state_value * (1 - terminatedₜ)``:

* TD(0): ``Gₜ = rₜ + γ V'ₜ``
* TD(1): ``Gₜ = rₜ + γ (V'ₜ if doneₜ else Gₜ₊₁)``
* TD(λ): ``Gₜ = rₜ + γ ((1 - λ) V'ₜ + λ (V'ₜ if doneₜ else Gₜ₊₁))``
* GAE: ``δₜ = rₜ + γ V'ₜ - Vₜ``, ``Aₜ = δₜ + γ λ (1 - doneₜ) Aₜ₊₁``, value target ``Aₜ + Vₜ``.

Each is a linear recurrence ``yₜ = xₜ + cₜ yₜ₊₁``. The ``vec_*`` functions (the default
path of the estimators) solve it with a log-depth reverse scan (``⌈log₂ T⌉`` steps of
whole-tensor ops, no Python loop over time, only products of the ``cₜ`` so no division
and no overflow); the others loop over time, step by step.

Example:
    >>> import torch
    >>> reward = torch.ones(2, 5, 1)                      # [B=2, T=5, F=1]
    >>> done = torch.zeros(2, 5, 1, dtype=torch.bool)
    >>> done[:, 2] = True                                 # each row: 2 trajectories
    >>> value, next_value = torch.zeros(2, 5, 1), torch.zeros(2, 5, 1)
    >>> adv, target = vec_generalized_advantage_estimate(
    ...     0.5, 1.0, value, next_value, reward, done, terminated=done)
    >>> adv[0, :, 0]
    tensor([1.7500, 1.5000, 1.0000, 1.5000, 1.0000])
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "td0_return_estimate",
    "td0_advantage_estimate",
    "td1_return_estimate",
    "vec_td1_return_estimate",
    "td1_advantage_estimate",
    "vec_td1_advantage_estimate",
    "td_lambda_return_estimate",
    "vec_td_lambda_return_estimate",
    "td_lambda_advantage_estimate",
    "vec_td_lambda_advantage_estimate",
    "generalized_advantage_estimate",
    "vec_generalized_advantage_estimate",
    "reverse_discounted_scan",
]

Scalar = float | Tensor


# ----------------------------------------------------------------------------- helpers
def _check_shapes(fn: str, **tensors: Tensor | None) -> None:
    shape = None
    for name, t in tensors.items():
        if t is None:
            continue
        if shape is None:
            first, shape = name, t.shape
        elif t.shape != shape:
            raise ValueError(
                f"{fn}: {name} has shape {list(t.shape)} but {first} has {list(shape)}; all "
                "inputs are [*B, T, F] with the same shape (reward/done keep their trailing "
                "singleton dim)"
            )


def _float(mask: Tensor, like: Tensor) -> Tensor:
    return mask.to(like.dtype)


def reverse_discounted_scan(x: Tensor, coef: Tensor, time_dim: int = -2) -> Tensor:
    """Solves ``yₜ = xₜ + coefₜ · yₜ₊₁`` backwards along ``time_dim`` (``y`` past the end is 0).

    A log-depth (Hillis-Steele) scan: after step ``k``, ``yₜ`` holds the sum over the next
    ``2ᵏ`` steps and ``coefₜ`` the product of their coefficients; ``⌈log₂ T⌉`` steps of
    whole-tensor ops. Only products of ``coef`` are formed (no division, no cumulative
    product to divide by), so long horizons with ``coef`` near 1 or 0 stay exact to
    rounding. Differentiable w.r.t. ``x`` (and ``coef``). ``coef`` broadcasts to ``x``.

    Example:
        >>> x = torch.ones(4)
        >>> reverse_discounted_scan(x, torch.full((4,), 0.5), time_dim=0)
        tensor([1.8750, 1.7500, 1.5000, 1.0000])
    """
    coef = coef.expand_as(x)
    dim = time_dim % x.ndim
    T = x.shape[dim]
    shift = 1
    while shift < T:
        pad_shape = list(x.shape)
        pad_shape[dim] = shift
        zeros = x.new_zeros(pad_shape)
        x_next = torch.cat([x.narrow(dim, shift, T - shift), zeros], dim)
        x = x + coef * x_next
        if 2 * shift < T:
            coef_next = torch.cat([coef.narrow(dim, shift, T - shift), zeros.to(coef.dtype)], dim)
            coef = coef * coef_next
        shift *= 2
    return x


def _last_step_done(done: Tensor, time_dim: int) -> Tensor:
    """``done`` with the last time step set: the recursion bootstraps there."""
    dim = time_dim % done.ndim
    T = done.shape[dim]
    last = torch.ones_like(done.narrow(dim, T - 1, 1))
    return torch.cat([done.narrow(dim, 0, T - 1), last], dim)


def _loop(x: Tensor, coef: Tensor, time_dim: int) -> Tensor:
    """The same recurrence as :func:`reverse_discounted_scan`, one step at a time."""
    coef = coef.expand_as(x)
    dim = time_dim % x.ndim
    T = x.shape[dim]
    out = []
    y = torch.zeros_like(x.select(dim, 0))
    for t in reversed(range(T)):
        y = x.select(dim, t) + coef.select(dim, t) * y
        out.append(y)
    return torch.stack(out[::-1], dim)


# ------------------------------------------------------------------------------ TD(0)
def td0_return_estimate(
    gamma: Scalar,
    next_state_value: Tensor,
    reward: Tensor,
    terminated: Tensor | None = None,
    *,
    done: Tensor | None = None,
) -> Tensor:
    """One-step return ``r + γ (1 - terminated) V(s')``. No time dim needed.

    ``done`` is accepted for TorchRL compatibility and unused (``terminated`` defaults to it).

    Example:
        >>> td0_return_estimate(0.9, torch.ones(3, 1), torch.ones(3, 1),
        ...                     torch.tensor([[False], [True], [False]]))[:, 0]
        tensor([1.9000, 1.0000, 1.9000])
    """
    if terminated is None:
        terminated = done if done is not None else torch.zeros_like(reward, dtype=torch.bool)
    _check_shapes("td0_return_estimate", next_state_value=next_state_value, reward=reward, terminated=terminated)
    return reward + gamma * (1 - _float(terminated, reward)) * next_state_value


def td0_advantage_estimate(
    gamma: Scalar,
    state_value: Tensor,
    next_state_value: Tensor,
    reward: Tensor,
    terminated: Tensor | None = None,
    *,
    done: Tensor | None = None,
) -> Tensor:
    """TD(0) advantage: :func:`td0_return_estimate` minus ``state_value``."""
    _check_shapes("td0_advantage_estimate", state_value=state_value, reward=reward)
    return td0_return_estimate(gamma, next_state_value, reward, terminated, done=done) - state_value


# ---------------------------------------------------------------------------- TD(λ)
def _td_lambda_terms(
    fn: str,
    gamma: Scalar,
    lmbda: Scalar,
    next_state_value: Tensor,
    reward: Tensor,
    done: Tensor,
    terminated: Tensor | None,
    time_dim: int,
) -> tuple[Tensor, Tensor]:
    """``(x, c)`` of the TD(λ) recurrence ``Gₜ = xₜ + cₜ Gₜ₊₁``."""
    if terminated is None:
        terminated = done
    _check_shapes(fn, next_state_value=next_state_value, reward=reward, done=done, terminated=terminated)
    nv = next_state_value * (1 - _float(terminated, reward))
    stop = _float(_last_step_done(done, time_dim), reward)
    x = reward + gamma * nv * ((1 - lmbda) + lmbda * stop)
    c = gamma * lmbda * (1 - stop)
    return x, c


def td_lambda_return_estimate(
    gamma: Scalar,
    lmbda: Scalar,
    next_state_value: Tensor,
    reward: Tensor,
    done: Tensor,
    terminated: Tensor | None = None,
    *,
    time_dim: int = -2,
) -> Tensor:
    """TD(λ) return, looping over time (reference path). Shapes ``[*B, T, F]``.

    See the module docstring for the recursion; ``terminated`` defaults to ``done``.
    """
    x, c = _td_lambda_terms("td_lambda_return_estimate", gamma, lmbda, next_state_value, reward, done, terminated, time_dim)
    return _loop(x, c, time_dim)


def vec_td_lambda_return_estimate(
    gamma: Scalar,
    lmbda: Scalar,
    next_state_value: Tensor,
    reward: Tensor,
    done: Tensor,
    terminated: Tensor | None = None,
    *,
    time_dim: int = -2,
) -> Tensor:
    """TD(λ) return, vectorized over time (log-depth scan). Shapes ``[*B, T, F]``.

    Example:
        >>> r = torch.ones(1, 3, 1); nv = torch.zeros(1, 3, 1)
        >>> done = torch.zeros(1, 3, 1, dtype=torch.bool)
        >>> vec_td_lambda_return_estimate(0.5, 1.0, nv, r, done)[0, :, 0]
        tensor([1.7500, 1.5000, 1.0000])
    """
    x, c = _td_lambda_terms("vec_td_lambda_return_estimate", gamma, lmbda, next_state_value, reward, done, terminated, time_dim)
    return reverse_discounted_scan(x, c, time_dim)


def td_lambda_advantage_estimate(
    gamma: Scalar,
    lmbda: Scalar,
    state_value: Tensor,
    next_state_value: Tensor,
    reward: Tensor,
    done: Tensor,
    terminated: Tensor | None = None,
    *,
    time_dim: int = -2,
) -> Tensor:
    """TD(λ) advantage: the return minus ``state_value`` (loop path)."""
    _check_shapes("td_lambda_advantage_estimate", state_value=state_value, reward=reward)
    return td_lambda_return_estimate(gamma, lmbda, next_state_value, reward, done, terminated, time_dim=time_dim) - state_value


def vec_td_lambda_advantage_estimate(
    gamma: Scalar,
    lmbda: Scalar,
    state_value: Tensor,
    next_state_value: Tensor,
    reward: Tensor,
    done: Tensor,
    terminated: Tensor | None = None,
    *,
    time_dim: int = -2,
) -> Tensor:
    """TD(λ) advantage: the return minus ``state_value`` (vectorized path)."""
    _check_shapes("vec_td_lambda_advantage_estimate", state_value=state_value, reward=reward)
    return vec_td_lambda_return_estimate(gamma, lmbda, next_state_value, reward, done, terminated, time_dim=time_dim) - state_value


# ---------------------------------------------------------------------------- TD(1)
def td1_return_estimate(
    gamma: Scalar,
    next_state_value: Tensor,
    reward: Tensor,
    done: Tensor,
    terminated: Tensor | None = None,
    *,
    time_dim: int = -2,
) -> Tensor:
    """Monte-Carlo return bootstrapped at truncations and at the end of time (loop path).

    TD(λ) with ``λ = 1``. Shapes ``[*B, T, F]``; ``terminated`` defaults to ``done``.
    """
    return td_lambda_return_estimate(gamma, 1.0, next_state_value, reward, done, terminated, time_dim=time_dim)


def vec_td1_return_estimate(
    gamma: Scalar,
    next_state_value: Tensor,
    reward: Tensor,
    done: Tensor,
    terminated: Tensor | None = None,
    *,
    time_dim: int = -2,
) -> Tensor:
    """Vectorized :func:`td1_return_estimate`.

    Example:
        >>> r = torch.ones(1, 3, 1); nv = torch.full((1, 3, 1), 10.0)
        >>> done = torch.zeros(1, 3, 1, dtype=torch.bool)
        >>> vec_td1_return_estimate(0.5, nv, r, done)[0, :, 0]   # bootstraps on the last step
        tensor([3., 4., 6.])
    """
    return vec_td_lambda_return_estimate(gamma, 1.0, next_state_value, reward, done, terminated, time_dim=time_dim)


def td1_advantage_estimate(
    gamma: Scalar,
    state_value: Tensor,
    next_state_value: Tensor,
    reward: Tensor,
    done: Tensor,
    terminated: Tensor | None = None,
    *,
    time_dim: int = -2,
) -> Tensor:
    """TD(1) advantage (loop path)."""
    return td_lambda_advantage_estimate(gamma, 1.0, state_value, next_state_value, reward, done, terminated, time_dim=time_dim)


def vec_td1_advantage_estimate(
    gamma: Scalar,
    state_value: Tensor,
    next_state_value: Tensor,
    reward: Tensor,
    done: Tensor,
    terminated: Tensor | None = None,
    *,
    time_dim: int = -2,
) -> Tensor:
    """TD(1) advantage (vectorized path)."""
    return vec_td_lambda_advantage_estimate(gamma, 1.0, state_value, next_state_value, reward, done, terminated, time_dim=time_dim)


# ------------------------------------------------------------------------------ GAE
def _gae_terms(
    fn: str,
    gamma: Scalar,
    lmbda: Scalar,
    state_value: Tensor,
    next_state_value: Tensor,
    reward: Tensor,
    done: Tensor,
    terminated: Tensor | None,
) -> tuple[Tensor, Tensor]:
    if terminated is None:
        terminated = done
    _check_shapes(
        fn, state_value=state_value, next_state_value=next_state_value, reward=reward, done=done, terminated=terminated
    )
    delta = reward + gamma * (1 - _float(terminated, reward)) * next_state_value - state_value
    c = gamma * lmbda * (1 - _float(done, reward))
    return delta, c


def generalized_advantage_estimate(
    gamma: Scalar,
    lmbda: Scalar,
    state_value: Tensor,
    next_state_value: Tensor,
    reward: Tensor,
    done: Tensor,
    terminated: Tensor | None = None,
    *,
    time_dim: int = -2,
) -> tuple[Tensor, Tensor]:
    """GAE, looping over time (reference path). Returns ``(advantage, value_target)``.

    Shapes ``[*B, T, F]``; ``terminated`` defaults to ``done``; ``value_target =
    advantage + state_value``.
    """
    delta, c = _gae_terms("generalized_advantage_estimate", gamma, lmbda, state_value, next_state_value, reward, done, terminated)
    advantage = _loop(delta, c, time_dim)
    return advantage, advantage + state_value


def vec_generalized_advantage_estimate(
    gamma: Scalar,
    lmbda: Scalar,
    state_value: Tensor,
    next_state_value: Tensor,
    reward: Tensor,
    done: Tensor,
    terminated: Tensor | None = None,
    *,
    time_dim: int = -2,
) -> tuple[Tensor, Tensor]:
    """GAE, vectorized over time (log-depth scan). Returns ``(advantage, value_target)``.

    Shapes ``[*B, T, F]``; compiles with ``torch.compile(fullgraph=True)``. See the module
    docstring for an example.
    """
    delta, c = _gae_terms("vec_generalized_advantage_estimate", gamma, lmbda, state_value, next_state_value, reward, done, terminated)
    advantage = reverse_discounted_scan(delta, c, time_dim)
    return advantage, advantage + state_value


# ------------------------------------------------------------------------------ V-trace
def vtrace_advantage_estimate(
    gamma: Scalar,
    rho: Tensor,
    c: Tensor,
    state_value: Tensor,
    next_state_value: Tensor,
    reward: Tensor,
    done: Tensor,
    terminated: Tensor | None = None,
    *,
    time_dim: int = -2,
) -> tuple[Tensor, Tensor]:
    """V-trace (Espeholt et al., 2018) with clipped importance weights ``rho``, ``c``.
    Returns ``(advantage, value_target)``, shapes ``[*B, T, F]``.

    ``vₜ - V(sₜ) = ρₜ δₜ + γ (1 - doneₜ) cₜ (vₜ₊₁ - V(sₜ₊₁))`` with
    ``δₜ = rₜ + γ (1 - terminatedₜ) V(sₜ₊₁) - V(sₜ)`` (a log-depth scan), and the
    policy-gradient advantage ``ρₜ (rₜ + γ (1 - terminatedₜ) v̂ₜ₊₁ - V(sₜ))`` where
    ``v̂ₜ₊₁ = vₜ₊₁`` inside an episode and ``V(sₜ₊₁)`` after ``done`` or the last step.
    """
    if terminated is None:
        terminated = done
    _check_shapes(
        "vtrace_advantage_estimate", rho=rho, c=c, state_value=state_value, next_state_value=next_state_value,
        reward=reward, done=done, terminated=terminated,
    )
    alive = gamma * (1 - _float(terminated, reward))
    delta = rho * (reward + alive * next_state_value - state_value)
    target = state_value + reverse_discounted_scan(delta, gamma * (1 - _float(done, reward)) * c, time_dim)
    dim = time_dim % target.ndim
    T = target.shape[dim]
    shifted = torch.cat([target.narrow(dim, 1, T - 1), next_state_value.narrow(dim, T - 1, 1)], dim)
    next_target = torch.where(_last_step_done(done, time_dim), next_state_value, shifted)
    advantage = rho * (reward + alive * next_target - state_value)
    return advantage, target
