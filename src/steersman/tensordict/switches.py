"""Global switches of the container, as tensordict names them.

Each ``set_<switch>(mode)`` is a context manager and a decorator that sets the switch
for a block (the previous value comes back at the end), and ``set_<switch>(mode).set()``
sets it for the rest of the program; the function of the same name without ``set_``
reads the current value.

=============================  =======  ==================================================
switch                         default  effect when on
=============================  =======  ==================================================
``list_to_stack``              True     a list of tensors (same shape, nested lists too)
                                        given to the constructor, ``set`` or
                                        ``td[key] = ...`` is stacked into one tensor;
                                        off: it is kept as a ``NonTensorStack``
``lazy_legacy``                False    ``torch.stack`` of containers returns a
                                        ``LazyStackedTensorDict`` (shape ops stay dense
                                        here: their values are the same either way)
``capture_non_tensor_stack``   False    stacking equal ``NonTensorData`` gives one
                                        ``NonTensorData``; off: a ``NonTensorStack``
``get_defaults_to_none``       False    ``td.get(missing)`` returns None instead of
                                        raising KeyError (``td[missing]`` still raises)
=============================  =======  ==================================================

``get_defaults_to_none`` is off by default here, where tensordict 0.15 has it on: a
missing key is an explicit error in steersman. ``set_get_defaults_to_none(True)`` at the
top of a script gives tensordict's behaviour (the call sets it at once, as tensordict's
does; used with ``with`` it is restored at the end of the block). The environment
variable ``LAZY_LEGACY_OP=1`` turns ``lazy_legacy`` on at import, as in tensordict.

Print options (:func:`set_printoptions`, :func:`get_printoptions`) follow the same
pattern and control ``repr(td)``.

Example:
    >>> import torch
    >>> from steersman.tensordict import TensorDict, set_list_to_stack, list_to_stack
    >>> list_to_stack()
    True
    >>> TensorDict({"a": [torch.zeros(2), torch.ones(2)]}, [2])["a"].shape
    torch.Size([2, 2])
    >>> with set_list_to_stack(False):
    ...     type(TensorDict({"a": [torch.zeros(2), torch.ones(2)]}, [2]).get("a")).__name__
    'NonTensorStack'
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

__all__ = [
    "set_list_to_stack",
    "list_to_stack",
    "set_lazy_legacy",
    "lazy_legacy",
    "set_capture_non_tensor_stack",
    "capture_non_tensor_stack",
    "set_get_defaults_to_none",
    "get_defaults_to_none",
    "set_printoptions",
    "get_printoptions",
]

#: the current value of every switch (read by the container code where it applies)
STATE: dict[str, Any] = {
    "list_to_stack": True,
    "lazy_legacy": os.environ.get("LAZY_LEGACY_OP", "0").lower() in ("1", "true", "yes", "on"),
    "capture_non_tensor_stack": False,
    "get_defaults_to_none": False,
}


class _Switch(contextlib.ContextDecorator):
    """A context manager / decorator that sets ``STATE[name]`` to ``mode`` for a block."""

    name = ""

    def __init__(self, mode: bool = True) -> None:
        if not isinstance(mode, bool):
            raise TypeError(f"{type(self).__name__}: mode must be a bool, got {mode!r}")
        self.mode = mode
        self._previous: list = []

    def set(self) -> None:
        """Sets the switch for the rest of the program."""
        STATE[self.name] = self.mode

    def __enter__(self) -> _Switch:
        self._previous.append(STATE[self.name])
        STATE[self.name] = self.mode
        return self

    def __exit__(self, *exc: Any) -> bool:
        STATE[self.name] = self._previous.pop()
        return False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.mode})"


class set_list_to_stack(_Switch):
    """Stack lists of tensors given as entries (on by default). See the module docstring."""

    name = "list_to_stack"


class set_lazy_legacy(_Switch):
    """``torch.stack`` of containers returns a lazy stack while on. See the module docstring."""

    name = "lazy_legacy"


class set_capture_non_tensor_stack(_Switch):
    """Stacking equal ``NonTensorData`` gives one ``NonTensorData`` while on."""

    name = "capture_non_tensor_stack"


class set_get_defaults_to_none(_Switch):
    """``td.get(missing)`` returns None; the call sets it at once (like tensordict's).

    Used with ``with``, the value from before the call comes back at the end of the block.

    Example:
        >>> from steersman.tensordict import TensorDict, set_get_defaults_to_none
        >>> td = TensorDict({}, [])
        >>> with set_get_defaults_to_none(True):
        ...     print(td.get("missing"))
        None
    """

    name = "get_defaults_to_none"

    def __init__(self, set_to_none: bool = True) -> None:
        super().__init__(set_to_none)
        self._previous.append(STATE[self.name])
        STATE[self.name] = set_to_none

    def __enter__(self) -> set_get_defaults_to_none:
        return self

    def __exit__(self, *exc: Any) -> bool:
        if self._previous:
            STATE[self.name] = self._previous.pop()
        return False


def list_to_stack(allow_none: bool = False) -> bool:
    """Whether lists of tensors given as entries are stacked (see :class:`set_list_to_stack`)."""
    return STATE["list_to_stack"]


def lazy_legacy(allow_none: bool = False) -> bool:
    """Whether ``torch.stack`` of containers returns a lazy stack."""
    return STATE["lazy_legacy"]


def capture_non_tensor_stack(allow_none: bool = False) -> bool:
    """Whether stacking equal ``NonTensorData`` gives one ``NonTensorData``."""
    return STATE["capture_non_tensor_stack"]


def get_defaults_to_none(set_to_none: bool | None = None) -> bool:
    """Whether ``td.get(missing)`` returns None (see :class:`set_get_defaults_to_none`)."""
    return STATE["get_defaults_to_none"]


# ----------------------------------------------------------------------------- print options
_PRINT_DEFAULTS: dict[str, Any] = {
    "show_batch_size": True,
    "show_device": True,
    "show_is_shared": True,
    "show_shape": True,
    "show_field_device": True,
    "show_dtype": True,
    "show_field_is_shared": True,
    "show_grad": False,
    "show_is_contiguous": False,
    "show_is_view": False,
    "show_storage_size": False,
    "plain": False,
    "sort_keys": "insertion",
    "compact": False,
    "html": True,
}
#: the current print options (``repr`` of a container reads them)
PRINT_OPTIONS: dict[str, Any] = dict(_PRINT_DEFAULTS)

_SORTS = ("insertion", "alphabetical")


class set_printoptions(contextlib.ContextDecorator):
    """Sets what ``repr(td)`` shows, for a block (or for good with ``.set()``).

    Options not passed keep their value. ``verbose=False`` hides the device, dtype and
    ``is_shared`` of every entry unless an option names them. ``compact=True`` prints one
    line per entry as ``name: f32[3]`` (dtype and feature dims). ``sort_keys`` is
    ``"insertion"`` (steersman's default) or ``"alphabetical"``. ``show_grad`` adds
    ``requires_grad`` to each tensor; ``show_is_contiguous`` its contiguity;
    ``show_storage_size`` the bytes of its storage. ``html`` and ``plain`` are accepted
    and stored (there is no notebook renderer here).

    Raises:
        TypeError: for an unknown option (named), or a ``sort_keys`` not in the list.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict, set_printoptions
        >>> td = TensorDict({"a": torch.zeros(3, 2)}, [3])
        >>> with set_printoptions(compact=True):
        ...     print(td)
        TensorDict(batch_size=[3], fields={a: f32[2]})
    """

    def __init__(self, *, verbose: bool = True, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - set(_PRINT_DEFAULTS))
        if unknown:
            raise TypeError(f"set_printoptions: unknown option(s) {unknown}; known: {sorted(_PRINT_DEFAULTS)}")
        if "sort_keys" in kwargs and kwargs["sort_keys"] not in _SORTS:
            raise TypeError(f"set_printoptions: sort_keys must be one of {_SORTS}, got {kwargs['sort_keys']!r}")
        opts: dict[str, Any] = {}
        if not verbose:
            opts.update(show_field_device=False, show_dtype=False, show_field_is_shared=False,
                        show_device=False, show_is_shared=False)
        opts.update(kwargs)
        self.options = opts
        self._previous: list = []

    def set(self) -> None:
        PRINT_OPTIONS.update(self.options)

    def __enter__(self) -> set_printoptions:
        self._previous.append(dict(PRINT_OPTIONS))
        PRINT_OPTIONS.update(self.options)
        return self

    def __exit__(self, *exc: Any) -> bool:
        PRINT_OPTIONS.clear()
        PRINT_OPTIONS.update(self._previous.pop())
        return False


def get_printoptions() -> dict[str, Any]:
    """A copy of the current print options."""
    return dict(PRINT_OPTIONS)
