"""Actors, critics and operators: a battery over the classes, then class-specific checks
(bounds from the spec, log-prob key, safe projection, deterministic = mode, shared trunks,
random policy)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import distributions as D
from torch import nn

from steersman.data import Bounded, Categorical, Composite, OneHot, Unbounded
from steersman.modules import (
    MLP,
    Actor,
    ActorCriticOperator,
    ActorCriticWrapper,
    ActorValueOperator,
    Delta,
    DistributionalQValueActor,
    ExplorationType,
    IndependentNormal,
    NormalParamExtractor,
    ProbabilisticActor,
    QValueActor,
    RandomPolicy,
    SafeModule,
    TanhNormal,
    ValueOperator,
    set_exploration_type,
)
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import TensorDictModule

OBS, ACT, N_ACTIONS = 4, 2, 3


def _params_net(out: int = 2 * ACT, in_key: str = "observation") -> TensorDictModule:
    return TensorDictModule(nn.Sequential(MLP(in_features=OBS, out_features=out, num_cells=[8]),
                                          NormalParamExtractor()), [in_key], ["loc", "scale"])


def _tanh_actor() -> ProbabilisticActor:
    return ProbabilisticActor(_params_net(), ["loc", "scale"], spec=Bounded(-2.0, 2.0, (ACT,)),
                              distribution_class=TanhNormal, return_log_prob=True)


def _normal_actor() -> ProbabilisticActor:
    return ProbabilisticActor(_params_net(), ["loc", "scale"], distribution_class=IndependentNormal,
                              return_log_prob=True, log_prob_key="action_log_prob")


def _trunk() -> TensorDictModule:
    return TensorDictModule(nn.Sequential(nn.Linear(OBS, 8), nn.Tanh()), ["observation"], ["hidden"])


def _actor_value() -> ActorValueOperator:
    policy = ProbabilisticActor(
        TensorDictModule(nn.Sequential(nn.Linear(8, 2 * ACT), NormalParamExtractor()), ["hidden"],
                         ["loc", "scale"]),
        ["loc", "scale"], distribution_class=TanhNormal, return_log_prob=True)
    return ActorValueOperator(_trunk(), policy, ValueOperator(nn.Linear(8, 1), in_keys=["hidden"]))


def _actor_critic() -> ActorCriticOperator:
    critic = ValueOperator(MLP(in_features=8 + ACT, out_features=1, num_cells=[8]), in_keys=["hidden", "action"])
    return ActorCriticOperator(_trunk(), Actor(nn.Linear(8, ACT), in_keys=["hidden"]), critic)


@dataclass
class Case:
    make: Callable[[], nn.Module]
    outputs: dict  # key -> shape after the batch dims
    random: bool = False  # output depends on the RNG under RANDOM


CASES = {
    "actor": Case(lambda: Actor(nn.Linear(OBS, ACT)), {"action": (ACT,)}),
    "safe_actor": Case(lambda: Actor(nn.Linear(OBS, ACT), spec=Bounded(-0.1, 0.1, (ACT,)), safe=True),
                       {"action": (ACT,)}),
    "value": Case(lambda: ValueOperator(MLP(in_features=OBS, out_features=1, num_cells=[8])),
                  {"state_value": (1,)}),
    "tanh_actor": Case(_tanh_actor, {"loc": (ACT,), "scale": (ACT,), "action": (ACT,), "action_log_prob": ()},
                       random=True),
    "normal_actor": Case(_normal_actor, {"action": (ACT,), "action_log_prob": ()}, random=True),
    "qvalue_categorical": Case(lambda: QValueActor(nn.Linear(OBS, N_ACTIONS), spec=Categorical(N_ACTIONS)),
                               {"action": (), "action_value": (N_ACTIONS,), "chosen_action_value": (1,)}),
    "qvalue_onehot": Case(lambda: QValueActor(nn.Linear(OBS, N_ACTIONS), spec=OneHot(N_ACTIONS)),
                          {"action": (N_ACTIONS,), "action_value": (N_ACTIONS,), "chosen_action_value": (1,)}),
    "distributional_q": Case(
        lambda: DistributionalQValueActor(MLP(in_features=OBS, out_features=(5, N_ACTIONS), num_cells=[8]),
                                          support=torch.linspace(-1, 1, 5), spec=Categorical(N_ACTIONS)),
        {"action": (), "action_value": (5, N_ACTIONS)}),
    "actor_value": Case(_actor_value, {"hidden": (8,), "action": (ACT,), "state_value": (1,)}, random=True),
    "actor_critic": Case(_actor_critic, {"action": (ACT,), "state_action_value": (1,)}),
    "wrapper": Case(lambda: ActorCriticWrapper(Actor(nn.Linear(OBS, ACT)), ValueOperator(nn.Linear(OBS, 1))),
                    {"action": (ACT,), "state_value": (1,)}),
}


def _obs(batch: tuple, seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    return TensorDict(observation=torch.randn(*batch, OBS, generator=g), batch_size=list(batch))


def _build(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return CASES[name].make()


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("batch", [(), (5,), (2, 3)])
def test_battery_outputs(name, batch):
    module = _build(name)
    td = _obs(batch)
    with set_exploration_type(ExplorationType.RANDOM):
        out = module(td)
    assert out is td  # written in place
    for key, shape in CASES[name].outputs.items():
        assert out[key].shape == (*batch, *shape), key
        assert key in module.out_keys


@pytest.mark.parametrize("name", list(CASES))
def test_battery_state_dict_round_trip(name):
    a, b = _build(name, seed=0), _build(name, seed=1)
    td = _obs((4,))
    a(td.clone()), b(td.clone())  # materialize lazy layers
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        out_a, out_b = a(td.clone()), b(td.clone())
        key = next(iter(CASES[name].outputs))
        differs = not torch.equal(out_a[key], out_b[key])
        b.load_state_dict(a.state_dict())
        out_b = b(td.clone())
    assert differs  # the check below could fail
    for k in CASES[name].outputs:
        torch.testing.assert_close(out_a[k], out_b[k])


@pytest.mark.parametrize("name", list(CASES))
def test_battery_seeded_runs_repeat(name):
    module = _build(name)
    outs = []
    for _ in range(2):
        torch.manual_seed(3)
        with set_exploration_type(ExplorationType.RANDOM):
            outs.append(module(_obs((6,))))
    for key in CASES[name].outputs:
        torch.testing.assert_close(outs[0][key], outs[1][key])
    if CASES[name].random:  # another seed, another action
        torch.manual_seed(4)
        with set_exploration_type(ExplorationType.RANDOM):
            other = module(_obs((6,)))
        assert not torch.equal(other["action"], outs[0]["action"])


@pytest.mark.parametrize("name", list(CASES))
def test_battery_missing_input_names_key_and_changes_nothing(name):
    module = _build(name)
    td = TensorDict(other=torch.zeros(3, 1), batch_size=[3])
    with pytest.raises(KeyError, match="observation"):
        module(td)
    assert list(td.keys()) == ["other"]


@pytest.mark.parametrize("name", list(CASES))
def test_battery_gradients_reach_parameters(name):
    module = _build(name)
    with set_exploration_type(ExplorationType.RANDOM):
        out = module(_obs((5,)))
    key = next(k for k in reversed(CASES[name].outputs) if out[k].is_floating_point())
    out[key].float().sum().backward()
    got = [p.grad is not None and bool(p.grad.abs().sum() > 0) for p in module.parameters()]
    assert any(got)


# ------------------------------------------------------------------ ProbabilisticActor
def test_tanh_normal_bounds_come_from_the_spec():
    low, high = torch.tensor([-2.0, 0.0]), torch.tensor([3.0, 0.5])
    actor = ProbabilisticActor(_params_net(), ["loc", "scale"], spec=Bounded(low, high),
                               distribution_class=TanhNormal)
    td = _obs((2000,))
    td["observation"] *= 10  # push the pre-tanh means to both sides
    with set_exploration_type(ExplorationType.RANDOM):
        action = actor(td)["action"]
    assert bool((action >= low).all() and (action <= high).all())
    assert bool((action[:, 1] > 0.4).any() and (action[:, 1] < 0.1).any())  # spans the box
    dist = actor.get_dist(td)
    torch.testing.assert_close(dist.low, low)
    torch.testing.assert_close(dist.high, high)
    # bounds given explicitly win over the spec
    given = ProbabilisticActor(_params_net(), ["loc", "scale"], spec=Bounded(low, high),
                               distribution_class=TanhNormal, distribution_kwargs={"low": -1.0, "high": 1.0})
    assert float(given.get_dist(_obs((3,))).high.max()) == 1.0
    assert isinstance(actor.spec, Composite) and actor.spec["action"].shape == (2,)


@pytest.mark.parametrize("mode", [ExplorationType.DETERMINISTIC, ExplorationType.MODE])
def test_deterministic_action_is_the_mode(mode):
    actor = _tanh_actor()
    td = _obs((7,))
    with set_exploration_type(mode):
        action = actor(td)["action"]
    dist = actor.get_dist(td)
    torch.testing.assert_close(action, dist.mode)
    torch.testing.assert_close(action, 2.0 * torch.tanh(td["loc"]))
    normal = _normal_actor()
    with set_exploration_type(mode):
        torch.testing.assert_close(normal(td)["action"], td["loc"])


def test_log_prob_is_written_at_its_key_and_matches_the_distribution():
    actor = _normal_actor()
    td = _obs((5,))
    with set_exploration_type(ExplorationType.RANDOM):
        td = actor(td)
    assert "sample_log_prob" not in td.keys() and actor.log_prob_key == "action_log_prob"
    expected = D.Independent(D.Normal(td["loc"], td["scale"]), 1).log_prob(td["action"])
    torch.testing.assert_close(td["action_log_prob"], expected)
    torch.testing.assert_close(actor.log_prob(td), expected)


def test_safe_projects_the_action_into_the_spec():
    spec = Bounded(-0.5, 0.5, (ACT,))
    net = TensorDictModule(lambda obs: (obs[..., :ACT] * 100, torch.ones_like(obs[..., :ACT])),
                           ["observation"], ["loc", "scale"])
    kwargs = dict(spec=spec, distribution_class=D.Normal, return_log_prob=True)
    unsafe = ProbabilisticActor(net, ["loc", "scale"], **kwargs)
    safe = ProbabilisticActor(net, ["loc", "scale"], safe=True, **kwargs)
    td = _obs((50,))
    with set_exploration_type(ExplorationType.RANDOM):
        assert float(unsafe(td.clone())["action"].abs().max()) > 0.5
        out = safe(td.clone())
    assert spec.is_in(out["action"])
    assert bool((out["action"].abs() == 0.5).any())  # clipped, not resampled


def test_probabilistic_actor_needs_a_tensordict_module():
    with pytest.raises(TypeError, match="TensorDictModule"):
        ProbabilisticActor(nn.Linear(OBS, 2 * ACT), ["loc", "scale"], distribution_class=TanhNormal)
    with pytest.raises(ValueError, match="safe=True"):
        ProbabilisticActor(_params_net(), ["loc", "scale"], safe=True, distribution_class=TanhNormal)


# ------------------------------------------------------------------ actors and values
def test_actor_and_value_defaults():
    actor = Actor(nn.Linear(OBS, ACT), spec=Bounded(-1.0, 1.0, (ACT,)))
    assert actor.in_keys == ["observation"] and actor.out_keys == ["action"]
    assert isinstance(actor.spec["action"], Bounded)
    td = _obs((3,))
    dist = actor.get_dist(td)
    assert isinstance(dist, Delta)
    torch.testing.assert_close(dist.mode, td["action"])
    assert ValueOperator(nn.Linear(OBS, 1)).out_keys == ["state_value"]
    assert ValueOperator(nn.Linear(OBS, 1), in_keys=["observation", "action"]).out_keys == ["state_action_value"]
    assert ValueOperator(nn.Linear(OBS, 1), out_keys=["v"]).out_keys == ["v"]


def test_safe_module_projects_every_output_with_a_spec():
    spec = Composite(a=Bounded(0.0, 1.0, (2,)), b=Unbounded((2,)))
    m = SafeModule(lambda x: (x, x), ["x"], ["a", "b"], spec=spec, safe=True)
    a, b = m(x=torch.tensor([-3.0, 3.0]))
    assert a.tolist() == [0.0, 1.0] and b.tolist() == [-3.0, 3.0]
    with pytest.raises(ValueError, match="no entry"):
        SafeModule(lambda x: x, ["x"], ["c"], spec=spec, safe=True)


def test_actor_value_operator_heads_share_the_trunk():
    op = _actor_value()
    policy, value = op.get_policy_operator(), op.get_value_operator()
    assert policy[0] is op[0] and value[0] is op[0]
    assert op.get_policy_head() is op[1] and op.get_value_head() is op[2]
    td = _obs((4,))
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        full = op(td.clone())
        alone = policy(td.clone())
        torch.testing.assert_close(alone["action"], full["action"])
        torch.testing.assert_close(value(td.clone())["state_value"], full["state_value"])
    assert "state_value" not in alone.keys()
    assert type(policy).__name__ == "ProbabilisticTensorDictSequential"
    policy.get_dist(td.clone())  # a probabilistic sequence: losses can get the distribution
    deterministic = ActorValueOperator(_trunk(), Actor(nn.Linear(8, ACT), in_keys=["hidden"]),
                                       ValueOperator(nn.Linear(8, 1), in_keys=["hidden"]))
    assert type(deterministic.get_policy_operator()).__name__ == "TensorDictSequential"


def test_actor_critic_operator():
    op = _actor_critic()
    assert op.get_critic_operator() is op
    with pytest.raises(RuntimeError, match="get_critic_operator"):
        op.get_value_operator()
    with pytest.raises(ValueError, match="state_value"):
        ActorCriticOperator(_trunk(), Actor(nn.Linear(8, ACT), in_keys=["hidden"]),
                            ValueOperator(nn.Linear(8, 1), in_keys=["hidden"]))
    wrapper = ActorCriticWrapper(Actor(nn.Linear(OBS, ACT)), ValueOperator(nn.Linear(OBS, 1)))
    assert wrapper.get_policy_head() is wrapper[0] and wrapper.get_value_operator() is wrapper[1]


# ------------------------------------------------------------------ RandomPolicy
@pytest.mark.parametrize(
    "spec",
    [Bounded(-1.0, 2.0, (3,)), Categorical(4), OneHot(5), Bounded(0, 9, (2,), dtype=torch.int64)],
    ids=["bounded", "categorical", "onehot", "bounded_int"],
)
@pytest.mark.parametrize("batch", [(), (50,), (4, 5)])
def test_random_policy_samples_inside_the_spec(spec, batch):
    policy = RandomPolicy(spec)
    td = policy(TensorDict(batch_size=list(batch)))
    assert td["action"].shape == (*batch, *spec.shape)
    assert spec.is_in(td["action"])
    batched = RandomPolicy(spec.expand(*batch, *spec.shape))  # a spec that already has the batch
    assert batched(TensorDict(batch_size=list(batch)))["action"].shape == (*batch, *spec.shape)


def test_random_policy_composite_and_spread():
    spec = Composite(action=Bounded(-1.0, 1.0, (2,)), extra=Categorical(3))
    policy = RandomPolicy(spec)
    assert policy.out_keys == ["action", "extra"]
    td = policy(TensorDict(batch_size=[1000]))
    assert spec.is_in(td)
    assert float(td["action"].min()) < -0.9 and float(td["action"].max()) > 0.9
    assert set(td["extra"].unique().tolist()) == {0, 1, 2}


def test_spec_bounds_follow_the_module_and_stay_out_of_the_state_dict():
    actor = _tanh_actor()
    assert not any("_spec" in k for k in actor.state_dict())
    actor.double()  # the same path as .to(device): buffers move, the distribution follows
    head = actor[-1]
    assert head.distribution_kwargs["low"].dtype == torch.float64
    td = TensorDict(observation=torch.randn(3, OBS, dtype=torch.float64), batch_size=[3])
    with set_exploration_type(ExplorationType.RANDOM):
        assert actor(td)["action"].dtype == torch.float64
    safe = Actor(nn.Linear(OBS, ACT), spec=Bounded(-1.0, 1.0, (ACT,)), safe=True).double()
    assert safe._projections[0][1].dtype == torch.float32  # .double() moves devices, not spec dtypes
    assert not any("_spec" in k for k in safe.state_dict())
