"""Reward transforms: RewardScaling, RewardClipping, RewardSum, TargetReturn."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from steersman.data import Bounded, Composite, TensorSpec, Unbounded
from steersman.tensordict import TensorDictBase
from steersman.tensordict._utils import NestedKey

from ._utils import (
    as_trajectory,
    check_reset_key,
    episode_starts,
    key_list,
    leaf_keys,
    map_bounded,
    missing_key,
    missing_spec_key,
    refuse_unless_default,
    segment_cumsum,
    start_index,
)
from .base import Transform

__all__ = ["RewardScaling", "RewardClipping", "RewardSum", "TargetReturn"]


def _next(key: NestedKey) -> tuple:
    return ("next", *((key,) if type(key) is str else key))


def _episode_key(key: NestedKey, prefix: str) -> NestedKey:
    if type(key) is str:
        return prefix + key
    return (*key[:-1], prefix + key[-1])


class RewardScaling(Transform):
    """Affine reward map: ``r * scale + loc``, or ``(r - loc) / scale`` with ``standard_normal``.

    Args:
        loc, scale: numbers or tensors broadcastable to the reward.
        in_keys, out_keys: the reward entries (default ``["reward"]``).
        standard_normal: use ``(r - loc) / scale``.

    The result keeps the reward's dtype; Bounded reward specs get mapped bounds.

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv, check_env_specs
        >>> from steersman.envs.transforms import RewardScaling, TransformedEnv
        >>> env = TransformedEnv(CartPoleEnv(seed=0), RewardScaling(loc=1.0, scale=0.5))
        >>> check_env_specs(env)
        >>> env.rollout(2)["next", "reward"]              # CartPole's 1.0 -> 1.0 * 0.5 + 1.0
        tensor([[1.5000],
                [1.5000]])
    """

    def __init__(self, loc: float | Tensor, scale: float | Tensor, in_keys: Any = None,
                 out_keys: Any = None, standard_normal: bool = False) -> None:
        super().__init__(["reward"] if in_keys is None else in_keys, out_keys)
        loc = torch.as_tensor(loc)
        scale = torch.as_tensor(scale)
        if not loc.is_floating_point():
            loc = loc.to(torch.get_default_dtype())
        if not scale.is_floating_point():
            scale = scale.to(torch.get_default_dtype())
        if standard_normal and bool((scale == 0).any()):
            raise ValueError("RewardScaling: scale must be nonzero with standard_normal=True")
        self.register_buffer("loc", loc)
        self.register_buffer("scale", scale)
        self.standard_normal = standard_normal

    def _apply_transform(self, x: Tensor) -> Tensor:
        if self.standard_normal:
            out = (x - self.loc) / self.scale
        else:
            out = x * self.scale + self.loc
        return out if out.dtype == x.dtype else out.to(x.dtype)

    def _transform_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        dtype = spec.dtype if spec.dtype.is_floating_point else self.loc.dtype
        return map_bounded(spec, self._apply_transform, dtype=dtype)

    def __repr__(self) -> str:
        return (f"RewardScaling(loc={self.loc.tolist()}, scale={self.scale.tolist()}, "
                f"in_keys={self.in_keys}, standard_normal={self.standard_normal})")


class RewardClipping(Transform):
    """Clamps rewards to ``[clamp_min, clamp_max]`` (either may be None).

    Args:
        clamp_min, clamp_max: the bounds.
        in_keys, out_keys: the reward entries (default ``["reward"]``).

    The reward spec becomes ``Bounded`` (intersected with the old bounds if any).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs.transforms import RewardClipping
        >>> td = TensorDict(reward=torch.tensor([[-3.0], [0.5], [2.0]]), batch_size=[3])
        >>> RewardClipping(-1.0, 1.0)(td)["reward"].squeeze(-1)
        tensor([-1.0000,  0.5000,  1.0000])
    """

    def __init__(self, clamp_min: float | None = None, clamp_max: float | None = None,
                 in_keys: Any = None, out_keys: Any = None) -> None:
        super().__init__(["reward"] if in_keys is None else in_keys, out_keys)
        if clamp_min is not None and clamp_max is not None and clamp_min > clamp_max:
            raise ValueError(f"RewardClipping: clamp_min={clamp_min} > clamp_max={clamp_max}")
        self.clamp_min = clamp_min
        self.clamp_max = clamp_max

    def _apply_transform(self, x: Tensor) -> Tensor:
        return x.clamp(self.clamp_min, self.clamp_max)

    def _transform_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        if self.clamp_min is None and self.clamp_max is None:
            return spec
        dt = spec.dtype
        if isinstance(spec, Bounded):
            low, high = spec.low, spec.high
        else:
            low = torch.full(spec.shape, -float("inf"), dtype=dt, device=spec.device)
            high = torch.full(spec.shape, float("inf"), dtype=dt, device=spec.device)
        return Bounded(low.clamp(self.clamp_min, self.clamp_max), high.clamp(self.clamp_min, self.clamp_max),
                       shape=spec.shape, device=spec.device, dtype=dt)

    def __repr__(self) -> str:
        return f"RewardClipping(clamp_min={self.clamp_min}, clamp_max={self.clamp_max}, in_keys={self.in_keys})"


class _EpisodeAccumulator(Transform):
    """Shared machinery of RewardSum / TargetReturn: a per-episode value kept in the data.

    The value of each sub-env lives in the TensorDict (root: before the step, ``"next"``:
    after it), so partial resets need no state here; it is declared as an observation and
    as a state entry (an input of the step, which batched envs pass to their workers).
    """

    _check_spec_in_keys = False

    def __init__(self, in_keys: Any, out_keys: Any) -> None:
        super().__init__(in_keys, out_keys)
        self._pairs  # noqa: B018  (validates the lengths now)
        self.__dict__["_templates"] = {}

    def _initial(self, shape: torch.Size, dtype: torch.dtype, device: Any) -> Tensor:
        raise NotImplementedError

    def _update(self, prev: Tensor, reward: Tensor) -> Tensor:
        raise NotImplementedError

    def _traj(self, reward_cumsum: Tensor, reward: Tensor) -> tuple[Tensor, Tensor]:
        """(root value, next value) on a trajectory from the within-episode cumsum."""
        raise NotImplementedError

    def _template(self, ok: NestedKey, batch: torch.Size, like: Tensor | None = None) -> Tensor:
        tpl = self.__dict__["_templates"].get(ok)
        if tpl is None:
            if like is None:
                raise RuntimeError(f"{type(self).__name__}: the specs are not known; use it in a TransformedEnv")
            feat, dtype, dev = like.shape[len(batch):], like.dtype, like.device
        else:
            feat, dtype, dev = tpl
        return self._initial(torch.Size((*batch, *feat)), dtype, dev)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        bs = tensordict_reset.batch_size
        for _, ok in self._pairs:
            tensordict_reset.set(ok, self._template(ok, bs))
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        for ik, ok in self._pairs:
            try:
                r = next_tensordict.get(ik)
            except KeyError:
                raise missing_key(self, ik, next_tensordict) from None
            prev = tensordict.get(ok, None)
            if prev is None:
                prev = self._template(ok, next_tensordict.batch_size, r)
            next_tensordict.set(ok, self._update(prev, r))
        return next_tensordict

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        rew = output_spec["full_reward_spec"]
        obs = output_spec["full_observation_spec"]
        nb = len(obs.shape)
        tpls = {}
        for ik, ok in self._pairs:
            s = rew.get(ik, None)
            if s is None or isinstance(s, Composite):
                raise missing_spec_key(self, ik, "reward spec", leaf_keys(rew))
            obs.set(ok, Unbounded(shape=s.shape, device=s.device, dtype=s.dtype))
            tpls[ok] = (s.shape[nb:], s.dtype, s.device)
        self.__dict__["_templates"] = tpls
        return output_spec

    def transform_state_spec(self, state_spec: Composite) -> Composite:
        # the running value is also an input of the step: batched envs pass it to workers
        nb = state_spec.shape
        for ok, (feat, dtype, dev) in self.__dict__["_templates"].items():
            state_spec.set(ok, Unbounded(shape=(*nb, *feat), device=dev, dtype=dtype))
        return state_spec

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """On a trajectory (last batch dim = time): the values the env would have written.

        Needs ``("next", in_key)`` (the rewards); episodes restart after
        ``("next", "done")``. Writes ``out_key`` (before each step) and
        ``("next", out_key)`` (after it).
        """
        td, added = as_trajectory(tensordict, self)
        tdim = td.batch_dims - 1
        starts_at = start_index(episode_starts(td))
        for ik, ok in self._pairs:
            r = td.get(_next(ik), None)
            if r is None:
                raise missing_key(self, _next(ik), td)
            cs = segment_cumsum(r, starts_at, tdim)
            root, nxt = self._traj(cs, r)
            td.set(ok, root)
            td.set(_next(ok), nxt)
        return td.squeeze(0) if added else td


class RewardSum(_EpisodeAccumulator):
    """Tracks the return of the current episode of each sub-env.

    Args:
        in_keys: the reward entries (default ``["reward"]``).
        out_keys: where the sums go (default ``"episode_" + key``, e.g.
            ``"episode_reward"``); observation entries.

    Reset sets the sum of the reset sub-envs to 0 (others keep theirs on a partial
    reset); each step writes ``("next", "episode_reward") = episode_reward + reward``.
    ``forward`` computes the same on a trajectory TensorDict.

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv, check_env_specs
        >>> from steersman.envs.transforms import RewardSum, TransformedEnv
        >>> env = TransformedEnv(CartPoleEnv(seed=0), RewardSum())
        >>> check_env_specs(env)
        >>> env.rollout(3)["next", "episode_reward"].squeeze(-1)   # CartPole: 1 per step
        tensor([1., 2., 3.])
    """

    def __init__(self, in_keys: Any = None, out_keys: Any = None, reset_keys: Any = None,
                 *, reward_spec: bool = False) -> None:
        check_reset_key("RewardSum", reset_keys)
        refuse_unless_default("RewardSum", "reward_spec", reward_spec, False,
                              "the episode return is an observation entry (in the observation spec)")
        in_keys = key_list(["reward"] if in_keys is None else in_keys, "RewardSum", "in_keys")
        if out_keys is None:
            out_keys = [_episode_key(k, "episode_") for k in in_keys]
        super().__init__(in_keys, out_keys)

    def _initial(self, shape: torch.Size, dtype: torch.dtype, device: Any) -> Tensor:
        return torch.zeros(shape, dtype=dtype, device=device)

    def _update(self, prev: Tensor, reward: Tensor) -> Tensor:
        return prev + reward

    def _traj(self, reward_cumsum: Tensor, reward: Tensor) -> tuple[Tensor, Tensor]:
        return reward_cumsum - reward, reward_cumsum


class TargetReturn(_EpisodeAccumulator):
    """A return-to-go entry (Decision Transformer): starts at ``target_return`` each episode.

    Args:
        target_return: the return aimed at.
        mode: ``"reduce"`` (subtract each reward) or ``"constant"`` (keep it).
        in_keys: the reward entries (default ``["reward"]``).
        out_keys: the target entries (default ``["target_return"]``); observations.

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv, check_env_specs
        >>> from steersman.envs.transforms import TargetReturn, TransformedEnv
        >>> env = TransformedEnv(CartPoleEnv(seed=0), TargetReturn(10.0))
        >>> check_env_specs(env)
        >>> env.rollout(3)["next", "target_return"].squeeze(-1)
        tensor([9., 8., 7.])
    """

    def __init__(self, target_return: float, mode: str = "reduce", in_keys: Any = None,
                 out_keys: Any = None, reset_key: NestedKey | None = None) -> None:
        check_reset_key("TargetReturn", reset_key)
        if mode not in ("reduce", "constant"):
            raise ValueError(f"TargetReturn: mode must be 'reduce' or 'constant', got {mode!r}")
        super().__init__(["reward"] if in_keys is None else in_keys,
                         ["target_return"] if out_keys is None else out_keys)
        self.target_return = float(target_return)
        self.mode = mode

    def _initial(self, shape: torch.Size, dtype: torch.dtype, device: Any) -> Tensor:
        return torch.full(shape, self.target_return, dtype=dtype, device=device)

    def _update(self, prev: Tensor, reward: Tensor) -> Tensor:
        if self.mode == "reduce":
            return prev - reward
        return prev.clone()

    def _traj(self, reward_cumsum: Tensor, reward: Tensor) -> tuple[Tensor, Tensor]:
        t = self.target_return
        if self.mode == "constant":
            full = torch.full_like(reward, t)
            return full, full.clone()
        return t - (reward_cumsum - reward), t - reward_cumsum

    def __repr__(self) -> str:
        return f"TargetReturn(target_return={self.target_return}, mode={self.mode!r}, out_keys={self.out_keys})"
