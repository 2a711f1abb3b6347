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
