"""Distributed collection and replay on Ray: throughput and per-message costs.

Measures, on one machine (a local Ray instance):

1. frames/s of ``RayCollector`` with N collector actors against the local
   ``MultiSyncDataCollector`` with N worker processes (same env, same policy, one run);
2. the weight broadcast of a 1M-parameter policy to 4 actors (ms per update: one
   ``ray.put`` plus every actor fetching and loading it);
3. ``RayReplayBuffer.sample(256)`` and ``extend(1000 transitions)`` round trips (ms);
4. ``--pendulum``: frames/s of RayCollector on an unbatched Pendulum (2 actors, a linear
   policy, 256 frames per batch), the setting ``--torchrl`` runs with TorchRL's
   RayCollector and its own native Pendulum (run that one with a venv holding torchrl and
   ray: ``~/.cache/steersman/anchors-venv/bin/python benchmarks/distributed.py --torchrl``).

Run: ``.venv/bin/python benchmarks/distributed.py [--collectors 2] [--frames 20000]``.
Results go to benchmarks/README.md (section "Distributed (Ray)").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from torch import nn

PENDULUM = {"frames_per_batch": 256, "frames": 10_000, "collectors": 2}


def fps(collector, frames: int) -> float:
    it = iter(collector)
    next(it)  # warm-up batch (actor/worker start-up excluded)
    t, n = time.perf_counter(), 0
    for batch in it:
        n += batch.numel()
        if n >= frames:
            break
    return n / (time.perf_counter() - t)



def torchrl_pendulum() -> None:
    """TorchRL's RayCollector, unbatched native Pendulum, linear policy (the --pendulum setting).

    ``total_frames=-1`` (no end) makes TorchRL 0.14's RayCollector stop at once (its
    iterator yields nothing), hence the large finite count."""
    import ray
    from tensordict.nn import TensorDictModule
    from torchrl.collectors.distributed import RayCollector as TorchRLRayCollector
    from torchrl.envs import PendulumEnv

    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=300 * 2**20, log_to_driver=False,
             _system_config={"worker_niceness": 0})
    class Linear3(nn.Module):  # TorchRL's Pendulum gives th, thdot: the same 3 features as steersman's observation
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(3, 1)

        def forward(self, th, thdot):
            return self.net(torch.stack([th.cos(), th.sin(), thdot], -1))

    policy = TensorDictModule(Linear3(), ["th", "thdot"], ["action"])
    collector = TorchRLRayCollector([PendulumEnv] * PENDULUM["collectors"], policy,
                                    frames_per_batch=PENDULUM["frames_per_batch"], total_frames=10**9, sync=True,
                                    remote_configs={"num_cpus": 1})
    try:
        print(f"TorchRL RayCollector, Pendulum, {PENDULUM['collectors']} collectors: "
              f"{fps(collector, PENDULUM['frames']):,.0f} frames/s")
    finally:
        collector.shutdown()


if "--torchrl" in sys.argv and __name__ == "__main__":
    torchrl_pendulum()
    sys.exit(0)

from steersman import TensorDict  # noqa: E402
from steersman.collectors import MultiSyncDataCollector  # noqa: E402
from steersman.data import LazyTensorStorage  # noqa: E402
from steersman.distributed import RayCollector, RayReplayBuffer, init_ray  # noqa: E402
from steersman.envs import CartPoleEnv, PendulumEnv  # noqa: E402


def make_env() -> CartPoleEnv:
    return CartPoleEnv(batch_size=[16])


class Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(3, 1)

    def forward(self, td):
        td.set("action", self.net(td.get("observation")))
        return td


def steersman_pendulum() -> float:
    collector = RayCollector([PendulumEnv] * PENDULUM["collectors"], Linear(),
                             frames_per_batch=PENDULUM["frames_per_batch"], total_frames=-1, sync=True)
    try:
        return fps(collector, PENDULUM["frames"])
    finally:
        collector.shutdown()


class Greedy(nn.Module):
    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, 2))

    def forward(self, td):
        td.set("action", self.net(td.get("observation")).argmax(-1))
        return td


def bench_collect(n: int, frames: int, fpb: int) -> tuple[float, float]:
    local = MultiSyncDataCollector([make_env] * n, Greedy(), frames_per_batch=fpb, total_frames=-1)
    try:
        local_fps = fps(local, frames)
    finally:
        local.shutdown()
    remote = RayCollector(make_env, Greedy(), frames_per_batch=fpb, total_frames=-1, num_collectors=n, sync=True)
    try:
        ray_fps = fps(remote, frames)
    finally:
        remote.shutdown()
    return local_fps, ray_fps


def bench_broadcast(n_actors: int = 4, reps: int = 20) -> tuple[int, float]:
    """ms per update of a ~1M-parameter policy: put once + every actor has loaded it."""
    import ray

    class Holder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 1000), nn.Tanh(), nn.Linear(1000, 1000), nn.Tanh(),
                                     nn.Linear(1000, 2))

        def forward(self, td):
            td.set("action", self.net(td.get("observation")).argmax(-1))
            return td

    collector = RayCollector(make_env, Holder(), frames_per_batch=16, total_frames=-1, num_collectors=n_actors,
                             remote_configs={"num_cpus": 0.25})
    try:
        policy = collector.policy
        n_params = sum(p.numel() for p in policy.parameters())
        times = []
        for k in range(reps):
            with torch.no_grad():
                policy.net[0].bias.fill_(k)
            t = time.perf_counter()
            v = collector.update_policy_weights_()
            ray.get([a._apply_weights.remote([v, collector._weights_ref]) for a in collector._actors])
            times.append(time.perf_counter() - t)
        return n_params, 1e3 * statistics.median(times[2:])
    finally:
        collector.shutdown()


def bench_buffer(reps: int = 50) -> tuple[float, float]:
    rb = RayReplayBuffer(storage=LazyTensorStorage(100_000), batch_size=256)
    try:
        data = TensorDict({"observation": torch.randn(1000, 4), "action": torch.randn(1000, 1),
                           ("next", "observation"): torch.randn(1000, 4), ("next", "reward"): torch.randn(1000, 1),
                           ("next", "done"): torch.zeros(1000, 1, dtype=torch.bool)}, [1000])
        ext, smp = [], []
        for _ in range(reps):
            t = time.perf_counter()
            rb.extend(data)
            ext.append(time.perf_counter() - t)
        for _ in range(reps):
            t = time.perf_counter()
            rb.sample(256)
            smp.append(time.perf_counter() - t)
        return 1e3 * statistics.median(smp), 1e3 * statistics.median(ext)
    finally:
        rb.shutdown()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--collectors", type=int, default=2)
    p.add_argument("--frames", type=int, default=20_000)
    p.add_argument("--frames-per-batch", type=int, default=1024)
    p.add_argument("--pendulum", action="store_true", help="only the Pendulum setting of --torchrl")
    args = p.parse_args()
    torch.set_num_threads(1)
    t = time.perf_counter()
    init_ray({"object_store_memory": 300 * 2**20, "log_to_driver": False})
    print(f"ray.init: {time.perf_counter() - t:.1f} s")
    if args.pendulum:
        print(f"steersman RayCollector, Pendulum, {PENDULUM['collectors']} collectors: "
              f"{steersman_pendulum():,.0f} frames/s")
        return
    local_fps, ray_fps = bench_collect(args.collectors, args.frames, args.frames_per_batch)
    print(f"collect, {args.collectors} collectors, CartPole[16], {args.frames_per_batch} frames/batch: "
          f"local MultiSync {local_fps:,.0f} frames/s, RayCollector {ray_fps:,.0f} frames/s, "
          f"ratio {ray_fps / local_fps:.2f}")
    n_params, ms = bench_broadcast()
    print(f"weight broadcast, {n_params / 1e6:.2f}M params to 4 actors: {ms:.1f} ms/update")
    s_ms, e_ms = bench_buffer()
    print(f"RayReplayBuffer: sample(256) {s_ms:.2f} ms, extend(1000) {e_ms:.2f} ms")


if __name__ == "__main__":
    main()
