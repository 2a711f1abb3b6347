"""Per-episode counters: StepCounter (with time-limit truncation) and InitTracker."""

from __future__ import annotations

from typing import Any

import torch

from steersman.data import Bounded, Categorical, Composite
from steersman.tensordict import TensorDictBase
from steersman.tensordict._utils import NestedKey

from ._utils import as_trajectory, episode_starts, key_list, start_index
from .base import Transform

__all__ = ["StepCounter", "InitTracker"]

_I64_MAX = torch.iinfo(torch.int64).max


def _sibling(key: NestedKey, name: str) -> NestedKey:
    return name if type(key) is str else (*key[:-1], name)


def _device(td: TensorDictBase, key: NestedKey) -> torch.device | None:
    """The TensorDict's device, or that of its entry ``key`` (TensorDicts may have none)."""
    dev = td.device
    if dev is None:
        v = td.get(key, None)
        dev = None if v is None else v.device
    return dev


def _next(key: NestedKey) -> tuple:
    return ("next", *((key,) if type(key) is str else key))


class StepCounter(Transform):
    """Counts the steps of each sub-env's episode; with ``max_steps``, truncates episodes.

    Args:
        max_steps: if given, a step whose count reaches ``max_steps`` sets
            ``truncated`` (and ``done``, if ``update_done``) to True.
        truncated_key: the truncation flag (added to the done spec if missing).
        step_count_key: the counter entry (an observation, ``int64 [*batch, 1]``).
        update_done: also set ``done`` (``done = terminated | truncated``).

    Reset sets the counter of the reset sub-envs to 0 (others keep counting on a partial
    reset); each step writes ``("next", step_count) = step_count + 1``. The counter lives
    in the data: it is an observation and a state entry (an input of the step, which
    batched envs pass to their workers). ``forward`` computes the counters (and
    truncation) of a trajectory TensorDict.

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv, check_env_specs
        >>> from steersman.envs.transforms import StepCounter, TransformedEnv
        >>> env = TransformedEnv(CartPoleEnv(batch_size=[2], seed=0), StepCounter(max_steps=3))
        >>> check_env_specs(env)
        >>> td = env.rollout(3)
        >>> td["next", "step_count"][0].squeeze(-1), td["next", "truncated"][0].squeeze(-1)
        (tensor([1, 2, 3]), tensor([False, False,  True]))
    """

    _check_spec_in_keys = False

    def __init__(self, max_steps: int | None = None, truncated_key: NestedKey = "truncated",
                 step_count_key: NestedKey = "step_count", update_done: bool = True) -> None:
        if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 1):
            raise ValueError(f"StepCounter: max_steps must be a positive int or None, got {max_steps!r}")
        super().__init__()
        self.max_steps = max_steps
        self.truncated_key = key_list(truncated_key, "StepCounter", "truncated_key")[0]
        self.step_count_key = key_list(step_count_key, "StepCounter", "step_count_key")[0]
        self.done_key = _sibling(self.truncated_key, "done")
        self.update_done = update_done

    @property
    def out_keys(self) -> list[NestedKey]:  # type: ignore[override]
        return [self.step_count_key, self.truncated_key]

    @out_keys.setter
    def out_keys(self, keys: Any) -> None:
        pass

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        bs = tensordict_reset.batch_size
        dev = _device(tensordict_reset, self.done_key)
        tensordict_reset.set(self.step_count_key, torch.zeros((*bs, 1), dtype=torch.int64, device=dev))
        if tensordict_reset.get(self.truncated_key, None) is None:
            tensordict_reset.set(self.truncated_key, torch.zeros((*bs, 1), dtype=torch.bool, device=dev))
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        count = tensordict.get(self.step_count_key, None)
        if count is None:
            bs = next_tensordict.batch_size
            count = torch.zeros((*bs, 1), dtype=torch.int64, device=_device(next_tensordict, self.done_key))
        count = count + 1
        next_tensordict.set(self.step_count_key, count)
        if self.max_steps is not None:
            self._truncate(next_tensordict, count >= self.max_steps)
        elif self.__dict__.get("_add_trunc", False) and next_tensordict.get(self.truncated_key, None) is None:
            next_tensordict.set(self.truncated_key, torch.zeros_like(count, dtype=torch.bool))
        return next_tensordict

    def _truncate(self, td: TensorDictBase, trunc: torch.Tensor, prefix: tuple = ()) -> None:
        tkey, dkey = self.truncated_key, self.done_key
        if prefix:
            tkey = prefix + ((tkey,) if type(tkey) is str else tkey)
            dkey = prefix + ((dkey,) if type(dkey) is str else dkey)
        old = td.get(tkey, None)
        td.set(tkey, trunc if old is None else old | trunc)
        if self.update_done:
            done = td.get(dkey, None)
            if done is not None:
                td.set(dkey, done | trunc)

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        obs = output_spec["full_observation_spec"]
        done = output_spec["full_done_spec"]
        bs = obs.shape
        dev = obs.device
        high = self.max_steps if self.max_steps is not None else _I64_MAX
        obs.set(self.step_count_key, Bounded(0, high, shape=(*bs, 1), device=dev, dtype=torch.int64))
        add = self.truncated_key not in done.keys(include_nested=True)
        self.__dict__["_add_trunc"] = add
        if add:
            done.set(self.truncated_key, Categorical(2, shape=(*bs, 1), device=dev, dtype=torch.bool))
        return output_spec

    def transform_state_spec(self, state_spec: Composite) -> Composite:
        # the counter is also an input of the step: batched envs pass it to their workers
        high = self.max_steps if self.max_steps is not None else _I64_MAX
        state_spec.set(self.step_count_key, Bounded(0, high, shape=(*state_spec.shape, 1),
                                                    device=state_spec.device, dtype=torch.int64))
        return state_spec

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """On a trajectory (last batch dim = time): the counters the env would have written.

        Episodes restart after ``("next", "done")`` and, with ``max_steps``, after every
        ``max_steps`` steps (where the env would have truncated them). Writes
        ``step_count`` and, when the TensorDict has ``"next"``, ``("next", step_count)``
        and the truncation flags.
        """
        td, added = as_trajectory(tensordict, self)
        starts_at = start_index(episode_starts(td, self.done_key))
        T = td.batch_size[-1]
        ar = torch.arange(T, device=starts_at.device).expand(starts_at.shape)
        count = ar - starts_at
        if self.max_steps is not None:  # a truncated episode restarts at the next step
            count = count % self.max_steps
        count = count.unsqueeze(-1)
        td.set(self.step_count_key, count)
        if "next" in td.keys():
            nxt = count + 1
            td.set(_next(self.step_count_key), nxt)
            if self.max_steps is not None:
                self._truncate(td, nxt >= self.max_steps, ("next",))
        return td.squeeze(0) if added else td

    def __repr__(self) -> str:
        return f"StepCounter(max_steps={self.max_steps}, step_count_key={self.step_count_key!r})"


class InitTracker(Transform):
    """Marks the first step of each episode: ``is_init`` is True right after a reset.

    Args:
        init_key: the flag entry (an observation, ``bool [*batch, 1]``).

    Recurrent policies use it to reset their hidden state. ``forward`` computes the
    flag on a trajectory TensorDict (True at the first step of every episode).

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv, check_env_specs
        >>> from steersman.envs.transforms import InitTracker, TransformedEnv
        >>> env = TransformedEnv(CartPoleEnv(seed=0), InitTracker())
        >>> check_env_specs(env)
        >>> env.rollout(3)["is_init"].squeeze(-1)
        tensor([ True, False, False])
    """

    _check_spec_in_keys = False

    def __init__(self, init_key: NestedKey = "is_init") -> None:
        super().__init__()
        self.init_key = key_list(init_key, "InitTracker", "init_key")[0]

    @property
    def out_keys(self) -> list[NestedKey]:  # type: ignore[override]
        return [self.init_key]

    @out_keys.setter
    def out_keys(self, keys: Any) -> None:
        pass

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        bs = tensordict_reset.batch_size
        dev = _device(tensordict_reset, "done")
        tensordict_reset.set(self.init_key, torch.ones((*bs, 1), dtype=torch.bool, device=dev))
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        bs = next_tensordict.batch_size
        dev = _device(next_tensordict, "done")
        next_tensordict.set(self.init_key, torch.zeros((*bs, 1), dtype=torch.bool, device=dev))
        return next_tensordict

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        obs = output_spec["full_observation_spec"]
        obs.set(self.init_key, Categorical(2, shape=(*obs.shape, 1), device=obs.device, dtype=torch.bool))
        return output_spec

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """On a trajectory (last batch dim = time): True at the first step of each episode."""
        td, added = as_trajectory(tensordict, self)
        td.set(self.init_key, episode_starts(td).unsqueeze(-1))
        if "next" in td.keys():
            bs = td.batch_size
            td.set(_next(self.init_key), torch.zeros((*bs, 1), dtype=torch.bool, device=td.device))
        return td.squeeze(0) if added else td

    def __repr__(self) -> str:
        return f"InitTracker(init_key={self.init_key!r})"
