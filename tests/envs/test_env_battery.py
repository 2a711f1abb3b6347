"""The env contract, checked on every env kind.

Kinds: each native env (and CartPole unbatched, one-hot and compiled), Gymnasium envs
through ``GymEnv`` (single, categorical, continuous, vector), ``SerialEnv``,
``ParallelEnv`` (one 2-worker env for the whole module: they are slow to start),
``TransformedEnv`` (a step counter and an observation transform; an inverse action
transform) and a plain ``EnvBase`` subclass (the base class's own action check).

Contract: ``check_env_specs``; done/terminated/truncated of shape ``[*batch, 1]`` with
``done == terminated | truncated`` and truncation exactly at the time limit;
reset/step/partial reset (``"_reset"`` mask: the other sub-envs are untouched and carry
on as if nothing happened); ``step_and_maybe_reset`` (finished sub-envs reset, the others
carried over); ``rollout`` (the next input is the previous ``"next"``); seeding (the
same seed gives the same rollout, another seed another); state save and restore where
the env has ``get_state``/``set_state``; out-of-spec actions refused with an
``InvalidActionError`` naming the env, key, spec and value, the env unchanged (a replay
with and without the refused calls is identical, resets after it included).

Every kind has a time limit of ``T`` steps so that episodes end within the tests.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import torch

from steersman import TensorDict
from steersman.data import Categorical, Composite, OneHot, Unbounded
from steersman.envs import (
    AcrobotEnv,
    CartPoleEnv,
    Compose,
    DoubleToFloat,
    EnvBase,
    GridWorldEnv,
    InvalidActionError,
    MountainCarContinuousEnv,
    MountainCarEnv,
    ObservationNorm,
    ParallelEnv,
    PendulumEnv,
    SerialEnv,
    StepCounter,
    TransformedEnv,
    check_env_specs,
    step_mdp,
)

T = 10  # the time limit of every kind


class RandomWalkEnv(EnvBase):
    """A plain ``EnvBase`` subclass: a walk on the integers, actions -1/0/+1.

    Starts in {-1, 0, 1} drawn from a hash of (seed, sub-env, episode number), so each
    sub-env's stream is its own; terminated at ``|x| >= 3``, truncated after ``T`` steps.
    """

    def __init__(self, batch_size: Any = (3,)) -> None:
        super().__init__(batch_size=batch_size)
        bs = self.batch_size
        self.observation_spec = Composite(position=Unbounded((*bs, 1)),
                                          elapsed=Unbounded((*bs, 1), dtype=torch.int64), shape=bs)
        self.action_spec = Categorical(3, shape=bs)
        n = bs.numel()
        self.index = torch.arange(n).reshape(bs)
        self.seed = 0
        self.x = torch.zeros(bs)
        self.t = torch.zeros(bs, dtype=torch.int64)
        self.episode = torch.zeros(bs, dtype=torch.int64)

    def _set_seed(self, seed: int | None) -> None:
        self.seed = 0 if seed is None else int(seed)
        self.episode = torch.zeros_like(self.episode)

    def _flags(self, term: torch.Tensor, trunc: torch.Tensor) -> dict:
        return {"done": (term | trunc).unsqueeze(-1), "terminated": term.unsqueeze(-1),
                "truncated": trunc.unsqueeze(-1)}

    def _reset(self, tensordict: Any, **kwargs: Any) -> TensorDict:
        mask = self._reset_mask(tensordict)
        if mask is None:
            mask = torch.ones(self.batch_size, dtype=torch.bool)
        start = (self.seed * 7919 + self.index * 104729 + self.episode * 1299709) % 3 - 1
        self.x = torch.where(mask, start.to(self.x.dtype), self.x)
        self.t = torch.where(mask, 0, self.t)
        self.episode = self.episode + mask.long()
        no = torch.zeros(self.batch_size, dtype=torch.bool)
        return TensorDict({**self._obs(), **self._flags(no, no)}, batch_size=self.batch_size)

    def _step(self, tensordict: Any) -> TensorDict:
        self.x = self.x + (tensordict.get("action") - 1).to(self.x.dtype)
        self.t = self.t + 1
        term = self.x.abs() >= 3
        return TensorDict({**self._obs(), "reward": -self.x.abs().unsqueeze(-1), **self._flags(term, self.t >= T)},
                          batch_size=self.batch_size)

    def _obs(self) -> dict:
        return {"position": self.x.unsqueeze(-1).clone(), "elapsed": self.t.unsqueeze(-1).clone()}


def _gym(env_id: str, **kwargs: Any) -> Callable[[], EnvBase]:
    def make() -> EnvBase:
        pytest.importorskip("gymnasium")  # an optional dependency
        from steersman.envs import GymEnv

        return GymEnv(env_id, max_episode_steps=T, **kwargs)
    return make


def _native(cls: type, **kwargs: Any) -> Callable[[], EnvBase]:
    return partial(cls, batch_size=kwargs.pop("batch_size", [3]), max_episode_steps=T, **kwargs)


def _transformed() -> EnvBase:
    norm = ObservationNorm(loc=torch.tensor([0.0, 1.0, 0.0, -1.0]), scale=torch.tensor([2.0, 0.5, 4.0, 1.0]),
                           in_keys=["observation"])
    return TransformedEnv(CartPoleEnv(batch_size=[3]), Compose(StepCounter(max_steps=T), norm))


def _transformed_inverse() -> EnvBase:
    """Float64 Pendulum seen as float32: the action goes through an inverse transform."""
    base = PendulumEnv(batch_size=[2], dtype=torch.float64, max_episode_steps=T)
    return TransformedEnv(base, DoubleToFloat(in_keys=["observation"], in_keys_inv=["action"]))


#: kind -> (factory, how its errors name it)
KINDS: dict[str, tuple[Callable[[], EnvBase], str]] = {
    "cartpole": (_native(CartPoleEnv), "CartPoleEnv"),
    "cartpole-unbatched": (_native(CartPoleEnv, batch_size=[]), "CartPoleEnv"),
    "cartpole-onehot": (_native(CartPoleEnv, categorical_action_encoding=False), "CartPoleEnv"),
    # the compiled step path (fullgraph, int32 done flags) through aot_eager: seconds instead of
    # inductor's C++ build; tests/envs/test_native.py proves inductor's numbers equal eager's
    "cartpole-compiled": (_native(CartPoleEnv, compile={"backend": "aot_eager"}), "CartPoleEnv"),
    "pendulum": (_native(PendulumEnv), "PendulumEnv"),
    "mountaincar": (_native(MountainCarEnv), "MountainCarEnv"),
    "mountaincar-continuous": (_native(MountainCarContinuousEnv), "MountainCarContinuousEnv"),
    "acrobot": (_native(AcrobotEnv), "AcrobotEnv"),
    "gridworld": (_native(GridWorldEnv, batch_size=[2, 2]), "GridWorldEnv"),
    "gym-cartpole": (_gym("CartPole-v1"), "GymEnv('CartPole-v1')"),
    "gym-cartpole-categorical": (_gym("CartPole-v1", categorical_action_encoding=True), "GymEnv('CartPole-v1')"),
    "gym-pendulum": (_gym("Pendulum-v1"), "GymEnv('Pendulum-v1')"),
    "gym-cartpole-vector": (_gym("CartPole-v1", num_envs=2), "GymEnv('CartPole-v1')"),
    "serial": (partial(SerialEnv, 2, partial(CartPoleEnv, max_episode_steps=T)), "SerialEnv"),
    "parallel": (partial(ParallelEnv, 2, partial(CartPoleEnv, max_episode_steps=T)), "ParallelEnv"),
    "transformed": (_transformed, "CartPoleEnv"),
    "transformed-inverse": (_transformed_inverse, "TransformedEnv"),
    "custom": (RandomWalkEnv, "RandomWalkEnv"),
}
ALL = list(KINDS)
#: kinds with get_state/set_state (the native envs, also through a TransformedEnv)
STATEFUL = [k for k in ALL if k not in ("custom", "serial", "parallel") and not k.startswith("gym")]


@pytest.fixture(scope="module")
def envs():
    """``envs(kind)``: one env per kind for the whole module (built on first use)."""
    made: dict[str, EnvBase] = {}

    def get(kind: str) -> EnvBase:
        if kind not in made:
            made[kind] = KINDS[kind][0]()
        return made[kind]

    yield get
    for env in made.values():
        env.close()


# ---------------------------------------------------------------------- helpers
def _leaves(td: Any) -> dict:
    return {k: td.get(k) for k in td.keys(include_nested=True, leaves_only=True)}


def _assert_td_equal(a: Any, b: Any, what: str = "") -> None:
    la, lb = _leaves(a), _leaves(b)
    assert la.keys() == lb.keys(), what
    for k in la:
        assert torch.equal(la[k], lb[k]), f"{what}: entry {k!r} differs"


def _batch_mask(env: EnvBase, first: bool) -> torch.Tensor:
    """A ``[*batch]`` bool mask flagging the first sub-env (``first``) or none."""
    m = torch.zeros(env.batch_size.numel(), dtype=torch.bool)
    m[0] = first
    return m.reshape(env.batch_size)


def _bad_action(spec: Any) -> tuple[torch.Tensor, str]:
    """An action outside ``spec`` and a piece of the message that names the bad value."""
    if isinstance(spec, OneHot):
        return torch.ones(spec.shape, dtype=spec.dtype), "exactly one 1"
    if isinstance(spec, Categorical):
        a = spec.zero()
        a.view(-1)[-1] = spec.n + 3
        return a, f"first at index {tuple(int(i) - 1 for i in spec.shape)}: {spec.n + 3}"
    a = spec.zero()
    a.view(-1)[-1] = float("nan")
    return a, "NaN"


# ---------------------------------------------------------------------- the contract
@pytest.mark.parametrize("kind", ALL)
def test_specs_and_done_convention(kind, envs):
    env = envs(kind)
    check_env_specs(env, seed=0, max_steps=2 * T)  # every entry in its spec, partial resets too
    bs = tuple(env.batch_size)
    for key in ("done", "terminated", "truncated"):
        spec = env.full_done_spec[key]
        assert spec.shape == (*bs, 1) and spec.dtype is torch.bool, key
    assert env.full_reward_spec["reward"].shape == (*bs, 1)
    td = env.reset()
    for key in ("done", "terminated", "truncated"):
        assert td[key].shape == (*bs, 1) and td[key].dtype is torch.bool and not td[key].any(), key


@pytest.mark.parametrize("kind", ALL)
def test_step_and_maybe_reset_and_time_limit(kind, envs):
    """Over 2T+3 steps: done == terminated | truncated, truncation exactly at T steps,
    finished sub-envs start over, the others carry their "next" entries over."""
    env = envs(kind)
    bs = tuple(env.batch_size)
    env.set_seed(5)
    torch.manual_seed(2)
    td = env.reset()
    ep_len = torch.zeros(bs, dtype=torch.int64)
    ends = 0
    for _ in range(2 * T + 3):
        td = env.rand_action(td)
        cur, td = env.step_and_maybe_reset(td)
        nxt = cur["next"]
        done, term, trunc = nxt["done"], nxt["terminated"], nxt["truncated"]
        for flag in (done, term, trunc, nxt["reward"]):
            assert flag.shape == (*bs, 1)
        assert torch.equal(done, term | trunc)
        ep_len += 1
        at_limit = (ep_len == T).unsqueeze(-1)
        assert bool((done | ~at_limit).all()), "an episode went past the time limit"
        assert not bool((trunc & ~at_limit).any()), "truncated before the time limit"
        d = done.reshape(bs)
        for key in env.observation_keys:
            assert torch.equal(td[key][~d], nxt[key][~d]), f"{key!r} not carried over"
        assert not td["done"].any() and not td["terminated"].any() and not td["truncated"].any()
        ep_len[d] = 0
        ends += int(d.sum())
    assert ends >= env.batch_size.numel()  # every sub-env hit the limit at least once


@pytest.mark.parametrize("kind", ALL)
def test_partial_reset(kind, envs):
    """A reset with a ``"_reset"`` mask resets the flagged sub-envs only: the others keep
    their entries and carry on exactly as without the reset."""
    env = envs(kind)
    steps = 4

    def drive(mask: torch.Tensor | None) -> list:
        env.set_seed(11)
        torch.manual_seed(1)
        td = env.reset()
        out = []
        for t in range(steps):
            if mask is not None and t == 2:
                before = td.clone()
                inp = td.clone()
                inp.set("_reset", mask.unsqueeze(-1))
                td = env.reset(inp)
                assert "_reset" not in td.keys()
                for key in env.observation_keys:
                    assert torch.equal(td[key][~mask], before[key][~mask]), key
                assert not td["done"].any()
            td = env.step(env.rand_action(td))
            out.append(td["next"].clone())
            td = step_mdp(td)
        return out

    ref = drive(None)
    for first in (False, True):
        mask = _batch_mask(env, first)
        got = drive(mask)
        for a, b in zip(ref, got):
            for k, v in _leaves(a).items():
                assert torch.equal(v[~mask], b.get(k)[~mask]), f"sub-envs not reset changed {k!r}"
    if env.batch_size.numel() > 1:  # the flagged sub-env did start over
        assert any(not torch.equal(ref[-1][k], got[-1][k]) for k in env.observation_keys)


@pytest.mark.parametrize("kind", ALL)
def test_rollout(kind, envs):
    env = envs(kind)
    nb = len(env.batch_size)
    env.set_seed(3)
    torch.manual_seed(3)
    ro = env.rollout(2 * T, break_when_any_done=False)
    assert ro.batch_size == (*env.batch_size, 2 * T)
    done = ro["next", "done"]
    assert done.any()
    keep = ~done.narrow(nb, 0, 2 * T - 1)
    for key in env.observation_keys:
        prev = ro["next", key].narrow(nb, 0, 2 * T - 1)
        cur = ro[key].narrow(nb, 1, 2 * T - 1)
        keep_k = keep.reshape(*keep.shape[: nb + 1], *[1] * (cur.ndim - nb - 1))
        assert bool(((prev == cur) | ~keep_k).all()), f"{key!r}: the next input is not the previous 'next'"
    short = env.rollout(3 * T)  # break_when_any_done
    n = short.batch_size[nb]
    assert n <= T
    flags = short["next", "done"].movedim(nb, 0).reshape(n, -1).any(-1)
    assert bool(flags[-1]) and not bool(flags[:-1].any())


@pytest.mark.parametrize("kind", ALL)
def test_seeding_determinism(kind, envs):
    env = envs(kind)

    def roll(seed: int) -> Any:
        env.set_seed(seed)
        torch.manual_seed(0)
        return env.rollout(12, break_when_any_done=False)

    a, b, c = roll(3), roll(3), roll(4)
    _assert_td_equal(a, b, "same seed")
    key = env.observation_keys[0]
    assert not torch.equal(a[key], c[key]), "another seed gave the same rollout"


@pytest.mark.parametrize("kind", STATEFUL)
def test_state_save_and_restore(kind, envs):
    env = envs(kind)
    env.set_seed(9)
    torch.manual_seed(9)
    td = env.reset()
    for _ in range(3):
        td = step_mdp(env.step(env.rand_action(td)))
    saved = env.get_state()
    copy = saved.clone()
    start = td.clone()

    def run(td: Any) -> list:
        torch.manual_seed(5)
        out = []
        for _ in range(5):
            td = env.step(env.rand_action(td))
            out.append(td["next"].clone())
            td = step_mdp(td)
        return out

    first = run(start.clone())
    _assert_td_equal(saved, copy, "get_state() must return a copy")
    env.set_state(saved)
    _assert_td_equal(env.get_state(), copy, "set_state(get_state())")
    for a, b in zip(first, run(start.clone())):
        _assert_td_equal(a, b, "after set_state")


@pytest.mark.parametrize("kind", ALL)
def test_out_of_spec_action_refused_env_unchanged(kind, envs):
    env = envs(kind)
    label = KINDS[kind][1]
    spec = env.action_spec
    bad, named = _bad_action(spec)
    errors = []

    def drive(refuse_at: int | None) -> list:
        env.set_seed(7)
        torch.manual_seed(0)
        td = env.reset()
        out = []
        for t in range(T + 4):  # past the time limit: the resets after the refusal draw too
            td = env.rand_action(td)
            if t == refuse_at:
                for call in (env.step, env.step_and_maybe_reset):
                    attempt = td.clone()
                    attempt.set("action", bad.clone())
                    with pytest.raises(InvalidActionError) as info:
                        call(attempt)
                    assert "next" not in attempt.keys()
                    errors.append(info.value)
            cur, td = env.step_and_maybe_reset(td)
            out.append(cur.clone())
        return out

    for a, b in zip(drive(None), drive(3)):
        _assert_td_equal(a, b, "the refused calls changed the env")
    assert len(errors) == 2
    for err in errors:
        msg = str(err)
        assert isinstance(err, ValueError)
        assert msg.startswith(f"{label}.step: action 'action' = "), msg
        assert f"is outside the action spec {spec!r}" in msg and named in msg, msg
        again = pickle.loads(pickle.dumps(err))  # crosses process boundaries (ParallelEnv workers)
        assert type(again) is InvalidActionError and str(again) == msg
