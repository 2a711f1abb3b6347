"""TrajCounter: a global trajectory id, a new one at every (partial) reset."""

from __future__ import annotations

from typing import Any

import torch

from steersman.data import Bounded, Composite
from steersman.tensordict import TensorDictBase
from steersman.tensordict._utils import NestedKey

from ._utils import expand_mask, key_list, reset_mask
from .base import Transform

__all__ = ["TrajCounter"]

_I64_MAX = torch.iinfo(torch.int64).max


class TrajCounter(Transform):
    """Numbers the trajectories of an env: each reset sub-env gets the next id (0, 1, 2, ...).

    Args:
        out_key: the id entry (an observation, ``int64 [*batch, 1]``; default
            ``"traj_count"``).

    Keyword Args:
        repeats: accepted for TorchRL compatibility; only ``None`` (each reset starts a
            new trajectory) is supported.

    A full reset of a batch of ``n`` sub-envs gives them the next ``n`` ids in order; a
    partial reset gives new ids to the reset sub-envs only. Each step copies the id to
    ``"next"``. The running total is the transform's state (``state_dict()["count"]``):
    it is shared by the sub-envs of one TransformedEnv; transforms inside the workers of
    a ParallelEnv count separately (wrap the ParallelEnv instead). Outside an env,
    ``forward`` returns the data unchanged (ids are only known while collecting).

    Example:
        >>> import torch
        >>> from steersman.envs import PendulumEnv, check_env_specs
        >>> from steersman.envs.transforms import Compose, StepCounter, TrajCounter, TransformedEnv
        >>> env = TransformedEnv(PendulumEnv(seed=0), Compose(StepCounter(2), TrajCounter()))
        >>> env.rollout(6, break_when_any_done=False)["next", "traj_count"].squeeze(-1)
        tensor([0, 0, 1, 1, 2, 2])
    """

    _check_spec_in_keys = False

    def __init__(self, out_key: NestedKey = "traj_count", *, repeats: int | None = None) -> None:
        if repeats is not None:
            raise ValueError(f"TrajCounter: repeats={repeats!r} is not supported (only None: every reset "
                             "starts a new trajectory)")
        super().__init__()
        self.out_key = key_list(out_key, "TrajCounter", "out_key")[0]
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))

    @property
    def out_keys(self) -> list[NestedKey]:  # type: ignore[override]
        return [self.out_key]

    @out_keys.setter
    def out_keys(self, keys: Any) -> None:
        pass

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        bs = tensordict_reset.batch_size
        n = bs.numel()
        mask = reset_mask(tensordict, bs)
        start = self.count
        dev = start.device
        if mask is None:
            ids = (start + torch.arange(n, device=dev)).reshape(*bs, 1)
            self.count.add_(n)
        else:
            flat = mask.reshape(-1).to(dev)
            k = int(flat.sum())
            ids = torch.zeros(n, dtype=torch.int64, device=dev)
            ids[flat] = start + torch.arange(k, device=dev)
            ids = ids.reshape(*bs, 1)
            prev = tensordict.get(self.out_key, None)
            if prev is not None:  # the sub-envs that are not reset keep their id
                ids = torch.where(expand_mask(mask.to(dev), ids), ids, prev.to(dev))
            self.count.add_(k)
        tensordict_reset.set(self.out_key, ids)
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        ids = tensordict.get(self.out_key, None)
        if ids is None:
            raise KeyError(f"TrajCounter: the step input has no {self.out_key!r} entry; step from a "
                           "TensorDict returned by reset() (or a previous step)")
        next_tensordict.set(self.out_key, ids.clone())
        return next_tensordict

    def _spec(self, shape: torch.Size, device: Any) -> Bounded:
        return Bounded(0, _I64_MAX, shape=(*shape, 1), device=device, dtype=torch.int64)

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        obs = output_spec["full_observation_spec"]
        obs.set(self.out_key, self._spec(obs.shape, obs.device))
        return output_spec

    def transform_state_spec(self, state_spec: Composite) -> Composite:
        # the id is an input of the step too: batched envs pass it to their workers
        state_spec.set(self.out_key, self._spec(state_spec.shape, state_spec.device))
        return state_spec

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict

    def __repr__(self) -> str:
        return f"TrajCounter(out_key={self.out_key!r}, count={int(self.count)})"
