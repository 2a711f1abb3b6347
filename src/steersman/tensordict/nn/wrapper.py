"""``TensorDictModuleWrapper``: a module around a TensorDict module that behaves like it.

Attribute reads the wrapper lacks go to the wrapped module (``in_keys``, ``out_keys``,
its submodules...), and calling the wrapper calls it: subclasses override ``forward``
to add behaviour around the call (exploration noise, logging...).

Example:
    >>> import torch
    >>> from torch import nn
    >>> from steersman.tensordict import TensorDict
    >>> from steersman.tensordict.nn import TensorDictModule, TensorDictModuleWrapper
    >>> inner = TensorDictModule(nn.Linear(3, 2), in_keys=["obs"], out_keys=["action"])
    >>> w = TensorDictModuleWrapper(inner)
    >>> w.out_keys, w(TensorDict(obs=torch.zeros(3)))["action"].shape
    (['action'], torch.Size([2]))
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .common import TensorDictModuleBase

__all__ = ["TensorDictModuleWrapper"]


class TensorDictModuleWrapper(TensorDictModuleBase):
    """Wraps ``td_module``; see the module docstring."""

    def __init__(self, td_module: nn.Module) -> None:
        super().__init__()
        if not isinstance(td_module, nn.Module):
            raise TypeError(f"TensorDictModuleWrapper wraps an nn.Module, got {type(td_module).__name__}")
        self.td_module = td_module

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("__") or name == "td_module":
                raise
            return getattr(super().__getattr__("td_module"), name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.td_module(*args, **kwargs)
