"""LSTMModule / GRUModule: recurrent mode == step-by-step == a per-step Python loop over
the same torch RNN, with trajectories restarting (``is_init``) inside the batch."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.modules import GRUModule, LSTMModule, recurrent_mode, set_recurrent_mode
from steersman.tensordict import TensorDict

# oneDNN has no projected LSTM; torch falls back to its own kernel and says so
pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections:UserWarning")

IN, HID, LAYERS = 3, 5, 2

VARIANTS = {
    "lstm": lambda: LSTMModule(input_size=IN, hidden_size=HID, num_layers=LAYERS, in_key="obs", out_key="out"),
    "lstm_proj": lambda: LSTMModule(input_size=IN, hidden_size=HID, proj_size=2, in_key="obs", out_key="out"),
    "gru": lambda: GRUModule(input_size=IN, hidden_size=HID, num_layers=LAYERS, in_key="obs", out_key="out"),
}


def _make(name: str):
    torch.manual_seed(0)
    return VARIANTS[name]()


def _state_keys(module) -> list:
    return module.in_keys[1:-1]


def _data(module, batch: tuple, is_init: torch.Tensor, seed: int = 0) -> TensorDict:
    """Random inputs and stored states ``[*batch, T]``; ``is_init`` ``[*batch, T, 1]``."""
    g = torch.Generator().manual_seed(seed)
    layers = module._rnn.num_layers
    states = {k: torch.randn(*batch, layers, size, generator=g)
              for k, size in zip(_state_keys(module), module._state_sizes)}
    return TensorDict(obs=torch.randn(*batch, IN, generator=g), is_init=is_init,
                      batch_size=list(batch), **states)


def _reference(module, td: TensorDict):
    """Per-row, per-step loop: outputs ``[*B, T, H]`` and the state after each step."""
    rnn = module._rnn
    keys = _state_keys(module)
    batch = td.batch_size
    flat = td.reshape(-1, batch[-1])
    outs, after = [], []
    for row in range(flat.batch_size[0]):
        state = [flat[k][row, 0].unsqueeze(1) for k in keys]  # [layers, 1, size]
        row_out, row_after = [], []
        for t in range(flat.batch_size[1]):
            if flat["is_init"][row, t].item():
                state = [torch.zeros_like(s) for s in state]
            y, new = rnn(flat["obs"][row, t].view(1, 1, IN), tuple(state) if len(state) > 1 else state[0])
            state = list(new) if isinstance(new, tuple) else [new]
            row_out.append(y[0, 0])
            row_after.append([s[:, 0] for s in state])
        outs.append(torch.stack(row_out))
        after.append(row_after)
    return torch.stack(outs).reshape(*batch, -1), after


def _random_is_init(batch: tuple, p: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*batch, 1, generator=g) < p


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("batch", [(3, 7), (2, 2, 5), (6,)])
def test_recurrent_mode_matches_reference(name, batch):
    module = _make(name)
    td = _data(module, batch, _random_is_init(batch, 0.3, seed=1))
    assert bool(td["is_init"][..., 1:, :].any())  # trajectories restart inside the sequences
    expected, after = _reference(module, td)
    with set_recurrent_mode(True):
        out = module(td.clone())
    torch.testing.assert_close(out["out"], expected)
    # next states: the state after the step at the end of each segment, zeros elsewhere
    flat = out.reshape(-1, batch[-1])
    is_init = flat["is_init"].squeeze(-1)
    for row in range(flat.batch_size[0]):
        for t in range(batch[-1]):
            end = t == batch[-1] - 1 or bool(is_init[row, t + 1])
            for i, key in enumerate(module.out_keys[1:]):
                value = flat[key][row, t]
                if end:
                    torch.testing.assert_close(value, after[row][t][i])
                else:
                    assert bool((value == 0).all())


@pytest.mark.parametrize("name", list(VARIANTS))
def test_step_by_step_matches_reference(name):
    module = _make(name)
    batch = (4, 6)
    td = _data(module, batch, _random_is_init(batch, 0.3, seed=2))
    expected, _ = _reference(module, td)
    keys = _state_keys(module)
    step = td[:, 0].clone()
    outs = []
    for t in range(batch[1]):
        step.set("obs", td["obs"][:, t])
        step.set("is_init", td["is_init"][:, t])
        step = module(step)
        outs.append(step["out"])
        for key in keys:  # what step_mdp does between steps
            step.set(key, step["next", key])
    torch.testing.assert_close(torch.stack(outs, 1), expected)


@settings(max_examples=15, deadline=None)
@given(
    data=st.lists(st.lists(st.booleans(), min_size=5, max_size=5), min_size=1, max_size=4),
    name=st.sampled_from(sorted(VARIANTS)),
)
def test_property_any_reset_pattern(data, name):
    module = _make(name)
    is_init = torch.tensor(data).unsqueeze(-1)
    td = _data(module, tuple(is_init.shape[:2]), is_init)
    expected, _ = _reference(module, td)
    torch.testing.assert_close(module.set_recurrent_mode(True)(td)["out"], expected)


@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_gradients_match_reference(name):
    module = _make(name)
    batch = (3, 6)
    is_init = torch.zeros(*batch, 1, dtype=torch.bool)
    is_init[0, 2] = is_init[1, 4] = is_init[2, 0] = True
    td = _data(module, batch, is_init)
    td.set("obs", td["obs"].requires_grad_())
    with set_recurrent_mode(True):
        out = module(td.clone())["out"]
    grads = torch.autograd.grad(out.square().sum(), [td["obs"], *module.parameters()])
    expected, _ = _reference(module, td)
    grads_ref = torch.autograd.grad(expected.square().sum(), [td["obs"], *module.parameters()])
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref)
    assert all(bool(g.abs().sum() > 0) for g in grads)  # every parameter and input gets one


@pytest.mark.parametrize("name", list(VARIANTS))
def test_reset_ignores_stored_state_and_missing_state_is_zero(name):
    module = _make(name)
    batch = (4,)
    starts = _data(module, batch, torch.ones(4, 1, dtype=torch.bool))
    fresh = starts.select("obs", "is_init")  # no state entries at all
    a, b = module(starts.clone()), module(fresh.clone())
    torch.testing.assert_close(a["out"], b["out"])
    continuing = starts.clone()
    continuing.set("is_init", torch.zeros(4, 1, dtype=torch.bool))
    assert not torch.allclose(module(continuing)["out"], a["out"])  # the stored state is used


def test_modes_context_default_and_twin():
    module = _make("lstm")
    assert recurrent_mode() is None and not module.recurrent_mode
    twin = module.set_recurrent_mode(True)
    assert twin.recurrent_mode and twin.lstm is module.lstm
    assert twin.in_keys == module.in_keys and twin.out_keys == module.out_keys
    with set_recurrent_mode(True):
        assert module.recurrent_mode
        with set_recurrent_mode("sequential"):
            assert not twin.recurrent_mode
        assert recurrent_mode() is True
    assert recurrent_mode() is None
    default = LSTMModule(input_size=IN, hidden_size=HID, in_key="obs", out_key="out",
                         default_recurrent_mode=True)
    assert default.recurrent_mode
    with pytest.raises(ValueError, match="recurrent mode"):
        set_recurrent_mode("sideways")


def test_keys_and_specs():
    lstm = LSTMModule(input_size=IN, hidden_size=HID, num_layers=2, proj_size=2, in_key="obs", out_key="y")
    assert lstm.in_keys == ["obs", "recurrent_state_h", "recurrent_state_c", "is_init"]
    assert lstm.out_keys == ["y", ("next", "recurrent_state_h"), ("next", "recurrent_state_c")]
    specs = lstm.recurrent_state_specs()
    assert specs["recurrent_state_h"].shape == (2, 2) and specs["recurrent_state_c"].shape == (2, HID)
    gru = GRUModule(input_size=IN, hidden_size=HID, in_keys=["x", "h", "first"], out_keys=["y", ("next", "h")])
    assert gru.in_keys == ["x", "h", "first"]
    td = TensorDict(x=torch.randn(2, IN), first=torch.ones(2, 1, dtype=torch.bool), batch_size=[2])
    assert gru(td)["next", "h"].shape == (2, 1, HID)
    assert set(dict(gru.state_dict())) == {f"gru.{n}" for n, _ in gru.gru.named_parameters()}


def test_primer_needs_next_keys_and_the_env_transform():
    bad = GRUModule(input_size=IN, hidden_size=HID, in_keys=["x", "h"], out_keys=["y", ("next", "other")])
    with pytest.raises(RuntimeError, match="next"):
        bad.make_tensordict_primer()
    good = GRUModule(input_size=IN, hidden_size=HID, in_key="x", out_key="y")
    try:
        primer = good.make_tensordict_primer()
    except ImportError as err:  # the transform is not in steersman.envs yet
        assert "recurrent_state_specs" in str(err)
    else:
        assert primer is not None


@pytest.mark.parametrize(
    ("kwargs", "err", "match"),
    [
        ({"input_size": IN, "hidden_size": HID}, ValueError, "in_key"),
        ({"input_size": IN, "hidden_size": HID, "in_key": "x", "in_keys": ["x", "h", "c"], "out_key": "y"},
         ValueError, "in_key"),
        ({"input_size": IN, "hidden_size": HID, "in_keys": ["x", "h"], "out_key": "y"}, ValueError, "in_keys"),
        ({"input_size": IN, "hidden_size": HID, "in_key": "x", "out_key": "y", "bidirectional": True},
         ValueError, "bidirectional"),
        ({"in_key": "x", "out_key": "y"}, ValueError, "hidden_size"),
        ({"input_size": IN, "hidden_size": HID, "in_key": "x", "out_key": "y", "python_based": True},
         ValueError, "python_based"),
    ],
)
def test_bad_construction(kwargs, err, match):
    with pytest.raises(err, match=match):
        LSTMModule(**kwargs)


def test_bad_inputs_name_the_problem():
    module = _make("lstm")
    td = TensorDict(obs=torch.randn(4, IN), batch_size=[4])
    with pytest.raises(KeyError, match="is_init.*InitTracker"):
        module(td)
    td.set("is_init", torch.zeros(4, 1, dtype=torch.bool))
    td.set("recurrent_state_h", torch.zeros(4, 3, HID))  # wrong number of layers
    with pytest.raises(ValueError, match="recurrent state must have shape"):
        module(td)
    with set_recurrent_mode(True), pytest.raises(ValueError, match="time dim"):
        module(TensorDict(obs=torch.randn(IN), is_init=torch.zeros(1, dtype=torch.bool)))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_state_dict_round_trip(name):
    a = _make(name)
    torch.manual_seed(1)
    b = VARIANTS[name]()
    td = _data(a, (3,), torch.zeros(3, 1, dtype=torch.bool))
    assert not torch.allclose(a(td.clone())["out"], b(td.clone())["out"])
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(a(td.clone())["out"], b(td.clone())["out"])
