"""Batch indices: which batch dims each element of an index reads and which it makes.

An index over a container's batch dims (``td[0, 1:3, None, mask]``) is a tuple of
elements, each an int, a slice, ``None``, a long tensor or a bool mask, once
:func:`~steersman.tensordict._utils.normalize_index` has turned lists into tensors and
expanded ``...``. :func:`plan_index` reads such an index once into an
:class:`IndexPlan`: one :class:`IndexStep` per element, saying which input dims it
consumes and which output dims it makes, with torch's rules for where the dims of
tensor indices go. Containers that can't hand the index to their leaves as is use the
plan: a lazy stack sends the step at its stack dim to its list of members and the rest
to each member; an h5-backed TensorDict composes the steps with the selection it holds;
a TensorDict with dim names keeps the names of the dims that survive.

Example:
    >>> import torch
    >>> plan = plan_index((0, None, slice(1, 3)), ndim=3)
    >>> [(s.kind, s.in_dim, s.out_dim) for s in plan.steps]
    [('int', 0, None), ('new', 1, 0), ('slice', 1, 1), ('slice', 2, 2)]
    >>> plan.out_ndim, torch.empty(4, 5, 6)[0, None, 1:3].shape
    (3, torch.Size([1, 2, 6]))
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

__all__ = ["IndexStep", "IndexPlan", "plan_index", "as_index", "on_cpu", "INT", "SLICE", "NEW", "TENSOR", "MASK"]

#: the kinds of index elements
INT = "int"  #: an int (or a 0-dim integer tensor): picks one position, drops the dim
SLICE = "slice"  #: a slice: keeps the dim, maybe shorter
NEW = "new"  #: ``None``: adds a dim of size 1, reads none
TENSOR = "tensor"  #: an integer tensor of 1+ dims: gathers positions of one dim
MASK = "mask"  #: a bool tensor (or a Python bool) over ``mask.ndim`` dims: keeps the True ones

_FULL = slice(None)
#: builds a NamedTuple from a tuple of all its fields (``IndexStep(...)`` costs 5x more)
_new_tuple = tuple.__new__


class IndexStep(NamedTuple):
    """One element of an index and the dims it acts on."""

    kind: str
    """``INT``, ``SLICE``, ``NEW``, ``TENSOR`` or ``MASK``."""
    item: Any
    """The element: an int (a 0-dim integer tensor becomes one), a slice, ``None``, an
    integer tensor, or a bool tensor (a Python bool becomes a 0-dim one)."""
    in_dim: int
    """The first input dim it consumes; for a step that consumes none (``NEW``, a 0-dim
    mask), the input dim it comes before."""
    n_in: int
    """How many input dims it consumes: 0 for ``NEW``, ``mask.ndim`` for a mask, else 1."""
    out_dim: int | None
    """The output dim it makes; None for an ``INT``, which makes none. The ``TENSOR`` and
    ``MASK`` steps of one index share one block of output dims (their indices broadcast
    together): each of them has the block's first dim here."""


class IndexPlan(NamedTuple):
    """An index read once: its steps and where the dims of its tensor indices go."""

    steps: tuple[IndexStep, ...]
    """One step per element of the index, then a full slice for each trailing input
    dim the index leaves out (so every input dim is consumed by exactly one step)."""
    ndim: int
    """The number of input dims (the indexed batch dims)."""
    out_ndim: int
    """The number of output dims."""
    n_advanced: int
    """How many ``TENSOR`` and ``MASK`` steps (torch's "advanced" indices) there are."""
    block_dim: int | None
    """The first output dim of the advanced block, None without advanced steps. torch puts
    the block where the first advanced step is when no ``SLICE`` or ``NEW`` step stands
    between two advanced ones (``INT`` steps don't count), else at dim 0."""

    def step_at(self, dim: int) -> IndexStep:
        """The step that consumes input dim ``dim``."""
        for step in self.steps:
            if step.in_dim <= dim < step.in_dim + step.n_in:
                return step
        raise IndexError(f"dim {dim} is out of range for an index over {self.ndim} dims")


def _classify(item: Any) -> tuple[str, Any, int]:
    """(kind, item, input dims consumed) of one index element."""
    if item is None:
        return NEW, None, 0
    if type(item) is slice:
        return SLICE, item, 1
    if type(item) is bool:  # before int: a bool is an int to Python, a 0-dim mask to torch
        return MASK, torch.tensor(item), 0
    if isinstance(item, int):
        return INT, item, 1
    if isinstance(item, Tensor):
        if item.dtype is torch.bool:
            return MASK, item, item.ndim
        if item.is_floating_point() or item.is_complex():
            raise IndexError(f"tensors used as indices must be long, int or bool, got {item.dtype}")
        if item.ndim == 0:
            return INT, int(item), 1
        return TENSOR, item, 1
    raise TypeError(
        f"invalid index element {item!r} of type {type(item).__name__}: expected int, slice, "
        "None, a long tensor or a bool mask (normalize_index converts lists and expands '...')"
    )


def plan_index(index: Any, ndim: int) -> IndexPlan:
    """Reads a normalized index over ``ndim`` batch dims into an :class:`IndexPlan`.

    Raises IndexError when the index consumes more than ``ndim`` dims or holds a float
    tensor, TypeError for an element that is no index (``...`` must be expanded first).
    """
    # one pass to classify (no generator expressions: lazy[i] runs this on every call)
    kinds = []  # (kind, item, input dims consumed), one per element
    advanced = []  # the positions in ``kinds`` of the TENSOR and MASK elements
    block_ndim = 0  # the dims of their broadcast block
    used = 0
    for it in index if type(index) is tuple else (index,):
        kind, it, n_in = _classify(it)
        if kind == TENSOR or kind == MASK:
            advanced.append(len(kinds))
            block_ndim = max(block_ndim, 1 if kind == MASK else it.ndim)
        kinds.append((kind, it, n_in))
        used += n_in
    if used > ndim:
        raise IndexError(
            f"too many indices for the batch: the index addresses {used} dims but the batch "
            f"has {ndim} (index {index!r})"
        )
    kinds += [(SLICE, _FULL, 1)] * (ndim - used)
    apart = False  # a SLICE or NEW between two advanced elements: the block goes first
    if len(advanced) > 1:
        for kind, _, _ in kinds[advanced[0] : advanced[-1]]:
            apart = apart or kind == SLICE or kind == NEW
    block_dim = 0 if apart else None  # else: set at the first advanced step
    out_dim = block_ndim if apart else 0
    steps = []
    in_dim = 0
    for kind, it, n_in in kinds:
        if kind == INT:
            out = None
        elif kind == TENSOR or kind == MASK:
            if block_dim is None:  # the first advanced step of an in-place block
                block_dim = out_dim
                out_dim += block_ndim
            out = block_dim
        else:
            out = out_dim
            out_dim += 1
        steps.append(_new_tuple(IndexStep, (kind, it, in_dim, n_in, out)))
        in_dim += n_in
    return _new_tuple(IndexPlan, (tuple(steps), ndim, out_dim, len(advanced), block_dim))


def as_index(items: list | tuple) -> Any:
    """The index made of ``items`` with trailing full slices dropped: ``()`` when nothing
    is left (the whole batch), the element alone when one is left, else a tuple."""
    n = len(items)
    while n and type(items[n - 1]) is slice and items[n - 1] == _FULL:
        n -= 1
    if n == 1:
        return items[0]
    return tuple(items[:n])


def on_cpu(index: Any) -> Any:
    """``index`` with its tensors moved to the CPU (to index CPU position tensors with)."""
    if isinstance(index, Tensor):
        return index.cpu()
    if type(index) is tuple:
        return tuple(i.cpu() if isinstance(i, Tensor) else i for i in index)
    return index
