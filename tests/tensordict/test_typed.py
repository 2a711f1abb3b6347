"""``TypedTensorDict``: declared fields, checked constructor, operations keep the subclass."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch import Tensor

from steersman.tensordict import TensorDict, TypedTensorDict, lazy_stack


class State(TypedTensorDict):
    eta: Tensor
    X: Tensor


class Masked(State):
    mask: Tensor = None
    step: Tensor = torch.zeros(())


class Frozen(TypedTensorDict["frozen"]):
    a: Tensor


def make(cls=State):
    return cls(eta=torch.arange(5.0).unsqueeze(-1).expand(5, 3).clone(), X=torch.ones(5, 4), batch_size=[5])


def test_fields_and_attribute_access():
    s = make()
    assert State.fields() == ["eta", "X"] and Masked.fields() == ["eta", "X", "mask", "step"]
    assert s.eta is s["eta"] and s.X.shape == (5, 4)
    s.X = torch.zeros(5, 4)  # an attribute write is a set
    assert s["X"].sum() == 0
    m = Masked(eta=torch.zeros(2, 3), X=torch.zeros(2, 4), batch_size=[])
    assert m.mask is None and "mask" not in m.keys() and m.step.item() == 0
    m.mask = torch.ones(2, dtype=torch.bool)
    assert m["mask"].all() and dict(**m).keys() == {"eta", "X", "step", "mask"}
    with pytest.raises(AttributeError):
        s.not_a_field = 1


def test_constructor_checks():
    with pytest.raises(TypeError, match="missing required field\\(s\\): X"):
        State(eta=torch.zeros(5, 3), batch_size=[5])
    with pytest.raises(TypeError, match="unexpected field\\(s\\): Y"):
        State(eta=torch.zeros(5, 3), X=torch.zeros(5, 4), Y=torch.zeros(5), batch_size=[5])
    with pytest.raises(ValueError, match="batch"):
        State(eta=torch.zeros(4, 3), X=torch.zeros(5, 4), batch_size=[5])
    with pytest.raises(AttributeError, match="shadows a TensorDict attribute"):
        class Bad(TypedTensorDict):
            sum: Tensor

    class Ok(TypedTensorDict, shadow=True):
        sum: Tensor

    assert Ok(sum=torch.ones(2)).sum.tolist() == [1, 1]
    with pytest.warns(DeprecationWarning):
        class Old(TypedTensorDict, autocast=True):
            a: Tensor
    with pytest.raises(ValueError, match="options are"):
        TypedTensorDict["fast"]


@pytest.mark.parametrize("op", [
    lambda s: s.clone(), lambda s: s[1:3], lambda s: s[0], lambda s: s.to(torch.float64),
    lambda s: s + 1, lambda s: s.reshape(5, 1), lambda s: s.unsqueeze(0), lambda s: s.select("eta"),
    lambda s: torch.stack([s, s]), lambda s: torch.cat([s, s]), lambda s: s.apply(lambda t: t * 2),
    lambda s: s.unbind(0)[2], lambda s: s.mean(0), lambda s: pickle.loads(pickle.dumps(s)),
], ids=["clone", "slice", "int", "to", "add", "reshape", "unsqueeze", "select", "stack", "cat", "apply",
        "unbind", "mean", "pickle"])
def test_operations_keep_the_subclass(op):
    s = Masked(eta=torch.arange(10.0).reshape(5, 2), X=torch.ones(5, 4), step=torch.arange(5.0), batch_size=[5])
    out = op(s)
    assert type(out) is Masked
    ref = op(s.to_tensordict())
    assert type(ref) is TensorDict and set(out.keys(True, True)) == set(ref.keys(True, True))
    for k in ref.keys(True, True):
        assert torch.equal(out[k], ref[k]), k


def test_from_tensordict_shares_and_frozen():
    td = TensorDict(eta=torch.zeros(5, 3), X=torch.zeros(5, 4), batch_size=[5])
    view = State.from_tensordict(td)
    view.eta += 1
    assert td["eta"].sum() == 15 and type(view) is State
    with pytest.raises(TypeError, match="missing required field"):
        State.from_tensordict(TensorDict(eta=torch.zeros(5, 3), batch_size=[5]))
    with pytest.raises(TypeError, match="to_tensordict"):
        State.from_tensordict(lazy_stack([td, td]))
    f = Frozen(a=torch.zeros(2), batch_size=[2])
    assert f.is_locked
    with pytest.raises(RuntimeError, match="locked"):
        f["b"] = torch.zeros(2)
    assert type(f.to_tensordict()) is TensorDict
