"""Time of one planning step (one action) of CEMPlanner and MPPIPlanner on Pendulum.

Settings (TorchRL's planner arguments): ``planning_horizon`` 15, ``num_candidates`` 256,
``optim_steps`` 3, ``top_k`` 16 (CEM) / 32 (MPPI, temperature 1, the return-to-go as
advantage), for an env batch of 1 (``[]``) and of 16 states planned at once. The model is
the native ``PendulumEnv``: the candidates are a trailing batch dim of its state and each
horizon step is one batched call of its pure step function.

Column ``trl``: TorchRL's ``CEMPlanner``/``MPPIPlanner`` with TorchRL's stateless
``PendulumEnv`` as model, at the same settings, run by the anchor venv's Python
(``$STEERSMAN_ANCHORS_VENV`` or ``~/.cache/steersman/anchors-venv``, see
``setup_anchors.sh``) when it exists and has torchrl; otherwise ``n/a``.

Timing: torch on 1 thread, process CPU time, median over rounds of ~``--time`` s each,
in ms per planning step.

    python benchmarks/planners.py [--time 0.5] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from steersman.envs import PendulumEnv  # noqa: E402
from steersman.planning import CEMPlanner, MPPIPlanner  # noqa: E402

H, C, STEPS, TOPK_CEM, TOPK_MPPI = 15, 256, 3, 16, 32
ANCHORS_VENV = Path(os.environ.get("STEERSMAN_ANCHORS_VENV", Path.home() / ".cache" / "steersman" / "anchors-venv"))

TRL_SCRIPT = r"""
import sys, time, statistics, torch
from torchrl.envs import PendulumEnv
from torchrl.modules.planners import CEMPlanner, MPPIPlanner
torch.set_num_threads(1)
H, C, STEPS, KC, KM, batch, budget, rounds = sys.argv[1:9]
H, C, STEPS, KC, KM, batch, rounds = map(int, (H, C, STEPS, KC, KM, batch, rounds))
budget = float(budget)
env = PendulumEnv(seed=0)  # stateless, batch-unlocked: the batch comes from the reset TensorDict
def rtg(td):
    r = td["next", "reward"]
    td["advantage"] = r.flip(-2).cumsum(-2).flip(-2)
    return td
class Adv(torch.nn.Module):
    def forward(self, td):
        return rtg(td)
for name, planner in (("cem", CEMPlanner(env, H, STEPS, C, KC)),
                      ("mppi", MPPIPlanner(env, Adv(), 1.0, H, STEPS, C, KM))):
    td = env.reset(env.gen_params(batch_size=[batch]) if batch > 1 else None)
    planner(td.clone())
    res = []
    for _ in range(rounds):
        n, t0 = 0, time.process_time()
        while time.process_time() - t0 < budget:
            planner(td.clone()); n += 1
        res.append((time.process_time() - t0) / n * 1e3)
    print(name, statistics.median(res))
"""


def measure(fn, budget: float, rounds: int) -> float:
    fn()
    res = []
    for _ in range(rounds):
        n, t0 = 0, time.process_time()
        while time.process_time() - t0 < budget:
            fn()
            n += 1
        res.append((time.process_time() - t0) / n * 1e3)
    return statistics.median(res)


def return_to_go(td):
    r = td["next", "reward"]
    td["advantage"] = r.flip(-2).cumsum(-2).flip(-2)
    return td


def torchrl_times(batch: int, budget: float, rounds: int) -> dict[str, str]:
    py = ANCHORS_VENV / "bin" / "python"
    if not py.exists():
        return {"cem": "n/a (no anchor venv)", "mppi": "n/a (no anchor venv)"}
    args = [str(py), "-c", TRL_SCRIPT, *map(str, (H, C, STEPS, TOPK_CEM, TOPK_MPPI, batch, budget, rounds))]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["failed"])[-1][:60]
        return {"cem": f"n/a ({why})", "mppi": f"n/a ({why})"}
    out = dict(line.split() for line in proc.stdout.strip().splitlines())
    return {k: f"{float(v):.2f}" for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time", type=float, default=0.5, help="seconds per round")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    print(f"Pendulum, horizon {H}, {C} candidates, {STEPS} optim steps; ms per planning step (median)")
    print(f"{'planner':8} {'batch':>5} {'steersman':>10} {'warm':>8} {'trl':>10}")
    for batch in (1, 16):
        env = PendulumEnv(batch_size=[batch] if batch > 1 else [], seed=0)
        td = env.reset()
        trl = torchrl_times(batch, a.time, a.rounds)
        for name in ("cem", "mppi"):
            times = []
            for warm in (False, True):
                if name == "cem":
                    planner = CEMPlanner(env, H, STEPS, C, TOPK_CEM, warm_start=warm)
                else:
                    planner = MPPIPlanner(env, return_to_go, 1.0, H, STEPS, C, TOPK_MPPI, warm_start=warm)
                times.append(measure(lambda p=planner, x=td: p(x), a.time, a.rounds))
            print(f"{name:8} {batch:>5} {times[0]:>10.2f} {times[1]:>8.2f} {trl[name]:>10}")


if __name__ == "__main__":
    main()
