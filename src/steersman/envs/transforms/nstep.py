"""Replay-buffer transforms over time: ``MultiStepTransform`` (n-step returns across
``extend`` calls), ``NextStateReconstructor`` (rebuilds ``("next", obs)`` from the next
position of a sample) and ``NextObservationDelta`` (stores ``("next", obs)`` as a
low-precision delta; env side and sample side)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from steersman.data import Composite, Unbounded
from steersman.tensordict import TensorDictBase, is_tensor_collection
from steersman.tensordict._utils import NestedKey, unravel_key

from ._utils import key_list, missing_key
from .base import Transform

__all__ = ["MultiStepTransform", "NextStateReconstructor", "NextObservationDelta", "n_step_returns"]

DEFAULT_DONE_KEYS = ["done", "truncated", "terminated"]


def _tup(key: NestedKey) -> tuple:
    return (key,) if isinstance(key, str) else tuple(key)


def _gather_time(leaf: Tensor, index: Tensor, dim: int) -> Tensor:
    extra = leaf.shape[index.ndim:]
    idx = index.reshape(*index.shape, *([1] * len(extra))).expand(*index.shape, *extra)
    return leaf.gather(dim, idx)


def n_step_returns(td: TensorDictBase, n_steps: int, gamma: float, *, reward_keys: Sequence[NestedKey] = ("reward",),
                   done_key: NestedKey = "done", mask_key: NestedKey | None = "mask") -> TensorDictBase:
    """The n-step rewrite of a ``[*B, T]`` batch (time last), on a shallow copy.

    For step ``t``, the window ``t .. t+m-1`` holds ``m = min(n_steps, steps to the end of
    its trajectory)`` steps (a trajectory ends at a step whose ``("next", done_key)`` is set,
    or at the end of the batch). Each ``("next", r)`` of ``reward_keys`` becomes
    ``sum_k gamma**k r[t+k]`` over the window (its old value is kept as
    ``("next", "original_<r>")``), every other ``"next"`` entry is that of step ``t+m-1``
    (done flags included: a window reaching a terminal state is terminal), and
    ``"steps_to_next_obs"`` = ``m``, ``"gamma"`` = ``gamma**m``, ``"nonterminal"`` = False on
    the last step of each trajectory (and where ``mask_key`` is False).
    """
    T, dim = td.batch_size[-1], td.batch_dims - 1
    td = td.copy()
    nxt = td.get("next").copy()
    td.set("next", nxt)
    done = nxt.get(done_key, None)
    if done is None:
        raise missing_key("MultiStepTransform", ("next", *_tup(done_key)), td, "done_key")
    done = done.reshape(*td.batch_size, -1).any(-1)
    t = torch.arange(T, device=done.device).expand_as(done)
    end = done.clone()
    end[..., -1] = True
    end_at = torch.where(end, t, torch.full_like(t, T)).flip(-1).cummin(-1).values.flip(-1)
    m = (end_at - t + 1).clamp(max=n_steps)
    last = t + m - 1
    rewards = {}
    for rk in reward_keys:
        reward = nxt.get(rk, None)
        if reward is None:
            raise missing_key("MultiStepTransform", ("next", *_tup(rk)), td, "reward_keys")
        r = reward.reshape(*td.batch_size, -1)
        ret = torch.zeros_like(r)
        for k in range(n_steps):
            shifted = torch.cat([r[..., k:, :], torch.zeros_like(r[..., :k, :])], dim=-2) if k else r
            ret = ret + (gamma ** k) * shifted * (k < m).unsqueeze(-1).to(r.dtype)
        rewards[unravel_key(rk)] = (reward, ret.reshape(reward.shape))
    for key, leaf in list(nxt.items(True, True)):
        if unravel_key(key) not in rewards:
            nxt.set(key, _gather_time(leaf, last, dim))
    for rk, (orig, ret) in rewards.items():
        parts = _tup(rk)
        nxt.set((*parts[:-1], f"original_{parts[-1]}"), orig)
        nxt.set(rk, ret)
    td.set("steps_to_next_obs", m)
    td.set("gamma", torch.full(m.shape, float(gamma), dtype=torch.float32, device=m.device) ** m)
    nonterminal = ~end
    if mask_key is not None:
        mask = td.get(mask_key, None)
        if mask is not None:
            nonterminal = nonterminal & mask.reshape(*td.batch_size).to(torch.bool)
    td.set("nonterminal", nonterminal)
    return td


class MultiStepTransform(Transform):
    """n-step returns for a replay buffer, insensitive to how the data was cut into batches.

    A write-side transform (it runs in ``inv``, i.e. on ``ReplayBuffer.extend``) for
    batches ``[*B, T]`` whose last dim is time and whose consecutive ``extend`` calls
    continue the same trajectories (a collector's successive batches). It keeps the last
    ``n_steps`` frames of each call, so each frame is written once all of its ``n_steps``
    successors are known: a call returns the ``n_steps`` held-back frames of the previous
    call followed by all but the last ``n_steps`` frames of this one (the first call
    returns ``T - n_steps`` frames; ``None`` while fewer than ``n_steps + 1`` frames have
    been seen, which ``extend`` writes as nothing).

    Each written frame ``t`` carries the discounted sum of the rewards of ``t .. t+m-1``
    (``m = n_steps``, or fewer when the trajectory ends first), the ``"next"`` entries of
    step ``t+m-1``, and ``"steps_to_next_obs"``, ``"gamma"`` (``gamma**m``) and
    ``"nonterminal"`` (see :func:`n_step_returns`). Unlike TorchRL, done flags move with the
    window (a window that reaches a terminal state is terminal, so a TD target never
    bootstraps from a terminal observation); TorchRL leaves them unshifted.

    Args:
        n_steps: the window (``>= 1``; can be changed between calls).
        gamma: the discount factor.
        reward_keys: rewards under ``"next"`` summed over the window (default ``["reward"]``);
            the original value is kept as ``("next", "original_<name>")``.
        done_key: the done flag under ``"next"`` ending trajectories (default ``"done"``).
        done_keys: TorchRL's list of end keys (accepted; here every ``"next"`` entry, done
            flags included, moves with the window).
        mask_key: an optional validity mask; False marks the frame as nonterminal=False.

    It cannot be used in an env (it needs future steps).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.data import LazyTensorStorage, ReplayBuffer
        >>> from steersman.envs.transforms import MultiStepTransform
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(20), transform=MultiStepTransform(2, gamma=0.5))
        >>> def chunk(start):  # 4 steps of one long trajectory, reward = step index
        ...     t = torch.arange(start, start + 4.0).unsqueeze(-1)
        ...     return TensorDict({"obs": t, "next": {"obs": t + 1, "reward": t,
        ...                        "done": torch.zeros(4, 1, dtype=torch.bool)}}, [4])
        >>> _ = rb.extend(chunk(0)); len(rb)        # frames 0, 1 (2 and 3 wait for their future)
        2
        >>> _ = rb.extend(chunk(4)); len(rb)        # frames 2 .. 5
        6
        >>> rb[:]["next", "reward"].squeeze(-1)     # r_t + 0.5 * r_{t+1}
        tensor([0.5000, 2.0000, 3.5000, 5.0000, 6.5000, 8.0000])
        >>> rb[:]["next", "obs"].squeeze(-1)        # the obs 2 steps ahead
        tensor([2., 3., 4., 5., 6., 7.])
    """

    ENV_ERR = ("MultiStepTransform cannot be used in an env: the n-step return needs future steps; use it as a "
               "replay-buffer transform (it runs on extend)")

    def __init__(self, n_steps: int, gamma: float, *, reward_keys: list[NestedKey] | None = None,
                 done_key: NestedKey | None = None, done_keys: list[NestedKey] | None = None,
                 mask_key: NestedKey | None = None) -> None:
        super().__init__()
        self.n_steps = n_steps
        g = float(gamma)
        if not 0 < g <= 1:
            raise ValueError(f"MultiStepTransform: gamma must be in (0, 1], got {gamma!r}")
        self.gamma = g
        self.reward_keys = key_list(["reward"] if reward_keys is None else reward_keys, "MultiStepTransform",
                                    "reward_keys")
        self.done_key = unravel_key("done" if done_key is None else done_key)
        self.done_keys = key_list(DEFAULT_DONE_KEYS if done_keys is None else done_keys, "MultiStepTransform",
                                  "done_keys")
        self.mask_key = unravel_key("mask" if mask_key is None else mask_key)
        self._buffer: TensorDictBase | None = None

    @property
    def n_steps(self) -> int:
        """The look-ahead window (can be changed between ``extend`` calls)."""
        return self._n_steps

    @n_steps.setter
    def n_steps(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"MultiStepTransform: n_steps must be an integer >= 1, got {value!r}")
        self._n_steps = value

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase | None:
        if self._env() is not None:
            raise ValueError(self.ENV_ERR)
        if tensordict.batch_dims == 0:
            raise ValueError("MultiStepTransform needs batches whose last dim is time, got batch_size []")
        if self._buffer is None:
            total = tensordict
        else:
            if self._buffer.batch_size[:-1] != tensordict.batch_size[:-1]:
                raise ValueError(
                    f"MultiStepTransform: a batch of shape {list(tensordict.batch_size)} does not continue the "
                    f"previous ones (leading dims {list(self._buffer.batch_size[:-1])}); use one transform per "
                    "stream of trajectories")
            total = torch.cat([self._buffer, tensordict], -1)
        self._buffer = total[..., -self.n_steps:].clone()
        if total.batch_size[-1] <= self.n_steps:
            return None
        out = n_step_returns(total, self.n_steps, self.gamma, reward_keys=self.reward_keys,
                             done_key=self.done_key, mask_key=self.mask_key)
        return out[..., : -self.n_steps]

    def inv(self, tensordict: TensorDictBase) -> TensorDictBase | None:
        return self._inv_call(tensordict)

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Sampling: the stored values are returned unchanged (the work is done on extend)."""
        return tensordict

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        raise ValueError(self.ENV_ERR)

    def __repr__(self) -> str:
        return f"MultiStepTransform(n_steps={self.n_steps}, gamma={self.gamma}, reward_keys={self.reward_keys})"


class NextStateReconstructor(Transform):
    """Rebuilds ``("next", k)`` of a sample from position ``i + 1`` of the same sample.

    For data stored without its ``("next", obs)`` entries (they repeat the root entries of
    the following step): for each key ``k`` and each position ``i`` of the flattened
    sample, ``("next", k)[i] = k[i + 1]`` when position ``i + 1`` is the next step of the
    same trajectory, else ``fill_value``. Position ``i + 1`` is the next step when it exists,
    has the same ``traj_key`` value, ``done_key`` is not set at ``i`` and (with
    ``step_count_key``) its step count is one more. Slices of a ``SliceSampler`` are
    rebuilt except at their ends; a random sample is mostly ``fill_value`` (as it should:
    the next observation is not in it).

    Args:
        keys: the root keys to rebuild under ``"next"`` (default ``("observation",)``).
        traj_key: the trajectory id (default ``("collector", "traj_ids")``; None: the sample
            is one trajectory).
        done_key: default ``("next", "done")``; None: not checked.
        step_count_key: optional step counter to check too.
        fill_value: where the next step is not in the sample (default NaN; integer entries
            need an integer).
        strict: a configured marker key missing from the sample raises a ``KeyError``
            (``False``: that check is skipped).

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs.transforms import NextStateReconstructor
        >>> data = TensorDict({"observation": torch.arange(6.0).unsqueeze(-1),
        ...                    ("next", "done"): torch.tensor([[False], [True], [False], [False], [False], [True]]),
        ...                    ("collector", "traj_ids"): torch.tensor([0, 0, 1, 1, 2, 2])}, [6])
        >>> NextStateReconstructor()(data)["next", "observation"].squeeze(-1)
        tensor([1., nan, 3., nan, 5., nan])
    """

    def __init__(self, keys: Sequence[NestedKey] = ("observation",), *,
                 traj_key: NestedKey | None = ("collector", "traj_ids"),
                 done_key: NestedKey | None = ("next", "done"), step_count_key: NestedKey | None = None,
                 fill_value: float = float("nan"), strict: bool = True) -> None:
        keys = key_list(keys, "NextStateReconstructor", "keys")
        if not keys:
            raise ValueError("NextStateReconstructor: keys must name at least one entry")
        super().__init__(in_keys=keys, out_keys=[("next", *_tup(k)) for k in keys])
        self.keys = keys
        self.traj_key = None if traj_key is None else unravel_key(traj_key)
        self.done_key = None if done_key is None else unravel_key(done_key)
        self.step_count_key = None if step_count_key is None else unravel_key(step_count_key)
        self.fill_value = fill_value
        self.strict = bool(strict)

    def _fetch_marker(self, data: TensorDictBase, key: NestedKey | None, what: str) -> Tensor | None:
        if key is None:
            return None
        v = data.get(key, None)
        if v is None:
            if self.strict:
                raise missing_key(self, key, data, what)
            return None
        n = data.batch_size.numel()
        return v.reshape(n, -1)

    def _valid_mask(self, data: TensorDictBase) -> Tensor:
        n = data.batch_size.numel()
        valid = torch.ones(n, dtype=torch.bool, device=data.device)
        if n:
            valid[-1] = False
        tid = self._fetch_marker(data, self.traj_key, "traj_key")
        if tid is not None and n > 1:
            valid[:-1] &= (tid[1:] == tid[:-1]).all(-1)
        done = self._fetch_marker(data, self.done_key, "done_key")
        if done is not None:
            valid &= ~done.to(torch.bool).any(-1)
        sc = self._fetch_marker(data, self.step_count_key, "step_count_key")
        if sc is not None and n > 1:
            valid[:-1] &= (sc[1:] == sc[:-1] + 1).all(-1)
        return valid

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        if tensordict.batch_dims == 0:
            raise ValueError("NextStateReconstructor needs a batch of steps, got batch_size []")
        valid = self._valid_mask(tensordict)
        bs = tensordict.batch_size
        n = bs.numel()
        for k in self.keys:
            x = tensordict.get(k, None)
            if x is None:
                raise missing_key(self, k, tensordict, "keys")
            if not (x.is_floating_point() or x.is_complex()) and self.fill_value != self.fill_value:
                raise ValueError(f"NextStateReconstructor: {k!r} is {x.dtype}, which cannot hold the NaN "
                                 "fill_value; pass an integer fill_value")
            flat = x.reshape(n, *x.shape[len(bs):])
            shifted = torch.cat([flat[1:], flat[:1]], 0) if n else flat
            v = valid.reshape(n, *([1] * (flat.ndim - 1)))
            out = torch.where(v, shifted, torch.full_like(flat, self.fill_value))
            tensordict.set(("next", *_tup(k)), out.reshape(x.shape))
        return tensordict

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self.forward(tensordict)

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        raise ValueError("NextStateReconstructor is a replay-buffer (sample-side) transform; it cannot be used "
                         "in an env")


class NextObservationDelta(Transform):
    """Stores ``("next", k)`` as ``("next", "delta", k) = next_k - k`` in ``delta_dtype``.

    * In an env, each step writes ``("next", "delta", k)``; the ``("next", k)`` entries of
      ``in_keys`` are removed from the transitions returned by ``rollout`` and
      ``step_and_maybe_reset`` (after ``step_mdp`` moved them to the next step's root: the
      policy still sees full-precision observations), so the stored data holds the compact
      delta instead.
    * On a replay-buffer sample (``forward``): ``("next", k) = k + ("next", "delta", k)``
      (cast to ``restore_dtype``; ``"root"``: the root entry's dtype), and the delta is
      dropped (``drop_delta``). Unlike :class:`NextStateReconstructor`, episode ends are
      rebuilt too, to the precision of ``delta_dtype`` (the compression is lossy).

    Args:
        in_keys: the observations (default: every floating observation of the env not of
            ``excluded_dtypes``; required outside an env).
        delta_dtype: a floating dtype (default float16).
        restore_dtype: a dtype or ``"root"``.
        drop_delta: remove the delta after rebuilding (default True).
        excluded_dtypes: dtypes skipped when the keys are inferred.

    Example:
        >>> import torch
        >>> from steersman.envs import PendulumEnv, TransformedEnv
        >>> from steersman.envs.transforms import NextObservationDelta
        >>> t = NextObservationDelta(["observation"])
        >>> env = TransformedEnv(PendulumEnv(seed=0), t)
        >>> data = env.rollout(4)
        >>> data["next", "delta", "observation"].dtype, ("next", "observation") in data.keys(True)
        (torch.float16, False)
        >>> rebuilt = t.clone()(data.clone())            # on a replay sample
        >>> rebuilt["next", "observation"].dtype, ("next", "delta") in rebuilt.keys(True)
        (torch.float32, False)
        >>> err = (rebuilt["next", "observation"][:-1] - data["observation"][1:]).abs().max()
        >>> bool(err < 1e-2)                              # float16 precision
        True
    """

    def __init__(self, in_keys: Sequence[NestedKey] | None = None, *, delta_dtype: torch.dtype = torch.float16,
                 restore_dtype: torch.dtype | str = "root", drop_delta: bool = True,
                 excluded_dtypes: tuple = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                                           torch.bool)) -> None:
        if not isinstance(delta_dtype, torch.dtype) or not delta_dtype.is_floating_point:
            raise ValueError(f"NextObservationDelta: delta_dtype must be a floating dtype, got {delta_dtype!r}")
        if restore_dtype != "root" and not isinstance(restore_dtype, torch.dtype):
            raise ValueError(f"NextObservationDelta: restore_dtype must be a dtype or 'root', got {restore_dtype!r}")
        super().__init__(in_keys=in_keys)
        self._auto_keys = in_keys is None
        self.delta_dtype = delta_dtype
        self.restore_dtype = restore_dtype
        self.drop_delta = bool(drop_delta)
        self.excluded_dtypes = tuple(excluded_dtypes)

    @property
    def _pairs(self) -> list:
        return []

    @staticmethod
    def _delta_key(key: NestedKey) -> tuple:
        return ("delta", *_tup(key))

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        obs = output_spec["full_observation_spec"]
        if self._auto_keys:
            keys = [k for k, s in obs.items(True, True)
                    if s.dtype.is_floating_point and s.dtype not in self.excluded_dtypes]
            self.__dict__["_in_keys"] = keys
        for k in self.in_keys:
            s = obs.get(k, None)
            if s is None or isinstance(s, Composite):
                raise missing_key(self, k, obs, "in_keys")
            obs.set(self._delta_key(k), Unbounded(shape=s.shape, dtype=self.delta_dtype, device=s.device))
        return output_spec

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        for k in self.in_keys:
            prev = tensordict.get(k, None)
            if prev is None:
                raise missing_key(self, k, tensordict)
            next_tensordict.set(self._delta_key(k), (next_tensordict.get(k) - prev).to(self.delta_dtype))
        return next_tensordict

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        for k in self.in_keys:
            x = tensordict_reset.get(k)
            tensordict_reset.set(self._delta_key(k), torch.zeros(x.shape, dtype=self.delta_dtype, device=x.device))
        return tensordict_reset

    def _post_step_mdp(self, transition: TensorDictBase) -> None:
        """Drops the full ``("next", k)`` entries from a transition (after ``step_mdp``)."""
        nxt = transition.get("next")
        for k in self.in_keys:
            if k in nxt.keys(True):
                nxt.del_(k)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        if self._auto_keys and not self.in_keys:
            raise ValueError("NextObservationDelta: outside an env, in_keys must be given")
        nxt = tensordict.get("next", None)
        if nxt is None or not is_tensor_collection(nxt):
            raise missing_key(self, "next", tensordict)
        for k in self.in_keys:
            root = tensordict.get(k, None)
            delta = nxt.get(self._delta_key(k), None)
            if root is None:
                raise missing_key(self, k, tensordict)
            if delta is None:
                if k in nxt.keys(True):  # stored uncompressed: nothing to rebuild
                    continue
                raise missing_key(self, ("next", *self._delta_key(k)), tensordict)
            dtype = root.dtype if self.restore_dtype == "root" else self.restore_dtype
            nxt.set(k, (root.to(torch.float64) + delta.to(torch.float64)).to(dtype))
            if self.drop_delta:
                nxt.del_(self._delta_key(k))
        if self.drop_delta and "delta" in nxt.keys() and is_tensor_collection(nxt.get("delta")) \
                and nxt.get("delta").is_empty():
            nxt.del_("delta")
        return tensordict

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict

