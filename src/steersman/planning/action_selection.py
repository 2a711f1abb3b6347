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
from typing import Any

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


# under torch.compile, the built-in selections (PUCT with the parent-and-siblings
# transform, Gumbel MuZero's interior selection with the mixed-value transform) over at
# most this many actions are computed column by column (one [B] tensor per action,
# reductions as chains of elementwise ops): inductor then fuses the whole selection into
# one loop over the trees with the intermediates in registers, instead of one loop nest
# and one buffer per reduction over a short row
COLUMNS_MAX_ACTIONS = 16


def _chain(xs: list[Tensor], op: Callable) -> Tensor:
    """``op(...op(op(xs[0], xs[1]), xs[2])..., xs[-1])``."""
    out = xs[0]
    for x in xs[1:]:
        out = op(out, x)
    return out


def _argmax_columns(scores: list[Tensor]) -> Tensor:
    """The index of the largest column (the first on ties), ``int64 [B]``."""
    best, index = scores[0], torch.zeros(scores[0].shape, dtype=torch.int64, device=scores[0].device)
    for a, score in enumerate(scores[1:], 1):
        better = score > best
        best, index = torch.where(better, score, best), torch.where(better, a, index)
    return index


def _softmax_columns(xs: list[Tensor]) -> list[Tensor]:
    top = _chain(xs, torch.maximum)
    exps = [torch.exp(x - top) for x in xs]
    norm = _chain(exps, torch.add)
    return [e / norm for e in exps]


def _column_reader(tree: Tree, node_index: Tensor) -> Callable[[Tensor], list[Tensor]]:
    """``cols(x)``: the ``[B]`` columns ``x[b, node_index[b], a]`` of a ``[B, N, A]`` tree array."""
    ar = tree.batch_range
    # one index tensor per action (an int there would slice the whole [B, N] column out of x)
    actions = [torch.full_like(node_index, a) for a in range(tree.num_actions)]

    def cols(x: Tensor) -> list[Tensor]:
        return [x[ar, node_index, a] for a in actions]

    return cols


def _q_columns(tree: Tree, cols: Callable[[Tensor], list[Tensor]]) -> list[Tensor]:
    """The children's ``r + discount * value`` per action column (the Q-values of the
    row formulas)."""
    return [r + g * v for r, g, v in zip(cols(tree.children_rewards), cols(tree.children_discounts),
                                         cols(tree.children_values))]


def _keywords_of(qtransform: Callable, fn: Callable) -> dict | None:
    """The keywords of ``qtransform`` if it is ``fn`` (itself or a ``functools.partial``
    of it with keywords only), else None."""
    if qtransform is fn:
        return {}
    if isinstance(qtransform, functools.partial) and qtransform.func is fn and not qtransform.args:
        return dict(qtransform.keywords)
    return None


def _use_columns(tree: Tree) -> bool:
    return tree.num_actions <= COLUMNS_MAX_ACTIONS and torch.compiler.is_compiling()


def _muzero_columns(uniform: Tensor | None, tree: Tree, node_index: Tensor, invalid: Tensor | None,
                    pb_c_init: float, pb_c_base: float, epsilon: float = 1e-8) -> Tensor:
    """:func:`muzero_action_selection` with :func:`qtransform_by_parent_and_siblings`, the
    same formulas written per action column; ``invalid``: the ``[B, A]`` mask or None."""
    ar = tree.batch_range
    cols = _column_reader(tree, node_index)
    q = _q_columns(tree, cols)
    visits = cols(tree.children_visits)
    visited = [v > 0 for v in visits]
    node_value = tree.node_values[ar, node_index]
    safe = [torch.where(m, x, node_value) for m, x in zip(visited, q)]
    lo = torch.minimum(node_value, _chain(safe, torch.minimum))
    span = (torch.maximum(node_value, _chain(safe, torch.maximum)) - lo).clamp_min(epsilon)
    node_visit = tree.node_visits[ar, node_index]
    pb_c = pb_c_init + torch.log((node_visit + pb_c_base + 1.0) / pb_c_base)
    scale = node_visit.to(tree.children_prior_logits.dtype).sqrt() * pb_c
    probs = _softmax_columns(cols(tree.children_prior_logits))
    scores = [(torch.where(m, x, lo) - lo) / span + scale * p / (v + 1)
              for m, x, p, v in zip(visited, q, probs, visits)]
    if uniform is not None:
        scores = [x + 1e-7 * u for x, u in zip(scores, uniform.unbind(-1))]
    if invalid is not None:
        scores = [torch.where(m, float("-inf"), x) for m, x in zip(invalid.unbind(-1), scores)]
    return _argmax_columns(scores)


def _completed_columns(tree: Tree, node_index: Tensor, *, value_scale: float = 0.1, maxvisit_init: float = 50.0,
                       rescale_values: bool = True, use_mixed_value: bool = True,
                       epsilon: float = 1e-8) -> tuple[list[Tensor], list[Tensor], list[Tensor], Tensor]:
    """:func:`qtransform_completed_by_mix_value` written per action column (``[B]``
    tensors, sums left to right). Returns the completed Q-value, visit and prior logit
    columns and the ``[B]`` visit totals."""
    ar = tree.batch_range
    cols = _column_reader(tree, node_index)
    q = _q_columns(tree, cols)
    visits = cols(tree.children_visits)
    logits = cols(tree.children_prior_logits)
    visited = [v > 0 for v in visits]
    total_visits = _chain(visits, torch.add)
    value = tree.raw_values[ar, node_index]
    if use_mixed_value:
        tiny = torch.finfo(logits[0].dtype).tiny
        probs = [p.clamp_min(tiny) for p in _softmax_columns(logits)]
        sum_probs = _chain([torch.where(m, p, 0.0) for m, p in zip(visited, probs)], torch.add)
        weighted = _chain([torch.where(m, p * x / torch.where(m, sum_probs, 1.0), 0.0)
                           for m, p, x in zip(visited, probs, q)], torch.add)
        total = total_visits.to(q[0].dtype)
        value = (value + total * weighted) / (total + 1)
    completed = [torch.where(m, x, value) for m, x in zip(visited, q)]
    if rescale_values:
        lo = _chain(completed, torch.minimum)
        span = (_chain(completed, torch.maximum) - lo).clamp_min(epsilon)
        completed = [(c - lo) / span for c in completed]
    scale = (maxvisit_init + _chain(visits, torch.maximum).to(completed[0].dtype)) * value_scale
    return [scale * c for c in completed], visits, logits, total_visits


def _gumbel_interior_columns(tree: Tree, node_index: Tensor, **keywords: Any) -> Tensor:
    """:func:`gumbel_muzero_interior_action_selection` with
    :func:`qtransform_completed_by_mix_value` (``keywords``), the same formulas written per
    action column (argmax keeps the first index on ties)."""
    completed, visits, logits, total_visits = _completed_columns(tree, node_index, **keywords)
    probs = _softmax_columns([x + c for x, c in zip(logits, completed)])
    denom = 1 + total_visits
    return _argmax_columns([p - v / denom for p, v in zip(probs, visits)])


def _gumbel_root_columns(tree: Tree, node_index: Tensor, table: Tensor, max_num_considered_actions: int,
                         **keywords: Any) -> Tensor:
    """:func:`gumbel_muzero_root_action_selection` with
    :func:`qtransform_completed_by_mix_value` (``keywords``), per action column."""
    completed, visits, logits, total_visits = _completed_columns(tree, node_index, **keywords)
    invalid = tree.root_invalid_actions.unbind(-1)
    num_valid = _chain([(~m).long() for m in invalid], torch.add)
    considered_visit = table[num_valid.clamp_max(max_num_considered_actions), total_visits]
    top = _chain(logits, torch.maximum)
    scores = [torch.clamp_min(g + (x - top) + c, -1e9) + torch.where(v == considered_visit, 0.0, float("-inf"))
              for g, x, c, v in zip(tree.extra_data["root_gumbel"].unbind(-1), logits, completed, visits)]
    return _argmax_columns([torch.where(m, float("-inf"), x) for m, x in zip(invalid, scores)])


def muzero_action_selection(uniform: Tensor | None, tree: Tree, node_index: Tensor, depth: int | Tensor, *,
                            pb_c_init: float = 1.25, pb_c_base: float = 19652.0,
                            qtransform: Callable = qtransform_by_parent_and_siblings) -> Tensor:
    """PUCT (MuZero Appendix B): ``Q + sqrt(N) * c(N) * P / (1 + n)``, plus ``1e-7 *
    uniform`` to break ties; invalid root actions are masked at depth 0."""
    if _use_columns(tree):
        keywords = _keywords_of(qtransform, qtransform_by_parent_and_siblings)
        if keywords is not None:
            if isinstance(depth, Tensor):
                invalid = tree.root_invalid_actions & (depth == 0)
            else:
                invalid = tree.root_invalid_actions if depth == 0 else None
            return _muzero_columns(uniform, tree, node_index, invalid, pb_c_init, pb_c_base, **keywords)
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
    if _use_columns(tree):
        keywords = _keywords_of(qtransform, qtransform_completed_by_mix_value)
        if keywords is not None:
            return _gumbel_root_columns(tree, node_index, table, max_num_considered_actions, **keywords)
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
    if _use_columns(tree):
        keywords = _keywords_of(qtransform, qtransform_completed_by_mix_value)
        if keywords is not None:
            return _gumbel_interior_columns(tree, node_index, **keywords)
    ar = tree.batch_range
    visits = tree.children_visits[ar, node_index]
    probs = torch.softmax(tree.children_prior_logits[ar, node_index] + qtransform(tree, node_index), -1)
    return (probs - visits / (1 + visits.sum(-1, keepdim=True))).argmax(-1)
