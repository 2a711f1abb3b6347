"""Native multi-agent env steps/s against VMAS on the navigation scenario.

Each configuration steps ``num_envs`` worlds of ``n_agents`` agents with random actions
(drawn beforehand) and auto-reset, for about ``--time`` seconds after a warm-up, and
reports env-steps per second (``num_envs * steps / s``; one env-step moves every agent of
one world). Rows:

* ``native``: ``NavigationEnv.step_and_maybe_reset`` (TensorDicts in and out, eager).
* ``native compiled``: the same with ``compile=True`` (inductor; ``--compile``).
* ``native kernel``: the pure step function alone (``_navigation_kernel``: no TensorDicts).
* ``VmasEnv``: the steersman wrapper of VMAS (TensorDicts in and out).
* ``vmas raw``: ``vmas.make_env("navigation").step(list of actions)`` itself.

The scenarios are alike, not identical: both are cooperative navigation to per-agent goals
with collision penalties; VMAS's has a full physics engine (collision forces) and lidar
observations, the native one is point-mass kinematics with a collision penalty only.

    python benchmarks/marl_envs.py [--envs 1 64 4096] [--agents 3] [--time 2] [--compile]
"""

from __future__ import annotations

import argparse
import time

import torch

from steersman.envs import NavigationEnv
from steersman.envs.multiagent.navigation import _navigation_kernel


def _rate(step, n_envs: int, seconds: float, warmup: int = 5) -> float:
    for _ in range(warmup):
        step()
    steps, t0 = 0, time.perf_counter()
    while True:
        for _ in range(10):
            step()
        steps += 10
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return n_envs * steps / dt


def native(n_envs: int, n_agents: int, seconds: float, compile: bool = False) -> float:
    env = NavigationEnv(n_envs, n_agents=n_agents, max_steps=100, seed=0, compile=compile, check=False)
    acts = [torch.rand(n_envs, n_agents, 2) * 2 - 1 for _ in range(16)]
    state = {"td": env.reset(), "i": 0}

    def step():
        td = state["td"]
        td["agents", "action"] = acts[state["i"] % 16]
        state["i"] += 1
        _, state["td"] = env.step_and_maybe_reset(td)

    return _rate(step, n_envs, seconds)


def native_kernel(n_envs: int, n_agents: int, seconds: float) -> float:
    env = NavigationEnv(n_envs, n_agents=n_agents, max_steps=100, seed=0)
    acts = [torch.rand(n_envs, n_agents, 2) * 2 - 1 for _ in range(16)]
    s = {"x": (env._state, env._steps, env._rng), "i": 0}

    def step():
        st, steps, rng = s["x"]
        out = _navigation_kernel(st, steps, rng, env._offsets, acts[s["i"] % 16], env._c, 100, True)
        s["x"], s["i"] = out[:3], s["i"] + 1

    return _rate(step, n_envs, seconds)


def vmas_wrapped(n_envs: int, n_agents: int, seconds: float) -> float:
    from steersman.envs.libs.vmas import VmasEnv

    env = VmasEnv("navigation", num_envs=n_envs, max_steps=100, seed=0, n_agents=n_agents, check=False)
    acts = [torch.rand(n_envs, n_agents, 2) * 2 - 1 for _ in range(16)]
    state = {"td": env.reset(), "i": 0}

    def step():
        td = state["td"]
        td["agents", "action"] = acts[state["i"] % 16]
        state["i"] += 1
        _, state["td"] = env.step_and_maybe_reset(td)

    return _rate(step, n_envs, seconds)


def vmas_raw(n_envs: int, n_agents: int, seconds: float) -> float:
    import vmas

    env = vmas.make_env("navigation", num_envs=n_envs, max_steps=100, seed=0, n_agents=n_agents)
    acts = [list((torch.rand(n_envs, n_agents, 2) * 2 - 1).unbind(1)) for _ in range(16)]
    s = {"i": 0}

    def step():
        _, _, dones, _ = env.step(acts[s["i"] % 16])
        s["i"] += 1
        if bool(dones.any()):  # reset the finished worlds (what the wrappers do)
            for i in dones.nonzero().flatten().tolist():
                env.reset_at(i)

    return _rate(step, n_envs, seconds)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--envs", type=int, nargs="+", default=[1, 64, 4096])
    p.add_argument("--agents", type=int, default=3)
    p.add_argument("--time", type=float, default=2.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--compile", action="store_true", help="add the inductor-compiled native row")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = [("native", lambda n: native(n, args.agents, args.time)),
            ("native kernel", lambda n: native_kernel(n, args.agents, args.time))]
    if args.compile:
        rows.append(("native compiled", lambda n: native(n, args.agents, args.time, compile=True)))
    rows += [("VmasEnv", lambda n: vmas_wrapped(n, args.agents, args.time)),
             ("vmas raw", lambda n: vmas_raw(n, args.agents, args.time))]
    results: dict[tuple[str, int], float] = {}
    print(f"navigation, {args.agents} agents, {args.threads} thread(s), env-steps/s")
    print("| num_envs | " + " | ".join(name for name, _ in rows) + " | native / vmas raw |")
    print("|---" * (len(rows) + 2) + "|")
    for n in args.envs:
        for name, fn in rows:
            results[name, n] = fn(n)
        ratio = results["native", n] / results["vmas raw", n]
        print(f"| {n} | " + " | ".join(f"{results[name, n]:,.0f}" for name, _ in rows) + f" | {ratio:.1f}x |",
              flush=True)


if __name__ == "__main__":
    main()
