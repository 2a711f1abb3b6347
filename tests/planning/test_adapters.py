"""Recurrent functions from a learned model (TensorDictModules) and from native envs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from steersman.envs.native import CartPoleEnv, GridWorldEnv, GridWorldParams, PendulumEnv
from steersman.planning import (
    RootFnOutput,
    gumbel_muzero_policy,
    muzero_policy,
    recurrent_fn_from_env,
    recurrent_fn_from_model,
    root_from_env,
)
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import TensorDictModule


class Dyn(nn.Module):
    def __init__(self, h: int, a: int):
        super().__init__()
        self.net = nn.Linear(h + a, h + 1)

    def forward(self, latent, action):
        out = self.net(torch.cat([latent, action], -1))
        return torch.tanh(out[..., :-1]), out[..., -1:]


def test_model_adapter_runs_both_policies_and_matches_a_manual_step():
    torch.manual_seed(0)
    h, a, b = 8, 3, 6
    dynamics = TensorDictModule(Dyn(h, a), in_keys=["latent", "action"], out_keys=["latent", "reward"])
    pred_net = nn.Linear(h, a + 1)
    prediction = TensorDictModule(lambda x: (pred_net(x)[..., :a], pred_net(x)[..., a]), in_keys=["latent"],
                                  out_keys=["prior_logits", "value"])
    fn = recurrent_fn_from_model(dynamics, prediction, latent_keys=["latent"], num_actions=a, discount=0.97)
    latent = torch.randn(b, h)
    emb = TensorDict({"latent": latent}, batch_size=[b])
    action = torch.tensor([0, 1, 2, 0, 1, 2])
    with torch.no_grad():
        out, nxt = fn(None, None, action, emb)
        want_latent, want_reward = Dyn.forward(dynamics.module, latent, nn.functional.one_hot(action, a).float())
        torch.testing.assert_close(nxt["latent"], want_latent)
        torch.testing.assert_close(out.reward, want_reward[:, 0])
        torch.testing.assert_close(out.prior_logits, pred_net(want_latent)[:, :a])
        assert out.discount.tolist() == pytest.approx([0.97] * b)
        assert "latent" in emb.keys() and torch.equal(emb["latent"], latent)  # the input embedding is untouched
        root = RootFnOutput(pred_net(latent)[:, :a], pred_net(latent)[:, a], emb)
        for policy in (muzero_policy, gumbel_muzero_policy):
            res = policy(None, torch.Generator().manual_seed(0), root, fn, 16)
            assert res.search_tree.node_visits[:, 0].tolist() == [17] * b
            assert res.search_tree.embeddings["latent"].shape == (b, 17, h)


def test_model_adapter_needs_latent_keys():
    with pytest.raises(ValueError, match="latent_keys must name at least one entry"):
        recurrent_fn_from_model(lambda td: td, lambda td: td, latent_keys=[])


def test_env_adapter_steps_the_true_dynamics():
    env = CartPoleEnv(batch_size=[4], seed=0)
    env.reset()
    root = root_from_env(env)
    fn = recurrent_fn_from_env(env, discount=0.99)
    action = torch.tensor([0, 1, 1, 0])
    out, nxt = fn(None, None, action, root.embedding)
    td = env.step(TensorDict({"action": action}, batch_size=[4]))
    st = env.get_state()
    want = torch.stack([st[n] for n in env.state_names], -1)
    torch.testing.assert_close(nxt["state"], want)
    torch.testing.assert_close(out.reward, td["next", "reward"][:, 0])
    assert torch.equal(nxt["done"], td["next", "terminated"][:, 0])


def test_env_adapter_search_finds_the_goal_in_gridworld():
    """With the true dynamics as model, search takes the shortest way to the goal."""
    env = GridWorldEnv(params=GridWorldParams(size=3, step_reward=-0.1), batch_size=[3], seed=0)
    env.reset()
    # cells of the 3x3 grid (goal 8): 7 left of it, 5 above it, 4 the centre
    env.set_state({"cell": torch.tensor([7, 5, 4])})
    root = root_from_env(env)
    fn = recurrent_fn_from_env(env, discount=0.95)
    for policy, kw in ((gumbel_muzero_policy, {"gumbel_scale": 0.0}),
                       (muzero_policy, {"dirichlet_fraction": 0.0, "temperature": 0.0})):
        out = policy(None, torch.Generator().manual_seed(0), root, fn, 64, **kw)
        a = out.action.tolist()
        assert a[0] == 1 and a[1] == 2  # right, down: onto the goal
        assert a[2] in (1, 2)  # towards it
        q = out.search_tree.summary().qvalues
        assert q[0, 1].item() == pytest.approx(1.0)


def test_env_adapter_terminal_state_is_absorbing():
    env = CartPoleEnv(batch_size=[2], seed=0)
    env.reset()
    root = root_from_env(env)
    emb = root.embedding.clone()
    emb["done"] = torch.tensor([True, False])
    fn = recurrent_fn_from_env(env)
    out, nxt = fn(None, None, torch.tensor([1, 1]), emb)
    assert torch.equal(nxt["state"][0], emb["state"][0])
    assert out.reward[0] == 0 and out.discount[0] == 0 and out.value[0] == 0
    assert bool(nxt["done"][0])


def test_env_adapter_refuses_what_it_cannot_search():
    with pytest.raises(TypeError, match="PendulumEnv has a Bounded.* action spec; tree search needs discrete actions"):
        recurrent_fn_from_env(PendulumEnv(batch_size=[2]))
    with pytest.raises(TypeError, match="must be a native steersman env"):
        recurrent_fn_from_env(object())
    with pytest.raises(ValueError, match=r"one batch dim \[B\], got \[2, 3\]"):
        recurrent_fn_from_env(CartPoleEnv(batch_size=[2, 3]))
