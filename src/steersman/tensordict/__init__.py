"""L0: the container. ``TensorDict`` and friends; imports only torch, numpy and the stdlib."""

from . import pytree as _pytree  # noqa: F401  (registers TensorDict as a pytree node)
from ._utils import NestedKey, unravel_key, unravel_key_list
from .append import append_memmap
from .arrow_io import from_arrow, from_pandas, from_parquet, to_arrow
from .base import TensorDictBase, is_tensor_collection
from .consolidate import from_consolidated
from .constructors import (
    from_any,
    from_csv,
    from_dict,
    from_h5,
    from_json,
    from_namedtuple,
    from_pytree,
    from_struct_array,
    from_tuple,
    fromkeys,
    make_tensordict,
    merge_tensordicts,
)
from .files import LoadError
from .functional import cat, maybe_dense_stack, pad, pad_sequence, stack, where
from .helpers import (
    KEY_SEPARATOR,
    NonTensorDataBase,
    TensorCollection,
    assert_allclose_td,
    assert_close,
    collate,
    default_is_leaf,
    dense_stack_tds,
    group_by,
    is_bool,
    is_floating,
    is_inexact,
    is_integer,
    is_leaf_nontensor,
    is_memmap_archive,
    pack_memmap,
    unpack_memmap,
    unpad_sequence,
    unravel_key_to_tuple,
)
from .io import load, load_memmap, save
from .lazy import LazyStackedTensorDict, lazy_stack
from .memmap import MemoryMappedTensor
from .module_params import ensemble_call, from_module, from_modules, shared_copy
from .nontensor import MetaData, NonTensorData, NonTensorStack, is_non_tensor
from .params import TensorDictParams
from .parse import parse_tensor_dict_string
from .persistent import PersistentTensorDict, to_h5
from .safetensors_io import from_safetensors, to_safetensors
from .switches import (
    capture_non_tensor_stack,
    get_defaults_to_none,
    get_printoptions,
    lazy_legacy,
    list_to_stack,
    set_capture_non_tensor_stack,
    set_get_defaults_to_none,
    set_lazy_legacy,
    set_list_to_stack,
    set_printoptions,
)
from .td import TensorDict
from .tensorclass import TensorClass, from_dataclass, is_tensorclass, tensorclass
from .typed import TypedTensorDict
from .unbatched import UnbatchedTensor

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
    "LoadError",
    "TensorDictParams",
    "from_module",
    "from_modules",
    "ensemble_call",
    "shared_copy",
    "PersistentTensorDict",
    "to_h5",
    "to_safetensors",
    "from_safetensors",
    "from_arrow",
    "to_arrow",
    "from_pandas",
    "from_parquet",
    "set_list_to_stack",
    "list_to_stack",
    "set_lazy_legacy",
    "lazy_legacy",
    "set_capture_non_tensor_stack",
    "capture_non_tensor_stack",
    "set_get_defaults_to_none",
    "get_defaults_to_none",
    "set_printoptions",
    "get_printoptions",
    "from_any",
    "from_csv",
    "from_dict",
    "from_h5",
    "from_json",
    "from_namedtuple",
    "from_pytree",
    "from_struct_array",
    "from_tuple",
    "fromkeys",
    "make_tensordict",
    "merge_tensordicts",
    "TensorClass",
    "KEY_SEPARATOR",
    "assert_allclose_td",
    "assert_close",
    "default_is_leaf",
    "dense_stack_tds",
    "group_by",
    "is_bool",
    "is_floating",
    "is_inexact",
    "is_integer",
    "is_leaf_nontensor",
    "is_memmap_archive",
    "pack_memmap",
    "unpack_memmap",
    "unravel_key_to_tuple",
    "NonTensorDataBase",
    "TensorCollection",
    "collate",
    "unpad_sequence",
    "parse_tensor_dict_string",
    "from_consolidated",
    "append_memmap",
    "TypedTensorDict",
    "UnbatchedTensor",
]
