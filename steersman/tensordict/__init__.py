"""L0: the container. ``TensorDict`` and friends; imports only torch, numpy and the stdlib."""

from ._utils import NestedKey, unravel_key, unravel_key_list
from .base import TensorDictBase, is_tensor_collection
from .td import TensorDict
from .nontensor import MetaData, NonTensorData, NonTensorStack, is_non_tensor
from .functional import cat, maybe_dense_stack, pad, pad_sequence, stack, where
from .memmap import MemoryMappedTensor
from .lazy import LazyStackedTensorDict, lazy_stack
from .tensorclass import from_dataclass, is_tensorclass, tensorclass
from .io import load, load_memmap, save

__all__ = [
    "TensorDict",
    "TensorDictBase",
    "LazyStackedTensorDict",
    "lazy_stack",
    "NonTensorData",
    "NonTensorStack",
    "MetaData",
    "MemoryMappedTensor",
    "NestedKey",
    "tensorclass",
    "is_tensorclass",
    "from_dataclass",
    "is_tensor_collection",
    "is_non_tensor",
    "unravel_key",
    "unravel_key_list",
    "stack",
    "cat",
    "where",
    "pad",
    "pad_sequence",
    "maybe_dense_stack",
    "save",
    "load",
    "load_memmap",
]
