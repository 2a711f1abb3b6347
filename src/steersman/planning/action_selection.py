"""Action selection at the root and at interior nodes (mctx semantics), batched.

Signatures (mctx's, with the JAX key replaced by a tensor of uniforms):

* root: ``(uniform, tree, node_index) -> action``
* interior: ``(uniform, tree, node_index, depth) -> action``

``uniform`` is a ``[B, A]`` tensor of ``U[0, 1)`` draws made by the search once per
simulation (a ``torch.Generator`` cannot enter a compiled graph; a tensor can);
``node_index`` and the returned action are ``[B]`` int64; ``depth`` is a Python int
(every tree of the batch is at the same depth of its descent).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
from torch import Tensor

from .qtransforms import qtransform_by_parent_and_siblings, qtransform_completed_by_mix_value
from .tree import Tree

__all__ = [
    "gumbel_muzero_interior_action_selection",
    "gumbel_muzero_root_action_selection",
    "masked_argmax",
    "muzero_action_selection",
    "score_considered",
    "table_of_considered_visits",
]


def masked_argmax(to_argmax: Tensor, invalid_actions: Tensor | None) -> Tensor:
    """The argmax over the valid actions (first index on ties)."""
    if invalid_actions is not None:
        to_argmax = torch.where(invalid_actions, float("-inf"), to_argmax)
    return to_argmax.argmax(-1)


def muzero_action_selection(uniform: Tensor | None, tree: Tree, node_index: Tensor, depth: int | Tensor, *,
                            pb_c_init: float = 1.25, pb_c_base: float = 19652.0,
                            qtransform: Callable = qtransform_by_parent_and_siblings) -> Tensor:
    """PUCT (MuZero Appendix B): ``Q + sqrt(N) * c(N) * P / (1 + n)``, plus ``1e-7 *
    uniform`` to break ties; invalid root actions are masked at depth 0."""
    ar = tree.batch_range
    visits = tree.children_visits[ar, node_index]
    node_visit = tree.node_visits[ar, node_index].unsqueeze(-1)
    dt = tree.children_prior_logits.dtype
    pb_c = pb_c_init + torch.log((node_visit + pb_c_base + 1.0) / pb_c_base)
    prior_probs = torch.softmax(tree.children_prior_logits[ar, node_index], -1)
    policy_score = node_visit.to(dt).sqrt() * pb_c * prior_probs / (visits + 1)
    to_argmax = qtransform(tree, node_index) + policy_score
    if uniform is not None:
        to_argmax = to_argmax + 1e-7 * uniform
    if isinstance(depth, Tensor):  # inside a compiled descent (while_loop): a 0-dim tensor
        return masked_argmax(to_argmax, tree.root_invalid_actions & (depth == 0))
    return masked_argmax(to_argmax, tree.root_invalid_actions if depth == 0 else None)


@functools.lru_cache(maxsize=64)
def _considered_visits(max_num_considered_actions: int, num_simulations: int) -> tuple[int, ...]:
    if max_num_considered_actions <= 1:
        return tuple(range(num_simulations))
    log2max = int(math.ceil(math.log2(max_num_considered_actions)))
    sequence: list[int] = []
    visits = [0] * max_num_considered_actions
    num_considered = max_num_considered_actions
    while len(sequence) < num_simulations:
        extra = max(1, int(num_simulations / (log2max * num_considered)))
        for _ in range(extra):
            sequence.extend(visits[:num_considered])
            for i in range(num_considered):
                visits[i] += 1
        num_considered = max(2, num_considered // 2)
    return tuple(sequence[:num_simulations])


def table_of_considered_visits(max_num_considered_actions: int, num_simulations: int,
                               device: torch.device | str | None = None) -> Tensor:
    """Sequential Halving's visit count to consider at each simulation, for each
    number of considered actions: int64 ``[max_num_considered_actions + 1, num_simulations]``."""
    rows = [_considered_visits(m, num_simulations) for m in range(max_num_considered_actions + 1)]
    return torch.tensor(rows, dtype=torch.int64, device=device)


def score_considered(considered_visit: Tensor, gumbel: Tensor, logits: Tensor, normalized_qvalues: Tensor,
                     visit_counts: Tensor) -> Tensor:
    """``gumbel + logits + q`` for the actions with ``considered_visit`` visits, -inf
    for the others (``considered_visit`` broadcasts against ``[B, A]``)."""
    logits = logits - logits.amax(-1, keepdim=True)
    penalty = torch.where(visit_counts == considered_visit, 0.0, float("-inf"))
    return torch.clamp_min(gumbel + logits + normalized_qvalues, -1e9) + penalty


def gumbel_muzero_root_action_selection(uniform: Tensor | None, tree: Tree, node_index: Tensor, *,
                                        table: Tensor, max_num_considered_actions: int,
                                        qtransform: Callable = qtransform_completed_by_mix_value) -> Tensor:
    """Sequential Halving with Gumbel at the root; ``table`` is
    :func:`table_of_considered_visits` for the search's simulation count and the
    root Gumbel noise is ``tree.extra_data["root_gumbel"]``."""
    ar = tree.batch_range
    visits = tree.children_visits[ar, node_index]
    prior_logits = tree.children_prior_logits[ar, node_index]
    completed = qtransform(tree, node_index)
    num_valid = (~tree.root_invalid_actions).sum(-1)
    num_considered = num_valid.clamp_max(max_num_considered_actions)
    simulation_index = visits.sum(-1)
    considered_visit = table[num_considered, simulation_index].unsqueeze(-1)
    to_argmax = score_considered(considered_visit, tree.extra_data["root_gumbel"], prior_logits, completed, visits)
    return masked_argmax(to_argmax, tree.root_invalid_actions)


def gumbel_muzero_interior_action_selection(uniform: Tensor | None, tree: Tree, node_index: Tensor, depth: int,
                                            *, qtransform: Callable = qtransform_completed_by_mix_value) -> Tensor:
    """Deterministic selection whose visit frequencies follow
    ``softmax(prior_logits + completed Q)``."""
    ar = tree.batch_range
    visits = tree.children_visits[ar, node_index]
    probs = torch.softmax(tree.children_prior_logits[ar, node_index] + qtransform(tree, node_index), -1)
    return (probs - visits / (1 + visits.sum(-1, keepdim=True))).argmax(-1)
