"""``RandomPolicy``: uniform actions from a spec (a baseline and a warm-up policy)."""

from __future__ import annotations

from typing import Any

from ..data import Composite, TensorSpec
from ..tensordict.nn import TensorDictModuleBase

__all__ = ["RandomPolicy"]


class RandomPolicy(TensorDictModuleBase):
    """Writes ``action_spec.rand()`` at ``action_key`` (every leaf of a ``Composite`` spec).

    Args:
        action_spec: the spec to sample from. A spec whose shape does not already start
            with the TensorDict's batch size is sampled once per batch element. ``None``
            (TorchRL's lazy form): a collector given this policy sets it to its env's
            ``full_action_spec``; calling the policy before that raises ``RuntimeError``.
        action_key: where the action goes (default ``"action"``; ignored for a
            ``Composite``, whose keys are used).

    Shapes: batch ``[*B]`` -> action ``[*B, *spec.shape]`` (or ``spec.shape`` when it
    starts with ``B``).

    Example:
        >>> import torch
        >>> from steersman.data import Bounded
        >>> from steersman.tensordict import TensorDict
        >>> policy = RandomPolicy(Bounded(-1.0, 1.0, (2,)))
        >>> td = policy(TensorDict(batch_size=[5]))
        >>> td["action"].shape, bool(td["action"].abs().max() <= 1)
        (torch.Size([5, 2]), True)
    """

    def __init__(self, action_spec: TensorSpec | None = None, action_key: Any = "action") -> None:
        super().__init__()
        self.action_key = action_key
        self.in_keys = []
        self.action_spec = action_spec

    @property
    def action_spec(self) -> TensorSpec | None:
        return self._action_spec

    @action_spec.setter
    def action_spec(self, spec: TensorSpec | None) -> None:
        """Sets the spec (a copy) and the keys the policy writes."""
        if spec is not None and not isinstance(spec, TensorSpec):
            raise TypeError(f"RandomPolicy needs a TensorSpec, got {type(spec).__name__}")
        self._action_spec = None if spec is None else spec.clone()
        if isinstance(spec, Composite):
            self.out_keys = list(spec.keys(True, True))
        else:
            self.out_keys = [self.action_key]

    def forward(self, tensordict: Any) -> Any:
        spec = self._action_spec
        if spec is None:
            raise RuntimeError(
                "RandomPolicy() has no action_spec yet: pass one, set policy.action_spec, or give "
                "the policy to a collector, which sets its env's full_action_spec"
            )
        batch = tensordict.batch_size
        extra = None if spec.shape[: len(batch)] == batch else batch
        sample = spec.rand(extra)
        if isinstance(spec, Composite):
            for key in self.out_keys:
                tensordict.set(key, sample.get(key))
        else:
            tensordict.set(self.action_key, sample)
        return tensordict
