"""Samplers: which stored items a batch is made of.

A sampler's ``sample(storage, batch_size)`` returns ``(index, info)``: a long tensor of
flat element indices in ``[0, len(storage))`` and a dict of extras (importance weights
under ``"_weight"``, slice truncation flags...). Samplers also hear about writes
(``add``/``extend``/``mark_update``) so they can keep their own bookkeeping (priorities,
caches) in step with the storage.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from steersman.tensordict import NestedKey, TensorDict, unravel_key

from ._checkpoint import CheckpointError, get_field, prepared, read_component, write_component
from .segment_tree import PriorityTree
from .storages import _EMPTY, Storage, TensorStorage

__all__ = [
    "Sampler",
    "RandomSampler",
    "SamplerWithoutReplacement",
    "PrioritizedSampler",
    "SliceSampler",
    "SliceSamplerWithoutReplacement",
    "PrioritizedSliceSampler",
]


class Sampler:
    """Base class of samplers. ``ran_out`` is True after the last batch of an epoch."""

    ran_out = False
    _consumes = False  # a ConsumingSampler: len(buffer) counts unconsumed items, writes refill slots

    def sample(self, storage: Storage, batch_size: int) -> tuple[Tensor, dict]:  # pragma: no cover
        raise NotImplementedError

    def add(self, index: Any) -> None:
        """Hook: one item was written at ``index``."""

    def extend(self, index: Tensor) -> None:
        """Hook: items were written at the flat indices ``index``."""

    def _written(self, index: Tensor, span: tuple[int, int] | None) -> None:
        """Hook used by buffers after a writer's ``extend`` (distinct indices; ``span`` is
        ``(start, stop)`` when they form that contiguous range)."""
        self.extend(index)

    def mark_update(self, index: Any) -> None:
        """Hook: the items at ``index`` were overwritten through ``buffer[index] = ...``."""
        self.extend(index)

    def update_priority(self, index: Any, priority: Any, *, storage: Storage | None = None) -> None:
        """No-op for samplers without priorities."""

    def _empty(self) -> None:
        """Forget everything (the buffer was emptied)."""

    def _reset_epoch(self) -> None:
        """Start a new epoch (iteration over a buffer starts one)."""
        self.ran_out = False

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None

    def _checkpoint_state(self) -> tuple[dict, Any]:
        return {}, None

    def _prepare_load(self, meta: dict, tensors: Any, path: Any) -> Any:
        return None

    def _commit_load(self, prepared: Any) -> None:
        return None

    def dumps(self, path: Any) -> None:
        meta, tensors = self._checkpoint_state()
        write_component(path, type(self).__name__, meta, tensors)

    def loads(self, path: Any) -> None:
        meta, tensors = read_component(path, type(self).__name__)
        self._commit_load(prepared(path, self._prepare_load, meta, tensors, path))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class RandomSampler(Sampler):
    """Uniform sampling with replacement over the filled part of the storage.

    Example:
        >>> import torch
        >>> from steersman.data.replay_buffers import ListStorage
        >>> st = ListStorage(10); st.set(range(4), list("abcd"))
        >>> index, info = RandomSampler().sample(st, 6)
        >>> index.shape, bool(((index >= 0) & (index < 4)).all()), info
        (torch.Size([6]), True, {})
    """

    def sample(self, storage: Storage, batch_size: int) -> tuple[Tensor, dict]:
        n = len(storage)
        if n == 0:
            raise RuntimeError(_EMPTY)
        return torch.randint(n, (batch_size,), device=storage._leaf_device()), {}


class SamplerWithoutReplacement(Sampler):
    """Each item once per epoch, in a random (``shuffle=True``) or storage order.

    Args:
        drop_last: drop the last batch of an epoch if it is smaller than ``batch_size``
            (otherwise it is returned short).
        shuffle: random order (default) or ``0, 1, 2, ...``.

    A new epoch starts when the previous one is exhausted, or when the storage length
    changed since the epoch started. ``ran_out`` is True right after an epoch's last batch
    (iterating over a buffer stops there).

    Example:
        >>> import torch
        >>> from steersman.data.replay_buffers import ListStorage
        >>> st = ListStorage(10); st.set(range(5), list("abcde"))
        >>> s = SamplerWithoutReplacement()
        >>> a, _ = s.sample(st, 3); b, _ = s.sample(st, 3)
        >>> sorted(a.tolist() + b.tolist()), s.ran_out
        ([0, 1, 2, 3, 4], True)
    """

    def __init__(self, drop_last: bool = False, shuffle: bool = True) -> None:
        self.drop_last = drop_last
        self.shuffle = shuffle
        self._sample_list: Tensor | None = None
        self._len_at_start = 0
        self.ran_out = False

    def _new_epoch(self, n: int, device: Any) -> None:
        self._sample_list = torch.randperm(n, device=device) if self.shuffle else torch.arange(n, device=device)
        self._len_at_start = n

    def sample(self, storage: Storage, batch_size: int) -> tuple[Tensor, dict]:
        n = len(storage)
        if n == 0:
            raise RuntimeError(_EMPTY)
        if self.drop_last and n < batch_size:
            raise ValueError(f"batch_size={batch_size} is larger than the {n} stored items and drop_last=True")
        lst = self._sample_list
        if lst is None or lst.numel() == 0 or n != self._len_at_start or (self.drop_last and lst.numel() < batch_size):
            self._new_epoch(n, storage._leaf_device())
            lst = self._sample_list
        index, self._sample_list = lst[:batch_size], lst[batch_size:]
        left = self._sample_list.numel()
        self.ran_out = left == 0 or (self.drop_last and left < batch_size)
        return index, {}

    def _empty(self) -> None:
        self._sample_list = None
        self._len_at_start = 0
        self.ran_out = False

    def _reset_epoch(self) -> None:
        self._sample_list = None
        self.ran_out = False

    def state_dict(self) -> dict[str, Any]:
        return {"_sample_list": None if self._sample_list is None else self._sample_list.clone(),
                "len_storage": self._len_at_start, "_ran_out": self.ran_out}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        lst = state["_sample_list"]
        self._sample_list = None if lst is None else lst.clone()
        self._len_at_start = int(state["len_storage"])
        self.ran_out = bool(state["_ran_out"])

    def _checkpoint_state(self) -> tuple[dict, Any]:
        meta = {"len_storage": self._len_at_start, "ran_out": self.ran_out, "drop_last": self.drop_last,
                "shuffle": self.shuffle, "has_list": self._sample_list is not None}
        tensors = None if self._sample_list is None else TensorDict({"sample_list": self._sample_list}, [])
        return meta, tensors

    def _prepare_load(self, meta: dict, tensors: Any, path: Any) -> Any:
        n = get_field(meta, "len_storage", int, path)
        ran_out = get_field(meta, "ran_out", bool, path)
        lst = None
        if get_field(meta, "has_list", bool, path):
            lst = None if tensors is None else tensors.get("sample_list", None)
            if not isinstance(lst, Tensor):
                raise CheckpointError(f"{path}: the sample list is missing", file=path, field="has_list")
            lst = lst.clone()
            if lst.dtype is not torch.long or lst.ndim != 1 or (lst.numel() and (lst.min() < 0 or lst.max() >= n)):
                raise CheckpointError(f"{path}: the sample list is not a list of indices below {n}")
        return lst, n, ran_out

    def _commit_load(self, prepared: Any) -> None:
        self._sample_list, self._len_at_start, self.ran_out = prepared

    def __repr__(self) -> str:
        return f"SamplerWithoutReplacement(drop_last={self.drop_last}, shuffle={self.shuffle})"


_INF_BITS = np.float64(np.inf).view(np.uint64)


def _max_if_valid(x: np.ndarray) -> float | None:
    """``x.max()`` if every entry of the float64 array ``x`` is finite and ``>= +0.0``, else None.

    One reduction: read as unsigned integers, non-negative doubles keep their order and
    every negative number (sign bit set), NaN and infinity is at or above the bits of ``+inf``.
    """
    top = x.view(np.uint64).max()
    return float(top.view(np.float64)) if top < _INF_BITS else None


_REDUCTIONS = ("max", "min", "mean", "median", "sum")


def _reduce(x: Tensor, how: str) -> Tensor:
    if how == "max":
        return x.amax(1)
    if how == "min":
        return x.amin(1)
    if how == "mean":
        return x.mean(1)
    if how == "sum":
        return x.sum(1)
    return x.median(1).values


class PrioritizedSampler(Sampler):
    """Prioritized experience replay (Schaul et al., 2015) over sum and min segment trees.

    Item ``i`` is drawn with probability ``P(i) = p_i / sum_j p_j`` where
    ``p_i = (priority_i + eps) ** alpha``; each draw comes with the importance weight
    ``w_i = (N * P(i)) ** -beta / max_j w_j = (p_i / min_j p_j) ** -beta`` (``N`` the number
    of stored items), returned in ``info["_weight"]`` (float32) and, the same tensor, in
    ``info["priority_weight"]`` (TorchRL 0.14's name, which the losses'
    ``use_prioritized_weights`` reads).

    The priorities live in a :class:`~steersman.data.replay_buffers.segment_tree.PriorityTree`
    (float64 sums over blocks of 32 leaves, minima over blocks of 1024 leaves) updated and
    searched a whole batch at a time with a fixed number of NumPy operations per batch, no
    compiled extension. New items get ``default_priority``.

    Args:
        max_capacity: number of slots (the storage's ``max_size``).
        alpha: priority exponent (``0`` gives uniform sampling).
        beta: importance-weight exponent (``0`` gives weights of 1).
        eps: added to priorities before the exponent, so no item is never drawn.
        dtype: accepted for TorchRL compatibility; the trees are always float64.
        reduction: how ``update_priority`` reduces priorities that have more values per index
            (``[B, T]`` for trajectories): ``"max"`` (default), ``"min"``, ``"mean"``,
            ``"median"`` or ``"sum"``.
        max_priority_within_buffer: new items get the largest priority currently *stored*
            (True) or the largest priority ever set (False, default). Before any update it is 1.
        device: ``None`` or a CPU device (the trees live on the CPU); others are refused.

    ``update_priority`` raises ``ValueError`` for a negative, NaN or infinite priority and
    ``IndexError`` for an index out of range, changing nothing.

    Example:
        >>> import torch
        >>> from steersman.data.replay_buffers import LazyTensorStorage
        >>> st = LazyTensorStorage(4); st.set(torch.arange(4), torch.zeros(4, 1))
        >>> s = PrioritizedSampler(4, alpha=1.0, beta=1.0, eps=0.0)
        >>> s.extend(torch.arange(4))
        >>> s.update_priority(torch.arange(4), torch.tensor([1.0, 1.0, 1.0, 5.0]))
        >>> idx, info = s.sample(st, 2000)
        >>> round((idx == 3).float().mean().item(), 1)  # 5 / 8
        0.6
        >>> sorted(set(info["_weight"].tolist()))  # (p_i / min p) ** -1
        [0.20000000298023224, 1.0]
    """

    def __init__(self, max_capacity: int, alpha: float, beta: float, eps: float = 1e-8,
                 dtype: torch.dtype = torch.float64, reduction: str = "max",
                 max_priority_within_buffer: bool = False, device: Any = None) -> None:
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError(f"PrioritizedSampler(device={device!r}): the priority trees live on the CPU here")
        if isinstance(max_capacity, bool) or not isinstance(max_capacity, int) or max_capacity < 1:
            raise ValueError(f"max_capacity must be a positive integer, got {max_capacity!r}")
        for name, v in (("alpha", alpha), ("beta", beta), ("eps", eps)):
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
        self._max_capacity = max_capacity
        self._alpha = float(alpha)
        self._beta = float(beta)
        self._eps = float(eps)
        self.dtype = dtype
        self.reduction = reduction
        self._max_priority_within_buffer = max_priority_within_buffer
        self._max_priority: float | None = None
        self._tree = PriorityTree(max_capacity, track_max=max_priority_within_buffer)

    # ---------------------------------------------------------------- properties
    @property
    def max_capacity(self) -> int:
        return self._max_capacity

    @property
    def alpha(self) -> float:
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        self._alpha = float(value)

    @property
    def beta(self) -> float:
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        self._beta = float(value)

    @property
    def max_priority(self) -> float:
        """The raw priority given to new items."""
        if self._max_priority_within_buffer:
            top = self._tree.max()
            if top == -math.inf:
                return 1.0
            return max(top ** (1 / self._alpha) - self._eps, 0.0) if self._alpha else 1.0
        return 1.0 if self._max_priority is None else self._max_priority

    @property
    def default_priority(self) -> float:
        """The tree value (``(max_priority + eps) ** alpha``) of a new item."""
        if self._max_priority_within_buffer:
            top = self._tree.max()
            if top != -math.inf:
                return top
            return (1.0 + self._eps) ** self._alpha
        mp = 1.0 if self._max_priority is None else self._max_priority
        return (mp + self._eps) ** self._alpha

    # ---------------------------------------------------------------- tree writes
    def _set(self, index: Tensor, value: Any) -> None:
        self._tree.update(index, value)

    def _as_index(self, index: Any) -> Tensor:
        if type(index) is Tensor and index.dtype is torch.long and index.ndim == 1 and index.device.type == "cpu":
            return index  # the common case: a sample's "index"
        if isinstance(index, tuple):
            raise TypeError("pass flat indices to update_priority (ReplayBuffer does this for ndim=2 storages)")
        if isinstance(index, Tensor):
            if index.dtype is not torch.long:
                if index.dtype.is_floating_point or index.dtype is torch.bool:
                    raise TypeError(f"priority indices must be integers, got dtype {index.dtype}")
                index = index.long()
            if index.device.type != "cpu":
                index = index.cpu()
            return index.reshape(-1) if index.ndim != 1 else index
        return torch.as_tensor(index, dtype=torch.long).reshape(-1)

    def add(self, index: Any) -> None:
        self.extend(self._as_index(index))

    def extend(self, index: Tensor) -> None:
        index = self._as_index(index)
        if index.numel():
            self._check_slots(index.numpy())
            self._set(index, self.default_priority)

    def _check_slots(self, idx: np.ndarray) -> None:
        if idx.shape[0] and (idx.min() < 0 or idx.max() >= self._max_capacity):
            raise IndexError(f"indices span [{idx.min()}, {idx.max()}] but the sampler has {self._max_capacity} slots")

    def _written(self, index: Tensor, span: tuple[int, int] | None) -> None:
        # fast path for slots just written by a writer: distinct indices (``span``: they are
        # the contiguous range [start, stop)), all getting the default priority
        if not index.numel():
            return
        value = self.default_priority
        if span is not None:
            self._tree.fill_range(span[0], span[1], value)
        else:
            self._tree.update(index if index.device.type == "cpu" else index.cpu(), value, unique=True)

    def mark_update(self, index: Any) -> None:
        self.extend(self._as_index(index))

    def update_priority(self, index: Any, priority: Any, *, storage: Storage | None = None) -> None:
        """Sets the priority of the items at ``index`` (last duplicate wins).

        ``priority`` is a scalar, one value per index, or ``[len(index), ...]`` (reduced
        with ``reduction``). Raises before changing anything on a bad value or index.
        """
        index = self._as_index(index)
        n = index.shape[0]
        if n == 0:
            return
        prio = priority if isinstance(priority, Tensor) else torch.as_tensor(priority)
        if prio.requires_grad:
            prio = prio.detach()
        if prio.device.type != "cpu":
            prio = prio.cpu()
        if prio.dtype is torch.bool or prio.is_complex():
            raise TypeError(f"priorities must be real numbers, got dtype {prio.dtype}")
        if prio.ndim != 1 or prio.shape[0] != n:
            if prio.numel() == 1:
                prio = prio.reshape(1).expand(n)
            elif prio.numel() != n:
                if prio.ndim >= 1 and prio.shape[0] == n:
                    prio = _reduce(prio.reshape(n, -1).to(torch.float64), self.reduction)
                else:
                    raise ValueError(f"got priorities of shape {list(prio.shape)} for {n} indices")
            else:
                prio = prio.reshape(n)
        pr = np.add(prio.numpy(), 0.0, dtype=np.float64)  # a private float64 copy; -0.0 becomes 0.0
        hi = _max_if_valid(pr)
        if hi is None:
            bad = pr[~((pr >= 0) & (pr < math.inf))][:3].tolist()
            raise ValueError(f"priorities must be finite and >= 0; got {bad} (no priority was changed)")
        idx = index.numpy()
        limit = self._max_capacity if storage is None else len(storage)
        if idx.view(np.uint64).max() >= limit:  # a negative index wraps to a huge unsigned one
            raise IndexError(
                f"priority indices span [{idx.min()}, {idx.max()}] but only [0, {limit}) hold items "
                "(no priority was changed)"
            )
        if self._eps:
            pr += self._eps
        if self._alpha != 1.0:
            np.power(pr, self._alpha, out=pr)
        self._tree.update(idx, pr)
        if not self._max_priority_within_buffer and (self._max_priority is None or hi > self._max_priority):
            self._max_priority = hi

    # ---------------------------------------------------------------- sampling
    def _draw(self, n: int, batch_size: int) -> tuple[Tensor, Tensor, float]:
        """(leaf indices, their tree values, smallest stored value) of ``batch_size`` draws."""
        tree = self._tree
        if not tree.total() > 0:
            raise RuntimeError("all stored priorities are zero: nothing can be sampled (use eps > 0)")
        p_min = tree.min()
        # with every stored priority > 0 no draw can land on a zero leaf: skip that check
        index, p = tree.draw(torch.rand(batch_size, dtype=torch.float64), n, check=not p_min > 0)
        return index, p, p_min

    def _weights(self, p: Tensor, p_min: float) -> Tensor:
        if self._beta == 0.0:
            return torch.ones(p.shape, dtype=torch.float32)
        pn = p.numpy()
        if not p_min > 0:  # a zero priority somewhere (eps=0): normalise by the draws
            pos = pn[pn > 0]
            p_min = float(pos.min()) if pos.shape[0] else 1.0
        w = pn / p_min
        np.power(w, -self._beta, out=w)
        return torch.from_numpy(w.astype(np.float32))

    def sample(self, storage: Storage, batch_size: int) -> tuple[Tensor, dict]:
        n = len(storage)
        if n == 0:
            raise RuntimeError(_EMPTY)
        index, p, p_min = self._draw(n, batch_size)
        dev = storage._leaf_device()
        if dev.type != "cpu":
            index = index.to(dev)
        w = self._weights(p, p_min)
        return index, {"_weight": w, "priority_weight": w}

    # ---------------------------------------------------------------- state
    def _empty(self) -> None:
        self._tree.clear()
        self._max_priority = None

    def state_dict(self) -> dict[str, Any]:
        return {"_alpha": self._alpha, "_beta": self._beta, "_eps": self._eps, "_max_priority": self._max_priority,
                "_sum_tree": self._tree.leaves("sum").clone(), "_min_tree": self._tree.leaves("min").clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._commit_load(self._prepare_state(state["_sum_tree"], state["_min_tree"], state["_alpha"],
                                              state["_beta"], state["_eps"], state["_max_priority"], "state_dict"))

    def _prepare_state(self, sum_leaves: Tensor, min_leaves: Tensor, alpha: Any, beta: Any, eps: Any,
                       max_priority: Any, where: Any) -> Any:
        size = self._max_capacity
        for name, t in (("sum", sum_leaves), ("min", min_leaves)):
            if not isinstance(t, Tensor) or t.shape != (size,) or not t.dtype.is_floating_point:
                raise CheckpointError(f"{where}: the {name}-tree leaves do not fit a sampler of capacity {size}")
        if bool((sum_leaves < 0).any()) or bool(sum_leaves.isnan().any()) or bool(sum_leaves.isinf().any()):
            raise CheckpointError(f"{where}: the stored priorities are not all finite and >= 0")
        if max_priority is not None and (type(max_priority) not in (int, float) or not 0 <= max_priority < math.inf):
            raise CheckpointError(f"{where}: bad max priority {max_priority!r}")
        return (sum_leaves.to(self.dtype).clone(), min_leaves.to(self.dtype).clone(), float(alpha), float(beta),
                float(eps), max_priority)

    def _commit_load(self, prepared: Any) -> None:
        s, m, self._alpha, self._beta, self._eps, self._max_priority = prepared
        self._tree.load(s, m)

    def _checkpoint_state(self) -> tuple[dict, Any]:
        meta = {"max_capacity": self._max_capacity, "alpha": self._alpha, "beta": self._beta, "eps": self._eps,
                "max_priority": self._max_priority}
        return meta, TensorDict({"sum_tree": self._tree.leaves("sum"), "min_tree": self._tree.leaves("min")}, [])

    def _prepare_load(self, meta: dict, tensors: Any, path: Any) -> Any:
        cap = get_field(meta, "max_capacity", int, path)
        if cap != self._max_capacity:
            raise CheckpointError(f"{path}: saved with max_capacity={cap}, this sampler has {self._max_capacity}")
        if tensors is None or not {"sum_tree", "min_tree"} <= set(tensors.keys()):
            raise CheckpointError(f"{path}: the priority trees are missing")
        return self._prepare_state(tensors.get("sum_tree"), tensors.get("min_tree"),
                                   get_field(meta, "alpha", (int, float), path),
                                   get_field(meta, "beta", (int, float), path),
                                   get_field(meta, "eps", (int, float), path), meta.get("max_priority"), path)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(max_capacity={self._max_capacity}, alpha={self._alpha}, beta={self._beta}, "
                f"eps={self._eps}, reduction={self.reduction!r})")


# --------------------------------------------------------------------------------------
# slices
# --------------------------------------------------------------------------------------
def _columns_order(storage: Storage) -> Tensor:
    """The flat slots of an ``ndim=2`` storage env by env, each env's steps oldest first
    (a full circular storage's oldest row is the one after the last written)."""
    rows, W = storage._filled_rows, storage._W
    last = storage._last_cursor
    start = (last + 1) % rows if rows == storage._rows_capacity and last is not None else 0
    chrono = (torch.arange(rows) + start) % rows
    return (chrono.unsqueeze(0) * W + torch.arange(W).unsqueeze(1)).reshape(-1)


def _replace_last(key: NestedKey, new: str) -> NestedKey:
    key = unravel_key(key)
    return new if isinstance(key, str) else key[:-1] + (new,)


def _span_pair(span: Any) -> tuple[int, int]:
    """TorchRL's ``span`` as ``(left, right)`` overhangs: ``True`` -> ``slice_len - 1``
    (capped when sampling), ``False`` -> 0, an int as given."""
    pair = tuple(span) if isinstance(span, (tuple, list)) else (span, span)
    if len(pair) != 2:
        raise ValueError(f"span is a bool, an int or a (left, right) pair, got {span!r}")
    out = []
    for x in pair:
        if isinstance(x, bool):
            out.append(10**9 if x else 0)
        elif isinstance(x, int) and x >= 0:
            out.append(x)
        else:
            raise ValueError(f"span values are bools or non-negative ints, got {span!r}")
    return out[0], out[1]


class SliceSampler(Sampler):
    """Samples sub-trajectories (slices) of consecutive steps that stay inside one episode.

    Args:
        num_slices: slices per batch (``slice_len = batch_size // num_slices``), or
        slice_len: steps per slice (``num_slices = batch_size // slice_len``); give exactly one.
        end_key: a boolean entry marking the last step of each episode (default
            ``("next", "done")``).
        traj_key: an entry holding an episode id per step; used instead of ``end_key``
            when given (with neither key given: ``"episode"`` if the storage has it, else
            ``("next", "done")``).
        ends / trajectories: precomputed end flags / episode ids, for static datasets.
        cache_values: remember the episode layout between batches (recomputed after writes).
        truncated_key: where ``info`` marks the last step of every slice (also sets the
            matching ``"done"`` to ``stored done | truncated`` and passes ``"terminated"``
            through); ``None`` disables it.
        compile, use_gpu: accepted for TorchRL compatibility; no effect (the episode
            boundaries are found with plain tensor ops on the storage's device).
        strict_length: if False, episodes shorter than ``slice_len`` yield shorter slices
            and the batch is a flat concatenation of fewer than ``batch_size`` steps.
        end_keys: several end flags OR-ed together (e.g. ``("next", "done")``,
            ``("next", "truncated")``, ``("next", "terminated")``) for data whose episodes end
            under different flags; keys the storage lacks are skipped (one must be there).
            Exclusive with ``end_key``.
        init_key: where ``info`` flags the first step of every slice (OR-ed with the stored
            flags when the storage has that entry), so recurrent modules restart from the
            stored hidden state at each slice start. Default ``"is_init"`` (TorchRL's);
            ``None`` leaves the stored flags as they are.
        fragmented: rebuild episodes from ``traj_key`` (default ``"episode"``) and
            ``step_key`` (default ``"step_count"``), one scalar integer each per step, even
            where an episode's steps sit at non-adjacent storage positions (several writers
            interleaving): steps are ordered by (episode, step) and a gap in the step count
            splits an episode. Each (episode, step) pair must be unique. Not with ``ndim=2``
            storages, ``span``, ``ends`` or ``trajectories``.
        pad_output: with ``strict_length=False``, pad each short slice to ``slice_len`` by
            repeating its last step, so the batch always has ``batch_size`` steps;
            ``info[("collector", "mask")]`` is True on real steps, False on repeats.
        span: let slices hang over the start and/or end of their episode (``(left,
            right)``, or one value for both): ``True`` keeps at least one step of the
            episode, an int ``i`` at least ``slice_len - i`` steps; only the steps inside the
            episode are returned, so slices can be shorter (flat concatenation as with
            ``strict_length=False``) and episodes shorter than ``slice_len`` can be drawn.

    Episode boundaries come from ``traj_key``/``end_key`` and from the writer: the newest
    item ends a trajectory (in a full circular buffer the next slot holds the oldest data).
    With ``ndim=2`` storages (``[time, n_envs]``) episodes run along time inside each env's
    column, across writes, and each env's newest step ends one; ``info["index"]`` then
    holds ``(rows, cols)``. A slice may wrap around the end of a
    full circular storage when the episode does. Episodes are drawn uniformly, then a start
    uniformly within each (every valid start of an episode equally likely).

    The result has batch ``[num_slices * slice_len]``, slices one after another: reshape
    with ``data.reshape(num_slices, slice_len)``.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.data.replay_buffers import LazyTensorStorage
        >>> st = LazyTensorStorage(100)
        >>> done = torch.zeros(20, 1, dtype=torch.bool); done[[4, 14, 19]] = True  # 3 episodes
        >>> st.set(torch.arange(20), TensorDict({"step": torch.arange(20), "next": {"done": done}}, [20]))
        >>> st._last_cursor = 19
        >>> index, info = SliceSampler(slice_len=4).sample(st, 8)
        >>> steps = index.view(2, 4)
        >>> bool(((steps[:, 1:] - steps[:, :-1]) == 1).all())  # consecutive, same episode
        True
        >>> info[("next", "truncated")].view(2, 4)[:, -1].tolist()
        [True, True]
    """

    def __init__(self, *, num_slices: int | None = None, slice_len: int | None = None,
                 end_key: NestedKey | None = None, traj_key: NestedKey | None = None,
                 ends: Tensor | None = None, trajectories: Tensor | None = None, cache_values: bool = False,
                 truncated_key: NestedKey | None = ("next", "truncated"), strict_length: bool = True,
                 compile: bool | dict = False, use_gpu: bool | Any = False,
                 end_keys: Sequence[NestedKey] | None = None, init_key: NestedKey | None = "is_init",
                 step_key: NestedKey | None = None, fragmented: bool = False, pad_output: bool = False,
                 span: bool | int | tuple[bool | int, bool | int] = False) -> None:
        if (num_slices is None) == (slice_len is None):
            raise ValueError("give exactly one of num_slices and slice_len")
        if end_keys is not None and end_key is not None:
            raise ValueError("end_key and end_keys are exclusive: give the single flag or the list to OR together")
        if pad_output and strict_length:
            raise ValueError("pad_output=True pads the slices that strict_length=False allows to be short; "
                             "pass strict_length=False with it")
        if fragmented and (ends is not None or trajectories is not None or span not in (False, 0, (False, False), (0, 0))):
            raise ValueError("fragmented=True rebuilds episodes from traj_key and step_key: it takes neither "
                             "ends/trajectories nor span")
        self.end_keys = None if end_keys is None else [unravel_key(k) for k in end_keys]
        if self.end_keys is not None and not self.end_keys:
            raise ValueError("end_keys is empty: give at least one end flag")
        self.init_key = None if init_key is None else unravel_key(init_key)
        self.fragmented = bool(fragmented)
        self.step_key = unravel_key("step_count" if step_key is None else step_key)
        self.pad_output = bool(pad_output)
        self.span = _span_pair(span)
        self._order: Tensor | None = None
        for name, v in (("num_slices", num_slices), ("slice_len", slice_len)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        self.num_slices = num_slices
        self.slice_len = slice_len
        self._auto_episode = end_key is None and traj_key is None and end_keys is None  # TorchRL: "episode" if stored
        if fragmented and traj_key is None:
            traj_key = "episode"
        self.end_key = ("next", "done") if end_key is None else unravel_key(end_key)
        self.traj_key = None if traj_key is None else unravel_key(traj_key)
        self._ends = ends
        self._trajectories = trajectories
        self.cache_values = cache_values
        self.truncated_key = None if truncated_key is None else unravel_key(truncated_key)
        self.strict_length = strict_length
        self._cache: tuple | None = None

    # ---------------------------------------------------------------- layout
    def extend(self, index: Tensor) -> None:
        self._cache = None

    def add(self, index: Any) -> None:
        self._cache = None

    def mark_update(self, index: Any) -> None:
        self._cache = None

    def _empty(self) -> None:
        self._cache = None

    def _episode_ends(self, storage: Storage) -> Tensor:
        if not isinstance(storage, TensorStorage) or not storage.initialized or not storage._is_td:
            raise TypeError("slice samplers need a tensor storage of TensorDicts (LazyTensorStorage, LazyMemmapStorage...)")
        n = len(storage)
        rows = storage._filled_rows
        td = storage._storage
        self._order = None
        if self.fragmented:
            return self._fragmented_ends(storage, td, n, rows)
        # ndim=2 ([time, n_envs]): each env's column, oldest row first, one after another;
        # positions in that order map to storage slots through ``order``
        order = _columns_order(storage) if storage.ndim == 2 else None
        if self._trajectories is not None:
            traj = torch.as_tensor(self._trajectories).reshape(-1)[:n]
            traj = traj if order is None else traj[order]
            ends = traj != traj.roll(-1)
        elif self._ends is not None:
            ends = torch.as_tensor(self._ends, dtype=torch.bool).reshape(-1)[:n].clone()
            ends = ends if order is None else ends[order]
        else:
            keys = td.keys(include_nested=True, leaves_only=True)
            traj_key = self.traj_key
            if traj_key is None and self._auto_episode and "episode" in keys:
                traj_key = "episode"
            if traj_key is not None:
                if traj_key not in keys:
                    raise KeyError(f"the storage has no trajectory-id entry {traj_key!r}")
                traj = td.get(traj_key)[:rows].reshape(n, -1)[:, 0]
                traj = traj if order is None else traj[order.to(traj.device)]
                ends = traj != traj.roll(-1)
            elif self.end_keys is not None:
                present = [k for k in self.end_keys if k in keys]
                if not present:
                    raise KeyError(f"the storage has none of the end_keys {self.end_keys}")
                ends = torch.zeros(n, dtype=torch.bool, device=td.device)
                for k in present:
                    ends |= td.get(k)[:rows].reshape(n, -1).bool().any(-1).to(ends.device)
                ends = ends if order is None else ends[order.to(ends.device)]
            else:
                if self.end_key not in keys:
                    raise KeyError(
                        f"the storage has neither the end entry {self.end_key!r} nor a trajectory id "
                        "(pass end_key= or traj_key=)"
                    )
                ends = td.get(self.end_key)[:rows].reshape(n, -1).any(-1)
                ends = ends if order is None else ends[order.to(ends.device)]
        ends = ends.cpu()
        if order is not None:
            ends.view(storage._W, rows)[:, -1] = True  # the newest step of every env
            self._order = order
        else:
            last = storage._last_cursor
            ends[(n - 1) if last is None or last >= n else last] = True
        return ends

    def _fragmented_ends(self, storage: Storage, td: Any, n: int, rows: int) -> Tensor:
        """Ends in (episode, step) order; ``self._order`` maps that order to storage slots."""
        if storage.ndim != 1:
            raise ValueError("fragmented=True needs a storage with ndim=1")
        keys = td.keys(include_nested=True, leaves_only=True)
        for what, key in (("traj_key", self.traj_key), ("step_key", self.step_key)):
            if key not in keys:
                raise KeyError(f"fragmented=True: the storage has no {what} entry {key!r}")
        traj = td.get(self.traj_key)[:rows].reshape(n, -1)[:, 0].long().cpu()
        step = td.get(self.step_key)[:rows].reshape(n, -1)[:, 0].long().cpu()
        order = torch.sort(step, stable=True).indices
        order = order[torch.sort(traj[order], stable=True).indices]
        t, st = traj[order], step[order]
        same = t[1:] == t[:-1]
        if bool((same & (st[1:] == st[:-1])).any()):
            raise ValueError(f"fragmented=True: some ({self.traj_key!r}, {self.step_key!r}) pairs appear twice in "
                             "the storage; trajectory ids must not be reused while their steps are stored")
        ends = torch.ones(n, dtype=torch.bool)
        ends[:-1] = ~(same & (st[1:] == st[:-1] + 1))
        self._order = order
        return ends

    def _layout(self, storage: Storage) -> tuple[Tensor, Tensor, Tensor, int]:
        """(episode ends positions, starts, lengths, n); every slot in exactly one episode."""
        n = len(storage)
        if n == 0:
            raise RuntimeError(_EMPTY)
        if self.cache_values and self._cache is not None and self._cache[-1] == n:
            return self._cache
        ends = self._episode_ends(storage)
        stop = ends.nonzero().squeeze(1)
        prev = stop.roll(1)
        starts = (prev + 1) % n
        lengths = (stop - prev - 1) % n + 1
        out = (stop, starts, lengths, n)
        if self.cache_values:
            self._cache = out
        return out

    def _slice_shape(self, batch_size: int) -> tuple[int, int]:
        if self.num_slices is not None:
            if batch_size % self.num_slices:
                raise ValueError(f"batch_size={batch_size} is not a multiple of num_slices={self.num_slices}")
            return self.num_slices, batch_size // self.num_slices
        if batch_size % self.slice_len:
            raise ValueError(f"batch_size={batch_size} is not a multiple of slice_len={self.slice_len}")
        return batch_size // self.slice_len, self.slice_len

    def _pick(self, n_traj: int, k: int) -> Tensor:
        return torch.randint(n_traj, (k,))

    def _eligible(self, starts: Tensor, lengths: Tensor, L: int) -> tuple[Tensor, Tensor]:
        if not self.strict_length:
            return starts, lengths
        ok = lengths >= L
        if not bool(ok.any()):
            raise RuntimeError(
                f"no stored episode is at least slice_len={L} steps long (longest: {int(lengths.max())}); "
                "use a shorter slice or strict_length=False"
            )
        return starts[ok], lengths[ok]

    def _finish(self, storage: Storage, start: Tensor, avail: Tensor, L: int, n: int,
                seq: Tensor | None = None) -> tuple[Tensor, dict]:
        """Indices of slices beginning at ``start`` with ``avail`` steps left in their episode
        (``seq``: the steps each slice keeps, when already known)."""
        k = start.shape[0]
        steps = torch.arange(L)
        index = (start.unsqueeze(1) + steps) % n
        info: dict[Any, Any] = {}
        pad = getattr(self, "pad_output", False)
        if seq is None and not self.strict_length:
            seq = avail.clamp(max=L)
        if seq is None:
            index = index.reshape(-1)
        elif pad:  # repeat each slice's last step up to L
            keep = steps < seq.unsqueeze(1)
            index = ((start.unsqueeze(1) + torch.minimum(steps, (seq - 1).unsqueeze(1))) % n).reshape(-1)
            info[("collector", "mask")] = keep.reshape(-1)
        else:
            index = index[steps < seq.unsqueeze(1)]
        order = getattr(self, "_order", None)
        if order is not None:  # fragmented: positions in (episode, step) order -> storage slots
            index = order[index]
        first = torch.zeros(index.shape[0], 1, dtype=torch.bool)
        if seq is None or pad:
            first.view(k, L)[:, 0] = True
        else:
            first[seq.cumsum(0) - seq] = True
        init_key = getattr(self, "init_key", None)
        if init_key is not None:
            td = storage._storage
            stored = td.get(init_key)[storage._unflat(index)] if init_key in td.keys(True, True) else None
            info[init_key] = first if stored is None else stored.reshape(index.shape[0], -1).bool() | first
        if self.truncated_key is not None:
            truncated = torch.zeros(index.shape[0], 1, dtype=torch.bool)
            if seq is None:
                truncated.view(k, L)[:, -1] = True
            elif pad:
                truncated.view(k, L)[steps >= (seq - 1).unsqueeze(1)] = True
            else:
                truncated[seq.cumsum(0) - 1] = True
            done_key = _replace_last(self.truncated_key, "done")
            term_key = _replace_last(self.truncated_key, "terminated")
            td = storage._storage
            keys = td.keys(include_nested=True, leaves_only=True)
            nd = storage._unflat(index)
            done = td.get(done_key)[nd] if done_key in keys else None
            done = truncated.clone() if done is None else done.reshape(index.shape[0], -1).bool() | truncated
            term = td.get(term_key)[nd].reshape(index.shape[0], -1).bool() if term_key in keys else torch.zeros_like(truncated)
            info.update({self.truncated_key: truncated, done_key: done, term_key: term})
        dev = storage._leaf_device()
        if dev.type != "cpu":
            index = index.to(dev)
        return index, info

    def sample(self, storage: Storage, batch_size: int) -> tuple[Tensor, dict]:
        k, L = self._slice_shape(batch_size)
        _, starts, lengths, n = self._layout(storage)
        if getattr(self, "span", (0, 0)) != (0, 0):
            return self._sample_span(storage, starts, lengths, k, L, n)
        starts, lengths = self._eligible(starts, lengths, L)
        traj = self._pick(starts.shape[0], k)
        if traj.numel() == 0:
            raise RuntimeError("no episode left to sample in this epoch")
        length = lengths[traj]
        span = (length - L + 1).clamp_min(1)
        offset = (torch.rand(traj.shape[0]) * span).long().clamp_(max=span - 1)
        return self._finish(storage, starts[traj] + offset, length - offset, L, n)

    def _sample_span(self, storage: Storage, starts: Tensor, lengths: Tensor, k: int, L: int,
                     n: int) -> tuple[Tensor, dict]:
        """Slices ``[o, o + L)`` with ``o`` uniform in ``[-left, length - L + right]``, cut to
        the episode (``left``/``right``: how far they may hang over each end)."""
        left, right = (min(int(x), L - 1) for x in self.span)
        ok = lengths + left + right >= L  # an episode yields at least one step
        if not bool(ok.any()):
            raise RuntimeError(f"no stored episode can give a slice of slice_len={L} with span={self.span}")
        starts, lengths = starts[ok], lengths[ok]
        traj = self._pick(starts.shape[0], k)
        length = lengths[traj]
        lo = torch.full_like(length, -left)
        hi = torch.minimum(length - L + right, length - 1)
        offset = lo + (torch.rand(k) * (hi - lo + 1)).long().clamp_(max=hi - lo)
        begin = offset.clamp_min(0)
        seq = torch.minimum(offset + L, length) - begin
        return self._finish(storage, starts[traj] + begin, length - begin, L, n, seq=seq)

    def __repr__(self) -> str:
        what = f"num_slices={self.num_slices}" if self.num_slices is not None else f"slice_len={self.slice_len}"
        key = f"traj_key={self.traj_key!r}" if self.traj_key is not None else f"end_key={self.end_key!r}"
        return f"{type(self).__name__}({what}, {key}, strict_length={self.strict_length})"


class SliceSamplerWithoutReplacement(SliceSampler):
    """A :class:`SliceSampler` that draws each episode at most once per epoch.

    Args: as :class:`SliceSampler` (``end_keys`` and ``init_key`` included), plus ``drop_last`` (drop a final batch with fewer than
    ``num_slices`` episodes left) and ``shuffle`` (random episode order, default True).
    One slice (at a random start) is taken from each episode drawn; ``ran_out`` is True
    after the epoch's last batch.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.data.replay_buffers import LazyTensorStorage
        >>> st = LazyTensorStorage(100)
        >>> ep = torch.arange(12) // 4  # three episodes of 4 steps
        >>> st.set(torch.arange(12), TensorDict({"episode": ep}, [12])); st._last_cursor = 11
        >>> s = SliceSamplerWithoutReplacement(num_slices=2, traj_key="episode")
        >>> a, _ = s.sample(st, 4); b, _ = s.sample(st, 4)
        >>> sorted(set((torch.cat([a, b]) // 4).tolist())), s.ran_out
        ([0, 1, 2], True)
    """

    def __init__(self, *, num_slices: int | None = None, slice_len: int | None = None, drop_last: bool = False,
                 end_key: NestedKey | None = None, traj_key: NestedKey | None = None, ends: Tensor | None = None,
                 trajectories: Tensor | None = None, truncated_key: NestedKey | None = ("next", "truncated"),
                 strict_length: bool = True, shuffle: bool = True, cache_values: bool = False,
                 compile: bool | dict = False, use_gpu: bool | Any = False,
                 end_keys: Sequence[NestedKey] | None = None, init_key: NestedKey | None = "is_init") -> None:
        super().__init__(num_slices=num_slices, slice_len=slice_len, end_key=end_key, traj_key=traj_key, ends=ends,
                         trajectories=trajectories, cache_values=cache_values, truncated_key=truncated_key,
                         strict_length=strict_length, end_keys=end_keys, init_key=init_key)
        self.drop_last = drop_last
        self.shuffle = shuffle
        self._perm: Tensor | None = None
        self._epoch_key: Any = None
        self.ran_out = False

    def sample(self, storage: Storage, batch_size: int) -> tuple[Tensor, dict]:
        k, L = self._slice_shape(batch_size)
        stop, starts, lengths, n = self._layout(storage)
        starts, lengths = self._eligible(starts, lengths, L)
        key = (n, storage._last_cursor, starts.shape[0])
        m = starts.shape[0]
        if self.drop_last and m < k:
            raise ValueError(f"only {m} episodes can be sliced but num_slices={k} and drop_last=True")
        if (self._perm is None or self._perm.numel() == 0 or key != self._epoch_key
                or (self.drop_last and self._perm.numel() < k)):
            self._perm = torch.randperm(m) if self.shuffle else torch.arange(m)
            self._epoch_key = key
        traj, self._perm = self._perm[:k], self._perm[k:]
        left = self._perm.numel()
        self.ran_out = left == 0 or (self.drop_last and left < k)
        length = lengths[traj]
        span = (length - L + 1).clamp_min(1)
        offset = (torch.rand(traj.shape[0]) * span).long().clamp_(max=span - 1)
        return self._finish(storage, starts[traj] + offset, length - offset, L, n)

    def _empty(self) -> None:
        super()._empty()
        self._perm = None
        self.ran_out = False

    def _reset_epoch(self) -> None:
        self._perm = None
        self.ran_out = False


class PrioritizedSliceSampler(SliceSampler, PrioritizedSampler):
    """Slices whose *start* is drawn with probability proportional to its step priority.

    Priorities live on steps (``update_priority(step_indices, per_step_priorities)``, e.g.
    with the ``"index"`` and TD errors of a sampled batch). A slice start ``s`` is drawn with
    probability ``p_s / sum_{valid starts} p`` among the valid starts (those leaving
    ``slice_len`` steps in their episode; every step when ``strict_length=False``); the
    importance weight of the start, ``(p_s / min_j p_j) ** -beta`` with ``min_j`` over all
    stored steps, is repeated over the slice in ``info["_weight"]``.

    Args: ``max_capacity, alpha, beta, eps, dtype, reduction, max_priority_within_buffer``
    as :class:`PrioritizedSampler`; the rest as :class:`SliceSampler` (``end_keys`` and
    ``init_key`` included; ``span`` is refused: see the error's reason).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.data.replay_buffers import LazyTensorStorage
        >>> st = LazyTensorStorage(16)
        >>> st.set(torch.arange(16), TensorDict({"episode": torch.arange(16) // 8}, [16])); st._last_cursor = 15
        >>> s = PrioritizedSliceSampler(16, alpha=1.0, beta=0.5, slice_len=4, traj_key="episode")
        >>> s.extend(torch.arange(16))
        >>> index, info = s.sample(st, 8)
        >>> index.shape, info["_weight"].shape
        (torch.Size([8]), torch.Size([8]))
    """

    def __init__(self, max_capacity: int, alpha: float, beta: float, eps: float = 1e-8,
                 dtype: torch.dtype = torch.float64, reduction: str = "max", *,
                 num_slices: int | None = None, slice_len: int | None = None, end_key: NestedKey | None = None,
                 traj_key: NestedKey | None = None, ends: Tensor | None = None, trajectories: Tensor | None = None,
                 cache_values: bool = False, truncated_key: NestedKey | None = ("next", "truncated"),
                 strict_length: bool = True, max_priority_within_buffer: bool = False,
                 compile: bool | dict = False, end_keys: Sequence[NestedKey] | None = None,
                 init_key: NestedKey | None = "is_init",
                 span: bool | int | tuple[bool | int, bool | int] = False) -> None:
        if _span_pair(span) != (0, 0):
            raise ValueError(
                f"PrioritizedSliceSampler: span={span!r} is not supported here (priorities are kept per slice "
                "start inside an episode, and an overhanging start has no step to hold its priority); use "
                "SliceSampler(span=...) or span=False"
            )
        SliceSampler.__init__(self, num_slices=num_slices, slice_len=slice_len, end_key=end_key, traj_key=traj_key,
                              ends=ends, trajectories=trajectories, cache_values=cache_values,
                              truncated_key=truncated_key, strict_length=strict_length, end_keys=end_keys,
                              init_key=init_key)
        PrioritizedSampler.__init__(self, max_capacity, alpha, beta, eps, dtype, reduction,
                                    max_priority_within_buffer)

    def extend(self, index: Tensor) -> None:
        SliceSampler.extend(self, index)
        PrioritizedSampler.extend(self, index)

    def _written(self, index: Tensor, span: tuple[int, int] | None) -> None:
        SliceSampler.extend(self, index)
        PrioritizedSampler._written(self, index, span)

    def add(self, index: Any) -> None:
        SliceSampler.add(self, index)
        PrioritizedSampler.add(self, index)

    def mark_update(self, index: Any) -> None:
        SliceSampler.mark_update(self, index)
        PrioritizedSampler.mark_update(self, index)

    def _empty(self) -> None:
        SliceSampler._empty(self)
        PrioritizedSampler._empty(self)

    def sample(self, storage: Storage, batch_size: int) -> tuple[Tensor, dict]:
        k, L = self._slice_shape(batch_size)
        stop, starts, lengths, n = self._layout(storage)
        # steps left in the episode after each position (0 at an episode's last step)
        pos = torch.arange(n)
        j = torch.searchsorted(stop, pos) % stop.shape[0]
        left = (stop[j] - pos) % n
        order = self._order  # ndim=2: positions (env by env) -> storage slots
        if order is not None:  # priorities live on slots: index everything by slot
            left = torch.empty_like(left).index_copy_(0, order, left)
        if self.strict_length:
            bad = (left < L - 1).nonzero().squeeze(1)
            if bad.numel() == n:
                raise RuntimeError(
                    f"no stored episode is at least slice_len={L} steps long; use a shorter slice or strict_length=False"
                )
        else:
            bad = torch.arange(n, n)
        tree = self._tree
        saved = tree.leaves("sum")[bad] if bad.numel() else None
        if saved is not None:
            tree.update(bad, 0.0, kinds=("sum",))
        try:
            start, p, p_min = self._draw(n, k)
        finally:
            if saved is not None:
                tree.update(bad, saved, unique=True, kinds=("sum",))
        begin = start if order is None else torch.empty_like(order).index_copy_(0, order, pos)[start]
        index, info = self._finish(storage, begin, left[start] + 1, L, n)
        w = self._weights(p, p_min)
        if self.strict_length:
            w = w.repeat_interleave(L)
        else:
            w = w.repeat_interleave((left[start] + 1).clamp(max=L))
        info["_weight"] = info["priority_weight"] = w
        return index, info

    def state_dict(self) -> dict[str, Any]:
        return PrioritizedSampler.state_dict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        PrioritizedSampler.load_state_dict(self, state)
        self._cache = None

    def _commit_load(self, prepared: Any) -> None:
        PrioritizedSampler._commit_load(self, prepared)
        self._cache = None

    def __repr__(self) -> str:
        return (f"PrioritizedSliceSampler(max_capacity={self._max_capacity}, alpha={self._alpha}, beta={self._beta}, "
                f"{SliceSampler.__repr__(self).split('(', 1)[1]}")
