"""``append_memmap``: a saved folder grows along dim 0; everything is checked first."""

from __future__ import annotations

import os

import pytest
import torch

from steersman.tensordict import TensorDict, append_memmap, load_memmap, save, tensorclass


def saved(tmp_path, n=3):
    td = TensorDict(a=torch.arange(n * 2.0).reshape(n, 2), i=torch.arange(n),
                    nested=TensorDict(b=torch.zeros(n, 4, dtype=torch.int16), batch_size=[n, 4]),
                    tag="x", batch_size=[n])
    save(td, tmp_path)
    return td


def rows(m=2, **over):
    r = TensorDict(a=torch.full((m, 2), 9.0), i=torch.arange(m) + 100,
                   nested=TensorDict(b=torch.ones(m, 4, dtype=torch.int16), batch_size=[m, 4]),
                   tag="x", batch_size=[m])
    for k, v in over.items():
        r[k] = v
    return r


def test_append_grows_every_leaf(tmp_path):
    td = saved(tmp_path)
    before = load_memmap(tmp_path)  # an earlier reader keeps its 3 rows
    append_memmap(tmp_path, rows(2))
    append_memmap(tmp_path, rows(1))
    out = load_memmap(tmp_path)
    assert out.batch_size == (6,) and out["nested"].batch_size == (6, 4)
    assert torch.equal(out["a"][:3], td["a"]) and out["a"][3:].eq(9).all()
    assert out["i"].tolist() == [0, 1, 2, 100, 101, 100]
    assert out["nested", "b"][3:].eq(1).all() and out["tag"] == "x"
    assert before.batch_size == (3,) and before["a"].shape == (3, 2)


def test_tensorclass_rows(tmp_path):
    @tensorclass
    class Row:
        a: torch.Tensor

    save(TensorDict(a=torch.zeros(2, 3), batch_size=[2]), tmp_path)
    append_memmap(tmp_path, Row(a=torch.ones(1, 3), batch_size=[1]))
    assert load_memmap(tmp_path)["a"].sum().item() == 3


@pytest.mark.parametrize("bad, match", [
    (lambda: rows(2, a=torch.zeros(2, 3)), "does not extend the saved"),
    (lambda: rows(2, i=torch.arange(2.0)), "dtype torch.float32"),
    (lambda: rows(2).exclude("i"), "missing \\['i'\\]"),
    (lambda: rows(2, extra=torch.zeros(2)), "extra \\['extra'\\]"),
    (lambda: rows(2, tag="y"), "stays as saved"),
    (lambda: rows(2, nested=TensorDict(b=torch.ones(2, 5, dtype=torch.int16), batch_size=[2, 5])),
     "do not extend the saved batch size"),
])
def test_refused_rows_leave_the_folder_as_it_was(tmp_path, bad, match):
    saved(tmp_path)
    sizes = {f: os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(tmp_path) for f in fs}
    with pytest.raises(ValueError, match=match):
        append_memmap(tmp_path, bad())
    assert sizes == {f: os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(tmp_path) for f in fs}
    assert load_memmap(tmp_path).batch_size == (3,)


def test_not_a_folder_and_failed_write_rolls_back(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="is not a folder"):
        append_memmap(tmp_path / "nope", rows(1))
    saved(tmp_path)
    import steersman.tensordict.append as mod

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(mod, "_write_json_atomic", boom)  # the data is written, then meta.json fails
    with pytest.raises(OSError, match="disk full"):
        append_memmap(tmp_path, rows(2))
    assert load_memmap(tmp_path)["a"].shape == (3, 2)  # every file was cut back
