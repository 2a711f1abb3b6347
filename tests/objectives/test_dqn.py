"""DQNLoss: value and gradients against a plain-torch reference, and its invariants."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.data import Categorical, Composite, OneHot
from steersman.objectives import (
    DistributionalDQNLoss,
    DQNLoss,
    HardUpdate,
    SoftUpdate,
    ValueEstimators,
)
from steersman.tensordict.nn import TensorDictModule
from tests.objectives.cases_value_based import (
    N_ACTIONS,
    N_ATOMS,
    OBS,
    SUPPORT,
    c51_network,
    q_network,
    transitions,
)

GAMMA = 0.99


# ------------------------------------------------------------------ reference
def mlp(w: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """The q_network of the cases file with weights ``[W1, b1, W2, b2]``, on one observation."""
    return torch.tanh(x @ w[0].T + w[1]) @ w[2].T + w[3]


def weights(module: torch.nn.Module, requires_grad: bool = False) -> list[torch.Tensor]:
    return [p.detach().clone().requires_grad_(requires_grad) for p in module.parameters()]


def reference_dqn(online, target, batch, *, double, loss_function="l2", gamma=GAMMA):
    """One sample at a time: y = r + gamma * (1 - terminated) * Q_target(s', a*)."""
    obs, act = batch["observation"], batch["action"].reshape(-1)
    nobs, rew, term = batch["next", "observation"], batch["next", "reward"], batch["next", "terminated"]
    losses = []
    for i in range(obs.shape[0]):
        pred = mlp(online, obs[i])[int(act[i])]
        q_next_target = mlp(target, nobs[i]).detach()
        chooser = mlp(online, nobs[i]).detach() if double else q_next_target
        best = max(range(N_ACTIONS), key=lambda a: float(chooser[a]))
        y = float(rew[i, 0]) + (0.0 if bool(term[i, 0]) else gamma * float(q_next_target[best]))
        y = torch.tensor(y)
        losses.append((pred - y) ** 2 if loss_function == "l2" else F.smooth_l1_loss(pred, y))
    return torch.stack(losses).mean()


def perturb_(module: torch.nn.Module, scale: float = 0.5) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * scale)


def params_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


@settings(max_examples=12, deadline=None)
@given(batch=st.integers(1, 6), seed=st.integers(0, 2**16), double=st.booleans(),
       loss_function=st.sampled_from(["l2", "smooth_l1"]))
def test_matches_reference_value_and_gradients(batch, seed, double, loss_function):
    torch.manual_seed(seed)
    loss = DQNLoss(q_network(), double_dqn=double, loss_function=loss_function, action_space="categorical")
    perturb_(loss.target_value_network)  # a target that differs from the online network
    td = transitions((batch,), torch.randint(N_ACTIONS, (batch,)))
    online = weights(loss.value_network.module, requires_grad=True)
    target = weights(loss.target_value_network.module)

    out = loss(td)
    out["loss"].backward()
    expected = reference_dqn(online, target, td, double=double, loss_function=loss_function)
    expected.backward()

    torch.testing.assert_close(out["loss"], expected)
    for p, ref in zip(loss.value_network.module.parameters(), online):
        torch.testing.assert_close(p.grad, ref.grad)
    assert all(p.grad is None for p in loss.target_value_network.parameters())


# ------------------------------------------------------------------ target network
def test_target_starts_equal_frozen_and_separate():
    loss = DQNLoss(q_network())
    assert params_equal(loss.value_network, loss.target_value_network)
    assert not any(p.requires_grad for p in loss.target_value_network.parameters())
    before = weights(loss.target_value_network)
    perturb_(loss.value_network)  # perturbing the online net after construction leaves the target alone
    assert all(torch.equal(p, q) for p, q in zip(loss.target_value_network.parameters(), before))


def test_target_network_drives_the_target():
    torch.manual_seed(0)
    loss = DQNLoss(q_network())
    td = transitions((16,), torch.randint(N_ACTIONS, (16,)))
    first = loss(td.clone())["loss"]
    perturb_(loss.target_value_network)
    assert not torch.allclose(loss(td.clone())["loss"], first)

    # without a target network the online network (no gradient) gives the next value
    no_target = DQNLoss(q_network(), delay_value=False)
    online = weights(no_target.value_network.module, requires_grad=True)
    torch.testing.assert_close(no_target(td.clone())["loss"], reference_dqn(online, online, td, double=False))
    assert not hasattr(no_target, "target_value_network")


def constant_q(values: list[float]) -> TensorDictModule:
    """A q_network whose output is ``values`` for every observation."""
    net = q_network()
    with torch.no_grad():
        net.module[2].weight.zero_()
        net.module[2].bias.copy_(torch.tensor(values))
    return net


def one_step(terminated: list[bool], truncated: list[bool], action: int = 0, mask=None):
    n = len(terminated)
    td = transitions((n,), torch.full((n,), action))
    td["next", "reward"] = torch.ones(n, 1)
    td["next", "terminated"] = torch.tensor(terminated).unsqueeze(-1)
    td["next", "truncated"] = torch.tensor(truncated).unsqueeze(-1)
    td["next", "done"] = td["next", "terminated"] | td["next", "truncated"]
    if mask is not None:
        td["next", "action_mask"] = torch.tensor(mask).expand(n, N_ACTIONS)
    return td


@pytest.mark.parametrize("double, expected_next", [(False, 5.0), (True, 0.0)])
def test_double_dqn_rates_the_online_argmax_with_the_target_net(double, expected_next):
    # online argmax = action 1; target argmax = action 0 (value 5); target at action 1 = 0
    loss = DQNLoss(constant_q([0.0, 10.0, 0.0]), double_dqn=double, reduction="none", loss_function="l1")
    with torch.no_grad():
        loss.target_value_network.module[2].bias.copy_(torch.tensor([5.0, 0.0, -5.0]))
    td = one_step([False], [False], action=0)  # pred = Q(s, 0) = 0
    torch.testing.assert_close(loss(td)["loss"], torch.tensor([1.0 + GAMMA * expected_next]))


def test_terminated_stops_bootstrap_truncated_bootstraps():
    loss = DQNLoss(constant_q([0.0, 0.0, 0.0]), reduction="none", loss_function="l1")
    with torch.no_grad():
        loss.target_value_network.module[2].bias.copy_(torch.tensor([2.0, 3.0, 1.0]))
    td = one_step(terminated=[True, False, False], truncated=[False, True, False])
    # pred = 0; target = 1 (terminated), 1 + gamma * 3 (truncated and ongoing)
    torch.testing.assert_close(loss(td)["loss"], torch.tensor([1.0, 1.0 + 3 * GAMMA, 1.0 + 3 * GAMMA]))


@pytest.mark.parametrize("double", [False, True])
def test_masked_actions_are_never_chosen(double):
    loss = DQNLoss(constant_q([1.0, 10.0, 0.0]), double_dqn=double, reduction="none", loss_function="l1")
    with torch.no_grad():
        loss.target_value_network.module[2].bias.copy_(torch.tensor([4.0, 100.0, 2.0]))
    td = one_step([False], [False], mask=[True, False, True])
    # action 1 (the best for both nets) is masked: the target net's best allowed value is 4
    # (DQN); the online net's best allowed action is 0, rated 4 by the target net (double DQN)
    torch.testing.assert_close(loss(td)["loss"], torch.tensor([abs(1.0 - (1.0 + GAMMA * 4.0))]))
    td = one_step([False], [False], mask=[False, False, True])
    torch.testing.assert_close(loss(td)["loss"], torch.tensor([abs(1.0 - (1.0 + GAMMA * 2.0))]))


# ------------------------------------------------------------------ action formats
@pytest.mark.parametrize(
    "fmt, action_space",
    [
        ("index", None), ("index1", None), ("onehot", None), ("onehot_bool", None),
        ("index", "categorical"), ("index1", "categorical"), ("onehot", "one_hot"), ("onehot", "one-hot"),
        ("index", Categorical(N_ACTIONS)), ("onehot", OneHot(N_ACTIONS)),
        ("index", Composite(action=Categorical(N_ACTIONS))),
    ],
)
def test_action_formats_give_the_same_loss_and_gradients(fmt, action_space):
    torch.manual_seed(0)
    td = transitions((6,), torch.randint(N_ACTIONS, (6,)))
    net = q_network()
    ref = DQNLoss(net, action_space="categorical")
    ref(td.clone())["loss"].backward()
    index = td["action"]
    td["action"] = {
        "index": index, "index1": index.unsqueeze(-1),
        "onehot": F.one_hot(index, N_ACTIONS).float(), "onehot_bool": F.one_hot(index, N_ACTIONS).bool(),
    }[fmt]
    loss = DQNLoss(net, action_space=action_space)
    grads = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    value = loss(td)["loss"]
    value.backward()
    torch.testing.assert_close(value, ref(td.clone().set("action", index))["loss"].detach())
    for p, g in zip(net.parameters(), grads):
        torch.testing.assert_close(p.grad, g)


def test_action_space_from_the_network_spec():
    net = q_network()
    net.spec = OneHot(N_ACTIONS)
    loss = DQNLoss(net)
    assert (loss.action_space, loss.n_actions) == ("one_hot", N_ACTIONS)


# ------------------------------------------------------------------ estimators, priorities, updaters
def test_td_lambda_on_time_batches_matches_a_loop():
    torch.manual_seed(0)
    gamma, lmbda, shape = 0.9, 0.7, (3, 5)
    loss = DQNLoss(q_network()).make_value_estimator(ValueEstimators.TDLambda, gamma=gamma, lmbda=lmbda)
    perturb_(loss.target_value_network)
    td = transitions(shape, torch.randint(N_ACTIONS, shape))
    online, target = weights(loss.value_network.module, True), weights(loss.target_value_network.module)
    out = loss(td)
    out["loss"].backward()

    rew, done, term = td["next", "reward"][..., 0], td["next", "done"][..., 0], td["next", "terminated"][..., 0]
    errors = []
    for b in range(shape[0]):
        nxt = [float(mlp(target, td["next", "observation"][b, t]).max()) for t in range(shape[1])]
        ret = 0.0
        for t in reversed(range(shape[1])):
            # G_t = r_t + gamma (1 - term_t) [(1 - lmbda) V(s_t+1) + lmbda G_t+1]; G_t+1 := V(s_t+1) at an episode end
            later = nxt[t] if (bool(done[b, t]) or t == shape[1] - 1) else ret
            ret = float(rew[b, t]) + (0.0 if bool(term[b, t]) else gamma * ((1 - lmbda) * nxt[t] + lmbda * later))
            pred = mlp(online, td["observation"][b, t])[int(td["action"][b, t])]
            errors.append((pred - ret) ** 2)
    expected = torch.stack(errors).mean()
    expected.backward()
    torch.testing.assert_close(out["loss"], expected)
    for p, ref in zip(loss.value_network.module.parameters(), online):
        torch.testing.assert_close(p.grad, ref.grad)


def test_priority_is_written_back_for_replay():
    torch.manual_seed(0)
    loss = DQNLoss(q_network(), reduction="none")
    td = transitions((5,), torch.randint(N_ACTIONS, (5,)))
    out = loss(td)
    assert td["td_error"].shape == (5, 1) and not td["td_error"].requires_grad
    torch.testing.assert_close(td["td_error"][:, 0], out["loss"].detach())  # l2: the squared TD error
    torch.testing.assert_close(out["td_error"], out["loss"].detach().mean())
    loss.set_keys(priority="prio")
    loss(td)
    assert "prio" in td.keys()


@pytest.mark.parametrize("kwargs", [{"tau": 0.25}, {"eps": 0.75}])
def test_soft_update_moves_the_target(kwargs):
    loss = DQNLoss(q_network())
    perturb_(loss.value_network)
    online, target = weights(loss.value_network), weights(loss.target_value_network)
    SoftUpdate(loss, **kwargs).step()
    for p, o, t in zip(loss.target_value_network.parameters(), online, target):
        torch.testing.assert_close(p, 0.75 * t + 0.25 * o)


def test_hard_update_copies_every_interval():
    loss = DQNLoss(q_network())
    updater = HardUpdate(loss, value_network_update_interval=3)
    perturb_(loss.value_network)
    updater.step()
    updater.step()
    assert not params_equal(loss.value_network, loss.target_value_network)
    updater.step()
    assert params_equal(loss.value_network, loss.target_value_network)


def test_no_target_network_means_no_updater():
    with pytest.raises(ValueError, match="no target networks"):
        SoftUpdate(DQNLoss(q_network(), delay_value=False), tau=0.1)


# ------------------------------------------------------------------ bad input
def batch():
    torch.manual_seed(0)
    return transitions((4,), torch.randint(N_ACTIONS, (4,)))


def test_missing_action_names_the_fix_and_renaming_works():
    loss = DQNLoss(q_network())
    td = batch()
    td["act"] = td.pop("action")
    with pytest.raises(KeyError, match=r"DQNLoss needs .*action.*set_keys\(action="):
        loss(td)
    assert "td_error" not in td.keys()
    loss.set_keys(action="act")
    assert torch.isfinite(loss(td)["loss"])


def test_reward_without_trailing_dim_is_an_error():
    td = batch()
    td["next", "reward"] = td["next", "reward"][:, 0]
    with pytest.raises(ValueError, match="reward.*trailing"):
        DQNLoss(q_network())(td)


def flat_q_network() -> TensorDictModule:
    """Writes ``[B]`` instead of ``[B, n_actions]``."""
    net = torch.nn.Sequential(torch.nn.Linear(OBS, 1), torch.nn.Flatten(0))
    return TensorDictModule(net, ["observation"], ["action_value"])


@pytest.mark.parametrize("net, space", [(flat_q_network, "categorical"), (q_network, Categorical(N_ACTIONS + 1))])
def test_value_network_with_a_wrong_output_shape_is_an_error(net, space):
    with pytest.raises(ValueError, match=r"action_value.*expected \[\*batch, n_actions\]"):
        DQNLoss(net(), action_space=space)(batch())


def test_action_shape_that_fits_no_format_is_an_error():
    td = batch()
    td["action"] = td["action"].unsqueeze(-1).expand(4, 2)
    with pytest.raises(ValueError, match="categorical 'action' must have shape"):
        DQNLoss(q_network(), action_space="categorical")(td)
    with pytest.raises(ValueError, match="one-hot 'action'"):
        DQNLoss(q_network(), action_space="one_hot")(td)


def test_constructor_errors_and_deprecations():
    with pytest.raises(ValueError, match="action_space"):
        DQNLoss(q_network(), action_space="binary")
    with pytest.raises(ValueError, match="loss_function"):
        DQNLoss(q_network(), loss_function="l3")
    with pytest.raises(NotImplementedError, match="GAE"):
        DQNLoss(q_network()).make_value_estimator(ValueEstimators.GAE)
    with pytest.warns(DeprecationWarning, match="gamma"):
        loss = DQNLoss(q_network(), gamma=0.5)
    assert loss.value_estimator.gamma == 0.5


# ------------------------------------------------------------------ distributional (C51)
def c51(w, x):
    """The cases file's C51Head with weights ``[W1, b1, W2, b2]``, on one observation: ``[K, n]``."""
    return (torch.tanh(x @ w[0].T + w[1]) @ w[2].T + w[3]).reshape(N_ATOMS, N_ACTIONS).log_softmax(0)


def reference_c51(online, target, td, gamma):
    """Sample by sample, with the floor/ceil projection of the C51 paper (Algorithm 1)."""
    z = SUPPORT.tolist()
    vmin, vmax, dz = z[0], z[-1], z[1] - z[0]
    losses = []
    for i in range(td.shape[0]):
        log_p_a = c51(online, td["observation"][i])[:, int(td["action"][i])]
        s2, r = td["next", "observation"][i], float(td["next", "reward"][i, 0])
        q_next = (c51(online, s2).exp().detach() * SUPPORT[:, None]).sum(0)
        p = c51(target, s2).exp().detach()[:, int(q_next.argmax())]
        m = [0.0] * N_ATOMS
        for k in range(N_ATOMS):
            tz = r if bool(td["next", "terminated"][i, 0]) else r + gamma * z[k]
            b = (min(max(tz, vmin), vmax) - vmin) / dz
            lo, up = math.floor(b), math.ceil(b)
            if lo == up:
                m[lo] += float(p[k])
            else:
                m[lo] += float(p[k]) * (up - b)
                m[up] += float(p[k]) * (b - lo)
        losses.append(-(torch.tensor(m) * log_p_a).sum())
    return torch.stack(losses).mean()


@settings(max_examples=6, deadline=None)
@given(batch=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_c51_matches_reference_value_and_gradients(batch, seed):
    torch.manual_seed(seed)
    loss = DistributionalDQNLoss(c51_network(), gamma=0.9, support=SUPPORT)
    perturb_(loss.target_value_network)
    td = transitions((batch,), torch.randint(N_ACTIONS, (batch,)))
    td["next", "reward"] = td["next", "reward"] * 3  # some targets fall outside the support
    online = weights(loss.value_network.module.net, requires_grad=True)
    target = weights(loss.target_value_network.module.net)
    out = loss(td)
    out["loss"].backward()
    expected = reference_c51(online, target, td, 0.9)
    expected.backward()
    torch.testing.assert_close(out["loss"], expected)
    for p, ref in zip(loss.value_network.module.parameters(), online):
        torch.testing.assert_close(p.grad, ref.grad)
    assert td["td_error"].shape == (batch, 1)


def test_c51_action_formats_and_bad_input():
    torch.manual_seed(0)
    td = transitions((5,), torch.randint(N_ACTIONS, (5,)))
    loss = DistributionalDQNLoss(c51_network(), gamma=0.9, support=SUPPORT)
    value = loss(td.clone())["loss"]
    for action in (td["action"].unsqueeze(-1), F.one_hot(td["action"], N_ACTIONS)):
        torch.testing.assert_close(loss(td.clone().set("action", action))["loss"], value)
    bad = td.clone()
    bad["next", "reward"] = bad["next", "reward"][:, 0]
    with pytest.raises(ValueError, match="reward.*trailing singleton"):
        loss(bad)
    with pytest.raises(KeyError, match=r"DistributionalDQNLoss needs .*action.*set_keys\(action="):
        loss(td.exclude("action"))
    with pytest.raises(ValueError, match=r"expected \[\*batch, n_atoms, n_actions\]"):
        DistributionalDQNLoss(q_network(), gamma=0.9, support=SUPPORT)(td)
    with pytest.raises(ValueError, match="evenly spaced"):
        DistributionalDQNLoss(c51_network(), gamma=0.9, support=torch.tensor([0.0, 1.0, 3.0]))


def test_renamed_reward_reaches_the_value_estimator():
    torch.manual_seed(0)
    td = transitions((4,), torch.randint(N_ACTIONS, (4,)))
    loss = DQNLoss(q_network())
    expected = loss(td.clone())["loss"]
    td["next", "r"] = td["next"].pop("reward")
    with pytest.raises(KeyError, match="reward"):
        loss(td.clone())
    loss.set_keys(reward="r")
    torch.testing.assert_close(loss(td)["loss"], expected)


@pytest.mark.parametrize("warm_policy_first", [False, True])
def test_torchrl_style_lazy_mlp_policy(warm_policy_first):
    """TorchRL's script: ``DQNLoss(value_network=policy)`` with a lazy ``MLP``. Users either run
    the policy once on a reset TensorDict before building the optimizer (TorchRL's examples),
    or let the loss's first call set up the target; both train, and ``SoftUpdate`` made before
    any call moves the target that the first call creates."""
    from steersman.modules import MLP, QValueActor

    torch.manual_seed(0)
    policy = QValueActor(MLP(out_features=2, num_cells=[64]), in_keys=["observation"], spec=OneHot(2))
    loss = DQNLoss(value_network=policy, action_space="one_hot")  # no parameter touched yet
    updater = SoftUpdate(loss, eps=0.5)
    batch = transitions((6,), F.one_hot(torch.randint(2, (6,)), 2))
    if warm_policy_first:
        policy(batch.select("observation"))  # what TorchRL users do: policy(env.reset())
    else:
        loss(batch.clone())  # the first call sets the lazy layers and the target up
    optim = torch.optim.Adam(loss.parameters(), lr=1e-2)
    trained = {id(p) for p in optim.param_groups[0]["params"] if p.requires_grad}
    assert trained == {id(p) for p in policy.parameters()}  # the online network, materialized
    out = loss(batch.clone())
    out["loss"].backward()
    optim.step()
    assert loss.target_value_network_params["module", "0", "module", "0", "weight"].shape[-1] == OBS
    before = loss.target_value_network_params.clone()
    updater.step()
    after = loss.target_value_network_params
    online = loss.value_network_params
    for key in after.keys(include_nested=True, leaves_only=True):
        torch.testing.assert_close(after[key], 0.5 * before[key] + 0.5 * online[key])
