"""``GymLikeEnv``: a base class for wrappers of simulators with a gym-like API
(``reset() -> obs[, info]``, ``step(action) -> obs, reward, terminated, truncated, info``
or the older ``obs, reward, done, info``), and the info-dict readers
(``default_info_dict_reader``) that copy entries of ``info`` into the step output."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from steersman.data import Composite, TensorSpec, Unbounded
from steersman.tensordict import TensorDict, TensorDictBase

from .common import EnvBase

__all__ = ["GymLikeEnv", "BaseInfoDictReader", "default_info_dict_reader"]


class BaseInfoDictReader:
    """Reads entries of a gym ``info`` dict into a TensorDict: ``reader(info, td) -> td``;
    ``info_spec`` is the Composite of what it writes."""

    def __call__(self, info_dict: dict, tensordict: TensorDictBase) -> TensorDictBase:
        raise NotImplementedError

    @property
    def info_spec(self) -> Composite | None:
        raise NotImplementedError

    def reset(self) -> None:
        """Forgets what was inferred from earlier infos."""


class default_info_dict_reader(BaseInfoDictReader):  # noqa: N801 - TorchRL's name
    """Copies the ``keys`` of each ``info`` dict (all keys by default) into the step output.

    Args:
        keys: the info keys to read (default: every key of the first info seen).
        spec: their specs (a list matching ``keys``, a dict or a Composite); default:
            Unbounded specs inferred from the first info seen (float values become the
            default float dtype, ints int64, bools bool).
        ignore_private: skip keys starting with ``"_"`` (default True; vector envs put
            masks there).

    A key missing from an info is written as zeros (the entry must be in every step).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs import default_info_dict_reader
        >>> reader = default_info_dict_reader(["x_position"])
        >>> td = reader({"x_position": 0.5, "other": 1}, TensorDict({}, []))
        >>> td["x_position"], reader.info_spec["x_position"].shape
        (tensor(0.5000), torch.Size([]))
    """

    def __init__(self, keys: list[str] | None = None,
                 spec: Sequence[TensorSpec] | dict[str, TensorSpec] | Composite | None = None,
                 ignore_private: bool = True) -> None:
        if isinstance(keys, str):
            keys = [keys]
        self.keys = None if keys is None else list(keys)
        self.ignore_private = bool(ignore_private)
        self._spec: Composite | None = None
        if spec is not None:
            if isinstance(spec, Composite):
                self._spec = spec
            elif isinstance(spec, dict):
                self._spec = Composite(dict(spec))
            else:
                spec = list(spec)
                if self.keys is None or len(spec) != len(self.keys):
                    raise ValueError("default_info_dict_reader: a list of specs needs keys of the same length, got "
                                     f"{len(spec)} specs for keys {self.keys}")
                self._spec = Composite(dict(zip(self.keys, spec)))
            if self.keys is None:
                self.keys = list(self._spec.keys())

    @property
    def info_spec(self) -> Composite | None:
        """The specs of the entries written (None until known)."""
        return self._spec

    def reset(self) -> None:
        if self._spec is not None and self._inferred:
            self._spec = None

    _inferred = False

    def _infer(self, info: dict, batch_size: torch.Size) -> None:
        keys = self.keys if self.keys is not None else [
            k for k in info if not (self.ignore_private and str(k).startswith("_"))]
        specs = {}
        for k in keys:
            if k not in info:
                raise KeyError(f"default_info_dict_reader: the info has no key {k!r} (its keys: {sorted(info)}); "
                               "pass spec= for keys that appear only sometimes")
            v = torch.as_tensor(np.asarray(info[k]))
            if v.is_floating_point():
                v = v.to(torch.get_default_dtype())
            nb = len(batch_size)
            specs[k] = Unbounded(shape=(*batch_size, *v.shape[nb:]), dtype=v.dtype)
        self.keys = keys
        self._spec = Composite(specs, shape=batch_size)
        self._inferred = True

    def __call__(self, info_dict: dict, tensordict: TensorDictBase) -> TensorDictBase:
        if self._spec is None:
            self._infer(info_dict, tensordict.batch_size)
        for k in self.keys:
            spec = self._spec[k]
            if k in info_dict:
                v = torch.as_tensor(np.asarray(info_dict[k]), dtype=spec.dtype)
                v = v.reshape(spec.shape) if v.numel() == spec.shape.numel() else v
            else:
                v = spec.zero()
            tensordict.set(k, v.to(tensordict.device) if tensordict.device is not None else v)
        return tensordict

    def __repr__(self) -> str:
        return f"default_info_dict_reader(keys={self.keys})"


class GymLikeEnv(EnvBase):
    """Base class of env wrappers around an object with a gym-like ``reset``/``step``.

    A subclass (or a direct instance, with ``env=``) provides the wrapped object as
    ``self._env`` and the specs; if the specs are not set and the object has gym spaces
    (``observation_space``/``action_space``), they are built from them. Then:

    * ``reset``: ``self._env.reset(**kwargs)`` gives ``obs`` or ``(obs, info)``;
    * ``step``: :meth:`read_action` turns the action entry into what ``self._env.step``
      takes (a numpy array); its result ``(obs, reward, terminated, truncated, info)`` (or
      ``(obs, reward, done, info)``) is read with :meth:`read_obs` (a dict observation is
      written key by key, anything else at ``"observation"``), :meth:`read_reward` and
      :meth:`read_done`;
    * info dicts are read by the readers set with :meth:`set_info_dict_reader` (their
      specs join the observation spec).

    Args:
        env: the wrapped object (optional if a subclass sets ``self._env``).
        device, batch_size, allow_done_after_reset: as for :class:`EnvBase`.
        spec_locked: accepted (TorchRL's flag; specs here are locked Composites anyway).
        categorical_action_encoding: discrete spaces as index specs (spec building).

    Example:
        >>> import gymnasium as gym
        >>> from steersman.envs import GymLikeEnv, check_env_specs, default_info_dict_reader
        >>> env = GymLikeEnv(env=gym.make("CartPole-v1"), categorical_action_encoding=True)
        >>> check_env_specs(env, seed=0)
        >>> env.rollout(5).batch_size
        torch.Size([5])
    """

    def __init__(self, *args: Any, device: Any = None, batch_size: torch.Size | None = None,
                 allow_done_after_reset: bool = False, spec_locked: bool = True, **kwargs: Any) -> None:
        env = kwargs.pop("env", args[0] if args else None)
        cae = bool(kwargs.pop("categorical_action_encoding", False))
        if kwargs:
            raise TypeError(f"GymLikeEnv got unexpected arguments {sorted(kwargs)}")
        super().__init__(device=device, batch_size=batch_size)
        self.allow_done_after_reset = bool(allow_done_after_reset)
        self._info_dict_reader: list[Callable] = []
        self._seed_next: int | None = None
        if env is not None:
            self._env = env
        if getattr(self, "_env", None) is None:
            raise TypeError(f"{type(self).__name__}: pass the wrapped object as env= (or set self._env in a subclass "
                            "before calling super().__init__)")
        self._categorical_action_encoding = cae
        self._make_specs_from_spaces()

    # ------------------------------------------------------------------ specs
    def _make_specs_from_spaces(self) -> None:
        env = self._env
        if not (hasattr(env, "observation_space") and hasattr(env, "action_space")):
            return
        if self.full_action_spec.keys(True, True) and self.full_observation_spec.keys(True, True):
            return  # a subclass set them
        from .libs.gym import space_to_spec

        bs = self.batch_size
        cae = self._categorical_action_encoding
        obs = space_to_spec(env.observation_space, categorical_action_encoding=cae, batch_size=bs,
                            device=self.device)
        self.observation_spec = obs if isinstance(obs, Composite) else Composite(observation=obs, shape=bs)
        self.action_spec = space_to_spec(env.action_space, categorical_action_encoding=cae, batch_size=bs,
                                         device=self.device, name="action")
        self.reward_spec = Unbounded(shape=(*bs, 1), device=self.device)

    # ------------------------------------------------------------------ readers
    def read_action(self, action: Tensor) -> Any:
        """The action entry as the wrapped object takes it (a numpy array; one-hot → index)."""
        spec = self.action_spec
        if action.dtype == torch.bool or (spec.__class__.__name__ == "OneHot"):
            action = action.to(torch.int64).argmax(-1)
        a = action.detach().cpu().numpy()
        return a.item() if a.ndim == 0 and np.issubdtype(a.dtype, np.integer) else a

    def read_obs(self, observations: Any) -> dict:
        """``{key: value}`` of the observation (a dict is kept, anything else goes to ``"observation"``)."""
        if isinstance(observations, dict):
            return dict(observations)
        return {"observation": observations}

    def read_reward(self, reward: Any) -> Tensor:
        spec = self.reward_spec
        return torch.as_tensor(np.asarray(reward), dtype=spec.dtype).reshape(spec.shape)

    def read_done(self, terminated: Any = None, truncated: Any = None, done: Any = None) -> tuple:
        """``(terminated, truncated, done, any_done)`` as bool arrays."""
        te = np.asarray(False if terminated is None else terminated, dtype=bool)
        tr = np.asarray(False if truncated is None else truncated, dtype=bool)
        d = te | tr if done is None else np.asarray(done, dtype=bool)
        return te, tr, d, bool(d.any())

    def _obs_td(self, obs: Any) -> TensorDict:
        out = TensorDict({}, batch_size=self.batch_size, device=self.device)
        specs = self.full_observation_spec
        for k, v in self.read_obs(obs).items():
            spec = specs.get(k, None)
            if spec is None or isinstance(spec, Composite):
                continue
            if spec.__class__.__name__ == "OneHot":
                t = spec.encode(v)
            else:
                t = torch.as_tensor(np.asarray(v), dtype=spec.dtype).reshape(spec.shape)
            out.set(k, t)
        return out

    def _read_info(self, info: Any, td: TensorDictBase) -> None:
        if self._info_dict_reader and isinstance(info, dict):
            for reader in self._info_dict_reader:
                out = reader(info, td)
                if out is not None and out is not td:
                    td.update(out)

    # ------------------------------------------------------------------ env API
    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        if self._seed_next is not None and "seed" not in kwargs:
            kwargs["seed"] = self._seed_next
            self._seed_next = None
        try:
            res = self._env.reset(**kwargs)
        except TypeError:
            kwargs.pop("seed", None)
            res = self._env.reset(**kwargs)
        obs, info = (res if isinstance(res, tuple) and len(res) == 2 else (res, {}))
        td = self._obs_td(obs)
        self._read_info(info, td)
        return td

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = self.read_action(tensordict.get(self.action_key))
        res = self._env.step(action)
        if len(res) == 5:
            obs, reward, term, trunc, info = res
            te, tr, d, _ = self.read_done(term, trunc)
        elif len(res) == 4:
            obs, reward, done, info = res
            trunc = info.get("TimeLimit.truncated", False) if isinstance(info, dict) else False
            te, tr, d, _ = self.read_done(np.asarray(done) & ~np.asarray(trunc, dtype=bool), trunc, done)
        else:
            raise ValueError(f"{type(self).__name__}: the wrapped step returned {len(res)} values; expected "
                             "(obs, reward, terminated, truncated, info) or (obs, reward, done, info)")
        td = self._obs_td(obs)
        td.set("reward", self.read_reward(reward))
        flag_shape = self.full_done_spec["done"].shape
        for name, v in (("done", d), ("terminated", te), ("truncated", tr)):
            td.set(name, torch.as_tensor(v).reshape(flag_shape))
        self._read_info(info, td)
        return td

    def _set_seed(self, seed: int | None) -> None:
        self._seed_next = seed

    # ------------------------------------------------------------------ info readers
    def set_info_dict_reader(self, info_dict_reader: Callable | None = None,
                             ignore_private: bool = True) -> GymLikeEnv:
        """Adds a reader of the info dicts (default: a :class:`default_info_dict_reader` of
        every key) and adds its specs to the observation spec; returns the env.

        A reader without a known spec learns it from one reset and one random step (the
        env is reset again afterwards: call this before collecting)."""
        if info_dict_reader is None:
            info_dict_reader = default_info_dict_reader(ignore_private=ignore_private)
        if not callable(info_dict_reader):
            raise TypeError(f"set_info_dict_reader takes a callable (info, td) -> td, got "
                            f"{type(info_dict_reader).__name__}")
        self._info_dict_reader.append(info_dict_reader)
        spec = getattr(info_dict_reader, "info_spec", None)
        if spec is None:
            self.rand_step(self.reset())
            spec = getattr(info_dict_reader, "info_spec", None)
        if spec is not None:
            obs = self.full_observation_spec.clone()
            obs.unlock_()
            for k, s in spec.items(include_nested=True, leaves_only=True):
                if s.shape[: len(self.batch_size)] != self.batch_size:
                    s = s.expand(*self.batch_size, *s.shape)
                obs.set(k, s)
            self.observation_spec = obs
        return self

    def auto_register_info_dict(self, ignore_private: bool = True,
                                info_dict_reader: BaseInfoDictReader | None = None) -> GymLikeEnv:
        """Registers a reader of every info key (inferred from a reset and a step)."""
        return self.set_info_dict_reader(info_dict_reader, ignore_private=ignore_private)

    @property
    def info_dict_reader(self) -> list:
        """The registered info readers."""
        return self._info_dict_reader

    def _close(self) -> None:
        close = getattr(self._env, "close", None)
        if callable(close):
            close()
