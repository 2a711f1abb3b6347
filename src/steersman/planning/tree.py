"""The search tree: preallocated tensors for ``B`` independent searches (mctx layout).

Node ``0`` is the root; simulation ``s`` writes node ``s + 1``. Index arrays are
int64 (torch indexes with them directly), visit counts int32, values in the dtype
of the root value.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import torch
from torch import Tensor

from steersman.tensordict import TensorDict, TensorDictBase

__all__ = ["SearchSummary", "Tree"]


class SearchSummary(NamedTuple):
    """Root statistics of a search: ``[B, A]`` visit counts (float), visit
    probabilities and Q-values, and the ``[B]`` root value."""

    visit_counts: Tensor
    visit_probs: Tensor
    value: Tensor
    qvalues: Tensor


@dataclasses.dataclass
class Tree:
    """State of ``B`` search trees of ``N = num_simulations + 1`` nodes and ``A`` actions.

    Node arrays ``[B, N]``: ``node_visits``, ``raw_values`` (the model's value when
    the node was expanded), ``node_values`` (the running mean of the backed-up
    returns), ``parents`` (-1 for the root and unused nodes), ``action_from_parent``
    and ``depth`` (edges from the root). Child arrays ``[B, N, A]``:
    ``children_index`` (-1: not expanded), ``children_prior_logits``,
    ``children_visits``, ``children_rewards``, ``children_discounts`` and
    ``children_values``. ``embeddings`` is a TensorDict ``[B, N, ...]``;
    ``root_invalid_actions`` a bool ``[B, A]`` mask (True: invalid);
    ``extra_data`` a TensorDict ``[B]`` (e.g. the root Gumbel noise).
    """

    node_visits: Tensor
    raw_values: Tensor
    node_values: Tensor
    parents: Tensor
    action_from_parent: Tensor
    depth: Tensor
    children_index: Tensor
    children_prior_logits: Tensor
    children_visits: Tensor
    children_rewards: Tensor
    children_discounts: Tensor
    children_values: Tensor
    embeddings: TensorDictBase
    root_invalid_actions: Tensor
    extra_data: TensorDictBase
    batch_range: Tensor = dataclasses.field(repr=False)

    ROOT_INDEX: ClassVar[int] = 0
    NO_PARENT: ClassVar[int] = -1
    UNVISITED: ClassVar[int] = -1

    @property
    def batch_size(self) -> int:
        return self.node_values.shape[0]

    @property
    def num_actions(self) -> int:
        return self.children_index.shape[-1]

    @property
    def num_simulations(self) -> int:
        return self.node_values.shape[-1] - 1

    def qvalues(self, index: int | Tensor) -> Tensor:
        """``[B, A]`` Q-values ``r + discount * child value`` of node ``index`` (an
        int, the same node in every tree, or a ``[B]`` tensor of node indices)."""
        if isinstance(index, int):
            return self.children_rewards[:, index] + self.children_discounts[:, index] * self.children_values[:, index]
        ar = self.batch_range
        return self.children_rewards[ar, index] + self.children_discounts[ar, index] * self.children_values[ar, index]

    def summary(self) -> SearchSummary:
        """Visit counts, visit probabilities, value and Q-values at the root."""
        value = self.node_values[:, self.ROOT_INDEX]
        visit_counts = self.children_visits[:, self.ROOT_INDEX].to(value.dtype)
        total = visit_counts.sum(-1, keepdim=True)
        probs = visit_counts / total.clamp_min(1)
        probs = torch.where(total > 0, probs, 1.0 / self.num_actions)
        return SearchSummary(visit_counts, probs, value, self.qvalues(self.ROOT_INDEX))

    def to_tensordict(self) -> TensorDict:
        """The tree as a TensorDict ``[B]`` (one entry per field)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "batch_range"}
        return TensorDict(fields, batch_size=[self.batch_size])


def instantiate_tree(prior_logits: Tensor, value: Tensor, embedding: TensorDictBase, num_simulations: int,
                     invalid_actions: Tensor, extra_data: TensorDictBase) -> Tree:
    """An empty tree with the root (node 0) filled in from the root outputs."""
    batch, num_actions = prior_logits.shape
    n = num_simulations + 1
    dev, dt = value.device, value.dtype
    ar = torch.arange(batch, device=dev)

    def zeros(*shape: int, dtype: torch.dtype = dt) -> Tensor:
        return torch.zeros((batch, *shape), dtype=dtype, device=dev)

    def minus_one(*shape: int) -> Tensor:
        return torch.full((batch, *shape), -1, dtype=torch.int64, device=dev)

    emb = embedding.apply(lambda x: torch.zeros((batch, n, *x.shape[1:]), dtype=x.dtype, device=x.device),
                          batch_size=[batch, n])
    tree = Tree(
        node_visits=zeros(n, dtype=torch.int32), raw_values=zeros(n), node_values=zeros(n),
        parents=minus_one(n), action_from_parent=minus_one(n), depth=zeros(n, dtype=torch.int64),
        children_index=minus_one(n, num_actions),
        children_prior_logits=zeros(n, num_actions, dtype=prior_logits.dtype),
        children_visits=zeros(n, num_actions, dtype=torch.int32), children_rewards=zeros(n, num_actions),
        children_discounts=zeros(n, num_actions), children_values=zeros(n, num_actions),
        embeddings=emb, root_invalid_actions=invalid_actions, extra_data=extra_data, batch_range=ar,
    )
    tree.children_prior_logits[:, 0] = prior_logits
    tree.raw_values[:, 0] = value
    tree.node_values[:, 0] = value
    tree.node_visits[:, 0] = 1
    for key in embedding.keys(include_nested=True, leaves_only=True):
        emb.get(key)[:, 0] = embedding.get(key)
    return tree
