"""torch.compile(fullgraph=True) of TensorDict modules: one graph, no recompilation.

Compiling is slow on CPU, so the tests are few and tiny; none uses inductor (the container
test in tests/tensordict/test_compile.py does).
"""

from __future__ import annotations

import pytest
import torch
from torch import distributions as D
from torch import nn
from torch._dynamo.testing import CompileCounter

from steersman.tensordict import TensorDict
from steersman.tensordict.nn import (
    InteractionType,
    NormalParamExtractor,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictSequential,
    set_interaction_type,
)


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _td(seed: int) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    return TensorDict({"obs": torch.randn(5, 3, generator=g), "agent": {"h": torch.randn(5, 2, generator=g)}},
                      batch_size=[5])


def _policy() -> ProbabilisticTensorDictSequential:
    torch.manual_seed(0)
    return ProbabilisticTensorDictSequential(
        TensorDictModule(nn.Sequential(nn.Linear(3, 4), NormalParamExtractor()), ["obs"],
                         [("params", "loc"), ("params", "scale")]),
        # The first torch.compile of a process turns torch.distributions argument validation
        # off for good (torch._dynamo.eval_frame patch()); validation can't be traced
        # with fullgraph=True, so say it explicitly, whatever ran before.
        ProbabilisticTensorDictModule({"loc": ("params", "loc"), "scale": ("params", "scale")},
                                      ["action"], D.Normal, {"validate_args": False},
                                      return_log_prob=True),
    )


def _modules() -> dict:
    torch.manual_seed(0)
    plain = TensorDictModule(nn.Linear(3, 2), ["obs"], [("out", "y")])
    seq = TensorDictSequential(
        TensorDictModule(nn.Linear(3, 2), ["obs"], ["hidden"]),
        TensorDictModule(lambda h, a: (h + a, h - a), ["hidden", ("agent", "h")], ["a", "b"]),
    )
    return {"plain": plain, "sequential": seq, "probabilistic": _policy()}


def _check_same(compiled_out: TensorDict, eager_out: TensorDict) -> None:
    keys = sorted(eager_out.keys(True, True), key=str)
    assert sorted(compiled_out.keys(True, True), key=str) == keys
    for key in keys:
        torch.testing.assert_close(compiled_out.get(key), eager_out.get(key))


@pytest.mark.parametrize("kind", ["plain", "sequential", "probabilistic"])
def test_fullgraph_one_frame_no_recompile(kind):
    module = _modules()[kind]
    counter = CompileCounter()
    compiled = torch.compile(module, fullgraph=True, backend=counter)
    with set_interaction_type(InteractionType.MODE):
        for seed in (1, 2, 3):  # new data each call, same shapes
            out = compiled(_td(seed))
            _check_same(out, module(_td(seed)))
    assert counter.frame_count == 1
    assert counter.op_count >= 1  # the module's ops were traced, not skipped


def test_interaction_type_is_guarded():
    """Switching the interaction type recompiles (once) instead of reusing a stale graph."""
    policy = _policy()
    counter = CompileCounter()
    compiled = torch.compile(policy, fullgraph=True, backend=counter)
    with set_interaction_type("mode"):
        out = compiled(_td(1))
    torch.testing.assert_close(out["action"], out["params", "loc"])
    with set_interaction_type("random"):
        out = compiled(_td(1))
        compiled(_td(2))
    assert not torch.allclose(out["action"], out["params", "loc"])
    assert counter.frame_count == 2


def test_aot_sequential_matches_eager():
    """The traced graph (through AOTAutograd's functionalization) gives eager's values.
    ``aot_eager`` proves what our code contributes; inductor's code generation is torch's
    and is exercised once, on a container, in tests/tensordict/test_compile.py."""
    module = _modules()["sequential"]
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    for seed in (1, 2):
        _check_same(compiled(_td(seed)), module(_td(seed)))
