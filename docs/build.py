"""Builds the docs site offline: ``python docs/build.py [--out DIR]`` (``bash scripts/docs.sh``).

The pages are assembled in ``build/docs_src`` from what the repository already holds, so
they cannot drift from it:

* ``index.md``: the README;
* ``architecture.md`` and the other ``docs/*.md`` pages;
* ``tour.md``: the container tour, ``examples/tensordict_tour.py``;
* ``api/<package>.md``: one page per package, rendered from the docstrings by
  mkdocstrings (static analysis with griffe: nothing is imported, no network).

then MkDocs writes the HTML site to ``--out`` (default ``build/site``). Needs the ``docs``
extra: ``pip install -e '.[docs]'``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

#: API pages: (page name, module, one-line description)
API = [
    ("steersman", "steersman.api", "train, load and act from Python"),
    ("tensordict", "steersman.tensordict", "the container (L0)"),
    ("tensordict.nn", "steersman.tensordict.nn", "TensorDict modules and distributions (L1)"),
    ("data", "steersman.data", "specs and replay buffers (L2)"),
    ("envs", "steersman.envs", "environments and transforms (L3)"),
    ("modules", "steersman.modules", "networks, actors, critics, exploration (L3)"),
    ("collectors", "steersman.collectors", "data collectors (L4)"),
    ("objectives", "steersman.objectives", "losses and value estimators (L4)"),
    ("planning", "steersman.planning", "tree search and CEM/MPPI planners (L4)"),
    ("record", "steersman.record", "loggers, videos, policy export (L4)"),
    ("checkpoint", "steersman.checkpoint", "TorchRL's checkpoint API: atomic, rotated, safe to load (L4)"),
    ("distributed", "steersman.distributed", "collectors, replay buffers and evaluation on Ray (L5)"),
    ("trainers", "steersman.trainers", "TorchRL's Trainer and its hooks (L5)"),
    ("recipes", "steersman.recipes", "the training recipes (L6)"),
    ("doctor", "steersman.doctor", "where the training time goes, and what to change (L6)"),
]


def _readme_page() -> str:
    text = (ROOT / "README.md").read_text()
    return re.sub(r"\[([^\]]+)\]\((?!https?://|#)([^)]+)\)", lambda m: _link(m.group(1), m.group(2)), text)


def _link(text: str, target: str) -> str:
    """A README link as the site shows it: docs pages stay links, repository files become
    their path in code (the site has no copy of them)."""
    page = target.removeprefix("docs/")
    if (DOCS / page).is_file():
        return f"[{text}]({page})"
    return text if text.strip("`") == target else f"{text} (`{target}`)"


def _tour_page() -> str:
    source = (ROOT / "examples" / "tensordict_tour.py").read_text()
    return ("# The container tour\n\n`examples/tensordict_tour.py`, runnable as "
            "`python examples/tensordict_tour.py`:\n\n```python\n" + source + "```\n")


def assemble(src: Path) -> None:
    """Writes the site's markdown sources and ``mkdocs.yml`` under ``src``."""
    if src.exists():
        shutil.rmtree(src)
    (src / "docs" / "api").mkdir(parents=True)
    pages = src / "docs"
    (pages / "index.md").write_text(_readme_page())
    (pages / "tour.md").write_text(_tour_page())
    extra = []
    for page in sorted(DOCS.glob("*.md")):
        shutil.copy(page, pages / page.name)
        extra.append(page.name)
    api_nav = []
    for name, module, what in API:
        (pages / "api" / f"{name}.md").write_text(f"# `{module}`: {what}\n\n::: {module}\n")
        api_nav.append(f"      - {name}: api/{name}.md")
    nav = ["  - Home: index.md", "  - Tour: tour.md",
           *[f"  - {p[:-3].replace('_', ' ').capitalize()}: {p}" for p in extra],
           "  - API:", *api_nav]
    (src / "mkdocs.yml").write_text(f"""site_name: steersman
site_description: A PyTorch-native library for reinforcement learning, control and decision making.
docs_dir: docs
use_directory_urls: false
theme:
  name: mkdocs
nav:
{chr(10).join(nav)}
plugins:
  - search
  - mkdocstrings:
      default_handler: python
      handlers:
        python:
          paths: [{ROOT / "src"}]
          options:
            docstring_style: google
            show_source: false
            show_submodules: false
            members_order: source
            filters: ["!^_"]
            show_if_no_docstring: false
            heading_level: 2
""")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "build" / "site"), help="where the HTML goes")
    p.add_argument("--src", default=str(ROOT / "build" / "docs_src"), help="where the sources are assembled")
    ns = p.parse_args(argv)
    src = Path(ns.src)
    assemble(src)
    cmd = [sys.executable, "-m", "mkdocs", "build", "--quiet", "-f", str(src / "mkdocs.yml"),
           "-d", str(Path(ns.out).absolute())]
    return subprocess.run(cmd, cwd=src).returncode


if __name__ == "__main__":
    sys.exit(main())
