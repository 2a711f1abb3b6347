"""Normalization: ObservationNorm (fixed affine map, ``init_stats``) and VecNorm (running stats)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from steersman.data import Composite, TensorSpec, Unbounded
from steersman.tensordict import TensorDictBase
from steersman.tensordict._utils import NestedKey

from ._utils import expand_mask, map_bounded, missing_key, reset_mask
from .base import Compose, ObservationTransform, Transform

__all__ = ["ObservationNorm", "VecNorm"]


def _as_float(x: Any) -> Tensor | None:
    if x is None:
        return None
    t = torch.as_tensor(x)
    if not t.is_floating_point():
        t = t.to(torch.get_default_dtype())
    return t


class ObservationNorm(ObservationTransform):
    """Affine normalization of observations: ``x * scale + loc``, or ``(x - loc) / scale``
    with ``standard_normal=True``.

    Args:
        loc, scale: numbers or tensors broadcastable to the entries; None until
            :meth:`init_stats` (or an assignment) sets them.
        in_keys, out_keys: the entries (default ``["observation"]``).
        in_keys_inv, out_keys_inv: input entries mapped back with the inverse map (the
            policy then works in the normalized space).
        standard_normal: the map ``(x - loc) / scale``.
        eps: lower bound of ``scale`` in the standard-normal map.

    Results keep the entry's floating dtype. Bounded specs get mapped bounds.

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv, check_env_specs
        >>> from steersman.envs.transforms import ObservationNorm, TransformedEnv
        >>> env = TransformedEnv(CartPoleEnv(batch_size=[8], seed=0), ObservationNorm(standard_normal=True))
        >>> env.transform.init_stats(num_iter=50, reduce_dim=(0, 1), cat_dim=1)
        >>> env.transform.loc.shape, env.transform.scale.shape
        (torch.Size([4]), torch.Size([4]))
        >>> check_env_specs(env)
    """

    def __init__(self, loc: Any = None, scale: Any = None, in_keys: Any = None,
                 out_keys: Any = None, in_keys_inv: Any = None, out_keys_inv: Any = None,
                 standard_normal: bool = False, eps: float = 1e-6) -> None:
        super().__init__(["observation"] if in_keys is None else in_keys, out_keys,
                         in_keys_inv, out_keys_inv)
        self.register_buffer("loc", _as_float(loc))
        self.register_buffer("scale", _as_float(scale))
        self.standard_normal = standard_normal
        self.eps = eps

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("loc", "scale") and value is not None and not isinstance(value, Tensor):
            value = _as_float(value)
        super().__setattr__(name, value)
        if name in ("loc", "scale", "standard_normal") and "_container_ref" in self.__dict__:
            self._invalidate_specs()

    @property
    def initialized(self) -> bool:
        """True once ``loc`` and ``scale`` are set."""
        return self.loc is not None and self.scale is not None

    def _stats(self) -> tuple[Tensor, Tensor]:
        loc, scale = self.loc, self.scale
        if loc is None or scale is None:
            raise RuntimeError(
                "ObservationNorm: loc and scale are not set; pass them to the constructor or "
                "call init_stats(num_iter) on the transform inside its TransformedEnv"
            )
        return loc, scale

    def _apply_transform(self, x: Tensor) -> Tensor:
        loc, scale = self._stats()
        if self.standard_normal:
            out = (x - loc) / scale.clamp_min(self.eps)
        else:
            out = x * scale + loc
        if x.is_floating_point() and out.dtype != x.dtype:
            out = out.to(x.dtype)
        return out

    def _inv_apply_transform(self, x: Tensor) -> Tensor:
        loc, scale = self._stats()
        if self.standard_normal:
            out = x * scale.clamp_min(self.eps) + loc
        else:
            out = (x - loc) / scale
        if x.is_floating_point() and out.dtype != x.dtype:
            out = out.to(x.dtype)
        return out

    def _transform_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        if not self.initialized:
            return spec
        dtype = spec.dtype if spec.dtype.is_floating_point else self.loc.dtype
        try:
            return map_bounded(spec, lambda t: self._apply_transform(t.to(dtype)), dtype=dtype)
        except RuntimeError as err:
            raise ValueError(
                f"ObservationNorm: loc {list(self.loc.shape)} / scale {list(self.scale.shape)} do not "
                f"broadcast to {key!r} of shape {list(spec.shape)}: {err}"
            ) from None

    def _transform_inv_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        return self._transform_spec_leaf(spec, key)

    @torch.no_grad()
    def init_stats(self, num_iter: int, reduce_dim: int | Sequence[int] = 0, cat_dim: int | None = None,
                   key: NestedKey | None = None, keep_dims: Sequence[int] | None = None) -> None:
        """Sets ``loc``/``scale`` from the parent env's observations (random actions).

        Rolls out the env up to this transform (``parent``) until ``num_iter`` samples
        along ``cat_dim`` are collected, then takes the mean and standard deviation over
        ``reduce_dim``. For an env of batch ``[B]`` the rollout is ``[B, T, *feature]``:
        use ``reduce_dim=(0, 1), cat_dim=1``; unbatched: ``[T, *feature]``,
        ``reduce_dim=0``. The reduced dims are dropped unless listed in ``keep_dims``.
        With ``standard_normal=False``, ``loc = -mean / std`` and ``scale = 1 / std`` so
        that the result is standardized either way.
        """
        parent = self.parent
        if parent is None:
            raise RuntimeError("ObservationNorm.init_stats needs the transform to be inside a TransformedEnv")
        key = self.in_keys[0] if key is None else key
        dims = (reduce_dim,) if isinstance(reduce_dim, int) else tuple(reduce_dim)
        if cat_dim is None:
            if not isinstance(reduce_dim, int):
                raise ValueError("ObservationNorm.init_stats: give cat_dim when reduce_dim is not an int")
            cat_dim = reduce_dim
        data: list[Tensor] = []
        n = 0
        while n < num_iter:
            td = parent.rollout(max_steps=num_iter, break_when_any_done=False)
            x = td.get(key, None)
            if x is None:
                raise missing_key(self, key, td, "in_keys (init_stats)")
            data.append(x)
            n += x.shape[cat_dim]
        x = torch.cat(data, cat_dim).narrow(cat_dim, 0, num_iter)
        if not x.is_floating_point():
            x = x.to(torch.get_default_dtype())
        dims = tuple(sorted(d % x.ndim for d in dims))
        loc = x.mean(dims, keepdim=True)
        scale = x.std(dims, keepdim=True)
        keep = set() if keep_dims is None else {d % x.ndim for d in keep_dims}
        for d in reversed(dims):
            if d not in keep:
                loc, scale = loc.squeeze(d), scale.squeeze(d)
        if not self.standard_normal:
            scale = 1.0 / scale.clamp_min(self.eps)
            loc = -loc * scale
        self.loc = loc
        self.scale = scale

    def __repr__(self) -> str:
        stats = "initialized" if self.initialized else "uninitialized"
        return (f"ObservationNorm(in_keys={self.in_keys}, standard_normal={self.standard_normal}, "
                f"{stats})")


def _buffer_name(kind: str, key: NestedKey) -> str:
    name = key if type(key) is str else "__".join(key)
    return f"vn_{kind}_{name}"


class VecNorm(ObservationTransform):
    """Normalizes entries with running (exponentially decayed) mean and variance.

    Args:
        in_keys, out_keys: the entries (default ``["observation"]``).
        decay: weight of the past statistics at each update (``1``: plain averages).
        eps: floor of the variance (the std is at least ``sqrt(eps)``).

    Statistics are updated with the step outputs (and the reset outputs of the reset
    sub-envs) only while the module is in training mode (``train()``, the default) and
    not frozen. For evaluation use ``eval()``, :meth:`freeze`, a :meth:`frozen_copy`
    (it shares the statistics, so it sees later training updates, but never updates
    them) or :meth:`to_observation_norm` (a snapshot). Output: ``(x - mean) / std`` in
    the entry's floating dtype; the spec becomes ``Unbounded``.

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv, check_env_specs
        >>> from steersman.envs.transforms import TransformedEnv, VecNorm
        >>> vn = VecNorm(decay=0.99)
        >>> env = TransformedEnv(CartPoleEnv(batch_size=[4], seed=0), vn)
        >>> check_env_specs(env)
        >>> _ = env.rollout(20, break_when_any_done=False)
        >>> frozen = vn.frozen_copy()
        >>> eval_env = TransformedEnv(CartPoleEnv(batch_size=[4], seed=1), frozen)
        >>> before = vn.state_dict()["vn_sum_observation"].clone()
        >>> _ = eval_env.rollout(20, break_when_any_done=False)   # no update from eval data
        >>> torch.equal(before, vn.state_dict()["vn_sum_observation"])
        True
    """

    def __init__(self, in_keys: Any = None, out_keys: Any = None, decay: float = 0.9999,
                 eps: float = 1e-4, *, lock: Any = None, new_api: bool | None = None,
                 shapes: Any = None, shared_td: Any = None) -> None:
        # TorchRL's lock/shared_td/shapes share statistics between processes through a
        # shared TensorDict; here statistics are module buffers (state_dict): a lock is
        # accepted and unused, a shared TensorDict is refused. new_api picks TorchRL's
        # VecNormV2 implementation: both APIs are this one.
        if shared_td is not None or shapes is not None:
            raise ValueError(
                f"{type(self).__name__}: shared_td/shapes (statistics shared across processes) are not "
                "supported; the statistics are module buffers: copy them with state_dict / "
                "load_state_dict, or use frozen_copy() for evaluation envs"
            )
        del lock, new_api
        super().__init__(["observation"] if in_keys is None else in_keys, out_keys)
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"VecNorm: decay must be in (0, 1], got {decay}")
        self.decay = decay
        self.eps = eps
        self.frozen = False

    # ------------------------------------------------------------------ stats
    def _get(self, key: NestedKey) -> tuple[Tensor, Tensor, Tensor] | None:
        b = self._buffers
        s = b.get(_buffer_name("sum", key))
        if s is None:
            return None
        return s, b[_buffer_name("ssq", key)], b[_buffer_name("count", key)]

    def _init_buffers(self, key: NestedKey, feat: torch.Size, dtype: torch.dtype, device: Any) -> None:
        if self._get(key) is not None:
            return
        if not dtype.is_floating_point:
            dtype = torch.get_default_dtype()
        self.register_buffer(_buffer_name("sum", key), torch.zeros(feat, dtype=dtype, device=device))
        self.register_buffer(_buffer_name("ssq", key), torch.zeros(feat, dtype=dtype, device=device))
        self.register_buffer(_buffer_name("count", key), torch.zeros((), dtype=dtype, device=device))

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any, **kwargs: Any) -> None:
        for name, value in state_dict.items():
            if name.startswith(prefix + "vn_"):
                local = name[len(prefix):]
                if local not in self._buffers:
                    self.register_buffer(local, torch.zeros_like(value))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @property
    def _updating(self) -> bool:
        return self.training and not self.frozen

    def _update(self, key: NestedKey, x: Tensor, batch_dims: int, weight: Tensor | None = None) -> None:
        stats = self._get(key)
        if stats is None:
            self._init_buffers(key, x.shape[batch_dims:], x.dtype, x.device)
            stats = self._get(key)
        s, q, c = stats
        xs = x.to(s.dtype)
        dims = tuple(range(batch_dims))
        if weight is None:
            n = float(x.shape[:batch_dims].numel())
            bsum, bsq = xs.sum(dims), (xs * xs).sum(dims)
        else:
            w = expand_mask(weight, xs).to(s.dtype)
            xw = xs * w
            n = weight.sum().to(s.dtype)
            bsum, bsq = xw.sum(dims), (xw * xs).sum(dims)
        d = self.decay
        s.mul_(d).add_(bsum)
        q.mul_(d).add_(bsq)
        c.mul_(d).add_(n)

    def _mean_std(self, key: NestedKey) -> tuple[Tensor, Tensor]:
        stats = self._get(key)
        if stats is None:
            raise RuntimeError(f"VecNorm: no statistics for {key!r} yet (no data seen)")
        s, q, c = stats
        cnt = c.clamp_min(1e-12)
        mean = s / cnt
        var = (q / cnt - mean * mean).clamp_min(self.eps)
        std = torch.where(c > 0, var.sqrt(), torch.ones_like(var))
        return mean, std

    def _normalize(self, key: NestedKey, x: Tensor) -> Tensor:
        mean, std = self._mean_std(key)
        out = (x - mean) / std
        if x.is_floating_point() and out.dtype != x.dtype:
            out = out.to(x.dtype)
        return out

    def _process(self, td: TensorDictBase, pairs: list, weight: Tensor | None,
                 update: bool) -> TensorDictBase:
        nb = td.batch_dims
        for ik, ok in pairs:
            try:
                x = td.get(ik)
            except KeyError:
                raise missing_key(self, ik, td) from None
            if update:
                self._update(ik, x, nb, weight)
            elif self._get(ik) is None:
                self._init_buffers(ik, x.shape[nb:], x.dtype, x.device)
            td.set(ok, self._normalize(ik, x))
        return td

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._process(tensordict, self._pairs, None, self._updating)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Normalizes the entries at the root and under ``"next"``.

        In training mode (not frozen) the statistics are updated once per key, with the
        root entries (or the ``"next"`` ones if the key is only there).
        """
        updating = self._updating
        nxt = tensordict.get("next", None)
        if nxt is None or isinstance(nxt, Tensor):
            return self._process(tensordict, self._pairs, None, updating)
        for ik, ok in self._pairs:
            at_root = ik in tensordict
            in_next = ik in nxt
            if not (at_root or in_next):
                raise missing_key(self, ik, tensordict)
            if at_root:
                self._process(tensordict, [(ik, ok)], None, updating)
            if in_next:
                self._process(nxt, [(ik, ok)], None, updating and not at_root)
        return tensordict

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        return self._process(next_tensordict, self._pairs, None, self._updating)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        pairs = self.__dict__["_reset_pairs"]
        pairs = self._pairs if pairs is None else pairs
        mask = reset_mask(tensordict, tensordict_reset.batch_size)
        return self._process(tensordict_reset, pairs, mask, self._updating)

    def _transform_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        dtype = spec.dtype if spec.dtype.is_floating_point else torch.get_default_dtype()
        return Unbounded(shape=spec.shape, device=spec.device, dtype=dtype)

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        nb = len(output_spec.shape)
        for part in ("full_observation_spec", "full_reward_spec"):
            spec = output_spec[part]
            for ik, _ in self._pairs:
                s = spec.get(ik, None)
                if s is not None and not isinstance(s, Composite):
                    self._init_buffers(ik, s.shape[nb:], s.dtype, s.device)
        return super().transform_output_spec(output_spec)

    # ------------------------------------------------------------------ evaluation
    def freeze(self) -> VecNorm:
        """Stops updating the statistics (in place; returns self)."""
        self.frozen = True
        return self

    def unfreeze(self) -> VecNorm:
        """Resumes updating the statistics in training mode (returns self)."""
        self.frozen = False
        return self

    def frozen_copy(self) -> VecNorm:
        """A frozen copy sharing this transform's statistics tensors (sees their updates)."""
        new = self.clone()
        for name, buf in self._buffers.items():
            if buf is not None:
                new._buffers[name] = buf
        new.frozen = True
        return new

    def to_observation_norm(self) -> Transform:
        """A snapshot of the current statistics as ObservationNorm(s) (standard-normal map)."""
        norms = []
        for ik, ok in self._pairs:
            mean, std = self._mean_std(ik)
            norms.append(ObservationNorm(loc=mean.clone(), scale=std.clone(), in_keys=[ik],
                                         out_keys=[ok], standard_normal=True, eps=0.0))
        return norms[0] if len(norms) == 1 else Compose(*norms)

    def __repr__(self) -> str:
        return f"VecNorm(in_keys={self.in_keys}, decay={self.decay}, eps={self.eps}, frozen={self.frozen})"


class VecNormV2(VecNorm):
    """TorchRL's newer ``VecNorm`` API (``VecNorm(..., new_api=True)``): the same running
    normalization as :class:`VecNorm`, with its constructor.

    Args:
        in_keys, out_keys: the entries to normalize (``in_keys`` required).
        decay, eps: as :class:`VecNorm`.
        lock: accepted and unused (statistics are this module's buffers).
        stateful: only True (the statistics live in the transform); False raises.
        shared_data: refused if given (see :class:`VecNorm`).
        reduce_batch_dims: accepted; statistics are always pooled over the batch dims
            (one mean/std per feature, shared by the sub-envs).

    Example:
        >>> from steersman.envs import CartPoleEnv, TransformedEnv, VecNormV2
        >>> env = TransformedEnv(CartPoleEnv(batch_size=[4], seed=0), VecNormV2(in_keys=["observation"]))
        >>> env.rollout(5, break_when_any_done=False)["next", "observation"].shape
        torch.Size([4, 5, 4])
    """

    def __init__(self, in_keys: Any, out_keys: Any = None, *, lock: Any = None, stateful: bool = True,
                 decay: float = 0.9999, eps: float = 1e-4, shared_data: Any = None,
                 reduce_batch_dims: bool = False) -> None:
        if not stateful:
            raise ValueError(
                "VecNormV2: stateful=False (statistics passed in the data) is not supported; use "
                "ObservationNorm with fixed loc/scale, or a frozen VecNormV2"
            )
        super().__init__(in_keys, out_keys, decay=decay, eps=eps, lock=lock, shared_td=shared_data)
        self.reduce_batch_dims = bool(reduce_batch_dims)
