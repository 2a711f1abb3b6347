"""The AlphaZero recipe: tiny runs on both games, bit-exact resume, self-play bookkeeping,
board symmetries, self-play exploration options, bad configs, and (slow) learning
tic-tac-toe until it never loses against minimax."""

from __future__ import annotations

import math
import re

import pytest
import torch

from steersman.envs import TicTacToeEnv
from steersman.recipes import alphazero
from steersman.recipes.alphazero import (
    AlphaZeroConfig,
    SelfPlay,
    make_game,
    make_policy,
    symmetries,
    train,
)
from steersman.recipes.checkpoint import load_checkpoint
from steersman.recipes.config import ConfigError
from steersman.record import read_metrics_csv
from steersman.tensordict import TensorDict


def tiny(game: str = "tictactoe", **overrides) -> AlphaZeroConfig:
    cfg = AlphaZeroConfig(total_frames=64, frames_per_batch=32, updates_per_batch=2, batch_size=16, learning_starts=16,
                          num_simulations=4, eval_simulations=4, hidden_sizes=[16], quiet=True, export_format="none",
                          random_opening_moves=0, temperature_moves=0, value_mix=0.0)  # options: tested on their own
    cfg.env.name, cfg.env.num_envs = game, 8
    cfg.eval.episodes, cfg.eval.interval = 2, 0
    cfg.checkpoint.interval = 0
    cfg.logger.backends = ["csv"]
    for key, value in overrides.items():
        obj = cfg
        *path, last = key.split(".")
        for part in path:
            obj = getattr(obj, part)
        setattr(obj, last, value)
    return cfg


@pytest.mark.parametrize("game", ["tictactoe", "connect4"])
def test_tiny_run(game, tmp_path):
    export = "torch-export" if game == "tictactoe" else "none"
    cfg = tiny(game, export_format=export, solver_depth=1)
    summary = train(cfg, tmp_path / "run")
    assert summary["frames"] == 64 and not summary["interrupted"]
    cols = read_metrics_csv(tmp_path / "run" / "metrics.csv")
    assert cols["step"][-1] == 64
    for opponent in ("random", "solver"):
        rates = [cols[f"eval/{opponent}_{w}"][-1] for w in ("win", "draw", "loss")]
        assert all(0.0 <= r <= 1.0 for r in rates) and math.isclose(sum(rates), 1.0)
    assert cols["eval/return"][-1] == cols["eval/solver_score"][-1] == summary["final_eval_return"]
    assert not math.isnan(cols["train/policy_loss"][-1])
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoints")
    assert {"policy", "optim", "selfplay"} <= set(ckpt.state) and ckpt.replay_buffer_path is not None
    if export != "none":  # the file is the network's greedy policy: legal moves, as the live module
        env = make_game(game, 5)
        policy = make_policy(cfg, env)
        policy.load_state_dict(ckpt.state["policy"])
        td = env.reset()
        for a in (4, 0):  # two pieces on the boards
            td = env.step(td.set("action", torch.full((5,), a)))["next"]
        obs = td["observation"]
        program = torch.export.load(tmp_path / "run" / "export" / "policy.pt2").module()
        action = program(obs)
        assert torch.equal(action, policy(TensorDict({"observation": obs}, [5]))["action"])
        assert bool(td["action_mask"].gather(-1, action.unsqueeze(-1)).all())


def _flat(obj, prefix=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _flat(v, f"{prefix}/{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _flat(v, f"{prefix}/{i}")
    else:
        yield prefix, obj


@pytest.mark.parametrize("explore", [{}, {"random_opening_moves": 3, "temperature_moves": 2, "value_mix": 0.5}])
def test_resume_is_bit_exact(tmp_path, explore):
    """A run stopped at 64 moves (with an evaluation there) and resumed to 128 ends with the
    same networks, optimizer moments, self-play games, replay buffer and RNG states as a run
    of 128 moves in one go (evaluation draws from its own generators), with and without
    the self-play exploration options."""
    train(tiny(total_frames=128, **{"checkpoint.interval": 32}, **explore), tmp_path / "ref")
    train(tiny(total_frames=64, **{"checkpoint.interval": 32}, **explore), tmp_path / "cut")
    train(tiny(total_frames=128, **{"checkpoint.interval": 32}, **explore), tmp_path / "cut", resume=True)
    a, b = load_checkpoint(tmp_path / "ref" / "checkpoints"), load_checkpoint(tmp_path / "cut" / "checkpoints")
    assert a.meta["frames"] == b.meta["frames"] == 128
    fa, fb = dict(_flat(a.state)), dict(_flat(b.state))
    assert fa.keys() == fb.keys()
    for key, va in fa.items():
        assert (torch.equal(va, fb[key]) if isinstance(va, torch.Tensor) else va == fb[key]), key
    bufs = []
    for run in ("ref", "cut"):
        rb = alphazero.TensorDictReplayBuffer(storage=alphazero.LazyTensorStorage(20_000))
        rb.loads(load_checkpoint(tmp_path / run / "checkpoints").replay_buffer_path)
        bufs.append(rb.storage[:len(rb)])
    assert len(bufs[0]) > 0 and all(torch.equal(bufs[0][k], bufs[1][k]) for k in ("observation", "policy", "value"))


def test_selfplay_labels_positions_with_the_outcome_for_the_player_to_move():
    env = TicTacToeEnv(batch_size=[2])
    sp = SelfPlay(env)
    # board 0: the first player takes the top row in five moves; board 1: a draw in nine
    moves = [(0, 0), (3, 1), (1, 2), (4, 4), (2, 3), (0, 5), (1, 7), (2, 6), (3, 8)]
    weights = torch.full((2, 9), 1 / 9)
    finished = []
    for a0, a1 in moves:
        finished.append(sp.step(torch.tensor([a0, a1]), weights))
    assert [f.shape[0] for f in finished] == [0, 0, 0, 0, 5, 0, 0, 0, 9]
    assert finished[4]["value"].tolist() == [1.0, -1.0, 1.0, -1.0, 1.0]
    assert finished[8]["value"].tolist() == [0.0] * 9
    # observations are from the mover's side: before move 2 of board 0 the mover (second player) has no piece
    assert finished[4]["observation"][1, 0].sum() == 0 and finished[4]["observation"][1, 1].sum() == 1
    assert sp.length.tolist() == [4, 0]  # board 0 restarted after its game and played on


def test_selfplay_skips_opening_moves_and_mixes_the_search_value():
    """Moves with ``store`` false are played but not stored; the value target is
    ``(1 - value_mix) * outcome + value_mix * search value``; a new game draws its opening."""
    torch.manual_seed(0)
    env = TicTacToeEnv(batch_size=[1])
    sp = SelfPlay(env, random_opening_moves=2, value_mix=0.25)
    assert 0 <= int(sp.opening) <= 2
    moves = [0, 3, 1, 4, 2]  # the first player takes the top row
    search = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5])
    weights = torch.full((1, 9), 1 / 9)
    finished = None
    for i, a in enumerate(moves):
        assert int(sp.plies()) == i
        finished = sp.step(torch.tensor([a]), weights, search[i:i + 1], torch.tensor([i >= 2]))
    assert finished.shape[0] == 3  # moves 2, 3, 4; the first two were the opening
    outcome = torch.tensor([1.0, -1.0, 1.0])
    torch.testing.assert_close(finished["value"], 0.75 * outcome + 0.25 * search[2:])
    assert finished["observation"][0].sum() == 2  # stored from the third position on
    assert int(sp.plies()) == 0 and int(sp.length) == 0
    seen = set()
    for _ in range(40):  # each new game draws 0, 1 or 2 opening moves
        sp.opening = sp._draw_openings(1)
        seen.add(int(sp.opening))
    assert seen == {0, 1, 2}


@pytest.mark.parametrize("game", ["tictactoe", "connect4"])
def test_symmetries_move_the_policy_with_the_board(game):
    """A position whose policy is one-hot at the cell (or column) of its only piece keeps
    that match in every image, and the images are distinct."""
    env = make_game(game, 1)
    rows, cols = env.rows, env.cols
    cells = torch.arange(rows * cols) if game == "tictactoe" else torch.arange(cols)  # column c: bottom cell
    obs = torch.zeros(len(cells), 2, rows, cols)
    for i, c in enumerate(cells.tolist()):
        obs[i, 0].view(-1)[c] = 1.0
    policy = torch.nn.functional.one_hot(cells, env.num_actions).float()
    out = symmetries(TensorDict({"observation": obs, "policy": policy, "value": torch.arange(len(cells)).float()},
                                [len(cells)]), connect_four=game == "connect4")
    assert out.shape[0] == len(cells) * (8 if game == "tictactoe" else 2)
    piece = out["observation"][:, 0].flatten(1).argmax(-1)
    target = out["policy"].argmax(-1)
    assert torch.equal(piece if game == "tictactoe" else piece % cols, target)
    centre_moves = out["value"] == (4 if game == "tictactoe" else 3)
    assert bool((target[centre_moves] == (4 if game == "tictactoe" else 3)).all())  # the centre stays
    corner = out["observation"][out["value"] == 0][:, 0].flatten(1).argmax(-1)
    assert len(set(corner.tolist())) == (4 if game == "tictactoe" else 2)  # a corner goes to every corner


@pytest.mark.parametrize(("overrides", "message"), [
    ({"env.name": "chess"}, "unknown game env.name='chess'; valid: tictactoe, connect4"),
    ({"num_simulations": 0}, "num_simulations must be an integer >= 1, got 0"),
    ({"frames_per_batch": 30}, "frames_per_batch (30) must be a multiple of env.num_envs (8)"),
    ({"random_opening_moves": -1}, "random_opening_moves must be an integer >= 0, got -1"),
    ({"value_mix": 1.5}, "value_mix must be in [0, 1], got 1.5"),
])
def test_bad_config_is_one_line_and_writes_nothing(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        train(tiny(**overrides), tmp_path / "run")
    assert not (tmp_path / "run").exists()



@pytest.mark.slow
def test_alphazero_learns_to_never_lose_at_tictactoe(tmp_path):
    """The default tic-tac-toe config, 12,288 self-play moves (6 rounds of 512 games): the
    agent searching with its network (32 simulations, no noise) never loses against *any*
    minimax player from either seat (every optimal reply of the opponent explored), and
    it beats or draws the random player in every evaluation game. (Seeds 0, 1 and 2 all
    reach 0 losses at 12,288 moves; at 8,192 they still lose 1-2 lines.)"""
    cfg = AlphaZeroConfig(total_frames=12_288, quiet=True, export_format="none", seed=0)
    cfg.eval.interval, cfg.eval.episodes = 0, 8
    cfg.checkpoint.interval = 0
    cfg.logger.backends = ["csv"]
    train(cfg, tmp_path / "run")
    cols = read_metrics_csv(tmp_path / "run" / "metrics.csv")
    assert cols["eval/minimax_games"][-1] >= 10  # distinct final boards over both seats
    assert cols["eval/minimax_losses"][-1] == 0
    assert cols["eval/solver_loss"][-1] == 0 and cols["eval/random_loss"][-1] == 0
