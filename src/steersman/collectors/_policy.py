"""The policy side of the collectors: the random policy, policy weights and their sharing.

* :class:`_EnvRandomPolicy`: writes actions drawn from the env's action spec (used for
  ``policy=None`` and the ``init_random_frames``; the public, TorchRL-named one is
  :class:`steersman.modules.RandomPolicy`).
* :func:`weights_of` / :func:`as_weights` / :func:`copy_weights_`: a policy's parameters
  and buffers as a TensorDict (``TensorDict.from_module``), and in-place updates of them
  from a module, a TensorDict or a ``state_dict``.
* :class:`SharedWeights`: the weights in shared memory for worker processes, with a
  version counter. The parent writes new weights with :meth:`SharedWeights.write`; a
  worker copies them into its policy with :meth:`SharedWeights.read_into` between two
  batches, so a batch never mixes two versions (a seqlock: the version is odd while a
  write is in progress, and a reader whose copy overlapped a write copies again).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from steersman.data import Composite
from steersman.tensordict import TensorDictBase, from_module

from ._buffer import leaf, nested_td
from ._shm import SharedMemory

__all__ = ["weights_of", "as_weights", "copy_weights_", "SharedWeights", "policy_output_check"]


class _EnvRandomPolicy:
    """Writes a random action (``action_spec.rand()``, torch's global RNG) into the TensorDict.

    Args:
        action_spec: the env's ``full_action_spec`` (a Composite of batch shape
            ``env.batch_size``).

    Example:
        >>> from steersman.envs import CartPoleEnv
        >>> from steersman.collectors._policy import _EnvRandomPolicy
        >>> env = CartPoleEnv(batch_size=[3])
        >>> _EnvRandomPolicy(env.full_action_spec)(env.reset())["action"].shape
        torch.Size([3])
    """

    def __init__(self, action_spec: Composite) -> None:
        self.action_spec = action_spec

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        return td.update(self.action_spec.rand())


def _leaves(td: TensorDictBase) -> list[tuple[tuple[str, ...], Tensor]]:
    out = []
    for key in td.keys(include_nested=True, leaves_only=True):
        key = (key,) if type(key) is str else tuple(key)
        out.append((key, leaf(td, key)))
    return out


def weights_of(policy: Any) -> TensorDictBase | None:
    """The parameters and buffers of ``policy`` (a TensorDict of its own tensors), or None
    if it is not an ``nn.Module`` or holds none."""
    if not isinstance(policy, nn.Module):
        return None
    w = from_module(policy)
    return w if len(list(w.keys(include_nested=True, leaves_only=True))) else None


def as_weights(src: Any) -> TensorDictBase:
    """Weights from a module, a TensorDict of weights, or a ``state_dict`` (dotted keys)."""
    if isinstance(src, nn.Module):
        w = weights_of(src)
        if w is None:
            raise ValueError(f"update_policy_weights_: the module {type(src).__name__} has no parameters")
        return w
    if isinstance(src, TensorDictBase):
        return src
    if isinstance(src, Mapping):
        return nested_td([(tuple(str(k).split(".")), v) for k, v in src.items()], torch.Size(()), None)
    raise TypeError(
        "update_policy_weights_: expected a module, a TensorDict of weights or a state_dict, "
        f"got {type(src).__name__}"
    )


def _match(dst: TensorDictBase, src: TensorDictBase) -> tuple[list[Tensor], list[Tensor]]:
    """The destination and source tensors of ``src``'s leaves (every key must be in ``dst``
    with the same shape; nothing is written if one is not)."""
    dsts, srcs = [], []
    for key, val in _leaves(src):
        cur = leaf(dst, key)
        if not isinstance(cur, Tensor):
            have = sorted(".".join(k) for k, _ in _leaves(dst))
            raise KeyError(f"update_policy_weights_: the policy has no weight {'.'.join(key)!r} (it has {have})")
        if cur.shape != val.shape:
            raise ValueError(
                f"update_policy_weights_: weight {'.'.join(key)!r} has shape {list(val.shape)}, the "
                f"policy's has {list(cur.shape)}"
            )
        dsts.append(cur)
        srcs.append(val)
    return dsts, srcs


@torch.no_grad()
def copy_weights_(dst: TensorDictBase, src: TensorDictBase) -> None:
    """Copies the leaves of ``src`` into the tensors of ``dst`` (checked first, then written)."""
    dsts, srcs = _match(dst, src)
    for d, s in zip(dsts, srcs):
        d.copy_(s)


class SharedWeights:
    """Policy weights in shared memory, with a version counter (see the module docstring).

    Args:
        weights: the initial weights (a TensorDict of tensors, e.g. :func:`weights_of`).

    Pickled while worker processes start (the memory travels as a descriptor); in a
    worker, :meth:`read_into` copies the current weights into the worker's policy.

    Example:
        >>> import torch
        >>> from steersman.collectors._policy import SharedWeights, weights_of
        >>> net, twin = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
        >>> shared = SharedWeights(weights_of(net))
        >>> seen = shared.read_into(weights_of(twin), seen=0)
        >>> bool((twin.weight == net.weight).all()), seen
        (True, 2)
        >>> with torch.no_grad():
        ...     _ = net.weight.zero_()
        >>> shared.write(weights_of(net))
        >>> shared.read_into(weights_of(twin), seen), bool((twin.weight == 0).all())
        (4, True)
    """

    def __init__(self, weights: TensorDictBase) -> None:
        entries = [(k, v.dtype, tuple(v.shape)) for k, v in _leaves(weights)]
        offset = 64  # the version counter, then the leaves, each on a cache line
        slots = []
        for key, dtype, shape in entries:
            nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
            slots.append((key, dtype, shape, offset, nbytes))
            offset += (nbytes + 63) // 64 * 64
        self._slots = slots
        self._mem = SharedMemory(offset, name="steersman-policy-weights")
        self._bind()
        self.write(weights)

    def _bind(self) -> None:
        mem = self._mem.tensor
        self._version = mem[:8].view(torch.int64)
        self._views = []
        for _, dtype, shape, off, nbytes in self._slots:
            if nbytes == 0:
                self._views.append(torch.empty(shape, dtype=dtype))
            else:
                self._views.append(mem[off: off + nbytes].view(dtype).view(shape))
        self.td = nested_td([(s[0], v) for s, v in zip(self._slots, self._views)], torch.Size(()), None)

    def __getstate__(self) -> dict:
        return {"slots": self._slots, "mem": self._mem}

    def __setstate__(self, state: dict) -> None:
        self._slots = state["slots"]
        self._mem = state["mem"]
        self._bind()

    @property
    def version(self) -> int:
        """Even between writes; increases by 2 with each :meth:`write`."""
        return int(self._version)

    def close_fd(self) -> None:
        """Closes the parent's descriptor once the workers have mapped the memory."""
        self._mem.close_fd()

    @torch.no_grad()
    def write(self, weights: TensorDictBase) -> None:
        """Copies ``weights`` (all or some of the keys) into shared memory; checked first."""
        dsts, srcs = _match(self.td, weights)
        srcs = [s.detach().to("cpu") for s in srcs]
        v = int(self._version)
        self._version.fill_(v + 1)
        try:
            torch._foreach_copy_(dsts, srcs)
        finally:
            self._version.fill_(v + 2)

    @torch.no_grad()
    def read_into(self, weights: TensorDictBase, seen: int) -> int:
        """Copies the shared weights into ``weights`` if their version is not ``seen``;
        returns the version copied (or ``seen``)."""
        v = int(self._version)
        if v == seen:
            return seen
        dsts, srcs = _match(weights, self.td)
        while True:
            if v & 1:  # a write is in progress (a few microseconds)
                os.sched_yield()
                v = int(self._version)
                continue
            for d, s in zip(dsts, srcs):
                d.copy_(s)
            after = int(self._version)
            if after == v:
                return v
            v = after


def policy_output_check(td: TensorDictBase, action_spec: Composite) -> None:
    """Raises if the policy did not write every action entry with the spec's shape."""
    for key, spec in action_spec.items(include_nested=True, leaves_only=True):
        k = (key,) if type(key) is str else tuple(key)
        val = leaf(td, k)
        if val is None:
            have = sorted(map(str, td.keys(include_nested=True, leaves_only=True)))
            raise KeyError(
                f"collector: the policy wrote no action entry {key!r} (the TensorDict has {have}); "
                "it must write every key of env.full_action_spec"
            )
        if not isinstance(val, Tensor) or val.shape != spec.shape:
            raise ValueError(
                f"collector: the policy's action {key!r} has shape {list(getattr(val, 'shape', []))}, "
                f"the env's action spec expects {list(spec.shape)} ({spec!r})"
            )

