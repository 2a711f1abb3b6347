"""TorchRL's search primitives: hashing modules, QueryModule, TensorDictMap, score modules."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.data import LazyTensorStorage
from steersman.data.map import (
    BinaryToDecimal,
    HashToInt,
    QueryModule,
    RandomProjectionHash,
    SipHash,
    TensorDictMap,
)
from steersman.modules.mcts_scores import EXP3Score, MCTSScores, PUCTScore, UCB1TunedScore, UCBScore
from steersman.tensordict import TensorDict


# ---------------------------------------------------------------------- hashes
def test_siphash_equal_rows_equal_hashes_and_no_collisions():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5000, 3, generator=g)
    h = SipHash()(torch.cat([x, x[:100]]))
    assert h.dtype == torch.int64 and h.shape == (5100,)
    assert torch.equal(h[:100], h[5000:])
    assert h[:5000].unique().numel() == 5000  # 5000 distinct rows, no collision
    # the bytes matter: same values in another dtype hash differently
    assert not torch.equal(SipHash()(x[:10]), SipHash()(x[:10].double()))
    assert SipHash(as_tensor=False)(x[:2]) == h[:2].tolist()


def test_siphash_is_stable_across_processes():
    """Unlike TorchRL's (Python's ``hash``, PYTHONHASHSEED-dependent), the value is a
    fixed function of the bytes: BLAKE2b-64 of the row, keyed."""
    import hashlib

    row = torch.tensor([[1.0, 2.0, 3.0]])
    want = int.from_bytes(hashlib.blake2b(row.numpy().tobytes(), digest_size=8, key=b"steersman.map").digest(),
                          "little", signed=True)
    assert SipHash()(row).item() == want


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.integers(0, 1), min_size=8, max_size=8), min_size=1, max_size=6),
       st.sampled_from([1, 2, 4, 8]))
def test_binary_to_decimal_matches_int_base_2(rows, num_bits):
    out = BinaryToDecimal(num_bits=num_bits, device="cpu", dtype=torch.int64)(torch.tensor(rows))
    ref = [sum(int("".join(map(str, r[i:i + num_bits])), 2) for i in range(0, 8, num_bits)) for r in rows]
    assert out.tolist() == ref


def test_binary_to_decimal_bad_width():
    with pytest.raises(ValueError, match=r"last dim \(6\) must be a multiple of num_bits \(4\)"):
        BinaryToDecimal(num_bits=4, device="cpu", dtype=torch.int32)(torch.zeros(2, 6))


def test_random_projection_hash_collides_only_below_its_precision():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200, 32, generator=g)
    h = RandomProjectionHash(n_components=8)
    base = h(x)
    # far below bfloat16's resolution: the same hash, except for the rare row with a
    # projected value right at a rounding boundary
    assert (base == h(x + 1e-6)).float().mean() >= 0.95
    assert (base != h(x + 1.0)).all()  # a large move: a new hash
    assert base.unique().numel() == 200
    with pytest.raises(ValueError, match="fitted on 32 features, got an input with 5"):
        h(torch.zeros(3, 5))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.integers(-3, 3), max_size=10), min_size=1, max_size=4))
def test_hash_to_int_first_appearance_order(batches):
    h2i, ref = HashToInt(), {}
    for b in batches:
        out = h2i(torch.tensor(b, dtype=torch.int64)).tolist()
        assert out == [ref.setdefault(x, len(ref)) for x in b]
    restored = HashToInt()
    restored.load_state_dict(h2i.state_dict())
    probe = torch.tensor(list(ref) + [100], dtype=torch.int64)
    assert restored.lookup(probe).tolist() == list(ref.values()) + [-1]


# ---------------------------------------------------------------------- query / map
def keys_td(a, b):
    return TensorDict({"k1": torch.tensor(a, dtype=torch.float32).unsqueeze(-1),
                       "k2": torch.tensor(b, dtype=torch.float32).unsqueeze(-1)}, batch_size=[len(a)])


def test_query_module_equal_keys_equal_index():
    q = QueryModule(in_keys=["k1", "k2"], index_key="index")
    td = keys_td([1, 1, 1, 2], [3, 3, 2, 3])
    out = q(td)
    assert out["index"].tolist() == [0, 0, 1, 2]
    assert out["_hash"][0] == out["_hash"][1] and out["_hash"][1] != out["_hash"][2]
    # per-key hash modules and an explicit aggregator
    q2 = QueryModule(in_keys=["k1", "k2"], hash_module=[SipHash(), SipHash()], aggregator=SipHash())
    assert q2(keys_td([1, 1, 1, 2], [3, 3, 2, 3]))["_index"].tolist() == [0, 0, 1, 2]
    with pytest.raises(KeyError, match="no entry 'k3'"):
        QueryModule(in_keys=["k3"])(td)
    with pytest.raises(ValueError, match="got 1 hash modules for 2 in_keys"):
        QueryModule(in_keys=["k1", "k2"], hash_module=[SipHash()])


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(-2, 2), st.integers(-2, 2), st.floats(-5, 5, width=32)), min_size=1,
                max_size=6), st.lists(st.tuples(st.integers(-2, 2), st.integers(-2, 2)), min_size=1, max_size=6))
def test_tensordict_map_against_a_dict(writes, probes):
    m = TensorDictMap(query_module=QueryModule(in_keys=["k1", "k2"]), storage={"v": LazyTensorStorage(100)})
    ref = {}
    for a, b, v in writes:  # one element per write: later writes of a key overwrite it
        m[keys_td([a], [b])] = TensorDict({"v": torch.tensor([[v]])}, batch_size=[1])
        ref[(a, b)] = v
    assert len(m) == len(ref)
    probe = keys_td([p[0] for p in probes], [p[1] for p in probes])
    assert m.contains(probe).tolist() == [p in ref for p in probes]
    known = [p for p in probes if p in ref]
    if known:
        got = m[keys_td([p[0] for p in known], [p[1] for p in known])]["v"].flatten().tolist()
        assert got == [pytest.approx(ref[p]) for p in known]
    if len(known) < len(probes):
        with pytest.raises(KeyError, match="were never written"):
            m[probe]


def test_tensordict_map_write_fn_from_pair_and_errors():
    src = keys_td([0, 1], [0, 1])
    dest = TensorDict({"count": torch.ones(2, 1)}, batch_size=[2])
    m = TensorDictMap.from_tensordict_pair(src, dest, in_keys=["k1", "k2"], write_fn=lambda old, new: old + new)
    m[src] = dest
    m[keys_td([1, 5], [1, 5])] = TensorDict({"count": torch.ones(2, 1)}, batch_size=[2])
    assert m[keys_td([0, 1, 5], [0, 1, 5])]["count"].flatten().tolist() == [1.0, 2.0, 1.0]
    # forward fills the values in
    out = m(keys_td([1], [1]))
    assert out["count"].item() == 2.0
    with pytest.raises(ValueError, match=r"batch size \[2\], got \[3\]"):
        m[src] = TensorDict({"count": torch.ones(3, 1)}, batch_size=[3])
    with pytest.raises(KeyError, match=r"values have no entries \['count'\]"):
        m[src] = TensorDict({"other": torch.ones(2, 1)}, batch_size=[2])
    m.clear()
    assert len(m) == 0 and not m.contains(src).any()


# ---------------------------------------------------------------------- scores
def stats(seed, shape=(4, 5)):
    g = torch.Generator().manual_seed(seed)
    visits = torch.randint(0, 6, shape, generator=g).float()
    wins = torch.rand(shape, generator=g) * visits
    return visits, wins, visits.sum(-1), torch.softmax(torch.randn(shape, generator=g), -1)


@pytest.mark.parametrize("seed", [0, 1])
def test_puct_and_ucb_match_their_formulas(seed):
    visits, wins, total, prior = stats(seed)
    td = TensorDict({"win_count": wins, "visits": visits, "total_visits": total, "prior_prob": prior}, [4])
    puct = PUCTScore(c=1.5)(td.clone())["score"]
    ucb = UCBScore(c=0.7)(td.clone())["score"]
    for i in range(4):
        for a in range(5):
            n, w, tot, p = visits[i, a].item(), wins[i, a].item(), total[i].item(), prior[i, a].item()
            mean = w / n if n > 0 else 0.0
            assert puct[i, a].item() == pytest.approx(mean + 1.5 * p * math.sqrt(tot) / (1 + n), rel=1e-5)
            assert ucb[i, a].item() == pytest.approx(mean + 0.7 * math.sqrt(tot) / (1 + n), rel=1e-5)
    assert MCTSScores.PUCT.value is PUCTScore and MCTSScores.UCB1_TUNED.value is UCB1TunedScore


def test_ucb1_tuned_matches_its_formula():
    visits, wins, total, _ = stats(3)
    sq = wins * 0.8
    td = TensorDict({"win_count": wins, "visits": visits, "total_visits": total, "sum_squared_rewards": sq}, [4])
    score = UCB1TunedScore(exploration_constant=2.0)(td)["score"]
    for i in range(4):
        for a in range(5):
            n, w, s, tot = visits[i, a].item(), wins[i, a].item(), sq[i, a].item(), total[i].item()
            if n == 0:
                assert score[i, a].item() == math.inf
                continue
            mean, ln = w / n, math.log(max(tot, 1.0))
            v = s / n - mean ** 2 + math.sqrt(2.0 * ln / n)
            assert score[i, a].item() == pytest.approx(mean + math.sqrt(ln / n * min(0.25, v)), rel=1e-5)


def test_exp3_probabilities_and_update():
    w = torch.tensor([[1.0, 2.0, 5.0]])
    td = TensorDict({"weights": w, "num_actions": torch.tensor([3])}, [1])
    exp3 = EXP3Score(gamma=0.2)
    p = exp3(td)["score"]
    ref = 0.8 * w / w.sum() + 0.2 / 3
    torch.testing.assert_close(p, ref)
    assert torch.equal(td["action_prob"], p)
    exp3.update_weights(td, 1, 0.5)
    assert td["weights"][0, 1].item() == pytest.approx(2.0 * math.exp(0.2 / 3 * 0.5 / ref[0, 1].item()), rel=1e-6)
    assert td["weights"][0, 0].item() == 1.0
    with pytest.raises(ValueError, match=r"reward must be in \[0, 1\], got 2"):
        exp3.update_weights(td, 0, 2)
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\]"):
        EXP3Score(gamma=1.5)
