"""No code outside ``steersman/tensordict`` uses the container's private attributes.

Envs, storages and buffers that build or read TensorDicts on their hot paths use the
public fast path instead: ``TensorDict.from_trusted(entries, batch_size, device)`` and
``td.entries``. A private name used elsewhere ties that code to the container's
internals, which then can't change without breaking it silently.

Which names are private to the container is read off the source: the private methods,
slots and attributes that the container classes (``TensorDictBase`` and its subclasses
in ``steersman/tensordict``) define and that no class outside it defines. Names that both define (``_batch_size``, ``_device``: envs
have them too) are caught when the object they are read from is named like a
TensorDict (``td``, ``tensordict``, ``td_next``, ...), the way the call sites name them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests._source_scan import all_nodes

pytestmark = pytest.mark.xdist_group("source-scan")  # one process parses the package once

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "steersman"
CONTAINER_DIR = PACKAGE / "tensordict"
#: receivers that hold a TensorDict at every call site that reads a shared private name
TD_NAME = re.compile(r"^(td|tensordict|.*_td|td_.*|tensordict_.*|.*_tensordict)$")


def _all_classes(files: list[Path]) -> list[ast.ClassDef]:
    return [n for p in files for n in all_nodes(p) if isinstance(n, ast.ClassDef)]


def _base_names(cls: ast.ClassDef) -> set[str]:
    return {b.id if isinstance(b, ast.Name) else b.attr for b in cls.bases if isinstance(b, (ast.Name, ast.Attribute))}


def _container_classes(files: list[Path]) -> list[ast.ClassDef]:
    """``TensorDictBase`` and the classes of ``files`` that derive from it."""
    classes = _all_classes(files)
    names = {"TensorDictBase"}
    grew = True
    while grew:
        more = {c.name for c in classes if _base_names(c) & names} - names
        names |= more
        grew = bool(more)
    return [c for c in classes if c.name in names]


def _private_names(classes: list[ast.ClassDef]) -> set[str]:
    """Private (``_x``, not dunder) methods, slots, class attributes and ``self._x =``
    attributes of ``classes``."""
    names: set[str] = set()
    for cls in classes:
        for item in cls.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(item.name)
            elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
                if any(isinstance(t, ast.Name) and t.id == "__slots__" for t in targets):
                    names.update(
                        c.value for c in ast.walk(item.value)
                        if isinstance(c, ast.Constant) and isinstance(c.value, str)
                    )
        for node in ast.walk(cls):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and (
                isinstance(node.value, ast.Name) and node.value.id == "self"
            ):
                names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _receiver_name(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else None


def private_uses() -> list[str]:
    """``file:line: expression`` for every private container attribute used outside L0."""
    container_files = sorted(CONTAINER_DIR.rglob("*.py"))
    other_files = sorted(p for p in PACKAGE.rglob("*.py") if CONTAINER_DIR not in p.parents)
    container = _private_names(_container_classes(container_files))
    elsewhere = _private_names(_all_classes(other_files))
    only_container = container - elsewhere
    shared = container & elsewhere
    found = []
    for path in other_files:
        for node in all_nodes(path):
            if not isinstance(node, ast.Attribute):
                continue
            recv = _receiver_name(node.value)
            if recv in ("self", "cls"):
                continue
            if node.attr in only_container or (
                node.attr in shared and recv is not None and TD_NAME.match(recv)
            ):
                rel = path.relative_to(PACKAGE.parent)
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_scan_sees_the_container_private_names():
    """The scan would catch the reach-ins this test exists for (guards the scan itself)."""
    container = _private_names(_container_classes(sorted(CONTAINER_DIR.rglob("*.py"))))
    assert {"_tensordict", "_new_unsafe", "_batch_size", "_get_str", "_keys_str"} <= container
    assert TD_NAME.match("tensordict") and TD_NAME.match("td_next") and not TD_NAME.match("env")


def test_no_private_container_attributes_outside_tensordict():
    found = private_uses()
    assert not found, (
        f"{len(found)} uses of private TensorDict attributes outside steersman/tensordict "
        "(use TensorDict.from_trusted(entries, batch_size, device), td.entries, "
        "td.batch_size, td.device or another public method):\n" + "\n".join(found)
    )
