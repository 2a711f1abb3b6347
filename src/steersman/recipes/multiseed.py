"""Many PPO agents in one process: N seeds (and a sweep of numeric settings), one vmapped update.

``steersman train ppo seeds=8`` trains 8 independent agents at once, and
``steersman train ppo sweep.optim.lr=[1e-3,3e-4] seeds=2`` the 4 combinations
(PureJaxRL's idea in PyTorch). Every *member* ``k`` has its own parameters, Adam state,
``num_envs`` sub-envs and random streams; what is shared is only the code path:

* parameters stacked ``[M, ...]`` (:func:`~steersman.tensordict.nn.from_modules` of the
  members' networks, each built as the single-seed recipe builds it: ``seed_everything(seed)``
  then :func:`~steersman.recipes.ppo.make_policy` / ``make_critic``);
* the optimizer state stacked (the functional Adam of :mod:`steersman.tensordict.nn.optim`,
  with the learning rate and the clipping norm tensors ``[M]``: sweeping them costs nothing);
* one native env of batch ``[M, num_envs]``; row ``k`` gets the counters that
  ``CartPoleEnv(batch_size=[num_envs], seed=seed_k)`` would have;
* actions and minibatch shuffles from counter-based streams (a hash of ``(member key,
  counter)``, as the native envs draw their resets): member ``k``'s numbers do not depend
  on how many members run beside it;
* one ``torch.vmap`` of the pure minibatch update (``torch.func`` gradients of
  :class:`~steersman.objectives.ClipPPOLoss`, global-norm clipping, Adam) over the members,
  compiled with ``compile=true``.

So member ``k`` of a population run equals the run of that member alone (``seeds=1`` with
its seed and swept values): the same data, shuffles and initial weights bit for bit, and
the same parameters, bit for bit: the test proves it for 1 to 4 members. (A lone member
runs as two identical rows: batched products with a single output column, the value
head, take another CPU kernel for one matrix than for several and would differ in the
last bits; from two rows on, a row's numbers do not depend on the count.)

The run directory::

    <run_dir>/
      config.yaml                the population's config (``steersman resume`` reads it)
      members.json               member k -> its seed and swept values
      seed_<k>/metrics.csv       member k's metrics (``steersman plot <run_dir>`` reads them)
      seed_<k>/config.yaml       member k's own config (seed and swept values filled in)
      seed_<k>/policy.pt         member k's actor state_dict (``make_policy(cfg, env)`` loads it)
      checkpoints/               the whole population (stacked), for a bit-exact resume
      export/seed_<k>/policy.pt2 member k's exported policy
      plots/learning_curve.png   the aggregate: mean, bootstrap 95% interval, IQM over seeds
      summary.json               per-member and aggregate final returns, frames/s

Limits: torch-native envs with discrete actions (``CartPole-v1``, ``Acrobot-v1``,
``MountainCar-v0``, ``GridWorld-v0``); sweepable fields :data:`SWEEPABLE`.

Example::

    from steersman.recipes.multiseed import train_ppo
    summary = train_ppo(PPOConfig(seeds=8), "runs/ppo_seeds")  # what ppo.train does for seeds > 1
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from steersman.data import Categorical
from steersman.envs.native import NativeEnv, mix32
from steersman.envs.native._base import lane_keys
from steersman.objectives import ClipPPOLoss
from steersman.tensordict import TensorDict
from steersman.tensordict.files import write_json_atomic
from steersman.tensordict.nn import from_modules, optim
from steersman.tensordict.nn.optim import clip_grad_norm, tree_from_leaves

from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint, seed_everything
from .config import ConfigError, config_to_dict, diff_configs, validate_config, with_defaults
from .envs import NATIVE_ENVS, action_spec_unbatched
from .run import (
    EVAL_SEED_OFFSET,
    RUN_FILE,
    RunDirError,
    RunFinished,
    _resumable,
    export_filename,
    read_run_config,
)

__all__ = ["SWEEPABLE", "Streams", "members_of", "train_ppo"]

#: Fields a sweep may vary per member (numbers the vmapped update reads per member).
SWEEPABLE = ("optim.lr", "optim.max_grad_norm")
_GOLDEN = 0x9E3779B9
_SALT_ACTIONS, _SALT_SHUFFLE = 1, 2


# ---------------------------------------------------------------- members and their random streams
def members_of(cfg: Any) -> list[tuple[int, dict[str, float]]]:
    """The population: ``(seed, swept values)`` per member, sweep combinations outermost
    (in the order the sweep lists them), then seeds ``cfg.seed .. cfg.seed + seeds - 1``.

    Raises a :class:`ConfigError` naming the field for ``seeds < 1``, an unknown or
    non-sweepable field, or a sweep value that is not a non-empty list of numbers.

    Example:
        >>> from steersman.recipes.ppo import PPOConfig
        >>> members_of(PPOConfig(seed=0, seeds=2, sweep={"optim": {"lr": [1e-3, 3e-4]}}))
        [(0, {'optim.lr': 0.001}), (1, {'optim.lr': 0.001}), (0, {'optim.lr': 0.0003}), (1, {'optim.lr': 0.0003})]
    """
    seeds = cfg.seeds
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise ConfigError(f"seeds must be an integer >= 1, got {seeds!r}")
    sweep = _flatten(cfg.sweep or {})
    for key, values in sweep.items():
        if not _has_field(cfg, key):
            raise ConfigError(f"sweep.{key}: the config has no field {key!r}")
        if key not in SWEEPABLE:
            raise ConfigError(f"sweep.{key} cannot vary per member: every member of one process shares it "
                              f"(network shapes, env batch, schedule); sweepable fields: {', '.join(SWEEPABLE)} "
                              f"(run other values as separate runs: steersman train -m ppo {key}=a,b)")
        if not isinstance(values, list) or not values or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise ConfigError(f"sweep.{key} must be a non-empty list of numbers, got {values!r}")
    combos = [dict(zip(sweep, vals)) for vals in itertools.product(*sweep.values())]
    return [(cfg.seed + s, {k: float(v) for k, v in combo.items()}) for combo in combos for s in range(seeds)]


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _has_field(cfg: Any, dotted: str) -> bool:
    obj = cfg
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(obj) or part not in {f.name for f in dataclasses.fields(obj)}:
            return False
        obj = getattr(obj, part)
    return True


def member_config(cfg: Any, seed: int, values: dict[str, float]) -> Any:
    """``cfg`` for one member: its ``seed`` and swept ``values``, ``seeds=1``, no sweep."""
    out = copy.deepcopy(cfg)
    out.seed, out.seeds, out.sweep = seed, 1, {}
    for key, value in values.items():
        *path, last = key.split(".")
        obj = out
        for part in path:
            obj = getattr(obj, part)
        setattr(obj, last, value)
    return out


def _i32(values: Tensor) -> Tensor:
    """int64 values wrapped to int32 (two's complement)."""
    return ((values + 2**31) % 2**32 - 2**31).to(torch.int32)


class Streams:
    """Counter-based random numbers, one stream per member: draw ``j`` of member ``k`` is
    ``lowbias32(key_k + j * golden)`` (the native envs' generator), so a member's numbers
    depend only on its seed and on how many it drew, never on the other members.

    Args:
        seeds: one seed per member.
        salt: tells apart the streams of one seed (actions, shuffles).

    Example:
        >>> a, b = Streams([3, 4], salt=1), Streams([4], salt=1)
        >>> torch.equal(a.uniform(5)[1], b.uniform(5)[0])
        True
    """

    def __init__(self, seeds: list[int], salt: int) -> None:
        self.keys = torch.stack([lane_keys(s + (salt << 40), torch.Size([1]))[0] for s in seeds])
        self.counter = 0

    def bits(self, n: int) -> Tensor:
        """``[M, n]`` random int32."""
        ctr = _i32(torch.arange(self.counter, self.counter + n, dtype=torch.int64) * _GOLDEN)
        self.counter += n
        return mix32(self.keys[:, None] + ctr[None, :])

    def uniform(self, n: int) -> Tensor:
        """``[M, n]`` uniform draws in ``[0, 1)`` (24 random bits each)."""
        return ((self.bits(n) >> 8) & 0xFFFFFF).to(torch.float32) * (1.0 / 16777216.0)

    def permutation(self, n: int) -> Tensor:
        """``[M, n]``: a random permutation of ``range(n)`` per member."""
        return torch.argsort(self.bits(n), dim=-1, stable=True)


def _seed_rows(env: NativeEnv, seeds: list[int]) -> None:
    """Gives row ``k`` of a ``[M, E]`` native env the counters of a ``[E]`` env seeded ``seeds[k]``."""
    row = torch.Size(env.batch_size[1:])
    env._rng = torch.stack([lane_keys(s, row) for s in seeds])


# ---------------------------------------------------------------- the members' functions (vmapped)
def _categorical_draw(logits: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
    """An action per row by inverting the CDF at ``u`` and its log-probability."""
    logp_all = torch.log_softmax(logits, -1)
    cdf = torch.cumsum(logp_all.exp(), -1)[..., :-1]
    action = (u.unsqueeze(-1) >= cdf).sum(-1)
    return action, logp_all.gather(-1, action.unsqueeze(-1)).squeeze(-1)


def _gae(value: Tensor, next_value: Tensor, reward: Tensor, terminated: Tensor, done: Tensor,
         gamma: float, lmbda: float) -> tuple[Tensor, Tensor]:
    """GAE over the last dim (time): ``(advantage, value_target)``; bootstraps through
    truncations, cuts the trace at every episode end."""
    not_term, not_done = (~terminated).to(value.dtype), (~done).to(value.dtype)
    delta = reward + gamma * next_value * not_term - value
    adv = torch.zeros_like(value)
    last = torch.zeros_like(value[..., 0])
    for t in range(value.shape[-1] - 1, -1, -1):
        last = delta[..., t] + gamma * lmbda * not_done[..., t] * last
        adv[..., t] = last
    return adv, adv + value


# ---------------------------------------------------------------- training
def train_ppo(cfg: Any, run_dir: str | Path | None = None, *, resume: bool = False) -> dict[str, Any]:
    """Trains the population of ``cfg`` (a PPOConfig with ``seeds`` and ``sweep``) into
    ``run_dir``; returns the summary (per-member and aggregate returns, frames/s)."""
    from . import ppo

    members = members_of(cfg)
    validate_config(cfg)
    member_cfgs = [member_config(cfg, s, v) for s, v in members]
    for mc in member_cfgs:
        validate_config(mc)
    if cfg.env.name not in NATIVE_ENVS:
        raise ConfigError(f"seeds/sweep need a torch-native env ({', '.join(sorted(NATIVE_ENVS))}), "
                          f"got env.name={cfg.env.name!r}")
    if cfg.num_threads > 0:
        torch.set_num_threads(cfg.num_threads)
    # P >= 2 rows: a lone member runs with a copy of itself, because batched matmuls with one
    # output column (the value head) take another kernel for one matrix than for several
    # (CPU bmm/gemv), which would change the last bits; from 2 rows on, every row's numbers
    # are the same whatever the count (tests/recipes/test_multiseed.py proves it).
    M, E, T = len(members), cfg.env.num_envs, cfg.n_steps
    P = max(M, 2)
    row_cfgs = member_cfgs + member_cfgs[:1] * (P - M)
    seeds = [mc.seed for mc in row_cfgs]
    B = E * T  # frames per member per batch
    total_frames = -(-cfg.total_frames // B) * B
    kwargs = {} if cfg.env.max_episode_steps is None else {"max_episode_steps": cfg.env.max_episode_steps}
    env_cls = NATIVE_ENVS[cfg.env.name]
    env = env_cls(batch_size=[P, E], seed=0, **kwargs)
    if not isinstance(action_spec_unbatched(env), Categorical):
        raise ConfigError(f"seeds/sweep support discrete-action envs for now; {cfg.env.name} has continuous actions")
    eval_env = env_cls(batch_size=[P, cfg.eval.episodes], seed=0, **kwargs)

    # each member's networks, built as the single-seed recipe builds them, then stacked [M, ...]
    nets = []
    for mc in row_cfgs:
        seed_everything(mc.seed)
        shape_env = env_cls(batch_size=[E], seed=mc.seed, **kwargs)
        nets.append(nn.ModuleDict({"actor_network": ppo.make_policy(mc, shape_env),
                                   "critic_network": ppo.make_critic(mc, shape_env)}))
    actor, critic = nets[0]["actor_network"], nets[0]["critic_network"]
    loss_fn = ClipPPOLoss(actor, critic, clip_epsilon=cfg.loss.clip_epsilon, entropy_coeff=cfg.loss.entropy_coef,
                          critic_coeff=cfg.loss.critic_coef, loss_critic_type="l2",
                          normalize_advantage=cfg.loss.normalize_advantage, diagnostics=False)
    logits_net, value_net = actor.module[0].module, critic.module  # obs -> logits, obs -> value
    stacked = from_modules(*nets)
    keys = list(stacked.keys(include_nested=True, leaves_only=True))
    names = [".".join(k) for k in keys]
    params = tuple(stacked.get(k).detach().clone() for k in keys)
    adam = optim.Adam(eps=cfg.optim.eps)
    state0 = torch.vmap(lambda *p: _leaves_of(adam.init(tree_from_leaves(keys, list(p), []))))(*params)
    state_keys = list(adam.init(tree_from_leaves(keys, [p[0] for p in params], [])).keys(True, True))
    opt_state = tuple(state0)
    base = {name: torch.tensor([getattr(mc.optim, name) for mc in row_cfgs], dtype=torch.float32)
            for name in ("lr", "max_grad_norm")}

    def swapped(p: tuple):
        return tree_from_leaves(keys, list(p), []).to_module(loss_fn)

    def act(p: tuple, obs: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:  # one member: obs [E, D], u [E]
        with swapped(p):
            return _categorical_draw(logits_net(obs), u)

    def greedy(p: tuple, obs: Tensor) -> Tensor:
        with swapped(p):
            return logits_net(obs).argmax(-1)

    def values(p: tuple, obs: Tensor) -> Tensor:
        with swapped(p):
            return value_net(obs).squeeze(-1)

    loss_keys = loss_fn.tensor_keys
    td_keys = ["observation", loss_keys.action, loss_keys.sample_log_prob, loss_keys.advantage,
               loss_keys.value_target]

    def update(p: tuple, s: tuple, data: tuple, idx: Tensor, lr: Tensor, max_norm: Tensor):
        """One member's minibatch step: pure, ``(params, state, data[idx]) -> (params, state, metrics)``."""
        mb = tree_from_leaves(td_keys, [v[idx] for v in data], [idx.shape[0]])

        def loss_of(q: tuple):
            with swapped(q):
                out = loss_fn(mb)
            total = out["loss_objective"] + out["loss_critic"] + out.get("loss_entropy", torch.zeros(()))
            return total, (out["loss_objective"].detach(), out["loss_critic"].detach())

        grads, (_, (l_obj, l_crit)) = torch.func.grad_and_value(loss_of, has_aux=True)(p)
        grads_td, grad_norm = clip_grad_norm(tree_from_leaves(keys, list(grads), []), max_norm)
        new_p, new_s = optim.Adam(lr=lr, eps=cfg.optim.eps).step(tree_from_leaves(keys, list(p), []), grads_td,
                                                       tree_from_leaves(state_keys, list(s), []))
        return _leaves_of(new_p, keys), _leaves_of(new_s, state_keys), torch.stack([l_obj, l_crit, grad_norm])

    v_update = eager_update = torch.vmap(update)
    if cfg.compile:  # one graph for every member's step; eager (one warning) if dynamo cannot trace it
        from steersman.objectives.functional_update import use_compile_cache

        use_compile_cache()
        compiled = torch.compile(eager_update, fullgraph=True, dynamic=False, backend=cfg.compile_backend)

        def v_update(*args: Any) -> Any:
            nonlocal compiled
            if compiled is not None:
                try:
                    return compiled(*args)
                except torch._dynamo.exc.TorchDynamoException as err:
                    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                    warnings.warn(f"compile=true: the vmapped PPO update cannot be compiled ({reason}); "
                                  "running it eagerly", stacklevel=2)
                    compiled = None
            return eager_update(*args)
    v_act, v_greedy, v_values = torch.vmap(act), torch.vmap(greedy), torch.vmap(values)

    # ---- the run directory, and the state a checkpoint holds
    run_dir = Path(run_dir) if run_dir is not None else Path("runs") / f"ppo_seeds_{time.strftime('%Y-%m-%d_%H-%M-%S')}"
    config = config_to_dict(cfg)
    act_stream, shuffle_stream = Streams(seeds, _SALT_ACTIONS), Streams(seeds, _SALT_SHUFFLE)
    _seed_rows(env, seeds)
    obs = env.reset()["observation"]
    ep_return = torch.zeros(P, E)
    last_return = torch.full((P,), math.nan)
    frames, iteration, evals = 0, 0, []
    ckpt_root = run_dir / "checkpoints"
    if resume:
        algo, old = read_run_config(run_dir)
        changed = [(k, a, b) for k, a, b in diff_configs(with_defaults(old, type(cfg)), config) if not _resumable(k)]
        if algo != "ppo" or changed:
            raise RunDirError(f"cannot resume {run_dir} as this population: "
                              + (f"it is a {algo} run" if algo != "ppo" else
                                 ", ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in changed)))
        if latest_checkpoint(ckpt_root) is not None:
            st = load_checkpoint(ckpt_root).state
            params = tuple(st["params"][n] for n in names)
            opt_state = tuple(st["opt_state"][".".join(k) if isinstance(k, tuple) else k]
                              for k in state_keys)
            env.set_state(st["env_state"])
            env._rng = st["env_rng"]
            obs, ep_return, last_return = st["obs"], st["ep_return"], st["last_return"]
            act_stream.counter, shuffle_stream.counter = int(st["act_counter"]), int(st["shuffle_counter"])
            frames, iteration = int(st["frames"]), int(st["iteration"])
            evals = [(int(f), r.tolist()) for f, r in zip(st["eval_frames"].tolist(), st["eval_returns"])]
            if frames >= total_frames:
                raise RunFinished(f"{run_dir} already finished at {frames} frames; pass "
                                  f"total_frames={2 * cfg.total_frames} (or any value above {frames}) to extend")
    elif (run_dir / RUN_FILE).exists():
        raise RunDirError(f"{run_dir} already holds a run; continue it with `steersman resume {run_dir}` "
                          "or choose another directory")
    run_dir.mkdir(parents=True, exist_ok=True)
    _write_yaml(run_dir / RUN_FILE, {"algo": "ppo", **config})
    member_dirs = [run_dir / f"seed_{k}" for k in range(M)]
    for d, mc in zip(member_dirs, member_cfgs):
        d.mkdir(exist_ok=True)
        _write_yaml(d / RUN_FILE, {"algo": "ppo", **config_to_dict(mc)})
    write_json_atomic(run_dir / "members.json", [{"member": k, "dir": f"seed_{k}", "seed": s, **v}
                                                  for k, (s, v) in enumerate(members)], indent=1)
    from steersman.record import CSVLogger

    loggers = [CSVLogger(d.name, run_dir, start_step=frames if resume else None) for d in member_dirs]

    def save() -> None:
        state = {"params": dict(zip(names, params)),
                 "opt_state": {".".join(k) if isinstance(k, tuple) else k: v for k, v in zip(state_keys, opt_state)},
                 "env_state": env.get_state().to_dict(), "env_rng": env._rng.clone(), "obs": obs.clone(),
                 "ep_return": ep_return, "last_return": last_return,
                 "act_counter": act_stream.counter, "shuffle_counter": shuffle_stream.counter,
                 "frames": frames, "iteration": iteration,
                 "eval_frames": torch.tensor([f for f, _ in evals], dtype=torch.int64),
                 "eval_returns": [torch.tensor(r) for _, r in evals]}
        save_checkpoint(ckpt_root, state, meta={"algo": "ppo", "frames": frames, "iteration": iteration,
                                                "members": M, "config": config}, keep=cfg.checkpoint.keep)

    def evaluate() -> Tensor:
        """Each member's greedy policy, ``eval.episodes`` episodes on its own seeds: mean return [M]."""
        _seed_rows(eval_env, [s + EVAL_SEED_OFFSET for s in seeds])
        o = eval_env.reset()["observation"]
        ret, alive = torch.zeros(P, cfg.eval.episodes), torch.ones(P, cfg.eval.episodes, dtype=torch.bool)
        while bool(alive.any()):
            td = TensorDict({"observation": o, "action": v_greedy(params, o)}, batch_size=[P, cfg.eval.episodes])
            td, nxt = eval_env.step_and_maybe_reset(td)
            ret += td["next", "reward"].squeeze(-1) * alive
            alive &= ~td["next", "done"].squeeze(-1)
            o = nxt["observation"]
        return ret.mean(-1)[:M]

    next_eval = (frames // cfg.eval.interval + 1) * cfg.eval.interval if cfg.eval.interval > 0 else math.inf
    next_ckpt = (frames // cfg.checkpoint.interval + 1) * cfg.checkpoint.interval \
        if cfg.checkpoint.interval > 0 else math.inf
    t_start, frames0, saved = time.perf_counter(), frames, -1
    while frames < total_frames:
        # ---- collect T steps of every member's E sub-envs
        rollout: dict[str, list[Tensor]] = {k: [] for k in ("obs", "action", "logp", "next_obs", "reward",
                                                            "terminated", "done")}
        finished_sum, finished_n = torch.zeros(P), torch.zeros(P)
        with torch.no_grad():
            for _ in range(T):
                action, logp = v_act(params, obs, act_stream.uniform(E))
                td, nxt = env.step_and_maybe_reset(TensorDict({"observation": obs, "action": action}, [P, E]))
                reward, done = td["next", "reward"].squeeze(-1), td["next", "done"].squeeze(-1)
                ep_return += reward
                finished_sum += (ep_return * done).sum(-1)
                finished_n += done.sum(-1)
                ep_return = ep_return * ~done
                for key, v in (("obs", obs), ("action", action), ("logp", logp),
                               ("next_obs", td["next", "observation"]), ("reward", reward),
                               ("terminated", td["next", "terminated"].squeeze(-1)), ("done", done)):
                    rollout[key].append(v)
                obs = nxt["observation"]
            r = {k: torch.stack(v, -1) for k, v in rollout.items()}  # [M, E, T(, D)]
            r["obs"], r["next_obs"] = r["obs"].movedim(-1, -2), r["next_obs"].movedim(-1, -2)
            value, next_value = v_values(params, r["obs"]), v_values(params, r["next_obs"])
            adv, target = _gae(value, next_value, r["reward"], r["terminated"], r["done"],
                               cfg.loss.gamma, cfg.loss.gae_lambda)
        frames += B
        last_return = torch.where(finished_n > 0, finished_sum / finished_n.clamp(min=1), last_return)

        # ---- anneal, then epochs x minibatches of one vmapped update for every member
        progress_left = max(1.0 - frames / total_frames, 0.0)
        lr = base["lr"] * progress_left if cfg.optim.anneal_lr else base["lr"]
        if cfg.loss.anneal_clip:
            loss_fn.clip_epsilon.fill_(max(cfg.loss.clip_epsilon * progress_left, 1e-8))
        data = tuple(v.reshape(P, B, *v.shape[3:]) for v in (r["obs"], r["action"], r["logp"], adv[..., None],
                                                                  target[..., None]))
        for _ in range(cfg.epochs):
            for idx in shuffle_stream.permutation(B).split(cfg.minibatch_size, dim=1):
                params, opt_state, metrics = v_update(params, opt_state, data, idx, lr, base["max_grad_norm"])
        iteration += 1

        # ---- log, evaluate, checkpoint
        if iteration % cfg.logger.log_interval == 0:
            fps = (frames - frames0) * M / max(time.perf_counter() - t_start, 1e-9)
            for k, log in enumerate(loggers):
                row = {"train/loss_objective": float(metrics[k, 0]), "train/loss_critic": float(metrics[k, 1]),
                       "train/grad_norm": float(metrics[k, 2]), "train/lr": float(lr[k]), "time/fps": fps}
                if not math.isnan(float(last_return[k])):
                    row["train/return"] = float(last_return[k])
                log.log_metrics(row, step=frames)
        if frames >= next_eval or frames >= total_frames:
            returns = evaluate()
            evals.append((frames, returns.tolist()))
            for k, log in enumerate(loggers):
                log.log_metrics({"eval/return": float(returns[k])}, step=frames)
            next_eval = (frames // cfg.eval.interval + 1) * cfg.eval.interval if cfg.eval.interval > 0 else math.inf
            if not cfg.quiet:
                print(f"{frames} frames x {M} members: eval return mean {float(returns.mean()):.1f} "
                      f"(min {float(returns.min()):.1f}, max {float(returns.max()):.1f})", file=sys.stderr)
        if frames >= next_ckpt or frames >= total_frames:
            save()
            saved = frames
            next_ckpt = (frames // cfg.checkpoint.interval + 1) * cfg.checkpoint.interval \
                if cfg.checkpoint.interval > 0 else math.inf
    if saved != frames and frames > frames0:
        save()
    wall = time.perf_counter() - t_start
    for log in loggers:
        log.close()
    return _finish(cfg, run_dir, member_dirs, members, names, params, loss_fn, actor, eval_env, evals,
                   frames, (frames - frames0) * M / max(wall, 1e-9), wall)


def _leaves_of(td: Any, keys: list | None = None) -> tuple[Tensor, ...]:
    keys = keys if keys is not None else list(td.keys(include_nested=True, leaves_only=True))
    return tuple(td.get(k) for k in keys)


def _write_yaml(path: Path, data: dict[str, Any]) -> None:
    import yaml

    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    tmp.replace(path)


def _finish(cfg: Any, run_dir: Path, member_dirs: list[Path], members: list, names: list[str],
            params: tuple, loss_fn: nn.Module, actor: nn.Module, eval_env: NativeEnv, evals: list,
            frames: int, fps: float, wall: float) -> dict[str, Any]:
    """Per-member policies (state_dict and export), the aggregate plot and the summary."""
    from steersman import record
    from steersman.record.plot import aggregate_returns, plot_aggregate_curve

    module_params = dict(loss_fn.named_parameters())
    example_obs = eval_env.reset()["observation"][0]
    fmt = cfg.export_format
    for k, d in enumerate(member_dirs):
        with torch.no_grad():
            for name, p in zip(names, params):
                module_params[name].copy_(p[k])
        torch.save(actor.state_dict(), d / "policy.pt")
        if fmt != "none":
            path = run_dir / "export" / d.name / export_filename(fmt)
            path.parent.mkdir(parents=True, exist_ok=True)
            record.export_policy(actor, example_obs, path, format=fmt, verify=False)
    written = {"run_dir": str(run_dir), "members": [str(d) for d in member_dirs]}
    try:
        curve = run_dir / "plots" / "learning_curve.png"
        plot_aggregate_curve([run_dir], curve)
        written["plot"] = str(curve)
    except Exception as err:  # a missing plot must not lose the run
        warnings.warn(f"could not plot the aggregate learning curve: {err}", stacklevel=2)
    final = evals[-1][1] if evals else [math.nan] * len(members)
    stats = aggregate_returns(torch.tensor(final, dtype=torch.float64).numpy())
    summary = {"algo": "ppo", "env": cfg.env.name, "members": len(members), "frames_per_member": frames,
               "final_eval_return": dict(zip((d.name for d in member_dirs), final)),
               "aggregate": stats, "wall_time_s": round(wall, 2), "frames_per_s": round(fps, 1),
               "written": written}
    write_json_atomic(run_dir / "summary.json", summary, indent=1)
    print(f"done: ppo on {cfg.env.name}: {len(members)} members x {frames} frames in {wall:.1f} s "
          f"({fps:.0f} frames/s in all); final eval return mean {stats['mean']:.1f} "
          f"[{stats['ci_low']:.1f}, {stats['ci_high']:.1f}], IQM {stats['iqm']:.1f}\n  run_dir     {run_dir}",
          flush=True)
    return summary
