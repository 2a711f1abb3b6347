"""Timer: wall-clock time of the env's steps, of the policy between steps, and of resets."""

from __future__ import annotations

import time
from typing import Any

import torch

from steersman.data import Composite, Unbounded
from steersman.tensordict import TensorDictBase

from ._utils import key_list
from .base import Transform

__all__ = ["Timer"]


class Timer(Transform):
    """Writes how long steps, the policy and resets take, in seconds.

    Args:
        out_keys: the three entries ``[step, policy, reset]`` (default
            ``["time_step", "time_policy", "time_reset"]`` from ``time_key``).
        time_key: the prefix of the default keys (default ``"time"``).

    Each entry is an observation of the default float dtype and shape ``[*batch]``.
    A step writes under ``"next"`` the time the wrapped env took to step (``time_step``),
    the time since the previous outputs were produced, i.e. the policy's
    (``time_policy``), and ``time_reset = 0``. A reset writes its own duration at the
    root (``time_reset``) with ``time_step = time_policy = 0``. Outside an env,
    ``forward`` returns the data unchanged.

    The reset duration is measured from the moment the transformed env starts handling
    a reset input (``env.reset(td)``, e.g. the partial resets of rollouts and
    collectors); a reset called without a TensorDict (``env.reset()``) reports 0.

    Example:
        >>> import torch
        >>> from steersman.envs import PendulumEnv, check_env_specs
        >>> from steersman.envs.transforms import Timer, TransformedEnv
        >>> env = TransformedEnv(PendulumEnv(seed=0), Timer())
        >>> check_env_specs(env)
        >>> td = env.rollout(3)
        >>> bool((td["next", "time_step"] > 0).all()), bool((td["next", "time_reset"] == 0).all())
        (True, True)
    """

    _check_spec_in_keys = False

    def __init__(self, out_keys: Any = None, time_key: str = "time") -> None:
        if not isinstance(time_key, str):
            raise TypeError(f"Timer: time_key must be a string, got {time_key!r}")
        keys = [f"{time_key}_step", f"{time_key}_policy", f"{time_key}_reset"] if out_keys is None else out_keys
        keys = key_list(keys, "Timer", "out_keys")
        if len(keys) != 3:
            raise ValueError(f"Timer: out_keys must be three keys [step, policy, reset], got {keys}")
        super().__init__()
        self.__dict__["_timer_keys"] = keys
        self.time_key = time_key
        self.__dict__["_last_out"] = None  # when the last outputs (reset or step) were produced
        self.__dict__["_last_in"] = None  # when the last action reached the env
        self.__dict__["_reset_start"] = None

    @property
    def out_keys(self) -> list:  # type: ignore[override]
        return list(self.__dict__.get("_timer_keys", []))

    @out_keys.setter
    def out_keys(self, keys: Any) -> None:
        pass

    def _full(self, td: TensorDictBase, value: float) -> torch.Tensor:
        return torch.full(td.batch_size, value, dtype=torch.get_default_dtype(), device=td.device)

    def _reset_env_preprocess(self, tensordict: TensorDictBase) -> TensorDictBase:
        self.__dict__["_reset_start"] = time.perf_counter()
        return tensordict

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        now = time.perf_counter()
        start = self.__dict__["_reset_start"]
        k_step, k_policy, k_reset = self.out_keys
        tensordict_reset.set(k_reset, self._full(tensordict_reset, 0.0 if start is None else now - start))
        tensordict_reset.set(k_step, self._full(tensordict_reset, 0.0))
        tensordict_reset.set(k_policy, self._full(tensordict_reset, 0.0))
        self.__dict__["_reset_start"] = None
        self.__dict__["_last_out"] = time.perf_counter()
        return tensordict_reset

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        self.__dict__["_last_in"] = time.perf_counter()
        return tensordict

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        now = time.perf_counter()
        t_in, t_out = self.__dict__["_last_in"], self.__dict__["_last_out"]
        k_step, k_policy, k_reset = self.out_keys
        step = 0.0 if t_in is None else now - t_in
        policy = 0.0 if t_in is None or t_out is None else t_in - t_out
        next_tensordict.set(k_step, self._full(next_tensordict, step))
        next_tensordict.set(k_policy, self._full(next_tensordict, policy))
        next_tensordict.set(k_reset, self._full(next_tensordict, 0.0))
        self.__dict__["_last_out"] = time.perf_counter()
        return next_tensordict

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        obs = output_spec["full_observation_spec"]
        for k in self.out_keys:
            obs.set(k, Unbounded(shape=obs.shape, device=obs.device, dtype=torch.get_default_dtype()))
        return output_spec

    def __repr__(self) -> str:
        return f"Timer(out_keys={self.out_keys})"
