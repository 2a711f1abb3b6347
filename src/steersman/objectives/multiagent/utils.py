"""``agent_batch``: a group's entries as a batch whose last dim is the agent, so that the
single-agent losses (DQN, DDPG, SAC...) run on multi-agent data unchanged."""

from __future__ import annotations

from collections.abc import Sequence

from ...tensordict import TensorDictBase

__all__ = ["agent_batch"]


def _broadcast_into(dest: TensorDictBase, src: TensorDictBase, keys: Sequence[str], where: str) -> None:
    for key in keys:
        if key in dest.keys() or key not in src.keys():
            continue
        value = src.get(key)
        if value.shape[: src.ndim] != src.batch_size:  # pragma: no cover - TensorDict guarantees it
            raise ValueError(f"agent_batch: {where}{key!r} does not start with the batch shape")
        dest.set(key, value.unsqueeze(src.ndim).expand(*dest.batch_size, *value.shape[src.ndim:]))


def _with_agent_dim(g: TensorDictBase, td: TensorDictBase) -> TensorDictBase:
    """``g`` with batch ``[*td.batch_size, n_agents]`` (a group stored with only the outer
    batch dims gets the agent dim from its leaves)."""
    if g.ndim == td.ndim:
        leaves = list(g.values(include_nested=True, leaves_only=True))
        if leaves and all(t.ndim > td.ndim and t.shape[td.ndim] == leaves[0].shape[td.ndim] for t in leaves):
            g = g.copy()
            g.batch_size = [*td.batch_size, leaves[0].shape[td.ndim]]
    return g


def agent_batch(
    td: TensorDictBase, group: str = "agents", *, broadcast: Sequence[str] = ("done", "terminated", "truncated")
) -> TensorDictBase:
    """``td[group]`` (batch ``[*B, n_agents]``) with ``td["next", group]`` under ``"next"``;
    the root entries named in ``broadcast`` that the group lacks (team-level dones, a
    ``"reward"``, a ``"state"``...) are expanded along the agent dim (views, no copy).

    A loss built for single-agent batches then reads per-agent entries at its default keys:
    ``DQNLoss(net)(agent_batch(td))`` is independent Q-learning (IQL) with the agents as
    extra batch elements; a critic that reads all agents' inputs (a centralised
    ``MultiAgentMLP``) makes ``DDPGLoss`` MADDPG. What the loss writes into the batch (e.g.
    ``"td_error"``) lands in the returned TensorDict, not in ``td``.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> td = TensorDict({"agents": TensorDict({"observation": torch.zeros(4, 3, 2)}, [4, 3]),
        ...                  "next": {"agents": TensorDict({"reward": torch.ones(4, 3, 1)}, [4, 3]),
        ...                           "done": torch.zeros(4, 1, dtype=torch.bool)}}, [4])
        >>> flat = agent_batch(td)
        >>> flat.batch_size, flat["next", "done"].shape
        (torch.Size([4, 3]), torch.Size([4, 3, 1]))
    """
    g = td.get(group, None)
    if isinstance(g, TensorDictBase):
        g = _with_agent_dim(g, td)
    if not isinstance(g, TensorDictBase) or g.ndim != td.ndim + 1:
        raise KeyError(
            f"agent_batch: no group {group!r} with batch [*batch, n_agents] in the TensorDict "
            f"(root keys {sorted(map(str, td.keys()))})"
        )
    out = g.copy()
    _broadcast_into(out, td, broadcast, "")
    nxt = td.get("next", None)
    if isinstance(nxt, TensorDictBase):
        ng = nxt.get(group, None)
        if not isinstance(ng, TensorDictBase):
            raise KeyError(f"agent_batch: no group {group!r} under 'next' (keys {sorted(map(str, nxt.keys()))})")
        ng = _with_agent_dim(ng, nxt).copy()
        _broadcast_into(ng, nxt, broadcast, "'next', ")
        out.set("next", ng)
    return out
