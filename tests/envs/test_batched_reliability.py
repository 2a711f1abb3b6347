"""ParallelEnv reliability: failing and dying workers are reported (never a hang), workers
die with their parent (even SIGKILL), nothing leaks (processes, fds, shared memory,
semaphores), close() is idempotent and runs at exit.

Every wait here is bounded; the bounds are generous because the test machine may be
loaded (2 busy cores), but a hang always ends in a failure, never a stuck run.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from steersman.envs.batched import EnvWorkerError, ParallelEnv, SerialEnv
from tests.envs._batched_helpers import ToyEnv, make_toy

REPO = Path(__file__).resolve().parents[2]
DETECT_S = 10.0  # "within seconds": generous bound for a loaded machine
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


def fail_kwargs(worker: int, n: int = 2, **kw) -> list[dict]:
    return [kw if i == worker else {} for i in range(n)]


# ---------------------------------------------------------------------- failing workers
@pytest.mark.parametrize("where", ["step", "reset"])
def test_worker_exception_is_reported_with_index_type_and_message(where):
    env = ParallelEnv(3, make_toy, fail_kwargs(2, 3, fail_at=1, fail_in=where))
    pids = env.worker_pids
    td = env.rand_action(env.reset())  # reset number 0 passes
    t0 = time.monotonic()
    with pytest.raises(EnvWorkerError) as info:
        if where == "step":
            env.rand_step(td)  # step 0 passes, step 1 raises
            env.rand_step(td)
        else:
            env.reset()
    assert time.monotonic() - t0 < DETECT_S
    err = info.value
    msg = str(err)
    assert "worker 2 raised ValueError: ToyEnv failure injected" in msg
    assert "Traceback" in msg and "_maybe_fail" in msg  # the worker's traceback
    assert err.worker_index == 2 and err.exc_type == "ValueError"
    # an exception is not a crash: the env and every worker stay, and go on serving
    assert "nothing was closed" in msg and not env.is_closed and env.worker_pids == pids
    env.reset()
    assert env.rand_step(env.rand_action(env.reset()))["next", "observation"].shape == (3, 3)
    env.close()
    assert wait_gone(pids) == []


@pytest.mark.parametrize("mode,expect", [("exit", "exited with code 3"),
                                         ("kill", "was killed by signal SIGKILL")])
def test_worker_death_is_reported(mode, expect):
    env = ParallelEnv(2, make_toy, fail_kwargs(1, fail_at=0, fail_mode=mode))
    pids = env.worker_pids
    td = env.rand_action(env.reset())
    t0 = time.monotonic()
    with pytest.raises(EnvWorkerError, match=f"worker 1 \\(pid {pids[1]}\\) {expect}") as info:
        env.step_and_maybe_reset(td)
    assert time.monotonic() - t0 < DETECT_S
    assert info.value.worker_index == 1 and info.value.exitcode is not None
    assert env.is_closed
    assert wait_gone(pids) == []


def test_worker_killed_from_outside_while_idle():
    env = ParallelEnv(2, ToyEnv)
    td = env.rand_action(env.reset())
    pid = env.worker_pids[0]
    os.kill(pid, signal.SIGKILL)
    assert wait_gone([pid]) == []
    t0 = time.monotonic()
    with pytest.raises(EnvWorkerError, match="worker 0 .* killed by signal SIGKILL"):
        env.step(td)
    assert time.monotonic() - t0 < DETECT_S
    with pytest.raises(Exception, match="closed"):
        env.step(td)


def test_worker_failing_at_start_up():
    t0 = time.monotonic()
    with pytest.raises(EnvWorkerError, match=r"worker 1 raised TypeError: .*unexpected keyword argument 'bogus'"):
        ParallelEnv(2, make_toy, [{}, {"bogus": 1}])
    assert time.monotonic() - t0 < 60


@pytest.mark.parametrize("how", ["sleep", "sigstop"])
def test_hung_worker_is_reported_at_the_timeout_and_killed_at_once(how):
    """Reported within timeout + 1 s (close_timeout, 10 s by default, is not waited for):
    the worker that missed the timeout is SIGKILLed at once, which also ends a stopped one."""
    kwargs = fail_kwargs(0, fail_at=0, fail_mode="sleep") if how == "sleep" else {}
    env = ParallelEnv(2, make_toy, kwargs, timeout=2.0)
    pids = env.worker_pids
    td = env.rand_action(env.reset())
    if how == "sigstop":
        os.kill(pids[0], signal.SIGSTOP)
    t0 = time.monotonic()
    with pytest.raises(EnvWorkerError, match=rf"worker 0 \(pid {pids[0]}\) did not answer a step or reset "
                                             r"within 2.0 s and was killed; the env was closed") as info:
        env.step(td)
    assert 2.0 <= time.monotonic() - t0 < 3.0
    assert info.value.worker_index == 0
    assert env.is_closed and env.worker_pids == []
    assert wait_gone(pids, 1.0) == []


def test_step_before_reset_raises_and_the_env_stays_usable():
    pytest.importorskip("gymnasium")
    from steersman.envs.libs import GymEnv

    env = ParallelEnv(2, lambda: GymEnv("CartPole-v1", categorical_action_encoding=True))
    pids = env.worker_pids
    try:
        td = env.full_action_spec.zero()
        with pytest.raises(EnvWorkerError, match=r"worker 0 raised .*ResetNeeded: Cannot call env.step\(\) "
                                                 r"before calling env.reset\(\).*nothing was closed"):
            env.step(td)
        assert not env.is_closed and env.worker_pids == pids
        env.set_seed(0)
        assert env.rollout(5, break_when_any_done=False).batch_size == (2, 5)
    finally:
        env.close()


@pytest.mark.parametrize("cls", [SerialEnv, ParallelEnv])
def test_out_of_spec_action_is_refused_and_the_env_stays_usable(cls):
    from steersman.envs import CartPoleEnv

    env = cls(2, CartPoleEnv)
    try:
        env.set_seed(0)
        td = env.reset()
        before = td["observation"].clone()
        td["action"] = torch.tensor([0, 5])
        for call in (env.step, env.step_and_maybe_reset):
            with pytest.raises(ValueError, match=r"action 'action' = \[0, 5\] is outside the action spec "
                                                 r"Categorical\(.*n=2"):
                call(td)
        assert not env.is_closed
        td["action"] = torch.tensor([0, 1])
        assert torch.equal(td["observation"], before)
        out, _ = env.step_and_maybe_reset(td)  # state unchanged: the same step as a fresh one
        ref = SerialEnv(2, CartPoleEnv)
        ref.set_seed(0)
        expected = ref.step(ref.reset().set("action", torch.tensor([0, 1])))
        ref.close()
        assert torch.equal(out["next", "observation"], expected["next", "observation"])
    finally:
        env.close()


def test_serial_env_exception_names_worker():
    env = SerialEnv(2, make_toy, fail_kwargs(1, fail_at=0))
    td = env.rand_action(env.reset())
    with pytest.raises(ValueError, match="failure injected") as info:
        env.step(td)
    assert any("SerialEnv worker 1" in n for n in info.value.__notes__)


# ---------------------------------------------------------------------- close / leaks
def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_close_idempotent_no_fd_or_process_leak():
    ParallelEnv(2, ToyEnv).close()  # warm-up: the forkserver's own descriptors exist now
    gc.collect()
    before = _fds()
    env = ParallelEnv(2, ToyEnv)
    pids = env.worker_pids
    # the exchange buffer is an anonymous memfd in every worker, nothing in /dev/shm
    with open(f"/proc/{pids[0]}/maps") as f:
        assert "memfd:steersman-batched-env" in f.read()
    env.rollout(5)
    env.close()
    env.close()
    assert env.is_closed and wait_gone(pids) == []
    gc.collect()
    assert _fds() - before == set()


def test_close_runs_the_sub_envs_close(tmp_path):
    marker = tmp_path / "closed.txt"
    env = ParallelEnv(2, make_toy, {"close_marker": str(marker)})
    pids = env.worker_pids
    env.close()
    # the probe env (built and closed in this process) and every worker's env
    assert sorted(int(x) for x in marker.read_text().split()) == sorted([os.getpid(), *pids])


def test_interrupted_wait_is_drained_before_the_next_command():
    """A KeyboardInterrupt while waiting for replies must not shift replies by one."""
    env = ParallelEnv(2, ToyEnv)
    serial = SerialEnv(2, ToyEnv)
    try:
        td = env.rand_action(env.reset())
        pool = env._pool
        real = pool.wait

        def interrupted(*args, **kwargs):
            pool.wait = real
            raise KeyboardInterrupt

        pool.wait = interrupted
        with pytest.raises(KeyboardInterrupt):
            env.step(td)
        assert pool.inflight
        for e in (env, serial):
            e.set_seed(2)
        torch.manual_seed(0)
        a = env.rollout(12, break_when_any_done=False)
        torch.manual_seed(0)
        b = serial.rollout(12, break_when_any_done=False)
        assert (a == b).all()
    finally:
        env.close()
        serial.close()


def test_forked_child_exit_does_not_close_the_parents_workers():
    env = ParallelEnv(2, ToyEnv)
    try:
        pid = os.fork()
        if pid == 0:  # the child runs the env's exit-time finalizer, as its atexit would
            try:
                env._pool._finalizer()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert all(not gone(p) for p in env.worker_pids)
        env.rollout(3)  # still served
    finally:
        env.close()


def test_garbage_collected_env_closes_its_workers():
    env = ParallelEnv(2, ToyEnv)
    pids = env.worker_pids
    env.reset()
    del env
    gc.collect()
    assert wait_gone(pids) == []


def test_close_while_a_worker_hangs_is_bounded():
    env = ParallelEnv(2, make_toy, fail_kwargs(1, fail_at=0, fail_mode="sleep"),
                      timeout=0.5, close_timeout=0.5)
    pids = env.worker_pids
    td = env.rand_action(env.reset())
    t0 = time.monotonic()
    with pytest.raises(EnvWorkerError):
        env.step(td)
    env.close()
    assert time.monotonic() - t0 < DETECT_S and wait_gone(pids) == []


# ---------------------------------------------------------------------- parent death / exit
PARENT = textwrap.dedent("""
    import sys, time, torch
    import multiprocessing.resource_tracker as rt
    from multiprocessing import forkserver
    method, mode, marker = sys.argv[1], sys.argv[2], sys.argv[3]
    if mode == "exit":
        torch.multiprocessing.set_sharing_strategy("file_system")  # must not matter
    from steersman.envs.batched import ParallelEnv
    from tests.envs._batched_helpers import ToyEnv
    if __name__ == "__main__":
        a = ParallelEnv(2, ToyEnv, mp_start_method=method)
        a.rollout(5)
        a.close()
        b = ParallelEnv(2, ToyEnv, {"close_marker": marker}, mp_start_method=method)  # never closed
        b.rollout(5, break_when_any_done=False)
        helpers = [forkserver._forkserver._forkserver_pid, rt._resource_tracker._pid]
        print(" ".join(str(p) for p in b.worker_pids + [h for h in helpers if h]), flush=True)
        if mode == "kill":
            time.sleep(120)
""")


def _shm_entries() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:  # pragma: no cover
        return set()


def _ours(entries: set[str], pid: int) -> set[str]:
    return {e for e in entries if str(pid) in e or e.startswith(("sem.mp", "psm_", "steersman"))}


def _start_parent(method: str, mode: str, marker: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-c", PARENT, method, mode, str(marker)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _read_pids(proc: subprocess.Popen, timeout: float = 120.0) -> list[int]:
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


PARENT_RUNS = {"kill-forkserver": ("forkserver", "kill"), "kill-fork": ("fork", "kill"),
               "exit-forkserver": ("forkserver", "exit")}


@pytest.fixture(scope="module")
def parents(tmp_path_factory):
    """The parent scripts, all started at once (their start-up dominates these tests)."""
    shm_before = _shm_entries()
    tmp = tmp_path_factory.mktemp("parents")
    procs = {name: _start_parent(*args, tmp / f"{name}.closed") for name, args in PARENT_RUNS.items()}
    procs["tmp"] = tmp
    yield procs, shm_before
    for name in PARENT_RUNS:
        proc = procs[name]
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


@pytest.mark.parametrize("method", ["forkserver", "fork"])
def test_workers_exit_when_parent_is_sigkilled(parents, method):
    procs, shm_before = parents
    parent = procs[f"kill-{method}"]
    pids = _read_pids(parent)
    assert len(pids) >= 2 and all(not gone(p) for p in pids[:2])
    parent.kill()  # SIGKILL: no cleanup code runs in the parent
    parent.wait(30)
    assert wait_gone(pids) == [], "workers (or mp helpers) outlived their SIGKILLed parent"
    assert _ours(_shm_entries() - shm_before, parent.pid) == set()


def test_forgotten_env_is_closed_at_exit_without_warnings(parents):
    """The parent exits without close(): workers are closed by the finalizer, the exit
    does not hang, and neither resource_tracker nor anything else complains."""
    procs, shm_before = parents
    parent = procs["exit-forkserver"]
    pids = _read_pids(parent)
    _, err = parent.communicate(timeout=60)
    assert parent.returncode == 0, err
    assert "resource_tracker" not in err and "leaked" not in err and "Traceback" not in err, err
    assert "Warning" not in err, err
    assert wait_gone(pids) == []
    # closed gracefully: every worker ran its env's close() (the probe's close comes first)
    closed = [int(x) for x in (procs["tmp"] / "exit-forkserver.closed").read_text().split()]
    assert set(pids[:2]) <= set(closed)
    assert _ours(_shm_entries() - shm_before, parent.pid) == set()


def test_spawn_start_method_works():
    # one worker: a spawned worker re-imports torch, seconds on a busy machine
    with ParallelEnv(1, ToyEnv, mp_start_method="spawn") as env, SerialEnv(1, ToyEnv) as ser:
        for e in (env, ser):
            e.set_seed(3)
        torch.manual_seed(1)
        a = env.rollout(10, break_when_any_done=False)
        torch.manual_seed(1)
        b = ser.rollout(10, break_when_any_done=False)
        assert (a == b).all()


# ---------------------------------------------------------------------- factories from __main__
MAIN_FACTORY = textwrap.dedent("""
    from steersman.collectors import MultiSyncDataCollector
    from steersman.envs import CartPoleEnv
    from steersman.envs.batched import ParallelEnv

    def make_env():  # defined in the __main__ of `python -c`, as in a notebook: no worker can import it
        return CartPoleEnv(batch_size=[2])

    if __name__ == "__main__":
        with ParallelEnv(2, make_env) as env:
            print(list(env.rollout(3).batch_size))
        c = MultiSyncDataCollector(make_env, num_workers=2, frames_per_batch=8, total_frames=8)
        print([list(b.batch_size) for b in c])
        c.shutdown()
""")


@pytest.mark.slow  # a fresh interpreter and fork server
def test_factory_defined_in_main_is_sent_by_value():
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", MAIN_FACTORY], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[:2] == ["[2, 2, 3]", "[[2, 2, 2]]"]
