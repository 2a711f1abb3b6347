"""Functional calls: module parameters as TensorDicts, and back.

* :func:`from_module` — the parameters and buffers of a module as a nested TensorDict
  (keys are submodule names), holding the module's own tensors (no copies).
* :func:`to_module` — swaps the leaves of such a TensorDict into a module (like
  ``torch.func.functional_call``), returns the previous values; also a context manager.
* :func:`from_modules` — the stacked parameters of N modules of the same structure
  (batch ``[N]``), for ensembles with ``torch.vmap`` (see :func:`ensemble_call`).
* :func:`shared_copy` — a copy of a module that shares every parameter/buffer storage
  (e.g. an eval-mode twin of a training module, at no memory cost).

Soft target updates are TensorDict arithmetic: ``target.lerp_(online, tau)`` with
``target = from_module(target_net).detach()`` (detached views, same storage) or inside
``torch.no_grad()``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from ._utils import NO_DEFAULT
from .base import TensorDictBase, _is_non_tensor
from .td import TensorDict

__all__ = ["from_module", "from_modules", "to_module", "ensemble_call", "shared_copy"]

_EMPTY = torch.Size(())


# ---------------------------------------------------------------------- from_module
def _from_module(module: nn.Module, filter_empty: bool) -> TensorDict | None:
    from .params import TensorDictParams

    if isinstance(module, TensorDictParams):
        return module._param_td.copy()
    out: dict[str, Any] = {}
    for name, p in module._parameters.items():
        if p is not None:
            out[name] = p
    for name, b in module._buffers.items():
        if b is not None:
            out[name] = b
    for name, sub in module._modules.items():
        if sub is None:
            continue
        s = _from_module(sub, filter_empty)
        if s is not None:
            out[name] = s
    if not out and filter_empty:
        return None
    return TensorDict._new_unsafe(out, _EMPTY)


def _nest(flat: dict) -> dict:
    out: dict = {}
    for key, v in flat.items():
        *path, last = key.split(".")
        node = out
        for k in path:
            node = node.setdefault(k, {})
        node[last] = v
    return out


def from_module(
    module: nn.Module,
    as_module: bool = False,
    lock: bool = False,
    use_state_dict: bool = False,
    filter_empty: bool = True,
) -> TensorDictBase:
    """The parameters and buffers of ``module`` as a nested TensorDict (batch ``[]``).

    Keys mirror the module tree (``td["0", "weight"]`` is ``module[0].weight``); the leaves
    are the module's own ``nn.Parameter``/buffer objects, not copies. Submodules without
    parameters or buffers get no entry unless ``filter_empty=False``.

    Args:
        module: the module to read.
        as_module: return a :class:`~steersman.tensordict.TensorDictParams` (parameters stay
            parameters, buffers stay buffers) that can be stored inside another module.
        lock: lock the result (no new/removed keys).
        use_state_dict: read ``module.state_dict()`` instead (state-dict hooks run; leaves
            are detached tensors sharing storage).
        filter_empty: drop submodules that hold nothing.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
        >>> params = TensorDict.from_module(net)
        >>> sorted(params.keys(include_nested=True, leaves_only=True))
        [('0', 'bias'), ('0', 'weight'), ('2', 'bias'), ('2', 'weight')]
        >>> params["0", "weight"] is net[0].weight
        True
    """
    if use_state_dict:
        td: TensorDictBase = TensorDict(_nest(dict(module.state_dict(keep_vars=False))), _EMPTY)
    else:
        found = _from_module(module, filter_empty)
        td = TensorDict._new_unsafe({}, _EMPTY) if found is None else found
    if as_module:
        from .params import TensorDictParams

        td = TensorDictParams(td, no_convert=True)
    if lock:
        td.lock_()
    return td


def from_modules(
    *modules: nn.Module,
    as_module: bool = False,
    lock: bool = True,
    use_state_dict: bool = False,
    lazy_stack: bool = False,
    expand_identical: bool = False,
) -> TensorDictBase:
    """The parameters of N modules of identical structure, stacked: batch ``[N]``.

    The dense result (default) holds *new* leaves: ``nn.Parameter`` stacks of the modules'
    parameters (same ``requires_grad``) and stacked buffers. Optimize these, not the
    modules' own parameters. ``lazy_stack=True`` returns a lazy stack of the modules' own
    tensors instead (no copy; cannot be combined with ``as_module``).

    Args:
        *modules: the modules; same parameter names and shapes.
        as_module: wrap the result in :class:`~steersman.tensordict.TensorDictParams`.
        lock: lock the result (default, as in ``tensordict``).
        use_state_dict: read each module through its ``state_dict``.
        lazy_stack: see above.
        expand_identical: a tensor that is the same object in every module is expanded
            (one storage) instead of stacked.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> nets = [torch.nn.Linear(3, 2) for _ in range(4)]
        >>> params = TensorDict.from_modules(*nets)
        >>> params.batch_size, params["weight"].shape
        (torch.Size([4]), torch.Size([4, 2, 3]))
        >>> torch.equal(params["weight"][1], nets[1].weight)
        True
    """
    if not modules:
        raise ValueError("from_modules needs at least one module")
    if lazy_stack and as_module:
        raise ValueError("from_modules: lazy_stack=True cannot be combined with as_module=True")
    tds = [from_module(m, use_state_dict=use_state_dict) for m in modules]
    ref_keys = tds[0].keys(include_nested=True, leaves_only=True)
    ref_set = set(ref_keys)
    for i, td in enumerate(tds[1:], 1):
        keys = td.keys(include_nested=True, leaves_only=True)
        if set(keys) != ref_set:
            extra = [k for k in keys if k not in ref_set]
            missing = [k for k in ref_keys if k not in set(keys)]
            raise ValueError(
                f"from_modules: module {i} does not have the structure of module 0: "
                f"extra keys {extra[:3]}, missing keys {missing[:3]}"
            )
    if lazy_stack:
        from .lazy import lazy_stack as _lazy_stack

        out: TensorDictBase = _lazy_stack(tds, 0)
    else:
        n = len(tds)

        def stack(*leaves: Tensor) -> Tensor:
            first = leaves[0]
            if expand_identical and all(t is first for t in leaves):
                return first.expand(n, *first.shape)
            for i, t in enumerate(leaves[1:], 1):
                if t.shape != first.shape:
                    raise ValueError(
                        f"from_modules: shape {list(t.shape)} in module {i} does not match "
                        f"{list(first.shape)} in module 0"
                    )
            with torch.no_grad():
                s = torch.stack(leaves)
            if isinstance(first, nn.Parameter):
                return nn.Parameter(s, requires_grad=first.requires_grad)
            return s

        out = tds[0]._map(stack, tuple(tds[1:]), batch_size=torch.Size([n]), validate=False)
    if as_module:
        from .params import TensorDictParams

        out = TensorDictParams(out, no_convert=True)
    if lock:
        out.lock_()
    return out


# ---------------------------------------------------------------------- to_module
class _SwapTensorDict(TensorDict):
    """The previous values returned by :func:`to_module`; as a context manager, puts
    them back into the module on exit (also when the block raises)."""

    __slots__ = ("_swap_undo",)

    def __enter__(self) -> _SwapTensorDict:
        return self

    def __exit__(self, *exc: Any) -> bool:
        undo = getattr(self, "_swap_undo", None)
        if undo is None:
            raise RuntimeError("these values were already restored (a to_module() result restores once)")
        self._swap_undo = None
        undo()
        return False


def _params_cls() -> type:
    global _TDP
    if _TDP is None:
        from .params import TensorDictParams

        _TDP = TensorDictParams
    return _TDP


_TDP: type | None = None


def _plan(td: TensorDictBase, module: nn.Module, path: tuple, plan: list) -> None:
    """Appends (owner, registry, name, value, path) for every leaf; raises on a mismatch."""
    if isinstance(module, _TDP or _params_cls()):
        _plan_params(td, module, module._param_td, path, (), plan)
        return
    params = module._parameters
    buffers = module._buffers
    src = td._tensordict if type(td) is TensorDict else {k: td._get_str(k, NO_DEFAULT) for k in td._keys_str()}
    for k, v in src.items():
        if isinstance(v, Tensor):
            if k in params:
                plan.append((module, params, k, v, path + (k,)))
            elif k in buffers:
                plan.append((module, buffers, k, v, path + (k,)))
            elif module._modules.get(k) is not None:
                raise _mismatch(path + (k,), "the module has a submodule there, the TensorDict a tensor")
            else:
                raise _mismatch(path + (k,), f"{type(module).__name__} has no parameter or buffer {k!r}")
        elif _is_non_tensor(v):
            continue
        else:
            sub = module._modules.get(k)
            if sub is None:
                if k in params or k in buffers:
                    raise _mismatch(path + (k,), "the module has a tensor there, the TensorDict a nested TensorDict")
                raise _mismatch(path + (k,), f"{type(module).__name__} has no submodule {k!r}")
            _plan(v, sub, path + (k,), plan)


def _plan_params(td: TensorDictBase, owner: Any, node: TensorDictBase, path: tuple, inner: tuple,
                 plan: list) -> None:
    for k in td._keys_str():
        v = td._get_str(k, NO_DEFAULT)
        if _is_non_tensor(v):
            continue
        p = path + (k,)
        cur = node._get_str(k, None)
        if cur is None:
            raise _mismatch(p, "the TensorDictParams has no such entry")
        if isinstance(v, Tensor) != isinstance(cur, Tensor):
            raise _mismatch(p, "a tensor on one side, a nested TensorDict on the other")
        if isinstance(v, Tensor):
            plan.append((owner, None, inner + (k,), v, p))
        else:
            _plan_params(v, owner, cur, p, inner + (k,), plan)


def _mismatch(path: tuple, why: str) -> KeyError:
    return KeyError(
        f"to_module: the TensorDict does not match the module at key {path!r} "
        f"({'.'.join(path)}): {why}. The module was left unchanged."
    )


def _undo(undo: list) -> None:
    """Restores (owner, registry, name, old, inplace) records, last first."""
    for owner, reg, name, old, inplace in reversed(undo):
        if reg is None:  # a TensorDictParams leaf
            if inplace:
                with torch.no_grad():
                    owner._param_td.get(name).copy_(old)
            else:
                owner._swap_leaf(name, old)
        elif inplace and old is not None:
            with torch.no_grad():
                reg[name].copy_(old)
        else:
            reg[name] = old


def _swap_td(entries: list, undo: Callable[[], Any]) -> _SwapTensorDict:
    root: dict = {}
    for path, value in entries:
        node = root
        for k in path[:-1]:
            sub = node.get(k)
            if sub is None:
                sub = node[k] = {}
            node = sub
        node[path[-1]] = value
    out = _SwapTensorDict._new_unsafe({k: _nested(v) for k, v in root.items()}, _EMPTY)
    out._swap_undo = undo
    return out


def _nested(v: Any) -> Any:
    if type(v) is dict:
        return TensorDict._new_unsafe({k: _nested(w) for k, w in v.items()}, _EMPTY)
    return v


def to_module(
    td: TensorDictBase,
    module: nn.Module,
    *,
    inplace: bool | None = None,
    return_swap: bool = True,
    use_state_dict: bool = False,
    non_blocking: bool = False,
) -> TensorDictBase | None:
    """Puts the leaves of ``td`` into ``module``; returns the values they replace.

    Keys follow :func:`from_module` (``("0", "weight")`` is ``module[0].weight``); a
    partial TensorDict updates only its keys. By default the tensors themselves are put
    in place, bypassing ``nn.Module``'s registration checks as
    ``torch.func.functional_call`` does: a non-leaf tensor (or a batched tensor inside
    ``torch.vmap``) is used as is, so gradients flow back to ``td``. ``inplace=True``
    copies the values into the existing tensors instead (under ``no_grad``).

    The whole TensorDict is checked first: a key the module does not have raises a
    ``KeyError`` naming the first mismatched path, and the module is left unchanged.

    The result (with ``return_swap=True``) is a TensorDict of the previous values, and a
    context manager: ``with params.to_module(module): ...`` restores the originals on
    exit, even if the block raises. (Slots that held ``None``, e.g. a missing bias, are
    restored by the context manager but have no entry in the TensorDict.)

    Args:
        td: the values, e.g. from :func:`from_module`/:func:`from_modules` (one member).
        module: the module to write into.
        inplace: copy into the existing tensors (``True``) or swap the objects (default).
        return_swap: return the previous values (``False``: return ``None``).
        use_state_dict: write through ``module.load_state_dict`` (hooks run; in place).
        non_blocking: passed to ``copy_`` when copying.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> net = torch.nn.Linear(2, 1)
        >>> zeros = TensorDict.from_module(net).detach().clone().zero_()
        >>> with zeros.to_module(net):
        ...     net(torch.ones(1, 2))
        tensor([[0.]])
        >>> bool(net.weight.abs().sum() > 0)  # the originals are back
        True
    """
    if use_state_dict:
        return _to_module_state_dict(td, module, return_swap)
    plan: list = []
    _plan(td, module, (), plan)
    inplace = bool(inplace)
    undo: list = []
    entries: list = []
    seen: dict = {}
    for owner, reg, name, value, path in plan:
        if reg is None:  # a TensorDictParams: keep its TensorDict and registry in sync
            if inplace:
                cur = owner._param_td.get(name)
                old = cur.detach().clone()
                with torch.no_grad():
                    cur.copy_(value, non_blocking=non_blocking)
            else:
                old = owner._swap_leaf(name, value)
        else:
            cur = reg[name]
            if inplace and cur is not None:
                old = cur.detach().clone()
                with torch.no_grad():
                    cur.copy_(value, non_blocking=non_blocking)
            else:
                old = cur
                reg[name] = value
        undo.append((owner, reg, name, old, inplace))
        if not return_swap:
            continue
        key = (id(reg), name) if reg is not None else (id(owner), name)
        if key in seen:  # the same slot reached twice (a shared submodule): the original
            old = seen[key]
        else:
            seen[key] = old
        if old is not None:
            entries.append((path, old))
    if not return_swap:
        return None
    return _swap_td(entries, partial(_undo, undo))


def _to_module_state_dict(td: TensorDictBase, module: nn.Module, return_swap: bool) -> TensorDictBase | None:
    current = module.state_dict(keep_vars=False)
    flat: dict[str, Tensor] = {}
    for key in td.keys(include_nested=True, leaves_only=True):
        key = (key,) if type(key) is str else key
        v = td.get(key)
        if not isinstance(v, Tensor):
            continue
        name = ".".join(key)
        if name not in current:
            raise _mismatch(key, "no such entry in module.state_dict()")
        flat[name] = v
    old = {k: current[k].clone() for k in flat} if return_swap else None
    module.load_state_dict(flat, strict=False)
    if old is None:
        return None
    return _swap_td([(tuple(k.split(".")), v) for k, v in old.items()],
                    partial(module.load_state_dict, old, strict=False))


# ---------------------------------------------------------------------- ensembles
def ensemble_call(
    module: nn.Module,
    params: TensorDictBase,
    *inputs: Any,
    input_dims: int | None | Sequence[int | None] = None,
    randomness: str = "error",
    chunk_size: int | None = None,
) -> Any:
    """Calls ``module`` once per member of stacked ``params`` (batch ``[N]``) with ``torch.vmap``.

    Equivalent to ``torch.stack([call(module with params[i], *inputs) for i in range(N)])``
    but in one vectorized call: gradients flow to ``params``. The pattern it wraps::

        def call(p, x):
            with p.to_module(module):
                return module(x)
        torch.vmap(call, (0, None))(params, x)

    Args:
        module: one module of the ensemble's structure (its own parameters are unused and
            restored after the call).
        params: from :func:`from_modules` (or any TensorDict with the module's keys and a
            leading ensemble dim).
        *inputs: the module's inputs.
        input_dims: the vmapped dim of each input (``None``: shared by every member, the
            default; ``0``: one slice per member).
        randomness: ``torch.vmap``'s ``randomness`` (``"different"`` for dropout).
        chunk_size: ``torch.vmap``'s ``chunk_size``.

    Outputs have a leading ``[N]`` dim. Modules that update buffers in place in the
    forward pass (batch-norm in training mode) cannot be vmapped; use ``eval()``.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict, ensemble_call
        >>> nets = [torch.nn.Linear(3, 2) for _ in range(5)]
        >>> params = TensorDict.from_modules(*nets)
        >>> x = torch.randn(7, 3)
        >>> out = ensemble_call(nets[0], params, x)
        >>> out.shape
        torch.Size([5, 7, 2])
        >>> torch.allclose(out[3], nets[3](x), atol=1e-6)
        True
    """
    if input_dims is None or isinstance(input_dims, int):
        in_dims = (0, *([input_dims] * len(inputs)))
    else:
        in_dims = (0, *input_dims)
    plan: list = []
    _plan(params, module, (), plan)  # validated once, outside vmap
    if any(reg is None for _, reg, _, _, _ in plan):  # a TensorDictParams inside: generic path
        def call_td(p: TensorDictBase, *xs: Any) -> Any:
            with to_module(p, module):
                return module(*xs)

        return torch.vmap(call_td, in_dims, 0, randomness=randomness, chunk_size=chunk_size)(params, *inputs)
    # fast path: vmap over the flat tuple of leaves and swap them straight into the registries
    slots = [(reg, name) for _, reg, name, _, _ in plan]
    leaves = tuple(v for _, _, _, v, _ in plan)

    def call(flat: tuple, *xs: Any) -> Any:
        old = [reg[name] for reg, name in slots]
        try:
            for (reg, name), v in zip(slots, flat):
                reg[name] = v
            return module(*xs)
        finally:
            for (reg, name), o in zip(reversed(slots), reversed(old)):
                reg[name] = o

    return torch.vmap(call, in_dims, 0, randomness=randomness, chunk_size=chunk_size)(leaves, *inputs)


# ---------------------------------------------------------------------- twins
def shared_copy(module: nn.Module, *, eval_mode: bool = True, requires_grad: bool | None = None) -> nn.Module:
    """A copy of ``module`` whose parameters and buffers share the original's storage.

    A deep copy in which every parameter and buffer is the original's (no extra memory):
    in-place updates of the original (optimizer steps, running-stat updates) show in the
    copy. Use it instead of toggling ``train()``/``eval()``: e.g. an eval-mode twin of a
    training policy for data collection.

    Args:
        module: the module to copy.
        eval_mode: put the copy in ``eval()`` mode (dropout off, batch-norm uses running
            stats); ``False`` keeps each submodule's current mode.
        requires_grad: ``None`` (default): the copy holds the very same ``nn.Parameter``
            objects (gradients through the copy reach the original's ``.grad``).
            ``False``: new ``nn.Parameter`` views of the same storage with
            ``requires_grad=False`` (a frozen twin, e.g. a target network read-out).
            ``True``: new views that require grad, with their own ``.grad``.

    The sharing holds as long as the original is updated in place; re-assigning a
    parameter of the original (``module.weight = nn.Parameter(...)``, or a ``.to()`` that
    moves device) is not mirrored. Buffers are always the same objects.

    Example:
        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Dropout(0.5))
        >>> twin = shared_copy(net)
        >>> twin[0].weight is net[0].weight, twin.training, net.training
        (True, False, True)
        >>> with torch.no_grad():
        ...     _ = net[0].weight.zero_()
        >>> bool((twin[0].weight == 0).all())
        True
    """
    memo: dict[int, Any] = {}
    for m in module.modules():
        for p in m._parameters.values():
            if p is None or id(p) in memo:
                continue
            if requires_grad is None:
                memo[id(p)] = p
            else:
                memo[id(p)] = nn.Parameter(p.detach(), requires_grad=requires_grad)
        for b in m._buffers.values():
            if b is not None:
                memo[id(b)] = b
        params_td = getattr(m, "_param_td", None)  # a TensorDictParams: its TensorDict too
        if isinstance(params_td, TensorDictBase):
            for t in params_td._tensor_leaves():
                memo.setdefault(id(t), t)
    twin = copy.deepcopy(module, memo)
    if eval_mode:
        twin.eval()
    return twin


def _register() -> None:
    from .pytree import register_tensordict_pytree

    register_tensordict_pytree(_SwapTensorDict)


_register()
