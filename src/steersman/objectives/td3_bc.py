"""``TD3BCLoss``: TD3 with a behaviour-cloning term for offline RL (Fujimoto & Gu, 2021).

The critics are trained exactly as in :class:`~steersman.objectives.TD3Loss`; the actor
adds the squared distance to the dataset's action and scales the Q term so its size does
not depend on the reward scale::

    lmbd       = alpha / mean(|Q_1(s, mu(s))|)          (no gradient)
    loss_actor = mean( -lmbd * Q_1(s, mu(s)) + mean_d (mu(s)_d - a_d)^2 )
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from ..tensordict import TensorDictBase
from .common import NestedKey
from .td3 import TD3Loss
from .utils import weighted_reduce

__all__ = ["TD3BCLoss"]


class TD3BCLoss(TD3Loss):
    """TD3+BC, TorchRL's ``TD3BCLoss``.

    Args: those of :class:`~steersman.objectives.TD3Loss` plus ``alpha`` (default 2.5), the
    weight of the Q term relative to behaviour cloning;
    ``separate_losses`` is accepted and ignored (the actor and critic terms never share
    gradients here).

    Returns ``loss_actor``, ``loss_qvalue`` and the diagnostics of ``TD3Loss`` plus
    ``bc_loss`` (the mean squared distance to the batch's actions) and ``lmbd``.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> class Q(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.net = torch.nn.Linear(4, 1)
        ...     def forward(self, obs, action):
        ...         return self.net(torch.cat([obs, action], -1))
        >>> actor = TensorDictModule(torch.nn.Linear(3, 1), ["observation"], ["action"])
        >>> critic = TensorDictModule(Q(), ["observation", "action"], ["state_action_value"])
        >>> loss = TD3BCLoss(actor, critic, bounds=(-1.0, 1.0), alpha=2.5)
        >>> batch = TensorDict({"observation": torch.randn(8, 3), "action": torch.rand(8, 1) * 2 - 1,
        ...     "next": {"observation": torch.randn(8, 3), "reward": torch.randn(8, 1),
        ...              "done": torch.zeros(8, 1, dtype=torch.bool),
        ...              "terminated": torch.zeros(8, 1, dtype=torch.bool)}}, [8])
        >>> sorted(loss(batch).keys())[:4]
        ['bc_loss', 'lmbd', 'loss_actor', 'loss_qvalue']
    """

    out_keys = [*TD3Loss.out_keys[:2], "bc_loss", "lmbd", *TD3Loss.out_keys[2:]]

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module,
        *,
        action_spec: Any = None,
        bounds: tuple[Any, Any] | None = None,
        num_qvalue_nets: int = 2,
        policy_noise: float = 0.2,
        noise_clip: float = 0.5,
        alpha: float = 2.5,
        loss_function: str = "smooth_l1",
        delay_actor: bool = True,
        delay_qvalue: bool = True,
        separate_losses: bool = False,
        reduction: str = "mean",
        deactivate_vmap: bool = False,
        priority_key: NestedKey | None = None,
        use_prioritized_weights: str | bool = "auto",
        given_noise_key: NestedKey | None = None,
    ) -> None:
        super().__init__(
            actor_network, qvalue_network, action_spec=action_spec, bounds=bounds, num_qvalue_nets=num_qvalue_nets,
            policy_noise=policy_noise, noise_clip=noise_clip, loss_function=loss_function, delay_actor=delay_actor,
            delay_qvalue=delay_qvalue, reduction=reduction, deactivate_vmap=deactivate_vmap,
            separate_losses=separate_losses, priority_key=priority_key, use_prioritized_weights=use_prioritized_weights,
            given_noise_key=given_noise_key,
        )
        if not float(alpha) > 0:
            raise ValueError(f"TD3BCLoss: alpha must be > 0, got {alpha}")
        self.alpha = float(alpha)

    def actor_loss(self, tensordict: TensorDictBase) -> tuple[Tensor, dict[str, Tensor]]:
        """``-lmbd * Q_1(s, mu(s)) + mse(mu(s), a)`` with the critics frozen."""
        dataset_action = self._get(tensordict, "action")
        td = self.actor_network(tensordict.copy())
        action = td.get(self.tensor_keys.action)
        q = self._qvalues(td, self.qvalue_network_params.detach()).squeeze(-1)   # [N, *B]
        bc = (action - dataset_action).pow(2).flatten(len(tensordict.batch_size)).mean(-1)  # [*B]
        lmbd = self.alpha / q[0].abs().mean().detach()
        loss = -lmbd * q[0] + bc
        loss = weighted_reduce(loss, self.reduction, self._priority_weights(tensordict, loss))
        return loss, {"bc_loss": bc.detach().mean(), "lmbd": lmbd, "state_action_value_actor": q.detach().mean()}
