"""Global switches: each works as a context manager, a decorator and (``.set()``) for good,
restores the previous value, and has its documented effect."""

from __future__ import annotations

import threading

import pytest
import torch

from steersman.tensordict import (
    LazyStackedTensorDict,
    NonTensorData,
    NonTensorStack,
    TensorDict,
    capture_non_tensor_stack,
    get_defaults_to_none,
    get_printoptions,
    lazy_legacy,
    list_to_stack,
    set_capture_non_tensor_stack,
    set_get_defaults_to_none,
    set_lazy_legacy,
    set_list_to_stack,
    set_printoptions,
)
from steersman.tensordict.nn import (
    ProbabilisticTensorDictModule,
    TensorDictModule,
    TensorDictModuleBase,
    TensorDictSequential,
    set_skip_existing,
    skip_existing,
)

SWITCHES = [
    (set_list_to_stack, list_to_stack, True),
    (set_lazy_legacy, lazy_legacy, False),
    (set_capture_non_tensor_stack, capture_non_tensor_stack, False),
]


@pytest.mark.parametrize("setter,getter,default", SWITCHES, ids=lambda x: getattr(x, "__name__", str(x)))
def test_context_decorator_and_set(setter, getter, default):
    assert getter() is default
    with setter(not default):
        assert getter() is (not default)
        with setter(default):  # nested blocks restore in order
            assert getter() is default
        assert getter() is (not default)
    assert getter() is default

    @setter(not default)
    def inside():
        return getter()

    assert inside() is (not default) and getter() is default
    try:
        setter(not default).set()
        assert getter() is (not default)
    finally:
        setter(default).set()
    with pytest.raises(TypeError, match="bool"):
        setter("yes")


def test_switch_restored_after_an_exception():
    with pytest.raises(ZeroDivisionError), set_lazy_legacy(True):
        raise ZeroDivisionError
    assert lazy_legacy() is False


# ----------------------------------------------------------------------------- effects
def test_list_to_stack_effect():
    pair = [torch.zeros(2), torch.ones(2)]
    td = TensorDict({"l": pair}, [2])
    assert isinstance(td.get("l"), torch.Tensor) and td["l"].tolist() == [[0, 0], [1, 1]]
    td["m"] = [[torch.zeros(3)] * 4, [torch.ones(3)] * 4]  # nested lists
    assert td["m"].shape == (2, 4, 3)
    td["ragged"] = [torch.zeros(2), torch.ones(3)]  # not stackable: a stack of values
    assert isinstance(td.get("ragged"), NonTensorStack)
    with set_list_to_stack(False):
        off = TensorDict({"l": pair}, [2])
        assert isinstance(off.get("l"), NonTensorStack)
        off["l2"] = pair
        assert isinstance(off.get("l2"), NonTensorStack)


def test_lazy_legacy_effect():
    a = TensorDict({"x": torch.zeros(3)}, [3])
    assert type(torch.stack([a, a])) is TensorDict
    with set_lazy_legacy(True):
        out = torch.stack([a, a])
        assert isinstance(out, LazyStackedTensorDict) and out.tensordicts[0] is a
        assert out.batch_size == (2, 3)


def test_capture_non_tensor_stack_effect():
    items = [NonTensorData("a"), NonTensorData("a")]
    assert isinstance(torch.stack(items), NonTensorStack)
    with set_capture_non_tensor_stack(True):
        out = torch.stack(items)
        assert isinstance(out, NonTensorData) and out.data == "a" and out.batch_size == (2,)
        assert isinstance(torch.stack([NonTensorData("a"), NonTensorData("b")]), NonTensorStack)
        td = torch.stack([TensorDict(s=NonTensorData("v")), TensorDict(s=NonTensorData("v"))])
        assert isinstance(td.get("s"), NonTensorData)


def test_get_defaults_to_none():
    td = TensorDict({"a": torch.zeros(2), "n": {"b": torch.zeros(2)}}, [2])
    assert get_defaults_to_none() is False
    with pytest.raises(KeyError, match="zz"):
        td.get("zz")
    with set_get_defaults_to_none(True):
        assert get_defaults_to_none() is True
        assert td.get("zz") is None and td.get(("n", "zz")) is None and td.get(("q", "b")) is None
        assert td.get("zz", 3) == 3  # an explicit default still wins
        with pytest.raises(KeyError):
            td["zz"]  # indexing still raises
        lz = torch.stack([td, td]).to_lazy() if hasattr(td, "to_lazy") else None
        if lz is not None:
            assert lz.get("zz") is None
    assert get_defaults_to_none() is False
    # a plain call sets it at once (tensordict's form)
    try:
        set_get_defaults_to_none(True)
        assert td.get("zz") is None
    finally:
        set_get_defaults_to_none(False)
    with pytest.raises(KeyError):
        td.get("zz")


# ----------------------------------------------------------------------------- print options
def test_printoptions():
    td = TensorDict({"b": torch.zeros(3, 2, dtype=torch.bool), "a": {"x": torch.zeros(3, 4, 5)}}, [3])
    before = get_printoptions()
    with set_printoptions(compact=True):
        assert repr(td) == "TensorDict(batch_size=[3], fields={b: bool[2], a: {x: f32[4,5]}})"
        with set_printoptions(sort_keys="alphabetical"):
            assert repr(td) == "TensorDict(batch_size=[3], fields={a: {x: f32[4,5]}, b: bool[2]})"
    assert get_printoptions() == before
    with set_printoptions(verbose=False):
        text = repr(td)
        assert "dtype" not in text and "is_shared" not in text and "shape=torch.Size([3, 2])" in text
    with set_printoptions(show_grad=True):
        assert "requires_grad=False" in repr(td)
    assert "dtype=torch.bool" in repr(td)
    with pytest.raises(TypeError, match="show_colour"):
        set_printoptions(show_colour=True)
    with pytest.raises(TypeError, match="sort_keys"):
        set_printoptions(sort_keys="random")


# ----------------------------------------------------------------------------- skip_existing
def _counting(in_keys, out_keys):
    calls = []

    def fn(x):
        calls.append(1)
        return x + 1

    return TensorDictModule(fn, in_keys, out_keys), calls


def test_skip_existing_modules():
    m, calls = _counting(["x"], ["y"])
    td = TensorDict(x=torch.zeros(()), y=torch.zeros(()))
    assert skip_existing() is False
    with set_skip_existing():
        assert skip_existing() is True
        assert m(td)["y"] == 0 and not calls
        m(TensorDict(x=torch.zeros(())))  # missing output: it runs
        assert len(calls) == 1
        same, same_calls = _counting(["x"], ["x"])  # in_keys and out_keys share a key: always runs
        same(td.clone())
        assert same_calls
    assert m(td)["y"] == 1 and len(calls) == 2
    # a list of keys: only modules whose outputs are all listed are skipped
    td = TensorDict(x=torch.zeros(()), y=torch.zeros(()), z=torch.zeros(()))
    mz, zcalls = _counting(["x"], ["z"])
    with set_skip_existing(["y"]):
        m(td)
        mz(td)
    assert len(calls) == 2 and len(zcalls) == 1
    with pytest.raises(RuntimeError, match="decorator"), set_skip_existing(None):
        pass


def test_skip_existing_sequence_and_probabilistic():
    m1, c1 = _counting(["x"], ["h"])
    m2, c2 = _counting(["h"], ["loc"])
    seq = TensorDictSequential(m1, m2)
    td = TensorDict(x=torch.zeros(()))
    seq(td)
    assert len(c1) == 1 and len(c2) == 1
    with set_skip_existing(True):
        seq(td)  # both outputs are there
        td2 = TensorDict(x=torch.zeros(()), h=torch.full((), 5.0))
        seq(td2)  # "h" exists, "loc" does not: only the second runs, from h=5
        assert td2["loc"] == 6
    assert len(c1) == 1 and len(c2) == 2
    prob = ProbabilisticTensorDictModule(["loc"], ["action"], distribution_class=None)
    with set_skip_existing(True):
        td3 = TensorDict(loc=torch.zeros(()), action=torch.full((), 9.0))
        assert prob(td3)["action"] == 9


def test_skip_existing_decorator():
    runs = []

    class Mod(TensorDictModuleBase):
        in_keys = []
        out_keys = ["out"]

        @set_skip_existing()
        def forward(self, tensordict):
            runs.append(1)
            tensordict.set("out", torch.ones(()))
            return tensordict

    class Follows(Mod):
        @set_skip_existing(None)
        def forward(self, tensordict):
            runs.append(2)
            return tensordict

    Mod()(TensorDict(out=torch.zeros(())))
    assert runs == []
    Mod()(TensorDict())
    assert runs == [1]
    Follows()(TensorDict(out=torch.zeros(())))
    assert runs == [1, 2]
    with set_skip_existing(True):
        Follows()(TensorDict(out=torch.zeros(())))
    assert runs == [1, 2]


def test_skip_existing_thread_local():
    seen = {}
    with set_skip_existing(True, thread_local=True):
        t = threading.Thread(target=lambda: seen.setdefault("other", skip_existing()))
        t.start()
        t.join()
        assert skip_existing() is True
    assert seen["other"] is False and skip_existing() is False
