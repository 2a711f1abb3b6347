"""Multi-agent losses: :class:`MAPPOLoss`, :class:`IPPOLoss` (PPO on agent groups, with
optional value normalization) and :class:`QMixerLoss` (QMIX/VDN); :func:`agent_batch`
runs the single-agent losses (DQN for IQL, DDPG with a centralised critic for MADDPG,
SAC for MASAC) on a group's entries."""

from .ppo import IPPOLoss, MAPPOLoss
from .qmixer import QMixerLoss
from .utils import agent_batch

__all__ = ["MAPPOLoss", "IPPOLoss", "QMixerLoss", "agent_batch"]
