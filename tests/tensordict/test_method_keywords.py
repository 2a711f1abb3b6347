"""tensordict's documented keywords on TensorDict methods and ``pad``: each keyword's effect.

Every check compares with a value computed by hand or with plain torch on the leaves, on a
plain TensorDict, a lazy stack and (where the method applies) a tensorclass.
"""

from __future__ import annotations

import pytest
import torch

from steersman.tensordict import LazyStackedTensorDict, TensorDict, lazy_stack, pad, tensorclass


def pair():
    a = TensorDict(x=torch.tensor([1.0, 2.0]), n={"y": torch.tensor([3.0, 4.0])}, batch_size=[2])
    b = TensorDict(x=torch.tensor([5.0, 6.0]), z=torch.tensor([7.0, 8.0]), batch_size=[2])
    return a, b


def as_lazy(td):
    return lazy_stack(list(td.unbind(0)), 0)


BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
    "maximum": torch.maximum, "minimum": torch.minimum, "clamp_min": torch.clamp_min,
    "clamp_max": torch.clamp_max, "logical_and": torch.logical_and,
}


@pytest.mark.parametrize("lazy", [False, True], ids=["dense", "lazy"])
def test_binary_default(lazy):
    a, b = pair()
    if lazy:
        a = as_lazy(a)
    d = torch.tensor(0.5)
    for name, fn in BINARY.items():
        inter = getattr(a, name)(b, default="intersection")
        assert set(inter.keys(True, True)) == {"x"}, name
        torch.testing.assert_close(inter["x"], fn(a["x"], b["x"]))
        union = getattr(a, name)(b, default=d)
        assert set(union.keys(True, True)) == {"x", ("n", "y"), "z"}, name
        torch.testing.assert_close(union["n", "y"], fn(a["n", "y"], d))  # default on the right
        torch.testing.assert_close(union["z"], fn(d, b["z"]))  # ... and on the left
        with pytest.raises(KeyError):  # default=None: the keys must match
            getattr(a, name)(b)
    with pytest.raises(TypeError, match="default must be"):
        a.add(b, default=0.5)
    # a number or a tensor ignores default, as before
    assert a.add(1, default="intersection")["x"].tolist() == [2.0, 3.0]
    assert a.clamp_max(other=1.5)["x"].tolist() == [1.0, 1.5] and a.clamp_min(min=1.5)["x"].tolist() == [1.5, 2.0]


CASTS = {"float": torch.float32, "double": torch.float64, "half": torch.float16,
         "bfloat16": torch.bfloat16, "int": torch.int32, "bool": torch.bool}


def test_cast_filter_and_type():
    td = TensorDict(a=torch.ones(2, dtype=torch.int64), n={"b": torch.ones(2, dtype=torch.int64)}, batch_size=[2])
    seen = []

    def only_nested(key, value):
        seen.append(key)
        return key == ("n", "b")

    for name, dtype in CASTS.items():
        out = getattr(td, name)(cast_filter=only_nested)
        assert out["n", "b"].dtype == dtype and out["a"].dtype == torch.int64, name
        assert getattr(td, name)()["a"].dtype == dtype
    assert set(seen) == {"a", ("n", "b")}
    assert td.type(dst_type="torch.DoubleTensor")["a"].dtype == torch.float64
    assert td.type(torch.int8, cast_filter=lambda k, v: k == "a")["n", "b"].dtype == torch.int64
    with pytest.raises(ValueError, match="not a dtype or a tensor type name"):
        td.type("torch.NoSuchTensor")


def test_reduction_keywords():
    td = TensorDict(a=torch.tensor([[1, 5], [7, 2]], dtype=torch.int32), batch_size=[2, 2])
    assert td.nansum(dtype=torch.float64)["a"].dtype == torch.float64
    assert td.nanmean(0, dtype=torch.float64)["a"].tolist() == [4.0, 3.5]
    assert td.prod(1, dtype=torch.int64)["a"].tolist() == [5, 14]
    values, indices = td.max(1)
    assert values["a"].tolist() == [5, 7] and indices["a"].tolist() == [1, 0]
    assert td.min(0).indices["a"].tolist() == [0, 1]
    assert td.max(1, return_indices=False)["a"].tolist() == [5, 7]
    f = td.float()
    f["n"] = TensorDict(b=torch.ones(2, 2), batch_size=[2, 2])
    for name in ("sum", "mean", "std", "var", "norm"):
        out = getattr(f, name)(0, key_transform=lambda k, name=name: f"{name}_{k}")
        assert set(out.keys(True, True)) == {f"{name}_a", (f"{name}_n", f"{name}_b")}, name
        torch.testing.assert_close(out[f"{name}_a"], getattr(f, name)(0)["a"])
    assert isinstance(f.sum(reduce=True, key_transform=str.upper), torch.Tensor)


@pytest.mark.parametrize("lazy", [False, True], ids=["dense", "lazy"])
def test_update_keywords(lazy):
    base = TensorDict(x=torch.zeros(2), y=torch.zeros(2), batch_size=[2])
    td = as_lazy(base) if lazy else base
    src = TensorDict(x=torch.ones(2), y=torch.full((2,), 2.0), batch_size=[2])
    td.update_(src, keys_to_update=["y"], non_blocking=True)
    assert td["x"].tolist() == [0, 0] and td["y"].tolist() == [2, 2]
    td.update_at_(TensorDict(x=torch.tensor(3.0), y=torch.tensor(4.0)), 1, keys_to_update=["x"])
    assert td["x"].tolist() == [0, 3] and td["y"].tolist() == [2, 2]
    row = TensorDict(x=torch.tensor(9.0), y=torch.tensor(9.0))
    td.update_at_(row, 0, clone=True, non_blocking=True)
    row["x"].fill_(-1)  # a clone was written: the container does not alias row
    assert td["x"].tolist() == [9, 3]
    td.set_("x", torch.tensor([5.0, 6.0]), non_blocking=True)
    td.set_at_("y", torch.tensor(8.0), 1, non_blocking=True)
    assert td["x"].tolist() == [5, 6] and td["y"].tolist() == [9, 8]


def test_setdefault_select_empty_names():
    td = TensorDict(x=torch.zeros(2), batch_size=[2])
    existing = td["x"]
    assert td.setdefault("x", torch.ones(2), inplace=True) is existing
    got = td.setdefault("new", torch.ones(2), inplace=True)
    assert got.tolist() == [1, 1]
    assert td.empty(names=["time"]).names == ["time"]
    lz = as_lazy(TensorDict(x=torch.zeros(2, 3), batch_size=[2, 3]))
    assert lz.empty(names=["agent", "time"]).names == ["agent", "time"]

    @tensorclass
    class Pair:
        a: torch.Tensor
        b: torch.Tensor

    p = Pair(a=torch.zeros(2), b=torch.ones(2), batch_size=[2])
    sel = p.select("a", as_tensordict=True)
    assert type(sel) is TensorDict and list(sel.keys()) == ["a"]
    assert type(p.select("a")) is Pair and p.select("a").b is None
    assert type(td.select("x", as_tensordict=True)) is TensorDict


def test_to_dict_keywords():
    td = TensorDict(a=torch.zeros(2), n={"b": torch.arange(2)}, batch_size=[2])
    assert td.to_dict(tolist_first=True)["n"] == [{"b": 0}, {"b": 1}]
    assert isinstance(td.to_dict()["n"]["b"], torch.Tensor)

    @tensorclass
    class Opt:
        a: torch.Tensor
        b: torch.Tensor | None = None

    o = Opt(a=torch.zeros(2), batch_size=[2])
    assert "b" in o.to_dict() and o.to_dict()["b"] is None
    assert "b" not in o.to_dict(retain_none=False)


def test_auto_batch_size_keep_compliant_size():
    def make():
        n = TensorDict(b=torch.zeros(2, 3, 4), batch_size=[2, 3, 4])
        return TensorDict({"a": torch.zeros(2, 3, 4), "n": n})

    assert make().auto_batch_size_()["n"].batch_size == (2, 3, 4)
    assert make().auto_batch_size_(batch_dims=2)["n"].batch_size == (2, 3)
    assert make().auto_batch_size_(batch_dims=2, keep_compliant_size=True)["n"].batch_size == (2, 3, 4)
    assert make().auto_batch_size_(batch_dims=1, keep_compliant_size=True).batch_size == (2,)


def test_pad_first_dim_first_inplace_safe():
    td = TensorDict(a=torch.ones(3, 4, 1), batch_size=[3, 4])
    out = pad(td, [0, 1, 0, 2])
    assert out.batch_size == (4, 6)  # pairs start from the first batch dim (tensordict's order)
    exp = torch.nn.functional.pad(torch.ones(3, 4, 1), [0, 0, 0, 2, 0, 1])
    assert torch.equal(out["a"], exp)
    same = pad(td, [1, 0], value=5.0, inplace=True, safe=False)
    assert same is td and td.batch_size == (4, 4) and td["a"][0].eq(5).all() and td["a"][1:].eq(1).all()
    with pytest.raises(ValueError, match="even length"):
        pad(td, [1, 2, 3], inplace=True)
    assert td.batch_size == (4, 4)  # a refused pad leaves it as it was
    lz = as_lazy(TensorDict(a=torch.ones(2, 3), batch_size=[2, 3]))
    assert isinstance(lz, LazyStackedTensorDict)
    with pytest.raises(NotImplementedError, match="to_tensordict"):
        pad(lz, [0, 1], inplace=True)

    @tensorclass
    class P:
        a: torch.Tensor

    p = P(a=torch.zeros(2), batch_size=[2])
    assert pad(p, [0, 1], inplace=True) is p and p.batch_size == (3,) and p.a.shape == (3,)


INPLACE = {
    "flatten": lambda td, **kw: td.flatten(0, 1, **kw),
    "unflatten": lambda td, **kw: td.unflatten(1, unflattened_size=(2, 2), **kw),
    "repeat": lambda td, **kw: td.repeat(2, 1, **kw),
    "repeat_interleave": lambda td, **kw: td.repeat_interleave(2, dim=1, output_size=8, **kw),
    "roll": lambda td, **kw: td.roll(1, 0, **kw),
    "masked_select": lambda td, **kw: td.masked_select(torch.tensor([True, False, True]), **kw),
    "gather": lambda td, **kw: td.gather(1, torch.tensor([[0, 3], [1, 1], [2, 0]]), **kw),
}


@pytest.mark.parametrize("name", list(INPLACE))
def test_shape_ops_inplace(name):
    td = TensorDict(a=torch.arange(12.0).reshape(3, 4), n={"b": torch.arange(24).reshape(3, 4, 2)}, batch_size=[3, 4])
    want = INPLACE[name](td.clone())
    got = INPLACE[name](td, inplace=True)
    assert got is td and td.batch_size == want.batch_size
    assert torch.equal(td["a"], want["a"]) and torch.equal(td["n", "b"], want["n", "b"])
    lz = as_lazy(TensorDict(a=torch.zeros(3, 4), batch_size=[3, 4]))
    with pytest.raises(NotImplementedError, match="to_tensordict"):
        INPLACE[name](lz, inplace=True)


def test_gather_out():
    td = TensorDict(a=torch.arange(6.0).reshape(2, 3), batch_size=[2, 3])
    out = TensorDict(a=torch.zeros(2, 2), batch_size=[2, 2])
    idx = torch.tensor([[2, 0], [1, 1]])
    assert td.gather(1, idx, out=out) is out and out["a"].tolist() == [[2, 0], [4, 4]]


def test_pad_sequence_pads_the_named_dim_of_a_2d_batch():
    from steersman.tensordict import pad_sequence

    a = TensorDict(x=torch.ones(2, 3), batch_size=[2, 3])
    b = TensorDict(x=torch.ones(2, 5), batch_size=[2, 5])
    out = pad_sequence([a, b], pad_dim=1, return_mask=True)
    assert out.batch_size == (2, 2, 5) and out["x"][0, :, 3:].eq(0).all() and out["masks"][0].sum() == 6
