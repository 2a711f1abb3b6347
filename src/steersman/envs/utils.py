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

from steersman.data import Composite, NonTensor, Unbounded
from steersman.tensordict import TensorDictBase, is_tensor_collection
from steersman.tensordict._utils import NestedKey

from ._mdp import DEFAULT_DONE_KEYS, _splitmix64, next_seed, step_mdp  # noqa: F401 (re-exported)
from .common import EnvBase

__all__ = [
    "step_mdp",
    "check_env_specs",
    "next_seed",
    "DEFAULT_DONE_KEYS",
    "make_composite_from_td",
    "terminated_or_truncated",
]


# ---------------------------------------------------------------------- spec/data helpers
def make_composite_from_td(
    data: TensorDictBase, *, unsqueeze_null_shapes: bool = True, dynamic_shape: bool = False
) -> Composite:
    """A :class:`~steersman.data.Composite` of ``Unbounded`` specs shaped like ``data``.

    Each tensor becomes ``Unbounded`` with its shape, dtype and device; each sub-TensorDict
    a Composite of its batch size (recursively); the Composite has ``data``'s batch size.

    Args:
        data: the TensorDict to describe.
        unsqueeze_null_shapes: a 0-d tensor gets the spec shape ``[1]`` (TorchRL's
            default); ``False`` keeps ``[]``.
        dynamic_shape: TorchRL's dynamic last dim; steersman's specs have static shapes,
            so only ``False`` is accepted (``True`` raises a ``ValueError``).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs.utils import make_composite_from_td
        >>> td = TensorDict({"obs": torch.zeros(3), "params": {"g": torch.tensor(9.8)}}, [])
        >>> spec = make_composite_from_td(td, unsqueeze_null_shapes=False)
        >>> spec["obs"].shape, spec["params", "g"].shape, spec.is_in(td)
        (torch.Size([3]), torch.Size([]), True)
    """
    if dynamic_shape:
        raise ValueError(
            "make_composite_from_td: dynamic_shape=True is not supported (steersman specs have "
            "static shapes); describe variable-size entries with NonTensor or pad them"
        )
    if not is_tensor_collection(data):
        raise TypeError(f"make_composite_from_td takes a TensorDict, got {type(data).__name__}")
    specs: dict[str, Any] = {}
    for key, val in data.items():
        if is_tensor_collection(val):
            specs[key] = make_composite_from_td(val, unsqueeze_null_shapes=unsqueeze_null_shapes)
        elif isinstance(val, Tensor):
            shape = val.shape if (val.ndim or not unsqueeze_null_shapes) else torch.Size([1])
            specs[key] = Unbounded(shape=shape, dtype=val.dtype, device=val.device)
        else:
            specs[key] = NonTensor(shape=data.batch_size, device=data.device)
    return Composite(specs, shape=data.batch_size, device=data.device)


_EOT = ("done", "terminated", "truncated")


def terminated_or_truncated(
    data: TensorDictBase,
    full_done_spec: Composite | None = None,
    key: NestedKey | None = "_reset",
    write_full_false: bool = False,
) -> bool:
    """ORs the done flags of each level of ``data`` and writes the result at ``key``.

    At the root and in every nested TensorDict holding done flags, the flags (with
    ``full_done_spec``: the leaves the spec declares at that level; otherwise the
    ``"done"``, ``"terminated"`` and ``"truncated"`` entries) are OR-ed together and written
    at ``key`` of that level (``"_reset"`` by default, the partial-reset mask of
    ``env.reset``), in place, when one of them is True or ``write_full_false`` is set. An
    existing entry at ``key`` is kept. ``key=None`` writes nothing.

    Returns: whether any flag is True.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs.utils import terminated_or_truncated
        >>> data = TensorDict({"done": torch.tensor([[True], [False]]),
        ...                    "truncated": torch.tensor([[False], [False]]),
        ...                    "agents": {"done": torch.zeros(2, 1, dtype=torch.bool)}}, [2])
        >>> terminated_or_truncated(data)
        True
        >>> data["_reset"].squeeze(-1).tolist(), "_reset" in data["agents"].keys()
        ([True, False], False)
    """
    def level(td: TensorDictBase, spec: Composite | None) -> bool:
        agg = None
        any_true = False
        if spec is None:
            items = [(k, td.get(k)) for k in td.keys()]
            flags = [v for k, v in items if k in _EOT and isinstance(v, Tensor)]
            subs = [(td.get(k), None) for k, v in items if is_tensor_collection(v)]
        else:
            flags, subs = [], []
            for k, s in spec.items():
                v = td.get(k, None)
                if v is None:
                    continue
                if isinstance(s, Composite):
                    if is_tensor_collection(v):
                        subs.append((v, s))
                elif isinstance(v, Tensor):
                    flags.append(v)
        for v in flags:
            agg = v.bool() if agg is None else agg | v.bool()
        if agg is not None:
            any_true = bool(agg.any())
            if key is not None and (any_true or write_full_false) and td.get(key, None) is None:
                td.set(key, agg)
        for sub, s in subs:
            any_true = level(sub, s) or any_true
        return any_true

    return level(data, full_done_spec)


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


def _check_masked_action(real: TensorDictBase, key: NestedKey, spec: Any, val: Tensor, bdims: int) -> None:
    """Checks the actions of a rollout against the ``"action_mask"`` entry recorded with
    each step (for a ``Categorical`` action spec whose mask changes every step)."""
    from steersman.data import Categorical

    t = (key,) if type(key) is str else key
    mask = real.get((*t[:-1], "action_mask"), None)
    if not isinstance(spec, Categorical) or not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        return
    if mask.shape != (*val.shape, spec.n):
        return
    ok = mask.gather(-1, val.long().clamp(0, spec.n - 1).unsqueeze(-1)).squeeze(-1)
    if not bool(ok.all()):
        idx = tuple(int(i) for i in (~ok).nonzero()[0].tolist())
        raise AssertionError(
            f"check_env_specs: key {_fmt(key)} holds an action the recorded 'action_mask' "
            f"forbids: {int(val[idx])} at index {idx}"
        )


def check_env_specs(
    env: EnvBase,
    return_contiguous: bool = True,
    check_dtype: bool = True,
    seed: int | None = None,
    tensordict: TensorDictBase | None = None,
    max_steps: int = 3,
    break_when_any_done: bool | str = False,
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
        break_when_any_done: the rollout's flag (TorchRL's keyword): False (default)
            auto-resets finished sub-envs, True stops at the first done step, ``"both"``
            runs the check once each way.

    Raises:
        AssertionError: naming the first offending key and what is wrong with it.

    Example:
        >>> from steersman.envs import CartPoleEnv, check_env_specs
        >>> check_env_specs(CartPoleEnv(batch_size=[4]), seed=0)  # silent when the specs hold
    """
    if break_when_any_done == "both":
        for flag in (True, False):
            check_env_specs(env, return_contiguous, check_dtype, seed, tensordict, max_steps, flag)
        return
    if not isinstance(break_when_any_done, bool):
        raise ValueError(f"check_env_specs: break_when_any_done must be a bool or 'both', got {break_when_any_done!r}")
    if seed is not None:
        env.set_seed(seed)
    specs = _leaf_specs(env)
    try:
        real = env.rollout(
            max_steps,
            return_contiguous=return_contiguous,
            tensordict=tensordict,
            auto_reset=True,
            break_when_any_done=break_when_any_done,
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
    expected = set(specs) - set(getattr(env, "_compact_next_keys", ()))
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
        if getattr(spec, "mask", None) is not None:
            # the spec's mask is the current one (the last step's, e.g. ActionMask): the
            # rollout's actions are checked against the unmasked spec, and against the mask
            # observed when each was taken
            _check_masked_action(real, key, spec, val, bdims)
            spec = spec.clone()
            spec.update_mask(None)
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
