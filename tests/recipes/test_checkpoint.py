"""Checkpoints (atomic folders, keep-K, safe loading), RNG capture, config helpers, and the
episode-return tracker against a plain reference."""

from __future__ import annotations

import dataclasses
import os
import pickle
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.data import LazyTensorStorage, TensorDictReplayBuffer
from steersman.recipes import ALGOS, config_class
from steersman.recipes.checkpoint import (
    POINTER,
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from steersman.recipes.config import config_from_dict, config_to_dict, diff_configs, field_docs
from steersman.recipes.evaluation import EpisodeReturns, first_episode_returns
from steersman.tensordict import TensorDict


def _state() -> dict:
    net = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    net(torch.randn(4, 3)).sum().backward()
    opt.step()
    carried = TensorDict({"observation": torch.randn(2, 3), "next": {"done": torch.zeros(2, 1, dtype=torch.bool)}}, [2])
    return {"model": net.state_dict(), "optim": opt.state_dict(), "carried": carried, "n": 7, "none": None}


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, TensorDict):
        return isinstance(b, TensorDict) and a.batch_size == b.batch_size and _equal(a.to_dict(), b.to_dict())
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def test_roundtrip_and_pointer(tmp_path):
    state = _state()
    path = save_checkpoint(tmp_path, state, meta={"frames": 10})
    assert path.name == "ckpt-000001" and latest_checkpoint(tmp_path) == path
    ckpt = load_checkpoint(tmp_path)
    assert _equal(ckpt.state, state)
    assert ckpt.meta["frames"] == 10 and ckpt.replay_buffer_path is None
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp leftovers


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_keeps_the_last_k(tmp_path, keep):
    for i in range(5):
        save_checkpoint(tmp_path, {"i": torch.tensor(i)}, meta={"frames": i}, keep=keep)
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ckpt-"))
    assert names == [f"ckpt-{i:06d}" for i in range(6 - keep, 6)]
    assert load_checkpoint(tmp_path).state["i"].item() == 4


def test_replay_buffer_roundtrip(tmp_path):
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=4)
    rb.extend(TensorDict({"obs": torch.arange(30.0).view(10, 3)}, [10]))
    ckpt = load_checkpoint(tmp_path, save_checkpoint(tmp_path, {}, replay_buffer=rb))
    rb2 = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=4)
    rb2.loads(ckpt.replay_buffer_path)
    assert len(rb2) == 10 and torch.equal(rb2.storage[:10]["obs"], rb.storage[:10]["obs"])


def test_killed_writer_leaves_previous_checkpoint(tmp_path):
    save_checkpoint(tmp_path, {"v": torch.tensor(1)})
    # a writer killed mid-write leaves a hidden temp folder (a dead pid in its name)
    dead = tmp_path / ".ckpt-000002.999999999.deadbeef.tmp"
    dead.mkdir()
    (dead / "state.pt").write_bytes(b"half a file")
    dead_pointer = tmp_path / f".{POINTER}.999999999.0123abcd.tmp"  # a pointer write killed before its rename
    dead_pointer.write_text('{"current": "ckpt-00')
    live_pointer = tmp_path / f".{POINTER}.1.0123abcd.tmp"  # pid 1 runs: its writer may still finish
    live_pointer.write_text("")
    assert load_checkpoint(tmp_path).state["v"].item() == 1
    save_checkpoint(tmp_path, {"v": torch.tensor(2)})
    assert not dead.exists() and load_checkpoint(tmp_path).state["v"].item() == 2
    assert not dead_pointer.exists() and live_pointer.exists()


def test_pointer_to_deleted_folder_falls_back(tmp_path):
    save_checkpoint(tmp_path, {"v": torch.tensor(1)})
    second = save_checkpoint(tmp_path, {"v": torch.tensor(2)})
    for f in second.iterdir():
        f.unlink()
    second.rmdir()
    assert load_checkpoint(tmp_path).state["v"].item() == 1


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/steersman_pwned",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("case", ["empty", "pickle", "garbage", "pointer", "meta"])
def test_bad_checkpoints_raise_and_run_nothing(tmp_path, case):
    if case != "empty":
        path = save_checkpoint(tmp_path, {"v": torch.tensor(1)})
        if case == "pickle":  # a malicious state.pt: loading must not execute it
            (path / "state.pt").write_bytes(pickle.dumps(_Evil()))
        elif case == "garbage":
            (path / "state.pt").write_bytes(b"\x00not a torch file")
        elif case == "pointer":
            (tmp_path / POINTER).write_text('{"current": "../../etc"}')
        else:
            (path / "meta.json").write_text('{"format": "something else"}')
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path)
    assert not os.path.exists("/tmp/steersman_pwned")


def test_rng_state_roundtrip_through_a_checkpoint(tmp_path):
    torch.manual_seed(1)
    np.random.seed(2)
    random.seed(3)
    save_checkpoint(tmp_path, {"rng": rng_state()})
    expected = (torch.rand(3), np.random.rand(3), random.random(), np.random.randn())
    torch.manual_seed(99)
    np.random.seed(99)
    random.seed(99)
    set_rng_state(load_checkpoint(tmp_path).state["rng"])
    got = (torch.rand(3), np.random.rand(3), random.random(), np.random.randn())
    assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])
    assert got[2] == expected[2] and got[3] == expected[3]


# ---------------------------------------------------------------- configs
@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_every_config_field_has_a_docstring(algo):
    def walk(cls):
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            assert docs.get(f.name), f"{cls.__name__}.{f.name} has no one-line docstring"
            assert "\n" not in docs[f.name]
            sub = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
            if dataclasses.is_dataclass(sub):
                walk(type(sub))

    walk(config_class(algo))


@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_config_dict_roundtrip(algo):
    cls = config_class(algo)
    cfg = cls()
    cfg.seed = 5
    cfg.env.num_envs = 3
    data = config_to_dict(cfg)
    assert config_from_dict(cls, data) == cfg
    assert diff_configs(data, config_to_dict(cls())) == [("env.num_envs", 3, cls().env.num_envs), ("seed", 5, 0)]
    with pytest.raises(KeyError, match="unknown config key 'sed'.*valid keys"):
        config_from_dict(cls, {"sed": 1})


# ---------------------------------------------------------------- episode returns
def _reference_returns(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[list[float]]:
    """Finished-episode returns per sub-env, by a plain loop."""
    n = batches[0][0].shape[0]
    acc = [0.0] * n
    out: list[list[float]] = [[] for _ in range(n)]
    for reward, done in batches:
        for i in range(n):
            for t in range(reward.shape[1]):
                acc[i] += float(reward[i, t])
                if done[i, t]:
                    out[i].append(acc[i])
                    acc[i] = 0.0
    return out


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 4), steps=st.integers(1, 6), num_batches=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_episode_returns_match_a_plain_loop(n, steps, num_batches, seed):
    g = torch.Generator().manual_seed(seed)
    batches = [(torch.randint(-3, 4, (n, steps), generator=g).float(), torch.rand(n, steps, generator=g) < 0.3)
               for _ in range(num_batches)]
    tracker = EpisodeReturns()
    got: list[list[float]] = [[] for _ in range(n)]
    for reward, done in batches:
        td = TensorDict({"next": {"reward": reward.unsqueeze(-1), "done": done.unsqueeze(-1)}}, [n, steps])
        finished = tracker.update(td)
        # row-major order: sub-env by sub-env, in time order
        counts = done.sum(1).tolist()
        for i, part in enumerate(finished.split(counts)):
            got[i] += part.tolist()
    assert got == _reference_returns(batches)


def test_first_episode_returns_ignore_later_steps():
    reward = torch.tensor([[1.0, 2.0, 4.0], [1.0, 1.0, 1.0]])
    done = torch.tensor([[False, True, True], [False, False, False]])
    td = TensorDict({"next": {"reward": reward.unsqueeze(-1), "done": done.unsqueeze(-1)}}, [2, 3])
    assert first_episode_returns(td).tolist() == [3.0, 3.0]
