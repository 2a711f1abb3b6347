"""Env utilities: ``step_mdp``, ``check_env_specs`` and seed helpers.

``step_mdp(td)`` turns a transition (root = state where the action was taken,
``"next"`` = its result) into the input of the following step: the content of
``"next"`` moves to the root. ``check_env_specs(env)`` runs a short rollout and checks
every entry against the env's specs, naming the first offending key.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from steersman.tensordict import TensorDict, TensorDictBase
from steersman.tensordict._utils import NestedKey, unravel_key

if TYPE_CHECKING:  # pragma: no cover
    from .common import EnvBase

__all__ = [
    "step_mdp",
    "check_env_specs",
    "next_seed",
    "DEFAULT_DONE_KEYS",
]

#: the done entries of a transition (``done = terminated | truncated``).
DEFAULT_DONE_KEYS: tuple[str, ...] = ("done", "terminated", "truncated")

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """One step of SplitMix64 on a Python int (a 64-bit bijective mixer)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def next_seed(seed: int) -> int:
    """The seed that follows ``seed``: a deterministic hash, in ``[0, 2**63)``.

    ``env.set_seed(seed)`` returns ``next_seed(seed)`` so that chained calls
    (``seed = env.set_seed(seed)``) give every env its own reproducible seed.

    Example:
        >>> from steersman.envs.utils import next_seed
        >>> next_seed(0) == next_seed(0), next_seed(0) != next_seed(1)
        (True, True)
        >>> 0 <= next_seed(123) < 2**63
        True
    """
    return _splitmix64(int(seed) & _MASK64) >> 1


def _as_key_list(keys: Any) -> list[NestedKey]:
    if keys is None:
        return []
    if isinstance(keys, (str, tuple)):
        return [unravel_key(keys)]
    return [unravel_key(k) for k in keys]


def _step_mdp_fast(td: TensorDict, excl_root: frozenset, excl_next: frozenset) -> TensorDict:
    """``step_mdp`` on a plain TensorDict with string keys only (the env hot path).

    ``excl_root``: root keys dropped (always contains ``"next"``); ``excl_next``: keys of
    ``"next"`` dropped. Tensors are shared, not copied.
    """
    root = td._tensordict
    try:
        nxt = root["next"]
    except KeyError:
        raise KeyError(
            "step_mdp: the tensordict has no 'next' entry; call env.step(td) first "
            f"(keys: {sorted(root)})"
        ) from None
    out = {k: v for k, v in root.items() if k not in excl_root}
    if type(nxt) is TensorDict:
        items = nxt._tensordict.items()
    else:
        items = ((k, nxt.get(k)) for k in nxt.keys())
    for k, v in items:
        if k in excl_next:
            continue
        cur = out.get(k)
        if cur is not None and isinstance(cur, TensorDictBase) and isinstance(v, TensorDictBase):
            v = cur.copy().update(v)
        out[k] = v
    return TensorDict._new_unsafe(out, td.batch_size, td.device)


def step_mdp(
    tensordict: TensorDictBase,
    next_tensordict: TensorDictBase | None = None,
    keep_other: bool = True,
    exclude_reward: bool = True,
    exclude_done: bool = False,
    exclude_action: bool = True,
    reward_keys: NestedKey | Sequence[NestedKey] = "reward",
    done_keys: NestedKey | Sequence[NestedKey] | None = None,
    action_keys: NestedKey | Sequence[NestedKey] = "action",
) -> TensorDictBase:
    """Moves the ``"next"`` entries of a transition to the root: the next step's input.

    Args:
        tensordict: a transition (``env.step`` output) with a ``"next"`` entry.
        next_tensordict: if given, the result is written into it (its entries are
            replaced) and it is returned.
        keep_other: keep the root entries that are not in ``"next"`` (e.g. a recurrent
            policy's hidden state); the action, reward and ``"_reset"`` are never kept
            unless asked otherwise below.
        exclude_reward: drop the reward entries (root and ``"next"``).
        exclude_done: drop the done entries (root and ``"next"``).
        exclude_action: drop the action entries of the root.
        reward_keys / done_keys / action_keys: the key, or a list of keys, of each kind
            (a tuple of strings is one nested key). ``done_keys`` defaults to
            ``["done", "terminated", "truncated"]``.

    Returns: a new TensorDict (tensors are shared, not copied) of the same batch size.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs import step_mdp
        >>> td = TensorDict({
        ...     "observation": torch.zeros(3, 4), "action": torch.ones(3, 1), "hidden": torch.ones(3, 2),
        ...     "next": {"observation": torch.ones(3, 4), "reward": torch.ones(3, 1),
        ...              "done": torch.zeros(3, 1, dtype=torch.bool)},
        ... }, batch_size=[3])
        >>> out = step_mdp(td)
        >>> sorted(out.keys())
        ['done', 'hidden', 'observation']
        >>> bool((out["observation"] == 1).all())
        True
        >>> sorted(step_mdp(td, keep_other=False, exclude_done=True).keys())
        ['observation']
    """
    rkeys = _as_key_list(reward_keys)
    dkeys = _as_key_list(list(DEFAULT_DONE_KEYS) if done_keys is None else done_keys)
    akeys = _as_key_list(action_keys)
    excl_next: list[NestedKey] = []
    excl_root: list[NestedKey] = ["next", "_reset"]
    if exclude_reward:
        excl_next += rkeys
        excl_root += rkeys
    if exclude_done:
        excl_next += dkeys
        excl_root += dkeys
    if exclude_action:
        excl_root += akeys
    if (
        type(tensordict) is TensorDict
        and keep_other
        and all(type(k) is str for k in excl_root)
        and all(type(k) is str for k in excl_next)
    ):
        out = _step_mdp_fast(tensordict, frozenset(excl_root), frozenset(excl_next))
    else:
        out = _step_mdp_generic(tensordict, keep_other, excl_root, excl_next)
    if next_tensordict is not None:
        next_tensordict.update(out)
        return next_tensordict
    return out


def _step_mdp_generic(
    td: TensorDictBase, keep_other: bool, excl_root: list, excl_next: list
) -> TensorDictBase:
    if "next" not in td.keys():
        raise KeyError("step_mdp: the tensordict has no 'next' entry; call env.step(td) first")
    nxt = td.get("next")
    present_next = set(nxt.keys(include_nested=True))
    nxt = nxt.exclude(*[k for k in excl_next if k in present_next])
    if keep_other:
        present = set(td.keys(include_nested=True))
        out = td.exclude(*[k for k in excl_root if k in present])
    else:
        out = td.empty()
    out.update(nxt)
    return out


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


def _any_done(td: TensorDictBase, keys: Iterable[NestedKey], batch_dims: int) -> Tensor | None:
    """OR of the entries ``keys`` (those present), reduced to shape ``[*batch]``."""
    out = None
    for key in keys:
        v = td.get(key, None)
        if v is None:
            continue
        if v.ndim > batch_dims:
            v = v.reshape(*v.shape[:batch_dims], -1).any(-1)
        out = v if out is None else out | v
    return out
