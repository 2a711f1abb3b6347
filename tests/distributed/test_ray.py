"""RayCollector, RayReplayBuffer and RayEvalWorker on a real 2-node local Ray cluster (conftest.py).

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
from pathlib import Path

import pytest
import torch
from torch import nn

from steersman.collectors import Collector, MultiaSyncDataCollector
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


def _run_checking_versions(collector: RayCollector, policy: VersionPolicy, batches: int, *, n: int = 1,
                           prefetching_workers: int = 0, on_batch=None, last_delivery: dict | None = None) -> int:
    """Iterates ``batches`` batches of ``collector`` (from where it stands, with no request
    in flight), publishing version k + 1 after the batch seen at version k, and checks that
    every batch was collected with one version, the right one:

    * sync: every actor's part has the version of the last update before it was requested;
    * async: actor ``i``'s batch has the version of the update that followed its previous
      batch (its request left then). ``on_batch(k, actor)`` may return True for a batch whose
      request was sent again after its actor died (then any version between the expected one
      and the newest is right);
    * ``prefetching_workers=W`` (one actor running a ``MultiaSyncDataCollector`` of ``W``
      worker processes, which start their next batch as soon as one is handed out): worker
      ``w``'s batch has a version between that of the request which delivered ``w``'s previous
      batch (``last_delivery[w]``, kept across calls) and that of its own request.
    """
    start = collector.policy_version
    expected = [start] * n  # the version each actor's next batch must have
    last_delivery = {} if last_delivery is None else last_delivery
    frames = 0
    for k, batch in enumerate(collector, start=start):
        frames += batch.numel()
        versions = batch["version"].unique().tolist()
        if prefetching_workers:
            w = int(batch.get(TRAJ).flatten()[0]) % prefetching_workers
            assert (batch.get(TRAJ) % prefetching_workers == w).all()  # a batch comes from one worker
            assert len(versions) == 1 and last_delivery.get(w, 0) <= versions[0] <= k, (k, w, versions, last_delivery)
            last_delivery[w] = k  # w starts its next batch now, with version k
        elif collector.sync:
            assert batch.shape[0] == n
            assert versions == [expected[0]], (k, versions)
        else:
            i = _actor_of(batch, n)
            assert len(versions) == 1, versions
            if on_batch is not None and on_batch(k, i):
                assert expected[i] <= versions[0] <= k, (k, i, versions, expected)
            else:
                assert versions[0] == expected[i], (k, i, versions, expected)
            expected[i] = k + 1  # actor i's next request leaves after this update
        _set(policy, k + 1)
        assert collector.update_policy_weights_() == k + 1
        if collector.sync:
            expected = [k + 1] * n
        if k + 1 - start == batches:
            break
    return frames


def check_multi_process_actor_versions(collector_class: type) -> RayCollector:
    """One actor running a multi-process collector (its two worker processes both collect),
    first in sync mode, then in async mode (with one actor both ask it for the same batches);
    returns the collector (still running: its actor holds its workers).
    MultiSyncDataCollector: every batch requested after the k-th update is collected with
    version k by both workers. MultiaSyncDataCollector: each worker starts its next batch
    when one is handed out, so its batch carries the version of the request that delivered
    its previous one, at the least (as locally); never older."""
    policy, fpb, per_mode = VersionPolicy(), 32, 3
    prefetching = 2 if collector_class is MultiaSyncDataCollector else 0
    collector = RayCollector(CartPoleEnv, policy, frames_per_batch=fpb, total_frames=2 * per_mode * fpb,
                             num_collectors=1, sync=True, collector_class=collector_class, num_workers_per_collector=2)
    assert len(collector.actor_info[0]["pids"]) == 3  # the actor and its two workers
    delivered: dict = {}
    frames = _run_checking_versions(collector, policy, per_mode, prefetching_workers=prefetching,
                                    last_delivery=delivered)
    collector.sync = False
    frames += _run_checking_versions(collector, policy, per_mode, prefetching_workers=prefetching,
                                     last_delivery=delivered)
    assert frames == collector.frames == 2 * per_mode * fpb
    assert list(collector) == []  # done: iterating again yields nothing
    assert not prefetching or len(delivered) == 2  # both workers delivered
    return collector


def test_async_multi_process_actor_versions_in_both_modes(ray_cluster):
    """MultiaSyncDataCollector in the actor: see check_multi_process_actor_versions
    (MultiSyncDataCollector: in test_lazy_import_then_killed_driver_leaves_no_worker's driver)."""
    check_multi_process_actor_versions(MultiaSyncDataCollector).shutdown()


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


def test_two_nodes_sync_then_async_killed_actor_restarted_frames_once_then_out_of_restarts(ray_cluster):
    """One pair of Collector-class actors (on different nodes, max_restarts=1), in turn:

    * sync: every batch ``[2, 32]`` after the k-th update has version k; exactly
      total_frames are delivered; the episode returns computed in the actors equal those
      computed locally from the same batches; without updates the requests are sent ahead,
      and those an update made stale are dropped (the next batch has the new version);
    * async (the same actors; each reply is an actor's 32 frames): without updates each actor's
      next request is queued behind the one it collects, an update drops those;
    * async: SIGKILL of actor 0 mid-run:
      restarted, its lost batch collected again, exactly total_frames delivered, and every
      batch requested after the k-th update (the restarted actor's included) has version k;
    * killed once more (no restart left): an error naming the actor.
    """
    policy, n, fpb = VersionPolicy(), 2, 64
    per_actor = fpb // n
    reference = EpisodeReturns()
    with RayCollector(CartPoleEnv, policy, frames_per_batch=fpb, total_frames=4 * fpb, num_collectors=n,
                      sync=True, max_restarts=1) as collector:
        assert len({info["node_id"] for info in collector.actor_info}) == n
        expected = []
        frames = 0
        for k, batch in enumerate(collector):
            expected.extend(reference.update(batch.reshape(-1, batch.shape[-1])).tolist())
            frames += batch.numel()
            assert batch.shape == (n, per_actor) and (batch["version"] == k).all(), (k, batch["version"].unique())
            _set(policy, k + 1)
            assert collector.update_policy_weights_() == k + 1
        assert frames == collector.frames == 4 * fpb
        assert sorted(collector.pop_episode_returns()) == sorted(expected) and expected

        # no update after a batch: the next requests leave before the batch is yielded; an
        # update then makes the requests sent ahead stale: dropped, sent again with version 5
        collector.total_frames += 5 * fpb
        seen = []
        for k, batch in enumerate(collector, start=4):
            seen.append(batch["version"].unique().tolist())
            # sent ahead after 1 quiet yield: the next batch of every actor, and the one after it queued
            assert len(collector._pending) == (2 * n if k in (5, 6) else 0), k
            if k == 6:
                _set(policy, 5)
                assert collector.update_policy_weights_() == 5
        assert seen == [[4], [4], [4], [5], [5]]  # after the update: version 5 only
        assert collector.dropped_batches == 2 * n and collector.frames == 9 * fpb  # dropped: never counted
        collector.pop_episode_returns()

        collector.sync = False  # the same actors, batches as they arrive
        # still no update: each actor has its next request queued behind the one it collects
        # (sent ahead in async mode too); an update drops the queued ones: version 6 after it
        collector.total_frames += 12 * per_actor  # (requests in flight are bounded by the batches left)
        dropped, seen = collector.dropped_batches, []
        for k, batch in enumerate(collector):
            seen.append(int(batch["version"].unique()))
            in_flight = [sum(1 for i, *_ in collector._pending.values() if i == a) for a in range(n)]
            if k < 3:
                assert sorted(in_flight) == [1, 2], (k, in_flight)  # the delivering actor's next one, and 2
            if k == 2:
                _set(policy, 6)
                assert collector.update_policy_weights_() == 6
        assert seen[:3] == [5, 5, 5] and seen[-1] == 6 and seen == sorted(seen), seen
        assert collector.dropped_batches > dropped and collector.frames == 9 * fpb + 12 * per_actor
        collector.pop_episode_returns()

        batches = 8
        collector.total_frames += batches * per_actor
        victim = collector.actor_info[0]["pid"]
        state = {"killed": False}
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

        with pytest.warns(UserWarning, match=r"collector actor 0 .* was restarted \(1/1\) after: .*collected again"):
            frames = _run_checking_versions(collector, policy, batches, n=n, on_batch=on_batch)
        assert from_0  # (the warning above: a reply of the restarted actor arrived)
        assert frames == batches * per_actor and collector.frames == 9 * fpb + (12 + batches) * per_actor
        assert list(collector) == []  # exactly total_frames: nothing more
        assert collector.actor_info[0]["pid"] != victim and not _alive(victim)

        os.kill(collector.actor_info[0]["pid"], signal.SIGKILL)  # no restart left
        collector.total_frames += 4 * per_actor  # the run goes on
        with pytest.raises(RayCollectorError, match=r"collector actor 0 \(node .*, pid \d+\) died 2 times "
                                                    r"\(max_restarts=1\); last error: .*"):
            for _ in collector:
                pass
    collector.shutdown()  # idempotent


class Deterministic(nn.Module):
    """A fixed linear policy on CartPole (no sampling: the same data locally and remotely);
    it pushes the cart the way the pole leans away from, so episodes end within a few dozen steps."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Linear(4, 2)
        with torch.no_grad():
            self.w.weight.copy_(torch.tensor([[0.0, 0.0, 1.0, 0.1], [0.0, 0.0, -1.0, -0.1]]))
            self.w.bias.zero_()

    def forward(self, td):
        td.set("action", self.w(td.get("observation")).argmax(-1))
        return td


def test_remote_buffer_stores_local_data_once_and_restarts_from_checkpoint(ray_cluster, tmp_path):
    """Two collector actors (asking 1.5 CPU each of a 2-CPU cluster: a warning with the
    numbers, then they share the CPUs) write into a buffer actor, in a background thread:

    * every transition is stored once (write count = length = total frames), and actor
      ``i``'s transitions, in the order stored, are exactly the first ones a local collector
      seeded like it (``seed + 1000 * i``) collects (the actors run side by side: a faster
      one delivers more of the batches);
    * episode returns still reach the driver;
    * the buffer actor killed: restarted from its last checkpoint (every 96 transitions:
      at 192), it reports the 64 transitions written since as lost and holds the first 192
      transitions as they were;
    * used after ``shutdown()``: an error that says so.
    """
    from steersman.data import TensorDictReplayBuffer

    n, fpb, total, seed = 2, 32, 256, 3
    policy = Deterministic()
    rb = RayReplayBuffer(storage=LazyTensorStorage(1000), batch_size=16, checkpoint_dir=tmp_path / "rb",
                         checkpoint_interval=96)
    try:
        with pytest.warns(UserWarning, match=r"2 actors x 1.5 CPU = 3 CPUs requested, the Ray cluster has 2"):
            collector = RayCollector(CartPoleEnv, policy, frames_per_batch=fpb, total_frames=total, num_collectors=n,
                                     replay_buffer=rb, seed=seed, remote_configs={"num_cpus": 1.5})
        with collector:
            collector.start()
            collector.join(timeout=300)
            assert not collector.is_running()
            assert collector.frames == total
            assert len(collector.pop_episode_returns()) > 0  # metrics still reach the driver
        assert rb.write_count == len(rb) == total
        sample = rb.sample()
        assert sample.shape == (16,) and ("next", "reward") in sample.keys(True)

        def stored(path):  # the buffer's content, read back on this machine (the actor's node)
            rb.dumps(path)
            copy = TensorDictReplayBuffer(storage=LazyTensorStorage(1000))
            copy.loads(path)
            return copy[:len(copy)]

        before = stored(tmp_path / "before")
        counts = []
        for i in range(n):
            # async: a faster actor delivers more of the total; actor i's data is a prefix of its local twin's
            got = before[before.get(TRAJ) % n == i]
            counts.append(len(got))
            assert len(got) % fpb == 0
            local = Collector(CartPoleEnv(), policy, frames_per_batch=fpb, total_frames=len(got))
            local.set_seed(seed + 1000 * i)
            want = torch.cat([batch.reshape(-1) for batch in local])
            assert torch.equal(got.get(TRAJ), want.get(TRAJ) * n + i)
            for key in [("next", "reward"), "observation", "action", ("next", "observation"), ("next", "done")]:
                assert torch.equal(got.get(key), want.get(key)), (i, key)
        assert sum(counts) == total and min(counts) > 0, counts

        os.kill(rb.info()["pid"], signal.SIGKILL)
        with pytest.warns(UserWarning, match=r"checkpoint of 192 transitions; 64 transitions written since were lost"):
            assert len(rb) == 192
        assert rb.lost_transitions == 64
        after = stored(tmp_path / "after")
        for key in [("next", "reward"), "observation", TRAJ]:
            assert torch.equal(after.get(key), before[:192].get(key)), key
    finally:
        rb.shutdown()
    with pytest.raises(RuntimeError, match=r"buffer actor was shut down \(shutdown\(\)\), its data is gone"):
        rb.dumps(tmp_path / "late")  # a clear error, not an AttributeError of a None handle


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
import json, sys, time
sys.path.insert(0, sys.argv[2])  # the checkout: tests.distributed.test_ray, for this driver and its actors
sys.modules["ray"] = None  # first as if Ray were not installed (a fresh interpreter: nothing imported it yet)
import steersman.distributed as distributed
from steersman.envs import CartPoleEnv
imported = sorted(m for m, mod in sys.modules.items() if mod is not None and m.split(".")[0] == "ray")
try:
    distributed.RayCollector(CartPoleEnv, frames_per_batch=8, total_frames=8)
    error = None
except ImportError as err:
    error = str(err)
print(json.dumps({"ray_modules": imported, "error": error}), flush=True)
del sys.modules["ray"]  # then with Ray
import ray
ray.init(address=sys.argv[1], log_to_driver=False)
from steersman.collectors import MultiSyncDataCollector
from tests.distributed.test_ray import check_multi_process_actor_versions
collector = check_multi_process_actor_versions(MultiSyncDataCollector)
print(json.dumps(collector.actor_info[0]["pids"]), flush=True)
time.sleep(600)
"""


def test_lazy_import_then_killed_driver_leaves_no_worker(ray_cluster):
    """A driver script, in a fresh interpreter:

    * without Ray (``sys.modules["ray"] = None``): ``steersman.distributed`` imports and
      imports no Ray module; using it raises an ImportError naming the extra;
    * with Ray: runs a MultiSyncDataCollector actor through both modes, checking the
      versions (check_multi_process_actor_versions), and is then killed (SIGKILL): Ray kills
      the actors it owned, and their collector worker processes (children of the actor,
      not Ray processes) go too.
    """
    root = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, ray_cluster.address, root], stdout=subprocess.PIPE,
                            text=True, cwd=root)
    try:
        no_ray = json.loads(proc.stdout.readline() or "null")
        assert no_ray, "the driver script failed (its traceback is in the captured stderr)"
        assert no_ray["ray_modules"] == []
        assert "pip install 'steersman[ray]'" in (no_ray["error"] or ""), no_ray
        line = proc.stdout.readline()
        assert line, "the driver script failed (its traceback is in the captured stderr)"
        pids = json.loads(line)
        assert len(pids) == 3 and all(_alive(p) for p in pids)  # the actor and its 2 worker processes
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 60
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if _alive(p)]


def test_collector_made_right_after_another_shut_down_gets_whole_cpus(ray_cluster):
    """Killed actors give their CPUs back a little after ``shutdown()`` returns: the next
    collector waits for them (up to ``RELEASE_WAIT_S``) instead of warning and sharing."""
    import warnings

    for _ in range(2):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (no "CPUs requested" warning)
            c = RayCollector(CartPoleEnv, None, frames_per_batch=32, total_frames=64, num_collectors=2, sync=True)
        with c:
            assert c._cpus == 1 and [b.numel() for b in c] == [32, 32]


def test_collector_started_while_other_actors_hold_the_cpus_shares_them_and_an_unplaceable_one_times_out(
        ray_cluster):
    """A second collector on a cluster whose CPUs another collector's actors hold: a warning
    with the numbers, then its actor gets a share of a CPU and collects (before: it waited
    for a free CPU forever). An actor that can never be placed (a resource no node has): a
    RayCollectorError naming it within ``start_timeout``, not a hang."""
    first = RayCollector(CartPoleEnv, None, frames_per_batch=32, total_frames=-1, num_collectors=2, sync=True)
    try:
        with pytest.warns(UserWarning, match=r"1 actors x 1 CPU = 1 CPUs requested, the Ray cluster has 2 \(0 free: "
                                             r"other actors hold the rest\); each actor gets 0 CPU"):
            second = RayCollector(CartPoleEnv, None, frames_per_batch=16, total_frames=32, num_collectors=1)
        with second:
            assert [b.numel() for b in second] == [16, 16]
    finally:
        first.shutdown()
    t = time.monotonic()
    with pytest.raises(RayCollectorError, match=r"collector actors \[0\] did not start within 3 s \(each asks 0 CPU; "
                                                r"the Ray cluster has 2 CPUs, \d+ free\)"):
        RayCollector(CartPoleEnv, None, frames_per_batch=16, total_frames=32, num_collectors=1, start_timeout=3,
                     remote_configs={"num_cpus": 0, "resources": {"no_such_node": 1}})
    assert time.monotonic() - t < 30
