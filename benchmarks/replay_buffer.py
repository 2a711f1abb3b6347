"""Replay-buffer speed: steersman vs a plain preallocated-tensor floor vs TorchRL.

Each row times one call on a buffer of 1M capacity (filled to capacity first), with
transitions of five leaves: ``observation [4]``, ``action [1]``, ``("next",
"observation") [4]``, ``("next", "reward") [1]``, ``("next", "done") [1]`` (bool).

Rows: ``extend`` of 1000 transitions and ``sample(256)`` for a uniform buffer
(``ReplayBuffer(storage=LazyTensorStorage(1M))``) and a prioritized one
(``PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(1M))``), and
``update_priority`` of 256 indices. The floor is what one would write by hand: a dict of
preallocated tensors, ``copy_`` into slices to extend, ``randint`` + indexing to sample
(uniform rows only). TorchRL runs when importable (the anchor venv, ``benchmarks/setup_anchors.sh``); its prioritized
buffer needs its C++ extension, which fails to load against this torch build (then ``n/a``).

Timing: calls are repeated so one measurement takes ~20 ms, 7 measurements per column,
columns interleaved, median µs per call, gc off, torch on 1 thread. ``--clock cpu`` (the
default) times the thread's CPU time, which on a shared, busy machine is close to the wall
time the same code takes on an idle one; ``--clock wall`` times elapsed time.

The ``torchrl est.`` column, for rows TorchRL cannot run here, scales the reference
numbers below by how much slower TorchRL's *uniform* calls ran in this run than in the
reference run (a load correction): ``est = ref_prioritized * torchrl_uniform_now /
torchrl_uniform_ref`` (extend and update_priority scale with extend, sample with sample).

    python benchmarks/replay_buffer.py [--quick] [--json out.json]
    $ANCHORS/bin/python benchmarks/replay_buffer.py   # with the TorchRL column
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

CAP = 1_000_000
N_EXT = 1000
N_SAMPLE = 256
ALPHA, BETA = 0.7, 0.5

# TorchRL per-call times measured on this machine when its prioritized extension loaded
# (from the issue): extend/sample/update_priority in µs.
TORCHRL_REFERENCE = {"uniform extend 1000": 314.0, "uniform sample 256": 219.0,
                     "prioritized extend 1000": 476.0, "prioritized sample 256": 448.0,
                     "prioritized update_priority 256": 112.0}


def make_batch(td_cls, n: int = N_EXT):
    return td_cls({
        "observation": torch.randn(n, 4),
        "action": torch.randn(n, 1),
        "next": {"observation": torch.randn(n, 4), "reward": torch.randn(n, 1),
                 "done": torch.zeros(n, 1, dtype=torch.bool)},
    }, batch_size=[n])


# ------------------------------------------------------------------ floor
class Floor:
    def __init__(self) -> None:
        self.buf = {"observation": torch.zeros(CAP, 4), "action": torch.zeros(CAP, 1),
                    "next_observation": torch.zeros(CAP, 4), "next_reward": torch.zeros(CAP, 1),
                    "next_done": torch.zeros(CAP, 1, dtype=torch.bool)}
        self.cursor = 0
        self.len = 0

    def extend(self, batch: dict) -> None:
        c = self.cursor
        n = N_EXT
        if c + n > CAP:
            c = 0
        for k, v in self.buf.items():
            v[c : c + n].copy_(batch[k])
        self.cursor = c + n
        self.len = min(CAP, self.len + n)

    def sample(self) -> dict:
        idx = torch.randint(self.len, (N_SAMPLE,))
        return {k: v[idx] for k, v in self.buf.items()}


def floor_batch() -> dict:
    return {"observation": torch.randn(N_EXT, 4), "action": torch.randn(N_EXT, 1),
            "next_observation": torch.randn(N_EXT, 4), "next_reward": torch.randn(N_EXT, 1),
            "next_done": torch.zeros(N_EXT, 1, dtype=torch.bool)}


# ------------------------------------------------------------------ builders
def build_steersman() -> dict:
    from steersman.data.replay_buffers import (
        LazyTensorStorage,
        PrioritizedReplayBuffer,
        ReplayBuffer,
    )
    from steersman.tensordict import TensorDict

    batch = make_batch(TensorDict)
    rb = ReplayBuffer(storage=LazyTensorStorage(CAP))
    prb = PrioritizedReplayBuffer(alpha=ALPHA, beta=BETA, storage=LazyTensorStorage(CAP))
    for _ in range(CAP // N_EXT):
        rb.extend(batch)
        prb.extend(batch)
    idx = torch.randint(CAP, (N_SAMPLE,))
    prio = torch.rand(N_SAMPLE)
    return {
        "uniform extend 1000": lambda: rb.extend(batch),
        "uniform sample 256": lambda: rb.sample(N_SAMPLE),
        "prioritized extend 1000": lambda: prb.extend(batch),
        "prioritized sample 256": lambda: prb.sample(N_SAMPLE),
        "prioritized update_priority 256": lambda: prb.update_priority(idx, prio),
    }


def build_floor() -> dict:
    f = Floor()
    batch = floor_batch()
    for _ in range(CAP // N_EXT):
        f.extend(batch)
    return {"uniform extend 1000": lambda: f.extend(batch), "uniform sample 256": f.sample}


def build_torchrl() -> tuple[dict, dict]:
    out: dict = {}
    errors: dict = {}
    try:
        import logging

        logging.getLogger("torchrl").setLevel(logging.ERROR)
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, PrioritizedReplayBuffer, ReplayBuffer
    except Exception as err:  # noqa: BLE001
        return {}, {"torchrl": f"not importable: {type(err).__name__}: {err}"}
    batch = make_batch(TensorDict)
    rb = ReplayBuffer(storage=LazyTensorStorage(CAP))
    for _ in range(CAP // N_EXT):
        rb.extend(batch)
    out["uniform extend 1000"] = lambda: rb.extend(batch)
    out["uniform sample 256"] = lambda: rb.sample(N_SAMPLE)
    try:
        prb = PrioritizedReplayBuffer(alpha=ALPHA, beta=BETA, storage=LazyTensorStorage(CAP))
        for _ in range(CAP // N_EXT):
            prb.extend(batch)
        idx = torch.randint(CAP, (N_SAMPLE,))
        prio = torch.rand(N_SAMPLE)
        out["prioritized extend 1000"] = lambda: prb.extend(batch)
        out["prioritized sample 256"] = lambda: prb.sample(N_SAMPLE)
        out["prioritized update_priority 256"] = lambda: prb.update_priority(idx, prio)
    except Exception as err:  # noqa: BLE001
        errors["torchrl prioritized"] = f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
    return out, errors


# ------------------------------------------------------------------ timing
def calibrate(fn, target_s: float) -> int:
    n = 1
    while True:
        t = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t
        if dt > target_s / 4 or n > 1 << 20:
            return max(1, int(n * target_s / max(dt, 1e-9)))
        n *= 2


def measure(columns: dict, rows: list, target_s: float, repeats: int, clock: str = "cpu") -> dict:
    now = time.thread_time_ns if clock == "cpu" else time.perf_counter_ns
    counts = {(c, r): calibrate(fns[r], target_s) for c, fns in columns.items() for r in rows if r in fns}
    times: dict = {k: [] for k in counts}
    gc.disable()
    try:
        for _ in range(repeats):
            for r in rows:
                for c, fns in columns.items():
                    if r not in fns:
                        continue
                    n = counts[(c, r)]
                    fn = fns[r]
                    t = now()
                    for _ in range(n):
                        fn()
                    times[(c, r)].append((now() - t) / n / 1e3)
    finally:
        gc.enable()
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short smoke run")
    ap.add_argument("--json", help="also write the results as JSON")
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu", help="thread CPU time (default) or wall time")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    target, repeats = (0.002, 3) if args.quick else (0.02, 7)

    columns: dict = {}
    notes: dict = {}
    columns["steersman"] = build_steersman()
    columns["floor"] = build_floor()
    trl, errs = build_torchrl()
    notes.update(errs)
    if trl:
        columns["torchrl"] = trl
    rows = list(TORCHRL_REFERENCE)
    res = measure(columns, rows, target, repeats, args.clock)

    def cell(c: str, r: str) -> str:
        v = res.get((c, r))
        return "n/a" if v is None else f"{v:8.1f}"

    def est(r: str) -> float | None:
        """TorchRL's time for row r: measured, or the reference scaled by today's load."""
        if ("torchrl", r) in res:
            return res[("torchrl", r)]
        base = "uniform sample 256" if "sample" in r else "uniform extend 1000"
        if ("torchrl", base) not in res:
            return None
        return TORCHRL_REFERENCE[r] * res[("torchrl", base)] / TORCHRL_REFERENCE[base]

    head = (f"| {'call':32s} | steersman µs | floor µs | torchrl µs | torchrl est. µs | torchrl ref µs | "
            "st/floor | torchrl/st |")
    print(f"clock: {args.clock}, torch {torch.__version__}, 1 thread")
    print(head)
    print("|" + "|".join("-" * (len(p)) for p in head.split("|")[1:-1]) + "|")
    out_rows = []
    for r in rows:
        st = res.get(("steersman", r))
        fl = res.get(("floor", r))
        tr = res.get(("torchrl", r))
        e = est(r)
        ref = TORCHRL_REFERENCE[r]
        ratios = [f"{st / fl:5.2f}x" if fl else "n/a", f"{e / st:5.2f}x" if e else "n/a"]
        est_txt = "n/a" if e is None or tr is not None else f"{e:8.1f}"
        print(f"| {r:32s} | {cell('steersman', r):>12s} | {cell('floor', r):>8s} | {cell('torchrl', r):>10s} | "
              f"{est_txt:>15s} | {ref:14.0f} | {ratios[0]:>8s} | {ratios[1]:>10s} |")
        out_rows.append({"call": r, "steersman_us": st, "floor_us": fl, "torchrl_us": tr, "torchrl_est_us": e,
                         "torchrl_ref_us": ref})
    for k, v in notes.items():
        print(f"note: {k}: {v}")
    print("targets: uniform st/floor <= 2x; torchrl/st >= 3x on every row (measured, or estimated when n/a)")
    if args.json:
        Path(args.json).write_text(json.dumps({"torch": torch.__version__, "rows": out_rows, "notes": notes}, indent=1))


if __name__ == "__main__":
    main()
