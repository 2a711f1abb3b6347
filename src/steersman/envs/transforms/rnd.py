"""Random Network Distillation: ``RunningMeanStd`` (running statistics) and ``RNDTransform``
(an intrinsic exploration reward written at every step)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from steersman.data import Composite, Unbounded
from steersman.tensordict import TensorDictBase, is_tensor_collection

from ._utils import missing_key
from .base import Transform

__all__ = ["RunningMeanStd", "RNDTransform"]


class RunningMeanStd(nn.Module):
    """Running mean and variance of a stream of batches (Chan et al.'s parallel update).

    The statistics are buffers: they are in ``state_dict()`` and follow ``.to(device)``.

    Args:
        shape: the feature shape (``(obs_dim,)``, or ``()`` for scalars). Every leading
            dim of an update is a batch dim.
        epsilon: the initial count (keeps the first merge well defined).

    Example:
        >>> import torch
        >>> from steersman.envs.transforms import RunningMeanStd
        >>> rms = RunningMeanStd(shape=(2,), epsilon=0.0)   # no prior count
        >>> rms.update(torch.tensor([[0.0, 10.0], [2.0, 30.0]]))
        >>> rms.mean.round(decimals=2), rms.var.round(decimals=2)
        (tensor([ 1., 20.]), tensor([  1., 100.]))
        >>> rms.normalize(torch.tensor([[1.0, 30.0]])).round(decimals=2)   # [1, 2]
        tensor([[0., 1.]])
    """

    def __init__(self, shape: tuple = (), epsilon: float = 1e-4) -> None:
        super().__init__()
        shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list, torch.Size)) else (shape,)))
        if epsilon < 0:
            raise ValueError(f"RunningMeanStd: epsilon must be >= 0, got {epsilon}")
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("var", torch.ones(shape))
        self.register_buffer("count", torch.tensor(float(epsilon)))

    def update(self, x: Tensor) -> None:
        """Merges the batch ``x`` (``[..., *shape]``) into the statistics."""
        shape = self.mean.shape
        if tuple(x.shape[x.ndim - len(shape):]) != tuple(shape) or x.ndim < len(shape):
            raise ValueError(f"RunningMeanStd.update: expected a batch of shape [..., {', '.join(map(str, shape))}], "
                             f"got {list(x.shape)}")
        x = x.detach().to(self.mean.dtype).reshape(-1, *shape)
        n = x.shape[0]
        if n == 0:
            return
        bmean = x.mean(0)
        bvar = x.var(0, unbiased=False) if n > 1 else torch.zeros_like(bmean)
        delta = bmean - self.mean
        tot = self.count + n
        m2 = self.var * self.count + bvar * n + delta.pow(2) * self.count * n / tot
        self.mean.add_(delta * (n / tot))
        self.var.copy_(m2 / tot)
        self.count.copy_(tot)

    def normalize(self, x: Tensor) -> Tensor:
        """``(x - mean) / std`` (float; the std is at least ``1e-4``)."""
        return (x.to(self.mean.dtype) - self.mean) / self.var.clamp_min(1e-8).sqrt()

    def extra_repr(self) -> str:
        return f"shape={tuple(self.mean.shape)}, count={float(self.count):.4g}"


class RNDTransform(Transform):
    """Writes the Random Network Distillation bonus (Burda et al., 2018) at every step.

    For each step: the next observation is normalized by running statistics and clipped to
    ``[-obs_clip, obs_clip]`` (``normalize_obs``), fed to the frozen ``target_network`` and
    to the ``predictor_network``, and the mean squared difference of their outputs (over the
    last dim) is the intrinsic reward ``[*batch, 1]``, divided by its running std and
    clipped to ``[-reward_clip, reward_clip]`` (``normalize_reward``). The statistics update
    on every env step; everything runs under ``no_grad`` (the predictor is trained by a
    loss, e.g. ``RNDLoss``). The entry joins the reward spec.

    Outside an env, ``forward`` computes the bonus of the TensorDict's next observations
    (under ``"next"`` when present) with the current statistics, without updating them.

    Args:
        target_network: the fixed random network (its parameters are frozen here).
        predictor_network: the network trained to match it.
        in_keys: the observation (default ``["observation"]``).
        out_keys: the intrinsic reward entry (default ``["intrinsic_reward"]``).
        normalize_obs, normalize_reward, obs_clip, reward_clip: see above.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from steersman.envs import CartPoleEnv, TransformedEnv, check_env_specs
        >>> from steersman.envs.transforms import RNDTransform
        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> env = TransformedEnv(CartPoleEnv(seed=0), RNDTransform(nn.Linear(4, 8), nn.Linear(4, 8)))
        >>> td = env.rollout(3)
        >>> td["next", "intrinsic_reward"].shape, bool((td["next", "intrinsic_reward"] >= 0).all())
        (torch.Size([3, 1]), True)
        >>> check_env_specs(env)
    """

    _check_spec_in_keys = True

    def __init__(self, target_network: nn.Module, predictor_network: nn.Module, in_keys: Any = None,
                 out_keys: Any = None, normalize_obs: bool = True, normalize_reward: bool = True,
                 obs_clip: float = 5.0, reward_clip: float = 5.0) -> None:
        if not isinstance(target_network, nn.Module) or not isinstance(predictor_network, nn.Module):
            raise TypeError("RNDTransform: target_network and predictor_network must be nn.Modules, got "
                            f"{type(target_network).__name__} and {type(predictor_network).__name__}")
        super().__init__(["observation"] if in_keys is None else in_keys,
                         ["intrinsic_reward"] if out_keys is None else out_keys)
        if len(self.in_keys) != 1 or len(self.out_keys) != 1:
            raise ValueError(f"RNDTransform reads one observation and writes one reward, got in_keys={self.in_keys}, "
                             f"out_keys={self.out_keys}")
        if obs_clip <= 0 or reward_clip <= 0:
            raise ValueError(f"RNDTransform: obs_clip and reward_clip must be > 0, got {obs_clip}, {reward_clip}")
        self.target_network = target_network
        self.predictor_network = predictor_network
        for p in self.target_network.parameters():
            p.requires_grad_(False)
        self.normalize_obs = bool(normalize_obs)
        self.normalize_reward = bool(normalize_reward)
        self.obs_clip = float(obs_clip)
        self.reward_clip = float(reward_clip)
        self._obs_rms: RunningMeanStd | None = None
        self._reward_rms: RunningMeanStd | None = RunningMeanStd(shape=()) if self.normalize_reward else None

    @property
    def obs_rms(self) -> RunningMeanStd | None:
        """The observation statistics (created at the first step; None without ``normalize_obs``)."""
        return self._obs_rms

    @property
    def reward_rms(self) -> RunningMeanStd | None:
        """The intrinsic-reward statistics (None without ``normalize_reward``)."""
        return self._reward_rms

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any, **kwargs: Any) -> None:
        key = prefix + "_obs_rms.mean"
        if self.normalize_obs and self._obs_rms is None and key in state_dict:
            self._obs_rms = RunningMeanStd(shape=tuple(state_dict[key].shape)).to(state_dict[key].device)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _bonus(self, obs: Tensor, update: bool) -> Tensor:
        with torch.no_grad():
            x = obs.to(torch.get_default_dtype()) if not obs.is_floating_point() else obs
            if self.normalize_obs:
                if self._obs_rms is None:
                    self._obs_rms = RunningMeanStd(shape=tuple(x.shape[-1:])).to(x.device)
                if update:
                    self._obs_rms.update(x)
                x = self._obs_rms.normalize(x).clamp(-self.obs_clip, self.obs_clip)
            x = x.to(next(self.predictor_network.parameters(), x).dtype)
            err = (self.predictor_network(x) - self.target_network(x)).pow(2).mean(-1, keepdim=True)
            if self._reward_rms is not None:
                if update:
                    self._reward_rms.update(err)
                err = (err / self._reward_rms.var.clamp_min(1e-8).sqrt()).clamp(-self.reward_clip, self.reward_clip)
        return err

    def _compute(self, td: TensorDictBase, update: bool) -> TensorDictBase:
        obs = td.get(self.in_keys[0], None)
        if obs is None:
            raise missing_key(self, self.in_keys[0], td)
        td.set(self.out_keys[0], self._bonus(obs, update))
        return td

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        return self._compute(next_tensordict, True)

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        nxt = tensordict.get("next", None)
        if nxt is not None and is_tensor_collection(nxt):
            self._compute(nxt, False)
            return tensordict
        return self._compute(tensordict, False)

    def transform_reward_spec(self, reward_spec: Composite) -> Composite:
        shape = (*reward_spec.shape, 1)
        leaves = [s for _, s in reward_spec.items(include_nested=True, leaves_only=True)]
        if leaves:
            shape = leaves[0].shape
        reward_spec.set(self.out_keys[0], Unbounded(shape=shape, dtype=torch.get_default_dtype(),
                                                    device=reward_spec.device))
        return reward_spec

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        return observation_spec
