"""Sum, min and max segment trees built from batched tensor operations.

A tree over ``size`` leaves is one flat tensor of ``2 * capacity`` nodes, ``capacity`` the
next power of two: node ``1`` is the root, node ``n`` has children ``2n`` and ``2n + 1``,
leaf ``i`` is node ``capacity + i`` (node ``0`` is unused). Every operation works on a
whole batch of indices at once, with a number of tensor operations that does not depend on
the batch size, and touches ``O(k log N)`` nodes for ``k`` indices:

* **update** (``tree[index] = value``): duplicates in ``index`` resolve to the *last*
  value. The ancestors of all updated leaves (every height at once, a ``[k, depth + 1]``
  matrix of node ids) are updated in one scatter: the sum tree adds each leaf's change
  (``index_add_``; exact leaves, and the whole tree is rebuilt from its leaves after
  ``capacity`` leaf updates so float rounding cannot accumulate); the min/max tree computes
  each ancestor's new value as the running min of the siblings hanging off the updated
  paths (``cummin``), skipping siblings that hold another updated leaf, and combines the
  candidates of all leaves with ``scatter_reduce_``.
* **prefix-sum search** (:meth:`SumSegmentTree.scan_lower_bound`): descends for all
  queries at once, several levels per step (the ``2**d`` descendants ``d`` levels below a
  node are contiguous, so one gather + ``cumsum`` + ``searchsorted`` resolves ``d`` levels).

No compiled extension is involved; the trees live on any torch device.

:class:`PriorityTree` is the variant the prioritized samplers use (CPU only): sums over
blocks of 32 leaves (a top level of up to 32 768 nodes searched through its cached
cumulative sum, so 1M leaves need one level) and minima over blocks of 1024 leaves, on
NumPy views of its tensors, whose per-call overhead on the small index arrays of a sampler
(256 draws) is several times lower than that of torch operations. A draw, an update or a
contiguous fill costs about 10-20 array operations whatever the batch size.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["SumSegmentTree", "MinSegmentTree", "MaxSegmentTree", "PriorityTree"]



_TOP_BITS = 10  # the first search step resolves up to 2**10 nodes with one cumsum
_STEP_BITS = 6  # later steps resolve up to 2**6 children per query


class _SegmentTree:
    _neutral: float = 0.0
    _kind = "sum"

    def __init__(self, size: int, dtype: torch.dtype = torch.float64, device: Any = None) -> None:
        size = int(size)
        if size < 1:
            raise ValueError(f"a segment tree needs size >= 1, got {size}")
        depth = max(1, (size - 1).bit_length())
        cap = 1 << depth
        self._size = size
        self._depth = depth
        self._capacity = cap
        self._tree = torch.full((2 * cap,), self._neutral, dtype=dtype, device=device)
        self._heights = torch.arange(depth + 1, device=self._tree.device)
        self._scratch = torch.zeros(2 * cap, dtype=torch.int32, device=self._tree.device)
        self._token = 0
        self._pos_cache: dict[int, Tensor] = {}

    # ------------------------------------------------------------------ basics
    @property
    def size(self) -> int:
        """Number of leaves."""
        return self._size

    @property
    def device(self) -> torch.device:
        return self._tree.device

    @property
    def dtype(self) -> torch.dtype:
        return self._tree.dtype

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self._size}, dtype={self.dtype}, device={self.device})"

    def leaves(self) -> Tensor:
        """A view of the ``size`` leaf values."""
        return self._tree[self._capacity : self._capacity + self._size]

    def total(self) -> Tensor:
        """The reduction over all leaves (a 0-d tensor; the root node)."""
        return self._tree[1]

    def _index(self, index: Any) -> Tensor:
        if isinstance(index, Tensor):
            if index.dtype is not torch.long:
                if index.dtype.is_floating_point or index.dtype is torch.bool:
                    raise TypeError(f"tree indices must be integers, got dtype {index.dtype}")
                index = index.long()
            if index.device != self._tree.device:
                index = index.to(self._tree.device)
            return index.reshape(-1)
        return torch.as_tensor(index, dtype=torch.long, device=self._tree.device).reshape(-1)

    def _check_range(self, index: Tensor) -> None:
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= self._size):
            raise IndexError(
                f"tree index out of range: indices span [{int(index.min())}, {int(index.max())}] "
                f"but the tree has {self._size} leaves"
            )

    def __getitem__(self, index: Any) -> Tensor:
        if isinstance(index, int):
            if not -self._size <= index < self._size:
                raise IndexError(f"index {index} out of range for {self._size} leaves")
            return self._tree[self._capacity + index % self._size]
        idx = self._index(index)
        self._check_range(idx)
        return self._tree.index_select(0, idx + self._capacity)

    def __setitem__(self, index: Any, value: Any) -> None:
        idx = self._index(index)
        self._check_range(idx)
        self.update_(idx, value)

    # ------------------------------------------------------------------ batched update
    def _positions(self, k: int) -> Tensor:
        pos = self._pos_cache.get(k)
        if pos is None:
            pos = torch.arange(k, dtype=torch.int32, device=self._tree.device)
            if len(self._pos_cache) > 16:
                self._pos_cache.clear()
            self._pos_cache[k] = pos
        return pos

    def _next_token(self) -> int:
        self._token -= 1
        if self._token < -(2**31) + 2:
            self._scratch.zero_()
            self._token = -1
        return self._token

    def _plan(self, index: Tensor, value: Any, unique: bool = False) -> tuple:
        """(leaf node ids, ancestor matrix, final value per entry, keep mask) of an update.

        ``index`` is a long tensor of in-range leaf indices. Entries that repeat an index
        all get the value of its last occurrence; ``keep`` marks one entry per distinct
        index (``None`` when there are no duplicates: ``k == 1`` or ``unique=True``, which the
        caller guarantees). ``value`` may be a Python number (the same for every entry).
        """
        k = index.shape[0]
        node = index + self._capacity
        path = node.unsqueeze(1) >> self._heights  # [k, depth + 1]; column h = height h
        if not isinstance(value, Tensor):
            value = torch.full((k,), float(value), dtype=self._tree.dtype, device=self._tree.device)
            if k == 1 or unique:
                return node, path, value, None
            pos = self._positions(k)
            self._scratch.scatter_reduce_(0, node, pos, "amax", include_self=False)
            return node, path, value, self._scratch.index_select(0, node) == pos
        if value.dtype is not self._tree.dtype:
            value = value.to(self._tree.dtype)
        if value.ndim != 1:
            value = value.reshape(-1)
        if value.shape[0] != k:
            if value.shape[0] != 1:
                raise ValueError(f"got {value.shape[0]} values for {k} indices")
            value = value.expand(k)
        if k == 1 or unique:
            return node, path, value, None
        pos = self._positions(k)
        sc = self._scratch
        sc.scatter_reduce_(0, node, pos, "amax", include_self=False)
        winner = sc.index_select(0, node)
        return node, path, value.index_select(0, winner), winner == pos

    def update_(self, index: Tensor, value: Any) -> None:
        """Sets the leaves ``index`` (long tensor, in range) to ``value``; last duplicate wins."""
        if index.numel() == 0:
            return
        self._apply(self._plan(index, value))

    def _apply(self, plan: tuple) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ whole-tree ops
    def rebuild(self) -> None:
        """Recomputes every internal node from the leaves (``O(N)``, level by level)."""
        t = self._tree
        for h in range(1, self._depth + 1):
            lo = 1 << (self._depth - h)
            children = t[2 * lo : 4 * lo].view(-1, 2)
            t[lo : 2 * lo] = self._reduce_pairs(children)

    def _reduce_pairs(self, children: Tensor) -> Tensor:
        raise NotImplementedError

    def clear(self) -> None:
        """Resets every leaf to the neutral value (0 for sums, ``+inf``/``-inf`` for min/max)."""
        self._tree.fill_(self._neutral)

    def query(self, start: int = 0, end: int | None = None) -> Tensor:
        """The reduction over leaves ``[start, end)`` (a 0-d tensor)."""
        end = self._size if end is None else int(end)
        start = int(start)
        if not 0 <= start <= end <= self._size:
            raise IndexError(f"query range [{start}, {end}) is not within [0, {self._size}]")
        if start == 0 and end >= self._capacity:
            return self._tree[1].clone()
        lo, hi = start + self._capacity, end + self._capacity
        nodes = []
        while lo < hi:
            if lo & 1:
                nodes.append(lo)
                lo += 1
            if hi & 1:
                hi -= 1
                nodes.append(hi)
            lo >>= 1
            hi >>= 1
        if not nodes:
            return torch.tensor(self._neutral, dtype=self._tree.dtype, device=self._tree.device)
        vals = self._tree[torch.tensor(nodes, device=self._tree.device)]
        return self._reduce_all(vals)

    def _reduce_all(self, vals: Tensor) -> Tensor:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {"size": self._size, "leaves": self.leaves().clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        leaves = state["leaves"]
        if int(state["size"]) != self._size or leaves.shape != (self._size,):
            raise ValueError(
                f"cannot load a tree of size {state['size']} into a {type(self).__name__} of size {self._size}"
            )
        self._tree[self._capacity :].fill_(self._neutral)
        self.leaves().copy_(leaves)
        self.rebuild()


class SumSegmentTree(_SegmentTree):
    """Sums over a fixed number of leaves, with batched updates and prefix-sum search.

    Args:
        size: number of leaves (all start at 0).
        dtype: float dtype of the nodes (``float64`` keeps rounding far below sampling noise).
        device: where the tree lives.

    Example:
        >>> import torch
        >>> tree = SumSegmentTree(5)
        >>> tree[torch.tensor([0, 1, 3, 3])] = torch.tensor([1.0, 2.0, 9.0, 4.0])  # last 3 wins
        >>> tree.total().item(), tree.query(1, 4).item()
        (7.0, 6.0)
        >>> tree.scan_lower_bound(torch.tensor([0.5, 1.0, 1.5, 6.5])).tolist()
        [0, 0, 1, 3]
    """

    _neutral = 0.0
    _kind = "sum"

    def __init__(self, size: int, dtype: torch.dtype = torch.float64, device: Any = None) -> None:
        super().__init__(size, dtype, device)
        self._updates_since_rebuild = 0
        depth = self._depth
        top = min(depth, _TOP_BITS)
        rest = depth - top
        n_steps = math.ceil(rest / _STEP_BITS) if rest else 0
        steps = [rest // n_steps + (1 if i < rest % n_steps else 0) for i in range(n_steps)] if n_steps else []
        self._search_top = top
        self._search_steps = steps

    def _apply(self, plan: tuple) -> None:
        node, path, value, keep = plan
        t = self._tree
        k = node.shape[0]
        delta = value - t.index_select(0, node)
        if keep is not None:
            delta.mul_(keep)
        t.scatter_add_(0, path.view(-1), delta.unsqueeze(1).expand(k, path.shape[1]).reshape(-1))  # all ancestors
        t.index_copy_(0, node, value)  # leaves exact, whatever the rounding of the adds
        self._updates_since_rebuild += k
        if self._updates_since_rebuild > self._capacity:
            self.rebuild()

    def rebuild(self) -> None:
        super().rebuild()
        self._updates_since_rebuild = 0

    def _reduce_pairs(self, children: Tensor) -> Tensor:
        return children.sum(1)

    def _reduce_all(self, vals: Tensor) -> Tensor:
        return vals.sum()

    def _search(self, mass: Tensor, right: bool) -> Tensor:
        """Leaf reached by each prefix-sum query; ``right``: first leaf whose prefix > mass."""
        t = self._tree
        top = self._search_top
        level = t[1 << top : 2 << top]
        cs = level.cumsum(0)
        pos = torch.searchsorted(cs, mass, right=right).clamp_(max=(1 << top) - 1)
        mass = mass - (cs - level).index_select(0, pos)
        depth = top
        for d in self._search_steps:
            depth += d
            width = 1 << d
            blocks = t[1 << depth : 2 << depth].view(-1, width).index_select(0, pos)
            cs = blocks.cumsum(1)
            child = torch.searchsorted(cs, mass.unsqueeze(1), right=right).clamp_(max=width - 1)
            mass = mass - (cs - blocks).gather(1, child).squeeze(1)
            pos = child.squeeze(1).add_(pos, alpha=width)
        return pos

    def draw(self, u: Tensor, n: int | None = None, *, check: bool = True) -> tuple[Tensor, Tensor]:
        """Leaves drawn with probability proportional to their value, and those values.

        ``u`` holds uniform numbers in ``[0, 1)`` (one per draw; overwritten); ``n`` limits
        the draws to leaves ``[0, n)`` (all other leaves must be 0). With ``check``, a draw
        that float rounding pushes onto a zero leaf at a boundary (vanishingly rare) is redone
        with an exact prefix-sum over the leaves, so a zero-valued leaf is never returned; a
        caller that knows every leaf in ``[0, n)`` is positive passes ``check=False``.
        """
        n = self._size if n is None else n
        total = self._tree[1].item()
        index = self._search(u.mul(total), right=True).clamp_(max=n - 1)
        value = self._tree.index_select(0, index + self._capacity)
        if check:
            bad = value <= 0
            if bool(bad.any()):
                cs = self.leaves()[:n].cumsum(0)
                fix = torch.searchsorted(cs, u[bad] * cs[-1], right=True).clamp_(max=n - 1)
                index[bad] = fix
                value[bad] = self._tree.index_select(0, fix + self._capacity)
        return index, value

    def scan_lower_bound(self, value: Any) -> Tensor:
        """For each ``value``, the first leaf ``i`` with ``sum(leaves[:i + 1]) >= value``.

        Values above the total give ``size`` (like TorchRL's ``scan_lower_bound``).
        """
        v = torch.as_tensor(value, dtype=self._tree.dtype, device=self._tree.device)
        shape = v.shape
        v = v.reshape(-1)
        out = self._search(v, right=False).clamp_(max=self._size - 1)
        out = torch.where(v > self._tree[1], self._size, out)
        return out.reshape(shape)


class MinSegmentTree(_SegmentTree):
    """Minimum over a fixed number of leaves (unset leaves are ``+inf``), batched updates.

    Example:
        >>> import torch
        >>> tree = MinSegmentTree(6)
        >>> tree[torch.arange(6)] = torch.tensor([5.0, 3.0, 8.0, 1.0, 7.0, 2.0])
        >>> tree.total().item(), tree.query(0, 3).item()
        (1.0, 3.0)
        >>> tree[torch.tensor([3])] = 10.0
        >>> tree.total().item()
        2.0
    """

    _neutral = math.inf
    _kind = "min"

    def _apply(self, plan: tuple) -> None:
        node, path, value, _ = plan
        t = self._tree
        sc = self._scratch
        k, width = path.shape
        token = self._next_token()
        # mark every node on an updated path: a sibling that is marked holds an updated leaf
        sc.index_fill_(0, path.view(-1), token)
        sib = (path[:, :-1] ^ 1).reshape(-1)
        sib_val = t.index_select(0, sib).masked_fill_(sc.index_select(0, sib) == token, self._neutral)
        running = self._cum(sib_val.view(k, width - 1))
        cand = self._combine(running, value.unsqueeze(1))
        t.index_copy_(0, node, value)
        t.scatter_reduce_(0, path[:, 1:].reshape(-1), cand.reshape(-1), self._scatter, include_self=False)

    _scatter = "amin"

    @staticmethod
    def _cum(x: Tensor) -> Tensor:
        return x.cummin(1).values

    @staticmethod
    def _combine(a: Tensor, b: Tensor) -> Tensor:
        return torch.minimum(a, b)

    def _reduce_pairs(self, children: Tensor) -> Tensor:
        return children.amin(1)

    def _reduce_all(self, vals: Tensor) -> Tensor:
        return vals.amin()


class MaxSegmentTree(MinSegmentTree):
    """Maximum over a fixed number of leaves (unset leaves are ``-inf``), batched updates.

    Example:
        >>> import torch
        >>> tree = MaxSegmentTree(4)
        >>> tree[torch.tensor([0, 2])] = torch.tensor([1.0, 4.0])
        >>> tree.total().item()
        4.0
    """

    _neutral = -math.inf
    _kind = "max"
    _scatter = "amax"

    @staticmethod
    def _cum(x: Tensor) -> Tensor:
        return x.cummax(1).values

    @staticmethod
    def _combine(a: Tensor, b: Tensor) -> Tensor:
        return torch.maximum(a, b)

    def _reduce_pairs(self, children: Tensor) -> Tensor:
        return children.amax(1)

    def _reduce_all(self, vals: Tensor) -> Tensor:
        return vals.amax()


_B_BITS = 5  # PriorityTree: 32 children per sum node
_B = 1 << _B_BITS
_TOP = 1 << 15  # the top sum level (searched through its cumulative sum) has at most this many nodes
_M_BITS = 10  # PriorityTree: one min/max per block of 1024 leaves
_COUNTER = np.arange(1 << 12)


class PriorityTree:
    """Sum, min and (optionally) max over ``size`` leaves, for drawing proportionally to value.

    * **sum**: the leaves, then block sums of 32 nodes per level up to a top level of at
      most 32 768 nodes (for 1M leaves: 1M leaves and 31 250 block sums). A draw finds its
      top node through the cumulative sum of the top level (computed once per change of the
      tree, cached between draws), then descends one ``[k, 32]`` block per level.
    * **min** / **max**: the leaves (unset leaves ``+inf`` / ``-inf``) and one extremum per
      block of 1024 leaves; :meth:`min` reduces the block extrema.

    Everything lives in float64 NumPy views of one tensor per reduction (``_tensors``), whose
    per-call cost on the small arrays of a sampler (256 indices) is several times lower than
    that of torch operations. A batch of ``k`` indices costs a fixed number of array
    operations, whatever ``k``:

    * :meth:`update` sets leaves (the last of duplicate indices wins), adds each leaf's
      change to its ancestor sums (``np.add.at``; the sums are rebuilt exactly from the
      leaves after ``size`` leaf updates, so rounding cannot accumulate) and lowers the
      block extrema with ``np.minimum.at``; only a block whose extremum leaf got worse is
      recomputed from its 1024 leaves.
    * :meth:`draw` returns, for uniforms ``u``, the leaf ``i`` with
      ``cumsum[i - 1] <= u * total < cumsum[i]`` (``cumsum`` over the leaves).

    Example:
        >>> import torch
        >>> t = PriorityTree(100)
        >>> t.update(torch.tensor([3, 50, 3]), torch.tensor([1.0, 3.0, 2.0]))  # last 3 wins
        >>> t.total(), t.min(), t.leaves()[3].item()
        (5.0, 2.0, 2.0)
        >>> idx, val = t.draw(torch.tensor([0.1, 0.9]))
        >>> idx.tolist(), val.tolist()
        ([3, 50], [2.0, 3.0])
    """

    def __init__(self, size: int, *, track_max: bool = False) -> None:
        size = int(size)
        if size < 1:
            raise ValueError(f"a priority tree needs size >= 1, got {size}")
        self._size = size
        sizes = []
        n = size
        while n > _TOP:
            n = -(-n // _B) * _B  # pad to whole blocks
            sizes.append(n)
            n //= _B
        sizes.append(n)
        self._level_sizes = sizes
        n_blocks = -(-size // (1 << _M_BITS))
        ext_sizes = [n_blocks << _M_BITS, n_blocks]
        self._kinds = ("sum", "min", "max") if track_max else ("sum", "min")
        self._neutral = {"sum": 0.0, "min": math.inf, "max": -math.inf}
        self._tensors: dict[str, Tensor] = {}
        self._levels: dict[str, list[np.ndarray]] = {}
        for kind in self._kinds:
            lv = sizes if kind == "sum" else ext_sizes
            flat = torch.full((sum(lv),), self._neutral[kind], dtype=torch.float64)
            offsets = np.cumsum([0] + lv)
            self._tensors[kind] = flat
            self._levels[kind] = [flat.numpy()[offsets[i] : offsets[i + 1]] for i in range(len(lv))]
        self._cum = np.zeros(sizes[-1] + 1)  # [0, cumsum of the top sum level]
        self._tcum = torch.from_numpy(self._cum)
        self._ttop = torch.from_numpy(self._levels["sum"][-1])
        self._cum_ok = False
        self._owner = np.zeros(size, dtype=np.int64)
        self._sum_updates = 0

    @property
    def size(self) -> int:
        return self._size

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"PriorityTree(size={self._size}, levels={self._level_sizes})"

    # ------------------------------------------------------------------ reads
    def leaves(self, kind: str = "sum") -> Tensor:
        """The leaf values (a tensor view; unset leaves hold the neutral value)."""
        return self._tensors[kind][: self._size]

    def _cumsum(self) -> np.ndarray:
        """``[0, cumsum(top sum level)]``, recomputed after a change."""
        if not self._cum_ok:
            torch.cumsum(self._ttop, 0, out=self._tcum[1:])
            self._cum_ok = True
        return self._cum

    def total(self) -> float:
        """Sum of all leaves."""
        return float(self._cumsum()[-1])

    def min(self) -> float:
        """Smallest leaf (``inf`` when none is set)."""
        return float(self._levels["min"][1].min())

    def max(self) -> float:
        """Largest leaf (``-inf`` when none is set); needs ``track_max=True``."""
        return float(self._levels["max"][1].max())

    def draw(self, u: Any, n: int | None = None, *, check: bool = True) -> tuple[Tensor, Tensor]:
        """For uniforms ``u`` in ``[0, 1)``: leaves drawn proportionally to their sum value.

        Returns ``(index, value)`` tensors (long, float64). ``n`` bounds the result to leaves
        ``[0, n)`` (leaves beyond must be 0). With ``check``, a draw that float rounding puts
        on a zero leaf (at a boundary; vanishingly rare) is redone by an exact prefix-sum
        search over the leaves; a caller that knows every leaf in ``[0, n)`` is positive
        passes ``check=False``.
        """
        n = self._size if n is None else n
        u = u.numpy() if isinstance(u, Tensor) else np.asarray(u, dtype=np.float64)
        cum = self._cumsum()
        mass = u * cum[-1]
        # the top node: the first whose inclusive cumulative sum exceeds the mass
        pos = np.searchsorted(cum[1:], mass, side="right")
        np.minimum(pos, cum.shape[0] - 2, out=pos)
        mass -= cum.take(pos)
        levels = self._levels["sum"]
        k = u.shape[0]
        rows = _COUNTER[:k] * _B if k <= _COUNTER.shape[0] else np.arange(k) * _B
        for lvl in range(len(levels) - 2, -1, -1):
            blocks = levels[lvl].reshape(-1, _B).take(pos, 0)  # take: ~3x faster than [pos]
            cs = torch.from_numpy(blocks).cumsum(1).numpy()
            child = (cs <= mass[:, None]).sum(1)  # the first child whose running sum exceeds it
            np.minimum(child, _B - 1, out=child)  # a query past the block's total (rounding)
            if lvl:
                at = rows + child
                mass -= cs.ravel().take(at) - blocks.ravel().take(at)
            pos *= _B
            pos += child
        np.minimum(pos, n - 1, out=pos)
        leaves = levels[0]
        value = leaves.take(pos)
        if check:
            bad = value <= 0
            if bad.any():
                cs = np.cumsum(leaves[:n])
                fix = np.minimum(np.searchsorted(cs, u[bad] * cs[-1], side="right"), n - 1)
                pos[bad] = fix
                value[bad] = leaves[fix]
        return torch.from_numpy(pos), torch.from_numpy(value)

    # ------------------------------------------------------------------ writes
    def _dedupe(self, idx: np.ndarray, val: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(value per entry, keep mask): every duplicate index gets its last value
        (``ufunc.at`` applies in order) and exactly one entry per index is kept."""
        k = idx.shape[0]
        pos = _COUNTER[:k] if k <= _COUNTER.shape[0] else np.arange(k)
        owner = self._owner
        owner[idx] = -1
        np.maximum.at(owner, idx, pos)
        winner = owner.take(idx)
        return val.take(winner), winner == pos

    def update(self, index: Any, value: Any, *, unique: bool = False, kinds: tuple | None = None) -> None:
        """Sets leaves ``index`` to ``value`` (one value per index, or a scalar) in every
        reduction (or only in ``kinds``); the last of duplicate indices wins
        (``unique=True``: the caller guarantees there are none). Indices must be in range."""
        kinds = self._kinds if kinds is None else kinds
        idx = index.numpy() if isinstance(index, Tensor) else np.asarray(index, dtype=np.int64)
        k = idx.shape[0]
        if k == 0:
            return
        if isinstance(value, Tensor):
            val = value.numpy()
        elif isinstance(value, np.ndarray):
            val = value
        else:
            val = np.full(k, float(value))
        if val.dtype != np.float64:
            val = val.astype(np.float64)
        keep = None
        if not unique and k > 1:
            val, keep = self._dedupe(idx, val)
        lv = self._levels
        old = None
        if "sum" in kinds:
            sums = lv["sum"]
            leaves = sums[0]
            old = leaves.take(idx)
            delta = val - old
            if keep is not None:
                delta *= keep
            leaves[idx] = val
            p = idx
            for level in sums[1:]:
                p = p >> _B_BITS
                np.add.at(level, p, delta)
            self._cum_ok = False
            self._sum_updates += k
            if self._sum_updates > self._size:
                self._rebuild("sum")
        block = None
        for kind in kinds:
            if kind == "sum":
                continue
            leaves, ext = lv[kind]
            if block is None:
                block = idx >> _M_BITS
            if old is None:
                old = leaves.take(idx)
            # (with the sum updated too, ``old`` holds the sum leaves: the same values, except
            # 0 instead of +-inf for unset leaves, which only makes the staleness test cautious)
            leaves[idx] = val
            before = ext.take(block)
            if kind == "min":
                np.minimum.at(ext, block, val)
                stale = (old == before) & (val > old)  # the block's minimum may have gone up
            else:
                np.maximum.at(ext, block, val)
                stale = (old == before) & (val < old)
            if stale.any():
                self._refresh(kind, block[stale])

    def _refresh(self, kind: str, blocks: np.ndarray) -> None:
        leaves, ext = self._levels[kind]
        ext[blocks] = _REDUCE[kind](leaves.reshape(-1, 1 << _M_BITS)[blocks], axis=1)

    def fill_range(self, start: int, stop: int, value: float) -> None:
        """Sets leaves ``[start, stop)`` to ``value`` (the writer's contiguous case)."""
        if stop <= start:
            return
        lv = self._levels
        if "sum" in self._kinds:
            sums = lv["sum"]
            sums[0][start:stop] = value
            lo, hi = start, stop
            for i in range(1, len(sums)):
                lo, hi = lo >> _B_BITS, ((hi - 1) >> _B_BITS) + 1
                np.sum(sums[i - 1][lo * _B : hi * _B].reshape(-1, _B), axis=1, out=sums[i][lo:hi])
            self._cum_ok = False
        lo, hi = start >> _M_BITS, ((stop - 1) >> _M_BITS) + 1
        for kind in self._kinds:
            if kind != "sum":
                leaves, ext = lv[kind]
                leaves[start:stop] = value
                self._refresh(kind, np.arange(lo, hi))

    def clear(self) -> None:
        for kind, t in self._tensors.items():
            t.fill_(self._neutral[kind])
        self._cum_ok = False
        self._sum_updates = 0

    def load(self, sum_leaves: Tensor, min_leaves: Tensor) -> None:
        """Replaces every leaf (``sum``/``min`` values; the max follows the sum where the
        min is set) and rebuilds the levels."""
        self.clear()
        self.leaves("sum").copy_(sum_leaves)
        self.leaves("min").copy_(min_leaves)
        if "max" in self._tensors:
            self.leaves("max").copy_(torch.where(min_leaves == math.inf, -math.inf, sum_leaves))
        self.rebuild()

    def rebuild(self) -> None:
        """Recomputes every level from the leaves."""
        for kind in self._kinds:
            self._rebuild(kind)

    def _rebuild(self, kind: str) -> None:
        levels = self._levels[kind]
        if kind == "sum":
            for lvl in range(1, len(levels)):
                below = levels[lvl - 1]
                np.sum(below.reshape(-1, _B), axis=1, out=levels[lvl][: below.shape[0] // _B])
            self._sum_updates = 0
            self._cum_ok = False
        else:
            leaves, ext = levels
            _REDUCE[kind](leaves.reshape(-1, 1 << _M_BITS), axis=1, out=ext)


_REDUCE = {"sum": np.sum, "min": np.min, "max": np.max}
