"""Maps keyed by tensors (TorchRL's ``torchrl.data.map``): hashing modules, the query
module that turns TensorDict entries into storage indices, and ``TensorDictMap``."""

from .hash import BinaryToDecimal, HashToInt, RandomProjectionHash, SipHash
from .query import QueryModule
from .tdstorage import TensorDictMap, TensorMap

__all__ = ["BinaryToDecimal", "HashToInt", "QueryModule", "RandomProjectionHash", "SipHash", "TensorDictMap",
           "TensorMap"]
from .tree import MCTSForest, Tree  # noqa: E402

__all__ += ["MCTSForest", "Tree"]
