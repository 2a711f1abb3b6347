"""Tests for ``LazyStackedTensorDict`` / ``lazy_stack`` / ``lazy_cat``.

When the members have matching shapes every result is compared with the same op on
the dense ``torch.stack(members)``; ragged and heterogeneous stacks are checked
against the members themselves.
"""

from __future__ import annotations

import pickle

import pytest
import torch

from steersman.tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase, lazy_stack
from steersman.tensordict.io import load, save
from steersman.tensordict.lazy import RaggedStackError, lazy_cat


# ----------------------------------------------------------------------------- helpers
def make_members(n: int = 3, b: int = 4, seed: int = 0) -> list[TensorDict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        out.append(TensorDict({
            "a": torch.randn(b, 3, generator=g),
            "b": torch.randint(0, 10, (b,), generator=g),
            "nested": TensorDict({"x": torch.randn(b, 2, generator=g)}, [b]),
        }, [b]))
    return out


def dense_and_lazy(sd: int = 0, n: int = 3, b: int = 4):
    members = make_members(n, b)
    lazy = lazy_stack(members, sd)
    dense = torch.stack([m.clone() for m in members], sd)
    assert type(dense) is TensorDict
    return members, lazy, dense


def assert_same(actual: TensorDictBase, expected: TensorDictBase) -> None:
    assert actual.batch_size == expected.batch_size, (actual.batch_size, expected.batch_size)
    keys = sorted(map(str, expected.keys(True, True)))
    assert sorted(map(str, actual.keys(True, True))) == keys
    for k in expected.keys(True, True):
        e, a = expected.get(k), actual.get(k)
        if isinstance(e, torch.Tensor):
            assert a.shape == e.shape, (k, a.shape, e.shape)
            assert a.dtype == e.dtype, (k, a.dtype, e.dtype)
            assert torch.equal(a, e), k


def ragged_trajs(lengths=(5, 7, 3)) -> list[TensorDict]:
    out = []
    for i, t in enumerate(lengths):
        out.append(TensorDict({
            "obs": torch.arange(t * 3, dtype=torch.float32).reshape(t, 3) + 100 * i,
            "done": torch.tensor([i % 2 == 0]),
        }))
    return out


# ----------------------------------------------------------------------------- construction
def test_construction_and_properties():
    members = make_members(3, 4)
    td = LazyStackedTensorDict(*members, stack_dim=1)
    assert LazyStackedTensorDict._is_lazy and isinstance(td, TensorDictBase)
    assert td.batch_size == torch.Size([4, 3])
    assert td.stack_dim == 1
    assert td.tensordicts == members and all(a is b for a, b in zip(td.tensordicts, members))
    assert td.names == [None, None]
    assert td.device is None
    on_cpu = lazy_stack([TensorDict({"a": torch.zeros(2)}, [2], device="cpu") for _ in range(2)])
    assert on_cpu.device == torch.device("cpu")
    with pytest.raises(IndexError):
        LazyStackedTensorDict(*members, stack_dim=3)
    assert LazyStackedTensorDict(*members, stack_dim=-1).stack_dim == 1


def test_members_must_share_batch_size():
    a = TensorDict({"x": torch.zeros(3)}, [3])
    b = TensorDict({"x": torch.zeros(4)}, [4])
    with pytest.raises(ValueError, match=r"batch size.*\[3\].*\[4\]"):
        lazy_stack([a, b])
    with pytest.raises(TypeError):
        lazy_stack([torch.zeros(3), torch.zeros(3)])
    with pytest.raises(ValueError, match="batch_size"):
        LazyStackedTensorDict(stack_dim=0)
    empty = LazyStackedTensorDict(stack_dim=0, batch_size=[0, 5])
    assert empty.batch_size == torch.Size([0, 5]) and list(empty.keys()) == []


# ----------------------------------------------------------------------------- ragged data
def test_ragged_trajectories_get_and_errors():
    trajs = ragged_trajs()
    td = lazy_stack(trajs)
    assert td.batch_size == torch.Size([3])
    assert set(td.keys()) == {"obs", "done"}
    assert "obs" in td
    # equal-shaped leaves stack densely
    assert torch.equal(td.get("done"), torch.tensor([[True], [False], [True]]))
    with pytest.raises(RaggedStackError) as err:
        td.get("obs")
    msg = str(err.value)
    assert "'obs'" in msg and "[5, 3]" in msg and "[7, 3]" in msg and "densify" in msg
    # index one member: its own leaves
    assert td[1] is trajs[1]
    assert td[1]["obs"] is trajs[1]["obs"]
    assert td.get_item_shape("obs") == torch.Size([3, -1, 3])
    assert "LazyStackedTensorDict" in repr(td) and "stack_dim=0" in repr(td)
    assert "-1" in repr(td)


def test_heterogeneous_feature_shapes_with_batch_dims():
    agents = [TensorDict({"obs": torch.randn(4, f), "act": torch.randn(4, 2)}, [4]) for f in (3, 5)]
    td = lazy_stack(agents, 1)
    assert td.batch_size == torch.Size([4, 2])
    assert td.get("act").shape == torch.Size([4, 2, 2])
    assert torch.equal(td.get("act")[:, 1], agents[1]["act"])
    with pytest.raises(RaggedStackError, match="obs"):
        td.get("obs")
    # indexing a non-stack dim keeps the stack lazy, each member indexed
    sub = td[2]
    assert isinstance(sub, LazyStackedTensorDict) and sub.batch_size == torch.Size([2])
    assert torch.equal(sub[1]["obs"], agents[1]["obs"][2])
    assert td[:, 0] is agents[0]
    assert torch.equal(td[1:3, 1]["obs"], agents[1]["obs"][1:3])


def test_heterogeneous_key_sets():
    a = TensorDict({"obs": torch.zeros(2, 3), "only_a": torch.ones(2)}, [2])
    b = TensorDict({"obs": torch.ones(2, 3), "only_b": torch.ones(2, 1)}, [2])
    c = TensorDict({"obs": torch.ones(2, 3), "only_b": torch.ones(2, 1)}, [2])
    td = lazy_stack([a, b, c])
    assert td.keys() == ["obs"]
    assert "only_a" not in td and ("only_b",) not in td
    with pytest.raises(KeyError, match=r"only_b.*members \[0\]"):
        td.get("only_b")
    with pytest.raises(KeyError, match=r"only_a.*members \[1, 2\]"):
        td["only_a"]
    assert td.get("only_a", None) is None
    assert td.exclusive_keys() == [["only_a"], ["only_b"], ["only_b"]]
    assert td[0] is a and "only_a" in td[0]
    assert td[1:].get("only_b").shape == torch.Size([2, 2, 1])
    td.set("new", torch.full((3, 2), 7.0))
    assert all(torch.equal(m["new"], torch.full((2,), 7.0)) for m in (a, b, c))
    # memberwise ops keep the exclusive keys
    cl = td.clone()
    assert "only_a" in cl[0] and "only_b" in cl[2]
    assert torch.equal((td + 1)[0]["only_a"], a["only_a"] + 1)
    assert "exclusive_fields" in repr(td)


# ----------------------------------------------------------------------------- identity / O(1)
def test_int_index_returns_member_identity():
    members = make_members(3, 4)
    td0 = lazy_stack(members, 0)
    for i in range(3):
        assert td0[i] is members[i]
    assert td0[-1] is members[2]
    assert td0[torch.tensor(1)] is members[1]
    assert list(td0) == members and all(x is y for x, y in zip(td0, members))
    assert all(x is y for x, y in zip(td0.unbind(0), members))
    td1 = lazy_stack(members, 1)
    assert td1[:, 2] is members[2]
    assert td1[..., 0] is members[0]
    assert all(x is y for x, y in zip(td1.unbind(1), members))
    with pytest.raises(IndexError):
        td0[3]


def test_stack_dim_index_is_o1_and_get_is_one_stack(monkeypatch):
    members = [TensorDict({"a": torch.full((2,), float(i))}, [2]) for i in range(2000)]
    td = lazy_stack(members)
    assert td[1234] is members[1234]
    calls = []
    real = torch.stack

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "stack", counting)
    out = td.get("a")
    assert len(calls) == 1
    assert out.shape == torch.Size([2000, 2]) and out[1234, 0] == 1234.0


# ----------------------------------------------------------------------------- indexing vs dense
INDEXES = {
    "int": 1,
    "neg_int": -1,
    "slice": slice(0, 2),
    "step": slice(None, None, 2),
    "long": torch.tensor([2, 0, 2]),
    "list": [1, 0],
    "mask0": torch.tensor([True, False, True]),
    "slice_int": (slice(None), 1),
    "int_slice": (1, slice(1, 3)),
    "none": (None, 0),
    "ellipsis": (..., 2),
    "slice_long": (slice(None), torch.tensor([2, 1])),
    "two_longs": (torch.tensor([0, 2]), torch.tensor([1, 2])),
    "mask2d": None,  # filled per test (needs the batch shape)
    "long_long_ragged_dim": (torch.tensor([[0, 1], [2, 0]]),),
}


@pytest.mark.parametrize("sd", [0, 1])
@pytest.mark.parametrize("name", list(INDEXES))
def test_index_matches_dense(sd, name):
    members, lazy, dense = dense_and_lazy(sd, n=3, b=4)
    idx = INDEXES[name]
    if name == "mask2d":
        idx = torch.rand(lazy.batch_size, generator=torch.Generator().manual_seed(1)) > 0.4
    if sd == 1 and name in ("mask0",):
        idx = (slice(None), idx)
    if sd == 1 and name == "long":
        idx = (slice(None), idx)
    assert_same(lazy[idx], dense[idx])


@pytest.mark.parametrize("sd", [0, 1])
def test_index_other_dims_stays_lazy_and_shares(sd):
    members, lazy, dense = dense_and_lazy(sd)
    idx = (slice(None), 1) if sd == 0 else (1,)
    sub = lazy[idx]
    assert isinstance(sub, LazyStackedTensorDict)
    sub.get("a").add_(0)  # a fresh stack: reading is fine
    sub.tensordicts[0].get("a").fill_(-3.0)  # members of the result are views of the members
    row = members[0].get("a")[1]
    assert torch.equal(row, torch.full((3,), -3.0))


# ----------------------------------------------------------------------------- shape ops vs dense
SHAPE_OPS = {
    "reshape_keep": lambda t: t.reshape(t.batch_size[0], t.batch_size[1], 1),
    "reshape_merge": lambda t: t.reshape(-1),
    "flatten": lambda t: t.flatten(0, 1),
    "permute": lambda t: t.permute(1, 0),
    "transpose": lambda t: t.transpose(0, 1),
    "unsqueeze0": lambda t: t.unsqueeze(0),
    "unsqueeze1": lambda t: t.unsqueeze(1),
    "unsqueeze_last": lambda t: t.unsqueeze(-1),
    "unsqueeze_squeeze": lambda t: t.unsqueeze(1).squeeze(1),
    "expand": lambda t: t.unsqueeze(0).expand(2, *t.batch_size),
    "flip0": lambda t: t.flip(0),
    "flip1": lambda t: t.flip(1),
    "roll": lambda t: t.roll(1, 0),
    "narrow": lambda t: t.narrow(1, 1, 2),
    "repeat": lambda t: t.repeat(2, 1),
    "unflatten": lambda t: t.unflatten(1, (1, -1)),
}


@pytest.mark.parametrize("sd", [0, 1])
@pytest.mark.parametrize("op", list(SHAPE_OPS))
def test_shape_ops_match_dense(sd, op):
    _, lazy, dense = dense_and_lazy(sd)
    assert_same(SHAPE_OPS[op](lazy), SHAPE_OPS[op](dense))


@pytest.mark.parametrize("sd", [0, 1])
def test_lazy_shape_ops_stay_lazy(sd):
    members, lazy, _ = dense_and_lazy(sd)
    for out in (lazy.permute(1, 0), lazy.unsqueeze(0), lazy.unsqueeze(2), lazy.transpose(0, 1),
                lazy.unsqueeze(0).expand(5, *lazy.batch_size), lazy.reshape(*lazy.batch_size, 1)):
        assert isinstance(out, LazyStackedTensorDict), out
    perm = lazy.permute(1, 0)
    assert perm.stack_dim == 1 - sd
    # views: writes through the permuted stack reach the members
    perm.tensordicts[0].get("a").fill_(5.0)
    assert torch.equal(members[0]["a"], torch.full((4, 3), 5.0))
    # view keeping the stack dim is a member view; merging it can't be a view
    v = lazy.view(*lazy.batch_size, 1)
    assert isinstance(v, LazyStackedTensorDict)
    with pytest.raises(RuntimeError, match="stack dim"):
        lazy.view(-1)
    # squeezing the stack dim of a one-member stack gives the member itself
    one = lazy_stack([members[0]], sd)
    assert one.squeeze(sd) is members[0]


@pytest.mark.parametrize("sd", [0, 1])
@pytest.mark.parametrize("dim", [0, 1])
def test_unbind_split_chunk_match_dense(sd, dim):
    _, lazy, dense = dense_and_lazy(sd)
    for a, b in zip(lazy.unbind(dim), dense.unbind(dim)):
        assert_same(a, b)
    assert len(lazy.unbind(dim)) == lazy.batch_size[dim]
    for a, b in zip(lazy.split([1, 2] if lazy.batch_size[dim] == 3 else [3, 1], dim),
                    dense.split([1, 2] if dense.batch_size[dim] == 3 else [3, 1], dim)):
        assert_same(a, b)
    for a, b in zip(lazy.chunk(2, dim), dense.chunk(2, dim)):
        assert_same(a, b)
    if dim == sd:
        parts = lazy.split(2, dim)
        assert parts[0].tensordicts[0] is lazy.tensordicts[0]


# ----------------------------------------------------------------------------- leafwise ops
@pytest.mark.parametrize("sd", [0, 1])
def test_leafwise_ops_match_dense(sd):
    _, lazy, dense = dense_and_lazy(sd)
    assert_same(lazy.apply(lambda x: x * 2), dense.apply(lambda x: x * 2))
    assert_same(lazy.to(torch.float64), dense.to(torch.float64))
    assert_same(lazy.to("cpu"), dense.to("cpu"))
    assert_same(lazy.float(), dense.float())
    assert_same(lazy + 1, dense + 1)
    assert_same(lazy * lazy, dense * dense)
    assert_same(lazy * dense, dense * dense)
    assert_same(2 - lazy, 2 - dense)
    assert_same(lazy == dense, dense == dense)
    assert_same(lazy.exclude("b").exp(), dense.exclude("b").exp())
    assert_same(lazy.select("a", ("nested", "x")), dense.select("a", ("nested", "x")))
    assert_same(lazy.exclude("b"), dense.exclude("b"))
    mask = torch.rand(lazy.batch_size, generator=torch.Generator().manual_seed(3)) > 0.5
    assert_same(lazy * mask, dense * mask)
    assert_same(lazy.masked_fill(mask, 0), dense.masked_fill(mask, 0))
    assert_same(torch.where(mask, lazy, dense * 0), torch.where(mask, dense, dense * 0))
    assert_same(torch.zeros_like(lazy), torch.zeros_like(dense))
    assert_same(lazy.cumsum(1 - sd), dense.cumsum(1 - sd))
    assert_same(lazy.cumsum(sd), dense.cumsum(sd))
    assert lazy.allclose(dense) and (lazy == dense).all()
    assert not (lazy != dense).any()


@pytest.mark.parametrize("sd", [0, 1])
def test_clone_is_independent(sd):
    members, lazy, dense = dense_and_lazy(sd)
    cl = lazy.clone()
    assert isinstance(cl, LazyStackedTensorDict) and cl.stack_dim == sd
    assert all(c is not m for c, m in zip(cl.tensordicts, members))
    cl.zero_()
    assert_same(lazy, dense)  # the original is untouched
    assert (cl.get("a") == 0).all()
    sh = lazy.copy()
    sh.tensordicts[0].get("a").fill_(9.0)  # a shallow copy shares the leaves
    assert torch.equal(members[0]["a"], torch.full((4, 3), 9.0))


@pytest.mark.parametrize("sd", [0, 1])
@pytest.mark.parametrize("dim", [None, 0, 1, (0, 1)])
def test_reductions_match_dense(sd, dim):
    _, lazy, dense = dense_and_lazy(sd)
    lf, df = lazy.exclude("b"), dense.exclude("b")
    for name in ("sum", "mean", "amax", "std"):
        a = getattr(lf, name)(dim=dim)
        b = getattr(df, name)(dim=dim)
        assert a.batch_size == b.batch_size
        for k in b.keys(True, True):
            torch.testing.assert_close(a.get(k), b.get(k))
    if dim is not None:
        a = lf.sum(dim=dim, keepdim=True)
        b = df.sum(dim=dim, keepdim=True)
        for k in b.keys(True, True):
            torch.testing.assert_close(a.get(k), b.get(k))
    torch.testing.assert_close(lf.sum(reduce=True), df.sum(reduce=True))
    torch.testing.assert_close(lf.sum(dim=dim, reduce=True), df.sum(dim=dim, reduce=True))
    assert lazy.any() == dense.any() and lazy.all() == dense.all()


def test_reductions_on_ragged():
    trajs = ragged_trajs()
    td = lazy_stack(trajs)
    total = td.sum()  # full reduction of each leaf works without stacking
    assert total["obs"] == sum(t["obs"].sum() for t in trajs)
    assert torch.equal(td.exclude("done").sum(reduce=True),
                       torch.stack([t["obs"].sum() for t in trajs]).sum())
    with pytest.raises(RaggedStackError, match="obs"):
        td.sum(dim=0)
    agents = lazy_stack([TensorDict({"o": torch.ones(4, f)}, [4]) for f in (2, 3)], 1)
    red = agents.sum(dim=0)  # over a member dim: stays lazy
    assert isinstance(red, LazyStackedTensorDict) and red.batch_size == torch.Size([2])
    assert torch.equal(red[1]["o"], torch.full((3,), 4.0))


# ----------------------------------------------------------------------------- writes
SET_INDEXES = {
    "int": lambda bs: 1,
    "slice": lambda bs: slice(1, 3),
    "long": lambda bs: torch.tensor([0, 2]),
    "mask": lambda bs: torch.arange(bs[0]) % 2 == 0,
    "slice_int": lambda bs: (slice(None), 2),
    "int_int": lambda bs: (2, 1),
    "ellipsis": lambda bs: ...,
    "slice_long": lambda bs: (slice(None), torch.tensor([2, 0])),
    "adv_mixed": lambda bs: (torch.tensor([0, 2]), torch.tensor([1, 2])),
    "mask2d": lambda bs: torch.rand(bs, generator=torch.Generator().manual_seed(2)) > 0.5,
}


@pytest.mark.parametrize("sd", [0, 1])
@pytest.mark.parametrize("name", list(SET_INDEXES))
def test_setitem_matches_dense_and_writes_members(name, sd):
    members, lazy, dense = dense_and_lazy(sd)
    idx = SET_INDEXES[name](lazy.batch_size)
    shape = dense[idx].batch_size
    g = torch.Generator().manual_seed(7)
    value = TensorDict({
        "a": torch.randn(*shape, 3, generator=g),
        "b": torch.randint(0, 10, shape, generator=g),
        "nested": TensorDict({"x": torch.randn(*shape, 2, generator=g)}, shape),
    }, shape)
    lazy[idx] = value
    dense[idx] = value
    assert_same(lazy, dense)
    # the writes landed in the member objects
    assert_same(lazy_stack(members, sd), dense)


def test_setitem_scalar_tensor_and_dict():
    members, lazy, dense = dense_and_lazy(0)
    lazy[0] = 0
    dense[0] = 0
    lazy[:, 1] = {"a": torch.ones(3, 3), "b": torch.zeros(3, dtype=torch.long),
                  "nested": {"x": torch.full((3, 2), 2.0)}}
    dense[:, 1] = {"a": torch.ones(3, 3), "b": torch.zeros(3, dtype=torch.long),
                   "nested": {"x": torch.full((3, 2), 2.0)}}
    assert_same(lazy, dense)
    assert (members[0]["a"][[0, 2, 3]] == 0).all() and (members[0]["a"][1] == 1).all()
    assert (members[2]["nested", "x"][1] == 2).all()


def test_set_update_writes_members():
    members, lazy, dense = dense_and_lazy(1)
    new = torch.randn(4, 3, 5)
    lazy.set("c", new)
    for i, m in enumerate(members):
        assert torch.equal(m["c"], new[:, i])
    lazy.set(("nested", "y"), torch.ones(4, 3))
    assert torch.equal(members[2]["nested", "y"], torch.ones(4))
    ptr = members[0]["a"].data_ptr()
    lazy.set("a", torch.zeros(4, 3, 3), inplace=True)
    assert members[0]["a"].data_ptr() == ptr and (members[0]["a"] == 0).all()
    lazy.set_("b", torch.full((4, 3), 3))
    assert (members[1]["b"] == 3).all()
    upd = dense.clone().apply(lambda x: x + 1)
    lazy.update_(upd)
    dense.update_(upd)
    assert_same(lazy.exclude("c", ("nested", "y")), dense)
    lazy.update({"d": torch.arange(12.0).reshape(4, 3)})
    assert torch.equal(members[2]["d"], torch.tensor([2.0, 5.0, 8.0, 11.0]))
    lazy.update(TensorDict({"e": torch.ones(4, 3)}, [4, 3]))
    assert "e" in members[0]
    del lazy["e"]
    assert "e" not in members[0] and "e" not in lazy
    lazy.rename_key_("d", "dd")
    assert "dd" in members[1] and "d" not in members[1]
    lazy.fill_("dd", 1.5)
    assert (members[0]["dd"] == 1.5).all()
    lazy.set_at_("dd", 9.0, (0, 1))
    assert members[1]["dd"][0] == 9.0 and members[0]["dd"][0] == 1.5
    assert lazy.get_at("dd", (0, 1)) == 9.0


def test_no_partial_write_on_bad_set():
    members, lazy, _ = dense_and_lazy(0)
    before = [m.clone() for m in members]
    with pytest.raises(ValueError, match="batch size"):
        lazy.set("a", torch.zeros(3, 5, 3))
    members[2].lock_()
    with pytest.raises(RuntimeError, match="locked"):
        lazy.set("brand_new", torch.zeros(3, 4))
    assert all("brand_new" not in m for m in members)
    with pytest.raises(RuntimeError, match="locked"):
        lazy.update({"brand_new": torch.zeros(3, 4)})
    assert all("brand_new" not in m for m in members)
    members[2].unlock_()
    # a ragged stack: the value fits member 0 but not member 1 -> nothing is written
    trajs = ragged_trajs((2, 3))
    rag = lazy_stack(trajs)
    snapshot = [t.clone() for t in trajs]
    with pytest.raises(ValueError):
        rag[:] = {"obs": torch.ones(2, 2, 3)}
    for t, s in zip(trajs, snapshot):
        assert torch.equal(t["obs"], s["obs"])
    with pytest.raises(ValueError, match="in-place"):
        rag.set("obs", torch.nested.as_nested_tensor([torch.ones(2, 3), torch.ones(2, 3)],
                                                     layout=torch.jagged), inplace=True)
    for t, s in zip(trajs, snapshot):
        assert torch.equal(t["obs"], s["obs"])
    for m, b in zip(members, before):
        assert_same(m, b)


def test_ragged_writes():
    trajs = ragged_trajs((2, 3))
    rag = lazy_stack(trajs)
    rag[1] = {"obs": torch.zeros(3, 3), "done": torch.tensor([True])}
    assert (trajs[1]["obs"] == 0).all() and trajs[1]["done"].item()
    rag.set("obs", torch.nested.as_nested_tensor([torch.ones(2, 3), torch.full((3, 3), 2.0)],
                                                 layout=torch.jagged))
    assert torch.equal(trajs[1]["obs"], torch.full((3, 3), 2.0))
    obs_only = rag.select("obs")
    obs_only += 1
    assert torch.equal(trajs[0]["obs"], torch.full((2, 3), 2.0))
    rag.apply_(lambda x: x * 0)
    assert (trajs[1]["obs"] == 0).all()


def test_insert_append():
    members = make_members(2, 4)
    td = lazy_stack(members)
    extra = make_members(1, 4, seed=5)[0]
    td.append(extra)
    assert td.batch_size == torch.Size([3, 4]) and td[2] is extra
    first = make_members(1, 4, seed=6)[0]
    td.insert(0, first)
    assert td.batch_size == torch.Size([4, 4]) and td[0] is first and td[3] is extra
    with pytest.raises(ValueError, match="batch_size"):
        td.append(TensorDict({"a": torch.zeros(5, 3)}, [5]))
    td.lock_()
    with pytest.raises(RuntimeError, match="locked"):
        td.append(make_members(1, 4)[0])
    assert td.is_locked and all(m.is_locked for m in td.tensordicts)
    td.unlock_()
    assert not td.is_locked


# ----------------------------------------------------------------------------- dense export
def test_densify_and_nested_export():
    trajs = ragged_trajs()
    td = lazy_stack(trajs)
    with pytest.raises(RaggedStackError, match="densify"):
        td.to_tensordict()
    jag = td.densify(layout=torch.jagged)
    assert type(jag) is TensorDict and jag.batch_size == torch.Size([3])
    obs = jag.get("obs")
    assert obs.is_nested and obs.layout == torch.jagged
    for comp, t in zip(obs.unbind(), trajs):
        assert torch.equal(comp, t["obs"])
    assert not jag.get("done").is_nested
    assert torch.equal(jag.get("done"), td.get("done"))
    strided = td.densify(layout=torch.strided)
    assert strided.get("obs").is_nested and strided.get("obs").layout == torch.strided
    nt = td.get_nestedtensor("obs")
    assert nt.is_nested and [c.shape[0] for c in nt.unbind()] == [5, 7, 3]
    # the nested tensor round-trips through set
    td2 = lazy_stack([t.clone() for t in trajs])
    td2.set("obs", nt * 2)
    assert torch.equal(td2[1]["obs"], trajs[1]["obs"] * 2)
    # ragged along a non-leading dim: nested tensors need stack_dim=0
    agents = lazy_stack([TensorDict({"o": torch.zeros(4, f)}, [4]) for f in (2, 3)], 1)
    with pytest.raises(ValueError, match="stack_dim=0"):
        agents.densify(layout=torch.jagged)
    # equal shapes: dense
    _, lazy, dense = dense_and_lazy(1)
    assert_same(lazy.to_tensordict(), dense)
    c = lazy.contiguous()
    assert type(c) is TensorDict and c.get("a").is_contiguous()
    assert_same(c, dense)


# ----------------------------------------------------------------------------- io
@pytest.mark.parametrize("sd", [0, 1])
def test_save_load_round_trip(tmp_path, sd):
    members, lazy, dense = dense_and_lazy(sd)
    save(lazy, tmp_path / "td")
    back = load(tmp_path / "td")
    assert isinstance(back, LazyStackedTensorDict) and back.stack_dim == sd
    assert_same(back, dense)
    back.tensordicts[0].get("a").fill_(0)
    assert not (members[0]["a"] == 0).all()


def test_save_load_ragged_heterogeneous_nested(tmp_path):
    trajs = ragged_trajs()
    trajs[1]["extra"] = torch.ones(1, 2)
    inner = lazy_stack([TensorDict({"p": torch.randn(3, k)}, [3]) for k in (1, 2, 4)], 0)
    root = TensorDict({"agents": inner, "t": torch.arange(3)}, [3])
    for name, td in [("rag", lazy_stack(trajs)), ("nested", root)]:
        save(td, tmp_path / name)
        back = load(tmp_path / name)
        if name == "rag":
            assert isinstance(back, LazyStackedTensorDict)
            for a, b in zip(back.tensordicts, trajs):
                assert sorted(a.keys()) == sorted(b.keys())
                for k in b.keys():
                    assert torch.equal(a[k], b[k])
        else:
            sub = back.get("agents")
            assert isinstance(sub, LazyStackedTensorDict)
            for a, b in zip(sub.tensordicts, inner.tensordicts):
                assert torch.equal(a["p"], b["p"])


def test_pickle_round_trip():
    trajs = ragged_trajs()
    td = lazy_stack(trajs)
    td.lock_()
    back = pickle.loads(pickle.dumps(td))
    assert isinstance(back, LazyStackedTensorDict) and back.is_locked
    assert back.batch_size == td.batch_size and back.stack_dim == 0
    for a, b in zip(back.tensordicts, trajs):
        assert torch.equal(a["obs"], b["obs"])


# ----------------------------------------------------------------------------- stack / cat
def test_stack_dense_vs_lazy():
    members = make_members(2, 4)
    assert type(torch.stack(members)) is TensorDict
    lz = lazy_stack(members)
    assert type(lz) is LazyStackedTensorDict
    mixed = torch.stack([lz, lz.clone()], 0)
    assert isinstance(mixed, LazyStackedTensorDict) and mixed.batch_size == torch.Size([2, 2, 4])
    assert mixed[0] is lz
    assert torch.equal(mixed.get("a")[0], lz.get("a"))
    hetero = [TensorDict({"a": torch.zeros(4)}, [4]), TensorDict({"b": torch.zeros(4)}, [4])]
    from steersman.tensordict import maybe_dense_stack

    assert isinstance(maybe_dense_stack(hetero), LazyStackedTensorDict)


@pytest.mark.parametrize("sd", [0, 1])
def test_cat(sd):
    m1, l1, d1 = dense_and_lazy(sd)
    m2 = make_members(3, 4, seed=9)
    l2 = lazy_stack(m2, sd)
    d2 = torch.stack([m.clone() for m in m2], sd)
    for dim in (0, 1):
        out = torch.cat([l1, l2], dim)
        assert isinstance(out, LazyStackedTensorDict)
        assert_same(out, torch.cat([d1, d2], dim))
        assert_same(torch.cat([l1, d2], dim), torch.cat([d1, d2], dim))
    ext = lazy_cat([l1, l2], sd)
    assert ext.tensordicts[:3] == m1 and all(a is b for a, b in zip(ext.tensordicts[3:], m2))


# ----------------------------------------------------------------------------- nested lazies
def test_lazy_inside_dense_container():
    agents = [TensorDict({"obs": torch.randn(4, f), "r": torch.zeros(4, 1)}, [4]) for f in (2, 3)]
    inner = lazy_stack(agents, 1)
    root = TensorDict({"agents": inner, "t": torch.arange(4.0)}, [4])
    assert root.get("agents") is inner
    assert torch.equal(root.get(("agents", "r")), torch.zeros(4, 2, 1))
    with pytest.raises(RaggedStackError):
        root.get(("agents", "obs"))
    assert set(root.keys(True, True)) == {"t", ("agents", "obs"), ("agents", "r")}
    sub = root[1]
    assert torch.equal(sub["agents"][1]["obs"], agents[1]["obs"][1])
    # in-place ops on the parent reach the members
    root += 1
    assert torch.equal(agents[0]["r"], torch.ones(4, 1))
    root[2] = 0
    assert (agents[1]["obs"][2] == 0).all() and (agents[0]["r"][2] == 0).all()
    root[0:2] = TensorDict({"agents": {"r": torch.full((2, 2, 1), 5.0)}, "t": torch.zeros(2)}, [2])
    assert torch.equal(agents[1]["r"][:2], torch.full((2, 1), 5.0))
    cl = root.clone()
    assert isinstance(cl.get("agents"), LazyStackedTensorDict)
    assert root.apply(lambda x: x * 0).get(("agents", "r")).sum() == 0
    per_t = root.unbind(0)
    assert len(per_t) == 4 and isinstance(per_t[0].get("agents"), LazyStackedTensorDict)
    stacked = torch.stack([root, root.clone()], 0)
    assert isinstance(stacked.get("agents"), LazyStackedTensorDict)
    assert stacked.get("agents").batch_size == torch.Size([2, 4, 2])
    assert root.reshape(2, 2).get("agents").batch_size == torch.Size([2, 2, 2])


def test_lazy_of_lazies():
    inner = [lazy_stack(make_members(2, 3, seed=s), 0) for s in range(3)]
    outer = lazy_stack(inner, 1)
    assert outer.batch_size == torch.Size([2, 3, 3])
    dense = torch.stack([i.to_tensordict() for i in inner], 1)
    assert_same(outer, dense)
    assert outer[:, 2] is inner[2]
    assert_same(outer[1], dense[1])
    assert_same(outer.permute(2, 0, 1), dense.permute(2, 0, 1))
    assert_same(outer.sum(dim=2), dense.sum(dim=2))
    outer[0, 1] = 0
    assert (inner[1].tensordicts[0]["a"] == 0).all()
    assert not (inner[1].tensordicts[1]["a"] == 0).all()


# ----------------------------------------------------------------------------- ragged index-moving ops
def test_ragged_index_moving_ops_gather_members():
    agents = [TensorDict({"obs": torch.arange(4.0 * f).reshape(4, f) + 100 * f}, [4]) for f in (2, 3, 5)]
    td = lazy_stack(agents, 0)  # batch [3, 4]
    rolled = td.roll(1, 0)
    assert isinstance(rolled, LazyStackedTensorDict)
    assert torch.equal(rolled[0]["obs"], agents[2]["obs"])
    flat = td.reshape(-1)  # merges the stack dim: one element per batch entry
    assert flat.batch_size == torch.Size([12])
    assert torch.equal(flat[5]["obs"], agents[1]["obs"][1])
    picked = td[torch.tensor([0, 2]), torch.tensor([3, 1])]
    assert picked.batch_size == torch.Size([2])
    assert torch.equal(picked[1]["obs"], agents[2]["obs"][1])
    narrowed = td.narrow(1, 1, 2)
    assert torch.equal(narrowed[2]["obs"], agents[2]["obs"][1:3])
    with pytest.raises(RuntimeError, match="new batch elements"):
        from steersman.tensordict import pad

        pad(td, [0, 1])


def test_names_and_memory():
    members, lazy, dense = dense_and_lazy(1)
    lazy.names = ["time", "agent"]
    assert lazy.names == ["time", "agent"]
    assert members[0].names == ["time"]
    assert lazy.permute(1, 0).names == ["agent", "time"]
    assert lazy.get("nested").names[:2] == ["time", "agent"]
    with pytest.raises(ValueError):
        lazy.names = ["x"]
    lazy.names = None
    assert lazy.names == [None, None]
    assert lazy.bytes() == dense.bytes()
    lazy.memmap_()  # in place: every member leaf becomes memory-mapped
    assert lazy.is_memmap() and lazy.is_locked
    lazy[0] = 0
    assert (members[1]["a"][0] == 0).all()
    other = lazy_stack(make_members(2, 4), 0).share_memory_()
    assert other.is_shared() and other.is_locked


@pytest.mark.parametrize("stack_dim", [0, 1])
@pytest.mark.parametrize("index", [
    True, False, (slice(None), True), (torch.tensor(True), 1), (1, torch.tensor(False)),
    (None, torch.tensor([0, 2])), (torch.tensor(1),), (slice(None), None, torch.tensor([[0, 1]])),
    (torch.tensor([0, 1]), torch.tensor([1, 0])),
])
def test_zero_dim_and_mixed_indices_match_dense(stack_dim, index):
    """A Python bool is a 0-dim mask (it adds a dim), not the int 1 (it picked member 1)."""
    lazy = lazy_stack([TensorDict({"a": torch.randn(4, 2) + i}, [4]) for i in range(3)], stack_dim)
    dense = lazy.to_tensordict()
    out, expected = lazy[index], dense[index]
    assert out.batch_size == expected.batch_size
    assert torch.equal(out["a"], expected["a"])
