"""The native tree loops (planning/native_tree.c via planning/native.py): every tree equals
the eager search's, the fallback when they cannot be built, the build cache."""

from __future__ import annotations

import functools
import importlib
import shutil
import warnings

import pytest
import torch

from steersman.planning import (
    RecurrentFnOutput,
    RootFnOutput,
    gumbel_muzero_policy,
    muzero_policy,
    qtransform_completed_by_mix_value,
    search,
)
from steersman.planning import native as nat
from steersman.planning.action_selection import gumbel_muzero_interior_action_selection
from steersman.tensordict import TensorDict

search_module = importlib.import_module("steersman.planning.search")  # the module, not the function

S, A = 48, 6
FIELDS = ("node_visits", "raw_values", "node_values", "parents", "action_from_parent", "depth", "children_index",
          "children_prior_logits", "children_visits", "children_rewards", "children_discounts", "children_values")


def tables(seed: int, two_player: bool = False) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "next": torch.randint(0, S, (S, A), generator=g),
        "reward": torch.randn(S, A, generator=g),
        "discount": -torch.ones(S, A) if two_player else 0.8 + 0.2 * torch.rand(S, A, generator=g),
        "logits": 2 * torch.randn(S, A, generator=g),
        "value": torch.randn(S, generator=g),
    }


def model(t: dict, td: bool = False):
    """A deterministic table model; the embedding is a state id (or a TensorDict with it,
    a float row and a nested entry)."""

    def recurrent_fn(params, rng, action, embedding):
        s = embedding["s"] if td else embedding
        nxt = t["next"][s, action]
        out = RecurrentFnOutput(t["reward"][s, action], t["discount"][s, action], t["logits"][nxt], t["value"][nxt])
        if not td:
            return out, nxt
        return out, TensorDict({"s": nxt, "x": t["logits"][nxt], "n": {"v": t["value"][nxt].double()}},
                               batch_size=nxt.shape)

    return recurrent_fn


def root_for(t: dict, states: torch.Tensor, td: bool = False) -> RootFnOutput:
    emb = states
    if td:
        emb = TensorDict({"s": states, "x": t["logits"][states], "n": {"v": t["value"][states].double()}},
                         batch_size=states.shape)
    return RootFnOutput(t["logits"][states], t["value"][states], emb)


def policy_run(policy: str, seed: int, batch: int, max_depth: int | None, invalid: bool, two_player: bool,
               td: bool, compile, sims: int = 24):
    t = tables(seed, two_player)
    states = torch.randint(0, S, (batch,), generator=torch.Generator().manual_seed(seed + 100))
    inv = None
    if invalid:
        inv = torch.rand(batch, A, generator=torch.Generator().manual_seed(seed + 200)) < 0.4
        inv[:, seed % A] = False  # every root keeps a valid action
    gen = torch.Generator().manual_seed(seed)
    fn = gumbel_muzero_policy if policy == "gumbel" else muzero_policy
    return fn((), gen, root_for(t, states, td), model(t, td), sims, invalid_actions=inv, max_depth=max_depth,
              compile=compile)


def assert_same(eager, native) -> None:
    """Equal trees (every array, values bitwise: the model runs eagerly in both), actions
    and weights."""
    for f in FIELDS:
        assert torch.equal(getattr(eager.search_tree, f), getattr(native.search_tree, f)), f
    for k in eager.search_tree.embeddings.keys(include_nested=True, leaves_only=True):
        assert torch.equal(eager.search_tree.embeddings.get(k), native.search_tree.embeddings.get(k)), k
    assert torch.equal(eager.action, native.action)
    assert torch.equal(eager.action_weights, native.action_weights)


CASES = [(policy, seed, batch, depth, invalid, two, td)
         for policy in ("gumbel", "muzero")
         for seed, batch, depth, invalid, two, td in [
             (0, 1, None, False, False, False), (1, 3, 2, True, False, False), (2, 40, None, True, True, True),
             (3, 64, None, False, False, False), (4, 64, 3, True, True, False), (5, 64, None, True, False, True),
             (6, 256, None, True, True, False), (7, 256, 4, False, False, True)]]


@pytest.mark.parametrize(("policy", "seed", "batch", "max_depth", "invalid", "two_player", "td"), CASES)
def test_native_trees_equal_eager(policy, seed, batch, max_depth, invalid, two_player, td):
    eager = policy_run(policy, seed, batch, max_depth, invalid, two_player, td, False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback
        native = policy_run(policy, seed, batch, max_depth, invalid, two_player, td, "native")
    assert_same(eager, native)
    tree = native.search_tree
    assert int(tree.depth.amax()) >= 2
    if max_depth is not None:
        assert int(tree.depth.amax()) <= max_depth
    if invalid:
        root_visits = tree.children_visits[:, 0]
        inv = torch.rand(batch, A, generator=torch.Generator().manual_seed(seed + 200)) < 0.4
        inv[:, seed % A] = False
        assert not bool((root_visits[inv] > 0).any())


def test_native_max_depth_reevaluates_expanded_nodes():
    """With max_depth 1 and more simulations than actions, later simulations stop on an
    expanded root child and re-evaluate it (mctx's rule), as the eager search does."""
    eager = policy_run("muzero", 3, 5, 1, False, False, False, False, sims=20)
    native = policy_run("muzero", 3, 5, 1, False, False, False, "native", sims=20)
    assert_same(eager, native)
    assert int(native.search_tree.children_visits[:, 0].sum(-1).amin()) == 20


@pytest.mark.parametrize("policy", ["gumbel", "muzero"])
def test_native_with_a_compiled_model_equals_eager(policy):
    """``compile={"native": True, <torch.compile keywords>}`` compiles the model call (here
    dynamo with the eager backend: the same kernels, so the same tree bit for bit)."""
    eager = policy_run(policy, 9, 8, None, True, False, True, False)
    native = policy_run(policy, 9, 8, None, True, False, True, {"native": True, "backend": "eager"})
    assert_same(eager, native)


def test_gumbel_qtransform_keywords_reach_the_native_loops():
    """Non-default keywords of the mixed-value transform change the tree the same way."""
    t = tables(11)
    states = torch.arange(16) % S
    qt = functools.partial(qtransform_completed_by_mix_value, value_scale=0.5, maxvisit_init=10.0,
                           use_mixed_value=False)
    outs = [gumbel_muzero_policy((), torch.Generator().manual_seed(0), root_for(t, states), model(t), 24,
                                 qtransform=qt, compile=c) for c in (False, "native")]
    assert_same(*outs)
    default = gumbel_muzero_policy((), torch.Generator().manual_seed(0), root_for(t, states), model(t), 24)
    assert not torch.equal(default.search_tree.children_visits, outs[1].search_tree.children_visits)


def test_native_selection_recognises_only_the_builtin_functions():
    t = tables(1)
    interior = functools.partial(gumbel_muzero_interior_action_selection,
                                 qtransform=qtransform_completed_by_mix_value)
    assert nat.native_selection(lambda u, tr, n: interior(u, tr, n, 0), interior) is None
    root = root_for(t, torch.tensor([0, 1]))
    with pytest.warns(UserWarning, match="native tree loops not used .*selection functions"):
        tree = search((), None, root, model(t), lambda u, tr, n: interior(u, tr, n, 0), interior, 6,
                      compile={"native": True, "backend": "eager"})
    ref = search((), None, root, model(t), lambda u, tr, n: interior(u, tr, n, 0), interior, 6)
    assert torch.equal(tree.children_visits, ref.children_visits)


def test_compile_true_uses_the_native_loops_and_native_false_the_graph(monkeypatch):
    calls = []
    real = nat.run_native
    monkeypatch.setattr(nat, "run_native", lambda *a, **k: calls.append(a[1].batch_size) or real(*a, **k))
    eager = policy_run("gumbel", 2, 3, None, True, False, False, False)
    native = policy_run("gumbel", 2, 3, None, True, False, False, True)
    assert calls == [3]
    assert_same(eager, native)
    # compile={"native": False}: the inductor path (not run here)
    monkeypatch.setattr(search_module, "compiled_search", lambda *a: (_ for _ in ()).throw(RuntimeError("inductor")))
    with pytest.raises(RuntimeError, match="inductor"):
        policy_run("gumbel", 2, 3, None, True, False, False, {"native": False})
    assert calls == [3]


def test_a_failed_build_warns_and_falls_back(monkeypatch, tmp_path):
    """No C compiler: a one-line warning saying why, and the compiled path's tree."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(nat, "COMPILER", str(tmp_path / "no-such-cc"))
    eager = policy_run("gumbel", 5, 4, None, False, False, False, False, sims=8)
    with pytest.warns(UserWarning, match=r"native tree loops not used \(C compiler .*no-such-cc.* not runnable"):
        fallback = policy_run("gumbel", 5, 4, None, False, False, False, {"native": True, "backend": "eager"},
                              sims=8)
    assert torch.equal(eager.search_tree.children_visits, fallback.search_tree.children_visits)
    assert torch.equal(eager.search_tree.parents, fallback.search_tree.parents)
    assert not list(tmp_path.glob("**/*.so"))
    with pytest.raises(nat.NativeUnavailable, match="no-such-cc"):  # remembered, not retried
        nat.load()


def test_build_caches_by_source_and_rebuilds_on_change(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "tree.c"
    shutil.copy(nat.SOURCE, src)
    first = nat.build(src)
    assert first.parent == tmp_path / "cache" / "steersman_native" and first.exists()
    stamp = first.stat().st_mtime_ns
    assert nat.build(src) == first and first.stat().st_mtime_ns == stamp  # cached: not rebuilt
    src.write_text(src.read_text() + "\n/* changed */\n")
    second = nat.build(src)
    assert second != first and second.exists()
    lib = nat.load(src)
    assert hasattr(lib, "steersman_descend")
    assert not list((tmp_path / "cache" / "steersman_native").glob("*.tmp*"))
    src.write_text(src.read_text() + "\nthis is not C\n")
    with pytest.raises(nat.NativeUnavailable, match="failed"):
        nat.build(src)


def test_native_checks_the_recurrent_function():
    """A bad recurrent function raises the eager search's error before any tree write, and a
    later wrong shape raises instead of reading past the outputs."""
    t = tables(3)
    fn = model(t)
    root = root_for(t, torch.tensor([0, 1, 2]))

    def bad(params, rng, action, emb):
        out, nxt = fn(params, rng, action, emb)
        return out._replace(value=out.value[:2]), nxt

    with pytest.raises(ValueError, match=r"recurrent_fn returned value of shape \[2\], expected \[3\]"):
        gumbel_muzero_policy((), None, root, bad, 8, compile="native")
    calls = []

    def late(params, rng, action, emb):
        calls.append(1)
        out, nxt = fn(params, rng, action, emb)
        return (out._replace(prior_logits=out.prior_logits[:, :2]) if len(calls) == 3 else out), nxt

    with pytest.raises(ValueError, match=r"prior_logits of shape \[3, 2\] on cpu at simulation 2"):
        gumbel_muzero_policy((), None, root, late, 8, compile="native")
    calls.clear()

    def elsewhere(params, rng, action, emb):  # a tensor not in CPU memory: never read as such
        calls.append(1)
        out, nxt = fn(params, rng, action, emb)
        return (out._replace(value=out.value.to("meta")) if len(calls) == 3 else out), nxt

    with pytest.raises(ValueError, match=r"value of shape \[3\] on meta at simulation 2, expected \[3\] on the CPU"):
        gumbel_muzero_policy((), None, root, elsewhere, 8, compile="native")
