"""Transforms that decide whether and how often the parent env steps: ``ConditionalSkip``
(skip steps), ``MultiAction`` (a chunk of actions per step) and ``ConditionalPolicySwitch``
(another policy plays the steps that meet a condition).

Skipped steps use the ``"_step"`` entry of the step input: ``TransformedEnv`` steps only
the elements whose ``"_step"`` is True (all of them through SerialEnv/ParallelEnv, which
step only the selected workers, or a stateless env); a skipped element keeps its
observations and done flags, gets a zero reward, and the transforms of that env do not
run on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from steersman.data import Composite
from steersman.tensordict import TensorDictBase
from steersman.tensordict._utils import NestedKey, unravel_key

from ._utils import missing_key
from .base import Transform

__all__ = ["ConditionalSkip", "MultiAction", "ConditionalPolicySwitch"]


def _as_mask(value: Any, batch_size: torch.Size, owner: str) -> Tensor:
    m = torch.as_tensor(value).to(torch.bool)
    nb = len(batch_size)
    if m.ndim > nb:
        m = m.reshape(*m.shape[:nb], -1).any(-1) if nb else m.any()
    try:
        return m.expand(batch_size) if nb else m.reshape(())
    except RuntimeError:
        raise ValueError(f"{owner}: the condition returned shape {list(m.shape)}, expected one value per "
                         f"element of the batch {list(batch_size)}") from None


class ConditionalSkip(Transform):
    """Skips the env's step for the elements where ``cond(tensordict)`` is True.

    ``cond`` sees the step input (the root TensorDict, with the action) and returns a bool
    or a bool tensor with one value per element of the batch. Skipped elements keep their
    observations and done flags and get a zero reward; the transforms of the same
    ``TransformedEnv`` do not run on them either (wrap the env in another
    ``TransformedEnv`` for transforms that should see every step). A batch where only some
    elements skip needs a base env that can step part of its batch (SerialEnv,
    ParallelEnv, a stateless env); a vectorized env raises a ``ValueError``.

    Args:
        cond: ``td -> bool | Tensor`` (True: skip).

    Example:
        >>> import torch
        >>> from steersman.envs import PendulumEnv, TransformedEnv
        >>> from steersman.envs.transforms import Compose, ConditionalSkip, StepCounter
        >>> inner = TransformedEnv(PendulumEnv(seed=0), StepCounter(step_count_key="inner_count"))
        >>> env = TransformedEnv(TransformedEnv(inner, ConditionalSkip(lambda td: td["step_count"] % 2 == 1)),
        ...                      StepCounter())
        >>> r = env.rollout(6)
        >>> r["step_count"].squeeze(-1).tolist(), r["inner_count"].squeeze(-1).tolist()
        ([0, 1, 2, 3, 4, 5], [0, 1, 1, 2, 2, 3])
    """

    _writes_step_mask = True

    def __init__(self, cond: Callable[[TensorDictBase], bool | Tensor]) -> None:
        if not callable(cond):
            raise TypeError(f"ConditionalSkip: cond must be callable, got {type(cond).__name__}")
        super().__init__()
        self.cond = cond

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        skip = _as_mask(self.cond(tensordict), tensordict.batch_size, "ConditionalSkip")
        tensordict.set("_step", ~skip)
        return tensordict

    @property
    def _has_inv(self) -> bool:
        return True

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        return next_tensordict

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict

    def __repr__(self) -> str:
        return f"ConditionalSkip(cond={self.cond!r})"


class _ParentStepper:
    """Shared loop of MultiAction and ConditionalPolicySwitch: steps ``parent`` with a
    ``"_step"`` mask once some elements must not step."""

    @staticmethod
    def step(parent: Any, td: TensorDictBase, active: Tensor | None) -> TensorDictBase:
        if active is not None and not bool(active.all()):
            td = td.copy()
            td.set("_step", active)
        return parent._step(td)

    @staticmethod
    def done(parent: Any, next_td: TensorDictBase) -> Tensor:
        """``[*batch]`` bool: the elements whose ``done`` entries are set."""
        nb = len(parent.batch_size)
        out = torch.zeros(parent.batch_size, dtype=torch.bool, device=parent.device)
        for key in parent.done_keys:
            last = key if isinstance(key, str) else key[-1]
            v = next_td.get(key, None) if last == "done" else None
            if v is not None:
                out = out | v.reshape(*v.shape[:nb], -1).any(-1)
        return out


class MultiAction(Transform):
    """Executes a chunk of actions per step: the policy writes ``n`` actions stacked along
    dim ``dim`` after the batch dims, and the parent env steps once per action.

    The outer step returns the last step's observations (or all of them stacked along the
    same dim with ``stack_observations``) and the rewards of the ``n`` steps stacked
    (``stack_rewards``, default) or the last one. When an element is done inside the
    chunk, its remaining actions are skipped (``"_step"`` mask): its outputs are those of
    the done step, and its skipped rewards are zero (a dense ``n``-long stack, where
    TorchRL gives a ragged one). Transforms placed before MultiAction run on every inner
    step, those after it once per chunk.

    Args:
        dim: the chunk dim, counted from the first dim after the batch dims (``>= 1``).
        stack_rewards, stack_observations: see above.
        action_key: the one-step action of the env (default: the env's action key).
        chunk_key: where the policy writes the chunk (default: ``action_key``).
        chunk_size: the chunk length the specs declare (default 1; a policy may write
            chunks of any length, the specs then describe chunks of ``chunk_size``; an
            action without the chunk dim is a chunk of one).

    Example:
        >>> import torch
        >>> from steersman.envs import PendulumEnv, TransformedEnv, check_env_specs
        >>> from steersman.envs.transforms import MultiAction, StepCounter
        >>> env = TransformedEnv(PendulumEnv(seed=0), StepCounter())
        >>> env.append_transform(MultiAction(chunk_size=3))   # doctest: +ELLIPSIS
        TransformedEnv(...)
        >>> td = env.reset()
        >>> td["action"] = torch.zeros(3, 1)                  # 3 actions
        >>> out = env.step(td)
        >>> out["next", "step_count"].item(), out["next", "reward"].shape
        (3, torch.Size([3, 1]))
        >>> check_env_specs(env)
    """

    def __init__(self, *, dim: int = 1, stack_rewards: bool = True, stack_observations: bool = False,
                 action_key: NestedKey | None = None, chunk_key: NestedKey | None = None,
                 chunk_size: int | None = None) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"MultiAction: dim must be an int >= 1, got {dim!r}")
        if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int)
                                       or chunk_size < 1):
            raise ValueError(f"MultiAction: chunk_size must be an int >= 1, got {chunk_size!r}")
        super().__init__()
        self.dim = dim
        self.stack_rewards = bool(stack_rewards)
        self.stack_observations = bool(stack_observations)
        self.action_key = None if action_key is None else unravel_key(action_key)
        self.chunk_key = None if chunk_key is None else unravel_key(chunk_key)
        self.chunk_size = 1 if chunk_size is None else chunk_size

    def _keys(self) -> tuple[list, list]:
        parent = self.parent
        acts = [self.action_key] if self.action_key is not None else list(parent.action_keys)
        chunks = [self.chunk_key] if self.chunk_key is not None else acts
        if len(chunks) != len(acts):
            raise ValueError(f"MultiAction: chunk_key {chunks} and action keys {acts} differ in length")
        return acts, chunks

    def _macro_step(self, tensordict: TensorDictBase, parent: Any) -> TensorDictBase:
        acts, chunks = self._keys()
        nb = len(parent.batch_size)
        cdim = nb + self.dim - 1
        base_spec = parent.full_action_spec
        chunk_vals = []
        n = None
        for a, c in zip(acts, chunks):
            v = tensordict.get(c, None)
            if v is None:
                raise missing_key(self, c, tensordict, "chunk_key")
            if v.ndim == base_spec[a].ndim:  # no chunk dim: a chunk of one
                v = v.unsqueeze(cdim)
            if n is None:
                n = v.shape[cdim]
            elif v.shape[cdim] != n:
                raise ValueError(f"MultiAction: the chunks have different lengths ({n} and {v.shape[cdim]} at {c!r})")
            chunk_vals.append(v)
        cur = tensordict.exclude(*[c for c in chunks if c not in acts])
        if self.stack_observations:  # the root holds the previous chunk's stack: its last step
            for key in self._obs_keys(parent):
                v = cur.get(key, None)
                if v is not None and v.ndim > parent.full_observation_spec[key].ndim:
                    cur.set(key, v.select(cdim, -1))
        active = None
        outs = []
        next_td = None
        for i in range(n):
            step_in = cur.copy()
            for a, v in zip(acts, chunk_vals):
                step_in.set(a, v.select(cdim, i))
            next_td = _ParentStepper.step(parent, step_in, active)
            outs.append(next_td)
            done = _ParentStepper.done(parent, next_td)
            active = ~done if active is None else active & ~done
            if i == n - 1 or not bool(active.any()):
                break
            step_in.set("next", next_td)
            cur = parent._step_mdp(step_in)
        last = outs[-1].copy()
        zeros = None
        if len(outs) < n:
            zeros = outs[-1].apply(torch.zeros_like)
        full = outs + [zeros] * (n - len(outs))
        if self.stack_rewards:
            for key in parent.reward_keys:
                last.set(key, torch.stack([o.get(key) for o in full], cdim))
        if self.stack_observations:
            for key in self._obs_keys(parent):
                last.set(key, torch.stack([o.get(key) if o is not zeros else outs[-1].get(key) for o in full], cdim))
        return last

    @staticmethod
    def _obs_keys(parent: Any) -> list:
        """The observations stacked by ``stack_observations`` (not the state entries, e.g. a
        step counter, which the next step reads back)."""
        state = set(parent.state_keys)
        return [k for k in parent.observation_keys if k not in state]

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        if not self.stack_observations:
            return tensordict_reset
        parent = self.parent
        nb = len(parent.batch_size)
        for key in self._obs_keys(parent):
            v = tensordict_reset.get(key, None)
            if v is not None and v.ndim == parent.full_observation_spec[key].ndim:
                v = v.unsqueeze(nb + self.dim - 1)
                shape = list(v.shape)
                shape[nb + self.dim - 1] = self.chunk_size
                tensordict_reset.set(key, v.expand(*shape).clone())
        return tensordict_reset

    def _stacked(self, spec: Composite, nb: int) -> Composite:
        for key, leaf in list(spec.items(include_nested=True, leaves_only=True)):
            s = leaf.unsqueeze(nb + self.dim - 1)
            shape = list(s.shape)
            shape[nb + self.dim - 1] = self.chunk_size
            spec.set(key, s.expand(*shape))
        return spec

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        nb = len(output_spec.shape)
        if self.stack_rewards:
            output_spec["full_reward_spec"] = self._stacked(output_spec["full_reward_spec"], nb)
        if self.stack_observations:
            obs = output_spec["full_observation_spec"]
            state = set(self.parent.state_keys) if self.parent is not None else set()
            sub = Composite(shape=obs.shape, device=obs.device)
            for key, leaf in obs.items(include_nested=True, leaves_only=True):
                if key not in state:
                    sub.set(key, leaf)
            for key, leaf in self._stacked(sub, nb).items(include_nested=True, leaves_only=True):
                obs.set(key, leaf)
        return output_spec

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        nb = len(input_spec.shape)
        aspec = input_spec["full_action_spec"]
        acts = [self.action_key] if self.action_key is not None else \
            list(aspec.keys(include_nested=True, leaves_only=True))
        chunks = [self.chunk_key] if self.chunk_key is not None else acts
        for a, c in zip(acts, chunks):
            leaf = aspec.get(a, None)
            if leaf is None:
                raise missing_key(self, a, aspec, "action_key")
            s = leaf.unsqueeze(nb + self.dim - 1)
            shape = list(s.shape)
            shape[nb + self.dim - 1] = self.chunk_size
            if c != a:
                aspec.del_(a)
            aspec.set(c, s.expand(*shape))
        return input_spec

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict

    def __repr__(self) -> str:
        return (f"MultiAction(dim={self.dim}, stack_rewards={self.stack_rewards}, "
                f"stack_observations={self.stack_observations}, chunk_size={self.chunk_size})")


class ConditionalPolicySwitch(Transform):
    """Lets ``policy`` play the steps whose input meets ``condition`` (e.g. the other
    player's turns): after each step of the env, while ``condition(next state)`` holds for
    an element that is not done, ``policy`` acts on it and the parent env steps again
    (only those elements, through the ``"_step"`` mask). The outer step returns the state
    where the main policy is to act again.

    Args:
        policy: ``td -> td`` writing the action(s).
        condition: ``td -> bool | Tensor`` (one value per element).

    It must be in an env. Place it last, so that ``policy`` sees transformed data.

    Example:
        >>> import torch
        >>> from steersman.envs import PendulumEnv, TransformedEnv
        >>> from steersman.envs.transforms import Compose, ConditionalPolicySwitch, StepCounter
        >>> switch = lambda td: td.set("action", torch.full((1,), 2.0))   # the other policy
        >>> env = TransformedEnv(PendulumEnv(seed=0), Compose(
        ...     StepCounter(step_count_key="total"),
        ...     ConditionalPolicySwitch(switch, condition=lambda td: td["total"] % 2 == 1),
        ...     StepCounter(step_count_key="main")))
        >>> r = env.rollout(4, lambda td: td.set("action", torch.zeros(1)))
        >>> r["total"].squeeze(-1).tolist(), r["main"].squeeze(-1).tolist()
        ([0, 2, 4, 6], [0, 1, 2, 3])
    """

    def __init__(self, policy: Callable[[TensorDictBase], TensorDictBase],
                 condition: Callable[[TensorDictBase], bool | Tensor]) -> None:
        if not callable(policy) or not callable(condition):
            raise TypeError("ConditionalPolicySwitch: policy and condition must be callables")
        super().__init__()
        self.policy = policy
        self.condition = condition

    def _macro_step(self, tensordict: TensorDictBase, parent: Any) -> TensorDictBase:
        next_td = parent._step(tensordict)
        bs = parent.batch_size
        cur = tensordict
        for _ in range(10_000):
            done = _ParentStepper.done(parent, next_td)
            go = _as_mask(self.condition(next_td), bs, "ConditionalPolicySwitch") & ~done
            if not bool(go.any()):
                return next_td
            step_in = cur.copy()
            step_in.set("next", next_td)
            cur = parent._step_mdp(step_in)
            out = self.policy(cur.copy())
            cur = cur if out is None else out
            next_td = _ParentStepper.step(parent, cur, go)
        raise RuntimeError("ConditionalPolicySwitch: the condition held for 10000 consecutive steps")

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        parent = self.parent
        bs = parent.batch_size
        for _ in range(10_000):
            go = _as_mask(self.condition(tensordict_reset), bs, "ConditionalPolicySwitch")
            if not bool(go.any()):
                return tensordict_reset
            out = self.policy(tensordict_reset.copy())
            step_in = tensordict_reset if out is None else out
            next_td = _ParentStepper.step(parent, step_in, go)
            step_in = step_in.copy()
            step_in.set("next", next_td)
            tensordict_reset = parent._step_mdp(step_in)
        raise RuntimeError("ConditionalPolicySwitch: the condition held for 10000 consecutive steps after reset")

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        return output_spec

    def __repr__(self) -> str:
        return f"ConditionalPolicySwitch(policy={self.policy!r}, condition={self.condition!r})"
