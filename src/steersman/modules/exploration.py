"""Exploration modules: placed after a policy, they change the action it wrote.

- :class:`EGreedyModule`: with probability ``eps``, a uniform random action instead.
- :class:`AdditiveGaussianModule`: Gaussian noise of scale ``sigma`` added.
- :class:`OrnsteinUhlenbeckProcessModule`: time-correlated noise (DDPG); its state lives
  in the TensorDict and restarts where ``is_init`` is True.

They act only when exploring: under ``set_exploration_type(ExplorationType.RANDOM)`` or
outside any such block. Under ``DETERMINISTIC``, ``MODE``, ``MEAN`` or ``MEDIAN`` they
return the TensorDict unchanged, so the same policy evaluates greedily.

The exploration factor (``eps``/``sigma``) is a buffer (saved in the ``state_dict``) that
:meth:`step` anneals linearly from its initial to its final value over
``annealing_num_steps`` frames: call ``module.step(frames)`` in the training loop.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch import Tensor

from ..data import Categorical, Composite, OneHot, TensorSpec
from ..tensordict.nn import InteractionType, TensorDictModuleBase, interaction_type
from .actors import as_composite

__all__ = ["EGreedyModule", "AdditiveGaussianModule", "OrnsteinUhlenbeckProcessModule"]


def _exploring() -> bool:
    mode = interaction_type()
    return mode is None or mode is InteractionType.RANDOM


def _leaf(spec: Composite | None, key: Any, owner: str) -> TensorSpec | None:
    if spec is None:
        return None
    leaf = spec.get(key, None)
    if leaf is None or isinstance(leaf, Composite):
        raise KeyError(f"{owner}: the spec has no action entry {key!r}; its keys are {list(spec.keys(True, True))}")
    return leaf


def _get(tensordict: Any, key: Any, owner: str) -> Tensor:
    value = tensordict.get(key, None)
    if value is None:
        raise KeyError(
            f"{owner} is missing the action {key!r}; place it after the policy. The TensorDict "
            f"holds {list(tensordict.keys(True, True))}"
        )
    return value


def _batch_of(tensordict: Any, key: Any) -> torch.Size:
    """Batch size of the TensorDict holding ``key`` (the root, or a nested one)."""
    if isinstance(key, tuple) and len(key) > 1:
        return tensordict.get(key[:-1]).batch_size
    return tensordict.batch_size


def _expand_right(x: Tensor, like: Tensor) -> Tensor:
    return x.reshape(tuple(x.shape) + (1,) * (like.ndim - x.ndim)).expand_as(like)  # x may be 0-d


class _Annealed(TensorDictModuleBase):
    """A module whose exploration factor ``name`` decays linearly with :meth:`step`."""

    _factor: str

    def _init_factor(self, init: float, end: float, annealing_num_steps: int, device: Any) -> None:
        if end > init:
            raise ValueError(
                f"{type(self).__name__}: the {self._factor} should decrease or stay constant; got "
                f"init={init} and end={end}"
            )
        if annealing_num_steps <= 0:
            raise ValueError(f"{type(self).__name__}: annealing_num_steps must be > 0, got {annealing_num_steps}")
        name = self._factor
        self.register_buffer(f"{name}_init", torch.tensor(float(init), device=device))
        self.register_buffer(f"{name}_end", torch.tensor(float(end), device=device))
        self.register_buffer(name, torch.tensor(float(init), device=device))
        self.annealing_num_steps = int(annealing_num_steps)

    def step(self, frames: int = 1) -> None:
        """Moves the factor ``frames`` steps of the linear schedule towards its final value.

        After ``annealing_num_steps`` frames in all, the factor stays at its final value.
        """
        name = self._factor
        init, end, cur = getattr(self, f"{name}_init"), getattr(self, f"{name}_end"), getattr(self, name)
        with torch.no_grad():
            cur.copy_(torch.maximum(end, cur - frames * (init - end) / self.annealing_num_steps))


class EGreedyModule(_Annealed):
    """Epsilon-greedy exploration: a uniform random action with probability ``eps``.

    Args:
        spec: the action spec (or a ``Composite`` holding it at ``action_key``); random
            actions are drawn from it.
        eps_init: initial ``eps`` (default 1.0).
        eps_end: final ``eps`` (default 0.1).
        annealing_num_steps: frames over which ``eps`` decays (default 1000).

    Keyword Args:
        action_key: the action to change (default ``"action"``).
        action_mask_key: a bool mask ``[*batch, n]`` of allowed actions: random actions are
            drawn among them (``Categorical`` and ``OneHot`` specs).
        device: where the buffers live.

    One coin is tossed per element of the TensorDict's batch.

    Example:
        >>> import torch
        >>> from steersman.data import Categorical
        >>> from steersman.tensordict import TensorDict
        >>> explore = EGreedyModule(Categorical(4), eps_init=1.0, eps_end=0.0, annealing_num_steps=10)
        >>> td = TensorDict(action=torch.zeros(1000, dtype=torch.long), batch_size=[1000])
        >>> bool((explore(td.clone())["action"] != 0).any())  # eps = 1: random actions
        True
        >>> explore.step(10); explore.eps
        tensor(0.)
        >>> bool((explore(td.clone())["action"] == 0).all())  # eps = 0: the policy's actions
        True
    """

    _factor = "eps"

    def __init__(
        self,
        spec: TensorSpec,
        eps_init: float = 1.0,
        eps_end: float = 0.1,
        annealing_num_steps: int = 1000,
        *,
        action_key: Any = "action",
        action_mask_key: Any = None,
        device: Any = None,
    ) -> None:
        super().__init__()
        if spec is None:
            raise ValueError("EGreedyModule needs the action spec to draw random actions from")
        self.action_key = action_key
        self.action_mask_key = action_mask_key
        self.in_keys = [action_key] + ([action_mask_key] if action_mask_key is not None else [])
        self.out_keys = [action_key]
        self._spec = as_composite(spec, action_key)
        self._action_spec = _leaf(self._spec, action_key, type(self).__name__)
        if action_mask_key is not None and not isinstance(self._action_spec, (Categorical, OneHot)):
            raise ValueError(
                f"EGreedyModule: action masks need a Categorical or OneHot spec, got "
                f"{type(self._action_spec).__name__}"
            )
        self._init_factor(eps_init, eps_end, annealing_num_steps, device)

    @property
    def spec(self) -> Composite:
        return self._spec

    def _random_action(self, action: Tensor, mask: Tensor | None) -> Tensor:
        spec = self._action_spec
        if mask is None:
            return spec.rand(action.shape[: action.ndim - spec.ndim])
        # uniform among the allowed actions: the argmax of random scores, -1 where masked
        scores = torch.where(mask, torch.rand(mask.shape, device=mask.device), -1.0)
        idx = scores.argmax(-1)
        if isinstance(spec, OneHot):
            return torch.nn.functional.one_hot(idx, mask.shape[-1]).to(spec.dtype)
        return idx.to(spec.dtype).reshape(action.shape)

    def forward(self, tensordict: Any) -> Any:
        if not _exploring():
            return tensordict
        owner = type(self).__name__
        action = _get(tensordict, self.action_key, owner)
        mask = None if self.action_mask_key is None else _get(tensordict, self.action_mask_key, owner)
        random = self._random_action(action, mask).to(action.device)
        coin = torch.rand(_batch_of(tensordict, self.action_key), device=action.device) < self.eps
        tensordict.set(self.action_key, torch.where(_expand_right(coin, action), random, action))
        return tensordict


class AdditiveGaussianModule(_Annealed):
    """Adds ``sigma * Normal(mean, std)`` noise to the action and projects it into the spec.

    Args:
        spec: the action spec (or a ``Composite`` holding it); the noisy action is
            projected into it (``spec.project``: clipped to a ``Bounded`` spec's box).
            ``None``: no projection.
        sigma_init: initial ``sigma`` (default 1.0).
        sigma_end: final ``sigma`` (default 0.1).
        annealing_num_steps: frames over which ``sigma`` decays (default 1000).
        mean, std: the noise's mean and standard deviation before scaling by ``sigma``.

    Keyword Args:
        action_key: the action to change (default ``"action"``).
        safe: kept for TorchRL signatures (the action is always projected into ``spec``).
        device: where the buffers live.

    Example:
        >>> import torch
        >>> from steersman.data import Bounded
        >>> from steersman.tensordict import TensorDict
        >>> noise = AdditiveGaussianModule(Bounded(-1.0, 1.0, (2,)), sigma_init=5.0, sigma_end=0.1)
        >>> td = noise(TensorDict(action=torch.zeros(100, 2), batch_size=[100]))
        >>> bool(td["action"].abs().max() <= 1), bool(td["action"].std() > 0.5)
        (True, True)
    """

    _factor = "sigma"

    def __init__(
        self,
        spec: TensorSpec | None = None,
        sigma_init: float = 1.0,
        sigma_end: float = 0.1,
        annealing_num_steps: int = 1000,
        mean: float = 0.0,
        std: float = 1.0,
        *,
        action_key: Any = "action",
        safe: bool = False,
        device: Any = None,
    ) -> None:
        super().__init__()
        self.action_key = action_key
        self.in_keys = [action_key]
        self.out_keys = [action_key]
        self._spec = as_composite(spec, action_key)
        self._action_spec = _leaf(self._spec, action_key, type(self).__name__)
        self.safe = safe
        self._init_factor(sigma_init, sigma_end, annealing_num_steps, device)
        self.register_buffer("mean", torch.tensor(float(mean), device=device))
        self.register_buffer("std", torch.tensor(float(std), device=device))

    @property
    def spec(self) -> Composite | None:
        return self._spec

    def forward(self, tensordict: Any) -> Any:
        if not _exploring():
            return tensordict
        action = _get(tensordict, self.action_key, type(self).__name__)
        noise = torch.randn_like(action) * self.std + self.mean
        action = action + self.sigma * noise
        if self._action_spec is not None:
            action = self._action_spec.project(action)
        tensordict.set(self.action_key, action)
        return tensordict


class OrnsteinUhlenbeckProcessModule(_Annealed):
    r"""Ornstein-Uhlenbeck exploration noise (Lillicrap et al. 2016, DDPG).

    The noise follows
    ``x_t = x_{t-1} + theta * (mu - x_{t-1}) * dt + sigma_t * sqrt(dt) * N(0, 1)``, with
    ``sigma_t = max(sigma_min, sigma - (sigma - sigma_min) * n / n_steps_annealing)`` after
    ``n`` steps of the trajectory; the action becomes ``action + eps * x_t``. The noise
    and the step count are stored in the TensorDict under ``"_ou_prev_noise"`` and
    ``"_ou_steps"``; where ``is_init`` is True they restart from zero.

    Args:
        spec: the action spec (or a ``Composite`` holding it).
        eps_init, eps_end, annealing_num_steps: the schedule of ``eps`` (see :meth:`step`).
        theta, mu, sigma, dt: the process's parameters.
        x0: initial value of the process (default 0).
        sigma_min: the final ``sigma`` of the per-trajectory schedule (default: ``sigma``,
            constant).
        n_steps_annealing: trajectory steps over which ``sigma`` decays.

    Keyword Args:
        action_key: the action to change (default ``"action"``).
        is_init_key: where trajectory starts are flagged (default ``"is_init"``).
        safe: project the noisy action into ``spec`` (default ``True``).
        device: where the buffers live.

    Example:
        >>> import torch
        >>> from steersman.data import Bounded
        >>> from steersman.tensordict import TensorDict
        >>> ou = OrnsteinUhlenbeckProcessModule(Bounded(-1.0, 1.0, (2,)))
        >>> td = TensorDict(action=torch.zeros(3, 2), is_init=torch.ones(3, 1, dtype=torch.bool),
        ...                 batch_size=[3])
        >>> td = ou(td)
        >>> td["_ou_prev_noise"].shape, td["_ou_steps"]
        (torch.Size([3, 2]), tensor([1, 1, 1]))
    """

    _factor = "eps"
    noise_key = "_ou_prev_noise"
    steps_key = "_ou_steps"

    def __init__(
        self,
        spec: TensorSpec,
        eps_init: float = 1.0,
        eps_end: float = 0.1,
        annealing_num_steps: int = 1000,
        theta: float = 0.15,
        mu: float = 0.0,
        sigma: float = 0.2,
        dt: float = 1e-2,
        x0: float | Tensor | None = None,
        sigma_min: float | None = None,
        n_steps_annealing: int = 1000,
        *,
        action_key: Any = "action",
        is_init_key: Any = "is_init",
        safe: bool = True,
        device: Any = None,
    ) -> None:
        super().__init__()
        if spec is None:
            raise ValueError("OrnsteinUhlenbeckProcessModule needs the action spec")
        self.action_key = action_key
        self.is_init_key = is_init_key
        self.in_keys = [action_key]
        self.out_keys = [action_key, self.noise_key, self.steps_key]
        self._spec = as_composite(spec, action_key)
        self._action_spec = _leaf(self._spec, action_key, type(self).__name__)
        self.safe = safe
        self._init_factor(eps_init, eps_end, annealing_num_steps, device)
        self.theta, self.mu, self.dt = float(theta), float(mu), float(dt)
        self.sigma = float(sigma)
        self.sigma_min = float(sigma if sigma_min is None else sigma_min)
        self._sigma_slope = -(self.sigma - self.sigma_min) / float(n_steps_annealing)
        self.register_buffer("x0", torch.as_tensor(0.0 if x0 is None else x0, device=device))
        self._warned = False

    @property
    def spec(self) -> Composite:
        return self._spec

    def _is_init(self, tensordict: Any, batch: torch.Size) -> Tensor | None:
        is_init = tensordict.get(self.is_init_key, None)
        if is_init is None:
            if not self._warned:
                warnings.warn(
                    f"{type(self).__name__}: no {self.is_init_key!r} entry, so the noise never "
                    "restarts between trajectories; add the InitTracker transform to the env"
                )
                self._warned = True
            return None
        n = len(batch)
        if is_init.shape[:n] != batch:
            raise ValueError(
                f"{type(self).__name__}: {self.is_init_key!r} of shape {list(is_init.shape)} does "
                f"not start with the action's batch {list(batch)}"
            )
        return is_init.reshape(*batch, -1).any(-1) if is_init.ndim > n else is_init

    def forward(self, tensordict: Any) -> Any:
        if not _exploring():
            return tensordict
        action = _get(tensordict, self.action_key, type(self).__name__)
        batch = _batch_of(tensordict, self.action_key)
        noise = tensordict.get(self.noise_key, None)
        steps = tensordict.get(self.steps_key, None)
        if noise is None or steps is None:
            noise = torch.zeros_like(action)
            steps = torch.zeros(batch, dtype=torch.long, device=action.device)
        is_init = self._is_init(tensordict, batch)
        if is_init is not None:
            noise = torch.where(_expand_right(is_init, noise), 0.0, noise)
            steps = torch.where(is_init, 0, steps)
        prev = noise + self.x0
        sigma = (self._sigma_slope * steps + self.sigma).clamp_min(self.sigma_min)
        new = (
            prev
            + self.theta * (self.mu - prev) * self.dt
            + _expand_right(sigma, prev) * math.sqrt(self.dt) * torch.randn_like(prev)
        )
        action = action + self.eps * new
        if self.safe:
            action = self._action_spec.project(action)
        tensordict.set(self.noise_key, new - self.x0)
        tensordict.set(self.steps_key, steps + 1)
        tensordict.set(self.action_key, action)
        return tensordict
