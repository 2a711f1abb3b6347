"""IPPO (de Witt et al., 2020): :mod:`~steersman.recipes.mappo` with a decentralised critic.

Each agent's value reads only its own observation (``centralized_critic=False``), and the
loss is :class:`~steersman.objectives.IPPOLoss`; the rest (networks, loop, defaults) is the
MAPPO recipe's.

Run it: ``steersman train ippo``; from Python::

    from steersman.recipes.ippo import IPPOConfig, train
    summary = train(IPPOConfig(total_frames=200_000), "runs/ippo")
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import mappo
from .mappo import MAPPOConfig, make_critic, make_policy

__all__ = ["IPPOConfig", "make_critic", "make_policy", "train"]


@dataclass
class IPPOConfig(MAPPOConfig):
    """Configuration of the IPPO recipe: MAPPO's, with a decentralised critic."""

    centralized_critic: bool = False
    """The critic reads each agent's own observation (IPPO); True: every agent's (MAPPO)."""


def train(cfg: IPPOConfig | None = None, run_dir: str | Path | None = None, *, resume: bool = False) -> dict[str, Any]:
    """Trains IPPO as configured, writing ``run_dir``; returns the run's summary."""
    return mappo.train(cfg if cfg is not None else IPPOConfig(), run_dir, resume=resume, algo="ippo")


if __name__ == "__main__":  # pragma: no cover
    train()
