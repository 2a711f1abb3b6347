"""Hindsight Experience Replay: relabel the goals of sampled transitions with achieved ones.

:class:`HERReplayBuffer` is a :class:`TensorDictReplayBuffer` whose ``sample`` replaces, in
a fraction ``her_ratio`` of each batch, the desired goal of a transition with a goal that
was achieved later in (or at the end of, or anywhere in) the same episode, and recomputes
the reward with the user's ``reward_fn``. Episodes are read from the stored done flags.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from steersman.tensordict import NestedKey, TensorDictBase, unravel_key

from .replay_buffers import TensorDictReplayBuffer
from .samplers import Sampler
from .storages import TensorStorage

__all__ = ["HERReplayBuffer", "HindsightStrategy"]


class HindsightStrategy(str, enum.Enum):
    """Where :class:`HERReplayBuffer` takes the substitute goal of a transition ``t`` from.

    * ``FUTURE``: a step ``t' >= t`` of the same episode, uniformly (HER's best strategy);
    * ``FINAL``: the episode's last step;
    * ``EPISODE``: any step of the same episode, uniformly;
    * ``RANDOM``: any stored step, uniformly.

    Example:
        >>> HindsightStrategy("final") is HindsightStrategy.FINAL
        True
    """

    FUTURE = "future"
    FINAL = "final"
    EPISODE = "episode"
    RANDOM = "random"


def _last_is(key: tuple, name: str) -> tuple:
    return key[:-1] + (name,)


class HERReplayBuffer(TensorDictReplayBuffer):
    """A TensorDict replay buffer that relabels goals in hindsight when sampling.

    In each sampled batch, ``round(her_ratio * batch_size)`` transitions (chosen at random)
    get a new desired goal: the goal *achieved* by a step picked by ``strategy`` (read from
    ``("next", achieved_goal_key)`` when stored, else from ``achieved_goal_key``). The new
    goal is written to ``goal_key`` (and to ``("next", goal_key)`` when stored) and
    ``reward_key`` is recomputed as ``reward_fn(relabelled)``, where ``relabelled`` holds
    only the relabelled transitions. The other transitions come back unchanged; stored
    data is never modified.

    Episodes end where ``end_key`` (or its ``terminated`` sibling) is set; the newest write
    and the end of the filled part also end an episode (an unfinished one, or the wrap-around
    point of a full circular storage: goals never come from across the wrap).

    Args:
        reward_fn: maps a TensorDict of relabelled transitions ``[N]`` to their rewards,
            shape ``[N]`` or ``[N, 1]`` (reshaped to the stored reward's shape).
        her_ratio: fraction of each batch relabelled, in ``[0, 1]`` (default 0.8).
        strategy: a :class:`HindsightStrategy` or its name (default ``"future"``).
        goal_key, achieved_goal_key: default ``"desired_goal"``, ``"achieved_goal"``.
        reward_key: default ``("next", "reward")``.
        end_key: default ``("next", "done")``.
        sampler: draws the transitions (default :class:`RandomSampler`).
        **kwargs: as :class:`TensorDictReplayBuffer`; the storage must be a one-dimensional
            tensor storage (``LazyTensorStorage``, ``LazyMemmapStorage``, ``TensorStorage``).

    Shapes: ``sample(B)`` returns ``[B]`` transitions, like the parent class.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.data.replay_buffers import LazyTensorStorage
        >>> def reward_fn(td):
        ...     return ((td["achieved_goal"] - td["desired_goal"]).norm(dim=-1) < 0.05).float()
        >>> rb = HERReplayBuffer(reward_fn, her_ratio=1.0, strategy="final", storage=LazyTensorStorage(100))
        >>> steps = torch.arange(4.0).unsqueeze(-1).expand(4, 3)
        >>> _ = rb.extend(TensorDict({
        ...     "desired_goal": torch.full((4, 3), 9.0), "achieved_goal": steps,
        ...     "next": {"achieved_goal": steps + 1, "reward": torch.zeros(4, 1),
        ...              "done": torch.tensor([[False], [False], [False], [True]])}}, [4]))
        >>> batch = rb.sample(6)
        >>> batch["desired_goal"][:, 0].tolist()  # the episode's final achieved goal
        [4.0, 4.0, 4.0, 4.0, 4.0, 4.0]
        >>> batch["next", "reward"].shape
        torch.Size([6, 1])
    """

    def __init__(self, reward_fn: Callable[[TensorDictBase], Tensor], *, her_ratio: float = 0.8,
                 strategy: HindsightStrategy | str = "future", goal_key: NestedKey = "desired_goal",
                 achieved_goal_key: NestedKey = "achieved_goal", reward_key: NestedKey = ("next", "reward"),
                 end_key: NestedKey = ("next", "done"), sampler: Sampler | None = None, **kwargs: Any) -> None:
        if not callable(reward_fn):
            raise TypeError(f"reward_fn must be callable, got {type(reward_fn).__name__}")
        if isinstance(her_ratio, bool) or not isinstance(her_ratio, (int, float)) or not 0 <= her_ratio <= 1:
            raise ValueError(f"her_ratio must be a number in [0, 1], got {her_ratio!r}")
        try:
            strategy = HindsightStrategy(strategy)
        except ValueError:
            raise ValueError(f"strategy must be one of {[s.value for s in HindsightStrategy]}, "
                             f"got {strategy!r}") from None
        super().__init__(sampler=sampler, **kwargs)
        st = self._storage
        if not isinstance(st, TensorStorage) or st.ndim != 1:
            raise TypeError(f"HERReplayBuffer needs a one-dimensional tensor storage (LazyTensorStorage, "
                            f"LazyMemmapStorage, TensorStorage), got {st!r}")
        self.reward_fn = reward_fn
        self.her_ratio = float(her_ratio)
        self.strategy = strategy
        self.goal_key = unravel_key(goal_key)
        self.achieved_goal_key = unravel_key(achieved_goal_key)
        self.reward_key = unravel_key(reward_key)
        self.end_key = unravel_key(end_key)

    # ------------------------------------------------------------------ episodes
    def _column(self, key: NestedKey, n: int) -> Tensor | None:
        data = self._storage._storage
        if not isinstance(data, TensorDictBase) or key not in data.keys(include_nested=True):
            return None
        return data.get(key)[:n]

    def _episode_bounds(self, index: Tensor) -> tuple[Tensor, Tensor]:
        """First and last storage slot of the episode each sampled ``index`` belongs to."""
        n = len(self._storage)
        end_key = self.end_key if isinstance(self.end_key, tuple) else (self.end_key,)
        flags = [f for f in (self._column(end_key, n), self._column(_last_is(end_key, "terminated"), n))
                 if f is not None]
        if not flags:
            raise KeyError(f"HERReplayBuffer: neither {self.end_key!r} nor its 'terminated' sibling is stored; "
                           "episode ends cannot be found")
        end = torch.zeros(n, dtype=torch.bool, device=flags[0].device)
        for f in flags:
            end |= f.reshape(n, -1).any(-1).to(end.device)
        end[n - 1] = True
        last = self._storage._last_cursor
        if last is not None and last < n:
            end[last] = True  # the newest write: the wrap point of a full circular storage
        ends = end.nonzero().squeeze(-1).cpu()
        idx = index.cpu()
        pos = torch.searchsorted(ends, idx)  # first end >= idx
        stop = ends[pos]
        start = torch.where(pos > 0, ends[(pos - 1).clamp_min(0)] + 1, torch.zeros_like(pos))
        return start, stop

    def _goal_steps(self, index: Tensor) -> Tensor:
        """The storage slot whose achieved goal replaces the goal of each ``index``."""
        n = len(self._storage)
        if self.strategy is HindsightStrategy.RANDOM:
            return torch.randint(n, index.shape)
        start, stop = self._episode_bounds(index)
        if self.strategy is HindsightStrategy.FINAL:
            return stop
        low = index.cpu() if self.strategy is HindsightStrategy.FUTURE else start
        return low + (torch.rand(index.shape) * (stop - low + 1)).long().clamp_max(stop - low)

    # ------------------------------------------------------------------ sampling
    def _sample(self, batch_size: int) -> tuple[Any, dict]:
        with self._lock:  # reentrant: the parent takes it again to read the batch
            data, info = super()._sample(batch_size)
            k = round(self.her_ratio * batch_size)
            if k == 0 or not isinstance(data, TensorDictBase):
                return data, info
            index = info["index"].reshape(-1)
            rows = torch.randperm(batch_size)[:k].sort().values
            steps = self._goal_steps(index[rows])
            n = len(self._storage)
            ag_next = self._column(("next", *_tuple(self.achieved_goal_key)), n)
            ag = ag_next if ag_next is not None else self._column(self.achieved_goal_key, n)
            if ag is None:
                raise KeyError(f"HERReplayBuffer: the achieved goal {self.achieved_goal_key!r} is not stored")
            goals = ag[steps.to(ag.device)].to(data.device or ag.device)
        sub = data[rows.to(data.device or "cpu")].clone()
        sub.set(self.goal_key, goals.to(sub.get(self.goal_key).dtype))
        next_goal = ("next", *_tuple(self.goal_key))
        if next_goal in sub.keys(include_nested=True):
            sub.set(next_goal, goals.to(sub.get(next_goal).dtype))
        reward = torch.as_tensor(self.reward_fn(sub))
        old = sub.get(self.reward_key) if self.reward_key in sub.keys(include_nested=True) else None
        if old is not None:
            if reward.numel() != old.numel():
                raise ValueError(f"reward_fn returned {reward.numel()} values for {k} relabelled transitions "
                                 f"(stored reward shape {list(old.shape[1:])} each)")
            reward = reward.reshape(old.shape).to(old.dtype)
        sub.set(self.reward_key, reward)
        data[rows.to(data.device or "cpu")] = sub
        return data, info

    def __repr__(self) -> str:
        return (f"HERReplayBuffer(strategy={self.strategy.value!r}, her_ratio={self.her_ratio}, "
                f"goal_key={self.goal_key!r}, storage={self._storage!r})")


def _tuple(key: NestedKey) -> tuple:
    return key if isinstance(key, tuple) else (key,)
