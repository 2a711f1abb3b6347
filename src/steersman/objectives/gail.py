"""``GAILLoss``: the discriminator loss of generative adversarial imitation learning
(Ho & Ermon, 2016).

A discriminator ``D(s, a) ∈ (0, 1)`` is trained to tell expert pairs (label 1) from pairs
the current policy collected (label 0)::

    loss = mean( BCE(D(s_E, a_E), 1) + BCE(D(s_π, a_π), 0) )  [+ gp_lambda * mean((||∇D(x̂)|| - 1)^2)]

With ``use_grad_penalty``, ``x̂`` is a random per-element mix ``u * x_π + (1 - u) * x_E``
(``u ~ U(0, 1)``) of the observations and actions (Gulrajani et al., 2017). The policy
itself is trained by another loss with a reward such as ``-log(1 - D(s, a))``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..tensordict import TensorDict, TensorDictBase
from .common import LossModule, NestedKey, check_options
from .utils import reduce_loss

__all__ = ["GAILLoss"]


class GAILLoss(LossModule):
    """TorchRL's ``GAILLoss``.

    Args:
        discriminator_network: reads ``tensor_keys.expert_observation`` and
            ``tensor_keys.expert_action`` (``"observation"``, ``"action"``) and writes a
            probability at ``"d_logits"`` (``[*B, 1]``; despite TorchRL's name, after a sigmoid).
        use_grad_penalty: add the gradient penalty (default ``False``).
        gp_lambda: its weight (default 10).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (``[*B, 1]``).

    The batch holds the expert pairs at ``"observation"``/``"action"`` and the policy's at
    ``"collector_observation"``/``"collector_action"`` (same batch shape). Returns ``loss``
    and, with the penalty, ``gp_loss`` (detached).

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> class D(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.net = torch.nn.Linear(3 + 1, 1)
        ...     def forward(self, obs, action):
        ...         return self.net(torch.cat([obs, action], -1)).sigmoid()
        >>> loss = GAILLoss(TensorDictModule(D(), ["observation", "action"], ["d_logits"]), use_grad_penalty=True)
        >>> batch = TensorDict({"observation": torch.randn(8, 3), "action": torch.randn(8, 1),
        ...     "collector_observation": torch.randn(8, 3), "collector_action": torch.randn(8, 1)}, [8])
        >>> sorted(loss(batch).keys())
        ['gp_loss', 'loss']
    """

    @dataclass
    class _AcceptedKeys:
        """Batch keys: expert and collected pairs, and the discriminator's output."""

        expert_action: NestedKey = "action"
        expert_observation: NestedKey = "observation"
        collector_action: NestedKey = "collector_action"
        collector_observation: NestedKey = "collector_observation"
        discriminator_pred: NestedKey = "d_logits"

    out_keys = ["loss", "gp_loss"]
    networks = ("discriminator_network",)

    def __init__(
        self,
        discriminator_network: nn.Module,
        *,
        use_grad_penalty: bool = False,
        gp_lambda: float = 10.0,
        reduction: str = "mean",
    ) -> None:
        super().__init__()
        check_options(self, reduction=reduction)
        self.discriminator_network = discriminator_network
        self.use_grad_penalty = bool(use_grad_penalty)
        self.gp_lambda = float(gp_lambda)
        self.reduction = reduction

    def _discriminate(self, obs: Tensor, action: Tensor, batch_size: torch.Size) -> Tensor:
        keys = self.tensor_keys
        td = TensorDict({keys.expert_observation: obs, keys.expert_action: action}, batch_size)
        prob = self.discriminator_network(td).get(keys.discriminator_pred, None)
        if prob is None:
            raise KeyError(
                f"GAILLoss: the discriminator did not write {keys.discriminator_pred!r}; set its out_keys "
                "or call loss.set_keys(discriminator_pred=<its key>)"
            )
        return prob

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        obs_e, act_e = self._get(tensordict, "expert_observation"), self._get(tensordict, "expert_action")
        obs_c, act_c = self._get(tensordict, "collector_observation"), self._get(tensordict, "collector_action")
        batch = tensordict.batch_size
        n = batch[0]
        prob = self._discriminate(torch.cat([obs_e, obs_c]), torch.cat([act_e, act_c]), torch.Size([2 * n, *batch[1:]]))
        expert, collected = prob[:n], prob[n:]
        loss = F.binary_cross_entropy(expert, torch.ones_like(expert), reduction="none") + F.binary_cross_entropy(
            collected, torch.zeros_like(collected), reduction="none"
        )
        out = {}
        if self.use_grad_penalty:
            u_obs, u_act = torch.rand_like(obs_e), torch.rand_like(act_e)
            mix_obs = (u_obs * obs_c + (1 - u_obs) * obs_e).detach().requires_grad_(True)
            mix_act = (u_act * act_c + (1 - u_act) * act_e).detach().requires_grad_(True)
            mixed = self._discriminate(mix_obs, mix_act, batch)
            grads = torch.autograd.grad(mixed.sum(), (mix_obs, mix_act), create_graph=True)
            gp = self.gp_lambda * (torch.linalg.vector_norm(torch.cat(grads, -1), dim=-1) - 1).pow(2).mean()
            loss = loss + gp
            out["gp_loss"] = gp.detach()
        out["loss"] = reduce_loss(loss, self.reduction)
        return TensorDict(out, [])
