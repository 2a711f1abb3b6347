"""Saving and restoring an env's dynamic state, for resumable collectors.

A collector restored from its ``state_dict`` continues the exact data stream only if
the env is put back in the state it was in: physics, step counters and random
generators. Envs expose no common API for this, so this module knows the ones that
steersman ships:

* native envs (``CartPoleEnv`` ..., and the multi-agent ``NavigationEnv`` ...): the state tensor, the step counters and the
  counter-based RNG of every sub-env;
* Gymnasium envs (``GymEnv``/``GymWrapper``): the attributes of every layer of the
  Gymnasium wrapper chain (the unwrapped env's physics and ``np_random`` generator,
  ``TimeLimit``'s step count, the spaces' generators ...), pickled, plus the wrapper's
  own pending-reset flags. Works for pure-Python envs (classic control, toy text ...);
  an env holding processes, sockets or renderer handles cannot be saved. Loading never
  executes code: the blob is read by an unpickler that only builds NumPy arrays, dtypes
  and random generators, Gymnasium spaces and ``EnvSpec`` (anything else is refused), and
  a state that this unpickler could not read back is not saved in the first place;
* ``TransformedEnv``: its base env and the transforms' ``state_dict``;
* ``SerialEnv``: each sub-env.

Anything else (``ParallelEnv``, whose sub-envs live in other processes; user envs)
has no saved state: :func:`env_state` returns ``None`` and a restored collector resets
the env and starts new trajectories instead.
"""

from __future__ import annotations

import pickle
from typing import Any

from steersman.envs import (
    EnvBase,
    GymWrapper,
    MultiAgentNativeEnv,
    NativeEnv,
    SerialEnv,
    TransformedEnv,
)

#: torch-native envs: their whole dynamic state is ``_state``, ``_steps`` and the counter RNG ``_rng``
_NATIVE = (NativeEnv, MultiAgentNativeEnv)

__all__ = ["env_state", "load_env_state"]

_GYM_ATTRS = ("_pending", "_pending_any", "_seed", "_same_step_cache")

# What a saved Gymnasium state may build when loaded (module, name); see _SafeUnpickler.
_ALLOWED_GLOBALS = {
    *((m, n) for m in ("numpy._core.multiarray", "numpy.core.multiarray") for n in ("_reconstruct", "scalar")),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.random._pickle", "__generator_ctor"), ("numpy.random._pickle", "__bit_generator_ctor"),
    ("numpy.random._pickle", "__randomstate_ctor"),
    ("numpy.random.bit_generator", "SeedSequence"), ("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence"),
    ("gymnasium.envs.registration", "EnvSpec"), ("gymnasium.envs.registration", "WrapperSpec"),
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "slice"), ("builtins", "complex"),
    ("collections", "OrderedDict"),
}


class _SafeUnpickler(pickle.Unpickler):
    """Builds only the types a Gymnasium env's state is made of (``_ALLOWED_GLOBALS``,
    NumPy bit generators and Gymnasium spaces): a tampered checkpoint cannot run code."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if module.startswith(("numpy.random.", "gymnasium.spaces.")):
            import gymnasium
            import numpy as np

            obj = super().find_class(module, name)
            if isinstance(obj, type) and issubclass(obj, (np.random.BitGenerator, gymnasium.spaces.Space)):
                return obj
        raise pickle.UnpicklingError(
            f"the saved env state refers to {module}.{name}, which is not a NumPy array, random "
            "generator, Gymnasium space or EnvSpec: refusing to load it (loading never executes code)"
        )


def _safe_loads(blob: bytes) -> Any:
    import io

    return _SafeUnpickler(io.BytesIO(blob)).load()


def _gym_layers(obj: Any) -> dict:
    """The attributes of a Gymnasium env/wrapper, recursing into ``env``/``envs``."""
    out: dict = {}
    for k, v in vars(obj).items():
        if k == "env" and hasattr(v, "step"):
            out[k] = _gym_layers(v)
        elif k == "envs" and isinstance(v, (list, tuple)) and all(hasattr(e, "step") for e in v):
            out[k] = [_gym_layers(e) for e in v]
        else:
            out[k] = v
    return out


def _load_gym_layers(obj: Any, state: dict) -> None:
    for k, v in state.items():
        if k == "env" and isinstance(v, dict) and hasattr(getattr(obj, "env", None), "step"):
            _load_gym_layers(obj.env, v)
        elif k == "envs" and isinstance(v, list):
            for e, s in zip(obj.envs, v):
                _load_gym_layers(e, s)
        else:
            vars(obj)[k] = v


def env_state(env: EnvBase) -> dict | None:
    """The dynamic state of ``env`` (tensors, ints and bytes only), or ``None`` if it cannot
    be saved (see the module docstring).

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv
        >>> from steersman.collectors._env_state import env_state, load_env_state
        >>> env = CartPoleEnv(batch_size=[2], seed=0)
        >>> saved = env_state(env)
        >>> first = env.reset()["observation"]      # draws from the env's RNG
        >>> load_env_state(env, saved)
        >>> torch.equal(env.reset()["observation"], first)
        True
    """
    if isinstance(env, TransformedEnv):
        base = env_state(env.base_env)
        if base is None:
            return None
        return {"kind": "transformed", "base": base, "transform": dict(env.transform.state_dict())}
    if isinstance(env, SerialEnv):
        subs = [env_state(e) for e in env._envs]
        if any(s is None for s in subs):
            return None
        return {"kind": "serial", "workers": subs}
    if isinstance(env, _NATIVE):
        return {"kind": "native", "state": env._state.clone(), "steps": env._steps.clone(),
                "rng": env._rng.clone()}
    if isinstance(env, GymWrapper):
        try:
            blob = pickle.dumps({"layers": _gym_layers(env.env),
                                 "wrapper": {k: getattr(env, k) for k in _GYM_ATTRS}})
            _safe_loads(blob)  # what could not be loaded back is not saved
        except Exception:  # noqa: BLE001 - processes, sockets, renderers, other types: not saveable
            return None
        return {"kind": "gym", "blob": blob}
    return None


def load_env_state(env: EnvBase, state: dict) -> None:
    """Puts ``env`` back in ``state`` (from :func:`env_state` on an env built the same way).

    Raises:
        ValueError: ``state`` was saved from another kind of env.
    """
    kind = state.get("kind")
    if isinstance(env, TransformedEnv) and kind == "transformed":
        load_env_state(env.base_env, state["base"])
        env.transform.load_state_dict(state["transform"])
        return
    if isinstance(env, SerialEnv) and kind == "serial" and len(state["workers"]) == len(env._envs):
        for e, s in zip(env._envs, state["workers"]):
            load_env_state(e, s)
        return
    if isinstance(env, _NATIVE) and kind == "native":
        if state["state"].shape != env._state.shape:
            raise ValueError(
                f"collector.load_state_dict: the saved {type(env).__name__} state has shape "
                f"{list(state['state'].shape)}, this env's is {list(env._state.shape)}"
            )
        dev = env._state.device
        env._state = state["state"].to(dev, copy=True)
        env._steps = state["steps"].to(dev, copy=True)
        env._rng = state["rng"].to(dev, copy=True)
        return
    if isinstance(env, GymWrapper) and kind == "gym":
        saved = _safe_loads(state["blob"])
        _load_gym_layers(env.env, saved["layers"])
        for k, v in saved["wrapper"].items():
            setattr(env, k, v)
        return
    raise ValueError(
        f"collector.load_state_dict: the saved env state is of kind {kind!r}, which does not fit "
        f"this collector's env ({type(env).__name__}); build the collector with the same env"
    )

