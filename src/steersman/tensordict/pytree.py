"""``TensorDict`` as a pytree node, so ``torch.vmap``/``torch.func`` accept it as an input.

Flattening gives the tensor entries (nested TensorDicts are nodes of their own) as children;
the keys, batch size, device, names, lock state and the non-tensor entries travel in the
context. Unflattening *infers* the batch size from the leaves: inside ``torch.vmap`` the
leaves have lost the vmapped dim, so a ``[N]`` TensorDict comes back with batch ``[]``;
on the way out ``vmap`` adds the dim back and the batch size grows again. Only the number
of batch dims is taken from the context (adjusted by how many dims the leaves gained or
lost); the sizes always come from the leaves.

Importing :mod:`steersman.tensordict` registers the node; nothing to call.

Example:
    >>> import torch
    >>> from steersman.tensordict import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.).view(3, 2), "b": {"c": torch.ones(3)}}, [3])
    >>> out = torch.vmap(lambda t: t["a"].sum() + t["b", "c"])(td)
    >>> out
    tensor([ 2.,  6., 10.])
    >>> seen = []
    >>> doubled = torch.vmap(lambda t: seen.append(t.batch_size) or t * 2)(td)
    >>> seen, doubled.batch_size
    ([torch.Size([])], torch.Size([3]))
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as _pytree
from torch import Tensor

from .base import TensorDictBase, _is_non_tensor
from .td import TensorDict

__all__ = ["register_tensordict_pytree"]


class _Opaque:
    """Wraps a non-tensor entry in the pytree context: equal only to itself, hashable."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"_Opaque({self.value!r})"


def _td_flatten(td: TensorDictBase) -> tuple[list[Any], tuple]:
    if type(td) is TensorDict:
        src = td._tensordict
        names = td._names
        locked = td._locked
    else:
        src = {k: td._get_str(k, None) for k in td._keys_str()}
        names = td.names_or_none()
        locked = td.is_locked
    children = []
    child_keys = []
    ndims = []
    opaque = None
    for k, v in src.items():
        if isinstance(v, Tensor):
            children.append(v)
            child_keys.append(k)
            ndims.append(v.ndim)
        elif _is_non_tensor(v):
            if opaque is None:
                opaque = []
            opaque.append((k, _Opaque(v)))
        else:  # a nested container (negative: its batch dims), or a placeholder leaf
            children.append(v)
            child_keys.append(k)
            ndims.append(-1 - v.batch_dims if isinstance(v, TensorDictBase) else None)
    context = (
        tuple(child_keys),
        td.batch_size,
        td.device,
        None if names is None else tuple(names),
        locked,
        tuple(ndims),
        () if opaque is None else tuple(opaque),
    )
    return children, context


def _td_unflatten(values: Any, context: tuple) -> TensorDict:
    keys, batch_size, device, names, locked, ndims, opaque = context
    values = list(values)
    new_bs = batch_size
    if values:
        bd = len(batch_size)
        for v, n in zip(values, ndims):
            # torch's pytree helpers also unflatten placeholders (ints): skip those
            if n is None:
                continue
            if isinstance(v, Tensor):
                shape = v.shape
                delta = v.ndim - n
            elif isinstance(v, TensorDictBase):
                shape = v.batch_size
                delta = n + 1 + len(shape)  # n = -1 - batch_dims when flattened
            else:
                break
            new_bs = shape[: max(0, bd + delta)]
            k = len(new_bs)
            if k:  # a pytree map may have changed shapes arbitrarily: keep the common prefix
                for w in values:
                    s = w.shape if isinstance(w, Tensor) else getattr(w, "batch_size", None)
                    if s is not None and s[:k] != new_bs:
                        i = 0
                        while i < min(len(s), k) and s[i] == new_bs[i]:
                            i += 1
                        new_bs = new_bs[:i]
                        k = i
            new_bs = torch.Size(new_bs)
            break
    out = dict(zip(keys, values))
    for k, o in opaque:
        v = o.value
        if new_bs != batch_size and not getattr(type(v), "_is_stack", False):
            v = v.copy()
            v.batch_size = new_bs
        out[k] = v
    td = TensorDict._new_unsafe(out, new_bs, device,
                                list(names) if names is not None and new_bs == batch_size else None)
    td._locked = locked  # the children carry their own flag (unflattened first)
    return td


def _td_flatten_with_keys(td: TensorDictBase) -> tuple[list[tuple[Any, Any]], tuple]:
    children, context = _td_flatten(td)
    return [(_pytree.MappingKey(k), c) for k, c in zip(context[0], children)], context


def register_tensordict_pytree(cls: type) -> None:
    """Registers ``cls`` (a TensorDictBase subclass) as a pytree node; unflattening gives a
    :class:`TensorDict`. Called at import for ``TensorDict`` and ``TensorDictParams``.

    Example:
        >>> import torch.utils._pytree as pytree
        >>> from steersman.tensordict import TensorDict
        >>> leaves, spec = pytree.tree_flatten(TensorDict({"x": torch.zeros(2)}, [2]))
        >>> [t.shape for t in leaves]
        [torch.Size([2])]
    """
    if cls in _pytree.SUPPORTED_NODES:
        return
    _pytree.register_pytree_node(
        cls,
        _td_flatten,
        _td_unflatten,
        serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        flatten_with_keys_fn=_td_flatten_with_keys,
    )


register_tensordict_pytree(TensorDict)
