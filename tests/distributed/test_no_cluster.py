"""What needs no running Ray: a dead address is a clear error; the actors' episode returns
and the wire format. (That ``steersman.distributed`` imports without Ray and names the extra
when used is checked in the fresh interpreter of test_ray.py's killed-driver script.)"""

from __future__ import annotations

import socket
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st


def test_dead_address_fails_within_seconds(monkeypatch):
    ray = pytest.importorskip("ray")
    from steersman.distributed import init_ray

    # as in a fresh process, also when this one is connected to the session's test cluster
    # (tests run in any order): the address is checked before ray.init, which is never reached
    monkeypatch.setattr(ray, "is_initialized", lambda: False)

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = time.monotonic()
    with pytest.raises(ConnectionError, match=rf"no Ray cluster answers at 127.0.0.1:{port}.*ray start --head"):
        init_ray(address=f"127.0.0.1:{port}", connect_timeout=2.0)
    assert time.monotonic() - t < 10


def _loop_reference(reward, done, carry):
    """The plain loop: add each step's reward, emit and reset the rows whose episode ends."""
    carry = carry.clone()
    out = []
    for t in range(reward.shape[1]):
        carry += reward[:, t]
        for row in range(reward.shape[0]):
            if done[row, t]:
                out.append(float(carry[row]))
                carry[row] = 0.0
    return out, carry


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 4), steps=st.integers(1, 12), batches=st.integers(1, 3), p_done=st.floats(0.0, 0.6),
       seed=st.integers(0, 2**16))
def test_actor_episode_returns_equal_a_loop(rows, steps, batches, p_done, seed):
    """The returns the actors compute (vectorised) equal a plain loop's, across batches."""
    from steersman import TensorDict
    from steersman.distributed.collector import _episode_returns

    g = torch.Generator().manual_seed(seed)
    carry, ref_carry = None, torch.zeros(rows, dtype=torch.float64)
    for _ in range(batches):
        reward = torch.randint(-3, 4, (rows, steps, 1), generator=g).float()  # exact sums in any order
        done = torch.rand(rows, steps, 1, generator=g) < p_done
        batch = TensorDict({"next": {"reward": reward, "done": done}}, [rows, steps])
        got, carry = _episode_returns(batch, carry)
        want, ref_carry = _loop_reference(reward[..., 0].double(), done[..., 0], ref_carry)
        assert got == want
        assert torch.equal(carry, ref_carry)


def test_packed_tensordicts_round_trip_through_pickle():
    """What crosses Ray (samples, batches, extends): the same keys in the same order, nested
    batch sizes, dtypes and values; writable tensors; what the packed form cannot carry is
    sent as it is."""
    import pickle

    from steersman import TensorDict
    from steersman.distributed._wire import pack, unpack

    td = TensorDict({"a": torch.randn(5, 2), "next": {"reward": torch.randn(5, 1),
                                                      "done": torch.zeros(5, 1, dtype=torch.bool)},
                     "group": TensorDict({"x": torch.arange(15).view(5, 3)}, [5, 3]), "z": torch.ones(5)}, [5])
    back = unpack(pickle.loads(pickle.dumps(pack(td), protocol=5)))
    assert list(back.keys(True, True)) == list(td.keys(True, True))
    assert back.batch_size == td.batch_size and back["group"].batch_size == (5, 3)
    for key, value in td.items(True, True):
        got = back.get(key)
        assert got.dtype == value.dtype and torch.equal(got, value), key
    back["a"].add_(1.0)  # a tensor of its own
    assert not torch.equal(back["a"], td["a"])
    odd = TensorDict({"a": torch.ones(3, dtype=torch.bfloat16)}, [3])
    assert pack(odd) is odd and unpack(odd) is odd
    assert pack([1, 2]) == [1, 2]


_DTYPES = [torch.float32, torch.float64, torch.int64, torch.int8, torch.uint8, torch.bool, torch.bfloat16,
           torch.complex64, torch.float16]


@st.composite
def _tensordicts(draw):
    """A plain TensorDict of random entries (some nested, some with more batch dims), made
    n times with the same layout and different values."""
    from steersman import TensorDict

    batch = tuple(draw(st.lists(st.integers(0, 3), min_size=0, max_size=2)))
    spec = []
    for k in range(draw(st.integers(1, 5))):
        nested = draw(st.sampled_from([(), ("next",), ("group", "deep")]))
        extra = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
        spec.append(((*nested, f"k{k}"), draw(st.sampled_from(_DTYPES)), extra, draw(st.booleans())))
    n = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        td = TensorDict({}, batch)
        for path, dtype, extra, transposed in spec:
            shape = (*batch, *extra)
            value = (torch.randn(shape, generator=g) * 50).to(dtype)
            if transposed and value.dim() >= 2:  # a non-contiguous tensor
                value = value.transpose(0, 1).contiguous().transpose(0, 1)
            td.set(path, value)
        out.append(td)
    return out


@settings(max_examples=30, deadline=None)
@given(tds=_tensordicts())
def test_flat_batches_through_pickle_equal_torch_stack(tds):
    """What a collector actor sends: one byte buffer per batch (its layout aside) gives, on the
    driver, the batch itself (``stack=False``) or ``torch.stack`` of the actors' batches: the
    same keys in the same order, batch sizes (nested ones too), dtypes and values; contiguous
    tensors of their own (writable, not sharing the received buffers)."""
    import pickle

    import numpy as np

    from steersman.distributed._wire import flat_layout, pack_flat, unpack_flat

    layout = pickle.loads(pickle.dumps(flat_layout(tds[0])))
    assert layout.id == flat_layout(tds[0]).id and layout is not None
    buffers = []
    for td in tds:
        buf = np.empty(layout.nbytes, dtype=np.uint8)
        assert pack_flat(td, layout, buf)
        received = pickle.loads(pickle.dumps(buf, protocol=5))
        received.flags.writeable = False  # as Ray hands it over
        buffers.append(received)
    for got, want in ((unpack_flat(layout, buffers[:1]), tds[0]),
                      (unpack_flat(layout, buffers, stack=True), torch.stack(tds, 0))):
        assert got.batch_size == want.batch_size
        assert list(got.keys(True)) == list(want.keys(True))
        for key, value in want.items(True):
            if isinstance(value, torch.Tensor):
                g = got.get(key)
                assert g.dtype == value.dtype and g.shape == value.shape and g.is_contiguous(), key
                assert torch.equal(g.view(torch.uint8) if g.dtype == torch.bool else g, value.view(torch.uint8)
                                   if value.dtype == torch.bool else value), key
            else:
                assert got.get(key).batch_size == value.batch_size, key
        for value in got.values(True, True):
            if value.numel():
                value.view(-1)[0] = value.view(-1)[1 % value.numel()]  # writable, and no error about strides


def test_flat_layout_refuses_what_it_cannot_carry_and_pack_checks_the_layout():
    """``flat_layout`` is None for what the byte buffer does not carry (names, non-tensor
    entries, another container); ``pack_flat`` is False for a TensorDict of another layout
    (then the actor builds a new one), whatever differs."""
    import numpy as np

    from steersman import TensorDict
    from steersman.distributed._wire import flat_layout, pack_flat

    def make():
        return TensorDict({"a": torch.zeros(4, 2), "next": {"r": torch.zeros(4, 1)}}, [4])

    layout = flat_layout(make())
    buf = np.empty(layout.nbytes, dtype=np.uint8)
    assert pack_flat(make(), layout, buf)
    named = make()
    named.names = ["t"]
    assert flat_layout(named) is None
    odd = make()
    odd.set_non_tensor("tag", "x")
    assert flat_layout(odd) is None
    assert flat_layout({"a": torch.zeros(2)}) is None
    variants = {
        "shape": lambda td: td.set("a", torch.zeros(4, 3)),
        "dtype": lambda td: td.set("a", torch.zeros(4, 2, dtype=torch.float64)),
        "extra key": lambda td: td.set("b", torch.zeros(4)),
        "extra nested key": lambda td: td.set(("next", "d"), torch.zeros(4)),
        "missing key": lambda td: td.del_(("next", "r")),
        "batch size": lambda td: td.__setattr__("batch_size", torch.Size([])),
        "nested batch size": lambda td: td.set("next", TensorDict({"r": torch.zeros(4, 1)}, [4, 1])),
    }
    for name, change in variants.items():
        td = make()
        change(td)
        assert not pack_flat(td, layout, buf), name
        assert flat_layout(td).id != layout.id, name


@pytest.mark.parametrize("kwargs, message", [
    ({"num_collectors": 0}, r"num_collectors must be a positive int, got 0"),
    ({"frames_per_batch": 0}, r"frames_per_batch must be a positive int, got 0"),
    ({"num_collectors": 3, "sync": True}, r"frames_per_batch=16 must be a multiple of num_collectors=3"),
    ({"total_frames": -5}, r"total_frames must be a non-negative int or -1, got -5"),
    ({"remote_configs": [{}, {}]}, r"2 remote_configs for num_collectors=1"),
    ({"start_timeout": 0}, r"start_timeout must be a positive number of seconds, got 0"),
    ({"start_timeout": "60"}, r"start_timeout must be a positive number of seconds, got '60'"),
])
def test_ray_collector_refuses_bad_arguments_before_starting_ray(kwargs, message, monkeypatch):
    """Each bad argument is a ValueError naming it and its value, raised before Ray is
    started or joined (``init_ray`` is never reached)."""
    pytest.importorskip("ray")
    from steersman.distributed import collector
    from steersman.envs import CartPoleEnv

    monkeypatch.setattr(collector, "init_ray", lambda *a, **k: pytest.fail("Ray started despite bad arguments"))
    with pytest.raises(ValueError, match=message):
        collector.RayCollector(CartPoleEnv, None, **{"frames_per_batch": 16, "total_frames": 32, **kwargs})
