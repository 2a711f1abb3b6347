"""Gym-free envs and factories for the batched-env tests (module-level: picklable by
reference, so ParallelEnv workers of every start method can import them)."""

from __future__ import annotations

import os
import signal
import time

import torch

from steersman.data import Categorical, Composite, Unbounded
from steersman.envs import EnvBase
from steersman.tensordict import TensorDict


class ToyEnv(EnvBase):
    """A small deterministic-given-seed env with nested keys and per-sub-env episode lengths.

    Observation ``"observation" [*b, obs_dim]`` (float32) and ``("nested", "count")
    [*b, 1]`` (int64); action ``Unbounded([*b, 1])``. A reset draws a start vector
    and an episode length in ``[2, 6]`` from the env's own generator (seeded by
    ``set_seed``); ``terminated`` when the count reaches the length. Reward: the action
    plus the first observation component.

    Failure injection: ``fail_at`` (step number, counted since construction) with
    ``fail_mode`` ``"raise"`` (ValueError, once), ``"exit"`` (``os._exit(3)``), ``"kill"``
    (SIGKILL itself) or ``"sleep"`` (sleep 30 s); ``fail_in`` ``"step"`` or ``"reset"``.
    """

    def __init__(self, batch_size=(), obs_dim: int = 3, fail_at: int | None = None,
                 fail_mode: str = "raise", fail_in: str = "step", seed: int | None = None,
                 close_marker: str | None = None):
        super().__init__(batch_size=batch_size)
        self.close_marker = close_marker
        bs = self.batch_size
        self.observation_spec = Composite(
            observation=Unbounded((*bs, obs_dim)),
            nested=Composite(count=Unbounded((*bs, 1), dtype=torch.int64), shape=bs),
            shape=bs,
        )
        # Unbounded, not Bounded: Bounded's constructor imports sympy (through
        # torch.broadcast_shapes), seconds in every fresh process of these tests
        self.action_spec = Unbounded((*bs, 1))
        self.obs_dim = obs_dim
        self.fail_at, self.fail_mode, self.fail_in = fail_at, fail_mode, fail_in
        self.n_steps = 0
        self.n_resets = 0
        self.gen = torch.Generator()
        self._set_seed(seed)
        self.obs = torch.zeros(*bs, obs_dim)
        self.count = torch.zeros(*bs, 1, dtype=torch.int64)
        self.length = torch.full((*bs, 1), 3, dtype=torch.int64)

    def _set_seed(self, seed):
        self.gen.manual_seed(0 if seed is None else int(seed) % (2**63))

    def _close(self):
        if self.close_marker is not None:
            with open(self.close_marker, "a") as f:
                f.write(f"{os.getpid()}\n")

    def _maybe_fail(self, where: str, n: int) -> None:
        if self.fail_at is None or where != self.fail_in or n != self.fail_at:
            return
        if self.fail_mode == "raise":
            self.fail_at = None  # once: the env works again afterwards
            raise ValueError(f"ToyEnv failure injected at {where} {n}")
        if self.fail_mode == "exit":
            os._exit(3)
        if self.fail_mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.fail_mode == "sleep":
            time.sleep(30)

    def _flags(self, term):
        return {"done": term.clone(), "terminated": term, "truncated": torch.zeros_like(term)}

    def _reset(self, td):
        self._maybe_fail("reset", self.n_resets)
        self.n_resets += 1
        bs = self.batch_size
        mask = self._reset_mask(td)
        obs = torch.rand(*bs, self.obs_dim, generator=self.gen)
        length = torch.randint(2, 7, (*bs, 1), generator=self.gen)
        if mask is None:
            self.obs, self.length = obs, length
            self.count = torch.zeros_like(self.count)
        else:
            m = mask.reshape(*bs, 1)
            self.obs = torch.where(m, obs, self.obs)
            self.length = torch.where(m, length, self.length)
            self.count = torch.where(m, 0, self.count)
        return TensorDict(
            {"observation": self.obs.clone(), "nested": {"count": self.count.clone()},
             **self._flags(torch.zeros(*bs, 1, dtype=torch.bool))},
            batch_size=bs,
        )

    def _step(self, td):
        self._maybe_fail("step", self.n_steps)
        self.n_steps += 1
        action = td["action"]
        self.count = self.count + 1
        self.obs = self.obs + action
        term = self.count >= self.length
        return TensorDict(
            {"observation": self.obs.clone(), "nested": {"count": self.count.clone()},
             "reward": action + self.obs[..., :1], **self._flags(term)},
            batch_size=self.batch_size,
        )


def make_toy(**kwargs) -> ToyEnv:
    return ToyEnv(**kwargs)


def make_not_an_env(**kwargs):
    return {"this is": "not an env"}


class Unpicklable:
    """A callable whose instances refuse to be pickled."""

    def __call__(self, **kwargs):
        return ToyEnv(**kwargs)

    def __reduce__(self):
        raise TypeError("Unpicklable instances cannot be pickled")


class NullEnv(EnvBase):
    """The cheapest possible env (for overhead measurements): constant outputs."""

    def __init__(self, batch_size=()):
        super().__init__(batch_size=batch_size)
        bs = self.batch_size
        self.observation_spec = Composite(observation=Unbounded((*bs, 4)), shape=bs)
        self.action_spec = Categorical(2, shape=bs)
        f = torch.zeros(*bs, 1, dtype=torch.bool)
        self._out = TensorDict({"observation": torch.zeros(*bs, 4), "reward": torch.ones(*bs, 1),
                                "done": f, "terminated": f, "truncated": f}, batch_size=bs)
        self._reset_out = self._out.exclude("reward")

    def _set_seed(self, seed):
        pass

    def _reset(self, td):
        return self._reset_out.copy()

    def _step(self, td):
        return self._out.copy()
