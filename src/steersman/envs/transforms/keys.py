"""Transforms that move, drop, join or reshape entries: Rename, Exclude, Select, CatTensors,
Unsqueeze, Squeeze."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from steersman.data import Bounded, Composite, TensorSpec, Unbounded
from steersman.tensordict import TensorDictBase
from steersman.tensordict._utils import NestedKey

from ._utils import (
    key_list,
    leaf_keys,
    map_bounded,
    missing_key,
    missing_spec_key,
    refuse_unless_default,
)
from .base import ObservationTransform, Transform

__all__ = [
    "RenameTransform",
    "ExcludeTransform",
    "SelectTransform",
    "CatTensors",
    "UnsqueezeTransform",
    "SqueezeTransform",
]

_DEFAULT_KEEP = ("reward", "done", "terminated", "truncated")


class RenameTransform(ObservationTransform):
    """Renames entries: ``in_keys[i]`` becomes ``out_keys[i]`` (outputs), and the policy's
    ``out_keys_inv[i]`` becomes the env's ``in_keys_inv[i]`` (inputs).

    Args:
        in_keys, out_keys: output entries to rename (observations, rewards, done flags).
        in_keys_inv: input entries of the wrapped env (e.g. ``"action"``) ...
        out_keys_inv: ... and the names the policy writes them under.
        create_copy: keep the old entries as well.

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv, check_env_specs
        >>> from steersman.envs.transforms import RenameTransform, TransformedEnv
        >>> env = TransformedEnv(CartPoleEnv(batch_size=[2], seed=0), RenameTransform(
        ...     ["observation"], ["obs"], in_keys_inv=["action"], out_keys_inv=["act"]))
        >>> check_env_specs(env)
        >>> sorted(env.observation_spec.keys()), env.action_keys
        (['obs'], ['act'])
        >>> env.rollout(3)["obs"].shape                  # [2, 3, 4]
        torch.Size([2, 3, 4])
    """

    _check_spec_in_keys = True

    def __init__(self, in_keys: Any, out_keys: Any, in_keys_inv: Any = None,
                 out_keys_inv: Any = None, create_copy: bool = False) -> None:
        super().__init__(in_keys, out_keys, in_keys_inv, out_keys_inv)
        self._pairs  # noqa: B018  (validates the lengths now)
        self._pairs_inv  # noqa: B018
        self.create_copy = create_copy

    def _apply_pairs(self, td: TensorDictBase, pairs: list) -> TensorDictBase:
        copy = self.create_copy
        for ik, ok in pairs:
            try:
                x = td.get(ik)
            except KeyError:
                raise missing_key(self, ik, td) from None
            td.set(ok, x)
            if not copy and ik != ok:
                td.del_(ik)
        return td

    def _keywise_spec(self, spec: Composite) -> Composite:
        for ik, ok in self._pairs:
            s = spec.get(ik, None)
            if s is None:
                continue
            if not self.create_copy and ik != ok:
                spec.del_(ik)
            spec.set(ok, s)
        return spec

    @property
    def _has_inv(self) -> bool:
        return True  # renamed state entries are renamed back on the way in

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        for ik, ok in self.__dict__.get("_state_pairs", ()):
            x = tensordict.get(ok, None)
            if x is not None:
                tensordict.set(ik, x)
        for ik, ok in self._pairs_inv:
            try:
                x = tensordict.get(ok)
            except KeyError:
                raise missing_key(self, ok, tensordict, "out_keys_inv") from None
            tensordict.set(ik, x)
            if ik != ok:
                tensordict.del_(ok)
        return tensordict

    def transform_state_spec(self, state_spec: Composite) -> Composite:
        # an output renamed here that is also a state entry (e.g. a counter kept in the
        # data) is renamed in the state spec too, and renamed back on the way in
        pairs = []
        for ik, ok in self._pairs:
            s = state_spec.get(ik, None)
            if s is None or isinstance(s, Composite):
                continue
            if not self.create_copy and ik != ok:
                state_spec.del_(ik)
            state_spec.set(ok, s)
            pairs.append((ik, ok))
        self.__dict__["_state_pairs"] = pairs
        return self._keywise_inv_spec(state_spec)


class ExcludeTransform(Transform):
    """Removes observation entries from the env's outputs (and from its observation spec).

    Args:
        *excluded_keys: the keys to remove (a single list also works).

    Reward, done, action and state entries (inputs of the step, e.g. ``step_count``)
    cannot be excluded: the env needs them.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs import CartPoleEnv, check_env_specs
        >>> from steersman.envs.transforms import Compose, ExcludeTransform, InitTracker, StepCounter
        >>> from steersman.envs.transforms import TransformedEnv
        >>> env = TransformedEnv(CartPoleEnv(seed=0), Compose(
        ...     InitTracker(), StepCounter(), ExcludeTransform("is_init")))
        >>> check_env_specs(env)
        >>> sorted(env.reset().keys())
        ['done', 'observation', 'step_count', 'terminated', 'truncated']
        >>> sorted(ExcludeTransform("a")(TensorDict(a=torch.ones(1), b=torch.ones(1))).keys())
        ['b']
    """

    _check_spec_in_keys = False

    def __init__(self, *excluded_keys: NestedKey, inverse: bool = False) -> None:
        refuse_unless_default("ExcludeTransform", "inverse", inverse, False,
                              "entries are excluded from the env's outputs; drop inputs in the policy")
        super().__init__()
        if len(excluded_keys) == 1 and isinstance(excluded_keys[0], list):
            excluded_keys = tuple(excluded_keys[0])
        self.excluded_keys = key_list(list(excluded_keys), "ExcludeTransform", "excluded_keys")

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict.exclude(*self.excluded_keys, inplace=True)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Removes the keys from the root and from ``"next"``."""
        keys = list(self.excluded_keys)
        keys += [("next", *((k,) if type(k) is str else k)) for k in self.excluded_keys]
        return tensordict.exclude(*keys, inplace=True)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        return self._call(tensordict_reset)

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        obs = output_spec["full_observation_spec"]
        for key in self.excluded_keys:
            for part in ("full_reward_spec", "full_done_spec"):
                if key in output_spec[part].keys(include_nested=True):
                    raise ValueError(
                        f"ExcludeTransform: {key!r} is a {part[5:-5]} entry; only observation "
                        "entries can be excluded"
                    )
            if key not in obs.keys(include_nested=True):
                raise missing_spec_key(self, key, "observation spec", leaf_keys(obs))
            obs.del_(key)
        return output_spec

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        state = input_spec["full_state_spec"]
        for key in self.excluded_keys:
            if key in state.keys(include_nested=True):
                raise ValueError(
                    f"ExcludeTransform: {key!r} is also a state entry (an input of the step, e.g. "
                    "a counter kept in the data); excluding it would break the env. Ignore it in "
                    "the policy instead, or exclude it from collected data outside the env"
                )
        return input_spec

    def __repr__(self) -> str:
        return f"ExcludeTransform({', '.join(map(repr, self.excluded_keys))})"


class SelectTransform(Transform):
    """Keeps only the selected observation entries (rewards and done flags are kept).

    Args:
        *selected_keys: the observation keys to keep (a single list also works).

    In an env, the observation entries that are not selected are removed from the
    outputs and from the observation spec, except those that are also state entries
    (inputs of the step, e.g. ``step_count``); other entries of the TensorDict (the
    policy's, e.g. a recurrent state) are untouched. Outside an env (``forward``), the
    selected keys, the reward/done keys and the same keys under ``"next"`` are kept.

    Example:
        >>> from steersman.envs import CartPoleEnv, check_env_specs
        >>> from steersman.envs.transforms import Compose, SelectTransform, StepCounter, TransformedEnv
        >>> env = TransformedEnv(CartPoleEnv(seed=0), Compose(StepCounter(), SelectTransform("step_count")))
        >>> check_env_specs(env)
        >>> sorted(env.observation_spec.keys())
        ['step_count']
    """

    _check_spec_in_keys = False

    def __init__(self, *selected_keys: NestedKey, keep_rewards: bool = True,
                 keep_dones: bool = True) -> None:
        super().__init__()
        if len(selected_keys) == 1 and isinstance(selected_keys[0], list):
            selected_keys = tuple(selected_keys[0])
        self.selected_keys = key_list(list(selected_keys), "SelectTransform", "selected_keys")
        if not keep_dones:
            raise ValueError("SelectTransform: done entries cannot be removed (keep_dones=False)")
        self.keep_rewards = keep_rewards
        self.__dict__["_drop"] = None

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        drop = self.__dict__["_drop"]
        if drop is not None:
            return tensordict.exclude(*drop, inplace=True)
        keep = list(self.selected_keys) + (list(_DEFAULT_KEEP) if self.keep_rewards else list(_DEFAULT_KEEP[1:]))
        keep += [("next", *((k,) if type(k) is str else k)) for k in keep]
        return tensordict.select(*keep, strict=False)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        return self._call(tensordict_reset)

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        obs = output_spec["full_observation_spec"]
        known = [k for p in ("full_observation_spec", "full_reward_spec", "full_done_spec")
                 for k in output_spec[p].keys(include_nested=True)]
        for key in self.selected_keys:
            if key not in known:
                raise missing_spec_key(self, key, "output specs", known)

        def selected(k: NestedKey) -> bool:
            kt = (k,) if type(k) is str else k
            for s in self.selected_keys:
                st = (s,) if type(s) is str else s
                if kt[: len(st)] == st:
                    return True
            return False

        drop = [k for k in leaf_keys(obs) if not selected(k)]
        removed = {}
        for k in drop:
            removed[k] = obs.pop(k)
        self.__dict__["_removed"] = (obs, removed)
        if not self.keep_rewards:
            rew = output_spec["full_reward_spec"]
            rdrop = [k for k in leaf_keys(rew) if not selected(k)]
            for k in rdrop:
                rew.del_(k)
            drop += rdrop
        self.__dict__["_drop"] = drop
        return output_spec

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        # entries that are also inputs of the step (state) are kept: the env needs them
        state = set(input_spec["full_state_spec"].keys(include_nested=True, leaves_only=True))
        obs, removed = self.__dict__.get("_removed", (None, {}))
        keep = [k for k in removed if k in state]
        for k in keep:
            obs.set(k, removed[k])
        if keep:
            self.__dict__["_drop"] = [k for k in self.__dict__["_drop"] if k not in keep]
        self.__dict__["_removed"] = None
        return input_spec

    def __repr__(self) -> str:
        return f"SelectTransform({', '.join(map(repr, self.selected_keys))})"


def _cat_spec(specs: list[TensorSpec], dim: int, keys: list) -> TensorSpec:
    dtype = specs[0].dtype
    for s in specs[1:]:
        dtype = torch.promote_types(dtype, s.dtype)
    shapes = [s.shape for s in specs]
    # shape arithmetic (a meta-tensor torch.cat would import torch._dynamo: seconds)
    nd = len(shapes[0])
    d = dim + nd if dim < 0 else dim
    why = None
    if any(len(sh) != nd for sh in shapes):
        why = "different numbers of dims"
    elif not 0 <= d < nd:
        why = f"dim {dim} is out of range for {nd}-d entries"
    elif any(sh[:d] + sh[d + 1:] != shapes[0][:d] + shapes[0][d + 1:] for sh in shapes):
        why = "the sizes differ outside the concatenation dim"
    if why is not None:
        raise ValueError(f"CatTensors: the entries {keys} of shapes {[list(s) for s in shapes]} "
                         f"cannot be concatenated along dim {dim}: {why}")
    shape = torch.Size((*shapes[0][:d], sum(sh[d] for sh in shapes), *shapes[0][d + 1:]))
    dev = specs[0].device
    if all(isinstance(s, Bounded) for s in specs):
        low = torch.cat([s.low.to(dtype) for s in specs], dim)
        high = torch.cat([s.high.to(dtype) for s in specs], dim)
        return Bounded(low, high, shape=shape, device=dev, dtype=dtype)
    return Unbounded(shape=shape, device=dev, dtype=dtype)


class CatTensors(ObservationTransform):
    """Concatenates observation entries into one (e.g. a state vector for an MLP).

    Args:
        in_keys: the observation keys to join (sorted first, as TorchRL does, unless
            ``sort=False``).
        out_key: the new key (default ``"observation_vector"``).
        dim: the (negative) dim to concatenate along (default ``-1``).
        del_keys: remove the joined entries (except state entries, e.g. ``step_count``,
            which the env needs as inputs).
        unsqueeze_if_needed: entries with no feature dim (shape ``[*batch]``) get one.
        sort: sort ``in_keys``.

    The spec of the result is ``Bounded`` (concatenated bounds) if every part is
    Bounded, else ``Unbounded``; its dtype is the promoted dtype of the parts.

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv, check_env_specs
        >>> from steersman.envs.transforms import CatTensors, Compose, StepCounter, TransformedEnv
        >>> from steersman.envs.transforms import DTypeCastTransform
        >>> env = TransformedEnv(CartPoleEnv(batch_size=[3], seed=0), Compose(
        ...     StepCounter(), DTypeCastTransform(torch.int64, torch.float32, in_keys=["step_count"]),
        ...     CatTensors(["observation", "step_count"], "state")))
        >>> check_env_specs(env)
        >>> env.reset()["state"].shape                   # [3, 4 + 1]
        torch.Size([3, 5])
    """

    def __init__(self, in_keys: Any = None, out_key: NestedKey = "observation_vector", dim: int = -1,
                 *, del_keys: bool = True, unsqueeze_if_needed: bool = True, sort: bool = True,
                 unsqueeze_if_oor: bool | None = None) -> None:
        if unsqueeze_if_oor is not None:  # TorchRL's name of unsqueeze_if_needed
            unsqueeze_if_needed = bool(unsqueeze_if_oor)
        keys = key_list(in_keys, "CatTensors", "in_keys")
        if not keys:
            raise ValueError("CatTensors needs in_keys (the entries to concatenate)")
        if sort:
            keys = sorted(keys, key=lambda k: k if type(k) is str else ".".join(k))
        if dim >= 0:
            raise ValueError(f"CatTensors: dim must be negative (counted from the end), got {dim}")
        super().__init__(in_keys=keys)
        self.out_key = key_list(out_key, "CatTensors", "out_key")[0]
        self.__dict__["_out_keys"] = [self.out_key]
        self.__dict__["_out_default"] = False
        self.dim = dim
        self.del_keys = del_keys
        self.unsqueeze_if_needed = unsqueeze_if_needed
        self.__dict__["_drop"] = [k for k in keys if k != self.out_key]

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        xs = []
        nb = tensordict.batch_dims
        for k in self.in_keys:
            try:
                x = tensordict.get(k)
            except KeyError:
                raise missing_key(self, k, tensordict) from None
            if self.unsqueeze_if_needed and x.ndim == nb:
                x = x.unsqueeze(-1)
            xs.append(x)
        tensordict.set(self.out_key, torch.cat(xs, self.dim))
        if self.del_keys:
            tensordict.exclude(*self._drop, inplace=True)
        return tensordict

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        return self._call(tensordict_reset)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Concatenates at the root and under ``"next"`` (where all in_keys are present)."""
        nxt = tensordict.get("next", None)
        done = False
        if all(k in tensordict for k in self.in_keys):
            self._call(tensordict)
            done = True
        if nxt is not None and not isinstance(nxt, Tensor) and all(k in nxt for k in self.in_keys):
            self._call(nxt)
            done = True
        if not done:
            missing = next(k for k in self.in_keys if k not in tensordict)
            raise missing_key(self, missing, tensordict)
        return tensordict

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        obs = output_spec["full_observation_spec"]
        nb = len(obs.shape)
        specs = []
        for k in self.in_keys:
            s = obs.get(k, None)
            if s is None or isinstance(s, Composite):
                raise missing_spec_key(self, k, "observation spec", leaf_keys(obs))
            if self.unsqueeze_if_needed and s.ndim == nb:
                s = map_bounded(s, lambda t: t.unsqueeze(-1))
            specs.append(s)
        out = _cat_spec(specs, self.dim, self.in_keys)
        self.__dict__["_drop"] = [k for k in self.in_keys if k != self.out_key]
        removed = {}
        if self.del_keys:
            for k in self._drop:
                removed[k] = obs.pop(k)
        obs.set(self.out_key, out)
        self.__dict__["_removed"] = (obs, removed)
        return output_spec

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        # joined entries that are also state entries (inputs of the step) are kept
        state = set(input_spec["full_state_spec"].keys(include_nested=True, leaves_only=True))
        obs, removed = self.__dict__.get("_removed") or (None, {})
        keep = [k for k in removed if k in state]
        for k in keep:
            obs.set(k, removed[k])
        if keep:
            self.__dict__["_drop"] = [k for k in self._drop if k not in keep]
        self.__dict__["_removed"] = None
        return Transform.transform_input_spec(self, input_spec)

    def __repr__(self) -> str:
        return f"CatTensors(in_keys={self.in_keys}, out_key={self.out_key!r}, dim={self.dim})"


def _check_neg_dim(owner: str, dim: int) -> int:
    if not isinstance(dim, int) or dim >= 0:
        raise ValueError(
            f"{owner}: dim must be a negative int (counted from the end, so that the same "
            f"transform works for any batch shape), got {dim!r}"
        )
    return dim


def _unsqueeze_spec(spec: TensorSpec, dim: int) -> TensorSpec:
    pos = spec.ndim + dim + 1
    try:
        return spec.unsqueeze(pos)
    except (ValueError, IndexError):
        return map_bounded(spec, lambda t: t.unsqueeze(dim))


def _squeeze_spec(spec: TensorSpec, dim: int, owner: str, key: NestedKey) -> TensorSpec:
    if spec.ndim < -dim or spec.shape[dim] != 1:
        raise ValueError(
            f"{owner}: cannot squeeze dim {dim} of {key!r}: its spec has shape {list(spec.shape)}"
        )
    pos = spec.ndim + dim
    try:
        return spec.squeeze(pos)
    except (ValueError, IndexError):
        return map_bounded(spec, lambda t: t.squeeze(dim))


class UnsqueezeTransform(ObservationTransform):
    """Inserts a singleton dim at ``dim`` (negative) in the entries (outputs and/or inputs).

    Args:
        dim: a negative dim (counted from the end, so batch dims do not matter).
        in_keys, out_keys: output entries to unsqueeze.
        in_keys_inv, out_keys_inv: input entries: the policy writes the unsqueezed
            ``out_keys_inv`` and the env receives them squeezed at ``in_keys_inv``.

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv, check_env_specs
        >>> from steersman.envs.transforms import TransformedEnv, UnsqueezeTransform
        >>> env = TransformedEnv(CartPoleEnv(batch_size=[2], seed=0),
        ...                      UnsqueezeTransform(-2, in_keys=["observation"]))
        >>> check_env_specs(env)
        >>> env.reset()["observation"].shape             # [2, 1, 4]
        torch.Size([2, 1, 4])
    """

    def __init__(self, dim: int, in_keys: Any = None, out_keys: Any = None,
                 in_keys_inv: Any = None, out_keys_inv: Any = None, *,
                 allow_positive_dim: bool = False) -> None:
        # TorchRL's allow_positive_dim counts dim >= 0 from the first dim of the data,
        # batch dims included, so the result depends on the batch shape; here dims are
        # negative only (the same transform fits any batch): the flag is accepted, and a
        # dim >= 0 is refused either way, with the reason
        del allow_positive_dim
        super().__init__(in_keys, out_keys, in_keys_inv, out_keys_inv)
        if not self.in_keys and not self.in_keys_inv:
            raise ValueError(f"{type(self).__name__} needs in_keys and/or in_keys_inv")
        self.dim = _check_neg_dim(type(self).__name__, dim)

    def _apply_transform(self, x: Tensor) -> Tensor:
        return x.unsqueeze(self.dim)

    def _inv_apply_transform(self, x: Tensor) -> Tensor:
        return x.squeeze(self.dim)

    def _transform_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        return _unsqueeze_spec(spec, self.dim)

    def _transform_inv_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        return _unsqueeze_spec(spec, self.dim)

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, dim={self.dim})".replace("(, ", "(")


class SqueezeTransform(ObservationTransform):
    """Removes the singleton dim ``dim`` (negative) of the entries (outputs and/or inputs).

    Args:
        dim: a negative dim whose size is 1 in every transformed entry.
        in_keys, out_keys: output entries to squeeze.
        in_keys_inv, out_keys_inv: input entries: the policy writes the squeezed
            ``out_keys_inv``, the env receives them unsqueezed at ``in_keys_inv``.

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv, check_env_specs
        >>> from steersman.envs.transforms import SqueezeTransform, TransformedEnv
        >>> env = TransformedEnv(CartPoleEnv(batch_size=[2], seed=0), SqueezeTransform(-1, in_keys=["reward"]))
        >>> check_env_specs(env)
        >>> env.rollout(3)["next", "reward"].shape       # [2, 3] (was [2, 3, 1])
        torch.Size([2, 3])
    """

    def __init__(self, dim: int, in_keys: Any = None, out_keys: Any = None,
                 in_keys_inv: Any = None, out_keys_inv: Any = None) -> None:
        super().__init__(in_keys, out_keys, in_keys_inv, out_keys_inv)
        if not self.in_keys and not self.in_keys_inv:
            raise ValueError(f"{type(self).__name__} needs in_keys and/or in_keys_inv")
        self.dim = _check_neg_dim(type(self).__name__, dim)

    def _apply_transform(self, x: Tensor) -> Tensor:
        return x.squeeze(self.dim)

    def _inv_apply_transform(self, x: Tensor) -> Tensor:
        return x.unsqueeze(self.dim)

    def _transform_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        return _squeeze_spec(spec, self.dim, type(self).__name__, key)

    def _transform_inv_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        return _squeeze_spec(spec, self.dim, type(self).__name__, key)

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, dim={self.dim})".replace("(, ", "(")
