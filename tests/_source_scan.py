"""The package's source parsed once per test process.

Several tests read all of ``src/steersman`` with :mod:`ast` (layering, private container
attributes); parsing ~300 files costs seconds, so they share these trees and run in one
xdist group (``source-scan``) so the parse happens once.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path


@functools.cache
def _parse(path: str, mtime_ns: int) -> tuple[str, ast.Module]:
    source = Path(path).read_text(encoding="utf-8")
    return source, ast.parse(source, path)


def parsed(path: Path) -> ast.Module:
    """``ast.parse`` of the file at ``path`` (cached until the file changes)."""
    return _parse(str(path), path.stat().st_mtime_ns)[1]


@functools.cache
def _nodes(path: str, mtime_ns: int) -> tuple[ast.AST, ...]:
    return tuple(ast.walk(_parse(path, mtime_ns)[1]))


def all_nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of the file's tree, in ``ast.walk`` order (cached until the file changes)."""
    return _nodes(str(path), path.stat().st_mtime_ns)
