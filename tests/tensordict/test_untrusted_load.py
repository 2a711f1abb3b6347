"""A saved TensorDict folder is untrusted input: loading it stays inside the folder, checks
what it declares against what is on disk before allocating, and fails with one typed
error (``LoadError``) that names the file and the field.

Each attack is a folder written by ``save``/``memmap`` and then edited the way an attacker
(or a careless copy) would: ``meta.json`` pointing elsewhere by a relative or absolute
``dir``/``file``, symlinks to files and folders outside, shapes and batch sizes that do not
match, counts the files cannot justify, broken JSON. The hypothesis test mutates a valid
``meta.json`` at random.
"""

from __future__ import annotations

import copy
import json
import os
import re
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import steersman
from steersman.tensordict import LoadError, NonTensorStack, TensorDict, lazy_stack, load
from steersman.tensordict import io as td_io

LOADERS = {
    "load": lambda p: load(p),
    "load_mmap": lambda p: load(p, mmap=True),
    "TensorDict.load": lambda p: TensorDict.load(p),
    "TensorDict.load_memmap": lambda p: TensorDict.load_memmap(p),
}


def sample_td() -> TensorDict:
    return TensorDict({
        "obs": torch.arange(6.0).reshape(3, 2),
        "n": {"x": torch.arange(3, dtype=torch.int64)},
    }, [3])


def saved(tmp_path: Path, td: Any = None, name: str = "saved") -> Path:
    path = tmp_path / name
    (td if td is not None else sample_td()).save(path)
    return path


def edit_meta(path: Path, fn: Any) -> None:
    meta = json.loads((path / "meta.json").read_text())
    fn(meta)
    (path / "meta.json").write_text(json.dumps(meta))


def victim(tmp_path: Path) -> Path:
    """A folder outside the saved one, laid out like the nested entry ``n`` (``x.memmap``)."""
    v = tmp_path / "victim"
    v.mkdir()
    (v / "x.memmap").write_bytes(torch.full((3,), 7, dtype=torch.int64).numpy().tobytes())
    return v


def victim_unchanged(v: Path) -> bool:
    return (v / "x.memmap").read_bytes() == torch.full((3,), 7, dtype=torch.int64).numpy().tobytes()


def test_load_error_is_exported_and_a_value_error():
    assert steersman.LoadError is LoadError
    assert issubclass(LoadError, ValueError)


# ----------------------------------------------------------------------------- paths
@pytest.mark.parametrize("loader", list(LOADERS))
@pytest.mark.parametrize("how", ["relative", "absolute"])
def test_nested_dir_outside_the_folder_is_refused(tmp_path, loader, how):
    path = saved(tmp_path)
    v = victim(tmp_path)
    target = "../victim" if how == "relative" else str(v)
    edit_meta(path, lambda m: m["entries"]["n"].__setitem__("dir", target))
    with pytest.raises(LoadError, match=r"'n'.*'dir'") as err:
        LOADERS[loader](path)
    assert err.value.file == str(path / "meta.json") and err.value.field == "n.dir"
    assert victim_unchanged(v)


@pytest.mark.parametrize("loader", list(LOADERS))
@pytest.mark.parametrize("target", ["../victim/x.memmap", "/etc/passwd", "sub/x.memmap", ".hidden"])
def test_tensor_file_outside_the_folder_is_refused(tmp_path, loader, target):
    path = saved(tmp_path)
    victim(tmp_path)
    edit_meta(path, lambda m: m["entries"]["n"]["meta"]["entries"]["x"].__setitem__("file", target))
    with pytest.raises(LoadError, match=r"'n\.x'.*'file'"):
        LOADERS[loader](path)


@pytest.mark.parametrize("loader", list(LOADERS))
def test_symlinked_tensor_file_pointing_outside_is_refused(tmp_path, loader):
    path = saved(tmp_path)
    v = victim(tmp_path)
    os.unlink(path / "n" / "x.memmap")
    os.symlink(v / "x.memmap", path / "n" / "x.memmap")
    with pytest.raises(LoadError, match=r"symlink.*outside") as err:
        LOADERS[loader](path)
    assert err.value.field == "n.x.file"
    assert victim_unchanged(v)


@pytest.mark.parametrize("loader", list(LOADERS))
def test_symlinked_folder_pointing_outside_is_refused(tmp_path, loader):
    path = saved(tmp_path)
    v = victim(tmp_path)
    for f in (path / "n").iterdir():
        f.unlink()
    (path / "n").rmdir()
    os.symlink(v, path / "n")
    with pytest.raises(LoadError, match=r"symlink.*outside") as err:
        LOADERS[loader](path)
    assert err.value.field == "n.dir"


def test_symlinked_meta_json_pointing_outside_is_refused(tmp_path):
    path = saved(tmp_path)
    other = saved(tmp_path, name="other")
    os.unlink(path / "meta.json")
    os.symlink(other / "meta.json", path / "meta.json")
    with pytest.raises(LoadError, match="outside"):
        load(path)


def test_symlinked_lazy_member_folder_pointing_outside_is_refused(tmp_path):
    td = lazy_stack([TensorDict({"a": torch.zeros(2)}, [2]), TensorDict({"a": torch.ones(2)}, [2])])
    path = saved(tmp_path, td)
    outside = saved(tmp_path, TensorDict({"a": torch.full((2,), 5.0)}, [2]), name="outside")
    import shutil

    shutil.rmtree(path / "1")
    os.symlink(outside, path / "1")
    with pytest.raises(LoadError, match="outside"):
        load(path)


def test_a_symlink_that_stays_inside_still_loads(tmp_path):
    """Symlinks are resolved, not banned: one to a file inside the folder is fine, and so
    is a saved folder reached through a symlink."""
    path = saved(tmp_path)
    os.rename(path / "obs.memmap", path / "data.bin")
    os.symlink("data.bin", path / "obs.memmap")
    os.symlink(path, tmp_path / "link_to_saved")
    for p in (path, tmp_path / "link_to_saved"):
        out = load(p, mmap=True)
        assert torch.equal(out["obs"], sample_td()["obs"])


def test_an_in_place_write_never_reaches_a_file_outside(tmp_path):
    """What the issue showed: an edited ``dir`` made ``load_memmap`` map a victim's files and an
    in-place op write into them. Now the load fails and the victim is untouched."""
    path = saved(tmp_path)
    v = victim(tmp_path)
    edit_meta(path, lambda m: m["entries"]["n"].__setitem__("dir", "../victim"))
    try:
        td = TensorDict.load_memmap(path)
        td.unlock_()["n", "x"].fill_(0)
    except LoadError:
        pass
    assert victim_unchanged(v)


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize("bs", [[5], [3, 7], [-2], [3.0], ["3"], [True], [2**70], "3", None])
def test_batch_size_that_does_not_fit_the_tensors_is_refused(tmp_path, bs):
    path = saved(tmp_path)
    edit_meta(path, lambda m: m.__setitem__("batch_size", bs))
    with pytest.raises(LoadError, match=r"batch_size|batch size"):
        load(path)


def test_nested_batch_size_must_extend_the_parents(tmp_path):
    path = saved(tmp_path)
    edit_meta(path, lambda m: m["entries"]["n"]["meta"].__setitem__("batch_size", [2]))
    with pytest.raises(LoadError, match=r"'n'.*'batch_size'"):
        load(path)


@pytest.mark.parametrize("names", [["a"], ["a", "b", "c"], [], ["a", "a"], [1, None], "ab", {"a": 1}])
def test_names_of_the_wrong_length_or_type_are_refused(tmp_path, names):
    path = saved(tmp_path, TensorDict({"obs": torch.zeros(3, 2)}, [3, 2], names=["t", "f"]))
    edit_meta(path, lambda m: m.__setitem__("names", names))
    with pytest.raises(LoadError, match="'names'"):
        load(path)


def test_names_round_trip(tmp_path):
    td = TensorDict({"obs": torch.zeros(3, 2)}, [3, 2], names=["t", "f"])
    assert load(saved(tmp_path, td)).names == ["t", "f"]


@pytest.mark.parametrize("shape", [[3, 3], [4, 2], [3], [2, 3], [-3, -2]])
def test_shape_that_does_not_match_the_file_size_is_refused(tmp_path, shape):
    path = saved(tmp_path)
    edit_meta(path, lambda m: m["entries"]["obs"].__setitem__("shape", shape))
    with pytest.raises(LoadError, match="'obs'"):
        load(path, mmap=True)
    assert os.path.getsize(path / "obs.memmap") == 6 * 4  # not grown by the mapping


@pytest.mark.parametrize("dtype", ["float64", "os.system", "qint8", "__class__", 3, ["float32"]])
def test_unknown_or_mismatched_dtype_is_refused(tmp_path, dtype):
    path = saved(tmp_path)
    edit_meta(path, lambda m: m["entries"]["obs"].__setitem__("dtype", dtype))
    with pytest.raises(LoadError, match=r"'obs'.*'(dtype|file)'"):
        load(path)


def test_a_huge_non_tensor_stack_declared_in_a_tiny_file_allocates_nothing(tmp_path):
    """A 200-byte meta.json declaring a stack of 2e8 values used to allocate 1.6 GB."""
    path = tmp_path / "evil"
    path.mkdir()
    meta = {"_type": "TensorDict", "_format": 1, "batch_size": [], "device": None, "names": None,
            "entries": {"s": {"kind": "non_tensor_stack", "data": [], "batch_size": [200_000_000]}}}
    (path / "meta.json").write_text(json.dumps(meta))
    assert os.path.getsize(path / "meta.json") < 260
    tracemalloc.start()
    try:
        with pytest.raises(LoadError, match=r"'s'.*'data'"):
            load(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, peak


def test_non_tensor_stack_round_trips_and_must_nest_as_declared(tmp_path):
    td = TensorDict({"s": NonTensorStack.from_list([["a", "b"], ["c", "d"], ["e", "f"]])}, [3])
    path = saved(tmp_path, td)
    assert load(path)["s"] == [["a", "b"], ["c", "d"], ["e", "f"]]
    edit_meta(path, lambda m: m["entries"]["s"].__setitem__("batch_size", [3, 3]))
    with pytest.raises(LoadError, match=r"'s'.*'data'"):
        load(path)


def test_deeply_nested_containers_fail_cleanly(tmp_path):
    """5000 nested containers in meta.json: a LoadError, not a RecursionError."""
    path = tmp_path / "deep"
    path.mkdir()
    level = '{"_type": "TensorDict", "_format": 1, "batch_size": [], "entries": {"a": {"kind": "container", "dir": "a", "meta": '
    leaf = '{"_type": "TensorDict", "_format": 1, "batch_size": [], "entries": {}}'
    (path / "meta.json").write_text(level * 5000 + leaf + "}}}" * 5000)
    with pytest.raises(LoadError):
        load(path)
    # deep, but within what the JSON parser takes: the depth limit names the entry
    inner = {"_type": "TensorDict", "_format": 1, "batch_size": [], "entries": {}}
    for _ in range(150):
        inner = {"_type": "TensorDict", "_format": 1, "batch_size": [],
                 "entries": {"a": {"kind": "container", "dir": "a", "meta": inner}}}
    (path / "meta.json").write_text(json.dumps(inner))
    os.makedirs(path / "/".join(["a"] * 150))
    with pytest.raises(LoadError, match="nested deeper"):
        load(path)


@pytest.mark.parametrize("content", [
    b"\xff\xfe\xfa not utf-8 \x80",
    b"{not json",
    b"[1, 2, 3]",
    b'{"_type": "TensorDict", "_format": 1}',
    b'{"_type": "TensorDict", "_format": 1, "batch_size": [], "entries": []}',
    b'{"_type": "TensorDict", "_format": 1, "batch_size": [], "entries": {"a": 3}}',
    b'{"_type": "TensorDict", "_format": 1, "batch_size": [], "entries": {"a": {"kind": "tensor"}}}',
    b'{"_type": "TensorDict", "_format": 1, "batch_size": [], "entries": {"a": {"kind": "container", "dir": "a"}}}',
    b'{"_type": "LazyStackedTensorDict", "_format": 1, "batch_size": [1], "stack_dim": 0, "members": [3]}',
    b'{"_type": "TensorDict", "_format": 1, "batch_size": [], "device": 7, "entries": {}}',
    b'{"_type": "TensorDict", "_format": 1, "batch_size": [], "device": "nonsense", "entries": {}}',
    b"[" * 100_000 + b"]" * 100_000,
])
def test_malformed_meta_json_raises_one_typed_error(tmp_path, content):
    path = tmp_path / "bad"
    (path / "a").mkdir(parents=True)
    (path / "meta.json").write_bytes(content)
    with pytest.raises(LoadError) as err:
        load(path)
    assert err.value.file == str(path / "meta.json")
    assert "\n" not in str(err.value)


def test_missing_meta_json_is_still_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="meta.json"):
        load(tmp_path)


def test_missing_tensor_file_names_the_entry(tmp_path):
    path = saved(tmp_path)
    os.unlink(path / "n" / "x.memmap")
    with pytest.raises(LoadError, match=r"'n\.x'.*'file'.*missing"):
        load(path)


# ----------------------------------------------------------------------------- fuzzing
def rich_td() -> TensorDict:
    td = TensorDict({
        "obs": torch.arange(12.0).reshape(3, 4),
        "done": torch.zeros(3, 1, dtype=torch.bool),
        "next": {"obs": torch.ones(3, 4), "deep": {"r": torch.arange(3, dtype=torch.int16)}},
        "s": NonTensorStack.from_list(["a", "b", "c"]),
        "note": "hello",
    }, [3], names=["t"])
    td["lazy"] = lazy_stack([TensorDict({"a": torch.zeros(2)}, []), TensorDict({"a": torch.ones(2)}, []),
                             TensorDict({"a": torch.ones(2)}, [])])
    return td


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if len(prefix) > 40:  # (values drawn deeper than the saved structure are not walked)
        return out
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


def _deep(n: int) -> str:
    """A marker that :func:`_dumps` turns into JSON lists nested ``n`` deep (deeper than
    ``json.dumps`` writes)."""
    return f"__DEEP_{n}__"


def _dumps(meta: Any) -> str:
    text = json.dumps(meta)
    for n in set(re.findall(r'"__DEEP_(\d+)__"', text)):
        text = text.replace(f'"__DEEP_{n}__"', "[" * int(n) + "0" + "]" * int(n))
    return text


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
SPECIAL = st.sampled_from([
    [], {}, [-1], [3], [3, 4], [200_000_000], [3, 200_000_000], [0, 2**61], [2**62], "../victim", "/tmp",
    "..", ".", "meta.json", "a/b", "float32", "int64", "bool", "tensor", "container", "non_tensor_stack",
    "non_tensor", "TensorDict", "LazyStackedTensorDict", 1, 0, -1, 2**63, ["a", "b"], [None], "cpu", "cuda",
])
VALUES = JSON | SPECIAL | st.integers(200, 3000).map(_deep)
BASE = rich_td()


def _mutate(meta: dict, data: Any) -> dict:
    meta = copy.deepcopy(meta)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        paths = _paths(meta)[1:]  # (not the root itself)
        path = data.draw(st.sampled_from(paths), label="path")
        parent = meta
        for k in path[:-1]:
            parent = parent[k]
        op = data.draw(st.sampled_from(["drop", "replace", "wrap"]), label="op")
        last = path[-1]
        if op == "drop":
            del parent[last]
        elif op == "replace":
            parent[last] = copy.deepcopy(data.draw(VALUES, label="value"))  # SPECIAL holds shared lists
        else:
            parent[last] = [parent[last]] if data.draw(st.booleans()) else {"x": parent[last]}
    return meta


@pytest.fixture(scope="module")
def fuzz_folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "saved"
    BASE.save(path)
    victim(path.parent)
    return path, json.loads((path / "meta.json").read_text())


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                    HealthCheck.too_slow])
@given(data=st.data(), mmap=st.booleans())
def test_fuzzed_meta_json_loads_or_raises_load_error_without_big_allocations(fuzz_folder, data, mmap, monkeypatch):
    fuzz_folder, meta = fuzz_folder  # (each example writes its own meta.json over the saved one)
    bad = _mutate(meta, data)
    text = _dumps(bad)
    (fuzz_folder / "meta.json").write_text(text)
    requested = []
    real_open = td_io._open_sized

    def counting_open(path, dtype, shape, numel, mmap_):
        requested.append(numel * dtype.itemsize)
        return real_open(path, dtype, shape, numel, mmap_)

    monkeypatch.setattr(td_io, "_open_sized", counting_open)
    budget = _folder_bytes(fuzz_folder)
    tracemalloc.start()
    try:
        try:
            out = load(fuzz_folder, mmap=mmap)
        except LoadError as err:
            assert err.file == str(fuzz_folder / "meta.json") and "\n" not in str(err)
            event(f"LoadError at {(err.field or '').rsplit('.', 1)[-1]}")
            out = None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Python and NumPy memory (tracemalloc sees both) stays within a few times what was read
    # (the JSON is parsed into objects, ~50x its size at worst), and torch is only asked for
    # what the tensor files hold
    assert peak < 2_000_000 + 100 * len(text), (peak, len(text))
    assert sum(requested) <= budget
    if out is not None:
        event("loaded")
    if out is not None:  # what loaded is consistent: every leaf starts with its batch size
        for key in out.keys(True, True):
            leaf = out.get(key)
            if isinstance(leaf, torch.Tensor):
                assert leaf.shape[: out.batch_dims] == out.batch_size
        assert (fuzz_folder.parent / "victim" / "x.memmap").exists() and victim_unchanged(fuzz_folder.parent / "victim")


# ----------------------------------------------------------------------------- HDF5 files
@pytest.fixture
def h5(tmp_path):
    h5py = pytest.importorskip("h5py")
    from steersman.tensordict.persistent import PersistentTensorDict

    outside = tmp_path / "outside.h5"
    with h5py.File(outside, "w") as f:
        f["secret"] = torch.arange(3.0).numpy()
    (tmp_path / "raw.bin").write_bytes(torch.arange(3.0, dtype=torch.float64).numpy().tobytes())
    path = tmp_path / "data.h5"
    PersistentTensorDict.from_dict(TensorDict({"obs": torch.zeros(3, 2), "n": {"x": torch.ones(3)}}, [3]),
                                   path).close()
    return h5py, PersistentTensorDict, path, outside


def _h5_edit(h5py, path, fn):
    with h5py.File(path, "r+") as f:
        fn(f)


@pytest.mark.parametrize("attack", ["external_link", "external_storage", "virtual", "hard_loop", "soft_loop"])
def test_h5_entries_that_read_other_files_or_loop_are_refused(h5, attack):
    h5py, PTD, path, outside = h5
    raw = str(path.parent / "raw.bin")

    def edit(f):
        if attack == "external_link":
            f["stolen"] = h5py.ExternalLink(str(outside), "/secret")
        elif attack == "external_storage":
            f.create_dataset("stolen", shape=(3,), dtype="f8", external=[(raw, 0, 24)])
        elif attack == "virtual":
            layout = h5py.VirtualLayout(shape=(3,), dtype="f8")
            layout[:] = h5py.VirtualSource(str(outside), "secret", shape=(3,))
            f.create_virtual_dataset("stolen", layout)
        elif attack == "hard_loop":
            f["n"]["loop"] = f["n"]
        else:
            f["n"]["loop"] = h5py.SoftLink("/n")

    _h5_edit(h5py, path, edit)
    for mode in ("r", "r+"):
        with pytest.raises(LoadError, match="'(stolen|n/loop|n)'") as err:
            PTD.from_h5(path, mode=mode)
        assert err.value.file == str(path)


def test_h5_stored_batch_size_must_fit_the_datasets(h5):
    h5py, PTD, path, _ = h5
    for bad, match in (("[5]", "does not start with the stored batch size"), ("[-2]", "not a batch size"),
                       ("{]", "not a batch size")):
        _h5_edit(h5py, path, lambda f, bad=bad: f.attrs.__setitem__("steersman.batch_size", bad))
        with pytest.raises(LoadError, match=match):
            PTD.from_h5(path)
    # an explicit batch size is still checked against the datasets (as before)
    with pytest.raises(ValueError, match="does not fit"):
        PTD(filename=path, batch_size=[4])


def test_h5_soft_link_to_a_dataset_in_the_file_still_opens(h5):
    h5py, PTD, path, _ = h5
    _h5_edit(h5py, path, lambda f: f.__setitem__("alias", h5py.SoftLink("/obs")))
    with PTD.from_h5(path) as td:
        assert td.batch_size == (3,) and torch.equal(td["alias"], torch.zeros(3, 2))
