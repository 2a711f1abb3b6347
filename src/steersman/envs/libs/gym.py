"""Gymnasium environments as steersman envs: :class:`GymWrapper`, :class:`GymEnv`.

Gymnasium is an optional dependency: it is imported when a wrapper is built, never when
this module is imported (``pip install 'steersman[gym]'``).

Spaces become specs (:func:`space_to_spec`):

==================  ==========================================================
Gymnasium space     spec
==================  ==========================================================
``Box``             :class:`Bounded` (its dtype kept, float64 included), or
                    :class:`Unbounded` when every bound is infinite
``Discrete``        :class:`OneHot` when ``categorical_action_encoding=False``
                    (the default, as in TorchRL), else :class:`Categorical`;
                    the same flag applies to observations
``MultiDiscrete``   :class:`MultiOneHot` / :class:`MultiCategorical` (same flag;
                    a nvec of more than one dim always gives MultiCategorical)
``MultiBinary``     :class:`Binary` (int8)
``Dict``            nested :class:`Composite` (keys kept)
``Tuple``           :class:`Composite` with keys ``"0"``, ``"1"``, ...
``Text``            :class:`NonTensor` (observations of single envs only)
others              ``TypeError`` naming the space (``Graph``, ``Sequence`` ...)
==================  ==========================================================

``Discrete(n, start=s)`` values ``s..s+n-1`` are stored as ``0..n-1`` (the spec's
range); the wrapper adds ``s`` back on actions, which reach Gymnasium as numpy values (a
``Discrete`` action as a numpy integer of the space's dtype, like ``space.sample()``).
Observations go under ``"observation"``, except a ``Dict`` observation space whose keys
are used directly. Rewards are float32 ``[*batch, 1]``; ``terminated`` and ``truncated`` are Gymnasium's,
``done = terminated | truncated``.

Vector envs (``gymnasium.vector.VectorEnv``) become one env of batch size ``[num_envs]``
and every Gymnasium 1.x autoreset mode is handled so that the stream of transitions is
exactly the one of independent single envs:

* ``NEXT_STEP`` (Gymnasium's default): the step after an episode end would ignore the
  action and return the reset observation. The wrapper never sends that step: a
  finished sub-env is reset through ``reset(td with "_reset")`` (what
  ``step_and_maybe_reset`` and ``rollout`` do), which calls
  ``env.reset(options={"reset_mask": mask})``. This needs a vector env with partial
  resets (``SyncVectorEnv``/``AsyncVectorEnv``); a custom vector env without them can
  only be reset whole (a partial reset raises an error saying so).
* ``SAME_STEP``: the observation returned at an episode end is already the next
  episode's; the wrapper puts the true final observation (``info["final_obs"]``) in
  ``("next", "observation")`` and returns the reset observation from the following
  ``reset(td with "_reset")`` without calling Gymnasium again.
* ``DISABLED``: finished sub-envs are reset with ``reset(options={"reset_mask": mask})``.
"""

from __future__ import annotations

import difflib
import functools
import math
import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from steersman.data import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    MultiOneHot,
    NonTensor,
    OneHot,
    TensorSpec,
    Unbounded,
)
from steersman.tensordict import TensorDict, TensorDictBase

from ..common import EnvBase, action_problem, invalid_action

if TYPE_CHECKING:  # pragma: no cover
    import gymnasium

__all__ = [
    "GymWrapper", "GymEnv", "space_to_spec", "gymnasium_available", "GYM_EXTRA_HINT",
    "GymDependencyError", "set_gym_backend", "gym_backend", "register_gym_spec_conversion",
]

#: how to install the optional Gymnasium dependency.
GYM_EXTRA_HINT = "pip install 'steersman[gym]'"


def gymnasium_available() -> bool:
    """Whether ``gymnasium`` can be imported (does not import it if it is not loaded yet)."""
    import importlib.util

    return importlib.util.find_spec("gymnasium") is not None


def _import_gymnasium() -> Any:
    """``import gymnasium``, or an ImportError naming the extra to install."""
    try:
        import gymnasium
    except ImportError as err:  # pragma: no cover - exercised with gymnasium missing
        raise ImportError(
            "steersman's Gymnasium integration needs the gymnasium package (>=1.0): "
            f"{GYM_EXTRA_HINT}"
        ) from err
    return gymnasium


# ---------------------------------------------------------------------- backend
def _backend_name(backend: Any) -> str:
    if isinstance(backend, str):
        return backend
    if not isinstance(backend, types.ModuleType) and callable(backend):
        backend = backend()  # a callable returning the module
    return getattr(backend, "__name__", repr(backend))


class set_gym_backend:  # noqa: N801 - TorchRL's name
    """Chooses the Gym library the wrappers use (a context manager or a decorator).

    Args:
        backend: ``"gymnasium"``, the ``gymnasium`` module, or a callable returning it.

    steersman wraps Gymnasium only (>= 1.0): any other backend (``"gym"``, OpenAI Gym,
    SB3's vectorized envs...) is refused with a ``ValueError`` when the switch is made;
    with ``"gymnasium"`` it is a no-op that checks gymnasium is importable.

    Example:
        >>> from steersman.envs.libs.gym import gym_backend, set_gym_backend
        >>> with set_gym_backend("gymnasium"):
        ...     gym_backend().__name__
        'gymnasium'
        >>> try:
        ...     set_gym_backend("gym").set()
        ... except ValueError as err:
        ...     print(str(err).split(":")[0])
        set_gym_backend('gym')
    """

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def _check(self) -> None:
        name = _backend_name(self.backend)
        if name != "gymnasium":
            raise ValueError(
                f"set_gym_backend({name!r}): steersman supports the gymnasium backend only "
                f"(gymnasium>=1.0, {GYM_EXTRA_HINT}); port the env to gymnasium or wrap it in a "
                "steersman EnvBase"
            )
        _import_gymnasium()

    def set(self) -> None:
        """Makes the switch permanently (checks the backend)."""
        self._check()

    def __enter__(self) -> set_gym_backend:
        self._check()
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def __call__(self, func: Callable) -> Callable:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        return wrapper


def gym_backend(submodule: str | None = None) -> Any:
    """The Gym library in use (always ``gymnasium``), or one of its submodules.

    Example:
        >>> from steersman.envs.libs.gym import gym_backend
        >>> gym_backend("spaces").__name__
        'gymnasium.spaces'
    """
    gym = _import_gymnasium()
    if submodule is None:
        return gym
    import importlib

    return importlib.import_module(f"gymnasium.{submodule}")


# ---------------------------------------------------------------------- spaces -> specs
def _torch_dtype(np_dtype: Any) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype=np_dtype)).dtype


def _start_of(space: Any) -> np.ndarray | int:
    start = getattr(space, "start", 0)
    if isinstance(start, np.ndarray):
        return start if bool((start != 0).any()) else 0
    return int(start)


#: user conversions: a space class (or its dotted name under ``gymnasium.spaces``) -> fn
_SPEC_CONVERSIONS: dict[Any, Callable] = {}


def register_gym_spec_conversion(spec_type: Any) -> Callable[[Callable], Callable]:
    """Registers a function converting a Gymnasium space type to a spec (a decorator).

    ``spec_type`` is the space class or its name under ``gymnasium.spaces`` (e.g.
    ``"Graph"``, ``"Box"``). The function is called as ``fn(space, dtype=None, device=...,
    categorical_action_encoding=..., remap_state_to_observation=None, batch_size=...)``
    (unused keywords may be taken with ``**kwargs``) and returns a spec; it takes precedence
    over the built-in conversions (:func:`space_to_spec`), also for sub-spaces of ``Dict``
    and ``Tuple`` spaces.

    Example:
        >>> import gymnasium as gym
        >>> from steersman.data import Unbounded
        >>> from steersman.envs import register_gym_spec_conversion, space_to_spec
        >>> @register_gym_spec_conversion("Graph")
        ... def graph_to_spec(space, batch_size=(), device=None, **kwargs):
        ...     return Unbounded(shape=(*batch_size, 5), device=device)
        >>> g = gym.spaces.Graph(node_space=gym.spaces.Box(0, 1, (5,)), edge_space=None)
        >>> space_to_spec(g).shape
        torch.Size([5])
    """
    if not (isinstance(spec_type, str) or isinstance(spec_type, type)):
        raise TypeError(f"register_gym_spec_conversion takes a space class or its name, got {spec_type!r}")

    def decorator(fn: Callable) -> Callable:
        if not callable(fn):
            raise TypeError(f"register_gym_spec_conversion: {fn!r} is not callable")
        key = spec_type.split(".")[-1] if isinstance(spec_type, str) else spec_type
        _SPEC_CONVERSIONS[key] = fn
        return fn

    return decorator


def _registered_conversion(space: Any) -> Callable | None:
    if not _SPEC_CONVERSIONS:
        return None
    for cls in type(space).__mro__:
        fn = _SPEC_CONVERSIONS.get(cls) or _SPEC_CONVERSIONS.get(cls.__name__)
        if fn is not None:
            return fn
    return None


def space_to_spec(
    space: Any,
    *,
    categorical_action_encoding: bool = False,
    batch_size: Sequence[int] = (),
    device: Any = None,
    name: str = "observation",
) -> TensorSpec:
    """The spec of a Gymnasium space (see the module docstring for the mapping).

    Args:
        space: a ``gymnasium.spaces.Space`` of ONE env (for a vector env, its
            ``single_observation_space``/``single_action_space``).
        categorical_action_encoding: ``Discrete``/``MultiDiscrete`` as index specs
            (:class:`Categorical`, :class:`MultiCategorical`) instead of one-hot ones.
        batch_size: leading dims of the spec (``[num_envs]`` for a vector env).
        device: the spec's device.
        name: the key the space is converted for, used in error messages.

    Example:
        >>> import gymnasium as gym
        >>> from steersman.envs.libs.gym import space_to_spec
        >>> space_to_spec(gym.spaces.Discrete(3))
        OneHot(shape=[3], n=3, device=cpu, dtype=torch.bool, domain=discrete)
        >>> space_to_spec(gym.spaces.Discrete(3), categorical_action_encoding=True, batch_size=[4]).shape
        torch.Size([4])
        >>> spec = space_to_spec(gym.spaces.Dict(a=gym.spaces.Box(0, 1, (2,)), b=gym.spaces.MultiBinary(3)))
        >>> sorted(spec.keys()), spec["a"].dtype, spec["b"].shape
        (['a', 'b'], torch.float32, torch.Size([3]))
    """
    gym = _import_gymnasium()
    spaces = gym.spaces
    bs = tuple(int(b) for b in batch_size)
    cae = categorical_action_encoding
    custom = _registered_conversion(space)
    if custom is not None:
        return custom(space, dtype=None, device=device, categorical_action_encoding=cae,
                      remap_state_to_observation=None, batch_size=bs)
    if isinstance(space, spaces.Box):
        dtype = _torch_dtype(space.dtype)
        shape = (*bs, *space.shape)
        low = np.broadcast_to(space.low, space.shape)
        high = np.broadcast_to(space.high, space.shape)
        if dtype.is_floating_point and bool(np.isinf(low).all() and np.isinf(high).all()):
            return Unbounded(shape=shape, device=device, dtype=dtype)
        return Bounded(
            low=torch.as_tensor(np.array(low)), high=torch.as_tensor(np.array(high)),
            shape=shape, device=device, dtype=dtype,
        )
    if isinstance(space, spaces.Discrete):
        n = int(space.n)
        if cae:
            return Categorical(n, shape=bs, device=device)
        return OneHot(n, shape=(*bs, n), device=device)
    if isinstance(space, spaces.MultiDiscrete):
        nvec = np.asarray(space.nvec)
        if cae or nvec.ndim != 1:
            return MultiCategorical(
                torch.as_tensor(nvec.astype(np.int64)), shape=(*bs, *nvec.shape), device=device,
                remove_singleton=False,  # env samples keep the declared shape
            )
        return MultiOneHot([int(n) for n in nvec], shape=(*bs, int(nvec.sum())), device=device)
    if isinstance(space, spaces.MultiBinary):
        shape = tuple(space.shape)
        return Binary(n=int(shape[-1]), shape=(*bs, *shape), device=device, dtype=torch.int8)
    if isinstance(space, spaces.Dict):
        return Composite(
            {
                str(k): space_to_spec(
                    sub, categorical_action_encoding=cae, batch_size=bs, device=device,
                    name=f"{name}.{k}",
                )
                for k, sub in space.spaces.items()
            },
            shape=bs, device=device,
        )
    if isinstance(space, spaces.Tuple):
        return Composite(
            {
                str(i): space_to_spec(
                    sub, categorical_action_encoding=cae, batch_size=bs, device=device,
                    name=f"{name}.{i}",
                )
                for i, sub in enumerate(space.spaces)
            },
            shape=bs, device=device,
        )
    if isinstance(space, spaces.Text):
        return NonTensor(shape=bs, device=device, example_data="")
    raise TypeError(
        f"steersman cannot convert the Gymnasium space {space!r} ({type(space).__name__}, "
        f"for {name!r}) into a spec: supported spaces are Box, Discrete, MultiDiscrete, "
        "MultiBinary, Dict, Tuple and Text (observations). Flatten it first, e.g. with "
        "gymnasium.wrappers.FlattenObservation or a custom ObservationWrapper/ActionWrapper."
    )


# ---------------------------------------------------------------------- leaves
class _Leaf:
    """One tensor entry written at every step: where its value comes from and how.

    ``kind``: ``"assign"`` (numpy assignment into a preallocated row), ``"onehot"``
    (``eye[value - start]`` assigned), ``"offset"`` (``value - start`` assigned) or
    ``"encode"`` (``spec.encode(value)``: a fresh tensor, used for the rare kinds).
    """

    __slots__ = ("key", "path", "kind", "spec", "start", "eye", "slot", "tshape", "nshape", "dtype")

    def __init__(self, key: tuple[str, ...], path: tuple, kind: str, spec: TensorSpec,
                 tshape: tuple, nshape: tuple, dtype: torch.dtype | None,
                 start: Any = 0, eye: np.ndarray | None = None) -> None:
        self.key = key  # where the value goes in the output TensorDict
        self.path = path  # where the value is in Gymnasium's observation (keys / indices)
        self.kind = kind
        self.spec = spec
        self.start = start
        self.eye = eye
        self.slot = -1
        self.tshape = tshape  # tensor shape (batch included)
        self.nshape = nshape  # shape of the numpy view written into
        self.dtype = dtype

    def extract(self, obs: Any) -> Any:
        for p in self.path:
            obs = obs[p]
        return obs

    def np_value(self, value: Any) -> Any:
        """The value as written into the numpy row (kinds other than ``encode``)."""
        if self.kind == "onehot":
            return self.eye[np.asarray(value) - self.start]
        if self.kind == "offset":
            return np.asarray(value) - self.start
        return value


def _obs_leaves(space: Any, spec: TensorSpec, key: tuple, path: tuple, bs: tuple,
                out: list[_Leaf]) -> None:
    gym = _import_gymnasium()
    spaces = gym.spaces
    if isinstance(space, (spaces.Dict, spaces.Tuple)):
        items = space.spaces.items() if isinstance(space, spaces.Dict) else enumerate(space.spaces)
        for k, sub in items:
            _obs_leaves(sub, spec[str(k)], (*key, str(k)), (*path, k), bs, out)
        return
    tshape = tuple(spec.shape)
    if isinstance(space, spaces.Text):
        if bs:
            raise TypeError(
                f"GymWrapper: the Text space at {key} is only supported for single envs "
                "(a vector env returns one string per sub-env)"
            )
        out.append(_Leaf(key, path, "encode", spec, tshape, tshape, None))
        return
    start = _start_of(space)
    if isinstance(spec, OneHot):
        eye = np.eye(spec.n, dtype=np.bool_)
        out.append(_Leaf(key, path, "onehot", spec, tshape, tshape, spec.dtype, start, eye))
    elif isinstance(spec, MultiOneHot):
        out.append(_Leaf(key, path, "encode", spec, tshape, tshape, spec.dtype, start))
    elif isinstance(start, np.ndarray) or start != 0:
        out.append(_Leaf(key, path, "offset", spec, tshape, tshape, spec.dtype, start))
    else:
        out.append(_Leaf(key, path, "assign", spec, tshape, tshape, spec.dtype))


# ---------------------------------------------------------------------- preallocation
class _Rows:
    """Preallocated output memory, handed out one row per step.

    Every leaf gets a block ``[k, *shape]``; step ``i`` writes row ``i`` through a numpy
    view (one cheap assignment instead of a tensor construction) and returns the row as
    its own tensor (from ``block.unbind(0)``, made once per block: the cheapest way to
    make many tensors). Rows are never reused: when a block is used up a new one is
    allocated, so two steps never share a tensor or memory that is written again.

    The blocks of all leaves are views of one byte buffer, so one pointer comparison per
    row (:meth:`next_row`) notices when torch moved that buffer (``share_memory_()`` on any
    handed-out row, which ``torch.multiprocessing`` does to a tensor put on a queue, moves
    the whole storage): the numpy views are then made again over the new memory, and the
    rows still to come are written where their tensors look.

    ``np[slot][i]``: the numpy view written into; ``t[slot][i]``: the tensor handed out;
    ``by_row[i]``: the tensors of row ``i``, one per slot (a tuple).
    """

    __slots__ = ("k", "i", "np", "t", "by_row", "_specs", "_slots", "_nbytes", "_blocks", "_base", "_ptr")

    def __init__(self, specs: list[tuple[tuple, tuple, torch.dtype]], budget: int = 1 << 16) -> None:
        self._specs = specs
        itemsizes = [torch.empty((), dtype=dt).element_size() for _, _, dt in specs]
        row_bytes = sum(max(1, math.prod(ts)) * b for (ts, _, _), b in zip(specs, itemsizes))
        self.k = max(1, min(256, budget // max(1, row_bytes)))
        # each slot's byte range in the buffer of a block (16-byte aligned)
        self._slots: list[tuple[int, int]] = []
        lo = 0
        for (ts, _, _), b in zip(specs, itemsizes):
            n = self.k * math.prod(ts) * b
            self._slots.append((lo, lo + n))
            lo += -(-n // 16) * 16
        self._nbytes = lo
        self._refill()

    def _refill(self) -> None:
        k = self.k
        base = torch.zeros(self._nbytes, dtype=torch.uint8)  # zeros: False flags need no write
        self._blocks: list[Tensor] = []
        self.t: list[tuple[Tensor, ...]] = []
        for (tshape, _, dtype), (lo, hi) in zip(self._specs, self._slots):
            block = base[lo:hi].view(dtype).view(k, *tshape)
            self._blocks.append(block)
            self.t.append(block.unbind(0))
        self._base = base
        self._views()
        self.by_row: list[tuple[Tensor, ...]] = list(zip(*self.t))
        self.i = 0

    def _views(self) -> None:
        """(Re)makes the numpy views over the blocks' current memory."""
        self._ptr = self._base.data_ptr()
        self.np: list[np.ndarray] = [
            b.numpy().reshape((self.k, *nshape)) for b, (_, nshape, _) in zip(self._blocks, self._specs)
        ]

    def next_row(self) -> int:
        i = self.i
        if i == self.k:
            self._refill()
            i = 0
        elif self._base.data_ptr() != self._ptr:
            self._views()
        self.i = i + 1
        return i


# ---------------------------------------------------------------------- actions
def _to_numpy(t: Tensor) -> np.ndarray:
    try:
        return t.numpy()
    except (RuntimeError, TypeError):
        return t.detach().cpu().numpy()


def _discrete_values(space: Any) -> list[np.integer]:
    """The elements of a ``Discrete`` space as Gymnasium makes them (``space.sample()``'s
    type: a numpy scalar of ``space.dtype``, which ``space.contains`` checks fastest)."""
    start = int(space.start)
    return [space.dtype.type(start + j) for j in range(int(space.n))]


def _action_converter(space: Any, spec: TensorSpec, key: Any, vector: bool,
                      to_numpy: bool, owner: Any = None) -> Callable[[Any], Any]:
    """A function: the action entry (a tensor, or a TensorDict for Dict/Tuple spaces)
    -> what ``gym_env.step`` takes. Checks the shape; with ``owner`` (the env, for the
    error message) also the values (:func:`~steersman.envs.common.action_problem`: a
    discrete value outside the spec, a NaN; continuous values outside the bounds go to
    Gymnasium). The checks run before anything is sent to Gymnasium."""
    gym = _import_gymnasium()
    spaces = gym.spaces
    if isinstance(space, (spaces.Dict, spaces.Tuple)):
        is_dict = isinstance(space, spaces.Dict)
        items = list(space.spaces.items()) if is_dict else list(enumerate(space.spaces))
        subs = [
            (k, str(k), _action_converter(sub, spec[str(k)], (*_as_tuple(key), str(k)), vector, to_numpy,
                                          owner))
            for k, sub in items
        ]
        if is_dict:
            return lambda td: {k: f(td.get(sk)) for k, sk, f in subs}
        return lambda td: tuple(f(td.get(sk)) for _, sk, f in subs)
    if isinstance(space, spaces.Text):
        raise TypeError(
            f"GymWrapper: Text action spaces are not supported ({space!r} at {key!r})"
        )
    shape = spec.shape
    dtype = spec.dtype
    check = owner is not None

    def bad(a: Any) -> ValueError:
        return ValueError(
            f"GymWrapper.step: the action {key!r} has shape {list(getattr(a, 'shape', []))}, "
            f"the action spec {type(spec).__name__} (for the Gymnasium space {space!r}) has shape "
            f"{list(shape)}"
        )

    def refuse(a: Tensor) -> None:
        """Raises the InvalidActionError of ``a`` if its values are not in the spec."""
        reason = action_problem(spec, a)
        if reason is not None:
            raise invalid_action(owner, key, spec, a, reason)

    if not to_numpy:
        def conv_raw(a: Tensor) -> Tensor:
            if a.shape != shape:
                raise bad(a)
            if check:
                refuse(a)
            return a
        return conv_raw
    start = _start_of(space)
    unmasked = getattr(spec, "mask", None) is None
    if isinstance(spec, OneHot):
        if vector or not unmasked:
            def conv_oh_vec(a: Tensor) -> np.ndarray:
                if a.shape != shape:
                    raise bad(a)
                if check:
                    refuse(a)
                return _to_numpy(a).argmax(-1) + start
            return conv_oh_vec

        values = _discrete_values(space)
        n = len(values)

        def conv_oh(a: Tensor) -> np.integer:
            v = a.tolist()  # cheaper than .numpy().argmax() for one small vector
            if type(v) is not list or len(v) != n or type(v[0]) is list:  # shape != [n]
                raise bad(a)
            if check and (v.count(1) != 1 or v.count(0) != n - 1):  # True == 1, 1.0 == 1
                refuse(a)
            return values[v.index(max(v))]
        return conv_oh
    if isinstance(spec, Categorical) and not vector and not shape and unmasked:
        by_index = dict(enumerate(_discrete_values(space)))

        def conv_cat(a: Tensor) -> Any:
            if a.shape != shape:
                raise bad(a)
            x = a.item()
            v = by_index.get(x)  # hash(1.0) == hash(True) == hash(1): same as int(x)
            if v is not None:
                return v
            if check:
                refuse(a)
            return int(x) + start  # out of range, unchecked: Gymnasium raises
        return conv_cat
    if isinstance(spec, MultiOneHot):
        def conv_moh(a: Tensor) -> np.ndarray:
            if a.shape != shape:
                raise bad(a)
            if check:
                refuse(a)
            return spec.to_numpy(a) + start
        return conv_moh
    has_start = isinstance(start, np.ndarray) or start != 0
    np_dtype = getattr(space, "dtype", None)

    def conv(a: Tensor) -> np.ndarray:
        if a.shape != shape:
            raise bad(a)
        if check:
            refuse(a)
        if a.dtype is not dtype:
            a = a.to(dtype)
        out = _to_numpy(a)
        return out + start if has_start else out

    if np_dtype is not None and has_start:
        return lambda a: conv(a).astype(np_dtype, copy=False)
    return conv


def _as_tuple(key: Any) -> tuple:
    return (key,) if isinstance(key, str) else tuple(key)


# ---------------------------------------------------------------------- the wrapper
class GymWrapper(EnvBase):
    """A Gymnasium env (or vector env) as a steersman env (TensorDicts in and out).

    Args:
        env: a ``gymnasium.Env`` (batch size ``[]``) or a ``gymnasium.vector.VectorEnv``
            (batch size ``[num_envs]``; every autoreset mode is supported, see the module
            docstring).
        categorical_action_encoding: ``Discrete`` spaces as index specs
            (:class:`Categorical`) instead of one-hot ones (:class:`OneHot`, TorchRL's
            default). Applies to observations too.
        from_pixels: add the frames of ``env.render()`` under ``"pixels"`` (uint8
            ``[*batch, H, W, C]``); needs ``render_mode="rgb_array"``.
        pixels_only: with ``from_pixels``, drop the env's own observations.
        frame_skip: repeat each action this many times (single envs), summing the
            rewards and stopping at the end of an episode. For vector envs use
            :class:`GymEnv` (which wraps each sub-env) or a Gymnasium wrapper.
        device: where the output tensors live.
        batch_size: optional check: must be ``[]`` (env) or ``[num_envs]`` (vector env).
        convert_actions_to_numpy: pass numpy actions to Gymnasium (else the tensors).
        auto_reset: stepping a (sub-)env that finished at the previous step without a
            reset in between resets it first (the default; ``rollout(...,
            break_when_all_done=True)`` does this and discards those steps); with False
            such a step raises an error. Either way Gymnasium's next-step autoreset
            (the step that ignores its action) is never sent, except by a vector env
            without partial resets, whose finished sub-envs are then reset by
            Gymnasium within that step.
        check: refuse actions outside the action spec (default True; ``env.check``)
            with an :class:`~steersman.envs.InvalidActionError` naming the env, the key,
            the spec and the values, before anything reaches Gymnasium: a ``Discrete``
            index outside ``[0, n)`` (or a vector that is not one-hot), ``MultiDiscrete``
            / ``MultiBinary`` values outside the space, NaN in a ``Box`` action. ``Box``
            values outside the bounds are passed on, as in TorchRL: Gymnasium's envs
            clip them (Pendulum, MountainCarContinuous, Box2D) or apply them (MuJoCo);
            ``step(td, check=True)`` or ``spec.project`` enforce the bounds. The checks
            cost a few list operations per step (a single one-hot or index action) or
            one reduction.

    Observation keys: ``"observation"`` (``Dict`` spaces: their keys), plus ``"pixels"``.
    Seeding: ``set_seed(s)`` seeds the next reset: ``env.reset(seed=s)`` for a single
    env, ``seed=[s, s+1, ...]`` for the sub-envs of a vector env (Gymnasium's
    convention); ``reset(seed=s)`` does the same at once.

    The step checks the action's shape and values (``check``); ``env.step(td,
    check=True)`` also checks dtypes and bounds. Outputs are fresh tensors at every step
    (written into preallocated memory, never reused). Gymnasium's ``info`` dicts are read
    only by the readers of :meth:`set_info_dict_reader`.
    ``env.env`` is the wrapped Gymnasium env, ``env.render()`` its ``render()``,
    ``env.autoreset_mode`` the vector env's autoreset mode.

    Example:
        >>> import gymnasium as gym
        >>> import torch
        >>> from steersman.envs import check_env_specs
        >>> from steersman.envs.libs import GymWrapper
        >>> env = GymWrapper(gym.make("CartPole-v1"))
        >>> env.batch_size, env.action_spec.shape, env.observation_spec["observation"].shape
        (torch.Size([]), torch.Size([2]), torch.Size([4]))
        >>> check_env_specs(env, seed=0)
        >>> td = env.reset(seed=0)
        >>> td["action"] = torch.tensor([False, True])      # one-hot: push right
        >>> out = env.step(td)
        >>> out["next", "reward"], out["next", "terminated"]
        (tensor([1.]), tensor([False]))
        >>> env.rollout(10).batch_size                          # [time]
        torch.Size([10])
        >>> venv = GymWrapper(gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync"))
        >>> venv.rollout(5, break_when_any_done=False).batch_size   # [num_envs, time]
        torch.Size([3, 5])
    """

    #: ``_reset`` returns the entries of the sub-envs a partial reset leaves alone
    _handles_partial_reset = True

    def __init__(
        self,
        env: gymnasium.Env | gymnasium.vector.VectorEnv,
        categorical_action_encoding: bool = False,
        from_pixels: bool = False,
        pixels_only: bool = True,
        frame_skip: int | None = None,
        device: Any = "cpu",
        batch_size: Any = None,
        convert_actions_to_numpy: bool = True,
        auto_reset: bool = True,
        check: bool = True,
    ) -> None:
        gym = _import_gymnasium()
        is_vec = isinstance(env, gym.vector.VectorEnv)
        if not is_vec and not isinstance(env, gym.Env):
            raise TypeError(
                f"GymWrapper wraps a gymnasium.Env or gymnasium.vector.VectorEnv, got "
                f"{type(env).__name__}; to create one by id use GymEnv('CartPole-v1')"
            )
        self._env = env
        self._is_vec = is_vec
        inferred = torch.Size((int(env.num_envs),)) if is_vec else torch.Size(())
        if batch_size is not None:
            given = torch.Size((batch_size,) if isinstance(batch_size, int) else tuple(batch_size))
            if given != inferred:
                what = f"a vector env of {env.num_envs} sub-envs" if is_vec else "a single env"
                raise ValueError(
                    f"GymWrapper: batch_size={list(given)} does not match the wrapped env "
                    f"({what}: batch size {list(inferred)})"
                )
        super().__init__(device=device, batch_size=inferred, check=check)
        self.categorical_action_encoding = bool(categorical_action_encoding)
        self.from_pixels = bool(from_pixels)
        self.pixels_only = bool(pixels_only)
        self.convert_actions_to_numpy = bool(convert_actions_to_numpy)
        self.auto_reset = bool(auto_reset)
        if frame_skip is not None and int(frame_skip) < 1:
            raise ValueError(f"GymWrapper: frame_skip must be >= 1, got {frame_skip}")
        self.frame_skip = 1 if frame_skip is None else int(frame_skip)
        if is_vec and self.frame_skip > 1:
            raise ValueError(
                "GymWrapper: frame_skip on a vector env would keep stepping sub-envs whose "
                "episode ended; create it with GymEnv(id, num_envs=n, frame_skip=k) (each "
                "sub-env skips frames itself) or wrap the sub-envs with a frame-skip wrapper"
            )
        # autoreset mode and partial-reset support
        self._mode = "single"
        self._mask_reset = False
        if is_vec:
            mode = env.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
            mode = gym.vector.AutoresetMode(mode) if not isinstance(mode, gym.vector.AutoresetMode) else mode
            self._mode = {
                gym.vector.AutoresetMode.NEXT_STEP: "next_step",
                gym.vector.AutoresetMode.SAME_STEP: "same_step",
                gym.vector.AutoresetMode.DISABLED: "disabled",
            }[mode]
            base = env.unwrapped
            self._mask_reset = (
                self._mode == "disabled"
                or isinstance(base, (gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv))
                or bool(getattr(base, "supports_reset_mask", False))
            )
        if self.from_pixels:
            if getattr(env, "render_mode", None) != "rgb_array":
                raise ValueError(
                    f"GymWrapper(from_pixels=True) needs an env made with render_mode='rgb_array', "
                    f"this one has render_mode={getattr(env, 'render_mode', None)!r} "
                    "(GymEnv(id, from_pixels=True) sets it)"
                )
            if self._mode == "same_step":
                raise ValueError(
                    "GymWrapper(from_pixels=True) cannot wrap a SAME_STEP vector env: the frame "
                    "rendered at an episode end already shows the next episode; use the "
                    "NEXT_STEP (default) or DISABLED autoreset mode"
                )
        n = int(env.num_envs) if is_vec else 0
        self._n = n
        self._pending = np.zeros(max(n, 1), dtype=np.bool_)
        self._pending_any = False
        self._seed: int | None = None
        self._same_step_cache: list[Tensor] | None = None
        self._info_readers: list = []
        self._make_specs()

    # ------------------------------------------------------------------ specs
    @property
    def env(self) -> Any:
        """The wrapped Gymnasium env."""
        return self._env

    @property
    def autoreset_mode(self) -> str:
        """``"single"`` for a single env, else the vector env's ``"next_step"``,
        ``"same_step"`` or ``"disabled"``."""
        return self._mode

    def _make_specs(self) -> None:
        env = self._env
        bs = tuple(self.batch_size)
        dev = self.device
        cae = self.categorical_action_encoding
        obs_space = env.single_observation_space if self._is_vec else env.observation_space
        act_space = env.single_action_space if self._is_vec else env.action_space
        gym = _import_gymnasium()
        # observations
        leaves: list[_Leaf] = []
        obs_spec = Composite(shape=bs, device=dev)
        if not (self.from_pixels and self.pixels_only):
            ospec = space_to_spec(obs_space, categorical_action_encoding=cae, batch_size=bs,
                                  device=dev, name="observation")
            if isinstance(obs_space, gym.spaces.Dict):
                if self.from_pixels and "pixels" in obs_space.spaces:
                    raise ValueError(
                        "GymWrapper(from_pixels=True, pixels_only=False): the observation space "
                        "already has a 'pixels' key"
                    )
                obs_spec = ospec
                _obs_leaves(obs_space, ospec, (), (), bs, leaves)
            else:
                obs_spec.set("observation", ospec)
                _obs_leaves(obs_space, ospec, ("observation",), (), bs, leaves)
        self._pixel_leaf: _Leaf | None = None
        if self.from_pixels:
            frame = self._render_frames(reset=True)
            pspec = Bounded(0, 255, shape=(*bs, *frame.shape[len(bs):]), dtype=torch.uint8, device=dev)
            obs_spec.set("pixels", pspec)
            self._pixel_leaf = _Leaf(("pixels",), (), "assign", pspec, tuple(pspec.shape),
                                     tuple(pspec.shape), torch.uint8)
            leaves.append(self._pixel_leaf)
        self._obs_leaves = leaves
        self.observation_spec = obs_spec
        # actions
        aspec = space_to_spec(act_space, categorical_action_encoding=cae, batch_size=bs,
                              device=dev, name="action")
        self.action_spec = aspec if not isinstance(aspec, Composite) else Composite(
            action=aspec, shape=bs, device=dev
        )
        self._act_conv_checked = _action_converter(act_space, aspec, "action", self._is_vec,
                                                   self.convert_actions_to_numpy, self)
        self._act_conv_unchecked = _action_converter(act_space, aspec, "action", self._is_vec,
                                                     self.convert_actions_to_numpy)
        self._act_composite = isinstance(aspec, Composite)
        self.reward_spec = Unbounded(shape=(*bs, 1), device=dev, dtype=torch.float32)
        # preallocated rows: obs leaves (not "encode"), then reward, done, terminated, truncated
        rows: list[tuple[tuple, tuple, torch.dtype]] = []
        for leaf in leaves:
            if leaf.kind != "encode":
                leaf.slot = len(rows)
                rows.append((leaf.tshape, leaf.nshape, leaf.dtype))
        flag_shape = (*bs, 1)
        self._slot_reward = len(rows)
        rows.append((flag_shape, bs, torch.float32))
        self._slot_flags = len(rows)
        for _ in range(3):
            rows.append((flag_shape, bs, torch.bool))
        self._rows = _Rows(rows)
        # output layout
        self._flat = all(len(leaf.key) == 1 for leaf in leaves)
        self._fast_single_leaf = (
            len(leaves) == 1 and self._flat and leaves[0].kind == "assign" and leaves[0].path == ()
            and self._pixel_leaf is None
        )
        self._fast_layout = (
            self._fast_single_leaf and not self._is_vec and self.frame_skip == 1
            and leaves[0].slot == 0 and self._slot_reward == 1 and self._slot_flags == 2
        )
        self._device_paths()
        self._obs_name = leaves[0].key[0] if leaves else "observation"
        self._std_root_keys = frozenset(
            [leaf.key[0] for leaf in leaves] + ["done", "terminated", "truncated", "action", "next"]
        )

    def _device_paths(self) -> None:
        """CPU envs build their outputs in place; others move them to the device."""
        self._cpu = self.device.type == "cpu"
        # the fast path: rows 0..4 are observation, reward, done, terminated, truncated
        self._fast = self._fast_layout and self._cpu and not getattr(self, "_info_readers", None)

    def to(self, device: Any) -> GymWrapper:
        """Moves the specs and the outputs to ``device`` (Gymnasium itself stays on CPU)."""
        super().to(device)
        self._device_paths()
        return self

    # ------------------------------------------------------------------ helpers
    def _label(self) -> str:
        spec = getattr(self._env, "spec", None)
        env_id = getattr(spec, "id", None)
        return f"{type(self).__name__}({env_id!r})" if env_id else type(self).__name__

    def _action_guard(self, tensordict: TensorDictBase) -> None:
        """No-op: ``_step`` checks the action while converting it for Gymnasium."""

    def _render_frames(self, reset: bool = False) -> np.ndarray:
        env = self._env
        if reset:
            env.reset()
        frame = env.render()
        if self._is_vec:
            frame = np.stack(frame)
        if not isinstance(frame, np.ndarray) or frame.dtype != np.uint8:
            raise ValueError(
                f"GymWrapper(from_pixels=True): env.render() returned {type(frame).__name__} "
                f"{getattr(frame, 'dtype', '')}, expected a uint8 array (render_mode='rgb_array')"
            )
        return frame

    def _obs_values(self, obs: Any, i: int) -> list[Tensor | Any]:
        """Writes every observation leaf of ``obs`` into row ``i``; returns the outputs."""
        rows = self._rows
        if self._fast_single_leaf:
            slot = self._obs_leaves[0].slot
            rows.np[slot][i] = obs
            return [rows.t[slot][i]]
        out: list[Any] = []
        for leaf in self._obs_leaves:
            if leaf is self._pixel_leaf:
                rows.np[leaf.slot][i] = self._render_frames()
                out.append(rows.t[leaf.slot][i])
                continue
            val = leaf.extract(obs)
            if leaf.kind == "encode":
                if isinstance(leaf.spec, NonTensor):
                    out.append(leaf.spec.encode(val))
                else:
                    out.append(leaf.spec.encode(np.asarray(val) - leaf.start, ignore_device=True))
                continue
            rows.np[leaf.slot][i] = leaf.np_value(val)
            out.append(rows.t[leaf.slot][i])
        return out

    def _pack(self, obs_vals: list[Any], extra: dict[str, Tensor]) -> TensorDict:
        bs = self.batch_size
        if self._flat:
            src = {leaf.key[0]: v for leaf, v in zip(self._obs_leaves, obs_vals)}
            src.update(extra)
            td = TensorDict.from_trusted(src, bs, self.device if self._cpu else None)
        else:
            src = dict(extra)
            for leaf, v in zip(self._obs_leaves, obs_vals):
                d = src
                for k in leaf.key[:-1]:
                    d = d.setdefault(k, {})
                d[leaf.key[-1]] = v
            td = TensorDict.from_trusted(_nest(src, bs), bs, self.device if self._cpu else None)
        if not self._cpu:
            td = td.to(self.device, non_blocking=True)
        return td

    def _flag_values(self, i: int, done: Any, term: Any, trunc: Any) -> dict[str, Tensor]:
        rows = self._rows
        s = self._slot_flags
        n, t = rows.np, rows.t
        n[s][i] = done
        n[s + 1][i] = term
        n[s + 2][i] = trunc
        return {"done": t[s][i], "terminated": t[s + 1][i], "truncated": t[s + 2][i]}

    # ------------------------------------------------------------------ seeding
    def _set_seed(self, seed: int | None) -> None:
        self._seed = None if seed is None else int(seed)

    def _seed_arg(self, seed: Any) -> Any:
        if seed is None:
            seed, self._seed = self._seed, None
        if seed is None or not self._is_vec or not isinstance(seed, int):
            return seed
        return [seed + i for i in range(self._n)]

    # ------------------------------------------------------------------ reset
    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        seed = kwargs.pop("seed", None)
        options = kwargs.pop("options", None)
        if kwargs:
            raise TypeError(f"GymWrapper.reset got unexpected arguments {sorted(kwargs)}")
        mask = self._reset_mask(tensordict)
        if mask is not None:
            m = mask.reshape(-1).cpu().numpy()
            if not m.any():
                return TensorDict.from_trusted({}, self.batch_size, None)
            if self._is_vec and not m.all() or self._mode == "same_step":
                return self._partial_reset(tensordict, m, seed, options)
        obs, info = self._env.reset(seed=self._seed_arg(seed), options=options)
        self._pending[:] = False
        self._pending_any = False
        self._same_step_cache = None
        i = self._rows.next_row()
        vals = self._obs_values(obs, i)
        out = self._pack(vals, self._flag_values(i, False, False, False))
        if self._info_readers:
            self._read_info(info, out)
        return out

    def _partial_reset(self, tensordict: TensorDictBase, m: np.ndarray, seed: Any,
                       options: Any) -> TensorDictBase:
        """Resets the sub-envs flagged in ``m``; the others keep their entries of ``tensordict``.

        The merge is done in numpy, into the new output rows (``_handles_partial_reset``).
        """
        cached = m & self._pending if self._mode == "same_step" else np.zeros_like(m)
        need = m & ~cached
        gym_obs = None
        reset_info: Any = {}
        if need.any():
            if not self._mask_reset:
                raise RuntimeError(
                    f"GymWrapper: this vector env ({type(self._env.unwrapped).__name__}, autoreset "
                    f"mode {self._mode}) cannot reset some sub-envs only (no "
                    "reset(options={'reset_mask': ...}) support), so finished sub-envs cannot be "
                    "reset without a junk step. Use gymnasium.make_vec(..., "
                    "vectorization_mode='sync' or 'async') (GymEnv's default), or roll out with "
                    "break_when_any_done=True (full resets only)"
                )
            opts = dict(options or {})
            opts["reset_mask"] = need
            gym_obs, reset_info = self._env.reset(seed=self._seed_arg(seed), options=opts)
        keep = ~m
        any_keep = bool(keep.any())
        any_cached = bool(cached.any())
        cache = self._same_step_cache
        rows = self._rows
        i = rows.next_row()
        vals: list[Any] = []
        for j, leaf in enumerate(self._obs_leaves):
            cur = tensordict.get(leaf.key, None)
            if cur is not None and not isinstance(cur, Tensor):
                cur = None
            if leaf is self._pixel_leaf:
                new_val: Any = self._render_frames()
            elif gym_obs is not None:
                new_val = leaf.extract(gym_obs)
            else:
                new_val = None
            if leaf.kind == "encode":  # rare kinds: merge as tensors
                parts = []
                if new_val is not None:
                    parts.append((need, leaf.spec.encode(np.asarray(new_val) - leaf.start,
                                                          ignore_device=True)))
                if any_cached:
                    parts.append((cached, cache[j]))
                if cur is not None and any_keep:
                    parts.append((keep, cur.cpu()))
                out = parts[0][1].clone()
                for sel, v in parts[1:]:
                    out = _where_rows(torch.as_tensor(sel), v, out)
                vals.append(out)
                continue
            dst = rows.np[leaf.slot][i]
            if new_val is not None:
                dst[...] = leaf.np_value(new_val)
            if any_cached:
                dst[cached] = cache[j].numpy()[cached]
            if cur is not None and any_keep:
                dst[keep] = cur.detach().cpu().numpy()[keep]
            vals.append(rows.t[leaf.slot][i])
        flags = []
        for key in ("done", "terminated", "truncated"):
            cur = tensordict.get(key, None)
            if any_keep and isinstance(cur, Tensor):
                flags.append(cur.detach().cpu().numpy().reshape(-1) & keep)
            else:
                flags.append(False)
        self._pending &= keep
        self._pending_any = bool(self._pending.any())
        out = self._pack(vals, self._flag_values(i, *flags))
        if self._info_readers:
            self._read_info(reset_info, out, keep=torch.as_tensor(keep), old=tensordict)
        return out

    # ------------------------------------------------------------------ step
    def _before_step(self) -> None:
        """Handles sub-envs stepped while finished (no reset since their episode ended)."""
        idx = np.flatnonzero(self._pending)
        if not self.auto_reset:
            which = "the env" if not self._is_vec else f"sub-envs {idx.tolist()}"
            raise RuntimeError(
                f"GymWrapper.step: {which} finished at the previous step and was not reset; "
                "reset it first (env.reset(td) with a '_reset' mask, or use "
                "step_and_maybe_reset / rollout), or create the wrapper with auto_reset=True"
            )
        if not self._is_vec:
            self._env.reset(seed=self._seed_arg(None))
        elif self._mode in ("next_step", "disabled") and self._mask_reset:
            self._env.reset(seed=self._seed_arg(None), options={"reset_mask": self._pending.copy()})
        # same_step: Gymnasium already reset them; next_step without partial resets:
        # Gymnasium resets them during this step (their action is ignored).
        self._pending[:] = False
        self._pending_any = False

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if type(tensordict) is TensorDict and not self._act_composite:
            a = tensordict.entries.get("action")
            if a is None:
                a = tensordict.get("action")
        else:
            a = tensordict.get("action")
        if self._fast:
            o, r, d, te, tr = self._fast_step(a)
            return TensorDict.from_trusted(
                {self._obs_name: o, "reward": r, "done": d, "terminated": te, "truncated": tr},
                self._batch_size, self._device,
            )
        action = (self._act_conv_checked if self.check else self._act_conv_unchecked)(a)
        if self._pending_any:
            self._before_step()
        env = self._env
        if self._is_vec:
            obs, rew, term, trunc, info = env.step(action)
            done = term | trunc
            any_done = bool(done.any())
            i = self._rows.next_row()
            vals = self._obs_values(obs, i)
            if any_done:
                self._pending = done
                self._pending_any = True
                if self._mode == "same_step":
                    self._same_step_final(vals, info, done, i)
        else:
            rew = 0.0
            for _ in range(self.frame_skip):
                obs, r, term, trunc, info = env.step(action)
                rew += r
                if term or trunc:
                    break
            done = term or trunc
            if done:
                self._pending_any = True
                self._pending[0] = True
            i = self._rows.next_row()
            vals = self._obs_values(obs, i)
        extra = self._flag_values(i, done, term, trunc)
        rows = self._rows
        rows.np[self._slot_reward][i] = rew
        extra["reward"] = rows.t[self._slot_reward][i]
        out = self._pack(vals, extra)
        if self._info_readers:
            self._read_info(info, out)
        return out

    # ------------------------------------------------------------------ info dicts
    def _read_info(self, info: Any, out: TensorDictBase, keep: Tensor | None = None,
                   old: TensorDictBase | None = None) -> None:
        info = info if isinstance(info, dict) else {}
        for reader in self._info_readers:
            res = reader(info, out)
            if res is not None and res is not out:
                out.update(res)
        if keep is not None and old is not None and bool(keep.any()):
            for reader in self._info_readers:
                spec = getattr(reader, "info_spec", None)
                for key in ([] if spec is None else spec.keys(True, True)):
                    prev = old.get(key, None)
                    if isinstance(prev, Tensor):
                        new = out.get(key)
                        m = keep.reshape(*keep.shape, *([1] * (new.ndim - keep.ndim)))
                        out.set(key, torch.where(m.to(new.device), prev.to(new.device), new))

    def set_info_dict_reader(self, info_dict_reader: Any = None, ignore_private: bool = True) -> GymWrapper:
        """Reads entries of Gymnasium's ``info`` dicts into the outputs (TorchRL's method).

        ``info_dict_reader``: a callable ``(info, td) -> td`` with an ``info_spec``
        (default: :class:`~steersman.envs.default_info_dict_reader` of every non-private
        key). A reader without a spec learns it from one reset and one random step (the
        env is reset then: call this before collecting). Its specs join the observation
        spec. Returns the env.
        """
        from ..gym_like import default_info_dict_reader

        if info_dict_reader is None:
            info_dict_reader = default_info_dict_reader(ignore_private=ignore_private)
        if not callable(info_dict_reader):
            raise TypeError(f"set_info_dict_reader takes a callable (info, td) -> td, got "
                            f"{type(info_dict_reader).__name__}")
        self._info_readers.append(info_dict_reader)
        self._device_paths()  # no fast path with info readers
        spec = getattr(info_dict_reader, "info_spec", None)
        if spec is None:
            self.rand_step(self.reset())
            spec = getattr(info_dict_reader, "info_spec", None)
        if spec is not None:
            obs = self.full_observation_spec.clone()
            obs.unlock_()
            for k, sp in spec.items(include_nested=True, leaves_only=True):
                if sp.shape[: len(self.batch_size)] != self.batch_size:
                    sp = sp.expand(*self.batch_size, *sp.shape)
                obs.set(k, sp.to(self.device))
            self.observation_spec = obs
        return self

    def auto_register_info_dict(self, ignore_private: bool = True, info_dict_reader: Any = None) -> GymWrapper:
        """Registers a reader of every info key (inferred from a reset and a step)."""
        return self.set_info_dict_reader(info_dict_reader, ignore_private=ignore_private)

    @property
    def info_dict_reader(self) -> list:
        """The registered info readers."""
        return self._info_readers

    # ------------------------------------------------------------------ the fast path
    # A single env with one array observation, on CPU (``self._fast``; the common case):
    # rows 0..4 of ``self._rows`` are observation, reward, done, terminated, truncated.
    def _fast_step(self, a: Tensor) -> tuple[Tensor, ...]:
        """Steps with the action tensor ``a``; returns the row of fresh output tensors
        ``(observation, reward, done, terminated, truncated)``."""
        # first: a bad action raises before anything changes
        action = (self._act_conv_checked if self.check else self._act_conv_unchecked)(a)
        if self._pending_any:
            self._before_step()
        obs, rew, term, trunc, _ = self._env.step(action)
        rows = self._rows
        i = rows.next_row()
        n = rows.np
        n[0][i] = obs
        n[1][i] = rew
        if term or trunc:  # the rows start as zeros (False): write the flags at an episode end only
            n[2][i] = True
            n[3][i] = term
            n[4][i] = trunc
            self._pending_any = True
            self._pending[0] = True
        return rows.by_row[i]

    def _fast_reset(self) -> tuple[Tensor, ...]:
        """``_reset(None)`` on the fast path: the row ``(observation, reward, done,
        terminated, truncated)``; the reward is unused, the flags are False."""
        obs, _ = self._env.reset(seed=self._seed_arg(None))
        self._pending[0] = False
        self._pending_any = False
        rows = self._rows
        i = rows.next_row()
        rows.np[0][i] = obs
        return rows.by_row[i]

    def _same_step_final(self, vals: list[Any], info: dict, done: np.ndarray, i: int) -> None:
        """SAME_STEP: keep the reset observations, put the final ones in the step output."""
        self._same_step_cache = [
            v.clone() if isinstance(v, Tensor) else v for v in vals
        ]
        final = info.get("final_obs")
        if final is None:
            raise RuntimeError(
                "GymWrapper: a SAME_STEP vector env ended an episode without info['final_obs']; "
                "the final observation would be lost"
            )
        rows = self._rows
        for e in np.flatnonzero(done):
            fo = final[e]
            for leaf, v in zip(self._obs_leaves, vals):
                val = leaf.extract(fo)
                if leaf.kind == "encode":
                    v[e] = leaf.spec[e].encode(np.asarray(val) - leaf.start, ignore_device=True)
                else:
                    rows.np[leaf.slot][i][e] = leaf.np_value(val)

    # ------------------------------------------------------------------ step_and_maybe_reset
    def step_and_maybe_reset(
        self, tensordict: TensorDictBase
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """Steps, then resets the finished (sub-)envs (see :meth:`EnvBase.step_and_maybe_reset`).

        Same result as the base class; the check for finished envs uses the flags
        Gymnasium returned (a Python bool) instead of reducing the done tensors, and
        ``step_mdp`` is inlined for the flat layout of Gymnasium envs.
        """
        if self._fast and type(tensordict) is TensorDict:
            root = tensordict.entries
            a = root.get("action")
            if a is not None and "next" not in root:
                # a single env: both outputs are built directly from the row of fresh tensors
                if self._is_closed:
                    self._assert_open()
                o, r, d, te, tr = self._fast_step(a)
                name = self._obs_name
                root["next"] = TensorDict.from_trusted(
                    {name: o, "reward": r, "done": d, "terminated": te, "truncated": tr},
                    self._batch_size, self._device,
                )
                if self._pending_any:  # the episode ended: the next input is the reset
                    o, _, d, te, tr = self._fast_reset()
                src = {name: o, "done": d, "terminated": te, "truncated": tr}
                if root.keys() != self._std_root_keys:
                    self._carry_root_entries(root, src)
                return tensordict, TensorDict.from_trusted(src, tensordict.batch_size, tensordict.device)
        if type(tensordict) is TensorDict and self._flat and self._cpu and "next" not in tensordict.entries:
            if self._is_closed:
                self._assert_open()
            root = tensordict.entries
            nxt = self._step(tensordict)
            root["next"] = nxt
            src = dict(nxt.entries)
            del src["reward"]
            if root.keys() != self._std_root_keys:
                self._carry_root_entries(root, src)
            td_ = TensorDict.from_trusted(src, tensordict.batch_size, tensordict.device)
        else:
            tensordict = self.step(tensordict)
            td_ = self._step_mdp(tensordict)
        if self._pending_any:
            if not self._is_vec and type(td_) is TensorDict:
                # a single env: the whole td is reset (td_ is a new TensorDict, not shared)
                td_.entries.update(self._reset(None).entries)
            else:
                td_ = td_.copy()
                td_.set("_reset", td_.get("done"))
                td_ = self.reset(td_)
        return tensordict, td_

    def _carry_root_entries(self, root: dict, src: dict) -> None:
        """``step_mdp``'s ``keep_other``: root entries other than the action, the reward
        and ``"next"`` (policy outputs, recurrent states ...) go to the next input."""
        excl = self._hot_plan()["excl_root"]
        for k, v in root.items():
            if k not in excl and k not in src:
                src[k] = v

    # ------------------------------------------------------------------ misc
    def render(self, *args: Any, **kwargs: Any) -> Any:
        """``env.render()`` of the wrapped Gymnasium env."""
        return self._env.render(*args, **kwargs)

    def _close(self) -> None:
        self._env.close()

    def __repr__(self) -> str:
        base = super().__repr__()
        inner = self._env if not self._is_vec else f"{type(self._env).__name__}(num_envs={self._n}, autoreset_mode={self._mode})"
        return base[:-1] + f",\n    env={inner})"


def _where_rows(sel: Tensor, a: Any, b: Any) -> Any:
    """``a`` for the sub-envs flagged in ``sel`` ([n] bool), ``b`` elsewhere."""
    if not isinstance(a, Tensor):
        return a
    m = sel.reshape(sel.shape[0], *([1] * (a.ndim - 1)))
    return torch.where(m, a, b)


def _nest(src: dict, bs: torch.Size) -> dict:
    return {
        k: TensorDict.from_trusted(_nest(v, bs), bs, None) if isinstance(v, dict) else v
        for k, v in src.items()
    }


# ---------------------------------------------------------------------- GymEnv
def _frame_skip_wrapper(k: int) -> Any:
    """A ``gymnasium.Wrapper`` repeating each action ``k`` times (for vector sub-envs)."""
    gym = _import_gymnasium()

    class FrameSkip(gym.Wrapper):
        def step(self, action: Any) -> tuple:
            total = 0.0
            for _ in range(k):
                obs, r, term, trunc, info = self.env.step(action)
                total += float(r)
                if term or trunc:
                    break
            return obs, total, term, trunc, info

    return FrameSkip


def _unknown_id(env_name: str, err: Exception) -> ValueError:
    gym = _import_gymnasium()
    ids = [str(k) for k in gym.envs.registry.keys()]
    close = difflib.get_close_matches(env_name, ids, n=3)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return ValueError(
        f"GymEnv: unknown Gymnasium env id {env_name!r} ({err}).{hint} List the registered "
        "ids with `sorted(gymnasium.envs.registry.keys())` (or `steersman envs`); ids of "
        "other suites are registered when their package is imported (e.g. `import ale_py` "
        "for 'ALE/...' ids)."
    )


class GymDependencyError(ImportError):
    """A Gymnasium env needs an optional dependency that is not installed (Gymnasium's
    ``DependencyNotInstalled``, e.g. Box2D for ``LunarLander-v3``); the message names the
    extra to install. An ``ImportError``: ``except ImportError`` catches it."""


def _missing_dependency(env_name: str, err: Exception) -> GymDependencyError:
    gym = _import_gymnasium()
    try:
        entry = str(gym.spec(env_name).entry_point)
    except Exception:  # noqa: BLE001 - the id resolved in make: only the hint is lost
        entry = ""
    # "gymnasium.envs.box2d.lunar_lander:LunarLander" -> the "box2d" extra
    parts = entry.split(":")[0].split(".")
    family = parts[2] if len(parts) > 2 and parts[:2] == ["gymnasium", "envs"] else None
    hint = f'pip install "gymnasium[{family}]"' if family else ""
    tail = f" (install it with: {hint})" if hint and hint not in str(err) else ""
    return GymDependencyError(
        f"GymEnv({env_name!r}): the env needs an optional dependency that is not installed: {err}{tail}"
    )


def _register_ale(gym: Any, env_name: str) -> None:
    """``ALE/...`` ids are registered by importing ``ale_py`` (Gymnasium 1.x no longer does it
    itself): do it on first use, or say which extra is missing."""
    if not env_name.startswith("ALE/") or env_name in gym.registry:
        return
    try:
        import ale_py
    except ImportError as err:
        raise GymDependencyError(f"GymEnv({env_name!r}): Atari envs need ale-py: pip install 'steersman[atari]'"
                                 ) from err
    gym.register_envs(ale_py)


class GymEnv(GymWrapper):
    """A Gymnasium env created by id (``gymnasium.make``), or ``num_envs`` of them as one
    batched env (``gymnasium.make_vec``).

    Args:
        env_name: a registered Gymnasium id (``"CartPole-v1"``). Unknown ids raise a
            ``ValueError`` saying how to list the ids; an env whose optional dependency
            is missing (``"LunarLander-v3"`` without Box2D) raises a
            :class:`GymDependencyError` (an ``ImportError``) naming the extra to install
            (``pip install "gymnasium[box2d]"``).
        num_envs: 0 (default): one env, batch size ``[]``. ``n > 0``: a Gymnasium vector
            env of ``n`` sub-envs, batch size ``[n]``.
        vectorization_mode: ``"sync"`` (default: partial resets work in every autoreset
            mode), ``"async"`` (one process per sub-env) or ``"vector_entry_point"`` (the
            env's own vectorized implementation, if any; those usually cannot reset some
            sub-envs only, see :class:`GymWrapper`).
        vector_kwargs: passed to the vector env, e.g. ``{"autoreset_mode":
            gymnasium.vector.AutoresetMode.SAME_STEP}``.
        frame_skip: repeat each action this many times (with ``num_envs``, every sub-env
            is wrapped to do so).
        **kwargs: :class:`GymWrapper` arguments (``categorical_action_encoding``,
            ``from_pixels``, ``pixels_only``, ``device``, ``batch_size``,
            ``convert_actions_to_numpy``, ``auto_reset``, ``check``); the others go to
            ``gymnasium.make`` / ``make_vec`` (``max_episode_steps``, ``render_mode``,
            env arguments). ``from_pixels=True`` sets ``render_mode="rgb_array"``.

    Example:
        >>> from steersman.envs.libs import GymEnv
        >>> env = GymEnv("Pendulum-v1")
        >>> _ = env.set_seed(0)      # returns the seed for the next env
        >>> td = env.rollout(5)
        >>> td["next", "observation"].shape, td["next", "observation"].dtype, td["action"].shape
        (torch.Size([5, 3]), torch.float32, torch.Size([5, 1]))
        >>> venv = GymEnv("CartPole-v1", num_envs=4, categorical_action_encoding=True)
        >>> venv.batch_size, venv.action_spec
        (torch.Size([4]), Categorical(shape=[4], n=2, device=cpu, dtype=torch.int64, domain=discrete))
        >>> venv.rollout(3).batch_size
        torch.Size([4, 3])
        >>> GymEnv("CartPol-v1")
        Traceback (most recent call last):
        ...
        ValueError: GymEnv: unknown Gymnasium env id 'CartPol-v1' ...
    """

    _WRAPPER_KEYS = (
        "categorical_action_encoding", "from_pixels", "pixels_only", "device", "batch_size",
        "convert_actions_to_numpy", "auto_reset", "check",
    )

    def __init__(
        self,
        env_name: str,
        *,
        num_envs: int = 0,
        vectorization_mode: str = "sync",
        vector_kwargs: dict | None = None,
        frame_skip: int | None = None,
        **kwargs: Any,
    ) -> None:
        gym = _import_gymnasium()
        wrapper_kwargs = {k: kwargs.pop(k) for k in self._WRAPPER_KEYS if k in kwargs}
        if wrapper_kwargs.get("from_pixels", False):
            rm = kwargs.setdefault("render_mode", "rgb_array")
            if rm != "rgb_array":
                raise ValueError(
                    f"GymEnv(from_pixels=True) renders with render_mode='rgb_array', got render_mode={rm!r}"
                )
        if frame_skip is not None and int(frame_skip) < 1:
            raise ValueError(f"GymEnv: frame_skip must be >= 1, got {frame_skip}")
        self.env_name = env_name
        self.num_envs = int(num_envs)
        _register_ale(gym, env_name)
        try:
            if self.num_envs > 0:
                wrappers = None
                if frame_skip is not None and int(frame_skip) > 1:
                    if vectorization_mode not in ("sync", "async"):
                        raise ValueError(
                            "GymEnv(num_envs>0, frame_skip>1) needs vectorization_mode 'sync' or 'async'"
                        )
                    wrappers = [_frame_skip_wrapper(int(frame_skip))]
                env = gym.make_vec(
                    env_name, num_envs=self.num_envs, vectorization_mode=vectorization_mode,
                    vector_kwargs=vector_kwargs, wrappers=wrappers, **kwargs,
                )
                frame_skip = None
            else:
                if vector_kwargs:
                    raise ValueError("GymEnv: vector_kwargs needs num_envs > 0")
                env = gym.make(env_name, **kwargs)
        except gym.error.UnregisteredEnv as err:
            raise _unknown_id(env_name, err) from err
        except gym.error.DependencyNotInstalled as err:
            raise _missing_dependency(env_name, err) from err
        try:
            super().__init__(env, frame_skip=frame_skip, **wrapper_kwargs)
        except BaseException:
            env.close()
            raise

    @staticmethod
    def available_envs() -> list[str]:
        """The registered Gymnasium ids (``sorted(gymnasium.envs.registry.keys())``)."""
        gym = _import_gymnasium()
        return sorted(str(k) for k in gym.envs.registry.keys())
