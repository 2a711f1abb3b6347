"""``EnvCreator``: a picklable env factory that knows its env's specs without keeping one."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from steersman.data import Composite

from ..common import EnvBase
from ._buffers import SPEC_NAMES

__all__ = ["EnvCreator", "EnvMetaData", "get_env_metadata"]


class EnvMetaData:
    """What a batched env needs to know about its sub-env: specs, batch size, device.

    Args (positional, as built here; or TorchRL's keywords):
        specs: the ``full_*_spec`` Composites by name (observation, action, state,
            reward, done), each of shape ``batch_size``; or TorchRL's ``env.specs``
            (a Composite holding ``output_spec`` and ``input_spec``), split by name.
        batch_size: the sub-env's batch size.
        device: the sub-env's device.
        env_type: the sub-env's class name (for messages; default: from ``env_str``).

    Keyword Args:
        tensordict: a TensorDict shaped as the env's data (TorchRL: ``fake_tensordict()``
            with the ``"_reset"`` entries); default: built from the specs on first access.
        env_str: the env's ``str`` (default ``env_type + "()"``).
        batch_locked: whether the env only takes data of its own batch size
            (default ``True``).
        device_map: ``{key: device}`` of the tensordict's leaves (default: every leaf of
            the tensordict on ``device``).
        supports_set_state: whether the env can restore a saved state (default ``False``).

    Attributes: the arguments above, by the same names (``specs`` as the dict of
    ``full_*_spec``).

    Example:
        >>> from steersman.envs import CartPoleEnv
        >>> from steersman.envs.batched import EnvMetaData
        >>> a = EnvMetaData.from_env(CartPoleEnv())
        >>> b = EnvMetaData.from_env(CartPoleEnv(batch_size=[2]))
        >>> a.mismatch(a) is None, a.mismatch(b)
        (True, 'batch_size [2] instead of []')
        >>> a.batch_locked, a.env_str.startswith("CartPoleEnv("), sorted(a.tensordict.keys())[:2]
        (True, True, ['_reset', 'action'])
    """

    __slots__ = ("specs", "batch_size", "device", "env_type", "env_str", "batch_locked",
                 "_device_map", "supports_set_state", "_tensordict")

    def __init__(self, specs: dict[str, Composite] | Composite, batch_size: torch.Size = (),
                 device: torch.device | str | None = None, env_type: str | None = None, *,
                 tensordict: Any = None, env_str: str | None = None, batch_locked: bool = True,
                 device_map: dict | None = None, supports_set_state: bool = False) -> None:
        self.specs = _spec_dict(specs)
        self.batch_size = torch.Size(batch_size)
        self.device = torch.device("cpu" if device is None else device)
        if env_type is None:
            env_type = env_str.split("(")[0].strip() if env_str else "EnvBase"
        self.env_type = env_type
        self.env_str = f"{env_type}()" if env_str is None else str(env_str)
        self.batch_locked = bool(batch_locked)
        self.supports_set_state = bool(supports_set_state)
        self._tensordict = tensordict
        self._device_map = None if device_map is None else dict(device_map)

    @classmethod
    def from_env(cls, env: EnvBase) -> EnvMetaData:
        specs = {name: getattr(env, name).clone() for name in SPEC_NAMES}
        try:
            env_str = str(env)
        except Exception:  # noqa: BLE001 - a repr that fails is not worth a crash
            env_str = f"{type(env).__name__}()"
        return cls(specs, env.batch_size, env.device, type(env).__name__, env_str=env_str,
                   batch_locked=env.batch_locked,
                   supports_set_state=bool(getattr(env, "_supports_set_state", False)))

    #: TorchRL's name of :meth:`from_env`.
    metadata_from_env = from_env

    @property
    def tensordict(self) -> Any:
        """A TensorDict of zeros shaped as the env's data: the specs' ``zero()`` values of
        the root and ``"next"`` entries, and a ``"_reset"`` flag per done entry."""
        if self._tensordict is None:
            self._tensordict = _fake_td(self.specs, self.batch_size)
        return self._tensordict

    @tensordict.setter
    def tensordict(self, value: Any) -> None:
        self._tensordict = value

    @property
    def device_map(self) -> dict:
        """``{key: device}`` of the tensordict's leaves (default: all on ``device``)."""
        if self._device_map is None:
            keys = self.tensordict.keys(include_nested=True, leaves_only=True)
            self._device_map = {k: self.device for k in keys}
        return self._device_map

    @device_map.setter
    def device_map(self, value: dict) -> None:
        self._device_map = dict(value)

    def __getstate__(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}

    def __setstate__(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)

    def clone(self) -> EnvMetaData:
        """A copy that shares no spec or tensor with this one."""
        dm = self._device_map
        return EnvMetaData({k: v.clone() for k, v in self.specs.items()}, self.batch_size, self.device,
                           self.env_type, env_str=self.env_str, batch_locked=self.batch_locked,
                           device_map=dm, supports_set_state=self.supports_set_state,
                           tensordict=None if self._tensordict is None else self._tensordict.clone())

    def mismatch(self, other: EnvMetaData) -> str | None:
        """A sentence naming the first difference with ``other`` (None if they agree)."""
        if self.batch_size != other.batch_size:
            return f"batch_size {list(other.batch_size)} instead of {list(self.batch_size)}"
        for name in SPEC_NAMES:
            a, b = self.specs[name], other.specs[name]
            if a == b:
                continue
            what = name.replace("full_", "")
            ka = set(a.keys(include_nested=True, leaves_only=True))
            kb = set(b.keys(include_nested=True, leaves_only=True))
            if ka != kb:
                return (f"{what} has the keys {sorted(map(str, kb))} instead of "
                        f"{sorted(map(str, ka))}")
            for key in sorted(ka, key=str):
                if a[key] != b[key]:
                    return f"{what}[{key!r}] is {b[key]!r} instead of {a[key]!r}"
            return f"{what} is {b!r} instead of {a!r}"
        return None

    def __repr__(self) -> str:
        return (f"EnvMetaData(env_type={self.env_type}, batch_size={list(self.batch_size)}, "
                f"device={self.device}, batch_locked={self.batch_locked})")


def _spec_dict(specs: Any) -> dict[str, Composite]:
    """The ``full_*_spec`` dict from itself, or from TorchRL's ``env.specs`` Composite."""
    if isinstance(specs, dict):
        missing = [n for n in SPEC_NAMES if n not in specs]
        if missing:
            raise KeyError(f"EnvMetaData: specs lacks {missing} (it needs {list(SPEC_NAMES)})")
        return specs
    if isinstance(specs, Composite):
        out = {}
        for name in SPEC_NAMES:
            parent = "input_spec" if name in ("full_action_spec", "full_state_spec") else "output_spec"
            for key in ((parent, name), name):
                try:
                    out[name] = specs[key]
                    break
                except KeyError:
                    continue
            else:
                raise KeyError(
                    f"EnvMetaData: the specs Composite has no {name!r} (under {parent!r} or at the "
                    f"root); it holds {sorted(map(str, specs.keys(True)))}"
                )
        return out
    raise TypeError(
        f"EnvMetaData: specs must be a dict of the full_*_spec Composites or env.specs, got "
        f"{type(specs).__name__}"
    )


def _fake_td(specs: dict[str, Composite], batch_size: torch.Size) -> Any:
    from steersman.tensordict import TensorDict  # noqa: PLC0415 (only when asked)

    root = TensorDict(batch_size=batch_size)
    for name in ("full_observation_spec", "full_action_spec", "full_state_spec"):
        root.update(specs[name].zero())
    nxt = TensorDict(batch_size=batch_size)
    for name in ("full_observation_spec", "full_reward_spec", "full_done_spec"):
        nxt.update(specs[name].zero())
    done = specs["full_done_spec"].zero()
    root.update(done)
    for key in done.keys(include_nested=True, leaves_only=True):
        reset = key[:-1] + ("_reset",) if isinstance(key, tuple) else "_reset"
        root.set(reset, done.get(key).clone())
    root.set("next", nxt)
    return root


def _fn_name(fn: Any) -> str:
    if isinstance(fn, functools.partial):
        return f"functools.partial({_fn_name(fn.func)}, ...)"
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if name is None:
        return repr(fn)
    mod = getattr(fn, "__module__", None)
    return f"{mod}.{name}" if mod and mod != "builtins" else name


def check_env_fn(create_env_fn: Any, owner: str) -> None:
    """Rejects what cannot create envs (an env instance, a non-callable) with a clear error."""
    if isinstance(create_env_fn, EnvBase):
        raise TypeError(
            f"{owner}: create_env_fn must be a callable that returns a new env, got an env instance "
            f"({type(create_env_fn).__name__}); pass its class or a function, e.g. "
            f"{owner}(2, {type(create_env_fn).__name__}) or "
            f"{owner}(2, functools.partial({type(create_env_fn).__name__}, ...))"
        )
    if not callable(create_env_fn):
        raise TypeError(
            f"{owner}: create_env_fn must be a callable returning an EnvBase, got "
            f"{type(create_env_fn).__name__}"
        )


class EnvCreator:
    """Wraps an env factory: ``creator()`` builds a new env, ``creator.meta_data`` its specs.

    The specs are read from a probe env built on first access to ``meta_data`` and
    closed right after, so the process that holds the creator (e.g. the parent of a
    :class:`~steersman.envs.ParallelEnv`) does not keep an env alive. The creator
    pickles as its function, its keyword arguments and the metadata (the worker pools
    use cloudpickle for functions the standard pickler refuses: lambdas, closures).

    Args:
        create_env_fn: a callable returning an :class:`~steersman.envs.EnvBase`
            (an env class, a function, a ``functools.partial`` ...), or an ``EnvCreator``.
        create_env_kwargs: keyword arguments passed to it on every call.

    Raises:
        TypeError: if ``create_env_fn`` is not callable (or is an env instance), or,
            on call, if it returns something that is not an ``EnvBase``.

    Example:
        >>> import functools
        >>> from steersman.envs import CartPoleEnv
        >>> from steersman.envs.batched import EnvCreator
        >>> creator = EnvCreator(CartPoleEnv, {"batch_size": [3]})
        >>> creator.meta_data.batch_size
        torch.Size([3])
        >>> sorted(creator.meta_data.specs["full_observation_spec"].keys())
        ['observation']
        >>> env = creator(seed=0)        # extra kwargs override create_env_kwargs
        >>> env.reset()["observation"].shape
        torch.Size([3, 4])
    """

    def __init__(self, create_env_fn: Callable[..., EnvBase] | EnvCreator,
                 create_env_kwargs: dict[str, Any] | None = None, share_memory: bool = True) -> None:
        # TorchRL's share_memory puts the probe env's tensors in shared memory for the
        # workers; here each worker builds its own env from the pickled factory, so the
        # flag is accepted and has no effect
        del share_memory
        if isinstance(create_env_fn, EnvCreator):
            kwargs = {**create_env_fn.create_env_kwargs, **(create_env_kwargs or {})}
            self._meta: EnvMetaData | None = create_env_fn._meta if not create_env_kwargs else None
            create_env_fn = create_env_fn.create_env_fn
        else:
            check_env_fn(create_env_fn, "EnvCreator")
            kwargs = dict(create_env_kwargs or {})
            self._meta = None
        if not isinstance(kwargs, dict):
            raise TypeError(f"EnvCreator: create_env_kwargs must be a dict, got {type(kwargs).__name__}")
        self.create_env_fn = create_env_fn
        self.create_env_kwargs = kwargs

    @property
    def name(self) -> str:
        """A readable name of the wrapped function (for messages)."""
        return _fn_name(self.create_env_fn)

    def __call__(self, **kwargs: Any) -> EnvBase:
        env = self.create_env_fn(**{**self.create_env_kwargs, **kwargs})
        if not isinstance(env, EnvBase):
            closer = getattr(env, "close", None)
            if callable(closer):
                try:
                    closer()
                except Exception:  # noqa: BLE001 - best effort on an object we reject
                    pass
            raise TypeError(
                f"create_env_fn {self.name} returned a {type(env).__module__}.{type(env).__qualname__}, "
                "not a steersman EnvBase; wrap it (e.g. GymWrapper(gym_env)) or return an EnvBase subclass"
            )
        return env

    @property
    def meta_data(self) -> EnvMetaData:
        """The specs, batch size and device of the env (from a probe env, built once)."""
        if self._meta is None:
            env = self()
            try:
                self._meta = EnvMetaData.from_env(env)
            finally:
                env.close()
        return self._meta

    def __getstate__(self) -> dict:
        return {"create_env_fn": self.create_env_fn, "create_env_kwargs": self.create_env_kwargs,
                "_meta": self._meta}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"EnvCreator({self.name}, create_env_kwargs={self.create_env_kwargs})"


def get_env_metadata(env_or_creator: EnvBase | Callable, kwargs: dict | None = None, *,
                     env_validator: Callable[[EnvBase], None] | None = None) -> EnvMetaData:
    """The :class:`EnvMetaData` (specs, batch size, device) of an env or env factory.

    Args:
        env_or_creator: an env, an :class:`EnvCreator` or any callable returning an env
            (a probe env is built with ``kwargs`` and closed afterwards).
        kwargs: keyword arguments for the factory.
        env_validator: called on the env (the probe) before its metadata is read; what it
            raises propagates (the probe is closed either way).

    Example:
        >>> from steersman.envs import CartPoleEnv
        >>> from steersman.envs.batched import get_env_metadata
        >>> get_env_metadata(CartPoleEnv, {"batch_size": [3]}).batch_size
        torch.Size([3])
    """
    if isinstance(env_or_creator, EnvBase):
        if env_validator is not None:
            env_validator(env_or_creator)
        return EnvMetaData.from_env(env_or_creator)
    if isinstance(env_or_creator, EnvCreator) and not kwargs and env_validator is None:
        return env_or_creator.meta_data
    if not callable(env_or_creator):
        raise TypeError(f"get_env_metadata takes an env or a callable returning one, got "
                        f"{type(env_or_creator).__name__}")
    env = env_or_creator(**(kwargs or {}))
    if not isinstance(env, EnvBase):
        raise TypeError(f"get_env_metadata: the factory returned a {type(env).__name__}, not an EnvBase")
    try:
        if env_validator is not None:
            env_validator(env)
        return EnvMetaData.from_env(env)
    finally:
        env.close()
