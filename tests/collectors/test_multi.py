"""Multi-process collectors over the env battery: exact frames, shapes, trajectory ids
unique across workers, policy weight updates reaching the workers, resumption from
``state_dict``; shared-memory and pipe transports.

Each case builds its own collector and runs every check on it (one process start per
case: worker processes cost seconds on a busy machine).
"""

from __future__ import annotations

import functools

import pytest
import torch

from steersman.collectors import MultiaSyncDataCollector, MultiSyncDataCollector, aSyncDataCollector
from steersman.envs import CartPoleEnv
from tests.collectors._helpers import (
    WORKER_ENV_FNS,
    Unpicklable,
    check_traj_ids,
    constant_weights,
    make_policy,
    make_scoring_policy,
    per_worker,
    td_equal,
)

W = 2
SUB = {"native": 4, "gym": 1, "serial": 2, "parallel": 2}  # sub-envs per worker env
T = 8
CLASSES = {"sync": MultiSyncDataCollector, "async": MultiaSyncDataCollector}


def _shape(cls_name, kind):
    env_batch = {"native": (4,), "gym": (), "serial": (2,), "parallel": (2,)}[kind]
    return (W, *env_batch, T) if cls_name == "sync" else (*env_batch, T)


@pytest.mark.parametrize("kind", list(WORKER_ENV_FNS))
@pytest.mark.parametrize("cls_name", list(CLASSES))
def test_battery(cls_name, kind):
    """One collector per case (worker processes cost seconds), three checks in turn."""
    policy = make_policy()
    fpb = SUB[kind] * T * (W if cls_name == "sync" else 1)
    c = CLASSES[cls_name]([WORKER_ENV_FNS[kind]] * W, policy, frames_per_batch=fpb, total_frames=fpb * 10**6)
    try:
        c.set_seed(0)
        _frames_shapes_and_traj_ids(cls_name, kind, c)
        _policy_weight_updates_reach_workers(cls_name, c, policy)
        _resume_from_state_dict(cls_name, kind, c)
    finally:
        c.shutdown()


def _frames_shapes_and_traj_ids(cls_name, kind, c):
    it = iter(c)
    n = 6 if cls_name == "sync" else 12  # 6 batches of each worker: some episodes end
    batches = [next(it) for _ in range(n)]
    assert c._frames == n * c.frames_per_batch
    for b in batches:
        assert b.batch_size == _shape(cls_name, kind) and b.numel() == c.frames_per_batch
    if cls_name == "sync":
        prev = None
        for b in batches:
            prev = check_traj_ids(b, prev)  # rows of all workers: ids never shared
            for w in range(W):
                assert (b["collector", "traj_ids"][w] % W == w).all()
    else:
        groups = per_worker(batches, W)
        ids = {}
        for w, bs in groups.items():
            prev = None
            for b in bs:
                prev = check_traj_ids(b, prev)
            ids[w] = set().union(*(set(b["collector", "traj_ids"].unique().tolist()) for b in bs))
        if len(ids) > 1:
            assert not set.intersection(*ids.values())  # no id shared by two workers
    assert any(b["next", "done"].any() for b in batches)  # the ids were exercised


def _policy_weight_updates_reach_workers(cls_name, c, policy):
    original = {k: v.clone() for k, v in policy.state_dict().items()}
    it = iter(c)
    for action in (1, 0):
        policy.load_state_dict(constant_weights(action))
        c.update_policy_weights_()
        if cls_name == "async":
            # a batch started before the update (at most one per worker) may still come,
            # possibly after a newer batch of another worker; later ones are all new
            groups = per_worker([next(it) for _ in range(3 * W)], W)
            new = 0
            for bs in groups.values():
                flags = [bool((b["action"] == action).all()) for b in bs]
                assert all(flags[1:]), flags
                new += sum(flags)
            assert new >= 2 * W
        else:
            assert (next(it)["action"] == action).all()
    policy.load_state_dict(original)
    c.update_policy_weights_()


def _resume_from_state_dict(cls_name, kind, c):
    it = iter(c)
    next(it)
    sd = c.state_dict()
    ref = [next(it) for _ in range(2 * W)]
    frames = c._frames
    c.load_state_dict(sd)
    assert c._frames == sd["frames"] < frames
    it2 = iter(c)
    got = [next(it2) for _ in range(2 * W)]
    if kind == "parallel":  # the workers' ParallelEnvs have no state to save: new trajectories
        assert c._frames == frames
        first_new = min(sd[f"worker{w}"]["traj_counter"] * W + w for w in range(W))
        assert max(int(b["collector", "traj_ids"].max()) for b in got) >= first_new
    elif cls_name == "sync":
        for a, b in zip(got, ref):
            assert td_equal(a, b)
    else:  # per worker, the same batches in the same order
        gref, ggot = per_worker(ref, W), per_worker(got, W)
        for w in set(gref) & set(ggot):
            for a, b in zip(ggot[w], gref[w]):
                assert td_equal(a, b)
        assert sum(min(len(gref.get(w, [])), len(ggot.get(w, []))) for w in range(W)) >= W


def test_fresh_collector_resumes_from_a_saved_state(tmp_path):
    native = functools.partial(CartPoleEnv, batch_size=[2])
    kw = dict(num_workers=2, frames_per_batch=16, total_frames=-1)
    a = MultiSyncDataCollector(native, make_policy(), **kw)
    try:
        a.set_seed(0)
        it = iter(a)
        next(it)
        torch.save(a.state_dict(), tmp_path / "sd.pt")
        ref = [next(it) for _ in range(2)]
    finally:
        a.shutdown()
    b = MultiSyncDataCollector(native, make_policy(5), **kw)  # other weights, unseeded
    try:
        b.load_state_dict(torch.load(tmp_path / "sd.pt", weights_only=True))
        it = iter(b)
        for r in ref:
            assert td_equal(next(it), r)
    finally:
        b.shutdown()


# ---------------------------------------------------------------------- finite runs, options
@pytest.mark.parametrize("shared_memory", [True, False])
def test_exact_frames_random_frames_and_transports(shared_memory):
    native = functools.partial(CartPoleEnv, batch_size=[2])
    policy = make_scoring_policy()
    policy.load_state_dict(constant_weights(1))
    c = MultiSyncDataCollector(native, policy, num_workers=2, frames_per_batch=40, total_frames=120,
                               init_random_frames=40, shared_memory=shared_memory, cat_results=-1,
                               split_trajs=False)
    try:
        batches = list(c)
        assert len(batches) == len(c) == 3 and sum(b.numel() for b in batches) == 120
        assert batches[0].batch_size == (2, 20)  # cat along time: [sub_env, 2 * T]
        assert (batches[0]["action"] == 0).any()  # random actions first
        assert (batches[1]["action"] == 1).all() and (batches[2]["action"] == 1).all()
        assert "score" not in batches[0].keys() and batches[2]["score"].shape == (2, 20)  # new entries
    finally:
        c.shutdown()


def test_async_single_worker_exact_frames_and_replay_buffer():
    from steersman.data import LazyTensorStorage, ReplayBuffer
    from steersman.envs import PendulumEnv

    # Pendulum: no episode ends within 30 steps, so every batch is one trajectory of 10 steps and the
    # split (padded) items keep one shape (with CartPole a batch holding an episode end pads to its
    # longest piece, e.g. [2, 7], which a tensor storage of [10]-step items rightly refuses)
    rb = ReplayBuffer(storage=LazyTensorStorage(100))
    c = aSyncDataCollector(PendulumEnv, None, frames_per_batch=10, total_frames=30, replay_buffer=rb,
                           split_trajs=True)
    try:
        assert list(c) == [None, None, None]
        assert c._frames == 30 and len(rb) == 3  # split trajectories: one item per trajectory
        sample = rb.sample(2)
        assert sample["collector", "mask"].shape == (2, 10) and bool(sample["collector", "mask"].all())
    finally:
        c.shutdown()
    assert c.worker_pids == []


def test_bad_arguments():
    with pytest.raises(ValueError, match="not a multiple of num_workers=2"):
        MultiSyncDataCollector(CartPoleEnv, None, num_workers=2, frames_per_batch=5)
    with pytest.raises(ValueError, match="pass num_workers"):
        MultiSyncDataCollector(CartPoleEnv, None, frames_per_batch=4)
    with pytest.raises(TypeError, match="env instance"):
        MultiaSyncDataCollector([CartPoleEnv()], None, frames_per_batch=4)
    with pytest.raises(TypeError, match="cannot be pickled .*not even by cloudpickle"):
        MultiaSyncDataCollector([Unpicklable()], None, frames_per_batch=4)
    with pytest.raises(ValueError, match="cat_results is for MultiSyncDataCollector only"):
        MultiaSyncDataCollector([CartPoleEnv], None, frames_per_batch=4, cat_results=0)


def test_lambdas_closures_and_local_partials_are_env_factories():
    """Sent with cloudpickle when plain pickle cannot (every multi-process collector)."""
    size = 2

    def closure():
        return CartPoleEnv(batch_size=[size])

    def local(batch_size):
        return CartPoleEnv(batch_size=batch_size)

    factories = [lambda: CartPoleEnv(batch_size=[size]), closure, functools.partial(local, [size])]
    c = MultiSyncDataCollector(factories[:2], make_policy(), frames_per_batch=16, total_frames=32)
    try:
        assert [b.batch_size for b in c] == [(2, 2, 4)] * 2
    finally:
        c.shutdown()
    c = aSyncDataCollector(factories[2], None, frames_per_batch=8, total_frames=16)
    try:
        assert [b.batch_size for b in c] == [(2, 4)] * 2
    finally:
        c.shutdown()


def test_interrupted_wait_does_not_shift_replies():
    """A KeyboardInterrupt while waiting for the workers must not pair a batch with the
    wrong request: the next iteration first gathers the batch in flight."""
    native = functools.partial(CartPoleEnv, batch_size=[2])
    c = MultiSyncDataCollector(native, make_policy(), num_workers=2, frames_per_batch=16, total_frames=64)
    try:
        real = c._wait

        def interrupted(*args, **kwargs):
            c._wait = real
            raise KeyboardInterrupt

        c._wait = interrupted
        with pytest.raises(KeyboardInterrupt):
            next(iter(c))
        assert c._inflight == {0, 1}
        prev = None
        batches = list(c)
        assert len(batches) == 4 and c._frames == 64
        for b in batches:
            assert b.batch_size == (2, 2, 4)
            prev = check_traj_ids(b, prev)
    finally:
        c.shutdown()
