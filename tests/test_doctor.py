"""``steersman doctor``: the phase table and the findings, on planted problems."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from steersman import cli
from steersman.doctor import PHASES, profile_callable

PLANTED = textwrap.dedent('''
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)


    @torch.compile(backend="eager")
    def loss_fn(x, y):
        out = model(x)
        print("loss computed")  # planted: a graph break
        return ((out - y) ** 2).mean()


    while True:  # runs until doctor stops it
        model.eval()  # planted: toggled every iteration
        with torch.no_grad():
            model(torch.randn(16, 8))
        model.train()
        loss = loss_fn(torch.randn(16, 8), torch.randn(16, 2))
        opt.zero_grad()
        loss.backward()
        opt.step()
''')


def _steersman(*args: str, cwd: Path, capsys, monkeypatch) -> subprocess.CompletedProcess:
    """``steersman ARGS`` in this process (doctor profiles a script or recipe in-process
    anyway: a subprocess would only add the imports); torch's thread count, RNG and
    dynamo state are restored afterwards."""
    monkeypatch.chdir(cwd)
    threads, rng = torch.get_num_threads(), torch.get_rng_state()
    capsys.readouterr()
    try:
        code = cli.main(list(args))
    finally:
        torch.set_num_threads(threads)
        torch.set_rng_state(rng)
        torch._dynamo.reset()
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out.out, out.err)


def test_doctor_finds_a_planted_toggle_and_graph_break_in_a_script(tmp_path: Path, capsys, monkeypatch) -> None:
    (tmp_path / "train.py").write_text(PLANTED)
    # a fresh process, as for a user's script: dynamo's graph-break counters and caches start
    # empty (in-process, what earlier tests compiled changed the reported break)
    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "steersman", "doctor", "train.py", "--seconds", "1.5"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(repo)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "steersman doctor: train.py:" in out and "stopped after the time limit" in out
    assert "Sequential.eval() at train.py:17 is called" in out
    assert "Sequential.train() at train.py:20 is called" in out
    assert "torch.compile: " in out and "graph break(s): Failed to trace builtin operator" in out
    assert "`print`" in out and "fix: remove the Python the compiler cannot trace" in out
    assert "loss backward" in out and "policy forward" in out and "optimizer" in out


def test_doctor_ppo_prints_the_phase_table(tmp_path: Path, capsys, monkeypatch) -> None:
    proc = _steersman("doctor", "ppo", "total_frames=512", "n_steps=16", "epochs=1", "minibatch_size=64",
                      "env.num_envs=4", "eval.episodes=1", "--seconds", "120", cwd=tmp_path, capsys=capsys,
                      monkeypatch=monkeypatch)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    # the run ends within the limit; its own "done: ..." summary is not part of the doctor's output
    assert lines[0].startswith("steersman doctor: ppo total_frames=512") and "ran to the end" in lines[0]
    assert "done: ppo" not in proc.stdout
    header = lines.index(next(line for line in lines if line.startswith("phase")))
    rows = {}
    for line in lines[header + 1:]:
        if not line.strip():
            break
        name = line[:24].strip()
        rows[name] = (float(line[24:32]), line[42:].strip())
    # a short run: a phase of many quick calls can be ~1 ms in all, so the table prints milliseconds
    for phase in ("env step", "policy forward", "loss forward", "loss backward", "optimizer"):
        secs, calls = rows.get(phase, (0.0, ""))
        assert secs > 0 and int(calls.replace(",", "")) > 0, (phase, proc.stdout)
    assert set(rows) <= set(PHASES)
    assert "findings:" in proc.stdout and "the largest phase is" in proc.stdout
    assert list(tmp_path.iterdir()) == []  # the profiled run wrote nothing here


class _Loop:
    """A tiny loop of known calls: env steps, policy calls, a loss, backward, optimizer."""

    def __init__(self, iterations: int, toggle: bool) -> None:
        from steersman.envs import CartPoleEnv

        self.env = CartPoleEnv(batch_size=[2], seed=0)
        self.policy = nn.Linear(4, 2)
        self.opt = torch.optim.SGD(self.policy.parameters(), lr=0.1)
        self.iterations, self.toggle = iterations, toggle

    def __call__(self) -> None:
        td = self.env.reset()
        for _ in range(self.iterations):
            if self.toggle:
                self.policy.eval()
            with torch.no_grad():
                td["action"] = self.policy(td["observation"]).argmax(-1)
            td = self.env.step_and_maybe_reset(td)[1]
            if self.toggle:
                self.policy.train()
            loss = self.policy(torch.randn(8, 4)).pow(2).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()


@pytest.mark.parametrize("toggle", [True, False])
def test_profile_counts_each_call_once_and_restores_everything(toggle: bool) -> None:
    from steersman.envs import EnvBase

    originals = (nn.Module.train, EnvBase.step, torch.autograd.backward, torch.Tensor.pin_memory)
    report = profile_callable(_Loop(7, toggle), seconds=60)
    assert not report.stopped_early and report.error is None
    # the clock starts at the first timed call (the reset): 1 reset + 7 step_and_maybe_reset
    assert report.calls["env step"] == 8
    assert report.calls["policy forward"] == 14 and report.calls["loss backward"] == 7
    assert report.calls["optimizer"] == 14  # zero_grad + step
    assert all(report.phases[p] > 0 for p in ("env step", "policy forward", "loss backward", "optimizer"))
    assert abs(sum(report.phases.values()) - report.wall) < 1e-6  # exclusive times add up to the wall time
    assert report.work == report.wall  # nothing compiled
    toggles = {k.split(" at ")[0]: n for k, n in report.toggles.items()}
    assert toggles == ({"Linear.eval()": 7, "Linear.train()": 7} if toggle else {})
    assert any("Linear.eval()" in problem for problem, _ in report.findings) is toggle
    assert (nn.Module.train, EnvBase.step, torch.autograd.backward, torch.Tensor.pin_memory) == originals


def test_profile_counts_graph_breaks_and_recompiles() -> None:
    torch._dynamo.reset()

    @torch.compile(backend="eager")
    def f(x, n):
        y = x * n
        torch._dynamo.graph_break()
        return y + 1

    lin = nn.Linear(3, 3)  # a first timed call starts the clock
    report = profile_callable(lambda: [lin(torch.ones(3))] + [f(torch.ones(3), n) for n in (1, 2)], seconds=60)
    assert sum(report.graph_breaks.values()) >= 1
    assert len(report.recompiles) >= 1 and report.recompiles[0].startswith("Recompiling function f")
    assert report.phases["compiling"] > 0
    problems = " ".join(problem for problem, _ in report.findings)
    assert "graph break(s)" in problems and "recompiled" in problems


def test_profile_stops_an_endless_loop_and_reports_errors() -> None:
    def endless() -> None:
        lin = nn.Linear(2, 2)
        while True:
            lin(torch.zeros(1, 2))

    report = profile_callable(endless, seconds=0.3)
    assert report.stopped_early and 0.3 <= report.wall < 5 and report.calls["policy forward"] > 10

    swallowed = []

    def swallows_the_first_stop() -> None:  # as code catching BaseException would
        lin = nn.Linear(2, 2)
        while True:
            try:
                while True:
                    lin(torch.zeros(1, 2))
            except BaseException:  # noqa: BLE001
                if swallowed:
                    raise
                swallowed.append(1)

    report = profile_callable(swallows_the_first_stop, seconds=0.3)
    assert swallowed == [1] and report.stopped_early and report.wall < 5

    def broken() -> None:
        nn.Linear(2, 2)(torch.zeros(1, 2))
        raise RuntimeError("boom")

    report = profile_callable(broken, seconds=5)
    assert report.error == "RuntimeError: boom" and "the profiled code raised: RuntimeError: boom" in str(report)


@pytest.mark.parametrize("args, message", [
    (["doctor", "nosuch"], "'nosuch' is not an algorithm"),
    (["doctor", "missing.py"], "no script 'missing.py'"),
    (["doctor", "ppo", "--seconds", "0"], "--seconds must be > 0, got 0"),
    (["doctor", "ppo", "--seconds", "soon"], "--seconds expects a number of seconds, got 'soon'"),
    (["doctor", "ppo", "total_frames=abc"], "total_frames"),
])
def test_doctor_bad_input_is_one_line(args, message, capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_pin_memory_by_hand_is_found_with_its_line() -> None:
    def loop() -> None:
        lin = nn.Linear(2, 2)
        for _ in range(3):
            lin(torch.zeros(1, 2))
            try:
                torch.zeros(4).pin_memory()  # a CPU-only torch may refuse: the call is still counted
            except RuntimeError:
                pass

    report = profile_callable(loop, seconds=60)
    ((where, n),) = report.pins.items()
    assert n == 3 and where.endswith("test_doctor.py:" + str(loop.__code__.co_firstlineno + 5))
    assert any("pin_memory() called by hand 3 times" in problem for problem, _ in report.findings)


def test_findings_from_a_report() -> None:
    from steersman.doctor import DoctorReport, _findings

    report = DoctorReport("synthetic", wall=10.0)
    report.phases.update({"env step": 3.0, "logging": 2.0, "compiling": 5.0})
    report.calls["compiling"] = 2
    report.threads = {"torch threads": 8, "interop threads": 8, "cores available": 2, "OMP_NUM_THREADS": None}
    report.findings = _findings(report)
    text = str(report)
    assert "synthetic: 5.0 s profiled" in text  # compiling is not profiled work
    assert "env step                   3.000 s   60.0%" in text and "(and 5.00 s compiling" in text
    problems = [problem for problem, _ in report.findings]
    assert problems[0] == "the largest phase is env step (60% of the time)"
    assert "logging takes 40% of the time" in problems
    assert any(p.startswith("torch.compile spent 5.0 s compiling") for p in problems)
    assert any("8 threads on 2 available cores" in p for p in problems)
