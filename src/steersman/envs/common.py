"""``EnvBase``: the interface of every environment (TensorDicts in, TensorDicts out).

A subclass declares its specs in ``__init__`` and implements three methods:

* ``_reset(tensordict) -> TensorDict``: the reset entries (observations, done keys
  set to False) for the whole batch. ``tensordict`` may be None or hold a ``"_reset"``
  bool mask of shape ``[*batch, 1]`` or ``[*batch]``; then only those sub-envs reset.
  Entries of the other sub-envs are overwritten by :meth:`EnvBase.reset` with the
  values of the input (so ``_reset`` may return anything there), unless the class
  sets ``_handles_partial_reset = True`` (it then returns their current values itself).
* ``_step(tensordict) -> TensorDict``: reads the action(s) from ``tensordict`` and
  returns a *new* TensorDict of batch size ``batch_size`` holding the next
  observations, the reward(s) and **every** done key (``done``, ``terminated``,
  ``truncated``, each ``[*batch, 1]`` bool, ``done = terminated | truncated``).
  Nothing is checked or completed on this path: it is the hot path.
* ``_set_seed(seed)``: seeds the env's randomness (batched envs give each sub-env a
  distinct seed derived from ``seed``).

Bootstrapping convention: ``terminated`` ends the return (no bootstrap from the next
value); ``truncated`` (e.g. a time limit) does not.

Helpers for subclasses and wrappers (stable names): ``_reset_mask(td)`` (the validated
``"_reset"`` mask as ``[*batch]`` bool, or None), ``_assert_open()``, ``_close()``
(hook called once by ``close``), ``_step_mdp(td)`` (``step_mdp`` with the env's keys,
precomputed), ``_hot_plan()`` (the keys used on every step: ``action_keys``,
``reward_keys``, ``done_keys``, ``reset_from`` = the ``done`` entries whose OR is the
auto-reset mask), ``_check_action(td)`` (what ``step(check=True)`` runs),
``_action_guard(td)`` (the default-on check of the ``check`` flag, see below), and the
spec Composites ``_full_{observation,action,reward,done,state}_spec``.

Out-of-spec actions: every env refuses them by default (``env.check = True``, a
constructor argument of the built-in envs) with an :class:`InvalidActionError` (a
``ValueError``) naming the env, the action key, the spec and the offending values, and
leaves the env unchanged (state, step counters, RNG). The check costs one reduction per
step and batch (:func:`action_problem`): discrete actions (``Categorical``, ``OneHot``,
``MultiCategorical``, ``MultiOneHot``, ``Binary``, integer ``Bounded``) must be in the
spec; continuous actions must not be NaN, and values outside a ``Bounded`` spec's bounds
are passed on (TorchRL's and Gymnasium's semantics: the env clips or applies them, e.g.
Pendulum clips the torque), use ``step(td, check=True)`` (every spec property, bounds
included) or ``spec.project`` for strict bounds. ``env.check = False`` skips it; it is also
skipped inside ``torch.compile``-traced code. Envs that check inside ``_step`` themselves
(the native and Gymnasium envs) override ``_action_guard`` with a no-op.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from steersman.data import Categorical, Composite, NonTensor, TensorSpec, Unbounded
from steersman.data.specs.base import first_index
from steersman.tensordict import TensorDict, TensorDictBase, lazy_stack
from steersman.tensordict._utils import NestedKey

from ._mdp import _any_done, _step_mdp_fast, _step_mdp_nested, exclusion_tree, next_seed, step_mdp

__all__ = ["EnvBase", "EnvClosedError", "InvalidActionError", "action_problem"]


class EnvClosedError(RuntimeError):
    """Raised when a closed env is reset or stepped.

    Example:
        >>> from steersman.envs import CartPoleEnv, EnvClosedError
        >>> env = CartPoleEnv()
        >>> env.close()
        >>> try:
        ...     env.reset()
        ... except EnvClosedError as err:
        ...     print(str(err).split(":")[0])
        CartPoleEnv is closed
    """


class InvalidActionError(ValueError):
    """Raised by ``step`` for an action outside the env's action spec; the env is unchanged.

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv, InvalidActionError
        >>> env = CartPoleEnv(seed=0)
        >>> td = env.reset()
        >>> td["action"] = torch.tensor(5)
        >>> try:
        ...     env.step(td)
        ... except InvalidActionError as err:
        ...     print(str(err).split(" is outside")[0])
        CartPoleEnv.step: action 'action' = 5
    """


def action_problem(spec: TensorSpec, val: Any) -> str | None:
    """Why ``val`` is not an action ``spec`` allows, or None; one reduction when it is.

    Discrete specs (``Categorical``, ``OneHot``, ``MultiCategorical``, ``MultiOneHot``,
    ``Binary``, integer ``Bounded``/``Unbounded``): the values must be in the spec (range,
    one-hot, mask), and floating values must be whole numbers. Floating specs: no NaN;
    values outside the bounds are allowed (the env clips or applies them, as Gymnasium's
    and TorchRL's envs do). Non-tensor values and shapes are left to the env's ``_step``.

    Example:
        >>> import torch
        >>> from steersman.data import Bounded, Categorical
        >>> from steersman.envs import action_problem
        >>> action_problem(Categorical(2), torch.tensor(1)) is None
        True
        >>> action_problem(Categorical(2), torch.tensor(5))
        '1 of 1 value(s) out of range [0, 2); first at index (): 5'
        >>> action_problem(Bounded(-2.0, 2.0, shape=(1,)), torch.tensor([3.0])) is None
        True
        >>> action_problem(Bounded(-2.0, 2.0, shape=(1,)), torch.tensor([float("nan")]))
        '1 of 1 value(s) are NaN; first at index (0,)'
    """
    if not isinstance(val, Tensor) or isinstance(spec, NonTensor) or spec.dtype is None:
        return None
    floating = val.is_floating_point()
    if spec.dtype.is_floating_point or spec.dtype.is_complex:
        if floating and bool(torch.isnan(val).any()):
            nan = torch.isnan(val)
            return f"{int(nan.sum())} of {nan.numel()} value(s) are NaN; first at index {first_index(nan)}"
        return None
    if val.is_complex():
        return f"complex values (dtype {val.dtype}) for a discrete spec"
    if floating:
        whole = val == torch.trunc(val)
        if not bool(whole.all()):
            i = first_index(~whole)
            return f"value {val[i].item()} at index {i} is not a whole number (the spec is discrete)"
    try:
        spec = spec._on(val.device)
        if spec._values_in(val):
            return None
        return spec._values_report(val) or "invalid values"
    except RuntimeError:  # a shape the spec cannot compare with: the env's _step reports it
        return None


def _show(val: Tensor) -> str:
    """A short rendering of an action's values for error messages."""
    if val.numel() == 1:
        return repr(val.item())
    if val.numel() <= 8:
        return str(val.tolist())
    return f"<tensor of shape {list(val.shape)}>"


def invalid_action(env: EnvBase, key: NestedKey, spec: TensorSpec, val: Tensor, reason: str
                   ) -> InvalidActionError:
    """The :class:`InvalidActionError` of ``env`` for the action ``val`` at ``key``."""
    return InvalidActionError(
        f"{env._label()}.step: action {key!r} = {_show(val)} is outside the action spec {spec!r}: "
        f"{reason}. The env was not stepped (its state is unchanged); spec.project(action) "
        "maps an action into the spec, env.check = False skips this check"
    )


def _as_device(device: Any) -> torch.device:
    if device is None:
        return torch.device("cpu")
    if isinstance(device, int):
        return torch.device("cuda", device)
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _as_batch_size(batch_size: Any) -> torch.Size:
    if batch_size is None:
        return torch.Size(())
    if isinstance(batch_size, int):
        return torch.Size((batch_size,))
    return torch.Size([int(b) for b in batch_size])


def _leaf_keys(spec: Composite) -> list[NestedKey]:
    return list(spec.keys(include_nested=True, leaves_only=True))


def keep_preset_next(preset: TensorDictBase, next_td: TensorDictBase) -> TensorDictBase:
    """Copies into ``next_td`` the entries of ``preset`` (the ``"next"`` a policy wrote before
    the step, e.g. a recurrent state) that the env did not produce; the env's own win.

    TorchRL semantics: a policy may write ``("next", key)``; stepping keeps it.
    """
    if not isinstance(preset, TensorDictBase):
        return next_td
    for key in preset.keys(include_nested=True, leaves_only=True):
        if next_td.get(key, None) is None:
            next_td.set(key, preset.get(key))
    return next_td


class EnvBase:
    """Base class of environments: specs, ``reset``/``step``/``rollout`` on TensorDicts.

    Args:
        device: where the env's tensors live (default CPU).
        batch_size: the env's batch shape (``[]`` for a single env, ``[n]`` for ``n``
            sub-envs, any number of dims).
        check: refuse actions outside the action spec (default True; the attribute
            ``env.check`` can be changed later): see the module docstring.
        run_type_checks: check every ``reset``/``step`` output against the specs (keys,
            shapes, dtypes, values; a ``ValueError`` naming the entry). Off by default:
            it costs a pass over the outputs per step.
        allow_done_after_reset: with ``run_type_checks``, a reset that returns a done
            sub-env is an error unless this is True (TorchRL's keyword).
        spec_locked: lock the spec Composites when they are set (default True; see
            :meth:`set_spec_lock_`).
        auto_reset: TorchRL's self-resetting envs; only False is supported (a
            ``ValueError`` says why): ``step_and_maybe_reset`` resets finished sub-envs.

    Specs (set in the subclass's ``__init__``; every spec's shape starts with
    ``batch_size``): ``observation_spec`` (a :class:`Composite`), ``action_spec`` (a leaf
    spec stored under ``"action"``, or a Composite), ``reward_spec`` (a leaf stored under
    ``"reward"``; default ``Unbounded([*batch, 1])``), ``done_spec`` (a Composite with
    ``done``/``terminated``/``truncated``; default ``Categorical(2, [*batch, 1],
    dtype=bool)`` each) and ``state_spec`` (inputs other than the action; default empty).
    The ``full_*_spec`` properties always return Composites. Specs are locked once set:
    assign a new spec (``env.observation_spec = spec``) to change one.

    Data layout: see ``DESIGN.md``. ``reset()`` returns ``[*batch]`` TensorDicts with the
    observations and done keys; ``step(td)`` reads ``td["action"]`` and writes
    ``td["next"]`` (observations, ``reward [*batch, 1]``, ``done``/``terminated``/
    ``truncated [*batch, 1]``); ``rollout`` stacks steps along a new *last* batch dim.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.data import Bounded, Composite, Unbounded
        >>> from steersman.envs import EnvBase, check_env_specs
        >>> class Counter(EnvBase):
        ...     '''Observation: a counter incremented by the action; done when it exceeds 5.'''
        ...     def __init__(self, batch_size=()):
        ...         super().__init__(batch_size=batch_size)
        ...         bs = self.batch_size
        ...         self.observation_spec = Composite(count=Unbounded((*bs, 1)), shape=bs)
        ...         self.action_spec = Bounded(0.0, 1.0, shape=(*bs, 1))
        ...         self.count = torch.zeros(*bs, 1)
        ...     def _reset(self, td):
        ...         self.count = torch.zeros(*self.batch_size, 1)
        ...         f = torch.zeros(*self.batch_size, 1, dtype=torch.bool)
        ...         return TensorDict({"count": self.count.clone(), "done": f, "terminated": f.clone(),
        ...                            "truncated": f.clone()}, batch_size=self.batch_size)
        ...     def _step(self, td):
        ...         self.count = self.count + td["action"]
        ...         term = self.count > 5
        ...         return TensorDict({"count": self.count.clone(), "reward": td["action"].clone(),
        ...                            "done": term.clone(), "terminated": term,
        ...                            "truncated": torch.zeros_like(term)}, batch_size=self.batch_size)
        ...     def _set_seed(self, seed):
        ...         pass
        >>> env = Counter(batch_size=[2])
        >>> check_env_specs(env)
        >>> td = env.reset()
        >>> td["action"] = torch.ones(2, 1)
        >>> env.step(td)["next", "count"]
        tensor([[1.],
                [1.]])
        >>> env.rollout(3).batch_size   # [*batch, time]
        torch.Size([2, 3])
    """

    #: set True by subclasses whose ``_reset`` returns correct values for the
    #: sub-envs that a partial reset leaves alone (skips the merge in ``reset``).
    _handles_partial_reset: bool = False

    #: False for envs whose batch size comes from the input TensorDict (TorchRL's
    #: ``batch_locked``): ``reset(td)``/``step(td)``/``rollout(tensordict=td)`` then run
    #: on ``td.batch_size`` (which must end with ``batch_size``) and ``rand_action`` draws
    #: one action per entry. A subclass sets ``batch_locked = False`` in its body.
    batch_locked: bool = True
    run_type_checks: bool = False
    allow_done_after_reset: bool = False

    def __init__(self, *, device: Any = None, batch_size: Any = None, check: bool = True,
                 run_type_checks: bool = False, allow_done_after_reset: bool = False,
                 spec_locked: bool = True, auto_reset: bool = False) -> None:
        if auto_reset:
            raise ValueError(
                f"{type(self).__name__}: auto_reset=True (an env that resets itself inside step) is "
                "not supported; finished sub-envs are reset by step_and_maybe_reset, which rollout "
                "and the collectors use"
            )
        self.check = bool(check)
        self.run_type_checks = bool(run_type_checks)
        self.allow_done_after_reset = bool(allow_done_after_reset)
        self._device = _as_device(device)
        self._batch_size = _as_batch_size(batch_size)
        self._is_closed = False
        self._spec_locked = bool(spec_locked)
        self._plan: dict | None = None
        bs = self._batch_size
        dev = self._device
        defaults = [Composite(shape=bs, device=dev), Composite(shape=bs, device=dev),
                    Composite(shape=bs, device=dev),
                    Composite(reward=Unbounded((*bs, 1), device=dev), shape=bs, device=dev),
                    self._default_done_spec()]
        for spec in defaults:
            spec.lock_() if self._spec_locked else spec.unlock_()
        (self._full_observation_spec, self._full_action_spec, self._full_state_spec,
         self._full_reward_spec, self._full_done_spec) = defaults

    def _default_done_spec(self) -> Composite:
        bs = self._batch_size
        leaf = Categorical(2, shape=(*bs, 1), device=self._device, dtype=torch.bool)
        return Composite(
            done=leaf, terminated=leaf.clone(), truncated=leaf.clone(), shape=bs, device=self._device
        ).lock_()

    # ------------------------------------------------------------------ basic properties
    @property
    def batch_size(self) -> torch.Size:
        """The batch shape of the env (``[]`` for a single env)."""
        return self._batch_size

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def is_closed(self) -> bool:
        return self._is_closed

    def numel(self) -> int:
        """The number of sub-envs (the product of ``batch_size``)."""
        return self._batch_size.numel()

    # ------------------------------------------------------------------ specs
    def _check_spec_shape(self, spec: TensorSpec, what: str) -> TensorSpec:
        bs = self._batch_size
        if isinstance(spec, Composite) and spec.shape != bs:
            if len(spec.shape) == 0 and all(
                s.shape[: len(bs)] == bs for s in spec.values(include_nested=True, leaves_only=True)
            ):
                spec = spec.clone()
                spec.shape = bs  # an unbatched Composite of batched leaves: adopt the batch
            else:
                raise ValueError(
                    f"{type(self).__name__}.{what}: the Composite has shape {list(spec.shape)}, "
                    f"expected the env batch size {list(bs)} (Composite(..., shape={list(bs)}))"
                )
        if spec.shape[: len(bs)] != bs:
            raise ValueError(
                f"{type(self).__name__}.{what}: spec shape {list(spec.shape)} does not start with the "
                f"env batch size {list(bs)}; use spec.expand(*{list(bs)}, *{list(spec.shape)})"
            )
        if spec.device is not None and spec.device != self._device:
            spec = spec.to(self._device)
        return spec

    def _wrap_leaf(self, spec: TensorSpec, key: str, what: str) -> Composite:
        if isinstance(spec, Composite):
            out = self._check_spec_shape(spec, what)
        elif isinstance(spec, TensorSpec):
            spec = self._check_spec_shape(spec, what)
            out = Composite({key: spec}, shape=self._batch_size, device=self._device)
        else:
            raise TypeError(f"{type(self).__name__}.{what} must be a TensorSpec, got {type(spec).__name__}")
        return out

    def _store(self, attr: str, spec: Composite) -> None:
        if self._spec_locked:
            spec.lock_()
        setattr(self, attr, spec)
        self._plan = None

    @property
    def full_observation_spec(self) -> Composite:
        """All observation entries (a Composite of shape ``batch_size``)."""
        return self._full_observation_spec

    @full_observation_spec.setter
    def full_observation_spec(self, spec: Composite) -> None:
        if not isinstance(spec, Composite):
            raise TypeError(
                f"{type(self).__name__}.observation_spec must be a Composite, e.g. "
                f"Composite(observation=spec, shape={list(self._batch_size)}); got {type(spec).__name__}"
            )
        self._store("_full_observation_spec", self._check_spec_shape(spec, "observation_spec"))

    observation_spec = full_observation_spec

    @property
    def full_action_spec(self) -> Composite:
        """All action entries (a Composite of shape ``batch_size``)."""
        return self._full_action_spec

    @full_action_spec.setter
    def full_action_spec(self, spec: TensorSpec) -> None:
        self._store("_full_action_spec", self._wrap_leaf(spec, "action", "action_spec"))

    @property
    def action_spec(self) -> TensorSpec:
        """The action spec: the leaf spec if there is one action entry, else the Composite."""
        return self._single_leaf(self._full_action_spec)

    @action_spec.setter
    def action_spec(self, spec: TensorSpec) -> None:
        self.full_action_spec = spec

    @property
    def full_reward_spec(self) -> Composite:
        return self._full_reward_spec

    @full_reward_spec.setter
    def full_reward_spec(self, spec: TensorSpec) -> None:
        self._store("_full_reward_spec", self._wrap_leaf(spec, "reward", "reward_spec"))

    @property
    def reward_spec(self) -> TensorSpec:
        """The reward spec: the leaf spec if there is one reward entry, else the Composite."""
        return self._single_leaf(self._full_reward_spec)

    @reward_spec.setter
    def reward_spec(self, spec: TensorSpec) -> None:
        self.full_reward_spec = spec

    @property
    def full_done_spec(self) -> Composite:
        """The done entries (``done``, ``terminated``, ``truncated``), a Composite."""
        return self._full_done_spec

    @full_done_spec.setter
    def full_done_spec(self, spec: TensorSpec) -> None:
        if isinstance(spec, Composite):
            spec = self._check_spec_shape(spec, "done_spec")
        elif isinstance(spec, TensorSpec):
            leaf = self._check_spec_shape(spec, "done_spec")
            spec = Composite(
                done=leaf, terminated=leaf.clone(), truncated=leaf.clone(),
                shape=self._batch_size, device=self._device,
            )
        else:
            raise TypeError(f"done_spec must be a TensorSpec, got {type(spec).__name__}")
        self._store("_full_done_spec", spec)

    done_spec = full_done_spec

    @property
    def full_state_spec(self) -> Composite:
        """Inputs of ``step``/``reset`` other than the action (empty for stateful envs)."""
        return self._full_state_spec

    @full_state_spec.setter
    def full_state_spec(self, spec: Composite) -> None:
        if not isinstance(spec, Composite):
            raise TypeError(f"state_spec must be a Composite, got {type(spec).__name__}")
        self._store("_full_state_spec", self._check_spec_shape(spec, "state_spec"))

    state_spec = full_state_spec

    @property
    def input_spec(self) -> Composite:
        """``Composite(full_action_spec=..., full_state_spec=...)`` (built on access)."""
        return Composite._new_unchecked(
            {"full_action_spec": self._full_action_spec, "full_state_spec": self._full_state_spec},
            self._batch_size, self._device,
        )

    @property
    def output_spec(self) -> Composite:
        """``Composite(full_observation_spec=..., full_reward_spec=..., full_done_spec=...)``."""
        return Composite._new_unchecked(
            {
                "full_observation_spec": self._full_observation_spec,
                "full_reward_spec": self._full_reward_spec,
                "full_done_spec": self._full_done_spec,
            },
            self._batch_size, self._device,
        )

    @property
    def specs(self) -> Composite:
        """``Composite(output_spec=..., input_spec=...)``: every spec of the env, as
        TorchRL's ``env.specs`` (built on access)."""
        return Composite._new_unchecked(
            {"output_spec": self.output_spec, "input_spec": self.input_spec},
            self._batch_size, self._device,
        )

    @staticmethod
    def _single_leaf(spec: Composite) -> TensorSpec:
        keys = _leaf_keys(spec)
        if len(keys) == 1:
            return spec[keys[0]]
        return spec

    def set_spec_lock_(self, mode: bool = True) -> EnvBase:
        """Locks (default) or unlocks the spec Composites for in-place edits.

        Specs are locked when set; unlock to edit one in place, then lock again so that
        the keys cached for the hot path are recomputed.
        """
        for attr in ("_full_observation_spec", "_full_action_spec", "_full_state_spec",
                     "_full_reward_spec", "_full_done_spec"):
            spec = getattr(self, attr)
            spec.lock_() if mode else spec.unlock_()
        self._spec_locked = mode
        self._plan = None
        return self

    # ------------------------------------------------------------------ keys
    @property
    def action_keys(self) -> list[NestedKey]:
        return _leaf_keys(self._full_action_spec)

    @property
    def action_key(self) -> NestedKey:
        """The action key (an error if there are several: use ``action_keys``)."""
        return self._single_key(self.action_keys, "action")

    @property
    def reward_keys(self) -> list[NestedKey]:
        return _leaf_keys(self._full_reward_spec)

    @property
    def reward_key(self) -> NestedKey:
        return self._single_key(self.reward_keys, "reward")

    @property
    def done_keys(self) -> list[NestedKey]:
        return _leaf_keys(self._full_done_spec)

    @property
    def observation_keys(self) -> list[NestedKey]:
        return _leaf_keys(self._full_observation_spec)

    @property
    def state_keys(self) -> list[NestedKey]:
        return _leaf_keys(self._full_state_spec)

    def _single_key(self, keys: list, what: str) -> NestedKey:
        if len(keys) != 1:
            raise KeyError(
                f"{type(self).__name__} has {len(keys)} {what} keys ({keys}); use {what}_keys"
            )
        return keys[0]

    def _hot_plan(self) -> dict:
        """Keys used on every step, computed once per spec assignment."""
        plan = self._plan
        if plan is not None:
            return plan
        action_keys = self.action_keys
        reward_keys = self.reward_keys
        done_keys = self.done_keys
        # a root "done" decides resets when there is one (a group's done may end one agent only:
        # multi-agent envs whose agents die mid-episode); otherwise every "done" entry does
        done_only = (["done"] if "done" in done_keys
                     else [k for k in done_keys if (k if type(k) is str else k[-1]) == "done"] or done_keys)
        # an empty Composite of the reward spec (no leaves) is a reward entry too: step_mdp
        # must not carry it to the root (the reset output has no such entry)
        empty_rewards = [k for k, s in self._full_reward_spec.items(include_nested=True)
                         if isinstance(s, Composite) and not _leaf_keys(s)]
        reward_like = [*reward_keys, *empty_rewards]
        excl_root = ["next", "_reset", *action_keys, *reward_like]
        simple = all(type(k) is str for k in excl_root)
        checked = [(k, s) for k, s in self._full_action_spec.items(include_nested=True, leaves_only=True)
                   if not isinstance(s, NonTensor)]
        plan = {
            "done_complete": False,
            "action_keys": action_keys,
            "checked_actions": checked,
            "reward_keys": reward_keys,
            "done_keys": done_keys,
            "reset_from": done_only,
            "fast_mdp": simple,
            "excl_root": frozenset(excl_root),
            "excl_next": frozenset(reward_like),
            "mdp_trees": None if simple else (exclusion_tree(excl_root), exclusion_tree(reward_like)),
            "mdp_reward_keys": reward_like,
        }
        if self._spec_locked:
            self._plan = plan
        return plan

    def _step_mdp(self, td: TensorDictBase) -> TensorDictBase:
        plan = self._hot_plan()
        if type(td) is TensorDict:
            if plan["fast_mdp"]:
                return _step_mdp_fast(td, plan["excl_root"], plan["excl_next"])
            out = _step_mdp_nested(td, *plan["mdp_trees"])
            if out is not None:
                return out
        return step_mdp(
            td, reward_keys=plan["mdp_reward_keys"], done_keys=plan["done_keys"],
            action_keys=plan["action_keys"],
        )

    # ------------------------------------------------------------------ to implement
    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        raise NotImplementedError(f"{type(self).__name__} must implement _reset(tensordict)")

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        raise NotImplementedError(f"{type(self).__name__} must implement _step(tensordict)")

    def _set_seed(self, seed: int | None) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement _set_seed(seed)")

    # ------------------------------------------------------------------ lifecycle
    def _assert_open(self) -> None:
        if self._is_closed:
            raise EnvClosedError(
                f"{type(self).__name__} is closed: it cannot be reset or stepped any more; "
                "create a new env"
            )

    def close(self) -> None:
        """Releases the env's resources. Idempotent; a closed env cannot be stepped."""
        if self._is_closed:
            return
        self._is_closed = True
        self._close()

    def _close(self) -> None:
        """Subclass hook called once by ``close``."""

    def __enter__(self) -> EnvBase:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def to(self, device: Any) -> EnvBase:
        """Moves the specs to ``device`` and returns ``self``; subclasses with tensors of
        their own override it (calling ``super().to(device)``) to move them too."""
        device = _as_device(device)
        if device == self._device:
            return self
        for attr in ("_full_observation_spec", "_full_action_spec", "_full_state_spec",
                     "_full_reward_spec", "_full_done_spec"):
            spec = getattr(self, attr).to(device)
            if self._spec_locked:
                spec.lock_()
            setattr(self, attr, spec)
        self._device = device
        self._plan = None
        return self

    # ------------------------------------------------------------------ seeding
    def set_seed(self, seed: int | None = None, static_seed: bool = False) -> int | None:
        """Seeds the env; returns the seed to use for the next env (``next_seed(seed)``).

        A batched env gives each sub-env a distinct seed derived from ``seed``, so the
        same seed reproduces the same rollout. With ``static_seed=True`` the same seed
        is returned.
        """
        self._set_seed(seed)
        if seed is None or static_seed:
            return seed
        return next_seed(seed)

    # ------------------------------------------------------------------ reset
    def _reset_mask(self, tensordict: TensorDictBase | None) -> Tensor | None:
        """The ``"_reset"`` entry of ``tensordict`` as a ``[*batch]`` bool tensor (or None)."""
        if tensordict is None:
            return None
        mask = tensordict.get("_reset", None)
        if mask is None:
            return None
        bs = self._batch_size if self.batch_locked else tensordict.batch_size
        if not isinstance(mask, Tensor) or mask.dtype is not torch.bool:
            raise ValueError(
                f"{type(self).__name__}.reset: the '_reset' mask must be a bool tensor of shape "
                f"{[*bs, 1]} or {list(bs)}, got {getattr(mask, 'dtype', type(mask).__name__)}"
            )
        if mask.shape == (*bs, 1):
            return mask.reshape(bs)
        if mask.shape == bs:
            return mask
        raise ValueError(
            f"{type(self).__name__}.reset: the '_reset' mask has shape {list(mask.shape)}, "
            f"expected {[*bs, 1]} or {list(bs)} (one flag per sub-env)"
        )

    def reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        """Resets the env (or only the sub-envs flagged by ``tensordict["_reset"]``).

        Args:
            tensordict: optional input. If it holds a ``"_reset"`` bool mask
                (``[*batch, 1]`` or ``[*batch]``), only the flagged sub-envs are reset
                and the entries of the others are returned unchanged.
            **kwargs: passed to ``_reset``.

        Returns: a new TensorDict of batch size ``batch_size``: the input's entries
        (without ``"_reset"``) updated with the reset observations and done keys. Done
        entries of the done spec that ``_reset`` leaves out are added as False (as in
        TorchRL, a ``_reset`` may return only the observations).
        """
        self._assert_open()
        mask = self._reset_mask(tensordict)
        out = self._reset(tensordict, **kwargs)
        self._complete_done(out)
        if self.run_type_checks:
            self._type_check(out, "reset", (self._full_observation_spec, self._full_done_spec))
            if not self.allow_done_after_reset:
                done = _any_done(out, self._hot_plan()["reset_from"], out.batch_dims)
                if done is not None and bool(done.any()) and (mask is None or bool(done[mask].any())):
                    raise RuntimeError(
                        f"{type(self).__name__}.reset returned a done sub-env; pass "
                        "allow_done_after_reset=True if the env can be done right after a reset"
                    )
        if tensordict is None:
            return out
        base = tensordict.exclude("_reset") if "_reset" in tensordict.keys() else tensordict.copy()
        if mask is None or self._handles_partial_reset:
            base.update(out)
            return base
        nb = len(mask.shape)
        for key in out.keys(include_nested=True, leaves_only=True):
            new = out.get(key)
            old = base.get(key, None)
            if isinstance(new, Tensor) and isinstance(old, Tensor) and old.shape == new.shape:
                m = mask.reshape(tuple(mask.shape) + (1,) * (new.ndim - nb))
                new = torch.where(m, new, old)
            base.set(key, new)
        return base

    # ------------------------------------------------------------------ step
    def _check_action(self, tensordict: TensorDictBase) -> None:
        """Validates every action entry against the action spec (``step(check=True)``)."""
        for key, spec in self._full_action_spec.items(include_nested=True, leaves_only=True):
            val = tensordict.get(key, None)
            if val is None:
                raise KeyError(f"{type(self).__name__}.step: the tensordict has no action entry {key!r}")
            if not isinstance(val, Tensor) or val.shape != spec.shape:
                raise ValueError(
                    f"{type(self).__name__}.step: action {key!r} has shape "
                    f"{list(getattr(val, 'shape', []))}, the action spec {spec!r} has shape {list(spec.shape)}"
                )
            reason = spec._check(val)
            if reason is not None:
                raise invalid_action(self, key, spec, val, reason)

    def _label(self) -> str:
        """How error messages name this env."""
        return type(self).__name__

    def _action_guard(self, tensordict: TensorDictBase) -> None:
        """Raises :class:`InvalidActionError` if an action entry is outside its spec
        (:func:`action_problem`), when ``self.check`` is on; called by ``step`` before
        ``_step``. Envs that check in ``_step`` themselves override it with a no-op."""
        if not self.check or torch.compiler.is_compiling():
            return
        for key, spec in self._hot_plan()["checked_actions"]:
            val = tensordict.get(key, None)
            reason = action_problem(spec, val)
            if reason is not None:
                raise invalid_action(self, key, spec, val, reason)

    def step(self, tensordict: TensorDictBase, check: bool = False) -> TensorDictBase:
        """Takes one step with the action(s) in ``tensordict``; writes ``tensordict["next"]``.

        Args:
            tensordict: holds the action(s) (and state entries, for stateless envs).
            check: validate the action against every property of ``action_spec`` first
                (shape, dtype kind, continuous bounds too). Independently, with
                ``env.check`` on (the default) out-of-spec actions are refused (see the
                module docstring).

        Raises:
            InvalidActionError: an action outside the action spec (the env is unchanged).

        Returns: ``tensordict`` itself, with a new ``"next"`` entry.
        """
        if self._is_closed:
            self._assert_open()
        if check:
            self._check_action(tensordict)
        self._action_guard(tensordict)
        next_td = self._step(tensordict)
        plan = self._plan
        if plan is None or not plan["done_complete"]:
            self._complete_done(next_td, True)
        if self.run_type_checks:
            self._type_check(next_td, "step", (self._full_observation_spec, self._full_reward_spec,
                                                self._full_done_spec))
        if type(tensordict) is TensorDict:
            root = tensordict.entries
            if "next" in root:
                keep_preset_next(root["next"], next_td)
            root["next"] = next_td
        else:
            preset = tensordict.get("next", None)
            if preset is not None:
                keep_preset_next(preset, next_td)
            tensordict.set("next", next_td)
        return tensordict

    def _type_check(self, data: TensorDictBase, what: str, specs: tuple) -> None:
        """``run_type_checks``: every entry of ``specs`` is in ``data`` with the spec's
        shape (after ``data``'s extra leading dims), dtype and values."""
        lead = data.batch_dims - len(self._batch_size)
        for composite in specs:
            for key, spec in composite.items(include_nested=True, leaves_only=True):
                val = data.get(key, None)
                if not isinstance(val, Tensor):
                    if val is None:
                        raise ValueError(f"{type(self).__name__}.{what}: output has no entry {key!r}")
                    continue
                problem = None
                if tuple(val.shape[lead:]) != tuple(spec.shape):
                    problem = f"shape {list(val.shape)}, the spec has {list(spec.shape)}"
                elif spec.dtype is not None and val.dtype != spec.dtype:
                    problem = f"dtype {val.dtype}, the spec has {spec.dtype}"
                elif not spec.is_in(val):
                    problem = spec._check(val) or "values outside the spec"
                if problem is not None:
                    raise ValueError(f"{type(self).__name__}.{what} (run_type_checks): entry {key!r} has {problem}")

    def _complete_done(self, data: TensorDictBase, from_step: bool = False) -> TensorDictBase:
        """Adds the done entries of the done spec that ``data`` (a ``_reset`` or ``_step``
        output) lacks, in place: ``terminated`` from ``done`` (``done & ~truncated`` if
        ``truncated`` is there), ``done`` from ``terminated | truncated``, anything else
        False; done entries of shape ``[*batch]`` are reshaped to the spec's
        ``[*batch, 1]``. Once a step brings every done entry, later steps skip this.

        TorchRL refuses ``done`` + ``truncated`` without ``terminated``; here
        ``terminated = done & ~truncated``, what the three flags mean.
        """
        plan = self._hot_plan()
        keys = plan["done_keys"]
        if not keys:
            return data
        if all(type(k) is str for k in keys) and all(data.get(k, None) is not None for k in keys):
            if from_step and plan is self._plan:
                plan["done_complete"] = True
            return data
        nb = len(self._batch_size)
        lead = data.batch_size[: data.batch_dims - nb]
        spec = self._full_done_spec
        groups: dict[tuple, list[str]] = {}
        for k in keys:
            t = (k,) if type(k) is str else k
            groups.setdefault(t[:-1], []).append(t[-1])

        def key(prefix: tuple, name: str) -> NestedKey:
            return name if not prefix else (*prefix, name)

        filled = False
        for prefix, names in groups.items():
            have = {}
            for n in names:
                v = data.get(key(prefix, n), None)
                if isinstance(v, Tensor):
                    want = (*lead, *spec[key(prefix, n)].shape)
                    if v.shape != want and v.numel() == torch.Size(want).numel():
                        v = v.reshape(want)
                        data.set(key(prefix, n), v)
                        filled = True
                    have[n] = v
            if len(have) == len(names):
                continue
            filled = True
            d, te, tr = have.get("done"), have.get("terminated"), have.get("truncated")
            if "terminated" in names and te is None and d is not None:
                te = d & ~tr if tr is not None else d.clone()
                data.set(key(prefix, "terminated"), te)
                have["terminated"] = te
            if "done" in names and d is None and (te is not None or tr is not None):
                d = te | tr if te is not None and tr is not None else (te if tr is None else tr).clone()
                data.set(key(prefix, "done"), d)
                have["done"] = d
            for n in names:
                if n not in have:
                    data.set(key(prefix, n), spec[key(prefix, n)].zero(lead))
        if from_step and not filled and plan is self._plan:
            plan["done_complete"] = True
        return data

    def step_and_maybe_reset(
        self, tensordict: TensorDictBase
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """Steps, then resets the sub-envs that are done.

        Returns: ``(tensordict, next_input)``: the transition (with ``"next"``) and the
        input of the following step (``step_mdp`` of it, with the finished sub-envs
        reset; the others carry on).
        """
        tensordict = self.step(tensordict)
        td_ = self._step_mdp(tensordict)
        if self._post_mdp_hooks:
            self._run_post_mdp_hooks(tensordict)
        plan = self._hot_plan()
        nb = len(self._batch_size) if self.batch_locked else td_.batch_dims
        done = _any_done(td_, plan["reset_from"], nb)
        if done is not None and bool(done.any()):
            td_ = td_.copy()
            td_.set("_reset", done.unsqueeze(-1))
            td_ = self.reset(td_)
        return tensordict, td_

    #: transforms whose ``_post_step_mdp(transition)`` runs on each transition once
    #: ``step_mdp`` has built the next input (e.g. NextObservationDelta drops full next entries)
    _post_mdp_hooks: tuple = ()

    def _run_post_mdp_hooks(self, transition: TensorDictBase) -> None:
        for hook in self._post_mdp_hooks:
            hook._post_step_mdp(transition)

    @property
    def _compact_next_keys(self) -> list:
        """The ``("next", k)`` entries removed from transitions by the post-``step_mdp`` hooks."""
        return [("next", *((k,) if isinstance(k, str) else k)) for h in self._post_mdp_hooks for k in h.in_keys]

    # ------------------------------------------------------------------ random actions
    def rand_action(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        """Writes a random action (``action_spec.rand()``, torch's global RNG) into ``tensordict``."""
        if tensordict is None:
            tensordict = TensorDict.from_trusted({}, self._batch_size, self._device)
        lead = None
        if not self.batch_locked:  # one action per entry of the input's extra leading dims
            lead = tensordict.batch_size[: tensordict.batch_dims - len(self._batch_size)]
        for key, spec in self._full_action_spec.items(include_nested=True, leaves_only=True):
            tensordict.set(key, spec.rand(lead))
        return tensordict

    def rand_step(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        """A step with a random action (``rand_action`` then ``step``)."""
        if tensordict is None:
            tensordict = TensorDict.from_trusted({}, self._batch_size, self._device)
        return self.step(self.rand_action(tensordict))

    # ------------------------------------------------------------------ fake data
    def fake_tensordict(self) -> TensorDictBase:
        """A TensorDict shaped like one transition, filled from the specs' ``zero()``."""
        td = self._full_observation_spec.zero()
        td.update(self._full_state_spec.zero())
        td.update(self._full_action_spec.zero())
        td.update(self._full_done_spec.zero())
        nxt = self._full_observation_spec.zero()
        nxt.update(self._full_reward_spec.zero())
        nxt.update(self._full_done_spec.zero())
        td.set("next", nxt)
        return td

    # ------------------------------------------------------------------ rollout
    def rollout(
        self,
        max_steps: int,
        policy: Callable[[TensorDictBase], TensorDictBase] | None = None,
        callback: Callable[[EnvBase, TensorDictBase], Any] | None = None,
        *,
        auto_reset: bool = True,
        break_when_any_done: bool = True,
        break_when_all_done: bool = False,
        return_contiguous: bool = True,
        tensordict: TensorDictBase | None = None,
        set_truncated: bool = False,
    ) -> TensorDictBase:
        """Runs ``policy`` for up to ``max_steps`` steps; stacks them along a new last batch dim.

        Args:
            max_steps: the number of steps.
            policy: ``td -> td`` writing the action(s); default: ``rand_action``.
            callback: called as ``callback(env, td)`` after each step.
            auto_reset: reset first (with ``tensordict`` as reset input if given);
                otherwise ``tensordict`` is the first step's input.
            break_when_any_done: stop after the first step where any sub-env is done.
            break_when_all_done: (with ``break_when_any_done=False``) stop once every
                sub-env has been done; the entries of a sub-env after its end repeat its
                last transition (the env keeps stepping it: there is no partial step).
            return_contiguous: stack densely (else a lazy stack).
            tensordict: see ``auto_reset``.
            set_truncated: mark the last step as truncated (and done).

        When neither break flag is set, finished sub-envs are reset in place
        (``step_and_maybe_reset``) and the rollout always has ``max_steps`` steps.

        Returns: a TensorDict of batch size ``[*batch_size, steps]``.
        """
        if max_steps < 1:
            raise ValueError(f"rollout: max_steps must be >= 1, got {max_steps}")
        if auto_reset:
            td = self.reset(tensordict)
        else:
            if tensordict is None:
                raise ValueError("rollout(auto_reset=False) needs the first step's input as `tensordict`")
            td = tensordict
            rewards = [k for k in self.reward_keys if k in td.keys(True)]
            if rewards:  # e.g. the "next" of a previous rollout's last step: rewards are not inputs
                td = td.exclude(*rewards)
        if policy is None:
            policy = self.rand_action
        nb = len(self._batch_size) if self.batch_locked else td.batch_dims
        tds: list[TensorDictBase] = []
        stop_early = break_when_any_done or break_when_all_done
        reset_from = self._hot_plan()["reset_from"]
        finished: Tensor | None = None
        for i in range(max_steps):
            out = policy(td)
            if out is not None:
                td = out
            if stop_early:
                td = self.step(td)
                keep = td
                if finished is not None and bool(finished.any()):
                    keep = td.where(~finished, tds[-1]) if nb else tds[-1]
                tds.append(keep)
                if callback is not None:
                    callback(self, td)
                if i == max_steps - 1:
                    if self._post_mdp_hooks:
                        self._run_post_mdp_hooks(td)
                    break
                nxt_td = self._step_mdp(td)
                if self._post_mdp_hooks:
                    self._run_post_mdp_hooks(td)
                td = nxt_td
                done = _any_done(td, reset_from, nb)
                if done is None:
                    continue
                if break_when_any_done:
                    if bool(done.any()):
                        break
                else:
                    finished = done if finished is None else finished | done
                    if bool(finished.all()):
                        break
            else:
                cur, td = self.step_and_maybe_reset(td)
                tds.append(cur)
                if callback is not None:
                    callback(self, cur)
        if set_truncated:
            last = tds[-1]
            nxt = last.get("next")
            for key in ("truncated", "done"):
                v = nxt.get(key, None)
                if v is not None:
                    nxt.set(key, torch.ones_like(v))
        if return_contiguous:
            return torch.stack(tds, dim=nb)
        return lazy_stack(tds, dim=nb)

    # ------------------------------------------------------------------ repr
    def __repr__(self) -> str:
        def ind(s: Any) -> str:
            return str(s).replace("\n", "\n    ")

        return (
            f"{type(self).__name__}(\n"
            f"    observation_spec={ind(self._full_observation_spec)},\n"
            f"    action_spec={ind(self.action_spec)},\n"
            f"    reward_spec={ind(self.reward_spec)},\n"
            f"    done_keys={self.done_keys},\n"
            f"    device={self._device},\n"
            f"    batch_size={self._batch_size})"
        )

