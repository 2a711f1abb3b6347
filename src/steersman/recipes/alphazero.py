"""AlphaZero with Gumbel MuZero search (Silver et al., 2018; Danihelka et al., 2022) on board games.

The game itself is the model: the search steps the env's pure transition
(:func:`~steersman.planning.recurrent_fn_from_env`), and a small policy/value network
gives the priors and the leaf values. ``env.name`` is ``tictactoe`` (the default) or
``connect4``.

Run it: ``python -m steersman.recipes.alphazero`` (``steersman train alphazero`` once
the CLI knows the board-game ids); from Python::

    from steersman.recipes.alphazero import AlphaZeroConfig, train
    summary = train(AlphaZeroConfig(total_frames=20_000), "runs/alphazero")

The loop, top to bottom: ``env.num_envs`` games are played side by side; each move is
chosen by a batched Gumbel MuZero search (``num_simulations`` simulations, Gumbel noise
at the root); each position waits with its improved policy (the search's
``action_weights``) until its game ends, then enters the replay buffer with the game's
outcome for the player who was to move (optionally mixed with the search's root value,
``value_mix``; exploration: ``random_opening_moves`` unstored random moves opening each
game, the first ``temperature_moves`` plies sampled from the improved policy). After ``frames_per_batch`` moves (summed over
games): ``updates_per_batch`` gradient steps of cross-entropy to the improved policy
plus the squared error of the value. Evaluation plays ``eval.episodes`` games from each
side against a uniformly random player and against the exact solver (minimax for
tic-tac-toe, a depth-limited search for connect four), the agent searching without
noise; ``eval/return`` is the mean score against the solver (+1 win, 0 draw, -1 loss)
and the win/draw/loss rates are logged too. Frames count moves.

The exported file (``export_format``) is the network's greedy policy *without* search
(observation ``[B, 2, rows, cols]`` -> move ``[B]``, illegal moves masked): search needs
the game's rules, which a standalone file does not carry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from steersman.data import LazyTensorStorage, TensorDictReplayBuffer
from steersman.envs import ConnectFourEnv, TicTacToeEnv
from steersman.envs.native._board import BoardGameEnv
from steersman.planning import (
    AlphaBetaPlayer,
    MinimaxPlayer,
    gumbel_muzero_policy,
    recurrent_fn_from_env,
    root_from_env,
)
from steersman.planning.adapters import board_observation
from steersman.planning.solvers import games_against_minimax
from steersman.tensordict import TensorDict, TensorDictBase
from steersman.tensordict.nn import TensorDictModule

from .checkpoint import seed_everything
from .config import (
    CheckpointConfig,
    ConfigError,
    EnvConfig,
    EvalConfig,
    LoggerConfig,
    validate_config,
)
from .run import EVAL_SEED_OFFSET, Run

__all__ = ["GAMES", "AlphaZeroConfig", "GreedyPolicy", "PolicyValueNet", "SelfPlay", "make_game", "make_policy",
           "play_games", "search_actions", "symmetries", "train"]

#: ``env.name`` -> the batched board game. (Kept here: the shared env ids of the other
#: recipes are single-agent; these are two-player games with their own evaluation.)
GAMES: dict[str, type[BoardGameEnv]] = {"tictactoe": TicTacToeEnv, "connect4": ConnectFourEnv}


@dataclass
class AlphaZeroConfig:
    """Configuration of the AlphaZero recipe (defaults: tic-tac-toe; never loses to minimax within 16k moves)."""

    env: EnvConfig = field(default_factory=lambda: EnvConfig(name="tictactoe", num_envs=512))
    """The game (tictactoe or connect4) and how many self-play games run side by side."""
    total_frames: int = 16_384
    """Self-play moves (summed over games) to train for."""
    frames_per_batch: int = 2_048
    """Moves played between two rounds of updates (a multiple of env.num_envs)."""
    updates_per_batch: int = 128
    """Gradient steps after each batch of moves."""
    batch_size: int = 256
    """Positions per gradient step."""
    buffer_size: int = 20_000
    """Positions kept in the replay buffer (the newest)."""
    augment: bool = True
    """Store every position with its board symmetries (tic-tac-toe: 8, connect four: 2)."""
    learning_starts: int = 256
    """Positions in the buffer before the first update."""
    num_simulations: int = 32
    """Search simulations per move in self-play."""
    max_num_considered_actions: int = 16
    """Actions sampled at the root (Gumbel top-k) and halved by Sequential Halving."""
    gumbel_scale: float = 1.0
    """Scale of the root Gumbel noise in self-play (exploration); evaluation uses 0."""
    random_opening_moves: int = 2
    """Self-play games open with 0..N uniform random legal moves, not stored (exploration)."""
    temperature_moves: int = 4
    """Self-play samples its first N moves from the improved policy instead of the search's choice."""
    value_mix: float = 0.5
    """Value target: (1 - value_mix) * game outcome + value_mix * the search's root value."""
    hidden_sizes: list[int] = field(default_factory=lambda: [128, 128])
    """Hidden layer widths of the shared torso of the policy/value network."""
    lr: float = 2e-3
    """Adam learning rate."""
    weight_decay: float = 1e-4
    """Adam (L2) weight decay."""
    value_coef: float = 1.0
    """Weight of the value loss."""
    eval_simulations: int = 32
    """Search simulations per move in evaluation games."""
    solver_depth: int = 3
    """connect4: the depth of the evaluation opponent's search (tic-tac-toe's is exact)."""
    seed: int = 0
    """Seed of torch, numpy, random and the evaluation opponents."""
    num_threads: int = 1
    """torch CPU threads (1 is fastest for small networks; 0: torch's default)."""
    quiet: bool = False
    """No progress bar (CI, logs); the summary is still printed."""
    export_format: str = "torch-export"
    """File written at the end (the network's greedy policy, no search): torch-export, onnx or none."""
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    """Metrics loggers."""
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(interval=5_000, episodes=10))
    """Evaluation schedule; episodes: games from each side against each opponent."""
    checkpoint: CheckpointConfig = field(default_factory=lambda: CheckpointConfig(interval=10_000))
    """Checkpoint schedule (the replay buffer is included unless checkpoint.replay_buffer=false)."""


def make_game(name: str, num_games: int) -> BoardGameEnv:
    """``num_games`` boards of the game ``name`` (a key of :data:`GAMES`)."""
    if name not in GAMES:
        raise ConfigError(f"alphazero: unknown game env.name={name!r}; valid: {', '.join(GAMES)}")
    return GAMES[name](batch_size=[num_games])


def _check(cfg: AlphaZeroConfig) -> None:
    validate_config(cfg)
    for key in ("num_simulations", "eval_simulations", "max_num_considered_actions", "updates_per_batch",
                "solver_depth"):
        value = getattr(cfg, key)
        if value < 1:
            raise ConfigError(f"{key} must be an integer >= 1, got {value!r}")
    for key in ("random_opening_moves", "temperature_moves"):
        if getattr(cfg, key) < 0:
            raise ConfigError(f"{key} must be an integer >= 0, got {getattr(cfg, key)!r}")
    if not 0.0 <= cfg.value_mix <= 1.0:
        raise ConfigError(f"value_mix must be in [0, 1], got {cfg.value_mix!r}")
    if cfg.env.name not in GAMES:
        raise ConfigError(f"alphazero: unknown game env.name={cfg.env.name!r}; valid: {', '.join(GAMES)}")


# ---------------------------------------------------------------- networks
class PolicyValueNet(nn.Module):
    """An MLP torso on the flattened ``[B, 2, rows, cols]`` observation, a policy head
    (logits ``[B, A]``) and a value head (``tanh``, ``[B]``: the expected outcome for the
    player to move)."""

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int, hidden_sizes: list[int]) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = math.prod(obs_shape)
        for h in hidden_sizes:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        self.torso = nn.Sequential(*layers)
        self.policy_head = nn.Linear(width, num_actions)
        self.value_head = nn.Linear(width, 1)

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.torso(observation)
        return self.policy_head(x), torch.tanh(self.value_head(x)).squeeze(-1)


class GreedyPolicy(nn.Module):
    """The network's most likely legal move, from the observation alone (a cell is free
    when neither plane has a piece; connect four: a column whose top cell is free)."""

    def __init__(self, net: PolicyValueNet, connect_four: bool) -> None:
        super().__init__()
        self.net = net
        self.connect_four = connect_four

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        free = observation.sum(-3) == 0  # [B, rows, cols]
        legal = free[..., -1, :] if self.connect_four else free.flatten(-2)  # connect four: row 0 is the bottom
        logits, _ = self.net(observation)
        return torch.where(legal, logits, torch.finfo(logits.dtype).min).argmax(-1)


def make_policy(cfg: AlphaZeroConfig, env: BoardGameEnv) -> TensorDictModule:
    """The network wrapped as the greedy policy ``"observation"`` -> ``"action"``
    (``policy.module.net`` is the policy/value network the search uses)."""
    net = PolicyValueNet((2, env.rows, env.cols), env.num_actions, cfg.hidden_sizes)
    return TensorDictModule(GreedyPolicy(net, isinstance(env, ConnectFourEnv)), in_keys=["observation"],
                            out_keys=["action"])


# ---------------------------------------------------------------- search and self-play
def search_actions(env: BoardGameEnv, net: PolicyValueNet, action_mask: torch.Tensor, num_simulations: int,
                   max_num_considered_actions: int, gumbel_scale: float,
                   rng: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(action [B], improved policy [B, A], root value [B])`` of a Gumbel MuZero search
    from every board of ``env`` (the env's rules as the model; the value is for the player
    to move). Finished boards (no legal move) get a dummy search whose result is to be
    ignored."""
    with torch.no_grad():
        root = root_from_env(env, net)
        invalid = ~action_mask & action_mask.any(-1, keepdim=True)
        out = gumbel_muzero_policy(None, rng, root, recurrent_fn_from_env(env, net), num_simulations,
                                   invalid_actions=invalid, max_depth=env.rows * env.cols,
                                   max_num_considered_actions=max_num_considered_actions,
                                   gumbel_scale=gumbel_scale)
    return out.action, out.action_weights, out.search_tree.summary().value


class SelfPlay:
    """``B`` games played side by side. Each position waits (observation, improved policy,
    player to move, search value) until its game ends; :meth:`step` returns the positions
    of the games that just ended with their value target (the outcome for the player to
    move, +1, 0, -1, mixed with the search's root value by ``value_mix``) and starts new
    games on those boards. With ``random_opening_moves`` each game begins with a uniform
    0..random_opening_moves random moves (drawn from torch's global generator), which are
    played but not stored. ``state_dict`` holds the boards and the waiting positions."""

    def __init__(self, env: BoardGameEnv, random_opening_moves: int = 0, value_mix: float = 0.0) -> None:
        self.env = env
        self.random_opening_moves, self.value_mix = random_opening_moves, value_mix
        b, moves = env.batch_size[0], env.rows * env.cols
        self.obs = torch.zeros(b, moves, 2, env.rows, env.cols)
        self.policy = torch.zeros(b, moves, env.num_actions)
        self.player = torch.zeros(b, moves, dtype=torch.int64)
        self.search_value = torch.zeros(b, moves)
        self.length = torch.zeros(b, dtype=torch.int64)
        self.opening = self._draw_openings(b)
        self.td = env.reset()

    def _draw_openings(self, n: int) -> torch.Tensor:
        if self.random_opening_moves == 0:
            return torch.zeros(n, dtype=torch.int64)
        return torch.randint(0, self.random_opening_moves + 1, (n,))

    def plies(self) -> torch.Tensor:
        """Pieces on every board ``[B]``."""
        return (self.env.get_state()["board"] != 0).sum(-1)

    def opening_move(self) -> torch.Tensor:
        """``[B]`` bool: the board's next move is part of its random opening."""
        return self.plies() < self.opening

    def state_dict(self) -> dict[str, torch.Tensor]:
        st = self.env.get_state()
        return {"board": st["board"], "current_player": st["current_player"], "over": st["over"],
                "obs": self.obs.clone(), "policy": self.policy.clone(), "player": self.player.clone(),
                "search_value": self.search_value.clone(), "length": self.length.clone(),
                "opening": self.opening.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for key in ("obs", "policy", "player", "search_value", "length", "opening"):
            if key not in state:
                raise KeyError(f"self-play state: missing entry {key!r}")
        for key in ("obs", "policy", "player", "search_value", "length", "opening"):
            mine = getattr(self, key)
            if state[key].shape != mine.shape:
                raise ValueError(f"self-play entry {key!r}: expected shape {list(mine.shape)}, got "
                                 f"{list(state[key].shape)}")
            mine.copy_(state[key])
        self.env.set_state({k: state[k] for k in ("board", "current_player", "over")})
        # the env's entries (observation, action mask) of the restored boards
        self.td = self.env.reset(TensorDict({"_reset": torch.zeros(self.env.batch_size, dtype=torch.bool)},
                                            self.env.batch_size))

    def step(self, action: torch.Tensor, policy: torch.Tensor, search_value: torch.Tensor | None = None,
             store: torch.Tensor | None = None) -> TensorDictBase:
        """Plays ``action`` ``[B]`` on every board; the positions before the move are stored
        with ``policy`` ``[B, A]`` and ``search_value`` ``[B]`` where ``store`` ``[B]``
        (default: everywhere)."""
        env, rows = self.env, torch.arange(self.env.batch_size[0])
        st = env.get_state()
        if search_value is None:
            search_value = torch.zeros(rows.shape)
        self.obs[rows, self.length] = board_observation(env, st["board"], st["current_player"])
        self.policy[rows, self.length] = policy
        self.player[rows, self.length] = st["current_player"]
        self.search_value[rows, self.length] = search_value
        self.length += 1 if store is None else store.long()
        nxt = env.step(self.td.set("action", action))["next"]
        ended = nxt["terminated"].squeeze(-1)
        winner = torch.where(nxt["reward"].squeeze(-1) > 0, st["current_player"], -1)  # -1: a draw
        sign = torch.where(self.player == winner.unsqueeze(-1), 1.0, -1.0)
        value = torch.where(winner.unsqueeze(-1) < 0, 0.0, sign)
        if self.value_mix:
            value = (1 - self.value_mix) * value + self.value_mix * self.search_value
        keep = ended.unsqueeze(-1) & (torch.arange(self.obs.shape[1]) < self.length.unsqueeze(-1))
        finished = TensorDict({"observation": self.obs[keep], "policy": self.policy[keep], "value": value[keep]},
                              batch_size=[int(keep.sum())])
        self.length = torch.where(ended, 0, self.length)
        if self.random_opening_moves and bool(ended.any()):
            self.opening = torch.where(ended, self._draw_openings(len(ended)), self.opening)
        self.td = env.reset(TensorDict({"_reset": ended}, env.batch_size)) if bool(ended.any()) else nxt
        return finished


def symmetries(positions: TensorDictBase, connect_four: bool) -> TensorDictBase:
    """``positions`` (``"observation"`` ``[N, 2, rows, cols]``, ``"policy"`` ``[N, A]``,
    ``"value"``) with their mirror images: the 8 rotations/reflections of a tic-tac-toe
    board, the left-right mirror of a connect-four board (the policy's cells or columns
    move with the board). Returns ``[8N]`` / ``[2N]``."""
    obs, policy, value = positions["observation"], positions["policy"], positions["value"]
    if connect_four:
        obs_all, pol_all = [obs, obs.flip(-1)], [policy, policy.flip(-1)]
    else:
        grid = policy.unflatten(-1, (3, 3))
        obs_all, pol_all = [], []
        for flip in (False, True):
            o, g = (obs.flip(-1), grid.flip(-1)) if flip else (obs, grid)
            for k in range(4):
                obs_all.append(torch.rot90(o, k, (-2, -1)))
                pol_all.append(torch.rot90(g, k, (-2, -1)).flatten(-2))
    n = len(obs_all)
    return TensorDict({"observation": torch.cat(obs_all), "policy": torch.cat(pol_all), "value": value.repeat(n)},
                      batch_size=[n * positions.shape[0]])


# ---------------------------------------------------------------- evaluation
def _random_player(generator: torch.Generator):
    def act(td: TensorDictBase) -> TensorDictBase:
        u = torch.rand(td["action_mask"].shape, generator=generator).masked_fill(~td["action_mask"], -1.0)
        return td.set("action", u.argmax(-1))

    return act


def play_games(env: BoardGameEnv, agent, opponent) -> torch.Tensor:
    """Plays one game on every board of ``env``, the agent moving first on the first half
    of the boards and second on the rest. ``agent(env, td)`` and ``opponent(td)`` return the
    moves ``[B]`` / write ``"action"``. Returns the agent's outcomes ``[B]`` (+1, 0, -1)."""
    n = env.batch_size[0]
    agent_player = (torch.arange(n) >= n // 2).long()
    td = env.reset()
    outcome, done = torch.zeros(n), torch.zeros(n, dtype=torch.bool)
    while not bool(done.all()):
        player = td["current_player"].clone()
        mine = agent(env, td)
        theirs = opponent(td.clone())["action"]
        nxt = env.step(td.set("action", torch.where(player == agent_player, mine, theirs)))["next"]
        won = (nxt["reward"].squeeze(-1) > 0) & ~done
        outcome = torch.where(won, torch.where(player == agent_player, 1.0, -1.0), outcome)
        done = done | nxt["terminated"].squeeze(-1)
        td = nxt
    return outcome


def searching_agent(game: str, net: PolicyValueNet, num_simulations: int, max_num_considered_actions: int):
    """The evaluation agent as a function ``(board [n, cells] int8, player [n]) -> action [n]``:
    a noiseless Gumbel MuZero search from those boards (deterministic)."""

    def agent(board: torch.Tensor, player: torch.Tensor) -> torch.Tensor:
        env = make_game(game, board.shape[0])
        env.set_state({"board": board, "current_player": player})
        return search_actions(env, net, env._mask(), num_simulations, max_num_considered_actions, 0.0, None)[0]

    return agent


def minimax_losses(cfg: AlphaZeroConfig, net: PolicyValueNet) -> dict[str, float]:
    """Tic-tac-toe: the searching agent (``eval_simulations``, no noise) against *every*
    minimax player from both seats (:func:`~steersman.planning.solvers.games_against_minimax`:
    the opponent branches into all its optimal moves). ``eval/minimax_losses`` is the number
    of distinct lost final boards (0: it never loses to a perfect player), ``eval/minimax_games``
    the number of distinct final boards."""
    out = games_against_minimax(searching_agent(cfg.env.name, net, cfg.eval_simulations,
                                                cfg.max_num_considered_actions))
    return {"eval/minimax_losses": float(out["loss"]),
            "eval/minimax_games": float(out["win"] + out["draw"] + out["loss"])}


def evaluate_agent(cfg: AlphaZeroConfig, net: PolicyValueNet, seed: int) -> dict[str, float]:
    """Win/draw/loss rates of the searching agent against a random player and the solver
    (``eval.episodes`` games from each side), with generators of their own (the training
    RNG is not touched)."""
    env = make_game(cfg.env.name, 2 * cfg.eval.episodes)
    rng = torch.Generator().manual_seed(seed)

    def agent(env: BoardGameEnv, td: TensorDictBase) -> torch.Tensor:
        return search_actions(env, net, td["action_mask"], cfg.eval_simulations, cfg.max_num_considered_actions,
                              0.0, rng)[0]

    opponents = {"random": _random_player(torch.Generator().manual_seed(seed + 1))}
    solver_rng = torch.Generator().manual_seed(seed + 2)
    opponents["solver"] = (MinimaxPlayer(solver_rng) if cfg.env.name == "tictactoe"
                           else AlphaBetaPlayer(cfg.solver_depth, solver_rng))
    metrics = {}
    for name, opponent in opponents.items():
        outcome = play_games(env, agent, opponent)
        for what, value in (("win", 1.0), ("draw", 0.0), ("loss", -1.0)):
            metrics[f"eval/{name}_{what}"] = float((outcome == value).float().mean())
        metrics[f"eval/{name}_score"] = float(outcome.mean())
    if cfg.env.name == "tictactoe":
        metrics.update(minimax_losses(cfg, net))
    return metrics


def _log_evaluation(run: Run, cfg: AlphaZeroConfig, net: PolicyValueNet, frames: int) -> None:
    metrics = evaluate_agent(cfg, net, cfg.seed + EVAL_SEED_OFFSET + frames)
    run.logger.log_metrics(metrics, step=frames)
    games = 2 * cfg.eval.episodes
    run.log_eval(frames, torch.tensor([metrics["eval/solver_score"]] * games))  # eval/return: score vs the solver


# ---------------------------------------------------------------- training
def train(cfg: AlphaZeroConfig | None = None, run_dir: str | Path | None = None, *,
          resume: bool = False) -> dict[str, Any]:
    """Trains AlphaZero as configured, writing ``run_dir``; returns the run's summary."""
    cfg = cfg if cfg is not None else AlphaZeroConfig()
    _check(cfg)
    seed_everything(cfg.seed)
    if cfg.num_threads > 0:
        torch.set_num_threads(cfg.num_threads)
    env = make_game(cfg.env.name, cfg.env.num_envs)
    policy = make_policy(cfg, env)
    net = policy.module.net
    optimizer = torch.optim.Adam(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(cfg.buffer_size), batch_size=cfg.batch_size)
    run = Run("alphazero", cfg, run_dir, resume=resume, frames_per_batch=cfg.frames_per_batch)
    selfplay = SelfPlay(env, cfg.random_opening_moves, cfg.value_mix)
    run.track(policy=policy, optim=optimizer, selfplay=selfplay, buffer=buffer)

    frames = run.frames
    moves_per_batch = cfg.frames_per_batch // cfg.env.num_envs
    while frames < run.total_frames:
        for _ in range(moves_per_batch):
            mask = selfplay.td["action_mask"]
            action, improved, root_value = search_actions(env, net, mask, cfg.num_simulations,
                                                          cfg.max_num_considered_actions, cfg.gumbel_scale, None)
            if cfg.temperature_moves:  # sample the first moves from the improved policy
                sampled = torch.multinomial(improved, 1).squeeze(-1)
                action = torch.where(selfplay.plies() < cfg.temperature_moves, sampled, action)
            store = None
            if cfg.random_opening_moves:  # the opening's random moves are played, not stored
                opening = selfplay.opening_move()
                random_move = torch.rand(mask.shape).masked_fill(~mask, -1.0).argmax(-1)
                action, store = torch.where(opening, random_move, action), ~opening
            finished = selfplay.step(action, improved, root_value, store)
            if finished.numel():
                buffer.extend(symmetries(finished, cfg.env.name == "connect4") if cfg.augment else finished)
        frames += cfg.frames_per_batch

        policy_loss = value_loss = torch.tensor(math.nan)
        if len(buffer) >= max(cfg.learning_starts, cfg.batch_size):
            for _ in range(cfg.updates_per_batch):
                batch = buffer.sample()
                logits, value = net(batch["observation"])
                policy_loss = -(batch["policy"] * torch.log_softmax(logits, -1)).sum(-1).mean()
                value_loss = (value - batch["value"]).pow(2).mean()
                optimizer.zero_grad(set_to_none=True)
                (policy_loss + cfg.value_coef * value_loss).backward()
                optimizer.step()

        run.log(frames, {"train/policy_loss": policy_loss.detach(), "train/value_loss": value_loss.detach(),
                         "train/buffer_size": float(len(buffer))})
        if run.eval_due(frames):
            _log_evaluation(run, cfg, net, frames)
        if run.checkpoint_due(frames):
            run.save()
        if run.stop_requested:
            break
    if not run.stop_requested and (not run.evals or run.evals[-1][0] != run.frames):
        _log_evaluation(run, cfg, net, run.frames)  # the final evaluation (wrap_up then skips its own)
    return run.wrap_up(policy, make_game(cfg.env.name, 2))


if __name__ == "__main__":  # pragma: no cover
    train()
