"""A replay-buffer checkpoint folder is untrusted input: ``loads`` reads nothing outside it
(``LATEST.json``, symlinked checkpoint/component/tensor folders and files, ``dir`` entries of
the tensor metadata) and raises :class:`CheckpointError` (a ``LoadError``) for every malformed
input, leaving the buffer as it was. The hypothesis test mutates every JSON file of real
checkpoints at random.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from steersman.data.replay_buffers import (
    CheckpointError,
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    PrioritizedSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    TensorDictMaxValueWriter,
    TensorDictReplayBuffer,
)
from steersman.tensordict import LoadError, TensorDict


def transitions(n: int, seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    return TensorDict({"obs": torch.randn(n, 4, generator=g), "action": torch.randint(3, (n, 1), generator=g),
                       "next": {"obs": torch.randn(n, 4, generator=g), "reward": torch.randn(n, 1, generator=g)}},
                      [n])


def td_buffer(scratch: Path) -> TensorDictReplayBuffer:
    return TensorDictReplayBuffer(storage=LazyMemmapStorage(16, scratch_dir=scratch),
                                  sampler=PrioritizedSampler(16, 0.6, 0.4), batch_size=4)


def max_value_buffer() -> TensorDictReplayBuffer:
    return TensorDictReplayBuffer(storage=LazyTensorStorage(8), sampler=SamplerWithoutReplacement(),
                                  writer=TensorDictMaxValueWriter(rank_key=("next", "reward")), batch_size=2)


def list_buffer() -> ReplayBuffer:
    return ReplayBuffer(storage=ListStorage(10), sampler=SamplerWithoutReplacement(), batch_size=2)


def fill(rb: Any, kind: str, seed: int = 0) -> Any:
    if kind == "list":
        for item in (torch.arange(3), {"a": 1, "b": [1, 2]}, "text", TensorDict({"x": torch.ones(2)}, []), 7):
            rb.add(item)
        rb.sample()  # the sampler now holds a sample list
    else:
        rb.extend(transitions(10, seed))
        rb.sample()
    return rb


def make(kind: str, tmp: Path) -> Any:
    if kind == "td":
        return td_buffer(tmp)
    return max_value_buffer() if kind == "max_value" else list_buffer()


def snapshot(rb: Any) -> dict:
    st_ = rb.storage
    data = list(st_._storage) if isinstance(st_, ListStorage) else (
        None if st_._storage is None else st_._storage.to_tensordict().clone())
    return {"len": len(rb), "count": rb.write_count, "cursor": rb.writer._cursor, "data": data,
            "last": st_._last_cursor}


def assert_unchanged(rb: Any, snap: dict) -> None:
    now = snapshot(rb)
    for k in ("len", "count", "cursor", "last"):
        assert now[k] == snap[k], k
    a, b = now["data"], snap["data"]
    if isinstance(b, list):
        assert len(a) == len(b) and all(x is y for x, y in zip(a, b))
    elif b is not None:
        for key in b.keys(True, True):
            assert torch.equal(a[key], b[key]), key


def current(ckpt: Path) -> Path:
    return ckpt / json.loads((ckpt / "LATEST.json").read_text())["current"]


@pytest.fixture
def ckpt(tmp_path):
    src = fill(td_buffer(tmp_path / "scratch_src"), "td")
    src.dumps(tmp_path / "ckpt")
    return tmp_path / "ckpt"


@pytest.fixture
def dst(tmp_path):
    return fill(td_buffer(tmp_path / "scratch_dst"), "td", seed=1)


def other_checkpoint(tmp_path: Path) -> Path:
    """A valid checkpoint outside ``ckpt`` (different data)."""
    other = fill(td_buffer(tmp_path / "scratch_other"), "td", seed=2)
    other.dumps(tmp_path / "other")
    return tmp_path / "other"


def expect_refused(dst: Any, path: Path, match: str | None = None) -> CheckpointError:
    snap = snapshot(dst)
    with pytest.raises(CheckpointError, match=match) as err:
        dst.loads(path)
    assert isinstance(err.value, LoadError) and isinstance(err.value, ValueError)
    assert "\n" not in str(err.value)
    assert_unchanged(dst, snap)
    assert dst.sample()["obs"].shape == (4, 4)  # still usable
    return err.value


def test_checkpoint_error_is_a_load_error():
    assert issubclass(CheckpointError, LoadError)


# ----------------------------------------------------------------------------- paths
@pytest.mark.parametrize("name", ["../other/ckpt-000001", "/tmp/ckpt-000001", "ckpt-000001/../../x"])
def test_pointer_outside_the_folder_is_refused(tmp_path, ckpt, dst, name):
    other_checkpoint(tmp_path)
    (ckpt / "LATEST.json").write_text(json.dumps({"format": "steersman.replay_buffer", "version": 1,
                                                  "current": name}))
    expect_refused(dst, ckpt, "invalid checkpoint name")


def test_symlinked_pointer_pointing_outside_is_refused(tmp_path, ckpt, dst):
    other = other_checkpoint(tmp_path)
    os.unlink(ckpt / "LATEST.json")
    os.symlink(other / "LATEST.json", ckpt / "LATEST.json")
    expect_refused(dst, ckpt, "outside")


@pytest.mark.parametrize("part", ["", "storage", "storage/tensors", "storage/tensors/obs.memmap",
                                  "storage/tensors/next", "sampler", "sampler/meta.json", "buffer.json"])
def test_symlink_to_a_copy_outside_is_refused(tmp_path, ckpt, dst, part):
    """The checkpoint folder, a component, its tensor folder or one file replaced by a
    symlink to the same thing in another (valid) checkpoint outside."""
    other = current(other_checkpoint(tmp_path))
    here = current(ckpt)
    target, link = other / part, here / part
    if part == "":  # the whole ckpt-NNNNNN folder
        shutil.rmtree(here)
        os.symlink(other, here)
    else:
        shutil.rmtree(link) if link.is_dir() else link.unlink()
        os.symlink(target, link)
    err = expect_refused(dst, ckpt, "outside")
    assert err.file is not None


def test_tensor_metadata_dir_outside_is_refused(tmp_path, ckpt, dst):
    other = current(other_checkpoint(tmp_path))
    meta_f = current(ckpt) / "storage" / "tensors" / "meta.json"
    meta = json.loads(meta_f.read_text())
    meta["entries"]["next"]["dir"] = os.path.relpath(other / "storage" / "tensors" / "next", meta_f.parent)
    meta_f.write_text(json.dumps(meta))
    err = expect_refused(dst, ckpt, r"'next'.*'dir'")
    assert err.field == "next.dir" and isinstance(err.__cause__, LoadError)
    meta["entries"]["next"]["dir"] = str(other / "storage" / "tensors" / "next")
    meta_f.write_text(json.dumps(meta))
    expect_refused(dst, ckpt, r"'next'.*'dir'")


def test_a_symlink_inside_the_checkpoint_still_loads(tmp_path, ckpt, dst):
    """Symlinks are resolved, not banned: a tensor file linked to another file inside works."""
    tensors = current(ckpt) / "storage" / "tensors"
    os.rename(tensors / "obs.memmap", tensors / "obs.bin")
    os.symlink("obs.bin", tensors / "obs.memmap")
    dst.loads(ckpt)
    assert len(dst) == 10


# ----------------------------------------------------------------------------- malformed
DEEP = "[" * 50_000 + "]" * 50_000


@pytest.mark.parametrize("file", ["LATEST.json", "buffer.json", "storage/meta.json", "sampler/meta.json",
                                  "writer/meta.json", "storage/tensors/meta.json"])
@pytest.mark.parametrize("content", [b"\xff\xfe\x80 not utf-8", b"{not json", DEEP.encode(), b"[]", b"null"])
def test_malformed_json_raises_checkpoint_error(ckpt, dst, file, content):
    path = ckpt / file if file == "LATEST.json" else current(ckpt) / file
    path.write_bytes(content)
    expect_refused(dst, ckpt)


@pytest.mark.parametrize("file, key, value", [
    ("buffer.json", "storage", ["LazyMemmapStorage"]),
    ("storage/meta.json", "has_tensors", "yes"),
    ("storage/meta.json", "is_tensor", [1]),
    ("storage/meta.json", "last_cursor", [3]),
    ("storage/meta.json", "last_cursor", 10**6),
    ("storage/meta.json", "filled_rows", 1e300),
    ("storage/meta.json", "ndim", None),
    ("sampler/meta.json", "alpha", float("nan")),
    ("sampler/meta.json", "max_priority", -1.0),
    ("sampler/meta.json", "max_capacity", True),
    ("writer/meta.json", "cursor", "3"),
    ("writer/meta.json", "write_count", -1),
    ("storage/tensors/meta.json", "batch_size", [-2]),
    ("storage/tensors/meta.json", "entries", []),
])
def test_wrong_field_types_raise_checkpoint_error(ckpt, dst, file, key, value):
    path = current(ckpt) / file
    meta = json.loads(path.read_text())
    meta[key] = value
    path.write_text(json.dumps(meta))
    expect_refused(dst, ckpt)


def test_list_storage_item_that_is_not_a_container_raises_checkpoint_error(tmp_path):
    """An item declared ``tensor`` whose tensor folder holds a bare tensor used to raise
    AttributeError."""
    src = fill(list_buffer(), "list")
    src.dumps(tmp_path / "ckpt")
    tensors = current(tmp_path / "ckpt") / "storage" / "tensors"
    meta = json.loads((tensors / "meta.json").read_text())
    entry = meta["entries"]["0"]["meta"]["entries"]["t"]
    os.rename(tensors / "0" / "t.memmap", tensors / "0.memmap")
    meta["entries"]["0"] = entry | {"file": "0.memmap"}
    (tensors / "meta.json").write_text(json.dumps(meta))
    dst = fill(list_buffer(), "list")
    snap = snapshot(dst)
    with pytest.raises(CheckpointError, match="item 0"):
        dst.loads(tmp_path / "ckpt")
    assert_unchanged(dst, snap)


# ----------------------------------------------------------------------------- fuzzing
def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if len(prefix) > 40:
        return out
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


def _dumps(obj: Any) -> str:
    text = json.dumps(obj)
    for n in set(re.findall(r'"__DEEP_(\d+)__"', text)):
        text = text.replace(f'"__DEEP_{n}__"', "[" * int(n) + "0" + "]" * int(n))
    return text


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
SPECIAL = st.sampled_from([
    [], {}, [-1], [3], [200_000_000], 0, 1, -1, 15, 16, 2**63, 1e300, "../x", "/tmp", "ckpt-000001",
    "ckpt-000002", "LazyMemmapStorage", "LazyTensorStorage", "ListStorage", "PrioritizedSampler",
    "SamplerWithoutReplacement", "TensorDictRoundRobinWriter", "TensorDictMaxValueWriter", "tensor", "td",
    "json", "container", "float32", "int64", True, False, None,
])
VALUES = JSON | SPECIAL | st.integers(200, 3000).map(lambda n: f"__DEEP_{n}__")
KINDS = ("td", "max_value", "list")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """One checkpoint per buffer kind, with the JSON files it holds."""
    base = tmp_path_factory.mktemp("rb_fuzz")
    out = {}
    for kind in KINDS:
        src = fill(make(kind, base / f"scratch_{kind}"), kind)
        src.dumps(base / kind)
        files = sorted(p.relative_to(base / kind) for p in (base / kind).rglob("*.json"))
        out[kind] = (base / kind, files)
    return base, out


@pytest.fixture(scope="module")
def targets(pristine):
    base, _ = pristine
    return {kind: fill(make(kind, base / f"scratch_dst_{kind}"), kind, seed=3) for kind in KINDS}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                    HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_checkpoint_json_loads_or_raises_checkpoint_error(pristine, targets, data, tmp_path_factory):
    base, by_kind = pristine
    kind = data.draw(st.sampled_from(KINDS), label="kind")
    src, files = by_kind[kind]
    rel = data.draw(st.sampled_from(files), label="file")
    work = tmp_path_factory.mktemp("rb_case") / "ckpt"
    shutil.copytree(src, work, symlinks=True)
    meta = json.loads((work / rel).read_text())
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        paths = _paths(meta)
        path = data.draw(st.sampled_from(paths), label="path")
        if not path:
            meta = copy.deepcopy(data.draw(VALUES, label="whole file"))  # SPECIAL holds shared lists
            continue
        parent = meta
        for k in path[:-1]:
            parent = parent[k]
        op = data.draw(st.sampled_from(["drop", "replace", "wrap"]), label="op")
        if op == "drop":
            del parent[path[-1]]
        elif op == "replace":
            parent[path[-1]] = copy.deepcopy(data.draw(VALUES, label="value"))
        else:
            parent[path[-1]] = [copy.deepcopy(parent[path[-1]])]
    text = _dumps(meta)
    (work / rel).write_text(text)
    rb = targets[kind]
    snap = snapshot(rb)
    tracemalloc.start()
    try:
        try:
            rb.loads(work)
            event("loaded")
        except CheckpointError as err:
            event(f"CheckpointError in {rel}")
            assert "\n" not in str(err)
            assert_unchanged(rb, snap)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        shutil.rmtree(work.parent, ignore_errors=True)
    assert peak < 5_000_000 + 100 * len(text), (peak, len(text))
    # whatever happened, the buffer still works
    if len(rb):
        rb.sample()
