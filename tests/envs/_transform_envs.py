"""Small envs for the transform tests (module-level so SerialEnv/ParallelEnv can build them)."""

from __future__ import annotations

from typing import Any

import torch

from steersman.data import Bounded, Categorical, Composite, OneHot
from steersman.envs import EnvBase
from steersman.tensordict import TensorDict


class PixelToyEnv(EnvBase):
    """A deterministic env with a vector observation, an image and (optionally) an action mask.

    * ``"observation"``: ``[*b, 3]`` in ``[-10, 10]`` (``dtype``), ``"pixels"``: ``uint8
      [*b, H, W, 3]`` (HWC, as a renderer gives them), ``"action_mask"``: ``bool [*b, 4]``
      (with ``mask="fixed"``: sub-env ``i`` never allows action ``i % 4``; ``"dynamic"``:
      action ``count % 4`` is not allowed).
    * action: ``Categorical(4) [*b]`` (default), ``OneHot(4) [*b, 4]`` with
      ``onehot=True`` or ``Bounded(-1, 1, [*b, 2])`` of ``action_dtype`` with
      ``continuous=True``.
    * reward ``[*b, reward_dim]`` (``dtype``): ``(0.5 + count / 10) * (j + 1) / reward_dim``
      for objective ``j`` (one objective by default); sub-env ``i`` terminates after
      ``3 + i % 4`` steps (partial resets in batched rollouts).
    """

    def __init__(self, batch_size: Any = (), dtype: torch.dtype = torch.float32, mask: str | None = None,
                 continuous: bool = False, action_dtype: torch.dtype = torch.float32,
                 height: int = 8, width: int = 10, onehot: bool = False, reward_dim: int = 1) -> None:
        super().__init__(batch_size=batch_size)
        bs = self.batch_size
        self.dtype, self.mask, self.H, self.W = dtype, mask, height, width
        specs = {
            "observation": Bounded(-10.0, 10.0, shape=(*bs, 3), dtype=dtype),
            "pixels": Bounded(0, 255, shape=(*bs, height, width, 3), dtype=torch.uint8),
        }
        if mask is not None:
            specs["action_mask"] = Categorical(2, shape=(*bs, 4), dtype=torch.bool)
        self.observation_spec = Composite(specs, shape=bs)
        if continuous:
            self.action_spec = Bounded(-1.0, 1.0, shape=(*bs, 2), dtype=action_dtype)
        elif onehot:
            self.action_spec = OneHot(4, shape=(*bs, 4))
        else:
            self.action_spec = Categorical(4, shape=bs)
        self.reward_spec = Bounded(0.0, 2.0, shape=(*bs, reward_dim), dtype=dtype)
        self.reward_weights = torch.arange(1, reward_dim + 1, dtype=dtype) / reward_dim
        n = bs.numel()
        self.length = (3 + torch.arange(n) % 4).reshape(*bs, 1)
        self.index = torch.arange(n).reshape(*bs, 1)
        self.count = torch.zeros(*bs, 1, dtype=torch.int64)
        self.actions_seen: list[torch.Tensor] = []

    def _obs(self) -> dict:
        bs = self.batch_size
        c = self.count.to(self.dtype)
        obs = torch.cat([c, -c, self.index.to(self.dtype) * 0.5], -1).clamp(-10, 10)
        base = (self.count * 17 + self.index * 5).reshape(*bs, 1, 1, 1)
        grid = torch.arange(self.H * self.W * 3).reshape(self.H, self.W, 3)
        out = {"observation": obs, "pixels": ((base + grid) % 256).to(torch.uint8)}
        if self.mask is not None:
            bad = (self.index if self.mask == "fixed" else self.count) % 4
            out["action_mask"] = torch.arange(4).expand(*bs, 4) != bad
        return out

    def _flags(self, term: torch.Tensor) -> dict:
        return {"done": term.clone(), "terminated": term, "truncated": torch.zeros_like(term)}

    def _reset(self, tensordict: Any, **kwargs: Any) -> TensorDict:
        mask = self._reset_mask(tensordict)
        if mask is None:
            self.count = torch.zeros_like(self.count)
        else:
            self.count = torch.where(mask.unsqueeze(-1), 0, self.count)
        out = self._obs()
        out.update(self._flags(torch.zeros(*self.batch_size, 1, dtype=torch.bool)))
        return TensorDict(out, batch_size=self.batch_size)

    def _step(self, tensordict: Any) -> TensorDict:
        action = tensordict.get("action")
        self.actions_seen.append(action.clone())
        self.count = self.count + 1
        out = self._obs()
        out["reward"] = (0.5 + self.count.to(self.dtype) / 10).clamp(0, 2) * self.reward_weights
        out.update(self._flags(self.count >= self.length))
        return TensorDict(out, batch_size=self.batch_size)

    def _set_seed(self, seed: int | None) -> None:
        pass


class TwoAgentEnv(EnvBase):
    """Two agents with the same specs under different keys (for ``Stack``).

    ``("agent_0"|"agent_1", "obs")``: ``[*b, 2]`` in ``[-10, 10]``: ``[count, agent action]``;
    actions ``"act_0"``/``"act_1"``: ``Bounded(-1, 1, [*b, 1])``; reward ``[*b, 1]`` = the
    sum of the actions; episodes end after 5 steps. ``self.actions_seen`` records
    ``(act_0, act_1)`` of each step.
    """

    def __init__(self, batch_size: Any = ()) -> None:
        super().__init__(batch_size=batch_size)
        bs = self.batch_size
        self.observation_spec = Composite(
            {f"agent_{i}": Composite(obs=Bounded(-10.0, 10.0, shape=(*bs, 2)), shape=bs) for i in (0, 1)},
            shape=bs)
        self.action_spec = Composite({f"act_{i}": Bounded(-1.0, 1.0, shape=(*bs, 1)) for i in (0, 1)}, shape=bs)
        self.reward_spec = Bounded(-2.0, 2.0, shape=(*bs, 1))
        self.count = torch.zeros(*bs, 1)
        self.actions_seen: list = []

    def _out(self, a0: torch.Tensor, a1: torch.Tensor) -> dict:
        term = self.count >= 5
        return {"agent_0": {"obs": torch.cat([self.count, a0], -1)},
                "agent_1": {"obs": torch.cat([self.count, a1], -1)},
                "done": term.clone(), "terminated": term, "truncated": torch.zeros_like(term)}

    def _reset(self, tensordict: Any, **kwargs: Any) -> TensorDict:
        mask = self._reset_mask(tensordict)
        self.count = torch.zeros_like(self.count) if mask is None else torch.where(
            mask.unsqueeze(-1), 0.0, self.count)
        z = torch.zeros_like(self.count)
        return TensorDict(self._out(z, z), batch_size=self.batch_size)

    def _step(self, tensordict: Any) -> TensorDict:
        a0, a1 = tensordict.get("act_0"), tensordict.get("act_1")
        self.actions_seen.append((a0.clone(), a1.clone()))
        self.count = self.count + 1
        out = self._out(a0, a1)
        out["reward"] = a0 + a1
        return TensorDict(out, batch_size=self.batch_size)

    def _set_seed(self, seed: int | None) -> None:
        pass


class EmptySpecsEnv(PixelToyEnv):
    """The toy env with empty Composite entries: ``("other", "another")`` (an observation),
    written as an empty TensorDict, and ``"memory"`` (an empty
    state entry; ``self.memory_seen`` records whether each step received it) (for
    ``RemoveEmptySpecs``)."""

    def __init__(self, batch_size: Any = ()) -> None:
        super().__init__(batch_size)
        bs = self.batch_size
        obs = self.observation_spec.clone()
        obs.unlock_()
        obs["other"] = Composite(another=Composite(shape=bs), shape=bs)
        self.observation_spec = obs
        self.state_spec = Composite(memory=Composite(shape=bs), shape=bs)
        self.memory_seen: list = []

    def _empty(self) -> TensorDict:
        return TensorDict({"another": TensorDict({}, batch_size=self.batch_size)}, batch_size=self.batch_size)

    def _reset(self, tensordict: Any, **kwargs: Any) -> TensorDict:
        out = super()._reset(tensordict, **kwargs)
        out["other"] = self._empty()
        return out

    def _step(self, tensordict: Any) -> TensorDict:
        self.memory_seen.append(isinstance(tensordict.get("memory", None), TensorDict))
        out = super()._step(tensordict)
        out["other"] = self._empty()
        return out


def make_env(kind: str, batch_size: Any = ()) -> EnvBase:
    """The base envs of the transform battery, by name."""
    from steersman.envs import CartPoleEnv, PendulumEnv

    if kind == "cartpole":
        return CartPoleEnv(batch_size=batch_size, seed=0)
    if kind == "cartpole64":
        return CartPoleEnv(batch_size=batch_size, seed=0, dtype=torch.float64)
    if kind == "pendulum":
        return PendulumEnv(batch_size=batch_size, seed=0)
    if kind == "toy":
        return PixelToyEnv(batch_size)
    if kind == "toy64":
        return PixelToyEnv(batch_size, dtype=torch.float64, continuous=True, action_dtype=torch.float64)
    if kind == "toy_mask":
        return PixelToyEnv(batch_size, mask="fixed")
    if kind == "toy_onehot":
        return PixelToyEnv(batch_size, onehot=True)
    if kind == "toy_mo":
        return PixelToyEnv(batch_size, reward_dim=3)
    if kind == "agents":
        return TwoAgentEnv(batch_size)
    if kind == "toy_empty":
        return EmptySpecsEnv(batch_size)
    if kind == "toy_matrix_action":  # a [2, 3] continuous action
        env = PixelToyEnv(batch_size, continuous=True)
        env.action_spec = Bounded(-1.0, 1.0, shape=(*env.batch_size, 2, 3))
        return env
    if kind == "lives":  # a life counter (EndOfLifeTransform)
        from steersman.envs.transforms.episodes import _LivesEnv

        return _LivesEnv(batch_size)
    if kind in ("countdown", "countdown_final"):  # resets itself when an episode ends
        from steersman.envs.transforms.autoreset import _CountdownEnv

        return _CountdownEnv(length=3, batch_size=batch_size, final=kind == "countdown_final")
    raise ValueError(kind)


def make_cartpole() -> EnvBase:
    return make_env("cartpole")


def make_toy() -> EnvBase:
    return make_env("toy")
