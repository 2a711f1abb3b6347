"""``TypedTensorDict``: a TensorDict subclass whose fields are declared as annotations.

A subclass lists its fields like a ``TypedDict``; it gets attribute access
(``state.eta``), a keyword constructor that checks the fields, inheritance of fields,
defaults, and every TensorDict operation, whose container results keep the subclass (a
retype is one ``__class__`` assignment: the subclass adds no slots, so no data is copied).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ._utils import NO_DEFAULT
from .base import TensorDictBase, _is_non_tensor, _unwrap
from .td import TensorDict

__all__ = ["TypedTensorDict"]

_OPTIONS = ("shadow", "frozen")
_DEPRECATED = ("autocast", "nocast", "tensor_only")
_CTOR = ("batch_size", "device", "names", "non_blocking", "lock")

# methods whose container result has the same fields: it comes back as the subclass
_RETYPED = (
    "clone", "copy", "to", "cpu", "cuda", "detach", "contiguous", "apply", "named_apply", "select", "exclude",
    "reshape", "view", "flatten", "unflatten", "unsqueeze", "squeeze", "permute", "transpose", "expand",
    "expand_as", "repeat", "repeat_interleave", "flip", "roll", "narrow", "masked_fill", "masked_select", "where",
    "float", "double", "half", "bfloat16", "int", "long", "bool", "type", "empty", "gather", "unbind", "split",
    "chunk", "add", "sub", "mul", "div", "pow", "clamp", "clamp_min", "clamp_max", "maximum", "minimum", "lerp",
    "abs", "neg", "exp", "log", "sqrt", "sigmoid", "sign", "reciprocal", "sum", "mean", "std", "var", "prod",
    "amax", "amin", "norm", "cumsum", "cumprod", "update", "zero_", "share_memory_", "memmap", "memmap_like",
    "consolidate",
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
    "__pow__", "__neg__", "__abs__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__and__",
    "__or__", "__xor__", "__invert__",
)


def _retype(result: Any, cls: type) -> Any:
    if type(result) is TensorDict:
        result.__class__ = cls
        return result
    if isinstance(result, (tuple, list)) and result and all(type(r) is TensorDict for r in result):
        for r in result:
            r.__class__ = cls
    return result


def _wrap(name: str) -> Any:
    method = getattr(TensorDict, name)

    def wrapper(self, *args: Any, **kwargs: Any) -> Any:
        return _retype(method(self, *args, **kwargs), type(self))

    wrapper.__name__ = name
    wrapper.__qualname__ = f"TypedTensorDict.{name}"
    wrapper.__doc__ = method.__doc__
    return wrapper


def _field_property(name: str) -> property:
    def get(self: TensorDict) -> Any:
        v = self._tensordict.get(name)
        if v is None or not _is_non_tensor(v):
            return v
        return _unwrap(v)

    def set_(self: TensorDict, value: Any) -> None:
        self[name] = value

    return property(get, set_, doc=f"the field {name!r}")


def _rebuilt(cls: type, fn: Any, args: tuple) -> Any:
    obj = fn(*args)
    obj.__class__ = cls
    return obj


class _TypedMeta(type):
    """Gives every subclass ``__slots__ = ()``: it keeps TensorDict's memory layout, so a
    TensorDict result can be retyped in place (``__class__`` assignment needs equal layouts)."""

    def __new__(mcs, name: str, bases: tuple, ns: dict, **options: Any) -> type:
        ns.setdefault("__slots__", ())
        return super().__new__(mcs, name, bases, ns, **options)


class TypedTensorDict(TensorDict, metaclass=_TypedMeta):
    """A TensorDict subclass whose fields are declared as class annotations.

    A subclass declares fields as annotations (``eta: Tensor``), optionally with a default
    (a field whose default is ``None`` is left out of the entries until set). It gets
    attribute access (``state.eta``, also ``state["eta"]``), a constructor taking the fields
    by keyword (a missing field without default, or a name that is not a field, raises
    ``TypeError``), inherited fields, and every TensorDict operation; container results
    (``clone``, ``to``, indexing, arithmetic, ``torch.stack``...) keep the subclass.

    Keyword Args:
        batch_size, device, names, non_blocking, lock: as for :class:`TensorDict`.
        **fields: the value of each field.

    Class options, set with ``class S(TypedTensorDict["frozen"])`` or
    ``class S(TypedTensorDict, frozen=True)`` and inherited: ``shadow`` lets a field have
    the name of a TensorDict attribute (which it then hides; without it that raises
    ``AttributeError`` when the class is defined); ``frozen`` locks every instance.
    ``autocast``/``nocast``/``tensor_only`` are accepted with a ``DeprecationWarning`` and
    have no effect, as in tensordict 0.15.

    Example:
        >>> import torch
        >>> from torch import Tensor
        >>> from steersman.tensordict import TypedTensorDict
        >>> class PredictorState(TypedTensorDict):
        ...     eta: Tensor
        ...     X: Tensor
        >>> class WithMask(PredictorState):
        ...     mask: Tensor = None
        >>> s = WithMask(eta=torch.zeros(5, 3), X=torch.zeros(5, 4), batch_size=[5])
        >>> s.eta.shape, s.mask, type(s[1:3]).__name__, sorted(WithMask.fields())
        (torch.Size([5, 3]), None, 'WithMask', ['X', 'eta', 'mask'])
    """

    __slots__ = ()
    _fields: dict = {}
    _shadow = False
    _frozen = False

    def __init_subclass__(cls, **options: Any) -> None:
        for opt in _DEPRECATED:
            if options.pop(opt, None) is not None:
                warnings.warn(f"TypedTensorDict option {opt!r} has no effect (deprecated, as in tensordict)",
                              DeprecationWarning, stacklevel=2)
        for opt in _OPTIONS:
            if opt in options:
                setattr(cls, f"_{opt}", bool(options.pop(opt)))
        super().__init_subclass__(**options)
        own = {k: v for k, v in cls.__dict__.get("__annotations__", {}).items() if not k.startswith("_")}
        fields = dict(cls._fields)
        reserved = set(dir(TensorDict))
        for name in own:
            if name in _CTOR:
                raise AttributeError(f"{cls.__name__}: {name!r} is a constructor keyword, not a field name")
            if name in reserved and not cls._shadow:
                raise AttributeError(
                    f"{cls.__name__}: the field {name!r} shadows a TensorDict attribute; use "
                    f"TypedTensorDict['shadow'] (or shadow=True) to allow it"
                )
            default = cls.__dict__.get(name, NO_DEFAULT)
            if isinstance(default, property):
                default = NO_DEFAULT
            fields[name] = default
            setattr(cls, name, _field_property(name))
        cls._fields = fields

    def __class_getitem__(cls, item: Any) -> type:
        opts = (item,) if isinstance(item, str) else tuple(item)
        bad = [o for o in opts if o not in _OPTIONS]
        if bad:
            raise ValueError(f"TypedTensorDict options are {list(_OPTIONS)}, got {bad}")
        return _TypedMeta(cls.__name__, (cls,), {"__module__": cls.__module__}, **{o: True for o in opts})

    @classmethod
    def fields(cls) -> list[str]:
        """The field names, inherited ones first."""
        return list(cls._fields)

    def __init__(self, *, batch_size: Any = None, device: Any = None, names: Any = None,
                 non_blocking: bool | None = None, lock: bool = False, **fields: Any) -> None:
        cls = type(self)
        extra = sorted(set(fields) - set(cls._fields))
        if extra:
            raise TypeError(f"{cls.__name__}() got unexpected field(s): {', '.join(extra)}")
        missing = [k for k, d in cls._fields.items() if k not in fields and d is NO_DEFAULT]
        if missing:
            raise TypeError(f"{cls.__name__}() missing required field(s): {', '.join(missing)}")
        values = {}
        for k, default in cls._fields.items():
            v = fields.get(k, default)
            if v is not None:
                values[k] = v.clone() if k not in fields and isinstance(v, torch.Tensor) else v
        super().__init__(values, batch_size=batch_size, device=device, names=names,
                         non_blocking=non_blocking, lock=lock or cls._frozen)

    @classmethod
    def from_tensordict(cls, tensordict: TensorDictBase) -> TypedTensorDict:
        """Typed access to ``tensordict`` without a copy: the result shares its entries
        (writes through either are seen by both). Needs every required field."""
        if not isinstance(tensordict, TensorDict):
            raise TypeError(f"{cls.__name__}.from_tensordict shares the entries of a TensorDict; got a "
                            f"{type(tensordict).__name__} (call .to_tensordict() on it first)")
        missing = [k for k, d in cls._fields.items() if k not in tensordict._tensordict and d is NO_DEFAULT]
        if missing:
            raise TypeError(f"{cls.__name__}.from_tensordict() missing required field(s): {', '.join(missing)}")
        out = object.__new__(cls)
        out._tensordict = tensordict._tensordict
        out._batch_size = tensordict._batch_size
        out._device = tensordict._device
        out._names = tensordict._names
        out._locked = tensordict._locked or cls._frozen
        return out

    def to_tensordict(self, *args: Any, **kwargs: Any) -> TensorDict:
        """The same entries as a plain :class:`TensorDict`."""
        out = TensorDict.to_tensordict(self, *args, **kwargs)
        if type(out) is not TensorDict and isinstance(out, TensorDict):
            out.__class__ = TensorDict
        return out

    def __getitem__(self, index: Any) -> Any:
        out = TensorDict.__getitem__(self, index)
        if type(index) is str or (type(index) is tuple and index and type(index[0]) is str):
            return out  # an entry, not a batch index
        return _retype(out, type(self))

    @classmethod
    def _cat_impl(cls, vals: list, dim: int) -> Any:
        from .functional import cat

        return _retype(cat([v.to_tensordict() for v in vals], dim), cls)

    def __reduce__(self):
        fn, args = TensorDict.__reduce__(self)
        return (_rebuilt, (type(self), fn, args))

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _retype(TensorDict.__torch_function__.__func__(cls, func, types, args, kwargs), cls)


for _name in _RETYPED:
    if hasattr(TensorDict, _name) and _name not in TypedTensorDict.__dict__:
        setattr(TypedTensorDict, _name, _wrap(_name))
