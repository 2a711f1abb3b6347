"""Shared fixtures for the container battery: one logical content, many container variants.

Every variant built here holds the *same* logical content (see :func:`make_reference`):

* batch size ``[4, 3]``
* ``"a"`` float32 ``[4, 3, 2]``, ``"b"`` int64 ``[4, 3]``, ``"c"`` bool ``[4, 3, 1]``
* ``"nested"``: a sub-container with batch ``[4, 3, 2]`` holding ``"x"`` float32
  ``[4, 3, 2, 5]``, ``"y"`` int32 ``[4, 3, 2]`` and ``"deeper"`` (batch ``[4, 3, 2]``)
  with ``"z"`` float64 ``[4, 3, 2, 1]``
* ``"s"``: the string ``"hello"`` (a non-tensor entry) where the variant supports it.

The reference is the same content as a plain nested ``dict`` of tensors; tests apply an
operation to the variant and the same operation leaf by leaf to the reference, then
compare with :func:`assert_matches`.

The h5 variant is skipped (with a reason) only when the optional h5py is missing.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from steersman.tensordict import TensorDict

BATCH = torch.Size([4, 3])
NESTED_BATCH = torch.Size([4, 3, 2])
STR_KEY = "s"
STR_VALUE = "hello"

#: every tensor leaf of the reference, as nested keys
LEAF_KEYS: list = ["a", "b", "c", ("nested", "x"), ("nested", "y"), ("nested", "deeper", "z")]
#: the float leaves (reductions such as mean/std/norm need floats)
FLOAT_KEYS: list = ["a", ("nested", "x"), ("nested", "deeper", "z")]
#: every key (nested included, strings for the root), without the non-tensor entry
ALL_KEYS: list = ["a", "b", "c", "nested", ("nested", "x"), ("nested", "y"), ("nested", "deeper"),
                  ("nested", "deeper", "z")]


# ----------------------------------------------------------------------------- reference
def make_reference(seed: int = 0) -> dict:
    """The logical content every variant holds, as a nested dict of tensors."""
    g = torch.Generator().manual_seed(seed)
    return {
        "a": torch.randn(4, 3, 2, generator=g),
        "b": torch.randint(-5, 10, (4, 3), generator=g),
        "c": torch.rand(4, 3, 1, generator=g) > 0.5,
        "nested": {
            "x": torch.randn(4, 3, 2, 5, generator=g),
            "y": torch.randint(0, 7, (4, 3, 2), generator=g).to(torch.int32),
            "deeper": {"z": torch.randn(4, 3, 2, 1, generator=g).double()},
        },
    }


def ref_get(ref: dict, key: Any) -> Any:
    if isinstance(key, str):
        return ref[key]
    node = ref
    for k in key:
        node = node[k]
    return node


def ref_set(ref: dict, key: Any, value: Any) -> None:
    if isinstance(key, str):
        ref[key] = value
        return
    node = ref
    for k in key[:-1]:
        node = node[k]
    node[key[-1]] = value


def ref_map(fn: Callable, ref: dict, *others: dict) -> dict:
    """``fn`` applied to every leaf of ``ref`` (and the matching leaves of ``others``)."""
    out = {}
    for k, v in ref.items():
        if isinstance(v, dict):
            out[k] = ref_map(fn, v, *(o[k] for o in others))
        else:
            out[k] = fn(v, *(o[k] for o in others))
    return out


def ref_leaves(ref: dict) -> list:
    return [ref_get(ref, k) for k in LEAF_KEYS]


def ref_clone(ref: dict) -> dict:
    return ref_map(torch.clone, ref)


def build_td(ref: dict, batch_size: Any = BATCH, with_str: bool = True) -> TensorDict:
    """A plain TensorDict from the reference layout (the nested levels get one extra dim)."""
    batch_size = torch.Size(batch_size)
    nbs = batch_size + NESTED_BATCH[len(BATCH):]
    deeper = TensorDict(dict(ref["nested"]["deeper"]), nbs)
    nested = TensorDict({k: v for k, v in ref["nested"].items() if k != "deeper"}, nbs)
    nested["deeper"] = deeper
    out = TensorDict({k: v for k, v in ref.items() if k != "nested"}, batch_size)
    out["nested"] = nested
    if with_str:
        out[STR_KEY] = STR_VALUE
    return out


# ----------------------------------------------------------------------------- comparisons
def as_plain(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor view (MemoryMappedTensor and other subclasses compare like tensors)."""
    return t.as_subclass(torch.Tensor) if type(t) is not torch.Tensor else t


def assert_leaf_equal(actual: Any, expected: torch.Tensor, key: Any = "?") -> None:
    assert isinstance(actual, torch.Tensor), f"{key!r}: expected a tensor, got {type(actual).__name__}"
    actual = as_plain(actual)
    assert actual.shape == expected.shape, f"{key!r}: shape {list(actual.shape)} != {list(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{key!r}: dtype {actual.dtype} != {expected.dtype}"
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6, equal_nan=True,
                               msg=lambda m: f"{key!r}: {m}")


def nontensor_array(value: Any) -> np.ndarray:
    """The per-element values of a non-tensor entry as an object array (any wrapper)."""
    from steersman.tensordict import NonTensorData, NonTensorStack

    if isinstance(value, NonTensorStack):
        return value.to_object_array()
    if isinstance(value, NonTensorData):
        return value.to_object_array()
    arr = np.empty((), dtype=object)
    arr[()] = value
    return arr


def assert_str_entry(td: Any, batch_size: Any, value: Any = STR_VALUE, key: str = STR_KEY) -> None:
    """The non-tensor entry holds ``value`` for every batch element, with the batch shape."""
    entry = td.get(key)
    arr = nontensor_array(entry)
    if arr.ndim:  # a stack or a NonTensorData with a batch size
        assert arr.shape == tuple(batch_size), f"{key!r}: values shaped {arr.shape}, batch {list(batch_size)}"
    assert all(v == value for v in arr.reshape(-1).tolist()), f"{key!r}: {arr!r} != {value!r}"


def assert_matches(td: Any, ref: dict, batch_size: Any = None, *, has_str: bool | None = None,
                   keys: list | None = None, check_nested_batch: bool = True) -> None:
    """Every leaf of ``ref`` equals the same leaf of ``td``; batch sizes agree."""
    if batch_size is None:
        batch_size = ref["a"].shape[:2] if "a" in ref else None
    if batch_size is not None:
        assert td.batch_size == torch.Size(batch_size), f"batch_size {td.batch_size} != {batch_size}"
    for key in LEAF_KEYS if keys is None else keys:
        try:
            expected = ref_get(ref, key)
        except KeyError:
            continue
        assert_leaf_equal(td.get(key), expected, key)
    if check_nested_batch and "nested" in ref and batch_size is not None and "nested" in td:
        nb = torch.Size(batch_size) + NESTED_BATCH[len(BATCH):]
        assert td.get("nested").batch_size == nb
        if ("nested", "deeper") in td:
            assert td.get(("nested", "deeper")).batch_size == nb
    if has_str:
        assert_str_entry(td, td.batch_size)


# ----------------------------------------------------------------------------- availability
#: h5py is an optional dependency: the h5 variant is skipped without it
H5PY_OK = importlib.util.find_spec("h5py") is not None

_TC_CLASS = None


def tensorclass_type():
    """The ``@tensorclass`` used by the tensorclass variant (built once, lazily)."""
    global _TC_CLASS
    if _TC_CLASS is None:
        from steersman.tensordict import tensorclass

        @tensorclass
        class BatteryData:
            a: torch.Tensor
            b: torch.Tensor
            c: torch.Tensor
            nested: TensorDict
            s: str

        _TC_CLASS = BatteryData
    return _TC_CLASS


# ----------------------------------------------------------------------------- variants
@dataclasses.dataclass
class Case:
    """One variant: the container, its reference and what it can do."""

    name: str
    td: Any
    ref: dict
    has_str: bool = True
    locked: bool = False
    #: a fresh read of the storage the container writes into (for views: the source)
    source: Callable[[], Any] | None = None
    #: the container is a view of ``source()``: in-place writes must show up there
    is_view: bool = False
    is_tensorclass: bool = False
    is_lazy: bool = False
    #: ``get`` reads a fresh copy of the stored leaf (h5): no shared in-memory storage
    reads_copies: bool = False

    @property
    def batch_size(self) -> torch.Size:
        return BATCH


def _plain(tmp_path) -> Case:
    ref = make_reference()
    td = build_td(ref_clone(ref))
    return Case("plain", td, ref, source=lambda: td)


def _nested(tmp_path) -> Case:
    ref = make_reference()
    parent = TensorDict({"inner": build_td(ref_clone(ref)), "other": torch.zeros(4)}, [4])
    return Case("nested", parent["inner"], ref, source=lambda: parent["inner"], is_view=True)


def _lazy(tmp_path) -> Case:
    from steersman.tensordict import lazy_stack

    ref = make_reference()
    base = build_td(ref_clone(ref))
    td = lazy_stack([base[i] for i in range(4)], 0)
    return Case("lazy", td, ref, source=lambda: base, is_view=True, is_lazy=True)


def _tensorclass(tmp_path) -> Case:
    ref = make_reference()
    base = build_td(ref_clone(ref), with_str=False)
    cls = tensorclass_type()
    tc = cls(a=base["a"], b=base["b"], c=base["c"], nested=base["nested"], s=STR_VALUE,
             batch_size=BATCH)
    return Case("tensorclass", tc, ref, source=lambda: tc, is_tensorclass=True)


def _memmap(tmp_path) -> Case:
    ref = make_reference()
    td = build_td(ref_clone(ref)).memmap_(tmp_path / "memmap")
    path = tmp_path / "memmap"
    return Case("memmap", td, ref, locked=True,
                source=lambda: TensorDict.load_memmap(path), is_view=True)


def _memmap_loaded(tmp_path) -> Case:
    ref = make_reference()
    path = tmp_path / "saved"
    build_td(ref_clone(ref)).memmap(path)
    td = TensorDict.load_memmap(path)
    return Case("memmap_loaded", td, ref, locked=True,
                source=lambda: TensorDict.load_memmap(path), is_view=True)


def _subview(tmp_path) -> Case:
    ref = make_reference()
    filler = make_reference(seed=1)
    big_ref = ref_map(lambda r, f: torch.cat([f[:1], r, f[1:2]], 0), ref, filler)
    big = build_td(big_ref, [6, 3])
    return Case("subview", big[1:5], ref, source=lambda: big[1:5], is_view=True)


def _shared(tmp_path) -> Case:
    ref = make_reference()
    td = build_td(ref_clone(ref)).share_memory_()
    return Case("shared", td, ref, locked=True, source=lambda: td)


def _permuted(tmp_path) -> Case:
    ref = make_reference()
    big_ref = ref_map(lambda t: t.transpose(0, 1).contiguous(), ref)
    big = build_td(big_ref, [3, 4])
    return Case("permuted", big.permute(1, 0), ref, source=lambda: big.permute(1, 0), is_view=True)


def _unsqueezed(tmp_path) -> Case:
    ref = make_reference()
    base = build_td(ref_clone(ref))
    return Case("unsqueezed_squeezed", base.unsqueeze(0).squeeze(0), ref, source=lambda: base,
                is_view=True)


def _clone(tmp_path) -> Case:
    ref = make_reference()
    base = build_td(ref_clone(ref))
    td = base.clone()
    base.zero_()  # the clone must not alias the original
    return Case("clone", td, ref, source=lambda: td)


def _persistent(tmp_path) -> Case:
    from steersman.tensordict.persistent import PersistentTensorDict

    ref = make_reference()
    src = build_td(ref_clone(ref))
    path = tmp_path / "data.h5"
    td = PersistentTensorDict.from_dict(src, filename=str(path))
    return Case("h5", td, ref, source=lambda: PersistentTensorDict.from_h5(str(path)),
                is_view=True, reads_copies=True)


_SKIP_H5 = pytest.mark.skipif(not H5PY_OK, reason="h5py (optional dependency) is not installed")

VARIANTS: dict[str, tuple[Callable, list]] = {
    "plain": (_plain, []),
    "nested": (_nested, []),
    "lazy": (_lazy, []),
    "tensorclass": (_tensorclass, []),
    "memmap": (_memmap, []),
    "memmap_loaded": (_memmap_loaded, []),
    "subview": (_subview, []),
    "shared": (_shared, []),
    "permuted": (_permuted, []),
    "unsqueezed_squeezed": (_unsqueezed, []),
    "clone": (_clone, []),
    "h5": (_persistent, [_SKIP_H5]),
}

VARIANT_PARAMS = [pytest.param(name, marks=marks, id=name) for name, (_, marks) in VARIANTS.items()]


#: variants that write files (the others don't pay for a temporary directory)
_NEEDS_FILES = {"memmap", "memmap_loaded", "h5"}


@pytest.fixture(params=VARIANT_PARAMS)
def case(request) -> Case:
    """A fresh variant (and its reference) for every test."""
    factory, _ = VARIANTS[request.param]
    tmp = request.getfixturevalue("tmp_path") if request.param in _NEEDS_FILES else None
    return factory(tmp)


@pytest.fixture
def td_variant(case) -> Any:
    """A fresh container holding the reference content (one per variant)."""
    return case.td


@pytest.fixture
def ref(case) -> dict:
    return case.ref
