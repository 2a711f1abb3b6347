"""Modules from TensorDict to TensorDict: ``TensorDictModule`` and its base.

A ``TensorDictModule`` reads its ``in_keys`` from a TensorDict, calls a plain module on
the tensors and writes the results at its ``out_keys``. Everything the call needs (the
key lists, whether outputs are selected, keyword names) is computed once at
construction; a call does dict lookups, the module call and the writes, nothing else.

Keyword calls: every module here also accepts tensors instead of a TensorDict,
``module(observation=x)`` or ``module(x)``, and then returns tensors (one tensor for one
output key, else a tuple in ``out_keys`` order). A nested key ``("a", "b")`` is passed
as ``a_b=...``. See :class:`dispatch`.

Failures leave the input TensorDict unchanged: a missing input key raises a
``KeyError`` naming the module, the key and the keys present before anything is
computed; when writing several outputs fails halfway, the outputs already written
are rolled back.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from torch import Tensor, nn

from .._utils import NestedKey, unravel_key
from ..td import TensorDict
from .switches import _STATE as _SKIP
from .switches import should_skip

__all__ = ["TensorDictModuleBase", "TensorDictModule", "WrapModule", "dispatch"]


class _Missing:
    """Sentinel: the key was absent before a write (used to roll writes back)."""


def _is_tc(obj: Any) -> bool:
    return getattr(type(obj), "_is_tensor_collection", False)


# ------------------------------------------------------------------------------ keys
def _as_key(key: Any, what: str) -> NestedKey:
    try:
        return unravel_key(key)
    except (TypeError, KeyError) as err:
        raise TypeError(f"{what}: {key!r} is not a valid key (a string or a tuple of strings)") from err


def _as_key_list(keys: Any, what: str) -> list[NestedKey]:
    if keys is None:
        return []
    if isinstance(keys, (str, tuple)):
        keys = [keys]
    out = [_as_key(k, what) for k in keys]
    return out


def _kwarg_name(key: NestedKey, separator: str = "_") -> str:
    return key if type(key) is str else separator.join(key)


def _short_repr(obj: Any, limit: int = 80) -> str:
    text = repr(obj)
    if "\n" in text or len(text) > limit:
        return f"{type(obj).__name__}(...)"
    return text


def _describe_value(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"shape {list(value.shape)} ({str(value.dtype).replace('torch.', '')})"
    return _short_repr(value, 40)


def _present_keys(td: Any) -> list:
    try:
        return sorted(td.keys(True, True), key=lambda k: k if type(k) is str else ".".join(k))
    except Exception:  # an exotic container: the top-level keys will do
        return list(td.keys())


# ------------------------------------------------------------------------------ errors
class _MissingInputKeyError(KeyError):
    """A module did not find one of its input keys (message built lazily, with positions)."""

    def __init__(self, module: Any, key: NestedKey, present: list) -> None:
        super().__init__(key)
        self.module_desc = module._describe() if hasattr(module, "_describe") else repr(module)
        self.key = key
        self.present = present
        self.where: list[str] = []

    def __str__(self) -> str:
        where = f" ({', '.join(self.where)})" if self.where else ""
        return (
            f"{self.module_desc}{where} is missing the input key {self.key!r}; "
            f"the TensorDict holds the keys {self.present}"
        )


def _missing_input(module: Any, td: Any, keys: Iterable[NestedKey]) -> KeyError:
    for key in keys:
        try:
            found = key in td
        except Exception:
            found = False
        if not found:
            return _MissingInputKeyError(module, key, _present_keys(td))
    # every key is there: the KeyError came from inside a container; name the first key
    keys = list(keys)
    return _MissingInputKeyError(module, keys[0] if keys else "?", _present_keys(td))


# ------------------------------------------------------------------------------ rollback
def _snapshot(td: Any, keys: Sequence[NestedKey]) -> list | None:
    """What must be restored if writing ``keys`` into ``td`` fails (plain TensorDicts only)."""
    if type(td) is not TensorDict:
        return None
    snap = []
    for key in keys:
        old = td.get(key, _Missing)
        if old is _Missing and type(key) is tuple:
            for i in range(1, len(key)):  # the first missing parent goes away as a whole
                prefix = key[:i] if i > 1 else key[0]
                if prefix not in td:
                    key = prefix
                    break
        snap.append((key, old))
    return snap


def _rollback(td: Any, snap: list | None) -> None:
    if not snap:
        return
    for key, old in reversed(snap):
        try:
            if old is _Missing:
                if key in td:
                    td.del_(key)
            else:
                td.set(key, old)
        except Exception:  # best effort: the original error is what matters
            pass


# ------------------------------------------------------------------------------ dispatch
def _batch_of(values: Iterable[Any]) -> list[int]:
    shapes = [v.shape for v in values if isinstance(v, Tensor)]
    if not shapes:
        return []
    out = []
    for i in range(min(len(s) for s in shapes)):
        d = shapes[0][i]
        if any(s[i] != d for s in shapes):
            break
        out.append(d)
    return out


def _inputs_from_args(
    keys: Sequence[NestedKey], names: Sequence[str], args: Sequence[Any], kwargs: dict, owner: str
) -> list:
    """The input values, positional first then by keyword name; pops the used kwargs."""
    if len(args) > len(keys):
        raise TypeError(
            f"{owner} takes {len(keys)} input tensor(s) ({list(names)}) but {len(args)} were "
            "given positionally"
        )
    values = list(args)
    for i in range(len(args), len(keys)):
        try:
            values.append(kwargs.pop(names[i]))
        except KeyError:
            raise TypeError(
                f"{owner} called with tensors is missing the input {names[i]!r} "
                f"(key {keys[i]!r}); pass it positionally or as {names[i]}=..."
            ) from None
    for i in range(len(args)):
        if names[i] in kwargs:
            raise RuntimeError(
                f"Duplicated argument in args and kwargs: {names[i]!r} was given both "
                f"positionally and by name to {owner}"
            )
    return values


def _outputs(td: Any, keys: Sequence[NestedKey]) -> Any:
    vals = tuple(td.get(k) for k in keys if k != "_")
    return vals[0] if len(vals) == 1 else vals


def _call_with_tensors(
    module: Any,
    func: Callable,
    args: Sequence[Any],
    kwargs: dict,
    source: Sequence[NestedKey],
    dest: Sequence[NestedKey],
    separator: str = "_",
    auto_batch_size: bool = False,
    rest: Sequence[Any] = (),
) -> Any:
    """Puts tensors in a new TensorDict, calls ``func(td, ...)``, returns the outputs."""
    names = [_kwarg_name(k, separator) for k in source]
    owner = type(module).__name__
    values = _inputs_from_args(source, names, args, kwargs, owner)
    bs = _batch_of(values) if auto_batch_size else []
    td = TensorDict(batch_size=bs)
    for key, value in zip(source, values):
        td.set(key, value)
    out = func(td, *rest, **kwargs)
    return _outputs(out, dest)


def _dispatch_aware(fn: Callable) -> Callable:
    """Marks a ``forward`` that handles tensor calls itself (no :class:`dispatch` wrapper)."""
    fn._td_dispatch = True  # type: ignore[attr-defined]
    return fn


class dispatch:
    """Makes a TensorDict-in / TensorDict-out function callable with tensors.

    Decorate a method (or a function) whose first argument (after ``self``) is the
    TensorDict. Called with a TensorDict (first positional argument or
    ``tensordict=``), the function runs unchanged. Called with tensors, the wrapper puts
    them in a new TensorDict at the ``source`` keys (positionally, in key order, or by
    keyword: a nested key ``("a", "b")`` is ``a_b=``), calls the function and returns the
    entries at the ``dest`` keys: a tensor for one key, else a tuple. Keyword arguments
    that name no input are passed on.

    Args:
        separator: joins the parts of a nested key into a keyword name.
        source: the input keys, or the name of the attribute holding them.
        dest: the output keys, or the name of the attribute holding them.
        auto_batch_size: if ``True`` the new TensorDict's batch size is the longest
            leading shape all inputs share; if ``False`` it is ``[]``.

    Use it bare (``@dispatch``) or with arguments (``@dispatch(source=["a"], dest=["b"])``).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> class AddOne(nn.Module):
        ...     in_keys = [("obs", "x")]
        ...     out_keys = ["y"]
        ...     @dispatch
        ...     def forward(self, tensordict):
        ...         tensordict["y"] = tensordict["obs", "x"] + 1
        ...         return tensordict
        >>> AddOne()(obs_x=torch.zeros(2))  # input [2] -> output [2]
        tensor([1., 1.])
        >>> AddOne()(torch.zeros(2))
        tensor([1., 1.])
    """

    def __new__(cls, separator: Any = "_", *args: Any, **kwargs: Any) -> Any:
        if callable(separator) and not args and not kwargs:  # used bare: @dispatch
            self = object.__new__(cls)
            self.__init__()
            return self(separator)
        return object.__new__(cls)

    def __init__(
        self,
        separator: str = "_",
        source: str | Sequence[NestedKey] = "in_keys",
        dest: str | Sequence[NestedKey] = "out_keys",
        auto_batch_size: bool = True,
    ) -> None:
        self.separator = separator
        self.source = source if isinstance(source, str) else _as_key_list(source, "dispatch source")
        self.dest = dest if isinstance(dest, str) else _as_key_list(dest, "dispatch dest")
        self.auto_batch_size = auto_batch_size

    def __call__(self, func: Callable) -> Callable:
        try:
            params = list(inspect.signature(func).parameters)
        except (TypeError, ValueError):
            params = []
        is_method = bool(params) and params[0] != "tensordict"
        cfg = self

        def keys_of(obj: Any, spec: Any) -> list:
            if isinstance(spec, str):
                if obj is None:
                    raise TypeError(f"dispatch({spec!r}) needs a method: the keys are read from self")
                return getattr(obj, spec)
            return spec

        def run(owner: Any, call: Callable, args: tuple, kwargs: dict) -> Any:
            if args and _is_tc(args[0]):
                return call(*args, **kwargs)
            td = kwargs.get("tensordict")
            if td is not None and _is_tc(td):
                return call(kwargs.pop("tensordict"), *args, **kwargs)
            source = keys_of(owner, cfg.source)
            dest = keys_of(owner, cfg.dest)
            n = min(len(args), len(source))
            return _call_with_tensors(
                owner if owner is not None else func, call, args[:n], kwargs, source, dest,
                cfg.separator, cfg.auto_batch_size, rest=args[n:],
            )

        if is_method:

            @functools.wraps(func)
            def wrapper(_self: Any, *args: Any, **kwargs: Any) -> Any:
                if args and _is_tc(args[0]):  # the common case, without the partial
                    return func(_self, *args, **kwargs)
                return run(_self, functools.partial(func, _self), args, kwargs)

        else:

            @functools.wraps(func)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                return run(None, func, args, kwargs)

        wrapper._td_dispatch = True  # type: ignore[attr-defined]
        return wrapper


# ------------------------------------------------------------------------------ base
class _OutKeysFilter:
    """Forward hook of :meth:`TensorDictModuleBase.select_out_keys` for generic modules."""

    def __init__(self, drop: list) -> None:
        self.drop = drop

    def __call__(self, module: nn.Module, args: Any, output: Any) -> Any:
        if not _is_tc(output):
            return output
        keep = set(module.in_keys)
        for key in self.drop:
            if key not in keep and key in output:
                output.del_(key)
        return output


class TensorDictModuleBase(nn.Module):
    """Base of all modules from TensorDict to TensorDict: declares ``in_keys``/``out_keys``.

    A subclass sets ``self.in_keys`` and ``self.out_keys`` (lists of keys) and writes
    ``forward(self, tensordict) -> TensorDict``. Its ``forward`` is wrapped with
    :class:`dispatch` automatically, so the module can also be called with tensors.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> class Double(TensorDictModuleBase):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.in_keys, self.out_keys = ["x"], ["y"]
        ...     def forward(self, tensordict):
        ...         tensordict["y"] = tensordict["x"] * 2
        ...         return tensordict
        >>> Double()(TensorDict(x=torch.ones(4, 3), batch_size=[4]))["y"].shape  # [4, 3]
        torch.Size([4, 3])
        >>> Double()(x=torch.ones(2))
        tensor([2., 2.])
    """

    in_keys: list
    out_keys: list

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fwd = cls.__dict__.get("forward")
        if fwd is not None and not getattr(fwd, "_td_dispatch", False):
            cls.forward = dispatch(auto_batch_size=False)(fwd)  # type: ignore[method-assign]

    def _describe(self) -> str:
        """A one-line description used in error messages."""
        return (
            f"{type(self).__name__}(in_keys={list(getattr(self, 'in_keys', []))}, "
            f"out_keys={list(getattr(self, 'out_keys', []))})"
        )

    def select_out_keys(self, *out_keys: NestedKey) -> TensorDictModuleBase:
        """Keeps only ``out_keys`` among the outputs (returns ``self``, changed in place).

        The other outputs are removed from the result unless they are also inputs.
        :meth:`reset_out_keys` undoes it.
        """
        keys = _as_key_list(list(out_keys), "select_out_keys")
        source = self.__dict__.get("_out_keys_before_select", list(self.out_keys))
        missing = [k for k in keys if k not in source]
        if missing:
            raise KeyError(f"select_out_keys: {missing} are not outputs of the module ({source})")
        self.reset_out_keys()
        self.__dict__["_out_keys_before_select"] = source
        self.out_keys = [k for k in source if k in keys]
        drop = [k for k in source if k not in keys]
        self.__dict__["_out_keys_hook"] = self.register_forward_hook(_OutKeysFilter(drop))
        return self

    def reset_out_keys(self) -> TensorDictModuleBase:
        """Undoes :meth:`select_out_keys` (returns ``self``)."""
        hook = self.__dict__.pop("_out_keys_hook", None)
        if hook is not None:
            hook.remove()
        source = self.__dict__.pop("_out_keys_before_select", None)
        if source is not None:
            self.out_keys = source
        return self

    def reset_parameters_recursive(self) -> None:
        """Calls ``reset_parameters()`` on every submodule that has it."""
        for m in self.modules():
            if m is not self and hasattr(m, "reset_parameters"):
                m.reset_parameters()


# ------------------------------------------------------------------------------ TensorDictModule
_INPLACE_MODES = {True: 0, False: 1, "empty": 2}


def _infer_dict_direction(items: list, module: Callable) -> bool:
    """True if a dict ``in_keys`` reads ``{argument: td_key}``, False for ``{td_key: argument}``."""
    keys = [k for k, _ in items]
    values = [v for _, v in items]
    if any(type(v) is tuple for v in values) and not any(type(k) is tuple for k in keys):
        return True
    if any(type(k) is tuple for k in keys):
        return False
    target = module.forward if isinstance(module, nn.Module) else module
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return False
    names = {n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    keys_are_args = all(k in names for k in keys)
    values_are_args = all(v in names for v in values)
    return keys_are_args and not values_are_args


class TensorDictModule(TensorDictModuleBase):
    """Wraps a module (or any callable) to read ``in_keys`` and write ``out_keys`` of a TensorDict.

    Args:
        module: an ``nn.Module`` or a plain callable, called with the input tensors in
            ``in_keys`` order (or as keyword arguments, see ``in_keys``).
        in_keys: the keys to read (strings or tuples for nested keys). A dict maps
            TensorDict keys to keyword arguments of the module: ``{"obs": "x"}`` calls
            ``module(x=td["obs"])`` (see ``out_to_in_map``).
        out_keys: where to write the outputs, one key per output in order (a module
            returning a tuple has several). The key ``"_"`` discards an output.
        out_to_in_map: direction of a dict ``in_keys``: ``False`` reads it as
            ``{td_key: argument}``, ``True`` as ``{argument: td_key}``. ``None`` (default)
            infers it from the module's signature when only one reading names its
            arguments (so code written for either convention of ``tensordict`` works),
            and falls back to ``{td_key: argument}``.
        inplace: ``True`` (default) writes the outputs into the input and returns it;
            ``False`` returns a new ``TensorDict`` holding only the outputs, with the batch
            size and device of the input; ``"empty"`` does the same into
            ``tensordict.empty()`` (same container type as the input). A
            ``tensordict_out`` passed to :meth:`forward` always receives the outputs.

    Shapes: any batch shape; the module sees tensors ``[*batch, *feature]`` and must
    return tensors whose leading dims are the batch dims of the TensorDict it writes to.

    Calling with tensors (``module(obs=x)`` or ``module(x)``) skips the TensorDict
    entirely and returns the outputs: a tensor for one output key, else a tuple.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> policy = TensorDictModule(torch.nn.Linear(3, 2), in_keys=["obs"], out_keys=["action"])
        >>> td = TensorDict(obs=torch.randn(4, 3), batch_size=[4])  # obs [4, 3]
        >>> policy(td)["action"].shape  # action [4, 2], written into td
        torch.Size([4, 2])
        >>> policy(obs=torch.randn(3)).shape  # keyword call: a tensor back
        torch.Size([2])
        >>> split = TensorDictModule(lambda x: x.chunk(2, -1), [("agent", "h")], ["a", "b"])
        >>> td = TensorDict({"agent": {"h": torch.zeros(4, 6)}}, batch_size=[4])
        >>> split(td)["b"].shape
        torch.Size([4, 3])
    """

    def __init__(
        self,
        module: Callable,
        in_keys: NestedKey | Sequence[NestedKey] | Mapping,
        out_keys: NestedKey | Sequence[NestedKey],
        out_to_in_map: bool | None = None,
        inplace: bool | str = True,
        method: str | None = None,
        method_kwargs: Mapping[str, Any] | None = None,
        strict: bool = True,
        get_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if not callable(module) and method is None:
            raise TypeError(f"TensorDictModule needs a callable module, got {type(module).__name__}")
        if not (inplace is True or inplace is False or inplace == "empty"):
            raise ValueError(f"inplace must be True, False or 'empty', got {inplace!r}")
        if method is not None and not callable(getattr(module, method, None)):
            raise AttributeError(f"TensorDictModule: {type(module).__name__} has no method {method!r}")
        self.method = method
        self.method_kwargs = dict(method_kwargs or {})
        #: strict=False passes None for a missing input (tensordict's default); True raises
        self.strict = bool(strict)
        self.get_kwargs = dict(get_kwargs or {})
        self.module = module  # registered if it is an nn.Module, a plain attribute otherwise
        self.__dict__["_call"] = self._target(module)  # direct reference for the hot path
        self.inplace = inplace
        self._inplace_mode = _INPLACE_MODES[inplace]
        self._out_to_in_map = out_to_in_map
        self._set_in_keys(in_keys)
        self._selected: list | None = None
        self._set_out_keys(out_keys)

    # -- keys ---------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "module":
            self.__dict__["_call"] = self._target(value)

    def _target(self, module: Any) -> Callable:
        """What a call runs: ``module`` (or its ``method``), with ``method_kwargs`` bound."""
        fn = module if self.__dict__.get("method") is None else getattr(module, self.__dict__["method"])
        kwargs = self.__dict__.get("method_kwargs")
        return functools.partial(fn, **kwargs) if kwargs else fn

    def _set_in_keys(self, in_keys: Any) -> None:
        if isinstance(in_keys, Mapping):
            items = list(in_keys.items())
            inverted = self._out_to_in_map
            if inverted is None:
                inverted = _infer_dict_direction(items, self.module)
            pairs = [(v, k) for k, v in items] if inverted else items
            keys, names = [], []
            for td_key, arg in pairs:
                if not isinstance(arg, str):
                    raise TypeError(
                        f"in_keys: the keyword argument {arg!r} must be a string (out_to_in_map="
                        f"{self._out_to_in_map})"
                    )
                keys.append(_as_key(td_key, "in_keys"))
                names.append(arg)
            self._kwarg_names: tuple | None = tuple(names)
        else:
            keys = _as_key_list(in_keys, "in_keys")
            self._kwarg_names = None
        self._in_keys = keys
        self._in_keys_t = tuple(keys)
        self._n_in = len(keys)
        self._dispatch_names = [_kwarg_name(k) for k in keys]

    def _set_out_keys(self, out_keys: Any) -> None:
        keys = _as_key_list(out_keys, "out_keys")
        if not keys:
            raise ValueError("TensorDictModule needs at least one out_key")
        real = [k for k in keys if k != "_"]
        if len(set(real)) != len(real):
            raise ValueError(f"out_keys has duplicates: {keys}")
        self._out_keys_source = keys
        self._n_out = len(keys)
        if self._selected is not None and not all(k in keys for k in self._selected):
            self._selected = None
        self._refresh_write_plan()

    def _refresh_write_plan(self) -> None:
        sel = self._selected
        plan = tuple(
            (i, k) for i, k in enumerate(self._out_keys_source)
            if k != "_" and (sel is None or k in sel)
        )
        self._write_plan = plan
        self._written_keys = [k for _, k in plan]
        self._write_single = plan[0][1] if self._n_out == 1 and plan else None

    @property
    def in_keys(self) -> list[NestedKey]:
        return self._in_keys

    @in_keys.setter
    def in_keys(self, value: Any) -> None:
        self._set_in_keys(value)

    @property
    def out_keys(self) -> list[NestedKey]:
        if self._selected is None:
            return self._out_keys_source
        return [k for k in self._out_keys_source if k in self._selected]

    @out_keys.setter
    def out_keys(self, value: Any) -> None:
        self._set_out_keys(value)

    @property
    def out_keys_source(self) -> list[NestedKey]:
        """All the outputs of the module, selected or not."""
        return self._out_keys_source

    def select_out_keys(self, *out_keys: NestedKey) -> TensorDictModule:
        """Writes only ``out_keys`` among the outputs (returns ``self``, changed in place).

        The other outputs are computed but never written (an entry already in the input
        under such a key is left as it is). :meth:`reset_out_keys` undoes it.

        Example:
            >>> import torch
            >>> m = TensorDictModule(lambda x: (x + 1, x - 1), ["x"], ["a", "b"])
            >>> m.select_out_keys("b").out_keys
            ['b']
            >>> m(x=torch.zeros(2))  # only the selected output comes back
            tensor([-1., -1.])
        """
        keys = _as_key_list(list(out_keys), "select_out_keys")
        missing = [k for k in keys if k not in self._out_keys_source]
        if missing:
            raise KeyError(
                f"select_out_keys: {missing} are not outputs of {self._describe()}; "
                f"its outputs are {self._out_keys_source}"
            )
        self._selected = keys
        self._refresh_write_plan()
        return self

    def reset_out_keys(self) -> TensorDictModule:
        """Writes all the outputs again (undoes :meth:`select_out_keys`)."""
        self._selected = None
        self._refresh_write_plan()
        return self

    # -- call -----------------------------------------------------------------------
    def _describe(self) -> str:
        return (
            f"{type(self).__name__}(module={_short_repr(self.module)}, "
            f"in_keys={self._in_keys}, out_keys={self.out_keys})"
        )

    def _count_error(self, got: Any) -> RuntimeError:
        n = len(got) if isinstance(got, (tuple, list)) else 1
        return RuntimeError(
            f"{self._describe()}: the module returned {n} value(s) but there are "
            f"{self._n_out} out_keys {self._out_keys_source}; give one out_key per output "
            "(use '_' to discard one)"
        )

    def _call_tensors(self, first: Any, args: tuple, kwargs: dict) -> Any:
        pos = args if first is None else (first, *args)
        values = _inputs_from_args(
            self._in_keys, self._dispatch_names, pos, kwargs, type(self).__name__
        )
        if self._kwarg_names is None:
            out = self._call(*values, **kwargs)
        else:
            out = self._call(**dict(zip(self._kwarg_names, values)), **kwargs)
        if self._n_out == 1:
            if type(out) is tuple or type(out) is list:
                if len(out) != 1:
                    raise self._count_error(out)
                out = out[0]
            return out if self._write_plan else ()
        if not isinstance(out, (tuple, list)) or len(out) != self._n_out:
            raise self._count_error(out)
        vals = tuple(out[i] for i, _ in self._write_plan)
        return vals[0] if len(vals) == 1 else vals

    @_dispatch_aware
    def forward(
        self, tensordict: Any = None, *args: Any, tensordict_out: Any = None, **kwargs: Any
    ) -> Any:
        """Reads ``in_keys``, calls the module, writes ``out_keys``; returns the TensorDict.

        Called with tensors instead of a TensorDict, returns the outputs (see the class
        docstring). Extra keyword arguments are passed to the module.
        """
        if not getattr(type(tensordict), "_is_tensor_collection", False):
            return self._call_tensors(tensordict, args, kwargs)
        if _SKIP.active and should_skip(self, tensordict):
            return tensordict
        if args:
            if len(args) > 1 or tensordict_out is not None:
                raise TypeError("forward(tensordict, tensordict_out=None, **kwargs): too many arguments")
            tensordict_out = args[0]
        keys = self._in_keys_t
        try:
            n = self._n_in
            if n == 1:
                inputs = (tensordict[keys[0]],)
            elif n == 2:
                inputs = (tensordict[keys[0]], tensordict[keys[1]])
            else:
                inputs = tuple([tensordict[k] for k in keys])
        except KeyError:
            if self.strict:
                raise _missing_input(self, tensordict, keys) from None
            inputs = tuple(tensordict.get(k, self.get_kwargs.get("default")) for k in keys)
        if self._kwarg_names is None:
            out = self._call(*inputs, **kwargs)
        else:
            out = self._call(**dict(zip(self._kwarg_names, inputs)), **kwargs)

        if tensordict_out is None:
            mode = self._inplace_mode
            if mode == 0:
                tensordict_out = tensordict
            elif mode == 1:
                tensordict_out = TensorDict(
                    batch_size=tensordict.batch_size, device=tensordict.device
                )
            else:
                tensordict_out = tensordict.empty()
        if self._n_out == 1:
            if type(out) is tuple or type(out) is list:
                if len(out) != 1:
                    raise self._count_error(out)
                out = out[0]
            key = self._write_single
            if key is not None:
                tensordict_out.set(key, out)
            return tensordict_out
        if not isinstance(out, (tuple, list)) or len(out) != self._n_out:
            raise self._count_error(out)
        snap = _snapshot(tensordict_out, self._written_keys)
        try:
            for i, key in self._write_plan:
                tensordict_out.set(key, out[i])
        except BaseException:
            _rollback(tensordict_out, snap)
            raise
        return tensordict_out

    def extra_repr(self) -> str:
        extra = f"in_keys={self._in_keys}, out_keys={self.out_keys}"
        if self._kwarg_names is not None:
            extra += f", kwargs={list(self._kwarg_names)}"
        if not isinstance(self.module, nn.Module):
            extra = f"module={self.module!r}, " + extra
        if self.inplace is not True:
            extra += f", inplace={self.inplace!r}"
        return extra


class WrapModule(TensorDictModuleBase):
    """Turns a function ``td -> td`` into a module (e.g. to put it in a sequence).

    Args:
        func: called with the TensorDict; returns a TensorDict.
        in_keys, out_keys: declared keys (used by sequences to compute their own keys and
            by keyword calls). Default: none.
        inplace: if ``True``, the entries of the returned TensorDict are written into the
            input, which is returned.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> def add(td):
        ...     td["z"] = td["x"] + td["y"]
        ...     return td
        >>> m = WrapModule(add, in_keys=["x", "y"], out_keys=["z"])
        >>> m(TensorDict(x=torch.ones(3, 2), y=torch.ones(3, 2), batch_size=[3]))["z"].shape
        torch.Size([3, 2])
        >>> m(x=torch.ones(1), y=torch.ones(1))
        tensor([2.])
    """

    def __init__(
        self,
        func: Callable[[Any], Any],
        in_keys: Sequence[NestedKey] | None = None,
        out_keys: Sequence[NestedKey] | None = None,
        *,
        inplace: bool = False,
    ) -> None:
        super().__init__()
        if not callable(func):
            raise TypeError(f"WrapModule needs a callable, got {type(func).__name__}")
        self.func = func
        self.in_keys = _as_key_list(in_keys, "in_keys")
        self.out_keys = _as_key_list(out_keys, "out_keys")
        self.inplace = inplace

    def forward(self, tensordict: Any) -> Any:
        result = self.func(tensordict)
        if self.inplace and result is not tensordict:
            tensordict.update(result)
            return tensordict
        return result

    def _describe(self) -> str:
        return f"WrapModule(func={_short_repr(self.func)}, in_keys={self.in_keys}, out_keys={self.out_keys})"

    def extra_repr(self) -> str:
        return f"func={self.func!r}, in_keys={self.in_keys}, out_keys={self.out_keys}"


def _as_td_module(module: Any, owner: str, index: int) -> TensorDictModuleBase | nn.Module:
    """A sequence member: TensorDict modules as they are, plain functions wrapped."""
    if isinstance(module, TensorDictModuleBase):
        return module
    if isinstance(module, nn.Module):
        if hasattr(module, "in_keys") and hasattr(module, "out_keys"):
            return module
        raise TypeError(
            f"{owner}: module {index} ({type(module).__name__}) is a plain nn.Module; wrap it in "
            "TensorDictModule(module, in_keys=..., out_keys=...)"
        )
    if callable(module):
        return WrapModule(module)
    raise TypeError(f"{owner}: module {index} is not callable ({type(module).__name__})")



class as_tensordict_module:
    """Decorator: turns a function (or a method) into a TensorDict module.

    Called with a TensorDict, the function reads ``in_keys`` and writes ``out_keys``
    (returning the TensorDict); called with tensors, it returns the outputs. On a
    method, the instance is passed as ``self``.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> @as_tensordict_module(in_keys="c", out_keys="d")
        ... def add_one(c):
        ...     return c + 1
        >>> add_one(TensorDict(c=torch.zeros(())))["d"]
        tensor(1.)
        >>> add_one(c=torch.zeros(2))
        tensor([1., 1.])
    """

    def __init__(self, *, in_keys: Any, out_keys: Any) -> None:
        self.in_keys, self.out_keys = in_keys, out_keys

    def __call__(self, fn: Callable) -> Any:
        return _DecoratedModule(fn, self.in_keys, self.out_keys)


class _DecoratedModule:
    """The result of :class:`as_tensordict_module`: callable, and a descriptor on classes."""

    def __init__(self, fn: Callable, in_keys: Any, out_keys: Any) -> None:
        functools.update_wrapper(self, fn)
        self._fn, self._in_keys, self._out_keys = fn, in_keys, out_keys
        self._module = TensorDictModule(fn, in_keys, out_keys)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._module(*args, **kwargs)

    def __get__(self, instance: Any, owner: type) -> Any:
        if instance is None:
            return self
        return TensorDictModule(functools.partial(self._fn, instance), self._in_keys, self._out_keys)
