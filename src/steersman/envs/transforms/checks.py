"""FiniteTensorDictCheck: refuses non-finite values (NaN, inf) in what the env emits."""

from __future__ import annotations

from torch import Tensor

from steersman.tensordict import TensorDictBase

from ._utils import fmt_keys
from .base import Transform

__all__ = ["FiniteTensorDictCheck"]


class FiniteTensorDictCheck(Transform):
    """Raises a ``ValueError`` naming the entry when an output holds a NaN or an infinity.

    Checks every floating (and complex) entry of each step's ``"next"`` outputs and of
    the reset outputs; outside an env, ``forward`` checks the whole TensorDict. Integer
    and bool entries are always finite. The data is never changed.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs.transforms import FiniteTensorDictCheck
        >>> FiniteTensorDictCheck()(TensorDict(x=torch.tensor([float("nan")]), batch_size=[1]))
        Traceback (most recent call last):
        ...
        ValueError: FiniteTensorDictCheck: the entry 'x' holds non-finite values (1 of 1 elements: NaN or inf)
    """

    _check_spec_in_keys = False

    def __init__(self) -> None:
        super().__init__()

    def _check(self, td: TensorDictBase) -> TensorDictBase:
        for key in fmt_keys(td):
            x = td.get(key)
            if isinstance(x, Tensor) and (x.is_floating_point() or x.is_complex()):
                bad = ~x.isfinite()
                if bool(bad.any()):
                    raise ValueError(
                        f"FiniteTensorDictCheck: the entry {key!r} holds non-finite values "
                        f"({int(bad.sum())} of {x.numel()} elements: NaN or inf)"
                    )
        return td

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._check(tensordict)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        return self._check(tensordict_reset)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._check(tensordict)

    def __repr__(self) -> str:
        return "FiniteTensorDictCheck()"
