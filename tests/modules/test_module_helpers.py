"""distributions_maps, get_env_transforms_from_module, canonicalize_rnn_subset, the
recurrent matmul precision switches, and add_random_module / LossModule.vmap_randomness."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from steersman.envs import TransformedEnv
from steersman.envs.native import PendulumEnv
from steersman.modules import (
    GRUModule,
    LSTMModule,
    TanhNormal,
    canonicalize_rnn_subset,
    distributions_maps,
    get_env_transforms_from_module,
    get_recurrent_matmul_precision,
    set_recurrent_matmul_precision,
)
from steersman.objectives import SACLoss, add_random_module
from steersman.objectives import utils as objective_utils
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import TensorDictModule, TensorDictSequential
from tests.objectives import cases_sac as sac


def test_distributions_by_name():
    assert distributions_maps["tanhnormal"] is TanhNormal
    assert {"delta", "independentnormal", "onehotcategorical", "maskedcategorical", "ordinal"} <= set(distributions_maps)


def test_env_transforms_for_a_recurrent_policy_make_its_rollout_run():
    policy = TensorDictSequential(
        GRUModule(input_size=3, hidden_size=5, in_key="observation", out_key="features"),
        TensorDictModule(nn.Linear(5, 1), ["features"], ["action"]),
    )
    transforms = get_env_transforms_from_module(policy)
    assert [type(t).__name__ for t in transforms] == ["InitTracker", "TensorDictPrimer"]
    env = TransformedEnv(PendulumEnv(batch_size=[2], seed=0), transforms)
    data = env.rollout(3, policy)
    assert data["is_init"][:, 0].all() and not data["is_init"][:, 1:].any()
    assert data["next", "recurrent_state"].shape[:2] == (2, 3)
    plain = get_env_transforms_from_module(TensorDictModule(nn.Linear(3, 1), ["observation"], ["action"]),
                                           init_key="start")
    assert type(plain).__name__ == "InitTracker" and plain.init_key == "start"


def test_canonicalize_touches_only_the_rnn_entries():
    a = LSTMModule(input_size=3, hidden_size=4, in_key="obs", out_key="h_a")
    b = GRUModule(input_size=3, hidden_size=4, in_key="obs2", out_key="h_b")
    strided = torch.randn(5, 2, 3).transpose(0, 1)
    td = TensorDict({"obs": strided, "obs2": strided.clone().transpose(0, 1).transpose(0, 1), "other": strided}, [2])
    out = canonicalize_rnn_subset(td, [a, b])
    assert out["obs"].is_contiguous() and out["obs2"].is_contiguous() and torch.equal(out["obs"], strided)
    assert not out["other"].is_contiguous() and not td["obs"].is_contiguous()  # untouched; input unchanged
    assert canonicalize_rnn_subset(td, [a], inplace=True) is td and td["obs"].is_contiguous()


def test_recurrent_matmul_precision_resolution(monkeypatch):
    try:
        for mode in ("ieee", "tf32", "tf32x3"):
            set_recurrent_matmul_precision(mode)
            assert get_recurrent_matmul_precision() == mode
        set_recurrent_matmul_precision(None)
        previous = torch.get_float32_matmul_precision()
        try:
            torch.set_float32_matmul_precision("highest")
            assert get_recurrent_matmul_precision() == "ieee"
            if not torch.cuda.is_available():  # the presets fall back to ieee without tensor cores
                torch.set_float32_matmul_precision("medium")
                assert get_recurrent_matmul_precision() == "ieee"
        finally:
            torch.set_float32_matmul_precision(previous)
        with pytest.raises(ValueError, match="'fp16' is not a recurrent matmul precision"):
            set_recurrent_matmul_precision("fp16")
    finally:
        set_recurrent_matmul_precision(None)


class _Noise(nn.Module):
    def forward(self, x):
        return x + 0.1 * torch.randn_like(x)


def test_random_critics_are_vmapped_with_different_draws(monkeypatch):
    monkeypatch.setattr(objective_utils, "RANDOM_MODULE_LIST", objective_utils.RANDOM_MODULE_LIST)

    class Critic(sac.Critic):
        def __init__(self, layer):
            super().__init__()
            self.net.insert(1, layer)

    def loss_with(layer):
        return SACLoss(sac.actor(), TensorDictModule(Critic(layer), ["observation", "action"], ["state_action_value"]),
                       target_entropy=-2.0)

    batch = sac.continuous_batch(None, (8,))
    assert loss_with(nn.Dropout(0.5)).vmap_randomness == "different"
    assert torch.isfinite(loss_with(nn.Dropout(0.5))(batch.clone())["loss_qvalue"])
    assert loss_with(_Noise()).vmap_randomness == "error"  # unknown: vmap refuses the draw
    with pytest.raises(RuntimeError, match="randomness"):
        loss_with(_Noise())(batch.clone())
    add_random_module(_Noise)
    assert loss_with(_Noise()).vmap_randomness == "different"
    assert torch.isfinite(loss_with(_Noise())(batch.clone())["loss_qvalue"])
    with pytest.raises(TypeError, match="nn.Module subclass"):
        add_random_module(_Noise())
    loss = loss_with(nn.Identity())
    loss.vmap_randomness = "same"
    assert loss.vmap_randomness == "same"


@pytest.mark.parametrize("cls", [LSTMModule, GRUModule])
def test_recurrent_backend_options(cls):
    """TorchRL's recurrent-mode keywords: same values for pad/scan/auto, recompute='full'
    gives the same values and gradients, bad combinations are refused."""
    torch.manual_seed(0)
    base = cls(input_size=3, hidden_size=4, in_key="obs", out_key="h", default_recurrent_mode=True)
    rnn = base.lstm if cls is LSTMModule else base.gru
    key = "lstm" if cls is LSTMModule else "gru"
    is_init = torch.zeros(2, 5, 1, dtype=torch.bool)
    is_init[:, 0] = is_init[0, 2] = True
    td = TensorDict({"obs": torch.randn(2, 5, 3), "is_init": is_init}, [2, 5])
    ref = base(td.clone())["h"]
    ref.sum().backward()
    grads = [p.grad.clone() for p in rnn.parameters()]
    for backend, recompute in (("scan", "none"), ("auto", "full")):
        rnn.zero_grad()
        other = cls(**{key: rnn}, in_keys=base.in_keys, out_keys=base.out_keys, default_recurrent_mode=True,
                    recurrent_backend=backend, recurrent_recompute=recompute, recurrent_matmul_precision="tf32x3")
        out = other(td.clone())["h"]
        torch.testing.assert_close(out, ref)
        out.sum().backward()
        for g, p in zip(grads, rnn.parameters()):
            torch.testing.assert_close(p.grad, g)
        twin = other.set_recurrent_mode(False)
        assert twin.recurrent_recompute == recompute and twin.recurrent_matmul_precision == "tf32x3"
    with pytest.raises(ValueError, match="triton"):
        cls(input_size=3, hidden_size=4, in_key="obs", out_key="h", recurrent_backend="triton")
    with pytest.raises(ValueError, match="'scan' or 'auto'"):
        cls(input_size=3, hidden_size=4, in_key="obs", out_key="h", recurrent_recompute="full")
    with pytest.raises(ValueError, match="recurrent_matmul_precision"):
        cls(input_size=3, hidden_size=4, in_key="obs", out_key="h", recurrent_matmul_precision="fp8")
