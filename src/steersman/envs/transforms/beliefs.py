"""``MeanActionSelector`` (Gaussian-belief policies on plain envs) and ``PolicyAgeFilter``
(drops data of a behaviour policy that is too old, on replay-buffer writes and samples)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from steersman.data import Composite, Unbounded
from steersman.tensordict import TensorDictBase, is_tensor_collection
from steersman.tensordict._utils import NestedKey, unravel_key

from ._utils import missing_key
from .base import Transform

__all__ = ["MeanActionSelector", "PolicyAgeFilter"]


class MeanActionSelector(Transform):
    """Lets a policy over state beliefs (``(mean, covariance)`` pairs, as in PILCO) drive
    a plain env.

    * Outputs: the observation ``[*b, D]`` becomes ``(observation_key, "mean")`` (the same
      values) and ``(observation_key, "var")``, a zero covariance ``[*b, D, D]``: a
      deterministic belief.
    * Inputs: the policy writes ``(action_key, "mean")`` (and possibly a variance, ignored);
      the env receives the mean as its ``action_key``.

    Args:
        observation_key: the env's observation (default ``"observation"``).
        action_key: the env's action (default ``"action"``).

    Example:
        >>> import torch
        >>> from steersman.envs import PendulumEnv, TransformedEnv, check_env_specs
        >>> from steersman.envs.transforms import MeanActionSelector
        >>> env = TransformedEnv(PendulumEnv(seed=0), MeanActionSelector())
        >>> td = env.reset()
        >>> td["observation", "mean"].shape, td["observation", "var"].shape   # D = 3
        (torch.Size([3]), torch.Size([3, 3]))
        >>> list(env.full_action_spec.keys(True, True))
        [('action', 'mean')]
        >>> check_env_specs(env)
    """

    def __init__(self, observation_key: NestedKey = "observation", action_key: NestedKey = "action") -> None:
        self._observation_key = unravel_key(observation_key)
        self._action_key = unravel_key(action_key)
        ok = (self._observation_key,) if isinstance(self._observation_key, str) else self._observation_key
        ak = (self._action_key,) if isinstance(self._action_key, str) else self._action_key
        super().__init__(in_keys=[self._observation_key], out_keys=[(*ok, "mean"), (*ok, "var")],
                         in_keys_inv=[self._action_key], out_keys_inv=[(*ak, "mean")])

    @property
    def _pairs(self) -> list:  # one input, two outputs: no key-wise pairing
        return []

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        obs = tensordict.get(self._observation_key, None)
        if obs is None:
            raise missing_key(self, self._observation_key, tensordict)
        if is_tensor_collection(obs):  # already a belief
            return tensordict
        tensordict.del_(self._observation_key)
        tensordict.set(self.out_keys[0], obs)
        d = obs.shape[-1]
        tensordict.set(self.out_keys[1], obs.new_zeros(*obs.shape, d))
        return tensordict

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        return self._call(tensordict_reset)

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        mean = tensordict.get(self.out_keys_inv[0], None)
        if mean is None:
            raise missing_key(self, self.out_keys_inv[0], tensordict, "out_keys_inv")
        tensordict.set(self._action_key, mean)
        return tensordict

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        spec = observation_spec[self._observation_key]
        if isinstance(spec, Composite):
            return observation_spec
        d = spec.shape[-1]
        del observation_spec[self._observation_key]
        observation_spec[self._observation_key] = Composite(
            mean=spec.clone(), var=Unbounded(shape=(*spec.shape, d), dtype=spec.dtype, device=spec.device),
            shape=observation_spec.shape)
        return observation_spec

    def transform_action_spec(self, action_spec: Composite) -> Composite:
        spec = action_spec[self._action_key]
        del action_spec[self._action_key]
        action_spec[self._action_key] = Composite(mean=spec.clone(), shape=action_spec.shape)
        return action_spec

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        self._call(tensordict)
        nxt = tensordict.get("next", None)
        if nxt is not None and is_tensor_collection(nxt) and self._observation_key in nxt.keys(True):
            self._call(nxt)
        return tensordict


class PolicyAgeFilter(Transform):
    """Drops the elements whose behaviour-policy version lags the live one by more than
    ``max_policy_lag``: on replay-buffer writes (``inv``: stale data never enters) and on
    samples (``forward``: data that went stale since it was written is dropped, so a batch
    may be smaller than asked). In an env it changes nothing (env data comes from the live
    policy).

    Args:
        current_version: the live version, an int or a callable returning it (called on
            every filtering pass, e.g. ``lambda: collector.policy_version``).
        max_policy_lag: the largest ``current_version - stamped_version`` kept.
        policy_version_key: the stamped version entry (default ``"policy_version"``), one
            value per element (trailing singleton dims allowed).
        strict: data without the entry raises a ``KeyError`` (default: passes unfiltered,
            with one warning).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.data import LazyTensorStorage, ReplayBuffer
        >>> from steersman.envs.transforms import PolicyAgeFilter
        >>> version = 3
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(10),
        ...                   transform=PolicyAgeFilter(lambda: version, max_policy_lag=1))
        >>> data = TensorDict(observation=torch.randn(4, 3), policy_version=torch.tensor([0, 2, 2, 3]),
        ...                   batch_size=[4])
        >>> _ = rb.extend(data)       # version 0 is too old
        >>> len(rb)
        3
        >>> version = 4               # the two version-2 elements are now too old
        >>> _ = torch.manual_seed(0)  # (a sample of 8 drawn from 3 elements)
        >>> rb.sample(8)["policy_version"].unique().tolist()
        [3]
    """

    def __init__(self, current_version: int | Callable[[], int], max_policy_lag: int, *,
                 policy_version_key: NestedKey = "policy_version", strict: bool = False) -> None:
        super().__init__()
        if not callable(current_version) and (isinstance(current_version, bool)
                                              or not isinstance(current_version, int)):
            raise TypeError(f"PolicyAgeFilter: current_version must be an int or a callable, got {current_version!r}")
        if isinstance(max_policy_lag, bool) or not isinstance(max_policy_lag, int) or max_policy_lag < 0:
            raise ValueError(f"PolicyAgeFilter: max_policy_lag must be an int >= 0, got {max_policy_lag!r}")
        self.current_version = current_version
        self.max_policy_lag = max_policy_lag
        self.policy_version_key = unravel_key(policy_version_key)
        self.strict = bool(strict)
        self._warned = False

    def _resolve_current_version(self) -> int:
        v = self.current_version() if callable(self.current_version) else self.current_version
        return int(v)

    def _filter(self, data: Any) -> Any:
        if not is_tensor_collection(data):
            return data
        ver = data.get(self.policy_version_key, None)
        if ver is None:
            if self.strict:
                raise missing_key(self, self.policy_version_key, data, "policy_version_key")
            if not self._warned:
                self._warned = True
                warnings.warn(f"PolicyAgeFilter: the data has no {self.policy_version_key!r} entry; "
                              "it passes unfiltered", stacklevel=3)
            return data
        if data.batch_dims == 0:
            raise ValueError("PolicyAgeFilter filters elements along the batch dims; got a TensorDict with "
                             "batch_size []")
        bs = data.batch_size
        if tuple(ver.shape[:len(bs)]) != tuple(bs) or ver[(0,) * len(bs)].numel() != 1:
            raise ValueError(f"PolicyAgeFilter: {self.policy_version_key!r} must hold one version per element "
                             f"(shape {list(bs)}), got {list(ver.shape)}")
        keep = (self._resolve_current_version() - ver.reshape(bs)) <= self.max_policy_lag
        if bool(keep.all()):
            return data
        return data[keep]

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._filter(tensordict)

    def inv(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._filter(tensordict)

    @property
    def _has_inv(self) -> bool:
        return False  # no-op in an env

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        return next_tensordict

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._filter(tensordict)

    def __repr__(self) -> str:
        return f"PolicyAgeFilter(max_policy_lag={self.max_policy_lag}, policy_version_key={self.policy_version_key!r})"



