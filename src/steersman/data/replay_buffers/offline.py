"""Seeding an online replay buffer with an offline dataset."""

from __future__ import annotations

from typing import Any

from .replay_buffers import ReplayBuffer

__all__ = ["prefill_replay_buffer"]


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
