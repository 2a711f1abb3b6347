"""Probabilistic modules: build a distribution from TensorDict entries and draw a value.

The value drawn depends on the active interaction type (see
:mod:`steersman.tensordict.nn.interaction`), else on the module's
``default_interaction_type``:

- ``RANDOM``: ``dist.rsample()`` if ``dist.has_rsample`` else ``dist.sample()``;
- ``MODE`` / ``MEAN`` / ``MEDIAN``: ``dist.mode`` / ``dist.mean`` / ``dist.median``;
- ``DETERMINISTIC``: ``dist.deterministic_sample`` if the distribution defines it (for an
  ``Independent``, also its base distribution's); otherwise the **mode** for distributions
  with enumerable support (``has_enumerate_support``: ``Categorical``, ``Bernoulli``,
  ``OneHotCategorical``...) and the **mean** for the others, the mode when the class does
  not implement the mean.

Any ``torch.distributions.Distribution`` (or a callable returning one) works.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torch import distributions as D

from .._utils import NestedKey
from .common import (
    TensorDictModuleBase,
    _as_key,
    _as_key_list,
    _call_with_tensors,
    _describe_value,
    _dispatch_aware,
    _missing_input,
    _MissingInputKeyError,
    _rollback,
    _snapshot,
)
from .interaction import (
    InteractionType,
    _as_interaction_type,
    interaction_type,
    set_interaction_type,
)
from .sequence import TensorDictSequential
from .switches import _STATE as _SKIP
from .switches import should_skip

__all__ = ["ProbabilisticTensorDictModule", "ProbabilisticTensorDictSequential"]

_DET, _BASE_DET, _MODE, _MEAN, _RUNTIME = "deterministic_sample", "base", "mode", "mean", "runtime"


def _class_strategy(cls: Any) -> str:
    """How ``DETERMINISTIC`` reads a value from instances of ``cls`` (see the module doc)."""
    if not isinstance(cls, type):
        return _RUNTIME
    if hasattr(cls, "deterministic_sample"):
        return _DET
    if issubclass(cls, D.Independent):
        return _RUNTIME  # decided by the base distribution
    if getattr(cls, "has_enumerate_support", False) is True:
        return _MODE
    if issubclass(cls, D.Distribution) and getattr(cls, "mean", None) is D.Distribution.mean:
        return _MODE  # the class does not implement the mean
    return _MEAN


def _instance_strategy(dist: Any) -> str:
    cls = type(dist)
    strategy = _class_strategy(cls)
    if strategy != _RUNTIME:
        return strategy
    if isinstance(dist, D.Independent):
        base = _instance_strategy(dist.base_dist)
        return _BASE_DET if base == _DET else base
    return _MEAN


def _deterministic(dist: Any, strategy: str) -> Any:
    if strategy == _RUNTIME:
        strategy = _instance_strategy(dist)
    if strategy == _DET:
        return dist.deterministic_sample
    if strategy == _MODE:
        return dist.mode
    if strategy == _BASE_DET:
        return dist.base_dist.deterministic_sample
    try:
        return dist.mean
    except NotImplementedError:
        return dist.mode


def _param_name(key: NestedKey) -> str:
    return key if type(key) is str else key[-1]


class ProbabilisticTensorDictModule(TensorDictModuleBase):
    """Builds a distribution from TensorDict entries and writes a value drawn from it.

    Args:
        in_keys: the distribution parameters: a dict ``{param_name: td_key}`` or a list of
            keys, whose names (the last part for a nested key) are the parameter names.
        out_keys: where to write the value (default ``["action"]``).
        distribution_class: a ``torch.distributions.Distribution`` subclass, or any
            callable returning a distribution, called as
            ``distribution_class(**params, **distribution_kwargs)``.
        distribution_kwargs: extra constant arguments of the distribution.
        default_interaction_type: used when no :class:`set_interaction_type` is active.
        return_log_prob: also write ``dist.log_prob(value)`` at ``log_prob_key``.
        log_prob_key: where the log-probability goes (e.g. ``"action_log_prob"``).
        cache_dist: keep the last distribution built by ``forward`` in ``self.last_dist``.

    Bad parameters (wrong shapes, invalid values) raise a ``ValueError`` naming the
    parameter keys and shapes. ``out_keys`` include ``log_prob_key`` when
    ``return_log_prob`` is set.

    Shapes: parameters ``[*batch, *event]``; the value is ``[*batch, *event]`` and the
    log-probability has the distribution's batch shape (``[*batch, *event]`` for
    ``Normal``, ``[*batch]`` for ``Independent(Normal, 1)``).

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import InteractionType, set_interaction_type
        >>> module = ProbabilisticTensorDictModule(
        ...     in_keys=["loc", "scale"], out_keys=["action"],
        ...     distribution_class=torch.distributions.Normal, return_log_prob=True)
        >>> td = TensorDict(loc=torch.zeros(4, 2), scale=torch.ones(4, 2), batch_size=[4])
        >>> module(td)["action"]  # DETERMINISTIC by default: the mean, [4, 2]
        tensor([[0., 0.],
                [0., 0.],
                [0., 0.],
                [0., 0.]])
        >>> with set_interaction_type(InteractionType.RANDOM):
        ...     td = module(td)
        >>> td["action"].shape, td["action_log_prob"].shape
        (torch.Size([4, 2]), torch.Size([4, 2]))
        >>> module.get_dist(td).batch_shape
        torch.Size([4, 2])
    """

    def __init__(
        self,
        in_keys: NestedKey | Sequence[NestedKey] | Mapping[str, NestedKey],
        out_keys: NestedKey | Sequence[NestedKey] | None = None,
        distribution_class: Callable[..., D.Distribution] | None = None,
        distribution_kwargs: Mapping[str, Any] | None = None,
        default_interaction_type: InteractionType | str = InteractionType.DETERMINISTIC,
        return_log_prob: bool = False,
        log_prob_key: NestedKey | None = None,
        cache_dist: bool = False,
        n_empirical_estimate: int = 1000,
        num_samples: int | Sequence[int] | None = None,
        log_prob_keys: Sequence[NestedKey] | None = None,
        generator: torch.Generator | int | None = None,
    ) -> None:
        super().__init__()
        if log_prob_keys is not None:  # one key per sampled key; the first is the log-prob entry here
            keys = _as_key_list(log_prob_keys, "log_prob_keys")
            if log_prob_key is None and keys:
                log_prob_key = keys[0]
        self.n_empirical_estimate = int(n_empirical_estimate)
        self.num_samples = torch.Size([num_samples] if isinstance(num_samples, int) else num_samples or [])
        if isinstance(generator, int):
            generator = torch.Generator().manual_seed(generator)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or an int seed, got {generator!r}")
        self.generator = generator
        if distribution_class is None:
            try:
                from .distributions import Delta  # noqa: PLC0415 (optional sibling module)
            except ImportError:
                raise TypeError(
                    "ProbabilisticTensorDictModule needs a distribution_class"
                ) from None
            distribution_class = Delta
        if not callable(distribution_class):
            raise TypeError(f"distribution_class must be callable, got {distribution_class!r}")
        if isinstance(in_keys, Mapping):
            params = [(str(name), _as_key(key, "in_keys")) for name, key in in_keys.items()]
        else:
            params = [(_param_name(k), k) for k in _as_key_list(in_keys, "in_keys")]
        if not params:
            raise ValueError("ProbabilisticTensorDictModule needs at least one in_key")
        self._params = tuple(params)
        self.in_keys = [k for _, k in params]
        sample_keys = _as_key_list(["action"] if out_keys is None else out_keys, "out_keys")
        if not sample_keys:
            raise ValueError("ProbabilisticTensorDictModule needs at least one out_key")
        self._sample_keys = sample_keys
        self.distribution_class = distribution_class
        self.distribution_kwargs = dict(distribution_kwargs or {})
        itype = _as_interaction_type(default_interaction_type)
        if itype is None:
            raise ValueError("default_interaction_type cannot be None")
        self.default_interaction_type = itype
        self.return_log_prob = bool(return_log_prob)
        if log_prob_key is None:  # tensordict/TorchRL: "<sample>_log_prob", next to the sample
            first = sample_keys[0]
            log_prob_key = (
                f"{first}_log_prob" if isinstance(first, str) else (*first[:-1], f"{first[-1]}_log_prob")
            )
        self.log_prob_key = _as_key(log_prob_key, "log_prob_key")
        self.cache_dist = bool(cache_dist)
        self.last_dist: D.Distribution | None = None
        self._strategy = _class_strategy(distribution_class)
        self._selected: list | None = None
        self._refresh_out_keys()

    # -- keys ---------------------------------------------------------------------
    def _refresh_out_keys(self) -> None:
        source = list(self._sample_keys)
        if self.return_log_prob:
            source.append(self.log_prob_key)
        self._out_keys_source = source
        sel = self._selected
        self.out_keys = source if sel is None else [k for k in source if k in sel]
        self._write_sample = [sel is None or k in sel for k in self._sample_keys]
        self._write_lp = self.return_log_prob and (sel is None or self.log_prob_key in sel)
        self._written = list(self.out_keys)

    @property
    def dist_params_keys(self) -> list[NestedKey]:
        """The TensorDict keys of the distribution parameters."""
        return list(self.in_keys)

    @property
    def dist_sample_keys(self) -> list[NestedKey]:
        """The keys where the drawn value is written."""
        return list(self._sample_keys)

    def select_out_keys(self, *out_keys: NestedKey) -> ProbabilisticTensorDictModule:
        """Writes only ``out_keys`` (e.g. the sample without the log-prob); returns ``self``."""
        keys = _as_key_list(list(out_keys), "select_out_keys")
        missing = [k for k in keys if k not in self._out_keys_source]
        if missing:
            raise KeyError(
                f"select_out_keys: {missing} are not outputs of {self._describe()}; "
                f"its outputs are {self._out_keys_source}"
            )
        self._selected = keys
        self._refresh_out_keys()
        return self

    def reset_out_keys(self) -> ProbabilisticTensorDictModule:
        self._selected = None
        self._refresh_out_keys()
        return self

    # -- distribution -------------------------------------------------------------
    def _describe(self) -> str:
        name = getattr(self.distribution_class, "__name__", repr(self.distribution_class))
        return (
            f"{type(self).__name__}(distribution_class={name}, in_keys={self.in_keys}, "
            f"out_keys={self.out_keys})"
        )

    def _build_error(self, params: dict, err: BaseException) -> str:
        keys = dict(self._params)
        described = ", ".join(
            f"{name} (key {keys.get(name, '?')!r}): {_describe_value(v)}" for name, v in params.items()
        )
        name = getattr(self.distribution_class, "__name__", repr(self.distribution_class))
        return f"{self._describe()} could not build {name} from {described}: {err}"

    def get_dist(self, tensordict: Any) -> D.Distribution:
        """The distribution whose parameters are read from ``tensordict`` (for losses)."""
        try:
            params = {name: tensordict[key] for name, key in self._params}
        except KeyError:
            raise _missing_input(self, tensordict, self.in_keys) from None
        if self.distribution_kwargs:
            params.update(self.distribution_kwargs)
        try:
            return self.distribution_class(**params)
        except (ValueError, RuntimeError) as err:
            raise ValueError(self._build_error(params, err)) from err
        except TypeError as err:
            raise TypeError(self._build_error(params, err)) from err

    def log_prob(self, tensordict: Any) -> Tensor:
        """``log_prob`` of the value stored at the (first) out key under the current parameters."""
        dist = self.get_dist(tensordict)
        return dist.log_prob(tensordict[self._sample_keys[0]])

    def _draw(self, dist: D.Distribution, itype: InteractionType) -> Any:
        if self.generator is not None and itype is InteractionType.RANDOM:
            # the draw uses this module's generator (which advances), not the global one
            seed = int(torch.randint(0, 2**62, (), generator=self.generator))
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                return self._draw_now(dist, itype)
        return self._draw_now(dist, itype)

    def _draw_now(self, dist: D.Distribution, itype: InteractionType) -> Any:
        shape = self.num_samples
        if shape:
            if itype is InteractionType.RANDOM:
                return dist.rsample(shape) if dist.has_rsample else dist.sample(shape)
            one = self._draw_now.__func__(_NoSamples(self), dist, itype)
            return one.expand(*shape, *one.shape)
        try:
            if itype is InteractionType.RANDOM:
                return dist.rsample() if dist.has_rsample else dist.sample()
            if itype is InteractionType.MODE:
                return dist.mode
            if itype is InteractionType.DETERMINISTIC:
                return _deterministic(dist, self._strategy)
            if itype is InteractionType.MEAN:
                try:
                    return dist.mean
                except NotImplementedError:  # an empirical mean
                    n = (self.n_empirical_estimate,)
                    return (dist.rsample(n) if dist.has_rsample else dist.sample(n)).float().mean(0)
            if itype is InteractionType.MEDIAN:
                return dist.median
        except (NotImplementedError, AttributeError) as err:
            raise NotImplementedError(
                f"{self._describe()}: {type(dist).__name__} does not implement the "
                f"{itype.name} interaction type ({err}); use another one with "
                "set_interaction_type(...)"
            ) from err
        raise ValueError(f"unknown interaction type {itype!r}")

    # -- call -----------------------------------------------------------------------
    @_dispatch_aware
    def forward(
        self, tensordict: Any = None, *args: Any, tensordict_out: Any = None, **kwargs: Any
    ) -> Any:
        """Builds the distribution, draws a value, writes it (and its log-prob); returns the TensorDict."""
        if not getattr(type(tensordict), "_is_tensor_collection", False):
            pos = args if tensordict is None else (tensordict, *args)
            return _call_with_tensors(self, self.forward, pos, kwargs, self.in_keys, self.out_keys)
        if _SKIP.active and should_skip(self, tensordict):
            return tensordict
        if args:
            if len(args) > 1 or tensordict_out is not None:
                raise TypeError("forward(tensordict, tensordict_out=None): too many arguments")
            tensordict_out = args[0]
        dist = self.get_dist(tensordict)
        itype = interaction_type()
        if itype is None:
            itype = self.default_interaction_type
        sample = self._draw(dist, itype)
        if self.num_samples and tensordict_out is None:
            # num_samples draws per element: the output gains the leading sample dims
            tensordict_out = tensordict.expand(*self.num_samples, *tensordict.batch_size).copy()
        if self.cache_dist:
            self.last_dist = dist
        dest = tensordict if tensordict_out is None else tensordict_out
        keys = self._sample_keys
        if getattr(type(sample), "_is_tensor_collection", False):  # a CompositeDistribution's draw
            return self._write_composite(dist, sample, dest)
        if len(keys) == 1:
            values = (sample,)
        elif isinstance(sample, (tuple, list)) and len(sample) == len(keys):
            values = tuple(sample)
        else:
            raise RuntimeError(
                f"{self._describe()}: the distribution gave one value but there are "
                f"{len(keys)} out_keys {keys}"
            )
        if self._write_lp:
            lp = dist.log_prob(sample)
            snap = _snapshot(dest, self._written)
            try:
                for key, value, write in zip(keys, values, self._write_sample):
                    if write:
                        dest.set(key, value)
                dest.set(self.log_prob_key, lp)
            except BaseException:
                _rollback(dest, snap)
                raise
            return dest
        if len(keys) == 1:
            if self._write_sample[0]:
                dest.set(keys[0], sample)
            return dest
        snap = _snapshot(dest, self._written)
        try:
            for key, value, write in zip(keys, values, self._write_sample):
                if write:
                    dest.set(key, value)
        except BaseException:
            _rollback(dest, snap)
            raise
        return dest

    def _write_composite(self, dist: Any, sample: Any, dest: Any) -> Any:
        """Writes each out key from the TensorDict a composite distribution drew, and its
        log-probs (one tensor at ``log_prob_key`` when aggregated, else the per-part entries)."""
        missing = [k for k in self._sample_keys if k not in sample.keys(include_nested=True)]
        if missing:
            raise KeyError(f"{self._describe()}: the composite sample has no entries {missing} "
                           f"(it has {list(sample.keys(include_nested=True, leaves_only=True))})")
        lp = dist.log_prob(sample) if self._write_lp else None
        snap = _snapshot(dest, self._written)
        try:
            for key, write in zip(self._sample_keys, self._write_sample):
                if write:
                    dest.set(key, sample.get(key))
            if lp is not None:
                if isinstance(lp, Tensor):
                    dest.set(self.log_prob_key, lp)
                else:
                    dest.update(lp)
        except BaseException:
            _rollback(dest, snap)
            raise
        return dest

    def extra_repr(self) -> str:
        name = getattr(self.distribution_class, "__name__", repr(self.distribution_class))
        extra = (
            f"in_keys={self.in_keys}, out_keys={self.out_keys}, distribution_class={name}, "
            f"default_interaction_type={self.default_interaction_type.name}"
        )
        if self.distribution_kwargs:
            extra += f", distribution_kwargs={self.distribution_kwargs}"
        return extra


class _NoSamples:
    """``self`` seen without ``num_samples`` (for one deterministic draw to repeat)."""

    def __init__(self, module: Any) -> None:
        self._module = module
        self.num_samples = torch.Size()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


class ProbabilisticTensorDictSequential(TensorDictSequential):
    """A sequence whose last module is a :class:`ProbabilisticTensorDictModule`.

    The modules before it (the deterministic part) compute the distribution parameters.
    :meth:`get_dist` runs them and returns the distribution (for losses);
    :meth:`get_dist_params` runs them only. Calling the sequence draws a value as the
    last module does.

    Args:
        *modules: TensorDict modules; the last one must be probabilistic.
        partial_tolerant, selected_out_keys: as for :class:`TensorDictSequential`.

    Shapes: as the modules allow; the value and the parameters share the batch dims.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import (
        ...     InteractionType, NormalParamExtractor, ProbabilisticTensorDictModule,
        ...     TensorDictModule, set_interaction_type)
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), NormalParamExtractor())
        >>> policy = ProbabilisticTensorDictSequential(
        ...     TensorDictModule(net, ["obs"], ["loc", "scale"]),
        ...     ProbabilisticTensorDictModule(["loc", "scale"], ["action"],
        ...                                   torch.distributions.Normal,
        ...                                   return_log_prob=True),
        ... )
        >>> td = TensorDict(obs=torch.randn(5, 3), batch_size=[5])  # obs [5, 3]
        >>> with set_interaction_type(InteractionType.RANDOM):
        ...     td = policy(td)
        >>> td["action"].shape, td["action_log_prob"].shape  # [5, 2] each
        (torch.Size([5, 2]), torch.Size([5, 2]))
        >>> policy.get_dist(td).log_prob(td["action"]).shape
        torch.Size([5, 2])
    """

    def __init__(
        self,
        *modules: Any,
        partial_tolerant: bool = False,
        selected_out_keys: Sequence[NestedKey] | None = None,
        inplace: bool | str | None = None,
        return_composite: bool | None = None,
    ) -> None:
        # return_composite: accepted for tensordict's signature; get_dist() gives the last
        # module's distribution (a CompositeDistribution when that module builds one)
        self.__dict__["return_composite"] = return_composite
        if len(modules) == 1 and isinstance(modules[0], (list, tuple)):
            modules = tuple(modules[0])
        if not modules or not isinstance(modules[-1], ProbabilisticTensorDictModule):
            last = type(modules[-1]).__name__ if modules else "nothing"
            raise TypeError(
                "the last module of a ProbabilisticTensorDictSequential must be a "
                f"ProbabilisticTensorDictModule, got {last}"
            )
        super().__init__(
            *modules, partial_tolerant=partial_tolerant, selected_out_keys=selected_out_keys, inplace=inplace
        )

    def _new_sequence(self, modules: Sequence[Any]) -> TensorDictSequential:
        if modules and isinstance(modules[-1], ProbabilisticTensorDictModule):
            return ProbabilisticTensorDictSequential(*modules, partial_tolerant=self.partial_tolerant)
        return TensorDictSequential(*modules, partial_tolerant=self.partial_tolerant)

    @property
    def det_part(self) -> TensorDictSequential:
        """The modules before the probabilistic one, as a new sequence (shared modules)."""
        return TensorDictSequential(*self._mods[:-1], partial_tolerant=self.partial_tolerant)

    @property
    def default_interaction_type(self) -> InteractionType:
        return self._mods[-1].default_interaction_type

    @property
    def dist_params_keys(self) -> list[NestedKey]:
        return self._mods[-1].dist_params_keys

    @property
    def dist_sample_keys(self) -> list[NestedKey]:
        return self._mods[-1].dist_sample_keys

    @property
    def log_prob_key(self) -> NestedKey:
        return self._mods[-1].log_prob_key

    def get_dist_params(self, tensordict: Any, tensordict_out: Any = None, **kwargs: Any) -> Any:
        """Runs the deterministic part on ``tensordict`` (in place) and returns it.

        Without an active interaction type, the last module's default is used for any
        probabilistic module inside the deterministic part.
        """
        td = tensordict if tensordict_out is None else tensordict.copy()
        mods = self._mods[:-1]
        if interaction_type() is None:
            with set_interaction_type(self.default_interaction_type, thread_local=True):
                td = self._run(mods, td, kwargs)
        else:
            td = self._run(mods, td, kwargs)
        if tensordict_out is not None:
            tensordict_out.update(td)
            return tensordict_out
        return td

    def _run(self, mods: Sequence[Any], td: Any, kwargs: dict) -> Any:
        i = 0
        try:
            for m in mods:
                td = m(td, **kwargs)
                i += 1
        except _MissingInputKeyError as err:
            err.where.append(f"module {i} of {type(self).__name__}")
            raise
        return td

    def build_dist_from_params(self, tensordict: Any) -> D.Distribution:
        """The distribution from parameters already in ``tensordict`` (no module runs)."""
        return self._mods[-1].get_dist(tensordict)

    def get_dist(self, tensordict: Any, tensordict_out: Any = None, **kwargs: Any) -> D.Distribution:
        """Runs the deterministic part (writing the parameters into ``tensordict``) and
        returns the distribution."""
        td = self.get_dist_params(tensordict, tensordict_out, **kwargs)
        return self._mods[-1].get_dist(td)

    def log_prob(self, tensordict: Any) -> Tensor:
        """``log_prob`` of the stored value under the parameters computed from ``tensordict``."""
        dist = self.get_dist(tensordict)
        return dist.log_prob(tensordict[self._mods[-1].dist_sample_keys[0]])

