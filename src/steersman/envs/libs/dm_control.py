"""DeepMind Control Suite tasks as steersman envs (TorchRL's ``DMControlEnv`` / ``DMControlWrapper``).

``pip install 'steersman[dm-control]'``. Imported lazily: importing this module does not
import dm_control; building an env does (an ``ImportError`` naming the extra if missing).

What comes out, as in TorchRL:

* observations under dm_control's own names (``"position"``, ``"velocity"`` ...), with
  dm_control's dtype (float64: add :class:`~steersman.envs.transforms.DoubleToFloat` for
  float32 networks); a scalar observation gets shape ``[1]``. ``from_pixels=True`` adds
  ``"pixels"`` (uint8 ``[H, W, 3]``, ``physics.render(**render_kwargs)``; needs an
  OpenGL backend, e.g. ``MUJOCO_GL=egl``), and only them with ``pixels_only=True``.
* ``"action"``: a :class:`~steersman.data.Bounded` float64 spec of the task's bounds;
  ``"reward"`` ``[1]`` float64.
* done flags: ``done`` when dm_control says the episode is over (``timestep.last()``),
  ``terminated`` when it also says there is no future (``discount == 0``), else
  ``truncated`` (the suite's 1000-step time limit ends episodes with ``discount == 1``:
  truncated, so value targets bootstrap there).

Seeding: ``set_seed(s)`` reseeds the task's random state (``env.task.random``); the next
``reset`` starts from it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from steersman.data import Bounded, Composite, TensorSpec, Unbounded
from steersman.tensordict import TensorDict, TensorDictBase

from ..common import EnvBase

__all__ = ["DMControlEnv", "DMControlWrapper", "DM_CONTROL_EXTRA_HINT"]

DM_CONTROL_EXTRA_HINT = "pip install 'steersman[dm-control]' (or pip install dm_control)"


def _import_suite() -> Any:
    try:
        from dm_control import suite
    except ImportError as err:
        raise ImportError(f"DMControlEnv needs the 'dm_control' package: {DM_CONTROL_EXTRA_HINT}") from err
    return suite


def _to_spec(array_spec: Any) -> TensorSpec:
    """A dm_env ``Array``/``BoundedArray`` as a steersman spec (scalars get shape ``[1]``)."""
    shape = tuple(array_spec.shape) or (1,)
    dtype = torch.from_numpy(np.zeros((), dtype=array_spec.dtype)).dtype
    if hasattr(array_spec, "minimum"):
        low = torch.as_tensor(np.broadcast_to(array_spec.minimum, array_spec.shape).reshape(shape), dtype=dtype)
        high = torch.as_tensor(np.broadcast_to(array_spec.maximum, array_spec.shape).reshape(shape), dtype=dtype)
        return Bounded(low=low, high=high, shape=shape, dtype=dtype)
    return Unbounded(shape=shape, dtype=dtype)


def _version_mismatch(err: Exception) -> str:
    from importlib.metadata import version

    return (f"DMControlEnv: dm_control {version('dm_control')} does not work with the installed mujoco "
            f"{version('mujoco')} ({err}); install the mujoco release it was built for: pip install "
            f"'mujoco<4' (dm_control 1.0.50 pairs with mujoco 3.17.0)")


class DMControlWrapper(EnvBase):
    """A dm_control environment (``suite.load(...)``, or any ``dm_env.Environment`` with a
    ``physics``) as a steersman env of batch size ``[]``.

    Args:
        env: the dm_control env.
        from_pixels: add ``"pixels"`` (``physics.render(**render_kwargs)``, uint8 ``[H, W, 3]``).
        pixels_only: with ``from_pixels``, drop the state observations.
        frame_skip: repeat each action this many times, summing rewards, stopping at the
            end of an episode.
        render_kwargs: ``physics.render`` arguments (``height``, ``width``, ``camera_id``).
        device: where the output tensors live.
        check: refuse actions outside the action spec (NaN; see :class:`~steersman.envs.EnvBase`).

    ``env.env`` is the dm_control env. See the module docstring for keys, dtypes and done flags.

    Example:
        >>> from dm_control import suite
        >>> from steersman.envs.libs.dm_control import DMControlWrapper
        >>> env = DMControlWrapper(suite.load("cartpole", "balance"))
        >>> sorted(env.observation_spec.keys()), env.action_spec.shape
        (['position', 'velocity'], torch.Size([1]))
    """

    def __init__(self, env: Any = None, *, from_pixels: bool = False, pixels_only: bool = True,
                 frame_skip: int | None = None, render_kwargs: dict | None = None, device: Any = None,
                 check: bool = True) -> None:
        if env is None or not hasattr(env, "observation_spec") or not hasattr(env, "action_spec"):
            raise TypeError(f"DMControlWrapper expects a dm_control env (suite.load(domain, task)), "
                            f"got {type(env).__name__}")
        if frame_skip is not None and int(frame_skip) < 1:
            raise ValueError(f"DMControlWrapper: frame_skip must be >= 1, got {frame_skip}")
        super().__init__(device=device, batch_size=[], check=check)
        self._env = env
        self.from_pixels = bool(from_pixels)
        self.pixels_only = bool(pixels_only)
        self.frame_skip = int(frame_skip or 1)
        self.render_kwargs = dict(render_kwargs or {})
        obs_spec = Composite(device=self.device)
        if not (self.from_pixels and self.pixels_only):
            for key, spec in env.observation_spec().items():
                obs_spec.set(key, _to_spec(spec).to(self.device))
        if self.from_pixels:
            h, w, c = self._render().shape
            obs_spec.set("pixels", Bounded(0, 255, shape=(h, w, c), dtype=torch.uint8, device=self.device))
        self.observation_spec = obs_spec
        self.action_spec = _to_spec(env.action_spec()).to(self.device)
        self.reward_spec = Unbounded(shape=(1,), dtype=torch.float64, device=self.device)

    @property
    def env(self) -> Any:
        return self._env

    def _render(self) -> np.ndarray:
        return np.asarray(self._env.physics.render(**self.render_kwargs))

    def _observation(self, timestep: Any) -> dict[str, torch.Tensor]:
        out = {}
        if not (self.from_pixels and self.pixels_only):
            for key, value in timestep.observation.items():
                spec = self.observation_spec[key]
                out[key] = torch.as_tensor(np.array(value, dtype=None), dtype=spec.dtype).reshape(spec.shape)
        if self.from_pixels:
            out["pixels"] = torch.from_numpy(self._render().copy())
        return out

    def _set_seed(self, seed: int | None) -> None:
        task = getattr(self._env, "task", None)
        rng = getattr(task, "random", None)
        if not isinstance(rng, np.random.RandomState):
            raise RuntimeError(f"DMControlWrapper: cannot seed {type(self._env).__name__}: it has no "
                               "task.random (a numpy RandomState); seed it when you build it")
        rng.seed(seed)

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        timestep = self._env.reset()
        flag = torch.zeros(1, dtype=torch.bool)
        return TensorDict({**self._observation(timestep), "done": flag, "terminated": flag.clone(),
                           "truncated": flag.clone()}, batch_size=[]).to(self.device)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = tensordict.get("action").detach().cpu().numpy()
        reward = 0.0
        for _ in range(self.frame_skip):
            timestep = self._env.step(action)
            reward += float(timestep.reward or 0.0)
            if timestep.last():
                break
        done = bool(timestep.last())
        terminated = done and float(timestep.discount) == 0.0
        return TensorDict({
            **self._observation(timestep),
            "reward": torch.tensor([reward], dtype=torch.float64),
            "done": torch.tensor([done]), "terminated": torch.tensor([terminated]),
            "truncated": torch.tensor([done and not terminated]),
        }, batch_size=[]).to(self.device)

    def _close(self) -> None:
        close = getattr(self._env, "close", None)
        if close is not None:
            close()

    def __repr__(self) -> str:
        name = getattr(self, "env_name", None)
        what = f"{name!r}, {self.task_name!r}" if name else type(self._env).__name__
        return f"{type(self).__name__}({what}, from_pixels={self.from_pixels})"


class DMControlEnv(DMControlWrapper):
    """A DeepMind Control Suite task by name: ``suite.load(env_name, task_name)``.

    Args:
        env_name: the domain (``"cartpole"``, ``"cheetah"``, ``"walker"`` ...).
        task_name: the task (``"balance"``, ``"run"``, ``"walk"`` ...);
            :meth:`available_envs` lists the pairs.
        seed: the task's seed (``task_kwargs={"random": seed}``; None: dm_control draws one).
        task_kwargs / environment_kwargs: passed to ``suite.load``.
        **kwargs: :class:`DMControlWrapper` arguments (``from_pixels``, ``pixels_only``,
            ``frame_skip``, ``render_kwargs``, ``device``, ``check``).

    Example:
        >>> from steersman.envs.libs.dm_control import DMControlEnv
        >>> env = DMControlEnv("cartpole", "balance", seed=0)
        >>> env.rollout(5)["next", "position"].shape
        torch.Size([5, 3])
    """

    def __init__(self, env_name: str, task_name: str, *, seed: int | None = None,
                 task_kwargs: dict | None = None, environment_kwargs: dict | None = None, **kwargs: Any) -> None:
        suite = _import_suite()
        if (env_name, task_name) not in suite.ALL_TASKS:
            raise ValueError(f"DMControlEnv: unknown task ({env_name!r}, {task_name!r}); "
                             f"DMControlEnv.available_envs() lists the {len(suite.ALL_TASKS)} (domain, task) pairs")
        self.env_name, self.task_name = env_name, task_name
        task_kwargs = dict(task_kwargs or {})
        if seed is not None:
            task_kwargs["random"] = int(seed)
        try:
            env = suite.load(env_name, task_name, task_kwargs=task_kwargs, environment_kwargs=environment_kwargs)
        except AttributeError as err:  # e.g. dm_control 1.0.50 on mujoco 4: "'MjModel' has no attribute ..."
            raise ImportError(_version_mismatch(err)) from err
        super().__init__(env, **kwargs)

    @staticmethod
    def available_envs() -> list[tuple[str, str]]:
        """The suite's ``(domain, task)`` pairs (``dm_control.suite.ALL_TASKS``)."""
        return [tuple(t) for t in _import_suite().ALL_TASKS]
