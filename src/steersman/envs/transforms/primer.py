"""TensorDictPrimer: entries the env does not produce (e.g. a recurrent policy's state)."""

from __future__ import annotations

from typing import Any

import torch

from steersman.data import Composite, TensorSpec
from steersman.tensordict import TensorDictBase
from steersman.tensordict._utils import NestedKey

from .base import Transform

__all__ = ["TensorDictPrimer"]


class TensorDictPrimer(Transform):
    """Adds entries to the env's observations: set at reset, carried from step to step.

    A recurrent policy reads its state (``"recurrent_state"``) from the root of the
    TensorDict and writes the next one under ``"next"``; step_mdp carries it over. The
    primer makes the env produce that entry at reset (zeros, ``default_value`` or a
    random draw from the spec) and declares it in the observation spec, so rollouts,
    collectors and batched envs allocate it. A step whose output lacks the entry (the
    policy did not write it) carries the previous value forward.

    Args:
        primers: ``{key: spec}`` or a :class:`Composite`; each spec is the shape of one
            sub-env's entry (``expand_specs=True``, the default when the spec has no batch
            dims) and is expanded to the env's batch.
        random: draw the reset values with ``spec.rand()`` instead of ``default_value``.
        default_value: a number, or ``{key: number}``.
        expand_specs: expand the specs to the env's batch shape (default: when the spec's
            leading dims are not already the batch shape).
        **kwargs: more ``key=spec`` primers (TorchRL's spelling).

    Example:
        >>> from steersman.data import Unbounded
        >>> from steersman.envs import CartPoleEnv, check_env_specs
        >>> from steersman.envs.transforms import TensorDictPrimer, TransformedEnv
        >>> env = TransformedEnv(CartPoleEnv(batch_size=[3], seed=0), TensorDictPrimer(h=Unbounded(shape=(2, 8))))
        >>> check_env_specs(env)
        >>> env.reset()["h"].shape                            # [*batch, 2, 8]
        torch.Size([3, 2, 8])
    """

    def __init__(
        self,
        primers: Composite | dict[NestedKey, TensorSpec] | None = None,
        random: bool = False,
        default_value: float | dict[NestedKey, float] = 0.0,
        reset_key: NestedKey | None = None,
        expand_specs: bool | None = None,
        **kwargs: TensorSpec,
    ) -> None:
        specs = dict(primers.items(include_nested=True, leaves_only=True)) if isinstance(primers, Composite) else dict(primers or {})
        specs.update(kwargs)
        if not specs:
            raise ValueError("TensorDictPrimer needs at least one primer: TensorDictPrimer(key=spec)")
        for key, spec in specs.items():
            if not isinstance(spec, TensorSpec) or isinstance(spec, Composite):
                raise TypeError(f"TensorDictPrimer: the primer {key!r} must be a leaf TensorSpec, got {type(spec).__name__}")
        self.primers = specs
        self.random = bool(random)
        self.default_value = default_value
        self.expand_specs = expand_specs
        self.reset_key = reset_key
        super().__init__()  # no in/out key pairs: the entries come from nowhere
        self._expanded: dict[NestedKey, TensorSpec] = {}

    def _value_of(self, key: NestedKey) -> float:
        dv = self.default_value
        return dv.get(key, 0.0) if isinstance(dv, dict) else dv

    def _batched(self, key: NestedKey, batch: torch.Size) -> TensorSpec:
        spec = self.primers[key]
        expand = self.expand_specs
        if expand is None:
            expand = tuple(spec.shape[: len(batch)]) != tuple(batch) or len(batch) == 0
        return spec.expand(*batch, *spec.shape) if expand and len(batch) else spec

    _check_spec_in_keys = False

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        output_spec["full_observation_spec"] = self.transform_observation_spec(
            output_spec["full_observation_spec"]
        )
        return output_spec

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        batch = observation_spec.shape
        for key in self.primers:
            spec = self._batched(key, batch)
            if spec.device != observation_spec.device and observation_spec.device is not None:
                spec = spec.to(observation_spec.device)
            observation_spec.set(key, spec)
            self._expanded[key] = spec
        return observation_spec

    def _initial(self, key: NestedKey, batch: torch.Size, device: Any) -> torch.Tensor:
        spec = self._expanded.get(key)
        if spec is None or tuple(spec.shape[: len(batch)]) != tuple(batch):
            spec = self._batched(key, batch)
        if self.random:
            value = spec.rand()
        else:
            value = torch.full(spec.shape, self._value_of(key), dtype=spec.dtype, device=spec.device)
        return value if device is None else value.to(device)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        batch = tensordict_reset.batch_size
        for key in self.primers:
            tensordict_reset.set(key, self._initial(key, batch, tensordict_reset.device))
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        for key in self.primers:
            if next_tensordict.get(key, None) is None:
                prev = tensordict.get(key, None)
                if prev is None:
                    prev = self._initial(key, next_tensordict.batch_size, next_tensordict.device)
                next_tensordict.set(key, prev)
        return next_tensordict

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Outside an env: fills missing primer entries with their reset value."""
        for key in self.primers:
            if tensordict.get(key, None) is None:
                tensordict.set(key, self._initial(key, tensordict.batch_size, tensordict.device))
        return tensordict

    def __repr__(self) -> str:
        return f"TensorDictPrimer(primers={list(self.primers)}, random={self.random}, default_value={self.default_value})"


