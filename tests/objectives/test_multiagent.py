"""Multi-agent losses against plain references written here (values and gradients):
MultiAgentGAE, MAPPOLoss/IPPOLoss (per-agent advantage normalization, value norm),
QMixerLoss (QMIX and VDN); and the single-agent losses on a group through
``agent_batch``: IQL (DQN per agent), MADDPG (DDPG with a centralised critic), MASAC."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributions as D
from torch import nn

from steersman.modules import (
    IndependentNormal,
    MultiAgentMLP,
    NormalParamExtractor,
    QMixer,
    RunningValueNorm,
    TanhNormal,
    VDNMixer,
)
from steersman.objectives import (
    DDPGLoss,
    DQNLoss,
    IPPOLoss,
    MAPPOLoss,
    MultiAgentGAE,
    QMixerLoss,
    SACLoss,
    agent_batch,
)
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import (
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
)

N, OBS, ACT, N_ACT, STATE = 3, 4, 2, 5, 6
G = "agents"


# ------------------------------------------------------------------ batches
def _flags(shape):
    """Terminations and truncations inside the batch (time last when there is one)."""
    term = torch.zeros(*shape, 1, dtype=torch.bool)
    trunc = torch.zeros(*shape, 1, dtype=torch.bool)
    if len(shape) > 1:
        term[..., shape[-1] // 3, :] = True
        trunc[..., (2 * shape[-1]) // 3, :] = True
    else:
        term[1] = True
        trunc[2] = True
    return term, trunc


def _batch(shape, *, discrete=False, team_reward=False):
    torch.manual_seed(1)
    term, trunc = _flags(shape)

    def step():
        return {G: TensorDict({"observation": torch.randn(*shape, N, OBS)}, [*shape, N]),
                "state": torch.randn(*shape, STATE)}

    nxt = {**step(), "done": term | trunc, "terminated": term, "truncated": trunc}
    if team_reward:
        nxt["reward"] = torch.randn(*shape, 1)
    else:
        nxt[G].set("reward", torch.randn(*shape, N, 1))
    td = TensorDict({**step(), "next": nxt}, list(shape))
    if discrete:
        td[G, "action"] = torch.randint(N_ACT, (*shape, N))
    else:
        td[G, "action"] = torch.rand(*shape, N, ACT) * 1.8 - 0.9
    return td


# ------------------------------------------------------------------ GAE
def _gae_reference(gamma, lmbda, v, nv, r, done, term):
    """Plain GAE over the time dim (dim 1) of [B, T] floats."""
    adv = torch.zeros_like(v)
    for b in range(v.shape[0]):
        a = 0.0
        for t in reversed(range(v.shape[1])):
            delta = r[b, t] + gamma * nv[b, t] * (1 - float(term[b, t])) - v[b, t]
            a = delta + gamma * lmbda * (1 - float(done[b, t])) * a
            adv[b, t] = a
    return adv


@pytest.mark.parametrize("team_reward", [False, True], ids=["agent_reward", "team_reward"])
def test_multiagent_gae_equals_per_agent_reference(team_reward):
    B, T = 2, 7
    td = _batch((B, T), team_reward=team_reward)
    td[G, "state_value"] = torch.randn(B, T, N, 1)
    td["next", G, "state_value"] = torch.randn(B, T, N, 1)
    gae = MultiAgentGAE(gamma=0.9, lmbda=0.8).set_keys(
        value=(G, "state_value"), advantage=(G, "advantage"), value_target=(G, "value_target"),
        reward="reward" if team_reward else (G, "reward"))
    gae(td)
    assert td[G, "advantage"].shape == (B, T, N, 1)
    for i in range(N):
        r = td["next", "reward"][..., 0] if team_reward else td["next", G, "reward"][..., i, 0]
        ref = _gae_reference(0.9, 0.8, td[G, "state_value"][..., i, 0], td["next", G, "state_value"][..., i, 0],
                             r, td["next", "done"][..., 0], td["next", "terminated"][..., 0])
        torch.testing.assert_close(td[G, "advantage"][..., i, 0], ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(td[G, "value_target"][..., i, 0], ref + td[G, "state_value"][..., i, 0])


def test_multiagent_gae_bad_shapes():
    td = _batch((2, 5))
    td[G, "state_value"] = torch.randn(2, 5, N, 1)
    td["next", G, "state_value"] = torch.randn(2, 5, N, 1)
    td["next", "done"] = torch.zeros(2, 5, 2, dtype=torch.bool)
    gae = MultiAgentGAE(gamma=0.9).set_keys(value=(G, "state_value"), reward=(G, "reward"))
    with pytest.raises(ValueError, match=r"\('next', 'done'\).*shape \[2, 5, 2\]; expected the value's shape \[2, 5, 3, 1\]"):
        gae(td)


# ------------------------------------------------------------------ MAPPO / IPPO
def _actor():
    net = nn.Sequential(MultiAgentMLP(OBS, 2 * ACT, N, centralized=False, share_params=False, depth=1, num_cells=8),
                        NormalParamExtractor())
    return ProbabilisticTensorDictSequential(
        TensorDictModule(net, [(G, "observation")], [(G, "loc"), (G, "scale")]),
        ProbabilisticTensorDictModule({"loc": (G, "loc"), "scale": (G, "scale")}, [(G, "action")],
                                      IndependentNormal, distribution_kwargs={"validate_args": False},
                                      return_log_prob=True, log_prob_key=(G, "action_log_prob")))


def _critic(centralized):
    net = MultiAgentMLP(OBS, 1, N, centralized=centralized, share_params=centralized, depth=1, num_cells=8)
    return TensorDictModule(net, [(G, "observation")], [(G, "state_value")])


PPO_KEYS = dict(action=(G, "action"), sample_log_prob=(G, "action_log_prob"), value=(G, "state_value"),
                advantage=(G, "advantage"), value_target=(G, "value_target"), reward=(G, "reward"))


def _ppo_batch(shape):
    td = _batch(shape)
    td[G, "action_log_prob"] = torch.randn(*shape, N) * 0.3 - 2.0
    td[G, "advantage"] = torch.randn(*shape, N, 1) * torch.tensor([1.0, 5.0, 0.2]).view(N, 1) + 3.0
    td[G, "value_target"] = torch.randn(*shape, N, 1) * 4 + 1
    return td


def _ppo_reference(actor, critic, td, eps, ent_coef, vn_stats=None):
    """Clipped PPO written plainly on [*B, n] tensors; advantages standardized per agent."""
    params = actor.module[0].module(td[G, "observation"])  # loc, scale
    dist = D.Independent(D.Normal(*params), 1)
    lp = dist.log_prob(td[G, "action"])
    a = td[G, "advantage"][..., 0]
    dims = tuple(range(a.ndim - 1))
    a = (a - a.mean(dims, keepdim=True)) / a.std(dims, keepdim=True).clamp_min(1e-6)
    ratio = (lp - td[G, "action_log_prob"]).exp()
    obj = -torch.minimum(ratio * a, ratio.clamp(1 - eps, 1 + eps) * a).mean()
    ent = -ent_coef * dist.entropy().mean()
    v = critic.module(td[G, "observation"])
    target = td[G, "value_target"]
    if vn_stats is not None:
        m, s = vn_stats
        v, target = (v - m) / s, (target - m) / s
    return obj, ent, (v - target).pow(2).mean()


@pytest.mark.parametrize("shape", [(8,), (4, 6)], ids=str)
@pytest.mark.parametrize("cls, centralized", [(MAPPOLoss, True), (IPPOLoss, False)], ids=["mappo", "ippo"])
@pytest.mark.parametrize("value_norm", [False, True], ids=["plain", "value_norm"])
def test_ppo_losses_equal_reference(cls, centralized, shape, value_norm):
    torch.manual_seed(0)
    actor, critic = _actor(), _critic(centralized)
    vn = RunningValueNorm() if value_norm else None
    loss = cls(actor, critic, clip_epsilon=0.2, entropy_coeff=0.01, loss_critic_type="l2", value_norm=vn)
    loss.set_keys(**PPO_KEYS)
    td = _ppo_batch(shape)
    out = loss(td)
    stats = None
    if value_norm:
        t = td[G, "value_target"].reshape(-1)
        stats = (t.mean(), (t.var(correction=0) + vn.epsilon).sqrt())
        assert float(vn.count) == t.numel()  # the call folded the minibatch's targets in
    ref = _ppo_reference(actor, critic, td, 0.2, 0.01, stats)
    for name, r in zip(("loss_objective", "loss_entropy", "loss_critic"), ref):
        torch.testing.assert_close(out[name], r, rtol=1e-5, atol=1e-6)
    # gradients: of the loss module's sum and of the reference's sum
    params = [p for p in loss.parameters() if p.requires_grad]
    grads = torch.autograd.grad(out["loss_objective"] + out["loss_entropy"] + out["loss_critic"], params)
    ref_grads = torch.autograd.grad(sum(ref), params)
    for g, rg in zip(grads, ref_grads):
        torch.testing.assert_close(g, rg, rtol=1e-4, atol=1e-6)


def test_ppo_loss_computes_multiagent_gae_when_the_advantage_is_missing():
    torch.manual_seed(0)
    loss = MAPPOLoss(_actor(), _critic(True)).set_keys(**PPO_KEYS)
    loss.make_value_estimator(gamma=0.9, lmbda=0.7)
    assert isinstance(loss.value_estimator, MultiAgentGAE)
    td = _ppo_batch((3, 5)).exclude((G, "advantage"), (G, "value_target"))
    out = loss(td.copy())
    expected = td.copy()
    MultiAgentGAE(gamma=0.9, lmbda=0.7, value_network=loss.critic_network).set_keys(**{
        k: v for k, v in PPO_KEYS.items() if k in ("value", "advantage", "value_target", "reward")})(expected)
    out2 = loss(expected)
    torch.testing.assert_close(out["loss_objective"], out2["loss_objective"])


def test_ppo_loss_bad_shapes():
    loss = MAPPOLoss(_actor(), _critic(True)).set_keys(**PPO_KEYS)
    td = _ppo_batch((8,))
    td[G, "action_log_prob"] = torch.randn(8, N, 1)
    with pytest.raises(ValueError, match=r"log-probabilities must be \[\*batch, n_agents\].*got \[8, 3\].*\[8, 3, 1\]"):
        loss(td)
    td = _ppo_batch((8,))
    td.set("advantage", torch.randn(8, 2))
    with pytest.raises(ValueError, match=r"'advantage' has shape \[8, 2\]"):
        loss.set_keys(advantage="advantage")(td)


# ------------------------------------------------------------------ QMIX / VDN
def _local():
    net = MultiAgentMLP(OBS, N_ACT, N, centralized=False, share_params=True, depth=1, num_cells=8)
    return TensorDictModule(net, [(G, "observation")], [(G, "action_value")])


def _mixer(kind):
    if kind == "vdn":
        return TensorDictModule(VDNMixer(N), [(G, "chosen_action_value")], ["chosen_action_value"])
    return TensorDictModule(QMixer(state_shape=(STATE,), mixing_embed_dim=8, n_agents=N),
                            [(G, "chosen_action_value"), "state"], ["chosen_action_value"])


def _mix(mixer, q, state):
    return mixer.module(q) if isinstance(mixer.module, VDNMixer) else mixer.module(q, state)


@pytest.mark.parametrize("kind", ["qmix", "vdn"])
@pytest.mark.parametrize("one_hot", [False, True], ids=["index", "one_hot"])
def test_qmixer_loss_equals_reference(kind, one_hot):
    torch.manual_seed(0)
    local, mixer = _local(), _mixer(kind)
    target_local, target_mixer = copy.deepcopy(local), copy.deepcopy(mixer)
    loss = QMixerLoss(local, mixer)
    loss.make_value_estimator(gamma=0.9)
    with torch.no_grad():  # the online nets move; the targets keep the weights of construction
        for p in loss.parameters():
            if p.requires_grad:
                p.add_(0.1)
    td = _batch((8,), discrete=True, team_reward=True)
    td["next", G, "action_mask"] = torch.rand(8, N, N_ACT) > 0.3
    td["next", G, "action_mask"][..., 0] = True
    if one_hot:
        td[G, "action"] = nn.functional.one_hot(td[G, "action"], N_ACT)
    out = loss(td)
    # reference
    index = td[G, "action"].argmax(-1) if one_hot else td[G, "action"]
    q = local.module(td[G, "observation"]).gather(-1, index.unsqueeze(-1))
    pred = _mix(mixer, q, td["state"])
    next_q = target_local.module(td["next", G, "observation"])
    next_q = next_q.masked_fill(~td["next", G, "action_mask"], -1e30).max(-1, keepdim=True).values
    nxt = _mix(target_mixer, next_q, td["next", "state"])
    target = td["next", "reward"] + 0.9 * (~td["next", "terminated"]).float() * nxt
    ref = (pred - target.detach()).pow(2).mean()
    torch.testing.assert_close(out["loss"], ref, rtol=1e-5, atol=1e-6)
    params = [p for p in loss.parameters() if p.requires_grad]
    for g, rg in zip(torch.autograd.grad(out["loss"], params), torch.autograd.grad(ref, params, allow_unused=True)):
        torch.testing.assert_close(g, torch.zeros_like(g) if rg is None else rg, rtol=1e-4, atol=1e-6)
    assert td["td_error"].shape == (8, 1)
    assert all(not p.requires_grad for p in loss.target_local_value_network.parameters())


def test_qmixer_loss_bad_action_shape():
    loss = QMixerLoss(_local(), _mixer("qmix"))
    td = _batch((8,), discrete=True, team_reward=True)
    td[G, "action"] = torch.randint(N_ACT, (8, N, 2))
    with pytest.raises(ValueError, match=r"categorical action must have shape \[8, 3\] or \[8, 3, 1\], got \[8, 3, 2\]"):
        loss(td)


# ------------------------------------------------------------------ single-agent losses on a group
def test_agent_batch_layout_and_errors():
    td = _batch((4, 5), team_reward=True)
    flat = agent_batch(td, broadcast=("done", "terminated", "reward", "state"))
    assert flat.batch_size == (4, 5, N)
    torch.testing.assert_close(flat["next", "reward"][..., 2, :], td["next", "reward"])
    assert flat["state"].shape == (4, 5, N, STATE)
    assert torch.equal(flat["next", "terminated"][:, :, 1], td["next", "terminated"])
    with pytest.raises(KeyError, match="no group 'team'"):
        agent_batch(td, "team")
    # a group stored with the outer batch dims only (as a collector may hand it out) gets
    # its agent dim back from its leaves
    flat_group = TensorDict({G: TensorDict({"observation": torch.zeros(4, N, OBS)}, [4]),
                             "next": {G: TensorDict({"reward": torch.ones(4, N, 1)}, [4]),
                                      "done": torch.zeros(4, 1, dtype=torch.bool)}}, [4])
    out = agent_batch(flat_group)
    assert out.batch_size == (4, N) and out["next"].batch_size == (4, N) and out["next", "done"].shape == (4, N, 1)


def test_iql_is_dqn_per_agent():
    torch.manual_seed(0)
    local = TensorDictModule(MultiAgentMLP(OBS, N_ACT, N, centralized=False, share_params=False, depth=1,
                                           num_cells=8), ["observation"], ["action_value"])
    loss = DQNLoss(local, action_space="categorical", delay_value=False)
    loss.make_value_estimator(gamma=0.9)
    td = _batch((8,), discrete=True)
    out = loss(agent_batch(td))
    q = local.module(td[G, "observation"])
    pred = q.gather(-1, td[G, "action"].unsqueeze(-1))
    nq = local.module(td["next", G, "observation"]).max(-1, keepdim=True).values.detach()
    target = td["next", G, "reward"] + 0.9 * (~td["next", "terminated"]).float().unsqueeze(-2) * nq
    torch.testing.assert_close(out["loss"], (pred - target).pow(2).mean(), rtol=1e-5, atol=1e-6)


def _maddpg_nets():
    actor = TensorDictModule(nn.Sequential(MultiAgentMLP(OBS, ACT, N, centralized=False, share_params=False,
                                                         depth=1, num_cells=8), nn.Tanh()),
                             ["observation"], ["action"])
    critic = TensorDictModule(MultiAgentMLP(OBS + ACT, 1, N, centralized=True, share_params=False, depth=1,
                                            num_cells=8), ["observation", "action"], ["state_action_value"])
    return actor, critic


def test_maddpg_is_ddpg_with_a_centralised_critic():
    torch.manual_seed(0)
    actor, critic = _maddpg_nets()
    loss = DDPGLoss(actor, critic, loss_function="l2")
    loss.make_value_estimator(gamma=0.9)
    target_critic = copy.deepcopy(critic)
    td = _batch((8,))
    out = loss(agent_batch(td))
    q = critic.module
    obs, act = td[G, "observation"], td[G, "action"]
    nobs = td["next", G, "observation"]
    ref_actor = -q(obs, actor.module(obs)).mean()
    next_q = target_critic.module(nobs, actor.module(nobs)).detach()
    target = td["next", G, "reward"] + 0.9 * (~td["next", "terminated"]).float().unsqueeze(-2) * next_q
    ref_value = (q(obs, act) - target).pow(2).mean()
    torch.testing.assert_close(out["loss_actor"], ref_actor, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out["loss_value"], ref_value, rtol=1e-5, atol=1e-6)
    # centralised: agent 0's Q-value moves with agent 2's action
    act2 = act.clone()
    act2[:, 2] += 0.5
    assert not torch.allclose(q(obs, act)[:, 0], q(obs, act2)[:, 0])


def test_masac_is_sac_on_group_entries():
    torch.manual_seed(0)
    net = nn.Sequential(MultiAgentMLP(OBS, 2 * ACT, N, centralized=False, share_params=True, depth=1, num_cells=8),
                        NormalParamExtractor())
    actor = ProbabilisticTensorDictSequential(
        TensorDictModule(net, ["observation"], ["loc", "scale"]),
        ProbabilisticTensorDictModule(["loc", "scale"], ["action"], TanhNormal, return_log_prob=True))
    critic = TensorDictModule(MultiAgentMLP(OBS + ACT, 1, N, centralized=True, share_params=True, depth=1,
                                            num_cells=8), ["observation", "action"], ["state_action_value"])
    loss = SACLoss(actor, critic, action_spec=None, target_entropy=-float(ACT))
    td = agent_batch(_batch((8,)))
    out = loss(td)
    terms = {k: v for k, v in out.items() if k.startswith("loss_")}
    assert set(terms) == {"loss_actor", "loss_qvalue", "loss_alpha"}
    assert all(torch.isfinite(v) for v in terms.values())
    actor_params = [p for p in loss.actor_network.parameters()]
    g = torch.autograd.grad(out["loss_actor"], actor_params, allow_unused=True)
    assert any(x is not None and x.abs().sum() > 0 for x in g)
    qv = [p for n, p in loss.named_parameters() if n.startswith("qvalue_network_params")]
    gq = torch.autograd.grad(out["loss_qvalue"], qv + actor_params, allow_unused=True)
    assert any(x is not None and x.abs().sum() > 0 for x in gq[: len(qv)])
    assert all(x is None or x.abs().sum() == 0 for x in gq[len(qv):])  # the critic loss leaves the actor alone
