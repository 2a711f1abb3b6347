"""The ``steersman`` command (also ``python -m steersman``).

::

    steersman train [-m] [ALGO] [key=value ...]   train (default: ppo on CartPole-v1)
    steersman train ALGO --help                   the config fields of ALGO, with docs
    steersman eval RUN_DIR [--episodes N] [--video] [--allow-import]
    steersman resume RUN_DIR [key=value ...] [--allow-import]
                                                  continue from the latest checkpoint
    steersman export RUN_DIR --format {torch-export,onnx} [--out PATH] [--allow-import]
    steersman plot RUN_DIR [RUN_DIR ...] [--out PATH]
    steersman envs                                built-in envs and Gymnasium ids
    steersman doctor [ALGO|RUN_DIR] [key=value ...] [--seconds N]
    steersman doctor SCRIPT.py [--seconds N] [-- script args]
                                                  where the time goes, and what to change
    steersman --version

``train`` composes its config with Hydra from the recipes' dataclasses: ``key=value``
overrides any field (``optim.lr=3e-4``, ``env.num_envs=16``, ``quiet=true``); config
groups pick the algorithm (``algo=sac``, same as the positional ALGO), the env
(``env=pendulum``) and the loggers (``logger=csv``, ``logger=wandb``); ``-m`` sweeps
comma-separated values (``-m optim.lr=1e-3,3e-4 seed=0,1,2``), each job in its own run
directory (a launcher plugin such as hydra-submitit-launcher sends them to Slurm:
``hydra/launcher=submitit_slurm``). Hydra's run directory is the run directory:
``runs/<algo>_<date>_<time>`` unless ``hydra.run.dir=PATH`` says otherwise. The whole config
is checked (types, ranges, and that the env and the policy can be built) before the run
directory is made.

A run directory may come from someone else: ``eval``, ``resume`` and ``export`` refuse an
env id in its ``config.yaml`` that would import a Python module (Gymnasium's
``gym:module:Env-v0``) unless ``--allow-import`` is given. Such an id typed on ``train``'s
command line is the user's own choice.

Exit status: 0 on success; 2 on bad input (one line on stderr naming what is wrong and
the valid choices); 130 after Ctrl-C (SIGINT) and 143 after SIGTERM, each once a final
checkpoint is saved (``steersman resume RUN_DIR`` continues).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import sys
import typing
from pathlib import Path
from typing import Any

__all__ = ["main"]

USAGE = __doc__.split("::", 1)[1].split("``train`` composes", 1)[0].rstrip()
ENV_GROUP = {  # Hydra `env=<option>` shortcuts
    "cartpole": "CartPole-v1",
    "pendulum": "Pendulum-v1",
    "acrobot": "Acrobot-v1",
    "mountaincar": "MountainCar-v0",
    "mountaincar_continuous": "MountainCarContinuous-v0",
    "gridworld": "GridWorld-v0",
    "tictactoe": "tictactoe",
    "connect4": "connect4",
    "navigation": "navigation",
    "predator_prey": "predator_prey",
}
LOGGER_GROUP = {
    "default": ["csv", "tensorboard"],
    "csv": ["csv"],
    "tensorboard": ["csv", "tensorboard"],
    "wandb": ["csv", "tensorboard", "wandb"],
    "mlflow": ["csv", "tensorboard", "mlflow"],
}
DEFAULT_RUN_DIR = "runs/${hydra:runtime.choices.algo}_${now:%Y-%m-%d_%H-%M-%S}"
DEFAULT_SWEEP_DIR = "runs/multirun_${now:%Y-%m-%d_%H-%M-%S}"


class UsageError(ValueError):
    """Bad command-line input: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors as one-line :class:`UsageError` (not usage + message)."""

    def error(self, message: str) -> typing.NoReturn:
        raise UsageError(f"{self.prog}: {message} (see `{self.prog} --help`)")


_ALLOW_IMPORT_HELP = ("trust this run directory: let its env id import a Python module "
                      "(gym:module:Env-v0), which runs that module's code")


# ---------------------------------------------------------------- config keys
def _fields(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def config_keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted leaf key of a config dataclass."""
    out = []
    for name, t in _fields(cls).items():
        if isinstance(t, type) and dataclasses.is_dataclass(t):
            out += config_keys(t, f"{prefix}{name}.")
        else:
            out.append(prefix + name)
    return out


def _check_key(algo: str, cls: type, key: str) -> None:
    node: Any = cls
    parts = key.split(".")
    for i, part in enumerate(parts):
        fields = _fields(node) if isinstance(node, type) and dataclasses.is_dataclass(node) else None
        where = ".".join(parts[:i])
        if fields is None:
            raise UsageError(f"unknown config key {key!r} for {algo}: {where!r} is a value, not a group")
        if part not in fields:
            valid = sorted(fields) if where else sorted(set(fields) | {"algo"})
            scope = f" under {where!r}" if where else ""
            raise UsageError(
                f"unknown config key {key!r} for {algo}; valid keys{scope}: {', '.join(valid)} "
                f"(`steersman train {algo} --help` lists them all)"
            )
        node = fields[part]
        if node is dict or typing.get_origin(node) is dict:
            return  # a free-form dict (PPO's `sweep`): the recipe checks the keys inside it


def _sweep_values(value: str) -> list[str]:
    """The values of a simple sweep ``a,b,c`` (one value otherwise)."""
    if any(tok in value for tok in ("(", "[", "{", "$")):
        return []  # range()/choice()/interpolations: left to Hydra and the recipe
    return [v.strip() for v in value.split(",")]


def check_overrides(algo: str, overrides: list[str]) -> None:
    """One-line :class:`UsageError` for an unknown key, group option, algorithm or env id."""
    from .recipes import ALGOS, config_class
    from .recipes.config import ConfigError
    from .recipes.envs import check_env_id

    cls = config_class(algo)
    for ov in overrides:
        if ov.startswith(("hydra.", "hydra/", "+", "~")):
            continue
        if "=" not in ov:
            raise UsageError(f"expected key=value, got {ov!r} (e.g. optim.lr=3e-4)")
        key, value = ov.split("=", 1)
        values = _sweep_values(value)
        if key == "algo":
            bad = [v for v in values if v not in ALGOS]
            if bad:
                raise UsageError(f"unknown algorithm {bad[0]!r}; valid: {', '.join(sorted(ALGOS))}")
            continue
        if key in ("env", "logger"):
            group = ENV_GROUP if key == "env" else LOGGER_GROUP
            bad = [v for v in values if v not in group]
            if bad:
                hint = " (or set env.name=<id>; see `steersman envs`)" if key == "env" else ""
                raise UsageError(f"unknown {key} option {bad[0]!r}; valid: {', '.join(group)}{hint}")
            continue
        _check_key(algo, cls, key)
        if key == "env.name":
            for v in values:
                try:
                    check_env_id(v)
                except ConfigError as err:
                    raise UsageError(str(err)) from None


# ---------------------------------------------------------------- train (Hydra)
_EXIT = {"code": 0}


def _register_configs(algos: list[str]) -> None:
    from hydra.core.config_store import ConfigStore

    from .recipes import config_class

    cs = ConfigStore.instance()
    for name in algos:  # only those the command line names: each import costs time
        cs.store(group="algo", name=name, node=config_class(name), package="_global_")
    for name, env_id in ENV_GROUP.items():
        cs.store(group="env", name=name, node={"name": env_id})
    for name, backends in LOGGER_GROUP.items():
        cs.store(group="logger", name=name, node={"backends": backends})


def _hydra_task(cfg: Any) -> None:
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from .recipes import get_recipe
    from .recipes.checkpoint import CheckpointError
    from .recipes.config import ConfigError
    from .recipes.run import RUN_FILE, RunDirError
    from .tensordict import LoadError  # a saved replay buffer or TensorDict that does not load

    hc = HydraConfig.get()
    algo = hc.runtime.choices["algo"]
    out = Path(hc.runtime.output_dir)
    try:
        summary = get_recipe(algo).train(OmegaConf.to_object(cfg), out)
    except (RunDirError, ConfigError, CheckpointError, LoadError) as err:
        if not (out / RUN_FILE).exists():  # a run that did not start: no folder left behind
            shutil.rmtree(out / ".hydra", ignore_errors=True)
            with contextlib.suppress(OSError):
                out.rmdir()
        print(f"error: {_one_line(err)}", file=sys.stderr)
        sys.exit(2)
    code = _exit_code(summary)
    if code:
        sys.exit(code)


def _one_line(err: BaseException) -> str:
    msg = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
    return str(msg).splitlines()[0] if str(msg) else type(err).__name__


def _exit_code(summary: dict) -> int:
    sig = summary.get("stop_signal")
    return 128 + int(sig) if summary.get("interrupted") and sig else 0


#: Hydra flags that take a value (``--cfg job``, ``-cn NAME``...)
_VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                "--config-dir", "-cd", "--experimental-rerun", "--info", "-i"}


def _split_flags(args: list[str]) -> tuple[list[str], list[str]]:
    """``(Hydra flags with their values, key=value overrides)``."""
    flags, overrides = [], []
    it = iter(range(len(args)))
    for i in it:
        a = args[i]
        if a.startswith("-"):
            flags.append(a)
            takes_value = a in _VALUE_FLAGS and i + 1 < len(args) and "=" not in args[i + 1]
            if takes_value:
                flags.append(args[i + 1])
                next(it)
        else:
            overrides.append(a)
    return flags, overrides


def _pick_algo(args: list[str]) -> tuple[str, list[str]]:
    """``(ALGO, the other arguments)``: ALGO is the first argument that is neither a flag,
    a flag's value nor a ``key=value`` override (default ppo), wherever it stands."""
    from .recipes import ALGOS

    skip = False
    for i, a in enumerate(args):
        if skip:
            skip = False
        elif a.startswith("-"):
            skip = a in _VALUE_FLAGS and i + 1 < len(args) and "=" not in args[i + 1]
        elif "=" not in a:
            if a not in ALGOS:
                raise UsageError(f"unknown algorithm {a!r}; valid: {', '.join(sorted(ALGOS))}")
            return a, args[:i] + args[i + 1:]
    return "ppo", args


def _distributed_shorthand(algos: list[str], override: str) -> str:
    """``distributed=ray`` is ``distributed.backend=ray`` (recipes with a ``distributed`` field)."""
    if not override.startswith("distributed="):
        return override
    from .recipes import ALGOS, config_class

    def has_option(algo: str) -> bool:
        return "distributed" in {f.name for f in dataclasses.fields(config_class(algo))}

    lacking = [a for a in algos if not has_option(a)]
    if lacking:
        with_option = ", ".join(sorted(a for a in ALGOS if has_option(a)))
        raise UsageError(f"{lacking[0]} has no distributed option (it runs on one machine); "
                         f"recipes with distributed=ray: {with_option}")
    return "distributed.backend=" + override.split("=", 1)[1]


def _env_id_shorthand(override: str) -> str:
    """``env=vmas/<scenario>`` and ``env=pettingzoo/<task>`` are ``env.name=...`` (a family
    of ids, not one of the ``env=`` options)."""
    from .recipes.envs import is_marl_env_id

    key, _, value = override.partition("=")
    if key == "env" and value not in ENV_GROUP and is_marl_env_id(value):
        return f"env.name={value}"
    return override


def _group_as_keys(key: str, value: str) -> str:
    """A config-group choice as the override it stands for (``env=pendulum`` -> ``env.name=...``)."""
    if key == "env":
        return f"env.name={ENV_GROUP[value]}"
    return f"logger.backends=[{','.join(LOGGER_GROUP[value])}]"


def check_configs(algo: str, overrides: list[str], multirun: bool) -> None:
    """Builds and checks every config the command would run (each value of a sweep once),
    before Hydra makes a run directory: a one-line ConfigError/UsageError otherwise."""
    from .recipes import check_config, make_config

    alternatives = []  # per override: its values as key=value strings
    for ov in overrides:
        if ov.startswith(("hydra.", "hydra/", "+", "~")) or ov.startswith("algo="):
            continue
        key, value = ov.split("=", 1)
        values = _sweep_values(value) or [value]
        if len(values) > 1 and not multirun:
            raise UsageError(f"{ov!r} gives several values: sweeps need -m (steersman train -m {algo} {ov}); "
                             f"a list is written {key}=[{value}]")
        if multirun and "(" in value:
            continue  # range()/choice()...: expanded by Hydra, checked by the recipe
        alternatives.append([_group_as_keys(key, v) if key in ("env", "logger") else f"{key}={v}" for v in values])
    base = [alts[0] for alts in alternatives]
    variants = [base] + [base[:i] + [alt] + base[i + 1:] for i, alts in enumerate(alternatives) for alt in alts[1:]]
    for variant in variants:
        check_config(algo, make_config(algo, variant))


def cmd_train(args: list[str]) -> int:
    from .recipes import ALGOS

    algo, args = _pick_algo(args)
    algo_ov = [a for a in args if a.startswith("algo=")]
    algos = [algo]
    if algo_ov:
        algos = _sweep_values(algo_ov[-1][5:])
        if not algos:
            raise UsageError(f"{algo_ov[-1]!r}: give the algorithms as a comma-separated list")
        bad = [a for a in algos if a not in ALGOS]
        if bad:
            raise UsageError(f"unknown algorithm {bad[0]!r}; valid: {', '.join(sorted(ALGOS))}")
        algo = algos[0]
    if "--help" in args or "-h" in args:
        print(config_help(algo))
        return 0
    flags, overrides = _split_flags(args)
    multirun = "-m" in flags or "--multirun" in flags
    overrides = [_env_id_shorthand(_distributed_shorthand(algos, ov)) for ov in overrides]
    for a in algos:
        check_overrides(a, overrides)
    if not any(f in flags for f in ("--cfg", "-c", "--info", "-i")):  # those only print
        for a in algos:
            check_configs(a, overrides, multirun)
        run_dir = next((o.split("=", 1)[1] for o in overrides if o.startswith("hydra.run.dir=")), None)
        if run_dir and not multirun and (Path(run_dir) / "config.yaml").exists():  # before Hydra writes into it
            from .recipes.run import RunDirError

            raise RunDirError(f"{run_dir} already holds a run; continue it with `steersman resume {run_dir}` "
                              "or choose another directory")
    # keys inside a free-form dict field (sweep.optim.lr=[...]) are new to Hydra's struct config
    hydra_args = flags + ["+" + o if o.startswith("sweep.") else o for o in overrides]
    if not algo_ov:
        hydra_args.insert(len(flags), f"algo={algo}")
    if not any(a.startswith("hydra.run.dir=") for a in args):
        hydra_args.append(f"hydra.run.dir={DEFAULT_RUN_DIR}")
    if not any(a.startswith("hydra.sweep.dir=") for a in args):
        hydra_args.append(f"hydra.sweep.dir={DEFAULT_SWEEP_DIR}")
    if not any(a.startswith("hydra/job_logging=") for a in args):
        hydra_args.append("hydra/job_logging=none")  # no empty <job>.log in every run directory

    import hydra

    _register_configs(algos)
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(
        name="steersman_train", node={"defaults": [{"algo": algo}, {"env": None}, {"logger": None}, "_self_"]}
    )
    argv0 = sys.argv
    sys.argv = ["steersman-train", *hydra_args]
    try:
        hydra.main(version_base=None, config_path=None, config_name="steersman_train")(_hydra_task)()
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 2
    finally:
        sys.argv = argv0
    return 0


def config_help(algo: str) -> str:
    """The fields of ``algo``'s config: dotted key, default and one-line doc."""
    from .recipes import ALGOS, config_class
    from .recipes.config import field_docs

    cls = config_class(algo)
    lines = [f"steersman train {algo} [key=value ...]   ({ALGOS[algo][1]})", "", "config keys:"]

    def walk(c: type, obj: Any, prefix: str) -> None:
        docs = field_docs(c)
        for name, t in _fields(c).items():
            value = getattr(obj, name)
            if isinstance(t, type) and dataclasses.is_dataclass(t):
                walk(t, value, f"{prefix}{name}.")
            else:
                lines.append(f"  {prefix + name + '=' + repr(value):<42} {docs.get(name, '')}")

    walk(cls, cls(), "")
    lines += ["", f"groups: algo={'|'.join(ALGOS)}  env={'|'.join(ENV_GROUP)}  logger={'|'.join(LOGGER_GROUP)}",
              "sweeps: -m optim.lr=1e-3,3e-4 seed=0,1,2   resolved config: --cfg job"]
    return "\n".join(lines)


# ---------------------------------------------------------------- run-dir commands
def _load_run(run_dir: str, allow_import: bool) -> tuple[str, Any, Any, Any]:
    """``(algo, cfg, recipe module, checkpoint)`` of a run directory, each checked."""
    from .recipes import get_recipe, load_run_config
    from .recipes.checkpoint import latest_checkpoint, load_checkpoint
    from .recipes.run import RunDirError, run_meta

    algo, cfg = load_run_config(run_dir, allow_import=allow_import)
    ckpt_root = Path(run_dir) / "checkpoints"
    if latest_checkpoint(ckpt_root) is None:
        raise RunDirError(f"{run_dir} has no checkpoint yet (nothing under {ckpt_root})")
    ckpt = load_checkpoint(ckpt_root)
    run_meta(ckpt)
    return algo, cfg, get_recipe(algo), ckpt


def _policy_and_env(algo: str, cfg: Any, recipe: Any, ckpt: Any, num_envs: int) -> tuple[Any, Any]:
    import torch

    from .recipes.checkpoint import load_entry
    from .recipes.launch import make_run_env
    from .recipes.run import EVAL_SEED_OFFSET

    if cfg.num_threads > 0:  # small networks: one thread avoids thread-pool overhead
        torch.set_num_threads(cfg.num_threads)
    env = make_run_env(algo, cfg, num_envs, seed=cfg.seed + EVAL_SEED_OFFSET)
    policy = recipe.make_policy(cfg, env)
    load_entry(policy, ckpt, "policy")
    return policy, env


def cmd_eval(args: list[str]) -> int:
    p = _Parser(prog="steersman eval", description="Deterministic evaluation of a run's policy.")
    p.add_argument("run_dir")
    p.add_argument("--episodes", type=int, default=10, help="episodes to run (default 10)")
    p.add_argument("--video", action="store_true", help="also record one episode to <run_dir>/videos/eval.mp4")
    p.add_argument("--video-format", choices=["mp4", "gif"], default="mp4")
    p.add_argument("--allow-import", action="store_true", help=_ALLOW_IMPORT_HELP)
    ns = p.parse_args(args)
    if ns.episodes < 1:
        raise UsageError(f"--episodes must be >= 1, got {ns.episodes}")
    algo, cfg, recipe, ckpt = _load_run(ns.run_dir, ns.allow_import)
    from .recipes.envs import MARL_ALGOS
    from .recipes.evaluation import evaluate

    policy, env = _policy_and_env(algo, cfg, recipe, ckpt, ns.episodes)
    if algo in MARL_ALGOS:  # team returns of the trained group
        from .recipes.marl_common import evaluate_groups

        returns = evaluate_groups(env, policy).float()
    else:
        returns = evaluate(env, policy).float()
    std = float(returns.std()) if returns.numel() > 1 else 0.0
    print(f"{algo} on {cfg.env.name} ({ckpt.meta['frames']} frames, {ckpt.path.name}): "
          f"return {float(returns.mean()):.1f} ± {std:.1f} over {ns.episodes} episodes")
    if ns.video:
        from . import record
        from .recipes.envs import make_render_env
        from .recipes.run import EVAL_SEED_OFFSET

        venv = make_render_env(cfg.env.name, seed=cfg.seed + EVAL_SEED_OFFSET,
                               max_episode_steps=cfg.env.max_episode_steps)
        out = record.RunDir(ns.run_dir).videos_dir / f"eval.{ns.video_format}"
        video = record.record_episode(venv, policy, out)
        print(f"video: {video.path} ({video.steps} steps, return {video.episode_return:.1f})")
    return 0


def cmd_resume(args: list[str]) -> int:
    p = _Parser(prog="steersman resume", description="Continue a run from its latest checkpoint.")
    p.add_argument("run_dir")
    p.add_argument("overrides", nargs="*", help="key=value changes (total_frames, quiet, logger.*, eval.*, checkpoint.*)")
    p.add_argument("--allow-import", action="store_true", help=_ALLOW_IMPORT_HELP)
    ns = p.parse_args(args)
    from .recipes import load_run_config, run_recipe
    from .recipes.run import RunFinished

    algo, _ = load_run_config(ns.run_dir, allow_import=ns.allow_import)
    check_overrides(algo, ns.overrides)
    try:
        result = run_recipe(algo, ns.overrides, ns.run_dir, resume=True, allow_import=ns.allow_import)
    except RunFinished as done:  # nothing to do, nothing written
        print(done)
        return 0
    return _exit_code(result.summary)


def cmd_export(args: list[str]) -> int:
    import torch

    p = _Parser(prog="steersman export", description="Export a run's policy as a standalone file.")
    p.add_argument("run_dir")
    p.add_argument("--format", choices=["torch-export", "onnx"], default="torch-export")
    p.add_argument("--out", default=None, help="output file (default: <run_dir>/export/policy.pt2 or policy.onnx)")
    p.add_argument("--allow-import", action="store_true", help=_ALLOW_IMPORT_HELP)
    ns = p.parse_args(args)
    from . import record
    from .recipes.run import export_filename

    algo, cfg, recipe, ckpt = _load_run(ns.run_dir, ns.allow_import)
    from .recipes.envs import MARL_ALGOS

    policy, env = _policy_and_env(algo, cfg, recipe, ckpt, 8)
    # multi-agent runs: the per-agent policy, (group, observation) [B, n_agents, obs] -> (group, action)
    keys = {"in_key": ("agents", "observation"), "out_key": ("agents", "action")} if algo in MARL_ALGOS else {}
    obs_key = keys.get("in_key", "observation")
    observations = torch.cat([env.reset()[obs_key], env.observation_spec[obs_key].rand()])
    out = Path(ns.out) if ns.out else record.RunDir(ns.run_dir).export_dir / export_filename(ns.format)
    # export_policy runs the file in a fresh process without steersman and compares its actions
    report = record.export_policy(policy, observations, out, format=ns.format, **keys)
    print(report)
    return 0


def cmd_plot(args: list[str]) -> int:
    p = _Parser(prog="steersman plot", description="Overlay learning curves of runs.")
    p.add_argument("run_dirs", nargs="+")
    p.add_argument("--out", default=None, help="PNG path (default: <run_dir>/plots/learning_curve.png for one "
                   "run, where training writes it; else learning_curves.png)")
    ns = p.parse_args(args)
    from . import record
    from .recipes.run import RunDirError

    for d in ns.run_dirs:
        if not (Path(d) / "metrics.csv").is_file() and not any(Path(d).glob("*/metrics.csv")):
            raise RunDirError(f"{d} is not a run directory (no metrics.csv in it or its sub-folders)")
    out = Path(ns.out) if ns.out else (record.RunDir(ns.run_dirs[0]).learning_curve_png if len(ns.run_dirs) == 1
                                       else Path("learning_curves.png"))
    record.plot_learning_curves([Path(d) for d in ns.run_dirs], out)
    print(f"plot: {out}")
    return 0


def cmd_envs(args: list[str]) -> int:
    if args:
        raise UsageError(f"`steersman envs` takes no arguments, got {args}")
    from .recipes.envs import NATIVE_ENVS

    print("built-in torch-native envs (batched, no Python loop per sub-env), for env.name=<id>:")
    for name, cls in sorted(NATIVE_ENVS.items()):
        env = cls(batch_size=[1], seed=0)
        a = env.action_spec
        kind = f"{a.n} discrete actions" if hasattr(a, "n") else f"continuous action {list(a.shape[1:])}"
        obs = env.observation_spec["observation"].shape[1:]
        shortcut = next((k for k, v in ENV_GROUP.items() if v == name), None)
        extra = f"  (shortcut: env={shortcut})" if shortcut else ""
        print(f"  {name:<26} observation {list(obs)}, {kind}, time limit {env.max_episode_steps}{extra}")
    print("\nany Gymnasium id: env.name=gym:<id>, e.g.\n"
          "  steersman train ppo env.name=gym:LunarLander-v3      (needs gymnasium[box2d])\n"
          "  steersman train sac env.name=gym:HalfCheetah-v5      (needs gymnasium[mujoco])\n"
          "Gymnasium envs step as one vector env of env.num_envs copies.")
    return 0


def cmd_doctor(args: list[str]) -> int:
    """Profiles a recipe, a run folder's config or a script for ``--seconds`` (default 10;
    startup and compiling not counted) and prints the phase table and the findings."""
    if args and args[0] in ("-h", "--help"):
        print("usage:\n    steersman doctor [ALGO|RUN_DIR] [key=value ...] [--seconds N] [--allow-import]\n"
              "    steersman doctor SCRIPT.py [--seconds N] [-- script args]\n\n"
              "Runs the recipe (default ppo; a run folder: its saved config) or the script for N seconds\n"
              "and prints where the time goes (env step, policy forward, loss, optimizer, data movement,\n"
              "logging, Python), graph breaks and recompiles, train()/eval() toggles and pin_memory()\n"
              "calls inside the loop and the thread settings, each finding with its fix.")
        return 0
    own, script_args = (args[:args.index("--")], args[args.index("--") + 1:]) if "--" in args else (args, [])
    seconds, allow_import, rest = 10.0, False, []
    it = iter(own)
    for arg in it:
        if arg == "--seconds" or arg.startswith("--seconds="):
            value = arg.split("=", 1)[1] if "=" in arg else next(it, None)
            try:
                seconds = float(value)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                raise UsageError(f"--seconds expects a number of seconds, got {value!r}") from None
            if not seconds > 0:
                raise UsageError(f"--seconds must be > 0, got {value}")
        elif arg == "--allow-import":
            allow_import = True
        else:
            rest.append(arg)
    from . import doctor
    from .recipes import ALGOS

    target = rest[0] if rest and "=" not in rest[0] else None
    if target is not None and target.endswith(".py"):
        if not Path(target).is_file():
            raise UsageError(f"steersman doctor: no script {target!r}")
        report = doctor.profile_script(target, [*rest[1:], *script_args], seconds)
    elif target is not None and (Path(target).is_dir() or os.sep in target or "/" in target):
        from .recipes.launch import load_run_config

        algo, base = load_run_config(target, allow_import=allow_import)
        report = doctor.profile_recipe(algo, rest[1:], seconds, base=base)
    elif target is None or target in ALGOS:
        algo = target or "ppo"
        report = doctor.profile_recipe(algo, rest[1:] if target else rest, seconds)
    else:
        raise UsageError(f"steersman doctor: {target!r} is not an algorithm ({', '.join(sorted(ALGOS))}), "
                         "a run folder or a .py script")
    print(report)
    return 0


COMMANDS = {
    "train": cmd_train,
    "eval": cmd_eval,
    "resume": cmd_resume,
    "export": cmd_export,
    "plot": cmd_plot,
    "envs": cmd_envs,
    "doctor": cmd_doctor,
}


def version() -> str:
    """The installed package's version (the source tree's ``__version__`` when not installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("steersman")
    except PackageNotFoundError:
        from . import __version__

        return __version__


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``steersman`` console script; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print("usage:" + USAGE)
        return 0
    if argv[0] in ("--version", "-V"):
        print(f"steersman {version()}")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"error: unknown command {cmd!r}; valid commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    from .recipes.checkpoint import CheckpointError
    from .recipes.config import ConfigError
    from .recipes.run import RunDirError
    from .tensordict import LoadError

    try:
        return COMMANDS[cmd](rest)
    except (UsageError, RunDirError, CheckpointError, ConfigError, LoadError) as err:
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `steersman ... | head`: the reader left
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
