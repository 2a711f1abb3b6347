"""TensorDictPrimer: reset values, carried state, specs, and a recurrent policy end to end."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from steersman.data import Unbounded
from steersman.envs import CartPoleEnv, SerialEnv, check_env_specs
from steersman.envs.transforms import InitTracker, TensorDictPrimer, TransformedEnv
from steersman.modules import MLP, GRUModule, LSTMModule
from steersman.tensordict.nn import TensorDictModule, TensorDictSequential


def _env(batch=(3,), **kw):
    return TransformedEnv(CartPoleEnv(batch_size=list(batch), seed=0), TensorDictPrimer(**kw))


@pytest.mark.parametrize("batch", [(), (3,), (2, 2)])
def test_reset_values_and_spec(batch):
    env = _env(batch, h=Unbounded(shape=(2, 5)))
    check_env_specs(env)
    td = env.reset()
    assert td["h"].shape == (*batch, 2, 5) and (td["h"] == 0).all()
    assert env.observation_spec["h"].shape == (*batch, 2, 5)


def test_default_value_and_random():
    env = TransformedEnv(CartPoleEnv(batch_size=[4], seed=0),
                         TensorDictPrimer(h=Unbounded(shape=(3,)), default_value={"h": 2.5}))
    assert (env.reset()["h"] == 2.5).all()
    env = TransformedEnv(CartPoleEnv(batch_size=[4], seed=0), TensorDictPrimer(h=Unbounded(shape=(3,)), random=True))
    assert env.reset()["h"].std() > 0


def test_state_is_carried_when_policy_does_not_write_it():
    env = _env((2,), h=Unbounded(shape=(4,)))
    td = env.reset()
    td["h"] = torch.full((2, 4), 7.0)
    td["action"] = env.action_spec.rand()
    out = env.step(td)
    assert (out["next", "h"] == 7.0).all()


def test_bad_primer_is_a_clear_error():
    with pytest.raises(ValueError, match="at least one primer"):
        TensorDictPrimer()
    with pytest.raises(TypeError, match="leaf TensorSpec"):
        TensorDictPrimer(h=torch.zeros(3))


@pytest.mark.parametrize("rnn_cls", [LSTMModule, GRUModule])
@pytest.mark.parametrize("serial", [False, True])
def test_recurrent_policy_rollout(rnn_cls, serial):
    torch.manual_seed(0)
    rnn = rnn_cls(input_size=4, hidden_size=8, in_key="observation", out_key="features")
    head = TensorDictModule(MLP(in_features=8, out_features=2, num_cells=[16]), ["features"], ["logits"])
    pick = TensorDictModule(lambda logits: logits.argmax(-1), ["logits"], ["action"])
    policy = TensorDictSequential(rnn, head, pick)

    def make():
        return CartPoleEnv(batch_size=[2], seed=0)

    # the primer goes on the outermost env (as in TorchRL): it sees the policy's ("next", state)
    base = SerialEnv(2, make) if serial else make()
    env = TransformedEnv(base, InitTracker()).append_transform(rnn.make_tensordict_primer())
    check_env_specs(env)
    roll = env.rollout(6, policy, break_when_any_done=False)
    state_key = rnn.in_keys[1]
    assert roll["next", state_key].shape[:-2] == roll.batch_size
    # the state fed at step t+1 is the one produced at step t (carried by step_mdp)
    torch.testing.assert_close(roll[..., 1:][state_key], roll[..., :-1]["next", state_key])
    assert (roll[..., 0][state_key] == 0).all()  # zero state at reset
    # replaying the sequence in recurrent mode gives the same features as step by step
    from steersman.modules import set_recurrent_mode

    with set_recurrent_mode(True):
        replay = rnn(roll.clone().exclude("features"))
    torch.testing.assert_close(replay["features"], roll["features"], atol=1e-5, rtol=1e-5)
    env.close()


def test_primer_twice_is_independent_of_module_objects():
    # the primer holds specs only: deep-copying the env (e.g. for workers) keeps it working
    import copy

    env = _env((2,), h=Unbounded(shape=(3,)))
    env2 = copy.deepcopy(env)
    assert env2.reset()["h"].shape == (2, 3)
    _ = nn  # keep the import used by type checkers


def _gym():
    from steersman.envs import GymEnv

    return GymEnv("CartPole-v1")


@pytest.mark.parametrize("make", [lambda: CartPoleEnv(batch_size=[2], seed=0), _gym,
                                  lambda: SerialEnv(2, lambda: CartPoleEnv(seed=0)),
                                  lambda: TransformedEnv(CartPoleEnv(batch_size=[2], seed=0), InitTracker())],
                         ids=["native", "gym", "serial", "transformed"])
@pytest.mark.parametrize("method", ["step", "step_and_maybe_reset"])
def test_policy_written_next_entries_survive_the_step(make, method):
    env = make()
    td = env.reset()
    td["action"] = env.action_spec.rand()
    td["next", "memory"] = torch.full((*env.batch_size, 3), 5.0)
    td["next", "reward"] = torch.full((*env.batch_size, 1), -99.0)  # the env's own entries win
    if method == "step":
        out, root = env.step(td), None
    else:
        out, root = env.step_and_maybe_reset(td)
    assert (out["next", "memory"] == 5.0).all()
    assert (out["next", "reward"] != -99.0).all()
    if root is not None:
        assert (root["memory"] == 5.0).all()  # step_mdp carried it to the next step's input
    env.close()
