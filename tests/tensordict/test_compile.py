"""torch.compile traces TensorDict code with fullgraph=True (CPU backend)."""

from __future__ import annotations

import pytest
import torch

from steersman import TensorDict


def _build_and_use(obs: torch.Tensor, reward: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    td = TensorDict({"obs": obs, "next": {"reward": reward}}, batch_size=[obs.shape[0]])
    td["action"] = td["obs"] * 2  # set + get
    td.set(("next", "obs"), obs + 1)  # nested set creates the sub-dict
    sub = td[1:3]  # slice
    picked = td[idx]  # tensor index
    doubled = td.apply(lambda x: x * 2)
    summed = doubled + td - 1.0  # arithmetic with a TensorDict and a scalar
    stacked = torch.stack([summed, td], 0)
    cat = torch.cat([td, td], 0)
    return (
        stacked["next", "reward"].sum()
        + sub["action"].sum()
        + picked.get(("next", "obs")).sum()
        + cat["obs"].mean()
        + stacked[0]["obs"].sum()
    )


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_fullgraph_matches_eager():
    g = torch.Generator().manual_seed(0)
    obs, reward = torch.randn(4, 3, generator=g), torch.randn(4, 1, generator=g)
    idx = torch.tensor([0, 2])
    expected = _build_and_use(obs, reward, idx)
    compiled = torch.compile(_build_and_use, fullgraph=True, backend="inductor")
    torch.testing.assert_close(compiled(obs, reward, idx), expected)
    # new values, same shapes: still correct (and no graph break, or fullgraph raises)
    obs2 = torch.randn(4, 3, generator=g)
    torch.testing.assert_close(compiled(obs2, reward, idx), _build_and_use(obs2, reward, idx))


def test_fullgraph_eager_backend_counts_one_graph():
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    obs, reward, idx = torch.randn(4, 3), torch.randn(4, 1), torch.tensor([1, 3])
    compiled = torch.compile(_build_and_use, fullgraph=True, backend=counter)
    compiled(obs, reward, idx)
    assert counter.frame_count == 1
    assert counter.op_count > 10  # the TensorDict ops were traced, not skipped


def test_tensordict_as_input_and_output():
    def step(td: TensorDict) -> TensorDict:
        out = td.clone()
        out["obs"] = td["obs"] + td["next", "reward"]
        return out.unsqueeze(0)

    td = TensorDict({"obs": torch.randn(5, 2), "next": {"reward": torch.randn(5, 1)}}, [5])
    compiled = torch.compile(step, fullgraph=True, backend="eager")
    out = compiled(td)
    assert out.batch_size == torch.Size([1, 5])
    torch.testing.assert_close(out["obs"], step(td)["obs"])
