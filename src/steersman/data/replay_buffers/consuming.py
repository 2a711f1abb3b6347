"""Samplers for streaming and asynchronous training: items consumed after use, items
weighted by how stale the policy that produced them is.

:class:`ConsumingSampler` returns each item at most ``max_sample_count`` times; then the
item no longer counts (``len(buffer)`` is the number of items left) and its slot is
written first by the next writes. :class:`StalenessAwareSampler` draws items with weights
that decay with ``consumer_version - policy_version`` and drops items past a cutoff.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from steersman.tensordict import NestedKey, TensorDict, TensorDictBase, unravel_key

from ._checkpoint import CheckpointError, get_field
from .samplers import Sampler
from .storages import _EMPTY, Storage, TensorStorage

__all__ = ["ConsumingSampler", "StalenessAwareSampler"]


class ConsumingSampler(Sampler):
    """A uniform sampler that consumes each item after ``max_sample_count`` returns.

    A batch holds distinct items drawn uniformly among those not yet consumed; when fewer
    are left than asked for, the batch is shorter (and ``ran_out`` is set once none are
    left). A consumed item is skipped until its slot is written again. Through a
    :class:`ReplayBuffer`, ``len(rb)`` counts the items not yet consumed, and writes fill
    consumed slots (oldest first) before the writer's cursor moves on.

    Args:
        max_sample_count: returns after which an item is consumed (default 1).

    Limits: one-dimensional storages; no prefetching (a prefetched batch would consume
    items the user never saw); not with prioritized sampling.

    Example:
        >>> import torch
        >>> from steersman.data.replay_buffers import ListStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=ListStorage(10), sampler=ConsumingSampler(), batch_size=3)
        >>> rb.extend([torch.tensor(i) for i in range(4)]).tolist()
        [0, 1, 2, 3]
        >>> _ = torch.manual_seed(0)
        >>> batch = rb.sample()
        >>> batch.tolist(), len(rb)  # item 2 is the one not consumed yet
        ([0, 1, 3], 1)
        >>> rb.extend([torch.tensor(9)]).tolist()  # into the oldest consumed slot
        [0]
    """

    _consumes = True

    def __init__(self, max_sample_count: int = 1) -> None:
        if isinstance(max_sample_count, bool) or not isinstance(max_sample_count, int) or max_sample_count < 1:
            raise ValueError(f"max_sample_count must be a positive integer, got {max_sample_count!r}")
        self.max_sample_count = max_sample_count
        self._count = torch.zeros(0, dtype=torch.long)
        self._live = torch.zeros(0, dtype=torch.bool)
        self.ran_out = False

    def _ensure(self, size: int) -> None:
        if self._live.numel() < size:
            grow = size - self._live.numel()
            self._live = torch.cat([self._live, torch.zeros(grow, dtype=torch.bool)])
            self._count = torch.cat([self._count, torch.zeros(grow, dtype=torch.long)])

    def _mark_live(self, index: Any) -> None:
        idx = torch.as_tensor(index, dtype=torch.long).reshape(-1).cpu()
        if idx.numel():
            self._ensure(int(idx.max()) + 1)
            self._live[idx] = True
            self._count[idx] = 0
            self.ran_out = False

    def add(self, index: Any) -> None:
        self._mark_live(index)

    def extend(self, index: Tensor) -> None:
        self._mark_live(index)

    def mark_update(self, index: Any) -> None:
        self._mark_live(index)

    def _num_sampleable(self, storage: Storage) -> int:
        return int(self._live[: len(storage)].sum())

    def free_slots(self, storage: Storage) -> Tensor:
        """Slots below ``len(storage)`` whose item was consumed (reused first by writes)."""
        n = len(storage)
        self._ensure(n)
        return (~self._live[:n]).nonzero().squeeze(-1)

    def sample(self, storage: Storage, batch_size: int) -> tuple[Tensor, dict]:
        if storage.ndim != 1:
            raise TypeError("ConsumingSampler supports one-dimensional storages only")
        n = len(storage)
        if n == 0:
            raise RuntimeError(_EMPTY)
        self._ensure(n)
        live = self._live[:n].nonzero().squeeze(-1)
        if live.numel() == 0:
            self.ran_out = True
            raise RuntimeError("every stored item has been consumed; write new data before sampling")
        index = live[torch.randperm(live.numel())[:batch_size]]
        self._count[index] += 1
        self._live[index] = self._count[index] < self.max_sample_count
        self.ran_out = not bool(self._live[:n].any())
        return index.to(storage._leaf_device()), {}

    def _empty(self) -> None:
        self._live.zero_()
        self._count.zero_()
        self.ran_out = False

    def _reset_epoch(self) -> None:
        self.ran_out = False

    def state_dict(self) -> dict[str, Any]:
        return {"count": self._count.clone(), "live": self._live.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._count = state["count"].clone()
        self._live = state["live"].clone()

    def _checkpoint_state(self) -> tuple[dict, Any]:
        return ({"max_sample_count": self.max_sample_count},
                TensorDict({"count": self._count, "live": self._live}, []))

    def _prepare_load(self, meta: dict, tensors: Any, path: Any) -> Any:
        get_field(meta, "max_sample_count", int, path)
        count = None if tensors is None else tensors.get("count", None)
        live = None if tensors is None else tensors.get("live", None)
        if (not isinstance(count, Tensor) or not isinstance(live, Tensor) or count.dtype is not torch.long
                or live.dtype is not torch.bool or count.shape != live.shape or count.ndim != 1):
            raise CheckpointError(f"{path}: the consumption counters are missing or malformed", file=path)
        return count.clone(), live.clone()

    def _commit_load(self, prepared: Any) -> None:
        self._count, self._live = prepared

    def __repr__(self) -> str:
        return f"ConsumingSampler(max_sample_count={self.max_sample_count}, live={int(self._live.sum())})"


def _default_weight(staleness: Tensor) -> Tensor:
    return 1.0 / (staleness.double() + 1.0)


class StalenessAwareSampler(Sampler):
    """Samples items with weights that decay with their staleness, and drops stale items.

    ``staleness = consumer_version - stored[version_key]``: how many policy updates ago the
    data was collected. Items with ``staleness > max_staleness`` are never drawn
    (``max_staleness=-1``: no cutoff); the rest are drawn with replacement with
    probability proportional to ``staleness_weight_fn(staleness)`` (default
    ``1 / (staleness + 1)``). The training loop sets :attr:`consumer_version` (or calls
    :meth:`increment_consumer_version`) after each update.

    Args:
        max_staleness: the cutoff (default -1, none).
        staleness_weight_fn: ``long Tensor -> float Tensor`` of non-negative weights.
        version_key: the stored policy version entry (default ``"policy_version"``).

    Raises ``KeyError`` when the storage has no ``version_key`` entry and
    ``RuntimeError`` when every item is past the cutoff.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.data.replay_buffers import LazyTensorStorage, TensorDictReplayBuffer
        >>> sampler = StalenessAwareSampler(max_staleness=1)
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler, batch_size=8)
        >>> _ = rb.extend(TensorDict({"policy_version": torch.tensor([0, 0, 1, 2])}, [4]))
        >>> sampler.consumer_version = 2
        >>> sorted(set(rb.sample()["policy_version"].tolist())) <= [1, 2]  # version 0 is too stale
        True
    """

    def __init__(self, max_staleness: int = -1, staleness_weight_fn: Callable[[Tensor], Tensor] | None = None,
                 version_key: NestedKey = "policy_version") -> None:
        if isinstance(max_staleness, bool) or not isinstance(max_staleness, int) or max_staleness < -1:
            raise ValueError(f"max_staleness must be an integer >= -1, got {max_staleness!r}")
        self._max_staleness = max_staleness
        self.staleness_weight_fn = staleness_weight_fn or _default_weight
        self.version_key = unravel_key(version_key)
        self._consumer_version = 0

    @property
    def consumer_version(self) -> int:
        return self._consumer_version

    @consumer_version.setter
    def consumer_version(self, value: int) -> None:
        self._consumer_version = int(value)

    def increment_consumer_version(self, n: int = 1) -> int:
        """Adds ``n`` to :attr:`consumer_version`; returns the new value."""
        self._consumer_version += int(n)
        return self._consumer_version

    @property
    def max_staleness(self) -> int:
        return self._max_staleness

    def _get_versions(self, storage: Storage) -> Tensor:
        n = len(storage)
        if isinstance(storage, TensorStorage):
            td = storage._storage
            if not isinstance(td, TensorDictBase) or self.version_key not in td.keys(include_nested=True):
                raise KeyError(f"StalenessAwareSampler: the storage has no {self.version_key!r} entry")
            v = td.get(self.version_key)[: storage._filled_rows]
            return v.reshape(n, -1)[:, 0].long().cpu()
        items = storage.get(torch.arange(n))
        try:
            return torch.stack([torch.as_tensor(x.get(self.version_key)).reshape(-1)[0] for x in items]).long()
        except (AttributeError, KeyError):
            raise KeyError(f"StalenessAwareSampler: the stored items have no {self.version_key!r} entry") from None

    def sample(self, storage: Storage, batch_size: int) -> tuple[Tensor, dict]:
        if len(storage) == 0:
            raise RuntimeError(_EMPTY)
        staleness = (self._consumer_version - self._get_versions(storage)).clamp_min(0)
        weights = torch.as_tensor(self.staleness_weight_fn(staleness), dtype=torch.float64).reshape(-1).clone()
        if weights.shape != staleness.shape or bool((weights < 0).any()) or not bool(torch.isfinite(weights).all()):
            raise ValueError("staleness_weight_fn must return one finite non-negative weight per item")
        if self._max_staleness >= 0:
            weights[staleness > self._max_staleness] = 0
        if not bool((weights > 0).any()):
            raise RuntimeError(f"every stored item is staler than max_staleness={self._max_staleness} "
                               f"(consumer_version={self._consumer_version}); collect fresh data")
        index = torch.multinomial(weights, batch_size, replacement=True)
        return index.to(storage._leaf_device()), {}

    def state_dict(self) -> dict[str, Any]:
        return {"consumer_version": self._consumer_version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._consumer_version = int(state["consumer_version"])

    def _checkpoint_state(self) -> tuple[dict, Any]:
        return {"consumer_version": self._consumer_version, "max_staleness": self._max_staleness}, None

    def _prepare_load(self, meta: dict, tensors: Any, path: Any) -> Any:
        return get_field(meta, "consumer_version", int, path)

    def _commit_load(self, prepared: Any) -> None:
        self._consumer_version = prepared

    def __repr__(self) -> str:
        return (f"StalenessAwareSampler(max_staleness={self._max_staleness}, version_key={self.version_key!r}, "
                f"consumer_version={self._consumer_version})")
