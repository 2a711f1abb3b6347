"""Time TensorDict operations three ways in one process.

Columns:
  steersman   ``steersman.tensordict`` (this repo; importable from the checkout)
  floor       a plain nested ``dict`` of tensors doing the same work, written as the
              straightforward Python a user would write: the cost of the tensors alone
  tensordict  the ``tensordict`` package, when it is importable (the anchor)

Each operation is one small function ``op(d, lib)``: with ``lib=None`` it returns the
floor callable, otherwise the callable for that library (``steersman.tensordict`` or
``tensordict``, which share their public names). A column that fails to build or run
prints "n/a"; the others still run.

``--clock wall`` (default) times elapsed time; ``--clock cpu`` times the thread's CPU
time, which on a busy shared machine stays closer to what the code takes on an idle one
(it leaves out time spent waiting, e.g. on the disk for the memmap rows).

    python benchmarks/tensordict_ops.py [--quick] [--ops get,stack*] [--clock cpu] [--json out.json]
"""

from __future__ import annotations

import argparse
import fnmatch
import gc
import importlib
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the checkout's steersman

LIBS: dict[str, object] = {}
IMPORT_ERRORS: dict[str, str] = {}
for _col, _module in (("steersman", "steersman.tensordict"), ("tensordict", "tensordict")):
    try:  # an incomplete package still lets the other columns run
        LIBS[_col] = importlib.import_module(_module)
        LIBS[_col].TensorDict  # noqa: B018
    except Exception as err:
        LIBS.pop(_col, None)
        IMPORT_ERRORS[_col] = f"{type(err).__name__}: {err}"

COLUMNS = ("steersman", "floor", "tensordict")
B = 256


# --- data and the floor's helpers ----------------------------------------------------


def make_data() -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "obs": torch.randn(B, 4, generator=g),
        "action": torch.randn(B, 2, generator=g),
        "reward": torch.randn(B, 1, generator=g),
        "done": torch.rand(B, 1, generator=g) > 0.9,
        "next": {
            "obs": torch.randn(B, 4, generator=g),
            "reward": torch.randn(B, 1, generator=g),
        },
    }


def literal(d: dict) -> dict:
    """The dict literal a user writes to build a transition from its tensors."""
    n = d["next"]
    return {
        "obs": d["obs"],
        "action": d["action"],
        "reward": d["reward"],
        "done": d["done"],
        "next": {"obs": n["obs"], "reward": n["reward"]},
    }


def tmap(fn: Callable, d: dict) -> dict:
    return {k: tmap(fn, v) if isinstance(v, dict) else fn(v) for k, v in d.items()}


def tmap2(fn: Callable, a: dict, b: dict) -> dict:
    return {k: tmap2(fn, v, b[k]) if isinstance(v, dict) else fn(v, b[k]) for k, v in a.items()}


def tforeach2(fn: Callable, a: dict, b: dict) -> None:
    for k, v in a.items():
        if isinstance(v, dict):
            tforeach2(fn, v, b[k])
        else:
            fn(v, b[k])


def tjoin(fn: Callable, ds: list[dict]) -> dict:
    """Combine a list of same-structured dicts leaf by leaf (stack, cat)."""
    return {
        k: tjoin(fn, [x[k] for x in ds]) if isinstance(v, dict) else fn([x[k] for x in ds])
        for k, v in ds[0].items()
    }


def tsplit(fn: Callable, d: dict) -> list[dict]:
    """Split every leaf with ``fn`` (unbind, split) and regroup into a list of dicts."""
    parts = {k: tsplit(fn, v) if isinstance(v, dict) else fn(v) for k, v in d.items()}
    n = len(next(iter(parts.values())))
    return [{k: p[i] for k, p in parts.items()} for i in range(n)]


def tleaves(d: dict, prefix: tuple = ()):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from tleaves(v, prefix + (k,))
        else:
            yield prefix + (k,), v


def tsetitem(dst: dict, idx, src: dict) -> None:
    for k, v in dst.items():
        if isinstance(v, dict):
            tsetitem(v, idx, src[k])
        else:
            v[idx] = src[k]


def floor_memmap(d: dict, path: Path) -> dict:
    """Leaves to memory-mapped files, plus the metadata needed to load them back."""
    meta, out = {}, {}
    for key, v in tleaves(d):
        name = ".".join(key)
        m = torch.from_file(
            str(path / f"{name}.memmap"), shared=True, size=v.numel(), dtype=v.dtype
        )
        m = m.view(v.shape).copy_(v)
        meta[name] = [str(v.dtype).removeprefix("torch."), list(v.shape)]
        sub = out
        for k in key[:-1]:
            sub = sub.setdefault(k, {})
        sub[key[-1]] = m
    (path / "meta.json").write_text(json.dumps(meta))
    return out


def floor_load_memmap(path: Path) -> dict:
    out: dict = {}
    for name, (dtype, shape) in json.loads((path / "meta.json").read_text()).items():
        dt = getattr(torch, dtype)
        numel = 1
        for s in shape:
            numel *= s
        m = torch.from_file(str(path / f"{name}.memmap"), shared=True, size=numel, dtype=dt)
        *head, last = name.split(".")
        sub = out
        for k in head:
            sub = sub.setdefault(k, {})
        sub[last] = m.view(shape)
    return out


def make_td(lib, d: dict):
    return lib.TensorDict(literal(d), batch_size=[B])


# --- operations: op(d, lib) -> callable; lib=None is the floor -----------------------

OPS: dict[str, Callable] = {}
TMP = tempfile.TemporaryDirectory(prefix="steersman-bench-")


def op(name: str):
    def register(fn):
        OPS[name] = fn
        return fn

    return register


@op("construct")
def _(d, lib):
    if lib is None:
        return lambda: literal(d)
    return lambda: lib.TensorDict(literal(d), batch_size=[B])


@op("get")
def _(d, lib):
    if lib is None:
        return lambda: d["obs"]
    td = make_td(lib, d)
    return lambda: td["obs"]


@op("get nested")
def _(d, lib):
    if lib is None:
        return lambda: d["next"]["obs"]
    td = make_td(lib, d)
    return lambda: td["next", "obs"]


@op("set existing")
def _(d, lib):
    x = torch.randn(B, 4)
    if lib is None:

        def run():
            d["obs"] = x

        return run
    td = make_td(lib, d)

    def run():
        td["obs"] = x

    return run


@op("update 2")
def _(d, lib):
    new = {"obs": torch.randn(B, 4), "action": torch.randn(B, 2)}
    if lib is None:
        return lambda: d.update(new)
    td = make_td(lib, d)
    return lambda: td.update(new)


@op("select 2")
def _(d, lib):
    if lib is None:
        return lambda: {k: d[k] for k in ("obs", "action")}
    td = make_td(lib, d)
    return lambda: td.select("obs", "action")


@op("exclude 2")
def _(d, lib):
    if lib is None:
        return lambda: {k: v for k, v in d.items() if k not in ("obs", "action")}
    td = make_td(lib, d)
    return lambda: td.exclude("obs", "action")


@op("keys")
def _(d, lib):
    if lib is None:
        return lambda: list(d.keys())
    td = make_td(lib, d)
    return lambda: list(td.keys())


@op("keys nested leaves")
def _(d, lib):
    if lib is None:
        return lambda: [k for k, _ in tleaves(d)]
    td = make_td(lib, d)
    return lambda: list(td.keys(include_nested=True, leaves_only=True))


@op("index int")
def _(d, lib):
    if lib is None:
        return lambda: tmap(lambda x: x[3], d)
    td = make_td(lib, d)
    return lambda: td[3]


@op("index slice")
def _(d, lib):
    if lib is None:
        return lambda: tmap(lambda x: x[10:50], d)
    td = make_td(lib, d)
    return lambda: td[10:50]


@op("index tensor 64")
def _(d, lib):
    idx = torch.randperm(B, generator=torch.Generator().manual_seed(1))[:64]
    if lib is None:
        return lambda: tmap(lambda x: x[idx], d)
    td = make_td(lib, d)
    return lambda: td[idx]


@op("index mask")
def _(d, lib):
    mask = torch.rand(B, generator=torch.Generator().manual_seed(2)) > 0.5
    if lib is None:
        return lambda: tmap(lambda x: x[mask], d)
    td = make_td(lib, d)
    return lambda: td[mask]


@op("setitem tensor 64")
def _(d, lib):
    idx = torch.randperm(B, generator=torch.Generator().manual_seed(1))[:64]
    src = tmap(lambda x: x[:64].clone(), d)
    if lib is None:
        return lambda: tsetitem(d, idx, src)
    td, other = make_td(lib, d), lib.TensorDict(src, batch_size=[64])

    def run():
        td[idx] = other

    return run


@op("stack 8")
def _(d, lib):
    if lib is None:
        ds = [d] * 8
        return lambda: tjoin(torch.stack, ds)
    tds = [make_td(lib, d) for _ in range(8)]
    return lambda: torch.stack(tds, 0)


@op("lazy_stack 8")
def _(d, lib):
    if lib is None:
        ds = [d] * 8
        return lambda: list(ds)  # the floor of a lazy stack: keep the list
    tds = [make_td(lib, d) for _ in range(8)]
    return lambda: lib.lazy_stack(tds, 0)


@op("cat 8")
def _(d, lib):
    if lib is None:
        ds = [d] * 8
        return lambda: tjoin(torch.cat, ds)
    tds = [make_td(lib, d) for _ in range(8)]
    return lambda: torch.cat(tds, 0)


@op("unbind")
def _(d, lib):
    if lib is None:
        return lambda: tsplit(lambda x: x.unbind(0), d)
    td = make_td(lib, d)
    return lambda: td.unbind(0)


@op("split 64")
def _(d, lib):
    if lib is None:
        return lambda: tsplit(lambda x: x.split(64), d)
    td = make_td(lib, d)
    return lambda: td.split(64, 0)


@op("reshape 16x16")
def _(d, lib):
    if lib is None:
        return lambda: tmap(lambda x: x.reshape(16, 16, *x.shape[1:]), d)
    td = make_td(lib, d)
    return lambda: td.reshape(16, 16)


@op("unsqueeze 0")
def _(d, lib):
    if lib is None:
        return lambda: tmap(lambda x: x.unsqueeze(0), d)
    td = make_td(lib, d)
    return lambda: td.unsqueeze(0)


@op("permute 16x16")
def _(d, lib):
    if lib is None:
        r = tmap(lambda x: x.reshape(16, 16, *x.shape[1:]), d)
        return lambda: tmap(lambda x: x.transpose(0, 1), r)
    r = make_td(lib, d).reshape(16, 16)
    return lambda: r.permute(1, 0)


@op("apply x*2")
def _(d, lib):
    if lib is None:
        return lambda: tmap(lambda x: x * 2, d)
    td = make_td(lib, d)
    return lambda: td.apply(lambda x: x * 2)


@op("add td+td")
def _(d, lib):
    d = tmap(lambda x: x.float(), d)  # arithmetic on the float version of the data
    if lib is None:
        return lambda: tmap2(torch.add, d, d)
    td = make_td(lib, d)
    return lambda: td + td


@op("add_ in place")
def _(d, lib):
    d = tmap(lambda x: x.float(), d)
    other = tmap(torch.ones_like, d)
    if lib is None:
        return lambda: tforeach2(torch.Tensor.add_, d, other)
    td, tdo = make_td(lib, d), make_td(lib, other)
    return lambda: td.add_(tdo)


@op("clone")
def _(d, lib):
    if lib is None:
        return lambda: tmap(torch.clone, d)
    td = make_td(lib, d)
    return lambda: td.clone()


@op("to float64")
def _(d, lib):
    if lib is None:
        return lambda: tmap(lambda x: x.to(torch.float64), d)
    td = make_td(lib, d)
    return lambda: td.to(torch.float64)


@op("to cpu (no-op)")
def _(d, lib):
    if lib is None:
        return lambda: tmap(lambda x: x.to("cpu"), d)
    td = make_td(lib, d)
    return lambda: td.to("cpu")


@op("memmap write")
def _(d, lib):
    path = Path(tempfile.mkdtemp(dir=TMP.name))
    if lib is None:
        return lambda: floor_memmap(d, path)
    td = make_td(lib, d)
    return lambda: td.memmap(path)


@op("load_memmap")
def _(d, lib):
    path = Path(tempfile.mkdtemp(dir=TMP.name))
    if lib is None:
        floor_memmap(d, path)
        return lambda: floor_load_memmap(path)
    make_td(lib, d).memmap(path)
    return lambda: lib.TensorDict.load_memmap(path)


@op("flatten_keys")
def _(d, lib):
    if lib is None:
        return lambda: {".".join(k): v for k, v in tleaves(d)}
    td = make_td(lib, d)
    return lambda: td.flatten_keys()


@op("sum dim 0")
def _(d, lib):
    if lib is None:
        return lambda: tmap(lambda x: x.sum(0), d)
    td = make_td(lib, d)
    return lambda: td.sum(dim=0)


# --- timing --------------------------------------------------------------------------


def calibrate(fn: Callable, target_s: float) -> int:
    """Calls per measurement so that one measurement takes about ``target_s``."""
    fn()  # warm up; a failure here is the column's "n/a"
    n = 1
    while True:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        elapsed = time.perf_counter_ns() - t0
        if elapsed >= target_s * 1e9 * 0.5 or n >= 1_000_000:
            return n
        n = max(n * 2, int(n * target_s * 1e9 / max(elapsed, 1)))


def measure_us(fn: Callable, n: int, now: Callable[[], int] = time.perf_counter_ns) -> float:
    t0 = now()
    for _ in range(n):
        fn()
    return (now() - t0) / n / 1e3


def run_op(name: str, target_s: float, repeats: int, clock: str = "wall") -> dict:
    """Median µs per call for each column; the columns take turns within each repeat,
    so a slow spell on the machine hits all of them and the ratios stay fair."""
    row: dict = {}
    plans: dict[str, tuple[Callable, int]] = {}
    for col in COLUMNS:
        row[col] = None
        lib = None if col == "floor" else LIBS.get(col)
        if col != "floor" and lib is None:
            row[f"{col}_error"] = IMPORT_ERRORS.get(col, "not importable")
            continue
        try:
            fn = OPS[name](make_data(), lib)
            plans[col] = fn, calibrate(fn, target_s)
        except Exception as err:
            row[f"{col}_error"] = f"{type(err).__name__}: {err}"[:200]
    samples: dict[str, list[float]] = {col: [] for col in plans}
    now = time.thread_time_ns if clock == "cpu" else time.perf_counter_ns
    gc_was_enabled = gc.isenabled()
    gc.disable()  # as timeit does
    try:
        for _ in range(repeats):
            for col, (fn, n) in plans.items():
                samples[col].append(measure_us(fn, n, now))
    finally:
        if gc_was_enabled:
            gc.enable()
    for col, xs in samples.items():
        row[col] = statistics.median(xs)
    return row


def fmt_us(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}" if v < 100 else f"{v:.0f}"


def ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def print_table(results: dict[str, dict]) -> None:
    head = (
        "op",
        "steersman µs",
        "floor µs",
        "tensordict µs",
        "steersman/floor",
        "tensordict/floor",
        "tensordict/steersman",
    )
    rows = [
        (
            name,
            fmt_us(r["steersman"]),
            fmt_us(r["floor"]),
            fmt_us(r["tensordict"]),
            ratio(r["steersman"], r["floor"]),
            ratio(r["tensordict"], r["floor"]),
            ratio(r["tensordict"], r["steersman"]),
        )
        for name, r in results.items()
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]

    def line(cells):
        return " | ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
        )

    print(line(head))
    print("-|-".join("-" * w for w in widths))
    for r in rows:
        print(line(r))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", help="comma-separated op names or globs (default: all)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--quick", action="store_true", help="smoke run: short, 3 repeats")
    parser.add_argument("--repeats", type=int, help="measurements per column (default 7; --quick: 3)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="elapsed time (default) or the thread's CPU time")
    parser.add_argument("--list", action="store_true", help="list the ops and exit")
    args = parser.parse_args(argv)

    if args.list:
        print("\n".join(OPS))
        return 0
    names = list(OPS)
    if args.ops:
        pats = [p.strip() for p in args.ops.split(",") if p.strip()]
        names = [n for n in OPS if any(fnmatch.fnmatchcase(n, p) for p in pats)]
        if not names:
            parser.error(f"no op matches {args.ops!r}; see --list")
    target_s, repeats = (0.002, 3) if args.quick else (0.02, 7)
    if args.repeats:
        repeats = args.repeats

    torch.set_num_threads(1)
    meta = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "tensordict": getattr(LIBS.get("tensordict"), "__version__", None),
        "steersman": "steersman" in LIBS,
        "batch": B,
        "target_ms": target_s * 1e3,
        "repeats": repeats,
        "clock": args.clock,
        "torch_threads": 1,
    }
    for col, err in IMPORT_ERRORS.items():
        print(f"# {col}: not importable ({err}); its column is n/a")
    print(
        f"# torch {meta['torch']}, tensordict {meta['tensordict']}, python {meta['python']}, "
        f"batch [{B}], median of {repeats} x ~{meta['target_ms']:g} ms, {args.clock} clock, 1 torch thread"
    )

    results = {name: run_op(name, target_s, repeats, args.clock) for name in names}
    print_table(results)
    for name, row in results.items():
        for col in COLUMNS:
            if f"{col}_error" in row and col not in IMPORT_ERRORS:
                print(f"# {name} [{col}]: {row[f'{col}_error']}")

    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    TMP.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
