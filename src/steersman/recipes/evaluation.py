"""Episode returns: deterministic evaluation, and the returns of finished training episodes.

* :func:`evaluate` runs one episode in every sub-env of a batched env with the policy's
  deterministic action (the mode/mean of its distribution) and returns their returns.
* :class:`EpisodeReturns` reads the returns of the episodes that ended inside collected
  batches ``[num_envs, T]``, carrying unfinished ones across batches: a few vectorized
  ops per batch, nothing per step.

Example:
    >>> import torch
    >>> from steersman.tensordict import TensorDict
    >>> tracker = EpisodeReturns()
    >>> reward = torch.ones(2, 4, 1)
    >>> done = torch.tensor([[0, 1, 0, 0], [0, 0, 0, 1]], dtype=torch.bool).unsqueeze(-1)
    >>> batch = TensorDict({"next": {"reward": reward, "done": done}}, [2, 4])
    >>> tracker.update(batch)           # env 0 ended after 2 steps, env 1 after 4
    tensor([2., 4.])
    >>> tracker.update(batch)           # env 0 carried 2 steps over from the first batch
    tensor([4., 4.])
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from steersman.envs import EnvBase
from steersman.tensordict import TensorDictBase
from steersman.tensordict.nn import ExplorationType, set_exploration_type

__all__ = ["EpisodeReturns", "evaluate", "first_episode_returns"]


def first_episode_returns(rollout: TensorDictBase) -> Tensor:
    """The return of the first episode of each sub-env of a rollout ``[num_envs, T]``.

    Rewards after a sub-env's first ``done`` are ignored. Returns a tensor ``[num_envs]``.
    """
    reward = rollout.get(("next", "reward"))[..., 0]
    done = rollout.get(("next", "done"))[..., 0]
    ended_before = done.cumsum(-1) - done.to(torch.long)  # dones strictly before each step
    return (reward * (ended_before == 0)).sum(-1)


@torch.no_grad()
def evaluate(env: EnvBase, policy: Callable[[TensorDictBase], TensorDictBase],
             max_steps: int | None = None, seed: int | None = None) -> Tensor:
    """One deterministic episode per sub-env of ``env`` (batch ``[n]``); returns ``[n]`` returns.

    ``max_steps`` caps the episode (default: the env's ``max_episode_steps``, else 10,000).
    ``seed``: reseed the env first, so that the same policy always gets the same return.
    The policy runs under ``set_exploration_type(ExplorationType.DETERMINISTIC)``.

    Example:
        >>> from steersman.envs import CartPoleEnv
        >>> env = CartPoleEnv(batch_size=[3], seed=0)
        >>> push_right = lambda td: td.set("action", torch.ones(3, dtype=torch.long))
        >>> evaluate(env, push_right)       # the pole falls within a few steps
        tensor([ 9., 11.,  9.])
    """
    if max_steps is None:
        max_steps = getattr(env, "max_episode_steps", None) or 10_000
    if seed is not None:
        env.set_seed(seed)
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        ro = env.rollout(max_steps, policy, break_when_any_done=False, break_when_all_done=True)
    return first_episode_returns(ro)


class EpisodeReturns:
    """Returns of the training episodes that end inside collected batches.

    Call :meth:`update` with each batch ``[num_envs, T]`` (``("next", "reward")`` and
    ``("next", "done")`` of shape ``[num_envs, T, 1]``); it returns the returns of the
    episodes that ended in it (in time order per sub-env) and carries the partial returns
    of the others to the next batch. :attr:`last_mean` is the mean of the latest
    finished episodes (NaN before any ended).
    """

    def __init__(self) -> None:
        self.carry: Tensor | None = None
        self.last_mean = math.nan

    def update(self, batch: TensorDictBase) -> Tensor:
        reward = batch.get(("next", "reward"))[..., 0]
        done = batch.get(("next", "done"))[..., 0]
        steps = reward.shape[-1]
        if self.carry is None:
            self.carry = torch.zeros(reward.shape[:-1], dtype=reward.dtype, device=reward.device)
        running = reward.cumsum(-1) + self.carry.unsqueeze(-1)
        # index of the last done strictly before each step (-1: none in this batch)
        t = torch.arange(steps, device=reward.device).expand_as(done)
        last_done = torch.where(done, t, -1).cummax(-1).values
        prev_done = torch.cat([torch.full_like(last_done[..., :1], -1), last_done[..., :-1]], -1)
        base = torch.where(prev_done >= 0, running.gather(-1, prev_done.clamp(min=0)), 0.0)
        finished = (running - base)[done]
        end = last_done[..., -1:]
        tail_base = torch.where(end >= 0, running.gather(-1, end.clamp(min=0)), 0.0)
        self.carry = (running[..., -1:] - tail_base)[..., 0]
        if finished.numel():
            self.last_mean = float(finished.mean())
        return finished

    def state_dict(self) -> dict:
        return {"carry": self.carry, "last_mean": self.last_mean}

    def load_state_dict(self, state: dict) -> None:
        self.carry, self.last_mean = state["carry"], float(state["last_mean"])
