"""Multi-agent training speed: MAPPO/IPPO training frames/s, and the vmapped multi-agent MLP
against a Python loop over the agents' networks.

    python benchmarks/marl.py [--frames 16000] [--seeds 1] [--envs navigation vmas/navigation]

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
    args = parser.parse_args()
    torch.set_num_threads(1)

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
