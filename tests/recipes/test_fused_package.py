"""The fused graphs as AOTInductor packages (recipes/precompiled.py, ``Precompiled``): built after
a graph compiles, kept only when bit-equal to it, loaded in a later process without dynamo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from steersman.envs.native import CartPoleEnv
from steersman.recipes import fused as fused_mod
from steersman.recipes import precompiled
from steersman.recipes.fused import FusedCollector, FusedGAE
from steersman.recipes.ppo import PPOConfig, make_critic, make_policy

KEYS = ("advantage", "value_target", "state_value", ("next", "state_value"))


def _batch(seed=3, n=4, T=16):
    torch.manual_seed(seed)
    env = CartPoleEnv(batch_size=[n], seed=seed)
    cfg = PPOConfig()
    policy = make_policy(cfg, env)
    collector = FusedCollector(
        env, policy, frames_per_batch=n * T, total_frames=n * T, compile=False
    )
    return make_critic(cfg, env), next(iter(collector))


def _packages(path):
    return sorted(n for n in os.listdir(path) if n.endswith(".pt2"))


def test_gae_package_is_built_equal_and_loaded_without_dynamo(tmp_path, monkeypatch):
    """The first object compiles (dynamo's precompile) and builds a package; the next loads
    the package and gives the same numbers bit for bit; so does a new process, which never
    imports dynamo or inductor. A package others may write, or a corrupt one, is refused; a
    package whose outputs differ from the compiled graph's is not saved."""
    monkeypatch.setattr(precompiled, "_precompiled_dir", lambda: str(tmp_path))
    monkeypatch.delenv("STEERSMAN_PRECOMPILE", raising=False)
    critic, batch = _batch()

    first = FusedGAE(critic, gamma=0.98, lmbda=0.8, options={})
    out = first(batch.clone())
    assert first._fn.source == "saved"
    assert (
        precompiled._BUILDING and precompiled.wait_for_packages() == 1
    )  # (built beside the caller)
    [name] = _packages(tmp_path)
    path = str(tmp_path / name)
    assert os.stat(path).st_mode & 0o077 == 0
    [index] = tmp_path.glob("*.aoti.json")
    assert {"self.gamma", "self.lmbda"} <= set(json.loads(index.read_text())["reads"])

    second = FusedGAE(critic, gamma=0.98, lmbda=0.8, options={})
    outs = [second(batch.clone()), second(batch.clone())]
    assert second._fn.source == "package" and second._fn.path == path
    for k in KEYS:
        assert torch.equal(outs[0][k], out[k]) and torch.equal(outs[1][k], out[k])

    # another gamma: another file
    other = FusedGAE(critic, gamma=0.9, lmbda=0.8, options={})
    assert other._fn._file("key", ["self.gamma"], ".pt2") != second._fn._file(
        "key", ["self.gamma"], ".pt2"
    )

    # a new process: the package, no dynamo, the same numbers
    torch.save(
        {"critic": critic, "batch": batch, "out": {k: out[k] for k in KEYS}}, tmp_path / "case.pt"
    )
    script = textwrap.dedent(f"""
        import sys
        import torch
        from steersman.recipes import fused, precompiled
        precompiled._precompiled_dir = lambda: {str(tmp_path)!r}
        case = torch.load({str(tmp_path / "case.pt")!r}, weights_only=False)
        gae = fused.FusedGAE(case["critic"], gamma=0.98, lmbda=0.8, options={{}})
        outs = [gae(case["batch"].clone()) for _ in range(2)]
        assert gae._fn.source == "package", gae._fn.source
        assert "torch._dynamo" not in sys.modules and "torch._inductor" not in sys.modules
        for o in outs:
            for k, v in case["out"].items():
                assert torch.equal(o[k], v), k
        print("ok")
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]

    package_key = index.name[: -len(".aoti.json")]
    probe = FusedGAE(critic, gamma=0.98, lmbda=0.8, options={})._fn
    nxt = batch.get("next")
    gae_args = (
        fused_mod._flat(second._net)[1],
        batch.get("observation"),
        nxt.get("observation"),
        nxt.get("reward"),
        nxt.get("done"),
        nxt.get("terminated"),
    )
    assert probe._load_package(package_key, gae_args)
    os.chmod(path, 0o666)  # others may write it: refused
    assert not FusedGAE(critic, gamma=0.98, lmbda=0.8, options={})._fn._load_package(
        package_key, gae_args
    )
    os.chmod(path, 0o600)
    good = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(b"not a package")
    with pytest.raises(Exception):  # noqa: B017 - the loader's own error; _first_call falls back on any
        FusedGAE(critic, gamma=0.98, lmbda=0.8, options={})._fn._load_package(package_key, gae_args)

    # a package whose outputs differ is not saved (the child stood in for by a call in this
    # process, the export and AOTInductor by a copy of the good package)
    os.remove(path)
    reads = json.loads(index.read_text())["reads"]
    index.unlink()

    def copy(fn, spec, flat, path, options):
        with open(path, "wb") as f:
            f.write(good)

    def in_process(work, timeout=600.0, *, wait=True, nice=0, jobs=None):
        try:
            work()
        except RuntimeError:
            return False
        return True

    monkeypatch.setattr(precompiled, "_compile_package", copy)
    monkeypatch.setattr(precompiled, "_in_child", in_process)
    builder = FusedGAE(critic, gamma=0.98, lmbda=0.8, options={})._fn
    builder._reads = reads
    same = precompiled._same
    rng = torch.get_rng_state()
    monkeypatch.setattr(precompiled, "_same", lambda a, b: False)
    assert (
        builder._build_package(package_key, gae_args, tuple(out[k] for k in KEYS), rng) is not None
    )
    assert _packages(tmp_path) == [] and not index.exists()
    monkeypatch.setattr(precompiled, "_same", same)
    assert builder._build_package(package_key, gae_args, tuple(out[k] for k in KEYS), rng) is None
    assert _packages(tmp_path) == [name] and index.exists()
    assert not list(tmp_path.glob("*.tmp*"))


@pytest.mark.slow
def test_rollout_package_draws_the_compiled_rollouts_actions(tmp_path, monkeypatch):
    """The rollout's package (a ``scan`` with ``multinomial`` from torch's global generator)
    collects the same batches, bit for bit, as the compiled rollout it was built from."""
    monkeypatch.setattr(precompiled, "_precompiled_dir", lambda: str(tmp_path))
    monkeypatch.delenv("STEERSMAN_PRECOMPILE", raising=False)

    def collect():
        torch.manual_seed(0)
        env = CartPoleEnv(batch_size=[8], seed=0)
        policy = make_policy(PPOConfig(), env)
        collector = FusedCollector(env, policy, frames_per_batch=256, total_frames=768, options={})
        return collector, [b.clone() for b in collector]

    compiled, batches = collect()
    precompiled.wait_for_packages()  # (built beside the collection)
    assert compiled._fn.source == "saved" and len(_packages(tmp_path)) == 1
    packaged, again = collect()
    assert packaged._fn.source == "package"
    for a, b in zip(batches, again, strict=True):
        for key in a.keys(include_nested=True, leaves_only=True):
            assert torch.equal(a.get(key), b.get(key)), key


def test_package_child_dies_with_its_parent(tmp_path):
    """A package still being built never outlives the training process: killed with -9, its
    child goes too (and a finished child is reaped by ``wait_for_packages``)."""
    script = textwrap.dedent("""
        import os, sys, time
        from steersman.recipes import fused, precompiled
        assert precompiled._in_child(lambda: None) is True
        assert precompiled._in_child(lambda: time.sleep(120), wait=False) is True
        [pid] = precompiled._BUILDING
        print(pid, flush=True)
        time.sleep(120)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        child = int(proc.stdout.readline())
        os.kill(child, 0)  # alive while its parent lives
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(child):
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        proc.kill()


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def test_ctrl_c_at_exit_drops_the_builds_and_their_files(tmp_path, monkeypatch):
    """A second Ctrl-C while the exit waits for package builds kills them and removes their
    temporary files; a build past its time limit goes the same way."""
    monkeypatch.setattr(precompiled, "_precompiled_dir", lambda: str(tmp_path))
    assert precompiled._in_child(lambda: time.sleep(120), wait=False)
    [pid] = precompiled._BUILDING
    (tmp_path / f"abc.{pid}.tmp.pt2").write_bytes(b"partial")
    (tmp_path / "kept.pt2").write_bytes(b"a package")

    def interrupted(pid, *, block):
        raise KeyboardInterrupt

    reap = precompiled._reap
    monkeypatch.setattr(precompiled, "_reap", interrupted)
    assert precompiled.wait_for_packages() == 0
    assert not precompiled._BUILDING and not _alive(pid)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.pt2"]

    monkeypatch.setattr(precompiled, "_reap", reap)
    assert not precompiled._in_child(lambda: time.sleep(120), timeout=0.2)  # past its limit: killed
    assert not precompiled._BUILDING


def _zeros_like(batch):
    return batch.apply(torch.zeros_like)  # (the same layout, other values)


def test_compile_ahead_compiles_in_a_child_and_the_first_call_loads_it(tmp_path, monkeypatch):
    """A child makes the graph's first call on a batch of the same layout (other values) and
    saves it; the first call here waits, loads it, and gives what an ordinary first call
    gives, bit for bit. The child builds no package; this process does, as usual."""
    monkeypatch.delenv("STEERSMAN_PRECOMPILE", raising=False)
    critic, batch = _batch()
    monkeypatch.setattr(precompiled, "_precompiled_dir", lambda: str(tmp_path / "plain"))
    plain = FusedGAE(critic, gamma=0.98, lmbda=0.8, options={})
    want = plain(batch.clone())
    assert plain._fn.source == "saved"
    precompiled.wait_for_packages()

    monkeypatch.setattr(precompiled, "_precompiled_dir", lambda: str(tmp_path / "ahead"))
    gae = FusedGAE(critic, gamma=0.98, lmbda=0.8, options={})
    layout = _zeros_like(batch)
    assert precompiled.compile_ahead(gae._fn, lambda: gae(layout))
    assert not precompiled.compile_ahead(gae._fn, lambda: gae(layout))  # (one child per graph)
    [child] = precompiled._AHEAD
    got = gae(batch.clone())
    assert gae._fn.source == "loaded" and not precompiled._AHEAD and not _alive(child)
    for k in KEYS:
        assert torch.equal(got[k], want[k]), k
    assert list(precompiled._BUILDING) and precompiled.wait_for_packages() == 1  # (the parent's package)
    assert len(_packages(tmp_path / "ahead")) == 1


def test_compile_ahead_yields_to_a_package_a_mismatch_or_a_failure(tmp_path, monkeypatch):
    """A package found for the first call: the child is killed. A child that called with
    another layout, or failed: the first call compiles here, with the right numbers."""
    monkeypatch.delenv("STEERSMAN_PRECOMPILE", raising=False)
    monkeypatch.setattr(precompiled, "_precompiled_dir", lambda: str(tmp_path))
    critic, batch = _batch()
    first = FusedGAE(critic, gamma=0.98, lmbda=0.8, options={})
    want = first(batch.clone())
    assert precompiled.wait_for_packages() == 1

    packaged = FusedGAE(critic, gamma=0.98, lmbda=0.8, options={})
    assert precompiled.compile_ahead(packaged._fn, lambda: time.sleep(120))
    [child] = precompiled._AHEAD
    got = packaged(batch.clone())
    assert packaged._fn.source == "package" and not precompiled._AHEAD and not _alive(child)
    assert all(torch.equal(got[k], want[k]) for k in KEYS)

    monkeypatch.setenv("STEERSMAN_PRECOMPILE", "dynamo")  # (no packages: the .bin path)
    _, short = _batch(T=8)  # another layout: the child saves a graph this call cannot use
    for first_call in (lambda gae: gae(_zeros_like(short)), lambda gae: 1 / 0):
        for f in tmp_path.iterdir():
            f.unlink()
        gae = FusedGAE(critic, gamma=0.98, lmbda=0.8, options={})
        assert precompiled.compile_ahead(gae._fn, lambda gae=gae, f=first_call: f(gae))
        got = gae(batch.clone())
        assert gae._fn.source == "saved" and not precompiled._AHEAD
        assert all(torch.equal(got[k], want[k]) for k in KEYS)


def test_ppo_compiles_its_update_ahead_and_loads_it(tmp_path, monkeypatch):
    """``compile=true`` PPO, cold: the fused update compiles in a child (started when the
    rollout compiles) beside the rollout and GAE, and the loop's first update loads what the
    child saved."""
    from steersman.recipes import fused_ppo
    from steersman.recipes.ppo import train

    monkeypatch.setenv("STEERSMAN_PRECOMPILE", "dynamo")
    monkeypatch.setattr(precompiled, "_precompiled_dir", lambda: str(tmp_path / "pre"))
    graphs = []
    real = fused_ppo.compile_ahead

    def recording(graph, first_call, when=None):
        graphs.append(graph)
        return real(graph, first_call, when=when)

    monkeypatch.setattr(fused_ppo, "compile_ahead", recording)
    train(PPOConfig(total_frames=512, compile=True, quiet=True, export_format="none"), tmp_path / "run")
    [graph] = graphs
    assert graph.source == "loaded" and not precompiled._AHEAD


def test_compile_ahead_when_starts_only_if_that_graph_compiles(tmp_path, monkeypatch):
    """``when=``: nothing forks until that graph's first call; a package found there (a warm
    cache) forks nothing; a compile there starts the child first, and the graph it compiled
    is then loaded."""
    monkeypatch.delenv("STEERSMAN_PRECOMPILE", raising=False)
    monkeypatch.setattr(precompiled, "_precompiled_dir", lambda: str(tmp_path))
    critic, batch = _batch()
    FusedGAE(critic, gamma=0.98, lmbda=0.8, options={})(batch.clone())
    assert precompiled.wait_for_packages() == 1  # (gamma 0.98 has a package now)

    warm = FusedGAE(critic, gamma=0.98, lmbda=0.8, options={})
    later = FusedGAE(critic, gamma=0.9, lmbda=0.8, options={})
    layout = _zeros_like(batch)
    assert precompiled.compile_ahead(later._fn, lambda: later(layout), when=warm._fn)
    assert not precompiled._AHEAD and len(warm._fn._before_compile) == 1
    warm(batch.clone())
    assert warm._fn.source == "package" and not precompiled._AHEAD  # warm: no child

    monkeypatch.setenv("STEERSMAN_PRECOMPILE", "dynamo")  # (no packages: both graphs compile)
    cold = FusedGAE(critic, gamma=0.95, lmbda=0.8, options={})
    started = []
    real = precompiled._in_child
    monkeypatch.setattr(precompiled, "_in_child", lambda *a, **k: started.append(1) or real(*a, **k))
    assert precompiled.compile_ahead(later._fn, lambda: later(layout), when=cold._fn)
    cold(batch.clone())
    assert started and cold._fn.source == "saved" and not cold._fn._before_compile
    got = later(batch.clone())
    assert later._fn.source == "loaded" and not precompiled._AHEAD
    want = FusedGAE(critic, gamma=0.9, lmbda=0.8, compile=False)(batch.clone())
    for k in KEYS:
        assert torch.allclose(got[k], want[k], atol=1e-5), k
