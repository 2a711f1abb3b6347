"""steersman: a PyTorch-native library for reinforcement learning, control and decision making."""

from .tensordict import (  # noqa: F401
    LazyStackedTensorDict,
    MemoryMappedTensor,
    NonTensorData,
    NonTensorStack,
    TensorDict,
    TensorDictBase,
    is_tensor_collection,
    lazy_stack,
    tensorclass,
)

__version__ = "0.1.0"
