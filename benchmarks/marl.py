"""Multi-agent training speed: MAPPO/IPPO training frames/s, side by side with BenchMARL, and
the vmapped multi-agent MLP against a Python loop over the agents' networks.

    python benchmarks/marl.py [--frames 16000] [--seeds 1] [--envs navigation vmas/navigation]
    python benchmarks/marl.py --benchmarl PYTHON [--frames 64000] [--seeds 3] [--epochs 4] [--minibatch 800]

Issue 15's ratios rest on ``--frames 64000`` (20 batches): shorter runs (``--frames 12800``, ~1.5 s
each) measure start-up as much as training, and a seed's ratio moves by up to 2x between runs.

``--benchmarl PYTHON`` (a Python with ``benchmarl`` and ``vmas``, e.g. a side venv: BenchMARL
1.5 pins torchrl < 0.12) runs the side-by-side instead: for each seed and algorithm,
steersman's recipe and BenchMARL's experiment train on VMAS navigation with the same
hyper-parameters (3 agents, 50-step episodes, shared reward; 64 sub-envs x 50 steps = 3,200
frames per batch; 4 epochs of 800-transition minibatches = 16 gradient steps per batch:
BenchMARL's ``on_policy_n_minibatch_iters`` counts epochs, not steps; Adam lr 3e-3, eps
1e-8; gamma 0.99, GAE lambda 0.9, clip 0.2, no entropy bonus, l2 critic loss, advantages
not standardized (BenchMARL's setting), gradient norm clipped at 1 per network; [64, 64]
tanh MLPs, parameters shared by the agents, tanh-normal actor; centralised critic for
MAPPO, per-agent for IPPO; CPU, one torch thread; no evaluation, checkpoints or loggers
besides one CSV). BenchMARL runs in a subprocess of ``PYTHON``, one run at a time (never
two runs at once; which side runs first alternates from pair to pair). Reported: the training loop's frames/s (ours: ``time/fps`` logged after
the last batch's update, i.e. without the final evaluation and checkpoint, which BenchMARL
with ``evaluation=False`` does not make; BenchMARL: frames over the wall time of
``experiment.run()``) and the mean training episode return of each batch (the team return;
with the shared reward every agent's return): the last batch's per seed, and the mean over
seeds of each batch's.

Part 1 trains each recipe (``steersman.recipes.mappo``/``ippo``) for ``--frames`` frames on
each env id (64 sub-envs x 50 steps per batch, 4 epochs of 800-transition minibatches,
[64, 64] networks, 3 agents, one torch thread, evaluation only at the end) and prints the
run's frames/s (collection + updates, from the run summary). Part 2 times one forward +
backward of ``MultiAgentMLP(share_params=False)`` (one vmapped call) and of the same agents
as ``n`` separate ``MLP``s called in a loop, for 3 and 16 agents, batch 800.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from torch import nn


def train_fps(algo: str, env: str, frames: int, seed: int) -> float:
    import importlib

    mod = importlib.import_module(f"steersman.recipes.{algo}")
    cfg = (mod.IPPOConfig if algo == "ippo" else mod.MAPPOConfig)()
    cfg.env.name, cfg.env.num_envs, cfg.env.max_episode_steps = env, 64, 50
    cfg.total_frames, cfg.n_steps, cfg.epochs, cfg.minibatch_size = frames, 50, 4, 800
    cfg.seed, cfg.quiet, cfg.export_format = seed, True, "none"
    cfg.eval.interval, cfg.eval.episodes, cfg.checkpoint.interval = 0, 2, 0
    cfg.logger.backends = ["csv"]
    summary = mod.train(cfg, tempfile.mkdtemp() + "/run")
    return float(summary["frames_per_s"])


# ------------------------------------------------------------------ BenchMARL side by side
SIDE = {"num_envs": 64, "n_steps": 50, "minibatch": 800, "epochs": 4, "lr": 3e-3, "max_steps": 50, "n_agents": 3}


def time_limit_terminal() -> None:
    """TorchRL's VmasEnv convention on ours: the time limit ends episodes as *terminated*
    (no bootstrap), as BenchMARL sees them (``--time-limit-terminal``)."""
    from steersman.envs.libs.vmas import VmasWrapper

    groups_out = VmasWrapper._groups_out

    def terminal(self, obs, rews, term, trunc):
        return groups_out(self, obs, rews, term | trunc, torch.zeros_like(trunc))

    VmasWrapper._groups_out = terminal


def ours_on_vmas(algo: str, frames: int, seed: int) -> tuple[float, float, list[float]]:
    """(training loop frames/s, the same per CPU second, each batch's mean training return) of
    our recipe on vmas/navigation."""
    import importlib

    mod = importlib.import_module(f"steersman.recipes.{algo}")
    cfg = (mod.IPPOConfig if algo == "ippo" else mod.MAPPOConfig)()
    cfg.env.name, cfg.env.num_envs, cfg.env.max_episode_steps = "vmas/navigation", SIDE["num_envs"], SIDE["max_steps"]
    cfg.env.n_agents = SIDE["n_agents"]
    cfg.total_frames, cfg.n_steps, cfg.epochs = frames, SIDE["n_steps"], SIDE["epochs"]
    cfg.minibatch_size, cfg.lr, cfg.max_grad_norm, cfg.gamma, cfg.gae_lambda = SIDE["minibatch"], SIDE["lr"], 1.0, 0.99, 0.9
    cfg.hidden_sizes, cfg.normalize_advantage = [64, 64], False  # BenchMARL's PPO losses do not standardize
    cfg.seed, cfg.quiet, cfg.export_format = seed, True, "none"
    cfg.eval.interval, cfg.eval.episodes, cfg.checkpoint.interval = 0, 2, 0
    cfg.logger.backends = ["csv"]
    run_dir = tempfile.mkdtemp() + "/run"
    from steersman.recipes.run import Run

    # the loop's CPU time too: from the end of the Run's setup (where time/fps starts) to the
    # last training log (where time/fps is read), in this process (a busy machine's other jobs
    # lengthen the wall time, not this)
    marks: dict = {}
    init, log = Run.__init__, Run.log

    def timed_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        marks["start"] = time.process_time()

    def timed_log(self, frames, values, *args, **kwargs):
        out = log(self, frames, values, *args, **kwargs)
        if "train/return" in values:
            marks["end"], marks["frames"] = time.process_time(), frames
        return out

    Run.__init__, Run.log = timed_init, timed_log
    try:
        mod.train(cfg, run_dir)
    finally:
        Run.__init__, Run.log = init, log
    from steersman.record import read_metrics_csv

    cols = read_metrics_csv(run_dir + "/metrics.csv")
    fps = [x for x in cols["time/fps"] if x == x]  # NaN on the evaluation's row
    cpu_fps = marks["frames"] / (marks["end"] - marks["start"])
    return float(fps[-1]), cpu_fps, [float(x) for x in cols["train/return"] if x == x]


def benchmarl_worker(algo: str, frames: int, seed: int) -> None:  # pragma: no cover - runs in BenchMARL's venv
    """Runs in ``--benchmarl PYTHON``: one BenchMARL experiment, prints a JSON line."""
    import csv
    import glob
    import json

    from benchmarl.algorithms import IppoConfig, MappoConfig
    from benchmarl.environments import VmasTask
    from benchmarl.experiment import Experiment, ExperimentConfig
    from benchmarl.models.mlp import MlpConfig

    torch.set_num_threads(1)
    task = VmasTask.NAVIGATION.get_from_yaml()
    task.config.update(max_steps=SIDE["max_steps"], n_agents=SIDE["n_agents"], shared_rew=True)  # VMAS' defaults
    algorithm = (IppoConfig if algo == "ippo" else MappoConfig).get_from_yaml()
    exp = ExperimentConfig.get_from_yaml()
    batch = SIDE["num_envs"] * SIDE["n_steps"]
    exp.sampling_device = exp.train_device = exp.buffer_device = "cpu"
    exp.on_policy_collected_frames_per_batch, exp.on_policy_n_envs_per_worker = batch, SIDE["num_envs"]
    exp.on_policy_minibatch_size = SIDE["minibatch"]
    # BenchMARL's "n_minibatch_iters" counts passes over the batch (each of batch // minibatch
    # minibatches), i.e. epochs: 16 here gave BenchMARL 64 gradient steps per batch to our 16
    exp.on_policy_n_minibatch_iters = SIDE["epochs"]
    exp.lr, exp.adam_eps, exp.gamma, exp.clip_grad_norm, exp.clip_grad_val = SIDE["lr"], 1e-8, 0.99, True, 1.0
    exp.share_policy_params, exp.max_n_frames, exp.max_n_iters = True, frames, None
    exp.evaluation, exp.render, exp.loggers, exp.create_json = False, False, ["csv"], False
    exp.checkpoint_interval, exp.checkpoint_at_end = 0, False
    exp.save_folder = tempfile.mkdtemp()
    model = MlpConfig(num_cells=[64, 64], activation_class=nn.Tanh, layer_class=nn.Linear)
    experiment = Experiment(task=task, algorithm_config=algorithm, model_config=model, critic_model_config=model,
                            seed=seed, config=exp)
    t, cpu = time.perf_counter(), time.process_time()
    experiment.run()
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    path = glob.glob(f"{exp.save_folder}/**/collection_agents_reward_episode_reward_mean.csv", recursive=True)
    with open(path[0]) as f:
        curve = [float(row[-1]) for row in csv.reader(f)]  # rows: iteration, return
    print(json.dumps({"fps": experiment.total_frames / wall, "cpu_fps": experiment.total_frames / cpu, "curve": curve}))


def side_by_side(python: str, frames: int, seeds: int) -> None:
    import json
    import subprocess

    rows = []
    print("| algo | seed | steersman frames/s | BenchMARL frames/s | ratio | steersman frames/CPU-s | BenchMARL "
          "frames/CPU-s | CPU ratio | steersman return | BenchMARL return |")
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    def run_theirs(algo: str, seed: int) -> dict:
        out = subprocess.run([python, __file__, "--benchmarl-worker", algo, str(frames), str(seed),
                              str(SIDE["epochs"]), str(SIDE["minibatch"])],
                             capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"BenchMARL {algo} seed {seed} failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    for seed in range(seeds):
        for k, algo in enumerate(("mappo", "ippo")):
            # the order alternates between seeds and algorithms: a load that drifts during
            # the run favours neither side
            if (seed + k) % 2 == 0:
                fps, cpu_fps, curve = ours_on_vmas(algo, frames, seed)
                theirs = run_theirs(algo, seed)
            else:
                theirs = run_theirs(algo, seed)
                fps, cpu_fps, curve = ours_on_vmas(algo, frames, seed)
            rows.append((algo, fps, theirs["fps"], curve, theirs["curve"], cpu_fps, theirs["cpu_fps"]))
            print(f"| {algo} | {seed} | {fps:.0f} | {theirs['fps']:.0f} | {fps / theirs['fps']:.2f}x | {cpu_fps:.0f} "
                  f"| {theirs['cpu_fps']:.0f} | {cpu_fps / theirs['cpu_fps']:.2f}x | {curve[-1]:.3f} "
                  f"| {theirs['curve'][-1]:.3f} |", flush=True)
    for algo in ("mappo", "ippo"):
        r = [row for row in rows if row[0] == algo]
        ratios = [row[1] / row[2] for row in r]
        cpu_ratios = [row[5] / row[6] for row in r]
        ours, theirs = [x[3][-1] for x in r], [x[4][-1] for x in r]
        print(f"{algo}: frames/s ratio median {statistics.median(ratios):.2f}x (min {min(ratios):.2f}x), per CPU "
              f"second {statistics.median(cpu_ratios):.2f}x (min {min(cpu_ratios):.2f}x); last-batch "
              f"return steersman {statistics.mean(ours):.3f} +- {statistics.pstdev(ours):.3f}, "
              f"BenchMARL {statistics.mean(theirs):.3f} +- {statistics.pstdev(theirs):.3f}", flush=True)
        for name, i in (("steersman", 3), ("BenchMARL", 4)):  # mean over seeds of each batch's return
            n = min(len(x[i]) for x in r)
            print(f"  {name} return per batch: " + ", ".join(f"{statistics.mean(x[i][b] for x in r):.3f}"
                                                          for b in range(n)), flush=True)


def time_ms(fn, repeats: int = 7, calls: int = 20) -> float:
    fn()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t) / calls * 1e3)
    return statistics.median(out)


def vmap_vs_loop(n_agents: int, batch: int = 800, d: int = 18) -> tuple[float, float]:
    from steersman.modules import MLP, MultiAgentMLP

    net = MultiAgentMLP(d, 4, n_agents, centralized=False, share_params=False, num_cells=[64, 64])
    nets = nn.ModuleList([MLP(in_features=d, out_features=4, num_cells=[64, 64]) for _ in range(n_agents)])
    x = torch.randn(batch, n_agents, d)

    def vmapped():
        net.zero_grad(set_to_none=True)
        net(x).square().sum().backward()

    def loop():
        nets.zero_grad(set_to_none=True)
        torch.stack([m(x[:, i]) for i, m in enumerate(nets)], -2).square().sum().backward()

    return time_ms(vmapped), time_ms(loop)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=16_000)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--envs", nargs="+", default=["navigation", "vmas/navigation"])
    parser.add_argument("--benchmarl", metavar="PYTHON", help="side by side with BenchMARL run by this Python")
    parser.add_argument("--time-limit-terminal", action="store_true",
                        help="side by side: our VMAS time limit ends episodes as terminated (TorchRL's convention)")
    parser.add_argument("--epochs", type=int, default=SIDE["epochs"],
                        help="side by side: passes over each batch (both sides)")
    parser.add_argument("--minibatch", type=int, default=SIDE["minibatch"],
                        help="side by side: transitions per gradient step (both sides)")
    parser.add_argument("--benchmarl-worker", nargs=5, metavar=("ALGO", "FRAMES", "SEED", "EPOCHS", "MINIBATCH"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    SIDE["epochs"], SIDE["minibatch"] = args.epochs, args.minibatch
    if args.benchmarl_worker:
        algo, frames, seed, SIDE["epochs"], SIDE["minibatch"] = args.benchmarl_worker
        SIDE["epochs"], SIDE["minibatch"] = int(SIDE["epochs"]), int(SIDE["minibatch"])
        return benchmarl_worker(algo, int(frames), int(seed))
    if args.benchmarl:
        if args.time_limit_terminal:
            time_limit_terminal()
        return side_by_side(args.benchmarl, args.frames, args.seeds)

    print("| algo | env | frames/s (median over seeds) |\n|---|---|---|")
    for env in args.envs:
        for algo in ("mappo", "ippo"):
            try:
                fps = statistics.median(train_fps(algo, env, args.frames, s) for s in range(args.seeds))
                print(f"| {algo} | {env} | {fps:.0f} |", flush=True)
            except Exception as err:  # e.g. vmas not installed
                print(f"| {algo} | {env} | n/a ({type(err).__name__}: {err}) |", flush=True)

    print("\n| agents | vmapped MultiAgentMLP (ms) | loop over MLPs (ms) | loop/vmapped |\n|---|---|---|---|")
    for n in (3, 16):
        v, lo = vmap_vs_loop(n)
        print(f"| {n} | {v:.2f} | {lo:.2f} | {lo / v:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
