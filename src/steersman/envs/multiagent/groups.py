"""Agent groups: how a multi-agent env lays its agents out in TensorDicts.

A *group map* is a dict ``{group_name: [agent_name, ...]}``. Each group is one
sub-TensorDict of the transition, with batch dims ``[*env_batch, n_agents_in_group]``
(``(group, "observation")``, ``(group, "action")``, ``(group, "reward")`` ...), so that
agents of a group are processed together (one vmapped network call per group).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import Enum

__all__ = ["MarlGroupMapType", "check_marl_grouping"]


class MarlGroupMapType(Enum):
    """The two standard group maps (TorchRL's names).

    * ``ALL_IN_ONE_GROUP``: every agent in one group named ``"agents"``.
    * ``ONE_GROUP_PER_AGENT``: one group per agent, named after the agent.

    Example:
        >>> from steersman.envs import MarlGroupMapType
        >>> MarlGroupMapType.ALL_IN_ONE_GROUP.get_group_map(["a", "b"])
        {'agents': ['a', 'b']}
        >>> MarlGroupMapType.ONE_GROUP_PER_AGENT.get_group_map(["a", "b"])
        {'a': ['a'], 'b': ['b']}
    """

    ALL_IN_ONE_GROUP = 1
    ONE_GROUP_PER_AGENT = 2

    def get_group_map(self, agent_names: Sequence[str]) -> dict[str, list[str]]:
        """The group map of ``agent_names`` for this grouping."""
        if self is MarlGroupMapType.ALL_IN_ONE_GROUP:
            return {"agents": list(agent_names)}
        return {name: [name] for name in agent_names}


def check_marl_grouping(group_map: Mapping[str, Sequence[str]], agent_names: Sequence[str]) -> None:
    """Checks that ``group_map`` puts every agent of ``agent_names`` in exactly one group.

    Raises:
        ValueError: naming the group and agent at fault: an empty group, an agent that
            is not in the env, an agent named twice (in one or two groups), or an agent
            in no group. Nothing is modified.

    Example:
        >>> from steersman.envs import check_marl_grouping
        >>> check_marl_grouping({"team": ["a", "b"]}, ["a", "b"])   # silent when valid
        >>> try:
        ...     check_marl_grouping({"red": ["a"], "blue": ["a"]}, ["a", "b"])
        ... except ValueError as err:
        ...     print(err)
        group map: agent 'a' is named twice (in group 'red' and in group 'blue'); every agent must be in exactly one group
    """
    names = list(agent_names)
    if not names:
        raise ValueError("group map: the env has no agents (agent_names is empty)")
    if not isinstance(group_map, Mapping):
        raise TypeError(f"group map must be a dict {{group: [agent, ...]}}, got {type(group_map).__name__}")
    known = set(names)
    seen: dict[str, str] = {}
    for group, agents in group_map.items():
        if not isinstance(group, str):
            raise ValueError(f"group map: group names must be strings, got {group!r}")
        if isinstance(agents, str) or not isinstance(agents, Sequence):
            raise ValueError(
                f"group map: group {group!r} must list its agents (a list of names), got {agents!r}"
            )
        if len(agents) == 0:
            raise ValueError(f"group map: group {group!r} is empty; every group needs at least one agent")
        for agent in agents:
            if agent not in known:
                raise ValueError(
                    f"group map: agent {agent!r} of group {group!r} is not an agent of the env "
                    f"(agents: {names})"
                )
            if agent in seen:
                raise ValueError(
                    f"group map: agent {agent!r} is named twice (in group {seen[agent]!r} and in group "
                    f"{group!r}); every agent must be in exactly one group"
                )
            seen[agent] = group
    missing = [a for a in names if a not in seen]
    if missing:
        raise ValueError(
            f"group map: agent {missing[0]!r} is in no group (missing: {missing}; groups: "
            f"{ {g: list(a) for g, a in group_map.items()} })"
        )
