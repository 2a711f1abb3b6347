"""A training step as one pure function, for ``torch.compile(fullgraph=True)``.

:class:`FunctionalUpdate` turns a loss module and a functional optimizer
(:mod:`steersman.tensordict.nn.optim`) into
``update(params, opt_state, batch) -> (params, opt_state, metrics)``: the loss through
``torch.func.functional_call``, its gradients through ``torch.func.grad_and_value``,
global-norm clipping and the optimizer step, all without in-place writes. Compiled, the
whole step (forward, backward, clipping, Adam) is a single graph: no ``zero_grad``, no
autograd engine, no per-parameter Python.

Example::

    step = FunctionalUpdate(loss_fn, Adam(lr=3e-4), max_grad_norm=0.5)
    params, opt_state = step.init()
    compiled = torch.compile(step, fullgraph=True)
    for batch in batches:
        params, opt_state, metrics = compiled(params, opt_state, batch)
    step.write_back(params)  # into loss_fn's modules (checkpoints, export, collection)
"""

from __future__ import annotations

import warnings
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from steersman.tensordict import TensorDict, TensorDictBase
from steersman.tensordict.nn import from_module
from steersman.tensordict.nn.optim import clip_grad_norm, tree_from_leaves

__all__ = ["CompiledUpdate", "FunctionalOptimizer", "FunctionalUpdate", "OptimizerState"]


class FunctionalOptimizer(Protocol):
    """What :class:`FunctionalUpdate` needs of an optimizer (``optim.Adam``...)."""

    def init(self, params: TensorDictBase) -> TensorDict: ...

    def step(self, params: TensorDictBase, grads: TensorDictBase,
             state: TensorDictBase) -> tuple[TensorDict, TensorDict]: ...


class FunctionalUpdate:
    """``update(params, opt_state, batch) -> (params, opt_state, metrics)`` for ``loss_module``.

    The minimized loss is the sum of the entries of ``loss_module(batch)`` whose names start
    with ``"loss_"`` (TorchRL's convention). ``params`` holds the module's trainable
    parameters (``requires_grad``) keyed as :func:`~steersman.tensordict.nn.from_module`
    keys them; buffers (e.g. a clip range annealed in place) are read from the module.
    ``metrics`` holds every entry of the loss's output (detached: the terms and any
    diagnostics), ``"loss"`` (the sum) and, with clipping, ``"grad_norm"`` (before clipping).

    Args:
        loss_module: the objective, called as ``loss_module(batch)``.
        optimizer: a functional optimizer.
        max_grad_norm: clip the global gradient norm to this (None: no clipping).
    """

    def __init__(self, loss_module: nn.Module, optimizer: FunctionalOptimizer, *,
                 max_grad_norm: float | None = None) -> None:
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0 or None, got {max_grad_norm!r}")
        self.loss_module, self.optimizer, self.max_grad_norm = loss_module, optimizer, max_grad_norm
        self._names = [name for name, p in loss_module.named_parameters() if p.requires_grad]
        if not self._names:
            raise ValueError(f"{type(loss_module).__name__} has no trainable parameter to update")
        self._keys = [tuple(name.split(".")) for name in self._names]

    def params(self) -> TensorDict:
        """A copy of the module's trainable parameters (detached), as a nested TensorDict."""
        td = from_module(self.loss_module)
        return tree_from_leaves(self._keys, [td.get(k).detach().clone() for k in self._keys], [])

    def init(self) -> tuple[TensorDict, TensorDict]:
        """The parameters (a copy of the module's) and a fresh optimizer state."""
        params = self.params()
        return params, self.optimizer.init(params)

    def write_back(self, params: TensorDictBase) -> None:
        """Copies ``params`` into the module's parameters, in place (no new tensors: the
        module's optimizer/collector/export references stay valid)."""
        with torch.no_grad():
            module = dict(self.loss_module.named_parameters())
            for name, key in zip(self._names, self._keys):
                module[name].copy_(params.get(key))

    def _loss(self, flat: dict[str, Tensor], batch: TensorDictBase) -> tuple[Tensor, dict[str, Tensor]]:
        out = torch.func.functional_call(self.loss_module, flat, (batch,), strict=False)
        entries = {k: out.get(k) for k in out.keys() if isinstance(k, str)}
        total = None
        for k, v in entries.items():
            if k.startswith("loss_"):
                total = v if total is None else total + v
        if total is None:
            raise KeyError(f"{type(self.loss_module).__name__} returned no 'loss_*' entry, "
                           f"got {sorted(entries)}")
        return total, {k: v.detach() for k, v in entries.items()}

    def __call__(self, params: TensorDictBase, opt_state: TensorDictBase,
                 batch: TensorDictBase) -> tuple[TensorDict, TensorDict, TensorDict]:
        """One step; pure (no input is modified)."""
        flat = {name: params.get(key) for name, key in zip(self._names, self._keys)}
        grads, (total, terms) = torch.func.grad_and_value(self._loss, has_aux=True)(flat, batch)
        grads_td = tree_from_leaves(self._keys, [grads[name] for name in self._names], params.batch_size)
        metrics: dict[str, Any] = dict(terms)
        metrics["loss"] = total.detach()
        if self.max_grad_norm is not None:
            grads_td, metrics["grad_norm"] = clip_grad_norm(grads_td, self.max_grad_norm)
        new_params, new_state = self.optimizer.step(params, grads_td, opt_state)
        return new_params, new_state, TensorDict(metrics, batch_size=[])


class OptimizerState:
    """A functional optimizer's state behind ``state_dict``/``load_state_dict``, so that
    checkpoints (``Run.track(optim=...)``) save and restore it like a ``torch.optim``
    optimizer's. ``state`` is replaced (not modified) by each update."""

    def __init__(self, state: TensorDictBase) -> None:
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        return self.state.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.state = self.state.clone().load_state_dict(state_dict)


class CompiledUpdate:
    """A stateful front for recipes: holds the parameters and the optimizer state and runs
    ``torch.compile(update, fullgraph=True)`` on each batch.

    The parameters start as a copy of the module's (read at construction, so after a
    checkpoint is restored); :meth:`sync` writes them back to the module (before
    collecting, evaluating or checkpointing). If dynamo cannot compile the step, one
    warning says why and the same step runs eagerly from then on (the step is pure, so
    the failed attempt changed nothing).

    Args:
        update: the pure step.
        opt_state: the optimizer state's holder (tracked by the checkpoint); each step
            replaces its ``state``.
        compile: compile the step (False: run it eagerly).
    """

    def __init__(self, update: FunctionalUpdate, opt_state: OptimizerState, *, compile: bool = True) -> None:
        self.update, self.opt_state = update, opt_state
        self.params = update.params()
        self._step = torch.compile(update, fullgraph=True) if compile else update
        self.compiled = compile

    def __call__(self, batch: TensorDictBase) -> TensorDict:
        """One step on ``batch``; returns its metrics."""
        try:
            self.params, self.opt_state.state, metrics = self._step(self.params, self.opt_state.state, batch)
        except torch._dynamo.exc.TorchDynamoException as err:
            if not self.compiled:
                raise
            reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
            warnings.warn(f"compile=true: the update of {type(self.update.loss_module).__name__} cannot be compiled "
                          f"({type(err).__name__}: {reason}); running it eagerly", stacklevel=2)
            self._step, self.compiled = self.update, False
            return self(batch)
        return metrics

    def sync(self) -> None:
        """Writes the current parameters into the loss module's parameters (in place)."""
        self.update.write_back(self.params)
