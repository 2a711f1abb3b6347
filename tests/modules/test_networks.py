"""MLP, ConvNet and dueling networks: layer layout, shapes (lazy, tuple outputs, extra
batch dims) and bad arguments."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from steersman.modules import MLP, ConvNet, DuelingCnnDQNet, DuelingMlpDQNet, SquashDims


def _linear_sizes(mlp: nn.Module) -> list[tuple[int, int]]:
    return [(m.in_features, m.out_features) for m in mlp if isinstance(m, nn.Linear)]


@pytest.mark.parametrize(
    ("kwargs", "sizes"),
    [
        ({"in_features": 3, "out_features": 2}, [(3, 2)]),
        ({"in_features": 3, "out_features": 2, "depth": 2}, [(3, 32), (32, 32), (32, 2)]),
        ({"in_features": 3, "out_features": 2, "num_cells": 8, "depth": 1}, [(3, 8), (8, 2)]),
        ({"in_features": 3, "out_features": 2, "num_cells": [8, 16]}, [(3, 8), (8, 16), (16, 2)]),
        ({"in_features": 3, "out_features": (2, 3), "num_cells": [4]}, [(3, 4), (4, 6)]),
    ],
)
def test_mlp_layer_sizes(kwargs, sizes):
    assert _linear_sizes(MLP(**kwargs)) == sizes


def test_mlp_layer_order_and_options():
    mlp = MLP(in_features=3, out_features=2, num_cells=[4, 5], dropout=0.5, norm_class=nn.LayerNorm,
              norm_kwargs=[{"normalized_shape": 4}, {"normalized_shape": 5}],
              activation_class=nn.LeakyReLU, activation_kwargs={"negative_slope": 0.2},
              bias_last_layer=False)
    kinds = [type(m) for m in mlp]
    assert kinds == [nn.Linear, nn.Dropout, nn.LayerNorm, nn.LeakyReLU] * 2 + [nn.Linear]
    assert mlp[3].negative_slope == 0.2 and mlp[-1].bias is None and mlp[0].bias is not None
    activated = MLP(in_features=3, out_features=2, num_cells=[4], activate_last_layer=True)
    assert [type(m) for m in activated] == [nn.Linear, nn.Tanh, nn.Linear, nn.Tanh]


@pytest.mark.parametrize("batch", [(), (5,), (2, 3, 4)])
@pytest.mark.parametrize("out", [2, (2, 3), torch.Size([1, 2, 2])])
@pytest.mark.parametrize("lazy", [False, True])
def test_mlp_shapes(batch, out, lazy):
    mlp = MLP(in_features=None if lazy else 6, out_features=out, num_cells=[8])
    y = mlp(torch.randn(*batch, 6))
    tail = (out,) if isinstance(out, int) else tuple(out)
    assert y.shape == (*batch, *tail)
    assert isinstance(mlp[0], nn.Linear) and mlp[0].in_features == 6  # lazy layer materialized


def test_mlp_concatenates_inputs_and_matches_manual_computation():
    torch.manual_seed(0)
    mlp = MLP(in_features=5, out_features=1, num_cells=[4], activation_class=nn.ReLU)
    a, b = torch.randn(7, 3), torch.randn(7, 2)
    x = torch.cat([a, b], -1)
    expected = mlp[2](torch.relu(mlp[0](x)))
    torch.testing.assert_close(mlp(a, b), expected)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"in_features": 3}, "out_features"),
        ({"in_features": 3, "out_features": 2, "num_cells": 8}, "depth"),
        ({"in_features": 3, "out_features": 2, "num_cells": [8, 8], "depth": 3}, "depth=3"),
        ({"out_features": 2, "layer_class": nn.Bilinear}, "lazy"),
        ({"in_features": 3, "out_features": 2, "num_cells": [4, 4], "activation_kwargs": [{}]}, "2 layers"),
    ],
)
def test_mlp_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MLP(**kwargs)


@pytest.mark.parametrize("batch", [(), (4,), (2, 3)])
@pytest.mark.parametrize("lazy", [False, True])
def test_convnet_shapes_and_extra_batch_dims(batch, lazy):
    torch.manual_seed(0)
    net = ConvNet(in_features=None if lazy else 3, num_cells=[4, 8], kernel_sizes=3, strides=[2, 1])
    x = torch.randn(*batch, 3, 12, 12)
    y = net(x)
    assert y.shape == (*batch, 8 * 3 * 3)  # 12 -> 5 (k3 s2) -> 3 (k3 s1)
    if batch:  # the result per element does not depend on how the batch is laid out
        flat = net(x.reshape(-1, 3, 12, 12)).reshape(*batch, -1)
        torch.testing.assert_close(y, flat)


def test_convnet_layers_and_options():
    net = ConvNet(in_features=3, num_cells=[4, 4], kernel_sizes=[3, 1], paddings=[1, 0],
                  norm_class=nn.BatchNorm2d, norm_kwargs=[{"num_features": 4}] * 2,
                  bias_last_layer=False, aggregator_class=None)
    kinds = [type(m) for m in net]
    assert kinds == [nn.Conv2d, nn.ELU, nn.BatchNorm2d] * 2
    assert net[0].padding == (1, 1) and net[3].padding == (0, 0) and net[3].kernel_size == (1, 1) and net[3].bias is None
    assert net(torch.randn(2, 3, 5, 5)).shape == (2, 4, 5, 5)  # no aggregator: feature maps
    squeezed = ConvNet(in_features=3, num_cells=[4], kernel_sizes=5, aggregator_class=None,
                       squeeze_output=True)
    assert squeezed(torch.randn(2, 3, 5, 5)).shape == (2, 4)
    assert SquashDims(2)(torch.zeros(2, 3, 4, 5)).shape == (2, 3, 20)


def test_convnet_bad_arguments():
    with pytest.raises(ValueError, match="depth"):
        ConvNet(num_cells=[4, 4], kernel_sizes=[3])
    with pytest.raises(ValueError, match="C, H, W"):
        ConvNet(num_cells=[4])(torch.randn(3, 3))


@pytest.mark.parametrize("batch", [(), (4,), (2, 3)])
def test_dueling_mlp(batch):
    torch.manual_seed(0)
    net = DuelingMlpDQNet(3, mlp_kwargs_feature={"num_cells": [8], "out_features": 8},
                          mlp_kwargs_output={"num_cells": 8})
    x = torch.randn(*batch, 5)
    q = net(x)
    assert q.shape == (*batch, 3)
    feats = net.features(x)
    adv, value = net.advantage(feats), net.value(feats)
    torch.testing.assert_close(q, value + adv - adv.mean(-1, keepdim=True))
    # the advantage's mean is removed: Q averages to V
    torch.testing.assert_close(q.mean(-1, keepdim=True), value)
    assert all(bool((m.bias == 0).all()) for m in net.advantage if isinstance(m, nn.Linear))


def test_dueling_cnn():
    torch.manual_seed(0)
    net = DuelingCnnDQNet(4, cnn_kwargs={"num_cells": [4], "kernel_sizes": 3, "strides": 1},
                          mlp_kwargs={"num_cells": 8})
    x = torch.randn(2, 5, 3, 6, 6)  # two batch dims
    q = net(x)
    assert q.shape == (2, 5, 4)
    value = net.value(net.features(x))
    torch.testing.assert_close(q.mean(-1, keepdim=True), value)


@pytest.mark.parametrize("batch", [(), (2,), (2, 3)])
@pytest.mark.parametrize("lazy", [False, True])
def test_conv3d_net_matches_manual_convolutions(batch, lazy):
    from steersman.modules import Conv3dNet

    torch.manual_seed(0)
    net = Conv3dNet(in_features=None if lazy else 2, num_cells=[3, 4], kernel_sizes=[3, 2], strides=[1, 2])
    x = torch.randn(*batch, 2, 5, 6, 6)
    y = net(x)
    c1, c2 = [m for m in net if isinstance(m, nn.Conv3d)]
    flat = x.reshape(-1, 2, 5, 6, 6)
    ref = nn.functional.elu(c2(nn.functional.elu(c1(flat))))  # [N, 4, 1, 2, 2]
    torch.testing.assert_close(y, ref.flatten(1).reshape(*batch, 16))
    with pytest.raises(ValueError, match=r"\[\*batch, C, D, H, W\]"):
        net(torch.randn(2, 6, 6))
    pooled = Conv3dNet(num_cells=[4], kernel_sizes=1, aggregator_class=nn.AdaptiveAvgPool3d,
                       aggregator_kwargs={"output_size": 1}, squeeze_output=True)
    assert pooled(torch.randn(3, 2, 4, 4, 4)).shape == (3, 4)
