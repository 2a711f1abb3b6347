"""steersman: a PyTorch-native library for reinforcement learning, control and decision making.

``import steersman`` is light: the container names below, plus the training API
(:func:`train`, :func:`load`, :class:`Agent`, from :mod:`steersman.api`) imported on
first use.
"""

from __future__ import annotations

from typing import Any

from .tensordict import (  # noqa: F401
    LazyStackedTensorDict,
    LoadError,
    MemoryMappedTensor,
    NonTensorData,
    NonTensorStack,
    TensorDict,
    TensorDictBase,
    is_tensor_collection,
    lazy_stack,
    tensorclass,
)

#: The one place the version is written: pyproject.toml reads it (setuptools dynamic version).
__version__ = "0.1.0"

#: names of steersman.api (L6) resolved on first access, so importing steersman stays cheap
_API = ("train", "load", "Agent", "TrainedRun", "Evaluation", "make_config")


def __getattr__(name: str) -> Any:
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'steersman' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
