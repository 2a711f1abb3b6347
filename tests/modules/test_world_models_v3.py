"""DreamerV3 networks (RSSMPriorV3 / RSSMPosteriorV3 / RSSMRolloutV3 / RSSMStateEstimatorV3)
against the math written out."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from steersman.data import Bounded
from steersman.modules import RSSMPosteriorV3, RSSMPriorV3, RSSMRolloutV3, RSSMStateEstimatorV3
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import TensorDictModule

C, K, H, A, E, HID = 3, 4, 8, 2, 6, 10


def _prior(mode: str = "gru", unimix: float = 0.0, **kw) -> RSSMPriorV3:
    return RSSMPriorV3(action_shape=(A,), hidden_dim=HID, rnn_hidden_dim=H, num_categoricals=C, num_classes=K,
                       action_dim=A, recurrent_model=mode, num_blocks=2, unimix=unimix, **kw)


def _post(rms: bool = False, unimix: float = 0.0) -> RSSMPosteriorV3:
    return RSSMPosteriorV3(hidden_dim=HID, num_categoricals=C, num_classes=K, rnn_hidden_dim=H, obs_embed_dim=E,
                           use_rms_norm=rms, num_layers=2, unimix=unimix)


def _rms(x, w, eps=1e-4):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _probs(logits, unimix):
    return (1 - unimix) * logits.softmax(-1) + unimix / logits.shape[-1]


@pytest.mark.parametrize("mode", ["gru", "block_gru"])
@pytest.mark.parametrize("unimix", [0.0, 0.3])
def test_prior_shapes_onehot_and_unimix_sample(mode, unimix):
    torch.manual_seed(0)
    prior = _prior(mode, unimix)
    z, h, a = torch.zeros(5, 7, C * K), torch.randn(5, 7, H), torch.randn(5, 7, A)
    u = torch.rand(5, 7, C)
    logits, state, belief = prior(z, h, a, _uniform=u)
    assert logits.shape == (5, 7, C, K) and state.shape == (5, 7, C * K) and belief.shape == (5, 7, H)
    # inverse-CDF reference: the sampled class is the first whose cumulative prob exceeds u
    cdf = _probs(logits, unimix).cumsum(-1)
    index = torch.searchsorted(cdf.detach(), u.unsqueeze(-1), right=True).squeeze(-1).clamp_max(K - 1)
    torch.testing.assert_close(state.view(5, 7, C, K), F.one_hot(index, K).float())


@pytest.mark.parametrize("rms", [False, True])
def test_posterior_matches_written_mlp(rms):
    torch.manual_seed(1)
    post = _post(rms)
    h, e = torch.randn(4, H), torch.randn(4, E)
    logits, state = post(h, e)
    x = torch.cat([h, e], -1)
    mods = list(post.obs_rnn_to_post_projector)
    if rms:  # [Linear, RMS, SiLU] x 2, Linear
        for i in (0, 3):
            x = F.silu(_rms(F.linear(x, mods[i].weight, mods[i].bias), mods[i + 1].weight))
        x = F.linear(x, mods[6].weight, mods[6].bias)
    else:
        x = F.linear(F.silu(F.linear(x, mods[0].weight, mods[0].bias)), mods[2].weight, mods[2].bias)
    torch.testing.assert_close(logits, x.view(4, C, K))
    assert state.shape == (4, C * K) and bool((state.view(4, C, K).sum(-1) == 1).all())


def test_prior_gru_belief_written_out():
    torch.manual_seed(2)
    prior = _prior("gru")
    z, h, a = F.one_hot(torch.randint(K, (4, C)), K).float().flatten(-2), torch.randn(4, H), torch.randn(4, A)
    logits, _, belief = prior(z, h, a)
    lin = prior.action_state_projector[0]
    x = F.silu(F.linear(torch.cat([z, a], -1), lin.weight, lin.bias))
    g = prior.rnn
    gi, gh = F.linear(x, g.weight_ih, g.bias_ih), F.linear(h, g.weight_hh, g.bias_hh)
    r = torch.sigmoid(gi[:, :H] + gh[:, :H])
    u = torch.sigmoid(gi[:, H:2 * H] + gh[:, H:2 * H])
    n = torch.tanh(gi[:, 2 * H:] + r * gh[:, 2 * H:])
    torch.testing.assert_close(belief, (1 - u) * n + u * h)
    p = prior.rnn_to_prior_projector
    ref = F.linear(F.silu(F.linear(belief, p[0].weight, p[0].bias)), p[2].weight, p[2].bias)
    torch.testing.assert_close(logits, ref.view(4, C, K))


def test_block_gru_belief_written_out():
    torch.manual_seed(3)
    prior = _prior("block_gru")
    g = prior.rnn
    with torch.no_grad():  # non-trivial norm weights and biases so every term counts
        for p in g.parameters():
            p.add_(0.1 * torch.randn_like(p))
    z, h, a = torch.rand(4, C * K), torch.randn(4, H), 3 * torch.randn(4, A)
    _, _, belief = prior(z, h, a)

    def dense(seq, x):
        return F.silu(_rms(F.linear(x, seq[0].weight, seq[0].bias), seq[1].weight))

    a_n = a / a.abs().clamp_min(1)
    feats = torch.cat([dense(g.belief_in, h), dense(g.state_in, z), dense(g.action_in, a_n)], -1)
    G, hb = 2, H // 2
    blocks = [torch.cat([h[:, i * hb:(i + 1) * hb], feats], -1) for i in range(G)]
    # one block layer: per block x_i @ W_i + b_i, normalised over the whole belief
    y = torch.cat([blocks[i] @ g.layers[0].weight[i] + g.layers[0].bias[i] for i in range(G)], -1)
    y = F.silu(_rms(y, g.norms[0].weight))
    outs = [y[:, i * hb:(i + 1) * hb] @ g.gates.weight[i] + g.gates.bias[i] for i in range(G)]
    r = torch.cat([o[:, :hb] for o in outs], -1)
    c = torch.cat([o[:, hb:2 * hb] for o in outs], -1)
    u = torch.cat([o[:, 2 * hb:] for o in outs], -1)
    r = torch.sigmoid(r)
    c = torch.tanh(r * c)
    u = torch.sigmoid(u - 1)
    torch.testing.assert_close(belief, u * c + (1 - u) * h)


@pytest.mark.parametrize("unimix", [0.0, 0.2])
def test_straight_through_gradient_is_the_probabilities(unimix):
    torch.manual_seed(4)
    post = _post(unimix=unimix)
    h, e = torch.randn(6, H), torch.randn(6, E)
    w = torch.randn(6, C * K)
    logits = post.logits(h, e).detach().requires_grad_(True)
    post.logits = lambda *_: logits  # feed the leaf logits through the module's sampler
    _, state = post(h, e)
    (g_state,) = torch.autograd.grad((state * w).sum(), logits)
    (g_probs,) = torch.autograd.grad((_probs(logits, unimix).flatten(-2) * w).sum(), logits)
    torch.testing.assert_close(g_state, g_probs)
    assert set(state.detach().unique().tolist()) <= {0.0, 1.0}


def test_unimix_floor_probability_empirical():
    torch.manual_seed(5)
    post = _post(unimix=0.4)
    with torch.no_grad():
        post.obs_rnn_to_post_projector[-1].bias.copy_(torch.tensor([50.0, 0, 0, 0] * C))
        post.obs_rnn_to_post_projector[-1].weight.zero_()
        _, state = post(torch.randn(20000, H), torch.randn(20000, E))
    freq = state.view(-1, C, K).mean((0, 1))
    # class 0 gets 0.6 + 0.4 / 4 = 0.7, each other 0.1 (n = 60000 draws: 5 sigma < 0.01)
    torch.testing.assert_close(freq, torch.tensor([0.7, 0.1, 0.1, 0.1]), atol=0.01, rtol=0)


@pytest.mark.parametrize("mode", ["gru", "block_gru"])
def test_rollout_equals_step_by_step(mode):
    torch.manual_seed(6)
    p, q = _prior(mode, unimix=0.01), _post(unimix=0.01)
    prior = TensorDictModule(p, ["state", "belief", "action"],
                             [("next", "prior_logits"), ("next", "state"), ("next", "belief")])
    post = TensorDictModule(q, [("next", "belief"), ("next", "encoded_latents")],
                            [("next", "posterior_logits"), ("next", "state")])
    B, T = 3, 5
    is_init = torch.zeros(B, T, 1, dtype=torch.bool)
    is_init[0, 0] = is_init[1, 2] = is_init[2, 4] = True
    td = TensorDict({"state": torch.rand(B, T, C * K), "belief": torch.randn(B, T, H), "action": torch.randn(B, T, A),
                     "is_init": is_init, "next": {"encoded_latents": torch.randn(B, T, E)}}, [B, T])
    torch.manual_seed(7)
    out = RSSMRolloutV3(prior, post)(td)
    torch.manual_seed(7)
    z, h = td["state"][:, 0], td["belief"][:, 0]
    for t in range(T):
        m = is_init[:, t]
        z, h, a = torch.where(m, 0.0, z), torch.where(m, 0.0, h), torch.where(m, 0.0, td["action"][:, t])
        torch.testing.assert_close(out["state"][:, t], z)
        torch.testing.assert_close(out["belief"][:, t], h)
        torch.testing.assert_close(out["action"][:, t], a)
        prior_logits, _, h = p(z, h, a)
        post_logits, z = q(h, td["next", "encoded_latents"][:, t])
        torch.testing.assert_close(out["next", "prior_logits"][:, t], prior_logits)
        torch.testing.assert_close(out["next", "posterior_logits"][:, t], post_logits)
        torch.testing.assert_close(out["next", "state"][:, t], z)
        torch.testing.assert_close(out["next", "belief"][:, t], h)


def test_state_estimator_equals_written_update():
    torch.manual_seed(8)
    p, q = _prior("block_gru"), _post(unimix=0.1)
    est = RSSMStateEstimatorV3(p, q, in_keys=["z", "h", "a", "e", "done"], out_keys=["z2", "h2"])
    td = TensorDict({"z": torch.rand(4, C * K), "h": torch.randn(4, H), "a": torch.randn(4, A),
                     "e": torch.randn(4, E), "done": torch.tensor([True, False, False, True])}, [4])
    torch.manual_seed(9)
    out = est(td.clone())
    torch.manual_seed(9)
    m = td["done"].unsqueeze(-1)
    h = p.update_belief(torch.where(m, 0.0, td["z"]), torch.where(m, 0.0, td["h"]), torch.where(m, 0.0, td["a"]))
    _, z = q(h, td["e"])
    torch.testing.assert_close(out["h2"], h)
    torch.testing.assert_close(out["z2"], z)
    assert out["z2"].dtype == out["h2"].dtype == torch.float32


def test_action_spec_and_lazy_prior():
    prior = RSSMPriorV3(Bounded(-1.0, 1.0, shape=(A,)), hidden_dim=HID, rnn_hidden_dim=H, num_categoricals=C,
                        num_classes=K)
    assert prior.action_shape == torch.Size([A])
    _, state, belief = prior(torch.zeros(2, C * K), torch.zeros(2, H), torch.zeros(2, A))
    assert state.shape == (2, C * K) and belief.shape == (2, H)


@pytest.mark.parametrize("make,match", [
    (lambda: _prior(unimix=1.0), "unimix"),
    (lambda: _post(unimix=-0.1), "unimix"),
    (lambda: RSSMPriorV3(Bounded(-1.0, 1.0, shape=(A,)), action_shape=(A,)), "not both"),
    (lambda: RSSMPriorV3(action_shape=(A,), recurrent_model="block_gru"), "action_dim"),
    (lambda: RSSMPriorV3(action_shape=(A,), recurrent_model="lstm"), "recurrent_model"),
    (lambda: RSSMPriorV3(action_shape=(A,), action_dim=A, rnn_hidden_dim=9, recurrent_model="block_gru",
                         num_blocks=2), "divisible"),
    (lambda: RSSMPosteriorV3(use_rms_norm=True), "use_rms_norm"),
    (lambda: RSSMStateEstimatorV3(_prior(), _post(), in_keys=["a", "b"]), "5 keys"),
    (lambda: RSSMStateEstimatorV3(_prior(), _post(), out_keys=["a"]), "2 keys"),
])
def test_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()
