"""TQCLoss against a plain loop-by-loop computation of the paper's formulas, and its options."""

from __future__ import annotations

import pytest
import torch

from steersman.objectives import TQCLoss, ValueEstimators
from steersman.tensordict.nn import ExplorationType, TensorDictModule, set_exploration_type
from tests.objectives import cases_sac as sac
from tests.objectives.cases_models import QUANTILES, QuantileCritic, tqc


def _critic_fn(loss: TQCLoss, i: int, target: bool):
    params = loss.target_qvalue_network_params if target else loss.qvalue_network_params
    w0, b0 = params["module", "net", "0", "weight"][i], params["module", "net", "0", "bias"][i]
    w2, b2 = params["module", "net", "2", "weight"][i], params["module", "net", "2", "bias"][i]
    return lambda s, a: torch.tanh(torch.cat([s, a]) @ w0.T + b0) @ w2.T + b2


def _reference(loss: TQCLoss, batch, seed: int, gamma: float) -> dict[str, float]:
    """The TQC terms for a ``[B]`` batch, one sample, critic and atom at a time."""
    n, drop = loss.num_qvalue_nets, loss.top_quantiles_to_drop_per_net
    alpha = loss.log_alpha.exp().item()
    torch.manual_seed(seed)  # the loss draws a' ~ pi(.|s') first, then a~ ~ pi(.|s)
    with set_exploration_type(ExplorationType.RANDOM):
        next_dist = loss.actor_network.get_dist(batch["next"].select("observation"))
        next_action = next_dist.rsample()
        next_logp = next_dist.log_prob(next_action)
        dist = loss.actor_network.get_dist(batch.select("observation"))
        new_action = dist.rsample()
        logp = dist.log_prob(new_action)
    tau = [(2 * m + 1) / (2 * QUANTILES) for m in range(QUANTILES)]
    q_losses, actor_losses = [], []
    for b in range(batch.shape[0]):
        s, a = batch["observation"][b], batch["action"][b]
        s2, r = batch["next", "observation"][b], batch["next", "reward"][b].item()
        term = float(batch["next", "terminated"][b].item())
        pool = []
        for i in range(n):
            pool += _critic_fn(loss, i, True)(s2, next_action[b]).tolist()
        pool = sorted(pool)[: len(pool) - drop * n]
        targets = [r + gamma * (1 - term) * (z - alpha * next_logp[b].item()) for z in pool]
        total = 0.0
        for i in range(n):
            theta = _critic_fn(loss, i, False)(s, a).tolist()
            acc = 0.0
            for m in range(QUANTILES):
                for y in targets:
                    u = y - theta[m]
                    huber = 0.5 * u * u if abs(u) <= 1 else abs(u) - 0.5
                    acc += abs(tau[m] - (1.0 if u < 0 else 0.0)) * huber
            total += acc / (QUANTILES * len(targets))
        q_losses.append(total)
        mixture = sum(sum(_critic_fn(loss, i, False)(s, new_action[b]).tolist()) for i in range(n)) / (n * QUANTILES)
        actor_losses.append(alpha * logp[b].item() - mixture)
    target_entropy = loss.target_entropy.item()
    alpha_losses = [-loss.log_alpha.item() * (lp + target_entropy) for lp in logp.tolist()]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {"loss_qvalue": mean(q_losses), "loss_actor": mean(actor_losses), "loss_alpha": mean(alpha_losses)}


@pytest.mark.parametrize("drop", [0, 2])
def test_matches_the_formulas_computed_by_hand(drop):
    torch.manual_seed(0)
    loss = tqc(top_quantiles_to_drop_per_net=drop, alpha_init=0.7).make_value_estimator(gamma=0.9)
    with torch.no_grad():  # targets apart from the online critics, so mixing them up would show
        for t in loss.target_qvalue_network_params.values(include_nested=True, leaves_only=True):
            t.add_(0.3 * torch.randn_like(t))
    batch = sac.continuous_batch(loss, (6,))
    torch.manual_seed(5)
    out = loss(batch.clone())
    ref = _reference(loss, batch, seed=5, gamma=0.9)
    for key, value in ref.items():
        torch.testing.assert_close(out[key].item(), value, rtol=1e-4, atol=1e-5, msg=key)


def test_dropping_atoms_lowers_the_target_and_bad_settings_are_refused():
    torch.manual_seed(0)
    batch = sac.continuous_batch(None, (16,))
    losses = {}
    for drop in (0, 2, 4):
        torch.manual_seed(0)
        loss = tqc(top_quantiles_to_drop_per_net=drop)
        torch.manual_seed(1)
        td = batch.clone()
        losses[drop] = loss(td)
    # same networks and draws: only the truncation differs, so the losses differ
    assert not torch.equal(losses[0]["loss_qvalue"], losses[2]["loss_qvalue"])
    torch.testing.assert_close(losses[0]["loss_actor"], losses[4]["loss_actor"])  # the actor sees every atom
    with pytest.raises(ValueError, match="drops every atom"):
        tqc(top_quantiles_to_drop_per_net=QUANTILES)(batch.clone())
    with pytest.raises(ValueError, match="top_quantiles_to_drop_per_net must be >= 0"):
        tqc(top_quantiles_to_drop_per_net=-1)
    class Scalar(QuantileCritic):  # [B] values: no quantile dim
        def forward(self, observation, action):
            return super().forward(observation, action).sum(-1)

    scalar = TQCLoss(sac.actor(), TensorDictModule(Scalar(), ["observation", "action"], ["state_action_value"]),
                     num_qvalue_nets=2, target_entropy=-2.0)
    with pytest.raises(ValueError, match="one quantile dim after the batch dims"):
        scalar(batch.clone())
    with pytest.raises(NotImplementedError, match="TQCLoss has no TDLambda"):
        tqc().make_value_estimator(ValueEstimators.TDLambda)


def test_prioritized_weights_and_reduction_none():
    torch.manual_seed(0)
    batch = sac.continuous_batch(None, (8,))
    loss = tqc(reduction="none")
    torch.manual_seed(1)
    per_sample = loss(batch.clone())
    assert per_sample["loss_qvalue"].shape == (8,) and "alpha" not in per_sample.keys()
    weighted = batch.clone()
    weighted["priority_weight"] = torch.arange(8.0)
    torch.manual_seed(1)
    out = loss(weighted)
    torch.testing.assert_close(out["loss_qvalue"], per_sample["loss_qvalue"] * torch.arange(8.0))
    assert weighted["td_error"].shape == (8,)
    mean_loss = tqc()
    torch.manual_seed(1)
    mean = mean_loss(weighted.clone())  # importance-weighted mean: sum(w * l) / sum(w)
    ref = tqc(reduction="none", use_prioritized_weights=False)
    ref.load_state_dict(mean_loss.state_dict())
    torch.manual_seed(1)
    plain = ref(weighted.clone())
    w = torch.arange(8.0)
    torch.testing.assert_close(mean["loss_qvalue"], (plain["loss_qvalue"] * w).sum() / w.sum())
    non_tensor = tqc(reduction="none", scalar_output_mode="non_tensor")(batch.clone())
    assert "alpha" in non_tensor.keys()


def test_sac_takes_torchrl_deprecated_and_prioritized_keywords():
    from steersman.objectives import SACLoss

    with pytest.warns(DeprecationWarning, match="priority_key"):
        loss = SACLoss(sac.actor(), sac.qvalue(), target_entropy=-2.0, priority_key="prio")
    assert loss.tensor_keys.priority == "prio"
    with pytest.warns(DeprecationWarning, match="gamma"):
        assert SACLoss(sac.actor(), sac.qvalue(), target_entropy=-2.0, gamma=0.5).value_estimator.gamma == 0.5
    batch = sac.continuous_batch(None, (6,))
    batch["priority_weight"] = torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    torch.manual_seed(1)
    weighted = loss(batch.clone())
    loss.reduction, loss.use_prioritized_weights = "none", False
    torch.manual_seed(1)
    per_sample = loss(batch.clone())["loss_qvalue"]
    torch.testing.assert_close(weighted["loss_qvalue"], per_sample[3:].mean())  # zero weight = left out
    with pytest.raises(ValueError, match="scalar_output_mode"):
        SACLoss(sac.actor(), sac.qvalue(), target_entropy=-2.0, scalar_output_mode="tensor")
