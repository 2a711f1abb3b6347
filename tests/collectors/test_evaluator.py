"""``Evaluator``: episode metrics against hand-computed values, weights loaded before the
episodes, background evaluations with each ``busy_policy``, callbacks, and bad input."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from steersman.collectors import Evaluator
from steersman.envs import CartPoleEnv
from steersman.tensordict import TensorDictBase
from steersman.tensordict.nn import TensorDictModule


def _left(obs: torch.Tensor) -> torch.Tensor:
    return torch.zeros(obs.shape[:-1], dtype=torch.long)


def _left_policy() -> TensorDictModule:
    return TensorDictModule(_left, ["observation"], ["action"])


def test_metrics_match_hand_computed_episodes():
    # CartPole pays 1 per step and pushing left for 5 steps never ends an episode, so
    # every episode is cut by max_steps: return 5, length 5
    ev = Evaluator(CartPoleEnv(batch_size=[4], seed=0), _left_policy(), num_trajectories=6, max_steps=5,
                   log_prefix="test")
    m = ev.evaluate(step=3)
    assert m["test/num_episodes"] == 6 and m["test/step"] == 3
    assert m["test/reward"] == 5.0 and m["test/reward_std"] == 0.0 and m["test/episode_length"] == 5.0
    assert m["test/fps"] > 0
    # unlimited: episodes end at CartPole's termination, return == length for each
    free = Evaluator(CartPoleEnv(batch_size=[3], seed=1), _left_policy(), num_trajectories=3)
    m = free.evaluate()
    assert 5 < m["eval/episode_length"] < 30 and m["eval/reward"] == m["eval/episode_length"]
    assert free.evaluate()["eval/step"] == 1  # the internal counter
    ev.shutdown()
    free.shutdown()


def test_weights_are_loaded_before_the_episodes():
    torch.manual_seed(0)
    net = nn.Linear(4, 2)
    ev = Evaluator(CartPoleEnv(batch_size=[2], seed=0), _WithNet(net), num_trajectories=2, max_steps=3)
    new = nn.Linear(4, 2)
    ev.evaluate(weights=_WithNet(new))  # a module: its weights are copied in
    assert torch.equal(net.weight, new.weight) and torch.equal(net.bias, new.bias)
    ev.evaluate(weights_dict={"policy": Evaluator.extract_weights(_WithNet(nn.Linear(4, 2)))})
    assert not torch.equal(net.weight, new.weight)
    with pytest.raises(ValueError, match="only 'policy'"):
        ev.evaluate(weights_dict={"env.transform[0]": new})
    ev.shutdown()


class _WithNet(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net
        self.in_keys, self.out_keys = ["observation"], ["action"]

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        td.set("action", self.net(td.get("observation")).argmax(-1))
        return td


def _gated_policy(gate: threading.Event) -> TensorDictModule:
    def act(obs: torch.Tensor) -> torch.Tensor:
        gate.wait(10)
        return _left(obs)

    return TensorDictModule(act, ["observation"], ["action"])


@pytest.mark.parametrize("busy_policy", ["skip", "error", "queue"])
def test_background_evaluations_and_busy_policy(busy_policy):
    gate = threading.Event()
    got: list = []
    ev = Evaluator(CartPoleEnv(batch_size=[2], seed=0), _gated_policy(gate), num_trajectories=2, max_steps=4,
                   busy_policy=busy_policy, on_result=got.append,
                   metrics_fn=lambda batch: {"mean_obs": float(batch["observation"].mean())})
    assert ev.trigger_eval(step=10) and ev.pending and ev.poll() is None
    if busy_policy == "skip":
        assert ev.trigger_eval(step=11) is False
    elif busy_policy == "error":
        with pytest.raises(RuntimeError, match="still running"):
            ev.trigger_eval(step=11)
    else:
        assert ev.trigger_eval(step=11)
    with pytest.raises(RuntimeError, match="wait\\(\\) first"):
        ev.state_dict()
    gate.set()
    first = ev.wait(10)
    assert first["eval/step"] == 10 and first["eval/reward"] == 4.0 and "eval/mean_obs" in first
    if busy_policy == "queue":
        assert ev.wait(10)["eval/step"] == 11
    assert ev.wait(0.01) is None and not ev.pending
    assert isinstance(got[0], TensorDictBase) and float(got[0]["eval/reward"]) == 4.0
    ev.load_state_dict({"step": 42})
    assert ev.state_dict() == {"step": 42} and ev.evaluate()["eval/step"] == 42
    ev.shutdown()


def test_policy_factory_builds_lazily_in_thread():
    seen = []

    def factory(env):
        seen.append((threading.current_thread().name, tuple(env.batch_size)))
        return _left_policy()

    ev = Evaluator(lambda: CartPoleEnv(batch_size=[2]), policy_factory=factory, num_trajectories=2, max_steps=2)
    ev.trigger_eval()
    assert ev.wait(10)["eval/episode_length"] == 2.0
    assert seen == [("steersman-evaluator", (2,))]
    ev.shutdown()


def test_bad_arguments():
    env = CartPoleEnv()
    with pytest.raises(ValueError, match="exactly one of policy and policy_factory"):
        Evaluator(env)
    with pytest.raises(ValueError, match="backend='ray'"):
        Evaluator(env, _left_policy(), backend="ray")
    with pytest.raises(ValueError, match="pass env as a callable and a policy_factory"):
        Evaluator(env, _left_policy(), backend="process")
    with pytest.raises(ValueError, match="weight_sync_schemes are not supported"):
        Evaluator(env, _left_policy(), weight_sync_schemes={"policy": object()})
    with pytest.raises(ValueError, match="busy_policy must be one of"):
        Evaluator(env, _left_policy(), busy_policy="drop")
    with pytest.raises(ValueError, match="collector_cls 'Nope'"):
        Evaluator(env, _left_policy(), collector_cls="Nope").evaluate()


def test_process_backend_runs_the_episodes_in_a_child():
    calls = []
    ev = Evaluator(lambda: CartPoleEnv(batch_size=[2]), policy_factory=lambda env: _left_policy(),
                   num_trajectories=3, max_steps=4, backend="process", init_fn=lambda: calls.append(1))
    m = ev.evaluate(step=5)
    assert (m["eval/num_episodes"], m["eval/reward"], m["eval/episode_length"], m["eval/step"]) == (3, 4.0, 4.0, 5)
    assert calls == []  # init_fn ran in the child process, not here
    ev.shutdown()
