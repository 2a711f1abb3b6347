"""``split_trajectories``: a batch of adjacent trajectories as one row per trajectory."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from steersman.tensordict import TensorDictBase, lazy_stack
from steersman.tensordict._utils import NestedKey

__all__ = ["split_trajectories", "dense_copy"]


def dense_copy(td: TensorDictBase) -> TensorDictBase:
    """A copy of ``td`` whose leaves are contiguous (whatever the strides of ``td``'s)."""
    return td.apply(lambda x: x.clone(memory_format=torch.contiguous_format))


def _replace_last(key: NestedKey, new: str) -> NestedKey:
    if isinstance(key, str):
        return new
    return (*key[:-1], new)


def _ids_from_done(td: TensorDictBase, done_key: NestedKey) -> Tensor:
    """Trajectory ids ``[*batch, T]`` from the done flags: a new id after each done, rows
    (the flattened leading dims) numbered one after the other."""
    done = td.get(done_key)
    d = done.reshape(*td.batch_size, -1).any(-1).reshape(-1, td.batch_size[-1])
    start = torch.zeros_like(d)
    start[:, 1:] = d[:, :-1]
    local = start.long().cumsum(-1)
    per_row = local[:, -1] + 1
    offsets = per_row.cumsum(0) - per_row
    return (local + offsets.unsqueeze(-1)).reshape(td.batch_size)


def split_trajectories(
    rollout_tensordict: TensorDictBase,
    *,
    prefix: Any = None,
    trajectory_key: NestedKey | None = None,
    done_key: NestedKey | None = None,
    as_nested: bool = False,
) -> TensorDictBase:
    """Splits a batch ``[*batch, T]`` of adjacent trajectories into one row per trajectory.

    The batch is read in row-major order (each sub-env's steps in time order) and cut
    wherever the trajectory id changes. The result is ``[n_traj, max_len]``, each row a
    trajectory padded with zeros, with a bool mask (``True`` on real steps).

    Args:
        rollout_tensordict: a collector batch (time is the last batch dim).
        prefix: where the ids and the mask live: ``(prefix, "traj_ids")`` and
            ``(prefix, "mask")``. Default: ``"collector"`` if the batch has a
            ``"collector"`` entry, else none (root keys ``"traj_ids"``, ``"mask"``).
        trajectory_key: the key of the ids (overrides ``prefix``); the mask goes next to
            it (its last element replaced by ``"mask"``).
        done_key: if the batch has no ids, they are derived from ``("next", done_key)``
            (default ``"done"``): a new trajectory after each done, and at each new row;
            they are then stored at the ids key.
        as_nested: instead of padding, return a lazy stack (batch ``[n_traj]``) of
            trajectories of different lengths: member ``i`` has batch size ``[]`` and
            leaves ``[len_i, ...]``.

    Returns: a new TensorDict ``[n_traj, max_len]`` (or the lazy stack).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.collectors import split_trajectories
        >>> td = TensorDict({"obs": torch.arange(6.).view(1, 6),
        ...                  "collector": {"traj_ids": torch.tensor([[0, 0, 0, 0, 1, 1]])}}, [1, 6])
        >>> out = split_trajectories(td)
        >>> out.batch_size, out["obs"], out["collector", "mask"]
        (torch.Size([2, 4]), tensor([[0., 1., 2., 3.],
                [4., 5., 0., 0.]]), tensor([[ True,  True,  True,  True],
                [ True,  True, False, False]]))
        >>> ragged = split_trajectories(td, as_nested=True)
        >>> ragged.batch_size, ragged[1]["obs"]
        (torch.Size([2]), tensor([4., 5.]))
    """
    td = rollout_tensordict
    if td.batch_dims == 0:
        raise ValueError("split_trajectories: the batch needs a time dimension (its last batch dim)")
    if trajectory_key is not None:
        ids_key = trajectory_key
        mask_key = _replace_last(trajectory_key, "mask")
    else:
        if prefix is None and "collector" in td.keys():
            prefix = "collector"
        ids_key = "traj_ids" if prefix is None else (prefix, "traj_ids")
        mask_key = "mask" if prefix is None else (prefix, "mask")
    ids = td.get(ids_key, None)
    td = td.copy()
    if ids is None:
        ids = _ids_from_done(td, ("next", done_key if done_key is not None else "done"))
        td.set(ids_key, ids)
    flat = td.reshape(-1)
    flat_ids = ids.reshape(-1) if ids.ndim == td.batch_dims else ids.reshape(td.numel(), -1)[:, 0]
    _, counts = torch.unique_consecutive(flat_ids, return_counts=True)
    n = counts.numel()
    if as_nested:
        starts = (counts.cumsum(0) - counts).tolist()
        members = []
        for s, c in zip(starts, counts.tolist()):
            seg = flat[s: s + c]
            members.append(seg.apply(lambda x: x, batch_size=[]))
        return lazy_stack(members, 0)
    max_len = int(counts.max())
    seg = torch.repeat_interleave(torch.arange(n), counts)
    pos = torch.arange(flat_ids.numel()) - (counts.cumsum(0) - counts)[seg]

    def pad(x: Tensor) -> Tensor:
        out = x.new_zeros((n, max_len, *x.shape[1:]))
        out[seg, pos] = x
        return out

    out = flat.apply(pad, batch_size=[n, max_len])
    mask = torch.zeros(n, max_len, dtype=torch.bool, device=flat_ids.device)
    mask[seg, pos] = True
    out.set(mask_key, mask)
    return out

