"""Search behaviour: invalid actions, batching, bad input, noise, compile."""

from __future__ import annotations

import functools

import pytest
import torch

from steersman.planning import (
    PolicyOutput,
    RecurrentFnOutput,
    RootFnOutput,
    Tree,
    gumbel_muzero_policy,
    muzero_policy,
    qtransform_completed_by_mix_value,
    search,
)
from steersman.planning.action_selection import (
    gumbel_muzero_interior_action_selection,
    muzero_action_selection,
)
from steersman.planning.search import _backup_returns, first_ancestors, simulate_once
from steersman.planning.tree import instantiate_tree
from steersman.tensordict import TensorDict

S, A = 32, 5


def tables(seed: int = 0, two_player: bool = False) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "next": torch.randint(0, S, (S, A), generator=g),
        "reward": torch.randn(S, A, generator=g),
        "discount": -torch.ones(S, A) if two_player else 0.9 + 0.1 * torch.rand(S, A, generator=g),
        "logits": torch.randn(S, A, generator=g),
        "value": torch.randn(S, generator=g),
    }


def model(t: dict, td_embedding: bool = False):
    """Deterministic table model; the embedding is a state id (or a TensorDict holding it)."""

    def recurrent_fn(params, rng, action, embedding):
        s = embedding["s"] if td_embedding else embedding
        nxt = t["next"][s, action]
        out = RecurrentFnOutput(t["reward"][s, action], t["discount"][s, action], t["logits"][nxt], t["value"][nxt])
        emb = TensorDict({"s": nxt, "x": t["logits"][nxt]}, batch_size=nxt.shape) if td_embedding else nxt
        return out, emb

    return recurrent_fn


def root_for(t: dict, states: torch.Tensor, td_embedding: bool = False) -> RootFnOutput:
    emb = TensorDict({"s": states, "x": t["logits"][states]}, batch_size=states.shape) if td_embedding else states
    return RootFnOutput(t["logits"][states], t["value"][states], emb)


POLICIES = {
    "muzero": functools.partial(muzero_policy, dirichlet_fraction=0.25, temperature=1.0),
    "gumbel": functools.partial(gumbel_muzero_policy, max_num_considered_actions=4),
}


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_invalid_actions_never_chosen(policy):
    t = tables(1)
    b = 16
    g = torch.Generator().manual_seed(3)
    invalid = torch.rand(b, A, generator=g) < 0.6
    invalid[torch.arange(b), torch.randint(0, A, (b,), generator=g)] = False
    # make the invalid actions look best to the model
    root = root_for(t, torch.randint(0, S, (b,), generator=g))
    root = root._replace(prior_logits=torch.where(invalid, 10.0, root.prior_logits))
    for seed in range(3):
        out = POLICIES[policy]((), torch.Generator().manual_seed(seed), root, model(t), 24, invalid_actions=invalid)
        assert not invalid[torch.arange(b), out.action].any()
        root_visits = out.search_tree.children_visits[:, 0]
        assert (root_visits[invalid] == 0).all()
        assert (out.action_weights[invalid] == 0).all()
        assert root_visits.sum().item() == b * 24


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("td_embedding", [False, True])
def test_batched_equals_one_by_one(policy, td_embedding):
    t = tables(2, two_player=policy == "gumbel")
    b = 5
    states = torch.randint(0, S, (b,), generator=torch.Generator().manual_seed(0))
    invalid = torch.zeros(b, A, dtype=torch.bool)
    invalid[1, :3] = True
    fn = POLICIES[policy]
    kw = dict(dirichlet_fraction=0.0) if policy == "muzero" else dict(gumbel_scale=0.0)
    kw["temperature" if policy == "muzero" else "max_num_considered_actions"] = 0.0 if policy == "muzero" else 4
    full = fn((), torch.Generator().manual_seed(0), root_for(t, states, td_embedding), model(t, td_embedding), 20,
              invalid_actions=invalid, **kw)
    for i in range(b):
        one = fn((), torch.Generator().manual_seed(0), root_for(t, states[i:i + 1], td_embedding),
                 model(t, td_embedding), 20, invalid_actions=invalid[i:i + 1], **kw)
        a, c = full.search_tree, one.search_tree
        assert torch.equal(a.children_visits[i], c.children_visits[0])
        assert torch.equal(a.parents[i], c.parents[0])
        torch.testing.assert_close(a.node_values[i], c.node_values[0])
        torch.testing.assert_close(full.action_weights[i], one.action_weights[0])
        if td_embedding:
            assert torch.equal(a.embeddings["s"][i], c.embeddings["s"][0])
        assert full.action[i] == one.action[0]


def test_tree_contents_are_consistent():
    t = tables(4)
    out = muzero_policy((), torch.Generator().manual_seed(0), root_for(t, torch.tensor([3, 7])), model(t), 30,
                        dirichlet_fraction=0.0)
    tree = out.search_tree
    assert isinstance(tree, Tree) and isinstance(out, PolicyOutput)
    # every node has been expanded once and its visits are 1 + the visits of its children
    assert (tree.node_visits[:, 1:] >= 1).all()
    torch.testing.assert_close(tree.node_visits, 1 + tree.children_visits.sum(-1).int())
    assert tree.node_visits[:, 0].tolist() == [31, 31]
    # the embedding of a child is the model's next state from its parent
    b, n = torch.meshgrid(torch.arange(2), torch.arange(1, 31), indexing="ij")
    p, a = tree.parents[b, n], tree.action_from_parent[b, n]
    assert torch.equal(tree.embeddings["embedding"][b, n], t["next"][tree.embeddings["embedding"][b, p], a])
    assert torch.equal(tree.depth[b, n], tree.depth[b, p] + 1)
    td = out.to_tensordict()
    assert td.batch_size == torch.Size([2]) and td["search_tree", "node_visits"].shape == (2, 31)
    summary = tree.summary()
    torch.testing.assert_close(summary.visit_probs.sum(-1), torch.ones(2))
    torch.testing.assert_close(summary.qvalues, tree.qvalues(torch.zeros(2, dtype=torch.long)))


def test_dirichlet_noise_and_temperature_use_the_generator():
    t = tables(5)
    root = root_for(t, torch.arange(8))
    a = muzero_policy((), torch.Generator().manual_seed(1), root, model(t), 16)
    b = muzero_policy((), torch.Generator().manual_seed(1), root, model(t), 16)
    c = muzero_policy((), torch.Generator().manual_seed(2), root, model(t), 16)
    assert torch.equal(a.search_tree.children_visits, b.search_tree.children_visits)
    assert not torch.equal(a.search_tree.children_visits, c.search_tree.children_visits)
    # noise mixes the prior with a probability vector: the root logits are log-probabilities
    torch.testing.assert_close(a.search_tree.children_prior_logits[:, 0].exp().sum(-1), torch.ones(8))


def test_gumbel_noise_changes_the_search():
    t = tables(6)
    root = root_for(t, torch.arange(8))
    outs = [gumbel_muzero_policy((), torch.Generator().manual_seed(s), root, model(t), 16,
                                 max_num_considered_actions=2) for s in range(2)]
    assert not torch.equal(outs[0].search_tree.children_visits, outs[1].search_tree.children_visits)


# ---------------------------------------------------------------------- bad input
def good_root(t=None) -> RootFnOutput:
    t = t or tables(0)
    return root_for(t, torch.tensor([1, 2, 3]))


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("mutate, match", [
    (lambda r: r._replace(prior_logits=r.prior_logits[0]), r"root\.prior_logits must be a float tensor \[B, num"),
    (lambda r: r._replace(prior_logits=r.prior_logits.long()), r"root\.prior_logits .*dtype torch\.int64"),
    (lambda r: r._replace(value=r.value[:2]), r"root\.value must be a float tensor \[B\] = \[3\].*got \[2\]"),
    (lambda r: r._replace(value=r.value[:, None]), r"root\.value .*got \[3, 1\]"),
    (lambda r: r._replace(embedding=r.embedding[:2]), r"root\.embedding must have shape \[3, \.\.\.\], got \[2\]"),
    (lambda r: r._replace(embedding=[1, 2, 3]), r"root\.embedding must be a TensorDict or a tensor, got list"),
    (lambda r: tuple(r), r"root must be a RootFnOutput"),
])
def test_bad_root_raises_before_search(policy, mutate, match):
    calls = []

    def fn(*args):
        calls.append(1)
        return model(tables(0))(*args)

    with pytest.raises((ValueError, TypeError), match=match):
        POLICIES[policy]((), None, mutate(good_root()), fn, 8)
    assert not calls


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("kw, match", [
    ({"num_simulations": 0}, r"num_simulations must be an int >= 1, got 0"),
    ({"num_simulations": 2.0}, r"num_simulations must be an int >= 1, got 2\.0"),
    ({"num_simulations": 4, "max_depth": 0}, r"max_depth must be None or an int >= 1, got 0"),
    ({"num_simulations": 4, "invalid_actions": torch.zeros(3, 4, dtype=torch.bool)},
     r"invalid_actions must be a tensor \[B, num_actions\] = \[3, 5\], got \[3, 4\]"),
    ({"num_simulations": 4, "invalid_actions": torch.tensor([[0, 0, 0, 0, 0], [1, 1, 1, 1, 1], [0] * 5])},
     r"every action is invalid at the roots \[1\]"),
])
def test_bad_arguments_raise(policy, kw, match):
    calls = []

    def fn(*args):
        calls.append(1)
        return model(tables(0))(*args)

    with pytest.raises(ValueError, match=match):
        POLICIES[policy]((), None, good_root(), fn, **kw)
    assert not calls


def test_bad_max_num_considered_actions():
    with pytest.raises(ValueError, match="max_num_considered_actions must be an int >= 1, got 0"):
        gumbel_muzero_policy((), None, good_root(), model(tables(0)), 4, max_num_considered_actions=0)


def _wrong(kind):
    t = tables(0)
    base = model(t)

    def fn(params, rng, action, emb):
        out, nxt = base(params, rng, action, emb)
        if kind == "not_a_pair":
            return out
        if kind == "plain_tuple":
            return tuple(out), nxt
        if kind == "logits":
            return out._replace(prior_logits=out.prior_logits[:, :2]), nxt
        if kind == "reward":
            return out._replace(reward=out.reward[:, None]), nxt
        if kind == "embedding":
            return out, nxt[:, None]
        raise AssertionError(kind)

    return fn


@pytest.mark.parametrize("kind, match", [
    ("not_a_pair", r"recurrent_fn must return \(RecurrentFnOutput.*got RecurrentFnOutput"),
    ("plain_tuple", r"recurrent_fn must return .*got tuple of \['tuple', 'Tensor'\]"),
    ("logits", r"recurrent_fn returned prior_logits of shape \[3, 2\], expected \[3, 5\]"),
    ("reward", r"recurrent_fn returned reward of shape \[3, 1\], expected \[3\]"),
    ("embedding", r"next embedding of shape \[3, 1\], expected a tensor \[3\]"),
])
def test_recurrent_fn_wrong_structure(kind, match):
    with pytest.raises((TypeError, ValueError), match=match):
        muzero_policy((), None, good_root(), _wrong(kind), 8)


def test_recurrent_fn_wrong_embedding_entry():
    t = tables(0)
    base = model(t, td_embedding=True)

    def fn(params, rng, action, emb):
        out, nxt = base(params, rng, action, emb)
        del nxt["x"]
        return out, nxt

    root = root_for(t, torch.tensor([1, 2, 3]), td_embedding=True)
    with pytest.raises(ValueError, match=r"next embedding has no entry 'x'; root.embedding has it with shape \[3, 5\]"):
        muzero_policy((), None, root, fn, 8)


# ---------------------------------------------------------------------- compile
@pytest.mark.parametrize("backend", ["eager", pytest.param("aot_eager", marks=pytest.mark.slow)])
def test_one_simulation_compiles_fullgraph(backend):
    """Dynamo captures one whole simulation in one graph (``backend="eager"`` checks the
    capture quickly; the slow variant also traces it through AOTAutograd, which inductor consumes)."""
    t = tables(7)
    b = 4
    root = root_for(t, torch.arange(b))
    fn = model(t)
    interior = functools.partial(muzero_action_selection, pb_c_init=1.25, pb_c_base=19652.0)
    root_sel = functools.partial(interior, depth=0)

    def run(compiled):
        # a fresh tree, simulations 0..5, each one call of (maybe compiled) simulate_once
        fresh = instantiate_tree(root.prior_logits, root.value, TensorDict({"embedding": root.embedding}, [b]), 6,
                                 torch.zeros(b, A, dtype=torch.bool), TensorDict({}, [b]))
        step = torch.compile(simulate_once, fullgraph=True, dynamic=False, backend=backend) if compiled else simulate_once
        uniform = torch.zeros(b, A)
        for sim in range(6):
            step((), None, fresh, torch.tensor(sim), uniform, fn, root_sel, interior, 2, 2, tensor_embedding=True)
        return fresh

    torch._dynamo.reset()
    eager = run(False)
    torch._dynamo.utils.counters.clear()
    compiled = run(True)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1  # one graph for all simulations
    assert eager.node_visits[:, 0].tolist() == [7] * b
    assert eager.depth.amax().item() == 2  # the descent went below the root
    assert torch.equal(eager.children_visits, compiled.children_visits)
    assert torch.equal(eager.parents, compiled.parents)
    torch.testing.assert_close(eager.node_values, compiled.node_values)


def test_gumbel_interior_selection_follows_improved_policy():
    """Repeated deterministic selection visits actions in proportion to the probs."""
    t = tables(8)
    root = root_for(t, torch.tensor([0]))
    interior = functools.partial(gumbel_muzero_interior_action_selection,
                                 qtransform=qtransform_completed_by_mix_value)
    tree = search((), None, root, model(t), lambda u, tr, n: interior(u, tr, n, 0), interior, 200, max_depth=1)
    probs = torch.softmax(tree.children_prior_logits[0, 0] + qtransform_completed_by_mix_value(
        tree, torch.zeros(1, dtype=torch.long))[0], -1)
    freq = tree.children_visits[0, 0].float() / 200
    assert (freq - probs).abs().max() < 0.05


def test_compiled_search_with_tensordict_embeddings_equals_eager():
    """``compile=`` with TensorDict embeddings (the adapters' case), two-player
    discounts and invalid root actions: the same tree as the eager search, and a
    second search of the same shapes reuses the graph."""
    t = tables(5, two_player=True)
    root = root_for(t, torch.tensor([0, 3]), td_embedding=True)
    inv = torch.zeros(2, A, dtype=torch.bool)
    inv[0, :2] = True
    fn = model(t, td_embedding=True)
    eager = muzero_policy((), torch.Generator().manual_seed(1), root, fn, 6, invalid_actions=inv)
    torch._dynamo.utils.counters.clear()
    for _ in range(2):
        comp = muzero_policy((), torch.Generator().manual_seed(1), root, fn, 6, invalid_actions=inv,
                             compile="eager")
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert torch.equal(eager.search_tree.children_visits, comp.search_tree.children_visits)
    assert torch.equal(eager.search_tree.parents, comp.search_tree.parents)
    torch.testing.assert_close(eager.search_tree.node_values, comp.search_tree.node_values)
    assert torch.equal(eager.action, comp.action)
    assert eager.search_tree.depth.amax().item() >= 2


@pytest.mark.parametrize(("compile", "match"), [(3, "compile must be a bool, a backend name or a dict"),
                                                 ({"fullgraph": False}, r"remove \['fullgraph'\]")])
def test_bad_compile_option(compile, match):
    t = tables(0)
    with pytest.raises((TypeError, ValueError), match=match):
        muzero_policy((), None, root_for(t, torch.tensor([0])), model(t), 4, compile=compile)


def test_compile_options_give_inductor_the_search_options():
    """``compile=True`` and inductor dicts get ``SEARCH_INDUCTOR_OPTIONS`` under their own
    ``options`` (the user's keys win); other backends and ``mode=`` dicts are left alone."""
    from steersman.planning.search import SEARCH_INDUCTOR_OPTIONS, compile_options

    opts = {"max_fusion_size": 1024, "size_asserts": False, "alignment_asserts": False}
    assert SEARCH_INDUCTOR_OPTIONS == opts
    assert compile_options(True) == {"backend": "inductor", "options": opts}
    assert compile_options("inductor") == compile_options(True)
    assert compile_options("eager") == {"backend": "eager"}
    assert compile_options({"options": {"cpp_wrapper": True}}) == {"options": {**opts, "cpp_wrapper": True}}
    assert compile_options({"backend": "inductor", "options": {"max_fusion_size": 8, "size_asserts": True}})[
        "options"] == {**opts, "max_fusion_size": 8, "size_asserts": True}
    assert compile_options({"backend": "inductor", "mode": "max-autotune"}) == \
        {"backend": "inductor", "mode": "max-autotune"}
    assert compile_options({"backend": "aot_eager"}) == {"backend": "aot_eager"}
    compile_options(True)["options"]["max_fusion_size"] = 2  # a copy: the module's dict stays
    assert SEARCH_INDUCTOR_OPTIONS == opts


def test_compiled_in_place_per_simulation_equals_eager(monkeypatch):
    """A custom ``loop_fn`` runs one in-place graph per simulation; here with one level
    per descent/backup loop iteration and the descent's last levels on the trees still
    descending (the large-batch configuration, forced here with limits of 0 and 1): the
    same tree and action as the eager search, one graph for every simulation. (The whole-search graph with 4 levels per iteration, the small-batch
    configuration, is checked against eager by the tests above and by the mctx parity
    test.)"""
    import importlib

    search_mod = importlib.import_module("steersman.planning.search")
    monkeypatch.setattr(search_mod, "UNROLL_MAX_BATCH", 0)
    # compacted descents (batches above COMPACT_MIN_BATCH): here once one of 3 trees descends
    monkeypatch.setattr(search_mod, "COMPACT_MIN_BATCH", 1)
    monkeypatch.setattr(search_mod, "COMPACT_FRACTION", 3)
    t = tables(11, two_player=True)
    root = root_for(t, torch.tensor([0, 5, 7]))
    policy = "muzero"
    inv = torch.zeros(3, A, dtype=torch.bool)
    inv[1, 1:3] = True
    eager = POLICIES[policy]((), torch.Generator().manual_seed(2), root, model(t), 10, invalid_actions=inv)
    torch._dynamo.utils.counters.clear()
    calls = []

    def loop_fn(lower, upper, body, val):  # not fori_loop: one graph per simulation
        calls.append((lower, upper))
        for i in range(lower, upper):
            val = body(i, val)
        return val

    comp = POLICIES[policy]((), torch.Generator().manual_seed(2), root, model(t), 10, invalid_actions=inv,
                            loop_fn=loop_fn, compile="eager")
    assert calls == [(0, 10)]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    for f in ("children_visits", "children_index", "parents", "depth"):
        assert torch.equal(getattr(eager.search_tree, f), getattr(comp.search_tree, f)), f
    torch.testing.assert_close(eager.search_tree.node_values, comp.search_tree.node_values)
    assert torch.equal(eager.action, comp.action)
    assert eager.search_tree.depth.amax().item() >= 2


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_compiled_search_continues_with_full_width_paths(policy, monkeypatch):
    """The whole-search graph records paths of at most ``PATH_WIDTH`` edges (2 here) and
    stops before the simulation that could descend deeper; a second graph with the full
    width (``max_depth`` edges) runs the rest: the same tree and action as the eager
    search, whose trees go deeper than 2, and exactly two graphs. The narrow graph's
    backup is unrolled, the full graph's a ``while_loop`` (``BACKUP_UNROLL_MAX`` 4)."""
    import importlib

    search_mod = importlib.import_module("steersman.planning.search")
    monkeypatch.setattr(search_mod, "PATH_WIDTH", 2)
    monkeypatch.setattr(search_mod, "BACKUP_UNROLL_MAX", 4)
    assert search_mod.path_widths(12) == (2, 12)
    assert search_mod.path_widths(2) == (2,)
    t = tables(13, two_player=True)
    root = root_for(t, torch.tensor([0, 4, 9]))
    inv = torch.zeros(3, A, dtype=torch.bool)
    inv[2, :2] = True
    eager = POLICIES[policy]((), torch.Generator().manual_seed(3), root, model(t), 12, invalid_actions=inv)
    assert eager.search_tree.depth.amax().item() > 2
    torch._dynamo.utils.counters.clear()
    comp = POLICIES[policy]((), torch.Generator().manual_seed(3), root, model(t), 12, invalid_actions=inv,
                            compile="eager")
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2
    for f in ("children_visits", "children_index", "parents", "action_from_parent", "depth", "node_visits"):
        assert torch.equal(getattr(eager.search_tree, f), getattr(comp.search_tree, f)), f
    torch.testing.assert_close(eager.search_tree.node_values, comp.search_tree.node_values)
    torch.testing.assert_close(eager.action_weights, comp.action_weights)
    assert torch.equal(eager.action, comp.action)


def test_search_pauses_the_garbage_collector_and_restores_it():
    """The collector is off while the simulations run and back on afterwards, also when
    the recurrent function raises; a collector the caller disabled stays disabled."""
    import gc

    t = tables(0)
    seen = []
    fn = model(t)

    def spy(params, rng, action, embedding):
        seen.append(gc.isenabled())
        return fn(params, rng, action, embedding)

    root = root_for(t, torch.tensor([0, 1]))
    assert gc.isenabled()
    muzero_policy((), None, root, spy, 4)
    assert seen and not any(seen) and gc.isenabled()

    def boom(params, rng, action, embedding):
        raise RuntimeError("model failed")

    with pytest.raises(RuntimeError, match="model failed"):
        muzero_policy((), None, root, boom, 4)
    assert gc.isenabled()
    gc.disable()
    try:
        muzero_policy((), None, root, spy, 4)
        assert not gc.isenabled()
    finally:
        gc.enable()



def test_compiled_whole_search_writes_the_tree_in_place(monkeypatch):
    """The whole-search graph carries only the simulation counter and writes the tree
    arrays that ``instantiate_tree`` allocated in place (same storage, no per-simulation
    copies), through AOTAutograd's functionalization (``aot_eager``), also when the
    model's parameters require grad and grad mode is on: the same tree, action and
    weights as the eager search (Gumbel MuZero, two players, invalid root actions, the
    descent compacted to the trees still descending as at large batches; PUCT's
    in-place loop is checked by the TensorDict-embedding test above)."""
    policy = "gumbel"
    import importlib

    from steersman.planning.search import _WRITTEN

    search_mod = importlib.import_module("steersman.planning.search")
    made = []

    def spy(*args):
        tree = instantiate_tree(*args)
        made.append({f: getattr(tree, f).data_ptr() for f in _WRITTEN})
        return tree

    monkeypatch.setattr(search_mod, "instantiate_tree", spy)
    # and the compacted descent, here from the first level on (capacity B: every tree)
    monkeypatch.setattr(search_mod, "COMPACT_MIN_BATCH", 1)
    monkeypatch.setattr(search_mod, "COMPACT_FRACTION", 1)
    t = tables(13, two_player=True)
    w = torch.ones((), requires_grad=True)  # a parameter of the model: grad mode stays on around the search
    base = model(t)

    def fn(params, rng, action, embedding):
        out, emb = base(params, rng, action, embedding)
        return out._replace(value=out.value * params), emb

    root = root_for(t, torch.tensor([0, 5, 7]))
    inv = torch.zeros(3, A, dtype=torch.bool)
    inv[2, :2] = True
    eager = POLICIES[policy](w, torch.Generator().manual_seed(4), root, fn, 12, invalid_actions=inv)
    comp = POLICIES[policy](w, torch.Generator().manual_seed(4), root, fn, 12, invalid_actions=inv,
                            compile="aot_eager")
    assert all(getattr(comp.search_tree, f).data_ptr() == made[-1][f] for f in _WRITTEN)
    for f in ("children_visits", "children_index", "parents", "depth", "node_visits"):
        assert torch.equal(getattr(eager.search_tree, f), getattr(comp.search_tree, f)), f
    torch.testing.assert_close(eager.search_tree.node_values.detach(), comp.search_tree.node_values)
    torch.testing.assert_close(eager.search_tree.children_values.detach(), comp.search_tree.children_values)
    torch.testing.assert_close(eager.action_weights.detach(), comp.action_weights)
    assert torch.equal(eager.action, comp.action)
    assert eager.search_tree.depth.amax().item() >= 2


@pytest.mark.parametrize("keywords", [{}, {"rescale_values": False, "value_scale": 0.3},
                                      {"use_mixed_value": False, "maxvisit_init": 10.0}])
def test_compiled_gumbel_interior_selection_by_columns_equals_the_rows(keywords):
    """Under compile, Gumbel MuZero's interior selection with the mixed-value transform is
    computed per action column (``_gumbel_interior_columns``): the same action as the
    row formulas at every node of searched trees (two players, visited and unvisited
    children), with the transform's keywords bound by ``functools.partial``; another
    transform keeps the row formulas."""
    from steersman.planning.action_selection import _gumbel_interior_columns, _keywords_of
    from steersman.planning.qtransforms import (
        qtransform_by_parent_and_siblings,
        qtransform_completed_by_mix_value,
    )

    t = tables(17, two_player=True)
    qt = functools.partial(qtransform_completed_by_mix_value, **keywords)
    tree = POLICIES["gumbel"]((), torch.Generator().manual_seed(5), root_for(t, torch.arange(12)), model(t), 20,
                              qtransform=qt).search_tree
    assert tree.depth.amax().item() >= 2 and (tree.children_visits > 0).any()
    assert _keywords_of(qt, qtransform_completed_by_mix_value) == keywords
    assert _keywords_of(qtransform_by_parent_and_siblings, qtransform_completed_by_mix_value) is None
    select = torch.compile(functools.partial(gumbel_muzero_interior_action_selection, qtransform=qt),
                           backend="eager", fullgraph=True)
    chosen = set()
    for n in range(tree.num_simulations + 1):
        index = torch.full((12,), n)
        want = gumbel_muzero_interior_action_selection(None, tree, index, 1, qtransform=qt)
        assert torch.equal(_gumbel_interior_columns(tree, index, **keywords), want), n
        assert torch.equal(select(None, tree, index, 1), want), n
        chosen.update(want.tolist())
    assert len(chosen) > 1  # not a constant answer


def test_compiled_root_and_puct_selections_by_columns_equal_the_rows():
    """The column forms of Gumbel MuZero's root selection (sequential halving, Gumbel
    noise, invalid root actions) and of PUCT (parent-and-siblings transform, tie-break
    uniforms, the root mask at depth 0 given as an int or a 0-dim tensor) choose the same
    actions as the row formulas, on trees stopped at several simulation counts."""
    from steersman.planning.action_selection import (
        _gumbel_root_columns,
        _muzero_columns,
        gumbel_muzero_root_action_selection,
        table_of_considered_visits,
    )

    t = tables(19, two_player=True)
    b = 12
    g = torch.Generator().manual_seed(7)
    inv = torch.rand(b, A, generator=g) < 0.4
    inv[:, 2] = False
    table = table_of_considered_visits(4, 24)
    root_index = torch.zeros(b, dtype=torch.int64)
    chosen = set()
    for sims in (3, 11, 23):
        for pol in ("gumbel", "muzero"):
            tree = POLICIES[pol]((), torch.Generator().manual_seed(sims), root_for(t, torch.arange(b)), model(t), sims,
                                 invalid_actions=inv).search_tree
            if pol == "gumbel":  # (the root Gumbel noise is in the tree's extra data)
                want = gumbel_muzero_root_action_selection(None, tree, root_index, table=table,
                                                           max_num_considered_actions=4)
                assert torch.equal(_gumbel_root_columns(tree, root_index, table, 4), want)
                chosen.update(want.tolist())
            u = torch.rand(b, A, generator=g)
            for n in range(sims + 1):
                index = torch.full((b,), n)
                for depth, mask in ((0, inv), (2, None), (torch.tensor(0), inv), (torch.tensor(1), inv & False)):
                    for uniform in (None, u):
                        want = muzero_action_selection(uniform, tree, index, depth)
                        assert torch.equal(_muzero_columns(uniform, tree, index, mask, 1.25, 19652.0), want)
                        chosen.update(want.tolist())
    assert len(chosen) > 1


@pytest.mark.slow
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_inductor_cpp_wrapper_search_equals_eager(policy):
    """Inductor with its C++ wrapper (``cpp_wrapper``) computes the eager search's tree.
    torch 2.13's C++ wrapper returns the carried inputs of a ``while_loop`` that runs no
    iteration and then reuses their buffers; here the first descents below the root run
    no level (every root child unvisited), so each compiled loop must run its body at
    least once (``search._while``): before that, an index out of bounds or another tree."""
    t = tables(23, two_player=True)
    root = root_for(t, torch.tensor([0, 4, 9]))
    inv = torch.zeros(3, A, dtype=torch.bool)
    inv[1, :2] = True
    cpp = {"backend": "inductor", "options": {"cpp_wrapper": True}}
    eager = POLICIES[policy]((), torch.Generator().manual_seed(6), root, model(t), 10, invalid_actions=inv)
    with torch.no_grad():
        comp = POLICIES[policy]((), torch.Generator().manual_seed(6), root, model(t), 10, invalid_actions=inv,
                                compile=cpp)
    for f in ("children_visits", "children_index", "parents", "action_from_parent", "depth", "node_visits"):
        assert torch.equal(getattr(eager.search_tree, f), getattr(comp.search_tree, f)), f
    torch.testing.assert_close(eager.search_tree.node_values, comp.search_tree.node_values)
    torch.testing.assert_close(eager.action_weights, comp.action_weights)
    assert torch.equal(eager.action, comp.action)
    assert eager.search_tree.depth.amax().item() >= 2


@pytest.mark.parametrize("levels, block", [(7, 16), (24, 16), (11, 3), (12, 4)])
@pytest.mark.parametrize("discount", [1.0, -1.0, 0.9])
def test_backup_returns_as_one_chain_equal_the_level_loop(discount, levels, block):
    # the compiled backup's chains (blocks of columns) against the level-by-level loop
    # (mctx's order): equal bits, leaf value past each path's depth, at every depth 1..L
    g = torch.Generator().manual_seed(0)
    b = 5 * levels
    rewards = torch.randn(b, levels, generator=g)
    discounts = torch.full((b, levels), discount) * torch.rand(b, levels, generator=g).add(0.5)
    depth = torch.arange(b) % levels + 1
    leaf = torch.randn(b, generator=g)
    ret, want = leaf, [leaf] * levels
    for i in range(levels - 1, -1, -1):
        ret = torch.where(depth > i, rewards[:, i] + discounts[:, i] * ret, ret)
        want[i] = ret
    got = _backup_returns(rewards, discounts, depth, leaf, block)
    assert torch.equal(got, torch.stack(want, -1))
    past = torch.arange(levels) >= depth.unsqueeze(-1)
    assert torch.equal(got[past], leaf.unsqueeze(-1).expand(b, levels)[past])


@pytest.mark.parametrize("levels", [3, 8])
def test_descent_reading_the_path_from_ancestors_builds_the_same_tree(levels):
    # the while_loop descent that carries only its last node and action (the path read
    # from the ancestors array) against the one carrying the path: the same tree, bit
    # for bit, and every expanded node's row is its path from the root, zeros below it
    t = tables(3)
    b, sims = 6, 24
    root = root_for(t, torch.arange(b))
    fn = model(t)
    interior = functools.partial(muzero_action_selection, pb_c_init=1.25, pb_c_base=19652.0)
    root_sel = functools.partial(interior, depth=0)
    uniforms = torch.rand(sims, b, A, generator=torch.Generator().manual_seed(1))

    def run(with_ancestors):
        tree = instantiate_tree(root.prior_logits, root.value, TensorDict({"embedding": root.embedding}, [b]), sims,
                                torch.zeros(b, A, dtype=torch.bool), TensorDict({}, [b]))
        simulate_once((), None, tree, 0, uniforms[0], fn, root_sel, interior, levels, 1, tensor_embedding=True)
        anc = first_ancestors(tree, levels, expanded=2) if with_ancestors else None
        for sim in range(1, sims):
            simulate_once((), None, tree, torch.tensor(sim), uniforms[sim], fn, root_sel, interior, levels, levels,
                          tensor_embedding=True, use_while_loop=True, unroll=2, ancestors=anc)
        return tree, anc

    carried, _ = run(False)
    tree, anc = run(True)
    for name in ("children_index", "children_visits", "children_values", "node_values", "node_visits", "parents"):
        assert torch.equal(getattr(carried, name), getattr(tree, name)), name
    assert int(tree.depth.max()) >= 3
    assert int((tree.parents >= 0).sum()) >= 4 * b
    for bi in range(b):
        for n in range(sims + 1):
            if n and int(tree.parents[bi, n]) < 0:  # not expanded (max_depth re-evaluated a node instead)
                continue
            want, x = [], n
            while x >= 0:
                want.insert(0, x)
                x = int(tree.parents[bi, x])
            want += [0] * (levels + 1 - len(want))
            assert anc[bi, n].tolist() == want, (bi, n)
