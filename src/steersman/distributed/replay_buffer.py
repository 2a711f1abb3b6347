"""``RayReplayBuffer`` (alias ``RemoteTensorDictReplayBuffer``): a replay buffer in a Ray actor.

Any steersman replay buffer (storage x sampler x writer, prioritized included) is built
inside one actor; collectors anywhere in the cluster ``extend`` it, the learner
``sample``\\ s from it and updates priorities. The handle is a plain object that can be
passed to other actors (it pickles as the actor handle plus its settings).

Reliability: with ``checkpoint_dir`` and ``checkpoint_interval=N`` the actor writes a
:meth:`~steersman.data.ReplayBuffer.dumps` checkpoint (on its node) every ``N``
transitions written. If the actor dies, Ray restarts it (``max_restarts``) and it loads
the latest checkpoint; the handle then reports (a warning, and
:attr:`RayReplayBuffer.lost_transitions`) how many transitions written since that
checkpoint were lost. Collector actors write with a ``(writer id, sequence number)``
tag, and the buffer keeps the last number per writer with its checkpoints: a batch is
never stored twice, even when a collector is restarted after writing it.

Latency: ``extend`` does not wait for the actor (at most ``max_pending_writes`` writes
in flight; Ray runs one handle's calls in order, so a later ``sample``/``len`` sees
them); a write the actor died on is sent again with the same tag. With ``prefetch=k``
the next ``k`` samples are requested while the learner works on the current one
(TorchRL's ``prefetch``), so ``sample`` rarely waits for a round trip.
"""

from __future__ import annotations

import json
import os
import time
import uuid
import warnings
from collections import deque
from pathlib import Path
from typing import Any

from steersman.data.replay_buffers import ReplayBuffer, TensorDictReplayBuffer

from ._ray import fit_actors_to_cpus, init_ray, require_ray
from ._wire import pack, unpack

__all__ = ["RayReplayBuffer", "RemoteTensorDictReplayBuffer"]

_LEDGER = "ledger.json"


class _BufferActor:
    """What runs inside the actor (plain Python: the buffer and the writers' ledger)."""

    def __init__(self, factory: Any, kwargs: dict, checkpoint_dir: str | None, checkpoint_interval: int) -> None:
        self.rb: ReplayBuffer = factory(**kwargs)
        self.incarnation = uuid.uuid4().hex
        self.ckpt_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.interval = int(checkpoint_interval)
        self.ledger: dict[str, int] = {}  # writer id -> last sequence number stored
        self.restored_write_count = 0
        self._last_dump = 0
        if self.ckpt_dir is not None and (self.ckpt_dir / "buffer" / "LATEST.json").exists():
            self.rb.loads(self.ckpt_dir / "buffer")
            ledger = self.ckpt_dir / _LEDGER
            if ledger.exists():
                self.ledger = {str(k): int(v) for k, v in json.loads(ledger.read_text())["ledger"].items()}
            self.restored_write_count = self._last_dump = self.rb.write_count

    # ---------------------------------------------------------------- writing
    def extend(self, data: Any, writer: str | None = None, seq: int | None = None) -> tuple[bool, int]:
        """Stores ``data`` unless ``(writer, seq)`` was stored already; returns
        ``(stored, write_count)``."""
        if writer is not None:
            if self.ledger.get(writer, -1) >= seq:
                return False, self.rb.write_count
            self.ledger[writer] = seq
        self.rb.extend(unpack(data))
        self._maybe_dump()
        return True, self.rb.write_count

    def add(self, data: Any, writer: str | None = None, seq: int | None = None) -> tuple[bool, int, Any]:
        """Stores one item unless ``(writer, seq)`` was stored; returns ``(stored, write_count, index)``."""
        if writer is not None:
            if self.ledger.get(writer, -1) >= seq:
                return False, self.rb.write_count, None
            self.ledger[writer] = seq
        index = self.rb.add(unpack(data))
        self._maybe_dump()
        return True, self.rb.write_count, index

    def _maybe_dump(self) -> None:
        if self.ckpt_dir is not None and self.interval > 0 and self.rb.write_count - self._last_dump >= self.interval:
            self.checkpoint()

    def checkpoint(self) -> int:
        """Dumps the buffer and the ledger under ``checkpoint_dir``; returns the write count saved."""
        assert self.ckpt_dir is not None
        self.rb.dumps(self.ckpt_dir / "buffer")
        tmp = self.ckpt_dir / f".{_LEDGER}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"write_count": self.rb.write_count, "ledger": self.ledger}))
        os.replace(tmp, self.ckpt_dir / _LEDGER)
        self._last_dump = self.rb.write_count
        return self._last_dump

    # ---------------------------------------------------------------- reading
    def sample(self, batch_size: int | None, return_info: bool) -> Any:
        out = self.rb.sample(batch_size, return_info=return_info)
        return (pack(out[0]), out[1]) if return_info else pack(out)

    def update_priority(self, index: Any, priority: Any) -> None:
        self.rb.update_priority(index, priority)

    def update_tensordict_priority(self, data: Any) -> None:
        self.rb.update_tensordict_priority(data)

    def dumps(self, path: str) -> None:
        self.rb.dumps(path)

    def loads(self, path: str) -> None:
        self.rb.loads(path)

    def empty(self) -> None:
        self.rb.empty()
        self.ledger.clear()

    def info(self) -> dict:
        """Length, write count, incarnation and what was restored at start (one round trip)."""
        import ray

        return {"len": len(self.rb), "write_count": self.rb.write_count, "incarnation": self.incarnation,
                "restored_write_count": self.restored_write_count, "node": ray.util.get_node_ip_address(),
                "pid": os.getpid(), "repr": repr(self.rb)}


class RayReplayBuffer:
    """A replay buffer living in a Ray actor: ``extend``/``add`` from anywhere, ``sample``
    and ``update_priority`` from the learner.

    Keyword Args:
        replay_buffer_cls: the buffer class built in the actor (default
            :class:`~steersman.data.TensorDictReplayBuffer`; any steersman buffer,
            ``TensorDictPrioritizedReplayBuffer`` included), called with ``**kwargs``
            (``storage=``, ``sampler=``, ``writer=``, ``batch_size=``...: they are
            pickled to the actor, so give them empty).
        remote_config: Ray actor options (default ``{"num_cpus": 0}``: the actor only
            moves memory; ``{"resources": {"node:10.0.0.2": 0.01}}`` pins it to a node).
        checkpoint_dir: folder on the actor's node for its periodic checkpoints (None: none).
        checkpoint_interval: transitions written between two checkpoints (0: none).
        max_restarts: times Ray restarts the actor after it dies (it reloads the latest
            checkpoint).
        prefetch: samples requested ahead (TorchRL's name; None or 0: none). A prefetched
            batch was drawn when it was requested: it misses data written after that, and
            (prioritized sampling) priority updates sent after that, as in Ape-X's learner.
            Another ``batch_size``/``return_info``, ``empty`` or ``loads`` drops it.
        max_pending_writes: ``extend``/``add`` calls in flight before ``extend`` waits for
            the oldest (0: every call waits for the actor). An error of a write that did
            not wait is raised by the next ``extend``, ``add`` or :meth:`flush`.
        ray_init_config: passed to :func:`~steersman.distributed.init_ray` if Ray is not
            running yet.

    Shapes: as the local buffer (``sample(B)`` is ``[B, *item]``); the data crosses the
    object store (zero-copy reads of its tensors on the same node).

    Example (not run by the doctests: it starts Ray)::

        import torch
        from steersman import TensorDict
        from steersman.data import LazyTensorStorage
        from steersman.distributed import RayReplayBuffer

        rb = RayReplayBuffer(storage=LazyTensorStorage(1000), batch_size=32)
        rb.extend(TensorDict({"obs": torch.randn(100, 4)}, [100]))
        len(rb), rb.sample()["obs"].shape        # (100, torch.Size([32, 4]))
        rb.shutdown()
    """

    def __init__(self, *, replay_buffer_cls: type = TensorDictReplayBuffer, remote_config: dict | None = None,
                 checkpoint_dir: str | os.PathLike | None = None, checkpoint_interval: int = 0, max_restarts: int = 3,
                 ray_init_config: dict | None = None, prefetch: int | None = None, max_pending_writes: int = 8,
                 **kwargs: Any) -> None:
        ray = require_ray()
        for name, value in (("prefetch", prefetch or 0), ("max_pending_writes", max_pending_writes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"RayReplayBuffer: {name} must be a non-negative int, got {value!r}")
        if isinstance(checkpoint_interval, bool) or not isinstance(checkpoint_interval, int) or checkpoint_interval < 0:
            raise ValueError(f"RayReplayBuffer: checkpoint_interval must be a non-negative int, got {checkpoint_interval!r}")
        if checkpoint_interval and checkpoint_dir is None:
            raise ValueError("RayReplayBuffer: checkpoint_interval > 0 needs a checkpoint_dir")
        init_ray(ray_init_config)
        opts = {"num_cpus": 0, **(remote_config or {})}
        opts["num_cpus"] = fit_actors_to_cpus("RayReplayBuffer", 1, opts["num_cpus"])
        self.checkpoint_dir = None if checkpoint_dir is None else str(Path(checkpoint_dir).absolute())
        self.checkpoint_interval = checkpoint_interval
        actor_cls = ray.remote(_BufferActor).options(max_restarts=max_restarts, max_task_retries=0, **opts)
        self._actor = actor_cls.remote(replay_buffer_cls, kwargs, self.checkpoint_dir, checkpoint_interval)
        self._setup_client(prefetch or 0, max_pending_writes)
        info = self._call("info")  # builds it now: a bad argument fails here, with the remote traceback
        self._incarnation = info["incarnation"]
        self._max_write_count = info["write_count"]
        self.node = info["node"]

    # ---------------------------------------------------------------- plumbing
    def _setup_client(self, prefetch: int, max_pending_writes: int) -> None:
        """This handle's own state (also of a handle unpickled in another actor)."""
        self.lost_transitions = 0
        self._max_write_count = 0
        self._restart_wait = 30.0
        self._incarnation = getattr(self, "_incarnation", None)
        self.prefetch, self.max_pending_writes = prefetch, max_pending_writes
        self._samples: deque = deque()  # prefetched (key, ref), oldest first
        self._writes: deque = deque()  # in-flight (seq, method, data, ref), oldest first
        self._writer = f"handle-{uuid.uuid4().hex[:12]}"  # tags this handle's writes (stored once)
        self._write_seq = 0

    def __reduce__(self) -> Any:  # other actors get a handle of the same actor
        return (_rebuild, (self._actor, self.checkpoint_dir, self.checkpoint_interval, self.prefetch,
                           self.max_pending_writes))

    @property
    def actor(self) -> Any:
        """The Ray actor handle."""
        return self._live()

    def _live(self) -> Any:
        """The actor handle, or a RuntimeError after :meth:`shutdown` (its data is gone)."""
        if self._actor is None:
            raise RuntimeError("RayReplayBuffer: the buffer actor was shut down (shutdown()), its data is gone; "
                               "call dumps/sample/extend before shutdown")
        return self._actor

    def _call(self, method: str, *args: Any) -> Any:
        """Calls the actor; if it died, waits for its restart, reports the lost
        transitions and calls again (a method the actor raised in: re-raised as is)."""
        import ray

        deadline = time.monotonic() + self._restart_wait
        while True:
            try:
                return ray.get(getattr(self._live(), method).remote(*args))
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as err:
                if time.monotonic() > deadline or "restarts" in str(err) and "exceeded" in str(err):
                    raise RuntimeError(f"RayReplayBuffer: the buffer actor died and was not restarted within "
                                       f"{self._restart_wait:g} s: {err}") from err
                time.sleep(0.2)
                self._check_restart()

    def _check_restart(self) -> None:
        import ray

        try:
            info = ray.get(self._actor.info.remote(), timeout=self._restart_wait)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
            return
        self.observe(info)

    def observe(self, info: dict) -> None:
        """Notes a ``write_count``/``incarnation`` seen elsewhere (collectors report theirs);
        a new incarnation means the actor restarted: the lost transitions are counted."""
        if "incarnation" in info and self._incarnation is None:
            self._incarnation = info["incarnation"]
        elif "incarnation" in info and info["incarnation"] != self._incarnation:
            lost = max(self._max_write_count - info.get("restored_write_count", 0), 0)
            self._incarnation = info["incarnation"]
            self.lost_transitions += lost
            self._max_write_count = info.get("restored_write_count", 0)
            warnings.warn(f"RayReplayBuffer: the buffer actor was restarted (node {info.get('node')}) from its "
                          f"checkpoint of {info.get('restored_write_count', 0)} transitions; {lost} transitions "
                          "written since were lost (lower checkpoint_interval to lose fewer)")
        if "write_count" in info:
            self._max_write_count = max(self._max_write_count, int(info["write_count"]))

    # ---------------------------------------------------------------- writes in flight
    def _write(self, method: str, data: Any) -> Any:
        seq, self._write_seq = self._write_seq, self._write_seq + 1
        if self.max_pending_writes == 0:
            return self._done_write(self._call(method, pack(data), self._writer, seq))
        self._reap(0)
        while len(self._writes) >= self.max_pending_writes:
            self._reap(1, block=True)
        data = pack(data)
        self._writes.append((seq, method, data, getattr(self._live(), method).remote(data, self._writer, seq)))
        return None

    def _done_write(self, out: tuple) -> Any:
        self._max_write_count = max(self._max_write_count, int(out[1]))
        return out[2] if len(out) > 2 else None

    def _reap(self, at_least: int, block: bool = False) -> None:
        """Takes the answers of the finished writes, oldest first (``block``: waits for
        ``at_least`` of them); a write whose actor died is sent again (same tag)."""
        import ray

        if not self._writes:
            return
        if not block:
            done, _ = ray.wait([w[3] for w in self._writes], num_returns=len(self._writes), timeout=0)
            done = set(done)
        n = 0
        while self._writes and (block and n < at_least or not block and self._writes[0][3] in done):
            seq, method, data, ref = self._writes.popleft()
            n += 1
            try:
                self._done_write(ray.get(ref))
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                self._done_write(self._call(method, data, self._writer, seq))  # waits for the restart
            except ray.exceptions.RayTaskError as err:
                self._drop_writes()
                raise RuntimeError(f"RayReplayBuffer: an earlier {method} (not waited for) failed in the buffer "
                                   f"actor; remote traceback:\n{err}") from None

    def _drop_writes(self) -> None:
        self._writes.clear()

    def flush(self) -> None:
        """Waits until every write sent so far is stored (raises the error of a failed one)."""
        self._reap(len(self._writes), block=True)

    # ---------------------------------------------------------------- the buffer API
    def extend(self, data: Any) -> None:
        """Appends the items of ``data`` (a batch; its first dim indexes items); returns once
        sent (see ``max_pending_writes``)."""
        self._write("extend", data)

    def add(self, data: Any) -> int:
        """Appends one item; returns its index (waits for the actor)."""
        self.flush()
        seq, self._write_seq = self._write_seq, self._write_seq + 1
        return self._done_write(self._call("add", pack(data), self._writer, seq))

    def sample(self, batch_size: int | None = None, return_info: bool = False) -> Any:
        """A batch sampled in the actor (``return_info``: with the sampler's info, as locally);
        with ``prefetch``, one requested earlier (the next ones are requested now)."""
        if not self.prefetch:
            return _unpacked(self._call("sample", batch_size, return_info), return_info)
        import ray

        key = (batch_size, return_info)
        if self._samples and self._samples[0][0] != key:
            self._samples.clear()
        while len(self._samples) <= self.prefetch:
            self._samples.append((key, self._live().sample.remote(batch_size, return_info)))
        _, ref = self._samples.popleft()
        self._samples.append((key, self._live().sample.remote(batch_size, return_info)))
        try:
            out = ray.get(ref)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            self._samples.clear()  # the actor died: ask again once it is back
            out = self._call("sample", batch_size, return_info)
        return _unpacked(out, return_info)

    def update_priority(self, index: Any, priority: Any) -> None:
        """Sets the priorities of the items at ``index`` (prioritized samplers)."""
        self._call("update_priority", index, priority)

    def update_tensordict_priority(self, data: Any) -> None:
        """Priorities from ``data``'s priority key at its ``"index"`` (TensorDict buffers)."""
        self._call("update_tensordict_priority", data)

    def dumps(self, path: str | os.PathLike) -> None:
        """Writes the buffer to ``path`` on the actor's node (see ``ReplayBuffer.dumps``)."""
        self._call("dumps", str(path))

    def loads(self, path: str | os.PathLike) -> None:
        """Loads a checkpoint from ``path`` on the actor's node."""
        self.flush()
        self._samples.clear()
        self._call("loads", str(path))

    def checkpoint(self) -> int:
        """Writes a checkpoint to ``checkpoint_dir`` now; returns the write count it holds."""
        if self.checkpoint_dir is None:
            raise ValueError("RayReplayBuffer.checkpoint: the buffer was made without a checkpoint_dir")
        return self._call("checkpoint")

    def empty(self) -> None:
        """Removes every item."""
        self.flush()
        self._samples.clear()
        self._call("empty")

    def info(self) -> dict:
        """``len``, ``write_count``, ``node``, ``pid`` of the actor (after the writes in flight)."""
        self.flush()
        info = self._call("info")
        self.observe(info)
        return info

    def __len__(self) -> int:
        return self.info()["len"]

    @property
    def write_count(self) -> int:
        return self.info()["write_count"]

    def shutdown(self) -> None:
        """Kills the actor (idempotent)."""
        actor = getattr(self, "_actor", None)
        if actor is not None:
            import ray

            if ray.is_initialized():
                try:
                    self.flush()
                except Exception:  # noqa: BLE001 - shutting down: the write error was the caller's to see
                    pass
                ray.kill(actor, no_restart=True)
        self._actor = None
        self._samples, self._writes = deque(), deque()

    def __repr__(self) -> str:
        return f"RayReplayBuffer(node={getattr(self, 'node', None)}, checkpoint_dir={self.checkpoint_dir})"


def _unpacked(out: Any, return_info: bool) -> Any:
    return (unpack(out[0]), out[1]) if return_info else unpack(out)


def _rebuild(actor: Any, checkpoint_dir: str | None, checkpoint_interval: int, prefetch: int = 0,
             max_pending_writes: int = 8) -> RayReplayBuffer:
    rb = RayReplayBuffer.__new__(RayReplayBuffer)
    rb._actor, rb.checkpoint_dir, rb.checkpoint_interval = actor, checkpoint_dir, checkpoint_interval
    rb._incarnation, rb.node = None, None
    rb._setup_client(prefetch, max_pending_writes)
    return rb


RemoteTensorDictReplayBuffer = RayReplayBuffer
"""TorchRL's name for a TensorDict replay buffer in a Ray actor."""
