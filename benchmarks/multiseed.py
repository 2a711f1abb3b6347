"""Many PPO seeds in one process vs one seed: aggregate training frames/s (CPU, one thread).

PPO on native CartPole with the recipe's defaults (8 envs x 32 steps per batch, 20 epochs
of one 256-sample minibatch, two [64, 64] tanh MLPs). Contestants, each in its own process:

  recipe       ``steersman.recipes.ppo.train``: one seed, the single-seed recipe (eager);
  seeds=N      ``steersman.recipes.multiseed.train_ppo`` with N seeds: one vmapped update
               for all members (``--compile``: the update compiled, inductor).

Each process first trains one batch (warm-up: imports, first vmap/compile), then times
``--batches`` batches per member with no evaluation, checkpoint, export or plot in the loop
(the final evaluation and the end of the run are outside the timed span).
Reported: frames/s summed over members, and the ratio to the recipe's single seed.

    python benchmarks/multiseed.py                      # N = 1, 8, 32
    python benchmarks/multiseed.py --seeds 8,32 --batches 4 --compile
    python benchmarks/multiseed.py --json out.json

On a shared machine the times drift; compare the rows of one run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, sys, tempfile, time
from dataclasses import dataclass, field
import torch
torch.set_num_threads(1)
from steersman.recipes import multiseed, ppo
from steersman.recipes.config import CheckpointConfig, EvalConfig, LoggerConfig

mode, n, batches, compile_ = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"

@dataclass
class Cfg(ppo.PPOConfig):
    seeds: int = 1
    sweep: dict = field(default_factory=dict)

def cfg(frames):
    return Cfg(seeds=n, total_frames=frames, quiet=True, logger=LoggerConfig(backends=["csv"]),
               export_format="none", eval=EvalConfig(interval=0, episodes=1),
               checkpoint=CheckpointConfig(interval=0), compile=compile_)

train = ppo.train if mode == "recipe" else multiseed.train_ppo
root = tempfile.mkdtemp()
train(cfg(256), root + "/warm")  # imports, first vmap / compile
# the run's own frames/s covers its training loop; time the whole call too
t = time.perf_counter()
summary = train(cfg(256 * batches), root + "/timed")
wall = time.perf_counter() - t
members = 1 if mode == "recipe" else n
print(json.dumps({"mode": mode, "n": members, "frames": 256 * batches * members, "call_s": wall,
                  "loop_fps": summary["frames_per_s"]}))
"""


def run(mode: str, n: int, batches: int, compile_: bool) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(n), str(batches), "1" if compile_ else "0"],
                         capture_output=True, text=True, check=True, cwd=tempfile.gettempdir())
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1,8,32", help="comma-separated N")
    ap.add_argument("--batches", type=int, default=4, help="timed batches of 256 frames per member")
    ap.add_argument("--compile", action="store_true", help="also the compiled update (inductor)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    rows = [run("recipe", 1, args.batches, False)]
    for n in (int(v) for v in args.seeds.split(",")):
        rows.append(run("seeds", n, args.batches, False))
        if args.compile:
            rows.append(run("seeds", n, args.batches, True) | {"mode": "seeds+compile"})
    base = rows[0]["loop_fps"]
    print(f"{'contestant':<16}{'members':>8}{'frames/s (all)':>16}{'x recipe':>10}{'call s':>9}")
    for r in rows:
        print(f"{r['mode']:<16}{r['n']:>8}{r['loop_fps']:>16.0f}{r['loop_fps'] / base:>10.2f}{r['call_s']:>9.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "time": time.strftime("%Y-%m-%d %H:%M:%S")}, f, indent=1)


if __name__ == "__main__":
    main()
