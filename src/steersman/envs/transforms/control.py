"""Transforms that control a rollout or move its data: ``TerminateTransform`` (end
episodes on a predicate), ``DeviceCastTransform`` / ``PinMemoryTransform`` (where the data
lives), ``Hash`` (a reproducible id of an entry) and ``gSDENoise`` (the gSDE noise primer).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from steersman.data import Composite, TensorSpec, Unbounded, UnboundedContinuous
from steersman.tensordict import TensorDictBase, is_tensor_collection
from steersman.tensordict._utils import NestedKey

from ..common import _as_device
from .base import Transform
from .primer import TensorDictPrimer

__all__ = ["TerminateTransform", "DeviceCastTransform", "PinMemoryTransform", "Hash", "gSDENoise"]


class TerminateTransform(Transform):
    """Ends episodes when ``stop(next_td)`` is True: ORs it into ``terminated`` (and ``done``).

    Args:
        stop: called after each step with the ``"next"`` TensorDict; returns a bool (or a
            bool tensor broadcastable to the done entries, e.g. ``[*batch]`` or
            ``[*batch, 1]``).
        write_done: also OR it into ``done`` (default True), so ``rollout``'s
            ``break_when_any_done`` stops there; False writes ``terminated`` only (as in
            TorchRL: ``done`` then no longer equals ``terminated | truncated``, which
            ``check_env_specs`` reports; the rollout goes on past the flagged step).

    Every ``terminated``/``done`` entry of the done spec (nested ones too) is updated; the
    specs are unchanged.

    Example:
        >>> from steersman.envs import PendulumEnv, StepCounter, TerminateTransform, TransformedEnv
        >>> env = TransformedEnv(PendulumEnv(seed=0), StepCounter())
        >>> env = env.append_transform(TerminateTransform(lambda td: td["step_count"] >= 5))
        >>> r = env.rollout(100)
        >>> r.batch_size, bool(r["next", "terminated"][-1])
        (torch.Size([5]), True)
    """

    def __init__(self, stop: Callable[[TensorDictBase], Any], *, write_done: bool = True) -> None:
        if not callable(stop):
            raise TypeError(f"TerminateTransform: stop must be callable, got {type(stop).__name__}")
        super().__init__()
        self.stop = stop
        self.write_done = bool(write_done)
        self._targets: list[NestedKey] = []

    def transform_done_spec(self, done_spec: Composite) -> Composite:
        names = ("terminated", "done") if self.write_done else ("terminated",)
        self._targets = [k for k in done_spec.keys(include_nested=True, leaves_only=True)
                         if (k if type(k) is str else k[-1]) in names]
        return done_spec

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        flag = self.stop(next_tensordict)
        flag = torch.as_tensor(flag, dtype=torch.bool, device=next_tensordict.device)
        nb = next_tensordict.batch_dims
        for key in self._targets:
            cur = next_tensordict.get(key, None)
            if cur is None:
                continue
            f = flag
            if f.ndim > nb or f.shape == cur.shape:
                f = f.reshape(f.shape[:nb] + (1,) * (cur.ndim - nb)) if f.shape != cur.shape else f
            else:
                f = f.reshape(f.shape + (1,) * (cur.ndim - f.ndim))
            next_tensordict.set(key, cur | f)
        return next_tensordict

    def __repr__(self) -> str:
        return f"TerminateTransform(stop={self.stop!r}, write_done={self.write_done})"


class DeviceCastTransform(Transform):
    """Moves the env's outputs to ``device`` and its inputs back to ``orig_device``.

    Args:
        device: the device outside the env (the policy's).
        orig_device: the device of the wrapped env (default: the parent env's device once
            in an env; outside an env, ``forward`` only needs ``device``).
        in_keys, out_keys: the output entries to move (default: the whole TensorDict, and
            the transformed env's ``device`` becomes ``device``).
        in_keys_inv, out_keys_inv: the input entries to move back (default: all of them
            when no ``in_keys`` are given).

    Moving is ``tensor.to(device, non_blocking=...)``; on CPU-only machines, CPU to CPU
    is a no-op copy of references and ``"meta"`` works for dry runs.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs import DeviceCastTransform
        >>> td = TensorDict({"obs": torch.ones(2)}, [], device="cpu")
        >>> DeviceCastTransform("meta")(td)["obs"].device
        device(type='meta')
    """

    def __init__(self, device: Any, orig_device: Any = None, *, in_keys: Any = None, out_keys: Any = None,
                 in_keys_inv: Any = None, out_keys_inv: Any = None) -> None:
        super().__init__(in_keys, out_keys, in_keys_inv, out_keys_inv)
        self.device = _as_device(device)
        self.orig_device = None if orig_device is None else _as_device(orig_device)
        self._whole = not self.in_keys and not self.in_keys_inv

    def _orig(self) -> torch.device | None:
        if self.orig_device is not None:
            return self.orig_device
        parent = self.parent
        return None if parent is None else parent.device

    def _move(self, td: TensorDictBase, device: torch.device | None, pairs: list) -> TensorDictBase:
        if device is None:
            return td
        if self._whole:
            return td.to(device)
        for ik, ok in pairs:
            x = td.get(ik, None)
            if x is not None:
                td.set(ok, x.to(device))
        return td

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._move(tensordict, self.device, self._pairs)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        return self._call(tensordict_reset)

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        if self._whole:
            return self._move(tensordict, self._orig(), [])
        orig = self._orig()
        for ik, ok in self._pairs_inv:
            x = tensordict.get(ok, None)
            if x is not None:
                tensordict.set(ik, x if orig is None else x.to(orig))
        return tensordict

    @property
    def _has_inv(self) -> bool:
        return True

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._call(tensordict)

    def _spec_to(self, spec: Composite, pairs: list) -> Composite:
        if self._whole:
            return spec.to(self.device)
        for ik, ok in pairs:
            s = spec.get(ik, None)
            if s is not None and not isinstance(s, Composite):
                spec.set(ok, s.to(self.device))
        return spec

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        if self._whole:
            return output_spec.to(self.device)
        return super().transform_output_spec(output_spec)

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        if self._whole:
            return input_spec.to(self.device)
        return super().transform_input_spec(input_spec)

    def _transform_spec_leaf(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        return spec.to(self.device)

    def transform_env_device(self, device: torch.device) -> torch.device:
        return self.device if self._whole else device

    def __repr__(self) -> str:
        return f"DeviceCastTransform(device={self.device}, orig_device={self.orig_device})"


class PinMemoryTransform(Transform):
    """Pins the memory of the env's outputs (faster host-to-CUDA copies).

    Pinning needs CUDA: without it the outputs are returned unchanged (a documented no-op,
    so scripts written for GPU machines run on CPU-only ones).

    Example:
        >>> from steersman.envs import CartPoleEnv, PinMemoryTransform, TransformedEnv
        >>> env = TransformedEnv(CartPoleEnv(seed=0), PinMemoryTransform())
        >>> env.rollout(3)["next", "observation"].shape
        torch.Size([3, 4])
    """

    def __init__(self) -> None:
        super().__init__()

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        if not torch.cuda.is_available():
            return tensordict
        return tensordict.pin_memory()

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        return self._call(tensordict_reset)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._call(tensordict)


def _element_bytes(x: Any) -> bytes:
    if isinstance(x, Tensor):
        x = x.detach().cpu().contiguous()
        return f"{x.dtype}|{tuple(x.shape)}|".encode() + x.view(torch.uint8).numpy().tobytes() if x.numel() else (
            f"{x.dtype}|{tuple(x.shape)}|".encode())
    return repr(x).encode()


class Hash(Transform):
    """Writes a reproducible int64 hash of each entry of ``in_keys`` at ``out_keys``.

    Args:
        in_keys: the entries to hash (tensors or non-tensor data such as strings).
        out_keys: where the hashes go (one per in_key).
        in_keys_inv, out_keys_inv: with ``repertoire``, the inverse direction maps hashes
            (``out_keys_inv``, written by a policy) back to the values they were computed
            from (``in_keys_inv``).

    Keyword Args:
        hash_fn: ``(value, seed) -> Tensor`` applied to each batch element (default:
            :meth:`reproducible_hash`: SHA-256 of the element's dtype, shape and bytes, or
            of its ``repr`` for non-tensors, mixed with ``seed``, as an int64).
        seed: mixed into every hash (different seeds give independent hashes).
        use_raw_nontensor: give ``hash_fn`` the non-tensor container itself instead of
            its values.
        repertoire: a dict ``{hash: value}`` filled by every hash computed (shared, not
            copied), read by :meth:`get_input_from_hash` and the inverse direction.

    The hash of an entry of batch shape ``[*batch]`` has shape ``[*batch]`` (one per
    element); the same value gives the same hash in every process and run.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs import Hash
        >>> h = Hash(in_keys=["obs"], out_keys=["hash"])
        >>> td = TensorDict({"obs": torch.tensor([[1.0, 2.0], [1.0, 2.0], [3.0, 4.0]])}, [3])
        >>> out = h(td)["hash"]
        >>> out.shape, bool(out[0] == out[1]), bool(out[0] == out[2])
        (torch.Size([3]), True, False)
    """

    def __init__(self, in_keys: Any, out_keys: Any, in_keys_inv: Any = None, out_keys_inv: Any = None, *,
                 hash_fn: Callable | None = None, seed: Any = None, use_raw_nontensor: bool = False,
                 repertoire: dict | None = None) -> None:
        if out_keys is None:
            raise ValueError("Hash: out_keys are required (the hashes go to new entries)")
        super().__init__(in_keys, out_keys, in_keys_inv, out_keys_inv)
        if self.in_keys_inv and repertoire is None:
            raise ValueError("Hash: in_keys_inv needs a repertoire (a dict hash -> value) to map hashes back")
        self.hash_fn = self.reproducible_hash if hash_fn is None else hash_fn
        self.seed = seed
        self.use_raw_nontensor = bool(use_raw_nontensor)
        self.repertoire = repertoire

    @staticmethod
    def reproducible_hash(value: Any, seed: Any = None) -> Tensor:
        """SHA-256 of ``value`` (and ``seed``) as a 0-d int64 tensor."""
        h = hashlib.sha256(repr(seed).encode())
        h.update(_element_bytes(value))
        return torch.tensor(int.from_bytes(h.digest()[:8], "little", signed=True), dtype=torch.int64)

    def _hash_entry(self, td: TensorDictBase, x: Any) -> Tensor:
        bs = td.batch_size
        if isinstance(x, Tensor):
            flat = x.reshape(bs.numel(), *x.shape[len(bs):])
            items = list(flat.unbind(0)) if bs.numel() else []
        elif is_tensor_collection(x) and not self.use_raw_nontensor and hasattr(x, "tolist"):
            items = _flatten_list(x.tolist(), len(bs))
        elif is_tensor_collection(x):
            items = [x]
        else:
            items = [x] if not bs else _flatten_list(x, len(bs))
        out = [self.hash_fn(v, self.seed) for v in items]
        if self.repertoire is not None:
            for v, hv in zip(items, out):
                self.repertoire[int(hv)] = v
        if not out:
            return torch.zeros(bs, dtype=torch.int64, device=td.device)
        res = torch.stack([torch.as_tensor(o) for o in out])
        return res.reshape((*bs, *res.shape[1:])).to(td.device)

    def _apply_pairs(self, td: TensorDictBase, pairs: list) -> TensorDictBase:
        for ik, ok in pairs:
            x = td.get(ik, None)
            if x is None:
                continue
            td.set(ok, self._hash_entry(td, x))
        return td

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        return self._call(tensordict_reset)

    def get_input_from_hash(self, hash_tensor: Tensor) -> Any:
        """The value a hash was computed from (needs ``repertoire``; None if unknown)."""
        if self.repertoire is None:
            raise RuntimeError("Hash.get_input_from_hash needs a repertoire (Hash(..., repertoire={}))")
        if hash_tensor.ndim == 0:
            return self.repertoire.get(int(hash_tensor))
        return [self.get_input_from_hash(h) for h in hash_tensor.unbind(0)]

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        for ik, ok in self._pairs_inv:
            h = tensordict.get(ok, None)
            if h is None:
                continue
            vals = self.get_input_from_hash(h)
            if isinstance(vals, list) and vals and all(isinstance(v, Tensor) for v in vals):
                vals = torch.stack(vals)
            tensordict.set(ik, vals)
        return tensordict

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        for ik, ok in self._pairs:
            s = observation_spec.get(ik, None)
            if s is not None:
                observation_spec.set(ok, Unbounded(shape=observation_spec.shape, dtype=torch.int64,
                                                   device=observation_spec.device))
        return observation_spec

    def transform_reward_spec(self, reward_spec: Composite) -> Composite:
        return reward_spec

    def transform_done_spec(self, done_spec: Composite) -> Composite:
        return done_spec

    def transform_state_spec(self, state_spec: Composite) -> Composite:
        return state_spec

    def transform_action_spec(self, action_spec: Composite) -> Composite:
        return action_spec

    def _check_input_keys(self, input_spec: Composite) -> None:
        return  # in_keys_inv are values recovered from hashes, not inputs of the wrapped env


def _flatten_list(x: Any, depth: int) -> list:
    if depth == 0:
        return [x]
    out: list = []
    for v in x:
        out.extend(_flatten_list(v, depth - 1))
    return out


class gSDENoise(TensorDictPrimer):  # noqa: N801 - TorchRL's name
    """The primer of generalized state-dependent exploration (gSDE): an ``"_eps_gSDE"``
    entry, drawn from a standard normal at every reset.

    Args:
        state_dim: the feature size of the state the noise multiplies.
        action_dim: the action size.
        shape: extra leading dims of the noise (default none).
        **kwargs: passed to :class:`TensorDictPrimer` (``reset_key``, ``expand_specs``).

    The entry has shape ``[*batch, *shape, action_dim, state_dim]`` (``[*batch, *shape, 1]``
    when the dims are not given: the module draws the noise itself on first use). A
    gSDE policy reads it, so each episode keeps one exploration matrix.

    Example:
        >>> from steersman.envs import PendulumEnv, TransformedEnv, gSDENoise
        >>> env = TransformedEnv(PendulumEnv(batch_size=[4], seed=0), gSDENoise(state_dim=3, action_dim=1))
        >>> env.reset()["_eps_gSDE"].shape
        torch.Size([4, 1, 3])
    """

    def __init__(self, state_dim: int | None = None, action_dim: int | None = None,
                 shape: Any = None, **kwargs: Any) -> None:
        shape = () if shape is None else tuple(shape)
        if (state_dim is None) != (action_dim is None):
            raise ValueError("gSDENoise: give both state_dim and action_dim, or neither")
        tail = (action_dim, state_dim) if state_dim is not None else (1,)
        random = kwargs.pop("random", True)
        super().__init__(primers={"_eps_gSDE": UnboundedContinuous(shape=(*shape, *tail))}, random=random, **kwargs)

    def __repr__(self) -> str:
        return f"gSDENoise(shape={list(self.primers['_eps_gSDE'].shape)})"

