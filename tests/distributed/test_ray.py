"""RayCollector, RayReplayBuffer and RayEvalWorker on a real 3-node local Ray cluster.

The policy writes its own weight (``"version"``) next to the action, so every batch
shows which weights collected it; trajectory ids tell which actor did
(``id % num_collectors``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from torch import nn

from steersman.collectors import Collector, MultiSyncDataCollector
from steersman.data import LazyTensorStorage
from steersman.distributed import RayCollector, RayCollectorError, RayEvalWorker, RayReplayBuffer
from steersman.envs import CartPoleEnv
from steersman.recipes.evaluation import EpisodeReturns, first_episode_returns

TRAJ = ("collector", "traj_ids")


class VersionPolicy(nn.Module):
    """Pushes left; writes its weight ``v`` as ``"version"`` at every step."""

    def __init__(self) -> None:
        super().__init__()
        self.v = nn.Parameter(torch.zeros(()))

    def forward(self, td):
        td.set("action", torch.zeros(td.batch_size, dtype=torch.long))
        td.set("version", self.v.detach().expand(td.batch_size).clone())
        return td


def _set(policy: VersionPolicy, k: int) -> None:
    with torch.no_grad():
        policy.v.fill_(k)


def _actor_of(batch, n: int) -> int:
    ids = batch.get(TRAJ) % n
    assert (ids == ids.flatten()[0]).all()
    return int(ids.flatten()[0])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _run_checking_versions(collector: RayCollector, policy: VersionPolicy, *, sync: bool, n: int, fpb: int,
                           on_batch=None) -> int:
    """Iterates ``collector``, publishing version k + 1 after the k-th batch, and checks
    every batch requested after the k-th update was collected with version k (not k - 1).
    ``on_batch(k, actor)`` may return True for a batch whose request was sent again after
    its actor died (then any version between the expected one and the newest is right)."""
    expected = [0] * n  # the version each actor's next batch must have
    frames = 0
    for k, batch in enumerate(collector):
        frames += batch.numel()
        assert batch.numel() == fpb
        if sync:
            assert batch.shape[0] == n
            i = None
            assert (batch["version"] == expected[0]).all(), (k, batch["version"].unique())
        else:
            i = _actor_of(batch, n)
            versions = batch["version"].unique().tolist()
            assert len(versions) == 1, versions
            resent = on_batch(k, i) if on_batch is not None else False
            if resent:
                assert expected[i] <= versions[0] <= k, (k, i, versions, expected)
            else:
                assert versions[0] == expected[i], (k, i, versions, expected)
        _set(policy, k + 1)
        assert collector.update_policy_weights_() == k + 1
        if sync:
            expected = [k + 1] * n
        else:
            expected[i] = k + 1  # actor i's next request leaves after this update
    return frames


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_multi_process_actor_uses_the_newest_weights(ray_cluster, sync):
    """A MultiSyncDataCollector in the actor (its two worker processes both collect): every
    batch requested after the k-th update is collected with version k by both workers.
    (Collector-class actors: sync in the metrics test, async in the SIGKILL test.)"""
    policy, fpb = VersionPolicy(), 32
    with RayCollector(CartPoleEnv, policy, frames_per_batch=fpb, total_frames=6 * fpb, num_collectors=1, sync=sync,
                      collector_class=MultiSyncDataCollector, num_workers_per_collector=2) as collector:
        assert len(collector.actor_info[0]["pids"]) == 3  # the actor and its two workers
        assert _run_checking_versions(collector, policy, sync=sync, n=1, fpb=fpb) == collector.frames == 6 * fpb
        assert list(collector) == []  # done: iterating again yields nothing


def test_sync_actors_on_two_nodes_use_the_newest_weights_and_metrics_match_local(ray_cluster):
    """Two Collector-class actors (on different nodes), sync: every batch after the k-th
    update has version k; exactly total_frames are delivered; the episode returns computed
    in the actors equal those computed locally from the same batches."""
    policy, n, fpb = VersionPolicy(), 2, 64
    reference = EpisodeReturns()
    with RayCollector(CartPoleEnv, policy, frames_per_batch=fpb, total_frames=4 * fpb, num_collectors=n,
                      sync=True) as collector:
        assert len({info["node_id"] for info in collector.actor_info}) == n
        expected = []

        def track(batch):
            expected.extend(reference.update(batch).tolist())

        frames = 0
        for k, batch in enumerate(collector):
            track(batch)
            frames += batch.numel()
            assert batch.shape[0] == n and (batch["version"] == k).all(), (k, batch["version"].unique())
            _set(policy, k + 1)
            assert collector.update_policy_weights_() == k + 1
        assert frames == collector.frames == 4 * fpb
        assert sorted(collector.pop_episode_returns()) == sorted(expected) and expected


def test_eval_worker_matches_a_local_rollout(ray_cluster):
    worker = RayEvalWorker(lambda: CartPoleEnv(batch_size=[3]), VersionPolicy())
    try:
        worker.submit(VersionPolicy().state_dict(), max_steps=200, seed=5)
        got = worker.result(timeout=120)
        env = CartPoleEnv(batch_size=[3])
        env.set_seed(5)
        want = first_episode_returns(env.rollout(200, VersionPolicy(), break_when_any_done=False,
                                                 break_when_all_done=True))
        assert torch.equal(got, want)
    finally:
        worker.shutdown()


def test_killed_actor_is_restarted_and_frames_count_once(ray_cluster):
    """SIGKILL of a collector actor mid-run (async, Collector class): restarted, its lost
    batch collected again, the run delivers exactly total_frames, and every batch requested
    after the k-th update (the restarted actor's included) has version k."""
    policy, n, fpb, batches = VersionPolicy(), 2, 32, 10
    with RayCollector(CartPoleEnv, policy, frames_per_batch=fpb, total_frames=batches * fpb, num_collectors=n,
                      max_restarts=2) as collector:
        victim = collector.actor_info[0]["pid"]
        state = {"killed": False, "resent": False}
        from_0 = []

        def on_batch(k, i):
            if not state["killed"]:
                os.kill(victim, signal.SIGKILL)
                state["killed"] = True
                return False
            if i == 0 and collector.actor_info[0]["pid"] != victim:  # from the restarted actor
                from_0.append(k)
                # its first batch may answer a request that died with the old actor and was sent
                # again (with the newest version at that time); the old actor's replies and the
                # later ones carry exactly the expected version
                return len(from_0) == 1
            return False

        with pytest.warns(UserWarning, match=r"collector actor 0 .* was restarted \(1/2\) after: .*collected again"):
            frames = _run_checking_versions(collector, policy, sync=False, n=n, fpb=fpb, on_batch=on_batch)
        assert from_0  # (the warning above: a reply of the restarted actor arrived)
        assert frames == collector.frames == batches * fpb
        assert collector.actor_info[0]["pid"] != victim and not _alive(victim)


def test_actor_out_of_restarts_names_it(ray_cluster):
    collector = RayCollector(CartPoleEnv, None, frames_per_batch=32, total_frames=-1, num_collectors=1,
                             max_restarts=0)
    try:
        os.kill(collector.actor_info[0]["pid"], signal.SIGKILL)
        with pytest.raises(RayCollectorError, match=r"collector actor 0 \(node .*\) died 1 times \(max_restarts=0\); "
                                                    r"last error: .*"):
            for _ in collector:
                pass
    finally:
        collector.shutdown()
        collector.shutdown()  # idempotent


def test_collectors_write_into_remote_buffer_exactly_once(ray_cluster, tmp_path):
    """Three collector actors on a 2-CPU cluster (a warning with the numbers; they share
    the CPUs) write into a buffer actor: every transition stored once."""
    rb = RayReplayBuffer(storage=LazyTensorStorage(10_000), batch_size=16, checkpoint_dir=tmp_path / "rb",
                         checkpoint_interval=64)
    try:
        with pytest.warns(UserWarning, match=r"3 actors x 1 CPU = 3 CPUs requested, the Ray cluster has 2"):
            collector = RayCollector(CartPoleEnv, None, frames_per_batch=32, total_frames=320, num_collectors=3,
                                     replay_buffer=rb)
        with collector:
            collector.start()
            while collector.is_running():
                time.sleep(0.1)
            collector.join()
            assert collector.frames == 320
            assert len(collector.pop_episode_returns()) > 0  # metrics still reach the driver
        assert rb.write_count == len(rb) == 320
        sample = rb.sample()
        assert sample.shape == (16,) and ("next", "reward") in sample.keys(True)
    finally:
        rb.shutdown()


def test_killed_buffer_restarts_from_checkpoint_and_reports_loss(ray_cluster, tmp_path):
    rb = RayReplayBuffer(storage=LazyTensorStorage(1000), batch_size=8, checkpoint_dir=tmp_path / "rb",
                         checkpoint_interval=100)
    try:
        from steersman import TensorDict

        for i in range(5):
            rb.extend(TensorDict({"x": torch.full((50, 1), float(i))}, [50]))
        os.kill(rb.info()["pid"], signal.SIGKILL)
        with pytest.warns(UserWarning, match=r"checkpoint of 200 transitions; 50 transitions written since were lost"):
            assert len(rb) == 200
        assert rb.lost_transitions == 50
        assert set(rb.sample(64)["x"].flatten().tolist()) <= {0.0, 1.0, 2.0, 3.0}
    finally:
        rb.shutdown()


# ---------------------------------------------------------------- bad input


class _Unpicklable(VersionPolicy):
    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()


def test_unpicklable_policy_is_refused(ray_cluster):
    with pytest.raises(TypeError, match=r"policy \(_Unpicklable\) cannot be serialised.*policy_factory"):
        RayCollector(CartPoleEnv, _Unpicklable(), frames_per_batch=32, total_frames=64)


def _failing_env():
    raise ValueError("no such env on this node")


def test_env_factory_failing_remotely_shows_traceback_and_node(ray_cluster):
    with pytest.raises(RayCollectorError) as info:
        RayCollector(_failing_env, None, frames_per_batch=32, total_frames=64, max_restarts=0)
    msg = str(info.value)
    assert "collector actor 0 failed at start" in msg
    assert "no such env on this node" in msg and "_failing_env" in msg  # the remote traceback
    assert "ip=" in msg  # the node


DRIVER = """
import json, sys, time, ray
ray.init(address=sys.argv[1], log_to_driver=False)
from steersman.distributed import RayCollector
from steersman.envs import CartPoleEnv
from steersman.collectors import MultiSyncDataCollector
c = RayCollector(CartPoleEnv, None, frames_per_batch=32, total_frames=-1, num_collectors=1,
                 collector_class=MultiSyncDataCollector, num_workers_per_collector=2)
print(json.dumps([p for info in c.actor_info for p in info["pids"]]), flush=True)
time.sleep(600)
"""


def test_killed_driver_leaves_no_worker(ray_cluster):
    """SIGKILL of the driver: Ray kills the actors it owned, and their collector processes go too."""
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, ray_cluster.address], stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(proc.stdout.readline())
        assert len(pids) == 3 and all(_alive(p) for p in pids)  # the actor and its 2 worker processes
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 60
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if _alive(p)]


# ---------------------------------------------------------------- data path and recipe


class Deterministic(nn.Module):
    """A fixed linear policy on Pendulum (deterministic: the same data locally and remotely)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Linear(3, 1)

    def forward(self, td):
        td.set("action", self.w(td.get("observation")).tanh() * 2)
        return td


def test_remote_data_path_equals_local(ray_cluster, tmp_path):
    """One actor seeded s, writing into a remote buffer, stores exactly what a local collector
    seeded s stores into a local buffer (same transitions, same order)."""
    from steersman.data import TensorDictReplayBuffer
    from steersman.envs import PendulumEnv

    def env_fn():
        return PendulumEnv(batch_size=[2])

    policy = Deterministic()
    rb = RayReplayBuffer(storage=LazyTensorStorage(1000), batch_size=8)
    try:
        with RayCollector(env_fn, policy, frames_per_batch=64, total_frames=256, num_collectors=1,
                          replay_buffer=rb, seed=3) as collector:
            assert list(collector) == [None] * 4
        local_rb = TensorDictReplayBuffer(storage=LazyTensorStorage(1000))
        local = Collector(env_fn(), policy, frames_per_batch=64, total_frames=256)
        local.set_seed(3)
        for batch in local:
            local_rb.extend(batch.reshape(-1))
        rb.dumps(tmp_path / "rb")  # on the actor's node: this machine
        remote_copy = TensorDictReplayBuffer(storage=LazyTensorStorage(1000))
        remote_copy.loads(tmp_path / "rb")
        got, want = remote_copy[:256], local_rb[:256]
        for key in [("next", "reward"), "observation", "action"]:
            assert torch.equal(got.get(key), want.get(key)), key
    finally:
        rb.shutdown()
