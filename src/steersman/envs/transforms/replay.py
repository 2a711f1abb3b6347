"""Replay-buffer transforms (refused in an env): Reward2GoTransform (on writes, through ``inv``),
RandomCropTensorDict and BurnInTransform (on samples)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from steersman.data import Composite
from steersman.tensordict import TensorDictBase
from steersman.tensordict._utils import NestedKey, unravel_key

from ._utils import key_list, missing_key
from .base import Transform

__all__ = ["Reward2GoTransform", "RandomCropTensorDict", "BurnInTransform"]


def _next(key: NestedKey) -> tuple:
    return ("next", *((key,) if type(key) is str else key))


class Reward2GoTransform(Transform):
    """Writes the discounted reward-to-go of each step of finished trajectories.

    ``G_t = r_t + gamma * G_{t+1}``, restarting after each step whose done (or truncated)
    flag is set: the sum of the discounted rewards from ``t`` to the end of its episode.
    The last batch dim is time. An inverse-only transform (as in TorchRL): it runs in
    :meth:`inv`, i.e. when a replay buffer writes data (``extend``); sampling returns the
    stored values unchanged. It cannot be used in an env (the future rewards are not
    known while stepping). A trajectory cut by the end of the batch is treated as ending
    there.

    Args:
        gamma: the discount factor (default 1.0).
        in_keys: the reward entries (default ``[("next", "reward")]``).
        out_keys: where the reward-to-go goes (default: ``in_keys``).
        done_key: the done flag, read under ``"next"`` (default ``"done"``).
        truncated_key: also ends episodes when present under ``"next"`` (default
            ``"truncated"``).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs.transforms import Reward2GoTransform
        >>> td = TensorDict({"next": {"reward": torch.ones(4, 1),
        ...                           "done": torch.tensor([[False], [True], [False], [False]])}},
        ...                 batch_size=[4])
        >>> Reward2GoTransform(gamma=0.5, out_keys=["r2g"]).inv(td)["r2g"].squeeze(-1)
        tensor([1.5000, 1.0000, 1.5000, 1.0000])
    """

    def __init__(self, gamma: float | Tensor = 1.0, in_keys: Any = None, out_keys: Any = None,
                 done_key: NestedKey = "done", truncated_key: NestedKey = "truncated") -> None:
        g = torch.as_tensor(gamma, dtype=torch.get_default_dtype())
        if g.numel() != 1 or not bool(g.isfinite().all()):
            raise ValueError(f"Reward2GoTransform: gamma must be one finite number, got {gamma!r}")
        in_keys = key_list([("next", "reward")] if in_keys is None else in_keys, "Reward2GoTransform", "in_keys")
        out_keys = in_keys if out_keys is None else out_keys
        super().__init__(in_keys, out_keys, in_keys, out_keys)
        self._pairs  # noqa: B018  (validates the lengths now)
        self.register_buffer("gamma", g.reshape(()))
        self.done_key = unravel_key(done_key)
        self.truncated_key = None if truncated_key is None else unravel_key(truncated_key)

    def _episode_end(self, td: TensorDictBase) -> Tensor:
        """``[*batch, T]`` bool: True where the step ends an episode."""
        done = td.get(_next(self.done_key), None)
        if done is None:
            raise missing_key(self, _next(self.done_key), td, "done_key")
        bs = td.batch_size
        end = done.reshape(*bs, -1).any(-1)
        if self.truncated_key is not None:
            trunc = td.get(_next(self.truncated_key), None)
            if trunc is not None:
                end = end | trunc.reshape(*bs, -1).any(-1)
        return end

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        if tensordict.batch_dims == 0:
            raise ValueError("Reward2GoTransform needs a trajectory: a TensorDict whose last batch dim is "
                             "time (got batch_size [])")
        end = self._episode_end(tensordict)
        tdim = tensordict.batch_dims - 1
        T = tensordict.batch_size[-1]
        for ik, ok in self._pairs:
            r = tensordict.get(ik, None)
            if r is None:
                raise missing_key(self, ik, tensordict)
            g = self.gamma.to(device=r.device, dtype=r.dtype if r.is_floating_point() else self.gamma.dtype)
            rf = r.to(g.dtype)
            cont = (~end).reshape(*end.shape, *([1] * (r.ndim - end.ndim))).to(g.dtype)
            out = torch.empty_like(rf)
            acc = torch.zeros_like(rf.select(tdim, 0))
            for t in range(T - 1, -1, -1):
                acc = rf.select(tdim, t) + g * acc * cont.select(tdim, t)
                out.select(tdim, t).copy_(acc)
            tensordict.set(ok, out)
        return tensordict

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Sampling: the stored values are returned unchanged (the work is done in ``inv``)."""
        return tensordict

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        raise ValueError("Reward2GoTransform cannot be used in an env: the reward-to-go needs the rewards of "
                         "the whole trajectory; use it as a replay-buffer transform (it runs on extend)")

    def __repr__(self) -> str:
        return (f"Reward2GoTransform(gamma={float(self.gamma)}, in_keys={self.in_keys}, "
                f"out_keys={self.out_keys}, done_key={self.done_key!r})")


class RandomCropTensorDict(Transform):
    """Cuts a random sub-trajectory of ``sub_seq_len`` steps out of each trajectory of a sample.

    For a TensorDict ``[*B, T]`` (time at ``sample_dim``), each of the ``*B`` trajectories
    gets its own uniformly drawn start ``s`` in ``[0, T - sub_seq_len]`` and the result
    holds steps ``s .. s + sub_seq_len - 1``: ``[*B, sub_seq_len]``. With ``mask_key``
    (a bool ``[*B, T]`` entry, True on the valid steps, which come first), the window
    lies inside the valid steps of each trajectory when it has at least
    ``sub_seq_len`` of them (otherwise it starts at 0). For replay buffers and modules;
    it cannot be used in an env. Draws come from torch's global RNG (seed it with
    ``torch.manual_seed``).

    Args:
        sub_seq_len: the length of the sub-trajectories.
        sample_dim: the time dim (a batch dim; negative preferred, default -1).
        mask_key: the valid-step mask entry (default: none).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs.transforms import RandomCropTensorDict
        >>> td = TensorDict(t=torch.arange(10).expand(3, 10), batch_size=[3, 10])
        >>> out = RandomCropTensorDict(4)(td)
        >>> out.batch_size, bool((out["t"].diff(dim=-1) == 1).all())
        (torch.Size([3, 4]), True)
    """

    def __init__(self, sub_seq_len: int, sample_dim: int = -1, mask_key: NestedKey | None = None) -> None:
        if isinstance(sub_seq_len, bool) or not isinstance(sub_seq_len, int) or sub_seq_len < 1:
            raise ValueError(f"RandomCropTensorDict: sub_seq_len must be a positive int, got {sub_seq_len!r}")
        if isinstance(sample_dim, bool) or not isinstance(sample_dim, int):
            raise TypeError(f"RandomCropTensorDict: sample_dim must be an int, got {sample_dim!r}")
        super().__init__()
        self.sub_seq_len = sub_seq_len
        self.sample_dim = sample_dim
        self.mask_key = None if mask_key is None else unravel_key(mask_key)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        nb = tensordict.batch_dims
        dim = self.sample_dim + nb if self.sample_dim < 0 else self.sample_dim
        if not 0 <= dim < nb:
            raise ValueError(f"RandomCropTensorDict: sample_dim={self.sample_dim} is not a batch dim of a "
                             f"TensorDict with batch_size {list(tensordict.batch_size)}")
        T = tensordict.batch_size[dim]
        L = self.sub_seq_len
        if T < L:
            raise ValueError(f"RandomCropTensorDict: the trajectories have {T} steps (dim {self.sample_dim}), "
                             f"fewer than sub_seq_len={L}")
        bs = tensordict.batch_size
        lead = torch.Size(bs[:dim] + bs[dim + 1:])  # one trajectory per element
        if self.mask_key is not None:
            mask = tensordict.get(self.mask_key, None)
            if mask is None:
                raise missing_key(self, self.mask_key, tensordict, "mask_key")
            valid = mask.reshape(*bs, -1).any(-1).sum(dim)
            last = (valid - L).clamp_min(0)
        else:
            last = torch.full(lead, T - L, dtype=torch.int64)
        start = (torch.rand(lead) * (last.to(torch.float64) + 1)).floor().to(torch.int64)
        start = torch.minimum(start, last)
        steps = torch.arange(L).reshape([L if i == dim else 1 for i in range(nb)])
        idx = start.unsqueeze(dim) + steps  # [*bs with T -> L]
        new_bs = torch.Size((*bs[:dim], L, *bs[dim + 1:]))

        def crop(x: Tensor) -> Tensor:
            i = idx.to(x.device).reshape(*idx.shape, *([1] * (x.ndim - nb)))
            return x.gather(dim, i.expand(*new_bs, *x.shape[nb:]))

        return tensordict.apply(crop, batch_size=new_bs)

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self.forward(tensordict)

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        raise ValueError("RandomCropTensorDict cannot be used in an env: it crops trajectories; use it as a "
                         "replay-buffer or module transform")

    def __repr__(self) -> str:
        return (f"RandomCropTensorDict(sub_seq_len={self.sub_seq_len}, sample_dim={self.sample_dim}, "
                f"mask_key={self.mask_key!r})")


class BurnInTransform(Transform):
    """Refreshes recurrent states of sampled sequences by running the first ``burn_in`` steps.

    For a sampled TensorDict ``[*B, T]`` (time last), the modules run (without gradients)
    on steps ``0 .. burn_in - 1``; the recurrent states they write for the next step
    (``("next", key)`` at step ``burn_in - 1``) become ``key`` at the first of the
    remaining steps, and the result is those ``T - burn_in`` steps. For replay buffers
    (sampled slices whose stored states are stale); it cannot be used in an env.

    Args:
        modules: modules run in order on the burn-in steps (sequence-aware, as
            recurrent modules are).
        burn_in: the number of steps to burn in (``0 < burn_in < T``).
        out_keys: the state keys to carry over (default: every ``("next", key)`` among
            the modules' ``out_keys``, as ``key``).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs.transforms import BurnInTransform
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> acc = TensorDictModule(lambda h, o: h[..., :1, :] + o.cumsum(-2),  # h_{t+1} = h_t + o_t
        ...                        in_keys=["hidden", "observation"], out_keys=[("next", "hidden")])
        >>> td = TensorDict(observation=torch.ones(5, 1), hidden=torch.zeros(5, 1), batch_size=[5])
        >>> out = BurnInTransform([acc], burn_in=3)(td)
        >>> out.batch_size, out["hidden"][0]          # 3 steps of +1 burnt in
        (torch.Size([2]), tensor([3.]))
    """

    def __init__(self, modules: Any, burn_in: int, out_keys: Any = None) -> None:
        if isinstance(burn_in, bool) or not isinstance(burn_in, int) or burn_in < 1:
            raise ValueError(f"BurnInTransform: burn_in must be a positive int, got {burn_in!r}")
        modules = list(modules) if isinstance(modules, (list, tuple)) else [modules]
        if not modules or not all(callable(m) for m in modules):
            raise TypeError("BurnInTransform: modules must be a non-empty sequence of TensorDict modules")
        if out_keys is None:
            out_keys = []
            for m in modules:
                for k in getattr(m, "out_keys", []):
                    k = unravel_key(k)
                    if type(k) is tuple and k[0] == "next" and len(k) > 1:
                        out_keys.append(k[1] if len(k) == 2 else k[1:])
            if not out_keys:
                raise ValueError("BurnInTransform: the modules write no ('next', key) entry; pass out_keys")
        super().__init__([], out_keys)
        self.modules_list = torch.nn.ModuleList([m for m in modules if isinstance(m, torch.nn.Module)])
        self.__dict__["_modules_seq"] = modules
        self.burn_in = burn_in

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        if tensordict.batch_dims == 0:
            raise ValueError("BurnInTransform needs sequences: a TensorDict whose last batch dim is time "
                             "(got batch_size [])")
        T = tensordict.batch_size[-1]
        k = self.burn_in
        if k >= T:
            raise ValueError(f"BurnInTransform: burn_in={k} leaves no step of sequences of length {T}")
        head = tensordict[..., :k].clone()
        with torch.no_grad():
            for m in self.__dict__["_modules_seq"]:
                out = m(head)
                head = head if out is None else out
        rest = tensordict[..., k:].clone()
        for key in self.out_keys:
            nk = _next(key)
            v = head.get(nk, None)
            if v is None:
                raise missing_key(self, nk, head, "out_keys (the modules' ('next', key) outputs)")
            cur = rest.get(key, None)
            state = v.select(tensordict.batch_dims - 1, k - 1)  # the state after the last burn-in step
            if cur is None:
                cur = torch.zeros((*rest.batch_size, *state.shape[tensordict.batch_dims - 1:]),
                                  dtype=state.dtype, device=state.device)
            cur = cur.clone()
            cur.select(tensordict.batch_dims - 1, 0).copy_(state)
            rest.set(key, cur)
        return rest

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self.forward(tensordict)

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        raise ValueError("BurnInTransform cannot be used in an env: it burns in sampled sequences; use it as a "
                         "replay-buffer transform")

    def __repr__(self) -> str:
        return f"BurnInTransform(burn_in={self.burn_in}, out_keys={self.out_keys})"
