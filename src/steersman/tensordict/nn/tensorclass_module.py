"""Modules that take and return tensorclasses: ``TensorClassModuleBase[In, Out]`` and
``TensorClassModuleWrapper`` (the TensorDict-in/TensorDict-out view of one).

Example:
    >>> import torch
    >>> from steersman.tensordict import TensorClass, TensorDict
    >>> class In(TensorClass):
    ...     a: torch.Tensor
    ...     b: torch.Tensor
    >>> class Out(TensorClass):
    ...     result: torch.Tensor
    >>> class Add(TensorClassModuleBase[In, Out]):
    ...     def forward(self, x: In) -> Out:
    ...         return Out(result=x.a + x.b, batch_size=x.batch_size)
    >>> Add()(In(a=torch.ones(2), b=torch.ones(2), batch_size=[2])).result
    tensor([2., 2.])
    >>> td_module = Add().as_td_module()
    >>> td_module.in_keys, td_module(TensorDict(a=torch.ones(2), b=torch.ones(2), batch_size=[2]))["result"]
    (['a', 'b'], tensor([2., 2.]))
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from ..tensorclass import is_tensorclass
from .common import TensorDictModuleBase

__all__ = ["TensorClassModuleBase", "TensorClassModuleWrapper"]


class TensorClassModuleBase(nn.Module):
    """Base of modules ``forward(x: In) -> Out`` on tensorclasses; subclass
    ``TensorClassModuleBase[In, Out]`` (each a tensorclass or ``torch.Tensor``), which sets
    ``input_type`` and ``output_type``."""

    input_type: type | None = None
    output_type: type | None = None

    def __class_getitem__(cls, params: Any) -> type:
        if not isinstance(params, tuple) or len(params) != 2:
            raise TypeError("TensorClassModuleBase[...] takes two types: [InputClass, OutputClass]")
        in_t, out_t = params
        for t in params:
            if not (is_tensorclass(t) or t is Tensor):
                raise TypeError(f"TensorClassModuleBase[...]: {t!r} is neither a tensorclass nor torch.Tensor")
        name = f"{cls.__name__}[{in_t.__name__}, {out_t.__name__}]"
        return type(name, (cls,), {"input_type": in_t, "output_type": out_t, "__module__": cls.__module__})

    def as_td_module(self) -> TensorClassModuleWrapper:
        """This module as a TensorDict module (both types must be tensorclasses)."""
        return TensorClassModuleWrapper(self)


class TensorClassModuleWrapper(TensorDictModuleBase):
    """Calls a :class:`TensorClassModuleBase` on a TensorDict: the input's fields are read
    from it, and a new TensorDict holding the output fields is returned (the input is not
    written). ``in_keys``/``out_keys`` are the fields of the two classes."""

    def __init__(self, module: TensorClassModuleBase) -> None:
        super().__init__()
        in_t, out_t = getattr(module, "input_type", None), getattr(module, "output_type", None)
        if not (is_tensorclass(in_t) and is_tensorclass(out_t)):
            raise ValueError(
                f"TensorClassModuleWrapper: {type(module).__name__} needs tensorclass input and output types "
                f"(subclass TensorClassModuleBase[In, Out]); got {in_t!r} and {out_t!r}"
            )
        self.module = module
        self.in_keys = list(in_t._field_names)
        self.out_keys = list(out_t._field_names)

    def forward(self, tensordict: Any) -> Any:
        in_t = self.module.input_type
        values = {k: tensordict.get(k) for k in self.in_keys if k in tensordict.keys()}
        x = in_t(**values, batch_size=tensordict.batch_size, device=tensordict.device)
        out = self.module(x)
        if not isinstance(out, self.module.output_type):
            raise TypeError(f"{type(self.module).__name__} returned a {type(out).__name__}, "
                            f"not its output type {self.module.output_type.__name__}")
        return out.to_tensordict()
