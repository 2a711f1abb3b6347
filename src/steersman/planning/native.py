"""The search's tree loops as native CPU code: ``native_tree.c`` built with the system C
compiler (cached by source, compiler, flags and CPU), loaded with ``ctypes``.

A tree search's descent and backup are per-tree scalar loops (a few hundred flops per tree
and simulation); in C they cost about 15 us per simulation for 64 trees, where inductor's
full-width masked kernels and loop wrappers cost about 60. The model (the recurrent
function) stays torch: called eagerly (or compiled, on request) from a Python loop between
the C calls.

Used by :func:`~steersman.planning.search.search` for CPU float32 trees with the built-in
selection functions (Gumbel MuZero's with ``qtransform_completed_by_mix_value``, MuZero's
PUCT with ``qtransform_by_parent_and_siblings``). Trees equal the eager search's.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from steersman.tensordict import TensorDict

from .tree import Tree

__all__ = ["NativeUnavailable", "build", "load", "native_selection", "run_native"]

SOURCE = Path(__file__).with_name("native_tree.c")
# the C compiler (monkeypatched by the tests); CC in the environment overrides "cc"
COMPILER: str | None = None
# no -ffast-math, no fused multiply-adds: the same float32 results as torch's ops (vector
# instructions round each operation as the scalar ones do); -march=native: the cache key
# holds the CPU's flags; -O2, not -O3 (see native_tree.c)
FLAGS = ("-O2", "-march=native", "-shared", "-fPIC", "-ffp-contract=off", "-std=c99")


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


class NativeUnavailable(RuntimeError):
    """The native kernels cannot be built or loaded here (the message says why)."""


def cache_dir() -> Path:
    """``$TORCHINDUCTOR_CACHE_DIR/steersman_native`` if set, else
    ``$XDG_CACHE_HOME/steersman/native`` (default ``~/.cache/steersman/native``)."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) / "steersman_native"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "steersman" / "native"


def _compiler() -> str:
    return COMPILER or os.environ.get("CC") or "cc"


def build(source: Path | None = None) -> Path:
    """The shared library of ``source`` (default :data:`SOURCE`), compiled if the cache has none for this source
    text, compiler and flags (written to a temporary file, then renamed into place).
    Raises :class:`NativeUnavailable` if the compiler is missing or fails."""
    cc = _compiler()
    source = SOURCE if source is None else source
    text = Path(source).read_bytes()
    digest = hashlib.sha256(text + repr((cc, FLAGS, _cpu_flags())).encode()).hexdigest()[:20]
    out = cache_dir() / f"{Path(source).stem}_{digest}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        res = subprocess.run([cc, *FLAGS, "-o", tmp, str(source), "-lm"], capture_output=True, text=True)
    except OSError as err:
        os.unlink(tmp)
        raise NativeUnavailable(f"C compiler {cc!r} not runnable: {err}") from err
    if res.returncode != 0:
        os.unlink(tmp)
        lines = (res.stderr or res.stdout).strip().splitlines()
        raise NativeUnavailable(f"{cc} failed: {lines[0] if lines else res.returncode}")
    os.replace(tmp, out)
    return out


_LIBS: dict = {}  # (source, compiler) -> library, or the NativeUnavailable it raised


def load(source: Path | None = None) -> ctypes.CDLL:
    """The loaded library (built on first use, once per process and compiler; a failure
    is remembered and raised again as :class:`NativeUnavailable`)."""
    source = SOURCE if source is None else source
    key = (str(source), _compiler())
    lib = _LIBS.get(key)
    if lib is None:
        try:
            lib = ctypes.CDLL(str(build(source)))
            lib.steersman_descend.argtypes = (ctypes.c_void_p, ctypes.c_int64)
            lib.steersman_descend.restype = None
            lib.steersman_expand_backup.argtypes = (ctypes.c_void_p, ctypes.c_int64)
            lib.steersman_expand_backup.restype = None
        except NativeUnavailable as err:
            lib = err
        except OSError as err:
            lib = NativeUnavailable(f"cannot load the native library: {err}")
        _LIBS[key] = lib
    if isinstance(lib, NativeUnavailable):
        raise lib
    return lib


class _QParams(ctypes.Structure):
    _fields_ = [("value_scale", ctypes.c_float), ("maxvisit_init", ctypes.c_float), ("epsilon", ctypes.c_float),
                ("rescale_values", ctypes.c_int32), ("use_mixed_value", ctypes.c_int32)]


_P = ctypes.c_void_p
_I = ctypes.c_int64


class _Search(ctypes.Structure):  # native_tree.c's Search
    _fields_ = [("batch", _I), ("nodes", _I), ("actions", _I), ("max_depth", _I), ("kind", _I),
                ("node_visits", _P), ("raw_values", _P), ("node_values", _P), ("parents", _P),
                ("action_from_parent", _P), ("depth", _P), ("children_index", _P), ("children_prior_logits", _P),
                ("children_visits", _P), ("children_rewards", _P), ("children_discounts", _P),
                ("children_values", _P), ("root_invalid", _P), ("root_gumbel", _P), ("table", _P),
                ("table_cols", _I), ("max_considered", _I), ("root_q", _QParams), ("interior_q", _QParams),
                ("pb_c_init", ctypes.c_float), ("pb_c_base", ctypes.c_float), ("puct_epsilon", ctypes.c_float),
                ("uniforms", _P), ("prior_probs", _P), ("out", _P), ("work", _P), ("qvalues", _P),
                ("step", _P * 4), ("step_stride", _I * 4), ("next", _P), ("expanded", _P), ("exp8", _P),
                ("num_leaves", _I), ("emb_store", _P), ("emb_buf", _P), ("emb_row_bytes", _P)]


MAX_ACTIONS = 64  # native_tree.c's MAX_ACTIONS
_GUMBEL, _PUCT = 0, 1
_Q_DEFAULTS = {"value_scale": 0.1, "maxvisit_init": 50.0, "rescale_values": True, "use_mixed_value": True,
               "epsilon": 1e-8}


def _partial_keywords(fn: Callable, target: Callable) -> dict | None:
    """The keywords of ``fn`` if it is ``target`` or a keywords-only partial of it."""
    if fn is target:
        return {}
    if isinstance(fn, functools.partial) and fn.func is target and not fn.args:
        return dict(fn.keywords)
    return None


def native_selection(root_fn: Callable, interior_fn: Callable) -> dict | None:
    """What the C descent needs to run ``root_fn``/``interior_fn`` (the built-in Gumbel
    MuZero or PUCT selections with their default Q transforms, as ``gumbel_muzero_policy``
    and ``muzero_policy`` bind them), or None if it cannot."""
    from .action_selection import (
        gumbel_muzero_interior_action_selection,
        gumbel_muzero_root_action_selection,
        muzero_action_selection,
    )
    from .qtransforms import qtransform_by_parent_and_siblings, qtransform_completed_by_mix_value

    root_kw = _partial_keywords(root_fn, gumbel_muzero_root_action_selection)
    interior_kw = _partial_keywords(interior_fn, gumbel_muzero_interior_action_selection)
    if root_kw is not None and interior_kw is not None and {"table", "max_num_considered_actions"} <= set(root_kw):
        qs = []
        for kw in (root_kw, interior_kw):
            q = _partial_keywords(kw.get("qtransform", qtransform_completed_by_mix_value),
                                  qtransform_completed_by_mix_value)
            if q is None or set(q) - set(_Q_DEFAULTS) or set(kw) - {"qtransform", "table",
                                                                     "max_num_considered_actions"}:
                return None
            qs.append({**_Q_DEFAULTS, **q})
        return {"kind": _GUMBEL, "root_q": qs[0], "interior_q": qs[1], "table": root_kw["table"],
                "max_considered": root_kw["max_num_considered_actions"]}
    root_kw = _partial_keywords(root_fn, muzero_action_selection)
    interior_kw = _partial_keywords(interior_fn, muzero_action_selection)
    if root_kw is None or interior_kw is None or root_kw.pop("depth", None) != 0 or root_kw != interior_kw \
            or set(interior_kw) - {"pb_c_init", "pb_c_base", "qtransform"}:
        return None
    q = _partial_keywords(interior_kw.get("qtransform", qtransform_by_parent_and_siblings),
                          qtransform_by_parent_and_siblings)
    if q is None or set(q) - {"epsilon"}:
        return None
    return {"kind": _PUCT, "pb_c_init": interior_kw.get("pb_c_init", 1.25),
            "pb_c_base": interior_kw.get("pb_c_base", 19652.0), "epsilon": q.get("epsilon", 1e-8)}


def supported(tree: Tree, selection: dict | None) -> str | None:
    """Why the native loops cannot run this search (None: they can)."""
    if selection is None:
        return "the selection functions are not the built-in Gumbel MuZero / PUCT ones"
    if tree.node_values.device.type != "cpu":
        return "the tree is not on the CPU"
    if tree.node_values.dtype != torch.float32 or tree.children_prior_logits.dtype != torch.float32:
        return "the tree is not float32"
    if tree.num_actions > MAX_ACTIONS:
        return f"more than {MAX_ACTIONS} actions"
    if selection["kind"] == _GUMBEL and "root_gumbel" not in tree.extra_data.keys():
        return "no root_gumbel in extra_data"
    return None


@functools.lru_cache(maxsize=1)
def torch_exp8() -> int | None:
    """The address of ``Sleef_expf8_u10`` in torch's CPU library (the exp its vectorized
    kernels use), or None (the C code then calls ``expf``)."""
    try:
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        return ctypes.cast(lib.Sleef_expf8_u10, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None


def _q(kw: dict) -> _QParams:
    return _QParams(float(kw["value_scale"]), float(kw["maxvisit_init"]), float(kw["epsilon"]),
                    int(bool(kw["rescale_values"])), int(bool(kw["use_mixed_value"])))


def model_step(recurrent_fn: Callable, params: Any, action: Tensor, keys: tuple, batch: int, tensor_embedding: bool,
               *leaves: Tensor) -> tuple:
    """One model call on the gathered parent embeddings (``leaves``): the flat outputs
    ``(reward, discount, prior_logits, value, *next_leaves)`` (compiled per shape)."""
    emb = leaves[0] if tensor_embedding else TensorDict(dict(zip(keys, leaves)), batch_size=[batch])
    step, nxt = recurrent_fn(params, None, action, emb)
    new = (nxt,) if tensor_embedding else tuple(nxt.get(k) for k in keys)
    return (step.reward, step.discount, step.prior_logits, step.value, *new)


def run_native(lib: ctypes.CDLL, tree: Tree, selection: dict, params: Any, rng: torch.Generator | None,
               uniforms: Tensor, recurrent_fn: Callable, checked_fn: Callable, compiled: Callable | None,
               max_depth: int, tensor_embedding: bool) -> None:
    """Runs every simulation on ``tree`` in place: per simulation a C descent (which also
    gathers the parents' embedding rows), one model call and the C expansion and backup.
    The model call is ``recurrent_fn(params, rng, action, embedding)`` (the first
    simulation ``checked_fn``, which also checks the outputs) or, with ``compiled`` (a
    compiled :func:`model_step`), ``compiled(recurrent_fn, params, action, ...)`` from the
    second simulation on."""
    batch, num_nodes = tree.node_values.shape
    keys = tuple(tree.embeddings.keys(include_nested=True, leaves_only=True))
    stores = [tree.embeddings.get(k) for k in keys]
    bufs = [torch.empty((batch, *x.shape[2:]), dtype=x.dtype) for x in stores]
    out = torch.zeros((3, batch), dtype=torch.int64)
    work = torch.empty((2, batch), dtype=torch.int64)
    invalid = tree.root_invalid_actions.to(torch.uint8).contiguous()
    probs = torch.empty_like(tree.children_prior_logits)
    qvalues = tree.children_rewards + tree.children_discounts * tree.children_values  # kept up to date in C
    t = tree
    arrays = [t.node_visits, t.raw_values, t.node_values, t.parents, t.action_from_parent, t.depth, t.children_index,
              t.children_prior_logits, t.children_visits, t.children_rewards, t.children_discounts,
              t.children_values, *stores]
    if not all(x.is_contiguous() for x in arrays):
        raise ValueError("search: the native loops need contiguous tree arrays")
    ptr = lambda x: x.data_ptr()  # noqa: E731
    leaf_ptrs = (ctypes.c_void_p * max(1, len(keys)))
    store_ptrs, buf_ptrs = leaf_ptrs(*map(ptr, stores)), leaf_ptrs(*map(ptr, bufs))
    row_bytes = (ctypes.c_int64 * max(1, len(keys)))(*(x[0, 0].numel() * x.element_size() for x in stores))
    keep: list = [invalid, out, work, qvalues, bufs, probs, store_ptrs, buf_ptrs, row_bytes]
    s = _Search(batch=batch, nodes=num_nodes, actions=t.num_actions, max_depth=max_depth, kind=selection["kind"],
                node_visits=ptr(t.node_visits), raw_values=ptr(t.raw_values), node_values=ptr(t.node_values),
                parents=ptr(t.parents), action_from_parent=ptr(t.action_from_parent), depth=ptr(t.depth),
                children_index=ptr(t.children_index), children_prior_logits=ptr(t.children_prior_logits),
                children_visits=ptr(t.children_visits), children_rewards=ptr(t.children_rewards),
                children_discounts=ptr(t.children_discounts), children_values=ptr(t.children_values),
                root_invalid=ptr(invalid), prior_probs=ptr(probs), out=ptr(out), work=ptr(work),
                qvalues=ptr(qvalues), num_leaves=len(keys),
                emb_store=ctypes.addressof(store_ptrs), emb_buf=ctypes.addressof(buf_ptrs),
                emb_row_bytes=ctypes.addressof(row_bytes))
    if selection["kind"] == _GUMBEL:
        gumbel = tree.extra_data["root_gumbel"].to(torch.float32).contiguous()
        table = selection["table"].to(torch.int64).contiguous()
        keep += [gumbel, table]
        s.root_gumbel, s.table, s.table_cols = ptr(gumbel), ptr(table), table.shape[1]
        s.max_considered = selection["max_considered"]
        s.root_q, s.interior_q = _q(selection["root_q"]), _q(selection["interior_q"])
    else:
        uniforms = uniforms.to(torch.float32).contiguous()
        keep.append(uniforms)
        s.uniforms = ptr(uniforms)
        s.pb_c_init, s.pb_c_base, s.puct_epsilon = (float(selection[k]) for k in ("pb_c_init", "pb_c_base",
                                                                                    "epsilon"))
    s.exp8 = torch_exp8()
    actions = torch.empty((uniforms.shape[0], batch), dtype=torch.int64)  # a fresh [B] tensor per model call
    next_ptrs = leaf_ptrs()
    keep += [actions, next_ptrs]
    s.expanded, s.next = ptr(actions), ctypes.addressof(next_ptrs)
    handle = ctypes.addressof(s)
    descend, expand_backup = lib.steersman_descend, lib.steersman_expand_backup
    step_ptrs, step_strides = s.step, s.step_stride
    f32 = torch.float32
    want = ((batch,), (batch,), (batch, t.num_actions), (batch,))
    emb_shapes = [(x.shape[0], *x.shape[2:]) for x in stores]
    dtypes = [x.dtype for x in stores]
    names = ("reward", "discount", "prior_logits", "value")
    for sim, action in enumerate(actions.unbind(0)):
        descend(handle, sim)
        if compiled is not None and sim:
            outs = compiled(recurrent_fn, params, action, keys, batch, tensor_embedding, *bufs)
        else:
            emb = bufs[0] if tensor_embedding else TensorDict(dict(zip(keys, bufs)), batch_size=[batch])
            step, nxt = (recurrent_fn if sim else checked_fn)(params, rng, action, emb)
            outs = (step.reward, step.discount, step.prior_logits, step.value,
                    *((nxt,) if tensor_embedding else (nxt.get(k) for k in keys)))
        held = []  # converted outputs, alive until the C call returns
        for i in range(4):
            x = outs[i]
            if x.shape != want[i] or x.device.type != "cpu":  # the C code reads them by these shapes
                raise ValueError(f"search: recurrent_fn returned {names[i]} of shape {list(x.shape)} on "
                                 f"{x.device} at simulation {sim}, expected {list(want[i])} on the CPU")
            if x.dtype != f32 or x.stride(-1) != 1 and i == 2:
                x = x.to(f32).contiguous()
                held.append(x)
            step_ptrs[i] = x.data_ptr()
            step_strides[i] = x.stride(0)
        for k in range(len(keys)):
            x = outs[4 + k]
            if x.shape != emb_shapes[k] or x.device.type != "cpu":
                raise ValueError(f"search: recurrent_fn's next embedding {keys[k]!r} has shape {list(x.shape)} on "
                                 f"{x.device} at simulation {sim}, expected {list(emb_shapes[k])} on the CPU")
            if x.dtype != dtypes[k] or not x.is_contiguous():
                x = x.to(dtypes[k]).contiguous()
                held.append(x)
            next_ptrs[k] = x.data_ptr()
        expand_backup(handle, sim)
    del keep
