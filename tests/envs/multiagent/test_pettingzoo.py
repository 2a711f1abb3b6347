"""PettingZooWrapper / PettingZooEnv: classic AEC games, hand-written parallel envs whose
agents leave, die or join, and regression tests for TorchRL's bug classes
(pytorch/rl#2138, #3702, #2990; multi-process use)."""

from __future__ import annotations

import functools

import pytest
import torch

pytest.importorskip("pettingzoo")

from steersman import TensorDict  # noqa: E402
from steersman.collectors import MultiSyncDataCollector  # noqa: E402
from steersman.envs import (  # noqa: E402
    CartPoleEnv,
    InvalidActionError,
    MarlGroupMapType,
    NavigationEnv,
    ParallelEnv,
    PredatorPreyEnv,
    RewardSum,
    StepCounter,
    TransformedEnv,
    check_env_specs,
)
from steersman.envs.libs.pettingzoo import PettingZooEnv, PettingZooWrapper, to_pettingzoo  # noqa: E402

from ._pz_envs import ScriptedParallelEnv  # noqa: E402


def _legal(td):
    """A policy: the first legal action of every agent of group "player"."""
    td["player", "action"] = td["player", "action_mask"].to(torch.int64).argmax(-1)
    return td


# ---------------------------------------------------------------------- classic games (AEC)
@pytest.mark.parametrize("task, n_actions", [("classic/tictactoe_v3", 9), ("classic/connect_four_v3", 7)])
def test_classic_games_match_pettingzoo(task, n_actions):
    env = PettingZooEnv(task, parallel=False, seed=0)
    assert env.group_map == {"player": ["player_0", "player_1"]} or env.group_map == {
        "player": ["player_1", "player_2"]}
    check_env_specs(env)
    torch.manual_seed(0)
    ro = env.rollout(60)  # random legal moves (rand_action follows the action mask) until the end
    assert ro["next", "done"][-1].item() and not ro["next", "done"][:-1].any()
    assert ro["player", "action_mask"].shape[-1] == n_actions
    # exactly one agent acts per step, alternating
    mask = ro["player", "mask"]
    assert mask.sum(-1).eq(1).all() and torch.equal(mask[1:, 0], ~mask[:-1, 0])
    # replaying the moves in PettingZoo itself gives the same rewards
    raw = PettingZooEnv._module(task).env()
    raw.reset(seed=0)
    total = {a: 0.0 for a in raw.possible_agents}
    for t in range(ro.batch_size[0]):
        i = int(mask[t].to(torch.int64).argmax())
        assert raw.agent_selection == raw.possible_agents[i]
        obs = raw.observe(raw.agent_selection)
        assert torch.equal(ro["player", "observation"][t, i], torch.as_tensor(obs["observation"]))
        raw.step(int(ro["player", "action"][t, i]))
        for a, r in raw.rewards.items():
            total[a] += r
    got = ro["next", "player", "reward"].sum(0).squeeze(-1).tolist()
    assert got == [total[a] for a in raw.possible_agents]
    assert all(raw.terminations.values()) or all(raw.truncations.values())


def test_sisl_multiwalker_parallel_api():
    pytest.importorskip("Box2D")
    env = PettingZooEnv("sisl/multiwalker_v9", parallel=True, seed=0, use_mask=True, return_state=True,
                        env_kwargs={"n_walkers": 3, "max_cycles": 8})
    assert env.group_map == {"walker": ["walker_0", "walker_1", "walker_2"]}
    check_env_specs(env)
    ro = env.rollout(20, break_when_any_done=False)
    assert ro["walker", "observation"].shape == (20, 3, 31) and ro["state"].shape[0] == 20
    ends = ro["next", "done"].squeeze(-1).nonzero().squeeze(-1).tolist()
    assert ends and ends[0] <= 7  # a fall or the time limit (8 cycles) ends it; then a reset
    assert ro["walker", "mask"][ends[0] + 1].all()


def test_mpe_simple_tag_two_groups():
    pytest.importorskip("mpe2")
    env = PettingZooEnv("mpe/simple_tag_v3", parallel=True, seed=0, categorical_actions=False,
                        env_kwargs={"max_cycles": 5})
    assert env.group_map == {"adversary": ["adversary_0", "adversary_1", "adversary_2"], "agent": ["agent_0"]}
    check_env_specs(env)
    ro = env.rollout(7, break_when_any_done=False)
    assert ro["adversary", "action"].shape == (7, 3, 5) and ro["agent", "observation"].shape[:2] == (7, 1)
    assert ro["next", "truncated"].squeeze(-1).tolist() == [False] * 4 + [True] + [False] * 2


def test_aec_observes_only_the_acting_agent():
    """pytorch/rl#2990: the AEC wrapper observed every agent, not the acting one."""
    env = PettingZooEnv("classic/tictactoe_v3", parallel=False, seed=0)
    calls = []
    raw_observe = env.env.observe
    env.env.observe = lambda agent: calls.append(agent) or raw_observe(agent)
    td = env.reset()
    assert calls == [env.env.agent_selection]
    for _ in range(4):
        before = td["player", "observation"].clone()
        actor = int(td["player", "mask"].to(torch.int64).argmax())
        calls.clear()
        td = env.step(_legal(td))["next"]
        sel = env.env.agent_selection
        assert calls == [sel]  # one observe call, for the agent that acts next
        nxt = env.agent_names.index(sel)
        assert nxt != actor and td["player", "mask"].tolist() == [i == nxt for i in range(2)]
        # the waiting agent keeps its last observation
        assert torch.equal(td["player", "observation"][actor], before[actor])
        td = td.exclude("reward")


def test_illegal_move_refused_and_check_off():
    env = PettingZooEnv("classic/tictactoe_v3", parallel=False, seed=0)
    td = env.reset()
    td["player", "action"] = torch.tensor([4, 0])
    td = env.step(td)["next"]
    board = list(env.env.unwrapped.board.squares)
    td["player", "action"] = torch.tensor([4, 4])  # player 2 takes the taken centre
    with pytest.raises(InvalidActionError, match="'player', 'action'"):
        env.step(td)
    assert list(env.env.unwrapped.board.squares) == board
    # check off: PettingZoo's own rule applies (its illegal-move wrapper ends the game, -1)
    env.check = False
    out = env.step(td)["next"]
    assert out["done"].item() and out["player", "reward"][1].item() == -1


# ---------------------------------------------------------------------- agents that leave (rl#2138)
@pytest.mark.parametrize("final_dicts", ["full", "empty"])
@pytest.mark.parametrize("done_on_any", [False, True])
def test_agent_list_empties_env_is_reset(final_dicts, done_on_any):
    """pytorch/rl#2138: an env whose agent list empties at the end was never reset."""
    pz = ScriptedParallelEnv(n=3, leave={"a_0": 2}, final=4, final_dicts=final_dicts)
    env = PettingZooWrapper(pz, done_on_any=done_on_any, use_mask=True)
    check_env_specs(env)
    ro = env.rollout(12, break_when_any_done=False)
    done = ro["next", "done"].squeeze(-1)
    if done_on_any:  # a_0 leaving at step 2 ends the episode
        assert done.nonzero().squeeze(-1).tolist() == [1, 3, 5, 7, 9, 11]
    else:  # the agent list empties at step 4
        assert done.nonzero().squeeze(-1).tolist() == [3, 7, 11]
    # after each end the env starts afresh: t == 0 in the observations
    starts = [0] + [i + 1 for i in done.nonzero().squeeze(-1).tolist() if i + 1 < 12]
    for s in starts:
        assert ro["a", "observation"][s, :, 0].eq(0).all() or ro["a", "observation"][s, :2, 0].eq(0).all()
    assert all(set(a) <= set(pz.possible_agents) for a in pz.actions_seen)


# ---------------------------------------------------------------------- agents that die / join (rl#3702)
def test_dying_and_joining_agents_with_action_masks():
    """pytorch/rl#3702: KeyError in action masks when an agent is removed."""
    pz = ScriptedParallelEnv(n=3, leave={"a_1": 2}, join={"a_2": 3}, final=6)
    env = PettingZooWrapper(pz, use_mask=True, done_on_any=False, return_state=False)
    check_env_specs(env)
    pz.actions_seen.clear()
    ro = env.rollout(6)
    g = ro["a"]
    # a_1 is active for steps 0-1 (it leaves at step 2), a_2 from step 3 on
    assert g["mask"][:, 1].tolist() == [True, True, False, False, False, False]
    assert g["mask"][:, 2].tolist() == [False, False, False, True, True, True]
    done1 = ro["next", "a", "done"][:, 1, 0].tolist()
    assert done1 == [False, True, True, True, True, True]
    assert not ro["next", "a", "done"][:5, 2].any()  # not done before (or after) joining
    # absent agents: reward 0, all-True action mask, last observation kept
    assert ro["next", "a", "reward"][2:, 1].eq(0).all() and ro["next", "a", "reward"][:3, 2].eq(0).all()
    assert ro["a", "action_mask"][2:, 1].all() and ro["a", "action_mask"][:3, 2].all()
    assert torch.equal(ro["a", "observation"][3, 1], ro["a", "observation"][2, 1])
    # present agents: PettingZoo's mask (action t % 3 forbidden) and only legal actions were drawn
    for t in range(6):
        assert ro["a", "action_mask"][t, 0].tolist() == [i != t % 3 for i in range(3)]
    # PettingZoo got actions for the present agents only (its step asserts it)
    assert [sorted(a) for a in pz.actions_seen] == [["a_0", "a_1"], ["a_0", "a_1"], ["a_0"],
                                                    ["a_0", "a_2"], ["a_0", "a_2"], ["a_0", "a_2"]]
    assert ro["next", "done"].squeeze(-1).tolist() == [False] * 5 + [True]


def test_one_group_per_agent_and_reward_sum():
    pz = ScriptedParallelEnv(n=2, leave={"a_0": 2}, final=3)
    env = TransformedEnv(PettingZooWrapper(pz, group_map=MarlGroupMapType.ONE_GROUP_PER_AGENT,
                                           done_on_any=False),
                         RewardSum(in_keys=[("a_0", "reward"), ("a_1", "reward")]))
    assert env.base_env.group_map == {"a_0": ["a_0"], "a_1": ["a_1"]}
    check_env_specs(env)
    ro = env.rollout(3)
    r = ro["next", "a_1", "reward"].squeeze(-1).squeeze(-1)
    assert torch.allclose(ro["next", "a_1", "episode_reward"].squeeze(-1).squeeze(-1), r.cumsum(0))


# ---------------------------------------------------------------------- bad input
def test_unknown_agent_is_a_clear_error_state_unchanged():
    pz = ScriptedParallelEnv(n=2, final=5, intruder=2)
    env = PettingZooWrapper(pz)
    td = env.rand_step(env.reset())["next"]
    obs = {k: v.clone() for k, v in env._obs.items()}
    with pytest.raises(ValueError, match="'intruder'.*in no group") as err:
        env.rand_step(td)
    assert "a_0" in str(err.value)
    assert all(torch.equal(obs[k], env._obs[k]) for k in obs)


@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "aec"])
def test_mask_hiding_every_action_of_an_acting_agent(parallel):
    """The error names the agent and its group, and the wrapper's buffers and done flags
    are those of the last good step (turn-based: when that agent's turn comes)."""
    from pettingzoo.utils.conversions import parallel_to_aec

    pz = ScriptedParallelEnv(n=2, final=5, no_legal_move=2)
    env = PettingZooWrapper(pz if parallel else parallel_to_aec(pz))
    td = env.reset()
    with pytest.raises(ValueError, match="'a_0' \\(group 'a'\\) allows no action.*state is unchanged"):
        for _ in range(8):  # parallel: step 2; AEC: a_0's turn after 2 rounds
            before = ({k: v.clone() for k, v in env._obs.items()}, {k: v.clone() for k, v in env._amask.items()},
                      dict(env._term), dict(env._trunc), set(env._seen))
            td = env.rand_step(td)["next"]
    after = (env._obs, env._amask, env._term, env._trunc, env._seen)
    for b, a in zip(before[:2], after[:2]):
        assert b.keys() == a.keys() and all(torch.equal(b[k], a[k]) for k in b)
    assert before[2:] == after[2:]


def test_bad_group_map_and_wrong_agent_dim():
    with pytest.raises(ValueError, match="'a_1'.*twice"):
        PettingZooWrapper(ScriptedParallelEnv(n=2), group_map={"x": ["a_0", "a_1"], "y": ["a_1"]})
    with pytest.raises(ValueError, match="'a_1'.*no group"):
        PettingZooWrapper(ScriptedParallelEnv(n=2), group_map={"x": ["a_0"]})
    env = PettingZooWrapper(ScriptedParallelEnv(n=3))
    td = env.reset()
    td["a"] = TensorDict({"action": torch.zeros(2, dtype=torch.int64)}, batch_size=[2])
    with pytest.raises(InvalidActionError, match=r"group 'a'.*shape \[2\], expected \[3\]"):
        env.step(td)
    assert env.env.actions_seen == []
    with pytest.raises(TypeError, match="ParallelEnv or AECEnv"):
        PettingZooWrapper(object())
    with pytest.raises(ValueError, match="no PettingZoo task"):
        PettingZooEnv("classic/no_such_game_v0")


# ---------------------------------------------------------------------- multi-process (rl#2180 class)
make_ttt = functools.partial(PettingZooEnv, "classic/tictactoe_v3", parallel=False, seed=0)


def test_pettingzoo_in_parallel_env_and_multisync_collector():
    env = ParallelEnv(2, make_ttt)
    try:
        ro = env.rollout(12, policy=_legal, break_when_any_done=False)
        assert ro["player", "observation"].shape == (2, 12, 2, 3, 3, 2)
        assert ro["next", "done"].any(1).all()  # the first-legal-move game ends; each worker resets
        done_at = ro["next", "done"][0].squeeze(-1).nonzero().squeeze(-1)
        assert ro["player", "observation"][0, done_at[0] + 1].eq(0).all()  # a fresh board
    finally:
        env.close()
    col = MultiSyncDataCollector([make_ttt, make_ttt], _legal, frames_per_batch=20, total_frames=40)
    try:
        b = next(iter(col))
    finally:
        col.shutdown()
    assert b["player", "action_mask"].shape[-2:] == (2, 9)
    acted = b["player", "action"].gather(-1, b["player", "mask"].to(torch.int64).argmax(-1, keepdim=True))
    legal = b["player", "action_mask"].gather(-1, b["player", "action"].unsqueeze(-1)).squeeze(-1)
    assert legal.all() and acted.numel() == 20


# ---------------------------------------------------------------------- export
@pytest.mark.parametrize("make", [
    functools.partial(NavigationEnv, n_agents=3, max_steps=15),
    functools.partial(PredatorPreyEnv, n_agents=2, max_steps=12, categorical_actions=True),
], ids=["navigation", "predator_prey_cat"])
def test_to_pettingzoo_passes_parallel_api_test(make, recwarn):
    from pettingzoo.test import parallel_api_test

    pz_env = to_pettingzoo(make(seed=0))
    parallel_api_test(pz_env, num_cycles=40)
    assert not [w for w in recwarn if "agent" in str(w.message).lower()], [str(w.message) for w in recwarn]
    assert pz_env.state().shape == pz_env.state_space.shape


def test_to_pettingzoo_round_trip_matches_the_env():
    direct = NavigationEnv(n_agents=2, max_steps=6, seed=4)
    back = PettingZooWrapper(to_pettingzoo(NavigationEnv(n_agents=2, max_steps=6, seed=4)),
                             group_map={"agents": ["agent_0", "agent_1"]}, categorical_actions=False)
    td_a, td_b = direct.reset(), back.reset()
    g = torch.Generator().manual_seed(0)
    for t in range(6):
        assert torch.allclose(td_a["agents", "observation"], td_b["agents", "observation"])
        a = torch.rand(2, 2, generator=g) * 2 - 1
        td_a["agents", "action"], td_b["agents", "action"] = a, a.clone()
        na, nb = direct.step(td_a)["next"], back.step(td_b)["next"]
        assert torch.allclose(na["agents", "reward"], nb["agents", "reward"])
        assert na["done"].item() == nb["done"].item() == (t == 5)
        td_a, td_b = na.exclude(("agents", "reward")), nb.exclude(("agents", "reward"))


def test_to_pettingzoo_refuses_batched_and_single_agent_envs():
    with pytest.raises(ValueError, match="unbatched"):
        to_pettingzoo(NavigationEnv(2))
    with pytest.raises(TypeError, match="group_map"):
        to_pettingzoo(CartPoleEnv())


def test_transformed_env_does_not_reset_when_one_agent_dies():
    """Resets follow the root "done" when the env has one (not a group's: one agent may die)."""
    pz = ScriptedParallelEnv(n=3, leave={"a_1": 2}, final=6)
    env = TransformedEnv(PettingZooWrapper(pz, use_mask=True, done_on_any=False), StepCounter())
    ro = env.rollout(8, break_when_any_done=False)
    assert ro["next", "step_count"].squeeze(-1).tolist() == [1, 2, 3, 4, 5, 6, 1, 2]
