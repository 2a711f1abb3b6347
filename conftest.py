"""Test-session settings shared by tests/ and the doctests under src/steersman/.

One torch thread per test process: the networks here are tiny, and with pytest-xdist
each worker would otherwise start one thread per core and the workers thrash each other
(tens of times slower on a 2-core machine).

The suite passes without the optional extras: doctests whose examples need an optional
package are skipped, naming the extra, when it cannot be imported (tests under tests/ use
``pytest.importorskip`` themselves).
"""

import importlib
import os
from pathlib import Path

# Intel MKL picks its GEMM code path by the operands' memory alignment, so the same matmul
# on a tensor at another address can differ in the last bit (seen on an AVX-512 Xeon: the
# fused rollout's logits against the collector's). Tests that compare two code paths bit
# for bit need MKL's conditional numerical reproducibility; it must be set before MKL starts.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

import pytest  # noqa: E402
import torch  # noqa: E402

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
