"""VMAS (vectorized multi-agent simulator, pure PyTorch) as steersman multi-agent envs.

``pip install 'steersman[vmas]'``. VMAS simulates ``num_envs`` worlds at once in torch
(on any device); the wrapper hands its tensors over without copies to numpy.

Layout (TorchRL's, ``B = num_envs``): each group of ``n`` agents is a sub-TensorDict of
batch ``[B, n]`` holding ``"observation"`` ``[B, n, obs_dim]``, ``"action"`` (``[B, n,
act_dim]`` continuous; ``[B, n]`` int64 with ``categorical_actions``, else one-hot ``[B, n,
n_actions]``), ``"reward"`` ``[B, n, 1]`` and the done flags ``[B, n, 1]``; the root holds
``"done"``/``"terminated"``/``"truncated"`` ``[B, 1]``. VMAS ends all agents of a world
together: the group flags are the world's, broadcast (TorchRL's ``VmasEnv`` has only the
root flags; here both, as in the native multi-agent envs). VMAS's ``info`` is not returned.

By default VMAS runs in the caller's grad mode. ``inference_mode=True`` runs it under
:func:`torch.inference_mode` (what collectors and the recipes want: a VMAS step is hundreds
of small torch ops, and inference mode skips their autograd bookkeeping: about 10-15% of a
navigation step on CPU); the wrapper's outputs are ordinary tensors either way.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from steersman.data import Bounded, Categorical, Composite, OneHot, TensorSpec, Unbounded
from steersman.tensordict import TensorDict, TensorDictBase

from ..common import EnvBase, InvalidActionError
from ..multiagent.groups import MarlGroupMapType, check_marl_grouping

__all__ = ["VmasWrapper", "VmasEnv", "VMAS_EXTRA_HINT", "vmas_available"]

VMAS_EXTRA_HINT = "pip install 'steersman[vmas]'"


def vmas_available() -> bool:
    """Whether ``vmas`` can be imported."""
    return importlib.util.find_spec("vmas") is not None


def _import_vmas() -> Any:
    try:
        import vmas
    except ImportError as err:
        raise ImportError(f"VMAS is not installed; VmasEnv/VmasWrapper need it: {VMAS_EXTRA_HINT}") from err
    return vmas


def _box_spec(space: Any, batch: tuple, device: Any, name: str) -> TensorSpec:
    """The spec of a ``Box`` space (VMAS uses ``gym`` or ``gymnasium`` spaces: read by
    attribute), with leading dims ``batch``."""
    if type(space).__name__ != "Box":
        raise ValueError(f"VmasWrapper: {name} has the space {space}; only Box observations/actions are supported")
    low = torch.as_tensor(np.asarray(space.low, dtype=np.float32))
    high = torch.as_tensor(np.asarray(space.high, dtype=np.float32))
    shape = (*batch, *space.shape)
    if bool(torch.isinf(low).all() and torch.isinf(high).all()):
        return Unbounded(shape, device=device)
    return Bounded(low.expand(shape).clone(), high.expand(shape).clone(), device=device)


class VmasWrapper(EnvBase):
    """A VMAS ``Environment`` as a steersman env of batch ``[num_envs]``.

    Args:
        env: a ``vmas.simulator.environment.Environment`` (``vmas.make_env(...)``, no
            wrapper argument).
        group_map: ``{group: [agent, ...]}`` or a :class:`MarlGroupMapType` (default: all
            agents in one group ``"agents"``, TorchRL's default for VMAS). Agents of one
            group must have the same observation and action spaces.
        categorical_actions: discrete actions (``continuous_actions=False``) as int64
            indices (default) rather than one-hot.
        check: refuse actions outside the action spec (discrete range, NaN).
        inference_mode: run VMAS's step and resets under :func:`torch.inference_mode`
            (faster; nothing is recorded for autograd). VMAS's state tensors then become inference
            tensors, which only this wrapper (or code inside ``torch.inference_mode()``)
            may update: call the wrapped env's ``reset``/``step`` through the wrapper.

    Example:
        >>> import vmas
        >>> from steersman.envs.libs.vmas import VmasWrapper
        >>> env = VmasWrapper(vmas.make_env("navigation", num_envs=8, max_steps=10, seed=0, n_agents=2))
        >>> env.group_map, env.batch_size
        ({'agents': ['agent_0', 'agent_1']}, torch.Size([8]))
        >>> ro = env.rollout(5)
        >>> ro["agents", "observation"].shape, ro["next", "agents", "reward"].shape
        (torch.Size([8, 5, 2, 18]), torch.Size([8, 5, 2, 1]))
    """

    _handles_partial_reset = True

    def __init__(
        self,
        env: Any,
        *,
        group_map: Mapping[str, Sequence[str]] | MarlGroupMapType | None = None,
        categorical_actions: bool = True,
        check: bool = True,
        inference_mode: bool = False,
    ) -> None:
        _import_vmas()
        from vmas.simulator.environment import Environment

        if not isinstance(env, Environment):
            raise TypeError(f"VmasWrapper: env must be a vmas Environment (vmas.make_env), got {type(env).__name__}")
        if env.dict_spaces:
            raise ValueError("VmasWrapper: build the VMAS env with dict_spaces=False (the default)")
        super().__init__(device=env.device, batch_size=(env.num_envs,), check=check)
        self._env = env
        self.inference_mode = bool(inference_mode)
        self.agent_names = [a.name for a in env.agents]
        if group_map is None:
            gmap = {"agents": list(self.agent_names)}
        elif isinstance(group_map, MarlGroupMapType):
            gmap = group_map.get_group_map(self.agent_names)
        else:
            gmap = {g: list(a) for g, a in group_map.items()}
        check_marl_grouping(gmap, self.agent_names)
        self.group_map = gmap
        self.categorical_actions = bool(categorical_actions)
        self.continuous_actions = bool(env.continuous_actions)
        index = {a: i for i, a in enumerate(self.agent_names)}
        self._index = {g: [index[a] for a in agents] for g, agents in gmap.items()}
        self._order = [None] * len(self.agent_names)  # agent i -> (group, position)
        for g, idx in self._index.items():
            for p, i in enumerate(idx):
                self._order[i] = (g, p)
        self._make_specs()

    @property
    def env(self) -> Any:
        """The wrapped VMAS environment."""
        return self._env

    @property
    def scenario(self) -> Any:
        return self._env.scenario

    # ------------------------------------------------------------------ specs
    def _make_specs(self) -> None:
        env, bs, dev = self._env, self._batch_size, self._device
        obs_c, act_c, rew_c, done_c = {}, {}, {}, {}
        self._discrete_n: dict[str, int] = {}
        for g, idx in self._index.items():
            n = len(idx)
            gs = (*bs, n)
            ospaces = [env.observation_space[i] for i in idx]
            aspaces = [env.action_space[i] for i in idx]
            for what, sp in (("observation", ospaces), ("action", aspaces)):
                for i, s in zip(idx[1:], sp[1:]):
                    if s != sp[0]:
                        raise ValueError(
                            f"VmasWrapper: agents {self.agent_names[idx[0]]!r} and {self.agent_names[i]!r} of "
                            f"group {g!r} have different {what} spaces ({sp[0]} vs {s}); put them in different "
                            "groups, e.g. group_map=MarlGroupMapType.ONE_GROUP_PER_AGENT"
                        )
            obs = _box_spec(ospaces[0], gs, dev, f"({g!r}, 'observation')")
            obs_c[g] = Composite(observation=obs, shape=gs, device=dev)
            if self.continuous_actions:
                act: TensorSpec = _box_spec(aspaces[0], gs, dev, f"({g!r}, 'action')")
            else:
                k = int(aspaces[0].n)
                if type(aspaces[0]).__name__ != "Discrete":
                    raise ValueError("VmasWrapper: multidiscrete_actions are not supported; use the default")
                self._discrete_n[g] = k
                act = (Categorical(k, shape=gs, device=dev) if self.categorical_actions
                       else OneHot(k, shape=(*gs, k), device=dev))
            act_c[g] = Composite(action=act, shape=gs, device=dev)
            rew_c[g] = Composite(reward=Unbounded((*gs, 1), device=dev), shape=gs, device=dev)
            flag = Categorical(2, shape=(*gs, 1), device=dev, dtype=torch.bool)
            done_c[g] = Composite(done=flag, terminated=flag.clone(), truncated=flag.clone(), shape=gs, device=dev)
        self.observation_spec = Composite(obs_c, shape=bs, device=dev)
        self.full_action_spec = Composite(act_c, shape=bs, device=dev)
        self.full_reward_spec = Composite(rew_c, shape=bs, device=dev)
        root = Categorical(2, shape=(*bs, 1), device=dev, dtype=torch.bool)
        self.full_done_spec = Composite({"done": root, "terminated": root.clone(), "truncated": root.clone(),
                                         **done_c}, shape=bs, device=dev)

    # ------------------------------------------------------------------ conversions
    def _groups_out(self, obs: Sequence[Tensor], rews: Sequence[Tensor] | None, term: Tensor, trunc: Tensor
                    ) -> TensorDict:
        bs, dev = self._batch_size, self._device
        done = term | trunc
        out: dict[str, Any] = {}
        for g, idx in self._index.items():
            n = len(idx)
            gs = torch.Size((*bs, n))
            e: dict[str, Any] = {"observation": torch.stack([obs[i] for i in idx], 1)}
            if rews is not None:
                e["reward"] = torch.stack([rews[i] for i in idx], 1).unsqueeze(-1).to(torch.float32)
            for k, f in (("done", done), ("terminated", term), ("truncated", trunc)):
                e[k] = f.view(*bs, 1, 1).expand(*gs, 1).clone()
            out[g] = TensorDict.from_trusted(e, gs, dev)
        out["done"], out["terminated"], out["truncated"] = done.unsqueeze(-1), term.unsqueeze(-1), trunc.unsqueeze(-1)
        return TensorDict.from_trusted(out, bs, dev)

    def _flags(self) -> tuple[Tensor, Tensor]:
        env = self._env
        term = env.scenario.done().clone().to(torch.bool)
        if env.max_steps is None:
            trunc = torch.zeros_like(term)
        else:
            trunc = (env.steps >= env.max_steps) & ~term
        return term, trunc

    def _actions(self, tensordict: TensorDictBase) -> list[Tensor]:
        per_agent: list[Any] = [None] * len(self.agent_names)
        for g, idx in self._index.items():
            spec = self._full_action_spec[g, "action"]
            sub = tensordict.get(g, None)
            a = None if sub is None else sub.get("action", None)
            if a is None:
                raise KeyError(f"VmasWrapper.step: the tensordict has no {(g, 'action')!r} entry")
            if not isinstance(a, Tensor) or a.shape != spec.shape:
                raise InvalidActionError(
                    f"VmasWrapper.step: action {(g, 'action')!r} of group {g!r} has shape "
                    f"{list(getattr(a, 'shape', []))}, expected {list(spec.shape)} ([num_envs, n_agents "
                    f"{len(idx)}, ...]); the env was not stepped"
                )
            if not self.continuous_actions:
                if not self.categorical_actions:
                    a = a.to(torch.int64).argmax(-1)
                a = a.to(torch.int64)
            for p, i in enumerate(idx):
                per_agent[i] = a[:, p]
        return per_agent

    def _vmas_mode(self) -> contextlib.AbstractContextManager:
        """``torch.inference_mode(self.inference_mode)``, or no context when the caller is in
        that mode already (a collector under inference mode): the same mode for VMAS, without
        entering and leaving it on every step (~25 us of a ~2-3 ms navigation step)."""
        if torch.is_inference_mode_enabled() == self.inference_mode:
            return contextlib.nullcontext()
        return torch.inference_mode(self.inference_mode)

    # ------------------------------------------------------------------ EnvBase API
    def _set_seed(self, seed: int | None) -> None:
        if seed is not None:
            self._env.seed(seed)

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        mask = self._reset_mask(tensordict)
        env = self._env
        with self._vmas_mode():
            if mask is None or bool(mask.all()):
                env.reset(return_observations=False)
            else:
                for i in mask.nonzero().flatten().tolist():  # VMAS resets one world at a time
                    env.reset_at(i, return_observations=False)
            obs = env.get_from_scenario(get_observations=True, get_rewards=False, get_infos=False,
                                        get_dones=False)[0]
            term, trunc = self._flags()
        if self.inference_mode:  # ordinary tensors out: the conversions below run outside inference mode
            term, trunc = term.clone(), trunc.clone()
        return self._groups_out(obs, None, term, trunc)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        actions = self._actions(tensordict)
        with self._vmas_mode():
            out = self._env.step(actions)
            if not self._env.terminated_truncated:
                flags = self._flags()
        obs, rews = out[0], out[1]
        if self._env.terminated_truncated:
            # copy=True: an ordinary tensor (VMAS's may be an inference tensor), as the group flags
            term = out[2].to(torch.bool, copy=True)
            trunc = out[3].to(torch.bool) & ~term
        else:
            term, trunc = flags
            if self.inference_mode:
                term, trunc = term.clone(), trunc.clone()
        return self._groups_out(obs, rews, term, trunc)

    def __repr__(self) -> str:
        return (f"VmasWrapper(scenario={type(self.scenario).__module__.rsplit('.', 1)[-1]}, "
                f"num_envs={self._batch_size[0]}, group_map={self.group_map}, device={self._device})")


class VmasEnv(VmasWrapper):
    """A VMAS scenario by name (``vmas.make_env``), wrapped (see :class:`VmasWrapper`).

    Args:
        scenario: a VMAS scenario name (``"navigation"``, ``"balance"``, ...) or class.
        num_envs: worlds simulated at once (the batch size).
        continuous_actions: continuous forces (default) or VMAS's discrete actions.
        max_steps: the time limit (``truncated``); None: VMAS's scenario default (none).
        categorical_actions: see :class:`VmasWrapper`.
        seed: VMAS's seed.
        device: where VMAS simulates.
        group_map: see :class:`VmasWrapper`.
        check: see :class:`VmasWrapper`.
        inference_mode: see :class:`VmasWrapper`.
        **kwargs: scenario arguments (e.g. ``n_agents=3``).

    Example:
        >>> from steersman.envs.libs.vmas import VmasEnv
        >>> env = VmasEnv("balance", num_envs=4, max_steps=20, seed=0, n_agents=3)
        >>> env.full_action_spec["agents", "action"].shape
        torch.Size([4, 3, 2])
    """

    def __init__(
        self,
        scenario: Any,
        num_envs: int,
        continuous_actions: bool = True,
        max_steps: int | None = None,
        categorical_actions: bool = True,
        seed: int | None = None,
        device: Any = None,
        group_map: Mapping[str, Sequence[str]] | MarlGroupMapType | None = None,
        check: bool = True,
        inference_mode: bool = False,
        **kwargs: Any,
    ) -> None:
        vmas = _import_vmas()
        env = vmas.make_env(scenario, num_envs=num_envs, device="cpu" if device is None else device,
                            continuous_actions=continuous_actions, max_steps=max_steps, seed=seed,
                            terminated_truncated=True, **kwargs)
        self.scenario_name = scenario if isinstance(scenario, str) else type(scenario).__name__
        super().__init__(env, group_map=group_map, categorical_actions=categorical_actions, check=check,
                         inference_mode=inference_mode)
