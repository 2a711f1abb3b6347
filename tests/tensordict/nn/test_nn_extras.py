"""CompositeDistribution, AddStateIndependentNormalScale, EnsembleModule, CudaGraphModule,
TensorDictModuleWrapper, rand_one_hot: checked against independent torch references."""

from __future__ import annotations

import pytest
import torch
from torch import distributions as D
from torch import nn

from steersman.tensordict import TensorDict
from steersman.tensordict.nn import (
    AddStateIndependentNormalScale,
    CompositeDistribution,
    CudaGraphModule,
    EnsembleModule,
    TensorDictModule,
    TensorDictModuleWrapper,
    TensorDictSequential,
    add_custom_mapping,
    composite_lp_aggregate,
    rand_one_hot,
    set_composite_lp_aggregate,
)


def _params():
    g = torch.Generator().manual_seed(0)
    return TensorDict({"cont": {"loc": torch.randn(4, 2, generator=g), "scale": torch.rand(4, 2, generator=g) + 0.1},
                       "agent": {"disc": {"logits": torch.randn(4, 3, generator=g)}}}, [4])


def test_composite_sample_log_prob_entropy():
    p = _params()
    dist = CompositeDistribution(p, {"cont": D.Normal, ("agent", "disc"): D.Categorical},
                                 name_map={"cont": ("action", "cont")})
    s = dist.sample((5,))
    assert s.batch_size == (5, 4) and s["action", "cont"].shape == (5, 4, 2) and s["agent", "disc"].shape == (5, 4)
    ref_n = D.Normal(p["cont", "loc"], p["cont", "scale"])
    ref_c = D.Categorical(logits=p["agent", "disc", "logits"])
    lp_n = ref_n.log_prob(s["action", "cont"]).sum(-1)
    lp_c = ref_c.log_prob(s["agent", "disc"])
    assert composite_lp_aggregate() is False
    parts = dist.log_prob(s)
    torch.testing.assert_close(parts["action", "cont_log_prob"], lp_n)
    torch.testing.assert_close(parts["agent", "disc_log_prob"], lp_c)
    torch.testing.assert_close(dist.log_prob(s, aggregate_probabilities=True), lp_n + lp_c)
    with set_composite_lp_aggregate(True):
        torch.testing.assert_close(dist.log_prob(s), lp_n + lp_c)
    ent = dist.entropy(include_sum=True)
    torch.testing.assert_close(ent["entropy"], ref_n.entropy().sum(-1) + ref_c.entropy())
    assert dist.deterministic_sample["action", "cont"].equal(p["cont", "loc"])
    with pytest.raises(KeyError, match="nope"):
        CompositeDistribution(p, {"nope": D.Normal})
    with pytest.raises(KeyError, match="'cont'"):
        CompositeDistribution(p, {"cont": D.Normal}).log_prob(TensorDict({}, [4]))


def test_composite_rsample_has_gradients():
    loc = torch.zeros(3, requires_grad=True)
    p = TensorDict({"a": {"loc": loc, "scale": torch.ones(3)}}, [3])
    dist = CompositeDistribution(p, {"a": D.Normal}, aggregate_probabilities=True)
    dist.rsample()["a"].sum().backward()
    assert loc.grad is not None and loc.grad.tolist() == [1, 1, 1]


def test_state_independent_scale():
    m = AddStateIndependentNormalScale(3, scale_mapping="softplus", init_value=0.0, scale_lb=0.1)
    loc = torch.randn(5, 3)
    out_loc, scale = m(loc)
    assert out_loc is loc and scale.shape == (5, 3)
    torch.testing.assert_close(scale, torch.nn.functional.softplus(torch.zeros(5, 3)))
    scale.sum().backward()
    assert m.scale.grad is not None and list(m.parameters()) == [m.scale]
    assert list(AddStateIndependentNormalScale(3, make_param=False).parameters()) == []
    with pytest.raises(ValueError, match=r"\[4\]"):
        m(torch.zeros(5, 4))
    add_custom_mapping("square_plus_one", lambda x: x * x + 1)
    assert AddStateIndependentNormalScale(2, scale_mapping="square_plus_one")(torch.zeros(1, 2))[1].tolist() == [[1, 1]]
    with pytest.raises(ValueError, match="already"):
        add_custom_mapping("exp", torch.exp)


def test_ensemble_matches_a_loop():
    torch.manual_seed(0)
    m = TensorDictModule(nn.Linear(3, 2), in_keys=["obs"], out_keys=["q"])
    ens = EnsembleModule(m, num_copies=3)
    x = torch.randn(5, 3)
    out = ens(TensorDict(obs=x, batch_size=[5]))
    assert out.batch_size == (3, 5)
    for i in range(3):
        w, b = ens.params_td["module", "weight"][i], ens.params_td["module", "bias"][i]
        torch.testing.assert_close(out["q"][i], x @ w.T + b)
    assert not torch.allclose(out["q"][0], out["q"][1])  # independently initialized
    assert len(list(ens.parameters())) == 2  # the stacked weight and bias only
    out["q"].sum().backward()
    assert all(p.grad is not None for p in ens.parameters())
    per_copy = TensorDict(obs=torch.randn(3, 5, 3), batch_size=[3, 5])
    ens2 = EnsembleModule(m, num_copies=3, expand_input=False)
    assert ens2(per_copy)["q"].shape == (3, 5, 2)
    with pytest.raises(ValueError, match="leading batch dim must be 3"):
        ens2(TensorDict(obs=torch.randn(5, 3), batch_size=[5]))


def test_cudagraph_module_on_cpu_is_the_module():
    calls = []
    lin = nn.Linear(3, 2)

    def fn(x):
        calls.append(1)
        return lin(x)

    policy = TensorDictModule(fn, in_keys=["obs"], out_keys=["action"])
    fast = CudaGraphModule(policy, warmup=2)
    td = TensorDict(obs=torch.randn(4, 3), batch_size=[4])
    for _ in range(4):
        out = fast(td.clone())
    torch.testing.assert_close(out["action"], lin(td["obs"]))
    assert len(calls) == 4 and not fast.graph_captured and fast.in_keys == ["obs"]
    assert CudaGraphModule(lin)(torch.zeros(1, 3)).shape == (1, 2)
    with pytest.raises(ValueError, match="warmup"):
        CudaGraphModule(lin, warmup=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cudagraph_module_on_cuda():
    lin = nn.Linear(3, 2).cuda()
    policy = TensorDictModule(lin, in_keys=["obs"], out_keys=["action"])
    fast = CudaGraphModule(policy, warmup=2)
    for i in range(5):
        td = TensorDict(obs=torch.full((4, 3), float(i), device="cuda"), batch_size=[4], device="cuda")
        out = fast(td)
        torch.testing.assert_close(out["action"], lin(td["obs"]))
    assert fast.graph_captured
    with pytest.raises(ValueError, match="keys"):
        fast(TensorDict(other=torch.zeros(4, 3, device="cuda"), batch_size=[4], device="cuda"))


def test_wrapper_and_rand_one_hot():
    inner = TensorDictModule(nn.Linear(3, 2), in_keys=["obs"], out_keys=["action"])
    w = TensorDictModuleWrapper(inner)
    assert w.in_keys == ["obs"] and w.module is inner.module
    assert w(TensorDict(obs=torch.zeros(3)))["action"].shape == (2,)
    with pytest.raises(TypeError, match="nn.Module"):
        TensorDictModuleWrapper(lambda x: x)
    torch.manual_seed(0)
    oh = rand_one_hot(torch.tensor([[0.0, 100.0, 0.0]] * 4))
    assert oh.dtype == torch.long and oh.tolist() == [[0, 1, 0]] * 4
    probs = torch.tensor([[0.0, 0.0, 1.0]])
    assert rand_one_hot(probs, do_softmax=False).tolist() == [[0, 0, 1]]


# ----------------------------------------------------------------------------- tensordict's keywords
def test_module_method_strict_and_get_kwargs():
    from steersman.tensordict.nn import TensorDictModule as M

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def act(self, x, scale=1.0):
            return self.lin(x) * scale

    net = Net()
    m = M(net, ["x"], ["y"], method="act", method_kwargs={"scale": 2.0})
    x = torch.ones(2)
    torch.testing.assert_close(m(TensorDict(x=x))["y"], net.lin(x) * 2)
    assert len(list(m.parameters())) == 2
    with pytest.raises(AttributeError, match="nope"):
        M(net, ["x"], ["y"], method="nope")
    loose = M(lambda x, h: x if h is None else x + h, ["x", "h"], ["y"], strict=False)
    assert loose(TensorDict(x=x))["y"].tolist() == [1, 1]
    filled = M(lambda x, h: x + h, ["x", "h"], ["y"], strict=False, get_kwargs={"default": torch.ones(2)})
    assert filled(TensorDict(x=x))["y"].tolist() == [2, 2]
    with pytest.raises(KeyError, match="'h'"):
        M(lambda x, h: x, ["x", "h"], ["y"])(TensorDict(x=x))


@pytest.mark.parametrize("inplace", [True, False, "empty"])
def test_sequence_inplace(inplace):
    seq = TensorDictSequential(TensorDictModule(lambda a: a + 1, ["a"], ["b"]), inplace=inplace)
    inp = TensorDict(a=torch.zeros(2), batch_size=[2])
    out = seq(inp)
    assert out["b"].tolist() == [1, 1]
    assert (out is inp) == (inplace is True) and ("b" in inp.keys()) == (inplace is True)
    if inplace is not True:
        assert list(out.keys()) == ["b"]
    with pytest.raises(ValueError, match="inplace"):
        TensorDictSequential(TensorDictModule(lambda a: a, ["a"], ["b"]), inplace="sometimes")


def test_probabilistic_num_samples_generator_log_prob_keys():
    from steersman.tensordict.nn import ProbabilisticTensorDictModule as P
    from steersman.tensordict.nn import TruncatedNormal

    td = TensorDict(loc=torch.zeros(4), scale=torch.ones(4), batch_size=[4])
    m = P(["loc", "scale"], ["x"], distribution_class=D.Normal, num_samples=3, default_interaction_type="random",
          log_prob_keys=["x_lp"], return_log_prob=True)
    out = m(td)
    assert out.batch_size == (3, 4) and out["x"].shape == (3, 4) and "x" not in td.keys()
    torch.testing.assert_close(out["x_lp"], D.Normal(0.0, 1.0).log_prob(out["x"]))
    assert not torch.equal(out["x"][0], out["x"][1])  # new draws
    det = P(["loc", "scale"], ["x"], distribution_class=D.Normal, num_samples=2)(td)
    assert det["x"].shape == (2, 4) and not det["x"].any()  # the deterministic value, repeated
    g1 = P(["loc", "scale"], ["x"], distribution_class=D.Normal, generator=3, default_interaction_type="random")
    g2 = P(["loc", "scale"], ["x"], distribution_class=D.Normal, generator=3, default_interaction_type="random")
    a = g1(td.clone())["x"]
    assert torch.equal(a, g2(td.clone())["x"]) and not torch.equal(a, g1(td.clone())["x"])
    with pytest.raises(TypeError, match="generator"):
        P(["loc", "scale"], ["x"], distribution_class=D.Normal, generator="seed")
    tn = TruncatedNormal(torch.zeros(1000), torch.ones(1000), a=-0.25, b=0.5)
    s = tn.sample()
    assert s.min() >= -0.25 and s.max() <= 0.5


def test_tensorclass_modules():
    from steersman.tensordict import TensorClass
    from steersman.tensordict.nn import TensorClassModuleBase, TensorClassModuleWrapper

    class In(TensorClass):
        x: torch.Tensor

    class Out(TensorClass):
        y: torch.Tensor

    class Double(TensorClassModuleBase[In, Out]):
        def forward(self, inp):
            return Out(y=inp.x * 2, batch_size=inp.batch_size)

    m = Double()
    assert m.input_type is In and m.output_type is Out
    assert m(In(x=torch.ones(3), batch_size=[3])).y.tolist() == [2, 2, 2]
    td_m = m.as_td_module()
    assert isinstance(td_m, TensorClassModuleWrapper) and td_m.in_keys == ["x"] and td_m.out_keys == ["y"]
    inp = TensorDict(x=torch.ones(3), batch_size=[3])
    out = TensorDictSequential(td_m, TensorDictModule(lambda y: y + 1, ["y"], ["z"]))(inp)
    assert out["z"].tolist() == [3, 3, 3] and "y" not in inp.keys()

    class Untyped(TensorClassModuleBase):
        def forward(self, x):
            return x

    with pytest.raises(ValueError, match="tensorclass input and output"):
        Untyped().as_td_module()
    with pytest.raises(TypeError, match="two types"):
        TensorClassModuleBase[In]
