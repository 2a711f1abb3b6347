"""TorchRL keyword arguments of the replay buffers, storages and writers: each accepted with
its effect, accepted as a documented no-op, or refused naming the option."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

from steersman.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    PrioritizedReplayBuffer,
    PrioritizedSampler,
    ReplayBuffer,
    RoundRobinWriter,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
    TensorStorage,
)
from steersman.tensordict import TensorDict


def _rb(**kw):
    rb = ReplayBuffer(storage=LazyTensorStorage(100), batch_size=8, **kw)
    rb.extend(torch.arange(100.0))
    return rb


def test_generator_makes_sampling_reproducible_and_leaves_global_rng_alone():
    draws = []
    for _ in range(2):
        rb = _rb(generator=torch.Generator().manual_seed(3))
        torch.manual_seed(123)
        state = torch.get_rng_state()
        draws.append(torch.stack([rb.sample() for _ in range(3)]))
        assert torch.equal(torch.get_rng_state(), state)  # the global RNG did not move
    assert torch.equal(draws[0], draws[1])
    # successive batches differ (the generator advances) and another seed gives other draws
    assert not torch.equal(draws[0][0], draws[0][1])
    other = _rb(generator=torch.Generator().manual_seed(4))
    assert not torch.equal(torch.stack([other.sample() for _ in range(3)]), draws[0])
    # reference: the same draws as RandomSampler's randint from that generator's state
    g = torch.Generator().manual_seed(3)
    assert torch.equal(draws[0][0], torch.randint(100, (8,), generator=g).float())


def test_generator_on_prioritized_buffers():
    out = []
    for _ in range(2):
        rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(50), batch_size=6,
                                               generator=torch.Generator().manual_seed(0))
        rb.extend(TensorDict(x=torch.arange(50.0), batch_size=[50]))
        out.append(rb.sample()["x"])
    assert torch.equal(out[0], out[1])
    with pytest.raises(TypeError, match="CPU torch.Generator"):
        ReplayBuffer(generator=1)


def test_transform_factory_is_called_once_and_used():
    calls = []

    def factory():
        calls.append(1)
        return lambda x: x * 2

    rb = _rb(transform_factory=factory)
    assert calls == [1]
    assert bool((rb.sample() % 2 == 0).all()) and rb[3] == 6.0
    with pytest.raises(ValueError, match="transform or transform_factory"):
        ReplayBuffer(transform=lambda x: x, transform_factory=factory)


def test_no_op_keywords_are_accepted():
    rb = _rb(compilable=True, delayed_init=True, dim_extend=0)
    assert rb.sample().shape == (8,)
    s = ListStorage(10, compilable=True)
    TensorStorage(torch.zeros(4), compilable=True)
    LazyTensorStorage(4, compilable=True, consolidated=True, shared_init=True, cleanup_memmap=False)
    RoundRobinWriter(compilable=True)
    assert len(s) == 0


@pytest.mark.parametrize("name,value,err", [
    ("checkpointer", object(), TypeError), ("consume_after_n_samples", 1, NotImplementedError),
    ("sample_unit", object(), TypeError), ("service_backend", "direct", NotImplementedError),
    ("service_backend_options", {}, NotImplementedError), ("transport", "tcp", NotImplementedError),
    ("transport_options", {}, NotImplementedError), ("shared", True, NotImplementedError),
    ("dim_extend", -1, ValueError),
])
def test_unsupported_keywords_are_refused_by_name(name, value, err):
    with pytest.raises(err, match=name):
        ReplayBuffer(storage=LazyTensorStorage(4), **{name: value})


def test_prioritized_sampler_options():
    rb = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(20), sampler_device="cpu", sync=True)
    rb.extend(torch.arange(20.0))
    own = PrioritizedSampler(20, alpha=0.9, beta=0.1)
    rb2 = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(20), sampler=own)
    assert rb2.sampler is own and rb.sampler.alpha == 0.6
    with pytest.raises(NotImplementedError, match="sync=False"):
        PrioritizedReplayBuffer(alpha=0.6, beta=0.4, sync=False)
    with pytest.raises(ValueError, match="priority trees live on the CPU"):
        TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, sampler_device="cuda")
    with pytest.raises(TypeError, match="PrioritizedSampler"):
        PrioritizedReplayBuffer(alpha=0.6, beta=0.4, sampler=object())


def test_list_storage_device_moves_tensors_only():
    s = ListStorage(4, device="meta")
    s.set([0, 1, 2], [torch.zeros(2), TensorDict(a=torch.ones(1)), "text"])
    assert s.get(0).device.type == "meta" and s.get(1)["a"].device.type == "meta" and s.get(2) == "text"
    rb = TensorDictReplayBuffer(storage=ListStorage(4))
    rb.add(TensorDict(a=torch.ones(1)))
    assert rb[0]["a"].device.type == "cpu"  # default: items stay where they are


@pytest.mark.parametrize("given_dir,auto_cleanup,removed", [
    (False, None, True), (False, False, False), (True, None, False), (True, True, True)])
def test_memmap_auto_cleanup(tmp_path, given_dir, auto_cleanup, removed):
    s = LazyMemmapStorage(8, scratch_dir=tmp_path / "rb" if given_dir else None, auto_cleanup=auto_cleanup)
    s.set(torch.arange(2), TensorDict(x=torch.ones(2, 3), batch_size=[2]))
    folder = Path(s.scratch_dir)
    assert folder.is_dir()
    del s
    gc.collect()
    assert folder.exists() != removed
    if folder.exists() and not given_dir:
        import shutil
        shutil.rmtree(folder)


def test_sampler_and_storage_keywords():
    from steersman.data import SliceSampler, SliceSamplerWithoutReplacement, Storage
    from steersman.data.replay_buffers import PrioritizedSliceSampler

    SliceSampler(num_slices=2, compile=True, use_gpu=False)
    SliceSamplerWithoutReplacement(num_slices=2, compile={"mode": "reduce-overhead"}, use_gpu=False)
    PrioritizedSliceSampler(10, 0.6, 0.4, num_slices=2, compile=True)
    assert PrioritizedSampler(10, 0.6, 0.4, device="cpu").max_capacity == 10
    with pytest.raises(ValueError, match="device='cuda'"):
        PrioritizedSampler(10, 0.6, 0.4, device="cuda")
    with pytest.raises(TypeError, match="checkpointer"):
        Storage(4, checkpointer=object())
    assert Storage(4, compilable=True).max_size == 4
