"""DecisionTransformer, its actors and inference wrapper, and the DT losses: against a plain
re-computation of GPT-2's math, causality, masking and the losses' formulas."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from steersman.modules import (
    DecisionTransformer,
    DecisionTransformerInferenceWrapper,
    DTActor,
    OnlineDTActor,
    ProbabilisticActor,
    TanhDelta,
)
from steersman.objectives import DTLoss, OnlineDTLoss
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import TensorDictModule
from tests.objectives.cases_models import DT_CONFIG, dt_actor, online_dt_actor, windows

CFG = {**DT_CONFIG, "resid_pdrop": 0.0, "attn_pdrop": 0.0}


def _reference_trunk(model: DecisionTransformer, obs, act, rtg):
    """GPT-2 over the interleaved tokens, one sequence and one head at a time (eval mode)."""
    out = []
    for b in range(obs.shape[0]):
        tokens = []
        for t in range(obs.shape[1]):
            tokens += [model.embed_return(rtg[b, t]), model.embed_state(obs[b, t]), model.embed_action(act[b, t])]
        x = model.embed_ln(torch.stack(tokens)) + model.wpe.weight[: len(tokens)]
        for block in model.blocks:
            h = block.ln_1(x)
            q, k, v = block.attn.qkv(h).chunk(3, -1)
            heads, d = block.attn.n_head, x.shape[-1] // block.attn.n_head
            ys = []
            for i in range(heads):
                qi, ki, vi = (z[:, i * d:(i + 1) * d] for z in (q, k, v))
                scores = qi @ ki.T / math.sqrt(d)
                n = scores.shape[0]
                scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
                ys.append(scores.softmax(-1) @ vi)
            x = x + block.attn.proj(torch.cat(ys, -1))
            x = x + block.mlp[2](F.relu(block.mlp[0](block.ln_2(x))))
        x = model.ln_f(x)
        out.append(x[1::3])  # the state tokens
    return torch.stack(out)


def test_trunk_matches_gpt2_math_and_is_causal():
    torch.manual_seed(0)
    model = DecisionTransformer(3, 2, config={**CFG, "n_layer": 2}).eval()
    obs, act, rtg = torch.randn(2, 4, 3), torch.randn(2, 4, 2), torch.randn(2, 4, 1)
    with torch.no_grad():
        out = model(obs, act, rtg)
        torch.testing.assert_close(out, _reference_trunk(model, obs, act, rtg), rtol=1e-4, atol=1e-5)
        # the action of step t is not seen at step t (nor before); the state of step t is
        act2 = act.clone()
        act2[:, 2] += 1.0
        out2 = model(obs, act2, rtg)
        torch.testing.assert_close(out2[:, :3], out[:, :3])
        assert not torch.allclose(out2[:, 3], out[:, 3])
        obs2 = obs.clone()
        obs2[:, 2] += 1.0
        out3 = model(obs2, act, rtg)
        torch.testing.assert_close(out3[:, :2], out[:, :2])
        assert not torch.allclose(out3[:, 2], out[:, 2])
        # any leading batch dims: the same as the flat batch
        flat = model(obs.repeat(3, 1, 1), act.repeat(3, 1, 1), rtg.repeat(3, 1, 1))
        torch.testing.assert_close(model(obs.expand(3, 2, 4, 3), act.expand(3, 2, 4, 2), rtg.expand(3, 2, 4, 1)),
                                   flat.reshape(3, 2, 4, -1))


def test_bad_configs_and_inputs_are_refused():
    with pytest.raises(ValueError, match="n_layers"):
        DecisionTransformer(3, 2, config={"n_layers": 2})
    with pytest.raises(ValueError, match="multiple of n_head"):
        DecisionTransformer(3, 2, config={**CFG, "n_head": 3})
    with pytest.raises(ValueError, match="activation"):
        DecisionTransformer(3, 2, config={**CFG, "activation": "nope"})
    model = DecisionTransformer(3, 2, config=DecisionTransformer.DTConfig(**CFG))
    with pytest.raises(ValueError, match="more than n_positions=30"):
        model(torch.randn(1, 11, 3), torch.randn(1, 11, 2), torch.randn(1, 11, 1))
    with pytest.raises(ValueError, match="must share"):
        model(torch.randn(1, 4, 3), torch.randn(1, 5, 2), torch.randn(1, 4, 1))


def test_actor_heads():
    torch.manual_seed(0)
    obs, act, rtg = torch.randn(5, 4, 3), torch.randn(5, 4, 2), torch.randn(5, 4, 1)
    actor = DTActor(3, 2, CFG).eval()
    with torch.no_grad():
        torch.testing.assert_close(actor(obs, act, rtg), actor.action_layer(actor.transformer(obs, act, rtg)))
    online = OnlineDTActor(3, 2, CFG)
    with torch.no_grad():
        online.action_layer_logstd.bias.fill_(100.0)  # tanh saturates: scale at exp(log_std_max)
        _, scale = online(obs, act, rtg)
        torch.testing.assert_close(scale, torch.full_like(scale, math.exp(2.0)))
        online.action_layer_logstd.bias.fill_(-100.0)
        _, scale = online(obs, act, rtg)
        torch.testing.assert_close(scale, torch.full_like(scale, math.exp(-5.0)))
    assert DTActor.default_config().n_embd == 512 and OnlineDTActor.default_config().n_inner == 2048


def test_inference_wrapper_masks_the_context_and_serves_the_last_action():
    torch.manual_seed(0)
    net = DTActor(3, 2, CFG)
    actor = ProbabilisticActor(TensorDictModule(net, ["observation", "action", "return_to_go"], ["param"]),
                               in_keys=["param"], distribution_class=TanhDelta)
    policy = DecisionTransformerInferenceWrapper(actor, inference_context=3)
    td = TensorDict({"observation": torch.randn(2, 6, 3), "action": torch.randn(2, 6, 2),
                     "return_to_go": torch.randn(2, 6, 1)}, [2])
    before = td.clone()
    out = policy(td)
    assert (td == before).all(), "the input was modified"
    # reference: the last 3 steps visible, actions shifted back one step, the current one zero
    obs, rtg = td["observation"].clone(), td["return_to_go"].clone()
    act = torch.zeros_like(td["action"])
    act[:, 3:5] = td["action"][:, 4:6]
    obs[:, :3] = 0
    rtg[:, :3] = 0
    expected = torch.tanh(net(obs, act, rtg))[:, -1]
    torch.testing.assert_close(out["action"], expected)
    assert out["return_to_go"].shape == (2, 1) and torch.equal(out["observation"], td["observation"])
    assert policy.in_keys == ["observation", "action", "return_to_go"]
    policy.set_tensor_keys(observation="obs")
    assert policy.in_keys[0] == "obs"
    with pytest.raises(ValueError, match="out_action"):
        policy.set_tensor_keys(out_action="nope")
    with pytest.raises(TypeError, match="unknown"):
        policy.set_tensor_keys(reward="r")


def test_dt_loss_is_the_mean_squared_action_error():
    torch.manual_seed(0)
    loss = DTLoss(dt_actor())
    batch = windows(shape=(3, 4))
    torch.manual_seed(1)
    out = loss(batch)
    torch.manual_seed(1)
    pred = loss.actor_network(batch.clone())["action"]
    torch.testing.assert_close(out["loss"], (pred - batch["action"]).pow(2).mean())
    assert loss(batch)["loss"].requires_grad
    none = DTLoss(dt_actor(), reduction="none")(batch)
    assert none["loss"].shape == (3, 4, 2)
    with pytest.raises(ValueError, match="loss_function"):
        DTLoss(dt_actor(), loss_function="huber")


def test_online_dt_loss_terms_and_temperature_direction():
    torch.manual_seed(0)
    loss = OnlineDTLoss(online_dt_actor(), alpha_init=0.5, samples_mc_entropy=3)
    assert loss.target_entropy.item() == -2.0  # -prod(action shape) from the actor's spec
    batch = windows(shape=(3, 4))
    torch.manual_seed(1)
    out = loss(batch)
    torch.manual_seed(1)
    dist = loss.actor_network.get_dist(batch.clone())
    log_lik = dist.log_prob(batch["action"])
    draws = dist.rsample((3,))
    entropy = -dist.log_prob(draws).mean(0)
    torch.testing.assert_close(out["loss_log_likelihood"], -log_lik.mean())
    torch.testing.assert_close(out["loss_entropy"], -0.5 * entropy.mean())
    torch.testing.assert_close(out["loss_alpha"], 0.5 * (entropy + 2.0).mean())
    torch.testing.assert_close(out["entropy"], entropy.mean())
    # the entropy is above a target of -50: gradient descent lowers alpha
    low = OnlineDTLoss(online_dt_actor(), target_entropy=-50.0)
    low(batch)["loss_alpha"].backward()
    assert low.log_alpha.grad > 0
    with pytest.raises(ValueError, match="target_entropy='auto'"):
        OnlineDTLoss(dt_actor())  # no spec
    with pytest.raises(RuntimeError, match="detach"):
        bad = batch.clone()
        bad["action"] = bad["action"].requires_grad_()
        loss(bad)


@pytest.mark.slow
def test_dt_learns_to_act_on_the_return_to_go():
    """Data whose action is ``0.8 * tanh(return_to_go)``: after 60 steps, the policy's error
    is a fraction of the best policy that ignores the return-to-go (the targets' variance)."""
    torch.manual_seed(0)
    loss = DTLoss(dt_actor())
    optim = torch.optim.Adam(loss.parameters(), lr=6e-3)

    def data(n):
        td = windows(shape=(n, 4))
        td["action"] = 0.8 * torch.tanh(td["return_to_go"]).expand(n, 4, 2)
        return td

    for _ in range(60):
        value = loss(data(32))["loss"]
        optim.zero_grad()
        value.backward()
        optim.step()
    loss.eval()
    test = data(64)
    with torch.no_grad():
        final = loss(test)["loss"].item()
    constant = test["action"].var(0).mean().item()  # the error of the best return-blind policy
    assert final < 0.25 * constant, (constant, final)  # 0.10 at this seed
