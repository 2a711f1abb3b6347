"""``ConvNet``: a stack of 2d convolutions for image observations, flattened at the end."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor, nn

from .mlp import per_layer_kwargs

__all__ = ["ConvNet", "Conv3dNet", "SquashDims", "SqueezeLayer", "Squeeze2dLayer"]


class SquashDims(nn.Module):
    """Flattens the last ``ndims_in`` dims into one: ``[*batch, C, H, W] -> [*batch, C*H*W]``.

    Example:
        >>> import torch
        >>> SquashDims()(torch.zeros(2, 8, 3, 3)).shape
        torch.Size([2, 72])
    """

    def __init__(self, ndims_in: int = 3) -> None:
        super().__init__()
        self.ndims_in = ndims_in

    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(-self.ndims_in, -1)

    def extra_repr(self) -> str:
        return f"ndims_in={self.ndims_in}"


class _Squeeze2d(nn.Module):
    """Removes the two trailing singleton dims left by a convolution: ``[..., C, 1, 1] -> [..., C]``."""

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-2:] != (1, 1):
            raise ValueError(
                f"ConvNet(squeeze_output=True): the last two dims must be 1, got shape {list(x.shape)}"
            )
        return x.squeeze(-1).squeeze(-1)


def _per_layer(value: Sequence[int] | int, depth: int, name: str) -> list[int]:
    if isinstance(value, int):
        return [value] * depth
    value = [int(v) for v in value]
    if len(value) != depth:
        raise ValueError(f"ConvNet: {name} has {len(value)} entries, expected depth={depth}")
    return value


class ConvNet(nn.Sequential):
    """A convolutional network: ``[Conv2d, Activation, (Norm)] * depth`` then an aggregator.

    Args:
        in_features: input channels; ``None`` makes the first layer an ``nn.LazyConv2d``.
        depth: number of convolutions (default: the length of the first of
            ``num_cells``/``kernel_sizes``/``strides``/``paddings`` given as a list).
        num_cells: output channels of each convolution (default ``[32, 32, 32]``).
        kernel_sizes, strides, paddings: one int for all layers or one per layer.
        activation_class: activation after each convolution (default ``nn.ELU``).
        activation_kwargs: its keyword arguments (one dict or one per layer).
        norm_class: optional normalization after each activation; ``norm_kwargs`` as above.
        norm_kwargs: keyword arguments of ``norm_class``.
        bias_last_layer: whether the last convolution has a bias.
        aggregator_class: the final module (default :class:`SquashDims`, which flattens
            ``[C, H, W]``); ``None`` keeps the feature maps.
        aggregator_kwargs: its keyword arguments (default ``{"ndims_in": 3}``).
        squeeze_output: remove the two trailing singleton dims of the output.
        device: where the parameters are created.

    Inputs may carry any number of batch dims: ``[*batch, C, H, W]`` is flattened to one
    batch dim for the convolutions and unflattened after.

    Shapes: ``[*batch, C, H, W] -> [*batch, num_cells[-1] * H' * W']`` with the default
    aggregator.

    Example:
        >>> import torch
        >>> net = ConvNet(num_cells=[8, 16], kernel_sizes=3, strides=[2, 1])
        >>> net(torch.randn(4, 5, 3, 16, 16)).shape  # [4, 5] batch; 16 channels of 5x5
        torch.Size([4, 5, 400])
    """

    _conv: type[nn.Module] = nn.Conv2d
    _lazy_conv: type[nn.Module] = nn.LazyConv2d
    _spatial = 2
    _dims_doc = "H, W"

    def __init__(
        self,
        in_features: int | None = None,
        depth: int | None = None,
        num_cells: Sequence[int] | int | None = None,
        kernel_sizes: Sequence[int] | int = 3,
        strides: Sequence[int] | int = 1,
        paddings: Sequence[int] | int = 0,
        activation_class: type[nn.Module] | Callable[..., nn.Module] = nn.ELU,
        activation_kwargs: dict | Sequence[dict] | None = None,
        norm_class: type[nn.Module] | Callable[..., nn.Module] | None = None,
        norm_kwargs: dict | Sequence[dict] | None = None,
        bias_last_layer: bool = True,
        aggregator_class: type[nn.Module] | Callable[..., nn.Module] | None = SquashDims,
        aggregator_kwargs: dict | None = None,
        squeeze_output: bool = False,
        device: Any = None,
    ) -> None:
        if num_cells is None:
            num_cells = [32, 32, 32]
        if depth is None:
            lists = [v for v in (num_cells, kernel_sizes, strides, paddings) if not isinstance(v, int)]
            if not lists:
                raise ValueError("ConvNet: give depth, or one of num_cells/kernel_sizes/... as a list")
            depth = len(lists[0])
        if depth <= 0:
            raise ValueError(f"ConvNet needs depth >= 1, got {depth}")
        cells = _per_layer(num_cells, depth, "num_cells")
        kernels = _per_layer(kernel_sizes, depth, "kernel_sizes")
        strides_ = _per_layer(strides, depth, "strides")
        pads = _per_layer(paddings, depth, "paddings")
        acts = per_layer_kwargs(activation_kwargs, depth, "activation_kwargs")
        norms = per_layer_kwargs(norm_kwargs, depth, "norm_kwargs")
        layers: list[nn.Module] = []
        for i in range(depth):
            bias = bias_last_layer if i == depth - 1 else True
            conv_kw = dict(kernel_size=kernels[i], stride=strides_[i], padding=pads[i], bias=bias)
            c_in = in_features if i == 0 else cells[i - 1]
            if c_in is None:
                layers.append(self._lazy_conv(cells[i], device=device, **conv_kw))
            else:
                layers.append(self._conv(c_in, cells[i], device=device, **conv_kw))
            layers.append(activation_class(**next(acts)))
            if norm_class is not None:
                layers.append(norm_class(**next(norms)))
        if aggregator_class is not None:
            kw = {"ndims_in": self._spatial + 1} if aggregator_kwargs is None else dict(aggregator_kwargs)
            layers.append(aggregator_class(**kw))
        if squeeze_output:
            layers.append(_Squeeze2d() if self._spatial == 2 else SqueezeLayer((-1,) * self._spatial))
        super().__init__(*layers)
        if device is not None:
            self.to(device)
        self.in_features = in_features
        self.out_features = cells[-1]
        self.depth = depth

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim < self._spatial + 1:
            raise ValueError(f"{type(self).__name__} expects inputs [*batch, C, {self._dims_doc}], got shape "
                             f"{list(x.shape)}")
        batch = x.shape[:-(self._spatial + 1)]
        if len(batch) > 1:
            x = x.flatten(0, len(batch) - 1)
        for layer in self:
            x = layer(x)
        if len(batch) > 1:
            x = x.unflatten(0, batch)
        return x


class SqueezeLayer(nn.Module):
    """Removes the singleton dims ``dims`` one after the other (default: the last one).

    Example:
        >>> import torch
        >>> SqueezeLayer()(torch.zeros(4, 1)).shape
        torch.Size([4])
    """

    def __init__(self, dims: Sequence[int] = (-1,)) -> None:
        super().__init__()
        for d in dims:
            if d >= 0:
                raise ValueError(f"SqueezeLayer: dims must be negative (counted from the end), got {list(dims)}")
        self.dims = tuple(dims)

    def forward(self, x: Tensor) -> Tensor:
        for d in self.dims:
            if x.shape[d] != 1:
                raise ValueError(f"SqueezeLayer: dim {d} of shape {list(x.shape)} is not 1")
            x = x.squeeze(d)
        return x


class Squeeze2dLayer(SqueezeLayer):
    """Removes the two trailing singleton dims of a pooled feature map: ``[..., C, 1, 1] -> [..., C]``.

    Example:
        >>> import torch
        >>> Squeeze2dLayer()(torch.zeros(2, 8, 1, 1)).shape
        torch.Size([2, 8])
    """

    def __init__(self) -> None:
        super().__init__((-1, -1))


class Conv3dNet(ConvNet):
    """:class:`ConvNet` with 3d convolutions, for ``[*batch, C, D, H, W]`` inputs (stacked
    frames, voxels). Same arguments; the default aggregator flattens ``[C, D, H, W]``.

    Example:
        >>> import torch
        >>> net = Conv3dNet(num_cells=[4, 8], kernel_sizes=3)
        >>> net(torch.randn(2, 3, 1, 5, 7, 7)).shape  # [2, 3] batch; 8 channels of 1x3x3
        torch.Size([2, 3, 72])
    """

    _conv = nn.Conv3d
    _lazy_conv = nn.LazyConv3d
    _spatial = 3
    _dims_doc = "D, H, W"
