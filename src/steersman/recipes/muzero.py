"""MuZero (Schrittwieser et al., 2020) with Gumbel MuZero search (Danihelka et al., 2022).

Unlike :mod:`~steersman.recipes.alphazero`, the search does not know the rules: it plans
with a learned model of three networks, each a ``TensorDictModule``:

* ``representation``: ``"observation"`` -> ``"latent"`` (an MLP; latents are min-max
  scaled to ``[0, 1]`` per sample, as in the paper);
* ``dynamics``: ``("latent", "action")`` -> ``("latent", "reward")`` (the action one-hot);
* ``prediction``: ``"latent"`` -> ``("prior_logits", "value")``.

:func:`~steersman.planning.recurrent_fn_from_model` turns dynamics and prediction into the
search's recurrent function. ``env.name`` is ``tictactoe`` (the default; two players: the
search alternates sides with discount -1, rewards and values are for the player to move)
or a single-agent env with discrete actions such as ``CartPole-v1``.

Run it: ``steersman train muzero env=tictactoe`` (or ``env=cartpole``); from Python::

    from steersman.recipes.muzero import MuZeroConfig, train
    summary = train(MuZeroConfig(total_frames=20_000), "runs/muzero")

The loop, top to bottom: ``env.num_envs`` episodes run side by side; each move is chosen
by a batched Gumbel MuZero search on the learned model from the current observation
(``num_simulations``, Gumbel noise at the root; board games: illegal moves masked at the
root; the first ``temperature_moves`` moves of an episode are sampled from the improved
policy). Each episode's positions wait (observation, action, reward, improved policy, root
value) until it ends; then every position enters the replay buffer with its targets for
``unroll_steps`` K steps: the K actions taken from it, the K rewards, and the K + 1 value
and policy targets. Value targets are ``td_steps``-step returns bootstrapped with the
search's root values (board games: with discount -1, so when ``td_steps`` reaches the
end of the game the target is the outcome for the player to move); past the
end of an episode the targets are those of an absorbing state (value and reward 0; the
policy is not trained there; after a time-limit truncation the value is not trained
there). Board games store every position with its board symmetries (``augment``: the
observation, the unrolled actions and the policy targets move with the board). After ``frames_per_batch`` moves: ``updates_per_batch`` gradient steps of the
unrolled loss: the representation, then K dynamics steps (their incoming gradient
halved), each step's cross-entropy to the improved policy, plus squared errors of value
and reward, the K unrolled steps weighted 1/K.

Values and rewards are **scalars** (squared error, not the paper's two-hot categorical
support): board-game values lie in [-1, 1], and single-agent rewards and values are
divided by ``value_scale`` inside the model (0: ``1 / (1 - gamma)``, so values lie in
[0, 1] for positive rewards). The search divides its completed Q-values by the width of
that value range (2 for board games, 1 otherwise), the Gumbel paper's normalisation by
known bounds; mctx's default, min-max rescaling of each node's Q-values
(``rescale_values=True``), stretches the tiny Q differences of an untrained model to the
full range, so self-play follows the model's noise deterministically (on CartPole it
collapsed to one action). The defaults are tic-tac-toe's; a single-agent env takes
:data:`SINGLE_AGENT_DEFAULTS` for the fields you leave unset (``preset=auto``; ``preset=none``
keeps the tic-tac-toe values): ``env.num_envs=16 env.max_episode_steps=500
frames_per_batch=256 gamma=0.97 td_steps=50 num_simulations=8 eval_simulations=0``. With
them ``env=cartpole`` reaches mean eval returns of 262 and 294 (seeds 0, 1) in 8,192 frames
(53-63 s CPU; benchmarks/README.md).

Evaluation (``eval.episodes`` per side / episodes): board games play against a uniformly
random player and the exact solver from both seats, ``eval/return`` is the mean score
against the random player (+1 win, 0 draw, -1 loss); single-agent envs report the mean
undiscounted episode return. Evaluation searches with ``eval_simulations`` and no noise (0:
the prediction network's greedy policy, no search). Frames count moves.

The exported file (``export_format``) is the representation and prediction networks'
greedy policy *without* search (board games: occupied cells masked).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from steersman.data import Categorical, LazyTensorStorage, OneHot, TensorDictReplayBuffer
from steersman.envs import EnvBase
from steersman.envs.native._board import BoardGameEnv
from steersman.planning import (
    RootFnOutput,
    gumbel_muzero_policy,
    qtransform_completed_by_mix_value,
    recurrent_fn_from_model,
)
from steersman.tensordict import TensorDict, TensorDictBase
from steersman.tensordict.nn import TensorDictModule

from .checkpoint import seed_everything
from .config import (
    CheckpointConfig,
    ConfigError,
    EnvConfig,
    EvalConfig,
    LoggerConfig,
    apply_env_defaults,
    validate_config,
)
from .envs import BOARD_GAMES, make_env
from .run import EVAL_SEED_OFFSET, Run

__all__ = ["MuZeroConfig", "MuZeroNets", "MuZeroPolicy", "SelfPlay", "make_nets", "make_policy", "search",
           "symmetries", "train", "unrolled_loss"]


@dataclass
class MuZeroConfig:
    """Configuration of the MuZero recipe (defaults: tic-tac-toe, about a minute on a CPU)."""

    env: EnvConfig = field(default_factory=lambda: EnvConfig(name="tictactoe", num_envs=256))
    """The env (tictactoe, connect4, or a single-agent env with discrete actions) and the episodes run side by side."""
    total_frames: int = 16_384
    """Moves (summed over episodes) to train for."""
    frames_per_batch: int = 1_024
    """Moves played between two rounds of updates (a multiple of env.num_envs)."""
    updates_per_batch: int = 32
    """Gradient steps after each batch of moves."""
    batch_size: int = 256
    """Positions per gradient step."""
    buffer_size: int = 50_000
    """Positions kept in the replay buffer (the newest), each with its unrolled targets."""
    learning_starts: int = 256
    """Positions in the buffer before the first update."""
    unroll_steps: int = 5
    """K: steps the dynamics network is unrolled in the loss."""
    td_steps: int = 10
    """n of the n-step value target (board games: sign-alternating; >= the number of cells: the final outcome)."""
    gamma: float = 0.997
    """Single-agent envs: discount factor (board games alternate sides: discount -1)."""
    value_scale: float = 0.0
    """Single-agent envs: rewards and values are divided by this in the model (0: 1 / (1 - gamma))."""
    num_simulations: int = 16
    """Search simulations per move in self-play."""
    max_num_considered_actions: int = 16
    """Actions sampled at the root (Gumbel top-k) and halved by Sequential Halving."""
    gumbel_scale: float = 1.0
    """Scale of the root Gumbel noise in self-play (exploration); evaluation uses 0."""
    rescale_values: bool = False
    """Search: min-max rescale each node's Q-values (mctx's default), not divide them by the value range."""
    temperature_moves: int = 4
    """Self-play samples the first N moves of each episode from the improved policy (exploration)."""
    augment: bool = True
    """Board games: store every position with its board symmetries (tic-tac-toe: 8, connect four: 2)."""
    eval_simulations: int = 16
    """Search simulations per move in evaluation (0: the prediction network's greedy policy)."""
    latent_size: int = 64
    """Size of the latent state."""
    hidden_sizes: list[int] = field(default_factory=lambda: [128])
    """Hidden layer widths of each of the three networks."""
    lr: float = 2e-3
    """Adam learning rate."""
    weight_decay: float = 1e-4
    """Adam (L2) weight decay."""
    max_grad_norm: float = 5.0
    """Gradient norm clipping."""
    value_coef: float = 0.5
    """Weight of the value loss."""
    reward_coef: float = 1.0
    """Weight of the reward loss."""
    preset: str = "auto"
    """Env-specific defaults: auto (SINGLE_AGENT_DEFAULTS for envs that are not board games), single_agent (always) or none."""
    seed: int = 0
    """Seed of torch, numpy, random, the envs and the evaluation opponents."""
    num_threads: int = 1
    """torch CPU threads (1 is fastest for small networks; 0: torch's default)."""
    quiet: bool = False
    """No progress bar (CI, logs); the summary is still printed."""
    export_format: str = "torch-export"
    """File written at the end (the greedy policy of the networks, no search): torch-export, onnx or none."""
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    """Metrics loggers."""
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(interval=4_096, episodes=16))
    """Evaluation schedule; episodes: games per seat against each opponent, or episodes."""
    checkpoint: CheckpointConfig = field(default_factory=lambda: CheckpointConfig(interval=8_192))
    """Checkpoint schedule (the replay buffer is included unless checkpoint.replay_buffer=false)."""


SINGLE_AGENT_DEFAULTS: dict[str, Any] = {
    "env.num_envs": 16, "env.max_episode_steps": 500, "frames_per_batch": 256, "gamma": 0.97, "td_steps": 50,
    "num_simulations": 8, "eval_simulations": 0,
}
"""MuZero on a single-agent env such as CartPole (measured: benchmarks/README.md): dotted keys."""


def resolve_preset(cfg: MuZeroConfig) -> MuZeroConfig:
    """``cfg`` with :data:`SINGLE_AGENT_DEFAULTS` on the fields still at their default when
    ``cfg.preset`` is single_agent, or auto with an env that is not a board game; the result
    has ``preset="none"`` (its ``config.yaml`` then holds the values a resume reuses).

    Example:
        >>> cfg = MuZeroConfig(td_steps=20)
        >>> cfg.env.name = "CartPole-v1"
        >>> cfg = resolve_preset(cfg)
        >>> cfg.env.num_envs, cfg.td_steps, cfg.gamma, cfg.preset
        (16, 20, 0.97, 'none')
        >>> resolve_preset(MuZeroConfig()).env.num_envs  # tic-tac-toe keeps its own
        256
    """
    if cfg.preset not in ("auto", "single_agent", "none"):
        raise ConfigError(f"preset must be auto, single_agent or none, got {cfg.preset!r}")
    if cfg.preset == "single_agent" or (cfg.preset == "auto" and cfg.env.name not in BOARD_GAMES):
        return dataclasses.replace(apply_env_defaults(cfg, SINGLE_AGENT_DEFAULTS), preset="none")
    return cfg


def _check(cfg: MuZeroConfig) -> None:
    validate_config(cfg)
    for key in ("num_simulations", "max_num_considered_actions", "updates_per_batch", "unroll_steps", "td_steps",
                "latent_size"):
        value = getattr(cfg, key)
        if value < 1:
            raise ConfigError(f"{key} must be an integer >= 1, got {value!r}")
    for key in ("eval_simulations", "temperature_moves"):
        if getattr(cfg, key) < 0:
            raise ConfigError(f"{key} must be an integer >= 0, got {getattr(cfg, key)!r}")
    if not 0.0 <= cfg.gamma <= 1.0:
        raise ConfigError(f"gamma must be in [0, 1], got {cfg.gamma!r}")
    if cfg.value_scale < 0:
        raise ConfigError(f"value_scale must be >= 0 (0: 1 / (1 - gamma)), got {cfg.value_scale!r}")


# ---------------------------------------------------------------- networks
def _mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _scale_latent(latent: torch.Tensor) -> torch.Tensor:
    """Min-max scaling of each latent to [0, 1] (MuZero's hidden-state normalisation)."""
    lo, hi = latent.amin(-1, keepdim=True), latent.amax(-1, keepdim=True)
    return (latent - lo) / (hi - lo).clamp_min(1e-5)


class Representation(nn.Module):
    """Observation ``[B, *obs]`` -> latent ``[B, latent_size]``."""

    def __init__(self, obs_size: int, latent_size: int, hidden_sizes: list[int]) -> None:
        super().__init__()
        self.net = _mlp([obs_size, *hidden_sizes, latent_size])

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return _scale_latent(self.net(observation.flatten(1)))


class Dynamics(nn.Module):
    """(latent ``[B, L]``, one-hot action ``[B, A]``) -> (next latent ``[B, L]``, reward ``[B]``)."""

    def __init__(self, latent_size: int, num_actions: int, hidden_sizes: list[int]) -> None:
        super().__init__()
        self.torso = _mlp([latent_size + num_actions, *hidden_sizes, hidden_sizes[-1] if hidden_sizes else 64])
        width = hidden_sizes[-1] if hidden_sizes else 64
        self.latent_head = nn.Linear(width, latent_size)
        self.reward_head = nn.Linear(width, 1)

    def forward(self, latent: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.relu(self.torso(torch.cat([latent, action], -1)))
        return _scale_latent(self.latent_head(x)), self.reward_head(x).squeeze(-1)


class Prediction(nn.Module):
    """Latent ``[B, L]`` -> (prior logits ``[B, A]``, value ``[B]``)."""

    def __init__(self, latent_size: int, num_actions: int, hidden_sizes: list[int]) -> None:
        super().__init__()
        self.torso = _mlp([latent_size, *hidden_sizes]) if hidden_sizes else nn.Identity()
        width = hidden_sizes[-1] if hidden_sizes else latent_size
        self.policy_head = nn.Linear(width, num_actions)
        self.value_head = nn.Linear(width, 1)

    def forward(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.relu(self.torso(latent)) if not isinstance(self.torso, nn.Identity) else latent
        return self.policy_head(x), self.value_head(x).squeeze(-1)


class MuZeroNets(nn.Module):
    """The three networks of the learned model, each a ``TensorDictModule``."""

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int, latent_size: int,
                 hidden_sizes: list[int]) -> None:
        super().__init__()
        self.num_actions = num_actions
        self.representation = TensorDictModule(Representation(math.prod(obs_shape), latent_size, hidden_sizes),
                                               in_keys=["observation"], out_keys=["latent"])
        self.dynamics = TensorDictModule(Dynamics(latent_size, num_actions, hidden_sizes),
                                         in_keys=["latent", "action"], out_keys=["latent", "reward"])
        self.prediction = TensorDictModule(Prediction(latent_size, num_actions, hidden_sizes),
                                           in_keys=["latent"], out_keys=["prior_logits", "value"])


class MuZeroPolicy(nn.Module):
    """The networks' greedy move without search: ``observation [B, *obs] -> action [B]``
    (board games: a cell is legal when neither plane holds a piece; connect four: a
    column whose top cell is free). ``self.nets`` is the learned model the search uses."""

    def __init__(self, nets: MuZeroNets, board: str | None) -> None:
        super().__init__()
        self.nets = nets
        self.board = board

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        logits, _ = self.nets.prediction.module(self.nets.representation.module(observation))
        if self.board is not None:
            free = observation.sum(-3) == 0  # [B, rows, cols]
            legal = free[..., -1, :] if self.board == "connect4" else free.flatten(-2)
            logits = torch.where(legal, logits, torch.finfo(logits.dtype).min)
        return logits.argmax(-1)


def _num_actions(env: EnvBase) -> int:
    spec = env.action_spec
    if not isinstance(spec, (Categorical, OneHot)):
        raise ConfigError(f"muzero needs discrete actions; {type(env).__name__} has a "
                          f"{type(spec).__name__} action spec")
    return int(spec.n)


def make_nets(cfg: MuZeroConfig, env: EnvBase) -> MuZeroNets:
    """The representation, dynamics and prediction networks for ``env``."""
    obs_shape = tuple(env.observation_spec["observation"].shape[len(env.batch_size):])
    return MuZeroNets(obs_shape, _num_actions(env), cfg.latent_size, cfg.hidden_sizes)


def make_policy(cfg: MuZeroConfig, env: EnvBase) -> TensorDictModule:
    """The networks wrapped as the greedy policy ``"observation"`` -> ``"action"``
    (``policy.module.nets`` is the learned model the search uses)."""
    board = cfg.env.name if cfg.env.name in BOARD_GAMES else None
    return TensorDictModule(MuZeroPolicy(make_nets(cfg, env), board), in_keys=["observation"], out_keys=["action"])


# ---------------------------------------------------------------- search with the learned model
def search(nets: MuZeroNets, observation: torch.Tensor, action_mask: torch.Tensor | None, num_simulations: int,
           max_num_considered_actions: int, gumbel_scale: float, discount: float,
           rng: torch.Generator | None = None, value_range: float | None = None
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(action [B], improved policy [B, A], root value [B])`` of a Gumbel MuZero search
    on the learned model from ``observation`` ``[B, *obs]``; ``action_mask`` ``[B, A]``
    (None: every action legal) rules out moves at the root only. ``discount`` is -1 for
    two-player games (values are for the player to move). ``value_range``: the completed
    Q-values are divided by it (the Gumbel paper's normalisation by known value bounds);
    ``None``: min-max rescaled per node (mctx's default, which turns the tiny Q differences
    of an untrained model into a near-deterministic choice)."""
    qtransform = qtransform_completed_by_mix_value if value_range is None else functools.partial(
        qtransform_completed_by_mix_value, rescale_values=False, value_scale=0.1 / value_range)
    batch = observation.shape[0]
    with torch.no_grad():
        root_td = nets.prediction(nets.representation(TensorDict({"observation": observation}, [batch])))
        root = RootFnOutput(root_td["prior_logits"], root_td["value"],
                            TensorDict({"latent": root_td["latent"]}, [batch]))
        recurrent_fn = recurrent_fn_from_model(nets.dynamics, nets.prediction, latent_keys=["latent"],
                                               discount=discount, num_actions=nets.num_actions)
        invalid = None
        if action_mask is not None:
            invalid = ~action_mask & action_mask.any(-1, keepdim=True)  # a finished board: any move
        out = gumbel_muzero_policy(None, rng, root, recurrent_fn, num_simulations, invalid_actions=invalid,
                                   max_num_considered_actions=max_num_considered_actions, gumbel_scale=gumbel_scale,
                                   qtransform=qtransform)
    return out.action, out.action_weights, out.search_tree.summary().value


# ---------------------------------------------------------------- self-play and targets
class SelfPlay:
    """``E`` episodes run side by side. Each step stores (observation, action, reward,
    improved policy, root value) of every episode; :meth:`step` returns the positions of
    the episodes that just ended with their unrolled targets (see :meth:`targets`) and
    the episodes' returns, and starts new episodes there. ``gamma`` is the discount of
    the value targets (-1 for two-player games: ``z_t = sum_i (-1)^i r_(t+i)``, the
    outcome for the player to move), ``td_steps`` the bootstrap horizon.
    ``state_dict`` holds the envs' state and the waiting episodes."""

    def __init__(self, env: EnvBase, max_length: int, unroll_steps: int, td_steps: int, gamma: float) -> None:
        self.env, self.unroll_steps, self.td_steps, self.gamma = env, unroll_steps, td_steps, gamma
        e = env.batch_size[0]
        self.num_actions = _num_actions(env)
        self.td = env.reset()
        self.obs = torch.zeros(e, max_length, *self.td["observation"].shape[1:])
        self.action = torch.zeros(e, max_length, dtype=torch.int64)
        self.reward = torch.zeros(e, max_length)
        self.policy = torch.zeros(e, max_length, self.num_actions)
        self.value = torch.zeros(e, max_length)
        self.length = torch.zeros(e, dtype=torch.int64)

    def action_mask(self) -> torch.Tensor | None:
        return self.td.get("action_mask", None)

    def _keys(self) -> tuple[str, ...]:
        return ("obs", "action", "reward", "policy", "value", "length")

    def state_dict(self) -> dict[str, Any]:
        env = self.env
        state: dict[str, Any] = {k: getattr(self, k).clone() for k in self._keys()}
        state["env"] = env.get_state()
        if hasattr(env, "rng_state"):
            state["env_rng"] = env.rng_state
        state["td"] = self.td.clone()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in (*self._keys(), "env", "td"):
            if key not in state:
                raise KeyError(f"muzero self-play state: missing entry {key!r}")
        for key in self._keys():
            mine = getattr(self, key)
            if state[key].shape != mine.shape:
                raise ValueError(f"muzero self-play entry {key!r}: expected shape {list(mine.shape)}, got "
                                 f"{list(state[key].shape)}")
        for key in self._keys():
            getattr(self, key).copy_(state[key])
        self.env.set_state(state["env"])
        if "env_rng" in state:
            self.env.set_rng_state(state["env_rng"])
        self.td = state["td"].clone()

    def step(self, action: torch.Tensor, policy: torch.Tensor, root_value: torch.Tensor
             ) -> tuple[TensorDictBase, torch.Tensor]:
        """Plays ``action`` ``[E]`` everywhere; returns (the finished episodes' positions
        with targets, their undiscounted returns ``[F]``)."""
        rows = torch.arange(self.env.batch_size[0])
        self.obs[rows, self.length] = self.td["observation"]
        self.action[rows, self.length] = action
        self.policy[rows, self.length] = policy
        self.value[rows, self.length] = root_value
        td, self.td = self.env.step_and_maybe_reset(self.td.set("action", action))
        nxt = td["next"]
        self.reward[rows, self.length] = nxt["reward"].reshape(-1)
        self.length += 1
        done = nxt["done"].reshape(-1)
        if not bool(done.any()):
            return TensorDict({}, batch_size=[0]), torch.zeros(0)
        ended = done.nonzero().squeeze(-1)
        terminated = nxt["terminated"].reshape(-1)[ended]
        positions = self.targets(ended, terminated)
        returns = (self.reward[ended] * (torch.arange(self.reward.shape[1]) < self.length[ended, None])).sum(-1)
        self.length[ended] = 0
        return positions, returns

    def targets(self, ended: torch.Tensor, terminated: torch.Tensor) -> TensorDictBase:
        """The positions ``[N]`` of the episodes ``ended`` with ``"observation"`` and, over
        the K unrolled steps, ``"actions" [N, K]``, ``"target_reward" [N, K]`` (+ mask),
        ``"target_value" [N, K+1]`` (+ mask), ``"target_policy" [N, K+1, A]`` (+ mask)."""
        k_steps, n_steps, gamma = self.unroll_steps, self.td_steps, self.gamma
        length, max_len = self.length[ended], self.obs.shape[1]
        reward, value = self.reward[ended], self.value[ended]
        t = torch.arange(max_len)
        inside = t < length[:, None]  # [F, T]
        reward = reward * inside
        # n-step value targets z_t of every position of each ended episode
        z = torch.zeros_like(reward)
        for i in range(n_steps):
            ti = t + i
            z = z + gamma ** i * torch.where(ti < length[:, None], reward.gather(1, ti.clamp_max(max_len - 1)
                                                                                  .expand_as(reward)), 0.0)
        tn = t + n_steps
        boot = torch.where(tn < length[:, None], value.gather(1, tn.clamp_max(max_len - 1).expand_as(value)),
                           torch.where(terminated[:, None], 0.0, value.gather(1, (length - 1)[:, None])))
        remaining = (length[:, None] - t).clamp(0, n_steps)
        z = z + torch.pow(torch.tensor(gamma), remaining.float()) * boot
        # gather the unrolled targets of each stored position (episode f, step t < length)
        f, t0 = inside.nonzero(as_tuple=True)
        pos = t0[:, None] + torch.arange(k_steps + 1)  # [N, K+1]
        in_ep = pos < length[f, None]
        absorbing = terminated[f, None] & ~in_ep
        posc = pos.clamp_max(max_len - 1)
        uniform = torch.full((self.num_actions,), 1.0 / self.num_actions)
        e = ended[f]
        actions = torch.where(in_ep[:, :-1], self.action[e[:, None], posc[:, :-1]],
                              torch.randint(0, self.num_actions, (len(f), k_steps)))
        return TensorDict({
            "observation": self.obs[e, t0],
            "actions": actions,
            "target_reward": torch.where(in_ep[:, :-1], reward[f[:, None], posc[:, :-1]], 0.0),
            "mask_reward": (in_ep | absorbing)[:, :-1].float(),
            "target_value": torch.where(in_ep, z[f[:, None], posc], 0.0),
            "mask_value": (in_ep | absorbing).float(),
            "target_policy": torch.where(in_ep[..., None], self.policy[e[:, None], posc], uniform),
            "mask_policy": in_ep.float(),
        }, batch_size=[len(f)])


def symmetries(positions: TensorDictBase, connect_four: bool) -> TensorDictBase:
    """``positions`` as made by :meth:`SelfPlay.targets` (board games) with their mirror
    images: the 8 rotations/reflections of a tic-tac-toe board, the left-right mirror of a
    connect-four board. The observation, the unrolled ``"actions"`` and the policy targets
    move with the board; values, rewards and masks are unchanged. ``[N]`` -> ``[8N]`` /
    ``[2N]`` (the identity first)."""
    obs, actions, policy = positions["observation"], positions["actions"], positions["target_policy"]
    rows, cols = obs.shape[-2:]
    if connect_four:
        cells = [torch.arange(cols), torch.arange(cols).flip(0)]
        boards = [obs, obs.flip(-1)]
    else:
        grid = torch.arange(rows * cols).view(rows, cols)
        cells, boards = [], []
        for flip in (False, True):
            g, o = (grid.flip(-1), obs.flip(-1)) if flip else (grid, obs)
            for k in range(4):
                cells.append(torch.rot90(g, k, (-2, -1)).flatten())
                boards.append(torch.rot90(o, k, (-2, -1)))
    parts = []
    for source, board in zip(cells, boards, strict=True):
        # source[j] = the cell of the original board that lands on cell j
        target = torch.empty_like(source)
        target[source] = torch.arange(source.numel())
        part = positions.clone()
        part["observation"] = board
        part["actions"] = target[actions]
        part["target_policy"] = policy[..., source]
        parts.append(part)
    return torch.cat(parts)


# ---------------------------------------------------------------- the unrolled loss
def _scale_gradient(x: torch.Tensor, scale: float) -> torch.Tensor:
    return x * scale + x.detach() * (1 - scale)


def unrolled_loss(nets: MuZeroNets, batch: TensorDictBase, value_coef: float, reward_coef: float
                  ) -> dict[str, torch.Tensor]:
    """MuZero's loss over ``K = batch["actions"].shape[-1]`` unrolled steps (targets as
    made by :meth:`SelfPlay.targets`, rewards and values already in the model's scale):
    policy cross-entropy, value and reward squared errors; the K unrolled steps are
    weighted 1/K and the gradient entering each dynamics step is halved."""
    n, k_steps = batch["actions"].shape
    td = nets.prediction(nets.representation(TensorDict({"observation": batch["observation"]}, [n])))
    policy_losses, value_losses, reward_losses = [], [], []

    def heads(td: TensorDictBase, k: int) -> None:
        logp = torch.log_softmax(td["prior_logits"], -1)
        policy_losses.append(-(batch["target_policy"][:, k] * logp).sum(-1) * batch["mask_policy"][:, k])
        value_losses.append((td["value"] - batch["target_value"][:, k]).pow(2) * batch["mask_value"][:, k])

    heads(td, 0)
    latent = td["latent"]
    for k in range(k_steps):
        action = torch.nn.functional.one_hot(batch["actions"][:, k], nets.num_actions).to(latent.dtype)
        step = nets.dynamics(TensorDict({"latent": _scale_gradient(latent, 0.5), "action": action}, [n]))
        reward_losses.append((step["reward"] - batch["target_reward"][:, k]).pow(2) * batch["mask_reward"][:, k])
        td = nets.prediction(TensorDict({"latent": step["latent"]}, [n]))
        heads(td, k + 1)
        latent = step["latent"]
    weights = torch.tensor([1.0] + [1.0 / k_steps] * k_steps)
    policy = (torch.stack(policy_losses, -1) * weights).sum(-1).mean()
    value = (torch.stack(value_losses, -1) * weights).sum(-1).mean()
    reward = (torch.stack(reward_losses, -1) / k_steps).sum(-1).mean()
    return {"loss": policy + value_coef * value + reward_coef * reward, "policy_loss": policy,
            "value_loss": value, "reward_loss": reward}


def _value_range(cfg: MuZeroConfig) -> float | None:
    """The search's Q normalisation: None (min-max per node) or the width of the value
    range in model units (board games [-1, 1]; single-agent values / value_scale <= 1)."""
    if cfg.rescale_values:
        return None
    return 2.0 if cfg.env.name in BOARD_GAMES else 1.0


# ---------------------------------------------------------------- evaluation
def _board_evaluation(cfg: MuZeroConfig, nets: MuZeroNets, seed: int) -> dict[str, float]:
    from steersman.planning import AlphaBetaPlayer, MinimaxPlayer

    from .alphazero import _random_player, make_game, play_games

    env = make_game(cfg.env.name, 2 * cfg.eval.episodes)
    rng = torch.Generator().manual_seed(seed)
    greedy = MuZeroPolicy(nets, cfg.env.name)

    def agent(env: BoardGameEnv, td: TensorDictBase) -> torch.Tensor:
        if cfg.eval_simulations == 0:
            with torch.no_grad():
                return greedy(td["observation"])
        return search(nets, td["observation"], td["action_mask"], cfg.eval_simulations,
                      cfg.max_num_considered_actions, 0.0, -1.0, rng, _value_range(cfg))[0]

    solver_rng = torch.Generator().manual_seed(seed + 2)
    opponents = {"random": _random_player(torch.Generator().manual_seed(seed + 1)),
                 "solver": MinimaxPlayer(solver_rng) if cfg.env.name == "tictactoe" else AlphaBetaPlayer(3, solver_rng)}
    metrics = {}
    for name, opponent in opponents.items():
        outcome = play_games(env, agent, opponent)
        for what, v in (("win", 1.0), ("draw", 0.0), ("loss", -1.0)):
            metrics[f"eval/{name}_{what}"] = float((outcome == v).float().mean())
        metrics[f"eval/{name}_score"] = float(outcome.mean())
    return metrics


def _episode_returns(cfg: MuZeroConfig, nets: MuZeroNets, discount: float, seed: int) -> torch.Tensor:
    env = make_env(cfg.env.name, cfg.eval.episodes, seed=seed, max_episode_steps=cfg.env.max_episode_steps)
    rng = torch.Generator().manual_seed(seed)
    greedy = MuZeroPolicy(nets, None)
    td = env.reset()
    returns, alive = torch.zeros(cfg.eval.episodes), torch.ones(cfg.eval.episodes, dtype=torch.bool)
    while bool(alive.any()):
        if cfg.eval_simulations == 0:
            with torch.no_grad():
                action = greedy(td["observation"])
        else:
            action = search(nets, td["observation"], None, cfg.eval_simulations, cfg.max_num_considered_actions,
                            0.0, discount, rng, _value_range(cfg))[0]
        step, td = env.step_and_maybe_reset(td.set("action", action))
        returns += step["next", "reward"].reshape(-1) * alive
        alive &= ~step["next", "done"].reshape(-1)
    return returns


def _log_evaluation(run: Run, cfg: MuZeroConfig, nets: MuZeroNets, discount: float, frames: int) -> None:
    seed = cfg.seed + EVAL_SEED_OFFSET + frames
    if cfg.env.name in BOARD_GAMES:
        metrics = _board_evaluation(cfg, nets, seed)
        run.logger.log_metrics(metrics, step=frames)
        run.log_eval(frames, torch.tensor([metrics["eval/random_score"]] * (2 * cfg.eval.episodes)))
    else:
        run.log_eval(frames, _episode_returns(cfg, nets, discount, seed))


# ---------------------------------------------------------------- training
def train(cfg: MuZeroConfig | None = None, run_dir: str | Path | None = None, *,
          resume: bool = False) -> dict[str, Any]:
    """Trains MuZero as configured, writing ``run_dir``; returns the run's summary."""
    cfg = resolve_preset(cfg if cfg is not None else MuZeroConfig())
    _check(cfg)
    seed_everything(cfg.seed)
    if cfg.num_threads > 0:
        torch.set_num_threads(cfg.num_threads)
    board = cfg.env.name in BOARD_GAMES
    env = make_env(cfg.env.name, cfg.env.num_envs, seed=cfg.seed, max_episode_steps=cfg.env.max_episode_steps)
    if board:  # two players: the value flips sign each move (td_steps >= the board's cells: the final outcome)
        discount, scale, max_length = -1.0, 1.0, env.rows * env.cols
        td_steps = min(cfg.td_steps, max_length)
    else:
        max_length = getattr(env, "max_episode_steps", None)
        if not isinstance(max_length, int):
            raise ConfigError(f"muzero: env.name={cfg.env.name} needs a time limit (set env.max_episode_steps)")
        discount, td_steps = cfg.gamma, cfg.td_steps
        scale = cfg.value_scale or 1.0 / max(1.0 - cfg.gamma, 1e-6)
    policy = make_policy(cfg, env)
    nets = policy.module.nets
    optimizer = torch.optim.Adam(nets.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(cfg.buffer_size), batch_size=cfg.batch_size)
    run = Run("muzero", cfg, run_dir, resume=resume, frames_per_batch=cfg.frames_per_batch)
    selfplay = SelfPlay(env, max_length, cfg.unroll_steps, td_steps, discount)
    run.track(policy=policy, optim=optimizer, selfplay=selfplay, buffer=buffer)

    frames = run.frames
    moves_per_batch = cfg.frames_per_batch // cfg.env.num_envs
    while frames < run.total_frames:
        finished_returns = []
        for _ in range(moves_per_batch):
            obs = selfplay.td["observation"]
            action, improved, root_value = search(nets, obs, selfplay.action_mask(), cfg.num_simulations,
                                                  cfg.max_num_considered_actions, cfg.gumbel_scale, discount,
                                                  value_range=_value_range(cfg))
            if cfg.temperature_moves:  # the episodes' first moves: sampled from the improved policy
                sampled = torch.multinomial(improved, 1).squeeze(-1)
                action = torch.where(selfplay.length < cfg.temperature_moves, sampled, action)
            positions, returns = selfplay.step(action, improved, root_value)
            if positions.numel():
                if not board:  # the model works in units of `scale`
                    for key in ("target_reward", "target_value"):
                        positions[key] = positions[key] / scale
                elif cfg.augment:
                    positions = symmetries(positions, cfg.env.name == "connect4")
                buffer.extend(positions)
            finished_returns.append(returns)
        frames += cfg.frames_per_batch

        losses: dict[str, torch.Tensor] = {}
        if len(buffer) >= max(cfg.learning_starts, cfg.batch_size):
            for _ in range(cfg.updates_per_batch):
                losses = unrolled_loss(nets, buffer.sample(), cfg.value_coef, cfg.reward_coef)
                optimizer.zero_grad(set_to_none=True)
                losses["loss"].backward()
                nn.utils.clip_grad_norm_(nets.parameters(), cfg.max_grad_norm)
                optimizer.step()
        metrics = {f"train/{k}": (losses[k].detach() if k in losses else torch.tensor(math.nan))
                   for k in ("policy_loss", "value_loss", "reward_loss")}
        metrics["train/buffer_size"] = float(len(buffer))
        ended = torch.cat(finished_returns)
        if ended.numel() and not board:  # board games: a self-play game's return is the winner's +1
            metrics["train/return"] = ended.mean()
        run.log(frames, metrics)
        if run.eval_due(frames):
            _log_evaluation(run, cfg, nets, discount, frames)
        if run.checkpoint_due(frames):
            run.save()
        if run.stop_requested:
            break
    if not run.stop_requested and (not run.evals or run.evals[-1][0] != run.frames):
        _log_evaluation(run, cfg, nets, discount, run.frames)  # the final evaluation (wrap_up then skips its own)
    return run.wrap_up(policy, make_env(cfg.env.name, 2, seed=cfg.seed))


if __name__ == "__main__":  # pragma: no cover
    train()
