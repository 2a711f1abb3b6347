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
            with the TensorDict's batch size is sampled once per batch element.
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

    def __init__(self, action_spec: TensorSpec, action_key: Any = "action") -> None:
        super().__init__()
        if not isinstance(action_spec, TensorSpec):
            raise TypeError(f"RandomPolicy needs a TensorSpec, got {type(action_spec).__name__}")
        self.action_spec = action_spec.clone()
        self.action_key = action_key
        self.in_keys = []
        if isinstance(action_spec, Composite):
            self.out_keys = list(action_spec.keys(True, True))
        else:
            self.out_keys = [action_key]

    def forward(self, tensordict: Any) -> Any:
        spec = self.action_spec
        batch = tensordict.batch_size
        extra = None if spec.shape[: len(batch)] == batch else batch
        sample = spec.rand(extra)
        if isinstance(spec, Composite):
            for key in self.out_keys:
                tensordict.set(key, sample.get(key))
        else:
            tensordict.set(self.action_key, sample)
        return tensordict
