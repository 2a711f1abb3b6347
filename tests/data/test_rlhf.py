"""KL controllers (torchrl.data RLHF names) against the plain update formula."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.data import AdaptiveKLController, ConstantKLController


def _ref(coef: float, kls: list[float], target: float, horizon: int) -> float:
    mean = sum(kls) / len(kls)
    err = min(max(mean / target - 1.0, -0.2), 0.2)
    return coef * (1.0 + err * len(kls) / horizon)


class _Policy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.kl_coef = 0.0


@settings(max_examples=40, deadline=None)
@given(coef=st.floats(1e-3, 10.0), target=st.floats(1e-2, 10.0), horizon=st.integers(1, 10_000),
       batches=st.lists(st.lists(st.floats(0.0, 50.0), min_size=1, max_size=8), min_size=1, max_size=5))
def test_adaptive_matches_formula(coef, target, horizon, batches):
    ctl = AdaptiveKLController(init_kl_coef=coef, target=target, horizon=horizon)
    ref = coef
    for kls in batches:
        ref = _ref(ref, kls, target, horizon)
        assert ctl.update(kls) == pytest.approx(ref, rel=1e-9)
    assert ctl.coef == pytest.approx(ref, rel=1e-9)


def test_adaptive_direction_and_clip():
    up = AdaptiveKLController(init_kl_coef=1.0, target=1.0, horizon=10)
    assert up.update([100.0]) == pytest.approx(1.02)  # error clipped to +0.2
    down = AdaptiveKLController(init_kl_coef=1.0, target=1.0, horizon=10)
    assert down.update([0.0, 0.0]) == pytest.approx(0.96)  # clipped to -0.2, two steps
    same = AdaptiveKLController(init_kl_coef=1.0, target=2.0, horizon=10)
    assert same.update(torch.tensor([1.0, 3.0])) == pytest.approx(1.0)  # mean == target


@pytest.mark.parametrize("make", [
    lambda m: AdaptiveKLController(init_kl_coef=0.3, target=1.0, horizon=5, model=m),
    lambda m: ConstantKLController(kl_coef=0.3, model=m),
])
def test_model_kl_coef_synced(make):
    policy = _Policy()
    ctl = make(policy)
    assert policy.kl_coef == 0.3
    new = ctl.update([4.0])
    assert policy.kl_coef == new == ctl.coef


def test_constant_never_changes():
    ctl = ConstantKLController(kl_coef=0.25)
    for kls in ([0.0], [100.0, 3.0], None):
        assert ctl.update(kls) == 0.25


@pytest.mark.parametrize("cls,kwargs", [
    (AdaptiveKLController, dict(init_kl_coef=0.1, target=1.0, horizon=3)),
    (ConstantKLController, dict(kl_coef=0.1)),
])
def test_model_without_kl_coef_rejected(cls, kwargs):
    with pytest.raises(AttributeError, match="kl_coef"):
        cls(model=torch.nn.Linear(1, 1), **kwargs)


def test_adaptive_bad_input_leaves_state():
    ctl = AdaptiveKLController(init_kl_coef=0.1, target=1.0, horizon=3)
    for bad, msg in ((None, "required"), ([], "empty"), ([float("nan")], "non-finite")):
        with pytest.raises(ValueError, match=msg):
            ctl.update(bad)
    assert ctl.coef == 0.1
    with pytest.raises(ValueError, match="target"):
        AdaptiveKLController(init_kl_coef=0.1, target=0.0, horizon=3)
    with pytest.raises(ValueError, match="horizon"):
        AdaptiveKLController(init_kl_coef=0.1, target=1.0, horizon=0)
