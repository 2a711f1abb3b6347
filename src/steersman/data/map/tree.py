"""``MCTSForest`` and ``Tree`` (TorchRL's ``torchrl.data.map.tree``): a store of rollouts
that branch from shared prefixes, and the trees rebuilt from it.

The forest keeps two maps (:class:`~steersman.data.map.TensorDictMap`):

* ``data_map``: ``(observation, action)`` -> the whole step (observation, action,
  ``"next"`` ...). Equal (observation, action) pairs are stored once.
* ``node_map``: ``observation`` -> the ``data_map`` indices (``"_index"``) and hashes
  (``"_hash"``) of every stored step that leaves from it, and ``"count"``, how many steps
  leaving from it were written.

:meth:`MCTSForest.get_tree` walks them from a root observation: a step's
``("next", observation)`` is the observation of the next vertex, and a vertex branches
where one observation has several stored actions. Each :class:`Tree` vertex holds the
``rollout`` (a TensorDict ``[L]`` of steps) that leads to it from its parent, its
``node_data`` (the observation entries where the rollout ends), and its ``subtree``
(the children, a sequence of ``Tree``). A *compact* tree (the default) merges chains of
single-child vertices into one vertex with a longer rollout.

Differences from TorchRL, on purpose:

* ``Tree`` is a plain Python object, not a ``TensorClass``; ``subtree`` is a sequence of
  ``Tree`` (``len``, indexing, iteration, ``unbind(0)``; an attribute read on it gathers
  that attribute of every child, stacking tensors).
* ``plot`` draws with matplotlib (``backend="matplotlib"``, the default) or returns the
  ``networkx`` graph (``backend="networkx"``); TorchRL's plotly figures are not built.
* ``vertices(key_type="hash")`` keys the vertices by their hash, as documented (TorchRL's
  keys are node ids there); ``is_terminal`` is the ``done`` flag of the last step of the
  vertex's rollout (what TorchRL computes; its docstring says "no children", which is
  ``num_children == 0``).
* Rollouts of any batch shape are accepted: every step is stored on its own.
* The default maps hash the exact bytes of the entries (:class:`SipHash`) whatever their
  width, so distinct observations never share a vertex by design (TorchRL switches to
  a lossy random projection above 16 features); pass your own ``data_map``/``node_map``
  for another hash.
* Stored steps that form a cycle (an observation reachable from itself) make
  ``get_tree`` raise a ``ValueError`` instead of looping forever.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from steersman.tensordict import TensorDict, TensorDictBase

from ..replay_buffers.storages import LazyTensorStorage, ListStorage
from .hash import SipHash
from .query import QueryModule
from .tdstorage import TensorDictMap

__all__ = ["MCTSForest", "Tree"]

NestedKey = Any


def _key_list(value: Any, name: str) -> list[NestedKey]:
    if isinstance(value, (str, tuple)):
        return [value]
    if isinstance(value, list) and all(isinstance(k, (str, tuple)) for k in value):
        return list(value)
    raise ValueError(f"MCTSForest: {name} must be a key or a list of keys (str or tuple of str), got {value!r}")


class Subtrees:
    """The children of a :class:`Tree` vertex, in the order their first step was stored.

    ``subtree[i]`` is a ``Tree``, ``len(subtree)`` the number of children; reading any
    other attribute (``subtree.node_id``, ``subtree.count``, ``subtree.rollout``) gathers it
    from every child: tensors of equal shape are stacked, other values come as a list."""

    def __init__(self, trees: Sequence[Tree]) -> None:
        self._trees = list(trees)

    def __len__(self) -> int:
        return len(self._trees)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return Subtrees(self._trees[index])
        if isinstance(index, Tensor):
            index = int(index)
        return self._trees[index]

    def __iter__(self) -> Iterator[Tree]:
        return iter(self._trees)

    def unbind(self, dim: int = 0) -> tuple[Tree, ...]:
        if dim != 0:
            raise ValueError(f"Subtrees.unbind: only dim 0 exists, got {dim}")
        return tuple(self._trees)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        values = [getattr(t, name) for t in self._trees]
        if values and all(isinstance(v, Tensor) for v in values) and len({v.shape for v in values}) == 1:
            return torch.stack(values)
        return values

    def __repr__(self) -> str:
        return f"Subtrees(node_ids={[t.node_id for t in self._trees]})"


class Tree:
    """A vertex of a tree rebuilt by :meth:`MCTSForest.get_tree`, and the tree below it.

    Args:
        count (int or Tensor): visits of this vertex (0 when rebuilt; for the user's
            search statistics). ``visits`` is an alias.
        wins (int or Tensor): accumulated value of this vertex (0 when rebuilt).
        index (Tensor, optional): the ``data_map`` indices of the steps leaving this
            vertex's observation (its branches), or ``None`` at a leaf.
        hash (int, optional): the hash of the (observation, action) step that branched
            into this vertex (``None`` at a root).
        node_id (int, optional): the vertex's id in its tree (the root is 0, then
            breadth-first).
        rollout (TensorDict, optional): the steps ``[L]`` from the parent's observation
            to this vertex's (``None`` at a root without a single-branch prefix).
        node_data (TensorDict, optional): the observation entries of this vertex.
        subtree (sequence of Tree, optional): the children.
        specs (Composite, optional): kept for the user (TorchRL's field).

    Attributes computed from these: ``num_children``, ``is_terminal``, ``visits``,
    ``parent``, ``selected_actions``, ``prev_action``, ``branching_action``,
    ``node_observation``, ``node_observations``.

    Examples:
        >>> from steersman.data import MCTSForest
        >>> forest = MCTSForest()
        >>> r0 = TensorDict({"observation": torch.tensor([0, 1, 2]), "action": torch.tensor([1, 1, 1]),
        ...                  "next": {"observation": torch.tensor([1, 2, 3])}}, [3])
        >>> r1 = TensorDict({"observation": torch.tensor([0, 1]), "action": torch.tensor([1, 5]),
        ...                  "next": {"observation": torch.tensor([1, 7])}}, [2])
        >>> forest.extend(r0); forest.extend(r1)
        >>> tree = forest.get_tree(TensorDict({"observation": torch.tensor(0)}, []))
        >>> tree.rollout["action"], tree.num_children, list(tree.valid_paths())
        (tensor([1]), 2, [(0,), (1,)])
        >>> tree.subtree[0].rollout["next", "observation"], tree.subtree[1].node_observation
        (tensor([2, 3]), tensor(7))
        >>> torch.equal(tree.rollout_from_path((0,))["action"], r0["action"])
        True
    """

    def __init__(self, count: int | Tensor | None = None, wins: int | Tensor | None = None,
                 index: Tensor | None = None, hash: int | None = None, node_id: int | None = None,
                 rollout: TensorDictBase | None = None, node_data: TensorDictBase | None = None,
                 subtree: Sequence[Tree] | None = None, _parent: Any = None, specs: Any = None, *,
                 batch_size: Any = None, device: Any = None, names: Any = None) -> None:
        if batch_size is not None and tuple(torch.Size(batch_size)) != ():
            raise ValueError(f"Tree: one vertex per object (batch_size [] ), got batch_size {list(batch_size)}")
        self.count = torch.as_tensor(0 if count is None else count, dtype=torch.int32)
        self.wins = torch.as_tensor(0.0 if wins is None else wins, dtype=torch.float32)
        self.index = index
        self.hash = hash
        self.node_id = node_id
        self.rollout = rollout
        self.node_data = node_data
        self.subtree = subtree if subtree is None or isinstance(subtree, Subtrees) else Subtrees(subtree)
        self._parent = _parent
        self.specs = specs
        self.device = device
        self._action_keys: list[NestedKey] = ["action"]
        self._done_keys: list[NestedKey] = ["done", "terminated", "truncated"]

    batch_size = torch.Size([])

    @classmethod
    def make_node(cls, data: TensorDictBase, *, device: Any = None, batch_size: Any = None,
                  specs: Any = None) -> Tree:
        """A new vertex (no rollout, no children) whose ``node_data`` is ``data``."""
        return cls(node_data=data, device=device, batch_size=batch_size, specs=specs)

    # ------------------------------------------------------------- fields computed from the data
    @property
    def visits(self) -> Tensor:
        """Alias of ``count``."""
        return self.count

    @visits.setter
    def visits(self, count: int | Tensor) -> None:
        self.count = torch.as_tensor(count, dtype=torch.int32)

    @property
    def num_children(self) -> int:
        """The number of children (the length of ``subtree``; 0 at a leaf)."""
        return len(self.subtree) if self.subtree is not None else 0

    @property
    def is_terminal(self) -> bool | Tensor:
        """Whether the rollout into this vertex ended the episode: the ``("next", done)``
        flag of its last step (the first of the forest's done keys the step holds);
        ``False`` without a rollout (a root) or without a done entry. A vertex without
        children is ``num_children == 0``."""
        if self.rollout is None:
            return False
        for key in self._done_keys:
            full = ("next", *key) if isinstance(key, tuple) else ("next", key)
            flag = self.rollout.get(full, None)
            if flag is not None:
                return flag[-1].reshape(-1)[0] if flag[-1].numel() == 1 else flag[-1]
        return False

    @property
    def parent(self) -> Tree | list[Tree] | None:
        """The parent vertex (a list when several vertices lead here), or ``None`` at a
        root or when the parent no longer exists."""
        if self._parent is None:
            return None
        if isinstance(self._parent, list):
            parents = [p() for p in self._parent]
            parents = [p for p in parents if p is not None]
            return parents if len(parents) > 1 else (parents[0] if parents else None)
        return self._parent()

    def _action(self, step: TensorDictBase) -> Tensor | TensorDictBase:
        if len(self._action_keys) == 1:
            return step.get(self._action_keys[0])
        return step.select(*self._action_keys)

    @property
    def branching_action(self) -> Tensor | TensorDictBase | None:
        """The action of the first step of the rollout into this vertex (the branch taken
        at the parent); ``None`` without a rollout."""
        return None if self.rollout is None else self._action(self.rollout[0])

    @property
    def prev_action(self) -> Tensor | TensorDictBase | None:
        """The action of the last step of the rollout into this vertex (equal to
        ``branching_action`` when the rollout has one step); ``None`` without a rollout."""
        return None if self.rollout is None else self._action(self.rollout[-1])

    @property
    def selected_actions(self) -> Tensor | TensorDictBase | None:
        """The branching action of every child, stacked ``[num_children, ...]``
        (``None`` at a leaf)."""
        if not self.num_children:
            return None
        actions = [child.branching_action for child in self.subtree]
        if all(isinstance(a, Tensor) for a in actions):
            return torch.stack(actions)
        return torch.stack(actions) if all(isinstance(a, TensorDictBase) for a in actions) else actions

    @property
    def node_observations(self) -> TensorDictBase | None:
        """The vertex's observation entries as a TensorDict."""
        return self.node_data

    @property
    def node_observation(self) -> Tensor | TensorDictBase | None:
        """The vertex's observation: a tensor when there is one observation entry, else the
        TensorDict of them."""
        if self.node_data is None:
            return None
        keys = list(self.node_data.keys(True, True))
        return self.node_data.get(keys[0]) if len(keys) == 1 else self.node_data

    def fully_expanded(self, env: Any) -> bool:
        """Whether this vertex has one child per action of ``env``'s discrete action spec."""
        spec = env.action_spec
        n = getattr(spec, "n", None)
        if n is None:
            n = getattr(getattr(spec, "space", None), "n", None)
        if n is None:
            raise ValueError(f"Tree.fully_expanded: {type(env).__name__} has no discrete action spec "
                             f"({type(spec).__name__}); the number of actions is unknown")
        return self.num_children == int(n)

    # ------------------------------------------------------------- traversal
    def _bfs(self) -> Iterator[tuple[Tree, tuple[int, ...]]]:
        queue: deque[tuple[Tree, tuple[int, ...]]] = deque([(self, ())])
        while queue:
            tree, path = queue.popleft()
            yield tree, path
            for i in range(tree.num_children):
                queue.append((tree.subtree[i], (*path, i)))

    def get_vertex_by_id(self, id: int) -> Tree:
        """The vertex with ``node_id == id`` (breadth-first); ValueError if none."""
        for tree, _ in self._bfs():
            if tree.node_id == id:
                return tree
        raise ValueError(f"Tree.get_vertex_by_id: no vertex has node_id {id}")

    def get_vertex_by_hash(self, hash: int) -> Tree:
        """The vertex with the given ``hash`` (breadth-first); ValueError if none."""
        hash = int(hash)
        for tree, _ in self._bfs():
            if tree.hash is not None and int(tree.hash) == hash:
                return tree
        raise ValueError(f"Tree.get_vertex_by_hash: no vertex has hash {hash}")

    def __contains__(self, other: Tree) -> bool:
        return any(v.hash == other.hash for v in self.vertices().values())

    def vertices(self, *, key_type: Literal["id", "hash", "path"] = "hash") -> dict[Any, Tree]:
        """The vertices, keyed by ``node_id`` (``"id"``), ``hash`` (``"hash"``; the root's
        is ``None``) or path from this vertex (``"path"``; a vertex reached along several
        paths appears once per path)."""
        if key_type not in ("id", "hash", "path"):
            raise ValueError(f"Tree.vertices: key_type must be 'hash', 'id' or 'path', got {key_type!r}")
        out: dict[Any, Tree] = {}
        for tree, path in self._bfs():
            key = path if key_type == "path" else (tree.node_id if key_type == "id" else tree.hash)
            out.setdefault(key, tree)
        return out

    def num_vertices(self, *, count_repeat: bool = False) -> int:
        """The number of distinct vertices (``count_repeat``: once per path reaching them)."""
        if count_repeat:
            return sum(1 for _ in self._bfs())
        return len({id(tree) for tree, _ in self._bfs()})

    def edges(self) -> list[tuple[int, int]]:
        """``(parent node_id, child node_id)`` of every edge, breadth-first."""
        return [(tree.node_id, tree.subtree[i].node_id) for tree, _ in self._bfs() for i in range(tree.num_children)]

    def valid_paths(self) -> Iterator[tuple[int, ...]]:
        """Every path (tuple of child indices) from this vertex to a leaf, breadth-first."""
        for tree, path in self._bfs():
            if not tree.num_children:
                yield path

    def max_length(self) -> int:
        """The number of edges of the longest path to a leaf (0 for a lone vertex)."""
        return max(len(p) for p in self.valid_paths())

    def rollout_from_path(self, path: tuple[int, ...]) -> TensorDictBase | None:
        """The rollouts of this vertex and of the vertices along ``path``, concatenated
        along the time dim (``None`` when none of them has a rollout)."""
        rollouts = [self.rollout] if self.rollout is not None else []
        tree = self
        for i in path:
            if not 0 <= i < tree.num_children:
                raise IndexError(f"Tree.rollout_from_path: path {tuple(path)} has index {i} where the vertex has "
                                 f"{tree.num_children} children")
            tree = tree.subtree[i]
            if tree.rollout is not None:
                rollouts.append(tree.rollout)
        return torch.cat(rollouts, -1) if rollouts else None

    # ------------------------------------------------------------- display
    def to_string(self, node_format_fn: Callable[[Tree], Any] = lambda tree: tree.node_data.to_dict()) -> str:
        """One line per vertex below this one (depth first, children in order): its path,
        then ``node_format_fn(vertex)`` (default: its ``node_data`` as a dict), indented by
        its depth minus one. Vertices without a rollout are not listed."""
        lines = []
        stack: list[tuple[Tree, tuple[int, ...]]] = [(self, ())]
        while stack:
            tree, path = stack.pop()
            for i in reversed(range(tree.num_children)):
                stack.append((tree.subtree[i], (*path, i)))
            if tree.rollout is not None:
                lines.append(f"{' ' * max(len(path) - 1, 0)}{path} {node_format_fn(tree)}")
        return "\n".join(lines)

    def to_networkx(self) -> Any:
        """A ``networkx.DiGraph`` of the vertices (by ``node_id``; attributes ``hash``,
        ``count``, ``wins``, ``steps``: the rollout length) and edges."""
        import networkx as nx

        graph = nx.DiGraph()
        for tree, _ in self._bfs():
            graph.add_node(tree.node_id, hash=tree.hash, count=int(tree.count), wins=float(tree.wins),
                           steps=0 if tree.rollout is None else int(tree.rollout.shape[-1]))
        graph.add_edges_from(self.edges())
        return graph

    def plot(self, backend: str = "matplotlib", figure: str = "tree", info: list[str] | None = None,
             make_labels: Callable[[Tree], str] | None = None) -> Any:
        """Draws the tree: ``backend="matplotlib"`` returns a figure (vertices placed by
        depth, leaves spread left to right; labels from ``make_labels(vertex)``, or the
        ``info`` attributes, default the node ids), ``"networkx"`` returns
        :meth:`to_networkx`. ``figure`` must be ``"tree"``."""
        if figure != "tree":
            raise ValueError(f"Tree.plot: figure must be 'tree', got {figure!r}")
        if backend == "networkx":
            return self.to_networkx()
        if backend != "matplotlib":
            raise ValueError(f"Tree.plot: backend must be 'matplotlib' or 'networkx', got {backend!r} "
                             "(TorchRL's plotly figures are not built)")
        import matplotlib.pyplot as plt

        pos: dict[int, tuple[float, float]] = {}
        leaves = [0]

        def place(tree: Tree, depth: int) -> float:
            if tree.node_id in pos:
                return pos[tree.node_id][0]
            if tree.num_children:
                xs = [place(c, depth + 1) for c in tree.subtree]
                x = sum(xs) / len(xs)
            else:
                x = float(leaves[0])
                leaves[0] += 1
            pos[tree.node_id] = (x, -float(depth))
            return x

        place(self, 0)
        fig, ax = plt.subplots()
        for a, b in self.edges():
            ax.plot([pos[a][0], pos[b][0]], [pos[a][1], pos[b][1]], color="gray", zorder=1)
        for tree in self.vertices(key_type="id").values():
            x, y = pos[tree.node_id]
            ax.scatter([x], [y], color="tab:blue", zorder=2)
            if make_labels is not None:
                label = str(make_labels(tree))
            elif info:
                label = ", ".join(f"{k}={getattr(tree, k)}" for k in info)
            else:
                label = str(tree.node_id)
            ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set_axis_off()
        return fig

    def __repr__(self) -> str:
        steps = None if self.rollout is None else int(self.rollout.shape[-1])
        return (f"Tree(node_id={self.node_id}, hash={self.hash}, rollout_steps={steps}, "
                f"num_children={self.num_children}, count={int(self.count)})")


class MCTSForest:
    """Stores rollouts and rebuilds the trees they form from any root observation.

    Keyword Args:
        data_map (TensorDictMap, optional): (observation, action) -> step. Default: made
            at the first :meth:`extend`, keyed by ``observation_keys + action_keys``,
            storing every entry of the steps (except ``excluded_keys``).
        node_map (TensorDictMap, optional): observation -> the ``data_map`` indices
            (``"_index"``) and hashes (``"_hash"``) of the steps leaving it, and
            ``"count"``. Default: made at the first :meth:`extend`.
        max_size (int, optional): capacity of each map (default: the data map's, else
            1000).
        done_keys, reward_keys, observation_keys, action_keys (key or list of keys):
            default ``["done", "terminated", "truncated"]``, ``["reward"]``,
            ``["observation"]``, ``["action"]`` (:meth:`get_keys_from_env` fills the
            ones not given from an env).
        excluded_keys (list of keys, optional): entries not stored (at the root and in
            ``"next"``).
        consolidated (bool, optional): accepted for TorchRL compatibility (the storages
            are in memory).

    Rollouts are TensorDicts ``[*B, T]`` with the observation and action keys and the
    ``"next"`` observations; each step is stored once per distinct (observation, action).

    Examples:
        >>> from steersman.envs import TicTacToeEnv, step_mdp
        >>> env = TicTacToeEnv()
        >>> forest = MCTSForest()
        >>> root = env.reset()
        >>> rollouts = []
        >>> for opening in ([4, 0, 8], [4, 0, 2], [0, 4]):  # two share the prefix (4, 0)
        ...     td, steps = env.reset(), []  # the same empty board each time
        ...     for cell in opening:
        ...         step = env.step(td.set("action", torch.tensor(cell)))
        ...         steps.append(step.clone())
        ...         td = step_mdp(step)
        ...     rollouts.append(torch.stack(steps))
        ...     forest.extend(rollouts[-1])
        >>> len(forest)  # distinct (observation, action) steps
        6
        >>> tree = forest.get_tree(root)
        >>> list(tree.valid_paths()), tree.max_length(), tree.num_vertices()
        ([(1,), (0, 0), (0, 1)], 2, 5)
        >>> tree.subtree[0].rollout["action"]  # the shared prefix, merged into one vertex
        tensor([4, 0])
        >>> torch.equal(tree.rollout_from_path((0, 1))["action"], rollouts[1]["action"])
        True
        >>> full = forest.get_tree(root, compact=False)  # one vertex per step
        >>> list(full.valid_paths())
        [(1, 0), (0, 0, 0), (0, 0, 1)]
    """

    def __init__(self, *, data_map: TensorDictMap | None = None, node_map: TensorDictMap | None = None,
                 max_size: int | None = None, done_keys: list[NestedKey] | None = None,
                 reward_keys: list[NestedKey] | None = None, observation_keys: list[NestedKey] | None = None,
                 action_keys: list[NestedKey] | None = None, excluded_keys: list[NestedKey] | None = None,
                 consolidated: bool | None = None) -> None:
        for name, m in (("data_map", data_map), ("node_map", node_map)):
            if m is not None and not isinstance(m, TensorDictMap):
                raise TypeError(f"MCTSForest: {name} must be a TensorDictMap, got {type(m).__name__}")
        self.data_map = data_map
        self.node_map = node_map
        if max_size is None:
            max_size = data_map.max_size if data_map is not None else (
                node_map.max_size if node_map is not None else None)
        if max_size is not None and (isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1):
            raise ValueError(f"MCTSForest: max_size must be an int >= 1, got {max_size!r}")
        self.max_size = max_size
        self._done_keys = None if done_keys is None else _key_list(done_keys, "done_keys")
        self._reward_keys = None if reward_keys is None else _key_list(reward_keys, "reward_keys")
        self._observation_keys = None if observation_keys is None else _key_list(observation_keys,
                                                                                 "observation_keys")
        self._action_keys = None if action_keys is None else _key_list(action_keys, "action_keys")
        self._excluded_keys = None if excluded_keys is None else _key_list(excluded_keys, "excluded_keys")
        self.consolidated = consolidated

    # ------------------------------------------------------------- keys
    @property
    def done_keys(self) -> list[NestedKey]:
        """The done entries (default ``["done", "terminated", "truncated"]``)."""
        return self._done_keys if self._done_keys is not None else ["done", "terminated", "truncated"]

    @done_keys.setter
    def done_keys(self, value: Any) -> None:
        self._done_keys = _key_list(value, "done_keys")

    @property
    def reward_keys(self) -> list[NestedKey]:
        """The reward entries (default ``["reward"]``)."""
        return self._reward_keys if self._reward_keys is not None else ["reward"]

    @reward_keys.setter
    def reward_keys(self, value: Any) -> None:
        self._reward_keys = _key_list(value, "reward_keys")

    @property
    def action_keys(self) -> list[NestedKey]:
        """The action entries (default ``["action"]``); with the observation keys they
        identify a step in ``data_map``."""
        return self._action_keys if self._action_keys is not None else ["action"]

    @action_keys.setter
    def action_keys(self, value: Any) -> None:
        self._action_keys = _key_list(value, "action_keys")

    @property
    def observation_keys(self) -> list[NestedKey]:
        """The observation entries (default ``["observation"]``); they identify a vertex
        in ``node_map``."""
        return self._observation_keys if self._observation_keys is not None else ["observation"]

    @observation_keys.setter
    def observation_keys(self, value: Any) -> None:
        self._observation_keys = _key_list(value, "observation_keys")

    @property
    def excluded_keys(self) -> list[NestedKey] | None:
        """Entries not stored (``None``: store everything)."""
        return self._excluded_keys

    @excluded_keys.setter
    def excluded_keys(self, value: Any) -> None:
        self._excluded_keys = None if value is None else _key_list(value, "excluded_keys")

    def get_keys_from_env(self, env: Any) -> None:
        """Sets the done, reward, action and observation keys not given yet from ``env``'s
        (``env.done_keys``, ``env.reward_keys``, ``env.action_keys``, and the leaves of
        ``env.observation_spec``)."""
        if self._done_keys is None:
            self.done_keys = list(env.done_keys)
        if self._reward_keys is None:
            self.reward_keys = list(env.reward_keys)
        if self._action_keys is None:
            self.action_keys = list(env.action_keys)
        if self._observation_keys is None:
            self.observation_keys = list(env.observation_spec.keys(True, True))

    # ------------------------------------------------------------- writing
    def _steps(self, rollout: TensorDictBase, where: str) -> TensorDictBase:
        if not isinstance(rollout, TensorDictBase):
            raise TypeError(f"MCTSForest.{where}: expected a TensorDict of steps, got {type(rollout).__name__}")
        for key in [*self.observation_keys, *self.action_keys]:
            if rollout.get(key, None) is None:
                raise KeyError(f"MCTSForest.{where}: the rollout has no entry {key!r} (observation_keys "
                               f"{self.observation_keys}, action_keys {self.action_keys}); it has "
                               f"{sorted(map(str, rollout.keys(True, True)))}")
        nxt = rollout.get("next", None)
        if not isinstance(nxt, TensorDictBase):
            raise KeyError(f"MCTSForest.{where}: the rollout has no 'next' TensorDict (the steps' outcomes)")
        for key in self.observation_keys:
            if nxt.get(key, None) is None:
                raise KeyError(f"MCTSForest.{where}: the rollout has no entry {('next', key)!r}; its 'next' has "
                               f"{sorted(map(str, nxt.keys(True, True)))}")
        steps = rollout.reshape(-1) if rollout.batch_dims != 1 else rollout
        if self.excluded_keys:
            steps = steps.exclude(*self.excluded_keys)
            steps.set("next", steps.get("next").exclude(*self.excluded_keys))
        return steps

    def _make_maps(self, steps: TensorDictBase) -> None:
        size = self.max_size if self.max_size is not None else 1000
        in_keys = [*self.observation_keys, *self.action_keys]
        if self.data_map is None:
            self.data_map = TensorDictMap.from_tensordict_pair(steps.select(*in_keys), steps, in_keys=in_keys,
                                                               max_size=size, hash_module=SipHash(),
                                                               consolidated=self.consolidated)
        if self.max_size is None:
            self.max_size = self.data_map.max_size
        if self.node_map is None:
            query = QueryModule(in_keys=list(self.observation_keys), hash_module=SipHash())
            self.node_map = TensorDictMap(
                query_module=query,
                storage={"_index": ListStorage(self.max_size), "_hash": ListStorage(self.max_size),
                         "count": LazyTensorStorage(self.max_size)},
                collate_fn=_collate)

    def extend(self, rollout: TensorDictBase, *, return_node: bool = False) -> Tree | None:
        """Stores every step of ``rollout`` (``[*B, T]``): a step already stored (equal
        observation and action) is kept once; a new action from a known observation adds
        a branch there. With ``return_node``, returns :meth:`get_tree` from the first
        step's observation."""
        steps = self._steps(rollout, "extend")
        if steps.shape[0] == 0:
            return None
        self._make_maps(steps)
        data_keys = steps.select(*self.data_map.in_keys)
        self.data_map[data_keys] = steps
        q = self.data_map.query_module(data_keys, extend=False, clone=True)
        data_index, data_hash = q.get(self.data_map.query_module.index_key), q.get(self.data_map.query_module.hash_key)
        obs = steps.select(*self.observation_keys)
        node_hash = self.node_map.query_module.hash(obs).tolist()
        branches: dict[int, list[int]] = {}  # node hash -> positions of its steps, in order
        for pos, h in enumerate(node_hash):
            branches.setdefault(h, []).append(pos)
        for positions in branches.values():  # nodes in order of first appearance (the node map fills in order)
            node = obs[positions[0]:positions[0] + 1]
            new_index, new_hash = data_index[positions], data_hash[positions]
            known = self._node_entry(node[0])
            index, hashes, count = known if known is not None else (new_index[:0], new_hash[:0], 0)
            for i, h in zip(new_index.tolist(), new_hash.tolist(), strict=True):
                if not bool((index == i).any()):
                    index = torch.cat([index, torch.tensor([i])])
                    hashes = torch.cat([hashes, torch.tensor([h])])
            self.node_map[node] = TensorDict({"_index": index[None], "_hash": hashes[None],
                                              "count": torch.tensor([count + len(positions)])}, [1])
        if return_node:
            return self.get_tree(steps[0])
        return None

    def add(self, step: TensorDictBase, *, return_node: bool = False) -> Tree | None:
        """Stores one step (a TensorDict ``[]``); see :meth:`extend`."""
        if not isinstance(step, TensorDictBase):
            raise TypeError(f"MCTSForest.add: expected a TensorDict step, got {type(step).__name__}")
        return self.extend(step.unsqueeze(0) if step.batch_dims == 0 else step, return_node=return_node)

    def __len__(self) -> int:
        """The number of stored steps (distinct (observation, action) pairs)."""
        return 0 if self.data_map is None else len(self.data_map)

    # ------------------------------------------------------------- reading
    def get_child(self, root: TensorDictBase) -> TensorDictBase:
        """The stored step(s) of ``root``'s (observation, action) entries."""
        self._require_data("get_child")
        return self.data_map[root]

    def _require_data(self, where: str) -> None:
        if self.data_map is None or self.node_map is None:
            raise RuntimeError(f"MCTSForest.{where}: the forest is empty; extend it with rollouts first")

    def _node_entry(self, node: TensorDictBase) -> tuple[Tensor, Tensor, int] | None:
        """(data indices, data hashes, count) of the steps leaving ``node`` (a TensorDict
        ``[]`` of observation entries), or ``None`` for an observation never left."""
        batch = node.unsqueeze(0)
        if not bool(self.node_map.contains(batch)):
            return None
        row = int(self.node_map.query_module(batch, extend=False, clone=True).get(
            self.node_map.query_module.index_key)[0])
        store = self.node_map.storage
        return (torch.as_tensor(store["_index"].get(row)).reshape(-1),
                torch.as_tensor(store["_hash"].get(row)).reshape(-1), int(store["count"].get(row)))

    def _children(self, node: TensorDictBase) -> tuple[Tensor, Tensor] | None:
        entry = self._node_entry(node)
        return None if entry is None else entry[:2]

    def _read(self, indices: list[int]) -> TensorDictBase:
        index = torch.tensor(indices, dtype=torch.int64)
        out = TensorDict({}, batch_size=[len(indices)])
        for key in self.data_map.out_keys:
            out.set(key, self.data_map.collate_fn(self.data_map.storage[key].get(index)))
        return out

    def _next_node(self, index: int) -> TensorDictBase:
        return self._read([index]).get("next").select(*self.observation_keys)[0]

    def _local_tree(self, node: TensorDictBase, index: int | None, compact: bool
                    ) -> tuple[Tree, tuple[Tensor, Tensor] | None]:
        """The vertex reached from ``node`` by data step ``index`` (``None``: ``node``
        itself, with a rollout when it has a single branch), following single branches
        when ``compact``; returns it and its branches (``None`` at a leaf)."""
        branches = self._children(node) if index is None else (torch.tensor([index]), None)
        chain: list[int] = []
        while branches is not None and branches[0].numel() == 1:
            i = int(branches[0][0])
            if i in chain:
                raise ValueError("MCTSForest.get_tree: the stored steps form a cycle (an observation reachable "
                                 "from itself); trees need acyclic data")
            chain.append(i)
            node = self._next_node(i)
            branches = self._children(node)
            if not compact:
                break
        rollout = self._read(chain) if chain else None
        tree = Tree(index=None if branches is None else branches[0], rollout=rollout, node_data=node.clone())
        tree._action_keys, tree._done_keys = list(self.action_keys), list(self.done_keys)
        return tree, branches

    def get_tree(self, root: TensorDictBase, *, max_depth: int | None = None, compact: bool = True) -> Tree:
        """The tree of stored steps from ``root`` (a TensorDict ``[]`` with the
        observation entries, e.g. a reset TensorDict or a rollout's step).

        Vertices are numbered breadth-first (root 0). The children of a vertex are the
        distinct actions stored from its observation, in the order they were first stored;
        a child reached through the same (observation, action) step from two parents is
        one shared ``Tree``. ``compact`` merges single-child chains into one vertex.
        ``max_depth``: vertices deeper than ``max_depth`` edges from the root are not
        expanded (TorchRL's counting: ``max_depth=0`` keeps the root and its children).
        """
        self._require_data("get_tree")
        if not isinstance(root, TensorDictBase):
            raise TypeError(f"MCTSForest.get_tree: root must be a TensorDict, got {type(root).__name__}")
        for key in self.observation_keys:
            if root.get(key, None) is None:
                raise KeyError(f"MCTSForest.get_tree: the root has no entry {key!r} (observation_keys "
                               f"{self.observation_keys})")
        if root.batch_dims:
            if root.batch_size.numel() != 1:
                raise ValueError(f"MCTSForest.get_tree: one root at a time (batch_size []), got "
                                 f"{list(root.batch_size)}")
            root = root.reshape(-1)[0]
        node = root.select(*self.observation_keys)
        if self._children(node) is None:
            raise KeyError("MCTSForest.get_tree: no stored step leaves the root's observation")
        tree, branches = self._local_tree(node, None, compact)
        tree.node_id = 0
        memo: dict[int, Tree] = {}
        queue: deque[tuple[Tree, tuple[Tensor, Tensor], int]] = deque()
        if branches is not None:
            queue.append((tree, branches, 0))
        counter = 1
        while queue:
            parent, (indices, hashes), depth = queue.popleft()
            children = []
            for i, h in zip(indices.tolist(), hashes.tolist(), strict=True):
                child = memo.get(h)
                if child is None:
                    child, child_branches = self._local_tree(parent.node_data, i, compact)
                    child.node_id, child.hash, child._parent = counter, h, weakref.ref(parent)
                    counter += 1
                    memo[h] = child
                    if child_branches is not None and (max_depth is None or depth < max_depth):
                        queue.append((child, child_branches, depth + 1))
                else:
                    refs = child._parent if isinstance(child._parent, list) else [child._parent]
                    child._parent = [*refs, weakref.ref(parent)]
                children.append(child)
            parent.subtree = Subtrees(children)
        _check_acyclic(tree)
        return tree

    @classmethod
    def valid_paths(cls, tree: Tree) -> Iterator[tuple[int, ...]]:
        """``tree.valid_paths()``."""
        yield from tree.valid_paths()

    def to_string(self, td_root: TensorDictBase,
                  node_format_fn: Callable[[Tree], Any] = lambda tree: tree.node_data.to_dict()) -> str:
        """``self.get_tree(td_root).to_string(node_format_fn)``: one line per vertex."""
        return self.get_tree(td_root).to_string(node_format_fn)


def _collate(items: Any) -> Any:
    if not isinstance(items, list):
        return items
    if len({tuple(x.shape) for x in items}) > 1:
        raise ValueError("MCTSForest.node_map: the queried observations have different numbers of branches; "
                         "query one observation at a time")
    return torch.stack(items)


def _check_acyclic(root: Tree) -> None:
    state: dict[int, int] = {}  # id(tree) -> 1 on the current path, 2 done
    stack: list[tuple[Tree, int]] = [(root, 0)]
    while stack:
        tree, i = stack.pop()
        if i == 0:
            state[id(tree)] = 1
        if i < tree.num_children:
            stack.append((tree, i + 1))
            child = tree.subtree[i]
            mark = state.get(id(child))
            if mark == 1:
                raise ValueError("MCTSForest.get_tree: the stored steps form a cycle (an observation reachable "
                                 "from itself); trees need acyclic data")
            if mark is None:
                stack.append((child, 0))
        else:
            state[id(tree)] = 2
