"""The contract between each loss's test file and the loss battery (test_loss_battery.py).

Each group of losses exposes ``CASES: list[LossCase]`` in ``tests/objectives/cases_<group>.py``.
The battery runs every case through the same checks: finite loss on every batch shape,
gradients reach exactly the parameters ``grad_map`` names (per ``loss_*`` term), target
parameters never get gradients, ``state_dict`` round trip, determinism under a seed,
missing-key errors, and a ``fullgraph=True`` compile of forward+backward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from torch import nn

from steersman.objectives import LossModule
from steersman.tensordict import TensorDict

_LAZY = [False]


def input_layer(in_features: int, out_features: int) -> nn.Module:
    """The first layer of a case's network: ``nn.Linear``, or, inside :func:`lazy_inputs`,
    an ``nn.LazyLinear`` whose input size is unknown until the first call (as TorchRL's
    ``MLP(out_features=..., num_cells=...)`` builds it)."""
    return nn.LazyLinear(out_features) if _LAZY[0] else nn.Linear(in_features, out_features)


@contextlib.contextmanager
def lazy_inputs() -> Iterator[None]:
    """Networks built inside get lazy input layers (see :func:`input_layer`)."""
    _LAZY[0] = True
    try:
        yield
    finally:
        _LAZY[0] = False


@dataclass
class LossCase:
    #: id shown by pytest, e.g. "ClipPPOLoss-gae"
    name: str
    #: builds the loss (and its networks) from scratch; must be deterministic given torch.manual_seed.
    #: Networks take their first layer from :func:`input_layer` (the battery builds every
    #: case with lazy input layers too)
    make_loss: Callable[[], LossModule]
    #: (loss, batch_shape) -> a random batch with every key the loss reads. batch_shape is
    #: ``[B]`` or ``[B, T]`` (time last); with a time dim, put at least one terminated and
    #: one truncated step inside the batch (not only at its end).
    make_batch: Callable[[LossModule, tuple[int, ...]], TensorDict]
    #: loss term -> prefixes of ``loss.named_parameters()`` names that must receive a
    #: non-zero gradient from that term alone; every other trainable parameter must get
    #: none (None or all-zero). E.g. {"loss_objective": {"actor_network."}, "loss_critic": {"critic_network."}}
    grad_map: dict[str, set[str]]
    #: batch shapes the loss supports (time-based estimators need a time dim)
    batch_shapes: list[tuple[int, ...]] = field(default_factory=lambda: [(8,), (4, 6)])
    #: a key name (field of loss.tensor_keys) that the batch must contain, used by the
    #: missing-key test
    required_key: str = "action"
    #: False for losses whose forward samples actions without a seedable path
    deterministic: bool = True
