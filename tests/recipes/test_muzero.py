"""The MuZero recipe: tiny runs on tic-tac-toe and CartPole, bit-exact resume, the unrolled
targets against a plain loop, the unrolled loss, root masking, bad configs, and (slow)
learning tic-tac-toe against a random player."""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.recipes import muzero
from steersman.recipes.checkpoint import load_checkpoint
from steersman.recipes.config import ConfigError
from steersman.recipes.envs import make_env
from steersman.recipes.muzero import (
    MuZeroConfig,
    SelfPlay,
    make_nets,
    make_policy,
    search,
    train,
    unrolled_loss,
)
from steersman.record import read_metrics_csv
from steersman.tensordict import TensorDict


def tiny(env: str = "tictactoe", **overrides) -> MuZeroConfig:
    cfg = MuZeroConfig(total_frames=64, frames_per_batch=32, updates_per_batch=2, batch_size=16, learning_starts=16,
                       num_simulations=4, eval_simulations=4, hidden_sizes=[16], latent_size=8, quiet=True,
                       export_format="none")
    cfg.env.name, cfg.env.num_envs = env, 8
    if env != "tictactoe":
        cfg.env.max_episode_steps = 6  # episodes end (by truncation) within the 8 moves of a tiny run
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


@pytest.mark.parametrize("env", ["tictactoe", "CartPole-v1"])
def test_tiny_run(env, tmp_path):
    cfg = tiny(env, export_format="torch-export" if env != "tictactoe" else "none")
    summary = train(cfg, tmp_path / "run")
    assert summary["frames"] == 64 and not summary["interrupted"] and math.isfinite(summary["final_eval_return"])
    cols = read_metrics_csv(tmp_path / "run" / "metrics.csv")
    assert cols["step"][-1] == 64
    for key in ("train/policy_loss", "train/value_loss", "train/reward_loss"):
        assert math.isfinite(cols[key][-1]), key
    if env == "tictactoe":
        rates = [cols[f"eval/random_{w}"][-1] for w in ("win", "draw", "loss")]
        assert math.isclose(sum(rates), 1.0) and cols["eval/return"][-1] == cols["eval/random_score"][-1]
    else:  # undiscounted returns of CartPole, capped by the time limit
        assert 1.0 <= cols["eval/return"][-1] <= 6.0
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoints")
    assert {"policy", "optim", "selfplay"} <= set(ckpt.state) and ckpt.replay_buffer_path is not None
    if env != "tictactoe":  # the exported file is the networks' greedy policy
        e = make_env(env, 5, seed=3)
        policy = make_policy(cfg, e)
        policy.load_state_dict(ckpt.state["policy"])
        obs = e.reset()["observation"]
        program = torch.export.load(tmp_path / "run" / "export" / "policy.pt2").module()
        assert torch.equal(program(obs), policy(TensorDict({"observation": obs}, [5]))["action"])


def _flat(obj, prefix=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _flat(v, f"{prefix}/{k}")
    elif isinstance(obj, TensorDict):
        yield from _flat(obj.to_dict(), prefix)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _flat(v, f"{prefix}/{i}")
    else:
        yield prefix, obj


@pytest.mark.parametrize("env", ["tictactoe", "CartPole-v1"])
def test_resume_is_bit_exact(tmp_path, env):
    """Stopped at 64 moves and resumed to 128: the same networks, optimizer, episodes in
    flight, env states, replay buffer and RNG states as one run of 128 moves."""
    train(tiny(env, total_frames=128, **{"checkpoint.interval": 32}), tmp_path / "ref")
    train(tiny(env, total_frames=64, **{"checkpoint.interval": 32}), tmp_path / "cut")
    train(tiny(env, total_frames=128, **{"checkpoint.interval": 32}), tmp_path / "cut", resume=True)
    a, b = load_checkpoint(tmp_path / "ref" / "checkpoints"), load_checkpoint(tmp_path / "cut" / "checkpoints")
    assert a.meta["frames"] == b.meta["frames"] == 128
    fa, fb = dict(_flat(a.state)), dict(_flat(b.state))
    assert fa.keys() == fb.keys()
    for key, va in fa.items():
        assert (torch.equal(va, fb[key]) if isinstance(va, torch.Tensor) else va == fb[key]), key
    bufs = []
    for run in ("ref", "cut"):
        rb = muzero.TensorDictReplayBuffer(storage=muzero.LazyTensorStorage(1000))
        rb.loads(load_checkpoint(tmp_path / run / "checkpoints").replay_buffer_path)
        bufs.append(rb.storage[:len(rb)])
    assert len(bufs[0]) > 0
    assert all(torch.equal(bufs[0][k], bufs[1][k]) for k in ("observation", "actions", "target_value"))


# ---------------------------------------------------------------- targets against a plain loop
def _reference(reward, value, action, policy, length, terminated, n, gamma, k_steps, num_actions):
    """Per position t < length: the unrolled targets, by plain Python loops."""
    def z(t):
        out = sum(gamma ** i * reward[t + i] for i in range(n) if t + i < length)
        if t + n < length:
            boot = value[t + n]
        else:
            boot = 0.0 if terminated else value[length - 1]
        return out + gamma ** min(n, length - t) * boot

    rows = []
    for t in range(length):
        row = {"target_value": [], "mask_value": [], "target_policy": [], "mask_policy": [], "target_reward": [],
               "mask_reward": [], "actions": []}
        for k in range(k_steps + 1):
            p = t + k
            row["target_value"].append(z(p) if p < length else 0.0)
            row["mask_value"].append(float(p < length or terminated))
            row["target_policy"].append(policy[p] if p < length else [1.0 / num_actions] * num_actions)
            row["mask_policy"].append(float(p < length))
            if k < k_steps:
                row["target_reward"].append(reward[p] if p < length else 0.0)
                row["mask_reward"].append(float(p < length or terminated))
                row["actions"].append(action[p] if p < length else None)
        rows.append(row)
    return rows


@settings(max_examples=12, deadline=None)
@given(lengths=st.lists(st.integers(1, 7), min_size=1, max_size=3), terminated=st.lists(st.booleans(), min_size=3,
       max_size=3), n=st.integers(1, 4), k_steps=st.integers(1, 3), two_player=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_targets_match_a_plain_loop(lengths, terminated, n, k_steps, two_player, seed):
    """n-step values bootstrapped with root values (0 after a termination, the last root
    value after a truncation), absorbing targets past the end; two players: gamma -1 and
    n = the episode length give the outcome for the player to move."""
    g = torch.Generator().manual_seed(seed)
    e, t_max, a = len(lengths), 7, 3
    gamma, n = (-1.0, t_max) if two_player else (0.9, n)
    sp = SelfPlay(make_env("CartPole-v1", e, seed=0), t_max, k_steps, n, gamma)
    sp.reward = torch.randint(-1, 2, (e, t_max), generator=g).float()
    sp.value = torch.randn(e, t_max, generator=g)
    sp.action = torch.randint(0, a, (e, t_max), generator=g)
    sp.policy = torch.softmax(torch.randn(e, t_max, a, generator=g), -1)
    sp.obs = torch.arange(e * t_max).float().view(e, t_max, 1).expand(e, t_max, 4).clone()
    sp.num_actions = a
    sp.length = torch.tensor(lengths)
    term = torch.tensor(terminated[:e])
    out = sp.targets(torch.arange(e), term)
    assert out.shape[0] == sum(lengths)
    i = 0
    for f in range(e):
        ref = _reference(sp.reward[f].tolist(), sp.value[f].tolist(), sp.action[f].tolist(), sp.policy[f].tolist(),
                         lengths[f], bool(term[f]), n, gamma, k_steps, a)
        for t, row in enumerate(ref):
            assert out["observation"][i, 0].item() == f * t_max + t
            for key in ("target_value", "mask_value", "target_policy", "mask_policy", "target_reward", "mask_reward"):
                torch.testing.assert_close(out[key][i], torch.tensor(row[key]), msg=key)
            for k, act in enumerate(row["actions"]):
                if act is not None:
                    assert out["actions"][i, k].item() == act
                else:
                    assert 0 <= out["actions"][i, k].item() < a
            i += 1


def test_two_player_targets_are_the_outcome_for_the_player_to_move():
    """A tic-tac-toe game won by the first player on move 5: values +1, -1, +1, -1, +1;
    the reward target of the winning move is +1 for its mover."""
    env = make_env("tictactoe", 1)
    sp = SelfPlay(env, 9, 2, 9, -1.0)
    finished = None
    for move in (0, 3, 1, 4, 2):
        finished, _ = sp.step(torch.tensor([move]), torch.full((1, 9), 1 / 9), torch.zeros(1))
    assert finished.shape[0] == 5
    assert finished["target_value"][:, 0].tolist() == [1.0, -1.0, 1.0, -1.0, 1.0]
    assert finished["target_reward"][3].tolist() == [0.0, 1.0] and finished["mask_reward"][3].tolist() == [1.0, 1.0]
    assert finished["target_value"][4].tolist() == [1.0, 0.0, 0.0]  # then absorbing
    assert finished["mask_policy"][4].tolist() == [1.0, 0.0, 0.0]
    assert int(sp.length) == 0 and int((env.get_state()["board"] != 0).sum()) == 0  # a new game


@pytest.mark.parametrize("game", ["tictactoe", "connect4"])
def test_symmetries_move_actions_and_policies_with_the_board(game):
    """Every image of a played game is a legal game: the piece the image's action puts
    on the board is where the next image shows it, and the policy target moves with it."""
    env = make_env(game, 1)
    moves = (0, 3, 1, 4, 2) if game == "tictactoe" else (0, 1, 0, 1, 0, 1, 0)
    a = 9 if game == "tictactoe" else 7
    sp = SelfPlay(env, 9 if game == "tictactoe" else 42, 2, 9, -1.0)
    for move in moves:
        finished, _ = sp.step(torch.tensor([move]), torch.nn.functional.one_hot(torch.tensor([move]), a).float(),
                              torch.zeros(1))
    n = len(moves)
    images = muzero.symmetries(finished, game == "connect4")
    count = 8 if game == "tictactoe" else 2
    assert images.shape[0] == count * n
    assert torch.equal(images[:n]["observation"], finished["observation"])
    boards = {tuple(images["observation"][i * n + 2].flatten().tolist()) for i in range(count)}
    assert len(boards) == count  # distinct images of an asymmetric position
    for i in range(count):
        img = images[i * n:(i + 1) * n]
        assert torch.equal(img["target_policy"][:, 0].argmax(-1), img["actions"][:, 0])
        assert torch.equal(img["target_value"], finished["target_value"])
        for t in range(n - 1):  # the mover's pieces (own plane) + the action = the next position's opponent plane
            own = img["observation"][t, 0].flatten(-2)
            nxt = img["observation"][t + 1, 1].flatten(-2)
            placed = (nxt - own).nonzero().flatten().tolist()
            assert len(placed) == 1
            if game == "tictactoe":
                assert placed[0] == int(img["actions"][t, 0])
            else:  # a column: the piece lands in that column
                assert placed[0] % 7 == int(img["actions"][t, 0])


# ---------------------------------------------------------------- the loss and the search
def _batch(n: int, k: int, a: int, obs: int = 4) -> TensorDict:
    g = torch.Generator().manual_seed(0)
    return TensorDict({
        "observation": torch.randn(n, obs, generator=g), "actions": torch.randint(0, a, (n, k), generator=g),
        "target_reward": torch.randn(n, k, generator=g), "mask_reward": torch.ones(n, k),
        "target_value": torch.randn(n, k + 1, generator=g), "mask_value": torch.ones(n, k + 1),
        "target_policy": torch.softmax(torch.randn(n, k + 1, a, generator=g), -1),
        "mask_policy": torch.ones(n, k + 1)}, [n])


def test_unrolled_loss_matches_a_step_by_step_computation_and_reaches_every_network():
    torch.manual_seed(0)
    cfg = tiny("CartPole-v1")
    nets = make_nets(cfg, make_env("CartPole-v1", 1, seed=0))
    batch = _batch(6, 3, 2)
    batch["mask_policy"][:, 2:] = 0.0
    batch["mask_value"][0, 3] = 0.0
    out = unrolled_loss(nets, batch, value_coef=0.5, reward_coef=2.0)
    # reference: one sample at a time, plain loops
    rep, dyn, pred = nets.representation.module, nets.dynamics.module, nets.prediction.module
    pol = val = rew = 0.0
    for i in range(6):
        latent = rep(batch["observation"][i:i + 1])
        for k in range(4):
            w = 1.0 if k == 0 else 1 / 3
            if k > 0:
                onehot = torch.nn.functional.one_hot(batch["actions"][i:i + 1, k - 1], 2).float()
                latent, r = dyn(latent, onehot)
                rew = rew + (r - batch["target_reward"][i, k - 1]).pow(2).sum() / 3
            logits, v = pred(latent)
            ce = -(batch["target_policy"][i, k] * torch.log_softmax(logits[0], -1)).sum()
            pol = pol + w * ce * batch["mask_policy"][i, k]
            val = val + w * (v[0] - batch["target_value"][i, k]).pow(2) * batch["mask_value"][i, k]
    torch.testing.assert_close(out["policy_loss"], pol / 6)
    torch.testing.assert_close(out["value_loss"], val / 6)
    torch.testing.assert_close(out["reward_loss"], rew / 6)
    torch.testing.assert_close(out["loss"], (pol + 0.5 * val + 2.0 * rew) / 6)
    out["loss"].backward()
    for name in ("representation", "dynamics", "prediction"):
        grads = [p.grad for p in getattr(nets, name).parameters()]
        assert all(gr is not None and bool(gr.abs().sum() > 0) for gr in grads), name
    # masked targets do not matter
    changed = batch.clone()
    changed["target_value"][0, 3] = 100.0
    changed["target_policy"][:, 2:] = torch.tensor([1.0, 0.0])
    torch.testing.assert_close(unrolled_loss(nets, changed, 0.5, 2.0)["loss"], out["loss"].detach())


def test_search_plays_legal_moves_only_and_returns_a_policy():
    torch.manual_seed(0)
    env = make_env("tictactoe", 16)
    cfg = tiny()
    nets = make_nets(cfg, env)
    td = env.reset()
    for move in (4, 0, 8):  # three pieces on every board
        td = env.step(td.set("action", torch.full((16,), move)))["next"]
    action, weights, value = search(nets, td["observation"], td["action_mask"], 8, 16, 1.0, -1.0)
    assert action.shape == (16,) and weights.shape == (16, 9) and value.shape == (16,)
    assert bool(td["action_mask"].gather(-1, action[:, None]).all())
    assert bool((weights[~td["action_mask"]] == 0).all())
    torch.testing.assert_close(weights.sum(-1), torch.ones(16))


@pytest.mark.parametrize(("overrides", "message"), [
    ({"unroll_steps": 0}, "unroll_steps must be an integer >= 1, got 0"),
    ({"eval_simulations": -1}, "eval_simulations must be an integer >= 0, got -1"),
    ({"gamma": 1.5}, "gamma must be a number in [0, 1], got 1.5"),
    ({"frames_per_batch": 30}, "frames_per_batch (30) must be a multiple of env.num_envs (8)"),
    ({"env.name": "Pendulum-v1"}, "muzero needs discrete actions"),
])
def test_bad_config_is_one_line_and_writes_nothing(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        train(tiny("CartPole-v1", **overrides), tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_muzero_learns_tictactoe_against_a_random_player(tmp_path):
    """The default config (256 games, 16 simulations on the learned model, symmetries,
    Q-values normalised by the value range) for 4,096 moves, then 64 games per seat against
    a uniformly random player, searching with the learned model: random against random
    scores 0 over both seats and wins ~44% of the games. Measured at 4,096 moves, seeds
    0 / 1 / 2: scores 0.63 / 0.55 / 0.25, losses 0.14 / 0.19 / 0.33 (before the
    normalisation and the symmetries: 0.38 / 0.19 / 0.21); see benchmarks/README.md, MuZero."""
    cfg = MuZeroConfig(total_frames=4_096, quiet=True, export_format="none", seed=0)
    cfg.eval.interval, cfg.eval.episodes = 0, 64
    cfg.checkpoint.interval = 0
    cfg.logger.backends = ["csv"]
    train(cfg, tmp_path / "run")
    cols = read_metrics_csv(tmp_path / "run" / "metrics.csv")
    assert cols["eval/random_score"][-1] >= 0.45
    assert cols["eval/random_win"][-1] >= 0.65 and cols["eval/random_loss"][-1] <= 0.25


def test_single_agent_env_takes_its_own_defaults():
    """``env=cartpole`` gets SINGLE_AGENT_DEFAULTS for what the user left unset (the class
    defaults are tic-tac-toe's); preset=none keeps them; a board game is left alone."""
    from steersman.recipes.config import ConfigError
    from steersman.recipes.muzero import SINGLE_AGENT_DEFAULTS, resolve_preset

    cfg = MuZeroConfig()
    cfg.env.name, cfg.gamma = "CartPole-v1", 0.99
    out = resolve_preset(cfg)
    assert out.preset == "none" and out.gamma == 0.99  # the user's value wins
    assert (out.env.num_envs, out.env.max_episode_steps, out.td_steps, out.num_simulations) == (16, 500, 50, 8)
    assert cfg.env.num_envs == 256 and cfg.preset == "auto"  # the input is not changed
    assert resolve_preset(out) is out  # resolved once: a resume reuses exactly these values
    kept = MuZeroConfig(preset="none")
    kept.env.name = "CartPole-v1"
    assert resolve_preset(kept).env.num_envs == 256
    assert resolve_preset(MuZeroConfig()).td_steps == MuZeroConfig().td_steps  # tic-tac-toe
    forced = resolve_preset(MuZeroConfig(preset="single_agent"))
    assert forced.frames_per_batch == SINGLE_AGENT_DEFAULTS["frames_per_batch"] == 256
    with pytest.raises(ConfigError, match="preset must be auto, single_agent or none, got 'cartpole'"):
        resolve_preset(MuZeroConfig(preset="cartpole"))
