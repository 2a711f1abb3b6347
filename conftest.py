"""Test-session settings shared by tests/ and the doctests under src/steersman/.

One torch thread per test process: the networks here are tiny, and with pytest-xdist
each worker would otherwise start one thread per core and the workers thrash each other
(tens of times slower on a 2-core machine).

The suite passes without the optional extras: doctests whose examples need an optional
package are skipped, naming the extra, when it cannot be imported (tests under tests/ use
``pytest.importorskip`` themselves).
"""

import importlib
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

# optional package -> (the extra that installs it, modules whose doctests need it)
OPTIONAL_DOCTESTS = {
    "gymnasium": ("gym", ("steersman.envs.libs.gym", "steersman.envs.libs.gym_export",
                          "steersman.record.video", "steersman.recipes.envs")),
    "envpool": ("envpool", ("steersman.envs.libs.envpool",)),
    "dm_control": ("dm_control", ("steersman.envs.libs.dm_control",)),
}


def _importable(package: str) -> bool:
    try:
        importlib.import_module(package)
    except ImportError:
        return False
    return True


MISSING = {pkg: spec for pkg, spec in OPTIONAL_DOCTESTS.items() if not _importable(pkg)}
# a module that imports the package at its top cannot even be collected for its doctests
collect_ignore = [str(Path("src", *module.split(".")).with_suffix(".py"))
                  for _, modules in MISSING.values() for module in modules]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for pkg, (extra, modules) in MISSING.items():
        skip = pytest.mark.skip(reason=f"{pkg} is not installed: pip install 'steersman[{extra}]'")
        for item in items:
            if isinstance(item, pytest.DoctestItem) and item.name.startswith(modules):
                item.add_marker(skip)
