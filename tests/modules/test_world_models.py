"""World models: RSSM prior/posterior against the GRU and Gaussian math written out, the
rollout against a step-by-step loop, pixel encoder/decoder shapes, WorldModel parts,
SymExpTwoHot, the categorical KL terms against torch.distributions, WorldModelLoss."""

from __future__ import annotations

import pytest
import torch
from torch import distributions as D
from torch.nn import functional as F

from steersman.data import Bounded
from steersman.modules import (
    ObsDecoder,
    ObsEncoder,
    RSSMPosterior,
    RSSMPrior,
    RSSMRollout,
    SymExpTwoHot,
    WorldModel,
    WorldModelWrapper,
)
from steersman.objectives import WorldModelLoss, categorical_kl_balanced, categorical_kl_terms
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import TensorDictModule
from tests.objectives.cases_models import world_model, world_model_batch

S, H, A, E, HID = 4, 6, 2, 10, 8


def _gru(cell, x, h):
    """``torch.nn.GRUCell``'s update written out."""
    wr, wz, wn = cell.weight_ih.chunk(3)
    ur, uz, un = cell.weight_hh.chunk(3)
    br, bz, bn = cell.bias_ih.chunk(3)
    cr, cz, cn = cell.bias_hh.chunk(3)
    r = torch.sigmoid(x @ wr.T + br + h @ ur.T + cr)
    z = torch.sigmoid(x @ wz.T + bz + h @ uz.T + cz)
    n = torch.tanh(x @ wn.T + bn + r * (h @ un.T + cn))
    return (1 - z) * n + z * h


def test_prior_and_posterior_match_the_written_out_math():
    torch.manual_seed(0)
    prior = RSSMPrior(Bounded(-1.0, 1.0, shape=(A,)), HID, H, S, scale_lb=0.1, action_dim=A)
    state, belief, action, noise = torch.randn(5, S), torch.randn(5, H), torch.randn(5, A), torch.randn(5, S)
    mean, std, new_state, new_belief = prior(state, belief, action, noise=noise)
    lin = prior.action_state_projector[0]
    h = _gru(prior.rnn, F.elu(torch.cat([state, action], -1) @ lin.weight.T + lin.bias), belief)
    torch.testing.assert_close(new_belief, h)
    p = prior.rnn_to_prior_projector
    params = p[2](F.elu(p[0](h)))
    torch.testing.assert_close(mean, params[:, :S])
    torch.testing.assert_close(std, F.softplus(params[:, S:]).clamp_min(0.1))
    torch.testing.assert_close(new_state, mean + noise * std)
    assert prior.action_shape == (A,)
    post = RSSMPosterior(HID, S, scale_lb=0.2, rnn_hidden_dim=H, obs_embed_dim=E)
    obs = torch.randn(5, E)
    pm, ps, pstate = post(h, obs, noise=noise)
    q = post.obs_rnn_to_post_projector
    params = q[2](F.elu(q[0](torch.cat([h, obs], -1))))
    torch.testing.assert_close(pm, params[:, :S])
    torch.testing.assert_close(ps, F.softplus(params[:, S:]).clamp_min(0.2))
    torch.testing.assert_close(pstate, pm + noise * ps)
    # lazy first layers take their sizes on the first call; extra batch dims are kept
    lazy = RSSMPrior(Bounded(-1.0, 1.0, shape=(A,)), HID, H, S)
    assert lazy(torch.zeros(2, 3, S), torch.zeros(2, 3, H), torch.zeros(2, 3, A))[3].shape == (2, 3, H)


def _rssm():
    prior = TensorDictModule(RSSMPrior(Bounded(-1.0, 1.0, shape=(A,)), HID, H, S, action_dim=A),
                             ["state", "belief", "action"],
                             [("next", "prior_mean"), ("next", "prior_std"), "_", ("next", "belief")])
    post = TensorDictModule(RSSMPosterior(HID, S, rnn_hidden_dim=H, obs_embed_dim=E),
                            [("next", "belief"), ("next", "encoded_latents")],
                            [("next", "posterior_mean"), ("next", "posterior_std"), ("next", "state")])
    return prior, post


def test_rollout_matches_a_step_by_step_loop():
    torch.manual_seed(0)
    prior, post = _rssm()
    td = TensorDict({"state": torch.randn(2, 5, S), "belief": torch.randn(2, 5, H), "action": torch.randn(2, 5, A),
                     "next": {"encoded_latents": torch.randn(2, 5, E)}}, [2, 5])
    torch.manual_seed(1)
    out = RSSMRollout(prior, post)(td)
    torch.manual_seed(1)
    state, belief = td["state"][:, 0], td["belief"][:, 0]
    for t in range(5):  # prior noise, then posterior noise, at every step
        _, _, _, belief = prior.module(state, belief, td["action"][:, t])
        mean, std, state = post.module(belief, td["next", "encoded_latents"][:, t])
        torch.testing.assert_close(out["next", "belief"][:, t], belief)
        torch.testing.assert_close(out["next", "state"][:, t], state)
        torch.testing.assert_close(out["next", "posterior_std"][:, t], std)
    torch.testing.assert_close(out["state"][:, 1:], out["next", "state"][:, :-1])
    torch.testing.assert_close(out["state"][:, 0], td["state"][:, 0])  # the primer is read at t = 0 only
    assert td.get(("next", "state"), None) is None  # the input is not modified
    with pytest.raises(ValueError, match="time dim"):
        RSSMRollout(prior, post)(td[0, 0])


def test_pixel_encoder_and_decoder_shapes():
    torch.manual_seed(0)
    image = torch.randn(2, 3, 3, 64, 64)
    assert ObsEncoder(channels=4, in_channels=3)(image).shape == (2, 3, 4 * 8 * 2 * 2)
    assert ObsEncoder(channels=4)(image).shape == (2, 3, 128)  # lazy input channels
    decoder = ObsDecoder(channels=4, latent_dim=S + H, out_channels=1)
    assert decoder(torch.randn(2, 3, S), torch.randn(2, 3, H)).shape == (2, 3, 1, 64, 64)
    with pytest.warns(DeprecationWarning, match="channels"):
        ObsEncoder(depth=4)
    with pytest.raises(ValueError, match="num_layers"):
        ObsDecoder(num_layers=0)


def test_world_model_parts_and_wrapper():
    model = world_model()
    td = world_model_batch(None, (4,))
    full = model(td.clone())
    stepped = model.step(model.encode(td.clone()))
    torch.testing.assert_close(full["next", "reward"], stepped["next", "reward"])
    assert full["reconstructed_observation"].shape == td["observation"].shape
    no_decoder = WorldModel(model.encoder, model.dynamics, model.reward_head)
    with pytest.raises(RuntimeError, match="decoder"):
        no_decoder.decode(td)
    wrapper = WorldModelWrapper(model.dynamics, model.reward_head)
    assert wrapper.get_transition_model_operator() is model.dynamics


def test_symexp_two_hot():
    head = SymExpTwoHot(num_bins=7)
    torch.testing.assert_close(head.bins, -head.bins.flip(0))  # symmetric, 0 in the middle
    assert head.bins[3] == 0 and torch.isclose(head.bins[-1], torch.expm1(torch.tensor(20.0)))
    target = torch.tensor([-3.0, 0.5, 100.0])
    weights = head.encode(target)
    torch.testing.assert_close(weights @ head.bins, target, rtol=1e-4, atol=1e-4)  # bins reach 4.8e8
    logits = torch.randn(3, 7)
    torch.testing.assert_close(head.loss(logits, target), -(weights * logits.log_softmax(-1)).sum(-1))
    assert head(logits).shape == (3, 1)


def test_categorical_kl_terms_against_torch_distributions():
    torch.manual_seed(0)
    q_logits = torch.randn(3, 4, 5, requires_grad=True)
    p_logits = torch.randn(3, 4, 5, requires_grad=True)
    kl = D.kl_divergence(D.Categorical(logits=q_logits), D.Categorical(logits=p_logits))  # [3, 4]
    dyn, rep = categorical_kl_terms(q_logits, p_logits, free_nats=0.0, unimix=0.0)
    torch.testing.assert_close(dyn, kl.sum(-1).mean())
    torch.testing.assert_close(rep, kl.sum(-1).mean())
    dyn.backward()
    assert q_logits.grad is None and p_logits.grad.abs().sum() > 0  # dynamics trains the prior only
    p_logits.grad = None
    categorical_kl_terms(q_logits, p_logits)[1].backward()
    assert p_logits.grad is None and q_logits.grad.abs().sum() > 0
    floor, _ = categorical_kl_terms(q_logits, q_logits.detach(), free_nats=1.0)
    assert floor.item() == 1.0
    mixed = (1 - 0.1) * q_logits.softmax(-1) + 0.1 / 5
    unimixed, _ = categorical_kl_terms(q_logits, p_logits, free_nats=0.0, unimix=0.1)
    other = (1 - 0.1) * p_logits.softmax(-1) + 0.1 / 5
    torch.testing.assert_close(unimixed, (mixed * (mixed.log() - other.log())).sum((-1, -2)).mean())
    balanced = categorical_kl_balanced(q_logits, p_logits, alpha=0.8, free_bits=0.0)
    torch.testing.assert_close(balanced, kl.mean(), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="differ in shape"):
        categorical_kl_terms(q_logits, p_logits[..., :4])


def test_world_model_loss_against_its_formulas():
    torch.manual_seed(0)
    model = world_model()
    loss = WorldModelLoss(model, losses=["reward", "done", "reconstruction", "latent"], reward_weight=2.0,
                          reconstruction_loss="l1")
    td = world_model_batch(None, (6,))
    before = td.clone()
    out = loss(td)
    assert (td == before).all()
    pred = model(td.exclude(("next", "reward"), ("next", "done"), ("next", "terminated")))
    torch.testing.assert_close(out["loss_reward"], 2.0 * (pred["next", "reward"] - td["next", "reward"]).pow(2).mean())
    torch.testing.assert_close(out["loss_done"], (pred["next", "done"] - td["next", "done"].float()).pow(2).mean())
    torch.testing.assert_close(out["loss_reconstruction"],
                               (pred["reconstructed_observation"] - td["observation"]).abs().mean())
    torch.testing.assert_close(out["loss_latent"], (pred["predicted_latent"] - pred["target_latent"]).pow(2).mean())
    with pytest.raises(ValueError, match="unknown or no losses"):
        WorldModelLoss(model, losses=["kl"])
    with pytest.raises(KeyError, match=r"set_keys\(reward="):
        WorldModelLoss(model)(td.exclude(("next", "reward")))


@pytest.mark.parametrize("weighted", [False, True])
def test_expected_saturating_cost_matches_monte_carlo(weighted):
    from steersman.objectives import ExponentialQuadraticCost

    torch.manual_seed(0)
    d = 3
    m = torch.randn(4, d, dtype=torch.float64, requires_grad=True)
    root = torch.randn(4, d, d, dtype=torch.float64) * 0.5
    s = root @ root.transpose(-1, -2)
    w = torch.diag(torch.tensor([1.0, 0.5, 2.0], dtype=torch.float64)) if weighted else None
    target = torch.tensor([0.5, -0.5, 0.0], dtype=torch.float64)
    cost = ExponentialQuadraticCost(target=target, weights=w, reduction="none")
    out = cost(TensorDict({"observation": {"mean": m, "var": s}}, [4]))["loss_cost"]
    x = D.MultivariateNormal(m.detach(), covariance_matrix=s + 1e-9 * torch.eye(d)).sample((50_000,))
    diff = x - target
    w_mat = w if w is not None else torch.eye(d, dtype=torch.float64)
    mc = (1 - torch.exp(-0.5 * torch.einsum("...i,ij,...j->...", diff, w_mat, diff))).mean(0)
    torch.testing.assert_close(out.detach(), mc, atol=1e-2, rtol=0)  # ~4.5 standard errors
    out.sum().backward()
    assert m.grad.abs().sum() > 0  # differentiable in the mean
    with pytest.raises(ValueError, match="covariance has shape"):
        cost(TensorDict({"observation": {"mean": m, "var": s[..., :2]}}, [4]))
    with pytest.raises(ValueError, match="symmetric"):
        ExponentialQuadraticCost(weights=torch.tensor([[1.0, 1.0], [0.0, 1.0]]))


def test_rbf_controller_moments_match_monte_carlo():
    """The RBF network's moments are exact (checked by sampling x); the sine squashing is
    exact for a Gaussian input (checked by sampling y ~ N(E f, Cov f)); forward composes
    them as PILCO does (a Gaussian approximation of f in between)."""
    from steersman.modules import RBFController

    torch.manual_seed(0)
    ctrl = RBFController(input_dim=2, output_dim=2, max_action=1.5, n_basis=4).double()
    with torch.no_grad():
        ctrl.weights.mul_(10.0)  # outputs of order 1: the squashing matters
        ctrl.lengthscales.copy_(torch.tensor([0.8, 1.3]))
    m = torch.tensor([[0.3, -0.2]], dtype=torch.float64)
    root = torch.tensor([[0.4, 0.0], [0.2, 0.3]], dtype=torch.float64)
    s = (root @ root.T).unsqueeze(0)
    f_mean, f_cov, f_cross = ctrl.rbf_moments(m, s)
    x = D.MultivariateNormal(m[0], s[0]).sample((200_000,))
    lam = ctrl.lengthscales.detach() ** 2
    f = torch.exp(-0.5 * ((x.unsqueeze(1) - ctrl.centers.detach()) ** 2 / lam).sum(-1)) @ ctrl.weights.detach()
    xc, fc = x - x.mean(0), f - f.mean(0)
    torch.testing.assert_close(f_mean[0].detach(), f.mean(0), atol=1e-2, rtol=0)
    torch.testing.assert_close(f_cov[0].detach(), f.T.cov(), atol=1e-2, rtol=0)
    torch.testing.assert_close(f_cross[0].detach(), xc.T @ fc / (len(x) - 1), atol=5e-3, rtol=0)
    y = D.MultivariateNormal(f_mean[0].detach(), f_cov[0].detach()).sample((200_000,))
    u = 1.5 * torch.sin(y)
    u_mean, u_cov, gain = RBFController.squash_sin(f_mean.detach(), f_cov.detach(), 1.5)
    torch.testing.assert_close(u_mean[0], u.mean(0), atol=1e-2, rtol=0)
    torch.testing.assert_close(u_cov[0], u.T.cov(), atol=1e-2, rtol=0)
    yc, uc = y - y.mean(0), u - u.mean(0)
    torch.testing.assert_close((f_cov.detach() @ torch.diag_embed(gain))[0], yc.T @ uc / (len(y) - 1), atol=1e-2,
                               rtol=0)
    mean, cov, cross = ctrl(m, s)
    torch.testing.assert_close(mean.detach(), u_mean)
    torch.testing.assert_close(cov.detach(), u_cov)
    torch.testing.assert_close(cross.detach(), f_cross.detach() @ torch.diag_embed(gain))
    # a point mass: f(m), no spread
    raw = RBFController(2, 2, max_action=None, n_basis=4).double()
    raw.load_state_dict(ctrl.state_dict())
    point_mean, point_cov, _ = raw(m, torch.zeros_like(s))
    f_m = torch.exp(-0.5 * ((m.unsqueeze(1) - ctrl.centers.detach()) ** 2 / lam).sum(-1)) @ ctrl.weights.detach()
    torch.testing.assert_close(point_mean.detach(), f_m)
    torch.testing.assert_close(point_cov.detach(), torch.zeros(1, 2, 2, dtype=torch.float64), atol=1e-9, rtol=0)
    mean.sum().backward()
    assert ctrl.centers.grad.abs().sum() > 0 and ctrl.lengthscales.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="expected mean"):
        ctrl(m, s[..., :1])
