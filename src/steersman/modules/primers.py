"""``get_primers_from_module``: the ``TensorDictPrimer`` transforms a policy's recurrent
submodules need, collected in one call (append the result to the env)."""

from __future__ import annotations

import warnings
from typing import Any

from torch import nn

__all__ = ["get_primers_from_module"]


def get_primers_from_module(module: nn.Module, warn: bool = True, strict: bool = True) -> Any:
    """Calls ``make_tensordict_primer()`` on every submodule of ``module`` that has it.

    Args:
        module: a policy (e.g. a ``TensorDictSequential`` holding an :class:`LSTMModule`).
        warn: warn when no submodule makes a primer.
        strict: re-raise a submodule's error; if ``False``, skip it with a warning that
            names it.

    Returns:
        ``None`` without primers, the primer itself for one, else a ``Compose`` of them
        (in module order).

    Example:
        >>> from steersman.modules import GRUModule, LSTMModule
        >>> from steersman.tensordict.nn import TensorDictSequential
        >>> policy = TensorDictSequential(
        ...     LSTMModule(input_size=3, hidden_size=4, in_key="obs", out_key="h1"),
        ...     GRUModule(input_size=4, hidden_size=5, in_key="h1", out_key="h2"),
        ... )
        >>> type(get_primers_from_module(policy)).__name__
        'Compose'
    """
    primers, failures = [], []
    for sub in module.modules():
        make = getattr(sub, "make_tensordict_primer", None)
        if make is None:
            continue
        try:
            primers.append(make())
        except Exception as err:  # noqa: BLE001 (reported below or re-raised)
            if strict:
                raise
            failures.append(f"{type(sub).__name__}: {err}")
    if failures:
        warnings.warn("get_primers_from_module skipped submodules that could not build a primer: "
                      + "; ".join(failures), stacklevel=2)
    if not primers:
        if warn:
            warnings.warn(f"get_primers_from_module: no submodule of {type(module).__name__} makes a primer",
                          stacklevel=2)
        return None
    if len(primers) == 1:
        return primers[0]
    from ..envs.transforms import Compose  # noqa: PLC0415 (same layer, lazy as in rnn.py)

    return Compose(*primers)
