"""TensorClass (subclassing form), helpers (dtype predicates, group_by, assert_close,
dense_stack_tds) and memmap archives."""

from __future__ import annotations

import tarfile

import pytest
import torch

from steersman.tensordict import (
    KEY_SEPARATOR,
    LazyStackedTensorDict,
    TensorClass,
    TensorDict,
    assert_allclose_td,
    assert_close,
    default_is_leaf,
    dense_stack_tds,
    group_by,
    is_bool,
    is_floating,
    is_inexact,
    is_integer,
    is_leaf_nontensor,
    is_memmap_archive,
    is_tensorclass,
    lazy_stack,
    pack_memmap,
    unpack_memmap,
    unravel_key_to_tuple,
)


class Obs(TensorClass):
    pixels: torch.Tensor
    step: torch.Tensor


def test_tensorclass_subclass_form():
    o = Obs(pixels=torch.zeros(4, 3), step=torch.arange(4), batch_size=[4])
    assert is_tensorclass(o) and o[1:3].step.tolist() == [1, 2]
    assert type(torch.stack([o, o])) is Obs and torch.stack([o, o]).batch_size == (2, 4)

    class Sub(Obs):
        extra: torch.Tensor

    s = Sub(pixels=torch.zeros(4, 3), step=torch.arange(4), extra=torch.ones(4), batch_size=[4])
    assert s[0].extra == 1 and s.reshape(2, 2).pixels.shape == (2, 2, 3)


def test_tensorclass_flags():
    class Count(TensorClass["nocast"]):
        n: int

    assert Count(n=1).n == 1 and not isinstance(Count(n=1).n, torch.Tensor)

    class Plain(TensorClass):
        n: int

    assert isinstance(Plain(n=1).n, torch.Tensor)

    class Fz(TensorClass, frozen=True):
        n: torch.Tensor

    f = Fz(n=torch.zeros(2), batch_size=[2])
    with pytest.raises(Exception, match="frozen"):
        f.n = torch.ones(2)
    with pytest.raises(ValueError, match="bogus"):
        TensorClass["bogus"]
    with pytest.raises(TypeError, match="colour"):
        class Bad(TensorClass, colour=True):  # noqa: F841
            n: int


def test_dtype_predicates_and_keys():
    b, f, i, c = (torch.zeros(1, dtype=d) for d in (torch.bool, torch.float32, torch.int8, torch.complex64))
    assert [is_bool(x) for x in (b, f, i, c)] == [True, False, False, False]
    assert [is_floating("k", x) for x in (b, f, i, c)] == [False, True, False, False]
    assert [is_integer(x) for x in (b, f, i, c)] == [False, False, True, False]
    assert [is_inexact(x) for x in (b, f, i, c)] == [False, True, False, True]
    assert unravel_key_to_tuple(("a", ("b",))) == ("a", "b") and unravel_key_to_tuple("a") == ("a",)
    assert KEY_SEPARATOR == "."
    assert default_is_leaf(torch.Tensor) and not default_is_leaf(TensorDict)
    from steersman.tensordict import NonTensorData

    assert is_leaf_nontensor(NonTensorData) and not default_is_leaf(NonTensorData)


def test_group_by_and_dense_stack():
    td = TensorDict({"g": torch.tensor([1, 0, 1, 2]), "x": torch.arange(4)}, [4])
    values, groups = group_by(td, "g")
    assert values.tolist() == [0, 1, 2]
    assert [g["x"].tolist() for g in groups] == [[1], [0, 2], [3]]
    with pytest.raises(ValueError, match="1-D"):
        group_by(td.reshape(2, 2), "g")
    lz = lazy_stack([td, td], 0)
    dense = dense_stack_tds(lz)
    assert not isinstance(dense, LazyStackedTensorDict) and dense.batch_size == (2, 4)
    assert dense_stack_tds([td, td], dim=1).batch_size == (4, 2)


def test_assert_close_names_the_entry():
    td = TensorDict({"a": torch.zeros(2), "n": {"b": torch.zeros(2)}, "s": "x"}, [2])
    assert assert_close(td, td.clone()) is True and assert_allclose_td is assert_close
    other = td.clone()
    other["n", "b"] += 1
    with pytest.raises(AssertionError, match=r"\('n', 'b'\)"):
        assert_close(td, other)
    assert_close(td, other, atol=2, rtol=0)
    with pytest.raises(AssertionError, match="only in expected.*'extra'"):
        assert_close(td, td.clone().set("extra", torch.zeros(2)))
    assert assert_close(td, td.clone().set("extra", torch.zeros(2)), intersection=True)
    with pytest.raises(AssertionError, match="'s'"):
        assert_close(td, td.clone().set("s", "y"))


@pytest.mark.parametrize("compression", [None, "gz"])
def test_pack_unpack_memmap(tmp_path, compression):
    td = TensorDict({"a": torch.arange(4.0), "n": {"b": torch.ones(4, 2, dtype=torch.int64)}}, [4])
    td.memmap(tmp_path / "m")
    archive = pack_memmap(tmp_path / "m", tmp_path / "a.tar", compression=compression)
    assert is_memmap_archive(archive) and not is_memmap_archive(tmp_path / "m" / "meta.json")
    out = unpack_memmap(archive, tmp_path / "restored")
    assert_close(TensorDict.load_memmap(out), td)
    with pytest.raises(FileNotFoundError, match="meta.json"):
        pack_memmap(tmp_path, tmp_path / "b.tar")
    with pytest.raises(ValueError, match="compression"):
        pack_memmap(tmp_path / "m", tmp_path / "c.tar", compression="zip")


def test_unpack_refuses_paths_outside(tmp_path):
    evil = tmp_path / "evil.tar"
    (tmp_path / "meta.json").write_text("{}")
    (tmp_path / "x").write_text("boom")
    with tarfile.open(evil, "w") as tar:
        tar.add(tmp_path / "meta.json", arcname="meta.json")
        tar.add(tmp_path / "x", arcname="../escaped")
    with pytest.raises(Exception, match="escaped|outside"):
        unpack_memmap(evil, tmp_path / "out")
    assert not (tmp_path / "escaped").exists()


def test_unpad_sequence_inverts_pad_sequence():
    from steersman.tensordict import (
        NonTensorData,
        NonTensorDataBase,
        TensorCollection,
        pad_sequence,
        unpad_sequence,
    )

    seqs = [TensorDict(x=torch.arange(n), y=torch.ones(n, 2), batch_size=[n]) for n in (2, 4, 1)]
    padded = pad_sequence(seqs, return_mask=True)
    rows = unpad_sequence(padded)
    assert rows.batch_size == (3,) and "masks" not in rows.keys()
    for row, seq in zip(rows.tensordicts, seqs):
        assert row["x"].tolist() == seq["x"].tolist() and row["y"].shape == seq["y"].shape
    explicit = unpad_sequence(padded.exclude("masks"), padded["masks"])
    assert explicit.tensordicts[1]["x"].tolist() == [0, 1, 2, 3]
    with pytest.raises(KeyError, match="masks"):
        unpad_sequence(padded.exclude("masks"))
    assert isinstance(NonTensorData("a"), NonTensorDataBase) and not isinstance(TensorDict(), NonTensorDataBase)
    assert isinstance(TensorDict(), TensorCollection)


def test_collate_for_a_dataloader():
    from torch.utils.data import DataLoader

    from steersman.tensordict import collate

    samples = [(TensorDict(obs=torch.full((2,), float(i))), i) for i in range(4)]
    batches = list(DataLoader(samples, batch_size=2, collate_fn=collate))
    td, labels = batches[1]
    assert td.batch_size == (2,) and td["obs"][:, 0].tolist() == [2, 3] and labels.tolist() == [2, 3]
    ragged = [TensorDict(tokens=torch.ones(n, dtype=torch.long)) for n in (1, 3)]
    out = collate(ragged, pad_keys={"tokens": 0}, mask_key="mask")
    assert out["tokens"].tolist() == [[1, 0, 0], [1, 1, 1]]
    assert out["mask", "tokens"].tolist() == [[True, False, False], [True, True, True]]
    with pytest.raises(NotImplementedError, match="nested"):
        collate(ragged, nested_keys=["tokens"])
    assert collate("as is") == "as is"


def test_as_tensordict_module():
    from steersman.tensordict.nn import as_tensordict_module

    @as_tensordict_module(in_keys="c", out_keys="d")
    def add_one(c):
        return c + 1

    assert add_one(TensorDict(c=torch.zeros(())))["d"] == 1 and add_one(c=torch.zeros(2)).tolist() == [1, 1]

    class K:
        k = 3

        @as_tensordict_module(in_keys=["c"], out_keys=["d"])
        def scale(self, c):
            return c * self.k

    assert K().scale(TensorDict(c=torch.ones(())))["d"] == 3


def test_tensordict_keywords_of_lazy_stack_dataclass_and_tensorclass():
    import dataclasses

    from steersman.tensordict import from_dataclass, tensorclass

    members = [TensorDict(a=torch.zeros(2), batch_size=[2]) for _ in range(3)]
    lz = LazyStackedTensorDict(*members, stack_dim_name="env", strict_shape=True)
    assert lz.names == ["env", None]
    with pytest.raises(ValueError, match="hook_in"):
        LazyStackedTensorDict(*members, hook_in=lambda x: x)

    @dataclasses.dataclass
    class P:
        x: torch.Tensor

    @tensorclass(tensor_only=True, skip_post_init_on_rebuild=True)
    class Q:
        x: torch.Tensor

    q = from_dataclass(P(torch.zeros(2)), dest_cls=Q, batch_size=[2], shadow=False, tensor_only=False)
    assert type(q) is Q and q.batch_size == (2,)
    with pytest.raises(NotImplementedError, match="inplace"):
        from_dataclass(P, inplace=True)
    with pytest.raises(TypeError, match="dest_cls"):
        from_dataclass(P(torch.zeros(2)), dest_cls=P)
    with pytest.raises(NotImplementedError, match="kw_only"):
        tensorclass(kw_only=True)
