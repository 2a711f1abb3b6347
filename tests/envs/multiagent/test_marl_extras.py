"""The PettingZoo and VMAS wrappers import their package only when built, with an error
naming the extra to install when it is missing."""

from __future__ import annotations

import sys

import pytest

from steersman.envs import (
    NavigationEnv,
    PettingZooEnv,
    PettingZooWrapper,
    VmasEnv,
    VmasWrapper,
    to_pettingzoo,
)


@pytest.mark.parametrize("module, build, extra", [
    ("pettingzoo", lambda: PettingZooWrapper(object()), "steersman[pettingzoo]"),
    ("pettingzoo", lambda: PettingZooEnv("classic/tictactoe_v3"), "steersman[pettingzoo]"),
    ("pettingzoo", lambda: to_pettingzoo(NavigationEnv()), "steersman[pettingzoo]"),
    ("vmas", lambda: VmasEnv("navigation", 2), "steersman[vmas]"),
    ("vmas", lambda: VmasWrapper(object()), "steersman[vmas]"),
])
def test_missing_extra_names_it(monkeypatch, module, build, extra):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail
    with pytest.raises(ImportError) as err:
        build()
    assert f"pip install '{extra}'" in str(err.value)

