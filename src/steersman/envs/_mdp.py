"""``step_mdp`` and seed helpers: what ``EnvBase`` needs from the env utilities.

``step_mdp(td)`` turns a transition (root = state where the action was taken,
``"next"`` = its result) into the input of the following step: the content of
``"next"`` moves to the root. This module imports nothing else of ``steersman.envs``
(``common`` imports it, ``utils`` re-exports it), so the dependency is one-way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from torch import Tensor

from steersman.tensordict import TensorDict, TensorDictBase
from steersman.tensordict._utils import NestedKey, unravel_key

__all__ = ["step_mdp", "next_seed", "DEFAULT_DONE_KEYS"]

#: the done entries of a transition (``done = terminated | truncated``).
DEFAULT_DONE_KEYS: tuple[str, ...] = ("done", "terminated", "truncated")

_MASK64 = (1 << 64) - 1
_KEEP = object()


def _splitmix64(x: int) -> int:
    """One step of SplitMix64 on a Python int (a 64-bit bijective mixer)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def next_seed(seed: int) -> int:
    """The seed that follows ``seed``: a deterministic hash, in ``[0, 2**63)``.

    ``env.set_seed(seed)`` returns ``next_seed(seed)`` so that chained calls
    (``seed = env.set_seed(seed)``) give every env its own reproducible seed.

    Example:
        >>> from steersman.envs.utils import next_seed
        >>> next_seed(0) == next_seed(0), next_seed(0) != next_seed(1)
        (True, True)
        >>> 0 <= next_seed(123) < 2**63
        True
    """
    return _splitmix64(int(seed) & _MASK64) >> 1


def _as_key_list(keys: Any) -> list[NestedKey]:
    if keys is None:
        return []
    if isinstance(keys, (str, tuple)):
        return [unravel_key(keys)]
    return [unravel_key(k) for k in keys]


def _step_mdp_fast(td: TensorDict, excl_root: frozenset, excl_next: frozenset) -> TensorDict:
    """``step_mdp`` on a plain TensorDict with string keys only (the env hot path).

    ``excl_root``: root keys dropped (always contains ``"next"``); ``excl_next``: keys of
    ``"next"`` dropped. Tensors are shared, not copied.
    """
    root = td.entries
    try:
        nxt = root["next"]
    except KeyError:
        raise KeyError(
            "step_mdp: the tensordict has no 'next' entry; call env.step(td) first "
            f"(keys: {sorted(root)})"
        ) from None
    out = {k: v for k, v in root.items() if k not in excl_root}
    if type(nxt) is TensorDict:
        items = nxt.entries.items()
    else:
        items = ((k, nxt.get(k)) for k in nxt.keys())
    for k, v in items:
        if k in excl_next:
            continue
        cur = out.get(k)
        if cur is not None and isinstance(cur, TensorDictBase) and isinstance(v, TensorDictBase):
            v = cur.copy().update(v)
        out[k] = v
    return TensorDict.from_trusted(out, td.batch_size, td.device)


def exclusion_tree(keys: Iterable[NestedKey]) -> dict:
    """``{"next": None, "agents": {"action": None}}``: ``None`` drops an entry, a dict drops
    entries inside it (what :func:`_merged` reads)."""
    tree: dict = {}
    for key in keys:
        key = (key,) if type(key) is str else tuple(key)
        node = tree
        for part in key[:-1]:
            node = node.setdefault(part, {})
            if node is None:  # a parent is dropped already
                break
        else:
            node[key[-1]] = None
    return tree


def _merged(out: dict, nxt: TensorDict, tree: dict) -> dict | None:
    """Writes ``nxt``'s entries into ``out`` but those ``tree`` excludes; sub-TensorDicts
    that are in both, or that lose entries, are rebuilt. ``None`` when one of those is not
    a plain TensorDict. ``_merged({}, td, tree)`` is ``td``'s entries without the tree's."""
    for k, v in nxt.entries.items():
        sub = tree.get(k, _KEEP)
        if sub is None:
            continue
        if isinstance(v, TensorDictBase):
            cur = out.get(k)
            if isinstance(cur, TensorDictBase):
                entries, like = dict(cur.entries), cur
            elif sub is not _KEEP:
                entries, like = {}, v
            else:  # nothing to merge or drop inside: shared as it is
                out[k] = v
                continue
            if type(v) is not TensorDict or type(like) is not TensorDict \
                    or _merged(entries, v, {} if sub is _KEEP else sub) is None:
                return None
            v = TensorDict.from_trusted(entries, like.batch_size, like.device)
        out[k] = v
    return out


def _step_mdp_nested(td: TensorDict, root_tree: dict, next_tree: dict) -> TensorDict | None:
    """:func:`step_mdp` (``keep_other``) on a plain TensorDict whose excluded keys may be
    nested (``("agents", "action")``): the same entries (tensors shared, nested
    TensorDicts rebuilt), ~10x cheaper than the generic path. ``None`` when an entry on the
    way is not a plain TensorDict (the caller then takes the generic path)."""
    nxt = td.entries.get("next")
    if type(nxt) is not TensorDict:
        return None
    out = _merged({}, td, root_tree)
    if out is None or _merged(out, nxt, next_tree) is None:
        return None
    return TensorDict.from_trusted(out, td.batch_size, td.device)


def step_mdp(
    tensordict: TensorDictBase,
    next_tensordict: TensorDictBase | None = None,
    keep_other: bool = True,
    exclude_reward: bool = True,
    exclude_done: bool = False,
    exclude_action: bool = True,
    reward_keys: NestedKey | Sequence[NestedKey] = "reward",
    done_keys: NestedKey | Sequence[NestedKey] | None = None,
    action_keys: NestedKey | Sequence[NestedKey] = "action",
) -> TensorDictBase:
    """Moves the ``"next"`` entries of a transition to the root: the next step's input.

    Args:
        tensordict: a transition (``env.step`` output) with a ``"next"`` entry.
        next_tensordict: if given, the result is written into it (its entries are
            replaced) and it is returned.
        keep_other: keep the root entries that are not in ``"next"`` (e.g. a recurrent
            policy's hidden state); the action, reward and ``"_reset"`` are never kept
            unless asked otherwise below.
        exclude_reward: drop the reward entries (root and ``"next"``).
        exclude_done: drop the done entries (root and ``"next"``).
        exclude_action: drop the action entries of the root.
        reward_keys / done_keys / action_keys: the key, or a list of keys, of each kind
            (a tuple of strings is one nested key). ``done_keys`` defaults to
            ``["done", "terminated", "truncated"]``.

    Returns: a new TensorDict (tensors are shared, not copied) of the same batch size.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs import step_mdp
        >>> td = TensorDict({
        ...     "observation": torch.zeros(3, 4), "action": torch.ones(3, 1), "hidden": torch.ones(3, 2),
        ...     "next": {"observation": torch.ones(3, 4), "reward": torch.ones(3, 1),
        ...              "done": torch.zeros(3, 1, dtype=torch.bool)},
        ... }, batch_size=[3])
        >>> out = step_mdp(td)
        >>> sorted(out.keys())
        ['done', 'hidden', 'observation']
        >>> bool((out["observation"] == 1).all())
        True
        >>> sorted(step_mdp(td, keep_other=False, exclude_done=True).keys())
        ['observation']
    """
    rkeys = _as_key_list(reward_keys)
    dkeys = _as_key_list(list(DEFAULT_DONE_KEYS) if done_keys is None else done_keys)
    akeys = _as_key_list(action_keys)
    excl_next: list[NestedKey] = []
    excl_root: list[NestedKey] = ["next", "_reset"]
    if exclude_reward:
        excl_next += rkeys
        excl_root += rkeys
    if exclude_done:
        excl_next += dkeys
        excl_root += dkeys
    if exclude_action:
        excl_root += akeys
    if (
        type(tensordict) is TensorDict
        and keep_other
        and all(type(k) is str for k in excl_root)
        and all(type(k) is str for k in excl_next)
    ):
        out = _step_mdp_fast(tensordict, frozenset(excl_root), frozenset(excl_next))
    else:
        out = _step_mdp_generic(tensordict, keep_other, excl_root, excl_next)
    if next_tensordict is not None:
        next_tensordict.update(out)
        return next_tensordict
    return out


def _step_mdp_generic(
    td: TensorDictBase, keep_other: bool, excl_root: list, excl_next: list
) -> TensorDictBase:
    if "next" not in td.keys():
        raise KeyError("step_mdp: the tensordict has no 'next' entry; call env.step(td) first")
    nxt = td.get("next")
    present_next = set(nxt.keys(include_nested=True))
    nxt = nxt.exclude(*[k for k in excl_next if k in present_next])
    if keep_other:
        present = set(td.keys(include_nested=True))
        out = td.exclude(*[k for k in excl_root if k in present])
    else:
        out = td.empty()
    out.update(nxt)
    return out


def _any_done(td: TensorDictBase, keys: Iterable[NestedKey], batch_dims: int) -> Tensor | None:
    """OR of the entries ``keys`` (those present), reduced to shape ``[*batch]``."""
    out = None
    for key in keys:
        v = td.get(key, None)
        if v is None:
            continue
        if v.ndim > batch_dims:
            v = v.reshape(*v.shape[:batch_dims], -1).any(-1)
        out = v if out is None else out | v
    return out
