"""The multi-agent recipes (mappo, ippo, qmix, vdn, maddpg, masac) end to end on tiny budgets: summary,
per-group metrics, checkpoint, exported per-agent policy, bit-exact resume after a stop;
env ids; and (slow) MAPPO and QMIX learning the native cooperative navigation task."""

from __future__ import annotations

import importlib
import importlib.util
import math

import pytest
import torch

from steersman.recipes.checkpoint import load_checkpoint
from steersman.recipes.config import ConfigError
from steersman.recipes.marl_envs import make_marl_env
from steersman.recipes.run import Run
from steersman.record import read_metrics_csv
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import ExplorationType, set_exploration_type
from tests.recipes._tiny import tiny_config as config
from tests.recipes.test_resume import _flat

CONFIGS = {"mappo": "MAPPOConfig", "ippo": "IPPOConfig", "qmix": "QMIXConfig", "vdn": "VDNConfig",
           "maddpg": "MADDPGConfig", "masac": "MASACConfig"}


def recipe(algo):
    return importlib.import_module(f"steersman.recipes.{algo}")


@pytest.mark.parametrize("algo", sorted(CONFIGS))
def test_recipe_smoke(algo, tmp_path):
    exports = algo in ("mappo", "qmix", "masac")
    cfg = config(algo, export_format="torch-export" if exports else "none")
    summary = recipe(algo).train(cfg, tmp_path / algo)
    assert summary["algo"] == algo and not summary["interrupted"] and math.isfinite(summary["final_eval_return"])
    cols = read_metrics_csv(tmp_path / algo / "metrics.csv")
    assert cols["step"][-1] == summary["frames"] and "train/return/agents" in cols
    assert not math.isnan(cols["eval/return"][-1])
    ckpt = load_checkpoint(tmp_path / algo / "checkpoints")
    assert ckpt.meta["frames"] == summary["frames"] and "policy" in ckpt.state
    policy_file = tmp_path / algo / "export" / "policy.pt2"
    assert policy_file.exists() == exports
    if exports:  # the file maps every agent's observation to the live policy's deterministic actions
        env = make_marl_env("navigation", 3, seed=1, categorical_actions=algo == "qmix")
        policy = recipe(algo).make_policy(cfg, env)
        policy.load_state_dict(ckpt.state["policy"])
        obs = env.reset()["agents", "observation"]
        with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
            want = policy(TensorDict({"agents": TensorDict({"observation": obs}, [3, 3])}, [3]))["agents", "action"]
        got = torch.export.load(policy_file).module()(obs)
        assert got.shape == want.shape and torch.allclose(got.to(want.dtype), want, atol=1e-6)


# QMIX/VDN's resume used to differ: the collector's saved state gave the group "agents" the
# batch [B] instead of [B, n_agents], so the epsilon-greedy coin of the first resumed step
# was drawn per env, not per agent, and the RNG stream shifted (fixed in the collector).
ALGOS_RESUME = ["ippo", "maddpg", "mappo", "masac", "qmix", "vdn"]


class _Killed(Exception):
    """Stands for SIGKILL: the run stops where it is, nothing more is written."""


@pytest.mark.parametrize("algo", ALGOS_RESUME)
def test_kill_and_resume_is_bit_exact(algo, tmp_path, monkeypatch):
    """A run killed in its third batch (after the checkpoint of its second one) and resumed
    from that checkpoint ends with the same checkpoint (networks, targets, optimizer,
    exploration, collector, replay buffer, RNG) and final evaluation as an uninterrupted run."""
    batch = 32 if algo in ("mappo", "ippo") else 16
    overrides = {"total_frames": 4 * batch, "export_format": "none", "checkpoint.interval": batch}
    full = recipe(algo).train(config(algo, **overrides), tmp_path / "full")
    original = Run.log

    def log(self, frames, metrics):  # after the update of batch 3, before its checkpoint
        original(self, frames, metrics)
        if frames == 3 * batch and not self._resume:
            raise _Killed

    monkeypatch.setattr(Run, "log", log)
    with pytest.raises(_Killed):
        recipe(algo).train(config(algo, **overrides), tmp_path / "killed")
    assert load_checkpoint(tmp_path / "killed" / "checkpoints").meta["frames"] == 2 * batch
    monkeypatch.setattr(Run, "log", original)
    resumed = recipe(algo).train(config(algo, **overrides), tmp_path / "killed", resume=True)
    assert resumed["frames"] == full["frames"] and resumed["final_eval_return"] == full["final_eval_return"]
    a = dict(_flat(load_checkpoint(tmp_path / "full" / "checkpoints").state))
    b = dict(_flat(load_checkpoint(tmp_path / "killed" / "checkpoints").state))
    assert a.keys() == b.keys()
    for key, va in a.items():
        if isinstance(va, torch.Tensor):
            assert torch.equal(va, b[key]), key
        elif not (isinstance(va, float) and math.isnan(va)):
            assert va == b[key], key


def test_env_ids():
    with pytest.raises(ConfigError, match="unknown multi-agent env id 'CartPole-v1'.*vmas/<scenario>"):
        make_marl_env("CartPole-v1", 2)
    with pytest.raises(ConfigError, match="num_envs must be >= 1"):
        make_marl_env("navigation", 0)
    env = make_marl_env("predator_prey", 2, seed=0, categorical_actions=True)
    assert env.group_map == {"agents": ["agent_0", "agent_1", "agent_2"]} and env.batch_size == (2,)


@pytest.mark.parametrize("name", ["navigation", "vmas/navigation"])
def test_inference_batches_equal_the_collectors_batches(name):
    """Collected under inference mode, the batches hold ordinary tensors (usable in a backward
    pass) equal to those of the same collector run in the caller's mode, and the collector goes
    on from where it was (its state survives the mode)."""
    if name.startswith("vmas/"):
        pytest.importorskip("vmas", reason="the vmas extra (pip install steersman[vmas])")
    from steersman.collectors import SyncDataCollector
    from steersman.recipes.marl_common import inference_batches

    def batches(wrap):
        torch.manual_seed(0)
        env = make_marl_env(name, 4, seed=0, n_agents=2, max_steps=5)
        collector = SyncDataCollector(env, None, frames_per_batch=4 * 3, total_frames=4 * 3 * 3)
        return list(wrap(collector))

    plain, inferred = batches(lambda c: c), batches(inference_batches)
    assert len(plain) == len(inferred) == 3
    weight = torch.ones((), requires_grad=True)
    for a, b in zip(plain, inferred):
        assert a.keys(True, True) == b.keys(True, True)
        for key in a.keys(True, True):
            assert not b.get(key).is_inference(), key
            assert torch.equal(a.get(key), b.get(key)), key
        obs = b.get(("agents", "observation"))
        (obs * weight).sum().backward()  # saved for backward: ordinary tensors


def test_mappo_on_vmas(tmp_path):
    pytest.importorskip("vmas", reason="the vmas extra (pip install steersman[vmas])")
    cfg = config("mappo", **{"env.name": "vmas/navigation", "export_format": "none", "total_frames": 32})
    summary = recipe("mappo").train(cfg, tmp_path / "vmas")
    assert math.isfinite(summary["final_eval_return"])


# ------------------------------------------------------------------ learning (slow)
# Cooperative navigation, 3 agents, 50-step episodes. The team return (mean over agents of
# 10 x progress to the own goal, -1 per overlap, +1 when all are on their goals) of a
# uniformly random policy is about -1 (-0.6 to -1.5 over seeds; zero actions: the same,
# the initial overlaps); an agent that walks straight to its goal gets about +10. The
# thresholds need most of that distance covered by every agent, which no untrained policy
# gets near.
@pytest.mark.slow
def test_mappo_learns_navigation(tmp_path):
    cfg = config("mappo", **{"total_frames": 9_600, "n_steps": 50, "epochs": 4, "minibatch_size": 400,
                             "env.num_envs": 32, "env.max_episode_steps": 50, "hidden_sizes": [64, 64],
                             "eval.episodes": 32, "export_format": "none"})
    summary = recipe("mappo").train(cfg, tmp_path / "mappo")
    assert summary["final_eval_return"] >= 4.0, summary


@pytest.mark.slow
def test_qmix_learns_navigation(tmp_path):
    cfg = config("qmix", **{"total_frames": 9_600, "frames_per_batch": 1_600, "gradient_steps": 40,
                            "batch_size": 256, "env.num_envs": 32, "env.max_episode_steps": 50,
                            "hidden_sizes": [64, 64], "eval.episodes": 32, "export_format": "none"})
    summary = recipe("qmix").train(cfg, tmp_path / "qmix")
    assert summary["final_eval_return"] >= 4.0, summary


def _has_sisl() -> bool:
    """pettingzoo with SISL's multiwalker dependencies, found without importing them."""
    return all(importlib.util.find_spec(m) is not None for m in ("pettingzoo", "Box2D", "pygame"))


# MAPPO's `steersman eval`/`export` path (a tanh-normal actor) is proven end to end by
# test_mappo_on_pettingzoo_end_to_end below; it runs here only where that test would skip
# (each `export` costs a torch.export trace and a fresh Python that verifies the file).
@pytest.mark.parametrize("algo", ["qmix"] + ([] if _has_sisl() else ["mappo"]))
def test_cli_eval_and_export_of_a_multi_agent_run(algo, tmp_path, capsys):
    """`steersman eval` reports the team return of a multi-agent run; `steersman export`
    writes the per-agent policy ((agents, observation) [B, n, obs] -> (agents, action))
    and verifies it without steersman."""
    from steersman.cli import main

    recipe(algo).train(config(algo, export_format="none"), tmp_path / "run")
    capsys.readouterr()  # the run's summary
    assert main(["eval", str(tmp_path / "run"), "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{algo} on navigation (") and "over 2 episodes" in out
    assert main(["export", str(tmp_path / "run")]) == 0
    report = capsys.readouterr().out
    assert "observation [B, 3, 10] -> action [B, 3" in report and "max abs diff 0.00e+00" in report
    assert (tmp_path / "run" / "export" / "policy.pt2").is_file()


def test_mappo_on_pettingzoo_end_to_end(tmp_path, capsys):
    """`steersman train mappo env.name=pettingzoo/sisl/multiwalker_v9` (3 walkers, continuous
    torques, a global state): a run folder with per-group metrics and a checkpoint, then
    `steersman eval` (team return) and `steersman export` (per-agent policy, verified)."""
    pytest.importorskip("pettingzoo.sisl", reason="the pettingzoo extra with SISL (box2d)")
    from steersman.cli import main

    run = tmp_path / "pz"
    args = ["train", "mappo", "env.name=pettingzoo/sisl/multiwalker_v9", "env.num_envs=2", "env.max_episode_steps=8",
            "total_frames=32", "n_steps=8", "epochs=1", "minibatch_size=16", "hidden_sizes=[16]", "quiet=true",
            "eval.episodes=2", "eval.interval=0", "checkpoint.interval=0", "logger=csv", "export_format=none",
            f"hydra.run.dir={run}"]
    assert main(args) == 0
    cols = read_metrics_csv(run / "metrics.csv")
    assert cols["step"][-1] == 32 and math.isfinite(cols["train/return/agents"][-1])
    assert math.isfinite(cols["eval/return"][-1])
    assert load_checkpoint(run / "checkpoints").meta["frames"] == 32
    capsys.readouterr()
    assert main(["eval", str(run), "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("mappo on pettingzoo/sisl/multiwalker_v9 (32 frames") and "over 2 episodes" in out
    assert main(["export", str(run)]) == 0
    report = capsys.readouterr().out
    assert "observation [B, 3, 31] -> action [B, 3, 4]" in report and "max abs diff 0.00e+00" in report


@pytest.mark.parametrize("share_params", [True, False])
def test_tanh_normal_rollout_equals_the_actor(share_params):
    """The recipe's collecting call computes what the ProbabilisticActor computes, bit for bit
    (action, log-prob, loc, scale; the same random stream), also where tanh saturates; other
    interaction types run the actor; the state_dict is the actor's."""
    import copy

    from steersman.recipes.mappo import MAPPOConfig, TanhNormalRollout, make_policy

    env = make_marl_env("navigation", 8, seed=0, n_agents=3)
    actor = make_policy(MAPPOConfig(share_params=share_params), env)
    steep = copy.deepcopy(actor)  # |loc| >> 9 for some agents: the float32 tanh rounds to +-1
    with torch.no_grad():
        for p in steep.parameters():
            p.mul_(40)
    td = env.reset()
    for net in (actor, steep):
        fast = TanhNormalRollout(net)
        assert fast.state_dict().keys() == net.state_dict().keys()
        for itype in (ExplorationType.RANDOM, ExplorationType.DETERMINISTIC):
            with torch.no_grad(), set_exploration_type(itype):
                torch.manual_seed(3)
                want = net(td.clone())
                torch.manual_seed(3)
                got = fast(td.clone())
                next_fast = torch.rand(3)
                torch.manual_seed(3)
                net(td.clone())
                assert torch.equal(torch.rand(3), next_fast), "the random stream moved differently"
            assert got.keys(True, True) == want.keys(True, True)
            for key in want.keys(True, True):
                assert torch.equal(got.get(key), want.get(key)), (itype, key)
    assert (got.get(("agents", "loc")).abs() > 9).any()  # the steep actor's draws were clamped
    discrete = make_policy(MAPPOConfig(categorical_actions=True), make_marl_env("navigation", 2, categorical_actions=True))
    with pytest.raises(TypeError, match="not make_policy's tanh-normal actor"):
        TanhNormalRollout(discrete)


def _loss_and_batch(algo, normalize, entropy_coef, value_norm="none", share_params=True, n=3, batch=64):
    from steersman.objectives import IPPOLoss, MAPPOLoss
    from steersman.recipes.mappo import MAPPOConfig, make_critic, make_policy, make_value_norm

    env = make_marl_env("navigation", 4, seed=0, n_agents=n)
    cfg = MAPPOConfig(share_params=share_params, centralized_critic=algo == "mappo")
    torch.manual_seed(0)
    cls = IPPOLoss if algo == "ippo" else MAPPOLoss
    loss = cls(make_policy(cfg, env), make_critic(cfg, env), entropy_coeff=entropy_coef, critic_coeff=0.5,
               loss_critic_type="l2", normalize_advantage=normalize, diagnostics=False,
               value_norm=make_value_norm(value_norm))
    loss.set_keys(action=("agents", "action"), sample_log_prob=("agents", "action_log_prob"),
                  value=("agents", "state_value"), advantage=("agents", "advantage"),
                  value_target=("agents", "value_target"))
    obs = torch.randn(batch, n, env.observation_spec["agents", "observation"].shape[-1]) * 3
    action = (torch.rand(batch, n, 2) * 2 - 1) * 1.05  # some beyond [-1, 1]: clamped as TanhNormal.log_prob does
    cols = (obs, action.clamp(-1, 1), torch.randn(batch, n), torch.randn(batch, n, 1) * 2 + 1, torch.randn(batch, n, 1))
    td = TensorDict({"agents": TensorDict(dict(zip(("observation", "action", "action_log_prob", "advantage",
                                                    "value_target"), cols)), [batch, n])}, [batch])
    return loss, td, cols


@pytest.mark.parametrize("algo", ["mappo", "ippo"])
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("entropy_coef", [0.0, 0.01])
def test_plain_ppo_terms_equal_the_loss(algo, normalize, entropy_coef):
    """The recipe's plain-tensor minibatch loss gives MAPPOLoss/IPPOLoss's total and every
    gradient bit for bit, and moves the random stream as the loss does (the entropy draw)."""
    from steersman.recipes.mappo import TanhNormalPPOTerms

    loss, td, cols = _loss_and_batch(algo, normalize, entropy_coef)
    terms = TanhNormalPPOTerms.of(loss)
    assert terms is not None
    params = [p for p in loss.parameters() if p.requires_grad]

    def run(fn):
        for p in params:
            p.grad = None
        torch.manual_seed(5)
        total = fn()
        total.backward()
        return total.detach(), [p.grad.clone() for p in params], torch.rand(4)

    def with_loss():
        out = loss(td)
        return out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]

    want, got = run(with_loss), run(lambda: terms(*cols))
    assert torch.equal(want[0], got[0]), (want[0], got[0])
    assert len(want[1]) == len(got[1]) == 12
    for a, b in zip(want[1], got[1]):
        assert torch.equal(a, b)
    assert torch.equal(want[2], got[2]), "the random stream moved differently"
    with pytest.raises(ValueError, match="value targets"):
        terms(cols[0], cols[1], cols[2], cols[3], cols[4][:, :1])


def test_plain_ppo_terms_only_where_they_equal_the_loss():
    """Losses the plain terms do not reproduce get None (the recipe then calls the loss)."""
    from steersman.recipes.mappo import TanhNormalPPOTerms

    assert TanhNormalPPOTerms.of(_loss_and_batch("mappo", False, 0.0, value_norm="popart")[0]) is None
    assert TanhNormalPPOTerms.of(_loss_and_batch("mappo", False, 0.0, share_params=False)[0]) is None
    loss = _loss_and_batch("ippo", False, 0.0)[0]
    loss.clip_value = 0.2
    assert TanhNormalPPOTerms.of(loss) is None


@pytest.mark.parametrize("scale", [0.01, 100.0], ids=["unclipped", "clipped"])
def test_clip_grads_equals_torch(scale):
    """The recipe's gradient clipping gives nn.utils.clip_grad_norm_'s gradients and norm bit
    for bit, clipped or not (parameters without a gradient are left alone)."""
    from torch import nn

    from steersman.recipes.mappo import clip_grads

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(18, 64), nn.Tanh(), nn.Linear(64, 4), nn.Linear(4, 4))
    params = list(net.parameters())
    grads = [torch.randn_like(p) * scale for p in params]
    results = []
    for clip in (nn.utils.clip_grad_norm_, clip_grads):
        for p, g in zip(params, grads):
            p.grad = g.clone()
        params[-1].grad = None
        norm = clip(params, 1.0)
        results.append((norm, [None if p.grad is None else p.grad.clone() for p in params]))
    (want_norm, want), (got_norm, got) = results
    assert torch.equal(want_norm, got_norm) and (want_norm > 1) == (scale > 1)
    assert got[-1] is None
    for a, b in zip(want[:-1], got[:-1]):
        assert torch.equal(a, b)
