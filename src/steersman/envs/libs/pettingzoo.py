"""PettingZoo envs (parallel and AEC APIs) as steersman multi-agent envs, and back.

* :class:`PettingZooWrapper` / :class:`PettingZooEnv`: a PettingZoo env as a steersman env
  with agent groups (``pip install 'steersman[pettingzoo]'``).
* :func:`to_pettingzoo`: a steersman multi-agent env (one sub-env) as a PettingZoo
  ``ParallelEnv``.

Layout (TorchRL's): each group of ``n`` agents is a sub-TensorDict of batch ``[n]``
holding ``"observation"``, ``"action"``, ``"reward" [n, 1]``, ``"done"``/``"terminated"``/
``"truncated"`` ``[n, 1]``, ``"action_mask" [n, n_actions]`` (when the agents observe
PettingZoo's ``{"observation", "action_mask"}`` dicts) and, with ``use_mask`` (always for
AEC envs), ``"mask" [n]`` (the agent is active: present in a parallel env, the acting
agent in an AEC env). The root holds ``"done"``/``"terminated"``/``"truncated"`` ``[1]``
and, with ``return_state``, ``"state"``.

What TorchRL users hit, and what this wrapper does instead (each has a regression test):

* An env whose agent list empties at the end of an episode (all agents removed) is done
  and reset, whatever the aggregation (pytorch/rl#2138): an agent that has left counts
  as done until the next reset; no agents left means the episode is over.
* Agents that die or join mid-episode never raise a ``KeyError``: entries of absent
  agents keep their last observation, get reward 0, an all-True action mask and
  ``mask = False`` (pytorch/rl#3702).
* AEC (turn-based) envs observe only the acting agent (``env.observe`` is called for it
  alone) and step only its action (pytorch/rl#2990); the other agents' observations are
  their last ones.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from steersman.data import Bounded, Categorical, Composite, OneHot, TensorSpec, Unbounded
from steersman.tensordict import TensorDict, TensorDictBase

from .._mdp import step_mdp
from ..common import EnvBase, InvalidActionError
from ..multiagent.groups import MarlGroupMapType, check_marl_grouping

__all__ = ["PettingZooWrapper", "PettingZooEnv", "to_pettingzoo", "PETTINGZOO_EXTRA_HINT", "pettingzoo_available"]

PETTINGZOO_EXTRA_HINT = "pip install 'steersman[pettingzoo]'"


def pettingzoo_available() -> bool:
    """Whether ``pettingzoo`` can be imported."""
    return importlib.util.find_spec("pettingzoo") is not None


def _import_pettingzoo() -> Any:
    """``import pettingzoo``, or an ImportError naming the extra to install."""
    try:
        import pettingzoo
    except ImportError as err:
        raise ImportError(
            f"PettingZoo is not installed; the PettingZoo wrappers need it: {PETTINGZOO_EXTRA_HINT}"
        ) from err
    return pettingzoo


def default_group_map(agent_names: Sequence[str]) -> dict[str, list[str]]:
    """TorchRL's default grouping of PettingZoo agents: by name prefix, the part before
    the last ``_`` (``"adversary_0"`` -> ``"adversary"``); a name without ``_`` is its own
    group.

    Example:
        >>> from steersman.envs.libs.pettingzoo import default_group_map
        >>> default_group_map(["adversary_0", "agent_0", "agent_1", "solo"])
        {'adversary': ['adversary_0'], 'agent': ['agent_0', 'agent_1'], 'solo': ['solo']}
    """
    out: dict[str, list[str]] = {}
    for name in agent_names:
        out.setdefault(name.rsplit("_", 1)[0] if "_" in name else name, []).append(name)
    return out


def _is_mask_dict(space: Any, spaces: Any) -> bool:
    return isinstance(space, spaces.Dict) and "action_mask" in space.spaces


class _Group:
    """The agents of one group and how their entries are converted."""

    def __init__(self, name: str, agents: list[str]) -> None:
        self.name = name
        self.agents = agents
        self.n = len(agents)
        self.obs_kind = "plain"  # "plain" | "masked" (obs["observation"]) | "dict"
        self.n_actions: int | None = None  # with an action mask
        self.action_kind = "box"  # "categorical" | "onehot" | "box" | "other"
        self.action_start = 0
        self.action_dtype: Any = None


class PettingZooWrapper(EnvBase):
    """A PettingZoo env (``ParallelEnv`` or ``AECEnv``) as a steersman multi-agent env.

    Args:
        env: the PettingZoo env (parallel or AEC; the API is detected).
        group_map: ``{group: [agent, ...]}`` or a :class:`MarlGroupMapType` (default:
            group by name prefix, see :func:`default_group_map`). Agents are PettingZoo's
            ``possible_agents``; agents of one group must have the same spaces.
        use_mask: add ``(group, "mask") [n]`` (the agent is active). Always on for AEC envs.
        categorical_actions: ``Discrete`` actions as int64 indices ``[n]`` (default) rather
            than one-hot ``[n, n_actions]``.
        return_state: add the root ``"state"`` entry (``env.state()``).
        done_on_any: the root done flags are the any (True) or all (False) of the agents'
            (default: any for parallel envs, all for AEC envs, TorchRL's defaults). An
            episode also ends when the env has no agents left.
        seed: the seed of the first reset (later resets continue PettingZoo's RNG).
        device: the device of the returned tensors.
        check: refuse actions outside the action spec, including the current action mask
            (``check=False`` passes them to PettingZoo).

    Actions of absent or (AEC) non-acting agents are ignored. An acting agent whose
    PettingZoo action mask allows nothing is an error naming group and agent.

    Example:
        >>> from pettingzoo.classic import tictactoe_v3
        >>> from steersman.envs.libs.pettingzoo import PettingZooWrapper
        >>> env = PettingZooWrapper(tictactoe_v3.env(), seed=0)
        >>> env.group_map
        {'player': ['player_1', 'player_2']}
        >>> td = env.reset()
        >>> td["player", "observation"].shape, td["player", "action_mask"].shape, td["player", "mask"].tolist()
        (torch.Size([2, 3, 3, 2]), torch.Size([2, 9]), [True, False])
        >>> ro = env.rollout(20)     # random legal moves until the game ends
        >>> bool(ro["next", "done"][-1]), ro["next", "player", "reward"][-1].sum().item() in (0.0,)
        (True, True)
    """

    def __init__(
        self,
        env: Any,
        *,
        group_map: Mapping[str, Sequence[str]] | MarlGroupMapType | None = None,
        use_mask: bool = False,
        categorical_actions: bool = True,
        return_state: bool = False,
        done_on_any: bool | None = None,
        seed: int | None = None,
        device: Any = None,
        check: bool = True,
    ) -> None:
        pz = _import_pettingzoo()
        if isinstance(env, pz.ParallelEnv):
            self.parallel = True
        elif isinstance(env, pz.AECEnv):
            self.parallel = False
        else:
            raise TypeError(
                f"PettingZooWrapper: env must be a pettingzoo ParallelEnv or AECEnv, got {type(env).__name__}"
            )
        super().__init__(device=device, batch_size=(), check=check)
        self._env = env
        self.agent_names = list(env.possible_agents)
        if group_map is None:
            gmap = default_group_map(self.agent_names)
        elif isinstance(group_map, MarlGroupMapType):
            gmap = group_map.get_group_map(self.agent_names)
        else:
            gmap = {g: list(a) for g, a in group_map.items()}
        check_marl_grouping(gmap, self.agent_names)
        self.group_map = gmap
        self.use_mask = bool(use_mask) or not self.parallel
        self.categorical_actions = bool(categorical_actions)
        self.return_state = bool(return_state)
        self.done_on_any = self.parallel if done_on_any is None else bool(done_on_any)
        self._seed = seed
        self._where = {a: (g, i) for g, agents in gmap.items() for i, a in enumerate(agents)}
        self._groups = [_Group(g, a) for g, a in gmap.items()]
        self._groups_by_name = {grp.name: grp for grp in self._groups}
        self._make_specs()
        self._reset_buffers()

    # ------------------------------------------------------------------ properties
    @property
    def env(self) -> Any:
        """The wrapped PettingZoo env."""
        return self._env

    # ------------------------------------------------------------------ specs
    def _space(self, kind: str, agent: str) -> Any:
        fn = getattr(self._env, f"{kind}_space")
        return fn(agent) if callable(fn) else fn[agent]

    def _make_specs(self) -> None:
        from .gym import _import_gymnasium, _torch_dtype, space_to_spec

        spaces = _import_gymnasium().spaces
        dev = self._device
        obs_c, act_c, rew_c, done_c = {}, {}, {}, {}
        for grp in self._groups:
            g, n = grp.name, grp.n
            ospaces = [self._space("observation", a) for a in grp.agents]
            aspaces = [self._space("action", a) for a in grp.agents]
            for what, sp in (("observation", ospaces), ("action", aspaces)):
                for a, s in zip(grp.agents[1:], sp[1:]):
                    if s != sp[0]:
                        raise ValueError(
                            f"PettingZooWrapper: agents {grp.agents[0]!r} and {a!r} of group {g!r} have different "
                            f"{what} spaces ({sp[0]} vs {s}); put them in different groups, e.g. "
                            "group_map=MarlGroupMapType.ONE_GROUP_PER_AGENT"
                        )
            ospace, aspace = ospaces[0], aspaces[0]
            entries: dict[str, TensorSpec] = {}
            if _is_mask_dict(ospace, spaces):
                rest = {k: v for k, v in ospace.spaces.items() if k != "action_mask"}
                grp.n_actions = int(np.prod(ospace["action_mask"].shape))
                if set(rest) == {"observation"}:
                    grp.obs_kind = "masked"
                    entries["observation"] = space_to_spec(rest["observation"], batch_size=[n], device=dev,
                                                           name=f"({g!r}, 'observation')")
                else:
                    grp.obs_kind = "dict"
                    entries["observation"] = space_to_spec(spaces.Dict(rest), batch_size=[n], device=dev,
                                                           name=f"({g!r}, 'observation')")
                entries["action_mask"] = Categorical(2, shape=(n, grp.n_actions), device=dev, dtype=torch.bool)
            else:
                grp.obs_kind = "dict" if isinstance(ospace, spaces.Dict) else "plain"
                entries["observation"] = space_to_spec(ospace, batch_size=[n], device=dev,
                                                       name=f"({g!r}, 'observation')")
            if self.use_mask:
                entries["mask"] = Categorical(2, shape=(n,), device=dev, dtype=torch.bool)
            obs_c[g] = Composite(entries, shape=(n,), device=dev)
            if isinstance(aspace, spaces.Discrete):
                grp.action_kind = "categorical" if self.categorical_actions else "onehot"
                grp.action_start = int(aspace.start)
                k = int(aspace.n)
                if grp.n_actions is not None and grp.n_actions != k:
                    raise ValueError(
                        f"PettingZooWrapper: group {g!r} has {k} actions but an action mask of {grp.n_actions}"
                    )
                act: TensorSpec = (Categorical(k, shape=(n,), device=dev) if self.categorical_actions
                                   else OneHot(k, shape=(n, k), device=dev))
            else:
                grp.action_kind = "box" if isinstance(aspace, spaces.Box) else "other"
                act = space_to_spec(aspace, batch_size=[n], device=dev, categorical_action_encoding=True,
                                    name=f"({g!r}, 'action')")
                grp.n_actions = None
            grp.action_dtype = aspace.dtype
            act_c[g] = Composite(action=act, shape=(n,), device=dev)
            rew_c[g] = Composite(reward=Unbounded((n, 1), device=dev), shape=(n,), device=dev)
            flag = Categorical(2, shape=(n, 1), device=dev, dtype=torch.bool)
            done_c[g] = Composite(done=flag, terminated=flag.clone(), truncated=flag.clone(), shape=(n,), device=dev)
        if self.return_state:
            state_space = getattr(self._env, "state_space", None)
            if state_space is None:
                raise ValueError("PettingZooWrapper(return_state=True): the env has no state_space")
            obs_c["state"] = space_to_spec(state_space, device=dev, name="state")
            self._state_dtype = _torch_dtype(state_space.dtype)
        self.observation_spec = Composite(obs_c, shape=(), device=dev)
        self.full_action_spec = Composite(act_c, shape=(), device=dev)
        self.full_reward_spec = Composite(rew_c, shape=(), device=dev)
        root = Categorical(2, shape=(1,), device=dev, dtype=torch.bool)
        self.full_done_spec = Composite({"done": root, "terminated": root.clone(), "truncated": root.clone(),
                                         **done_c}, shape=(), device=dev)

    # ------------------------------------------------------------------ per-episode state
    def _reset_buffers(self) -> None:
        """Zeroed last observations, all-True action masks, no agent done."""
        self._obs = {grp.name: self._full_observation_spec[grp.name, "observation"].zero() for grp in self._groups}
        self._amask = {grp.name: torch.ones(grp.n, grp.n_actions, dtype=torch.bool)
                       for grp in self._groups if grp.n_actions is not None}
        self._term = {a: False for a in self.agent_names}
        self._trunc = {a: False for a in self.agent_names}
        self._seen: set[str] = set()

    def _check_agents(self, what: str, agents: Any) -> None:
        unknown = [a for a in agents if a not in self._where]
        if unknown:
            raise ValueError(
                f"PettingZooWrapper: the env returned {what} for agent {unknown[0]!r}, which is in no group "
                f"(unknown: {unknown}; agents of the spec: {self.agent_names}); the wrapper's state is unchanged. "
                "Agents must be in env.possible_agents"
            )

    def _check_masks(self, obs: Mapping[str, Any], acting: Any) -> None:
        """A clear error, before anything is written, if the action mask of an agent that is
        to act allows no action."""
        for a in acting:
            value = obs.get(a)
            g = self._where[a][0]
            if (self._groups_by_name[g].n_actions is not None and isinstance(value, Mapping)
                    and "action_mask" in value and not np.asarray(value["action_mask"]).astype(bool).any()):
                raise ValueError(
                    f"PettingZooWrapper: the action mask of agent {a!r} (group {g!r}) allows no action "
                    "while the agent is to act; the wrapper's state is unchanged"
                )

    def _agent_obs(self, grp: _Group, value: Any) -> tuple[Any, Any]:
        """(observation, action mask or None) of one agent, converted."""
        mask = None
        if grp.n_actions is not None and isinstance(value, Mapping):
            mask = value["action_mask"]
            value = value["observation"] if grp.obs_kind == "masked" else {
                k: v for k, v in value.items() if k != "action_mask"}
        return value, mask

    def _write_obs(self, agent: str, value: Any) -> None:
        g, i = self._where[agent]
        grp = self._groups_by_name[g]
        obs, mask = self._agent_obs(grp, value)
        buf = self._obs[g]
        if isinstance(buf, TensorDictBase):
            for k, v in _flatten(obs):
                buf.get(k)[i] = torch.as_tensor(np.asarray(v)).to(buf.get(k).dtype)
        else:
            buf[i] = torch.as_tensor(np.asarray(obs)).to(buf.dtype)
        if mask is not None:
            m = torch.as_tensor(np.asarray(mask).astype(bool).reshape(-1))
            self._amask[g][i] = m

    # ------------------------------------------------------------------ output
    def _active(self) -> set[str]:
        if self.parallel:
            return set(self._env.agents)
        return {self._env.agent_selection} if self._env.agents and not self._episode_over() else set()

    def _episode_over(self) -> bool:
        present = list(self._env.agents)
        if not present:
            return True
        flags = [self._term[a] or self._trunc[a] for a in self._seen]
        if not flags:
            return False
        return any(flags) if self.done_on_any else all(flags)

    def _output(self, rewards: dict[str, float] | None) -> TensorDict:
        dev, cpu = self._device, torch.device("cpu")
        active = self._active()
        out: dict[str, Any] = {}
        for grp in self._groups:
            g = grp.name
            entries: dict[str, Any] = {"observation": self._obs[g].clone()}
            if grp.n_actions is not None:
                am = self._amask[g].clone()
                for i, a in enumerate(grp.agents):
                    if a not in active:
                        am[i] = True  # absent or waiting agents: any action (ignored)
                    elif not bool(am[i].any()):
                        raise ValueError(
                            f"PettingZooWrapper: the action mask of agent {a!r} (group {g!r}) allows no action "
                            "while the agent is to act"
                        )
                entries["action_mask"] = am
                spec = self._full_action_spec[g, "action"]
                spec.update_mask(am)
            if self.use_mask:
                entries["mask"] = torch.tensor([a in active for a in grp.agents], dtype=torch.bool)
            term = torch.tensor([[self._term[a]] for a in grp.agents], dtype=torch.bool)
            trunc = torch.tensor([[self._trunc[a]] for a in grp.agents], dtype=torch.bool)
            entries["done"], entries["terminated"], entries["truncated"] = term | trunc, term, trunc
            if rewards is not None:
                entries["reward"] = torch.tensor([[float(rewards.get(a, 0.0))] for a in grp.agents],
                                                 dtype=torch.float32)
            out[g] = TensorDict.from_trusted(entries, torch.Size((grp.n,)), cpu)
        done = self._episode_over()
        any_term = any(self._term[a] for a in self._seen)
        term = done and (any_term or not any(self._trunc[a] for a in self._seen))
        out["done"] = torch.tensor([done])
        out["terminated"] = torch.tensor([term])
        out["truncated"] = torch.tensor([done and not term])
        if self.return_state:
            out["state"] = torch.as_tensor(np.asarray(self._env.state())).to(self._state_dtype)
        td = TensorDict.from_trusted(out, torch.Size(()), cpu)
        return td if dev == cpu else td.to(dev)

    # ------------------------------------------------------------------ reset / step
    def _set_seed(self, seed: int | None) -> None:
        self._seed = seed

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        seed, self._seed = self._seed, None
        if self.parallel:
            res = self._env.reset(seed=seed, **kwargs)
            obs = res[0] if isinstance(res, tuple) else res
            self._check_agents("observations", obs)
            self._check_masks(obs, self._env.agents)
            self._reset_buffers()
            for a, v in obs.items():
                self._write_obs(a, v)
        else:
            self._env.reset(seed=seed, **kwargs)
            sel = self._env.agent_selection if self._env.agents else None
            if sel is not None:
                self._check_agents("an acting agent", [sel])
                first = {sel: self._env.observe(sel)}
                self._check_masks(first, [sel])
            self._reset_buffers()
            if sel is not None:
                self._write_obs(sel, first[sel])
        self._seen = set(self._env.agents)
        self._check_agents("agents", self._seen)
        return self._output(None)

    def _action_of(self, grp: _Group, actions: Tensor, i: int) -> Any:
        a = actions[i]
        if grp.action_kind == "categorical":
            return np.int64(int(a) + grp.action_start)
        if grp.action_kind == "onehot":
            return np.int64(int(a.to(torch.int64).argmax()) + grp.action_start)
        return a.detach().cpu().numpy().astype(grp.action_dtype)

    def _group_actions(self, tensordict: TensorDictBase) -> dict[str, Tensor]:
        out = {}
        for grp in self._groups:
            g = grp.name
            spec = self._full_action_spec[g, "action"]
            sub = tensordict.get(g, None)
            a = None if sub is None else sub.get("action", None)
            if a is None:
                raise KeyError(f"PettingZooWrapper.step: the tensordict has no {(g, 'action')!r} entry")
            if not isinstance(a, Tensor) or a.shape != spec.shape:
                raise InvalidActionError(
                    f"PettingZooWrapper.step: action {(g, 'action')!r} of group {g!r} has shape "
                    f"{list(getattr(a, 'shape', []))}, expected {list(spec.shape)} (n_agents {grp.n} "
                    f"first: {grp.agents}); the env was not stepped"
                )
            out[g] = a
        return out

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        actions = self._group_actions(tensordict)
        env = self._env
        if self.parallel:
            act = {}
            for a in env.agents:
                g, i = self._where[a]
                act[a] = self._action_of(self._groups_by_name[g], actions[g], i)
            prev = set(env.agents)
            obs, rew, term, trunc, _info = env.step(act)
            for what, d in (("observations", obs), ("rewards", rew), ("terminations", term),
                            ("truncations", trunc)):
                self._check_agents(what, d)
            self._check_agents("agents", env.agents)
            self._check_masks(obs, env.agents)
            for a, v in obs.items():
                self._write_obs(a, v)
            rewards = dict(rew)
            self._update_flags(prev, term, trunc)
        else:
            rewards = self._aec_step(actions)
        return self._output(rewards)

    def _update_flags(self, prev: set[str], term: Mapping, trunc: Mapping) -> None:
        now = set(self._env.agents)
        for a, v in term.items():
            self._term[a] = self._term[a] or bool(v)
        for a, v in trunc.items():
            self._trunc[a] = self._trunc[a] or bool(v)
        for a in (prev | self._seen) - now:  # left the env: done from now on
            if not (self._term[a] or self._trunc[a]):
                self._term[a] = True
        for a in now - self._seen:  # joined: active, not done
            self._term[a] = self._trunc[a] = False
        self._seen |= now

    def _aec_step(self, actions: dict[str, Tensor]) -> dict[str, float]:
        env = self._env
        rewards = {a: 0.0 for a in self.agent_names}
        if not env.agents:
            return rewards
        sel = env.agent_selection
        g, i = self._where[sel]
        prev = set(env.agents)
        dead = bool(env.terminations.get(sel, False) or env.truncations.get(sel, False))
        env.step(None if dead else self._action_of(self._groups_by_name[g], actions[g], i))
        self._collect_aec(rewards)
        # agents that are done must take a None step when selected: done here, no decision
        while env.agents and (env.terminations.get(env.agent_selection, False)
                              or env.truncations.get(env.agent_selection, False)):
            if all(env.terminations.get(a, False) or env.truncations.get(a, False) for a in env.agents):
                break  # the episode is over: the next reset starts afresh
            env.step(None)
            self._collect_aec(rewards)
        self._check_agents("agents", env.agents)
        flags = dict(self._term), dict(self._trunc), set(self._seen)
        self._update_flags(prev, env.terminations, env.truncations)
        if env.agents and not self._episode_over():
            sel = env.agent_selection
            nxt = {sel: env.observe(sel)}
            try:
                self._check_masks(nxt, [sel])
            except ValueError:
                self._term, self._trunc, self._seen = flags  # the wrapper's state unchanged
                raise
            self._write_obs(sel, nxt[sel])
        return rewards

    def _collect_aec(self, rewards: dict[str, float]) -> None:
        env = self._env
        self._check_agents("rewards", env.rewards)
        for a, r in env.rewards.items():
            rewards[a] += float(r)

    def step_and_maybe_reset(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        """Steps; resets when the root ``"done"`` is set (not when one agent is done)."""
        tensordict = self.step(tensordict)
        nxt = self._step_mdp(tensordict)
        if bool(nxt.get("done").any()):
            nxt = self.reset(nxt)
        return tensordict, nxt

    def _close(self) -> None:
        self._env.close()

    def __repr__(self) -> str:
        return (f"PettingZooWrapper(env={type(self._env).__name__}, parallel={self.parallel}, "
                f"group_map={self.group_map}, use_mask={self.use_mask}, done_on_any={self.done_on_any})")


def _flatten(obs: Any, prefix: tuple = ()) -> list[tuple[Any, Any]]:
    """``(nested key, value)`` pairs of a (nested) dict observation."""
    if isinstance(obs, Mapping):
        out = []
        for k, v in obs.items():
            out += _flatten(v, prefix + (k,))
        return out
    return [(prefix if len(prefix) > 1 else prefix[0], obs)]


class PettingZooEnv(PettingZooWrapper):
    """A PettingZoo env built from its task name, then wrapped (see :class:`PettingZooWrapper`).

    Args:
        task: ``"<family>/<module>"`` or ``"<family>.<module>"`` of ``pettingzoo`` (e.g.
            ``"classic/tictactoe_v3"``, ``"butterfly/pistonball_v6"``), or a bare module name
            searched in the families (``"tictactoe_v3"``). MPE tasks (``"mpe/simple_spread_v3"``)
            come from the ``mpe2`` package (``pip install mpe2``).
        parallel: build ``module.parallel_env(**kwargs)`` (True) or ``module.env(**kwargs)``
            (False, the AEC API).
        env_kwargs: arguments of the PettingZoo constructor.
        **wrapper_kwargs: those of :class:`PettingZooWrapper`.

    Example:
        >>> from steersman.envs.libs.pettingzoo import PettingZooEnv
        >>> env = PettingZooEnv("classic/connect_four_v3", parallel=False, seed=0)
        >>> env.reset()["player", "action_mask"].shape
        torch.Size([2, 7])
    """

    FAMILIES = ("classic", "butterfly", "sisl", "atari", "mpe")

    def __init__(self, task: str, parallel: bool = True, *, env_kwargs: Mapping | None = None,
                 **wrapper_kwargs: Any) -> None:
        _import_pettingzoo()
        mod = self._module(task)
        ctor = getattr(mod, "parallel_env" if parallel else "env", None)
        if ctor is None:
            raise ValueError(f"PettingZooEnv: {task!r} has no {'parallel_env' if parallel else 'env'} constructor")
        self.task = task
        super().__init__(ctor(**dict(env_kwargs or {})), **wrapper_kwargs)

    @classmethod
    def _module(cls, task: str) -> Any:
        name = task.replace("/", ".")
        if name.startswith("mpe2."):
            candidates = [name]
        elif "." in name:
            candidates = [f"pettingzoo.{name}"]
            if name.startswith("mpe."):  # MPE moved to the mpe2 package (pip install mpe2)
                candidates.append("mpe2." + name[len("mpe."):])
        else:
            candidates = [f"pettingzoo.{f}.{name}" for f in cls.FAMILIES] + [f"mpe2.{name}"]
        errors = []
        for c in candidates:
            try:
                return importlib.import_module(c)
            except ImportError as err:
                errors.append(f"{c}: {err}")
        raise ValueError(
            f"PettingZooEnv: no PettingZoo task {task!r} (tried {', '.join(errors)}); extra packages of a "
            f"family install with pip install 'pettingzoo[<family>]'"
        )


# ---------------------------------------------------------------------- export
def _spec_to_space(spec: TensorSpec, name: str) -> Any:
    """The gymnasium space of ONE agent of a group spec ``[n_agents, *shape]``."""
    from .gym import _import_gymnasium

    spaces = _import_gymnasium().spaces
    if isinstance(spec, Categorical):
        return spaces.Discrete(spec.n)
    if isinstance(spec, OneHot):
        return spaces.Discrete(spec.shape[-1])
    np_dtype = torch.empty((), dtype=spec.dtype).numpy().dtype
    shape = tuple(spec.shape[1:])
    if isinstance(spec, Bounded):
        return spaces.Box(spec.low[0].cpu().numpy(), spec.high[0].cpu().numpy(), shape, np_dtype)
    if isinstance(spec, Unbounded):
        return spaces.Box(-np.inf, np.inf, shape, np_dtype)
    raise ValueError(f"to_pettingzoo: cannot export {name} with spec {type(spec).__name__} (Bounded, Unbounded, "
                     "Categorical and OneHot are supported)")


def _export_class() -> type:
    pz = _import_pettingzoo()

    class PettingZooParallelExport(pz.ParallelEnv):
        """A steersman multi-agent env (batch ``[]``) as a PettingZoo ``ParallelEnv``."""

        metadata = {"name": "steersman_export", "render_modes": []}

        def __init__(self, env: EnvBase) -> None:
            gmap = getattr(env, "group_map", None)
            if not isinstance(gmap, Mapping):
                raise TypeError(f"to_pettingzoo: {type(env).__name__} has no group_map (not a multi-agent env)")
            if tuple(env.batch_size) != ():
                raise ValueError(
                    f"to_pettingzoo: the env must be unbatched (batch_size []), got {list(env.batch_size)}; "
                    "build it with num_envs=None"
                )
            self.env = env
            self.group_map = {g: list(a) for g, a in gmap.items()}
            self.possible_agents = [a for agents in self.group_map.values() for a in agents]
            self.agents: list[str] = []
            self._where = {a: (g, i) for g, agents in self.group_map.items() for i, a in enumerate(agents)}
            self._obs_spaces = {}
            self._act_spaces = {}
            for g in self.group_map:
                ospec = env.full_observation_spec[g, "observation"]
                aspec = env.full_action_spec[g, "action"]
                o = _spec_to_space(ospec, f"({g!r}, 'observation')")
                a = _spec_to_space(aspec, f"({g!r}, 'action')")
                for agent in self.group_map[g]:
                    self._obs_spaces[agent], self._act_spaces[agent] = o, a
            self._has_state = "state" in env.full_observation_spec.keys()
            if self._has_state:
                self.state_space = _spec_to_space(env.full_observation_spec["state"].unsqueeze(0), "'state'")
            self._td: TensorDictBase | None = None

        def observation_space(self, agent: str) -> Any:
            return self._obs_spaces[agent]

        def action_space(self, agent: str) -> Any:
            return self._act_spaces[agent]

        def _split(self, td: TensorDictBase, key: str) -> dict[str, Any]:
            out = {}
            for g, agents in self.group_map.items():
                v = td.get((g, key)).detach().cpu().numpy()
                for i, a in enumerate(agents):
                    out[a] = v[i]
            return out

        def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
            if seed is not None:
                self.env.set_seed(seed)
            self._td = self.env.reset()
            self.agents = list(self.possible_agents)
            return self._split(self._td, "observation"), {a: {} for a in self.agents}

        def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
            if self._td is None or not self.agents:
                raise RuntimeError("to_pettingzoo: the episode is over (or not started): call reset() first")
            unknown = [a for a in actions if a not in self._where]
            if unknown:
                raise ValueError(f"to_pettingzoo: actions for unknown agent(s) {unknown}; agents: {self.possible_agents}")
            td = self._td
            for g, agents in self.group_map.items():
                spec = self.env.full_action_spec[g, "action"]
                act = spec.zero()
                for i, a in enumerate(agents):
                    if a in actions:
                        v = torch.as_tensor(np.asarray(actions[a]))
                        if isinstance(spec, OneHot):
                            v = torch.nn.functional.one_hot(v.long(), spec.shape[-1]).to(spec.dtype)
                        act[i] = v.to(act.dtype)
                td.set((g, "action"), act.to(self.env.device))
            td = self.env.step(td)
            nxt = td.get("next")
            obs = self._split(nxt, "observation")
            rew = {a: float(r.sum()) for a, r in self._split(nxt, "reward").items()}
            term = {a: bool(t.any()) for a, t in self._split(nxt, "terminated").items()}
            trunc = {a: bool(t.any()) for a, t in self._split(nxt, "truncated").items()}
            ended = bool(nxt.get("done").any())
            if ended:  # the episode of every agent ends with the root's
                root_term = bool(nxt.get("terminated").any())
                for a in self.possible_agents:
                    term[a] = term[a] or (root_term and not trunc[a])
                    trunc[a] = trunc[a] or not term[a]
            keep = [a for a in self.agents if not (term[a] or trunc[a])]
            live = set(self.agents)
            out = tuple({a: d[a] for a in d if a in live} for d in (obs, rew, term, trunc))
            self.agents = keep
            self._td = step_mdp(td, reward_keys=self.env.reward_keys, done_keys=self.env.done_keys,
                                action_keys=self.env.action_keys)
            info = {a: {} for a in live}
            return (*out, info)

        def state(self) -> np.ndarray:
            if not self._has_state or self._td is None:
                raise AttributeError("to_pettingzoo: the env has no 'state' entry (or no episode is running)")
            return self._td.get("state").detach().cpu().numpy()

        def close(self) -> None:
            self.env.close()

    return PettingZooParallelExport


def to_pettingzoo(env: EnvBase) -> Any:
    """A steersman multi-agent env (unbatched, with a ``group_map``) as a PettingZoo
    ``ParallelEnv``; PettingZoo's ``parallel_api_test`` passes on it.

    Agents are the env's (``group_map`` order); each agent's observation and action
    spaces come from its group's specs (``Bounded``/``Unbounded`` -> ``Box``,
    ``Categorical``/``OneHot`` -> ``Discrete``). All agents leave when the root
    ``"done"`` is set. ``state()`` returns the root ``"state"`` entry when there is one.

    Example:
        >>> from pettingzoo.test import parallel_api_test
        >>> from steersman.envs import NavigationEnv
        >>> from steersman.envs.libs.pettingzoo import to_pettingzoo
        >>> pz_env = to_pettingzoo(NavigationEnv(n_agents=2, max_steps=20, seed=0))
        >>> pz_env.possible_agents
        ['agent_0', 'agent_1']
        >>> obs, infos = pz_env.reset(seed=0)
        >>> obs["agent_0"].shape, pz_env.action_space("agent_0")
        ((8,), Box(-1.0, 1.0, (2,), float32))
        >>> parallel_api_test(pz_env, num_cycles=30)
        Passed Parallel API test
    """
    return _export_class()(env)
