"""``MCTSForest`` / ``Tree`` (TorchRL's torchrl.data.map.tree): TorchRL's documented examples
ported (rollouts of a native env branching at the root and mid-rollout, rebuilt trees,
paths equal to the stored rollouts, ``to_string``), a property test against a plain
prefix-tree reference, the Tree API, and bad input."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.data import MCTSForest, Tree
from steersman.data.map import MCTSForest as MapForest
from steersman.envs import PendulumEnv, TicTacToeEnv
from steersman.tensordict import TensorDict


def _assert_steps_equal(a, b):
    """Every entry of ``b`` equals ``a``'s (the forest may store more entries)."""
    assert a.batch_size == b.batch_size
    for key in b.keys(True, True):
        assert torch.equal(a.get(key), b.get(key)), key


def test_exported_from_data_and_data_map():
    assert MCTSForest is MapForest and Tree.__name__ == "Tree"


def test_to_string_example():
    """TorchRL's ``to_string`` example: one step at a time, paths and observations."""
    forest = MCTSForest()
    td_root = TensorDict({"observation": torch.tensor(0)}, [])
    rollouts_data = [
        [(3, 123), (1, 456)],
        [(2, 359), (2, 3094)],
        [(3, 123), (9, 392), (6, 989), (20, 809), (21, 847)],
        [(1, 75)],
        [(3, 123), (0, 948)],
        [(2, 359), (2, 3094), (10, 68)],
        [(2, 359), (2, 3094), (11, 9045)],
    ]
    for rollout_data in rollouts_data:
        td = td_root.clone().unsqueeze(0)
        for action, obs in rollout_data:
            td = td.update(TensorDict({"action": torch.tensor([action]),
                                       "next": TensorDict({"observation": torch.tensor([obs])}, [1])}, [1]))
            forest.extend(td)
            td = td["next"].clone()
    expected = ["(0,) {'observation': tensor(123)}",
                " (0, 0) {'observation': tensor(456)}",
                " (0, 1) {'observation': tensor(847)}",
                " (0, 2) {'observation': tensor(948)}",
                "(1,) {'observation': tensor(3094)}",
                " (1, 0) {'observation': tensor(68)}",
                " (1, 1) {'observation': tensor(9045)}",
                "(2,) {'observation': tensor(75)}"]
    assert forest.to_string(td_root).split("\n") == expected
    assert len(forest) == 12  # distinct (observation, action) steps
    tree = forest.get_tree(td_root)
    assert tree.subtree[1].rollout["action"].tolist() == [2, 2]  # 359 has one branch: merged
    assert tree.to_string(lambda t: int(t.node_id)).split("\n")[0] == "(0,) 1"


def test_extend_example():
    """TorchRL's ``extend`` example: two rollouts sharing two steps."""
    forest = MCTSForest()
    r0 = TensorDict({"action": torch.tensor([1, 2, 3, 4, 5]),
                     "next": {"observation": torch.tensor([123, 392, 989, 809, 847])},
                     "observation": torch.tensor([0, 123, 392, 989, 809])}, [5])
    r1 = TensorDict({"action": torch.tensor([1, 2, 6, 7]),
                     "next": {"observation": torch.tensor([123, 392, 235, 38])},
                     "observation": torch.tensor([0, 123, 392, 235])}, [4])
    forest.extend(r0)
    forest.extend(r1)
    tree = forest.get_tree(r0[0].exclude("next"))
    assert tree.node_id == 0 and tree.hash is None and tree.num_children == 2
    assert tree.rollout.batch_size == (2,) and tree.index.tolist() == [2, 5]
    assert tree.subtree.node_id == [1, 2] and len(set(tree.subtree.hash)) == 2
    assert tree.subtree.count.tolist() == [0, 0] and tree.count.dtype == torch.int32
    for path, rollout in (((0,), r0), ((1,), r1)):
        _assert_steps_equal(tree.rollout_from_path(path), rollout)
    assert tree.selected_actions.tolist() == [3, 6]
    assert tree.subtree[0].branching_action.item() == 3 and tree.subtree[0].prev_action.item() == 5
    assert tree.subtree[1].node_observation.item() == 38
    assert forest.node_map[r0[:1].select("observation")]["count"].tolist() == [2]  # two steps left obs 0


def _pendulum_rollouts():
    """TorchRL's class example with the native Pendulum: two 6-step rollouts from one reset
    state (random actions: they branch at the root), a third from step 3 of the second."""
    env = PendulumEnv()
    env.set_seed(0)
    reset = env.reset()
    state = env.get_state()
    rollout0 = env.rollout(6, auto_reset=False, tensordict=reset.clone())
    env.set_state(state)
    head = env.rollout(3, auto_reset=False, tensordict=reset.clone())
    mid_state = env.get_state()
    tail = env.rollout(3, auto_reset=False, tensordict=head[-1]["next"].exclude("reward").clone())
    rollout1 = torch.cat([head, tail])
    env.set_state(mid_state)
    rollout1b = env.rollout(6, auto_reset=False, tensordict=rollout1[3].exclude("next", "action").clone())
    return rollout0, rollout1, rollout1b


def test_native_env_rollouts_branch_and_rebuild():
    rollout0, rollout1, rollout1b = _pendulum_rollouts()
    forest = MCTSForest()
    forest.extend(rollout0)
    assert len(forest) == 6
    forest.extend(rollout1)
    assert len(forest) == 12
    forest.extend(rollout1b)
    assert len(forest) == 18
    forest.extend(rollout1)  # already stored: nothing changes
    assert len(forest) == 18
    tree = forest.get_tree(rollout0[0])
    assert tree.max_length() == 2 and list(tree.valid_paths()) == [(0,), (1, 0), (1, 1)]
    _assert_steps_equal(torch.cat([tree.subtree[1].rollout, tree.subtree[1].subtree[0].rollout]), rollout1)
    _assert_steps_equal(tree.rollout_from_path((1, 0)), rollout1)
    _assert_steps_equal(tree.rollout_from_path((0,)), rollout0)
    _assert_steps_equal(tree.rollout_from_path((1, 1)), torch.cat([rollout1[:3], rollout1b]))
    full = forest.get_tree(rollout0[0], compact=False)
    assert full.max_length() == 9
    assert list(full.valid_paths()) == [(0, 0, 0, 0, 0, 0), (1, 0, 0, 0, 0, 0), (1, 0, 0, 1, 0, 0, 0, 0, 0)]
    _assert_steps_equal(full.rollout_from_path((1, 0, 0, 0, 0, 0)), rollout1)
    assert all(v.rollout is None or v.rollout.shape == (1,) for v in full.vertices(key_type="id").values())
    assert full.num_vertices() == 18 + 1 and tree.num_vertices() == 5
    # a tree from a vertex inside a rollout; a batched rollout [B, T] stores its rows
    inner = forest.get_tree(rollout1[3])
    assert inner.num_children == 2 and inner.rollout is None
    batched = MCTSForest()
    batched.extend(torch.stack([rollout0, rollout1]))
    assert len(batched) == 12 and list(batched.get_tree(rollout0[0]).valid_paths()) == [(0,), (1,)]


def test_tictactoe_first_moves_branch_at_the_root_and_terminal_flags():
    env = TicTacToeEnv()
    forest = MCTSForest()
    forest.get_keys_from_env(env)
    assert forest.action_keys == ["action"] and "observation" in forest.observation_keys
    forest.observation_keys = "observation"
    games = {(0, 3, 1, 4, 2): True, (0, 3, 1, 4, 8): False, (4,): False}  # the first ends in a win
    for moves in games:
        td = env.reset()
        steps = []
        for move in moves:
            td["action"] = torch.tensor(move)
            step = env.step(td)
            steps.append(step.clone())
            td = step["next"].exclude("reward").clone()
        forest.extend(torch.stack(steps))
    tree = forest.get_tree(env.reset())
    assert tree.num_children == 2 and tree.selected_actions.tolist() == [0, 4]
    prefix = tree.subtree[0]
    assert prefix.rollout["action"].tolist() == [0, 3, 1, 4] and prefix.num_children == 2
    assert [bool(c.is_terminal) for c in prefix.subtree] == [True, False]
    assert not prefix.is_terminal and tree.is_terminal is False
    assert not tree.fully_expanded(env)
    with pytest.raises(ValueError, match="no discrete action spec"):
        tree.fully_expanded(PendulumEnv())


def test_max_depth_add_return_node_and_excluded_keys():
    forest = MCTSForest(excluded_keys=["secret"])
    steps = [(0, a, 10 + a) for a in range(3)] + [(10, 0, 20), (10, 1, 21), (20, 0, 30), (20, 1, 31)]
    for obs, action, nxt in steps:
        node = forest.add(TensorDict({"observation": torch.tensor(obs), "action": torch.tensor(action),
                                      "secret": torch.tensor(1.0),
                                      "next": {"observation": torch.tensor(nxt), "secret": torch.tensor(2.0)}}, []),
                          return_node=True)
    assert isinstance(node, Tree) and node.node_data["observation"].item() == 20
    root = TensorDict({"observation": torch.tensor(0)}, [])
    assert forest.get_tree(root).max_length() == 3
    assert forest.get_tree(root, max_depth=0).max_length() == 1  # the root and its children
    assert forest.get_tree(root, max_depth=1).max_length() == 2
    stored = forest.get_child(TensorDict({"observation": torch.tensor([10]), "action": torch.tensor([1])}, [1]))
    assert stored["next", "observation"].tolist() == [21] and "secret" not in stored.keys(True, True)
    assert ("next", "secret") not in stored.keys(True, True)


def _dag_forest():
    forest = MCTSForest()
    rows = [(0, 1, 1), (0, 2, 1), (1, 3, 2)]  # two actions reach observation 1, then one step
    for obs, action, nxt in rows:
        forest.add(TensorDict({"observation": torch.tensor(obs), "action": torch.tensor(action),
                               "next": {"observation": torch.tensor(nxt),
                                        "done": torch.tensor([nxt == 2])}}, []))
    return forest


def test_tree_api_on_a_shared_vertex():
    tree = _dag_forest().get_tree(TensorDict({"observation": torch.tensor(0)}, []), compact=False)
    a, b = tree.subtree
    assert a.subtree[0] is b.subtree[0]  # one vertex reached through two parents
    shared = a.subtree[0]
    assert tree.num_vertices() == 4 and tree.num_vertices(count_repeat=True) == 5
    assert tree.edges() == [(0, 1), (0, 2), (1, 3), (2, 3)]
    assert list(tree.valid_paths()) == [(0, 0), (1, 0)]
    assert set(tree.vertices(key_type="id")) == {0, 1, 2, 3}
    assert set(tree.vertices(key_type="path")) == {(), (0,), (1,), (0, 0), (1, 0)}
    assert set(tree.vertices()) == {None, a.hash, b.hash, shared.hash}
    assert tree.get_vertex_by_id(3) is shared and tree.get_vertex_by_hash(b.hash) is b
    assert shared in tree and isinstance(shared.parent, list) and set(map(id, shared.parent)) == {id(a), id(b)}
    assert a.parent is tree and tree.parent is None
    assert bool(shared.is_terminal) and not bool(a.is_terminal)
    tree.visits = 7
    assert tree.count.item() == 7 and tree.visits.item() == 7
    with pytest.raises(ValueError, match="no vertex has node_id 9"):
        tree.get_vertex_by_id(9)
    with pytest.raises(IndexError, match="index 2 where the vertex has 1 children"):
        tree.rollout_from_path((0, 2))
    graph = tree.to_networkx()
    assert sorted(graph.nodes) == [0, 1, 2, 3] and sorted(graph.edges) == [(0, 1), (0, 2), (1, 3), (2, 3)]
    assert tree.plot(backend="networkx").number_of_edges() == 4
    import matplotlib
    matplotlib.use("Agg")
    fig = tree.plot(make_labels=lambda t: f"id={t.node_id}")
    assert [t.get_text() for t in fig.axes[0].texts] == ["id=0", "id=1", "id=2", "id=3"]
    with pytest.raises(ValueError, match="backend must be 'matplotlib' or 'networkx'"):
        tree.plot(backend="plotly")


# ---------------------------------------------------------------- against a plain prefix tree
def _prefix_obs(prefix: tuple[int, ...], t_max: int) -> torch.Tensor:
    return torch.tensor(list(prefix) + [-1] * (t_max - len(prefix)))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=4), min_size=1, max_size=5),
       st.booleans())
def test_paths_are_the_stored_rollouts(sequences, compact):
    """A deterministic env whose observation is the list of actions so far: the forest's
    paths are exactly the stored action sequences that no other one extends, each
    rebuilt step for step; the vertices are the branching points and ends."""
    t_max = 4
    forest = MCTSForest()
    for seq in sequences:
        obs = torch.stack([_prefix_obs(tuple(seq[:t]), t_max) for t in range(len(seq))])
        nxt = torch.stack([_prefix_obs(tuple(seq[:t + 1]), t_max) for t in range(len(seq))])
        forest.extend(TensorDict({"observation": obs, "action": torch.tensor(seq),
                                  "next": {"observation": nxt, "reward": torch.ones(len(seq), 1)}}, [len(seq)]))
    steps = {tuple(s[:t + 1]) for s in sequences for t in range(len(s))}
    assert len(forest) == len(steps)
    maximal = {s for s in map(tuple, sequences) if not any(o != s and o[:len(s)] == s for o in steps)}
    tree = forest.get_tree(TensorDict({"observation": _prefix_obs((), t_max)}, []), compact=compact)
    got = set()
    for path in tree.valid_paths():
        rollout = tree.rollout_from_path(path)
        actions = tuple(rollout["action"].tolist())
        got.add(actions)
        assert torch.equal(rollout["observation"],
                           torch.stack([_prefix_obs(actions[:t], t_max) for t in range(len(actions))]))
    assert got == maximal
    children: dict[tuple[int, ...], set[int]] = {}  # prefix -> distinct next actions
    for s in steps:
        children.setdefault(s[:-1], set()).add(s[-1])
    branching = {p for p, c in children.items() if len(c) > 1}
    # a root with one branch holds the steps up to the first branching point or end itself
    merged = len(children[()]) == 1
    end = ()  # where the root's vertex ends: the first prefix with other than one branch
    while len(children.get(end, ())) == 1:
        end = (*end, next(iter(children[end])))
    if compact:  # the root (up to `end`), a vertex per other branching point and per other end
        assert tree.num_vertices() == 1 + len(branching - {end}) + len(maximal - {end})
    else:  # a vertex per step (the root holds the first step when merged)
        assert tree.num_vertices() == 1 + len(steps) - merged
        assert tree.max_length() == max(map(len, maximal)) - merged
    assert len(tree.edges()) == tree.num_vertices() - 1


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(("drop", "message"), [
    ("observation", "the rollout has no entry 'observation'"),
    ("action", "the rollout has no entry 'action'"),
    (("next", "observation"), "the rollout has no entry ('next', 'observation')"),
    ("next", "the rollout has no 'next' TensorDict"),
])
def test_rollout_missing_a_key_names_it_and_stores_nothing(drop, message):
    forest = MCTSForest()
    good = TensorDict({"observation": torch.tensor([0, 1]), "action": torch.tensor([1, 1]),
                       "next": {"observation": torch.tensor([1, 2])}}, [2])
    forest.extend(good)
    with pytest.raises(KeyError) as info:
        forest.extend(good.exclude(drop))
    assert message in info.value.args[0]
    assert len(forest) == 2


def test_bad_queries():
    forest = MCTSForest()
    root = TensorDict({"observation": torch.tensor(0)}, [])
    with pytest.raises(RuntimeError, match="the forest is empty"):
        forest.get_tree(root)
    with pytest.raises(TypeError, match="expected a TensorDict of steps, got list"):
        forest.extend([1, 2])
    with pytest.raises(ValueError, match="observation_keys must be a key or a list of keys"):
        MCTSForest(observation_keys=3)
    forest.extend(TensorDict({"observation": torch.tensor([0, 1]), "action": torch.tensor([0, 0]),
                              "next": {"observation": torch.tensor([1, 0])}}, [2]))  # 0 -> 1 -> 0
    with pytest.raises(ValueError, match="form a cycle"):
        forest.get_tree(root)
    with pytest.raises(KeyError, match="no stored step leaves the root's observation"):
        forest.get_tree(TensorDict({"observation": torch.tensor(5)}, []))
    with pytest.raises(KeyError, match="the root has no entry 'observation'"):
        forest.get_tree(TensorDict({"obs": torch.tensor(0)}, []))
