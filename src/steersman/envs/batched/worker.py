"""What runs a sub-env of a batched env: :class:`EnvRunner` and the worker process body.

:class:`EnvRunner` executes one command on one sub-env, reading its inputs from and
writing its outputs to the sub-env's row of the exchange buffer (see ``_buffers``).
``SerialEnv`` calls runners in a loop in-process; ``ParallelEnv`` runs one per worker
process (:func:`worker_main`, served by ``pool.serve``), so both produce identical data.

Wire protocol (framed messages, see ``pool``; nothing pickled per step): parent ->
worker ``[command, flags] (+ in-section bytes without shared memory) (+ pickled extra:
reset kwargs, seeds)``; worker -> parent ``K``/``R`` (+ out-section bytes without shared
memory) (+ pickled result), or ``pool.pack_error``'s ``E`` message.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import torch

from steersman.tensordict import TensorDictBase

from ..common import EnvBase
from ._buffers import BufferLayout, build_td, get_entry
from .env_creator import EnvMetaData
from .pool import OK, serve
from .shm import SharedMemory

__all__ = ["EnvRunner", "worker_main"]

# commands (first byte of a parent message)
STEP = b"S"[0]
STEP_RESET = b"M"[0]
RESET = b"R"[0]
SEED = b"D"[0]
DATA_COMMANDS = frozenset({STEP, STEP_RESET, RESET})
# reset flags (second byte)
F_PARTIAL = 1
F_STATE = 2
F_KWARGS = 4
# replies (and pool.OK)
OK_RESET = b"R"  # step_and_maybe_reset: some sub-env was reset, the root section is written


class EnvRunner:
    """Runs commands on one env against its row of the exchange buffer.

    Args:
        env: the sub-env.
        layout: the buffer layout (from the sub-env's specs).
        row: the sub-env's row, ``uint8 [row_bytes]``.
    """

    def __init__(self, env: EnvBase, layout: BufferLayout, row: torch.Tensor) -> None:
        self.env = env
        self._bs = env.batch_size
        self._dev = env.device
        self._move = env.device != row.device
        in_pairs = layout.views(row, "in")
        self._mask = dict(in_pairs)["_reset"]
        self._in_pairs = [(k, v) for k, v in in_pairs if k != "_reset"]
        state_keys = set(_spec_keys(env.full_state_spec))
        self._state_pairs = [(k, v) for k, v in self._in_pairs if k in state_keys]
        next_pairs = layout.views(row, "next")
        root_pairs = layout.views(row, "root")
        self._next_keys = [k for k, _ in next_pairs]
        self._next_dsts = [v for _, v in next_pairs]
        self._root_keys = [k for k, _ in root_pairs]
        self._root_dsts = [v for _, v in root_pairs]
        reset_from = set(env._hot_plan()["reset_from"])
        # numpy views of the done flags: the cheapest "any" on a few bytes
        self._done_flags = [v.numpy() if v.device.type == "cpu" else v
                            for k, v in next_pairs if k in reset_from]
        self._name = type(env).__name__

    def _input(self, pairs: list) -> TensorDictBase:
        if self._move:
            pairs = [(k, v.to(self._dev, non_blocking=True)) for k, v in pairs]
        return build_td(pairs, self._bs, self._dev)

    def _write(self, keys: list, dsts: list, td: TensorDictBase, what: str) -> None:
        srcs = [get_entry(td, key) for key in keys]
        try:
            torch._foreach_copy_(dsts, srcs)  # one dispatch for all the leaves
            return
        except Exception:  # noqa: BLE001 - redo leaf by leaf for a precise error
            pass
        for key, dst, src in zip(keys, dsts, srcs):
            if src is None:
                raise KeyError(
                    f"{self._name}.{what} returned no entry {key!r}, which its specs declare "
                    f"(entries: {sorted(map(str, td.keys(include_nested=True, leaves_only=True)))})"
                )
            try:
                dst.copy_(src)
            except Exception as exc:
                raise ValueError(
                    f"{self._name}.{what} returned {key!r} of shape {list(getattr(src, 'shape', []))}, "
                    f"its spec says {list(dst.shape)}"
                ) from exc

    def step(self) -> None:
        td = self.env.step(self._input(self._in_pairs))
        self._write(self._next_keys, self._next_dsts, td.get("next"), "step")

    def step_and_maybe_reset(self) -> bool:
        """Steps (and resets what is done); returns whether a sub-env was reset.

        The root section (the next step's input) is written only then: otherwise it is
        ``step_mdp`` of the transition, which the parent builds itself.
        """
        td, td_next = self.env.step_and_maybe_reset(self._input(self._in_pairs))
        self._write(self._next_keys, self._next_dsts, td.get("next"), "step")
        for done in self._done_flags:
            if done.any():
                self._write(self._root_keys, self._root_dsts, td_next, "step_and_maybe_reset")
                return True
        return False

    def reset(self, flags: int = 0, kwargs: dict | None = None) -> None:
        pairs = list(self._state_pairs) if flags & F_STATE else []
        if flags & F_PARTIAL and len(self._bs):
            pairs.append(("_reset", self._mask.clone()))
        inp = self._input(pairs) if pairs else None
        out = self.env.reset(inp, **(kwargs or {}))
        self._write(self._root_keys, self._root_dsts, out, "reset")

    def set_seed(self, seed: int | None, static_seed: bool) -> int | None:
        return self.env.set_seed(seed, static_seed=static_seed)


def _spec_keys(spec: Any) -> list:
    return list(spec.keys(include_nested=True, leaves_only=True))


# ---------------------------------------------------------------------- worker body
def worker_main(idx: int, conn: Any, payload: bytes, shm: SharedMemory | None) -> None:
    """The body of a worker process (run by ``pool.bootstrap``): builds the env, then
    serves commands until told to close or until the parent goes away.

    ``payload``: the pickled ``(creator, layout, expected metadata)`` (standard pickle,
    tensors by value; cloudpickle for lambdas). ``shm``: the exchange buffer (None: data
    travels through the pipe).
    """
    serve(conn.fileno(), lambda: _setup(idx, payload, shm))


def _setup(idx: int, payload: bytes, shm: SharedMemory | None) -> tuple[Any, Any, bytes]:
    """Builds the env and its handler; replies ``OK``, or ``OK`` + the env's metadata when
    its specs differ from the parent's (the parent then raises, naming the difference)."""
    creator, layout, expected = pickle.loads(payload)
    shared = shm is not None
    row = shm.tensor.view(-1, layout.row_bytes)[idx] if shared else torch.zeros(layout.row_bytes, dtype=torch.uint8)
    env = creator()
    try:
        meta = EnvMetaData.from_env(env)
        if expected.mismatch(meta) is not None:
            return _mismatched, env.close, OK + pickle.dumps(meta)
        return _handler(EnvRunner(env, layout, row), row.numpy(), layout, shared), env.close, OK
    except BaseException:
        env.close()
        raise


def _mismatched(msg: bytes) -> bytes:
    raise RuntimeError("this worker's env has other specs than the parent's; it serves nothing")


def _handler(runner: EnvRunner, row_np: np.ndarray, layout: BufferLayout, shared: bool) -> Any:
    """The worker's command handler (see ``pool.serve``): runs a command, returns the reply."""
    in_lo, in_hi = layout.ranges["in"]
    out_lo, out_hi = layout.ranges["next"][0], layout.ranges["root"][1]

    def handle(msg: bytes) -> bytes:
        cmd = msg[0]
        if cmd in DATA_COMMANDS:
            pos = 2
            if not shared:
                n = in_hi - in_lo
                row_np[in_lo:in_hi] = np.frombuffer(msg, np.uint8, n, pos)
                pos += n
            reply = OK
            if cmd == STEP_RESET:
                if runner.step_and_maybe_reset():
                    reply = OK_RESET
            elif cmd == STEP:
                runner.step()
            else:
                flags = msg[1]
                runner.reset(flags, pickle.loads(msg[pos:]) if flags & F_KWARGS else None)
            return reply if shared else reply + row_np[out_lo:out_hi].tobytes()
        if cmd == SEED:
            seed, static = pickle.loads(msg[2:])
            return OK + pickle.dumps(runner.set_seed(seed, static))
        raise RuntimeError(f"unknown command {msg[:1]!r}")

    return handle
