"""The worker process of the multi-process collectors: one :class:`Collector` per worker.

Wire protocol (``multiprocessing`` pipes; framed messages, see ``envs.batched.pool``):

parent -> worker (first byte):
  ``N`` + flag: collect one batch (flag 1: random actions, for ``init_random_frames``);
  ``S``: send the state dict; ``L`` + pickle: load a state dict; ``D`` + pickle
  ``(seed, static)``: seed the env; ``R``: reset the env; ``C``: close and exit.

worker -> parent:
  ``K`` (+ pickled result): done; ``E`` + pickled ``(type, message, traceback)``: an
  exception; for ``N``: ``F`` + pickled :class:`~._buffer.Layout` when the batch buffer
  is new (the first batch, or new entries; its memfd descriptor attached to the message;
  without shared memory the pickle also holds the bytes), else ``B`` (+ the bytes
  without shared memory).

A worker checks the shared policy weights' version before every batch and copies new
weights into its policy (:class:`~._policy.SharedWeights`). It exits when told to, when
its pipe closes, or when its parent dies (parent-death signal and watchdog, as
``ParallelEnv`` workers: both run in ``envs.batched.pool``).
"""

from __future__ import annotations

import pickle
from typing import Any

import torch

from steersman.envs.batched.pool import OK, serve

from ._policy import SharedWeights, weights_of
from ._shm import SharedMemory, send_with_fd
from .collector import Collector

__all__ = ["worker_main", "COLLECT", "STATE", "LOAD", "SEED", "RESET", "CLOSE", "PROFILE"]

COLLECT = b"N"[0]
STATE = b"S"[0]
LOAD = b"L"[0]
SEED = b"D"[0]
RESET = b"R"[0]
CLOSE = b"C"[0]
PROFILE = b"P"[0]
FIRST = b"F"
BATCH = b"B"


def worker_state(collector: Collector) -> dict:
    """The collector's state dict plus this process's torch RNG state (random actions and
    stochastic policies draw from it)."""
    out = collector.state_dict()
    out["torch_rng_state"] = torch.get_rng_state()
    return out


def load_worker_state(collector: Collector, state: dict) -> None:
    state = dict(state)
    rng = state.pop("torch_rng_state", None)
    collector.load_state_dict(state)
    if rng is not None:
        torch.set_rng_state(rng)


def worker_main(idx: int, conn: Any, payload: bytes, weights: SharedWeights | None, shared: bool) -> None:
    """The body of a collector worker (run by ``pool.bootstrap``): builds its collector,
    then serves commands (``pool.serve``).

    ``payload``: the pickled ``dict(create_env_fn, policy, kwargs, num_workers)``
    (standard pickle, tensors by value; cloudpickle for lambdas).
    """
    serve(conn.fileno(), lambda: _setup(idx, conn.fileno(), payload, weights, shared))


def _setup(idx: int, fd: int, payload: bytes, weights: SharedWeights | None, shared: bool) -> tuple[Any, Any, bytes]:
    """Builds the worker's collector and its command handler (see ``pool.serve``)."""
    spec = pickle.loads(payload)
    if spec.get("init_fn") is not None:
        spec["init_fn"]()
    policy = spec["policy"] if spec.get("policy_factory") is None else spec["policy_factory"]()
    collector = Collector(spec["create_env_fn"], policy, **spec["kwargs"])
    collector._set_traj_id_scheme(spec["num_workers"], idx)
    memories: list[SharedMemory] = []
    if shared:
        def allocate(nbytes: int) -> torch.Tensor:
            mem = SharedMemory(nbytes, name="steersman-collector-batch")
            memories.append(mem)
            return mem.tensor

        collector._allocate = allocate
    own_weights = weights_of(collector.policy) if weights is not None else None
    seen = 0
    described = None
    def handle(msg: bytes) -> bytes | None:
        nonlocal seen, described
        cmd = msg[0]
        if cmd == COLLECT:
            if weights is not None:
                seen = weights.read_into(own_weights, seen)
                collector._policy_version = max(0, seen // 2 - 1)  # 2 per write; the first at start
            collector._rollout(random=msg[1] == 1)
            buf = collector._buffer
            if buf is described:
                return BATCH if shared else BATCH + buf.memory.numpy().tobytes()
            described = buf  # a new buffer (the first, or new entries)
            if not shared:
                return FIRST + pickle.dumps((buf.layout, buf.memory.numpy().tobytes()))
            del memories[:-1]  # the previous buffers' memory
            send_with_fd(fd, FIRST + pickle.dumps(buf.layout), memories[-1].fd)
            memories[-1].close_fd()  # the parent has its own descriptor now
            return None
        if cmd == STATE:
            state = worker_state(collector)
            state["weights_version"] = seen
            return OK + pickle.dumps(state)
        if cmd == LOAD:
            state = pickle.loads(msg[1:])
            # the weights version the worker had copied: newer shared weights (if any) are
            # copied before the next batch, as they were after the save
            seen = int(state.pop("weights_version", 0))
            load_worker_state(collector, state)
            return OK
        if cmd == SEED:
            seed, static = pickle.loads(msg[1:])
            return OK + pickle.dumps(collector.set_seed(seed, static_seed=static))
        if cmd == RESET:
            collector.reset()
            return OK
        if cmd == PROFILE:
            from .profile import Profiling
            collector._profiling = Profiling(pickle.loads(msg[1:]), idx)
            return OK
        raise RuntimeError(f"unknown command {msg[:1]!r}")

    return handle, collector.shutdown, OK
