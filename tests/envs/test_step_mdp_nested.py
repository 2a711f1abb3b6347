"""The nested-key fast path of ``EnvBase._step_mdp`` against the generic :func:`step_mdp`."""
from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.envs._mdp import _step_mdp_nested, exclusion_tree, step_mdp
from steersman.tensordict import TensorDict

NAMES = ["observation", "action", "reward", "done", "state", "h"]
GROUPS = ["agents", "team"]
SIZES = {"agents": 2, "team": 3}


@st.composite
def transitions(draw):
    """A transition with root entries, group sub-TensorDicts and a "next" of the same kinds."""
    b = draw(st.integers(1, 3))

    def entries(prefix_batch: list[int], depth: int) -> dict:
        out = {}
        for name in draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=4)):
            out[name] = torch.randn(*prefix_batch, 2)
        if depth < 2:
            for group in draw(st.lists(st.sampled_from(GROUPS), unique=True, max_size=2)):
                n = SIZES[group]  # a group has one size in the root and in "next"
                out[group] = TensorDict(entries([*prefix_batch, n], depth + 1), [*prefix_batch, n])
        return out

    root = entries([b], 0)
    root["next"] = TensorDict(entries([b], 0), [b])
    td = TensorDict(root, [b])
    keys = st.one_of(st.sampled_from(NAMES), st.tuples(st.sampled_from(GROUPS), st.sampled_from(NAMES)))
    rewards = draw(st.lists(keys, unique=True, min_size=1, max_size=3))
    actions = draw(st.lists(keys, unique=True, min_size=1, max_size=3))
    return td, rewards, actions


def _flat(td) -> dict:
    return {k: v for k, v in td.items(include_nested=True, leaves_only=True)}


@settings(max_examples=200, deadline=None)
@given(transitions())
def test_nested_fast_path_equals_step_mdp(case) -> None:
    td, rewards, actions = case
    excl_root = ["next", "_reset", *actions, *rewards]
    fast = _step_mdp_nested(td, exclusion_tree(excl_root), exclusion_tree(rewards))
    ref = step_mdp(td, reward_keys=rewards, action_keys=actions)
    assert fast is not None
    got, want = _flat(fast), _flat(ref)
    assert sorted(map(str, got)) == sorted(map(str, want))
    for key, value in want.items():
        assert got[key] is value or torch.equal(got[key], value), key
    for key, sub in ref.items(include_nested=True):
        if isinstance(sub, TensorDict):
            assert fast.get(key).batch_size == sub.batch_size, key
    assert fast.batch_size == td.batch_size


def test_exclusion_tree_drops_children_of_a_dropped_parent() -> None:
    assert exclusion_tree(["next", ("agents", "action"), "agents", ("agents", "reward")]) == {
        "next": None, "agents": None}
    assert exclusion_tree([("agents", "action"), ("agents", "reward"), "reward"]) == {
        "agents": {"action": None, "reward": None}, "reward": None}
