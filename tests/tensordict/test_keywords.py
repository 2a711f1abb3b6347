"""tensordict's documented keyword names on the functional API (TorchRL-style calls by keyword)."""

from __future__ import annotations

import pytest
import torch

from steersman.tensordict import (
    NonTensorData,
    TensorDict,
    cat,
    is_non_tensor,
    is_tensor_collection,
    lazy_stack,
    maybe_dense_stack,
    pad,
    pad_sequence,
)


def tds():
    return (TensorDict(x=torch.zeros(2), batch_size=[2]), TensorDict(x=torch.ones(2), batch_size=[2]))


def test_functional_keywords():
    a, b = tds()
    assert cat(input=[a, b], dim=0)["x"].tolist() == [0, 0, 1, 1]
    assert lazy_stack(input=[a, b], dim=1).batch_size == (2, 2)
    assert pad(tensordict=a, pad_size=[1, 0], value=5.0)["x"].tolist() == [5, 0, 0]
    assert is_tensor_collection(datatype=a) and not is_tensor_collection(datatype=torch.zeros(1))
    assert is_non_tensor(data=NonTensorData("s")) and not is_non_tensor(data=a)


def test_maybe_dense_stack_out():
    a, b = tds()
    out = TensorDict(x=torch.full((2, 2), 9.0), batch_size=[2, 2])
    assert maybe_dense_stack(input=[a, b], out=out) is out
    assert out["x"].tolist() == [[0, 0], [1, 1]]
    with pytest.raises(ValueError, match=r"out has batch_size \[3\]"):
        maybe_dense_stack([a, b], out=TensorDict(x=torch.zeros(3), batch_size=[3]))


def test_pad_sequence_padding_side_and_out():
    seqs = [TensorDict(x=torch.tensor([1.0, 2.0]), batch_size=[2]),
            TensorDict(x=torch.tensor([3.0]), batch_size=[1])]
    right = pad_sequence(list_of_tensordicts=seqs, return_mask=True)
    assert right["x"].tolist() == [[1, 2], [3, 0]] and right["masks"].tolist() == [[True, True], [True, False]]
    left = pad_sequence(seqs, padding_value=-1.0, return_mask=True, padding_side="left")
    assert left["x"].tolist() == [[1, 2], [-1, 3]] and left["masks"].tolist() == [[True, True], [False, True]]
    out = TensorDict(x=torch.zeros(2, 2), batch_size=[2, 2])
    assert pad_sequence(seqs, out=out) is out and out["x"].tolist() == [[1, 2], [3, 0]]
    with pytest.raises(ValueError, match="padding_side"):
        pad_sequence(seqs, padding_side="middle")


def test_load_keywords(tmp_path):
    from steersman.tensordict import load, load_memmap, save

    td = TensorDict(a=torch.zeros(3), b={"c": torch.ones(3, 2)}, batch_size=[3])
    save(td, tmp_path)
    assert load(tmp_path, subpath=("b", "c")).shape == (3, 2)
    assert load(tmp_path, subpath="b/c").shape == (3, 2)
    with pytest.raises(KeyError, match="subpath 'x'"):
        load(tmp_path, subpath="x")
    out = TensorDict(a=torch.full((3,), 7.0), b={"c": torch.zeros(3, 2)}, batch_size=[3])
    assert load(tmp_path, device="cpu", non_blocking=True, out=out, num_threads=2, allow_pickle=False) is out
    assert out["a"].tolist() == [0, 0, 0] and out["b", "c"].eq(1).all()
    in_memory = load_memmap(tmp_path, mode="r")
    assert not in_memory.is_memmap()
    in_memory["a"] += 1                                   # mode="r": writes stay in memory
    assert load(tmp_path)["a"].tolist() == [0, 0, 0]
    shared = load(tmp_path, mode="r+")
    assert shared.is_memmap()
    with pytest.raises(ValueError, match="robust_key=False"):
        load(tmp_path, robust_key=False)
    with pytest.raises(ValueError, match="mode must be"):
        load(tmp_path, mode="w")


def test_save_keywords_atomic_and_refusals(tmp_path, monkeypatch):
    from steersman.tensordict import io, load, save

    path = tmp_path / "run"
    save(TensorDict(a=torch.zeros(2), batch_size=[2]), path)
    save(data=TensorDict(a=torch.ones(2), batch_size=[2]), prefix=path, copy_existing=True, num_threads=2,
         atomic=True)
    assert load(path)["a"].tolist() == [1, 1] and sorted(p.name for p in tmp_path.iterdir()) == ["run"]

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(io, "_write_root", broken)
    with pytest.raises(OSError, match="disk full"):
        save(TensorDict(a=torch.full((2,), 5.0), batch_size=[2]), path, atomic=True)
    monkeypatch.undo()
    assert load(path)["a"].tolist() == [1, 1] and sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    td = TensorDict(a=torch.zeros(1), batch_size=[1])
    for kwargs, match in [(dict(prefix=tmp_path / "x.tdz"), "archive"),
                          (dict(prefix=tmp_path / "y", compression="lzma"), "compression"),
                          (dict(prefix=tmp_path / "y", share_non_tensor=True), "share_non_tensor"),
                          (dict(prefix=tmp_path / "y", robust_key=False), "robust_key")]:
        with pytest.raises(ValueError, match=match):
            save(td, **kwargs)
    assert not (tmp_path / "y").exists()
