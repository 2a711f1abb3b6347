"""Makes the mctx reference outputs for tests/planning/test_mctx_parity.py.

Runs DeepMind's ``mctx`` (JAX) ``muzero_policy`` and ``gumbel_muzero_policy`` on fixed
inputs with a deterministic recurrent function defined by tables (no noise:
``dirichlet_fraction=0``, ``gumbel_scale=0``, ``temperature=0``) and writes the
inputs and outputs to ``tests/planning/data/mctx_reference.json``.

Needs ``jax`` and ``mctx``, kept out of the project venv::

    python3 -m venv /tmp/mctx-venv && /tmp/mctx-venv/bin/pip install jax mctx numpy
    /tmp/mctx-venv/bin/python benchmarks/planning_mctx_reference.py

The recurrent function: the embedding is a state id ``s`` (int32 ``[B]``); action
``a`` leads to ``next[s, a]`` with reward ``reward[s, a]`` and discount
``discount[s, a]``; the new node gets ``logits[next]`` and ``value[next]``.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import mctx
import numpy as np

OUT = Path(__file__).resolve().parent.parent / "tests" / "planning" / "data" / "mctx_reference.json"
NUM_STATES = 48


def make_tables(rng: np.random.Generator, num_actions: int, two_player: bool) -> dict:
    disc = -np.ones((NUM_STATES, num_actions)) if two_player else rng.uniform(0.8, 1.0, (NUM_STATES, num_actions))
    return {
        "next": rng.integers(0, NUM_STATES, (NUM_STATES, num_actions)).tolist(),
        "reward": rng.normal(0, 1, (NUM_STATES, num_actions)).astype(np.float32).tolist(),
        "discount": disc.astype(np.float32).tolist(),
        "logits": rng.normal(0, 1, (NUM_STATES, num_actions)).astype(np.float32).tolist(),
        "value": rng.normal(0, 1, NUM_STATES).astype(np.float32).tolist(),
    }


def run_case(case: dict) -> dict:
    t = {k: jnp.asarray(v, dtype=jnp.int32 if k == "next" else jnp.float32) for k, v in case["tables"].items()}

    def recurrent_fn(params, rng_key, action, embedding):
        nxt = t["next"][embedding, action]
        out = mctx.RecurrentFnOutput(reward=t["reward"][embedding, action],
                                     discount=t["discount"][embedding, action],
                                     prior_logits=t["logits"][nxt], value=t["value"][nxt])
        return out, nxt

    root_states = jnp.asarray(case["root_states"], dtype=jnp.int32)
    root = mctx.RootFnOutput(prior_logits=t["logits"][root_states], value=t["value"][root_states],
                             embedding=root_states)
    invalid = None if case["invalid_actions"] is None else jnp.asarray(case["invalid_actions"], dtype=jnp.float32)
    kw = dict(params=(), rng_key=jax.random.PRNGKey(0), root=root, recurrent_fn=recurrent_fn,
              num_simulations=case["num_simulations"], invalid_actions=invalid, max_depth=case["max_depth"])
    if case["policy"] == "muzero":
        qt = mctx.qtransform_by_parent_and_siblings
        if case.get("qtransform") == "min_max":
            qt = functools.partial(mctx.qtransform_by_min_max, min_value=-3.0, max_value=3.0)
        out = mctx.muzero_policy(**kw, qtransform=qt, dirichlet_fraction=0.0, temperature=0.0)
    else:
        out = mctx.gumbel_muzero_policy(**kw, max_num_considered_actions=case["max_num_considered_actions"],
                                        gumbel_scale=0.0)
    tree = out.search_tree
    summary = tree.summary()
    return {
        "action": np.asarray(out.action).tolist(),
        "action_weights": np.asarray(out.action_weights).tolist(),
        "visit_counts": np.asarray(summary.visit_counts).tolist(),
        "qvalues": np.asarray(summary.qvalues).tolist(),
        "value": np.asarray(summary.value).tolist(),
        "node_visits": np.asarray(tree.node_visits).tolist(),
        "node_values": np.asarray(tree.node_values).tolist(),
        "parents": np.asarray(tree.parents).tolist(),
        "action_from_parent": np.asarray(tree.action_from_parent).tolist(),
    }


def main() -> None:
    rng = np.random.default_rng(2026)
    cases = []
    specs = [
        # name, policy, B, A, sims, invalid, two_player, max_depth, extra
        ("muzero", "muzero", 3, 4, 24, False, False, None, {}),
        ("muzero_invalid", "muzero", 3, 5, 32, True, False, None, {}),
        ("muzero_two_player", "muzero", 2, 4, 32, False, True, None, {}),
        ("muzero_max_depth", "muzero", 2, 3, 16, False, False, 2, {}),
        ("muzero_min_max", "muzero", 2, 4, 20, False, False, None, {"qtransform": "min_max"}),
        ("gumbel", "gumbel", 3, 4, 24, False, False, None, {"max_num_considered_actions": 4}),
        ("gumbel_invalid", "gumbel", 3, 6, 32, True, False, None, {"max_num_considered_actions": 4}),
        ("gumbel_two_player", "gumbel", 2, 5, 32, False, True, None, {"max_num_considered_actions": 16}),
        ("gumbel_max_depth", "gumbel", 2, 4, 16, False, False, 3, {"max_num_considered_actions": 2}),
    ]
    for name, policy, b, a, sims, with_invalid, two_player, max_depth, extra in specs:
        invalid = None
        if with_invalid:
            inv = rng.random((b, a)) < 0.4
            inv[:, rng.integers(0, a)] = False  # at least one valid action per root
            invalid = inv.astype(int).tolist()
        case = {"name": name, "policy": policy, "num_simulations": sims, "max_depth": max_depth,
                "root_states": rng.integers(0, NUM_STATES, b).tolist(), "invalid_actions": invalid,
                "tables": make_tables(rng, a, two_player), **extra}
        case["expected"] = run_case(case)
        cases.append(case)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    meta = {"mctx": mctx.__version__, "jax": jax.__version__, "script": "benchmarks/planning_mctx_reference.py"}
    OUT.write_text(json.dumps({"meta": meta, "cases": cases}, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {len(cases)} cases to {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
