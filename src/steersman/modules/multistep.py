"""``MultiStepActorWrapper``: runs a policy that outputs a chunk of actions (a macro, an
action-chunking or VLA policy) one environment step at a time.

The wrapped actor writes a chunk ``[*B, n_steps, *action]`` (the chunk dim right after the
batch dims). The wrapper keeps it in the TensorDict (the *cache*: ``"<action>_orig"``, or
the chunk key itself when it differs from the action key) with a step ``counter``
(``[*B, 1]``, next to the init key), and serves ``chunk[counter - 1]`` as ``action``. The
cache and the counter ride along from step to step like a recurrent state (``step_mdp``
keeps them), so an env rollout or a collector needs nothing else.

The actor is called again, for the rows that need it only, when a row

* starts an episode (its ``is_init`` entry is set: add
  :class:`~steersman.envs.transforms.InitTracker` to the env), or
* has used ``replan_interval`` actions of its chunk (default ``n_steps``: the whole chunk).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..tensordict import TensorDictBase
from ..tensordict.nn import TensorDictModuleBase

__all__ = ["MultiStepActorWrapper"]

NestedKey = str | tuple


def _last(key: NestedKey) -> str:
    return key if isinstance(key, str) else key[-1]


def _with_last(key: NestedKey, last: str) -> NestedKey:
    return last if isinstance(key, str) else (*key[:-1], last)


def _norm(key: NestedKey) -> NestedKey:
    return key[0] if isinstance(key, tuple) and len(key) == 1 else key


class MultiStepActorWrapper(TensorDictModuleBase):
    """Serves one action per step from an actor that outputs ``n_steps`` at once.

    Args:
        actor: a TensorDict module writing action chunks ``[*B, n_steps, *action]``.
        n_steps: the chunk length (checked on every call); ``None``: whatever the actor
            gives (the index wraps around when neither ``n_steps`` nor ``replan_interval``
            bounds it and no episode starts).

    Keyword Args:
        action_keys: the env's action keys (default: inferred from ``chunk_keys``, where
            ``"action_chunk"`` and ``("vla_action", "chunk")`` map to ``"action"``;
            otherwise the actor's out_keys whose last name is ``"action"``).
        chunk_keys: the actor's chunk outputs (default: its ``("vla_action", "chunk")`` or
            ``*_chunk`` out_keys, else ``action_keys``).
        init_key: the episode-start flag (default ``"is_init"``, InitTracker's key); the
            counter lives next to it (``"counter"``).
        keep_dim: serve ``[*B, 1, *action]`` instead of ``[*B, *action]``.
        replan_interval: call the actor again after this many steps (``1 <= r <=
            n_steps``; ``1``: every step, closed loop). Default: after the whole chunk.

    Bad input: a call whose init key is missing is a KeyError; a first call where only
    some rows start an episode (nothing cached for the others) is a RuntimeError; a chunk
    whose length is not ``n_steps`` (or is below ``replan_interval``) is a RuntimeError.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> # a "planner" proposing the next 3 actions: [B, 3, 1] = observation + 0, 1, 2
        >>> plan = TensorDictModule(lambda obs: obs.unsqueeze(-2) + torch.arange(3.0).view(3, 1),
        ...                         ["observation"], ["action"])
        >>> policy = MultiStepActorWrapper(plan, n_steps=3)
        >>> td = TensorDict({"observation": torch.tensor([[10.0], [20.0]]),
        ...                  "is_init": torch.ones(2, 1, dtype=torch.bool)}, [2])
        >>> served = []
        >>> for step in range(4):
        ...     td = policy(td)
        ...     served.append(td["action"][:, 0].tolist())
        ...     td["is_init"] = torch.zeros(2, 1, dtype=torch.bool)
        ...     td["observation"] = td["observation"] + 100  # the env moves on
        >>> served  # three actions of the first plan, then a new plan from the new observation
        [[10.0, 20.0], [11.0, 21.0], [12.0, 22.0], [310.0, 320.0]]
        >>> td["action_orig"].shape, td["counter"].view(-1).tolist()
        (torch.Size([2, 3, 1]), [1, 1])
    """

    def __init__(
        self,
        actor: nn.Module,
        n_steps: int | None = None,
        *,
        action_keys: list[NestedKey] | NestedKey | None = None,
        chunk_keys: list[NestedKey] | NestedKey | None = None,
        init_key: NestedKey | None = None,
        keep_dim: bool = False,
        replan_interval: int | None = None,
    ) -> None:
        super().__init__()
        if n_steps is not None and int(n_steps) < 1:
            raise ValueError(f"MultiStepActorWrapper: n_steps must be >= 1 or None, got {n_steps}")
        if replan_interval is not None:
            replan_interval = int(replan_interval)
            if replan_interval < 1 or (n_steps is not None and replan_interval > n_steps):
                raise ValueError(
                    f"MultiStepActorWrapper: replan_interval must be in [1, n_steps={n_steps}], got {replan_interval}"
                )
        if isinstance(init_key, list):
            raise ValueError("MultiStepActorWrapper: only a single init_key can be passed")
        self.actor = actor
        self.n_steps = None if n_steps is None else int(n_steps)
        self.keep_dim = keep_dim
        self.replan_interval = replan_interval
        self.init_key: NestedKey = _norm(init_key) if init_key is not None else "is_init"
        out_keys = [_norm(k) for k in actor.out_keys]
        chunks = _as_list(chunk_keys)
        actions = _as_list(action_keys)
        if chunks is None:
            vla = [k for k in out_keys if isinstance(k, tuple) and k[-2:] == ("vla_action", "chunk")]
            chunks = vla or [k for k in out_keys if _last(k).endswith("_chunk")]
            if not chunks:
                chunks = actions if actions is not None else [k for k in out_keys if _last(k) == "action"]
        if actions is None:
            actions = [_action_from_chunk(k) for k in chunks]
        if not chunks or len(actions) != len(chunks):
            raise ValueError(
                f"MultiStepActorWrapper: action_keys {actions} and chunk_keys {chunks} must be non-empty and of the "
                f"same length (the actor's out_keys are {out_keys})"
            )
        self.action_keys, self.chunk_keys = actions, chunks
        #: where each action's chunk is kept between steps
        self.cache_keys = [c if c != a else _with_last(a, _last(a) + "_orig") for a, c in zip(actions, chunks)]

    @property
    def counter_key(self) -> NestedKey:
        """The step counter's key, next to the init key (``"counter"``)."""
        return _with_last(self.init_key, "counter")

    @property
    def in_keys(self) -> list:
        return [*self.actor.in_keys, self.init_key]

    @property
    def out_keys(self) -> list:
        keys = list(self.actor.out_keys)
        for key in [*self.action_keys, *self.cache_keys, self.counter_key]:
            if key not in keys:
                keys.append(key)
        return keys

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Writes the current action(s), the cache and the counter into ``tensordict``."""
        is_init = tensordict.get(self.init_key, None)
        if is_init is None:
            raise KeyError(
                f"MultiStepActorWrapper needs the episode-start flag {self.init_key!r} in the input (add an "
                "InitTracker transform to the env, or pass init_key=<your key>)"
            )
        is_init = is_init.reshape(*tensordict.batch_size, 1).bool()
        counter = tensordict.get(self.counter_key, None)
        if counter is None:
            counter = torch.zeros_like(is_init, dtype=torch.long)
        interval = self.replan_interval if self.replan_interval is not None else self.n_steps
        replan = is_init if interval is None else is_init | (counter >= interval)
        if replan.any():
            self._replan(tensordict, replan)
        counter = counter.masked_fill(replan, 0) + 1
        tensordict.set(self.counter_key, counter)
        dim = tensordict.batch_dims
        for action_key, cache_key in zip(self.action_keys, self.cache_keys):
            chunk = tensordict.get(cache_key)
            length = chunk.shape[dim]
            if self.n_steps is not None and length != self.n_steps:
                raise RuntimeError(
                    f"MultiStepActorWrapper: the actor's {cache_key!r} has {length} steps at dim {dim} (shape "
                    f"{list(chunk.shape)}), expected n_steps={self.n_steps}"
                )
            if self.replan_interval is not None and length < self.replan_interval:
                raise RuntimeError(
                    f"MultiStepActorWrapper: replan_interval={self.replan_interval} exceeds the chunk length {length}"
                )
            index = counter.reshape(tensordict.batch_size) - 1
            if self.n_steps is None and self.replan_interval is None:
                index = index.remainder(length)
            index = index.reshape(*index.shape, *([1] * (chunk.dim() - dim))).expand(
                *chunk.shape[:dim], 1, *chunk.shape[dim + 1:])
            action = chunk.gather(dim, index)
            tensordict.set(action_key, action if self.keep_dim else action.squeeze(dim))
        return tensordict

    def _replan(self, tensordict: TensorDictBase, replan: torch.Tensor) -> None:
        """Runs the actor on the rows in ``replan`` and stores their chunks in the cache."""
        rows = replan.reshape(tensordict.batch_size)
        if bool(rows.all()):
            output = self.actor(tensordict.copy())
            for chunk_key, cache_key in zip(self.chunk_keys, self.cache_keys):
                tensordict.set(cache_key, output.get(chunk_key))
            for key in self.actor.out_keys:  # the actor's other outputs (hidden states, logits...)
                if _norm(key) not in self.chunk_keys and _norm(key) not in self.action_keys:
                    tensordict.set(key, output.get(key))
            return
        caches = [tensordict.get(k, None) for k in self.cache_keys]
        if any(c is None for c in caches):
            raise RuntimeError(
                "MultiStepActorWrapper: only some rows start an episode, and the others have no cached chunk "
                f"({self.cache_keys}); the first call must start every row"
            )
        output = self.actor(tensordict[rows])
        for chunk_key, cache_key, cache in zip(self.chunk_keys, self.cache_keys, caches):
            new = cache.clone()
            new[rows] = output.get(chunk_key).to(cache.dtype)
            tensordict.set(cache_key, new)


def _as_list(keys: Any) -> list | None:
    if keys is None:
        return None
    return [_norm(k) for k in (keys if isinstance(keys, list) else [keys])]


def _action_from_chunk(key: NestedKey) -> NestedKey:
    """``"action_chunk" -> "action"``, ``(.., "vla_action", "chunk") -> "action"``; else the key."""
    if isinstance(key, tuple) and key[-2:] == ("vla_action", "chunk"):
        return "action"
    last = _last(key)
    if last.endswith("_chunk") and last != "_chunk":
        return _with_last(key, last[: -len("_chunk")])
    return key
