"""The compile settings of recipes/precompiled.py: g++'s optimisation level for the graphs
compiled there, and the CPU ISA probe run in parallel."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from steersman.recipes import precompiled
from steersman.recipes.precompiled import (
    CPP_OPT_LEVEL,
    Precompiled,
    _compile,
    _package_key,
    cpp_opt_level,
)


def _levels(min_optimize: bool = False) -> list[str]:
    from torch._inductor import cpp_builder

    return [f for f in cpp_builder._get_optimization_cflags("g++", min_optimize)[0] if f.startswith("O")]


def test_cpp_opt_level_replaces_inductors_O3_only_inside_the_block(monkeypatch):
    monkeypatch.delenv("STEERSMAN_CPP_OPT", raising=False)
    assert CPP_OPT_LEVEL == "O2"
    with cpp_opt_level():
        pass  # (installs the wrapper)
    assert _levels() == ["O3"]
    wrapper_level = _levels(min_optimize=True)  # (inductor's wrapper level: not ours to change)
    with cpp_opt_level():
        assert _levels() == ["O2"]
        with cpp_opt_level("O1"):
            assert _levels() == ["O1"]
        assert _levels() == ["O2"]
        assert _levels(min_optimize=True) == wrapper_level
    assert _levels() == ["O3"]
    monkeypatch.setenv("STEERSMAN_CPP_OPT", "O3")
    with cpp_opt_level():
        assert _levels() == ["O3"]


@pytest.mark.parametrize("level", ["O4", "-O2", "fast", "O2 -g"])
def test_cpp_opt_level_rejects_what_is_not_a_level(monkeypatch, level):
    monkeypatch.setenv("STEERSMAN_CPP_OPT", level)
    with pytest.raises(ValueError, match=r"STEERSMAN_CPP_OPT.*O0, O1, O2, O3, Os.*" + repr(level).replace("'", ".")):
        with cpp_opt_level():
            pass
    assert _levels() == ["O3"]  # nothing left active


def _built_sources(monkeypatch) -> list[str]:
    """The command lines of inductor's C++ builds from now on (recorded, then built)."""
    from torch._inductor import cpp_builder

    commands: list[str] = []
    build = cpp_builder.CppBuilder.build

    def recording(self):
        commands.append(self.get_command_line())
        return build(self)

    monkeypatch.setattr(cpp_builder.CppBuilder, "build", recording)
    return commands


def test_compiled_graphs_cpp_is_built_at_the_level(tmp_path, monkeypatch):
    """A function through ``_compile`` (the population's path): every g++ command of its
    compile carries ``-O2`` and none ``-O3``; a plain ``torch.compile`` next to it keeps -O3."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("STEERSMAN_CPP_OPT", raising=False)
    commands = _built_sources(monkeypatch)
    x = torch.randn(37)
    graph = _compile(lambda t: (t.sin() * 3.25 + 1.5).cumsum(0), "inductor")
    commands.clear()  # (the ISA probe's builds, when this worker has no record yet: inductor's own)
    assert torch.allclose(graph(x), (x.sin() * 3.25 + 1.5).cumsum(0), atol=1e-5)
    ours = [c for c in commands if ".cpp" in c]
    assert ours and all(" -O2 " in c and " -O3 " not in c for c in ours), ours
    commands.clear()
    plain = torch.compile(lambda t: (t.cos() * 2.75 - 1.25).cumsum(0), fullgraph=True)
    plain(x)
    assert any(" -O3 " in c for c in commands if ".cpp" in c)


def test_wrapper_at_o1_marks_only_the_wrapper_function():
    code = ("#include <torch/csrc/inductor/cpp_wrapper/cpu.h>\nextern \"C\" void cpp_fused_0(float* out);"
            "\nvoid inductor_entry_impl(\n    AtenTensorHandle* input_handles)\n{\n}\n"
            "#include <torch/csrc/inductor/cpp_prefix.h>\nextern \"C\" void cpp_fused_0(float* out)\n{\n}\n")
    marked = precompiled._wrapper_at_o1(code)
    assert marked == code.replace("\nvoid inductor_entry_impl(",
                                  '\n__attribute__((optimize("O1"))) void inductor_entry_impl(')
    assert marked.count("optimize") == 1
    no_wrapper = "#include <torch/csrc/inductor/cpp_prefix.h>\nextern \"C\" void kernel(float* out) {}\n"
    assert precompiled._wrapper_at_o1(no_wrapper) == no_wrapper


def test_cpp_wrapper_graphs_precompile_the_kernels_prefix_and_build_the_wrapper_at_O1(tmp_path, monkeypatch):
    """A C++-wrapper graph through ``_compile``: its file's build includes the precompiled
    header of :data:`WRAPPER_AND_PREFIX_HEADER` (the wrapper's header and the kernels'
    prefix), its wrapper function carries ``optimize("O1")`` and nothing else does, and its
    outputs equal bit for bit those of the same graph built without either change."""
    import re

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.delenv("STEERSMAN_CPP_OPT", raising=False)
    commands = _built_sources(monkeypatch)
    x = torch.randn(301)

    def fn(t):
        return (t.exp() * 1.75 - t.tanh()).cumsum(0) / (t * t).sum()

    out = _compile(fn, "inductor")(x)
    mains = [c for c in commands if ".main.cpp" in c]
    assert len(mains) == 1 and " -O2 " in mains[0], commands
    header = re.search(r"-include (\S+)", mains[0]).group(1)
    with open(header) as f:
        assert os.path.abspath(precompiled.WRAPPER_AND_PREFIX_HEADER) in f.read()
    with open(re.search(r"(\S+\.main\.cpp)", mains[0]).group(1)) as f:
        source = f.read()
    assert source.count('__attribute__((optimize("O1")))') == 1
    assert '__attribute__((optimize("O1"))) void inductor_entry_impl(' in source
    assert source.index("inductor_entry_impl(") < source.index("#include <torch/csrc/inductor/cpp_prefix.h>")

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "b"))  # (another file: no cache hit)
    monkeypatch.setattr(precompiled, "_wrapper_at_o1", lambda code: code)
    commands.clear()
    torch._dynamo.reset()
    plain = _compile(fn, "inductor")(x)
    source_b = [c for c in commands if ".main.cpp" in c]
    assert source_b and 'optimize("O1")' not in open(re.search(r"(\S+\.main\.cpp)", source_b[0]).group(1)).read()
    assert torch.equal(out, plain)
    assert torch.allclose(out, fn(x), rtol=1e-5, atol=1e-5)


class _Owner:
    def __init__(self):
        self.scale = torch.ones(3)

    def step(self, x):
        return x * self.scale


def test_the_level_is_part_of_the_precompiled_and_package_keys(monkeypatch):
    owner, args = _Owner(), (torch.zeros(3),)
    monkeypatch.delenv("STEERSMAN_CPP_OPT", raising=False)
    keys = Precompiled(owner.step).structure_key(args), _package_key(owner.step, owner, args, {})
    monkeypatch.setenv("STEERSMAN_CPP_OPT", "O2")
    assert (Precompiled(owner.step).structure_key(args), _package_key(owner.step, owner, args, {})) == keys
    monkeypatch.setenv("STEERSMAN_CPP_OPT", "O3")
    other = Precompiled(owner.step).structure_key(args), _package_key(owner.step, owner, args, {})
    assert other[0] != keys[0] and other[1] != keys[1]


_PROBE = """
import json, sys
from torch._inductor import cpu_vec_isa
from steersman.recipes.precompiled import _probe_in_parallel
if sys.argv[1] == "parallel":
    _probe_in_parallel(cpu_vec_isa)
print(json.dumps([str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]))
"""


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="inductor probes the ISAs on Linux (x86-64) here")
def test_parallel_isa_probe_finds_what_inductors_own_probe_finds(tmp_path):
    """Two fresh processes with empty caches: inductor's sequential probe, and the probe run in
    threads first. Same ISAs (at least one on an x86-64 machine with a compiler)."""
    found = {}
    for mode in ("sequential", "parallel"):
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / mode))
        env.pop("TORCHINDUCTOR_VEC_ISA_OK", None)
        out = subprocess.run([sys.executable, "-c", _PROBE, mode], env=env, capture_output=True, text=True,
                             timeout=300, check=True)
        found[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["parallel"] == found["sequential"]
    if os.uname().machine == "x86_64":
        assert found["sequential"], "no vector ISA found usable: is a C++ compiler installed?"


_FORCED = """
import json, subprocess
from torch._inductor import cpp_builder, cpu_vec_isa
from steersman.recipes.precompiled import remember_vec_isa
built, run, build = [], subprocess.run, cpp_builder.CppBuilder.build
cpp_builder.CppBuilder.build = lambda self: built.append(self.get_command_line()) or build(self)
subprocess.run = lambda *a, **k: ("LoadLibrary" in str(a) and built.append(a)) or run(*a, **k)  # (a probe's load)
skipped = remember_vec_isa()
isa = cpu_vec_isa.pick_vec_isa()
print(json.dumps([skipped, [str(i) for i in cpu_vec_isa.valid_vec_isa_list()], isa.build_arch_flags(), len(built)]))
"""


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux" or os.uname().machine != "x86_64",
                    reason="the ISA record is kept on x86-64 Linux")
def test_the_isa_record_answers_the_extension_checks_without_building(tmp_path):
    """A first process probes and records (inductor's own probe, ISA extension checks
    included); a second one with the same cache builds and loads nothing, and finds the
    same ISAs and the same compiler flags (AVX512-BF16, AMX... as the checks found)."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path))
    env.pop("TORCHINDUCTOR_VEC_ISA_OK", None)
    runs = [json.loads(subprocess.run([sys.executable, "-c", _FORCED], env=env, capture_output=True, text=True,
                                      timeout=300, check=True).stdout.strip().splitlines()[-1]) for _ in range(2)]
    (record,) = (tmp_path / "steersman-vec-isa").glob("*.json")
    checks = json.loads(record.read_text())["checks"]
    assert checks and all(isinstance(v, bool) for v in checks.values())
    first, second = runs
    assert second[1:3] == first[1:3] and second[1], runs
    assert first[3] > 0 and second == [True, first[1], first[2], 0], runs


def test_isa_checks_are_recorded_then_answered_without_a_build():
    """``_recording_checks`` collects each ISA's ``check_build`` answers under its ISA, flags
    and program, and puts the method back; ``_answer_checks`` answers those from the record
    and builds the others; a recording over answers keeps the answers afterwards."""
    built = []

    class FakeIsa:
        def __init__(self, name, flags):
            self.name, self.flags = name, flags

        def __str__(self):
            return self.name

        def build_arch_flags(self):
            return self.flags

        def check_build(self, code):
            built.append((self.name, code))
            return code != "bad"

    class FakeModule:
        supported_vec_isa_list = [FakeIsa("avx512", "-mavx512f"), FakeIsa("avx2", "-mavx2")]

    a, b = FakeModule.supported_vec_isa_list
    with precompiled._recording_checks(FakeModule) as checks:
        assert a.check_build("ok") is True and a.check_build("bad") is False and b.check_build("ok") is True
    assert len(built) == 3 and len(checks) == 3 and sorted(checks.values()) == [False, True, True]
    assert "check_build" not in vars(a) and "check_build" not in vars(b)
    a.flags = "-mavx512f -mavx512bf16"
    assert a.check_build("ok") and len(built) == 4  # (not recorded: the method again)

    a.flags = "-mavx512f"
    precompiled._answer_checks(FakeModule, checks)
    assert a.check_build("ok") is True and a.check_build("bad") is False and b.check_build("ok") is True
    assert len(built) == 4  # all three answered
    assert b.check_build("other") is True and built[-1] == ("avx2", "other")  # not in the record: built
    answering = vars(a)["check_build"]
    with precompiled._recording_checks(FakeModule) as again:
        a.check_build("ok")
    assert list(again.values()) == [True] and vars(a)["check_build"] is answering and len(built) == 5


def test_probe_in_parallel_asks_every_listed_isa_once(monkeypatch):
    """Each ISA the CPU's flags list is probed (its ``bool``) once, in threads; ISAs the
    flags do not list are not; a failing probe is left to inductor (no exception)."""
    asked = []

    class FakeIsa:
        def __init__(self, name, fail=False):
            self.name, self.fail = name, fail

        def __str__(self):
            return self.name

        def __bool__(self):
            asked.append(self.name)
            if self.fail:
                raise RuntimeError("compiler crashed")
            return True

    class FakeModule:
        supported_vec_isa_list = [FakeIsa("avx512f avx512bw"), FakeIsa("avx2 fma", fail=True), FakeIsa("amx_tile")]

        @staticmethod
        def x86_isa_checker():
            return ["avx2", "fma", "avx512f", "avx512bw"]

    precompiled._probe_in_parallel(FakeModule)
    assert sorted(asked) == ["avx2 fma", "avx512f avx512bw"]


def test_stale_temporary_packages_of_dead_builders_are_removed(tmp_path):
    """A builder killed with its parent leaves ``<name>.<pid>.tmp.pt2``; the next build removes
    it if that pid is gone, and keeps a live builder's file and any other file."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"abc.{dead.pid}.tmp.pt2"
    live = tmp_path / f"def.{os.getpid()}.tmp.pt2"
    other = [tmp_path / "abc.pt2", tmp_path / "x.notapid.tmp.pt2"]
    for f in [stale, live, *other]:
        f.write_bytes(b"partial")
    assert precompiled._remove_stale_builds(str(tmp_path)) == [str(stale)]
    assert not stale.exists() and live.exists() and all(f.exists() for f in other)


def test_a_compiled_function_through_compile_keeps_its_attributes_and_copies(monkeypatch):
    """``_compile``'s wrapper (its calls at the C++ level) reads through to torch.compile's
    object and survives a copy (no recursion on a half-made instance)."""
    import copy

    graph = _compile(lambda t: t + 1, "inductor")
    assert isinstance(graph, precompiled._AtOptLevel)
    assert graph._torchdynamo_orig_callable is graph._fn._torchdynamo_orig_callable
    twin = copy.copy(graph)
    assert twin._fn is graph._fn
    assert _compile(lambda t: t + 1, "aot_eager").__class__ is not precompiled._AtOptLevel
