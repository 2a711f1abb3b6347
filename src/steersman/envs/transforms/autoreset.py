"""Envs that reset themselves: ``AutoResetTransform`` and ``AutoResetEnv`` (the step that
ends an episode already returns the next episode's first observation), and
``VecGymEnvTransform`` (the same, with the true final observation in a ``"final"``
entry, as vectorized gym envs give it)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from steersman.data import Composite, Unbounded
from steersman.tensordict import TensorDictBase

from .base import Transform, TransformedEnv

__all__ = ["AutoResetTransform", "AutoResetEnv", "VecGymEnvTransform"]


def _fill_for(x: Tensor, fill_float: Any, fill_int: Any, fill_bool: Any) -> Any:
    if x.dtype == torch.bool:
        return fill_bool
    if x.is_floating_point():
        return None if fill_float is None else float(fill_float)
    if x.dtype.is_signed:
        return fill_int
    return None  # unsigned ints (e.g. pixels) have no "invalid" value: left as they are


class AutoResetTransform(Transform):
    """Makes an env that resets itself inside ``step`` look like an ordinary env.

    An auto-resetting env returns, on the step that ends an episode, the first observation
    of the next episode instead of the last one of the finished episode. This transform
    keeps those reset observations aside and writes fill values in their place in the
    step's ``"next"`` entries (``replace=True``): NaN for floating entries (``fill_float``),
    ``fill_int`` for signed integers, ``fill_bool`` for booleans (unsigned integers, e.g.
    pixels, are left as they are). The following reset of those elements (as
    ``rollout``/``step_and_maybe_reset`` do with a ``"_reset"`` mask) does not reset the env
    again: it returns the kept observations. Use it in an :class:`AutoResetEnv` (a
    ``TransformedEnv`` works too: a partial reset then skips the base env's reset).

    Observations that can hold a fill value get Unbounded specs (NaN is in no bound).

    Args:
        replace: write the fill values (default True); ``False`` leaves the reset
            observations in ``"next"`` (and overrides the fills).
        fill_float: ``"nan"``/a float (None: no replacement for floats).
        fill_int: the value for signed integer entries (None: none).
        fill_bool: the value for boolean entries (None: none).

    Example:
        >>> import torch
        >>> from steersman.envs.transforms import AutoResetEnv, AutoResetTransform
        >>> from steersman.envs.transforms.autoreset import _CountdownEnv
        >>> env = AutoResetEnv(_CountdownEnv(length=3), AutoResetTransform())
        >>> r = env.rollout(7, break_when_any_done=False)
        >>> r["observation"].squeeze(-1).tolist()          # 0, 1, 2, then a new episode
        [0.0, 1.0, 2.0, 0.0, 1.0, 2.0, 0.0]
        >>> r["next", "observation"].squeeze(-1).tolist()  # the step that ends an episode: NaN
        [1.0, 2.0, nan, 1.0, 2.0, nan, 1.0]
    """

    _skip_base_partial_reset = True

    def __init__(self, *, replace: bool | None = None, fill_float: Any = "nan", fill_int: Any = -1,
                 fill_bool: Any = False) -> None:
        super().__init__()
        self.replace = True if replace is None else bool(replace)
        if isinstance(fill_float, str):
            if fill_float.lower() not in ("nan", "inf", "-inf"):
                raise ValueError(f"AutoResetTransform: fill_float must be a float, None or 'nan', got {fill_float!r}")
            fill_float = float(fill_float)
        self.fill_float = fill_float
        self.fill_int = fill_int
        self.fill_bool = fill_bool
        self._saved: TensorDictBase | None = None
        self._saved_mask: Tensor | None = None

    def _obs_keys(self) -> list:
        parent = self.parent
        return list(parent.full_observation_spec.keys(include_nested=True, leaves_only=True))

    def _done(self, next_td: TensorDictBase) -> Tensor:
        parent = self.parent
        nb = len(parent.batch_size)
        out = torch.zeros(parent.batch_size, dtype=torch.bool, device=parent.device)
        for key in parent.done_keys:
            last = key if isinstance(key, str) else key[-1]
            if last == "done":
                v = next_td.get(key, None)
                if v is not None:
                    out = out | v.reshape(*v.shape[:nb], -1).any(-1)
        return out

    def _last_obs(self, next_td: TensorDictBase, key: Any, done: Tensor) -> Tensor | None:
        """The value written at ``key`` for the elements that are done (None: keep)."""
        x = next_td.get(key)
        if not self.replace:
            return None
        fill = _fill_for(x, self.fill_float, self.fill_int, self.fill_bool)
        return None if fill is None else torch.full_like(x, fill)

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        done = self._done(next_tensordict)
        if not bool(done.any()):
            self._drop_extra(next_tensordict)
            return next_tensordict
        keys = self._obs_keys()
        self._saved = next_tensordict.select(*keys).clone()
        self._saved_mask = done
        nb = done.ndim
        for key in keys:
            new = self._last_obs(next_tensordict, key, done)
            if new is None:
                continue
            x = next_tensordict.get(key)
            m = done.reshape(*done.shape, *([1] * (x.ndim - nb)))
            next_tensordict.set(key, torch.where(m, new, x))
        self._drop_extra(next_tensordict)
        return next_tensordict

    def _drop_extra(self, next_tensordict: TensorDictBase) -> None:
        pass

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        saved, self._saved = self._saved, None
        if saved is None or "_reset" not in tensordict.keys():
            self._drop_extra(tensordict_reset)
            return tensordict_reset
        for key in saved.keys(include_nested=True, leaves_only=True):
            tensordict_reset.set(key, saved.get(key))
        done_spec = self.parent.full_done_spec
        for key, spec in done_spec.items(include_nested=True, leaves_only=True):
            tensordict_reset.set(key, spec.zero())
        self._drop_extra(tensordict_reset)
        return tensordict_reset

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        if not self.replace:
            return observation_spec
        for key, spec in list(observation_spec.items(include_nested=True, leaves_only=True)):
            fill = _fill_for(torch.empty((), dtype=spec.dtype), self.fill_float, self.fill_int, self.fill_bool)
            if fill is None or spec.dtype == torch.bool:
                continue
            if isinstance(fill, float) and math.isfinite(fill) and spec.is_in(torch.full(spec.shape, fill,
                                                                                          dtype=spec.dtype)):
                continue
            observation_spec.set(key, Unbounded(shape=spec.shape, dtype=spec.dtype, device=spec.device))
        return observation_spec

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(replace={self.replace}, fill_float={self.fill_float}, "
                f"fill_int={self.fill_int}, fill_bool={self.fill_bool})")


class AutoResetEnv(TransformedEnv):
    """A ``TransformedEnv`` for envs that reset themselves (with an :class:`AutoResetTransform`).

    A reset with a ``"_reset"`` mask does not reset the base env (it already did, in the
    step that ended the episode): the transforms return the kept observations. A reset
    without a mask resets the base env as usual.
    """


class VecGymEnvTransform(AutoResetTransform):
    """:class:`AutoResetTransform` for vectorized gym-style envs that also return the true
    final observation of a finished episode, under ``final_name`` in the step output.

    On the step that ends an episode, the observations of ``"next"`` become the final ones
    (``(final_name, key)``; ``missing_obs_value`` where the env gave none), the reset ones
    are kept for the following partial reset, and the ``final_name`` entry is removed
    (from the data and the specs). steersman's :class:`~steersman.envs.GymEnv` handles
    every Gymnasium autoreset mode itself; this transform is for custom wrappers that
    emit such a ``final`` entry.

    Args:
        final_name: the entry holding the final observations (default ``"final"``).
        missing_obs_value: the value where no final observation was given (default NaN).
        native_autoreset: accepted (TorchRL's flag); the reset observations are always
            kept for the next reset.
    """

    def __init__(self, final_name: str = "final", missing_obs_value: Any = float("nan"), *,
                 native_autoreset: bool = False) -> None:
        super().__init__(replace=True, fill_float=missing_obs_value, fill_int=-1, fill_bool=False)
        self.final_name = final_name
        self.missing_obs_value = missing_obs_value
        self.native_autoreset = bool(native_autoreset)

    def _obs_keys(self) -> list:
        return [k for k in super()._obs_keys() if (k if isinstance(k, str) else k[0]) != self.final_name]

    def _last_obs(self, next_td: TensorDictBase, key: Any, done: Tensor) -> Tensor | None:
        k = (self.final_name, *((key,) if isinstance(key, str) else key))
        final = next_td.get(k, None)
        if final is not None:
            return final
        return super()._last_obs(next_td, key, done)

    def _drop_extra(self, next_tensordict: TensorDictBase) -> None:
        if self.final_name in next_tensordict.keys():
            next_tensordict.del_(self.final_name)

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        if self.final_name in observation_spec.keys():
            del observation_spec[self.final_name]
        return super().transform_observation_spec(observation_spec)


class _CountdownEnv:
    """Built lazily (see ``__new__``): a tiny auto-resetting env for the examples and tests."""

    def __new__(cls, length: int = 3, batch_size: Any = (), final: bool = False) -> Any:
        from steersman.data import Bounded
        from steersman.envs import EnvBase
        from steersman.tensordict import TensorDict

        class CountdownEnv(EnvBase):
            """``observation`` = steps since the episode began (float ``[*b, 1]``); an
            episode of sub-env ``i`` lasts ``length + i % 2`` steps, then the env resets
            itself in the same step (``final=True``: the last observation is given under
            ``("final", "observation")``)."""

            def __init__(self) -> None:
                super().__init__(batch_size=batch_size)
                bs = self.batch_size
                obs = {"observation": Bounded(0.0, 10.0, shape=(*bs, 1))}
                if final:
                    obs["final"] = Composite(observation=Bounded(0.0, 10.0, shape=(*bs, 1)), shape=bs)
                self.observation_spec = Composite(obs, shape=bs)
                self.action_spec = Bounded(-1.0, 1.0, shape=(*bs, 1))
                self.reward_spec = Unbounded(shape=(*bs, 1))
                n = bs.numel()
                self.length = (length + torch.arange(n) % 2).reshape(*bs, 1).float()
                self.count = torch.zeros(*bs, 1)
                self.resets = 0

            def _reset(self, tensordict: Any, **kwargs: Any) -> Any:
                self.resets += 1
                self.count = torch.zeros_like(self.count)
                out = {"observation": self.count.clone()}
                if final:
                    out["final"] = {"observation": self.count.clone()}
                return TensorDict(out, batch_size=self.batch_size)

            def _step(self, tensordict: Any) -> Any:
                self.count = self.count + 1
                done = self.count >= self.length
                last = self.count.clone()
                self.count = torch.where(done, 0.0, self.count)
                out = {"observation": self.count.clone(), "reward": tensordict["action"].clone(),
                       "done": done, "terminated": done.clone(), "truncated": torch.zeros_like(done)}
                if final:
                    out["final"] = {"observation": last}
                return TensorDict(out, batch_size=self.batch_size)

            def _set_seed(self, seed: int | None) -> None:
                pass

        return CountdownEnv()
