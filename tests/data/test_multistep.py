"""MultiStep n-step returns against a plain per-step loop."""

from __future__ import annotations

import pytest
import torch

from steersman.data import MultiStep
from steersman.tensordict import TensorDict


def _batch(B, T, reward_1d, seed):
    g = torch.Generator().manual_seed(seed)
    done = torch.rand(B, T, 1, generator=g) < 0.25
    term = done & (torch.rand(B, T, 1, generator=g) < 0.5)
    reward = torch.randn(B, T, 1, generator=g)
    obs = torch.randn(B, T + 1, 2, generator=g)
    return TensorDict({
        "obs": obs[:, :-1],
        "next": {"obs": obs[:, 1:], "reward": reward.squeeze(-1) if reward_1d else reward, "done": done,
                 "terminated": term, "truncated": done & ~term, "pixels": {"x": torch.randn(B, T, 3, 2)}},
    }, [B, T])


def _reference(td, gamma, n):
    """Per-step loops: window stops at a done step (included) or the batch end."""
    B, T = td.batch_size
    r = td["next", "reward"].reshape(B, T)
    done = td["next", "done"].reshape(B, T)
    out = {"ret": torch.zeros(B, T), "m": torch.zeros(B, T, dtype=torch.long), "last": torch.zeros(B, T, dtype=torch.long)}
    for b in range(B):
        for t in range(T):
            total, k = 0.0, 0
            while True:
                total += gamma**k * float(r[b, t + k])
                k += 1
                if bool(done[b, t + k - 1]) or t + k == T or k == n:
                    break
            out["ret"][b, t], out["m"][b, t], out["last"][b, t] = total, k, t + k - 1
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 6])
@pytest.mark.parametrize("reward_1d", [False, True])
def test_multistep_matches_plain_loop(n, reward_1d):
    gamma = 0.9
    td = _batch(3, 9, reward_1d, seed=n)
    before = td.clone()
    ref = _reference(before, gamma, n)
    out = MultiStep(gamma, n)(td)
    assert out is td
    torch.testing.assert_close(out["next", "reward"].reshape(3, 9), ref["ret"])
    assert out["next", "reward"].shape == before["next", "reward"].shape
    assert torch.equal(out["next", "original_reward"], before["next", "reward"])
    assert torch.equal(out["steps_to_next_obs"], ref["m"])
    torch.testing.assert_close(out["gamma"], gamma ** ref["m"].float())
    B_idx = torch.arange(3).unsqueeze(-1)
    for key in [("obs",), ("done",), ("terminated",), ("truncated",), ("pixels", "x")]:
        assert torch.equal(out[("next", *key)], before[("next", *key)][B_idx, ref["last"]]), key
    ends = before["next", "done"].squeeze(-1).clone()
    ends[:, -1] = True
    assert torch.equal(out["nonterminal"], ~ends)
    assert torch.equal(out["obs"], before["obs"])  # the current step is untouched


def test_window_reaching_a_terminal_state_is_marked_terminated():
    done = torch.tensor([[False, False, True, False]]).unsqueeze(-1)
    td = TensorDict({"next": {"reward": torch.ones(1, 4, 1), "done": done, "terminated": done.clone(),
                              "obs": torch.arange(4.0).view(1, 4, 1)}}, [1, 4])
    out = MultiStep(0.99, 3)(td)
    assert out["next", "terminated"].squeeze(-1).tolist() == [[True, True, True, False]]
    assert out["next", "obs"].squeeze(-1).tolist() == [[2.0, 2.0, 2.0, 3.0]]


def test_multistep_bad_input():
    with pytest.raises(ValueError, match="n_steps"):
        MultiStep(0.9, 0)
    with pytest.raises(ValueError, match="gamma"):
        MultiStep(1.5, 2)
    td = TensorDict({"next": {"reward": torch.ones(4, 1)}}, [4])
    with pytest.raises(KeyError, match="needs the entry.*done"):
        MultiStep(0.9, 2)(td)
    assert set(td.keys(True, True)) == {("next", "reward")}  # nothing written
