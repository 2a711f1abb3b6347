"""The fused graphs compiled once per machine: inductor's options for them, the CPU probe
remembered, and :class:`Precompiled` (a graph saved whole after its first compile: torch's
precompile, and an AOTInductor package that later processes run without importing dynamo
or inductor).

Used by :mod:`steersman.recipes.fused` (the rollout and GAE graphs),
:mod:`steersman.recipes.fused_ppo` (the update) and :mod:`steersman.recipes.multiseed`
(the population's graphs), all through :func:`_compile`::

    graph = _compile(obj.method, "inductor")   # a Precompiled: loads, or compiles and saves
    out = graph(*args)
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import glob
import hashlib
import json
import os
import pickle
import platform
import re
import signal
import sys
import time
import warnings
from typing import Any

import torch
from torch import Tensor, nn

from steersman.objectives.functional_update import use_compile_cache
from steersman.tensordict.files import write_json_atomic

__all__ = ["CPP_OPT_LEVEL", "INDUCTOR_OPTIONS", "TRAIN_OPTIONS", "Precompiled", "compile_ahead",
           "compile_options", "cpp_opt_level", "remember_vec_isa", "wait_for_packages"]


@functools.cache
def _isa_key() -> str:
    """A hash of what inductor's CPU code depends on besides the graph: the compiler's
    version string, torch's version and location, the machine and the CPU's flags."""
    from torch._inductor import cpu_vec_isa

    fingerprint = cpu_vec_isa._get_isa_dry_compile_fingerprint("")
    flags = sorted(cpu_vec_isa.x86_isa_checker()) if platform.machine() == "x86_64" else []
    return hashlib.sha256(json.dumps([fingerprint, torch.__file__, platform.machine(), flags]).encode()).hexdigest()


def remember_vec_isa() -> bool:
    """Skips inductor's per-process probe of the CPU's vector ISAs when an earlier
    process on this machine found every ISA the CPU flags list usable; returns whether
    the probe is skipped.

    In every new process inductor's first CPU compile dry-compiles a small program for
    each ISA that ``/proc/cpuinfo`` lists (AVX512-VNNI, AVX512, AVX2 here) and checks each
    ``.so`` by loading it in a child Python (6 children: 1.8-2.5 s of a ~8 s warm start at
    load ~3). The answer depends only on the CPU, the compiler and torch, so it is kept
    in :func:`~steersman.objectives.functional_update.use_compile_cache`'s directory
    under a key of those three (the compiler's version string, torch's version and
    location, the machine, the CPU's flags). When the stored probe found every listed
    ISA usable, this sets inductor's documented ``cpp.vec_isa_ok = True`` ("force usage
    without testing"), which yields that same list without the children. Otherwise (no
    record yet: the probe runs here once and is recorded; some ISA failed; not x86-64
    Linux; ``TORCHINDUCTOR_VEC_ISA_OK`` or ``cpp.vec_isa_ok`` already set) inductor
    probes as usual.

    Even when forced, inductor still dry-compiles and loads the ISAs' extension checks
    (AVX512-BF16, VNNI, AMX tiles, AMX-FP16: six builds of ~0.25 s in a new compile cache).
    The record keeps their answers too, each under its ISA, flags and program, and the
    ISA objects' ``check_build`` answers from it (a check it does not hold still builds)."""
    if os.environ.get("TORCHINDUCTOR_VEC_ISA_OK") is not None or sys.platform != "linux" \
            or platform.machine() != "x86_64":
        return False
    try:
        from torch._inductor import config, cpu_vec_isa
        listed = cpu_vec_isa.valid_vec_isa_list
        key = _isa_key()
    except (ImportError, AttributeError):  # pragma: no cover - another torch layout: leave the probe on
        return False
    if config.cpp.vec_isa_ok is not None:
        return config.cpp.vec_isa_ok is True
    path = os.path.join(use_compile_cache(), "steersman-vec-isa", f"{key}.json")
    record = _read_isa_record(path)
    if record is None:
        with contextlib.ExitStack() as stack:
            with contextlib.suppress(OSError):  # another process probing (a compile-ahead child): wait for its record
                os.makedirs(os.path.dirname(path), exist_ok=True)
                from torch.utils._filelock import FileLock

                stack.enter_context(FileLock(f"{path}.lock", timeout=120))
            record = _read_isa_record(path)
            if record is None:
                record = _probe_and_record(cpu_vec_isa, listed, config, path)
    if not record["probed"] or record["probed"] != record["listed"]:
        return False
    config.cpp.vec_isa_ok = True
    listed.cache_clear()
    _answer_checks(cpu_vec_isa, record["checks"])
    return True


def _check_key(isa: Any, code: str) -> str:
    """What an ISA's ``check_build(code)`` depends on besides the machine's key: the ISA,
    its flags at the call and the program."""
    return f"{isa}|{isa.build_arch_flags()}|{hashlib.sha256(code.encode()).hexdigest()}"


def _answer_checks(cpu_vec_isa: Any, checks: dict[str, bool]) -> None:
    """Each ISA's ``check_build`` (an instance attribute in front of the method) answers
    the checks in ``checks``; others still build."""
    for isa in cpu_vec_isa.supported_vec_isa_list:
        if "check_build" in vars(isa):  # (answered already)
            continue

        def check_build(code: str, isa: Any = isa, build: Any = isa.check_build) -> bool:
            answer = checks.get(_check_key(isa, code))
            return build(code) if answer is None else answer

        isa.check_build = check_build


@contextlib.contextmanager
def _recording_checks(cpu_vec_isa: Any) -> Any:
    """Yields a dict that collects the answers of every ISA's ``check_build`` in the block
    (under :func:`_check_key`)."""
    checks: dict[str, bool] = {}
    before = [(isa, vars(isa).get("check_build")) for isa in cpu_vec_isa.supported_vec_isa_list]
    for isa, _ in before:
        def check_build(code: str, isa: Any = isa, build: Any = isa.check_build) -> bool:
            checks[_check_key(isa, code)] = answer = bool(build(code))
            return answer

        isa.check_build = check_build
    try:
        yield checks
    finally:
        for isa, answering in before:  # (back to the method, or to the answers of a record)
            if answering is None:
                del isa.check_build
            else:
                isa.check_build = answering


def _read_isa_record(path: str) -> dict | None:
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and {"probed", "listed", "checks"} <= record.keys() else None


def _probe_and_record(cpu_vec_isa: Any, listed: Any, config: Any, path: str) -> dict:
    """Inductor's probe (once per machine), and what the CPU's flags list, recorded at ``path``."""
    listed.cache_clear()
    with _recording_checks(cpu_vec_isa) as checks:
        _probe_in_parallel(cpu_vec_isa)
        probed = [str(isa) for isa in listed()]  # inductor's own probe (answered above)
        with config.patch({"cpp.vec_isa_ok": True}):
            listed.cache_clear()
            unprobed = [str(isa) for isa in listed()]
    listed.cache_clear()
    record = {"probed": probed, "listed": unprobed, "checks": checks}
    with contextlib.suppress(OSError):  # a read-only cache: probe again next time
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_json_atomic(path, record)
    return record


def _probe_in_parallel(cpu_vec_isa: Any) -> None:
    """Runs inductor's probe of each vector ISA the CPU lists (a compile of ATen's vector
    headers and a load in a child Python per ISA, ~7 s in all here) in threads, so that the
    compilers share the cores; each ISA object caches its answer, which
    ``valid_vec_isa_list`` then reads. Any failure leaves the probe to inductor."""
    from concurrent.futures import ThreadPoolExecutor

    with contextlib.suppress(Exception):
        flags = cpu_vec_isa.x86_isa_checker()
        listed = [isa for isa in cpu_vec_isa.supported_vec_isa_list if all(f in flags for f in str(isa).split())]
        with ThreadPoolExecutor(max(1, min(len(listed), os.cpu_count() or 1))) as pool:
            list(pool.map(bool, listed))


#: inductor's options for the fused graphs. ``cpp_wrapper``: the graph's wrapper -- the
#: calls of its kernels and, inside a ``scan`` (lowered to a while loop), the loop itself
#: and the per-iteration buffer allocations -- is generated as C++ instead of Python. The
#: scan bodies run 20 times (the update) and ``n_steps`` times (the rollout) per call,
#: so their Python wrapper was a large share of the graphs' time (see
#: benchmarks/README.md, issue 17 session 11). It costs a longer cold compile (one more
#: C++ file per graph); warm starts load the cached ``.so``.
INDUCTOR_OPTIONS: dict[str, Any] = {"cpp_wrapper": True}
#: What the graphs that train (the fused PPO update) add to :data:`INDUCTOR_OPTIONS`:
#: ``tanh(x)`` as ``2 / (1 + exp(-2x)) - 1`` (inductor's ``cpp.use_decompose_tanh``; within
#: ~1.5e-7 of ``tanh``). Inductor's vectorized ``tanh`` costs 3-4x ATen's here. Not for the
#: rollout: its actions equal the eager policy's bit for bit.
TRAIN_OPTIONS: dict[str, Any] = {**INDUCTOR_OPTIONS, "cpp.use_decompose_tanh": True}


#: g++'s optimisation level for the C++ of the graphs compiled here, in place of inductor's
#: ``-O3`` (``STEERSMAN_CPP_OPT`` overrides it, e.g. ``O3``). The kernels are vectorized by
#: inductor itself (``at::vec``), so ``-O3``'s extra passes buy nothing at run time, while
#: they cost most of the compile: the fused PPO update's C++ (wrapper and 30 kernels, one
#: file) takes g++ 10.6 s at ``-O3``, 4.4 s at ``-O2``, 3.6 s at ``-O1``, and the update
#: runs 0.245 / 0.236 / 0.341 ms (benchmarks/README.md, issue 17 session 14).
CPP_OPT_LEVEL = "O2"
_LEVELS: list[str] = []  # the active levels of :func:`cpp_opt_level`, innermost last


@contextlib.contextmanager
def cpp_opt_level(level: str | None = None) -> Any:
    """Inductor's C++ builds inside this block (and in children forked inside it) use
    ``-O<level>`` instead of ``-O3`` (None: ``STEERSMAN_CPP_OPT`` or :data:`CPP_OPT_LEVEL`).
    The flags are part of inductor's command line, hence of its cache keys: a build at
    another level is another cache entry.

    >>> with cpp_opt_level("O2"):
    ...     out = torch.compile(lambda x: x.sin() + 1)(torch.ones(3))  # its C++ built at -O2
    """
    level = level or _opt_level()
    if not re.fullmatch(r"O[0-3s]", level):
        raise ValueError(f"STEERSMAN_CPP_OPT / cpp_opt_level: expected one of O0, O1, O2, O3, Os; got {level!r}")
    _install_opt_level()
    _LEVELS.append(level)
    try:
        yield
    finally:
        _LEVELS.pop()


def _opt_level() -> str:
    return os.environ.get("STEERSMAN_CPP_OPT") or CPP_OPT_LEVEL


@functools.cache
def _install_opt_level() -> None:
    """Wraps inductor's ``cpp_builder._get_optimization_cflags`` (where its ``-O3`` comes
    from) so that it yields the active :func:`cpp_opt_level`; outside one it is unchanged.
    Another torch layout: nothing is wrapped and the builds stay at ``-O3``."""
    try:
        from torch._inductor import cpp_builder
        original = cpp_builder._get_optimization_cflags
    except (ImportError, AttributeError):  # pragma: no cover - another torch: inductor's flags
        return

    @functools.wraps(original)
    def optimization_cflags(*args: Any, **kwargs: Any) -> Any:
        cflags, ldflags = original(*args, **kwargs)
        if _LEVELS:
            cflags = [_LEVELS[-1] if flag == "O3" else flag for flag in cflags]
        return cflags, ldflags

    cpp_builder._get_optimization_cflags = optimization_cflags
    _install_wrapper_build()


#: The header precompiled for the graphs' C++ (see :func:`_install_wrapper_build`): inductor's
#: C++-wrapper header and its kernels' prefix, which it would otherwise precompile alone and
#: parse from text in every graph's file.
WRAPPER_AND_PREFIX_HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "inductor_cpu.h")


def _install_wrapper_build() -> None:
    """Makes inductor's C++-wrapper builds (one ``.cpp`` per graph: the wrapper, then the
    kernels) cheaper inside :func:`cpp_opt_level`, for CPU graphs; another torch layout:
    nothing changes.

    - The precompiled header holds the kernels' prefix (``cpp_prefix.h``: ATen's vector
      types) as well as the wrapper's header, so g++ no longer parses the prefix from text
      in each file (:data:`WRAPPER_AND_PREFIX_HEADER`, built once per machine and flags
      like inductor's own).
    - The wrapper function (the calls of the kernels, the scans' loops: no arithmetic on
      values) is optimised at ``-O1`` (``__attribute__((optimize("O1")))``), as inductor
      builds a wrapper compiled apart from its kernels; the kernels keep the level of
      :func:`cpp_opt_level`. (A ``#pragma GCC optimize`` region around the wrapper instead
      changed the kernels' code after its ``pop_options``: the update ran 40% slower.)

    The fused PPO update's file: g++ 3.8 s -> 2.3 s here, the update as fast, training bit for
    bit the same (benchmarks/README.md, issue 17 session 16)."""
    try:
        from torch._inductor.codecache import CppWrapperCodeCache
        original_header = CppWrapperCodeCache._get_uncompiled_header
        original_load = CppWrapperCodeCache.load_async
    except (ImportError, AttributeError):  # pragma: no cover - another torch: inductor's builds
        return
    if not os.path.isfile(WRAPPER_AND_PREFIX_HEADER):  # pragma: no cover - a broken install
        return

    def uncompiled_header(cls: Any, device: str) -> str | None:
        if _LEVELS and device == "cpu" \
                and original_header(device) == "torch/csrc/inductor/cpp_wrapper/cpu.h":
            return WRAPPER_AND_PREFIX_HEADER
        return original_header(device)

    def load_async(cls: Any, main_code: str, device_type: str = "cpu", *args: Any, **kwargs: Any) -> Any:
        if _LEVELS and device_type == "cpu" and _LEVELS[-1] in ("O2", "O3"):
            main_code = _wrapper_at_o1(main_code)
        return original_load(main_code, device_type, *args, **kwargs)

    CppWrapperCodeCache._get_uncompiled_header = classmethod(uncompiled_header)
    CppWrapperCodeCache.load_async = classmethod(load_async)


_ENTRY = "\nvoid inductor_entry_impl("


def _wrapper_at_o1(code: str) -> str:
    """``code`` (a C++-wrapper graph's file) with its wrapper function (the calls of the
    kernels) optimised at ``-O1``; unchanged if it has none."""
    return code.replace(_ENTRY, '\n__attribute__((optimize("O1"))) void inductor_entry_impl(', 1)


class _AtOptLevel:
    """``fn`` (a ``torch.compile`` result) whose calls, and so its compiles, run under
    :func:`cpp_opt_level`."""

    def __init__(self, fn: Any) -> None:
        self._fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with cpp_opt_level():
            return self._fn(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "_fn":  # (not set yet: a copy being made)
            raise AttributeError(name)
        return getattr(self._fn, name)


def compile_options(backend: Any, options: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``options`` for ``torch.compile``: None for a backend other than inductor
    (they are inductor's), else ``options`` (None: :data:`INDUCTOR_OPTIONS`)."""
    if backend != "inductor":
        if options:
            raise ValueError(f"compile options {sorted(options)} are inductor's; the backend is {backend!r}")
        return None
    return dict(INDUCTOR_OPTIONS if options is None else options)


def _compile(fn: Any, backend: Any, options: dict[str, Any] | None = None) -> Any:
    """``fn`` compiled ``fullgraph=True, dynamic=False`` with the on-disk caches and, under
    inductor, :data:`INDUCTOR_OPTIONS` and the remembered ISA probe; a bound method under
    inductor is a :class:`Precompiled` (saved and loaded whole) unless
    ``STEERSMAN_PRECOMPILE=0``."""
    use_compile_cache()
    if backend == "inductor":
        if os.environ.get("STEERSMAN_PRECOMPILE", "1") != "0" and getattr(fn, "__self__", None) is not None:
            return Precompiled(fn, options)  # (it probes the ISA only if it compiles)
        remember_vec_isa()
    compiled = torch.compile(fn, fullgraph=True, dynamic=False, backend=backend,
                             options=compile_options(backend, options))
    return _AtOptLevel(compiled) if backend == "inductor" else compiled


def _precompiled_dir() -> str:
    return os.path.join(use_compile_cache(), "steersman-precompiled")


@functools.cache
def _source_hash() -> str:
    """A hash of steersman's own sources (every ``.py`` of the package): a graph traced from
    other code is another graph."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            digest.update(os.path.relpath(path, root).encode())
            with open(path, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


def _describe(value: Any) -> Any:
    """What of ``value`` a traced graph depends on: a tensor's metadata (not its values, which
    are the graph's inputs), a number's value, a module's architecture, a function's or an
    object's qualified name."""
    if isinstance(value, Tensor):
        return ["tensor", list(value.shape), list(value.stride()), str(value.dtype), str(value.device),
                value.requires_grad]
    if isinstance(value, (tuple, list)):
        return [type(value).__name__, [_describe(v) for v in value]]
    if isinstance(value, dict):
        return ["dict", [[repr(k), _describe(v)] for k, v in value.items()]]
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device)):
        return repr(value)
    if isinstance(value, nn.Module):
        return repr(value)
    kind = value if isinstance(value, type) or callable(value) and not hasattr(value, "__dict__") else type(value)
    return f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', repr(kind))}"


class Precompiled:
    """A fused graph (a bound method, compiled ``fullgraph=True, dynamic=False`` by inductor)
    saved whole and loaded in later processes, skipping dynamo's trace and AOTAutograd.

    Its file is found in two steps under :func:`_precompiled_dir`. The *structure key* hashes
    what makes the graph apart from numbers: the method, its object's attributes (module
    architectures, functions' and classes' names, tensors' shapes; numbers left out), the
    arguments' shapes, strides and dtypes, steersman's sources, torch's version and
    inductor's config, the options, the CPU (the ISA key of :func:`remember_vec_isa`) and
    Python. A small index under that key lists the object's numbers the trace read (the
    constants dynamo guards, e.g. ``self.gamma`` or the env's ``tau``); the file's name adds
    their current values. So a run with another ``total_frames`` loads the same graph, one
    with another ``gamma`` compiles its own.

    A file found is loaded with ``torch.compiler.load_compiled_function`` and used only if
    dynamo's saved guards (tensors' metadata and the constants read) pass on these
    arguments. Otherwise the method is compiled with ``torch.compile(...).aot_compile`` and
    saved (a temporary file, renamed). Any failure on the way (a torch without precompile, a
    guard that cannot be saved, an unreadable file) falls back to the ordinary
    ``torch.compile``. Later calls skip the guards (as :func:`_stance` does).

    **AOTInductor packages.** Once a graph has been loaded or saved this way, it is also
    exported (``make_fx`` then ``torch.export``, in a forked child) and compiled by
    AOTInductor into a ``.pt2`` package. The package is kept only if, run on the first
    call's arguments and random state, it returns the compiled graph's outputs bit for bit
    and with the same strides. Its key is computed without dynamo or inductor (the
    structure key's parts, with the ``TORCHINDUCTOR_*`` environment in place of inductor's
    in-process config and the CPU's flags in place of the ISA probe), and the numbers the
    graph reads name the file as above. A later process finds it first and runs it with
    ``torch._C._aoti.AOTIModelPackageLoader``: no dynamo or inductor import, no guards.
    Building one costs an AOTInductor compile per graph (10-25 s CPU), once per key.
    ``STEERSMAN_PRECOMPILE=dynamo`` keeps to torch's precompile.

    Trust: a saved function is a pickle (as torch's own FX-graph and AOTAutograd cache
    entries in the same directory are) holding compiled kernels; loading it runs what it
    holds. It is read only from the compile cache directory (torch's trust boundary too),
    and only if the current user owns it and neither group nor others may write it.
    ``STEERSMAN_PRECOMPILE=0`` turns it off (plain ``torch.compile``). Packages are read
    under the same rules.
    """

    def __init__(self, fn: Any, options: dict[str, Any] | None = None) -> None:
        self._fn, self._owner, self._options = fn, fn.__self__, compile_options("inductor", options)
        self._compiled: Any = None
        #: after the first call: "loaded", "saved", "compiled-unsaved" or "compiled" (plain torch.compile)
        self.source: str | None = None
        self.path: str | None = None
        self._reads: list[str] = []
        self._out_spec: Any = None  # the package's output structure
        self._ahead: int | None = None  # the pid of a child compiling this graph (compile_ahead)
        self._before_compile: list[Any] = []  # run once if the first call compiles (compile_ahead's when=)

    def __call__(self, *args: Any) -> Any:
        if self._compiled is None:
            return self._first_call(args)
        if self.source == "package":
            return self._run_package(args)
        if self.source == "compiled":
            return self._compiled(*args)
        return self._compiled(self._owner, *args)

    def _run_package(self, args: tuple) -> Any:
        flat = torch.utils._pytree.tree_leaves(args)
        return torch.utils._pytree.tree_unflatten(self._compiled.run(flat), self._out_spec)

    def structure_key(self, args: tuple) -> str:
        """The key of everything but the object's numbers, for a call with ``args``."""
        from torch._inductor import config

        owner = {k: _describe(v) for k, v in sorted(vars(self._owner).items())
                 if not isinstance(v, (bool, int, float, str)) and v is not None}
        parts = [self._fn.__qualname__, _describe(self._owner), owner, _describe(args), _source_hash(),
                 torch.__version__, torch.__file__, sys.version, repr(sorted(self._options.items())),
                 repr(sorted(config.save_config_portable().items())), _isa_key(), torch.is_grad_enabled(),
                 _opt_level()]
        return hashlib.sha256(json.dumps(parts, default=repr).encode()).hexdigest()

    def _file(self, key: str, reads: list[str], suffix: str = ".bin") -> str:
        """The file of ``key`` (a structure or package key) and the current values of the
        numbers ``reads`` names (``.bin``: torch's precompile, ``.pt2``: a package)."""
        values = [[path, repr(_resolve(self._owner, path))] for path in reads]
        name = hashlib.sha256(json.dumps([key, values]).encode()).hexdigest()
        return os.path.join(_precompiled_dir(), f"{name}{suffix}")

    def _first_call(self, args: tuple) -> Any:
        package_key = None
        with contextlib.suppress(Exception):  # any failure: the graph of dynamo's precompile below
            if os.environ.get("STEERSMAN_PRECOMPILE", "1") != "dynamo":
                package_key = _package_key(self._fn, self._owner, args, self._options)
                if self._load_package(package_key, args):
                    if self._ahead is not None:  # (its work is moot)
                        _kill_build(self._ahead, _AHEAD)
                    return self._run_package(args)
        while self._before_compile:  # (no package: this call compiles, or loads dynamo's file)
            self._before_compile.pop(0)()
        if self._ahead is not None:  # it compiles this graph: wait, then load what it saved
            _reap(self._ahead, block=True, jobs=_AHEAD)
        rng = torch.get_rng_state()  # (the package built below reruns this first call)
        out = self._compiled_call(args)
        if _BUILD_PACKAGES and package_key is not None and self.source in ("loaded", "saved"):
            with contextlib.suppress(Exception):  # the graph stays dynamo's
                self._build_package(package_key, args, out, rng, wait=False)
        return out

    def _compiled_call(self, args: tuple) -> Any:
        with cpp_opt_level():
            return self._compiled_call_at_level(args)

    def _compiled_call_at_level(self, args: tuple) -> Any:
        remember_vec_isa()
        try:
            structure = self.structure_key(args)
            index = os.path.join(_precompiled_dir(), f"{structure}.json")
            fn = None
            with contextlib.suppress(OSError, ValueError, TypeError, AttributeError, IndexError, KeyError):
                with open(index) as f:
                    self._reads = [str(r) for r in json.load(f)["reads"]]
                self.path = self._file(structure, self._reads)
                fn = self._load(args)
            if fn is None:
                fn = self._aot_compile(args, structure, index)
        except Exception:  # noqa: BLE001 - any failure of the experimental path: the ordinary compile
            fn = None
        if fn is None:
            self.source, self._compiled = "compiled", torch.compile(
                self._fn, fullgraph=True, dynamic=False, backend="inductor", options=self._options)
            return self._compiled(*args)
        out = fn(self._owner, *args)
        fn.disable_guard_check()
        self._compiled = fn
        return out

    def _load(self, args: tuple) -> Any:
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        if info.st_uid != os.getuid() or info.st_mode & 0o022:
            return None
        try:
            # unpickling the guards' sources installs guards, which needs a tracing context
            with open(self.path, "rb") as f, torch._guards.tracing(torch._guards.TracingContext(None)):
                fn = torch.compiler.load_compiled_function(f, external_data={"owner": self._owner})
            if not fn.guard_check(self._owner, *args):
                return None
        except Exception:  # noqa: BLE001 - a stale or foreign file: compile again
            return None
        self.source = "loaded"
        return fn

    def _aot_compile(self, args: tuple, structure: str, index: str) -> Any:
        read: set[str] = set()
        compiled = torch.compile(self._fn, fullgraph=True, dynamic=False, backend="inductor",
                                 options={**self._options, "guard_filter_fn": functools.partial(_savable_guards,
                                                                                                 read=read)})
        fn = compiled.aot_compile((args, {}))
        self.source = "compiled-unsaved"
        reads = sorted(read | set(self._reads))  # (an older index's entries too: its files stay reachable)
        self._reads = reads
        with contextlib.suppress(OSError, RuntimeError, pickle.PicklingError, AttributeError, IndexError,
                                 KeyError, TypeError):  # used here even if not saved
            self.path = self._file(structure, reads)
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            tmp = f"{self.path}.{os.getpid()}.tmp"  # (renamed whole: a process killed mid-write leaves no half file)
            try:
                fn.save_compiled_function(tmp, external_data={"owner": self._owner})
                os.replace(tmp, self.path)
            finally:
                with contextlib.suppress(OSError):
                    os.remove(tmp)
            write_json_atomic(index, {"reads": reads})
            self.source = "saved"
        return fn

    # ------------------------------------------------------------ the AOTInductor package
    def _load_package(self, key: str, args: tuple) -> bool:
        """Loads the graph's AOTInductor package if one was saved for ``key`` and the
        object's current numbers (torch's C++ loader: no dynamo or inductor import)."""
        with open(os.path.join(_precompiled_dir(), f"{key}.aoti.json")) as f:
            index = json.load(f)
        self._reads = [str(r) for r in index["reads"]]
        out_spec = torch.utils._pytree.treespec_loads(index["outputs"])  # (the compiled graph's structure)
        path = self._file(key, self._reads, ".pt2")
        info = os.stat(path)
        if info.st_uid != os.getuid() or info.st_mode & 0o022:
            return False
        loader = torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, -1)
        in_spec, outputs = (torch.utils._pytree.treespec_loads(spec) for spec in loader.get_call_spec())
        if in_spec.num_leaves != len(torch.utils._pytree.tree_leaves(args)) or outputs.num_leaves != out_spec.num_leaves:
            return False
        self._compiled, self._out_spec, self.path, self.source = loader, out_spec, path, "package"
        return True

    def _build_package(self, key: str, args: tuple, out: Any, rng: Tensor, *, wait: bool = True) -> str | None:
        """Saves this graph as an AOTInductor package for later processes, if its output on
        the first call's ``args`` (with the first call's random state ``rng``) is ``out``'s,
        bit for bit and layout for layout. A forked child does all of it (export, compile,
        the check, the rename); ``wait=False`` leaves it running beside the training (see
        :func:`wait_for_packages`). Returns why not (None: saved, or started)."""
        flat, spec = torch.utils._pytree.tree_flatten(args)
        if not all(isinstance(t, Tensor) and not t.requires_grad for t in flat):
            return "an argument is not a tensor or requires grad"  # (a package's outputs carry no autograd)
        want, out_spec = torch.utils._pytree.tree_flatten(out)
        path = self._file(key, self._reads, ".pt2")
        index = os.path.join(_precompiled_dir(), f"{key}.aoti.json")
        options = {k: v for k, v in self._options.items() if k != "cpp_wrapper"}  # (AOTInductor's is C++)
        job = functools.partial(_package_job, self._fn, spec, flat, options, path, index, self._reads, want,
                                torch.utils._pytree.treespec_dumps(out_spec), rng)
        if not _in_child(job, wait=wait, nice=0 if wait else 10):  # (beside the training: behind it)
            return "export, AOTInductor or the bitwise check failed"
        return None


def _package_job(fn: Any, spec: Any, flat: list[Tensor], options: dict[str, Any], path: str, index: str,
                 reads: list[str], want: list[Tensor], out_spec: str, rng: Tensor) -> None:
    """(In the package-building child.) Exports and compiles ``fn`` to a temporary package,
    runs it on the first call's ``flat`` arguments with random state ``rng``, and publishes
    it (mode 0600, renamed into ``path``, then its ``index``) only if it returns ``want`` bit
    for bit; raises otherwise."""
    tmp = f"{path[:-4]}.{os.getpid()}.tmp.pt2"
    _remove_stale_builds(os.path.dirname(path))
    try:
        _compile_package(fn, spec, flat, tmp, options)
        loader = torch._C._aoti.AOTIModelPackageLoader(tmp, "model", False, 1, -1)
        before = torch.get_rng_state()
        torch.set_rng_state(rng)
        try:
            got = loader.run(flat)
        finally:
            torch.set_rng_state(before)
        if len(got) != len(want) or not all(_same(a, b) for a, b in zip(got, want)):
            raise RuntimeError("the package's outputs differ from the compiled graph's")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.remove(tmp)
    write_json_atomic(index, {"reads": reads, "outputs": out_spec})


def _remove_stale_builds(folder: str) -> list[str]:
    """Removes the temporary packages (``<name>.<pid>.tmp.pt2``) in ``folder`` whose builder
    is gone: a build killed with its parent (``kill -9``: the child gets ``SIGKILL`` too, so
    its own clean-up never runs). Returns the paths removed."""
    removed = []
    for tmp in glob.glob(os.path.join(glob.escape(folder), "*.tmp.pt2")):
        try:
            pid = int(tmp.rsplit(".", 3)[-3])
            os.kill(pid, 0)
        except ValueError:  # (not one of ours)
            continue
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                os.remove(tmp)
                removed.append(tmp)
        except PermissionError:  # (a live process of another user)
            continue
    return removed


def _compile_package(fn: Any, spec: Any, flat: list[Tensor], path: str, options: dict[str, Any]) -> None:
    from torch._inductor import aoti_compile_and_package

    with cpp_opt_level():
        aoti_compile_and_package(_export_flat(fn, spec, flat), package_path=path, inductor_configs=options)


#: package-building children still running: pid -> deadline (time.monotonic())
_BUILDING: dict[int, float] = {}


def _in_child(work: Any, timeout: float = 600.0, *, wait: bool = True, nice: int = 0,
              jobs: dict[int, float] | None = None) -> bool:
    """Runs ``work()`` in a forked child (Linux) and returns whether it succeeded, or, with
    ``wait=False``, whether it started (the child then runs beside the caller until
    :func:`wait_for_packages`, at the latest at exit).

    Tracing for export leaves state behind in torch 2.13: after the rollout's trace, the
    update's export fails ("missing val"), and the trace patches a dynamo helper while it
    runs. A child keeps all of that out of the training process. The child dies with its
    parent (``PR_SET_PDEATHSIG``), compiles in-process (no compile-worker pool shared with
    the parent) on one thread (no OpenMP pool after a fork), at ``nice`` (added to the
    parent's), and is killed after ``timeout``. It is registered in ``jobs`` (default:
    :data:`_BUILDING`, the package builds)."""
    if sys.platform != "linux":
        return False
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child (its coverage is not collected)
        code = 1
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
            if os.getppid() != parent:  # (the parent died before prctl)
                os._exit(1)
            if nice:
                os.nice(nice)
            torch.set_num_threads(1)
            os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
            if "torch._inductor.config" in sys.modules:
                sys.modules["torch._inductor.config"].compile_threads = 1
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                work()
            code = 0
        finally:
            os._exit(code)
    jobs = _BUILDING if jobs is None else jobs
    jobs[pid] = time.monotonic() + timeout
    if not wait:
        return True
    return _reap(pid, block=True, jobs=jobs)


def _reap(pid: int, *, block: bool, jobs: dict[int, float] | None = None) -> bool:
    """Waits for (``block``) or polls one child of :func:`_in_child` registered in ``jobs``
    (default :data:`_BUILDING`); True if it exited with 0. A child past its deadline is
    killed; one no longer registered (reaped already) gives False."""
    jobs = _BUILDING if jobs is None else jobs
    while True:
        if pid not in jobs:
            return False
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # (not ours: a forked copy of the process that started it)
            jobs.pop(pid, None)
            return False
        if done:
            jobs.pop(pid, None)
            return os.waitstatus_to_exitcode(status) == 0
        if time.monotonic() > jobs[pid]:
            _kill_build(pid, jobs)
            return False
        if not block:
            return False
        time.sleep(0.05)


def wait_for_packages(*, quiet: bool = True) -> int:
    """Waits for the AOTInductor packages still being built beside the training (each
    :class:`Precompiled` graph starts one after its first compile) and returns how many
    were saved. Called at exit, so a cold run leaves its packages for the next one."""
    pids = list(_BUILDING)
    if pids and not quiet:
        print(f"steersman: finishing {len(pids)} AOTInductor package(s) for the next run's warm start "
              "(Ctrl-C skips them; STEERSMAN_PRECOMPILE=dynamo never builds them)", file=sys.stderr, flush=True)
    saved = 0
    try:
        for pid in pids:
            saved += _reap(pid, block=True)
    except KeyboardInterrupt:  # skipped: the builds are dropped (their temporary files with them)
        for pid in list(_BUILDING):
            _kill_build(pid)
    return saved


def _kill_build(pid: int, jobs: dict[int, float] | None = None) -> None:
    """Kills a child of :func:`_in_child` (registered in ``jobs``, default :data:`_BUILDING`)
    and removes its temporary files."""
    jobs = _BUILDING if jobs is None else jobs
    if jobs.pop(pid, None) is None:  # (reaped already: the pid may be another process's now)
        return
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    for leftover in glob.glob(os.path.join(_precompiled_dir(), f"*.{pid}.tmp*")):
        with contextlib.suppress(OSError):
            os.remove(leftover)


atexit.register(functools.partial(wait_for_packages, quiet=False))

#: compile-ahead children (:func:`compile_ahead`) still running: pid -> deadline
_AHEAD: dict[int, float] = {}
#: False in a compile-ahead child: it saves its graph; the packages are the parent's to build
_BUILD_PACKAGES = True


def compile_ahead(graph: Any, first_call: Any, *, when: Any = None) -> bool:
    """Compiles ``graph`` (a :class:`Precompiled`) in a forked child while this process goes
    on (e.g. compiling the graphs whose outputs are ``graph``'s arguments): the child runs
    ``first_call()``, which must call ``graph`` once with arguments laid out as the first
    real call's (the same shapes, strides and dtypes; the values do not matter), and so
    compiles and saves it. ``graph``'s first call here then loads that file, waiting for the
    child if it is still at it. A package found for that call makes the child's work moot:
    it is killed. With ``when`` (another :class:`Precompiled`, not called yet) the child
    starts only when ``when``'s first call finds no package (a cold cache), just before that
    call compiles: a warm start forks nothing.

    The child runs on its copy of the process (its random state, envs and parameters), so
    nothing it does changes this process's numbers, and a file it saved is used only if it
    matches the call (the usual keys and guards; otherwise the graph compiles here). Returns
    whether a child started or is scheduled (Linux; never with ``STEERSMAN_PRECOMPILE=0``)."""
    if not isinstance(graph, Precompiled) or graph._compiled is not None or graph._ahead is not None \
            or os.environ.get("STEERSMAN_PRECOMPILE", "1") == "0":
        return False
    grad = torch.is_grad_enabled()  # (the child may start inside ``when``'s call, e.g. under no_grad)
    if isinstance(when, Precompiled) and when._compiled is None:
        when._before_compile.append(functools.partial(_start_ahead, graph, first_call, grad))
        return True
    return _start_ahead(graph, first_call, grad)


def _start_ahead(graph: Precompiled, first_call: Any, grad: bool) -> bool:
    """Forks :func:`compile_ahead`'s child: ``first_call()`` with grad mode ``grad`` (the
    caller's when it asked) and no package builds."""
    def work() -> None:
        global _BUILD_PACKAGES
        _BUILD_PACKAGES = False
        with torch.set_grad_enabled(grad):
            first_call()

    if graph._compiled is not None or graph._ahead is not None or not _in_child(work, wait=False, jobs=_AHEAD):
        return False
    graph._ahead = next(reversed(_AHEAD))
    return True


def _drop_ahead() -> None:
    for pid in list(_AHEAD):  # (optional work: never waited for at exit)
        _kill_build(pid, _AHEAD)


atexit.register(_drop_ahead)


def _same(a: Tensor, b: Tensor) -> bool:
    """Bit for bit, with the same layout (a package's outputs are the next call's inputs)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and \
        bool((a.view(-1) if a.is_contiguous() else a.reshape(-1)).view(torch.uint8).equal(
            (b.view(-1) if b.is_contiguous() else b.reshape(-1)).view(torch.uint8)))


def _cpu_key() -> list:
    """The CPU a package's kernels were built for: the machine and its flags."""
    flags: list[str] = []
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            flags = sorted(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    return [platform.machine(), flags]


def _package_key(fn: Any, owner: Any, args: tuple, options: dict[str, Any]) -> str:
    """The key of a graph's AOTInductor package, computed without importing dynamo or
    inductor: :meth:`Precompiled.structure_key`'s parts less inductor's in-process config
    (its ``TORCHINDUCTOR_*`` environment instead) and with the CPU's flags for the ISA key."""
    attrs = {k: _describe(v) for k, v in sorted(vars(owner).items())
             if not isinstance(v, (bool, int, float, str)) and v is not None}
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("TORCHINDUCTOR_"))
    parts = ["aoti", fn.__qualname__, _describe(owner), attrs, _describe(args), _source_hash(), torch.__version__,
             torch.__file__, sys.version, repr(sorted(options.items())), env, _cpu_key(), torch.is_grad_enabled(),
             _opt_level()]
    return hashlib.sha256(json.dumps(parts, default=repr).encode()).hexdigest()


def _export_flat(fn: Any, spec: Any, flat: list[Tensor]) -> Any:
    """``fn`` on the leaves ``flat`` (of ``spec``) as an exported program of aten ops: traced
    by ``make_fx`` without grad mode (the scans stay loops: ``torch.compiler.is_compiling()``
    holds while it traces; ``torch.func.grad`` inside a scan traces to its backward ops),
    then exported."""
    from torch._dynamo import utils as dynamo_utils
    from torch.fx.experimental.proxy_tensor import make_fx

    def flat_fn(*leaves: Tensor) -> Any:
        return fn(*torch.utils._pytree.tree_unflatten(list(leaves), spec))

    # torch 2.13's scan tracing clones its closed-over tensors with dynamo's clone_input, which
    # reads data pointers and fails on a fake tensor: a plain clone has the same metadata
    clone_input = dynamo_utils.clone_input

    def clone(x: Tensor, *, dtype: Any = None) -> Tensor:
        try:
            return clone_input(x, dtype=dtype)
        except RuntimeError:
            return x.clone()

    # fresh copies (same layout): tensors traced before in this process (dynamo's compile, another
    # export) could leave their exported placeholders without metadata
    flat = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype).copy_(t) for t in flat]
    dynamo_utils.clone_input = clone
    try:
        with torch.no_grad(), torch.compiler._compile_session_context():
            graph = make_fx(flat_fn, tracing_mode="fake", _allow_non_fake_inputs=True)(*flat)
        return torch.export.export(graph, tuple(flat), strict=False)
    finally:
        dynamo_utils.clone_input = clone_input


_PATH_PART = re.compile(r"\.([A-Za-z_]\w*)|\[(\d+)\]")


def _resolve(owner: Any, path: str) -> Any:
    """The value at a guard's ``self.a.b[0]`` path, from ``owner`` (attributes and int indexes only)."""
    if not path.startswith("self"):
        raise KeyError(path)
    value, rest = owner, path[4:]
    while rest:
        m = _PATH_PART.match(rest)
        if m is None:
            raise KeyError(path)
        value = getattr(value, m.group(1)) if m.group(1) else value[int(m.group(2))]
        rest = rest[m.end():]
    if not isinstance(value, (bool, int, float, str, torch.dtype)) and value is not None:
        raise TypeError(f"{path} is not a constant")
    return value


def _savable_guards(entries: Any, read: set[str] | None = None) -> list[bool]:
    """The guards a saved function keeps: dynamo's own choice for precompile (no guards on
    globals or object identities), also leaving out those derived from an unsavable kind
    (pytree's registry: steersman's sources and torch's version are in the file's key).
    Adds to ``read`` the paths of the constants on ``self`` that the kept guards check."""
    from torch._dynamo.guards import CheckFunctionManager

    unsavable = set(CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES)
    keep = [not (g.is_global or g.guard_type in unsavable or unsavable & set(g.derived_guard_types))
            for g in entries]
    if read is not None:
        read.update(g.name for g, k in zip(entries, keep)
                    if k and g.guard_type in ("CONSTANT_MATCH", "EQUALS_MATCH") and g.name.startswith("self."))
    return keep
