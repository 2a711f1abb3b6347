"""Preallocated exchange buffers of the batched envs, laid out from the sub-env's specs.

All the data one worker exchanges with the parent lives in one row of a ``uint8``
tensor ``[num_workers, row_bytes]``; every spec leaf is a typed view into it. A row
has three sections:

* ``"in"``: what the parent writes before a command: the action and state entries,
  and the ``"_reset"`` mask of a partial reset (``[*sub_batch]`` bool);
* ``"next"``: what a step produces: the next observations, rewards and done entries;
* ``"root"``: what a reset (or the reset half of ``step_and_maybe_reset``) produces:
  observations, done entries and state entries.

A worker's row is contiguous (so it can also travel through a pipe as raw bytes when
shared memory is off) and starts on a cache-line boundary (no false sharing between
workers). In the parent, a leaf is a strided view ``[num_workers, *sub_batch, *leaf]``
over all rows.

``ParallelEnv`` puts the tensor in anonymous shared memory (``shm.SharedMemory``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from steersman.data import Composite, NonTensor
from steersman.tensordict import TensorDict, TensorDictBase
from steersman.tensordict._utils import NestedKey

__all__ = ["BufferLayout", "SPEC_NAMES", "build_td"]

#: the ``full_*_spec`` attributes of an env, in the order they are compared and stored.
SPEC_NAMES: tuple[str, ...] = (
    "full_observation_spec",
    "full_action_spec",
    "full_state_spec",
    "full_reward_spec",
    "full_done_spec",
)

_ALIGN = 16  # byte alignment of a leaf inside a row (the largest element size)
_ROW_ALIGN = 64  # a row starts on a cache line


class Slot(NamedTuple):
    """One spec leaf in a row: its key, dtype, per-worker shape, byte offset and size."""

    key: NestedKey
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _leaves(spec: Composite, what: str, env_name: str) -> list[tuple[NestedKey, torch.dtype, tuple[int, ...]]]:
    out = []
    for key, leaf in spec.items(include_nested=True, leaves_only=True):
        if isinstance(leaf, NonTensor) or leaf.dtype is None:
            raise TypeError(
                f"{env_name}: the sub-env's {what} entry {key!r} is a non-tensor spec "
                f"({type(leaf).__name__}); batched envs exchange tensors only"
            )
        out.append((key, leaf.dtype, tuple(leaf.shape)))
    return out


class BufferLayout:
    """Where every exchanged entry lives in a worker's row (computed once from specs).

    Args:
        specs: the sub-env's ``full_*_spec`` Composites, by name (:data:`SPEC_NAMES`).
        sub_batch: the sub-env's batch size.
        env_name: used in error messages.
    """

    def __init__(self, specs: dict[str, Composite], sub_batch: torch.Size, env_name: str = "batched env") -> None:
        obs = _leaves(specs["full_observation_spec"], "observation_spec", env_name)
        act = _leaves(specs["full_action_spec"], "action_spec", env_name)
        state = _leaves(specs["full_state_spec"], "state_spec", env_name)
        rew = _leaves(specs["full_reward_spec"], "reward_spec", env_name)
        done = _leaves(specs["full_done_spec"], "done_spec", env_name)
        mask = [("_reset", torch.bool, tuple(sub_batch))]
        sections = {"in": act + state + mask, "next": obs + rew + done, "root": obs + done + state}
        self.sub_batch = torch.Size(sub_batch)
        self.sections: dict[str, list[Slot]] = {}
        self.ranges: dict[str, tuple[int, int]] = {}
        offset = 0
        for name, leaves in sections.items():
            start = offset
            slots: list[Slot] = []
            seen: set = set()
            for key, dtype, shape in leaves:
                if key in seen:  # e.g. a key both observed and in the state
                    continue
                seen.add(key)
                numel = 1
                for s in shape:
                    numel *= s
                nbytes = numel * (torch.empty((), dtype=dtype).element_size())
                offset = _round_up(offset, _ALIGN)
                slots.append(Slot(key, dtype, shape, offset, nbytes))
                offset += nbytes
            offset = _round_up(offset, _ALIGN)
            self.sections[name] = slots
            self.ranges[name] = (start, offset)
        self.row_bytes = max(_round_up(offset, _ROW_ALIGN), _ROW_ALIGN)

    def keys(self, section: str) -> list[NestedKey]:
        return [s.key for s in self.sections[section]]

    @staticmethod
    def _view(cols: Tensor, slot: Slot, lead: tuple[int, ...]) -> Tensor:
        """``cols``: the ``[*lead, row]`` bytes; the slot as ``[*lead, *shape]`` of its dtype."""
        if slot.nbytes == 0:
            return torch.empty((*lead, *slot.shape), dtype=slot.dtype, device=cols.device)
        raw = cols[..., slot.offset: slot.offset + slot.nbytes]
        return raw.view(slot.dtype).view((*lead, *slot.shape))

    def views(self, buf: Tensor, section: str) -> list[tuple[NestedKey, Tensor]]:
        """Typed views of one section: ``buf`` is a row ``[row_bytes]`` (views of shape
        ``[*sub_batch, *leaf]``) or all rows ``[n, row_bytes]`` (``[n, *sub_batch, *leaf]``)."""
        lead = tuple(buf.shape[:-1])
        return [(s.key, self._view(buf, s, lead)) for s in self.sections[section]]


def build_td(pairs: Iterable[tuple[NestedKey, Tensor]], batch_size: torch.Size, device: Any,
             flat: bool | None = None) -> TensorDict:
    """A TensorDict from ``(key, tensor)`` pairs (nested keys allowed; no copies, no checks)."""
    pairs = list(pairs)
    if flat is None:
        flat = all(type(k) is str for k, _ in pairs)
    if flat:
        return TensorDict.from_trusted(dict(pairs), batch_size, device)
    td = TensorDict.from_trusted({}, batch_size, device)
    for key, val in pairs:
        if type(key) is str:
            td.entries[key] = val
        else:
            td.set(key, val)
    return td


def get_entry(td: TensorDictBase, key: NestedKey) -> Any:
    """``td.get(key, None)`` with a fast path for a plain TensorDict and a string key."""
    if type(td) is TensorDict and type(key) is str:
        return td.entries.get(key)
    return td.get(key, None)
