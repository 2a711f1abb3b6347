"""``QueryModule``: TensorDict entries -> a hash and a storage index (TorchRL's name)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from steersman.tensordict import TensorDictBase
from steersman.tensordict.nn import TensorDictModuleBase

from .hash import HashToInt, SipHash

__all__ = ["QueryModule"]


def _as_rows(x: Tensor, batch_dims: int) -> Tensor:
    """``[*B, ...] -> [prod(B), features]`` (a scalar entry becomes one feature)."""
    lead = x.shape[:batch_dims]
    return x.reshape(int(torch.tensor(lead).prod()) if lead else 1, -1)


class QueryModule(TensorDictModuleBase):
    """Hashes the ``in_keys`` entries of each element of a TensorDict and maps the hash
    to a storage index: writes ``hash_key`` (int64 ``[*B]``) and ``index_key`` (int64
    ``[*B]``, from ``hash_to_int``: new hashes get the next free index).

    Args:
        in_keys (list of keys): the entries that identify an element.
        index_key: output key of the index (default ``"_index"``).

    Keyword Args:
        hash_key: output key of the hash (default ``"_hash"``).
        hash_module (callable or list of callables): ``[N, F] -> [N]`` int64 hashes, one
            for all keys or one per key (default :class:`SipHash`).
        hash_to_int (callable): hashes -> indices (default a new :class:`HashToInt`).
        aggregator (callable): combines the per-key hashes, stacked ``[N, len(in_keys)]``,
            into one ``[N]`` hash (default: the hash module, or :class:`SipHash`).
        clone (bool): write into a shallow copy of the input instead of the input.

    With one key and one hash module, the entry's hash is the hash. Elements whose
    ``in_keys`` entries are equal get the same hash and index.

    Examples:
        >>> from steersman.tensordict import TensorDict
        >>> q = QueryModule(in_keys=["key1", "key2"], index_key="index", hash_module=SipHash())
        >>> td = TensorDict({"key1": torch.tensor([[1.], [1.], [1.], [2.]]),
        ...                  "key2": torch.tensor([[3.], [3.], [2.], [3.]])}, batch_size=[4])
        >>> q(td)["index"]
        tensor([0, 0, 1, 2])
    """

    def __init__(self, in_keys: Sequence[Any], index_key: Any = "_index", hash_key: Any = "_hash", *,
                 hash_module: Callable | list[Callable] | None = None, hash_to_int: Callable | None = None,
                 aggregator: Callable | None = None, clone: bool = False) -> None:
        super().__init__()
        in_keys = [in_keys] if isinstance(in_keys, (str, tuple)) else list(in_keys)
        if not in_keys:
            raise ValueError("QueryModule: in_keys must name at least one entry")
        self.in_keys = in_keys
        self.out_keys = [index_key, hash_key]
        self.index_key = index_key
        self.hash_key = hash_key
        if isinstance(hash_module, (list, tuple)):
            if len(hash_module) != len(in_keys):
                raise ValueError(f"QueryModule: got {len(hash_module)} hash modules for {len(in_keys)} in_keys; "
                                 "pass one module, or one per key")
            modules = list(hash_module)
            if aggregator is None:
                aggregator = SipHash()
        else:
            single = hash_module if hash_module is not None else SipHash()
            modules = [single] * len(in_keys)
            if aggregator is None:
                aggregator = single
        self.hash_modules = nn.ModuleList([m for m in modules if isinstance(m, nn.Module)])
        self._hash_fns = modules
        self.aggregator = aggregator
        self.hash_to_int = hash_to_int if hash_to_int is not None else HashToInt()
        self.clone = clone

    def hash(self, tensordict: TensorDictBase) -> Tensor:
        """The ``[*B]`` int64 hash of each element (no index is assigned)."""
        nb = tensordict.batch_dims
        batch = tensordict.batch_size
        hashes = []
        for key, fn in zip(self.in_keys, self._hash_fns, strict=True):
            x = tensordict.get(key, None)
            if x is None:
                raise KeyError(f"QueryModule: the input has no entry {key!r} (in_keys {self.in_keys}); it has "
                               f"{sorted(map(str, tensordict.keys(True, True)))}")
            hashes.append(torch.as_tensor(fn(_as_rows(x, nb))).reshape(-1))
        h = hashes[0] if len(hashes) == 1 else torch.as_tensor(self.aggregator(torch.stack(hashes, -1))).reshape(-1)
        return h.reshape(batch)

    def forward(self, tensordict: TensorDictBase, *, extend: bool = True, clone: bool | None = None
                ) -> TensorDictBase:
        h = self.hash(tensordict)
        if extend or not hasattr(self.hash_to_int, "lookup"):
            index = self.hash_to_int(h)
        else:
            index = self.hash_to_int.lookup(h)
        out = tensordict.copy() if (self.clone if clone is None else clone) else tensordict
        out.set(self.hash_key, h)
        out.set(self.index_key, torch.as_tensor(index).reshape(h.shape))
        return out
