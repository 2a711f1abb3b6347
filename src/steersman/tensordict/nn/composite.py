"""``CompositeDistribution`` (several named distributions as one), plus
``AddStateIndependentNormalScale`` and ``rand_one_hot``.

``CompositeDistribution(params, distribution_map)`` builds one distribution per name
from the entries of ``params[name]`` (its keyword arguments, e.g. ``loc``/``scale``).
``sample()``/``rsample()`` give a TensorDict with one entry per name (renamed with
``name_map``); ``log_prob(sample)`` and ``entropy()`` give, per name, the value summed
over that part's event dims: as one summed tensor when ``aggregate_probabilities`` is
True (default: :func:`composite_lp_aggregate`, False), else a TensorDict with the
entries ``"<name>_log_prob"`` / ``"<name>_entropy"``.

Example:
    >>> import torch
    >>> from torch import distributions as D
    >>> from steersman.tensordict import TensorDict
    >>> params = TensorDict({"cont": {"loc": torch.zeros(4, 2), "scale": torch.ones(4, 2)},
    ...                      "disc": {"logits": torch.zeros(4, 3)}}, [4])
    >>> dist = CompositeDistribution(params, {"cont": D.Normal, "disc": D.Categorical})
    >>> s = dist.sample()
    >>> s["cont"].shape, s["disc"].shape
    (torch.Size([4, 2]), torch.Size([4]))
    >>> dist.log_prob(s, aggregate_probabilities=True).shape
    torch.Size([4])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch import distributions as D

from .._utils import NestedKey, unravel_key
from ..td import TensorDict
from .switches import composite_lp_aggregate
from .utils import mappings

__all__ = ["CompositeDistribution", "AddStateIndependentNormalScale", "rand_one_hot"]


def _suffixed(key: NestedKey, suffix: str) -> NestedKey:
    key = unravel_key(key)
    return key + suffix if isinstance(key, str) else key[:-1] + (key[-1] + suffix,)


class CompositeDistribution(D.Distribution):
    """Several named distributions drawn and scored together; see the module docstring.

    Args:
        params: a TensorDict holding, under each name, the keyword arguments of that
            distribution; its batch size is the distribution's batch shape.
        distribution_map: ``{name: distribution class}`` (names may be nested keys).

    Keyword Args:
        name_map: ``{name: key}`` where each sample is written (default: the name).
        extra_kwargs: ``{name: dict}`` of more constructor arguments per name.
        aggregate_probabilities: sum the log-probs/entropies into one tensor (default:
            :func:`composite_lp_aggregate`).
        log_prob_key, entropy_key: the keys of the summed values when a TensorDict is
            returned with ``include_sum=True``.
        include_sum: with per-part results, also write the sum under ``log_prob_key`` /
            ``entropy_key``.
        inplace: ``log_prob(sample)`` writes the per-part values into ``sample`` (True)
            or into a new TensorDict (False, default).
    """

    arg_constraints: dict = {}

    def __init__(self, params: Any, distribution_map: Mapping, *, name_map: Mapping | None = None,
                 extra_kwargs: Mapping | None = None, aggregate_probabilities: bool | None = None,
                 log_prob_key: NestedKey = "sample_log_prob", entropy_key: NestedKey = "entropy",
                 include_sum: bool | None = None, inplace: bool | None = None) -> None:
        extra = {unravel_key(k): v for k, v in (extra_kwargs or {}).items()}
        names = {unravel_key(k): unravel_key(v) for k, v in (name_map or {}).items()}
        self.dists: dict = {}
        for name, cls in distribution_map.items():
            name = unravel_key(name)
            sub = params.get(name, None)
            if sub is None:
                raise KeyError(f"CompositeDistribution: params has no entry {name!r} for its distribution")
            kwargs = {k: sub.get(k) for k in sub.keys()} if hasattr(sub, "keys") else {}
            try:
                self.dists[name] = cls(**kwargs, **extra.get(name, {}))
            except (TypeError, ValueError) as err:
                raise type(err)(f"CompositeDistribution: building {name!r} ({cls.__name__}): {err}") from None
        self.name_map = {n: names.get(n, n) for n in self.dists}
        self.aggregate_probabilities = aggregate_probabilities
        self.log_prob_key, self.entropy_key = unravel_key(log_prob_key), unravel_key(entropy_key)
        self.include_sum = include_sum
        self.inplace = inplace
        self._batch = params.batch_size
        super().__init__(batch_shape=params.batch_size, validate_args=False)

    @property
    def has_rsample(self) -> bool:
        return all(d.has_rsample for d in self.dists.values())

    # -- drawing
    def _draw(self, fn: str, shape: Any) -> TensorDict:
        shape = torch.Size(shape)
        out = TensorDict({}, batch_size=shape + self._batch)
        for name, d in self.dists.items():
            out.set(self.name_map[name], getattr(d, fn)(shape))
        return out

    def sample(self, sample_shape: Any = ()) -> TensorDict:
        return self._draw("sample", sample_shape)

    def rsample(self, sample_shape: Any = ()) -> TensorDict:
        return self._draw("rsample", sample_shape)

    def _stat(self, attr: str) -> TensorDict:
        out = TensorDict({}, batch_size=self._batch)
        for name, d in self.dists.items():
            out.set(self.name_map[name], getattr(d, attr))
        return out

    @property
    def mode(self) -> TensorDict:
        return self._stat("mode")

    @property
    def mean(self) -> TensorDict:
        return self._stat("mean")

    @property
    def deterministic_sample(self) -> TensorDict:
        out = TensorDict({}, batch_size=self._batch)
        for name, d in self.dists.items():
            v = getattr(d, "deterministic_sample", None)
            if v is None and getattr(d.support, "is_discrete", False):
                v = d.mode  # the mean of a discrete distribution is not one of its values
            elif v is None:
                try:
                    v = d.mean
                except NotImplementedError:
                    v = d.mode
            out.set(self.name_map[name], v)
        return out

    # -- scoring
    def _reduce(self, v: Tensor, lead: int) -> Tensor:
        return v.sum(tuple(range(lead, v.ndim))) if v.ndim > lead else v

    def _score(self, values: dict, suffix: str, sum_key: NestedKey, aggregate: bool | None,
               include_sum: bool | None, batch: torch.Size, dest: Any) -> Any:
        if aggregate is None:
            aggregate = self.aggregate_probabilities
        if aggregate is None:
            aggregate = composite_lp_aggregate()
        lead = len(batch)
        reduced = {n: self._reduce(v, lead) for n, v in values.items()}
        if aggregate:
            return sum(reduced.values())
        out = dest if dest is not None else TensorDict({}, batch_size=batch)
        for n, v in reduced.items():
            out.set(_suffixed(self.name_map[n], suffix), v)
        if include_sum if include_sum is not None else bool(self.include_sum):
            out.set(sum_key, sum(reduced.values()))
        return out

    def log_prob(self, sample: Any, *, aggregate_probabilities: bool | None = None,
                 include_sum: bool | None = None, inplace: bool | None = None) -> Any:
        values = {}
        for name, d in self.dists.items():
            key = self.name_map[name]
            x = sample.get(key, None)
            if x is None:
                raise KeyError(f"CompositeDistribution.log_prob: the sample has no entry {key!r}")
            values[name] = d.log_prob(x)
        batch = sample.batch_size  # each part is summed over the dims past the sample's batch
        inplace = inplace if inplace is not None else bool(self.inplace)
        return self._score(values, "_log_prob", self.log_prob_key, aggregate_probabilities, include_sum,
                           batch, sample if inplace else None)

    def entropy(self, samples_mc: int = 1, *, aggregate_probabilities: bool | None = None,
                include_sum: bool | None = None) -> Any:
        values = {}
        for name, d in self.dists.items():
            try:
                values[name] = d.entropy()
            except NotImplementedError:  # a Monte-Carlo estimate
                x = d.rsample((samples_mc,)) if d.has_rsample else d.sample((samples_mc,))
                values[name] = -d.log_prob(x).mean(0)
        return self._score(values, "_entropy", self.entropy_key, aggregate_probabilities, include_sum,
                           self._batch, None)


class AddStateIndependentNormalScale(nn.Module):
    """Turns ``loc`` into ``(loc, scale)`` with a learned scale that does not depend on the input.

    Args:
        scale_shape: the shape of the learned parameter (default: the last dim of ``loc``,
            read lazily at the first call when not given).
        scale_mapping: the positive map of the parameter (``"exp"``, ``"softplus"``,
            ``"biased_softplus_1.0"``... see :func:`mappings`).
        scale_lb: the scale's lower bound.
        device: where the parameter lives.
        make_param: a learnable ``nn.Parameter`` (True) or a buffer (False).
        init_value: the parameter's initial value (default 0).

    Example:
        >>> import torch
        >>> m = AddStateIndependentNormalScale(3, scale_mapping="exp")
        >>> loc, scale = m(torch.zeros(5, 3))
        >>> scale.shape, scale[0, 0].item()
        (torch.Size([5, 3]), 1.0)
    """

    def __init__(self, scale_shape: Any = None, *, scale_mapping: str = "exp", scale_lb: float = 1e-4,
                 device: Any = None, make_param: bool = True, init_value: float | None = None) -> None:
        super().__init__()
        if scale_shape is None:
            raise ValueError("AddStateIndependentNormalScale: scale_shape is needed (e.g. the action dim)")
        shape = torch.Size([scale_shape]) if isinstance(scale_shape, int) else torch.Size(scale_shape)
        value = torch.full(shape, 0.0 if init_value is None else float(init_value), device=device)
        if make_param:
            self.scale = nn.Parameter(value)
        else:
            self.register_buffer("scale", value)
        self.scale_mapping = scale_mapping
        self._map: Callable = mappings(scale_mapping)
        self.scale_lb = scale_lb

    def forward(self, *tensors: Tensor) -> tuple[Tensor, ...]:
        loc, *others = tensors
        n = self.scale.ndim
        if loc.shape[loc.ndim - n:] != self.scale.shape:
            raise ValueError(f"AddStateIndependentNormalScale: loc ends with {list(loc.shape[loc.ndim - n:])}, "
                             f"the scale has shape {list(self.scale.shape)}")
        scale = self._map(self.scale).clamp_min(self.scale_lb).expand_as(loc)
        return (loc, scale, *others)


def rand_one_hot(values: Tensor, do_softmax: bool = True) -> Tensor:
    """A one-hot draw (``torch.long``, shaped like ``values``) along the last dim of the
    logits ``values`` (probabilities when ``do_softmax=False``).

    Example:
        >>> rand_one_hot(torch.tensor([[0.0, 100.0]])).tolist()
        [[0, 1]]
    """
    probs = values.softmax(-1) if do_softmax else values
    idx = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1).reshape(probs.shape[:-1])
    return torch.nn.functional.one_hot(idx, probs.shape[-1]).long()
