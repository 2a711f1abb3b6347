"""ProbabilisticTensorDictModule / ProbabilisticTensorDictSequential."""

from __future__ import annotations

import pytest
import torch
from torch import distributions as D
from torch import nn

from steersman.tensordict import TensorDict
from steersman.tensordict.nn import (
    InteractionType,
    NormalParamExtractor,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictSequential,
    set_interaction_type,
)

BATCHES = [(), (4,), (2, 3)]
ALL_TYPES = list(InteractionType)


def normal_td(batch, d: int = 2, seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    return TensorDict(
        loc=torch.randn(*batch, d, generator=g),
        scale=torch.rand(*batch, d, generator=g) + 0.5,
        batch_size=batch,
    )


def normal_module(**kw) -> ProbabilisticTensorDictModule:
    return ProbabilisticTensorDictModule(["loc", "scale"], ["action"], D.Normal, **kw)


# ----------------------------------------------------------------------------- interaction types
@pytest.mark.parametrize("batch", BATCHES, ids=str)
@pytest.mark.parametrize("itype", [t for t in ALL_TYPES if t is not InteractionType.MEDIAN])
def test_every_interaction_type_normal(itype, batch):
    module = normal_module(return_log_prob=True)
    td = normal_td(batch)
    loc, scale = td["loc"], td["scale"]
    torch.manual_seed(3)
    with set_interaction_type(itype):
        module(td)
    if itype is InteractionType.RANDOM:
        torch.manual_seed(3)
        expected = D.Normal(loc, scale).rsample()
    else:  # MODE, MEAN and DETERMINISTIC are all the location for a Normal
        expected = loc
    torch.testing.assert_close(td["action"], expected)
    assert td["action"].shape == torch.Size(batch) + (2,)
    torch.testing.assert_close(td["action_log_prob"], D.Normal(loc, scale).log_prob(expected))


def test_median_not_implemented_is_clear():
    with set_interaction_type(InteractionType.MEDIAN):
        with pytest.raises(NotImplementedError, match="Normal does not implement the MEDIAN"):
            normal_module()(normal_td((3,)))


def test_default_type_used_without_context_and_overridden_by_it():
    module = normal_module(default_interaction_type=InteractionType.RANDOM)
    td = normal_td((1000,))
    module(td)
    assert not torch.allclose(td["action"], td["loc"])  # random by default
    with set_interaction_type("mode"):
        module(td)
    torch.testing.assert_close(td["action"], td["loc"])
    module = normal_module(default_interaction_type="mode")
    assert module.default_interaction_type is InteractionType.MODE
    with pytest.raises(ValueError, match="cannot be None"):
        normal_module(default_interaction_type=None)


def test_random_uses_rsample_and_sample():
    loc = torch.zeros(5, 2, requires_grad=True)
    td = TensorDict(loc=loc, scale=torch.ones(5, 2), batch_size=[5])
    with set_interaction_type("random"):
        normal_module()(td)
    assert td["action"].requires_grad  # reparametrised: gradients reach loc
    td["action"].sum().backward()
    assert loc.grad is not None
    cat = ProbabilisticTensorDictModule(["logits"], ["action"], D.Categorical)
    with set_interaction_type("random"):
        out = cat(TensorDict(logits=torch.randn(6, 4, requires_grad=True), batch_size=[6]))
    assert out["action"].dtype == torch.int64 and not out["action"].requires_grad
    assert out["action"].shape == (6,)


class _OnlyMode(D.Distribution):
    """A distribution that implements the mode but not the mean."""

    arg_constraints: dict = {}

    def __init__(self, value):
        self.value = value
        super().__init__(value.shape[:-1], value.shape[-1:], validate_args=False)

    @property
    def mode(self):
        return self.value * 10


class _WithDeterministic(_OnlyMode):
    @property
    def mean(self):
        return self.value

    @property
    def deterministic_sample(self):
        return self.value + 100


def _independent_normal(loc, scale):
    return D.Independent(D.Normal(loc, scale), 1)


@pytest.mark.parametrize(
    "dist_class, in_keys, td, expected",
    [
        (D.Categorical, ["logits"], TensorDict(logits=torch.tensor([[0.0, 5.0, 1.0]])),
         torch.tensor([1])),
        (D.Bernoulli, ["probs"], TensorDict(probs=torch.tensor([0.9, 0.1])),
         torch.tensor([1.0, 0.0])),
        (D.OneHotCategorical, ["logits"], TensorDict(logits=torch.tensor([[0.0, 0.0, 3.0]])),
         torch.tensor([[0.0, 0.0, 1.0]])),
        (_OnlyMode, ["value"], TensorDict(value=torch.ones(1, 2)), torch.full((1, 2), 10.0)),
        (_WithDeterministic, ["value"], TensorDict(value=torch.ones(1, 2)),
         torch.full((1, 2), 101.0)),
        (_independent_normal, ["loc", "scale"],
         TensorDict(loc=torch.full((3, 2), 4.0), scale=torch.ones(3, 2)), torch.full((3, 2), 4.0)),
        (lambda value: D.Independent(_WithDeterministic(value), 1), ["value"],
         TensorDict(value=torch.ones(2, 3)), torch.full((2, 3), 101.0)),
        (D.Gamma, ["concentration", "rate"],
         TensorDict(concentration=torch.tensor([2.0]), rate=torch.tensor([4.0])),
         torch.tensor([0.5])),  # the mean (the mode would be 0.25)
    ],
    ids=["categorical", "bernoulli", "onehot", "only_mode", "deterministic_sample",
         "independent", "independent_of_deterministic", "gamma_mean"],
)
def test_deterministic_fallbacks(dist_class, in_keys, td, expected):
    module = ProbabilisticTensorDictModule(in_keys, ["action"], dist_class)
    assert module.default_interaction_type is InteractionType.DETERMINISTIC
    module(td)
    torch.testing.assert_close(td["action"], expected, check_dtype=False)


def test_mean_not_implemented_is_clear():
    with set_interaction_type("mean"):
        with pytest.raises(NotImplementedError, match="_OnlyMode does not implement the MEAN"):
            ProbabilisticTensorDictModule(["value"], ["a"], _OnlyMode)(
                TensorDict(value=torch.ones(1, 2))
            )


_LIB_CASES = [  # (class name, in_keys, entries)
    ("TanhNormal", ["loc", "scale"], {"loc": (4, 2), "scale": (4, 2)}),
    ("TruncatedNormal", ["loc", "scale"], {"loc": (4, 2), "scale": (4, 2)}),
    ("Delta", ["param"], {"param": (4, 2)}),
    ("OneHotCategorical", ["logits"], {"logits": (4, 3)}),
    ("MaskedCategorical", ["logits", "mask"], {"logits": (4, 3), "mask": (4, 3)}),
]


@pytest.mark.parametrize("itype", ALL_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("name, in_keys, entries", _LIB_CASES, ids=[c[0] for c in _LIB_CASES])
def test_library_distributions(name, in_keys, entries, itype):
    """The distributions of ``nn.distributions`` work through the generic module path."""
    from steersman.tensordict.nn import distributions as dists

    cls = getattr(dists, name)
    g = torch.Generator().manual_seed(0)
    td = TensorDict(
        {k: (torch.rand(*shape, generator=g) > 0.3) | (torch.arange(shape[-1]) == 0)
         if k == "mask" else torch.rand(*shape, generator=g) + 0.5 for k, shape in entries.items()},
        batch_size=[4],
    )
    module = ProbabilisticTensorDictModule(in_keys, ["action"], cls, return_log_prob=True)
    dist = module.get_dist(td)
    expected = {
        InteractionType.DETERMINISTIC: lambda: dist.deterministic_sample,
        InteractionType.MODE: lambda: dist.mode,
        InteractionType.MEAN: lambda: dist.mean,
        InteractionType.MEDIAN: lambda: dist.median,
    }.get(itype)
    if expected is not None:
        try:
            want = expected()
        except (NotImplementedError, AttributeError):
            if itype is InteractionType.MEAN:  # no closed form: an average of n_empirical_estimate draws
                module.n_empirical_estimate = 2000
                torch.manual_seed(0)
                with set_interaction_type(itype):
                    module(td)
                torch.manual_seed(1)
                ref = dist.sample((2000,)).float().mean(0)
                torch.testing.assert_close(td["action"], ref, atol=0.1, rtol=0)
                return
            with set_interaction_type(itype), pytest.raises(NotImplementedError, match=name):
                module(td)
            assert "action" not in td
            return
        if want.is_floating_point() and want.isnan().any():  # e.g. the mean of a categorical
            module = ProbabilisticTensorDictModule(in_keys, ["action"], cls)
            with set_interaction_type(itype):
                module(td)
            torch.testing.assert_close(td["action"], want, equal_nan=True)
            return
    torch.manual_seed(0)
    with set_interaction_type(itype):
        module(td)
    if expected is None:  # RANDOM
        torch.manual_seed(0)
        want = dist.rsample() if dist.has_rsample else dist.sample()
    torch.testing.assert_close(td["action"], want)
    torch.testing.assert_close(td["action_log_prob"], dist.log_prob(want))


def test_default_distribution_is_delta():
    module = ProbabilisticTensorDictModule(["param"], ["action"])
    td = TensorDict(param=torch.randn(3, 2), batch_size=[3])
    torch.testing.assert_close(module(td)["action"], td["param"])


# ----------------------------------------------------------------------------- keys and params
def test_dict_in_keys_nested_keys_and_kwargs():
    module = ProbabilisticTensorDictModule(
        {"loc": ("params", "mu"), "scale": ("params", "sigma")},
        [("agent", "action")],
        D.Normal,
        return_log_prob=True,
        log_prob_key=("agent", "action_log_prob"),
    )
    assert module.in_keys == [("params", "mu"), ("params", "sigma")]
    assert module.out_keys == [("agent", "action"), ("agent", "action_log_prob")]
    td = TensorDict({"params": {"mu": torch.full((3, 1), 2.0), "sigma": torch.ones(3, 1)}}, [3])
    module(td)
    assert td["agent", "action"].tolist() == [[2.0]] * 3
    assert td.get(("agent", "action_log_prob")).shape == (3, 1)
    # a nested list key gives its last part as the parameter name
    m2 = ProbabilisticTensorDictModule([("params", "loc"), ("params", "scale")], ["a"], D.Normal)
    td = TensorDict({"params": {"loc": torch.zeros(2), "scale": torch.ones(2)}}, [])
    assert m2(td)["a"].tolist() == [0.0, 0.0]
    # constant distribution arguments
    m3 = ProbabilisticTensorDictModule(["loc"], ["a"], D.Normal, distribution_kwargs={"scale": 2.0})
    assert m3.get_dist(TensorDict(loc=torch.zeros(2))).scale.tolist() == [2.0, 2.0]


def test_get_dist_and_log_prob():
    module = normal_module()
    td = normal_td((5,))
    td["action"] = torch.randn(5, 2)
    dist = module.get_dist(td)
    assert isinstance(dist, D.Normal) and dist.batch_shape == (5, 2)
    torch.testing.assert_close(module.log_prob(td), D.Normal(td["loc"], td["scale"]).log_prob(td["action"]))
    assert module.dist_params_keys == ["loc", "scale"] and module.dist_sample_keys == ["action"]


def test_keyword_call():
    module = normal_module(return_log_prob=True)
    with set_interaction_type("mode"):
        action, lp = module(loc=torch.zeros(3), scale=torch.ones(3))
    assert action.tolist() == [0.0] * 3
    torch.testing.assert_close(lp, D.Normal(0.0, 1.0).log_prob(torch.zeros(3)))
    action = normal_module()(torch.ones(2), torch.ones(2))
    assert action.tolist() == [1.0, 1.0]


def test_select_out_keys_drops_log_prob():
    module = normal_module(return_log_prob=True).select_out_keys("action")
    assert module.out_keys == ["action"]
    td = module(normal_td((2,)))
    assert "action_log_prob" not in td and "action" in td
    module.reset_out_keys()
    assert "action_log_prob" in module(normal_td((2,)))


def test_cache_dist():
    module = normal_module(cache_dist=True)
    td = normal_td((2,))
    module(td)
    assert isinstance(module.last_dist, D.Normal)
    torch.testing.assert_close(module.last_dist.loc, td["loc"])
    assert normal_module().last_dist is None


def test_missing_distribution_class_or_keys():
    with pytest.raises(TypeError, match="callable"):
        ProbabilisticTensorDictModule(["loc"], ["a"], 3)
    with pytest.raises(ValueError, match="at least one in_key"):
        ProbabilisticTensorDictModule([], ["a"], D.Normal)


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize("return_log_prob", [False, True])
def test_wrong_param_shapes_give_value_error(return_log_prob):
    module = normal_module(return_log_prob=return_log_prob)
    td = TensorDict(loc=torch.zeros(4, 2), scale=torch.ones(4, 3), batch_size=[4])
    with pytest.raises(ValueError) as info:
        module(td)
    msg = str(info.value)
    assert "Normal" in msg and "'loc'" in msg and "'scale'" in msg
    assert "[4, 2]" in msg and "[4, 3]" in msg
    assert set(td.keys()) == {"loc", "scale"}  # nothing written


def test_invalid_param_values_give_value_error():
    td = TensorDict(loc=torch.zeros(2), scale=-torch.ones(2), batch_size=[2])
    with pytest.raises(ValueError, match="could not build Normal"):
        normal_module(distribution_kwargs={"validate_args": True})(td)
    with pytest.raises(TypeError, match="could not build Normal"):
        ProbabilisticTensorDictModule(["mu", "sigma"], ["a"], D.Normal)(
            TensorDict(mu=torch.zeros(1), sigma=torch.ones(1))
        )


def test_missing_param_key():
    with pytest.raises(KeyError, match="missing the input key 'scale'"):
        normal_module().get_dist(TensorDict(loc=torch.zeros(2)))


def test_log_prob_write_failure_rolls_back():
    class BadLogProb(D.Normal):
        def log_prob(self, value):
            return torch.zeros(7)  # not the batch size of the TensorDict

    module = ProbabilisticTensorDictModule(["loc", "scale"], ["action"], BadLogProb,
                                           return_log_prob=True)
    td = normal_td((3,))
    with pytest.raises(ValueError, match="batch"):
        module(td)
    assert set(td.keys()) == {"loc", "scale"}


# ----------------------------------------------------------------------------- sequential
def _policy(return_log_prob: bool = True, default=InteractionType.DETERMINISTIC):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), NormalParamExtractor())
    return net, ProbabilisticTensorDictSequential(
        TensorDictModule(net, ["obs"], ["loc", "scale"]),
        ProbabilisticTensorDictModule(["loc", "scale"], ["action"], D.Normal,
                                      return_log_prob=return_log_prob,
                                      default_interaction_type=default),
    )


@pytest.mark.parametrize("batch", BATCHES, ids=str)
def test_sequential_get_dist(batch):
    net, policy = _policy()
    obs = torch.randn(*batch, 3)
    td = TensorDict(obs=obs, batch_size=batch)
    dist = policy.get_dist(td)
    loc, scale = net(obs)
    torch.testing.assert_close(dist.loc, loc)
    torch.testing.assert_close(dist.scale, scale)
    assert "loc" in td and "action" not in td  # the deterministic part ran, no sample drawn
    td["action"] = torch.zeros(*batch, 2)
    torch.testing.assert_close(policy.log_prob(td), D.Normal(loc, scale).log_prob(td["action"]))
    assert isinstance(policy.build_dist_from_params(td), D.Normal)


def test_sequential_keys_params_and_types():
    net, policy = _policy()
    assert policy.in_keys == ["obs"]
    assert policy.out_keys == ["loc", "scale", "action", "action_log_prob"]
    assert policy.log_prob_key == "action_log_prob"
    assert policy.dist_params_keys == ["loc", "scale"] and policy.dist_sample_keys == ["action"]
    assert len(list(policy.parameters())) == 2
    assert type(policy[:-1]) is TensorDictSequential
    assert type(policy[0:]) is ProbabilisticTensorDictSequential
    assert type(policy.det_part) is TensorDictSequential and len(policy.det_part) == 1
    sub = policy.select_subsequence(out_keys=["loc"])
    assert type(sub) is TensorDictSequential and len(sub) == 1
    with pytest.raises(TypeError, match="last module"):
        ProbabilisticTensorDictSequential(TensorDictModule(net, ["obs"], ["loc", "scale"]))
    params = policy.get_dist_params(TensorDict(obs=torch.randn(3), batch_size=[]))
    assert set(params.keys()) == {"obs", "loc", "scale"}


def test_sequential_interaction_and_gradients():
    net, policy = _policy(default=InteractionType.RANDOM)
    td = TensorDict(obs=torch.randn(6, 3), batch_size=[6])
    assert policy.default_interaction_type is InteractionType.RANDOM
    with set_interaction_type("mode"):
        policy(td)
    torch.testing.assert_close(td["action"], td["loc"])
    policy(td)  # default: RANDOM, reparametrised
    td["action"].sum().backward()
    assert all(p.grad is not None for p in net.parameters())


def test_sequential_keyword_call_and_missing_key():
    _, policy = _policy()
    loc, scale, action, lp = policy(obs=torch.zeros(3))
    torch.testing.assert_close(action, loc)
    td = TensorDict(observation=torch.zeros(2, 3), batch_size=[2])
    with pytest.raises(KeyError, match="module 0 of ProbabilisticTensorDictSequential"):
        policy.get_dist(td)
    with pytest.raises(KeyError, match="'obs'"):
        policy(td)
    assert list(td.keys()) == ["observation"]


def test_sequential_prob_failure_rolls_back():
    _, policy = _policy()
    policy[-1].distribution_kwargs["validate_args"] = True  # NaN parameters are rejected
    td = TensorDict(obs=torch.full((2, 3), float("nan")), batch_size=[2])
    with pytest.raises(ValueError, match="could not build Normal"):
        policy(td)
    assert list(td.keys()) == ["obs"]  # loc/scale written by the first module are gone
