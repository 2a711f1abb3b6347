"""``BatchedEnvBase``: what ``SerialEnv`` and ``ParallelEnv`` share.

The parent side of a batched env: specs expanded from the sub-env's, the exchange
buffer's parent views, and ``_step``/``_reset``/``step_and_maybe_reset``/``set_seed``
written against one primitive, ``_run(command, workers)``, which the subclasses
implement in-process (``SerialEnv``) or over worker processes (``ParallelEnv``).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from steersman.tensordict import TensorDict, TensorDictBase

from ..common import EnvBase, keep_preset_next
from ._buffers import SPEC_NAMES, BufferLayout, build_td, get_entry
from .env_creator import EnvCreator, EnvMetaData, check_env_fn
from .worker import F_KWARGS, F_PARTIAL, F_STATE, RESET, STEP, STEP_RESET

__all__ = ["BatchedEnvBase", "EnvWorkerError"]


class EnvWorkerError(RuntimeError):
    """A worker of a :class:`~steersman.envs.ParallelEnv` raised, died or stopped answering.

    The message names the worker index, and the exception type and message (with the
    worker's traceback), or the exit code / signal. The env is closed when this is
    raised.

    Attributes:
        worker_index: the index of the failing worker.
        exc_type: the qualified name of the worker's exception (None if it died).
        exc_message: the worker exception's message (None if it died).
        worker_traceback: the worker's formatted traceback (None if it died).
        exitcode: the worker's exit code (negative: killed by that signal), if it died.

    Example:
        >>> from steersman.envs.batched import EnvWorkerError
        >>> err = EnvWorkerError("ParallelEnv worker 1 raised ValueError: boom", worker_index=1,
        ...                      exc_type="ValueError", exc_message="boom")
        >>> isinstance(err, RuntimeError), err.worker_index, err.exc_type
        (True, 1, 'ValueError')
    """

    def __init__(self, message: str, worker_index: int, exc_type: str | None = None,
                 exc_message: str | None = None, worker_traceback: str | None = None,
                 exitcode: int | None = None) -> None:
        super().__init__(message)
        self.worker_index = worker_index
        self.exc_type = exc_type
        self.exc_message = exc_message
        self.worker_traceback = worker_traceback
        self.exitcode = exitcode


#: TorchRL's keyword arguments of batched envs that need no action here, with the reason
#: (accepted so that TorchRL scripts run; documented in ParallelEnv/SerialEnv).
TORCHRL_NOOP_KWARGS = {
    "pin_memory": "the outputs are copied out of shared memory into new tensors; pin them "
                  "with PinMemoryTransform when they go to CUDA",
    "consolidate": "data already travels as one flat byte buffer per worker",
    "memmap": "the buffers are already in shared memory",
    "share_individual_td": "there is one shared buffer for all workers",
    "non_blocking": "the buffers are on CPU; device moves of the outputs are plain .to()",
    "policy_proof": "the policy's own entries stay in the caller's TensorDict; nothing needs declaring",
    "metadata_from_workers": "the specs are read from a probe env built in this process",
    "daemon": "workers are always daemonic and exit with the parent (even after SIGKILL)",
    "allow_step_when_done": "stepping a done sub-env is left to the sub-env (no check here)",
}


def apply_num_threads(num_threads: int | None, owner: str) -> None:
    """TorchRL's ``num_threads``: ``torch.set_num_threads`` in this (the parent) process."""
    if num_threads is None:
        return
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"{owner}: num_threads must be a positive int or None, got {num_threads!r}")
    torch.set_num_threads(num_threads)


def make_creators(num_workers: Any, create_env_fn: Any, create_env_kwargs: Any, owner: str
                  ) -> list[EnvCreator]:
    """One :class:`EnvCreator` per worker from a callable (or a list of them) and kwargs
    (a dict or a list of dicts)."""
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"{owner}: num_workers must be a positive int, got {num_workers!r}")
    n = num_workers
    if isinstance(create_env_fn, (list, tuple)):
        if len(create_env_fn) != n:
            raise ValueError(
                f"{owner}: got {len(create_env_fn)} create_env_fn for num_workers={n}; pass one "
                "callable or one per worker"
            )
        fns = list(create_env_fn)
    else:
        fns = [create_env_fn] * n
    for fn in fns:
        if not isinstance(fn, EnvCreator):
            check_env_fn(fn, owner)
    if create_env_kwargs is None or isinstance(create_env_kwargs, dict):
        kwargs = [create_env_kwargs] * n
    elif isinstance(create_env_kwargs, (list, tuple)) and len(create_env_kwargs) == n:
        kwargs = list(create_env_kwargs)
    else:
        raise ValueError(
            f"{owner}: create_env_kwargs must be a dict or a list of {n} dicts, got {create_env_kwargs!r}"
        )
    cache: dict[tuple[int, int], EnvCreator] = {}
    out = []
    for fn, kw in zip(fns, kwargs):
        key = (id(fn), id(kw))
        if key not in cache:
            cache[key] = fn if isinstance(fn, EnvCreator) and not kw else EnvCreator(fn, kw)
        out.append(cache[key])
    return out


def _clone_leaf(v: Tensor) -> Tensor:
    return v.clone(memory_format=torch.contiguous_format)


class BatchedEnvBase(EnvBase):
    """Base of :class:`SerialEnv` and :class:`ParallelEnv` (not used directly).

    Batch size ``[num_workers, *sub_batch]``; specs are the sub-env's expanded along a
    new leading dim. Subclasses call :meth:`_setup`, :meth:`_bind_buffer` and implement
    ``_run``/``_seed_worker``.

    Example:
        >>> from steersman.envs import CartPoleEnv
        >>> from steersman.envs.batched import BatchedEnvBase, SerialEnv
        >>> env = SerialEnv(2, CartPoleEnv)
        >>> isinstance(env, BatchedEnvBase), env.num_workers, env.sub_batch_size
        (True, 2, torch.Size([]))
        >>> env.close()
    """

    num_workers: int

    def _setup(self, meta: EnvMetaData, num_workers: int, device: Any) -> None:
        self.num_workers = num_workers
        self._sub_meta = meta
        sub = meta.batch_size
        EnvBase.__init__(self, device=device if device is not None else meta.device,
                         batch_size=(num_workers, *sub))
        dev = self._device
        for name in SPEC_NAMES:
            setattr(self, name, meta.specs[name].expand(num_workers, *sub).to(dev))
        self._layout = BufferLayout(meta.specs, sub, type(self).__name__)
        self._all_workers: tuple[int, ...] = tuple(range(num_workers))

    def _bind_buffer(self, buf: Tensor) -> None:
        """The parent's views of the exchange buffer ``[num_workers, row_bytes]``."""
        lay = self._layout
        in_pairs = lay.views(buf, "in")
        self._mask_view = dict(in_pairs)["_reset"]
        self._in_pairs = [(k, v) for k, v in in_pairs if k != "_reset"]
        state_keys = set(self._full_state_spec.keys(include_nested=True, leaves_only=True))
        self._state_in_pairs = [(k, v) for k, v in self._in_pairs if k in state_keys]
        self._next_pairs = lay.views(buf, "next")
        self._root_pairs = lay.views(buf, "root")
        self._next_flat = all(type(k) is str for k, _ in self._next_pairs)
        self._root_flat = all(type(k) is str for k, _ in self._root_pairs)
        self._buf_device = buf.device

    # ------------------------------------------------------------------ subclass API
    def _run(self, cmd: int, workers: Sequence[int], flags: int = 0, extra: bytes = b"") -> list[int]:
        """Runs ``cmd`` on ``workers``; for ``STEP_RESET``, returns the workers that reset a
        sub-env (and so wrote their root section)."""
        raise NotImplementedError

    def _seed_worker(self, idx: int, seed: int | None, static_seed: bool) -> int | None:
        raise NotImplementedError

    # ------------------------------------------------------------------ buffers
    def _write_inputs(self, td: TensorDictBase, pairs: list, what: str) -> None:
        for key, dst in pairs:
            src = get_entry(td, key)
            if src is None:
                raise KeyError(
                    f"{type(self).__name__}.{what}: the tensordict has no entry {key!r} "
                    f"(needed: {[k for k, _ in pairs]}); e.g. env.rand_action(td) writes the action"
                )
            try:
                dst.copy_(src)
            except (RuntimeError, TypeError) as exc:
                raise ValueError(
                    f"{type(self).__name__}.{what}: entry {key!r} has shape "
                    f"{list(getattr(src, 'shape', []))}, expected {list(dst.shape)}"
                ) from exc

    def _read(self, pairs: list, flat: bool) -> TensorDict:
        dev = self._device
        if dev == self._buf_device:
            vals = [(k, _clone_leaf(v)) for k, v in pairs]
        else:
            vals = [(k, v.to(dev)) for k, v in pairs]
        return build_td(vals, self._batch_size, dev, flat)

    # ------------------------------------------------------------------ EnvBase API
    #: a ``"_step"`` mask in the step input steps only the workers it selects (the others'
    #: outputs are left as they were: TransformedEnv replaces them; see ConditionalSkip)
    _partial_step = True

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        self._write_inputs(tensordict, self._in_pairs, "step")
        workers = self._all_workers
        mask = tensordict.get("_step", None)
        if mask is not None:
            per_worker = torch.as_tensor(mask).to(torch.bool).reshape(self.num_workers, -1)
            sel = per_worker.any(-1)
            if not bool((per_worker.all(-1) == sel).all()):
                raise ValueError(f"{type(self).__name__}: a '_step' mask must select whole workers (each worker "
                                 f"steps all of its sub-batch), got {per_worker.tolist()}")
            workers = sel.nonzero().flatten().tolist()
        if workers:
            self._run(STEP, workers)
        return self._read(self._next_pairs, self._next_flat)

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        flags = 0
        workers: Sequence[int] = self._all_workers
        if tensordict is not None:
            mask = self._reset_mask(tensordict)
            if self._state_in_pairs and all(get_entry(tensordict, k) is not None
                                            for k, _ in self._state_in_pairs):
                self._write_inputs(tensordict, self._state_in_pairs, "reset")
                flags |= F_STATE
            if mask is not None:
                self._mask_view.copy_(mask)
                flags |= F_PARTIAL
                per_worker = mask.reshape(self.num_workers, -1).any(-1)
                workers = per_worker.nonzero().flatten().tolist()
        extra = b""
        if kwargs:
            flags |= F_KWARGS
            extra = pickle.dumps(kwargs)
        if workers:
            self._run(RESET, workers, flags, extra)
        return self._read(self._root_pairs, self._root_flat)

    def step_and_maybe_reset(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        """Steps every sub-env and resets the finished ones, in one command per worker.

        Same result as :meth:`EnvBase.step_and_maybe_reset`: ``(tensordict, next_input)``
        where ``tensordict["next"]`` holds the step's results and ``next_input`` the input
        of the following step (finished sub-envs reset).
        """
        if self._is_closed:
            self._assert_open()
        self._action_guard(tensordict)
        self._write_inputs(tensordict, self._in_pairs, "step_and_maybe_reset")
        reset_workers = self._run(STEP_RESET, self._all_workers)
        nxt = self._read(self._next_pairs, self._next_flat)
        preset = tensordict.get("next", None)
        if preset is not None:
            keep_preset_next(preset, nxt)
        if type(tensordict) is TensorDict:
            tensordict.entries["next"] = nxt
        else:
            tensordict.set("next", nxt)
        td_next = self._step_mdp(tensordict)
        if reset_workers:
            td_next = self._merge_root(td_next, reset_workers)
        return tensordict, td_next

    def _merge_root(self, td_next: TensorDictBase, workers: list[int]) -> TensorDictBase:
        """``td_next`` with the root entries of ``workers`` (those that reset) from the buffer."""
        n = self.num_workers
        if len(workers) == n:
            root = self._read(self._root_pairs, self._root_flat)
            if self._root_flat and type(td_next) is TensorDict:
                td_next.entries.update(root.entries)
                return td_next
            td_next = td_next.copy()
            td_next.update(root)
            return td_next
        sel = torch.zeros(n, dtype=torch.bool)
        sel[workers] = True
        dev = self._device
        flat = self._root_flat and type(td_next) is TensorDict
        if not flat:
            td_next = td_next.copy()
        for key, view in self._root_pairs:
            cur = get_entry(td_next, key)
            if cur is None:
                new = _clone_leaf(view).to(dev)
            else:
                new = torch.where(sel.view(n, *([1] * (view.ndim - 1))).to(dev), view.to(dev), cur)
            if flat:
                td_next.entries[key] = new
            else:
                td_next.set(key, new)
        return td_next

    def set_seed(self, seed: int | None = None, static_seed: bool = False) -> int | None:
        """Seeds the workers in turn: worker ``i`` gets the seed returned by worker ``i-1``'s
        ``set_seed`` (worker 0 gets ``seed``), so the seeds are distinct, reproducible and
        do not overlap when the sub-envs are batched themselves. Returns the last one.

        With ``static_seed=True`` every worker gets ``seed``.
        """
        self._assert_open()
        for i in self._all_workers:
            seed = self._seed_worker(i, seed, static_seed)
        return seed

    def _set_seed(self, seed: int | None) -> None:
        self.set_seed(seed)

    # ------------------------------------------------------------------ misc
    @property
    def sub_batch_size(self) -> torch.Size:
        """The batch size of one sub-env."""
        return self._sub_meta.batch_size

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(num_workers={self.num_workers}, env={self._sub_meta.env_type}, "
                f"batch_size={list(self._batch_size)}, device={self._device})")


CreateEnvFn = Callable[..., EnvBase] | EnvCreator
