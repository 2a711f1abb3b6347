"""Module wrappers of TorchRL:

- :class:`VmapModule`: runs a TensorDict module under ``torch.vmap`` over one batch dim;
- :class:`QValueHook` / :class:`DistributionalQValueHook`: forward hooks turning a plain
  Q-network's output into ``(action, action_value, chosen_action_value)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..tensordict import TensorDict
from ..tensordict.nn import TensorDictModuleBase
from .qvalue import DistributionalQValueModule, QValueModule

__all__ = ["VmapModule", "QValueHook", "DistributionalQValueHook"]


class VmapModule(TensorDictModuleBase):
    """Calls ``module`` with ``torch.vmap`` over batch dim ``vmap_dim`` of the TensorDict.

    Args:
        module: a TensorDict module.
        vmap_dim: the batch dim to map over (default: the last batch dim).
        mock: loop over the dim (unbind, call, stack) instead of vmapping (for modules
            that vmap cannot run); same results.

    The outputs are written into the input TensorDict.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> lin = TensorDictModule(torch.nn.Linear(3, 2), in_keys=["x"], out_keys=["y"])
        >>> td = VmapModule(lin, vmap_dim=1)(TensorDict({"x": torch.randn(4, 5, 3)}, [4, 5]))
        >>> td["y"].shape
        torch.Size([4, 5, 2])
    """

    def __init__(self, module: TensorDictModuleBase, vmap_dim: int | None = None, mock: bool = False) -> None:
        super().__init__()
        self.module = module
        self.vmap_dim, self.mock = vmap_dim, bool(mock)
        self.in_keys = list(module.in_keys)
        self.out_keys = list(module.out_keys)

    def forward(self, tensordict: Any) -> Any:
        dim = tensordict.ndim - 1 if self.vmap_dim is None else self.vmap_dim
        if tensordict.ndim == 0 or not -tensordict.ndim <= dim < tensordict.ndim:
            raise ValueError(f"VmapModule: vmap_dim={dim} is not a batch dim of batch size "
                             f"{list(tensordict.batch_size)}")
        dim = dim % tensordict.ndim
        if self.mock:
            out = torch.stack([self.module(td) for td in tensordict.unbind(dim)], dim)
        else:
            out = torch.vmap(self.module, (dim,), dim)(tensordict)
        return tensordict.update(out.select(*self.out_keys))


class QValueHook:
    """A forward hook making a Q-network return ``(action, action_value, chosen_action_value)``.

    Register it with ``net.register_forward_hook(QValueHook("one_hot"))``; the arguments are
    those of :class:`QValueModule`.

    Example:
        >>> import torch
        >>> net = torch.nn.Linear(3, 4)
        >>> _ = net.register_forward_hook(QValueHook("one_hot"))
        >>> action, values, chosen = net(torch.randn(5, 3))
        >>> action.shape, chosen.shape
        (torch.Size([5, 4]), torch.Size([5, 1]))
    """

    _event_dims = 1

    def __init__(self, action_space: str, var_nums: int | None = None, action_value_key: Any = None,
                 action_mask_key: Any = None, out_keys: Sequence[Any] | None = None) -> None:
        self.qvalue_model = QValueModule(action_space, action_value_key=action_value_key,
                                         action_mask_key=action_mask_key, out_keys=out_keys, var_nums=var_nums)
        self.action_value_key = self.qvalue_model.in_keys[0]

    def __call__(self, net: nn.Module, observation: Any, values: Tensor) -> tuple[Tensor, ...]:
        td = TensorDict({self.action_value_key: values}, values.shape[: values.ndim - self._event_dims])
        td = self.qvalue_model(td)
        return tuple(td.get(k) for k in self.qvalue_model.out_keys)


class DistributionalQValueHook(QValueHook):
    """:class:`QValueHook` for distributional Q-networks (output
    ``[*batch, n_atoms, n_actions]`` log-probabilities over ``support``).

    Example:
        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Unflatten(-1, (4, 2)),
        ...                           torch.nn.LogSoftmax(-2))
        >>> _ = net.register_forward_hook(DistributionalQValueHook("categorical", torch.arange(4.0)))
        >>> action, values = net(torch.randn(5, 3))
        >>> action.shape, values.shape
        (torch.Size([5]), torch.Size([5, 4, 2]))
    """

    _event_dims = 2

    def __init__(self, action_space: str, support: Tensor, var_nums: int | None = None,
                 action_value_key: Any = None, action_mask_key: Any = None,
                 out_keys: Sequence[Any] | None = None) -> None:
        self.qvalue_model = DistributionalQValueModule(
            action_space, support, action_value_key=action_value_key, action_mask_key=action_mask_key,
            out_keys=out_keys, var_nums=var_nums)
        self.action_value_key = self.qvalue_model.in_keys[0]
