"""Seeding an online replay buffer with an offline dataset."""

from __future__ import annotations

from typing import Any

import torch

from steersman.tensordict import TensorDictBase
from steersman.tensordict import cat as td_cat

from .replay_buffers import ReplayBuffer
from .storages import LazyTensorStorage, Storage

__all__ = ["prefill_replay_buffer", "OfflineToOnlineReplayBuffer"]


def prefill_replay_buffer(rb: ReplayBuffer, dataset: Any, n_samples: int | None = None,
                          chunk_size: int = 1000) -> ReplayBuffer:
    """Copies the items of an offline ``dataset`` into the mutable buffer ``rb``.

    The first ``n_samples`` items of ``dataset`` (all of them by default), in storage
    order, are extended into ``rb`` ``chunk_size`` at a time; ``rb`` is returned for
    chaining. TorchRL draws the copied items with ``dataset.sample`` (so with a random
    sampler some items are copied twice and others never); here each item is copied
    exactly once, which is what "copy the dataset" promises.

    Args:
        rb: the buffer to fill.
        dataset: a :class:`ReplayBuffer` (or anything indexable by slices with a
            ``len``). Dataset ids such as ``"d4rl:..."``/``"minari:..."`` are refused:
            steersman has no dataset downloaders.
        n_samples: at most this many items; default all.
        chunk_size: items copied per ``extend``. Default ``1000``.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.data import LazyTensorStorage, ReplayBuffer, prefill_replay_buffer
        >>> dataset = ReplayBuffer(storage=LazyTensorStorage(500))
        >>> _ = dataset.extend(TensorDict(obs=torch.randn(500, 4), batch_size=[500]))
        >>> online = ReplayBuffer(storage=LazyTensorStorage(10_000))
        >>> len(prefill_replay_buffer(online, dataset, n_samples=200))
        200
    """
    if isinstance(dataset, str):
        raise ValueError(f"prefill_replay_buffer: dataset ids like {dataset!r} need a dataset downloader, which "
                         "steersman does not ship; load the data into a ReplayBuffer and pass that")
    if int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be >= 1; got {chunk_size}")
    if n_samples is not None and int(n_samples) < 0:
        raise ValueError(f"n_samples must be >= 0; got {n_samples}")
    total = len(dataset) if n_samples is None else min(int(n_samples), len(dataset))
    for start in range(0, total, int(chunk_size)):
        rb.extend(dataset[start:min(start + int(chunk_size), total)])
    return rb


def _strip(data: Any) -> Any:
    """A sampled batch without the per-buffer sampling entries (they do not concatenate)."""
    if isinstance(data, TensorDictBase):
        keys = [k for k in ("index", "_weight", "priority_weight") if k in data.keys()]
        return data.exclude(*keys) if keys else data
    return data


class OfflineToOnlineReplayBuffer:
    """An immutable offline dataset and a growing online buffer sampled together.

    :meth:`extend` writes to the online buffer only. :meth:`sample` draws exactly
    ``round(offline_fraction * batch_size)`` items from the offline dataset and the rest
    from the online buffer and concatenates them (offline first) into one ``[batch_size]``
    batch; before any online data (or with ``offline_fraction == 0`` after :meth:`anneal`)
    a batch comes from one buffer only. The sampling entries of each part (``"index"``,
    ``"_weight"``, ``"priority_weight"``) are dropped, since they refer to different buffers.

    Args:
        offline_dataset: a :class:`ReplayBuffer` holding the dataset. Dataset ids
            (``"d4rl:..."``, ``"minari:..."``) are refused: steersman has no dataset
            downloaders.

    Keyword Args:
        online_storage: storage of the online buffer; or
        online_capacity: builds a :class:`LazyTensorStorage` of that size (exactly one).
        offline_fraction: in ``(0, 1)``, default 0.5.
        batch_size: default size of :meth:`sample`.
        transform: applied to each concatenated batch.
        **dataset_kwargs: only used with dataset ids (refused).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.data.replay_buffers import LazyTensorStorage, ReplayBuffer
        >>> offline = ReplayBuffer(storage=LazyTensorStorage(100))
        >>> _ = offline.extend(TensorDict({"obs": torch.zeros(100, 4)}, [100]))
        >>> rb = OfflineToOnlineReplayBuffer(offline, online_capacity=100, offline_fraction=0.25, batch_size=8)
        >>> _ = rb.extend(TensorDict({"obs": torch.ones(10, 4)}, [10]))
        >>> rb.sample()["obs"][:, 0].tolist()
        [0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    """

    def __init__(self, offline_dataset: Any, *, online_storage: Storage | None = None,
                 online_capacity: int | None = None, offline_fraction: float = 0.5, batch_size: int | None = None,
                 transform: Any = None, **dataset_kwargs: Any) -> None:
        if isinstance(offline_dataset, str):
            raise NotImplementedError(f"OfflineToOnlineReplayBuffer({offline_dataset!r}): dataset ids are not "
                                      "resolved here (no dataset downloaders); pass a ReplayBuffer holding the data")
        if not isinstance(offline_dataset, ReplayBuffer):
            raise TypeError(f"offline_dataset must be a ReplayBuffer, got {type(offline_dataset).__name__}")
        if dataset_kwargs:
            raise TypeError(f"dataset keyword arguments {sorted(dataset_kwargs)} only apply to dataset ids")
        if (online_storage is None) == (online_capacity is None):
            raise ValueError("pass exactly one of online_storage and online_capacity")
        self._check_fraction(offline_fraction, low_ok=False)
        self._offline = offline_dataset
        storage = online_storage if online_storage is not None else LazyTensorStorage(online_capacity)
        self._online = ReplayBuffer(storage=storage)
        self._fraction = float(offline_fraction)
        self._batch_size = batch_size
        self._transform = transform

    @staticmethod
    def _check_fraction(value: Any, low_ok: bool) -> None:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (
            (0 <= value < 1) if low_ok else (0 < value < 1))
        if not ok:
            raise ValueError(f"offline_fraction must be in {'[0, 1)' if low_ok else '(0, 1)'}, got {value!r}")

    @property
    def offline_fraction(self) -> float:
        return self._fraction

    @offline_fraction.setter
    def offline_fraction(self, value: float) -> None:
        self.anneal(value)

    def anneal(self, offline_fraction: float) -> None:
        """Sets the offline fraction (``0`` allowed: online data only from then on)."""
        self._check_fraction(offline_fraction, low_ok=True)
        self._fraction = float(offline_fraction)

    @property
    def offline_buffer(self) -> ReplayBuffer:
        return self._offline

    @property
    def online_buffer(self) -> ReplayBuffer:
        return self._online

    @property
    def batch_size(self) -> int | None:
        return self._batch_size

    def __len__(self) -> int:
        return len(self._offline) + len(self._online)

    def extend(self, data: Any) -> Any:
        """Writes ``data`` to the online buffer; returns its slots there."""
        return self._online.extend(data)

    def add(self, data: Any) -> Any:
        return self._online.add(data)

    def sample(self, batch_size: int | None = None) -> Any:
        batch_size = batch_size or self._batch_size
        if batch_size is None:
            raise RuntimeError("no batch_size: pass one to sample() or to the constructor")
        n_off = round(self._fraction * batch_size)
        if len(self._online) == 0:
            if self._fraction == 0:
                raise RuntimeError("offline_fraction is 0 and the online buffer is empty: nothing to sample")
            n_off = batch_size
        parts = []
        if n_off:
            parts.append(_strip(self._offline.sample(n_off)))
        if batch_size - n_off:
            parts.append(_strip(self._online.sample(batch_size - n_off)))
        if len(parts) == 1:
            data = parts[0]
        elif all(isinstance(p, TensorDictBase) for p in parts):
            data = td_cat(parts)
        else:
            data = torch.cat(parts)
        return self._transform(data) if self._transform is not None else data

    def __repr__(self) -> str:
        return (f"OfflineToOnlineReplayBuffer(offline={len(self._offline)}, online={len(self._online)}, "
                f"offline_fraction={self._fraction}, batch_size={self._batch_size})")
