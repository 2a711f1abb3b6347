"""Constructors (``from_*``, ``fromkeys``, ``make_tensordict``, ``merge_tensordicts``):
documented behaviour, round trips, and bad input (typed errors naming the culprit)."""

from __future__ import annotations

import collections
import dataclasses
import json

import numpy as np
import pytest
import torch

from steersman.tensordict import (
    NonTensorStack,
    TensorDict,
    from_any,
    from_csv,
    from_dict,
    from_h5,
    from_json,
    from_namedtuple,
    from_pytree,
    from_struct_array,
    from_tuple,
    fromkeys,
    make_tensordict,
    merge_tensordicts,
)

from .conftest import H5PY_OK

Pt = collections.namedtuple("Pt", ["x", "y"])


# ----------------------------------------------------------------------------- batch-size keywords
@pytest.mark.parametrize("build", [
    lambda **kw: from_dict({"a": torch.zeros(3, 2), "n": {"b": torch.zeros(3, 2, 4)}}, **kw),
    lambda **kw: from_namedtuple(Pt(torch.zeros(3, 2), Pt(torch.zeros(3, 2, 4), torch.zeros(3, 2))), **kw),
    lambda **kw: from_tuple((torch.zeros(3, 2), (torch.zeros(3, 2, 4),)), **kw),
    lambda **kw: from_any({"a": torch.zeros(3, 2)}, **kw),
], ids=["dict", "namedtuple", "tuple", "any"])
def test_batch_size_keywords(build):
    assert build(auto_batch_size=True).batch_size == (3, 2)
    assert build(batch_dims=1).batch_size == (3,)
    assert build(batch_size=[3]).batch_size == (3,)
    assert build(auto_batch_size=False).batch_size == ()
    assert build(device="cpu", batch_size=[3]).device == torch.device("cpu")
    with pytest.raises((RuntimeError, ValueError)):
        build(batch_size=[4])


def test_from_dict_defaults_to_auto_batch_size():
    td = from_dict({"a": torch.zeros(3, 2), "b": {"c": torch.zeros(3)}})
    assert td.batch_size == (3,) and td["b"].batch_size == (3,)
    assert TensorDict.from_dict({"a": torch.zeros(3)}, auto_batch_size=False).batch_size == ()
    with pytest.raises(TypeError, match="list"):
        from_dict([torch.zeros(3)])


def test_namedtuple_round_trip():
    nt = Pt(torch.arange(3.0), Pt(torch.ones(3), torch.zeros(3)))
    td = TensorDict.from_namedtuple(nt, auto_batch_size=True)
    assert td["y", "x"].tolist() == [1, 1, 1]
    back = td.to_namedtuple()
    assert back._fields == ("x", "y") and torch.equal(back.y.x, nt.y.x)
    assert isinstance(td.to_namedtuple(dest_cls=Pt), Pt)
    with pytest.raises(TypeError, match="namedtuple"):
        from_namedtuple((1, 2))


def test_from_tuple_keys():
    td = TensorDict.from_tuple((torch.zeros(2), (torch.ones(2), 3)))
    assert set(td.keys(True, True)) == {"0", ("1", "0"), ("1", "1")}
    assert td["1", "1"] == 3
    with pytest.raises(TypeError, match="tuple"):
        from_tuple([1])


def test_pytree_round_trip():
    tree = {"a": [torch.zeros(3), (torch.ones(3), Pt(torch.ones(3), torch.zeros(3)))], "b": torch.zeros(3, 2)}
    td = from_pytree(tree, batch_size=[3])
    assert td.batch_size == (3,)
    back = td.to_pytree()
    assert isinstance(back["a"], list) and isinstance(back["a"][1], tuple) and isinstance(back["a"][1][1], Pt)
    assert torch.equal(back["a"][1][0], tree["a"][1][0]) and torch.equal(back["b"], tree["b"])
    assert from_pytree([torch.zeros(2), torch.ones(2)]).to_pytree()[1].tolist() == [1, 1]
    with pytest.raises(TypeError, match="strings.*1"):
        from_pytree({1: torch.zeros(2)})
    with pytest.raises(TypeError, match="None.*/a"):
        from_pytree({"a": None})


def test_struct_array_round_trip():
    dt = np.dtype([("a", np.float32), ("b", np.int64, (2,)), ("n", [("c", np.float64)])])
    arr = np.zeros(4, dtype=dt)
    arr["a"] = np.arange(4)
    arr["n"]["c"] = 5
    td = TensorDict.from_struct_array(arr)
    assert td.batch_size == (4,) and td["b"].shape == (4, 2) and td["n", "c"].dtype == torch.float64
    assert td["a"].tolist() == [0, 1, 2, 3]
    arr["a"] = 9  # copied, not shared
    assert td["a"][0] == 0
    back = td.to_struct_array()
    assert back.dtype == dt and back["n"]["c"].tolist() == [5] * 4
    with pytest.raises(TypeError, match="structured"):
        from_struct_array(np.zeros(3))
    with pytest.raises(TypeError, match="'s'"):
        TensorDict({"s": "text"}, []).to_struct_array()


def test_json_round_trip_and_bad_input(tmp_path):
    td = TensorDict({"a": torch.arange(3.0), "n": {"b": torch.ones(3, 2, dtype=torch.int64)},
                     "s": ["x", "y", "z"]}, [3])
    path = tmp_path / "d.json"
    with pytest.raises(ValueError, match="separator"):
        td.to_json(path)
    td.to_json(path, separator=".")
    assert json.loads(path.read_text())[1] == {"a": 1.0, "n.b": [1, 1], "s": "y"}
    back = TensorDict.from_json(path, separator=".", dtype=torch.float64)
    assert back.batch_size == (3,) and back["a"].dtype == torch.float64
    assert torch.equal(back["n", "b"], td["n", "b"]) and back["s"] == ["x", "y", "z"]
    assert isinstance(back.get("s"), NonTensorStack)
    lines = tmp_path / "d.jsonl"
    td.to_json(lines, separator="/", lines=True)
    assert from_json(lines, separator="/", lines=True)["n", "b"].shape == (3, 2)
    bad = tmp_path / "bad.json"
    bad.write_text('[{"a": 1}, {"b": 2}]')
    with pytest.raises(ValueError, match="record 1.*'a', 'b'"):
        from_json(bad)
    bad.write_text("__import__('os')")
    with pytest.raises(ValueError, match="not valid JSON"):
        from_json(bad)
    with pytest.raises(ValueError, match="1-D"):
        TensorDict({"a": torch.zeros(2, 2)}, [2, 2]).to_json(path)


def test_from_csv(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("step,obs.x,name\n0,0.5,a\n1,1.5,b\n")
    td = from_csv(path, separator=".")
    assert td.batch_size == (2,)
    assert td["step"].dtype == torch.int64 and td["obs", "x"].tolist() == [0.5, 1.5]
    assert td["name"] == ["a", "b"]
    path.write_text("a,b\n1\n")
    with pytest.raises(ValueError, match="row 1"):
        from_csv(path)


@pytest.mark.skipif(not H5PY_OK, reason="h5py (optional dependency) is not installed")
def test_from_h5(tmp_path):
    src = TensorDict({"a": torch.arange(4.0), "n": {"b": torch.zeros(4, 2)}}, [4])
    src.to_h5(str(tmp_path / "f.h5"))
    td = TensorDict.from_h5(str(tmp_path / "f.h5"))
    try:
        assert td.batch_size == (4,) and td["a"].tolist() == [0, 1, 2, 3]
        assert from_any(td) is td
    finally:
        td.close()
    td = from_h5(str(tmp_path / "f.h5"), batch_dims=1)
    try:
        assert td.batch_size == (4,)
    finally:
        td.close()


def test_from_any_dispatch():
    @dataclasses.dataclass
    class D:
        obs: torch.Tensor
        n: int

    assert from_any(D(torch.zeros(2, 3), 4), auto_batch_size=True)["n"] == 4
    assert from_any(Pt(torch.zeros(2), torch.zeros(2)))["x"].shape == (2,)
    assert from_any((torch.zeros(2),))["0"].shape == (2,)
    assert from_any([torch.zeros(2)], batch_size=[2]).to_pytree()[0].shape == (2,)
    arr = np.zeros(2, dtype=[("a", np.float32)])
    assert from_any(arr).batch_size == (2,)
    with pytest.raises(TypeError, match="set"):
        from_any({1, 2})


def test_fromkeys_and_make_tensordict():
    td = TensorDict.fromkeys(["a", ("b", "c")], 1)
    assert td["a"] == 1 and td["b", "c"] == 1 and td.batch_size == ()
    v = torch.zeros(2)
    td = fromkeys(["x", "y"], v)
    td["x"] += 1
    assert td["y"].tolist() == [0, 0]  # not the same tensor under every key
    m = make_tensordict({"a": torch.zeros(3, 2)}, b=torch.zeros(3))
    assert m.batch_size == () and set(m.keys()) == {"a", "b"}
    assert make_tensordict(a=torch.zeros(3, 2), auto_batch_size=True).batch_size == (3, 2)
    assert make_tensordict(a=torch.zeros(3, 2), batch_size=[3]).batch_size == (3,)
    with pytest.raises(ValueError, match="'a'"):
        make_tensordict({"a": 1}, a=2)


def test_merge_tensordicts():
    a = TensorDict({"x": torch.zeros(2), "n": {"y": torch.zeros(2)}}, [2])
    b = TensorDict({"x": torch.ones(2), "n": {"z": torch.ones(2)}, "w": torch.ones(2, 3)}, [2])
    m = merge_tensordicts(a, b)
    assert set(m.keys(True, True)) == {"x", ("n", "y"), ("n", "z"), "w"}
    assert m["x"].tolist() == [0, 0] and m["w"] is b["w"]  # first wins; not copied
    assert ("n", "z") not in a.keys(True, True)  # the inputs are unchanged
    m = merge_tensordicts(a, b, callback_exist=lambda *v: sum(v))
    assert m["x"].tolist() == [1, 1]
    m = merge_tensordicts(a, b, callback_exist={("n", "y"): lambda *v: v[0] + 5})
    assert m["x"].tolist() == [0, 0] and m["n", "y"].tolist() == [0, 0]  # ("n","y") only in a
    with pytest.raises(RuntimeError, match="two"):
        merge_tensordicts(a)
    with pytest.raises(ValueError, match="batch size"):
        merge_tensordicts(a, TensorDict({"q": torch.zeros(3)}, [3]))
