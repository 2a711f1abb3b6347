"""Compact forms of TED data (TorchRL's "TensorDict Episode Data" layout) and back.

In TED, step ``t`` holds its observation at the root and the one after the step under
``"next"``; inside a trajectory ``next[t]`` repeats ``root[t + 1]``. :class:`TED2Flat` keeps
each shifted entry once (the root copy, plus the ``"next"`` value at trajectory ends only),
:class:`Flat2TED` rebuilds the exact TED TensorDict. :class:`TED2Nested` splits a TED batch
into trajectories (jagged ``torch.nested`` leaves, one row per trajectory),
:class:`Nested2TED` joins them back.

Trajectory ends are steps whose ``done_keys`` entry (under ``"next"``) is set, the last
step, and ``last_cursor`` (the newest write of a circular storage, after which storage
order jumps back to the oldest data). An entry is treated as shifted only where the data
shows it (``next[t] == root[t + 1]`` at every non-end step); other ``"next"`` entries are
kept whole, so the round trip is exact whatever the data.

Flat layout (batch size ``[]``): the root entries ``[n, ...]``; ``"next"`` with the entries
kept whole ``[n, ...]``; ``"next_at_ends"`` with the shifted entries' values at the ends
``[m, ...]``; ``"is_end"`` ``[n]``; ``shift_key`` (the slot after ``last_cursor``, 0 when
none) and ``is_full_key`` scalars.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from steersman.tensordict import NestedKey, TensorDict, TensorDictBase, unravel_key
from steersman.tensordict import cat as td_cat

__all__ = ["TED2Flat", "Flat2TED", "TED2Nested", "Nested2TED", "H5Split", "H5Combine", "trajectory_ends"]

DEFAULT_DONE_KEYS = ("done", "truncated", "terminated")


def _t(key: NestedKey) -> tuple:
    key = unravel_key(key)
    return key if isinstance(key, tuple) else (key,)


def trajectory_ends(data: TensorDictBase, done_keys: tuple = DEFAULT_DONE_KEYS,
                    last_cursor: int | None = None) -> Tensor:
    """Bool ``[n]``: the steps that end a trajectory in ``data`` (storage order)."""
    n = data.batch_size[0]
    end = torch.zeros(n, dtype=torch.bool)
    if n == 0:
        return end
    nxt = data.get("next", None)
    if isinstance(nxt, TensorDictBase):
        for key in nxt.keys(include_nested=True, leaves_only=True):
            if _t(key)[-1] in done_keys:
                end |= nxt.get(key).reshape(n, -1).any(-1).cpu()
    end[n - 1] = True
    if last_cursor is not None and 0 <= last_cursor < n:
        end[last_cursor] = True
    return end


class TED2Flat:
    """Makes the flat (compact) form of a TED TensorDict ``[n]`` (see the module docstring).

    Args:
        done_key: accepted for TorchRL compatibility (ends come from ``done_keys``).
        shift_key, is_full_key: names of the two scalar entries describing a circular
            storage's state (defaults ``"shift"``, ``"is_full"``).
        done_keys: last names of the ``"next"`` entries that end a trajectory.
        reward_keys: accepted for TorchRL compatibility (rewards are never shifted: they
            exist only under ``"next"``).

    ``hook(data, path=None, *, last_cursor=None, is_full=False)`` returns the flat TensorDict.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> obs = torch.arange(5.0)
        >>> ted = TensorDict({"obs": obs, "next": {"obs": obs + 1, "reward": torch.ones(5),
        ...                   "done": torch.tensor([False, True, False, False, True])}}, [5])
        >>> flat = TED2Flat()(ted)
        >>> flat["next_at_ends", "obs"].tolist(), sorted(flat["next"].keys())
        ([2.0, 5.0], ['done', 'reward'])
        >>> bool((Flat2TED()(flat) == ted).all())
        True
    """

    def __init__(self, done_key: NestedKey = ("next", "done"), shift_key: NestedKey = "shift",
                 is_full_key: NestedKey = "is_full", done_keys: tuple = DEFAULT_DONE_KEYS,
                 reward_keys: tuple = ("reward",)) -> None:
        self.done_key = unravel_key(done_key)
        self.shift_key = unravel_key(shift_key)
        self.is_full_key = unravel_key(is_full_key)
        self.done_keys = tuple(done_keys)
        self.reward_keys = tuple(reward_keys)
        self.last_cursor: int | None = None
        self.is_full = False

    def __call__(self, data: TensorDictBase, path: Any = None, *, last_cursor: int | None = None,
                 is_full: bool | None = None) -> TensorDict:
        if not isinstance(data, TensorDictBase) or len(data.batch_size) < 1:
            raise TypeError(f"TED2Flat takes a TensorDict with a batch dim, got {type(data).__name__}")
        last_cursor = self.last_cursor if last_cursor is None else last_cursor
        is_full = self.is_full if is_full is None else is_full
        n = data.batch_size[0]
        end = trajectory_ends(data, self.done_keys, last_cursor)
        root = data.exclude("next").to_tensordict()
        out = TensorDict({}, [])
        for key in root.keys(include_nested=True, leaves_only=True):
            out.set(key, root.get(key))
        whole, at_ends = TensorDict({}, []), TensorDict({}, [])
        nxt = data.get("next", None)
        if isinstance(nxt, TensorDictBase):
            inner = ~end[:-1]
            for key in nxt.keys(include_nested=True, leaves_only=True):
                v = nxt.get(key)
                r = root.get(key, None) if key in root.keys(include_nested=True) else None
                shifted = (isinstance(r, Tensor) and r.shape == v.shape and r.dtype == v.dtype
                           and bool((v[:-1][inner.to(v.device)] == r[1:][inner.to(v.device)]).all()))
                if shifted:
                    at_ends.set(key, v[end.to(v.device)])
                else:
                    whole.set(key, v)
        out.set("next", whole)
        out.set("next_at_ends", at_ends)
        out.set("is_end", end)
        shift = 0 if last_cursor is None else (last_cursor + 1) % max(n, 1)
        out.set(self.shift_key, torch.tensor(shift))
        out.set(self.is_full_key, torch.tensor(bool(is_full)))
        return out


class Flat2TED:
    """Rebuilds the TED TensorDict ``[n]`` from :class:`TED2Flat`'s flat form.

    Arguments as :class:`TED2Flat`. A flat TensorDict whose parts do not fit together
    (missing ``"is_end"``, a shifted entry without its root copy, counts that do not
    match) raises ``ValueError`` naming the entry.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> ted = TensorDict({"obs": torch.zeros(3), "next": {"obs": torch.zeros(3),
        ...                   "done": torch.tensor([False, False, True])}}, [3])
        >>> Flat2TED()(TED2Flat()(ted))["next", "obs"].shape
        torch.Size([3])
    """

    def __init__(self, done_key: NestedKey = "done", shift_key: NestedKey = "shift",
                 is_full_key: NestedKey = "is_full", done_keys: tuple = DEFAULT_DONE_KEYS,
                 reward_keys: tuple = ("reward",)) -> None:
        self.done_key = unravel_key(done_key)
        self.shift_key = unravel_key(shift_key)
        self.is_full_key = unravel_key(is_full_key)
        self.done_keys = tuple(done_keys)
        self.reward_keys = tuple(reward_keys)

    def __call__(self, flat: TensorDictBase, out: Any = None) -> TensorDict:
        if not isinstance(flat, TensorDictBase):
            raise TypeError(f"Flat2TED takes the TensorDict made by TED2Flat, got {type(flat).__name__}")
        end = flat.get("is_end", None)
        if not isinstance(end, Tensor) or end.dtype is not torch.bool or end.ndim != 1:
            raise ValueError("Flat2TED: the flat TensorDict has no bool [n] 'is_end' entry (not made by TED2Flat?)")
        n = end.shape[0]
        skip = {"next", "next_at_ends", "is_end", _t(self.shift_key)[0], _t(self.is_full_key)[0]}
        ted = TensorDict({}, [n])
        for key in flat.keys():
            if key in skip:
                continue
            v = flat.get(key)
            if isinstance(v, TensorDictBase):
                v = _rebatch(v, n, key)
            elif v.shape[:1] != (n,):
                raise ValueError(f"Flat2TED: entry {key!r} has {list(v.shape)[:1]} rows, 'is_end' has {n}")
            ted.set(key, v)
        nxt = TensorDict({}, [n])
        whole = flat.get("next", TensorDict({}, []))
        for key in whole.keys(include_nested=True, leaves_only=True):
            v = whole.get(key)
            if v.shape[:1] != (n,):
                raise ValueError(f"Flat2TED: entry ('next', {key!r}) has shape {list(v.shape)}, expected {n} rows")
            nxt.set(key, v)
        m = int(end.sum())
        at_ends = flat.get("next_at_ends", TensorDict({}, []))
        for key in at_ends.keys(include_nested=True, leaves_only=True):
            v = at_ends.get(key)
            r = ted.get(key, None) if key in ted.keys(include_nested=True) else None
            if not isinstance(r, Tensor):
                raise ValueError(f"Flat2TED: shifted entry {key!r} has no root copy")
            if v.shape != (m, *r.shape[1:]) or v.dtype != r.dtype:
                raise ValueError(f"Flat2TED: entry ('next_at_ends', {key!r}) is {list(v.shape)} {v.dtype}; "
                                 f"expected {[m, *r.shape[1:]]} {r.dtype} ({m} trajectory ends)")
            full = torch.roll(r, -1, 0).clone()
            full[end.to(full.device)] = v.to(full.device)
            nxt.set(key, full)
        ted.set("next", nxt)
        return ted


def _rebatch(td: TensorDictBase, n: int, key: Any) -> TensorDict:
    out = TensorDict({}, [n])
    for k in td.keys(include_nested=True, leaves_only=True):
        v = td.get(k)
        if v.shape[:1] != (n,):
            raise ValueError(f"Flat2TED: entry {(key, *_t(k))!r} has shape {list(v.shape)}, expected {n} rows")
        out.set(k, v)
    return out


class TED2Nested(TED2Flat):
    """Splits a TED TensorDict ``[n]`` into trajectories: a TensorDict ``[n_traj]`` whose leaves
    are jagged ``torch.nested`` tensors ``[n_traj, j, ...]`` (row ``i`` = trajectory ``i``'s steps).

    Trajectory ends as in :class:`TED2Flat` (done flags, the last step, ``last_cursor``).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> ted = TensorDict({"obs": torch.arange(5.0), "next": {"obs": torch.arange(5.0) + 1,
        ...                   "done": torch.tensor([False, True, False, False, True])}}, [5])
        >>> nested = TED2Nested()(ted)
        >>> nested.batch_size, [t.tolist() for t in nested["obs"].unbind()]
        (torch.Size([2]), [[0.0, 1.0], [2.0, 3.0, 4.0]])
        >>> bool((Nested2TED()(nested) == ted).all())
        True
    """

    def __call__(self, data: TensorDictBase, path: Any = None, *, last_cursor: int | None = None,
                 is_full: bool | None = None) -> TensorDict:
        if not isinstance(data, TensorDictBase) or len(data.batch_size) != 1:
            raise TypeError("TED2Nested takes a TensorDict with one batch dim")
        end = trajectory_ends(data, self.done_keys, self.last_cursor if last_cursor is None else last_cursor)
        stops = end.nonzero().squeeze(-1) + 1
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), stops])
        out = TensorDict({}, [offsets.numel() - 1])
        for key in data.keys(include_nested=True, leaves_only=True):
            v = data.get(key)
            out.set(key, torch.nested.nested_tensor_from_jagged(v, offsets.to(v.device)))
        return out


class Nested2TED(Flat2TED):
    """Joins the trajectories of :class:`TED2Nested`'s output back into a TED TensorDict ``[n]``.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> ted = TensorDict({"obs": torch.zeros(4, 2), "next": {"done": torch.tensor([True, False, False, True])}}, [4])
        >>> Nested2TED()(TED2Nested()(ted)).batch_size
        torch.Size([4])
    """

    def __call__(self, nested: TensorDictBase, out: Any = None) -> TensorDict:
        if not isinstance(nested, TensorDictBase):
            raise TypeError(f"Nested2TED takes the TensorDict made by TED2Nested, got {type(nested).__name__}")
        leaves = {key: nested.get(key) for key in nested.keys(include_nested=True, leaves_only=True)}
        flat = {k: (v.values() if v.is_nested else v.reshape(-1, *v.shape[2:])) for k, v in leaves.items()}
        sizes = {k: v.shape[0] for k, v in flat.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"Nested2TED: the entries hold different numbers of steps: {sizes}")
        n = next(iter(sizes.values()), 0)
        ted = TensorDict({}, [n])
        for k, v in flat.items():
            ted.set(k, v)
        return ted


class H5Split(TED2Flat):
    """Splits :class:`TED2Nested`'s output into one sub-TensorDict per trajectory: a TensorDict
    ``[]`` with entries ``"traj_0"``, ``"traj_1"``... each ``[T_i]``, whose leaves are views of
    the nested tensors' rows (the layout an HDF5 file of trajectories keeps, one group per
    trajectory). :class:`H5Combine` joins them back.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> ted = TensorDict({"obs": torch.arange(5.0), "next": {"done": torch.tensor([0, 1, 0, 0, 1]).bool()}}, [5])
        >>> split = H5Split()(TED2Nested()(ted))
        >>> sorted(split.keys()), split["traj_1"].batch_size
        (['traj_0', 'traj_1'], torch.Size([3]))
        >>> bool((H5Combine()(split) == ted).all())
        True
    """

    def __call__(self, data: TensorDictBase, path: Any = None, **kwargs: Any) -> TensorDict:
        if not isinstance(data, TensorDictBase) or len(data.batch_size) != 1:
            raise TypeError("H5Split takes the TensorDict of trajectories made by TED2Nested")
        leaves = {key: data.get(key) for key in data.keys(include_nested=True, leaves_only=True)}
        rows = {key: (v.unbind() if v.is_nested else v.unbind(0)) for key, v in leaves.items()}
        out = TensorDict({}, [])
        for i in range(data.batch_size[0]):
            lengths = {r[i].shape[0] for r in rows.values()}
            if len(lengths) != 1:
                raise ValueError(f"H5Split: trajectory {i} has entries of different lengths {sorted(lengths)}")
            td = TensorDict({}, [lengths.pop()])
            for key, r in rows.items():
                td.set(key, r[i])
            out.set(f"traj_{i}", td)
        return out


class H5Combine:
    """Joins per-trajectory sub-TensorDicts (``"traj_0"``, ``"traj_1"``... as :class:`H5Split`
    writes them; any TensorDict of trajectory groups, e.g. a ``PersistentTensorDict`` over an
    HDF5 file) into one TED TensorDict ``[N]``, trajectories in index order.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> parts = TensorDict({"traj_1": TensorDict({"x": torch.ones(2)}, [2]),
        ...                     "traj_0": TensorDict({"x": torch.zeros(3)}, [3])}, [])
        >>> H5Combine()(parts)["x"].tolist()
        [0.0, 0.0, 0.0, 1.0, 1.0]
    """

    def __call__(self, data: TensorDictBase, out: Any = None) -> TensorDict:
        if not isinstance(data, TensorDictBase):
            raise TypeError(f"H5Combine takes a TensorDict of trajectory groups, got {type(data).__name__}")
        names = list(data.keys())
        bad = [n for n in names if not (n.startswith("traj_") and n[5:].isdigit())]
        if bad:
            raise ValueError(f"H5Combine: entries {bad[:3]} are not trajectory groups named traj_<i>")
        parts = [data.get(n) for n in sorted(names, key=lambda n: int(n[5:]))]
        if not parts:
            return TensorDict({}, [0])
        return td_cat([p.to_tensordict() if hasattr(p, "to_tensordict") else p for p in parts], 0)
