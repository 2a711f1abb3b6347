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


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
@pytest.mark.parametrize("collector_class", [Collector, MultiSyncDataCollector], ids=["Collector", "MultiSync"])
def test_every_batch_uses_the_newest_weights(ray_cluster, collector_class, sync):
    """After the k-th update, every batch requested is collected with version k (not k-1);
    actors are on different nodes; exactly total_frames frames are delivered."""
    policy, n, fpb = VersionPolicy(), 2, 32
    with RayCollector(CartPoleEnv, policy, frames_per_batch=fpb, total_frames=8 * fpb, num_collectors=n, sync=sync,
                      collector_class=collector_class, num_workers_per_collector=2) as collector:
        assert len({info["node_id"] for info in collector.actor_info}) == n
        expected = [0] * n  # version each actor's next batch must have
        frames = 0
        for k, batch in enumerate(collector):
            frames += batch.numel()
            if sync:
                assert batch.shape[0] == n and batch.numel() == fpb
                assert (batch["version"] == expected[0]).all(), (k, batch["version"].unique())
            else:
                i = _actor_of(batch, n)
                assert batch.numel() == fpb
                assert (batch["version"] == expected[i]).all(), (k, i, batch["version"].unique(), expected)
            _set(policy, k + 1)
            assert collector.update_policy_weights_() == k + 1
            if sync:
                expected = [k + 1] * n
            else:
                expected[i] = k + 1  # actor i's next request leaves after this update
        assert frames == collector.frames == 8 * fpb
        assert list(collector) == []  # done: iterating again yields nothing


def test_killed_actor_is_restarted_and_frames_count_once(ray_cluster):
    """SIGKILL of a collector actor mid-run: restarted, its lost batch collected again, the
    run delivers exactly total_frames, and the restarted actor uses the newest weights."""
    policy, n, fpb, batches = VersionPolicy(), 2, 32, 10
    with RayCollector(CartPoleEnv, policy, frames_per_batch=fpb, total_frames=batches * fpb, num_collectors=n,
                      max_restarts=2) as collector:
        victim = collector.actor_info[0]["pid"]
        seen, killed, versions_of_0 = 0, False, []
        with pytest.warns(UserWarning, match=r"collector actor 0 .* was restarted \(1/2\) after: .*collected again"):
            for batch in collector:
                seen += batch.numel()
                if not killed:
                    os.kill(victim, signal.SIGKILL)
                    killed = True
                    _set(policy, 7)
                    collector.update_policy_weights_()
                elif _actor_of(batch, n) == 0:
                    versions_of_0.append(set(batch["version"].tolist()))
        # actor 0's request in flight at the kill may have been answered before it died (with
        # version 0); every later batch comes from the restarted actor, with the newest weights
        assert versions_of_0[0] in ({0.0}, {7.0}) and all(v == {7.0} for v in versions_of_0[1:]), versions_of_0
        assert versions_of_0[-1] == {7.0}  # the restarted actor delivered
        assert seen == collector.frames == batches * fpb
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
    rb = RayReplayBuffer(storage=LazyTensorStorage(10_000), batch_size=16, checkpoint_dir=tmp_path / "rb",
                         checkpoint_interval=64)
    try:
        with RayCollector(CartPoleEnv, None, frames_per_batch=32, total_frames=320, num_collectors=2,
                          replay_buffer=rb) as collector:
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


def test_metrics_and_eval_worker_match_local(ray_cluster):
    """Episode returns computed in the actors equal those computed locally from the same
    batches; RayEvalWorker returns what a local rollout returns."""
    reference = EpisodeReturns()
    with RayCollector(CartPoleEnv, VersionPolicy(), frames_per_batch=64, total_frames=256, num_collectors=2,
                      sync=True) as collector:
        expected = []
        for batch in collector:
            expected += reference.update(batch).tolist()
        assert sorted(collector.pop_episode_returns()) == sorted(expected) and expected
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


def test_more_collectors_than_cpus_warns_with_numbers(ray_cluster):
    with pytest.warns(UserWarning, match=r"4 actors x 1 CPU = 4 CPUs requested, the Ray cluster has 3"):
        collector = RayCollector(CartPoleEnv, None, frames_per_batch=32, total_frames=128, num_collectors=4)
    try:
        assert sum(b.numel() for b in collector) == 128  # they all got placed
    finally:
        collector.shutdown()


DRIVER = """
import json, sys, time, ray
ray.init(address=sys.argv[1], log_to_driver=False)
from steersman.distributed import RayCollector
from steersman.envs import CartPoleEnv
from steersman.collectors import MultiSyncDataCollector
c = RayCollector(CartPoleEnv, None, frames_per_batch=32, total_frames=-1, num_collectors=2,
                 collector_class=MultiSyncDataCollector, num_workers_per_collector=2)
print(json.dumps([p for info in c.actor_info for p in info["pids"]]), flush=True)
time.sleep(600)
"""


def test_killed_driver_leaves_no_worker(ray_cluster):
    """SIGKILL of the driver: Ray kills the actors it owned, and their collector processes go too."""
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, ray_cluster.address], stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(proc.stdout.readline())
        assert len(pids) == 6 and all(_alive(p) for p in pids)  # 2 actors x (actor + 2 workers)
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


@pytest.mark.slow
def test_sac_recipe_on_ray_writes_the_same_run_as_local(ray_cluster, tmp_path):
    """`steersman train sac distributed.backend=ray`: same run folder layout, metrics and
    frame count as a local run."""
    import sys as _sys

    import ray

    _sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "recipes"))
    from _tiny import tiny_config

    from steersman.recipes.sac import train

    over = {"total_frames": 256, "frames_per_batch": 32, "learning_starts": 64, "utd_ratio": 0.25,
            "checkpoint.interval": 128}
    local = train(tiny_config("sac", **over), tmp_path / "local")
    remote = train(tiny_config("sac", **over, **{"distributed.backend": "ray", "distributed.num_collectors": 2,
                                                 "distributed.cpus_per_collector": 0.5}), tmp_path / "ray")
    assert remote["frames"] == local["frames"] == 256
    names = lambda d: sorted(p.relative_to(d).parts[0] for p in d.iterdir())  # noqa: E731
    assert names(tmp_path / "ray") == names(tmp_path / "local")
    assert set(remote) == set(local)
    assert ray.is_initialized()  # the test's cluster connection is not shut down by the recipe


def _flat_state(obj, prefix=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _flat_state(v, f"{prefix}/{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _flat_state(v, f"{prefix}/{i}")
    elif hasattr(obj, "to_dict"):
        yield from _flat_state(obj.to_dict(), prefix)
    else:
        yield prefix, obj


def test_ppo_recipe_on_ray_is_on_policy_and_resumes_bit_exact(ray_cluster, tmp_path, monkeypatch):
    """`steersman train ppo distributed.backend=ray`: the run folder of a local run; every
    batch is collected with the weights of the last update (the collector's version is the
    number of batches); stopped after two batches and resumed, it ends with the same
    checkpoint (networks, optimizer, every actor's collector, env and RNG state) as an
    uninterrupted distributed run."""
    import math

    import ray

    from steersman.recipes.checkpoint import load_checkpoint
    from steersman.recipes.config import ConfigError
    from steersman.recipes.ppo import train
    from steersman.recipes.run import Run
    from tests.recipes._tiny import tiny_config

    ray_over = {"distributed.backend": "ray", "distributed.num_collectors": 2, "distributed.cpus_per_collector": 0.5}
    over = {"total_frames": 256, "export_format": "none", "checkpoint.interval": 64}  # 4 batches of [4 envs, 16]
    local = train(tiny_config("ppo", **over), tmp_path / "local")
    full = train(tiny_config("ppo", **over, **ray_over), tmp_path / "full")
    assert full["frames"] == local["frames"] == 256 and set(full) == set(local)
    names = lambda d: sorted(p.name for p in d.iterdir())  # noqa: E731
    assert names(tmp_path / "full") == names(tmp_path / "local")
    state = load_checkpoint(tmp_path / "full" / "checkpoints").state
    assert state["collector"]["version"] == 4  # one weight update per batch
    assert [c["version"] for c in state["collector"]["collectors"]] == [4, 4]  # every actor holds the newest

    original = Run.log

    def log(self, frames, metrics):
        original(self, frames, metrics)
        if frames >= 128 and not self._resume:
            self.stop_signal = signal.SIGTERM

    monkeypatch.setattr(Run, "log", log)
    stopped = train(tiny_config("ppo", **over, **ray_over), tmp_path / "resumed")
    assert stopped["interrupted"] and stopped["frames"] == 128
    monkeypatch.setattr(Run, "log", original)
    resumed = train(tiny_config("ppo", **over, **ray_over), tmp_path / "resumed", resume=True)
    assert resumed["frames"] == 256
    a = dict(_flat_state(state))
    b = dict(_flat_state(load_checkpoint(tmp_path / "resumed" / "checkpoints").state))
    assert a.keys() == b.keys()
    for key, va in a.items():
        if isinstance(va, torch.Tensor):
            assert torch.equal(va, b[key]), key
        elif not (isinstance(va, float) and math.isnan(va)):
            assert va == b[key], key
    assert ray.is_initialized()  # the test's cluster connection is not shut down by the recipe

    with pytest.raises(ConfigError, match=r"env.num_envs \(4\) out among distributed.num_collectors \(3\)"):
        train(tiny_config("ppo", **over, **{**ray_over, "distributed.num_collectors": 3}), tmp_path / "bad")
