"""Envs whose dynamics are a learned model: ``ModelBasedEnvBase`` (the base class: the step
is a TensorDict module), ``WorldModelEnv`` (steps in a world model's latent space, specs
from a real env) and ``ImaginedEnv`` (belief-space imagination for PILCO-style policy
search: observations are ``(mean, var)`` pairs)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from steersman.data import Composite, Unbounded
from steersman.tensordict import TensorDict, TensorDictBase, is_tensor_collection
from steersman.tensordict._utils import NestedKey, unravel_key

from .common import EnvBase

__all__ = ["ModelBasedEnvBase", "WorldModelEnv", "ImaginedEnv"]


def _size(batch_size: Any) -> torch.Size | None:
    if batch_size is None:
        return None
    return torch.Size((batch_size,) if isinstance(batch_size, int) else tuple(batch_size))


class ModelBasedEnvBase(EnvBase):
    """Base class of envs whose step is a world model (a TensorDict module).

    ``_step`` runs ``world_model`` on a shallow copy of the step input (the state and the
    action) and returns its entries named in the observation, reward and done specs (the
    done flags the model does not predict are False). A subclass sets the specs and
    writes ``_reset`` (e.g. the initial states from a dataset, or random ones).

    Args:
        world_model: an ``nn.Module`` mapping a TensorDict to a TensorDict (a
            ``TensorDictModule``/``TensorDictSequential`` reading e.g. the state and
            ``"action"`` and writing the next state and ``"reward"``).
        params, buffers: accepted (TorchRL's functional-era arguments); the module's own
            parameters are used.
        device, batch_size: as for :class:`EnvBase` (batch size ``[]`` by default).
        run_type_checks: check the outputs against the specs on every step.
        allow_done_after_reset: as for :class:`EnvBase`.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.data import Composite, Unbounded
        >>> from steersman.envs import ModelBasedEnvBase, check_env_specs
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> class DoublingEnv(ModelBasedEnvBase):   # next state = 2 * state + action
        ...     def __init__(self, world_model):
        ...         super().__init__(world_model, batch_size=[2])
        ...         self.observation_spec = Composite(state=Unbounded((2, 1)), shape=[2])
        ...         self.state_spec = Composite(state=Unbounded((2, 1)), shape=[2])
        ...         self.action_spec = Unbounded((2, 1))
        ...         self.reward_spec = Unbounded((2, 1))
        ...     def _reset(self, tensordict=None):
        ...         return TensorDict(state=torch.ones(2, 1), batch_size=[2])
        >>> model = TensorDictModule(lambda s, a: (2 * s + a, -s.abs()), in_keys=["state", "action"],
        ...                          out_keys=["state", "reward"])
        >>> env = DoublingEnv(model)
        >>> td = env.reset()
        >>> td["action"] = torch.zeros(2, 1)
        >>> env.step(td)["next", "state"].squeeze(-1).tolist()
        [2.0, 2.0]
        >>> check_env_specs(env)
    """

    def __init__(self, world_model: nn.Module, params: list[torch.Tensor] | None = None,
                 buffers: list[torch.Tensor] | None = None, device: Any = "cpu", batch_size: Any = None,
                 run_type_checks: bool = False, allow_done_after_reset: bool = False, **kwargs: Any) -> None:
        if not callable(world_model):
            raise TypeError(f"{type(self).__name__}: world_model must be a module (TensorDict -> TensorDict), got "
                            f"{type(world_model).__name__}")
        kwargs.pop("dtype", None)  # TorchRL's examples pass dtype=: specs carry the dtypes here
        if kwargs:
            raise TypeError(f"{type(self).__name__} got unexpected arguments {sorted(kwargs)}")
        super().__init__(device=device, batch_size=batch_size)
        self.world_model = world_model.to(self.device) if isinstance(world_model, nn.Module) else world_model
        self.world_model_params = params
        self.world_model_buffers = buffers
        self.run_type_checks = bool(run_type_checks)
        self.allow_done_after_reset = bool(allow_done_after_reset)

    def set_specs_from_env(self, env: EnvBase) -> None:
        """Copies the specs of ``env`` (expanded to this env's batch size)."""
        bs = self.batch_size
        for name in ("full_observation_spec", "full_reward_spec", "full_done_spec", "full_action_spec",
                     "full_state_spec"):
            spec = getattr(env, name).clone()
            if spec.shape != bs:
                spec = spec.expand(*bs, *spec.shape[len(env.batch_size):]) if not env.batch_size else \
                    spec.expand(*bs)
            setattr(self, name, spec.to(self.device))

    def _out_keys(self) -> list:
        keys = []
        for spec in (self.full_observation_spec, self.full_reward_spec, self.full_done_spec):
            keys.extend(spec.keys(include_nested=True, leaves_only=True))
        return keys

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        out = self.world_model(tensordict.copy())
        if out is None:
            raise TypeError(f"{type(self).__name__}: the world model returned None (it must return the TensorDict)")
        keys = [k for k in self._out_keys() if k in out.keys(True)]
        return out.select(*keys)

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        raise NotImplementedError(f"{type(self).__name__} must implement _reset (the initial states)")

    def _set_seed(self, seed: int | None) -> None:
        if seed is not None:
            torch.manual_seed(seed)


class WorldModelEnv(ModelBasedEnvBase):
    """An env that steps in the latent space of a world model.

    The model's step reads the latent state (``latent_key``) and the action and writes
    ``("next", latent_key)`` and ``("next", "reward")`` (and optionally ``("next",
    "done")``/``("next", "terminated")``); a model with a ``step_module`` attribute (a
    world model with encoder/dynamics/heads) is stepped through it. The encoder is not run
    on each step: seed the latent state by passing an encoded observation to ``reset`` or
    ``rollout(tensordict=...)``; a reset without one starts from zeros.

    The action, reward and done specs are those of ``base_env`` (only its specs are read);
    the observation is the latent, Unbounded ``[*batch, D]`` with ``D`` read from the model
    on a probe step, unless ``observation_spec`` is given.

    Args:
        world_model: the model (see above).
        base_env: the real env whose specs are copied.
        observation_spec: the observation spec (a Composite, or one spec for ``latent_key``).
        batch_size, device: default: ``base_env``'s.
        latent_key: default ``"latent"``.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs import PendulumEnv, WorldModelEnv, check_env_specs
        >>> from steersman.tensordict.nn import TensorDictModule, TensorDictSequential
        >>> dyn = TensorDictModule(lambda z, a: z * 0.5 + a, in_keys=["latent", "action"],
        ...                        out_keys=[("next", "latent")])
        >>> rew = TensorDictModule(lambda z: -z.pow(2).sum(-1, keepdim=True), in_keys=[("next", "latent")],
        ...                        out_keys=[("next", "reward")])
        >>> env = WorldModelEnv(TensorDictSequential(dyn, rew), PendulumEnv(), batch_size=[3],
        ...                     observation_spec=__import__("steersman").data.Unbounded((3, 1)))
        >>> start = TensorDict(latent=torch.full((3, 1), 4.0), batch_size=[3])
        >>> r = env.rollout(3, lambda td: td.set("action", torch.zeros(3, 1)), tensordict=start)
        >>> r["next", "latent"][0].squeeze(-1).tolist()
        [2.0, 1.0, 0.5]
        >>> check_env_specs(env)
    """

    def __init__(self, world_model: nn.Module, base_env: EnvBase, *, observation_spec: Any = None,
                 batch_size: int | torch.Size | Sequence[int] | None = None, device: Any = None,
                 latent_key: NestedKey = "latent") -> None:
        if not isinstance(base_env, EnvBase):
            raise TypeError(f"WorldModelEnv: base_env must be an EnvBase, got {type(base_env).__name__}")
        step_module = getattr(world_model, "step_module", world_model)
        bs = _size(batch_size)
        bs = base_env.batch_size if bs is None else bs
        dev = base_env.device if device is None else device
        super().__init__(step_module, device=dev, batch_size=bs, allow_done_after_reset=True)
        self.world_model_full = world_model
        self.latent_key = unravel_key(latent_key)
        self._copy_io_specs(base_env)
        if observation_spec is None:
            observation_spec = self._probe_latent_spec()
        if not isinstance(observation_spec, Composite):
            observation_spec = Composite({self.latent_key: observation_spec}, shape=self.batch_size)
        self.observation_spec = observation_spec.to(self.device)

    def _copy_io_specs(self, base_env: EnvBase) -> None:
        bs = self.batch_size
        nb = len(base_env.batch_size)
        for name in ("full_action_spec", "full_reward_spec", "full_done_spec"):
            spec = getattr(base_env, name).clone()
            leaves = {k: s for k, s in spec.items(include_nested=True, leaves_only=True)}
            out = Composite(shape=bs, device=self.device)
            for k, s in leaves.items():
                feat = s.shape[nb:]
                s2 = s.clone()
                s2 = s2.expand(*bs, *feat) if tuple(s2.shape) != (*bs, *feat) else s2
                out.set(k, s2.to(self.device))
            setattr(self, name, out)

    def _probe_latent_spec(self) -> Unbounded:
        probe = TensorDict({}, batch_size=self.batch_size, device=self.device)
        for k, s in self.full_action_spec.items(include_nested=True, leaves_only=True):
            probe.set(k, s.zero())
        for d in range(1, 4097):  # the smallest latent size the model accepts
            try:
                td = probe.copy()
                td.set(self.latent_key, torch.zeros(*self.batch_size, d, device=self.device))
                with torch.no_grad():
                    out = self.world_model(td)
                nxt = out.get(("next", *((self.latent_key,) if isinstance(self.latent_key, str)
                                         else self.latent_key)))
                return Unbounded(shape=nxt.shape, dtype=nxt.dtype, device=self.device)
            except (RuntimeError, KeyError, ValueError):
                continue
        raise ValueError("WorldModelEnv: could not infer the latent size from the model; pass observation_spec=")

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        out = self.world_model(tensordict.copy())
        nxt = out.get("next", None)
        if nxt is None:
            raise KeyError(f"WorldModelEnv: the world model must write ('next', {self.latent_key!r}) and "
                           f"('next', 'reward'); its output has {sorted(map(str, out.keys(True)))}")
        keys = [k for k in self._out_keys() if k in nxt.keys(True)]
        return nxt.select(*keys)

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        out = TensorDict({}, batch_size=self.batch_size, device=self.device)
        for k, s in self.full_observation_spec.items(include_nested=True, leaves_only=True):
            v = None if tensordict is None else tensordict.get(k, None)
            out.set(k, s.zero() if v is None else v)
        return out


class ImaginedEnv(ModelBasedEnvBase):
    """Imagined rollouts in belief space for model-based policy search (PILCO-style).

    Observations are beliefs: ``("observation", "mean")`` ``[*b, D]`` and
    ``("observation", "var")`` ``[*b, D, D]``. The world model reads ``"action"`` and
    ``"observation"`` and writes the next belief at ``next_observation_key`` (a TensorDict
    with ``"mean"`` and ``"var"``). The env never ends an episode (done flags are False;
    the rollout length is ``max_steps``) and its reward is zero (the policy-search loss
    computes the cost from the beliefs). Action/reward/done specs come from ``base_env``.

    A reset starts from the belief in its input (``("observation", "mean"/"var")``), or from
    the observation in its input (zero variance), or from a random observation of
    ``base_env``'s spec.

    Args:
        world_model_module: the model (see above).
        base_env: the real env whose specs are copied.
        batch_size: default ``base_env``'s (at least ``[1]``).
        next_observation_key: default ``("next", "observation")``.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs import ImaginedEnv, PendulumEnv, check_env_specs
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> def model(action, observation):   # mean drifts by the action, variance grows
        ...     return observation["mean"] + action.sum(-1, keepdim=True), observation["var"] + 0.1
        >>> wm = TensorDictModule(model, in_keys=["action", "observation"],
        ...                       out_keys=[("next", "observation", "mean"), ("next", "observation", "var")])
        >>> env = ImaginedEnv(wm, PendulumEnv())
        >>> start = TensorDict(observation=torch.zeros(1, 3), batch_size=[1])
        >>> r = env.rollout(3, lambda td: td.set("action", torch.ones(1, 1)), tensordict=start)
        >>> r["next", "observation", "mean"][0, :, 0].tolist(), r["next", "observation", "var"][0, -1, 0, 0].item()
        ([1.0, 2.0, 3.0], 0.30000001192092896)
        >>> check_env_specs(env)
    """

    def __init__(self, world_model_module: nn.Module, base_env: EnvBase,
                 batch_size: int | torch.Size | Sequence[int] | None = None,
                 next_observation_key: str | tuple[str, ...] = ("next", "observation"), **kwargs: Any) -> None:
        if not isinstance(base_env, EnvBase):
            raise TypeError(f"ImaginedEnv: base_env must be an EnvBase, got {type(base_env).__name__}")
        self.next_observation_key = unravel_key(next_observation_key)
        bs = _size(batch_size)
        if bs is None:
            bs = base_env.batch_size if len(base_env.batch_size) else torch.Size([1])
        super().__init__(world_model_module, device=base_env.device, batch_size=bs,
                         allow_done_after_reset=True, **kwargs)
        nb = len(base_env.batch_size)
        base_obs = base_env.full_observation_spec["observation"]
        self._obs_feat = base_obs.shape[nb:]
        self._base_obs_spec = base_obs
        d = self._obs_feat[-1]
        dtype = base_obs.dtype
        self.observation_spec = Composite(observation=Composite(
            mean=Unbounded(shape=(*bs, d), dtype=dtype, device=self.device),
            var=Unbounded(shape=(*bs, d, d), dtype=dtype, device=self.device), shape=bs), shape=bs)
        for name in ("full_action_spec", "full_reward_spec", "full_done_spec"):
            spec = getattr(base_env, name)
            out = Composite(shape=bs, device=self.device)
            for k, s in spec.items(include_nested=True, leaves_only=True):
                out.set(k, s.clone().expand(*bs, *s.shape[nb:]).to(self.device) if tuple(s.shape) != (*bs,
                                                                                                       *s.shape[nb:])
                        else s.clone().to(self.device))
            setattr(self, name, out)

    def any_done(self, tensordict: TensorDictBase) -> bool:
        """Always False: imagined rollouts never end."""
        return False

    def maybe_reset(self, tensordict: TensorDictBase) -> TensorDictBase:
        """A no-op (nothing is ever done)."""
        return tensordict

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        out = self.world_model(tensordict.copy())
        belief = out.get(self.next_observation_key, None)
        if belief is None:
            raise KeyError(f"ImaginedEnv: the world model must write {self.next_observation_key!r} (a TensorDict "
                           f"with 'mean' and 'var'); its output has {sorted(map(str, out.keys(True)))}")
        bs = self.batch_size
        res = TensorDict({"observation": belief}, batch_size=bs, device=self.device)
        for k, s in self.full_reward_spec.items(include_nested=True, leaves_only=True):
            res.set(k, s.zero())
        for k, s in self.full_done_spec.items(include_nested=True, leaves_only=True):
            res.set(k, s.zero())
        return res

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        bs = self.batch_size
        obs = None if tensordict is None else tensordict.get("observation", None)
        if is_tensor_collection(obs):
            mean, var = obs.get("mean", None), obs.get("var", None)
            if mean is None or var is None:
                raise KeyError(f"ImaginedEnv.reset: a belief observation needs 'mean' and 'var', got "
                               f"{sorted(obs.keys())}")
            return TensorDict({("observation", "mean"): mean, ("observation", "var"): var}, batch_size=bs,
                              device=self.device)
        if obs is None:
            obs = self._base_obs_spec.rand()
        obs = obs.to(self.device)
        d = obs.shape[-1]
        obs = obs.expand(*bs, d) if tuple(obs.shape) != (*bs, d) else obs
        return TensorDict({("observation", "mean"): obs,
                           ("observation", "var"): torch.zeros(*bs, d, d, dtype=obs.dtype, device=self.device)},
                          batch_size=bs, device=self.device)
