"""Tree search throughput: steersman's ``muzero_policy`` / ``gumbel_muzero_policy`` vs mctx.

Simulations per second (``batch * num_simulations / time`` of one policy call) for
batches 1, 64, 256 and 1024 (``--batches``), 64 simulations, 8 actions, on the same small
MLP model (latent 16, hidden 32; dynamics ``[latent, one_hot(action)] -> [latent,
reward]``, prediction ``latent -> [logits, value]``, tanh), the same weights on both
sides, default policy settings (Dirichlet noise / Gumbel noise on).

Rows:

  steersman fn      the policy with a plain recurrent function on a tensor embedding.
  steersman tdm     the policy with ``recurrent_fn_from_model`` over two
                    ``TensorDictModule``\\ s (TensorDict embeddings).
  steersman native  the plain-fn policy with ``compile="native"``: the descent, expansion
                    writes and backup as C loops over the trees (planning/native_tree.c),
                    the recurrent function called eagerly once per simulation in between
                    (``compile=True`` takes this path on the CPU since session 15).
  steersman compiled  the plain-fn policy with ``compile={"native": False}`` (before
                    session 15: ``compile=True``): the whole search (every
                    simulation after the first) as one inductor graph (inductor options
                    ``search.SEARCH_INDUCTOR_OPTIONS``; paths ``PATH_WIDTH`` wide while the
                    trees are shallower, then a full-width graph), an outer
                    ``while_loop`` over simulations that writes the tree in place, with
                    the ``while_loop`` descent and backup inside (from B=256 the
                    descent's last levels run on the trees still descending only). The
                    first call per batch (the compile) is reported separately as
                    ``compile_s``.
  steersman compiled cpp  the same with inductor's C++ wrapper
                    (``compile={"options": {"cpp_wrapper": True}}``, plus the search's
                    inductor options): the loops run in
                    C++ instead of the generated Python wrapper (correct since session
                    12: every compiled loop runs its body at least once, around a torch
                    2.13 bug of that wrapper; see ``search._while``).

Compiled and native rows are checked against the eager search (the eager row of the same batch, or
else one untimed eager search; ``--no-check`` skips those): same seed, same root visit
counts and parents (``equals eager``), or ``WRONG``.
  mctx jit          mctx's policy under ``jax.jit`` (compile time excluded), run in a
                    separate interpreter: ``MCTX_PYTHON=<venv with jax, mctx>/bin/python``
                    (a venv with ``jax mctx numpy``; the row is skipped without it).

Timing: one thread on each side (torch.set_num_threads(1); XLA's CPU client with
``--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1``), one warm-up
call, then the median of ``--repeats`` calls in process CPU time (``--wall``: wall
clock).

    python benchmarks/planning.py [--batches 1,64,256,1024] [--repeats 5] [--no-compile] [--no-cpp] [--no-native]
                                  [--eager-max-batch 64] [--policies muzero,gumbel_muzero] [--json out.json]
    MCTX_PYTHON=<venv with jax, mctx>/bin/python python benchmarks/planning.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
import traceback

import numpy as np

NUM_ACTIONS, LATENT, HIDDEN, NUM_SIMULATIONS = 8, 16, 32, 64


def make_weights(seed: int = 0) -> dict[str, np.ndarray]:
    r = np.random.default_rng(seed)

    def lin(i: int, o: int) -> tuple[np.ndarray, np.ndarray]:
        return (r.normal(0, 1 / np.sqrt(i), (i, o)).astype(np.float32), np.zeros(o, np.float32))

    w = {}
    w["d1w"], w["d1b"] = lin(LATENT + NUM_ACTIONS, HIDDEN)
    w["d2w"], w["d2b"] = lin(HIDDEN, LATENT + 1)
    w["p1w"], w["p1b"] = lin(LATENT, HIDDEN)
    w["p2w"], w["p2b"] = lin(HIDDEN, NUM_ACTIONS + 1)
    w["root"] = r.normal(0, 1, (1024, LATENT)).astype(np.float32)
    return w


def _timer(wall: bool):
    return time.perf_counter if wall else time.process_time


# ---------------------------------------------------------------------- steersman
CPP = {"backend": "inductor", "options": {"cpp_wrapper": True}}


def steersman_rows(w: dict, batches: list[int], repeats: int, wall: bool, compiled: bool = True,
                   eager_max_batch: int = 1 << 30, cpp: bool = True, check_all: bool = True,
                   policies: tuple[str, ...] = ("muzero", "gumbel_muzero"), native: bool = True) -> list[dict]:
    import torch
    from torch import nn

    from steersman.planning import (
        RecurrentFnOutput,
        RootFnOutput,
        gumbel_muzero_policy,
        muzero_policy,
        recurrent_fn_from_model,
    )
    from steersman.tensordict import TensorDict
    from steersman.tensordict.nn import TensorDictModule

    torch.set_num_threads(1)
    t = {k: torch.from_numpy(v) for k, v in w.items()}

    def dyn(latent, action_onehot):
        h = torch.tanh(torch.cat([latent, action_onehot], -1) @ t["d1w"] + t["d1b"])
        out = h @ t["d2w"] + t["d2b"]
        return torch.tanh(out[..., :LATENT]), out[..., LATENT]

    def pred(latent):
        out = torch.tanh(latent @ t["p1w"] + t["p1b"]) @ t["p2w"] + t["p2b"]
        return out[..., :NUM_ACTIONS], out[..., NUM_ACTIONS]

    eye = torch.eye(NUM_ACTIONS)

    def plain_fn(params, rng, action, latent):
        nxt, reward = dyn(latent, eye[action])
        logits, value = pred(nxt)
        return RecurrentFnOutput(reward, torch.ones_like(reward), logits, value), nxt

    class Mod(nn.Module):
        def __init__(self, f):
            super().__init__()
            self.f = f

        def forward(self, *xs):
            return self.f(*xs)

    tdm_fn = recurrent_fn_from_model(
        TensorDictModule(Mod(dyn), in_keys=["latent", "action"], out_keys=["latent", "reward"]),
        TensorDictModule(Mod(pred), in_keys=["latent"], out_keys=["prior_logits", "value"]),
        latent_keys=["latent"], num_actions=NUM_ACTIONS)

    rows = []
    clock = _timer(wall)
    first_out = {}  # (policy, batch) -> the eager plain-fn policy's first output (same seed)
    for b in batches:
        latent = t["root"][:b]
        logits, value = pred(latent)
        variants = {}
        if b <= eager_max_batch:
            variants["steersman fn"] = (plain_fn, RootFnOutput(logits, value, latent), False)
            variants["steersman tdm"] = (tdm_fn, RootFnOutput(logits, value, TensorDict({"latent": latent},
                                                                                         batch_size=[b])), False)
        if native:
            variants["steersman native"] = (plain_fn, RootFnOutput(logits, value, latent), "native")
        if compiled:
            variants["steersman compiled"] = (plain_fn, RootFnOutput(logits, value, latent), {"native": False})
            if cpp:
                variants["steersman compiled cpp"] = (plain_fn, RootFnOutput(logits, value, latent), CPP)
        for name, (fn, root, comp) in variants.items():
            for pol_name, pol in (("muzero", muzero_policy), ("gumbel_muzero", gumbel_muzero_policy)):
                if pol_name not in policies:
                    continue
                gen = torch.Generator().manual_seed(0)
                times = []
                try:
                    with torch.no_grad():
                        for i in range(repeats + 1):
                            t0 = clock()
                            out = pol(None, gen, root, fn, NUM_SIMULATIONS, compile=comp)
                            dt = clock() - t0
                            if i:
                                times.append(dt)
                            else:
                                first, first_tree = dt, out.search_tree
                except Exception as e:  # noqa: BLE001  (report the failure as the row, its traceback on stderr)
                    traceback.print_exc()
                    rows.append({"impl": name, "policy": pol_name, "batch": b, "error": f"{type(e).__name__}: "
                                 f"{str(e).strip().splitlines()[-1][:120]}"})
                    continue
                assert int(out.search_tree.node_visits[0, 0]) == NUM_SIMULATIONS + 1
                med = statistics.median(times)
                row = {"impl": name, "policy": pol_name, "batch": b, "seconds": med,
                       "sims_per_s": b * NUM_SIMULATIONS / med}
                if comp:
                    row["compile_s"] = first - med
                # the compiled rows must compute the eager search's tree (same seed, same draws)
                ref = first_out.setdefault((pol_name, b), first_tree) if name == "steersman fn" \
                    else first_out.get((pol_name, b))
                if comp and ref is None and check_all:  # no eager row at this batch: one untimed eager search
                    with torch.no_grad():
                        ref = pol(None, torch.Generator().manual_seed(0), root, fn, NUM_SIMULATIONS).search_tree
                    first_out[(pol_name, b)] = ref
                if comp and ref is not None:
                    row["equals_eager"] = bool(torch.equal(ref.children_visits, first_tree.children_visits)
                                               and torch.equal(ref.parents, first_tree.parents))
                rows.append(row)
    return rows


# ---------------------------------------------------------------------- mctx (worker)
def mctx_worker(weights_path: str, batches: list[int], repeats: int, wall: bool,
                policies: tuple[str, ...] = ("muzero", "gumbel_muzero")) -> list[dict]:
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    import jax
    import jax.numpy as jnp
    import mctx

    w = {k: jnp.asarray(v) for k, v in np.load(weights_path).items()}

    def dyn(latent, action_onehot):
        h = jnp.tanh(jnp.concatenate([latent, action_onehot], -1) @ w["d1w"] + w["d1b"])
        out = h @ w["d2w"] + w["d2b"]
        return jnp.tanh(out[..., :LATENT]), out[..., LATENT]

    def pred(latent):
        out = jnp.tanh(latent @ w["p1w"] + w["p1b"]) @ w["p2w"] + w["p2b"]
        return out[..., :NUM_ACTIONS], out[..., NUM_ACTIONS]

    def recurrent_fn(params, rng_key, action, latent):
        nxt, reward = dyn(latent, jax.nn.one_hot(action, NUM_ACTIONS))
        logits, value = pred(nxt)
        return mctx.RecurrentFnOutput(reward=reward, discount=jnp.ones_like(reward), prior_logits=logits,
                                      value=value), nxt

    rows = []
    clock = _timer(wall)
    for b in batches:
        for pol_name, pol in (("muzero", mctx.muzero_policy), ("gumbel_muzero", mctx.gumbel_muzero_policy)):
            if pol_name not in policies:
                continue

            def run(key, latent, pol=pol):
                logits, value = pred(latent)
                root = mctx.RootFnOutput(prior_logits=logits, value=value, embedding=latent)
                return pol(params=(), rng_key=key, root=root, recurrent_fn=recurrent_fn,
                           num_simulations=NUM_SIMULATIONS)

            f = jax.jit(run)
            latent = w["root"][:b]
            key = jax.random.PRNGKey(0)
            jax.block_until_ready(f(key, latent))  # compile
            times = []
            for _ in range(repeats):
                key, sub = jax.random.split(key)
                t0 = clock()
                jax.block_until_ready(f(sub, latent))
                times.append(clock() - t0)
            med = statistics.median(times)
            rows.append({"impl": "mctx jit", "policy": pol_name, "batch": b, "seconds": med,
                         "sims_per_s": b * NUM_SIMULATIONS / med})
    return rows


def mctx_rows(w: dict, batches: list[int], repeats: int, wall: bool,
              policies: tuple[str, ...] = ("muzero", "gumbel_muzero")) -> tuple[list[dict], str | None]:
    py = os.environ.get("MCTX_PYTHON")
    if not py:
        return [], "mctx jit: skipped (set MCTX_PYTHON to a python with jax and mctx)"
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "w.npz")
        np.savez(path, **w)
        cmd = [py, os.path.abspath(__file__), "--mctx-worker", path, "--batches", ",".join(map(str, batches)),
               "--repeats", str(repeats), "--policies", ",".join(policies)] + (["--wall"] if wall else [])
        res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        return [], f"mctx jit: failed ({res.stderr.strip().splitlines()[-1] if res.stderr.strip() else res.returncode})"
    return json.loads(res.stdout.strip().splitlines()[-1]), None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,64,256,1024")
    ap.add_argument("--no-compile", action="store_true", help="skip the compiled rows")
    ap.add_argument("--no-cpp", action="store_true", help="skip the cpp_wrapper rows")
    ap.add_argument("--no-native", action="store_true", help="skip the native rows")
    ap.add_argument("--eager-max-batch", type=int, default=1 << 30, help="skip the eager rows above this batch")
    ap.add_argument("--no-check", action="store_true",
                    help="skip the untimed eager search that checks compiled rows without an eager row")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--policies", default="muzero,gumbel_muzero", help="comma-separated subset of the default")
    ap.add_argument("--wall", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--mctx-worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    batches = [int(x) for x in args.batches.split(",")]
    policies = tuple(args.policies.split(","))
    bad = set(policies) - {"muzero", "gumbel_muzero"}
    if bad:
        ap.error(f"--policies: unknown {sorted(bad)} (muzero, gumbel_muzero)")
    if args.mctx_worker:
        print(json.dumps(mctx_worker(args.mctx_worker, batches, args.repeats, args.wall, policies)))
        return
    w = make_weights()
    rows, note = mctx_rows(w, batches, args.repeats, args.wall, policies)
    rows = steersman_rows(w, batches, args.repeats, args.wall, not args.no_compile, args.eager_max_batch,
                          not args.no_cpp, not args.no_check, policies, not args.no_native) + rows
    print(f"{'impl':<23} {'policy':<14} {'batch':>6} {'sims/s':>12} {'ms/call':>10} {'compile s':>10}")
    for r in sorted(rows, key=lambda r: (r["policy"], r["batch"], r["impl"])):
        if "error" in r:
            print(f"{r['impl']:<23} {r['policy']:<14} {r['batch']:>6} failed: {r['error']}")
            continue
        cs = f"{r['compile_s']:.1f}" if "compile_s" in r else ""
        eq = {True: "equals eager", False: "WRONG: differs from eager"}.get(r.get("equals_eager"), "")
        print(f"{r['impl']:<23} {r['policy']:<14} {r['batch']:>6} {r['sims_per_s']:>12,.0f} "
              f"{1e3 * r['seconds']:>10.1f} {cs:>10}  {eq}")
    if note:
        print(note)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
