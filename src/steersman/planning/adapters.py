"""Recurrent functions for the search from a learned model or from a native env."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from steersman.data import Categorical, OneHot
from steersman.envs.native._base import NativeEnv
from steersman.tensordict import TensorDict, TensorDictBase

from .search import RecurrentFnOutput, RootFnOutput

__all__ = ["recurrent_fn_from_env", "recurrent_fn_from_model", "root_from_env"]


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


def _check_env(env: Any) -> NativeEnv:
    if not isinstance(env, NativeEnv):
        raise TypeError(f"recurrent_fn_from_env: env must be a native steersman env (NativeEnv), got "
                        f"{type(env).__name__}; other envs cannot be stepped from an arbitrary state")
    if len(env.batch_size) != 1:
        raise ValueError(f"recurrent_fn_from_env: the env must have one batch dim [B], got "
                         f"{list(env.batch_size)}")
    return env


def root_from_env(env: NativeEnv, prediction: Callable[[Tensor], tuple[Tensor, Tensor]] | None = None
                  ) -> RootFnOutput:
    """The roots at the env's current state: embedding ``{"state": [B, S], "done":
    [B]}``, prior logits and value from ``prediction(observation)`` (default:
    uniform logits, value 0)."""
    env = _check_env(env)
    num_actions = _discrete_actions(env)
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
    """
    env = _check_env(env)
    num_actions = _discrete_actions(env)
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
