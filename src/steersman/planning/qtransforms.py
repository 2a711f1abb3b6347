"""Q-value transforms (mctx semantics), batched: ``(tree, node_index [B]) -> [B, A]``.

Parameters are keyword-only; bind them with ``functools.partial``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .tree import Tree

__all__ = ["qtransform_by_min_max", "qtransform_by_parent_and_siblings", "qtransform_completed_by_mix_value"]


def _at(tree: Tree, x: Tensor, node_index: Tensor) -> Tensor:
    return x[tree.batch_range, node_index]


def qtransform_by_min_max(tree: Tree, node_index: Tensor, *, min_value: float, max_value: float) -> Tensor:
    """Q-values mapped by ``(q - min_value) / (max_value - min_value)``; unvisited
    actions get 0."""
    qvalues = tree.qvalues(node_index)
    visits = _at(tree, tree.children_visits, node_index)
    score = torch.where(visits > 0, qvalues, min_value)
    return (score - min_value) / (max_value - min_value)


def qtransform_by_parent_and_siblings(tree: Tree, node_index: Tensor, *, epsilon: float = 1e-8) -> Tensor:
    """Q-values normalized to ``[0, 1]`` by the min and max over the node's value and
    its visited children's Q-values; unvisited actions get 0."""
    qvalues = tree.qvalues(node_index)
    visited = _at(tree, tree.children_visits, node_index) > 0
    node_value = _at(tree, tree.node_values, node_index).unsqueeze(-1)
    safe = torch.where(visited, qvalues, node_value)
    lo = torch.minimum(node_value, safe.amin(-1, keepdim=True))
    hi = torch.maximum(node_value, safe.amax(-1, keepdim=True))
    completed = torch.where(visited, qvalues, lo)
    return (completed - lo) / (hi - lo).clamp_min(epsilon)


def _mixed_value(raw_value: Tensor, qvalues: Tensor, visits: Tensor, prior_probs: Tensor) -> Tensor:
    """Interpolation of the raw value and the prior-weighted Q-values of the visited
    actions (Appendix D of "Policy improvement by planning with Gumbel")."""
    total = visits.sum(-1).to(qvalues.dtype)
    prior_probs = prior_probs.clamp_min(torch.finfo(prior_probs.dtype).tiny)
    visited = visits > 0
    sum_probs = torch.where(visited, prior_probs, 0.0).sum(-1, keepdim=True)
    weighted = torch.where(visited, prior_probs * qvalues / torch.where(visited, sum_probs, 1.0), 0.0).sum(-1)
    return (raw_value + total * weighted) / (total + 1)


def qtransform_completed_by_mix_value(tree: Tree, node_index: Tensor, *, value_scale: float = 0.1,
                                      maxvisit_init: float = 50.0, rescale_values: bool = True,
                                      use_mixed_value: bool = True, epsilon: float = 1e-8) -> Tensor:
    """Completed Q-values: unvisited actions get the mixed value (or the raw value),
    optionally rescaled to ``[0, 1]``, times ``(maxvisit_init + max visits) * value_scale``."""
    qvalues = tree.qvalues(node_index)
    visits = _at(tree, tree.children_visits, node_index)
    raw_value = _at(tree, tree.raw_values, node_index)
    if use_mixed_value:
        prior_probs = torch.softmax(_at(tree, tree.children_prior_logits, node_index), -1)
        value = _mixed_value(raw_value, qvalues, visits, prior_probs)
    else:
        value = raw_value
    completed = torch.where(visits > 0, qvalues, value.unsqueeze(-1))
    if rescale_values:
        lo = completed.amin(-1, keepdim=True)
        hi = completed.amax(-1, keepdim=True)
        completed = (completed - lo) / (hi - lo).clamp_min(epsilon)
    visit_scale = maxvisit_init + visits.amax(-1, keepdim=True).to(completed.dtype)
    return visit_scale * value_scale * completed
