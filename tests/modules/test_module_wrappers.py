"""Ordinal/OneHotOrdinal (vs a plain loop), VmapModule (vs per-slice calls) and the
Q-value hooks (vs QValueModule on a TensorDict)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from steersman.modules import (
    DistributionalQValueHook,
    DistributionalQValueModule,
    OneHotOrdinal,
    Ordinal,
    QValueHook,
    QValueModule,
    VmapModule,
)
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import TensorDictModule


def _ordinal_probs(scores: list[float]) -> list[float]:
    sig = lambda v: 1 / (1 + math.exp(-v))  # noqa: E731
    logits = [sum(math.log(sig(s)) for s in scores[: k + 1]) + sum(math.log(sig(-s)) for s in scores[k + 1:])
              for k in range(len(scores))]
    z = sum(math.exp(v) for v in logits)
    return [math.exp(v) / z for v in logits]


def test_ordinal_matches_plain_loop():
    torch.manual_seed(0)
    scores = torch.randn(4, 5, dtype=torch.float64)
    d = Ordinal(scores)
    expected = torch.tensor([_ordinal_probs(row) for row in scores.tolist()], dtype=torch.float64)
    torch.testing.assert_close(d.probs, expected)
    sample = d.sample((100,))
    assert sample.shape == (100, 4) and sample.dtype == torch.long and sample.max() < 5
    one_hot = OneHotOrdinal(scores)
    torch.testing.assert_close(one_hot.probs, expected)
    s = one_hot.sample()
    assert s.shape == (4, 5) and torch.equal(s.sum(-1), torch.ones(4, dtype=s.dtype))
    torch.testing.assert_close(one_hot.log_prob(s), d.log_prob(s.argmax(-1)))


@pytest.mark.parametrize("mock", [False, True])
@pytest.mark.parametrize("vmap_dim", [None, 0])
def test_vmap_module_matches_per_slice_calls(mock, vmap_dim):
    torch.manual_seed(0)
    lin = TensorDictModule(nn.Linear(3, 2), in_keys=["x"], out_keys=["y"])
    td = TensorDict({"x": torch.randn(4, 5, 3)}, [4, 5])
    out = VmapModule(lin, vmap_dim=vmap_dim, mock=mock)(td.clone())
    torch.testing.assert_close(out["y"], lin.module(td["x"]))
    assert out.batch_size == (4, 5) and set(out.keys()) == {"x", "y"}
    with pytest.raises(ValueError, match="vmap_dim=3"):
        VmapModule(lin, vmap_dim=3)(td)


@pytest.mark.parametrize("space", ["one_hot", "categorical"])
def test_qvalue_hook_matches_qvalue_module(space):
    torch.manual_seed(0)
    net = nn.Linear(3, 4)
    obs = torch.randn(6, 3)
    values = net(obs)
    ref = QValueModule(space)(TensorDict({"action_value": values}, [6]))
    net.register_forward_hook(QValueHook(space))
    action, out_values, chosen = net(obs)
    torch.testing.assert_close(action, ref["action"])
    torch.testing.assert_close(out_values, values)
    torch.testing.assert_close(chosen, ref["chosen_action_value"])
    greedy = values.argmax(-1)
    assert torch.equal(action.argmax(-1) if space == "one_hot" else action, greedy)


def test_distributional_qvalue_hook_matches_module():
    torch.manual_seed(0)
    support = torch.linspace(-1, 1, 5)
    net = nn.Sequential(nn.Linear(3, 10), nn.Unflatten(-1, (5, 2)), nn.LogSoftmax(-2))
    obs = torch.randn(6, 3)
    values = net(obs)
    ref = DistributionalQValueModule("categorical", support)(TensorDict({"action_value": values}, [6]))
    net.register_forward_hook(DistributionalQValueHook("categorical", support))
    action, out_values = net(obs)
    torch.testing.assert_close(action, ref["action"])
    expected = (values.exp() * support[:, None]).sum(-2).argmax(-1)
    assert torch.equal(action, expected)
