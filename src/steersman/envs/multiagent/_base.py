"""Machinery of the torch-native multi-agent envs (one group ``"agents"``).

As for the single-agent native envs (``steersman.envs.native._base``), an env is a few
pure functions over batched tensors, with ``c`` its constants (a NamedTuple):

* ``dynamics(state, force, c) -> (next_state, reward [*B, n], terminated [*B])``;
* ``observe(state, c) -> [*B, n, obs_dim]`` (each agent's observation);
* ``global_state(state, c) -> [*B, state_dim]`` (the root ``"state"`` entry);
* ``init(u, c) -> state`` from ``u`` ``[*B, K]`` uniform draws in ``[0, 1)``.

The state is one tensor ``[*B, E, F]`` (``E`` entities: the agents first, then any
scripted ones; ``F`` features). ``force`` is ``[*B, n, 2]``: the continuous action
clipped to ``[-1, 1]``, or the unit direction of a categorical action
(``0`` no-op, ``1`` +x, ``2`` -x, ``3`` +y, ``4`` -y). :func:`ma_fused_step` composes
them with the time limit and the auto-reset, with no Python loop over envs or agents.

Randomness is the native envs' counter-based RNG: each sub-env owns an int32 counter;
a reset draws ``u_j = hash(rng + j * golden)`` and advances the counter, so runs are
reproducible, the same on every device, eager or compiled, and a sub-env's stream does
not depend on the others.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from steersman.data import Bounded, Categorical, Composite, Unbounded
from steersman.tensordict import TensorDict, TensorDictBase

from ..common import EnvBase, InvalidActionError
from ..native._base import lane_keys, make_offsets, mix32, tensor_consts

__all__ = ["MultiAgentNativeEnv", "ma_fused_step", "uniforms", "CATEGORICAL_DIRECTIONS"]

_INV_2_24 = 1.0 / 16777216.0

#: the unit force of each categorical action: no-op, +x, -x, +y, -y
CATEGORICAL_DIRECTIONS = ((0.0, 0.0), (1.0, 0.0), (-1.0, 0.0), (0.0, 1.0), (0.0, -1.0))


def uniforms(rng: Tensor, offsets: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``K`` uniform draws per sub-env, ``[*B, K]`` in ``[0, 1)``, and the advanced counters.

    ``offsets`` is :func:`~steersman.envs.native._base.make_offsets` ``(K)``; the draws are
    those of :func:`~steersman.envs.native.draw_uniforms` (same hash, same bits).

    Example:
        >>> import torch
        >>> from steersman.envs.multiagent._base import uniforms
        >>> from steersman.envs.native._base import make_offsets
        >>> u, rng = uniforms(torch.zeros(3, dtype=torch.int32), make_offsets(4), torch.float32)
        >>> u.shape, bool(((u >= 0) & (u < 1)).all())
        (torch.Size([3, 4]), True)
    """
    k = offsets.shape[0] - 1
    x = rng.unsqueeze(-1) + offsets[:k]
    u = ((mix32(x) >> 8) & 0xFFFFFF).to(dtype) * _INV_2_24
    return u, rng + offsets[k]


def ma_fused_step(
    dynamics: Callable, observe: Callable, global_state: Callable, init: Callable,
    state: Tensor, steps: Tensor, rng: Tensor, offsets: Tensor, force: Tensor, c: Any,
    max_steps: int | None, autoreset: bool,
) -> tuple:
    """One step of every sub-env: dynamics, time limit and (if ``autoreset``) resets.

    Returns ``(state', steps', rng', (obs, gstate, reward, terminated, truncated),
    (obs', gstate'))``: the step's results (``obs [*B, n, d]``, ``gstate [*B, s]``,
    ``reward [*B, n]``, flags ``[*B]``) and the observations after resetting the finished
    sub-envs (without ``autoreset``: those of the step).
    """
    nstate, reward, terminated = dynamics(state, force, c)
    steps = steps + 1
    truncated = torch.zeros_like(terminated) if max_steps is None else steps >= max_steps
    done = terminated | truncated
    obs, gs = observe(nstate, c), global_state(nstate, c)
    nxt = (obs, gs, reward, terminated, truncated)
    if not autoreset:
        return nstate, steps, rng, nxt, (obs, gs)
    u, rng_adv = uniforms(rng, offsets, nstate.dtype)
    fresh = init(u, c)
    rstate = torch.where(done[..., None, None], fresh, nstate)
    rsteps = torch.where(done, 0, steps)
    rrng = torch.where(done, rng_adv, rng)
    return rstate, rsteps, rrng, nxt, (observe(rstate, c), global_state(rstate, c))


def _flags(flag: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """A ``[*B]`` flag as the root ``[*B, 1]`` and the per-agent ``[*B, n, 1]`` entries."""
    root = flag.unsqueeze(-1)
    return root, root.unsqueeze(-2).expand(*flag.shape, n, 1).clone()


class MultiAgentNativeEnv(EnvBase):
    """Base of the torch-native multi-agent envs: one group ``"agents"`` of ``n_agents``.

    A subclass sets the pure functions (``_dynamics``, ``_observe``, ``_global_state``,
    ``_init``), ``_kernel`` (a module-level function calling :func:`ma_fused_step`, so
    each env class has its own compile cache), and implements ``_make_consts``,
    ``_num_uniforms``, ``_obs_dim``, ``_state_dim``, ``_obs_bound`` and ``_reward_entries``.

    Entries (``B`` the env batch, ``n = n_agents``):

    * ``("agents", "observation")`` float ``[*B, n, obs_dim]``; root ``"state"`` float
      ``[*B, state_dim]`` (every entity's features: for centralised critics and mixers).
    * ``("agents", "action")``: float ``[*B, n, 2]`` in ``[-1, 1]`` (a force; clipped), or
      with ``categorical_actions=True`` int64 ``[*B, n]`` in ``0..4`` (no-op, +x, -x, +y, -y).
    * ``("agents", "reward")`` ``[*B, n, 1]``.
    * ``("agents", "done" | "terminated" | "truncated")`` bool ``[*B, n, 1]`` and the root
      ``"done" | "terminated" | "truncated"`` ``[*B, 1]``. All agents of a sub-env end
      together, so the root flag is both the any and the all of the group's.

    Args:
        num_envs: the number of sub-envs (batch ``[num_envs]``); or give ``batch_size``
            (any shape); neither: one unbatched env (batch ``[]``).
        n_agents: agents in the group.
        max_steps: the time limit (``truncated``); ``None`` for none.
        categorical_actions: discrete actions (see above) instead of continuous forces.
        shared_reward: every agent gets the team's reward (see the env's docstring).
        seed: seed of the counter-based RNG (default: drawn from torch's global RNG).
        device: where the state lives and every step runs.
        compile: ``True`` (or a dict of ``torch.compile`` options) runs the step kernel
            through ``torch.compile(fullgraph=True)``.
        check: refuse actions outside the action spec (categorical out of range, NaN).
            The action's shape is always checked (a cheap comparison).
    """

    group = "agents"
    _dynamics: Callable
    _observe: Callable
    _global_state: Callable
    _init: Callable
    _kernel: Callable

    def __init__(
        self,
        num_envs: int | None = None,
        *,
        batch_size: Any = None,
        n_agents: int = 3,
        max_steps: int | None = 100,
        categorical_actions: bool = False,
        shared_reward: bool = True,
        seed: int | None = None,
        device: Any = None,
        compile: bool | dict = False,
        check: bool = True,
    ) -> None:
        name = type(self).__name__
        if num_envs is not None and batch_size is not None:
            raise ValueError(f"{name}: give num_envs or batch_size, not both")
        if num_envs is not None:
            if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
                raise ValueError(f"{name}: num_envs must be a positive int, got {num_envs!r}")
            batch_size = (num_envs,)
        super().__init__(device=device, batch_size=batch_size, check=check)
        if isinstance(n_agents, bool) or not isinstance(n_agents, int) or n_agents < 1:
            raise ValueError(f"{name}: n_agents must be a positive int, got {n_agents!r}")
        if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int)
                                      or max_steps < 1):
            raise ValueError(f"{name}: max_steps must be a positive int or None, got {max_steps!r}")
        self.n_agents = n_agents
        self.max_steps = max_steps
        self.categorical_actions = bool(categorical_actions)
        self.shared_reward = bool(shared_reward)
        self.agent_names = [f"agent_{i}" for i in range(n_agents)]
        self._compile = compile
        self._compiled: Callable | None = None
        self._c = self._make_consts()
        # eager steps read 0-dim tensors (no scalar wrapping per op); compiled ones the floats
        self._c_eager = tensor_consts(self._c, torch.float32, self._device)
        self._offsets = make_offsets(self._num_uniforms(), self._device)
        self._directions = torch.tensor(CATEGORICAL_DIRECTIONS, device=self._device)
        self._make_specs()
        n = self._batch_size
        self._steps = torch.zeros(n, dtype=torch.int32, device=self._device)
        self._set_seed(seed)
        self._state, _ = self._fresh_state()  # valid before the first reset (which draws the same)
        self._gshape = torch.Size((*n, n_agents))

    # ------------------------------------------------------------------ subclass API
    def _make_consts(self) -> Any:
        raise NotImplementedError

    def _num_uniforms(self) -> int:
        raise NotImplementedError

    def _obs_dim(self) -> int:
        raise NotImplementedError

    def _obs_high(self) -> Tensor:
        """The bound of each observation feature (``[obs_dim]``; observations lie in ``±high``)."""
        raise NotImplementedError

    def _state_dim(self) -> int:
        raise NotImplementedError

    # ------------------------------------------------------------------ groups and specs
    @property
    def group_map(self) -> dict[str, list[str]]:
        """``{"agents": ["agent_0", ...]}``."""
        return {self.group: list(self.agent_names)}

    def _make_specs(self) -> None:
        bs, dev, n, g = self._batch_size, self._device, self.n_agents, self.group
        gs = (*bs, n)
        high = self._obs_high().to(dev)
        obs = Bounded(-high.expand(*gs, high.shape[-1]), high.expand(*gs, high.shape[-1]), device=dev)
        self.observation_spec = Composite(
            {g: Composite(observation=obs, shape=gs, device=dev),
             "state": Unbounded((*bs, self._state_dim()), device=dev)},
            shape=bs, device=dev,
        )
        if self.categorical_actions:
            act = Categorical(len(CATEGORICAL_DIRECTIONS), shape=gs, device=dev, dtype=torch.int64)
        else:
            act = Bounded(-1.0, 1.0, shape=(*gs, 2), device=dev)
        self.full_action_spec = Composite({g: Composite(action=act, shape=gs, device=dev)}, shape=bs, device=dev)
        self.full_reward_spec = Composite(
            {g: Composite(reward=Unbounded((*gs, 1), device=dev), shape=gs, device=dev)}, shape=bs, device=dev
        )
        flag = Categorical(2, shape=(*bs, 1), device=dev, dtype=torch.bool)
        gflag = Categorical(2, shape=(*gs, 1), device=dev, dtype=torch.bool)
        self.full_done_spec = Composite(
            {"done": flag, "terminated": flag.clone(), "truncated": flag.clone(),
             g: Composite(done=gflag, terminated=gflag.clone(), truncated=gflag.clone(), shape=gs, device=dev)},
            shape=bs, device=dev,
        )

    # ------------------------------------------------------------------ RNG and state
    def _set_seed(self, seed: int | None) -> None:
        if seed is None:
            seed = int(torch.randint(0, 2**62, ()).item())
        self._rng = lane_keys(seed, self._batch_size, self._device)

    def _fresh_state(self) -> tuple[Tensor, Tensor]:
        u, rng = uniforms(self._rng, self._offsets, torch.float32)
        return type(self)._init(u, self._c), rng

    def get_state(self) -> Tensor:
        """A copy of the state tensor ``[*B, E, F]`` (see the env's docstring)."""
        return self._state.clone()

    def set_state(self, state: Tensor) -> None:
        """Overwrites the state with ``state`` (shape of :meth:`get_state`)."""
        state = torch.as_tensor(state, dtype=self._state.dtype, device=self._device)
        if state.shape != self._state.shape:
            raise ValueError(
                f"{type(self).__name__}.set_state: expected a state of shape {list(self._state.shape)}, "
                f"got {list(state.shape)}"
            )
        self._state = state.clone()

    # ------------------------------------------------------------------ TensorDicts
    def _group_td(self, entries: dict) -> TensorDict:
        return TensorDict.from_trusted(entries, self._gshape, self._device)

    def _reset_td(self, obs: Tensor, gstate: Tensor) -> TensorDict:
        n = self.n_agents
        f, gf = _flags(torch.zeros(self._batch_size, dtype=torch.bool, device=self._device), n)
        group = self._group_td({"observation": obs, "done": gf, "terminated": gf.clone(), "truncated": gf.clone()})
        return TensorDict.from_trusted(
            {self.group: group, "state": gstate, "done": f, "terminated": f.clone(), "truncated": f.clone()},
            self._batch_size, self._device,
        )

    def _next_td(self, nxt: tuple) -> TensorDict:
        obs, gs, reward, term, trunc = nxt
        n = self.n_agents
        d, gd = _flags(term | trunc, n)
        te, gte = _flags(term, n)
        tr, gtr = _flags(trunc, n)
        group = self._group_td({"observation": obs, "reward": reward.unsqueeze(-1), "done": gd,
                                "terminated": gte, "truncated": gtr})
        return TensorDict.from_trusted(
            {self.group: group, "state": gs, "done": d, "terminated": te, "truncated": tr},
            self._batch_size, self._device,
        )

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        if kwargs:
            raise TypeError(f"{type(self).__name__}.reset got unexpected arguments {sorted(kwargs)}")
        mask = self._reset_mask(tensordict)
        fresh, rng = self._fresh_state()
        if mask is None:
            self._state, self._rng = fresh, rng
            self._steps = torch.zeros_like(self._steps)
        else:
            self._state = torch.where(mask[..., None, None], fresh, self._state)
            self._rng = torch.where(mask, rng, self._rng)
            self._steps = torch.where(mask, 0, self._steps)
        c = self._c
        return self._reset_td(type(self)._observe(self._state, c), type(self)._global_state(self._state, c))

    # ------------------------------------------------------------------ actions
    def _force(self, tensordict: TensorDictBase) -> Tensor:
        """The ``("agents", "action")`` entry checked (shape always; values with ``check``) as a force."""
        g = self.group
        sub = tensordict.get(g, None)
        action = None if sub is None else sub.get("action", None)
        if action is None:
            raise KeyError(
                f"{type(self).__name__}.step: the tensordict has no {(g, 'action')!r} entry "
                f"(keys: {sorted(map(str, tensordict.keys(include_nested=True)))}); set one, e.g. "
                "env.rand_action(td)"
            )
        spec = self._full_action_spec[g, "action"]
        if not isinstance(action, Tensor) or action.shape != spec.shape:
            raise InvalidActionError(
                f"{type(self).__name__}.step: action {(g, 'action')!r} of group {g!r} has shape "
                f"{list(getattr(action, 'shape', []))}, expected {list(spec.shape)} "
                f"([*batch {list(self._batch_size)}, n_agents {self.n_agents}"
                f"{'' if self.categorical_actions else ', 2'}]); the env was not stepped"
            )
        if self.check and not torch.compiler.is_compiling():
            self._refuse_out_of_spec(action, spec)
        if self.categorical_actions:
            return self._directions[action.long()]
        return action.to(torch.float32).clamp(-1.0, 1.0)

    def _refuse_out_of_spec(self, action: Tensor, spec: Any) -> None:
        from ..common import action_problem, invalid_action

        if self.categorical_actions:
            if action.is_floating_point():
                bad = "a floating dtype"
            elif action.numel() == 0:
                return
            else:
                lo, hi = torch.aminmax(action)
                if lo.item() >= 0 and hi.item() < spec.n:
                    return
                bad = None
            if bad is not None:
                raise InvalidActionError(
                    f"{type(self).__name__}.step: action {(self.group, 'action')!r} has {bad} "
                    f"({action.dtype}); categorical actions are integers in [0, {spec.n})"
                )
        reason = action_problem(spec, action)
        if reason is not None:
            raise invalid_action(self, (self.group, "action"), spec, action, reason)

    def _action_guard(self, tensordict: TensorDictBase) -> None:
        """No-op: ``_step`` checks the action itself."""

    # ------------------------------------------------------------------ steps
    def _kernel_fn(self) -> Callable:
        if not self._compile:
            return type(self)._kernel
        if self._compiled is None:
            opts = dict(self._compile) if isinstance(self._compile, dict) else {}
            opts.setdefault("fullgraph", True)
            opts.setdefault("dynamic", False)
            fn = type(self)._kernel  # a private copy: this env gets its own compile cache
            own = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__,
                                     fn.__defaults__, fn.__closure__)
            self._compiled = torch.compile(own, **opts)
        return self._compiled

    def _run(self, force: Tensor, autoreset: bool) -> tuple:
        c = self._c if self._compile else self._c_eager
        out = self._kernel_fn()(self._state, self._steps, self._rng, self._offsets, force, c,
                                self.max_steps, autoreset)
        self._state, self._steps, self._rng = out[0], out[1], out[2]
        return out[3], out[4]

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        nxt, _ = self._run(self._force(tensordict), False)
        return self._next_td(nxt)

    def step_and_maybe_reset(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        """Steps and auto-resets the finished sub-envs in one pass (see ``EnvBase``).

        The next input keeps the root and group entries of ``tensordict`` that the env
        does not write (e.g. a policy's recurrent state), like ``step_mdp``.
        """
        if self._is_closed:
            self._assert_open()
        g = self.group
        if type(tensordict) is not TensorDict or "next" in tensordict.entries or \
                type(tensordict.entries.get(g)) is not TensorDict:
            return super().step_and_maybe_reset(tensordict)
        nxt, (robs, rgs) = self._run(self._force(tensordict), True)
        root = tensordict.entries
        root["next"] = self._next_td(nxt)
        out = self._reset_td(robs, rgs)
        keep = {k: v for k, v in root.items() if k not in ("next", "_reset", g) and k not in out.entries}
        gkeep = {k: v for k, v in root[g].entries.items()
                 if k not in ("action", "reward") and k not in out.entries[g].entries}
        out.entries.update(keep)
        out.entries[g].entries.update(gkeep)
        return tensordict, out

    # ------------------------------------------------------------------ device
    def to(self, device: Any) -> MultiAgentNativeEnv:
        super().to(device)
        dev = self._device
        self._state = self._state.to(dev)
        self._steps = self._steps.to(dev)
        self._rng = self._rng.to(dev)
        self._offsets = self._offsets.to(dev)
        self._directions = self._directions.to(dev)
        self._c = type(self._c)(*(v.to(dev) if isinstance(v, Tensor) else v for v in self._c))
        self._c_eager = type(self._c)(*(v.to(dev) if isinstance(v, Tensor) else v for v in self._c_eager))
        return self

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(batch_size={list(self._batch_size)}, n_agents={self.n_agents}, "
            f"max_steps={self.max_steps}, categorical_actions={self.categorical_actions}, "
            f"shared_reward={self.shared_reward}, device={self._device})"
        )
