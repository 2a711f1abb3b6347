"""The spec battery: every spec kind (and a nested Composite) x batch shapes x rand shapes.

Each case builds a spec whose shape is ``[*B, *rest]`` with ``B`` in ``[]``, ``[3]``,
``[2, 3]``: ``B`` is always a batch part (indexable, expandable, squeezable) and
``rest`` may hold event dims (the one-hot dim of ``OneHot`` ...). Every test runs the
same contract on every case: sampling lands in the spec, projection maps anything
into it and keeps valid values, encode/to_numpy round-trip, shape operations agree
with the shapes of sampled values, copies compare equal, and membership is
consistent with ``assert_is_in``.
"""

from __future__ import annotations

import copy
import math
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from steersman.data import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    MultiOneHot,
    NonTensor,
    OneHot,
    TensorSpec,
    Unbounded,
)
from steersman.tensordict import NonTensorData, TensorDict, is_non_tensor, is_tensor_collection

INF = float("inf")


def _mask(shape: tuple, n: int, seed: int) -> torch.Tensor:
    """A random bool mask ``[*shape, n]`` with at least one allowed value per row, some forbidden."""
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(*shape, n, generator=g) < 0.5
    m[..., 0] |= ~m.any(-1)
    m[..., -1] = False  # always forbid the last value, so the mask matters
    m[..., 0] |= ~m.any(-1)
    return m


def _multi_mask(shape: tuple, nvec: list[int], seed: int) -> torch.Tensor:
    return torch.cat([_mask(shape, n, seed + i) if n > 1 else torch.ones(*shape, 1, dtype=torch.bool)
                      for i, n in enumerate(nvec)], -1)


def _composite(B: tuple) -> Composite:
    return Composite(
        observation=Bounded(-1.0, 1.0, shape=(*B, 3)),
        action=OneHot(4, shape=(*B, 4), mask=_mask(B, 4, 3)),
        next=Composite(
            reward=Unbounded(shape=(*B, 1)),
            done=Categorical(2, shape=(*B, 1), dtype=torch.bool),
            state=Composite(h=MultiCategorical([2, 3], shape=(*B, 2)), shape=B),
            shape=B,
        ),
        text=NonTensor(shape=B, example_data="hello"),
        shape=B,
    )


# name -> factory of the batch part B
KINDS: dict[str, Callable[[tuple], TensorSpec]] = {
    "unbounded": lambda B: Unbounded(shape=(*B, 2)),
    "unbounded_f64": lambda B: Unbounded(shape=B, dtype=torch.float64),
    "unbounded_int": lambda B: Unbounded(shape=(*B, 2), dtype=torch.int32),
    "unbounded_bool": lambda B: Unbounded(shape=B, dtype=torch.bool),
    "bounded": lambda B: Bounded(-1.0, 2.0, shape=(*B, 2)),
    "bounded_tensor": lambda B: Bounded(
        torch.tensor([-1.0, 0.0, 5.0]), torch.tensor([1.0, 0.0, 6.0]), shape=(*B, 3)
    ),
    "bounded_half_inf": lambda B: Bounded(
        torch.tensor([0.0, -INF, -INF]), torch.tensor([INF, 1.0, INF]), shape=(*B, 3)
    ),
    "bounded_positive": lambda B: Bounded(2.0, 3.0, shape=B, dtype=torch.float64),
    "bounded_int": lambda B: Bounded(-3, 4, shape=B, dtype=torch.int64),
    "bounded_uint8": lambda B: Bounded(10, 200, shape=(*B, 2), dtype=torch.uint8),
    "categorical": lambda B: Categorical(5, shape=B),
    "categorical_masked": lambda B: Categorical(5, shape=B, mask=_mask(B, 5, 0)),
    "categorical_bool": lambda B: Categorical(2, shape=(*B, 1), dtype=torch.bool),
    "categorical_int8": lambda B: Categorical(3, shape=(*B, 2), dtype=torch.int8),
    "onehot": lambda B: OneHot(4, shape=(*B, 4)),
    "onehot_masked": lambda B: OneHot(4, shape=(*B, 4), mask=_mask(B, 4, 1)),
    "onehot_float": lambda B: OneHot(3, shape=(*B, 3), dtype=torch.float32),
    "multicategorical": lambda B: MultiCategorical([2, 3, 4], shape=(*B, 3)),
    "multicategorical_masked": lambda B: MultiCategorical(
        [2, 3, 4], shape=(*B, 3), mask=_multi_mask(B, [2, 3, 4], 2)
    ),
    "multionehot": lambda B: MultiOneHot([2, 3], shape=(*B, 5)),
    "multionehot_masked": lambda B: MultiOneHot([2, 3], shape=(*B, 5), mask=_multi_mask(B, [2, 3], 5)),
    "binary": lambda B: Binary(4, shape=(*B, 4)),
    "binary_bool": lambda B: Binary(3, shape=(*B, 3), dtype=torch.bool),
    "nontensor": lambda B: NonTensor(shape=B, example_data="hello"),
    "composite": _composite,
}
BATCHES = [(), (3,), (2, 3)]
RAND_SHAPES = [None, (), (4,), (2, 1)]


@pytest.fixture(params=list(KINDS), ids=list(KINDS))
def kind(request) -> str:
    return request.param


@pytest.fixture(params=BATCHES, ids=["B=[]", "B=[3]", "B=[2,3]"])
def batch(request) -> tuple:
    return request.param


@pytest.fixture
def spec(kind: str, batch: tuple) -> TensorSpec:
    return KINDS[kind](batch)


@pytest.fixture(params=[(3,), (2, 3)], ids=["B=[3]", "B=[2,3]"])
def batched_spec(kind: str, request) -> tuple[TensorSpec, tuple]:
    return KINDS[kind](request.param), request.param


# ---------------------------------------------------------------------- helpers
def full_shape(spec: TensorSpec, extra: Any) -> torch.Size:
    return torch.Size(extra or ()) + spec.shape


def value_shape(x: Any) -> torch.Size:
    return x.shape if isinstance(x, torch.Tensor) else x.batch_size


def assert_same(a: Any, b: Any) -> None:
    """Equal values: same keys, shapes, dtypes and elements (non-tensor data by value)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), type(b)
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
        assert torch.equal(a, b), (a, b)
    elif is_non_tensor(a):
        assert is_non_tensor(b) and a.batch_size == b.batch_size and a.data == b.data
    elif is_tensor_collection(a):
        assert is_tensor_collection(b) and a.batch_size == b.batch_size
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        for k in a.keys():
            assert_same(a.get(k), b.get(k))
    else:
        assert a == b


def arbitrary(spec: TensorSpec, extra: tuple = (), seed: int = 0) -> Any:
    """Values of the spec's shape that are mostly *not* in the spec (wide floats)."""
    g = torch.Generator().manual_seed(seed)
    if isinstance(spec, Composite):
        out = {k: arbitrary(s, extra, seed + i) for i, (k, s) in enumerate(spec.items())}
        return TensorDict(out, batch_size=full_shape(spec, extra))
    if isinstance(spec, NonTensor):  # a raw value, or a wrapper of the wrong batch size
        return NonTensorData("other", batch_size=full_shape(spec, extra)) if extra else "other"
    x = torch.randn(full_shape(spec, extra), generator=g, dtype=torch.float64) * 10
    x.view(-1)[:1] = float("nan") if x.numel() else 0
    return x


def is_leaf_tensor_spec(spec: TensorSpec) -> bool:
    return not isinstance(spec, (Composite, NonTensor))


def batch_ndim(spec: TensorSpec) -> int:
    return spec.ndim if isinstance(spec, Composite) else spec._batch_ndim


# ---------------------------------------------------------------------- sampling
@pytest.mark.parametrize("extra", RAND_SHAPES, ids=str)
def test_rand_in_spec(spec: TensorSpec, extra):
    x = spec.rand(extra)
    assert value_shape(x) == full_shape(spec, extra)
    if is_leaf_tensor_spec(spec):
        assert x.dtype == spec.dtype and x.device == spec.device
    if isinstance(spec, Composite):
        assert type(x) is TensorDict
        for key, leaf in spec.items(True, True):
            assert leaf.is_in(x.get(key)), key
    assert spec.is_in(x)
    spec.assert_is_in(x)


@pytest.mark.parametrize("extra", RAND_SHAPES, ids=str)
def test_zero_and_one_in_spec(spec: TensorSpec, extra):
    for value in (spec.zero(extra), spec.one(extra)):
        assert value_shape(value) == full_shape(spec, extra)
        assert spec.is_in(value), value
        assert_same(spec.project(value), value)


@pytest.mark.parametrize("kind_name", ["bounded", "categorical", "unbounded", "bounded_int", "binary"])
def test_zero_is_zeros_when_valid(kind_name):
    spec = KINDS[kind_name]((2,))
    z = spec.zero((3,))
    assert z.dtype == spec.dtype and not z.any()
    assert bool((spec.one() == 1).all())


def test_zero_is_the_nearest_valid_value_otherwise():
    assert torch.equal(Bounded(2.0, 3.0, shape=(2,)).zero(), torch.full((2,), 2.0))
    masked = Categorical(4, mask=torch.tensor([False, False, True, True]))
    assert masked.zero().item() == 2 and masked.one().item() == 2
    assert torch.equal(OneHot(3).zero(), torch.tensor([True, False, False]))


# ---------------------------------------------------------------------- projection
@pytest.mark.parametrize("extra", [(), (4,)], ids=str)
def test_project_maps_into_spec(spec: TensorSpec, extra):
    x = arbitrary(spec, extra)
    p = spec.project(x)
    assert spec.is_in(p), (x, p)
    assert value_shape(p) == full_shape(spec, extra)


@pytest.mark.parametrize("extra", [None, (4,)], ids=str)
def test_project_is_identity_on_valid_values(spec: TensorSpec, extra):
    x = spec.rand(extra)
    snapshot = x.clone() if isinstance(x, torch.Tensor) or isinstance(x, TensorDict) else x
    assert_same(spec.project(x), snapshot)


@pytest.mark.parametrize("name", [k for k in KINDS if k not in ("nontensor", "composite")])
@pytest.mark.parametrize("B", BATCHES, ids=str)
def test_project_integer_values(name, B):
    spec = KINDS[name](B)
    x = torch.randint(-20, 20, spec.shape, generator=torch.Generator().manual_seed(1))
    assert spec.is_in(spec.project(x))


# ---------------------------------------------------------------------- encode / to_numpy
def test_encode_numpy_round_trip(spec: TensorSpec):
    x = spec.rand()
    as_numpy = spec.to_numpy(x)
    if is_leaf_tensor_spec(spec):
        assert isinstance(as_numpy, np.ndarray)
    assert_same(spec.encode(as_numpy), x)


def test_encode_raw_arrays_and_lists(spec: TensorSpec):
    x = spec.rand()
    if isinstance(spec, Composite):
        raw = {k: v for k, v in spec.to_numpy(x).items()}
        out = spec.encode(raw)
        assert type(out) is TensorDict and out.batch_size == spec.shape
        assert spec.is_in(out)
        return
    if isinstance(spec, NonTensor):
        out = spec.encode("raw text")
        assert out.data == "raw text" and out.batch_size == spec.shape and spec.is_in(out)
        return
    arr = x.cpu().numpy()
    enc = spec.encode(arr)
    assert_same(enc, x)
    assert_same(spec.encode(x.tolist()), x)
    readonly = arr.copy()
    readonly.setflags(write=False)
    assert_same(spec.encode(readonly), x)
    assert_same(spec.encode(x.to(torch.float64) if spec.dtype is not torch.bool else x), x)


def test_encode_python_numbers():
    assert_same(Categorical(4).encode(3), torch.tensor(3))
    assert_same(Categorical(4).encode(np.int64(2)), torch.tensor(2))
    assert_same(Bounded(-1.0, 1.0, shape=()).encode(0.5), torch.tensor(0.5))
    assert_same(Bounded(-1.0, 1.0, shape=(1,)).encode(0.25), torch.tensor([0.25]))  # reshaped
    assert_same(Unbounded(shape=(1,)).encode(np.float64(2.0)), torch.tensor([2.0]))
    assert_same(Categorical(2, shape=(1,), dtype=torch.bool).encode(True), torch.tensor([True]))
    assert_same(OneHot(3).encode(1), torch.tensor([False, True, False]))
    assert_same(Binary(2).encode([1, 0]), torch.tensor([1, 0], dtype=torch.int8))


# ---------------------------------------------------------------------- shape ops
def test_expand(spec: TensorSpec):
    ex = spec.expand(5, *spec.shape)
    assert ex.shape == (5, *spec.shape)
    x = ex.rand((2,))
    assert value_shape(x) == (2, 5, *spec.shape)
    assert ex.is_in(x) and spec.is_in(x)
    assert ex == spec.expand(torch.Size([5, *spec.shape]))  # tuple form
    assert ex == spec.unsqueeze(0).expand(5, *spec.shape)  # singleton dim grown


def test_expand_rejects_incompatible_shape(spec: TensorSpec):
    bad = (*spec.shape[:-1], spec.shape[-1] + 1) if spec.ndim and spec.shape[-1] != 1 else None
    if bad is None:  # nothing to grow wrongly: a shape with fewer dims is the error

        with pytest.raises(ValueError, match="fewer dims"):
            spec.unsqueeze(0).expand(())
        return
    with pytest.raises(ValueError, match="cannot expand"):
        spec.expand(*bad)


@pytest.mark.parametrize(
    "index", [0, -1, slice(0, 2), slice(None, None, 2), (Ellipsis, 0), [0, 1]], ids=str
)
def test_index_matches_indexed_values(batched_spec, index):
    spec, B = batched_spec
    x = spec.rand()
    if isinstance(index, tuple) and index[0] is Ellipsis:
        index = (Ellipsis,) * 0 + (slice(None),) * (len(B) - 1) + (0,)  # last batch dim
    sub = spec[index]
    assert value_shape(sub.rand()) == value_shape(x[index])
    assert sub.is_in(x[index])  # bounds / masks are indexed like the values
    assert sub == spec[index]


def test_index_bool_mask(batched_spec):
    spec, B = batched_spec
    sel = torch.tensor([True, False, True])
    sub = spec[(slice(None),) * (len(B) - 1) + (sel,)] if len(B) > 1 else spec[sel]
    assert value_shape(sub.rand())[: len(B)] == (*B[:-1], 2)


def test_index_beyond_batch_dims_raises(spec: TensorSpec):
    index = (0,) * (batch_ndim(spec) + 1)
    with pytest.raises(IndexError):
        spec[index]


def test_squeeze_unsqueeze(spec: TensorSpec):
    u = spec.unsqueeze(0)
    assert u.shape == (1, *spec.shape)
    assert u.squeeze(0) == spec and u.squeeze() == spec.squeeze()
    assert u.is_in(u.rand()) and spec.is_in(u.rand())
    last = spec.unsqueeze(batch_ndim(spec))  # after the batch part
    assert last.shape == (*spec.shape[: batch_ndim(spec)], 1, *spec.shape[batch_ndim(spec):])
    x = last.rand()
    assert last.is_in(x) and value_shape(x) == last.shape


def test_reshape_and_unbind(batched_spec):
    spec, B = batched_spec
    n = math.prod(B)
    flat = spec.reshape(n, *spec.shape[len(B):])
    assert flat.shape == (n, *spec.shape[len(B):])
    assert flat.is_in(flat.rand())
    parts = spec.unbind(0)
    assert len(parts) == B[0]
    assert all(p == spec[i] for i, p in enumerate(parts))


# ---------------------------------------------------------------------- copies, devices, eq
def test_clone_to_eq(spec: TensorSpec):
    c = spec.clone()
    assert c == spec and c is not spec
    if spec.device is None:  # a Composite of mixed devices: to() sets its device
        assert spec.to("cpu").device == torch.device("cpu")
        assert list(spec.to("cpu").values(True, True)) == list(spec.values(True, True))
    else:
        assert spec.to("cpu") == spec and spec.to(torch.device("cpu")) == spec
        assert spec.cpu() == spec
    assert spec != spec.expand(2, *spec.shape)
    assert spec != "not a spec"
    for name, t in getattr(spec, "_tensor_items", lambda: [])():
        assert getattr(c, name).data_ptr() != t.data_ptr(), name  # clone shares no tensor


def test_pickle_and_deepcopy(spec: TensorSpec):
    for copied in (pickle.loads(pickle.dumps(spec)), copy.deepcopy(spec)):
        assert copied == spec and copied is not spec
        assert copied.is_in(spec.rand()) and spec.is_in(copied.rand())


def test_repr_names_the_spec(spec: TensorSpec):
    text = repr(spec)
    assert type(spec).__name__ in text and str(list(spec.shape)) in text
    if isinstance(spec, Composite):
        assert all(k in text for k in spec.keys())


# ---------------------------------------------------------------------- membership
def test_is_in_agrees_with_assert_is_in(spec: TensorSpec):
    candidates = [spec.rand(), spec.rand((2,)), arbitrary(spec), arbitrary(spec, (2,), 3)]
    if is_leaf_tensor_spec(spec):
        candidates += [torch.zeros(spec.shape, dtype=torch.complex64), 1.0]
    for v in candidates:
        inside = spec.is_in(v)
        assert inside == (spec._check(v) is None), v
        if inside:
            spec.assert_is_in(v)
        else:
            with pytest.raises(ValueError, match=type(spec).__name__):
                spec.assert_is_in(v)


def test_is_in_rejects_wrong_shape_and_dtype_kind(spec: TensorSpec):
    x = spec.rand()
    if isinstance(spec, NonTensor):
        assert not spec.is_in(torch.zeros(spec.shape))
        assert not spec.is_in(TensorDict({}, batch_size=spec.shape))
        if spec.ndim:
            assert not spec.is_in(NonTensorData("x", batch_size=(*spec.shape[:-1], 7)))
        return
    if isinstance(spec, Composite):
        key, leaf = next((k, s) for k, s in spec.items(True, True) if is_leaf_tensor_spec(s))
        x.set(key, x.get(key).to(torch.complex64))
        assert not spec.is_in(x)
        assert not spec.is_in(torch.zeros(3))
        return
    wrong_kind = x.to(torch.float32) if spec.dtype in (torch.bool, torch.int64, torch.int32,
                                                       torch.int8, torch.uint8) else x.to(torch.int64)
    assert not spec.is_in(wrong_kind)
    with pytest.raises(ValueError, match="dtype kind"):
        spec.assert_is_in(wrong_kind)
    if spec.ndim:
        wrong_shape = torch.cat([x, x], -1)
        assert not spec.is_in(wrong_shape)
        with pytest.raises(ValueError, match="does not end with the spec shape"):
            spec.assert_is_in(wrong_shape)
    assert not spec.is_in(x.numpy())  # not a tensor


INVALID: dict[str, Callable[[TensorSpec], torch.Tensor]] = {
    "bounded": lambda s: torch.full(s.shape, 2.5),
    "bounded_tensor": lambda s: torch.tensor([0.0, 0.1, 5.5]).expand(s.shape),
    "bounded_half_inf": lambda s: torch.tensor([-0.1, 0.0, 1.0]).expand(s.shape),
    "bounded_positive": lambda s: torch.full(s.shape, 1.0, dtype=torch.float64),
    "bounded_int": lambda s: torch.full(s.shape, 5),
    "bounded_uint8": lambda s: torch.full(s.shape, 201, dtype=torch.uint8),
    "categorical": lambda s: torch.full(s.shape, 5),
    "categorical_masked": lambda s: torch.full(s.shape, 4),  # the last value is always masked
    "categorical_int8": lambda s: torch.full(s.shape, -1, dtype=torch.int8),
    "onehot": lambda s: torch.zeros(s.shape, dtype=torch.bool),
    "onehot_masked": lambda s: torch.nn.functional.one_hot(torch.full(s.shape[:-1], 3), 4).bool(),
    "onehot_float": lambda s: torch.full(s.shape, 1 / 3),
    "multicategorical": lambda s: torch.tensor([1, 3, 0]).expand(s.shape),
    "multicategorical_masked": lambda s: torch.tensor([1, 2, 3]).expand(s.shape),
    "multionehot": lambda s: torch.tensor([True, True, False, False, True]).expand(s.shape),
    "multionehot_masked": lambda s: torch.tensor([False, True, False, False, True]).expand(s.shape),
    "binary": lambda s: torch.full(s.shape, 2, dtype=torch.int8),
}


@pytest.mark.parametrize("name", list(INVALID))
@pytest.mark.parametrize("B", BATCHES, ids=str)
def test_invalid_values_are_rejected_with_a_clear_message(name, B):
    spec = KINDS[name](B)
    bad = INVALID[name](spec)
    assert not spec.is_in(bad)
    assert not spec.is_in(bad.expand(2, *bad.shape))
    with pytest.raises(ValueError) as info:
        spec.assert_is_in(bad)
    msg = str(info.value)
    assert type(spec).__name__ in msg
    assert any(w in msg for w in ("out of", "mask", "exactly one", "0 or 1")), msg
    assert spec.is_in(spec.project(bad))


def test_composite_invalid_leaf_message_names_nested_key(batch):
    spec = _composite(batch)
    td = spec.rand()
    td["next", "state", "h"] = torch.full((*batch, 2), 7)
    assert not spec.is_in(td)
    with pytest.raises(ValueError, match=r"\('next', 'state', 'h'\).*MultiCategorical.*7"):
        spec.assert_is_in(td)
    spec.project(td)  # in place
    assert spec.is_in(td)
    del td["next", "reward"]
    with pytest.raises(ValueError, match=r"\('next', 'reward'\) is missing"):
        spec.assert_is_in(td)
