"""ProgressBar: quiet, plain lines off a terminal, rich bar on one."""

from __future__ import annotations

import io
import re

import pytest
import torch

from steersman.record import ProgressBar


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_quiet_prints_nothing():
    out = FakeTTY()
    with ProgressBar(100, quiet=True, file=out, log_interval_s=0) as bar:
        bar.update(50, loss=1.0)
        bar.update(50)
    assert bar.mode == "quiet" and out.getvalue() == "" and bar.frames == 100


def test_plain_lines_off_a_terminal():
    out = io.StringIO()
    with ProgressBar(1000, file=out, log_interval_s=0) as bar:
        assert bar.mode == "plain"
        bar.update(250, **{"return": torch.tensor(12.5)})
        bar.update(250, loss=0.5)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3  # two updates and the final line
    assert lines[0].startswith("train 250/1,000 frames (25%) | ") and "return 12.5" in lines[0]
    assert lines[1].startswith("train 500/1,000 frames (50%) | ")
    assert "return 12.5 | loss 0.5 | ETA " in lines[1]  # metrics persist between updates
    assert re.search(r"\| [\d,]+ fps \|", lines[1])


def test_plain_lines_are_rate_limited():
    out = io.StringIO()
    with ProgressBar(1000, file=out, log_interval_s=3600) as bar:
        for _ in range(10):
            bar.update(100)
    assert out.getvalue().splitlines() == [out.getvalue().splitlines()[-1]]
    assert out.getvalue().startswith("train 1,000/1,000 frames (100%)")


def test_default_stream_is_not_a_terminal_under_pytest(capsys):
    with ProgressBar(10, log_interval_s=0) as bar:
        bar.update(10)
    assert bar.mode == "plain" and "10/10 frames" in capsys.readouterr().err


def test_rich_bar_on_a_terminal():
    pytest.importorskip("rich")
    out = FakeTTY()
    bar = ProgressBar(1000, file=out, initial=200, description="ppo")
    assert bar.mode == "rich"
    bar.update(300, **{"return": 42.0})
    bar.close()
    bar.close()  # idempotent
    text = out.getvalue()
    assert "ppo" in text and "500/1,000 frames" in text and "return 42" in text


def test_resume_counts_from_initial():
    out = io.StringIO()
    with ProgressBar(100, file=out, initial=60, log_interval_s=3600) as bar:
        bar.update(40)
    assert bar.frames == 100 and out.getvalue().startswith("train 100/100 frames (100%)")


@pytest.mark.parametrize("total", [0, -5])
def test_bad_total(total):
    with pytest.raises(ValueError, match="total_frames must be positive"):
        ProgressBar(total)
