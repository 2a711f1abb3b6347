"""``SerialEnv``: ``num_workers`` copies of an env stepped one after the other in-process."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import torch

from ._base import BatchedEnvBase, CreateEnvFn, apply_num_threads, make_creators
from .env_creator import EnvMetaData
from .worker import F_KWARGS, RESET, STEP, STEP_RESET, EnvRunner

__all__ = ["SerialEnv"]


class SerialEnv(BatchedEnvBase):
    """Batches ``num_workers`` envs built by ``create_env_fn``, run in turn in this process.

    The result behaves like one env of batch size ``[num_workers, *sub_batch]`` (the
    sub-envs may be batched themselves): specs are the sub-env's expanded along a new
    leading dim, partial resets (``"_reset"`` mask ``[num_workers, *sub_batch(, 1)]``)
    reach only the flagged sub-envs, ``set_seed(seed)`` gives sub-env ``i`` the seed
    returned by sub-env ``i-1`` (distinct and reproducible; returns the next seed) and
    ``step_and_maybe_reset`` resets only what is done. Same data, step for step, as a
    :class:`ParallelEnv` with the same arguments and seed; handy to debug one.

    Args:
        num_workers: the number of sub-envs.
        create_env_fn: a callable returning an :class:`~steersman.envs.EnvBase` (a class,
            a function, a ``functools.partial``, an :class:`EnvCreator`), or a list of
            ``num_workers`` of them.
        create_env_kwargs: keyword arguments for ``create_env_fn`` (a dict, or a list of
            ``num_workers`` dicts).
        device: the device of the batched env's outputs (default: the sub-env's).
        num_threads: ``torch.set_num_threads`` in this process (TorchRL's keyword).

    TorchRL's process-related keywords (``serial_for_single``, ``mp_start_method``,
    ``shared_memory``, ``num_sub_threads``, ``use_buffers``, ``shutdown_timeout``) have no
    effect on a SerialEnv (no process), nor do those listed in ``TORCHRL_NOOP_KWARGS``
    (``pin_memory``, ``consolidate``, ...): all are accepted.

    Raises:
        TypeError: ``create_env_fn`` is not callable or does not return an EnvBase.
        ValueError: the sub-envs do not all have the same specs and batch size (the
            message names the worker and the first differing entry).

    Attributes:
        num_workers: the number of sub-envs.

    Example:
        >>> import functools, torch
        >>> from steersman.envs import CartPoleEnv
        >>> from steersman.envs.batched import SerialEnv
        >>> env = SerialEnv(3, functools.partial(CartPoleEnv, batch_size=[2]))
        >>> env.batch_size
        torch.Size([3, 2])
        >>> env.set_seed(0) != 0
        True
        >>> td = env.reset()
        >>> td["observation"].shape
        torch.Size([3, 2, 4])
        >>> env.rollout(5, break_when_any_done=False).batch_size
        torch.Size([3, 2, 5])
        >>> env.close()
    """

    def __init__(self, num_workers: int, create_env_fn: CreateEnvFn | Sequence[CreateEnvFn],
                 create_env_kwargs: dict | Sequence[dict] | None = None, *, device: Any = None,
                 num_threads: int | None = None, serial_for_single: bool = False,
                 mp_start_method: str | None = None, shared_memory: bool = True,
                 num_sub_threads: int | None = None, use_buffers: bool | None = None,
                 shutdown_timeout: float | None = None, pin_memory: bool = False,
                 consolidate: bool = True, memmap: bool = False, share_individual_td: bool | None = None,
                 non_blocking: bool = False, policy_proof: Any = None,
                 metadata_from_workers: bool | None = None, daemon: bool = False,
                 allow_step_when_done: bool = False) -> None:
        owner = type(self).__name__
        apply_num_threads(num_threads, owner)
        creators = make_creators(num_workers, create_env_fn, create_env_kwargs, owner)
        envs = []
        try:
            for creator in creators:
                envs.append(creator())
            metas = [EnvMetaData.from_env(e) for e in envs]
            for i, meta in enumerate(metas[1:], 1):
                diff = metas[0].mismatch(meta)
                if diff is not None:
                    raise ValueError(
                        f"{owner}: the env built for worker {i} differs from worker 0's: its {diff}; "
                        "every sub-env must have the same specs"
                    )
            self._setup(metas[0], num_workers, device)
        except BaseException:
            for e in envs:
                e.close()
            raise
        self._envs = envs
        buf = torch.zeros((num_workers, self._layout.row_bytes), dtype=torch.uint8, device=metas[0].device)
        self._bind_buffer(buf)
        self._runners = [EnvRunner(env, self._layout, buf[i]) for i, env in enumerate(envs)]

    def _run(self, cmd: int, workers: Sequence[int], flags: int = 0, extra: bytes = b"") -> list[int]:
        runners = self._runners
        reset_workers: list[int] = []
        i = -1
        try:
            if cmd == STEP_RESET:
                for i in workers:
                    if runners[i].step_and_maybe_reset():
                        reset_workers.append(i)
            elif cmd == STEP:
                for i in workers:
                    runners[i].step()
            elif cmd == RESET:
                kwargs = pickle.loads(extra) if flags & F_KWARGS else None
                for i in workers:
                    runners[i].reset(flags, kwargs)
            else:  # pragma: no cover - internal
                raise RuntimeError(f"unknown command {cmd}")
        except Exception as exc:
            if i >= 0:
                exc.add_note(f"(in {type(self).__name__} worker {i}, {type(runners[i].env).__name__})")
            raise
        return reset_workers

    def _seed_worker(self, idx: int, seed: int | None, static_seed: bool) -> int | None:
        return self._runners[idx].set_seed(seed, static_seed)

    def _close(self) -> None:
        for env in self._envs:
            env.close()

    def to(self, device: Any) -> SerialEnv:
        """Moves the batched env's outputs (and specs) to ``device``; the sub-envs stay."""
        super().to(device)
        return self
