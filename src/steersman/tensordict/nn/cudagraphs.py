"""``CudaGraphModule``: replays a captured CUDA graph of a module's call.

On CUDA the first ``warmup`` calls run eagerly (on a side stream, as CUDA graphs need),
the next one is captured, and every later call copies its inputs into the captured
buffers and replays the graph: a much cheaper launch for small policies. On CPU (or
when CUDA is unavailable) the wrapper calls the module directly, with the same API, so
a script written for a GPU runs unchanged.

Inputs of every replayed call must have the shapes, dtypes and keys of the captured
one (a different one raises ``ValueError`` naming it); outputs are returned as clones
(the captured buffers are overwritten by the next replay).

Example:
    >>> import torch
    >>> from torch import nn
    >>> from steersman.tensordict import TensorDict
    >>> from steersman.tensordict.nn import CudaGraphModule, TensorDictModule
    >>> policy = TensorDictModule(nn.Linear(3, 2), in_keys=["obs"], out_keys=["action"])
    >>> fast = CudaGraphModule(policy, warmup=2)
    >>> fast(TensorDict(obs=torch.zeros(4, 3), batch_size=[4]))["action"].shape
    torch.Size([4, 2])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ..base import is_tensor_collection

__all__ = ["CudaGraphModule"]


class CudaGraphModule(nn.Module):
    """Wraps ``module`` (a TensorDict module or any callable on tensors) for CUDA graphs.

    Args:
        module: what to call.
        warmup: eager calls before the capture (CUDA only).
        in_keys, out_keys: accepted for tensordict's signature; the keys are the
            module's (a TensorDict input is captured whole).
        device: the CUDA device to capture on (default: the current one).

    ``graph_captured`` tells whether a graph is in use; on CPU it stays False.
    """

    def __init__(self, module: Callable, warmup: int = 2, in_keys: Any = None, out_keys: Any = None,
                 device: Any = None) -> None:
        super().__init__()
        if not isinstance(warmup, int) or warmup < 1:
            raise ValueError(f"CudaGraphModule: warmup must be an int >= 1, got {warmup!r}")
        self.module = module
        self.warmup = warmup
        self.in_keys = in_keys if in_keys is not None else getattr(module, "in_keys", None)
        self.out_keys = out_keys if out_keys is not None else getattr(module, "out_keys", None)
        self.device = device
        self._calls = 0
        self._graph: Any = None
        self._static_in: Any = None
        self._static_out: Any = None

    @property
    def graph_captured(self) -> bool:
        return self._graph is not None

    def _on_cuda(self, args: tuple) -> bool:
        if not torch.cuda.is_available():
            return False
        for a in args:
            dev = a.device if isinstance(a, Tensor) else getattr(a, "device", None)
            if dev is not None and torch.device(dev).type == "cuda":
                return True
        return False

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs or not self._on_cuda(args):
            return self.module(*args, **kwargs)
        if self._graph is not None:
            self._copy_in(args)
            self._graph.replay()
            return _clone(self._static_out)
        self._calls += 1
        if self._calls <= self.warmup:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                out = self.module(*args)
            torch.cuda.current_stream().wait_stream(stream)
            return out
        self._static_in = tuple(_clone(a) for a in args)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._static_out = self.module(*self._static_in)
        self._graph = graph
        self._copy_in(args)
        graph.replay()
        return _clone(self._static_out)

    def _copy_in(self, args: tuple) -> None:
        if len(args) != len(self._static_in):
            raise ValueError(f"CudaGraphModule: captured with {len(self._static_in)} inputs, got {len(args)}")
        for i, (dst, src) in enumerate(zip(self._static_in, args)):
            if isinstance(dst, Tensor):
                if src.shape != dst.shape or src.dtype != dst.dtype:
                    raise ValueError(f"CudaGraphModule: input {i} is {list(src.shape)} {src.dtype}, the "
                                     f"captured one {list(dst.shape)} {dst.dtype}")
                dst.copy_(src)
            elif is_tensor_collection(dst):
                if set(dst.keys(True, True)) != set(src.keys(True, True)):
                    raise ValueError(f"CudaGraphModule: input {i} has keys {sorted(map(str, src.keys(True, True)))}, "
                                     f"the captured one {sorted(map(str, dst.keys(True, True)))}")
                dst.update_(src)

    def reset(self) -> None:
        """Drops the captured graph (the next calls warm up and capture again)."""
        self._graph, self._static_in, self._static_out, self._calls = None, None, None, 0


def _clone(x: Any) -> Any:
    if isinstance(x, Tensor) or is_tensor_collection(x):
        return x.clone()
    if isinstance(x, tuple):
        return tuple(_clone(v) for v in x)
    return x
