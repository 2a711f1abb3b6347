"""How probabilistic modules turn a distribution into a value: the interaction type.

The interaction type is a *context*, never a module attribute: the same policy samples
during collection (``RANDOM``) and acts greedily during evaluation (``DETERMINISTIC`` or
``MODE``) without being mutated::

    with set_interaction_type(InteractionType.MODE):
        td = policy(td)

Scope: :class:`set_interaction_type` sets the type for the whole process by default
(threads started inside the block see it too, as in ``tensordict``). With
``thread_local=True`` the type applies to the calling thread only and takes precedence
over the process-wide value in that thread. Leaving a block restores the previous value,
also when the block raises. ``torch.compile`` guards on the current value, so a compiled
policy recompiles (once) when it is called under another interaction type.

TorchRL names are aliases: ``ExplorationType``, ``set_exploration_type``,
``exploration_type``.
"""

from __future__ import annotations

import enum
import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = [
    "InteractionType",
    "interaction_type",
    "set_interaction_type",
    "ExplorationType",
    "exploration_type",
    "set_exploration_type",
]

F = TypeVar("F", bound=Callable[..., Any])


class InteractionType(str, enum.Enum):
    """The rule a probabilistic module uses to get a value from a distribution.

    - ``RANDOM``: ``dist.rsample()`` if ``dist.has_rsample`` else ``dist.sample()``.
    - ``MODE``: ``dist.mode``. ``MEAN``: ``dist.mean``. ``MEDIAN``: ``dist.median``.
    - ``DETERMINISTIC``: ``dist.deterministic_sample`` when the distribution defines it
      (for an ``Independent``, also its base's); otherwise the mode for distributions with
      enumerable support (``has_enumerate_support``: ``Categorical``, ``Bernoulli``,
      ``OneHotCategorical``...) and the mean for the others (the mode if the class does
      not implement the mean).

    Strings are accepted in any case.

    Example:
        >>> from steersman.tensordict.nn import InteractionType
        >>> InteractionType("RANDOM") is InteractionType.RANDOM
        True
        >>> InteractionType.from_str("Mode")
        <InteractionType.MODE: 'mode'>
    """

    MODE = "mode"
    MEDIAN = "median"
    MEAN = "mean"
    RANDOM = "random"
    DETERMINISTIC = "deterministic"

    @classmethod
    def from_str(cls, type_str: str) -> InteractionType:
        """The member whose name matches ``type_str``, in any case."""
        return cls(type_str)

    @classmethod
    def _missing_(cls, value: object) -> InteractionType | None:
        if isinstance(value, str):
            low = value.lower()
            for member in cls:
                if member.value == low:
                    return member
        return None

    def __str__(self) -> str:
        return self.value


class _Unset:
    """Sentinel: this thread has no thread-local interaction type."""


# The process-wide value lives in a one-element list so that ``torch.compile`` guards on
# its content, and the per-thread override in a ``threading.local`` (dynamo guards both).
_PROCESS: list[InteractionType | None] = [None]
_THREAD = threading.local()


def interaction_type() -> InteractionType | None:
    """The interaction type set by :class:`set_interaction_type`, or ``None`` outside of one.

    With ``None``, each probabilistic module uses its ``default_interaction_type``.

    Example:
        >>> from steersman.tensordict.nn import interaction_type, set_interaction_type
        >>> print(interaction_type())
        None
        >>> with set_interaction_type("random"):
        ...     print(interaction_type())
        random
    """
    t = getattr(_THREAD, "type", _Unset)
    if t is not _Unset:
        return t
    return _PROCESS[0]


def _as_interaction_type(type: Any) -> InteractionType | None:
    if type is None or isinstance(type, InteractionType):
        return type
    if isinstance(type, str):
        try:
            return InteractionType(type)
        except ValueError:
            pass
    raise ValueError(
        f"{type!r} is not an interaction type; use one of "
        f"{[m.name for m in InteractionType]} (or a string naming one)"
    )


class set_interaction_type:
    """Sets the interaction type inside a block of code or a decorated function.

    Works as a context manager and as a decorator. Blocks nest; leaving one restores the
    previous value, also on exceptions. Modules are never mutated.

    Args:
        type: an :class:`InteractionType`, a string naming one (any case), or ``None``
            (each module then uses its ``default_interaction_type``). Defaults to
            ``DETERMINISTIC``.
        thread_local: if ``True``, the value applies to the calling thread only (and wins
            over the process-wide value there); otherwise to the whole process.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import (
        ...     InteractionType, ProbabilisticTensorDictModule, set_interaction_type)
        >>> policy = ProbabilisticTensorDictModule(
        ...     ["loc", "scale"], ["action"], torch.distributions.Normal)
        >>> td = TensorDict(loc=torch.zeros(3), scale=torch.ones(3))  # batch_size []
        >>> policy(td)["action"]  # default DETERMINISTIC: the mean
        tensor([0., 0., 0.])
        >>> with set_interaction_type(InteractionType.RANDOM):
        ...     policy(td)["action"].shape
        torch.Size([3])
        >>> @set_interaction_type("mode")
        ... def act(td):
        ...     return policy(td)["action"]
        >>> act(td)
        tensor([0., 0., 0.])
    """

    def __init__(
        self,
        type: InteractionType | str | None = InteractionType.DETERMINISTIC,
        *,
        thread_local: bool = False,
    ) -> None:
        self.type = _as_interaction_type(type)
        self.thread_local = thread_local
        self._prev: list[Any] = []

    def __enter__(self) -> set_interaction_type:
        if self.thread_local:
            self._prev.append(getattr(_THREAD, "type", _Unset))
            _THREAD.type = self.type
        else:
            self._prev.append(_PROCESS[0])
            if _PROCESS[0] is not self.type:  # no global write when nothing changes (a graph under
                _PROCESS[0] = self.type  # torch.compile then has no side effect to replay)
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        prev = self._prev.pop()
        if self.thread_local:
            _THREAD.type = prev  # _Unset reads as "not set" (no del: dynamo can't trace it)
        elif _PROCESS[0] is not prev:
            _PROCESS[0] = prev

    def clone(self) -> set_interaction_type:
        """A fresh context manager with the same settings."""
        return type(self)(self.type, thread_local=self.thread_local)

    def __call__(self, func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self.clone():  # a fresh one per call: safe under recursion and threads
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.type!r}, thread_local={self.thread_local})"


#: TorchRL names for the same objects.
ExplorationType = InteractionType
exploration_type = interaction_type
set_exploration_type = set_interaction_type
