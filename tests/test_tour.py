"""The container tour (examples/tensordict_tour.py) runs end to end and prints what it promises."""

from __future__ import annotations

import runpy
from pathlib import Path

TOUR = Path(__file__).resolve().parents[1] / "examples" / "tensordict_tour.py"


def test_tour_runs(capsys):
    runpy.run_path(str(TOUR), run_name="__main__")
    out = capsys.readouterr().out
    assert "rollout: torch.Size([8, 5])" in out
    assert "memmap round trip equal: True" in out
    assert "compiled result:" in out
