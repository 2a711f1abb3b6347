"""``get_available_libraries``: which simulator libraries steersman can wrap here."""

from __future__ import annotations

import importlib.util

__all__ = ["get_available_libraries"]

#: library name -> the module that must be importable
_LIBRARIES = {
    "gymnasium": "gymnasium",
    "gym": "gymnasium",  # steersman's gym backend is Gymnasium
    "gym[atari]": "ale_py",
    "gym[mujoco]": "mujoco",
    "mujoco": "mujoco",
    "dm_control": "dm_control",
    "envpool": "envpool",
    "pettingzoo": "pettingzoo",
    "vmas": "vmas",
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def get_available_libraries() -> dict[str, bool]:
    """``{library: installed}`` for every simulator library steersman has a wrapper for.

    Nothing is imported (the check is ``importlib.util.find_spec``).

    Example:
        >>> from steersman.envs import get_available_libraries
        >>> libs = get_available_libraries()
        >>> "gymnasium" in libs and isinstance(libs["gymnasium"], bool)
        True
    """
    return {name: _installed(mod) for name, mod in _LIBRARIES.items()}
