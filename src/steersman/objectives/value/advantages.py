"""Value estimators: modules that write ``advantage`` and ``value_target`` into a batch.

A batch is a TensorDict ``[*B, T]`` (time is the last batch dim unless ``time_dim`` says
otherwise) holding ``("next", "reward")``, ``("next", "done")``,
``("next", "terminated")`` (each ``[*B, T, 1]``) and what the value network reads, at the
root (state ``sₜ``) and under ``"next"`` (state ``sₜ₊₁``). Without a value network the
estimator reads ``"state_value"`` and ``("next", "state_value")`` from the batch.

* :class:`TD0Estimator` — ``r + γ V(s')`` (no time dim needed);
* :class:`TD1Estimator` — discounted return, bootstrapped at truncations and at the end;
* :class:`TDLambdaEstimator` — TD(λ) return;
* :class:`GAE` — generalized advantage estimation.

Each writes ``advantage = value_target - V(s)`` and ``value_target`` (GAE: ``advantage``
then ``advantage + V(s)``). Results are detached unless ``differentiable=True``. The math
is in :mod:`steersman.objectives.value.functional`.

Example:
    >>> import torch
    >>> from steersman.tensordict import TensorDict
    >>> from steersman.tensordict.nn import TensorDictModule
    >>> critic = TensorDictModule(torch.nn.Linear(3, 1), ["obs"], ["state_value"])
    >>> td = TensorDict({
    ...     "obs": torch.randn(4, 10, 3),                              # [B=4, T=10, 3]
    ...     "next": {"obs": torch.randn(4, 10, 3),
    ...              "reward": torch.randn(4, 10, 1),
    ...              "done": torch.zeros(4, 10, 1, dtype=torch.bool),
    ...              "terminated": torch.zeros(4, 10, 1, dtype=torch.bool)},
    ... }, [4, 10])
    >>> gae = GAE(gamma=0.99, lmbda=0.95, value_network=critic)
    >>> td = gae(td)
    >>> td["advantage"].shape, td["value_target"].requires_grad
    (torch.Size([4, 10, 1]), False)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor, nn

from ...tensordict import TensorDictBase, cat
from . import functional as F

NestedKey = str | tuple


def _norm_key(key: Any) -> NestedKey:
    if isinstance(key, tuple) and len(key) == 1:
        return key[0]
    if not isinstance(key, (str, tuple)):
        raise TypeError(f"a key is a str or a tuple of str, got {type(key).__name__}: {key!r}")
    return key


def _next(key: NestedKey) -> tuple:
    return ("next", key) if isinstance(key, str) else ("next", *key)


def normalize_advantage(advantage: Tensor, eps: float = 1e-6, dims: tuple[int, ...] | None = None) -> Tensor:
    """``(A - mean(A)) / max(std(A), eps)`` over ``dims`` (all by default).

    With a single element over ``dims`` the advantage is returned unchanged (its std is
    undefined), so a minibatch of 1 stays finite.

    Example:
        >>> normalize_advantage(torch.tensor([1.0, 3.0]))
        tensor([-0.7071,  0.7071])
        >>> normalize_advantage(torch.tensor([[5.0]]))
        tensor([[5.]])
    """
    if dims is None:
        dims = tuple(range(advantage.ndim))
    n = 1
    for d in dims:
        n *= advantage.shape[d]
    if n <= 1:
        return advantage
    loc = advantage.mean(dims, keepdim=True)
    scale = advantage.std(dims, keepdim=True).clamp_min(eps)
    return (advantage - loc) / scale


def standardize_by_group(x: Tensor, groups: Tensor, eps: float = 1e-6) -> Tensor:
    """Mean 0 and std 1 (unbiased, clamped at ``eps``) within each group of ``groups``.

    ``groups`` holds integer ids whose shape is a prefix of ``x``'s (it is broadcast over
    the trailing dims). A group of one element is centred only (its std is undefined).

    Example:
        >>> x = torch.tensor([1.0, 3.0, 10.0, 30.0])
        >>> standardize_by_group(x, torch.tensor([0, 0, 1, 1]))
        tensor([-0.7071,  0.7071, -0.7071,  0.7071])
    """
    if groups.ndim > x.ndim or tuple(groups.shape) != tuple(x.shape[: groups.ndim]):
        raise ValueError(f"group ids of shape {list(groups.shape)} must be a prefix of the values' shape "
                         f"{list(x.shape)}")
    groups = groups.reshape(*groups.shape, *([1] * (x.ndim - groups.ndim))).expand(x.shape).reshape(-1)
    flat = x.reshape(-1)
    _, index = torch.unique(groups, return_inverse=True)
    n_groups = int(index.max()) + 1 if index.numel() else 0
    count = torch.zeros(n_groups, dtype=flat.dtype, device=flat.device).index_add_(0, index, torch.ones_like(flat))
    mean = torch.zeros_like(count).index_add_(0, index, flat) / count
    centred = flat - mean[index]
    var = torch.zeros_like(count).index_add_(0, index, centred.square()) / (count - 1).clamp_min(1)
    scale = torch.where(count > 1, var.sqrt().clamp_min(eps), torch.ones_like(var))
    return (centred / scale[index]).reshape(x.shape)


def _positive_int_or_none(value: Any, name: str, owner: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}: {name} must be an int >= 1 or None, got {value!r}")
    return value


class ValueEstimatorBase(nn.Module):
    """Shared machinery: keys, calling the value network, reading ``"next"`` entries.

    Args (keyword-only):
        gamma: discount factor (float or tensor broadcastable to the reward).
        value_network: a TensorDict module writing ``tensor_keys.value``; ``None`` reads
            the values from the batch.
        shifted: compute ``V(s)`` and ``V(s')`` in one network call over the concatenated
            root and ``"next"`` inputs (two calls when ``target_params`` are given).
        differentiable: keep the graph (default: outputs are computed under ``no_grad``).
        skip_existing: read the values from the batch when they are already there
            instead of calling the network.
        vectorized: use the log-depth scan (default) rather than the loop over time.
            Under ``torch.compile`` the loop is used: inductor fuses it into one kernel,
            about 4x faster than the compiled scan (``benchmarks/losses.py``).
        time_dim: the time dim among the batch dims (default: the last).
        advantage_key, value_target_key, value_key: TorchRL's older way of renaming the
            ``advantage``/``value_target``/``value`` keys, the same as
            ``set_keys(advantage=..., ...)`` (TorchRL 0.14 refuses them and points to
            ``set_keys``; here they are honoured, as scripts written for earlier releases
            expect).
        device: the device of the ``gamma``/``lmbda`` buffers (both become tensors there);
            ``None`` keeps them as given. ``estimator.to(device)`` moves them later.
        deactivate_vmap: TorchRL's switch from ``vmap`` to a plain loop. The estimators here
            never call ``vmap`` (each value network is called directly), so either value
            gives that: value networks with data-dependent control flow work.
        value_chunk_size: call the value network on chunks of at most this many elements
            along ``value_chunk_dim`` (results concatenated), to bound its peak memory.
        num_chunks: call it on this many chunks instead (sizes as ``torch.tensor_split``);
            exclusive with ``value_chunk_size``. ``num_chunk`` is an alias.
        value_chunk_dim: the batch dim the chunks split (default 0).
        shifted_budget: TorchRL's number of extra time slots of its single-call
            ``shifted=True`` path, which drops (masks) samples after more internal
            truncations than the budget. The ``shifted`` path here evaluates every root and
            ``"next"`` input in one call, so it never drops a sample: any budget ``>= 1``
            gives the exact values (TorchRL's result with an unlimited budget).
        group_key: an integer entry of the batch (a task id, say, one per batch element,
            broadcast over the trailing dims) within whose groups the standardizations
            (``average_gae``, ``average_rewards``, ``average_adv``) are done instead of over
            the whole batch.
    """

    @dataclass
    class _AcceptedKeys:
        """Batch keys; ``reward``/``done``/``terminated`` are read under ``"next"``."""

        advantage: NestedKey = "advantage"
        value_target: NestedKey = "value_target"
        value: NestedKey = "state_value"
        reward: NestedKey = "reward"
        done: NestedKey = "done"
        terminated: NestedKey = "terminated"

    def __init__(
        self,
        *,
        gamma: float | Tensor,
        value_network: nn.Module | None = None,
        shifted: bool = False,
        differentiable: bool = False,
        skip_existing: bool | None = None,
        vectorized: bool = True,
        time_dim: int | None = None,
        advantage_key: NestedKey | None = None,
        value_target_key: NestedKey | None = None,
        value_key: NestedKey | None = None,
        device: torch.device | str | None = None,
        deactivate_vmap: bool = False,
        value_chunk_size: int | None = None,
        num_chunks: int | None = None,
        num_chunk: int | None = None,
        value_chunk_dim: int = 0,
        shifted_budget: int = 1,
        group_key: NestedKey | None = None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        value_chunk_size = _positive_int_or_none(value_chunk_size, "value_chunk_size", name)
        num_chunks = _positive_int_or_none(num_chunks, "num_chunks", name)
        num_chunk = _positive_int_or_none(num_chunk, "num_chunk", name)
        if num_chunks is not None and num_chunk is not None and num_chunks != num_chunk:
            raise ValueError(f"{name}: num_chunk is an alias of num_chunks; got num_chunks={num_chunks} and "
                             f"num_chunk={num_chunk}")
        num_chunks = num_chunks if num_chunks is not None else num_chunk
        if value_chunk_size is not None and num_chunks is not None:
            raise ValueError(f"{name}: value_chunk_size={value_chunk_size} and num_chunks={num_chunks} are "
                             "exclusive; set one of them (a chunk size, or a number of chunks)")
        if isinstance(value_chunk_dim, bool) or not isinstance(value_chunk_dim, int):
            raise TypeError(f"{name}: value_chunk_dim must be an int, got {value_chunk_dim!r}")
        if isinstance(shifted_budget, bool) or not isinstance(shifted_budget, int) or shifted_budget < 1:
            raise ValueError(f"{name}: shifted_budget must be an int >= 1, got {shifted_budget!r}")
        self._device = None if device is None else torch.device(device)
        self._set_hyper("gamma", gamma)
        self.value_network = value_network
        self.shifted = bool(shifted)
        self.differentiable = bool(differentiable)
        self.skip_existing = bool(skip_existing)
        self.vectorized = bool(vectorized)
        self.time_dim = time_dim
        self.deactivate_vmap = bool(deactivate_vmap)
        self.value_chunk_size = value_chunk_size
        self.num_chunks = num_chunks
        self.value_chunk_dim = value_chunk_dim
        self.shifted_budget = shifted_budget
        self.group_key = None if group_key is None else _norm_key(group_key)
        self.tensor_keys = self._AcceptedKeys()
        renames = {"advantage": advantage_key, "value_target": value_target_key, "value": value_key}
        self.set_keys(**{k: v for k, v in renames.items() if v is not None})

    def _set_hyper(self, name: str, value: float | Tensor) -> None:
        """``gamma``/``lmbda``: a buffer when a tensor or when ``device`` is set, else a float."""
        if isinstance(value, Tensor):
            self.register_buffer(name, value.detach().clone().to(self._device))
        elif self._device is not None:
            self.register_buffer(name, torch.tensor(float(value), device=self._device))
        else:
            setattr(self, name, float(value))

    @property
    def advantage_key(self) -> NestedKey:
        """``tensor_keys.advantage`` (TorchRL's attribute)."""
        return self.tensor_keys.advantage

    @property
    def value_key(self) -> NestedKey:
        """``tensor_keys.value`` (TorchRL's attribute)."""
        return self.tensor_keys.value

    @property
    def value_target_key(self) -> NestedKey:
        """``tensor_keys.value_target`` (TorchRL's attribute)."""
        return self.tensor_keys.value_target

    def _standardize(self, x: Tensor, td: TensorDictBase, eps: float = 1e-6) -> Tensor:
        """Mean 0, std 1 over the batch, or within the groups of ``group_key`` when set."""
        if self.group_key is None:
            return normalize_advantage(x, eps=eps)
        groups = td.get(self.group_key, None)
        if groups is None:
            raise KeyError(f"{type(self).__name__}: group_key {self.group_key!r} is missing from the batch; it "
                           "holds the group ids the standardization is done within")
        return standardize_by_group(x, groups, eps=eps)

    def _chunks(self, td: TensorDictBase) -> list[TensorDictBase] | None:
        """The pieces of ``td`` the value network is called on, or ``None`` for one call."""
        if (self.value_chunk_size is None and self.num_chunks is None) or td.ndim == 0:
            return None
        if not -td.ndim <= self.value_chunk_dim < td.ndim:
            raise ValueError(f"{type(self).__name__}: value_chunk_dim={self.value_chunk_dim} is out of range "
                             f"for a batch of size {list(td.batch_size)}")
        dim = self.value_chunk_dim % td.ndim
        n = td.shape[dim]
        if self.num_chunks is not None:
            k = min(self.num_chunks, n)
            sizes = [n // k + (1 if i < n % k else 0) for i in range(k)] if k else []
        else:
            sizes = [min(self.value_chunk_size, n - i) for i in range(0, n, self.value_chunk_size)]
        return None if len(sizes) <= 1 else list(td.split(sizes, dim))

    def _use_scan(self) -> bool:
        return self.vectorized and not torch.compiler.is_compiling()

    # ------------------------------------------------------------------ keys
    def set_keys(self, **names: NestedKey) -> ValueEstimatorBase:
        """Renames the batch keys (fields of ``tensor_keys``); returns ``self``."""
        valid = [f.name for f in fields(self.tensor_keys)]
        unknown = sorted(set(names) - set(valid))
        if unknown:
            raise ValueError(f"{type(self).__name__}.set_keys: unknown key name(s) {unknown}; valid names: {valid}")
        for name, key in names.items():
            setattr(self.tensor_keys, name, _norm_key(key))
        return self

    def _grad_context(self) -> Any:
        return contextlib.nullcontext() if self.differentiable else torch.no_grad()

    def _fetch(self, td: TensorDictBase, key: NestedKey, name: str) -> Tensor:
        value = td.get(key, None)
        if value is None:
            present = sorted(str(k) for k in td.keys(include_nested=True, leaves_only=True))
            raise KeyError(
                f"{type(self).__name__} needs {key!r} (its {name!r} key) in the batch, which has "
                f"{present}. If your data stores it under another name, call "
                f"set_keys({name}=<your key>) on the estimator or the loss."
            )
        return value

    def _reward(self, td: TensorDictBase) -> Tensor:
        key = _next(self.tensor_keys.reward)
        reward = self._fetch(td, key, "reward")
        if reward.ndim != td.ndim + 1:
            raise ValueError(
                f"{type(self).__name__}: {key!r} has shape {list(reward.shape)} for a batch of "
                f"size {list(td.batch_size)}; rewards keep a trailing feature dim: expected "
                f"[{', '.join(map(str, td.batch_size))}, 1] (unsqueeze(-1) it)"
            )
        return reward

    def _done_terminated(self, td: TensorDictBase, reward: Tensor) -> tuple[Tensor, Tensor]:
        done_key = _next(self.tensor_keys.done)
        done = self._fetch(td, done_key, "done")
        terminated = td.get(_next(self.tensor_keys.terminated), done)
        for key, t in ((done_key, done), (_next(self.tensor_keys.terminated), terminated)):
            if t.shape != reward.shape:
                raise ValueError(
                    f"{type(self).__name__}: {key!r} has shape {list(t.shape)}, expected "
                    f"{list(reward.shape)} like the reward (with the trailing singleton dim)"
                )
        return done, terminated

    def _tensor_time_dim(self, td: TensorDictBase) -> int:
        """The time dim of ``[*B, T, F]`` leaves, as a negative index."""
        if td.ndim == 0:
            raise ValueError(f"{type(self).__name__} needs a batch with a time dim, got batch size []")
        time_dim = td.ndim - 1 if self.time_dim is None else self.time_dim % td.ndim
        return time_dim - td.ndim - 1

    def _check_value(self, value: Tensor, reward: Tensor, where: NestedKey) -> Tensor:
        if value.shape != reward.shape:
            raise ValueError(
                f"{type(self).__name__}: the value {where!r} has shape {list(value.shape)}, "
                f"expected {list(reward.shape)} like the reward ([*batch, 1]: a critic outputs "
                "one value per state, with a trailing singleton dim)"
            )
        return value

    # --------------------------------------------------------------- values
    def _call(self, td: TensorDictBase, params: TensorDictBase | None) -> Tensor:
        net = self.value_network
        ctx = params.to_module(net) if params is not None else contextlib.nullcontext()
        key = self.tensor_keys.value
        pieces = self._chunks(td)
        with ctx:
            if pieces is None:
                return net(td).get(key)
            value = torch.cat([net(piece).get(key) for piece in pieces], self.value_chunk_dim % td.ndim)
        td.set(key, value)
        return value

    def _has_values(self, td: TensorDictBase) -> bool:
        return td.get(self.tensor_keys.value, None) is not None and td.get(_next(self.tensor_keys.value), None) is not None

    def _values(
        self, td: TensorDictBase, reward: Tensor, params: TensorDictBase | None, target_params: TensorDictBase | None
    ) -> tuple[Tensor, Tensor]:
        """``(V(s), V(s'))``, each shaped like the reward; written into ``td`` too."""
        key = self.tensor_keys.value
        if self.value_network is None or (self.skip_existing and self._has_values(td)):
            value = self._fetch(td, key, "value")
            next_value = self._fetch(td, _next(key), "value")
        elif self.shifted and target_params is None and td.ndim > 0:
            in_keys = self.value_network.in_keys
            n = td.shape[0]
            both = cat([td.select(*in_keys), td.get("next").select(*in_keys)], 0)
            out = self._call(both, params)
            value, next_value = out[:n], out[n:]
            td.set(key, value)
            td.set(_next(key), next_value)
        else:
            value = self._call(td, params)
            next_value = self._call(td.get("next"), target_params if target_params is not None else params)
        return self._check_value(value, reward, key), self._check_value(next_value, reward, _next(key))

    def _value(self, td: TensorDictBase, reward: Tensor, params: TensorDictBase | None) -> Tensor:
        key = self.tensor_keys.value
        if self.value_network is None or (self.skip_existing and td.get(key, None) is not None):
            return self._check_value(self._fetch(td, key, "value"), reward, key)
        return self._check_value(self._call(td, params), reward, key)

    def _next_value(self, td: TensorDictBase, reward: Tensor, target_params: TensorDictBase | None) -> Tensor:
        key = _next(self.tensor_keys.value)
        if self.value_network is None or (self.skip_existing and td.get(key, None) is not None):
            return self._check_value(self._fetch(td, key, "value"), reward, key)
        return self._check_value(self._call(td.get("next"), target_params), reward, key)

    def _average_rewards(self, td: TensorDictBase, reward: Tensor) -> Tensor:
        """With ``average_rewards``: the standardized reward, written back into ``td`` (as
        TorchRL does, so that later readers of the batch see the rewards the targets used)."""
        if not getattr(self, "average_rewards", False):
            return reward
        reward = self._standardize(reward, td, eps=1e-5)
        td.set(_next(self.tensor_keys.reward), reward)
        return reward

    # ------------------------------------------------------------- estimate
    def _target(self, td: TensorDictBase, reward: Tensor, next_value: Tensor) -> Tensor:  # pragma: no cover
        """The value target from the next value (TD estimators)."""
        raise NotImplementedError

    def _estimate(self, td: TensorDictBase, reward: Tensor, value: Tensor, next_value: Tensor) -> tuple[Tensor, Tensor]:
        """``(advantage, value_target)``."""
        target = self._target(td, reward, next_value)
        return target - value, target

    def forward(
        self, td: TensorDictBase, params: TensorDictBase | None = None, target_params: TensorDictBase | None = None
    ) -> TensorDictBase:
        """Writes ``advantage`` and ``value_target`` into ``td`` (and the values the network
        computed); returns ``td``.

        ``params``/``target_params``: parameters swapped into the value network (with
        ``to_module``) for ``V(s)`` / ``V(s')``; ``target_params`` defaults to ``params``.
        """
        with self._grad_context():
            reward = self._reward(td)
            value, next_value = self._values(td, reward, params, target_params)
            advantage, target = self._estimate(td, reward, value, next_value)
            td.set(self.tensor_keys.advantage, advantage)
            td.set(self.tensor_keys.value_target, target)
        return td

    def value_estimate(
        self,
        td: TensorDictBase,
        *,
        next_value: Tensor | None = None,
        target_params: TensorDictBase | None = None,
        params: TensorDictBase | None = None,
    ) -> Tensor:
        """The value target only, shaped like ``td["next", "reward"]``.

        With ``next_value`` given (shaped like the reward) the network is not called for
        ``V(s')``: losses that compute the next-state value themselves pass it here.
        """
        with self._grad_context():
            reward = self._reward(td)
            if next_value is None:
                next_value = self._next_value(td, reward, target_params if target_params is not None else params)
            else:
                self._check_value(next_value, reward, "next_value")
            return self._target(td, reward, next_value)

    def extra_repr(self) -> str:
        gamma = self.gamma if isinstance(self.gamma, float) else "tensor"
        return f"gamma={gamma}, differentiable={self.differentiable}, vectorized={self.vectorized}"


class TD0Estimator(ValueEstimatorBase):
    """One-step TD target ``r + γ (1 - terminated) V(s')``; works without a time dim.

    Args:
        average_rewards: standardize the rewards (mean 0, std 1 over the batch, or within the
            groups of ``group_key``) before computing the target, and write them back into
            the batch under ``("next", "reward")`` (as TorchRL does).
        others: see :class:`ValueEstimatorBase` (``gamma``, ``value_network``, ...).

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> td = TensorDict({"state_value": torch.zeros(3, 1),
        ...                  "next": {"state_value": torch.ones(3, 1), "reward": torch.ones(3, 1),
        ...                           "done": torch.tensor([[False], [True], [True]]),
        ...                           "terminated": torch.tensor([[False], [True], [False]])}}, [3])
        >>> TD0Estimator(gamma=0.5)(td)["value_target"][:, 0]   # the truncated step bootstraps
        tensor([1.5000, 1.0000, 1.5000])
    """

    def __init__(
        self,
        *,
        gamma: float | Tensor,
        value_network: nn.Module | None = None,
        shifted: bool = False,
        differentiable: bool = False,
        skip_existing: bool | None = None,
        vectorized: bool = True,
        time_dim: int | None = None,
        average_rewards: bool = False,
        advantage_key: NestedKey | None = None,
        value_target_key: NestedKey | None = None,
        value_key: NestedKey | None = None,
        device: torch.device | str | None = None,
        deactivate_vmap: bool = False,
        value_chunk_size: int | None = None,
        num_chunks: int | None = None,
        num_chunk: int | None = None,
        value_chunk_dim: int = 0,
        shifted_budget: int = 1,
        group_key: NestedKey | None = None,
    ) -> None:
        super().__init__(
            gamma=gamma, value_network=value_network, shifted=shifted, differentiable=differentiable,
            skip_existing=skip_existing, vectorized=vectorized, time_dim=time_dim,
            advantage_key=advantage_key, value_target_key=value_target_key, value_key=value_key, device=device,
            deactivate_vmap=deactivate_vmap, value_chunk_size=value_chunk_size, num_chunks=num_chunks,
            num_chunk=num_chunk, value_chunk_dim=value_chunk_dim, shifted_budget=shifted_budget, group_key=group_key,
        )
        self.average_rewards = bool(average_rewards)

    def _target(self, td: TensorDictBase, reward: Tensor, next_value: Tensor) -> Tensor:
        reward = self._average_rewards(td, reward)
        _, terminated = self._done_terminated(td, reward)
        return F.td0_return_estimate(self.gamma, next_value, reward, terminated)


class TDLambdaEstimator(ValueEstimatorBase):
    """TD(λ) target over ``[*B, T]`` batches (see :mod:`~steersman.objectives.value.functional`).

    Args:
        lmbda: the λ weight (default 0.95).
        average_rewards: standardize the rewards (mean 0, std 1 over the batch, or within the
            groups of ``group_key``) before computing the target, and write them back into
            the batch under ``("next", "reward")`` (as TorchRL does).
        others: see :class:`ValueEstimatorBase`.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> done = torch.zeros(1, 3, 1, dtype=torch.bool)
        >>> td = TensorDict({"state_value": torch.zeros(1, 3, 1),
        ...                  "next": {"state_value": torch.zeros(1, 3, 1), "reward": torch.ones(1, 3, 1),
        ...                           "done": done, "terminated": done}}, [1, 3])
        >>> TDLambdaEstimator(gamma=0.5, lmbda=1.0)(td)["value_target"][0, :, 0]
        tensor([1.7500, 1.5000, 1.0000])
    """

    def __init__(
        self,
        *,
        gamma: float | Tensor,
        lmbda: float | Tensor = 0.95,
        value_network: nn.Module | None = None,
        shifted: bool = False,
        differentiable: bool = False,
        skip_existing: bool | None = None,
        vectorized: bool = True,
        time_dim: int | None = None,
        average_rewards: bool = False,
        advantage_key: NestedKey | None = None,
        value_target_key: NestedKey | None = None,
        value_key: NestedKey | None = None,
        device: torch.device | str | None = None,
        deactivate_vmap: bool = False,
        value_chunk_size: int | None = None,
        num_chunks: int | None = None,
        num_chunk: int | None = None,
        value_chunk_dim: int = 0,
        shifted_budget: int = 1,
        group_key: NestedKey | None = None,
    ) -> None:
        super().__init__(
            gamma=gamma, value_network=value_network, shifted=shifted, differentiable=differentiable,
            skip_existing=skip_existing, vectorized=vectorized, time_dim=time_dim,
            advantage_key=advantage_key, value_target_key=value_target_key, value_key=value_key, device=device,
            deactivate_vmap=deactivate_vmap, value_chunk_size=value_chunk_size, num_chunks=num_chunks,
            num_chunk=num_chunk, value_chunk_dim=value_chunk_dim, shifted_budget=shifted_budget, group_key=group_key,
        )
        self._set_hyper("lmbda", lmbda)
        self.average_rewards = bool(average_rewards)

    def _target(self, td: TensorDictBase, reward: Tensor, next_value: Tensor) -> Tensor:
        reward = self._average_rewards(td, reward)
        done, terminated = self._done_terminated(td, reward)
        fn = F.vec_td_lambda_return_estimate if self._use_scan() else F.td_lambda_return_estimate
        return fn(self.gamma, self.lmbda, next_value, reward, done, terminated, time_dim=self._tensor_time_dim(td))


class TD1Estimator(TDLambdaEstimator):
    """Discounted return bootstrapped at truncations and at the end of the batch (TD(λ=1)).

    Args: ``average_rewards`` as :class:`TD0Estimator`; others: see :class:`ValueEstimatorBase`.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> done = torch.zeros(1, 3, 1, dtype=torch.bool)
        >>> td = TensorDict({"state_value": torch.zeros(1, 3, 1),
        ...                  "next": {"state_value": torch.full((1, 3, 1), 10.0),
        ...                           "reward": torch.ones(1, 3, 1), "done": done, "terminated": done}}, [1, 3])
        >>> TD1Estimator(gamma=0.5)(td)["value_target"][0, :, 0]
        tensor([3., 4., 6.])
    """

    def __init__(
        self,
        *,
        gamma: float | Tensor,
        value_network: nn.Module | None = None,
        shifted: bool = False,
        differentiable: bool = False,
        skip_existing: bool | None = None,
        vectorized: bool = True,
        time_dim: int | None = None,
        average_rewards: bool = False,
        advantage_key: NestedKey | None = None,
        value_target_key: NestedKey | None = None,
        value_key: NestedKey | None = None,
        device: torch.device | str | None = None,
        deactivate_vmap: bool = False,
        value_chunk_size: int | None = None,
        num_chunks: int | None = None,
        num_chunk: int | None = None,
        value_chunk_dim: int = 0,
        shifted_budget: int = 1,
        group_key: NestedKey | None = None,
    ) -> None:
        super().__init__(
            gamma=gamma, lmbda=1.0, value_network=value_network, shifted=shifted, differentiable=differentiable,
            skip_existing=skip_existing, vectorized=vectorized, time_dim=time_dim, average_rewards=average_rewards,
            advantage_key=advantage_key, value_target_key=value_target_key, value_key=value_key, device=device,
            deactivate_vmap=deactivate_vmap, value_chunk_size=value_chunk_size, num_chunks=num_chunks,
            num_chunk=num_chunk, value_chunk_dim=value_chunk_dim, shifted_budget=shifted_budget, group_key=group_key,
        )


class GAE(ValueEstimatorBase):
    """Generalized advantage estimation over ``[*B, T]`` batches.

    ``δₜ = rₜ + γ (1 - terminatedₜ) V(sₜ₊₁) - V(sₜ)``, ``Aₜ = δₜ + γ λ (1 - doneₜ) Aₜ₊₁``;
    writes ``advantage = A`` and ``value_target = A + V(s)``.

    Args:
        gamma, lmbda: discount and λ (default 0.95).
        average_gae: standardize the advantage written (mean 0, std 1 over the batch, or
            within the groups of ``group_key``; a batch of one element is left as is).
            ``value_target`` uses the raw advantage.
        auto_reset_env: the ``"next"`` state after a truncation is not the true one (an
            env that auto-resets writes the reset observation there), so truncated steps
            bootstrap with ``V(sₜ)`` instead: ``rₜ += γ V(sₜ) truncatedₜ`` and every ``done``
            ends the recursion. Reads ``("next", "truncated")``.
        others: see :class:`ValueEstimatorBase`.

    See the module docstring for an example.
    """

    def __init__(
        self,
        *,
        gamma: float | Tensor,
        lmbda: float | Tensor = 0.95,
        value_network: nn.Module | None = None,
        average_gae: bool = False,
        shifted: bool = False,
        differentiable: bool = False,
        skip_existing: bool | None = None,
        vectorized: bool = True,
        time_dim: int | None = None,
        auto_reset_env: bool = False,
        advantage_key: NestedKey | None = None,
        value_target_key: NestedKey | None = None,
        value_key: NestedKey | None = None,
        device: torch.device | str | None = None,
        deactivate_vmap: bool = False,
        value_chunk_size: int | None = None,
        num_chunks: int | None = None,
        num_chunk: int | None = None,
        value_chunk_dim: int = 0,
        shifted_budget: int = 1,
        group_key: NestedKey | None = None,
    ) -> None:
        super().__init__(
            gamma=gamma, value_network=value_network, shifted=shifted, differentiable=differentiable,
            skip_existing=skip_existing, vectorized=vectorized, time_dim=time_dim,
            advantage_key=advantage_key, value_target_key=value_target_key, value_key=value_key, device=device,
            deactivate_vmap=deactivate_vmap, value_chunk_size=value_chunk_size, num_chunks=num_chunks,
            num_chunk=num_chunk, value_chunk_dim=value_chunk_dim, shifted_budget=shifted_budget, group_key=group_key,
        )
        self._set_hyper("lmbda", lmbda)
        self.average_gae = bool(average_gae)
        self.auto_reset_env = bool(auto_reset_env)

    def _estimate(self, td: TensorDictBase, reward: Tensor, value: Tensor, next_value: Tensor) -> tuple[Tensor, Tensor]:
        done, terminated = self._done_terminated(td, reward)
        if self.auto_reset_env:
            # the "next" state after a truncation is the reset state: bootstrap with V(s) instead
            truncated = self._fetch(td, ("next", "truncated"), "truncated")
            if truncated.shape != reward.shape:
                raise ValueError(f"GAE(auto_reset_env=True): ('next', 'truncated') has shape {list(truncated.shape)}, "
                                 f"expected {list(reward.shape)} like the reward")
            reward = reward + self.gamma * value * truncated
            terminated = done
        fn = F.vec_generalized_advantage_estimate if self._use_scan() else F.generalized_advantage_estimate
        advantage, target = fn(
            self.gamma, self.lmbda, value, next_value, reward, done, terminated, time_dim=self._tensor_time_dim(td)
        )
        if self.average_gae:
            advantage = self._standardize(advantage, td)
        return advantage, target

    def _target(self, td: TensorDictBase, reward: Tensor, next_value: Tensor) -> Tensor:
        raise NotImplementedError  # GAE needs V(s) too: see value_estimate

    def value_estimate(
        self,
        td: TensorDictBase,
        *,
        next_value: Tensor | None = None,
        target_params: TensorDictBase | None = None,
        params: TensorDictBase | None = None,
    ) -> Tensor:
        """``A + V(s)`` (the GAE value target), shaped like the reward."""
        with self._grad_context():
            reward = self._reward(td)
            value = self._value(td, reward, params)
            if next_value is None:
                next_value = self._next_value(td, reward, target_params if target_params is not None else params)
            else:
                self._check_value(next_value, reward, "next_value")
            return self._estimate(td, reward, value, next_value)[1]


class VTrace(ValueEstimatorBase):
    """V-trace off-policy targets (IMPALA, Espeholt et al. 2018) over ``[*B, T]`` batches.

    With the behaviour policy's ``log μ(aₜ|sₜ)`` read at ``"action_log_prob"`` and the
    current policy's ``log π(aₜ|sₜ)`` from ``actor_network``, the clipped importance weights
    ``ρₜ = min(ρ̄, π/μ)`` and ``cₜ = min(c̄, π/μ)`` give::

        δₜ      = ρₜ (rₜ + γ (1 - terminatedₜ) V(sₜ₊₁) - V(sₜ))
        vₜ - V(sₜ) = δₜ + γ (1 - doneₜ) cₜ (vₜ₊₁ - V(sₜ₊₁))       (0 after the last step)
        Aₜ      = ρₜ (rₜ + γ (1 - terminatedₜ) v̂ₜ₊₁ - V(sₜ))

    where ``v̂ₜ₊₁`` is ``vₜ₊₁`` inside an episode and ``V(sₜ₊₁)`` after a truncation or at
    the end of the batch. Writes ``value_target = v`` and ``advantage = A`` (standardized
    when ``average_adv``); both detached unless ``differentiable``.

    Args:
        gamma: discount; actor_network: a probabilistic actor (``get_dist``);
        value_network: the critic (or ``None``: values read from the batch);
        rho_thresh, c_thresh: ``ρ̄`` and ``c̄`` (default 1.0);
        average_adv: standardize the advantage; others: see :class:`ValueEstimatorBase`.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import TensorDictModule, ProbabilisticTensorDictModule, ProbabilisticTensorDictSequential
        >>> from steersman.tensordict.nn import OneHotCategorical
        >>> actor = ProbabilisticTensorDictSequential(
        ...     TensorDictModule(torch.nn.Linear(3, 2), ["obs"], ["logits"]),
        ...     ProbabilisticTensorDictModule(["logits"], ["action"], OneHotCategorical))
        >>> done = torch.zeros(1, 4, 1, dtype=torch.bool)
        >>> td = TensorDict({"obs": torch.randn(1, 4, 3), "action": torch.eye(2)[[0, 1, 0, 1]][None],
        ...     "action_log_prob": torch.full((1, 4), -0.7), "state_value": torch.zeros(1, 4, 1),
        ...     "next": {"state_value": torch.zeros(1, 4, 1), "reward": torch.ones(1, 4, 1),
        ...              "done": done, "terminated": done}}, [1, 4])
        >>> td = VTrace(gamma=0.9, actor_network=actor, value_network=None)(td)
        >>> td["value_target"].shape, td["advantage"].shape
        (torch.Size([1, 4, 1]), torch.Size([1, 4, 1]))
    """

    @dataclass
    class _AcceptedKeys(ValueEstimatorBase._AcceptedKeys):
        """Batch keys; adds the behaviour policy's log-probability and the action."""

        sample_log_prob: NestedKey = "action_log_prob"
        action: NestedKey = "action"

    def __init__(
        self,
        *,
        gamma: float | Tensor,
        actor_network: nn.Module,
        value_network: nn.Module | None,
        rho_thresh: float | Tensor = 1.0,
        c_thresh: float | Tensor = 1.0,
        average_adv: bool = False,
        differentiable: bool = False,
        skip_existing: bool | None = None,
        shifted: bool = False,
        time_dim: int | None = None,
        advantage_key: NestedKey | None = None,
        value_target_key: NestedKey | None = None,
        value_key: NestedKey | None = None,
        device: torch.device | str | None = None,
        deactivate_vmap: bool = False,
        value_chunk_size: int | None = None,
        num_chunks: int | None = None,
        num_chunk: int | None = None,
        value_chunk_dim: int = 0,
        shifted_budget: int = 1,
        group_key: NestedKey | None = None,
    ) -> None:
        super().__init__(
            gamma=gamma, value_network=value_network, shifted=shifted, differentiable=differentiable,
            skip_existing=skip_existing, vectorized=False, time_dim=time_dim,
            advantage_key=advantage_key, value_target_key=value_target_key, value_key=value_key, device=device,
            deactivate_vmap=deactivate_vmap, value_chunk_size=value_chunk_size, num_chunks=num_chunks,
            num_chunk=num_chunk, value_chunk_dim=value_chunk_dim, shifted_budget=shifted_budget, group_key=group_key,
        )
        rho, c = float(rho_thresh), float(c_thresh)
        if not (rho > 0 and c > 0):
            raise ValueError(f"VTrace: rho_thresh and c_thresh must be > 0, got {rho_thresh} and {c_thresh}")
        self.actor_network = actor_network
        self.rho_thresh, self.c_thresh = rho, c
        self.average_adv = bool(average_adv)

    def _log_ratio(self, td: TensorDictBase, reward: Tensor) -> Tensor:
        """``log π(a|s) - log μ(a|s)``, shaped like the reward."""
        from ...tensordict.nn import ExplorationType, set_exploration_type

        behaviour = self._fetch(td, self.tensor_keys.sample_log_prob, "sample_log_prob")
        action = self._fetch(td, self.tensor_keys.action, "action")
        with set_exploration_type(ExplorationType.RANDOM):
            log_prob = self.actor_network.get_dist(td.copy()).log_prob(action)
        log_ratio = log_prob.reshape(behaviour.shape) - behaviour
        return log_ratio.reshape(reward.shape)

    def _estimate(self, td: TensorDictBase, reward: Tensor, value: Tensor, next_value: Tensor) -> tuple[Tensor, Tensor]:
        done, terminated = self._done_terminated(td, reward)
        ratio = self._log_ratio(td, reward).exp()
        advantage, target = F.vtrace_advantage_estimate(
            self.gamma, ratio.clamp(max=self.rho_thresh), ratio.clamp(max=self.c_thresh),
            value, next_value, reward, done, terminated, time_dim=self._tensor_time_dim(td),
        )
        if self.average_adv:
            advantage = self._standardize(advantage, td)
        return advantage, target

    def _target(self, td: TensorDictBase, reward: Tensor, next_value: Tensor) -> Tensor:
        raise NotImplementedError  # V-trace needs V(s) too: see value_estimate

    def value_estimate(
        self,
        td: TensorDictBase,
        *,
        next_value: Tensor | None = None,
        target_params: TensorDictBase | None = None,
        params: TensorDictBase | None = None,
    ) -> Tensor:
        """The V-trace target ``v``, shaped like the reward."""
        with self._grad_context():
            reward = self._reward(td)
            value = self._value(td, reward, params)
            if next_value is None:
                next_value = self._next_value(td, reward, target_params if target_params is not None else params)
            return self._estimate(td, reward, value, next_value)[1]


#: TorchRL's old names of the TD estimators (``torchrl.objectives.value.TD0Estimate``...): the
#: same classes, with the same signatures.
TD0Estimate = TD0Estimator
TD1Estimate = TD1Estimator
TDLambdaEstimate = TDLambdaEstimator
