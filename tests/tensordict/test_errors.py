"""Bad input gets a clear error, and a failed call changes nothing.

The messages are part of the contract: they name the key, the shapes or the index at
fault. Writes that fail half-way (the second leaf of ``td[idx] = other`` has the wrong
shape, ``update_`` meets a missing key in the middle ...) must leave the container
exactly as it was; those checks run on every container variant of the battery.
"""

from __future__ import annotations

import pytest
import torch

from steersman.tensordict import TensorDict, lazy_stack
from tests.tensordict.conftest import (
    BATCH,
    LEAF_KEYS,
    assert_leaf_equal,
    build_td,
    make_reference,
    ref_get,
    ref_map,
)


def small():
    return TensorDict(
        {"obs": torch.zeros(4, 3), "reward": torch.ones(4, 1), "nested": {"x": torch.arange(8.0).reshape(4, 2)}},
        [4],
    )


def snapshot(td):
    """Every tensor leaf, copied (and the key set), to compare after a failed call."""
    keys = sorted(map(str, td.keys(True, True)))
    return keys, {k: td.get(k).clone() for k in LEAF_KEYS if k in td}


def assert_unchanged(td, snap):
    keys, leaves = snap
    assert sorted(map(str, td.keys(True, True))) == keys
    for k, v in leaves.items():
        assert_leaf_equal(td.get(k), v, k)


def assert_case_unchanged(case, snap):
    assert_unchanged(case.td, snap)
    if case.is_view:
        assert_unchanged(case.source(), snap)


# ============================================================================ shapes
def test_constructor_shape_error_names_key_and_shapes():
    with pytest.raises(ValueError, match=r"'obs'.*\[4\].*\[3, 4\]"):
        TensorDict({"obs": torch.zeros(3, 4)}, [4])
    with pytest.raises(ValueError, match=r"'x'.*\[4, 2\].*\[4, 3\]"):
        TensorDict({"nested": TensorDict({"x": torch.zeros(4, 3)}, [4, 2])}, [4])
    with pytest.raises(ValueError, match=r"'deep'"):
        TensorDict({"a": {"deep": torch.zeros(5)}}, [4])


def test_set_shape_error_names_key_and_shapes():
    td = small()
    snap = snapshot(td)
    with pytest.raises(ValueError, match=r"'act'.*\[4\].*\[5, 2\]"):
        td.set("act", torch.zeros(5, 2))
    with pytest.raises(ValueError, match=r"'act'.*\[4\].*\[2\]"):
        td["act"] = torch.zeros(2)
    with pytest.raises(ValueError, match=r"'y'.*\[4\].*\[3\]"):
        td.set(("nested", "y"), torch.zeros(3))
    with pytest.raises(ValueError, match=r"'act'.*\[3, 1\]"):
        td.update({"act": torch.zeros(3, 1)})
    with pytest.raises(ValueError, match=r"\[4, 7\].*'obs'.*\[4, 3\]"):
        td.set_("obs", torch.zeros(4, 7))
    with pytest.raises(ValueError, match=r"'obs'.*\[4, 4\].*\[4, 3\]"):
        td.set("obs", torch.zeros(4, 4), inplace=True)
    assert "act" not in td and ("nested", "y") not in td
    assert_unchanged(td, snap)


def test_batch_size_setter_error():
    td = small()
    with pytest.raises(ValueError, match=r"\[5\].*'obs'.*\[4, 3\]"):
        td.batch_size = [5]
    with pytest.raises(ValueError, match=r"\[4, 3, 9\]"):
        td.batch_size = [4, 3, 9]
    assert td.batch_size == torch.Size([4])
    assert td.get("nested").batch_size == torch.Size([4])
    with pytest.raises(ValueError, match="non-negative"):
        TensorDict({}, [-1])
    with pytest.raises(TypeError):
        TensorDict({}, ["a"])


# ============================================================================ indexing
@pytest.mark.parametrize(
    "index",
    [4, -5, (slice(None), 3), (0, -4), torch.tensor([0, 4]), [5], (1, [0, 3])],
    ids=["int", "neg_int", "dim1", "neg_dim1", "long_tensor", "list", "int_list"],
)
def test_index_out_of_range(index):
    td = TensorDict({"a": torch.zeros(4, 3, 2)}, [4, 3])
    with pytest.raises(IndexError, match=r"out of|bounds|range"):
        td[index]
    with pytest.raises(IndexError):
        td[index] = 1.0
    assert td.get("a").eq(0).all()


@pytest.mark.parametrize(
    "index", [(0, 0, 0), (Ellipsis, 0, 0, 0), (None, 0, 1, 0), (slice(None),) * 3,
              (torch.ones(4, 3, dtype=torch.bool), 0)],
    ids=["ints", "ellipsis", "none", "slices", "mask_then_int"],
)
def test_too_many_indices(index):
    td = TensorDict({"a": torch.zeros(4, 3, 2)}, [4, 3])
    with pytest.raises(IndexError, match="too many indices"):
        td[index]
    with pytest.raises(IndexError, match="too many indices"):
        td[index] = 1.0


def test_bad_index_types_and_masks():
    td = TensorDict({"a": torch.zeros(4, 3)}, [4])
    with pytest.raises(TypeError, match="invalid index"):
        td[1.5]
    with pytest.raises(IndexError, match="long or bool"):
        td[[0.5, 1.0]]
    with pytest.raises(IndexError, match=r"mask|shape"):
        td[torch.tensor([True, False])]
    with pytest.raises(IndexError, match="single ellipsis"):
        td[..., ...]
    with pytest.raises(IndexError, match="empty batch"):
        TensorDict({"a": torch.zeros(3)}, [])[0]
    with pytest.raises(TypeError, match="TensorDict"):
        td[td]


# ============================================================================ keys
def test_missing_key_names_key_and_nearest():
    td = small()
    with pytest.raises(KeyError, match=r"'obz'.*Did you mean 'obs'"):
        td["obz"]
    with pytest.raises(KeyError, match=r"'rewards'.*'reward'"):
        td.get("rewards")
    with pytest.raises(KeyError, match=r"\('nested', 'xx'\).*Did you mean 'x'"):
        td.get(("nested", "xx"))
    with pytest.raises(KeyError, match=r"\('nestd', 'x'\).*Did you mean 'nested'"):
        td["nestd", "x"]
    with pytest.raises(KeyError, match=r"'obs' is a leaf"):
        td.get(("obs", "x"))
    assert ("obs", "x") not in td  # `in` never raises for a path through a leaf
    with pytest.raises(KeyError, match="'obz'"):
        del td["obz"]
    with pytest.raises(KeyError, match="'obz'"):
        td.pop("obz")
    with pytest.raises(KeyError, match="'obz'"):
        td.set_("obz", torch.zeros(4))
    with pytest.raises(KeyError, match="'obz'"):
        td.rename_key_("obz", "o")
    with pytest.raises(KeyError, match="'obz'"):
        td.select("obs", "obz")
    with pytest.raises(KeyError, match="Existing keys"):
        td["zzzzzz"]
    assert set(td.keys()) == {"obs", "reward", "nested"}


def test_non_string_keys():
    with pytest.raises(TypeError, match="strings"):
        TensorDict({1: torch.zeros(3)}, [3])
    td = small()
    with pytest.raises(TypeError, match="strings"):
        td.set(1, torch.zeros(4))
    with pytest.raises(TypeError, match="strings"):
        td.get(1.0)
    with pytest.raises(TypeError, match="strings"):
        td.set(("nested", 2), torch.zeros(4))
    with pytest.raises(TypeError):
        3 in td  # noqa: B015
    with pytest.raises(TypeError, match="strings"):
        td.update({("a", 3): torch.zeros(4)})
    with pytest.raises(TypeError, match="strings"):
        TensorDict.from_dict({"a": {7: torch.zeros(4)}})
    assert set(td.keys()) == {"obs", "reward", "nested"}


def test_locked_refuses_new_keys():
    td = small().lock_()
    snap = snapshot(td)
    with pytest.raises(RuntimeError, match=r"'act'.*locked"):
        td.set("act", torch.zeros(4))
    with pytest.raises(RuntimeError, match=r"'act'.*locked"):
        td["act"] = torch.zeros(4)
    with pytest.raises(RuntimeError, match=r"'y'.*locked"):
        td.set(("nested", "y"), torch.zeros(4))
    with pytest.raises(RuntimeError, match="locked"):
        td.set(("new_branch", "y"), torch.zeros(4))
    with pytest.raises(RuntimeError, match=r"locked"):
        td.update({"obs": torch.ones(4, 3), "act": torch.zeros(4)})  # nothing written
    with pytest.raises(RuntimeError, match=r"'obs'.*locked"):
        del td["obs"]
    with pytest.raises(RuntimeError, match="locked"):
        td.rename_key_("obs", "o")
    with pytest.raises(RuntimeError, match="locked"):
        td.setdefault("act", torch.zeros(4))
    assert td.is_locked
    assert_unchanged(td, snap)
    assert td.get("obs").eq(0).all()


# ============================================================================ stack / cat
def test_stack_cat_mismatches_name_the_difference():
    a, b = small(), small()
    with pytest.raises(KeyError, match=r"missing \['reward'\]"):
        torch.stack([a, b.exclude("reward")])
    with pytest.raises(KeyError, match=r"extra \['act'\]"):
        torch.stack([a, b.clone().set("act", torch.zeros(4))])
    with pytest.raises(KeyError, match=r"'nested'.*missing \['x'\]"):
        torch.stack([a, b.exclude(("nested", "x"))])
    with pytest.raises(KeyError, match=r"'nested'.*missing \['x'\]"):
        torch.cat([a, b.exclude(("nested", "x"))])
    with pytest.raises(ValueError, match=r"\[4\].*\[3\]"):
        torch.stack([a, b[:3]])
    with pytest.raises(ValueError, match=r"'obs'.*\[4, 3\].*\[4, 5\]"):
        torch.stack([a, b.clone().set("obs", torch.zeros(4, 5))])
    with pytest.raises(ValueError, match=r"'obs'"):
        torch.cat([a, b.clone().set("obs", torch.zeros(4, 5))])
    with pytest.raises(ValueError, match=r"\[4, 2\].*\[4, 3\]"):
        torch.cat([TensorDict({"o": torch.zeros(4, 2)}, [4, 2]), TensorDict({"o": torch.zeros(4, 3)}, [4, 3])], 0)
    with pytest.raises(RuntimeError, match="non-empty"):
        torch.stack([])
    with pytest.raises(RuntimeError, match="empty batch"):
        torch.cat([TensorDict({}, []), TensorDict({}, [])])
    with pytest.raises(IndexError, match="dim"):
        torch.stack([a, b], 3)
    with pytest.raises(IndexError, match="dim"):
        torch.cat([a, b], 1)
    # the inputs are untouched
    assert set(a.keys(True)) == set(small().keys(True))


def test_lazy_stack_of_mismatched_batch():
    a, b = small(), small()
    with pytest.raises((ValueError, RuntimeError), match=r"\[4\].*\[3\]|\[3\].*\[4\]"):
        lazy_stack([a, b[:3]])


# ============================================================================ shape ops
def test_shape_op_errors():
    td = TensorDict({"a": torch.zeros(4, 3, 2)}, [4, 3])
    with pytest.raises(RuntimeError, match=r"\[5\].*\[4, 3\]"):
        td.reshape(5)
    with pytest.raises(RuntimeError, match=r"\[7, 2\]"):
        td.view(7, 2)
    with pytest.raises(ValueError, match="permute"):
        td.permute(0, 0)
    with pytest.raises(ValueError, match="permute"):
        td.permute(0)
    with pytest.raises(IndexError, match="unsqueeze"):
        td.unsqueeze(4)
    with pytest.raises(IndexError, match="out of range"):
        td.unbind(2)
    with pytest.raises(IndexError, match="out of range"):
        td.transpose(0, 2)
    with pytest.raises(IndexError, match="out of range"):
        td.sum(dim=2)
    with pytest.raises(RuntimeError, match=r"expand"):
        td.expand(4, 5)
    with pytest.raises(RuntimeError, match="fewer"):
        td.expand(3)
    with pytest.raises(ValueError, match=r"\[1, 1\].*4"):
        td.split([1, 1], 0)
    with pytest.raises(ValueError, match="positive"):
        td.split(0, 0)
    with pytest.raises(ValueError, match="repeat"):
        td.repeat(2)
    with pytest.raises(ValueError, match="gather"):
        torch.gather(td, 0, torch.zeros(4, dtype=torch.long))
    assert td.batch_size == BATCH and td.get("a").shape == (4, 3, 2)


def test_mask_and_where_errors():
    td = TensorDict({"a": torch.zeros(4, 3)}, [4])
    with pytest.raises(TypeError, match="bool"):
        td.masked_fill(torch.ones(4), 1.0)
    with pytest.raises(ValueError, match=r"\[3\].*\[4\]"):
        td.masked_fill_(torch.ones(3, dtype=torch.bool), 1.0)
    with pytest.raises(ValueError, match=r"\[3\].*\[4\]"):
        torch.where(torch.ones(3, dtype=torch.bool), td, td)
    with pytest.raises(TypeError, match="condition"):
        torch.where(td.bool(), td, td)
    assert td.get("a").eq(0).all()


def test_arithmetic_with_mismatched_keys():
    a = small()
    with pytest.raises(KeyError, match="'reward'"):
        a + a.exclude("reward")
    with pytest.raises(KeyError, match=r"'x'"):
        a * a.exclude(("nested", "x"))
    with pytest.raises(ValueError, match="batch dims"):
        a.apply(lambda x: x[0])  # changes the batch size without batch_size=
    with pytest.raises(RuntimeError, match="ambiguous"):
        if a == a:
            pass
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(a)


def test_io_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="meta.json"):
        TensorDict.load(tmp_path / "nothing_here")
    td = TensorDict({"a": torch.zeros(3), "obj": object()}, [3])
    with pytest.raises(TypeError, match="'obj'.*JSON"):
        td.save(tmp_path / "bad")
    with pytest.raises(ValueError, match="file name"):
        TensorDict({"a/b": torch.zeros(3)}, [3]).save(tmp_path / "bad2")


# ============================================================================ half-way failures, every variant
def _bad_other(case, idx, bad_key, nested_bad=False):
    """A value for ``td[idx] = ...``: right everywhere but at ``bad_key``."""
    ref = make_reference(seed=5)
    norm = idx if isinstance(idx, tuple) else (idx,)
    sub = ref_map(lambda t: t[norm], ref)
    bs = torch.empty(BATCH)[norm].shape
    other = build_td(sub, bs, with_str=False)
    if nested_bad:
        other.get(("nested", "deeper")).del_("z")
        other.get(("nested", "deeper")).set("z", torch.zeros(*bs, 2, 7))
    else:
        other.del_(bad_key)
        other.set(bad_key, torch.zeros(*bs, 9))
    return other


@pytest.mark.parametrize("idx", [slice(1, 3), 2, (slice(None), 1)], ids=["slice", "int", "dim1"])
def test_setitem_failing_second_leaf_changes_nothing(case, idx):
    snap = snapshot(case.td)
    other = _bad_other(case, idx, "b")
    with pytest.raises((ValueError, RuntimeError), match=r"'b'|\[.*9\]"):
        case.td[idx] = other
    assert_case_unchanged(case, snap)
    deep = _bad_other(case, idx, None, nested_bad=True)
    with pytest.raises((ValueError, RuntimeError), match=r"z|\[.*7\]"):
        case.td[idx] = deep
    assert_case_unchanged(case, snap)


def test_setitem_dict_failing_nested_leaf_changes_nothing(case):
    snap = snapshot(case.td)
    value = {"a": torch.full((2, 3, 2), 9.0), "nested": {"x": torch.ones(2, 3, 2, 5), "y": torch.ones(2, 3, 5)}}
    with pytest.raises((ValueError, RuntimeError)):
        case.td[1:3] = value
    assert_case_unchanged(case, snap)


def test_update_inplace_missing_key_changes_nothing(case):
    snap = snapshot(case.td)
    with pytest.raises(KeyError, match="not_there"):
        case.td.update_({"a": torch.full((4, 3, 2), 5.0), "not_there": torch.ones(4, 3),
                         "b": torch.zeros(4, 3, dtype=torch.int64)})
    assert_case_unchanged(case, snap)
    with pytest.raises(KeyError, match="q"):
        case.td.update_({"a": torch.full((4, 3, 2), 5.0), "nested": {"x": torch.zeros(4, 3, 2, 5), "q": torch.ones(4, 3, 2)}})
    assert_case_unchanged(case, snap)
    with pytest.raises((ValueError, RuntimeError), match="'b'|b"):
        case.td.update_({"a": torch.full((4, 3, 2), 5.0), "b": torch.zeros(4, 3, 8, dtype=torch.int64)})
    assert_case_unchanged(case, snap)


def test_update_failing_nested_entry_changes_nothing(case):
    snap = snapshot(case.td)
    # a tensorclass refuses the undeclared field "w" (AttributeError); others the bad shape
    with pytest.raises((ValueError, RuntimeError, AttributeError)):
        case.td.update({"a": torch.full((4, 3, 2), 5.0), "nested": {"x": torch.zeros(4, 3, 2, 5), "w": torch.ones(4, 2)}})
    assert_case_unchanged(case, snap)


def test_copy_and_set_failures_change_nothing(case):
    snap = snapshot(case.td)
    bad = case.td.clone()
    if case.is_tensorclass:
        bad = bad.to_tensordict() if hasattr(bad, "to_tensordict") else bad._tensordict
    bad = bad.apply(lambda x: x)  # a plain copy we may restructure
    bad = TensorDict.from_dict(bad.to_dict(), batch_size=BATCH) if not isinstance(bad, TensorDict) else bad
    bad.del_("b")
    bad.set("b", torch.zeros(4, 3, 4, dtype=torch.int64))
    with pytest.raises((ValueError, RuntimeError)):
        case.td.copy_(bad)
    assert_case_unchanged(case, snap)
    with pytest.raises((ValueError, RuntimeError), match="'c'|c"):
        case.td.set_("c", torch.zeros(4, 3, 5, dtype=torch.bool))
    assert_case_unchanged(case, snap)


@pytest.mark.parametrize("op", ["add_", "sub_", "mul_", "lerp_"])
def test_inplace_arithmetic_failure_changes_nothing(case, op):
    floats = case.td.get(("nested", "deeper")) if case.reads_copies else case.td.select("a", ("nested", "x"))
    snap = snapshot(case.td)
    if case.reads_copies:
        other = TensorDict({"z": torch.ones(4, 3, 2, 3, dtype=torch.float64)}, [4, 3, 2])
    else:
        other = TensorDict({"a": torch.ones(4, 3, 2), "nested": TensorDict({"x": torch.ones(4, 3, 2, 6)}, [4, 3, 2])}, BATCH)
    with pytest.raises((ValueError, RuntimeError)):
        if op == "lerp_":
            floats.lerp_(other, 0.5)
        else:
            getattr(floats, op)(other)
    assert_case_unchanged(case, snap)


def test_inplace_dtype_failure_changes_nothing(case):
    """Float results can't go into the int/bool leaves: refused before any leaf is written."""
    snap = snapshot(case.td)
    with pytest.raises(RuntimeError):
        case.td.div_(2.0)
    assert_case_unchanged(case, snap)
    with pytest.raises(RuntimeError):
        case.td.mul_(1.5)
    assert_case_unchanged(case, snap)
    with pytest.raises(RuntimeError):
        case.td.add_(torch.full((4, 3), 0.5))
    assert_case_unchanged(case, snap)


def test_masked_fill_bad_mask_changes_nothing(case):
    snap = snapshot(case.td)
    with pytest.raises((ValueError, IndexError)):
        case.td.masked_fill_(torch.ones(3, 4, dtype=torch.bool), 1)
    with pytest.raises((TypeError, ValueError)):
        case.td.masked_fill_(torch.ones(4, 3), 1)
    assert_case_unchanged(case, snap)


def test_batch_size_setter_failure_changes_nothing(case):
    snap = snapshot(case.td)
    with pytest.raises((ValueError, RuntimeError)):
        case.td.batch_size = [4, 3, 5]
    assert case.td.batch_size == BATCH
    assert_case_unchanged(case, snap)


def test_index_errors_on_every_variant(case):
    td = case.td
    with pytest.raises(IndexError):
        td[4]
    with pytest.raises(IndexError):
        td[0, 0, 0]
    with pytest.raises(KeyError):
        td.get("missing_key")
    for key in LEAF_KEYS:
        assert_leaf_equal(td.get(key), ref_get(case.ref, key), key)


def test_constructor_accepts_nested_tuple_keys():
    import torch

    from steersman import TensorDict

    td = TensorDict({("a", "b"): torch.zeros(3), ("a", "c"): torch.ones(3, 2), ("d",): torch.ones(3)}, [3])
    assert td["a", "b"].shape == (3,) and td["a"].batch_size == (3,) and "d" in td.keys()
    with pytest.raises(ValueError, match="batch size mismatch"):
        TensorDict({("a", "b"): torch.zeros(4)}, [3])
