"""``MultiStep``: n-step returns written into a collected batch (a collector ``postproc``)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from steersman.tensordict import TensorDictBase

__all__ = ["MultiStep"]

_DONE_KEYS = ("done", "terminated", "truncated")


class MultiStep(nn.Module):
    """Rewrites a ``[*B, T]`` batch so each step carries its n-step return.

    For step ``t`` let ``m`` be ``n_steps`` or fewer: the window ``t .. t+m-1`` stops at the
    first step whose ``("next", "done")`` is set (that step included) or at the end of the
    batch. Then

    * ``("next", "reward")`` becomes ``sum_{k<m} gamma**k * r[t+k]`` (the old value is kept
      in ``("next", "original_reward")``);
    * every other ``"next"`` entry (observations, done/terminated/truncated...) is the one
      of step ``t+m-1``: the state the return bootstraps from;
    * ``"steps_to_next_obs"`` is ``m``, ``"gamma"`` is ``gamma**m`` (the discount of that
      bootstrap) and ``"nonterminal"`` is False on the last step of each window-ending
      trajectory (a done step or the batch's last step).

    Unlike TorchRL's ``MultiStep``, the done flags move with the window: a step whose
    window reaches a terminal state is marked terminated, so a value target never
    bootstraps from a terminal observation (TorchRL leaves those flags unshifted).

    Args:
        gamma: discount factor in ``(0, 1]``.
        n_steps: window length, ``>= 1``.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> T = 5
        >>> done = torch.tensor([False, False, True, False, False]).unsqueeze(-1)
        >>> td = TensorDict({"obs": torch.arange(float(T)).unsqueeze(-1),
        ...     "next": {"obs": torch.arange(1.0, T + 1).unsqueeze(-1), "reward": torch.ones(T, 1),
        ...              "done": done, "terminated": done.clone()}}, [T])
        >>> out = MultiStep(gamma=0.5, n_steps=2)(td)
        >>> out["next", "reward"].squeeze(-1).tolist(), out["steps_to_next_obs"].tolist()
        ([1.5, 1.5, 1.0, 1.5, 1.0], [2, 2, 1, 2, 1])
        >>> out["next", "obs"].squeeze(-1).tolist(), out["next", "terminated"].squeeze(-1).tolist()
        ([2.0, 3.0, 3.0, 5.0, 5.0], [False, True, True, False, False])
    """

    def __init__(self, gamma: float, n_steps: int) -> None:
        super().__init__()
        if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
            raise ValueError(f"n_steps must be an integer >= 1, got {n_steps!r}")
        if not 0 < gamma <= 1:
            raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")
        self.gamma = float(gamma)
        self.n_steps = n_steps

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Rewrites ``tensordict`` (batch ``[*B, T]``, time last) in place and returns it."""
        td = tensordict
        if td.batch_dims < 1:
            raise ValueError("MultiStep needs a batch with a time dim (batch size [*B, T]), got batch size []")
        for key in (("next", "reward"), ("next", "done")):
            if key not in td.keys(True):
                raise KeyError(f"MultiStep needs the entry {key!r}; the batch has {sorted(map(str, td.keys(True)))}")
        T, dim = td.batch_size[-1], td.batch_dims - 1
        done = td.get(("next", "done")).reshape(*td.batch_size, -1).any(-1)
        t = torch.arange(T, device=done.device).expand_as(done)
        end = done.clone()
        end[..., -1] = True
        # first trajectory end at or after t: a reverse running minimum of the end indices
        end_at = torch.where(end, t, torch.full_like(t, T)).flip(-1).cummin(-1).values.flip(-1)
        m = (end_at - t + 1).clamp(max=self.n_steps)  # [*B, T], >= 1
        last = t + m - 1

        reward = td.get(("next", "reward"))
        r = reward.reshape(*td.batch_size, -1)
        ret = torch.zeros_like(r)
        for k in range(self.n_steps):
            shifted = torch.cat([r[..., k:, :], torch.zeros_like(r[..., :k, :])], dim=-2) if k else r
            ret = ret + (self.gamma**k) * shifted * (k < m).unsqueeze(-1).to(r.dtype)

        nxt = td.get("next")
        moved = {}
        for key, leaf in nxt.items(True, True):
            moved[key] = _gather_time(leaf, last, dim)
        for key, value in moved.items():
            td.set(("next", *((key,) if isinstance(key, str) else key)), value)
        td.set(("next", "original_reward"), reward)
        td.set(("next", "reward"), ret.reshape(reward.shape))
        td.set("steps_to_next_obs", m)
        td.set("gamma", torch.full(m.shape, self.gamma, dtype=torch.float32, device=m.device) ** m)
        td.set("nonterminal", ~end)
        return td

    def extra_repr(self) -> str:
        return f"gamma={self.gamma}, n_steps={self.n_steps}"


def _gather_time(leaf: Tensor, index: Tensor, dim: int) -> Tensor:
    """``leaf[..., index[...], ...]`` along the time ``dim`` (``index`` has the batch shape)."""
    extra = leaf.shape[index.ndim:]
    idx = index.reshape(*index.shape, *([1] * len(extra))).expand(*index.shape, *extra)
    return leaf.gather(dim, idx)
