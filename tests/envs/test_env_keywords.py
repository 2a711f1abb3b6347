"""TorchRL's env keywords: ``EnvMetaData(tensordict=, specs=env.specs, env_str=, batch_locked=,
device_map=, supports_set_state=)``, ``env.specs``, ``TicTacToeEnv(single_player=)`` and the
``td_params`` form of Pendulum's constants."""

from __future__ import annotations

import pickle

import pytest
import torch

from steersman.envs import CartPoleEnv, PendulumEnv, TicTacToeEnv
from steersman.envs.batched import EnvMetaData
from steersman.envs.native.pendulum_td import gen_pendulum_params, pendulum_params_from_td
from steersman.envs.utils import check_env_specs
from steersman.tensordict import TensorDict


# ------------------------------------------------------------------ EnvMetaData
def test_env_metadata_torchrl_keywords():
    env = CartPoleEnv(batch_size=[2])
    assert set(env.specs.keys()) == {"output_spec", "input_spec"}
    td = env.reset()
    meta = EnvMetaData(tensordict=td, specs=env.specs, batch_size=env.batch_size, env_str="CartPoleEnv(x=1)",
                       device="cpu", batch_locked=False, device_map={"observation": torch.device("cpu")},
                       supports_set_state=True)
    assert meta.env_type == "CartPoleEnv" and meta.env_str == "CartPoleEnv(x=1)"
    assert meta.tensordict is td and not meta.batch_locked and meta.supports_set_state
    assert meta.device_map == {"observation": torch.device("cpu")}
    assert meta.specs["full_action_spec"] == env.full_action_spec  # split from env.specs
    assert meta.mismatch(EnvMetaData.from_env(env)) is None
    back = pickle.loads(pickle.dumps(meta))
    assert (back.env_str, back.batch_locked, back.supports_set_state) == (meta.env_str, False, True)
    assert torch.equal(back.tensordict["observation"], td["observation"])
    clone = meta.clone()
    assert clone.tensordict is not td and torch.equal(clone.tensordict["observation"], td["observation"])


def test_env_metadata_from_env_defaults():
    env = TicTacToeEnv(batch_size=[3])
    meta = EnvMetaData.metadata_from_env(env)
    assert meta.batch_locked is True and meta.env_str == repr(env)
    fake = meta.tensordict  # zeros shaped as the env's data, with "_reset" per done entry
    assert fake.batch_size == (3,) and fake["_reset"].shape == fake["done"].shape == (3, 1)
    assert fake["next", "reward"].shape == (3, 1) and fake["board"].shape == (3, 3, 3)
    assert set(meta.device_map) == set(fake.keys(include_nested=True, leaves_only=True))
    assert all(d == torch.device("cpu") for d in meta.device_map.values())


def test_env_metadata_bad_specs():
    with pytest.raises(KeyError, match="lacks"):
        EnvMetaData({"full_observation_spec": CartPoleEnv().full_observation_spec})
    with pytest.raises(TypeError, match="specs must be"):
        EnvMetaData([1, 2])


# ------------------------------------------------------------------ TicTacToeEnv(single_player=True)
def _set(env: TicTacToeEnv, cells: list[int]) -> None:
    env.set_state({"board": torch.tensor(cells, dtype=torch.int8).expand(*env.batch_size, 9),
                   "current_player": torch.zeros(env.batch_size, dtype=torch.int64)})


def test_tictactoe_single_player_reply_and_rewards():
    env = TicTacToeEnv(batch_size=[4], single_player=True)
    check_env_specs(env)
    env.reset()
    # the second player (-1) holds 0 and 1; the agent (1) plays 7 (no line), which leaves
    # cell 2 as the only free one: the reply takes it and wins for -1
    _set(env, [-1, -1, 0, 1, 1, -1, -1, 0, 1])
    out = env.step(TensorDict(action=torch.full((4,), 7), batch_size=[4]))["next"]
    assert out["reward"].flatten().tolist() == [-1.0] * 4
    assert out["terminated"].all() and out["board"].reshape(4, 9)[:, 2].tolist() == [-1] * 4
    # a winning move of the agent ends the game: no reply is played
    _set(env, [1, 1, 0, -1, -1, 0, 0, 0, 0])
    out = env.step(TensorDict(action=torch.full((4,), 2), batch_size=[4]))["next"]
    assert out["reward"].flatten().tolist() == [1.0] * 4 and out["terminated"].all()
    assert (out["board"] == -1).sum().item() == 4 * 2


def test_tictactoe_single_player_rollout_agent_always_moves():
    torch.manual_seed(0)
    env = TicTacToeEnv(batch_size=[32], single_player=True)
    ro = env.rollout(3, break_when_any_done=False)
    assert bool((ro["next", "current_player"] == 0).all())
    pieces = ro["next", "board"].reshape(32, 3, 9)
    live = ~ro["next", "terminated"].squeeze(-1)
    # on boards still in play, each step adds one piece of each player
    assert bool(((pieces == 1).sum(-1) == (pieces == -1).sum(-1))[live].all())
    assert bool(((pieces == 1).sum(-1)[:, 0] == 1).all())
    two = TicTacToeEnv(batch_size=[2])
    two.reset()
    assert two.step(two.rand_action())["next", "current_player"].tolist() == [1, 1]
    with pytest.raises(TypeError, match="single_player must be a bool"):
        TicTacToeEnv(single_player="yes")


# ------------------------------------------------------------------ Pendulum td_params
def test_pendulum_td_params_round_trip():
    td = gen_pendulum_params(g=9.81, batch_size=[3])
    assert td.batch_size == (3,) and td["params", "max_torque"].shape == (3,)
    params = pendulum_params_from_td(td)
    assert params.g == 9.81 and params.max_torque == 2.0 and params.dt == 0.05
    env = PendulumEnv(params=pendulum_params_from_td({"max_torque": 1.5}))
    assert float(env.action_spec.high.max()) == 1.5 and env.params.g == 10.0
    bad = gen_pendulum_params(batch_size=[2])
    bad["params", "g"] = torch.tensor([9.0, 10.0])
    with pytest.raises(ValueError, match="differs across its 2 elements"):
        pendulum_params_from_td(bad)
    with pytest.raises(KeyError, match="unknown pendulum parameter"):
        pendulum_params_from_td({"gravity": 9.8})


def test_pendulum_env_takes_td_params_as_torchrl():
    """``PendulumEnv(td_params=PendulumEnv.gen_params(g=...))``: TorchRL's spelling."""
    env = PendulumEnv(batch_size=[2], td_params=PendulumEnv.gen_params(g=9.81), seed=0)
    assert env.params.g == 9.81 and env.params.max_torque == 2.0
    light = PendulumEnv(batch_size=[2], td_params={"params": {"max_torque": 1.0}}, seed=0)
    assert float(light.action_spec.high.max()) == 1.0
    # the constants change the dynamics: the same start and action give another next state
    default = PendulumEnv(batch_size=[2], seed=0)
    ta, tb = env.reset(), default.reset()
    assert torch.equal(ta["observation"], tb["observation"])
    ta["action"], tb["action"] = torch.zeros(2, 1), torch.zeros(2, 1)
    na, nb = env.step(ta)["next", "observation"], default.step(tb)["next", "observation"]
    assert not torch.equal(na, nb)
    with pytest.raises(KeyError, match="unknown pendulum parameter"):
        PendulumEnv(td_params={"gravity": 9.8})
