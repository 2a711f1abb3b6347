"""Tensor storages take any pytree of tensors (nested dicts, lists, tuples, namedtuples),
as TorchRL's do, and give the same structure back from ``sample``/indexing/loads."""

from __future__ import annotations

import collections

import pytest
import torch
from torch.utils import _pytree as pytree

from steersman.data import (
    CheckpointError,
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSampler,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    TensorStorage,
)
from steersman.tensordict import TensorDict

Pair = collections.namedtuple("Pair", "x y")

#: pytree makers: item i of every leaf holds i (so a sample reveals which items it holds)
TREES = {
    "dict": lambda n: {"obs": _rows(n, 3), "reward": _rows(n)},
    "nested": lambda n: {"obs": _rows(n, 2), "next": {"obs": _rows(n, 2), "done": _rows(n).bool()},
                         "extra": [_rows(n, 1, 2), (_rows(n).long(),)]},
    "tuple": lambda n: (_rows(n, 4), _rows(n)),
    "list": lambda n: [_rows(n), {"a": _rows(n, 2)}],
    "namedtuple": lambda n: Pair(_rows(n, 2), _rows(n).long()),
}
STORAGES = {
    "lazy": lambda: LazyTensorStorage(16),
    "memmap": lambda: LazyMemmapStorage(16),
}
SAMPLERS = {
    "random": lambda: RandomSampler(),
    "without_replacement": lambda: SamplerWithoutReplacement(),
    "prioritized": lambda: PrioritizedSampler(16, alpha=0.7, beta=0.5),
}


def _rows(n: int, *shape: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32).reshape(n, *([1] * len(shape))).expand(n, *shape).clone()


def _item_ids(tree) -> torch.Tensor:
    """The item number every leaf holds, per sampled row (all leaves must agree)."""
    leaves = pytree.tree_leaves(tree)
    ids = [leaf.reshape(leaf.shape[0], -1)[:, 0].long() for leaf in leaves]
    ids = [i if leaf.dtype is not torch.bool else ids[0] for i, leaf in zip(ids, leaves)]  # bool leaves: item != 0
    for other in ids[1:]:
        assert torch.equal(other, ids[0]), "leaves of one sample come from different items"
    return ids[0]


def _same_structure(a, b) -> bool:
    return pytree.tree_structure(a) == pytree.tree_structure(b)


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
@pytest.mark.parametrize("storage", sorted(STORAGES))
@pytest.mark.parametrize("tree", sorted(TREES))
def test_extend_sample_gives_the_structure_back(tree, storage, sampler):
    rb = ReplayBuffer(storage=STORAGES[storage](), sampler=SAMPLERS[sampler](), batch_size=6)
    data = TREES[tree](10)
    index = rb.extend(data)
    assert index.tolist() == list(range(10)) and len(rb) == 10
    out, info = rb.sample(return_info=True)
    assert _same_structure(out, data) and type(out) is type(data)
    assert torch.equal(_item_ids(out), info["index"])  # each row is the stored item of its index
    for got, want in zip(pytree.tree_leaves(out), pytree.tree_leaves(data)):
        assert got.dtype == want.dtype and got.shape[1:] == want.shape[1:]


@pytest.mark.parametrize("tree", sorted(TREES))
def test_add_index_and_wraparound_match_a_plain_list(tree):
    rb = ReplayBuffer(storage=LazyTensorStorage(8), batch_size=4)
    slots, cursor = [None] * 8, 0  # the reference: item number per slot, by a plain round-robin loop
    for items in ([0, 1, 2, 3, 4], [5, 6, 7, 8, 9, 10]):
        rb.extend(pytree.tree_map(lambda t, s=items[0]: t if t.dtype is torch.bool else t + s, TREES[tree](len(items))))
        for i in items:
            slots[cursor], cursor = i, (cursor + 1) % 8
    one = pytree.tree_map(lambda t: t[0] if t.dtype is torch.bool else t[0] + 100, TREES[tree](1))
    rb.add(one)
    slots[cursor] = 100
    assert len(rb) == 8
    assert torch.equal(_item_ids(rb[torch.arange(8)]), torch.tensor(slots))
    single = rb[cursor]
    assert _same_structure(single, one) and int(pytree.tree_leaves(single)[0].reshape(-1)[0]) == 100
    grid = rb[torch.tensor([[0, 1], [2, 3]])]
    assert all(leaf.shape[:2] == (2, 2) for leaf in pytree.tree_leaves(grid))


@pytest.mark.parametrize("storage", sorted(STORAGES))
def test_dumps_loads_and_state_dict_keep_the_structure(storage, tmp_path):
    rb = ReplayBuffer(storage=STORAGES[storage](), batch_size=3)
    data = TREES["nested"](7)
    rb.extend(data)
    rb.dumps(tmp_path / "rb")
    fresh = ReplayBuffer(storage=STORAGES[storage](), batch_size=3)
    fresh.loads(tmp_path / "rb")
    assert len(fresh) == 7 and _same_structure(fresh[:], data)
    for a, b in zip(pytree.tree_leaves(fresh[:]), pytree.tree_leaves(data)):
        assert torch.equal(a, b)
    again = ReplayBuffer(storage=LazyTensorStorage(16))
    again.load_state_dict(rb.state_dict())
    assert torch.equal(again[:]["next"]["obs"], data["next"]["obs"])


def test_a_given_pytree_is_a_full_storage():
    data = TREES["tuple"](5)
    rb = ReplayBuffer(storage=TensorStorage(data), batch_size=5, sampler=SamplerWithoutReplacement())
    out = rb.sample()
    assert isinstance(out, tuple) and sorted(_item_ids(out).tolist()) == [0, 1, 2, 3, 4]


def test_ndim2_pytrees_along_time():
    rb = ReplayBuffer(storage=LazyTensorStorage(12, ndim=2), batch_size=4)
    rows = {"obs": torch.arange(8.0).reshape(2, 4, 1), "r": torch.arange(8.0).reshape(2, 4)}  # [n_envs, T]
    rb.extend(rows)
    assert len(rb) == 8 and rb.storage.shape == (4, 2)
    out, info = rb.sample(return_info=True)
    t, env = info["index"]
    ids = (env * 4 + t).float()
    assert torch.equal(out["r"], ids) and torch.equal(out["obs"].squeeze(-1), ids)
    assert torch.equal(rb[:]["r"], rows["r"]) and torch.equal(rb[1]["obs"], rows["obs"][1])


# ------------------------------------------------------------------------- bad input
def test_a_different_structure_is_refused_and_nothing_changes():
    rb = ReplayBuffer(storage=LazyTensorStorage(8), batch_size=2)
    rb.extend(TREES["dict"](3))
    before = rb[:]
    with pytest.raises(ValueError, match=r"holds pytrees shaped \{'obs': \*, 'reward': \*\}; got a pytree shaped "
                                         r"\{'obs': \*\}\. Nothing was written"):
        rb.extend({"obs": _rows(2, 3)})
    with pytest.raises(TypeError, match="holds pytrees shaped .*; got a TensorDict"):
        rb.extend(TensorDict({"obs": _rows(2, 3), "reward": _rows(2)}, [2]))
    assert len(rb) == 3 and torch.equal(rb[:]["obs"], before["obs"])


def test_leaves_with_different_batch_dims_name_the_leaf():
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    with pytest.raises(ValueError, match=r"\['next'\]\['a'\] has \[4\] items but \['obs'\] has \[5\]"):
        rb.extend({"obs": _rows(5), "next": {"a": _rows(4)}})
    with pytest.raises(TypeError, match=r"\['meta'\] holds a str; tensor storages hold pytrees of tensors only"):
        rb.extend({"obs": _rows(5), "meta": "hello"})
    with pytest.raises(ValueError, match="holds no tensor"):
        rb.extend({})
    assert len(rb) == 0 and not rb._storage.initialized


def test_a_pytree_storage_does_not_load_into_a_tensordict_storage(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    rb.extend(TREES["dict"](3))
    rb.dumps(tmp_path / "rb")
    other = ReplayBuffer(storage=LazyTensorStorage(8))
    other.extend(TensorDict({"obs": _rows(2, 3), "reward": _rows(2)}, [2]))
    with pytest.raises(CheckpointError, match="holds pytrees shaped .* but this storage holds TensorDicts"):
        other.loads(tmp_path / "rb")
    assert len(other) == 2


def test_unregistered_namedtuples_cannot_be_saved(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    rb.extend(TREES["namedtuple"](3))
    with pytest.raises(TypeError, match=r"cannot save a storage of pytrees shaped Pair\(x=\*, y=\*\)"):
        rb.dumps(tmp_path / "rb")
