"""Module-level envs, factories and policies for the collector tests (picklable by
reference, so worker processes of every start method can import them)."""

from __future__ import annotations

import functools

import torch

from steersman.envs import CartPoleEnv, EnvBase, GymEnv, ParallelEnv, SerialEnv
from steersman.tensordict.nn import TensorDictModule


class ArgmaxNet(torch.nn.Module):
    """``argmax(Linear(4, 2)(obs))``: a deterministic policy net with weights to update."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.lin(obs).argmax(-1)


class ArgmaxScoreNet(ArgmaxNet):
    """:class:`ArgmaxNet` that also returns the max score (a second policy output)."""

    def forward(self, obs: torch.Tensor):
        out = self.lin(obs)
        return out.argmax(-1), out.max(-1).values


def make_scoring_policy(seed: int = 0) -> TensorDictModule:
    torch.manual_seed(seed)
    return TensorDictModule(ArgmaxScoreNet(), ["observation"], ["action", "score"])


def make_policy(seed: int = 0) -> TensorDictModule:
    torch.manual_seed(seed)
    return TensorDictModule(ArgmaxNet(), ["observation"], ["action"])


def constant_weights(action: int) -> dict:
    """A state dict making :class:`ArgmaxNet` always choose ``action``."""
    bias = torch.zeros(2)
    bias[action] = 1.0
    return {"module.lin.weight": torch.zeros(2, 4), "module.lin.bias": bias}


class Unpicklable:
    """An env factory whose instances refuse to be pickled (by any pickler)."""

    def __call__(self) -> EnvBase:
        return CartPoleEnv()

    def __reduce__(self):
        raise TypeError("Unpicklable instances cannot be pickled")


def native4(seed: int | None = None) -> EnvBase:
    return CartPoleEnv(batch_size=[4], seed=seed)


def gym_cartpole() -> EnvBase:
    return GymEnv("CartPole-v1", categorical_action_encoding=True)


def serial2() -> EnvBase:
    return SerialEnv(2, CartPoleEnv)


def parallel2() -> EnvBase:
    return ParallelEnv(2, CartPoleEnv)


ENV_FNS = {"native": native4, "gym": gym_cartpole, "serial": serial2, "parallel": parallel2}


class FailingEnv(CartPoleEnv):
    """CartPole that raises ``ValueError`` at its ``fail_at``-th step (or dies, ``mode="exit"``,
    or hangs for 60 s, ``mode="sleep"``)."""

    def __init__(self, fail_at: int = 3, mode: str = "raise", **kwargs) -> None:
        super().__init__(**kwargs)
        self.fail_at, self.mode, self.n = fail_at, mode, 0

    def _check(self) -> None:
        self.n += 1
        if self.n == self.fail_at:
            if self.mode == "exit":
                import os

                os._exit(3)
            if self.mode == "sleep":
                import time

                time.sleep(60)
            raise ValueError(f"FailingEnv failure injected at step {self.n}")

    def _step(self, td):
        self._check()
        return super()._step(td)

    def step_and_maybe_reset(self, td):
        self._check()
        return super().step_and_maybe_reset(td)


failing = functools.partial(FailingEnv, fail_at=3)


# ---------------------------------------------------------------------- checks
def td_equal(a, b) -> bool:
    """Same keys, and equal leaves (NaN-free data)."""
    ka = sorted(map(str, a.keys(include_nested=True, leaves_only=True)))
    kb = sorted(map(str, b.keys(include_nested=True, leaves_only=True)))
    if ka != kb or a.batch_size != b.batch_size:
        return False
    return all(torch.equal(a.get(k), b.get(k)) for k in a.keys(include_nested=True, leaves_only=True))


def check_traj_ids(batch, prev_last=None):
    """Asserts the ``("collector", "traj_ids")`` invariants of a ``[*B, T]`` batch.

    Per sub-env (row): an id changes exactly after a done step, and then to a larger
    id; rows never share an id. ``prev_last``: the previous batch's last ``(ids, done)``
    per row, to check the continuation across batches. Returns this batch's.
    """
    T = batch.batch_size[-1]
    ids = batch["collector", "traj_ids"].reshape(-1, T)
    done = batch["next", "done"].reshape(ids.shape[0], T, -1).any(-1)
    seen: dict[int, int] = {}
    for r in range(ids.shape[0]):
        row, d = ids[r].tolist(), done[r].tolist()
        if prev_last is not None:
            last_id, last_done = prev_last[0][r], prev_last[1][r]
            assert (row[0] != last_id) == last_done, f"row {r}: id {last_id}->{row[0]}, done={last_done}"
            assert row[0] >= last_id
        for t in range(T - 1):
            if d[t]:
                assert row[t + 1] > row[t], f"row {r}: a done at step {t} but the id does not change"
            else:
                assert row[t + 1] == row[t], f"row {r}: the id changes at step {t + 1} without a done"
        for i in set(row):
            assert seen.setdefault(i, r) == r, f"trajectory id {i} appears in rows {seen[i]} and {r}"
    return ids[:, -1].tolist(), done[:, -1].tolist()


def per_worker(batches, num_workers):
    """Groups batches of a multi collector by worker (``traj_id % num_workers``)."""
    out: dict[int, list] = {}
    for b in batches:
        w = set((b["collector", "traj_ids"] % num_workers).unique().tolist())
        assert len(w) == 1, f"a batch mixes workers {w}"
        out.setdefault(w.pop(), []).append(b)
    return out


def parallel2_fork() -> EnvBase:
    """A ParallelEnv for use *inside* collector workers: ``fork`` (the worker is a fresh
    single-threaded process) avoids starting one more forkserver per worker."""
    return ParallelEnv(2, CartPoleEnv, mp_start_method="fork")


WORKER_ENV_FNS = {"native": native4, "gym": gym_cartpole, "serial": serial2, "parallel": parallel2_fork}
