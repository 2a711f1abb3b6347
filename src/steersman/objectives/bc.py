"""``BCLoss``: behaviour cloning from demonstrations.

For a probabilistic actor (one with ``get_dist``) the loss is the negative
log-likelihood of the dataset's action, ``loss_bc = mean(-log π(a|s))``; for a
deterministic actor (or with ``loss_function`` given) it is a distance between the
action the actor writes and the dataset's: ``"l2"``/``"mse"`` (squared error, averaged
over the action dims), ``"l1"``, ``"smooth_l1"``, ``"cross_entropy"`` (the actor's output
read as logits, the dataset's action an index or a probability vector), or any callable
``f(prediction, target) -> [*B]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor, nn

from ..tensordict import TensorDict, TensorDictBase
from .actor_critic import actor_distribution
from .common import LossModule, NestedKey, check_options
from .utils import distance_loss, reduce_loss

__all__ = ["BCLoss"]

_DISTANCES = ("l1", "l2", "mse", "smooth_l1", "cross_entropy")


class BCLoss(LossModule):
    """TorchRL's ``BCLoss``.

    Args:
        actor_network: a probabilistic actor (``get_dist``) or a module writing the action.
        loss_function: ``None`` (default: NLL for a probabilistic actor, ``"l2"`` otherwise),
            one of ``"l1"``, ``"l2"``, ``"mse"``, ``"smooth_l1"``, ``"cross_entropy"``, or a
            callable ``(prediction, target) -> per-sample loss``.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (``[*B]``).

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> actor = TensorDictModule(torch.nn.Linear(3, 2), ["observation"], ["action"])
        >>> loss = BCLoss(actor)
        >>> out = loss(TensorDict({"observation": torch.randn(4, 3), "action": torch.rand(4, 2)}, [4]))
        >>> list(out.keys()), out["loss_bc"].shape
        (['loss_bc'], torch.Size([]))
    """

    @dataclass
    class _AcceptedKeys:
        """Batch keys: the dataset's action (and what the actor writes)."""

        action: NestedKey = "action"

    out_keys = ["loss_bc"]
    networks = ("actor_network",)

    def __init__(
        self,
        actor_network: nn.Module,
        *,
        loss_function: str | Callable[[Tensor, Tensor], Tensor] | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__()
        check_options(self, reduction=reduction)
        if loss_function is not None and not callable(loss_function) and loss_function not in _DISTANCES:
            raise ValueError(f"BCLoss: loss_function must be one of {list(_DISTANCES)}, a callable or None, got {loss_function!r}")
        self.actor_network = actor_network
        self.loss_function = loss_function
        self.reduction = reduction

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        target = self._get(tensordict, "action")
        td = tensordict.copy()
        n = len(td.batch_size)
        if self.loss_function is None and hasattr(self.actor_network, "get_dist"):
            loss = -actor_distribution(self.actor_network, td).log_prob(target)
            if loss.shape != td.batch_size:
                raise ValueError(
                    f"BCLoss: the actor's log_prob has shape {list(loss.shape)}, expected the batch shape "
                    f"{list(td.batch_size)} (use a distribution whose log_prob sums over the action dims)"
                )
        else:
            td.exclude(self.tensor_keys.action, inplace=True)
            pred = self.actor_network(td).get(self.tensor_keys.action, None)
            if pred is None:
                raise KeyError(f"BCLoss: the actor did not write {self.tensor_keys.action!r}; set its out_keys")
            loss = self._distance(pred, target, n)
        return TensorDict({"loss_bc": reduce_loss(loss, self.reduction)}, [])

    def _distance(self, pred: Tensor, target: Tensor, n: int) -> Tensor:
        """Per-sample distance ``[*B]`` between the actor's and the dataset's action."""
        fn = self.loss_function or "l2"
        if callable(fn):
            return fn(pred, target)
        if fn == "cross_entropy":
            log_p = pred.log_softmax(-1)
            if not target.is_floating_point():
                return -log_p.gather(-1, target.long().reshape(*pred.shape[:-1], 1)).squeeze(-1)
            return -(target * log_p).sum(-1)
        d = distance_loss(pred, target.to(pred.dtype), "l2" if fn == "mse" else fn)
        return d.flatten(n).mean(-1) if d.ndim > n else d
