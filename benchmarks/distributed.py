"""Distributed collection and replay on Ray: throughput and per-message costs.

Measures, on one machine (a local Ray instance):

1. frames/s of ``RayCollector`` with N collector actors against the local
   ``MultiSyncDataCollector`` with N worker processes (same env, same policy, one run:
   the median of ``--reps`` alternating windows), and where a Ray batch's time goes;
2. the weight broadcast of a 1M-parameter policy to 4 actors (median and p90 of 30
   updates: the learner's ``update_policy_weights_``, each actor's fetch and copy, and the
   standalone round trip with the actors' wake-up);
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
import os
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


def _q(xs: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of ``xs``."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def bench_collect(n: int, frames: int, fpb: int, reps: int = 5) -> dict[str, Any]:
    """Frames/s of the local MultiSyncDataCollector and of RayCollector (n workers / actors,
    sync), both built once and measured in alternating windows of ``frames`` frames
    (``reps`` each, after a warm-up batch): the median of the per-window ratios. Then where a
    RayCollector batch's time goes: the driver's round trip of one request to every actor
    against the actors' own time in the call (``busy_s``: collecting and packing), and the
    driver's unpacking and stacking."""
    import ray

    from steersman.distributed._wire import unpack

    out: dict[str, Any] = {"load_before": _load()}
    local = MultiSyncDataCollector([make_env] * n, Greedy(), frames_per_batch=fpb, total_frames=-1)
    remote = RayCollector(make_env, Greedy(), frames_per_batch=fpb, total_frames=-1, num_collectors=n, sync=True)
    try:
        lf, rf = [], []
        for _ in range(reps):
            lf.append(fps(local, frames))
            rf.append(fps(remote, frames))
        out["local_fps"], out["ray_fps"] = statistics.median(lf), statistics.median(rf)
        out["ratios"] = [ray_ / local_ for ray_, local_ in zip(rf, lf)]
        out["ratio"] = statistics.median(out["ratios"])
        # one sync step by hand: what RayCollector's sync iterator does, timed piecewise
        wall, busy, unpack_s, seq = [], [], [], 10**6
        for _ in range(20):
            t = time.perf_counter()
            replies = ray.get([a.collect.remote(seq, None) for a in remote._actors])
            t1 = time.perf_counter()
            torch.stack([unpack(b) for _, b in replies], 0)
            unpack_s.append(time.perf_counter() - t1)
            wall.append(t1 - t)
            busy.append(max(info["busy_s"] for info, _ in replies))
            seq += 1
        out["ray_round_trip_ms"] = 1e3 * statistics.median(wall)
        out["ray_busy_ms"] = 1e3 * statistics.median(busy)
        out["ray_overhead_ms"] = 1e3 * statistics.median([w - b for w, b in zip(wall, busy)])
        out["ray_unpack_ms"] = 1e3 * statistics.median(unpack_s)
        it, t_local = iter(local), []
        for _ in range(20):
            t = time.perf_counter()
            next(it)
            t_local.append(time.perf_counter() - t)
        out["local_batch_ms"] = 1e3 * statistics.median(t_local)
    finally:
        local.shutdown()
        remote.shutdown()
    out["load_after"] = _load()
    return out


def bench_broadcast(n_actors: int = 4, reps: int = 30) -> dict[str, float]:
    """A ~1M-parameter policy's weights to 4 actors, per update (median and p90 of
    ``reps``): what the learner waits for in ``update_policy_weights_`` (packing into the
    flat buffer and one ``ray.put``); what each actor spends taking them (fetch from the
    object store and copy into its policy: paid inside its next ``collect`` request, which
    carries the reference); and the standalone round trip the earlier rows measured (put,
    then one call to each actor that loads them, waiting for all), with its floor (an empty
    call to the 4 actors: waking them)."""
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
        out: dict[str, Any] = {"params": sum(p.numel() for p in policy.parameters()), "load_before": _load()}
        put, apply, total, empty = [], [], [], []
        for k in range(reps + 3):  # the first 3 warm up
            with torch.no_grad():
                policy.net[0].bias.fill_(k)
            t = time.perf_counter()
            version = collector.update_policy_weights_()
            t1 = time.perf_counter()
            spent = ray.get([a._apply_weights.remote([version, collector._weights_ref]) for a in collector._actors])
            t2 = time.perf_counter()
            ray.get([a.ping.remote() for a in collector._actors])
            t3 = time.perf_counter()
            if k >= 3:
                put.append(t1 - t)
                apply.append(max(spent))
                total.append(t2 - t)
                empty.append(t3 - t2)
        for name, xs in (("update", put), ("actor_apply", apply), ("round_trip", total), ("empty_call", empty)):
            out[name] = 1e3 * statistics.median(xs)
            out[name + "_p90"] = 1e3 * _q(xs, 0.9)
        out["load_after"] = _load()
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
    p.add_argument("--reps", type=int, default=5, help="alternating measurement windows per collector")
    p.add_argument("--only", choices=["collect", "broadcast", "buffer"], default=None)
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
    if args.only in (None, "collect"):
        c = bench_collect(args.collectors, args.frames, args.frames_per_batch, args.reps)
        print(f"collect, {args.collectors} collectors, CartPole[16], {args.frames_per_batch} frames/batch, "
              f"{args.reps} alternating windows of {args.frames} frames (load {c['load_before']} -> "
              f"{c['load_after']}): local MultiSync {c['local_fps']:,.0f} frames/s, RayCollector "
              f"{c['ray_fps']:,.0f} frames/s (medians); ratio median {c['ratio']:.2f} "
              f"(windows: {', '.join(f'{r:.2f}' for r in c['ratios'])})")
        print(f"  per batch, ms (median of 20): local MultiSync {c['local_batch_ms']:.1f}; Ray round trip "
              f"{c['ray_round_trip_ms']:.1f} = actors busy {c['ray_busy_ms']:.1f} + Ray {c['ray_overhead_ms']:.1f}; "
              f"then unpack+stack {c['ray_unpack_ms']:.2f}")
    if args.only in (None, "broadcast"):
        b = bench_broadcast()
        print(f"weight broadcast, {b['params'] / 1e6:.2f}M params to 4 actors, ms median (p90) of 30 updates "
              f"(load {b['load_before']} -> {b['load_after']}): update_policy_weights_ (pack + put) "
              f"{b['update']:.1f} ({b['update_p90']:.1f}); each actor's fetch+copy, the slowest "
              f"{b['actor_apply']:.1f} ({b['actor_apply_p90']:.1f}); standalone round trip put + 4 calls "
              f"{b['round_trip']:.1f} ({b['round_trip_p90']:.1f}); floor: empty call to the 4 actors "
              f"{b['empty_call']:.1f} ({b['empty_call_p90']:.1f})")
    if args.only not in (None, "buffer"):
        return
    r = bench_buffer()
    print(f"RayReplayBuffer sample(256), ms median (mean): waiting {r['sample_wait']:.2f} ({r['sample_wait_mean']:.2f}), "
          f"prefetch=4 {r['sample_async']:.2f} ({r['sample_async_mean']:.2f}); ratio "
          f"{r['sample_wait'] / r['sample_async']:.1f}x")
    print(f"RayReplayBuffer extend(1000), ms median (mean incl. final flush): waiting {r['extend_wait']:.2f} "
          f"({r['extend_wait_mean_with_flush']:.2f}), in flight {r['extend_async']:.2f} "
          f"({r['extend_async_mean_with_flush']:.2f}); ratio {r['extend_wait'] / r['extend_async']:.1f}x")


if __name__ == "__main__":
    main()
