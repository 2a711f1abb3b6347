"""``LSTM``, ``GRU``, ``LSTMCell`` and ``GRUCell`` written with plain tensor ops.

They take the arguments, parameters (``weight_ih_l0``...) and ``state_dict`` of their
``torch.nn`` namesakes and compute the same thing, but as python loops over time and
layers: they run under ``torch.vmap`` and ``torch.compile`` (the cuDNN kernels do not) and
can be changed by subclassing. As in TorchRL, ``batch_first`` defaults to ``True`` and
bidirectional LSTM/GRU and LSTM projections are not supported.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

__all__ = ["LSTMCell", "GRUCell", "LSTM", "GRU"]


def _lstm_step(x: Tensor, h: Tensor, c: Tensor, w_ih: Tensor, w_hh: Tensor,
               b_ih: Tensor | None, b_hh: Tensor | None) -> tuple[Tensor, Tensor]:
    gates = F.linear(x, w_ih, b_ih) + F.linear(h, w_hh, b_hh)
    i, f, g, o = gates.chunk(4, -1)  # torch's gate order
    c = f.sigmoid() * c + i.sigmoid() * g.tanh()
    return o.sigmoid() * c.tanh(), c


def _gru_step(x: Tensor, h: Tensor, w_ih: Tensor, w_hh: Tensor,
              b_ih: Tensor | None, b_hh: Tensor | None) -> Tensor:
    xr, xz, xn = F.linear(x, w_ih, b_ih).chunk(3, -1)
    hr, hz, hn = F.linear(h, w_hh, b_hh).chunk(3, -1)
    r, z = (xr + hr).sigmoid(), (xz + hz).sigmoid()
    n = (xn + r * hn).tanh()
    return (1 - z) * n + z * h


class LSTMCell(nn.RNNCellBase):
    """One LSTM step, like ``nn.LSTMCell`` (same parameters), in plain tensor ops.

    Shapes: input ``[*batch, input_size]`` (``[input_size]`` unbatched), ``hx`` a pair
    ``(h, c)`` of ``[*batch, hidden_size]`` (zeros when ``None``) -> ``(h', c')``.

    Example:
        >>> import torch
        >>> cell = LSTMCell(3, 4)
        >>> h, c = cell(torch.randn(2, 3))
        >>> h.shape, c.shape
        (torch.Size([2, 4]), torch.Size([2, 4]))
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device: Any = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=4, device=device, dtype=dtype)

    def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        if input.shape[-1] != self.input_size:
            raise ValueError(f"LSTMCell: input has {input.shape[-1]} features, expected {self.input_size}")
        if hx is None:
            zeros = input.new_zeros(*input.shape[:-1], self.hidden_size)
            hx = (zeros, zeros)
        return _lstm_step(input, hx[0], hx[1], self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)


class GRUCell(nn.RNNCellBase):
    """One GRU step, like ``nn.GRUCell`` (same parameters), in plain tensor ops.

    Shapes: input ``[*batch, input_size]``, ``hx`` ``[*batch, hidden_size]`` (zeros when
    ``None``) -> ``[*batch, hidden_size]``.

    Example:
        >>> import torch
        >>> GRUCell(3, 4)(torch.randn(2, 3)).shape
        torch.Size([2, 4])
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device: Any = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=3, device=device, dtype=dtype)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        if input.shape[-1] != self.input_size:
            raise ValueError(f"GRUCell: input has {input.shape[-1]} features, expected {self.input_size}")
        if hx is None:
            hx = input.new_zeros(*input.shape[:-1], self.hidden_size)
        return _gru_step(input, hx, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)


def _check_unsupported(name: str, bidirectional: bool, proj_size: int = 0) -> None:
    if bidirectional:
        raise NotImplementedError(f"{name}: bidirectional layers are not supported; use torch.nn.{name}")
    if proj_size:
        raise NotImplementedError(f"{name}: proj_size is not supported; use torch.nn.LSTM")


def _time_major(rnn: nn.RNNBase, input: Tensor) -> tuple[Tensor, bool]:
    """``input`` as ``[T, B, F]`` and whether it was unbatched (``[T, F]``)."""
    if input.ndim == 2:
        return input.unsqueeze(1), True
    if input.ndim != 3:
        raise ValueError(f"{type(rnn).__name__}: input must be [B, T, F], [T, B, F] or [T, F], got {list(input.shape)}")
    return (input.transpose(0, 1) if rnn.batch_first else input), False


def _layer_params(rnn: nn.RNNBase, k: int) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    b_ih = getattr(rnn, f"bias_ih_l{k}") if rnn.bias else None
    b_hh = getattr(rnn, f"bias_hh_l{k}") if rnn.bias else None
    return getattr(rnn, f"weight_ih_l{k}"), getattr(rnn, f"weight_hh_l{k}"), b_ih, b_hh


def _initial(h: Tensor | None, rnn: nn.RNNBase, x: Tensor, unbatched: bool) -> Tensor:
    if h is None:
        return x.new_zeros(rnn.num_layers, x.shape[1], rnn.hidden_size)
    return h.unsqueeze(1) if unbatched else h


def _outputs(rnn: nn.RNNBase, out: Tensor, unbatched: bool) -> Tensor:
    if unbatched:
        return out.squeeze(1)
    return out.transpose(0, 1) if rnn.batch_first else out


class LSTM(nn.LSTM):
    """A multi-layer LSTM with ``nn.LSTM``'s arguments and parameters, in plain tensor ops.

    Args:
        input_size, hidden_size, num_layers, bias, dropout, device, dtype: as ``nn.LSTM``.
        batch_first: inputs ``[B, T, F]`` (default ``True``, as TorchRL) or ``[T, B, F]``.
        bidirectional, proj_size: must stay off (``NotImplementedError``).
        use_scan: accepted for TorchRL compatibility; the loop is always a python loop.

    ``forward(input, (h0, c0))`` returns ``output, (h_n, c_n)``; ``h0``/``c0`` are
    ``[num_layers, B, hidden_size]`` (zeros when not given).

    Example:
        >>> import torch
        >>> lstm = LSTM(3, 4, num_layers=2)
        >>> out, (h, c) = lstm(torch.randn(5, 7, 3))
        >>> out.shape, h.shape
        (torch.Size([5, 7, 4]), torch.Size([2, 5, 4]))
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, batch_first: bool = True,
                 bias: bool = True, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 device: Any = None, dtype: torch.dtype | None = None, use_scan: bool = False) -> None:
        _check_unsupported("LSTM", bidirectional, proj_size)
        super().__init__(input_size, hidden_size, num_layers, bias=bias, batch_first=batch_first,
                         dropout=dropout, device=device, dtype=dtype)

    def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        x, unbatched = _time_major(self, input)
        h0 = _initial(None if hx is None else hx[0], self, x, unbatched)
        c0 = _initial(None if hx is None else hx[1], self, x, unbatched)
        hs, cs = [], []
        for k in range(self.num_layers):
            params = _layer_params(self, k)
            h, c, steps = h0[k], c0[k], []
            for t in range(x.shape[0]):
                h, c = _lstm_step(x[t], h, c, *params)
                steps.append(h)
            x = torch.stack(steps)
            if self.dropout and self.training and k < self.num_layers - 1:
                x = F.dropout(x, self.dropout, training=True)
            hs.append(h)
            cs.append(c)
        h_n, c_n = torch.stack(hs), torch.stack(cs)
        if unbatched:
            h_n, c_n = h_n.squeeze(1), c_n.squeeze(1)
        return _outputs(self, x, unbatched), (h_n, c_n)


class GRU(nn.GRU):
    """A multi-layer GRU with ``nn.GRU``'s arguments and parameters, in plain tensor ops.

    Args: as :class:`LSTM` (no ``proj_size``).

    ``forward(input, h0)`` returns ``output, h_n`` with ``h0``/``h_n``
    ``[num_layers, B, hidden_size]``.

    Example:
        >>> import torch
        >>> out, h = GRU(3, 4)(torch.randn(5, 7, 3))
        >>> out.shape, h.shape
        (torch.Size([5, 7, 4]), torch.Size([1, 5, 4]))
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = True, dropout: float = 0.0, bidirectional: bool = False,
                 device: Any = None, dtype: torch.dtype | None = None, use_scan: bool = False) -> None:
        _check_unsupported("GRU", bidirectional)
        super().__init__(input_size, hidden_size, num_layers, bias=bias, batch_first=batch_first,
                         dropout=dropout, device=device, dtype=dtype)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        x, unbatched = _time_major(self, input)
        h0 = _initial(hx, self, x, unbatched)
        hs = []
        for k in range(self.num_layers):
            params = _layer_params(self, k)
            h, steps = h0[k], []
            for t in range(x.shape[0]):
                h = _gru_step(x[t], h, *params)
                steps.append(h)
            x = torch.stack(steps)
            if self.dropout and self.training and k < self.num_layers - 1:
                x = F.dropout(x, self.dropout, training=True)
            hs.append(h)
        h_n = torch.stack(hs)
        return _outputs(self, x, unbatched), (h_n.squeeze(1) if unbatched else h_n)
