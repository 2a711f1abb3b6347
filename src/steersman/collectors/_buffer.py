"""The rollout buffer of a collector: one preallocated block, written one step at a time.

A batch of ``T`` steps of a ``[*env_batch]`` env is stored *time-major*: every tensor
leaf of a transition is a ``[T, *env_batch, *leaf]`` typed view into one contiguous
``uint8`` block, so writing step ``t`` copies into contiguous rows (one
``torch._foreach_copy_`` for all the leaves). Collected batches are presented time-last,
``[*env_batch, T]``, as TorchRL's are: :attr:`RolloutBuffer.td` is that (strided) view.

The block comes from ``allocate(nbytes)``: ``torch.empty`` in-process, anonymous shared
memory in a worker process, whose parent then maps the same bytes with the same
:class:`Layout` (see ``multi``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from steersman.tensordict import TensorDict, TensorDictBase

__all__ = ["Layout", "RolloutBuffer", "leaf", "nested_td"]

_ALIGN = 64  # every leaf starts on a cache line


class Slot(NamedTuple):
    """One leaf of a step: its key (a tuple), dtype, per-step shape, byte offset and size
    (of all ``T`` steps)."""

    key: tuple[str, ...]
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def leaf(td: TensorDictBase, key: tuple[str, ...]) -> Any:
    """``td.get(key, None)`` with a fast walk through plain TensorDicts."""
    node: Any = td
    for k in key:
        if type(node) is TensorDict:
            node = node.entries.get(k)
        elif isinstance(node, TensorDictBase):
            node = node.get(k, None)
        else:
            return None
        if node is None:
            return None
    return node


def nested_td(pairs: Sequence[tuple[tuple[str, ...], Tensor]], batch_size: torch.Size,
              device: Any, group_dims: dict[tuple[str, ...], tuple[int, ...]] | None = None) -> TensorDict:
    """A TensorDict from ``(key tuple, tensor)`` pairs, sub-TensorDicts built as needed;
    the sub-TensorDict at key ``k`` gets ``batch_size + group_dims[k]`` (e.g. the agents of
    a multi-agent group), the others ``batch_size``."""
    root: dict = {}
    for key, val in pairs:
        node = root
        for k in key[:-1]:
            node = node.setdefault(k, {})
        node[key[-1]] = val

    dims = group_dims or {}

    def build(d: dict, prefix: tuple[str, ...]) -> TensorDict:
        bs = torch.Size((*batch_size, *dims[prefix])) if prefix in dims else batch_size
        return TensorDict.from_trusted(
            {k: build(v, (*prefix, k)) if isinstance(v, dict) else v for k, v in d.items()}, bs, device
        )

    return build(root, ())


class Layout:
    """Where each leaf of a ``T``-step time-major batch lives in a ``uint8`` block.

    Args:
        entries: ``(key tuple, dtype, per-step shape)`` of every leaf; per-step shapes start
            with the env batch size.
        steps: ``T``, the number of steps.
        env_batch: the env batch size.
        group_dims: ``{key tuple: dims}`` for sub-TensorDicts with batch dims of their own
            after the env's (a multi-agent group's ``[n_agents]``): kept after ``T``.

    Picklable (plain tuples), so a worker can describe its block to the parent.

    Example:
        >>> import torch
        >>> from steersman.collectors._buffer import Layout
        >>> lay = Layout([(("obs",), torch.float32, (2, 4)), (("next", "done"), torch.bool, (2, 1))],
        ...              steps=5, env_batch=torch.Size([2]))
        >>> td = lay.time_last(torch.zeros(lay.nbytes, dtype=torch.uint8), torch.device("cpu"))
        >>> td.batch_size, td["obs"].shape, td["next", "done"].dtype
        (torch.Size([2, 5]), torch.Size([2, 5, 4]), torch.bool)
    """

    def __init__(self, entries: Sequence[tuple[tuple[str, ...], torch.dtype, tuple[int, ...]]],
                 steps: int, env_batch: torch.Size,
                 group_dims: dict[tuple[str, ...], tuple[int, ...]] | None = None) -> None:
        self.steps = int(steps)
        self.env_batch = torch.Size(env_batch)
        self.group_dims = dict(group_dims or {})
        slots = []
        offset = 0
        for key, dtype, shape in entries:
            numel = 1
            for s in shape:
                numel *= int(s)
            nbytes = self.steps * numel * torch.empty((), dtype=dtype).element_size()
            slots.append(Slot(tuple(key), dtype, tuple(int(s) for s in shape), offset, nbytes))
            offset += (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
        self.slots: list[Slot] = slots
        self.nbytes = max(offset, _ALIGN)

    @classmethod
    def from_step(cls, step: TensorDictBase, steps: int, extra: Sequence = ()) -> Layout:
        """The layout of ``steps`` copies of the transition ``step`` (its tensor leaves),
        plus ``extra`` ``(key tuple, dtype, shape)`` entries.

        Raises:
            TypeError: a leaf is not a tensor (non-tensor data cannot be preallocated).
        """
        entries = []
        nb = len(step.batch_size)
        groups = {}
        for key in step.keys(include_nested=True):
            val = step.get(key)
            if isinstance(val, TensorDictBase) and len(val.batch_size) > nb:
                groups[(key,) if type(key) is str else tuple(key)] = tuple(val.batch_size[nb:])
        for key in step.keys(include_nested=True, leaves_only=True):
            key = (key,) if type(key) is str else tuple(key)
            val = leaf(step, key)
            if not isinstance(val, Tensor):
                raise TypeError(
                    f"collector: the transition entry {key!r} is a {type(val).__name__}, not a "
                    "tensor; collectors preallocate tensors only (drop or encode that entry)"
                )
            entries.append((key, val.dtype, tuple(val.shape)))
        entries.extend(extra)
        return cls(entries, steps, step.batch_size, groups)

    @property
    def keys(self) -> list[tuple[str, ...]]:
        return [s.key for s in self.slots]

    def time_major(self, memory: Tensor) -> list[Tensor]:
        """The typed ``[T, *shape]`` view of every slot over ``memory`` (``uint8 [nbytes]``)."""
        out = []
        for s in self.slots:
            if s.nbytes == 0:
                out.append(torch.empty((self.steps, *s.shape), dtype=s.dtype, device=memory.device))
                continue
            raw = memory[s.offset: s.offset + s.nbytes]
            out.append(raw.view(s.dtype).view(self.steps, *s.shape))
        return out

    def time_last(self, memory: Tensor, device: Any, views: list[Tensor] | None = None) -> TensorDict:
        """The ``[*env_batch, T]`` TensorDict over ``memory`` (strided views, no copy)."""
        if views is None:
            views = self.time_major(memory)
        nb = len(self.env_batch)
        order = (*range(1, nb + 1), 0)
        pairs = []
        for s, v in zip(self.slots, views):
            pairs.append((s.key, v.permute(*order, *range(nb + 1, v.ndim))))
        return nested_td(pairs, torch.Size((*self.env_batch, self.steps)), device, self.group_dims)


class RolloutBuffer:
    """``T`` steps of transitions in one preallocated block; ``write(td, t)`` fills step ``t``.

    Args:
        step: the first transition (``[*env_batch]``, with its ``"next"`` entry): the leaves
            and their dtypes and shapes.
        steps: ``T``.
        device: where the block lives (the collector's storing device).
        extra: more ``(key tuple, dtype, per-step shape)`` leaves written by the collector
            itself (e.g. ``("collector", "traj_ids")``), not by :meth:`write`.
        allocate: ``nbytes -> uint8 tensor``; default ``torch.empty`` on ``device``.

    Attributes:
        td: the ``[*env_batch, T]`` TensorDict over the block (strided views).
        layout: the :class:`Layout`.
        memory: the ``uint8`` block.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.collectors._buffer import RolloutBuffer
        >>> step = TensorDict({"obs": torch.zeros(3, 2), "next": {"obs": torch.ones(3, 2)}}, [3])
        >>> buf = RolloutBuffer(step, steps=4, device=torch.device("cpu"))
        >>> for t in range(4):
        ...     step["obs"] = torch.full((3, 2), float(t))
        ...     buf.write(step, t)
        >>> buf.td.batch_size, buf.td["obs"][0, :, 0]
        (torch.Size([3, 4]), tensor([0., 1., 2., 3.]))
    """

    def __init__(self, step: TensorDictBase, steps: int, device: torch.device, extra: Sequence = (),
                 allocate: Callable[[int], Tensor] | None = None) -> None:
        lay = Layout.from_step(step, steps, extra)
        n_written = len(lay.slots) - len(extra)
        if allocate is None:
            memory = torch.empty(lay.nbytes, dtype=torch.uint8, device=device)
        else:
            memory = allocate(lay.nbytes)
        self.layout = lay
        self.memory = memory
        self.device = device
        views = lay.time_major(memory)
        self.views = views
        self.td = lay.time_last(memory, device, views)
        self._keys = lay.keys[:n_written]
        self.keys = set(self._keys)  # the entries written by :meth:`write`
        written = views[:n_written]
        self._rows = [[v[t] for v in written] for t in range(lay.steps)]
        self._foreach = all(v.device == step.device or step.device is None for v in written)

    def write(self, td: TensorDictBase, t: int) -> None:
        """Copies the leaves of the transition ``td`` into step ``t``."""
        srcs = [leaf(td, k) for k in self._keys]
        if self._foreach:
            try:
                torch._foreach_copy_(self._rows[t], srcs)
                return
            except Exception:  # noqa: BLE001 - redone leaf by leaf for a precise error
                pass
        for key, dst, src in zip(self._keys, self._rows[t], srcs):
            if src is None:
                raise KeyError(
                    f"collector: step {t} of the batch has no entry {key!r}, which the first "
                    "transition had; the policy and env must write the same entries at every step"
                )
            try:
                dst.copy_(src)
            except RuntimeError as exc:
                raise ValueError(
                    f"collector: entry {key!r} has shape {list(src.shape)} at step {t}, the first "
                    f"transition had {list(dst.shape)}"
                ) from exc
