"""MuZero and Gumbel MuZero policies over :func:`~steersman.planning.search.search`
(mctx's ``muzero_policy`` / ``gumbel_muzero_policy``, same arguments and defaults,
a ``torch.Generator`` in place of the JAX key)."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from steersman.tensordict import TensorDict

from .action_selection import (
    gumbel_muzero_interior_action_selection,
    gumbel_muzero_root_action_selection,
    masked_argmax,
    muzero_action_selection,
    score_considered,
    table_of_considered_visits,
)
from .qtransforms import qtransform_by_parent_and_siblings, qtransform_completed_by_mix_value
from .search import RecurrentFn, RootFnOutput, check_root, fori_loop, search
from .tree import Tree

__all__ = ["PolicyOutput", "gumbel_muzero_policy", "muzero_policy"]


@dataclasses.dataclass
class PolicyOutput:
    """``action [B]`` (int64), ``action_weights [B, A]`` (the policy target) and the
    ``search_tree``."""

    action: Tensor
    action_weights: Tensor
    search_tree: Tree

    def to_tensordict(self) -> TensorDict:
        """``{"action", "action_weights", "search_tree": {...}}`` as a TensorDict ``[B]``."""
        return TensorDict({"action": self.action, "action_weights": self.action_weights,
                           "search_tree": self.search_tree.to_tensordict()}, batch_size=self.action.shape)


def _mask_invalid_actions(logits: Tensor, invalid_actions: Tensor | None) -> Tensor:
    """Logits shifted to max 0 with the finite minimum at invalid actions (a softmax of
    an all-invalid row stays finite)."""
    if invalid_actions is None:
        return logits
    logits = logits - logits.amax(-1, keepdim=True)
    return torch.where(invalid_actions.bool(), torch.finfo(logits.dtype).min, logits)


def _logits_from_probs(probs: Tensor) -> Tensor:
    return torch.log(probs.clamp_min(torch.finfo(probs.dtype).tiny))


def _uniform(shape: tuple, like: Tensor, rng: torch.Generator | None) -> Tensor:
    u = torch.rand(shape, generator=rng, dtype=like.dtype, device=like.device)
    return u.clamp_min(torch.finfo(like.dtype).tiny)


def _gumbel(shape: tuple, like: Tensor, rng: torch.Generator | None) -> Tensor:
    return -torch.log(-torch.log(_uniform(shape, like, rng)))


def _log_gamma_sample(alpha: float, shape: tuple, like: Tensor, rng: torch.Generator | None) -> Tensor:
    """``log Gamma(alpha, 1)`` samples drawn from ``rng`` (Marsaglia-Tsang; ``alpha < 1``
    boosted by ``U^(1/alpha)`` in log space so tiny samples do not underflow)."""
    a = alpha + 1.0 if alpha < 1.0 else alpha
    d = a - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    out = torch.zeros(shape, dtype=like.dtype, device=like.device)
    todo = torch.ones(shape, dtype=torch.bool, device=like.device)
    while bool(todo.any()):
        x = torch.randn(shape, generator=rng, dtype=like.dtype, device=like.device)
        v = (1.0 + c * x) ** 3
        u = _uniform(shape, like, rng)
        ok = (v > 0) & (torch.log(u) < 0.5 * x * x + d - d * v + d * torch.log(v.clamp_min(1e-30)))
        out = torch.where(todo & ok, math.log(d) + torch.log(v.clamp_min(1e-30)), out)
        todo = todo & ~ok
    if alpha < 1.0:
        out = out + torch.log(_uniform(shape, like, rng)) / alpha
    return out


@functools.lru_cache(maxsize=16)
def _considered_table(max_num_considered_actions: int, num_simulations: int, device: torch.device) -> Tensor:
    """:func:`table_of_considered_visits`, made once per arguments (the policy only reads it)."""
    return table_of_considered_visits(max_num_considered_actions, num_simulations, device)


def _apply_temperature(logits: Tensor, temperature: float) -> Tensor:
    logits = logits - logits.amax(-1, keepdim=True)
    return logits / max(torch.finfo(logits.dtype).tiny, temperature)


def muzero_policy(params: Any, rng: torch.Generator | None, root: RootFnOutput, recurrent_fn: RecurrentFn,
                  num_simulations: int, invalid_actions: Tensor | None = None, max_depth: int | None = None,
                  loop_fn: Callable = fori_loop, *, qtransform: Callable = qtransform_by_parent_and_siblings,
                  dirichlet_fraction: float = 0.25, dirichlet_alpha: float = 0.3, pb_c_init: float = 1.25,
                  pb_c_base: float = 19652.0, temperature: float = 1.0,
                  compile: bool | str | dict = False) -> PolicyOutput:
    """MuZero search: Dirichlet noise on the root prior, PUCT selection, and an action
    sampled from the root visit counts at ``temperature`` (0: the most visited).
    ``compile``: see :func:`~steersman.planning.search.search`."""
    check_root(root, num_simulations, invalid_actions, max_depth)
    probs = torch.softmax(root.prior_logits, -1)
    if dirichlet_fraction != 0:
        noise = torch.softmax(_log_gamma_sample(dirichlet_alpha, probs.shape, probs, rng), -1)
        probs = (1 - dirichlet_fraction) * probs + dirichlet_fraction * noise
    root = root._replace(prior_logits=_mask_invalid_actions(_logits_from_probs(probs), invalid_actions))
    interior = functools.partial(muzero_action_selection, pb_c_init=pb_c_init, pb_c_base=pb_c_base,
                                 qtransform=qtransform)
    root_fn = functools.partial(interior, depth=0)
    tree = search(params, rng, root, recurrent_fn, root_fn, interior, num_simulations, max_depth,
                  invalid_actions, loop_fn=loop_fn, compile=compile)
    weights = tree.summary().visit_probs
    logits = _apply_temperature(_logits_from_probs(weights), temperature)
    action = (logits + _gumbel(logits.shape, logits, rng)).argmax(-1)
    return PolicyOutput(action, weights, tree)


def gumbel_muzero_policy(params: Any, rng: torch.Generator | None, root: RootFnOutput, recurrent_fn: RecurrentFn,
                         num_simulations: int, invalid_actions: Tensor | None = None, max_depth: int | None = None,
                         loop_fn: Callable = fori_loop, *,
                         qtransform: Callable = qtransform_completed_by_mix_value,
                         max_num_considered_actions: int = 16, gumbel_scale: float = 1.0,
                         compile: bool | str | dict = False) -> PolicyOutput:
    """Gumbel MuZero ("Policy improvement by planning with Gumbel"): Gumbel top-k with
    Sequential Halving at the root, deterministic selection inside; the action is the
    best of the most visited, the weights ``softmax(prior_logits + completed Q)``.
    ``compile``: see :func:`~steersman.planning.search.search`."""
    check_root(root, num_simulations, invalid_actions, max_depth)
    if isinstance(max_num_considered_actions, bool) or not isinstance(max_num_considered_actions, int) \
            or max_num_considered_actions < 1:
        raise ValueError(f"gumbel_muzero_policy: max_num_considered_actions must be an int >= 1, "
                         f"got {max_num_considered_actions!r}")
    logits = _mask_invalid_actions(root.prior_logits, invalid_actions)
    root = root._replace(prior_logits=logits)
    if gumbel_scale == 0:
        gumbel = torch.zeros_like(logits)
    else:
        gumbel = gumbel_scale * _gumbel(logits.shape, logits, rng)
    extra = TensorDict({"root_gumbel": gumbel}, batch_size=logits.shape[:1])
    table = _considered_table(max_num_considered_actions, num_simulations, logits.device)
    root_fn = functools.partial(gumbel_muzero_root_action_selection, table=table,
                                max_num_considered_actions=max_num_considered_actions, qtransform=qtransform)
    interior = functools.partial(gumbel_muzero_interior_action_selection, qtransform=qtransform)
    tree = search(params, rng, root, recurrent_fn, root_fn, interior, num_simulations, max_depth,
                  invalid_actions, extra_data=extra, loop_fn=loop_fn, compile=compile)
    visits = tree.children_visits[:, Tree.ROOT_INDEX]
    considered_visit = visits.amax(-1, keepdim=True)
    root_index = torch.zeros_like(tree.batch_range)
    completed = qtransform(tree, root_index)
    to_argmax = score_considered(considered_visit, gumbel, logits, completed, visits)
    inv = None if invalid_actions is None else invalid_actions.bool()
    action = masked_argmax(to_argmax, inv)
    weights = torch.softmax(_mask_invalid_actions(logits + completed, inv), -1)
    return PolicyOutput(action, weights, tree)
