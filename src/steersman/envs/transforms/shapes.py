"""Feature-dim layout transforms: FlattenObservation, PermuteTransform."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from steersman.data import Composite, TensorSpec
from steersman.tensordict import TensorDictBase
from steersman.tensordict._utils import NestedKey

from ._utils import map_bounded, missing_key
from .base import ObservationTransform

__all__ = ["FlattenObservation", "PermuteTransform"]


class FlattenObservation(ObservationTransform):
    """Flattens the adjacent dims ``first_dim..last_dim`` (inclusive) of the entries into one.

    Args:
        first_dim, last_dim: the span to flatten; negative (counted from the end), or,
            with ``allow_positive_dim=True``, non-negative feature dims (0 is the first
            dim after the batch dims: the env's in an env, the TensorDict's outside).
        in_keys: the entries (default ``["pixels"]``).
        out_keys: where the results go (default: ``in_keys``).
        allow_positive_dim: accept non-negative dims.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs.transforms import FlattenObservation
        >>> td = TensorDict(pixels=torch.zeros(4, 3, 8, 8), batch_size=[4])
        >>> FlattenObservation(-3, -1)(td)["pixels"].shape
        torch.Size([4, 192])
    """

    def __init__(self, first_dim: int, last_dim: int, in_keys: Any = None, out_keys: Any = None,
                 allow_positive_dim: bool = False) -> None:
        for name, d in (("first_dim", first_dim), ("last_dim", last_dim)):
            if isinstance(d, bool) or not isinstance(d, int):
                raise TypeError(f"FlattenObservation: {name} must be an int, got {d!r}")
            if d >= 0 and not allow_positive_dim:
                raise ValueError(f"FlattenObservation: {name}={d} must be negative (counted from the end); "
                                 "pass allow_positive_dim=True for feature dims counted from the batch dims")
        if (first_dim < 0) != (last_dim < 0):
            raise ValueError(f"FlattenObservation: first_dim={first_dim} and last_dim={last_dim} must both be "
                             "negative or both non-negative")
        if first_dim > last_dim:
            raise ValueError(f"FlattenObservation: first_dim={first_dim} comes after last_dim={last_dim}")
        super().__init__(["pixels"] if in_keys is None else in_keys, out_keys)
        self.first_dim = first_dim
        self.last_dim = last_dim
        self.allow_positive_dim = allow_positive_dim

    def _flatten(self, x: Tensor, batch_dims: int, key: NestedKey) -> Tensor:
        f, last = self.first_dim, self.last_dim
        if f >= 0:
            f, last = f + batch_dims, last + batch_dims
        else:
            f, last = f + x.ndim, last + x.ndim
        if f < batch_dims or last >= x.ndim:
            raise ValueError(
                f"FlattenObservation: dims {self.first_dim}..{self.last_dim} are out of the feature dims of "
                f"{key!r} (shape {list(x.shape)}, {batch_dims} batch dims)"
            )
        return x.flatten(f, last)

    def _apply_pairs(self, td: TensorDictBase, pairs: list) -> TensorDictBase:
        nb = td.batch_dims
        for ik, ok in pairs:
            x = td.get(ik, None)
            if x is None:
                raise missing_key(self, ik, td)
            td.set(ok, self._flatten(x, nb, ik))
        return td

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        self.__dict__["_spec_batch_dims"] = len(output_spec.shape)
        return super().transform_output_spec(output_spec)

    def _transform_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        nb = self.__dict__.get("_spec_batch_dims", 0)
        return map_bounded(spec, lambda t: self._flatten(t, nb, key))

    def __repr__(self) -> str:
        return (f"FlattenObservation(first_dim={self.first_dim}, last_dim={self.last_dim}, "
                f"in_keys={self.in_keys})")


class PermuteTransform(ObservationTransform):
    """Permutes the trailing (feature) dims of the entries.

    Args:
        dims: the new order of the last ``len(dims)`` dims, a reordering of
            ``[-len(dims), ..., -1]`` (e.g. ``[-1, -3, -2]``: HWC -> CHW).
        in_keys, out_keys: output entries.
        in_keys_inv, out_keys_inv: input entries: the policy writes them permuted, the
            env receives them with the inverse permutation.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs.transforms import PermuteTransform
        >>> td = TensorDict(pixels=torch.zeros(2, 8, 10, 3), batch_size=[2])
        >>> PermuteTransform([-1, -3, -2], in_keys=["pixels"])(td)["pixels"].shape
        torch.Size([2, 3, 8, 10])
    """

    def __init__(self, dims: Any, in_keys: Any = None, out_keys: Any = None, in_keys_inv: Any = None,
                 out_keys_inv: Any = None) -> None:
        try:
            dims = [int(d) for d in dims]
        except (TypeError, ValueError):
            raise TypeError(f"PermuteTransform: dims must be a sequence of ints, got {dims!r}") from None
        n = len(dims)
        if n == 0 or sorted(dims) != list(range(-n, 0)):
            raise ValueError(f"PermuteTransform: dims must be a reordering of {list(range(-n, 0))}, got {dims}")
        super().__init__(in_keys, out_keys, in_keys_inv, out_keys_inv)
        if not self.in_keys and not self.in_keys_inv:
            raise ValueError("PermuteTransform needs in_keys and/or in_keys_inv")
        self.dims = dims
        inv = [0] * n
        for i, d in enumerate(dims):
            inv[d + n] = i - n
        self.__dict__["_inv_dims"] = inv

    @staticmethod
    def _permute(x: Tensor, dims: list) -> Tensor:
        n = len(dims)
        lead = x.ndim - n
        if lead < 0:
            raise ValueError(f"PermuteTransform: a tensor of shape {list(x.shape)} has fewer than {n} dims")
        return x.permute(*range(lead), *(lead + n + d for d in dims))

    def _apply_transform(self, x: Tensor) -> Tensor:
        return self._permute(x, self.dims)

    def _inv_apply_transform(self, x: Tensor) -> Tensor:
        return self._permute(x, self.__dict__["_inv_dims"])

    def _transform_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        return map_bounded(spec, self._apply_transform)

    def _transform_inv_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        return map_bounded(spec, self._apply_transform)

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, dims={self.dims})".replace("(, ", "(")
