"""Many agents in one process: N seeds (and a sweep of numeric settings), one vmapped update.

``steersman train ppo seeds=8`` trains 8 independent agents at once (so do ``a2c``,
``dqn``, ``sac`` and ``td3``), and
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
  :class:`~steersman.objectives.ClipPPOLoss`, global-norm clipping, Adam) over the members.

With ``compile=true`` a PPO population runs as three ``fullgraph`` graphs, each traced
once: the vmapped update with the loss on plain tensors (:func:`_pure_ppo_loss`, the
module's terms and gradients bit for bit), the collection step (policies, draws, the
native env's step kernel) and the advantages (critics, GAE). With dynamo's ``eager``
backend a compiled run equals the eager one bit for bit; with inductor within float
rounding (fused kernels, ``tanh`` decomposed: :data:`ON_POLICY_OPTIONS`; the policy head as
a product and a sum: :func:`_run_layers`), so long runs drift apart like runs on two CPUs.

So member ``k`` of a population run equals the run of that member alone (``seeds=1`` with
its seed and swept values): the same data, shuffles and initial weights bit for bit, and
the same parameters, bit for bit: the test proves it for 1 to 4 members. (The members
run as an even number of rows, the first one twice when their count is odd: CPU kernels
take other paths for a lone matrix and for the last row of an odd count, which would
change the last bits; see :class:`Population`.)

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

The algorithms: :func:`train_ppo` and :func:`train_a2c` (on-policy: GAE on each batch,
then PPO's epochs x minibatches or A2C's one RMSprop step), :func:`train_dqn`,
:func:`train_sac` and :func:`train_td3` (off-policy: a replay buffer per member,
:class:`MemberReplay`, sampled from each member's own stream; the policies' and the
losses' noise drawn from the member's streams too, given to the losses through their
``given_noise_key``). :class:`Population` holds what they share.

Limits: torch-native envs (``CartPole-v1``, ``Acrobot-v1``, ``MountainCar-v0``,
``GridWorld-v0`` for PPO/A2C/DQN; ``Pendulum-v1``, ``MountainCarContinuous-v0`` for
SAC/TD3); sweepable fields :data:`SWEEPABLE` (those the config has).

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from steersman.data import Categorical
from steersman.envs.native import NativeEnv, mix32
from steersman.envs.native._base import lane_keys
from steersman.objectives import ClipPPOLoss, TD3Loss
from steersman.tensordict import TensorDict
from steersman.tensordict.files import write_json_atomic
from steersman.tensordict.nn import from_modules, optim
from steersman.tensordict.nn.optim import clip_grad_norm, tree_from_leaves

from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint, seed_everything
from .config import ConfigError, config_to_dict, diff_configs, validate_config, with_defaults
from .envs import NATIVE_ENVS, action_spec_unbatched
from .fused import _program, _run_program
from .fused_ppo import clip_ppo_terms
from .precompiled import INDUCTOR_OPTIONS, TRAIN_OPTIONS, _compile
from .run import (
    EVAL_SEED_OFFSET,
    RUN_FILE,
    RunDirError,
    RunFinished,
    _resumable,
    export_filename,
    read_run_config,
)

__all__ = ["SWEEPABLE", "EpisodeStats", "MemberReplay", "OffPolicy", "Population", "Stacked",
           "Streams", "members_of", "train_a2c", "train_dqn", "train_ppo", "train_sac", "train_td3"]

#: Fields a sweep may vary per member (numbers the vmapped update reads per member).
SWEEPABLE = ("optim.lr", "optim.max_grad_norm")
_GOLDEN = 0x9E3779B9
_SALT_ACTIONS, _SALT_SHUFFLE, _SALT_NOISE = 1, 2, 3

#: Inductor options of the on-policy (PPO, A2C) population's graphs: the fused update's
#: :data:`~steersman.recipes.precompiled.TRAIN_OPTIONS` (``tanh`` decomposed). Inductor's
#: vectorized ``tanh`` (Sleef's, ~1 ms for a [32, 256, 64] activation here) is 3-4x slower
#: than the decomposition and than ATen's; the decomposition is within ~1.5e-7 of ``tanh``
#: (absolute), and tanh's gradient still comes from its output. A 32-member PPO update:
#: ~13 -> ~9.5 ms (benchmarks/README.md, session 13).
ON_POLICY_OPTIONS: dict[str, Any] = TRAIN_OPTIONS
#: Under inductor the compiled PPO update runs its networks' narrow heads as products and sums
#: (see :func:`_run_layers`): a 32-member update ~0.4 ms (~4%) shorter here.
NARROW_HEADS = True


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

    def randint(self, n: int, high: int) -> Tensor:
        """``[M, n]`` int64 draws in ``[0, high)`` (31 random bits modulo ``high``)."""
        return (self.bits(n).to(torch.int64) & 0x7FFFFFFF) % high

    def permutation(self, n: int) -> Tensor:
        """``[M, n]``: a random permutation of ``range(n)`` per member."""
        return torch.argsort(self.bits(n), dim=-1, stable=True)

    def permutations(self, n: int, k: int) -> Tensor:
        """``[M, k, n]``: the ``k`` permutations that ``k`` calls of :meth:`permutation` draw
        (the same numbers; one hash and one sort instead of ``k``)."""
        return torch.argsort(self.bits(k * n).view(-1, k, n), dim=-1, stable=True)


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


# ---------------------------------------------------------------- the machinery every algorithm shares
class Population:
    """A population run's shared part: the members and their configs, the native env
    ``[P, E]`` seeded per row, the stacked parameters, the vmapped (compiled) update, the
    run directory (per-member configs and metrics, ``members.json``, checkpoints, resume)
    and the greedy evaluation. An algorithm's trainer (:func:`train_ppo`,
    :func:`train_a2c`, :func:`train_dqn`) holds only its own collection and update.

    ``P`` rows run for ``M`` members, ``P`` the even number ``M`` or ``M + 1`` (the first
    member runs twice when ``M`` is odd): CPU kernels take another path for a lone matrix
    (batched matmuls with one output column, a value head) and for the last row of an odd
    count (seen on SAC's update with 3 rows), which would change the last bits; with an
    even row count every row's numbers are those of the member alone (tested for 1 to 4
    members; checked by hand for 5 and 6 with SAC). The same holds only where elementwise
    kernels take one path for every row count: some run a vector body and a scalar tail
    (``softplus`` on ``[rows, 8, 1]``: 2 rows all tail, 4 rows all body, last bits
    differ), and ``log1p`` differs between 256 and 4,096 elements; so at other sizes than
    the tests' a member can drift from its run alone in the last bits.
    """

    def __init__(self, algo: str, cfg: Any, run_dir: str | Path | None, *, resume: bool, batch_frames: int,
                 discrete: bool = True) -> None:
        self.algo, self.cfg = algo, cfg
        self.members = members_of(cfg)
        validate_config(cfg)
        self.member_cfgs = [member_config(cfg, s, v) for s, v in self.members]
        for mc in self.member_cfgs:
            validate_config(mc)
        if cfg.env.name not in NATIVE_ENVS:
            raise ConfigError(f"seeds/sweep need a torch-native env ({', '.join(sorted(NATIVE_ENVS))}), "
                              f"got env.name={cfg.env.name!r}")
        if cfg.num_threads > 0:
            torch.set_num_threads(cfg.num_threads)
        self.M = len(self.members)
        self.P = self.M + self.M % 2  # an even row count (see above)
        self.row_cfgs = self.member_cfgs + self.member_cfgs[:1] * (self.P - self.M)
        self.seeds = [mc.seed for mc in self.row_cfgs]
        self.env_cls = NATIVE_ENVS[cfg.env.name]
        self.env_kwargs = ({} if cfg.env.max_episode_steps is None
                           else {"max_episode_steps": cfg.env.max_episode_steps})
        self.env = self.make_env(cfg.env.num_envs)
        if discrete and not isinstance(action_spec_unbatched(self.env), Categorical):
            raise ConfigError(f"seeds/sweep support discrete-action envs for now; {cfg.env.name} has continuous actions")
        self.eval_env = self.make_env(cfg.eval.episodes)
        self.total_frames = -(-cfg.total_frames // batch_frames) * batch_frames
        self.run_dir = (Path(run_dir) if run_dir is not None
                        else Path("runs") / f"{algo}_seeds_{time.strftime('%Y-%m-%d_%H-%M-%S')}")
        self.config = config_to_dict(cfg)
        self.ckpt_root = self.run_dir / "checkpoints"
        self.resume, self.loggers = resume, []

    def make_env(self, per_member: int, seeds: list[int] | None = None) -> NativeEnv:
        """The native env ``[P, per_member]``, row ``k`` seeded as a ``[per_member]`` env of ``seeds[k]``."""
        env = self.env_cls(batch_size=[self.P, per_member], seed=0, **self.env_kwargs)
        env.set_seed_per_row(self.seeds if seeds is None else seeds)
        return env

    def shape_env(self, mc: Any) -> NativeEnv:
        """A member's single-seed env (what its networks are built from)."""
        return self.env_cls(batch_size=[self.cfg.env.num_envs], seed=mc.seed, **self.env_kwargs)

    # ---- the run directory
    def open(self) -> dict[str, Any] | None:
        """Refuses a run directory that holds another run; writes the configs; returns the
        saved state to resume from (None: a fresh start)."""
        state = None
        if self.resume:
            algo, old = read_run_config(self.run_dir)
            changed = [(k, a, b) for k, a, b in diff_configs(with_defaults(old, type(self.cfg)), self.config)
                       if not _resumable(k)]
            if algo != self.algo or changed:
                raise RunDirError(f"cannot resume {self.run_dir} as this population: "
                                  + (f"it is a {algo} run" if algo != self.algo else
                                     ", ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in changed)))
            if latest_checkpoint(self.ckpt_root) is not None:
                state = load_checkpoint(self.ckpt_root).state
                if int(state["frames"]) >= self.total_frames:
                    raise RunFinished(f"{self.run_dir} already finished at {int(state['frames'])} frames; pass "
                                      f"total_frames={2 * self.cfg.total_frames} (or any value above "
                                      f"{int(state['frames'])}) to extend")
        elif (self.run_dir / RUN_FILE).exists():
            raise RunDirError(f"{self.run_dir} already holds a run; continue it with `steersman resume "
                              f"{self.run_dir}` or choose another directory")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        _write_yaml(self.run_dir / RUN_FILE, {"algo": self.algo, **self.config})
        self.member_dirs = [self.run_dir / f"seed_{k}" for k in range(self.M)]
        for d, mc in zip(self.member_dirs, self.member_cfgs):
            d.mkdir(exist_ok=True)
            _write_yaml(d / RUN_FILE, {"algo": self.algo, **config_to_dict(mc)})
        write_json_atomic(self.run_dir / "members.json", [{"member": k, "dir": f"seed_{k}", "seed": s, **v}
                                                          for k, (s, v) in enumerate(self.members)], indent=1)
        from steersman.record import CSVLogger

        start = int(state["frames"]) if state is not None else None
        self.loggers = [CSVLogger(d.name, self.run_dir, start_step=start) for d in self.member_dirs]
        return state

    def log(self, frames: int, rows: list[dict[str, float]]) -> None:
        """One metrics row per member (NaN values left out)."""
        for log, row in zip(self.loggers, rows):
            log.log_metrics({k: v for k, v in row.items() if not math.isnan(v)}, step=frames)

    def save(self, state: dict[str, Any], frames: int, iteration: int) -> None:
        save_checkpoint(self.ckpt_root, {**state, "frames": frames, "iteration": iteration},
                        meta={"algo": self.algo, "frames": frames, "iteration": iteration, "members": self.M,
                              "config": self.config}, keep=self.cfg.checkpoint.keep)

    def evaluate(self, greedy: Callable[[Tensor], Tensor]) -> Tensor:
        """Each member's greedy policy (``greedy(obs [P, n, D]) -> action [P, n]``),
        ``eval.episodes`` episodes on its own seeds: mean return ``[M]``."""
        env, n = self.eval_env, self.cfg.eval.episodes
        env.set_seed_per_row([s + EVAL_SEED_OFFSET for s in self.seeds])
        o = env.reset()["observation"]
        ret, alive = torch.zeros(self.P, n), torch.ones(self.P, n, dtype=torch.bool)
        while bool(alive.any()):
            td, nxt = env.step_and_maybe_reset(TensorDict({"observation": o, "action": greedy(o)}, [self.P, n]))
            ret += td["next", "reward"].squeeze(-1) * alive
            alive &= ~td["next", "done"].squeeze(-1)
            o = nxt["observation"]
        return ret.mean(-1)[:self.M]

    def vmapped(self, update: Callable, what: str, vmap: bool = True, options: dict[str, Any] | None = None
                ) -> Callable:
        """``torch.vmap(update)`` over the rows (``vmap=False``: ``update`` as it is); with
        ``compile=true`` one compiled graph (eager with a one-line warning saying why, if
        dynamo cannot trace it).

        Compiled calls after the first of each signature (grad mode; the inputs' shapes, strides, dtypes)
        skip dynamo's guards (``torch.compiler.set_stance(skip_guard_eval_unsafe=True)``,
        as :class:`~steersman.objectives.functional_update.CompiledUpdate` does): with the
        update's ~40 inputs they cost ~0.3 ms a call. So the functions' Python-level
        settings (floats in closures) are read at the first call; what changes between
        calls is a tensor input or a tensor changed in place (``lr``, the clip buffer).

        With inductor the graphs get the fused PPO graphs' options
        (:data:`~steersman.recipes.fused.INDUCTOR_OPTIONS`: a C++ wrapper, the same kernels
        and bits) and the remembered CPU ISA probe (:func:`~steersman.recipes.precompiled.remember_vec_isa`)."""
        eager = torch.vmap(update) if vmap else update
        if not self.cfg.compile:
            return eager
        from steersman.objectives.functional_update import call_skipping_guards

        backend = self.cfg.compile_backend
        extra = {**INDUCTOR_OPTIONS, **options} if options and backend == "inductor" else None
        compiled: Any = _compile(eager, backend, extra)  # (a closure: never precompiled)
        seen: set[tuple] = set()

        def run(*args: Any) -> Any:
            nonlocal compiled
            if compiled is not None:
                signature = (torch.is_grad_enabled(), _signature(args))  # (dynamo guards the grad mode too)
                try:
                    return call_skipping_guards(lambda: compiled(*args), signature, seen)
                except torch._dynamo.exc.TorchDynamoException as err:
                    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                    warnings.warn(f"compile=true: the {what} cannot be compiled ({reason}); "
                                  "running it eagerly", stacklevel=2)
                    compiled = None
            return eager(*args)
        return run

    def close(self) -> None:
        for log in self.loggers:
            log.close()


def _signature(args: Any) -> tuple:
    """The shapes, strides and dtypes of the tensors in ``args`` (nested tuples and lists), in
    order; numbers, strings and None by value (dynamo bakes them in), other objects by type."""
    out: list = []
    stack = [args]
    while stack:
        a = stack.pop()
        if isinstance(a, Tensor):
            out.append((a.shape, a.stride(), a.dtype))
        elif isinstance(a, (tuple, list)):
            stack.extend(reversed(a))
        elif a is None or isinstance(a, (bool, int, float, str)):
            out.append((type(a), a))
        else:
            out.append(type(a))
    return tuple(out)


class Stacked:
    """The rows' parameters stacked ``[P, ...]`` as a flat tuple (the vmapped update's
    input), with their keys, and a context that swaps one row's leaves into ``module``.

    Args:
        modules: one module per row, built as the single-seed recipe builds it.
        module: the module the leaves are swapped into (same structure as each of ``modules``).
    """

    def __init__(self, modules: list[nn.Module], module: nn.Module) -> None:
        stacked = from_modules(*modules)
        self.keys = [k if isinstance(k, tuple) else (k,) for k in stacked.keys(include_nested=True, leaves_only=True)]
        self.names = [".".join(k) for k in self.keys]
        self.params = tuple(stacked.get(k).detach().clone() for k in self.keys)
        self.module = module

    def swapped(self, leaves: tuple, keys: list | None = None) -> Any:
        return tree_from_leaves(keys if keys is not None else self.keys, list(leaves), []).to_module(self.module)

    def opt_init(self, opt: Any, keys: list | None = None, params: tuple | None = None) -> tuple[list, tuple]:
        """The stacked optimizer state of ``params`` (default: all): ``(state keys, leaves)``."""
        keys = keys if keys is not None else self.keys
        params = params if params is not None else self.params
        state = torch.vmap(lambda *p: _leaves_of(opt.init(tree_from_leaves(keys, list(p), []))))(*params)
        state_keys = list(opt.init(tree_from_leaves(keys, [p[0] for p in params], [])).keys(True, True))
        return state_keys, tuple(state)


def _dotted(k: Any) -> str:
    return ".".join(k) if isinstance(k, tuple) else k


def _opt_step(opt: Any, keys: list, state_keys: list, p: tuple, grads: tuple, s: tuple, max_norm: Tensor | None
              ) -> tuple[tuple, tuple, Tensor | None]:
    """Global-norm clipping (``max_norm`` None: none) and one functional optimizer step on flat leaves."""
    grads_td = tree_from_leaves(keys, list(grads), [])
    grad_norm = None
    if max_norm is not None:
        grads_td, grad_norm = clip_grad_norm(grads_td, max_norm)
    new_p, new_s = opt.step(tree_from_leaves(keys, list(p), []), grads_td, tree_from_leaves(state_keys, list(s), []))
    return _leaves_of(new_p, keys), _leaves_of(new_s, state_keys), grad_norm


class EpisodeStats:
    """Per-member episode returns while collecting ``[P, E]``: the mean return of the
    episodes that ended in the last batch (``last_return [P]``, kept when none ended)."""

    def __init__(self, P: int, E: int) -> None:
        self.ep_return, self.last_return = torch.zeros(P, E), torch.full((P,), math.nan)
        self._sum, self._n = torch.zeros(P), torch.zeros(P)

    def step(self, reward: Tensor, done: Tensor) -> None:
        self.ep_return += reward
        self._sum += (self.ep_return * done).sum(-1)
        self._n += done.sum(-1)
        self.ep_return = self.ep_return * ~done

    def end_batch(self) -> None:
        self.last_return = torch.where(self._n > 0, self._sum / self._n.clamp(min=1), self.last_return)
        self._sum, self._n = torch.zeros_like(self._sum), torch.zeros_like(self._n)

    def state(self) -> dict[str, Tensor]:
        return {"ep_return": self.ep_return, "last_return": self.last_return}

    def load(self, st: dict[str, Any]) -> None:
        self.ep_return, self.last_return = st["ep_return"], st["last_return"]


def _collect(env: NativeEnv, obs: Tensor, T: int, act: Callable[[Tensor], tuple[Tensor, dict]],
             episodes: EpisodeStats) -> tuple[dict[str, Tensor], Tensor]:
    """``T`` steps of every row: ``act(obs) -> (action, extras)``; returns the transitions
    stacked ``[P, E, T, ...]`` and the last observation."""
    P, E = env.batch_size
    out: dict[str, list[Tensor]] = {}
    for _ in range(T):
        action, extras = act(obs)
        td, nxt = env.step_and_maybe_reset(TensorDict({"observation": obs, "action": action}, [P, E]))
        reward, done = td["next", "reward"].squeeze(-1), td["next", "done"].squeeze(-1)
        episodes.step(reward, done)
        for key, v in (("obs", obs), ("action", action), ("next_obs", td["next", "observation"]),
                       ("reward", reward), ("terminated", td["next", "terminated"].squeeze(-1)), ("done", done),
                       *extras.items()):
            out.setdefault(key, []).append(v)
        obs = nxt["observation"]
    episodes.end_batch()
    return {k: torch.stack(v, 2) for k, v in out.items()}, obs


def _schedule(frames: int, interval: int) -> float:
    return (frames // interval + 1) * interval if interval > 0 else math.inf


# ---------------------------------------------------------------- PPO and A2C (on-policy)
def train_ppo(cfg: Any, run_dir: str | Path | None = None, *, resume: bool = False) -> dict[str, Any]:
    """Trains the population of ``cfg`` (a PPOConfig with ``seeds`` and ``sweep``) into
    ``run_dir``; returns the summary (per-member and aggregate returns, frames/s)."""
    return _train_on_policy("ppo", cfg, run_dir, resume)


def train_a2c(cfg: Any, run_dir: str | Path | None = None, *, resume: bool = False) -> dict[str, Any]:
    """Trains the population of ``cfg`` (an A2CConfig with ``seeds`` and ``sweep``) into
    ``run_dir``: one vmapped RMSprop step on each whole batch; returns the summary."""
    return _train_on_policy("a2c", cfg, run_dir, resume)


def _run_layers(program: list[tuple], params: tuple, x: Tensor, narrow_heads: bool = False) -> Tensor:
    """:func:`~steersman.recipes.fused._run_program`; with ``narrow_heads``, a layer of at most
    two outputs (CartPole's policy head, 64 -> 2) as ``(x[..., None, :] * weight).sum(-1) + bias``:
    the same products summed in another order (equal within float rounding). Under inductor its
    gradient with respect to ``x`` is then two fused multiply-adds instead of a batched matmul
    with an inner dimension of 2 (MKL: ~0.6 ms for 32 members, as long as a [64, 64] layer's)."""
    if not narrow_heads:
        return _run_program(program, params, x)
    for step in program:
        if step[0] == "linear" and params[step[1]].shape[0] <= 2:
            x = (x.unsqueeze(-2) * params[step[1]]).sum(-1)
            x = x if step[2] is None else x + params[step[2]]
        else:
            x = _run_program([step], params, x)
    return x


def _pure_ppo_loss(actor: list[tuple], critic: list[tuple], p: tuple, obs: Tensor, action: Tensor, logp_old: Tensor,
                   advantage: Tensor, target: Tensor, clip_eps: Tensor, entropy_coef: float, critic_coef: float,
                   normalize: bool, narrow_heads: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """:class:`~steersman.objectives.ClipPPOLoss` (categorical actor, l2 critic, no value
    clipping) of one member's minibatch as plain tensor ops on its flat leaves ``p``:
    ``(total, loss_objective, loss_critic)``. The same terms, in the same order, as the
    module's; what it skips is the TensorDict and module machinery, which is what makes a
    compiled trace of the population's update small."""
    loss_objective, entropy, loss_critic, _, _ = clip_ppo_terms(
        _run_layers(actor, p, obs, narrow_heads), _run_layers(critic, p, obs, narrow_heads), action, logp_old,
        advantage, target, clip_eps,
        normalize=normalize, critic_coeff=critic_coef)
    loss_entropy = (-entropy_coef * entropy).mean()
    return loss_objective + loss_critic + loss_entropy, loss_objective, loss_critic


class _OnPolicyModel:
    """PPO's or A2C's population pieces: the members' networks and loss, their stacked
    parameters and optimizer state, and the vmapped functions (act, greedy, values, the
    minibatch update) over the rows."""

    def __init__(self, algo: str, pop: Population) -> None:
        from steersman.objectives import A2CLoss

        from . import ppo

        cfg = pop.cfg
        nets = []  # each member's networks, built as the single-seed recipe builds them
        for mc in pop.row_cfgs:
            seed_everything(mc.seed)
            shape_env = pop.shape_env(mc)
            nets.append(nn.ModuleDict({"actor_network": ppo.make_policy(mc, shape_env),
                                       "critic_network": ppo.make_critic(mc, shape_env)}))
        actor, critic = self.actor, self.critic = nets[0]["actor_network"], nets[0]["critic_network"]
        if algo == "ppo":
            self.gamma, self.lmbda = cfg.loss.gamma, cfg.loss.gae_lambda
            loss_fn: nn.Module = ClipPPOLoss(actor, critic, clip_epsilon=cfg.loss.clip_epsilon,
                                             entropy_coeff=cfg.loss.entropy_coef, critic_coeff=cfg.loss.critic_coef,
                                             loss_critic_type="l2", normalize_advantage=cfg.loss.normalize_advantage,
                                             diagnostics=False)
            opt_of: Callable[[Any], Any] = lambda lr: optim.Adam(lr=lr, eps=cfg.optim.eps)  # noqa: E731
        else:
            self.gamma, self.lmbda = cfg.gamma, cfg.gae_lambda
            loss_fn = A2CLoss(actor, critic, entropy_coeff=cfg.entropy_coef, critic_coeff=cfg.critic_coef,
                              loss_critic_type="l2")
            opt_of = lambda lr: optim.RMSprop(lr=lr, alpha=0.99, eps=1e-5)  # noqa: E731  (a2c.py's settings)
        self.loss_fn = loss_fn
        logits_net, value_net = actor.module[0].module, critic.module  # obs -> logits, obs -> value
        st = Stacked(nets, loss_fn)
        keys, self.names, self.params = st.keys, st.names, st.params
        self.state_keys, opt_state = st.opt_init(opt_of(1.0))
        # contiguous copies (the step counter comes expanded, stride 0): the leaves the update
        # returns are contiguous, and a compiled update would otherwise trace twice
        self.opt_state = tuple(v.clone(memory_format=torch.contiguous_format) for v in opt_state)
        state_keys = self.state_keys
        self.base = {name: torch.tensor([getattr(mc.optim, name) for mc in pop.row_cfgs], dtype=torch.float32)
                     for name in ("lr", "max_grad_norm")}

        def act(p: tuple, obs: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:  # one member: obs [E, D], u [E]
            with st.swapped(p):
                return _categorical_draw(logits_net(obs), u)

        def greedy(p: tuple, obs: Tensor) -> Tensor:
            with st.swapped(p):
                return logits_net(obs).argmax(-1)

        def values(p: tuple, obs: Tensor) -> Tensor:
            with st.swapped(p):
                return value_net(obs).squeeze(-1)

        lk = loss_fn.tensor_keys
        td_keys = ["observation", lk.action, lk.sample_log_prob, lk.advantage, lk.value_target]

        def update(p: tuple, s: tuple, data: tuple, idx: Tensor, lr: Tensor, max_norm: Tensor):
            """One member's step: pure, ``(params, state, data[idx]) -> (params, state, metrics)``."""
            mb = tree_from_leaves(td_keys, [v[idx] for v in data], [idx.shape[0]])

            def loss_of(q: tuple):
                with st.swapped(q):
                    out = loss_fn(mb)
                total = out["loss_objective"] + out["loss_critic"] + out.get("loss_entropy", torch.zeros(()))
                return total, (out["loss_objective"].detach(), out["loss_critic"].detach())

            grads, (_, (l_obj, l_crit)) = torch.func.grad_and_value(loss_of, has_aux=True)(p)
            new_p, new_s, grad_norm = _opt_step(opt_of(lr), keys, state_keys, p, grads, s, max_norm)
            return new_p, new_s, torch.stack([l_obj, l_crit, grad_norm])

        self.update = update
        self.step_fn: Callable | None = None  # compile=true: the collection step as one graph
        self.gae_fn: Callable | None = None  # compile=true: values and GAE of a batch as one graph
        if cfg.compile and algo == "ppo":
            pure = self._pure_update(pop, loss_fn, logits_net, value_net, keys, state_keys, opt_of)
            if pure is not None:
                update = pure
                self.step_fn = self._compiled_step(pop, _program(logits_net, self.names,
                                                                     "actor_network.module.0.module."))
                self.gae_fn = self._compiled_gae(pop, _program(value_net, self.names, "critic_network.module."))
        self.v_update = pop.vmapped(update, f"vmapped {algo.upper()} update", options=ON_POLICY_OPTIONS)
        self.v_act, self.v_greedy, self.v_values = torch.vmap(act), torch.vmap(greedy), torch.vmap(values)

    @staticmethod
    def _compiled_step(pop: Population, actor: Any) -> Callable:
        """One step of every row as one compiled graph: each member's policy MLP on its
        observations, the categorical draw at the member's uniforms and the env's own step
        function with auto-reset (the native env's kernel: the same dynamics and
        counter-based resets as ``step_and_maybe_reset``)."""
        env = pop.env
        kernel, offsets, consts, max_steps, udtype = (type(env)._kernel, env._offsets, env._c_float,
                                                      env.max_episode_steps, env._udtype)

        def draw(p: tuple, obs: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
            return _categorical_draw(_run_program(actor, p, obs), u)

        v_draw = torch.vmap(draw)

        def step(p: tuple, obs: Tensor, u: Tensor, state: Tensor, steps: Tensor, rng: Tensor) -> tuple:
            action, logp = v_draw(p, obs, u)
            state, steps, rng, (nobs, reward, flags), robs = kernel(state, steps, rng, offsets, action, consts, 1,
                                                                    max_steps, True, udtype, True)
            return (action, logp, nobs.clone(memory_format=torch.contiguous_format), reward[..., 0], flags, state,
                    steps, rng, robs.clone(memory_format=torch.contiguous_format))

        return pop.vmapped(step, "collection step", vmap=False, options=ON_POLICY_OPTIONS)

    def _compiled_gae(self, pop: Population, critic: Any) -> Callable:
        """Each member's critic on the batch's observations and next observations, then
        :func:`_gae`, as one compiled graph (the loop over time unrolled: ``n_steps`` small steps)."""
        gamma, lmbda = self.gamma, self.lmbda
        v_value = torch.vmap(lambda p, obs: _run_program(critic, p, obs).squeeze(-1))

        def advantages(p: tuple, obs: Tensor, next_obs: Tensor, reward: Tensor, terminated: Tensor, done: Tensor):
            return _gae(v_value(p, obs), v_value(p, next_obs), reward, terminated, done, gamma, lmbda)

        return pop.vmapped(advantages, "advantage estimate", vmap=False, options=ON_POLICY_OPTIONS)

    def advantages(self, params: tuple, r: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """GAE of a collected batch ``[P, E, T]``: ``(advantage, value_target)``."""
        if self.gae_fn is not None:
            return self.gae_fn(params, r["obs"], r["next_obs"], r["reward"], r["terminated"], r["done"])
        value, next_value = self.v_values(params, r["obs"]), self.v_values(params, r["next_obs"])
        return _gae(value, next_value, r["reward"], r["terminated"], r["done"], self.gamma, self.lmbda)

    def collect(self, env: NativeEnv, obs: Tensor, T: int, params: tuple, stream: Streams,
                episodes: EpisodeStats) -> tuple[dict[str, Tensor], Tensor]:
        """``T`` steps of every row with the members' current policies (see :func:`_collect`)."""
        E = env.batch_size[1]
        if self.step_fn is None:
            def policy(o: Tensor) -> tuple[Tensor, dict]:
                action, logp = self.v_act(params, o, stream.uniform(E))
                return action, {"logp": logp}
            return _collect(env, obs, T, policy, episodes)
        out: dict[str, list[Tensor]] = {}
        obs = obs.contiguous()
        state, steps, rng = (t.contiguous() for t in (env._state, env._steps, env._rng))
        uniforms = stream.uniform(T * E).view(-1, T, E).transpose(0, 1).contiguous()  # T draws of E at once
        for t in range(T):
            action, logp, nobs, reward, flags, state, steps, rng, next_obs = self.step_fn(
                params, obs, uniforms[t], state, steps, rng)
            done, terminated = flags[0].bool(), flags[1].bool()
            episodes.step(reward, done)
            for key, v in (("obs", obs), ("action", action), ("next_obs", nobs), ("reward", reward),
                           ("terminated", terminated), ("done", done), ("logp", logp)):
                out.setdefault(key, []).append(v)
            obs = next_obs
        env._state, env._steps, env._rng = state, steps, rng
        episodes.end_batch()
        return {k: torch.stack(v, 2) for k, v in out.items()}, obs


    @staticmethod
    def _pure_update(pop: Population, loss_fn: nn.Module, logits_net: nn.Module, value_net: nn.Module, keys: list,
                     state_keys: list, opt_of: Callable[[Any], Any]) -> Callable | None:
        """The member's PPO step on plain tensors (:func:`_pure_ppo_loss`), for ``compile=true``:
        the same math as ``update`` (float-rounding equal, not bitwise: the compiled kernels
        fuse and reorder), a trace a fraction of the size. None, with a one-line warning,
        when the networks are not plain MLPs (the module-swapping update is compiled then)."""
        names = [".".join(k) for k in keys]
        actor = _program(logits_net, names, "actor_network.module.0.module.")
        critic = _program(value_net, names, "critic_network.module.")
        used = {i for prog in (actor or []) + (critic or []) if prog[0] == "linear" for i in prog[1:] if i is not None}
        if actor is None or critic is None or used != set(range(len(names))) or loss_fn.clip_value is not None:
            warnings.warn("compile=true: the population's networks are not plain MLPs (or the loss clips values); "
                          "compiling the module-swapping update instead", stacklevel=3)
            return None
        cfg, narrow_heads = pop.cfg.loss, pop.cfg.compile_backend == "inductor" and NARROW_HEADS
        clip_eps = loss_fn.clip_epsilon  # a buffer annealed in place: read at each call, no recompile

        def update(p: tuple, s: tuple, data: tuple, idx: Tensor, lr: Tensor, max_norm: Tensor):
            obs, action, logp, adv, target = (v[idx] for v in data)

            def loss_of(q: tuple):
                total, l_obj, l_crit = _pure_ppo_loss(actor, critic, q, obs, action, logp, adv, target, clip_eps,
                                                      float(cfg.entropy_coef), float(cfg.critic_coef),
                                                      bool(cfg.normalize_advantage), narrow_heads)
                return total, (l_obj.detach(), l_crit.detach())

            grads, (_, (l_obj, l_crit)) = torch.func.grad_and_value(loss_of, has_aux=True)(p)
            new_p, new_s, grad_norm = _opt_step(opt_of(lr), keys, state_keys, p, grads, s, max_norm)
            return new_p, new_s, torch.stack([l_obj, l_crit, grad_norm])

        return update


def _train_on_policy(algo: str, cfg: Any, run_dir: str | Path | None, resume: bool) -> dict[str, Any]:
    E, T = cfg.env.num_envs, cfg.n_steps
    B = E * T  # frames per member per batch
    pop = Population(algo, cfg, run_dir, resume=resume, batch_frames=B)
    P = pop.P
    model = _OnPolicyModel(algo, pop)
    loss_fn, actor, names, state_keys = model.loss_fn, model.actor, model.names, model.state_keys
    params, opt_state, base = model.params, model.opt_state, model.base
    v_update, v_greedy = model.v_update, model.v_greedy

    # ---- the state a checkpoint holds
    act_stream, shuffle_stream = Streams(pop.seeds, _SALT_ACTIONS), Streams(pop.seeds, _SALT_SHUFFLE)
    env = pop.env
    obs = env.reset()["observation"]
    episodes = EpisodeStats(P, E)
    frames, iteration, evals = 0, 0, []
    saved_state = pop.open()
    if saved_state is not None:
        s_ = saved_state
        params = tuple(s_["params"][n] for n in names)
        opt_state = tuple(s_["opt_state"][_dotted(k)] for k in state_keys)
        env.set_state(s_["env_state"])
        env.set_rng_state(s_["env_rng"])
        obs = s_["obs"]
        episodes.load(s_)
        act_stream.counter, shuffle_stream.counter = int(s_["act_counter"]), int(s_["shuffle_counter"])
        frames, iteration = int(s_["frames"]), int(s_["iteration"])
        evals = [(int(f), r.tolist()) for f, r in zip(s_["eval_frames"].tolist(), s_["eval_returns"])]

    def save() -> None:
        pop.save({"params": dict(zip(names, params)),
                  "opt_state": {_dotted(k): v for k, v in zip(state_keys, opt_state)},
                  "env_state": env.get_state().to_dict(), "env_rng": env.rng_state, "obs": obs.clone(),
                  **episodes.state(), "act_counter": act_stream.counter, "shuffle_counter": shuffle_stream.counter,
                  "eval_frames": torch.tensor([f for f, _ in evals], dtype=torch.int64),
                  "eval_returns": [torch.tensor(r) for _, r in evals]}, frames, iteration)

    next_eval, next_ckpt = _schedule(frames, cfg.eval.interval), _schedule(frames, cfg.checkpoint.interval)
    t_start, frames0, saved = time.perf_counter(), frames, -1
    while frames < pop.total_frames:
        # ---- collect T steps of every member's E sub-envs, then GAE
        with torch.no_grad():
            r, obs = model.collect(env, obs, T, params, act_stream, episodes)
            adv, target = model.advantages(params, r)
        frames += B

        # ---- anneal, then the vmapped update of every member: PPO epochs x minibatches, A2C one step
        progress_left = max(1.0 - frames / pop.total_frames, 0.0)
        anneal = algo == "ppo" and cfg.optim.anneal_lr
        lr = base["lr"] * progress_left if anneal else base["lr"]
        if algo == "ppo" and cfg.loss.anneal_clip:
            loss_fn.clip_epsilon.fill_(max(cfg.loss.clip_epsilon * progress_left, 1e-8))
        data = tuple(v.reshape(P, B, *v.shape[3:]) for v in (r["obs"], r["action"], r["logp"], adv[..., None],
                                                                  target[..., None]))
        if algo == "ppo":
            shuffles = shuffle_stream.permutations(B, cfg.epochs).transpose(0, 1).contiguous()  # [epochs, P, B]
            for shuffle in shuffles:
                for idx in shuffle.split(cfg.minibatch_size, dim=1):
                    params, opt_state, metrics = v_update(params, opt_state, data, idx, lr, base["max_grad_norm"])
        else:
            idx = torch.arange(B).expand(P, B)
            params, opt_state, metrics = v_update(params, opt_state, data, idx, lr, base["max_grad_norm"])
        iteration += 1

        # ---- log, evaluate, checkpoint
        if iteration % cfg.logger.log_interval == 0:
            fps = (frames - frames0) * pop.M / max(time.perf_counter() - t_start, 1e-9)
            pop.log(frames, [{"train/loss_objective": float(metrics[k, 0]), "train/loss_critic": float(metrics[k, 1]),
                              "train/grad_norm": float(metrics[k, 2]), "train/lr": float(lr[k]), "time/fps": fps,
                              "train/return": float(episodes.last_return[k])} for k in range(pop.M)])
        if frames >= next_eval or frames >= pop.total_frames:
            evals.append((frames, _eval_and_log(pop, frames, lambda o, p=params: v_greedy(p, o))))
            next_eval = _schedule(frames, cfg.eval.interval)
        if frames >= next_ckpt or frames >= pop.total_frames:
            save()
            saved, next_ckpt = frames, _schedule(frames, cfg.checkpoint.interval)
    if saved != frames and frames > frames0:
        save()
    wall = time.perf_counter() - t_start
    pop.close()
    return _finish(pop, names, params, loss_fn, actor, evals, frames, (frames - frames0) * pop.M / max(wall, 1e-9),
                   wall)


def _eval_and_log(pop: Population, frames: int, greedy: Callable[[Tensor], Tensor]) -> list[float]:
    returns = pop.evaluate(greedy)
    pop.log(frames, [{"eval/return": float(returns[k])} for k in range(pop.M)])
    if not pop.cfg.quiet:
        print(f"{frames} frames x {pop.M} members: eval return mean {float(returns.mean()):.1f} "
              f"(min {float(returns.min()):.1f}, max {float(returns.max()):.1f})", file=sys.stderr)
    return returns.tolist()


# ---------------------------------------------------------------- DQN, SAC, TD3 (off-policy, a replay buffer per member)
class MemberReplay:
    """A circular replay buffer per member: every entry ``[P, capacity, ...]`` (one write
    cursor: the members collect the same number of frames), sampled uniformly with
    replacement from each member's own counter-based stream (:class:`Streams`), as
    ``RandomSampler`` on a ``LazyTensorStorage`` of one seed would be used."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.cursor, self.size = capacity, 0, 0
        self.data: dict[str, Tensor] = {}

    def extend(self, batch: dict[str, Tensor]) -> None:
        """``batch``: entries ``[P, n, ...]`` (``n <= capacity``)."""
        n = next(iter(batch.values())).shape[1]
        if not self.data:
            self.data = {k: torch.zeros(v.shape[0], self.capacity, *v.shape[2:], dtype=v.dtype)
                         for k, v in batch.items()}
        pos = (self.cursor + torch.arange(n)) % self.capacity
        for k, v in batch.items():
            self.data[k][:, pos] = v
        self.cursor = (self.cursor + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def state(self) -> dict[str, Any]:
        return {"data": {k: v[:, :self.size].clone() for k, v in self.data.items()}, "cursor": self.cursor,
                "size": self.size}

    def load(self, st: dict[str, Any]) -> None:
        self.cursor, self.size = int(st["cursor"]), int(st["size"])
        self.data = {}
        for k, v in st["data"].items():
            full = torch.zeros(v.shape[0], self.capacity, *v.shape[2:], dtype=v.dtype)
            full[:, :self.size] = v
            self.data[k] = full


_TRANSITION = ("obs", "action", "next_obs", "reward", "terminated", "done")


def _minibatch(data: tuple, idx: Tensor, **extra: Tensor) -> TensorDict:
    """One member's sampled transitions as the losses read them (``extra``: entries of the
    root, ``next_<key>`` entries of ``"next"``)."""
    obs, action, next_obs, reward, terminated, done = (v[idx] for v in data)
    nxt = {"observation": next_obs, "reward": reward[:, None], "done": done[:, None],
           "terminated": terminated[:, None]}
    root = {"observation": obs, "action": action}
    for k, v in extra.items():
        (nxt if k.startswith("next_") else root)[k.removeprefix("next_")] = v
    return TensorDict({**root, "next": nxt}, [idx.shape[0]])


def _split(st: Stacked, groups: dict[str, Callable[[str], bool]]) -> dict[str, tuple[list, list[str], tuple]]:
    """The stacked leaves by group: ``{group: (keys, names, leaves)}``; leaves in no group stay the module's."""
    out = {}
    for g, pred in groups.items():
        idx = [i for i, n in enumerate(st.names) if pred(n)]
        out[g] = ([st.keys[i] for i in idx], [st.names[i] for i in idx], tuple(st.params[i] for i in idx))
    return out


class OffPolicy:
    """What one off-policy algorithm gives :func:`_train_off_policy`: its stacked leaves
    per group (``learn``: parameters, targets, optimizer states), how it acts, and its
    vmapped ``learn_step`` on one minibatch per member."""

    metric_names: tuple[str, ...] = ()
    updates_per_batch: int = 1
    loss_fn: nn.Module
    actor: nn.Module  # the module whose parameters (after copying a member's in) are exported
    names: dict[str, list[str]]
    learn: dict[str, tuple]

    def act(self, obs: Tensor, frames: int, random_phase: bool) -> Tensor:
        raise NotImplementedError

    def greedy(self, obs: Tensor) -> Tensor:
        raise NotImplementedError

    def learn_step(self, data: tuple, idx: Tensor, n_update: int) -> Tensor:
        """Updates ``self.learn``; returns the metrics ``[P, len(metric_names)]``."""
        raise NotImplementedError

    def after_batch(self, learn_batches: int) -> None:
        pass

    def log_extra(self, frames: int) -> dict[str, float]:
        return {}

    def streams(self) -> dict[str, Streams]:
        return {}

    def export_params(self) -> tuple[list[str], tuple]:
        return self.names["params"], self.learn["params"]


def _uniform_box(u: Tensor, low: Tensor, high: Tensor) -> Tensor:
    return low + u * (high - low)


def _train_off_policy(pop: Population, algo: OffPolicy, E: int, T: int) -> dict[str, Any]:
    """The shared off-policy loop: collect ``T`` steps of every member's ``E`` sub-envs into
    its replay buffer, then ``algo.updates_per_batch`` vmapped learning steps on each
    member's own samples; evaluate, log, checkpoint; bit-exact resume."""
    cfg, P, B = pop.cfg, pop.P, E * T
    env = pop.env
    obs = env.reset()["observation"]
    episodes, rb = EpisodeStats(P, E), MemberReplay(cfg.buffer_size)
    sample_stream = Streams(pop.seeds, _SALT_SHUFFLE)
    streams = {"sample": sample_stream, **algo.streams()}
    frames, iteration, updates, learn_batches, evals = 0, 0, 0, 0, []
    metrics = torch.full((P, len(algo.metric_names)), math.nan)
    saved_state = pop.open()
    if saved_state is not None:
        s_ = saved_state
        algo.learn = {g: tuple(s_["learn"][g][n] for n in algo.names[g]) for g in algo.learn}
        env.set_state(s_["env_state"])
        env.set_rng_state(s_["env_rng"])
        obs = s_["obs"]
        episodes.load(s_)
        rb.load(s_["buffer"])
        for name, stream in streams.items():
            stream.counter = int(s_["counters"][name])
        frames, iteration = int(s_["frames"]), int(s_["iteration"])
        updates, learn_batches, metrics = int(s_["updates"]), int(s_["learn_batches"]), s_["metrics"]
        evals = [(int(f), r.tolist()) for f, r in zip(s_["eval_frames"].tolist(), s_["eval_returns"])]

    def save() -> None:
        pop.save({"learn": {g: dict(zip(algo.names[g], leaves)) for g, leaves in algo.learn.items()},
                  "env_state": env.get_state().to_dict(), "env_rng": env.rng_state, "obs": obs.clone(),
                  **episodes.state(), "buffer": rb.state(),
                  "counters": {name: s.counter for name, s in streams.items()},
                  "updates": updates, "learn_batches": learn_batches, "metrics": metrics,
                  "eval_frames": torch.tensor([f for f, _ in evals], dtype=torch.int64),
                  "eval_returns": [torch.tensor(r) for _, r in evals]}, frames, iteration)

    next_eval, next_ckpt = _schedule(frames, cfg.eval.interval), _schedule(frames, cfg.checkpoint.interval)
    t_start, frames0, saved = time.perf_counter(), frames, -1
    while frames < pop.total_frames:
        # ---- collect (random actions before learning_starts) into each member's buffer
        random_phase = frames < cfg.learning_starts
        with torch.no_grad():
            r, obs = _collect(env, obs, T, lambda o, f=frames, rp=random_phase: (algo.act(o, f, rp), {}), episodes)
        rb.extend({k: v.reshape(P, B, *v.shape[3:]) for k, v in r.items()})
        frames += B
        iteration += 1

        # ---- learning steps, each vmapped over the members, on each member's own samples
        if frames >= cfg.learning_starts:
            data = tuple(rb.data[k] for k in _TRANSITION)
            n, bs = algo.updates_per_batch, cfg.batch_size
            idx = sample_stream.randint(n * bs, rb.size)
            for g in range(n):
                metrics = algo.learn_step(data, idx[:, g * bs:(g + 1) * bs], updates)
                updates += 1
            learn_batches += 1
            algo.after_batch(learn_batches)

        if iteration % cfg.logger.log_interval == 0:
            fps = (frames - frames0) * pop.M / max(time.perf_counter() - t_start, 1e-9)
            extra = algo.log_extra(frames)
            pop.log(frames, [{**{f"train/{m}": float(metrics[k, i]) for i, m in enumerate(algo.metric_names)},
                              **extra, "time/fps": fps, "train/return": float(episodes.last_return[k])}
                             for k in range(pop.M)])
        if frames >= next_eval or frames >= pop.total_frames:
            evals.append((frames, _eval_and_log(pop, frames, algo.greedy)))
            next_eval = _schedule(frames, cfg.eval.interval)
        if frames >= next_ckpt or frames >= pop.total_frames:
            save()
            saved, next_ckpt = frames, _schedule(frames, cfg.checkpoint.interval)
    if saved != frames and frames > frames0:
        save()
    wall = time.perf_counter() - t_start
    pop.close()
    names, params = algo.export_params()
    return _finish(pop, names, params, algo.loss_fn, algo.actor, evals, frames,
                   (frames - frames0) * pop.M / max(wall, 1e-9), wall)


def _off_policy_shape(cfg: Any) -> tuple[int, int]:
    E = cfg.env.num_envs
    if cfg.frames_per_batch % E:
        raise ConfigError(f"frames_per_batch ({cfg.frames_per_batch}) must be a multiple of env.num_envs ({E}) "
                          "with seeds/sweep")
    return E, cfg.frames_per_batch // E


def _row_tensor(pop: Population, field_name: str) -> Tensor:
    """A per-member float tensor ``[P]`` of a (possibly swept) numeric config field."""
    def get(mc: Any) -> float:
        obj = mc
        for part in field_name.split("."):
            obj = getattr(obj, part)
        return float(obj)
    return torch.tensor([get(mc) for mc in pop.row_cfgs], dtype=torch.float32)


class _DQN(OffPolicy):
    """Epsilon-greedy Q-learning (:class:`~steersman.objectives.DQNLoss`), Adam with
    global-norm clipping, the target copied every ``target_update_interval`` learning rounds."""

    metric_names = ("loss", "grad_norm")

    def __init__(self, pop: Population) -> None:
        from steersman.objectives import DQNLoss

        from . import dqn

        cfg = self.cfg = pop.cfg
        losses = []
        for mc in pop.row_cfgs:  # each member's Q-network (and its target copy), as dqn.train builds them
            seed_everything(mc.seed)
            shape_env = pop.shape_env(mc)
            losses.append(DQNLoss(dqn.make_policy(mc, shape_env), loss_function=cfg.loss_function, delay_value=True,
                                  double_dqn=cfg.double_dqn, action_space=shape_env.action_spec))
        loss_fn = self.loss_fn = losses[0]
        loss_fn.make_value_estimator(gamma=cfg.gamma)
        self.actor = loss_fn.value_network
        q_module = self.actor.module[0].module  # obs -> action values
        st = Stacked(losses, loss_fn)
        g = _split(st, {"params": lambda n: n.startswith("value_network."),
                        "target": lambda n: n.startswith("target_value_network.")})
        keys, target_keys = g["params"][0], g["target"][0]
        adam = optim.Adam(lr=1.0)
        state_keys, opt_state = st.opt_init(adam, keys, g["params"][2])
        self.names = {"params": g["params"][1], "target": g["target"][1], "opt": [_dotted(k) for k in state_keys]}
        self.learn = {"params": g["params"][2], "target": g["target"][2], "opt": opt_state}
        self.lr, self.max_norm = _row_tensor(pop, "optim.lr"), _row_tensor(pop, "optim.max_grad_norm")
        self.n_actions = action_spec_unbatched(pop.env).n
        self.anneal_steps = max(int(cfg.exploration_fraction * cfg.total_frames), 1)
        self.updates_per_batch = cfg.gradient_steps
        self.act_stream = Streams(pop.seeds, _SALT_ACTIONS)
        # a plain MLP (the recipe's) runs layer by layer on the leaves: the module's own ops,
        # without swapping the leaves into the module at every step (~4x cheaper a call)
        q_program = _program(q_module, self.names["params"], "value_network.module.0.module.")

        def greedy(p: tuple, obs: Tensor) -> Tensor:
            if q_program is not None:
                return _run_program(q_program, p, obs).argmax(-1)
            with st.swapped(p, keys):
                return q_module(obs).argmax(-1)

        def update(p: tuple, tgt: tuple, s: tuple, data: tuple, idx: Tensor, lr: Tensor, max_norm: Tensor):
            mb = _minibatch(data, idx)

            def loss_of(q: tuple):
                with st.swapped(q + tgt, keys + target_keys):
                    out = loss_fn(mb)
                return out["loss"], out["loss"].detach()

            grads, (_, loss) = torch.func.grad_and_value(loss_of, has_aux=True)(p)
            new_p, new_s, grad_norm = _opt_step(optim.Adam(lr=lr), keys, state_keys, p, grads, s, max_norm)
            return new_p, new_s, torch.stack([loss, grad_norm])

        self.v_greedy, self.v_update = torch.vmap(greedy), pop.vmapped(update, "vmapped DQN update")

    def epsilon(self, frames: int) -> float:
        c = self.cfg
        return c.eps_init + (c.eps_end - c.eps_init) * min(frames / self.anneal_steps, 1.0)

    def act(self, obs: Tensor, frames: int, random_phase: bool) -> Tensor:
        E = obs.shape[1]
        u = self.act_stream.uniform(2 * E)
        rand = (u[:, E:] * self.n_actions).to(torch.int64).clamp(max=self.n_actions - 1)
        if random_phase:
            return rand
        return torch.where(u[:, :E] < self.epsilon(frames), rand, self.v_greedy(self.learn["params"], obs))

    def greedy(self, obs: Tensor) -> Tensor:
        return self.v_greedy(self.learn["params"], obs)

    def learn_step(self, data: tuple, idx: Tensor, n_update: int) -> Tensor:
        L = self.learn
        p, s, metrics = self.v_update(L["params"], L["target"], L["opt"], data, idx, self.lr, self.max_norm)
        self.learn = {**L, "params": p, "opt": s}
        return metrics

    def after_batch(self, learn_batches: int) -> None:
        if learn_batches % self.cfg.target_update_interval == 0:
            self.learn = {**self.learn, "target": tuple(p.clone() for p in self.learn["params"])}

    def log_extra(self, frames: int) -> dict[str, float]:
        return {"train/epsilon": self.epsilon(frames)}

    def streams(self) -> dict[str, Streams]:
        return {"actions": self.act_stream}


def train_dqn(cfg: Any, run_dir: str | Path | None = None, *, resume: bool = False) -> dict[str, Any]:
    """Trains the population of ``cfg`` (a DQNConfig with ``seeds`` and ``sweep``) into
    ``run_dir``: epsilon-greedy collection into a replay buffer per member, then
    ``gradient_steps`` vmapped updates of :class:`~steersman.objectives.DQNLoss`, target
    copied every ``target_update_interval`` batches; returns the summary."""
    E, T = _off_policy_shape(cfg)
    pop = Population("dqn", cfg, run_dir, resume=resume, batch_frames=E * T)
    return _train_off_policy(pop, _DQN(pop), E, T)


def _normals(stream: Streams, shape: tuple[int, ...]) -> Tensor:
    """``[M, *shape]`` standard normal draws (Box-Muller on two uniforms each)."""
    n = math.prod(shape)
    u = stream.uniform(2 * n)
    z = torch.sqrt(-2.0 * torch.log1p(-u[:, :n])) * torch.cos((2 * math.pi) * u[:, n:])
    return z.reshape(-1, *shape)


class _SAC(OffPolicy):
    """Soft actor-critic (:class:`~steersman.objectives.SACLoss`, continuous actions): one
    Adam step on actor + twin critics + temperature, then the soft target update, in one
    vmapped function; the policy's noise comes from each member's own stream."""

    metric_names = ("loss_actor", "loss_qvalue", "alpha", "entropy")

    def __init__(self, pop: Population) -> None:
        from steersman.objectives.sac import SACLoss

        from . import sac

        cfg = self.cfg = pop.cfg
        box = action_spec_unbatched(pop.env)
        self.low, self.high, self.act_dim = box.low, box.high, box.shape[-1]
        target_entropy = cfg.target_entropy if cfg.target_entropy == "auto" else float(cfg.target_entropy)
        losses = []
        for mc in pop.row_cfgs:  # as sac.train builds them; the loss's noise given at "noise" / ("next", "noise")
            seed_everything(mc.seed)
            shape_env = pop.shape_env(mc)
            losses.append(SACLoss(sac.make_policy(mc, shape_env), sac.make_qvalue(mc, shape_env), action_spec=box,
                                  loss_function=cfg.loss_function, alpha_init=cfg.alpha_init,
                                  target_entropy=target_entropy, given_noise_key="noise"))
        loss_fn = self.loss_fn = losses[0]
        loss_fn.make_value_estimator(gamma=cfg.gamma)
        _ = loss_fn.vmap_randomness  # resolved now: first computed inside a compiled trace, it breaks the graph
        self.actor = loss_fn.actor_network  # the recipe's own actor: policy.pt / export get each member's weights
        loc_scale = loss_fn.actor_network.module[0]  # "observation" -> "loc", "scale"
        st = Stacked(losses, loss_fn)
        trainable = {n for n, p in loss_fn.named_parameters() if p.requires_grad}
        g = _split(st, {"params": lambda n: n in trainable, "target": lambda n: n.startswith("target_")})
        keys, target_keys = g["params"][0], g["target"][0]
        state_keys, opt_state = st.opt_init(optim.Adam(lr=1.0), keys, g["params"][2])
        self.names = {"params": g["params"][1], "target": g["target"][1], "opt": [_dotted(k) for k in state_keys]}
        self.learn = {"params": g["params"][2], "target": g["target"][2], "opt": opt_state}
        self.lr, tau = _row_tensor(pop, "optim.lr"), cfg.tau
        self.updates_per_batch = max(int(cfg.frames_per_batch * cfg.utd_ratio), 1)
        self.act_stream, self.noise_stream = Streams(pop.seeds, _SALT_ACTIONS), Streams(pop.seeds, _SALT_NOISE)
        mid, half = (box.high + box.low) / 2, (box.high - box.low) / 2

        def sample(p: tuple, obs: Tensor, eps: Tensor) -> Tensor:
            with st.swapped(p, keys):
                td = loc_scale(TensorDict({"observation": obs}, obs.shape[:1]))
            return mid + half * torch.tanh(td["loc"] + td["scale"] * eps)

        def mode(p: tuple, obs: Tensor) -> Tensor:
            with st.swapped(p, keys):
                return mid + half * torch.tanh(loc_scale(TensorDict({"observation": obs}, obs.shape[:1]))["loc"])

        def update(p: tuple, tgt: tuple, s: tuple, data: tuple, idx: Tensor, noise: Tensor, lr: Tensor):
            mb = _minibatch(data, idx, noise=noise[0], next_noise=noise[1])

            def loss_of(q: tuple):
                with st.swapped(q + tgt, keys + target_keys):
                    out = loss_fn(mb)
                total = out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]
                return total, torch.stack([out["loss_actor"], out["loss_qvalue"], out["alpha"],
                                           out["entropy"]]).detach()

            grads, (_, m) = torch.func.grad_and_value(loss_of, has_aux=True)(p)
            new_p, new_s, _ = _opt_step(optim.Adam(lr=lr), keys, state_keys, p, grads, s, None)
            new_t = _soft_update(keys, new_p, target_keys, tgt, tau)
            return new_p, new_t, new_s, m

        self.v_sample, self.v_mode = torch.vmap(sample), torch.vmap(mode)
        self.v_update = pop.vmapped(update, "vmapped SAC update")

    def act(self, obs: Tensor, frames: int, random_phase: bool) -> Tensor:
        E = obs.shape[1]
        if random_phase:
            u = self.act_stream.uniform(E * self.act_dim).reshape(-1, E, self.act_dim)
            return _uniform_box(u, self.low, self.high)
        return self.v_sample(self.learn["params"], obs, _normals(self.act_stream, (E, self.act_dim)))

    def greedy(self, obs: Tensor) -> Tensor:
        return self.v_mode(self.learn["params"], obs)

    def learn_step(self, data: tuple, idx: Tensor, n_update: int) -> Tensor:
        L = self.learn
        noise = _normals(self.noise_stream, (2, idx.shape[1], self.act_dim))
        p, t, s, metrics = self.v_update(L["params"], L["target"], L["opt"], data, idx, noise, self.lr)
        self.learn = {"params": p, "target": t, "opt": s}
        return metrics

    def streams(self) -> dict[str, Streams]:
        return {"actions": self.act_stream, "noise": self.noise_stream}

    def export_params(self) -> tuple[list[str], tuple]:
        names = [n for n in self.names["params"] if n.startswith("actor_network.")]
        leaves = tuple(v for n, v in zip(self.names["params"], self.learn["params"]) if n.startswith("actor_network."))
        return names, leaves


def _soft_update(keys: list, params: tuple, target_keys: list, target: tuple, tau: float) -> tuple:
    """``target <- (1 - tau) * target + tau * online`` for each ``target_<name>`` leaf (as SoftUpdate)."""
    online = dict(zip(keys, params))
    out = []
    for k, t in zip(target_keys, target):
        src = online.get((k[0].removeprefix("target_"), *k[1:]))
        out.append(t if src is None else t.lerp(src, tau))  # (buffers, e.g. an action box, stay)
    return tuple(out)


class _TD3(OffPolicy):
    """TD3 (:class:`~steersman.objectives.TD3Loss`): a critic step every update; every
    ``policy_delay``-th one also the actor step and the soft target update (two vmapped
    functions); exploration and target-smoothing noise from each member's own stream."""

    metric_names = ("loss_qvalue", "loss_actor")

    def __init__(self, pop: Population) -> None:

        from . import td3

        cfg = self.cfg = pop.cfg
        box = td3.action_box(pop.env)
        self.low, self.high, self.act_dim = box.low, box.high, box.shape[-1]
        self.sigma = cfg.exploration_noise * float((box.high - box.low).max()) / 2  # as td3.train
        losses = []
        for mc in pop.row_cfgs:
            seed_everything(mc.seed)
            shape_env = pop.shape_env(mc)
            losses.append(TD3Loss(td3.make_policy(mc, shape_env), td3.make_qvalue(mc, shape_env), action_spec=box,
                                  policy_noise=cfg.policy_noise, noise_clip=cfg.noise_clip, loss_function="l2",
                                  given_noise_key=("next", "noise")))
        loss_fn = self.loss_fn = losses[0]
        loss_fn.make_value_estimator(gamma=cfg.gamma)
        _ = loss_fn.vmap_randomness  # (as in _SAC)
        self.actor = loss_fn.actor_network
        st = Stacked(losses, loss_fn)
        trainable = {n for n, p in loss_fn.named_parameters() if p.requires_grad}
        g = _split(st, {"params": lambda n: n in trainable, "target": lambda n: n.startswith("target_")})
        keys, target_keys = g["params"][0], g["target"][0]
        critic_i = [i for i, k in enumerate(keys) if k[0] == "qvalue_network_params"]
        actor_i = [i for i, k in enumerate(keys) if k[0] == "actor_network"]
        ck, ak = [keys[i] for i in critic_i], [keys[i] for i in actor_i]
        adam = optim.Adam(lr=1.0)
        c_state_keys, c_state = st.opt_init(adam, ck, tuple(g["params"][2][i] for i in critic_i))
        a_state_keys, a_state = st.opt_init(adam, ak, tuple(g["params"][2][i] for i in actor_i))
        self.names = {"critic": [_dotted(k) for k in ck], "actor": [_dotted(k) for k in ak], "target": g["target"][1],
                      "opt_critic": [_dotted(k) for k in c_state_keys], "opt_actor": [_dotted(k) for k in a_state_keys]}
        self.learn = {"critic": tuple(g["params"][2][i] for i in critic_i),
                      "actor": tuple(g["params"][2][i] for i in actor_i), "target": g["target"][2],
                      "opt_critic": c_state, "opt_actor": a_state}
        self.lr, tau = _row_tensor(pop, "optim.lr"), cfg.tau
        self.updates_per_batch = max(int(cfg.frames_per_batch * cfg.utd_ratio), 1)
        self.act_stream, self.noise_stream = Streams(pop.seeds, _SALT_ACTIONS), Streams(pop.seeds, _SALT_NOISE)
        actor_module = loss_fn.actor_network.module  # obs -> action in the box

        def mode(a: tuple, obs: Tensor) -> Tensor:
            with st.swapped(a, ak):
                return actor_module(obs)

        def critic_step(c: tuple, a: tuple, tgt: tuple, s: tuple, data: tuple, idx: Tensor, noise: Tensor, lr: Tensor):
            mb = _minibatch(data, idx, next_noise=noise)

            def loss_of(q: tuple):
                with st.swapped(q + a + tgt, ck + ak + target_keys):
                    loss, _ = loss_fn.value_loss(mb)
                return loss, loss.detach()

            grads, (_, loss) = torch.func.grad_and_value(loss_of, has_aux=True)(c)
            new_c, new_s, _ = _opt_step(optim.Adam(lr=lr), ck, c_state_keys, c, grads, s, None)
            return new_c, new_s, loss

        def actor_step(c: tuple, a: tuple, tgt: tuple, s: tuple, data: tuple, idx: Tensor, lr: Tensor):
            mb = _minibatch(data, idx)

            def loss_of(x: tuple):
                with st.swapped(c + x, ck + ak):
                    loss, _ = loss_fn.actor_loss(mb)
                return loss, loss.detach()

            grads, (_, loss) = torch.func.grad_and_value(loss_of, has_aux=True)(a)
            new_a, new_s, _ = _opt_step(optim.Adam(lr=lr), ak, a_state_keys, a, grads, s, None)
            new_t = _soft_update(ck + ak, c + new_a, target_keys, tgt, tau)
            return new_a, new_s, new_t, loss

        self.v_mode = torch.vmap(mode)
        self.v_critic = pop.vmapped(critic_step, "vmapped TD3 critic update")
        self.v_actor = pop.vmapped(actor_step, "vmapped TD3 actor update")
        self._loss_actor = torch.full((pop.P,), math.nan)

    def act(self, obs: Tensor, frames: int, random_phase: bool) -> Tensor:
        E = obs.shape[1]
        if random_phase:
            u = self.act_stream.uniform(E * self.act_dim).reshape(-1, E, self.act_dim)
            return _uniform_box(u, self.low, self.high)
        noise = _normals(self.act_stream, (E, self.act_dim)) * self.sigma
        return torch.maximum(torch.minimum(self.v_mode(self.learn["actor"], obs) + noise, self.high), self.low)

    def greedy(self, obs: Tensor) -> Tensor:
        return self.v_mode(self.learn["actor"], obs)

    def learn_step(self, data: tuple, idx: Tensor, n_update: int) -> Tensor:
        L = dict(self.learn)
        noise = _normals(self.noise_stream, (idx.shape[1], self.act_dim))
        L["critic"], L["opt_critic"], loss_q = self.v_critic(L["critic"], L["actor"], L["target"], L["opt_critic"],
                                                             data, idx, noise, self.lr)
        if (n_update + 1) % self.cfg.policy_delay == 0:  # delayed actor and target updates (as td3.train)
            L["actor"], L["opt_actor"], L["target"], self._loss_actor = self.v_actor(
                L["critic"], L["actor"], L["target"], L["opt_actor"], data, idx, self.lr)
        self.learn = L
        return torch.stack([loss_q, self._loss_actor], -1)

    def streams(self) -> dict[str, Streams]:
        return {"actions": self.act_stream, "noise": self.noise_stream}

    def export_params(self) -> tuple[list[str], tuple]:
        return self.names["actor"], self.learn["actor"]


def train_sac(cfg: Any, run_dir: str | Path | None = None, *, resume: bool = False) -> dict[str, Any]:
    """Trains the population of ``cfg`` (a SACConfig with ``seeds`` and ``sweep``, a
    continuous-action native env) into ``run_dir``; returns the summary."""
    E, T = _off_policy_shape(cfg)
    pop = Population("sac", cfg, run_dir, resume=resume, batch_frames=E * T, discrete=False)
    if isinstance(action_spec_unbatched(pop.env), Categorical):
        raise ConfigError(f"SAC seeds/sweep support continuous-action envs; {cfg.env.name} has discrete actions")
    return _train_off_policy(pop, _SAC(pop), E, T)


def train_td3(cfg: Any, run_dir: str | Path | None = None, *, resume: bool = False) -> dict[str, Any]:
    """Trains the population of ``cfg`` (a TD3Config with ``seeds`` and ``sweep``, a
    continuous-action native env) into ``run_dir``; returns the summary."""
    E, T = _off_policy_shape(cfg)
    pop = Population("td3", cfg, run_dir, resume=resume, batch_frames=E * T, discrete=False)
    return _train_off_policy(pop, _TD3(pop), E, T)


def _leaves_of(td: Any, keys: list | None = None) -> tuple[Tensor, ...]:
    keys = keys if keys is not None else list(td.keys(include_nested=True, leaves_only=True))
    return tuple(td.get(k) for k in keys)


def _write_yaml(path: Path, data: dict[str, Any]) -> None:
    import yaml

    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    tmp.replace(path)


def _finish(pop: Population, names: list[str], params: tuple, loss_fn: nn.Module, actor: nn.Module,
            evals: list, frames: int, fps: float, wall: float) -> dict[str, Any]:
    """Per-member policies (state_dict and export), the aggregate plot and the summary."""
    from steersman import record
    from steersman.record.plot import aggregate_returns, plot_aggregate_curve

    cfg, run_dir = pop.cfg, pop.run_dir
    module_params = dict(loss_fn.named_parameters())
    example_obs = pop.eval_env.reset()["observation"][0]
    fmt = cfg.export_format
    for k, d in enumerate(pop.member_dirs):
        with torch.no_grad():
            for name, p in zip(names, params):
                module_params[name].copy_(p[k])
        torch.save(actor.state_dict(), d / "policy.pt")
        if fmt != "none":
            path = run_dir / "export" / d.name / export_filename(fmt)
            path.parent.mkdir(parents=True, exist_ok=True)
            record.export_policy(actor, example_obs, path, format=fmt, verify=False)
    written = {"run_dir": str(run_dir), "members": [str(d) for d in pop.member_dirs]}
    try:
        curve = run_dir / "plots" / "learning_curve.png"
        plot_aggregate_curve([run_dir], curve)
        written["plot"] = str(curve)
    except Exception as err:  # a missing plot must not lose the run
        warnings.warn(f"could not plot the aggregate learning curve: {err}", stacklevel=2)
    final = evals[-1][1] if evals else [math.nan] * pop.M
    stats = aggregate_returns(torch.tensor(final, dtype=torch.float64).numpy())
    summary = {"algo": pop.algo, "env": cfg.env.name, "members": pop.M, "frames_per_member": frames,
               "final_eval_return": dict(zip((d.name for d in pop.member_dirs), final)),
               "aggregate": stats, "wall_time_s": round(wall, 2), "frames_per_s": round(fps, 1),
               "written": written}
    write_json_atomic(run_dir / "summary.json", summary, indent=1)
    print(f"done: {pop.algo} on {cfg.env.name}: {pop.M} members x {frames} frames in {wall:.1f} s "
          f"({fps:.0f} frames/s in all); final eval return mean {stats['mean']:.1f} "
          f"[{stats['ci_low']:.1f}, {stats['ci_high']:.1f}], IQM {stats['iqm']:.1f}\n  run_dir     {run_dir}",
          flush=True)
    return summary
