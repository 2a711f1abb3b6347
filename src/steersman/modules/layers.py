"""Small layers and helpers of TorchRL's module zoo.

- :class:`BatchRenorm1d`: batch renormalization (Ioffe 2017), used by CrossQ critics;
- :class:`ConsistentDropout` / :class:`ConsistentDropoutModule`: dropout whose mask is
  kept in the TensorDict, so a rollout and the later update drop the same units;
- :class:`TanhModule`: squashes TensorDict entries into ``[low, high]`` with a tanh;
- :class:`DistributionalDQNnet`: log-softmax over the atoms dim (``-2``) of
  distributional Q-values;
- :class:`NormalParamWrapper`: a network followed by :class:`NormalParamExtractor`;
- :func:`set_exploration_modules_spec_from_env`: gives the env's action spec to
  exploration modules built without one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..data import Composite, TensorSpec
from ..tensordict.nn import NormalParamExtractor, TensorDictModuleBase
from .actors import as_composite
from .exploration import AdditiveGaussianModule

__all__ = [
    "BatchRenorm1d",
    "ConsistentDropout",
    "ConsistentDropoutModule",
    "TanhModule",
    "DistributionalDQNnet",
    "NormalParamWrapper",
    "set_exploration_modules_spec_from_env",
]


class BatchRenorm1d(nn.Module):
    """Batch renormalization over dim 1 (features), as ``nn.BatchNorm1d`` places them.

    In training, ``y = (x - mean_B) / std_B * r + d`` with
    ``r = clamp(std_B / std_run, 1/max_r, max_r)`` and
    ``d = clamp((mean_B - mean_run) / std_run, -max_d, max_d)`` (both without gradient),
    then ``weight * y + bias``; running stats move by ``momentum``. During the first
    ``warmup_steps`` batches ``r = 1, d = 0`` (plain batch norm); with ``smooth=True``
    they ramp in linearly instead. In eval mode the running stats normalize.

    Args:
        num_features: size of dim 1.

    Keyword Args:
        momentum: update rate of the running stats (default 0.01).
        eps: added to variances.
        max_r: bound of ``r``.
        max_d: bound of ``d``.
        warmup_steps: batches before ``r``/``d`` act.
        smooth: ramp ``r``/``d`` in over the warm-up instead of switching at its end.

    TorchRL's ramp keeps growing past ``warmup_steps`` with ``smooth=True`` (its clamp of
    the step counter does not take effect); here the ramp stops at 1.

    Shapes: ``[N, num_features, *rest]`` -> same.

    Example:
        >>> import torch
        >>> norm = BatchRenorm1d(3, warmup_steps=0)
        >>> norm(torch.randn(8, 3)).shape
        torch.Size([8, 3])
    """

    def __init__(
        self,
        num_features: int,
        *,
        momentum: float = 0.01,
        eps: float = 1e-5,
        max_r: float = 3.0,
        max_d: float = 5.0,
        warmup_steps: int = 10000,
        smooth: bool = False,
    ) -> None:
        super().__init__()
        self.num_features, self.momentum, self.eps = int(num_features), float(momentum), float(eps)
        self.max_r, self.max_d = float(max_r), float(max_d)
        self.warmup_steps, self.smooth = int(warmup_steps), bool(smooth)
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.int64))
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() < 2 or x.shape[1] != self.num_features:
            raise ValueError(f"BatchRenorm1d: expected [N, {self.num_features}, ...], got shape {list(x.shape)}")
        view = [1, self.num_features] + [1] * (x.dim() - 2)
        run_std = (self.running_var + self.eps).sqrt()
        if not self.training:
            y = (x - self.running_mean.view(view)) / run_std.view(view)
            return self.weight.view(view) * y + self.bias.view(view)
        dims = [i for i in range(x.dim()) if i != 1]
        mean, var = x.mean(dims), x.var(dims, unbiased=False)
        std = (var + self.eps).sqrt()
        r = (std.detach() / run_std).clamp(1 / self.max_r, self.max_r)
        d = ((mean.detach() - self.running_mean) / run_std).clamp(-self.max_d, self.max_d)
        if self.warmup_steps > 0:
            if self.smooth:
                ramp = (self.num_batches_tracked / self.warmup_steps).clamp(max=1.0)
            else:
                ramp = (self.num_batches_tracked >= self.warmup_steps).to(x.dtype)
            r, d = 1 + (r - 1) * ramp, d * ramp
        y = (x - mean.view(view)) / std.view(view) * r.view(view) + d.view(view)
        n = x.numel() // self.num_features
        with torch.no_grad():
            self.running_mean.lerp_(mean.detach(), self.momentum)
            self.running_var.lerp_(var.detach() * n / max(n - 1, 1), self.momentum)
            self.num_batches_tracked.add_(1)
        return self.weight.view(view) * y + self.bias.view(view)


class ConsistentDropout(nn.Module):
    """Dropout that returns its mask and can reuse a given one.

    In training, ``forward(x, mask=None)`` returns ``(x * mask, mask)`` with a fresh mask
    of zeros and ``1 / (1 - p)`` when none is given; in eval mode it returns ``x``.

    Args:
        p: the drop probability, in ``[0, 1)``.

    Example:
        >>> import torch
        >>> drop = ConsistentDropout(0.5)
        >>> y, mask = drop(torch.ones(2, 4))
        >>> torch.equal(drop(torch.ones(2, 4), mask)[0], y)
        True
    """

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0 <= p < 1:
            raise ValueError(f"ConsistentDropout: p must be in [0, 1), got {p}")
        self.p = float(p)

    def make_mask(self, *, input: Tensor | None = None, shape: Sequence[int] | None = None) -> Tensor:
        """A fresh mask shaped like ``input`` (or ``shape``)."""
        if input is None and shape is None:
            raise ValueError("ConsistentDropout.make_mask needs input= or shape=")
        ones = torch.ones_like(input) if input is not None else torch.ones(tuple(shape))
        return F.dropout(ones, self.p, training=True)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        if not self.training:
            return x
        if mask is None:
            mask = self.make_mask(input=x)
        return x * mask, mask

    def extra_repr(self) -> str:
        return f"p={self.p}"


class ConsistentDropoutModule(TensorDictModuleBase):
    """:class:`ConsistentDropout` on a TensorDict entry, its mask kept under a second key.

    Args:
        p: the drop probability.
        in_keys: the input key, or ``[input, mask]`` (default mask key ``"mask_<id>"``).
        out_keys: ``[output, mask]`` (default: ``in_keys``).
        input_shape: shape of the input (for :meth:`make_tensordict_primer`).
        input_dtype: its dtype.

    A mask found in the TensorDict is reused (the update drops what the rollout dropped);
    without one a new mask is drawn and written. In eval mode the input passes unchanged.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> drop = ConsistentDropoutModule(0.5, in_keys="x")
        >>> td = drop(TensorDict({"x": torch.ones(3, 4)}, [3]))
        >>> torch.equal(drop(td.exclude("x").set("x", torch.ones(3, 4)))["x"], td["x"])
        True
    """

    def __init__(
        self,
        p: float,
        in_keys: Any,
        out_keys: Any = None,
        input_shape: Sequence[int] | None = None,
        input_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if isinstance(in_keys, (str, tuple)):
            in_keys = [in_keys, f"mask_{id(self)}"]
        if out_keys is None:
            out_keys = list(in_keys)
        elif isinstance(out_keys, (str, tuple)):
            out_keys = [out_keys, f"mask_{id(self)}"]
        if len(in_keys) != 2 or len(out_keys) != 2:
            raise ValueError(f"ConsistentDropoutModule: in_keys and out_keys need 2 entries (value, mask), "
                             f"got {in_keys} and {out_keys}")
        self.in_keys, self.out_keys = list(in_keys), list(out_keys)
        self.input_shape, self.input_dtype = input_shape, input_dtype
        self.consistent_dropout = ConsistentDropout(p)

    def forward(self, tensordict: Any) -> Any:
        x = tensordict.get(self.in_keys[0])
        mask = tensordict.get(self.in_keys[1], None)
        if not self.consistent_dropout.training:
            tensordict.set(self.out_keys[0], x)
            return tensordict
        y, mask = self.consistent_dropout(x, mask)
        tensordict.set(self.out_keys[0], y)
        tensordict.set(self.out_keys[1], mask)
        return tensordict


class TanhModule(TensorDictModuleBase):
    """Maps each of ``in_keys`` to ``low + (high - low) * (tanh(x) + 1) / 2``.

    Args:
        in_keys: the entries to squash.
        out_keys: where to write (default: ``in_keys``).

    Keyword Args:
        spec: a ``Bounded`` spec (or a ``Composite`` of them keyed by ``out_keys``) giving
            ``low``/``high``.
        low: the lower bound (default -1), a number or a tensor broadcastable to the entry.
        high: the upper bound (default 1).
        clamp: clamp the result into ``[low, high]`` (guards float rounding at the ends).

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> squash = TanhModule(in_keys=["action"], low=-2.0, high=torch.tensor([1.0, 3.0]))
        >>> squash(TensorDict({"action": torch.tensor([[0.0, 100.0]])}, [1]))["action"]
        tensor([[-0.5000,  3.0000]])
    """

    def __init__(
        self,
        in_keys: Any,
        out_keys: Any = None,
        *,
        spec: TensorSpec | None = None,
        low: float | Tensor | None = None,
        high: float | Tensor | None = None,
        clamp: bool = False,
    ) -> None:
        super().__init__()
        in_keys = [in_keys] if isinstance(in_keys, (str, tuple)) else list(in_keys)
        out_keys = list(in_keys) if out_keys is None else (
            [out_keys] if isinstance(out_keys, (str, tuple)) else list(out_keys))
        if len(in_keys) != len(out_keys):
            raise ValueError(f"TanhModule: {len(in_keys)} in_keys but {len(out_keys)} out_keys")
        self.in_keys, self.out_keys, self.clamp = in_keys, out_keys, bool(clamp)
        if spec is not None and (low is not None or high is not None):
            raise ValueError("TanhModule: give spec or low/high, not both")
        lows, highs = [], []
        for key in out_keys:
            if spec is not None:
                leaf = spec[key] if isinstance(spec, Composite) else spec
                lo, hi = leaf.space.low, leaf.space.high
            else:
                lo = torch.as_tensor(-1.0 if low is None else low, dtype=torch.get_default_dtype())
                hi = torch.as_tensor(1.0 if high is None else high, dtype=torch.get_default_dtype())
            if not bool((lo < hi).all()):
                raise ValueError(f"TanhModule: low must be < high for {key!r}, got low={lo} and high={hi}")
            lows.append(lo)
            highs.append(hi)
        for i, (lo, hi) in enumerate(zip(lows, highs)):
            self.register_buffer(f"_low_{i}", lo.clone())
            self.register_buffer(f"_high_{i}", hi.clone())

    def forward(self, tensordict: Any) -> Any:
        for i, (k_in, k_out) in enumerate(zip(self.in_keys, self.out_keys)):
            low, high = getattr(self, f"_low_{i}"), getattr(self, f"_high_{i}")
            y = low + (high - low) * (tensordict.get(k_in).tanh() + 1) / 2
            if self.clamp:
                y = torch.maximum(torch.minimum(y, high), low)
            tensordict.set(k_out, y)
        return tensordict


class DistributionalDQNnet(TensorDictModuleBase):
    """Writes ``log_softmax(values, dim=-2)``: distributional Q-values
    ``[*batch, n_atoms, n_actions]`` become log-probabilities over the atoms.

    Keyword Args:
        in_keys: default ``["action_value"]``.
        out_keys: default ``["action_value"]``.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> net = DistributionalDQNnet()
        >>> out = net(TensorDict({"action_value": torch.randn(4, 51, 2)}, [4]))["action_value"]
        >>> torch.allclose(out.exp().sum(-2), torch.ones(4, 2))
        True
    """

    def __init__(self, *, in_keys: Any = None, out_keys: Any = None) -> None:
        super().__init__()
        self.in_keys = ["action_value"] if in_keys is None else list(in_keys)
        self.out_keys = list(self.in_keys) if out_keys is None else list(out_keys)

    def forward(self, tensordict: Any) -> Any:
        for k_in, k_out in zip(self.in_keys, self.out_keys):
            values = tensordict.get(k_in)
            if values.ndim < 2:
                raise ValueError(f"DistributionalDQNnet: {k_in!r} needs [..., n_atoms, n_actions], "
                                 f"got shape {list(values.shape)}")
            tensordict.set(k_out, values.log_softmax(-2))
        return tensordict


class NormalParamWrapper(nn.Module):
    """``operator`` followed by :class:`NormalParamExtractor`: returns ``(loc, scale)``.

    TorchRL deprecated this name for ``NormalParamExtractor`` (and now refuses it); here it
    still works, as the composition it always meant.

    Args:
        operator: a network whose last dim is ``2 * d``.
        scale_mapping: how the second half becomes a positive scale.
        scale_lb: lower bound of the scale.

    Example:
        >>> import torch
        >>> loc, scale = NormalParamWrapper(torch.nn.Linear(3, 4))(torch.randn(5, 3))
        >>> loc.shape, bool((scale > 0).all())
        (torch.Size([5, 2]), True)
    """

    def __init__(self, operator: nn.Module, scale_mapping: str = "biased_softplus_1.0",
                 scale_lb: float = 1e-4) -> None:
        super().__init__()
        self.operator = operator
        self.extractor = NormalParamExtractor(scale_mapping=scale_mapping, scale_lb=scale_lb)

    def forward(self, *inputs: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        return self.extractor(self.operator(*inputs, **kwargs))


def set_exploration_modules_spec_from_env(policy: nn.Module, env: Any) -> None:
    """Gives ``env``'s (unbatched) action spec to the :class:`AdditiveGaussianModule`
    instances in ``policy`` that were built without a spec.

    Example:
        >>> import torch
        >>> from steersman.data import Bounded, Composite
        >>> from steersman.modules import AdditiveGaussianModule
        >>> class Env:
        ...     action_spec = Composite(action=Bounded(-1, 1, (2,)))
        >>> explore = AdditiveGaussianModule()
        >>> set_exploration_modules_spec_from_env(explore, Env())
        >>> explore.spec["action"].shape
        torch.Size([2])
    """
    spec = getattr(env, "action_spec_unbatched", None)
    if spec is None:
        spec = env.action_spec
    for module in policy.modules():
        if isinstance(module, AdditiveGaussianModule) and module._spec is None:
            module._spec = as_composite(spec, module.action_key)
            module._action_spec = module._spec[module.action_key]
