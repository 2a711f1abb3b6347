"""Hashing modules for maps keyed by tensors (TorchRL's ``torchrl.data.map`` names).

* :class:`BinaryToDecimal`: rows of bits -> integers.
* :class:`SipHash`: rows of any tensor -> one int64 per row (a keyed 64-bit hash of
  the row's bytes).
* :class:`RandomProjectionHash`: a fixed random projection to a few components, cast
  to a low-precision dtype (so nearby inputs collide on purpose), then :class:`SipHash`.
* :class:`HashToInt`: hash values -> contiguous storage indices ``0, 1, 2, ...`` in
  order of first appearance.

Difference on purpose: TorchRL's ``SipHash`` goes through Python's builtin ``hash``,
whose value changes between processes unless ``PYTHONHASHSEED`` is set. Here the hash
is BLAKE2b with a fixed key: the same row gives the same value in every process and
run, so maps and their saved states stay valid across runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["BinaryToDecimal", "HashToInt", "RandomProjectionHash", "SipHash"]

_KEY = b"steersman.map"


def _row_hashes(x: Tensor) -> list[int]:
    rows = x.detach().to("cpu").contiguous()
    if rows.dtype == torch.bool:
        rows = rows.to(torch.uint8)
    raw = rows.reshape(rows.shape[0], -1).view(torch.uint8).numpy() if rows.numel() else None
    out = []
    for i in range(rows.shape[0]):
        data = raw[i].tobytes() if raw is not None else b""
        out.append(int.from_bytes(hashlib.blake2b(data, digest_size=8, key=_KEY).digest(), "little", signed=True))
    return out


class BinaryToDecimal(nn.Module):
    """Reads the last dim of a tensor of bits as base-2 numbers of ``num_bits`` bits
    (most significant first) and sums them when the last dim holds several.

    Args:
        num_bits (int): bits per number; the input's last dim must be a multiple of it.
        device: device of the bases table.
        dtype (torch.dtype): output dtype.
        convert_to_binary (bool): map the input to bits first (``x > 0``). Default False.

    Shapes: ``[*B, k * num_bits] -> [*B]``.

    Examples:
        >>> b2d = BinaryToDecimal(num_bits=4, device="cpu", dtype=torch.int32, convert_to_binary=True)
        >>> b2d(torch.tensor([[0, 0, 1, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0, 10, 0]]))
        tensor([3, 2], dtype=torch.int32)
    """

    def __init__(self, num_bits: int, device: torch.device | str | None, dtype: torch.dtype,
                 convert_to_binary: bool = False) -> None:
        super().__init__()
        if isinstance(num_bits, bool) or not isinstance(num_bits, int) or not 1 <= num_bits <= 62:
            raise ValueError(f"BinaryToDecimal: num_bits must be an int in [1, 62], got {num_bits!r}")
        self.num_bits = num_bits
        self.dtype = dtype
        self.convert_to_binary = convert_to_binary
        self.register_buffer("bases", 2 ** torch.arange(num_bits - 1, -1, -1, device=device, dtype=torch.int64),
                             persistent=False)

    def forward(self, features: Tensor) -> Tensor:
        n = features.shape[-1]
        if n % self.num_bits:
            raise ValueError(f"BinaryToDecimal: the input's last dim ({n}) must be a multiple of num_bits "
                             f"({self.num_bits})")
        bits = (features > 0) if self.convert_to_binary else features
        bits = bits.to(torch.int64).reshape(*features.shape[:-1], n // self.num_bits, self.num_bits)
        return (bits * self.bases).sum(-1).sum(-1).to(self.dtype)


class SipHash(nn.Module):
    """One 64-bit hash per row of a ``[B, F]`` tensor (of any dtype): equal rows (same
    dtype, same values) give equal hashes, in every process and run (see the module
    docs for the difference from TorchRL).

    Args:
        as_tensor (bool): return an int64 tensor ``[B]`` (default) or a list of ints.

    Examples:
        >>> h = SipHash()
        >>> a = torch.tensor([[0.1, 0.2], [0.3, 0.4], [0.1, 0.2]])
        >>> out = h(a)
        >>> out.shape, out.dtype, bool(out[0] == out[2]), bool(out[0] == out[1])
        (torch.Size([3]), torch.int64, True, False)
    """

    def __init__(self, as_tensor: bool = True) -> None:
        super().__init__()
        self.as_tensor = as_tensor

    def forward(self, x: Tensor) -> Tensor | list[int]:
        if not isinstance(x, Tensor) or x.ndim < 1:
            raise ValueError(f"SipHash: expected a tensor [batch, features], got "
                             f"{list(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
        hashes = _row_hashes(x)
        if self.as_tensor:
            return torch.tensor(hashes, dtype=torch.int64, device=x.device)
        return hashes


class RandomProjectionHash(SipHash):
    """A fixed random projection of ``[B, F]`` rows to ``n_components`` values, cast to
    ``dtype_cast`` (coarse: inputs that differ by less than its precision collide), then
    hashed by :class:`SipHash`. The projection is drawn on the first call (or by
    :meth:`fit`) from a generator seeded with ``seed`` (default 0); no sklearn needed.

    Keyword Args:
        n_components (int): projected size (default 16).
        dtype_cast (torch.dtype): dtype of the projection before hashing (default bfloat16).
        as_tensor (bool): see :class:`SipHash`.
        init_method (callable): fills the ``[F, n_components]`` projection in place
            (default: normal entries scaled by ``1 / sqrt(F)``).
        seed (int): seed of the projection.

    Examples:
        >>> h = RandomProjectionHash(n_components=4)
        >>> x = torch.randn(3, 10)
        >>> out = h(x)
        >>> out.shape, bool((out == h(x.clone())).all())
        (torch.Size([3]), True)
    """

    def __init__(self, *, n_components: int | None = None, dtype_cast: torch.dtype = torch.bfloat16,
                 as_tensor: bool = True, init_method: Callable[[Tensor], Tensor | None] | None = None,
                 seed: int = 0, **kwargs: Any) -> None:
        super().__init__(as_tensor=as_tensor)
        if kwargs:
            raise TypeError(f"RandomProjectionHash: unexpected keyword arguments {sorted(kwargs)}")
        self._n_components = 16 if n_components is None else int(n_components)
        if self._n_components < 1:
            raise ValueError(f"RandomProjectionHash: n_components must be >= 1, got {n_components!r}")
        self.dtype_cast = dtype_cast
        self.init_method = init_method
        self.seed = seed
        self.register_buffer("projection", None)

    @property
    def n_components(self) -> int:
        return self._n_components

    def fit(self, x: Tensor) -> None:
        """Draws the ``[F, n_components]`` projection for inputs like ``x`` ``[B, F]``."""
        features = x.shape[-1]
        proj = torch.empty(features, self._n_components, dtype=torch.float32)
        if self.init_method is not None:
            out = self.init_method(proj)
            proj = proj if out is None else out
        else:
            gen = torch.Generator().manual_seed(self.seed)
            proj = torch.randn(features, self._n_components, generator=gen) / features ** 0.5
        self.projection = proj.to(x.device)

    def forward(self, x: Tensor) -> Tensor | list[int]:
        if self.projection is None:
            self.fit(x)
        if x.shape[-1] != self.projection.shape[0]:
            raise ValueError(f"RandomProjectionHash: fitted on {self.projection.shape[0]} features, got an input "
                             f"with {x.shape[-1]} (shape {list(x.shape)})")
        z = (x.to(self.projection.dtype) @ self.projection).to(self.dtype_cast)
        return super().forward(z)


class HashToInt(nn.Module):
    """Maps hash values to contiguous indices: the first new hash gets 0, the next 1,
    and so on; a known hash gets its index back. Stateful: :meth:`state_dict` /
    :meth:`load_state_dict` save and restore the table.

    Shapes: ``[*B]`` int64 hashes -> ``[*B]`` int64 indices.

    Examples:
        >>> h2i = HashToInt()
        >>> h2i(torch.tensor([17, -5, 17, 99]))
        tensor([0, 1, 0, 2])
        >>> h2i(torch.tensor([99, 3]))
        tensor([2, 3])
    """

    def __init__(self) -> None:
        super().__init__()
        self._index: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._index)

    def forward(self, key: Tensor, extend: bool = True) -> Tensor:
        table = self._index
        out = []
        for h in key.reshape(-1).tolist():
            i = table.get(h)
            if i is None:
                if not extend:
                    i = -1
                else:
                    i = table[h] = len(table)
            out.append(i)
        return torch.tensor(out, dtype=torch.int64, device=key.device).reshape(key.shape)

    def lookup(self, key: Tensor) -> Tensor:
        """Indices of known hashes, -1 for unknown ones (the table is not extended)."""
        return self.forward(key, extend=False)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        keys = list(self._index)
        return {"keys": torch.tensor(keys, dtype=torch.int64),
                "values": torch.tensor([self._index[k] for k in keys], dtype=torch.int64)}

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True, assign: bool = False) -> Any:  # type: ignore[override]
        missing = {"keys", "values"} - set(state_dict)
        if missing:
            raise KeyError(f"HashToInt.load_state_dict: missing entries {sorted(missing)}")
        keys, values = state_dict["keys"], state_dict["values"]
        if keys.shape != values.shape:
            raise ValueError(f"HashToInt.load_state_dict: keys {list(keys.shape)} and values {list(values.shape)} "
                             "must have the same shape")
        self._index = dict(zip(keys.tolist(), values.tolist(), strict=True))
        return None
