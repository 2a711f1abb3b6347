"""Value estimators against a plain Python loop reference, plus gradients, keys and errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.objectives.value import (
    GAE,
    TD0Estimator,
    TD1Estimator,
    TDLambdaEstimator,
    functional,
    normalize_advantage,
)
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import TensorDictModule


# --------------------------------------------------------------- reference (plain loops)
def ref_row(kind: str, gamma: float, lmbda: float, v, nv, r, done, term) -> tuple[list, list]:
    """(advantage, value_target) of one time row, written step by step from the definitions."""
    T = len(r)
    adv, tgt = [0.0] * T, [0.0] * T
    if kind == "gae":
        a_next = 0.0
        for t in reversed(range(T)):
            boot = 0.0 if term[t] else nv[t]
            delta = r[t] + gamma * boot - v[t]
            cont = 0.0 if done[t] else 1.0
            a_next = delta + gamma * lmbda * cont * a_next
            adv[t], tgt[t] = a_next, a_next + v[t]
        return adv, tgt
    if kind == "td0":
        lmbda = 0.0
    elif kind == "td1":
        lmbda = 1.0
    g = 0.0 if term[T - 1] else nv[T - 1]  # the batch ends: bootstrap
    for t in reversed(range(T)):
        boot = 0.0 if term[t] else nv[t]
        if done[t]:
            g = boot
        g = r[t] + gamma * ((1 - lmbda) * boot + lmbda * g)
        tgt[t], adv[t] = g, g - v[t]
    return adv, tgt


def reference(kind, gamma, lmbda, v, nv, r, done, term):
    """Applies :func:`ref_row` to every row of ``[*B, T, 1]`` tensors (float64 result)."""
    shape = r.shape
    rows = [x.reshape(-1, shape[-2]).double().tolist() for x in (v[..., 0], nv[..., 0], r[..., 0])]
    drows = [x.reshape(-1, shape[-2]).tolist() for x in (done[..., 0], term[..., 0])]
    adv, tgt = [], []
    for i in range(len(rows[0])):
        a, g = ref_row(kind, gamma, lmbda, rows[0][i], rows[1][i], rows[2][i], drows[0][i], drows[1][i])
        adv.append(a)
        tgt.append(g)
    return (torch.tensor(adv, dtype=torch.float64).reshape(shape), torch.tensor(tgt, dtype=torch.float64).reshape(shape))


def random_data(seed: int, shape: tuple[int, ...], p_done: float = 0.2, dtype=torch.float32):
    """Values/rewards and done/terminated masks of shape ``[*shape, 1]``; terminated ⊂ done,
    some done steps are truncations; time rows start and end mid-trajectory."""
    g = torch.Generator().manual_seed(seed)
    full = (*shape, 1)
    v, nv, r = (torch.randn(full, generator=g, dtype=dtype) for _ in range(3))
    done = torch.rand(full, generator=g) < p_done
    term = done & (torch.rand(full, generator=g) < 0.5)
    return v, nv, r, done, term


def functional_call(kind, vectorized, gamma, lmbda, v, nv, r, done, term):
    F = functional
    if kind == "gae":
        fn = F.vec_generalized_advantage_estimate if vectorized else F.generalized_advantage_estimate
        return fn(gamma, lmbda, v, nv, r, done, term)
    if kind == "td0":
        tgt = F.td0_return_estimate(gamma, nv, r, term)
    elif kind == "td1":
        tgt = (F.vec_td1_return_estimate if vectorized else F.td1_return_estimate)(gamma, nv, r, done, term)
    else:
        fn = F.vec_td_lambda_return_estimate if vectorized else F.td_lambda_return_estimate
        tgt = fn(gamma, lmbda, nv, r, done, term)
    return tgt - v, tgt


KINDS = ["td0", "td1", "tdlambda", "gae"]


# ------------------------------------------------------------------- functional = reference
@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    vectorized=st.booleans(),
    lead=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    T=st.integers(1, 40),
    gamma=st.floats(0.0, 1.0),
    lmbda=st.floats(0.0, 1.0),
    p_done=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_functional_matches_loop_reference(kind, vectorized, lead, T, gamma, lmbda, p_done, seed):
    data = random_data(seed, (*lead, T), p_done)
    adv, tgt = functional_call(kind, vectorized, gamma, lmbda, *data)
    ref_adv, ref_tgt = reference(kind, gamma, lmbda, *data)
    torch.testing.assert_close(tgt.double(), ref_tgt, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(adv.double(), ref_adv, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_time_dim_not_second_to_last(kind):
    """``time_dim`` picks the time axis: [T, B, 1] with time_dim=0 equals [B, T, 1]."""
    data = random_data(0, (3, 17))
    adv, tgt = functional_call(kind, True, 0.9, 0.8, *data)
    moved = [x.transpose(0, 1) for x in data]
    if kind == "td0":
        return  # no time dim
    F = functional
    if kind == "gae":
        adv_t, _ = F.vec_generalized_advantage_estimate(0.9, 0.8, *moved, time_dim=0)
    elif kind == "td1":
        adv_t = F.vec_td1_return_estimate(0.9, *moved[1:], time_dim=0) - moved[0]
    else:
        adv_t = F.vec_td_lambda_return_estimate(0.9, 0.8, *moved[1:], time_dim=0) - moved[0]
    torch.testing.assert_close(adv_t.transpose(0, 1), adv)


def test_long_horizon_is_stable():
    """T=500 with γλ=0.999 (and γ=1, λ=1): the scan stays within float32 rounding."""
    for gamma, lmbda in ((0.999, 1.0), (1.0, 0.999), (1.0, 1.0)):
        data = random_data(1, (2, 500), p_done=0.002)
        adv, _ = functional.vec_generalized_advantage_estimate(gamma, lmbda, *data)
        ref_adv, _ = reference("gae", gamma, lmbda, *data)
        assert torch.isfinite(adv).all()
        torch.testing.assert_close(adv.double(), ref_adv, rtol=1e-4, atol=2e-3)


def test_invariants_between_estimators():
    v, nv, r, done, term = random_data(3, (4, 30))
    # consistent values: V(s') of step t is V(s) of step t+1 inside a trajectory
    nv = torch.where(done, nv, torch.cat([v[:, 1:], nv[:, -1:]], 1))
    F = functional
    # GAE(λ=1) advantage = TD(1) return - V ; GAE(λ=0) = TD(0) - V ; TD(λ=0) = TD(0)
    adv1, _ = F.vec_generalized_advantage_estimate(0.9, 1.0, v, nv, r, done, term)
    torch.testing.assert_close(adv1, F.vec_td1_return_estimate(0.9, nv, r, done, term) - v)
    adv0, _ = F.vec_generalized_advantage_estimate(0.9, 0.0, v, nv, r, done, term)
    torch.testing.assert_close(adv0, F.td0_return_estimate(0.9, nv, r, term) - v)
    torch.testing.assert_close(F.vec_td_lambda_return_estimate(0.9, 0.0, nv, r, done, term), F.td0_return_estimate(0.9, nv, r, term))


def test_truncation_bootstraps_termination_does_not():
    r = torch.zeros(1, 2, 1)
    nv = torch.full((1, 2, 1), 5.0)
    v = torch.zeros(1, 2, 1)
    done = torch.tensor([True, True]).view(1, 2, 1)
    term = torch.tensor([False, True]).view(1, 2, 1)  # step 0 truncated, step 1 terminated
    adv, _ = functional.vec_generalized_advantage_estimate(0.5, 0.9, v, nv, r, done, term)
    assert adv.flatten().tolist() == [2.5, 0.0]


def test_tensor_gamma_per_step():
    """A per-step γ (same shape as the reward) follows the same recursion."""
    v, nv, r, done, term = random_data(4, (2, 9))
    gamma = torch.rand(2, 9, 1)
    adv, _ = functional.vec_generalized_advantage_estimate(gamma, 0.7, v, nv, r, done, term)
    adv_loop, _ = functional.generalized_advantage_estimate(gamma, 0.7, v, nv, r, done, term)
    torch.testing.assert_close(adv, adv_loop)


def test_functional_shape_mismatch_raises():
    v, nv, r, done, term = random_data(0, (2, 5))
    with pytest.raises(ValueError, match="reward has shape \\[2, 5\\] but state_value has \\[2, 5, 1\\]"):
        functional.vec_generalized_advantage_estimate(0.9, 0.9, v, nv, r[..., 0], done, term)


def test_functional_gradients_match_loop():
    data = list(random_data(5, (3, 12)))
    grads = []
    for vec in (True, False):
        v = data[0].clone().requires_grad_(True)
        nv = data[1].clone().requires_grad_(True)
        fn = functional.vec_generalized_advantage_estimate if vec else functional.generalized_advantage_estimate
        adv, tgt = fn(0.95, 0.9, v, nv, *data[2:])
        (adv * torch.linspace(-1, 1, adv.numel()).view_as(adv)).sum().backward()
        grads.append((v.grad, nv.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    torch.testing.assert_close(grads[0][1], grads[1][1])
    # the next value of a terminated step gets no gradient
    term = data[4]
    assert (grads[0][1][term] == 0).all()


def test_vec_gae_compiles_fullgraph():
    data = random_data(6, (4, 16))
    compiled = torch.compile(functional.vec_generalized_advantage_estimate, fullgraph=True, backend="aot_eager")
    adv_c, tgt_c = compiled(0.99, 0.95, *data)
    adv, tgt = functional.vec_generalized_advantage_estimate(0.99, 0.95, *data)
    torch.testing.assert_close(adv_c, adv)
    torch.testing.assert_close(tgt_c, tgt)


@pytest.mark.slow
def test_vec_gae_compiles_fullgraph_inductor():
    data = random_data(6, (4, 16))
    compiled = torch.compile(functional.vec_generalized_advantage_estimate, fullgraph=True)
    adv_c, _ = compiled(0.99, 0.95, *data)
    torch.testing.assert_close(adv_c, functional.vec_generalized_advantage_estimate(0.99, 0.95, *data)[0])


# ------------------------------------------------------------------------ estimator modules
def make_estimator(kind, **kw):
    if kind == "td0":
        return TD0Estimator(gamma=0.9, **kw)
    if kind == "td1":
        return TD1Estimator(gamma=0.9, **kw)
    if kind == "tdlambda":
        return TDLambdaEstimator(gamma=0.9, lmbda=0.8, **kw)
    return GAE(gamma=0.9, lmbda=0.8, **kw)


def make_batch(seed: int, shape: tuple[int, ...], obs_dim: int = 3) -> TensorDict:
    v, nv, r, done, term = random_data(seed, shape)
    g = torch.Generator().manual_seed(seed + 1)
    return TensorDict(
        {
            "obs": torch.randn(*shape, obs_dim, generator=g),
            "state_value": v,
            "next": {
                "obs": torch.randn(*shape, obs_dim, generator=g),
                "state_value": nv,
                "reward": r,
                "done": done,
                "terminated": term,
                "truncated": done & ~term,
            },
        },
        list(shape),
    )


def make_critic(seed: int = 0) -> TensorDictModule:
    torch.manual_seed(seed)
    return TensorDictModule(torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)), ["obs"], ["state_value"])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", [(7,), (3, 11), (2, 3, 5)])
@pytest.mark.parametrize("vectorized", [True, False])
def test_estimator_reads_values_from_batch(kind, shape, vectorized):
    td = make_batch(0, shape)
    est = make_estimator(kind, vectorized=vectorized)
    est(td)
    ref_adv, ref_tgt = reference(
        kind, 0.9, 0.8, td["state_value"], td["next", "state_value"], td["next", "reward"], td["next", "done"], td["next", "terminated"]
    )
    torch.testing.assert_close(td["value_target"].double(), ref_tgt, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(td["advantage"].double(), ref_adv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(est.value_estimate(td), td["value_target"])


def test_estimator_time_dim_option():
    td = make_batch(0, (4, 6))
    est = GAE(gamma=0.9, lmbda=0.8)
    est(td)
    td_t = td.transpose(0, 1).clone()
    GAE(gamma=0.9, lmbda=0.8, time_dim=0)(td_t)
    torch.testing.assert_close(td_t["advantage"].transpose(0, 1), td["advantage"])


def test_td0_without_time_dim():
    td = make_batch(0, (5,))
    TD0Estimator(gamma=0.9)(td)
    torch.testing.assert_close(
        td["value_target"], td["next", "reward"] + 0.9 * (~td["next", "terminated"]) * td["next", "state_value"]
    )


@pytest.mark.parametrize("kind", KINDS)
def test_estimator_with_network_equals_precomputed_values(kind):
    critic = make_critic()
    td = make_batch(1, (3, 8))
    est = make_estimator(kind, value_network=critic)
    out = est(td.clone())
    with torch.no_grad():
        td["state_value"] = critic(td.select("obs"))["state_value"]
        td["next", "state_value"] = critic(td["next"].select("obs"))["state_value"]
    expected = make_estimator(kind)(td)
    torch.testing.assert_close(out["advantage"], expected["advantage"])
    torch.testing.assert_close(out["value_target"], expected["value_target"])
    # the values the network computed are in the batch
    torch.testing.assert_close(out["state_value"], td["state_value"])


@pytest.mark.parametrize("kind", KINDS)
def test_shifted_one_call_equals_two_calls(kind):
    calls = []
    critic = make_critic()
    critic.register_forward_hook(lambda *a: calls.append(1))
    td = make_batch(2, (3, 8)).exclude("state_value", ("next", "state_value"))
    a = make_estimator(kind, value_network=critic, shifted=True)(td.clone())
    assert len(calls) == 1
    b = make_estimator(kind, value_network=critic)(td.clone())
    assert len(calls) == 3
    torch.testing.assert_close(a["advantage"], b["advantage"])
    torch.testing.assert_close(a["value_target"], b["value_target"])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("differentiable", [False, True])
def test_gradients_flow_only_when_differentiable(kind, differentiable):
    critic = make_critic()
    td = make_batch(3, (3, 8)).exclude("state_value", ("next", "state_value"))
    est = make_estimator(kind, value_network=critic, differentiable=differentiable)
    est(td)
    assert td["advantage"].requires_grad == differentiable
    assert td["value_target"].requires_grad == differentiable
    if differentiable:
        td["value_target"].sum().backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in critic.parameters())


def test_gradients_under_outer_no_grad_stay_off():
    critic = make_critic()
    td = make_batch(3, (3, 8))
    with torch.no_grad():
        GAE(gamma=0.9, lmbda=0.9, value_network=critic, differentiable=True)(td)
    assert not td["advantage"].requires_grad


def test_params_and_target_params_are_swapped_in_and_restored():
    critic = make_critic(0)
    other = make_critic(1)
    target = make_critic(2)
    params = TensorDict.from_module(other).detach().clone()
    target_params = TensorDict.from_module(target).detach().clone()
    td = make_batch(4, (2, 5)).exclude("state_value", ("next", "state_value"))
    before = [p.clone() for p in critic.parameters()]
    out = TD1Estimator(gamma=0.9, value_network=critic)(td.clone(), params=params, target_params=target_params)
    with torch.no_grad():
        v = other(td.select("obs"))["state_value"]
        nv = target(td["next"].select("obs"))["state_value"]
    torch.testing.assert_close(out["state_value"], v)
    expected = functional.td1_return_estimate(0.9, nv, td["next", "reward"], td["next", "done"], td["next", "terminated"])
    torch.testing.assert_close(out["value_target"], expected)
    assert all(torch.equal(a, b) for a, b in zip(before, critic.parameters()))


@pytest.mark.parametrize("kind", ["td0", "td1", "tdlambda"])
def test_value_estimate_with_given_next_value_does_not_call_network(kind):
    def boom(*args):
        raise AssertionError("the network must not be called")

    critic = make_critic()
    critic.register_forward_pre_hook(boom)
    td = make_batch(5, (2, 6))
    est = make_estimator(kind, value_network=critic)
    got = est.value_estimate(td, next_value=td["next", "state_value"])
    expected = make_estimator(kind).value_estimate(td)
    torch.testing.assert_close(got, expected)


def test_skip_existing_reads_values():
    critic = make_critic()
    critic.register_forward_pre_hook(lambda *a: (_ for _ in ()).throw(AssertionError("called")))
    td = make_batch(5, (2, 6))
    out = GAE(gamma=0.9, lmbda=0.8, value_network=critic, skip_existing=True)(td.clone())
    torch.testing.assert_close(out["advantage"], GAE(gamma=0.9, lmbda=0.8)(td)["advantage"])


def test_average_gae_normalizes_and_is_safe_for_one_element():
    td = make_batch(6, (4, 10))
    GAE(gamma=0.9, lmbda=0.9, average_gae=True)(td)
    adv = td["advantage"]
    torch.testing.assert_close(adv.mean(), torch.tensor(0.0), atol=1e-5, rtol=0)
    torch.testing.assert_close(adv.std(), torch.tensor(1.0), atol=1e-4, rtol=0)
    raw = GAE(gamma=0.9, lmbda=0.9)(make_batch(6, (4, 10)))
    torch.testing.assert_close(td["value_target"], raw["value_target"])  # target uses the raw advantage
    one = make_batch(7, (1, 1))
    GAE(gamma=0.9, lmbda=0.9, average_gae=True)(one)
    assert torch.isfinite(one["advantage"]).all()
    assert torch.isfinite(normalize_advantage(torch.ones(1, 1))).all()
    assert torch.isfinite(normalize_advantage(torch.ones(5, 1))).all()  # std 0 is clamped


def test_set_keys_renames_everything():
    td = make_batch(8, (2, 5))
    ref = GAE(gamma=0.9, lmbda=0.8)(td.clone())
    renamed = TensorDict(
        {
            "v": td["state_value"],
            "next": {"v": td["next", "state_value"], "rew": td["next", "reward"], "d": td["next", "done"], "t": td["next", "terminated"]},
        },
        [2, 5],
    )
    est = GAE(gamma=0.9, lmbda=0.8).set_keys(value="v", reward="rew", done="d", terminated="t", advantage="A", value_target="G")
    est(renamed)
    torch.testing.assert_close(renamed["A"], ref["advantage"])
    torch.testing.assert_close(renamed["G"], ref["value_target"])
    with pytest.raises(ValueError, match="unknown key name"):
        est.set_keys(rewards="r")


def test_terminated_defaults_to_done():
    td = make_batch(9, (2, 5))
    a = GAE(gamma=0.9, lmbda=0.8)(td.exclude(("next", "terminated")))
    td["next", "terminated"] = td["next", "done"]
    b = GAE(gamma=0.9, lmbda=0.8)(td)
    torch.testing.assert_close(a["advantage"], b["advantage"])


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("kind", KINDS)
def test_reward_without_trailing_dim_raises(kind):
    td = make_batch(0, (3, 4))
    td["next", "reward"] = td["next", "reward"][..., 0]
    before = set(td.keys(include_nested=True, leaves_only=True))
    with pytest.raises(ValueError, match=r"'reward'\) has shape \[3, 4\].*expected \[3, 4, 1\]"):
        make_estimator(kind)(td)
    assert set(td.keys(include_nested=True, leaves_only=True)) == before


def test_done_with_wrong_shape_raises():
    td = make_batch(0, (3, 4))
    td["next", "done"] = td["next", "done"].expand(3, 4, 2).clone()
    with pytest.raises(ValueError, match=r"'done'\) has shape \[3, 4, 2\], expected \[3, 4, 1\]"):
        GAE(gamma=0.9, lmbda=0.9)(td)


def test_value_network_with_wrong_output_shape_raises():
    critic = TensorDictModule(torch.nn.Linear(3, 2), ["obs"], ["state_value"])
    td = make_batch(0, (3, 4)).exclude("state_value", ("next", "state_value"))
    with pytest.raises(ValueError, match=r"'state_value' has shape \[3, 4, 2\], expected \[3, 4, 1\]"):
        GAE(gamma=0.9, lmbda=0.9, value_network=critic)(td)


def test_missing_key_names_it_and_set_keys():
    td = make_batch(0, (3, 4)).exclude(("next", "state_value"))
    with pytest.raises(KeyError, match=r"GAE needs .*next.*state_value.*set_keys\(value=<your key>\)"):
        GAE(gamma=0.9, lmbda=0.9)(td)


def test_time_based_estimator_needs_a_batch_dim():
    td = make_batch(0, (3,))[0]
    with pytest.raises(ValueError, match="needs a batch with a time dim"):
        GAE(gamma=0.9, lmbda=0.9)(td)


def test_reference_is_correct_on_a_hand_example():
    """The reference itself, on numbers worked out by hand (γ=0.5, λ=0.5)."""
    v = [1.0, 2.0, 3.0]
    nv = [2.0, 3.0, 4.0]
    r = [1.0, 1.0, 1.0]
    done = [False, True, False]
    term = [False, False, False]
    adv, _ = ref_row("gae", 0.5, 0.5, v, nv, r, done, term)
    # δ = [1+1-1, 1+1.5-2, 1+2-3] = [1, 0.5, 0]; A2 = 0; A1 = 0.5 (done); A0 = 1 + .25*.5
    assert np.allclose(adv, [1.125, 0.5, 0.0])
    _, tgt = ref_row("td1", 0.5, 0.0, v, nv, r, done, term)
    # G2 = 1 + .5*4 = 3; G1 = 1 + .5*3 = 2.5 (truncated: bootstrap); G0 = 1 + .5*2.5
    assert np.allclose(tgt, [2.25, 2.5, 3.0])


@pytest.mark.parametrize("shifted", [False, True])
def test_estimator_module_compiles_fullgraph(shifted):
    est = GAE(gamma=0.9, lmbda=0.8, value_network=make_critic(), shifted=shifted)
    td = make_batch(0, (3, 8)).exclude("state_value", ("next", "state_value"))
    compiled = torch.compile(lambda td: est(td)["advantage"], fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(td.clone()), est(td.clone())["advantage"])
