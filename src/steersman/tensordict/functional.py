"""Functions over several containers: stack, cat, where, gather, ``*_like``.

Each is registered for ``torch.<name>`` so that ``torch.stack([td0, td1])`` works.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from ._utils import NO_DEFAULT, expand_right, write_into_out
from .base import (
    HANDLED_FUNCTIONS,
    TensorDictBase,
    _is_non_tensor,
    is_tensor_collection,
)
from .switches import STATE
from .td import TensorDict, _td
from .unbatched import UnbatchedTensor as _UT

__all__ = ["stack", "cat", "where", "gather", "pad", "maybe_dense_stack"]


def _implements(torch_fn: Callable) -> Callable:
    def deco(fn: Callable) -> Callable:
        HANDLED_FUNCTIONS[torch_fn] = fn
        return fn

    return deco


def _norm_dim(dim: int, ndim: int, name: str) -> int:
    if not -ndim <= dim < max(ndim, 1) and not (name == "stack" and dim == ndim):
        raise IndexError(f"{name}: dim={dim} is out of range for a batch of {ndim - (name == 'stack')} dims")
    return dim % ndim if ndim else 0


@_implements(torch.stack)
def stack(list_of_tds: Sequence[Any], dim: int = 0, *, out: TensorDictBase | None = None) -> Any:
    """Stacks containers along a new batch dim ``dim``.

    All containers must have the same keys, batch size and leaf shapes; for ragged
    data use :func:`lazy_stack`.
    """
    if not list_of_tds:
        raise RuntimeError("stack expects a non-empty sequence of TensorDicts")
    first = list_of_tds[0]
    bd = len(first.batch_size)
    dim = _norm_dim(dim, bd + 1, "stack")
    if out is not None:
        return _stack_into(list_of_tds, dim, out)
    if STATE["lazy_legacy"]:
        from .lazy import lazy_stack

        return lazy_stack(list(list_of_tds), dim)
    result = _join_dense(list_of_tds, dim, (), torch.stack)
    if result is not None:
        return result
    if any(getattr(type(t), "_is_lazy", False) for t in list_of_tds):
        from .lazy import lazy_stack

        return lazy_stack(list(list_of_tds), dim)
    return _stack_entries(list(list_of_tds), dim, ())


def _join_dense(tds: Sequence[Any], dim: int, prefix: tuple, join: Callable) -> TensorDict | None:
    """``torch.stack`` or ``torch.cat`` of plain TensorDicts, leaf by leaf; None if an
    item is not a plain TensorDict (the caller takes the general path).

    Checks are cheap on purpose (types, batch sizes and key counts); a key missing from
    one item surfaces as a KeyError during the join and is then explained in full.
    """
    first = tds[0]
    if type(first) is not TensorDict:
        return None
    bs = first._batch_size
    n_keys = len(first._tensordict)
    is_stack = join is torch.stack
    dicts = []  # the items' entry dicts, read once
    if is_stack:
        for td in tds:
            if type(td) is not TensorDict:
                return None
            d = td._tensordict
            if len(d) != n_keys or td._batch_size != bs:
                _raise_mismatch(tds, prefix, "stack")
            dicts.append(d)
        new_bs = torch.Size((*bs[:dim], len(tds), *bs[dim:])) if dim else torch.Size((len(tds), *bs))
    else:
        uneven = False  # some item's size along dim differs from the first's
        for td in tds:
            if type(td) is not TensorDict:
                return None
            tbs = td._batch_size
            d = td._tensordict
            if len(d) != n_keys:
                _raise_mismatch(tds, prefix, "cat", dim)
            dicts.append(d)
            if tbs != bs:
                if len(tbs) != len(bs) or tbs[:dim] != bs[:dim] or tbs[dim + 1 :] != bs[dim + 1 :]:
                    _raise_mismatch(tds, prefix, "cat", dim)
                uneven = True
        total = sum(td._batch_size[dim] for td in tds) if uneven else bs[dim] * len(tds)
        new_bs = torch.Size((total,)) if len(bs) == 1 else torch.Size((*bs[:dim], total, *bs[dim + 1 :]))
    out = {}
    for k, v in first._tensordict.items():
        try:
            vals = [d[k] for d in dicts]
        except KeyError:  # only this level's lookup: nested mismatches explain themselves
            _raise_mismatch(tds, prefix, "stack" if is_stack else "cat", None if is_stack else dim)
        if isinstance(v, Tensor):
            try:  # (dim=0 is the default: not passing it saves the argument parsing)
                r = join(vals, dim) if dim else join(vals)
            except (RuntimeError, TypeError) as err:
                raise _join_error(vals, prefix + (k,) if prefix else k, is_stack) from err
            out[k] = r if type(r) is not _UT else r._with_batch(new_bs)
            continue
        r = _join_dense(vals, dim, prefix + (k,), join) if type(v) is TensorDict else None
        if r is None:
            r = _stack_entries(vals, dim, prefix + (k,)) if is_stack else _cat_entries(vals, dim, prefix + (k,))
        out[k] = r
    names = first._names
    if is_stack and names is not None:
        names = list(names)
        names.insert(dim, None)
    return _td(out, new_bs, first._device, names)


def _join_error(vals: list, key: Any, is_stack: bool) -> ValueError:
    return ValueError(
        f"cannot {'stack' if is_stack else 'cat'} entry {key!r}: shapes "
        f"{[list(x.shape) for x in vals]} are incompatible"
        + ("; use lazy_stack for ragged data" if is_stack else "")
    )


def _raise_mismatch(tds: Sequence[TensorDict], prefix: tuple, what: str, dim: int | None = None) -> None:
    """Raises a clear error naming the first item whose batch size or keys differ."""
    first = tds[0]
    bs = first._batch_size
    keys = set(first._tensordict)
    for i, td in enumerate(tds):
        tbs = td._batch_size
        if dim is None and tbs != bs or dim is not None and (
            len(tbs) != len(bs) or tbs[:dim] != bs[:dim] or tbs[dim + 1 :] != bs[dim + 1 :]
        ):
            along = "" if dim is None else f" along dim {dim}"
            raise ValueError(
                f"cannot {what} TensorDicts{along} with different batch sizes: item 0 has "
                f"{list(bs)}, item {i} has {list(tbs)}{_where(prefix)}"
            )
        other = set(td._tensordict)
        if other != keys:
            raise KeyError(
                f"cannot {what} TensorDicts with different keys{_where(prefix)}: item {i} is missing "
                f"{sorted(keys - other)} and has extra {sorted(other - keys)}; "
                "use lazy_stack for heterogeneous data"
            )
    raise AssertionError("unreachable: no mismatch found")


def _stack_entries(vals: list, dim: int, prefix: tuple) -> Any:
    first = vals[0]
    if _is_non_tensor(first):
        from .nontensor import stack_non_tensor

        if not all(_is_non_tensor(v) for v in vals):
            raise TypeError(f"cannot stack non-tensor data with tensors{_where(prefix)}")
        return stack_non_tensor(vals, dim)
    if all(type(v) is TensorDict for v in vals):
        return _join_dense(vals, dim, prefix, torch.stack)
    stacker = getattr(type(first), "_stack_impl", None)
    if stacker is not None:
        return stacker(vals, dim)
    if isinstance(first, Tensor):
        return torch.stack(vals, dim)
    if all(hasattr(v, "to_tensordict") and not getattr(type(v), "_is_lazy", False) for v in vals):
        # file-backed or other dense containers: read them and stack densely
        return _join_dense([v if type(v) is TensorDict else v.to_tensordict() for v in vals], dim, prefix,
                           torch.stack)
    if all(is_tensor_collection(v) for v in vals):
        from .lazy import lazy_stack

        return lazy_stack(vals, dim)
    raise TypeError(f"cannot stack values of type {type(first).__name__}{_where(prefix)}")


def _stack_into(tds: Sequence[Any], dim: int, out: TensorDictBase) -> TensorDictBase:
    expected = tds[0].batch_size[:dim] + (len(tds),) + tds[0].batch_size[dim:]
    if out.batch_size != expected:
        raise ValueError(f"stack(out=): out has batch_size {list(out.batch_size)}, expected {list(expected)}")
    for i, td in enumerate(tds):
        out[(slice(None),) * dim + (i,)] = td
    return out


@_implements(torch.cat)
def cat(input: Sequence[Any], dim: int = 0, *, out: TensorDictBase | None = None) -> Any:
    """Concatenates containers along an existing batch dim ``dim``."""
    if not input:
        raise RuntimeError("cat expects a non-empty sequence of TensorDicts")
    first = input[0]
    bd = len(first.batch_size)
    if bd == 0:
        raise RuntimeError("cannot cat TensorDicts with an empty batch size; use stack")
    dim = _norm_dim(dim, bd, "cat")
    result = _join_dense(input, dim, (), torch.cat)
    if result is None:
        if any(getattr(type(t), "_is_lazy", False) for t in input):
            from .lazy import lazy_cat

            result = lazy_cat(list(input), dim)
        else:
            result = _cat_entries(list(input), dim, ())
    if out is not None:
        out.update_(result)
        return out
    return result


def _cat_entries(vals: list, dim: int, prefix: tuple) -> Any:
    first = vals[0]
    if isinstance(first, Tensor):
        return torch.cat(vals, dim)
    if _is_non_tensor(first):
        from .nontensor import cat_non_tensor

        return cat_non_tensor(vals, dim)
    if all(type(v) is TensorDict for v in vals):
        return _join_dense(vals, dim, prefix, torch.cat)
    catter = getattr(type(first), "_cat_impl", None)
    if catter is not None:
        return catter(vals, dim)
    raise TypeError(f"cannot cat values of type {type(first).__name__}{_where(prefix)}")


def _where(prefix: tuple) -> str:
    return f" (in {prefix if len(prefix) > 1 else prefix[0]!r})" if prefix else ""


@_implements(torch.where)
def where(condition: Tensor, input: Any, other: Any, *, out: Any = None, pad: Any = None) -> Any:
    """``torch.where(cond, td, other)``: elementwise choice; ``cond`` has the batch shape (or a prefix)."""
    if is_tensor_collection(condition):
        raise TypeError("torch.where with a TensorDict condition is not supported; pass a bool tensor")
    ref = input if is_tensor_collection(input) else other
    if condition.shape != ref.batch_size[: condition.ndim]:
        raise ValueError(
            f"where: condition shape {list(condition.shape)} does not match the batch size "
            f"{list(ref.batch_size)}"
        )
    if getattr(type(input), "_is_lazy", False) or getattr(type(other), "_is_lazy", False):
        from .lazy import _lazy_where  # the condition is cut along the stack dim

        result = _lazy_where(condition, input, other)
    elif is_tensor_collection(input) and is_tensor_collection(other):
        result = input._map(lambda a, b: torch.where(expand_right(condition, a.shape), a, b), (other,))
    elif is_tensor_collection(input):
        result = input._map(lambda a: torch.where(expand_right(condition, a.shape), a, other), ())
    else:
        result = other._map(lambda b: torch.where(expand_right(condition, b.shape), input, b), ())
    if out is not None:
        out.update_(result)
        return out
    return result


@_implements(torch.gather)
def gather(input: TensorDictBase, dim: int, index: Tensor, *, out: Any = None) -> TensorDictBase:
    """Gathers along batch dim ``dim``; ``index`` has batch-like shape."""
    bd = input.batch_dims
    d = dim % bd
    if index.ndim != bd:
        raise ValueError(f"gather: index must have {bd} dims (the batch dims), got {index.ndim}")

    def fn(x):
        idx = index.reshape(index.shape + (1,) * (x.ndim - bd)).expand(index.shape + x.shape[bd:])
        return torch.gather(x, d, idx)

    result = input._apply_batch(fn, index.shape, None)
    if out is not None:
        out.update_(result)
        return out
    return result


def _unary(fn_name: str) -> Callable:
    def impl(input: TensorDictBase, *args: Any, **kwargs: Any) -> Any:
        return getattr(input, fn_name)(*args, **kwargs)

    return impl


for _fn, _name in [
    (torch.unbind, "unbind"),
    (torch.split, "split"),
    (torch.chunk, "chunk"),
    (torch.permute, "permute"),
    (torch.reshape, "reshape"),
    (torch.squeeze, "squeeze"),
    (torch.unsqueeze, "unsqueeze"),
    (torch.flatten, "flatten"),
    (torch.unflatten, "unflatten"),
    (torch.transpose, "transpose"),
    (torch.flip, "flip"),
    (torch.roll, "roll"),
    (torch.narrow, "narrow"),
    (torch.masked_select, "masked_select"),
    (torch.isfinite, "isfinite"),
    (torch.isnan, "isnan"),
    (torch.sum, "sum"),
    (torch.mean, "mean"),
    (torch.std, "std"),
    (torch.var, "var"),
    (torch.prod, "prod"),
    (torch.all, "all"),
    (torch.any, "any"),
    (torch.abs, "abs"),
    (torch.exp, "exp"),
    (torch.sqrt, "sqrt"),
    (torch.neg, "neg"),
    (torch.sigmoid, "sigmoid"),
    (torch.tanh, "tanh"),
]:
    HANDLED_FUNCTIONS[_fn] = _unary(_name)


@_implements(torch.clone)
def _clone(input: TensorDictBase, *, memory_format: Any = None) -> TensorDictBase:
    return input.clone()


def _like(factory: Callable) -> Callable:
    def impl(input: TensorDictBase, *args: Any, dtype: Any = None, device: Any = None,
             requires_grad: bool = False, **kwargs: Any) -> TensorDictBase:
        def fn(x):
            return factory(x, *args, dtype=dtype or x.dtype, device=device or x.device,
                           requires_grad=requires_grad, **kwargs)
        return input._map(fn, (), device=NO_DEFAULT if device is None else torch.device(device))

    return impl


HANDLED_FUNCTIONS[torch.zeros_like] = _like(torch.zeros_like)
HANDLED_FUNCTIONS[torch.ones_like] = _like(torch.ones_like)
HANDLED_FUNCTIONS[torch.empty_like] = _like(torch.empty_like)
HANDLED_FUNCTIONS[torch.rand_like] = _like(torch.rand_like)
HANDLED_FUNCTIONS[torch.randn_like] = _like(torch.randn_like)
HANDLED_FUNCTIONS[torch.full_like] = _like(torch.full_like)


@_implements(torch.add)
def _add(input: Any, other: Any, *, alpha: Any = None, out: Any = None) -> Any:
    if is_tensor_collection(input):
        return input.add(other, alpha=alpha)
    return other.add(input) if alpha is None else other.mul(alpha).add(input)


@_implements(torch.mul)
def _mul(input: Any, other: Any, *, out: Any = None) -> Any:
    return input.mul(other) if is_tensor_collection(input) else other.mul(input)


@_implements(torch.sub)
def _sub(input: Any, other: Any, *, alpha: Any = None, out: Any = None) -> Any:
    if is_tensor_collection(input):
        return input.sub(other, alpha=alpha)
    return other.__rsub__(input)


@_implements(torch.div)
def _div(input: Any, other: Any, *, out: Any = None) -> Any:
    return input.div(other) if is_tensor_collection(input) else other.__rtruediv__(input)


@_implements(torch.allclose)
def _allclose(input: Any, other: Any, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> bool:
    return input.allclose(other, rtol, atol)


def pad(tensordict: TensorDictBase, pad_size: Sequence[int], value: float = 0.0, inplace: bool = False,
        safe: bool = True) -> TensorDictBase:
    """Pads the batch dims with ``value``; ``pad_size`` pairs start from the FIRST batch dim.

    Args:
        tensordict: the container (or tensorclass) to pad.
        pad_size: ``(dim0_before, dim0_after, dim1_before, dim1_after, ...)``: an even
            length of at most twice the number of batch dims (``torch.nn.functional.pad``
            starts from the last dim; tensordict's ``pad``, and this one, from the first).
        value: the value of the new elements.
        inplace: if ``True``, the container keeps its identity and gets the padded leaves
            (and batch size); returns it. A lazy stack refuses (``to_tensordict()`` first).
        safe: tensordict checks every leaf before an in-place pad writes anything; here the
            padded leaves are always built before anything is written, so a failure never
            leaves a half-padded container whatever ``safe`` is.

    Shapes: a leaf ``[*B, *F]`` becomes ``[*B', *F]`` with ``B'[i] = B[i] + before_i + after_i``.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict, pad
        >>> td = TensorDict({"a": torch.ones(3, 4, 1)}, batch_size=[3, 4])
        >>> pad(td, [0, 1, 0, 2]).batch_size
        torch.Size([4, 6])
        >>> out = pad(td, [1, 0], value=5.0, inplace=True)
        >>> out is td, td["a"].shape, td["a"][0, 0, 0].item()
        (True, torch.Size([4, 4, 1]), 5.0)
    """
    bd = tensordict.batch_dims
    if len(pad_size) % 2 or len(pad_size) // 2 > bd:
        raise ValueError(f"pad_size must have an even length of at most {2 * bd}, got {list(pad_size)}")
    # a tensorclass keeps its fields in a TensorDict (``_tensordict``): that one is padded
    target = tensordict if isinstance(tensordict, TensorDict) else getattr(tensordict, "_tensordict", None)
    if inplace and not isinstance(target, TensorDict):
        raise NotImplementedError(
            f"pad(inplace=True) on a {type(tensordict).__name__}: only a TensorDict (or a tensorclass) "
            "is padded in place here; call to_tensordict() first, or pad without inplace"
        )
    pairs = [tuple(pad_size[i : i + 2]) for i in range(0, len(pad_size), 2)]
    new_bs = list(tensordict.batch_size)
    for j, (lo, hi) in enumerate(pairs):
        new_bs[j] += lo + hi
    # F.pad takes pairs from the last dim: reverse ours and put zeros for the dims after them
    spec: list[int] = []
    for lo, hi in reversed(pairs):
        spec += [lo, hi]

    def fn(x):
        return torch.nn.functional.pad(x, [0, 0] * (x.ndim - len(pairs)) + spec, value=value)

    result = tensordict._apply_batch(fn, torch.Size(new_bs), None)
    if not inplace:
        return result
    res = result if isinstance(result, TensorDict) else result._tensordict
    target._tensordict = dict(res._tensordict)
    target._batch_size = res._batch_size
    return tensordict


def pad_sequence(list_of_tensordicts: Sequence[TensorDictBase], pad_dim: int = 0, padding_value: float = 0.0,
                 return_mask: bool = False, *, out: TensorDictBase | None = None,
                 padding_side: str = "right") -> TensorDictBase:
    """Stacks containers of different lengths along ``pad_dim``, padding to the longest
    (after the data with ``padding_side="right"``, before it with ``"left"``); with
    ``return_mask`` a ``"masks"`` entry marks the real elements. ``out``: written in place."""
    if padding_side not in ("right", "left"):
        raise ValueError(f"pad_sequence: padding_side must be 'right' or 'left', got {padding_side!r}")
    longest = max(t.batch_size[pad_dim] for t in list_of_tensordicts)
    padded = []
    masks = []
    for t in list_of_tensordicts:
        n = t.batch_size[pad_dim]
        bd = t.batch_dims
        side = [0, longest - n] if padding_side == "right" else [longest - n, 0]
        spec = [0, 0] * (pad_dim % bd) + side  # pad()'s pairs start from the first batch dim
        padded.append(pad(t, spec, padding_value))
        d = pad_dim % bd  # the mask covers every batch dim: True on the real elements
        real = torch.ones(t.batch_size, dtype=torch.bool)
        gap = torch.zeros((*t.batch_size[:d], longest - n, *t.batch_size[d + 1:]), dtype=torch.bool)
        masks.append(torch.cat([real, gap] if padding_side == "right" else [gap, real], d))
    result = stack(padded, 0)
    if return_mask:
        result.set("masks", torch.stack(masks))
    return write_into_out("pad_sequence", out, result)


def maybe_dense_stack(input: Sequence[TensorDictBase], dim: int = 0, *,
                      out: TensorDictBase | None = None) -> TensorDictBase:
    """Stacks densely when the structures match, lazily otherwise (written into ``out``,
    in place, when given)."""
    try:
        result = stack(input, dim)
    except (KeyError, ValueError):
        from .lazy import lazy_stack

        result = lazy_stack(list(input), dim)
    return write_into_out("maybe_dense_stack", out, result)
