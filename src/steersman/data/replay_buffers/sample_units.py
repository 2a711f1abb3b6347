"""Sample units: what each index drawn by a sampler expands into.

A sampler picks *anchors*; a :class:`SampleUnit` turns them into the records a batch is
read from (one transition each, or more). The buffer calls ``unit.expand(index, info,
storage)`` under its lock, after the sampler and before the storage is read; the indices
it returns are the ones read and reported in the sample info.
"""

from __future__ import annotations

from torch import Tensor

from .storages import Storage

__all__ = ["SampleUnit", "Transition"]


class SampleUnit:
    """Base class of sample units.

    Subclasses implement ``expand(index, info, storage) -> (index, info)``: ``index`` is
    the sampler's anchor index, ``info`` its info dict. A unit must not change the storage;
    entries of ``info`` aligned with the anchors (importance weights...) must be expanded
    with the index so they stay aligned, and a unit may add entries (masks, provenance),
    which TensorDict buffers put into the batch.
    """

    def expand(self, index: Tensor, info: dict, storage: Storage) -> tuple[Tensor, dict]:  # pragma: no cover
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Transition(SampleUnit):
    """The identity unit: every anchor is one transition (the default behaviour).

    Example:
        >>> import torch
        >>> from steersman.data.replay_buffers import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=4, sample_unit=Transition())
        >>> _ = rb.extend(torch.arange(10))
        >>> rb.sample().shape
        torch.Size([4])
    """

    def expand(self, index: Tensor, info: dict, storage: Storage) -> tuple[Tensor, dict]:
        return index, info
