"""Tests for steersman.tensordict.memmap (MemoryMappedTensor and raw tensor files)."""

from __future__ import annotations

import copy
import os
import pickle

import pytest
import torch
import torch.multiprocessing

from steersman.tensordict.memmap import (
    MemoryMappedTensor,
    load_tensor_file,
    save_tensor_file,
)

ALL_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
]


def _sample(dtype: torch.dtype, shape=(3, 4)) -> torch.Tensor:
    """Distinct, non-trivial values for every dtype (so a wrong byte layout is caught)."""
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        real = torch.randn(shape, generator=g, dtype=torch.float64)
        imag = torch.randn(shape, generator=g, dtype=torch.float64)
        return torch.complex(real, imag).to(dtype)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return torch.randint(0, 100, shape, generator=g).to(dtype)


def _file_contents(path, dtype, shape) -> torch.Tensor:
    """Independent re-read of the file (a copy, so later writes don't affect it)."""
    return load_tensor_file(path, dtype, shape, mmap=False)


# ----------------------------------------------------------------------------- constructors
class TestConstructors:
    @pytest.mark.parametrize("use_file", [True, False])
    def test_from_tensor(self, tmp_path, use_file):
        src = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        filename = str(tmp_path / "t.mm") if use_file else None
        t = MemoryMappedTensor.from_tensor(src, filename=filename)
        assert isinstance(t, MemoryMappedTensor)
        assert t.filename == filename
        assert t.shape == src.shape and t.dtype == src.dtype
        assert torch.equal(t, src)
        # a copy, not an alias of the source
        src.zero_()
        assert t.sum().item() == 66
        if use_file:
            assert os.path.getsize(filename) == 12 * 4
            assert torch.equal(_file_contents(filename, torch.float32, (3, 4)), t)
        else:
            assert t.is_shared()

    def test_from_tensor_noncontiguous_and_grad(self, tmp_path):
        src = torch.arange(12.0).reshape(3, 4).t().requires_grad_()
        t = MemoryMappedTensor.from_tensor(src, filename=tmp_path / "nc.mm")
        assert not t.requires_grad
        assert t.shape == (4, 3)
        assert torch.equal(t, src.detach())
        assert t.filename == str(tmp_path / "nc.mm")  # PathLike accepted, stored as str

    def test_from_tensor_copy_data_false(self, tmp_path):
        src = torch.full((2, 3), 5, dtype=torch.int32)
        t = MemoryMappedTensor.from_tensor(src, filename=tmp_path / "a", copy_data=False)
        assert t.shape == src.shape and t.dtype == torch.int32
        assert (t == 0).all()  # fresh files are zero-filled, data was not copied

    def test_from_tensor_meta_input(self, tmp_path):
        src = torch.empty(2, 5, dtype=torch.float16, device="meta")
        t = MemoryMappedTensor.from_tensor(src, filename=tmp_path / "m")
        assert t.device.type == "cpu" and t.shape == (2, 5) and t.dtype == torch.float16
        assert os.path.getsize(tmp_path / "m") == 2 * 5 * 2

    def test_from_tensor_shape(self, tmp_path):
        src = torch.arange(6)
        t = MemoryMappedTensor.from_tensor(src, filename=tmp_path / "s", shape=(2, 3))
        assert t.shape == (2, 3)
        assert torch.equal(t, src.reshape(2, 3))
        with pytest.raises(ValueError, match="incompatible"):
            MemoryMappedTensor.from_tensor(src, shape=(4, 2))

    def test_from_tensor_non_tensor_input(self):
        t = MemoryMappedTensor.from_tensor([[1, 2], [3, 4]])
        assert t.dtype == torch.int64
        assert t.tolist() == [[1, 2], [3, 4]]

    def test_from_tensor_rejects_sparse(self):
        with pytest.raises(TypeError, match="dense"):
            MemoryMappedTensor.from_tensor(torch.eye(2).to_sparse())

    def test_from_tensor_same_file_returns_input(self, tmp_path):
        t = MemoryMappedTensor.from_tensor(torch.ones(3), filename=tmp_path / "x")
        assert MemoryMappedTensor.from_tensor(t, filename=tmp_path / "x") is t
        anon = MemoryMappedTensor.from_tensor(torch.ones(3))
        assert MemoryMappedTensor.from_tensor(anon) is anon

    def test_from_tensor_copy_existing(self, tmp_path):
        t = MemoryMappedTensor.from_tensor(torch.arange(3), filename=tmp_path / "a")
        with pytest.raises(RuntimeError, match="copy_existing"):
            MemoryMappedTensor.from_tensor(t, filename=tmp_path / "b")
        assert not (tmp_path / "b").exists()
        t2 = MemoryMappedTensor.from_tensor(t, filename=tmp_path / "b", copy_existing=True)
        assert t2.filename == str(tmp_path / "b")
        assert torch.equal(t2, t)
        t2.fill_(9)
        assert t.tolist() == [0, 1, 2]  # independent file
        # copying a file-backed tensor into anonymous memory is always allowed
        anon = MemoryMappedTensor.from_tensor(t)
        assert anon.filename is None and torch.equal(anon, t)

    @pytest.mark.parametrize(
        "shape_args", [(2, 3), ((2, 3),), ([2, 3],), (torch.Size([2, 3]),)], ids=str
    )
    @pytest.mark.parametrize("use_file", [True, False])
    def test_empty_zeros_ones_full_shapes(self, tmp_path, shape_args, use_file):
        def fn(name):
            return str(tmp_path / name) if use_file else None

        e = MemoryMappedTensor.empty(*shape_args, dtype=torch.int16, filename=fn("e"))
        z = MemoryMappedTensor.zeros(*shape_args, filename=fn("z"))
        o = MemoryMappedTensor.ones(*shape_args, dtype=torch.bfloat16, filename=fn("o"))
        f = MemoryMappedTensor.full(*shape_args, fill_value=2.5, filename=fn("f"))
        for t in (e, z, o, f):
            assert isinstance(t, MemoryMappedTensor)
            assert t.shape == torch.Size([2, 3])
        assert e.dtype == torch.int16
        assert z.dtype == torch.get_default_dtype() and (z == 0).all()
        assert o.dtype == torch.bfloat16 and (o == 1).all()
        assert f.dtype == torch.float32 and (f == 2.5).all()
        if use_file:
            assert torch.equal(_file_contents(fn("o"), torch.bfloat16, (2, 3)), o)
            assert torch.equal(_file_contents(fn("f"), torch.float32, (2, 3)), f)

    def test_full_infers_dtype(self):
        assert MemoryMappedTensor.full(2, fill_value=True).dtype == torch.bool
        assert MemoryMappedTensor.full(2, fill_value=3).dtype == torch.int64
        assert MemoryMappedTensor.full(2, fill_value=1j).dtype == torch.complex64
        t = MemoryMappedTensor.full(2, fill_value=3, dtype=torch.uint8)
        assert t.dtype == torch.uint8 and t.tolist() == [3, 3]

    def test_zero_dim_constructors(self, tmp_path):
        t = MemoryMappedTensor.full((), fill_value=4.0, filename=tmp_path / "s")
        assert t.shape == () and t.item() == 4.0
        assert MemoryMappedTensor.zeros(()).shape == ()
        assert MemoryMappedTensor.empty(dtype=torch.int8).shape == ()

    @pytest.mark.parametrize("use_file", [True, False])
    def test_like_constructors(self, tmp_path, use_file):
        src = torch.randn(2, 3).to(torch.float64)

        def fn(name):
            return str(tmp_path / name) if use_file else None

        e = MemoryMappedTensor.empty_like(src, filename=fn("e"))
        z = MemoryMappedTensor.zeros_like(src, filename=fn("z"))
        o = MemoryMappedTensor.ones_like(src, filename=fn("o"))
        f = MemoryMappedTensor.full_like(src, -1.5, filename=fn("f"))
        for t, name in ((e, "e"), (z, "z"), (o, "o"), (f, "f")):
            assert isinstance(t, MemoryMappedTensor)
            assert t.shape == src.shape and t.dtype == torch.float64
            assert t.filename == fn(name)
        assert (z == 0).all() and (o == 1).all() and (f == -1.5).all()
        assert MemoryMappedTensor.zeros_like(src, dtype=torch.int32).dtype == torch.int32

    def test_bad_shapes(self):
        with pytest.raises(ValueError, match="non-negative"):
            MemoryMappedTensor.empty(2, -1)
        with pytest.raises(TypeError):
            MemoryMappedTensor.empty(2, "a")

    def test_non_cpu_device_rejected(self):
        with pytest.raises(ValueError, match="device"):
            MemoryMappedTensor.empty(2, device="cuda")
        with pytest.raises(ValueError, match="device"):
            MemoryMappedTensor.zeros(2, device=torch.device("meta"))
        assert MemoryMappedTensor.zeros(2, device="cpu").device.type == "cpu"

    def test_creates_parent_directories(self, tmp_path):
        path = tmp_path / "a" / "b" / "c.mm"
        t = MemoryMappedTensor.ones(3, filename=path)
        assert path.exists() and t.filename == str(path)


# ------------------------------------------------------------------------- dtypes / shapes
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_dtype_round_trip(tmp_path, dtype):
    src = _sample(dtype)
    path = str(tmp_path / "x.mm")
    t = MemoryMappedTensor.from_tensor(src, filename=path)
    assert t.dtype == dtype and torch.equal(t, src)
    assert os.path.getsize(path) == src.numel() * src.element_size()
    del t
    back = MemoryMappedTensor.from_filename(path, dtype, src.shape)
    assert isinstance(back, MemoryMappedTensor)
    assert back.dtype == dtype and back.shape == src.shape
    assert torch.equal(back, src)
    # raw files round trip too, in both modes
    raw = str(tmp_path / "x.bin")
    save_tensor_file(raw, src)
    for mmap in (True, False):
        loaded = load_tensor_file(raw, dtype, src.shape, mmap=mmap)
        assert torch.equal(loaded, src)
        assert isinstance(loaded, MemoryMappedTensor) == mmap


def test_bool_writes_through(tmp_path):
    path = str(tmp_path / "b.mm")
    t = MemoryMappedTensor.zeros(5, dtype=torch.bool, filename=path)
    t[1] = True
    t[3:] = True
    assert _file_contents(path, torch.bool, (5,)).tolist() == [False, True, False, True, True]
    with open(path, "rb") as f:
        assert f.read() == bytes([0, 1, 0, 1, 1])


def test_zero_dim(tmp_path):
    path = str(tmp_path / "s.mm")
    t = MemoryMappedTensor.from_tensor(torch.tensor(3.5, dtype=torch.float64), filename=path)
    assert t.shape == () and t.item() == 3.5
    t.fill_(-2.0)
    back = MemoryMappedTensor.from_filename(path, torch.float64, ())
    assert back.shape == () and back.item() == -2.0


@pytest.mark.parametrize("shape", [(0,), (0, 3), (4, 0, 2)], ids=str)
@pytest.mark.parametrize("use_file", [True, False])
def test_zero_numel(tmp_path, shape, use_file):
    path = str(tmp_path / "empty.mm") if use_file else None
    t = MemoryMappedTensor.zeros(shape, dtype=torch.int32, filename=path)
    assert t.shape == shape and t.numel() == 0
    t2 = MemoryMappedTensor.from_tensor(torch.empty(shape), filename=path, existsok=True)
    assert t2.shape == shape
    if use_file:
        assert os.path.exists(path) and os.path.getsize(path) == 0
        back = MemoryMappedTensor.from_filename(path, torch.float32, shape)
        assert back.shape == shape and back.filename == path
        raw = str(tmp_path / "e.bin")
        save_tensor_file(raw, torch.empty(shape))
        assert os.path.getsize(raw) == 0
        assert load_tensor_file(raw, torch.float32, shape, mmap=False).shape == shape
        assert load_tensor_file(raw, torch.float32, shape, mmap=True).shape == shape


# ------------------------------------------------------------------- ops, views, write-through
def test_ops_return_plain_tensors():
    t = MemoryMappedTensor.from_tensor(torch.arange(6.0).reshape(2, 3))
    results = [
        t + 1,
        t * t,
        t[0],
        t[:, 1:],
        t.view(-1),
        t.reshape(3, 2),
        t.sum(),
        t.clone(),
        torch.stack([t, t]),
        t.to(torch.float64),
        torch.nn.functional.relu(t),
    ]
    for r in results:
        assert type(r) is torch.Tensor, type(r)
    assert isinstance(t, torch.Tensor)
    assert type(t) is MemoryMappedTensor


def test_views_write_through_to_file(tmp_path):
    path = str(tmp_path / "v.mm")
    t = MemoryMappedTensor.zeros(4, 5, dtype=torch.float32, filename=path)
    row = t[1]
    col = t[:, 2]
    block = t.view(2, 10)[1, :3]
    transposed = t.t()
    assert type(row) is torch.Tensor  # plain tensors ...
    row.fill_(1.0)  # ... still aliasing the mapped file
    col.add_(10.0)
    block.copy_(torch.tensor([7.0, 8.0, 9.0]))
    transposed[4, 3] = -1.0
    t[3, 0] = 42.0

    expected = torch.zeros(4, 5)
    expected[1] = 1.0
    expected[:, 2] += 10.0
    expected.view(2, 10)[1, :3] = torch.tensor([7.0, 8.0, 9.0])
    expected[3, 4] = -1.0
    expected[3, 0] = 42.0
    reopened = MemoryMappedTensor.from_filename(path, torch.float32, (4, 5))
    assert torch.equal(reopened, expected)
    assert torch.equal(_file_contents(path, torch.float32, (4, 5)), expected)
    # and writes through the re-opened mapping are visible in the first one
    reopened[0, 0] = 5.0
    assert t[0, 0].item() == 5.0


def test_out_of_place_ops_do_not_touch_file(tmp_path):
    path = str(tmp_path / "o.mm")
    t = MemoryMappedTensor.ones(3, filename=path)
    r = t * 2
    r.fill_(100.0)
    assert _file_contents(path, torch.float32, (3,)).tolist() == [1.0, 1.0, 1.0]


def test_repr_mentions_memmap_and_filename(tmp_path):
    path = str(tmp_path / "r.mm")
    t = MemoryMappedTensor.from_tensor(torch.arange(3), filename=path)
    r = repr(t)
    assert r.startswith("MemoryMappedTensor(")
    assert path in r
    assert "0, 1, 2" in r
    assert "filename=None" in repr(MemoryMappedTensor.zeros(2))


# ---------------------------------------------------------------------------- from_filename
def test_from_filename_index(tmp_path):
    path = str(tmp_path / "i.mm")
    MemoryMappedTensor.from_tensor(torch.arange(12).reshape(3, 4), filename=path)
    row = MemoryMappedTensor.from_filename(path, torch.int64, (3, 4), index=1)
    assert isinstance(row, MemoryMappedTensor) and row.filename == path
    assert row.tolist() == [4, 5, 6, 7]
    row.fill_(0)  # basic indexing is a view of the file
    assert _file_contents(path, torch.int64, (3, 4))[1].tolist() == [0, 0, 0, 0]
    sl = MemoryMappedTensor.from_filename(path, torch.int64, (3, 4), index=(slice(None), 0))
    assert isinstance(sl, MemoryMappedTensor) and sl.tolist() == [0, 0, 8]
    # advanced indexing copies: returned as a plain tensor, not pretending to be file-backed
    adv = MemoryMappedTensor.from_filename(path, torch.int64, (3, 4), index=torch.tensor([2, 0]))
    assert type(adv) is torch.Tensor
    assert adv.tolist() == [[8, 9, 10, 11], [0, 1, 2, 3]]


def test_from_filename_errors(tmp_path):
    missing = str(tmp_path / "missing.mm")
    with pytest.raises(FileNotFoundError, match="missing.mm"):
        MemoryMappedTensor.from_filename(missing, torch.float32, (2,))
    assert not os.path.exists(missing)  # torch.from_file would have created it
    small = str(tmp_path / "small.mm")
    MemoryMappedTensor.zeros(2, filename=small)
    with pytest.raises(ValueError, match="needs 12 bytes"):
        MemoryMappedTensor.from_filename(small, torch.float32, (3,))
    assert os.path.getsize(small) == 8  # not silently grown


# ---------------------------------------------------------------------------------- existsok
def test_existsok(tmp_path):
    path = str(tmp_path / "e.mm")
    MemoryMappedTensor.ones(4, filename=path)
    constructors = [
        lambda **kw: MemoryMappedTensor.empty(4, **kw),
        lambda **kw: MemoryMappedTensor.zeros(4, **kw),
        lambda **kw: MemoryMappedTensor.ones(4, **kw),
        lambda **kw: MemoryMappedTensor.full(4, fill_value=2, **kw),
        lambda **kw: MemoryMappedTensor.from_tensor(torch.zeros(4), **kw),
        lambda **kw: MemoryMappedTensor.zeros_like(torch.zeros(4), **kw),
    ]
    for make in constructors:
        with pytest.raises(FileExistsError, match="e.mm"):
            make(filename=path)
    # the failed attempts left the file untouched
    assert _file_contents(path, torch.float32, (4,)).tolist() == [1.0] * 4
    t = MemoryMappedTensor.from_tensor(
        torch.arange(6, dtype=torch.int16), filename=path, existsok=True
    )
    assert t.tolist() == list(range(6))
    assert os.path.getsize(path) == 12  # resized to the new content
    assert _file_contents(path, torch.int16, (6,)).tolist() == list(range(6))
    z = MemoryMappedTensor.zeros(2, dtype=torch.int16, filename=path, existsok=True)
    assert z.tolist() == [0, 0] and os.path.getsize(path) == 4


# -------------------------------------------------------------------------------- pickling
def test_pickle_file_backed_shares_data(tmp_path):
    path = str(tmp_path / "p.mm")
    t = MemoryMappedTensor.zeros(1000, dtype=torch.float64, filename=path)
    payload = pickle.dumps(t)
    assert len(payload) < 1000  # only (filename, dtype, shape), not 8000 bytes of data
    assert b"p.mm" in payload
    u = pickle.loads(payload)
    assert isinstance(u, MemoryMappedTensor) and u.filename == path
    assert u.shape == t.shape and u.dtype == t.dtype
    u[10] = 3.0
    assert t[10].item() == 3.0  # same file, no copy
    t[11] = 4.0
    assert u[11].item() == 4.0


def test_pickle_view_keeps_geometry(tmp_path):
    path = str(tmp_path / "pv.mm")
    base = MemoryMappedTensor.from_tensor(torch.arange(20.0).reshape(4, 5), filename=path)
    view = MemoryMappedTensor.from_filename(path, torch.float32, (4, 5), index=(slice(1, 3), 2))
    assert view.tolist() == [7.0, 12.0]
    u = pickle.loads(pickle.dumps(view))
    assert u.tolist() == [7.0, 12.0] and u.stride() == view.stride()
    u[1] = -1.0
    assert base[2, 2].item() == -1.0


def test_pickle_anonymous_copies_with_plain_pickle():
    t = MemoryMappedTensor.from_tensor(torch.arange(4))
    u = pickle.loads(pickle.dumps(t))
    assert isinstance(u, MemoryMappedTensor) and u.filename is None
    assert torch.equal(u, t)


def test_deepcopy_is_independent(tmp_path):
    t = MemoryMappedTensor.from_tensor(torch.arange(3.0), filename=tmp_path / "d.mm")
    c = copy.deepcopy(t)
    assert isinstance(c, MemoryMappedTensor) and c.filename is None
    c.fill_(0.0)
    assert t.tolist() == [0.0, 1.0, 2.0]


# --------------------------------------------------------------------------- cross-process
def _child(anon, filed, path, seen):
    # runs in one spawned process (the costly part of these checks: one interpreter start
    # for all three): two tensors arrived through pickling, one is opened by file name
    assert isinstance(anon, MemoryMappedTensor) and isinstance(filed, MemoryMappedTensor)
    anon[1] = 7
    filed[1] = 7
    t = MemoryMappedTensor.from_filename(path, torch.float32, (2, 3))
    seen[0] = float(t.sum())
    t[1] *= 10


def test_cross_process_spawn_and_from_filename(tmp_path):
    """A spawned child writes into an anonymous (shared-memory) and a file-backed tensor it
    got through pickling, and into a file it opens by name; the parent sees every write
    without re-opening, and the child saw the parent's data."""
    anon = MemoryMappedTensor.zeros(3, 4, dtype=torch.int64)
    filed_path = str(tmp_path / "mp.mm")
    filed = MemoryMappedTensor.zeros(3, 4, dtype=torch.int64, filename=filed_path)
    sub_path = str(tmp_path / "sub.mm")
    sub = MemoryMappedTensor.from_tensor(torch.arange(6, dtype=torch.float32), filename=sub_path)
    seen = MemoryMappedTensor.zeros(1, dtype=torch.float64)
    # torch.multiprocessing registers the shared-memory reducers used for anonymous tensors
    ctx = torch.multiprocessing.get_context("spawn")
    p = ctx.Process(target=_child, args=(anon, filed, sub_path, seen))
    p.start()
    p.join(timeout=120)
    assert p.exitcode == 0
    expected = torch.zeros(3, 4, dtype=torch.int64)
    expected[1] = 7
    assert torch.equal(anon, expected) and torch.equal(filed, expected)
    assert torch.equal(_file_contents(filed_path, torch.int64, (3, 4)), expected)
    assert seen.item() == 15.0  # the child saw the parent's data
    assert sub.tolist() == [0.0, 1.0, 2.0, 30.0, 40.0, 50.0]  # the parent sees the child's writes


# ------------------------------------------------------------------------ raw tensor files
def test_save_tensor_file_atomic_and_clean(tmp_path):
    path = str(tmp_path / "sub" / "w.bin")
    save_tensor_file(path, torch.arange(4, dtype=torch.int32))
    assert os.path.getsize(path) == 16
    # overwrite: readers holding the old file keep the old content (new inode via os.replace)
    old = load_tensor_file(path, torch.int32, (4,), mmap=True)
    save_tensor_file(path, torch.full((4,), 9, dtype=torch.int32))
    assert old.tolist() == [0, 1, 2, 3]
    assert load_tensor_file(path, torch.int32, (4,), mmap=False).tolist() == [9, 9, 9, 9]
    assert sorted(os.listdir(tmp_path / "sub")) == ["w.bin"]  # no temp files left


def test_save_tensor_file_failure_leaves_no_temp(tmp_path):
    path = str(tmp_path / "f.bin")
    with pytest.raises(ValueError, match="meta"):
        save_tensor_file(path, torch.empty(3, device="meta"))
    with pytest.raises(TypeError):
        save_tensor_file(path, [1, 2, 3])
    assert os.listdir(tmp_path) == []


def test_save_tensor_file_noncontiguous(tmp_path):
    path = str(tmp_path / "nc.bin")
    src = torch.arange(6, dtype=torch.int64).reshape(2, 3).t()
    save_tensor_file(path, src)
    assert torch.equal(load_tensor_file(path, torch.int64, (3, 2), mmap=False), src)


def test_load_tensor_file_modes_and_errors(tmp_path):
    path = str(tmp_path / "l.bin")
    save_tensor_file(path, torch.ones(2, 3))
    mm = load_tensor_file(path, torch.float32, (2, 3), mmap=True)
    mem = load_tensor_file(path, torch.float32, torch.Size([2, 3]), mmap=False)
    assert isinstance(mm, MemoryMappedTensor) and mm.filename == path
    assert type(mem) is torch.Tensor
    mem.zero_()  # private copy: file untouched
    assert _file_contents(path, torch.float32, (2, 3)).sum().item() == 6.0
    mm[0, 0] = 5.0  # mapping: file updated
    assert _file_contents(path, torch.float32, (2, 3))[0, 0].item() == 5.0
    with pytest.raises(ValueError, match="expected 48"):
        load_tensor_file(path, torch.float64, (2, 3))
    with pytest.raises(FileNotFoundError):
        load_tensor_file(str(tmp_path / "nope.bin"), torch.float32, (1,))
