"""torch.compile(fullgraph=True) of policy forwards: one graph, same results as eager.

(``nn.LSTM``/``nn.GRU`` are not traced by dynamo, so the recurrent modules are not here.)
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounter

from steersman.data import Bounded, Categorical, OneHot
from steersman.modules import (
    MLP,
    Actor,
    EGreedyModule,
    ExplorationType,
    QValueActor,
    set_exploration_type,
)
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import TensorDictSequential


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _policies() -> dict:
    torch.manual_seed(0)
    return {
        "actor": Actor(MLP(in_features=4, out_features=2, num_cells=[8]), spec=Bounded(-1.0, 1.0, (2,)),
                       safe=True),
        "qvalue_categorical": QValueActor(nn.Linear(4, 3), spec=Categorical(3)),
        "qvalue_onehot_masked": QValueActor(nn.Linear(4, 3), spec=OneHot(3), action_mask_key="mask"),
    }


def _td(seed: int) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(5, 3, generator=g) < 0.5
    mask[:, 0] = True
    return TensorDict(observation=torch.randn(5, 4, generator=g) * 3, mask=mask, batch_size=[5])


@pytest.mark.parametrize("name", ["actor", "qvalue_categorical", "qvalue_onehot_masked"])
def test_fullgraph_forward(name):
    policy = _policies()[name]
    counter = CompileCounter()
    compiled = torch.compile(policy, fullgraph=True, backend=counter)
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        for seed in (1, 2):
            out, expected = compiled(_td(seed)), policy(_td(seed))
            for key in policy.out_keys:
                torch.testing.assert_close(out[key], expected[key])
    assert counter.frame_count == 1 and counter.op_count > 0


def test_fullgraph_exploring_policy():
    torch.manual_seed(0)
    spec = Categorical(3)
    policy = TensorDictSequential(QValueActor(nn.Linear(4, 3), spec=spec), EGreedyModule(spec, eps_init=0.5))
    counter = CompileCounter()
    compiled = torch.compile(policy, fullgraph=True, backend=counter)
    with set_exploration_type(ExplorationType.RANDOM):
        for seed in (1, 2):
            assert spec.is_in(compiled(_td(seed))["action"])
    assert counter.frame_count == 1
