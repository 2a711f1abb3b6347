"""Crash safety with real processes: SIGKILL during/after ``dumps``; file-backed memmap storage."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from steersman.data.replay_buffers import (
    LazyMemmapStorage,
    PrioritizedSampler,
    TensorDictReplayBuffer,
)
from steersman.tensordict import TensorDict

REPO = Path(__file__).resolve().parents[2]
CAP = 4096
CHUNK = 1000
DIM = 64  # 4096 * 64 * 4 bytes = 1 MiB per float leaf: a dump takes a few ms

CHILD = textwrap.dedent(f"""
    import os, sys, time, torch
    sys.path.insert(0, {str(REPO)!r})
    from steersman.data.replay_buffers import LazyMemmapStorage, PrioritizedSampler, TensorDictReplayBuffer
    from steersman.data.replay_buffers import replay_buffers as rbmod
    from steersman.tensordict import TensorDict

    scratch, ckpt, mode = sys.argv[1], sys.argv[2], sys.argv[3]

    def chunk(start):
        ids = torch.arange(start, start + {CHUNK})
        return TensorDict({{"id": ids, "obs": ids.float().unsqueeze(-1).expand({CHUNK}, {DIM}).clone(),
                            "next": {{"done": (ids % 7 == 0).unsqueeze(-1)}}}}, [{CHUNK}])

    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage({CAP}, scratch_dir=scratch),
                                sampler=PrioritizedSampler({CAP}, 0.6, 0.4))
    written = 0
    for _ in range(3):
        rb.extend(chunk(written)); written += {CHUNK}
    rb.update_priority(torch.arange(len(rb)), torch.arange(len(rb)).double() + 1)
    rb.dumps(ckpt)
    print("DUMPED", written, flush=True)
    if mode == "after":
        time.sleep(60)  # killed here
    # second round: more data (wraps the buffer), then a dump that is killed part-way
    for _ in range(2):
        rb.extend(chunk(written)); written += {CHUNK}
    if mode == "during":
        import steersman.tensordict.io as tio
        real = tio.save_tensor_file
        count = [0]
        def slow_save(*a, **k):
            count[0] += 1
            real(*a, **k)
            if count[0] == 2:  # some files of the new checkpoint are written, not all
                print("MIDWAY", flush=True)
                time.sleep(60)
        tio.save_tensor_file = slow_save
    rb.dumps(ckpt)
    print("DUMPED", written, flush=True)
    time.sleep(60)
""")


def expected_ids(written: int) -> list[int]:
    """Slot contents of a round-robin buffer of CAP slots after ``written`` items."""
    return [max(j for j in range(written) if j % CAP == i) for i in range(min(written, CAP))]


def run_child(tmp_path: Path, mode: str) -> int:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "scratch"), str(tmp_path / "ckpt"), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    last = None
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("DUMPED"):
                last = int(line.split()[1])
                if mode == "after":
                    break
            if line.startswith("MIDWAY"):
                break
        assert last is not None, proc.stderr.read() if proc.poll() is not None else "no output"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return last


@pytest.mark.parametrize("mode", ["after", "during"])
def test_sigkill_leaves_last_completed_dump_loadable(tmp_path, mode):
    dumped = run_child(tmp_path, mode)
    assert dumped == 3 * CHUNK
    ckpt = tmp_path / "ckpt"
    if mode == "during":
        # the killed dump left a temp folder behind, but the pointer still names the first one
        assert any(p.name.startswith(".ckpt-") for p in ckpt.iterdir())
    assert json.loads((ckpt / "LATEST.json").read_text())["current"] == "ckpt-000001"
    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(CAP, scratch_dir=tmp_path / "reopened"),
                                sampler=PrioritizedSampler(CAP, 0.6, 0.4))
    rb.loads(ckpt)
    assert len(rb) == dumped and rb.write_count == dumped
    data = rb[torch.arange(len(rb))]
    assert data["id"].tolist() == expected_ids(dumped)
    assert torch.equal(data["obs"], data["id"].float().unsqueeze(-1).expand(-1, DIM))
    leaves = rb.sampler._tree.leaves()[:dumped]
    torch.testing.assert_close(leaves, (torch.arange(dumped).double() + 1 + 1e-8) ** 0.6)
    # a new dump from the reloaded buffer cleans up the dead process's temp folder
    rb.dumps(ckpt)
    assert not any(p.name.startswith(".ckpt-") for p in ckpt.iterdir())
    assert sorted(p.name for p in ckpt.iterdir()) == ["LATEST.json", "ckpt-000002"]


def test_completed_second_dump_wins(tmp_path):
    """Without a kill mid-way the newest dump is the one loaded (and the old one is gone)."""
    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(50, scratch_dir=tmp_path / "s"))
    rb.extend(TensorDict({"id": torch.arange(30)}, [30]))
    rb.dumps(tmp_path / "c")
    rb.extend(TensorDict({"id": torch.arange(30, 60)}, [30]))
    rb.dumps(tmp_path / "c")
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["LATEST.json", "ckpt-000002"]
    other = TensorDictReplayBuffer(storage=LazyMemmapStorage(50, scratch_dir=tmp_path / "o"))
    other.loads(tmp_path / "c")
    assert other["id"].tolist() == list(range(50, 60)) + list(range(10, 50)) and other.write_count == 60


def test_memmap_storage_is_file_backed(tmp_path):
    """Each leaf is a file of exactly max_size * item bytes, and the mapped pages are
    file-backed (no anonymous memory): the kernel can write them back and drop them, which is
    what lets a buffer outgrow RAM."""
    cap = 100_000
    st = LazyMemmapStorage(cap, scratch_dir=tmp_path / "scratch")
    rb = TensorDictReplayBuffer(storage=st, batch_size=8)
    n = 20_000
    rb.extend(TensorDict({"obs": torch.ones(n, 32), "next": {"reward": torch.ones(n, 1, dtype=torch.float64)}}, [n]))
    files = {Path(f).relative_to(tmp_path / "scratch").as_posix(): os.path.getsize(f) for f in st.filenames}
    assert files == {"obs.memmap": cap * 32 * 4, "next/reward.memmap": cap * 8, "index.memmap": cap * 8}
    # the data really lives in the file
    raw = torch.from_file(str(tmp_path / "scratch" / "obs.memmap"), size=cap * 32, dtype=torch.float32)
    assert raw[: n * 32].eq(1).all() and raw[n * 32 :].eq(0).all()
    smaps = Path("/proc/self/smaps")
    if not smaps.exists():
        pytest.skip("no /proc/self/smaps on this platform")
    target = str((tmp_path / "scratch" / "obs.memmap").resolve())
    del raw
    lines = smaps.read_text().split("\n")
    maps = []
    for i, line in enumerate(lines):
        if line.endswith(target):
            fields = {}
            for entry in lines[i + 1 : i + 30]:
                key = entry.split(":")[0]
                if key in ("Rss", "Anonymous", "Size") and key not in fields:
                    fields[key] = int(entry.split()[1])
            maps.append(fields)
    full = [m for m in maps if m["Size"] * 1024 >= cap * 32 * 4]
    assert full, f"the storage file is not mapped whole: {maps}"
    for m in full:
        assert m["Anonymous"] == 0, m  # pages belong to the file, not to private memory
        assert m["Rss"] > 0  # and we did touch them
    # sparse allocation: untouched capacity takes no disk blocks
    st_blocks = os.stat(target).st_blocks * 512
    assert st_blocks < cap * 32 * 4
    s = rb.sample()
    assert s["obs"].shape == (8, 32) and type(s["obs"]) is torch.Tensor


def test_memmap_existsok(tmp_path):
    st = LazyMemmapStorage(10, scratch_dir=tmp_path)
    rb = TensorDictReplayBuffer(storage=st)
    rb.extend(TensorDict({"x": torch.zeros(2)}, [2]))
    rb2 = TensorDictReplayBuffer(storage=LazyMemmapStorage(10, scratch_dir=tmp_path))
    with pytest.raises(FileExistsError):
        rb2.extend(TensorDict({"x": torch.zeros(2)}, [2]))
    assert len(rb2) == 0
    rb3 = TensorDictReplayBuffer(storage=LazyMemmapStorage(10, scratch_dir=tmp_path, existsok=True))
    rb3.extend(TensorDict({"x": torch.ones(2)}, [2]))
    assert rb3["x"].tolist() == [1.0, 1.0]


def test_temporary_scratch_dir_is_removed():
    import gc

    st = LazyMemmapStorage(10)
    rb = TensorDictReplayBuffer(storage=st)
    rb.extend(TensorDict({"x": torch.zeros(2)}, [2]))
    d = st.scratch_dir
    assert os.path.isdir(d)
    del rb, st
    gc.collect()
    assert not os.path.exists(d)
