"""The TensorDict fast paths agree with the general paths they short-cut.

Hot operations take a fast path for the common layout (one batch dim, plain nested
TensorDicts of the same batch size, dense tensor leaves, no names) and fall back to the
general path otherwise. Each test runs an operation on every layout of ``LAYOUTS`` (so
both paths run) and compares with the same operation applied leaf by leaf to a plain
nested dict, or checks that bad input raises and leaves the container unchanged.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.tensordict import MemoryMappedTensor, NonTensorData, TensorDict, lazy_stack

B = 6


def _ref(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(B, 3, generator=g),
        "reward": torch.randn(B, 1, generator=g),
        "done": torch.rand(B, 1, generator=g) > 0.5,
        "step": torch.randint(0, 9, (B,), generator=g),
        "next": {"obs": torch.randn(B, 3, generator=g), "reward": torch.randn(B, 1, generator=g)},
    }


def _plain(seed: int = 0) -> tuple[TensorDict, dict]:
    ref = _ref(seed)
    return TensorDict(_ref_map(torch.clone, ref), [B]), ref


def _extra_dim(seed: int = 0) -> tuple[TensorDict, dict]:
    """The nested TensorDict has a batch dim more than its parent."""
    td, ref = _plain(seed)
    sub = {"x": torch.randn(B, 2, 4, generator=torch.Generator().manual_seed(seed + 1))}
    td["agents"] = TensorDict({"x": sub["x"].clone()}, [B, 2])
    ref["agents"] = sub
    return td, ref


def _named(seed: int = 0) -> tuple[TensorDict, dict]:
    td, ref = _plain(seed)
    td.names = ["time"]
    return td, ref


def _with_device(seed: int = 0) -> tuple[TensorDict, dict]:
    ref = _ref(seed)
    return TensorDict(_ref_map(torch.clone, ref), [B], device="cpu"), ref


def _two_dims(seed: int = 0) -> tuple[TensorDict, dict]:
    """Two batch dims: ``[B, 2]``."""
    ref = {k: (_ref_map(lambda x: torch.stack([x, x + 1]).transpose(0, 1).contiguous(), v)
               if isinstance(v, dict) else torch.stack([v, v]).transpose(0, 1).contiguous())
           for k, v in _ref(seed).items()}
    return TensorDict(_ref_map(torch.clone, ref), [B, 2]), ref


LAYOUTS = {"plain": _plain, "extra_dim": _extra_dim, "named": _named, "device": _with_device,
           "two_dims": _two_dims}


def _ref_map(fn, ref: dict, *others: dict) -> dict:
    return {k: _ref_map(fn, v, *(o[k] for o in others)) if isinstance(v, dict) else fn(v, *(o[k] for o in others))
            for k, v in ref.items()}


def _leaves(ref: dict, prefix: tuple = ()) -> dict:
    out = {}
    for k, v in ref.items():
        if isinstance(v, dict):
            out.update(_leaves(v, prefix + (k,)))
        else:
            out[prefix + (k,)] = v
    return out


def assert_same(td, ref: dict, batch_size) -> None:
    assert td.batch_size == torch.Size(batch_size)
    got = {k if isinstance(k, tuple) else (k,): v for k, v in td.items(True, True)}
    expected = _leaves(ref)
    assert set(got) == set(expected)
    for key, exp in expected.items():
        act = got[key]
        act = act.as_subclass(torch.Tensor) if isinstance(act, MemoryMappedTensor) else act
        assert act.shape == exp.shape and act.dtype == exp.dtype, (key, act.shape, exp.shape)
        assert torch.equal(act, exp), key


def snapshot(td) -> dict:
    return {k: v.clone() for k, v in td.items(True, True)}


def assert_unchanged(td, before: dict) -> None:
    after = td.items(True, True)
    assert len(after) == len(before)
    for k, v in after:
        assert torch.equal(v, before[k]), k


layouts = pytest.mark.parametrize("layout", list(LAYOUTS))


# ----------------------------------------------------------------------------- indexing
INDICES = {
    "int": 2, "neg_int": -1, "slice": slice(1, 5), "step_slice": slice(None, None, 2), "empty_slice": slice(4, 1),
    "long": torch.tensor([4, 0, 0, 5]), "neg_long": torch.tensor([-1, 2]), "empty_long": torch.zeros(0, dtype=torch.long),
    "int32": torch.tensor([1, 3], dtype=torch.int32), "mask": torch.tensor([True, False, True, True, False, True]),
    "empty_mask": torch.zeros(B, dtype=torch.bool),
}


@layouts
@pytest.mark.parametrize("kind", list(INDICES))
def test_index(layout, kind):
    td, ref = LAYOUTS[layout]()
    idx = INDICES[kind]
    out = td[idx]
    expected = _ref_map(lambda x: x[idx], ref)
    assert_same(out, expected, ref["obs"][idx].shape[: td.batch_dims - (type(idx) is int)])
    assert out.device == td.device
    if layout == "named" and type(idx) is slice:
        assert out.names == ["time"]


@layouts
@pytest.mark.parametrize("idx", [B, -B - 1, torch.tensor([0, B]), torch.tensor([-B - 1]),
                                 torch.ones(B + 1, dtype=torch.bool)], ids=["int", "neg_int", "long", "neg_long", "mask"])
def test_index_out_of_range_raises(layout, idx):
    td, _ = LAYOUTS[layout]()
    with pytest.raises(IndexError):
        td[idx]


@layouts
@pytest.mark.parametrize("kind", ["int", "slice", "long", "mask"])
def test_setitem_matches_leafwise(layout, kind):
    td, ref = LAYOUTS[layout]()
    idx = INDICES[kind]
    src_td, src_ref = LAYOUTS[layout](seed=7)
    sub = src_td[idx]
    td[idx] = sub

    def write(x, s):
        x = x.clone()
        x[idx] = s[idx]
        return x
    assert_same(td, _ref_map(write, ref, src_ref), td.batch_size)


@pytest.mark.parametrize("kind", ["int", "slice", "long"])
def test_setitem_bad_feature_shape_changes_nothing(kind):
    td, _ = _plain()
    before = snapshot(td)
    bad = td[INDICES[kind]].clone()
    bad.set(("next", "obs"), torch.zeros(*bad.batch_size, 4))  # the last leaf written is wrong
    with pytest.raises((ValueError, RuntimeError)):
        td[INDICES[kind]] = bad
    assert_unchanged(td, before)


# ----------------------------------------------------------------------------- key access
@pytest.mark.parametrize("batch,value", [([B], torch.zeros(())), ([B], torch.zeros(B + 1, 2)),
                                         ([B, 2], torch.zeros(B, 3)), ([B, 2], torch.zeros(B))])
@pytest.mark.parametrize("how", ["setitem", "set", "update", "constructor"])
def test_set_batch_mismatch_names_the_key(batch, value, how):
    td = TensorDict({"a": torch.zeros(*batch)}, batch)
    with pytest.raises(ValueError, match="batch size mismatch for key 'bad'"):
        if how == "setitem":
            td["bad"] = value
        elif how == "set":
            td.set("bad", value)
        elif how == "constructor":
            TensorDict({"bad": value}, batch)
        else:
            td.update({"a": torch.ones(*batch), "bad": value})
    assert set(td.keys()) == {"a"} and not td["a"].any()


@pytest.mark.parametrize("batch", [[], [B], [B, 2]])
def test_set_matching_batch(batch):
    td = TensorDict({}, batch)
    x = torch.ones(*batch, 3)
    td["x"] = x
    td.set("y", x)
    td.update({"z": x})
    assert td["x"] is x and td["y"] is x and td["z"] is x


@layouts
def test_select_exclude_flatten(layout):
    td, ref = LAYOUTS[layout]()
    assert_same(td.select("obs", "next"), {"obs": ref["obs"], "next": ref["next"]}, td.batch_size)
    rest = {k: v for k, v in ref.items() if k not in ("obs", "next")}
    assert_same(td.exclude("obs", "next", "missing"), rest, td.batch_size)
    flat = td.flatten_keys("/")
    assert set(flat.keys()) == {"/".join(k) for k in _leaves(ref)}
    assert flat.batch_size == td.batch_size and flat["next/obs"] is td["next", "obs"]


def test_flatten_keys_collision_raises():
    td = TensorDict({"a.b": torch.zeros(B), "a": {"b": torch.ones(B)}}, [B])
    with pytest.raises(KeyError, match="twice"):
        td.flatten_keys()


def test_exclude_nested_key_takes_general_path():
    td, ref = _plain()
    out = td.exclude(("next", "obs"), "obs")
    assert set(out.keys(True, True)) == {"reward", "done", "step", ("next", "reward")}
    assert ("next", "obs") in td  # the source is untouched


# ----------------------------------------------------------------------------- joins and splits
@layouts
@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("op", ["stack", "cat"])
def test_stack_cat(layout, dim, op):
    tds, refs = zip(*(LAYOUTS[layout](seed=s) for s in range(3)))
    fn = getattr(torch, op)
    out = fn(list(tds), dim)
    bd = tds[0].batch_dims
    d = dim % (bd + 1 if op == "stack" else bd)
    assert_same(out, _ref_map(lambda *xs: fn(xs, d), *refs), fn([r["step"] for r in refs], d).shape)
    if layout == "named" and op == "cat":
        assert out.names == ["time"]


def test_cat_uneven_sizes():
    a, ra = _plain()
    b = a[:2]
    out = torch.cat([a, b, a])
    assert out.batch_size == torch.Size([2 * B + 2])
    assert torch.equal(out["next", "obs"], torch.cat([ra["next"]["obs"], ra["next"]["obs"][:2], ra["next"]["obs"]]))


@pytest.mark.parametrize("op", ["stack", "cat"])
def test_stack_cat_mismatch_raises(op):
    a, _ = _plain()
    b = a.exclude("obs")
    with pytest.raises(KeyError, match="obs"):
        getattr(torch, op)([a, b])
    c = a.clone()
    c["next"]["obs"] = torch.zeros(B, 5)
    with pytest.raises(ValueError, match="next"):
        getattr(torch, op)([a, c])


def test_stack_of_mixed_types_falls_back():
    a, _ = _plain()
    lazy = lazy_stack([a[0], a[1]])  # a lazy stack of batch [2]
    out = torch.stack([a[:2], lazy], 0)
    assert out.batch_size == torch.Size([2, 2])
    assert torch.equal(out[1]["obs"], a["obs"][:2])


def test_lazy_stack_fast_path():
    a, _ = _plain()
    b, _ = _plain(1)
    out = lazy_stack([a, b], 1)
    assert out.batch_size == torch.Size([B, 2]) and out.tensordicts[0] is a and out.tensordicts[1] is b
    with pytest.raises(ValueError, match="batch size"):
        lazy_stack([a, b[:2]])
    with pytest.raises(IndexError):
        lazy_stack([a, b], 2)


@layouts
@pytest.mark.parametrize("op", ["unbind", "split"])
def test_unbind_split(layout, op):
    td, ref = LAYOUTS[layout]()
    if op == "unbind":
        parts, ref_parts = td.unbind(0), [_ref_map(lambda x, i=i: x[i], ref) for i in range(B)]
    else:
        parts = td.split([1, 3, 2], 0)
        ref_parts = [_ref_map(lambda x, s=s: x[s], ref) for s in (slice(0, 1), slice(1, 4), slice(4, 6))]
    assert len(parts) == len(ref_parts)
    for p, r in zip(parts, ref_parts):
        assert_same(p, r, r["step"].shape)


# ----------------------------------------------------------------------------- shape ops
@pytest.mark.parametrize("dims", [(1, 0), (0, 1), (2, 0, 1), (0, 2, 1), (-1, 0, 1)])
def test_permute(dims):
    nd = len(dims)
    shape = (2, 3, 4)[:nd]
    ref = {"a": torch.randn(*shape, 5), "n": {"b": torch.randn(*shape, 2, 2)}}
    td = TensorDict(_ref_map(torch.clone, ref), shape)
    out = td.permute(*dims)
    norm = [d % nd for d in dims]
    assert_same(out, _ref_map(lambda x: x.permute(*norm, *range(nd, x.ndim)), ref), [shape[d] for d in norm])


@pytest.mark.parametrize("dims", [(0,), (0, 0), (0, 2), (1, 2, 0)])
def test_permute_bad_dims_raise(dims):
    td = TensorDict({"a": torch.zeros(2, 3)}, [2, 3])
    with pytest.raises(ValueError, match="permute"):
        td.permute(*dims)


@layouts
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_unsqueeze(layout, dim):
    td, ref = LAYOUTS[layout]()
    d = dim % (td.batch_dims + 1)
    assert_same(td.unsqueeze(dim), _ref_map(lambda x: x.unsqueeze(d), ref), ref["step"].unsqueeze(d).shape)


# ----------------------------------------------------------------------------- leafwise ops
@layouts
def test_apply_and_clone(layout):
    td, ref = LAYOUTS[layout]()
    assert_same(td.apply(lambda x: x * 2), _ref_map(lambda x: x * 2, ref), td.batch_size)
    out = td.clone()
    assert_same(out, ref, td.batch_size)
    assert out.names == td.names and out.device == td.device
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(out.values(True, True), td.values(True, True)))


def test_apply_that_changes_batch_dims_raises():
    td, _ = _plain()
    with pytest.raises(ValueError, match="batch"):
        td.apply(lambda x: x[0])


def test_clone_with_non_tensor_entry():
    td, ref = _plain()
    td["s"] = "hello"
    out = td.clone()
    assert isinstance(out.get("s"), NonTensorData) and out["s"] == "hello"
    assert_same(out.exclude("s"), ref, [B])


@layouts
@pytest.mark.parametrize("name", ["sum", "mean", "amax", "prod"])
@pytest.mark.parametrize("keepdim", [False, True])
def test_reduction(layout, name, keepdim):
    td, ref = LAYOUTS[layout]()
    td, ref = td.exclude("done", "step"), {k: v for k, v in ref.items() if k not in ("done", "step")}
    out = getattr(td, name)(dim=0, keepdim=keepdim)
    expected = _ref_map(lambda x: getattr(torch, name)(x, 0, keepdim=keepdim), ref)
    bs = torch.Size([1, *td.batch_size[1:]]) if keepdim else td.batch_size[1:]
    assert out.batch_size == bs
    for k, v in _leaves(expected).items():
        torch.testing.assert_close(out.get(k), v)


@layouts
@pytest.mark.parametrize("op", ["add_", "add_alpha", "lerp_"])
def test_inplace_pairs(layout, op):
    td, ref = LAYOUTS[layout]()
    other, oref = LAYOUTS[layout](seed=3)
    td, other = td.exclude("done"), other.exclude("done")
    ref, oref = ({k: v for k, v in r.items() if k != "done"} for r in (ref, oref))
    if op == "add_":
        td.add_(other)
        expected = _ref_map(torch.add, ref, oref)
    elif op == "add_alpha":
        td.add_(other, alpha=2)
        expected = _ref_map(lambda a, b: a + 2 * b, ref, oref)
    else:
        td, ref = td.exclude("step"), {k: v for k, v in ref.items() if k != "step"}
        td.lerp_(other.exclude("step"), 0.25)
        expected = _ref_map(lambda a, b: torch.lerp(a, b, 0.25), ref, oref)
    assert_same(td, expected, td.batch_size)


def test_add_broadcast_and_cast_take_general_path():
    td = TensorDict({"a": torch.zeros(B, 3), "n": {"b": torch.zeros(B, 2)}}, [B])
    td.add_(TensorDict({"a": torch.ones(B, 1), "n": {"b": torch.ones(B, 2, dtype=torch.int64)}}, [B]))
    assert torch.equal(td["a"], torch.ones(B, 3)) and td["n", "b"].dtype == torch.float32
    assert torch.equal(td["n", "b"], torch.ones(B, 2))


@pytest.mark.parametrize("bad", ["missing_key", "bad_shape", "bad_dtype"])
def test_add_bad_other_changes_nothing(bad):
    td = TensorDict({"a": torch.zeros(B, 3), "n": {"b": torch.zeros(B, 2, dtype=torch.int64)}}, [B])
    other = td.clone() + 1
    if bad == "missing_key":
        del other["n", "b"]
    elif bad == "bad_shape":
        other["n", "b"] = torch.ones(B, 5, dtype=torch.int64)
    else:
        other["n", "b"] = torch.ones(B, 2)  # float into an int64 leaf
    before = snapshot(td)
    with pytest.raises((KeyError, ValueError, RuntimeError)):
        td.add_(other)
    assert_unchanged(td, before)


# ----------------------------------------------------------------------------- memmap files
@pytest.mark.parametrize("layout", ["plain", "extra_dim", "device"])
def test_memmap_round_trip_and_rewrite(layout, tmp_path):
    td, ref = LAYOUTS[layout]()
    out = td.memmap(tmp_path)
    assert_same(out, ref, td.batch_size)
    assert isinstance(out["obs"], MemoryMappedTensor) and out.is_locked
    loaded = TensorDict.load_memmap(tmp_path)
    assert_same(loaded, ref, td.batch_size)
    # rewriting the same folder with smaller leaves resizes the files
    small = td[:2]
    small.memmap(tmp_path)
    assert os.path.getsize(tmp_path / "obs.memmap") == 2 * 3 * 4
    assert_same(TensorDict.load_memmap(tmp_path), _ref_map(lambda x: x[:2], ref), [2])


def test_memmap_writes_go_to_the_file(tmp_path):
    td, _ = _plain()
    out = td.memmap(tmp_path)
    out["obs"][0] = 42.0
    assert (TensorDict.load_memmap(tmp_path)["obs"][0] == 42.0).all()


def test_load_rejects_a_wrong_size_or_a_path_outside(tmp_path):
    td, _ = _plain()
    td.memmap(tmp_path)
    with open(tmp_path / "obs.memmap", "r+b") as f:
        f.truncate(8)
    with pytest.raises(ValueError, match="bytes"):
        TensorDict.load_memmap(tmp_path)
    assert os.path.getsize(tmp_path / "obs.memmap") == 8  # not silently grown
    td.memmap(tmp_path)
    meta = (tmp_path / "meta.json").read_text()
    (tmp_path / "meta.json").write_text(meta.replace('"file": "reward.memmap"', '"file": "../reward.memmap"'))
    with pytest.raises(ValueError, match="file name"):
        TensorDict.load_memmap(tmp_path)


# ----------------------------------------------------------------------------- property
@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 5), data=st.data())
def test_index_property(n, data):
    """Any int, slice, long index (negatives included) or mask over dim 0: as leaf by leaf."""
    g = torch.Generator().manual_seed(n)
    ref = {"a": torch.randn(n, 2, generator=g), "n": {"b": torch.randn(n, generator=g)}}
    td = TensorDict(_ref_map(torch.clone, ref), [n])
    kind = data.draw(st.sampled_from(["int", "slice", "long", "mask"]))
    if kind == "int":
        idx = data.draw(st.integers(-n - 2, n + 1))
    elif kind == "slice":
        idx = slice(*data.draw(st.tuples(st.none() | st.integers(-7, 7), st.none() | st.integers(-7, 7),
                                          st.none() | st.integers(1, 3))))
    elif kind == "long":
        idx = torch.tensor(data.draw(st.lists(st.integers(-n - 1, n), max_size=5)), dtype=torch.long)
    else:
        idx = torch.tensor(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=torch.bool)
    try:
        expected = _ref_map(lambda x: x[idx], ref)
    except IndexError:
        with pytest.raises(IndexError):
            td[idx]
        return
    assert_same(td[idx], expected, ref["n"]["b"][idx].shape)


# ----------------------------------------------------------------------------- trusted construction
def test_from_trusted_wraps_the_dict_as_is():
    ref = _ref()
    nested = TensorDict.from_trusted(ref.pop("next"), torch.Size([B]))
    entries = {**ref, "next": nested}
    td = TensorDict.from_trusted(entries, torch.Size([B]), torch.device("cpu"))
    assert td.entries is entries  # no copy: the dict becomes the container's storage
    assert td["obs"] is ref["obs"] and td["next", "reward"] is nested["reward"]
    assert td.batch_size == torch.Size([B]) and td.device == torch.device("cpu")
    assert td.names_or_none() is None and not td.is_locked
    # it behaves like a validated TensorDict built from the same entries
    built = TensorDict({**ref, "next": dict(nested.entries)}, [B], "cpu")
    for key in built.keys(True, True):
        assert torch.equal(td[2:4][key], built[2:4][key])


def test_entries_is_the_live_dict_and_writing_skips_checks():
    td, _ = _plain()
    td.entries["extra"] = torch.zeros(B + 1)  # no batch check: the caller's responsibility
    assert td["extra"].shape == (B + 1,)
    with pytest.raises(ValueError, match="'extra2'"):
        td["extra2"] = torch.zeros(B + 1)  # the checked path still refuses it
    assert "extra2" not in td.entries
    td.entries.pop("extra")
    assert "extra" not in td.keys()
