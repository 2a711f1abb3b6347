"""Loggers: CSV wide format (new columns, resume), TensorBoard read-back, fan-out, factory."""

from __future__ import annotations

import math
import sys
import tempfile
import types
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.record import (
    LOGGER_TYPES,
    CSVLogger,
    Logger,
    MLFlowLogger,
    MultiLogger,
    generate_exp_name,
    get_logger,
    read_metrics_csv,
)


def reference_rows(ops):
    """Wide rows from (name, value, step) calls: consecutive calls with one step share a row."""
    rows, columns = [], []
    for name, value, step in ops:
        if name not in columns:
            columns.append(name)
        if not rows or rows[-1][0] != step:
            rows.append((step, {}))
        rows[-1][1][name] = value
    return columns, rows


def as_columns(columns, rows):
    cols = {"step": [float(s) for s, _ in rows]}
    for c in columns:
        cols[c] = [float(r.get(c, math.nan)) for _, r in rows]
    return cols


def same(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(
        len(a[k]) == len(b[k]) and all((x == y) or (math.isnan(x) and math.isnan(y)) for x, y in zip(a[k], b[k]))
        for k in a
    )


names = st.sampled_from(["train/return", "loss", 'odd,"name"', "eval/return"])
values = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**6, 10**6))
ops_strategy = st.lists(st.tuples(names, values, st.integers(0, 2)), max_size=25).map(
    lambda ops: [(n, v, s) for (n, v, _), s in zip(ops, _cumsum([d for _, _, d in ops]))]
)


def _cumsum(xs):
    out, t = [], 0
    for x in xs:
        t += x
        out.append(t)
    return out


@settings(max_examples=40, deadline=None)
@given(ops=ops_strategy)
def test_csv_matches_reference(ops):
    with tempfile.TemporaryDirectory() as d:
        with CSVLogger("run", d) as log:
            for name, value, step in ops:
                log.log_scalar(name, value, step)
        got = read_metrics_csv(Path(d) / "run" / "metrics.csv")
    assert same(got, as_columns(*reference_rows(ops)))


@settings(max_examples=30, deadline=None)
@given(ops=ops_strategy, more=ops_strategy, start=st.integers(-1, 30))
def test_csv_resume_drops_rows_past_start_step(ops, more, start):
    """Reopening with start_step=S keeps rows with step <= S, then appends the new ones."""
    more = [(n, v, s + start + 1) for n, v, s in more]  # the resumed run logs after S
    with tempfile.TemporaryDirectory() as d:
        with CSVLogger("run", d) as log:
            for op in ops:
                log.log_scalar(*op)
        with CSVLogger("run", d, start_step=start) as log:
            for op in more:
                log.log_scalar(*op)
        got = read_metrics_csv(Path(d) / "run" / "metrics.csv")
    columns, rows = reference_rows(ops)
    rows = [r for r in rows if r[0] <= start]
    more_cols, more_rows = reference_rows(more)
    columns += [c for c in more_cols if c not in columns]
    assert same(got, as_columns(columns, rows + more_rows))


def test_csv_new_column_mid_run(tmp_path):
    log = CSVLogger("run", tmp_path)
    log.log_scalar("a", 1.0, step=0)
    log.log_scalar("a", 2.0, step=1)
    log.log_scalar("b", 3.0, step=1)  # new column while step 1's row is open
    log.log_scalar("c", 4, step=2)
    assert (tmp_path / "run" / "metrics.csv").read_text() == "step,a,b,c\n0,1.0,,\n1,2.0,3.0,\n2,,,4\n"
    assert log.columns == ["a", "b", "c"]
    assert not list((tmp_path / "run").glob("*.tmp"))
    log.close()


def test_csv_every_write_reaches_the_file(tmp_path):
    """Without close(), another reader sees each row as soon as log_* returns (so a killed
    process loses nothing already logged)."""
    log = CSVLogger("run", tmp_path)
    path = tmp_path / "run" / "metrics.csv"
    log.log_metrics({"loss": 0.5, "return": torch.tensor(3.0)}, step=10)
    assert path.read_text() == "step,loss,return\n10,0.5,3.0\n"
    log.log_scalar("loss", 0.25, step=20)
    assert path.read_text() == "step,loss,return\n10,0.5,3.0\n20,0.25,\n"
    log.close()


def test_csv_reopen_without_start_step_keeps_rows(tmp_path):
    with CSVLogger("run", tmp_path) as log:
        log.log_scalar("a", 1.0, step=5)
    with CSVLogger("run", tmp_path) as log:
        assert log.columns == ["a"]
        log.log_scalar("b", 2.0, step=6)
    assert (tmp_path / "run" / "metrics.csv").read_text() == "step,a,b\n5,1.0,\n6,,2.0\n"


def test_csv_step_none_uses_current_row(tmp_path):
    with CSVLogger("run", tmp_path) as log:
        log.log_scalar("a", 1.0)          # no step yet: step 0
        log.log_scalar("a", 2.0, step=7)
        log.log_scalar("b", 3.0)          # joins step 7's row
    assert (tmp_path / "run" / "metrics.csv").read_text() == "step,a,b\n0,1.0,\n7,2.0,3.0\n"


@pytest.mark.parametrize("bad, err, match", [
    (torch.zeros(2), ValueError, r"metric 'm' must be a scalar, got a tensor of shape \(2,\)"),
    ("high", TypeError, "metric 'm' must be a number, got str"),
    (None, TypeError, "metric 'm' must be a number, got NoneType"),
])
def test_csv_bad_value_changes_nothing(tmp_path, bad, err, match):
    with CSVLogger("run", tmp_path) as log:
        log.log_scalar("a", 1.0, step=0)
        before = (tmp_path / "run" / "metrics.csv").read_text()
        with pytest.raises(err, match=match):
            log.log_metrics({"new": 1.0, "m": bad}, step=1)
        assert (tmp_path / "run" / "metrics.csv").read_text() == before and log.columns == ["a"]


def test_csv_not_a_metrics_file(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.csv").write_text("time,loss\n1,2\n")
    with pytest.raises(ValueError, match="not a metrics file written by CSVLogger"):
        CSVLogger("run", tmp_path)


def test_csv_closed(tmp_path):
    log = CSVLogger("run", tmp_path)
    log.close()
    log.close()
    with pytest.raises(ValueError, match="is closed"):
        log.log_scalar("a", 1.0)


def test_csv_hparams_text_video(tmp_path):
    with CSVLogger("run", tmp_path, video_format="pt") as log:
        log.log_hparams({"optim": {"lr": 1e-3}, "seed": 0})
        log.log_str("notes", "hello", step=3)
        video = torch.randint(0, 255, (4, 3, 8, 8), dtype=torch.uint8)
        log.log_video("eval/video", video, step=100)
    run = tmp_path / "run"
    assert '"lr": 0.001' in (run / "hparams.json").read_text()
    assert (run / "texts" / "notes.txt").read_text() == "[step 3] hello\n"
    assert torch.equal(torch.load(run / "videos" / "eval_video_100.pt", weights_only=True), video)


def test_csv_video_gif(tmp_path):
    pytest.importorskip("imageio")
    import imageio.v3 as iio

    with CSVLogger("run", tmp_path, video_format="gif") as log:
        log.log_video("clip", torch.randint(0, 255, (5, 3, 10, 12), dtype=torch.uint8), step=1)
    assert iio.imread(tmp_path / "run" / "videos" / "clip_1.gif").shape[:3] == (5, 10, 12)


def test_csv_bad_video_format(tmp_path):
    with pytest.raises(ValueError, match="video_format must be"):
        CSVLogger("run", tmp_path, video_format="avi")


# ---------------------------------------------------------------------- tensorboard
def test_tensorboard_read_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from steersman.record import TensorboardLogger

    with TensorboardLogger("run", tmp_path) as log:
        log.log_scalar("train/return", 1.5, step=10)
        log.log_metrics({"train/return": torch.tensor(2.5), "loss": 0.1}, step=20)
        log.log_hparams({"lr": 0.01})
        log.log_str("notes", "hi", step=20)
        log.log_video("video", torch.zeros(3, 3, 8, 8, dtype=torch.uint8), step=20)
    acc = EventAccumulator(str(tmp_path / "run"), size_guidance={"images": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/return")] == [(10, 1.5), (20, 2.5)]
    assert [(e.step, round(e.value, 6)) for e in acc.Scalars("loss")] == [(20, 0.1)]
    assert set(acc.Tags()["tensors"]) >= {"hparams/text_summary", "notes/text_summary"}
    (img,) = acc.Images("video")
    assert (img.step, img.width, img.height) == (20, 8, 8)
    assert img.encoded_image_string[:6] == b"GIF89a"


# ---------------------------------------------------------------------- others
class ListLogger(Logger):
    def __init__(self):
        super().__init__("list", None)
        self.calls = []

    def log_scalar(self, name, value, step=None):
        self.calls.append(("scalar", name, value, step))

    def log_hparams(self, cfg):
        self.calls.append(("hparams", cfg))

    def log_video(self, name, video, step=None, **kwargs):
        self.calls.append(("video", name, step))

    def log_str(self, name, value, step=None):
        self.calls.append(("str", name, value, step))

    def close(self):
        self.calls.append(("close",))


def test_multilogger_fans_out():
    a, b = ListLogger(), ListLogger()
    with MultiLogger(a, b) as log:
        log.log_scalar("x", 1.0, 3)
        log.log_metrics({"y": 2.0}, 4)
        log.log_hparams({"k": 1})
        log.log_video("v", torch.zeros(1), 5)
        log.log_str("s", "t", 6)
    expected = [("scalar", "x", 1.0, 3), ("scalar", "y", 2.0, 4), ("hparams", {"k": 1}),
                ("video", "v", 5), ("str", "s", "t", 6), ("close",)]
    assert a.calls == b.calls == expected
    with pytest.raises(TypeError, match="MultiLogger takes Logger instances, got str"):
        MultiLogger(a, "csv")


def test_base_logger_methods_are_abstract():
    log = Logger("x", None)
    for call in (lambda: log.log_scalar("a", 1.0), lambda: log.log_hparams({}),
                 lambda: log.log_video("v", torch.zeros(1)), lambda: log.log_str("s", "t")):
        with pytest.raises(NotImplementedError):
            call()


@pytest.mark.parametrize("kind", ["csv", "tensorboard"])
def test_get_logger(tmp_path, kind):
    if kind == "tensorboard":
        pytest.importorskip("tensorboard")
    log = get_logger(kind, tmp_path, "exp")
    log.log_scalar("a", 1.0, 0)
    log.close()
    assert (tmp_path / "exp").is_dir() and any((tmp_path / "exp").iterdir())


def test_get_logger_unknown_lists_choices():
    with pytest.raises(ValueError, match="unknown logger_type 'neptune': choose one of 'csv', 'tensorboard', 'wandb', 'mlflow'"):
        get_logger("neptune", ".", "exp")
    assert LOGGER_TYPES == ("csv", "tensorboard", "wandb", "mlflow")


def test_generate_exp_name_unique():
    names = {generate_exp_name("SAC", "pendulum") for _ in range(20)}
    assert len(names) == 20 and all(n.startswith("SAC_pendulum_") for n in names)


@pytest.mark.parametrize("kind, extra", [("wandb", "wandb"), ("mlflow", "mlflow")])
def test_missing_optional_package_names_the_extra(monkeypatch, tmp_path, kind, extra):
    monkeypatch.setitem(sys.modules, kind, None)  # makes `import kind` raise ImportError
    with pytest.raises(ImportError, match=rf"needs the '{kind}' package: pip install 'steersman\[{extra}\]'"):
        get_logger(kind, tmp_path, "exp")


def test_wandb_logger_calls(monkeypatch, tmp_path, capsys):
    """The W&B calls, against a stand-in module (wandb itself is not a test dependency)."""
    calls = []

    class Run:
        config = types.SimpleNamespace(update=lambda cfg, allow_val_change: calls.append(("config", cfg)))

        def log(self, data, step=None):
            calls.append(("log", data, step))

        def finish(self):
            calls.append(("finish",))

    Run.dir = str(tmp_path / "wandb" / "offline-run-x" / "files")
    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: calls.append(("init", kw)) or Run()
    fake.Html = lambda s: ("html", s)
    fake.Video = lambda frames, fps, format: ("video", frames.shape, fps, format)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    log = get_logger("wandb", tmp_path, "exp", project="p")
    log.log_scalar("a", torch.tensor(1.0), 3)
    log.log_hparams({"lr": 1})
    log.log_str("s", "x", 4)
    log.log_video("v", torch.zeros(2, 3, 4, 6, dtype=torch.uint8), 5)
    log.close()
    assert calls[0] == ("init", {"name": "exp", "dir": str(tmp_path), "id": None, "project": "p",
                                 "mode": "offline", "resume": None})
    assert calls[1:] == [("log", {"a": 1.0}, 3), ("config", {"lr": 1}), ("log", {"s": ("html", "<pre>x</pre>")}, 4),
                         ("log", {"v": ("video", (2, 3, 4, 6), 30, "mp4")}, 5), ("finish",)]
    run_dir = tmp_path / "wandb" / "offline-run-x"
    assert capsys.readouterr().err == f"wandb: offline run saved in {run_dir}; upload it with `wandb sync {run_dir}`\n"


def test_mlflow_logger_calls(monkeypatch, tmp_path):
    calls = []

    class Client:
        def __init__(self, tracking_uri):
            calls.append(("client", tracking_uri))

        def get_experiment_by_name(self, name):
            return None

        def create_experiment(self, name, artifact_location=None):
            calls.append(("experiment", name, artifact_location))
            return "7"

        def create_run(self, exp_id, tags):
            calls.append(("run", exp_id, tags))
            return types.SimpleNamespace(info=types.SimpleNamespace(run_id="r1"))

        def __getattr__(self, name):  # log_metric, log_param, log_text, set_terminated
            return lambda *a, **k: calls.append((name, *a, *k.values()))

    fake = types.ModuleType("mlflow")
    fake.MlflowClient = Client
    monkeypatch.setitem(sys.modules, "mlflow", fake)
    log = get_logger("mlflow", tmp_path, "exp")
    log.log_scalar("train/return", 2.0, 10)
    log.log_hparams({"optim": {"lr": 0.1}, "name": "ppo"})
    log.log_str("notes", "hi", 1)
    log.close()
    assert calls == [
        ("client", (tmp_path / "mlruns").absolute().as_uri()), ("experiment", "exp", None), ("run", "7", {}),
        ("log_metric", "r1", "train/return", 2.0, 10), ("log_param", "r1", "optim.lr", "0.1"),
        ("log_param", "r1", "name", "ppo"), ("log_text", "r1", "hi", "texts/notes_1.txt"),
        ("set_terminated", "r1"),
    ]
    calls.clear()
    MLFlowLogger("exp2", tmp_path.as_uri(), artifact_location="s3://bucket/a").close()
    assert ("experiment", "exp2", "s3://bucket/a") in calls


# --- the real packages, offline (run where the extras are installed) ----------------------


def needs_extra(module: str, extra: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed: pip install 'steersman[{extra}]'")


def test_mlflow_file_store_round_trip(tmp_path, monkeypatch):
    """MLflow with a local file store: metrics, params and the run's end, read back with
    MLflow's own client. No server, no network."""
    needs_extra("mlflow", "mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")  # only the logger's own URI counts
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")  # the logger opts in to MLflow's file store itself
    log = get_logger("mlflow", tmp_path, "exp")
    for step, value in [(0, 1.0), (10, 2.5), (20, 4.0)]:
        log.log_scalar("train/return", torch.tensor(value), step)
    log.log_hparams({"optim": {"lr": 0.1}, "algo": "ppo"})
    log.close()
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=(tmp_path / "mlruns").absolute().as_uri())
    run = client.get_run(log.run_id)
    history = client.get_metric_history(log.run_id, "train/return")
    assert [(m.step, m.value) for m in history] == [(0, 1.0), (10, 2.5), (20, 4.0)]
    assert run.data.params == {"optim.lr": "0.1", "algo": "ppo"}
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "exp"


def test_wandb_offline_run(tmp_path, monkeypatch, capsys):
    """W&B in offline mode writes its run under the logger's folder; nothing is sent."""
    needs_extra("wandb", "wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    log = get_logger("wandb", tmp_path, "exp", project="steersman-test")
    for step in range(3):
        log.log_metrics({"train/return": float(step), "train/loss": torch.tensor(0.5)}, step=step)
    log.log_hparams({"lr": 0.1})
    run_dir = Path(log.experiment.dir).parent
    log.close()
    assert run_dir.is_relative_to(tmp_path) and run_dir.name.startswith("offline-run-")
    assert list(run_dir.glob("*.wandb")), f"no offline run file in {run_dir}"
    assert f"wandb: offline run saved in {run_dir}; upload it with `wandb sync {run_dir}`" in capsys.readouterr().err
