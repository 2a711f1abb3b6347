"""LoggerMonitor / Every (stats() polling) and ProcessLogger (a logger in its own process)."""

from __future__ import annotations

import multiprocessing as mp
import pickle
import time

import pytest
import torch

from steersman.collectors import Collector
from steersman.data import LazyTensorStorage, ReplayBuffer
from steersman.envs import CartPoleEnv
from steersman.record import (
    CSVLogger,
    Every,
    Logger,
    LoggerMonitor,
    ProcessLogger,
    read_metrics_csv,
)
from steersman.record.loggers import monitoring


class Rec(Logger):
    def __init__(self) -> None:
        super().__init__("rec", None)
        self.calls: list[tuple[dict, int | None]] = []

    def log_metrics(self, metrics, step=None):
        self.calls.append((dict(metrics), step))


class Counter:
    def __init__(self) -> None:
        self.n = 0
        self.fail = False

    def stats(self):
        if self.fail:
            raise RuntimeError("boom")
        return {"frames": self.n, "name": "x", "nan": float("nan"), "flag": True}


@pytest.fixture
def clock(monkeypatch):
    t = [100.0]
    monkeypatch.setattr(monitoring.time, "monotonic", lambda: t[0])
    return t


@pytest.mark.parametrize("bad", [dict(kind="minutes", interval=1), dict(kind="seconds", interval=0),
                                 dict(kind="seconds", interval=-1.0), dict(kind="counter", interval=5)])
def test_every_refuses_bad_schedules(bad):
    with pytest.raises(ValueError, match="Every"):
        Every(**bad)


def test_counter_schedule_thresholds_jumps_resets_and_rates(clock):
    log, c = Rec(), Counter()
    m = LoggerMonitor(log, background=False)
    assert m.watch(c, schedule=Every.counter("frames", 10), log_on_start=False) == "counter"
    assert m.step() == {}                     # baseline only
    c.n, clock[0] = 9, 101.0
    assert m.step() == {}                     # below 10
    c.n, clock[0] = 35, 102.0                 # jumps over 10, 20, 30: logged once
    out = m.step()["counter"]
    assert out["counter/frames"] == 35.0 and out["counter/flag"] == 1.0
    assert "counter/name" not in out and "counter/nan" not in out
    assert out["counter/frames_per_second"] == pytest.approx(35 / 2.0)
    assert log.calls[-1][1] == 35             # step = the counter
    c.n, clock[0] = 39, 103.0
    assert m.step() == {}                     # next threshold is 40
    c.n, clock[0] = 3, 104.0                  # reset: re-baselined, no log, no negative rate
    assert m.step() == {}
    c.n, clock[0] = 12, 106.0
    out = m.step()["counter"]
    assert out["counter/frames_per_second"] == pytest.approx((12 - 3) / 2.0)
    assert len(log.calls) == 2


def test_seconds_schedule_names_unwatch_and_close(clock):
    log, a, b = Rec(), Counter(), Counter()
    m = LoggerMonitor(log, background=False)
    m.watch(a, schedule=Every.seconds(5))
    assert m.watch(b) == "counter_1"
    with pytest.raises(ValueError, match="already watched"):
        m.watch(a, name="counter")
    assert set(m.step()) == {"counter", "counter_1"}   # log_on_start
    clock[0] = 103.0
    assert set(m.step()) == {"counter_1"}              # no schedule: every poll
    clock[0] = 105.5
    assert set(m.step()) == {"counter", "counter_1"}
    m.unwatch("counter_1")
    with pytest.raises(KeyError, match="counter_1"):
        m.unwatch("counter_1")
    n = len(log.calls)
    m.start()
    m.stop()                                           # final snapshot of each watch
    m.stop()                                           # idempotent
    assert len(log.calls) == n + 1


def test_errors_warn_ignore_raise(caplog):
    c = Counter()
    c.fail = True
    with pytest.raises(TypeError, match="stats"):
        LoggerMonitor(Rec(), background=False).watch(object())
    with pytest.raises(ValueError, match="on_error"):
        LoggerMonitor(Rec(), on_error="loud")
    m = LoggerMonitor(Rec(), background=False)
    m.watch(c)
    assert m.step() == {} and m.step() == {}
    assert sum("boom" in r.getMessage() for r in caplog.records) == 1   # once per streak
    c.fail = False
    assert "counter" in m.step()
    r = LoggerMonitor(Rec(), background=False, on_error="raise")
    r.watch(c)
    c.fail = True
    with pytest.raises(RuntimeError, match="boom"):
        r.step()


def test_background_monitor_watches_a_collector_and_a_replay_buffer(tmp_path):
    collector = Collector(CartPoleEnv(), frames_per_batch=8, total_frames=32)
    rb = ReplayBuffer(storage=LazyTensorStorage(100))
    logger = CSVLogger("mon", tmp_path)
    with LoggerMonitor(logger, poll_interval=0.01) as m:
        m.watch(collector, name="collector", schedule=Every.counter("frames", 16))
        m.watch(rb, name="rb", step="write_count")
        for batch in collector:
            rb.extend(batch.reshape(-1))
            time.sleep(0.03)
    logger.close()
    cols = read_metrics_csv(tmp_path / "mon" / "metrics.csv")
    frames = [v for v in cols["collector/frames"] if v == v]
    assert frames[-1] == 32.0 and 16.0 <= max(frames[:-1] or [16.0])
    assert [v for v in cols["rb/size"] if v == v][-1] == 32.0
    assert [v for v in cols["rb/utilization"] if v == v][-1] == pytest.approx(0.32)
    s = collector.stats()
    assert s == {"frames": 32, "batches": 4, "total_frames": 32, "completed": True,
                 "requested_frames_per_batch": 8, "policy_version": 0}
    assert "total_frames" not in Collector(CartPoleEnv(), frames_per_batch=4).stats()


def _log_from_child(client):
    client.log_scalar("child", 7.0, step=3)


def test_process_logger_round_trip_client_and_errors(tmp_path):
    logger = ProcessLogger(CSVLogger, exp_name="proc", log_dir=str(tmp_path), mp_context="fork")
    try:
        assert logger.is_alive and logger.exp_name == "proc"
        logger.log_metrics({"loss": torch.tensor(0.5), "ret": 2}, step=1)
        client = pickle.loads(pickle.dumps(logger.client()))
        p = mp.get_context("fork").Process(target=_log_from_child, args=(client,))
        p.start()
        p.join(30)
        assert p.exitcode == 0
        with pytest.raises(RuntimeError, match="only the ProcessLogger"):
            client.flush()
        with pytest.raises(TypeError, match="client"):
            pickle.dumps(logger)
        logger._send("no_such_method")        # fails in the logger process: reported at flush
        with pytest.raises(RuntimeError, match="no_such_method"):
            logger.flush()
        logger.flush()                         # errors are reported once
    finally:
        logger.shutdown()
    assert not logger.is_alive
    with pytest.raises(RuntimeError, match="shut down"):
        logger.log_scalar("late", 1.0)
    cols = read_metrics_csv(tmp_path / "proc" / "metrics.csv")
    assert cols["loss"][0] == 0.5 and cols["ret"][0] == 2.0 and 7.0 in cols["child"]


def test_process_logger_reports_a_failing_constructor():
    with pytest.raises(RuntimeError, match="building the logger failed"):
        ProcessLogger(CSVLogger, exp_name="x", log_dir=None, mp_context="fork", no_such_option=1)
