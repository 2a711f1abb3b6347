"""Action-space transforms: the policy sees another action space than the env.

``ActionScaling`` (a normalized box), ``DiscreteActionProjection`` (a larger one-hot
space), ``FlattenAction`` (a flat action vector). Both map the policy's action to the env's on the way in (``inv``); their
``forward`` maps env actions (e.g. in a replay-buffer sample) to the policy's space.
Inside an env they leave the env's outputs alone.
"""

from __future__ import annotations

import enum
from typing import Any

import torch
from torch import Tensor

from steersman.data import Bounded, Composite, MultiCategorical, MultiOneHot, OneHot, Unbounded
from steersman.tensordict import TensorDictBase
from steersman.tensordict._utils import NestedKey, unravel_key

from ._utils import missing_key, missing_spec_key
from .base import Transform

__all__ = ["ActionScaling", "DiscreteActionProjection", "FlattenAction", "ActionDiscretizer"]


def _seeded_generator(seed: int | None) -> torch.Generator | None:
    if seed is None:
        return None
    g = torch.Generator()
    g.manual_seed(int(seed) & ((1 << 63) - 1))
    return g


class ActionScaling(Transform):
    """Exposes a normalized action box to the policy; rescales actions to the env's bounds.

    With the env's ``Bounded`` action spec ``[low, high]``: ``loc = (high + low) / 2``,
    ``scale = (high - low) / 2``. With ``standard_normal=True`` (default) the policy's
    actions live in ``[-1, 1]`` and the env receives ``a * scale + loc``; with
    ``standard_normal=False`` they live in ``[0, 1]`` (0 is ``low``, 1 is ``high``).
    ``forward`` (env action -> normalized, e.g. on replay-buffer samples) is the inverse map.

    Args:
        in_keys_inv: the env's action entry (default ``["action"]``); one key per instance.
        out_keys_inv: the entry the policy writes (default ``in_keys_inv``).
        in_keys, out_keys: the entries ``forward`` reads and writes (default
            ``in_keys_inv`` and ``in_keys``).

    Keyword Args:
        loc, scale: explicit affine parameters (both or neither; ``scale`` nonzero);
            otherwise they come from the action spec when the env computes its specs.
        standard_normal: ``[-1, 1]`` (True) or ``[0, 1]`` (False) policy space.

    Example:
        >>> import torch
        >>> from steersman.envs import PendulumEnv, check_env_specs
        >>> from steersman.envs.transforms import ActionScaling, TransformedEnv
        >>> env = TransformedEnv(PendulumEnv(seed=0), ActionScaling())   # torque in [-2, 2]
        >>> check_env_specs(env)
        >>> env.action_spec.low, env.action_spec.high
        (tensor([-1.]), tensor([1.]))
        >>> from steersman import TensorDict
        >>> env.transform.inv(TensorDict(action=torch.tensor([0.5]), batch_size=[]))["action"]
        tensor([1.])
    """

    _check_spec_in_keys = False

    def __init__(self, in_keys_inv: Any = None, out_keys_inv: Any = None, in_keys: Any = None,
                 out_keys: Any = None, *, loc: float | Tensor | None = None,
                 scale: float | Tensor | None = None, standard_normal: bool = True) -> None:
        in_keys_inv = ["action"] if in_keys_inv is None else in_keys_inv
        super().__init__(in_keys_inv if in_keys is None else in_keys, out_keys, in_keys_inv, out_keys_inv)
        for what, keys in (("in_keys_inv", self.in_keys_inv), ("out_keys_inv", self.out_keys_inv),
                           ("in_keys", self.in_keys), ("out_keys", self.out_keys)):
            if len(keys) != 1:
                raise ValueError(f"ActionScaling scales one action entry; {what} has {len(keys)}: {keys} "
                                 "(compose several ActionScaling for several actions)")
        if (loc is None) != (scale is None):
            raise ValueError("ActionScaling: pass both loc and scale, or neither (then they come from the "
                             f"action spec); got loc={loc!r}, scale={scale!r}")
        self.standard_normal = bool(standard_normal)
        self.__dict__["_explicit"] = loc is not None
        self.register_buffer("loc", None)
        self.register_buffer("scale", None)
        if loc is not None:
            dt = torch.get_default_dtype()
            loc_t = loc if isinstance(loc, Tensor) else torch.as_tensor(loc, dtype=dt)
            scale_t = scale if isinstance(scale, Tensor) else torch.as_tensor(scale, dtype=dt)
            if bool((scale_t == 0).any()) or not bool(scale_t.isfinite().all() & loc_t.isfinite().all()):
                raise ValueError(f"ActionScaling: scale must be finite and nonzero and loc finite, got "
                                 f"loc={loc_t.tolist()}, scale={scale_t.tolist()}")
            self.loc, self.scale = loc_t.clone(), scale_t.clone()

    def _affine(self, like: Tensor) -> tuple[Tensor, Tensor]:
        """``(mult, offset)`` with ``env = policy * mult + offset``, as ``like``'s dtype/device."""
        loc, scale = self.loc, self.scale
        if loc is None:
            raise RuntimeError("ActionScaling: loc and scale are not known yet; pass them, or use the "
                               "transform in a TransformedEnv (they come from its action spec)")
        if self.standard_normal:
            return scale.to(like), loc.to(like)
        return (2 * scale).to(like), (loc - scale).to(like)

    def _apply_transform(self, x: Tensor) -> Tensor:  # env action -> normalized
        mult, offset = self._affine(x)
        return (x - offset) / mult

    def _inv_apply_transform(self, x: Tensor) -> Tensor:  # normalized -> env action
        mult, offset = self._affine(x)
        return x * mult + offset

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict  # the env's outputs hold no action

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Env actions -> normalized ones (at the root and under ``"next"``), e.g. on replay samples."""
        return self._forward_pairs(tensordict)

    def transform_action_spec(self, action_spec: Composite) -> Composite:
        ik, ok = self._pairs_inv[0]
        spec = action_spec.get(ik, None)
        if spec is None or isinstance(spec, Composite):
            raise missing_spec_key(self, ik, "action spec", list(action_spec.keys(True, True)))
        if not self.__dict__["_explicit"]:
            if not isinstance(spec, Bounded) or not spec.dtype.is_floating_point:
                raise TypeError(f"ActionScaling: the action {ik!r} needs a continuous Bounded spec to derive "
                                f"loc and scale, got {type(spec).__name__}; pass loc and scale")
            low, high = spec.low, spec.high
            if not bool(low.isfinite().all() & high.isfinite().all()) or bool((high <= low).any()):
                raise ValueError(f"ActionScaling: the bounds of {ik!r} must be finite with low < high, got "
                                 f"low={low.tolist()}, high={high.tolist()}")
            nb = len(action_spec.shape)
            feat = spec.shape[nb:]
            first_lo, first_hi = low.reshape(-1, *feat)[0], high.reshape(-1, *feat)[0]
            if bool((low == first_lo).all() & (high == first_hi).all()):
                low, high = first_lo, first_hi  # one box for every sub-env: also fits any batch
            self.loc, self.scale = (high + low) / 2, (high - low) / 2
        lo = -1.0 if self.standard_normal else 0.0
        dt = spec.dtype if spec.dtype.is_floating_point else torch.get_default_dtype()
        new = Bounded(lo, 1.0, shape=spec.shape, device=spec.device, dtype=dt)
        if ik != ok:
            action_spec.del_(ik)
        action_spec.set(ok, new)
        return action_spec

    def __repr__(self) -> str:
        return (f"ActionScaling(in_keys_inv={self.in_keys_inv}, out_keys_inv={self.out_keys_inv}, "
                f"standard_normal={self.standard_normal})")


class DiscreteActionProjection(Transform):
    """Lets a policy with ``max_actions`` one-hot actions drive an env with fewer.

    The policy writes one-hot actions over ``max_actions``; the env receives one-hot
    actions over ``num_actions_effective``: an action index ``>= num_actions_effective``
    is replaced by a uniformly drawn valid one (seeded by ``env.set_seed``). With
    ``include_forward=True``, ``forward`` pads the env's one-hot actions (e.g. in a
    replay sample) with zeros to ``max_actions``; otherwise it returns the data as is.

    Args:
        num_actions_effective: the env's number of actions.
        max_actions: the policy's number of actions (``>= num_actions_effective``).
        action_key: the action entry (default ``"action"``).
        include_forward: ``forward`` maps env actions to the policy's space.

    The env's action spec must be ``OneHot(num_actions_effective)``; the transformed one
    is ``OneHot(max_actions)`` of the same dtype.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs.transforms import DiscreteActionProjection
        >>> t = DiscreteActionProjection(3, 5)
        >>> t.inv(TensorDict(action=torch.tensor([0, 1, 0, 0, 0]), batch_size=[]))["action"]
        tensor([0, 1, 0])
        >>> t(TensorDict(action=torch.tensor([0, 0, 1]), batch_size=[]))["action"]
        tensor([0, 0, 1, 0, 0])
    """

    _check_spec_in_keys = False

    def __init__(self, num_actions_effective: int, max_actions: int, action_key: NestedKey = "action",
                 include_forward: bool = True) -> None:
        for name, v in (("num_actions_effective", num_actions_effective), ("max_actions", max_actions)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"DiscreteActionProjection: {name} must be a positive int, got {v!r}")
        if num_actions_effective > max_actions:
            raise ValueError(f"DiscreteActionProjection: num_actions_effective={num_actions_effective} is "
                             f"larger than max_actions={max_actions}")
        key = unravel_key(action_key)
        super().__init__([key] if include_forward else [], None, [key])
        self.num_actions_effective = num_actions_effective
        self.max_actions = max_actions
        self.action_key = key
        self.include_forward = include_forward
        self.__dict__["_gen"] = None

    def _set_seed(self, seed: int | None) -> None:
        self.__dict__["_gen"] = _seeded_generator(seed)

    def _apply_transform(self, x: Tensor) -> Tensor:  # env one-hot -> padded
        n = x.shape[-1]
        if n != self.num_actions_effective:
            raise ValueError(f"DiscreteActionProjection: the action {self.action_key!r} has {n} entries "
                             f"(last dim), expected num_actions_effective={self.num_actions_effective}")
        pad = x.new_zeros((*x.shape[:-1], self.max_actions - n))
        return torch.cat([x, pad], -1)

    def _inv_apply_transform(self, x: Tensor) -> Tensor:  # policy one-hot -> env one-hot
        if x.shape[-1] != self.max_actions:
            raise ValueError(f"DiscreteActionProjection: the action {self.action_key!r} has {x.shape[-1]} "
                             f"entries (last dim), expected max_actions={self.max_actions}")
        n = self.num_actions_effective
        idx = (x.to(torch.uint8) if x.dtype == torch.bool else x).argmax(-1)
        bad = idx >= n
        if bool(bad.any()):
            draw = torch.randint(n, idx.shape, generator=self.__dict__["_gen"]).to(idx.device)
            idx = torch.where(bad, draw, idx)
        return torch.nn.functional.one_hot(idx, n).to(x.dtype)

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict  # the env's outputs hold no action

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Pads env one-hot actions to ``max_actions`` (``include_forward``), root and ``"next"``."""
        if not self.include_forward:
            return tensordict
        return self._forward_pairs(tensordict)

    def transform_action_spec(self, action_spec: Composite) -> Composite:
        key = self.action_key
        spec = action_spec.get(key, None)
        if spec is None or isinstance(spec, Composite):
            raise missing_spec_key(self, key, "action spec", list(action_spec.keys(True, True)))
        if not isinstance(spec, OneHot) or spec.n != self.num_actions_effective:
            raise TypeError(f"DiscreteActionProjection: the action {key!r} must have a "
                            f"OneHot({self.num_actions_effective}) spec, got {spec!r}")
        action_spec.set(key, OneHot(self.max_actions, shape=(*spec.shape[:-1], self.max_actions),
                                    device=spec.device, dtype=spec.dtype))
        return action_spec

    def __repr__(self) -> str:
        return (f"DiscreteActionProjection(num_actions_effective={self.num_actions_effective}, "
                f"max_actions={self.max_actions}, action_key={self.action_key!r})")


class FlattenAction(Transform):
    """Shows the policy a flattened action; the env receives it in its own shape.

    The env's action dims ``first_dim..last_dim`` (inclusive) are one dim for the policy:
    ``inv`` unflattens the policy's action back to the env's shape; ``forward`` (env
    action -> flat, e.g. on replay samples) flattens it.

    Args:
        first_dim, last_dim: the span (negative; or non-negative feature dims, counted
            after the batch dims, with ``allow_positive_dim=True``). Default ``-2, -1``.
        in_keys_inv: the env's action entries (default ``["action"]``; each gets the same span).
        out_keys_inv: the entries the policy writes (default ``in_keys_inv``).
        in_keys, out_keys: the entries ``forward`` reads and writes (default
            ``in_keys_inv`` and ``in_keys``).
        allow_positive_dim: accept non-negative dims.

    Keyword Args:
        action_shape: the sizes of the flattened span, for ``inv`` outside an env
            (in an env they come from the action spec).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs.transforms import FlattenAction
        >>> t = FlattenAction(action_shape=[2, 3])
        >>> t.inv(TensorDict(action=torch.arange(6.0), batch_size=[]))["action"]
        tensor([[0., 1., 2.],
                [3., 4., 5.]])
        >>> t(TensorDict(action=torch.ones(4, 2, 3), batch_size=[4]))["action"].shape
        torch.Size([4, 6])
    """

    _check_spec_in_keys = False

    def __init__(self, first_dim: int = -2, last_dim: int = -1, in_keys_inv: Any = None, out_keys_inv: Any = None,
                 in_keys: Any = None, out_keys: Any = None, allow_positive_dim: bool = False, *,
                 action_shape: Any = None) -> None:
        for name, d in (("first_dim", first_dim), ("last_dim", last_dim)):
            if isinstance(d, bool) or not isinstance(d, int):
                raise TypeError(f"FlattenAction: {name} must be an int, got {d!r}")
            if d >= 0 and not allow_positive_dim:
                raise ValueError(f"FlattenAction: {name}={d} must be negative; pass allow_positive_dim=True for "
                                 "feature dims counted after the batch dims")
        if (first_dim < 0) != (last_dim < 0) or first_dim >= last_dim:
            raise ValueError(f"FlattenAction: first_dim={first_dim} must come before last_dim={last_dim} (same sign)")
        in_keys_inv = ["action"] if in_keys_inv is None else in_keys_inv
        super().__init__(in_keys_inv if in_keys is None else in_keys, out_keys, in_keys_inv, out_keys_inv)
        self._pairs  # noqa: B018  (validates the lengths now)
        self._pairs_inv  # noqa: B018
        self.first_dim, self.last_dim = first_dim, last_dim
        self.allow_positive_dim = allow_positive_dim
        span = last_dim - first_dim + 1
        if action_shape is not None:
            action_shape = [int(v) for v in action_shape]
            if len(action_shape) != span or min(action_shape) < 1:
                raise ValueError(f"FlattenAction: action_shape must be {span} positive sizes (dims "
                                 f"{first_dim}..{last_dim}), got {action_shape}")
        self.action_shape = action_shape
        self.__dict__["_sizes"] = {}

    def _span(self, ndim: int, batch_dims: int) -> tuple[int, int]:
        if self.first_dim >= 0:
            return self.first_dim + batch_dims, self.last_dim + batch_dims
        return self.first_dim + ndim, self.last_dim + ndim

    def _flatten(self, x: Tensor, batch_dims: int) -> Tensor:  # env -> flat
        f, last = self._span(x.ndim, batch_dims)
        if f < batch_dims or last >= x.ndim:
            raise ValueError(f"FlattenAction: dims {self.first_dim}..{self.last_dim} do not fit an action of "
                             f"shape {list(x.shape)} ({batch_dims} batch dims)")
        return x.flatten(f, last)

    def _unflatten(self, x: Tensor, batch_dims: int, key: NestedKey) -> Tensor:  # flat -> env
        sizes = self.__dict__.get("_sizes", {}).get(key, self.action_shape)
        if sizes is None:
            raise RuntimeError("FlattenAction: the env's action shape is not known; pass action_shape or use the "
                               "transform in a TransformedEnv")
        if self.first_dim >= 0:  # the flat dim sits where the span started
            pos = self.first_dim + batch_dims
        else:  # before the dims that follow the span
            pos = x.ndim - 1 - (-1 - self.last_dim)
        n = 1
        for v in sizes:
            n *= v
        if not batch_dims <= pos < x.ndim or x.shape[pos] != n:
            raise ValueError(f"FlattenAction: the policy's action {key!r} of shape {list(x.shape)} must have {n} "
                             f"entries (the product of {sizes}) at dim {pos}")
        return x.unflatten(pos, sizes)

    def _apply_pairs(self, td: TensorDictBase, pairs: list) -> TensorDictBase:
        nb = td.batch_dims
        for ik, ok in pairs:
            x = td.get(ik, None)
            if x is None:
                raise missing_key(self, ik, td)
            td.set(ok, self._flatten(x, nb))
        return td

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        nb = tensordict.batch_dims
        for ik, ok in self._pairs_inv:
            x = tensordict.get(ok, None)
            if x is None:
                raise missing_key(self, ok, tensordict, "out_keys_inv")
            tensordict.set(ik, self._unflatten(x, nb, ik))
        return tensordict

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict  # the env's outputs hold no action

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Env actions -> flat ones (at the root and under ``"next"``), e.g. on replay samples."""
        return self._forward_pairs(tensordict)

    def transform_action_spec(self, action_spec: Composite) -> Composite:
        nb = len(action_spec.shape)
        sizes = {}
        for ik, ok in self._pairs_inv:
            spec = action_spec.get(ik, None)
            if spec is None or isinstance(spec, Composite):
                raise missing_spec_key(self, ik, "action spec", list(action_spec.keys(True, True)))
            f, last = self._span(len(spec.shape), nb)
            if f < nb or last >= len(spec.shape):
                raise ValueError(f"FlattenAction: dims {self.first_dim}..{self.last_dim} do not fit the action "
                                 f"{ik!r} of shape {list(spec.shape)} ({nb} batch dims)")
            sizes[ik] = list(spec.shape[f:last + 1])
            shape = (*spec.shape[:f], spec.shape[f:last + 1].numel(), *spec.shape[last + 1:])
            if isinstance(spec, Bounded):
                new = Bounded(spec.low.flatten(f, last), spec.high.flatten(f, last), shape=shape,
                              device=spec.device, dtype=spec.dtype)
            elif isinstance(spec, Unbounded):
                new = Unbounded(shape=shape, device=spec.device, dtype=spec.dtype)
            else:
                raise TypeError(f"FlattenAction: the action {ik!r} has a {type(spec).__name__} spec; only "
                                "Bounded and Unbounded action specs can be flattened")
            if ik != ok:
                action_spec.del_(ik)
            action_spec.set(ok, new)
        self.__dict__["_sizes"] = sizes
        return action_spec

    def __repr__(self) -> str:
        return (f"FlattenAction(first_dim={self.first_dim}, last_dim={self.last_dim}, "
                f"in_keys_inv={self.in_keys_inv})")


class _Sampling(enum.IntEnum):
    """Where in its interval a discrete action lands (:class:`ActionDiscretizer`)."""

    MEDIAN = 0
    LOW = 1
    HIGH = 2
    RANDOM = 3


class ActionDiscretizer(Transform):
    """Discretizes a continuous (``Bounded``) action: the policy picks one of
    ``num_intervals`` intervals per action element, the env gets a point of it.

    Args:
        num_intervals: the number of intervals per element (an int, or a tensor with one
            count per element of the action's last dim).
        action_key: the env's continuous action (default ``"action"``).
        out_action_key: where the policy writes the discrete action (default:
            ``action_key``). When it differs, the continuous action is no longer an input
            of the transformed env (TorchRL moves it to the state spec and records it; here
            it is computed from the discrete one inside ``step`` and not recorded).
        sampling: an :attr:`ActionDiscretizer.SamplingStrategy` (default ``MEDIAN``, the
            interval's middle; ``LOW``/``HIGH`` its ends; ``RANDOM`` uniform in it).
        categorical: the discrete action is a ``MultiCategorical`` of indices ``[*batch,
            A]`` (default) or, if False, a ``MultiOneHot`` ``[*batch, sum(num_intervals)]``.

    Interval ``i`` of an element with bounds ``[low, high]`` and ``n`` intervals is
    ``[low + i (high - low) / n, low + (i + 1) (high - low) / n]`` (the bounds of the first
    sub-env are used for all: batched specs share their bounds).

    Example:
        >>> import torch
        >>> from steersman.envs import ActionDiscretizer, PendulumEnv, TransformedEnv, check_env_specs
        >>> env = TransformedEnv(PendulumEnv(seed=0), ActionDiscretizer(5))
        >>> env.action_spec.nvec.tolist(), env.action_spec.shape
        ([5], torch.Size([1]))
        >>> check_env_specs(env)
        >>> td = env.reset()
        >>> td["action"] = torch.tensor([4])
        >>> env.transform.inv(td)["action"]        # middle of [1.2, 2.0]
        tensor([1.6000])
    """

    SamplingStrategy = _Sampling

    def __init__(self, num_intervals: int | Tensor, action_key: NestedKey = "action",
                 out_action_key: NestedKey | None = None, sampling: Any = None,
                 categorical: bool = True) -> None:
        out = action_key if out_action_key is None else out_action_key
        super().__init__(in_keys_inv=[action_key], out_keys_inv=[out])
        n = torch.as_tensor(num_intervals)
        if n.dtype.is_floating_point or bool((n < 1).any()):
            raise ValueError(f"ActionDiscretizer: num_intervals must be positive ints, got {num_intervals!r}")
        self.num_intervals = n.long()
        self.action_key = self.in_keys_inv[0]
        self.out_action_key = self.out_keys_inv[0]
        self.sampling = _Sampling.MEDIAN if sampling is None else _Sampling(sampling)
        self.categorical = bool(categorical)
        self._nvec: Tensor | None = None
        self._low: Tensor | None = None
        self._high: Tensor | None = None

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        self._check_input_keys(input_spec)
        aspec = input_spec["full_action_spec"]
        spec = aspec.get(self.action_key, None)
        if not isinstance(spec, Bounded) or not spec.dtype.is_floating_point:
            raise ValueError(
                f"ActionDiscretizer: the action {self.action_key!r} must be a floating Bounded spec, "
                f"got {type(spec).__name__}"
            )
        a = spec.shape[-1] if spec.ndim else 1
        nvec = self.num_intervals.expand(a) if self.num_intervals.ndim == 0 else self.num_intervals
        if nvec.shape != (a,):
            raise ValueError(
                f"ActionDiscretizer: num_intervals has {nvec.numel()} counts, the action {self.action_key!r} "
                f"has {a} elements (its last dim)"
            )
        self._nvec = nvec.to(spec.device).clone()
        # the bounds of one sub-env ([A]): they broadcast over any batch and time dims
        self._low, self._high = spec.low.reshape(-1, a)[0].clone(), spec.high.reshape(-1, a)[0].clone()
        bs = spec.shape[:-1]
        if self.categorical:
            disc = MultiCategorical(self._nvec, shape=(*bs, a), device=spec.device, remove_singleton=False)
        else:
            disc = MultiOneHot(self._nvec, shape=(*bs, int(self._nvec.sum())), device=spec.device)
        aspec.del_(self.action_key)
        aspec.set(self.out_action_key, disc)
        return input_spec

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        try:
            disc = tensordict.get(self.out_action_key)
        except KeyError:
            raise missing_key(self, self.out_action_key, tensordict, "out_keys_inv") from None
        nvec = self._nvec
        if nvec is None:
            raise RuntimeError("ActionDiscretizer: used before its env computed the specs")
        if not self.categorical:
            idx = torch.stack([b.long().argmax(-1) for b in disc.split(nvec.tolist(), -1)], -1)
        else:
            idx = disc.long()
        low, high = self._low, self._high
        if self.sampling == _Sampling.RANDOM:
            frac = torch.rand(idx.shape, device=idx.device, dtype=low.dtype)
        else:
            frac = {_Sampling.MEDIAN: 0.5, _Sampling.LOW: 0.0, _Sampling.HIGH: 1.0}[self.sampling]
        width = (high - low) / nvec.to(low.dtype)
        tensordict.set(self.action_key, low + (idx.to(low.dtype) + frac) * width)
        if self.out_action_key != self.action_key:
            tensordict = tensordict.exclude(self.out_action_key)
        return tensordict

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Outside an env: the interval index of each continuous action (``categorical``)
        or its one-hot encoding, written at ``out_action_key``."""
        if self._nvec is None:
            raise RuntimeError("ActionDiscretizer.forward needs the specs: use it in an env first")
        x = tensordict.get(self.action_key)
        width = (self._high - self._low) / self._nvec.to(x.dtype)
        idx = torch.minimum(((x - self._low) / width).floor().long().clamp_min(0), self._nvec - 1)
        if not self.categorical:
            idx = torch.cat([torch.nn.functional.one_hot(i, int(n)).bool()
                             for i, n in zip(idx.unbind(-1), self._nvec.tolist())], -1)
        tensordict.set(self.out_action_key, idx)
        return tensordict

    def __repr__(self) -> str:
        return (f"ActionDiscretizer(num_intervals={self.num_intervals.tolist()}, action_key={self.action_key!r}, "
                f"out_action_key={self.out_action_key!r}, sampling={self.sampling.name}, "
                f"categorical={self.categorical})")
