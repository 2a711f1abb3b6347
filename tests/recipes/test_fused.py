"""The fused PPO iteration (recipes/fused.py): the compiled step and GAE equal the eager
collector and GAE, and ``compile=true`` trains as the eager recipe does."""

from __future__ import annotations

import pytest
import torch

from steersman.collectors import SyncDataCollector
from steersman.envs.native import AcrobotEnv, CartPoleEnv, GridWorldEnv, MountainCarEnv
from steersman.objectives.value import GAE
from steersman.recipes.fused import (
    INDUCTOR_OPTIONS,
    FusedCollector,
    FusedGAE,
    cacheable_scan,
    compile_options,
    fusable,
    remember_vec_isa,
)
from steersman.recipes.ppo import PPOConfig, make_critic, make_policy

ENVS = [CartPoleEnv, AcrobotEnv, MountainCarEnv]


def _pair(env_cls, seed=3, n=4, T=16, total=64 * 4):
    cfg = PPOConfig()
    envs = [env_cls(batch_size=[n], seed=seed) for _ in range(2)]
    torch.manual_seed(seed)
    policy = make_policy(cfg, envs[0])
    eager = SyncDataCollector(envs[0], policy, frames_per_batch=n * T, total_frames=total)
    fused = FusedCollector(envs[1], policy, frames_per_batch=n * T, total_frames=total, compile=False)
    return cfg, policy, eager, fused


@pytest.mark.parametrize("env_cls", ENVS, ids=lambda c: c.__name__)
def test_fused_step_equals_eager_collector(env_cls):
    """Same seed, same policy: every entry of every batch and the collector state are equal
    bit for bit (actions from the same global generator, the env's own step)."""
    _, _, eager, fused = _pair(env_cls)
    for _ in range(2):
        torch.manual_seed(11)
        a = next(iter(eager))
        torch.manual_seed(11)
        b = next(iter(fused))
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        for k in a.keys(True, True):
            assert torch.equal(a[k], b[k]), k
    sa, sb = eager.state_dict(), fused.state_dict()
    assert torch.equal(sa["traj_ids"], sb["traj_ids"])
    for k, v in sa["carried"]["data"].items():
        assert torch.equal(v, sb["carried"]["data"][k]), k


def test_fused_gae_equals_gae():
    cfg, policy, eager, _ = _pair(CartPoleEnv)
    critic = make_critic(cfg, eager.env)
    batch = next(iter(eager))
    ref = GAE(gamma=0.98, lmbda=0.8, value_network=critic)(batch.clone())
    out = FusedGAE(critic, gamma=0.98, lmbda=0.8, compile=False)(batch.clone())
    for k in ("advantage", "value_target", "state_value", ("next", "state_value")):
        torch.testing.assert_close(out[k], ref[k])


def test_fusable_names_what_is_missing():
    cfg = PPOConfig()
    env = CartPoleEnv(batch_size=[2])
    assert fusable(env, make_policy(cfg, env), make_critic(cfg, env)) is None
    assert "not a torch-native env" in fusable(object(), make_policy(cfg, env))
    assert "not a float vector" in fusable(GridWorldEnv(batch_size=[2]), make_policy(cfg, env))
    with pytest.raises(ValueError, match="FusedCollector: the actor is not"):
        FusedCollector(env, make_critic(cfg, env), frames_per_batch=4, total_frames=8)


def test_compiled_rollout_is_one_graph_and_equals_eager():
    """The whole rollout (n_steps of policy + env) traces into one graph, compiled once for
    every batch, and gives the eager collector's batches bit for bit. That graph (a
    ``scan``) is one inductor's on-disk caches store while it compiles (torch refuses
    graphs with a ``scan`` by default: a warm start would trace, functionalize and
    generate its code again), and the opt-in ends with the compile."""
    from torch._functorch._aot_autograd.autograd_cache import (
        BypassAOTAutogradCache,
        check_cacheable,
    )
    from torch._higher_order_ops.scan import scan_op

    graphs, cacheable = [], []

    def backend(gm, example_inputs):  # counts graphs; checks, as the compile runs, that the cache takes it
        graphs.append(gm)
        check_cacheable(gm)  # raises BypassAOTAutogradCache if not
        cacheable.append(scan_op.cacheable())
        return gm.forward

    cfg = PPOConfig()
    envs = [CartPoleEnv(batch_size=[4], seed=5) for _ in range(2)]
    torch.manual_seed(0)
    policy = make_policy(cfg, envs[0])
    eager = SyncDataCollector(envs[0], policy, frames_per_batch=64, total_frames=10**6)
    fused = FusedCollector(envs[1], policy, frames_per_batch=64, total_frames=10**6, backend=backend)
    it_e, it_f = iter(eager), iter(fused)
    for i in range(3):
        with torch.no_grad():  # a new policy each batch: the graph reads the current parameters
            next(policy.parameters()).add_(0.1 * i)
        torch.manual_seed(i)
        a = next(it_e)
        torch.manual_seed(i)
        b = next(it_f)
        for k in a.keys(True, True):
            assert torch.equal(a[k], b[k]), k
    assert len(graphs) == 1 and cacheable == [True]
    assert fused.compiled
    assert any(n.target is scan_op for n in graphs[0].graph.nodes)
    assert not scan_op.cacheable()  # torch's default again outside the compile
    with pytest.raises(BypassAOTAutogradCache, match="scan"):
        check_cacheable(graphs[0])
    with cacheable_scan():
        check_cacheable(graphs[0])
        assert scan_op.cacheable()
    assert not scan_op.cacheable()


def test_rollout_that_cannot_compile_falls_back_with_one_warning():
    """A rollout dynamo refuses runs eagerly from then on, after one warning saying why,
    with the eager collector's batches (the failed attempt changed nothing)."""
    _, _, eager, fused = _pair(CartPoleEnv)

    def refuse(*args):
        raise torch._dynamo.exc.Unsupported("planted: cannot trace this")

    fused._fn, fused.compiled = refuse, True
    it = iter(fused)
    for i in range(2):
        torch.manual_seed(i)
        a = next(iter(eager))
        torch.manual_seed(i)
        if i == 0:
            with pytest.warns(UserWarning, match=r"rollout of CartPoleEnv cannot be compiled \(planted: cannot"):
                b = next(it)
        else:
            b = next(it)
        for k in a.keys(True, True):
            assert torch.equal(a[k], b[k]), k
    assert not fused.compiled


def test_plain_mlps_run_layer_by_layer_others_through_functional_call():
    """The fused graphs run make_policy's/make_critic's MLPs layer by layer (F.linear and
    the activation: the modules' own ops, bit for bit, with new parameters swapped in); a
    network with any other parametrised layer goes through functional_call."""
    from torch import nn

    from steersman.modules import MLP
    from steersman.recipes.fused import _flat, _program, _run_net

    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    for net, kinds in ((MLP(in_features=4, out_features=2, num_cells=[8, 8], activation_class=nn.Tanh),
                        ["linear", "call", "linear", "call", "linear"]),
                       (nn.Sequential(nn.Linear(4, 3, bias=False), nn.ReLU()), ["linear", "call"]),
                       (nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8)), None)):
        names, params = _flat(net)
        program = _program(net, names)
        assert (None if program is None else [s[0] for s in program]) == kinds
        new = tuple(p + 0.25 for p in params)
        expected = torch.func.functional_call(net, dict(zip(names, new)), (x,))
        assert torch.equal(_run_net(net, names, program, new, x), expected)
        assert not torch.equal(expected, net(x))  # the new parameters were used


# ---------------------------------------------------------------- the fused update (recipes/fused_ppo.py)
def _ppo_loss(seed=0, **kw):
    from steersman.objectives import ClipPPOLoss
    from steersman.objectives.functional_update import FunctionalUpdate, OptimizerState
    from steersman.tensordict.nn import optim

    cfg, env = PPOConfig(), CartPoleEnv(batch_size=[2])
    torch.manual_seed(seed)
    actor, critic = make_policy(cfg, env), make_critic(cfg, env)
    opt_kw = kw.pop("optimizer", {})
    loss = ClipPPOLoss(actor, critic, **{"clip_epsilon": 0.2, "critic_coeff": 0.5, "loss_critic_type": "l2",
                                          "normalize_advantage": True, "diagnostics": False, **kw})
    lr = torch.tensor(1e-3)
    update = FunctionalUpdate(loss, (opt_kw.pop("cls", optim.Adam))(lr=lr, eps=1e-5, **opt_kw), max_grad_norm=0.5)
    return loss, update, OptimizerState(update.optimizer.init(update.params())), lr


def _ppo_batch(n=128, seed=1):
    from steersman.tensordict import TensorDict

    g = torch.Generator().manual_seed(seed)
    return TensorDict({"observation": torch.randn(n, 4, generator=g), "action": torch.randint(0, 2, (n,), generator=g),
                       "action_log_prob": -torch.rand(n, generator=g) - 0.3,
                       "advantage": torch.randn(n, 1, generator=g), "value_target": torch.randn(n, 1, generator=g)}, [n])


@pytest.mark.parametrize("kw", [{}, {"entropy_coeff": 0.01, "loss_critic_type": "smooth_l1"},
                                {"normalize_advantage": False, "entropy_bonus": False, "critic_coeff": 1.0}],
                         ids=["rl-zoo", "entropy-smooth_l1", "raw-advantage"])
def test_fused_ppo_loss_equals_clip_ppo_loss(kw):
    """The fused path's hand-written loss gives ClipPPOLoss's terms and gradients (the
    clip range mid-anneal, ratios away from 1 so that the clip acts)."""
    from steersman.recipes.fused_ppo import FusedPPOUpdate

    loss, update, state, _ = _ppo_loss(**kw)
    loss.clip_epsilon.fill_(0.13)
    batch = _ppo_batch()
    fused = FusedPPOUpdate(loss, update, state, compile=False)
    ref = loss(batch)
    assert float(loss.diagnose(batch)["clip_fraction"]) > 0.1  # the clipped branch is exercised
    names = [n for n, p in loss.named_parameters() if p.requires_grad]
    ref_total = sum(ref[k] for k in ref.keys() if k.startswith("loss_"))
    ref_grads = torch.autograd.grad(ref_total, [dict(loss.named_parameters())[n] for n in names])
    data = [batch.get(k) for k in fused._data_keys]
    (total, (objective, bonus, critic)) = fused.loss(fused.params, *data, loss.clip_epsilon)
    torch.testing.assert_close(objective, ref["loss_objective"])
    torch.testing.assert_close(critic, ref["loss_critic"])
    torch.testing.assert_close(bonus, ref.get("loss_entropy", torch.zeros(())))
    grads = torch.func.grad(lambda p: fused.loss(p, *data, loss.clip_epsilon)[0])(fused.params)
    order = [names.index(n) for n in fused._names]
    for g, i in zip(grads, order, strict=True):
        torch.testing.assert_close(g, ref_grads[i], msg=names[i])
    assert len(grads) == len(names)


def test_fused_ppo_iteration_equals_per_minibatch_update():
    """Two iterations of all epochs x minibatches in one call (the lr and clip range
    annealed between them) end where CompiledUpdate's per-minibatch calls end: every
    parameter and every Adam state leaf, and the last gradient norm."""
    from steersman.objectives.functional_update import CompiledUpdate
    from steersman.recipes.fused_ppo import FusedPPOUpdate

    loss_a, update_a, state_a, lr_a = _ppo_loss(entropy_coeff=0.01)
    loss_b, update_b, state_b, lr_b = _ppo_loss(entropy_coeff=0.01)
    ref = CompiledUpdate(update_a, state_a, compile=False)
    fused = FusedPPOUpdate(loss_b, update_b, state_b, compile=False)
    start = [p.detach().clone() for p in loss_b.parameters()]
    for it in range(2):
        batch = _ppo_batch(seed=it)
        for lr, loss in ((lr_a, loss_a), (lr_b, loss_b)):
            lr.fill_(1e-3 * (1 - 0.4 * it))
            loss.clip_epsilon.fill_(0.2 * (1 - 0.4 * it))
        indices = torch.stack([torch.randperm(128) for _ in range(3)]).reshape(-1, 32)
        norms = fused(batch, indices)
        for idx in indices:
            last = ref(batch, idx)["grad_norm"]
        assert norms.shape == (12,)
        torch.testing.assert_close(norms[-1], last)
        fused.sync()  # what the recipe logs: the last minibatch after the updates, from the same graph
        expected = loss_b.diagnose(batch[indices[-1]])
        assert set(fused.diagnostics) == {"loss_objective", "loss_critic", "entropy", "kl_approx", "clip_fraction"}
        for key, value in fused.diagnostics.items():
            torch.testing.assert_close(value, expected[key], msg=key)
    ref.sync()
    fused.sync()
    for (name, a), (_, b), before in zip(loss_a.named_parameters(), loss_b.named_parameters(), start, strict=True):
        torch.testing.assert_close(b, a, msg=name)
        assert not torch.equal(b, before), name  # trained (sync wrote the new values into the modules)
    assert list(state_b.state.keys(True, True)) == list(state_a.state.keys(True, True))  # the checkpoint layout
    for key in state_a.state.keys(True, True):
        torch.testing.assert_close(state_b.state.get(key), state_a.state.get(key), msg=str(key))
    assert int(state_b.state["step"]) == 24


def test_fused_ppo_update_is_one_graph_with_a_scan():
    """Compiled (fullgraph), all the updates of an iteration are one graph holding one
    ``scan`` over the minibatches, traced once for every iteration (no recompile when the
    lr and clip range change in place), with the eager loop's numbers."""
    from torch._higher_order_ops.scan import scan_op

    from steersman.recipes.fused_ppo import FusedPPOUpdate

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    (loss_a, up_a, st_a, lr_a), (loss_b, up_b, st_b, lr_b) = _ppo_loss(), _ppo_loss()
    eager, compiled = (FusedPPOUpdate(loss_a, up_a, st_a, compile=False),
                       FusedPPOUpdate(loss_b, up_b, st_b, backend=backend))
    for it in range(3):
        lr_a.fill_(1e-3 / (it + 1))
        lr_b.fill_(1e-3 / (it + 1))
        batch, indices = _ppo_batch(seed=it), torch.stack([torch.randperm(128) for _ in range(2)]).reshape(-1, 64)
        torch.testing.assert_close(compiled(batch, indices), eager(batch, indices))
        torch.testing.assert_close(compiled.diagnostics, eager.diagnostics)
    assert compiled.compiled and len(graphs) == 1
    assert sum(n.target is scan_op for n in graphs[0].graph.nodes) == 1
    for a, b in zip(eager.params, compiled.params, strict=True):
        torch.testing.assert_close(b, a)
    torch._dynamo.reset()


def test_fused_ppo_update_that_cannot_compile_falls_back_with_one_warning():
    from steersman.recipes.fused_ppo import FusedPPOUpdate

    loss, update, state, _ = _ppo_loss()
    fused = FusedPPOUpdate(loss, update, state)

    def refuse(*args):
        raise torch._dynamo.exc.Unsupported("planted: no scan today")

    fused._fn = refuse
    indices = torch.arange(128).reshape(2, 64)
    with pytest.warns(UserWarning, match=r"fused PPO update cannot be compiled \(planted: no scan today\)"):
        fused(_ppo_batch(), indices)
    assert not fused.compiled and int(fused._step) == 2
    fused(_ppo_batch(), indices)  # eager from then on, no second warning
    assert int(fused._step) == 4


@pytest.mark.parametrize("kw, reason", [
    ({"clip_value": True}, "clip_value=0.2"),
    ({"delay_actor": True}, "delay_actor=True"),
    ({"reduction": "sum"}, "reduction='sum'"),
    ({"optimizer": {"amsgrad": True}}, "not plain Adam"),
    ({"optimizer": {"cls": "AdamW"}}, "not plain Adam"),
])
def test_fusable_update_names_what_it_does_not_cover(kw, reason):
    """Losses and optimizers the fused update does not cover are named (the recipe then
    keeps CompiledUpdate, one compiled call per minibatch)."""
    from steersman.recipes.fused_ppo import FusedPPOUpdate, fusable_update
    from steersman.tensordict.nn import optim

    if kw.get("optimizer", {}).get("cls") == "AdamW":
        kw = {"optimizer": {"cls": optim.AdamW}}
    loss, update, state, _ = _ppo_loss(**kw)
    assert reason in fusable_update(loss, update)
    with pytest.raises(ValueError, match="FusedPPOUpdate: "):
        FusedPPOUpdate(loss, update, state, compile=False)
    plain, plain_update, _, _ = _ppo_loss()
    assert fusable_update(plain, plain_update) is None


@pytest.mark.skipif(__import__("platform").machine() != "x86_64", reason="the ISA probe it skips is x86-64's")
def test_remember_vec_isa_skips_the_probe_only_when_a_record_says_all_passed(tmp_path, monkeypatch):
    """First process: inductor's probe runs once and is recorded; later: the record turns
    the probe off (``cpp.vec_isa_ok``) only if the probe found every ISA the flags list;
    a record with a failed ISA, or a user's setting, leaves inductor's probe on."""
    import functools
    import json
    import os

    from torch._inductor import config, cpu_vec_isa

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_VEC_ISA_OK", raising=False)
    probes = []

    def fake_list(ok: bool):  # the probe finds only avx2 usable of the two the flags list
        @functools.cache
        def listed():
            if config.cpp.vec_isa_ok:
                return ["avx512", "avx2"]
            probes.append(1)
            return ["avx512", "avx2"] if ok else ["avx2"]
        return listed

    # inductor's config is restored by its own patch (pytest's monkeypatch on the config proxy
    # deleted the option on undo and broke every later compile in the worker)
    with config.patch({"cpp.vec_isa_ok": None}):
        monkeypatch.setattr(cpu_vec_isa, "valid_vec_isa_list", fake_list(ok=False))
        assert remember_vec_isa() is False and config.cpp.vec_isa_ok is None and len(probes) == 1
        (record,) = (tmp_path / "steersman-vec-isa").glob("*.json")
        kept = json.loads(record.read_text())
        assert {k: kept[k] for k in ("probed", "listed")} == {"probed": ["avx2"], "listed": ["avx512", "avx2"]}
        assert all(isinstance(answer, bool) for answer in kept["checks"].values())  # (the real ISAs' checks)
        assert remember_vec_isa() is False and len(probes) == 1  # recorded: not probed again, still on

        os.remove(record)
        monkeypatch.setattr(cpu_vec_isa, "valid_vec_isa_list", fake_list(ok=True))
        assert remember_vec_isa() is True and config.cpp.vec_isa_ok is True and len(probes) == 2
        config.cpp.vec_isa_ok = None  # a new process
        assert remember_vec_isa() is True and config.cpp.vec_isa_ok is True and len(probes) == 2
        assert cpu_vec_isa.valid_vec_isa_list() == ["avx512", "avx2"]

        config.cpp.vec_isa_ok = None
        record.write_text("not json")  # unreadable: probed and recorded again
        assert remember_vec_isa() is True and len(probes) == 3
        config.cpp.vec_isa_ok = None
        record.write_text(json.dumps({"probed": ["avx512", "avx2"], "listed": ["avx512", "avx2"]}))
        assert remember_vec_isa() is True and len(probes) == 4  # an older record, without the checks
        probes.pop()

        # another process probing holds the record's lock: this one waits and reads its record
        import threading

        from torch.utils._filelock import FileLock

        config.cpp.vec_isa_ok = None
        os.remove(record)
        other = FileLock(f"{record}.lock")
        other.acquire()
        answer = []
        waiter = threading.Thread(target=lambda: answer.append(remember_vec_isa()))
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive() and not answer  # (blocked on the lock)
        record.write_text(json.dumps({"probed": ["avx512", "avx2"], "listed": ["avx512", "avx2"], "checks": {}}))
        other.release()
        waiter.join(30)
        assert answer == [True] and len(probes) == 3  # the other's record: no probe here

        config.cpp.vec_isa_ok = None
        monkeypatch.setenv("TORCHINDUCTOR_VEC_ISA_OK", "0")  # the user's word wins
        assert remember_vec_isa() is False and config.cpp.vec_isa_ok is None and len(probes) == 3


def test_compile_options_are_inductors_and_default_to_the_cpp_wrapper():
    """The fused graphs compile with a C++ wrapper under inductor (the scan bodies' loop and
    allocations out of Python); given options reach torch.compile; other backends take none."""
    assert INDUCTOR_OPTIONS == {"cpp_wrapper": True}
    assert compile_options("inductor", None) == {"cpp_wrapper": True}
    assert compile_options("inductor", {}) == {}
    got = compile_options("inductor", None)
    got["size_asserts"] = False  # a copy: the default is not changed through it
    assert INDUCTOR_OPTIONS == {"cpp_wrapper": True}
    assert compile_options("aot_eager", None) is None and compile_options(lambda gm, ex: gm, None) is None
    with pytest.raises(ValueError, match="inductor's; the backend is 'aot_eager'"):
        compile_options("aot_eager", {"cpp_wrapper": True})
    env = CartPoleEnv(batch_size=[2], seed=0)
    policy = make_policy(PPOConfig(), env)
    with pytest.raises(ValueError, match="inductor's"):
        FusedCollector(env, policy, frames_per_batch=8, total_frames=8, backend="eager", options={"cpp_wrapper": True})


def test_precompiled_graph_is_saved_loaded_checked_and_equal(tmp_path, monkeypatch):
    """Under inductor a fused graph is compiled once with torch's precompile and saved; an
    object with the same settings loads it (no trace) and gives the same numbers bit for bit,
    also when numbers the graph does not read differ. A number it reads (``gamma``) names
    another file; a file whose saved guards fail (another ``gamma``'s graph under this name),
    an unreadable file or one others may write is compiled again and rewritten;
    ``STEERSMAN_PRECOMPILE=0`` is the plain ``torch.compile``."""
    import json
    import os

    from steersman.recipes import precompiled as fused_mod

    monkeypatch.setattr(fused_mod, "_precompiled_dir", lambda: str(tmp_path))
    monkeypatch.setenv("STEERSMAN_PRECOMPILE", "dynamo")  # torch's precompile only (packages: test_fused_package)
    cfg, _, eager, _ = _pair(CartPoleEnv)
    critic = make_critic(cfg, eager.env)
    batch = next(iter(eager))
    keys = ("advantage", "value_target", "state_value", ("next", "state_value"))

    def run(gamma, expect, **attrs):
        gae = FusedGAE(critic, gamma=gamma, lmbda=0.8, options={})  # the Python wrapper: a shorter compile
        gae.__dict__.update(attrs)
        assert isinstance(gae._fn, fused_mod.Precompiled)
        outs = [gae(batch.clone()), gae(batch.clone())]  # the second call skips the guards
        assert gae._fn.source == expect
        ref = FusedGAE(critic, gamma=gamma, lmbda=0.8, compile=False)(batch.clone())
        for k in keys:
            torch.testing.assert_close(outs[0][k], ref[k])
            assert torch.equal(outs[0][k], outs[1][k])
        return gae._fn.path, outs[0]

    def saved():
        return sorted(n for n in os.listdir(tmp_path) if n.endswith(".bin"))

    path, first = run(0.98, "saved")
    assert saved() == [os.path.basename(path)] and os.stat(path).st_mode & 0o077 == 0
    index = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert {"self.gamma", "self.lmbda"} <= set(index["reads"])
    again, loaded = run(0.98, "loaded", batches_seen=12)  # a number the graph does not read
    assert again == path and all(torch.equal(first[k], loaded[k]) for k in keys)
    other, _ = run(0.9, "saved")
    assert other != path and len(saved()) == 2

    os.replace(other, path)  # gamma=0.9's graph under gamma=0.98's name: its guards refuse it
    run(0.98, "saved")
    again, loaded = run(0.98, "loaded")
    assert all(torch.equal(first[k], loaded[k]) for k in keys)
    with open(path, "wb") as f:
        f.write(b"not a saved function")
    run(0.98, "saved")
    os.chmod(path, 0o666)
    run(0.98, "saved")

    monkeypatch.setenv("STEERSMAN_PRECOMPILE", "0")
    assert not isinstance(FusedGAE(critic, gamma=0.98, lmbda=0.8)._fn, fused_mod.Precompiled)
    assert not isinstance(FusedGAE(critic, gamma=0.98, lmbda=0.8, backend="aot_eager")._fn, fused_mod.Precompiled)


def test_fused_ppo_update_decomposes_tanh_the_rollout_does_not(monkeypatch):
    """Under inductor the update compiles with TRAIN_OPTIONS (tanh decomposed: inductor's own
    vectorized tanh is the slow kernel); the rollout keeps INDUCTOR_OPTIONS, so its actions
    stay the eager policy's bit for bit; given options win."""
    from steersman.recipes import fused_ppo
    from steersman.recipes.fused import INDUCTOR_OPTIONS, TRAIN_OPTIONS

    seen = []
    monkeypatch.setattr(fused_ppo, "_compile", lambda fn, backend, options=None: seen.append(options) or fn)
    assert TRAIN_OPTIONS == {**INDUCTOR_OPTIONS, "cpp.use_decompose_tanh": True}
    assert "cpp.use_decompose_tanh" not in INDUCTOR_OPTIONS
    for options, want in ((None, TRAIN_OPTIONS), ({}, {})):
        loss, update, state, _ = _ppo_loss()
        fused_ppo.FusedPPOUpdate(loss, update, state, options=options)
        assert seen.pop() == want
    loss, update, state, _ = _ppo_loss()
    fused_ppo.FusedPPOUpdate(loss, update, state, backend="aot_eager")
    assert seen.pop() is None  # (other backends take no inductor options)
