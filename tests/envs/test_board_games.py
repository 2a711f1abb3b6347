"""Batched native board games: TicTacToeEnv and ConnectFourEnv."""

from __future__ import annotations

import pytest
import torch

from steersman.envs import (
    ConnectFourEnv,
    InvalidActionError,
    TicTacToeEnv,
    check_env_specs,
    step_mdp,
)

GAMES = [TicTacToeEnv, ConnectFourEnv]


def play(env, moves):
    """Plays the same move sequence on every board; returns the list of "next" tds."""
    td = env.reset()
    out = []
    for a in moves:
        td["action"] = torch.full(env.batch_size, a, dtype=torch.int64)
        td = env.step(td)
        out.append(td["next"].clone())
        td = step_mdp(td)
    return out


@pytest.mark.parametrize("cls", GAMES)
@pytest.mark.parametrize("batch_size", [[], [4], [2, 3]])
def test_check_env_specs(cls, batch_size):
    env = cls(batch_size=batch_size)
    check_env_specs(env, seed=0, max_steps=60)  # several games, finished boards auto-reset
    td = env.reset()
    assert td["action_mask"].all() and (td["current_player"] == 0).all()
    assert td["observation"].shape == (*batch_size, 2, env.rows, env.cols)


@pytest.mark.parametrize(("moves", "line"), [
    ((0, 3, 1, 4, 2), "top row"),
    ((0, 1, 3, 2, 6), "left column"),
    ((0, 1, 4, 2, 8), "main diagonal"),
    ((2, 0, 4, 1, 6), "anti-diagonal"),
])
def test_tictactoe_first_player_wins(moves, line):
    steps = play(TicTacToeEnv(batch_size=[2]), moves)
    for t, nxt in enumerate(steps):
        last = t == len(moves) - 1
        assert nxt["terminated"].all() == last, (line, t)
        assert (nxt["reward"] == float(last)).all(), (line, t)
        assert (nxt["current_player"] == (t + 1) % 2).all()
    board = steps[-1]["board"][0].flatten()
    assert board[list(moves[::2])].tolist() == [1, 1, 1] and board[list(moves[1::2])].tolist() == [-1, -1]


def test_tictactoe_second_player_wins_and_is_rewarded():
    steps = play(TicTacToeEnv(), (0, 3, 1, 4, 8, 5))  # O completes the middle row
    assert steps[-1]["terminated"].item() and steps[-1]["reward"].item() == 1.0
    assert steps[-2]["reward"].item() == 0.0 and not steps[-2]["terminated"].item()


def test_tictactoe_draw():
    # X O X / X O O / O X X : a full board without a line
    steps = play(TicTacToeEnv(batch_size=[3]), (0, 1, 2, 4, 3, 5, 7, 6, 8))
    assert all(not s["terminated"].any() for s in steps[:-1])
    assert steps[-1]["terminated"].all() and (steps[-1]["reward"] == 0).all()
    assert not steps[-1]["action_mask"].any()


@pytest.mark.parametrize(("moves", "kind"), [
    ((0, 1, 0, 1, 0, 1, 0), "vertical"),
    ((0, 0, 1, 1, 2, 2, 3), "horizontal"),
    ((0, 1, 1, 2, 2, 3, 2, 3, 3, 6, 3), "diagonal /"),
    ((6, 5, 5, 4, 4, 3, 4, 3, 3, 0, 3), "diagonal \\"),
])
def test_connect_four_wins(moves, kind):
    steps = play(ConnectFourEnv(batch_size=[2]), moves)
    for t, nxt in enumerate(steps):
        last = t == len(moves) - 1
        assert nxt["terminated"].all() == last, (kind, t)
        assert (nxt["reward"] == float(last)).all(), (kind, t)


def test_connect_four_gravity_and_full_column_refused():
    env = ConnectFourEnv(batch_size=[2])
    steps = play(env, (3, 3, 3, 3, 3, 3))
    assert steps[-1]["board"][0, :, 3].tolist() == [1, -1, 1, -1, 1, -1]  # row 0 is the bottom
    assert steps[-1]["action_mask"][0].tolist() == [True, True, True, False, True, True, True]
    before = env.get_state()
    inp = steps[-1].clone()
    inp["action"] = torch.tensor([0, 3])
    with pytest.raises(InvalidActionError, match=r"board \(1,\): action 3.*column full.*legal moves there: "
                                                 r"\[0, 1, 2, 4, 5, 6\]"):
        env.step(inp)
    after = env.get_state()
    assert all(torch.equal(after[k], before[k]) for k in before.keys())
    assert "next" not in inp.keys()


def test_tictactoe_illegal_moves_refused():
    env = TicTacToeEnv(batch_size=[2])
    td = env.reset()
    td["action"] = torch.tensor([4, 4])
    td = step_mdp(env.step(td))
    td["action"] = torch.tensor([0, 4])
    with pytest.raises(InvalidActionError, match=r"board \(1,\): action 4, the move is not legal"):
        env.step(td)
    td["action"] = torch.tensor([9, 0])
    with pytest.raises(InvalidActionError, match="out of range"):
        env.step(td)
    # a finished board is absorbing: any move leaves it as it is, reward 0, still terminated
    steps = play(env, (0, 3, 1, 4, 2))
    inp = steps[-1].clone()
    inp["action"] = torch.tensor([5, 0])
    nxt = env.step(inp)["next"]
    assert torch.equal(nxt["board"], steps[-1]["board"]) and (nxt["reward"] == 0).all()
    assert nxt["terminated"].all() and not nxt["action_mask"].any()
    assert torch.equal(nxt["current_player"], steps[-1]["current_player"])


@pytest.mark.parametrize("cls", GAMES)
def test_batched_equals_one_by_one(cls):
    torch.manual_seed(0)
    n, steps = 6, cls.rows * cls.cols
    env = cls(batch_size=[n])
    ro = env.rollout(steps, break_when_any_done=False)
    actions = ro["action"]
    for i in range(n):
        single = cls()
        td = single.reset()
        for t in range(steps):
            td["action"] = actions[i, t]
            cur, td = single.step_and_maybe_reset(td)
            for key in ("board", "observation", "current_player", "action_mask", "reward", "terminated"):
                assert torch.equal(cur["next", key], ro[i, t]["next", key]), (i, t, key)


@pytest.mark.parametrize(("cls", "limit"), [(TicTacToeEnv, 9), (ConnectFourEnv, 42)])
def test_random_legal_games_terminate(cls, limit):
    torch.manual_seed(1)
    n = 256
    env = cls(batch_size=[n])
    ro = env.rollout(limit, break_when_all_done=True, break_when_any_done=False)
    term = ro["next", "terminated"].squeeze(-1)  # [n, T]
    assert term.any(-1).all(), "a random legal game lasted longer than the board allows"
    first = term.to(torch.int64).argmax(-1)
    assert int(first.max()) < limit
    # a finished game stays finished (the rollout repeats its last transition); the reward
    # (+1 win, 0 draw) comes only with the last move
    steps = torch.arange(term.shape[-1])
    assert torch.equal(term, steps >= first.unsqueeze(-1))
    reward = ro["next", "reward"].squeeze(-1)
    assert bool(((reward == 0) | term).all())
    final = reward.gather(-1, first.unsqueeze(-1))
    assert bool(((final == 0) | (final == 1)).all()) and 0 < int(final.sum()) <= n
    if cls is TicTacToeEnv:  # about 1 in 8 random games is a draw
        assert int(final.sum()) < n
    assert int(first.min()) >= 2 * env.win_length - 2  # the earliest possible win


def test_state_roundtrip_and_current_player():
    env = TicTacToeEnv(batch_size=[2])
    play(env, (0, 4))
    saved = env.get_state()
    env.reset()
    env.set_state(saved)
    inp = env.fake_tensordict()
    inp["action"] = torch.tensor([8, 8])
    nxt = env.step(inp)["next"]
    assert nxt["board"][0].flatten().tolist() == [1, 0, 0, 0, -1, 0, 0, 0, 1]
    assert (nxt["current_player"] == 1).all()
    # the observation is from the point of view of the player to move (the second player)
    assert nxt["observation"][0, 0].flatten().tolist() == [0, 0, 0, 0, 1, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="'board' values must be -1, 0 or 1"):
        env.set_state({"board": torch.full((2, 9), 3), "current_player": 0})


@pytest.mark.parametrize("cls", GAMES)
def test_transition_is_the_step_on_any_batch(cls):
    """The pure transition (for search) on a [B, k] batch of states equals the env's steps."""
    torch.manual_seed(3)
    env = cls(batch_size=[4])
    td = env.reset()
    for _ in range(5):
        td = env.rand_action(td)
        st = env.get_state()
        nxt = env.step(td)["next"]
        board, player, over = (st[k].unsqueeze(1).expand(4, 2, *st[k].shape[1:]) for k in
                               ("board", "current_player", "over"))
        b, p, o, r = env.transition(board, player, over, td["action"].unsqueeze(1).expand(4, 2))
        for j in range(2):
            assert torch.equal(b[:, j].reshape(nxt["board"].shape), nxt["board"])
            assert torch.equal(p[:, j], nxt["current_player"]) and torch.equal(o[:, j], nxt["terminated"][:, 0])
            assert torch.equal(r[:, j], nxt["reward"][:, 0])
        td = step_mdp(td)
