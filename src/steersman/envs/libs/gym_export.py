"""steersman envs as Gymnasium envs: :func:`to_gymnasium`.

An env of batch size ``[]`` becomes a ``gymnasium.Env`` (:class:`GymnasiumExport`); an
env of batch size ``[n]`` becomes a ``gymnasium.vector.VectorEnv`` of ``n`` sub-envs
(:class:`GymnasiumVectorExport`). Spaces come from the specs (:func:`spec_to_space`),
values cross as numpy arrays (observations are copies), rewards as Python floats.

This module imports Gymnasium; ``steersman.envs.libs`` loads it on first use, so that
importing ``steersman.envs`` does not need Gymnasium (``pip install 'steersman[gym]'``).

Example:
    >>> from gymnasium.utils.env_checker import check_env
    >>> from steersman.envs.libs import GymEnv, to_gymnasium
    >>> genv = to_gymnasium(GymEnv("MountainCarContinuous-v0"))
    >>> genv.observation_space, genv.action_space
    (Box([-1.2  -0.07], [0.6  0.07], (2,), float32), Box(-1.0, 1.0, (1,), float32))
    >>> obs, info = genv.reset(seed=0)
    >>> obs.shape, obs.dtype
    ((2,), dtype('float32'))
    >>> obs, reward, terminated, truncated, info = genv.step(genv.action_space.sample())
    >>> type(reward).__name__, terminated, truncated
    ('float', False, False)
    >>> check_env(genv, skip_render_check=True)
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from steersman.data import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    MultiOneHot,
    NonTensor,
    OneHot,
    TensorSpec,
    Unbounded,
)
from steersman.tensordict import TensorDictBase

from ..common import EnvBase
from ..utils import step_mdp

__all__ = ["to_gymnasium", "spec_to_space", "GymnasiumExport", "GymnasiumVectorExport"]


def _np_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty(0, dtype=dtype).numpy().dtype


def spec_to_space(spec: TensorSpec, *, name: str = "spec") -> gym.spaces.Space:
    """The Gymnasium space of an (unbatched) spec: the inverse of
    :func:`~steersman.envs.libs.space_to_spec`.

    ``OneHot``/``Categorical`` -> ``Discrete`` (``MultiDiscrete`` when shaped),
    ``MultiOneHot``/``MultiCategorical`` -> ``MultiDiscrete``, ``Binary`` ->
    ``MultiBinary``, ``Bounded``/``Unbounded`` -> ``Box`` (dtype kept), ``Composite`` ->
    ``Dict``. Anything else raises a ``TypeError`` naming the spec.

    Example:
        >>> from steersman.data import Bounded, Composite, OneHot
        >>> from steersman.envs.libs import spec_to_space
        >>> spec_to_space(OneHot(3))
        Discrete(3)
        >>> spec_to_space(Composite(x=Bounded(-1.0, 1.0, shape=(2,))))
        Dict('x': Box(-1.0, 1.0, (2,), float32))
    """
    if isinstance(spec, Composite):
        return gym.spaces.Dict(
            {str(k): spec_to_space(v, name=f"{name}.{k}") for k, v in spec.items()}
        )
    if isinstance(spec, OneHot):
        if len(spec.shape) == 1:
            return gym.spaces.Discrete(spec.n)
        return gym.spaces.MultiDiscrete(np.full(tuple(spec.shape[:-1]), spec.n, dtype=np.int64))
    if isinstance(spec, Categorical):
        if spec.dtype == torch.bool:
            return gym.spaces.MultiBinary(list(spec.shape)) if spec.shape else gym.spaces.Discrete(2)
        if not spec.shape:
            return gym.spaces.Discrete(spec.n)
        return gym.spaces.MultiDiscrete(np.full(tuple(spec.shape), spec.n, dtype=np.int64))
    if isinstance(spec, MultiOneHot):
        return gym.spaces.MultiDiscrete(np.asarray(spec.nvec, dtype=np.int64))
    if isinstance(spec, MultiCategorical):
        return gym.spaces.MultiDiscrete(spec.nvec.cpu().numpy().astype(np.int64))
    if isinstance(spec, Binary):
        shape = tuple(spec.shape)
        return gym.spaces.MultiBinary(shape[0] if len(shape) == 1 else list(shape))
    if isinstance(spec, Bounded):
        dt = _np_dtype(spec.dtype)
        return gym.spaces.Box(
            spec.low.cpu().numpy().astype(dt), spec.high.cpu().numpy().astype(dt),
            shape=tuple(spec.shape), dtype=dt,
        )
    if isinstance(spec, Unbounded):
        dt = _np_dtype(spec.dtype)
        if np.issubdtype(dt, np.floating):
            lo, hi = -np.inf, np.inf
        else:
            info = np.iinfo(dt)
            lo, hi = info.min, info.max
        return gym.spaces.Box(lo, hi, shape=tuple(spec.shape), dtype=dt)
    kind = "NonTensor" if isinstance(spec, NonTensor) else type(spec).__name__
    raise TypeError(f"to_gymnasium: no Gymnasium space for the {kind} spec at {name!r}: {spec!r}")


def _unbatched(spec: TensorSpec, nb: int) -> TensorSpec:
    for _ in range(nb):
        spec = spec[0]
    return spec


class _Codec:
    """Converts between a steersman env's TensorDicts and Gymnasium values."""

    def __init__(self, env: EnvBase) -> None:
        nb = len(env.batch_size)
        obs = env.full_observation_spec
        leaves = list(obs.keys(include_nested=True, leaves_only=True))
        if not leaves:
            raise ValueError(f"to_gymnasium: {type(env).__name__} declares no observation")
        # one leaf -> that space itself, else a Dict
        self.obs_key = leaves[0] if len(leaves) == 1 else None
        self.obs_spec = obs[self.obs_key] if self.obs_key is not None else obs
        self.single_obs_space = spec_to_space(_unbatched(self.obs_spec, nb), name="observation")
        act = env.full_action_spec
        akeys = list(act.keys(include_nested=True, leaves_only=True))
        self.act_key = akeys[0] if len(akeys) == 1 else None
        self.act_spec = act[self.act_key] if self.act_key is not None else act
        self.single_act_space = spec_to_space(_unbatched(self.act_spec, nb), name="action")
        self.reward_key = env.reward_key
        dkeys = env.done_keys
        self.term_key = "terminated" if "terminated" in dkeys else "done"
        self.trunc_key = "truncated" if "truncated" in dkeys else None
        self.keys = dict(
            reward_keys=env.reward_keys, done_keys=dkeys, action_keys=env.action_keys,
        )

    def obs(self, td: TensorDictBase) -> Any:
        if self.obs_key is not None:
            return self._leaf_np(self.obs_spec, td.get(self.obs_key))
        return self._composite_np(self.obs_spec, td)

    def _composite_np(self, spec: Composite, td: TensorDictBase) -> dict:
        out = {}
        for k, sub in spec.items():
            if isinstance(sub, Composite):
                out[k] = self._composite_np(sub, td.get(k))
            else:
                out[k] = self._leaf_np(sub, td.get(k))
        return out

    @staticmethod
    def _leaf_np(spec: TensorSpec, val: Tensor) -> Any:
        arr = spec.to_numpy(val)
        if arr.ndim == 0:
            return arr.dtype.type(arr)  # np.int64(3), np.float32(0.5): Gymnasium's scalars
        return np.array(arr, copy=True)

    def action(self, action: Any, env: EnvBase, td: TensorDictBase) -> None:
        if self.act_key is not None:
            td.set(self.act_key, self.act_spec.encode(action))
        else:
            td.update(self.act_spec.encode(action))


class GymnasiumExport(gym.Env):
    """A steersman env of batch size ``[]`` as a ``gymnasium.Env``.

    Args:
        env: the steersman env.
        render_mode: ``None`` or ``"rgb_array"``: ``render()`` returns
            ``env.render()`` if the env has one, else the last ``"pixels"`` entry.

    ``reset(seed=s)`` calls ``env.set_seed(s)`` first. Observations: the single
    observation leaf as an array (``OneHot`` as its index), or a ``Dict`` of them.
    ``info`` is empty.

    Example:
        >>> from steersman.envs.libs import GymEnv, GymnasiumExport
        >>> genv = GymnasiumExport(GymEnv("CartPole-v1"))
        >>> genv.action_space, genv.observation_space.shape
        (Discrete(2), (4,))
        >>> obs, info = genv.reset(seed=3)
        >>> obs, reward, terminated, truncated, info = genv.step(1)
        >>> reward, terminated
        (1.0, False)
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, env: EnvBase, render_mode: str | None = None) -> None:
        if len(env.batch_size) != 0:
            raise ValueError(
                f"GymnasiumExport needs an env of batch size [], got {list(env.batch_size)}; "
                "use to_gymnasium(env) (a VectorEnv for batch size [n])"
            )
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"GymnasiumExport: render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.steersman_env = env
        self.render_mode = render_mode
        self._codec = _Codec(env)
        self.observation_space = self._codec.single_obs_space
        self.action_space = self._codec.single_act_space
        self._td: TensorDictBase | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self.steersman_env.set_seed(int(seed))
        td = self.steersman_env.reset()
        self._td = td
        return self._codec.obs(td), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        td = self._td
        if td is None:
            raise gym.error.ResetNeeded("GymnasiumExport: call reset() before step()")
        c = self._codec
        c.action(action, self.steersman_env, td)
        td = self.steersman_env.step(td)
        nxt = td.get("next")
        obs = c.obs(nxt)
        reward = float(nxt.get(c.reward_key))
        term = bool(nxt.get(c.term_key))
        trunc = bool(nxt.get(c.trunc_key)) if c.trunc_key is not None else False
        self._td = step_mdp(td, **c.keys)
        return obs, reward, term, trunc, {}

    def render(self) -> Any:
        env = self.steersman_env
        if hasattr(env, "render"):
            return env.render()
        if self._td is not None and "pixels" in self._td.keys():
            return self._td.get("pixels").cpu().numpy()
        return None

    def close(self) -> None:
        self.steersman_env.close()
        super().close()


class GymnasiumVectorExport(gym.vector.VectorEnv):
    """A steersman env of batch size ``[n]`` as a ``gymnasium.vector.VectorEnv``.

    Args:
        env: the steersman env (batch size ``[n]``).
        autoreset_mode: a ``gymnasium.vector.AutoresetMode`` (or its value):
            ``NEXT_STEP`` (default: the step after an episode end ignores that sub-env's
            action and returns its reset observation with reward 0), ``SAME_STEP`` (the
            returned observation is already the reset one; the final one is in
            ``info["final_obs"]``) or ``DISABLED`` (reset finished sub-envs yourself with
            ``reset(options={"reset_mask": mask})``).

    ``reset(seed=s)`` calls ``env.set_seed(s)`` (one int: the env derives a distinct
    seed per sub-env; of a list of seeds, as Gymnasium's vector envs take, the first
    one is used). Partial resets (``options={"reset_mask": mask}``) work in every
    mode.

    Example:
        >>> import numpy as np
        >>> from steersman.envs.libs import GymEnv, to_gymnasium
        >>> venv = to_gymnasium(GymEnv("CartPole-v1", num_envs=3))
        >>> venv.num_envs, venv.single_action_space, venv.observation_space.shape
        (3, Discrete(2), (3, 4))
        >>> obs, info = venv.reset(seed=0)
        >>> obs, rewards, terminated, truncated, info = venv.step(np.array([0, 1, 0]))
        >>> rewards
        array([1., 1., 1.])
    """

    def __init__(self, env: EnvBase, autoreset_mode: Any = gym.vector.AutoresetMode.NEXT_STEP) -> None:
        if len(env.batch_size) != 1:
            raise ValueError(
                f"GymnasiumVectorExport needs an env of batch size [n], got {list(env.batch_size)}"
            )
        mode = autoreset_mode
        if not isinstance(mode, gym.vector.AutoresetMode):
            mode = gym.vector.AutoresetMode(mode)
        self.steersman_env = env
        self.num_envs = int(env.batch_size[0])
        self.autoreset_mode = mode
        self.metadata = {"autoreset_mode": mode, "render_modes": ["rgb_array"]}
        self.render_mode = None
        self._codec = _Codec(env)
        self.single_observation_space = self._codec.single_obs_space
        self.single_action_space = self._codec.single_act_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        #: partial resets through ``reset(options={"reset_mask": mask})`` are supported.
        self.supports_reset_mask = True
        self._autoreset = np.zeros(self.num_envs, dtype=np.bool_)
        self._td: TensorDictBase | None = None

    def reset(self, *, seed: int | list | None = None, options: dict | None = None) -> tuple[Any, dict]:
        if isinstance(seed, (list, tuple)):
            # Gymnasium's per-sub-env seeds; a steersman env derives them from one int
            seed = next((s for s in seed if s is not None), None)
        if seed is not None:
            if not isinstance(seed, (int, np.integer)):
                raise TypeError(
                    "GymnasiumVectorExport.reset: pass one int seed (the env derives a distinct "
                    f"seed for each sub-env), got {type(seed).__name__}"
                )
            self.steersman_env.set_seed(int(seed))
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        env = self.steersman_env
        if mask is not None and self._td is not None:
            mask = np.asarray(mask, dtype=np.bool_)
            if mask.shape != (self.num_envs,):
                raise ValueError(
                    f"options['reset_mask'] must have shape ({self.num_envs},), got {mask.shape}"
                )
            td = self._td.copy()
            td.set("_reset", torch.as_tensor(mask, device=env.device).unsqueeze(-1))
            td = env.reset(td)
            self._autoreset &= ~mask
        else:
            td = env.reset()
            self._autoreset[:] = False
        self._td = td
        return self._codec.obs(td), {}

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        td = self._td
        if td is None:
            raise gym.error.ResetNeeded("GymnasiumVectorExport: call reset() before step()")
        env = self.steersman_env
        c = self._codec
        c.action(actions, env, td)
        td = env.step(td)
        nxt = td.get("next")
        rewards = nxt.get(c.reward_key).reshape(self.num_envs, -1)[:, 0].cpu().numpy().astype(np.float64)
        term = nxt.get(c.term_key).reshape(self.num_envs, -1).any(-1).cpu().numpy()
        if c.trunc_key is not None:
            trunc = nxt.get(c.trunc_key).reshape(self.num_envs, -1).any(-1).cpu().numpy()
        else:
            trunc = np.zeros(self.num_envs, dtype=np.bool_)
        td_next = step_mdp(td, **c.keys)
        info: dict = {}
        mode = self.autoreset_mode
        if mode == gym.vector.AutoresetMode.NEXT_STEP:
            redo = self._autoreset
            if redo.any():  # these sub-envs ended at the previous step: reset, ignore the action
                td_next.set("_reset", torch.as_tensor(redo, device=env.device).unsqueeze(-1))
                td_next = env.reset(td_next)
                rewards[redo] = 0.0
                term[redo] = False
                trunc[redo] = False
            self._autoreset = term | trunc
        elif mode == gym.vector.AutoresetMode.SAME_STEP:
            done = term | trunc
            if done.any():
                final = c.obs(td_next)
                info["final_obs"] = np.array(
                    [_index(final, e) if done[e] else None for e in range(self.num_envs)],
                    dtype=object,
                )
                info["_final_obs"] = done.copy()
                info["final_info"] = np.array([{} if d else None for d in done], dtype=object)
                info["_final_info"] = done.copy()
                td_next.set("_reset", torch.as_tensor(done, device=env.device).unsqueeze(-1))
                td_next = env.reset(td_next)
        self._td = td_next
        return c.obs(td_next), rewards, term, trunc, info

    def render(self) -> Any:
        env = self.steersman_env
        if hasattr(env, "render"):
            return env.render()
        return None

    def close_extras(self, **kwargs: Any) -> None:
        self.steersman_env.close()


def _index(obs: Any, e: int) -> Any:
    if isinstance(obs, dict):
        return {k: _index(v, e) for k, v in obs.items()}
    return obs[e]


def to_gymnasium(env: EnvBase, **kwargs: Any) -> GymnasiumExport | GymnasiumVectorExport:
    """Exposes a steersman env to Gymnasium code.

    Batch size ``[]`` -> :class:`GymnasiumExport` (a ``gymnasium.Env``, passes
    ``gymnasium.utils.env_checker.check_env``); ``[n]`` ->
    :class:`GymnasiumVectorExport` (a ``gymnasium.vector.VectorEnv``, ``NEXT_STEP``
    autoreset by default). ``kwargs`` go to the class (``render_mode``,
    ``autoreset_mode``).

    Example:
        >>> from steersman.envs.libs import GymEnv, to_gymnasium
        >>> type(to_gymnasium(GymEnv("CartPole-v1"))).__name__
        'GymnasiumExport'
        >>> type(to_gymnasium(GymEnv("CartPole-v1", num_envs=2))).__name__
        'GymnasiumVectorExport'
    """
    nb = len(env.batch_size)
    if nb == 0:
        return GymnasiumExport(env, **kwargs)
    if nb == 1:
        return GymnasiumVectorExport(env, **kwargs)
    raise ValueError(
        f"to_gymnasium: batch size {list(env.batch_size)} has {nb} dims; Gymnasium has single "
        "envs ([]) and vector envs ([n]): reshape the batch first"
    )
