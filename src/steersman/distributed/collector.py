"""``RayCollector``: steersman collectors in Ray actors, batches gathered by the driver.

The protocol (why frames are counted once and weights are never stale):

* The driver numbers the batches it asks each actor for (``seq``) and counts a batch's
  frames only when its reply arrives. A request whose actor died is asked again, with
  the same number, of the restarted actor: a lost reply is collected again, never
  counted twice; the number of frames delivered stops at ``total_frames`` exactly.
* ``update_policy_weights_()`` bumps a version and puts the weights once in Ray's
  object store. Every request carries ``(version, reference)``; an actor whose policy
  is older fetches them (one fetch per node: the store is shared) before collecting.
  So every batch asked for after the k-th update is collected with version k, also by
  an actor restarted with its initial weights (the TorchRL bugs pytorch/rl#3729,
  #3587, #3000 and #3530 cannot happen). The exception is an actor running an async
  multi-process collector (``MultiaSyncDataCollector``): its workers start their next
  batch when one is handed out, so a worker's batch carries the version the actor held
  when that worker's previous batch left (never older), as with the collector locally.
* Sync mode sends the next requests ahead (two per actor in flight) only while the
  caller does not update the policy between batches; an update then makes them stale:
  they are dropped (never delivered nor counted) and sent again with the new version, so
  every batch delivered after the k-th update still has version k.
* With ``replay_buffer=`` a :class:`~steersman.distributed.RayReplayBuffer`, an actor
  writes its batch straight into the buffer actor, tagged ``(actor, seq)``: the buffer
  stores each number once, so a batch re-collected after a restart is not stored twice.
"""

from __future__ import annotations

import math
import os
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from steersman.collectors import Collector
from steersman.tensordict import TensorDictBase

from ._ray import cluster_cpus, fit_actors_to_cpus, free_cpus, init_ray, require_ray
from ._wire import FlatLayout, flat_layout, pack, pack_flat, unpack, unpack_flat

__all__ = ["RayCollector", "RayCollectorError"]

TRAJ_KEY = ("collector", "traj_ids")


class RayCollectorError(RuntimeError):
    """A collector actor failed for good: it raised, or died more than ``max_restarts`` times."""


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _episode_returns(batch: TensorDictBase, carry: torch.Tensor | None) -> tuple[list[float], torch.Tensor]:
    """Returns of the episodes ending in ``batch`` ``[*B, T]`` (time is the last batch dim),
    in the order they end (by step, then row), and the running sums carried to the next
    batch. Vectorised (one cumulative sum per batch: no Python loop over the steps)."""
    reward = batch.get(("next", "reward")).reshape(-1, batch.shape[-1]).double()
    done = batch.get(("next", "done")).reshape(-1, batch.shape[-1])
    rows = reward.shape[0]
    if carry is None or carry.shape[0] != rows:
        carry = torch.zeros(rows, dtype=torch.float64)
    running = reward.cumsum(1) + carry.unsqueeze(1)  # the running sum, carried in
    if not done.any():
        return [], running[:, -1].clone()
    r, t = done.nonzero(as_tuple=True)  # row-major: the ends of a row in step order
    total = running[r, t]
    first = torch.ones_like(r, dtype=torch.bool)
    first[1:] = r[1:] != r[:-1]  # the first end of its row: the episode started with the carry
    before = torch.where(first, torch.zeros_like(total), total.roll(1))
    returns = total - before
    order = torch.argsort(t * rows + r)  # the order they end: by step, then row
    new_carry = running[:, -1].clone()
    last = torch.ones_like(first)
    last[:-1] = r[:-1] != r[1:]  # the last end of its row: what follows it is carried
    new_carry[r[last]] -= total[last]
    return returns[order].tolist(), new_carry


_FLAT = "steersman-flat-weights"
_BATCH = "steersman-flat-batch"  # a reply's batch: (_BATCH, layout id, layout or None, byte buffer)
_ALIGN = 64  # byte offsets of the tensors in the flat buffer (any dtype can view its slice)


def _layout(weights: dict) -> list[tuple[str, torch.dtype, tuple, int, int]] | None:
    """``(name, dtype, shape, byte offset, bytes)`` of every tensor of a flat ``state_dict``
    packed in one buffer; None if it holds anything else."""
    out, offset = [], 0
    for name, t in weights.items():
        if not isinstance(t, torch.Tensor) or t.is_sparse or t.is_quantized:
            return None
        nbytes = t.numel() * t.element_size()
        out.append((name, t.dtype, tuple(t.shape), offset, nbytes))
        offset += -(-nbytes // _ALIGN) * _ALIGN
    return out


def _unpack(packed: tuple) -> dict[str, torch.Tensor]:
    """The tensors of a flat buffer (read-only views of the object store: no copy here)."""
    _, layout, array = packed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "non-writable array": only read
        flat = torch.from_numpy(array)
    return {name: flat[off:off + nbytes].view(dtype).view(shape) for name, dtype, shape, off, nbytes in layout}


class _CollectorActor:
    """Runs one steersman collector in a Ray actor (the Ray options are set by RayCollector)."""

    def __init__(self, index: int, num_collectors: int, collector_class: type, create_env_fn: Any, policy: Any,
                 policy_factory: Callable | None, frames_per_batch: int, collector_kwargs: dict,
                 num_workers: int, replay_buffer: Any, seed: int | None) -> None:
        import ray

        torch.set_num_threads(1)
        if seed is not None:  # the policy's sampling draws from this process's RNG (saved in state_dict)
            torch.manual_seed(seed)
        if policy_factory is not None:
            policy = policy_factory()
        kwargs = dict(collector_kwargs)
        if collector_class is Collector or num_workers is None:
            self.collector = collector_class(create_env_fn, policy, frames_per_batch=frames_per_batch,
                                             total_frames=-1, **kwargs)
        else:
            self.collector = collector_class([create_env_fn] * num_workers, policy, frames_per_batch=frames_per_batch,
                                             total_frames=-1, **kwargs)
        if seed is not None:
            self.collector.set_seed(seed)
        self.policy = policy
        self.index, self.n = index, num_collectors
        self.writer = f"collector-{index}"
        self.replay_buffer = replay_buffer
        self.version = 0
        self.batches = 0
        self.carry: torch.Tensor | None = None
        self.incarnation = uuid.uuid4().hex
        self._layout: FlatLayout | None = None  # of the batches (one buffer per reply)
        self._last_end = time.perf_counter()
        self._weight_dst: tuple | None = None  # (layout, [(bytes of a policy tensor, offset, nbytes)])
        self.node = ray.util.get_node_ip_address()
        self.node_id = ray.get_runtime_context().get_node_id()
        self._it = iter(self.collector)

    def ping(self) -> dict:
        pids = [os.getpid(), *getattr(self.collector, "worker_pids", [])]
        return {"index": self.index, "node": self.node, "node_id": self.node_id, "pid": os.getpid(),
                "pids": pids, "incarnation": self.incarnation, "version": self.version}

    def _apply_weights(self, weights: list | None) -> float:
        """Loads ``weights`` (``[version, ref]``) if newer than the policy's; returns the
        seconds spent (fetch and copy; 0 if already held)."""
        import ray

        if weights is not None and weights[0] > self.version:
            t = time.perf_counter()
            w = ray.get(weights[1])
            if isinstance(w, tuple) and w and w[0] == _FLAT and self._copy_flat(w):
                self.version = weights[0]
                return time.perf_counter() - t
            if isinstance(w, tuple) and w and w[0] == _FLAT:  # one buffer: views of it, copied into the policy
                w = _unpack(w)
            elif isinstance(w, dict):  # read-only views of the object store, copied into the policy
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)  # "non-writable array": only read here
                    w = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in w.items()}
            self.collector.update_policy_weights_(w)
            self.version = weights[0]
            return time.perf_counter() - t
        return 0.0

    def _copy_flat(self, packed: tuple) -> bool:
        """The fast path of a flat weight buffer into a ``Collector``'s own policy: one byte
        copy per tensor, straight from the object store into the policy's storage (the byte
        views of its tensors are found once per layout). False where it does not apply
        (another collector class, or the names, dtypes or shapes differ): the collector's
        ``update_policy_weights_`` then does it."""
        _, layout, array = packed
        if self._weight_dst is None or self._weight_dst[0] != layout:
            self._weight_dst = None
            if type(self.collector) is not Collector or not isinstance(self.policy, nn.Module) \
                    or self.collector.policy is not self.policy:
                return False
            own = self.policy.state_dict(keep_vars=True)
            if len(own) != len(layout):
                return False
            dst = []
            for name, dtype, shape, off, nbytes in layout:
                t = own.get(name)
                if not isinstance(t, torch.Tensor) or t.dtype != dtype or tuple(t.shape) != shape \
                        or not t.is_contiguous() or t.device.type != "cpu":
                    return False
                dst.append((t.detach().reshape(-1).view(torch.uint8), off, nbytes))
            self._weight_dst = (layout, dst)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "non-writable array": only read
            flat = torch.from_numpy(array)
        with torch.no_grad():
            for t, off, nbytes in self._weight_dst[1]:
                t.copy_(flat[off:off + nbytes])
        return True

    def _flat_reply(self, batch: TensorDictBase, known: int | None) -> Any:
        """``batch`` as one byte buffer (the layout too if the driver does not hold it:
        ``known`` is the layout id it holds for this actor), or packed as before when it is
        not a plain TensorDict of CPU tensors."""
        layout = self._layout
        buf = None
        if layout is not None:
            buf = np.empty(layout.nbytes, dtype=np.uint8)
            if not pack_flat(batch, layout, buf):
                layout = None
        if layout is None:
            layout = self._layout = flat_layout(batch)
            if layout is None:
                return pack(batch)
            buf = np.empty(layout.nbytes, dtype=np.uint8)
            pack_flat(batch, layout, buf)
        return (_BATCH, layout.id, None if known == layout.id else layout, buf)

    def collect(self, seq: int, weights: list | None, layout_id: int | None = None) -> tuple[dict, Any]:
        """The next batch, with the newest weights (``weights``: ``[version, ref]``), and its
        info (``busy_s``: seconds spent in this call, so the driver's round trip minus it is
        Ray's transport and scheduling; ``idle_s``: seconds since the previous call ended).
        One object: the info (a few numbers) and the batch as one byte buffer (its layout
        only if ``layout_id``, the one the driver holds, is not that of the batch)."""
        t = time.perf_counter()
        weights_s = self._apply_weights(weights)
        batch = next(self._it)
        if TRAJ_KEY in batch.keys(True, True):  # ids unique across actors
            batch.set(TRAJ_KEY, batch.get(TRAJ_KEY) * self.n + self.index)
        returns, self.carry = _episode_returns(batch, self.carry)
        self.batches += 1
        info = {"index": self.index, "seq": seq, "frames": batch.numel(), "version": self.version,
                "episode_returns": returns, "incarnation": self.incarnation, "node": self.node,
                "pid": os.getpid(), "weights_s": weights_s}
        if self.replay_buffer is None:
            out = self._flat_reply(batch, layout_id)
        else:
            out = None
            info["stored"], info["write_count"], info["buffer_incarnation"] = self._write(batch, seq)
        info["idle_s"] = t - self._last_end  # since the previous call ended: waiting for this request
        self._last_end = time.perf_counter()
        info["busy_s"] = self._last_end - t
        return info, out

    def _write(self, batch: TensorDictBase, seq: int) -> tuple[bool, int, str | None]:
        """Extends the remote buffer, waiting for it through a restart (up to 60 s)."""
        import ray

        data = batch.reshape(-1)
        deadline = time.monotonic() + 60.0
        while True:
            try:
                stored, count = ray.get(self.replay_buffer.actor.extend.remote(pack(data), self.writer, seq))
                return stored, count, None
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def state_dict(self, weights: list | None = None) -> dict:
        self._apply_weights(weights)  # the saved policy is the newest one, not the one of the last batch
        return {"collector": self.collector.state_dict(), "version": self.version, "carry": self.carry,
                "rng": torch.get_rng_state()}

    def load_state_dict(self, state: dict) -> None:
        self.collector.load_state_dict(state["collector"])
        self.version, self.carry = int(state["version"]), state["carry"]
        if state.get("rng") is not None:
            torch.set_rng_state(state["rng"])
        self._it = iter(self.collector)

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        return self.collector.set_seed(seed, static_seed=static_seed)

    def shutdown(self) -> None:
        self.collector.shutdown()


def _kill_actors(actors: list) -> None:
    try:
        import ray

        if ray.is_initialized():
            for a in actors:
                ray.kill(a, no_restart=True)
    except Exception:  # noqa: BLE001 - interpreter exit: best effort
        pass
    actors.clear()


class RayCollector:
    """Collects with ``num_collectors`` steersman collectors, each in a Ray actor.

    Iterating yields TensorDicts until ``total_frames`` frames were delivered (exactly:
    ``total_frames`` is rounded up to a multiple of ``frames_per_batch``, with a warning).
    ``sync=True``: each batch holds one batch of every actor, stacked along a new leading
    dim (``[num_collectors, *per-actor shape]``; each actor collects
    ``frames_per_batch // num_collectors`` frames). ``sync=False``: batches of
    ``frames_per_batch`` frames are yielded in the order they arrive. Trajectory ids are
    made unique across actors (``id * num_collectors + actor``).

    Args:
        create_env_fn: a callable returning an env (or an env: it is pickled to the
            actors), or a list of them, one per actor.
        policy: a ``TensorDict -> TensorDict`` module (pickled once to the object
            store); ``None``: random actions (or ``policy_factory``).

    Keyword Args:
        policy_factory: called in each actor to build its policy (for policies that
            cannot be pickled).
        frames_per_batch: frames per yielded batch.
        total_frames: frames to deliver in all (``-1``: no end).
        collector_class: the collector run in each actor: :class:`~steersman.collectors.Collector`
            or a multi-process one (``MultiSyncDataCollector``...) with
            ``num_workers_per_collector`` processes (with ``MultiaSyncDataCollector`` a
            batch may be a few versions old: see the module's docstring).
        collector_kwargs: more keyword arguments of ``collector_class`` (``init_random_frames``...).
        num_workers_per_collector: processes per actor for multi-process classes.
        sync: see above.
        ray_init_config: ``ray.init`` arguments if Ray is not running yet (see
            :func:`~steersman.distributed.init_ray`; ``{"address": "auto"}`` joins a cluster).
        remote_configs: Ray actor options (one dict, or one per actor); default
            ``{"num_cpus": 1}`` (shared out, with a warning, when the cluster has fewer CPUs).
        num_collectors: number of actors (default: ``len(create_env_fn)`` for a list, else 1).
        update_after_each_batch: call :meth:`update_policy_weights_` after every batch.
        max_weight_update_interval: accepted for TorchRL compatibility: weights are never
            stale here (each request carries the newest version), so there is nothing to bound.
        replay_buffer: a :class:`~steersman.distributed.RayReplayBuffer`: actors write their
            batches straight into it, iteration yields ``None`` per batch (as local collectors
            with a buffer do); :meth:`start` runs that loop in a background thread.
        max_restarts: times each actor is restarted after dying (then :class:`RayCollectorError`
            names it and its last error).
        seed: seeds actor ``i``'s envs with ``seed + 1000 * i`` (None: the env factory's own seeding).
        start_timeout: seconds the actors may take to start (placed, env and policy built);
            then :class:`RayCollectorError` names the ones that did not, with the cluster's
            free CPUs (e.g. CPUs held by other actors, or nodes that never came).

    Metrics: :meth:`pop_episode_returns` gives the returns of the episodes that ended in the
    batches delivered since the last call (computed in the actors, also with a remote buffer).

    Requests sent ahead (no ``replay_buffer``; both modes): while the caller does not
    update the policy between batches, two requests per actor are kept in flight (the next
    one queued at the actor), so an actor starts its next batch without waiting for Ray's
    round trip, the driver's stacking or the loop body. An update after such a yield makes
    those requests stale: they are dropped (their batches are not delivered nor counted;
    :attr:`dropped_batches` counts them; a queued one is cancelled) and sent again with the
    new weights, and the number of quiet yields needed before sending ahead again doubles
    (a loop updating after every batch never sends ahead). Set the attribute
    ``pipelining = False`` to ask for each batch only when the previous one was handed over.

    Example (not run by the doctests: it starts Ray)::

        from steersman.distributed import RayCollector
        from steersman.envs import CartPoleEnv

        collector = RayCollector(CartPoleEnv, None, frames_per_batch=200, total_frames=2000,
                                 num_collectors=2, sync=True)
        for batch in collector:
            assert batch.shape == (2, 100)       # [num_collectors, T]
        collector.shutdown()
    """

    def __init__(self, create_env_fn: Callable | Sequence[Callable], policy: Any = None, *,
                 policy_factory: Callable | None = None, frames_per_batch: int, total_frames: int = -1,
                 collector_class: type = Collector, collector_kwargs: dict | None = None,
                 num_workers_per_collector: int = 1, sync: bool = False, ray_init_config: dict | None = None,
                 remote_configs: dict | Sequence[dict] | None = None, num_collectors: int | None = None,
                 update_after_each_batch: bool = False, max_weight_update_interval: int = -1,
                 replay_buffer: Any = None, max_restarts: int = 3, seed: int | None = None,
                 start_timeout: float = 120.0) -> None:
        ray = require_ray()
        fns = list(create_env_fn) if isinstance(create_env_fn, (list, tuple)) else None
        n = num_collectors if num_collectors is not None else (len(fns) if fns else 1)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"RayCollector: num_collectors must be a positive int, got {num_collectors!r}")
        if fns is not None and len(fns) != n:
            raise ValueError(f"RayCollector: {len(fns)} env factories for num_collectors={n}")
        fns = fns or [create_env_fn] * n
        if policy is not None and policy_factory is not None:
            raise ValueError("RayCollector: give policy or policy_factory, not both")
        if isinstance(frames_per_batch, bool) or not isinstance(frames_per_batch, int) or frames_per_batch < 1:
            raise ValueError(f"RayCollector: frames_per_batch must be a positive int, got {frames_per_batch!r}")
        if sync and frames_per_batch % n:
            raise ValueError(f"RayCollector: with sync=True, frames_per_batch={frames_per_batch} must be a multiple "
                             f"of num_collectors={n} (each actor collects frames_per_batch // num_collectors)")
        if total_frames is None or total_frames == -1:
            total: float = math.inf
        elif isinstance(total_frames, bool) or not isinstance(total_frames, int) or total_frames < 0:
            raise ValueError(f"RayCollector: total_frames must be a non-negative int or -1, got {total_frames!r}")
        else:
            total = -(-total_frames // frames_per_batch) * frames_per_batch
            if total != total_frames:
                warnings.warn(f"RayCollector: total_frames={total_frames} is not a multiple of frames_per_batch="
                              f"{frames_per_batch}; {total} frames will be collected")
        if isinstance(start_timeout, bool) or not isinstance(start_timeout, (int, float)) or not start_timeout > 0:
            raise ValueError(f"RayCollector: start_timeout must be a positive number of seconds, got {start_timeout!r}")
        configs = list(remote_configs) if isinstance(remote_configs, (list, tuple)) else [remote_configs or {}] * n
        if len(configs) != n:
            raise ValueError(f"RayCollector: {len(configs)} remote_configs for num_collectors={n}")
        self.frames_per_batch, self.total_frames, self.sync = frames_per_batch, total, bool(sync)
        self.num_collectors, self.policy, self.replay_buffer = n, policy, replay_buffer
        self.update_after_each_batch = bool(update_after_each_batch)
        self.max_weight_update_interval = max_weight_update_interval
        self.max_restarts = int(max_restarts)
        self._owns_ray = init_ray(ray_init_config)
        self._closed = False
        self._thread: threading.Thread | None = None
        self._thread_error: BaseException | None = None
        # in-flight ref -> (actor, seq, weight version it carries, sent ahead of a yield)
        self._pending: dict[Any, tuple[int, int, int, bool]] = {}
        self._layouts: dict[int, FlatLayout] = {}  # the batches' layouts by id (sent once by the actors)
        self._known_layout: list[int | None] = [None] * n  # the layout id of each actor's last batch
        self.pipelining = True
        self._ahead = 2  # requests in flight per actor when sending ahead
        self._quiet = 0  # yields in a row after which the policy was not updated
        self._quiet_needed = 1  # ... needed to send requests ahead (doubles when one is dropped)
        self.dropped_batches = 0  # batches sent ahead, then dropped: the policy was updated meanwhile
        self._actors: list = []
        self._finalizer = weakref.finalize(self, _kill_actors, self._actors)
        try:
            policy_ref = self._policy_ref = None  # kept while the actors live: Ray restarts them from it
            if policy is not None:
                try:
                    policy_ref = self._policy_ref = ray.put(policy)
                except Exception as err:  # noqa: BLE001 - Ray raises several kinds
                    raise TypeError(f"RayCollector: the policy ({type(policy).__name__}) cannot be serialised to send "
                                    f"it to the actors ({type(err).__name__}: {str(err).splitlines()[0]}); build it "
                                    "in each actor with policy_factory=<a function returning it>") from None
            per_actor = frames_per_batch // n if self.sync else frames_per_batch
            multi = collector_class is not Collector
            actor_cls = ray.remote(_CollectorActor)
            for i in range(n):
                opts = {"num_cpus": 1, **configs[i]}
                opts["num_cpus"] = fit_actors_to_cpus("RayCollector", n, opts["num_cpus"]) if i == 0 else self._cpus
                self._cpus = opts["num_cpus"]
                self._actors.append(actor_cls.options(max_restarts=self.max_restarts, max_task_retries=0, **opts).remote(
                    i, n, collector_class, fns[i], policy_ref, policy_factory, per_actor, dict(collector_kwargs or {}),
                    num_workers_per_collector if multi else None, replay_buffer,
                    None if seed is None else seed + 1000 * i))
            self.actor_info = self._gather([a.ping.remote() for a in self._actors], "start", start_timeout)
        except BaseException:
            self.shutdown()
            raise
        self._frames = 0
        self._version = 0
        self._weights_ref: Any = None
        self._seq = [0] * n  # next sequence number per actor
        self._restarts = [0] * n
        self._unavailable_since: dict[int, float] = {}
        self.restart_timeout = 120.0  # seconds an actor may stay unavailable while Ray restarts it
        self._last_error: list[str | None] = [None] * n
        self._returns: list[float] = []
        self._last_info: dict[int, dict] = {}  # each actor's last delivered info (busy_s, idle_s...)

    # ------------------------------------------------------------------ errors
    def _describe(self, i: int) -> str:
        info = self.actor_info[i] if i < len(getattr(self, "actor_info", [])) else {}
        return f"collector actor {i} (node {info.get('node', '?')}, pid {info.get('pid', '?')})"

    def _gather(self, refs: list, what: str, timeout: float | None = None) -> list:
        """The replies of ``refs`` (one per actor); a RayCollectorError naming the actor that
        failed, or the ones that did not answer within ``timeout`` seconds."""
        import ray

        if timeout is not None:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
            if len(ready) < len(refs):
                late = [i for i, ref in enumerate(refs) if ref not in ready]
                raise RayCollectorError(
                    f"RayCollector: collector actors {late} did not {what} within {timeout:g} s (each asks "
                    f"{self._cpus:g} CPU; the Ray cluster has {cluster_cpus():g} CPUs, {free_cpus():g} free); "
                    "shut down other actors, add nodes or lower num_collectors / remote_configs['num_cpus']")
        out = []
        for i, ref in enumerate(refs):
            try:
                out.append(ray.get(ref))
            except ray.exceptions.RayError as err:
                raise RayCollectorError(f"RayCollector: collector actor {i} failed at {what}; remote error:\n{err}") \
                    from None
        return out

    # ------------------------------------------------------------------ requests
    def _submit(self, i: int, seq: int | None = None, ahead: bool = False) -> Any:
        if seq is None:
            seq = self._seq[i]
            self._seq[i] += 1
        w = None if self._weights_ref is None else [self._version, self._weights_ref]
        ref = self._actors[i].collect.remote(seq, w, self._known_layout[i])
        self._pending[ref] = (i, seq, self._version, ahead)
        return ref

    def _drop_outdated(self, keep_current: bool = True) -> None:
        """Forgets the requests sent ahead of a yield that carry an older weight version than
        the newest (their batches are collected with the old weights, so they are never
        delivered nor counted); with ``keep_current=False``, all requests sent ahead. The
        ones still queued at their actor are cancelled (Ray does not interrupt a running
        one: that batch is collected and thrown away)."""
        import ray

        dropped = [ref for ref, (_, _, version, ahead) in self._pending.items()
                   if ahead and (version < self._version or not keep_current)]
        for ref in dropped:
            del self._pending[ref]
            try:
                ray.cancel(ref, recursive=False)
            except Exception:  # noqa: BLE001 - best effort: the result is dropped anyway
                pass
        if dropped:
            self.dropped_batches += len(dropped)
            if keep_current:  # the policy is updated at this rhythm: wait for longer quiet spells
                self._quiet_needed = min(2 * self._quiet_needed, 1 << 20)

    def _may_send_ahead(self) -> bool:
        """Whether the next requests may leave before the batch is yielded: only while the
        policy was not updated after the last ``_quiet_needed`` yields (an update after this
        yield would make them stale: they are then dropped, see :meth:`_drop_outdated`)."""
        return (self.pipelining and self.replay_buffer is None and not self.update_after_each_batch
                and self._quiet >= self._quiet_needed and self._frames < self.total_frames and not self._closed)

    def _send_ahead(self) -> None:
        """Keeps ``_ahead`` (2) requests in flight per actor (one collecting, the next queued at the
        actor: it starts the next batch without waiting for a round trip), never more than
        the batches left to deliver."""
        left, count = self._left_and_in_flight()
        for i in range(self.num_collectors):
            while count[i] < min(self._ahead, left):
                self._submit(i, ahead=True)
                count[i] += 1

    def _left_and_in_flight(self) -> tuple[float, list[int]]:
        """The batches left to deliver, and the requests in flight per actor."""
        count = [0] * self.num_collectors
        for i, *_ in self._pending.values():
            count[i] += 1
        return (self.total_frames - self._frames) / self.frames_per_batch, count

    def _oldest(self, i: int) -> Any:
        """Actor ``i``'s pending request with the lowest number (None if none)."""
        best = None
        for ref, (j, seq, *_) in self._pending.items():
            if j == i and (best is None or seq < best[1]):
                best = (ref, seq)
        return None if best is None else best[0]

    def _batch_of(self, i: int, payload: Any) -> TensorDictBase:
        """Actor ``i``'s batch from its reply."""
        layout = self._layout_of(i, payload)
        return unpack(payload) if layout is None else unpack_flat(layout, [payload[3]])

    def _layout_of(self, i: int, payload: Any) -> FlatLayout | None:
        """The layout of a flat reply (kept when it comes with it); None for another form."""
        if not (type(payload) is tuple and len(payload) == 4 and payload[0] == _BATCH):
            return None
        if payload[2] is not None:
            self._layouts[payload[1]] = payload[2]
        self._known_layout[i] = payload[1]
        return self._layouts[payload[1]]

    def _receive(self, ref: Any) -> tuple[dict, Any] | None:
        """The reply of ``ref`` (its info and its raw payload); None (and the request sent
        again) if its actor died."""
        import ray

        i, seq, _, ahead = self._pending.pop(ref)
        try:
            info, batch = ray.get(ref)
            self._unavailable_since.pop(i, None)
            return info, batch
        except ray.exceptions.RayTaskError as err:  # the collector raised: not retried
            raise RayCollectorError(f"RayCollector: {self._describe(i)} raised while collecting; remote "
                                    f"traceback:\n{err}") from None
        except ray.exceptions.ActorUnavailableError as err:  # dying or restarting: ask again shortly
            self._last_error[i] = _first_line(err)
            if time.monotonic() - self._unavailable_since.setdefault(i, time.monotonic()) > self.restart_timeout:
                raise RayCollectorError(f"RayCollector: {self._describe(i)} did not come back within "
                                        f"{self.restart_timeout:g} s; last error: {self._last_error[i]}") from None
            time.sleep(0.2)
            self._submit(i, seq, ahead)  # same number: counted once, stored once
            return None
        except ray.exceptions.RayActorError as err:  # dead for good: Ray ran out of restarts
            raise RayCollectorError(f"RayCollector: {self._describe(i)} died {self._restarts[i] + 1} times "
                                    f"(max_restarts={self.max_restarts}); last error: {err}") from None

    def _note_incarnation(self, info: dict) -> None:
        """A reply from a new incarnation of actor ``i``: Ray restarted it."""
        i = info["index"]
        known = self.actor_info[i]
        if info["incarnation"] != known["incarnation"]:
            self._restarts[i] += 1
            warnings.warn(f"RayCollector: {self._describe(i)} was restarted ({self._restarts[i]}/{self.max_restarts}) "
                          f"after: {self._last_error[i]}; its lost batch was collected again")
            known.update(incarnation=info["incarnation"], pid=info["pid"], node=info["node"])

    def _accept(self, info: dict) -> None:
        self._last_info[info["index"]] = info
        self._note_incarnation(info)
        self._frames += info["frames"]
        self._returns.extend(info["episode_returns"])
        if self.replay_buffer is not None and "write_count" in info:
            self.replay_buffer.observe({"write_count": info["write_count"]})

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[TensorDictBase | None]:
        return self.iterator()

    def iterator(self) -> Iterator[TensorDictBase | None]:
        """Batches until ``total_frames`` were delivered; iterating again continues the count
        (and returns at once when it is reached). Breaking out keeps requests in flight:
        their batches are the first of the next iteration."""
        if self._closed:
            raise RuntimeError("RayCollector: the collector was shut down")
        gen = self._sync_iterator() if self.sync else self._async_iterator()
        for out in gen:
            yield out
            if self.update_after_each_batch:
                self.update_policy_weights_()

    def _gather_replies(self, want: dict[int, Any]) -> dict[int, tuple[dict, Any]]:
        """The replies of one request per actor (``want``: actor -> ref): one ``ray.get``
        over all of them; where one failed, each is received on its own (a dead actor's
        request is sent again, see :meth:`_receive`)."""
        import ray

        try:
            got = ray.get(list(want.values()))
        except ray.exceptions.RayError:
            got = None
        if got is not None:
            for i, ref in want.items():
                del self._pending[ref]
                self._unavailable_since.pop(i, None)
            return dict(zip(want, got))
        replies: dict[int, tuple[dict, Any]] = {}
        while len(replies) < len(want):
            for i in [i for i in want if i not in replies]:
                got_i = self._receive(want[i])
                if got_i is None:
                    want[i] = self._oldest(i)
                else:
                    replies[i] = got_i
        return replies

    def _stacked(self, payloads: list) -> TensorDictBase:
        """The actors' batches stacked along a new leading dim: their buffers copied straight
        into one new batch when they share a layout (no per-actor TensorDict)."""
        layouts = [self._layout_of(i, p) for i, p in enumerate(payloads)]
        if layouts[0] is not None and all(lay is layouts[0] for lay in layouts):
            return unpack_flat(layouts[0], [p[3] for p in payloads], stack=True)
        return torch.stack([self._batch_of(i, p) for i, p in enumerate(payloads)], 0)

    def _sync_iterator(self) -> Iterator[TensorDictBase | None]:
        """One batch of every actor per yield. While the policy is not being updated, the next
        requests leave as soon as the replies are in (the actors collect while the driver
        stacks and the caller works); a request sent ahead whose batch an update made stale
        is dropped and sent again with the new weights."""
        n = self.num_collectors
        while self._frames < self.total_frames:
            self._drop_outdated()
            want = {i: self._oldest(i) for i in range(n)}
            for i in range(n):
                if want[i] is None:
                    want[i] = self._submit(i)
            replies = self._gather_replies(want)
            for i in range(n):
                self._accept(replies[i][0])
            if self._may_send_ahead():
                self._send_ahead()
            version = self._version
            if self.replay_buffer is not None:
                yield None
            else:
                yield self._stacked([replies[i][1] for i in range(n)])
            self._quiet = self._quiet + 1 if self._version == version else 0

    def _async_iterator(self) -> Iterator[TensorDictBase | None]:
        """Batches in the order they arrive, one request in flight per actor; while the
        policy is not being updated, a second one queued at each actor (sent ahead, as in
        :meth:`_sync_iterator`: dropped if an update makes it stale), never more requests
        than batches left to deliver."""
        import ray

        while self._frames < self.total_frames:
            self._drop_outdated()
            left, count = self._left_and_in_flight()
            for i in range(self.num_collectors):
                if not count[i] and len(self._pending) < left:
                    self._submit(i)
                    count[i] += 1
            if self._may_send_ahead():
                for i in range(self.num_collectors):
                    while count[i] < self._ahead and len(self._pending) < left:
                        self._submit(i, ahead=True)
                        count[i] += 1
            ready, _ = ray.wait(list(self._pending), num_returns=1)
            got = self._receive(ready[0])
            if got is None:
                continue
            self._accept(got[0])
            version = self._version
            yield self._batch_of(got[0]["index"], got[1])
            self._quiet = self._quiet + 1 if self._version == version else 0

    def __len__(self) -> int:
        if self.total_frames == math.inf:
            raise TypeError("RayCollector has no length: total_frames is -1 (no end)")
        return int(self.total_frames // self.frames_per_batch)

    @property
    def frames(self) -> int:
        """Frames delivered so far."""
        return self._frames

    def pop_episode_returns(self) -> list[float]:
        """Returns of the episodes that ended in the batches delivered since the last call."""
        out, self._returns = self._returns, []
        return out

    # ------------------------------------------------------------------ remote buffer loop
    def start(self) -> None:
        """With ``replay_buffer``: collects into it in a background thread until
        ``total_frames`` (the learner samples from the buffer meanwhile). See :meth:`is_running`."""
        if self.replay_buffer is None:
            raise RuntimeError("RayCollector.start needs replay_buffer= (a RayReplayBuffer); otherwise iterate")
        if self._thread is not None:
            return

        def loop() -> None:
            try:
                for _ in self.iterator():
                    if self._closed:
                        return
            except BaseException as err:  # noqa: BLE001 - re-raised by join()
                self._thread_error = err

        self._thread = threading.Thread(target=loop, name="RayCollector", daemon=True)
        self._thread.start()

    def is_running(self) -> bool:
        """Whether the :meth:`start` thread is still collecting."""
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        """Waits for the :meth:`start` thread; re-raises its error."""
        if self._thread is not None:
            self._thread.join(timeout)
        if self._thread_error is not None:
            err, self._thread_error = self._thread_error, None
            raise err

    # ------------------------------------------------------------------ weights
    def update_policy_weights_(self, policy_or_weights: Any = None, *, weights: Any = None, policy: Any = None,
                               worker_ids: Any = None) -> int:
        """Publishes new weights to every actor; returns their version (1 after the first call).

        ``policy_or_weights``: a module, a TensorDict of weights or a ``state_dict``;
        default: the policy given at construction. The weights are put once in Ray's
        object store; every batch requested from now on is collected with them (an actor
        already collecting finishes its batch with the previous version). ``worker_ids``
        is accepted for TorchRL compatibility (every actor gets the newest version).
        """
        import ray

        if self._closed:
            raise RuntimeError("RayCollector: the collector was shut down")
        src = next((s for s in (policy_or_weights, weights, policy) if s is not None), self.policy)
        if src is None:
            raise ValueError("RayCollector.update_policy_weights_: no policy given at construction, pass the weights")
        if isinstance(src, nn.Module):
            src = src.state_dict()
        if isinstance(src, TensorDictBase):
            src = src.detach().cpu()
        else:
            src = self._pack(src)
        self._weights_ref = ray.put(src)
        self._version += 1
        return self._version

    def _pack(self, weights: dict) -> Any:
        """A ``state_dict`` as one contiguous byte buffer (NumPy: actors on a node read it from
        the object store without a copy, and it is serialised as one block, not per tensor)
        plus its layout; the buffer is reused while the layout stays the same."""
        key = tuple((k, v.dtype, tuple(v.shape)) if isinstance(v, torch.Tensor) else (k, id(v))
                    for k, v in weights.items())
        cache = getattr(self, "_pack_cache", None)
        if cache is None or cache[0] != key:
            layout = _layout(weights)
            if layout is None:  # something else than tensors: sent as is
                return {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in weights.items()}
            size = layout[-1][3] + layout[-1][4] if layout else 0
            cache = self._pack_cache = (key, layout, torch.empty(size, dtype=torch.uint8))
        _, layout, buf = cache
        for (_, _, _, off, nbytes), t in zip(layout, weights.values()):
            buf[off:off + nbytes].copy_(t.detach().reshape(-1).cpu().view(torch.uint8))
        return (_FLAT, layout, buf.numpy())

    @property
    def policy_version(self) -> int:
        """Number of :meth:`update_policy_weights_` calls so far."""
        return self._version

    # ------------------------------------------------------------------ state
    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seeds the actors' envs in turn (actor ``i`` gets the seed returned by actor ``i - 1``)."""
        import ray

        self._drop_outdated(keep_current=False)  # collected before the seeding: not delivered
        for a in self._actors:
            seed = ray.get(a.set_seed.remote(seed, static_seed))
        return seed

    def state_dict(self) -> dict:
        """Frame count, weight version and every actor's collector state (after the
        requests in flight are answered: their frames are counted here, their data is
        dropped — call it between iterations; requests sent ahead are dropped uncounted). The actors first take the newest weights,
        so a restored collector collects with the version it was saved at (not the one
        before), and their RNG state is saved too."""
        self._drop_outdated(keep_current=False)  # the actors' saved state comes after those batches
        for ref in list(self._pending):
            got = self._receive(ref)
            if got is not None:
                self._accept(got[0])
        w = None if self._weights_ref is None else [self._version, self._weights_ref]
        states = self._gather([a.state_dict.remote(w) for a in self._actors], "state_dict")
        return {"frames": self._frames, "version": self._version, "seq": list(self._seq),
                "collectors": states, "num_collectors": self.num_collectors} | (
                    {"total_frames": self.total_frames} if self.total_frames != math.inf else {})

    def load_state_dict(self, state: dict) -> None:
        """Restores a :meth:`state_dict` (of a RayCollector with as many actors)."""
        if state.get("num_collectors") != self.num_collectors:
            raise ValueError(f"RayCollector.load_state_dict: the state has {state.get('num_collectors')} collectors, "
                             f"this one {self.num_collectors}")
        self._drop_outdated(keep_current=False)  # collected from the state being replaced
        self._gather([a.load_state_dict.remote(s) for a, s in zip(self._actors, state["collectors"])],
                     "load_state_dict")
        self._frames, self._seq = int(state["frames"]), [int(s) for s in state["seq"]]
        self._version = int(state["version"])
        if self.policy is not None:  # the actors hold that version; resend it if the policy moves on
            self._weights_ref = None

    # ------------------------------------------------------------------ end
    def shutdown(self) -> None:
        """Kills the actors and shuts Ray down if this collector started it (idempotent;
        also at interpreter exit)."""
        if self._closed and not self._actors:
            return
        self._closed = True
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        self._pending = {}
        self._finalizer()
        self._policy_ref = self._weights_ref = None
        if self._owns_ray:
            from ._ray import shutdown_ray

            shutdown_ray()

    def __enter__(self) -> RayCollector:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return (f"RayCollector(num_collectors={self.num_collectors}, sync={self.sync}, frames_per_batch="
                f"{self.frames_per_batch}, total_frames={self.total_frames}, frames={getattr(self, '_frames', 0)})")
