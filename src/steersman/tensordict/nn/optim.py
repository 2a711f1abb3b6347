"""Functional optimizers over TensorDicts: ``(params, grads, state) -> (params, state)``.

:class:`Adam`, :class:`AdamW`, :class:`SGD` and :class:`RMSprop` follow ``torch.optim``'s update rules and
hyper-parameters (the single-tensor path, op for op, so eager results are bitwise equal
to ``torch.optim`` with ``foreach=False``). Nothing is modified in place and the step
counter is a tensor, so a step traces into one ``torch.compile(fullgraph=True)`` graph
that does not recompile as training advances. The state is a TensorDict
(``state.state_dict()`` / ``load_state_dict`` round-trip it); ``lr`` may be a 0-dim
tensor that the caller anneals in place. :func:`clip_grad_norm` is
``torch.nn.utils.clip_grad_norm_`` without the in-place write.

Example:
    >>> import torch
    >>> from steersman.tensordict import TensorDict
    >>> params = TensorDict({"w": torch.ones(3)}, batch_size=[])
    >>> opt = SGD(lr=0.1)
    >>> state = opt.init(params)
    >>> grads = TensorDict({"w": torch.ones(3)}, batch_size=[])
    >>> params, state = opt.step(params, grads, state)
    >>> params["w"]
    tensor([0.9000, 0.9000, 0.9000])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..base import TensorDictBase
from ..td import TensorDict

__all__ = ["SGD", "Adam", "AdamW", "RMSprop", "clip_grad_norm", "tree_from_leaves"]


def tree_from_leaves(keys: Sequence, values: Sequence, batch_size: Any, *, trusted: bool = False) -> TensorDict:
    """A nested TensorDict from ``keys`` (strings or tuples, as ``keys(True, True)``
    gives them) and their ``values``.

    ``trusted=True`` skips the constructor's per-entry checks (``TensorDict.from_trusted``):
    for values the caller made itself with the right batch dims (the optimizers' own state),
    a few times cheaper, and much cheaper for dynamo to trace."""
    root: dict = {}
    for key, value in zip(keys, values):
        path = key if isinstance(key, tuple) else (key,)
        node = root
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = value
    if not trusted:
        return TensorDict(root, batch_size=batch_size)
    size = torch.Size(batch_size)

    def wrap(node: dict) -> TensorDict:
        return TensorDict.from_trusted({k: wrap(v) if type(v) is dict else v for k, v in node.items()}, size)

    return wrap(root)


def _leaves(td: TensorDictBase) -> tuple[list, list]:
    keys = td.keys(include_nested=True, leaves_only=True)
    return keys, [td.get(k) for k in keys]


def clip_grad_norm(grads: TensorDictBase, max_norm: float, norm_type: float = 2.0) -> tuple[TensorDict, Tensor]:
    """``grads`` scaled so that their global ``norm_type``-norm is at most ``max_norm``,
    and that norm (before clipping): ``torch.nn.utils.clip_grad_norm_`` (``foreach=False``)
    without modifying ``grads``."""
    keys, values = _leaves(grads)
    clipped, total = clip_grad_norm_leaves(values, max_norm, norm_type)
    return tree_from_leaves(keys, clipped, grads.batch_size, trusted=True), total


def clip_grad_norm_leaves(grads: Sequence[Tensor], max_norm: float | Tensor, norm_type: float = 2.0
                          ) -> tuple[list[Tensor], Tensor]:
    """:func:`clip_grad_norm` on a flat sequence of gradients: the scaled gradients and the
    global norm before clipping (for pure functions over flat tensors, e.g. a compiled update)."""
    norms = [torch.linalg.vector_norm(g, norm_type) for g in grads]
    total = torch.linalg.vector_norm(torch.stack(norms), norm_type)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    return [g * coef for g in grads], total


def _check(name: str, value: Any, ok: bool, expected: str) -> None:
    if not ok:
        raise ValueError(f"{name} must be {expected}, got {value!r}")


def _as_f64(lr: float | Tensor) -> Tensor:
    return lr.to(torch.float64) if isinstance(lr, Tensor) else torch.tensor(lr, dtype=torch.float64)


class Adam:
    """Adam (``torch.optim.Adam``): L2 ``weight_decay`` added to the gradient.

    Args:
        lr: learning rate (a float, or a 0-dim tensor read at each step).
        betas: running-average coefficients of the gradient and its square.
        eps: added to the denominator.
        weight_decay: L2 penalty coefficient.
        amsgrad: use the running maximum of the second moment.
        maximize: ascend instead of descend.
    """

    decoupled = False

    def __init__(self, lr: float | Tensor = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, *, amsgrad: bool = False, maximize: bool = False) -> None:
        _check("lr", lr, isinstance(lr, Tensor) or lr >= 0.0, "a float >= 0 or a 0-dim tensor")
        _check("betas", betas, len(betas) == 2 and all(0.0 <= b < 1.0 for b in betas), "two floats in [0, 1)")
        _check("eps", eps, eps >= 0.0, ">= 0")
        _check("weight_decay", weight_decay, weight_decay >= 0.0, ">= 0")
        self.lr, self.betas, self.eps, self.weight_decay = lr, tuple(betas), eps, weight_decay
        self.amsgrad, self.maximize = amsgrad, maximize

    def init(self, params: TensorDictBase) -> TensorDict:
        """The initial state: ``step`` 0 and zero moments shaped as ``params``."""
        keys, values = _leaves(params)
        zeros = [torch.zeros_like(p, memory_format=torch.preserve_format).detach() for p in values]
        state = {"step": torch.zeros((), dtype=torch.float32),
                 "exp_avg": tree_from_leaves(keys, zeros, params.batch_size),
                 "exp_avg_sq": tree_from_leaves(keys, [z.clone() for z in zeros], params.batch_size)}
        if self.amsgrad:
            state["max_exp_avg_sq"] = tree_from_leaves(keys, [z.clone() for z in zeros], params.batch_size)
        return TensorDict(state, batch_size=[])

    def step(self, params: TensorDictBase, grads: TensorDictBase, state: TensorDictBase) -> tuple[TensorDict, TensorDict]:
        """One update: the new parameters and the new state (inputs untouched)."""
        keys, ps = _leaves(params)
        moments = [[state.get((name, *_tup(key))) for key in keys]
                   for name in ("exp_avg", "exp_avg_sq", *(("max_exp_avg_sq",) if self.amsgrad else ()))]
        new_p, new_m, new_v, new_vmax, step = self.step_leaves(
            ps, [grads.get(key) for key in keys], *moments[:2], state["step"], moments[2] if self.amsgrad else None)
        bs = params.batch_size
        out = {"step": step, "exp_avg": tree_from_leaves(keys, new_m, bs, trusted=True),
               "exp_avg_sq": tree_from_leaves(keys, new_v, bs, trusted=True)}
        if self.amsgrad:
            out["max_exp_avg_sq"] = tree_from_leaves(keys, new_vmax, bs, trusted=True)
        return tree_from_leaves(keys, new_p, bs, trusted=True), TensorDict(out, batch_size=[])

    def step_leaves(self, params: Sequence[Tensor], grads: Sequence[Tensor], exp_avg: Sequence[Tensor],
                    exp_avg_sq: Sequence[Tensor], step: Tensor, max_exp_avg_sq: Sequence[Tensor] | None = None,
                    *, lr: float | Tensor | None = None
                    ) -> tuple[list[Tensor], list[Tensor], list[Tensor], list[Tensor], Tensor]:
        """:meth:`step` on flat sequences (the same order in each): returns the new
        ``(params, exp_avg, exp_avg_sq, max_exp_avg_sq, step)`` (``max_exp_avg_sq`` empty
        without amsgrad). For pure functions over flat tensors, e.g. a compiled update that
        takes the learning rate as an input (``lr``; default ``self.lr``)."""
        beta1, beta2 = self.betas
        step = step + 1
        lr = _as_f64(self.lr if lr is None else lr)
        # torch.optim computes these in Python doubles; float64 0-dim tensors keep that
        # precision and, like Python scalars, are cast to the parameters' dtype per op.
        step64 = step.to(torch.float64)
        bias_correction1 = 1 - torch.pow(beta1, step64)
        bias_correction2_sqrt = torch.sqrt(1 - torch.pow(beta2, step64))
        neg_step_size = -(lr / bias_correction1)
        decay = 1 - lr * self.weight_decay
        new_p, new_m, new_v, new_vmax = [], [], [], []
        for i, (p, g) in enumerate(zip(params, grads)):
            if self.maximize:
                g = -g
            if self.weight_decay != 0:
                if self.decoupled:
                    p = p * (decay if p.dim() else decay.to(p.dtype))  # see below (0-dim)
                else:
                    g = g.add(p, alpha=self.weight_decay)
            m = torch.lerp(exp_avg[i], g, 1 - beta1)
            v = exp_avg_sq[i].mul(beta2).addcmul(g, g, value=1 - beta2)
            # a 0-dim parameter (SAC's log_alpha) would be promoted by the float64 scalars:
            # cast them to its dtype, as torch.optim's Python scalars are
            bc2, nss = (bias_correction2_sqrt, neg_step_size) if p.dim() else \
                (bias_correction2_sqrt.to(p.dtype), neg_step_size.to(p.dtype))
            if self.amsgrad:
                vmax = torch.maximum(max_exp_avg_sq[i], v)
                new_vmax.append(vmax)
                denom = vmax.sqrt() / bc2 + self.eps
            else:
                denom = v.sqrt() / bc2 + self.eps
            # addcdiv(p, m, denom, value=s) is p + s * m / denom, in that order
            new_p.append(p + nss * m / denom)
            new_m.append(m)
            new_v.append(v)
        return new_p, new_m, new_v, new_vmax, step

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(lr={self.lr}, betas={self.betas}, eps={self.eps}, "
                f"weight_decay={self.weight_decay}, amsgrad={self.amsgrad}, maximize={self.maximize})")


class AdamW(Adam):
    """AdamW (``torch.optim.AdamW``): Adam with decoupled weight decay
    (``p *= 1 - lr * weight_decay`` before the step); same arguments as :class:`Adam`."""

    decoupled = True

    def __init__(self, lr: float | Tensor = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, *, amsgrad: bool = False, maximize: bool = False) -> None:
        super().__init__(lr, betas, eps, weight_decay, amsgrad=amsgrad, maximize=maximize)


class SGD:
    """SGD (``torch.optim.SGD``) with optional (Nesterov) momentum, dampening and L2
    ``weight_decay``. As in torch, the first step's momentum buffer is the gradient."""

    def __init__(self, lr: float | Tensor = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, *, nesterov: bool = False, maximize: bool = False) -> None:
        _check("lr", lr, isinstance(lr, Tensor) or lr >= 0.0, "a float >= 0 or a 0-dim tensor")
        _check("momentum", momentum, momentum >= 0.0, ">= 0")
        _check("weight_decay", weight_decay, weight_decay >= 0.0, ">= 0")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError(f"nesterov needs momentum > 0 and dampening 0, got momentum={momentum}, "
                             f"dampening={dampening}")
        self.lr, self.momentum, self.dampening, self.weight_decay = lr, momentum, dampening, weight_decay
        self.nesterov, self.maximize = nesterov, maximize

    def init(self, params: TensorDictBase) -> TensorDict:
        """The initial state: ``step`` 0 and (with momentum) a zero momentum buffer."""
        state: dict = {"step": torch.zeros((), dtype=torch.float32)}
        if self.momentum != 0:
            keys, values = _leaves(params)
            state["momentum_buffer"] = tree_from_leaves(keys, [torch.zeros_like(p).detach() for p in values],
                                                        params.batch_size)
        return TensorDict(state, batch_size=[])

    def step(self, params: TensorDictBase, grads: TensorDictBase, state: TensorDictBase) -> tuple[TensorDict, TensorDict]:
        """One update: the new parameters and the new state (inputs untouched)."""
        keys, ps = _leaves(params)
        first = state["step"] == 0
        lr_is_float = not isinstance(self.lr, Tensor)
        new_p, new_buf = [], []
        for key, p in zip(keys, ps):
            g = grads.get(key)
            if self.maximize:
                g = -g
            if self.weight_decay != 0:
                g = g.add(p, alpha=self.weight_decay)
            if self.momentum != 0:
                old = state.get(("momentum_buffer", *_tup(key)))
                buf = torch.where(first, g, old.mul(self.momentum).add(g, alpha=1 - self.dampening))
                new_buf.append(buf)
                g = g.add(buf, alpha=self.momentum) if self.nesterov else buf
            new_p.append(p.add(g, alpha=-self.lr) if lr_is_float
                         else p - (self.lr if p.dim() else self.lr.to(p.dtype)) * g)  # a 0-dim p keeps its dtype
        out: dict = {"step": state["step"] + 1}
        if self.momentum != 0:
            out["momentum_buffer"] = tree_from_leaves(keys, new_buf, params.batch_size, trusted=True)
        return tree_from_leaves(keys, new_p, params.batch_size, trusted=True), TensorDict(out, batch_size=[])

    def __repr__(self) -> str:
        return (f"SGD(lr={self.lr}, momentum={self.momentum}, dampening={self.dampening}, "
                f"weight_decay={self.weight_decay}, nesterov={self.nesterov}, maximize={self.maximize})")


class RMSprop:
    """RMSprop (``torch.optim.RMSprop``, not centered, no momentum) with L2 ``weight_decay``."""

    def __init__(self, lr: float | Tensor = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, *, maximize: bool = False) -> None:
        _check("lr", lr, isinstance(lr, Tensor) or lr >= 0.0, "a float >= 0 or a 0-dim tensor")
        _check("alpha", alpha, 0.0 <= alpha, ">= 0")
        _check("eps", eps, eps >= 0.0, ">= 0")
        _check("weight_decay", weight_decay, weight_decay >= 0.0, ">= 0")
        self.lr, self.alpha, self.eps, self.weight_decay, self.maximize = lr, alpha, eps, weight_decay, maximize

    def init(self, params: TensorDictBase) -> TensorDict:
        """The initial state: ``step`` 0 and a zero running average of the squared gradient."""
        keys, values = _leaves(params)
        zeros = [torch.zeros_like(p).detach() for p in values]
        return TensorDict({"step": torch.zeros((), dtype=torch.float32),
                           "square_avg": tree_from_leaves(keys, zeros, params.batch_size)}, batch_size=[])

    def step(self, params: TensorDictBase, grads: TensorDictBase, state: TensorDictBase) -> tuple[TensorDict, TensorDict]:
        """One update: the new parameters and the new state (inputs untouched)."""
        keys, ps = _leaves(params)
        neg_lr = -self.lr if not isinstance(self.lr, Tensor) else -_as_f64(self.lr)
        new_p, new_sq = [], []
        for key, p in zip(keys, ps):
            g = grads.get(key)
            if self.maximize:
                g = -g
            if self.weight_decay != 0:
                g = g.add(p, alpha=self.weight_decay)
            sq = state.get(("square_avg", *_tup(key))).mul(self.alpha).addcmul(g, g, value=1 - self.alpha)
            new_sq.append(sq)
            lr_p = neg_lr.to(p.dtype) if isinstance(neg_lr, Tensor) and not p.dim() else neg_lr  # see Adam
            new_p.append(p + lr_p * g / (sq.sqrt() + self.eps))  # addcdiv's order
        bs = params.batch_size
        return tree_from_leaves(keys, new_p, bs, trusted=True), TensorDict({"step": state["step"] + 1,
                                                              "square_avg": tree_from_leaves(keys, new_sq, bs, trusted=True)},
                                                             batch_size=[])

    def __repr__(self) -> str:
        return (f"RMSprop(lr={self.lr}, alpha={self.alpha}, eps={self.eps}, weight_decay={self.weight_decay}, "
                f"maximize={self.maximize})")


def _tup(key: Any) -> tuple:
    return key if isinstance(key, tuple) else (key,)

