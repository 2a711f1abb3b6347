"""Checkpoint API: round trips per format, partial restore, strictness, adapters, rotation
with best-k, RNG state, device remap, tampered files, and atomic writes under SIGKILL."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import zipfile

import numpy as np
import pytest
import torch

from steersman.checkpoint import (
    Checkpoint,
    CheckpointAdapter,
    CheckpointError,
    CheckpointLoadResult,
    CheckpointOptions,
    CheckpointRotation,
    DumpLoadCheckpointAdapter,
    GlobalRNGState,
    JSONCheckpointAdapter,
    StateDictCheckpointAdapter,
)
from steersman.data import LazyTensorStorage, TensorDictReplayBuffer
from steersman.tensordict import TensorDict
from steersman.tensordict.files import LoadError


def _pair():
    torch.manual_seed(0)
    a = torch.nn.Linear(3, 2)
    torch.manual_seed(1)
    b = torch.nn.Linear(3, 2)
    return a, b


@pytest.mark.parametrize("fmt", ["directory", "archive"])
def test_round_trip_of_module_optimizer_json_and_buffer(tmp_path, fmt):
    src, dst = _pair()
    opt = torch.optim.Adam(src.parameters())
    src(torch.ones(1, 3)).sum().backward()
    opt.step()
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(TensorDict({"x": torch.arange(4.0)}, [4]))
    ckpt = Checkpoint(format=fmt, policy=src, optim=opt, step=7, config={"lr": 0.1}, buffer=rb)
    assert isinstance(ckpt._components["buffer"][1], DumpLoadCheckpointAdapter)
    assert isinstance(ckpt._components["step"][1], JSONCheckpointAdapter)
    path = ckpt.save(tmp_path / "c", metadata={"reward": 1.5})
    assert path.is_dir() == (fmt == "directory") and Checkpoint.is_checkpoint(path)
    dst_opt = torch.optim.Adam(dst.parameters())
    rb2 = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    target = Checkpoint(policy=dst, optim=dst_opt, step=0, config={}, buffer=rb2)
    result = target.load(path)
    assert result.loaded == {"policy", "optim", "step", "config", "buffer"}
    assert result.values == {"step": 7, "config": {"lr": 0.1}}
    assert torch.equal(dst.weight, src.weight) and len(rb2) == 4
    assert dst_opt.state_dict()["state"][0]["step"] == 1
    assert result.manifest["metadata"] == {"reward": 1.5}


def test_partial_restore_and_strictness(tmp_path):
    src, dst = _pair()
    Checkpoint(policy=src, step=1).save(tmp_path / "c")
    before = dst.weight.detach().clone()
    result = Checkpoint(policy=dst, step=0).load(tmp_path / "c", components=["step"])
    assert result.loaded == {"step"} and result.unrequested == {"policy"}
    assert torch.equal(dst.weight, before)  # not requested, untouched
    extra = Checkpoint(policy=dst, other=torch.nn.Linear(1, 1))
    with pytest.raises(CheckpointError, match="missing components \\['other'\\]") as err:
        extra.load(tmp_path / "c")
    assert err.value.result.missing == {"other"}
    with pytest.warns(UserWarning, match="other"):
        assert extra.load(tmp_path / "c", strict="warn").loaded == {"policy"}
    wrong = Checkpoint(policy=torch.nn.Linear(5, 5), strict="ignore")
    result = wrong.load(tmp_path / "c")
    assert "policy" in result.incompatible and not result.loaded
    with pytest.raises(KeyError, match="unknown component"):
        Checkpoint(policy=dst).save(tmp_path / "d", components=["nope"])
    with pytest.raises(ValueError, match="strict='always'"):
        Checkpoint(strict="always")


def test_save_components_default_and_options(tmp_path):
    calls = []

    class Thing:
        def state_dict(self, *args, **kwargs):
            calls.append(("save", args, kwargs))
            return {"v": torch.ones(1)}

        def load_state_dict(self, state, *args, **kwargs):
            calls.append(("load", args, kwargs))

    ckpt = Checkpoint(save_components=["a"], a=Thing(), b=Thing())
    ckpt.register("a", ckpt.components["a"], options=CheckpointOptions(save_kwargs={"x": 1}))
    ckpt.save(tmp_path / "c", component_options={"a": CheckpointOptions(save_kwargs={"y": 2})})
    assert Checkpoint.manifest(tmp_path / "c")["components"].keys() == {"a"}
    ckpt.load(tmp_path / "c", components=["a"],
              component_options={"a": CheckpointOptions(load_args=(3,))})
    assert calls == [("save", (), {"x": 1, "y": 2}), ("load", (3,), {})]


def test_custom_adapter_by_type(tmp_path):
    class Box:
        def __init__(self, v):
            self.v = v

    class BoxAdapter(CheckpointAdapter):
        adapter_id = "box"

        def save(self, component, path, *, args, kwargs):
            path.mkdir(parents=True)
            (path / "v.txt").write_text(str(component.v))

        def load(self, component, path, *, map_location, tensor_load_kwargs, args, kwargs):
            component.v = int((path / "v.txt").read_text())

    with pytest.raises(TypeError, match="'box' \\(Box\\)"):
        Checkpoint(box=Box(1))
    src = Checkpoint().register_adapter(Box, BoxAdapter()).register("box", Box(5))
    src.save(tmp_path / "c")
    dst_box = Box(0)
    Checkpoint().register_adapter(Box, BoxAdapter()).register("box", dst_box).load(tmp_path / "c")
    assert dst_box.v == 5


def test_global_rng_state_restores_every_generator(tmp_path):
    Checkpoint(rng=GlobalRNGState()).save(tmp_path / "c")
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(123), np.random.seed(123), random.seed(123)
    Checkpoint(rng=GlobalRNGState()).load(tmp_path / "c")
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], got[0]) and np.array_equal(expected[1], got[1])
    assert expected[2] == got[2]
    with pytest.raises(KeyError, match="'numpy'"):
        GlobalRNGState().load_state_dict({"torch": torch.get_rng_state()})


def test_map_location_remaps_devices(tmp_path):
    src, dst = _pair()
    Checkpoint(policy=src).save(tmp_path / "c")
    Checkpoint(policy=dst).load(tmp_path / "c", map_location="meta", strict="ignore")
    seen = []
    Checkpoint(policy=dst).load(tmp_path / "c", map_location=lambda s, loc: seen.append(loc) or s)
    assert seen and set(seen) == {"cpu"}


@pytest.mark.parametrize("damage,field", [
    (lambda p: (p / "manifest.json").write_text("{not json"), None),
    (lambda p: (p / "manifest.json").write_text(json.dumps({"format": "x", "version": 1})), "format"),
    (lambda p: (p / "manifest.json").write_text(json.dumps(
        {"format": "steersman.checkpoint", "version": 99, "components": {}})), "version"),
    (lambda p: (p / "manifest.json").write_text(json.dumps(
        {"format": "steersman.checkpoint", "version": 1, "components": {"../x": {}}})), "components"),
    (lambda p: (p / "components" / "policy" / "state.pt").write_bytes(b"garbage"), None),
])
def test_tampered_files_raise_load_error_naming_file(tmp_path, damage, field):
    src, dst = _pair()
    Checkpoint(policy=src).save(tmp_path / "c")
    damage(tmp_path / "c")
    before = dst.weight.detach().clone()
    with pytest.raises(LoadError) as err:
        Checkpoint(policy=dst).load(tmp_path / "c")
    assert str(tmp_path / "c") in err.value.file and err.value.field == field
    assert torch.equal(dst.weight, before)


def test_pickled_code_is_never_executed(tmp_path):
    src, dst = _pair()
    Checkpoint(policy=src).save(tmp_path / "c")

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    torch.save({"weight": Evil()}, tmp_path / "c" / "components" / "policy" / "state.pt")
    with pytest.raises(LoadError, match="state.pt"):
        Checkpoint(policy=dst).load(tmp_path / "c")
    assert not (tmp_path / "pwned").exists()


def test_archive_refuses_escaping_entries(tmp_path):
    with zipfile.ZipFile(tmp_path / "c", "w") as zf:
        zf.writestr("../evil.txt", "x")
    with pytest.raises(LoadError, match="escapes"):
        Checkpoint(policy=torch.nn.Linear(1, 1)).load(tmp_path / "c")
    assert not (tmp_path.parent / "evil.txt").exists()


def test_rotation_keeps_last_k_and_best(tmp_path):
    net = torch.nn.Linear(1, 1)
    rot = CheckpointRotation(tmp_path, keep_last=2, keep_best=("loss", "min"))
    losses = [3.0, 0.5, float("nan"), 2.0, 4.0, 1.0]
    for step, loss in enumerate(losses):
        with torch.no_grad():
            net.weight.fill_(step)
        rot.save(Checkpoint(policy=net), step=step, metadata={"loss": loss})
    assert [p.name for p in rot.checkpoints()] == \
        ["checkpoint-000000001", "checkpoint-000000004", "checkpoint-000000005"]
    assert rot.best().name == "checkpoint-000000001"
    (tmp_path / ".checkpoint-000000009.123.abc.tmp").mkdir()  # a dead writer's temp
    assert rot.latest().name == "checkpoint-000000005"
    dst = torch.nn.Linear(1, 1)
    assert rot.load_latest(Checkpoint(policy=dst)).loaded == {"policy"}
    assert dst.weight.item() == 5.0
    assert CheckpointRotation(tmp_path / "none", keep_last=1).latest() is None
    with pytest.raises(ValueError, match="keep_best"):
        CheckpointRotation(tmp_path, keep_last=1, keep_best=("loss", "median"))


def test_state_dict_adapter_formats_round_trip(tmp_path):
    for fmt in ("directory", "archive", "consolidated", "torch"):
        src, dst = _pair()
        ckpt = Checkpoint().register("p", src, adapter=StateDictCheckpointAdapter(fmt))
        ckpt.save(tmp_path / fmt)
        Checkpoint().register("p", dst, adapter=StateDictCheckpointAdapter(fmt)).load(tmp_path / fmt)
        assert torch.equal(src.weight, dst.weight)
    with pytest.raises(ValueError, match="payload_format='zip'"):
        StateDictCheckpointAdapter("zip")


def test_load_result_defaults_are_independent():
    a, b = CheckpointLoadResult(), CheckpointLoadResult()
    a.loaded.add("x")
    assert b.loaded == set()


_WRITER = textwrap.dedent("""
    import sys, torch
    from steersman.checkpoint import Checkpoint
    big = torch.nn.Linear(2000, 2000)
    with torch.no_grad():
        big.weight.fill_(2.0)
    print("ready", flush=True)
    while True:
        Checkpoint(format="directory", policy=big).save(sys.argv[1])
        Checkpoint(format="archive", policy=big).save(sys.argv[2])
""")


def test_sigkill_mid_write_leaves_previous_checkpoint_loadable(tmp_path):
    small = torch.nn.Linear(2000, 2000)
    with torch.no_grad():
        small.weight.fill_(1.0)
    paths = {"directory": tmp_path / "d", "archive": tmp_path / "a"}
    for fmt, path in paths.items():
        Checkpoint(format=fmt, policy=small).save(path)
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(paths["directory"]),
                             str(paths["archive"])], stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"ready"
    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    values = set()
    for path in paths.values():
        dst = torch.nn.Linear(2000, 2000)
        Checkpoint(policy=dst).load(path)
        assert dst.weight[0, 0].item() in (1.0, 2.0)
        assert torch.all(dst.weight == dst.weight[0, 0])  # one whole checkpoint, not a mix
        values.add(dst.weight[0, 0].item())
    assert 2.0 in values  # the killed writer had replaced at least one checkpoint
    # its temp folders are cleaned by the next save
    Checkpoint(policy=small).save(paths["directory"])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".d.")]


def test_manifest_migration_upgrades_old_versions(tmp_path, monkeypatch):
    from steersman.checkpoint import checkpoint as mod

    monkeypatch.setattr(mod, "_MIGRATIONS", {})
    src, dst = _pair()
    Checkpoint(policy=src).save(tmp_path / "c")
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    manifest["version"] = 0
    manifest["old_components"] = manifest.pop("components")
    (tmp_path / "c" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(LoadError, match="version 0"):
        Checkpoint(policy=dst).load(tmp_path / "c")
    Checkpoint.register_migration(0, lambda m: {**m, "version": 0})
    with pytest.raises(LoadError, match="did not give a version 1"):
        Checkpoint(policy=dst).load(tmp_path / "c")
    Checkpoint.register_migration(
        0, lambda m: {"version": 1, "format": m["format"], "components": m["old_components"]})
    assert Checkpoint(policy=dst).load(tmp_path / "c").loaded == {"policy"}
    assert torch.equal(dst.weight, src.weight)
