"""Per-update cost of PPO's minibatch update, five ways (one thread, CPU).

The PPO recipe's minibatch on CartPole: ``[B, 4]`` observations (B = 256, the recipe's
minibatch, or 64), two [64, 64] tanh MLPs (a 2-logit categorical actor, a critic),
ClipPPOLoss (normalized advantage, clip 0.2, l2 critic x 0.5, entropy), global-norm
clipping at 0.5, Adam(lr 1e-3, eps 1e-5).

  eager          ClipPPOLoss + ``zero_grad``/``backward``/``clip_grad_norm_`` + fused
                 ``torch.optim.Adam``: the recipe with ``compile=false``;
  compile-loss   the same with the loss through ``torch.compile(fullgraph=True)``: the
                 recipe's ``compile=true`` before the functional update;
  functional-td  :class:`steersman.objectives.functional_update.FunctionalUpdate`
                 (torch.func gradients, clipping, functional Adam) compiled whole with
                 ``fullgraph=True``, TensorDicts in and out of the graph;
  functional     the same step through ``CompiledUpdate``: flat tensors at the graph's
                 boundary, guards skipped after the first call: the recipes' ``compile=true``;
  fused          what PPO's ``compile=true`` runs since session 10
                 (:class:`steersman.recipes.fused_ppo.FusedPPOUpdate`): all of an
                 iteration's 20 updates (a 256-frame batch, 20 epochs at B=256, 5 at B=64)
                 in ONE compiled call, a ``scan`` over the shuffled minibatch indices;
                 reported per update (the call's time / 20); its graph's wrapper in C++
                 (``cpp_wrapper``, the recipe's default since session 11);
  fused-py       the same with inductor's Python wrapper (the session-10 recipe);
  floor          plain PyTorch: the two bare MLPs as a dict of tensors, the same clipped
                 loss written by hand, ``torch.func.grad``, clipping and Adam in one
                 ``fullgraph`` function. No TensorDict, no module.

Each contestant runs in its own process, twice: first with an empty inductor cache
(cold compile), then with the cache the first run left (warm compile). Reported: the
first call's seconds (compile included; wall and CPU, g++ included) for both, and the
steady per-update time (median of ``--repeats`` blocks of ``--updates`` calls, from the
warm process). ``--interleaved`` times the modes in one process in alternating blocks
instead (no compile times): on a loaded machine the ratios then hold.

    python benchmarks/compiled_update.py                  # B=256
    python benchmarks/compiled_update.py --batch 64 --updates 100
    python benchmarks/compiled_update.py --json out.json
    python benchmarks/compiled_update.py --interleaved --batch 64 --modes floor functional functional-td

On a shared machine the times drift; compare the rows of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn

MODES = ("eager", "compile-loss", "functional-td", "functional", "fused", "fused-py", "fused-sleef", "floor")
FRAMES, UPDATES = 256, 20  # the recipe's batch and updates per iteration (fused mode)
OBS, N_ACT, HIDDEN = 4, 2, 64
LR, EPS, MAX_NORM, CLIP = 1e-3, 1e-5, 0.5, 0.2


def _mlp(out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(OBS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                         nn.Linear(HIDDEN, out))


def _batches(batch: int, n: int = 8) -> list:
    from steersman.tensordict import TensorDict

    g = torch.Generator().manual_seed(1)
    return [TensorDict({"observation": torch.randn(batch, OBS, generator=g),
                        "action": torch.randint(0, N_ACT, (batch,), generator=g),
                        "action_log_prob": -torch.rand(batch, generator=g) - 0.3,
                        "advantage": torch.randn(batch, 1, generator=g),
                        "value_target": torch.randn(batch, 1, generator=g)}, batch_size=[batch]) for _ in range(n)]


def _loss_module():
    from steersman.objectives import ClipPPOLoss
    from steersman.tensordict.nn import (
        ProbabilisticTensorDictModule,
        ProbabilisticTensorDictSequential,
        TensorDictModule,
    )

    actor = ProbabilisticTensorDictSequential(
        TensorDictModule(_mlp(N_ACT), ["observation"], ["logits"]),
        ProbabilisticTensorDictModule(["logits"], ["action"], torch.distributions.Categorical,
                                      {"validate_args": False}, return_log_prob=True))
    critic = TensorDictModule(_mlp(1), ["observation"], ["state_value"])
    return ClipPPOLoss(actor, critic, clip_epsilon=CLIP, entropy_coeff=0.0, critic_coeff=0.5,
                       loss_critic_type="l2", normalize_advantage=True, diagnostics=False)


def _torch_optim_step(compile_loss: bool):
    loss_fn = _loss_module()
    params = [p for p in loss_fn.parameters() if p.requires_grad]
    optim = torch.optim.Adam(params, lr=torch.tensor(LR), eps=EPS, fused=True)
    compute = torch.compile(loss_fn, fullgraph=True) if compile_loss else loss_fn

    def step(mb):
        losses = compute(mb)
        total = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
        optim.zero_grad(set_to_none=True)
        total.backward()
        nn.utils.clip_grad_norm_(params, MAX_NORM, foreach=True)
        optim.step()
    return step


def _functional_step():
    """What the recipes run with compile=true: CompiledUpdate (flat tensors at the graph's boundary)."""
    from steersman.objectives.functional_update import (
        CompiledUpdate,
        FunctionalUpdate,
        OptimizerState,
    )
    from steersman.tensordict.nn.optim import Adam

    update = FunctionalUpdate(_loss_module(), Adam(lr=torch.tensor(LR), eps=EPS), max_grad_norm=MAX_NORM)
    return CompiledUpdate(update, OptimizerState(update.init()[1]))


def _functional_td_step():
    """FunctionalUpdate compiled as is: TensorDicts in and out of the graph."""
    from steersman.objectives.functional_update import FunctionalUpdate
    from steersman.tensordict.nn.optim import Adam

    update = FunctionalUpdate(_loss_module(), Adam(lr=torch.tensor(LR), eps=EPS), max_grad_norm=MAX_NORM)
    compiled = torch.compile(update, fullgraph=True)
    holder = list(update.init())

    def step(mb):
        holder[0], holder[1], _ = compiled(holder[0], holder[1], mb)
    return step


def _fused_step(batch: int, options: dict | None = None):
    """FusedPPOUpdate: one compiled call per UPDATES updates (``step.updates_per_call``);
    ``options``: inductor's (None: the recipe's default, the C++ wrapper; ``{}``: Python)."""
    from steersman.objectives.functional_update import FunctionalUpdate, OptimizerState
    from steersman.recipes.fused_ppo import FusedPPOUpdate
    from steersman.tensordict.nn.optim import Adam

    loss_fn = _loss_module()
    update = FunctionalUpdate(loss_fn, Adam(lr=torch.tensor(LR), eps=EPS), max_grad_norm=MAX_NORM)
    fused = FusedPPOUpdate(loss_fn, update, OptimizerState(update.init()[1]), options=options)
    full = _batches(FRAMES, 1)[0]
    epochs = UPDATES * batch // FRAMES
    g = torch.Generator().manual_seed(2)

    def step(mb):  # (the minibatches come from `full`, as in the recipe)
        fused(full, torch.stack([torch.randperm(FRAMES, generator=g) for _ in range(epochs)]).reshape(-1, batch))
    step.updates_per_call = UPDATES
    return step


def _floor_step():
    """Bare tensors: the same math as ClipPPOLoss + clip_grad_norm + Adam, by hand."""
    nets = {"pi": _mlp(N_ACT), "v": _mlp(1)}
    params = {f"{n}.{k}": v.detach().clone() for n, net in nets.items() for k, v in net.named_parameters()}
    state = {"step": torch.zeros(()), "m": {k: torch.zeros_like(v) for k, v in params.items()},
             "v": {k: torch.zeros_like(v) for k, v in params.items()}}
    lr, clip = torch.tensor(LR), torch.tensor(CLIP)

    def mlp(p, prefix, x):
        x = torch.tanh(torch.addmm(p[f"{prefix}.0.bias"], x, p[f"{prefix}.0.weight"].t()))
        x = torch.tanh(torch.addmm(p[f"{prefix}.2.bias"], x, p[f"{prefix}.2.weight"].t()))
        return torch.addmm(p[f"{prefix}.4.bias"], x, p[f"{prefix}.4.weight"].t())

    def loss(p, obs, action, old_log_prob, advantage, value_target):
        adv = advantage[:, 0]
        adv = (adv - adv.mean()) / adv.std().clamp_min(1e-6)
        log_probs = torch.log_softmax(mlp(p, "pi", obs), -1)
        log_ratio = log_probs.gather(-1, action[:, None])[:, 0] - old_log_prob
        clipped = log_ratio.clamp(torch.log1p(-clip), torch.log1p(clip))
        objective = -torch.minimum(log_ratio.exp() * adv, clipped.exp() * adv).mean()
        entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
        critic = 0.5 * (mlp(p, "v", obs) - value_target).pow(2).mean()
        return objective + critic - 0.0 * entropy

    def update(p, s, obs, action, old_log_prob, advantage, value_target):
        grads = torch.func.grad(loss)(p, obs, action, old_log_prob, advantage, value_target)
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()]))
        coef = torch.clamp(MAX_NORM / (norm + 1e-6), max=1.0)
        step = s["step"] + 1
        bc1, bc2 = 1 - 0.9 ** step, 1 - 0.999 ** step
        new_p, new_m, new_v = {}, {}, {}
        for k, w in p.items():
            g = grads[k] * coef
            new_m[k] = torch.lerp(s["m"][k], g, 0.1)
            new_v[k] = s["v"][k] * 0.999 + 0.001 * g * g
            new_p[k] = w - (lr / bc1) * new_m[k] / (new_v[k].sqrt() / bc2.sqrt() + EPS)
        return new_p, {"step": step, "m": new_m, "v": new_v}

    compiled = torch.compile(update, fullgraph=True)
    holder = [params, state]

    def step(mb):
        holder[0], holder[1] = compiled(holder[0], holder[1], mb["observation"], mb["action"],
                                        mb["action_log_prob"], mb["advantage"], mb["value_target"])
    return step


def _makers(batch: int) -> dict:
    return {"eager": lambda: _torch_optim_step(False), "compile-loss": lambda: _torch_optim_step(True),
            "functional": _functional_step, "functional-td": _functional_td_step,
            "fused": lambda: _fused_step(batch), "fused-py": lambda: _fused_step(batch, {}),
            "fused-sleef": lambda: _fused_step(batch, {"cpp_wrapper": True}), "floor": _floor_step}


def _cpu_s() -> float:
    """CPU seconds of this process and of its finished children (g++): the compile's cost
    without the waiting a loaded machine adds to the wall clock."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def worker(mode: str, batch: int, updates: int, repeats: int) -> dict:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    step = _makers(batch)[mode]()
    per_call = getattr(step, "updates_per_call", 1)
    batches = _batches(batch)
    t0, c0 = time.perf_counter(), _cpu_s()
    step(batches[0])
    first, first_cpu = time.perf_counter() - t0, _cpu_s() - c0
    for mb in batches:  # warm-up
        step(mb)
    blocks = []
    calls = max(1, updates // per_call)
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in range(calls):
            step(batches[i % len(batches)])
        blocks.append((time.perf_counter() - t0) / (calls * per_call))
    return {"first_call_s": first, "first_call_cpu_s": first_cpu, "update_ms": 1e3 * statistics.median(blocks),
            "update_ms_blocks": [1e3 * b for b in blocks]}


def interleaved(modes: list[str], batch: int, updates: int, repeats: int) -> dict:
    """All modes in this process, compiled first, then timed in alternating blocks: on a
    loaded machine each mode sees the same load, so the ratios hold even when the times drift."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    makers = _makers(batch)
    batches = _batches(batch)
    steps = {}
    for mode in modes:
        steps[mode] = makers[mode]()
        for mb in batches:
            steps[mode](mb)
    blocks: dict = {mode: [] for mode in modes}
    for _ in range(repeats):
        for mode, step in steps.items():
            per_call = getattr(step, "updates_per_call", 1)
            calls = max(1, updates // per_call)
            t0 = time.perf_counter()
            for i in range(calls):
                step(batches[i % len(batches)])
            blocks[mode].append(1e3 * (time.perf_counter() - t0) / (calls * per_call))
    return {mode: {"update_ms": statistics.median(b), "update_ms_blocks": b} for mode, b in blocks.items()}


def _run(mode: str, args: argparse.Namespace, cache: str) -> dict:
    # compile_threads=1: g++ runs as a direct child, so its CPU time is counted
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, OMP_NUM_THREADS="1", TORCHINDUCTOR_COMPILE_THREADS="1")
    cmd = [sys.executable, __file__, "--worker", mode, "--batch", str(args.batch), "--updates", str(args.updates),
           "--repeats", str(args.repeats)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"rc {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--updates", type=int, default=200, help="updates per timed block")
    parser.add_argument("--repeats", type=int, default=5, help="timed blocks (the median is reported)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--interleaved", action="store_true",
                        help="time all modes in one process in alternating blocks (no compile times)")
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.interleaved:
        res = interleaved(args.modes, args.batch, args.updates, args.repeats)
        floor = res.get("floor", {}).get("update_ms")
        for mode, r in res.items():
            ratio = f"  x/floor {r['update_ms'] / floor:.2f}" if floor else ""
            print(f"{mode:<14}{r['update_ms']:>8.3f} ms{ratio}  blocks {[round(b, 3) for b in r['update_ms_blocks']]}")
        return
    if args.worker:
        print(json.dumps(worker(args.worker, args.batch, args.updates, args.repeats)))
        return
    results = {}
    for mode in args.modes:
        with tempfile.TemporaryDirectory() as cache:
            cold = _run(mode, args, cache)
            warm = _run(mode, args, cache) if "error" not in cold and mode != "eager" else cold
        results[mode] = {"cold": cold, "warm": warm}
    floor = results.get("floor", {}).get("warm", {}).get("update_ms")
    eager = results.get("eager", {}).get("warm", {}).get("update_ms")
    print(f"PPO minibatch update, B={args.batch}, two [64, 64] tanh MLPs, 1 thread "
          f"(median of {args.repeats} x {args.updates} updates)")
    print(f"{'mode':<14}{'update ms':>10}{'eager/x':>9}{'x/floor':>9}{'first call s, cold (cpu)':>26}"
          f"{'warm (cpu)':>16}")
    for mode, r in results.items():
        if "error" in r["cold"] or "error" in r["warm"]:
            print(f"{mode:<14} n/a: {r['cold'].get('error') or r['warm'].get('error')}")
            continue
        ms = r["warm"]["update_ms"]
        ratio_eager = f"{eager / ms:.2f}" if eager else "-"
        ratio_floor = f"{ms / floor:.2f}" if floor else "-"
        cold, warm = r["cold"], r["warm"]
        print(f"{mode:<14}{ms:>10.3f}{ratio_eager:>9}{ratio_floor:>9}"
              f"{cold['first_call_s']:>17.1f} ({cold['first_call_cpu_s']:.1f}){warm['first_call_s']:>9.1f} "
              f"({warm['first_call_cpu_s']:.1f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"batch": args.batch, "torch": torch.__version__, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
