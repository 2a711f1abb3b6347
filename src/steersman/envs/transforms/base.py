"""``Transform``, ``Compose`` and ``TransformedEnv``.

A transform is an ``nn.Module`` that changes what an env emits (observations, rewards,
done flags: :meth:`Transform._call` / :meth:`Transform._step` / :meth:`Transform._reset`)
and what it receives (actions, states: :meth:`Transform._inv_call`), and says how its
specs change (``transform_*_spec``), so that ``check_env_specs`` holds on the
transformed env. The same transform applies to a TensorDict outside any env with
``transform(td)`` (e.g. replay-buffer samples).

Key conventions (TorchRL's): ``in_keys`` are read from the env's outputs and the results
are written at ``out_keys`` (default: the same keys). For the inverse direction,
``out_keys_inv`` are the keys the policy writes and ``in_keys_inv`` the keys the wrapped
env reads: ``_inv_call`` reads ``out_keys_inv`` and writes ``in_keys_inv``.

Transforms run on every step: everything that depends only on the specs (keys, which
pairs exist at reset, buffers) is computed once, when the transformed env computes its
specs, never per step.
"""

from __future__ import annotations

import copy
import functools
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from steersman.data import Composite, TensorSpec
from steersman.tensordict import TensorDict, TensorDictBase, is_tensor_collection
from steersman.tensordict._utils import NestedKey

from ..common import EnvBase, keep_preset_next
from ._utils import key_list, leaf_keys, missing_key, missing_spec_key

__all__ = ["Transform", "ObservationTransform", "Compose", "TransformedEnv", "_apply_to_composite"]

_OUTPUT_PARTS = ("full_observation_spec", "full_reward_spec", "full_done_spec")
_INPUT_PARTS = ("full_action_spec", "full_state_spec")


def _pairs(owner: Transform, ins: list, outs: list, what: str) -> list[tuple[NestedKey, NestedKey]]:
    if len(ins) != len(outs):
        raise ValueError(
            f"{type(owner).__name__}: {what} have different lengths ({len(ins)} in, {len(outs)} out): "
            f"{ins} -> {outs}"
        )
    return list(zip(ins, outs))


def _apply_to_composite(fn: Callable[[Any, TensorSpec], TensorSpec]) -> Callable[[Any, Composite], Composite]:
    """Turns a per-key ``transform_*_spec(self, leaf_spec) -> leaf_spec`` into one on the
    Composite: the result of each ``in_keys`` entry's spec is stored at its ``out_keys``
    entry (TorchRL's decorator of the same name, for custom transforms).

    Example:
        >>> import torch
        >>> from steersman.data import Bounded
        >>> from steersman.envs import PendulumEnv, TransformedEnv, check_env_specs
        >>> from steersman.envs.transforms import Transform, _apply_to_composite
        >>> class Sin(Transform):
        ...     def _apply_transform(self, x):
        ...         return x.sin()
        ...     def _reset(self, td, td_reset):
        ...         return self._call(td_reset)
        ...     @_apply_to_composite
        ...     def transform_observation_spec(self, spec):
        ...         return Bounded(-1.0, 1.0, shape=spec.shape, dtype=spec.dtype)
        >>> env = TransformedEnv(PendulumEnv(seed=0), Sin(in_keys=["observation"], out_keys=["sin"]))
        >>> check_env_specs(env)
    """

    @functools.wraps(fn)
    def wrapper(self: Transform, spec: Composite) -> Composite:
        if not isinstance(spec, Composite):
            return fn(self, spec)
        for ik, ok in self._pairs:
            leaf = spec.get(ik, None)
            if leaf is None or isinstance(leaf, Composite):
                continue
            spec.set(ok, fn(self, leaf))
        return spec

    return wrapper


class Transform(nn.Module):
    """Base class of transforms: modules from TensorDict to TensorDict that also map specs.

    Args:
        in_keys: keys read from the env's outputs (or from the TensorDict in ``forward``).
        out_keys: where the results are written (default: ``in_keys``).
        in_keys_inv: keys the wrapped env reads (inverse direction, e.g. ``"action"``).
        out_keys_inv: keys the policy writes (default: ``in_keys_inv``).

    A key-wise transform only implements :meth:`_apply_transform` (a tensor to a
    tensor), :meth:`_transform_spec_leaf` (the spec of the result) and, for inverse keys,
    :meth:`_inv_apply_transform` / :meth:`_transform_inv_spec_leaf`. Other transforms
    override the hooks:

    * ``_call(td) -> td``: the step outputs (``"next"`` content) and, in ``forward``,
      any TensorDict.
    * ``_step(td, next_td) -> next_td``: the step, with the root TensorDict ``td`` (the
      state where the action was taken); default ``_call(next_td)``.
    * ``_reset(td, td_reset) -> td_reset``: the reset outputs; ``td`` holds the reset
      input (a ``"_reset"`` mask for partial resets); default: unchanged
      (:class:`ObservationTransform` applies ``_call``).
    * ``_inv_call(td) -> td``: the input of the wrapped env (actions, states).
    * ``transform_observation_spec``, ``transform_reward_spec``, ``transform_done_spec``
      (Composites), or ``transform_output_spec`` for all three at once;
      ``transform_action_spec``, ``transform_state_spec`` or ``transform_input_spec``.

    ``parent`` is the env up to this transform (the base env with the transforms before
    it), ``container`` the Compose or env holding it; both are None outside an env.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs import CartPoleEnv, check_env_specs
        >>> from steersman.envs.transforms import Transform, TransformedEnv
        >>> class Double(Transform):
        ...     def _apply_transform(self, x):
        ...         return x * 2
        ...     def _reset(self, td, td_reset):
        ...         return self._call(td_reset)
        ...     def _transform_spec_leaf(self, spec, key):
        ...         return spec.__class__(spec.low * 2, spec.high * 2, shape=spec.shape, dtype=spec.dtype)
        >>> env = TransformedEnv(CartPoleEnv(batch_size=[2], seed=0), Double(in_keys=["observation"]))
        >>> check_env_specs(env)
        >>> Double(in_keys=["x"])(TensorDict(x=torch.ones(3), batch_size=[3]))["x"]  # forward
        tensor([2., 2., 2.])
    """

    #: the transforms that implement ``_call`` per key set this to False to skip the
    #: check that every in_key is in the output specs.
    _check_spec_in_keys: bool = True

    def __init__(
        self,
        in_keys: Any = None,
        out_keys: Any = None,
        in_keys_inv: Any = None,
        out_keys_inv: Any = None,
    ) -> None:
        super().__init__()
        d = self.__dict__
        d["_container_ref"] = None
        d["_parent_cache"] = None
        d["_pairs_cache"] = None
        d["_pairs_inv_cache"] = None
        d["_reset_pairs"] = None
        d["_out_default"] = True
        d["_out_inv_default"] = True
        self.in_keys = in_keys
        if out_keys is not None:
            self.out_keys = out_keys
        self.in_keys_inv = in_keys_inv
        if out_keys_inv is not None:
            self.out_keys_inv = out_keys_inv

    # ------------------------------------------------------------------ keys
    @property
    def in_keys(self) -> list[NestedKey]:
        return self.__dict__["_in_keys"]

    @in_keys.setter
    def in_keys(self, keys: Any) -> None:
        d = self.__dict__
        d["_in_keys"] = key_list(keys, type(self).__name__, "in_keys")
        if d["_out_default"]:
            d["_out_keys"] = list(d["_in_keys"])
        d["_pairs_cache"] = None
        d["_reset_pairs"] = None

    @property
    def out_keys(self) -> list[NestedKey]:
        return self.__dict__["_out_keys"]

    @out_keys.setter
    def out_keys(self, keys: Any) -> None:
        d = self.__dict__
        if keys is None:
            d["_out_default"] = True
            d["_out_keys"] = list(d["_in_keys"])
        else:
            d["_out_default"] = False
            d["_out_keys"] = key_list(keys, type(self).__name__, "out_keys")
        d["_pairs_cache"] = None
        d["_reset_pairs"] = None

    @property
    def in_keys_inv(self) -> list[NestedKey]:
        return self.__dict__["_in_keys_inv"]

    @in_keys_inv.setter
    def in_keys_inv(self, keys: Any) -> None:
        d = self.__dict__
        d["_in_keys_inv"] = key_list(keys, type(self).__name__, "in_keys_inv")
        if d["_out_inv_default"]:
            d["_out_keys_inv"] = list(d["_in_keys_inv"])
        d["_pairs_inv_cache"] = None

    @property
    def out_keys_inv(self) -> list[NestedKey]:
        return self.__dict__["_out_keys_inv"]

    @out_keys_inv.setter
    def out_keys_inv(self, keys: Any) -> None:
        d = self.__dict__
        if keys is None:
            d["_out_inv_default"] = True
            d["_out_keys_inv"] = list(d["_in_keys_inv"])
        else:
            d["_out_inv_default"] = False
            d["_out_keys_inv"] = key_list(keys, type(self).__name__, "out_keys_inv")
        d["_pairs_inv_cache"] = None

    @property
    def _pairs(self) -> list[tuple[NestedKey, NestedKey]]:
        p = self.__dict__["_pairs_cache"]
        if p is None:
            p = _pairs(self, self.in_keys, self.out_keys, "in_keys and out_keys")
            self.__dict__["_pairs_cache"] = p
        return p

    @property
    def _pairs_inv(self) -> list[tuple[NestedKey, NestedKey]]:
        p = self.__dict__["_pairs_inv_cache"]
        if p is None:
            p = _pairs(self, self.in_keys_inv, self.out_keys_inv, "in_keys_inv and out_keys_inv")
            self.__dict__["_pairs_inv_cache"] = p
        return p

    @property
    def _has_inv(self) -> bool:
        """True if the transform changes the input of the wrapped env."""
        return bool(self.in_keys_inv) or type(self)._inv_call is not Transform._inv_call

    @property
    def _has_reset_pre(self) -> bool:
        return type(self)._reset_env_preprocess is not Transform._reset_env_preprocess

    # ------------------------------------------------------------------ containers
    def _set_container(self, container: Any) -> None:
        d = self.__dict__
        current = self.container
        if container is not None and current is not None and current is not container:
            raise ValueError(
                f"{type(self).__name__} already belongs to a {type(current).__name__}; a transform "
                "holds per-env state, so use transform.clone() for another env or Compose"
            )
        d["_container_ref"] = None if container is None else weakref.ref(container)
        d["_parent_cache"] = None

    @property
    def container(self) -> Any:
        """The Compose or TransformedEnv holding this transform (None if standalone)."""
        ref = self.__dict__.get("_container_ref")
        return None if ref is None else ref()

    def _env(self) -> TransformedEnv | None:
        c = self.container
        while c is not None and not isinstance(c, TransformedEnv):
            c = c.container
        return c

    @property
    def parent(self) -> TransformedEnv | None:
        """The env up to this transform: its base env with the transforms before it.

        Stepping or resetting it drives the same base env. None outside an env.
        """
        env = self._env()
        if env is None:
            return None
        cache = self.__dict__.get("_parent_cache")
        if cache is not None and cache[0]() is env and cache[1] == env._structure_version:
            return cache[2]
        chain = env._chain
        idx = next((i for i, t in enumerate(chain) if t is self), None)
        if idx is None:
            return None
        parent = TransformedEnv(env.base_env, Compose(*chain[:idx], _own=False), _lazy_specs=True)
        self.__dict__["_parent_cache"] = (weakref.ref(env), env._structure_version, parent)
        return parent

    def _invalidate_specs(self) -> None:
        """Tells the env holding this transform that its specs must be recomputed."""
        env = self._env()
        if env is not None:
            env._mark_dirty()

    def _structure_changed(self) -> None:
        env = self._env()
        if env is not None:
            env._refresh_chain()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_container_ref"] = None
        state["_parent_cache"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def __deepcopy__(self, memo: dict) -> Transform:
        cls = type(self)
        new = cls.__new__(cls)
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            if k in ("_container_ref", "_parent_cache"):
                new.__dict__[k] = None
            else:
                new.__dict__[k] = copy.deepcopy(v, memo)
        return new

    def clone(self) -> Transform:
        """A deep copy, detached from any env or Compose."""
        return copy.deepcopy(self)

    # ------------------------------------------------------------------ data hooks
    def _apply_transform(self, x: Tensor) -> Tensor:
        raise NotImplementedError(
            f"{type(self).__name__} must implement _apply_transform(x) or override _call(td)"
        )

    def _inv_apply_transform(self, x: Tensor) -> Tensor:
        raise NotImplementedError(
            f"{type(self).__name__} has in_keys_inv but does not implement _inv_apply_transform(x)"
        )

    def _apply_pairs(self, td: TensorDictBase, pairs: list) -> TensorDictBase:
        for ik, ok in pairs:
            try:
                x = td.get(ik)
            except KeyError:
                raise missing_key(self, ik, td) from None
            td.set(ok, self._apply_transform(x))
        return td

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Transforms the entries of a step output (or of any TensorDict, in ``forward``)."""
        return self._apply_pairs(tensordict, self._pairs)

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        """Transforms a step's ``"next"`` TensorDict; ``tensordict`` is the step's input."""
        return self._call(next_tensordict)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        """Transforms the reset output (``tensordict`` holds the ``"_reset"`` mask, if any)."""
        return tensordict_reset

    def _reset_env_preprocess(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Changes the reset input before the wrapped env sees it (a shallow copy)."""
        return tensordict

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Maps the policy's entries (``out_keys_inv``) to the wrapped env's (``in_keys_inv``)."""
        for ik, ok in self._pairs_inv:
            try:
                x = tensordict.get(ok)
            except KeyError:
                raise missing_key(self, ok, tensordict, "out_keys_inv") from None
            tensordict.set(ik, self._inv_apply_transform(x))
        return tensordict

    def inv(self, tensordict: TensorDictBase) -> TensorDictBase:
        """The inverse transform on a shallow copy of ``tensordict`` (the input is untouched)."""
        return self._inv_call(tensordict.copy())

    def _set_seed(self, seed: int | None) -> None:
        """Seeds the transform's own randomness (called by ``TransformedEnv.set_seed``)."""

    def _forward_pairs(self, tensordict: TensorDictBase, pairs: list | None = None) -> TensorDictBase:
        """Applies the key pairs to the root entries and to the same entries under ``"next"``."""
        pairs = self._pairs if pairs is None else pairs
        nxt = tensordict.get("next", None)
        if nxt is None or not is_tensor_collection(nxt):
            return self._apply_pairs(tensordict, pairs)
        explicit = set(self.in_keys)
        root, sub = [], []
        for ik, ok in pairs:
            found = ik in tensordict
            if found:
                root.append((ik, ok))
            if not (type(ik) is tuple and ik[0] == "next"):
                nk = ("next", *((ik,) if type(ik) is str else ik))
                if nk not in explicit and ik in nxt:
                    sub.append((ik, ok))
                    found = True
            if not found:
                raise missing_key(self, ik, tensordict)
        self._apply_pairs(tensordict, root)
        if sub:
            self._apply_pairs(nxt, sub)
        return tensordict

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Applies the transform to a TensorDict outside an env (e.g. a replay sample).

        Key-wise transforms apply to each in_key at the root and under ``"next"`` (a
        transition holds both), unless ``("next", key)`` is an in_key itself; a key in
        neither place raises a ``KeyError`` naming the transform and the key. Transforms
        that override ``_call`` apply it to the TensorDict as is.
        """
        if type(self)._call is Transform._call:
            return self._forward_pairs(tensordict)
        return self._call(tensordict)

    # ------------------------------------------------------------------ spec hooks
    def _transform_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        """The spec of ``_apply_transform(x)`` for ``x`` in ``spec`` (default: unchanged)."""
        return spec

    def _transform_inv_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        """The spec the policy must write, given the wrapped env's input ``spec``."""
        return spec

    def _keywise_spec(self, spec: Composite) -> Composite:
        for ik, ok in self._pairs:
            s = spec.get(ik, None)
            if s is None or isinstance(s, Composite):
                continue
            spec.set(ok, self._transform_spec_leaf(s, ik))
        return spec

    def _keywise_inv_spec(self, spec: Composite) -> Composite:
        for ik, ok in self._pairs_inv:
            s = spec.get(ik, None)
            if s is None or isinstance(s, Composite):
                continue
            new = self._transform_inv_spec_leaf(s, ik)
            if ik != ok:
                spec.del_(ik)
            spec.set(ok, new)
        return spec

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        return self._keywise_spec(observation_spec)

    def transform_reward_spec(self, reward_spec: Composite) -> Composite:
        return self._keywise_spec(reward_spec)

    def transform_done_spec(self, done_spec: Composite) -> Composite:
        return self._keywise_spec(done_spec)

    def transform_action_spec(self, action_spec: Composite) -> Composite:
        return self._keywise_inv_spec(action_spec)

    def transform_state_spec(self, state_spec: Composite) -> Composite:
        return self._keywise_inv_spec(state_spec)

    def _check_output_keys(self, output_spec: Composite) -> None:
        if not self._check_spec_in_keys:
            return
        parts = [output_spec[p] for p in _OUTPUT_PARTS]
        for ik in self.in_keys:
            if not any(ik in p.keys(include_nested=True) for p in parts):
                keys = [k for p in parts for k in leaf_keys(p)]
                raise missing_spec_key(self, ik, "output specs (observation, reward, done)", keys)

    def _check_input_keys(self, input_spec: Composite) -> None:
        parts = [input_spec[p] for p in _INPUT_PARTS]
        for ik in self.in_keys_inv:
            if not any(ik in p.keys(include_nested=True) for p in parts):
                keys = [k for p in parts for k in leaf_keys(p)]
                raise missing_spec_key(self, ik, "input specs (action, state)", keys)

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        """Transforms ``Composite(full_observation_spec=, full_reward_spec=, full_done_spec=)``.

        Default: checks that every in_key is an output, records which key pairs exist at
        reset (observations and done flags), then calls the three per-spec hooks.
        """
        self._check_output_keys(output_spec)
        at_reset = set(leaf_keys(output_spec["full_observation_spec"]))
        at_reset |= set(leaf_keys(output_spec["full_done_spec"]))
        self.__dict__["_reset_pairs"] = [(i, o) for i, o in self._pairs if i in at_reset]
        output_spec["full_observation_spec"] = self.transform_observation_spec(
            output_spec["full_observation_spec"]
        )
        output_spec["full_reward_spec"] = self.transform_reward_spec(output_spec["full_reward_spec"])
        output_spec["full_done_spec"] = self.transform_done_spec(output_spec["full_done_spec"])
        return output_spec

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        """Transforms ``Composite(full_action_spec=, full_state_spec=)`` (the env's inputs)."""
        self._check_input_keys(input_spec)
        input_spec["full_action_spec"] = self.transform_action_spec(input_spec["full_action_spec"])
        input_spec["full_state_spec"] = self.transform_state_spec(input_spec["full_state_spec"])
        return input_spec

    def transform_env_batch_size(self, batch_size: torch.Size) -> torch.Size:
        """The batch size of the env after this transform (default: unchanged)."""
        return batch_size

    def transform_env_device(self, device: torch.device) -> torch.device:
        """The device of the env after this transform (default: unchanged)."""
        return device

    def __repr__(self) -> str:
        fields = []
        if self.in_keys:
            fields.append(f"in_keys={self.in_keys}")
        if self.out_keys and self.out_keys != self.in_keys:
            fields.append(f"out_keys={self.out_keys}")
        if self.in_keys_inv:
            fields.append(f"in_keys_inv={self.in_keys_inv}")
        if self.out_keys_inv and self.out_keys_inv != self.in_keys_inv:
            fields.append(f"out_keys_inv={self.out_keys_inv}")
        return f"{type(self).__name__}({', '.join(fields)})"


class ObservationTransform(Transform):
    """A transform that also applies to the reset outputs (observations present at reset).

    The pairs whose in_key is a reward (absent at reset) are skipped on reset.

    An entry transformed in place that is also a state entry (an input of the step, e.g.
    a counter kept in the data by a transform before this one) is transformed in the
    state spec too and mapped back with :meth:`_inv_apply_transform` on the way in, so the
    transforms and the env below see their own values; a transform without an inverse
    raises a ``ValueError`` naming the entry.

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv, check_env_specs
        >>> from steersman.envs.transforms import ObservationTransform, TransformedEnv
        >>> class Clip(ObservationTransform):
        ...     def _apply_transform(self, x):
        ...         return x.clamp(-1.0, 1.0)
        ...     def _transform_spec_leaf(self, spec, key):
        ...         return spec.__class__(spec.low.clamp(-1, 1), spec.high.clamp(-1, 1),
        ...                               shape=spec.shape, dtype=spec.dtype)
        >>> env = TransformedEnv(CartPoleEnv(batch_size=[2], seed=0), Clip(in_keys=["observation"]))
        >>> env.reset()["observation"].shape             # reset outputs are transformed too
        torch.Size([2, 4])
        >>> check_env_specs(env)
    """

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        pairs = self.__dict__["_reset_pairs"]
        return self._apply_pairs(tensordict_reset, self._pairs if pairs is None else pairs)

    @property
    def _has_inv(self) -> bool:
        return (bool(self.in_keys_inv) or bool(self.__dict__.get("_state_pairs"))
                or type(self)._inv_call not in (Transform._inv_call, ObservationTransform._inv_call))

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        for ik, ok in self.__dict__.get("_state_pairs") or ():
            x = tensordict.get(ok, None)
            if x is not None:
                tensordict.set(ik, self._inv_apply_transform(x))
        return Transform._inv_call(self, tensordict)

    def _map_state_entries(self, state_spec: Composite) -> None:
        pairs = []
        inv_keys = set(self.in_keys_inv)
        for ik, ok in self._pairs:
            if ik != ok or ik in inv_keys:
                continue
            s = state_spec.get(ik, None)
            if s is None or isinstance(s, Composite):
                continue
            if type(self)._inv_apply_transform is Transform._inv_apply_transform:
                name = type(self).__name__
                raise ValueError(
                    f"{name}: {ik!r} is also a state entry (an input of the step, e.g. a counter "
                    f"kept in the data) and {name} cannot map it back; write the result to a new "
                    "entry with out_keys instead"
                )
            state_spec.set(ok, self._transform_spec_leaf(s, ik))
            pairs.append((ik, ok))
        self.__dict__["_state_pairs"] = pairs

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        self._map_state_entries(input_spec["full_state_spec"])
        return super().transform_input_spec(input_spec)


class Compose(Transform):
    """A sequence of transforms applied in order (inverses in reverse order).

    Args:
        *transforms: the transforms (a single list also works).

    Indexing gives a transform (``compose[0]``) or a Compose of a slice; ``append`` and
    ``insert`` change the sequence in place (the env holding it recomputes its specs).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs.transforms import Compose, RewardScaling, UnsqueezeTransform
        >>> t = Compose(RewardScaling(loc=0.0, scale=2.0), UnsqueezeTransform(-1, in_keys=["reward"]))
        >>> td = TensorDict(reward=torch.ones(3, 1), batch_size=[3])
        >>> t(td)["reward"].shape           # [3, 1] -> scaled -> [3, 1, 1]
        torch.Size([3, 1, 1])
        >>> len(t), type(t[0]).__name__
        (2, 'RewardScaling')
    """

    _check_spec_in_keys = False

    def __init__(self, *transforms: Transform, _own: bool = True) -> None:
        super().__init__()
        if len(transforms) == 1 and isinstance(transforms[0], (list, tuple)):
            transforms = tuple(transforms[0])
        for t in transforms:
            if not isinstance(t, Transform):
                raise TypeError(f"Compose takes Transforms, got {type(t).__name__}")
        self.__dict__["_own"] = _own
        self.transforms = nn.ModuleList(transforms)
        if _own:
            for t in transforms:
                t._set_container(self)

    # ------------------------------------------------------------------ sequence
    def __len__(self) -> int:
        return len(self.transforms)

    def __iter__(self) -> Iterator[Transform]:
        return iter(self.transforms)

    def __getitem__(self, index: int | slice) -> Transform:
        if isinstance(index, slice):
            return Compose(*list(self.transforms)[index], _own=False)
        return self.transforms[index]

    def append(self, transform: Transform) -> Compose:
        """Appends a transform (returns self)."""
        if not isinstance(transform, Transform):
            raise TypeError(f"Compose.append takes a Transform, got {type(transform).__name__}")
        if self.__dict__["_own"]:
            transform._set_container(self)
        self.transforms.append(transform)
        self._structure_changed()
        return self

    def insert(self, index: int, transform: Transform) -> Compose:
        """Inserts a transform at ``index`` (returns self)."""
        if not isinstance(transform, Transform):
            raise TypeError(f"Compose.insert takes a Transform, got {type(transform).__name__}")
        if self.__dict__["_own"]:
            transform._set_container(self)
        items = list(self.transforms)
        items.insert(index, transform)
        self.transforms = nn.ModuleList(items)
        self._structure_changed()
        return self

    def _relink(self) -> None:
        if self.__dict__.get("_own", True):
            for t in self.transforms:
                t._set_container(self)

    def __deepcopy__(self, memo: dict) -> Compose:
        new = super().__deepcopy__(memo)
        new._relink()
        return new

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._relink()

    def _flat(self) -> list[Transform]:
        out: list[Transform] = []
        for t in self.transforms:
            if isinstance(t, Compose):
                out.extend(t._flat())
            else:
                out.append(t)
        return out

    @property
    def _has_inv(self) -> bool:
        return any(t._has_inv for t in self.transforms)

    @property
    def _has_reset_pre(self) -> bool:
        return any(t._has_reset_pre for t in self.transforms)

    # ------------------------------------------------------------------ data
    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        for t in self.transforms:
            tensordict = t._call(tensordict)
        return tensordict

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        for t in self.transforms:
            next_tensordict = t._step(tensordict, next_tensordict)
        return next_tensordict

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        for t in self.transforms:
            tensordict_reset = t._reset(tensordict, tensordict_reset)
        return tensordict_reset

    def _reset_env_preprocess(self, tensordict: TensorDictBase) -> TensorDictBase:
        for t in reversed(self.transforms):
            tensordict = t._reset_env_preprocess(tensordict)
        return tensordict

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        for t in reversed(self.transforms):
            tensordict = t._inv_call(tensordict)
        return tensordict

    def _set_seed(self, seed: int | None) -> None:
        for t in self.transforms:
            t._set_seed(seed)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        for t in self.transforms:
            tensordict = t.forward(tensordict)
        return tensordict

    # ------------------------------------------------------------------ specs
    def transform_output_spec(self, output_spec: Composite) -> Composite:
        for t in self.transforms:
            output_spec = t.transform_output_spec(output_spec)
        return output_spec

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        for t in self.transforms:
            input_spec = t.transform_input_spec(input_spec)
        return input_spec

    def transform_env_batch_size(self, batch_size: torch.Size) -> torch.Size:
        for t in self.transforms:
            batch_size = t.transform_env_batch_size(batch_size)
        return batch_size

    def transform_env_device(self, device: torch.device) -> torch.device:
        for t in self.transforms:
            device = t.transform_env_device(device)
        return device

    def __repr__(self) -> str:
        inner = ",\n".join("    " + repr(t).replace("\n", "\n    ") for t in self.transforms)
        return f"Compose(\n{inner})" if inner else "Compose()"


def _spec_property(index: int, name: str) -> property:
    def fget(self: TransformedEnv) -> Composite:
        d = self.__dict__
        if d["_specs_dirty"] or self._base_changed():
            self._compute_specs()
        return d["_spec_cache"][index]

    def fset(self: TransformedEnv, value: Any) -> None:
        if not self.__dict__.get("_initialized", False):
            return  # EnvBase.__init__ sets defaults: the transformed specs replace them
        raise AttributeError(
            f"TransformedEnv.{name} is computed from the base env's specs and the transforms; "
            "set the spec on the base env (env.base_env) or change it with a transform"
        )

    return property(fget, fset)


class TransformedEnv(EnvBase):
    """An env whose outputs and inputs go through a transform (an env itself).

    Args:
        env: the wrapped env (any :class:`~steersman.envs.EnvBase`, also batched or
            transformed ones).
        transform: a :class:`Transform` or a :class:`Compose` (default: an empty Compose).

    ``env.transform`` is the transform, ``env.base_env`` the wrapped env;
    ``append_transform``/``insert_transform`` add transforms. The specs
    (``observation_spec``, ``action_spec``, ... and the batch size) are the base env's
    mapped through the transforms, recomputed only when the transforms change.
    Attributes not found on the transformed env are looked up on the base env.

    Step: the inverse transforms map the policy's TensorDict to the base env's input (on
    a shallow copy: the caller's TensorDict keeps the policy's entries), the base env
    steps, and the transforms map its ``"next"`` outputs in order. Reset: the base env
    resets (partial resets through the ``"_reset"`` mask), then the transforms map the
    reset outputs; sub-envs that are not reset keep their entries.

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv, check_env_specs
        >>> from steersman.envs.transforms import Compose, RewardSum, StepCounter, TransformedEnv
        >>> env = TransformedEnv(CartPoleEnv(batch_size=[4], seed=0), StepCounter(max_steps=10))
        >>> env = env.append_transform(RewardSum())
        >>> check_env_specs(env)
        >>> td = env.rollout(20, break_when_any_done=False)       # [4, 20]
        >>> int(td["next", "step_count"].max())                   # truncated at 10 steps
        10
        >>> sorted(k for k in env.observation_spec.keys())
        ['episode_reward', 'observation', 'step_count']
    """

    _handles_partial_reset = False

    _full_observation_spec = _spec_property(0, "observation_spec")
    _full_reward_spec = _spec_property(1, "reward_spec")
    _full_done_spec = _spec_property(2, "done_spec")
    _full_action_spec = _spec_property(3, "action_spec")
    _full_state_spec = _spec_property(4, "state_spec")

    def __init__(self, env: EnvBase, transform: Transform | None = None, *,
                 _lazy_specs: bool = False) -> None:
        if not isinstance(env, EnvBase):
            raise TypeError(f"TransformedEnv wraps an EnvBase, got {type(env).__name__}")
        if transform is not None and not isinstance(transform, Transform):
            raise TypeError(f"TransformedEnv: transform must be a Transform, got {type(transform).__name__}")
        d = self.__dict__
        d["_base_env"] = env
        d["_specs_dirty"] = True
        d["_spec_cache"] = None
        d["_spec_src"] = None
        d["_structure_version"] = 0
        d["_initialized"] = False
        super().__init__(device=env.device, batch_size=env.batch_size, check=env.check)
        t = Compose() if transform is None else transform
        t._set_container(self)
        d["_transform"] = t
        d["_initialized"] = True
        try:
            self._refresh_chain(compute=not _lazy_specs)
        except Exception:
            t._set_container(None)  # the transform stays usable (e.g. after fixing its keys)
            raise

    # ------------------------------------------------------------------ structure
    @property
    def check(self) -> bool:
        """The base env's ``check`` flag (out-of-spec actions refused); setting it sets
        the base env's."""
        return self._base_env.check

    @check.setter
    def check(self, value: bool) -> None:
        self._base_env.check = bool(value)

    def _action_guard(self, tensordict: TensorDictBase) -> None:
        """Checks the actions against the transformed action spec when an inverse
        transform maps them (a bad value could fail inside it); otherwise they reach the
        base env unchanged and its own check (in ``_step``) names it."""
        if self.__dict__["_has_inv"]:
            EnvBase._action_guard(self, tensordict)

    @property
    def batch_locked(self) -> bool:  # type: ignore[override]
        """The base env's ``batch_locked``."""
        return self._base_env.batch_locked

    @property
    def base_env(self) -> EnvBase:
        """The wrapped env."""
        return self._base_env

    @property
    def transform(self) -> Transform:
        """The transform (a single transform or a :class:`Compose`)."""
        return self._transform

    @transform.setter
    def transform(self, transform: Transform) -> None:
        if not isinstance(transform, Transform):
            raise TypeError(f"TransformedEnv: transform must be a Transform, got {type(transform).__name__}")
        old = self._transform
        if old is not transform:
            transform._set_container(self)
            old._set_container(None)
        self.__dict__["_transform"] = transform
        self._refresh_chain()

    def append_transform(self, transform: Transform) -> TransformedEnv:
        """Appends ``transform`` after the current ones (returns self)."""
        if not isinstance(transform, Transform):
            raise TypeError(f"append_transform takes a Transform, got {type(transform).__name__}")
        cur = self._transform
        if not isinstance(cur, Compose):
            cur._set_container(None)
            cur = Compose(cur)
            self.__dict__["_transform"] = cur
            cur._set_container(self)
        transform._set_container(cur)
        cur.transforms.append(transform)
        self._refresh_chain()
        return self

    def insert_transform(self, index: int, transform: Transform) -> TransformedEnv:
        """Inserts ``transform`` at position ``index`` of the transforms (returns self)."""
        if not isinstance(transform, Transform):
            raise TypeError(f"insert_transform takes a Transform, got {type(transform).__name__}")
        cur = self._transform
        if not isinstance(cur, Compose):
            cur._set_container(None)
            cur = Compose(cur)
            self.__dict__["_transform"] = cur
            cur._set_container(self)
        items = list(cur.transforms)
        if not -len(items) - 1 <= index <= len(items):
            raise IndexError(f"insert_transform: index {index} out of range for {len(items)} transforms")
        if index < 0:
            index = len(items) + index + 1
        transform._set_container(cur)
        items.insert(index, transform)
        cur.transforms = nn.ModuleList(items)
        self._refresh_chain()
        return self

    def _refresh_chain(self, compute: bool = True) -> None:
        """Recomputes the flat list of transforms, the batch size and (lazily) the specs."""
        d = self.__dict__
        t = d["_transform"]
        chain = t._flat() if isinstance(t, Compose) else [t]
        d["_chain"] = chain
        self._refresh_flags()
        d["_structure_version"] += 1
        bs = self._base_env.batch_size
        dev = self._base_env.device
        for x in chain:
            bs = x.transform_env_batch_size(bs)
            dev = x.transform_env_device(dev)
        self._batch_size = torch.Size(bs)
        self._device = dev
        self._mark_dirty()
        if compute:
            self._compute_specs()

    def _refresh_flags(self) -> None:
        d = self.__dict__
        chain = d["_chain"]
        d["_inv_flags"] = [x._has_inv for x in chain]
        d["_has_inv"] = any(d["_inv_flags"])
        d["_pre_flags"] = [x._has_reset_pre for x in chain]
        d["_has_pre"] = any(d["_pre_flags"])
        d["_post_mdp_hooks"] = tuple(x for x in chain if hasattr(x, "_post_step_mdp"))
        d["_auto_reset"] = any(getattr(x, "_skip_base_partial_reset", False) for x in chain)
        d["_has_skip"] = any(getattr(x, "_writes_step_mask", False) for x in chain)
        macros = [i for i, x in enumerate(chain) if hasattr(x, "_macro_step")]
        d["_macro"] = macros[-1] if macros else None

    def _mark_dirty(self) -> None:
        d = self.__dict__
        d["_specs_dirty"] = True
        d["_structure_version"] += 1
        self._plan = None

    def _base_changed(self) -> bool:
        src = self.__dict__["_spec_src"]
        b = self._base_env
        return src is None or not (
            b.full_observation_spec is src[0]
            and b.full_reward_spec is src[1]
            and b.full_done_spec is src[2]
            and b.full_action_spec is src[3]
            and b.full_state_spec is src[4]
        )

    def _compute_specs(self) -> None:
        d = self.__dict__
        b = self._base_env
        src = (b.full_observation_spec, b.full_reward_spec, b.full_done_spec,
               b.full_action_spec, b.full_state_spec)
        bs, dev = b.batch_size, b.device
        output = Composite._new_unchecked(
            {n: s._structure_copy() for n, s in zip(_OUTPUT_PARTS, src[:3])}, bs, dev
        )
        inp = Composite._new_unchecked(
            {n: s._structure_copy() for n, s in zip(_INPUT_PARTS, src[3:])}, bs, dev
        )
        for s in (*output.values(), *inp.values()):
            s.unlock_()
        for t in d["_chain"]:
            output = t.transform_output_spec(output)
            inp = t.transform_input_spec(inp)
        specs = tuple(output[n] for n in _OUTPUT_PARTS) + tuple(inp[n] for n in _INPUT_PARTS)
        for name, s in zip(("observation", "reward", "done", "action", "state"), specs):
            if not isinstance(s, Composite):
                raise TypeError(
                    f"TransformedEnv: after the transforms the {name} spec is a {type(s).__name__}, "
                    f"expected a Composite: a transform's transform_{name}_spec must return the "
                    "Composite it was given (decorate a per-key override with _apply_to_composite)"
                )
            if s.shape != self._batch_size:
                raise ValueError(
                    f"TransformedEnv: after the transforms the {name} spec has shape "
                    f"{list(getattr(s, 'shape', []))}, expected the env batch size "
                    f"{list(self._batch_size)}"
                )
            s.lock_()
        d["_spec_cache"] = specs
        d["_spec_src"] = src
        # reset inputs: the env's own outputs (observations, done flags) are not passed to
        # the base env (it would merge them into its reset outputs for nothing); its state
        # entries and anything else (a policy's entries, reset options) are
        base_state = set(leaf_keys(src[4]))
        d["_reset_drop"] = [k for s in (specs[0], specs[2]) for k in leaf_keys(s) if k not in base_state]
        d["_specs_dirty"] = False
        self._plan = None
        self._refresh_flags()  # the specs decide some inverse maps (e.g. state entries)

    # ------------------------------------------------------------------ env API
    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        d = self.__dict__
        if d["_specs_dirty"]:
            self._compute_specs()
        chain = d["_chain"]
        base = self._base_env
        if d["_macro"] is not None:
            return self._macro_step(tensordict)
        if d["_has_skip"] or "_step" in tensordict.keys():
            return self._masked_step(tensordict)
        if not d["_has_inv"]:
            base._action_guard(tensordict)
            next_td = base._step(tensordict)
            p = base._plan
            if p is None or not p["done_complete"]:
                base._complete_done(next_td, True)
            preset = tensordict.get("next", None)
            if preset is not None:  # entries the policy wrote under "next": transforms see them
                keep_preset_next(preset, next_td)
            for t in chain:
                next_td = t._step(tensordict, next_td)
            return next_td
        flags = d["_inv_flags"]
        n = len(chain)
        levels: list = [None] * n
        cur = tensordict
        for i in range(n - 1, -1, -1):
            levels[i] = cur
            if flags[i]:
                cur = chain[i]._inv_call(cur.copy())
        base._action_guard(cur)
        next_td = base._step(cur)
        p = base._plan
        if p is None or not p["done_complete"]:
            base._complete_done(next_td, True)
        preset = tensordict.get("next", None)
        if preset is not None:
            keep_preset_next(preset, next_td)
        for i in range(n):
            next_td = chain[i]._step(levels[i], next_td)
        return next_td

    def _inverse_levels(self, tensordict: TensorDictBase, upto: int = 0) -> tuple[list, TensorDictBase]:
        """The input of each transform ``i >= upto`` (``levels[i]``) and the input below ``upto``."""
        d = self.__dict__
        chain, flags = d["_chain"], d["_inv_flags"]
        levels: list = [None] * len(chain)
        cur = tensordict
        for i in range(len(chain) - 1, upto - 1, -1):
            levels[i] = cur
            if flags[i]:
                cur = chain[i]._inv_call(cur.copy())
        return levels, cur

    def _base_step(self, cur: TensorDictBase) -> TensorDictBase:
        base = self._base_env
        base._action_guard(cur)
        next_td = base._step(cur)
        p = base._plan
        if p is None or not p["done_complete"]:
            base._complete_done(next_td, True)
        return next_td

    def _stay(self, tensordict: TensorDictBase) -> TensorDictBase:
        """The output of a skipped step: the observations and done flags of the input (the
        state does not change), rewards zero."""
        out = TensorDict.from_trusted({}, tensordict.batch_size, self._device)
        specs = self.__dict__["_spec_cache"]
        for part, from_input in ((specs[0], True), (specs[2], True), (specs[1], False)):
            for key, spec in part.items(include_nested=True, leaves_only=True):
                val = tensordict.get(key, None) if from_input else None
                if val is None:
                    val = spec.zero()
                    if val.shape[: tensordict.batch_dims] != tensordict.batch_size:
                        val = val.expand(*tensordict.batch_size, *val.shape[len(self._batch_size):])
                out.set(key, val.clone())
        return out

    def _masked_step(self, tensordict: TensorDictBase) -> TensorDictBase:
        """A step where ``"_step"`` (written by the caller or by a transform such as
        ConditionalSkip on the way in) says which elements step; the others keep their
        state (:meth:`_stay`), and the transforms of this env do not run on them."""
        d = self.__dict__
        chain = d["_chain"]
        levels, cur = self._inverse_levels(tensordict)
        mask = cur.get("_step", None)
        if mask is None:
            mask = tensordict.get("_step", None)
        if mask is None:
            next_td = self._base_step(cur)
            for i in range(len(chain)):
                next_td = chain[i]._step(levels[i], next_td)
            return next_td
        nb = len(self._batch_size)
        mask = torch.as_tensor(mask, device=self._device).to(torch.bool)
        if mask.ndim > nb:
            mask = mask.reshape(*mask.shape[:nb], -1).all(-1)
        mask = mask.expand(self._batch_size) if nb else mask.reshape(())
        if bool(mask.all()):
            next_td = self._base_step(cur.exclude("_step"))
            for i in range(len(chain)):
                next_td = chain[i]._step(levels[i], next_td)
            return next_td
        stay = self._stay(tensordict)
        if not bool(mask.any()):
            return stay
        base = self._base_env
        if not (getattr(base, "_partial_step", False) or not base.batch_locked
                or isinstance(base, TransformedEnv)):
            raise ValueError(
                f"{type(self).__name__}: a step of only some elements of the batch ('_step' = {mask.tolist()}) "
                f"needs a base env that can step part of its batch (SerialEnv, ParallelEnv, a stateless env); "
                f"{type(base).__name__} steps all its elements at once")
        cur = cur.copy()
        cur.set("_step", mask)
        next_td = self._base_step(cur)
        for i in range(len(chain)):
            next_td = chain[i]._step(levels[i], next_td)
        return next_td.where(mask, stay.select(*next_td.keys(True, True)))

    def _macro_step(self, tensordict: TensorDictBase) -> TensorDictBase:
        """A step driven by a transform that steps its parent itself (MultiAction,
        ConditionalPolicySwitch): the transforms after it see one step."""
        d = self.__dict__
        chain = d["_chain"]
        j = d["_macro"]
        levels, cur = self._inverse_levels(tensordict, j + 1)
        t = chain[j]
        next_td = t._macro_step(cur, t.parent)
        for i in range(j + 1, len(chain)):
            next_td = chain[i]._step(levels[i], next_td)
        return next_td

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        d = self.__dict__
        if d["_specs_dirty"]:
            self._compute_specs()
        chain = d["_chain"]
        n = len(chain)
        levels: list | None = None
        cur = tensordict
        no_input = tensordict is None and d["_has_pre"]
        if no_input:
            # the reset-preprocess hooks run on every reset: give them an empty input
            tensordict = TensorDict.from_trusted({}, self._batch_size, self._device)
        if tensordict is not None:
            if d["_has_pre"]:  # each hook runs once; the base env gets the last level
                flags = d["_pre_flags"]
                levels = [None] * n
                lvl = tensordict
                for i in range(n - 1, -1, -1):
                    levels[i] = lvl
                    if flags[i]:
                        lvl = chain[i]._reset_env_preprocess(lvl.copy())
                cur = lvl.exclude(*d["_reset_drop"])
            else:
                cur = tensordict.exclude(*d["_reset_drop"])
        if no_input and cur.is_empty():
            cur = None  # nothing for the base env: reset it as reset() would
        if d["_auto_reset"] and tensordict is not None and "_reset" in tensordict.keys():
            # the base env reset itself in the step that ended the episode (AutoResetTransform)
            td_reset = tensordict.exclude("_reset")
        else:
            td_reset = self._base_env.reset(cur, **kwargs)
        empty = None
        for i in range(n):
            if levels is not None:
                lvl = levels[i]
            elif tensordict is not None:
                lvl = tensordict
            else:
                if empty is None or empty.batch_size != td_reset.batch_size:
                    empty = td_reset.empty()
                lvl = empty
            td_reset = chain[i]._reset(lvl, td_reset)
        return td_reset

    def _set_seed(self, seed: int | None) -> None:
        self._base_env._set_seed(seed)
        for t in self.__dict__["_chain"]:
            t._set_seed(seed)

    def set_seed(self, seed: int | None = None, static_seed: bool = False) -> int | None:
        """Seeds the base env (and the transforms that draw random numbers)."""
        out = self._base_env.set_seed(seed, static_seed=static_seed)
        for t in self.__dict__["_chain"]:
            t._set_seed(seed)
        return out

    def _close(self) -> None:
        self._base_env.close()

    def to(self, device: Any) -> TransformedEnv:
        """Moves the base env and the transforms to ``device``; returns self."""
        self._base_env.to(device)
        self._transform.to(device)
        self._refresh_chain(compute=False)  # the device after the transforms
        return self

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(f"'{type(self).__name__}' object has no attribute {name!r}")
        base = self.__dict__.get("_base_env")
        if base is None:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute {name!r}")
        return getattr(base, name)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_plan"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._transform._set_container(self)
        self._relink(self._transform)

    def _relink(self, t: Transform) -> None:
        if isinstance(t, Compose):
            for sub in t.transforms:
                sub._set_container(t)
                self._relink(sub)

    def __repr__(self) -> str:
        env = repr(self._base_env).replace("\n", "\n    ")
        tr = repr(self._transform).replace("\n", "\n    ")
        return f"TransformedEnv(\n    env={env},\n    transform={tr})"

