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

``--learn`` trains to the end instead (issue 17's "32 seeds in one process: all reach
>= 475"): ``--seeds`` N members with the recipe's defaults, rl-zoo's tuned CartPole PPO
(lr 1e-3 and clip 0.2 both linear to 0, no entropy bonus; ``--lr``/``--ent-coef``
override; the 4-seed test's faster lr 2e-3 with entropy 0.01 collapses about one seed in
32) for ``--frames`` frames each (default rl-zoo's budget, 100,000), one greedy evaluation (10 episodes) per member at the end;
reported: every member's final return and the aggregate frames/s (wall clock, and per
CPU-second of the process: steadier on a loaded machine), against Stable-Baselines3
with the same settings in the same invocation, one run (``sb3``) and two at once
(``sb3-pair``, one per core), each SB3 process on one thread, in the anchor venv:

    nice -n 10 python benchmarks/multiseed.py --learn --seeds 32 --frames 16384 --lr 2e-3 --ent-coef 0.01
    nice -n 10 python benchmarks/multiseed.py --learn --compile --warm-cache --seeds 32 --sb3-repeats 3
    nice -n 10 python benchmarks/multiseed.py --learn --compile --warm-cache --seeds 32 --sb3-repeats 0 --first-seed 32

(``--compile``: the population with ``compile=true``, its compile time included;
``--warm-cache``: a short untimed run first fills inductor's on-disk cache, so the timed
run's compile is tracing and loading, not code generation; ``--sb3-repeats 3``: SB3 alone
three times, the median run reported.)
``--algo dqn`` / ``--algo sac``: the same comparison for DQN on CartPole and SAC on
Pendulum, both sides with the recipes' defaults (rl-zoo's settings, as in
``benchmarks/learning.py``):

    nice -n 10 python benchmarks/multiseed.py --learn --compile --warm-cache --algo dqn --seeds 16 --frames 10240
    nice -n 10 python benchmarks/multiseed.py --learn --compile --warm-cache --algo sac --seeds 16 --frames 1000

``--update-ms`` times the vmapped PPO update alone, eager against compiled (inductor),
alternated in one process (median CPU ms per update for each ``--seeds`` N):

    python benchmarks/multiseed.py --update-ms --seeds 4,32
    python benchmarks/multiseed.py --update-ms --seeds 32 --contestants compiled-py,compiled
    python benchmarks/multiseed.py --update-ms --seeds 4,32 --contestants compiled-tanh,compiled

On a shared machine the times drift; compare the rows of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ANCHORS_VENV = Path(os.environ.get("STEERSMAN_ANCHORS_VENV", Path.home() / ".cache" / "steersman" / "anchors-venv"))

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


LEARN_CHILD = r"""
import json, sys, tempfile, time
import torch
torch.set_num_threads(1)
from steersman.recipes import dqn, multiseed, ppo, sac
from steersman.recipes.config import CheckpointConfig, EvalConfig, LoggerConfig

n, frames, lr, ent, compile_ = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == "1"
algo, first_seed = sys.argv[6], int(sys.argv[7])
Config = {"ppo": ppo.PPOConfig, "dqn": dqn.DQNConfig, "sac": sac.SACConfig}[algo]
cfg = Config(seed=first_seed, seeds=n, total_frames=frames, quiet=True, logger=LoggerConfig(backends=["csv"]), compile=compile_,
             export_format="none", eval=EvalConfig(interval=0, episodes=10), checkpoint=CheckpointConfig(interval=0))
if algo == "ppo":  # --lr / --ent-coef (default: the recipe's); DQN and SAC keep their recipes' (rl-zoo's) defaults
    cfg.optim.lr, cfg.loss.entropy_coef = lr, ent
c0, t0 = time.process_time(), time.perf_counter()
summary = getattr(multiseed, f"train_{algo}")(cfg, tempfile.mkdtemp() + "/run")
print(json.dumps({"mode": f"steersman seeds={n}" + (" compiled" if compile_ else ""), "n": n, "frames": frames * n, "fps": summary["frames_per_s"],
                  "call_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                  "finals": list(summary["final_eval_return"].values()), "first_seed": first_seed}))
"""

SB3_CHILD = r"""
import json, sys, time
import torch
torch.set_num_threads(1)
from stable_baselines3 import DQN, PPO, SAC
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

seed, frames, lr, ent, algo = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
env_name = "Pendulum-v1" if algo == "sac" else "CartPole-v1"
c0, t0 = time.process_time(), time.perf_counter()
if algo == "ppo":
    env = make_vec_env(env_name, n_envs=8, seed=seed)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=ent,
                learning_rate=lambda p: p * lr, clip_range=lambda p: p * 0.2, seed=seed, device="cpu", verbose=0)
elif algo == "dqn":  # rl-zoo's CartPole DQN = steersman's DQNConfig defaults (as benchmarks/learning.py)
    env = make_vec_env(env_name, n_envs=1, seed=seed)
    model = DQN("MlpPolicy", env, learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1_000,
                gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
                exploration_final_eps=0.04, policy_kwargs={"net_arch": [256, 256]}, seed=seed, device="cpu", verbose=0)
else:  # SB3's SAC defaults = steersman's SACConfig defaults (as benchmarks/learning.py)
    env = make_vec_env(env_name, n_envs=1, seed=seed)
    model = SAC("MlpPolicy", env, learning_rate=1e-3, seed=seed, device="cpu", verbose=0)
model.learn(frames)
train_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
ret, _ = evaluate_policy(model, make_vec_env(env_name, n_envs=1, seed=seed + 10_000), n_eval_episodes=10,
                         deterministic=True)
print(json.dumps({"frames": int(model.num_timesteps), "train_s": train_s, "cpu_s": cpu_s, "final": float(ret)}))
"""


UPDATE_CHILD = r"""
import json, sys, tempfile, time
import torch
torch.set_num_threads(1)
from steersman.recipes import multiseed
from steersman.recipes.ppo import PPOConfig

n, rounds, reps, labels = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(",")
B = 256
g = torch.Generator().manual_seed(0)
contestants, options = {}, multiseed.ON_POLICY_OPTIONS
# eager; compiled (inductor: the population's options); compiled-tanh (inductor's own vectorized
# tanh, no decomposition); compiled-py (the population's options with inductor's Python wrapper)
extra = {"compiled": options, "compiled-tanh": {}, "compiled-py": {**options, "cpp_wrapper": False}}
for label in labels:
    multiseed.ON_POLICY_OPTIONS = extra.get(label, options)
    pop = multiseed.Population("ppo", PPOConfig(seeds=n, quiet=True, compile=label != "eager"), tempfile.mkdtemp(),
                               resume=False, batch_frames=B)
    contestants[label] = multiseed._OnPolicyModel("ppo", pop)
multiseed.ON_POLICY_OPTIONS = options
P = pop.P
data = (torch.randn(P, B, 4, generator=g), torch.randint(0, 2, (P, B), generator=g), -torch.rand(P, B, generator=g),
        torch.randn(P, B, 1, generator=g), torch.randn(P, B, 1, generator=g))
idx = torch.stack([torch.randperm(B, generator=g) for _ in range(P)])
state, first = {}, {}
for label, m in contestants.items():
    c0 = time.process_time()
    state[label] = m.v_update(m.params, m.opt_state, data, idx, m.base["lr"], m.base["max_grad_norm"])[:2]
    first[label] = time.process_time() - c0
times = {label: [] for label in contestants}
for _ in range(rounds):  # alternate: both see the same machine
    for label, m in contestants.items():
        p, s = state[label]
        c0 = time.process_time()
        for _ in range(reps):
            p, s, _ = m.v_update(p, s, data, idx, m.base["lr"], m.base["max_grad_norm"])
        times[label].append((time.process_time() - c0) / reps * 1e3)
        state[label] = (p, s)
bitwise = {k: all(torch.equal(a, b) for a, b in zip(state[k][0], state[labels[-1]][0])) for k in labels}
max_diff = {k: max((a - b).abs().max().item() for a, b in zip(state[k][0], state[labels[-1]][0])) for k in labels}
print(json.dumps({"n": n, "first_call_cpu_s": first, "params_equal_to_last": bitwise, "max_abs_diff_to_last": max_diff,
                  "ms_per_update": {k: sorted(v)[len(v) // 2] for k, v in times.items()}}))
"""


def update_ms(n: int, rounds: int, reps: int, labels: str = "eager,compiled") -> dict:
    """Per-update CPU ms of the vmapped PPO update for each of ``labels`` (eager, compiled,
    compiled-py), alternated in one process."""
    out = subprocess.run([sys.executable, "-c", UPDATE_CHILD, str(n), str(rounds), str(reps), labels],
                         capture_output=True, text=True, check=True, cwd=tempfile.gettempdir())
    return json.loads(out.stdout.strip().splitlines()[-1])


def learn(n: int, frames: int, lr: float, ent: float, compile_: bool = False, algo: str = "ppo",
          warm: bool = False, sb3_repeats: int = 1, first_seed: int = 0) -> list[dict]:
    """The population (seeds ``first_seed`` .. ``first_seed + n - 1``) to the end, then SB3
    alone (``sb3_repeats`` times, the median run by CPU seconds reported; none for 0) and two
    SB3 runs at once, same settings (``warm``: a short untimed compiled run first, so that the
    timed one finds its graphs in inductor's on-disk cache; the timed run still traces them)."""
    rows = []
    if compile_ and warm:  # the same graphs traced and code-generated once into the on-disk cache, untimed
        per_batch = {"ppo": 256, "dqn": 256 * 5, "sac": 101}[algo]  # (DQN, SAC: past learning_starts)
        subprocess.run([sys.executable, "-c", LEARN_CHILD, str(n), str(per_batch), str(lr), str(ent), "1", algo,
                        str(first_seed)],
                       capture_output=True, text=True, check=True, cwd=tempfile.gettempdir())
    out = subprocess.run([sys.executable, "-c", LEARN_CHILD, str(n), str(frames), str(lr), str(ent),
                          "1" if compile_ else "0", algo, str(first_seed)], capture_output=True, text=True, check=True,
                         cwd=tempfile.gettempdir())
    rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    if sb3_repeats == 0:
        return rows
    sb3 = str(ANCHORS_VENV / "bin" / "python")

    def sb3_row(label: str, seeds: list[int]) -> dict:
        procs = [subprocess.Popen([sb3, "-c", SB3_CHILD, str(s), str(frames), str(lr), str(ent), algo],
                                  stdout=subprocess.PIPE, text=True, cwd=tempfile.gettempdir()) for s in seeds]
        runs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
        return {"mode": label, "n": len(runs), "frames": sum(r["frames"] for r in runs),
                "fps": sum(r["frames"] / r["train_s"] for r in runs), "call_s": max(r["train_s"] for r in runs),
                "cpu_s": sum(r["cpu_s"] for r in runs), "finals": [r["final"] for r in runs]}

    singles = sorted((sb3_row("sb3", [0]) for _ in range(sb3_repeats)), key=lambda r: r["cpu_s"])
    rows.append({**singles[len(singles) // 2], "cpu_s_runs": [r["cpu_s"] for r in singles]})  # the median run
    rows.append(sb3_row("sb3-pair", [0, 1]))
    return rows


def run(mode: str, n: int, batches: int, compile_: bool) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(n), str(batches), "1" if compile_ else "0"],
                         capture_output=True, text=True, check=True, cwd=tempfile.gettempdir())
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1,8,32", help="comma-separated N")
    ap.add_argument("--batches", type=int, default=4, help="timed batches of 256 frames per member")
    ap.add_argument("--compile", action="store_true",
                    help="also the compiled update (inductor); with --learn: the population compiled")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--learn", action="store_true", help="train to the end, SB3 side by side (see above)")
    ap.add_argument("--frames", type=int, default=100_000, help="--learn: frames per member (PPO: rl-zoo's budget)")
    ap.add_argument("--algo", choices=("ppo", "dqn", "sac"), default="ppo",
                    help="--learn: PPO on CartPole (the settings below), or DQN on CartPole / SAC on Pendulum with "
                         "their recipes' (rl-zoo's) defaults on both sides")
    ap.add_argument("--warm-cache", action="store_true",
                    help="--learn --compile: fill inductor's on-disk cache with a short untimed run first (the timed "
                         "run then traces its graphs and loads their code; without it a changed graph is generated "
                         "inside the timed run)")
    ap.add_argument("--sb3-repeats", type=int, default=1,
                    help="--learn: run SB3 alone this many times and report the median run (its CPU rate moved "
                         "1.7x between runs minutes apart on a shared machine); 0: the population only")
    ap.add_argument("--first-seed", type=int, default=0,
                    help="--learn: the population's seeds are first-seed .. first-seed + N - 1 (SB3 keeps 0 and 1)")
    ap.add_argument("--lr", type=float, default=1e-3, help="--learn: PPO's Adam lr (linear to 0; rl-zoo's 1e-3)")
    ap.add_argument("--ent-coef", type=float, default=0.0, help="--learn: PPO's entropy bonus (rl-zoo's 0)")
    ap.add_argument("--update-ms", action="store_true",
                    help="per-update CPU ms of the vmapped PPO update, eager vs compiled (inductor), in one process")
    ap.add_argument("--contestants", default="eager,compiled",
                    help="--update-ms: among eager, compiled (inductor with the population's options: C++ wrapper, "
                         "tanh decomposed), compiled-tanh (inductor's own tanh), compiled-py (inductor's Python "
                         "wrapper); ratios to the first")
    args = ap.parse_args()
    if args.update_ms:
        labels = args.contestants.split(",")
        print(f"{'members':>8}" + "".join(f"{lab + ' ms':>16}{'x':>6}{'per seed':>10}" for lab in labels)
              + "  first call CPU s; params equal to the last contestant's")
        rows = []
        for n in (int(v) for v in args.seeds.split(",")):
            r = update_ms(n, rounds=5, reps=10, labels=args.contestants)
            rows.append(r)
            ms = r["ms_per_update"]
            print(f"{n:>8}" + "".join(f"{ms[lab]:>16.2f}{ms[labels[0]] / ms[lab]:>6.2f}{ms[lab] / n:>10.3f}"
                                      for lab in labels)
                  + "  " + ", ".join(f"{lab} {r['first_call_cpu_s'][lab]:.1f}" for lab in labels)
                  + "; " + ", ".join(f"{lab} {r['params_equal_to_last'][lab]} ({r['max_abs_diff_to_last'][lab]:.1e})"
                                     for lab in labels))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"rows": rows, "time": time.strftime("%Y-%m-%d %H:%M:%S")}, f, indent=1)
        return
    if args.learn:
        n = int(args.seeds.split(",")[-1])
        if args.sb3_repeats < 0:
            ap.error("--sb3-repeats must be >= 0")
        rows = learn(n, args.frames, args.lr, args.ent_coef, args.compile, args.algo, args.warm_cache,
                     args.sb3_repeats, args.first_seed)
        ref = rows[1] if len(rows) > 1 else rows[0]  # (--sb3-repeats 0: ratios to the population itself)
        sb3, sb3_cpu = ref["fps"], ref["frames"] / ref["cpu_s"]
        print(f"{'contestant':<20}{'runs':>6}{'frames/s (all)':>16}{'x sb3':>8}{'frames/CPU-s':>14}{'x sb3':>8}"
              f"{'call s':>9}  final returns")
        for r in rows:
            finals = " ".join(f"{f:.0f}" for f in r["finals"])
            per_cpu = r["frames"] / r["cpu_s"]
            print(f"{r['mode']:<20}{r['n']:>6}{r['fps']:>16.0f}{r['fps'] / sb3:>8.2f}{per_cpu:>14.0f}"
                  f"{per_cpu / sb3_cpu:>8.2f}{r['call_s']:>9.1f}  {finals}")
        runs = rows[1]["cpu_s_runs"] if len(rows) > 1 else []
        if len(runs) > 1:
            print(f"sb3 alone, {len(runs)} runs: frames per CPU-second "
                  + ", ".join(f"{rows[1]['frames'] / c:.0f}" for c in runs) + " (the median run above)")
        finals, threshold = rows[0]["finals"], {"ppo": 475.0, "dqn": 475.0, "sac": -200.0}[args.algo]
        low = ", ".join(f"seed {args.first_seed + i}: {f:.1f}" for i, f in enumerate(finals) if f < threshold)
        print(f"members >= {threshold:g}: {sum(f >= threshold for f in finals)}/{len(finals)}; min {min(finals):.1f}"
              + (f" ({low})" if low else ""))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"rows": rows, "time": time.strftime("%Y-%m-%d %H:%M:%S")}, f, indent=1)
        return
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
