"""L2: data. Tensor specs (replay buffers come later)."""

from .specs import *  # noqa: F403
from .specs import __all__ as _specs_all

__all__ = list(_specs_all)
