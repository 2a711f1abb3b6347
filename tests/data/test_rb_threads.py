"""Concurrency: one writer with several sampling threads; prefetching; clean shutdown."""

from __future__ import annotations

import threading
import time

import torch

from steersman.data.replay_buffers import (
    LazyTensorStorage,
    PrioritizedSampler,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
)
from steersman.tensordict import TensorDict

CAP = 256
ROW = 8


def chunk(start: int, n: int) -> TensorDict:
    ids = torch.arange(start, start + n)
    # every leaf is a function of the id: a torn read (half old, half new) shows up
    return TensorDict({"id": ids, "row": ids.double().unsqueeze(-1).expand(n, ROW).clone(),
                       "next": {"id": ids + 1}}, [n])


def test_one_writer_many_samplers_see_consistent_items():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(CAP), sampler=PrioritizedSampler(CAP, 0.7, 0.5),
                                batch_size=32)
    rb.extend(chunk(0, 64))
    stop = threading.Event()
    errors: list = []
    sampled = [0]

    def writer():
        start = 64
        try:
            while not stop.is_set():
                n = int(torch.randint(1, 50, ()).item())
                rb.extend(chunk(start, n))
                start += n
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    def sampler():
        try:
            while not stop.is_set():
                s = rb.sample()
                ids = s["id"]
                assert torch.equal(s["row"], ids.double().unsqueeze(-1).expand(-1, ROW)), "torn row"
                assert torch.equal(s["next", "id"], ids + 1), "torn item"
                assert bool((s["index"] < CAP).all())
                rb.update_priority(s["index"], torch.rand(len(ids)))
                sampled[0] += 1
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=sampler) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    stop.set()
    for t in threads:
        t.join(10)
    assert not errors, errors[0]
    assert sampled[0] > 10 and rb.write_count > 64
    # the trees still describe the stored items exactly
    tree = rb.sampler._tree
    before = {k: t.clone() for k, t in tree._tensors.items()}
    tree.rebuild()
    for k, t in tree._tensors.items():
        torch.testing.assert_close(t, before[k], rtol=1e-12, atol=1e-9)


def test_prefetch_returns_valid_batches_and_shuts_down():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(CAP), batch_size=16, prefetch=3)
    rb.extend(chunk(0, 100))
    before = {t.name for t in threading.enumerate()}
    for _ in range(20):
        s = rb.sample()
        assert len(s) == 16 and bool((s["id"] < 100).all())
        assert torch.equal(s["row"][:, 0], s["id"].double())
    assert any(t.name.startswith("steersman-rb-prefetch") for t in threading.enumerate())
    assert len(rb._prefetch_queue) == 3  # k batches in flight
    rb.close()
    time.sleep(0.1)
    assert not any(t.name.startswith("steersman-rb-prefetch") for t in threading.enumerate() if t.name not in before)
    assert rb.sample()["id"].shape == (16,)  # usable again (restarts the thread)
    rb.close()


def test_prefetch_errors_propagate():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(CAP), batch_size=4, prefetch=2)
    try:
        rb.sample()
    except RuntimeError as err:
        assert "empty" in str(err)
    else:
        raise AssertionError("sampling an empty buffer must raise, also with prefetch")
    rb.extend(chunk(0, 10))
    assert len(rb.sample()) == 4
    rb.close()


def test_prefetch_thread_stops_when_buffer_is_collected():
    import gc

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(CAP), batch_size=4, prefetch=2)
    rb.extend(chunk(0, 10))
    rb.sample()
    ex = rb._executor
    del rb
    gc.collect()
    ex._work_queue.put(None)  # wake an idle worker so it can notice the shutdown
    for t in list(ex._threads):
        t.join(5)
        assert not t.is_alive()


def test_iteration_epoch_without_replacement_with_prefetch_configured():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(CAP), sampler=SamplerWithoutReplacement(), batch_size=7,
                                prefetch=2)
    rb.extend(chunk(0, 30))
    seen = torch.cat([b["id"] for b in rb])
    assert sorted(seen.tolist()) == list(range(30))
    seen2 = torch.cat([b["id"] for b in rb])  # a second epoch
    assert sorted(seen2.tolist()) == list(range(30))
    rb.close()
