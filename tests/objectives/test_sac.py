"""SACLoss and DiscreteSACLoss: values and gradients against plain-torch references, and
their invariants (alpha-loss sign, targets, the vmapped ensemble, bad input)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from steersman.data import Bounded, Categorical, Composite, OneHot
from steersman.objectives import DiscreteSACLoss, HardUpdate, SACLoss, SoftUpdate, ValueEstimators
from steersman.objectives.sac import _call_critics
from steersman.tensordict.nn import (
    MaskedCategorical,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    to_module,
)
from steersman.tensordict.nn import TensorDictModule as TDM
from tests.objectives.cases_sac import (
    ACT,
    GAMMA,
    N_ACTIONS,
    OBS,
    Critic,
    actor,
    categorical_batch,
    continuous_batch,
    critic_ref,
    discrete_actor,
    discrete_qvalue,
    member,
    mlp,
    one_hot_batch,
    qvalue,
    smooth_l1,
    tanh_normal_ref,
    value,
)

SHAPES = [(8,), (3, 5)]


@pytest.fixture
def float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def grads(out: torch.Tensor, params: list[torch.Tensor]) -> list[torch.Tensor]:
    """d out / d params, zeros where ``out`` does not depend on a parameter."""
    got = torch.autograd.grad(out, params, retain_graph=True, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, got)]


def assert_grads(out, ref, params, names, msg):
    for g, r, n in zip(grads(out, params), grads(ref, params), names):
        torch.testing.assert_close(g, r, msg=f"{msg}: gradient of {n}")


def param_list(loss):
    named = [(n, p) for n, p in loss.named_parameters() if p.requires_grad]
    return [n for n, _ in named], [p for _, p in named]


# ------------------------------------------------------------------ SAC references
def reference_sac(loss, batch, eps_next, eps_cur, *, n_critics, target_entropy):
    """SAC v2, written out: a Python loop over critics, the tanh-normal by hand."""
    aw = list(loss.actor_network.parameters())
    qs = [member(loss.qvalue_network_params, i) for i in range(n_critics)]
    targets = [member(loss.target_qvalue_network_params, i) for i in range(n_critics)]
    alpha = loss.log_alpha.detach().exp()
    obs, act, nxt = batch["observation"], batch["action"], batch["next"]
    with torch.no_grad():
        a2, logp2 = tanh_normal_ref(aw, nxt["observation"], eps_next)
        q2 = torch.stack([critic_ref(w, nxt["observation"], a2) for w in targets]).min(0).values
        y = nxt["reward"] + GAMMA * (~nxt["terminated"]).double() * (q2 - alpha * logp2.unsqueeze(-1))
    q = torch.stack([critic_ref(w, obs, act) for w in qs])
    loss_q = smooth_l1(q, y.expand_as(q)).sum(0).mean()
    a, logp = tanh_normal_ref(aw, obs, eps_cur)
    q_pi = torch.stack([critic_ref([t.detach() for t in w], obs, a) for w in qs]).min(0).values
    loss_actor = (alpha * logp - q_pi.squeeze(-1)).mean()
    loss_alpha = (-loss.log_alpha * (logp.detach() + target_entropy)).mean()
    return {"loss_qvalue": loss_q, "loss_actor": loss_actor, "loss_alpha": loss_alpha,
            "entropy": -logp.detach().mean()}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n_critics", [1, 2, 3])
def test_sac_matches_reference(float64, shape, n_critics):
    torch.manual_seed(0)
    loss = SACLoss(actor(), qvalue(), num_qvalue_nets=n_critics, target_entropy=-1.5, alpha_init=0.7)
    batch = continuous_batch(loss, shape)
    torch.manual_seed(1)
    out = loss(batch.clone())
    torch.manual_seed(1)
    eps_next, eps_cur = torch.randn(*shape, ACT), torch.randn(*shape, ACT)
    ref = reference_sac(loss, batch, eps_next, eps_cur, n_critics=n_critics, target_entropy=-1.5)
    names, params = param_list(loss)
    for key, value_ in ref.items():
        torch.testing.assert_close(out[key], value_, msg=key)
        if key.startswith("loss_"):
            assert_grads(out[key], value_, params, names, key)
    torch.testing.assert_close(out["alpha"], torch.tensor(0.7))


def test_sac_v1_matches_reference(float64):
    """v1: critic target r + gamma * V'(s'); V regressed on min Q'(s, a~) - alpha * log pi(a~|s)."""
    torch.manual_seed(0)
    loss = SACLoss(actor(), qvalue(), value(), target_entropy=-2.0, loss_function="l2")
    batch = continuous_batch(loss, (3, 5))
    with torch.no_grad():  # make the target value net differ from the online one
        for p in loss.target_value_network.parameters():
            p.add_(0.1)
    torch.manual_seed(1)
    out = loss(batch.clone())
    torch.manual_seed(1)
    eps_value, eps_actor = torch.randn(3, 5, ACT), torch.randn(3, 5, ACT)

    aw = list(loss.actor_network.parameters())
    vw, vtw = list(loss.value_network.parameters()), list(loss.target_value_network.parameters())
    qs = [member(loss.qvalue_network_params, i) for i in range(2)]
    targets = [member(loss.target_qvalue_network_params, i) for i in range(2)]
    obs, act, nxt = batch["observation"], batch["action"], batch["next"]
    y = nxt["reward"] + GAMMA * (~nxt["terminated"]).double() * mlp(vtw, nxt["observation"])
    q = torch.stack([critic_ref(w, obs, act) for w in qs])
    ref_q = (q - y).pow(2).sum(0).mean()
    with torch.no_grad():
        a, logp = tanh_normal_ref(aw, obs, eps_value)
        v_target = torch.stack([critic_ref(w, obs, a) for w in targets]).min(0).values.squeeze(-1) - logp
    ref_value = (mlp(vw, obs).squeeze(-1) - v_target).pow(2).mean()
    a, logp = tanh_normal_ref(aw, obs, eps_actor)
    q_pi = torch.stack([critic_ref([t.detach() for t in w], obs, a) for w in qs]).min(0).values.squeeze(-1)
    ref_actor = (logp - q_pi).mean()
    names, params = param_list(loss)
    for key, ref in (("loss_qvalue", ref_q), ("loss_value", ref_value), ("loss_actor", ref_actor)):
        torch.testing.assert_close(out[key], ref, msg=key)
        assert_grads(out[key], ref, params, names, key)


def td_lambda_ref(reward, next_value, done, terminated, gamma, lmbda):
    """Python loop over the last batch dim; a done step (or the batch end) restarts the return."""
    out = torch.empty_like(reward)
    t_max = reward.shape[-2]
    for t in reversed(range(t_max)):
        r, v = reward[..., t, :], next_value[..., t, :]
        boot = gamma * (~terminated[..., t, :]).to(r.dtype)
        if t == t_max - 1:
            out[..., t, :] = r + boot * v
        else:
            mixed = (1 - lmbda) * v + lmbda * out[..., t + 1, :]
            out[..., t, :] = r + boot * torch.where(done[..., t, :], v, mixed)
    return out


def test_sac_td_lambda_estimator_on_time_batches(float64):
    """make_value_estimator(TDLambda): the critic target is the TD(lambda) return of the soft
    next values, cut at done, bootstrapped at truncation, on a [B, T] batch."""
    torch.manual_seed(0)
    loss = SACLoss(actor(), qvalue(), target_entropy=-2.0, loss_function="l2")
    loss.make_value_estimator(ValueEstimators.TDLambda, gamma=0.9, lmbda=0.7)
    batch = continuous_batch(loss, (3, 7))
    torch.manual_seed(1)
    out = loss(batch.clone())
    torch.manual_seed(1)
    eps_next = torch.randn(3, 7, ACT)
    aw = list(loss.actor_network.parameters())
    nxt = batch["next"]
    with torch.no_grad():
        a2, logp2 = tanh_normal_ref(aw, nxt["observation"], eps_next)
        targets = [member(loss.target_qvalue_network_params, i) for i in range(2)]
        v2 = torch.stack([critic_ref(w, nxt["observation"], a2) for w in targets]).min(0).values - logp2.unsqueeze(-1)
        y = td_lambda_ref(nxt["reward"], v2, nxt["done"], nxt["terminated"], 0.9, 0.7)
    q = torch.stack([critic_ref(member(loss.qvalue_network_params, i), batch["observation"], batch["action"])
                     for i in range(2)])
    torch.testing.assert_close(out["loss_qvalue"], (q - y).pow(2).sum(0).mean())


# ------------------------------------------------------------------ discrete SAC reference
@pytest.mark.parametrize("space", ["one-hot", "categorical"])
@pytest.mark.parametrize("shape", SHAPES)
def test_discrete_sac_matches_reference(float64, space, shape):
    torch.manual_seed(0)
    dist = torch.distributions.OneHotCategorical if space == "one-hot" else torch.distributions.Categorical
    loss = DiscreteSACLoss(discrete_actor(dist), discrete_qvalue(), action_space=space, num_actions=N_ACTIONS,
                           alpha_init=0.5, loss_function="l2")
    batch = (one_hot_batch if space == "one-hot" else categorical_batch)(loss, shape)
    out = loss(batch.clone())

    aw = list(loss.actor_network.parameters())
    qs = [member(loss.qvalue_network_params, i) for i in range(2)]
    targets = [member(loss.target_qvalue_network_params, i) for i in range(2)]
    alpha = 0.5
    obs, nxt = batch["observation"], batch["next"]
    index = batch["action"].argmax(-1) if space == "one-hot" else batch["action"]
    with torch.no_grad():
        p2 = torch.softmax(mlp(aw, nxt["observation"]), -1)
        q2 = torch.stack([mlp(w, nxt["observation"]) for w in targets]).min(0).values
        v2 = (p2 * (q2 - alpha * p2.log())).sum(-1, keepdim=True)
        y = (nxt["reward"] + GAMMA * (~nxt["terminated"]).double() * v2).squeeze(-1)
    q = torch.stack([mlp(w, obs).gather(-1, index.unsqueeze(-1)).squeeze(-1) for w in qs])
    ref_q = (q - y).pow(2).sum(0).mean()
    logits = mlp(aw, obs)
    p, logp = torch.softmax(logits, -1), torch.log_softmax(logits, -1)
    q_pi = torch.stack([mlp([t.detach() for t in w], obs) for w in qs]).min(0).values
    ref_actor = (p * (alpha * logp - q_pi)).sum(-1).mean()
    entropy = -(p * logp).sum(-1).detach()
    target_entropy = 0.98 * torch.log(torch.tensor(float(N_ACTIONS)))
    ref_alpha = (-loss.log_alpha * (target_entropy - entropy)).mean()
    names, params = param_list(loss)
    for key, ref in (("loss_qvalue", ref_q), ("loss_actor", ref_actor), ("loss_alpha", ref_alpha)):
        torch.testing.assert_close(out[key], ref, msg=key)
        assert_grads(out[key], ref, params, names, key)
    torch.testing.assert_close(out["entropy"], entropy.mean())


def test_discrete_sac_masked_actions_are_finite():
    """Masked actions (probability 0, log-probability -inf) contribute 0, not NaN."""
    torch.manual_seed(0)
    head = ProbabilisticTensorDictModule({"logits": "logits", "mask": "mask"}, ["action"], MaskedCategorical)
    policy = ProbabilisticTensorDictSequential(discrete_actor()[0], head)
    loss = DiscreteSACLoss(policy, discrete_qvalue(), action_space="categorical", num_actions=N_ACTIONS)
    batch = categorical_batch(loss, (6,))
    mask = torch.ones(6, N_ACTIONS, dtype=torch.bool)
    mask[:, 0] = False
    batch["mask"], batch["next", "mask"] = mask, mask
    batch["action"] = torch.randint(1, N_ACTIONS, (6,))
    out = loss(batch)
    total = out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]
    total.backward()
    assert torch.isfinite(total)
    assert all(torch.isfinite(p.grad).all() for p in loss.parameters() if p.grad is not None)


# ------------------------------------------------------------------ invariants
def make_sac(**kw):
    return SACLoss(actor(), qvalue(), **{"target_entropy": -float(ACT), **kw})


def make_discrete(**kw):
    return DiscreteSACLoss(discrete_actor(), discrete_qvalue(), action_space="one-hot", num_actions=N_ACTIONS, **kw)


ALPHA_LOSSES = [(make_sac, continuous_batch), (make_discrete, one_hot_batch)]


@pytest.mark.parametrize("make, batch_fn", ALPHA_LOSSES, ids=["SACLoss", "DiscreteSACLoss"])
@pytest.mark.parametrize("target_entropy, direction", [(50.0, 1), (-50.0, -1)])
def test_alpha_loss_sign(make, batch_fn, target_entropy, direction):
    """Entropy below the target -> the gradient step raises alpha; above -> lowers it."""
    torch.manual_seed(0)
    loss = make(target_entropy=target_entropy)
    out = loss(batch_fn(loss, (8,)))
    out["loss_alpha"].backward()
    assert torch.sign(loss.log_alpha.grad).item() == -direction
    before = loss.log_alpha.item()
    torch.optim.SGD([loss.log_alpha], lr=0.1).step()
    assert (loss.log_alpha.item() - before) * direction > 0


@pytest.mark.parametrize("make, batch_fn", ALPHA_LOSSES, ids=["SACLoss", "DiscreteSACLoss"])
def test_targets_start_equal_never_get_gradients_and_follow_updaters(make, batch_fn):
    torch.manual_seed(0)
    loss = make()
    online, target = loss.qvalue_network_params, loss.target_qvalue_network_params
    for key in online.keys(include_nested=True, leaves_only=True):
        assert torch.equal(online[key], target[key]) and not target[key].requires_grad
    out = loss(batch_fn(loss, (8,)))
    sum(v for k, v in out.items() if k.startswith("loss_")).backward()
    assert all(t.grad is None for t in target.values(include_nested=True, leaves_only=True))
    key = online.keys(include_nested=True, leaves_only=True)[0]
    with torch.no_grad():
        online[key].add_(1.0)
    old = target[key].clone()
    SoftUpdate(loss, tau=0.25).step()
    torch.testing.assert_close(target[key], 0.75 * old + 0.25 * online[key])
    HardUpdate(loss, value_network_update_interval=1).step()
    assert torch.equal(target[key], online[key])


def test_ensemble_members_are_independent_and_vmap_equals_a_loop():
    torch.manual_seed(0)
    q = qvalue()
    loss = SACLoss(actor(), q, num_qvalue_nets=3, target_entropy=-2.0)
    params = loss.qvalue_network_params
    assert params.batch_size == torch.Size([3])
    assert torch.equal(params["module", "net", "0", "weight"][0], q.module.net[0].weight)  # member 0: the given net
    assert not torch.equal(params["module", "net", "0", "weight"][1], params["module", "net", "0", "weight"][2])
    batch = continuous_batch(loss, (5,))
    vmapped = _call_critics(loss, batch, batch["action"], params)  # [3, 5, 1]
    g_vmap = torch.autograd.grad(vmapped.pow(2).sum(), params["module", "net", "0", "weight"])[0]
    loop, g_loop = [], []
    for i in range(3):
        net = copy.deepcopy(q)
        to_module(params[i].detach().clone(), net, inplace=True)
        out = net(batch.select("observation", "action"))["state_action_value"]
        loop.append(out)
        g_loop.append(torch.autograd.grad(out.pow(2).sum(), net.module.net[0].weight)[0])
    torch.testing.assert_close(vmapped, torch.stack(loop))
    torch.testing.assert_close(g_vmap, torch.stack(g_loop))
    assert not any(p.device.type != "meta" for p in loss.qvalue_network.parameters())  # a template only


def test_fixed_alpha_and_bounds():
    torch.manual_seed(0)
    fixed = make_sac(fixed_alpha=True, alpha_init=0.3)
    assert "log_alpha" not in dict(fixed.named_parameters())
    out = fixed(continuous_batch(fixed, (4,)))
    torch.testing.assert_close(out["alpha"], torch.tensor(0.3))
    assert not out["loss_alpha"].requires_grad
    bounded = make_sac(min_alpha=0.5, max_alpha=2.0)
    with torch.no_grad():
        bounded.log_alpha.fill_(5.0)
    out = bounded(continuous_batch(bounded, (4,)))
    torch.testing.assert_close(out["alpha"], torch.tensor(2.0))
    torch.testing.assert_close(bounded.log_alpha.detach(), torch.tensor(2.0).log())


def test_target_entropy_auto():
    spec = Bounded(-1.0, 1.0, shape=(ACT,))
    assert make_sac(target_entropy="auto", action_spec=spec).target_entropy.item() == -ACT
    comp = Composite(action=Bounded(-1.0, 1.0, shape=(3, 2)))
    assert make_sac(target_entropy="auto", action_spec=comp).target_entropy.item() == -6.0
    with pytest.raises(ValueError, match="action_spec"):
        make_sac(target_entropy="auto")
    assert DiscreteSACLoss(discrete_actor(), discrete_qvalue(), action_space=OneHot(N_ACTIONS)).action_space == "one-hot"
    loss = DiscreteSACLoss(discrete_actor(), discrete_qvalue(), action_space=Categorical(N_ACTIONS),
                           target_entropy_weight=0.5)
    assert loss.action_space == "categorical"
    torch.testing.assert_close(loss.target_entropy, 0.5 * torch.log(torch.tensor(float(N_ACTIONS))))


@pytest.mark.parametrize("reduction", ["sum", "none"])
def test_reduction(reduction):
    torch.manual_seed(0)
    loss_mean, loss_other = make_sac(), make_sac(reduction=reduction)
    loss_other.load_state_dict(loss_mean.state_dict())
    batch = continuous_batch(loss_mean, (3, 4))
    torch.manual_seed(1)
    mean = loss_mean(batch.clone())
    torch.manual_seed(1)
    other = loss_other(batch.clone())
    for key in ("loss_actor", "loss_qvalue", "loss_alpha"):
        if reduction == "sum":
            torch.testing.assert_close(other[key], mean[key] * 12)
        else:
            assert other[key].shape == (3, 4)
            torch.testing.assert_close(other[key].mean(), mean[key])


def test_set_keys_and_priority():
    torch.manual_seed(0)
    critic = TDM(Critic(), ["observation", "act"], ["state_action_value"])
    loss = SACLoss(actor(), critic, target_entropy=-2.0).set_keys(action="act", reward="rew", priority="prio")
    assert loss.value_estimator.tensor_keys.reward == "rew"
    batch = continuous_batch(loss, (6,))
    batch.rename_key_("action", "act").rename_key_(("next", "reward"), ("next", "rew"))
    out = loss(batch)
    assert torch.isfinite(out["loss_qvalue"])
    assert batch["prio"].shape == (6,) and (batch["prio"] >= 0).all()


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("make, batch_fn", ALPHA_LOSSES, ids=["SACLoss", "DiscreteSACLoss"])
def test_missing_keys_name_the_fix(make, batch_fn):
    torch.manual_seed(0)
    loss = make()
    batch = batch_fn(loss, (4,))
    name = type(loss).__name__
    with pytest.raises(KeyError) as err:
        loss(batch.exclude("action"))
    msg = err.value.args[0]
    assert f"{name} needs 'action'" in msg and "loss.set_keys(action=" in msg, msg
    with pytest.raises(KeyError) as err:
        loss(batch.exclude(("next", "reward")))
    msg = err.value.args[0]
    assert name in msg and "'reward'" in msg and "set_keys(reward=" in msg, msg


@pytest.mark.parametrize("make, batch_fn", ALPHA_LOSSES, ids=["SACLoss", "DiscreteSACLoss"])
def test_reward_without_trailing_dim_is_an_error(make, batch_fn):
    torch.manual_seed(0)
    loss = make(min_alpha=0.5)
    batch = batch_fn(loss, (4,))
    batch["next"] = batch["next"].exclude("reward").set("reward", torch.randn(4))
    with torch.no_grad():
        loss.log_alpha.fill_(0.0)
    before = {k: v.clone() for k, v in loss.state_dict().items()}
    with pytest.raises(ValueError, match=r"reward.*\[4\].*\[4, 1\]"):
        loss(batch)
    assert all(torch.equal(v, before[k]) for k, v in loss.state_dict().items())


def test_critic_with_wrong_output_shape_is_an_error():
    class TwoOutputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(OBS + ACT, 2)

        def forward(self, observation, action):
            return self.net(torch.cat([observation, action], -1))

    loss = SACLoss(actor(), TDM(TwoOutputs(), ["observation", "action"], ["state_action_value"]), target_entropy=-2.0)
    with pytest.raises(ValueError, match=r"state_action_value.*\[4, 2\].*\[4\] \+ \[1\]"):
        loss(continuous_batch(loss, (4,)))


def test_gae_is_rejected():
    with pytest.raises(NotImplementedError, match="no GAE value estimator .use TD0, TD1, TDLambda"):
        make_sac().make_value_estimator(ValueEstimators.GAE)


def test_one_hot_action_shape_is_checked():
    torch.manual_seed(0)
    loss = make_discrete()
    batch = one_hot_batch(loss, (4,))
    batch["action"] = F.one_hot(torch.randint(3, (4,)), 3)
    with pytest.raises(ValueError, match=r"one-hot action.*\[4, 3\].*\[4, 4\]"):
        loss(batch)


def test_discrete_action_space_default_and_index_shapes():
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="assuming 'one-hot'"):
        loss = DiscreteSACLoss(discrete_actor(), discrete_qvalue(), num_actions=N_ACTIONS)
    assert loss.action_space == "one-hot"
    loss = DiscreteSACLoss(discrete_actor(), discrete_qvalue(), action_space="categorical", num_actions=N_ACTIONS)
    batch = categorical_batch(loss, (5,))
    torch.manual_seed(1)
    flat = loss(batch.clone())
    batch["action"] = batch["action"].unsqueeze(-1)  # [B, 1] indices: the same transitions
    torch.manual_seed(1)
    torch.testing.assert_close(loss(batch.clone())["loss_qvalue"], flat["loss_qvalue"])
    with pytest.raises(ValueError, match="num_actions"):
        DiscreteSACLoss(discrete_actor(), discrete_qvalue(), action_space="categorical")
