"""The fused PPO iteration (recipes/fused.py): the compiled step and GAE equal the eager
collector and GAE, and ``compile=true`` trains as the eager recipe does."""

from __future__ import annotations

import pytest
import torch

from steersman.collectors import SyncDataCollector
from steersman.envs.native import AcrobotEnv, CartPoleEnv, GridWorldEnv, MountainCarEnv
from steersman.objectives.value import GAE
from steersman.recipes.fused import FusedCollector, FusedGAE, cacheable_scan, fusable
from steersman.recipes.ppo import PPOConfig, make_critic, make_policy

ENVS = [CartPoleEnv, AcrobotEnv, MountainCarEnv]


def _pair(env_cls, seed=3, n=4, T=16, total=64 * 4):
    cfg = PPOConfig()
    envs = [env_cls(batch_size=[n], seed=seed) for _ in range(2)]
    torch.manual_seed(seed)
    policy = make_policy(cfg, envs[0])
    eager = SyncDataCollector(envs[0], policy, frames_per_batch=n * T, total_frames=total)
    fused = FusedCollector(envs[1], policy, frames_per_batch=n * T, total_frames=total, compile=False)
    return cfg, policy, eager, fused


@pytest.mark.parametrize("env_cls", ENVS, ids=lambda c: c.__name__)
def test_fused_step_equals_eager_collector(env_cls):
    """Same seed, same policy: every entry of every batch and the collector state are equal
    bit for bit (actions from the same global generator, the env's own step)."""
    _, _, eager, fused = _pair(env_cls)
    for _ in range(2):
        torch.manual_seed(11)
        a = next(iter(eager))
        torch.manual_seed(11)
        b = next(iter(fused))
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        for k in a.keys(True, True):
            assert torch.equal(a[k], b[k]), k
    sa, sb = eager.state_dict(), fused.state_dict()
    assert torch.equal(sa["traj_ids"], sb["traj_ids"])
    for k, v in sa["carried"]["data"].items():
        assert torch.equal(v, sb["carried"]["data"][k]), k


def test_fused_gae_equals_gae():
    cfg, policy, eager, _ = _pair(CartPoleEnv)
    critic = make_critic(cfg, eager.env)
    batch = next(iter(eager))
    ref = GAE(gamma=0.98, lmbda=0.8, value_network=critic)(batch.clone())
    out = FusedGAE(critic, gamma=0.98, lmbda=0.8, compile=False)(batch.clone())
    for k in ("advantage", "value_target", "state_value", ("next", "state_value")):
        torch.testing.assert_close(out[k], ref[k])


def test_fusable_names_what_is_missing():
    cfg = PPOConfig()
    env = CartPoleEnv(batch_size=[2])
    assert fusable(env, make_policy(cfg, env), make_critic(cfg, env)) is None
    assert "not a torch-native env" in fusable(object(), make_policy(cfg, env))
    assert "not a float vector" in fusable(GridWorldEnv(batch_size=[2]), make_policy(cfg, env))
    with pytest.raises(ValueError, match="FusedCollector: the actor is not"):
        FusedCollector(env, make_critic(cfg, env), frames_per_batch=4, total_frames=8)


def test_compiled_rollout_is_one_graph_and_equals_eager():
    """The whole rollout (n_steps of policy + env) traces into one graph, compiled once for
    every batch, and gives the eager collector's batches bit for bit. That graph (a
    ``scan``) is one inductor's on-disk caches store while it compiles (torch refuses
    graphs with a ``scan`` by default: a warm start would trace, functionalize and
    generate its code again), and the opt-in ends with the compile."""
    from torch._functorch._aot_autograd.autograd_cache import (
        BypassAOTAutogradCache,
        check_cacheable,
    )
    from torch._higher_order_ops.scan import scan_op

    graphs, cacheable = [], []

    def backend(gm, example_inputs):  # counts graphs; checks, as the compile runs, that the cache takes it
        graphs.append(gm)
        check_cacheable(gm)  # raises BypassAOTAutogradCache if not
        cacheable.append(scan_op.cacheable())
        return gm.forward

    cfg = PPOConfig()
    envs = [CartPoleEnv(batch_size=[4], seed=5) for _ in range(2)]
    torch.manual_seed(0)
    policy = make_policy(cfg, envs[0])
    eager = SyncDataCollector(envs[0], policy, frames_per_batch=64, total_frames=10**6)
    fused = FusedCollector(envs[1], policy, frames_per_batch=64, total_frames=10**6, backend=backend)
    it_e, it_f = iter(eager), iter(fused)
    for i in range(3):
        with torch.no_grad():  # a new policy each batch: the graph reads the current parameters
            next(policy.parameters()).add_(0.1 * i)
        torch.manual_seed(i)
        a = next(it_e)
        torch.manual_seed(i)
        b = next(it_f)
        for k in a.keys(True, True):
            assert torch.equal(a[k], b[k]), k
    assert len(graphs) == 1 and cacheable == [True]
    assert fused.compiled
    assert any(n.target is scan_op for n in graphs[0].graph.nodes)
    assert not scan_op.cacheable()  # torch's default again outside the compile
    with pytest.raises(BypassAOTAutogradCache, match="scan"):
        check_cacheable(graphs[0])
    with cacheable_scan():
        check_cacheable(graphs[0])
        assert scan_op.cacheable()
    assert not scan_op.cacheable()


def test_rollout_that_cannot_compile_falls_back_with_one_warning():
    """A rollout dynamo refuses runs eagerly from then on, after one warning saying why,
    with the eager collector's batches (the failed attempt changed nothing)."""
    _, _, eager, fused = _pair(CartPoleEnv)

    def refuse(*args):
        raise torch._dynamo.exc.Unsupported("planted: cannot trace this")

    fused._fn, fused.compiled = refuse, True
    it = iter(fused)
    for i in range(2):
        torch.manual_seed(i)
        a = next(iter(eager))
        torch.manual_seed(i)
        if i == 0:
            with pytest.warns(UserWarning, match=r"rollout of CartPoleEnv cannot be compiled \(planted: cannot"):
                b = next(it)
        else:
            b = next(it)
        for k in a.keys(True, True):
            assert torch.equal(a[k], b[k]), k
    assert not fused.compiled


def test_plain_mlps_run_layer_by_layer_others_through_functional_call():
    """The fused graphs run make_policy's/make_critic's MLPs layer by layer (F.linear and
    the activation: the modules' own ops, bit for bit, with new parameters swapped in); a
    network with any other parametrised layer goes through functional_call."""
    from torch import nn

    from steersman.modules import MLP
    from steersman.recipes.fused import _flat, _program, _run_net

    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    for net, kinds in ((MLP(in_features=4, out_features=2, num_cells=[8, 8], activation_class=nn.Tanh),
                        ["linear", "call", "linear", "call", "linear"]),
                       (nn.Sequential(nn.Linear(4, 3, bias=False), nn.ReLU()), ["linear", "call"]),
                       (nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8)), None)):
        names, params = _flat(net)
        program = _program(net, names)
        assert (None if program is None else [s[0] for s in program]) == kinds
        new = tuple(p + 0.25 for p in params)
        expected = torch.func.functional_call(net, dict(zip(names, new)), (x,))
        assert torch.equal(_run_net(net, names, program, new, x), expected)
        assert not torch.equal(expected, net(x))  # the new parameters were used
