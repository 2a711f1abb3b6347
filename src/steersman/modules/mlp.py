"""``MLP``: a stack of linear layers with activations, built from a few numbers.

``num_cells`` gives the width of each hidden layer, ``depth`` their count; the input size
may be left out (a lazy first layer infers it on the first call) and the output may be a
shape instead of a number (the last dim is then reshaped to it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["MLP", "per_layer_kwargs"]

_DEFAULT_NUM_CELLS = 32


def per_layer_kwargs(kwargs: dict | Sequence[dict] | None, n: int, name: str) -> Iterator[dict]:
    """``n`` keyword dicts: the same dict repeated, or one per layer from a list of ``n``."""
    if kwargs is None:
        kwargs = {}
    if isinstance(kwargs, dict):
        return (dict(kwargs) for _ in range(n))
    kwargs = list(kwargs)
    if len(kwargs) != n:
        raise ValueError(f"{name}: got {len(kwargs)} dicts for {n} layers; give one dict or {n}")
    return (dict(k) for k in kwargs)


def _layer_sizes(depth: int | None, num_cells: Sequence[int] | int | None) -> list[int]:
    if num_cells is None:
        return [] if depth is None else [_DEFAULT_NUM_CELLS] * depth
    if isinstance(num_cells, int):
        if depth is None:
            raise ValueError("MLP: num_cells given as an int needs depth (the number of hidden layers)")
        return [num_cells] * depth
    cells = [int(c) for c in num_cells]
    if depth is not None and depth != len(cells):
        raise ValueError(f"MLP: depth={depth} but num_cells has {len(cells)} entries {cells}")
    return cells


class MLP(nn.Sequential):
    """A multi-layer perceptron: ``[Linear, (Dropout), (Norm), Activation] * depth + Linear``.

    Args:
        in_features: input size; ``None`` makes the first layer an ``nn.LazyLinear``
            (its size is set by the first call).
        out_features: output size, or a shape (tuple / ``torch.Size``): the output's last
            dim is then reshaped to it.
        depth: number of hidden layers (default: ``len(num_cells)``, or 0 without
            ``num_cells``).
        num_cells: width of the hidden layers: one int (needs ``depth``) or one per layer.
            Without it, ``depth`` layers of 32.
        activation_class: class (or callable) of the activations (default ``nn.Tanh``).
        activation_kwargs: keyword arguments of the activations: one dict, or one per
            activation.
        norm_class: optional normalization layer inserted before each activation.
        norm_kwargs: its keyword arguments (one dict or one per layer).
        dropout: if given, an ``nn.Dropout(dropout)`` after each hidden linear layer.
        bias_last_layer: whether the output layer has a bias.
        single_bias_last_layer: one bias shared by all the output features (a
            parameter of shape ``[1]`` in a module after the output layer, which then has
            no bias of its own), e.g. for a value head whose outputs differ only by their
            weights. No effect with ``bias_last_layer=False``; not with
            :class:`NoisyLinear` layers (their bias is noisy per feature).
        layer_class: the linear layer class (lazy input only with ``nn.Linear``).
        layer_kwargs: extra keyword arguments of every linear layer.
        activate_last_layer: also put (dropout, norm and) an activation after the
            output layer.
        device: where the parameters are created.

    Several inputs are concatenated along the last dim (``mlp(obs, action)``).

    Shapes: input ``[*batch, in_features]`` -> output ``[*batch, out_features]`` (or
    ``[*batch, *out_features]`` for a shape).

    Example:
        >>> import torch
        >>> mlp = MLP(in_features=4, out_features=2, num_cells=[32, 32])
        >>> mlp(torch.randn(10, 4)).shape  # [10, 4] -> [10, 2]
        torch.Size([10, 2])
        >>> lazy = MLP(out_features=(3, 2), depth=1, num_cells=16, activation_class=torch.nn.ReLU)
        >>> lazy(torch.randn(5, 7, 6)).shape  # lazy input size 6; output reshaped to (3, 2)
        torch.Size([5, 7, 3, 2])
        >>> MLP(in_features=3, out_features=1, num_cells=[8])(torch.randn(2), torch.randn(1)).shape
        torch.Size([1])
    """

    def __init__(
        self,
        in_features: int | None = None,
        out_features: int | Sequence[int] | torch.Size | None = None,
        depth: int | None = None,
        num_cells: Sequence[int] | int | None = None,
        activation_class: type[nn.Module] | Callable[..., nn.Module] = nn.Tanh,
        activation_kwargs: dict | Sequence[dict] | None = None,
        norm_class: type[nn.Module] | Callable[..., nn.Module] | None = None,
        norm_kwargs: dict | Sequence[dict] | None = None,
        dropout: float | None = None,
        bias_last_layer: bool = True,
        single_bias_last_layer: bool = False,
        layer_class: type[nn.Module] | Callable[..., nn.Module] = nn.Linear,
        layer_kwargs: dict | None = None,
        activate_last_layer: bool = False,
        device: Any = None,
    ) -> None:
        if out_features is None:
            raise ValueError("MLP needs out_features (an int or a shape)")
        cells = _layer_sizes(depth, num_cells)
        if isinstance(out_features, int):
            out_shape: tuple[int, ...] | None = None
            n_out = out_features
        else:
            out_shape = tuple(int(s) for s in out_features)
            n_out = math.prod(out_shape)
        if in_features is None and layer_class is not nn.Linear:
            raise ValueError(
                f"MLP: a lazy input size (in_features=None) needs layer_class=nn.Linear, got "
                f"{getattr(layer_class, '__name__', layer_class)}; give in_features"
            )
        single_bias = bool(single_bias_last_layer) and bool(bias_last_layer)
        if single_bias:
            from .noisy import NoisyLinear  # noqa: PLC0415 (a sibling module, loaded on use)

            if isinstance(layer_class, type) and issubclass(layer_class, NoisyLinear):
                raise ValueError(
                    "MLP: single_bias_last_layer=True is incompatible with NoisyLinear layers "
                    "(their bias is drawn with noise per output feature)"
                )
        n_act = len(cells) + int(activate_last_layer)
        acts = per_layer_kwargs(activation_kwargs, n_act, "activation_kwargs")
        norms = per_layer_kwargs(norm_kwargs, n_act, "norm_kwargs")
        sizes_in = [in_features, *cells]
        sizes_out = [*cells, n_out]
        layers: list[nn.Module] = []
        for i, (d_in, d_out) in enumerate(zip(sizes_in, sizes_out)):
            last = i == len(cells)
            kw = dict(layer_kwargs or {})
            kw.setdefault("bias", (bias_last_layer and not single_bias) if last else True)
            if d_in is None:
                layers.append(nn.LazyLinear(d_out, device=device, **kw))
            else:
                layers.append(layer_class(d_in, d_out, device=device, **kw))
            if last and single_bias:
                layers.append(SharedBias(device=device))
            if last and not activate_last_layer:
                continue
            if dropout is not None:
                layers.append(nn.Dropout(dropout))
            if norm_class is not None:
                layers.append(_on_device(norm_class(**next(norms)), device))
            layers.append(_on_device(activation_class(**next(acts)), device))
        super().__init__(*layers)
        self.in_features = in_features
        self.out_features = out_features
        self.num_cells = cells
        self.depth = len(cells)
        self.single_bias_last_layer = single_bias
        self._out_shape = out_shape

    def forward(self, *inputs: Tensor) -> Tensor:
        x = inputs[0] if len(inputs) == 1 else torch.cat(inputs, -1)
        for layer in self:
            x = layer(x)
        if self._out_shape is not None:
            x = x.reshape(*x.shape[:-1], *self._out_shape)
        return x


class SharedBias(nn.Module):
    """Adds one learned scalar (``bias``, shape ``[1]``, zeros at first) to every feature:
    the output bias of ``MLP(single_bias_last_layer=True)``."""

    def __init__(self, device: Any = None) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(1, device=device))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.bias


def _on_device(module: nn.Module, device: Any) -> nn.Module:
    return module if device is None else module.to(device)
