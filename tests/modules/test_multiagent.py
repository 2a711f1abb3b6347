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
