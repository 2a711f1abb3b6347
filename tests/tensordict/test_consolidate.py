"""``consolidate``/``from_consolidated``: one storage for every leaf, and its file."""

from __future__ import annotations

import json

import pytest
import torch

from steersman.tensordict import LoadError, TensorDict, from_consolidated


def sample():
    return TensorDict(a=torch.arange(3.0), b={"c": torch.ones(3, 2, dtype=torch.int16)}, flag="on",
                      batch_size=[3], names=["t"])


def test_views_of_one_storage_locked():
    td = sample()
    c = td.consolidate()
    assert c.is_locked and c.is_consolidated() and not td.is_consolidated()
    storages = {c["a"].untyped_storage().data_ptr(), c["b", "c"].untyped_storage().data_ptr()}
    assert len(storages) == 1
    assert torch.equal(c["a"], td["a"]) and c["b", "c"].dtype == torch.int16 and c["flag"] == "on"
    assert c.names == ["t"]
    c["a"] += 1  # in place is allowed; the source is a copy, untouched
    assert td["a"].tolist() == [0, 1, 2]
    with pytest.raises(RuntimeError, match="locked"):
        c["new"] = torch.zeros(3)
    same = td.consolidate(inplace=True)
    assert same is td and td.is_consolidated() and td["a"].tolist() == [0, 1, 2]


def test_file_round_trip_and_write_through(tmp_path):
    path = tmp_path / "td.bin"
    c = sample().consolidate(filename=path)
    c["a"][0] = 7.0  # a shared memory map: the write reaches the file
    back = from_consolidated(path)
    assert back["a"].tolist() == [7, 1, 2] and back["b", "c"].shape == (3, 2)
    assert back.names == ["t"] and back["flag"] == "on" and back.is_consolidated()
    assert torch.equal(TensorDict.from_consolidated(path)["b", "c"], back["b", "c"])
    back["a"][1] = -1  # a private map: the file keeps its value
    assert from_consolidated(path)["a"][1] == 1
    empty = TensorDict({}, batch_size=[2]).consolidate(filename=tmp_path / "e.bin")
    assert from_consolidated(tmp_path / "e.bin").batch_size == (2,) and not list(empty.keys())


def _rewrite_meta(path, fn):
    raw = path.read_bytes()
    n = int.from_bytes(raw[-16:-8], "little")
    data, meta = raw[: len(raw) - 16 - n], json.loads(raw[len(raw) - 16 - n: -16])
    fn(meta)
    m = json.dumps(meta).encode()
    path.write_bytes(data + m + len(m).to_bytes(8, "little") + raw[-8:])


def test_bad_files_and_refusals(tmp_path):
    path = tmp_path / "td.bin"
    sample().consolidate(filename=path)
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"x" * 64)
    with pytest.raises(LoadError, match="no STMCONS1 trailer"):
        from_consolidated(bad)

    def far(meta):
        meta["fields"]["a"]["offset"] = 1 << 40

    _rewrite_meta(path, far)
    with pytest.raises(LoadError, match="does not fit the file"):
        from_consolidated(path)
    with pytest.raises(TypeError, match="no JSON form"):
        TensorDict(obj=object(), batch_size=[]).consolidate()
    with pytest.raises(ValueError, match="return_early"):
        sample().consolidate(return_early=True)
    with pytest.raises(ValueError, match="lives on the CPU"):
        sample().consolidate(filename=path, device="meta")
