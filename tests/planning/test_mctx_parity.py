"""Parity with DeepMind's mctx: same inputs, same trees, visit counts, Q-values, actions.

The reference outputs come from benchmarks/planning_mctx_reference.py (mctx under JAX,
float32) and are stored in tests/planning/data/mctx_reference.json.
"""

from __future__ import annotations

import functools
import json
import warnings
from pathlib import Path

import pytest
import torch

from steersman.planning import (
    RecurrentFnOutput,
    RootFnOutput,
    gumbel_muzero_policy,
    muzero_policy,
    qtransform_by_min_max,
)

DATA = json.loads((Path(__file__).parent / "data" / "mctx_reference.json").read_text())
CASES = {c["name"]: c for c in DATA["cases"]}


def table_model(case: dict) -> tuple[RootFnOutput, object]:
    t = {k: torch.tensor(v, dtype=torch.int64 if k == "next" else torch.float32) for k, v in case["tables"].items()}

    def recurrent_fn(params, rng, action, embedding):
        nxt = t["next"][embedding, action]
        out = RecurrentFnOutput(reward=t["reward"][embedding, action], discount=t["discount"][embedding, action],
                                prior_logits=t["logits"][nxt], value=t["value"][nxt])
        return out, nxt

    s = torch.tensor(case["root_states"])
    return RootFnOutput(t["logits"][s], t["value"][s], s), recurrent_fn


def run(case: dict, **overrides):
    root, fn = table_model(case)
    inv = None if case["invalid_actions"] is None else torch.tensor(case["invalid_actions"], dtype=torch.bool)
    kw = dict(num_simulations=case["num_simulations"], invalid_actions=inv, max_depth=case["max_depth"])
    kw.update(overrides)
    gen = torch.Generator().manual_seed(0)
    if case["policy"] == "muzero":
        qt = {}
        if case.get("qtransform") == "min_max":
            qt = {"qtransform": functools.partial(qtransform_by_min_max, min_value=-3.0, max_value=3.0)}
        return muzero_policy((), gen, root, fn, **kw, dirichlet_fraction=0.0, temperature=0.0, **qt)
    return gumbel_muzero_policy((), gen, root, fn, **kw, gumbel_scale=0.0,
                                max_num_considered_actions=case["max_num_considered_actions"])


# compiled (backend="eager": dynamo captures each simulation, with its while_loop
# descent and backup, in one graph; eager kernels) on one case, Gumbel with a depth cut:
# tracing is slow; test_search.py checks compiled == eager for PUCT with TensorDict
# embeddings, invalid actions and two players
COMPILED = ["gumbel_max_depth"]
# the native tree loops (native_tree.c) on every case whose selection they implement (not
# the min-max Q transform)
NATIVE = [n for n in sorted(CASES) if CASES[n].get("qtransform") != "min_max"]
PARAMS = [(n, "eager") for n in sorted(CASES)] + [(n, "compiled") for n in COMPILED] + [(n, "native") for n in NATIVE]


@pytest.mark.parametrize(("name", "mode"), PARAMS, ids=[f"{n}-{m}" for n, m in PARAMS])
def test_matches_mctx(name, mode):
    case = CASES[name]
    exp = case["expected"]
    if mode == "compiled":
        torch._dynamo.utils.counters.clear()
        out = run(case, compile="eager")
        # one graph for all simulations (the first runs eagerly: it checks the model's outputs)
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    elif mode == "native":
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a fallback to the inductor path would warn
            out = run(case, compile="native")
    else:
        out = run(case)
    tree = out.search_tree
    s = tree.summary()
    # the whole tree: same nodes, in the same order, with the same statistics
    assert tree.parents.tolist() == exp["parents"]
    assert tree.action_from_parent.tolist() == exp["action_from_parent"]
    assert tree.node_visits.tolist() == exp["node_visits"]
    torch.testing.assert_close(tree.node_values, torch.tensor(exp["node_values"]), rtol=1e-5, atol=1e-5)
    assert s.visit_counts.tolist() == exp["visit_counts"]
    torch.testing.assert_close(s.qvalues, torch.tensor(exp["qvalues"]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s.value, torch.tensor(exp["value"]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.action_weights, torch.tensor(exp["action_weights"]), rtol=1e-5, atol=1e-6)
    if case["policy"] == "gumbel":
        assert out.action.tolist() == exp["action"]
    else:  # temperature 0: the most visited action (mctx breaks exact ties at random)
        vc = torch.tensor(exp["visit_counts"])
        unique = (vc == vc.amax(-1, keepdim=True)).sum(-1) == 1
        assert unique.any()
        assert out.action[unique].tolist() == torch.tensor(exp["action"])[unique].tolist()


def test_reference_covers_the_cases():
    """The data file has the variants the parity test is meant to cover."""
    names = set(CASES)
    assert {"muzero_invalid", "gumbel_invalid", "muzero_two_player", "gumbel_two_player"} <= names
    assert any(c["max_depth"] is not None for c in DATA["cases"])
    assert all(c["num_simulations"] >= 16 for c in DATA["cases"])
    # the two-player cases really use discount -1
    assert all(v == -1.0 for row in CASES["gumbel_two_player"]["tables"]["discount"] for v in row)


def test_a_different_model_breaks_parity():
    """The comparison is sensitive: perturbing one table entry changes the tree."""
    case = json.loads(json.dumps(CASES["muzero"]))
    s0 = case["root_states"][0]
    case["tables"]["reward"][s0] = [r + 5.0 * (i == 3) for i, r in enumerate(case["tables"]["reward"][s0])]
    out = run(case)
    assert out.search_tree.node_visits.tolist() != case["expected"]["node_visits"]
