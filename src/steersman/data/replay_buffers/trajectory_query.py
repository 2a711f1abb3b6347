"""Trajectories as objects, and a small query language to filter them.

:func:`iter_trajectories` splits a flat batch of transitions ``[N]`` into
:class:`Trajectory` views; :data:`traj` builds predicates such as
``(traj.reward.sum() > 100) & (traj.length < 200)`` that :func:`filter_trajectories` (or
any code) applies to them.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from steersman.tensordict import NestedKey, TensorDictBase, unravel_key

__all__ = ["Trajectory", "TrajectoryPredicate", "iter_trajectories", "filter_trajectories", "traj"]


def _t(key: NestedKey) -> tuple:
    key = unravel_key(key)
    return key if isinstance(key, tuple) else (key,)


def _k(key: tuple) -> NestedKey:
    """The form ``keys()`` lists a key in: a string at the root, a tuple when nested."""
    return key[0] if len(key) == 1 else key


class Trajectory:
    """The transitions ``[T]`` of one trajectory, with entries as attributes.

    ``trajectory.name`` reads the root entry ``name`` if there is one, else
    ``("next", name)``: ``obs``/``action`` are root entries, ``reward``/``done`` come from
    ``"next"``. Slicing gives a :class:`Trajectory` again.

    Args:
        data: a TensorDict with one batch dim (the steps, in order).
        batch_size: if given, must be ``data``'s (``[T]``); device: moves ``data`` there;
            names: accepted for TorchRL compatibility (dim names are not kept).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> td = TensorDict({"obs": torch.zeros(5, 3), "next": {"reward": torch.ones(5, 1)}}, [5])
        >>> t = Trajectory(td)
        >>> t.length, t.obs.shape, float(t.total_reward)
        (5, torch.Size([5, 3]), 5.0)
        >>> t[:2]
        Trajectory(length=2, keys=['next', 'obs'])
    """

    __slots__ = ("data",)

    def __init__(self, data: TensorDictBase, *, batch_size: Any = None, device: Any = None, names: Any = None) -> None:
        if not isinstance(data, TensorDictBase) or len(data.batch_size) != 1:
            raise TypeError(f"a Trajectory wraps a TensorDict with one batch dim, got {type(data).__name__} "
                            f"{list(getattr(data, 'batch_size', []))}")
        if batch_size is not None and torch.Size(batch_size) != data.batch_size:
            raise ValueError(f"batch_size {list(batch_size)} does not match the data's {list(data.batch_size)}")
        if device is not None:
            data = data.to(device)
        object.__setattr__(self, "data", data)

    @property
    def length(self) -> int:
        return self.data.batch_size[0]

    @property
    def total_reward(self) -> Tensor:
        return self.get("reward").sum()

    def get(self, key: NestedKey, default: Any = ...) -> Any:
        """The entry ``key`` (root first, then under ``"next"``)."""
        keys = self.data.keys(include_nested=True)
        for k in (_k(_t(key)), ("next", *_t(key))):
            if k in keys:
                return self.data.get(k)
        if default is not ...:
            return default
        raise KeyError(f"the trajectory has no entry {key!r} (root or under 'next'); keys: {sorted(map(str, keys))}")

    def keys(self, *args: Any, **kwargs: Any) -> Any:
        return self.data.keys(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return self.get(name)
        except KeyError as err:
            raise AttributeError(str(err)) from None

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, (str, tuple)) and not isinstance(index, slice):
            if isinstance(index, str) or all(isinstance(k, str) for k in index):
                return self.get(index)
        out = self.data[index]
        return Trajectory(out) if isinstance(out, TensorDictBase) and len(out.batch_size) == 1 else out

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"Trajectory(length={self.length}, keys={sorted(self.data.keys())})"


class TrajectoryPredicate:
    """A boolean test of a :class:`Trajectory`; combine with ``&``, ``|`` and ``~``.

    Args:
        fn: ``Trajectory -> bool``.
        description: shown by ``repr``.
        keys: the entries the test reads (:meth:`required_keys`).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> t = Trajectory(TensorDict({"next": {"reward": torch.ones(4)}}, [4]))
        >>> p = (traj.reward.sum() > 3) & (traj.length < 10)
        >>> p(t), (~p)(t), sorted(p.required_keys())
        (True, False, ['reward'])
    """

    def __init__(self, fn: Callable[[Trajectory], bool], description: str = "predicate",
                 keys: frozenset | None = None) -> None:
        self.fn = fn
        self.description = description
        self.keys = frozenset() if keys is None else frozenset(keys)

    def __call__(self, trajectory: Trajectory) -> bool:
        return bool(self.fn(trajectory))

    def required_keys(self) -> frozenset:
        return self.keys

    def __and__(self, other: Any) -> TrajectoryPredicate:
        other = _as_predicate(other)
        return TrajectoryPredicate(lambda t: self(t) and other(t), f"({self.description} & {other.description})",
                                   self.keys | other.keys)

    def __or__(self, other: Any) -> TrajectoryPredicate:
        other = _as_predicate(other)
        return TrajectoryPredicate(lambda t: self(t) or other(t), f"({self.description} | {other.description})",
                                   self.keys | other.keys)

    def __invert__(self) -> TrajectoryPredicate:
        return TrajectoryPredicate(lambda t: not self(t), f"~{self.description}", self.keys)

    def __bool__(self) -> bool:
        raise TypeError("a TrajectoryPredicate has no truth value: combine predicates with &, | and ~ "
                        "(not and/or/not), and call it on a Trajectory")

    def __repr__(self) -> str:
        return f"TrajectoryPredicate({self.description})"


def _as_predicate(p: Any) -> TrajectoryPredicate:
    if isinstance(p, TrajectoryPredicate):
        return p
    if callable(p):
        return TrajectoryPredicate(p, getattr(p, "__name__", "callable"))
    raise TypeError(f"cannot combine a TrajectoryPredicate with a {type(p).__name__}")


_OPS = {"__gt__": (operator.gt, ">"), "__ge__": (operator.ge, ">="), "__lt__": (operator.lt, "<"),
        "__le__": (operator.le, "<="), "__eq__": (operator.eq, "=="), "__ne__": (operator.ne, "!=")}


class _Scalar:
    """One number per trajectory (a reduction, or the length); comparing it gives a predicate."""

    def __init__(self, fn: Callable[[Trajectory], Any], description: str, keys: frozenset) -> None:
        self.fn, self.description, self.keys = fn, description, keys

    def _compare(self, name: str, other: Any) -> TrajectoryPredicate:
        op, sym = _OPS[name]
        if isinstance(other, _Scalar):
            return TrajectoryPredicate(lambda t: bool(op(self.fn(t), other.fn(t))),
                                       f"{self.description} {sym} {other.description}", self.keys | other.keys)
        return TrajectoryPredicate(lambda t: bool(op(self.fn(t), other)), f"{self.description} {sym} {other!r}",
                                   self.keys)

    def __gt__(self, o: Any) -> TrajectoryPredicate: return self._compare("__gt__", o)  # noqa: E704
    def __ge__(self, o: Any) -> TrajectoryPredicate: return self._compare("__ge__", o)  # noqa: E704
    def __lt__(self, o: Any) -> TrajectoryPredicate: return self._compare("__lt__", o)  # noqa: E704
    def __le__(self, o: Any) -> TrajectoryPredicate: return self._compare("__le__", o)  # noqa: E704
    def __eq__(self, o: Any) -> TrajectoryPredicate: return self._compare("__eq__", o)  # type: ignore[override]  # noqa: E704
    def __ne__(self, o: Any) -> TrajectoryPredicate: return self._compare("__ne__", o)  # type: ignore[override]  # noqa: E704

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return self.description


class _Steps:
    """A bool per step (an elementwise comparison); reduce with ``.any()`` / ``.all()``."""

    def __init__(self, fn: Callable[[Trajectory], Tensor], description: str, keys: frozenset) -> None:
        self.fn, self.description, self.keys = fn, description, keys

    def any(self) -> TrajectoryPredicate:
        return TrajectoryPredicate(lambda t: bool(self.fn(t).any()), f"({self.description}).any()", self.keys)

    def all(self) -> TrajectoryPredicate:
        return TrajectoryPredicate(lambda t: bool(self.fn(t).all()), f"({self.description}).all()", self.keys)

    def __repr__(self) -> str:
        return self.description


class _Field:
    """An entry of each trajectory: compare elementwise or reduce to a number."""

    def __init__(self, key: tuple) -> None:
        self.key = key
        self.description = f"traj.{'.'.join(key)}" if len(key) == 1 else f"traj[{key!r}]"

    def _values(self, t: Trajectory) -> Tensor:
        return t.get(self.key)

    def _reduce(self, name: str, fn: Callable[[Tensor], Any]) -> _Scalar:
        return _Scalar(lambda t: fn(self._values(t)), f"{self.description}.{name}()", frozenset({self._key_name}))

    @property
    def _key_name(self) -> Any:
        return self.key[0] if len(self.key) == 1 else self.key

    def sum(self) -> _Scalar:
        return self._reduce("sum", lambda v: v.sum().item())

    def mean(self) -> _Scalar:
        return self._reduce("mean", lambda v: v.float().mean().item())

    def max(self) -> _Scalar:
        return self._reduce("max", lambda v: v.max().item())

    def min(self) -> _Scalar:
        return self._reduce("min", lambda v: v.min().item())

    def first(self) -> _Scalar:
        return self._reduce("first", lambda v: v[0].reshape(-1)[0].item() if v[0].numel() == 1 else v[0])

    def last(self) -> _Scalar:
        return self._reduce("last", lambda v: v[-1].reshape(-1)[0].item() if v[-1].numel() == 1 else v[-1])

    def any(self) -> TrajectoryPredicate:
        return TrajectoryPredicate(lambda t: bool(self._values(t).bool().any()), f"{self.description}.any()",
                                   frozenset({self._key_name}))

    def all(self) -> TrajectoryPredicate:
        return TrajectoryPredicate(lambda t: bool(self._values(t).bool().all()), f"{self.description}.all()",
                                   frozenset({self._key_name}))

    def _compare(self, name: str, other: Any) -> _Steps:
        op, sym = _OPS[name]
        return _Steps(lambda t: op(self._values(t), other), f"{self.description} {sym} {other!r}",
                      frozenset({self._key_name}))

    def __gt__(self, o: Any) -> _Steps: return self._compare("__gt__", o)  # noqa: E704
    def __ge__(self, o: Any) -> _Steps: return self._compare("__ge__", o)  # noqa: E704
    def __lt__(self, o: Any) -> _Steps: return self._compare("__lt__", o)  # noqa: E704
    def __le__(self, o: Any) -> _Steps: return self._compare("__le__", o)  # noqa: E704
    def __eq__(self, o: Any) -> _Steps: return self._compare("__eq__", o)  # type: ignore[override]  # noqa: E704
    def __ne__(self, o: Any) -> _Steps: return self._compare("__ne__", o)  # type: ignore[override]  # noqa: E704

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return self.description


class _TrajQuery:
    """Entry point of the query language (the object :data:`traj`).

    ``traj.name`` / ``traj[key]``: an entry (root first, then ``"next"``); ``traj.length``:
    the number of steps. Entries compare elementwise (reduce with ``.any()``/``.all()``) or
    reduce with ``.sum() .mean() .max() .min() .first() .last()``; reductions compare into
    :class:`TrajectoryPredicate` objects.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> t = Trajectory(TensorDict({"next": {"reward": torch.tensor([0.0, 20.0, 1.0])}}, [3]))
        >>> ((traj.reward > 10).any() & (traj.reward.last() == 1.0))(t)
        True
    """

    @property
    def length(self) -> _Scalar:
        return _Scalar(lambda t: t.length, "traj.length", frozenset())

    def __getattr__(self, name: str) -> _Field:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Field((name,))

    def __getitem__(self, key: NestedKey) -> _Field:
        return _Field(_t(key))

    def __repr__(self) -> str:
        return "traj"


traj = _TrajQuery()

_ID_KEYS = (("collector", "traj_ids"), ("traj_ids",), ("episode",))
_END_KEYS = (("next", "done"), ("next", "terminated"), ("next", "truncated"))


def iter_trajectories(data: TensorDictBase, trajectory_key: NestedKey | None = None) -> Iterator[Trajectory]:
    """Splits a flat batch of transitions ``[N]`` into :class:`Trajectory` views, in order.

    A trajectory is a run of consecutive steps with the same id under ``trajectory_key``
    (default: ``("collector", "traj_ids")``, ``"traj_ids"`` or ``"episode"``, the first one
    present). Without ids, trajectories end after each step whose ``("next", "done")``,
    ``("next", "terminated")`` or ``("next", "truncated")`` flag is set, with a
    ``UserWarning``: a trajectory whose end is not flagged merges with the next one.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> td = TensorDict({"episode": torch.tensor([0, 0, 1, 1, 1]), "obs": torch.arange(5)}, [5])
        >>> [t.obs.tolist() for t in iter_trajectories(td)]
        [[0, 1], [2, 3, 4]]
    """
    if not isinstance(data, TensorDictBase) or len(data.batch_size) != 1:
        raise TypeError("iter_trajectories takes a TensorDict of transitions with one batch dim")
    n = data.batch_size[0]
    if n == 0:
        return
    keys = data.keys(include_nested=True, leaves_only=True)
    if trajectory_key is not None:
        key = _k(_t(trajectory_key))
        if key not in keys:
            raise KeyError(f"iter_trajectories: no trajectory id entry {trajectory_key!r}")
        candidates = [key]
    else:
        candidates = [_k(k) for k in _ID_KEYS if _k(k) in keys]
    if candidates:
        ids = data.get(candidates[0]).reshape(n, -1)[:, 0].cpu()
        end = torch.ones(n, dtype=torch.bool)
        end[:-1] = ids[1:] != ids[:-1]
    else:
        flags = [data.get(k).reshape(n, -1).any(-1).cpu() for k in _END_KEYS if k in keys]  # nested: tuples
        if not flags:
            raise KeyError("iter_trajectories: the data has neither trajectory ids "
                           f"({[_k(k) for k in _ID_KEYS]}) nor end flags ('next', 'done'...)")
        warnings.warn("iter_trajectories: no trajectory ids stored; splitting at end flags (a trajectory whose "
                      "end is not flagged merges with the next one). Store trajectory ids to split reliably.",
                      UserWarning, stacklevel=2)
        end = torch.stack(flags).any(0)
        end[-1] = True
    stops = (end.nonzero().squeeze(-1) + 1).tolist()
    start = 0
    for stop in stops:
        yield Trajectory(data[start:stop])
        start = stop


def filter_trajectories(data: TensorDictBase, predicate: Callable[[Trajectory], bool] | None = None, *,
                        trajectory_key: NestedKey | None = None) -> list[Trajectory]:
    """The trajectories of ``data`` (see :func:`iter_trajectories`) for which ``predicate``
    holds (all of them when ``predicate`` is None).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> td = TensorDict({"episode": torch.tensor([0, 0, 1, 1, 1]),
        ...                  "next": {"reward": torch.tensor([1.0, 1.0, 5.0, 5.0, 5.0])}}, [5])
        >>> [t.length for t in filter_trajectories(td, traj.reward.sum() > 10)]
        [3]
    """
    out = []
    for t in iter_trajectories(data, trajectory_key):
        if predicate is None or predicate(t):
            out.append(t)
    return out
