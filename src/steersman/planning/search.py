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

import contextlib
import dataclasses
import gc
import types
import warnings
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


def _while(cond: Callable, body: Callable, carry: tuple, compiled: bool) -> tuple:
    """``while cond(*carry): carry = body(*carry)``; under compile, ``torch``'s
    ``while_loop`` (a data-dependent loop inside one graph).

    Every compiled loop here runs its body at least once (a first iteration that is a
    no-op where there is nothing to do): with torch 2.13, inductor's C++ wrapper
    (``cpp_wrapper``) returns the carried inputs themselves from a loop that runs no
    iteration (the Python wrapper returns clones), and its buffer reuse then overwrites
    those outputs with later results (wrong trees, or an index out of bounds)."""
    if compiled:
        from torch._higher_order_ops.while_loop import while_loop

        return tuple(while_loop(cond, body, carry))
    while bool(cond(*carry)):
        carry = body(*carry)
    return carry


def simulate_once(params: Any, rng: torch.Generator | None, tree: Tree, sim: int | Tensor, uniform: Tensor | None,
                  recurrent_fn: RecurrentFn, root_action_selection_fn: Callable,
                  interior_action_selection_fn: Callable, max_depth: int, depth_steps: int,
                  early_exit: bool = False, tensor_embedding: bool = False, use_while_loop: bool = False,
                  unroll: int = 1, compact: int = 0, ancestors: Tensor | None = None) -> Tensor:
    """One simulation on every tree, updating ``tree`` in place: a descent of at most
    ``depth_steps`` levels (``<= max_depth``), one expansion (node ``sim + 1`` unless
    ``max_depth`` stopped the descent on an expanded node, which is then re-evaluated
    as in mctx) and the backup along the recorded path (vectorized over the path).

    Every tree descends one level per step with masks (trees that reached an
    unexpanded action stop moving). The descent stops after ``depth_steps`` levels, or
    earlier once every tree reached a leaf if ``early_exit`` (a Python check) or
    ``use_while_loop`` (``torch``'s ``while_loop``: the depth is data-dependent but
    the graph is not). With ``use_while_loop`` (or neither flag) there is no
    data-dependent Python control flow, so it compiles with ``fullgraph=True`` (pass
    ``sim`` as a 0-dim int64 tensor to reuse one graph for every simulation); under
    ``use_while_loop`` the interior selection gets ``depth`` as a 0-dim tensor, and
    each iteration of the descent and backup loops does ``unroll`` levels (masked past
    the end: the same result, fewer loop iterations, each of which costs a call of the
    compiled loop body). ``ancestors``: a ``[B, N, depth_steps + 1]`` int64 array, row
    ``n`` the nodes from the root to node ``n`` (column ``c``: the node at depth ``c``;
    zeros past node ``n``'s depth), kept up to date here; with it a ``use_while_loop``
    descent without ``compact`` carries only the last node and action, not the path
    (``[B, depth_steps]`` arrays rewritten at every level), and the path is that node's
    row. Returns the ``[B]`` expanded node indices."""
    ar = tree.batch_range
    children_index = tree.children_index
    batch = ar.shape[0]
    levels = max(1, min(depth_steps, max_depth))
    # the path: node and action at each level (columns >= depth are unused)
    path_nodes = torch.zeros((batch, levels), dtype=torch.int64, device=ar.device)
    root = path_nodes[:, 0]
    a = root_action_selection_fn(uniform, tree, root)
    path_actions = a.unsqueeze(-1).expand(batch, levels).contiguous()
    nxt = children_index[ar, root, a]
    depth = torch.ones_like(ar)
    active = nxt != Tree.UNVISITED
    last_step = None  # (parent, action) of the expansion, when the descent carried them
    if levels > 1:
        cols = torch.arange(levels, device=ar.device)
        node = torch.where(active, nxt, root)

        def cond_from(start: Tensor | int) -> Callable:
            """Descend while a tree is active and ``d < levels``, and at ``d == start`` (the
            first iteration, a no-op if no tree is active: see :func:`_while`)."""
            def cond(d: Tensor, node: Tensor, active: Tensor, *rest: Tensor) -> Tensor:
                return (active.any() & (d < levels)) | (d == start)
            return cond

        def level_fn(t: Tree, rows: Tensor, u: Tensor | None) -> Callable:
            """One level of the descent of the trees ``rows`` (``t.batch_range``)."""
            def body(d: Tensor, node: Tensor, active: Tensor, depth: Tensor, pn: Tensor, pa: Tensor) -> tuple:
                a = interior_action_selection_fn(u, t, node, d)
                nxt = children_index[rows, node, a]
                at = (cols == d) & active.unsqueeze(-1)
                pn = torch.where(at, node.unsqueeze(-1), pn)
                pa = torch.where(at, a.unsqueeze(-1), pa)
                depth = depth + active.long()
                active = active & (nxt != Tree.UNVISITED)
                return d + 1, torch.where(active, nxt, node), active, depth, pn, pa
            return body

        def step_fn(d: Tensor, node: Tensor, active: Tensor, depth: Tensor, parent: Tensor, action: Tensor) -> tuple:
            """One level of the descent carrying the last node and action instead of the path."""
            a = interior_action_selection_fn(uniform, tree, node, d)
            nxt = children_index[ar, node, a]
            parent = torch.where(active, node, parent)
            action = torch.where(active, a, action)
            depth = depth + active.long()
            active = active & (nxt != Tree.UNVISITED)
            return d + 1, torch.where(active, nxt, node), active, depth, parent, action

        def unrolled_fn(body: Callable, k: int = unroll) -> Callable:
            def unrolled(d: Tensor, node: Tensor, active: Tensor, *rest: Tensor) -> tuple:
                carry = body(d, node, active & (d < levels), *rest)
                for _ in range(k - 1):  # levels past the end are no-ops for every tree
                    d = carry[0]
                    carry = body(d, carry[1], carry[2] & (d < levels), *carry[3:])
                return carry
            return unrolled

        body = level_fn(tree, ar, uniform)
        carry = (torch.ones((), dtype=torch.int64, device=ar.device), node, active, depth, path_nodes, path_actions)
        if use_while_loop and compact:
            # full width while more than ``compact`` trees are still descending, then only
            # those trees (deep trees are few: the deepest of B trees is several times the
            # mean depth, and every full-width level computes the selection for all B)
            def cond_full(d: Tensor, node: Tensor, active: Tensor, *rest: Tensor) -> Tensor:
                return (active.any() & (d < levels) & (active.sum() > compact)) | (d == 1)

            carry = _while(cond_full, unrolled_fn(body), carry, True)
            carry = _descend_compacted(tree, uniform, carry, compact, cond_from, level_fn, unrolled_fn)
        elif use_while_loop and ancestors is not None:
            carry = _while(cond_from(1), unrolled_fn(step_fn), (*carry[:4], torch.zeros_like(ar), a), True)
            last_step = carry[4:]
            row = ancestors[ar, last_step[0]]  # the path to the parent, and zeros
            carry = (*carry[:4], row[:, :levels], None)  # the path's actions: after the expansion
        elif use_while_loop:
            carry = _while(cond_from(1), unrolled_fn(body), carry, True)
        else:
            for d in range(1, levels):
                if early_exit and not bool(carry[2].any()):
                    break
                carry = body(d, *carry[1:])
        _, node, active, depth, path_nodes, path_actions = carry
    last = (depth - 1).unsqueeze(-1)
    if last_step is None:
        parent = path_nodes.gather(1, last).squeeze(-1)
        action = path_actions.gather(1, last).squeeze(-1)
    else:
        parent, action = last_step

    nn, leaf_value = _expand(params, rng, tree, sim, parent, action, depth, recurrent_fn, tensor_embedding)
    if last_step is not None:
        # the new node's row: its parent's path, then itself
        wide = torch.arange(levels + 1, device=ar.device)
        ancestors[ar, nn] = torch.where(wide < depth.unsqueeze(-1), row,
                                        torch.where(wide == depth.unsqueeze(-1), nn.unsqueeze(-1), 0))
        # the path's actions: each node's action from its parent, one level down (read after
        # the expansion's write of action_from_parent, so inductor writes that in place)
        below = row[:, 1:].clamp_min(1)
        path_actions = torch.where(cols < last, tree.action_from_parent[ar.unsqueeze(-1), below],
                                   action.unsqueeze(-1))

    # backup: returns along the path from the leaf up (mctx's order of operations),
    # then one masked write per array. Unused path columns repeat column 0's write.
    br = ar.unsqueeze(-1)
    rewards = tree.children_rewards[br, path_nodes, path_actions]
    discounts = tree.children_discounts[br, path_nodes, path_actions]
    cols = torch.arange(levels, device=ar.device)
    if use_while_loop and levels > BACKUP_UNROLL_MAX:  # as deep as the deepest path, inside the graph
        def bcond(i: Tensor, ret: Tensor, returns: Tensor) -> Tensor:
            return i >= 0

        def bbody(i: Tensor, ret: Tensor, returns: Tensor) -> tuple:
            for j in range(unroll):  # levels below 0 (unrolled past the root) are no-ops
                at = i.clamp_min(0).reshape(1) if j else i.reshape(1)
                r = rewards.index_select(1, at).squeeze(1)
                g = discounts.index_select(1, at).squeeze(1)
                ret = torch.where((depth > i) & (i >= 0) if j else depth > i, r + g * ret, ret)
                returns = torch.where(cols == i, ret.unsqueeze(-1), returns)
                i = i - 1
            return i, ret, returns

        returns = _while(bcond, bbody, (depth.max() - 1, leaf_value, torch.zeros_like(rewards)), True)[2]
    else:
        # eager: only as deep as the deepest path; compiled: every level, unrolled (one
        # fused loop over the trees, no loop calls: cheaper than the loop for narrow paths)
        if torch.compiler.is_compiling():
            returns = _backup_returns(rewards, discounts, depth, leaf_value)
        else:
            ret, top = leaf_value, int(depth.max())
            rets = [leaf_value] * (levels - top)
            for i in range(top - 1, -1, -1):
                ret = torch.where(depth > i, rewards[:, i] + discounts[:, i] * ret, ret)
                rets.append(ret)
            returns = torch.stack(rets[::-1], -1)
    count = tree.node_visits[br, path_nodes]
    new_values = (tree.node_values[br, path_nodes] * count + returns) / (count + 1.0)
    child_values = torch.cat([new_values[:, 1:], leaf_value.unsqueeze(-1)], -1) if levels > 1 \
        else leaf_value.unsqueeze(-1)
    child_values = torch.where(cols == last, leaf_value.unsqueeze(-1), child_values)
    used = cols < depth.unsqueeze(-1)
    pn = torch.where(used, path_nodes, 0)
    pa = torch.where(used, path_actions, path_actions[:, :1])
    tree.node_values[br, pn] = torch.where(used, new_values, new_values[:, :1])
    tree.node_visits[br, pn] = torch.where(used, count, count[:, :1]) + 1
    tree.children_values[br, pn, pa] = torch.where(used, child_values, child_values[:, :1])
    visits = tree.children_visits[br, pn, pa]
    tree.children_visits[br, pn, pa] = torch.where(used, visits, visits[:, :1]) + 1
    return nn


def _backup_returns(rewards: Tensor, discounts: Tensor, depth: Tensor, leaf_value: Tensor,
                    block: int = 16) -> Tensor:
    """The ``[B, L]`` returns of the backup as ``[B, block]`` chains: column ``c`` holds the
    running return from the leaf up to level ``c`` and stops updating below it, so each
    column sees the eager loop's operations in the same order (equal values). Every
    level has one reader (the next level), so inductor realizes no ``[B]`` buffer per
    level (the per-level returns with two readers were 23 allocations per simulation).
    The columns go in blocks of ``block`` (a vector of floats), from the last: a block's
    chain starts from the running return at the block above it (that block's first
    column) and runs over its own levels only, not over all ``L`` for every column."""
    levels = rewards.shape[1]
    depth = depth.unsqueeze(-1)
    ret_in, blocks = leaf_value, []
    for start in range((levels - 1) // block * block, -1, -block):
        stop = min(start + block, levels)
        cols = torch.arange(start, stop, device=rewards.device)
        ret = ret_in.unsqueeze(-1).expand(-1, stop - start)
        for i in range(stop - 1, start - 1, -1):
            ret = torch.where((cols <= i) & (depth > i), rewards[:, i:i + 1] + discounts[:, i:i + 1] * ret, ret)
        blocks.insert(0, ret)
        ret_in = ret[:, 0]
    return torch.cat(blocks, -1) if len(blocks) > 1 else blocks[0]


def _expand(params: Any, rng: torch.Generator | None, tree: Tree, sim: int | Tensor, parent: Tensor, action: Tensor,
            depth: Tensor, recurrent_fn: RecurrentFn, tensor_embedding: bool) -> tuple[Tensor, Tensor]:
    """The expansion of one simulation: one call of ``recurrent_fn`` on the parents'
    embeddings and the writes of the new nodes (node ``sim + 1``, or the existing child
    where ``max_depth`` stopped the descent), in place. Returns ``(nodes [B], leaf
    values [B])``."""
    ar = tree.batch_range
    nn = tree.children_index[ar, parent, action]
    nn = torch.where(nn == Tree.UNVISITED, sim + 1, nn)
    emb_store = tree.embeddings
    keys = _leaf_keys(emb_store)
    if tensor_embedding:
        emb = emb_store.get(_EMB_KEY)[ar, parent]
    else:
        emb = TensorDict({k: emb_store.get(k)[ar, parent] for k in keys}, batch_size=ar.shape)
    step, next_emb = recurrent_fn(params, rng, action, emb)
    leaf_value = step.value.to(tree.node_values.dtype).clone(memory_format=torch.contiguous_format)
    tree.children_prior_logits[ar, nn] = step.prior_logits
    tree.raw_values[ar, nn] = leaf_value
    tree.node_values[ar, nn] = leaf_value
    tree.node_visits[ar, nn] = tree.node_visits[ar, nn] + 1
    tree.depth[ar, nn] = depth
    new_emb = {_EMB_KEY: next_emb} if tensor_embedding else {k: next_emb.get(k) for k in keys}
    for k, x in new_emb.items():
        emb_store.get(k)[ar, nn] = x
    tree.children_index[ar, parent, action] = nn
    tree.children_rewards[ar, parent, action] = step.reward
    tree.children_discounts[ar, parent, action] = step.discount
    tree.parents[ar, nn] = parent
    tree.action_from_parent[ar, nn] = action
    return nn, leaf_value


def _descend_compacted(tree: Tree, uniform: Tensor | None, carry: tuple, compact: int, cond_from: Callable,
                       level_fn: Callable, unrolled_fn: Callable) -> tuple:
    """The rest of a compiled descent on the (at most ``compact``) trees still descending:
    their rows are gathered into ``[compact]`` tensors (``nonzero_static``; padding rows
    are inactive), descend as deep as they go, and are scattered back."""
    d, node, active, depth, pn, pa = carry
    batch = node.shape[0]
    idx = torch.nonzero_static(active, size=compact, fill_value=batch).squeeze(-1)
    valid = idx < batch
    rows = torch.where(valid, idx, 0)
    sub = dataclasses.replace(tree, batch_range=rows, root_invalid_actions=tree.root_invalid_actions[rows])
    part = (d, node[rows], active[rows] & valid, depth[rows], pn[rows], pa[rows])
    body = level_fn(sub, rows, None if uniform is None else uniform[rows])
    part = _while(cond_from(d.clone()), unrolled_fn(body, UNROLL_SMALL_BATCH), part, True)  # few trees: several levels a call

    def back(full: Tensor, x: Tensor) -> Tensor:  # padding rows write to an extra row, dropped
        return torch.cat([full, full[:1]]).index_put((idx,), x)[:batch]

    return (part[0], *(back(f, x) for f, x in zip(carry[1:], part[1:])))


_COMPILED: dict = {}
_MAX_COMPILED = 32


@contextlib.contextmanager
def gc_paused() -> Any:
    """Python's cyclic garbage collector off for the block (restored after, also on an
    error). A search makes many short-lived Python objects per simulation; each batch
    of them can trigger a gen-2 collection that walks every object of the process,
    including the large heap ``torch.compile`` leaves (17% of a compiled search's time
    in a profile, benchmarks/README.md). Reference counting still frees everything a
    search makes; only cycles wait until the collector runs again."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# inductor options of the search's graphs (a user's ``options`` override them): a
# descent level is ~100 pointwise nodes, so with inductor's default (64 nodes per fused
# group) every unrolled level became its own loop nest, passing ~13 realized [B] buffers
# (one allocation each per call) to the next; 1024 fuses the levels into one loop nest.
# No size/alignment asserts: the graphs' inputs are the search's own tree arrays (shapes
# fixed by the key), and the wrapper checked every input of every subgraph call (~67
# Python calls per simulation at B=64)
SEARCH_INDUCTOR_OPTIONS = {"max_fusion_size": 1024, "size_asserts": False, "alignment_asserts": False}


def compile_options(compile: bool | str | dict) -> dict:
    """``torch.compile`` keywords for :func:`search`'s ``compile=``: True is inductor,
    a string a backend name (``"eager"``, ``"aot_eager"``, ``"inductor"``), a dict the
    keywords themselves (``fullgraph=True`` and ``dynamic=False`` are always set).
    Inductor gets :data:`SEARCH_INDUCTOR_OPTIONS` under the dict's own ``options``.
    ``"native"`` and a dict's ``"native"`` key (the native tree loops, see :func:`search`)
    are passed through: ``{"native": True}`` alone has no ``torch.compile`` keywords."""
    if compile is True or compile == "inductor":
        return {"backend": "inductor", "options": dict(SEARCH_INDUCTOR_OPTIONS)}
    if compile == "native":
        return {"native": True}
    if isinstance(compile, str):
        return {"backend": compile}
    if isinstance(compile, dict):
        bad = {"fullgraph", "dynamic"} & set(compile)
        if bad:
            raise ValueError(f"search: compile= sets fullgraph=True and dynamic=False itself; remove {sorted(bad)}")
        out = dict(compile)
        if out.get("native") and set(out) == {"native"}:
            return out
        if out.get("backend", "inductor") == "inductor" and "mode" not in out:  # torch.compile: mode or options
            out["options"] = {**SEARCH_INDUCTOR_OPTIONS, **out.get("options", {})}
        return out
    raise TypeError(f"search: compile must be a bool, a backend name or a dict of torch.compile keywords, "
                    f"got {type(compile).__name__}")


def compiled_per_key(fn: Callable, key: tuple, options: dict) -> Callable:
    """``fn`` compiled with ``fullgraph=True, dynamic=False`` and ``options`` for one
    ``key`` (shapes, depth, options), cached (the oldest of :data:`_MAX_COMPILED` dropped).
    Each key gets its own copy of ``fn``'s code object, so dynamo's per-code cache (and
    recompile limit) holds one entry per copy: the batch sizes and depths a program uses
    do not evict each other."""
    key = (fn.__name__, *key)
    compiled = _COMPILED.get(key)
    if compiled is None:
        if len(_COMPILED) >= _MAX_COMPILED:
            _COMPILED.pop(next(iter(_COMPILED)))
        code = fn.__code__.replace(co_name=f"{fn.__name__}_{abs(hash(key)) % 10**8}")
        f = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
        f.__kwdefaults__ = fn.__kwdefaults__
        compiled = _COMPILED[key] = torch.compile(f, fullgraph=True, dynamic=False, **options)
    return compiled


def compiled_simulation(options: dict, key: tuple) -> Callable:
    """:func:`simulate_once` compiled for one ``key`` (see :func:`compiled_per_key`)."""
    return compiled_per_key(simulate_once, key, options)


# the tree arrays a simulation writes (in place; the tests check their storage)
_WRITTEN = ("node_visits", "raw_values", "node_values", "parents", "action_from_parent", "depth", "children_index",
            "children_prior_logits", "children_visits", "children_rewards", "children_discounts", "children_values")


# levels per iteration of the compiled descent and backup loops: each iteration is a call
# of the loop body from inductor's Python wrapper (tens of microseconds), which dominates
# small batches; at large batches the kernels dominate and levels past a tree's leaf are
# wasted work
UNROLL_SMALL_BATCH, UNROLL_MAX_BATCH = 4, 256


def descent_unroll(batch: int) -> int:
    """Levels per compiled descent/backup loop iteration for a batch of ``batch`` trees."""
    return UNROLL_SMALL_BATCH if batch <= UNROLL_MAX_BATCH else 1


# compiled descents of COMPACT_MIN_BATCH or more trees continue on the trees still
# descending once at most batch // COMPACT_FRACTION of them are (0: never)
COMPACT_MIN_BATCH, COMPACT_FRACTION = 256, 8


def descent_compact(batch: int, interior_action_selection_fn: Callable) -> int:
    """Capacity of the compacted part of a compiled descent (0: full width to the end).
    Only for the built-in interior selection functions, which index the tree through
    ``tree.batch_range`` (the compacted levels pass a tree whose ``batch_range`` is the
    rows still descending)."""
    from .action_selection import gumbel_muzero_interior_action_selection, muzero_action_selection

    fn = getattr(interior_action_selection_fn, "func", interior_action_selection_fn)
    if batch < COMPACT_MIN_BATCH or COMPACT_FRACTION < 1 or \
            fn not in (gumbel_muzero_interior_action_selection, muzero_action_selection):
        return 0
    return max(1, batch // COMPACT_FRACTION)


# compiled backups of at most this many levels are unrolled instead of a while_loop
BACKUP_UNROLL_MAX = 24

# the compiled search first runs with paths of at most PATH_WIDTH edges (the backup's
# writes cost per path column, used or not) and continues with the full width
# (``max_depth`` edges, a second graph compiled when first needed) once a tree gets deeper
PATH_WIDTH = 24


def path_widths(levels: int) -> tuple[int, ...]:
    """The path widths the compiled search runs with, in order, for ``levels`` edges."""
    return (PATH_WIDTH, levels) if 1 <= PATH_WIDTH < levels else (levels,)


def run_simulations(params: Any, tree: Tree, uniforms: Tensor, first: Tensor, recurrent_fn: RecurrentFn,
                    root_action_selection_fn: Callable, interior_action_selection_fn: Callable, max_depth: int,
                    levels: int, tensor_embedding: bool, unroll: int = 1, compact: int = 0,
                    width: int | None = None, ancestors: Tensor | None = None) -> Tensor:
    """Simulations ``first .. len(uniforms) - 1`` on ``tree`` as one ``while_loop`` (the
    whole search in one graph under ``torch.compile(fullgraph=True)``).

    The loop carries only the simulation counter; the tree
    arrays are tensors the loop body captures and writes in place (``while_loop`` allows
    mutating captured, non-carried tensors in inference graphs: call it under
    ``torch.no_grad()``), so no simulation copies the ``[B, N, A]`` arrays. Returns the
    final counter (it must be used: a ``while_loop`` whose outputs are unused is dropped
    from the graph together with its writes).

    ``width < levels``: paths of at most ``width`` edges (the descent's path arrays and
    the backup's writes are ``[B, width]``); the loop stops early, before the simulation
    that could descend deeper (once a node of depth ``width`` exists), and the caller
    continues at the returned counter with the full width. ``ancestors``: see
    :func:`simulate_once` (``[B, N, width + 1]``)."""
    from torch._higher_order_ops.while_loop import while_loop

    num_simulations = uniforms.shape[0]
    width = levels if width is None else min(width, levels)

    def cond(sim: Tensor) -> Tensor:
        if width < levels:  # a node at depth < width: every descent ends within width edges
            return (sim < num_simulations) & (tree.depth.max() < width)
        return sim < num_simulations

    def body(sim: Tensor) -> tuple:
        uniform = uniforms.index_select(0, sim.reshape(1)).squeeze(0)
        simulate_once(params, None, tree, sim, uniform, recurrent_fn, root_action_selection_fn,
                      interior_action_selection_fn, max_depth, width, tensor_embedding=tensor_embedding,
                      use_while_loop=True, unroll=unroll, compact=compact, ancestors=ancestors)
        return (sim + 1,)

    return while_loop(cond, body, (first,))[0]


def first_ancestors(tree: Tree, width: int, expanded: int = 1) -> Tensor:
    """The ``[B, N, width + 1]`` ancestors array (see :func:`simulate_once`) of a tree
    with ``expanded`` nodes (the root only, or the root and its child node 1: a tree
    after one simulation); rows of nodes not yet expanded are left uninitialized (each
    is written when its node is expanded)."""
    batch, num_nodes = tree.parents.shape
    out = torch.empty((batch, num_nodes, width + 1), dtype=torch.int64, device=tree.parents.device)
    out[:, :expanded] = 0
    if expanded > 1:
        out[:, 1, 1] = 1
    return out


def compiled_search(options: dict, key: tuple) -> Callable:
    """:func:`run_simulations` compiled for one ``key`` (see :func:`compiled_per_key`)."""
    return compiled_per_key(run_simulations, key, options)


def search(params: Any, rng: torch.Generator | None, root: RootFnOutput, recurrent_fn: RecurrentFn,
           root_action_selection_fn: Callable, interior_action_selection_fn: Callable, num_simulations: int,
           max_depth: int | None = None, invalid_actions: Tensor | None = None,
           extra_data: TensorDictBase | None = None, loop_fn: Callable = fori_loop, *,
           compile: bool | str | dict = False) -> Tree:
    """Runs ``num_simulations`` simulations on ``B`` trees and returns the :class:`Tree`.

    Args mirror mctx's ``search``: ``params`` is passed to ``recurrent_fn(params, rng,
    action [B], embedding) -> (RecurrentFnOutput, next_embedding)``; ``rng`` is a
    ``torch.Generator`` (None: torch's global one); ``invalid_actions`` a ``[B, A]``
    mask (True/1: invalid) applied at the roots; ``max_depth`` the most edges from a
    root to a leaf (default: ``num_simulations``); ``loop_fn(lower, upper, body,
    tree)`` runs the simulations (default: a Python loop).

    ``compile``: run the simulations compiled with ``torch.compile(fullgraph=True,
    dynamic=False)`` (True: inductor; or a backend name, or a dict of ``torch.compile``
    keywords, see :func:`compile_options`), after one eager call of the recurrent
    function at the roots (with each root's first valid action) that checks its
    outputs. The simulations run as one graph: an outer
    ``while_loop`` over the simulations, with the ``while_loop`` descent and backup
    inside, so the depth follows the tree without recompiling. Paths are recorded
    ``PATH_WIDTH`` (24) edges wide while every node is shallower; a search whose trees
    get deeper continues in a second, full-width graph (compiled when first needed). The outer loop carries
    only the simulation counter and writes the tree arrays in place (an inference graph:
    the compiled simulations run under ``torch.no_grad()``, so the tree carries no
    autograd history), so no simulation copies the ``[B, N, A]`` arrays. A custom
    ``loop_fn`` runs the first simulation eagerly (it checks the recurrent function)
    and one in-place graph per later simulation instead. From ``COMPACT_MIN_BATCH`` (256) trees on, with
    the built-in selection functions, a descent continues on only the trees still
    descending once at most ``B // COMPACT_FRACTION`` (8) of them are (the deepest of many
    trees is several times their mean depth). One graph serves every search with the same
    shapes (the first search of a shape pays the compile). Results equal the eager
    search's. Under compile the recurrent function gets ``rng=None`` (a
    ``torch.Generator`` cannot enter a graph) and must itself be traceable. Python's
    garbage collector is paused during the search (:func:`gc_paused`).
    Inductor's ``cpp_wrapper`` option (``compile={"backend": "inductor", "options":
    {"cpp_wrapper": True}}``) runs the loops in C++ instead of inductor's Python wrapper
    and computes the same tree (each compiled loop runs its body at least once, see
    :func:`_while`, around a torch 2.13 bug of that wrapper).

    Native tree loops (:mod:`~steersman.planning.native`): ``compile="native"`` runs the
    descent, the expansion writes and the backup as C loops over the trees (built with the
    system C compiler on first use and cached), with one eager call of the recurrent
    function per simulation between them (no ``torch.compile``, no compile time; the
    recurrent function gets ``rng`` as in the eager search and runs under
    ``torch.inference_mode``: the tree carries no autograd history). For CPU float32 trees with the
    built-in selection functions (Gumbel MuZero's with
    ``qtransform_completed_by_mix_value``, PUCT with ``qtransform_by_parent_and_siblings``,
    as the policies bind them) and the default ``loop_fn``; the tree is the eager search's,
    values included, bit for bit. ``compile={"native": True, <torch.compile keywords>}``
    also compiles the recurrent function's call (one graph per simulation).
    ``compile=True`` (or ``"inductor"``) takes the native loops wherever they apply (they
    were faster at every batch measured, 1 to 1024, benchmarks/README.md) and the graph
    above elsewhere; ``compile={"native": False}`` asks for the graph. Where the native
    loops were asked for but cannot run (another selection function, another device or
    dtype, a custom ``loop_fn``, no C compiler), a warning says why and the graph runs.

    The ``[num_simulations, B, A]`` uniforms for the action selection are drawn from
    ``rng`` up front. Bad inputs raise before any simulation; the recurrent
    function's output is checked on its first call (eager: the first simulation, or
    under ``compile`` the check call above; native: the first simulation).
    """
    check_root(root, num_simulations, invalid_actions, max_depth)
    options = compile_options(compile) if compile is not False else None
    if compile is True or compile == "inductor":
        options["native"] = "auto"
    with gc_paused():
        return _search(params, rng, root, recurrent_fn, root_action_selection_fn, interior_action_selection_fn,
                       num_simulations, max_depth, invalid_actions, extra_data, loop_fn, options)


def _search(params: Any, rng: torch.Generator | None, root: RootFnOutput, recurrent_fn: RecurrentFn,
            root_action_selection_fn: Callable, interior_action_selection_fn: Callable, num_simulations: int,
            max_depth: int | None, invalid_actions: Tensor | None, extra_data: TensorDictBase | None,
            loop_fn: Callable, options: dict | None) -> Tree:
    """:func:`search` after its input checks."""
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
    uniforms = torch.rand((num_simulations, batch, num_actions), generator=rng, dtype=logits.dtype,
                          device=logits.device)
    compiling = torch.compiler.is_compiling()

    def checked_fn(p: Any, g: Any, a: Tensor, e: Any) -> tuple[RecurrentFnOutput, Any]:
        out = recurrent_fn(p, g, a, e)
        _check_step(out, emb, batch, num_actions)
        return out

    native = options.pop("native", None) if options is not None else None
    if native and not compiling and num_simulations > 1 and \
            _run_native(native, options, params, rng, tree, uniforms, recurrent_fn, checked_fn,
                        root_action_selection_fn, interior_action_selection_fn, max_depth, tensor_embedding,
                        loop_fn):
        return tree
    if native is True and not options:  # compile="native" where the native loops cannot run
        options = compile_options(True)

    step = None
    if options is not None and not compiling and num_simulations > 1:
        levels = min(max_depth, num_simulations)
        unroll = descent_unroll(batch)
        compact = descent_compact(batch, interior_action_selection_fn)
        key = (tuple(sorted((k, repr(v)) for k, v in options.items())), levels, max_depth, tensor_embedding, unroll,
               compact,
               batch, num_actions, num_simulations, logits.dtype, value.dtype, str(logits.device),
               tuple((k, tuple(x.shape[2:]), x.dtype) for k, x in tree.embeddings.items(True, True)))
        step = compiled_simulation(options, key)
        sims = torch.arange(num_simulations, device=logits.device)

    if step is not None and loop_fn is fori_loop:
        # the whole search as one graph (no per-simulation call overhead), after one
        # eager call that checks the recurrent function (each root's first valid action)
        checked_fn(params, rng, (~tree.root_invalid_actions).int().argmax(-1), emb)
        out = sims[0]
        for i, width in enumerate(path_widths(levels)):  # narrow paths while the trees are shallow, then full
            run = compiled_search(options, (*key, width))
            with torch.no_grad():  # the in-place loop is an inference graph
                out = run(params, tree, uniforms, out, recurrent_fn, root_action_selection_fn,
                          interior_action_selection_fn, max_depth, levels, tensor_embedding, unroll, compact, width,
                          None if i or compact else first_ancestors(tree, min(width, levels)))
            if int(out) == num_simulations:
                break
        if int(out) != num_simulations:  # the loop's output must be used (see run_simulations)
            raise RuntimeError(f"search: the compiled loop ran to simulation {int(out)} of {num_simulations}")
        return tree

    def body(sim: int, tree: Tree) -> Tree:
        if sim == 0 or step is None:
            simulate_once(params, rng, tree, sim, uniforms[sim], checked_fn if sim == 0 else recurrent_fn,
                          root_action_selection_fn, interior_action_selection_fn, max_depth,
                          min(max_depth, sim + 1), early_exit=not compiling, tensor_embedding=tensor_embedding)
        else:
            step(params, None, tree, sims[sim], uniforms[sim], recurrent_fn, root_action_selection_fn,
                 interior_action_selection_fn, max_depth, levels, tensor_embedding=tensor_embedding,
                 use_while_loop=True, unroll=unroll, compact=compact)
        return tree

    return loop_fn(0, num_simulations, body, tree)


def _run_native(native: bool | str, options: dict, params: Any, rng: torch.Generator | None, tree: Tree,
                uniforms: Tensor, recurrent_fn: RecurrentFn, checked_fn: Callable, root_fn: Callable,
                interior_fn: Callable, max_depth: int, tensor_embedding: bool, loop_fn: Callable) -> bool:
    """The search's simulations with the native tree loops (``native``: True to force them,
    ``"auto"`` where they are the faster path), the model compiled with ``options``.
    Returns False (the caller runs the inductor path) where they cannot run, with a
    warning saying why if they were forced or failed to build."""
    from . import native as nat

    selection = nat.native_selection(root_fn, interior_fn)
    why = nat.supported(tree, selection) or (None if loop_fn is fori_loop else "a custom loop_fn")
    if native == "auto" and why is not None:
        return False
    if why is None:
        try:
            lib = nat.load()
        except nat.NativeUnavailable as err:
            why = str(err)
    if why is not None:
        warnings.warn(f"search: native tree loops not used ({why}); running the inductor path", stacklevel=4)
        return False
    model = None
    if native is True and options:  # compile={"native": True, <torch.compile keywords>}: the model compiled
        key = (tuple(sorted((k, repr(v)) for k, v in options.items())), tree.batch_size, tree.num_actions,
               tensor_embedding, tuple((k, tuple(x.shape[2:]), x.dtype) for k, x in tree.embeddings.items(True, True)))
        model = compiled_per_key(nat.model_step, key, options)
    # inference mode: the model's outputs are only copied into the tree (~10% less per-op overhead
    # than no_grad for a small eager model); a compiled model runs under no_grad as the graph does
    with torch.inference_mode() if model is None else torch.no_grad():
        nat.run_native(lib, tree, selection, params, rng, uniforms, recurrent_fn, checked_fn, model, max_depth,
                       tensor_embedding)
    return True
