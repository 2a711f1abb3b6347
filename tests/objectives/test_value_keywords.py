"""TorchRL's keyword arguments of the value estimators, each with its documented effect.

Keys given to the constructor (``advantage_key``...), ``device``, ``deactivate_vmap``, value
network chunking (``value_chunk_size``/``num_chunks``/``num_chunk``/``value_chunk_dim``),
``shifted_budget``, ``group_key`` standardization, ``average_rewards`` and GAE's
``auto_reset_env``, checked against plain references.
"""

from __future__ import annotations

import pytest
import torch

from steersman.objectives.value import GAE, TD0Estimator, TD1Estimator, TDLambdaEstimator, VTrace
from steersman.objectives.value.advantages import standardize_by_group
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import (
    OneHotCategorical,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
)

KINDS = ["td0", "td1", "tdlambda", "gae", "vtrace"]


def _actor() -> ProbabilisticTensorDictSequential:
    torch.manual_seed(0)
    return ProbabilisticTensorDictSequential(
        TensorDictModule(torch.nn.Linear(3, 2), ["obs"], ["logits"]),
        ProbabilisticTensorDictModule(["logits"], ["action"], OneHotCategorical),
    )


def make(kind: str, **kw):
    if kind == "td0":
        return TD0Estimator(gamma=0.9, **kw)
    if kind == "td1":
        return TD1Estimator(gamma=0.9, **kw)
    if kind == "tdlambda":
        return TDLambdaEstimator(gamma=0.9, lmbda=0.8, **kw)
    if kind == "gae":
        return GAE(gamma=0.9, lmbda=0.8, **kw)
    kw.setdefault("value_network", None)
    return VTrace(gamma=0.9, actor_network=_actor(), **kw)


def batch(shape=(4, 6), seed: int = 0, p_done: float = 0.3) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    full = (*shape, 1)
    done = torch.rand(full, generator=g) < p_done
    term = done & (torch.rand(full, generator=g) < 0.5)
    return TensorDict({
        "obs": torch.randn(*shape, 3, generator=g),
        "action": torch.eye(2)[torch.randint(0, 2, shape, generator=g)],
        "action_log_prob": -torch.rand(shape, generator=g),
        "state_value": torch.randn(full, generator=g),
        "task": torch.randint(0, 3, (shape[0], *([1] * (len(shape) - 1))), generator=g).expand(shape).clone(),
        "next": {"obs": torch.randn(*shape, 3, generator=g), "state_value": torch.randn(full, generator=g),
                 "reward": torch.randn(full, generator=g) * 3 + 1, "done": done, "terminated": term,
                 "truncated": done & ~term},
    }, list(shape))


class Critic(torch.nn.Module):
    """A critic that records the batch shapes it is called on and branches on its data
    (``vmap`` cannot run data-dependent Python control flow)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(3, 1)
        self.shapes: list[list[int]] = []

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        self.shapes.append(list(obs.shape[:-1]))
        out = self.lin(obs)
        return out if bool(out.sum() > -1e9) else -out


def critic_module() -> TensorDictModule:
    return TensorDictModule(Critic(), ["obs"], ["state_value"])


@pytest.mark.parametrize("kind", KINDS)
def test_key_keywords_rename_like_set_keys(kind):
    def renamed():
        td = batch().rename_key_("state_value", "v")
        td["next"].rename_key_("state_value", "v")
        return td

    est = make(kind, advantage_key="adv", value_target_key=("out", "vt"), value_key="v")
    assert (est.advantage_key, est.value_target_key, est.value_key) == ("adv", ("out", "vt"), "v")
    td = est(renamed())
    ref = make(kind).set_keys(advantage="adv", value_target=("out", "vt"), value="v")(renamed())
    assert "advantage" not in td.keys() and "value_target" not in td.keys()
    torch.testing.assert_close(td["adv"], ref["adv"])
    torch.testing.assert_close(td["out", "vt"], ref["out", "vt"])


@pytest.mark.parametrize("kind", KINDS)
def test_device_places_the_discount_buffers(kind):
    est = make(kind, device="meta")
    assert est.gamma.device.type == "meta"
    if kind in ("tdlambda", "gae"):
        assert est.lmbda.device.type == "meta"
    # on the data's device the results are those of the float hyper-parameters
    a, b = make(kind, device="cpu")(batch()), make(kind)(batch())
    torch.testing.assert_close(a["value_target"], b["value_target"])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("kw", "dim", "sizes"), [
    ({"value_chunk_size": 3}, 0, [3, 3, 1]),
    ({"num_chunks": 3}, 0, [3, 2, 2]),
    ({"num_chunk": 3}, 0, [3, 2, 2]),
    ({"value_chunk_size": 4, "value_chunk_dim": 1}, 1, [4, 2]),
    ({"num_chunks": 2, "value_chunk_dim": -1}, 1, [3, 3]),
])
def test_chunked_value_calls_equal_one_call(kind, kw, dim, sizes):
    ref = make(kind, value_network=critic_module())(batch((7, 6)))
    est = make(kind, value_network=critic_module(), **kw)
    out = est(batch((7, 6)))
    seen = [s[dim] for s in est.value_network.module.shapes]
    assert seen == sizes * 2  # V(s) then V(s'), each in chunks
    for key in ("advantage", "value_target", "state_value"):
        torch.testing.assert_close(out[key], ref[key])


def test_chunk_keywords_bad_values_raise():
    with pytest.raises(ValueError, match="exclusive"):
        GAE(gamma=0.9, value_chunk_size=2, num_chunks=2)
    with pytest.raises(ValueError, match="alias"):
        GAE(gamma=0.9, num_chunks=2, num_chunk=3)
    with pytest.raises(ValueError, match="num_chunks must be an int >= 1"):
        TD0Estimator(gamma=0.9, num_chunks=0)
    with pytest.raises(ValueError, match="shifted_budget"):
        GAE(gamma=0.9, shifted_budget=0)
    est = GAE(gamma=0.9, value_network=critic_module(), value_chunk_size=2, value_chunk_dim=2)
    with pytest.raises(ValueError, match="value_chunk_dim=2 is out of range"):
        est(batch())


@pytest.mark.parametrize("deactivate_vmap", [True, False])
def test_value_network_is_called_without_vmap(deactivate_vmap):
    # the critic branches on its output: under vmap this raises, called directly it runs
    est = GAE(gamma=0.9, value_network=critic_module(), deactivate_vmap=deactivate_vmap)
    assert est.deactivate_vmap is deactivate_vmap
    out = est(batch())
    assert out["advantage"].shape == (4, 6, 1)
    with pytest.raises(RuntimeError):
        torch.vmap(Critic())(torch.randn(2, 3))


@pytest.mark.parametrize("budget", [1, 3])
def test_shifted_is_exact_whatever_the_budget(budget):
    td = batch((2, 12), p_done=0.5)  # several internal truncations per row
    assert int(td["next", "truncated"].sum()) > 2
    ref = GAE(gamma=0.9, lmbda=0.8, value_network=critic_module())(td.clone())
    out = GAE(gamma=0.9, lmbda=0.8, value_network=critic_module(), shifted=True, shifted_budget=budget)(td.clone())
    torch.testing.assert_close(out["advantage"], ref["advantage"])
    torch.testing.assert_close(out["next", "state_value"], ref["next", "state_value"])


def _loop_standardize(x: torch.Tensor, groups: torch.Tensor, eps: float) -> torch.Tensor:
    out = torch.empty_like(x)
    for g in groups.unique():
        rows = groups == g
        sel = x[rows]
        std = sel.std() if sel.numel() > 1 else torch.tensor(1.0)
        out[rows] = (sel - sel.mean()) / std.clamp_min(eps)
    return out


def test_standardize_by_group_matches_loop():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(9, 5, 1, generator=g)
    groups = torch.tensor([0, 2, 2, 5, 0, 0, 2, 7, 5])
    torch.testing.assert_close(standardize_by_group(x, groups), _loop_standardize(x, groups, 1e-6))
    with pytest.raises(ValueError, match="prefix"):
        standardize_by_group(x, torch.zeros(5, dtype=torch.long))


@pytest.mark.parametrize("kind", ["gae", "vtrace"])
def test_group_key_standardizes_the_advantage_per_group(kind):
    flag = {"gae": "average_gae", "vtrace": "average_adv"}[kind]
    raw = make(kind)(batch())
    out = make(kind, group_key="task", **{flag: True})(batch())
    expected = _loop_standardize(raw["advantage"], raw["task"], 1e-6)
    torch.testing.assert_close(out["advantage"], expected)
    whole = make(kind, **{flag: True})(batch())["advantage"]
    assert not torch.allclose(whole, expected)
    with pytest.raises(KeyError, match="group_key 'task' is missing"):
        make(kind, group_key="task", **{flag: True})(batch().exclude("task"))


@pytest.mark.parametrize("kind", ["td0", "td1", "tdlambda"])
@pytest.mark.parametrize("group_key", [None, "task"])
def test_average_rewards_standardizes_rewards_before_the_target(kind, group_key):
    td = batch()
    r = td["next", "reward"].clone()
    std_r = r.sub(r.mean()).div(r.std()) if group_key is None else _loop_standardize(r, td["task"], 1e-5)
    out = make(kind, average_rewards=True, group_key=group_key)(td)
    torch.testing.assert_close(out["next", "reward"], std_r)  # written back, as in TorchRL
    ref = batch()
    ref["next", "reward"] = std_r
    torch.testing.assert_close(out["value_target"], make(kind)(ref)["value_target"])
    assert not torch.allclose(out["value_target"], make(kind)(batch())["value_target"])


@pytest.mark.parametrize("vectorized", [True, False])
def test_gae_auto_reset_env_bootstraps_truncations_with_the_current_value(vectorized):
    td = batch((3, 10), p_done=0.4)
    trunc = td["next", "truncated"]
    assert trunc.any()
    out = GAE(gamma=0.9, lmbda=0.8, auto_reset_env=True, vectorized=vectorized)(td.clone())
    # the same as bootstrapping from V(s_t) where the "next" state is the reset one
    ref = td.clone()
    ref["next", "state_value"] = torch.where(trunc, td["state_value"], td["next", "state_value"])
    ref = GAE(gamma=0.9, lmbda=0.8, vectorized=vectorized)(ref)
    torch.testing.assert_close(out["advantage"], ref["advantage"])
    plain = GAE(gamma=0.9, lmbda=0.8, vectorized=vectorized)(td.clone())
    assert not torch.allclose(out["advantage"], plain["advantage"])
    with pytest.raises(KeyError, match="truncated"):
        GAE(gamma=0.9, auto_reset_env=True)(td.exclude(("next", "truncated")))
