"""UnaryTransform: a user function applied to entries (outputs and/or inputs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from steersman.data import TensorSpec, Unbounded
from steersman.tensordict._utils import NestedKey

from .base import ObservationTransform

__all__ = ["UnaryTransform"]


class UnaryTransform(ObservationTransform):
    """Applies ``fn`` to each ``in_keys`` entry and writes the result at the matching ``out_keys``.

    Args:
        in_keys, out_keys: output entries (observations at reset and step, rewards).
        in_keys_inv, out_keys_inv: input entries: the env reads ``inv_fn(value)`` at
            ``in_keys_inv`` from what the policy wrote at ``out_keys_inv``.

    Keyword Args:
        fn: a function from a tensor to a tensor.
        inv_fn: the function of the inverse direction (default: ``fn``).
        use_raw_nontensor: accepted for TorchRL compatibility; entries are passed to
            ``fn`` as they are stored (no non-tensor unwrapping happens here).

    Specs: the spec of a result is found by calling ``fn`` on the input spec's zero
    value: an ``Unbounded`` spec of the result's shape and dtype (an input entry's
    policy-facing spec likewise, through ``fn``).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs.transforms import UnaryTransform
        >>> t = UnaryTransform(["x"], ["x_sq"], fn=lambda x: x ** 2)
        >>> t(TensorDict(x=torch.tensor([1.0, -3.0]), batch_size=[2]))["x_sq"]
        tensor([1., 9.])
    """

    def __init__(self, in_keys: Any, out_keys: Any, in_keys_inv: Any = None, out_keys_inv: Any = None, *,
                 fn: Callable[[Any], Any], inv_fn: Callable[[Any], Any] | None = None,
                 use_raw_nontensor: bool = False) -> None:
        if not callable(fn):
            raise TypeError(f"UnaryTransform: fn must be callable, got {fn!r}")
        if inv_fn is not None and not callable(inv_fn):
            raise TypeError(f"UnaryTransform: inv_fn must be callable or None, got {inv_fn!r}")
        super().__init__(in_keys, out_keys, in_keys_inv, out_keys_inv)
        if not self.in_keys and not self.in_keys_inv:
            raise ValueError("UnaryTransform needs in_keys and/or in_keys_inv")
        self._pairs  # noqa: B018  (validates the lengths now)
        self._pairs_inv  # noqa: B018
        self.fn = fn
        self.inv_fn = fn if inv_fn is None else inv_fn
        self.use_raw_nontensor = use_raw_nontensor

    def _apply_transform(self, x: Tensor) -> Tensor:
        return self.fn(x)

    def _inv_apply_transform(self, x: Tensor) -> Tensor:
        return self.inv_fn(x)

    def _result_spec(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        try:
            out = self.fn(spec.zero())
        except Exception as err:  # noqa: BLE001 (named below with the key and spec)
            raise ValueError(f"UnaryTransform: fn fails on the spec of {key!r} ({spec!r}): {err}") from err
        if not isinstance(out, Tensor):
            raise TypeError(f"UnaryTransform: fn must return a tensor, got {type(out).__name__} for {key!r}")
        return Unbounded(shape=out.shape, device=spec.device, dtype=out.dtype)

    def _transform_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        return self._result_spec(spec, key)

    def _transform_inv_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        return self._result_spec(spec, key)

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, fn={getattr(self.fn, '__name__', self.fn)!r})".replace("(, ", "(")
