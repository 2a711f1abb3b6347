"""Prioritized sampling: frequencies, importance weights, priority bookkeeping, bad priorities."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.data.replay_buffers import (
    LazyTensorStorage,
    ListStorage,
    PrioritizedReplayBuffer,
    PrioritizedSampler,
    TensorDictPrioritizedReplayBuffer,
)
from steersman.data.replay_buffers.samplers import _max_if_valid
from steersman.tensordict import TensorDict

# chi-square critical values at p = 0.001
CHI2_999 = {7: 24.32, 9: 27.88, 19: 43.82}


def filled(n: int, alpha: float = 1.0, beta: float = 1.0, eps: float = 0.0, cap: int | None = None):
    rb = PrioritizedReplayBuffer(alpha=alpha, beta=beta, eps=eps, storage=LazyTensorStorage(cap or n))
    rb.extend(torch.arange(n).unsqueeze(-1))
    return rb


@pytest.mark.parametrize("alpha", [1.0, 0.6])
def test_frequencies_match_priorities_chi_square(alpha):
    torch.manual_seed(1234)
    n = 10
    rb = filled(n, alpha=alpha, eps=0.0, cap=16)  # capacity larger than the fill: empty slots never drawn
    prio = torch.tensor([0.5, 1.0, 2.0, 3.0, 0.25, 4.0, 1.5, 0.75, 2.5, 1.0])
    rb.update_priority(torch.arange(n), prio)
    draws = 50_000
    _, info = rb.sample(draws, return_info=True)
    counts = torch.bincount(info["index"], minlength=16).double()
    assert counts[n:].sum() == 0
    p = prio.double() ** alpha
    expected = draws * p / p.sum()
    chi2 = (((counts[:n] - expected) ** 2) / expected).sum().item()
    assert chi2 < CHI2_999[9], chi2
    # and it is not uniform (the test can fail)
    uniform = torch.full((n,), draws / n, dtype=torch.float64)
    assert (((counts[:n] - uniform) ** 2) / uniform).sum().item() > 100


def test_importance_weights_match_formula():
    torch.manual_seed(0)
    n, alpha, beta, eps = 8, 0.7, 0.4, 1e-3
    rb = filled(n, alpha=alpha, beta=beta, eps=eps)
    prio = torch.tensor([0.1, 0.5, 1.0, 2.0, 0.05, 3.0, 0.7, 1.2])
    rb.update_priority(torch.arange(n), prio)
    _, info = rb.sample(500, return_info=True)
    p = (prio.double() + eps) ** alpha
    P = p / p.sum()
    w = (n * P) ** (-beta)
    w = w / w.max()  # max over all stored items: the least likely one
    want = w[info["index"]].float()
    torch.testing.assert_close(info["_weight"], want, rtol=1e-5, atol=1e-6)
    assert info["_weight"].dtype == torch.float32


def test_beta_zero_weights_are_one_and_alpha_zero_is_uniform():
    torch.manual_seed(0)
    rb = filled(5, alpha=0.0, beta=0.0)
    rb.update_priority(torch.arange(5), torch.tensor([1.0, 100.0, 1.0, 1.0, 1.0]))
    _, info = rb.sample(20000, return_info=True)
    assert torch.equal(info["_weight"], torch.ones(20000))
    counts = torch.bincount(info["index"], minlength=5).double()
    assert ((counts - 4000).abs() < 400).all()


def test_new_items_get_max_priority():
    rb = filled(4)
    assert torch.equal(rb.sampler._tree.leaves(), torch.ones(4, dtype=torch.float64))
    rb.update_priority(torch.tensor([0, 1]), torch.tensor([0.5, 7.0]))
    rb.extend(torch.tensor([[9]]))  # overwrites slot 0 with the max priority seen: 7
    assert rb.sampler._tree.leaves()[0].item() == pytest.approx(7.0)
    assert rb.sampler.max_priority == 7.0


def test_max_priority_within_buffer():
    s = PrioritizedSampler(4, alpha=1.0, beta=1.0, eps=0.0, max_priority_within_buffer=True)
    s.extend(torch.arange(4))
    s.update_priority(torch.arange(4), torch.tensor([1.0, 9.0, 2.0, 3.0]))
    assert s.max_priority == pytest.approx(9.0)
    s.update_priority(torch.tensor([1]), torch.tensor([0.5]))  # the 9 is gone from the buffer
    assert s.max_priority == pytest.approx(3.0)
    plain = PrioritizedSampler(4, alpha=1.0, beta=1.0, eps=0.0)
    plain.update_priority(torch.tensor([1]), torch.tensor([9.0]))
    plain.update_priority(torch.tensor([1]), torch.tensor([0.5]))
    assert plain.max_priority == 9.0  # the largest ever set


def test_duplicate_indices_last_wins():
    rb = filled(4, eps=0.0)
    rb.update_priority(torch.tensor([2, 2, 3, 2]), torch.tensor([5.0, 6.0, 1.0, 0.5]))
    leaves = rb.sampler._tree.leaves()
    assert leaves.tolist() == [1.0, 1.0, 0.5, 1.0]
    assert rb.sampler._tree.total() == pytest.approx(3.5)
    assert rb.sampler._tree.min() == 0.5


def test_reduction_of_multi_value_priorities():
    s = PrioritizedSampler(4, alpha=1.0, beta=1.0, eps=0.0, reduction="mean")
    s.extend(torch.arange(4))
    s.update_priority(torch.tensor([0, 1]), torch.tensor([[1.0, 3.0], [2.0, 6.0]]))
    assert s._tree.leaves()[:2].tolist() == [2.0, 4.0]
    s2 = PrioritizedSampler(4, alpha=1.0, beta=1.0, eps=0.0)  # max by default
    s2.extend(torch.arange(4))
    s2.update_priority(torch.tensor([0, 1]), torch.tensor([[1.0, 3.0], [2.0, 6.0]]))
    assert s2._tree.leaves()[:2].tolist() == [3.0, 6.0]


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), -float("inf")])
def test_bad_priorities_raise_and_change_nothing(bad):
    rb = filled(6)
    rb.update_priority(torch.arange(6), torch.arange(1.0, 7.0))
    before = rb.sampler._tree._tensors['sum'].clone()
    min_before = rb.sampler._tree.min()
    prio = torch.tensor([1.0, 2.0, bad])
    with pytest.raises(ValueError, match="finite and >= 0"):
        rb.update_priority(torch.tensor([0, 1, 2]), prio)
    assert torch.equal(rb.sampler._tree._tensors['sum'], before)
    assert rb.sampler._tree.min() == min_before
    assert rb.sampler.max_priority == 6.0


def test_bad_priority_indices_and_shapes():
    rb = filled(4, cap=8)
    with pytest.raises(IndexError, match="hold items"):
        rb.update_priority(torch.tensor([0, 4]), torch.tensor([1.0, 1.0]))  # slot 4 is empty
    with pytest.raises(IndexError):
        rb.update_priority(torch.tensor([-1]), torch.tensor([1.0]))
    with pytest.raises(ValueError, match="for 2 indices"):
        rb.update_priority(torch.tensor([0, 1]), torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(TypeError):
        rb.update_priority(torch.tensor([0.0]), torch.tensor([1.0]))
    with pytest.raises(ValueError):
        PrioritizedSampler(4, alpha=-1.0, beta=0.5)
    with pytest.raises(ValueError):
        PrioritizedSampler(4, alpha=1.0, beta=float("nan"))


def test_all_zero_priorities_error():
    rb = filled(3, eps=0.0)
    rb.update_priority(torch.arange(3), torch.zeros(3))
    with pytest.raises(RuntimeError, match="zero"):
        rb.sample(2)


def test_td_prioritized_buffer_round_trip_of_priorities():
    torch.manual_seed(0)
    rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=0.5, eps=0.0, storage=LazyTensorStorage(10), batch_size=4)
    rb.extend(TensorDict({"obs": torch.arange(10.0)}, [10]))
    batch = rb.sample()
    assert set(batch.keys()) >= {"index", "_weight", "obs"}
    batch["td_error"] = torch.full((4,), 5.0)
    rb.update_tensordict_priority(batch)
    leaves = rb.sampler._tree.leaves()
    assert torch.equal(leaves[batch["index"]], torch.full((4,), 5.0, dtype=torch.float64))
    # extend with priorities already in the data: they are used instead of the max priority
    rb2 = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=0.5, eps=0.0, storage=LazyTensorStorage(10))
    rb2.extend(TensorDict({"obs": torch.zeros(3), "td_error": torch.tensor([1.0, 2.0, 3.0])}, [3]))
    idx = rb2.extend(TensorDict({"obs": torch.zeros(2), "td_error": torch.tensor([0.25, 8.0])}, [2]))
    assert rb2.sampler._tree.leaves()[:5].tolist() == [1.0, 2.0, 3.0, 0.25, 8.0]
    assert idx.tolist() == [3, 4]


def test_prioritized_with_list_storage():
    torch.manual_seed(0)
    rb = PrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=ListStorage(5))
    rb.extend(["a", "b", "c"])
    rb.update_priority(torch.tensor([0, 1, 2]), torch.tensor([0.0, 0.0, 1.0]))
    assert set(rb.sample(20)) == {"c"}


def test_updates_after_wrap_around_match_a_reference():
    # capacity 10, 25 items written: slots hold the newest items, new ones get max priority
    rb = PrioritizedReplayBuffer(alpha=1.0, beta=1.0, eps=0.0, storage=LazyTensorStorage(10))
    ref = {}
    for start in range(0, 25, 5):
        idx = rb.extend(torch.arange(start, start + 5).unsqueeze(-1))
        for i in idx.tolist():
            ref[i] = rb.sampler.max_priority
        prio = torch.arange(1.0, 6.0) * (start + 1)
        upd = torch.cat([idx[:3], idx[:1]])  # a duplicate: the last value wins
        vals = torch.cat([prio[:3], torch.tensor([0.25])])
        rb.update_priority(upd, vals)
        for i, v in zip(upd.tolist(), vals.tolist()):
            ref[i] = v
    want = torch.tensor([ref[i] for i in range(10)], dtype=torch.float64)
    assert torch.equal(rb.sampler._tree.leaves(), want)
    assert rb.sampler._tree.min() == min(ref.values()) and rb.sampler._tree.total() == pytest.approx(sum(ref.values()))
    _, info = rb.sample(200, return_info=True)
    expected = (want[info["index"]] / want.min()) ** -1.0
    torch.testing.assert_close(info["_weight"], expected.float())


def test_negative_zero_priority_is_zero_and_bad_ones_name_the_values():
    rb = filled(3, eps=0.0)
    rb.update_priority(torch.tensor([0, 1]), torch.tensor([-0.0, 2.0]))
    assert rb.sampler._tree.leaves().tolist() == [0.0, 2.0, 1.0]
    assert rb.sampler.max_priority == 2.0
    with pytest.raises(ValueError, match=r"-1e-30"):
        rb.update_priority(torch.tensor([0]), torch.tensor([-1e-30], dtype=torch.float64))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.just(-0.0), st.just(0.0)),
                min_size=1, max_size=20))
def test_max_if_valid_matches_a_plain_check(values):
    x = np.array(values, dtype=np.float64) + 0.0  # as update_priority: -0.0 becomes 0.0
    ok = bool(np.all(np.isfinite(x) & (x >= 0)))
    got = _max_if_valid(x)
    assert (got is not None) == ok
    if ok:
        assert got == x.max()
