"""Starting and joining Ray: the one place that imports it (lazily), sizes a local
instance for the machine and refuses an address that does not answer within seconds."""

from __future__ import annotations

import atexit
import math
import os
import shutil
import socket
import time
import warnings
from typing import Any

__all__ = ["RAY_EXTRA", "require_ray", "init_ray", "shm_bytes", "cluster_cpus", "fit_actors_to_cpus"]

RAY_EXTRA = "pip install 'steersman[ray]'"
_SHM_WARN = 1 << 30  # warn below 1 GiB of /dev/shm: Ray's object store lives there
_started_here = False


def require_ray() -> Any:
    """The ``ray`` module, or an ImportError naming the extra to install."""
    try:
        import ray
    except ImportError as err:
        raise ImportError(f"steersman.distributed needs Ray, which is not installed: {RAY_EXTRA}") from err
    return ray


def shm_bytes(path: str = "/dev/shm") -> int | None:
    """Free bytes of ``/dev/shm`` (None where there is none, e.g. macOS)."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _check_reachable(address: str, timeout: float) -> None:
    """A ``host:port`` (``ray://`` too) that takes no TCP connection within ``timeout`` s:
    a ConnectionError naming it (Ray itself would retry for a minute or more)."""
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"ray address must be 'auto', 'host:port' or 'ray://host:port', got {address!r}")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as err:
        raise ConnectionError(
            f"no Ray cluster answers at {address} (within {timeout:g} s: {err}); start one with "
            f"`ray start --head --port={port}` on {host}, or leave the address unset for a local instance"
        ) from None


def init_ray(ray_init_config: dict | None = None, *, address: str | None = None, connect_timeout: float = 5.0) -> bool:
    """Starts or joins Ray unless it already runs in this process; returns True if it started it.

    Without an address: a new local instance (never one already running on the machine:
    that is ``address="auto"``) with the dashboard off, workers at the driver's
    priority (Ray's default niceness 15 starves collector actors on a busy machine),
    ``num_cpus`` = the machine's CPUs and an object store of 30% of RAM capped by the free ``/dev/shm``
    (a warning with the numbers when ``/dev/shm`` is under 1 GiB, as in many containers).
    ``address="auto"`` joins the cluster started on this machine with ``ray start --head``;
    ``"host:port"`` joins that one (checked first: a ConnectionError within
    ``connect_timeout`` seconds if nothing answers). ``ray_init_config`` entries win over
    these defaults. Ray started here is shut down at interpreter exit.
    """
    global _started_here
    ray = require_ray()
    if ray.is_initialized():
        return False
    cfg = dict(ray_init_config or {})
    address = cfg.pop("address", address)
    if address is None:
        address = os.environ.get("RAY_ADDRESS") or None
    if address is not None and address != "auto" and not address.startswith("local"):
        _check_reachable(address, connect_timeout)
    if address is None:
        shm = shm_bytes()
        if shm is not None and shm < _SHM_WARN:
            warnings.warn(f"/dev/shm has {shm / 2**20:.0f} MiB free (Ray keeps its object store there; "
                          f"{_SHM_WARN / 2**20:.0f} MiB or more is advised): give the container more "
                          "(docker --shm-size=2g) or pass ray_init_config={'object_store_memory': ...}")
        if "object_store_memory" not in cfg:
            ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            store = int(0.3 * ram)
            if shm is not None:
                store = min(store, int(0.8 * shm))
            cfg["object_store_memory"] = max(store, 80 * 2**20)  # Ray's minimum is 75 MiB
        cfg.setdefault("num_cpus", os.cpu_count() or 1)
        # Ray runs its workers at niceness 15 (to keep a laptop's driver responsive): collector
        # actors then lose the CPU to everything else on a busy machine. Same priority as the driver.
        cfg.setdefault("_system_config", {}).setdefault("worker_niceness", 0)
    cfg.setdefault("include_dashboard", False)
    cfg.setdefault("log_to_driver", True)
    try:
        # "local": a new instance; with None, Ray would join whatever `ray start` cluster
        # runs on this machine (someone else's, on a shared machine); that is address="auto"
        ray.init(address="local" if address is None else address, **cfg)
    except ConnectionError as err:
        raise ConnectionError(f"could not join the Ray cluster at {address!r}: {err}") from None
    _started_here = True
    atexit.register(shutdown_ray)
    return True


def shutdown_ray() -> None:
    """``ray.shutdown()`` if Ray was started by :func:`init_ray` (idempotent)."""
    global _started_here
    if _started_here:
        _started_here = False
        import ray

        if ray.is_initialized():
            ray.shutdown()


def cluster_cpus() -> float:
    """CPUs of the Ray cluster this process is connected to."""
    import ray

    return float(ray.cluster_resources().get("CPU", 0.0))


def free_cpus() -> float:
    """CPUs of the Ray cluster not held by an actor or task right now."""
    import ray

    return float(ray.available_resources().get("CPU", 0.0))


#: Seconds :func:`fit_actors_to_cpus` waits for CPUs to come free when the cluster has them
#: in all: killed actors give theirs back asynchronously (~0.07 s after a collector's
#: ``shutdown()`` on a local Ray here), so a collector made right after another one shut
#: down would otherwise find them held.
RELEASE_WAIT_S = 2.0


def fit_actors_to_cpus(owner: str, n: int, num_cpus: float) -> float:
    """``num_cpus`` per actor, or a share small enough that ``n`` actors all get placed now
    (with a warning giving the numbers) when the cluster has fewer CPUs free than they ask:
    fewer CPUs than that in all, or CPUs still held by other actors after
    :data:`RELEASE_WAIT_S` (another collector's: actors asking for more than is free would
    wait for them forever)."""
    total, free = cluster_cpus(), free_cpus()
    deadline = time.monotonic() + RELEASE_WAIT_S
    while free < n * num_cpus <= total and time.monotonic() < deadline:
        time.sleep(0.02)
        free = free_cpus()
    if n * num_cpus <= free or num_cpus == 0:
        return num_cpus
    # 1/m of a CPU each: nodes with whole CPUs then hold m actors per CPU, m * free >= n
    share = 1.0 / math.ceil(n / free) if free >= 1 else 0.0
    held = f" ({free:g} free: other actors hold the rest)" if free < total else ""
    warnings.warn(f"{owner}: {n} actors x {num_cpus:g} CPU = {n * num_cpus:g} CPUs requested, the Ray cluster "
                  f"has {total:g}{held}; each actor gets {share:.3g} CPU instead (they share cores: expect fewer "
                  "frames/s per actor). Add nodes, lower num_collectors or shut down the other actors.")
    return share
