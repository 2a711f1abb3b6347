"""Tests for ``@tensorclass``: dataclasses backed by a TensorDict."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import pickle
from typing import Optional

import numpy as np
import pytest
import torch

from steersman.tensordict import (
    NonTensorData,
    TensorDict,
    TensorDictBase,
    from_dataclass,
    is_tensor_collection,
    is_tensorclass,
    tensorclass,
)
from steersman.tensordict.functional import cat, stack


# ----------------------------------------------------------------------------- classes
@tensorclass
class Inner:
    y: torch.Tensor


@tensorclass
class Data:
    obs: torch.Tensor
    reward: torch.Tensor
    inner: Inner
    label: str = "hello"

    def total_reward(self) -> torch.Tensor:
        return self.reward.sum()

    @property
    def n_obs(self) -> int:
        return self.obs.shape[-1]

    @classmethod
    def zeros(cls, n: int) -> Data:
        return cls(obs=torch.zeros(n, 3), reward=torch.zeros(n),
                   inner=Inner(y=torch.zeros(n, 2), batch_size=[n]), batch_size=[n])


@tensorclass
class Other:
    obs: torch.Tensor
    reward: torch.Tensor
    inner: Inner
    label: str = "hello"


@tensorclass
class WithDefaults:
    a: torch.Tensor
    b: torch.Tensor | None = None
    c: torch.Tensor = dataclasses.field(default_factory=lambda: torch.ones(2))
    tag: str = "x"


@tensorclass
class Simple:
    x: torch.Tensor
    y: torch.Tensor


@tensorclass(autocast=True)
class Casted:
    x: torch.Tensor
    n: int
    f: float
    inner: Inner
    s: str = "a"


@tensorclass(autocast=True)
class OptCast:
    x: torch.Tensor | None = None
    label: Optional[str] = None  # noqa: UP045 - the typing spelling must resolve too


@tensorclass(nocast=True)
class NoCast:
    x: torch.Tensor
    n: int


@tensorclass(frozen=True)
class Frozen:
    x: torch.Tensor


@tensorclass
class Child(Simple):
    z: torch.Tensor


@tensorclass
class PostInit:
    x: torch.Tensor
    doubled: torch.Tensor

    def __post_init__(self) -> None:
        if self.doubled is None and self.x is not None:
            self.doubled = self.x * 2


@tensorclass
class CustomRepr:
    x: torch.Tensor

    def __repr__(self) -> str:
        return "custom!"


@dataclasses.dataclass
class PlainPoint:
    xy: torch.Tensor
    label: str = "p"

    def norm(self) -> torch.Tensor:
        return self.xy.norm(dim=-1)


@dataclasses.dataclass
class PlainPair:
    first: PlainPoint
    weight: torch.Tensor


def make_data(n: int = 4, seed: int = 0) -> Data:
    g = torch.Generator().manual_seed(seed)
    return Data(
        obs=torch.randn(n, 3, generator=g),
        reward=torch.randn(n, generator=g),
        inner=Inner(y=torch.randn(n, 2, generator=g), batch_size=[n]),
        batch_size=[n],
    )


def assert_same_content(tc: Data, td: TensorDictBase) -> None:
    """``tc`` (a tensorclass result) holds the same leaves and batch size as ``td``."""
    assert tc.batch_size == td.batch_size
    keys = sorted(td.keys(True, True), key=str)
    assert sorted(tc.keys(True, True), key=str) == keys
    for k in keys:
        a, b = tc.get(k), td.get(k)
        if isinstance(b, torch.Tensor):
            assert isinstance(a, torch.Tensor), k
            assert a.shape == b.shape and a.dtype == b.dtype, k
            torch.testing.assert_close(a, b, msg=lambda m, k=k: f"{k}: {m}")


# ----------------------------------------------------------------------------- construction
def test_construction_kwargs_and_types():
    d = make_data()
    assert is_tensorclass(d) and is_tensorclass(Data)
    assert not is_tensorclass(TensorDict()) and not is_tensorclass(torch.zeros(1))
    assert is_tensor_collection(d)
    assert d.batch_size == torch.Size([4]) and d.shape == torch.Size([4])
    assert isinstance(d._tensordict, TensorDict)
    assert type(d.inner) is Inner and d.inner.y.shape == (4, 2)
    assert d.label == "hello"
    assert len(d) == 4
    assert d.device is None


def test_positional_args_and_defaults():
    w = WithDefaults(torch.zeros(2, 3), batch_size=[2])
    assert w.b is None
    assert torch.equal(w.c, torch.ones(2))
    assert w.tag == "x"
    w2 = WithDefaults(torch.zeros(2), torch.ones(2), batch_size=[2])
    assert torch.equal(w2.b, torch.ones(2))
    # default_factory gives a fresh value per instance
    assert w.c is not WithDefaults(torch.zeros(2), batch_size=[2]).c
    assert [f.name for f in dataclasses.fields(WithDefaults)] == ["a", "b", "c", "tag"]


def test_missing_fields_are_none_and_not_keys():
    s = Simple(x=torch.zeros(3), batch_size=[3])
    assert s.y is None
    assert s.get("y") is None
    assert list(s.keys()) == ["x"]


def test_constructor_errors():
    with pytest.raises(TypeError, match="unexpected keyword argument 'q'"):
        Simple(x=torch.zeros(3), q=1, batch_size=[3])
    with pytest.raises(TypeError, match="positional"):
        Simple(torch.zeros(3), torch.zeros(3), torch.zeros(3), batch_size=[3])
    with pytest.raises(TypeError, match="multiple values"):
        Simple(torch.zeros(3), x=torch.zeros(3), batch_size=[3])
    with pytest.raises(ValueError, match="'x'"):
        Simple(x=torch.zeros(4), batch_size=[3])


def test_device_and_names():
    s = Simple(x=torch.zeros(2, 3), y=torch.zeros(2, 3), batch_size=[2, 3], device="cpu",
               names=["env", "time"])
    assert s.device == torch.device("cpu")
    assert s.names == ["env", "time"]
    assert s.x.device.type == "cpu"
    s.names = ["a", "b"]
    assert s._tensordict.names == ["a", "b"]


def test_reserved_and_shadowing_field_names():
    with pytest.raises(AttributeError, match="batch_size"):
        @tensorclass
        class Bad:  # noqa: F841
            batch_size: torch.Tensor

    with pytest.raises(AttributeError, match="shadow"):
        @tensorclass
        class Bad2:  # noqa: F841
            values: torch.Tensor

    @tensorclass(shadow=True)
    class Ok:
        values: torch.Tensor

    assert torch.equal(Ok(values=torch.ones(2), batch_size=[2]).values, torch.ones(2))


def test_autocast_and_nocast_flags():
    with pytest.raises(ValueError):
        tensorclass(autocast=True, nocast=True)(type("X", (), {"__annotations__": {"a": "int"}}))
    c = Casted(x=[1.0, 2.0], n=3.7, f=2, inner={"y": torch.zeros(2)}, batch_size=[2])
    assert isinstance(c.x, torch.Tensor) and c.x.tolist() == [1.0, 2.0]
    assert c.n == 3 and type(c.n) is int
    assert c.f == 2.0 and type(c.f) is float
    assert type(c.inner) is Inner and c.inner.batch_size == torch.Size([2])
    c.x = np.arange(2)
    assert isinstance(c.x, torch.Tensor)
    o = OptCast(x=[1, 2], label=3, batch_size=[2])
    assert isinstance(o.x, torch.Tensor) and o.label == "3"
    assert OptCast(batch_size=[]).x is None
    n = NoCast(x=torch.zeros(2), n=5, batch_size=[2])
    assert n.n == 5 and type(n.n) is int
    arr = np.zeros(3)
    n.n = arr
    assert n.n is arr
    # default: numbers become tensors, like in a TensorDict
    s = Simple(x=1.5, batch_size=[])
    assert isinstance(s.x, torch.Tensor) and s.x.item() == 1.5


def test_frozen():
    f = Frozen(x=torch.zeros(3), batch_size=[3])
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.x = torch.ones(3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.set("x", torch.ones(3))
    assert f.is_locked
    assert torch.equal(f.x, torch.zeros(3))


# ----------------------------------------------------------------------------- attributes
def test_attribute_get_set_goes_to_tensordict():
    d = make_data()
    new = torch.full((4, 3), 7.0)
    d.obs = new
    assert d._tensordict.get("obs") is new
    assert d.obs is new
    d.set("reward", torch.ones(4))
    assert torch.equal(d._tensordict["reward"], torch.ones(4))
    assert torch.equal(d.get(("inner", "y")), d.inner.y)
    # like tensordict's tensorclass: indexing is over the batch only, never by key
    with pytest.raises(ValueError, match="batch"):
        d["obs"]
    with pytest.raises(ValueError, match="batch"):
        d["reward"] = torch.zeros(4)
    with pytest.raises(ValueError):
        d["inner", "y"]
    with pytest.raises(TypeError):
        del d["reward"]


def test_setting_wrong_batch_size_names_the_field():
    d = make_data()
    with pytest.raises(ValueError, match="obs") as err:
        d.obs = torch.zeros(5, 3)
    assert "Data" in str(err.value)
    assert d.obs.shape == (4, 3)  # unchanged


def test_unknown_attribute_raises():
    d = make_data()
    with pytest.raises(AttributeError, match="no field"):
        d.obz = torch.zeros(4)
    with pytest.raises(AttributeError, match="obz"):
        _ = d.obz
    with pytest.raises(AttributeError, match="obz"):
        d.set("obz", torch.zeros(4))
    with pytest.raises(AttributeError, match="a2"):
        d.rename_key_("obs", "a2")
    d.lock_()
    with pytest.raises(RuntimeError, match="locked"):
        d.set("obz", torch.zeros(4))
    d.set("obs", torch.ones(4, 3))  # in-place writes into a locked instance are fine
    assert (d.obs == 1).all()
    d._private_cache = 3  # private attributes are plain attributes
    assert d._private_cache == 3


def test_set_none_removes_field():
    d = make_data()
    d.reward = None
    assert d.reward is None and "reward" not in d.keys()
    d.reward = torch.ones(4)
    assert "reward" in d.keys()
    del d.reward
    assert d.reward is None


def test_batch_size_settable_and_validated():
    s = Simple(x=torch.zeros(2, 3), y=torch.zeros(2, 3, 4), batch_size=[2])
    s.batch_size = [2, 3]
    assert s.batch_size == torch.Size([2, 3]) and s._tensordict.batch_size == torch.Size([2, 3])
    with pytest.raises(ValueError):
        s.batch_size = [2, 5]


def test_attribute_access_reads_the_dict_directly():
    """Fields are plain properties over the TensorDict's dict (no __getattr__ detour).

    Speed itself is measured in benchmarks, not timed in tests.
    """
    d = make_data()
    prop = inspect.getattr_static(type(d), "obs")
    assert isinstance(prop, property)
    assert d.obs is d._tensordict._tensordict["obs"]


# ----------------------------------------------------------------------------- non-tensor fields
def test_non_tensor_field_roundtrip():
    d = make_data()
    assert isinstance(d._tensordict.get("label"), NonTensorData)
    assert d.label == "hello"
    d.label = "world"
    assert d.label == "world"
    assert d[0].label == "world"
    assert d[1:3].label == "world"
    obj = frozenset({"some", "object"})
    d.label = obj
    assert d.label is obj
    d.label = {"k": torch.zeros(4)}  # a dict becomes a TensorDict, as in a TensorDict
    assert type(d.label) is TensorDict and d.label.batch_size == torch.Size([4])


def test_non_tensor_field_after_stack():
    a, b = make_data(2), make_data(2)
    b.label = "other"
    s = torch.stack([a, b])
    assert s.label == [["hello", "hello"], ["other", "other"]]
    assert s[1, 0].label == "other"


# ----------------------------------------------------------------------------- nesting
def test_nested_tensorclass_and_tensordict_fields():
    d = make_data()
    assert type(d[0].inner) is Inner
    assert d.get(("inner", "y")).shape == (4, 2)
    assert ("inner", "y") in d.keys(True, True)
    d.inner.y = torch.ones(4, 2)
    assert torch.equal(d._tensordict["inner"]._tensordict["y"], torch.ones(4, 2))

    @tensorclass
    class HoldsTD:
        child: TensorDict
        x: torch.Tensor

    h = HoldsTD(child={"a": torch.zeros(3, 2)}, x=torch.zeros(3), batch_size=[3])
    assert type(h.child) is TensorDict and h.child.batch_size == torch.Size([3])
    assert h[1:].child["a"].shape == (2, 2)


def test_local_class_annotation_resolution():
    @tensorclass
    class LocalInner:
        v: torch.Tensor

    @tensorclass(autocast=True)
    class LocalOuter:
        inner: LocalInner
        w: torch.Tensor

    o = LocalOuter(inner={"v": torch.zeros(2)}, w=[1, 2], batch_size=[2])
    assert type(o.inner) is LocalInner
    assert isinstance(o.w, torch.Tensor)


def test_nested_key_set_creates_annotated_class():
    d = Data(obs=torch.zeros(2, 3), reward=torch.zeros(2), batch_size=[2])
    d.set(("inner", "y"), torch.ones(2, 5))
    assert type(d.inner) is Inner and d.inner.y.shape == (2, 5)


# ----------------------------------------------------------------------------- shape ops
SHAPE_OPS = {
    "int": lambda t: t[1],
    "neg_int": lambda t: t[-1],
    "slice": lambda t: t[1:3],
    "step": lambda t: t[::2],
    "mask": lambda t: t[torch.tensor([True, False, True, True])],
    "long": lambda t: t[torch.tensor([3, 0, 0])],
    "list": lambda t: t[[1, 2]],
    "none": lambda t: t[None],
    "ellipsis": lambda t: t[..., 0],
    "tuple": lambda t: t[1:, 0],
    "reshape": lambda t: t.reshape(2, 2, -1),
    "view": lambda t: t.view(-1, 2),
    "permute": lambda t: t.permute(1, 0),
    "transpose": lambda t: t.transpose(0, 1),
    "unsqueeze": lambda t: t.unsqueeze(1),
    "squeeze": lambda t: t[:, :1].squeeze(1),
    "expand": lambda t: t.expand(5, 4, 2),
    "flatten": lambda t: t.flatten(),
    "unflatten": lambda t: t.unflatten(0, (2, 2)),
    "flip": lambda t: t.flip(0),
    "repeat": lambda t: t.repeat(2, 1),
    "narrow": lambda t: t.narrow(0, 1, 2),
    "to_dtype": lambda t: t.to(torch.float64),
    "to_cpu": lambda t: t.to("cpu"),
    "cpu": lambda t: t.cpu(),
    "clone": lambda t: t.clone(),
    "detach": lambda t: t.detach(),
    "contiguous": lambda t: t.contiguous(),
    "apply": lambda t: t.apply(lambda x: x * 2 + 1),
    "named_apply": lambda t: t.named_apply(lambda k, x: x + len(k)),
    "apply_batch_size": lambda t: t.apply(lambda x: x[0], batch_size=[2]),
    "sum_dim": lambda t: t.sum(dim=0),
    "mean": lambda t: t.float().mean(dim=1),
    "zeros_like": lambda t: torch.zeros_like(t),
    "torch_clone": lambda t: torch.clone(t),
    "masked_fill": lambda t: t.masked_fill(torch.zeros(4, 2, dtype=torch.bool).index_fill_(0, torch.tensor([1]), True), 0),
    "select": lambda t: t.select("obs"),
    "exclude": lambda t: t.exclude("reward"),
    "empty_recurse": lambda t: t.empty(recurse=True),
    "copy": lambda t: t.copy(),
}


def _make_2d() -> Data:
    g = torch.Generator().manual_seed(3)
    return Data(obs=torch.randn(4, 2, 3, generator=g), reward=torch.randn(4, 2, generator=g),
                inner=Inner(y=torch.randn(4, 2, 5, generator=g), batch_size=[4, 2]),
                label="lbl", batch_size=[4, 2])


@pytest.mark.parametrize("name", list(SHAPE_OPS))
def test_shape_ops_match_tensordict(name):
    op = SHAPE_OPS[name]
    tc = _make_2d()
    out = op(tc)
    ref = op(tc._tensordict)
    assert type(out) is Data, f"{name} returned {type(out).__name__}"
    assert_same_content(out, ref)
    if "inner" in ref.keys():
        assert type(out.inner) is Inner
        assert out.inner.batch_size == ref["inner"].batch_size
    if "label" in ref.keys():
        assert out.label == "lbl"


def test_unbind_split_chunk_iter():
    tc = _make_2d()
    parts = tc.unbind(0)
    refs = tc._tensordict.unbind(0)
    assert len(parts) == 4 and all(type(p) is Data for p in parts)
    for p, r in zip(parts, refs):
        assert_same_content(p, r)
    parts1 = tc.unbind(1)
    assert parts1[1].batch_size == torch.Size([4])
    assert torch.equal(parts1[1].obs, tc.obs[:, 1])
    sp = tc.split([1, 3])
    assert [type(p) for p in sp] == [Data, Data] and sp[1].batch_size == torch.Size([3, 2])
    assert torch.equal(sp[1].inner.y, tc.inner.y[1:])
    ch = tc.chunk(2, dim=0)
    assert len(ch) == 2 and type(ch[0].inner) is Inner
    items = list(tc)
    assert len(items) == 4 and type(items[2]) is Data
    assert torch.equal(items[2].obs, tc.obs[2])
    assert [type(x) for x in torch.unbind(tc, 0)] == [Data] * 4


def test_views_share_storage():
    tc = _make_2d()
    v = tc[1:3]
    v.obs.zero_()
    assert (tc.obs[1:3] == 0).all()
    p = tc.permute(1, 0)
    p.reward.fill_(5.0)
    assert (tc.reward == 5.0).all()


def test_misc_properties():
    tc = _make_2d()
    assert tc.ndim == 2 and tc.batch_dims == 2 and tc.numel() == 8
    assert tc.dim() == 2 and tc.size(1) == 2
    assert set(tc.keys()) == {"obs", "reward", "inner", "label"}
    vals = dict(tc.items())
    assert vals["obs"] is tc.obs
    assert len(tc.values()) == 4
    assert "obs" in tc and ("inner", "y") in tc
    assert tc.is_empty() is False


# ----------------------------------------------------------------------------- stack / cat
def test_torch_stack_and_cat():
    a, b = make_data(seed=1), make_data(seed=2)
    s = torch.stack([a, b], 0)
    assert type(s) is Data and type(s.inner) is Inner
    assert s.batch_size == torch.Size([2, 4]) and s.inner.batch_size == torch.Size([2, 4])
    assert torch.equal(s.obs, torch.stack([a.obs, b.obs]))
    s1 = torch.stack([a, b], 1)
    assert s1.batch_size == torch.Size([4, 2])
    assert torch.equal(s1.inner.y, torch.stack([a.inner.y, b.inner.y], 1))
    c = torch.cat([a, b])
    assert type(c) is Data and c.batch_size == torch.Size([8])
    assert torch.equal(c.reward, torch.cat([a.reward, b.reward]))
    assert type(c.inner) is Inner
    assert type(stack([a, b])) is Data and type(cat([a, b])) is Data


def test_stack_out_and_errors():
    a, b = make_data(), make_data(seed=5)
    out = Data.zeros(4).unsqueeze(0).expand(2, 4).clone()
    res = torch.stack([a, b], 0, out=out)
    assert res is out
    assert torch.equal(out.obs[1], b.obs)
    o = Other(obs=a.obs, reward=a.reward, inner=a.inner, batch_size=[4])
    with pytest.raises(TypeError, match="different tensorclasses"):
        torch.stack([a, o])
    with pytest.raises((ValueError, KeyError)):
        torch.stack([a, make_data(3)])


# ----------------------------------------------------------------------------- setitem
def test_setitem_in_place():
    tc = make_data()
    obs_ptr = tc.obs.data_ptr()
    src = Data.zeros(2)
    tc[1:3] = src
    assert tc.obs.data_ptr() == obs_ptr
    assert (tc.obs[1:3] == 0).all() and (tc.inner.y[1:3] == 0).all()
    assert not (tc.obs[0] == 0).all()
    tc[0] = TensorDict({"obs": torch.full((3,), 2.0)}, [])
    assert (tc.obs[0] == 2).all()
    mask = torch.tensor([False, False, False, True])
    tc[mask] = 9.0
    assert (tc.reward[3] == 9.0).all() and (tc.inner.y[3] == 9.0).all()
    with pytest.raises(ValueError):
        tc[0:2] = Data.zeros(3)


def test_update_and_state_dict():
    tc = make_data()
    tc.update({"reward": torch.full((4,), 3.0)})
    assert (tc.reward == 3).all()
    sd = tc.state_dict()
    other = Data.zeros(4)
    other.load_state_dict(sd)
    assert torch.equal(other.obs, tc.obs) and torch.equal(other.inner.y, tc.inner.y)
    assert type(other.inner) is Inner
    assert other.label == "hello"


# ----------------------------------------------------------------------------- arithmetic
def test_arithmetic_with_everything():
    a, b = make_data(seed=1), make_data(seed=2)
    s = a + b
    assert type(s) is Data and torch.allclose(s.obs, a.obs + b.obs)
    assert torch.allclose(s.inner.y, a.inner.y + b.inner.y)
    assert s.label == "hello"
    assert torch.allclose((a - b._tensordict).reward, a.reward - b.reward)
    assert torch.allclose((a * 2).obs, a.obs * 2)
    assert torch.allclose((2 * a).obs, a.obs * 2)
    assert torch.allclose((1 - a).reward, 1 - a.reward)
    w = torch.arange(4.0)
    assert torch.allclose((a / (w + 1)).obs, a.obs / (w + 1)[:, None])
    assert torch.allclose((-a).obs, -a.obs)
    assert torch.allclose(torch.add(a, b).obs, a.obs + b.obs)
    td_res = b._tensordict + a
    assert type(td_res) is TensorDict


def test_inplace_arithmetic_keeps_identity():
    a = make_data()
    obs = a.obs.clone()
    ptr = a.obs.data_ptr()
    a += 1
    assert a.obs.data_ptr() == ptr and torch.allclose(a.obs, obs + 1)
    a.mul_(2)
    assert torch.allclose(a.obs, (obs + 1) * 2)
    a.zero_()
    assert (a.inner.y == 0).all()


def test_comparisons_and_eq():
    a = make_data()
    eq = a == a.clone()
    assert type(eq) is Data and eq.obs.dtype == torch.bool and eq.obs.all()
    assert eq.inner.y.all()
    assert (a == a).all()
    gt = a > 0
    assert type(gt) is Data and torch.equal(gt.obs, a.obs > 0)
    ne = a != (a + 1)
    assert ne.reward.all()
    assert (a == None) is False  # noqa: E711
    assert (a != None) is True  # noqa: E711
    assert hash(a) == hash(a)


# ----------------------------------------------------------------------------- to / clone
def test_clone_does_not_alias():
    a = make_data()
    c = a.clone()
    assert type(c) is Data and type(c.inner) is Inner
    c.obs.zero_()
    c.inner.y.zero_()
    assert not (a.obs == 0).all() and not (a.inner.y == 0).all()
    sh = a.clone(recurse=False)
    assert sh.obs is a.obs


def test_to_dtype_and_device():
    a = make_data()
    d = a.to(torch.float64)
    assert type(d) is Data and d.obs.dtype == torch.float64 and d.inner.y.dtype == torch.float64
    c = a.to("cpu")
    assert c.device == torch.device("cpu") and type(c.inner) is Inner
    assert c.inner.device == torch.device("cpu")
    assert a.double().reward.dtype == torch.float64


def test_to_and_from_tensordict():
    a = make_data()
    td = a.to_tensordict()
    assert type(td) is TensorDict and type(td["inner"]) is TensorDict
    td["obs"].zero_()
    assert not (a.obs == 0).all()  # a copy
    back = Data.from_tensordict(td)
    assert type(back) is Data and type(back.inner) is Inner
    assert back.obs is td["obs"]
    with pytest.raises(ValueError, match="not fields"):
        Data.from_tensordict(TensorDict({"nope": torch.zeros(4)}, [4]))
    shared = TensorDict({"x": torch.zeros(3)}, [3])
    s = Simple.from_tensordict(shared)
    s.x.add_(1)
    assert (shared["x"] == 1).all()
    f = Simple.from_dict({"x": torch.zeros(2, 3), "y": torch.ones(2)})
    assert f.batch_size == torch.Size([2])


# ----------------------------------------------------------------------------- memmap / io
def test_memmap_roundtrip_and_load(tmp_path):
    a = make_data()
    a.label = "saved"
    m = a.memmap(tmp_path / "m")
    assert type(m) is Data and type(m.inner) is Inner
    assert m.is_memmap() and m.is_locked
    assert torch.equal(m.obs, a.obs)
    loaded = Data.load(tmp_path / "m")
    assert type(loaded) is Data and type(loaded.inner) is Inner
    assert torch.equal(loaded.obs, a.obs) and torch.equal(loaded.inner.y, a.inner.y)
    assert loaded.label == "saved"
    mm = Data.load_memmap(tmp_path / "m")
    assert mm.is_memmap() and type(mm.inner) is Inner
    # writes through the memory map reach the file
    m.obs[0] = 42.0
    assert (Data.load(tmp_path / "m").obs[0] == 42.0).all()


def test_memmap_inplace_and_like(tmp_path):
    a = make_data()
    expected = a.obs.clone()
    out = a.memmap_(tmp_path / "inplace")
    assert out is a and a.is_memmap() and type(a.inner) is Inner
    assert torch.equal(a.obs, expected)
    like = a.memmap_like(tmp_path / "like")
    assert type(like) is Data and type(like.inner) is Inner
    assert (like.obs == 0).all() and like.obs.shape == a.obs.shape
    shm = make_data().memmap()
    assert type(shm) is Data and shm.is_memmap()


def test_save_load_never_runs_code(tmp_path, monkeypatch):
    a = make_data()
    a.save(tmp_path / "s")
    meta = json.loads((tmp_path / "s" / "meta.json").read_text())
    assert "obs" in meta["entries"]

    def boom(*args, **kwargs):
        raise AssertionError("loading must not unpickle")

    monkeypatch.setattr(pickle, "loads", boom)
    monkeypatch.setattr(pickle, "load", boom)
    monkeypatch.setattr(torch, "load", boom)
    out = Data.load(tmp_path / "s")
    assert torch.equal(out.reward, a.reward)
    (tmp_path / "evil").mkdir()
    (tmp_path / "evil" / "meta.json").write_text(json.dumps({"_type": "os.system", "entries": {}}))
    with pytest.raises(ValueError, match="unknown container type"):
        Data.load(tmp_path / "evil")
    TensorDict({"bad": torch.zeros(2)}, [2]).save(tmp_path / "bad")
    with pytest.raises(ValueError, match="not fields"):
        Data.load(tmp_path / "bad")


# ----------------------------------------------------------------------------- pickling / copy
def test_pickle_roundtrip():
    a = make_data()
    b = pickle.loads(pickle.dumps(a))
    assert type(b) is Data and type(b.inner) is Inner
    assert torch.equal(b.obs, a.obs) and b.label == "hello"
    assert b.batch_size == a.batch_size
    assert b.total_reward() == a.total_reward()


def test_pickle_class_defined_in_function():
    @tensorclass
    class LocalTC:
        x: torch.Tensor
        name: str

    a = LocalTC(x=torch.arange(3), name="n", batch_size=[3]).lock_()
    b = pickle.loads(pickle.dumps(a))
    assert is_tensorclass(b) and type(b).__name__ == "LocalTC"
    assert torch.equal(b.x, a.x) and b.name == "n" and b.is_locked
    assert type(b[0]) is type(b)


def test_copy_and_deepcopy():
    a = make_data()
    c = copy.copy(a)
    assert type(c) is Data and c.obs is a.obs
    c.obs = torch.zeros(4, 3)
    assert not (a.obs == 0).all()  # a new container
    d = copy.deepcopy(a)
    d.obs.zero_()
    assert not (a.obs == 0).all() and type(d.inner) is Inner


# ----------------------------------------------------------------------------- user methods
def test_user_methods_properties_classmethods():
    a = make_data()
    assert torch.allclose(a.total_reward(), a.reward.sum())
    assert a.n_obs == 3
    z = Data.zeros(3)
    assert type(z) is Data and z.batch_size == torch.Size([3])
    assert torch.allclose(a[1:3].total_reward(), a.reward[1:3].sum())


def test_post_init_and_custom_repr():
    p = PostInit(x=torch.ones(2), batch_size=[2])
    assert torch.equal(p.doubled, torch.full((2,), 2.0))
    assert repr(CustomRepr(x=torch.zeros(1), batch_size=[1])) == "custom!"


def test_user_init_is_kept():
    @tensorclass
    class WithInit:
        x: torch.Tensor

        def __init__(self, n: int) -> None:
            self.x = torch.arange(n)

    w = WithInit(3, batch_size=[3])
    assert w.x.tolist() == [0, 1, 2] and w.batch_size == torch.Size([3])


def test_subclass_adds_fields():
    c = Child(x=torch.zeros(2), y=torch.ones(2), z=torch.full((2,), 2.0), batch_size=[2])
    assert [f.name for f in dataclasses.fields(Child)] == ["x", "y", "z"]
    assert type(c[0]) is Child and c[0].z.item() == 2.0
    assert isinstance(c, Simple)


def test_repr():
    r = repr(make_data())
    assert r.startswith("Data(\n    obs=Tensor(shape=torch.Size([4, 3])")
    assert "dtype=torch.float32" in r
    assert "inner=Inner(" in r and "label='hello'" in r
    assert "batch_size=torch.Size([4])" in r and "device=None" in r
    assert "reward=None" in repr(Data(obs=torch.zeros(2, 3), batch_size=[2]))


# ----------------------------------------------------------------------------- inside a TensorDict
def test_tensorclass_as_tensordict_entry():
    a = make_data()
    td = TensorDict({"data": a, "done": torch.zeros(4, 1, dtype=torch.bool)}, [4])
    assert td["data"] is a
    td2 = TensorDict(batch_size=[4])
    td2.set("data", a)
    assert type(td2.get("data")) is Data
    one = td[1]
    assert type(one["data"]) is Data and type(one["data"].inner) is Inner
    assert torch.equal(one["data"].obs, a.obs[1])
    assert type(td[1:3]["data"]) is Data
    assert type(td[torch.tensor([True, False, True, False])]["data"]) is Data
    st = torch.stack([td, td], 0)
    assert type(st["data"]) is Data and st["data"].batch_size == torch.Size([2, 4])
    assert torch.equal(st["data"].inner.y[1], a.inner.y)
    ct = torch.cat([td, td], 0)
    assert type(ct["data"]) is Data and ct["data"].batch_size == torch.Size([8])
    assert ("data", "inner", "y") in td.keys(True, True)
    assert torch.equal(td.get(("data", "obs")), a.obs)


def test_tensorclass_entry_survives_td_ops():
    a = make_data()
    td = TensorDict({"data": a}, [4])
    c = td.clone()
    assert type(c["data"]) is Data and c["data"] is not a
    c["data"].obs.zero_()
    assert not (a.obs == 0).all()
    assert type(td.to(torch.float64)["data"]) is Data
    assert type(td.reshape(2, 2)["data"]) is Data
    assert td.reshape(2, 2)["data"].batch_size == torch.Size([2, 2])
    assert type(td.unsqueeze(0)["data"]) is Data
    assert [type(x["data"]) for x in td.unbind(0)] == [Data] * 4
    assert type(td.apply(lambda x: x + 1)["data"]) is Data
    assert type((td + td)["data"]) is Data
    leaves = td._tensor_leaves()
    assert any(t is a.obs for t in leaves)
    td.zero_()
    assert (a.obs == 0).all() and (a.inner.y == 0).all()


def test_tensordict_setitem_into_tensorclass_entry():
    a = make_data()
    td = TensorDict({"data": a}, [4])
    td[1:3] = TensorDict({"data": Data.zeros(2)}, [2])
    assert (a.obs[1:3] == 0).all() and (a.inner.y[1:3] == 0).all()
    assert not (a.obs[0] == 0).all()


def test_tensordict_with_tensorclass_entry_memmap(tmp_path):
    a = make_data()
    td = TensorDict({"data": a}, [4])
    td.memmap_(tmp_path / "td")
    assert type(td["data"]) is Data and td["data"].is_memmap()
    loaded = TensorDict.load(tmp_path / "td")
    assert torch.equal(loaded[("data", "obs")], a.obs)


def test_lock_propagates():
    a = make_data()
    td = TensorDict({"data": a}, [4]).lock_()
    assert a.is_locked
    td.unlock_()
    assert not a.is_locked


# ----------------------------------------------------------------------------- from_dataclass
def test_from_dataclass_class_and_instance():
    cls = from_dataclass(PlainPoint)
    assert is_tensorclass(cls) and cls is from_dataclass(PlainPoint)
    assert [f.name for f in dataclasses.fields(cls)] == ["xy", "label"]
    inst = cls(xy=torch.ones(3, 2), batch_size=[3])
    assert inst.label == "p"
    assert torch.allclose(inst.norm(), torch.full((3,), 2 ** 0.5))  # method kept
    p = from_dataclass(PlainPoint(torch.zeros(5, 2), "q"), auto_batch_size=True)
    assert type(p) is cls and p.batch_size == torch.Size([5, 2]) and p.label == "q"
    p = from_dataclass(PlainPoint(torch.zeros(5, 2), "q"), auto_batch_size=True, batch_dims=1)
    assert p.batch_size == torch.Size([5])
    assert type(p[0]) is cls
    q = from_dataclass(PlainPoint(torch.zeros(5, 2)), batch_size=[5])
    assert q.batch_size == torch.Size([5])


def test_from_dataclass_nested():
    pair = PlainPair(first=PlainPoint(torch.zeros(4, 2)), weight=torch.ones(4))
    tc = from_dataclass(pair, auto_batch_size=True)
    assert is_tensorclass(tc) and is_tensorclass(tc.first)
    assert tc.batch_size == torch.Size([4]) and tc.first.batch_size[:1] == torch.Size([4])
    assert type(tc[1].first) is type(tc.first)
    with pytest.raises(TypeError):
        from_dataclass(3)
