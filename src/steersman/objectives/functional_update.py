"""A training step as one pure function, for ``torch.compile(fullgraph=True)``.

:class:`FunctionalUpdate` turns a loss module and a functional optimizer
(:mod:`steersman.tensordict.nn.optim`) into
``update(params, opt_state, batch) -> (params, opt_state, metrics)``: the loss with the parameters swapped in
(``TensorDict.to_module``), its gradients through ``torch.func.grad_and_value``,
global-norm clipping and the optimizer step, all without in-place writes. Compiled, the
whole step (forward, backward, clipping, Adam) is a single graph: no ``zero_grad``, no
autograd engine, no per-parameter Python.

:class:`CompiledUpdate` is what recipes use: it holds the parameters, the optimizer state
and (optionally) the target networks as flat tuples of tensors, so that the compiled
graph's inputs and outputs are plain tensors (no TensorDict is built or guarded outside
the graph), gathers minibatches inside the graph, Polyak-averages the targets inside the
graph, and falls back to eager with one warning when the step cannot be compiled.

Example::

    step = FunctionalUpdate(loss_fn, Adam(lr=3e-4), max_grad_norm=0.5)
    params, opt_state = step.init()
    compiled = torch.compile(step, fullgraph=True)
    for batch in batches:
        params, opt_state, metrics = compiled(params, opt_state, batch)
    step.write_back(params)  # into loss_fn's modules (checkpoints, export, collection)
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from steersman.tensordict import TensorDict, TensorDictBase
from steersman.tensordict.module_params import _params_cls
from steersman.tensordict.nn import from_module
from steersman.tensordict.nn.optim import clip_grad_norm, tree_from_leaves

__all__ = [
    "CompiledUpdate",
    "call_skipping_guards",
    "FunctionalOptimizer",
    "FunctionalUpdate",
    "OptimizerState",
    "flat_state_key",
    "use_compile_cache",
]


_SCALAR = torch.Size([])


class FunctionalOptimizer(Protocol):
    """What :class:`FunctionalUpdate` needs of an optimizer (``optim.Adam``...)."""

    def init(self, params: TensorDictBase) -> TensorDict: ...

    def step(self, params: TensorDictBase, grads: TensorDictBase,
             state: TensorDictBase) -> tuple[TensorDict, TensorDict]: ...


def _registry_slots(module: nn.Module) -> dict[str, tuple[dict, str]] | None:
    """``name -> (registry, key)`` of every parameter and buffer of ``module`` (the
    ``_parameters``/``_buffers`` dict holding it, as ``named_parameters`` names it); None
    if a ``TensorDictParams`` holds some (their leaves are swapped through ``to_module``)."""
    params_cls = _params_cls()
    slots: dict[str, tuple[dict, str]] = {}
    for prefix, sub in module.named_modules():
        if params_cls is not None and isinstance(sub, params_cls):
            return None
        for registry in (sub._parameters, sub._buffers):
            for key, value in registry.items():
                if value is not None:
                    slots.setdefault(f"{prefix}.{key}" if prefix else key, (registry, key))
    return slots


class FunctionalUpdate:
    """``update(params, opt_state, batch) -> (params, opt_state, metrics)`` for ``loss_module``.

    The minimized loss is the sum of the entries of ``loss_module(batch)`` named ``"loss"``
    or starting with ``"loss_"`` (TorchRL's convention). With ``method``, the loss is
    ``loss_module.<method>(batch)`` instead, returning a TensorDict as above, a loss tensor,
    or ``(loss, metadata)`` (TD3's ``value_loss``/``actor_loss``). ``params`` holds the
    trainable parameters (``requires_grad``, or those under ``only``) keyed as
    :func:`~steersman.tensordict.nn.from_module` keys them; buffers (e.g. a clip range
    annealed in place) and the other parameters are read from the module. ``metrics``
    holds the loss's entries (detached), ``"loss"`` (the sum) and, with clipping,
    ``"grad_norm"`` (before clipping).

    Args:
        loss_module: the objective, called as ``loss_module(batch)``.
        optimizer: a functional optimizer.
        max_grad_norm: clip the global gradient norm to this (None: no clipping).
        only: names (or name prefixes, e.g. ``"actor_network"``) of the parameters to
            update; None: every parameter with ``requires_grad``.
        method: the loss module's method to call (None: ``forward``).
    """

    def __init__(self, loss_module: nn.Module, optimizer: FunctionalOptimizer, *,
                 max_grad_norm: float | None = None, only: str | Sequence[str] | None = None,
                 method: str | None = None) -> None:
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0 or None, got {max_grad_norm!r}")
        if method is not None and not callable(getattr(loss_module, method, None)):
            raise ValueError(f"{type(loss_module).__name__} has no method {method!r}")
        self.loss_module, self.optimizer, self.max_grad_norm = loss_module, optimizer, max_grad_norm
        self._call = loss_module if method is None else getattr(loss_module, method)
        prefixes = (only,) if isinstance(only, str) else only
        self._names = [name for name, p in loss_module.named_parameters() if p.requires_grad
                       and (prefixes is None or any(name == q or name.startswith(q + ".") for q in prefixes))]
        if not self._names:
            what = "trainable parameter" if prefixes is None else f"trainable parameter under {list(prefixes)}"
            raise ValueError(f"{type(loss_module).__name__} has no {what} to update")
        self._keys = [tuple(name.split(".")) for name in self._names]
        _params_cls()  # resolves to_module's lazy global now: set during a trace, it would recompile
        self._slots = _registry_slots(loss_module)

    @property
    def names(self) -> list[str]:
        """The updated parameters' names (as ``named_parameters`` gives them)."""
        return list(self._names)

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

    def _loss(self, trained: dict[str, Tensor], others: dict[str, Tensor],
              batch: TensorDictBase) -> tuple[Tensor, dict[str, Tensor]]:
        # swapped in with to_module (torch.func.functional_call would miss the leaves of a
        # TensorDictParams, e.g. stacked critics: it swaps the registry, not the TensorDict)
        tensors = {**others, **trained}
        slots = self._slots
        if slots is not None and all(k in slots for k in tensors):
            # the registries' entries swapped directly (what to_module does, without building the
            # nested TensorDicts of values and old values: a third of dynamo's trace of the step)
            swapped = []
            try:
                for name, value in tensors.items():
                    registry, key = slots[name]
                    swapped.append((registry, key, registry[key]))
                    registry[key] = value
                out = self._call(batch)
            finally:
                for registry, key, old in reversed(swapped):
                    registry[key] = old
        else:
            swap = tree_from_leaves([tuple(k.split(".")) for k in tensors], list(tensors.values()), [])
            with swap.to_module(self.loss_module):
                out = self._call(batch)
        if isinstance(out, Tensor):
            return out, {}
        if isinstance(out, tuple):
            total, meta = out
            return total, {k: v.detach() for k, v in meta.items()}
        entries = {k: out.get(k) for k in out.keys() if isinstance(k, str)}
        total = None
        for k, v in entries.items():
            if k == "loss" or k.startswith("loss_"):
                total = v if total is None else total + v
        if total is None:
            raise KeyError(f"{type(self.loss_module).__name__} returned no 'loss' or 'loss_*' entry, "
                           f"got {sorted(entries)}")
        return total, {k: v.detach() for k, v in entries.items()}

    def _grads(self, flat: dict[str, Tensor], others: dict[str, Tensor] | None,
               batch: TensorDictBase) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        grads, (total, terms) = torch.func.grad_and_value(self._loss, has_aux=True)(flat, others or {}, batch)
        metrics: dict[str, Tensor] = dict(terms)
        metrics["loss"] = total.detach()
        return grads, metrics

    def _apply(self, params: TensorDictBase, grads: TensorDictBase, opt_state: TensorDictBase,
               metrics: dict[str, Tensor]) -> tuple[TensorDict, TensorDict]:
        if self.max_grad_norm is not None:
            grads, metrics["grad_norm"] = clip_grad_norm(grads, self.max_grad_norm)
        return self.optimizer.step(params, grads, opt_state)

    def step(self, params: TensorDictBase, opt_state: TensorDictBase, batch: TensorDictBase,
             others: dict[str, Tensor] | None = None) -> tuple[TensorDict, TensorDict, dict[str, Tensor]]:
        """:meth:`__call__` with ``others`` (name -> tensor) overriding other module
        tensors (the current values of parameters another update trains, targets);
        metrics as a dict."""
        flat = {name: params.get(key) for name, key in zip(self._names, self._keys)}
        grads, metrics = self._grads(flat, others, batch)
        grads_td = tree_from_leaves(self._keys, [grads[name] for name in self._names], params.batch_size)
        new_params, new_state = self._apply(params, grads_td, opt_state, metrics)
        return new_params, new_state, metrics

    def step_flat(self, params: dict[str, Tensor], opt_state: TensorDictBase, batch: TensorDictBase,
                  others: dict[str, Tensor] | None = None) -> tuple[dict[str, Tensor], TensorDict, dict[str, Tensor]]:
        """:meth:`step` on flat layouts: ``params`` (and the result's) keyed by parameter
        name (``"actor.0.weight"``), and the optimizer state with one-level, name-keyed
        TensorDicts where :meth:`step`'s has nested parameter trees (see
        :func:`flat_state_key`). Same numbers as :meth:`step`, with a few TensorDicts
        instead of one per module level: what :class:`CompiledUpdate` traces (dynamo's
        trace of the nested layout cost about twice as much)."""
        grads, metrics = self._grads(params, others, batch)
        params_td = tree_from_leaves(self._names, [params[name] for name in self._names], _SCALAR, trusted=True)
        grads_td = tree_from_leaves(self._names, [grads[name] for name in self._names], _SCALAR, trusted=True)
        new_params, new_state = self._apply(params_td, grads_td, opt_state, metrics)
        return {name: new_params.get(name) for name in self._names}, new_state, metrics

    def __call__(self, params: TensorDictBase, opt_state: TensorDictBase,
                 batch: TensorDictBase) -> tuple[TensorDict, TensorDict, TensorDict]:
        """One step; pure (no input is modified)."""
        new_params, new_state, metrics = self.step(params, opt_state, batch)
        return new_params, new_state, TensorDict(metrics, batch_size=[])


def flat_state_key(key: tuple[str, ...], names: Sequence[str]) -> tuple[str, ...]:
    """The key of a nested optimizer-state leaf in :meth:`FunctionalUpdate.step_flat`'s
    layout: the part of ``key`` that is a parameter's path becomes that parameter's
    dotted name (``("exp_avg", "actor", "0", "weight")`` -> ``("exp_avg",
    "actor.0.weight")``); other keys (``("step",)``) are unchanged.

    Example:
        >>> flat_state_key(("exp_avg", "actor", "0", "weight"), ["actor.0.weight"])
        ('exp_avg', 'actor.0.weight')
        >>> flat_state_key(("step",), ["actor.0.weight"])
        ('step',)
    """
    paths = {tuple(name.split(".")): name for name in names}
    for i in range(len(key)):
        if key[i:] in paths:
            return (*key[:i], paths[key[i:]])
    return key


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


def use_compile_cache() -> str:
    """Points inductor's on-disk caches (compiled kernels, FX graphs, AOTAutograd) at
    ``$XDG_CACHE_HOME/steersman/inductor`` (default ``~/.cache/steersman/inductor``) unless
    ``TORCHINDUCTOR_CACHE_DIR`` is set, so that a warm cache survives reboots (torch's
    default is under /tmp). Takes effect if nothing was compiled yet in this process;
    returns the directory in use."""
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(base, "steersman", "inductor")
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


def call_skipping_guards(fn: Callable[[], Any], signature: Any, seen: set) -> Any:
    """``fn()`` (a call of a compiled function), with dynamo's guards skipped once a call of
    this ``signature`` has run (``torch.compiler.set_stance(skip_guard_eval_unsafe=True)``;
    at RL sizes the guards cost about as much as the graph). The signature must hold what the
    guards would check (shapes, strides, dtypes, grad mode...); if a skipped guard would have
    failed anyway (torch raises), the call runs again with the guards and may recompile.
    ``seen`` records the signatures."""
    fast = signature in seen
    try:
        with torch.compiler.set_stance(skip_guard_eval_unsafe=True) if fast else nullcontext():
            out = fn()
    except RuntimeError as err:
        if fast and "skip_guard_eval_unsafe" in str(err):
            seen.discard(signature)
            return call_skipping_guards(fn, signature, seen)
        raise
    seen.add(signature)
    return out


class CompiledUpdate:
    """A stateful front for recipes: holds the parameters, the optimizer state and the
    target networks, and runs the step compiled as one graph (``fullgraph=True``,
    ``dynamic=False``) on each batch.

    At the graph's boundary everything is a flat tuple of tensors (the parameters, the
    optimizer state's leaves, the batch's leaves), so a call costs little more than the
    graph itself. The parameters start as the module's current values (read at
    construction, so after a checkpoint is restored); :meth:`sync` writes them, the
    targets and the optimizer state back (before collecting, evaluating or
    checkpointing). If dynamo cannot compile the step, one warning says why and the same
    step runs eagerly from then on (the step is pure, so the failed attempt changed
    nothing).

    Calls after the first of each signature (batch keys and shapes, index shape) skip
    dynamo's guards (``torch.compiler.set_stance(skip_guard_eval_unsafe=True)``): at these
    sizes they cost about as much as the graph. So the step's Python-level settings (the
    loss module's attributes, ``tau``, the optimizer's float hyper-parameters) are read
    once, at the first call; what changes between calls must be a tensor changed in place
    (an annealed ``lr`` tensor, a clip-range buffer). With ``compile=True`` the on-disk
    compile caches go to :func:`use_compile_cache`'s directory.

    Args:
        update: the pure step.
        opt_state: the optimizer state's holder (tracked by the checkpoint).
        compile: compile the step (False: run the same flat step eagerly).
        backend: ``torch.compile``'s backend (``"aot_eager"``: no code generation, the
            eager kernels and random streams).
        tau: Polyak-average every target network of the loss (``loss.target_pairs``)
            towards its online network after each step, inside the graph:
            ``target.lerp_(online, tau)`` as :class:`~steersman.objectives.SoftUpdate`.
        shared: another CompiledUpdate of the same loss module whose current parameters
            (and targets) this one reads and updates (TD3's critic and actor steps).

    Example::

        compiled = CompiledUpdate(FunctionalUpdate(loss_fn, Adam(lr=1e-3)), OptimizerState(state))
        for _ in range(epochs):
            for idx in torch.randperm(n).split(minibatch_size):
                metrics = compiled(batch, idx)  # the minibatch batch[idx] is gathered in the graph
        compiled.sync()
    """

    def __init__(self, update: FunctionalUpdate, opt_state: OptimizerState, *, compile: bool = True,
                 backend: str | Callable = "inductor", tau: float | None = None,
                 shared: CompiledUpdate | None = None) -> None:
        if tau is not None and not 0.0 < tau <= 1.0:
            raise ValueError(f"tau must be in (0, 1], got {tau!r}")
        self.update, self.opt_state, self.tau = update, opt_state, tau
        module = update.loss_module
        if shared is not None:
            if shared.update.loss_module is not module:
                raise ValueError("shared= must be a CompiledUpdate of the same loss module")
            self._current = shared._current  # one dict: each update sees the other's steps
        else:
            tensors = dict(module.named_parameters())
            self._current = {name: p.detach().clone() for name, p in tensors.items() if p.requires_grad}
            buffers = dict(module.named_buffers())
            for online, target in self._target_names(module):  # targets of trained parameters
                src = tensors.get(target, buffers.get(target))
                if online in self._current and src is not None and src.is_floating_point():
                    self._current[target] = src.detach().clone()
        self._trained = update.names
        self._trained_set = set(self._trained)
        self._targets = [(o, t) for o, t in self._target_names(module) if t in self._current] if tau else []
        self._state_keys = list(opt_state.state.keys(include_nested=True, leaves_only=True))
        self._flat_state_keys = [flat_state_key(k if isinstance(k, tuple) else (k,), self._trained)
                                 for k in self._state_keys]
        self._state = tuple(opt_state.state.get(k) for k in self._state_keys)
        self._batch_keys: tuple = ()
        self._batch_dims = 0
        self._seen: set = set()  # call signatures already compiled (their guards are skipped)
        self.compiled = compile
        if compile:
            use_compile_cache()
        self._step = torch.compile(self._flat_step, fullgraph=True, dynamic=False, backend=backend) \
            if compile else self._flat_step

    @staticmethod
    def _target_names(module: nn.Module) -> list[tuple[str, str]]:
        """(online name, target name) of each target tensor of a loss (``target_<x>.<rest>``
        mirrors ``<x>.<rest>`` for each ``<x>`` in ``loss.target_names``)."""
        prefixes = [f"target_{x}." for x in getattr(module, "target_names", [])]
        names = [n for n, _ in module.named_parameters()] + [n for n, _ in module.named_buffers()]
        present = set(names)
        return [(n[len("target_"):], n) for n in names
                if n.startswith(tuple(prefixes)) and n[len("target_"):] in present] if prefixes else []

    @property
    def params(self) -> TensorDict:
        """The current values of the trained parameters (a nested TensorDict)."""
        return tree_from_leaves([tuple(n.split(".")) for n in self._trained],
                                [self._current[n] for n in self._trained], [])

    def _flat_step(self, trained: tuple, others: tuple, state: tuple, data: tuple, index: Tensor | None):
        keys = self._batch_keys
        if index is not None:
            data = tuple(v[index] for v in data)
        batch = tree_from_leaves(keys, data, data[0].shape[:self._batch_dims], trusted=True)
        # flat layouts (parameters by name, name-keyed optimizer state): a few TensorDicts to trace, not
        # one per module level
        opt_state = tree_from_leaves(self._flat_state_keys, state, _SCALAR, trusted=True)
        other_names = [n for n in self._current if n not in self._trained_set]
        new_params, new_state, metrics = self.update.step_flat(dict(zip(self._trained, trained)), opt_state, batch,
                                                               dict(zip(other_names, others)))
        new_trained = tuple(new_params[n] for n in self._trained)
        current = dict(zip(other_names, others))
        current.update(zip(self._trained, new_trained))
        new_targets = tuple(torch.lerp(current[t], current[o], self.tau) for o, t in self._targets)
        return new_trained, new_targets, tuple(new_state.get(k) for k in self._flat_state_keys), metrics

    def __call__(self, batch: TensorDictBase, index: Tensor | None = None) -> dict[str, Tensor]:
        """One step on ``batch`` (or on ``batch[index]``, gathered inside the graph: the
        whole batch's tensors stay the same inputs across minibatches); returns the
        step's metrics (detached tensors)."""
        keys = tuple(batch.keys(include_nested=True, leaves_only=True))
        if keys != self._batch_keys:  # the first call (a new key set would recompile)
            self._batch_keys, self._batch_dims = keys, batch.batch_dims
        trained = tuple(self._current[n] for n in self._trained)
        others = tuple(v for n, v in self._current.items() if n not in self._trained_set)
        data = tuple(batch.get(k) for k in keys)
        # dynamo's guards cost about as much as the graph at these sizes; once a call of this
        # signature (keys, shapes) has compiled, the next ones skip them
        signature = (keys, tuple(v.shape for v in data), None if index is None else index.shape)
        try:
            if self.compiled:
                new_trained, new_targets, self._state, metrics = call_skipping_guards(
                    lambda: self._step(trained, others, self._state, data, index), signature, self._seen)
            else:
                new_trained, new_targets, self._state, metrics = self._step(trained, others, self._state, data, index)
        except RuntimeError as err:
            if not self.compiled or not isinstance(err, torch._dynamo.exc.TorchDynamoException):
                raise
            reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
            warnings.warn(f"compile=true: the update of {type(self.update.loss_module).__name__} cannot be compiled "
                          f"({type(err).__name__}: {reason}); running it eagerly", stacklevel=2)
            self._step, self.compiled = self._flat_step, False
            return self(batch, index)
        self._current.update(zip(self._trained, new_trained))
        self._current.update((t, v) for (_, t), v in zip(self._targets, new_targets))
        return metrics

    def pull(self) -> None:
        """Reads the loss module's parameters and targets again (after something changed
        them in place, e.g. a :class:`~steersman.objectives.HardUpdate` after :meth:`sync`)."""
        module = self.update.loss_module
        tensors = {**dict(module.named_parameters()), **dict(module.named_buffers())}
        for name in self._current:
            self._current[name] = tensors[name].detach().clone()

    def sync(self) -> None:
        """Writes the current parameters and targets into the loss module (in place) and
        the optimizer state into ``opt_state`` (what checkpoints save)."""
        module = self.update.loss_module
        tensors = {**dict(module.named_parameters()), **dict(module.named_buffers())}
        with torch.no_grad():
            for name, value in self._current.items():
                tensors[name].copy_(value)
        self.opt_state.state = tree_from_leaves(self._state_keys, list(self._state), [])
