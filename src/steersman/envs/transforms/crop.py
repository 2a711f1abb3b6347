"""Crop: a fixed window of images (``[..., H, W]``), zero-padded where it leaves the image."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from steersman.data import TensorSpec
from steersman.tensordict._utils import NestedKey

from ._utils import map_bounded
from .base import ObservationTransform

__all__ = ["Crop"]


class Crop(ObservationTransform):
    """Crops images to the ``h x w`` window whose top-left corner is ``(top, left)``.

    Args:
        w: the width of the result.
        h: the height of the result (default ``w``: a square crop).
        top, left: the window's top-left pixel (default 0, 0).
        in_keys, out_keys: the image entries, channel-first ``[..., H, W]`` (default
            ``["pixels"]``; use :class:`ToTensorImage` first for HWC frames).

    As torchvision's ``crop``, a window that leaves the image is filled with zeros
    there. ``Bounded`` specs keep their bounds over the window (0 in the padding).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs.transforms import Crop
        >>> img = torch.arange(16.0).reshape(1, 4, 4)
        >>> Crop(2, 3, top=1, left=2)(TensorDict(pixels=img, batch_size=[]))["pixels"]
        tensor([[[ 6.,  7.],
                 [10., 11.],
                 [14., 15.]]])
    """

    def __init__(self, w: int, h: int | None = None, top: int = 0, left: int = 0, in_keys: Any = None,
                 out_keys: Any = None) -> None:
        h = w if h is None else h
        for name, v, low in (("w", w, 1), ("h", h, 1), ("top", top, 0), ("left", left, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"Crop: {name} must be an int >= {low}, got {v!r}")
        super().__init__(["pixels"] if in_keys is None else in_keys, out_keys)
        self.w, self.h, self.top, self.left = w, h, top, left

    def _apply_transform(self, x: Tensor) -> Tensor:
        if x.ndim < 2:
            raise ValueError(f"Crop: an image needs at least 2 dims [..., H, W], got shape {list(x.shape)}")
        H, W = x.shape[-2:]
        t, lft, h, w = self.top, self.left, self.h, self.w
        if t + h <= H and lft + w <= W:
            return x[..., t:t + h, lft:lft + w]
        out = x.new_zeros((*x.shape[:-2], h, w))
        hh, ww = max(0, min(h, H - t)), max(0, min(w, W - lft))
        if hh and ww:
            out[..., :hh, :ww] = x[..., t:t + hh, lft:lft + ww]
        return out

    def _transform_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        if len(spec.shape) < 2:
            raise ValueError(f"Crop: the spec of {key!r} has shape {list(spec.shape)}; an image needs "
                             "[..., H, W]")
        return map_bounded(spec, self._apply_transform)

    def __repr__(self) -> str:
        return (f"Crop(w={self.w}, h={self.h}, top={self.top}, left={self.left}, in_keys={self.in_keys})")
