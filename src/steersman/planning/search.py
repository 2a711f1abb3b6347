"""Batched tree search (mctx's ``search``) in PyTorch.

A search runs ``num_simulations`` simulations on ``B`` trees at once. Each simulation
descends from the root with masks (every tree takes one step per depth level, trees
that reached an unexpanded action stop moving), expands one node per tree with one
call of the recurrent function, and backs the value up along the path. The only
Python loops are over simulations and depth levels.

Randomness: mctx threads a JAX key; here ``rng`` is a ``torch.Generator`` (or None
for torch's global generator). The search draws a ``[B, A]`` tensor of uniforms per
simulation for the action selection functions and passes ``rng`` itself to the
recurrent function, as mctx passes its key: ``recurrent_fn(params, rng, action,
embedding)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from steersman.tensordict import TensorDict, TensorDictBase

from .tree import Tree, instantiate_tree

__all__ = ["RecurrentFnOutput", "RootFnOutput", "fori_loop", "search", "simulate_once"]


class RootFnOutput(NamedTuple):
    """The model's output at the roots: ``prior_logits [B, A]``, ``value [B]`` and
    ``embedding`` (a TensorDict ``[B, ...]`` or a tensor ``[B, ...]``)."""

    prior_logits: Tensor
    value: Tensor
    embedding: TensorDictBase | Tensor


class RecurrentFnOutput(NamedTuple):
    """One step of the model: ``reward [B]``, ``discount [B]`` (-1 for two-player
    zero-sum games: the next node's value is the opponent's), ``prior_logits [B, A]``
    and ``value [B]`` of the next state."""

    reward: Tensor
    discount: Tensor
    prior_logits: Tensor
    value: Tensor


RecurrentFn = Callable[[Any, "torch.Generator | None", Tensor, Any], "tuple[RecurrentFnOutput, Any]"]


def fori_loop(lower: int, upper: int, body_fn: Callable[[int, Any], Any], init_val: Any) -> Any:
    """``for i in range(lower, upper): val = body_fn(i, val)`` (``jax.lax.fori_loop``'s
    signature; the default ``loop_fn`` of :func:`search`)."""
    val = init_val
    for i in range(lower, upper):
        val = body_fn(i, val)
    return val


_EMB_KEY = "embedding"


def _shape(x: Any) -> str:
    return str(list(x.shape)) if isinstance(x, Tensor) else type(x).__name__


def check_root(root: Any, num_simulations: Any, invalid_actions: Tensor | None, max_depth: Any) -> None:
    """Raises a ValueError/TypeError naming the bad input (root outputs, simulation
    count, depth, invalid-action mask)."""
    if not isinstance(root, RootFnOutput):
        raise TypeError(f"search: root must be a RootFnOutput(prior_logits, value, embedding), got {type(root).__name__}")
    if isinstance(num_simulations, bool) or not isinstance(num_simulations, int) or num_simulations < 1:
        raise ValueError(f"search: num_simulations must be an int >= 1, got {num_simulations!r}")
    if max_depth is not None and (isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1):
        raise ValueError(f"search: max_depth must be None or an int >= 1, got {max_depth!r}")
    logits, value, emb = root
    if not isinstance(logits, Tensor) or logits.ndim != 2 or not logits.dtype.is_floating_point:
        raise ValueError(f"search: root.prior_logits must be a float tensor [B, num_actions], got {_shape(logits)}"
                         + (f" of dtype {logits.dtype}" if isinstance(logits, Tensor) else ""))
    batch, num_actions = logits.shape
    if batch < 1 or num_actions < 1:
        raise ValueError(f"search: root.prior_logits must have B >= 1 and num_actions >= 1, got {list(logits.shape)}")
    if not isinstance(value, Tensor) or value.shape != (batch,) or not value.dtype.is_floating_point:
        raise ValueError(f"search: root.value must be a float tensor [B] = [{batch}] (B from root.prior_logits "
                         f"{list(logits.shape)}), got {_shape(value)}")
    if isinstance(emb, TensorDictBase):
        if emb.batch_size[:1] != (batch,):
            raise ValueError(f"search: root.embedding must have batch size [{batch}, ...], got {list(emb.batch_size)}")
    elif isinstance(emb, Tensor):
        if emb.shape[:1] != (batch,):
            raise ValueError(f"search: root.embedding must have shape [{batch}, ...], got {list(emb.shape)}")
    else:
        raise TypeError(f"search: root.embedding must be a TensorDict or a tensor, got {type(emb).__name__}")
    if invalid_actions is not None:
        if not isinstance(invalid_actions, Tensor) or invalid_actions.shape != (batch, num_actions):
            raise ValueError(f"search: invalid_actions must be a tensor [B, num_actions] = [{batch}, {num_actions}], "
                             f"got {_shape(invalid_actions)}")
        all_invalid = invalid_actions.bool().all(-1)
        if bool(all_invalid.any()):
            rows = all_invalid.nonzero().flatten().tolist()
            raise ValueError(f"search: every action is invalid at the roots {rows[:10]} (invalid_actions); "
                             "a root needs at least one valid action")


def _check_step(out: Any, emb_template: TensorDictBase | Tensor, batch: int, num_actions: int) -> None:
    """Checks what the recurrent function returned on its first call."""
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], RecurrentFnOutput)):
        raise TypeError("search: recurrent_fn must return (RecurrentFnOutput(reward, discount, prior_logits, value), "
                        f"next_embedding), got {type(out).__name__}"
                        + (f" of {[type(x).__name__ for x in out]}" if isinstance(out, tuple) else ""))
    step, emb = out
    want = {"reward": (batch,), "discount": (batch,), "prior_logits": (batch, num_actions), "value": (batch,)}
    for name, shape in want.items():
        x = getattr(step, name)
        if not isinstance(x, Tensor) or x.shape != shape:
            raise ValueError(f"search: recurrent_fn returned {name} of shape {_shape(x)}, expected {list(shape)}")
    if isinstance(emb_template, Tensor):
        if not isinstance(emb, Tensor) or emb.shape != emb_template.shape:
            raise ValueError(f"search: recurrent_fn returned a next embedding of shape {_shape(emb)}, expected a "
                             f"tensor {list(emb_template.shape)} like root.embedding")
        return
    if not isinstance(emb, TensorDictBase):
        raise TypeError(f"search: recurrent_fn returned a next embedding of type {type(emb).__name__}, expected a "
                        "TensorDict like root.embedding")
    for key in emb_template.keys(include_nested=True, leaves_only=True):
        x = emb.get(key, None)
        ref = emb_template.get(key)
        if x is None:
            raise ValueError(f"search: recurrent_fn's next embedding has no entry {key!r}; root.embedding has it "
                             f"with shape {list(ref.shape)}")
        if not isinstance(x, Tensor) or x.shape != ref.shape:
            raise ValueError(f"search: recurrent_fn's next embedding entry {key!r} has shape {_shape(x)}, "
                             f"expected {list(ref.shape)} like root.embedding")


def _leaf_keys(td: TensorDictBase) -> list:
    return list(td.keys(include_nested=True, leaves_only=True))


def simulate_once(params: Any, rng: torch.Generator | None, tree: Tree, sim: int | Tensor, uniform: Tensor | None,
                  recurrent_fn: RecurrentFn, root_action_selection_fn: Callable,
                  interior_action_selection_fn: Callable, max_depth: int, depth_steps: int,
                  early_exit: bool = False, tensor_embedding: bool = False) -> Tensor:
    """One simulation on every tree, updating ``tree`` in place: a descent of at most
    ``depth_steps`` levels (``<= max_depth``), one expansion (node ``sim + 1`` unless
    ``max_depth`` stopped the descent on an expanded node, which is then re-evaluated
    as in mctx) and the backup. Fixed shapes and no data-dependent Python control
    flow unless ``early_exit`` (stop descending once every tree reached a leaf), so it
    compiles with ``fullgraph=True`` (pass ``sim`` as a 0-dim int64 tensor to reuse one
    graph for every simulation). Returns the ``[B]`` expanded node indices."""
    ar = tree.batch_range
    children_index = tree.children_index
    node = torch.zeros_like(ar)
    parent = node
    action = node
    depth = node
    active = torch.ones_like(ar, dtype=torch.bool)
    steps = 0
    for d in range(depth_steps):
        if d == 0:
            a = root_action_selection_fn(uniform, tree, node)
        else:
            a = interior_action_selection_fn(uniform, tree, node, d)
        nxt = children_index[ar, node, a]
        parent = torch.where(active, node, parent)
        action = torch.where(active, a, action)
        depth = depth + active.long()
        steps = d + 1
        if d + 1 >= max_depth:
            break
        active = active & (nxt != Tree.UNVISITED)
        node = torch.where(active, nxt, node)
        if early_exit and not bool(active.any()):
            break

    # expansion
    nn = children_index[ar, parent, action]
    nn = torch.where(nn == Tree.UNVISITED, sim + 1, nn)
    emb_store = tree.embeddings
    keys = _leaf_keys(emb_store)
    if tensor_embedding:
        emb = emb_store.get(_EMB_KEY)[ar, parent]
    else:
        emb = TensorDict({k: emb_store.get(k)[ar, parent] for k in keys}, batch_size=ar.shape)
    step, next_emb = recurrent_fn(params, rng, action, emb)
    tree.children_prior_logits[ar, nn] = step.prior_logits
    tree.raw_values[ar, nn] = step.value
    tree.node_values[ar, nn] = step.value
    tree.node_visits[ar, nn] += 1
    tree.depth[ar, nn] = depth
    if tensor_embedding:
        emb_store.get(_EMB_KEY)[ar, nn] = next_emb
    else:
        for k in keys:
            emb_store.get(k)[ar, nn] = next_emb.get(k)
    children_index[ar, parent, action] = nn
    tree.children_rewards[ar, parent, action] = step.reward
    tree.children_discounts[ar, parent, action] = step.discount
    tree.parents[ar, nn] = parent
    tree.action_from_parent[ar, nn] = action

    # backup along the path (at most `steps` edges)
    index = nn
    leaf_value = tree.node_values[ar, index]
    for _ in range(steps):
        up = index != Tree.ROOT_INDEX
        p = tree.parents[ar, index].clamp_min(0)
        a = tree.action_from_parent[ar, index].clamp_min(0)
        count = tree.node_visits[ar, p]
        leaf_value = tree.children_rewards[ar, p, a] + tree.children_discounts[ar, p, a] * leaf_value
        old_value = tree.node_values[ar, p]
        parent_value = (old_value * count + leaf_value) / (count + 1.0)
        child_value = tree.node_values[ar, index]
        child_visits = tree.children_visits[ar, p, a]
        tree.node_values[ar, p] = torch.where(up, parent_value, old_value)
        tree.node_visits[ar, p] = count + up.to(count.dtype)
        tree.children_values[ar, p, a] = torch.where(up, child_value, tree.children_values[ar, p, a])
        tree.children_visits[ar, p, a] = child_visits + up.to(child_visits.dtype)
        index = torch.where(up, p, index)
    return nn


def search(params: Any, rng: torch.Generator | None, root: RootFnOutput, recurrent_fn: RecurrentFn,
           root_action_selection_fn: Callable, interior_action_selection_fn: Callable, num_simulations: int,
           max_depth: int | None = None, invalid_actions: Tensor | None = None,
           extra_data: TensorDictBase | None = None, loop_fn: Callable = fori_loop) -> Tree:
    """Runs ``num_simulations`` simulations on ``B`` trees and returns the :class:`Tree`.

    Args mirror mctx's ``search``: ``params`` is passed to ``recurrent_fn(params, rng,
    action [B], embedding) -> (RecurrentFnOutput, next_embedding)``; ``rng`` is a
    ``torch.Generator`` (None: torch's global one); ``invalid_actions`` a ``[B, A]``
    mask (True/1: invalid) applied at the roots; ``max_depth`` the most edges from a
    root to a leaf (default: ``num_simulations``); ``loop_fn(lower, upper, body,
    tree)`` runs the simulations (default: a Python loop).
    Bad inputs raise before any simulation; the recurrent function's output is
    checked on its first call.
    """
    check_root(root, num_simulations, invalid_actions, max_depth)
    logits, value, emb = root
    batch, num_actions = logits.shape
    if max_depth is None:
        max_depth = num_simulations
    if invalid_actions is None:
        invalid_actions = torch.zeros_like(logits, dtype=torch.bool)
    tensor_embedding = isinstance(emb, Tensor)
    emb_td = TensorDict({_EMB_KEY: emb}, batch_size=[batch]) if tensor_embedding else emb
    if extra_data is None:
        extra_data = TensorDict({}, batch_size=[batch])
    tree = instantiate_tree(logits, value, emb_td, num_simulations, invalid_actions.bool(), extra_data)
    compiling = torch.compiler.is_compiling()

    def checked_fn(p: Any, g: Any, a: Tensor, e: Any) -> tuple[RecurrentFnOutput, Any]:
        out = recurrent_fn(p, g, a, e)
        _check_step(out, emb, batch, num_actions)
        return out

    def body(sim: int, tree: Tree) -> Tree:
        uniform = torch.rand((batch, num_actions), generator=rng, dtype=logits.dtype, device=logits.device)
        simulate_once(params, rng, tree, sim, uniform, checked_fn if sim == 0 else recurrent_fn,
                      root_action_selection_fn, interior_action_selection_fn, max_depth,
                      min(max_depth, sim + 1), early_exit=not compiling, tensor_embedding=tensor_embedding)
        return tree

    return loop_fn(0, num_simulations, body, tree)
