"""Many seeds in one process (recipes/multiseed.py): each member equals its run alone, bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.recipes import multiseed, ppo
from steersman.recipes.checkpoint import load_checkpoint
from steersman.recipes.config import (
    CheckpointConfig,
    ConfigError,
    EnvConfig,
    EvalConfig,
    LoggerConfig,
)
from steersman.recipes.envs import make_env
from steersman.recipes.evaluation import evaluate
from steersman.recipes.launch import make_config
from steersman.recipes.ppo import PPOConfig, PPOOptimConfig
from steersman.record.loggers.csv import read_metrics_csv
from steersman.record.plot import aggregate_returns, plot_learning_curves


def tiny(**kw) -> PPOConfig:
    """2 sub-envs x 8 steps, 2 epochs of 8-sample minibatches, 3 batches: every piece runs."""
    base = dict(env=EnvConfig(name="CartPole-v1", num_envs=2), n_steps=8, epochs=2, minibatch_size=8,
                total_frames=48, quiet=True, logger=LoggerConfig(backends=["csv"]), export_format="none",
                eval=EvalConfig(interval=32, episodes=2), checkpoint=CheckpointConfig(interval=16, keep=5))
    base.update(kw)
    return PPOConfig(**base)


def final_state(run_dir) -> dict:
    return load_checkpoint(run_dir / "checkpoints").state


def row(state: dict, k: int) -> dict:
    """Member k's slice of everything a checkpoint holds per member."""
    out = {f"params.{n}": v[k] for n, v in state["params"].items()}
    out.update({f"opt.{n}": v[k] for n, v in state["opt_state"].items()})
    out.update({f"env.{n}": v[k] for n, v in state["env_state"].items()})
    for name in ("env_rng", "obs", "ep_return", "last_return"):
        out[name] = state[name][k]
    out["evals"] = torch.stack([r[k] for r in state["eval_returns"]])
    return out


def assert_rows_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]) or (a[key].isnan().all() and b[key].isnan().all()), key


@pytest.fixture(scope="module")
def singles(tmp_path_factory):
    """Seeds 3..6 trained alone: their final checkpoint rows and metrics."""
    root = tmp_path_factory.mktemp("singles")
    out = {}
    for seed in range(3, 7):
        multiseed.train_ppo(tiny(seed=seed), root / str(seed))
        out[seed] = (row(final_state(root / str(seed)), 0), read_metrics_csv(root / str(seed) / "seed_0" / "metrics.csv"))
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_each_member_equals_its_run_alone(n, singles, tmp_path):
    """(n=1: the run alone, again: runs are deterministic.) Data streams (env states and counters, observations, episode returns), parameters,
    Adam states, evaluations and logged metrics: bitwise equal to the seed's own run."""
    multiseed.train_ppo(tiny(seed=3, seeds=n), tmp_path)
    state = final_state(tmp_path)
    assert state["frames"] == 48
    for k in range(n):
        alone, alone_csv = singles[3 + k]
        assert_rows_equal(row(state, k), alone)
        csv = read_metrics_csv(tmp_path / f"seed_{k}" / "metrics.csv")
        for col in ("step", "train/loss_objective", "train/loss_critic", "train/grad_norm", "eval/return"):
            np.testing.assert_array_equal(csv[col], alone_csv[col])
    members = [row(state, k) for k in range(n)]
    assert all(not torch.equal(members[0]["params.critic_network.module.0.weight"],
                               m["params.critic_network.module.0.weight"]) for m in members[1:])


def test_compiled_population_is_three_graphs_and_equals_the_runs_alone(singles, tmp_path):
    """``compile=true``: the vmapped PPO update (loss, torch.func gradients, clipping, Adam),
    the collection step (policies, draws, env step with auto-reset) and the advantages
    (critics, GAE) are one ``fullgraph`` graph each, traced once for the whole run (no
    recompile, no fallback);
    with dynamo's ``eager`` backend (the traced graphs run op by op) every member's
    parameters, Adam state, env streams, evaluations and metrics equal its seed's eager
    run alone bit for bit. (With inductor the kernels fuse and reorder: equal within float
    rounding, checked in benchmarks/README.md, not here: the code generation costs ~20 s.)"""
    import warnings

    from torch._dynamo.utils import counters

    counters.clear()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*compile=true.*")
        multiseed.train_ppo(tiny(seed=3, seeds=2, compile=True, compile_backend="eager"), tmp_path)
    assert counters["stats"]["unique_graphs"] == 3 and not counters["graph_break"], dict(counters)
    state = final_state(tmp_path)
    for k in range(2):
        alone, alone_csv = singles[3 + k]
        assert_rows_equal(row(state, k), alone)
        csv = read_metrics_csv(tmp_path / f"seed_{k}" / "metrics.csv")
        for col in ("train/loss_objective", "train/loss_critic", "train/grad_norm", "eval/return"):
            np.testing.assert_array_equal(csv[col], alone_csv[col])


@pytest.mark.parametrize("backend", ["inductor", "eager"])
def test_compiled_population_graphs_get_the_fused_graphs_inductor_options(monkeypatch, tmp_path, backend):
    """``Population.vmapped`` compiles with :data:`fused.INDUCTOR_OPTIONS` (the C++ wrapper)
    and the remembered ISA probe under inductor; other backends get no inductor options."""
    from steersman.recipes import fused, precompiled

    seen, probes = [], []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw) or fn)
    monkeypatch.setattr(precompiled, "remember_vec_isa", lambda: probes.append(1) or True)
    pop = multiseed.Population("ppo", tiny(seeds=2, compile=True, compile_backend=backend), tmp_path / "run",
                               resume=False, batch_frames=16)
    pop.vmapped(lambda x: x + 1, "test function", vmap=False)
    assert [kw["backend"] for kw in seen] == [backend]
    assert seen[0]["fullgraph"] is True and seen[0]["dynamic"] is False
    if backend == "inductor":
        assert seen[0]["options"] == fused.INDUCTOR_OPTIONS and seen[0]["options"]["cpp_wrapper"] is True
        assert probes == [1]
    else:
        assert seen[0]["options"] is None and probes == []


def test_compiled_calls_skip_guards_only_for_a_seen_signature(monkeypatch, tmp_path):
    """``Population.vmapped`` with compile=true: the first call of a signature runs with
    dynamo's guards, later calls of it without (``skip_guard_eval_unsafe``); new shapes,
    strides or numbers recompile and give the right result, never a stale graph's."""
    from torch._dynamo.utils import counters

    real, fast = torch.compiler.set_stance, []

    def spy(*args, **kwargs):
        fast.append(kwargs.get("skip_guard_eval_unsafe", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.compiler, "set_stance", spy)
    pop = multiseed.Population("ppo", tiny(seeds=2, compile=True, compile_backend="eager"), tmp_path / "run",
                               resume=False, batch_frames=16)
    f = pop.vmapped(lambda x, y, k: x * k + y, "test function", vmap=False)
    counters.clear()
    g = torch.Generator().manual_seed(0)
    calls = [(torch.randn(2, 3, generator=g), torch.randn(2, 3, generator=g), 2.0) for _ in range(3)]
    calls.append((torch.randn(2, 5, generator=g), torch.randn(2, 5, generator=g), 2.0))  # new shape
    calls.append((torch.randn(3, 2, generator=g).T, torch.randn(2, 3, generator=g), 2.0))  # new strides
    calls.append((calls[0][0], calls[0][1], 3.0))  # new number
    for x, y, k in calls:
        assert torch.equal(f(x, y, k), x * k + y)
    with torch.no_grad():  # another grad mode: the guards run (and dynamo recompiles)
        assert torch.equal(f(*calls[0]), calls[0][0] * 2.0 + calls[0][1])
    assert fast == [True, True], fast  # calls 2 and 3; every other call was a signature's first
    assert counters["stats"]["unique_graphs"] == 5, dict(counters["stats"])


def test_pure_ppo_loss_equals_clip_ppo_loss():
    """The compiled path's loss on plain tensors: ClipPPOLoss's terms and gradients, bit for
    bit (normalized advantages, clipped ratios, entropy bonus, l2 critic)."""
    from steersman.envs import CartPoleEnv
    from steersman.tensordict import TensorDict

    cfg = tiny()
    cfg.loss.entropy_coef = 0.01
    env = CartPoleEnv(batch_size=[2])
    torch.manual_seed(0)
    actor, critic = ppo.make_policy(cfg, env), ppo.make_critic(cfg, env)
    loss_fn = multiseed.ClipPPOLoss(actor, critic, clip_epsilon=0.1, entropy_coeff=0.01, critic_coeff=0.5,
                                    loss_critic_type="l2", normalize_advantage=True, diagnostics=False)
    g = torch.Generator().manual_seed(1)
    n = 64
    batch = TensorDict({"observation": torch.randn(n, 4, generator=g), "action": torch.randint(0, 2, (n,), generator=g),
                        "action_log_prob": -torch.rand(n, generator=g) - 0.3,
                        "advantage": torch.randn(n, 1, generator=g), "value_target": torch.randn(n, 1, generator=g)},
                       [n])
    out = loss_fn(batch)
    ref = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
    ref_grads = torch.autograd.grad(ref, list(loss_fn.parameters()))
    names = ["actor_network." + n for n, _ in actor.named_parameters()] + \
        ["critic_network." + n for n, _ in critic.named_parameters()]
    leaves = tuple(p for p in list(actor.parameters()) + list(critic.parameters()))
    a_prog = multiseed._program(actor.module[0].module, names, "actor_network.module.0.module.")
    c_prog = multiseed._program(critic.module, names, "critic_network.module.")
    total, l_obj, l_crit = multiseed._pure_ppo_loss(
        a_prog, c_prog, leaves, batch["observation"], batch["action"], batch["action_log_prob"], batch["advantage"],
        batch["value_target"], loss_fn.clip_epsilon, 0.01, 0.5, True)
    assert torch.equal(l_obj, out["loss_objective"]) and torch.equal(l_crit, out["loss_critic"])
    assert torch.equal(total, ref)
    for a, b in zip(torch.autograd.grad(total, list(leaves)), ref_grads):
        assert torch.equal(a, b)


def test_compile_falls_back_to_the_module_update_for_other_networks(monkeypatch, tmp_path):
    """Networks the plain-tensor path cannot run: a one-line warning saying why, and the
    module-swapping update is the one compiled (never a silent wrong result)."""
    monkeypatch.setattr(multiseed, "_program", lambda *a: None)
    cfg = tiny(seeds=2, compile=True, compile_backend="eager")
    pop = multiseed.Population("ppo", cfg, tmp_path / "run", resume=False, batch_frames=16)
    with pytest.warns(UserWarning, match="not plain MLPs .* compiling the module-swapping update instead"):
        model = multiseed._OnPolicyModel("ppo", pop)
    assert model.step_fn is None

def test_sweep_trains_every_combination(tmp_path):
    """sweep.optim.lr=[1e-3, 3e-4] seeds=2: 4 members; the (3e-4, seed 1) member is the run
    of optim.lr=3e-4 seed=1 alone; the lr column follows each member's schedule."""
    cfg = tiny(seed=0, seeds=2, sweep={"optim": {"lr": [1e-3, 3e-4]}})
    assert multiseed.members_of(cfg) == [(0, {"optim.lr": 1e-3}), (1, {"optim.lr": 1e-3}),
                                         (0, {"optim.lr": 3e-4}), (1, {"optim.lr": 3e-4})]
    multiseed.train_ppo(cfg, tmp_path / "sweep")
    multiseed.train_ppo(tiny(seed=1, optim=PPOOptimConfig(lr=3e-4)), tmp_path / "alone")
    pop = final_state(tmp_path / "sweep")
    assert_rows_equal(row(pop, 3), row(final_state(tmp_path / "alone"), 0))
    for k, lr in enumerate([1e-3, 1e-3, 3e-4, 3e-4]):
        csv = read_metrics_csv(tmp_path / "sweep" / f"seed_{k}" / "metrics.csv")
        want = [np.float32(lr) * np.float32(1 - s / 48) for s in csv["step"]]  # linear decay, float32
        np.testing.assert_allclose(csv["train/lr"], want, rtol=1e-6)
    # `steersman plot` groups the members by their swept value (seed left out)
    fig = plot_learning_curves([tmp_path / "sweep"])
    assert {ln.get_gid() for ln in fig.axes[0].get_lines()} >= {"optim.lr=0.001:eval", "optim.lr=0.0003:eval"}


def test_run_directory_and_export(tmp_path):
    """Per-member metrics, configs, policies and exports; the aggregate plot; the summary."""
    from steersman.envs import CartPoleEnv
    from steersman.recipes.ppo import make_policy

    cfg = tiny(seeds=2, export_format="torch-export", total_frames=16)
    summary = ppo.train(cfg, tmp_path)  # the PPO recipe hands seeds > 1 to multiseed
    assert (tmp_path / "plots" / "learning_curve.png").stat().st_size > 0
    assert summary["members"] == 2 and set(summary["final_eval_return"]) == {"seed_0", "seed_1"}
    finals = list(summary["final_eval_return"].values())
    assert summary["aggregate"]["mean"] == pytest.approx(sum(finals) / 2)
    state = final_state(tmp_path)
    obs = torch.randn(5, 4)
    for k in range(2):
        d = tmp_path / f"seed_{k}"
        assert (d / "config.yaml").is_file() and (d / "metrics.csv").is_file()
        actor = make_policy(cfg, CartPoleEnv(batch_size=[2]))
        actor.load_state_dict(torch.load(d / "policy.pt", weights_only=True))
        w = state["params"]["actor_network.module.0.module.0.weight"][k]
        assert torch.equal(actor.module[0].module[0].weight, w)
        program = torch.export.load(tmp_path / "export" / f"seed_{k}" / "policy.pt2").module()
        with torch.no_grad():
            greedy = actor.module[0].module(obs).argmax(-1)
        assert torch.equal(program(obs), greedy)


def test_resume_is_bit_exact(tmp_path):
    """A run killed after its first checkpoint and resumed ends exactly as the run that went
    through (parameters, Adam states, env streams, evaluations, logged metrics)."""
    import json
    import shutil

    multiseed.train_ppo(tiny(seeds=2), tmp_path / "whole")
    shutil.copytree(tmp_path / "whole", tmp_path / "crash")
    ckpts = tmp_path / "crash" / "checkpoints"
    for later in ("ckpt-000002", "ckpt-000003"):  # as if killed before them
        shutil.rmtree(ckpts / later)
    (ckpts / "LATEST").write_text(json.dumps({"current": "ckpt-000001"}))
    assert final_state(tmp_path / "crash")["frames"] == 16
    multiseed.train_ppo(tiny(seeds=2), tmp_path / "crash", resume=True)
    a, b = final_state(tmp_path / "whole"), final_state(tmp_path / "crash")
    for k in range(2):
        assert_rows_equal(row(a, k), row(b, k))
        whole, crash = (read_metrics_csv(tmp_path / d / f"seed_{k}" / "metrics.csv") for d in ("whole", "crash"))
        assert whole.pop("time/fps") and crash.pop("time/fps")  # wall-clock: the only column that differs
        assert whole == crash
    with pytest.raises(multiseed.RunFinished, match="already finished"):
        multiseed.train_ppo(tiny(seeds=2), tmp_path / "crash", resume=True)
    with pytest.raises(multiseed.RunDirError, match="seeds: 2 -> 3"):
        multiseed.train_ppo(tiny(seeds=3, total_frames=64), tmp_path / "crash", resume=True)
    with pytest.raises(multiseed.RunDirError, match="already holds a run"):
        multiseed.train_ppo(tiny(seeds=2), tmp_path / "whole")


@pytest.mark.parametrize("kw, match", [
    (dict(seeds=0), "seeds must be an integer >= 1, got 0"),
    (dict(seeds=-2), "seeds must be an integer >= 1, got -2"),
    (dict(sweep={"hidden_sizes": [[32], [64]]}), "sweep.hidden_sizes cannot vary per member"),
    (dict(sweep={"env": {"num_envs": [2, 4]}}), "sweep.env.num_envs cannot vary per member"),
    (dict(sweep={"optim": {"lrr": [1e-3]}}), "sweep.optim.lrr: the config has no field 'optim.lrr'"),
    (dict(sweep={"optim": {"lr": 1e-3}}), r"sweep.optim.lr must be a non-empty list of numbers, got 0.001"),
    (dict(sweep={"optim": {"lr": []}}), r"sweep.optim.lr must be a non-empty list of numbers"),
    (dict(sweep={"optim": {"lr": [1e-3, -1.0]}}), "lr must be a number > 0, got -1.0"),
    (dict(env=EnvConfig(name="Pendulum-v1", num_envs=2)), "discrete-action envs"),
    (dict(env=EnvConfig(name="gym:CartPole-v1", num_envs=2)), "torch-native env"),
])
def test_bad_config_is_refused_before_anything_is_written(kw, match, tmp_path):
    with pytest.raises(ConfigError, match=match):
        multiseed.train_ppo(tiny(**kw), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_command_line_overrides_make_a_population():
    """``sweep.optim.lr=[1e-3,3e-4] seeds=2`` as typed after ``steersman train ppo``."""
    cfg = make_config("ppo", ["sweep.optim.lr=[1e-3,3e-4]", "seeds=2"])
    assert multiseed.members_of(cfg) == [(0, {"optim.lr": 1e-3}), (1, {"optim.lr": 1e-3}),
                                         (0, {"optim.lr": 3e-4}), (1, {"optim.lr": 3e-4})]
    with pytest.raises(ConfigError, match="seeds must be an integer >= 1, got 0"):
        ppo.train(make_config("ppo", ["seeds=0"]), None)


# ---------------------------------------------------------------- the pieces, against plain references
@settings(max_examples=25, deadline=None)
@given(seeds=st.lists(st.integers(0, 2**40), min_size=1, max_size=5, unique=True), n=st.integers(1, 40))
def test_streams_of_a_member_do_not_depend_on_the_others(seeds, n):
    together = multiseed.Streams(seeds, salt=1)
    u, perm = together.uniform(n), together.permutation(n)
    assert ((u >= 0) & (u < 1)).all()
    for k, s in enumerate(seeds):
        alone = multiseed.Streams([s], salt=1)
        assert torch.equal(alone.uniform(n)[0], u[k])
        assert torch.equal(alone.permutation(n)[0], perm[k])
        assert sorted(perm[k].tolist()) == list(range(n))


@settings(max_examples=25, deadline=None)
@given(seeds=st.lists(st.integers(0, 2**40), min_size=1, max_size=4, unique=True), n=st.integers(1, 40),
       k=st.integers(1, 6))
def test_draws_at_once_equal_draws_one_by_one(seeds, n, k):
    """``permutations(n, k)`` (a batch's epochs) and ``uniform(k * n)`` (a batch's steps) give
    the numbers of ``k`` successive calls, and leave the counter where those calls do."""
    at_once, one_by_one = multiseed.Streams(seeds, salt=2), multiseed.Streams(seeds, salt=2)
    perms = at_once.permutations(n, k)
    assert perms.shape == (len(seeds), k, n)
    for j in range(k):
        assert torch.equal(perms[:, j], one_by_one.permutation(n))
    u = at_once.uniform(k * n).view(-1, k, n)
    for j in range(k):
        assert torch.equal(u[:, j], one_by_one.uniform(n))
    assert at_once.counter == one_by_one.counter == 2 * k * n


def test_streams_are_uniform_and_salted():
    u = multiseed.Streams([0], salt=1).uniform(20_000)[0]
    hist = torch.histc(u, bins=10, min=0, max=1)
    assert (hist - 2000).abs().max() < 200  # ~4.5 sigma of a binomial(20000, 0.1)
    assert not torch.equal(multiseed.Streams([0], salt=2).uniform(8), multiseed.Streams([0], salt=1).uniform(8))


def test_categorical_draw_inverts_the_cdf():
    """A grid of u gives each action a share equal to its probability; the log-prob is
    torch.distributions.Categorical's."""
    logits = torch.tensor([0.3, -1.0, 2.0, 0.0])
    u = (torch.arange(10_000) + 0.5) / 10_000
    action, logp = multiseed._categorical_draw(logits.expand(10_000, 4), u)
    share = torch.bincount(action, minlength=4).double() / 10_000
    torch.testing.assert_close(share, torch.softmax(logits.double(), -1), atol=2e-4, rtol=0)
    ref = torch.distributions.Categorical(logits=logits).log_prob(action)
    torch.testing.assert_close(logp, ref)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 12), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.integers(0, 2**31))
def test_gae_matches_a_plain_loop(T, gamma, lmbda, seed):
    g = torch.Generator().manual_seed(seed)
    value, next_value, reward = (torch.randn(3, T, generator=g, dtype=torch.float64) for _ in range(3))
    done = torch.rand(3, T, generator=g) < 0.3
    terminated = done & (torch.rand(3, T, generator=g) < 0.5)
    adv, target = multiseed._gae(value, next_value, reward, terminated, done, gamma, lmbda)
    for i in range(3):
        running = 0.0
        for t in reversed(range(T)):
            boot = 0.0 if terminated[i, t] else gamma * float(next_value[i, t])
            delta = float(reward[i, t]) + boot - float(value[i, t])
            running = delta + (0.0 if done[i, t] else gamma * lmbda * running)
            assert float(adv[i, t]) == pytest.approx(running, abs=1e-9)
            assert float(target[i, t]) == pytest.approx(running + float(value[i, t]), abs=1e-9)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=30))
def test_aggregate_returns_against_scipy(values):
    from scipy import stats

    s = aggregate_returns(values)
    x = np.asarray(values)
    assert s["mean"] == pytest.approx(x.mean(), abs=1e-9)
    assert s["iqm"] == pytest.approx(stats.trim_mean(x, 0.25), abs=1e-9)
    assert s["ci_low"] - 1e-9 <= s["mean"] <= s["ci_high"] + 1e-9
    assert x.min() - 1e-9 <= s["ci_low"] and s["ci_high"] <= x.max() + 1e-9


def test_aggregate_interval_covers_like_a_95_percent_interval():
    """Of 200 samples of 10 normal scores, the bootstrap interval holds the true mean ~95% of
    the time (a percentile bootstrap on 10 seeds is a little narrow: 85%-99%)."""
    rng = np.random.default_rng(0)
    hits = sum(s["ci_low"] <= 0.0 <= s["ci_high"] for s in
               (aggregate_returns(rng.normal(size=10), n_boot=500) for _ in range(200)))
    assert 170 <= hits <= 198
    assert math.isnan(aggregate_returns([math.nan])["mean"])


@pytest.mark.slow
def test_four_seeds_reach_475_on_cartpole(tmp_path):
    """Issue 17's learning test: 4 PPO seeds at once (``seeds=4``, one vmapped update) on
    native CartPole, 32,768 frames each: every seed's deterministic evaluation (10 episodes)
    ends >= 475, and every seed's saved final policy holds >= 450 on 20 other starts.

    The settings are rl-zoo's (8 envs x 32 steps, 20 epochs of 256, GAE(0.98, 0.8), lr and
    clip linear to 0) with lr 2e-3 instead of 1e-3 and an entropy bonus of 0.01: rl-zoo's
    needed ~40k frames per seed for all 4. With these settings 16,384 frames were enough for
    seeds 0-3 (500, 500, 484.7, 500) but only for 4 of seeds 4-11, so a change in torch's
    last bits could fail the test; at 32,768 frames 31 of 32 seeds reach 475
    (benchmarks/README.md, "Every seed to 475"), so the test budget is that (~80 s CPU).
    """
    cfg = PPOConfig(seeds=4, total_frames=32_768, quiet=True, logger=LoggerConfig(backends=["csv"]),
                    export_format="none", eval=EvalConfig(interval=0, episodes=10),
                    checkpoint=CheckpointConfig(interval=0))
    cfg.optim.lr, cfg.loss.entropy_coef = 2e-3, 0.01
    summary = ppo.train(cfg, tmp_path)  # seeds=4: the recipe hands the population to multiseed
    finals = list(summary["final_eval_return"].values())
    print(f"final deterministic returns of seeds 0-3: {finals} (min {min(finals):.1f}, threshold 475)")
    assert summary["members"] == 4 and summary["frames_per_member"] == 32_768
    assert min(finals) >= 475, finals
    for k in range(4):
        evals = [r for r in read_metrics_csv(tmp_path / f"seed_{k}" / "metrics.csv")["eval/return"]
                 if not math.isnan(r)]
        assert evals == [pytest.approx(finals[k])]  # the one evaluation, at the end, is the logged one
        env = make_env("CartPole-v1", 20, seed=123)
        policy = ppo.make_policy(cfg, env)
        policy.load_state_dict(torch.load(tmp_path / f"seed_{k}" / "policy.pt", weights_only=True))
        held = float(evaluate(env, policy).mean())
        print(f"seed {k}: saved policy on 20 other starts: {held:.1f} (threshold 450)")
        assert held >= 450, (k, held)


# ---------------------------------------------------------------- A2C and DQN populations (the shared machinery)
def tiny_a2c(**kw):
    from steersman.recipes.a2c import A2CConfig

    base = dict(env=EnvConfig(name="CartPole-v1", num_envs=2), n_steps=4, total_frames=48, hidden_sizes=[16, 16],
                quiet=True, logger=LoggerConfig(backends=["csv"]), export_format="none",
                eval=EvalConfig(interval=32, episodes=2), checkpoint=CheckpointConfig(interval=16, keep=5))
    base.update(kw)
    return A2CConfig(**base)


def tiny_dqn(**kw):
    """2 sub-envs, 8 frames a batch, random until 16 frames, then 2 updates of 8 samples per batch
    from a 32-transition buffer (it wraps): every piece runs."""
    from steersman.recipes.dqn import DQNConfig

    base = dict(env=EnvConfig(name="CartPole-v1", num_envs=2), frames_per_batch=8, gradient_steps=2, batch_size=8,
                buffer_size=32, learning_starts=16, hidden_sizes=[16, 16], total_frames=48, quiet=True,
                logger=LoggerConfig(backends=["csv"]), export_format="none",
                eval=EvalConfig(interval=32, episodes=2), checkpoint=CheckpointConfig(interval=16, keep=5))
    base.update(kw)
    return DQNConfig(**base)


def tiny_continuous(cls, **kw):
    """SAC/TD3 on native Pendulum (20-step episodes), tiny_dqn's budget (2 updates per 8 frames).
    Minibatches of 32: a member's ``[32, 1]`` tensors fill whole vector steps of CPU kernels,
    whatever the row count (with 8, ``softplus`` ran its scalar tail for 2 rows and its
    vector body for 4, and the last bits differed)."""
    base = dict(env=EnvConfig(name="Pendulum-v1", num_envs=2, max_episode_steps=20), frames_per_batch=8,
                utd_ratio=0.25, batch_size=32, buffer_size=32, learning_starts=16, hidden_sizes=[16, 16], total_frames=48, quiet=True,
                logger=LoggerConfig(backends=["csv"]), export_format="none",
                eval=EvalConfig(interval=32, episodes=2), checkpoint=CheckpointConfig(interval=16, keep=5))
    base.update(kw)
    return cls(**base)


def tiny_sac(**kw):
    from steersman.recipes.sac import SACConfig

    return tiny_continuous(SACConfig, **kw)


def tiny_td3(**kw):
    from steersman.recipes.td3 import TD3Config

    return tiny_continuous(TD3Config, **kw)


TINY = {"a2c": (tiny_a2c, multiseed.train_a2c, ("train/loss_objective", "train/loss_critic", "train/grad_norm")),
        "dqn": (tiny_dqn, multiseed.train_dqn, ("train/loss", "train/grad_norm", "train/epsilon")),
        "sac": (tiny_sac, multiseed.train_sac, ("train/loss_actor", "train/loss_qvalue", "train/alpha")),
        "td3": (tiny_td3, multiseed.train_td3, ("train/loss_qvalue", "train/loss_actor"))}


def member_row(state: dict, k: int) -> dict:
    """Member k's slice of everything an A2C/DQN population checkpoint holds per member."""
    out = {}
    for group in ("params", "opt_state", "env_state"):
        out.update({f"{group}.{n}": v[k] for n, v in state.get(group, {}).items()})
    for group, leaves in state.get("learn", {}).items():  # off-policy: parameters, targets, optimizer states
        out.update({f"{group}.{n}": v[k] for n, v in leaves.items()})
    for n, v in state.get("buffer", {}).get("data", {}).items():
        out[f"buffer.{n}"] = v[k]
    for name in ("env_rng", "obs", "ep_return", "last_return", "metrics"):
        if name in state:
            out[name] = state[name][k]
    out["evals"] = torch.stack([r[k] for r in state["eval_returns"]])
    return out


class _Singles(dict):
    """``(algo, seed) -> (final checkpoint row, metrics)`` of that seed trained alone, each
    run the first time a test asks for it (an xdist worker that runs only some algorithms'
    cases trains only their seeds)."""

    def __init__(self, root) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, key):
        algo, seed = key
        make, train, _ = TINY[algo]
        train(make(seed=seed), self.root / f"{algo}{seed}")
        self[key] = (member_row(final_state(self.root / f"{algo}{seed}"), 0),
                     read_metrics_csv(self.root / f"{algo}{seed}" / "seed_0" / "metrics.csv"))
        return self[key]


@pytest.fixture(scope="module")
def singles_off(tmp_path_factory):
    """A2C, DQN, SAC and TD3 seeds 3..6 trained alone (lazily): final checkpoint rows and metrics."""
    return _Singles(tmp_path_factory.mktemp("singles_off"))


@pytest.mark.parametrize("algo", list(TINY))
@pytest.mark.parametrize("n", [2, 3, 4])
def test_population_members_equal_their_runs_alone(algo, n, singles_off, tmp_path):
    """(n=1: the ``singles_off`` runs themselves.) Parameters, optimizer states, target
    networks and replay buffers (DQN, SAC, TD3), env streams, evaluations and logged
    metrics of member k: bitwise those of its seed alone."""
    make, train, cols = TINY[algo]
    train(make(seed=3, seeds=n), tmp_path)
    state = final_state(tmp_path)
    assert state["frames"] == 48
    for k in range(n):
        alone, alone_csv = singles_off[algo, 3 + k]
        assert_rows_equal(member_row(state, k), alone)
        csv = read_metrics_csv(tmp_path / f"seed_{k}" / "metrics.csv")
        for col in ("step", *cols, "eval/return"):
            np.testing.assert_array_equal(csv[col], alone_csv[col])
    params = state["params"] if "params" in state else state["learn"]["params" if algo != "td3" else "actor"]
    name = next(n for n in params if n.endswith("weight"))
    assert all(not torch.equal(params[name][0], params[name][k]) for k in range(1, n))
    for k in range(n):
        assert_policy_file_holds_member(tmp_path, state, k)


def assert_policy_file_holds_member(run_dir, state: dict, k: int) -> None:
    """``seed_<k>/policy.pt`` holds member k's trained policy weights (the checkpoint's row k)."""
    learn = state.get("learn", {})
    trained = {**state.get("params", {}), **learn.get("params", {}), **learn.get("actor", {})}
    saved = torch.load(run_dir / f"seed_{k}" / "policy.pt", weights_only=True)
    checked = 0
    for name, value in saved.items():
        for net in ("actor_network", "value_network"):
            if f"{net}.{name}" in trained:
                assert torch.equal(trained[f"{net}.{name}"][k], value), (k, name)
                checked += 1
    assert checked >= 6, sorted(saved)  # every weight and bias of the 3-layer MLP


def test_recipes_hand_populations_to_multiseed_and_sweep_lr(tmp_path):
    """a2c.train / dqn.train with seeds=2 and a sweep write a population run; a swept
    member equals that value's run alone (DQN, optim.lr)."""
    from steersman.recipes import a2c, dqn
    from steersman.recipes.config import ClippedOptimConfig

    summary = a2c.train(tiny_a2c(seeds=2, total_frames=16), tmp_path / "a2c")
    assert summary["algo"] == "a2c" and summary["members"] == 2
    cfg = tiny_dqn(seeds=1, sweep={"optim": {"lr": [1e-3, 3e-3]}})
    assert multiseed.members_of(cfg) == [(0, {"optim.lr": 1e-3}), (0, {"optim.lr": 3e-3})]
    dqn.train(cfg, tmp_path / "sweep")
    multiseed.train_dqn(tiny_dqn(optim=ClippedOptimConfig(lr=3e-3, max_grad_norm=10.0)), tmp_path / "alone")
    assert_rows_equal(member_row(final_state(tmp_path / "sweep"), 1),
                      member_row(final_state(tmp_path / "alone"), 0))


def test_dqn_population_resume_is_bit_exact(tmp_path):
    """Killed after its first checkpoint and resumed: the replay buffers, target networks,
    epsilon schedule and sample streams continue exactly."""
    import json
    import shutil

    multiseed.train_dqn(tiny_dqn(seeds=2), tmp_path / "whole")
    shutil.copytree(tmp_path / "whole", tmp_path / "crash")
    ckpts = tmp_path / "crash" / "checkpoints"
    for later in ("ckpt-000002", "ckpt-000003"):
        shutil.rmtree(ckpts / later)
    (ckpts / "LATEST").write_text(json.dumps({"current": "ckpt-000001"}))
    multiseed.train_dqn(tiny_dqn(seeds=2), tmp_path / "crash", resume=True)
    a, b = final_state(tmp_path / "whole"), final_state(tmp_path / "crash")
    for k in range(2):
        assert_rows_equal(member_row(a, k), member_row(b, k))
    with pytest.raises(multiseed.RunDirError, match="it is a dqn run"):
        multiseed.train_a2c(tiny_a2c(seeds=2), tmp_path / "crash", resume=True)


@pytest.mark.parametrize("algo, kw, match", [
    ("a2c", dict(seeds=0), "seeds must be an integer >= 1, got 0"),
    ("dqn", dict(seeds=-1), "seeds must be an integer >= 1, got -1"),
    ("a2c", dict(sweep={"hidden_sizes": [[32], [64]]}), "sweep.hidden_sizes cannot vary per member"),
    ("dqn", dict(sweep={"gamma": [0.9, 0.99]}), "sweep.gamma cannot vary per member"),
    ("dqn", dict(sweep={"buffer_size": [10, 20]}), "sweep.buffer_size cannot vary per member"),
    ("dqn", dict(seeds=2, frames_per_batch=9), r"frames_per_batch \(9\) must be a multiple of env.num_envs \(2\)"),
    ("a2c", dict(seeds=2, env=EnvConfig(name="Pendulum-v1", num_envs=2)), "discrete-action envs"),
    ("sac", dict(seeds=2, env=EnvConfig(name="CartPole-v1", num_envs=2)), "continuous-action envs"),
    ("td3", dict(seeds=2, env=EnvConfig(name="CartPole-v1", num_envs=2)), "bounded continuous action"),
    ("sac", dict(sweep={"tau": [0.01, 0.005]}), "sweep.tau cannot vary per member"),
    ("td3", dict(sweep={"optim": {"max_grad_norm": [1.0]}}), "the config has no field 'optim.max_grad_norm'"),
])
def test_population_bad_config_is_refused_before_anything_is_written(algo, kw, match, tmp_path):
    make, train, _ = TINY[algo]
    with pytest.raises(ConfigError, match=match):
        train(make(**kw), tmp_path / "run")
    assert not (tmp_path / "run").exists()
