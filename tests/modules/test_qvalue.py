"""QValueModule / QValueActor / distributional versions against a plain reference:
the action is the argmax over allowed actions, the chosen value the value there."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.data import Bounded, Categorical, Composite, MultiOneHot, OneHot
from steersman.modules import DistributionalQValueModule, QValueActor, QValueModule
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import TensorDictModule

LOWEST = torch.finfo(torch.float32).min


def _reference(values: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Index and value of the best allowed action, row by row (first index on ties)."""
    rows = values.reshape(-1, values.shape[-1])
    allowed = torch.ones_like(rows, dtype=torch.bool) if mask is None else mask.reshape(rows.shape)
    idx, best = [], []
    for v, ok in zip(rows.tolist(), allowed.tolist()):
        candidates = [i for i in range(len(v)) if ok[i]]
        i = max(candidates, key=lambda j: (v[j], -j))
        idx.append(i)
        best.append(v[i])
    shape = values.shape[:-1]
    return torch.tensor(idx).reshape(shape), torch.tensor(best).reshape(*shape, 1)


@pytest.mark.parametrize("space", ["categorical", "one_hot"])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("batch", [(), (6,), (2, 3)])
def test_greedy_action_and_chosen_value(space, masked, batch):
    n = 5
    spec = Categorical(n) if space == "categorical" else OneHot(n)
    module = QValueModule(spec=spec, action_mask_key="mask" if masked else None)
    g = torch.Generator().manual_seed(0)
    values = torch.randn(*batch, n, generator=g)
    td = TensorDict(action_value=values.clone(), batch_size=list(batch))
    mask = None
    if masked:
        mask = torch.rand(*batch, n, generator=g) < 0.5
        mask[..., 2] = True  # at least one allowed action per row
        td.set("mask", mask)
    out = module(td)
    idx, best = _reference(values, mask)
    if space == "categorical":
        assert out["action"].dtype == torch.long and torch.equal(out["action"], idx)
    else:
        assert out["action"].dtype == torch.bool
        assert torch.equal(out["action"], torch.nn.functional.one_hot(idx, n).bool())
    assert spec.is_in(out["action"])
    torch.testing.assert_close(out["chosen_action_value"], best)
    if masked:  # masked actions get the lowest float, never -inf (0 * -inf = nan in losses)
        expected = torch.where(mask, values, LOWEST)
        torch.testing.assert_close(out["action_value"], expected)
        assert bool(out["action_value"].isfinite().all())
        onehot = torch.nn.functional.one_hot(idx, n).float()
        assert bool((onehot * out["action_value"]).sum(-1).isfinite().all())


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.lists(st.tuples(st.integers(-3, 3), st.booleans()), min_size=4, max_size=4),
        min_size=1, max_size=6,
    )
)
def test_property_matches_reference_with_ties_and_masks(rows):
    values = torch.tensor([[float(v) for v, _ in r] for r in rows])  # small ints: many ties
    mask = torch.tensor([[m for _, m in r] for r in rows])
    mask[:, 0] |= ~mask.any(-1)  # every row allows something
    module = QValueModule("categorical", action_mask_key="mask")
    action, _, chosen = module(action_value=values, mask=mask)
    idx, best = _reference(values, mask)
    assert torch.equal(action, idx)
    torch.testing.assert_close(chosen, best)


def test_categorical_spec_of_shape_one_keeps_the_dim():
    module = QValueModule(spec=Categorical(3, shape=(1,)))
    action, _, chosen = module(action_value=torch.tensor([[0.0, 2.0, 1.0], [5.0, 0.0, 0.0]]))
    assert action.tolist() == [[1], [0]] and chosen.tolist() == [[2.0], [5.0]]


def test_mult_one_hot():
    spec = MultiOneHot([2, 3])
    module = QValueModule(spec=spec)
    values = torch.tensor([[1.0, 0.0, 0.0, 4.0, 2.0]])
    action, _, chosen = module(action_value=values)
    assert action.tolist() == [[True, False, False, True, False]] and spec.is_in(action)
    assert chosen.tolist() == [[5.0]]  # the chosen values of the parts add up
    by_name = QValueModule("mult-one-hot", var_nums=[2, 3])
    assert by_name(action_value=values)[0].tolist() == [[1, 0, 0, 1, 0]]


def test_keys_action_space_names_and_composite_specs():
    module = QValueModule("one-hot", action_value_key="q", out_keys=["a", "q", "qa"])
    assert module.in_keys == ["q"] and module.out_keys == ["a", "q", "qa"] and module.spec is None
    td = module(TensorDict(q=torch.tensor([0.0, 1.0]), batch_size=[]))
    assert td["a"].tolist() == [0, 1] and td["a"].dtype == torch.long
    from_composite = QValueModule(spec=Composite(action=Categorical(2)))
    assert from_composite.action_space == "categorical"
    assert QValueModule(Categorical(2)).action_space == "categorical"  # a spec as action_space


@pytest.mark.parametrize(
    ("kwargs", "err", "match"),
    [
        ({}, ValueError, "action_space"),
        ({"action_space": "binary"}, ValueError, "action_space must be one of"),
        ({"action_space": "one_hot", "spec": Categorical(3)}, ValueError, "does not match"),
        ({"spec": Bounded(0.0, 1.0, (2,))}, ValueError, "discrete action spec"),
        ({"spec": Composite(obs=Categorical(2))}, KeyError, "action"),
        ({"action_space": "categorical", "out_keys": ["action", "other", "c"]}, ValueError, "action-value key"),
        ({"action_space": "mult_one_hot"}, ValueError, "var_nums"),
    ],
)
def test_bad_construction(kwargs, err, match):
    with pytest.raises(err, match=match):
        QValueModule(**kwargs)


def test_missing_inputs_name_the_key():
    with pytest.raises(KeyError, match="action_value"):
        QValueModule("categorical")(TensorDict(obs=torch.zeros(2), batch_size=[]))
    with pytest.raises(KeyError, match="mask"):
        QValueModule("categorical", action_mask_key="mask")(TensorDict(action_value=torch.zeros(2)))
    with pytest.raises(KeyError, match="not part of|action values"):
        QValueActor(QValueModule("categorical"), spec=Categorical(2), action_value_key="q")


def test_qvalue_actor_custom_keys_and_existing_tensordict_module():
    net = TensorDictModule(torch.nn.Linear(3, 4), ["obs"], ["q"])
    actor = QValueActor(net, spec=Categorical(4), action_value_key="q", action_key="a",
                        chosen_action_value_key="qa", action_mask_key="mask")
    assert actor.in_keys == ["obs", "mask"] and actor.out_keys == ["a", "q", "qa"]
    td = TensorDict(obs=torch.randn(5, 3), mask=torch.tensor([False, False, True, False]).expand(5, 4),
                    batch_size=[5])
    assert actor(td)["a"].tolist() == [2] * 5  # the only allowed action
    assert actor.spec["a"] == Categorical(4)


def test_distributional_expected_value_and_mask():
    support = torch.tensor([-1.0, 0.0, 1.0])
    probs = torch.tensor([[0.1, 0.6, 0.3], [0.0, 0.1, 0.9], [0.8, 0.1, 0.1]]).T  # [atoms, actions]
    log_p = probs.clamp_min(1e-9).log().unsqueeze(0).expand(2, 3, 3)  # [batch 2, atoms 3, actions 3]
    module = DistributionalQValueModule("categorical", support=support, action_mask_key="mask")
    mask = torch.tensor([[True, True, True], [True, False, True]])
    action, values = module(action_value=log_p, mask=mask)
    # expected returns per action: 0.2, 0.9, -0.7
    assert action.tolist() == [1, 0]
    torch.testing.assert_close(values, log_p)
    with pytest.raises(ValueError, match="atoms"):
        module(action_value=log_p[:, :2], mask=mask)
    onehot = DistributionalQValueModule(OneHot(3), support=support)
    assert onehot(action_value=log_p)[0].tolist() == [[False, True, False]] * 2
    assert set(dict(module.state_dict())) == {"support"}
