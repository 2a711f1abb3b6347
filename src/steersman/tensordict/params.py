"""``TensorDictParams``: a TensorDict of parameters that is also an ``nn.Module``.

Every tensor leaf is registered with the module (parameters in ``_parameters``, everything
else in ``_buffers``, under the dotted path of its key: ``("0", "weight")`` ->
``"0.weight"``), so ``.parameters()``, optimizers, ``state_dict``/``load_state_dict`` and a
parent module's ``.to()``/``.cuda()``/``.double()`` see them, while reads and writes go
through the TensorDict API (``params["0", "weight"]``, indexing, ``apply``, arithmetic).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ._utils import NO_DEFAULT, NestedKey
from .base import TensorDictBase, _is_branch, _is_non_tensor, is_tensor_collection
from .td import TensorDict

__all__ = ["TensorDictParams"]


def _is_float(t: Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


def _make_param(t: Any) -> Any:
    """``no_convert=False``: float/complex tensors become ``nn.Parameter`` (others stay)."""
    if isinstance(t, Tensor) and not isinstance(t, nn.Parameter) and _is_float(t):
        return nn.Parameter(t)
    return t


def _wrap_like(new: Tensor, old: Tensor) -> Tensor:
    """After a dtype/device conversion: a parameter stays a parameter (same requires_grad)."""
    if new is old:
        return new
    if isinstance(old, nn.Parameter) and _is_float(new):
        return nn.Parameter(new.detach(), requires_grad=old.requires_grad)
    return new


def _walk_leaves(td: TensorDictBase, prefix: tuple, out: list) -> None:
    """(parent TensorDict, key, full path, leaf) for every tensor leaf, in key order."""
    for k in list(td._keys_str()):
        v = td._get_str(k, NO_DEFAULT)
        if isinstance(v, Tensor):
            out.append((td, k, prefix + (k,), v))
        elif _is_branch(v) and not _is_non_tensor(v):
            _walk_leaves(v, prefix + (k,), out)


class TensorDictParams(TensorDictBase, nn.Module):
    """A TensorDict whose leaves are registered as the parameters/buffers of a module.

    Args:
        parameters: a ``TensorDict`` (wrapped as is: its leaves are converted in place),
            another ``TensorDictParams`` (shares its leaves) or a nested dict.
        no_convert: ``False`` (default, as in ``tensordict``): float and complex tensors
            that are not ``nn.Parameter`` yet become ``nn.Parameter`` (``requires_grad=True``,
            same storage); other tensors are registered as buffers. ``True``: nothing is
            converted; ``nn.Parameter`` leaves are parameters, all other tensors buffers.
        lock: lock the inner TensorDict (no new or removed keys).

    Reads (``get``, ``[]``, ``keys``), batch indexing and leafwise ops (``apply``,
    ``clone(False)``, ``detach``, arithmetic) act on the inner TensorDict and return plain
    ``TensorDict`` results; writes that add, replace or remove leaves re-register them.
    Unknown attributes are forwarded to the inner TensorDict.

    Module semantics: ``.parameters()``/``.buffers()``, ``state_dict()`` (flat dotted keys,
    no batch-size entries, so a parent module's state dict nests cleanly),
    ``load_state_dict`` (copies in place), ``requires_grad_`` (parameters only), and a
    parent's ``.to()``/``.cuda()``/``.double()`` (``_apply``) update the inner TensorDict too.
    TensorDict semantics (as ``tensordict``): ``params.to(...)``/``cpu()``/``float()`` on
    the object itself return a *new* ``TensorDictParams`` (parameters stay parameters);
    ``clone()`` returns a new ``TensorDictParams`` with fresh, detached parameters.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict, TensorDictParams
        >>> params = TensorDictParams(TensorDict({"w": torch.ones(2, 3), "step": torch.zeros((), dtype=torch.long),
        ...                                       "sub": {"b": torch.zeros(3)}}))
        >>> sorted(name for name, _ in params.named_parameters())
        ['sub.b', 'w']
        >>> [name for name, _ in params.named_buffers()]
        ['step']
        >>> params["sub", "b"] is dict(params.named_parameters())["sub.b"]
        True
        >>> opt = torch.optim.SGD(params.parameters(), lr=1.0)
        >>> params["w"].sum().backward(); opt.step()
        >>> params["w"][0, 0].item()
        0.0
        >>> class Policy(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.params = params
        >>> sorted(Policy().state_dict())
        ['params.step', 'params.sub.b', 'params.w']
    """

    def __init__(
        self,
        parameters: TensorDictBase | Mapping | None = None,
        *,
        no_convert: bool = False,
        lock: bool = False,
        **kwargs: Any,
    ) -> None:
        nn.Module.__init__(self)
        if parameters is None:
            parameters = kwargs
        elif kwargs:
            raise TypeError(f"pass the parameters or keyword entries, not both (got {sorted(kwargs)})")
        if isinstance(parameters, TensorDictParams):
            td = parameters._param_td.copy()
        elif type(parameters) is TensorDict:
            td = parameters
        elif is_tensor_collection(parameters):
            td = parameters.to_tensordict()
        elif isinstance(parameters, Mapping):
            td = TensorDict(dict(parameters))
        else:
            raise TypeError(f"TensorDictParams wraps a TensorDict or a dict, got {type(parameters).__name__}")
        self.no_convert = no_convert
        self._param_td = td
        if lock:
            td.lock_()
        self._reset_params()

    @classmethod
    def _wrap(cls, td: TensorDict, no_convert: bool) -> TensorDictParams:
        """Wraps ``td`` without converting anything (its leaves are already right)."""
        out = cls(td, no_convert=True)
        out.no_convert = no_convert
        return out

    # ------------------------------------------------------------------ registration
    def _reset_params(self) -> None:
        """Converts new leaves (per ``no_convert``) and rebuilds the module registry."""
        leaves: list = []
        _walk_leaves(self._param_td, (), leaves)
        params: dict[str, Tensor] = {}
        buffers: dict[str, Tensor] = {}
        convert = not self.no_convert
        for parent, k, path, v in leaves:
            if convert:
                nv = _make_param(v)
                if nv is not v:
                    parent._set_str(k, nv, False, True)  # validated: bypasses the lock
                    v = nv
            name = ".".join(path)
            if isinstance(v, nn.Parameter):
                params[name] = v
            else:
                buffers[name] = v
        self._parameters.clear()
        self._parameters.update(params)
        self._buffers.clear()
        self._buffers.update(buffers)

    def _swap_leaf(self, path: tuple[str, ...], value: Tensor) -> Tensor:
        """Puts ``value`` at ``path`` (TensorDict and registry) and returns the old leaf."""
        node = self._param_td
        for k in path[:-1]:
            node = node._get_str(k, NO_DEFAULT)
        old = node._get_str(path[-1], NO_DEFAULT)
        node._set_str(path[-1], value, False, True)
        name = ".".join(path)
        if name in self._parameters:
            self._parameters[name] = value
        else:
            self._buffers[name] = value
        return old

    def _mutate(self, name: str, *args: Any, **kwargs: Any) -> Any:
        out = getattr(self._param_td, name)(*args, **kwargs)
        self._reset_params()
        return self if out is self._param_td else out

    # ------------------------------------------------------------------ primitives
    @property
    def batch_size(self) -> torch.Size:
        return self._param_td.batch_size

    @batch_size.setter
    def batch_size(self, new: Any) -> None:
        self._param_td.batch_size = new

    @property
    def device(self) -> torch.device | None:
        return self._param_td.device

    @property
    def names(self) -> list:
        return self._param_td.names

    @names.setter
    def names(self, value: Any) -> None:
        self._param_td.names = value

    def names_or_none(self) -> list | None:
        return self._param_td.names_or_none()

    def _keys_str(self):
        return self._param_td._keys_str()

    def _get_str(self, key: str, default: Any) -> Any:
        return self._param_td._get_str(key, default)

    def _set_str(self, key: str, value: Any, inplace: bool, validated: bool) -> None:
        self._param_td._set_str(key, value, inplace, validated)
        self._reset_params()

    def _del_str(self, key: str) -> None:
        self._param_td._del_str(key)
        self._reset_params()

    def _new_empty(self, batch_size: torch.Size) -> TensorDict:
        return self._param_td._new_empty(batch_size)

    def _index(self, index: Any) -> TensorDictBase:
        return self._param_td._index(index)

    def _apply_batch(self, fn: Callable, batch_size: torch.Size, names: Any) -> TensorDictBase:
        return self._param_td._apply_batch(fn, batch_size, names)

    def _split_batch(self, fn: Callable, batch_sizes: list) -> list:
        return self._param_td._split_batch(fn, batch_sizes)

    def _map(self, fn: Callable, others: tuple, **kwargs: Any) -> TensorDictBase:
        return self._param_td._map(fn, others, **kwargs)

    def _map_(self, fn: Callable, others: tuple, **kwargs: Any) -> None:
        self._param_td._map_(fn, others, **kwargs)

    def _setitem_batch(self, index: Any, value: Any) -> None:
        self._param_td._setitem_batch(index, value)

    def lock_(self) -> TensorDictParams:
        self._param_td.lock_()
        return self

    def unlock_(self) -> TensorDictParams:
        self._param_td.unlock_()
        return self

    def _is_locked_flag(self) -> bool:
        return self._param_td._is_locked_flag()

    # ------------------------------------------------------------------ fast reads
    def keys(self, *args: Any, **kwargs: Any) -> Any:
        return self._param_td.keys(*args, **kwargs)

    def values(self, *args: Any, **kwargs: Any) -> list:
        return self._param_td.values(*args, **kwargs)

    def items(self, *args: Any, **kwargs: Any) -> list:
        return self._param_td.items(*args, **kwargs)

    def get(self, key: NestedKey, default: Any = NO_DEFAULT) -> Any:
        return self._param_td.get(key, default)

    def __getitem__(self, index: Any) -> Any:
        return self._param_td[index]

    def __contains__(self, key: Any) -> bool:
        return key in self._param_td

    # ------------------------------------------------------------------ writes
    def set(self, key: NestedKey, item: Any, inplace: bool = False, **kwargs: Any) -> TensorDictParams:
        return self._mutate("set", key, item, inplace, **kwargs)

    def __setitem__(self, index: Any, value: Any) -> None:
        self._param_td[index] = value
        if type(index) is str or (type(index) is tuple and index and isinstance(index[0], (str, tuple))):
            self._reset_params()

    def update(self, *args: Any, **kwargs: Any) -> TensorDictParams:
        return self._mutate("update", *args, **kwargs)

    def del_(self, key: NestedKey) -> TensorDictParams:
        return self._mutate("del_", key)

    def pop(self, key: NestedKey, default: Any = NO_DEFAULT) -> Any:
        return self._mutate("pop", key, default)

    def rename_key_(self, old_key: NestedKey, new_key: NestedKey, safe: bool = False) -> TensorDictParams:
        return self._mutate("rename_key_", old_key, new_key, safe)

    def select(self, *keys: NestedKey, inplace: bool = False, strict: bool = True, as_tensordict: bool = False) -> TensorDictBase:
        if inplace:
            return self._mutate("select", *keys, inplace=True, strict=strict)
        return self._param_td.select(*keys, strict=strict)

    def exclude(self, *keys: NestedKey, inplace: bool = False) -> TensorDictBase:
        if inplace:
            return self._mutate("exclude", *keys, inplace=True)
        return self._param_td.exclude(*keys)

    def flatten_keys(self, separator: str = ".", inplace: bool = False) -> TensorDictBase:
        if inplace:
            return self._mutate("flatten_keys", separator, inplace=True)
        return self._param_td.flatten_keys(separator)

    def unflatten_keys(self, separator: str = ".", inplace: bool = False) -> TensorDictBase:
        if inplace:
            return self._mutate("unflatten_keys", separator, inplace=True)
        return self._param_td.unflatten_keys(separator)

    # ------------------------------------------------------------------ conversions
    def to(self, *args: Any, **kwargs: Any) -> TensorDictParams:
        """A new ``TensorDictParams`` on the new device/dtype (``self`` if nothing moves).

        Parameters stay parameters with the same ``requires_grad``. A parent module's
        ``.to()`` goes through :meth:`_apply` instead and updates this object in place.
        """
        moved = self._param_td.to(*args, **kwargs)
        if moved is self._param_td:
            return self
        wrapped = moved._map(_wrap_like, (self._param_td,), validate=False)
        return TensorDictParams._wrap(wrapped, self.no_convert)

    def clone(self, recurse: bool = True, **kwargs: Any) -> TensorDictParams:
        """A new ``TensorDictParams``; ``recurse=True`` copies the data into new, detached
        parameters/buffers (ties between leaves are kept), ``False`` shares the leaves."""
        if not recurse:
            return TensorDictParams._wrap(self._param_td.copy(), self.no_convert)
        memo: dict[int, Tensor] = {}

        def fn(t: Tensor) -> Tensor:
            out = memo.get(id(t))
            if out is None:
                if isinstance(t, nn.Parameter):
                    out = nn.Parameter(t.detach().clone(), requires_grad=t.requires_grad)
                else:
                    out = t.detach().clone()
                memo[id(t)] = out
            return out

        return TensorDictParams._wrap(self._param_td._map(fn, (), validate=False), self.no_convert)

    def requires_grad_(self, requires_grad: bool = True) -> TensorDictParams:
        """Sets ``requires_grad`` of the parameters (buffers are left alone), like a module."""
        for p in self._parameters.values():
            p.requires_grad_(requires_grad)
        return self

    @property
    def data(self) -> TensorDict:
        """A TensorDict of detached views of the leaves (same storage)."""
        return self._param_td.detach()

    @property
    def grad(self) -> TensorDict:
        """The ``.grad`` of each leaf (leaves without a gradient are left out)."""
        return self._param_td._map(lambda t: t.grad, (), validate=False)

    def to_tensordict(self, *, retain_none: bool | None = None) -> TensorDict:
        return self._param_td.to_tensordict()

    # ------------------------------------------------------------------ module hooks
    def _apply(self, fn: Callable, recurse: bool = True) -> TensorDictParams:
        nn.Module._apply(self, fn, recurse)
        locked = self._param_td._is_locked_flag()
        reg = {**self._buffers, **self._parameters}
        leaves: list = []
        _walk_leaves(self._param_td, (), leaves)
        for parent, k, path, v in leaves:
            new = reg.get(".".join(path))
            if new is not None and new is not v:
                parent._set_str(k, new, False, True)
        dev = self._param_td.device
        if dev is not None:
            devices = {t.device for t in reg.values()}
            if len(devices) == 1 and next(iter(devices)) != dev:
                self._param_td = self._param_td._map(lambda t: t, (), device=next(iter(devices)),
                                                     validate=False)
                if locked:
                    self._param_td.lock_()
        return self

    state_dict = nn.Module.state_dict  # type: ignore[assignment]
    load_state_dict = nn.Module.load_state_dict  # type: ignore[assignment]

    def _load_from_state_dict(self, state_dict: Mapping, prefix: str, local_metadata: dict,
                              strict: bool, missing_keys: list, unexpected_keys: list,
                              error_msgs: list) -> None:
        # the registry names contain dots, which nn.Module's loader reads as submodules
        assign = local_metadata.get("assign_to_params_buffers", False)
        local = {**self._parameters, **self._buffers}
        for name, current in local.items():
            key = prefix + name
            if key not in state_dict:
                missing_keys.append(key)
                continue
            value = state_dict[key]
            if not isinstance(value, Tensor):
                error_msgs.append(f"{key}: expected a tensor, got {type(value).__name__}")
                continue
            if value.shape != current.shape:
                error_msgs.append(
                    f"size mismatch for {key}: copying a param with shape {tuple(value.shape)}, "
                    f"the shape in current model is {tuple(current.shape)}"
                )
                continue
            if assign:
                self._swap_leaf(tuple(name.split(".")), _wrap_like(value, current))
            else:
                with torch.no_grad():
                    current.copy_(value)
        if strict:
            for key in state_dict:
                if key.startswith(prefix) and key[len(prefix):] not in local:
                    unexpected_keys.append(key)

    def __getattr__(self, name: str) -> Any:
        try:
            return nn.Module.__getattr__(self, name)
        except AttributeError:
            td = self.__dict__.get("_param_td")
            if td is None or name.startswith("__"):
                raise
            if name in td._keys_str():
                return td._get_str(name, NO_DEFAULT)
            return getattr(td, name)

    def __setattr__(self, name: str, value: Any) -> None:
        td = self.__dict__.get("_param_td")
        if td is not None and not name.startswith("_") and name in td._keys_str():
            self.set(name, value)
            return
        nn.Module.__setattr__(self, name, value)

    def __repr__(self) -> str:
        return TensorDictBase.__repr__(self)

    __hash__ = nn.Module.__hash__


def _register() -> None:
    from .pytree import register_tensordict_pytree

    register_tensordict_pytree(TensorDictParams)


_register()
