"""``EnsembleModule``: one module, ``num_copies`` independently initialized parameter
sets, called in one ``torch.vmap``.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from steersman.tensordict import TensorDict
    >>> from steersman.tensordict.nn import EnsembleModule, TensorDictModule
    >>> m = TensorDictModule(nn.Linear(3, 2), in_keys=["obs"], out_keys=["q"])
    >>> ens = EnsembleModule(m, num_copies=4)
    >>> ens(TensorDict(obs=torch.randn(8, 3), batch_size=[8]))["q"].shape  # [copies, batch, 2]
    torch.Size([4, 8, 2])
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from ..module_params import from_modules
from .common import TensorDictModuleBase

__all__ = ["EnsembleModule"]


class EnsembleModule(TensorDictModuleBase):
    """Runs ``num_copies`` copies of ``module``, each with its own parameters, in one vmap.

    Args:
        module: a TensorDict module (its ``in_keys``/``out_keys`` are the ensemble's).
        num_copies: how many parameter sets (each reset with ``reset_parameters()`` where
            the submodules have it, so the copies differ).
        expand_input: if ``True`` (default), the input TensorDict is expanded to
            ``[num_copies, *batch]`` first; if ``False`` its leading dim must already be
            ``num_copies`` (one slice per copy).

    The parameters are ``self.params_td`` (a TensorDictParams with a leading
    ``[num_copies]`` dim): optimizers see them through ``parameters()``.
    """

    def __init__(self, module: TensorDictModuleBase, num_copies: int, expand_input: bool = True) -> None:
        super().__init__()
        if not isinstance(num_copies, int) or num_copies < 1:
            raise ValueError(f"EnsembleModule: num_copies must be a positive int, got {num_copies!r}")
        self.in_keys = list(module.in_keys)
        self.out_keys = list(module.out_keys)
        copies = []
        for _ in range(num_copies):
            c = copy.deepcopy(module)
            for sub in c.modules():
                if hasattr(sub, "reset_parameters") and sub is not c:
                    sub.reset_parameters()
            copies.append(c)
        self.params_td = from_modules(*copies, as_module=True)
        # the structure only (not a submodule: its own parameters are swapped out on every
        # call and must not reach an optimizer)
        self.__dict__["module"] = module
        self.num_copies = num_copies
        self.expand_input = expand_input

    def reset_parameters(self) -> None:
        """Re-initializes every copy (independently)."""
        for i in range(self.num_copies):
            c = copy.deepcopy(self.module)
            for sub in c.modules():
                if hasattr(sub, "reset_parameters") and sub is not c:
                    sub.reset_parameters()
            fresh = from_modules(c, as_module=False)
            with torch.no_grad():
                self.params_td.data[i].update_(fresh[0])

    def forward(self, tensordict: Any) -> Any:
        n = self.num_copies
        if self.expand_input:
            tensordict = tensordict.expand(n, *tensordict.batch_size)
        elif tensordict.batch_size[:1] != (n,):
            raise ValueError(
                f"EnsembleModule(expand_input=False): the input's leading batch dim must be {n}, "
                f"got batch_size {list(tensordict.batch_size)}"
            )
        module = self.module

        def call(params: Any, td: Any) -> Any:
            with params.to_module(module):
                return module(td)

        return torch.vmap(call, (0, 0), randomness="different")(self.params_td, tensordict)

    def extra_repr(self) -> str:
        return f"num_copies={self.num_copies}, expand_input={self.expand_input}"

