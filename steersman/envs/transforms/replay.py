"""Replay-buffer transforms (applied when data is written, through ``inv``): Reward2GoTransform."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from steersman.data import Composite
from steersman.tensordict import TensorDictBase
from steersman.tensordict._utils import NestedKey, unravel_key

from ._utils import key_list, missing_key
from .base import Transform

__all__ = ["Reward2GoTransform"]


def _next(key: NestedKey) -> tuple:
    return ("next", *((key,) if type(key) is str else key))


class Reward2GoTransform(Transform):
    """Writes the discounted reward-to-go of each step of finished trajectories.

    ``G_t = r_t + gamma * G_{t+1}``, restarting after each step whose done (or truncated)
    flag is set: the sum of the discounted rewards from ``t`` to the end of its episode.
    The last batch dim is time. An inverse-only transform (as in TorchRL): it runs in
    :meth:`inv`, i.e. when a replay buffer writes data (``extend``); sampling returns the
    stored values unchanged. It cannot be used in an env (the future rewards are not
    known while stepping). A trajectory cut by the end of the batch is treated as ending
    there.

    Args:
        gamma: the discount factor (default 1.0).
        in_keys: the reward entries (default ``[("next", "reward")]``).
        out_keys: where the reward-to-go goes (default: ``in_keys``).
        done_key: the done flag, read under ``"next"`` (default ``"done"``).
        truncated_key: also ends episodes when present under ``"next"`` (default
            ``"truncated"``).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs.transforms import Reward2GoTransform
        >>> td = TensorDict({"next": {"reward": torch.ones(4, 1),
        ...                           "done": torch.tensor([[False], [True], [False], [False]])}},
        ...                 batch_size=[4])
        >>> Reward2GoTransform(gamma=0.5, out_keys=["r2g"]).inv(td)["r2g"].squeeze(-1)
        tensor([1.5000, 1.0000, 1.5000, 1.0000])
    """

    def __init__(self, gamma: float | Tensor = 1.0, in_keys: Any = None, out_keys: Any = None,
                 done_key: NestedKey = "done", truncated_key: NestedKey = "truncated") -> None:
        g = torch.as_tensor(gamma, dtype=torch.get_default_dtype())
        if g.numel() != 1 or not bool(g.isfinite().all()):
            raise ValueError(f"Reward2GoTransform: gamma must be one finite number, got {gamma!r}")
        in_keys = key_list([("next", "reward")] if in_keys is None else in_keys, "Reward2GoTransform", "in_keys")
        out_keys = in_keys if out_keys is None else out_keys
        super().__init__(in_keys, out_keys, in_keys, out_keys)
        self._pairs  # noqa: B018  (validates the lengths now)
        self.register_buffer("gamma", g.reshape(()))
        self.done_key = unravel_key(done_key)
        self.truncated_key = None if truncated_key is None else unravel_key(truncated_key)

    def _episode_end(self, td: TensorDictBase) -> Tensor:
        """``[*batch, T]`` bool: True where the step ends an episode."""
        done = td.get(_next(self.done_key), None)
        if done is None:
            raise missing_key(self, _next(self.done_key), td, "done_key")
        bs = td.batch_size
        end = done.reshape(*bs, -1).any(-1)
        if self.truncated_key is not None:
            trunc = td.get(_next(self.truncated_key), None)
            if trunc is not None:
                end = end | trunc.reshape(*bs, -1).any(-1)
        return end

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        if tensordict.batch_dims == 0:
            raise ValueError("Reward2GoTransform needs a trajectory: a TensorDict whose last batch dim is "
                             "time (got batch_size [])")
        end = self._episode_end(tensordict)
        tdim = tensordict.batch_dims - 1
        T = tensordict.batch_size[-1]
        for ik, ok in self._pairs:
            r = tensordict.get(ik, None)
            if r is None:
                raise missing_key(self, ik, tensordict)
            g = self.gamma.to(device=r.device, dtype=r.dtype if r.is_floating_point() else self.gamma.dtype)
            rf = r.to(g.dtype)
            cont = (~end).reshape(*end.shape, *([1] * (r.ndim - end.ndim))).to(g.dtype)
            out = torch.empty_like(rf)
            acc = torch.zeros_like(rf.select(tdim, 0))
            for t in range(T - 1, -1, -1):
                acc = rf.select(tdim, t) + g * acc * cont.select(tdim, t)
                out.select(tdim, t).copy_(acc)
            tensordict.set(ok, out)
        return tensordict

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Sampling: the stored values are returned unchanged (the work is done in ``inv``)."""
        return tensordict

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        raise ValueError("Reward2GoTransform cannot be used in an env: the reward-to-go needs the rewards of "
                         "the whole trajectory; use it as a replay-buffer transform (it runs on extend)")

    def __repr__(self) -> str:
        return (f"Reward2GoTransform(gamma={float(self.gamma)}, in_keys={self.in_keys}, "
                f"out_keys={self.out_keys}, done_key={self.done_key!r})")
