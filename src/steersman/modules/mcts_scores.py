"""Score modules for tree search (TorchRL's ``PUCTScore``, ``UCBScore``,
``UCB1TunedScore``, ``EXP3Score``): TensorDict modules that read per-action statistics
``[..., num_actions]`` and write a ``[..., num_actions]`` score to ``score_key``.

Difference on purpose: in the mean-value term ``win_count / visits`` an unvisited
action (``visits == 0``) counts as 0 instead of giving NaN, so an argmax over a node
with unvisited actions is defined (PUCT/UCB then rank them by their exploration term).
UCB1-Tuned gives unvisited actions a score of ``+inf`` (tried first), as documented.
"""

from __future__ import annotations

import enum
import math
from typing import Any

import torch
from torch import Tensor

from steersman.tensordict import TensorDictBase
from steersman.tensordict.nn import TensorDictModuleBase

__all__ = ["EXP3Score", "MCTSScore", "MCTSScores", "PUCTScore", "UCB1TunedScore", "UCBScore"]


def _get(td: TensorDictBase, key: Any, who: str) -> Tensor:
    x = td.get(key, None)
    if x is None:
        raise KeyError(f"{who}: the input has no entry {key!r}")
    return torch.as_tensor(x)


def _mean(win_count: Tensor, visits: Tensor) -> Tensor:
    visits = visits.to(win_count.dtype)
    return torch.where(visits > 0, win_count / visits.clamp_min(1), torch.zeros_like(win_count))


class MCTSScore(TensorDictModuleBase):
    """Base of the score modules: ``forward(node_td) -> node_td`` with ``score_key`` set."""

    score_key: Any


class PUCTScore(MCTSScore):
    """``score = win_count / visits + c * prior_prob * sqrt(total_visits) / (1 + visits)``
    (AlphaZero's PUCT; ``total_visits`` is the parent's count, a tensor ``[..., 1]`` or
    ``[...]`` or a scalar).

    Examples:
        >>> from steersman.tensordict import TensorDict
        >>> node = TensorDict({"win_count": torch.tensor([1., 0.]), "visits": torch.tensor([2., 0.]),
        ...                    "total_visits": torch.tensor(4.), "prior_prob": torch.tensor([0.5, 0.5])}, [])
        >>> PUCTScore(c=1.0)(node)["score"]
        tensor([0.8333, 1.0000])
    """

    def __init__(self, *, c: float, win_count_key: Any = "win_count", visits_key: Any = "visits",
                 total_visits_key: Any = "total_visits", prior_prob_key: Any = "prior_prob",
                 score_key: Any = "score") -> None:
        super().__init__()
        self.c = c
        self.win_count_key, self.visits_key = win_count_key, visits_key
        self.total_visits_key, self.prior_prob_key, self.score_key = total_visits_key, prior_prob_key, score_key
        self.in_keys = [win_count_key, visits_key, total_visits_key, prior_prob_key]
        self.out_keys = [score_key]

    def forward(self, node: TensorDictBase) -> TensorDictBase:
        name = type(self).__name__
        w, n = _get(node, self.win_count_key, name), _get(node, self.visits_key, name)
        total = _get(node, self.total_visits_key, name).to(w.dtype)
        prior = _get(node, self.prior_prob_key, name)
        if total.ndim == w.ndim - 1:
            total = total.unsqueeze(-1)
        node.set(self.score_key, _mean(w, n) + self.c * prior * total.sqrt() / (1 + n.to(w.dtype)))
        return node


class UCBScore(MCTSScore):
    """``score = win_count / visits + c * sqrt(total_visits) / (1 + visits)``.

    Examples:
        >>> from steersman.tensordict import TensorDict
        >>> node = TensorDict({"win_count": torch.tensor([3., 1.]), "visits": torch.tensor([3., 1.]),
        ...                    "total_visits": torch.tensor(4.)}, [])
        >>> UCBScore(c=2.0)(node)["score"]
        tensor([2., 3.])
    """

    def __init__(self, *, c: float, win_count_key: Any = "win_count", visits_key: Any = "visits",
                 total_visits_key: Any = "total_visits", score_key: Any = "score") -> None:
        super().__init__()
        self.c = c
        self.win_count_key, self.visits_key = win_count_key, visits_key
        self.total_visits_key, self.score_key = total_visits_key, score_key
        self.in_keys = [win_count_key, visits_key, total_visits_key]
        self.out_keys = [score_key]

    def forward(self, node: TensorDictBase) -> TensorDictBase:
        name = type(self).__name__
        w, n = _get(node, self.win_count_key, name), _get(node, self.visits_key, name)
        total = _get(node, self.total_visits_key, name).to(w.dtype)
        if total.ndim == w.ndim - 1:
            total = total.unsqueeze(-1)
        node.set(self.score_key, _mean(w, n) + self.c * total.sqrt() / (1 + n.to(w.dtype)))
        return node


class UCB1TunedScore(MCTSScore):
    """UCB1-Tuned (Auer et al., 2002): ``mean_i + sqrt(log(N) / N_i * min(0.25, V_i))``
    with ``V_i = sum_sq_i / N_i - mean_i**2 + sqrt(exploration_constant * log(N) / N_i)``,
    ``log(N)`` of ``max(N, 1)``; unvisited actions score ``+inf``.

    Examples:
        >>> from steersman.tensordict import TensorDict
        >>> node = TensorDict({"win_count": torch.tensor([2., 0.]), "visits": torch.tensor([4., 0.]),
        ...                    "total_visits": torch.tensor(4.),
        ...                    "sum_squared_rewards": torch.tensor([2., 0.])}, [])
        >>> UCB1TunedScore()(node)["score"]
        tensor([0.7944,    inf])
    """

    def __init__(self, *, win_count_key: Any = "win_count", visits_key: Any = "visits",
                 total_visits_key: Any = "total_visits", sum_squared_rewards_key: Any = "sum_squared_rewards",
                 score_key: Any = "score", exploration_constant: float = 2.0) -> None:
        super().__init__()
        self.win_count_key, self.visits_key, self.total_visits_key = win_count_key, visits_key, total_visits_key
        self.sum_squared_rewards_key, self.score_key = sum_squared_rewards_key, score_key
        self.exploration_constant = exploration_constant
        self.in_keys = [win_count_key, visits_key, total_visits_key, sum_squared_rewards_key]
        self.out_keys = [score_key]

    def forward(self, node: TensorDictBase) -> TensorDictBase:
        name = type(self).__name__
        w, n = _get(node, self.win_count_key, name), _get(node, self.visits_key, name).to(torch.float32)
        n = n.to(w.dtype)
        total = _get(node, self.total_visits_key, name).to(w.dtype)
        sq = _get(node, self.sum_squared_rewards_key, name)
        if total.ndim == w.ndim - 1:
            total = total.unsqueeze(-1)
        safe_n = n.clamp_min(1)
        mean = w / safe_n
        log_n = torch.log(total.clamp_min(1.0))
        var = sq / safe_n - mean ** 2 + torch.sqrt(self.exploration_constant * log_n / safe_n)
        score = mean + torch.sqrt(log_n / safe_n * var.clamp_max(0.25))
        node.set(self.score_key, torch.where(n > 0, score, torch.full_like(score, math.inf)))
        return node


class EXP3Score(MCTSScore):
    """EXP3's action probabilities ``p_i = (1 - gamma) * w_i / sum(w) + gamma / K``
    written to ``score_key`` (and ``action_prob_key``); :meth:`update_weights` applies
    ``w_i <- w_i * exp(gamma / K * reward / p_i)`` for the chosen action.

    Examples:
        >>> from steersman.tensordict import TensorDict
        >>> node = TensorDict({"weights": torch.tensor([1., 3.]), "num_actions": torch.tensor(2)}, [])
        >>> exp3 = EXP3Score(gamma=0.1)
        >>> exp3(node)["score"]
        tensor([0.2750, 0.7250])
        >>> exp3.update_weights(node, 0, 1.0)
        >>> round(float(node["weights"][0]), 4)  # exp(0.05 / 0.275)
        1.1994
    """

    def __init__(self, *, gamma: float = 0.1, weights_key: Any = "weights", action_prob_key: Any = "action_prob",
                 reward_key: Any = "reward", score_key: Any = "score", num_actions_key: Any = "num_actions") -> None:
        super().__init__()
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"EXP3Score: gamma must be in [0, 1], got {gamma!r}")
        self.gamma = gamma
        self.weights_key, self.action_prob_key, self.reward_key = weights_key, action_prob_key, reward_key
        self.score_key, self.num_actions_key = score_key, num_actions_key
        self.in_keys = [weights_key, num_actions_key]
        self.out_keys = [score_key, action_prob_key]

    def _k(self, node: TensorDictBase, w: Tensor) -> Tensor:
        k = node.get(self.num_actions_key, None)
        return torch.as_tensor(w.shape[-1] if k is None else k, dtype=w.dtype)

    def forward(self, node: TensorDictBase) -> TensorDictBase:
        w = _get(node, self.weights_key, type(self).__name__)
        k = self._k(node, w)
        if k.ndim == w.ndim - 1 and k.ndim > 0:
            k = k.unsqueeze(-1)
        probs = (1 - self.gamma) * w / w.sum(-1, keepdim=True) + self.gamma / k
        node.set(self.score_key, probs)
        if self.action_prob_key != self.score_key:
            node.set(self.action_prob_key, probs)
        return node

    def update_weights(self, node: TensorDictBase, action_idx: int, reward: float) -> None:
        """Multiplies the chosen action's weight by ``exp(gamma / K * reward / p)``
        (``p`` from the last :meth:`forward` on ``node``; reward in ``[0, 1]``)."""
        if not 0.0 <= float(reward) <= 1.0:
            raise ValueError(f"EXP3Score.update_weights: reward must be in [0, 1], got {reward!r}")
        w = _get(node, self.weights_key, "EXP3Score.update_weights")
        probs = node.get(self.score_key, None)
        if probs is None:
            probs = self.forward(node).get(self.score_key)
        p = probs[..., action_idx]
        if bool((p <= 0).any()):
            raise ValueError(f"EXP3Score.update_weights: the probability of action {action_idx} must be > 0, got {p}")
        k = self._k(node, w)
        w = w.clone()
        w[..., action_idx] = w[..., action_idx] * torch.exp(self.gamma / k * float(reward) / p)
        node.set(self.weights_key, w)


class MCTSScores(enum.Enum):
    """The score modules by name: ``MCTSScores.PUCT.value`` is :class:`PUCTScore`, and
    so on (``UCB``, ``UCB1_TUNED``, ``EXP3``)."""

    PUCT = PUCTScore
    UCB = UCBScore
    UCB1_TUNED = UCB1TunedScore
    EXP3 = EXP3Score
