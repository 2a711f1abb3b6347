"""Tests for steersman.tensordict.persistent (PersistentTensorDict, HDF5-backed)."""

from __future__ import annotations

import hashlib
import os
import pickle
import subprocess
import sys

import pytest
import torch

from steersman.tensordict import NonTensorData, NonTensorStack, TensorDict
from steersman.tensordict.persistent import PersistentTensorDict, to_h5

h5py = pytest.importorskip("h5py")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N = 20


# ---------------------------------------------------------------------- helpers
def make_td(n: int = N) -> TensorDict:
    g = torch.Generator().manual_seed(0)
    return TensorDict(
        {
            "obs": torch.randn(n, 3, generator=g),
            "action": torch.arange(n) * 10,
            "done": torch.arange(n).reshape(n, 1) % 3 == 0,
            "half": torch.randn(n, 2, generator=g).bfloat16(),
            "next": {
                "obs": torch.randn(n, 3, generator=g),
                "reward": torch.arange(n, dtype=torch.float64).reshape(n, 1),
                "deep": {"x": torch.arange(n * 4).reshape(n, 2, 2)},
            },
            "env": "CartPole-v1",
            "tags": [f"t{i}" for i in range(n)],
        },
        batch_size=[n],
    )


def leaf_values(td) -> dict:
    out = {}
    for key in td.keys(include_nested=True, leaves_only=True):
        v = td.get(key)
        if isinstance(v, NonTensorStack):
            v = ("stack", v.tolist())
        elif isinstance(v, NonTensorData):
            v = ("data", v.data, tuple(v.batch_size))
        out[key] = v
    return out


def assert_same(actual, expected) -> None:
    assert actual.batch_size == expected.batch_size
    a, e = leaf_values(actual), leaf_values(expected)
    assert set(a) == set(e)
    for key, ev in e.items():
        av = a[key]
        if isinstance(ev, torch.Tensor):
            assert isinstance(av, torch.Tensor), key
            assert av.dtype == ev.dtype, key
            assert av.shape == ev.shape, key
            assert torch.equal(av, ev), key
        else:
            assert av == ev, key


def file_digest(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "data.h5")


@pytest.fixture
def saved(path):
    td = make_td()
    PersistentTensorDict.from_dict(td, path).close()
    return path, td


class Recorder:
    """Records every selection passed to ``h5py.Dataset.__getitem__``."""

    def __init__(self, monkeypatch):
        self.calls = []
        original = h5py.Dataset.__getitem__

        def getitem(ds, args, *rest, **kw):
            self.calls.append((ds.name, args))
            return original(ds, args, *rest, **kw)

        monkeypatch.setattr(h5py.Dataset, "__getitem__", getitem)

    def selections(self, name):
        return [a for n, a in self.calls if n == name]


# ---------------------------------------------------------------------- round trip
def test_round_trip_every_leaf(saved):
    path, td = saved
    with PersistentTensorDict.from_h5(path) as ptd:
        assert ptd.batch_size == td.batch_size
        assert_same(ptd, td)
        assert_same(ptd.to_tensordict(), td)
        assert isinstance(ptd.get("next"), PersistentTensorDict)
        assert isinstance(ptd.get(("next", "deep")), PersistentTensorDict)
        assert ptd["env"] == "CartPole-v1"
        assert ptd["tags"][:3] == ["t0", "t1", "t2"]
        assert ptd.get("half").dtype is torch.bfloat16
        assert list(ptd.keys()) == list(td.keys())  # insertion order kept
        assert type(ptd.to_tensordict()) is TensorDict


def test_from_dict_plain_dict_auto_batch_size(path):
    ptd = PersistentTensorDict.from_dict({"a": torch.zeros(4, 3), "b": {"c": torch.ones(4, 2)}}, path)
    assert ptd.batch_size == torch.Size([4])
    assert ptd.mode == "r+"
    ptd.close()
    with PersistentTensorDict.from_h5(path) as ptd:
        assert ptd.batch_size == torch.Size([4])
        assert torch.equal(ptd["b", "c"], torch.ones(4, 2))


def test_to_h5_helper_and_compression(path):
    td = make_td()
    ptd = to_h5(td, path, compression="gzip")
    assert ptd.file["obs"].compression == "gzip"
    assert_same(ptd, td)
    ptd.set("more", torch.zeros(N, 5))  # later entries are compressed too
    assert ptd.file["more"].compression == "gzip"
    ptd.close()


def test_batch_size_persisted(path):
    td = TensorDict({"a": torch.zeros(4, 5, 6), "b": torch.zeros(4, 5)}, batch_size=[4])
    PersistentTensorDict.from_dict(td, path).close()
    with PersistentTensorDict.from_h5(path) as ptd:
        assert ptd.batch_size == torch.Size([4])  # the stored one, not the auto [4, 5]
    with PersistentTensorDict(path, mode="r+") as ptd:
        ptd.batch_size = [4, 5]
    with PersistentTensorDict(path) as ptd:
        assert ptd.batch_size == torch.Size([4, 5])
        with pytest.raises(ValueError, match="does not fit"):
            ptd.batch_size = [3]
    with PersistentTensorDict(path, batch_size=[4], mode="r+"):
        pass
    with PersistentTensorDict(path) as ptd:
        assert ptd.batch_size == torch.Size([4])


def test_auto_batch_size_of_foreign_file(path):
    with h5py.File(path, "w") as f:
        f["x"] = torch.zeros(6, 7, 2).numpy()
        f["g/y"] = torch.ones(6, 7).numpy()
        f["s"] = "hello"
    with PersistentTensorDict.from_h5(path) as ptd:
        assert ptd.batch_size == torch.Size([6, 7])
        assert ptd["s"] == "hello"
        assert isinstance(ptd.get("s"), NonTensorData)
        assert torch.equal(ptd["g", "y"], torch.ones(6, 7))
        assert ptd[2, 3]["s"] == "hello"


def test_new_file_and_set(path):
    with PersistentTensorDict(path, mode="w", batch_size=[3]) as ptd:
        ptd.set("a", torch.arange(3))
        ptd["b"] = torch.ones(3, 2)
        ptd.set(("n", "c"), torch.zeros(3, 1, dtype=torch.float16))
        ptd.set("name", "abc")
        ptd.set_non_tensor("meta", {"lr": 0.1, "layers": [1, 2]})
        with pytest.raises(ValueError, match="batch size mismatch"):
            ptd.set("bad", torch.zeros(4))
    with PersistentTensorDict(path) as ptd:
        assert ptd.batch_size == torch.Size([3])
        assert ptd["a"].tolist() == [0, 1, 2]
        assert ptd["n", "c"].dtype is torch.float16
        assert ptd["name"] == "abc"
        assert ptd["meta"] == {"lr": 0.1, "layers": [1, 2]}
        assert isinstance(ptd.get("n"), PersistentTensorDict)
        assert ptd.get("n").batch_size == torch.Size([3])


# ---------------------------------------------------------------------- lazy indexing
INDICES_1D = [
    3,
    -1,
    slice(3, 10),
    slice(None, None, 3),
    slice(15, 2),
    torch.tensor([7, 2, 2, 5, 19, 0]),
    torch.tensor([4, 5, 6]),
    torch.tensor([[1, 3], [3, 0]]),
    torch.tensor(5),
    [1, 1, 0],
    torch.arange(N) % 4 == 1,
    torch.zeros(N, dtype=torch.bool),
    torch.tensor([], dtype=torch.long),
    (None, slice(2, 5)),
    (slice(2, 5), None),
    (Ellipsis, 4),
]


@pytest.mark.parametrize("index", INDICES_1D, ids=repr)
def test_index_matches_in_memory(saved, index):
    path, td = saved
    with PersistentTensorDict.from_h5(path) as ptd:
        view = ptd[index]
        assert isinstance(view, PersistentTensorDict)
        assert_same(view, td[index])
        assert_same(view.to_tensordict(), td[index])


def test_index_reads_only_asked_rows(saved, monkeypatch):
    path, td = saved
    with PersistentTensorDict.from_h5(path) as ptd:
        rec = Recorder(monkeypatch)
        view = ptd[3:10]
        assert rec.calls == []  # indexing reads nothing
        assert torch.equal(view["obs"], td["obs"][3:10])
        assert rec.selections("/obs") == [(slice(3, 10, 1),)]

        rec.calls.clear()
        idx = torch.tensor([7, 2, 2, 15, 5])
        out = ptd[idx]["obs"]
        assert torch.equal(out, td["obs"][idx])
        (sel,) = rec.selections("/obs")
        assert sel[0].tolist() == [2, 5, 7, 15]  # sorted, unique: h5py's requirement

        rec.calls.clear()
        mask = torch.zeros(N, dtype=torch.bool)
        mask[[1, 4, 9]] = True
        assert torch.equal(ptd[mask]["next", "reward"], td["next", "reward"][mask])
        (sel,) = rec.selections("/next/reward")
        assert sel[0].tolist() == [1, 4, 9]

        rec.calls.clear()  # chained views compose into one read
        assert torch.equal(ptd[2:18][torch.tensor([5, 1])]["action"], td["action"][2:18][[5, 1]])
        (sel,) = rec.selections("/action")
        assert sel[0].tolist() == [3, 7]

        rec.calls.clear()
        assert torch.equal(ptd[4]["obs"], td["obs"][4])
        assert rec.selections("/obs") == [(4,)]

        rec.calls.clear()  # a contiguous index becomes a slice
        assert torch.equal(ptd[torch.tensor([6, 4, 5])]["action"], td["action"][[6, 4, 5]])
        assert rec.selections("/action") == [(slice(4, 7),)]

        rec.calls.clear()
        assert ptd[torch.tensor([], dtype=torch.long)]["obs"].shape == (0, 3)
        assert rec.calls == []


def test_nested_views_are_lazy(saved, monkeypatch):
    path, td = saved
    with PersistentTensorDict.from_h5(path) as ptd:
        rec = Recorder(monkeypatch)
        sub = ptd[5:8].get("next")
        assert isinstance(sub, PersistentTensorDict)
        assert sub.batch_size == torch.Size([3])
        assert rec.calls == []
        assert torch.equal(sub["deep", "x"], td["next", "deep", "x"][5:8])
        assert rec.selections("/next/deep/x") == [(slice(5, 8, 1),)]
        assert ptd[5:8].get_item_shape(("next", "deep", "x")) == torch.Size([3, 2, 2])


def test_get_at_reads_selected_rows(saved, monkeypatch):
    path, td = saved
    with PersistentTensorDict.from_h5(path) as ptd:
        rec = Recorder(monkeypatch)
        assert torch.equal(ptd.get_at("obs", slice(2, 4)), td["obs"][2:4])
        assert rec.selections("/obs") == [(slice(2, 4, 1),)]
        assert torch.equal(ptd.get_at("obs", (slice(None), 1)), td["obs"][:, 1])  # feature dim


def test_iteration_gives_views(saved):
    path, td = saved
    with PersistentTensorDict.from_h5(path) as ptd:
        rows = list(ptd[:3])
        assert all(isinstance(r, PersistentTensorDict) and r.batch_size == () for r in rows)
        for i, r in enumerate(rows):
            assert_same(r, td[i])
        assert len(ptd) == N


@pytest.fixture
def saved_2d(path):
    g = torch.Generator().manual_seed(1)
    td = TensorDict(
        {"x": torch.randn(6, 5, 2, generator=g), "i": torch.arange(30).reshape(6, 5),
         "n": {"y": torch.arange(6 * 5 * 3).reshape(6, 5, 3)}, "s": "shared"},
        batch_size=[6, 5],
    )
    PersistentTensorDict.from_dict(td, path).close()
    return path, td


INDICES_2D = [
    (1, 2),
    (slice(1, 4), 3),
    (slice(None), torch.tensor([4, 0, 0])),
    (torch.tensor([5, 1]), slice(None, None, 2)),
    (torch.tensor([5, 1, 1]), torch.tensor([0, 4, 2])),  # joint (zip) indexing
    (torch.tensor([[0, 1], [2, 3]]), torch.tensor([1, 2])),  # broadcast tensors
    torch.arange(30).reshape(6, 5) % 7 == 0,  # 2-D mask
    (torch.arange(6) % 2 == 0, slice(1, 3)),
    (Ellipsis, 1),
    (None, 2),
    (slice(1, 3), None, torch.tensor([3, 1])),
    (torch.tensor([2, 2]), None),
]


@pytest.mark.parametrize("index", INDICES_2D, ids=repr)
def test_index_2d_matches_in_memory(saved_2d, index):
    path, td = saved_2d
    with PersistentTensorDict.from_h5(path) as ptd:
        assert_same(ptd[index], td[index])


CHAINS = [
    [slice(1, 5), (slice(None), torch.tensor([3, 0, 3]))],
    [(None,), (0, slice(1, 4)), torch.tensor([2, 0])],
    [(torch.tensor([5, 1, 1]), torch.tensor([0, 4, 2])), torch.tensor([2, 0]), 1],
    [torch.arange(30).reshape(6, 5) % 4 == 0, slice(None, None, 2), torch.tensor([1, 1])],
    [(slice(None), torch.tensor([[1, 2], [3, 4]])), (1, slice(None), 0)],
    [(None, torch.tensor([3, 2])), (0, slice(None), None, torch.tensor([4, 1]))],
]


@pytest.mark.parametrize("chain", CHAINS, ids=repr)
def test_chained_indexing(saved_2d, chain):
    path, td = saved_2d
    with PersistentTensorDict.from_h5(path) as ptd:
        view, ref = ptd, td
        for index in chain:
            view, ref = view[index], ref[index]
            assert_same(view, ref)


def test_index_errors(saved):
    path, _ = saved
    with PersistentTensorDict.from_h5(path) as ptd:
        with pytest.raises(IndexError):
            ptd[N]
        with pytest.raises(IndexError):
            ptd[torch.tensor([0, N])]
        with pytest.raises(IndexError):
            ptd[torch.ones(N + 1, dtype=torch.bool)]
        with pytest.raises(IndexError):
            ptd[0, 0]
        with pytest.raises(ValueError, match="step"):
            ptd[::-1]


# ---------------------------------------------------------------------- writes
def test_writes_land_in_file(saved):
    path, td = saved
    ref = td.clone()
    with PersistentTensorDict(path, mode="r+") as ptd:
        ptd.set("new", torch.full((N, 2), 7.0))
        ref.set("new", torch.full((N, 2), 7.0))
        ptd.set("obs", torch.zeros(N, 3, dtype=torch.float64))  # replaced: new dtype
        ref.set("obs", torch.zeros(N, 3, dtype=torch.float64))

        idx = torch.tensor([9, 3, 14])
        src = TensorDict({"action": torch.tensor([-1, -2, -3]), "next": {"reward": torch.full((3, 1), 5.0, dtype=torch.float64)}}, [3])
        ptd[idx] = src
        ref[idx] = src

        ptd[2:6] = {"action": torch.tensor(100)}  # broadcast
        ref[2:6] = {"action": torch.tensor(100)}

        mask = torch.arange(N) % 5 == 4
        ptd[mask] = TensorDict({"done": torch.ones(int(mask.sum()), 1, dtype=torch.bool)}, [int(mask.sum())])
        ref[mask] = TensorDict({"done": torch.ones(int(mask.sum()), 1, dtype=torch.bool)}, [int(mask.sum())])

        ptd.set_("new", torch.tensor([1.0, 2.0]))
        ref.set_("new", torch.tensor([1.0, 2.0]))
        ptd.update_({"next": {"obs": torch.ones(N, 3)}})
        ref.update_({"next": {"obs": torch.ones(N, 3)}})
        ptd.set_at_("action", 42, 0)
        ref.set_at_("action", 42, 0)
        ptd.set_at_(("next", "deep", "x"), 0, (1, 0))
        ref.set_at_(("next", "deep", "x"), 0, (1, 0))
        ptd[7]["new"] = torch.tensor([3.0, 4.0])  # set on a view writes in place
        ref["new"][7] = torch.tensor([3.0, 4.0])
        ptd.set("tags", [f"u{i}" for i in range(N)])
        ref.set("tags", [f"u{i}" for i in range(N)])
        ptd[1:3] = TensorDict({"tags": ["a", "b"]}, [2])
        ref[1:3] = TensorDict({"tags": ["a", "b"]}, [2])
        ptd.set("env", "Pendulum")
        ref.set("env", "Pendulum")
        assert_same(ptd, ref)
    with PersistentTensorDict(path) as ptd:
        assert_same(ptd, ref)
        assert ptd["tags"][:4] == ["u0", "a", "b", "u3"]


def test_inplace_ops_write_to_file(saved):
    path, td = saved
    ref = td.exclude("env", "tags", "half", "done")
    with PersistentTensorDict(path, mode="r+") as ptd:
        ptd.exclude("env", "tags", "half", "done", inplace=True)
        ptd += 1
        ref += 1
        ptd[::2].mul_(2)
        ref[::2] = ref[::2] * 2
        ptd.get("next").apply_(lambda x: x - 3)
        ref.get("next").apply_(lambda x: x - 3)
        ptd[torch.tensor([1, 0])].zero_()
        ref[torch.tensor([1, 0])] = ref[torch.tensor([1, 0])].zero_()
        ptd.fill_(("next", "reward"), 9)
        ref.fill_(("next", "reward"), 9)
        ptd.select("obs").float()  # in-memory result, file untouched
    with PersistentTensorDict(path) as ptd:
        assert_same(ptd, ref)


def test_duplicate_and_unsorted_index_write(path):
    td = TensorDict({"a": torch.zeros(10, 2)}, [10])
    ref = td.clone()
    with PersistentTensorDict.from_dict(td, path) as ptd:
        idx = torch.tensor([8, 1, 8, 4])
        val = torch.tensor([[1.0, 1.0], [2.0, 2.0], [1.0, 1.0], [3.0, 3.0]])  # duplicates agree
        ptd[idx] = {"a": val}
        ref[idx] = {"a": val}
        ptd[torch.tensor([[0, 2], [2, 0]])] = {"a": torch.tensor(5.0)}
        ref[torch.tensor([[0, 2], [2, 0]])] = {"a": torch.tensor(5.0)}
    with PersistentTensorDict(path) as ptd:
        assert torch.equal(ptd["a"], ref["a"])


def test_writes_2d(saved_2d):
    path, td = saved_2d
    ref = td.clone()
    with PersistentTensorDict(path, mode="r+") as ptd:
        for index in INDICES_2D:
            value = -ref[index].exclude("s").apply(lambda x: x + 1)
            ptd[index] = value
            ref[index] = value
            assert_same(ptd, ref)
    with PersistentTensorDict(path) as ptd:
        assert_same(ptd, ref)


def test_nested_group_with_longer_batch(path):
    inner = TensorDict({"y": torch.arange(24).reshape(4, 3, 2), "s": [["a", "b", "c"]] * 4}, [4, 3])
    td = TensorDict({"x": torch.arange(12.0).reshape(4, 3), "n": inner}, [4])
    with PersistentTensorDict.from_dict(td, path) as ptd:
        assert ptd.batch_size == torch.Size([4])
        n = ptd.get("n")
        assert n.batch_size == torch.Size([4, 3])
        for index in [(1, 2), (slice(None), torch.tensor([2, 0])),
                      (torch.tensor([3, 1]), torch.tensor([0, 2])), torch.arange(12).reshape(4, 3) % 2 == 0]:
            assert_same(n[index], inner[index])
        view = ptd[torch.tensor([3, 0])].get("n")
        assert_same(view[:, 1], inner[torch.tensor([3, 0])][:, 1])
        view[:, 1] = {"y": torch.zeros(2, 2, dtype=torch.long), "s": ["p", "q"]}
        expected = inner.clone()
        expected.get("y")[torch.tensor([3, 0]), 1] = 0
        assert torch.equal(ptd["n", "y"], expected["y"])
        assert ptd["n", "s"][3] == ["a", "p", "c"] and ptd["n", "s"][0] == ["a", "q", "c"]
    with PersistentTensorDict(path) as ptd:
        assert ptd.get("n").batch_size == torch.Size([4, 3])


def test_set_dict_makes_groups(saved):
    path, _ = saved
    with PersistentTensorDict(path, mode="r+", device="cpu") as ptd:
        assert ptd.device == torch.device("cpu")
        ptd.set("d", {"a": torch.ones(N), "b": {"c": torch.zeros(N, 2)}})
        ptd.update({"d": {"a": torch.full((N,), 3.0)}, "e": {"f": torch.ones(N)}})
        ptd["g"] = {"h": torch.ones(N, 1)}
    with PersistentTensorDict(path) as ptd:
        assert isinstance(ptd.get("d"), PersistentTensorDict)
        assert isinstance(ptd.get(("d", "b")), PersistentTensorDict)
        assert ptd["d", "a"].tolist() == [3.0] * N
        assert ptd["d", "b", "c"].shape == (N, 2)
        assert ptd["e", "f"].shape == (N,) and ptd["g", "h"].shape == (N, 1)


def test_view_cannot_add_keys(saved):
    path, _ = saved
    with PersistentTensorDict(path, mode="r+") as ptd:
        with pytest.raises(RuntimeError, match="indexed view"):
            ptd[2:4].set("brand_new", torch.zeros(2))
        view = ptd[2:4]
        with pytest.raises(RuntimeError, match="indexed view"):
            view[0] = {"brand_new": torch.zeros(())}
        assert "brand_new" not in ptd.keys()
        # an indexed write into the container itself preallocates the new key (zeros)
        ptd[2:4] = {"brand_new": torch.ones(2)}
        assert ptd["brand_new"].tolist() == [0, 0, 1, 1] + [0] * (ptd.batch_size[0] - 4)
        with pytest.raises(ValueError, match="cannot write"):
            ptd[2:4] = {"obs": torch.zeros(3, 3)}


def test_read_only_refuses_writes(saved):
    path, td = saved
    before = file_digest(path)
    with PersistentTensorDict.from_h5(path) as ptd:
        attempts = [
            lambda: ptd.set("new", torch.zeros(N)),
            lambda: ptd.set("obs", torch.zeros(N, 3)),
            lambda: ptd.__setitem__(slice(0, 2), {"action": torch.zeros(2, dtype=torch.long)}),
            lambda: ptd.set_("action", torch.zeros(N, dtype=torch.long)),
            lambda: ptd.update_({"action": torch.zeros(N, dtype=torch.long)}),
            lambda: ptd.update({"x": torch.zeros(N)}),
            lambda: ptd.__iadd__(1),
            lambda: ptd.zero_(),
            lambda: ptd.apply_(lambda x: x),
            lambda: ptd.del_("obs"),
            lambda: ptd.rename_key_("obs", "o"),
            lambda: ptd[3].set_("action", 1),
            lambda: ptd.set(("next", "new"), torch.zeros(N)),
            lambda: ptd.set(("brand", "new"), torch.zeros(N)),
        ]
        for attempt in attempts:
            with pytest.raises(PermissionError, match="read-only"):
                attempt()
        assert_same(ptd, td)
    assert file_digest(path) == before


def test_delete_rename_lock(saved):
    path, _ = saved
    with PersistentTensorDict(path, mode="r+") as ptd:
        del ptd["half"]
        ptd.rename_key_("obs", "observation")
        assert "half" not in ptd and "observation" in ptd and ("next", "deep", "x") in ptd
        assert ("next", "nope") not in ptd
        ptd.lock_()
        with pytest.raises(RuntimeError, match="locked"):
            ptd.set("z", torch.zeros(N))
        with pytest.raises(RuntimeError, match="locked"):
            ptd.get("next").set("z", torch.zeros(N))
        ptd.set("action", torch.ones(N, dtype=torch.long))  # in place is fine
        ptd.unlock_()
    with PersistentTensorDict(path) as ptd:
        assert "observation" in ptd.keys() and "half" not in ptd.keys()
        assert ptd["action"].tolist() == [1] * N


# ---------------------------------------------------------------------- generic ops
def test_generic_ops_match_in_memory(saved):
    path, td = saved
    num = td.exclude("env", "tags")
    with PersistentTensorDict.from_h5(path) as ptd:
        pnum = ptd.exclude("env", "tags")
        assert type(pnum) is TensorDict
        assert_same(pnum, num)
        assert_same(ptd.select("obs", ("next", "reward")), td.select("obs", ("next", "reward")))
        assert type(ptd.select("next").get("next")) is TensorDict
        assert_same(ptd.exclude(("next", "deep")), td.exclude(("next", "deep")))
        assert_same(pnum.apply(lambda x: x * 2), num.apply(lambda x: x * 2))
        fnum = ptd.exclude("env", "tags", "done")
        fref = num.exclude("done")
        assert_same(ptd.exclude("env", "tags", "done").apply(lambda x: x * 2),
                    fref.apply(lambda x: x * 2))
        sub = ptd.select("obs", "next")
        assert_same(sub.sum(dim=0), td.select("obs", "next").sum(dim=0))
        assert_same(ptd.select("obs").mean(), td.select("obs").mean())
        clone = ptd.clone()
        assert type(clone) is TensorDict
        assert_same(clone, td)
        moved = ptd.to("cpu")
        assert type(moved) is TensorDict
        assert_same(moved, td)
        assert_same(ptd.select("obs") + 1, td.select("obs") + 1)
        assert (ptd.select("action") == td.select("action")).all()
        assert_same(ptd.reshape(4, 5), td.reshape(4, 5))
        assert_same(ptd[2:6].unsqueeze(0), td[2:6].unsqueeze(0))
        parts, ref_parts = ptd.split(7), td.split(7)
        assert len(parts) == len(ref_parts)
        for p_, r_ in zip(parts, ref_parts):
            assert_same(p_, r_)
        assert_same(ptd[3:5].unbind(0)[1], td[3:5].unbind(0)[1])
        assert ptd.is_empty() is False
        assert fnum.allclose(fref)
        assert ptd.bytes() == sum(v.numel() * v.element_size() for v in td.values(True, True)
                                  if isinstance(v, torch.Tensor))
        assert "obs" in repr(ptd) and "lazy" in repr(ptd)


def test_torch_stack_and_cat(saved, tmp_path):
    path, td = saved
    other = td.clone()
    other.apply_(lambda x: x + 1 if x.dtype is not torch.bool else x)
    path2 = str(tmp_path / "other.h5")
    PersistentTensorDict.from_dict(other, path2).close()
    with PersistentTensorDict.from_h5(path) as a, PersistentTensorDict.from_h5(path2) as b:
        stacked = torch.stack([a, b])
        assert type(stacked) is TensorDict
        assert_same(stacked, torch.stack([td, other]))
        assert_same(torch.stack([a[:4], b[4:8]], 1), torch.stack([td[:4], other[4:8]], 1))
        assert_same(torch.cat([a[:3], b[5:7]]), torch.cat([td[:3], other[5:7]]))


# ---------------------------------------------------------------------- pickling
def test_pickle_reopens_file(saved):
    path, td = saved
    ptd = PersistentTensorDict.from_h5(path)
    view = ptd[torch.tensor([4, 1, 1])]
    nested = ptd[2:5].get("next")
    blobs = [pickle.dumps(x) for x in (ptd, view, nested)]
    assert all(len(b) < 4096 for b in blobs)  # no data copied
    ptd.close()
    p2, v2, n2 = (pickle.loads(b) for b in blobs)
    try:
        assert isinstance(v2, PersistentTensorDict)
        assert_same(p2, td)
        assert_same(v2, td[torch.tensor([4, 1, 1])])
        assert_same(n2, td[2:5].get("next"))
        assert p2.mode == "r"
    finally:
        for x in (p2, v2, n2):
            x.close()


def test_pickle_writable_reopens_without_truncating(path):
    ptd = PersistentTensorDict(path, mode="w", batch_size=[2])
    ptd.set("a", torch.ones(2))
    blob = pickle.dumps(ptd)
    ptd.close()
    again = pickle.loads(blob)
    assert again.mode == "r+"
    assert again["a"].tolist() == [1.0, 1.0]
    again.set("b", torch.zeros(2))
    again.close()


# ---------------------------------------------------------------------- misc
def test_non_tensor_entries(path):
    td = TensorDict({"x": torch.zeros(4), "name": "cart", "info": ["a", "bb", "c", "dd"]}, [4])
    td.set_non_tensor("cfg", {"k": [1, 2]})
    td.set("objs", NonTensorStack([{"i": 0}, {"i": 1}, None, [3]]))
    with PersistentTensorDict.from_dict(td, path) as ptd:
        assert ptd.get("name").batch_size == torch.Size([4])
        assert ptd[1:3].get("name").batch_size == torch.Size([2])
        assert ptd[1:3]["name"] == "cart"
        assert ptd["cfg"] == {"k": [1, 2]}
        assert ptd[torch.tensor([3, 0])]["info"] == ["dd", "a"]
        assert ptd[2]["info"] == "c"
        assert ptd[torch.tensor([1, 3])]["objs"] == [{"i": 1}, [3]]
        ptd[0] = TensorDict({"info": "z", "objs": NonTensorData({"j": 5}), "name": "cart"}, [])
        with pytest.raises(ValueError, match="shares"):
            ptd[0] = TensorDict({"name": "other"}, [])
        with pytest.raises(TypeError, match="JSON"):
            ptd.set_non_tensor("bad", object())
    with PersistentTensorDict(path) as ptd:
        assert ptd["info"] == ["z", "bb", "c", "dd"]
        assert ptd["objs"][0] == {"j": 5}
        assert_same(ptd.exclude("objs", "info"), td.exclude("objs", "info"))


def test_constructor_errors_and_group(path, saved):
    path_, td = saved
    with pytest.raises(ValueError, match="mode"):
        PersistentTensorDict(path_, mode="rw")
    with pytest.raises(ValueError, match="filename"):
        PersistentTensorDict()
    with pytest.raises(ValueError, match="does not fit"):
        PersistentTensorDict(path_, batch_size=[N + 1])
    with h5py.File(path_, "r") as f:
        sub = PersistentTensorDict(group=f["next"])
        assert sub.batch_size == torch.Size([N])
        assert torch.equal(sub["reward"], td["next", "reward"])
        sub.close()  # not ours: the file stays open
        assert f.id.valid
    with PersistentTensorDict(path_, group="next") as sub:
        assert torch.equal(sub["deep", "x"], td["next", "deep", "x"])


def test_closed_file(saved):
    path, _ = saved
    ptd = PersistentTensorDict.from_h5(path)
    view = ptd[1:3]
    ptd.close()
    with pytest.raises(RuntimeError, match="closed"):
        view["obs"]
    assert "closed" in repr(ptd)


def test_scalar_batch(path):
    with PersistentTensorDict.from_dict(TensorDict({"a": torch.tensor(3.0), "b": torch.ones(2)}, []), path) as ptd:
        assert ptd.batch_size == torch.Size([])
        assert ptd["a"].item() == 3.0
        with pytest.raises(IndexError):
            ptd[0]
        ptd["a"] = torch.tensor(4.0)
        ptd.update_({"b": torch.tensor([5.0, 6.0])})
    with PersistentTensorDict(path) as ptd:
        assert ptd["a"].item() == 4.0 and ptd["b"].tolist() == [5.0, 6.0]


def test_missing_h5py_message(monkeypatch, path):
    monkeypatch.setitem(sys.modules, "h5py", None)
    msg = r"PersistentTensorDict needs h5py: pip install 'steersman\[h5\]'"
    with pytest.raises(ImportError, match=msg):
        PersistentTensorDict(path)
    with pytest.raises(ImportError, match=msg):
        PersistentTensorDict.from_dict({"a": torch.zeros(2)}, path)
    with pytest.raises(ImportError, match=msg):
        to_h5(TensorDict({}, []), path)


def test_import_and_doctests_without_h5py():
    """Without the optional h5py (simulated in one fresh interpreter) the module imports,
    using the class raises an ImportError that names the extra, and the module's doctests
    still pass (the class example, which opens an HDF5 file, is not collected)."""
    code = (
        "import sys, doctest\n"
        "sys.modules['h5py'] = None  # import h5py now raises ImportError\n"
        "import steersman.tensordict, steersman.tensordict.persistent as m\n"
        "from steersman.tensordict.persistent import PersistentTensorDict\n"
        "try:\n    PersistentTensorDict('x.h5')\nexcept ImportError as e:\n    print(e)\n"
        "r = doctest.testmod(m)\n"
        "print(r.failed, r.attempted)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert "pip install 'steersman[h5]'" in out.stdout
    failed, _attempted = map(int, out.stdout.split()[-2:])
    assert failed == 0, out.stdout
