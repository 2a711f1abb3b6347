"""Small helpers of ``torchrl.data``: device typing and an endless iterator."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

__all__ = ["DEVICE_TYPING", "create_infinite_iterator"]

#: What a ``device=`` argument accepts: a ``torch.device``, a string (``"cpu"``) or a
#: CUDA ordinal.
DEVICE_TYPING = torch.device | str | int


def create_infinite_iterator(iterator: Iterable) -> Iterator[Any]:
    """Yields the items of ``iterator`` over and over, restarting it when it ends.

    ``iterator`` must be re-iterable (a list, a ``DataLoader``, a replay buffer with a
    ``batch_size``...); a one-shot iterator would be exhausted after the first pass, so an
    empty pass raises ``ValueError`` instead of looping forever.

    Example:
        >>> from itertools import islice
        >>> list(islice(create_infinite_iterator([1, 2, 3]), 7))
        [1, 2, 3, 1, 2, 3, 1]
    """
    while True:
        empty = True
        for item in iterator:
            empty = False
            yield item
        if empty:
            raise ValueError("create_infinite_iterator: the iterable yielded nothing (empty, or a one-shot "
                             "iterator already exhausted)")
