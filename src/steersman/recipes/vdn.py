"""VDN (Sunehag et al., 2017): :mod:`~steersman.recipes.qmix` with the team value the sum of
the agents' chosen Q-values (:class:`~steersman.modules.VDNMixer`, no state, no mixing
parameters); the rest (networks, loop, defaults) is the QMIX recipe's.

Run it: ``steersman train vdn``; from Python::

    from steersman.recipes.vdn import VDNConfig, train
    summary = train(VDNConfig(total_frames=100_000), "runs/vdn")
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import qmix
from .qmix import QMIXConfig, make_mixer, make_policy

__all__ = ["VDNConfig", "make_mixer", "make_policy", "train"]


#: the recipe trains on discrete actions (integer indices): its env is built with ``categorical_actions=True``
CATEGORICAL_ACTIONS = True

@dataclass
class VDNConfig(QMIXConfig):
    """Configuration of the VDN recipe: QMIX's, with the sum as mixer."""

    mixer: str = "vdn"
    """Value mixer: vdn (sum) or qmix (state-conditioned monotonic mixing)."""


def train(cfg: VDNConfig | None = None, run_dir: str | Path | None = None, *, resume: bool = False) -> dict[str, Any]:
    """Trains VDN as configured, writing ``run_dir``; returns the run's summary."""
    return qmix.train(cfg if cfg is not None else VDNConfig(), run_dir, resume=resume, algo="vdn")


if __name__ == "__main__":  # pragma: no cover
    train()
