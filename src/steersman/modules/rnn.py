"""Recurrent policies: ``LSTMModule`` and ``GRUModule`` keep their state in the TensorDict.

A recurrent module reads an input and its state (``"recurrent_state_h"``/``"_c"`` for an
LSTM, ``"recurrent_state"`` for a GRU) and writes an output and the next state under
``"next"``, so ``step_mdp`` carries the state to the following step. Where ``is_init`` is
True (a new trajectory starts; the ``InitTracker`` transform writes it), the state read is
ignored and a zero state is used instead.

Two modes:

- **step mode** (the default, used while collecting): every element of the batch is one
  step; batch ``[*B]``.
- **recurrent mode** (used in losses): the last batch dim is time, ``[*B, T]``; the whole
  sequence runs in one call of the underlying ``nn.LSTM``/``nn.GRU``. The state is read
  at ``t = 0`` only; a trajectory that starts inside the sequence (``is_init`` True at
  ``t > 0``) starts again from zeros. Such sequences are cut into segments, padded and
  packed, so the result equals running the steps one by one.

Switch with the :class:`set_recurrent_mode` context (or decorator), the
``default_recurrent_mode`` constructor argument, or :meth:`LSTMModule.set_recurrent_mode`,
which returns a twin module in the other mode sharing the parameters.

In recurrent mode, the ``("next", state)`` outputs hold, at the last step of each segment,
the state after that step, and zeros at the other steps (as in TorchRL): ``nn.LSTM``
returns only final states. Do not read them as per-step states.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
import torch.utils.checkpoint
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..data import Composite, Unbounded
from ..tensordict.nn import TensorDictModuleBase

__all__ = ["LSTMModule", "GRUModule", "set_recurrent_mode", "recurrent_mode"]

F = TypeVar("F", bound=Callable[..., Any])

# process-wide, like the interaction type; None: each module uses its default
_MODE: list[bool | None] = [None]


def recurrent_mode() -> bool | None:
    """The mode set by :class:`set_recurrent_mode`, or ``None`` outside of one.

    Example:
        >>> print(recurrent_mode())
        None
        >>> with set_recurrent_mode(True):
        ...     recurrent_mode()
        True
    """
    return _MODE[0]


def _as_mode(mode: Any) -> bool | None:
    if mode is None or isinstance(mode, bool):
        return mode
    if isinstance(mode, str) and mode.lower() in ("recurrent", "sequential"):
        return mode.lower() == "recurrent"
    raise ValueError(f"recurrent mode must be a bool, None, 'recurrent' or 'sequential'; got {mode!r}")


class set_recurrent_mode:
    """Sets the mode of every recurrent module inside a block (or a decorated function).

    Args:
        mode: ``True`` or ``"recurrent"`` (time batches), ``False`` or ``"sequential"``
            (single steps), ``None`` (each module's ``default_recurrent_mode``).

    The value is process-wide; blocks nest and leaving one restores the previous value.

    Example:
        >>> with set_recurrent_mode("recurrent"):
        ...     recurrent_mode()
        True
        >>> @set_recurrent_mode(False)
        ... def collect():
        ...     return recurrent_mode()
        >>> collect()
        False
    """

    def __init__(self, mode: bool | str | None = True) -> None:
        self.mode = _as_mode(mode)
        self._prev: list[bool | None] = []

    def __enter__(self) -> set_recurrent_mode:
        self._prev.append(_MODE[0])
        _MODE[0] = self.mode
        return self

    def __exit__(self, *exc: Any) -> None:
        _MODE[0] = self._prev.pop()

    def __call__(self, func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with set_recurrent_mode(self.mode):
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


def _as_key_list(keys: Any) -> list:
    return [keys] if isinstance(keys, (str, tuple)) else list(keys)


class _RecurrentModule(TensorDictModuleBase):
    """What LSTMModule and GRUModule share: keys, modes, segmenting, primers."""

    _rnn_name: str  # attribute holding the torch module: "lstm" or "gru"
    _default_state_keys: list[str]

    def __init__(
        self,
        rnn: nn.RNNBase,
        in_key: Any,
        in_keys: Any,
        out_key: Any,
        out_keys: Any,
        default_recurrent_mode: bool | None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if not rnn.batch_first:
            raise ValueError(f"{name} needs an RNN with batch_first=True")
        if rnn.bidirectional:
            raise ValueError(
                f"{name} does not support bidirectional RNNs: a policy's state runs forward in time"
            )
        n = len(self._default_state_keys)
        if (in_key is None) == (in_keys is None):
            raise ValueError(f"{name}: give exactly one of in_key and in_keys")
        if (out_key is None) == (out_keys is None):
            raise ValueError(f"{name}: give exactly one of out_key and out_keys")
        if in_key is not None:
            in_keys = [in_key, *self._default_state_keys]
        if out_key is not None:
            out_keys = [out_key, *[("next", k) for k in self._default_state_keys]]
        in_keys, out_keys = _as_key_list(in_keys), _as_key_list(out_keys)
        if len(in_keys) == n + 1:
            in_keys = [*in_keys, "is_init"]
        if len(in_keys) != n + 2:
            raise ValueError(
                f"{name} expects in_keys [input, {n} state key(s)] (optionally followed by the "
                f"is_init key); got {in_keys}"
            )
        if len(out_keys) != n + 1:
            raise ValueError(f"{name} expects out_keys [output, {n} next-state key(s)]; got {out_keys}")
        setattr(self, self._rnn_name, rnn)
        self._options: dict[str, Any] = {}
        self.in_keys = in_keys
        self.out_keys = out_keys
        self._default_recurrent_mode = bool(default_recurrent_mode)
        sizes = [rnn.hidden_size] * n
        if getattr(rnn, "proj_size", 0):
            sizes[0] = rnn.proj_size  # an LSTM's h has the projected size, its c does not
        self._state_sizes = sizes

    # -- modes ----------------------------------------------------------------------
    @property
    def _rnn(self) -> nn.RNNBase:
        return getattr(self, self._rnn_name)

    @property
    def recurrent_mode(self) -> bool:
        """True if the module processes time batches: the context's mode, else the default."""
        mode = _MODE[0]
        return self._default_recurrent_mode if mode is None else mode

    def set_recurrent_mode(self, mode: bool = True) -> _RecurrentModule:
        """A twin module whose default mode is ``mode``, sharing this module's parameters.

        Example:
            >>> lstm = LSTMModule(input_size=3, hidden_size=4, in_key="obs", out_key="h")
            >>> twin = lstm.set_recurrent_mode(True)
            >>> twin.recurrent_mode, lstm.recurrent_mode, twin.lstm is lstm.lstm
            (True, False, True)
        """
        return type(self)(
            **{self._rnn_name: self._rnn},
            in_keys=self.in_keys,
            out_keys=self.out_keys,
            default_recurrent_mode=mode,
            **self._options,
        )

    def _set_options(self, backend: str, compute_dtype: Any, recompute: str, precision: str) -> None:
        """TorchRL's recurrent-mode options (see :class:`LSTMModule`), checked and kept."""
        name = type(self).__name__
        if backend not in ("auto", "pad", "scan", "triton"):
            raise ValueError(f"{name}: recurrent_backend must be 'auto', 'pad', 'scan' or 'triton', got {backend!r}")
        if backend == "triton":
            raise ValueError(
                f"{name}: recurrent_backend='triton' (TorchRL's prototype CUDA kernels) is not built here; "
                "'pad', 'scan' and 'auto' give the same values"
            )
        if recompute not in ("none", "full"):
            raise ValueError(f"{name}: recurrent_recompute must be 'none' or 'full', got {recompute!r}")
        if recompute == "full" and backend == "pad":
            raise ValueError(
                f"{name}: recurrent_recompute='full' needs recurrent_backend='scan' or 'auto' (the 'pad' "
                "backend's cuDNN kernels keep their own backward buffers), as in TorchRL"
            )
        if not isinstance(compute_dtype, torch.dtype):
            raise TypeError(f"{name}: recurrent_compute_dtype must be a torch.dtype, got {compute_dtype!r}")
        from .rnn_precision import _CONCRETE, _PRESETS  # noqa: PLC0415 (a sibling; kept out of import time)

        if precision not in ("auto", *_CONCRETE, *_PRESETS):
            raise ValueError(f"{name}: recurrent_matmul_precision must be one of "
                             f"{['auto', *_CONCRETE, *_PRESETS]}, got {precision!r}")
        self._options = {"recurrent_backend": backend, "recurrent_compute_dtype": compute_dtype,
                         "recurrent_recompute": recompute, "recurrent_matmul_precision": precision}
        self.recurrent_backend, self.recurrent_compute_dtype = backend, compute_dtype
        self.recurrent_recompute, self.recurrent_matmul_precision = recompute, precision

    # -- specs for the environment -------------------------------------------------
    def recurrent_state_specs(self) -> Composite:
        """Specs of the state entries: ``Unbounded([num_layers, hidden])`` each.

        Example:
            >>> gru = GRUModule(input_size=3, hidden_size=8, num_layers=2, in_key="obs", out_key="h")
            >>> gru.recurrent_state_specs()["recurrent_state"].shape
            torch.Size([2, 8])
        """
        param = next(self._rnn.parameters())
        layers = self._rnn.num_layers
        return Composite(
            {
                key: Unbounded(shape=(layers, size), device=param.device, dtype=param.dtype)
                for key, size in zip(self.in_keys[1:-1], self._state_sizes)
            }
        )

    def make_tensordict_primer(self) -> Any:
        """A ``TensorDictPrimer`` transform that adds zero states to the env's resets.

        Needs the next-state keys to be ``("next", <state in_key>)``. The transform lives
        in ``steersman.envs.transforms``; :meth:`recurrent_state_specs` gives the specs
        without it.
        """
        for key_in, key_out in zip(self.in_keys[1:-1], self.out_keys[1:]):
            key_in = (key_in,) if isinstance(key_in, str) else tuple(key_in)
            key_out = (key_out,) if isinstance(key_out, str) else tuple(key_out)
            if key_out != ("next", *key_in):
                raise RuntimeError(
                    f"make_tensordict_primer needs out_keys named ('next', <state in_key>); got "
                    f"in_keys={self.in_keys} and out_keys={self.out_keys}"
                )
        try:
            from ..envs.transforms import TensorDictPrimer  # noqa: PLC0415 (same layer, lazy)
        except ImportError as err:
            raise ImportError(
                "make_tensordict_primer needs steersman.envs.transforms.TensorDictPrimer, which "
                "is not available; use recurrent_state_specs() to describe the state entries"
            ) from err
        return TensorDictPrimer(dict(self.recurrent_state_specs().items()), expand_specs=True)

    # -- forward ---------------------------------------------------------------------
    def _read(self, tensordict: Any) -> tuple[Tensor, list[Tensor | None], Tensor]:
        x = tensordict.get(self.in_keys[0], None)
        if x is None:
            raise KeyError(
                f"{type(self).__name__} is missing its input {self.in_keys[0]!r}; the TensorDict "
                f"holds {list(tensordict.keys(True, True))}"
            )
        is_init = tensordict.get(self.in_keys[-1], None)
        if is_init is None:
            raise KeyError(
                f"{type(self).__name__} needs the key {self.in_keys[-1]!r} (True where a trajectory "
                "starts) to reset its state; add the InitTracker transform to the env"
            )
        states = [tensordict.get(k, None) for k in self.in_keys[1:-1]]
        return x, states, is_init

    def _state_args(self, states: list[Tensor]) -> Any:
        return tuple(states) if len(states) > 1 else states[0]

    def _state_list(self, out: Any) -> list[Tensor]:
        return list(out) if isinstance(out, tuple) else [out]

    def _initial(self, states: list[Tensor | None], like: Tensor, rows: Sequence[int]) -> list[Tensor]:
        """States ``[*rows, layers, size]``: the ones read (reshaped) or zeros where absent."""
        layers = self._rnn.num_layers
        out = []
        for s, size in zip(states, self._state_sizes):
            if s is None:
                out.append(like.new_zeros(*rows, layers, size))
                continue
            if s.shape[-2:] != (layers, size) or s.numel() != math.prod(rows) * layers * size:
                raise ValueError(
                    f"{type(self).__name__}: a recurrent state must have shape "
                    f"[*batch, {layers}, {size}] with batch {list(rows)}; got {list(s.shape)}"
                )
            out.append(s.reshape(*rows, layers, size))
        return out

    def forward(self, tensordict: Any) -> Any:
        x, states, is_init = self._read(tensordict)
        if self.recurrent_mode and self._options.get("recurrent_recompute") == "full":
            # activations are recomputed in the backward pass instead of kept (less memory)
            y, nxt = torch.utils.checkpoint.checkpoint(
                self._forward_sequence, x, states, is_init, tensordict.batch_size, use_reentrant=False)
        elif self.recurrent_mode:
            y, nxt = self._forward_sequence(x, states, is_init, tensordict.batch_size)
        else:
            y, nxt = self._forward_step(x, states, is_init)
        tensordict.set(self.out_keys[0], y)
        for key, s in zip(self.out_keys[1:], nxt):
            tensordict.set(key, s)
        return tensordict

    def _forward_step(
        self, x: Tensor, states: list[Tensor | None], is_init: Tensor
    ) -> tuple[Tensor, list[Tensor]]:
        batch = x.shape[:-1]
        n = math.prod(batch)
        if is_init.numel() != n:
            raise ValueError(
                f"{type(self).__name__}: is_init of shape {list(is_init.shape)} does not match the "
                f"batch {list(batch)} of the input"
            )
        init = is_init.reshape(n, 1, 1).bool()
        h0 = [torch.where(init, 0.0, s) for s in self._initial(states, x, (n,))]
        h0 = [s.transpose(0, 1).contiguous() for s in h0]  # nn.LSTM wants [layers, n, size]
        y, hn = self._rnn(x.reshape(n, 1, x.shape[-1]), self._state_args(h0))
        nxt = []
        for s in self._state_list(hn):
            layers, _, size = s.shape
            nxt.append(s.transpose(0, 1).reshape(*batch, layers, size))
        return y.reshape(*batch, y.shape[-1]), nxt

    def _forward_sequence(
        self, x: Tensor, states: list[Tensor | None], is_init: Tensor, td_batch: torch.Size
    ) -> tuple[Tensor, list[Tensor]]:
        if len(td_batch) == 0:
            raise ValueError(
                f"{type(self).__name__} in recurrent mode needs a time dim: the TensorDict's last "
                "batch dim (batch [*B, T]); got batch []"
            )
        outer, steps = td_batch[:-1], td_batch[-1]
        n = math.prod(outer)
        if is_init.numel() != n * steps:
            raise ValueError(
                f"{type(self).__name__}: is_init of shape {list(is_init.shape)} does not match the "
                f"batch {list(td_batch)}"
            )
        init = is_init.reshape(n, steps).bool()
        seq = x.reshape(n, steps, x.shape[-1])
        first = [s[:, 0] for s in self._initial(states, x, (n, steps))]
        first = [torch.where(init[:, :1, None], 0.0, s) for s in first]
        if steps > 1 and bool(init[:, 1:].any()):
            y, nxt = self._run_segments(seq, first, init)
        else:
            y, hn = self._rnn(seq, self._state_args([s.transpose(0, 1).contiguous() for s in first]))
            nxt = []
            for s in self._state_list(hn):
                last = s.transpose(0, 1).unsqueeze(1)  # [n, 1, layers, size]
                pad = last.new_zeros(n, steps - 1, *last.shape[2:])
                nxt.append(torch.cat([pad, last], 1))
        y = y.reshape(*td_batch, y.shape[-1])
        nxt = [s.reshape(*td_batch, *s.shape[2:]) for s in nxt]
        return y, nxt

    def _run_segments(
        self, seq: Tensor, first: list[Tensor], init: Tensor
    ) -> tuple[Tensor, list[Tensor]]:
        """Runs each trajectory segment from its own initial state, all in one RNN call.

        ``seq`` ``[n, T, F]`` is cut where ``init`` is True (and at each row start) into
        segments, padded to ``[S, L, F]`` and packed; segment ``s`` starts from zeros, or
        from ``first`` for the segment opening a row whose first step is not a reset.
        """
        n, steps, feat = seq.shape
        starts = init.clone()
        starts[:, 0] = True
        flat_starts = starts.reshape(-1)
        start_idx = flat_starts.nonzero().squeeze(-1)  # [S], flat index of each segment's start
        seg = flat_starts.cumsum(0) - 1  # segment of each flat step
        bounds = torch.cat([start_idx, start_idx.new_tensor([n * steps])])
        lengths = bounds.diff()
        pos = torch.arange(n * steps, device=seq.device) - start_idx[seg]
        n_seg, longest = start_idx.numel(), int(lengths.max())
        padded = seq.new_zeros(n_seg, longest, feat).index_put((seg, pos), seq.reshape(-1, feat))
        # a segment opening a row (start at t=0) starts from that row's state, others from zeros
        row_start = (start_idx % steps) == 0
        row_of = start_idx // steps
        h0 = []
        for s in first:
            picked = torch.where(row_start.reshape(-1, 1, 1), s[row_of], 0.0)
            h0.append(picked.transpose(0, 1).contiguous())
        packed = pack_padded_sequence(padded, lengths.cpu(), batch_first=True, enforce_sorted=False)
        y_packed, hn = self._rnn(packed, self._state_args(h0))
        y_pad, _ = pad_packed_sequence(y_packed, batch_first=True, total_length=longest)
        y = y_pad[seg, pos].reshape(n, steps, -1)
        end_idx = start_idx + lengths - 1
        nxt = []
        for s in self._state_list(hn):
            final = s.transpose(0, 1)  # [S, layers, size]
            grid = final.new_zeros(n * steps, *final.shape[1:]).index_put((end_idx,), final)
            nxt.append(grid.reshape(n, steps, *final.shape[1:]))
        return y, nxt

    def extra_repr(self) -> str:
        return (
            f"in_keys={self.in_keys}, out_keys={self.out_keys}, "
            f"default_recurrent_mode={self._default_recurrent_mode}"
        )


class LSTMModule(_RecurrentModule):
    """An ``nn.LSTM`` that reads and writes its state ``(h, c)`` in a TensorDict.

    Args:
        input_size, hidden_size, num_layers, bias, dropout, proj_size: as ``nn.LSTM``.
        batch_first: must be ``True``.
        bidirectional: must be ``False``.
        python_based: must be ``False`` (kept for TorchRL signatures).

    Keyword Args:
        in_key: the input key; the state keys are then ``"recurrent_state_h"`` and
            ``"recurrent_state_c"``. Exclusive with ``in_keys``.
        in_keys: ``[input, h, c]`` (``"is_init"`` is appended; give it as a 4th key to
            rename it).
        out_key: the output key; the next-state keys are then
            ``("next", "recurrent_state_h")`` and ``("next", "recurrent_state_c")``.
            Exclusive with ``out_keys``.
        out_keys: ``[output, next_h, next_c]``.
        device: where the parameters are created.
        lstm: an existing ``nn.LSTM`` (``batch_first=True``) instead of the size arguments.
        default_recurrent_mode: the mode outside of a :class:`set_recurrent_mode` block
            (default ``False``: single steps).
        recurrent_backend: TorchRL's recurrent-mode implementation: ``"pad"`` (default),
            ``"scan"`` and ``"auto"`` compute the same values here (the trajectories of a
            batch are run segment by segment through the torch RNN); ``"triton"`` (TorchRL's
            prototype CUDA kernels) is refused.
        recurrent_recompute: ``"full"`` (with ``"scan"``/``"auto"``): recurrent mode keeps no
            activations for the backward pass and recomputes them (activation checkpointing);
            ``"none"`` (default).
        recurrent_compute_dtype, recurrent_matmul_precision: options of TorchRL's triton
            kernels (ignored by its other backends, as here); checked and kept as attributes
            (see :func:`~steersman.modules.set_recurrent_matmul_precision`).

    See the module docstring for the two modes and ``is_init``. A missing state is taken
    as zeros.

    Shapes: step mode: input ``[*B, input_size]``, states ``[*B, num_layers, hidden]``,
    ``is_init`` ``[*B, 1]``; output ``[*B, hidden]``. Recurrent mode: the same with
    ``[*B, T]`` for ``[*B]``.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> lstm = LSTMModule(input_size=3, hidden_size=8, in_key="obs", out_key="features")
        >>> lstm.in_keys
        ['obs', 'recurrent_state_h', 'recurrent_state_c', 'is_init']
        >>> td = TensorDict(obs=torch.randn(4, 3), is_init=torch.ones(4, 1, dtype=torch.bool),
        ...                 batch_size=[4])
        >>> td = lstm(td)  # one step for each of 4 envs
        >>> td["features"].shape, td["next", "recurrent_state_h"].shape
        (torch.Size([4, 8]), torch.Size([4, 1, 8]))
        >>> seq = TensorDict(obs=torch.randn(4, 10, 3),
        ...                  is_init=torch.zeros(4, 10, 1, dtype=torch.bool), batch_size=[4, 10])
        >>> with set_recurrent_mode(True):
        ...     seq = lstm(seq)  # 4 sequences of 10 steps
        >>> seq["features"].shape
        torch.Size([4, 10, 8])
    """

    _rnn_name = "lstm"
    _default_state_keys = ["recurrent_state_h", "recurrent_state_c"]

    def __init__(
        self,
        input_size: int | None = None,
        hidden_size: int | None = None,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = True,
        dropout: float = 0.0,
        proj_size: int = 0,
        bidirectional: bool = False,
        python_based: bool = False,
        *,
        in_key: Any = None,
        in_keys: Any = None,
        out_key: Any = None,
        out_keys: Any = None,
        device: Any = None,
        lstm: nn.LSTM | None = None,
        default_recurrent_mode: bool | None = None,
        recurrent_backend: str = "pad",
        recurrent_compute_dtype: torch.dtype = torch.float32,
        recurrent_recompute: str = "none",
        recurrent_matmul_precision: str = "auto",
    ) -> None:
        if python_based:
            raise ValueError("LSTMModule: python_based=True is not supported; use nn.LSTM")
        if lstm is None:
            if not hidden_size or not input_size:
                raise ValueError("LSTMModule needs input_size and hidden_size (or an lstm)")
            lstm = nn.LSTM(
                input_size, hidden_size, num_layers, bias=bias, batch_first=batch_first,
                dropout=dropout, proj_size=proj_size, bidirectional=bidirectional, device=device,
            )
        elif input_size is not None or hidden_size is not None:
            raise ValueError("LSTMModule: give either an lstm or its sizes, not both")
        if not isinstance(lstm, nn.LSTM):
            raise TypeError(f"LSTMModule wraps an nn.LSTM, got {type(lstm).__name__}")
        super().__init__(lstm, in_key, in_keys, out_key, out_keys, default_recurrent_mode)
        self._set_options(recurrent_backend, recurrent_compute_dtype, recurrent_recompute, recurrent_matmul_precision)


class GRUModule(_RecurrentModule):
    """An ``nn.GRU`` that reads and writes its state ``h`` in a TensorDict.

    Args:
        input_size, hidden_size, num_layers, bias, dropout: as ``nn.GRU``.
        batch_first: must be ``True``.
        bidirectional: must be ``False``.
        python_based: must be ``False`` (kept for TorchRL signatures).

    Keyword Args:
        in_key: the input key; the state key is then ``"recurrent_state"``.
        in_keys: ``[input, h]`` (``"is_init"`` is appended; give it as a 3rd key to
            rename it).
        out_key: the output key; the next-state key is then ``("next", "recurrent_state")``.
        out_keys: ``[output, next_h]``.
        device: where the parameters are created.
        gru: an existing ``nn.GRU`` (``batch_first=True``) instead of the size arguments.
        default_recurrent_mode: the mode outside of a :class:`set_recurrent_mode` block.
        recurrent_backend, recurrent_recompute, recurrent_compute_dtype,
        recurrent_matmul_precision: as :class:`LSTMModule`.

    Shapes: as :class:`LSTMModule`, with one state ``[*B, num_layers, hidden]``.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> gru = GRUModule(input_size=3, hidden_size=8, in_key="obs", out_key="features",
        ...                 default_recurrent_mode=True)
        >>> is_init = torch.zeros(2, 6, 1, dtype=torch.bool)
        >>> is_init[:, 0] = is_init[0, 3] = True  # row 0 holds two trajectories
        >>> td = TensorDict(obs=torch.randn(2, 6, 3), is_init=is_init, batch_size=[2, 6])
        >>> gru(td)["features"].shape
        torch.Size([2, 6, 8])
    """

    _rnn_name = "gru"
    _default_state_keys = ["recurrent_state"]

    def __init__(
        self,
        input_size: int | None = None,
        hidden_size: int | None = None,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = True,
        dropout: float = 0.0,
        bidirectional: bool = False,
        python_based: bool = False,
        *,
        in_key: Any = None,
        in_keys: Any = None,
        out_key: Any = None,
        out_keys: Any = None,
        device: Any = None,
        gru: nn.GRU | None = None,
        default_recurrent_mode: bool | None = None,
        recurrent_backend: str = "pad",
        recurrent_compute_dtype: torch.dtype = torch.float32,
        recurrent_recompute: str = "none",
        recurrent_matmul_precision: str = "auto",
    ) -> None:
        if python_based:
            raise ValueError("GRUModule: python_based=True is not supported; use nn.GRU")
        if gru is None:
            if not hidden_size or not input_size:
                raise ValueError("GRUModule needs input_size and hidden_size (or a gru)")
            gru = nn.GRU(
                input_size, hidden_size, num_layers, bias=bias, batch_first=batch_first,
                dropout=dropout, bidirectional=bidirectional, device=device,
            )
        elif input_size is not None or hidden_size is not None:
            raise ValueError("GRUModule: give either a gru or its sizes, not both")
        if not isinstance(gru, nn.GRU):
            raise TypeError(f"GRUModule wraps an nn.GRU, got {type(gru).__name__}")
        super().__init__(gru, in_key, in_keys, out_key, out_keys, default_recurrent_mode)
        self._set_options(recurrent_backend, recurrent_compute_dtype, recurrent_recompute, recurrent_matmul_precision)
