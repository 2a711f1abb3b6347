"""Lazy imports of optional packages, with an error that says what to install."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["import_optional"]


def import_optional(module: str, *, extra: str | None, purpose: str, package: str | None = None
                    ) -> ModuleType:
    """``importlib.import_module(module)``, or an ``ImportError`` naming what to install.

    Args:
        module: the module to import (``"tensorboard"``, ``"onnxruntime"`` ...).
        extra: the steersman extra that installs it (``"record"``), or None for a
            default dependency (then the message says ``pip install <package>``).
        purpose: what needs it, for the message (``"TensorboardLogger"``).
        package: the pip name when it differs from the module name.

    Example:
        >>> import_optional("json", extra=None, purpose="demo").__name__
        'json'
        >>> try:
        ...     import_optional("no_such_mod", extra="record", purpose="the demo")
        ... except ImportError as e:
        ...     print(e)
        the demo needs the 'no_such_mod' package: pip install 'steersman[record]' (or pip install no_such_mod)
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        pip_name = package or module.split(".")[0]
        how = (f"pip install 'steersman[{extra}]' (or pip install {pip_name})" if extra
               else f"pip install {pip_name}")
        raise ImportError(f"{purpose} needs the '{pip_name}' package: {how}") from err
