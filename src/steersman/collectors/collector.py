"""``Collector`` (alias ``SyncDataCollector``): runs a policy in an env, yields batches.

Each batch holds ``frames_per_batch`` transitions shaped ``[*env_batch, T]`` with
``T = frames_per_batch // env.batch_size.numel()``. The loop per step is: the policy
writes the action into the carried TensorDict, ``env.step_and_maybe_reset`` steps and
resets the finished sub-envs, and the transition is copied into a buffer preallocated
once (time-major, see ``_buffer``): nothing is stacked per step. Trajectory ids
(``("collector", "traj_ids")``) are computed once per batch from the done flags.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from steersman.envs import EnvBase
from steersman.modules.random_policy import RandomPolicy
from steersman.tensordict import TensorDict, TensorDictBase, is_non_tensor
from steersman.tensordict.nn import ExplorationType, set_exploration_type

from ._buffer import RolloutBuffer
from ._env_state import env_state, load_env_state
from ._policy import _EnvRandomPolicy, policy_output_check, weights_of
from .base import BaseCollector, check_unsupported, run_hook
from .utils import dense_copy, split_trajectories
from .weight_update import VanillaWeightUpdater, WeightUpdaterBase

__all__ = ["Collector", "SyncDataCollector", "assign_traj_ids", "finish_batch"]

TRAJ_KEY = ("collector", "traj_ids")


def assign_traj_ids(done: Tensor, first: Tensor, counter: int, stride: int = 1, offset: int = 0
                    ) -> tuple[Tensor, Tensor, int]:
    """Trajectory ids of ``T`` steps of ``N`` sub-envs from their done flags.

    Sub-env ``n`` starts the batch in trajectory ``first[n]``; a done at step ``t`` starts
    a new trajectory at step ``t + 1``. New ids are handed out in time-major order (step
    by step, sub-envs in order) from ``counter``, as ``counter * stride + offset`` (so that
    workers with distinct offsets never share an id).

    Args:
        done: ``[T, N]`` bool.
        first: ``[N]`` int64, smaller than every new id.
        counter, stride, offset: see above.

    Returns: ``(ids [T, N], first ids of the next batch [N], the next counter)``.

    Example:
        >>> import torch
        >>> from steersman.collectors.collector import assign_traj_ids
        >>> done = torch.tensor([[False, True], [True, False], [False, False]])
        >>> ids, nxt, counter = assign_traj_ids(done, torch.tensor([0, 1]), counter=2)
        >>> ids.T.tolist(), nxt.tolist(), counter
        ([[0, 0, 3], [1, 2, 2]], [3, 2], 4)
    """
    T, N = done.shape
    ev = done.nonzero()  # row-major: sorted by step, then sub-env
    k = ev.shape[0]
    marks = torch.full((T + 1, N), -1, dtype=torch.int64, device=done.device)
    marks[0] = first
    if k:
        new = (torch.arange(counter, counter + k, device=done.device) * stride) + offset
        marks[ev[:, 0] + 1, ev[:, 1]] = new
    ids = marks.cummax(0).values  # ids only grow: the latest start so far is the max
    return ids[:T], ids[T], counter + k


def finish_batch(batch: TensorDictBase, *, copy: bool, split_trajs: bool, postproc: Callable | None,
                 replay_buffer: Any) -> TensorDictBase | None:
    """What a collector yields for ``batch``: a dense copy (if ``copy``), split into
    trajectories, post-processed; or ``None`` after extending ``replay_buffer`` with it."""
    if replay_buffer is not None and not split_trajs and postproc is None:
        replay_buffer.extend(batch)  # the storage copies: no intermediate copy
        return None
    out = dense_copy(batch) if copy else batch
    if split_trajs:
        out = split_trajectories(out)
    if postproc is not None:
        out = postproc(out)
    if replay_buffer is not None:
        replay_buffer.extend(out)
        return None
    return out


def _device(d: Any) -> torch.device | None:
    if d is None:
        return None
    if isinstance(d, int):
        return torch.device("cuda", d)
    return torch.device(d)


def _count(value: Any, name: str, low: int, allow_inf: bool = False) -> int | float:
    """``value`` as a frame count ``>= low`` (``-1``/None: infinity, if allowed)."""
    if allow_inf and (value is None or value == -1):
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        kind = "positive" if low > 0 else "non-negative"
        raise ValueError(f"Collector: {name} must be a {kind} int{' or -1 (no end)' if allow_inf else ''}, "
                         f"got {value!r}")
    return value


_SUB_TD = "__td__"  # tags a nested TensorDict (with its own batch size) in td_state's plain data


def td_state(td: TensorDictBase | None) -> dict | None:
    """A TensorDict as plain data (``torch.load(weights_only=True)`` loads it). Nested
    TensorDicts keep their own batch sizes (a multi-agent group ``[B, n_agents]``), so a
    resumed collector's carried data has the shapes the policy saw before the crash."""
    if td is None:
        return None
    data = td.to_dict()
    for key, value in td.items():
        if isinstance(value, TensorDictBase) and not is_non_tensor(value):
            data[key] = {_SUB_TD: td_state(value)}
    return {"batch_size": list(td.batch_size), "data": data}


def _td_build(state: dict, device: Any) -> TensorDict:
    data = {key: _td_build(value[_SUB_TD], device) if isinstance(value, dict) and _SUB_TD in value else value
            for key, value in state["data"].items()}
    return TensorDict(data, batch_size=state["batch_size"], device=device)


def td_from_state(state: dict | None, device: Any) -> TensorDict | None:
    """The inverse of :func:`td_state` (states written before nested batch sizes were kept
    load as before: plain nested dicts take the parent's batch size)."""
    return None if state is None else _td_build(state, device)


class Collector(BaseCollector):
    """Runs ``policy`` in an env and yields batches of ``frames_per_batch`` transitions.

    Iterating gives TensorDicts shaped ``[*env.batch_size, T]`` with
    ``T = frames_per_batch // env.batch_size.numel()``: root entries hold the state where
    the action was taken (observations, done flags, the action and the policy's other
    outputs), ``"next"`` the step's results (next observations, reward, done flags), and
    ``("collector", "traj_ids")`` ``[*env.batch_size, T]`` int64 the trajectory each step
    belongs to (unique and increasing: a new id starts after every done). Finished sub-envs
    are reset inside ``env.step_and_maybe_reset``; trajectories continue across batches.

    The policy runs under ``torch.no_grad()`` and ``set_exploration_type(exploration_type)``.
    Batches are written into a buffer preallocated at the first step (one copy per step,
    no stacking) and yielded as fresh TensorDicts (``return_same_td=True`` yields the
    buffer itself, overwritten by the next batch).

    Args:
        create_env_fn: an env (:class:`~steersman.envs.EnvBase`), or a callable returning
            one (called with ``create_env_kwargs``).
        policy: a ``TensorDict -> TensorDict`` callable (a ``TensorDictModule``, any
            module or function writing the action entries); ``None``: random actions
            from the env's action spec.

    Keyword Args:
        frames_per_batch: transitions per batch; must be a multiple of the number of
            sub-envs (``env.batch_size.numel()``).
        total_frames: transitions to collect in all (``-1``: no end). Rounded up to a
            multiple of ``frames_per_batch`` (with a warning), as in TorchRL.
        device: default for the three devices below.
        storing_device: where batches are stored (default: the env's device).
        policy_device: where the policy runs (default: ``device``, else where the policy's
            weights are, else the env's device); a module elsewhere is copied there
            (``update_policy_weights_()`` then copies the original's weights into the copy).
        env_device: where the env runs (the env is moved there).
        create_env_kwargs: keyword arguments of ``create_env_fn``.
        max_frames_per_traj: truncate trajectories after that many steps (the step is
            marked ``truncated`` and ``done`` and the sub-env is reset). ``None``: no limit.
        init_random_frames: the first batches, until that many frames are collected, use
            random actions instead of the policy.
        reset_at_each_iter: reset every sub-env at the start of each batch.
        postproc: a callable applied to each batch before it is yielded.
        split_trajs: yield :func:`split_trajectories` of each batch (``[n_traj, max_len]``
            with a ``("collector", "mask")``).
        exploration_type: set with ``set_exploration_type`` around the policy calls
            (default ``RANDOM``).
        return_same_td: yield the internal buffer itself (no copy; overwritten next batch).
        reset_when_done: reset finished sub-envs (default). ``False``: step with
            ``env.step`` only (for envs that reset themselves).
        replay_buffer: extend this buffer with each batch (as is: ``[*env_batch, T]``;
            give its storage ``ndim`` accordingly) and yield ``None`` instead.
        trust_policy: skip the check (once, at the first policy call) that the policy
            wrote every action entry with the spec's shape.
        compile_policy: ``torch.compile`` the policy (``True`` or a dict of options).
        no_cuda_sync: accepted for TorchRL compatibility (no synchronization is done on
            CPU).
        set_truncated: mark the last step of every batch ``truncated`` and ``done`` (as
            TorchRL does: the env goes on, and the next batch continues the trajectory ids;
            for value targets that must stop at the batch end).
        policy_factory: a callable returning the policy (instead of ``policy``).
        weight_updater: how :meth:`update_policy_weights_` sends weights: a
            :class:`~steersman.collectors.WeightUpdaterBase` (or a callable returning one);
            default :class:`~steersman.collectors.VanillaWeightUpdater`.
        track_policy_version: write ``"policy_version"`` (int64, ``[*env_batch, T]``) in
            every batch: the number of weight updates the policy had received at each step.
        pre_collect_hook: called with no argument before each batch is collected.
        post_collect_hook: called with each batch before it is yielded.
        num_collectors, backend, sync: TorchRL's generic constructor: with
            ``num_collectors`` (or ``backend="process"``), ``Collector(...)`` builds a
            :class:`~steersman.collectors.MultiCollector` of that many workers (``sync``:
            default ``False``, asynchronous); ``backend="direct"`` (default) this class.
        worker_idx: the index of this collector among workers (stored as ``worker_idx``).
        track_traj_ids, use_buffers, cudagraph_policy: accepted, no effect (trajectory ids
            are always written, once per batch; batches always go through a preallocated
            buffer; the policy is not CUDA-graphed).
        trajs_per_batch, trajs_per_write, traj_format, compact_obs, extend_buffer=False,
        auto_register_policy_transforms, interruptor, weight_sync_schemes,
        weight_recv_schemes, backend_options: not supported (``NotImplementedError``
            naming the reason) unless left at their defaults.

    Raises:
        ValueError: ``frames_per_batch`` is not a positive multiple of the number of
            sub-envs, or another argument is out of range.
        TypeError: ``create_env_fn`` does not give an env, ``policy`` is not callable.

    Resumption: :meth:`state_dict` saves the frame and batch counters, the carried
    TensorDict, the trajectory ids, the env's dynamic state (native, Gymnasium, serial
    and transformed envs; see ``_env_state``) and the policy's ``state_dict``. A collector
    built the same way and given it with :meth:`load_state_dict` continues the same data
    stream (for a deterministic policy, or with torch's RNG restored by the caller).

    Example:
        >>> import torch
        >>> from steersman.collectors import Collector
        >>> from steersman.envs import CartPoleEnv
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> env = CartPoleEnv(batch_size=[4], seed=0)
        >>> policy = TensorDictModule(lambda obs: (obs[..., 2] > 0).long(), ["observation"], ["action"])
        >>> collector = Collector(env, policy, frames_per_batch=64, total_frames=128)
        >>> for batch in collector:
        ...     print(batch.batch_size, batch["next", "reward"].shape, batch["collector", "traj_ids"].dtype)
        torch.Size([4, 16]) torch.Size([4, 16, 1]) torch.int64
        torch.Size([4, 16]) torch.Size([4, 16, 1]) torch.int64
        >>> collector.shutdown()
    """

    def __init__(
        self,
        create_env_fn: EnvBase | Callable[..., EnvBase],
        policy: Callable[[TensorDictBase], TensorDictBase] | None = None,
        *,
        frames_per_batch: int,
        total_frames: int = -1,
        device: Any = None,
        storing_device: Any = None,
        policy_device: Any = None,
        env_device: Any = None,
        create_env_kwargs: dict | None = None,
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = 0,
        reset_at_each_iter: bool = False,
        postproc: Callable[[TensorDictBase], TensorDictBase] | None = None,
        split_trajs: bool | None = False,
        exploration_type: ExplorationType = ExplorationType.RANDOM,
        return_same_td: bool = False,
        reset_when_done: bool = True,
        replay_buffer: Any = None,
        trust_policy: bool | None = False,
        compile_policy: bool | dict | None = False,
        no_cuda_sync: bool = False,
        set_truncated: bool = False,
        policy_factory: Callable[[], Callable] | None = None,
        weight_updater: WeightUpdaterBase | Callable[[], WeightUpdaterBase] | None = None,
        track_policy_version: bool = False,
        pre_collect_hook: Callable[[], None] | None = None,
        post_collect_hook: Callable[[TensorDictBase], None] | None = None,
        num_collectors: int | None = None,
        backend: str | None = None,
        sync: bool | None = None,
        worker_idx: int | None = None,
        track_traj_ids: bool = True,
        use_buffers: bool | None = None,
        cudagraph_policy: bool | dict | None = False,
        trajs_per_batch: int | None = None,
        trajs_per_write: int | None = None,
        traj_format: str | None = None,
        compact_obs: bool = False,
        extend_buffer: bool = True,
        auto_register_policy_transforms: bool | None = None,
        interruptor: Any = None,
        weight_sync_schemes: Any = None,
        weight_recv_schemes: Any = None,
        backend_options: dict | None = None,
    ) -> None:
        check_unsupported(type(self).__name__, trajs_per_batch=trajs_per_batch, trajs_per_write=trajs_per_write,
                          compact_obs=compact_obs, extend_buffer=extend_buffer,
                          auto_register_policy_transforms=auto_register_policy_transforms,
                          interruptor=interruptor, weight_sync_schemes=weight_sync_schemes,
                          weight_recv_schemes=weight_recv_schemes, backend_options=backend_options)
        if backend not in (None, "direct") or sync is not None:
            raise ValueError(f"Collector: backend={backend!r}, sync={sync!r}: only backend='direct' (this class) "
                             "or 'process' (with num_collectors) exist; sync is for the process backend")
        if policy_factory is not None:
            if policy is not None:
                raise ValueError("Collector: pass policy or policy_factory, not both")
            policy = policy_factory()
        env = self._make_env(create_env_fn, create_env_kwargs)
        try:
            self._setup(env, policy, frames_per_batch, total_frames, device, storing_device,
                        policy_device, env_device, max_frames_per_traj, init_random_frames)
        except BaseException:
            if env is not create_env_fn:
                env.close()
            raise
        self.reset_at_each_iter = bool(reset_at_each_iter)
        self.postproc = postproc
        self.split_trajs = bool(split_trajs)
        self.exploration_type = exploration_type
        self.return_same_td = bool(return_same_td)
        self.reset_when_done = bool(reset_when_done)
        self.replay_buffer = replay_buffer
        self.trust_policy = bool(trust_policy)
        self.no_cuda_sync = bool(no_cuda_sync)
        self.set_truncated = bool(set_truncated)
        if compile_policy:
            opts = compile_policy if isinstance(compile_policy, dict) else {}
            self._policy_call = torch.compile(self._policy_call, **opts)
        self._policy_checked = self.trust_policy or policy is None
        # the running state (see state_dict)
        self._frames = 0
        self._iter = -1
        self._carried: TensorDictBase | None = None
        self._traj_ids: Tensor | None = None
        self._traj_steps: Tensor | None = None
        self._traj_counter = 0
        self._traj_stride = 1
        self._traj_offset = 0
        self._buffer: RolloutBuffer | None = None
        self._allocate: Callable[[int], Tensor] | None = None  # set by worker processes
        self._closed = False
        self.worker_idx = worker_idx
        self.pre_collect_hook = pre_collect_hook
        self.post_collect_hook = post_collect_hook
        self.track_policy_version = bool(track_policy_version)
        self._init_weight_updater(weight_updater)

    def __new__(cls, *args: Any, num_collectors: int | None = None, backend: str | None = None,
                sync: bool | None = None, **kwargs: Any) -> Any:
        if cls is Collector and (num_collectors is not None or backend == "process"):
            from .multi import MultiCollector  # multi imports this module

            return MultiCollector(*args, num_workers=num_collectors, sync=bool(sync), **kwargs)
        return super().__new__(cls)

    def _default_weight_updater(self) -> WeightUpdaterBase:
        return self._transport_weight_updater()

    def _transport_weight_updater(self) -> WeightUpdaterBase:
        """The updater that copies weights into the policy this collector runs."""
        orig = self._orig_policy
        return VanillaWeightUpdater(weight_getter=None if orig is None else lambda: weights_of(orig),
                                    policy_weights=weights_of(self.policy))

    # ------------------------------------------------------------------ construction
    @staticmethod
    def _make_env(create_env_fn: Any, kwargs: dict | None) -> EnvBase:
        if isinstance(create_env_fn, EnvBase):
            if kwargs:
                raise TypeError("Collector: create_env_kwargs needs create_env_fn to be a callable, not an env")
            return create_env_fn
        if not callable(create_env_fn):
            raise TypeError(
                f"Collector: create_env_fn must be an env or a callable returning one, got "
                f"{type(create_env_fn).__name__}"
            )
        env = create_env_fn(**(kwargs or {}))
        if not isinstance(env, EnvBase):
            raise TypeError(
                f"Collector: create_env_fn returned a {type(env).__name__}, not a steersman EnvBase "
                "(wrap Gymnasium envs with GymWrapper)"
            )
        return env

    def _setup(self, env: EnvBase, policy: Any, frames_per_batch: Any, total_frames: Any, device: Any,
               storing_device: Any, policy_device: Any, env_device: Any, max_frames_per_traj: Any,
               init_random_frames: Any) -> None:
        device = _device(device)
        env_device = _device(env_device) or device
        if env_device is not None and env_device != env.device:
            env = env.to(env_device)
        self.env = env
        self.env_device = env.device
        self.storing_device = _device(storing_device) or device or env.device
        w = weights_of(policy)
        own = next(iter(w.values(True, True))).device if w is not None else None
        self.policy_device = _device(policy_device) or device or own or env.device
        n_env = env.batch_size.numel()
        fpb = int(_count(frames_per_batch, "frames_per_batch", 1))
        if fpb % n_env:
            lo = max(n_env, fpb // n_env * n_env)
            raise ValueError(
                f"Collector: frames_per_batch={fpb} is not a multiple of the number of sub-envs {n_env} "
                f"(env batch size {list(env.batch_size)}); each batch holds the same number of steps of "
                f"every sub-env. Use e.g. frames_per_batch={lo} or {lo + n_env}"
            )
        self.frames_per_batch = fpb
        self.requested_frames_per_batch = fpb
        self._steps_per_batch = fpb // n_env
        total = _count(total_frames, "total_frames", 0, allow_inf=True)
        if total != math.inf and total % fpb:
            rounded = -(-total // fpb) * fpb
            warnings.warn(f"Collector: total_frames={total} is not a multiple of frames_per_batch={fpb}; "
                          f"{rounded} frames will be collected")
            total = rounded
        self.total_frames = total
        self.init_random_frames = int(_count(init_random_frames or 0, "init_random_frames", 0))
        if max_frames_per_traj in (None, 0, -1):
            self.max_frames_per_traj = None
        else:
            self.max_frames_per_traj = int(_count(max_frames_per_traj, "max_frames_per_traj", 1))
        self._random_policy = _EnvRandomPolicy(env.full_action_spec)
        if isinstance(policy, RandomPolicy) and policy.action_spec is None:
            policy.action_spec = env.full_action_spec  # TorchRL's lazy RandomPolicy()
        self._orig_policy = None
        if policy is None:
            self.policy = self._random_policy
        elif not callable(policy):
            raise TypeError(f"Collector: policy must be callable (TensorDict -> TensorDict), got {type(policy).__name__}")
        else:
            self.policy = policy
            if w is not None and any(v.device != self.policy_device for v in w.values(True, True)):
                self._orig_policy = policy
                self.policy = copy.deepcopy(policy).to(self.policy_device)
        self._policy_call = self._make_policy_call(self.policy)
        plan = env._hot_plan()
        self._reset_from = [("next", *((k,) if type(k) is str else k)) for k in plan["reset_from"]]
        self._trunc_keys = [("next", *((k,) if type(k) is str else k)) for k in plan["done_keys"]
                            if (k if type(k) is str else k[-1]) in ("done", "truncated")]

    def _make_policy_call(self, policy: Callable) -> Callable:
        if self.policy_device == self.env_device:
            return policy
        pdev, edev = self.policy_device, self.env_device

        def call(td: TensorDictBase) -> TensorDictBase:
            out = policy(td.to(pdev))
            return (td if out is None else out).to(edev)

        return call

    # ------------------------------------------------------------------ worker hooks
    def _set_traj_id_scheme(self, stride: int, offset: int) -> None:
        """Ids ``counter * stride + offset`` (the multi-process collectors give each worker its
        own offset, so ids are unique across workers). Call before collecting."""
        self._traj_stride = int(stride)
        self._traj_offset = int(offset)

    # ------------------------------------------------------------------ collection
    @property
    def _n_env(self) -> int:
        return self.env.batch_size.numel()

    def _new_ids(self, n: int) -> Tensor:
        c = self._traj_counter
        self._traj_counter = c + n
        return torch.arange(c, c + n) * self._traj_stride + self._traj_offset

    def _reset_all(self) -> None:
        self._carried = self.env.reset()
        self._traj_ids = self._new_ids(self._n_env).view(self.env.batch_size)
        self._traj_steps = torch.zeros(self.env.batch_size, dtype=torch.int64)

    def _buffer_for(self, step: TensorDictBase) -> RolloutBuffer:
        """The buffer for transitions like ``step``: the current one, or a new one the first
        time and whenever the entries change (e.g. the policy's outputs after the random
        batches of ``init_random_frames``). Checked once per batch."""
        keys = {(k,) if type(k) is str else tuple(k) for k in step.keys(True, True)} - {TRAJ_KEY}
        buf = self._buffer
        if buf is None or keys != buf.keys:
            buf = self._buffer = self._make_buffer(step)
        return buf

    def _make_buffer(self, step: TensorDictBase) -> RolloutBuffer:
        extra = [(TRAJ_KEY, torch.int64, tuple(self.env.batch_size))]
        buf = RolloutBuffer(step.exclude(TRAJ_KEY) if TRAJ_KEY in step.keys(True, True) else step,
                            self._steps_per_batch, self.storing_device, extra, self._allocate)
        views = dict(zip(buf.layout.keys, buf.views))
        n = self._n_env
        T = self._steps_per_batch
        self._done_views = [views[k].reshape(T, n, -1) for k in self._reset_from if k in views]
        self._trunc_views = [views[k].reshape(T, n, -1) for k in self._trunc_keys if k in views]
        self._traj_view = views[TRAJ_KEY].reshape(T, n)
        return buf

    def _done_flags(self, t: int | slice) -> Tensor:
        """OR of the reset-triggering done flags at step(s) ``t``: ``[N]`` (or ``[T, N]``)."""
        out = None
        for v in self._done_views:
            d = v[t].any(-1)
            out = d if out is None else out | d
        if out is None:
            shape = (self._n_env,) if isinstance(t, int) else (self._steps_per_batch, self._n_env)
            out = torch.zeros(shape, dtype=torch.bool)
        return out

    def _truncate(self, td_next: TensorDictBase, t: int) -> TensorDictBase:
        """``max_frames_per_traj``: marks and resets the sub-envs at the step limit."""
        done = self._done_flags(t).to(self._traj_steps.device)
        steps = self._traj_steps.reshape(-1) + 1
        trunc = (steps >= self.max_frames_per_traj) & ~done
        if bool(trunc.any()):
            for v in self._trunc_views:
                v[t] |= trunc.unsqueeze(-1).to(v.device)
            bs = self.env.batch_size
            td_next = td_next.copy()
            td_next.set("_reset", trunc.view(*bs, 1).to(self.env_device))
            td_next = self.env.reset(td_next)
            done = done | trunc
        self._traj_steps = torch.where(done, 0, steps).view(self.env.batch_size)
        return td_next

    _profiling = None  # set by enable_profile: the rollouts run under torch.profiler

    def _enable_profile(self, config: Any) -> None:
        from .profile import Profiling
        self._profiling = Profiling(config, 0)

    def _rollout(self, random: bool) -> TensorDictBase:
        """Collects one batch into the buffer; returns its ``[*env_batch, T]`` view."""
        if self._profiling is not None:
            prof = self._profiling
            if prof.done:
                self._profiling = None
            else:
                return prof.run(lambda: self._rollout_once(random))
        return self._rollout_once(random)

    def _rollout_once(self, random: bool) -> TensorDictBase:
        if self._closed:
            raise RuntimeError("Collector: the collector was shut down")
        if self._carried is None or self.reset_at_each_iter:
            self._reset_all()
        policy = self._random_policy if random else self._policy_call
        check = not random and not self._policy_checked
        env = self.env
        step = env.step_and_maybe_reset if self.reset_when_done else self._step_no_reset
        td = self._carried
        buf: RolloutBuffer
        truncate = self.max_frames_per_traj is not None
        with torch.no_grad(), set_exploration_type(self.exploration_type, thread_local=True):
            version = (torch.full(tuple(env.batch_size), self._policy_version, dtype=torch.int64,
                                  device=env.device) if self.track_policy_version else None)
            for t in range(self._steps_per_batch):
                if version is not None:
                    td.set("policy_version", version)
                out = policy(td)
                if out is not None:
                    td = out
                if check:
                    policy_output_check(td, env.full_action_spec)
                    self._policy_checked = True
                    check = False
                cur, td = step(td)
                if t == 0:
                    buf = self._buffer_for(cur)
                buf.write(cur, t)
                if truncate:
                    td = self._truncate(td, t)
        self._carried = td
        return self._finish_rollout(buf)

    def _finish_rollout(self, buf: Any) -> TensorDictBase:
        """Trajectory ids of the batch just written and ``set_truncated``'s last-step flags."""
        done = self._done_flags(slice(None)).to(self._traj_ids.device)
        ids, first, self._traj_counter = assign_traj_ids(
            done, self._traj_ids.reshape(-1), self._traj_counter, self._traj_stride, self._traj_offset)
        self._traj_view.copy_(ids)
        self._traj_ids = first.view(self.env.batch_size)
        if self.set_truncated:
            for v in self._trunc_views:
                v[-1] = True
        return buf.td

    def _step_no_reset(self, td: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        td = self.env.step(td)
        return td, self.env._step_mdp(td)

    def rollout(self) -> TensorDictBase:
        """Collects one batch and returns it (the internal buffer, overwritten by the next
        batch); counts no frames. Iterating the collector is the usual way."""
        return self._rollout(self._frames < self.init_random_frames)

    def iterator(self) -> Iterator[TensorDictBase | None]:
        """Yields batches until ``total_frames`` are collected (``None`` with a replay buffer)."""
        while self._frames < self.total_frames:
            self._iter += 1
            run_hook(self.pre_collect_hook)
            batch = self._rollout(self._frames < self.init_random_frames)
            self._frames += self.frames_per_batch
            if self.post_collect_hook is not None:
                self.post_collect_hook(batch)
            yield finish_batch(batch, copy=not self.return_same_td, split_trajs=self.split_trajs,
                               postproc=self.postproc, replay_buffer=self.replay_buffer)

    def __len__(self) -> int:
        if self.total_frames != math.inf:
            return int(self.total_frames // self.frames_per_batch)
        raise RuntimeError("Collector: a collector without total_frames has no length")

    # ------------------------------------------------------------------ control
    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seeds the env (``env.set_seed``); returns the seed for the next env."""
        return self.env.set_seed(seed, static_seed=static_seed)

    def reset(self) -> None:
        """Resets every sub-env; the next batch starts new trajectories."""
        self._reset_all()

    def shutdown(self, close_env: bool = True) -> None:
        """Closes the env (idempotent). The collector cannot collect afterwards."""
        if self._closed:
            return
        self._closed = True
        self._buffer = None
        if close_env and not self.env.is_closed:
            self.env.close()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """What :meth:`load_state_dict` needs to continue the same data stream.

        Keys: ``frames``, ``iter``, ``traj_counter``, ``traj_ids``, ``traj_steps``,
        ``carried`` (the next step's input, as plain data), ``env_state_dict`` (the env's
        dynamic state; ``None`` for envs that cannot save it), ``policy_state_dict`` (if the
        policy is a module). Only tensors, numbers, bytes and containers of them:
        ``torch.save``/``torch.load(weights_only=True)`` round-trip it.
        """
        out: dict = {
            "frames": self._frames,
            "iter": self._iter,
            "traj_counter": self._traj_counter,
            "traj_ids": None if self._traj_ids is None else self._traj_ids.clone(),
            "traj_steps": None if self._traj_steps is None else self._traj_steps.clone(),
            "carried": td_state(None if self._carried is None else self._carried.clone()),
            "env_state_dict": env_state(self.env),
        }
        if isinstance(self.policy, nn.Module):
            out["policy_state_dict"] = {k: v.clone() for k, v in self.policy.state_dict().items()}
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores a :meth:`state_dict` (from a collector built the same way).

        If the env's state was not saved (e.g. a ``ParallelEnv``), the env is reset and new
        trajectories start (with a warning): counters resume, the data stream does not.
        """
        missing = {"frames", "iter", "traj_counter", "carried", "env_state_dict"} - set(state_dict)
        if missing:
            raise KeyError(f"Collector.load_state_dict: missing entries {sorted(missing)}")
        if "policy_state_dict" in state_dict and isinstance(self.policy, nn.Module):
            self.policy.load_state_dict(state_dict["policy_state_dict"])
        self._frames = int(state_dict["frames"])
        self._iter = int(state_dict["iter"])
        self._traj_counter = int(state_dict["traj_counter"])
        carried = state_dict["carried"]
        env_sd = state_dict["env_state_dict"]
        if env_sd is not None:
            load_env_state(self.env, env_sd)
        if carried is None:
            self._carried = None
            return
        if env_sd is None:
            warnings.warn(
                f"Collector.load_state_dict: the state of {type(self.env).__name__} was not saved (it "
                "exposes none); the env is reset and new trajectories start"
            )
            self._reset_all()
            return
        self._carried = td_from_state(carried, self.env.device)
        self._traj_ids = state_dict["traj_ids"].clone()
        self._traj_steps = state_dict["traj_steps"].clone()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(env={type(self.env).__name__}, batch_size={list(self.env.batch_size)}, "
                f"frames_per_batch={self.frames_per_batch}, total_frames={self.total_frames}, "
                f"frames={self._frames})")


SyncDataCollector = Collector
