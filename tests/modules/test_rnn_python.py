"""Python LSTM/GRU/LSTMCell/GRUCell against torch.nn's kernels with the same weights, and
under torch.vmap."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from steersman.modules import GRU, LSTM, GRUCell, LSTMCell


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize(("num_layers", "bias", "batch_first"), [(1, True, True), (2, False, True), (2, True, False)])
@pytest.mark.parametrize("with_state", [False, True])
def test_python_rnn_matches_torch(kind, num_layers, bias, batch_first, with_state):
    torch.manual_seed(0)
    ours_cls, ref_cls = (LSTM, nn.LSTM) if kind == "lstm" else (GRU, nn.GRU)
    ours = ours_cls(3, 5, num_layers=num_layers, bias=bias, batch_first=batch_first)
    ref = ref_cls(3, 5, num_layers=num_layers, bias=bias, batch_first=batch_first)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(4, 6, 3)
    state = None
    if with_state:
        h = torch.randn(num_layers, 4 if batch_first else 6, 5)
        state = (h, torch.randn_like(h)) if kind == "lstm" else h
    out, hn = ours(x, state)
    ref_out, ref_hn = ref(x, state)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(hn, ref_hn)
    # unbatched input [T, F]
    out1, _ = ours(x[0])
    torch.testing.assert_close(out1, ref(x[0])[0])


def test_python_rnn_defaults_and_unsupported_options():
    assert LSTM(2, 3).batch_first and GRU(2, 3).batch_first  # TorchRL's default
    with pytest.raises(NotImplementedError, match="bidirectional"):
        LSTM(2, 3, bidirectional=True)
    with pytest.raises(NotImplementedError, match="proj_size"):
        LSTM(2, 3, proj_size=1)
    with pytest.raises(NotImplementedError, match="bidirectional"):
        GRU(2, 3, bidirectional=True)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_python_cells_match_torch(kind):
    torch.manual_seed(0)
    ours, ref = (LSTMCell(3, 4), nn.LSTMCell(3, 4)) if kind == "lstm" else (GRUCell(3, 4), nn.GRUCell(3, 4))
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(5, 3)
    torch.testing.assert_close(ours(x), ref(x))
    h = torch.randn(5, 4)
    state = (h, torch.randn(5, 4)) if kind == "lstm" else h
    torch.testing.assert_close(ours(x, state), ref(x, state))
    with pytest.raises(ValueError, match="expected 3"):
        ours(torch.randn(5, 2))


def test_python_rnn_runs_under_vmap():
    torch.manual_seed(0)
    lstm, cell = LSTM(3, 4), GRUCell(3, 4)
    x = torch.randn(7, 2, 5, 3)  # vmapped over 7 independent batches
    out = torch.vmap(lambda xi: lstm(xi)[0])(x)
    torch.testing.assert_close(out, torch.stack([lstm(xi)[0] for xi in x]))
    y = torch.vmap(cell)(x[:, 0])
    torch.testing.assert_close(y, torch.stack([cell(xi) for xi in x[:, 0]]))
