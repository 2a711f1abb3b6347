"""MultiStepActorWrapper: the served action is the chunk's ``counter - 1``-th entry, new
chunks come on episode starts and every ``replan_interval`` steps, for those rows only."""

from __future__ import annotations

import pytest
import torch

from steersman.envs import TransformedEnv
from steersman.envs.native import PendulumEnv
from steersman.envs.transforms import Compose, InitTracker, StepCounter
from steersman.modules import MultiStepActorWrapper
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import TensorDictModule

N = 3


class Planner(torch.nn.Module):
    """A chunk ``[B, N, 1]``: ``plan_id * 10 + k`` for ``k < N``; counts its calls per row."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, plan_id: torch.Tensor) -> torch.Tensor:
        self.calls += plan_id.shape[0]
        return plan_id.unsqueeze(-2) * 10 + torch.arange(float(N)).view(N, 1)


def _policy(**kwargs):
    planner = Planner()
    return planner, MultiStepActorWrapper(TensorDictModule(planner, ["plan_id"], ["action"]), N, **kwargs)


def _reference(starts: list[list[bool]], interval: int) -> list[list[tuple[int, int]]]:
    """(plan step t, index) per row and step, by hand: a row plans at a start or after ``interval`` uses."""
    out = []
    used = [None] * len(starts[0])
    plan_at = [None] * len(starts[0])
    for t, row_starts in enumerate(starts):
        step = []
        for b, start in enumerate(row_starts):
            if start or used[b] >= interval:
                plan_at[b], used[b] = t, 0
            used[b] += 1
            step.append((plan_at[b], used[b] - 1))
        out.append(step)
    return out


@pytest.mark.parametrize("replan_interval", [None, 1, 2])
def test_served_actions_follow_a_reference_schedule(replan_interval):
    planner, policy = _policy(replan_interval=replan_interval)
    starts = [[True, True, True], [False, False, False], [False, True, False], [False, False, False],
              [False, False, False], [True, False, False], [False, False, False]]
    expected = _reference(starts, replan_interval or N)
    td = TensorDict({}, [3])
    for t, row_starts in enumerate(starts):
        td["plan_id"] = torch.full((3, 1), float(t))  # a plan made at step t starts at t * 10
        td["is_init"] = torch.tensor(row_starts).unsqueeze(-1)
        td = policy(td)
        got = td["action"][:, 0].tolist()
        assert got == [p * 10 + k for p, k in expected[t]], (t, got, expected[t])
        assert td["action"].shape == (3, 1) and td["action_orig"].shape == (3, N, 1)
    replans = sum(1 for t, step in enumerate(expected) for p, _ in step if p == t)
    assert planner.calls == replans  # only the rows that needed a new plan ran the actor


def test_env_rollout_replans_at_resets_and_keeps_dim():
    env = TransformedEnv(PendulumEnv(batch_size=[2], seed=0), Compose(InitTracker(), StepCounter(max_steps=4)))
    chunk = TensorDictModule(lambda obs: (torch.arange(float(N)) / N).view(1, N, 1).expand(obs.shape[0], N, 1),
                             ["observation"], ["action"])
    data = env.rollout(10, MultiStepActorWrapper(chunk, N), break_when_any_done=False)
    index = [0, 1, 2, 0, 0, 1, 2, 0, 0, 1]  # a new plan every N steps and at each reset (every 4 steps)
    torch.testing.assert_close(data["action"][:, :, 0], (torch.tensor(index) / N).expand(2, 10))
    td = TensorDict({"observation": torch.zeros(2, 3), "is_init": torch.ones(2, 1, dtype=torch.bool)}, [2])
    assert MultiStepActorWrapper(chunk, N, keep_dim=True)(td)["action"].shape == (2, 1, 1)


def test_chunk_keys_map_to_action_keys():
    planner = Planner()
    actor = TensorDictModule(planner, ["plan_id"], ["action_chunk"])
    policy = MultiStepActorWrapper(actor, N)
    assert policy.action_keys == ["action"] and policy.cache_keys == ["action_chunk"]
    td = TensorDict({"plan_id": torch.ones(2, 1), "is_init": torch.ones(2, 1, dtype=torch.bool)}, [2])
    assert policy(td)["action"].tolist() == [[10.0], [10.0]]
    assert policy(td.set("is_init", torch.zeros(2, 1, dtype=torch.bool)))["action"].tolist() == [[11.0], [11.0]]
    vla = MultiStepActorWrapper(TensorDictModule(Planner(), ["plan_id"], [("vla_action", "chunk")]), N)
    assert vla.action_keys == ["action"]


def test_bad_input_is_refused():
    _, policy = _policy()
    with pytest.raises(KeyError, match="is_init"):
        policy(TensorDict({"plan_id": torch.ones(2, 1)}, [2]))
    with pytest.raises(RuntimeError, match="first call must start every row"):
        policy(TensorDict({"plan_id": torch.ones(2, 1), "is_init": torch.tensor([[True], [False]])}, [2]))
    with pytest.raises(ValueError, match="replan_interval"):
        _policy(replan_interval=N + 1)
    wrong = MultiStepActorWrapper(TensorDictModule(Planner(), ["plan_id"], ["action"]), N + 1)
    with pytest.raises(RuntimeError, match="expected n_steps=4"):
        wrong(TensorDict({"plan_id": torch.ones(2, 1), "is_init": torch.ones(2, 1, dtype=torch.bool)}, [2]))
