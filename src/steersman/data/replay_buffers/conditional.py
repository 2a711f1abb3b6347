"""The result of :meth:`ReplayBuffer.update_if_present`."""

from __future__ import annotations

import torch

from steersman.tensordict import tensorclass

__all__ = ["ConditionalUpdateResult"]


@tensorclass
class ConditionalUpdateResult:
    """What a conditional update did to each record it addressed (in the input order).

    Attributes:
        updated: bool ``[N]``: the record was still live (its slot not rewritten or emptied
            since the handle was taken) and received the patch.
        version_rejected: bool ``[N]`` when the update compared versions (else ``None``):
            the record was live but lost the version comparison (including duplicate
            handles of one slot that did not carry the highest incoming version).

    Every record is exactly one of updated, version-rejected or stale: ``stale_count``
    counts the records whose slot had been reused or emptied.

    Example:
        >>> import torch
        >>> r = ConditionalUpdateResult(updated=torch.tensor([True, False, False]),
        ...                             version_rejected=torch.tensor([False, True, False]), batch_size=[3])
        >>> r.updated_count, r.version_rejected_count, r.stale_count
        (1, 1, 1)
    """

    updated: torch.Tensor
    version_rejected: torch.Tensor | None = None

    @property
    def updated_count(self) -> int:
        return int(self.updated.sum())

    @property
    def version_rejected_count(self) -> int:
        return 0 if self.version_rejected is None else int(self.version_rejected.sum())

    @property
    def stale_count(self) -> int:
        return int(self.updated.numel()) - self.updated_count - self.version_rejected_count
