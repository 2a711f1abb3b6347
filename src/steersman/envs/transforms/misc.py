"""Env-level transforms: FrameSkipTransform, NoopResetEnv, ActionMask, BatchSizeTransform."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from steersman.data import Bounded, Composite, TensorSpec
from steersman.tensordict import TensorDict, TensorDictBase
from steersman.tensordict._utils import NestedKey

from .._mdp import _any_done
from ._utils import (
    expand_mask,
    key_list,
    leaf_keys,
    missing_key,
    missing_spec_key,
    refuse_unless_default,
    reset_mask,
)
from .base import Transform

__all__ = ["FrameSkipTransform", "NoopResetEnv", "ActionMask", "BatchSizeTransform"]


def _done_keys(env: Any) -> list:
    keys = env.done_keys
    return [k for k in keys if (k if type(k) is str else k[-1]) == "done"] or keys


class FrameSkipTransform(Transform):
    """Repeats each action ``frame_skip`` times; the step's reward is the sum of the rewards.

    Args:
        frame_skip: the number of base-env steps per step (>= 1).

    A sub-env that finishes during the repeats keeps the outputs of its last step
    (later repeats do not count for it). The reward spec's bounds are widened to what a
    sum can reach. ``forward`` (outside an env) returns the TensorDict unchanged:
    the transform acts on how the env steps, not on data. Place it before transforms
    that map actions (their inverses are applied before this transform's repeats).

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv, check_env_specs
        >>> from steersman.envs.transforms import FrameSkipTransform, StepCounter, TransformedEnv
        >>> env = TransformedEnv(CartPoleEnv(seed=0, max_episode_steps=None), FrameSkipTransform(3))
        >>> env = env.append_transform(StepCounter())
        >>> check_env_specs(env)
        >>> td = env.rollout(2)
        >>> td["next", "reward"].squeeze(-1)             # 3 CartPole steps per step
        tensor([3., 3.])
    """

    _check_spec_in_keys = False

    def __init__(self, frame_skip: int = 1) -> None:
        super().__init__()
        if not isinstance(frame_skip, int) or frame_skip < 1:
            raise ValueError(f"FrameSkipTransform: frame_skip must be a positive int, got {frame_skip!r}")
        self.frame_skip = frame_skip
        self.__dict__["_keys"] = None

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        if self.frame_skip == 1:
            return next_tensordict
        parent = self.parent
        if parent is None:
            raise RuntimeError("FrameSkipTransform must be used inside a TransformedEnv")
        keys = self.__dict__["_keys"]
        if keys is None or keys[0] is not parent:
            keys = (parent, parent.reward_keys, _done_keys(parent))
            self.__dict__["_keys"] = keys
        _, rkeys, dkeys = keys
        nb = next_tensordict.batch_dims
        rewards = [next_tensordict.get(k) for k in rkeys]
        done = _any_done(next_tensordict, dkeys, nb)
        for _ in range(self.frame_skip - 1):
            if done is not None and bool(done.all()):
                break
            nxt = parent._step(tensordict)
            for i, k in enumerate(rkeys):
                r = nxt.get(k)
                if done is not None:
                    r = torch.where(expand_mask(done, r), torch.zeros_like(r), r)
                rewards[i] = rewards[i] + r
            if done is not None and bool(done.any()):
                nxt = torch.where(done, next_tensordict, nxt)
            next_tensordict = nxt
            new_done = _any_done(nxt, dkeys, nb)
            done = new_done if done is None else (done if new_done is None else done | new_done)
        for k, r in zip(rkeys, rewards):
            next_tensordict.set(k, r)
        return next_tensordict

    def transform_reward_spec(self, reward_spec: Composite) -> Composite:
        k = self.frame_skip
        for key, s in reward_spec.items(include_nested=True, leaves_only=True):
            if isinstance(s, Bounded) and k > 1:
                low = torch.minimum(s.low, s.low * k)
                high = torch.maximum(s.high, s.high * k)
                reward_spec.set(key, Bounded(low, high, shape=s.shape, device=s.device, dtype=s.dtype))
        return reward_spec

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict

    def __repr__(self) -> str:
        return f"FrameSkipTransform(frame_skip={self.frame_skip})"


class NoopResetEnv(Transform):
    """After a reset, takes a number of no-op steps (the zero action), as in Atari setups.

    Args:
        noops: the number of no-op steps (with ``random=True``: drawn uniformly in
            ``[0, noops)`` at each reset).
        random: draw the number at each reset (seeded by ``env.set_seed``).

    If an episode ends during the no-ops, the env is reset again and the episode starts
    there. The no-ops run on full resets only: on a partial reset of a batched env
    stepping would also advance the sub-envs that are not reset, so reset sub-envs
    then start without no-ops. ``forward`` returns the TensorDict unchanged.

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv, check_env_specs
        >>> from steersman.envs.transforms import NoopResetEnv, StepCounter, TransformedEnv
        >>> env = TransformedEnv(CartPoleEnv(seed=0), StepCounter())
        >>> env = env.append_transform(NoopResetEnv(noops=4, random=False))
        >>> int(env.reset()["step_count"])               # 4 no-op steps taken at reset
        4
        >>> check_env_specs(env)
    """

    _check_spec_in_keys = False

    def __init__(self, noops: int = 30, random: bool = True) -> None:
        super().__init__()
        if not isinstance(noops, int) or noops < 0 or (random and noops < 1):
            raise ValueError(f"NoopResetEnv: noops must be a positive int, got {noops!r}")
        self.noops = noops
        self.random = random
        self.__dict__["_gen"] = None

    def _set_seed(self, seed: int | None) -> None:
        if seed is None:
            self.__dict__["_gen"] = None
            return
        g = torch.Generator()
        g.manual_seed(int(seed) & ((1 << 63) - 1))
        self.__dict__["_gen"] = g

    def _draw(self) -> int:
        if not self.random:
            return self.noops
        return int(torch.randint(self.noops, (), generator=self.__dict__["_gen"]))

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        mask = reset_mask(tensordict, tensordict_reset.batch_size)
        if mask is not None and not bool(mask.all()):
            return tensordict_reset
        n = self._draw()
        if n == 0:
            return tensordict_reset
        parent = self.parent
        if parent is None:
            raise RuntimeError("NoopResetEnv must be used inside a TransformedEnv")
        dkeys = _done_keys(parent)
        nb = tensordict_reset.batch_dims
        td = tensordict_reset
        for _ in range(n):
            td = td.copy()
            td.update(parent.full_action_spec.zero())
            td = parent._step_mdp(parent.step(td))
            done = _any_done(td, dkeys, nb)
            if done is not None and bool(done.any()):
                td = parent.reset()
                break
        return td

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict

    def __repr__(self) -> str:
        return f"NoopResetEnv(noops={self.noops}, random={self.random})"


class ActionMask(Transform):
    """Keeps the action spec's mask in sync with an ``"action_mask"`` observation.

    Args:
        action_key: the action entry (a ``Categorical`` or ``OneHot`` spec, or another
            spec with ``update_mask``).
        mask_key: the bool observation ``[*batch, *action_shape, n]`` of allowed actions.

    After every reset and step, the transformed env's action spec gets the current
    mask, so ``env.rand_action()`` (and anything sampling from the spec) only draws
    allowed actions. Outside an env, ``forward`` returns the TensorDict unchanged.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.data import Categorical, Composite
        >>> from steersman.envs import EnvBase
        >>> from steersman.envs.transforms import ActionMask, TransformedEnv
        >>> class Masked(EnvBase):       # 3 actions; action 0 is never allowed
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.observation_spec = Composite(action_mask=Categorical(2, (3,), dtype=torch.bool))
        ...         self.action_spec = Categorical(3)
        ...     def _out(self):
        ...         f = torch.zeros(1, dtype=torch.bool)
        ...         return TensorDict(action_mask=torch.tensor([False, True, True]), done=f,
        ...                           terminated=f.clone(), truncated=f.clone(), reward=torch.zeros(1))
        ...     def _reset(self, td):
        ...         return self._out().exclude("reward")
        ...     def _step(self, td):
        ...         return self._out()
        ...     def _set_seed(self, seed):
        ...         pass
        >>> env = TransformedEnv(Masked(), ActionMask())
        >>> actions = env.rollout(50)["action"]
        >>> bool((actions != 0).all())
        True
    """

    _check_spec_in_keys = False

    def __init__(self, action_key: NestedKey = "action", mask_key: NestedKey = "action_mask") -> None:
        super().__init__(in_keys=[action_key, mask_key])
        self.action_key = key_list(action_key, "ActionMask", "action_key")[0]
        self.mask_key = key_list(mask_key, "ActionMask", "mask_key")[0]
        self.__dict__["_target"] = (None, None)

    def _spec(self) -> TensorSpec | None:
        env = self._env()
        if env is None:
            return None
        full = env.full_action_spec
        cached_full, leaf = self.__dict__["_target"]
        if cached_full is full:
            return leaf
        leaf = full.get(self.action_key, None)
        if leaf is not None and not hasattr(leaf, "update_mask"):
            leaf = None
        self.__dict__["_target"] = (full, leaf)
        return leaf

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        spec = self._spec()
        if spec is None:
            return tensordict
        try:
            mask = tensordict.get(self.mask_key)
        except KeyError:
            raise missing_key(self, self.mask_key, tensordict) from None
        spec.update_mask(mask)
        return tensordict

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        spec = self._spec()
        if spec is None:
            return tensordict_reset
        try:
            mask = tensordict_reset.get(self.mask_key)
        except KeyError:
            raise missing_key(self, self.mask_key, tensordict_reset) from None
        reset = reset_mask(tensordict, tensordict_reset.batch_size)
        old = tensordict.get(self.mask_key, None)
        if reset is not None and old is not None and old.shape == mask.shape:
            mask = torch.where(expand_mask(reset, mask), mask, old)  # others keep their mask
        spec.update_mask(mask)
        return tensordict_reset

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        obs = output_spec["full_observation_spec"]
        if self.mask_key not in obs.keys(include_nested=True):
            raise missing_spec_key(self, self.mask_key, "observation spec", leaf_keys(obs))
        return output_spec

    def transform_action_spec(self, action_spec: Composite) -> Composite:
        s = action_spec.get(self.action_key, None)
        if s is None:
            raise missing_spec_key(self, self.action_key, "action spec", leaf_keys(action_spec))
        if not hasattr(s, "update_mask"):
            raise TypeError(
                f"ActionMask: the action spec {type(s).__name__} of {self.action_key!r} has no mask; "
                "use a Categorical, OneHot, MultiCategorical or MultiOneHot action"
            )
        action_spec.set(self.action_key, s.clone())  # this env's own copy: its mask changes
        return action_spec

    def __repr__(self) -> str:
        return f"ActionMask(action_key={self.action_key!r}, mask_key={self.mask_key!r})"


def _reshape(td: TensorDictBase, shape: torch.Size) -> TensorDictBase:
    if len(shape) == 0:  # a one-element batch to no batch dims
        return td.reshape(1).squeeze(0)
    return td.reshape(shape)


class BatchSizeTransform(Transform):
    """Changes the batch size of an env (reshaping its sub-envs), e.g. ``[8]`` to ``[2, 4]``.

    Args:
        batch_size: the new batch size (same number of sub-envs).
        reshape_fn: instead of ``batch_size``, a function ``td -> td`` reshaping the
            batch dims (e.g. ``lambda td: td.reshape(-1)``); the inverse reshape back to
            the wrapped env's batch size is applied to the env's inputs.

    Outputs are reshaped to the new batch size, inputs (actions, reset masks) back to the
    wrapped env's. Specs are reshaped the same way. ``forward`` reshapes the leading
    batch dims of a TensorDict whose batch starts with the wrapped env's batch size
    (e.g. a rollout ``[*env_batch, T]``).

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv, check_env_specs
        >>> from steersman.envs.transforms import BatchSizeTransform, TransformedEnv
        >>> env = TransformedEnv(CartPoleEnv(batch_size=[6], seed=0), BatchSizeTransform([2, 3]))
        >>> env.batch_size
        torch.Size([2, 3])
        >>> check_env_specs(env)
        >>> env.rollout(4).batch_size
        torch.Size([2, 3, 4])
    """

    _check_spec_in_keys = False

    def __init__(self, batch_size: Any = None,
                 reshape_fn: Callable[[TensorDictBase], TensorDictBase] | None = None,
                 reset_func: Callable | None = None, env_kwarg: bool = False) -> None:
        refuse_unless_default("BatchSizeTransform", "reset_func", reset_func, None,
                              "the base env's reset is used (reshaped); wrap the env to change it")
        refuse_unless_default("BatchSizeTransform", "env_kwarg", env_kwarg, False,
                              "the base env's batch size is set where it is built")
        super().__init__()
        if (batch_size is None) == (reshape_fn is None):
            raise ValueError("BatchSizeTransform: give exactly one of batch_size and reshape_fn")
        self.batch_size = None if batch_size is None else torch.Size(
            [batch_size] if isinstance(batch_size, int) else [int(b) for b in batch_size])
        self.reshape_fn = reshape_fn
        self.__dict__["_base_bs"] = None
        self.__dict__["_new_bs"] = None

    def transform_env_batch_size(self, batch_size: torch.Size) -> torch.Size:
        batch_size = torch.Size(batch_size)
        if self.reshape_fn is not None:
            new = self.reshape_fn(TensorDict.from_trusted({}, batch_size, None)).batch_size
        else:
            new = self.batch_size
        if new.numel() != batch_size.numel():
            raise ValueError(
                f"BatchSizeTransform: cannot turn the env batch size {list(batch_size)} into "
                f"{list(new)} (different numbers of sub-envs)"
            )
        self.__dict__["_base_bs"] = batch_size
        self.__dict__["_new_bs"] = torch.Size(new)
        return torch.Size(new)

    def _out(self, td: TensorDictBase) -> TensorDictBase:
        new = self.__dict__["_new_bs"]
        if new is not None and td.batch_size == new:
            return td
        if self.reshape_fn is not None:
            return self.reshape_fn(td)
        base = self.__dict__["_base_bs"]
        bs = td.batch_size
        if base is not None and bs[: len(base)] == base:
            return _reshape(td, torch.Size((*self.batch_size, *bs[len(base):])))
        return _reshape(td, self.batch_size)

    def _back(self, td: TensorDictBase) -> TensorDictBase:
        base = self.__dict__["_base_bs"]
        if base is None or td.batch_size == base:
            return td
        return _reshape(td, base)

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._out(tensordict)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        return self._out(tensordict_reset)

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._back(tensordict)

    def _reset_env_preprocess(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._back(tensordict)

    def _reshape_spec(self, spec: Composite) -> Composite:
        new = self.__dict__["_new_bs"]
        return spec.reshape(new)

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        parts = {k: self._reshape_spec(output_spec[k]) for k in output_spec.keys()}
        out = Composite._new_unchecked(parts, self.__dict__["_new_bs"], output_spec.device)
        for p in parts.values():
            p.unlock_()
        return out

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        return self.transform_output_spec(input_spec)

    def __repr__(self) -> str:
        what = f"batch_size={list(self.batch_size)}" if self.batch_size is not None else "reshape_fn=..."
        return f"BatchSizeTransform({what})"

