"""get_primers_from_module: one primer, a Compose of several, none, failing submodules."""

from __future__ import annotations

import pytest
from torch import nn

from steersman.envs.transforms import Compose, TensorDictPrimer
from steersman.modules import GRUModule, LSTMModule, get_primers_from_module
from steersman.tensordict.nn import TensorDictSequential


def test_primers_from_recurrent_submodules():
    lstm = LSTMModule(input_size=3, hidden_size=4, num_layers=2, in_key="obs", out_key="h1")
    gru = GRUModule(input_size=4, hidden_size=5, in_key="h1", out_key="h2")
    single = get_primers_from_module(TensorDictSequential(lstm))
    assert isinstance(single, TensorDictPrimer)
    both = get_primers_from_module(TensorDictSequential(lstm, gru))
    assert isinstance(both, Compose)
    keys = [set(p.primers.keys()) for p in both.transforms]
    assert keys == [set(lstm.recurrent_state_specs().keys(True, True)),
                    set(gru.recurrent_state_specs().keys(True, True))]


def test_primers_none_and_failures():
    with pytest.warns(UserWarning, match="no submodule"):
        assert get_primers_from_module(nn.Linear(2, 2)) is None
    bad = GRUModule(input_size=3, hidden_size=4, in_keys=["x", "h"], out_keys=["y", ("next", "other")])
    with pytest.raises(RuntimeError, match="next"):
        get_primers_from_module(TensorDictSequential(bad))
    with pytest.warns(UserWarning, match="GRUModule"):
        assert get_primers_from_module(TensorDictSequential(bad), warn=False, strict=False) is None
