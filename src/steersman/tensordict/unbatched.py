"""``UnbatchedTensor``: a TensorDict entry without the batch dims, left as is by batch ops.

For an entry that belongs to the whole batch: a lookup table, a shared mask, model
parameters. A plain entry's shape starts with the batch size; an ``UnbatchedTensor`` has
any shape, and the TensorDict's shape operations (indexing, ``reshape``, ``unsqueeze``,
``permute``, ``expand``, ``unbind``/``split``, ``stack``/``cat``...) return it unchanged:
same data, same storage. Other operations (arithmetic, ``clone``, ``to``, ``apply``) apply
to it as to any tensor and return an ``UnbatchedTensor``. It is a ``torch.Tensor``
subclass, so ``td["table"]`` is used as a tensor.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["UnbatchedTensor"]


def _plain(t: Tensor) -> Tensor:
    return t.as_subclass(Tensor)


class UnbatchedTensor(Tensor):
    """A tensor entry with no batch dims, which the TensorDict's batch operations leave as is.

    Args:
        data: the payload (a tensor, or anything ``torch.as_tensor`` takes). A tensor is
            shared, not copied.
        batch_size: the batch size of the TensorDict holding it (informational; a
            TensorDict sets it when it stores the entry). Default ``[]``.

    Rules, as in tensordict: an indexed write ``td[idx] = other`` leaves the entry as is
    when ``other`` lacks the key, and writes ``other``'s payload whole (whatever ``idx``)
    when it has one of the same shape (a different shape raises). Stacking or
    concatenating TensorDicts keeps the shared payload, and needs the members' payloads
    to be equal (else ``ValueError``). ``auto_batch_size_`` ignores unbatched entries.
    Reductions over batch dims (``td.sum(0)``) apply to it as to any tensor.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict, UnbatchedTensor
        >>> td = TensorDict(a=UnbatchedTensor(torch.zeros(3, 4)), b=torch.zeros(2, 3), batch_size=[2])
        >>> td[0]["a"].shape, td.reshape(1, 2)["a"].shape
        (torch.Size([3, 4]), torch.Size([3, 4]))
        >>> td.reshape(1, 2)["a"].data_ptr() == td["a"].data_ptr(), isinstance(td["a"], torch.Tensor)
        (True, True)
        >>> type(td["a"] + 1).__name__, torch.stack([td, td])["a"].shape
        ('UnbatchedTensor', torch.Size([3, 4]))
    """

    @staticmethod
    def __new__(cls, data: Any, batch_size: Any = None) -> UnbatchedTensor:
        t = data if isinstance(data, Tensor) else torch.as_tensor(data)
        if type(t) is not Tensor:
            t = _plain(t)
        out = Tensor._make_subclass(cls, t, t.requires_grad)
        out._ub_batch_size = torch.Size(batch_size or ())
        return out

    def __init__(self, data: Any, batch_size: Any = None) -> None:  # (all done in __new__)
        pass

    @property
    def batch_size(self) -> torch.Size:
        """The batch size of the TensorDict that holds it (``[]`` when none)."""
        return getattr(self, "_ub_batch_size", torch.Size(()))

    @batch_size.setter
    def batch_size(self, value: Any) -> None:
        self._ub_batch_size = torch.Size(value)

    def _with_batch(self, batch_size: torch.Size) -> UnbatchedTensor:
        """The same payload (same storage) labelled with another batch size."""
        out = Tensor._make_subclass(UnbatchedTensor, _plain(self), self.requires_grad)
        out._ub_batch_size = batch_size
        return out

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func in (torch.stack, torch.cat) and args and isinstance(args[0], (list, tuple)) and args[0] and all(
            type(t) is UnbatchedTensor for t in args[0]
        ):
            return _shared(args[0], "stack" if func is torch.stack else "cat")
        return super().__torch_function__(func, types, args, kwargs or {})

    def __repr__(self, **kwargs: Any) -> str:  # type: ignore[override]
        return f"UnbatchedTensor({_plain(self)!r})"


def _shared(values: Any, op: str) -> UnbatchedTensor:
    """The one payload of the unbatched entries being stacked/concatenated."""
    first = values[0]
    p = _plain(first)
    for v in values[1:]:
        if v is first:
            continue
        q = _plain(v)
        if q.shape != p.shape or q.dtype != p.dtype or not torch.equal(q, p):
            raise ValueError(
                f"cannot {op} TensorDicts whose unbatched entries differ (shapes {list(p.shape)} and "
                f"{list(q.shape)}): an UnbatchedTensor is shared by the whole batch, so the members must "
                "hold the same payload"
            )
    return first


class _WholeWrite:
    """A write target for an indexed write into an unbatched entry: the payload is
    written whole, whatever the index (``target[index] = src``)."""

    __slots__ = ("t",)

    def __init__(self, t: Tensor) -> None:
        self.t = t

    def __setitem__(self, index: Any, src: Any) -> None:
        self.t.copy_(src)
