"""Layering rules from DESIGN.md: a layer imports only its own layer and lower ones.

``steersman/tensordict`` (L0) imports nothing else from steersman, not even
``steersman.tensordict.nn`` (L1). The checker reads the source with ``ast``; nothing is
imported, so the test works on a partial package and on one that does not import yet.
Imports inside functions and ``TYPE_CHECKING`` blocks count too, as do
``importlib.import_module("steersman....")`` calls with a literal name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests._source_scan import all_nodes

pytestmark = pytest.mark.xdist_group("source-scan")  # one process parses the package once

REPO = Path(__file__).resolve().parents[1]
ROOT = "steersman"

# Longest dotted prefix wins, so ``steersman.tensordict.nn`` is L1 while the rest of
# ``steersman.tensordict`` is L0. The root package re-exports everything: top layer.
LAYERS: dict[str, int] = {
    "steersman.tensordict": 0,
    "steersman.tensordict.nn": 1,
    "steersman.data": 2,
    "steersman.envs": 3,
    "steersman.modules": 3,
    "steersman.collectors": 4,
    "steersman.objectives": 4,
    "steersman.planning": 4,
    "steersman.record": 4,
    "steersman.checkpoint": 4,
    "steersman.distributed": 5,
    "steersman.trainers": 5,
    "steersman.recipes": 6,
    "steersman.cli": 6,
    "steersman.doctor": 6,
    "steersman.api": 6,
    "steersman.__main__": 6,
    "steersman": 6,
}


def layer_of(module: str) -> tuple[str, int] | None:
    """(table entry, layer) of a dotted module name, by longest prefix; None if unmapped.

    The root entry matches only ``steersman`` itself, so ``steersman.foo`` with no entry
    of its own is reported: the table in this file stays the map of the package.
    """
    parts = module.split(".")
    for n in range(len(parts), 1, -1):
        prefix = ".".join(parts[:n])
        if prefix in LAYERS:
            return prefix, LAYERS[prefix]
    return (ROOT, LAYERS[ROOT]) if module == ROOT else None


def imported_modules(
    path: Path, module: str, is_package: bool
) -> list[tuple[int, tuple[str, ...]]]:
    """(line, candidate names) for every import in the file at ``path``, relative ones resolved.

    ``from a.b import c`` gives ``("a.b.c", "a.b")``: ``c`` may be a submodule (``from
    steersman.tensordict import nn`` is an L1 import) or just a name defined in ``a.b``.
    The first candidate that has a layer decides.
    """
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, tuple[str, ...]]] = []
    for node in all_nodes(path):
        if isinstance(node, ast.Import):
            found += [(node.lineno, (alias.name,)) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg_parts = package.split(".") if package else []
                keep = len(pkg_parts) - (node.level - 1)
                if keep <= 0:
                    found.append((node.lineno, (f"<relative import beyond {package!r}>",)))
                    continue
                base = ".".join(pkg_parts[:keep] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found += [
                (node.lineno, (base,) if alias.name == "*" else (f"{base}.{alias.name}", base))
                for alias in node.names
            ]
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func):
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.append((node.lineno, (arg.value,)))
    return found


def _is_dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in {"__import__", "import_module"}
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def module_name(path: Path, repo: Path) -> tuple[str, bool]:
    rel = path.relative_to(repo).with_suffix("")
    if rel.name == "__init__":
        return ".".join(rel.parts[:-1]), True
    return ".".join(rel.parts), False


def violations(repo: Path) -> list[str]:
    """Every layering violation in ``repo/steersman``, one readable line each."""
    out: list[str] = []
    for path in sorted((repo / ROOT).rglob("*.py")):
        module, is_package = module_name(path, repo)
        where = path.relative_to(repo)
        own = layer_of(module)
        if own is None:
            out.append(f"{where}: module {module} has no layer; add it to LAYERS")
            continue
        in_tensordict = own[0] == "steersman.tensordict"
        for line, candidates in imported_modules(path, module, is_package):
            target = candidates[0]
            if target.startswith("<"):
                out.append(f"{where}:{line}: {target}")
                continue
            if target.split(".")[0] != ROOT:
                continue
            if in_tensordict and not (target + ".").startswith("steersman.tensordict."):
                out.append(
                    f"{where}:{line}: steersman.tensordict imports {target}; "
                    "it may import only torch, numpy and the standard library"
                )
                continue
            theirs = next(filter(None, map(layer_of, candidates)), None)
            if theirs is None:
                out.append(f"{where}:{line}: imports {target}, which has no layer")
            elif theirs[1] > own[1]:
                out.append(
                    f"{where}:{line}: {own[0]} (L{own[1]}) imports {target} "
                    f"({theirs[0]}, L{theirs[1]})"
                )
    return out


#: third-party packages that only these layers (and above) may import: an optional extra
#: must not become a dependency of the layers below it (DESIGN.md: nothing below L5 imports ray)
THIRD_PARTY_FLOOR = {"ray": 5}


def third_party_violations(repo: Path) -> list[str]:
    """Imports of :data:`THIRD_PARTY_FLOOR` packages from a layer below their floor."""
    out: list[str] = []
    for path in sorted((repo / ROOT).rglob("*.py")):
        module, is_package = module_name(path, repo)
        own = layer_of(module)
        if own is None:
            continue
        for line, candidates in imported_modules(path, module, is_package):
            top = candidates[0].split(".")[0]
            if top in THIRD_PARTY_FLOOR and own[1] < THIRD_PARTY_FLOOR[top]:
                out.append(f"{path.relative_to(repo)}:{line}: {own[0]} (L{own[1]}) imports {top}, "
                           f"which only L{THIRD_PARTY_FLOOR[top]} and above may import")
    return out


def test_optional_extras_stay_in_their_layer(tmp_path: Path):
    assert third_party_violations(REPO / "src") == []
    _write(tmp_path, "steersman/__init__.py")
    _write(tmp_path, "steersman/collectors/__init__.py", "def f():\n    import ray.util\n")
    assert third_party_violations(tmp_path) == [
        "steersman/collectors/__init__.py:2: steersman.collectors (L4) imports ray, which only L5 and above may import"]


def test_package_imports_only_downward():
    """Runs on whatever exists of the package; an empty or missing one passes."""
    assert (REPO / "src" / ROOT / "__init__.py").is_file()  # the scan below must see the package
    found = violations(REPO / "src")
    assert not found, "layering violations:\n" + "\n".join(found)


# --- the checker itself --------------------------------------------------------------


def _write(root: Path, rel: str, text: str = "") -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


@pytest.fixture
def fake_repo(tmp_path: Path) -> Path:
    for pkg in [
        "steersman",
        "steersman/tensordict",
        "steersman/tensordict/nn",
        "steersman/data",
        "steersman/envs",
        "steersman/collectors",
    ]:
        _write(tmp_path, f"{pkg}/__init__.py")
    return tmp_path


def test_allowed_imports_pass(fake_repo: Path):
    _write(
        fake_repo,
        "steersman/tensordict/_td.py",
        "import torch\nfrom . import _utils\nimport steersman.tensordict\n"
        "from steersman import tensordict\nfrom .base import TensorDictBase\n"
        "from steersman.tensordict.utils import NestedKey\n",
    )
    _write(
        fake_repo,
        "steersman/tensordict/nn/common.py",
        "from ..base import TensorDictBase\nfrom steersman.tensordict import TensorDict\n"
        "from .probabilistic import ProbabilisticTensorDictModule\n",
    )
    _write(fake_repo, "steersman/data/specs.py", "from steersman.tensordict import TensorDict\n")
    _write(
        fake_repo,
        "steersman/envs/common.py",
        "from ..data import Composite\nfrom steersman.tensordict.nn import TensorDictModule\n",
    )
    _write(
        fake_repo,
        "steersman/collectors/__init__.py",
        "from steersman.envs import EnvBase\nfrom steersman import data\n",
    )
    _write(fake_repo, "steersman/__init__.py", "from . import collectors, envs\n")
    assert violations(fake_repo) == []


@pytest.mark.parametrize(
    ("rel", "source", "needle"),
    [
        ("steersman/tensordict/_td.py", "import steersman.data\n", "steersman.data"),
        ("steersman/tensordict/_td.py", "from steersman.envs import EnvBase\n", "steersman.envs"),
        ("steersman/tensordict/_td.py", "from ..data import specs\n", "steersman.data.specs"),
        (
            "steersman/tensordict/_td.py",
            "from .nn import TensorDictModule\n",
            "steersman.tensordict.nn",
        ),
        ("steersman/tensordict/_td.py", "from . import nn\n", "steersman.tensordict.nn"),
        (
            "steersman/tensordict/__init__.py",
            "from .nn import TensorDictModule\n",
            "steersman.tensordict.nn",
        ),
        ("steersman/tensordict/_td.py", "from steersman import __version__\n", "steersman"),
        (
            "steersman/tensordict/_td.py",
            "def f():\n    import importlib\n    return importlib.import_module('steersman.envs')\n",
            "steersman.envs",
        ),
        ("steersman/tensordict/nn/common.py", "from ...data import Composite\n", "steersman.data"),
        ("steersman/data/specs.py", "from steersman.envs import EnvBase\n", "steersman.envs"),
        (
            "steersman/envs/common.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from ..collectors import Collector\n",
            "steersman.collectors",
        ),
        ("steersman/envs/common.py", "from steersman import recipes\n", "steersman.recipes"),
    ],
)
def test_checker_catches_violation(fake_repo: Path, rel: str, source: str, needle: str):
    _write(fake_repo, rel, source)
    found = violations(fake_repo)
    assert len(found) == 1 and rel in found[0] and needle in found[0], found


def test_checker_reports_unmapped_module(fake_repo: Path):
    _write(fake_repo, "steersman/misc/helpers.py")
    _write(fake_repo, "steersman/data/specs.py", "from steersman.misc import helpers\n")
    found = violations(fake_repo)
    assert any("steersman.misc.helpers has no layer" in v for v in found), found
    assert any("imports steersman.misc.helpers, which has no layer" in v for v in found), found


def test_layer_table():
    assert layer_of("steersman.tensordict._td") == ("steersman.tensordict", 0)
    assert layer_of("steersman.tensordict.nn.common") == ("steersman.tensordict.nn", 1)
    assert layer_of("steersman.tensordict.nn_utils") == ("steersman.tensordict", 0)
    assert layer_of("steersman.cli") == ("steersman.cli", 6)
    assert layer_of("steersman") == ("steersman", 6)
    assert layer_of("steersman.unknown") is None
    assert layer_of("torch.nn") is None
