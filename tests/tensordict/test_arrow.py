"""from_arrow / to_arrow / from_pandas / from_parquet (pyarrow, pandas: optional extras)."""

from __future__ import annotations

import pytest
import torch

from steersman.tensordict import TensorDict, from_arrow, from_pandas, from_parquet, to_arrow

pa = pytest.importorskip("pyarrow")
pd = pytest.importorskip("pandas")


def make_td():
    td = TensorDict(obs=torch.arange(12.0).reshape(3, 2, 2), act=torch.tensor([1, 0, 2]),
                    done=torch.tensor([False, True, False]),
                    sub=TensorDict(r=torch.tensor([0.5, 1.5, 2.5]), batch_size=[3]), batch_size=[3])
    td["tag"] = ["a", "b", "c"]
    return td


def test_arrow_round_trip_and_parquet(tmp_path):
    import pyarrow.parquet as pq

    td = make_td()
    table = to_arrow(td)
    assert table.column_names == ["obs", "act", "done", "sub", "tag"]
    for back in (from_arrow(table), from_arrow(table, copy=True)):
        assert back.batch_size == (3,)
        for key in ("obs", "act", "done", ("sub", "r")):
            assert torch.equal(back[key], td[key]) and back[key].dtype == td[key].dtype
        assert back[2]["tag"] == "c"
    view, copied = from_arrow(table), from_arrow(table, copy=True)
    assert view["act"].data_ptr() == table.column("act").chunk(0).buffers()[1].address  # no copy
    assert copied["act"].data_ptr() != view["act"].data_ptr()
    pq.write_table(table, tmp_path / "t.parquet")
    back = from_parquet(tmp_path / "t.parquet", columns=["obs", "act"])
    assert set(back.keys()) == {"obs", "act"} and torch.equal(back["obs"], td["obs"])
    with pytest.raises(ValueError, match="one batch dim"):
        to_arrow(TensorDict(x=torch.zeros(2, 3), batch_size=[2, 3]))


def test_nulls_raise_fill_mask():
    table = pa.table({"x": pa.array([1.0, None, 3.0]), "y": pa.array([1, 2, 3])})
    with pytest.raises(ValueError, match="'x' has 1 nulls"):
        from_arrow(table)
    assert from_arrow(table, nulls="fill")["x"].tolist() == [1.0, 0.0, 3.0]
    with pytest.raises(ValueError, match="mask_key"):
        from_arrow(table, nulls="mask")
    td = from_arrow(table, nulls="mask", mask_key="valid")
    assert td["valid", "x"].tolist() == [True, False, True] and "y" not in td["valid"].keys()


def test_from_pandas_options():
    df = pd.DataFrame({"obs.x": [0.0, 1.0], "obs.y": [2.0, 3.0], "n": [4, 5]}, index=[10, 11])
    td = from_pandas(df, separator=".", dtype=torch.float16)
    assert td["obs", "x"].dtype == torch.float16 and td["n"].dtype == torch.int64
    assert td.batch_size == (2,) and set(td.keys()) == {"obs", "n"}
    with pytest.raises(TypeError, match="pyarrow Table"):
        from_arrow(df)
