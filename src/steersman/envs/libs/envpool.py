"""EnvPool: many envs stepped by C++ threads, as one batched steersman env.

``pip install 'steersman[envpool]'`` (EnvPool publishes Linux x86-64 wheels; 1.2.5
installs on CPython 3.11, the version tested here). Imported lazily: importing this module does not import
envpool; building an env does (an ``ImportError`` naming the extra if it is missing).

* :class:`MultiThreadedEnv` ``(num_workers, env_name, create_env_kwargs=None, ...)``:
  ``envpool.make(env_name, env_type="gymnasium", num_envs=num_workers, ...)``, batch
  size ``[num_workers]`` (TorchRL's name and arguments).
* :class:`MultiThreadedEnvWrapper` ``(env)``: an env built with ``envpool.make(...,
  env_type="gymnasium")`` (synchronous: ``batch_size`` equal to ``num_envs``).

Specs come from the Gymnasium spaces (as :class:`~steersman.envs.libs.GymEnv`; discrete
actions as indices, :class:`~steersman.data.Categorical`, as in TorchRL). Finished
sub-envs are reset by ``reset(td)`` with a ``"_reset"`` mask (what collectors and
``rollout`` do); a finished sub-env stepped without that reset is reset first, so
EnvPool's own auto-reset step (which ignores its action) is never taken.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from steersman.data import Composite, Unbounded
from steersman.tensordict import TensorDict, TensorDictBase

from ..common import EnvBase
from .gym import space_to_spec

__all__ = ["MultiThreadedEnv", "MultiThreadedEnvWrapper", "ENVPOOL_EXTRA_HINT"]

ENVPOOL_EXTRA_HINT = "pip install 'steersman[envpool]' (or pip install envpool)"


def _import_envpool() -> Any:
    try:
        import envpool
    except ImportError as err:
        raise ImportError(f"MultiThreadedEnv needs the 'envpool' package: {ENVPOOL_EXTRA_HINT}") from err
    return envpool


class MultiThreadedEnvWrapper(EnvBase):
    """An EnvPool env (made with ``env_type="gymnasium"``) as a steersman env of batch size
    ``[num_envs]``.

    Args:
        env: ``envpool.make(task_id, env_type="gymnasium", num_envs=n, ...)`` (synchronous).
        categorical_action_encoding: discrete actions as indices (default True, as
            TorchRL's ``MultiThreadedEnv``); False for one-hot actions.
        device: where the output tensors live.
        check: refuse actions outside the action spec (see :class:`~steersman.envs.EnvBase`).

    Observation keys: ``"observation"`` (dict observation spaces: their keys).
    ``env.env`` is the EnvPool env. EnvPool is seeded when it is made (``seed=``):
    :meth:`set_seed` on a wrapper raises; :class:`MultiThreadedEnv` rebuilds the pool.

    Example:
        >>> import envpool
        >>> from steersman.envs.libs.envpool import MultiThreadedEnvWrapper
        >>> env = MultiThreadedEnvWrapper(envpool.make("CartPole-v1", env_type="gymnasium", num_envs=4))
        >>> env.rollout(10, break_when_any_done=False).batch_size  # (unseeded pool: an episode may end early)
        torch.Size([4, 10])
    """

    _handles_partial_reset = True

    def __init__(self, env: Any = None, *, categorical_action_encoding: bool = True, device: Any = None,
                 check: bool = True) -> None:
        _import_envpool()
        if env is None or not hasattr(getattr(env, "spec", None), "config"):
            raise TypeError(f"MultiThreadedEnvWrapper expects an envpool env (envpool.make(..., "
                            f"env_type='gymnasium')), got {type(env).__name__}")
        cfg = env.spec.config
        if int(cfg.batch_size) != int(cfg.num_envs):
            raise ValueError(f"MultiThreadedEnvWrapper needs a synchronous pool: batch_size={cfg.batch_size} "
                             f"!= num_envs={cfg.num_envs} (make it with batch_size=num_envs or without batch_size)")
        super().__init__(device=device, batch_size=[int(cfg.num_envs)], check=check)
        self.categorical_action_encoding = bool(categorical_action_encoding)
        self._set_env(env)

    def _set_env(self, env: Any) -> None:
        self._env = env
        self.num_workers = int(env.spec.config.num_envs)
        bs, dev, cae = tuple(self.batch_size), self.device, self.categorical_action_encoding
        with warnings.catch_warnings():  # EnvPool builds float32 Boxes from float64 bounds: Gymnasium warns
            warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")
            obs_space, act_space = env.observation_space, env.action_space
        ospec = space_to_spec(obs_space, categorical_action_encoding=cae, batch_size=bs, device=dev)
        self._obs_dict = isinstance(ospec, Composite)
        self.observation_spec = ospec if self._obs_dict else Composite(observation=ospec, shape=bs, device=dev)
        self.action_spec = space_to_spec(act_space, categorical_action_encoding=cae, batch_size=bs,
                                         device=dev, name="action")
        self.reward_spec = Unbounded(shape=(*bs, 1), device=dev, dtype=torch.float32)
        self._onehot = not cae and self.action_spec.dtype == torch.bool
        self._act_dtype = act_space.dtype
        self._finished = np.zeros(self.num_workers, dtype=bool)
        self._obs = None  # the last observations, returned for sub-envs a partial reset leaves alone

    @property
    def env(self) -> Any:
        return self._env

    def _set_seed(self, seed: int | None) -> None:
        raise RuntimeError("MultiThreadedEnvWrapper: an EnvPool env is seeded when it is made "
                           "(envpool.make(..., seed=s)); MultiThreadedEnv(..., seed=s) or its set_seed rebuild it")

    def _observations(self, obs: Any, ids: np.ndarray) -> dict[str, torch.Tensor]:
        """Full-batch observation tensors, rows ``ids`` taken from ``obs``."""
        items = obs.items() if self._obs_dict else [("observation", obs)]
        out = {}
        for key, value in items:
            new = torch.as_tensor(np.asarray(value)).to(self.observation_spec[key].dtype)
            if self._obs is not None and len(ids) < self.num_workers:
                full = self._obs[key].clone()
                full[torch.as_tensor(ids, dtype=torch.long)] = new
                new = full
            out[key] = new
        return out

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        mask = self._reset_mask(tensordict)
        ids = np.arange(self.num_workers) if mask is None or self._obs is None else np.flatnonzero(mask.cpu().numpy())
        if len(ids):
            obs, info = self._env.reset(ids.astype(np.int32))
            order = np.argsort(info["env_id"])  # rows in the order of ids
            obs = {k: np.asarray(v)[order] for k, v in obs.items()} if self._obs_dict else np.asarray(obs)[order]
            self._obs = self._observations(obs, np.sort(ids))
            self._finished[ids] = False
        flags = torch.zeros(*self.batch_size, 1, dtype=torch.bool)
        out = {key: v.clone() for key, v in self._obs.items()}
        out.update(done=flags, terminated=flags.clone(), truncated=flags.clone())
        return TensorDict(out, batch_size=self.batch_size).to(self.device)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if self._finished.any():  # stepped without a reset: reset those sub-envs first
            self._reset(TensorDict({"_reset": torch.as_tensor(self._finished.copy())}, batch_size=self.batch_size))
        action = tensordict.get("action").detach().cpu()
        if self._onehot:
            action = action.long().argmax(-1)
        obs, reward, terminated, truncated, info = self._env.step(action.numpy().astype(self._act_dtype))
        order = np.argsort(info["env_id"])
        if self._obs_dict:
            obs = {k: np.asarray(v)[order] for k, v in obs.items()}
        else:
            obs = np.asarray(obs)[order]
        self._obs = self._observations(obs, np.arange(self.num_workers))
        term = torch.as_tensor(np.asarray(terminated)[order], dtype=torch.bool).unsqueeze(-1)
        trunc = torch.as_tensor(np.asarray(truncated)[order], dtype=torch.bool).unsqueeze(-1) & ~term
        self._finished = (term | trunc).squeeze(-1).numpy().copy()
        out = {key: v.clone() for key, v in self._obs.items()}
        out.update(reward=torch.as_tensor(np.asarray(reward)[order], dtype=torch.float32).unsqueeze(-1),
                   done=term | trunc, terminated=term, truncated=trunc)
        return TensorDict(out, batch_size=self.batch_size).to(self.device)

    def _close(self) -> None:
        close = getattr(self._env, "close", None)
        if close is not None:
            close()

    def __repr__(self) -> str:
        name = getattr(self, "env_name", type(self._env).__name__)
        return f"{type(self).__name__}(env={name!r}, batch_size={list(self.batch_size)})"


class MultiThreadedEnv(MultiThreadedEnvWrapper):
    """``num_workers`` copies of an EnvPool task stepped by C++ threads, batch size ``[num_workers]``.

    Args:
        num_workers: number of envs (the batch size).
        env_name: an EnvPool task id (``"CartPole-v1"``, ``"Pong-v5"``, ``"HalfCheetah-v4"``;
            ``envpool.list_all_envs()`` lists them).
        create_env_kwargs: more ``envpool.make`` arguments (``{"episodic_life": True}``).
        num_threads: EnvPool's thread count (default: EnvPool's, one per env up to the cores).
        seed: the pool's seed (each sub-env gets ``seed + i``); None: drawn from torch's RNG.
        categorical_action_encoding / device / check: see :class:`MultiThreadedEnvWrapper`.

    Example:
        >>> from steersman.envs.libs.envpool import MultiThreadedEnv
        >>> env = MultiThreadedEnv(4, "CartPole-v1", seed=0)
        >>> env.observation_spec["observation"].shape, env.action_spec
        (torch.Size([4, 4]), Categorical(shape=[4], n=2, device=cpu, dtype=torch.int64, domain=discrete))
        >>> env.rollout(100, break_when_any_done=False)["next", "reward"].shape
        torch.Size([4, 100, 1])
    """

    def __init__(self, num_workers: int, env_name: str, create_env_kwargs: dict | None = None, *,
                 num_threads: int | None = None, seed: int | None = None,
                 categorical_action_encoding: bool = True, device: Any = None, check: bool = True) -> None:
        if int(num_workers) < 1:
            raise ValueError(f"MultiThreadedEnv: num_workers must be >= 1, got {num_workers}")
        self.env_name = str(env_name)
        self.create_env_kwargs = dict(create_env_kwargs or {})
        self.num_threads = num_threads
        super().__init__(self._build(int(num_workers), seed), categorical_action_encoding=categorical_action_encoding,
                         device=device, check=check)

    def _build(self, num_workers: int, seed: int | None) -> Any:
        envpool = _import_envpool()
        if seed is None:
            seed = int(torch.randint(0, 2**31 - 1, ()).item())
        kwargs = dict(self.create_env_kwargs)
        if self.num_threads is not None:
            kwargs["num_threads"] = int(self.num_threads)
        if self.env_name not in envpool.list_all_envs():
            raise ValueError(f"MultiThreadedEnv: unknown EnvPool task {self.env_name!r}; "
                             "envpool.list_all_envs() lists them")
        return envpool.make(self.env_name, env_type="gymnasium", num_envs=num_workers, seed=int(seed), **kwargs)

    def _set_seed(self, seed: int | None) -> None:
        self._env.close()
        self._set_env(self._build(self.num_workers, seed))
