"""Preallocation: an indexed write that brings new keys allocates them over the whole batch.

``td = TensorDict({}, [N]); td[0] = TensorDict({"a": x}, [])`` gives ``"a"`` the shape
``[N, *x.shape]`` (zeros of ``x``'s dtype) and writes row 0. Checked against a plain
dict-of-tensors reference (hypothesis), on every container variant of the battery, and
for failed writes (nothing is added).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.tensordict import NonTensorData, TensorDict, lazy_stack

from .conftest import BATCH, LEAF_KEYS, assert_matches, ref_get

# ----------------------------------------------------------------------------- reference
INDEX_KINDS = ["int", "neg_int", "slice", "step_slice", "long", "mask", "int_int", "slice_int"]


def make_index(kind: str, bs: tuple, draw_int: int):
    n0 = bs[0]
    if kind == "int":
        return draw_int % n0
    if kind == "neg_int":
        return -1 - draw_int % n0
    if kind == "slice":
        return slice(draw_int % n0, None)
    if kind == "step_slice":
        return slice(0, None, 2)
    if kind == "long":
        return torch.tensor(sorted({draw_int % n0, (draw_int + 1) % n0}))
    if kind == "mask":
        m = torch.zeros(n0, dtype=torch.bool)
        m[draw_int % n0] = True
        m[-1] = True
        return m
    if len(bs) < 2:
        return draw_int % n0
    if kind == "int_int":
        return (draw_int % n0, draw_int % bs[1])
    return (slice(None), draw_int % bs[1])


def ref_write(ref: dict, batch: tuple, index, value: dict, vbd: int) -> None:
    """The dict-of-tensors reference of ``td[index] = value`` (``vbd``: value batch dims)."""
    for k, v in value.items():
        if isinstance(v, dict):
            ref_write(ref.setdefault(k, {}), batch, index, v, vbd)
            continue
        if k not in ref:
            ref[k] = torch.zeros(batch + tuple(v.shape[vbd:]), dtype=v.dtype)
        ref[k][index] = v


def assert_tree(td, ref: dict, prefix=()) -> None:
    for k, v in ref.items():
        if isinstance(v, dict):
            assert_tree(td, v, prefix + (k,))
        else:
            got = td.get(prefix + (k,))
            assert got.dtype == v.dtype, (prefix + (k,), got.dtype, v.dtype)
            assert torch.equal(got, v), (prefix + (k,), got, v)


FEATURES = st.lists(st.integers(1, 3), min_size=0, max_size=2)
DTYPES = st.sampled_from([torch.float32, torch.int64, torch.bool])


@settings(max_examples=40, deadline=None)
@given(
    bs=st.lists(st.integers(2, 4), min_size=1, max_size=2).map(tuple),
    kind=st.sampled_from(INDEX_KINDS),
    draw_int=st.integers(0, 10),
    existing=st.booleans(),
    feats=st.lists(st.tuples(FEATURES, DTYPES), min_size=1, max_size=3),
    nested=st.booleans(),
    as_dict=st.booleans(),
)
def test_indexed_write_of_new_keys_matches_a_dict_reference(bs, kind, draw_int, existing, feats,
                                                           nested, as_dict):
    index = make_index(kind, bs, draw_int)
    g = torch.Generator().manual_seed(draw_int)
    ref: dict = {}
    td = TensorDict({}, batch_size=bs)
    if existing:  # an entry the write also updates (the mixed case)
        ref["old"] = torch.randn(bs + (2,), generator=g)
        td["old"] = ref["old"].clone()
    nbs = torch.empty(bs)[index].shape
    value: dict = {}
    if existing:
        value["old"] = torch.randn(nbs + (2,), generator=g)
    for i, (feat, dtype) in enumerate(feats):
        leaf = (torch.rand(nbs + tuple(feat), generator=g) * 10).to(dtype)
        if nested and i % 2:
            value.setdefault("sub", {})[f"k{i}"] = leaf
        else:
            value[f"k{i}"] = leaf
    src = value if as_dict else TensorDict(value, batch_size=nbs)
    td[index] = src
    ref_write(ref, bs, index, value, len(nbs))
    assert_tree(td, ref)
    assert set(td.keys()) == set(ref)
    if "sub" in ref:
        assert td["sub"].batch_size == torch.Size(bs)


# ----------------------------------------------------------------------------- documented cases
def test_the_documented_example():
    x = torch.arange(3.0)
    td = TensorDict({}, batch_size=[5])
    td[0] = TensorDict({"a": x}, [])
    assert td["a"].shape == (5, 3)
    assert td["a"][0].tolist() == [0, 1, 2] and not td["a"][1:].any()


def test_new_sub_container_keeps_the_source_extra_batch_dims():
    td = TensorDict({}, batch_size=[4])
    td[1] = TensorDict({"agents": TensorDict({"obs": torch.ones(2, 3)}, [2])}, [])
    assert td["agents"].batch_size == (4, 2)
    assert td["agents", "obs"].shape == (4, 2, 3)
    assert td["agents", "obs"].sum() == 6 and td["agents", "obs"][1].sum() == 6


def test_new_key_into_an_existing_sub_container():
    td = TensorDict({"next": TensorDict({"obs": torch.zeros(4, 2)}, [4])}, [4])
    td[2] = TensorDict({"next": {"obs": torch.ones(2), "reward": torch.ones(1)}}, [])
    assert td["next", "reward"].shape == (4, 1)
    assert td["next", "reward"].flatten().tolist() == [0, 0, 1, 0]


def test_broadcast_source_batch():
    td = TensorDict({}, batch_size=[4])
    td[1:3] = TensorDict({"a": torch.ones(5)}, [])  # batch [] broadcast over the 2 rows
    assert td["a"].shape == (4, 5) and td["a"].sum() == 10


def test_non_tensor_entry_is_set_for_the_whole_batch():
    td = TensorDict({}, batch_size=[3])
    td[0] = TensorDict({"s": NonTensorData("hello")}, [])
    assert td["s"] == "hello"


def test_device_and_grad():
    td = TensorDict({}, batch_size=[3], device="cpu")
    w = torch.ones(2, requires_grad=True)
    td[0] = TensorDict({"a": w * 2}, [])
    assert td["a"].device.type == "cpu" and td["a"].requires_grad
    td["a"].sum().backward()
    assert w.grad.tolist() == [2, 2]


def test_lazy_stack_members_each_get_the_key_and_keep_their_own():
    lz = lazy_stack([TensorDict({"x": torch.zeros(2)}, [2]) for _ in range(3)], 0)
    lz.tensordicts[0]["e"] = torch.full((2,), 7.0)  # a key one member holds already
    lz[1] = TensorDict({"x": torch.ones(2), "e": torch.ones(2), "n": torch.ones(2, 4)}, [2])
    assert [m["e"].tolist() for m in lz.tensordicts] == [[7, 7], [1, 1], [0, 0]]
    assert lz["n"].shape == (3, 2, 4) and lz["n"].sum() == 8


def test_lazy_stack_nested_at_a_later_stack_dim():
    inner = lazy_stack([TensorDict({"x": torch.zeros(4)}, [4]) for _ in range(2)], 1)
    td = TensorDict({"inner": inner}, [4])
    td[0] = TensorDict({"inner": TensorDict({"q": torch.ones(2, 3)}, [2])}, [])
    assert td["inner", "q"].shape == (4, 2, 3)
    assert td["inner", "q"][0].sum() == 6 and td["inner", "q"][1:].sum() == 0


def test_fast_path_writes_are_unchanged():
    """The same-structure write keeps writing into the existing storage."""
    td = TensorDict({"a": torch.zeros(4, 2)}, [4])
    ptr = td["a"].data_ptr()
    td[1] = TensorDict({"a": torch.ones(2)}, [])
    assert td["a"].data_ptr() == ptr and td["a"].sum() == 2


# ----------------------------------------------------------------------------- bad input
def test_failed_write_adds_nothing():
    td = TensorDict({"x": torch.zeros(4)}, [4])
    with pytest.raises(ValueError, match="'x'"):
        td[0] = TensorDict({"new": torch.ones(3), "x": torch.ones(3)}, [])
    assert list(td.keys()) == ["x"]
    with pytest.raises(ValueError):
        td[0:2] = TensorDict({"new": torch.ones(3, 2)}, [3])  # batch 3 into 2 rows
    assert list(td.keys()) == ["x"]


def test_locked_container_refuses_new_keys():
    td = TensorDict({"x": torch.zeros(4)}, [4]).lock_()
    with pytest.raises(RuntimeError, match="'new'.*locked"):
        td[0] = TensorDict({"new": torch.ones(())}, [])
    assert list(td.keys()) == ["x"]


# ----------------------------------------------------------------------------- the battery
BATTERY_INDICES = {"int": 1, "slice": slice(1, 3), "long": torch.tensor([3, 0]),
                   "mask": torch.tensor([True, False, True, False])}


@pytest.mark.parametrize("name", list(BATTERY_INDICES))
def test_every_variant_preallocates(case, name):
    idx = BATTERY_INDICES[name]
    td, ref = case.td, case.ref
    nbs = torch.empty(BATCH)[idx].shape
    new = TensorDict(
        {"new": torch.ones(nbs + (2,)), "nested": TensorDict({"fresh": torch.full(nbs + (2,), 3)},
                                                             nbs + (2,)),
         "sub": TensorDict({"leaf": torch.ones(nbs + (5,), dtype=torch.int64)}, nbs)},
        nbs,
    )
    if case.locked:
        with pytest.raises(RuntimeError, match="lock"):
            td[idx] = new
        assert "new" not in td.keys() and ("nested", "fresh") not in td.keys(True)
        assert_matches(td, ref)
        return
    td[idx] = new
    expected_new = torch.zeros(BATCH + (2,))
    expected_new[idx] = 1
    assert torch.equal(td.get("new"), expected_new)
    fresh = torch.zeros(BATCH + (2,), dtype=torch.int64)
    fresh[idx] = 3
    assert torch.equal(td.get(("nested", "fresh")), fresh)
    assert td.get("sub").batch_size == BATCH
    leaf = torch.zeros(BATCH + (5,), dtype=torch.int64)
    leaf[idx] = 1
    assert torch.equal(td.get(("sub", "leaf")), leaf)
    # the entries that were there are untouched
    for key in LEAF_KEYS:
        got = td.get(key)
        assert torch.equal(got.as_subclass(torch.Tensor), ref_get(ref, key)), key


def test_every_variant_rolls_back_a_failed_write(case):
    td, ref = case.td, case.ref
    bad = TensorDict({"new": torch.ones(3), "a": torch.ones(3, 7)}, [3])  # "a" is [.., 2]
    with pytest.raises((ValueError, RuntimeError)):
        td[0] = bad
    assert "new" not in td.keys()
    assert_matches(td, ref)
