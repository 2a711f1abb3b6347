"""Recurrent functions for the search from a learned model or from a native env."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from steersman.data import Categorical, OneHot
from steersman.envs.native._base import NativeEnv
from steersman.envs.native._board import BoardGameEnv
from steersman.tensordict import TensorDict, TensorDictBase

from .search import RecurrentFnOutput, RootFnOutput

__all__ = ["board_observation", "recurrent_fn_from_env", "recurrent_fn_from_model", "root_from_env"]


def recurrent_fn_from_model(dynamics: Callable[[TensorDictBase], TensorDictBase],
                            prediction: Callable[[TensorDictBase], TensorDictBase], *,
                            latent_keys: Sequence[str], action_key: str = "action", reward_key: str = "reward",
                            logits_key: str = "prior_logits", value_key: str = "value",
                            discount: float = 1.0, num_actions: int | None = None) -> Callable:
    """A recurrent function from two ``TensorDictModule``\\ s (MuZero's model).

    The embedding is a TensorDict ``[B]`` holding ``latent_keys``. ``dynamics`` reads
    them and ``action_key`` (the ``[B]`` action index, or its one-hot float encoding
    when ``num_actions`` is given) and writes the next latent and ``reward_key`` ``[B]``
    (or ``[B, 1]``); ``prediction`` reads the next latent and writes ``logits_key``
    ``[B, A]`` and ``value_key`` ``[B]`` (or ``[B, 1]``). ``discount`` is the constant
    discount (-1.0 for two-player zero-sum games). ``params`` and ``rng`` of the
    recurrent function are not used (the modules hold their parameters).
    """
    latent_keys = list(latent_keys)
    if not latent_keys:
        raise ValueError("recurrent_fn_from_model: latent_keys must name at least one entry of the embedding")

    def recurrent_fn(params: Any, rng: Any, action: Tensor, embedding: TensorDictBase
                     ) -> tuple[RecurrentFnOutput, TensorDictBase]:
        batch = action.shape
        a = action if num_actions is None else torch.nn.functional.one_hot(action, num_actions).to(
            embedding.get(latent_keys[0]).dtype)
        td = TensorDict({k: embedding.get(k) for k in latent_keys}, batch_size=batch)
        td.set(action_key, a)
        td = dynamics(td)
        nxt = TensorDict({k: td.get(k) for k in latent_keys}, batch_size=batch)
        pred = prediction(nxt.clone(recurse=False))
        reward = td.get(reward_key).reshape(batch)
        value = pred.get(value_key).reshape(batch)
        out = RecurrentFnOutput(reward=reward, discount=torch.full_like(reward, discount),
                                prior_logits=pred.get(logits_key), value=value)
        return out, nxt

    return recurrent_fn


def _discrete_actions(env: NativeEnv) -> int:
    spec = env.action_spec
    if not isinstance(spec, (Categorical, OneHot)):
        raise TypeError(f"recurrent_fn_from_env: {type(env).__name__} has a {type(spec).__name__} action spec; "
                        "tree search needs discrete actions (Categorical or OneHot)")
    return int(spec.n)


def _check_env(env: Any) -> NativeEnv | BoardGameEnv:
    if not isinstance(env, (NativeEnv, BoardGameEnv)):
        raise TypeError(f"recurrent_fn_from_env: env must be a native steersman env (NativeEnv or a board game), got "
                        f"{type(env).__name__}; other envs cannot be stepped from an arbitrary state")
    if len(env.batch_size) != 1:
        raise ValueError(f"recurrent_fn_from_env: the env must have one batch dim [B], got "
                         f"{list(env.batch_size)}")
    return env


def root_from_env(env: NativeEnv, prediction: Callable[[Tensor], tuple[Tensor, Tensor]] | None = None
                  ) -> RootFnOutput:
    """The roots at the env's current state: embedding ``{"state": [B, S], "done":
    [B]}``, prior logits and value from ``prediction(observation)`` (default:
    uniform logits, value 0).

    Board games (:class:`~steersman.envs.TicTacToeEnv`, :class:`~steersman.envs.ConnectFourEnv`):
    the embedding is ``{"board": int8 [B, cells], "player": [B], "done": [B]}``, the
    observation ``[B, 2, rows, cols]`` (the mover's pieces, the opponent's: the env's
    ``"observation"``), values are for the player to move, and the prior logits of
    illegal moves are set to the dtype's minimum.
    """
    env = _check_env(env)
    num_actions = _discrete_actions(env)
    if isinstance(env, BoardGameEnv):
        st = env.get_state()
        board, player, over = st.get("board"), st.get("current_player"), st.get("over")
        emb = TensorDict({"board": board, "player": player, "done": over}, batch_size=board.shape[:1])
        logits, value = _predict_board(env, prediction, board, player, over)
        return RootFnOutput(logits, value, emb)
    st = env.get_state()
    state = torch.stack([st.get(n) for n in env.state_names], -1)
    batch = state.shape[0]
    emb = TensorDict({"state": state, "done": torch.zeros(batch, dtype=torch.bool, device=state.device)},
                     batch_size=[batch])
    logits, value = _predict(env, prediction, state, num_actions)
    return RootFnOutput(logits, value, emb)


def _predict(env: NativeEnv, prediction: Callable | None, state: Tensor, num_actions: int) -> tuple[Tensor, Tensor]:
    batch = state.shape[0]
    if prediction is None:
        z = torch.zeros(batch, dtype=env.dtype, device=state.device)
        return torch.zeros(batch, num_actions, dtype=env.dtype, device=state.device), z
    obs = type(env)._observe(state.movedim(-1, 0), env._make_consts())
    logits, value = prediction(obs)
    return logits, value.reshape(batch)


def recurrent_fn_from_env(env: NativeEnv, prediction: Callable[[Tensor], tuple[Tensor, Tensor]] | None = None, *,
                          discount: float = 1.0) -> Callable:
    """A recurrent function that steps a native env's pure dynamics (the true model).

    The embedding is ``{"state": [B, S] (components in env.state_names order), "done":
    [B] bool}`` as made by :func:`root_from_env`. A step from a done state is absorbing
    (reward 0, discount 0); a terminating step has discount 0, others ``discount``.
    ``prediction(observation) -> (prior_logits [B, A], value [B])`` gives the new
    node's prior and value (default: uniform, 0). The env's time limit is not applied.
    ``params`` and ``rng`` are not used (the dynamics are deterministic).

    Board games (see :func:`root_from_env` for the embedding): ``reward`` is +1 when the
    move wins (for the player who moved), ``discount`` is -1 (the next value is the
    opponent's) and 0 once the game is over; an illegal move (occupied cell, full column)
    loses at once (reward -1, game over), so the search learns to avoid moves that the
    prior's mask did not rule out. ``discount`` must be left at its default for them.
    """
    env = _check_env(env)
    num_actions = _discrete_actions(env)
    if isinstance(env, BoardGameEnv):
        return _board_recurrent_fn(env, prediction)
    dynamics = type(env)._dynamics
    consts = env._make_consts()

    def recurrent_fn(params: Any, rng: Any, action: Tensor, embedding: TensorDictBase
                     ) -> tuple[RecurrentFnOutput, TensorDictBase]:
        state = embedding.get("state")
        done = embedding.get("done")
        ns, reward, terminated = dynamics(state.unbind(-1), action, consts)
        nstate = torch.stack(ns, -1).to(state.dtype)
        nstate = torch.where(done.unsqueeze(-1), state, nstate)
        reward = torch.where(done, 0.0, reward).to(env.dtype)
        ndone = done | terminated
        disc = torch.where(ndone, 0.0, discount).to(env.dtype)
        logits, value = _predict(env, prediction, nstate, num_actions)
        value = torch.where(ndone, 0.0, value)
        out = RecurrentFnOutput(reward=reward, discount=disc, prior_logits=logits, value=value)
        return out, TensorDict({"state": nstate, "done": ndone}, batch_size=action.shape)

    return recurrent_fn


def board_observation(env: BoardGameEnv, board: Tensor, player: Tensor) -> Tensor:
    """The env's ``"observation"`` of boards ``[B, cells]`` with ``player`` ``[B]`` to move:
    float ``[B, 2, rows, cols]`` (the mover's pieces, then the opponent's)."""
    sign = (1 - 2 * player).to(torch.int8).unsqueeze(-1)
    planes = torch.stack([board == sign, board == -sign], -2).to(torch.float32)
    return planes.unflatten(-1, (env.rows, env.cols))


def _predict_board(env: BoardGameEnv, prediction: Callable | None, board: Tensor, player: Tensor, done: Tensor
                   ) -> tuple[Tensor, Tensor]:
    batch = board.shape[0]
    legal = env._legal(board) & ~done.unsqueeze(-1)
    if prediction is None:
        logits = torch.zeros(batch, env.num_actions, device=board.device)
        value = torch.zeros(batch, device=board.device)
    else:
        logits, value = prediction(board_observation(env, board, player))
        value = value.reshape(batch)
    return torch.where(legal, logits, torch.finfo(logits.dtype).min), value


def _board_recurrent_fn(env: BoardGameEnv, prediction: Callable | None) -> Callable:
    def recurrent_fn(params: Any, rng: Any, action: Tensor, embedding: TensorDictBase
                     ) -> tuple[RecurrentFnOutput, TensorDictBase]:
        board, player, done = embedding.get("board"), embedding.get("player"), embedding.get("done")
        legal = env._legal(board).gather(-1, action.unsqueeze(-1)).squeeze(-1)
        nboard, nplayer, ndone, won = env.transition(board, player, done, action)
        illegal = ~legal & ~done
        reward = torch.where(illegal, -1.0, won)
        ndone = ndone | illegal
        logits, value = _predict_board(env, prediction, nboard, nplayer, ndone)
        value = torch.where(ndone, 0.0, value)
        discount = torch.where(ndone, 0.0, -1.0).to(value.dtype)
        out = RecurrentFnOutput(reward=reward.to(value.dtype), discount=discount, prior_logits=logits, value=value)
        return out, TensorDict({"board": nboard, "player": nplayer, "done": ndone}, batch_size=action.shape)

    return recurrent_fn
