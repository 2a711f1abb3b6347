"""Model-predictive control planners: CEM and MPPI over a batched native env.

A planner is a policy: ``planner(td)`` writes the first action of the best plan found
from the current state under ``action_key``. It copies the model env's state into
``num_candidates`` batched states (a trailing batch dim ``[*batch, C]``), rolls every
candidate plan ``[*batch, C, H, *action_shape]`` through the env's pure step function in
one batched call per time step (no Python loop over candidates), and refits a Gaussian
over plans (TorchRL's ``CEMPlanner``/``MPPIPlanner`` semantics).

The model env is a :class:`~steersman.envs.NativeEnv`: its step is a pure function of a
state tensor, so its state can be copied into any batch of candidates. The state to plan
from is read from the input TensorDict when it carries every entry of
``env.state_names``, otherwise from ``env.get_state()`` (planning with the env you act
in, i.e. with the true dynamics).

``warm_start=True`` (not in TorchRL) keeps the last plan's mean, shifted by one step
(the last step repeated), as the next call's initial mean; call :meth:`reset` at the
start of a new episode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from steersman.data import Bounded, Categorical
from steersman.envs import NativeEnv
from steersman.tensordict import TensorDict, TensorDictBase
from steersman.tensordict._utils import NestedKey

__all__ = ["MPCPlannerBase", "CEMPlanner", "MPPIPlanner"]


class MPCPlannerBase(nn.Module):
    """Base of the MPC planners: checks, candidate rollouts, action bounds, warm start.

    Subclasses implement :meth:`planning` (``td -> action [*batch, *action_shape]``).

    Args:
        env: the model, a :class:`~steersman.envs.NativeEnv` with a continuous action spec.
        action_key: where ``forward`` writes the action (default ``"action"``).
        planning_horizon, optim_steps, num_candidates, top_k: see :class:`CEMPlanner`.
        reward_key: the key of the rewards in the candidate rollouts.
        warm_start: reuse the previous plan shifted by one step as the initial mean.
        init_std: the initial standard deviation of the plans (default 1, TorchRL's).

    Raises ``TypeError`` for an env whose state cannot be copied into candidates or a
    discrete action spec, ``ValueError`` for ``planning_horizon``/``optim_steps``/
    ``num_candidates``/``top_k`` < 1 or ``top_k > num_candidates``; before any planning.
    """

    def __init__(self, env: Any, action_key: NestedKey = "action", *, planning_horizon: int = 1,
                 optim_steps: int = 1, num_candidates: int = 1, top_k: int = 1,
                 reward_key: NestedKey = ("next", "reward"), warm_start: bool = False,
                 init_std: float = 1.0) -> None:
        super().__init__()
        name = type(self).__name__
        if not isinstance(env, NativeEnv):
            raise TypeError(
                f"{name}: env must be a NativeEnv (a batched torch env whose state can be copied "
                f"into num_candidates states and stepped as a pure function); got {type(env).__name__}"
            )
        for field, val in (("planning_horizon", planning_horizon), ("optim_steps", optim_steps),
                           ("num_candidates", num_candidates), ("top_k", top_k)):
            if not isinstance(val, int) or isinstance(val, bool) or val < 1:
                raise ValueError(f"{name}: {field} must be an int >= 1, got {val!r}")
        if top_k > num_candidates:
            raise ValueError(f"{name}: top_k ({top_k}) must be <= num_candidates ({num_candidates})")
        if not init_std > 0:
            raise ValueError(f"{name}: init_std must be > 0, got {init_std!r}")
        spec = env.action_spec
        if isinstance(spec, Categorical) or spec.dtype is None or not spec.dtype.is_floating_point:
            raise TypeError(f"{name}: the env's action spec must be continuous (floating), got {spec!r}")
        self.env = env
        self.action_key = action_key
        self.reward_key = reward_key
        self.planning_horizon = planning_horizon
        self.optim_steps = optim_steps
        self.num_candidates = num_candidates
        self.top_k = top_k
        self.warm_start = bool(warm_start)
        self.init_std = float(init_std)
        nb = len(env.batch_size)
        self._batch = env.batch_size
        self._action_shape = spec.shape[nb:]
        if isinstance(spec, Bounded):
            self._low: Tensor | None = spec.low.reshape(-1, *self._action_shape)[0]
            self._high: Tensor | None = spec.high.reshape(-1, *self._action_shape)[0]
        else:
            self._low = self._high = None
        # 0-dim tensors: cheaper than Python floats in eager ops
        consts = env._make_consts()
        self._consts = type(consts)(*(torch.tensor(v, dtype=env.dtype, device=env.device) if type(v) is float
                                      else v for v in consts))
        self._prev_mean: Tensor | None = None
        self.in_keys = list(env.state_names)
        self.out_keys = [action_key]

    def reset(self) -> None:
        """Forgets the warm-start plan (call at the start of an episode)."""
        self._prev_mean = None

    # ------------------------------------------------------------------ helpers
    def _root_state(self, td: TensorDictBase) -> Tensor:
        """The state to plan from, ``[S, *batch]``."""
        env = self.env
        names = env.state_names
        if all(n in td.keys() for n in names):
            comps = [td.get(n) for n in names]
        else:
            st = env.get_state()
            comps = [st.get(n) for n in names]
        state = torch.stack([c.to(env.dtype) if c.is_floating_point() else c for c in comps])
        if state.shape[1:] != self._batch:
            raise ValueError(
                f"{type(self).__name__}: the state has batch shape {list(state.shape[1:])}, expected the "
                f"env's batch_size {list(self._batch)}"
            )
        return state

    def _clamp(self, actions: Tensor) -> Tensor:
        if self._low is None:
            return actions
        return torch.maximum(torch.minimum(actions, self._high), self._low)

    def _initial(self, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
        """Initial ``(mean, std)``, ``[*batch, 1, H, *action_shape]``."""
        shape = (*self._batch, 1, self.planning_horizon, *self._action_shape)
        std = torch.full(shape, self.init_std, dtype=dtype, device=device)
        prev = self._prev_mean
        if self.warm_start and prev is not None and prev.shape == torch.Size(shape):
            nb = len(self._batch) + 1
            mean = torch.cat([prev.narrow(nb, 1, self.planning_horizon - 1), prev.narrow(nb, -1, 1)], nb)
            return mean, std
        return torch.zeros(shape, dtype=dtype, device=device), std

    def _sample(self, mean: Tensor, std: Tensor) -> Tensor:
        """``num_candidates`` clamped plans ``[*batch, C, H, *action_shape]``."""
        shape = (*self._batch, self.num_candidates, *mean.shape[len(self._batch) + 1:])
        noise = torch.randn(shape, dtype=mean.dtype, device=mean.device)
        return self._clamp(mean + std * noise)

    def rollout(self, state: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        """Steps every candidate: ``state [S, *batch]``, ``actions [*batch, C, H, *A]``.

        Returns ``(rewards, terminated)``, each ``[*batch, C, H, 1]``; rewards after a
        candidate's termination are zero (it stays where it ended).
        """
        env = type(self.env)
        c = self._consts
        cand = state.unsqueeze(-1).expand(*state.shape, self.num_candidates)
        comps = tuple(cand.unbind(0))
        t_dim = len(self._batch) + 1
        alive: Tensor | None = None  # None while no candidate has terminated
        rewards, terms = [], []
        for t in range(self.planning_horizon):
            ns, reward, terminated = env._dynamics(comps, actions.select(t_dim, t), c)
            if alive is None:
                rewards.append(reward)
                comps = tuple(n.to(s.dtype) for n, s in zip(ns, comps))
                if bool(terminated.any()):
                    alive = ~terminated
                terms.append(terminated)
                continue
            rewards.append(torch.where(alive, reward, torch.zeros_like(reward)))
            comps = tuple(torch.where(alive, n.to(s.dtype), s) for n, s in zip(ns, comps))
            alive = alive & ~terminated
            terms.append(~alive)
        return torch.stack(rewards, -1).unsqueeze(-1), torch.stack(terms, -1).unsqueeze(-1)

    # ------------------------------------------------------------------ policy
    def planning(self, td: TensorDictBase) -> Tensor:
        """The action to take, ``[*batch, *action_shape]``."""
        raise NotImplementedError

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        """Plans from the current state and writes the first action under ``action_key``."""
        action = self.planning(td)
        td.set(self.action_key, action)
        return td

    def _finish(self, mean: Tensor) -> Tensor:
        if self.warm_start:
            self._prev_mean = mean.detach()
        nb = len(self._batch)
        return self._clamp(mean.select(nb, 0).select(nb, 0))


def _gather_top(values: Tensor, idx: Tensor, k_dim: int) -> Tensor:
    """``values[*batch, C, H, *A]`` at candidate indices ``idx [*batch, k]``."""
    shape = (*idx.shape, *values.shape[k_dim + 1:])
    idx = idx.reshape(*idx.shape, *([1] * (values.ndim - k_dim - 1))).expand(shape)
    return values.gather(k_dim, idx)


class CEMPlanner(MPCPlannerBase):
    """Cross-entropy method planner (TorchRL's signature and semantics, plus warm start).

    Each of ``optim_steps`` iterations samples ``num_candidates`` plans from a Gaussian
    ``[*batch, H, *A]`` (clamped to the action bounds), sums each plan's rewards over the
    ``planning_horizon``, and refits mean/std to the ``top_k`` best. The action is the
    first step of the final mean.

    Args:
        env: the model (:class:`~steersman.envs.NativeEnv`, continuous actions).
        planning_horizon: ``H`` steps per plan.
        optim_steps: refits per call.
        num_candidates: ``C`` plans per refit, rolled out as a batch dim of the env.
        top_k: elite plans per refit (``<= num_candidates``).
        reward_key, action_key: as in TorchRL.
        warm_start: start from the previous mean shifted by one step.
        init_std: initial std of the plans.

    Example:
        >>> import torch
        >>> from steersman.envs import PendulumEnv
        >>> from steersman.planning import CEMPlanner
        >>> env = PendulumEnv(batch_size=[2], seed=0)
        >>> planner = CEMPlanner(env, planning_horizon=10, optim_steps=2, num_candidates=32, top_k=4)
        >>> td = env.reset()
        >>> planner(td)["action"].shape
        torch.Size([2, 1])
    """

    def __init__(self, env: Any, planning_horizon: int, optim_steps: int, num_candidates: int, top_k: int,
                 reward_key: NestedKey = ("next", "reward"), action_key: NestedKey = "action", *,
                 warm_start: bool = False, init_std: float = 1.0) -> None:
        super().__init__(env, action_key, planning_horizon=planning_horizon, optim_steps=optim_steps,
                         num_candidates=num_candidates, top_k=top_k, reward_key=reward_key,
                         warm_start=warm_start, init_std=init_std)

    @torch.no_grad()
    def planning(self, td: TensorDictBase) -> Tensor:
        state = self._root_state(td)
        mean, std = self._initial(self.env.dtype, state.device)
        k_dim = len(self._batch)
        for _ in range(self.optim_steps):
            actions = self._sample(mean, std)
            rewards, _ = self.rollout(state, actions)
            score = rewards.sum((-2, -1))  # [*batch, C]
            top = score.topk(self.top_k, dim=k_dim).indices
            best = _gather_top(actions, top, k_dim)
            mean = best.mean(k_dim, keepdim=True)
            std = best.std(k_dim, keepdim=True) if self.top_k > 1 else torch.zeros_like(mean)
        return self._finish(mean)


class MPPIPlanner(MPCPlannerBase):
    """Model predictive path integral planner (TorchRL's signature and semantics, plus warm start).

    Each iteration samples ``num_candidates`` plans, rolls them out into a TensorDict
    ``[*batch, C, H]`` (``action``, ``reward_key``, ``("next", "done"|"terminated"|
    "truncated")``, the state components and their ``"next"`` values), runs
    ``advantage_module`` on it (it must write ``"advantage" [*batch, C, H, 1]``, e.g. a
    TD(λ) estimator with a value network, or the return-to-go), keeps the ``top_k``
    candidates by their first-step advantage and refits mean/std with weights
    ``softmax(advantage / temperature)``.

    Args:
        env: the model (:class:`~steersman.envs.NativeEnv`, continuous actions).
        advantage_module: ``td -> td`` writing ``"advantage"``.
        temperature: of the exponential weights (> 0).
        planning_horizon, optim_steps, num_candidates, top_k, reward_key, action_key,
        warm_start, init_std: as in :class:`CEMPlanner`.

    Example:
        >>> import torch
        >>> from steersman.envs import PendulumEnv
        >>> from steersman.planning import MPPIPlanner
        >>> def return_to_go(td):
        ...     r = td["next", "reward"]
        ...     td["advantage"] = r.flip(-2).cumsum(-2).flip(-2)
        ...     return td
        >>> env = PendulumEnv(batch_size=[2], seed=0)
        >>> planner = MPPIPlanner(env, return_to_go, temperature=1.0, planning_horizon=10,
        ...                       optim_steps=2, num_candidates=32, top_k=8)
        >>> planner(env.reset())["action"].shape
        torch.Size([2, 1])
    """

    def __init__(self, env: Any, advantage_module: Callable[[TensorDictBase], Any], temperature: float,
                 planning_horizon: int, optim_steps: int, num_candidates: int, top_k: int,
                 reward_key: NestedKey = ("next", "reward"), action_key: NestedKey = "action", *,
                 warm_start: bool = False, init_std: float = 1.0) -> None:
        super().__init__(env, action_key, planning_horizon=planning_horizon, optim_steps=optim_steps,
                         num_candidates=num_candidates, top_k=top_k, reward_key=reward_key,
                         warm_start=warm_start, init_std=init_std)
        if not callable(advantage_module):
            raise TypeError(f"MPPIPlanner: advantage_module must be callable (td -> td), got "
                            f"{type(advantage_module).__name__}")
        if not (isinstance(temperature, (int, float)) and temperature > 0):
            raise ValueError(f"MPPIPlanner: temperature must be > 0, got {temperature!r}")
        self.advantage_module = advantage_module
        self.temperature = float(temperature)

    def _rollout_td(self, state: Tensor, actions: Tensor) -> TensorDictBase:
        rewards, term = self.rollout(state, actions)
        bs = actions.shape[: len(self._batch) + 2]
        td = TensorDict({self.action_key: actions}, batch_size=bs, device=actions.device)
        td.set(self.reward_key, rewards)
        td.set(("next", "terminated"), term)
        td.set(("next", "done"), term.clone())
        td.set(("next", "truncated"), torch.zeros_like(term))
        return td

    @torch.no_grad()
    def planning(self, td: TensorDictBase) -> Tensor:
        state = self._root_state(td)
        mean, std = self._initial(self.env.dtype, state.device)
        k_dim = len(self._batch)
        for _ in range(self.optim_steps):
            actions = self._sample(mean, std)
            rtd = self._rollout_td(state, actions)
            out = self.advantage_module(rtd)
            rtd = rtd if out is None else out
            adv = rtd.get("advantage", None)
            if adv is None or adv.shape[: k_dim + 2] != rtd.batch_size:
                got = None if adv is None else list(adv.shape)
                raise ValueError(f"MPPIPlanner: advantage_module must write 'advantage' of shape "
                                 f"{list(rtd.batch_size) + [1]}, got {got}")
            first = adv.select(k_dim + 1, 0).reshape(*adv.shape[: k_dim + 1])  # [*batch, C]
            vals, top = first.topk(self.top_k, dim=k_dim)
            w = torch.softmax(vals / self.temperature, dim=k_dim)
            best = _gather_top(actions, top, k_dim)
            w = w.reshape(*w.shape, *([1] * (best.ndim - w.ndim)))
            mean = (w * best).sum(k_dim, keepdim=True)
            std = (w * (best - mean).square()).sum(k_dim, keepdim=True).sqrt()
        return self._finish(mean)
