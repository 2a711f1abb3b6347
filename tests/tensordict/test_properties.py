"""Property tests: every container operation equals the same operation leaf by leaf.

Hypothesis draws a batch shape (0-3 dims of size 0..4), a random nested structure
(leaves of random dtype and feature dims; sub-containers that may add a batch dim),
then an index, a reshape target, a list to stack or cat, an arithmetic operand... The
container result is compared with the same operation applied to each leaf of a plain
nested dict of tensors holding the same content.
"""

from __future__ import annotations

import math
import tempfile

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from steersman.tensordict import TensorDict, lazy_stack

SETTINGS = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=False,
)
FEW = settings(SETTINGS, max_examples=25)

ALL_DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32, torch.bool]
NUMERIC_DTYPES = [torch.float32, torch.float64, torch.int64]
FLOAT_DTYPES = [torch.float32, torch.float64]


# ----------------------------------------------------------------------------- building
def make_tensor(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-5, 6, shape, generator=g).to(dtype)


@st.composite
def batch_shapes(draw, min_dims=0, max_dims=3, min_size=0):
    n = draw(st.integers(min_dims, max_dims))
    return tuple(draw(st.integers(min_size, 4)) for _ in range(n))


@st.composite
def structures(draw, dtypes=tuple(ALL_DTYPES), depth=0):
    """A nested layout: key -> ("leaf", feature_shape, dtype) | ("node", extra_batch_dims, layout)."""
    keys = draw(st.lists(st.sampled_from("abcdef"), min_size=1, max_size=3, unique=True))
    spec = {}
    for k in keys:
        if depth < 2 and draw(st.integers(0, 3)) == 0:
            extra = tuple(draw(st.lists(st.integers(1, 3), max_size=1)))
            spec[k] = ("node", extra, draw(structures(dtypes, depth + 1)))
        else:
            feat = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
            spec[k] = ("leaf", feat, draw(st.sampled_from(list(dtypes))))
    return spec


def build(spec, batch, seed):
    """(TensorDict, reference nested dict) holding the same tensors (the ref owns copies)."""
    td, ref = {}, {}
    for i, (k, item) in enumerate(sorted(spec.items())):
        if item[0] == "leaf":
            t = make_tensor(tuple(batch) + item[1], item[2], seed * 31 + i)
            td[k], ref[k] = t, t.clone()
        else:
            sub_td, sub_ref = build(item[2], tuple(batch) + item[1], seed * 17 + i + 1)
            td[k], ref[k] = sub_td, sub_ref
    return TensorDict(td, batch), ref


def ref_map(fn, ref, *others):
    return {
        k: ref_map(fn, v, *(o[k] for o in others)) if isinstance(v, dict) else fn(v, *(o[k] for o in others))
        for k, v in ref.items()
    }


def ref_items(ref, prefix=()):
    for k, v in ref.items():
        if isinstance(v, dict):
            yield from ref_items(v, prefix + (k,))
        else:
            yield prefix + (k,), v


def assert_same(td, ref, batch_size):
    """``td`` holds exactly the leaves of ``ref`` (same keys, shapes, dtypes, values)."""
    assert td.batch_size == torch.Size(batch_size)
    expected = dict(ref_items(ref))
    got = {k if isinstance(k, tuple) else (k,): v for k, v in td.items(True, True)}
    assert set(got) == set(expected)
    for key, exp in expected.items():
        act = got[key]
        assert act.shape == exp.shape, (key, act.shape, exp.shape)
        assert act.dtype == exp.dtype, (key, act.dtype, exp.dtype)
        torch.testing.assert_close(act, exp, rtol=1e-5, atol=1e-5, equal_nan=True)


@st.composite
def containers(draw, dtypes=tuple(ALL_DTYPES), min_dims=0, max_dims=3, min_size=0):
    batch = draw(batch_shapes(min_dims, max_dims, min_size))
    spec = draw(structures(dtypes))
    seed = draw(st.integers(0, 2**16))
    td, ref = build(spec, batch, seed)
    return batch, spec, td, ref


# ----------------------------------------------------------------------------- indices
@st.composite
def indices(draw, batch, unique=False):
    """A random batch index: ints, step slices, None, ``...``, one advanced item (list,
    long tensor or bool mask over one or more leading dims)."""
    bd = len(batch)
    items = []
    dim = 0
    used_advanced = False
    n_items = draw(st.integers(1, bd + 1))
    for _ in range(n_items):
        if dim >= bd:
            break
        size = batch[dim]
        choices = ["slice", "none"] + (["int"] if size else [])
        if not used_advanced:
            choices += ["mask"] + (["list", "tensor"] if size else [])
        kind = draw(st.sampled_from(choices))
        if kind == "int":
            items.append(draw(st.integers(-size, size - 1)))
            dim += 1
        elif kind == "slice":
            start = draw(st.none() | st.integers(-5, 5))
            stop = draw(st.none() | st.integers(-5, 5))
            step = draw(st.none() | st.integers(1, 3))
            items.append(slice(start, stop, step))
            dim += 1
        elif kind == "none":
            items.append(None)
        elif kind in ("list", "tensor"):
            vals = draw(st.lists(st.integers(-size, size - 1), min_size=1, max_size=4, unique=unique))
            if unique:  # -1 and size-1 are the same row
                vals = list({v % size: v for v in vals}.values())
            items.append(vals if kind == "list" else torch.tensor(vals))
            used_advanced = True
            dim += 1
        else:  # a bool mask over 1..k leading dims from here
            k = draw(st.integers(1, bd - dim))
            shape = batch[dim : dim + k]
            bits = draw(st.lists(st.booleans(), min_size=math.prod(shape), max_size=math.prod(shape)))
            items.append(torch.tensor(bits, dtype=torch.bool).reshape(shape))
            used_advanced = True
            dim += k
    if draw(st.booleans()):  # "..." stands for the dims the other items leave out
        pos = draw(st.integers(0, len(items))) if dim == bd else len(items)
        items.insert(pos, Ellipsis)
    if len(items) == 1 and draw(st.booleans()):
        return items[0]
    return tuple(items)


def norm_index(idx, bd):
    items = idx if isinstance(idx, tuple) else (idx,)
    items = tuple(torch.tensor(i, dtype=torch.long) if isinstance(i, list) else i for i in items)
    used = sum(
        0 if (i is None or i is Ellipsis) else (i.ndim if isinstance(i, torch.Tensor) and i.dtype == torch.bool else 1)
        for i in items
    )
    if any(i is Ellipsis for i in items):
        pos = next(p for p, i in enumerate(items) if i is Ellipsis)
        items = items[:pos] + (slice(None),) * (bd - used) + items[pos + 1 :]
    return items


# ============================================================================ properties
@SETTINGS
@given(data=st.data())
def test_index_matches_leafwise(data):
    batch, _, td, ref = data.draw(containers(min_dims=1))
    idx = data.draw(indices(batch))
    norm = norm_index(idx, len(batch))
    expected_bs = torch.empty(batch)[norm].shape
    out = td[idx]
    assert_same(out, ref_map(lambda t: t[norm], ref), expected_bs)


@SETTINGS
@given(data=st.data())
def test_setitem_matches_leafwise(data):
    batch, _, td, ref = data.draw(containers(min_dims=1))
    idx = data.draw(indices(batch, unique=True))
    norm = norm_index(idx, len(batch))
    sub_bs = torch.empty(batch)[norm].shape
    new_ref = ref_map(lambda t: ~t[norm] if t.dtype == torch.bool else t[norm] * 3 - 1, ref)
    value = td[idx].apply(lambda x: ~x if x.dtype == torch.bool else x * 3 - 1)
    assert value.batch_size == sub_bs
    td[idx] = value
    for key, t in ref_items(ref):
        node = new_ref
        for k in key:
            node = node[k]
        t[norm] = node
    assert_same(td, ref, batch)


@SETTINGS
@given(data=st.data())
def test_reshape_matches_leafwise(data):
    batch, _, td, ref = data.draw(containers())
    n = math.prod(batch)
    k = data.draw(st.integers(1, 3))
    if n == 0:
        target = [0] + [data.draw(st.integers(1, 3)) for _ in range(k - 1)]
    else:
        target, rem = [], n
        for _ in range(k - 1):
            d = data.draw(st.sampled_from([d for d in range(1, rem + 1) if rem % d == 0]))
            target.append(d)
            rem //= d
        target.append(rem)
    bd = len(batch)
    use_minus_one = n > 0 and data.draw(st.booleans())
    arg = list(target)
    if use_minus_one:
        arg[data.draw(st.integers(0, k - 1))] = -1
    out = td.reshape(*arg)
    assert_same(out, ref_map(lambda t: t.reshape(*target, *t.shape[bd:]), ref), target)
    if bd:
        flat = td.flatten(0, -1) if bd > 1 else td
        assert_same(flat, ref_map(lambda t: t.reshape(n, *t.shape[bd:]), ref), [n])


@SETTINGS
@given(data=st.data())
def test_stack_matches_leafwise(data):
    batch = data.draw(batch_shapes(0, 2))
    spec = data.draw(structures())
    n = data.draw(st.integers(1, 3))
    pairs = [build(spec, batch, data.draw(st.integers(0, 1000))) for _ in range(n)]
    bd = len(batch)
    dim = data.draw(st.integers(-(bd + 1), bd))
    out = torch.stack([p[0] for p in pairs], dim)
    d = dim % (bd + 1)
    exp = ref_map(lambda *ts: torch.stack(ts, d), pairs[0][1], *[p[1] for p in pairs[1:]])
    assert_same(out, exp, batch[:d] + (n,) + batch[d:])


@SETTINGS
@given(data=st.data())
def test_cat_matches_leafwise(data):
    batch = data.draw(batch_shapes(1, 3))
    spec = data.draw(structures())
    bd = len(batch)
    dim = data.draw(st.integers(-bd, bd - 1))
    d = dim % bd
    n = data.draw(st.integers(1, 3))
    sizes = [data.draw(st.integers(0, 4)) for _ in range(n)]
    pairs = [build(spec, batch[:d] + (s,) + batch[d + 1 :], data.draw(st.integers(0, 1000))) for s in sizes]
    out = torch.cat([p[0] for p in pairs], dim)
    exp = ref_map(lambda *ts: torch.cat(ts, d), pairs[0][1], *[p[1] for p in pairs[1:]])
    assert_same(out, exp, batch[:d] + (sum(sizes),) + batch[d + 1 :])


BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "maximum": lambda a, b: a.maximum(b) if not isinstance(a, torch.Tensor) else torch.maximum(a, b),
}


@SETTINGS
@given(data=st.data())
def test_arithmetic_matches_leafwise(data):
    batch = data.draw(batch_shapes())
    spec = data.draw(structures(tuple(NUMERIC_DTYPES)))
    td, ref = build(spec, batch, data.draw(st.integers(0, 1000)))
    other, oref = build(spec, batch, data.draw(st.integers(0, 1000)))
    name = data.draw(st.sampled_from(sorted(BINARY)))
    fn = BINARY[name]
    assert_same(fn(td, other), ref_map(fn, ref, oref), batch)
    if name != "maximum":
        scalar = data.draw(st.sampled_from([2, -3, 0.5, 1.25]))
        assert_same(fn(td, scalar), ref_map(lambda t: fn(t, scalar), ref), batch)
        assert_same(fn(scalar, td), ref_map(lambda t: fn(scalar, t), ref), batch)
    if batch:
        w = make_tensor(batch, torch.float32, 7).abs() + 0.5
        assert_same(fn(td, w), ref_map(lambda t: fn(t, w.reshape(w.shape + (1,) * (t.ndim - w.ndim))), ref),
                    batch)
    assert_same(-td, ref_map(torch.neg, ref), batch)
    assert_same(abs(td), ref_map(torch.abs, ref), batch)
    assert_same(td == other, ref_map(torch.eq, ref, oref), batch)
    assert_same(td > 0, ref_map(lambda t: t > 0, ref), batch)


@SETTINGS
@given(data=st.data())
def test_inplace_arithmetic_matches_leafwise(data):
    batch = data.draw(batch_shapes())
    spec = data.draw(structures(tuple(FLOAT_DTYPES)))
    td, ref = build(spec, batch, data.draw(st.integers(0, 1000)))
    other, oref = build(spec, batch, data.draw(st.integers(0, 1000)))
    op = data.draw(st.sampled_from(["add_", "sub_", "mul_", "lerp_", "clamp_", "mul_scalar", "add_scalar"]))
    if op == "lerp_":
        td.lerp_(other, 0.3)
        exp = ref_map(lambda a, b: torch.lerp(a, b, 0.3), ref, oref)
    elif op == "clamp_":
        td.clamp_(-0.5, 0.25)
        exp = ref_map(lambda a: a.clamp(-0.5, 0.25), ref)
    elif op == "mul_scalar":
        td.mul_(2.5)
        exp = ref_map(lambda a: a * 2.5, ref)
    elif op == "add_scalar":
        td.add_(1.5)
        exp = ref_map(lambda a: a + 1.5, ref)
    else:
        getattr(td, op)(other)
        fn = {"add_": torch.add, "sub_": torch.sub, "mul_": torch.mul}[op]
        exp = ref_map(fn, ref, oref)
    assert_same(td, exp, batch)


APPLY_FNS = {
    "double": lambda x: x * 2,
    "exp": lambda x: x.float().exp(),
    "zeros": torch.zeros_like,
    "to64": lambda x: x.to(torch.float64),
    "nonzero": lambda x: x != 0,
}


@SETTINGS
@given(data=st.data())
def test_apply_matches_leafwise(data):
    batch, spec, td, ref = data.draw(containers())
    name = data.draw(st.sampled_from(sorted(APPLY_FNS)))
    fn = APPLY_FNS[name]
    assert_same(td.apply(fn), ref_map(fn, ref), batch)
    other, oref = build(spec, batch, 3)
    two = td.apply(lambda x, y: x.to(torch.float64) - y.to(torch.float64), other)
    assert_same(two, ref_map(lambda x, y: x.to(torch.float64) - y.to(torch.float64), ref, oref), batch)
    seen = []
    td.named_apply(lambda k, x: seen.append(k if isinstance(k, tuple) else (k,)), nested_keys=True)
    assert sorted(seen) == sorted(k for k, _ in ref_items(ref))


@SETTINGS
@given(data=st.data())
def test_shape_ops_match_leafwise(data):
    batch, _, td, ref = data.draw(containers(min_dims=1))
    bd = len(batch)
    dim = data.draw(st.integers(-bd, bd - 1))
    d = dim % bd
    parts = td.unbind(dim)
    assert len(parts) == batch[d]
    for i, p in enumerate(parts):
        assert_same(p, ref_map(lambda t, i=i: t.select(d, i), ref), batch[:d] + batch[d + 1 :])
    size = data.draw(st.integers(1, 4))
    splits = td.split(size, dim)
    assert len(splits) == len(torch.empty(batch).split(size, d))
    for j, p in enumerate(splits):
        exp = ref_map(lambda t, j=j: t.split(size, d)[j], ref)
        assert_same(p, exp, batch[:d] + (min(size, batch[d] - j * size),) + batch[d + 1 :])
    perm = data.draw(st.permutations(list(range(bd))))
    assert_same(td.permute(*perm), ref_map(lambda t: t.permute(*perm, *range(bd, t.ndim)), ref),
                [batch[p] for p in perm])
    udim = data.draw(st.integers(-bd - 1, bd))
    ud = udim % (bd + 1)
    un = td.unsqueeze(udim)
    assert_same(un, ref_map(lambda t: t.unsqueeze(ud), ref), batch[:ud] + (1,) + batch[ud:])
    assert_same(un.squeeze(udim), ref, batch)
    assert_same(td.flip(dim), ref_map(lambda t: t.flip(d), ref), batch)


@SETTINGS
@given(data=st.data())
def test_reductions_match_leafwise(data):
    batch = data.draw(batch_shapes(1, 3, min_size=1))
    spec = data.draw(structures(tuple(FLOAT_DTYPES)))
    td, ref = build(spec, batch, data.draw(st.integers(0, 1000)))
    bd = len(batch)
    dim = data.draw(st.integers(-bd, bd - 1))
    d = dim % bd
    keepdim = data.draw(st.booleans())
    name = data.draw(st.sampled_from(["sum", "mean", "amax", "amin", "prod"]))

    def ref_fn(t):
        if name == "prod":
            return t.prod(d, keepdim=keepdim)
        return getattr(torch, name)(t, dim=d, keepdim=keepdim)

    method = {"amax": "max", "amin": "min"}.get(name, name)
    # (max/min give (values, indices) by default, as torch.max: ask for the values alone)
    out = getattr(td, method)(dim=dim, keepdim=keepdim, **({"return_indices": False} if name != method else {}))
    bs = batch[:d] + ((1,) if keepdim else ()) + batch[d + 1 :]
    assert_same(out, ref_map(ref_fn, ref), bs)
    total = getattr(td, method)(reduce=True)
    flat = torch.cat([t.reshape(-1).double() for _, t in ref_items(ref)])
    exp = {"amax": flat.max(), "amin": flat.min(), "sum": flat.sum(), "mean": flat.mean(), "prod": flat.prod()}[name]
    torch.testing.assert_close(total.double(), exp, rtol=1e-4, atol=1e-5)


@SETTINGS
@given(data=st.data())
def test_reduce_true_with_dim(data):
    """``reduce=True, dim=d``: dim ``d``, every feature dim and all leaves reduced together."""
    batch = data.draw(batch_shapes(1, 3, min_size=1))
    spec = data.draw(structures(tuple(FLOAT_DTYPES)))
    td, ref = build(spec, batch, data.draw(st.integers(0, 1000)))
    bd = len(batch)
    dim = data.draw(st.integers(-bd, bd - 1))
    d = dim % bd
    kept = [i for i in range(bd) if i != d]
    name = data.draw(st.sampled_from(["sum", "mean", "amax", "amin"]))
    method = {"amax": "max", "amin": "min"}.get(name, name)
    out = getattr(td, method)(dim=dim, reduce=True)
    flat = torch.cat(
        [t.double().movedim(kept, list(range(len(kept)))).reshape(*[batch[i] for i in kept], -1)
         for _, t in ref_items(ref)], -1)
    exp = getattr(torch, name)(flat, dim=-1)
    torch.testing.assert_close(out.double(), exp, rtol=1e-4, atol=1e-5)


@SETTINGS
@given(data=st.data())
def test_masks_and_where_match_leafwise(data):
    batch, spec, td, ref = data.draw(containers(min_dims=1))
    k = data.draw(st.integers(1, len(batch)))
    shape = batch[:k]
    bits = data.draw(st.lists(st.booleans(), min_size=math.prod(shape), max_size=math.prod(shape)))
    mask = torch.tensor(bits, dtype=torch.bool).reshape(shape)

    def bc(t):
        return mask.reshape(mask.shape + (1,) * (t.ndim - mask.ndim))

    assert_same(td.masked_fill(mask, 1), ref_map(lambda t: t.masked_fill(bc(t), 1), ref), batch)
    other, oref = build(spec, batch, 11)
    assert_same(torch.where(mask, td, other), ref_map(lambda a, b: torch.where(bc(a), a, b), ref, oref), batch)
    selected = td[mask]
    assert_same(selected, ref_map(lambda t: t[mask], ref), (int(mask.sum()),) + batch[k:])


@SETTINGS
@given(data=st.data())
def test_keys_and_round_trips(data):
    batch, _, td, ref = data.draw(containers())
    leaf_keys = sorted(k for k, _ in ref_items(ref))
    got = sorted(k if isinstance(k, tuple) else (k,) for k in td.keys(True, True))
    assert got == leaf_keys
    flat = td.flatten_keys("/")
    assert sorted(flat.keys()) == sorted("/".join(k) for k in leaf_keys)
    back = flat.unflatten_keys("/")
    assert sorted(k if isinstance(k, tuple) else (k,) for k in back.keys(True, True)) == leaf_keys
    for k in leaf_keys:
        assert torch.equal(back.get(k), td.get(k))
    rebuilt = TensorDict.from_dict(td.to_dict(), batch_size=batch)
    assert sorted(k if isinstance(k, tuple) else (k,) for k in rebuilt.keys(True, True)) == leaf_keys
    for k in leaf_keys:
        assert torch.equal(rebuilt.get(k), td.get(k))
    cl = td.clone()
    assert_same(cl, ref, batch)
    assert (cl == td).all()
    if any(t.numel() for _, t in ref_items(ref)):
        key, t = next((k, t) for k, t in ref_items(ref) if t.numel())
        cl.get(key).view(-1)[0] = ~t.view(-1)[0] if t.dtype == torch.bool else t.view(-1)[0] + 1
        assert not (cl == td).all()
        assert_same(td, ref, batch)  # the clone owns its memory


@FEW
@given(data=st.data())
def test_save_load_memmap_round_trip(data):
    batch, _, td, ref = data.draw(containers())
    with tempfile.TemporaryDirectory() as d:
        td.save(d + "/saved")
        assert_same(TensorDict.load(d + "/saved"), ref, batch)
        mm = td.memmap(d + "/mm")
        assert mm.is_locked
        assert_same(mm, ref, batch)
        assert_same(TensorDict.load_memmap(d + "/mm"), ref, batch)


@FEW
@given(data=st.data())
def test_lazy_stack_matches_dense(data):
    batch = data.draw(batch_shapes(0, 2))
    spec = data.draw(structures())
    n = data.draw(st.integers(1, 3))
    pairs = [build(spec, batch, data.draw(st.integers(0, 1000))) for _ in range(n)]
    dim = data.draw(st.integers(0, len(batch)))
    out = lazy_stack([p[0] for p in pairs], dim)
    exp = ref_map(lambda *ts: torch.stack(ts, dim), pairs[0][1], *[p[1] for p in pairs[1:]])
    assert_same(out, exp, batch[:dim] + (n,) + batch[dim:])
    if out.batch_dims:
        idx = data.draw(indices(tuple(out.batch_size)))
        norm = norm_index(idx, out.batch_dims)
        exp_bs = torch.empty(tuple(out.batch_size))[norm].shape
        assert_same(out[idx], ref_map(lambda t: t[norm], exp), exp_bs)
