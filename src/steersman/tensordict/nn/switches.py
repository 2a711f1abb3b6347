"""Switches of ``tensordict.nn``: ``skip_existing`` and ``composite_lp_aggregate``.

``set_skip_existing(mode)`` is a context manager (and a decorator of a ``forward``):
while it is on, :class:`TensorDictModule`, :class:`TensorDictSequential` and the
probabilistic modules return their input unchanged when all their ``out_keys`` are
already in it (a module whose ``in_keys`` and ``out_keys`` share a key always runs).
``mode`` may also be a list of keys: only modules whose ``out_keys`` are all in the list
can be skipped. ``skip_existing()`` reads the current mode (False by default).

``set_composite_lp_aggregate(mode)`` sets whether :class:`CompositeDistribution`
sums the log-probs of its parts into one tensor (``True``) or returns them per part in a
TensorDict (``False``, the default, as in tensordict 0.15); it also works with
``.set()`` for the rest of the program.

Example:
    >>> import torch
    >>> from steersman.tensordict import TensorDict
    >>> from steersman.tensordict.nn import TensorDictModule, set_skip_existing
    >>> module = TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["y"])
    >>> td = TensorDict(x=torch.zeros(()), y=torch.zeros(()))
    >>> with set_skip_existing():
    ...     module(td)["y"]  # "y" is there: the module does not run
    tensor(0.)
    >>> module(td)["y"]
    tensor(1.)
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

from .._utils import unravel_key

__all__ = ["set_skip_existing", "skip_existing", "set_composite_lp_aggregate", "composite_lp_aggregate"]


class _SkipState:
    """The process-wide mode, a per-thread override, and ``active``: a cheap flag the
    modules read on every call (True as soon as some mode other than False is set)."""

    def __init__(self) -> None:
        self.mode: Any = False
        self.local = threading.local()
        self.active = False

    def current(self) -> Any:
        stack = getattr(self.local, "stack", None)
        return stack[-1] if stack else self.mode

    def refresh(self) -> None:
        self.active = self.mode is not False or bool(getattr(self.local, "stack", None)) or (
            _THREAD_LOCAL_USERS[0] > 0
        )


_THREAD_LOCAL_USERS = [0]
_STATE = _SkipState()


def skip_existing() -> Any:
    """The current mode of :class:`set_skip_existing` (False, True or a list of keys)."""
    return _STATE.current()


def _normalize_mode(mode: Any) -> Any:
    if mode is None or isinstance(mode, bool):
        return mode
    if isinstance(mode, (str, tuple)):
        mode = [mode]
    if isinstance(mode, Sequence):
        return [unravel_key(k) for k in mode]
    raise TypeError(f"set_skip_existing: mode must be a bool, a list of keys or None, got {mode!r}")


def should_skip(module: Any, tensordict: Any, mode: Any = None) -> bool:
    """True when ``module`` may be skipped on ``tensordict`` under ``mode`` (default: current)."""
    if mode is None:
        mode = _STATE.current()
    if mode is False or mode is None:
        return False
    out_keys = [unravel_key(k) for k in getattr(module, "out_keys", [])]
    if not out_keys:
        return False
    in_keys = {unravel_key(k) for k in getattr(module, "in_keys", [])}
    if any(k in in_keys for k in out_keys):
        return False
    if mode is not True and not all(k in mode for k in out_keys):
        return False
    keys = tensordict.keys(include_nested=True)
    return all(k in keys for k in out_keys)


class set_skip_existing(contextlib.ContextDecorator):
    """Makes modules skip their call when their outputs are already in the TensorDict.

    Args:
        mode: ``True`` (default), ``False``, a list of keys (only modules whose outputs
            are all listed can be skipped) or ``None`` (decorator only: follow the
            enclosing block; as a context manager it raises ``RuntimeError``).
        in_key_attr, out_key_attr: for the decorator form, the attributes of the module
            that hold its input and output keys.

    Keyword Args:
        thread_local: if ``True``, the mode applies to the calling thread only.

    Used as a decorator of ``forward(self, tensordict, ...)``, the method returns
    ``tensordict`` without running when the outputs exist (under ``mode``).
    """

    def __init__(self, mode: Any = True, in_key_attr: str = "in_keys", out_key_attr: str = "out_keys",
                 *, thread_local: bool = False) -> None:
        self.mode = _normalize_mode(mode)
        self.in_key_attr = in_key_attr
        self.out_key_attr = out_key_attr
        self.thread_local = thread_local
        self._previous: list = []

    def __call__(self, func: Callable) -> Callable:
        mode, in_attr, out_attr = self.mode, self.in_key_attr, self.out_key_attr

        @functools.wraps(func)
        def wrapper(module: Any, tensordict: Any, *args: Any, **kwargs: Any) -> Any:
            current = _STATE.current() if mode is None else mode
            if current is not False and getattr(type(tensordict), "_is_tensor_collection", False):
                view = _KeysView(getattr(module, in_attr, []), getattr(module, out_attr, []))
                if should_skip(view, tensordict, current):
                    return tensordict
            return func(module, tensordict, *args, **kwargs)

        return wrapper

    def __enter__(self) -> set_skip_existing:
        if self.mode is None:
            raise RuntimeError("set_skip_existing(None) is only valid as a decorator")
        if self.thread_local:
            stack = getattr(_STATE.local, "stack", None)
            if stack is None:
                stack = _STATE.local.stack = []
            stack.append(self.mode)
            _THREAD_LOCAL_USERS[0] += 1
        else:
            self._previous.append(_STATE.mode)
            _STATE.mode = self.mode
        _STATE.refresh()
        return self

    def __exit__(self, *exc: Any) -> bool:
        if self.thread_local:
            _STATE.local.stack.pop()
            _THREAD_LOCAL_USERS[0] -= 1
        else:
            _STATE.mode = self._previous.pop()
        _STATE.refresh()
        return False


class _KeysView:
    __slots__ = ("in_keys", "out_keys")

    def __init__(self, in_keys: Any, out_keys: Any) -> None:
        self.in_keys, self.out_keys = in_keys, out_keys


# ----------------------------------------------------------------------------- composite log-prob
_LP = {"aggregate": False}


def composite_lp_aggregate(nowarn: bool = False) -> bool:
    """Whether :class:`CompositeDistribution` sums the log-probs of its parts (default False)."""
    return _LP["aggregate"]


class set_composite_lp_aggregate(contextlib.ContextDecorator):
    """Sets :func:`composite_lp_aggregate` for a block, or for good with ``.set()``.

    Keyword Args:
        thread_local: accepted for tensordict's signature; the value is process-wide here.
    """

    def __init__(self, mode: bool = True, *, thread_local: bool = False) -> None:
        if not isinstance(mode, bool):
            raise TypeError(f"set_composite_lp_aggregate: mode must be a bool, got {mode!r}")
        self.mode = mode
        self._previous: list = []

    def set(self) -> None:
        _LP["aggregate"] = self.mode

    def __enter__(self) -> set_composite_lp_aggregate:
        self._previous.append(_LP["aggregate"])
        _LP["aggregate"] = self.mode
        return self

    def __exit__(self, *exc: Any) -> bool:
        _LP["aggregate"] = self._previous.pop()
        return False
