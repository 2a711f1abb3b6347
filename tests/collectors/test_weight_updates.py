"""Weight updaters and TorchRL's collector keyword arguments.

The policy reveals its weights: with ``version_weights(k)`` the scoring policy's
``"score"`` output is ``k`` at every step; ``track_policy_version`` tags every step with
the number of updates the policy had. Every collector class must show version ``k`` (not
``k - 1``) after the ``k``-th update, in every worker.
"""

from __future__ import annotations

import functools

import pytest
import torch

from steersman.collectors import (
    BaseCollector,
    Collector,
    MultiaSyncDataCollector,
    MultiCollector,
    MultiProcessedWeightUpdater,
    MultiSyncDataCollector,
    RemoteModuleWeightUpdater,
    VanillaWeightUpdater,
    WeightUpdaterBase,
    aSyncDataCollector,
)
from steersman.envs import CartPoleEnv
from steersman.tensordict import TensorDict
from tests.collectors._helpers import make_scoring_policy, native4

W = 2


def version_weights(k: int) -> dict:
    """ArgmaxScoreNet weights whose score (the max logit) is ``k`` for every observation."""
    return {"module.lin.weight": torch.zeros(2, 4), "module.lin.bias": torch.tensor([float(k), -1.0])}


def _versions(batch) -> tuple[torch.Tensor, torch.Tensor]:
    return batch["score"], batch["policy_version"]


def _check_sync(c, updates: int = 3) -> None:
    for k in range(1, updates + 1):
        c.update_policy_weights_(version_weights(k))
        assert c.policy_version == k
        score, tag = _versions(c.next())
        assert bool((score == k).all()), f"update {k}: scores {score.unique().tolist()}"
        assert bool((tag == k).all()), f"update {k}: policy_version {tag.unique().tolist()}"


def _check_async(c, workers: int, updates: int = 3) -> None:
    """A batch already started may still use the previous weights; each worker's second
    batch after an update must use the new ones; a batch never mixes versions."""
    for k in range(1, updates + 1):
        c.update_policy_weights_(weights=version_weights(k))
        seen = {i: 0 for i in range(workers)}
        while min(seen.values()) < 2:
            batch = c.next()
            score, tag = _versions(batch)
            worker = int(batch["collector", "traj_ids"].reshape(-1)[0]) % workers
            seen[worker] += 1
            assert bool((score == tag).all()) and tag.unique().numel() == 1, "a batch mixes weight versions"
            expected = {k} if seen[worker] == 2 else {k - 1, k}
            assert int(tag.reshape(-1)[0]) in expected, (k, worker, seen[worker], tag.unique().tolist())


CASES = {
    # name: (builder, sync?, workers)
    "Collector": (lambda: Collector(native4(), make_scoring_policy(), frames_per_batch=16,
                                    track_policy_version=True), True, 1),
    "MultiCollector(sync=True)": (lambda: MultiCollector(
        [native4] * W, make_scoring_policy(), sync=True, frames_per_batch=32, track_policy_version=True),
        True, W),
    # TorchRL's generic constructor; the workers build their policy (policy_factory)
    "Collector(num_collectors=2)": (lambda: Collector(
        native4, policy_factory=functools.partial(make_scoring_policy, 0), num_collectors=W,
        frames_per_batch=16, track_policy_version=True), False, W),
    "aSyncDataCollector": (lambda: aSyncDataCollector(
        native4, make_scoring_policy(), frames_per_batch=16, track_policy_version=True), False, 1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_worker_receives_every_weight_update(case):
    build, sync, workers = CASES[case]
    c = build()
    try:
        assert isinstance(c, BaseCollector)
        expected = {"Collector": Collector, "MultiCollector(sync=True)": MultiSyncDataCollector,
                    "Collector(num_collectors=2)": MultiaSyncDataCollector,
                    "aSyncDataCollector": aSyncDataCollector}[case]
        assert type(c) is expected
        if sync:
            _check_sync(c)
        else:
            _check_async(c, workers)
    finally:
        c.shutdown()


def test_default_updaters_and_explicit_weights():
    policy = make_scoring_policy()
    c = Collector(CartPoleEnv(), policy, frames_per_batch=4)
    assert isinstance(c.weight_updater, VanillaWeightUpdater) and c.weight_updater.collector is c
    c.update_policy_weights_()  # the collector runs the policy itself: nothing to push
    assert c.policy_version == 0
    c.update_policy_weights_(policy=version_weights(5))
    assert policy.module.lin.bias.tolist() == [5.0, -1.0] and c.policy_version == 1
    with pytest.raises(KeyError, match="no weight 'module.nope'"):
        c.update_policy_weights_({"module.nope": torch.zeros(1)})
    assert policy.module.lin.bias.tolist() == [5.0, -1.0] and c.policy_version == 1

    remote = Collector(CartPoleEnv(), make_scoring_policy(), frames_per_batch=4,
                       weight_updater=RemoteModuleWeightUpdater)
    with pytest.raises(RuntimeError, match="pass the weights explicitly"):
        remote.update_policy_weights_()
    remote.update_policy_weights_(version_weights(2))
    assert remote.policy.module.lin.bias.tolist() == [2.0, -1.0]


def test_plain_updaters_and_custom_subclass():
    net = torch.nn.Linear(2, 1)
    pushed = []
    van = VanillaWeightUpdater(weight_getter=lambda: {"weight": torch.ones(1, 2), "bias": torch.zeros(1)},
                               policy_weights=TensorDict.from_module(net))
    van.register_post_hook(lambda: pushed.append(van.version))
    van()
    assert net.weight.tolist() == [[1.0, 1.0]] and pushed == [1]
    with pytest.raises(ValueError, match="has shape"):
        van({"weight": torch.ones(3), "bias": torch.zeros(1)})
    assert net.weight.tolist() == [[1.0, 1.0]] and van.version == 1

    a, b = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    mp = MultiProcessedWeightUpdater(get_server_weights=lambda: net, policy_weights={
        "cpu:0": TensorDict.from_module(a), "cpu:1": TensorDict.from_module(b)})
    mp.push_weights()
    assert a.weight.tolist() == b.weight.tolist() == [[1.0, 1.0]]

    class Recorder(WeightUpdaterBase):
        def __init__(self):
            super().__init__()
            self.calls = []

        def all_worker_ids(self):
            return [0, 1, 2]

        def _sync_weights_with_worker(self, *, worker_id=None, server_weights=None):
            self.calls.append((worker_id, float(server_weights["w"])))

    rec = Recorder()
    c = Collector(CartPoleEnv(), None, frames_per_batch=4, weight_updater=rec)
    c.update_policy_weights_({"w": torch.tensor(3.0)})
    c.update_policy_weights_({"w": torch.tensor(4.0)}, worker_ids=[1])
    assert rec.calls == [(0, 3.0), (1, 3.0), (2, 3.0), (1, 4.0)] and c.policy_version == 2
    with pytest.raises(TypeError, match="weight_updater must be"):
        Collector(CartPoleEnv(), None, frames_per_batch=4, weight_updater=3)


def test_torchrl_keywords_hooks_and_refusals():
    events = []
    policy = make_scoring_policy()
    c = Collector(CartPoleEnv(batch_size=[2]), policy_factory=lambda: policy, frames_per_batch=8, total_frames=16,
                  pre_collect_hook=lambda: events.append("pre"),
                  post_collect_hook=lambda b: events.append(tuple(b.batch_size)),
                  track_traj_ids=True, use_buffers=True, cudagraph_policy=False, worker_idx=3,
                  compact_obs=False, extend_buffer=True, backend="direct")
    assert c.policy is policy and c.worker_idx == 3
    assert len(list(c)) == 2 and events == ["pre", (2, 4), "pre", (2, 4)]
    refused = {"trajs_per_batch": 4, "compact_obs": True, "extend_buffer": False, "interruptor": object(),
               "weight_sync_schemes": {}, "auto_register_policy_transforms": True}
    for name, value in refused.items():  # refused before any env or worker is built
        with pytest.raises(NotImplementedError, match=f"{name}=.* is not supported: "):
            Collector(CartPoleEnv(), None, frames_per_batch=4, **{name: value})
        if name == "interruptor":
            name, value = "preemptive_threshold", 0.5  # the multi-process form
        with pytest.raises(NotImplementedError, match=f"{name}=.* is not supported: "):
            MultiSyncDataCollector([CartPoleEnv], None, frames_per_batch=4, **{name: value})
    with pytest.raises(ValueError, match="policy or policy_factory, not both"):
        Collector(CartPoleEnv(), policy, policy_factory=lambda: policy, frames_per_batch=4)
    with pytest.raises(ValueError, match="backend='ray'"):
        Collector(CartPoleEnv(), None, frames_per_batch=4, backend="ray")
    with pytest.raises(ValueError, match="contradicts the class"):
        MultiSyncDataCollector([CartPoleEnv], None, frames_per_batch=4, sync=False)
    with pytest.raises(NotImplementedError, match="collector_class"):
        MultiaSyncDataCollector([CartPoleEnv], None, frames_per_batch=4, collector_class=dict)
