"""Env utilities: ``check_env_specs``, and ``step_mdp`` and the seed helpers (defined in
``steersman.envs._mdp``, which ``EnvBase`` uses, re-exported here).

``check_env_specs(env)`` runs a short rollout and checks every entry against the env's
specs, naming the first offending key. This module imports ``common`` (for ``EnvBase``);
``common`` does not import it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from steersman.tensordict import TensorDictBase
from steersman.tensordict._utils import NestedKey

from ._mdp import DEFAULT_DONE_KEYS, _splitmix64, next_seed, step_mdp  # noqa: F401 (re-exported)
from .common import EnvBase

__all__ = [
    "step_mdp",
    "check_env_specs",
    "next_seed",
    "DEFAULT_DONE_KEYS",
]


# ---------------------------------------------------------------------- check_env_specs
def _leaf_specs(env: EnvBase) -> dict[NestedKey, Any]:
    """The spec of every entry of a rollout, by key (as ``fake_tensordict`` lays them out)."""
    specs: dict[NestedKey, Any] = {}

    def add(composite: Any, prefix: tuple) -> None:
        for key, spec in composite.items(include_nested=True, leaves_only=True):
            key = (key,) if type(key) is str else key
            full = prefix + key
            specs[full[0] if len(full) == 1 else full] = spec

    add(env.full_observation_spec, ())
    add(env.full_observation_spec, ("next",))
    add(env.full_state_spec, ())
    add(env.full_action_spec, ())
    add(env.full_done_spec, ())
    add(env.full_done_spec, ("next",))
    add(env.full_reward_spec, ("next",))
    return specs


def _key_order(key: NestedKey) -> tuple:
    """Root keys first, then nested ones, each alphabetically."""
    return (type(key) is tuple, str(key))


def _fmt(key: NestedKey) -> str:
    return repr(key)


def check_env_specs(
    env: EnvBase,
    return_contiguous: bool = True,
    check_dtype: bool = True,
    seed: int | None = None,
    tensordict: TensorDictBase | None = None,
    max_steps: int = 3,
) -> None:
    """Runs a short rollout and checks every entry against the env's specs.

    Checks, for the reset and every step: the set of keys equals the one the specs
    declare (``env.fake_tensordict()``), every entry has the spec's shape (with the
    time dim last among the batch dims) and dtype (if ``check_dtype``), every value is
    in its spec (bounds, categories), and ``done == terminated | truncated``. The
    rollout auto-resets finished sub-envs, so partial resets are exercised too.

    Args:
        env: the env to check.
        return_contiguous: stack the rollout densely (False: lazily).
        check_dtype: also compare dtypes exactly (otherwise only shapes and values).
        seed: if given, ``env.set_seed(seed)`` first.
        tensordict: an optional reset input passed to the rollout.
        max_steps: the rollout length.

    Raises:
        AssertionError: naming the first offending key and what is wrong with it.

    Example:
        >>> from steersman.envs import CartPoleEnv, check_env_specs
        >>> check_env_specs(CartPoleEnv(batch_size=[4]), seed=0)  # silent when the specs hold
    """
    if seed is not None:
        env.set_seed(seed)
    specs = _leaf_specs(env)
    try:
        real = env.rollout(
            max_steps,
            return_contiguous=return_contiguous,
            tensordict=tensordict,
            auto_reset=True,
            break_when_any_done=False,
        )
    except (KeyError, ValueError, RuntimeError) as err:
        raise AssertionError(
            f"check_env_specs: a {max_steps}-step rollout of {type(env).__name__} failed: {err} "
            "(every step must produce the same entries, and each entry the same shape)"
        ) from err
    bdims = len(env.batch_size)
    if tuple(real.batch_size[:bdims]) != tuple(env.batch_size):
        raise AssertionError(
            f"check_env_specs: the rollout has batch size {list(real.batch_size)}, expected "
            f"{list(env.batch_size)} followed by the time dim"
        )
    steps = real.batch_size[bdims]
    real_keys = {k for k in real.keys(include_nested=True, leaves_only=True)}
    expected = set(specs)
    missing = sorted((k for k in expected - real_keys), key=_key_order)
    if missing:
        raise AssertionError(
            f"check_env_specs: key {_fmt(missing[0])} is declared in the specs but missing from "
            f"the rollout (all missing: {missing})"
        )
    extra = sorted((k for k in real_keys - expected), key=_key_order)
    if extra:
        raise AssertionError(
            f"check_env_specs: key {_fmt(extra[0])} is in the rollout but in no spec "
            f"(all undeclared: {extra}); add it to the matching spec "
            "(observation_spec, state_spec, reward_spec, done_spec or action_spec)"
        )
    for key in sorted(expected, key=_key_order):
        spec = specs[key]
        val = real.get(key)
        if not isinstance(val, Tensor):
            continue  # non-tensor entries: only presence is checked
        want = torch.Size((*env.batch_size, steps, *spec.shape[bdims:]))
        if val.shape != want:
            raise AssertionError(
                f"check_env_specs: key {_fmt(key)} has shape {list(val.shape)}, the spec says "
                f"{list(want)} (spec shape {list(spec.shape)} with the time dim {steps} inserted "
                f"after the batch dims {list(env.batch_size)})"
            )
        if check_dtype and spec.dtype is not None and val.dtype != spec.dtype:
            raise AssertionError(
                f"check_env_specs: key {_fmt(key)} has dtype {val.dtype}, the spec says {spec.dtype}"
            )
        per_step = val.movedim(bdims, 0)
        if not spec.is_in(per_step):
            reason = spec._check(per_step) or "value not in spec"
            raise AssertionError(
                f"check_env_specs: key {_fmt(key)} holds values outside its spec {spec!r}: {reason}"
            )
    for prefix in (("next",), ()):
        keys = [prefix + (k,) if prefix else k for k in DEFAULT_DONE_KEYS]
        if all(k in real_keys for k in keys):
            d, te, tr = (real.get(k) for k in keys)
            if not torch.equal(d, te | tr):
                raise AssertionError(
                    f"check_env_specs: {_fmt(keys[0])} differs from terminated | truncated"
                )
