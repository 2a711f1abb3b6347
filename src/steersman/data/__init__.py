"""L2: data. Tensor specs and replay buffers (storages, samplers, writers)."""

from .postprocs import MultiStep
from .replay_buffers import *  # noqa: F403
from .replay_buffers import __all__ as _rb_all
from .specs import *  # noqa: F403
from .specs import __all__ as _specs_all
from .utils import DEVICE_TYPING, create_infinite_iterator

__all__ = list(_specs_all) + list(_rb_all) + ["DEVICE_TYPING", "create_infinite_iterator", "MultiStep"]

# maps keyed by tensors (TorchRL's torchrl.data.map)
from .map import (  # noqa: E402
    BinaryToDecimal,
    HashToInt,
    QueryModule,
    RandomProjectionHash,
    SipHash,
    TensorDictMap,
    TensorMap,
)

__all__ += ["BinaryToDecimal", "HashToInt", "QueryModule", "RandomProjectionHash", "SipHash", "TensorDictMap",
            "TensorMap"]

# RLHF KL-coefficient controllers (TorchRL's torchrl.data names)
from .rlhf import AdaptiveKLController, ConstantKLController  # noqa: E402

__all__ += ["AdaptiveKLController", "ConstantKLController"]

# MCTS forests of rollouts (TorchRL's torchrl.data.MCTSForest / Tree)
from .map import MCTSForest, Tree  # noqa: E402

__all__ += ["MCTSForest", "Tree"]
