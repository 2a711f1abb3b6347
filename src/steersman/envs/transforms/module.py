"""ModuleTransform: a TensorDict module (e.g. a frozen encoder) run as a transform."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from steersman.data import Composite, TensorSpec
from steersman.tensordict import TensorDictBase

from .base import Transform

__all__ = ["ModuleTransform"]

SpecMap = TensorSpec | Callable[[Composite], Composite] | None


class ModuleTransform(Transform):
    """Runs a module on what the env emits (or, with ``inverse=True``, on what it receives).

    Keyword Args:
        module: a module taking and returning a TensorDict (e.g. a ``TensorDictModule``).
        module_factory: a callable building it (exclusive with ``module``).
        no_grad: run the module under ``torch.no_grad()``.
        inverse: run it on the env's input (the policy's TensorDict, before the step)
            instead of on the reset and step outputs.
        device: move the module there; TensorDicts are moved there for the call and the
            results brought back to the data's device.
        observation_spec_transform, reward_spec_transform, done_spec_transform,
        action_spec_transform, state_spec_transform: the new spec of that part
            (a ``Composite``) or a function from the old one to the new one (default:
            unchanged). The module's new entries must be declared here for the env's
            specs to hold.
        use_ray_service: a remote (Ray) module is not supported here: ``True`` raises.
        num_gpus, num_cpus, actor_name: Ray options, accepted and unused without Ray.

    Example:
        >>> import torch
        >>> from steersman.data import Unbounded
        >>> from steersman.envs import PendulumEnv, check_env_specs
        >>> from steersman.envs.transforms import ModuleTransform, TransformedEnv
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> enc = TensorDictModule(torch.nn.Linear(3, 5), in_keys=["observation"], out_keys=["embed"])
        >>> def add_embed(spec):
        ...     spec["embed"] = Unbounded(shape=(*spec.shape, 5))
        ...     return spec
        >>> env = TransformedEnv(PendulumEnv(seed=0), ModuleTransform(
        ...     module=enc, no_grad=True, observation_spec_transform=add_embed))
        >>> check_env_specs(env)
        >>> env.rollout(3)["next", "embed"].shape
        torch.Size([3, 5])
    """

    _check_spec_in_keys = False

    def __init__(self, *, module: nn.Module | None = None, module_factory: Callable[[], nn.Module] | None = None,
                 no_grad: bool = False, inverse: bool = False, device: Any = None,
                 use_ray_service: bool = False, num_gpus: int | None = None, num_cpus: int | None = None,
                 actor_name: str | None = None, observation_spec_transform: SpecMap = None,
                 reward_spec_transform: SpecMap = None, done_spec_transform: SpecMap = None,
                 action_spec_transform: SpecMap = None, state_spec_transform: SpecMap = None) -> None:
        if use_ray_service:
            raise ValueError("ModuleTransform: use_ray_service=True needs a Ray service, which this library does "
                             "not provide; pass the module itself")
        if (module is None) == (module_factory is None):
            raise ValueError("ModuleTransform: pass exactly one of module and module_factory")
        if module_factory is not None:
            if not callable(module_factory):
                raise TypeError(f"ModuleTransform: module_factory must be callable, got {module_factory!r}")
            module = module_factory()
        if not callable(module):
            raise TypeError(f"ModuleTransform: module must be callable on a TensorDict, got {type(module).__name__}")
        super().__init__()
        self.device = None if device is None else torch.device(device)
        if self.device is not None and isinstance(module, nn.Module):
            module = module.to(self.device)
        self.module = module
        self.no_grad = no_grad
        self.inverse = inverse
        self.__dict__["_spec_maps"] = {
            "full_observation_spec": observation_spec_transform, "full_reward_spec": reward_spec_transform,
            "full_done_spec": done_spec_transform, "full_action_spec": action_spec_transform,
            "full_state_spec": state_spec_transform,
        }
        for part, m in self.__dict__["_spec_maps"].items():
            if m is not None and not (isinstance(m, Composite) or callable(m)):
                raise TypeError(f"ModuleTransform: the {part.split('_')[1]}_spec_transform must be a Composite or "
                                f"a callable, got {type(m).__name__}")

    def _run(self, tensordict: TensorDictBase) -> TensorDictBase:
        dev = self.device
        src = tensordict.device
        td = tensordict if dev is None or src == dev else tensordict.to(dev)
        ctx = torch.no_grad() if self.no_grad else contextlib.nullcontext()
        with ctx:
            out = self.module(td)
        out = td if out is None else out
        if dev is not None and src != dev and src is not None:
            out = out.to(src)
        return out

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict if self.inverse else self._run(tensordict)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        return self._call(tensordict_reset)

    @property
    def _has_inv(self) -> bool:
        return bool(self.__dict__.get("inverse", False))

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._run(tensordict) if self.inverse else tensordict

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._call(tensordict)

    def _map(self, part: str, spec: Composite) -> Composite:
        m = self.__dict__["_spec_maps"][part]
        if m is None:
            return spec
        new = m.clone() if isinstance(m, Composite) else m(spec)
        if not isinstance(new, Composite) or new.shape != spec.shape:
            raise ValueError(f"ModuleTransform: the {part.split('_')[1]}_spec_transform must give a Composite of "
                             f"shape {list(spec.shape)} (the env batch size), got {new!r}")
        new.unlock_()
        return new

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        for part in ("full_observation_spec", "full_reward_spec", "full_done_spec"):
            output_spec[part] = self._map(part, output_spec[part])
        return output_spec

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        for part in ("full_action_spec", "full_state_spec"):
            input_spec[part] = self._map(part, input_spec[part])
        return input_spec

    def __repr__(self) -> str:
        return f"ModuleTransform(module={type(self.module).__name__}, inverse={self.inverse}, no_grad={self.no_grad})"
