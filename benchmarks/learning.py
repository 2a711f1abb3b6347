"""Learning benchmark: steersman's recipes vs Stable-Baselines3 on the same tasks.

Tasks (rl-zoo's tuned settings on both sides, one thread, CPU):

  ppo-cartpole   PPO on CartPole-v1: 8 envs x 32 steps, batch 256, 20 epochs, GAE(0.98,
                 0.8), lr 1e-3 and clip 0.2 both linear to 0, no entropy bonus, [64, 64]
                 tanh MLPs; 100k frames; threshold: mean evaluation return >= 475.
  sac-pendulum   SAC on Pendulum-v1: lr 1e-3, [256, 256] MLPs, batch 256, 1 update per
                 frame, 100 random frames, tau 0.005, automatic temperature; 20k frames;
                 threshold: mean evaluation return >= -200.
  dqn-cartpole   DQN on CartPole-v1 (rl-zoo): lr 2.3e-3, [256, 256] MLP, batch 64, 128
                 updates per 256 frames, epsilon 1 -> 0.04 over 16%, 1,000 random frames;
                 50k frames; threshold 475.

Contestants, each seed in its own process (``--worker``):

  steersman      the recipe (``steersman.recipes.ppo`` / ``.sac``) with its native torch
                 env, from this checkout, in the project's venv;
  steersman-compile  the same with ``compile=True`` (the update step through
                 torch.compile; the compile time counts as training time); PPO only;
  steersman-seeds  N seeds in one process (``seeds=N``, recipes/multiseed.py: one vmapped
                 update for all; ``-compile``: compiled); frames/s summed over members,
                 one evaluation at the end (N: ``--pop-seeds``, default 32 PPO, 16 DQN/SAC);
  sb3            Stable-Baselines3 with Gymnasium's env, in the anchor venv;
  sb3-pair       two SB3 runs at once (one per core of a 2-core machine), frames/s summed.

Every ``--eval-every`` frames each contestant evaluates its deterministic policy on 10
episodes; the evaluation's time is left out of the training clock (setup is included:
building the model, the envs, the first calls). Reported per contestant (median over
seeds, and per seed in the JSON): frames and training seconds to first reach the
threshold, final evaluation return, training frames per second.

    python benchmarks/learning.py                      # both tasks, 3 seeds, both contestants
    python benchmarks/learning.py --tasks ppo-cartpole --seeds 1 --quick
    python benchmarks/learning.py --json results.json --plot curves.png
    python benchmarks/learning.py --tasks sac-pendulum --frames 8000   # a shorter SAC run
    python benchmarks/learning.py --tasks ppo-cartpole --seeds 1 --frames 30720 \
        --contestants sb3,sb3-pair,steersman-compile,steersman-seeds       # issue 17's side by side

Interpreters: steersman runs with this script's Python (``--steersman-python``), SB3 with
``--sb3-python`` (default: ``bin/python`` of the anchor venv, ``$STEERSMAN_ANCHORS_VENV`` or
``~/.cache/steersman/anchors-venv``; see ``setup_anchors.sh``). A contestant that cannot start is reported as n/a with the reason. On a shared machine the seconds drift between
runs; compare contestants of the same run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: the anchor venv made by setup_anchors.sh (SB3 lives there)
ANCHORS_VENV = Path(os.environ.get("STEERSMAN_ANCHORS_VENV", Path.home() / ".cache" / "steersman" / "anchors-venv"))

TASKS = {
    "ppo-cartpole": {"env": "CartPole-v1", "frames": 100_000, "eval_every": 2_560, "threshold": 475.0,
                     "quick_frames": 30_720},
    "sac-pendulum": {"env": "Pendulum-v1", "frames": 20_000, "eval_every": 2_000, "threshold": -200.0,
                     "quick_frames": 6_000},
    "dqn-cartpole": {"env": "CartPole-v1", "frames": 50_000, "eval_every": 5_000, "threshold": 475.0,
                     "quick_frames": 10_240},
}
#: members of the ``steersman-seeds`` contestant per task (``--pop-seeds`` overrides)
POP_SEEDS = {"ppo-cartpole": 32, "sac-pendulum": 16, "dqn-cartpole": 16}
EVAL_EPISODES = 10


# ---------------------------------------------------------------- workers (one process each)
def _config(task: str, seed: int, frames: int) -> tuple:
    sys.path.insert(0, str(REPO / "src"))
    from steersman.recipes import get_recipe

    algo = task.split("-")[0]
    recipe = get_recipe(algo)
    cfg = {"ppo": lambda: recipe.PPOConfig(), "sac": lambda: recipe.SACConfig(), "dqn": lambda: recipe.DQNConfig()}[algo]()
    cfg.total_frames, cfg.seed, cfg.quiet, cfg.export_format = frames, seed, True, "none"
    return recipe, cfg


def _steersman_seeds_worker(task: str, seed: int, frames: int, eval_every: int, n: int, compile: bool = False) -> dict:
    """``n`` seeds in this one process (``seeds=n``: recipes/multiseed.py); the run's own
    aggregate frames/s (its loop, the final evaluation of every member included)."""
    import torch

    torch.set_num_threads(1)
    recipe, cfg = _config(task, seed, frames)
    cfg.seeds, cfg.compile = n, compile
    cfg.logger.backends = ["csv"]
    cfg.logger.log_interval = 10**9
    cfg.eval.interval, cfg.eval.episodes = 0, EVAL_EPISODES  # one evaluation, at the end
    cfg.checkpoint.interval = 0
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        summary = recipe.train(cfg, Path(d) / "run")
    wall = time.perf_counter() - t0
    finals = list(summary["final_eval_return"].values())
    total = summary["frames_per_member"] * n
    return {"evals": [{"frames": summary["frames_per_member"], "train_seconds": wall,
                       "return": sum(finals) / len(finals)}],
            "frames": total, "train_seconds": total / summary["frames_per_s"], "members": n,
            "member_returns": finals, "call_seconds": wall}


def _steersman_worker(task: str, seed: int, frames: int, eval_every: int, compile: bool = False) -> dict:
    import torch

    torch.set_num_threads(1)
    recipe, cfg = _config(task, seed, frames)
    cfg.logger.backends = ["csv"]
    cfg.logger.log_interval = 10**9
    cfg.eval.interval, cfg.eval.episodes = eval_every, EVAL_EPISODES
    cfg.checkpoint.interval = 0
    if compile:
        cfg.compile = True
    evals, eval_time = [], [0.0]
    original = recipe.evaluate
    t0 = time.perf_counter()

    def timed_evaluate(env, policy, *args, **kwargs):  # the evaluation is off the training clock
        start = time.perf_counter()
        out = original(env, policy, *args, **kwargs)
        evals.append({"train_seconds": start - t0 - eval_time[0], "return": float(out.mean())})
        eval_time[0] += time.perf_counter() - start
        return out

    recipe.evaluate = timed_evaluate
    with tempfile.TemporaryDirectory() as d:
        summary = recipe.train(cfg, Path(d) / "run")
        metrics = Path(d) / "run" / "metrics.csv"
        from steersman.record import read_metrics_csv

        cols = read_metrics_csv(metrics)
    steps = [int(s) for s, r in zip(cols["step"], cols["eval/return"]) if not math.isnan(r)]
    if len(steps) != len(evals):
        raise RuntimeError(f"{len(evals)} evaluations but {len(steps)} evaluation rows in metrics.csv")
    for e, f in zip(evals, steps):
        e["frames"] = f
    train_seconds = evals[-1]["train_seconds"]
    return {"evals": evals, "frames": summary["frames"], "train_seconds": train_seconds}


def _sb3_worker(task: str, seed: int, frames: int, eval_every: int) -> dict:
    import torch

    torch.set_num_threads(1)
    from stable_baselines3 import DQN, PPO, SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    evals, eval_time = [], [0.0]
    t0 = time.perf_counter()
    eval_env = make_vec_env(TASKS[task]["env"], n_envs=1, seed=seed + 10_000)

    class Evaluator(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.next_eval = eval_every

        def _on_step(self) -> bool:
            if self.num_timesteps >= self.next_eval:
                self.next_eval += eval_every
                self._evaluate()
            return True

        def _evaluate(self) -> None:
            start = time.perf_counter()
            mean, _ = evaluate_policy(self.model, eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True)
            evals.append({"frames": int(self.num_timesteps), "train_seconds": start - t0 - eval_time[0],
                          "return": float(mean)})
            eval_time[0] += time.perf_counter() - start

    if task == "ppo-cartpole":
        env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
        model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                    ent_coef=0.0, learning_rate=lambda p: p * 1e-3, clip_range=lambda p: p * 0.2, seed=seed,
                    device="cpu", verbose=0)
    elif task == "dqn-cartpole":  # rl-zoo's CartPole-v1 DQN (steersman's DQNConfig defaults)
        env = make_vec_env("CartPole-v1", n_envs=1, seed=seed)
        model = DQN("MlpPolicy", env, learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1_000,
                    gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
                    exploration_fraction=0.16, exploration_final_eps=0.04, policy_kwargs={"net_arch": [256, 256]},
                    seed=seed, device="cpu", verbose=0)
    else:
        env = make_vec_env("Pendulum-v1", n_envs=1, seed=seed)
        model = SAC("MlpPolicy", env, learning_rate=1e-3, seed=seed, device="cpu", verbose=0)
    callback = Evaluator()
    model.learn(frames, callback=callback)
    if not evals or evals[-1]["frames"] < model.num_timesteps:
        callback._evaluate()
    return {"evals": evals, "frames": int(model.num_timesteps), "train_seconds": evals[-1]["train_seconds"]}


WORKERS = {
    "steersman": _steersman_worker,
    "steersman-compile": lambda *a: _steersman_worker(*a, compile=True),
    "sb3": _sb3_worker,
    # N seeds in one process (N from --pop-seeds / POP_SEEDS, passed as the worker's 6th argument)
    "steersman-seeds": lambda *a: _steersman_seeds_worker(*a[:4], int(a[4])),
    "steersman-seeds-compile": lambda *a: _steersman_seeds_worker(*a[:4], int(a[4]), compile=True),
}


# ---------------------------------------------------------------- the driver
def _summary(run: dict, threshold: float) -> dict:
    hit = next((e for e in run["evals"] if e["return"] >= threshold), None)
    return {
        "frames_to_threshold": hit["frames"] if hit else None,
        "seconds_to_threshold": round(hit["train_seconds"], 2) if hit else None,
        "final_return": run["evals"][-1]["return"],
        "frames_per_s": run["frames"] / run["train_seconds"],
        "steady_frames_per_s": _steady(run["evals"]),
        # the first evaluation's training clock: setup plus, with compile=true, the compile itself
        "first_eval_seconds": run["evals"][0]["train_seconds"],
    }


def _steady(evals: list) -> float | None:
    """Training frames/s between the first and the last evaluation: setup and compilation
    (before the first evaluation) left out; None with fewer than two evaluations."""
    if len(evals) < 2 or evals[-1]["train_seconds"] <= evals[0]["train_seconds"]:
        return None
    return (evals[-1]["frames"] - evals[0]["frames"]) / (evals[-1]["train_seconds"] - evals[0]["train_seconds"])


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _launch(python: str, contestant: str, task: str, seed: int, frames: int, eval_every: int,
            pop: int = 0) -> dict:
    if contestant == "sb3-pair":  # two SB3 runs at once (one per core), frames/s summed
        procs = [_start(python, "sb3", task, s, frames, eval_every, pop) for s in (seed, seed + 100)]
        runs = [_result(p) for p in procs]
        bad = [r for r in runs if "error" in r]
        if bad:
            return bad[0]
        return {"evals": runs[0]["evals"], "frames": sum(r["frames"] for r in runs),
                "train_seconds": max(r["train_seconds"] for r in runs), "members": 2,
                "per_run_frames_per_s": [r["frames"] / r["train_seconds"] for r in runs]}
    return _result(_start(python, contestant, task, seed, frames, eval_every, pop))


def _start(python: str, contestant: str, task: str, seed: int, frames: int, eval_every: int,
           pop: int) -> subprocess.Popen:
    cmd = [python, str(Path(__file__).resolve()), "--worker", contestant, task, str(seed), str(frames),
           str(eval_every), str(pop)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate()
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (err or out).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"exit {proc.returncode}: {tail[0]}"}
    return json.loads(lines[-1])


def _fmt(v: float | None, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, from {list(TASKS)}")
    p.add_argument("--contestants", default="steersman,sb3")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="shorter runs (a smoke test of the script)")
    p.add_argument("--frames", type=int, default=None, help="frames per run (overrides the task's and --quick)")
    p.add_argument("--steersman-python", default=sys.executable)
    p.add_argument("--sb3-python", default=str(ANCHORS_VENV / "bin" / "python"))
    p.add_argument("--json", default=None, help="write all results here")
    p.add_argument("--plot", default=None, help="write the learning curves here (PNG)")
    p.add_argument("--pop-seeds", type=int, default=None,
                   help=f"members of the steersman-seeds contestants (default per task: {POP_SEEDS})")
    p.add_argument("--worker", nargs=6, metavar=("CONTESTANT", "TASK", "SEED", "FRAMES", "EVAL_EVERY", "POP"),
                   help=argparse.SUPPRESS)
    ns = p.parse_args()
    if ns.worker:
        contestant, task, seed, frames, eval_every, pop = ns.worker
        args = (task, int(seed), int(frames), int(eval_every)) + ((int(pop),) if contestant.startswith(
            "steersman-seeds") else ())
        print(json.dumps(WORKERS[contestant](*args)))
        return

    pythons = {"steersman": ns.steersman_python, "steersman-compile": ns.steersman_python,
               "steersman-seeds": ns.steersman_python, "steersman-seeds-compile": ns.steersman_python,
               "sb3": ns.sb3_python, "sb3-pair": ns.sb3_python}
    results: dict = {"meta": {"seeds": ns.seeds, "quick": ns.quick, "eval_episodes": EVAL_EPISODES,
                              "python": sys.version.split()[0], "cpus": os.cpu_count()}, "tasks": {}}
    for task in ns.tasks.split(","):
        spec = TASKS[task]
        frames = ns.frames or (spec["quick_frames"] if ns.quick else spec["frames"])
        per: dict = {}
        for contestant in ns.contestants.split(","):
            runs = []
            for seed in range(ns.seeds):
                print(f"{task} {contestant} seed {seed} ...", file=sys.stderr, flush=True)
                runs.append(_launch(pythons[contestant], contestant, task, seed, frames,
                                    min(spec["eval_every"], frames), ns.pop_seeds or POP_SEEDS[task]))
            ok = [r for r in runs if "error" not in r]
            sums = [_summary(r, spec["threshold"]) for r in ok]
            per[contestant] = {
                "runs": runs,
                "errors": [r["error"] for r in runs if "error" in r],
                "median": {k: _median([s[k] for s in sums]) for k in
                           ("frames_to_threshold", "seconds_to_threshold", "final_return", "frames_per_s",
                            "steady_frames_per_s", "first_eval_seconds")},
                "reached": f"{sum(s['frames_to_threshold'] is not None for s in sums)}/{len(runs)}",
            }
        results["tasks"][task] = {"spec": {**spec, "frames": frames}, "contestants": per}
        _print_table(task, spec, per)
    if ns.json:
        Path(ns.json).write_text(json.dumps(results, indent=1))
    if ns.plot:
        _plot(results, ns.plot)


def _print_table(task: str, spec: dict, per: dict) -> None:
    print(f"\n### {task} (threshold {spec['threshold']:g}, median over seeds)\n")
    print("| contestant | reached | frames to threshold | train s to threshold | final return | frames/s "
          "| steady frames/s | first evaluation at s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in per.items():
        m = r["median"]
        if r["errors"] and len(r["errors"]) == len(r["runs"]):
            print(f"| {name} | n/a ({r['errors'][0]}) | | | | | | |")
            continue
        print(f"| {name} | {r['reached']} | {_fmt(m['frames_to_threshold'], ',.0f')} | "
              f"{_fmt(m['seconds_to_threshold'], '.1f')} | {_fmt(m['final_return'], '.1f')} | "
              f"{_fmt(m['frames_per_s'], ',.0f')} | {_fmt(m.get('steady_frames_per_s'), ',.0f')} | "
              f"{_fmt(m.get('first_eval_seconds'), '.1f')} |")
    base = per.get("sb3", {}).get("median", {})
    for name, r in per.items():
        mine = r.get("median", {})
        if name == "sb3" or not (base.get("frames_per_s") and mine.get("frames_per_s")):
            continue
        print(f"\n{name}/sb3: throughput x{mine['frames_per_s'] / base['frames_per_s']:.2f}", end="")
        if base.get("steady_frames_per_s") and mine.get("steady_frames_per_s"):
            print(f", steady x{mine['steady_frames_per_s'] / base['steady_frames_per_s']:.2f}", end="")
        if base.get("seconds_to_threshold") and mine.get("seconds_to_threshold"):
            print(f", time to threshold x{base['seconds_to_threshold'] / mine['seconds_to_threshold']:.2f} faster",
                  end="")
        members = [x.get("member_returns") for x in r["runs"] if x.get("member_returns")]
        if members:
            print(f", members >= threshold at the end: {sum(v >= spec['threshold'] for v in members[0])}/"
                  f"{len(members[0])}", end="")
    print()


def _plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    tasks = results["tasks"]
    fig, axes = plt.subplots(len(tasks), 2, figsize=(11, 3.8 * len(tasks)), squeeze=False)
    for row, (task, t) in enumerate(tasks.items()):
        for name, r in t["contestants"].items():
            runs = [x for x in r["runs"] if "error" not in x]
            if not runs:
                continue
            n = min(len(x["evals"]) for x in runs)
            f = np.array([[e["frames"] for e in x["evals"][:n]] for x in runs]).mean(0)
            s = np.array([[e["train_seconds"] for e in x["evals"][:n]] for x in runs]).mean(0)
            ret = np.array([[e["return"] for e in x["evals"][:n]] for x in runs])
            for ax, xs in ((axes[row, 0], f), (axes[row, 1], s)):
                ax.plot(xs, ret.mean(0), marker="o", ms=3, label=f"{name} ({len(runs)} seeds)")
                ax.fill_between(xs, ret.min(0), ret.max(0), alpha=0.2)
        for col, xlabel in enumerate(("frames", "training seconds (evaluation excluded)")):
            ax = axes[row, col]
            ax.axhline(t["spec"]["threshold"], color="grey", ls="--", lw=1)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("evaluation return")
            ax.set_title(task)
            ax.grid(alpha=0.3)
            ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
