"""Hand-written PettingZoo parallel envs for the wrapper tests (agents that leave, die,
join, or that are not in the spec)."""

from __future__ import annotations

import functools

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class ScriptedParallelEnv(ParallelEnv):
    """Agents ``a_0 .. a_{n-1}``; observation ``[t, agent index, 1]`` as float32 plus an
    action mask (action ``t % 3`` is forbidden); reward = the action taken.

    ``leave``: ``{agent: step}``: the agent terminates at that step (and is removed
    from ``agents`` after it). ``join``: ``{agent: step}``: the agent is absent until
    that step. ``final``: the last step of an episode (every agent truncated and
    removed: the agent list empties). ``final_dicts``: ``"full"`` (the last step's
    dicts name every remaining agent) or ``"empty"`` (they are empty). ``intruder``:
    a step at which an agent not in ``possible_agents`` is observed. ``no_legal_move``:
    a step after which the first agent's action mask allows nothing. ``step`` asserts
    that it gets actions for exactly the present agents.
    """

    metadata = {"name": "scripted_v0"}

    def __init__(self, n: int = 3, leave=None, join=None, final: int = 6, final_dicts: str = "full",
                 intruder: int | None = None, no_legal_move: int | None = None):
        self.possible_agents = [f"a_{i}" for i in range(n)]
        self.leave, self.join = dict(leave or {}), dict(join or {})
        self.final, self.final_dicts, self.intruder = final, final_dicts, intruder
        self.no_legal_move = no_legal_move
        self.actions_seen: list[dict] = []

    @functools.cache  # noqa: B019 (PettingZoo's own idiom)
    def observation_space(self, agent):
        return spaces.Dict({"observation": spaces.Box(-100, 100, (3,), np.float32),
                            "action_mask": spaces.Box(0, 1, (3,), np.int8)})

    @functools.cache  # noqa: B019
    def action_space(self, agent):
        return spaces.Discrete(3)

    def _obs(self, agent):
        mask = np.ones(3, np.int8)
        mask[self.t % 3] = 0
        if self.t == self.no_legal_move and agent == self.possible_agents[0]:
            mask[:] = 0
        return {"observation": np.array([self.t, self.possible_agents.index(agent), 1], np.float32),
                "action_mask": mask}

    def reset(self, seed=None, options=None):
        self.t = 0
        self.agents = [a for a in self.possible_agents if self.join.get(a, 0) <= 0]
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), (sorted(actions), self.agents)
        self.actions_seen.append(dict(actions))
        self.t += 1
        t = self.t
        rew = {a: float(actions[a]) for a in self.agents}
        term = {a: self.leave.get(a) == t for a in self.agents}
        trunc = {a: t >= self.final for a in self.agents}
        obs = {a: self._obs(a) for a in self.agents}
        if self.intruder == t:
            obs["intruder"] = self._obs(self.agents[0])
        self.agents = [a for a in self.agents if not (term[a] or trunc[a])]
        for a, when in self.join.items():
            if when == t:
                self.agents.append(a)
                obs[a] = self._obs(a)
        if t >= self.final and self.final_dicts == "empty":
            return {}, {}, {}, {}, {}
        return obs, rew, term, trunc, {a: {} for a in obs}
