"""Distributed collection and replay on Ray: throughput and per-message costs.

Measures, on one machine (a local Ray instance):

1. frames/s of ``RayCollector`` with N collector actors against the local
   ``MultiSyncDataCollector`` with N worker processes (same env, same policy, one run:
   the median of ``--reps`` alternating windows), and where a Ray batch's time goes;
2. the weight broadcast of a 1M-parameter policy to 4 actors (median and p90 of 30
   updates: the learner's ``update_policy_weights_``, each actor's fetch and copy, and the
   standalone round trip with the actors' wake-up);
   ``--only ratios [--batch-sizes 1024,2048,4096]``: that ratio in sync mode and in async
   mode (the default of both packages: RayCollector(sync=False) against the local
   ``MultiaSyncDataCollector``) per batch size, with the local collector's time per batch;
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
import contextlib
import os
import statistics
import sys
import time
from typing import Any

import torch
from torch import nn

PENDULUM = {"frames_per_batch": 256, "frames": 10_000, "collectors": 2}


def fps(collector, frames: int, update: bool = False) -> float:
    """Frames/s over ``frames`` frames after a warm-up batch; ``update``: publish the policy's
    weights after every batch (what an on-policy learner does)."""
    it = iter(collector)
    next(it)  # warm-up batch (actor/worker start-up excluded)
    t, n = time.perf_counter(), 0
    for batch in it:
        n += batch.numel()
        if update:
            collector.update_policy_weights_()
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


def batch_ms(collector, batches: int = 20) -> float:
    """Median ms per batch of ``collector`` over ``batches`` batches."""
    it, times = iter(collector), []
    for _ in range(batches):
        t = time.perf_counter()
        next(it)
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def _q(xs: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of ``xs``."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def _old_collect(actor, seq: int) -> tuple:
    """The actor's reply as it was before session 10 (run in the actor with ``__ray_call__``):
    an info dict and the batch packed as one NumPy array per tensor plus its structure."""
    from steersman.distributed._wire import pack
    from steersman.distributed.collector import TRAJ_KEY, _episode_returns

    t = time.perf_counter()
    batch = next(actor._it)
    if TRAJ_KEY in batch.keys(True, True):
        batch.set(TRAJ_KEY, batch.get(TRAJ_KEY) * actor.n + actor.index)
    returns, actor.carry = _episode_returns(batch, actor.carry)
    info = {"index": actor.index, "seq": seq, "frames": batch.numel(), "version": actor.version,
            "episode_returns": returns, "incarnation": actor.incarnation, "node": actor.node,
            "pid": os.getpid(), "weights_s": 0.0}
    out = pack(batch)
    info["busy_s"] = time.perf_counter() - t
    return info, out


def _replay_old(actor, seq: int) -> tuple:
    """The actor's last batch again (no collection), in the reply of before session 10."""
    from steersman.distributed._wire import pack

    if not hasattr(actor, "_bench_batch"):
        actor._bench_batch = next(actor._it)
    return {"index": actor.index, "seq": seq, "frames": actor._bench_batch.numel(), "version": actor.version,
            "episode_returns": [], "incarnation": actor.incarnation, "node": actor.node, "pid": os.getpid(),
            "weights_s": 0.0, "busy_s": 0.0}, pack(actor._bench_batch)


def _replay_new(actor, seq: int, known: int | None) -> tuple:
    """The actor's last batch again (no collection), in the reply of now."""
    if not hasattr(actor, "_bench_batch"):
        actor._bench_batch = next(actor._it)
    return {"index": actor.index, "seq": seq, "frames": actor._bench_batch.numel(), "version": actor.version,
            "episode_returns": [], "incarnation": actor.incarnation, "node": actor.node, "pid": os.getpid(),
            "weights_s": 0.0, "busy_s": 0.0}, actor._flat_reply(actor._bench_batch, known)


def bench_protocol(remote, reps: int = 100) -> dict[str, float]:
    """Ray's share alone: one sync step whose actors send their last batch again instead of
    collecting (so no env work, and less exposure to the machine's load), the protocol before
    session 10 (a reply of many arrays, a ``ray.get`` per actor, a TensorDict per actor and
    ``torch.stack``) and now (one buffer, one ``ray.get``, one new batch), alternating; ms
    median and p90 of ``reps`` each, from the requests to the stacked batch."""
    import ray

    from steersman.distributed._wire import unpack

    def old(k: int) -> None:
        replies = [ray.get(r) for r in [a.__ray_call__.remote(_replay_old, k) for a in remote._actors]]
        torch.stack([unpack(b) for _, b in replies], 0)

    def new(k: int) -> None:
        got = ray.get([a.__ray_call__.remote(_replay_new, k, remote._known_layout[i])
                       for i, a in enumerate(remote._actors)])
        remote._stacked([p for _, p in got])

    times: dict[str, list[float]] = {"old": [], "new": []}
    for k in range(reps + 6):
        for name, f in ((("old", old), ("new", new)) if k % 2 else (("new", new), ("old", old))):
            t = time.perf_counter()
            f(k)
            if k >= 6:
                times[name].append(time.perf_counter() - t)
    out = {}
    for m, xs in times.items():
        out[m], out[m + "_p90"] = 1e3 * statistics.median(xs), 1e3 * _q(xs, 0.9)
    return out


@contextlib.contextmanager
def local_and_ray(n: int, fpb: int, sync: bool = True, local_cls: Any = MultiSyncDataCollector) -> Any:
    """A local ``local_cls`` (``n`` worker processes) and a RayCollector (``n`` actors, ``sync``)
    on the same envs and greedy policy, ``fpb`` frames per batch: yields ``(local, remote,
    out)``, ``out`` holding the load average before; both shut down at the end, and ``out``
    gets the load average after."""
    out: dict[str, Any] = {"load_before": _load()}
    with contextlib.ExitStack() as stack:  # (the local workers shut down also if the actors fail to start)
        local = local_cls([make_env] * n, Greedy(), frames_per_batch=fpb, total_frames=-1)
        stack.callback(local.shutdown)
        remote = RayCollector(make_env, Greedy(), frames_per_batch=fpb, total_frames=-1, num_collectors=n,
                              sync=sync)
        stack.callback(remote.shutdown)
        yield local, remote, out
    out["load_after"] = _load()


def bench_collect(n: int, frames: int, fpb: int, reps: int = 5) -> dict[str, Any]:
    """Frames/s of the local MultiSyncDataCollector and of RayCollector (n workers / actors,
    sync), both built once and measured in alternating windows of ``frames`` frames
    (``reps`` each, after a warm-up batch): the median of the per-window ratios, for
    RayCollector as it runs (requests sent ahead while the policy is not updated), with
    ``pipelining=False`` (each request sent when the previous batch was yielded), and both
    collectors with the weights published after every batch (the on-policy case: no
    request can be sent ahead). Then where one sync step's time goes, the protocol before
    session 10 (one reply of many arrays per actor, a ``ray.get`` per actor, a TensorDict
    per actor and ``torch.stack``) and now (one buffer per actor, one ``ray.get``, copied
    into one new batch) alternating: the driver's round trip against the actors' own time in
    the call (``busy_s``), and the driver's unpacking."""
    import ray

    from steersman.distributed._wire import unpack

    with local_and_ray(n, fpb) as (local, remote, out):
        runs: dict[str, list[float]] = {"local": [], "ray": [], "ray_no_pipelining": [], "local_update": [],
                                        "ray_update": []}
        for _ in range(reps):
            runs["local"].append(fps(local, frames))
            remote.pipelining, remote._quiet_needed = True, 1  # the update windows below raised it
            runs["ray"].append(fps(remote, frames))
            remote.pipelining = False
            runs["ray_no_pipelining"].append(fps(remote, frames))
            remote.pipelining = True
            runs["local_update"].append(fps(local, frames, update=True))
            runs["ray_update"].append(fps(remote, frames, update=True))
        for name, xs in runs.items():
            out[name + "_fps"] = statistics.median(xs)
        for name, base in (("ray", "local"), ("ray_no_pipelining", "local"), ("ray_update", "local_update")):
            out[name + "_ratios"] = [r / b for r, b in zip(runs[name], runs[base])]
            out[name + "_ratio"] = statistics.median(out[name + "_ratios"])
        out["dropped"] = remote.dropped_batches
        # the actors' idle time between two batches (waiting for the next request): sent ahead or not
        for pipelining in (True, False, True, False):
            remote.pipelining, remote._quiet_needed = pipelining, 1
            it, idle = iter(remote), []
            for k in range(22):
                next(it)
                if k >= 2:
                    idle.extend(info["idle_s"] for info in remote._last_info.values())
            out.setdefault(f"idle_{pipelining}", []).extend(idle)
        for pipelining in (True, False):
            out[f"idle_{pipelining}"] = 1e3 * statistics.median(out[f"idle_{pipelining}"])
        remote.pipelining = True
        # one sync step by hand, before / now alternating (no request in flight at the start)
        remote._drop_outdated(keep_current=False)
        steps: dict[str, dict[str, list[float]]] = {m: {"wall": [], "busy": [], "unpack": []} for m in ("old", "new")}
        seq = 10**6
        for _ in range(20):
            t = time.perf_counter()
            refs = [a.__ray_call__.remote(_old_collect, seq) for a in remote._actors]
            replies = [ray.get(r) for r in refs]
            t1 = time.perf_counter()
            torch.stack([unpack(b) for _, b in replies], 0)
            steps["old"]["unpack"].append(time.perf_counter() - t1)
            steps["old"]["wall"].append(t1 - t)
            steps["old"]["busy"].append(max(info["busy_s"] for info, _ in replies))
            seq += 1
            t = time.perf_counter()
            want = {i: remote._submit(i) for i in range(n)}
            got = remote._gather_replies(want)
            t1 = time.perf_counter()
            remote._stacked([got[i][1] for i in range(n)])
            steps["new"]["unpack"].append(time.perf_counter() - t1)
            steps["new"]["wall"].append(t1 - t)
            steps["new"]["busy"].append(max(info["busy_s"] for info, _ in got.values()))
        for m, d in steps.items():
            out[f"{m}_round_trip_ms"] = 1e3 * statistics.median(d["wall"])
            out[f"{m}_busy_ms"] = 1e3 * statistics.median(d["busy"])
            out[f"{m}_overhead_ms"] = 1e3 * statistics.median([w - b for w, b in zip(d["wall"], d["busy"])])
            out[f"{m}_unpack_ms"] = 1e3 * statistics.median(d["unpack"])
        out["protocol"] = bench_protocol(remote)
        out["local_batch_ms"] = batch_ms(local)
    return out


def bench_ratio(n: int, frames: int, fpb: int, sync: bool, reps: int = 5) -> dict[str, Any]:
    """RayCollector / local frames/s in one mode (``sync``: against ``MultiSyncDataCollector``;
    async, the default mode of both packages: against ``MultiaSyncDataCollector``, each
    actor / worker delivering whole batches of ``fpb`` frames), alternating windows of
    ``frames`` frames, as :func:`bench_collect`; no weight updates. Also the local
    collector's time per batch (the work Ray's ~1 ms of CPU per message is spread over)."""
    from steersman.collectors import MultiaSyncDataCollector

    local_cls = MultiSyncDataCollector if sync else MultiaSyncDataCollector
    with local_and_ray(n, fpb, sync, local_cls) as (local, remote, out):
        ratios, fps_local, fps_ray = [], [], []
        for _ in range(reps):
            fps_local.append(fps(local, frames))
            fps_ray.append(fps(remote, frames))
            ratios.append(fps_ray[-1] / fps_local[-1])
        out.update(ratio=statistics.median(ratios), ratios=ratios, local_fps=statistics.median(fps_local),
                   ray_fps=statistics.median(fps_ray))
        out["local_batch_ms"] = batch_ms(local)
    return out


def _old_apply(actor, weights: list) -> float:
    """An actor taking a flat weight buffer as before session 10 (run in the actor with
    ``__ray_call__``): views of the buffer in a ``state_dict``, loaded through the
    collector's ``update_policy_weights_``; returns the seconds spent."""
    import ray

    from steersman.distributed.collector import _unpack

    t = time.perf_counter()
    actor.collector.update_policy_weights_(_unpack(ray.get(weights[1])))
    actor.version = weights[0]
    return time.perf_counter() - t


def bench_broadcast(n_actors: int = 4, reps: int = 30) -> dict[str, float]:
    """A ~1M-parameter policy's weights to 4 actors, per update (median and p90 of
    ``reps``): what the learner waits for in ``update_policy_weights_`` (packing into the
    flat buffer and one ``ray.put``); what each actor spends taking them (fetch from the
    object store and copy into its policy: paid inside its next ``collect`` request, which
    carries the reference); and the standalone round trip (put, then one call to each actor
    that loads them, waiting for all), with its floor (an empty call to the 4 actors: waking
    them). The actors' loading as it was before session 10 (``old``: through the collector's
    ``update_policy_weights_``) and now (``new``: one byte copy per tensor into the policy),
    alternating update by update."""
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
        runs = {m: {"update": [], "actor_apply": [], "round_trip": []} for m in ("old", "new")}
        empty = []
        for k in range(2 * reps + 6):  # the first 6 warm up
            mode = "new" if k % 2 == 0 else "old"
            with torch.no_grad():
                policy.net[0].bias.fill_(k)
            t = time.perf_counter()
            version = collector.update_policy_weights_()
            t1 = time.perf_counter()
            w = [version, collector._weights_ref]
            calls = [a._apply_weights.remote(w) if mode == "new" else a.__ray_call__.remote(_old_apply, w)
                     for a in collector._actors]
            spent = ray.get(calls)
            t2 = time.perf_counter()
            ray.get([a.ping.remote() for a in collector._actors])
            t3 = time.perf_counter()
            if k >= 6:
                runs[mode]["update"].append(t1 - t)
                runs[mode]["actor_apply"].append(max(spent))
                runs[mode]["round_trip"].append(t2 - t)
                empty.append(t3 - t2)
        for mode, r in runs.items():
            for name, xs in r.items():
                out[f"{mode}_{name}"] = 1e3 * statistics.median(xs)
                out[f"{mode}_{name}_p90"] = 1e3 * _q(xs, 0.9)
        out["empty_call"], out["empty_call_p90"] = 1e3 * statistics.median(empty), 1e3 * _q(empty, 0.9)
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
    p.add_argument("--only", choices=["collect", "broadcast", "buffer", "ratios"], default=None)
    p.add_argument("--batch-sizes", default="1024,2048,4096",
                   help="--only ratios: frames per batch of the sync and async ratio rows")
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
              f"{c['load_after']}), frames/s (medians): local MultiSync {c['local_fps']:,.0f}, RayCollector "
              f"{c['ray_fps']:,.0f}, RayCollector pipelining=False {c['ray_no_pipelining_fps']:,.0f}; weights "
              f"published after every batch: local {c['local_update_fps']:,.0f}, RayCollector "
              f"{c['ray_update_fps']:,.0f}")
        for name, label in (("ray", "RayCollector / local"), ("ray_no_pipelining", "pipelining=False / local"),
                            ("ray_update", "with an update per batch, RayCollector / local")):
            print(f"  {label}: median {c[name + '_ratio']:.2f} "
                  f"(windows: {', '.join(f'{r:.2f}' for r in c[name + '_ratios'])})")
        print(f"  batches sent ahead and dropped (an update made them stale): {c['dropped']}")
        print(f"  an actor's idle time between two batches, ms (median of 2 x 20 batches x {args.collectors} actors): "
              f"requests sent ahead {c['idle_True']:.2f}, pipelining=False {c['idle_False']:.2f}")
        print(f"  per batch, ms (median of 20): local MultiSync {c['local_batch_ms']:.1f}")
        for m, label in (("old", "before session 10"), ("new", "now")):
            print(f"  one sync step by hand, {label}: round trip {c[m + '_round_trip_ms']:.2f} = actors busy "
                  f"{c[m + '_busy_ms']:.2f} + Ray {c[m + '_overhead_ms']:.2f}; then unpack+stack "
                  f"{c[m + '_unpack_ms']:.2f}")
        pr = c["protocol"]
        print(f"  Ray's share alone (the actors send their last batch again: no env work), ms median (p90) of 100 "
              f"alternating steps, requests to stacked batch: before session 10 {pr['old']:.2f} ({pr['old_p90']:.2f}), "
              f"now {pr['new']:.2f} ({pr['new_p90']:.2f})")
    if args.only == "ratios":
        for fpb in [int(x) for x in args.batch_sizes.split(",")]:
            for sync in (True, False):
                r = bench_ratio(args.collectors, args.frames, fpb, sync, args.reps)
                local = "MultiSync" if sync else "MultiaSync"
                print(f"{'sync ' if sync else 'async'} {fpb:5d} frames/batch: RayCollector / local {local} median "
                      f"{r['ratio']:.2f} (windows: {', '.join(f'{x:.2f}' for x in r['ratios'])}; "
                      f"{r['ray_fps']:,.0f} vs {r['local_fps']:,.0f} frames/s; local batch {r['local_batch_ms']:.1f} ms; "
                      f"load {r['load_before']} -> {r['load_after']})", flush=True)
        return
    if args.only in (None, "broadcast"):
        b = bench_broadcast()
        print(f"weight broadcast, {b['params'] / 1e6:.2f}M params to 4 actors, ms median (p90) of 30 updates each, "
              f"the actors' loading before session 10 and now alternating (load {b['load_before']} -> "
              f"{b['load_after']}); floor: empty call to the 4 actors {b['empty_call']:.1f} ({b['empty_call_p90']:.1f})")
        for m, label in (("old", "before"), ("new", "now")):
            print(f"  {label}: update_policy_weights_ (pack + put) {b[m + '_update']:.1f} ({b[m + '_update_p90']:.1f}); "
                  f"each actor's fetch+copy, the slowest {b[m + '_actor_apply']:.1f} ({b[m + '_actor_apply_p90']:.1f}); "
                  f"standalone round trip put + 4 calls {b[m + '_round_trip']:.1f} ({b[m + '_round_trip_p90']:.1f})")
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
