"""The float32 matmul precision of recurrent networks on GPUs (TorchRL's knob for its RNN
kernels): ``"ieee"`` (full fp32), ``"tf32"`` (tensor cores, ~10 mantissa bits) or
``"tf32x3"`` (three-product TF32, ~22 bits), and the GPU-aware presets ``"fast"`` (tf32 on
Ampere and newer, else ieee) and ``"high-prec"`` (tf32x3 there, else ieee).

Resolution, most specific first: :func:`set_recurrent_matmul_precision`; the
``TORCHRL_RNN_PRECISION`` environment variable (read at import); otherwise
``torch.get_float32_matmul_precision()`` (``"highest"`` -> ieee, ``"high"`` -> high-prec,
``"medium"`` -> fast). On CPU, and on GPUs without TF32 tensor cores, every mode resolves to
``"ieee"``: the CPU matmuls here are always full fp32.
"""

from __future__ import annotations

import os
from typing import Literal

import torch

__all__ = [
    "RecurrentMatmulPrecision",
    "RecurrentMatmulPrecisionUserMode",
    "get_recurrent_matmul_precision",
    "set_recurrent_matmul_precision",
]

#: The modes a matmul runs at.
RecurrentMatmulPrecision = Literal["ieee", "tf32", "tf32x3"]
#: The modes users may ask for.
RecurrentMatmulPrecisionUserMode = Literal["auto", "fast", "high-prec", "ieee", "tf32", "tf32x3"]

_CONCRETE = ("ieee", "tf32", "tf32x3")
_PRESETS = ("fast", "high-prec")
_FROM_TORCH = {"highest": "ieee", "high": "high-prec", "medium": "fast"}
_ENV = "TORCHRL_RNN_PRECISION"


def _checked(mode: str, where: str) -> str:
    if mode not in _CONCRETE + _PRESETS:
        raise ValueError(f"{where}: {mode!r} is not a recurrent matmul precision; valid: "
                         f"{sorted(('auto',) + _CONCRETE + _PRESETS)}")
    return mode


def _from_env() -> str | None:
    raw = os.environ.get(_ENV, "").strip().lower()
    return None if raw in ("", "auto") else _checked(raw, _ENV)


_override: str | None = _from_env()


def set_recurrent_matmul_precision(mode: str | None) -> None:
    """Sets the process-wide mode (``"auto"`` or ``None``: back to the env variable /
    torch's setting). Takes effect at the next call of a recurrent module.

    Example:
        >>> set_recurrent_matmul_precision("ieee")
        >>> get_recurrent_matmul_precision()
        'ieee'
        >>> set_recurrent_matmul_precision(None)
    """
    global _override
    _override = _from_env() if mode in (None, "auto") else _checked(mode, "set_recurrent_matmul_precision")


def _tensor_cores() -> bool:
    if not torch.cuda.is_available() or getattr(torch.version, "hip", None) is not None:
        return False
    return torch.cuda.get_device_capability()[0] >= 8


def get_recurrent_matmul_precision() -> RecurrentMatmulPrecision:
    """The concrete mode in effect (``"ieee"``, ``"tf32"`` or ``"tf32x3"``), presets resolved
    for the current device.

    Example:
        >>> import torch
        >>> set_recurrent_matmul_precision("fast")
        >>> get_recurrent_matmul_precision() == ("tf32" if torch.cuda.is_available()
        ...     and torch.cuda.get_device_capability()[0] >= 8 else "ieee")
        True
        >>> set_recurrent_matmul_precision(None)
    """
    mode = _override if _override is not None else _FROM_TORCH[torch.get_float32_matmul_precision()]
    if mode in _PRESETS:
        if not _tensor_cores():
            return "ieee"
        return "tf32" if mode == "fast" else "tf32x3"
    return mode  # type: ignore[return-value]
