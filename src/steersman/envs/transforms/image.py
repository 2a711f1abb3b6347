"""Image transforms: ToTensorImage, Resize, GrayScale, CenterCrop.

Images after :class:`ToTensorImage` are ``[*batch, C, H, W]`` floats; the other
transforms work on any number of leading dims. As in TorchRL, ``Resize(w, h)`` and
``CenterCrop(w, h)`` produce images of shape ``[..., C, w, h]`` (the first size is
the height, as in ``torchvision``'s ``size=[w, h]``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from steersman.data import Bounded, TensorSpec, Unbounded
from steersman.tensordict._utils import NestedKey

from ._utils import map_bounded, refuse_unless_default, uniform_bounds
from .base import ObservationTransform

__all__ = ["ToTensorImage", "Resize", "GrayScale", "CenterCrop"]


def _check_image_spec(owner: str, spec: TensorSpec, key: NestedKey, min_dims: int = 3) -> None:
    if spec.ndim < min_dims:
        raise ValueError(
            f"{owner}: {key!r} has shape {list(spec.shape)}; expected an image [..., C, H, W]"
        )


def _to_int_like(out: Tensor, like: Tensor) -> Tensor:
    if like.is_floating_point():
        return out.to(like.dtype)
    info = torch.iinfo(like.dtype)
    return out.round_().clamp_(info.min, info.max).to(like.dtype)


class ToTensorImage(ObservationTransform):
    """``[*batch, H, W, C]`` images (uint8 in ``[0, 255]``) to ``[*batch, C, H, W]`` floats in ``[0, 1]``.

    Args:
        from_int: divide by 255 (default: when the input dtype is an integer dtype).
        dtype: the output dtype (default float32).
        in_keys, out_keys: the image entries (default ``["pixels"]``).
        shape_tolerant: leave images whose last dim is not 1 or 3 (already channel
            first) unpermuted.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs.transforms import ToTensorImage
        >>> td = TensorDict(pixels=torch.full((2, 8, 10, 3), 255, dtype=torch.uint8), batch_size=[2])
        >>> out = ToTensorImage()(td)["pixels"]
        >>> out.shape, out.dtype, float(out.max())       # [2, 3, 8, 10]
        (torch.Size([2, 3, 8, 10]), torch.float32, 1.0)
    """

    def __init__(self, from_int: bool | None = None, dtype: torch.dtype | None = None,
                 in_keys: Any = None, out_keys: Any = None, shape_tolerant: bool = False,
                 unsqueeze: bool = False) -> None:
        refuse_unless_default("ToTensorImage", "unsqueeze", unsqueeze, False,
                              "images keep their batch dims (add one with UnsqueezeTransform)")
        super().__init__(["pixels"] if in_keys is None else in_keys, out_keys)
        self.from_int = from_int
        self.dtype = torch.float32 if dtype is None else dtype
        self.shape_tolerant = shape_tolerant

    def _permute(self, shape: torch.Size) -> bool:
        return not self.shape_tolerant or shape[-1] in (1, 3)

    def _apply_transform(self, x: Tensor) -> Tensor:
        scale = self.from_int if self.from_int is not None else not x.is_floating_point()
        out = x.to(self.dtype)
        if scale:
            out = out.div(255.0)
        return out.movedim(-1, -3) if self._permute(x.shape) else out

    def _transform_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        _check_image_spec("ToTensorImage", spec, key)
        scale = self.from_int if self.from_int is not None else not spec.dtype.is_floating_point
        perm = self._permute(spec.shape)
        shape = spec.shape
        if perm:
            shape = torch.Size((*shape[:-3], shape[-1], shape[-3], shape[-2]))
        if scale:
            return Bounded(0.0, 1.0, shape=shape, device=spec.device, dtype=self.dtype)
        return map_bounded(spec, lambda t: t.movedim(-1, -3) if perm else t, dtype=self.dtype)


class Resize(ObservationTransform):
    """Resizes ``[..., C, H, W]`` images to ``[..., C, w, h]`` (TorchRL's layout).

    Args:
        w, h: the new size (``h`` defaults to ``w``).
        interpolation: ``"bilinear"`` (default), ``"nearest"``, ``"bicubic"`` or ``"area"``.
        in_keys, out_keys: the image entries (default ``["pixels"]``).

    Integer images are resized in float and rounded back. Bounded specs with uniform
    bounds stay Bounded (except for ``"bicubic"``, which can overshoot).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs.transforms import Resize
        >>> td = TensorDict(pixels=torch.rand(2, 3, 8, 10), batch_size=[2])
        >>> Resize(4, 5)(td)["pixels"].shape
        torch.Size([2, 3, 4, 5])
    """

    _MODES = ("bilinear", "nearest", "bicubic", "area")

    def __init__(self, w: int, h: int | None = None, interpolation: str = "bilinear",
                 in_keys: Any = None, out_keys: Any = None) -> None:
        super().__init__(["pixels"] if in_keys is None else in_keys, out_keys)
        if interpolation not in self._MODES:
            raise ValueError(f"Resize: interpolation must be one of {self._MODES}, got {interpolation!r}")
        self.w = int(w)
        self.h = int(w if h is None else h)
        if self.w < 1 or self.h < 1:
            raise ValueError(f"Resize: sizes must be positive, got ({self.w}, {self.h})")
        self.interpolation = interpolation

    def _apply_transform(self, x: Tensor) -> Tensor:
        lead, chw = x.shape[:-3], x.shape[-3:]
        x4 = x.reshape(-1, *chw)
        xf = x4 if x4.is_floating_point() else x4.float()
        kw = {"align_corners": False} if self.interpolation in ("bilinear", "bicubic") else {}
        out = F.interpolate(xf, size=(self.w, self.h), mode=self.interpolation, **kw)
        out = _to_int_like(out, x)
        return out.reshape(*lead, chw[0], self.w, self.h)

    def _transform_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        _check_image_spec("Resize", spec, key)
        shape = torch.Size((*spec.shape[:-2], self.w, self.h))
        bounds = uniform_bounds(spec)
        if bounds is not None and self.interpolation != "bicubic":
            return Bounded(bounds[0], bounds[1], shape=shape, device=spec.device, dtype=spec.dtype)
        return Unbounded(shape=shape, device=spec.device, dtype=spec.dtype)

    def __repr__(self) -> str:
        return f"Resize(w={self.w}, h={self.h}, interpolation={self.interpolation!r}, in_keys={self.in_keys})"


class GrayScale(ObservationTransform):
    """RGB ``[..., 3, H, W]`` images to grayscale ``[..., 1, H, W]`` (ITU-R 601-2 luma).

    Args:
        in_keys, out_keys: the image entries (default ``["pixels"]``).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs.transforms import GrayScale
        >>> td = TensorDict(pixels=torch.ones(2, 3, 4, 4), batch_size=[2])
        >>> out = GrayScale()(td)["pixels"]
        >>> out.shape, round(float(out.max()), 3)
        (torch.Size([2, 1, 4, 4]), 1.0)
    """

    _WEIGHTS = (0.2989, 0.587, 0.114)

    def __init__(self, in_keys: Any = None, out_keys: Any = None) -> None:
        super().__init__(["pixels"] if in_keys is None else in_keys, out_keys)

    def _apply_transform(self, x: Tensor) -> Tensor:
        if x.shape[-3] != 3:
            raise ValueError(f"GrayScale: expected 3 channels at dim -3, got shape {list(x.shape)}")
        xf = x if x.is_floating_point() else x.float()
        r, g, b = xf.unbind(-3)
        out = (r * self._WEIGHTS[0] + g * self._WEIGHTS[1] + b * self._WEIGHTS[2]).unsqueeze(-3)
        return _to_int_like(out, x)

    def _transform_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        _check_image_spec("GrayScale", spec, key)
        if spec.shape[-3] != 3:
            raise ValueError(f"GrayScale: {key!r} has shape {list(spec.shape)}; expected 3 channels at dim -3")
        shape = torch.Size((*spec.shape[:-3], 1, *spec.shape[-2:]))
        bounds = uniform_bounds(spec)
        if bounds is not None:
            return Bounded(bounds[0], bounds[1], shape=shape, device=spec.device, dtype=spec.dtype)
        return Unbounded(shape=shape, device=spec.device, dtype=spec.dtype)


class CenterCrop(ObservationTransform):
    """Crops the center of ``[..., C, H, W]`` images to ``[..., C, w, h]`` (TorchRL's layout).

    Args:
        w, h: the crop size (``h`` defaults to ``w``); at most the image size.
        in_keys, out_keys: the image entries (default ``["pixels"]``).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs.transforms import CenterCrop
        >>> img = torch.arange(36.0).reshape(1, 1, 6, 6)
        >>> CenterCrop(2)(TensorDict(pixels=img, batch_size=[1]))["pixels"][0, 0]
        tensor([[14., 15.],
                [20., 21.]])
    """

    def __init__(self, w: int, h: int | None = None, in_keys: Any = None, out_keys: Any = None) -> None:
        super().__init__(["pixels"] if in_keys is None else in_keys, out_keys)
        self.w = int(w)
        self.h = int(w if h is None else h)
        if self.w < 1 or self.h < 1:
            raise ValueError(f"CenterCrop: sizes must be positive, got ({self.w}, {self.h})")

    def _crop(self, x: Tensor) -> Tensor:
        H, W = x.shape[-2], x.shape[-1]
        if self.w > H or self.h > W:
            raise ValueError(
                f"CenterCrop: cannot crop ({self.w}, {self.h}) out of an image of size ({H}, {W})"
            )
        top = int(round((H - self.w) / 2.0))
        left = int(round((W - self.h) / 2.0))
        return x[..., top:top + self.w, left:left + self.h]

    def _apply_transform(self, x: Tensor) -> Tensor:
        return self._crop(x)

    def _transform_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        _check_image_spec("CenterCrop", spec, key, min_dims=2)
        return map_bounded(spec, self._crop)

    def __repr__(self) -> str:
        return f"CenterCrop(w={self.w}, h={self.h}, in_keys={self.in_keys})"
