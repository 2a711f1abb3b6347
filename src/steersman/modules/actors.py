"""Actors and critics: TensorDict modules with RL default keys and an optional action spec.

- :class:`SafeModule`: a ``TensorDictModule`` that knows the spec of its outputs and, with
  ``safe=True``, projects them into it.
- :class:`Actor`: a deterministic policy, ``"observation" -> "action"``.
- :class:`ValueOperator`: ``"observation" -> "state_value"``, or
  ``("observation", "action") -> "state_action_value"``.
- :class:`SafeProbabilisticModule` / :class:`ProbabilisticActor`: a stochastic policy; the
  network computes the distribution's parameters and the last module draws the action.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import distributions as D
from torch import nn

from ..data import Bounded, Composite, TensorSpec
from ..tensordict.nn import (
    Delta,
    InteractionType,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TanhNormal,
    TensorDictModule,
    TensorDictModuleBase,
    TensorDictSequential,
    TruncatedNormal,
)

__all__ = [
    "SafeModule",
    "SafeSequential",
    "SafeProbabilisticModule",
    "SafeProbabilisticTensorDictSequential",
    "Actor",
    "ValueOperator",
    "ProbabilisticActor",
]

#: TorchRL names: sequences need no spec of their own here.
SafeSequential = TensorDictSequential
SafeProbabilisticTensorDictSequential = ProbabilisticTensorDictSequential


def as_composite(spec: TensorSpec | None, key: Any) -> Composite | None:
    """``spec`` as a Composite: a leaf spec goes under ``key``; None stays None."""
    if spec is None or isinstance(spec, Composite):
        return spec
    if not isinstance(spec, TensorSpec):
        raise TypeError(f"spec must be a TensorSpec, got {type(spec).__name__}")
    return Composite({key: spec})


def projections(spec: Composite | None, keys: Sequence[Any], owner: str) -> list[tuple[Any, TensorSpec]]:
    """``(key, leaf spec)`` for each of ``keys`` that has a leaf spec; for ``safe=True``."""
    if spec is None:
        raise ValueError(f"{owner}(safe=True) needs a spec to project the outputs into")
    out = []
    for key in keys:
        leaf = spec.get(key, None)
        if leaf is not None and not isinstance(leaf, Composite):
            out.append((key, leaf))
    if not out:
        raise ValueError(
            f"{owner}(safe=True): the spec has no entry for any of the outputs {list(keys)}; its "
            f"keys are {list(spec.keys(True, True))}"
        )
    return out


def _follow_device(module: nn.Module) -> None:
    """After ``module.to(...)``: moves the projection specs to the device of its tensors.

    (A module without tensors keeps them where they are; ``spec.project`` still works
    on any device, with a copy per call.)
    """
    tensor = next(itertools.chain(module.parameters(), module.buffers()), None)
    projections = getattr(module, "_projections", None)
    if tensor is not None and projections:
        module._projections = [(key, spec.to(tensor.device)) for key, spec in projections]


class SafeModule(TensorDictModule):
    """A :class:`TensorDictModule` with the spec of its outputs.

    Args:
        module, in_keys, out_keys, inplace: as :class:`TensorDictModule`.
        spec: the spec of the first output (a leaf spec), or a ``Composite`` keyed by
            output keys. Stored as a ``Composite`` in ``self.spec``.
        safe: if ``True``, every output with a spec is projected into it
            (``spec.project``) after each call: out-of-bounds values are clipped.

    Example:
        >>> import torch
        >>> from steersman.data import Bounded
        >>> m = SafeModule(lambda x: 3 * x, ["x"], ["y"], spec=Bounded(-1.0, 1.0, (2,)), safe=True)
        >>> m(x=torch.tensor([0.1, 2.0]))
        tensor([0.3000, 1.0000])
    """

    def __init__(
        self,
        module: Callable,
        in_keys: Any,
        out_keys: Any,
        spec: TensorSpec | None = None,
        safe: bool = False,
        inplace: bool | str = True,
    ) -> None:
        super().__init__(module, in_keys, out_keys, inplace=inplace)
        self.spec = as_composite(spec, self.out_keys[0])
        self.safe = bool(safe)
        self._projections = projections(self.spec, self.out_keys, type(self).__name__) if safe else []

    def _apply(self, fn: Callable, *args: Any, **kwargs: Any) -> SafeModule:
        super()._apply(fn, *args, **kwargs)
        _follow_device(self)
        return self

    def forward(self, tensordict: Any, *args: Any, **kwargs: Any) -> Any:
        tensordict = super().forward(tensordict, *args, **kwargs)
        for key, spec in self._projections:
            tensordict.set(key, spec.project(tensordict.get(key)))
        return tensordict


class Actor(SafeModule):
    """A deterministic policy: writes ``"action"`` from ``"observation"`` by default.

    Args:
        module: the network (any callable).
        in_keys: default ``["observation"]``.
        out_keys: default ``["action"]``.

    Keyword Args:
        spec: the action spec (a leaf spec, or a ``Composite`` holding it).
        safe: project the action into ``spec`` after each call.
        inplace: as :class:`TensorDictModule`.

    Shapes: ``[*batch, obs] -> [*batch, *action]`` as the module computes them.

    Example:
        >>> import torch
        >>> from steersman.data import Bounded
        >>> from steersman.tensordict import TensorDict
        >>> actor = Actor(torch.nn.Linear(4, 2), spec=Bounded(-1.0, 1.0, (2,)), safe=True)
        >>> td = actor(TensorDict(observation=torch.randn(3, 4) * 100, batch_size=[3]))
        >>> td["action"].shape, bool(td["action"].abs().max() <= 1)
        (torch.Size([3, 2]), True)
    """

    def __init__(
        self,
        module: Callable,
        in_keys: Any = None,
        out_keys: Any = None,
        *,
        spec: TensorSpec | None = None,
        safe: bool = False,
        inplace: bool | str = True,
    ) -> None:
        super().__init__(
            module,
            ["observation"] if in_keys is None else in_keys,
            ["action"] if out_keys is None else out_keys,
            spec=spec,
            safe=safe,
            inplace=inplace,
        )

    def get_dist(self, tensordict: Any) -> Delta:
        """A :class:`Delta` at the action computed from ``tensordict`` (written into it)."""
        return Delta(self(tensordict).get(self.out_keys[0]))


class ValueOperator(TensorDictModule):
    """A value network: ``"observation" -> "state_value"`` by default.

    With ``"action"`` among ``in_keys`` the default output is ``"state_action_value"``
    (a Q-function). Inputs are passed to the module in ``in_keys`` order (an :class:`MLP`
    concatenates them).

    Shapes: ``[*batch, obs] -> [*batch, 1]`` for a scalar value.

    Example:
        >>> import torch
        >>> from steersman.modules import MLP
        >>> q = ValueOperator(MLP(in_features=6, out_features=1, num_cells=[8]),
        ...                   in_keys=["observation", "action"])
        >>> q.out_keys
        ['state_action_value']
        >>> q(observation=torch.randn(5, 4), action=torch.randn(5, 2)).shape
        torch.Size([5, 1])
    """

    def __init__(self, module: Callable, in_keys: Any = None, out_keys: Any = None) -> None:
        if in_keys is None:
            in_keys = ["observation"]
        if out_keys is None:
            keys = [in_keys] if isinstance(in_keys, (str, tuple)) else list(in_keys)
            out_keys = ["state_action_value" if "action" in keys else "state_value"]
        super().__init__(module, in_keys, out_keys)


def _bounds_from_spec(
    distribution_class: Any, distribution_kwargs: Mapping | None, leaf: TensorSpec | None
) -> dict:
    """``low``/``high`` of a bounded continuous spec that ``distribution_kwargs`` lacks.

    Only for distributions that take bounds (:class:`TanhNormal`,
    :class:`TruncatedNormal` and their subclasses).
    """
    given = distribution_kwargs or {}
    takes_bounds = isinstance(distribution_class, type) and issubclass(
        distribution_class, (TanhNormal, TruncatedNormal)
    )
    if not (takes_bounds and isinstance(leaf, Bounded) and leaf.domain == "continuous"):
        return {}
    bounds = {"low": leaf.low, "high": leaf.high}
    return {name: value.clone() for name, value in bounds.items() if name not in given}


class SafeProbabilisticModule(ProbabilisticTensorDictModule):
    """A :class:`ProbabilisticTensorDictModule` with the spec of the value it draws.

    Args:
        in_keys, out_keys, distribution_class, default_interaction_type,
            return_log_prob, log_prob_key, cache_dist: as
            :class:`ProbabilisticTensorDictModule`.
        distribution_kwargs: extra distribution arguments. For :class:`TanhNormal` and
            :class:`TruncatedNormal`, ``low``/``high`` default to the bounds of a
            ``Bounded`` spec.
        spec: the spec of the (first) value drawn, or a ``Composite``.
        safe: project the drawn value into ``spec`` after each call (the log-probability
            is the one of the value before projection).

    Keyword Args:
        n_empirical_estimate, num_samples, log_prob_keys, generator: as
            :class:`ProbabilisticTensorDictModule` (samples for an empirical mean when the
            distribution has none; extra leading sample dims; one log-prob key per drawn
            value; a ``torch.Generator`` or an int seed for the draws).

    Example:
        >>> import torch
        >>> from steersman.data import Bounded
        >>> m = SafeProbabilisticModule(["loc", "scale"], ["action"], spec=Bounded(0.0, 1.0, (2,)),
        ...                             distribution_class=torch.distributions.Normal, safe=True)
        >>> m(loc=torch.tensor([-3.0, 0.5]), scale=torch.ones(2))  # the mean, projected
        tensor([0.0000, 0.5000])
    """

    def __init__(
        self,
        in_keys: Any,
        out_keys: Any = None,
        spec: TensorSpec | None = None,
        safe: bool = False,
        default_interaction_type: InteractionType | str = InteractionType.DETERMINISTIC,
        distribution_class: Callable[..., D.Distribution] = Delta,
        distribution_kwargs: Mapping[str, Any] | None = None,
        return_log_prob: bool = False,
        log_prob_key: Any = None,
        cache_dist: bool = False,
        *,
        n_empirical_estimate: int = 1000,
        num_samples: int | Sequence[int] | None = None,
        log_prob_keys: Sequence[Any] | None = None,
        generator: torch.Generator | int | None = None,
    ) -> None:
        sample_keys = ["action"] if out_keys is None else out_keys
        sample_keys = [sample_keys] if isinstance(sample_keys, (str, tuple)) else list(sample_keys)
        spec = as_composite(spec, sample_keys[0])
        leaf = None if spec is None else spec.get(sample_keys[0], None)
        bounds = _bounds_from_spec(distribution_class, distribution_kwargs, leaf)
        super().__init__(
            in_keys,
            sample_keys,
            distribution_class=distribution_class,
            distribution_kwargs={**(distribution_kwargs or {}), **bounds},
            default_interaction_type=default_interaction_type,
            return_log_prob=return_log_prob,
            log_prob_key=log_prob_key,
            cache_dist=cache_dist,
            n_empirical_estimate=n_empirical_estimate,
            num_samples=num_samples,
            log_prob_keys=log_prob_keys,
            generator=generator,
        )
        self.spec = spec
        self.safe = bool(safe)
        self._projections = projections(spec, sample_keys, type(self).__name__) if safe else []
        # bounds taken from the spec follow the module across devices (not saved: the
        # spec defines them)
        self._spec_bounds = list(bounds)
        for name, value in bounds.items():
            self.register_buffer(f"_spec_{name}", value, persistent=False)

    def _apply(self, fn: Callable, *args: Any, **kwargs: Any) -> SafeProbabilisticModule:
        super()._apply(fn, *args, **kwargs)
        _follow_device(self)
        for name in getattr(self, "_spec_bounds", ()):
            self.distribution_kwargs[name] = getattr(self, f"_spec_{name}")
        return self

    def forward(self, tensordict: Any, *args: Any, **kwargs: Any) -> Any:
        tensordict = super().forward(tensordict, *args, **kwargs)
        for key, spec in self._projections:
            tensordict.set(key, spec.project(tensordict.get(key)))
        return tensordict


class ProbabilisticActor(ProbabilisticTensorDictSequential):
    """A stochastic policy: a network writing distribution parameters, then a draw.

    Args:
        module: a TensorDict module computing the parameters (e.g. ``"loc"``,
            ``"scale"``) from the observation.
        in_keys: the parameter keys, named as the distribution's arguments (a dict
            ``{argument: key}`` maps other names).
        out_keys: where the value goes (default ``["action"]``).

    Keyword Args:
        spec: the action spec (leaf or ``Composite``). With a ``Bounded`` spec and
            :class:`TanhNormal` (or :class:`TruncatedNormal`), the distribution's
            ``low``/``high`` come from the spec unless given in ``distribution_kwargs``.
        safe: project the action into ``spec`` after each draw.
        distribution_class: default :class:`Delta`.
        distribution_kwargs: extra arguments of the distribution.
        return_log_prob: also write the log-probability of the action at
            ``log_prob_key`` (default ``"<out_key>_log_prob"``, e.g. ``"action_log_prob"``).
        default_interaction_type: how the value is drawn outside of a
            ``set_exploration_type`` block (default ``DETERMINISTIC``: the distribution's
            ``deterministic_sample``, e.g. the mode of a :class:`TanhNormal`).
        log_prob_key: where the log-probability goes.
        cache_dist: keep the last distribution in ``self[-1].last_dist``.

    :meth:`get_dist` returns the distribution for a TensorDict (used by losses).

    Shapes: parameters and action ``[*batch, *action]``; log-probability ``[*batch]``
    for the distributions of :mod:`steersman.modules.distributions`.

    Example:
        >>> import torch
        >>> from steersman.data import Bounded
        >>> from steersman.modules import MLP, ExplorationType, set_exploration_type
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import NormalParamExtractor, TensorDictModule
        >>> net = TensorDictModule(
        ...     torch.nn.Sequential(MLP(in_features=3, out_features=4, num_cells=[16]),
        ...                         NormalParamExtractor()),
        ...     in_keys=["observation"], out_keys=["loc", "scale"])
        >>> actor = ProbabilisticActor(net, in_keys=["loc", "scale"], spec=Bounded(-2.0, 2.0, (2,)),
        ...                            distribution_class=TanhNormal, return_log_prob=True)
        >>> td = TensorDict(observation=torch.randn(5, 3), batch_size=[5])
        >>> with set_exploration_type(ExplorationType.RANDOM):
        ...     td = actor(td)
        >>> td["action"].shape, td["action_log_prob"].shape, bool(td["action"].abs().max() < 2)
        (torch.Size([5, 2]), torch.Size([5]), True)
    """

    def __init__(
        self,
        module: TensorDictModuleBase,
        in_keys: Any,
        out_keys: Any = None,
        *,
        spec: TensorSpec | None = None,
        safe: bool = False,
        distribution_class: Callable[..., D.Distribution] = Delta,
        distribution_kwargs: Mapping[str, Any] | None = None,
        return_log_prob: bool = False,
        default_interaction_type: InteractionType | str = InteractionType.DETERMINISTIC,
        log_prob_key: Any = None,
        cache_dist: bool = False,
    ) -> None:
        if isinstance(module, nn.Module) and not isinstance(module, TensorDictModuleBase):
            raise TypeError(
                f"ProbabilisticActor needs a TensorDict module computing the distribution "
                f"parameters, got a plain {type(module).__name__}; wrap it in "
                f"TensorDictModule(net, in_keys=[...], out_keys={in_keys!r})"
            )
        head = SafeProbabilisticModule(
            in_keys,
            out_keys,
            spec=spec,
            safe=safe,
            default_interaction_type=default_interaction_type,
            distribution_class=distribution_class,
            distribution_kwargs=distribution_kwargs,
            return_log_prob=return_log_prob,
            log_prob_key=log_prob_key,
            cache_dist=cache_dist,
        )
        super().__init__(module, head)

    @property
    def spec(self) -> Composite | None:
        """The action spec (a ``Composite``), or None."""
        return self[-1].spec
