"""Choice spec: draws from one of several specs (or fixed non-tensor values)."""

from __future__ import annotations

import pytest
import torch

from steersman.data import Bounded, Categorical, Choice, OneHot, Unbounded
from steersman.tensordict import NonTensorData

SPEC_CHOICES = {
    "bounded": lambda: [Bounded(0.0, 1.0, shape=(2,)), Bounded(10.0, 11.0, shape=(2,))],
    "categorical": lambda: [Categorical(3, shape=(2,)), Categorical(5, shape=(2,))],
    "onehot": lambda: [OneHot(3), OneHot(3), OneHot(3)],
}


def _which(choices, x):
    """Indices of the choices that accept ``x`` (plain reference: each spec's own is_in)."""
    return [i for i, c in enumerate(choices) if c.is_in(x)]


@pytest.mark.parametrize("kind", list(SPEC_CHOICES))
@pytest.mark.parametrize("batch", [None, (4,)])
def test_choice_rand_draws_every_choice_and_only_valid_values(kind, batch):
    torch.manual_seed(0)
    choices = SPEC_CHOICES[kind]()
    spec = Choice(choices)
    seen = set()
    for _ in range(60):
        x = spec.rand(batch)
        assert x.shape == (*(batch or ()), *choices[0].shape)
        hits = _which(choices, x)
        assert hits and spec.is_in(x)
        seen.update(hits)
    assert seen == set(range(len(choices)))  # every choice was drawn (or accepts the draws)
    assert torch.equal(spec.zero(batch), choices[0].zero(batch))
    assert torch.equal(spec.one(batch), choices[1].one(batch))


def test_choice_is_in_is_the_union():
    spec = Choice(SPEC_CHOICES["bounded"]())
    assert spec.is_in(torch.tensor([0.5, 0.5])) and spec.is_in(torch.tensor([10.5, 10.2]))
    assert not spec.is_in(torch.tensor([5.0, 5.0]))
    assert not spec.is_in(torch.tensor([0.5, 10.5]))  # each value must fit one choice entirely
    with pytest.raises(ValueError, match="matches none of the 2 choices"):
        spec.assert_is_in(torch.tensor([5.0, 5.0]))
    with pytest.raises(NotImplementedError, match="nearest"):
        spec.project(torch.zeros(2))


def test_choice_shape_ops_cardinality_eq():
    spec = Choice(SPEC_CHOICES["categorical"]())
    assert spec.shape == (2,) and spec.num_choices == 2
    assert spec.cardinality() == 3 + 5  # each Categorical counts its n, as in TorchRL
    e = spec.expand(4, 2)
    assert e.shape == (4, 2) and e.rand().shape == (4, 2)
    assert spec.unsqueeze(0).shape == (1, 2)
    assert spec == spec.clone() and spec != Choice(SPEC_CHOICES["categorical"]()[:1])
    assert Choice([OneHot(3)]).one().equal(OneHot(3).one())  # one choice: one() uses it


def test_choice_non_tensor_data():
    torch.manual_seed(0)
    words = ["left", "right", "up"]
    spec = Choice([NonTensorData(w) for w in words])
    drawn = {spec.rand().data for _ in range(40)}
    assert drawn == set(words)
    assert spec.is_in(NonTensorData("up")) and spec.is_in("left") and not spec.is_in(NonTensorData("down"))
    assert spec.zero().data == "left" and spec.one().data == "right"
    assert spec.cardinality() == 3


@pytest.mark.parametrize("choices,err,match", [
    ([], TypeError, "non-empty"),
    ((Unbounded(2),), TypeError, "non-empty list"),
    ([torch.zeros(2)], TypeError, "choice 0 is a Tensor"),
    ([Bounded(0.0, 1.0, shape=(2,)), Unbounded(2)], TypeError, "choice 1"),
    ([Bounded(0.0, 1.0, shape=(2,)), Bounded(0.0, 1.0, shape=(3,))], ValueError, "shape"),
    ([Bounded(0.0, 1.0, shape=(2,)), Bounded(0.0, 1.0, shape=(2,), dtype=torch.float64)], ValueError, "dtype"),
])
def test_choice_constructor_errors(choices, err, match):
    with pytest.raises(err, match=match):
        Choice(choices)
