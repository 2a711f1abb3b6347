"""L5: collection, replay and evaluation on Ray (``pip install 'steersman[ray]'``).

``RayCollector`` runs steersman collectors in Ray actors (one machine or a cluster),
``RayReplayBuffer`` (alias ``RemoteTensorDictReplayBuffer``) keeps any steersman replay
buffer in an actor, ``RayEvalWorker`` evaluates in one. ``ray`` is imported only when
these are used: importing this package works without it, using them raises an
ImportError naming the extra. See ``docs/distributed.md``.
"""

from ._ray import RAY_EXTRA, init_ray, require_ray, shm_bytes, shutdown_ray
from .collector import RayCollector, RayCollectorError
from .evaluation import RayEvalWorker
from .replay_buffer import RayReplayBuffer, RemoteTensorDictReplayBuffer

__all__ = [
    "RAY_EXTRA",
    "RayCollector",
    "RayCollectorError",
    "RayEvalWorker",
    "RayReplayBuffer",
    "RemoteTensorDictReplayBuffer",
    "init_ray",
    "require_ray",
    "shm_bytes",
    "shutdown_ray",
]
