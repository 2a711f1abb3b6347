"""``EndOfLifeTransform`` (a life lost in an Atari-style game as a terminal signal for the
value targets) and ``ActionChunkTransform`` (action chunks of chunk policies)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from steersman.data import Categorical, Composite, Unbounded
from steersman.tensordict import TensorDictBase
from steersman.tensordict._utils import NestedKey, unravel_key

from ._utils import missing_key
from .base import Transform

__all__ = ["EndOfLifeTransform", "ActionChunkTransform"]


class EndOfLifeTransform(Transform):
    """Writes an end-of-life flag: True on a step where the game's life counter went down
    (or the episode ended).

    DQN-style agents use it in place of the terminal flag of the value targets
    (:meth:`register_keys` sets a loss's ``done``/``terminated`` keys to it) while the env
    keeps playing until the game is over: the flag is an observation, not a done entry,
    so it does not reset the env.

    The life count is read from the base env through ``eol_attribute``, a dotted path
    looked up on the wrapped simulator (``env._env`` of a gym wrapper) and then on the env
    itself; a callable is called. It is written at ``lives_key`` (int64 ``[*b, 1]``) and
    the flag at ``eol_key`` (bool, the shape of ``done_key``).

    Args:
        eol_key: the flag's entry (default ``"end-of-life"``).
        lives_key: the life counter's entry (default ``"lives"``).
        done_key: the done entry whose shape the flag takes (default ``"done"``).
        eol_attribute: default ``"unwrapped.ale.lives"`` (Gymnasium's Atari envs).

    Example:
        >>> import torch
        >>> from steersman.envs import TransformedEnv
        >>> from steersman.envs.transforms import EndOfLifeTransform
        >>> from steersman.envs.transforms.episodes import _LivesEnv
        >>> env = TransformedEnv(_LivesEnv(), EndOfLifeTransform(eol_attribute="lives"))
        >>> r = env.rollout(7, break_when_any_done=False)
        >>> r["next", "lives"].squeeze(-1).tolist()           # one life lost every 2 steps
        [3, 2, 2, 1, 1, 0, 3]
        >>> r["next", "end-of-life"].squeeze(-1).tolist()
        [False, True, False, True, False, True, False]
    """

    NO_PARENT_ERR = "EndOfLifeTransform reads the life counter from its env: it must be in an env"

    def __init__(self, eol_key: NestedKey = "end-of-life", lives_key: NestedKey = "lives",
                 done_key: NestedKey = "done", eol_attribute: str = "unwrapped.ale.lives") -> None:
        super().__init__()
        self.eol_key = unravel_key(eol_key)
        self.lives_key = unravel_key(lives_key)
        self.done_key = unravel_key(done_key)
        if not isinstance(eol_attribute, str) or not eol_attribute:
            raise TypeError(f"EndOfLifeTransform: eol_attribute must be a dotted attribute path, got {eol_attribute!r}")
        self.eol_attribute = eol_attribute

    def _get_lives(self) -> Tensor:
        parent = self.parent
        if parent is None:
            raise ValueError(self.NO_PARENT_ERR)
        base = parent.base_env
        subs = getattr(base, "_envs", None)  # a SerialEnv: one counter per sub-env
        envs = list(subs) if isinstance(subs, list) else [base]
        vals = [self._lookup(e) for e in envs]
        t = torch.stack([torch.as_tensor(v, dtype=torch.int64).reshape(-1) for v in vals]) if subs else \
            torch.as_tensor(vals[0], dtype=torch.int64)
        return t.to(parent.device).reshape(*parent.batch_size, 1)

    def _lookup(self, env: Any) -> Any:
        for root in (getattr(env, "_env", None), env):
            if root is None:
                continue
            obj: Any = root
            try:
                for part in self.eol_attribute.split("."):
                    obj = getattr(obj, part)
            except AttributeError:
                continue
            return obj() if callable(obj) else obj
        raise AttributeError(f"EndOfLifeTransform: the env {type(env).__name__} has no {self.eol_attribute!r} "
                             "(pass eol_attribute= the path of its life counter; a ParallelEnv's sub-envs are in "
                             "other processes: put the transform inside each sub-env)")

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        lives = self._get_lives()
        prev = tensordict.get(self.lives_key, None)
        done = next_tensordict.get(self.done_key, None)
        if done is None:
            raise missing_key(self, self.done_key, next_tensordict, "done_key")
        lost = torch.zeros_like(done) if prev is None else (lives < prev).reshape(done.shape)
        next_tensordict.set(self.eol_key, lost | done)
        next_tensordict.set(self.lives_key, lives)
        return next_tensordict

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        done = tensordict_reset.get(self.done_key, None)
        if done is None:
            raise missing_key(self, self.done_key, tensordict_reset, "done_key")
        tensordict_reset.set(self.eol_key, done.clone())
        tensordict_reset.set(self.lives_key, self._get_lives())
        return tensordict_reset

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        done_spec = self.parent.full_done_spec if self.parent is not None else None
        shape = (*observation_spec.shape, 1)
        if done_spec is not None and self.done_key in done_spec.keys(True, True):
            shape = done_spec[self.done_key].shape
        observation_spec.set(self.eol_key, Categorical(2, shape=shape, dtype=torch.bool,
                                                       device=observation_spec.device))
        observation_spec.set(self.lives_key, Unbounded(shape=(*observation_spec.shape, 1), dtype=torch.int64,
                                                       device=observation_spec.device))
        return observation_spec

    def register_keys(self, loss_or_advantage: Any) -> None:
        """Sets ``done`` and ``terminated`` of a loss (or value estimator) to the flag."""
        loss_or_advantage.set_keys(done=self.eol_key, terminated=self.eol_key)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        raise ValueError(self.NO_PARENT_ERR + " (it cannot be applied to a TensorDict on its own)")


class ActionChunkTransform(Transform):
    """Builds action chunks: for each step ``t``, the actions ``a[t], ..., a[t+H-1]``.

    Data path (``forward``, e.g. a replay-buffer sample ``[*B, T, A]`` whose rows are
    trajectory windows): writes ``chunk_key`` ``[*B, T, H, A]`` and ``pad_key``
    ``[*B, T, H]``, True where the chunk ran past the window or past the end of its
    trajectory (``("next", done_key)``), those steps repeating the last valid action.
    ``extend`` stores the raw per-step data (no ``inv``).

    In an env, the policy writes a chunk ``[*b, H, A]`` at ``chunk_key`` and the env
    executes its first action (re-planning every step; use :class:`MultiAction` to
    execute whole chunks).

    Args:
        chunk_size: ``H``.
        action_key: the per-step action (default ``"action"``).
        chunk_key: default ``("vla_action", "chunk")``.
        pad_key: default ``"action_is_pad"``.
        time_dim: the time dim of the action tensor (the action dim comes right after it;
            default -2).
        done_key: chunks do not cross ``("next", done_key)`` when it is present (None:
            ignored).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs.transforms import ActionChunkTransform
        >>> td = TensorDict({"action": torch.arange(4.0).view(1, 4, 1),
        ...                  ("next", "done"): torch.tensor([False, True, False, False]).view(1, 4, 1)}, [1, 4])
        >>> out = ActionChunkTransform(3)(td)
        >>> out["vla_action", "chunk"][0, :, :, 0]
        tensor([[0., 1., 1.],
                [1., 1., 1.],
                [2., 3., 3.],
                [3., 3., 3.]])
        >>> out["action_is_pad"][0]
        tensor([[False, False,  True],
                [False,  True,  True],
                [False, False,  True],
                [False,  True,  True]])
    """

    def __init__(self, chunk_size: int, *, action_key: NestedKey = "action",
                 chunk_key: NestedKey = ("vla_action", "chunk"), pad_key: NestedKey = "action_is_pad",
                 time_dim: int = -2, done_key: NestedKey | None = "done") -> None:
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"ActionChunkTransform: chunk_size must be an int >= 1, got {chunk_size!r}")
        self.action_key = unravel_key(action_key)
        self.chunk_key = unravel_key(chunk_key)
        super().__init__(in_keys_inv=[self.action_key], out_keys_inv=[self.chunk_key])
        self.chunk_size = chunk_size
        self.pad_key = unravel_key(pad_key)
        self.time_dim = int(time_dim)
        self.done_key = None if done_key is None else unravel_key(done_key)

    def _chunks(self, actions: Tensor, done: Tensor | None) -> tuple[Tensor, Tensor]:
        tdim = self.time_dim % actions.ndim
        a = actions.movedim(tdim, -2)  # [..., T, A]
        T = a.shape[-2]
        t = torch.arange(T, device=a.device)
        if done is not None:
            d = done.reshape(a.shape[:-1]).to(torch.bool)
            end = d.clone()
            end[..., -1] = True
        else:
            end = torch.zeros(a.shape[:-1], dtype=torch.bool, device=a.device)
            end[..., -1] = True
        # last step of the trajectory of each t: first end at or after t
        end_at = torch.where(end, t, torch.full_like(end, T, dtype=torch.long)).flip(-1).cummin(-1).values.flip(-1)
        k = torch.arange(self.chunk_size, device=a.device)
        want = t.unsqueeze(-1) + k  # [T, H]
        idx = torch.minimum(want.expand(*end_at.shape, self.chunk_size), end_at.unsqueeze(-1))  # [..., T, H]
        pad = want.expand_as(idx) > end_at.unsqueeze(-1)
        flat = idx.reshape(*idx.shape[:-2], -1)  # [..., T*H]
        gathered = a.gather(-2, flat.unsqueeze(-1).expand(*flat.shape, a.shape[-1]))
        chunk = gathered.reshape(*idx.shape, a.shape[-1])  # [..., T, H, A]
        chunk = chunk.movedim(-3, tdim)
        pad = pad.movedim(-2, tdim)
        return chunk, pad

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        actions = tensordict.get(self.action_key, None)
        if actions is None:
            raise missing_key(self, self.action_key, tensordict, "action_key")
        if actions.ndim < 2:
            raise ValueError(f"ActionChunkTransform: the actions must be [*B, T, action_dim], got {list(actions.shape)}")
        done = None
        if self.done_key is not None:
            done = tensordict.get(("next", *((self.done_key,) if isinstance(self.done_key, str)
                                            else self.done_key)), None)
        chunk, pad = self._chunks(actions, done)
        tensordict.set(self.chunk_key, chunk)
        tensordict.set(self.pad_key, pad)
        return tensordict

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        chunk = tensordict.get(self.chunk_key, None)
        if chunk is None:
            raise missing_key(self, self.chunk_key, tensordict, "chunk_key")
        tensordict.set(self.action_key, chunk.select(-2, 0))
        return tensordict

    def transform_action_spec(self, action_spec: Composite) -> Composite:
        spec = action_spec.get(self.action_key, None)
        if spec is None:
            raise missing_key(self, self.action_key, action_spec, "action_key")
        s = spec.unsqueeze(spec.ndim - 1)
        shape = list(s.shape)
        shape[-2] = self.chunk_size
        action_spec.del_(self.action_key)
        action_spec.set(self.chunk_key, s.expand(*shape))
        return action_spec

    def __repr__(self) -> str:
        return f"ActionChunkTransform(chunk_size={self.chunk_size}, chunk_key={self.chunk_key!r})"


class _LivesEnv:
    """Built lazily: a tiny env with a life counter (3 lives, one lost every 2 steps; the
    game ends when none is left), for the examples and tests."""

    def __new__(cls, batch_size: Any = ()) -> Any:
        from steersman.data import Bounded
        from steersman.envs import EnvBase
        from steersman.tensordict import TensorDict

        class LivesEnv(EnvBase):
            def __init__(self) -> None:
                super().__init__(batch_size=batch_size)
                bs = self.batch_size
                self.observation_spec = Composite(observation=Bounded(0.0, 10.0, shape=(*bs, 1)), shape=bs)
                self.action_spec = Bounded(-1.0, 1.0, shape=(*bs, 1))
                self.reward_spec = Unbounded(shape=(*bs, 1))
                self.t = torch.zeros(*bs, 1)

            @property
            def lives(self) -> Tensor:
                return (3 - torch.div(self.t, 2, rounding_mode="floor")).clamp(min=0).long()

            def _reset(self, tensordict: Any, **kwargs: Any) -> Any:
                mask = self._reset_mask(tensordict)
                self.t = torch.zeros_like(self.t) if mask is None else torch.where(mask.unsqueeze(-1), 0.0, self.t)
                return TensorDict(observation=self.t.clone(), batch_size=self.batch_size)

            def _step(self, tensordict: Any) -> Any:
                self.t = self.t + 1
                done = self.lives == 0
                return TensorDict(observation=self.t.clone(), reward=torch.ones_like(self.t), done=done,
                                  terminated=done.clone(), truncated=torch.zeros_like(done),
                                  batch_size=self.batch_size)

            def _set_seed(self, seed: int | None) -> None:
                pass

        return LivesEnv()
