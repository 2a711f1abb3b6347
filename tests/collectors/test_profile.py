"""enable_profile / ProfileConfig: the rollouts run under torch.profiler and a trace is written
(by the listed workers only, for multi-process collectors); stats() snapshots of the collectors."""

from __future__ import annotations

import functools
import json

import pytest

from steersman.collectors import Collector, MultiSyncDataCollector, ProfileConfig
from steersman.envs import CartPoleEnv

from ._helpers import make_policy


@pytest.mark.parametrize("bad", [dict(num_rollouts=2, warmup_rollouts=2), dict(warmup_rollouts=-1),
                                 dict(activities=["gpu"])])
def test_profile_config_refuses_bad_settings(bad):
    with pytest.raises(ValueError, match="ProfileConfig"):
        ProfileConfig(**bad)


def test_collector_profiles_then_runs_unprofiled(tmp_path):
    seen = []
    c = Collector(CartPoleEnv(), make_policy(), frames_per_batch=8, total_frames=48)
    c.enable_profile(num_rollouts=3, warmup_rollouts=1, on_trace_ready=seen.append, with_stack=False)
    names = []
    for i, _ in enumerate(c):
        if i == 2:
            prof = seen[0]
            names = {e.name for e in prof.events()}
    assert len(seen) == 1                       # one trace, after the 3rd rollout
    assert "collector_rollout_1" in names and "collector_rollout_2" in names
    assert "collector_rollout_0" not in names   # the warmup rollout is left out
    assert c._profiling is None                 # later rollouts run unprofiled
    assert c.stats()["batches"] == 6


def test_multi_collector_profiles_only_the_listed_worker(tmp_path):
    env = functools.partial(CartPoleEnv, batch_size=[2])
    c = MultiSyncDataCollector(env, make_policy(), num_workers=2, frames_per_batch=16, total_frames=64)
    try:
        with pytest.raises(ValueError, match="out of range"):
            c.enable_profile(workers=[2])
        c.enable_profile(workers=[1], num_rollouts=2, warmup_rollouts=1, with_stack=False,
                         save_path=str(tmp_path / "w{worker_idx}" / "trace.json"))
        for _ in c:
            pass
        s = c.stats()
    finally:
        c.shutdown()
    assert "traceEvents" in json.loads((tmp_path / "w1" / "trace.json").read_text())
    assert not (tmp_path / "w0").exists()
    assert s["frames"] == 64 and s["batches"] == 4 and s["completed"] is True
