"""``UnbatchedTensor``: batch ops leave it as is, tensor ops apply to it."""

from __future__ import annotations

import pickle

import pytest
import torch

from steersman.tensordict import TensorDict, UnbatchedTensor


def make():
    table = UnbatchedTensor(torch.arange(12.0).reshape(3, 4))
    return TensorDict(a=torch.randn(2, 3), table=table, n={"b": torch.ones(2, 3, 5)}, batch_size=[2, 3]), table


SHAPE_OPS = {
    "int": lambda td: td[1], "slice": lambda td: td[:, 1:], "long": lambda td: td[torch.tensor([1, 0])],
    "mask": lambda td: td[torch.tensor([True, False])], "tuple": lambda td: td[0, [0, 2]],
    "reshape": lambda td: td.reshape(6), "view": lambda td: td.view(3, 2), "unsqueeze": lambda td: td.unsqueeze(0),
    "permute": lambda td: td.permute(1, 0), "expand": lambda td: td.expand(4, 2, 3),
    "flatten": lambda td: td.flatten(0, 1), "repeat": lambda td: td.repeat(2, 1),
    "unbind": lambda td: td.unbind(1)[2], "split": lambda td: td.split(1, 0)[1],
    "stack": lambda td: torch.stack([td, td], 1), "cat": lambda td: torch.cat([td, td], 0),
}


@pytest.mark.parametrize("op", list(SHAPE_OPS))
def test_shape_ops_leave_it_unchanged(op):
    td, table = make()
    out = SHAPE_OPS[op](td)
    ref = SHAPE_OPS[op](td.exclude("table"))
    assert out.batch_size == ref.batch_size  # the batch ops apply to the other entries as usual
    assert torch.equal(out["a"], ref["a"]) and torch.equal(out["n", "b"], ref["n", "b"])
    u = out["table"]
    assert type(u) is UnbatchedTensor and u.shape == (3, 4) and u.data_ptr() == table.data_ptr()
    assert u.batch_size == out.batch_size


def test_tensor_ops_apply_and_keep_the_type():
    td, table = make()
    for out in (td + 1, td.apply(lambda t: t * 2), td.clone(), td.to(torch.float64)):
        u = out["table"]
        assert type(u) is UnbatchedTensor and u.shape == (3, 4)
    assert torch.equal((td + 1)["table"].as_subclass(torch.Tensor), table.as_subclass(torch.Tensor) + 1)
    assert td.clone()["table"].data_ptr() != table.data_ptr()
    assert type(table[1:]) is UnbatchedTensor and table[1:].shape == (2, 4)  # a plain index is a tensor index
    assert isinstance(td["table"], torch.Tensor) and td.get("table") is td["table"]
    back = pickle.loads(pickle.dumps(td))
    assert type(back["table"]) is UnbatchedTensor and torch.equal(back["table"], table)


def test_indexed_writes_and_stack_rules():
    td, table = make()
    other = td.clone()
    other["table"] = UnbatchedTensor(torch.full((3, 4), 7.0))
    td[0, 1:] = other[0, 1:]  # the payload is written whole, whatever the index
    assert td["table"].eq(7).all() and table.eq(7).all()
    td[1] = TensorDict(a=torch.zeros(3), n={"b": torch.zeros(3, 5)}, batch_size=[3])  # no "table": left as is
    assert td["table"].eq(7).all() and td["a"][1].eq(0).all()
    bad = td.clone()
    bad["table"] = UnbatchedTensor(torch.zeros(5))
    before = td["a"].clone()
    with pytest.raises(ValueError, match="unbatched entry 'table'"):
        td[0] = bad[0]
    assert torch.equal(td["a"], before)  # nothing was written
    differ = td.clone()
    differ["table"] = UnbatchedTensor(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="unbatched entries differ"):
        torch.stack([td, differ])
    same = td.clone()  # equal payloads (not the same object) stack
    assert torch.stack([td, same])["table"].eq(7).all()


def test_construction_and_auto_batch_size():
    td = TensorDict({"u": UnbatchedTensor([1, 2, 3, 4, 5]), "a": torch.zeros(3, 2)})
    assert td.auto_batch_size_().batch_size == (3, 2)  # the unbatched entry does not count
    assert td["u"].batch_size == ()  # stored before the batch size changed
    td.batch_size = [3]  # nor does it block a batch size change
    with pytest.raises(ValueError, match="batch"):
        td["plain"] = torch.zeros(5)
    td["u2"] = UnbatchedTensor(torch.zeros(7), batch_size=[9])
    assert td["u2"].batch_size == (3,) and td.set("u3", UnbatchedTensor(torch.zeros(3)))["u3"].batch_size == (3,)
    assert repr(UnbatchedTensor(torch.zeros(2))) == "UnbatchedTensor(tensor([0., 0.]))"
