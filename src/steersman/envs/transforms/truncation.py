"""``RandomTruncationTransform``: per-sub-env random horizons, so that the sub-envs of a
batched env do not all hit their time limit on the same step."""

from __future__ import annotations

import torch
from torch import Tensor

from steersman.data import Composite
from steersman.tensordict import TensorDictBase
from steersman.tensordict._utils import NestedKey

from ._utils import key_list, missing_spec_key, reset_mask
from .base import Transform

__all__ = ["RandomTruncationTransform"]


class RandomTruncationTransform(Transform):
    """Truncates each sub-env's episodes at its own random horizon (after a ``StepCounter``).

    Args:
        min_horizon: the smallest random horizon (inclusive, >= 1).
        max_horizon: the largest horizon (inclusive); also the horizon of an episode that
            is not randomly truncated (set it to the env's time limit).
        prob: the chance that an episode after the first gets a random horizon from
            ``U{min_horizon, max_horizon}`` instead of ``max_horizon`` (default 0: only the
            initial spread).
        first_episode_prob: the same chance for each sub-env's second episode (default
            ``prob``).

    Keyword Args:
        step_count_key: the step counter written by :class:`StepCounter` (default
            ``"step_count"``).
        truncated_key, done_key: the flags set (OR-ed) when the count reaches the horizon.

    On the first reset every sub-env gets a horizon from ``U{1, max_horizon}`` (its first
    episode is cut short at a random step, spreading the sub-envs over the episode). The
    horizons are drawn with torch's global RNG (or the seed given to ``set_seed``).

    Example:
        >>> import torch
        >>> from steersman.envs import (PendulumEnv, RandomTruncationTransform, StepCounter,
        ...                             TransformedEnv)
        >>> env = TransformedEnv(PendulumEnv(batch_size=[8], seed=0), StepCounter())
        >>> env = env.append_transform(RandomTruncationTransform(5, 10))
        >>> _ = torch.manual_seed(0)
        >>> r = env.rollout(10, break_when_any_done=False)
        >>> first_end = r["next", "truncated"].squeeze(-1).float().argmax(-1) + 1
        >>> bool((first_end <= 10).all()), len(set(first_end.tolist())) > 1
        (True, True)
    """

    def __init__(self, min_horizon: int, max_horizon: int, prob: float = 0.0,
                 first_episode_prob: float | None = None, *, step_count_key: NestedKey = "step_count",
                 truncated_key: NestedKey = "truncated", done_key: NestedKey = "done") -> None:
        if not 1 <= int(min_horizon) <= int(max_horizon):
            raise ValueError(
                f"RandomTruncationTransform: need 1 <= min_horizon <= max_horizon, got {min_horizon}, {max_horizon}"
            )
        for name, p in (("prob", prob), ("first_episode_prob", first_episode_prob)):
            if p is not None and not 0.0 <= float(p) <= 1.0:
                raise ValueError(f"RandomTruncationTransform: {name} must be in [0, 1], got {p}")
        super().__init__()
        self.min_horizon, self.max_horizon = int(min_horizon), int(max_horizon)
        self.prob = float(prob)
        self.first_episode_prob = self.prob if first_episode_prob is None else float(first_episode_prob)
        self.step_count_key = key_list(step_count_key, "RandomTruncationTransform", "step_count_key")[0]
        self.truncated_key = key_list(truncated_key, "RandomTruncationTransform", "truncated_key")[0]
        self.done_key = key_list(done_key, "RandomTruncationTransform", "done_key")[0]
        self._horizon: Tensor | None = None  # [*batch] horizons of the current episodes
        self._episode: Tensor | None = None  # [*batch] episodes started so far
        self._gen: torch.Generator | None = None

    def _set_seed(self, seed: int | None) -> None:
        if seed is not None:
            self._gen = torch.Generator().manual_seed(int(seed) & ((1 << 63) - 1))

    def _draw(self, low: int, high: int, shape: torch.Size) -> Tensor:
        return torch.randint(low, high + 1, shape, generator=self._gen)

    def _new_horizons(self, shape: torch.Size, episode: Tensor) -> Tensor:
        rand = self._draw(self.min_horizon, self.max_horizon, shape)
        u = torch.rand(shape, generator=self._gen)
        p = torch.where(episode == 1, torch.tensor(self.first_episode_prob), torch.tensor(self.prob))
        return torch.where(u < p, rand, torch.full(shape, self.max_horizon))

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        bs = tensordict_reset.batch_size
        if self._horizon is None or self._horizon.shape != bs:
            self._horizon = self._draw(1, self.max_horizon, bs)  # the initial spread
            self._episode = torch.zeros(bs, dtype=torch.long)
            return tensordict_reset
        mask = reset_mask(tensordict, bs)
        if mask is None:
            mask = torch.ones(bs, dtype=torch.bool)
        mask = mask.cpu()
        self._episode = self._episode + mask.long()
        self._horizon = torch.where(mask, self._new_horizons(bs, self._episode), self._horizon)
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        count = next_tensordict.get(self.step_count_key, None)
        if count is None or self._horizon is None:
            return next_tensordict
        hit = count.reshape(self._horizon.shape + (-1,))[..., 0].cpu() >= self._horizon
        for key in (self.truncated_key, self.done_key):
            cur = next_tensordict.get(key, None)
            if cur is not None:
                flag = hit.to(cur.device).reshape(hit.shape + (1,) * (cur.ndim - hit.ndim))
                next_tensordict.set(key, cur | flag)
        return next_tensordict

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        obs = output_spec["full_observation_spec"]
        if obs.get(self.step_count_key, None) is None:
            raise missing_spec_key(self, self.step_count_key,
                                   "observation spec (put a StepCounter before this transform)",
                                   list(obs.keys(True, True)))
        return output_spec

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict  # an env-level transform: data outside an env is left as is

    def __repr__(self) -> str:
        return (f"RandomTruncationTransform(min_horizon={self.min_horizon}, max_horizon={self.max_horizon}, "
                f"prob={self.prob}, first_episode_prob={self.first_episode_prob})")
