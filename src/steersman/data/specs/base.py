"""``TensorSpec``: what every spec shares (shape, dtype, device, membership, shape ops).

A spec describes the tensors an env reads or writes: their shape, dtype, device and
the set of valid values. Subclasses provide sampling (``rand``), membership
(``_values_in`` for the fast ``is_in``, ``_values_report`` for the error message of
``assert_is_in``) and projection; the shape operations (indexing, ``expand``,
``squeeze``, ``unsqueeze``, ``reshape``, ``unbind``) and device/dtype moves are
written once here.

Layout of a spec's shape: ``[*batch, *event]``. Shape operations act on the batch
part only. ``event`` is empty for element-wise specs (``Bounded``, ``Categorical``)
and is the last dim for specs whose last dim is one value (``OneHot``: its ``n``
classes; ``MultiCategorical``: its sub-actions; ``Binary``: its ``n`` bits).
Per-element tensors of a spec (``low``/``high``, ``mask``, ``nvec``) are laid out as
``[*batch, *tail]``, so one index or ``expand`` applies to all of them alike.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any, Union

import numpy as np
import torch
from torch import Tensor

from steersman.tensordict._utils import indexed_batch_size, normalize_index

__all__ = [
    "TensorSpec",
    "ContinuousBox",
    "CategoricalBox",
    "DEFAULT_SHAPE",
    "ShapeLike",
]

ShapeLike = Union[int, Sequence[int], torch.Size, None]  # noqa: UP007 (runtime alias, py3.10)

#: default shape of ``Unbounded`` and ``NonTensor`` specs (as in TorchRL).
DEFAULT_SHAPE = torch.Size((1,))

_KIND_NAMES = {"b": "boolean", "i": "integer", "f": "floating-point", "c": "complex"}


def _kind_of(dtype: torch.dtype) -> str:
    if dtype is torch.bool:
        return "b"
    if dtype.is_floating_point:
        return "f"
    if dtype.is_complex:
        return "c"
    return "i"


_KINDS: dict[torch.dtype, str] = {
    d: _kind_of(d) for d in vars(torch).values() if isinstance(d, torch.dtype)
}


def dtype_kind(dtype: torch.dtype) -> str:
    """``"b"`` (bool), ``"i"`` (integer), ``"f"`` (floating) or ``"c"`` (complex)."""
    k = _KINDS.get(dtype)
    return k if k is not None else _kind_of(dtype)


def as_shape(shape: Any, name: str = "shape") -> torch.Size:
    """``None`` -> ``[]``; an int -> ``[int]``; a sequence or ``torch.Size`` -> ``torch.Size``."""
    if shape is None:
        return torch.Size(())
    if type(shape) is torch.Size:
        return shape
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    try:
        out = torch.Size([int(s) for s in shape])
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name} must be an int or a sequence of ints, got {shape!r}") from err
    if any(s < 0 for s in out):
        raise ValueError(f"{name} must have non-negative dims, got {list(out)}")
    return out


def shape_args(args: tuple) -> tuple:
    """``f(4, 3)``, ``f((4, 3))`` and ``f(torch.Size([4, 3]))`` all give ``(4, 3)``."""
    if len(args) == 1 and not isinstance(args[0], (int, np.integer)):
        return tuple(args[0])
    return args


def as_device(device: Any) -> torch.device:
    """A ``torch.device``; ``None`` gives torch's default device; ``"cuda"`` gets its index."""
    if device is None:
        return torch.get_default_device()
    if isinstance(device, int):
        device = torch.device("cuda", device)
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def ends_with(shape: torch.Size, suffix: torch.Size) -> bool:
    """True if ``shape`` is ``[*any, *suffix]``."""
    n = len(suffix)
    return len(shape) >= n and shape[len(shape) - n :] == suffix


def fmt_tensor(t: Tensor | None) -> str:
    """A short text for a per-element tensor in a repr: its values if few, else a summary."""
    if t is None:
        return "None"
    if t.numel() <= 6:
        return str(t.tolist())
    if t.numel() and bool((t == t.reshape(-1)[0]).all()):
        return f"{t.reshape(-1)[0].item()} (shape={list(t.shape)})"
    if t.dtype is torch.bool:
        return f"Tensor(shape={list(t.shape)}, dtype=bool, {int(t.sum())} True)"
    return f"Tensor(shape={list(t.shape)}, min={t.min().item()}, max={t.max().item()})"


def first_index(bad: Tensor) -> tuple[int, ...]:
    """The index of the first True element of a bool tensor, as a tuple."""
    return tuple(bad.nonzero()[0].tolist())


def to_tensor(val: Any, dtype: torch.dtype | None = None, device: Any = None) -> Tensor:
    """``torch.as_tensor`` that also takes read-only or negatively-strided numpy arrays."""
    if isinstance(val, Tensor):
        return val.to(device=device, dtype=dtype)
    if isinstance(val, np.ndarray):
        if not val.flags.writeable or any(s < 0 for s in val.strides):
            val = np.array(val, copy=True)
    elif isinstance(val, (list, tuple)) and val and any(
        isinstance(v, (np.ndarray, Tensor)) for v in val
    ):
        val = np.stack([np.asarray(v.cpu() if isinstance(v, Tensor) else v) for v in val])
    return torch.as_tensor(val, dtype=dtype, device=device)


class ContinuousBox:
    """The space of a continuous (or integer-ranged) spec: element-wise ``low``/``high``.

    Example:
        >>> from steersman.data import Bounded
        >>> box = Bounded(-1.0, 1.0, shape=(2,)).space
        >>> box.low, box.high
        (tensor([-1., -1.]), tensor([1., 1.]))
    """

    def __init__(self, low: Tensor, high: Tensor) -> None:
        self.low = low
        self.high = high

    def __iter__(self):
        return iter((self.low, self.high))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ContinuousBox)
            and torch.equal(self.low, other.low)
            and torch.equal(self.high, other.high)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ContinuousBox(low={fmt_tensor(self.low)}, high={fmt_tensor(self.high)})"


class CategoricalBox:
    """The space of a categorical spec: ``n`` classes, ``0 .. n-1``.

    Example:
        >>> from steersman.data import Categorical
        >>> Categorical(4).space.n
        4
    """

    def __init__(self, n: int) -> None:
        self.n = n

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CategoricalBox) and self.n == other.n

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"CategoricalBox(n={self.n})"


class TensorSpec:
    """Base class of every spec: the shape, dtype, device and valid values of a tensor.

    Shapes: a spec of shape ``S`` describes tensors of shape ``S``; ``rand(shape=B)``
    gives a tensor of shape ``[*B, *S]``, and ``is_in`` accepts any leading dims.

    Subclasses: :class:`Unbounded`, :class:`Bounded`, :class:`Categorical`,
    :class:`OneHot`, :class:`MultiCategorical`, :class:`MultiOneHot`, :class:`Binary`,
    :class:`NonTensor`, :class:`Composite`.

    Args (for subclasses written as in TorchRL, which call
    ``super().__init__(shape, space, device, dtype, domain)``; positional or keyword):
        shape: the shape of one value.
        space: what the values can be (e.g. a :class:`ContinuousBox`); returned by
            :attr:`space` (the built-in specs compute theirs).
        device: default: torch's default device.
        dtype: default ``torch.float32``.
        domain: ``"continuous"``, ``"discrete"``... (default: the class's ``domain``);
            :attr:`is_discrete` follows it.
        _encode_memo_dict: TorchRL's cache of ``encode`` functions; accepted and kept,
            unused here (``encode`` has no per-call setup to cache).

    Example:
        >>> import torch
        >>> from steersman.data import Bounded, TensorSpec
        >>> spec = Bounded(low=-1.0, high=1.0, shape=(3,))
        >>> isinstance(spec, TensorSpec)
        True
        >>> x = spec.rand((5,))                    # 5 samples
        >>> x.shape, spec.is_in(x)
        (torch.Size([5, 3]), True)
        >>> spec.is_in(torch.full((3,), 2.0))
        False
        >>> spec.project(torch.full((3,), 2.0))
        tensor([1., 1., 1.])
        >>> spec.expand(4, 3).shape, spec.unsqueeze(0).shape
        (torch.Size([4, 3]), torch.Size([1, 3]))
    """

    #: ``"continuous"``, ``"discrete"``, ``"composite"`` or ``"non_tensor"``.
    domain: str = "continuous"
    #: how many trailing dims form one value (not touched by shape ops).
    _event_ndim: int = 0
    #: names of the per-element tensors laid out as ``[*batch, *tail]`` (may be None).
    _tensor_attrs: tuple[str, ...] = ()
    #: names of other attributes compared by ``==``.
    _eq_fields: tuple[str, ...] = ()

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        """``torch.stack(specs, dim)``: a dense spec if all are equal, else a lazy stack
        (:class:`~steersman.data.Stacked`, :class:`~steersman.data.StackedComposite`)."""
        if func is torch.stack:
            from .stacked import stack_specs

            return stack_specs(*args, **(kwargs or {}))
        return NotImplemented

    def __init__(
        self,
        shape: ShapeLike,
        space: Any = None,
        device: Any = None,
        dtype: torch.dtype | None = torch.float32,
        domain: str = "",
        _encode_memo_dict: dict | None = None,
    ) -> None:
        self._shape = as_shape(shape)
        self._device = as_device(device)
        self._dtype = dtype
        self._kind = dtype_kind(dtype) if dtype is not None else None
        if space is not None:
            self._space = space
        if domain:
            if not isinstance(domain, str):
                raise TypeError(
                    f"{type(self).__name__}: domain must be a str such as 'continuous' or "
                    f"'discrete', got {type(domain).__name__}"
                )
            self.domain = domain
        if _encode_memo_dict is not None:
            if not isinstance(_encode_memo_dict, dict):
                raise TypeError(
                    f"{type(self).__name__}: _encode_memo_dict must be a dict, got "
                    f"{type(_encode_memo_dict).__name__}"
                )
            self._encode_memo_dict = _encode_memo_dict

    @property
    def space(self) -> Any:
        """The set of valid values (a :class:`ContinuousBox`, a :class:`CategoricalBox`), or
        the ``space`` given to the constructor; None for specs without one."""
        return getattr(self, "_space", None)

    # ------------------------------------------------------------------ properties
    @property
    def shape(self) -> torch.Size:
        """The shape of one value described by the spec."""
        return self._shape

    @property
    def dtype(self) -> torch.dtype | None:
        return self._dtype

    @property
    def device(self) -> torch.device | None:
        return self._device

    @property
    def ndim(self) -> int:
        return len(self._shape)

    def ndimension(self) -> int:
        return len(self._shape)

    @property
    def is_discrete(self) -> bool:
        """True for specs of countable values (``domain == "discrete"``)."""
        return self.domain == "discrete"

    def _refresh(self) -> None:
        """Recomputes the cached values derived from the spec's attributes."""
        self._kind = dtype_kind(self._dtype) if self._dtype is not None else None

    def _full_shape(self, shape: ShapeLike) -> torch.Size:
        if shape is None:
            return self._shape
        return as_shape(shape) + self._shape

    # ------------------------------------------------------------------ sampling
    def rand(self, shape: ShapeLike = None) -> Any:
        """A random value of the spec, with extra leading dims ``shape``: ``[*shape, *self.shape]``."""
        raise NotImplementedError

    def zero(self, shape: ShapeLike = None) -> Any:
        """The valid value nearest to zeros (zeros themselves when valid): ``[*shape, *self.shape]``."""
        return self.project(torch.zeros(self._full_shape(shape), dtype=self._dtype, device=self._device))

    def one(self, shape: ShapeLike = None) -> Any:
        """The valid value nearest to ones (ones themselves when valid): ``[*shape, *self.shape]``."""
        return self.project(torch.ones(self._full_shape(shape), dtype=self._dtype, device=self._device))

    # ------------------------------------------------------------------ membership
    def _on(self, device: torch.device) -> TensorSpec:
        """This spec, moved to ``device`` if needed (to compare with values stored there)."""
        return self if device == self._device or not self._tensor_attrs else self.to(device)

    def is_in(self, val: Any) -> bool:
        """True if ``val`` is a valid value: a tensor of shape ``[*any, *self.shape]``,
        of the spec's dtype kind (bool / integer / floating / complex), with valid values.
        """
        if not isinstance(val, Tensor):
            return False
        s = val.shape
        n = len(self._shape)
        if len(s) < n or s[len(s) - n :] != self._shape:
            return False
        if _KINDS.get(val.dtype) != self._kind:
            return False
        if val.device != self._device and self._tensor_attrs:
            return self._on(val.device)._values_in(val)
        return self._values_in(val)

    def _values_in(self, val: Tensor) -> bool:
        return True

    def _values_report(self, val: Tensor) -> str | None:
        """Why the values of ``val`` (of valid shape and kind) are not valid; None if they are."""
        return None if self._values_in(val) else "invalid values"

    def _check(self, val: Any) -> str | None:
        """The reason ``val`` is not in the spec, or ``None`` if it is."""
        if not isinstance(val, Tensor):
            return f"expected a torch.Tensor, got {type(val).__name__}"
        if not ends_with(val.shape, self._shape):
            return (
                f"shape {list(val.shape)} does not end with the spec shape {list(self._shape)}"
            )
        if dtype_kind(val.dtype) != self._kind:
            return (
                f"dtype {val.dtype} is not of the spec's dtype kind "
                f"({_KIND_NAMES[self._kind]}, spec dtype {self._dtype})"
            )
        return self._on(val.device)._values_report(val)

    def assert_is_in(self, val: Any) -> None:
        """Raises ``ValueError`` naming the spec and the offending values if ``val`` is not in it."""
        reason = self._check(val)
        if reason is not None:
            raise ValueError(f"value is not in {self!r}: {reason}")

    def type_check(self, value: Any, key: Any = None) -> None:
        """Raises ``TypeError`` if ``value`` is not a tensor of the spec's dtype."""
        if not isinstance(value, Tensor) or value.dtype != self._dtype:
            got = value.dtype if isinstance(value, Tensor) else type(value).__name__
            where = f" for key {key!r}" if key is not None else ""
            raise TypeError(f"expected a tensor of dtype {self._dtype}{where}, got {got}")

    # ------------------------------------------------------------------ conversions
    def project(self, val: Any) -> Any:
        """Maps ``val`` (shape ``[*any, *self.shape]``) to a valid value (identity on valid ones)."""
        if not isinstance(val, Tensor):
            val = to_tensor(val, device=self._device)
        if not ends_with(val.shape, self._shape):
            raise ValueError(
                f"cannot project a value of shape {list(val.shape)} onto {type(self).__name__} "
                f"of shape {list(self._shape)}: its shape must end with the spec shape"
            )
        return self._on(val.device)._project(val)

    def _project(self, val: Tensor) -> Tensor:
        return val.to(self._dtype)

    def encode(self, val: Any, *, ignore_device: bool = False) -> Any:
        """Converts a numpy array, list, number or tensor into a tensor of the spec.

        The result has the spec's dtype and device (unless ``ignore_device``) and shape
        ``[*any, *self.shape]``; a value with as many elements as the spec but another
        shape (e.g. a Gymnasium scalar for a ``[1]`` spec) is reshaped.
        """
        t = to_tensor(val, dtype=self._dtype, device=None if ignore_device else self._device)
        return self._fit_shape(t)

    def _fit_shape(self, t: Tensor) -> Tensor:
        if ends_with(t.shape, self._shape):
            return t
        if t.numel() == math.prod(self._shape):
            return t.reshape(self._shape)
        raise ValueError(
            f"cannot encode a value of shape {list(t.shape)} into {type(self).__name__} of "
            f"shape {list(self._shape)}"
        )

    def to_numpy(self, val: Any, safe: bool = False) -> Any:
        """The numpy array of ``val`` (checked with ``assert_is_in`` first if ``safe``)."""
        if safe:
            self.assert_is_in(val)
        val = val.detach()
        if val.dtype in (torch.bfloat16,):
            val = val.float()
        return val.cpu().numpy()

    # ------------------------------------------------------------------ shape ops
    @property
    def _batch_ndim(self) -> int:
        return len(self._shape) - self._event_ndim

    def _replace(self, **changes: Any) -> TensorSpec:
        """A shallow copy with some attributes replaced, its caches recomputed."""
        new = copy.copy(self)
        for name, value in changes.items():
            setattr(new, name, value)
        new._refresh()
        return new

    def _tensor_items(self) -> list[tuple[str, Tensor]]:
        return [(a, t) for a in self._tensor_attrs if (t := getattr(self, a)) is not None]

    def __getitem__(self, index: Any) -> TensorSpec:
        """Indexes the batch dims of the spec: ``spec[idx].rand()`` has the shape of ``spec.rand()[idx]``."""
        nb = self._batch_ndim
        try:
            index = normalize_index(index, nb)
        except IndexError as err:
            raise IndexError(
                f"cannot index {type(self).__name__} of shape {list(self._shape)} with {index!r}: "
                f"{err} (the last {self._event_ndim} dim(s) of this spec cannot be indexed)"
            ) from None
        batch = indexed_batch_size(self._shape[:nb], index)
        changes = {a: t[index] for a, t in self._tensor_items()}
        return self._replace(_shape=batch + self._shape[nb:], **changes)

    def _resolve_expand(self, shape: tuple, old: torch.Size) -> torch.Size:
        shape = tuple(int(s) for s in shape)
        if len(shape) < len(old):
            raise ValueError(
                f"cannot expand {type(self).__name__} of shape {list(self._shape)} to {list(shape)}: "
                "the new shape has fewer dims"
            )
        lead = len(shape) - len(old)
        out = list(shape)
        for i, s in enumerate(shape):
            if i < lead:
                if s < 0:
                    raise ValueError(f"cannot use -1 for a new leading dim (shape {list(shape)})")
                continue
            o = old[i - lead]
            if s == -1:
                out[i] = o
            elif s != o and o != 1:
                raise ValueError(
                    f"cannot expand {type(self).__name__} of shape {list(self._shape)} to "
                    f"{list(shape)}: dim {i} has size {o}, which is not 1"
                )
        return torch.Size(out)

    def expand(self, *shape: Any) -> TensorSpec:
        """The spec expanded to ``shape`` (new leading dims, or singleton dims grown, as ``Tensor.expand``)."""
        shape = tuple(int(s) for s in shape_args(shape))
        nb, ev = self._batch_ndim, self._event_ndim
        tail = shape[len(shape) - ev :] if ev else ()
        if ev and (len(shape) < ev or any(s not in (e, -1) for s, e in zip(tail, self._shape[nb:]))):
            raise ValueError(
                f"cannot expand {type(self).__name__} of shape {list(self._shape)} to {list(shape)}: "
                f"its last {ev} dim(s) {list(self._shape[nb:])} must stay unchanged"
            )
        new = self._resolve_expand(shape, self._shape)
        batch = new[: len(new) - ev]
        changes = {a: t.expand(*batch, *t.shape[nb:]) for a, t in self._tensor_items()}
        return self._replace(_shape=new, **changes)

    def _batch_dim(self, dim: int, extra: int = 0, op: str = "index") -> int:
        """``dim`` as a non-negative batch dim (``extra=1`` for unsqueeze, which may append one)."""
        n = len(self._shape) + extra
        if not -n <= dim < n:
            raise IndexError(
                f"dim {dim} is out of range for {op} of a spec of shape {list(self._shape)}"
            )
        dim %= n
        if dim > self._batch_ndim - 1 + extra:
            raise ValueError(
                f"cannot {op} dim {dim} of {type(self).__name__} of shape {list(self._shape)}: "
                f"its last {self._event_ndim} dim(s) form one value and stay unchanged"
            )
        return dim

    def squeeze(self, dim: int | None = None) -> TensorSpec:
        """Removes singleton batch dims (all of them, or ``dim``)."""
        nb = self._batch_ndim
        if dim is None:
            dims = [i for i in range(nb) if self._shape[i] == 1]
        else:
            d = self._batch_dim(dim, op="squeeze")
            dims = [d] if self._shape[d] == 1 else []
        if not dims:
            return self
        shape = torch.Size([s for i, s in enumerate(self._shape) if i not in dims])
        changes = {a: t.squeeze(tuple(dims)) for a, t in self._tensor_items()}
        return self._replace(_shape=shape, **changes)

    def unsqueeze(self, dim: int) -> TensorSpec:
        """Inserts a singleton batch dim at ``dim`` (as ``Tensor.unsqueeze``)."""
        d = self._batch_dim(dim, extra=1, op="unsqueeze")
        shape = self._shape[:d] + torch.Size((1,)) + self._shape[d:]
        changes = {a: t.unsqueeze(d) for a, t in self._tensor_items()}
        return self._replace(_shape=shape, **changes)

    def reshape(self, *shape: Any) -> TensorSpec:
        """Reshapes the batch dims (the event dims, if any, must stay last and unchanged)."""
        shape = tuple(shape_args(shape))
        nb, ev = self._batch_ndim, self._event_ndim
        if ev and shape[len(shape) - ev :] != tuple(self._shape[nb:]):
            raise ValueError(
                f"cannot reshape {type(self).__name__} of shape {list(self._shape)} to "
                f"{list(shape)}: its last {ev} dim(s) must stay {list(self._shape[nb:])}"
            )
        wanted = shape[: len(shape) - ev] if ev else shape
        batch = torch.empty(self._shape[:nb], device="meta").reshape(wanted).shape
        changes = {a: t.reshape(*batch, *t.shape[nb:]) for a, t in self._tensor_items()}
        return self._replace(_shape=batch + self._shape[nb:], **changes)

    view = reshape

    def unbind(self, dim: int = 0) -> tuple[TensorSpec, ...]:
        """The specs of ``x.unbind(dim)`` for ``x`` in the spec (``dim`` a batch dim)."""
        d = self._batch_dim(dim, op="unbind")
        return tuple(self[(slice(None),) * d + (i,)] for i in range(self._shape[d]))

    # ------------------------------------------------------------------ device / dtype / copies
    def to(self, dest: Any) -> TensorSpec:
        """The spec on another device (``"cpu"``, ``"cuda:0"``) or with another dtype."""
        if isinstance(dest, torch.dtype):
            if dest == self._dtype:
                return self
            return self._cast(dest)
        dev = as_device(dest)
        if dev == self._device:
            return self
        changes = {a: t.to(dev) for a, t in self._tensor_items()}
        return self._replace(_device=dev, **changes)

    def _cast(self, dtype: torch.dtype) -> TensorSpec:
        return self._replace(_dtype=dtype)

    def cpu(self) -> TensorSpec:
        return self.to("cpu")

    def cuda(self, device: int | None = None) -> TensorSpec:
        return self.to("cuda" if device is None else f"cuda:{device}")

    def clone(self) -> TensorSpec:
        """A copy that shares no tensor with this spec."""
        return self._replace(**{a: t.clone() for a, t in self._tensor_items()})

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return False
        if (
            self._shape != other._shape
            or self._dtype != other._dtype
            or self._device != other._device
        ):
            return False
        for name in self._eq_fields:
            if not _equal(getattr(self, name), getattr(other, name)):
                return False
        for name in self._tensor_attrs:
            if not _equal(getattr(self, name), getattr(other, name)):
                return False
        return True

    __hash__ = None  # type: ignore[assignment]

    def _repr_fields(self) -> list[str]:
        return []

    def __repr__(self) -> str:
        fields = [f"shape={list(self._shape)}", *self._repr_fields()]
        fields += [f"device={self._device}", f"dtype={self._dtype}", f"domain={self.domain}"]
        return f"{type(self).__name__}({', '.join(fields)})"


def _equal(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return (
            isinstance(a, Tensor)
            and isinstance(b, Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and bool((a.cpu() == b.cpu()).all())
        )
    try:
        eq = a == b
        return bool(eq.all()) if hasattr(eq, "all") else bool(eq)
    except Exception:  # noqa: BLE001 (arbitrary example data)
        return a is b
