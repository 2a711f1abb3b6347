"""Time of one loss step (zero_grad + forward + backward) and of GAE, steersman vs TorchRL.

Rows (batch 256, every network an MLP with 2 hidden layers of 64 and Tanh):
  ppo        ClipPPOLoss, obs 17, action 6, IndependentNormal actor + state-value critic;
             total = loss_objective + loss_critic + loss_entropy
  ppo_tanh   the same with a TanhNormal actor; its entropy has no closed form: the floor and
             TorchRL (whose TanhNormal has no entropy()) draw 1 sample, steersman's
             TanhNormal.entropy() averages 16
  dqn        DQNLoss, obs 8, 4 actions (categorical), target network, TD(0), l2
  sac        SACLoss (v2), obs 17, action 6, TanhNormal actor, 2 critics + target
             critics, learned alpha; total = loss_actor + loss_qvalue + loss_alpha
  gae        GAE on [1024 envs, 128 steps, 1], vectorized functions
             (``vec_generalized_advantage_estimate``), no gradient
  gae_loop   the same with the loop-over-time functions (``generalized_advantage_estimate``;
             compiled, Dynamo unrolls the 128 steps)
  gae_module the ``GAE`` estimator module on a TensorDict [1024, 128] holding the values

Columns:
  floor      plain torch on raw tensors, written by hand (what a CleanRL script does):
             the losses with nn.Sequential MLPs (SAC's two critics as one batched
             bmm network), the GAE as a reverse Python loop over time
  st         steersman (this checkout, first on ``sys.path``), eager
  st comp    ``torch.compile`` (inductor) of the same step function
  trl        TorchRL (when importable), eager, built by the same code as the st column
             (its API is the one steersman follows)
  trl comp   ``torch.compile`` of the TorchRL step

Every column of a row starts from the same weights and data; before timing, the loss
(or advantage) of each column is compared with the floor's for the rows without sampling.
Timing: the columns of a row take turns within each round, so background load hits them
alike; each measurement repeats the call for ~``--time`` seconds; median (``--stat
best``: best) over the rounds, in µs per call; process CPU time by default (``--clock
wall`` for elapsed time); torch on 1 thread. Columns that cannot be built or compiled
print ``n/a`` and the reason.

    python benchmarks/losses.py [--quick] [--rows ppo,gae*] [--no-compile] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import fnmatch
import gc
import importlib
import json
import logging
import math
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch._dynamo.utils import counters

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the checkout's steersman

B, H = 256, 64                      # batch, hidden width
PPO_OBS, PPO_ACT = 17, 6
DQN_OBS, DQN_ACT = 8, 4
SAC_OBS, SAC_ACT = 17, 6
GAE_ENVS, GAE_T = 1024, 128
GAMMA, LMBDA, CLIP, ENT_COEF = 0.99, 0.95, 0.2, 0.01
SOFTPLUS_BIAS = math.log(math.e - 1)  # NormalParamExtractor's "biased_softplus_1.0"
COLUMNS = ("floor", "st", "st comp", "trl", "trl comp")


# --- the two libraries, under the same names ------------------------------------------------


# name: (where steersman has it, where TorchRL / tensordict has it); same names, same arguments
API = {
    "TensorDict": ("steersman.tensordict", "tensordict"),
    "TensorDictModule": ("steersman.tensordict.nn", "tensordict.nn"),
    "NormalParamExtractor": ("steersman.tensordict.nn", "tensordict.nn"),
    "MLP": ("steersman.modules", "torchrl.modules"),
    "IndependentNormal": ("steersman.modules", "torchrl.modules"),
    "TanhNormal": ("steersman.modules", "torchrl.modules"),
    "ProbabilisticActor": ("steersman.modules", "torchrl.modules"),
    "ValueOperator": ("steersman.modules", "torchrl.modules"),
    "QValueActor": ("steersman.modules", "torchrl.modules"),
    "ClipPPOLoss": ("steersman.objectives", "torchrl.objectives"),
    "DQNLoss": ("steersman.objectives", "torchrl.objectives"),
    "SACLoss": ("steersman.objectives", "torchrl.objectives"),
    "GAE": ("steersman.objectives.value", "torchrl.objectives.value"),
    "generalized_advantage_estimate": ("steersman.objectives.value.functional",
                                       "torchrl.objectives.value.functional"),
    "vec_generalized_advantage_estimate": ("steersman.objectives.value.functional",
                                           "torchrl.objectives.value.functional"),
}


def load(which: int) -> SimpleNamespace:
    """The names of ``API`` from steersman (``which=0``) or TorchRL (``which=1``)."""
    return SimpleNamespace(**{name: getattr(importlib.import_module(where[which]), name)
                              for name, where in API.items()})


LIBS: dict[str, SimpleNamespace] = {}
IMPORT_ERRORS: dict[str, str] = {}
for _which, _col in enumerate(("st", "trl")):
    try:
        LIBS[_col] = load(_which)
    except Exception as err:  # a missing library leaves its columns n/a
        IMPORT_ERRORS[_col] = f"{type(err).__name__}: {err}"


# --- shared weights and data ------------------------------------------------------------------


def mlp(i: int, o: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(i, H), nn.Tanh(), nn.Linear(H, H), nn.Tanh(), nn.Linear(H, o))


def lib_mlp(lib: SimpleNamespace, like: nn.Sequential) -> nn.Module:
    """The library's MLP with the weights of ``like`` (same layer layout: 0, 2, 4)."""
    net = lib.MLP(in_features=like[0].in_features, out_features=like[-1].out_features, num_cells=[H, H])
    net.load_state_dict(like.state_dict())
    return net


def grad_params(module: nn.Module) -> list[nn.Parameter]:
    """What an optimizer over ``module.parameters()`` would zero."""
    return [p for p in module.parameters() if p.requires_grad]


def normal_log_prob(x: Tensor, loc: Tensor, scale: Tensor) -> Tensor:
    return -((x - loc) ** 2) / (2 * scale**2) - scale.log() - 0.5 * math.log(2 * math.pi)


def loc_scale(out: Tensor) -> tuple[Tensor, Tensor]:
    loc, s = out.chunk(2, -1)
    return loc, F.softplus(s + SOFTPLUS_BIAS).clamp_min(1e-4)


def tanh_log_det(x: Tensor) -> Tensor:
    """``log |d tanh(x) / dx|``, the stable form."""
    return 2 * (math.log(2) - x - F.softplus(-2 * x))


Step = tuple[Callable[[Any], Tensor], Any]  # a step function and the argument it is called with


# --- PPO ---------------------------------------------------------------------------------------


def ppo_data() -> dict:
    g = torch.Generator().manual_seed(1)
    return {
        "observation": torch.randn(B, PPO_OBS, generator=g),
        "action": torch.rand(B, PPO_ACT, generator=g) * 1.8 - 0.9,  # inside (-1, 1) for TanhNormal
        "action_log_prob": torch.randn(B, generator=g) - 5.0,
        "advantage": torch.randn(B, 1, generator=g),
        "value_target": torch.randn(B, 1, generator=g),
    }


def ppo_nets() -> SimpleNamespace:
    torch.manual_seed(0)
    return SimpleNamespace(actor=mlp(PPO_OBS, 2 * PPO_ACT), critic=mlp(PPO_OBS, 1))


def ppo_floor(tanh: bool) -> Step:
    nets = ppo_nets()
    params = grad_params(nn.ModuleList([nets.actor, nets.critic]))
    lo, hi = math.log1p(-CLIP), math.log1p(CLIP)

    def step(d: dict) -> Tensor:
        for p in params:
            p.grad = None
        obs, action, adv = d["observation"], d["action"], d["advantage"][:, 0]
        loc, scale = loc_scale(nets.actor(obs))
        if tanh:
            x = torch.atanh(action)
            log_prob = (normal_log_prob(x, loc, scale) - tanh_log_det(x)).sum(-1)
            xs = loc + scale * torch.randn_like(loc)  # one draw for the entropy, as the losses do
            entropy = -(normal_log_prob(xs, loc, scale) - tanh_log_det(xs)).sum(-1)
        else:
            log_prob = normal_log_prob(action, loc, scale).sum(-1)
            entropy = (0.5 + 0.5 * math.log(2 * math.pi) + scale.log()).sum(-1)
        log_ratio = log_prob - d["action_log_prob"]
        gain = torch.minimum(log_ratio.exp() * adv, log_ratio.clamp(lo, hi).exp() * adv)
        value = nets.critic(obs)
        total = -gain.mean() + F.smooth_l1_loss(value, d["value_target"]) - ENT_COEF * entropy.mean()
        total.backward()
        return total.detach()

    return step, ppo_data()


def ppo_lib(lib: SimpleNamespace, tanh: bool) -> Step:
    nets = ppo_nets()
    actor = lib.ProbabilisticActor(
        lib.TensorDictModule(nn.Sequential(lib_mlp(lib, nets.actor), lib.NormalParamExtractor()),
                             in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"],
        distribution_class=lib.TanhNormal if tanh else lib.IndependentNormal,
        return_log_prob=True,
    )
    critic = lib.ValueOperator(lib_mlp(lib, nets.critic), in_keys=["observation"])
    loss = lib.ClipPPOLoss(actor, critic, clip_epsilon=CLIP, entropy_coeff=ENT_COEF, critic_coeff=1.0,
                           loss_critic_type="smooth_l1", normalize_advantage=False)
    params = grad_params(loss)

    def step(batch: Any) -> Tensor:
        for p in params:
            p.grad = None
        out = loss(batch)
        total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
        total.backward()
        return total.detach()

    return step, lib.TensorDict(ppo_data(), batch_size=[B])


# --- DQN ---------------------------------------------------------------------------------------


def dqn_data() -> dict:
    g = torch.Generator().manual_seed(2)
    done = torch.rand(B, 1, generator=g) < 0.05
    return {
        "observation": torch.randn(B, DQN_OBS, generator=g),
        "action": torch.randint(DQN_ACT, (B,), generator=g),
        "next": {
            "observation": torch.randn(B, DQN_OBS, generator=g),
            "reward": torch.randn(B, 1, generator=g),
            "done": done,
            "terminated": done.clone(),
        },
    }


def dqn_floor() -> Step:
    torch.manual_seed(0)
    net = mlp(DQN_OBS, DQN_ACT)
    target = copy.deepcopy(net).requires_grad_(False)
    params = grad_params(net)

    def step(d: dict) -> Tensor:
        for p in params:
            p.grad = None
        nxt = d["next"]
        pred = net(d["observation"]).gather(-1, d["action"].unsqueeze(-1))
        with torch.no_grad():
            next_q = target(nxt["observation"]).max(-1, keepdim=True).values
            y = nxt["reward"] + GAMMA * (1 - nxt["terminated"].float()) * next_q
        total = F.mse_loss(pred, y)
        total.backward()
        return total.detach()

    return step, dqn_data()


def dqn_lib(lib: SimpleNamespace) -> Step:
    torch.manual_seed(0)
    net = lib.QValueActor(lib_mlp(lib, mlp(DQN_OBS, DQN_ACT)), in_keys=["observation"],
                          action_space="categorical")
    loss = lib.DQNLoss(net, action_space="categorical", delay_value=True, loss_function="l2")
    loss.make_value_estimator(gamma=GAMMA)
    params = grad_params(loss)

    def step(batch: Any) -> Tensor:
        for p in params:
            p.grad = None
        total = loss(batch)["loss"]
        total.backward()
        return total.detach()

    return step, lib.TensorDict(dqn_data(), batch_size=[B])


# --- SAC ---------------------------------------------------------------------------------------


def sac_data() -> dict:
    g = torch.Generator().manual_seed(3)
    done = torch.rand(B, 1, generator=g) < 0.05
    return {
        "observation": torch.randn(B, SAC_OBS, generator=g),
        "action": torch.rand(B, SAC_ACT, generator=g) * 2 - 1,
        "next": {
            "observation": torch.randn(B, SAC_OBS, generator=g),
            "reward": torch.randn(B, 1, generator=g),
            "done": done,
            "terminated": done.clone(),
        },
    }


def sac_nets() -> SimpleNamespace:
    torch.manual_seed(0)
    return SimpleNamespace(actor=mlp(SAC_OBS, 2 * SAC_ACT), critic=mlp(SAC_OBS + SAC_ACT, 1))


class StackedCritics(nn.Module):
    """N MLP critics as one network of batched matmuls: ``[N, B, in] -> [N, B, 1]``."""

    def __init__(self, members: list[nn.Sequential]) -> None:
        super().__init__()
        linears = [[m for m in member if isinstance(m, nn.Linear)] for member in members]
        self.weights = nn.ParameterList(
            [torch.stack([ls[i].weight.T for ls in linears]).detach().clone() for i in range(3)])
        self.biases = nn.ParameterList(
            [torch.stack([ls[i].bias[None] for ls in linears]).detach().clone() for i in range(3)])

    def forward(self, x: Tensor, detach: bool = False) -> Tensor:
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            if detach:
                w, b = w.detach(), b.detach()
            x = torch.baddbmm(b, x, w)
            if i < 2:
                x = x.tanh()
        return x


def sac_floor() -> Step:
    nets = sac_nets()
    critics = StackedCritics([nets.critic, mlp(SAC_OBS + SAC_ACT, 1)])
    target = copy.deepcopy(critics).requires_grad_(False)
    log_alpha = nn.Parameter(torch.zeros(()))
    params = grad_params(nn.ModuleList([nets.actor, critics])) + [log_alpha]
    target_entropy = -float(SAC_ACT)

    def sample(obs: Tensor) -> tuple[Tensor, Tensor]:
        loc, scale = loc_scale(nets.actor(obs))
        x = loc + scale * torch.randn_like(loc)
        return x.tanh(), (normal_log_prob(x, loc, scale) - tanh_log_det(x)).sum(-1)

    def q(net: StackedCritics, obs: Tensor, action: Tensor, detach: bool = False) -> Tensor:
        x = torch.cat([obs, action], -1)
        return net(x.expand(2, *x.shape), detach)[..., 0]  # [2, B]

    def step(d: dict) -> Tensor:
        for p in params:
            p.grad = None
        obs, nxt = d["observation"], d["next"]
        alpha = log_alpha.detach().exp()
        with torch.no_grad():
            next_action, next_log_prob = sample(nxt["observation"])
            next_v = q(target, nxt["observation"], next_action).min(0).values - alpha * next_log_prob
            y = nxt["reward"][:, 0] + GAMMA * (1 - nxt["terminated"][:, 0].float()) * next_v
        loss_q = F.smooth_l1_loss(q(critics, obs, d["action"]), y.expand(2, B), reduction="none").sum(0).mean()
        action, log_prob = sample(obs)
        loss_actor = (alpha * log_prob - q(critics, obs, action, detach=True).min(0).values).mean()
        loss_alpha = (-log_alpha * (log_prob.detach() + target_entropy)).mean()
        total = loss_actor + loss_q + loss_alpha
        total.backward()
        return total.detach()

    return step, sac_data()


def sac_lib(lib: SimpleNamespace) -> Step:
    nets = sac_nets()
    actor = lib.ProbabilisticActor(
        lib.TensorDictModule(nn.Sequential(lib_mlp(lib, nets.actor), lib.NormalParamExtractor()),
                             in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"], distribution_class=lib.TanhNormal, return_log_prob=True,
    )
    qvalue = lib.ValueOperator(lib_mlp(lib, nets.critic), in_keys=["observation", "action"])
    loss = lib.SACLoss(actor, qvalue, num_qvalue_nets=2, loss_function="smooth_l1", alpha_init=1.0,
                       target_entropy=-float(SAC_ACT), delay_qvalue=True)
    loss.make_value_estimator(gamma=GAMMA)
    params = grad_params(loss)

    def step(batch: Any) -> Tensor:
        for p in params:
            p.grad = None
        out = loss(batch)
        total = out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]
        total.backward()
        return total.detach()

    return step, lib.TensorDict(sac_data(), batch_size=[B])


# --- GAE ---------------------------------------------------------------------------------------


def gae_data() -> dict:
    g = torch.Generator().manual_seed(4)
    shape = (GAE_ENVS, GAE_T, 1)
    done = torch.rand(shape, generator=g) < 0.01
    terminated = done & (torch.rand(shape, generator=g) < 0.5)
    return {"state_value": torch.randn(shape, generator=g), "next": {
        "state_value": torch.randn(shape, generator=g), "reward": torch.randn(shape, generator=g),
        "done": done, "terminated": terminated}}


def _gae_args(d: dict) -> tuple:
    n = d["next"]
    return d["state_value"], n["state_value"], n["reward"], n["done"], n["terminated"]


def gae_floor() -> Step:
    """The reverse loop over time, written out (CleanRL's)."""

    def step(d: dict) -> Tensor:
        value, next_value, reward, done, terminated = _gae_args(d)
        delta = reward + GAMMA * next_value * (1 - terminated.float()) - value
        coef = GAMMA * LMBDA * (1 - done.float())
        advantage = torch.empty_like(delta)
        last = torch.zeros_like(delta[:, 0])
        for t in reversed(range(delta.shape[1])):
            last = delta[:, t] + coef[:, t] * last
            advantage[:, t] = last
        return advantage

    return step, gae_data()


def gae_fn(lib: SimpleNamespace, vectorized: bool) -> Step:
    fn = lib.vec_generalized_advantage_estimate if vectorized else lib.generalized_advantage_estimate

    def step(d: dict) -> Tensor:
        value, next_value, reward, done, terminated = _gae_args(d)
        return fn(GAMMA, LMBDA, value, next_value, reward, done, terminated)[0]

    return step, gae_data()


def gae_module(lib: SimpleNamespace) -> Step:
    gae = lib.GAE(gamma=GAMMA, lmbda=LMBDA, value_network=None)

    def step(batch: Any) -> Tensor:
        return gae(batch)["advantage"]

    return step, lib.TensorDict(gae_data(), batch_size=[GAE_ENVS, GAE_T])


# --- rows --------------------------------------------------------------------------------------


@dataclass
class Row:
    floor: Callable[[], Step]
    lib: Callable[[SimpleNamespace], Step]
    exact: bool  # no sampling: every column must match the floor's output


ROWS: dict[str, Row] = {
    "ppo": Row(lambda: ppo_floor(False), lambda lib: ppo_lib(lib, False), exact=True),
    "ppo_tanh": Row(lambda: ppo_floor(True), lambda lib: ppo_lib(lib, True), exact=False),
    "dqn": Row(dqn_floor, dqn_lib, exact=True),
    "sac": Row(sac_floor, sac_lib, exact=False),
    "gae": Row(gae_floor, lambda lib: gae_fn(lib, True), exact=True),
    "gae_loop": Row(gae_floor, lambda lib: gae_fn(lib, False), exact=True),  # Dynamo unrolls it
    "gae_module": Row(gae_floor, gae_module, exact=True),
}


def _reason(err: BaseException) -> str:
    first = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {first[:160]}"


def build_columns(row: Row, compile_: bool) -> tuple[dict[str, Callable[[], Tensor]], dict[str, str]]:
    """``{column: zero-arg call}`` and ``{column: note}`` (why n/a, or the compile time)."""
    calls: dict[str, Callable[[], Tensor]] = {}
    notes: dict[str, str] = {}
    fn, arg = row.floor()
    calls["floor"] = lambda: fn(arg)
    for col in ("st", "trl"):
        if col not in LIBS:
            notes[col] = notes[col + " comp"] = f"not importable: {IMPORT_ERRORS[col]}"
            continue
        try:
            fn_e, arg_e = row.lib(LIBS[col])
            fn_e(arg_e)
            calls[col] = lambda fn_e=fn_e, arg_e=arg_e: fn_e(arg_e)
        except Exception as err:
            notes[col] = notes[col + " comp"] = _reason(err)
            continue
        if not compile_:
            notes[col + " comp"] = "--no-compile"
            continue
        try:  # a fresh module for the compiled column: guards and caches stay apart
            fn_c, arg_c = row.lib(LIBS[col])
            fn_c = torch.compile(fn_c)
            breaks = sum(counters["graph_break"].values())
            t0 = time.perf_counter()
            for _ in range(3):  # the first calls compile (and recompile once grads exist)
                fn_c(arg_c)
            breaks = sum(counters["graph_break"].values()) - breaks
            notes[col + " comp"] = (f"compiled in {time.perf_counter() - t0:.0f} s, {breaks} graph break(s) "
                                     "(a recompile counts them again)")
            calls[col + " comp"] = lambda fn_c=fn_c, arg_c=arg_c: fn_c(arg_c)
        except Exception as err:
            notes[col + " comp"] = "compile failed: " + _reason(err)
    return calls, notes


def check_outputs(calls: dict[str, Callable[[], Tensor]]) -> dict[str, float]:
    """Max abs difference of each column's output from the floor's (same seed before each)."""
    outs = {}
    for col, call in calls.items():
        torch.manual_seed(123)
        outs[col] = call().detach()
    ref = outs["floor"]
    return {col: float((o - ref).abs().max()) for col, o in outs.items() if col != "floor"}


# --- timing ------------------------------------------------------------------------------------


def measure(calls: dict[str, Callable[[], Tensor]], rounds: int, seconds: float,
            clock: Callable[[], int]) -> dict[str, dict]:
    """Interleaved rounds; per column the best and the median time per call (seconds)."""
    reps = {}
    for col, call in calls.items():  # warm-up and calibration: ~seconds per measurement
        t0 = time.perf_counter()
        n = 0
        while n < 3 or time.perf_counter() - t0 < seconds / 2:
            call()
            n += 1
        reps[col] = max(1, round(seconds / ((time.perf_counter() - t0) / n)))
    samples: dict[str, list[float]] = {c: [] for c in calls}
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            for col, call in calls.items():
                t0 = clock()
                for _ in range(reps[col]):
                    call()
                samples[col].append((clock() - t0) / 1e9 / reps[col])
    finally:
        gc.enable()
    return {c: {"best": min(s), "median": statistics.median(s), "calls": reps[c]} for c, s in samples.items()}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None else None


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="3 rounds of ~10 ms (a smoke run)")
    p.add_argument("--rows", default="*", help="comma-separated glob patterns of row names")
    p.add_argument("--rounds", type=int, default=None, help="default 15 (3 with --quick)")
    p.add_argument("--time", type=float, default=None, help="seconds per measurement (default 0.05)")
    p.add_argument("--stat", choices=("median", "best"), default="median")
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    p.add_argument("--no-compile", action="store_true", help="skip the compiled columns")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument("--json", default=None, help="also write the results to this file")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")  # TorchRL's deprecation notices would flood the table
    torch._logging.set_logs(dynamo=logging.ERROR)  # graph breaks are counted in the notes instead
    rounds = args.rounds or (3 if args.quick else 15)
    seconds = args.time or (0.01 if args.quick else 0.05)
    clock = time.process_time_ns if args.clock == "cpu" else time.perf_counter_ns
    patterns = args.rows.split(",")
    names = [r for r in ROWS if any(fnmatch.fnmatch(r, pat) for pat in patterns)]

    for col, err in IMPORT_ERRORS.items():
        print(f"[{col}] not importable: {err}", file=sys.stderr)
    versions = {"torch": torch.__version__, "python": platform.python_version()}
    for pkg in ("tensordict", "torchrl"):
        mod = sys.modules.get(pkg)
        if mod is not None:
            versions[pkg] = getattr(mod, "__version__", "?")
    print(", ".join(f"{k} {v}" for k, v in versions.items()) +
          f"; threads {args.threads}; {rounds} rounds x ~{seconds * 1e3:.0f} ms; {args.stat} of rounds, "
          f"{args.clock} clock; load average {os.getloadavg()[0]:.1f}", flush=True)

    results: dict[str, dict] = {}
    for name in names:
        row = ROWS[name]
        calls, notes = build_columns(row, not args.no_compile)
        diffs = check_outputs(calls)
        for col, diff in diffs.items():
            if row.exact and not diff < 1e-3:
                notes[col] = (notes.get(col, "") + f" output differs from the floor by {diff:.2g}").strip()
        timed = measure(calls, rounds, seconds, clock)
        us = {c: timed[c][args.stat] * 1e6 for c in timed}
        results[name] = {
            "us": us,
            "us_best": {c: t["best"] * 1e6 for c, t in timed.items()},
            "us_median": {c: t["median"] * 1e6 for c, t in timed.items()},
            "max_abs_diff_vs_floor": diffs,
            "notes": notes,
            "st/floor": _ratio(us.get("st"), us.get("floor")),
            "trl/st": _ratio(us.get("trl"), us.get("st")),
            "trl comp/st comp": _ratio(us.get("trl comp"), us.get("st comp")),
            "st/st comp": _ratio(us.get("st"), us.get("st comp")),
        }
        print(f"  {name} done", file=sys.stderr, flush=True)

    ratios = ("st/floor", "trl/st", "trl comp/st comp", "st/st comp")
    header = f"{'row':<11}" + "".join(f"{c + ' us':>12}" for c in COLUMNS) + "".join(f"{r:>17}" for r in ratios)
    print(header)
    print("-" * len(header))
    for name, res in results.items():
        cells = "".join(f"{res['us'][c]:>12.0f}" if c in res["us"] else f"{'n/a':>12}" for c in COLUMNS)
        rs = "".join(f"{res[r]:>17.2f}" if res[r] is not None else f"{'':>17}" for r in ratios)
        print(f"{name:<11}{cells}{rs}")
    print("(trl/st and trl comp/st comp above 1: steersman is faster; st/st comp above 1: compiling pays)")
    for name, res in results.items():
        for col, note in res["notes"].items():
            print(f"  {name} / {col}: {note}")

    out = {"meta": {**versions, "threads": args.threads, "rounds": rounds, "seconds": seconds,
                    "stat": args.stat, "clock": args.clock, "loadavg": os.getloadavg()},
           "results": results}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
