"""``parse_tensor_dict_string``: the structure of a printed TensorDict, rebuilt as zeros."""

from __future__ import annotations

import pytest
import torch

from steersman.tensordict import TensorDict, parse_tensor_dict_string, set_printoptions


def structure(td):
    return {k: (v.shape, v.dtype) for k, v in td.items(True, True)}, td.batch_size


def sample():
    return TensorDict(
        obs=torch.ones(3, 4), step=torch.arange(3), half=torch.ones(3, 2, dtype=torch.float16),
        next=TensorDict(done=torch.ones(3, 2, 1, dtype=torch.bool), deeper={"r": torch.ones(3, 2)},
                        batch_size=[3, 2]),
        batch_size=[3],
    )


@pytest.mark.parametrize("compact", [False, True], ids=["verbose", "compact"])
def test_round_trip_both_layouts(compact):
    td = sample()
    with set_printoptions(compact=compact):
        text = repr(td)
    out = parse_tensor_dict_string(text)
    assert type(out) is TensorDict
    got, bs = structure(out)
    want, want_bs = structure(td)
    assert bs == want_bs and got == want
    assert all(v.eq(0).all() for v in out.values(True, True))
    if not compact:  # the verbose layout prints nested batch sizes
        assert out["next"].batch_size == (3, 2)


# printed by tensordict 0.15 (the anchor), as they appear in logs
ANCHOR_VERBOSE = """TensorDict(
    fields={
        a: Tensor(shape=torch.Size([3, 4]), device=cpu, dtype=torch.float32, is_shared=False),
        b: TensorDict(
            fields={
                c: Tensor(shape=torch.Size([3, 2]), device=cpu, dtype=torch.int64, is_shared=False)},
            batch_size=torch.Size([3]),
            device=None,
            is_shared=False)},
    batch_size=torch.Size([3]),
    device=None,
    is_shared=False)"""
ANCHOR_COMPACT = "TensorDict(batch_size=[3], fields={a: f32[], m: bool[2, 1], n: {c: i64[5]}})"


def test_anchor_reprs():
    v = parse_tensor_dict_string(ANCHOR_VERBOSE)
    assert v["a"].shape == (3, 4) and v["b", "c"].dtype == torch.int64 and v["b"].batch_size == (3,)
    c = parse_tensor_dict_string(ANCHOR_COMPACT)
    assert c["a"].shape == (3,) and c["m"].shape == (3, 2, 1) and c["m"].dtype == torch.bool
    assert c["n", "c"].shape == (3, 5) and c["n"].batch_size == (3,)


@pytest.mark.parametrize("text, match", [
    ("TensorDict(batch_size=[3], fields={s: str})", "not a Tensor or a TensorDict"),
    ("TensorDict(batch_size=[3], fields={a: f32[2]", "expected"),
    ("Linear(in_features=3)", "not a TensorDict repr"),
    ("TensorDict(batch_size=[3], fields={a: q99[2]})", "not a dtype"),
    ("TensorDict(batch_size=[x], fields={})", "list of ints"),
])
def test_bad_input(text, match):
    with pytest.raises(ValueError, match=match):
        parse_tensor_dict_string(text)
    with pytest.raises(TypeError, match="expects a str"):
        parse_tensor_dict_string(b"TensorDict()")
