"""Multi-agent networks and mixers: one vmapped call equals a loop over agents (values and
gradients), shared vs independent and centralised vs decentralised parameters, any batch
dims, bad input, torch.compile(fullgraph=True), a multi-process collector; mixers
against plain references."""

from __future__ import annotations

import functools
import pickle

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounter

from steersman.modules.multiagent import MultiAgentConvNet, MultiAgentMLP, QMixer, VDNMixer

N, D, OUT = 3, 4, 2
BATCHES = [(), (5,), (2, 3)]


def _mlp(centralized, share_params, seed=0):
    torch.manual_seed(seed)
    return MultiAgentMLP(D, OUT, N, centralized=centralized, share_params=share_params, depth=2, num_cells=8)


def _loop_reference(net, x, centralized, flat_dims=1):
    """Agent by agent with each agent's own plain network: the definition of the output."""
    outs = []
    for i in range(net.n_agents):
        agent_net = net.get_stateful_net(i) if not net.share_params else net.net
        xi = x.flatten(-flat_dims - 1, -flat_dims) if centralized else x.select(-flat_dims - 1, i)
        outs.append(agent_net(xi))
    return torch.stack(outs, -2)


@pytest.mark.parametrize("batch", BATCHES, ids=str)
@pytest.mark.parametrize("share_params", [False, True], ids=["independent", "shared"])
@pytest.mark.parametrize("centralized", [False, True], ids=["decentralized", "centralized"])
def test_mlp_equals_loop_over_agents(centralized, share_params, batch):
    net = _mlp(centralized, share_params)
    x = torch.randn(*batch, N, D)
    out = net(x)
    assert out.shape == (*batch, N, OUT)
    torch.testing.assert_close(out, _loop_reference(net, x, centralized), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("centralized", [False, True], ids=["decentralized", "centralized"])
def test_mlp_gradients_equal_loop(centralized):
    """Gradients of the stacked parameters equal those of the agents' own networks in a loop."""
    net = _mlp(centralized, share_params=False)
    x = torch.randn(6, N, D)
    w = torch.randn(6, N, OUT)
    (net(x) * w).sum().backward()
    agents = [net.get_stateful_net(i) for i in range(N)]
    for i, agent_net in enumerate(agents):
        xi = x.flatten(-2) if centralized else x[:, i]
        (agent_net(xi) * w[:, i]).sum().backward()
    for name, stacked in net.params.items():
        ref = torch.stack([dict(a.named_parameters())[name.replace("__", ".")].grad for a in agents])
        torch.testing.assert_close(stacked.grad, ref, rtol=1e-5, atol=1e-6)


def test_mlp_gradient_reaches_only_the_agent_it_depends_on():
    net = _mlp(False, False)
    x = torch.randn(4, N, D)
    net(x)[:, 1].sum().backward()
    g = net.params["0__weight"].grad
    assert g[1].abs().sum() > 0 and g[0].abs().sum() == 0 and g[2].abs().sum() == 0


def test_shared_vs_independent_parameters():
    shared, independent = _mlp(False, True), _mlp(False, False)
    n_shared = sum(p.numel() for p in shared.parameters())
    assert sum(p.numel() for p in independent.parameters()) == N * n_shared
    x = torch.randn(1, D).expand(N, D)  # the same input for every agent
    out_s, out_i = shared(x), independent(x)
    torch.testing.assert_close(out_s[0], out_s[1])
    assert not torch.allclose(out_i[0], out_i[1])  # independent initialisations


@pytest.mark.parametrize("share_params", [False, True], ids=["independent", "shared"])
@pytest.mark.parametrize("centralized", [False, True], ids=["decentralized", "centralized"])
def test_centralized_reads_every_agent(centralized, share_params):
    net = _mlp(centralized, share_params)
    x = torch.randn(5, N, D)
    x2 = x.clone()
    x2[:, 2] += 1.0  # only agent 2's input changes
    changed = (net(x) - net(x2)).abs().amax((0, 2)) > 1e-6  # per agent
    assert changed.tolist() == ([True] * N if centralized else [False, False, True])


@pytest.mark.parametrize("share_params", [False, True], ids=["independent", "shared"])
@pytest.mark.parametrize("centralized", [False, True], ids=["decentralized", "centralized"])
def test_convnet_equals_loop(centralized, share_params):
    torch.manual_seed(0)
    net = MultiAgentConvNet(N, centralized, share_params, in_features=2, num_cells=[3, 4], kernel_sizes=3,
                            strides=1)
    x = torch.randn(2, 2, N, 2, 7, 7)
    out = net(x)
    assert out.shape == (2, 2, N, 4 * 3 * 3)
    torch.testing.assert_close(out, _loop_reference(net, x, centralized, flat_dims=3), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "shape, match",
    [((5, N + 1, D), r"n_agents=3 at dim -2, got shape \[5, 4, 4\]"),
     ((5, N, D + 1), r"n_agent_inputs=4 features in the last dim, got shape \[5, 3, 5\]"),
     ((D,), r"n_agents=3 at dim -2, got shape \[4\]")],
)
def test_mlp_bad_input_names_expected_and_actual(shape, match):
    with pytest.raises(ValueError, match=match):
        _mlp(False, False)(torch.randn(*shape))


def test_convnet_bad_input():
    net = MultiAgentConvNet(N, False, False, in_features=2, num_cells=[3], kernel_sizes=3, strides=1)
    with pytest.raises(ValueError, match=r"n_agents=3 at dim -4, got shape \[2, 2, 2, 7, 7\]"):
        net(torch.randn(2, 2, 2, 7, 7))
    with pytest.raises(ValueError, match=r"in_features=2 channels at dim -3"):
        net(torch.randn(2, N, 1, 7, 7))


def test_constructor_errors():
    with pytest.raises(TypeError, match="centralized=True|False"):
        MultiAgentMLP(D, OUT, N, share_params=True)
    with pytest.raises(ValueError, match="lazy input size"):
        MultiAgentMLP(None, OUT, N, centralized=False, share_params=False)
    with pytest.raises(ValueError, match="n_agents must be >= 1"):
        MultiAgentMLP(D, OUT, 0, centralized=False, share_params=False)


def test_state_dict_and_pickle_round_trip():
    a, b = _mlp(True, False, seed=0), _mlp(True, False, seed=1)
    x = torch.randn(4, N, D)
    assert not torch.allclose(a(x), b(x))
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(a(x), b(x))
    torch.testing.assert_close(pickle.loads(pickle.dumps(a))(x), a(x))


@pytest.mark.parametrize("share_params", [False, True], ids=["independent", "shared"])
@pytest.mark.parametrize("centralized", [False, True], ids=["decentralized", "centralized"])
def test_compile_fullgraph(centralized, share_params):
    torch._dynamo.reset()
    net = _mlp(centralized, share_params)
    counter = CompileCounter()
    compiled = torch.compile(net, fullgraph=True, backend=counter)
    x = torch.randn(6, N, D)
    torch.testing.assert_close(compiled(x), net(x))
    assert counter.frame_count == 1
    torch._dynamo.reset()


def _deterministic_policy():
    from steersman.tensordict.nn import TensorDictModule

    torch.manual_seed(0)
    obs_dim = 6 + 2 * (N - 1)
    net = nn.Sequential(MultiAgentMLP(obs_dim, 2, N, centralized=False, share_params=False, depth=1, num_cells=8),
                        nn.Tanh())
    return TensorDictModule(net, [("agents", "observation")], [("agents", "action")])


def test_multiprocess_collector_runs_and_updates_agent_weights():
    """pytorch/rl#2180: multi-agent nets broke in multi-process collectors. Here the policy
    is pickled into the workers, collects, and a weight update reaches the stacked params."""
    from steersman.collectors import MultiSyncDataCollector
    from steersman.envs.multiagent import NavigationEnv

    make_env = functools.partial(NavigationEnv, num_envs=2, n_agents=N, max_steps=10)
    policy = _deterministic_policy()
    collector = MultiSyncDataCollector([make_env, make_env], policy, frames_per_batch=2 * 2 * 4,
                                       total_frames=10**6)
    try:
        collector.set_seed(0)
        it = iter(collector)
        batch = next(it)
        action = batch["agents", "action"]
        assert action.shape[-2:] == (N, 2) and action.abs().sum() > 0
        with torch.no_grad():
            for p in policy.parameters():
                p.zero_()
        collector.update_policy_weights_()
        batch = next(it)
        assert batch["agents", "action"].abs().sum() == 0  # every worker now runs the zeroed agents
    finally:
        collector.shutdown()


# ------------------------------------------------------------------ mixers
def test_vdn_is_the_sum():
    q = torch.randn(2, 5, N, 1)
    torch.testing.assert_close(VDNMixer(N)(q), q.sum(-2))


def _qmix_reference(mixer, q, s):
    """QMIX written per sample with plain matrices."""
    out = []
    for qb, sb in zip(q.reshape(-1, N), s.reshape(-1, s.shape[-1])):
        w1 = mixer.hyper_w_1(sb).abs().view(N, -1)
        b1 = mixer.hyper_b_1(sb)
        h = torch.nn.functional.elu(qb @ w1 + b1)
        w2 = mixer.hyper_w_final(sb).abs()
        out.append(h @ w2 + mixer.V(sb)[0])
    return torch.stack(out).view(*q.shape[:-2], 1)


@pytest.mark.parametrize("batch", [(7,), (2, 3)], ids=str)
def test_qmixer_matches_reference_and_is_monotonic(batch):
    torch.manual_seed(0)
    mixer = QMixer(state_shape=(5,), mixing_embed_dim=8, n_agents=N)
    q = torch.randn(*batch, N, 1, requires_grad=True)
    s = torch.randn(*batch, 5)
    out = mixer(q, s)
    assert out.shape == (*batch, 1)
    torch.testing.assert_close(out, _qmix_reference(mixer, q, s), rtol=1e-5, atol=1e-6)
    (grad,) = torch.autograd.grad(out.sum(), q)
    assert (grad >= 0).all()  # dQ_tot / dQ_i >= 0 (monotonic mixing)


def test_mixer_bad_shapes():
    mixer = QMixer(state_shape=(5,), mixing_embed_dim=8, n_agents=N)
    with pytest.raises(ValueError, match=r"chosen_action_value must be \[\*batch, n_agents=3, 1\], got \[4, 2, 1\]"):
        mixer(torch.randn(4, 2, 1), torch.randn(4, 5))
    with pytest.raises(ValueError, match=r"state must be .* \[4, 5\], got \[4, 6\]"):
        mixer(torch.randn(4, N, 1), torch.randn(4, 6))
    with pytest.raises(TypeError, match="takes"):
        VDNMixer(N)(torch.randn(4, N, 1), torch.randn(4, 5))


# ---------------------------------------------------------------------- CrossGroupCritic
def _cross(share_params=False, detach=None, dims=((12, 3), (8, 2))):
    from steersman.modules import CrossCriticGroupSpec, CrossGroupCritic

    torch.manual_seed(0)
    groups = {f"g{i}": CrossCriticGroupSpec(d, n, (f"g{i}", "observation"), (f"g{i}", "state_value"))
              for i, (d, n) in enumerate(dims)}
    return CrossGroupCritic(groups, d_model=8, trunk_depth=1, trunk_cells=16, share_params=share_params,
                            detach_groups=detach)


def _team_td(batch, dims=((12, 3), (8, 2)), seed=1):
    from steersman.tensordict import TensorDict

    g = torch.Generator().manual_seed(seed)
    return TensorDict({f"g{i}": TensorDict({"observation": torch.randn(*batch, n, d, generator=g)}, [*batch, n])
                       for i, (d, n) in enumerate(dims)}, list(batch))


def _cross_reference(critic, td):
    """The documented computation written out with the critic's own weights."""
    net = critic.module
    emb = []
    for name in net.names:
        lin = net.encoders[name][0]
        emb.append(torch.tanh(td[name, "observation"] @ lin.weight.T + lin.bias))
    team = net.trunk(torch.cat(emb, -2).flatten(-2)).unflatten(-1, (net.n_total, -1))
    out, start = {}, 0
    for name, n in zip(net.names, net.n_agents):
        head = net.shared_head if net.shared_head is not None else net.group_heads[name]
        out[name] = team[..., start:start + n, :] @ head.weight.T + head.bias
        start += n
    return out


@pytest.mark.parametrize("share_params", [False, True])
@pytest.mark.parametrize("batch", [(), (4,), (5, 2)])
def test_cross_group_critic_matches_reference(share_params, batch):
    critic = _cross(share_params)
    td = critic(_team_td(batch))
    want = _cross_reference(critic, td)
    for name, n in (("g0", 3), ("g1", 2)):
        assert td[name, "state_value"].shape == (*batch, n, 1)
        assert torch.allclose(td[name, "state_value"], want[name], atol=1e-6)
    heads = {k.split(".")[1] for k in critic.state_dict() if "head" in k}
    assert heads == ({"shared_head"} if share_params else {"group_heads"})
    assert (critic.module.group_heads is None) == share_params


def test_cross_group_critic_every_value_reads_every_group():
    critic = _cross()
    td = _team_td((4,))
    base = critic(td.clone())
    td2 = td.clone()
    td2["g1", "observation"][:, 1] += 1.0  # one agent of the other group
    moved = critic(td2)
    assert not torch.allclose(base["g0", "state_value"], moved["g0", "state_value"])
    td3 = td.clone()
    td3["g0", "observation"][0] += 1.0  # batch element 0 only: others unchanged
    moved = critic(td3)
    assert torch.equal(base["g1", "state_value"][1:], moved["g1", "state_value"][1:])
    assert not torch.allclose(base["g1", "state_value"][0], moved["g1", "state_value"][0])


def test_cross_group_critic_detach_groups():
    critic, free = _cross(detach=["g1"]), _cross()
    assert torch.equal(critic(_team_td((4,)))["g0", "state_value"], free(_team_td((4,)))["g0", "state_value"])
    for net, g1_grad in ((critic, False), (free, True)):
        td = _team_td((4,))
        for key in ("g0", "g1"):
            td[key, "observation"].requires_grad_(True)
        obs = [td[k, "observation"] for k in ("g0", "g1")]
        out = net(td)
        (out["g0", "state_value"].sum() + out["g1", "state_value"].sum()).backward()
        enc = net.module.encoders["g1"][0].weight.grad
        assert (enc is not None and bool(enc.abs().sum() > 0)) == g1_grad
        assert (obs[1].grad is not None and bool(obs[1].grad.abs().sum() > 0)) == g1_grad
        assert obs[0].grad.abs().sum() > 0 and net.module.trunk[0].weight.grad.abs().sum() > 0


def test_cross_group_critic_is_a_mappo_critic():
    """As MAPPOLoss's critic: the value loss reaches every encoder, the trunk and the head."""
    from steersman.modules import ProbabilisticActor
    from steersman.objectives import MAPPOLoss
    from steersman.tensordict.nn import TensorDictModule

    critic = _cross()
    module = TensorDictModule(nn.Linear(12, 4), [("g0", "observation")], [("g0", "logits")])
    actor = ProbabilisticActor(module, in_keys={"logits": ("g0", "logits")}, out_keys=[("g0", "action")],
                               distribution_class=torch.distributions.Categorical, return_log_prob=True,
                               log_prob_key=("g0", "action_log_prob"))
    loss = MAPPOLoss(actor, critic)
    loss.set_keys(action=("g0", "action"), sample_log_prob=("g0", "action_log_prob"), value=("g0", "state_value"),
                  advantage=("g0", "advantage"), value_target=("g0", "value_target"))
    td = _team_td((6,))
    with torch.no_grad():
        actor(td)
    td["g0", "advantage"], td["g0", "value_target"] = torch.randn(6, 3, 1), torch.randn(6, 3, 1)
    out = loss(td)
    out["loss_critic"].backward()
    for name, p in critic.named_parameters():
        if "g1" in name and "head" in name:  # group g1's own head: no g1 value in this loss
            continue
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("build, err, words", [
    (lambda C, S: C({}), ValueError, ["group_map is empty"]),
    (lambda C, S: C({"a": (3, 2)}), TypeError, ["'a'", "CrossCriticGroupSpec"]),
    (lambda C, S: C({"a": S(0, 2, "o", "v")}), ValueError, ["'a'", "obs_dim=0"]),
    (lambda C, S: C({"a": S(3, 2, "o", "v")}, detach_groups=["b"]), ValueError, ["['b']", "['a']"]),
])
def test_cross_group_critic_constructor_errors(build, err, words):
    from steersman.modules import CrossCriticGroupSpec, CrossGroupCritic

    with pytest.raises(err) as info:
        build(CrossGroupCritic, CrossCriticGroupSpec)
    assert all(w in str(info.value) for w in words), str(info.value)


@pytest.mark.parametrize("g1, words", [
    ((4, 2, 7), ["'g1'", "[4, 2, 7]", "[*B, 2, 8]"]),   # wrong obs_dim
    ((4, 3, 8), ["'g1'", "[4, 3, 8]", "[*B, 2, 8]"]),   # wrong number of agents
    ((5, 2, 8), ["'g0'", "'g1'", "[4]", "[5]"]),         # batch dims differ between groups
])
def test_cross_group_critic_bad_observations_name_the_group(g1, words):
    from steersman.tensordict import TensorDict

    critic = _cross()
    td = TensorDict({"g0": TensorDict({"observation": torch.randn(4, 3, 12)}, [4, 3]),
                     "g1": TensorDict({"observation": torch.randn(*g1)}, list(g1[:-1]))}, [])
    with pytest.raises(ValueError) as info:
        critic(td)
    assert all(w in str(info.value) for w in words), str(info.value)
    assert ("g0", "state_value") not in td.keys(True)
