"""ReinforceLoss, BCLoss, TD3BCLoss and DiscreteCQLLoss against plain-torch references
(values and gradients); the battery (cases_parity.py) covers the shared contract."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from steersman.objectives import BCLoss, DiscreteCQLLoss, ReinforceLoss, TD3BCLoss
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import (
    OneHotCategorical,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
)

B, OBS, N, ACT = 6, 3, 4, 2


def _grads(params):
    return [p.grad.clone() for p in params]


def _categorical_actor(net):
    return ProbabilisticTensorDictSequential(
        TensorDictModule(net, ["observation"], ["logits"]),
        ProbabilisticTensorDictModule(["logits"], ["action"], OneHotCategorical),
    )


def test_reinforce_matches_the_score_function_and_critic_regression():
    torch.manual_seed(0)
    pi_net, v_net = nn.Linear(OBS, N), nn.Linear(OBS, 1)
    loss = ReinforceLoss(_categorical_actor(pi_net), TensorDictModule(v_net, ["observation"], ["state_value"]))
    obs, a = torch.randn(B, OBS), torch.randint(N, (B,))
    adv, target = torch.randn(B, 1), torch.randn(B, 1)
    td = TensorDict({"observation": obs, "action": F.one_hot(a, N), "advantage": adv, "value_target": target}, [B])
    out = loss(td)
    (out["loss_actor"] + out["loss_value"]).backward()
    got = _grads([*pi_net.parameters(), *v_net.parameters()])
    for p in [*pi_net.parameters(), *v_net.parameters()]:
        p.grad = None
    ref_actor = -(pi_net(obs).log_softmax(-1).gather(-1, a[:, None])[:, 0] * adv[:, 0]).mean()
    ref_value = F.smooth_l1_loss(v_net(obs), target)
    torch.testing.assert_close(out["loss_actor"], ref_actor)
    torch.testing.assert_close(out["loss_value"], ref_value)
    (ref_actor + ref_value).backward()
    for g, p in zip(got, [*pi_net.parameters(), *v_net.parameters()]):
        torch.testing.assert_close(g, p.grad)


def test_reinforce_without_critic_and_delay_value_needs_one():
    actor = _categorical_actor(nn.Linear(OBS, N))
    td = TensorDict({"observation": torch.randn(B, OBS), "action": F.one_hot(torch.randint(N, (B,)), N),
                     "advantage": torch.randn(B, 1)}, [B])
    assert set(ReinforceLoss(actor)(td).keys()) == {"loss_actor"}
    with pytest.raises(ValueError, match="delay_value"):
        ReinforceLoss(actor, delay_value=True)


@pytest.mark.parametrize("kind", ["nll", "l2", "l1", "cross_entropy", "callable"])
def test_bc_loss_matches_its_distance(kind):
    torch.manual_seed(1)
    net = nn.Linear(OBS, N)
    obs = torch.randn(B, OBS)
    if kind == "nll":
        a = torch.randint(N, (B,))
        loss, action = BCLoss(_categorical_actor(net)), F.one_hot(a, N)
        ref = lambda: -net(obs).log_softmax(-1).gather(-1, a[:, None]).mean()  # noqa: E731
    elif kind == "cross_entropy":
        a = torch.randint(N, (B,))
        loss, action = BCLoss(TensorDictModule(net, ["observation"], ["action"]), loss_function="cross_entropy"), a
        ref = lambda: F.cross_entropy(net(obs), a)  # noqa: E731
    else:
        action = torch.randn(B, N)
        fn = {"l2": "l2", "l1": "l1", "callable": lambda p, t: (p - t).abs().max(-1).values}[kind]
        loss = BCLoss(TensorDictModule(net, ["observation"], ["action"]), loss_function=fn)
        ref = {"l2": lambda: F.mse_loss(net(obs), action), "l1": lambda: F.l1_loss(net(obs), action),
               "callable": lambda: (net(obs) - action).abs().max(-1).values.mean()}[kind]
    out = loss(TensorDict({"observation": obs, "action": action}, [B]))["loss_bc"]
    out.backward()
    got = _grads(net.parameters())
    net.zero_grad(set_to_none=True)
    expected = ref()
    expected.backward()
    torch.testing.assert_close(out, expected)
    for g, p in zip(got, net.parameters()):
        torch.testing.assert_close(g, p.grad)
    with pytest.raises(ValueError, match="loss_function"):
        BCLoss(net, loss_function="huber")


class _Q(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(OBS + ACT, 1)

    def forward(self, observation, action):
        return self.net(torch.cat([observation, action], -1))


def _transitions(action):
    return TensorDict({
        "observation": torch.randn(B, OBS), "action": action,
        "next": {"observation": torch.randn(B, OBS), "reward": torch.randn(B, 1),
                 "done": torch.tensor([[False], [True], [True], [False], [False], [False]]),
                 "terminated": torch.tensor([[False], [True], [False], [False], [False], [False]])},
    }, [B])


def test_td3_bc_actor_term_matches_the_paper():
    torch.manual_seed(2)
    mu, q = nn.Linear(OBS, ACT), _Q()
    ref_q = nn.Linear(OBS + ACT, 1).requires_grad_(False)
    ref_q.load_state_dict(q.net.state_dict())  # the first critic of the ensemble holds these weights
    loss = TD3BCLoss(TensorDictModule(mu, ["observation"], ["action"]),
                     TensorDictModule(q, ["observation", "action"], ["state_action_value"]), bounds=(-1.0, 1.0), alpha=2.5)
    td = _transitions(torch.rand(B, ACT) * 2 - 1)
    out = loss(td)
    out["loss_actor"].backward()
    got = _grads(mu.parameters())
    mu.zero_grad(set_to_none=True)
    pi = mu(td["observation"])
    q_pi = ref_q(torch.cat([td["observation"], pi], -1))[:, 0]
    lmbd = 2.5 / q_pi.abs().mean().detach()
    bc = (pi - td["action"]).pow(2).mean(-1)
    expected = (-lmbd * q_pi + bc).mean()
    expected.backward()
    torch.testing.assert_close(out["loss_actor"], expected)
    torch.testing.assert_close(out["lmbd"], lmbd)
    torch.testing.assert_close(out["bc_loss"], bc.mean().detach())
    for g, p in zip(got, mu.parameters()):
        torch.testing.assert_close(g, p.grad)
    with pytest.raises(ValueError, match="alpha"):
        TD3BCLoss(TensorDictModule(mu, ["observation"], ["action"]),
                  TensorDictModule(q, ["observation", "action"], ["state_action_value"]), bounds=(-1.0, 1.0), alpha=0)


def test_discrete_cql_matches_dqn_regression_plus_conservative_term():
    torch.manual_seed(3)
    net = nn.Linear(OBS, N)
    target_net = nn.Linear(OBS, N).requires_grad_(False)
    target_net.load_state_dict(net.state_dict())  # the target starts equal to the online network
    loss = DiscreteCQLLoss(TensorDictModule(net, ["observation"], ["action_value"]), action_space="categorical")
    loss.make_value_estimator(gamma=0.9)
    a = torch.randint(N, (B,))
    td = _transitions(a)
    out = loss(td)
    (out["loss_qvalue"] + out["loss_cql"]).backward()
    got = _grads(net.parameters())
    net.zero_grad(set_to_none=True)
    q = net(td["observation"])
    q_a = q.gather(-1, a[:, None])[:, 0]
    alive = 1.0 - td["next", "terminated"][:, 0].float()
    y = td["next", "reward"][:, 0] + 0.9 * alive * target_net(td["next", "observation"]).max(-1).values
    ref_q = 0.5 * (q_a - y).pow(2).mean()
    ref_cql = (torch.logsumexp(q, -1) - q_a).mean()
    torch.testing.assert_close(out["loss_qvalue"], ref_q)
    torch.testing.assert_close(out["loss_cql"], ref_cql)
    (ref_q + ref_cql).backward()
    for g, p in zip(got, net.parameters()):
        torch.testing.assert_close(g, p.grad)
    torch.testing.assert_close(td["td_error"][:, 0], (q_a - y).detach().pow(2))


@pytest.mark.parametrize("use_gp", [False, True])
def test_gail_is_the_discriminators_cross_entropy_plus_gradient_penalty(use_gp):
    torch.manual_seed(4)
    lin = nn.Linear(OBS + ACT, 1)

    class D(nn.Module):
        def forward(self, observation, action):
            return lin(torch.cat([observation, action], -1)).sigmoid()

    from steersman.objectives import GAILLoss

    loss = GAILLoss(TensorDictModule(D(), ["observation", "action"], ["d_logits"]), use_grad_penalty=use_gp, gp_lambda=3.0)
    obs_e, act_e, obs_c, act_c = torch.randn(B, OBS), torch.randn(B, ACT), torch.randn(B, OBS), torch.randn(B, ACT)
    td = TensorDict({"observation": obs_e, "action": act_e, "collector_observation": obs_c, "collector_action": act_c}, [B])
    torch.manual_seed(5)
    out = loss(td)
    out["loss"].backward()
    got = _grads(lin.parameters())
    lin.zero_grad(set_to_none=True)
    d_e, d_c = lin(torch.cat([obs_e, act_e], -1)).sigmoid(), lin(torch.cat([obs_c, act_c], -1)).sigmoid()
    expected = -(torch.log(d_e) + torch.log(1 - d_c)).mean()
    if use_gp:
        torch.manual_seed(5)
        u_o, u_a = torch.rand(B, OBS), torch.rand(B, ACT)
        x = torch.cat([u_o * obs_c + (1 - u_o) * obs_e, u_a * act_c + (1 - u_a) * act_e], -1).requires_grad_(True)
        (g,) = torch.autograd.grad(lin(x).sigmoid().sum(), x, create_graph=True)
        gp = 3.0 * (g.norm(dim=-1) - 1).pow(2).mean()
        torch.testing.assert_close(out["gp_loss"], gp.detach())
        expected = expected + gp
    expected.backward()
    torch.testing.assert_close(out["loss"], expected)
    for g, p in zip(got, lin.parameters()):
        torch.testing.assert_close(g, p.grad)


class _Scale:
    """Running statistics stand-in: ``normalize(x) = (x - 1) / 2``."""

    def normalize(self, x):
        return (x - 1.0) / 2.0


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_rnd_is_the_predictors_error_on_a_random_fraction(fraction):
    from steersman.objectives import RNDLoss

    torch.manual_seed(6)
    pred, target = nn.Linear(OBS, 5), nn.Linear(OBS, 5)
    loss = RNDLoss(pred, target, obs_rms=_Scale(), obs_clip=0.5, update_fraction=fraction)
    obs = torch.randn(16, OBS) * 3
    torch.manual_seed(7)
    out = loss(TensorDict({"next": {"observation": obs}}, [16]))["loss_predictor"]
    out.backward()
    got = _grads(pred.parameters())
    pred.zero_grad(set_to_none=True)
    x = ((obs - 1.0) / 2.0).clamp(-0.5, 0.5)
    err = (pred(x) - target(x).detach()).pow(2).mean(-1)
    torch.manual_seed(7)
    mask = torch.rand(16) < fraction if fraction < 1 else torch.ones(16, dtype=torch.bool)
    expected = err[mask].mean()
    expected.backward()
    torch.testing.assert_close(out, expected)
    for g, p in zip(got, pred.parameters()):
        torch.testing.assert_close(g, p.grad)
    assert all(p.grad is None and not p.requires_grad for p in target.parameters())
    with pytest.raises(ValueError, match="update_fraction"):
        RNDLoss(pred, target, update_fraction=0.0)


def test_crossq_without_normalization_is_sac_without_targets():
    """With a critic that has no batch statistics, one joint pass equals two separate ones:
    CrossQ's terms are SAC's with ``delay_qvalue=False`` (same seed, same draws)."""
    from steersman.objectives import CrossQLoss, SACLoss
    from tests.objectives import cases_sac as sac

    torch.manual_seed(8)
    actor, critic = sac.actor(), sac.qvalue()
    crossq = CrossQLoss(actor, critic, target_entropy=-2.0)
    ref = SACLoss(actor, critic, target_entropy=-2.0, delay_qvalue=False)
    ref.load_state_dict(crossq.state_dict())
    td = sac.continuous_batch(None, (7,))
    torch.manual_seed(9)
    out = crossq(td.clone())
    torch.manual_seed(9)
    expected = ref(td.clone())
    for key in ("loss_qvalue", "loss_actor", "loss_alpha"):
        torch.testing.assert_close(out[key], expected[key])
    assert crossq.target_names == []


def test_crossq_normalizes_current_and_next_pairs_together():
    """A batch-norm critic sees both halves in one pass: its running mean (momentum 1) is the
    mean over the current and the next state-action pairs."""
    from steersman.objectives import CrossQLoss
    from steersman.objectives.sac import _sample
    from tests.objectives import cases_sac as sac

    class BNQ(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm1d(sac.OBS + sac.ACT, momentum=1.0)
            self.out = nn.Linear(sac.OBS + sac.ACT, 1)

        def forward(self, observation, action):
            return self.out(self.bn(torch.cat([observation, action], -1)))

    torch.manual_seed(10)
    loss = CrossQLoss(sac.actor(), TensorDictModule(BNQ(), ["observation", "action"], ["state_action_value"]),
                      num_qvalue_nets=1, target_entropy=-2.0)
    td = sac.continuous_batch(None, (6,))
    torch.manual_seed(11)
    loss._qvalue_loss(td, td["action"], torch.tensor(0.5))
    torch.manual_seed(11)
    next_action, _ = _sample(loss, loss.actor_network, td["next"])
    x = torch.cat([torch.cat([td["observation"], td["action"]], -1), torch.cat([td["next", "observation"], next_action], -1)])
    torch.testing.assert_close(loss.qvalue_network_params["module", "bn", "running_mean"][0], x.mean(0))


@pytest.mark.parametrize("space", ["one-hot", "categorical"])
def test_discrete_iql_is_iql_with_the_chosen_actions_value(space):
    """``Q(s, a)`` is the dataset action's entry of the critic's per-action values: the loss
    equals IQLLoss given a critic that reads that entry itself (same weights, same seed)."""
    from steersman.objectives import DiscreteIQLLoss, IQLLoss
    from tests.objectives import cases_sac as sac

    class Chosen(nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, observation, action):
            q = self.net(observation)
            if space == "one-hot":
                return (q * action).sum(-1, keepdim=True)
            return q.gather(-1, action.long()[..., None])

    torch.manual_seed(12)
    dist = torch.distributions.OneHotCategorical if space == "one-hot" else torch.distributions.Categorical
    actor, q_net, value = sac.discrete_actor(dist), nn.Linear(sac.OBS, sac.N_ACTIONS), sac.value()
    loss = DiscreteIQLLoss(actor, TensorDictModule(q_net, ["observation"], ["state_action_value"]), value,
                           action_space=space, expectile=0.7, temperature=2.0)
    ref = IQLLoss(actor, TensorDictModule(Chosen(q_net), ["observation", "action"], ["state_action_value"]), value,
                  expectile=0.7, temperature=2.0)
    sd = {k.replace("module.net.", "module."): v for k, v in ref.state_dict().items()}
    ref.load_state_dict({k: loss.state_dict()[kk] for k, kk in zip(ref.state_dict(), sd)})
    td = (sac.one_hot_batch if space == "one-hot" else sac.categorical_batch)(None, (9,))
    out, expected = loss(td.clone()), ref(td.clone())
    for key in ("loss_actor", "loss_qvalue", "loss_value"):
        torch.testing.assert_close(out[key], expected[key])
    with pytest.raises(ValueError, match="action_space"):
        DiscreteIQLLoss(actor, TensorDictModule(q_net, ["observation"], ["state_action_value"]), value, action_space="box")
    with pytest.warns(DeprecationWarning, match="make_value_estimator"):
        old_style = DiscreteIQLLoss(actor, TensorDictModule(q_net, ["observation"], ["state_action_value"]), value,
                                    action_space=space, gamma=0.5)
    assert old_style.value_estimator.gamma == 0.5
