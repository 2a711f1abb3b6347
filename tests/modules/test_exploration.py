"""Exploration modules: annealing schedules, off outside of RANDOM, spec bounds and masks,
and the Ornstein-Uhlenbeck state restarting on ``is_init`` (against the formula)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from steersman.data import Bounded, Categorical, OneHot, Unbounded
from steersman.modules import (
    AdditiveGaussianModule,
    EGreedyModule,
    ExplorationType,
    OrnsteinUhlenbeckProcessModule,
    set_exploration_type,
)
from steersman.tensordict import TensorDict

BOX = Bounded(-1.0, 1.0, (2,))
_SIGMA = {"eps_init": "sigma_init", "eps_end": "sigma_end"}

FACTORIES = {
    "egreedy": (lambda **kw: EGreedyModule(Categorical(4), **kw), "eps"),
    "gaussian": (lambda **kw: AdditiveGaussianModule(BOX, **{_SIGMA.get(k, k): v for k, v in kw.items()}),
                 "sigma"),
    "ou": (lambda **kw: OrnsteinUhlenbeckProcessModule(BOX, **kw), "eps"),
}


def _td(name: str, n: int = 64) -> TensorDict:
    if name == "egreedy":
        action = torch.zeros(n, dtype=torch.long)
    else:
        action = torch.zeros(n, 2)
    return TensorDict(action=action, is_init=torch.ones(n, 1, dtype=torch.bool), batch_size=[n])


@pytest.mark.parametrize("name", list(FACTORIES))
def test_linear_annealing_schedule(name):
    make, factor = FACTORIES[name]
    module = make(eps_init=1.0, eps_end=0.2, annealing_num_steps=8)
    seen = [float(getattr(module, factor))]
    for _ in range(10):
        module.step()
        seen.append(float(getattr(module, factor)))
    expected = [max(0.2, 1.0 - k * 0.1) for k in range(11)]
    assert seen == pytest.approx(expected, abs=1e-6)
    batched = make(eps_init=1.0, eps_end=0.2, annealing_num_steps=8)
    batched.step(3)
    assert float(getattr(batched, factor)) == pytest.approx(0.7, abs=1e-6)
    # the factor is a buffer: saved and restored with the state dict
    fresh = make(eps_init=1.0, eps_end=0.2, annealing_num_steps=8)
    fresh.load_state_dict(batched.state_dict())
    assert float(getattr(fresh, factor)) == pytest.approx(0.7, abs=1e-6)
    assert factor in dict(batched.state_dict())


@pytest.mark.parametrize("name", list(FACTORIES))
def test_bad_schedules(name):
    make, _ = FACTORIES[name]
    with pytest.raises(ValueError, match="decrease"):
        make(eps_init=0.1, eps_end=0.5)
    with pytest.raises(ValueError, match="annealing_num_steps"):
        make(annealing_num_steps=0)


@pytest.mark.parametrize("name", list(FACTORIES))
@pytest.mark.parametrize(
    "mode",
    [ExplorationType.DETERMINISTIC, ExplorationType.MODE, ExplorationType.MEAN, ExplorationType.MEDIAN],
)
def test_off_unless_exploring(name, mode):
    module = FACTORIES[name][0]()
    td = _td(name)
    before = td.clone()
    with set_exploration_type(mode):
        out = module(td)
    assert sorted(out.keys()) == sorted(before.keys())
    assert torch.equal(out["action"], before["action"])


@pytest.mark.parametrize("name", list(FACTORIES))
@pytest.mark.parametrize("mode", [ExplorationType.RANDOM, None])
def test_on_when_exploring(name, mode):
    module = FACTORIES[name][0]()
    td = _td(name, n=256)
    with set_exploration_type(mode):
        out = module(td.clone())
    assert not torch.equal(out["action"], td["action"])


# ------------------------------------------------------------------ e-greedy
@pytest.mark.parametrize("eps", [0.0, 0.5, 1.0])
def test_egreedy_replaces_a_fraction_eps(eps):
    torch.manual_seed(0)
    n, k = 20000, 4
    module = EGreedyModule(Categorical(k), eps_init=eps, eps_end=eps)
    out = module(TensorDict(action=torch.zeros(n, dtype=torch.long), batch_size=[n]))
    changed = float((out["action"] != 0).float().mean())
    assert changed == pytest.approx(eps * (k - 1) / k, abs=0.02)
    assert Categorical(k).is_in(out["action"])


@pytest.mark.parametrize("spec", [Categorical(5), OneHot(5)], ids=["categorical", "onehot"])
def test_egreedy_random_actions_respect_the_mask(spec):
    torch.manual_seed(0)
    n = 3000
    module = EGreedyModule(spec, eps_init=1.0, action_mask_key="mask")
    mask = torch.zeros(n, 5, dtype=torch.bool)
    mask[: n // 2, 1] = mask[: n // 2, 3] = True  # first half: actions 1 and 3
    mask[n // 2 :, 4] = True  # second half: only 4
    action = spec.zero((n,))
    out = module(TensorDict(action=action, mask=mask, batch_size=[n]))["action"]
    idx = out if isinstance(spec, Categorical) else out.long().argmax(-1)
    assert set(idx[: n // 2].tolist()) == {1, 3} and set(idx[n // 2 :].tolist()) == {4}
    assert out.dtype == spec.dtype


def test_egreedy_with_a_batched_onehot_and_nested_action():
    torch.manual_seed(0)
    module = EGreedyModule(OneHot(3), eps_init=1.0, action_key=("agent", "action"))
    action = OneHot(3).zero((500,))
    td = TensorDict({"agent": TensorDict(action=action, batch_size=[500])}, batch_size=[500])
    out = module(td)["agent", "action"]
    assert OneHot(3).is_in(out) and bool((out.long().argmax(-1) != 0).any())


def test_egreedy_errors():
    with pytest.raises(ValueError, match="Categorical or OneHot"):
        EGreedyModule(BOX, action_mask_key="mask")
    with pytest.raises(ValueError, match="spec"):
        EGreedyModule(None)
    with pytest.raises(KeyError, match="after the policy"):
        EGreedyModule(Categorical(2))(TensorDict(obs=torch.zeros(3, 1), batch_size=[3]))


# ------------------------------------------------------------------ additive gaussian
def test_gaussian_noise_scale_and_bounds():
    torch.manual_seed(0)
    n = 20000
    free = AdditiveGaussianModule(None, sigma_init=0.5, sigma_end=0.5, mean=0.2, std=2.0)
    noise = free(TensorDict(action=torch.zeros(n, 2), batch_size=[n]))["action"]
    assert float(noise.mean()) == pytest.approx(0.5 * 0.2, abs=0.03)
    assert float(noise.std()) == pytest.approx(0.5 * 2.0, abs=0.03)
    boxed = AdditiveGaussianModule(BOX, sigma_init=3.0, sigma_end=3.0)
    out = boxed(TensorDict(action=torch.full((n, 2), 0.9), batch_size=[n]))["action"]
    assert BOX.is_in(out) and bool((out == 1.0).any()) and bool((out == -1.0).any())
    unbounded = AdditiveGaussianModule(Unbounded((2,)), sigma_init=3.0, sigma_end=3.0)
    assert float(unbounded(TensorDict(action=torch.zeros(n, 2), batch_size=[n]))["action"].abs().max()) > 1


# ------------------------------------------------------------------ Ornstein-Uhlenbeck
def _ou_reference(noise, steps, is_init, theta, mu, sigma, sigma_min, n_anneal, dt, eps_noise):
    noise = torch.where(is_init, 0.0, noise)
    steps = torch.where(is_init.squeeze(-1), 0, steps)
    sig = (sigma - (sigma - sigma_min) * steps / n_anneal).clamp_min(sigma_min).unsqueeze(-1)
    new = noise + theta * (mu - noise) * dt + sig * math.sqrt(dt) * eps_noise
    return new, steps + 1


def test_ou_follows_the_formula_and_restarts_on_is_init():
    kw = dict(theta=0.3, mu=0.1, sigma=0.5, sigma_min=0.1, n_steps_annealing=4, dt=0.1)
    module = OrnsteinUhlenbeckProcessModule(Unbounded((2,)), eps_init=0.5, eps_end=0.5, safe=False, **kw)
    n = 6
    td = TensorDict(action=torch.zeros(n, 2), is_init=torch.ones(n, 1, dtype=torch.bool), batch_size=[n])
    noise, steps = torch.zeros(n, 2), torch.zeros(n, dtype=torch.long)
    for t in range(6):
        is_init = torch.zeros(n, 1, dtype=torch.bool) if t else torch.ones(n, 1, dtype=torch.bool)
        if t == 3:
            is_init[1] = is_init[4] = True
        td.set("is_init", is_init)
        td.set("action", torch.full((n, 2), 0.25))
        torch.manual_seed(t)
        td = module(td)
        torch.manual_seed(t)
        eps_noise = torch.randn(n, 2)
        noise, steps = _ou_reference(noise, steps, is_init, kw["theta"], kw["mu"], kw["sigma"],
                                     kw["sigma_min"], kw["n_steps_annealing"], kw["dt"], eps_noise)
        torch.testing.assert_close(td["_ou_prev_noise"], noise)
        assert torch.equal(td["_ou_steps"], steps)
        torch.testing.assert_close(td["action"], 0.25 + 0.5 * noise)
    assert td["_ou_steps"].tolist() == [6, 3, 6, 6, 3, 6]  # rows 1 and 4 restarted at t=3


def test_ou_projects_and_warns_once_without_is_init():
    module = OrnsteinUhlenbeckProcessModule(BOX, sigma=50.0, dt=1.0)
    td = TensorDict(action=torch.zeros(500, 2), batch_size=[500])
    with pytest.warns(UserWarning, match="InitTracker"):
        td = module(td)
    assert BOX.is_in(td["action"]) and bool((td["action"].abs() == 1).any())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module(td)  # no second warning
    assert td["_ou_steps"].tolist() == [2] * 500  # without is_init the process continues


def test_egreedy_on_an_unbatched_env():
    """An env with batch size [] gives 0-d exploration draws: they broadcast to the action."""
    from steersman.envs import CartPoleEnv
    from steersman.modules import MLP, EGreedyModule, QValueActor
    from steersman.tensordict.nn import TensorDictSequential

    env = CartPoleEnv(seed=0)
    actor = QValueActor(MLP(in_features=4, out_features=2, num_cells=[8]), in_keys=["observation"],
                        spec=env.action_spec)
    policy = TensorDictSequential(actor, EGreedyModule(env.action_spec, eps_init=1.0, eps_end=1.0))
    actions = env.rollout(20, policy, break_when_any_done=False)["action"]
    assert actions.shape == (20,) and set(actions.tolist()) == {0, 1}  # eps=1: random, both actions
