"""Vectorized envs: ``SerialEnv`` (in-process) and ``ParallelEnv`` (one process per
sub-env, shared-memory exchange), ``EnvCreator`` (a picklable env factory).

Both present ``num_workers`` copies of an env as one env of batch size
``[num_workers, *sub_batch]`` and produce identical data for identical seeds.
"""

from ._base import BatchedEnvBase, EnvWorkerError
from .async_pool import AsyncEnvPool, ProcessorAsyncEnvPool, ThreadingAsyncEnvPool
from .env_creator import EnvCreator, EnvMetaData, get_env_metadata
from .parallel import ParallelEnv, default_start_method
from .serial import SerialEnv

__all__ = [
    "SerialEnv",
    "ParallelEnv",
    "EnvCreator",
    "EnvMetaData",
    "EnvWorkerError",
    "BatchedEnvBase",
    "default_start_method",
    "get_env_metadata",
    "AsyncEnvPool",
    "ThreadingAsyncEnvPool",
    "ProcessorAsyncEnvPool",
]
