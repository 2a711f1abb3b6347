"""PPO's epochs and minibatches as one pure function, compiled as one graph (``compile=true``).

What one PPO iteration does after GAE -- ``epochs x (batch / minibatch)`` updates of the
clipped surrogate, the value loss and the entropy bonus, each followed by global-norm
clipping and an Adam step -- written as a pure function of flat tensors::

    iteration(params, exp_avg, exp_avg_sq, step, data, indices, lr, clip_epsilon)
        -> (params', exp_avg', exp_avg_sq', step'), grad_norms

``params`` are the actor's and the critic's MLP parameters (``make_policy``'s categorical
actor, ``make_critic``'s critic) as one tuple, run layer by layer (``F.linear`` and the
activation modules, as the rollout's graph runs them); ``data`` is the batch's
observations, actions, behaviour log-probabilities, advantages and value targets;
``indices`` ``[updates, minibatch]`` are the shuffles, drawn outside (``torch.randperm``
once per epoch, as the eager loop draws them). Compiled, the updates are one
``scan`` over ``indices`` inside one graph (``fullgraph=True``): no Python between
minibatches, and no TensorDict, module registry or loss-module code for dynamo to trace
-- what kept the general :class:`~steersman.objectives.functional_update.CompiledUpdate`
at one compiled call per minibatch (the loss's parameter swap into the modules' registries
is a side effect, which dynamo refuses inside a ``scan`` body).

The loss is :class:`~steersman.objectives.ClipPPOLoss`'s, term for term (tested against
it, values and gradients, in ``tests/recipes/test_fused.py``)::

    log π(a|s) = logits[a] - logsumexp(logits)       (torch.distributions.Categorical)
    A          = (A - mean A) / max(std A, 1e-6)     (normalize_advantage, per minibatch)
    r          = exp(log π(a|s) - log π_old(a|s))
    objective  = -mean(min(r A, clip(r, 1 - ε, 1 + ε) A))     (clip as exp(clamp(log r)))
    entropy    = -entropy_coeff * mean(H(π(.|s)))
    critic     = critic_coeff * mean(distance(V(s), value_target))

and the optimizer step is :class:`steersman.tensordict.nn.optim.Adam`'s (the same float64
bias corrections, the same op order). Losses or networks it does not cover go through
:class:`CompiledUpdate` (:func:`fusable_update` says why).

Example::

    update = FusedPPOUpdate(loss_fn, functional, OptimizerState(state))   # the recipe's objects
    indices = torch.stack([torch.randperm(256) for _ in range(20)]).reshape(-1, 256)
    grad_norms = update(flat_batch, indices)   # [20]: all 20 updates, one compiled call
    update.sync()   # parameters into the modules, Adam's state into OptimizerState
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import torch
from torch import Tensor, nn
from torch._higher_order_ops.scan import scan

from steersman.objectives import ClipPPOLoss
from steersman.objectives.functional_update import (
    FunctionalUpdate,
    OptimizerState,
)
from steersman.objectives.ppo import clipped_ppo_gain
from steersman.objectives.utils import distance_loss
from steersman.tensordict import TensorDictBase
from steersman.tensordict.nn import optim
from steersman.tensordict.nn.optim import tree_from_leaves

from .fused import (
    _flat,
    _logits_net,
    _plain_net,
    _program,
    _run_net,
    _stance,
    cacheable_scan,
)
from .precompiled import TRAIN_OPTIONS, _compile, compile_ahead

__all__ = ["FusedPPOUpdate", "categorical_log_prob_entropy", "clip_ppo_terms", "fusable_update"]


def categorical_log_prob_entropy(logits: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
    """``log π(action)`` and the entropy of ``Categorical(logits=logits)`` ``[*B]``, with
    :class:`torch.distributions.Categorical`'s ops (normalised logits, softmax, the
    entropy's clamp at the dtype's lowest value).

    Example:
        >>> logits, action = torch.tensor([[0.0, 1.0]]), torch.tensor([1])
        >>> lp, h = categorical_log_prob_entropy(logits, action)
        >>> torch.allclose(lp, torch.distributions.Categorical(logits=logits).log_prob(action))
        True
    """
    log_pmf = logits - logits.logsumexp(-1, keepdim=True)
    log_prob = log_pmf.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
    entropy = -(log_pmf.clamp(min=torch.finfo(log_pmf.dtype).min) * torch.softmax(log_pmf, -1)).sum(-1)
    return log_prob, entropy


def clip_ppo_terms(logits: Tensor, value: Tensor, action: Tensor, old_log_prob: Tensor, advantage: Tensor,
                   value_target: Tensor, clip_epsilon: Tensor, *, normalize: bool, critic_coeff: float,
                   critic_type: str = "l2") -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """:class:`~steersman.objectives.ClipPPOLoss`'s terms from the networks' outputs on a
    minibatch (categorical actor ``logits`` ``[*B, A]``, ``value`` ``[*B, 1]``, no value
    clipping, mean reduction): ``(loss_objective, entropy [*B], loss_critic, log_ratio
    [*B], clipped log_ratio [*B])``; the entropy bonus is the caller's
    (``-coeff * entropy.mean()``), as is the order the terms are summed in."""
    log_prob, entropy = categorical_log_prob_entropy(logits, action)
    if normalize and advantage.numel() > 1:  # normalize_advantage over the whole minibatch
        advantage = (advantage - advantage.mean()) / advantage.std().clamp_min(1e-6)
    advantage = advantage[..., 0]
    log_ratio = log_prob - old_log_prob
    gain, clipped = clipped_ppo_gain(log_ratio, advantage, clip_epsilon)
    critic = (critic_coeff * distance_loss(value_target, value, critic_type))[..., 0].mean()
    return (-gain).mean(), entropy, critic, log_ratio, clipped


def fusable_update(loss_fn: nn.Module, update: FunctionalUpdate) -> str | None:
    """Why :class:`FusedPPOUpdate` cannot run ``update`` (None: it can): it covers
    :class:`~steersman.objectives.ClipPPOLoss` with its defaults' structure (no
    ``delay_actor``, ``max_importance_ratio``, ``clip_value``, ``advantage_norm`` or
    excluded normalisation dims; mean reduction) over a categorical actor and a critic that
    are plain MLPs reading ``"observation"``, trained together by plain Adam
    (no weight decay, amsgrad or maximize)."""
    if type(loss_fn) is not ClipPPOLoss:
        return f"the loss is {type(loss_fn).__name__}, not ClipPPOLoss"
    for attr, plain in (("delay_actor", False), ("max_importance_ratio", None), ("clip_value", None),
                        ("advantage_norm", None), ("normalize_advantage_exclude_dims", ()), ("reduction", "mean")):
        if getattr(loss_fn, attr) != plain:
            return f"ClipPPOLoss.{attr}={getattr(loss_fn, attr)!r}"
    if loss_fn.critic_coeff is None or loss_fn._shared_in_critic:
        return "the critic loss is off or shares parameters with the actor"
    actor = _logits_net(loss_fn.actor_network)
    critic = _plain_net(loss_fn.critic_network, "observation", loss_fn.tensor_keys.value)
    if actor is None or critic is None:
        return "the actor is not observation -> logits -> Categorical or the critic not observation -> value"
    if any(_program(net, _flat(net)[0]) is None for net in (actor, critic)):
        return "the actor or the critic is not a plain stack of nn.Linear and parameter-free layers"
    opt = update.optimizer
    if type(opt) is not optim.Adam or opt.weight_decay or opt.amsgrad or opt.maximize:
        return f"the optimizer is {opt!r}, not plain Adam"
    owned = {id(p) for net in (actor, critic) for p in net.parameters()}
    module = dict(loss_fn.named_parameters())
    if {id(module[n]) for n in update.names} != owned or len(update.names) != len(owned):
        return "the trained parameters are not exactly the actor's and the critic's"
    return None


class FusedPPOUpdate:
    """All of one PPO iteration's minibatch updates as one compiled call (see the module
    docstring): a stateful front like
    :class:`~steersman.objectives.functional_update.CompiledUpdate`, holding the
    parameters and Adam's state as flat tuples between calls.

    Args:
        loss_fn: the :class:`~steersman.objectives.ClipPPOLoss` (its settings are read once,
            here; ``clip_epsilon`` is read at each call, so annealing it in place works).
        update: the recipe's :class:`FunctionalUpdate` of ``loss_fn`` (its Adam and
            ``max_grad_norm``; Adam's ``lr`` may be a 0-dim tensor annealed in place).
        opt_state: the optimizer state's holder (tracked by the checkpoint, the nested
            layout of ``optim.Adam.init``); read here, written by :meth:`sync`.
        compile: compile the iteration (False: the same body in a Python loop).
        backend: ``torch.compile``'s backend.
        options: inductor's options (None: :data:`~steersman.recipes.precompiled.TRAIN_OPTIONS`,
            the wrapper in C++, ``tanh`` decomposed).

    Raises:
        ValueError: if the loss cannot be fused (the reason from :func:`fusable_update`).
    """

    def __init__(self, loss_fn: ClipPPOLoss, update: FunctionalUpdate, opt_state: OptimizerState, *,
                 compile: bool = True, backend: Any = "inductor", options: dict[str, Any] | None = None) -> None:
        why = fusable_update(loss_fn, update)
        if why is not None:
            raise ValueError(f"FusedPPOUpdate: {why}")
        self.loss_fn, self.update, self.opt_state = loss_fn, update, opt_state
        self._actor = _logits_net(loss_fn.actor_network)
        self._critic = _plain_net(loss_fn.critic_network, "observation", loss_fn.tensor_keys.value)
        self._actor_names, actor_params = _flat(self._actor)
        self._critic_names, critic_params = _flat(self._critic)
        self._actor_program = _program(self._actor, self._actor_names)
        self._critic_program = _program(self._critic, self._critic_names)
        self._n_actor = len(actor_params)
        # the loss module's names of our parameters, in our order (the optimizer state is keyed by them)
        by_id = {id(p): name for name, p in loss_fn.named_parameters()}
        self._names = [by_id[id(p)] for net in (self._actor, self._critic) for p in net.parameters()]
        keys = loss_fn.tensor_keys
        self._data_keys = ("observation", keys.action, keys.sample_log_prob, keys.advantage, keys.value_target)
        self._normalize = loss_fn.normalize_advantage
        self._entropy_coeff = loss_fn.entropy_coeff if loss_fn.entropy_bonus else None
        self._critic_coeff, self._critic_type = loss_fn.critic_coeff, loss_fn.loss_critic_type
        opt = update.optimizer
        self._max_norm = update.max_grad_norm
        self._lr = opt.lr if isinstance(opt.lr, Tensor) else torch.tensor(float(opt.lr), dtype=torch.float64)
        self._state_keys = list(opt_state.state.keys(include_nested=True, leaves_only=True))
        self.params = tuple(p.detach().clone() for p in actor_params + critic_params)
        self._read_state()
        self.compiled = compile
        if options is None and backend == "inductor":
            options = TRAIN_OPTIONS
        self._fn = _compile(self._iteration, backend, options) if compile else self._iteration
        self._warm = False
        self.diagnostics: dict[str, Tensor] = {}

    # ------------------------------------------------------------ the pure function
    def loss(self, params: tuple, observation: Tensor, action: Tensor, old_log_prob: Tensor, advantage: Tensor,
             value_target: Tensor, clip_epsilon: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:
        """``ClipPPOLoss``'s total and its ``(loss_objective, loss_entropy, loss_critic)`` on a
        minibatch, from the flat ``params`` (actor's, then critic's)."""
        total, terms, _ = self._terms(params, observation, action, old_log_prob, advantage, value_target,
                                      clip_epsilon)
        return total, terms

    def _terms(self, params: tuple, observation: Tensor, action: Tensor, old_log_prob: Tensor, advantage: Tensor,
               value_target: Tensor, clip_epsilon: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor], dict]:
        logits = _run_net(self._actor, self._actor_names, self._actor_program, params[:self._n_actor], observation)
        value = _run_net(self._critic, self._critic_names, self._critic_program, params[self._n_actor:], observation)
        objective, entropy, critic, log_ratio, clipped = clip_ppo_terms(
            logits, value, action, old_log_prob, advantage, value_target, clip_epsilon, normalize=self._normalize,
            critic_coeff=self._critic_coeff, critic_type=self._critic_type)
        parts = {"entropy": entropy, "log_ratio": log_ratio, "clipped": clipped}
        if self._entropy_coeff is None:
            return objective + critic, (objective, torch.zeros_like(objective), critic), parts
        bonus = (-self._entropy_coeff * entropy).mean()
        return objective + bonus + critic, (objective, bonus, critic), parts  # ClipPPOLoss's order of terms

    def _diagnostics(self, params: tuple, data: tuple, index: Tensor, clip_epsilon: Tensor) -> dict[str, Tensor]:
        """What ``ClipPPOLoss.diagnose(batch[index])`` logs, with ``params``: the loss terms,
        the mean entropy, ``kl_approx`` and ``clip_fraction``."""
        _, (objective, _, critic), parts = self._terms(params, *[v[index] for v in data], clip_epsilon)
        log_ratio = parts["log_ratio"]
        return {"loss_objective": objective, "loss_critic": critic, "entropy": parts["entropy"].mean(),
                "kl_approx": (-log_ratio).mean(),
                "clip_fraction": (parts["clipped"] != log_ratio).to(log_ratio.dtype).mean()}

    def step(self, carry: tuple, index: Tensor, data: tuple, lr: Tensor, clip_epsilon: Tensor
             ) -> tuple[tuple, Tensor]:
        """One minibatch update, pure: ``carry = (params, exp_avg, exp_avg_sq, step)`` after
        the gradient of :meth:`loss` on ``data[index]``, global-norm clipping and Adam;
        also returns the gradient norm (before clipping)."""
        params, exp_avg, exp_avg_sq, step = carry
        minibatch = [v[index] for v in data]
        grads, _ = torch.func.grad_and_value(self.loss, has_aux=True)(params, *minibatch, clip_epsilon)
        if self._max_norm is not None:  # optim.clip_grad_norm
            grads, norm = optim.clip_grad_norm_leaves(grads, self._max_norm)
        else:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        params, exp_avg, exp_avg_sq, _, step = self.update.optimizer.step_leaves(params, grads, exp_avg, exp_avg_sq,
                                                                                 step, lr=lr)
        params, exp_avg, exp_avg_sq = tuple(params), tuple(exp_avg), tuple(exp_avg_sq)
        return (params, exp_avg, exp_avg_sq, step), norm

    def _iteration(self, params: tuple, exp_avg: tuple, exp_avg_sq: tuple, step: Tensor, data: tuple,
                   indices: Tensor, lr: Tensor, clip_epsilon: Tensor) -> tuple[tuple, Tensor, dict]:
        """:meth:`step` for each row of ``indices``: compiled, one ``scan`` (a loop in the
        graph); eager, a Python loop over the same body. Also returns the diagnostics of the
        last minibatch with the new parameters (see :attr:`diagnostics`)."""
        def body(carry: tuple, index: Tensor) -> tuple[tuple, Tensor]:
            return self.step(carry, index, data, lr, clip_epsilon)

        carry = (params, exp_avg, exp_avg_sq, step)
        if torch.compiler.is_compiling():
            carry, norms = scan(body, carry, indices)
        else:
            steps = []
            for index in indices:
                carry, norm = body(carry, index)
                steps.append(norm)
            norms = torch.stack(steps)
        # the recipe's per-batch log: the last minibatch after the updates, in the same graph
        return carry, norms, self._diagnostics(carry[0], data, indices[-1], clip_epsilon)

    # ------------------------------------------------------------ state
    def _read_state(self) -> None:
        state = self.opt_state.state
        self._step = state.get("step")
        self._exp_avg = tuple(state.get(("exp_avg", *n.split("."))) for n in self._names)
        self._exp_avg_sq = tuple(state.get(("exp_avg_sq", *n.split("."))) for n in self._names)

    def compile_ahead(self, first_call: Any, *, when: Any = None) -> bool:
        """Compiles the update in a forked child that runs ``first_call()`` (a first call of
        this object on a batch laid out as the real first one), beside this process's other
        compiles, once ``when``'s first call compiles (see
        :func:`~steersman.recipes.precompiled.compile_ahead`). Returns whether a child
        started or is scheduled (only a graph of :class:`~steersman.recipes.precompiled.Precompiled`)."""
        return compile_ahead(self._fn, first_call, when=when)

    def __call__(self, batch: TensorDictBase, indices: Tensor) -> Tensor:
        """``len(indices)`` updates on ``batch[indices[i]]`` (the whole batch flat ``[N]``,
        ``indices`` ``[updates, minibatch]``); returns each update's gradient norm (before
        clipping) ``[updates]``. Afterwards :attr:`diagnostics` holds what
        ``loss_fn.diagnose(batch[indices[-1]])`` would log after the updates
        (``loss_objective``, ``loss_critic``, ``entropy``, ``kl_approx``,
        ``clip_fraction``), computed in the same graph."""
        data = tuple(batch.get(k) for k in self._data_keys)
        args = (self.params, self._exp_avg, self._exp_avg_sq, self._step, data, indices, self._lr,
                self.loss_fn.clip_epsilon)
        try:
            with _stance(self._warm), contextlib.nullcontext() if self._warm else cacheable_scan():
                carry, norms, diagnostics = self._fn(*args)
        except torch._dynamo.exc.TorchDynamoException as err:  # pure: the failed attempt changed nothing
            if not self.compiled:
                raise
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            warnings.warn(f"compile=true: the fused PPO update cannot be compiled ({reason}); running it eagerly",
                          stacklevel=2)
            self._fn, self.compiled = self._iteration, False
            carry, norms, diagnostics = self._fn(*args)
        self._warm = self.compiled
        self.params, self._exp_avg, self._exp_avg_sq, self._step = carry
        self.diagnostics = diagnostics
        return norms

    def sync(self) -> None:
        """Writes the parameters into the actor's and critic's modules (in place) and Adam's
        state into ``opt_state`` (what checkpoints save), in its original layout."""
        with torch.no_grad():
            for p, new in zip([*self._actor.parameters(), *self._critic.parameters()], self.params):
                p.copy_(new)
        leaves = {("step",): self._step}
        for n, m, v in zip(self._names, self._exp_avg, self._exp_avg_sq):
            leaves[("exp_avg", *n.split("."))] = m
            leaves[("exp_avg_sq", *n.split("."))] = v
        keys = [k if isinstance(k, tuple) else (k,) for k in self._state_keys]
        self.opt_state.state = tree_from_leaves(keys, [leaves[k] for k in keys], [])
