"""The docs site builds offline from the repository (README, architecture, tour, API pages)."""

from __future__ import annotations

import importlib.util
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_docs_site_builds(tmp_path):
    for module in ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed: pip install -e '.[docs]'")
    build = runpy.run_path(str(ROOT / "docs" / "build.py"))
    site = tmp_path / "site"
    assert build["main"](["--out", str(site), "--src", str(tmp_path / "src")]) == 0
    index = (site / "index.html").read_text()
    assert "steersman.train" in index and "From Python" in index
    assert 'href="architecture.html"' in index  # the README's link into docs/ still works
    assert "Layers" in (site / "architecture.html").read_text()
    assert "memmap round trip equal" in (site / "tour.html").read_text()
    api = (site / "api" / "steersman.html").read_text()
    assert "NumPy in, NumPy out" in api  # Agent.act's docstring
    for page in ["tensordict", "envs", "objectives", "record", "data"]:
        html = (site / "api" / f"{page}.html").read_text()
        assert html.count('class="doc doc-heading"') > 10, f"api/{page}.html documents almost nothing"
    assert "GymEnv" in (site / "api" / "envs.html").read_text()
