"""MuJoCo tasks on the native ``mujoco`` bindings (no Gymnasium in the loop): the base
class :class:`MujocoEnv` and the locomotion tasks :class:`HopperEnv`,
:class:`Walker2dEnv`, :class:`AntEnv`, :class:`HumanoidEnv`.

Each env holds ``num_envs`` simulations of one model (batch size ``[num_envs]``); a step
applies the action as actuator controls for ``frame_skip`` physics steps. The rewards,
terminations and reset noise follow Gymnasium's v5 definitions of the same tasks (forward
velocity of the torso, or of the center of mass for Humanoid, plus a healthy bonus, minus
a control cost), so returns are comparable. The observation is the joint positions
(without the global x, y coordinates as Gymnasium does) and velocities; Humanoid's extra
inertia/force features of Gymnasium are not included. The models are Gymnasium's XML
files (``gymnasium`` installed) or any ``xml_path``.

``mujoco`` (>= 3) is an optional dependency, imported when an env is built.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from steersman.data import Bounded, Composite, Unbounded
from steersman.tensordict import TensorDict, TensorDictBase

from .common import EnvBase

__all__ = ["MujocoEnv", "HopperEnv", "Walker2dEnv", "AntEnv", "HumanoidEnv"]


def _import_mujoco() -> Any:
    try:
        import mujoco
    except ImportError as err:  # pragma: no cover - exercised without mujoco only
        raise ImportError("MujocoEnv needs the mujoco package (>= 3): pip install mujoco") from err
    return mujoco


def _gymnasium_asset(name: str) -> str | None:
    try:
        root = importlib.resources.files("gymnasium.envs.mujoco") / "assets" / name
    except (ModuleNotFoundError, TypeError):
        return None
    return str(root) if root.is_file() else None


class MujocoEnv(EnvBase):
    """A batch of ``num_envs`` MuJoCo simulations as one env (native ``mujoco`` bindings).

    Subclasses set ``XML_PATH`` (a file name among Gymnasium's MuJoCo assets, or a path)
    and the task: :meth:`_compute_reward`, :meth:`_compute_done` (termination) and
    optionally :meth:`_make_obs`. Episodes are truncated after ``max_episode_steps``.

    Args:
        xml_path: the MJCF model (default: the class's ``XML_PATH``).
        patch_xml: accepted (the model is loaded as it is).
        backend: ``"mujoco"`` (the C bindings, stepped on CPU); TorchRL's
            ``"mujoco-torch"``/``"mjx"`` backends are refused with a ``ValueError`` (their
            packages are not dependencies here); the default ``"mujoco-torch"`` of TorchRL
            is read as ``"mujoco"``.
        num_envs: the batch size.
        device, dtype: of the tensors (the physics is float64 on CPU).
        seed: seeds the reset noise.
        frame_skip: physics steps per action (default ``FRAME_SKIP``).
        reset_noise_scale: uniform noise on ``qpos0``/``qvel`` at reset (default
            ``RESET_NOISE_SCALE``).
        max_episode_steps: truncation horizon.
        compile_step, compile_kwargs: accepted, no effect (the C step is not traced).
        from_pixels: rendering needs an OpenGL context; ``True`` raises a ``ValueError``.
        pixels_only, render_width, render_height, render_every, camera_id: accepted
            (rendering options).

    Example:
        >>> from steersman.envs import HopperEnv, check_env_specs
        >>> env = HopperEnv(num_envs=2, seed=0)
        >>> env.batch_size, env.observation_spec["observation"].shape, env.action_spec.shape
        (torch.Size([2]), torch.Size([2, 11]), torch.Size([2, 3]))
        >>> check_env_specs(env, seed=0)
    """

    XML_PATH: str | None = None
    XML_URL: str | None = None
    FRAME_SKIP = 5
    RESET_NOISE_SCALE = 0.01
    SKIP_QPOS = 1
    DEFAULT_BACKEND = "mujoco"

    def __init__(self, *, xml_path: str | Path | None = None, patch_xml: bool = True,
                 backend: str = "mujoco-torch", num_envs: int = 1, device: Any = None, seed: int | None = None,
                 frame_skip: int | None = None, reset_noise_scale: float | None = None,
                 max_episode_steps: int = 1000, dtype: torch.dtype = torch.float32, compile_step: bool = False,
                 compile_kwargs: dict | None = None, from_pixels: bool = False, pixels_only: bool = False,
                 render_width: int = 64, render_height: int = 64, render_every: int = 1, camera_id: int = 0) -> None:
        owner = type(self).__name__
        if backend == "mujoco-torch":
            backend = "mujoco"
        if backend != "mujoco":
            raise ValueError(f"{owner}: backend={backend!r} is not provided by steersman (its package is not a "
                             "dependency); use backend='mujoco' (the mujoco C bindings)")
        if from_pixels or pixels_only:
            raise ValueError(f"{owner}: from_pixels needs a MuJoCo OpenGL renderer, which steersman does not set up; "
                             "use GymEnv('<Task>-v5', from_pixels=True) for rendered MuJoCo tasks")
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"{owner}: num_envs must be an int >= 1, got {num_envs!r}")
        if max_episode_steps < 1:
            raise ValueError(f"{owner}: max_episode_steps must be >= 1, got {max_episode_steps}")
        mujoco = _import_mujoco()
        path = xml_path if xml_path is not None else self.XML_PATH
        if path is None:
            raise ValueError(f"{owner}: no model: pass xml_path= (an MJCF file)")
        path = str(path)
        if not Path(path).is_file():
            asset = _gymnasium_asset(path)
            if asset is None:
                raise FileNotFoundError(f"{owner}: the model {path!r} is neither a file nor one of Gymnasium's MuJoCo "
                                        "assets (install gymnasium or pass xml_path=)")
            path = asset
        super().__init__(device=device, batch_size=[num_envs])
        self._mj = mujoco
        self.model = mujoco.MjModel.from_xml_path(path)
        self.datas = [mujoco.MjData(self.model) for _ in range(num_envs)]
        self.num_envs = num_envs
        self.backend = backend
        self.patch_xml = patch_xml
        self.frame_skip = int(self.FRAME_SKIP if frame_skip is None else frame_skip)
        if self.frame_skip < 1:
            raise ValueError(f"{owner}: frame_skip must be >= 1, got {frame_skip}")
        self.reset_noise_scale = float(self.RESET_NOISE_SCALE if reset_noise_scale is None else reset_noise_scale)
        self.max_episode_steps = int(max_episode_steps)
        self.dtype = dtype
        self.compile_step, self.compile_kwargs = compile_step, compile_kwargs
        self.render_width, self.render_height, self.render_every, self.camera_id = (
            render_width, render_height, render_every, camera_id)
        self.dt = float(self.model.opt.timestep) * self.frame_skip
        self._rng = np.random.default_rng(seed)
        self._steps = np.zeros(num_envs, dtype=np.int64)
        self._make_specs()

    # ------------------------------------------------------------------ specs
    def _make_specs(self) -> None:
        n, m = self.num_envs, self.model
        dev = self.device
        obs_dim = self._make_obs(self.datas[0]).shape[-1]
        self.observation_spec = Composite(
            observation=Unbounded(shape=(n, obs_dim), dtype=self.dtype, device=dev), shape=(n,))
        rng = np.asarray(m.actuator_ctrlrange, dtype=np.float64)
        limited = np.asarray(m.actuator_ctrllimited, dtype=bool)
        low = np.where(limited, rng[:, 0], -np.inf)
        high = np.where(limited, rng[:, 1], np.inf)
        if np.isinf(low).all() and np.isinf(high).all():
            self.action_spec = Unbounded(shape=(n, m.nu), dtype=self.dtype, device=dev)
        else:
            self.action_spec = Bounded(torch.as_tensor(low, dtype=self.dtype), torch.as_tensor(high, dtype=self.dtype),
                                       shape=(n, m.nu), dtype=self.dtype, device=dev)
        self.reward_spec = Unbounded(shape=(n, 1), dtype=self.dtype, device=dev)

    # ------------------------------------------------------------------ task hooks
    def _make_obs(self, data: Any) -> np.ndarray:
        """One env's observation (default: ``qpos[SKIP_QPOS:]`` and ``qvel``)."""
        return np.concatenate([data.qpos[self.SKIP_QPOS:], data.qvel])

    def _x_position(self, data: Any) -> float:
        """The position whose velocity is rewarded (default: the root body's x)."""
        return float(data.qpos[0])

    def _compute_reward(self, data: Any, x_before: float, x_after: float, action: np.ndarray) -> float:
        raise NotImplementedError

    def _compute_done(self, data: Any) -> bool:
        """Termination (default: never)."""
        return False

    def _sample_initial_state(self, data: Any) -> None:
        s = self.reset_noise_scale
        m = self.model
        data.qpos[:] = m.qpos0 + self._rng.uniform(-s, s, size=m.nq)
        data.qvel[:] = self._rng.uniform(-s, s, size=m.nv)

    # ------------------------------------------------------------------ env API
    def _obs_tensor(self, rows: list[np.ndarray]) -> Tensor:
        return torch.as_tensor(np.stack(rows), dtype=self.dtype, device=self.device)

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        mask = self._reset_mask(tensordict)
        which = range(self.num_envs) if mask is None else mask.reshape(-1).nonzero().flatten().tolist()
        mj = self._mj
        for i in which:
            d = self.datas[i]
            mj.mj_resetData(self.model, d)
            self._sample_initial_state(d)
            mj.mj_forward(self.model, d)
            self._steps[i] = 0
        obs = self._obs_tensor([self._make_obs(d) for d in self.datas])
        z = torch.zeros(self.num_envs, 1, dtype=torch.bool, device=self.device)
        return TensorDict({"observation": obs, "done": z, "terminated": z.clone(), "truncated": z.clone()},
                          batch_size=self.batch_size, device=self.device)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = tensordict.get("action").detach().to("cpu", torch.float64).numpy().reshape(self.num_envs, -1)
        mj, m = self._mj, self.model
        obs, rew, term = [], [], []
        for i, d in enumerate(self.datas):
            x0 = self._x_position(d)
            d.ctrl[:] = action[i]
            mj.mj_step(m, d, nstep=self.frame_skip)
            x1 = self._x_position(d)
            obs.append(self._make_obs(d))
            rew.append(self._compute_reward(d, x0, x1, action[i]))
            term.append(self._compute_done(d))
        self._steps += 1
        te = torch.as_tensor(term, device=self.device).reshape(-1, 1)
        tr = torch.as_tensor(self._steps >= self.max_episode_steps, device=self.device).reshape(-1, 1) & ~te
        return TensorDict({"observation": self._obs_tensor(obs),
                           "reward": torch.as_tensor(rew, dtype=self.dtype, device=self.device).reshape(-1, 1),
                           "done": te | tr, "terminated": te, "truncated": tr},
                          batch_size=self.batch_size, device=self.device)

    def _set_seed(self, seed: int | None) -> None:
        self._rng = np.random.default_rng(seed)

    def site_positions(self) -> Tensor:
        """``[num_envs, nsite, 3]``: the world positions of the model's sites."""
        return torch.as_tensor(np.stack([d.site_xpos.copy() for d in self.datas]), dtype=self.dtype)

    def get_state(self) -> TensorDict:
        """``qpos``/``qvel`` of each env (``[num_envs, nq]``, ``[num_envs, nv]``)."""
        return TensorDict({"qpos": torch.as_tensor(np.stack([d.qpos.copy() for d in self.datas])),
                           "qvel": torch.as_tensor(np.stack([d.qvel.copy() for d in self.datas]))},
                          batch_size=self.batch_size)


class _Locomotion(MujocoEnv):
    FORWARD_REWARD_WEIGHT = 1.0
    CTRL_COST_WEIGHT = 1e-3
    HEALTHY_REWARD = 1.0
    HEALTHY_Z_MIN = -np.inf
    HEALTHY_Z_MAX = np.inf
    HEALTHY_ANGLE_MAX = np.inf
    Z_INDEX = 1  # qpos index of the torso height
    ANGLE_INDEX: int | None = 2
    VEL_CLIP: float | None = 10.0

    def _make_obs(self, data: Any) -> np.ndarray:
        qvel = data.qvel if self.VEL_CLIP is None else np.clip(data.qvel, -self.VEL_CLIP, self.VEL_CLIP)
        return np.concatenate([data.qpos[self.SKIP_QPOS:], qvel])

    def _is_healthy(self, data: Any) -> bool:
        z = float(data.qpos[self.Z_INDEX])
        ok = self.HEALTHY_Z_MIN < z < self.HEALTHY_Z_MAX and bool(np.isfinite(data.qpos).all())
        if self.ANGLE_INDEX is not None:
            ok = ok and abs(float(data.qpos[self.ANGLE_INDEX])) < self.HEALTHY_ANGLE_MAX
        return ok

    def _compute_reward(self, data: Any, x_before: float, x_after: float, action: np.ndarray) -> float:
        forward = self.FORWARD_REWARD_WEIGHT * (x_after - x_before) / self.dt
        ctrl = self.CTRL_COST_WEIGHT * float(np.square(action).sum())
        return forward + self.HEALTHY_REWARD - ctrl

    def _compute_done(self, data: Any) -> bool:
        return not self._is_healthy(data)


class HopperEnv(_Locomotion):
    """Single-legged hopping (3 actuators; observation 11): forward velocity + 1 per
    healthy step - 1e-3 |a|^2; ends when the torso is below 0.7, tilts over 0.2 rad or any
    state beyond 100 (Gymnasium's Hopper-v5)."""

    XML_PATH = "hopper.xml"
    FRAME_SKIP = 4
    RESET_NOISE_SCALE = 5e-3
    HEALTHY_Z_MIN = 0.7
    HEALTHY_ANGLE_MAX = 0.2

    def _is_healthy(self, data: Any) -> bool:
        state = np.concatenate([data.qpos[2:], data.qvel])
        return super()._is_healthy(data) and bool((np.abs(state) < 100.0).all())


class Walker2dEnv(_Locomotion):
    """Two-legged walking in a plane (6 actuators; observation 17): forward velocity + 1
    per healthy step - 1e-3 |a|^2; ends when the torso leaves ``(0.8, 2.0)`` or tilts
    over 1 rad (Gymnasium's Walker2d-v5)."""

    XML_PATH = "walker2d_v5.xml"
    FRAME_SKIP = 4
    RESET_NOISE_SCALE = 5e-3
    HEALTHY_Z_MIN = 0.8
    HEALTHY_Z_MAX = 2.0
    HEALTHY_ANGLE_MAX = 1.0


class AntEnv(_Locomotion):
    """A four-legged ant (8 actuators; observation 27 = qpos[2:] + qvel): x velocity + 1
    per healthy step - 0.5 |a|^2; ends when the torso leaves ``(0.2, 1.0)`` (Gymnasium's
    Ant-v5 without the contact-force features and cost)."""

    XML_PATH = "ant.xml"
    FRAME_SKIP = 5
    RESET_NOISE_SCALE = 0.1
    SKIP_QPOS = 2
    CTRL_COST_WEIGHT = 0.5
    HEALTHY_Z_MIN = 0.2
    HEALTHY_Z_MAX = 1.0
    Z_INDEX = 2
    ANGLE_INDEX = None
    VEL_CLIP = None

    def _sample_initial_state(self, data: Any) -> None:
        s, m = self.reset_noise_scale, self.model
        data.qpos[:] = m.qpos0 + self._rng.uniform(-s, s, size=m.nq)
        data.qvel[:] = s * self._rng.standard_normal(m.nv)


class HumanoidEnv(_Locomotion):
    """A 3D humanoid (17 actuators; observation 45 = qpos[2:] + qvel): 1.25 x velocity of
    the center of mass + 5 per healthy step - 0.1 |a|^2; ends when the torso leaves
    ``(1.0, 2.0)`` (Gymnasium's Humanoid-v5 without its inertia/force features)."""

    XML_PATH = "humanoid.xml"
    FRAME_SKIP = 5
    RESET_NOISE_SCALE = 1e-2
    SKIP_QPOS = 2
    FORWARD_REWARD_WEIGHT = 1.25
    CTRL_COST_WEIGHT = 0.1
    HEALTHY_REWARD = 5.0
    HEALTHY_Z_MIN = 1.0
    HEALTHY_Z_MAX = 2.0
    Z_INDEX = 2
    ANGLE_INDEX = None
    VEL_CLIP = None

    def _x_position(self, data: Any) -> float:
        mass = np.asarray(self.model.body_mass)[:, None]
        return float((mass * data.xipos).sum(0)[0] / mass.sum())
