"""Multi-process collector reliability: a failing or dying worker is reported (never a
hang), workers die with their parent (even SIGKILL), nothing leaks (processes,
descriptors, shared memory, semaphores), ``shutdown()`` is idempotent and runs at
garbage collection and at exit.

Every wait is bounded; bounds are generous because the machine may be loaded, but a
hang always ends in a failure, never a stuck run.
"""

from __future__ import annotations

import functools
import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from steersman.collectors import (
    CollectorWorkerError,
    MultiaSyncDataCollector,
    MultiSyncDataCollector,
)
from steersman.envs import CartPoleEnv
from tests.collectors._helpers import FailingEnv

REPO = Path(__file__).resolve().parents[2]
DETECT_S = 10.0
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")


def gone(pid: int) -> bool:
    """True if ``pid`` does not exist or is a zombie (exited, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


def wait_gone(pids, timeout=DETECT_S) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if not gone(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return [p for p in pids if not gone(p)]


def children_of(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                pass
    return out


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


native = functools.partial(CartPoleEnv, batch_size=[2])


# ---------------------------------------------------------------------- failing workers
@pytest.mark.parametrize("cls", [MultiSyncDataCollector, MultiaSyncDataCollector])
def test_worker_exception_is_reported_with_index_type_and_message(cls):
    failing = functools.partial(FailingEnv, fail_at=3, batch_size=[2])
    c = cls([native, failing], None, frames_per_batch=4, total_frames=-1)
    pids = c.worker_pids
    t0 = time.monotonic()
    with pytest.raises(CollectorWorkerError) as info:
        for _ in c:
            pass
    assert time.monotonic() - t0 < DETECT_S
    err = info.value
    assert f"{cls.__name__} worker 1 raised ValueError: FailingEnv failure injected at step 3" in str(err)
    assert "Traceback" in str(err) and "_check" in str(err)  # the worker's traceback
    assert err.worker_index == 1 and err.exc_type == "ValueError"
    assert err.exc_message == "FailingEnv failure injected at step 3"
    assert c.worker_pids == [] and wait_gone(pids) == []


def test_worker_death_and_start_up_failure_are_reported():
    dying = functools.partial(FailingEnv, fail_at=2, mode="exit")
    c = MultiaSyncDataCollector([CartPoleEnv, dying], None, frames_per_batch=4, total_frames=-1)
    pids = c.worker_pids
    t0 = time.monotonic()
    with pytest.raises(CollectorWorkerError, match=rf"worker 1 \(pid {pids[1]}\) exited with code 3") as info:
        for _ in c:
            pass
    assert time.monotonic() - t0 < DETECT_S
    assert info.value.worker_index == 1 and info.value.exitcode == 3
    assert wait_gone(pids) == []
    with pytest.raises(CollectorWorkerError,
                       match=r"worker 1 raised TypeError: .*unexpected keyword argument 'bogus'.*start-up"):
        MultiSyncDataCollector([CartPoleEnv, CartPoleEnv], None, frames_per_batch=4,
                               create_env_kwargs=[{}, {"bogus": 1}])


@pytest.mark.parametrize("cls,how", [(MultiSyncDataCollector, "sleep"), (MultiaSyncDataCollector, "sigstop")])
def test_hung_worker_is_reported_at_the_timeout_and_killed_at_once(cls, how):
    """Reported within timeout + 1 s of the request it did not answer (close_timeout, 10 s
    by default, is not waited for); the late worker is SIGKILLed at once (a stopped one too).
    The async collector times a worker from its own request, though the other delivers."""
    second = functools.partial(FailingEnv, fail_at=3, mode="sleep", batch_size=[2]) if how == "sleep" else native
    c = cls([native, second], None, frames_per_batch=4, total_frames=-1, timeout=3.0)
    pids = c.worker_pids
    it = iter(c)
    t0 = time.monotonic()
    if how == "sigstop":
        next(it)
        os.kill(pids[1], signal.SIGSTOP)
        t0 = time.monotonic()
    with pytest.raises(CollectorWorkerError, match=rf"worker 1 \(pid {pids[1]}\) did not answer a batch within "
                                                   r"3.0 s and was killed; the collector was shut down") as info:
        for _ in it:
            pass
    assert time.monotonic() - t0 < 3.0 + 1.0
    assert info.value.worker_index == 1
    assert c.worker_pids == [] and wait_gone(pids, 1.0) == []


# ---------------------------------------------------------------------- shutdown / leaks
def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_shutdown_is_idempotent_and_leaks_nothing():
    from tests.collectors._helpers import make_policy

    MultiSyncDataCollector(native, None, num_workers=1, frames_per_batch=2).shutdown()  # warm-up
    gc.collect()
    fds, shm, kids = _fds(), _shm(), set(children_of(os.getpid()))
    c = MultiSyncDataCollector(native, make_policy(), num_workers=2, frames_per_batch=8, total_frames=16)
    pids = c.worker_pids
    assert len(list(c)) == 2
    with open(f"/proc/{pids[0]}/maps") as f:  # anonymous memory only, nothing in /dev/shm
        maps = f.read()
    assert "memfd:steersman-collector-batch" in maps and "memfd:steersman-policy-weights" in maps
    c.shutdown()
    c.shutdown()
    assert c.worker_pids == [] and wait_gone(pids) == []
    gc.collect()
    assert _fds() - fds == set()
    assert _shm() - shm == set()  # no shared-memory file, no named semaphore (sem.*)
    assert set(children_of(os.getpid())) - kids == set()
    with pytest.raises(RuntimeError, match="shut down"):
        c.state_dict()


def test_garbage_collected_collector_stops_its_workers():
    c = MultiaSyncDataCollector([native, native], None, frames_per_batch=4, total_frames=-1)
    next(iter(c))  # a batch is in flight in each worker now
    pids = c.worker_pids
    del c
    gc.collect()
    assert wait_gone(pids) == []


# ---------------------------------------------------------------------- parent death / exit
PARENT = textwrap.dedent("""
    import sys, time
    from steersman.collectors import MultiaSyncDataCollector
    from tests.collectors._helpers import native4, parallel2_fork
    if __name__ == "__main__":
        mode = sys.argv[1]
        c = MultiaSyncDataCollector([native4, parallel2_fork], None, frames_per_batch=8, total_frames=-1)
        it = iter(c)
        next(it)
        next(it)  # both workers are collecting their next batch now
        print(" ".join(str(p) for p in c.worker_pids), flush=True)
        if mode == "kill":
            time.sleep(120)
""")


def _start(mode: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-c", PARENT, mode], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _pids(proc: subprocess.Popen, timeout: float = 180.0) -> list[int]:
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    if not sel.select(timeout):
        proc.kill()
        pytest.fail(f"the parent script printed nothing in {timeout} s: {proc.communicate()[1][-2000:]}")
    line = proc.stdout.readline()
    if not line.strip():
        proc.kill()
        pytest.fail(f"the parent script failed: {proc.communicate()[1][-3000:]}")
    return [int(p) for p in line.split()]


@pytest.fixture(scope="module")
def parents():
    """Both parent scripts, started at once (their start-up dominates these tests)."""
    shm = _shm()
    procs = {mode: _start(mode) for mode in ("kill", "exit")}
    yield procs, shm
    for p in procs.values():
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=30)


@pytest.mark.slow  # a fresh interpreter and fork server: tens of seconds on a busy machine
def test_workers_exit_when_their_parent_is_sigkilled(parents):
    procs, shm = parents
    parent = procs["kill"]
    pids = _pids(parent)
    grandchildren = children_of(pids[1])  # worker 1's ParallelEnv workers
    assert len(grandchildren) >= 2 and not any(gone(p) for p in pids)
    parent.kill()  # SIGKILL: no cleanup code runs in the parent
    parent.wait(30)
    assert wait_gone(pids + grandchildren) == [], "workers outlived their SIGKILLed parent"
    assert _shm() - shm == set()


@pytest.mark.slow
def test_forgotten_collector_is_shut_down_at_exit(parents):
    procs, shm = parents
    parent = procs["exit"]
    pids = _pids(parent)
    _, err = parent.communicate(timeout=120)
    assert parent.returncode == 0, err
    assert "Traceback" not in err and "leaked" not in err and "Warning" not in err, err
    assert wait_gone(pids) == []
