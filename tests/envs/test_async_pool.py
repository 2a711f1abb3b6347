"""AsyncEnvPool: the sync API equals a SerialEnv of the same envs; the async API returns
what was sent, for the envs that finished; failures name the env."""

from __future__ import annotations

import functools

import pytest
import torch

from steersman import TensorDict
from steersman.envs import (
    AsyncEnvPool,
    PendulumEnv,
    ProcessorAsyncEnvPool,
    ThreadingAsyncEnvPool,
    check_env_specs,
)
from steersman.envs.batched import EnvWorkerError, SerialEnv


def _pend(seed: int = 0) -> PendulumEnv:
    return PendulumEnv(seed=seed)


class _Boom(PendulumEnv):
    """Raises on a step whose action is above 0.9."""

    def _step(self, td):
        if float(td["action"].max()) > 0.9:
            raise ValueError("action too large")
        return super()._step(td)


def _boom() -> _Boom:
    return _Boom(seed=0)


@pytest.mark.parametrize("backend", ["threading", "multiprocessing"])
def test_async_pool_sync_and_async(backend):
    makers = [functools.partial(_pend, s) for s in (1, 2, 3)]
    pool = AsyncEnvPool(makers, backend=backend)
    try:
        assert isinstance(pool, ThreadingAsyncEnvPool if backend == "threading" else ProcessorAsyncEnvPool)
        ref = SerialEnv(3, makers)
        td, rtd = pool.reset(), ref.reset()
        torch.testing.assert_close(td["observation"], rtd["observation"])
        acts = torch.linspace(-0.5, 0.5, 3).unsqueeze(-1)
        out = pool.step(td.set("action", acts))
        rout = ref.step(rtd.set("action", acts))
        torch.testing.assert_close(out["next", "observation"], rout["next", "observation"])
        # async: step env 2 then envs 0, 1; receive in any order, each exactly once
        nxt = pool._step_mdp(out)
        nxt["action"] = acts
        nxt["env_index"] = torch.arange(3)
        pool.async_step_send(nxt[2])
        pool.async_step_send(nxt[:2])
        with pytest.raises(RuntimeError, match="in flight"):
            pool.async_step_send(nxt[2])
        got = []
        while len(got) < 3:
            r = pool.async_step_recv()
            got += r["env_index"].tolist()
            for j, i in enumerate(r["env_index"].tolist()):
                torch.testing.assert_close(r["action"][j], acts[i])  # the input comes back with its output
        assert sorted(got) == [0, 1, 2]
        rnxt = ref._step_mdp(rout).set("action", acts)
        rr = ref.step(rnxt)
        pool.async_reset_send(env_index=[1])
        res = pool.async_reset_recv()
        assert res["env_index"].tolist() == [1] and res["observation"].shape == (1, 3)
        ref.close()
        del rr
        with pytest.raises(IndexError, match="out of range"):
            pool.async_step_send(TensorDict(action=torch.zeros(1, 1), env_index=torch.tensor([5]), batch_size=[1]))
        check_env_specs(pool, seed=0)
    finally:
        pool.close()


@pytest.mark.parametrize("backend", ["threading", "multiprocessing"])
def test_async_pool_error_names_the_env_and_pool_stays_usable(backend):
    pool = AsyncEnvPool([_pend, _boom], backend=backend)
    try:
        td = pool.reset()
        td["action"] = torch.tensor([[0.0], [1.0]])
        td["env_index"] = torch.arange(2)
        pool.async_step_send(td)
        with pytest.raises(EnvWorkerError, match="1") as info:
            pool.async_step_recv(min_get=2)
        assert info.value.worker_index == 1
        td["action"] = torch.zeros(2, 1)
        assert pool.step(td.exclude("env_index"))["next", "reward"].shape == (2, 1)
    finally:
        pool.close()


def test_async_pool_refuses_bad_setups():
    with pytest.raises(ValueError, match="asyncio"):
        AsyncEnvPool([_pend], backend="asyncio")
    with pytest.raises(ValueError, match="envs_per_worker"):
        AsyncEnvPool([_pend], envs_per_worker=2)
    with pytest.raises(ValueError, match="differs"):
        AsyncEnvPool([_pend, functools.partial(PendulumEnv, batch_size=[2])])
