"""Machinery shared by the torch-native batched envs.

Each env is three small pure functions over batched tensors, PureJaxRL style, with
``c`` the env's constants (a NamedTuple derived from its params):

* ``dynamics(state, action, c) -> (next_state, reward, terminated)``, the states as
  tuples of ``S`` component tensors ``[*batch]``;
* ``observe(state, c) -> observation``, from the stacked state ``[S, *batch]``;
* ``init(u, c) -> state``: the reset distribution, from a tuple of ``[0, 1)`` draws.

The env stores the state as one tensor ``[S, *batch]`` (component-major: every
component is a contiguous ``[*batch]`` slice, which keeps eager ops and compiled
loops vectorized; the functions work component by component so that a compiled step
is a single loop over the sub-envs).
:func:`fused_step` composes them with the time limit and, optionally, the auto-reset
of finished sub-envs; it is what ``torch.compile`` fuses into one loop.

Randomness is counter-based and owned by the env: every sub-env holds a 32-bit
counter (``rng``, int32). A reset draws ``u_j = hash(rng + j * golden)`` for
``j < n`` and advances ``rng`` by ``n * golden`` (SplitMix32-style: a Weyl sequence
fed through the ``lowbias32`` integer hash). The draws are a pure function of the
state, so eager, compiled, CPU and CUDA runs give the same numbers, a sub-env's
stream does not depend on which other sub-envs reset, and there is no separate
full-size ``torch.rand`` per step. ``set_seed(seed)`` gives sub-env ``i`` (row-major
index) the counter ``hash64(seed, i)``: distinct, reproducible and independent of
the batch size.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from steersman.data import Categorical
from steersman.tensordict import TensorDict, TensorDictBase

from .._mdp import _splitmix64
from ..common import EnvBase, action_problem, invalid_action

__all__ = ["NativeEnv", "draw_uniforms", "fused_step", "mix32", "make_offsets", "int_consts", "tensor_consts"]


def _i32(v: int) -> int:
    """A Python int wrapped to the int32 range (two's complement)."""
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


_GOLDEN = 0x9E3779B9
_M1 = _i32(0x7FEB352D)
_M2 = _i32(0x846CA68B)
_INV_2_24 = 1.0 / 16777216.0


def mix32(x: Tensor, c: Any = None) -> Tensor:
    """The ``lowbias32`` integer hash of an int32 tensor (wrapping int32 arithmetic).

    Right shifts are made logical with a mask (torch's ``>>`` is arithmetic on int32).
    ``c``: optional :func:`int_consts` (0-dim tensors instead of Python ints: the same
    result, cheaper in eager mode, where wrapping a Python scalar costs an extra op).

    Example:
        >>> import torch
        >>> from steersman.envs.native import mix32
        >>> h = mix32(torch.arange(4, dtype=torch.int32))
        >>> h.dtype, len(set(h.tolist()))
        (torch.int32, 4)
    """
    if c is None:
        x = x ^ ((x >> 16) & 0xFFFF)
        x = x * _M1
        x = x ^ ((x >> 15) & 0x1FFFF)
        x = x * _M2
        return x ^ ((x >> 16) & 0xFFFF)
    x = x ^ ((x >> c.s16) & c.m16)
    x = x * c.m1
    x = x ^ ((x >> c.s15) & c.m17)
    x = x * c.m2
    return x ^ ((x >> c.s16) & c.m16)


class IntConsts(NamedTuple):
    """0-dim int32 tensors used by :func:`mix32` and :func:`draw_uniforms` in eager mode."""

    s16: Tensor
    m16: Tensor
    s15: Tensor
    m17: Tensor
    m1: Tensor
    m2: Tensor
    s8: Tensor
    m24: Tensor


def int_consts(device: Any = None) -> IntConsts:
    """The :class:`IntConsts` on ``device``."""
    vals = (16, 0xFFFF, 15, 0x1FFFF, _M1, _M2, 8, 0xFFFFFF)
    return IntConsts(*(torch.tensor(v, dtype=torch.int32, device=device) for v in vals))


def draw_uniforms(rng: Tensor, offsets: Tensor, dtype: torch.dtype, c: IntConsts | None = None
                  ) -> tuple[Tensor, Tensor]:
    """``n`` uniform draws in ``[0, 1)`` per sub-env and the advanced counters.

    Args:
        rng: int32 counters, shape ``[*batch]``.
        offsets: :func:`make_offsets` ``(n)``: ``j * golden`` for ``j = 0 .. n`` as int32,
            shape ``[n + 1]`` (the last one advances the counters).
        dtype: the floating dtype of the draws (24 random bits each).
        c: optional :func:`int_consts` (eager speed-up; same values).

    Returns: ``(u, rng')``: a tuple of ``n`` draws of shape ``[*batch]`` and the counters.

    Example:
        >>> import torch
        >>> from steersman.envs.native import draw_uniforms
        >>> from steersman.envs.native._base import make_offsets
        >>> u, nxt = draw_uniforms(torch.zeros(5, dtype=torch.int32), make_offsets(3), torch.float32)
        >>> len(u), u[0].shape, all(bool(((v >= 0) & (v < 1)).all()) for v in u), nxt.dtype
        (3, torch.Size([5]), True, torch.int32)
    """
    n = offsets.shape[0] - 1
    if c is None:  # one 1-D expression per draw: compiled, it fuses into the step's loop
        u = tuple(((mix32(rng + offsets[j]) >> 8) & 0xFFFFFF).to(dtype) * _INV_2_24 for j in range(n))
        return u, rng + offsets[n]
    x = rng.unsqueeze(0) + offsets[:n].view(n, *([1] * rng.ndim))
    u = ((mix32(x, c) >> c.s8) & c.m24).to(dtype).mul_(_INV_2_24)
    return u.unbind(0), rng + offsets[n]


def make_offsets(n: int, device: Any = None) -> Tensor:
    """``[0, golden, 2 * golden, ..., n * golden]`` (``n + 1`` values) wrapped to int32."""
    return torch.tensor([_i32(j * _GOLDEN) for j in range(n + 1)], dtype=torch.int32, device=device)


_NP_M1 = np.uint32(0x7FEB352D)
_NP_M2 = np.uint32(0x846CA68B)
_NP_16 = np.uint32(16)
_NP_15 = np.uint32(15)
_NP_8 = np.uint32(8)


def _np_uniforms(r: np.ndarray, offsets: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """:func:`draw_uniforms` in numpy (uint32 wraps and shifts logically): the same bits,
    for the eager CPU path, where numpy's per-op cost on a few hundred sub-envs is lower."""
    n = offsets.shape[0] - 1
    x = r[None, :] + offsets[:n, None]
    x ^= x >> _NP_16
    x *= _NP_M1
    x ^= x >> _NP_15
    x *= _NP_M2
    x ^= x >> _NP_16
    u = (x >> _NP_8).astype(dtype)
    u *= dtype.type(_INV_2_24)
    return u, r + offsets[n]


def lane_keys(seed: int, batch_size: torch.Size, device: Any = None) -> Tensor:
    """The initial int32 counter of every sub-env: ``hash64(seed, i)`` for row-major index ``i``."""
    numel = int(batch_size.numel())
    base = np.uint64(_splitmix64(int(seed) & ((1 << 64) - 1)))
    with np.errstate(over="ignore"):
        z = base + (np.arange(1, numel + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    keys = (z >> np.uint64(32)).astype(np.uint32).view(np.int32)
    return torch.from_numpy(keys.copy()).reshape(batch_size).to(device)


def fused_step(
    dynamics: Callable,
    observe: Callable,
    init: Callable,
    state: Tensor,
    steps: Tensor,
    rng: Tensor,
    offsets: Tensor,
    action: Tensor,
    c: Any,
    one: Any,
    max_steps: Any,
    autoreset: bool,
    udtype: torch.dtype,
    int_flags: bool = False,
) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, ...], Tensor]:
    """One step of every sub-env: dynamics, time limit and (if ``autoreset``) resets.

    ``c`` are the env's constants (Python floats, or 0-dim tensors in eager mode: same
    values, fewer ops); ``one`` is ``1`` (or a 0-dim int32 tensor) and ``max_steps``
    the time limit (int, 0-dim int32 tensor, or None for none).

    Returns ``(state', steps', rng', (obs, reward, done, terminated, truncated), obs')``:
    the ``"next"`` entries are those of the step (``[*batch, 1]`` for reward and
    flags); ``state'``/``obs'`` are after the auto-reset of the sub-envs that are done
    (without ``autoreset``: ``obs' is obs`` and nothing is reset). With ``int_flags``
    the three flags come as one int32 tensor ``[3, *batch]`` instead (compiled CPU
    kernels store int32 many times faster than bool).
    """
    ns, reward, terminated = dynamics(state.unbind(0), action, c)
    nstate = torch.stack(ns)
    steps = steps + one
    if max_steps is None:
        truncated = torch.zeros_like(terminated)
    else:
        truncated = steps >= max_steps
    done = terminated | truncated
    obs = observe(nstate, c)
    if int_flags:
        flags = torch.stack([done.to(torch.int32), terminated.to(torch.int32), truncated.to(torch.int32)])
        nxt: tuple = (obs, reward.unsqueeze(-1), flags)
    else:
        nxt = (obs, reward.unsqueeze(-1), done.unsqueeze(-1), terminated.unsqueeze(-1), truncated.unsqueeze(-1))
    if not autoreset:
        return nstate, steps, rng, nxt, obs
    u, rng_adv = draw_uniforms(rng, offsets, udtype)
    fresh = init(u, c)
    # component by component, so that the compiled step stays one loop over the sub-envs
    rstate = torch.stack([torch.where(done, f, s) for f, s in zip(fresh, ns)])
    rsteps = torch.where(done, 0, steps)
    rrng = torch.where(done, rng_adv, rng)
    return rstate, rsteps, rrng, nxt, observe(rstate, c)


def tensor_consts(c: Any, dtype: torch.dtype, device: Any) -> Any:
    """The NamedTuple ``c`` with its float fields as 0-dim tensors of ``dtype`` on ``device``.

    ``tensor <op> python_float`` costs eager PyTorch an extra conversion per op; a
    0-dim tensor of the same dtype gives the same result without it. Other fields
    (bools, ints) are kept.
    """
    return type(c)(*(
        torch.tensor(v, dtype=dtype, device=device) if type(v) is float else v for v in c
    ))


def _int_flags_as_bool(flags: Tensor) -> tuple[Tensor, ...]:
    """``[3, *batch]`` int32 0/1 flags as three bool ``[*batch, 1]`` tensors.

    On little-endian machines these are zero-copy views of the low byte of each int32
    (strided bool tensors); otherwise a conversion.
    """
    if sys.byteorder == "little":
        return tuple(flags.view(torch.uint8).view(*flags.shape, 4)[..., :1].view(torch.bool).unbind(0))
    return tuple(flags.to(torch.bool).unsqueeze(-1).unbind(0))


_DEFAULT = object()

_INT_DTYPES = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})
_FLOAT_DTYPES = frozenset({torch.float64, torch.float32, torch.float16, torch.bfloat16})


class NativeEnv(EnvBase):
    """Base of the torch-native batched envs (CartPole, Pendulum, ...).

    A subclass sets ``state_names``, ``params`` (a NamedTuple of Python numbers),
    ``_num_uniforms`` (draws per reset), ``_default_max_episode_steps``, the pure
    functions ``_dynamics``/``_observe``/``_init`` and ``_kernel`` (a module-level
    function calling :func:`fused_step`, so that each env has its own compile cache),
    and builds its specs in ``_make_specs``.

    Args:
        batch_size: any batch shape (``[]``, ``[n]``, ``[n, m]`` ...).
        device: where the state lives; every step runs there (CPU, CUDA ...).
        dtype: the floating dtype of state, observations and rewards (float32; use
            float64 to match Gymnasium's float64 physics to the last digits).
        max_episode_steps: per-sub-env time limit, reported as ``truncated``
            (default: Gymnasium's limit for the env id); ``None`` disables it.
        seed: seed of the env's counter-based RNG (default: drawn from torch's global
            RNG, so ``torch.manual_seed`` makes env creation reproducible).
        compile: ``True`` (or a dict of ``torch.compile`` options) runs ``step`` and
            ``step_and_maybe_reset`` through ``torch.compile(fullgraph=True,
            dynamic=False)``-ed kernels (TensorDicts stay eager); the auto-reset draws
            happen inside the compiled graph. Alternatively compile the methods
            themselves: ``torch.compile(env.step_and_maybe_reset, fullgraph=True)``
            traces TensorDicts in and out as one graph.
        check: refuse actions outside the action spec (default True; ``env.check``):
            a discrete action outside ``[0, n)`` (or not one-hot), or a NaN torque,
            raises :class:`~steersman.envs.InvalidActionError` before anything changes.
            One reduction per step (``aminmax``; on CUDA it also waits for the action
            once per step: pass ``check=False`` for the fastest GPU loop); skipped inside
            ``torch.compile``-traced code. Torques outside their bounds are clipped, as in
            Gymnasium.

    State: ``get_state()`` returns the named state components (``[*batch]`` each) and
    ``"step_count"``; ``set_state(...)`` overwrites them (e.g. to replay a Gymnasium
    trajectory). Observations are views of component-major storage (their last dim
    has stride ``numel(batch)``): call ``.contiguous()`` when a dense layout matters.
    Done flags from a compiled step are (strided) bool views of int32 storage.

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv, NativeEnv
        >>> env = CartPoleEnv(batch_size=[2, 3], seed=0, max_episode_steps=50)
        >>> isinstance(env, NativeEnv), env.state_names
        (True, ('x', 'x_dot', 'theta', 'theta_dot'))
        >>> ro = env.rollout(60, break_when_any_done=False)   # auto-resets inside
        >>> ro.batch_size, bool(ro["next", "done"].any())
        (torch.Size([2, 3, 60]), True)
        >>> env.get_state()["step_count"].shape
        torch.Size([2, 3])
    """

    state_names: tuple[str, ...] = ()
    params: Any = None
    #: ``params -> constants`` NamedTuple (Python floats) used by the pure functions
    _derive: Callable
    _num_uniforms: int = 0
    _default_max_episode_steps: int | None = None
    _state_dtype: torch.dtype | None = None  # None: the env's float dtype
    _obs_key = "observation"

    _dynamics: Callable
    _observe: Callable
    _init: Callable
    _kernel: Callable

    def __init__(
        self,
        batch_size: Any = (),
        device: Any = None,
        *,
        dtype: torch.dtype = torch.float32,
        max_episode_steps: Any = _DEFAULT,
        seed: int | None = None,
        compile: bool | dict = False,
        params: Any = None,
        check: bool = True,
    ) -> None:
        super().__init__(device=device, batch_size=batch_size, check=check)
        if not dtype.is_floating_point:
            raise TypeError(f"{type(self).__name__}: dtype must be a floating dtype, got {dtype}")
        self._dtype = dtype
        if params is not None:
            if type(params) is not type(self).params.__class__:
                raise TypeError(
                    f"{type(self).__name__}: params must be a {type(type(self).params).__name__}, "
                    f"got {type(params).__name__}"
                )
            self.params = params
        if max_episode_steps is _DEFAULT:
            max_episode_steps = self._default_max_episode_steps
        if max_episode_steps is not None and (
            not isinstance(max_episode_steps, int) or max_episode_steps < 1
        ):
            raise ValueError(
                f"{type(self).__name__}: max_episode_steps must be a positive int or None, "
                f"got {max_episode_steps!r}"
            )
        self.max_episode_steps: int | None = max_episode_steps
        self._c_float = self._make_consts()
        self._compile = compile
        self._compiled: Callable | None = None
        sdtype = self._state_dtype or dtype
        self._udtype = dtype if sdtype.is_floating_point else torch.float32
        dev = self._device
        bs = self._batch_size
        self._state = torch.zeros((len(self.state_names), *bs), dtype=sdtype, device=dev)
        self._steps = torch.zeros(bs, dtype=torch.int32, device=dev)
        self._offsets = make_offsets(self._num_uniforms, dev)
        self._consts = int_consts(dev)
        self._np_offsets = self._offsets.cpu().numpy().view(np.uint32)
        self._np_udtype = np.dtype(str(self._udtype).replace("torch.", ""))
        self._np_low = self._np_span = None
        bounds = self._affine_reset()
        if bounds is not None:  # affine resets: the eager CPU path stays in numpy
            sdt = np.dtype(str(sdtype).replace("torch.", ""))
            low = np.asarray(bounds[0], dtype=np.float64)
            high = np.asarray(bounds[1], dtype=np.float64)
            self._np_low = low.astype(sdt)[:, None]
            self._np_span = (high - low).astype(sdt)[:, None]
        self._rng = torch.zeros(bs, dtype=torch.int32, device=dev)
        self._subset_resets = dev.type == "cpu"
        self._eager_consts()
        self._categorical = True
        self._make_specs()
        spec = self.action_spec
        # the action check's fast path: an unmasked Categorical is a range check
        self._check_n = spec.n if isinstance(spec, Categorical) and spec.mask is None else None
        self._action_shape = spec.shape
        self._action_dtypes = self._allowed_action_dtypes()
        self._excl_root = frozenset(("next", "_reset", "action", "reward"))
        self._set_seed(seed)
        # a valid state before the first reset (the first reset draws the same one)
        self._state, self._steps, _ = self._full_reset()

    # ------------------------------------------------------------------ subclass API
    def _make_specs(self) -> None:
        raise NotImplementedError

    def _make_consts(self) -> Any:
        """The constants of the pure functions (Python numbers): ``_derive(params)``."""
        return type(self)._derive(self.params)

    def _affine_reset(self) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """``(low, high)`` per state component if ``_init(u) == low + (high - low) * u``
        (component ``i`` from ``u[i]``), which lets the eager CPU reset path run in
        numpy; None otherwise. Must agree with ``_init`` (the tests compare them)."""
        return None

    def _allowed_action_dtypes(self) -> frozenset:
        spec = self.action_spec
        if spec.dtype is not None and spec.dtype.is_floating_point:
            return _FLOAT_DTYPES
        if not self._categorical:
            return _INT_DTYPES | {torch.bool}
        return _INT_DTYPES

    def _eager_consts(self) -> None:
        dev = self._device
        self._c_tensor = tensor_consts(self._c_float, self._state.dtype if self._state.dtype.is_floating_point
                                       else self._dtype, dev)
        self._one = torch.tensor(1, dtype=torch.int32, device=dev)
        ms = self.max_episode_steps
        self._max_t = None if ms is None else torch.tensor(ms, dtype=torch.int32, device=dev)

    # ------------------------------------------------------------------ properties
    @property
    def dtype(self) -> torch.dtype:
        """The floating dtype of observations, rewards and (continuous) state."""
        return self._dtype

    def _kernel_fn(self) -> Callable:
        if not self._compile:
            return type(self)._kernel
        if self._compiled is None:
            opts = dict(self._compile) if isinstance(self._compile, dict) else {}
            opts.setdefault("fullgraph", True)
            opts.setdefault("dynamic", False)  # static shapes: ~1.5x faster loops on CPU
            # A private copy of the kernel's code object gives this env its own compile
            # cache: envs of other batch shapes never evict it nor hit the recompile limit.
            fn = type(self)._kernel
            own = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__,
                                     fn.__defaults__, fn.__closure__)
            self._compiled = torch.compile(own, **opts)
        return self._compiled

    # ------------------------------------------------------------------ state access
    def get_state(self) -> TensorDictBase:
        """The named state components (``[*batch]`` each) and ``"step_count"`` (copies).

        Example:
            >>> from steersman.envs import CartPoleEnv
            >>> env = CartPoleEnv(batch_size=[3], seed=0)
            >>> sorted(env.get_state().keys())
            ['step_count', 'theta', 'theta_dot', 'x', 'x_dot']
        """
        out = {name: self._state[i].clone() for i, name in enumerate(self.state_names)}
        out["step_count"] = self._steps.to(torch.int64)
        return TensorDict.from_trusted(out, self._batch_size, self._device)

    def set_state(self, state: TensorDictBase | Mapping | Tensor) -> None:
        """Overwrites the state: a mapping of component names (any subset, and
        ``"step_count"``) to values broadcastable to ``[*batch]``, or a tensor
        ``[*batch, S]`` with every component in ``state_names`` order.

        Example:
            >>> import torch
            >>> from steersman.envs import PendulumEnv
            >>> env = PendulumEnv(batch_size=[2], seed=0)
            >>> env.set_state({"th": torch.tensor([0.0, 1.0]), "thdot": 0.0})
            >>> env.get_state()["th"]
            tensor([0., 1.])
        """
        sdtype = self._state.dtype
        new = self._state.clone()
        if isinstance(state, Tensor):
            if state.shape[-1:] != (len(self.state_names),):
                raise ValueError(
                    f"{type(self).__name__}.set_state: a tensor state must end with "
                    f"{len(self.state_names)} components {self.state_names}, got shape {list(state.shape)}"
                )
            new.copy_(state.to(device=self._device, dtype=sdtype).movedim(-1, 0).expand_as(new))
            self._state = new
            return
        names = list(state.keys())
        unknown = [k for k in names if k not in self.state_names and k != "step_count"]
        if unknown:
            raise KeyError(
                f"{type(self).__name__}.set_state: unknown state entries {unknown}; "
                f"valid: {list(self.state_names)} and 'step_count'"
            )
        for i, name in enumerate(self.state_names):
            if name in names:
                val = torch.as_tensor(state[name], dtype=sdtype, device=self._device)
                new[i] = val.expand(self._batch_size)
        if "step_count" in names:
            val = torch.as_tensor(state["step_count"], device=self._device)
            self._steps = val.to(torch.int32).expand(self._batch_size).clone()
        self._state = new

    # ------------------------------------------------------------------ seeding
    def _set_seed(self, seed: int | None) -> None:
        if seed is None:
            seed = int(torch.randint(0, 2**62, ()).item())
        self._rng = lane_keys(seed, self._batch_size, self._device)

    def set_seed_per_row(self, seeds: Sequence[int]) -> None:
        """Seeds every row (index along the first batch dim) on its own: row ``k`` of a
        ``[N, *rest]`` env gets the counters that ``type(env)(batch_size=rest, seed=seeds[k])``
        would have, so it draws the same resets as that env alone (many seeds in one env).

        Raises ``ValueError`` (state untouched) unless the env has at least two batch dims
        and ``len(seeds) == batch_size[0]``.

        Example:
            >>> import torch
            >>> from steersman.envs import CartPoleEnv
            >>> many = CartPoleEnv(batch_size=[2, 3])
            >>> many.set_seed_per_row([7, 8])
            >>> alone = CartPoleEnv(batch_size=[3], seed=8)
            >>> torch.equal(many.reset()["observation"][1], alone.reset()["observation"])
            True
        """
        seeds = [int(s) for s in seeds]
        if len(self._batch_size) < 2 or len(seeds) != self._batch_size[0]:
            raise ValueError(f"{type(self).__name__}.set_seed_per_row: needs one seed per row of a batch "
                             f"[rows, *rest] (at least 2 dims); got {len(seeds)} seeds for batch_size "
                             f"{list(self._batch_size)}")
        row = torch.Size(self._batch_size[1:])
        self._rng = torch.stack([lane_keys(s, row, self._device) for s in seeds])

    @property
    def rng_state(self) -> Tensor:
        """A copy of the sub-envs' random counters (int32 ``[*batch]``), for :meth:`set_rng_state`.

        Example:
            >>> import torch
            >>> from steersman.envs import CartPoleEnv
            >>> env = CartPoleEnv(batch_size=[2], seed=0)
            >>> saved = env.rng_state
            >>> first = env.reset()["observation"]
            >>> env.set_rng_state(saved)
            >>> torch.equal(env.reset()["observation"], first)
            True
        """
        return self._rng.clone()

    def set_rng_state(self, state: Tensor) -> None:
        """Restores counters from :attr:`rng_state` (a ``ValueError`` naming the expected
        shape and dtype otherwise; state untouched)."""
        if not isinstance(state, Tensor) or state.dtype != torch.int32 or state.shape != self._batch_size:
            got = (f"{state.dtype} {list(state.shape)}" if isinstance(state, Tensor) else type(state).__name__)
            raise ValueError(f"{type(self).__name__}.set_rng_state: expected an int32 tensor of shape "
                             f"{list(self._batch_size)}, got {got}")
        self._rng = state.to(self._device, copy=True)

    # ------------------------------------------------------------------ resets
    def _full_reset(self) -> tuple[Tensor, Tensor, Tensor]:
        u, rng = draw_uniforms(self._rng, self._offsets, self._udtype, self._consts)
        state = torch.stack(type(self)._init(u, self._c_tensor))
        return state, torch.zeros_like(self._steps), rng

    def _reset_subset(self, state: Tensor, steps: Tensor, rng: Tensor, idx: np.ndarray
                      ) -> tuple[Tensor, Tensor, Tensor]:
        """Resets the sub-envs at flat indices ``idx`` (CPU, eager).

        Works on numpy views of the tensors: a few hundred sub-envs cost numpy a
        microsecond per op where torch needs several. ``state`` is copied (returned
        observations may alias it); ``steps``/``rng`` are updated in place. The draws
        are bit-identical to :func:`draw_uniforms`.
        """
        r_all = rng.numpy().reshape(-1).view(np.uint32)
        u, r_adv = _np_uniforms(r_all[idx], self._np_offsets, self._np_udtype)
        if self._np_span is not None:
            fresh = u * self._np_span
            fresh += self._np_low
        else:
            fresh = torch.stack(type(self)._init(torch.from_numpy(u).unbind(0), self._c_tensor)).numpy()
        s_np = state.numpy().copy()
        s_np.reshape(s_np.shape[0], -1)[:, idx] = fresh
        steps.numpy().reshape(-1)[idx] = 0
        r_all[idx] = r_adv
        return torch.from_numpy(s_np), steps, rng

    def _done_flags(self) -> tuple[Tensor, ...]:
        """Three fresh all-False ``[*batch, 1]`` tensors (done, terminated, truncated)."""
        if self._subset_resets:
            return torch.from_numpy(np.zeros((3, *self._batch_size, 1), dtype=np.bool_)).unbind(0)
        return torch.zeros((3, *self._batch_size, 1), dtype=torch.bool, device=self._device).unbind(0)

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        if kwargs:
            raise TypeError(f"{type(self).__name__}.reset got unexpected arguments {sorted(kwargs)}")
        mask = self._reset_mask(tensordict)
        if mask is None:
            self._state, self._steps, self._rng = self._full_reset()
        elif self._subset_resets:
            idx = np.flatnonzero(mask.numpy())
            if idx.size:
                self._state, self._steps, self._rng = self._reset_subset(
                    self._state, self._steps.clone(), self._rng.clone(), idx
                )
        else:
            u, rng_adv = draw_uniforms(self._rng, self._offsets, self._udtype, self._consts)
            fresh = torch.stack(type(self)._init(u, self._c_tensor))
            self._state = torch.where(mask, fresh, self._state)
            self._steps = torch.where(mask, 0, self._steps)
            self._rng = torch.where(mask, rng_adv, self._rng)
        done, term, trunc = self._done_flags()
        return TensorDict.from_trusted(
            {self._obs_key: type(self)._observe(self._state, self._c_tensor), "done": done,
             "terminated": term, "truncated": trunc},
            self._batch_size, self._device,
        )

    # ------------------------------------------------------------------ steps
    def _get_action(self, tensordict: TensorDictBase) -> Tensor:
        if type(tensordict) is TensorDict:
            action = tensordict.entries.get("action")
        else:
            action = tensordict.get("action", None)
        if action is None:
            raise KeyError(
                f"{type(self).__name__}.step: the tensordict has no 'action' entry "
                f"(keys: {sorted(map(str, tensordict.keys()))}); set one, e.g. env.rand_action(td)"
            )
        if action.shape != self._action_shape or action.dtype not in self._action_dtypes:
            self._bad_action(action)
        if self.check and not torch.compiler.is_compiling():
            self._refuse_out_of_spec(action)
        if not self._categorical:
            action = action.to(torch.int32).argmax(-1)
        return action

    def _action_guard(self, tensordict: TensorDictBase) -> None:
        """No-op: ``_step`` checks the action itself (see ``_refuse_out_of_spec``)."""

    def _refuse_out_of_spec(self, action: Tensor) -> None:
        """Raises :class:`InvalidActionError` if ``action`` (of valid shape and dtype) is
        outside the action spec; one reduction."""
        n = self._check_n
        if n is not None:
            if action.ndim == 0:
                x = action.item()
                if 0 <= x < n:
                    return
            elif not action.numel():
                return
            else:
                lo, hi = torch.aminmax(action)
                if lo.item() >= 0 and hi.item() < n:
                    return
        spec = self.action_spec
        reason = action_problem(spec, action)
        if reason is not None:
            raise invalid_action(self, "action", spec, action, reason)

    def _bad_action(self, action: Any) -> None:
        allowed = sorted(str(d).replace("torch.", "") for d in self._action_dtypes)
        raise ValueError(
            f"{type(self).__name__}.step: the action has shape {list(getattr(action, 'shape', []))} and "
            f"dtype {getattr(action, 'dtype', type(action).__name__)}; expected shape "
            f"{list(self._action_shape)} and one of the dtypes {allowed} (action_spec: {self.action_spec!r})"
        )

    def _run(self, action: Tensor, autoreset: bool) -> tuple:
        if self._compile:
            state, steps, rng, nxt, robs = self._kernel_fn()(
                self._state, self._steps, self._rng, self._offsets, action, self._c_float,
                1, self.max_episode_steps, autoreset, self._udtype, True,
            )
            obs, reward, flags = nxt
            return state, steps, rng, (obs, reward, *_int_flags_as_bool(flags)), robs
        return type(self)._kernel(
            self._state, self._steps, self._rng, self._offsets, action, self._c_tensor,
            self._one, self._max_t, autoreset, self._udtype,
        )

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = self._get_action(tensordict)
        self._state, self._steps, self._rng, nxt, _ = self._run(action, False)
        obs, reward, done, term, trunc = nxt
        return TensorDict.from_trusted(
            {self._obs_key: obs, "reward": reward, "done": done, "terminated": term, "truncated": trunc},
            self._batch_size, self._device,
        )

    def step_and_maybe_reset(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        """Steps and auto-resets the finished sub-envs in one pass (see ``EnvBase``).

        On CPU in eager mode, only the finished sub-envs draw reset states; compiled
        or on other devices, every sub-env draws and a ``torch.where`` keeps the
        needed ones (same numbers either way: the RNG is counter-based).
        """
        if self._is_closed:
            self._assert_open()
        if type(tensordict) is not TensorDict or "next" in tensordict.entries:
            return super().step_and_maybe_reset(tensordict)  # generic path keeps a preset "next"
        root = tensordict.entries
        action = self._get_action(tensordict)
        if self._compile or not self._subset_resets or torch.compiler.is_compiling():
            state, steps, rng, nxt, robs = self._run(action, True)
        else:
            state, steps, rng, nxt, robs = self._run(action, False)
            idx = np.flatnonzero(nxt[2].numpy())
            if idx.size:
                state, steps, rng = self._reset_subset(state, steps, rng, idx)
                robs = type(self)._observe(state, self._c_tensor)
        self._state, self._steps, self._rng = state, steps, rng
        obs, reward, done, term, trunc = nxt
        bs, dev, ok = self._batch_size, self._device, self._obs_key
        root["next"] = TensorDict.from_trusted(
            {ok: obs, "reward": reward, "done": done, "terminated": term, "truncated": trunc}, bs, dev
        )
        excl = self._excl_root
        out = {k: v for k, v in root.items() if k not in excl}
        out[ok] = robs
        out["done"], out["terminated"], out["truncated"] = self._done_flags()
        return tensordict, TensorDict.from_trusted(out, bs, dev)

    # ------------------------------------------------------------------ device
    def to(self, device: Any) -> NativeEnv:
        super().to(device)
        dev = self._device
        self._state = self._state.to(dev)
        self._steps = self._steps.to(dev)
        self._rng = self._rng.to(dev)
        self._offsets = self._offsets.to(dev)
        self._consts = int_consts(dev)
        self._subset_resets = dev.type == "cpu"
        self._eager_consts()
        self._action_shape = self.action_spec.shape
        return self

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(batch_size={list(self._batch_size)}, device={self._device}, "
            f"dtype={self._dtype}, max_episode_steps={self.max_episode_steps}, "
            f"compile={bool(self._compile)})"
        )
