"""``Composite``: nested keys, entry access, TensorDict values, editing, devices, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from steersman.data import (
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    NonTensor,
    OneHot,
    Unbounded,
)
from steersman.tensordict import TensorDict


def make(B: tuple = (4,)) -> Composite:
    return Composite(
        observation=Bounded(-1.0, 1.0, shape=(*B, 3)),
        action=OneHot(2, shape=(*B, 2)),
        next=Composite(
            reward=Unbounded(shape=(*B, 1)),
            done=Categorical(2, shape=(*B, 1), dtype=torch.bool),
            state=Composite(h=Unbounded(shape=(*B, 5, 2)), shape=(*B, 5)),
            shape=B,
        ),
        shape=B,
    )


# ---------------------------------------------------------------------- keys
def test_keys_items_values_options():
    spec = make()
    assert list(spec.keys()) == ["observation", "action", "next"]
    assert list(spec.keys(include_nested=True)) == [
        "observation", "action", "next", ("next", "reward"), ("next", "done"),
        ("next", "state"), ("next", "state", "h"),
    ]
    leaves = list(spec.keys(True, True))
    assert leaves == ["observation", "action", ("next", "reward"), ("next", "done"), ("next", "state", "h")]
    assert list(spec.keys(leaves_only=True)) == ["observation", "action"]
    assert len(spec.keys(True, True)) == 5 and len(spec) == 3
    assert [k for k, _ in spec.items(True, True)] == leaves
    assert spec.values(True, True)[2] is spec["next", "reward"]
    assert list(spec) == ["observation", "action", "next"]


def test_keys_contains_nested_keys():
    spec = make()
    assert ("next", "reward") in spec.keys(True)
    assert ("next", "reward") not in spec.keys()  # nested keys need include_nested
    assert "next" in spec.keys(True) and "next" not in spec.keys(True, True)
    assert ("next", ("state", "h")) in spec.keys(True, True)  # keys are unravelled
    assert ("next", "nope") not in spec.keys(True) and 3 not in spec.keys()
    assert ("next", "done") in spec and "nope" not in spec


def test_keys_is_leaf_option():
    spec = make()
    as_leaf = list(spec.keys(True, True, is_leaf=lambda cls: issubclass(cls, (Composite, Unbounded))))
    assert "next" in as_leaf and ("next", "reward") not in as_leaf


# ---------------------------------------------------------------------- entries
def test_get_set_del_with_nested_keys():
    spec = make()
    assert spec["next", "state", "h"].shape == (4, 5, 2)
    assert spec.get(("next", "missing"), None) is None
    with pytest.raises(KeyError, match="Did you mean 'reward'"):
        spec["next", "rewrd"]
    spec["next", "extra", "x"] = Unbounded(shape=(4, 7))  # creates ("next", "extra")
    assert isinstance(spec["next", "extra"], Composite) and spec["next", "extra"].shape == (4,)
    del spec["next", "extra", "x"]
    assert list(spec["next", "extra"].keys()) == []
    spec.del_(("next", "extra"))
    assert ("next", "extra") not in spec
    popped = spec.pop("action")
    assert isinstance(popped, OneHot) and "action" not in spec
    assert spec.pop("action", "default") == "default"
    with pytest.raises(KeyError):
        spec.pop("action")
    with pytest.raises(KeyError):
        del spec["nope"]


def test_set_validates_shape_type_and_path():
    spec = make()
    with pytest.raises(ValueError, match=r"key 'bad' has shape \[3\], which does not start with the Composite's batch shape \[4\]"):
        spec["bad"] = Unbounded(shape=(3,))
    with pytest.raises(ValueError, match="key 'bad'"):
        spec["next", "bad"] = Unbounded(shape=(3,))
    with pytest.raises(TypeError, match="must be specs, got Tensor"):
        spec["bad"] = torch.zeros(4)
    with pytest.raises(KeyError, match="is a BoundedContinuous, not a Composite"):
        spec["observation", "x"] = Unbounded(shape=(4,))
    with pytest.raises(TypeError, match="strings"):
        spec[0] = Unbounded(shape=(4,))
    with pytest.raises(TypeError, match="dict of specs"):
        Composite([Unbounded()])


def test_dict_values_become_composites():
    spec = Composite({"a": {"b": Unbounded(shape=(2, 1))}}, shape=(2,))
    assert isinstance(spec["a"], Composite) and spec["a"].shape == (2,)
    assert spec["a", "b"].shape == (2, 1)
    copy = Composite(spec, shape=(2,))
    assert copy == spec


def test_getitem_index_applies_to_every_entry():
    spec = make((4, 3))
    sub = spec[1:3, 0]
    assert sub.shape == (2,)
    assert sub["observation"].shape == (2, 3) and sub["next", "state", "h"].shape == (2, 5, 2)
    td = spec.rand()
    assert sub.is_in(td[1:3, 0])
    assert spec[..., 0].shape == (4,) and spec[None].shape == (1, 4, 3)
    with pytest.raises(IndexError, match="cannot index Composite"):
        spec[0, 0, 0]


# ---------------------------------------------------------------------- values
def test_rand_zero_one_give_tensordicts():
    spec = make()
    for td in (spec.rand((2,)), spec.zero((2,)), spec.one((2,))):
        assert type(td) is TensorDict and td.batch_size == (2, 4)
        assert td["next"].batch_size == (2, 4) and td["next", "state"].batch_size == (2, 4, 5)
        assert td["next", "state", "h"].shape == (2, 4, 5, 2)
        assert spec.is_in(td)
    zero = spec.zero()
    assert not zero["observation"].any() and not zero["next", "done"].any()
    assert torch.equal(zero["action"], torch.tensor([True, False]).expand(4, 2))


def test_device_of_values():
    spec = make().to("cpu")
    assert spec.device == torch.device("cpu") and spec.rand().device == torch.device("cpu")
    assert all(s.device == torch.device("cpu") for s in spec.values(True))
    assert make().rand().device is None  # mixed-device Composite -> device-less TensorDict


def test_is_in_ignores_extra_entries_and_rejects_missing_ones():
    spec = make()
    td = spec.rand()
    td["unrelated"] = torch.zeros(4)
    assert spec.is_in(td)
    del td["next", "done"]
    assert not spec.is_in(td)
    assert not spec.is_in(torch.zeros(4))
    assert Composite().is_in(TensorDict({}, []))


def test_is_in_accepts_plain_dicts():
    spec = Composite(a=Bounded(0.0, 1.0, shape=(2,)), b={"c": Categorical(3)})
    assert spec.is_in({"a": torch.zeros(2), "b": {"c": torch.tensor(2)}})
    assert not spec.is_in({"a": torch.zeros(2), "b": {"c": torch.tensor(3)}})
    with pytest.raises(ValueError, match=r"key \('b', 'c'\): value is not in Categorical"):
        spec.assert_is_in({"a": torch.zeros(2), "b": {"c": torch.tensor(3)}})
    with pytest.raises(ValueError, match=r"key 'b': expected a TensorDict \(or a dict\), got Tensor"):
        spec.assert_is_in({"a": torch.zeros(2), "b": torch.zeros(1)})


def test_assert_is_in_names_key_spec_and_values():
    spec = make()
    td = spec.rand()
    td["observation"] = torch.full((4, 3), 3.0)
    with pytest.raises(ValueError) as info:
        spec.assert_is_in(td)
    msg = str(info.value)
    assert "key 'observation'" in msg and "BoundedContinuous" in msg and "3.0" in msg and "[-1.0, 1.0]" in msg
    td = spec.rand()
    td["next", "done"] = torch.zeros(4, 1)
    with pytest.raises(ValueError, match=r"key \('next', 'done'\).*dtype torch.float32"):
        spec.assert_is_in(td)


def test_project_is_in_place():
    spec = make()
    td = spec.rand()
    td["observation"] = torch.full((4, 3), 3.0)
    td["next", "state", "h"] = torch.full((4, 5, 2), float("nan"))  # Unbounded: left alone
    out = spec.project(td)
    assert out is td and torch.equal(td["observation"], torch.ones(4, 3))
    assert spec.is_in(td)
    with pytest.raises(KeyError):
        spec.project(TensorDict({}, [4]))


def test_encode_and_to_numpy():
    spec = make((2,))
    raw = {
        "observation": np.zeros((2, 3)),
        "action": np.array([1, 0]),  # indices -> one-hot
        "next": {"reward": [[1.0], [2.0]], "done": np.array([[True], [False]])},
    }
    td = spec.encode(raw)
    assert type(td) is TensorDict and td.batch_size == (2,)
    assert td["observation"].dtype == torch.float32
    assert torch.equal(td["action"], torch.tensor([[False, True], [True, False]]))
    assert torch.equal(td["next", "reward"], torch.tensor([[1.0], [2.0]]))
    with pytest.raises(KeyError, match="Did you mean 'action'"):
        spec.encode({"acton": np.zeros(2)})
    assert spec.encode(td) is td
    full = spec.rand()
    as_np = spec.to_numpy(full)
    assert isinstance(as_np["next"]["state"]["h"], np.ndarray) and as_np["action"].shape == (2,)
    assert spec.is_in(spec.encode(as_np))


# ---------------------------------------------------------------------- shape ops
def test_expand_squeeze_unsqueeze_reshape():
    spec = make((4,))
    ex = spec.expand(3, 4)
    assert ex.shape == (3, 4) and ex["next", "state", "h"].shape == (3, 4, 5, 2)
    assert ex.rand().batch_size == (3, 4)
    assert ex.unsqueeze(1).shape == (3, 1, 4) and ex.unsqueeze(1)["action"].shape == (3, 1, 4, 2)
    assert ex.unsqueeze(-1).shape == (3, 4, 1) and ex.unsqueeze(-1)["action"].shape == (3, 4, 1, 2)
    assert ex.unsqueeze(1).squeeze() == ex and ex.unsqueeze(1).squeeze(1) == ex
    assert ex.reshape(12).shape == (12,) and ex.reshape(-1)["next", "state", "h"].shape == (12, 5, 2)
    assert [s.shape for s in ex.unbind(0)] == [torch.Size([4])] * 3
    with pytest.raises(ValueError, match="cannot expand"):
        spec.expand(5)
    with pytest.raises(IndexError, match="out of range"):
        spec.squeeze(3)


# ---------------------------------------------------------------------- editing
def test_select_exclude_update_empty():
    spec = make()
    sel = spec.select("action", ("next", "state", "h"))
    assert list(sel.keys(True, True)) == ["action", ("next", "state", "h")]
    assert sel["next", "state"].shape == (4, 5)  # intermediate shapes kept
    assert "observation" in spec  # the original is untouched
    with pytest.raises(KeyError):
        spec.select("nope")
    assert list(spec.select("nope", "action", strict=False).keys()) == ["action"]
    exc = spec.exclude(("next", "reward"), "action", "nope")
    assert ("next", "reward") not in exc and "action" not in exc and ("next", "done") in exc
    assert ("next", "reward") in spec
    spec.update({"action": Categorical(2, shape=(4,)), "next": {"truncated": Categorical(2, (4, 1), dtype=torch.bool)}})
    assert isinstance(spec["action"], Categorical)
    assert ("next", "truncated") in spec and ("next", "reward") in spec  # merged, not replaced
    empty = spec.empty()
    assert empty.shape == spec.shape and len(empty) == 0 and empty.is_empty()
    assert Composite(a=Composite()).is_empty(recurse=True) and not Composite(a=Composite()).is_empty()


def test_flatten_unflatten_keys():
    spec = make()
    flat = spec.flatten_keys()
    assert "next.state.h" in flat.keys() and flat["next.reward"] is spec["next", "reward"]
    back = flat.unflatten_keys()
    assert set(back.keys(True, True)) == set(spec.keys(True, True))


def test_lock():
    spec = make().lock_()
    assert spec.is_locked and spec["next"].is_locked
    with pytest.raises(RuntimeError, match="locked"):
        spec["new"] = Unbounded(shape=(4,))
    with pytest.raises(RuntimeError, match="locked"):
        spec["next", "new"] = Unbounded(shape=(4,))
    with pytest.raises(RuntimeError, match="locked"):
        del spec["action"]
    spec.unlock_()
    spec["new"] = Unbounded(shape=(4,))
    assert "new" in spec


def test_shape_setter():
    spec = Composite(a=Unbounded(shape=(4, 3)))
    spec.shape = (4,)
    assert spec.shape == (4,) and spec.rand().batch_size == (4,)
    with pytest.raises(ValueError, match="key 'a' has shape"):
        spec.shape = (5,)


def test_eq_ignores_key_order_and_compares_leaves():
    a = Composite(x=Unbounded(2), y=Categorical(3))
    b = Composite(y=Categorical(3), x=Unbounded(2))
    assert a == b
    assert a != Composite(x=Unbounded(2), y=Categorical(4))
    assert a != Composite(x=Unbounded(2))
    assert a != Composite(x=Unbounded(2), y=Categorical(3), device="cpu")


def test_clone_is_deep():
    spec = Composite(a=Categorical(3, shape=(2,)), b={"c": Bounded(0.0, 1.0, shape=(2,))})
    c = spec.clone()
    assert c == spec
    c["a"].update_mask(torch.tensor([True, False, False]))
    c["b"]["d"] = Unbounded(1)
    assert spec["a"].mask is None and "d" not in spec["b"]
    assert c["b", "c"].low.data_ptr() != spec["b", "c"].low.data_ptr()


def test_to_dtype_casts_leaves():
    spec = Composite(a=Bounded(0.0, 1.0, shape=(2,)), t=NonTensor(shape=(), example_data=1))
    cast = spec.to(torch.float64)
    assert cast["a"].dtype == torch.float64 and cast["t"] == spec["t"]


def test_nontensor_entries():
    spec = Composite(text=NonTensor(shape=(3,), example_data="hi"), x=Unbounded(shape=(3, 1)), shape=(3,))
    td = spec.rand()
    assert td["text"] == "hi" and td.get("text").batch_size == (3,)
    assert spec.is_in(td)
    assert spec.encode({"text": "hey", "x": np.zeros((3, 1))})["text"] == "hey"


def test_repr_is_nested():
    text = repr(make())
    assert text.startswith("Composite(\n    observation: BoundedContinuous(")
    assert "    next: Composite(\n        reward: UnboundedContinuous(" in text
    assert text.endswith("shape=[4])")


def test_multicategorical_in_composite_index():
    spec = Composite(a=MultiCategorical([2, 3], shape=(4, 2)), shape=(4,))
    assert spec[0]["a"].shape == (2,) and spec[0].is_in(spec.rand()[0])


def test_type_check():
    spec = make()
    td = spec.rand()
    spec.type_check(td)
    td["next", "reward"] = td["next", "reward"].double()
    with pytest.raises(TypeError, match="key 'reward'"):
        spec.type_check(td)
    spec.type_check(td, ["observation"])
