"""One battery, every container variant.

Each test takes the ``case`` fixture (see ``conftest.py``): a fresh container of one
variant (plain, nested, lazy stack, tensorclass, memmap, memmap loaded from disk,
sub-view, shared memory, permuted, unsqueezed-then-squeezed, clone, h5) plus the same
content as a plain nested dict of tensors. The test does an operation on the container
and the same operation leaf by leaf on the dict, then compares.

Where a variant legitimately refuses an operation (a locked memmap refuses new keys),
the test asserts the clear error, then unlocks and checks the operation itself.
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch

from steersman.tensordict import TensorDict, TensorDictBase, is_tensor_collection
from tests.tensordict.conftest import (
    ALL_KEYS,
    BATCH,
    FLOAT_KEYS,
    LEAF_KEYS,
    NESTED_BATCH,
    STR_KEY,
    STR_VALUE,
    as_plain,
    assert_leaf_equal,
    assert_matches,
    assert_str_entry,
    build_td,
    make_reference,
    ref_clone,
    ref_get,
    ref_leaves,
    ref_map,
    ref_set,
)


# ----------------------------------------------------------------------------- helpers
def expect_locked(case, fn, match="locked"):
    """A locked variant refuses ``fn`` with a clear error and stays unchanged; then unlock."""
    if not case.locked:
        return
    assert case.td.is_locked
    before = sorted(map(str, case.td.keys(True, True)))
    with pytest.raises(RuntimeError, match=match):
        fn()
    assert sorted(map(str, case.td.keys(True, True))) == before
    case.td.unlock_()
    assert not case.td.is_locked


def leaf_ptr(obj, key):
    """Where a leaf's storage starts; for a lazy stack, that of the first member's leaf
    (``get`` on a lazy stack returns a freshly stacked tensor)."""
    if getattr(type(obj), "_is_lazy", False):
        return leaf_ptr(obj.tensordicts[0], key)
    return obj.get(key).data_ptr()


def join_key(prefix, key):
    if not prefix:
        return key
    return prefix + ((key,) if isinstance(key, str) else key)


def inplace_targets(case):
    """Float-only containers whose leaves are the variant's own storage.

    ``(container, prefix, keys)``: ``container.get(k)`` is ``case.td.get(prefix + k)``.
    The float selection shares leaves with the variant (not for h5, whose ``select``
    reads into memory); the ``("nested", "deeper")`` sub-container is the variant's own.
    """
    out = []
    if not case.reads_copies:
        out.append((case.td.select(*FLOAT_KEYS), (), FLOAT_KEYS))
    out.append((case.td.get(("nested", "deeper")), ("nested", "deeper"), ["z"]))
    return out


def top_keys(case):
    return {"a", "b", "c", "nested"} | ({STR_KEY} if case.has_str else set())


def other_ref(seed=2):
    return make_reference(seed)


def batch_weight():
    return torch.arange(1.0, 13.0).reshape(4, 3)


def bcast(w, t):
    """``w`` (batch shaped) with trailing singleton dims so it broadcasts against ``t``."""
    return w.reshape(w.shape + (1,) * (t.ndim - w.ndim))


def norm_ref_index(idx, bd=2):
    """Same index for a plain leaf: lists -> tensors, ``...`` -> explicit batch slices."""
    items = idx if isinstance(idx, tuple) else (idx,)
    items = tuple(torch.tensor(i) if isinstance(i, list) else i for i in items)
    used = sum(
        0 if (i is None or i is Ellipsis) else (i.ndim if isinstance(i, torch.Tensor) and i.dtype == torch.bool else 1)
        for i in items
    )
    if any(i is Ellipsis for i in items):
        pos = next(p for p, i in enumerate(items) if i is Ellipsis)
        items = items[:pos] + (slice(None),) * (bd - used) + items[pos + 1 :]
    return items


def index_ref(ref, idx):
    norm = norm_ref_index(idx)
    return ref_map(lambda t: t[norm], ref)


def indexed_batch(idx):
    return torch.empty(BATCH)[norm_ref_index(idx)].shape


MASK_4 = torch.tensor([True, False, True, True])
MASK_43 = torch.tensor([[True, False, True], [False, False, True], [True, True, True], [False, True, False]])

INDICES = {
    "int": 1,
    "neg_int": -1,
    "slice": slice(1, 3),
    "step_slice": slice(0, 4, 2),
    "open_slice": slice(2, None),
    "ellipsis_int": (Ellipsis, 1),
    "none": None,
    "list": [0, 2, 3],
    "long_tensor": torch.tensor([3, 0, 1]),
    "mask_dim0": MASK_4,
    "mask_full": MASK_43,
    "int_int": (2, 1),
    "slice_int": (slice(None), 0),
    "int_slice_step": (0, slice(None, None, 2)),
    "none_int": (None, 2),
    "int_ellipsis": (3, Ellipsis),
    "int_list": (1, [0, 2]),
    "step_slice_tensor": (slice(1, 4, 2), torch.tensor([0, 2])),
    "mask_slice": (MASK_4, slice(1, 3)),
    "ellipsis_none": (Ellipsis, None),
    "list_list": ([0, 1, 3], [2, 2, 0]),
}


def write_value(t):
    """A value different from ``t`` everywhere, same dtype."""
    if t.dtype == torch.bool:
        return ~t
    return t * 2 + 7


# ============================================================================ access
def test_get_and_contains(case):
    td, ref = case.td, case.ref
    for key in LEAF_KEYS:
        assert_leaf_equal(td.get(key), ref_get(ref, key), key)
    assert_leaf_equal(td.get("nested").get("x"), ref["nested"]["x"], "nested/x")
    assert_leaf_equal(td.get("nested").get(("deeper", "z")), ref["nested"]["deeper"]["z"], "deeper")
    assert_leaf_equal(td.get(("nested", ("deeper", "z"))), ref["nested"]["deeper"]["z"], "ravel")
    assert td.get("nested").batch_size == NESTED_BATCH
    sentinel = object()
    assert td.get("missing", sentinel) is sentinel
    assert td.get(("nested", "missing"), None) is None
    for key in ["a", "nested", ("nested", "x"), ("nested", "deeper", "z")]:
        assert key in td
    for key in ["zz", ("nested", "zz"), ("zz", "x"), ("nested", "deeper", "q")]:
        assert key not in td
    assert (STR_KEY in td) == case.has_str
    if case.has_str:
        assert_str_entry(td, BATCH)


def test_getitem_key(case):
    td, ref = case.td, case.ref
    if case.is_tensorclass:
        # a tensorclass is indexed over its batch only (keys go through get / attributes)
        with pytest.raises((ValueError, KeyError, TypeError, IndexError)):
            td["a"]
        assert_leaf_equal(td.a, ref["a"], "a")
        assert_leaf_equal(td.nested["x"], ref["nested"]["x"], "nested.x")
        assert td.s == STR_VALUE
        return
    for key in LEAF_KEYS:
        assert_leaf_equal(td[key], ref_get(ref, key), key)
    assert isinstance(td["nested"], TensorDictBase)
    if case.has_str:
        assert td[STR_KEY] == STR_VALUE  # td[key] gives the raw value
    with pytest.raises(KeyError, match="missing"):
        td["missing"]


def test_keys_items_values(case):
    td, ref = case.td, case.ref
    s = {STR_KEY} if case.has_str else set()
    assert set(td.keys()) == top_keys(case)
    assert len(td.keys()) == len(top_keys(case))
    nested = set(td.keys(include_nested=True))
    assert nested == set(ALL_KEYS) | s
    leaves = set(td.keys(include_nested=True, leaves_only=True))
    assert leaves == set(LEAF_KEYS) | s
    assert set(td.keys(leaves_only=True)) == {"a", "b", "c"} | s
    assert set(td.get("nested").keys()) == {"x", "y", "deeper"}
    items = dict(td.items(True, True))
    assert set(items) == set(LEAF_KEYS) | s
    for key in LEAF_KEYS:
        assert_leaf_equal(items[key], ref_get(ref, key), key)
    values = [v for v in td.values(True, True) if isinstance(v, torch.Tensor)]
    assert len(values) == len(LEAF_KEYS)
    assert sum(v.numel() for v in values) == sum(t.numel() for t in ref_leaves(ref))
    assert sorted(td.keys(True, True, sort=True), key=str) == sorted(td.keys(True, True), key=str)


# ============================================================================ set / del
def test_set_new_key(case):
    td, ref = case.td, case.ref
    new = torch.arange(24.0).reshape(4, 3, 2)
    if case.is_tensorclass:
        with pytest.raises((AttributeError, KeyError, RuntimeError), match="new"):
            td.set("new", new)
        return
    expect_locked(case, lambda: td.set("new", new))
    td.set("new", new)
    assert_leaf_equal(td.get("new"), new, "new")
    td["new2"] = new[..., 0]
    assert_leaf_equal(td["new2"], new[..., 0], "new2")
    td.set(("nested", "w"), torch.ones(4, 3, 2, 7))
    assert td.get(("nested", "w")).shape == (4, 3, 2, 7)
    td.set(("fresh", "leaf"), torch.zeros(4, 3))  # creates the missing parent
    assert td.get("fresh").batch_size == BATCH
    assert_matches(td, ref)  # the old entries are untouched
    with pytest.raises(ValueError, match=r"'bad'.*\[4, 3\].*\[3, 4\]"):
        td.set("bad", torch.zeros(3, 4))
    with pytest.raises(ValueError, match="bad2"):
        td["bad2"] = torch.zeros(4)
    with pytest.raises(ValueError, match="'w2'"):
        td.set(("nested", "w2"), torch.zeros(4, 3, 3))
    assert "bad" not in td and "bad2" not in td and ("nested", "w2") not in td


def test_set_inplace(case):
    td, ref = case.td, case.ref
    before_ptr = leaf_ptr(td, "a")
    new_a = torch.full((4, 3, 2), 3.5)
    td.set_("a", new_a)
    ref["a"] = new_a.clone()
    new_x = ref["nested"]["x"] * -1
    td.set(("nested", "x"), new_x, inplace=True)
    ref["nested"]["x"] = new_x
    td.set_(("nested", "deeper", "z"), torch.zeros(4, 3, 2, 1, dtype=torch.float64))
    ref["nested"]["deeper"]["z"] = torch.zeros(4, 3, 2, 1, dtype=torch.float64)
    assert leaf_ptr(td, "a") == before_ptr  # written into the existing storage
    assert_matches(td, ref)
    if case.is_view:
        assert_matches(case.source(), ref)  # the write went through to the source
    with pytest.raises(KeyError, match="missing"):
        td.set_("missing", torch.zeros(4, 3))
    with pytest.raises((ValueError, RuntimeError), match="'b'"):
        td.set_("b", torch.zeros(4, 2, dtype=torch.int64))
    assert_matches(td, ref)


def test_del_and_pop(case):
    td, ref = case.td, case.ref
    if case.is_tensorclass:
        with pytest.raises((AttributeError, KeyError, RuntimeError, TypeError)):
            del td["b"]
        return
    expect_locked(case, lambda: td.del_("b"))
    del td["b"]
    assert "b" not in td
    popped = td.pop(("nested", "y"))
    assert_leaf_equal(popped, ref["nested"]["y"], "popped")
    assert ("nested", "y") not in td and ("nested", "x") in td
    td.del_(("nested", "deeper", "z"))
    assert ("nested", "deeper") in td and ("nested", "deeper", "z") not in td
    assert td.pop("missing", 42) == 42
    with pytest.raises(KeyError, match="missing"):
        td.pop("missing")
    with pytest.raises(KeyError, match="b"):
        del td["b"]
    assert set(td.keys()) == top_keys(case) - {"b"}
    assert_matches(td, ref, keys=["a", "c", ("nested", "x")])


def test_rename_key(case):
    td, ref = case.td, case.ref
    if case.is_tensorclass:
        with pytest.raises((AttributeError, KeyError, RuntimeError)):
            td.rename_key_("a", "a2")
        return
    expect_locked(case, lambda: td.rename_key_("a", "a2"))
    td.rename_key_("a", "a2")
    assert "a" not in td
    assert_leaf_equal(td.get("a2"), ref["a"], "a2")
    td.rename_key_(("nested", "x"), ("nested", "x2"))
    assert_leaf_equal(td.get(("nested", "x2")), ref["nested"]["x"], "x2")
    assert ("nested", "x") not in td
    with pytest.raises(KeyError, match="b"):
        td.rename_key_("a2", "b", safe=True)
    assert_leaf_equal(td.get("a2"), ref["a"], "a2 kept")
    assert_leaf_equal(td.get("b"), ref["b"], "b kept")
    with pytest.raises(KeyError, match="nope"):
        td.rename_key_("nope", "other")


def test_update(case):
    td, ref = case.td, case.ref
    new_b = torch.full((4, 3), 9)
    payload = {"b": new_b, "nested": {"y": torch.zeros(4, 3, 2, dtype=torch.int32)}}
    if not case.is_tensorclass:
        payload["added"] = torch.ones(4, 3, 6)
        expect_locked(case, lambda: td.update({"added": torch.ones(4, 3, 6)}))
    td.update(payload)
    ref["b"] = new_b
    ref["nested"]["y"] = torch.zeros(4, 3, 2, dtype=torch.int32)
    assert_matches(td, ref)  # nested dicts are merged, not replaced
    if not case.is_tensorclass:
        assert td.get("added").shape == (4, 3, 6)
    # update_: in place, into the existing storage
    ptr = leaf_ptr(td, ("nested", "x"))
    other = build_td(other_ref(), with_str=False)
    td.update_(other.select("a", ("nested", "x")))
    ref["a"] = other["a"]
    ref["nested"]["x"] = other["nested", "x"]
    assert leaf_ptr(td, ("nested", "x")) == ptr
    assert_matches(td, ref)
    if case.is_view:  # update() replaced "b" in the view only; update_() wrote through
        assert_matches(case.source(), ref, keys=["a", ("nested", "x")])
    with pytest.raises(KeyError, match="nope"):
        td.update_({"a": torch.zeros(4, 3, 2), "nope": torch.zeros(4, 3)})
    assert_matches(td, ref)


def test_select_exclude_split_keys(case):
    td, ref = case.td, case.ref
    sel = td.select("a", ("nested", "x"))
    assert set(sel.keys(True, True)) == {"a", ("nested", "x")}
    assert_matches(sel, ref, keys=["a", ("nested", "x")])
    assert sel.get("nested").batch_size == NESTED_BATCH
    exc = td.exclude("b", ("nested", "deeper"), "not_there")
    assert set(exc.keys(True, True)) == set(LEAF_KEYS) - {"b", ("nested", "deeper", "z")} | (
        {STR_KEY} if case.has_str else set()
    )
    # the source is untouched by exclude
    assert ("nested", "deeper", "z") in td and "b" in td
    assert_matches(exc, ref, keys=["a", "c", ("nested", "x"), ("nested", "y")])
    first, second, rest = td.split_keys(["a"], [("nested", "y"), "c"])
    assert set(first.keys(True, True)) == {"a"}
    assert set(second.keys(True, True)) == {"c", ("nested", "y")}
    assert "a" not in rest and "c" not in rest and ("nested", "y") not in rest
    assert ("nested", "x") in rest and "b" in rest
    assert_matches(second, ref, keys=["c", ("nested", "y")])
    with pytest.raises(KeyError, match="nope"):
        td.select("nope")
    assert set(td.select("nope", "a", strict=False).keys()) == {"a"}


def test_flatten_unflatten_keys(case):
    td, ref = case.td, case.ref
    flat = td.flatten_keys(".")
    expected = {"a", "b", "c", "nested.x", "nested.y", "nested.deeper.z"} | (
        {STR_KEY} if case.has_str else set()
    )
    assert set(flat.keys()) == expected
    assert_leaf_equal(flat.get("nested.deeper.z"), ref["nested"]["deeper"]["z"], "flat z")
    assert flat.batch_size == BATCH
    flat_us = td.flatten_keys("_")
    assert "nested_deeper_z" in flat_us
    back = flat.unflatten_keys(".")
    assert set(back.keys(True, True)) == set(td.keys(True, True))
    for key in LEAF_KEYS:
        assert_leaf_equal(back.get(key), ref_get(ref, key), key)


def test_to_dict_and_from_dict(case):
    td, ref = case.td, case.ref
    d = td.to_dict()
    assert isinstance(d, dict) and isinstance(d["nested"], dict) and isinstance(d["nested"]["deeper"], dict)
    for key in LEAF_KEYS:
        assert_leaf_equal(ref_get(d, key), ref_get(ref, key), key)
    if case.has_str:
        assert d[STR_KEY] == STR_VALUE
    rebuilt = TensorDict.from_dict(d, batch_size=[4, 3])
    assert_matches(rebuilt, ref, check_nested_batch=False)
    auto = TensorDict.from_dict(d)  # automatic batch size: the shared prefix of all leaves
    assert auto.batch_size == BATCH
    assert_matches(auto, ref, check_nested_batch=False)
    listed = td.to_dict(convert_tensors=True)
    assert listed["b"] == ref["b"].tolist()


def test_is_empty_and_empty(case):
    td = case.td
    assert not td.is_empty()
    e = td.empty()
    assert e.is_empty() and e.batch_size == BATCH and list(e.keys()) == []
    er = td.empty(recurse=True)
    assert er.is_empty()
    assert "nested" in er and ("nested", "deeper") in er
    assert er.get("nested").batch_size == NESTED_BATCH
    assert not td.is_empty()  # the source keeps its entries
    assert_matches(td, case.ref)


def test_setdefault(case):
    td, ref = case.td, case.ref
    out = td.setdefault("a", torch.zeros(4, 3, 2))
    assert_leaf_equal(out, ref["a"], "a")  # existing value returned, not replaced
    assert_leaf_equal(td.get("a"), ref["a"], "a")
    if case.is_tensorclass:
        return
    expect_locked(case, lambda: td.setdefault("new", torch.ones(4, 3)))
    out = td.setdefault("new", torch.ones(4, 3))
    assert_leaf_equal(out, torch.ones(4, 3), "new")
    assert_leaf_equal(td.get("new"), torch.ones(4, 3), "new")


# ============================================================================ indexing
@pytest.mark.parametrize("name", list(INDICES))
def test_index(case, name):
    idx = INDICES[name]
    td, ref = case.td, case.ref
    out = td[idx]
    expected_bs = indexed_batch(idx)
    expected = index_ref(ref, idx)
    assert out.batch_size == expected_bs
    for key in LEAF_KEYS:
        assert_leaf_equal(out.get(key), ref_get(expected, key), key)
    assert out.get("nested").batch_size == expected_bs + NESTED_BATCH[2:]
    if case.has_str:
        assert_str_entry(out, expected_bs)


def test_index_ellipsis_and_empty_tuple(case):
    td = case.td
    assert td[...].batch_size == BATCH
    assert_matches(td[...], case.ref)
    assert td[()].batch_size == BATCH


@pytest.mark.parametrize("name", list(INDICES))
def test_setitem_index(case, name):
    idx = INDICES[name]
    td, ref = case.td, case.ref
    expected_bs = indexed_batch(idx)
    target = index_ref(ref, idx)
    new_ref = ref_map(write_value, target)
    other = build_td(new_ref, expected_bs, with_str=case.has_str)
    ptr = leaf_ptr(td, "a")
    td[idx] = other
    norm = norm_ref_index(idx)
    for key in LEAF_KEYS:
        ref_get(ref, key)[norm] = ref_get(new_ref, key)
    assert leaf_ptr(td, "a") == ptr
    assert_matches(td, ref, has_str=case.has_str)
    if case.is_view:
        assert_matches(case.source(), ref)


def test_setitem_scalar_and_tensor(case):
    td, ref = case.td, case.ref
    td[0] = 0
    for key in LEAF_KEYS:
        ref_get(ref, key)[0] = 0
    assert_matches(td, ref)
    td[1:3] = td[1:3].clone().zero_()
    for key in LEAF_KEYS:
        ref_get(ref, key)[1:3] = 0
    assert_matches(td, ref)
    w = torch.arange(4) + 1  # a batch-shaped tensor, broadcast over every leaf's other dims
    td[:, 2] = w
    for key in LEAF_KEYS:
        t = ref_get(ref, key)
        t[:, 2] = bcast(w, t[:, 2]).to(t.dtype)
    assert_matches(td, ref)
    if case.is_view:
        assert_matches(case.source(), ref)


# ============================================================================ shape ops
SHAPE_OPS = {
    "reshape": (lambda td: td.reshape(12), lambda t: t.reshape(12, *t.shape[2:]), [12]),
    "reshape_-1": (lambda td: td.reshape(2, -1), lambda t: t.reshape(2, 6, *t.shape[2:]), [2, 6]),
    "flatten": (lambda td: td.flatten(0, 1), lambda t: t.flatten(0, 1), [12]),
    "unflatten": (lambda td: td.unflatten(0, (2, 2)), lambda t: t.unflatten(0, (2, 2)), [2, 2, 3]),
    "unsqueeze0": (lambda td: td.unsqueeze(0), lambda t: t.unsqueeze(0), [1, 4, 3]),
    "unsqueeze-1": (lambda td: td.unsqueeze(-1), lambda t: t.unsqueeze(2), [4, 3, 1]),
    "squeeze": (lambda td: td.unsqueeze(1).squeeze(1), lambda t: t, [4, 3]),
    "squeeze_all": (lambda td: td.unsqueeze(0).unsqueeze(-1).squeeze(), lambda t: t, [4, 3]),
    "squeeze_noop": (lambda td: td.squeeze(0), lambda t: t, [4, 3]),
    "permute": (lambda td: td.permute(1, 0), lambda t: t.transpose(0, 1), [3, 4]),
    "permute_list": (lambda td: td.permute([-1, -2]), lambda t: t.transpose(0, 1), [3, 4]),
    "transpose": (lambda td: td.transpose(0, 1), lambda t: t.transpose(0, 1), [3, 4]),
    "expand": (lambda td: td.expand(2, 4, 3), lambda t: t.expand(2, *t.shape), [2, 4, 3]),
    "repeat": (lambda td: td.repeat(2, 1), lambda t: t.repeat(2, *[1] * (t.ndim - 1)), [8, 3]),
    "flip": (lambda td: td.flip(0), lambda t: t.flip(0), [4, 3]),
    "flip_both": (lambda td: td.flip([0, 1]), lambda t: t.flip([0, 1]), [4, 3]),
}


@pytest.mark.parametrize("op", list(SHAPE_OPS))
def test_shape_op(case, op):
    td_fn, ref_fn, bs = SHAPE_OPS[op]
    out = td_fn(case.td)
    assert is_tensor_collection(out)
    expected = ref_map(ref_fn, case.ref)
    assert_matches(out, expected, bs, has_str=case.has_str)


def test_view(case):
    """``view`` aliases the storage, or raises when it can't (never a silent copy)."""
    td, ref = case.td, case.ref
    contiguous = all(as_plain(td.get(k)).is_contiguous() for k in LEAF_KEYS)
    must_view = contiguous and not case.is_lazy and not case.reads_copies
    try:
        v = td.view(12)
    except RuntimeError as err:
        assert not must_view, f"view failed on a contiguous {case.name} container: {err}"
        assert "view" in str(err)
        return
    assert_matches(v, ref_map(lambda t: t.reshape(12, *t.shape[2:]), ref), [12])
    v[0] = 100  # a view shares storage
    assert td.get("a")[0, 0].eq(100.0).all()
    assert td.get(("nested", "x"))[0, 0].eq(100.0).all()
    assert td.view(-1, 3).batch_size == BATCH


def test_unbind_split_chunk(case):
    td, ref = case.td, case.ref
    parts = td.unbind(1)
    assert len(parts) == 3
    for i, p in enumerate(parts):
        assert_matches(p, ref_map(lambda t, i=i: t[:, i], ref), [4], has_str=case.has_str)
    splits = td.split(3, 0)
    assert [s.batch_size[0] for s in splits] == [3, 1]
    assert_matches(splits[1], ref_map(lambda t: t[3:], ref), [1, 3])
    splits = td.split([1, 2], 1)
    assert [tuple(s.batch_size) for s in splits] == [(4, 1), (4, 2)]
    assert_matches(splits[1], ref_map(lambda t: t[:, 1:], ref), [4, 2], has_str=case.has_str)
    chunks = td.chunk(2, 0)
    assert len(chunks) == 2
    assert_matches(chunks[0], ref_map(lambda t: t[:2], ref), [2, 3])
    chunks = td.chunk(2, 1)
    assert [tuple(c.batch_size) for c in chunks] == [(4, 2), (4, 1)]


def test_iteration_and_len(case):
    td, ref = case.td, case.ref
    assert len(td) == 4
    items = list(td)
    assert len(items) == 4
    for i, item in enumerate(items):
        assert_matches(item, ref_map(lambda t, i=i: t[i], ref), [3], has_str=case.has_str)


# ============================================================================ torch.*
def test_torch_stack_cat(case):
    td, ref = case.td, case.ref
    st = torch.stack([td, td], 0)
    assert_matches(st, ref_map(lambda t: torch.stack([t, t], 0), ref), [2, 4, 3], has_str=case.has_str)
    st1 = torch.stack([td, td, td], 1)
    assert_matches(st1, ref_map(lambda t: torch.stack([t, t, t], 1), ref), [4, 3, 3], has_str=case.has_str)
    st_last = torch.stack([td, td], -1)
    assert_matches(st_last, ref_map(lambda t: torch.stack([t, t], 2), ref), [4, 3, 2])
    ct = torch.cat([td, td], 0)
    assert_matches(ct, ref_map(lambda t: torch.cat([t, t], 0), ref), [8, 3], has_str=case.has_str)
    ct1 = torch.cat([td, td[:, :1]], 1)
    assert_matches(ct1, ref_map(lambda t: torch.cat([t, t[:, :1]], 1), ref), [4, 4], has_str=case.has_str)


def test_torch_unbind_split_permute_reshape(case):
    td, ref = case.td, case.ref
    parts = torch.unbind(td, 0)
    assert len(parts) == 4
    assert_matches(parts[2], ref_map(lambda t: t[2], ref), [3])
    sp = torch.split(td, 2, 1)
    assert_matches(sp[0], ref_map(lambda t: t[:, :2], ref), [4, 2])
    assert_matches(torch.permute(td, (1, 0)), ref_map(lambda t: t.transpose(0, 1), ref), [3, 4])
    assert_matches(torch.reshape(td, (3, 4)), ref_map(lambda t: t.reshape(3, 4, *t.shape[2:]), ref), [3, 4])
    cl = torch.clone(td)
    assert_matches(cl, ref, has_str=case.has_str)
    assert leaf_ptr(cl, "a") != leaf_ptr(td, "a")


def test_torch_where(case):
    td, ref = case.td, case.ref
    oref = other_ref()
    other = build_td(oref, with_str=case.has_str)
    cond = MASK_43
    out = torch.where(cond, td, other)
    exp = ref_map(lambda a, b: torch.where(bcast(cond, a), a, b), ref, oref)
    assert_matches(out, exp)
    out2 = td.where(cond, other)
    assert_matches(out2, exp)
    out3 = torch.where(cond[:, 0], td, other)  # a condition over the leading batch dim only
    assert_matches(out3, ref_map(lambda a, b: torch.where(bcast(cond[:, 0], a), a, b), ref, oref))
    assert_matches(td, ref)  # inputs untouched


def test_torch_gather(case):
    td, ref = case.td, case.ref
    index = torch.tensor([[0, 2], [1, 1], [2, 0], [0, 0]])
    out = torch.gather(td, 1, index)
    exp = ref_map(
        lambda t: torch.gather(t, 1, bcast(index, t).expand(index.shape + t.shape[2:])), ref
    )
    assert_matches(out, exp, [4, 2])


def test_like_functions(case):
    td, ref = case.td, case.ref
    z = torch.zeros_like(td)
    assert_matches(z, ref_map(torch.zeros_like, ref))
    o = torch.ones_like(td)
    assert_matches(o, ref_map(torch.ones_like, ref))
    f = torch.full_like(td, 2)
    assert_matches(f, ref_map(lambda t: torch.full_like(t, 2), ref))
    e = torch.empty_like(td)
    for key in LEAF_KEYS:
        assert e.get(key).shape == ref_get(ref, key).shape
        assert e.get(key).dtype == ref_get(ref, key).dtype
    assert e.batch_size == BATCH and e.get("nested").batch_size == NESTED_BATCH
    assert_matches(td, ref)  # untouched


# ============================================================================ apply
def test_apply(case):
    td, ref = case.td, case.ref
    out = td.apply(lambda x: x * 2)
    assert_matches(out, ref_map(lambda t: t * 2, ref), has_str=case.has_str)
    oref = other_ref()
    other = build_td(oref, with_str=case.has_str)
    out2 = td.apply(lambda x, y: x.to(torch.float64) + y.to(torch.float64), other)
    assert_matches(out2, ref_map(lambda x, y: x.to(torch.float64) + y.to(torch.float64), ref, oref))
    out3 = td.apply(lambda x: x[0], batch_size=[3])
    assert out3.batch_size == torch.Size([3])
    for key in LEAF_KEYS:
        assert_leaf_equal(out3.get(key), ref_get(ref, key)[0], key)
    dropped = td.apply(lambda x: x if x.dtype == torch.float32 else None)
    assert set(dropped.keys(True, True)) - {STR_KEY} == {"a", ("nested", "x")}
    assert_matches(td, ref)  # apply is out of place


def test_apply_inplace(case):
    ref = case.ref
    for target, prefix, keys in inplace_targets(case):
        target.apply_(lambda x: x.mul_(3))
        for key in keys:
            full = join_key(prefix, key)
            ref_set(ref, full, ref_get(ref, full) * 3)
        assert_matches(case.td, ref)
        if case.is_view:
            assert_matches(case.source(), ref)


def test_named_apply(case):
    td, ref = case.td, case.ref
    seen = []

    def fn(key, x):
        seen.append(key)
        return x + 1 if x.dtype != torch.bool else x

    out = td.named_apply(fn, nested_keys=True)
    assert set(seen) == set(LEAF_KEYS)
    assert_matches(out, ref_map(lambda t: t + 1 if t.dtype != torch.bool else t, ref))
    seen.clear()
    td.named_apply(lambda k, x: seen.append(k), nested_keys=False)
    assert set(seen) == {"a", "b", "c", "x", "y", "z"}
    oref = other_ref()
    other = build_td(oref, with_str=case.has_str)
    out2 = td.named_apply(lambda k, x, y: x if k == "a" else y, other, nested_keys=True, batch_size=[4, 3])
    assert_leaf_equal(out2.get("a"), ref["a"], "a")
    assert_leaf_equal(out2.get("b"), oref["b"], "b")


# ============================================================================ casting / copying
def test_to_dtype_and_device(case):
    td, ref = case.td, case.ref
    out = td.to(torch.float64)
    assert_matches(out, ref_map(lambda t: t.to(torch.float64), ref), has_str=case.has_str)
    cpu = td.to("cpu")
    assert_matches(cpu, ref)
    assert td.to(torch.device("cpu")).batch_size == BATCH
    for name, dtype in [("float", torch.float32), ("double", torch.float64), ("half", torch.float16),
                        ("int", torch.int32), ("bool", torch.bool)]:
        conv = getattr(td, name)()
        assert_matches(conv, ref_map(lambda t, d=dtype: t.to(d), ref))
    assert_matches(td, ref)


def test_clone_detach_contiguous(case):
    td, ref = case.td, case.ref
    cl = td.clone()
    assert_matches(cl, ref, has_str=case.has_str)
    cl.get("a").zero_()
    assert_matches(td, ref)  # a clone owns its memory
    assert not cl.is_locked
    cl.set(("nested", "fresh_key"), torch.zeros(4, 3, 2))  # a clone of a locked one is unlocked
    sh = td.clone(False)
    if not case.reads_copies:
        assert leaf_ptr(sh, "a") == leaf_ptr(td, "a")
    assert_matches(sh, ref)
    de = td.detach()
    assert_matches(de, ref)
    co = td.contiguous()
    assert_matches(co, ref, has_str=case.has_str)
    assert co.is_contiguous()


def test_zero_fill_copy(case):
    td, ref = case.td, case.ref
    td.fill_("a", 3.0)
    ref["a"].fill_(3.0)
    td.fill_("nested", 1)
    for key in [("nested", "x"), ("nested", "y"), ("nested", "deeper", "z")]:
        ref_get(ref, key).fill_(1)
    assert_matches(td, ref)
    oref = other_ref()
    td.copy_(build_td(oref, with_str=False))
    assert_matches(td, oref)
    if case.is_view:
        assert_matches(case.source(), oref)
    td.zero_()
    zeros = ref_map(torch.zeros_like, ref)
    assert_matches(td, zeros)
    if case.is_view:
        assert_matches(case.source(), zeros)


# ============================================================================ arithmetic
def _numeric(td):
    return td.exclude("c", STR_KEY)


def _numeric_ref(ref):
    out = ref_clone(ref)
    del out["c"]
    return out


BINARY = {
    "add": (lambda a, b: a + b),
    "sub": (lambda a, b: a - b),
    "mul": (lambda a, b: a * b),
    "div": (lambda a, b: a / b),
    "pow": (lambda a, b: a ** b),
}


@pytest.mark.parametrize("op", list(BINARY))
def test_binary_arithmetic(case, op):
    fn = BINARY[op]
    td, ref = _numeric(case.td), _numeric_ref(case.ref)
    keys = [k for k in LEAF_KEYS if k != "c"]
    # with a container of the same structure
    oref = ref_map(lambda t: t.abs() + 1 if t.is_floating_point() else t.abs() % 3 + 1,
                   _numeric_ref(other_ref()))
    other = build_td(oref, with_str=False)
    assert_matches(fn(td, other), ref_map(fn, ref, oref), keys=keys)
    # with a batch-shaped tensor (broadcast over the feature dims)
    w = batch_weight() / 4
    assert_matches(fn(td, w), ref_map(lambda t: fn(t, bcast(w, t)), ref), keys=keys)
    # with a scalar, on either side
    assert_matches(fn(td, 2), ref_map(lambda t: fn(t, 2), ref), keys=keys)
    r = 2.0 if op == "pow" else 3
    assert_matches(fn(r, td), ref_map(lambda t: fn(r, t), ref), keys=keys)
    assert_matches(case.td, case.ref, has_str=case.has_str)  # operands untouched


def test_unary_arithmetic(case):
    td, ref = _numeric(case.td), _numeric_ref(case.ref)
    keys = [k for k in LEAF_KEYS if k != "c"]
    assert_matches(-td, ref_map(torch.neg, ref), keys=keys)
    assert_matches(abs(td), ref_map(torch.abs, ref), keys=keys)
    assert_matches(td.abs(), ref_map(torch.abs, ref), keys=keys)
    assert_matches(td.float().exp(), ref_map(lambda t: t.float().exp(), ref), keys=keys)
    assert_matches(~case.td.select("c"), {"c": ~case.ref["c"]}, keys=["c"])


INPLACE = {
    "add_": (lambda td, o: td.add_(o), lambda t, o: t + o),
    "add_alpha": (lambda td, o: td.add_(o, alpha=2), lambda t, o: t + 2 * o),
    "sub_": (lambda td, o: td.sub_(o), lambda t, o: t - o),
    "mul_": (lambda td, o: td.mul_(o), lambda t, o: t * o),
    "div_": (lambda td, o: td.div_(o), lambda t, o: t / o),
    "iadd": (None, lambda t, o: t + o),
    "lerp_": (lambda td, o: td.lerp_(o, 0.25), lambda t, o: torch.lerp(t, o, 0.25)),
}


@pytest.mark.parametrize("op", list(INPLACE))
def test_inplace_arithmetic(case, op):
    for other_kind in ["td", "tensor", "scalar"] if op != "lerp_" else ["td"]:
        _check_inplace(case, op, other_kind)


def _check_inplace(case, op, other_kind):
    td_fn, ref_fn = INPLACE[op]
    for target, prefix, keys in inplace_targets(case):
        full = [join_key(prefix, k) for k in keys]
        fref = {k: ref_get(case.ref, f) for k, f in zip(keys, full)}
        ptrs = [leaf_ptr(target, k) for k in keys]
        if other_kind == "td":
            oref = other_ref()
            other_full = build_td(oref, with_str=False)
            other = other_full.get(prefix) if prefix else other_full.select(*keys)
            ovals = {k: ref_get(oref, f) for k, f in zip(keys, full)}
        elif other_kind == "tensor":
            w = batch_weight()
            other = w
            ovals = {k: bcast(w, fref[k]).to(fref[k].dtype) for k in keys}
        else:
            other = 1.5
            ovals = {k: 1.5 for k in keys}
        if op == "iadd":
            target += other
        else:
            result = td_fn(target, other)
            assert result is target
        for k, f in zip(keys, full):
            ref_set(case.ref, f, ref_fn(fref[k], ovals[k]).to(fref[k].dtype))
        if not case.reads_copies:
            assert [leaf_ptr(target, k) for k in keys] == ptrs
        assert_matches(case.td, case.ref)  # the target's leaves are shared: written through
        if case.is_view:
            assert_matches(case.source(), case.ref)


@pytest.mark.parametrize("op", ["clamp_", "sqrt_", "exp_", "abs_", "neg_"])
def test_inplace_unary(case, op):
    for target, prefix, keys in inplace_targets(case):
        if op == "clamp_":
            target.clamp_(-0.5, 0.5)
            fn = lambda t: t.clamp(-0.5, 0.5)  # noqa: E731
        else:
            assert getattr(target, op)() is target
            fn = getattr(torch, op[:-1])
        for k in keys:
            full = join_key(prefix, k)
            ref_set(case.ref, full, fn(ref_get(case.ref, full)))
        assert_matches(case.td, case.ref)
        if case.is_view:
            assert_matches(case.source(), case.ref)


# ============================================================================ comparisons
@pytest.mark.parametrize("op", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_comparisons(case, op):
    fn = {"eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
          "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b}[op]
    td, ref = _numeric(case.td), _numeric_ref(case.ref)
    keys = [k for k in LEAF_KEYS if k != "c"]
    oref = _numeric_ref(other_ref())
    other = build_td(oref, with_str=False)
    out = fn(td, other)
    assert_matches(out, ref_map(fn, ref, oref), keys=keys)
    for k in keys:
        assert out.get(k).dtype == torch.bool
    assert_matches(fn(td, 0), ref_map(lambda t: fn(t, 0), ref), keys=keys)
    w = batch_weight() / 6
    assert_matches(fn(td, w), ref_map(lambda t: fn(t, bcast(w, t)), ref), keys=keys)


def test_eq_elementwise(case):
    td = case.td
    same = td == td.clone()
    assert is_tensor_collection(same)
    assert same.all()
    other = td.clone()
    bumped = other.get("a").clone()
    bumped[1, 2, 0] += 1
    other.set_("a", bumped)
    diff = td == other
    assert not diff.all() and diff.any()
    assert not diff.get("a")[1, 2, 0]
    assert diff.get("a").sum() == ref_get(case.ref, "a").numel() - 1
    assert (td != other).get("a").sum() == 1


def test_all_any(case):
    td, ref = case.td, case.ref
    bools = td.select("c")
    assert bools.all() == bool(ref["c"].all())
    assert bools.any() == bool(ref["c"].any())
    assert (td.select("c") | True).all()
    a0 = bools.all(dim=0)
    assert a0.batch_size == torch.Size([3])
    assert_leaf_equal(a0.get("c"), ref["c"].all(dim=0), "c.all(0)")
    a1 = bools.any(dim=-1)
    assert_leaf_equal(a1.get("c"), ref["c"].any(dim=1), "c.any(-1)")
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(td)


# ============================================================================ reductions
def _float_td(case):
    return case.td.select(*FLOAT_KEYS)


def _float_ref(ref):
    return {"a": ref["a"], "nested": {"x": ref["nested"]["x"], "deeper": {"z": ref["nested"]["deeper"]["z"]}}}


@pytest.mark.parametrize("name", ["sum", "mean", "std", "var", "max", "min", "prod", "norm"])
def test_reduction_dim(case, name):
    td, ref = _float_td(case), _float_ref(case.ref)
    for dim in [0, 1, -1, (0, 1)]:
        for keepdim in [False, True]:
            _check_reduction_dim(td, ref, name, dim, keepdim)


def _check_reduction_dim(td, ref, name, dim, keepdim):
    dims = (dim,) if isinstance(dim, int) else dim
    dims = tuple(d % 2 for d in dims)

    def ref_fn(t):
        if name in ("max", "min"):
            return getattr(torch, "amax" if name == "max" else "amin")(t, dim=dims, keepdim=keepdim)
        if name == "prod":
            out = t
            for d in sorted(dims, reverse=True):
                out = out.prod(d, keepdim=keepdim)
            return out
        if name == "norm":
            return torch.linalg.vector_norm(t, dim=dims, keepdim=keepdim)
        return getattr(torch, name)(t, dim=dims, keepdim=keepdim)

    out = getattr(td, name)(dim=dim, keepdim=keepdim)
    if name in ("max", "min") and isinstance(dim, int):  # (values, indices), as torch.max
        out, indices = out
        exp_idx = ref_map(lambda t: getattr(t, name)(dim=dims[0], keepdim=keepdim).indices, ref)
        for key in FLOAT_KEYS:
            assert_leaf_equal(indices.get(key), ref_get(exp_idx, key), key)
    bs = [1 if i in dims else s for i, s in enumerate(BATCH)] if keepdim else [
        s for i, s in enumerate(BATCH) if i not in dims]
    assert out.batch_size == torch.Size(bs)
    exp = ref_map(ref_fn, ref)
    for key in FLOAT_KEYS:
        assert_leaf_equal(out.get(key), ref_get(exp, key), key)


@pytest.mark.parametrize("name", ["sum", "max", "min", "prod"])
def test_reduction_all_dtypes(case, name):
    td, ref = case.td, case.ref
    out = getattr(td, name)(dim=0, **({"return_indices": False} if name in ("max", "min") else {}))
    assert out.batch_size == torch.Size([3])
    for key in LEAF_KEYS:
        t = ref_get(ref, key)
        if name in ("max", "min"):
            exp = getattr(t, name)(dim=0).values
        else:
            exp = getattr(t, name)(dim=0)
        assert_leaf_equal(out.get(key), exp, key)
    if case.has_str:
        assert_str_entry(out, [3])


@pytest.mark.parametrize("name", ["sum", "mean", "std", "var", "max", "min", "prod", "norm"])
def test_reduction_reduce(case, name):
    td, ref = _float_td(case), _float_ref(case.ref)
    flat = torch.cat([t.reshape(-1).double() for t in ref_leaves_f(ref)])
    exp = {"norm": torch.linalg.vector_norm}.get(name, getattr(torch, name))(flat)
    out = getattr(td, name)(reduce=True)
    assert isinstance(out, torch.Tensor) and out.ndim == 0
    torch.testing.assert_close(out.double(), exp, rtol=1e-5, atol=1e-6)
    # per-leaf reduction without dim: a dimensionless container
    per_leaf = getattr(td, name)()
    assert per_leaf.batch_size == torch.Size([])
    fn = {"norm": torch.linalg.vector_norm}.get(name, getattr(torch, name))
    for key in FLOAT_KEYS:
        assert_leaf_equal(per_leaf.get(key), fn(ref_get(ref, key)), key)


@pytest.mark.parametrize("name", ["sum", "mean", "std", "max", "min", "norm", "prod"])
def test_reduction_reduce_dim(case, name):
    """``reduce=True`` with ``dim``: one tensor, reduced over ``dim``, the features and all
    leaves together; the other batch dim is kept. (``tensordict`` itself joins the leaves
    along ``dim`` and keeps their feature dims, which needs leaves of one shape.)"""
    td, ref = _float_td(case), _float_ref(case.ref)
    fn = {"norm": torch.linalg.vector_norm, "max": torch.amax, "min": torch.amin}.get(name, getattr(torch, name))
    for dim in [0, 1, -2]:
        keep = 1 - dim % 2
        flat = torch.cat([t.double().movedim(keep, 0).reshape(BATCH[keep], -1) for t in ref_leaves_f(ref)], 1)
        exp = fn(flat, dim=1)
        out = getattr(td, name)(dim=dim, reduce=True)
        assert isinstance(out, torch.Tensor)
        assert out.shape == (BATCH[keep],)
        torch.testing.assert_close(out.double(), exp, rtol=1e-4, atol=1e-6)
        kept = getattr(td, name)(dim=dim, keepdim=True, reduce=True)
        assert kept.shape == tuple(1 if i == dim % 2 else s for i, s in enumerate(BATCH))
    both = getattr(td, name)(dim=(0, 1), reduce=True)
    torch.testing.assert_close(both.double(), getattr(td, name)(reduce=True).double())


def ref_leaves_f(ref):
    return [ref_get(ref, k) for k in FLOAT_KEYS]


# ============================================================================ properties
def test_shape_properties(case):
    td = case.td
    assert td.numel() == 12
    assert td.shape == BATCH and td.batch_size == BATCH
    assert td.ndim == 2 and td.batch_dims == 2 and td.dim() == 2
    assert td.size(0) == 4 and td.size(-1) == 3
    assert list(td.names) == [None, None]
    exp_bytes = sum(t.numel() * t.element_size() for t in ref_leaves(case.ref))
    assert td.bytes() == exp_bytes
    assert td.is_locked == case.locked


def test_batch_size_setter(case):
    td, ref = case.td, case.ref
    td.batch_size = [4]
    assert td.batch_size == torch.Size([4])
    assert td.get("nested").batch_size == NESTED_BATCH  # a nested batch only has to start with it
    assert td[1].batch_size == torch.Size([])
    assert_leaf_equal(td[1].get("a"), ref["a"][1], "a[1]")
    with pytest.raises((ValueError, RuntimeError), match=r"\[4, 5\]"):
        td.batch_size = [4, 5]
    assert td.batch_size == torch.Size([4])
    td.batch_size = [4, 3]
    assert_matches(td, ref, has_str=case.has_str)


def test_names(case):
    td = case.td
    if case.is_lazy or case.reads_copies:  # lazy stacks and h5 files may refuse dim names
        try:
            td.names = ["env", "time"]
        except (ValueError, RuntimeError) as err:
            assert "name" in str(err)
            assert list(td.names) == [None, None]
            return
    td.names = ["env", "time"]
    assert list(td.names) == ["env", "time"]
    assert list(td.get("nested").names)[:2] == ["env", "time"]
    assert list(td[0].names) == ["time"]
    assert list(td.permute(1, 0).names) == ["time", "env"]
    with pytest.raises(ValueError):
        td.names = ["x"]
    td.names = None
    assert list(td.names) == [None, None]


def test_numpy(case):
    td, ref = case.td, case.ref
    arrays = td.numpy()
    assert isinstance(arrays["a"], np.ndarray)
    np.testing.assert_array_equal(arrays["a"], ref["a"].numpy())
    np.testing.assert_array_equal(arrays["nested"]["deeper"]["z"], ref["nested"]["deeper"]["z"].numpy())
    if case.has_str:
        assert arrays[STR_KEY] == STR_VALUE


def test_requires_grad(case):
    floats = case.td.select(*FLOAT_KEYS).clone()
    assert not floats.requires_grad
    floats.requires_grad_()
    assert floats.requires_grad
    for k in FLOAT_KEYS:
        assert floats.get(k).requires_grad
    grad_leaf = floats.tensordicts[0].get("a") if case.is_lazy else floats.get("a")
    loss = floats.sum(reduce=True)
    loss.backward()
    assert_leaf_equal(grad_leaf.grad, torch.ones(grad_leaf.shape), "grad")
    assert not floats.detach().requires_grad
    with pytest.raises(RuntimeError):
        case.td.select("b").clone().requires_grad_()  # integer leaves can't require grad


def test_masked_fill(case):
    td, ref = case.td, case.ref
    mask = MASK_43
    out = td.masked_fill(mask, 0)
    assert_matches(out, ref_map(lambda t: t.masked_fill(bcast(mask, t), 0), ref))
    assert_matches(td, ref)
    td.masked_fill_(mask[:, 0], 1)
    exp = ref_map(lambda t: t.masked_fill(bcast(mask[:, 0], t), 1), ref)
    assert_matches(td, exp)
    if case.is_view:
        assert_matches(case.source(), exp)
    with pytest.raises((TypeError, ValueError)):
        td.masked_fill(torch.ones(4, 3), 0)  # not a bool mask
    with pytest.raises(ValueError):
        td.masked_fill(torch.ones(3, 4, dtype=torch.bool), 0)


def test_is_shared_memmap_locked(case):
    td = case.td
    assert td.is_memmap() == (case.name in ("memmap", "memmap_loaded"))
    if case.name in ("shared", "memmap", "memmap_loaded"):
        assert td.is_shared()
    elif case.name in ("plain", "clone", "subview", "permuted"):
        assert not td.is_shared()
    assert td.is_locked == case.locked
    assert td.clone().is_memmap() is False


# ============================================================================ non-tensor data
def test_non_tensor_preserved(case, tmp_path):
    assert case.has_str, f"every variant holds the non-tensor entry; {case.name} lost it"
    td = case.td
    assert_str_entry(td[0], [3])
    assert_str_entry(td[1:3], [2, 3])
    assert_str_entry(td[MASK_43], [int(MASK_43.sum())])
    assert_str_entry(torch.stack([td, td]), [2, 4, 3])
    assert_str_entry(torch.cat([td, td], 1), [4, 6])
    assert_str_entry(td.clone(), BATCH)
    assert_str_entry(td.to(torch.float64), BATCH)
    assert_str_entry(td.reshape(-1), [12])
    assert_str_entry(td.unbind(0)[2], [3])
    td.save(tmp_path / "nt")
    assert_str_entry(TensorDict.load(tmp_path / "nt"), BATCH)
    assert td.get_non_tensor(STR_KEY) == STR_VALUE


def test_non_tensor_stack_through_ops(case):
    """Per-element strings follow their rows through indexing, permutes and stacks."""
    td = case.td
    if case.locked:
        td.unlock_()
    rows = [[f"r{i}c{j}" for j in range(3)] for i in range(4)]
    if case.is_tensorclass:  # a tensorclass only holds its declared fields: a clear refusal
        with pytest.raises(AttributeError, match="labels"):
            td.set("labels", rows)
        return
    td.set("labels", rows)
    assert td["labels"] == rows
    assert td[2]["labels"] == rows[2]
    assert td[:, 1]["labels"] == [r[1] for r in rows]
    assert td.permute(1, 0)["labels"] == [list(c) for c in zip(*rows)]
    assert td[MASK_4]["labels"] == [rows[i] for i in range(4) if MASK_4[i]]
    assert torch.stack([td, td])["labels"] == [rows, rows]


# ============================================================================ locking
def test_lock_unlock(case):
    td = case.td
    td.lock_()
    assert td.is_locked
    assert td.get("nested").is_locked
    if not case.is_tensorclass:  # a tensorclass refuses unknown fields anyway
        with pytest.raises(RuntimeError, match="locked"):
            td.set("brand_new", torch.zeros(4, 3))
    with pytest.raises(RuntimeError, match="locked"):
        td.set(("nested", "brand_new"), torch.zeros(4, 3, 2))
    if not case.is_tensorclass:
        with pytest.raises(RuntimeError, match="locked"):
            del td["a"]
    assert "brand_new" not in td and "a" in td
    # in-place writes into existing entries stay allowed
    td.set("a", torch.ones(4, 3, 2))
    assert_leaf_equal(td.get("a"), torch.ones(4, 3, 2), "a")
    td[0] = 0
    assert td.get("a")[0].eq(0).all()
    td.unlock_()
    assert not td.is_locked and not td.get("nested").is_locked
    td.set(("nested", "brand_new"), torch.zeros(4, 3, 2))
    assert ("nested", "brand_new") in td


# ============================================================================ repr / pickle / state
def test_repr(case):
    r = repr(case.td)
    for key in ["a", "b", "c", "nested", "x", "y", "deeper", "z"]:
        assert f"{key}:" in r or f"{key}=" in r, key
    assert "torch.Size([4, 3, 2])" in r and "torch.Size([4, 3, 2, 5])" in r
    assert "batch_size=torch.Size([4, 3])" in r
    for dtype in ["torch.float32", "torch.int64", "torch.bool", "torch.int32", "torch.float64"]:
        assert dtype in r, dtype
    if case.has_str:
        assert f"{STR_KEY}:" in r or f"{STR_KEY}=" in r


def test_pickle_round_trip(case):
    td, ref = case.td, case.ref
    back = pickle.loads(pickle.dumps(td))
    assert type(back) is type(td) or is_tensor_collection(back)
    assert_matches(back, ref, has_str=case.has_str)
    assert back.is_locked == td.is_locked


def test_state_dict_round_trip(case):
    td, ref = case.td, case.ref
    sd = td.state_dict()
    assert_leaf_equal(sd["a"], ref["a"], "sd a")
    target = build_td(ref_map(torch.zeros_like, ref), with_str=case.has_str)
    target.load_state_dict(sd)
    assert_matches(target, ref, has_str=case.has_str)
    flat = td.state_dict(flatten=True)
    assert "nested.deeper.z" in flat
    target2 = build_td(ref_map(torch.zeros_like, ref), with_str=case.has_str)
    target2.load_state_dict(flat)
    assert_matches(target2, ref)
    bad = dict(sd)
    del bad["b"]
    with pytest.raises(KeyError, match="b"):
        build_td(ref_map(torch.zeros_like, ref), with_str=case.has_str).load_state_dict(bad)


def test_save_load_round_trip(case, tmp_path):
    td, ref = case.td, case.ref
    path = tmp_path / "saved_td"
    td.save(path)
    loaded = TensorDict.load(path)
    assert_matches(loaded, ref, has_str=case.has_str)
    assert not loaded.is_memmap()
    mapped = TensorDict.load_memmap(path)
    assert mapped.is_memmap() and mapped.is_locked
    assert_matches(mapped, ref, has_str=case.has_str)
    mapped.fill_("a", 5)  # writes land in the files
    assert TensorDict.load(path).get("a").eq(5).all()
    assert_matches(td, ref)  # the saved source is independent of the files


def test_memmap_like_and_copy(case, tmp_path):
    td, ref = case.td, case.ref
    mm = td.memmap(tmp_path / "copy")
    assert mm.is_memmap() and mm.is_locked
    assert_matches(mm, ref, has_str=case.has_str)
    like = td.memmap_like(tmp_path / "like")
    assert like.is_memmap()
    assert_matches(like, ref_map(torch.zeros_like, ref))


def test_math_helpers_consistency(case):
    """numel/bytes/len agree with the batch for every derived view."""
    td = case.td
    for sub in [td[0], td[1:3], td.reshape(-1), td.unsqueeze(0)]:
        assert sub.numel() == math.prod(sub.batch_size)
        assert len(sub) == sub.batch_size[0]


def test_safetensors_round_trip(case, tmp_path):
    from steersman.tensordict import from_safetensors, to_safetensors

    td, ref = case.td, case.ref
    to_safetensors(td, tmp_path / "td.safetensors")
    loaded = from_safetensors(tmp_path / "td.safetensors")
    assert type(loaded) is TensorDict and loaded.batch_size == td.batch_size
    assert_matches(loaded, ref, has_str=case.has_str)
    loaded.fill_("a", 3)  # a copy: the source is untouched
    assert_matches(td, ref)


def test_parse_tensor_dict_string(case):
    """The printed structure of every variant (non-tensor entries left out) comes back."""
    from steersman.tensordict import parse_tensor_dict_string

    td = case.td.exclude(STR_KEY) if case.has_str else case.td
    td = td.to_tensordict() if not isinstance(td, TensorDict) else td
    out = parse_tensor_dict_string(repr(td))
    assert out.batch_size == td.batch_size
    for key in LEAF_KEYS:
        assert out.get(key).shape == ref_get(case.ref, key).shape, key
        assert out.get(key).dtype == ref_get(case.ref, key).dtype, key


def test_consolidate_and_from_consolidated(case, tmp_path):
    """Every variant consolidates into one storage (in memory and in a file) with its content."""
    from steersman.tensordict import from_consolidated

    c = case.td.consolidate()
    assert c.is_locked and c.is_consolidated() and c.batch_size == BATCH
    assert_matches(c, case.ref, BATCH, has_str=case.has_str)
    path = tmp_path / "td.bin"
    case.td.consolidate(filename=path)
    back = from_consolidated(path)
    assert back.is_consolidated() and back["nested"].batch_size == torch.Size([4, 3, 2])
    assert_matches(back, case.ref, BATCH, has_str=case.has_str)
