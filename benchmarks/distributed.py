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
from typing import Any

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


def bench_broadcast(n_actors: int = 4, reps: int = 20) -> dict[str, float]:
    """ms per update of a ~1M-parameter policy: put once + every actor has loaded it, for
    the previous message (a dict of one NumPy array per tensor) and the current one (one
    flat byte buffer + its layout); plus the floor: an empty call to the 4 actors."""
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
        out = {"params": sum(p.numel() for p in policy.parameters())}

        def per_tensor() -> Any:  # the message before: one array per tensor
            return ray.put({k: v.detach().numpy() for k, v in policy.state_dict().items()})

        def flat() -> Any:  # the message now
            collector.update_policy_weights_()
            return collector._weights_ref

        for name, make in (("per_tensor", per_tensor), ("flat", flat), ("per_tensor", per_tensor), ("flat", flat)):
            times, put_times = [], []
            for k in range(reps):
                with torch.no_grad():
                    policy.net[0].bias.fill_(k)
                t = time.perf_counter()
                ref = make()
                put_times.append(time.perf_counter() - t)
                version = 10_000 + len(times) + 100 * len(out)  # always newer: every actor loads it
                ray.get([a._apply_weights.remote([version, ref]) for a in collector._actors])
                times.append(time.perf_counter() - t)
            out[name] = 1e3 * statistics.median(times[2:])  # the second round of each wins (warm)
            out[name + "_put"] = 1e3 * statistics.median(put_times[2:])
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            ray.get([a.ping.remote() for a in collector._actors])
            times.append(time.perf_counter() - t)
        out["empty_call"] = 1e3 * statistics.median(times[2:])
        return out
    finally:
        collector.shutdown()


def bench_buffer(reps: int = 50) -> dict[str, float]:
    """ms per ``sample(256)`` and per ``extend(1000 transitions)``: waiting for each call
    (the protocol before) against prefetch=4 / writes in flight (now), in one run."""
    rb = RayReplayBuffer(storage=LazyTensorStorage(100_000), batch_size=256)
    try:
        data = TensorDict({"observation": torch.randn(1000, 4), "action": torch.randn(1000, 1),
                           ("next", "observation"): torch.randn(1000, 4), ("next", "reward"): torch.randn(1000, 1),
                           ("next", "done"): torch.zeros(1000, 1, dtype=torch.bool)}, [1000])
        out = {}
        for _ in range(2):  # the second round is reported (warm)
            for mode, pending, prefetch in (("wait", 0, 0), ("async", 8, 4)):
                rb.max_pending_writes, rb.prefetch = pending, prefetch
                ext, smp = [], []
                for _ in range(reps):
                    t = time.perf_counter()
                    rb.extend(data)
                    ext.append(time.perf_counter() - t)
                t = time.perf_counter()
                rb.flush()
                flush = time.perf_counter() - t
                for _ in range(reps):
                    t = time.perf_counter()
                    rb.sample(256)
                    smp.append(time.perf_counter() - t)
                out[f"extend_{mode}"] = 1e3 * statistics.median(ext)
                out[f"extend_{mode}_mean_with_flush"] = 1e3 * (sum(ext) + flush) / reps
                out[f"sample_{mode}"] = 1e3 * statistics.median(smp)
                out[f"sample_{mode}_mean"] = 1e3 * statistics.mean(smp)
        return out
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
    b = bench_broadcast()
    print(f"weight broadcast, {b['params'] / 1e6:.2f}M params to 4 actors, ms/update (put): one array per tensor "
          f"{b['per_tensor']:.1f} ({b['per_tensor_put']:.1f}), one flat buffer {b['flat']:.1f} ({b['flat_put']:.1f}); "
          f"ratio {b['per_tensor'] / b['flat']:.2f}x; floor (empty call to the 4 actors) {b['empty_call']:.1f}")
    r = bench_buffer()
    print(f"RayReplayBuffer sample(256), ms median (mean): waiting {r['sample_wait']:.2f} ({r['sample_wait_mean']:.2f}), "
          f"prefetch=4 {r['sample_async']:.2f} ({r['sample_async_mean']:.2f}); ratio "
          f"{r['sample_wait'] / r['sample_async']:.1f}x")
    print(f"RayReplayBuffer extend(1000), ms median (mean incl. final flush): waiting {r['extend_wait']:.2f} "
          f"({r['extend_wait_mean_with_flush']:.2f}), in flight {r['extend_async']:.2f} "
          f"({r['extend_async_mean_with_flush']:.2f}); ratio {r['extend_wait'] / r['extend_async']:.1f}x")


if __name__ == "__main__":
    main()
