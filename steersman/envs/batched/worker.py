"""What runs a sub-env of a batched env: :class:`EnvRunner` and the worker process loop.

:class:`EnvRunner` executes one command on one sub-env, reading its inputs from and
writing its outputs to the sub-env's row of the exchange buffer (see ``_buffers``).
``SerialEnv`` calls runners in a loop in-process; ``ParallelEnv`` runs one per worker
process (:func:`worker_main`), so both produce identical data.

Wire protocol (``multiprocessing`` pipes, bytes only, nothing pickled per step):
parent -> worker ``[command, flags] (+ in-section bytes without shared memory)
(+ pickled extra: reset kwargs, seeds)``; worker -> parent ``b"K" (+ out-section bytes
without shared memory) (+ pickled result)`` or ``b"E" + pickle((type, message,
traceback))``.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import random
import signal
import struct
import sys
import threading
import time
import traceback
from typing import Any

import numpy as np
import torch

from steersman.tensordict import TensorDictBase

from ..common import EnvBase
from ._buffers import BufferLayout, build_td, get_entry
from .env_creator import EnvCreator, EnvMetaData

__all__ = ["EnvRunner", "worker_main"]

# commands (first byte of a parent message)
STEP = b"S"[0]
STEP_RESET = b"M"[0]
RESET = b"R"[0]
SEED = b"D"[0]
CLOSE = b"C"[0]
DATA_COMMANDS = frozenset({STEP, STEP_RESET, RESET})
# reset flags (second byte)
F_PARTIAL = 1
F_STATE = 2
F_KWARGS = 4
# replies
OK = b"K"
OK_RESET = b"R"  # step_and_maybe_reset: some sub-env was reset, the root section is written
ERR = b"E"

#: the worker's parent-watchdog period (seconds).
WATCHDOG_PERIOD = 0.5


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


# ---------------------------------------------------------------------- framing
# The messages are ``multiprocessing.Connection``'s (a 4-byte big-endian length, then the
# payload), written and read straight on the descriptor: one system call per message in
# the common case instead of two reads and some Python for ``Connection.recv_bytes``.
_HDR = struct.Struct("!i")


def frame(payload: bytes) -> bytes:
    """``payload`` with its length header (what ``Connection.send_bytes`` writes)."""
    return _HDR.pack(len(payload)) + payload


def send_frame(fd: int, data: bytes) -> None:
    """Writes a framed message completely (``os.write`` may write part of a large one)."""
    n = os.write(fd, data)
    if n < len(data):
        view = memoryview(data)[n:]
        while view:
            view = view[os.write(fd, view):]


class FrameReader:
    """Reads framed messages from a descriptor; keeps what it read past a message."""

    __slots__ = ("fd", "buf")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = b""

    def recv(self) -> bytes:
        """The next message's payload. Raises ``EOFError`` when the peer has closed."""
        buf = self.buf
        need = 4
        while True:
            if len(buf) >= 4:
                need = 4 + _HDR.unpack_from(buf)[0]
                if len(buf) >= need:
                    self.buf = buf[need:]
                    return buf[4:need]
            chunk = os.read(self.fd, max(65536, need - len(buf)))
            if not chunk:
                raise EOFError
            buf += chunk


# ---------------------------------------------------------------------- errors
def pack_error(exc: BaseException) -> bytes:
    """``ERR`` + the pickled ``(type name, message, formatted traceback)`` (strings only)."""
    tname = type(exc).__qualname__
    mod = type(exc).__module__
    if mod not in ("builtins", None):
        tname = f"{mod}.{tname}"
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return ERR + pickle.dumps((tname, str(exc), tb))


def unpack_error(msg: bytes) -> tuple[str, str, str]:
    try:
        return pickle.loads(msg[1:])
    except Exception:  # noqa: BLE001 - a garbled message is still an error
        return ("UnknownError", repr(msg[:200]), "")


# ---------------------------------------------------------------------- parent death
def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """``prctl(PR_SET_PDEATHSIG, sig)`` on Linux: the kernel sends ``sig`` to this process
    when the thread that created it exits. Returns whether it was set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(1, int(sig), 0, 0, 0) == 0  # 1 == PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return False


def _watchdog(ppid: int, period: float) -> None:
    """Exits the process as soon as its parent is gone (it has been re-parented)."""
    while True:
        time.sleep(period)
        if os.getppid() != ppid:
            os._exit(70)


def start_parent_watchdog(expected_ppid: int | None, pdeathsig: bool) -> None:
    """Makes this worker exit when its parent dies, even by SIGKILL.

    Two mechanisms: the kernel's parent-death signal (Linux; set only when the parent
    thread outlives the worker, see ``ParallelEnv``), and a daemon thread polling
    ``os.getppid()`` (any POSIX system, and a fallback if the signal is blocked or
    the parent-death signal was not set). The worker's command pipe reaching EOF is
    the third: the worker loop exits when it reads EOF.
    """
    ppid = os.getppid()
    if pdeathsig:
        set_parent_death_signal(signal.SIGKILL)
    if expected_ppid is not None and ppid != expected_ppid:
        os._exit(70)  # the parent died before the signal was armed
    threading.Thread(target=_watchdog, args=(ppid, WATCHDOG_PERIOD), daemon=True,
                     name="steersman-parent-watchdog").start()


def seed_worker_globals(seed: int) -> None:
    """Seeds torch's, numpy's and ``random``'s global RNGs of this worker process."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % (2**32))


# ---------------------------------------------------------------------- worker loop
def worker_main(
    idx: int,
    payload: bytes | tuple[EnvCreator, BufferLayout, EnvMetaData],
    conn: Any,
    buf: Any,
    expected_ppid: int | None,
    pdeathsig: bool,
    global_seed: int,
    num_threads: int | None,
    close_fds: tuple[int, ...] = (),
) -> None:
    """The body of a worker process: builds the env, then serves commands until told to
    close or until the parent goes away. Any exception is sent to the parent.

    ``payload``: ``(creator, layout, expected metadata)``, pickled by the parent with the
    standard pickler (tensors by value: nothing is moved to shared memory behind the
    user's back), or the objects themselves under ``fork``.
    """
    start_parent_watchdog(expected_ppid, pdeathsig)
    for fd in close_fds:  # fork: the other workers' parent-side pipe ends
        try:
            os.close(fd)
        except OSError:
            pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    seed_worker_globals(global_seed)
    env: EnvBase | None = None
    try:
        try:
            if isinstance(payload, bytes):
                payload = pickle.loads(payload)
            creator, layout, expected = payload
            shared = buf is not None
            row = buf[idx] if shared else torch.zeros(layout.row_bytes, dtype=torch.uint8)
            row_np = row.numpy()
            in_lo, in_hi = layout.ranges["in"]
            out_lo, out_hi = layout.ranges["next"][0], layout.ranges["root"][1]
            env = creator()
            meta = EnvMetaData.from_env(env)
            if expected.mismatch(meta) is not None:  # the parent raises, naming the difference
                conn.send_bytes(OK + pickle.dumps(meta))
                try:
                    conn.recv_bytes()  # exit when told to (or when the parent goes away)
                except (EOFError, OSError):
                    pass
                return
            runner = EnvRunner(env, layout, row)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            conn.send_bytes(pack_error(exc))
            return
        conn.send_bytes(OK)
        fd = conn.fileno()
        recv = FrameReader(fd).recv
        ok_frames = {OK: frame(OK), OK_RESET: frame(OK_RESET)}

        def send(payload: bytes) -> None:
            data = ok_frames.get(payload) if len(payload) == 1 else None
            send_frame(fd, data if data is not None else frame(payload))

        while True:
            try:
                msg = recv()
            except (EOFError, OSError):
                return  # the parent is gone
            cmd = msg[0]
            try:
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
                        kwargs = pickle.loads(msg[pos:]) if flags & F_KWARGS else None
                        runner.reset(flags, kwargs)
                    send(reply if shared else reply + row_np[out_lo:out_hi].tobytes())
                elif cmd == SEED:
                    seed, static = pickle.loads(msg[2:])
                    send(OK + pickle.dumps(runner.set_seed(seed, static)))
                elif cmd == CLOSE:
                    env.close()
                    try:
                        send(OK)
                    except OSError:
                        pass
                    return
                else:
                    raise RuntimeError(f"unknown command {msg[:1]!r}")
            except Exception as exc:  # noqa: BLE001 - reported to the parent
                try:
                    send(pack_error(exc))
                except OSError:
                    return
    finally:
        if env is not None and not env.is_closed:
            try:
                env.close()
            except Exception:  # noqa: BLE001
                pass
