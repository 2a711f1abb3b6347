"""Trajectory boundaries in storage order (what slice samplers need)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["find_start_stop_traj"]


def _last_row(cursor: Any) -> int:
    if isinstance(cursor, range):
        return cursor[-1]
    if isinstance(cursor, Tensor):
        return int(cursor.reshape(-1)[-1])
    return int(cursor)


def find_start_stop_traj(*, trajectory: Tensor | None = None, end: Tensor | None = None, at_capacity: bool,
                         cursor: int | Tensor | range | None = None,
                         device: Any = None) -> tuple[Tensor, Tensor, Tensor]:
    """First and last step of every trajectory laid out in storage order.

    Time runs along dim 0 (``[T, *B]``; extra dims are independent columns). Give either
    ``trajectory`` (an id per step: a trajectory ends where the id changes) or ``end``
    (True on each trajectory's last step).

    Args:
        trajectory: ids ``[T, *B]``; exclusive with ``end``.
        end: booleans ``[T, *B]``; exclusive with ``trajectory``.
        at_capacity: the storage is full and circular: a trajectory with no end before
            the last row continues at row 0 (then ``start > stop`` and the length counts
            the wrap). If False the last row always ends a trajectory.
        cursor: last written row (an int, or the last element of a range/tensor); with
            ``at_capacity`` that row is an end, since what followed it was overwritten.
        device: where to compute; results come back on the input's device.

    Returns:
        ``(start, stop, lengths)``: ``start``/``stop`` are ``[N, 1 + len(B)]`` long tensors
        (time index, then the batch coordinates), ordered by batch column then time;
        ``lengths`` is ``[N]``.

    Example:
        >>> import torch
        >>> end = torch.zeros(10, dtype=torch.bool)
        >>> end[2] = end[7] = True
        >>> start, stop, lengths = find_start_stop_traj(end=end, at_capacity=True, cursor=4)
        >>> start.squeeze(-1).tolist(), stop.squeeze(-1).tolist(), lengths.tolist()
        ([8, 3, 5], [2, 4, 7], [5, 2, 3])
    """
    if (trajectory is None) == (end is None):
        raise ValueError("find_start_stop_traj needs exactly one of trajectory= or end=")
    src = trajectory if trajectory is not None else end
    if src.ndim == 0 or src.shape[0] == 0:
        raise ValueError(f"find_start_stop_traj needs a time dim of length >= 1, got shape {list(src.shape)}")
    out_device = src.device
    work = src.to(device) if device is not None else src
    T, batch = work.shape[0], work.shape[1:]
    flat = work.reshape(T, -1)
    if trajectory is not None:
        nxt = torch.roll(flat, -1, 0)
        ends = flat != nxt
    else:
        if flat.dtype is not torch.bool:
            raise TypeError(f"end must be a boolean tensor, got {flat.dtype}")
        ends = flat.clone()
    if not at_capacity:
        ends[-1] = True
    elif cursor is not None:
        c = _last_row(cursor)
        if not -T <= c < T:
            raise IndexError(f"cursor {c} is out of range for {T} rows")
        ends[c] = True
    starts, stops, lengths = [], [], []
    for col in range(flat.shape[1]):
        e = ends[:, col].nonzero().squeeze(-1)
        if e.numel() == 0:  # a full circular column without any end: one trajectory
            e = torch.tensor([T - 1], device=ends.device)
        first_start = (e[-1] + 1) % T if at_capacity else torch.zeros((), dtype=e.dtype, device=e.device)
        s = torch.cat([first_start.view(1), e[:-1] + 1])
        n = (e - s) % T + 1
        coords = torch.tensor(list(torch.unravel_index(torch.tensor(col), batch)) if batch else [],
                              dtype=torch.long, device=e.device).expand(e.numel(), len(batch))
        starts.append(torch.cat([s.unsqueeze(-1), coords], -1))
        stops.append(torch.cat([e.unsqueeze(-1), coords], -1))
        lengths.append(n)
    return (torch.cat(starts).to(out_device), torch.cat(stops).to(out_device), torch.cat(lengths).to(out_device))
