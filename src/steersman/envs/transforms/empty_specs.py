"""RemoveEmptySpecs: drops empty Composite specs and the empty TensorDicts they describe."""

from __future__ import annotations

from typing import Any

from steersman.data import Composite
from steersman.tensordict import TensorDict, TensorDictBase, is_tensor_collection

from ._utils import refuse_unless_default
from .base import Transform

__all__ = ["RemoveEmptySpecs"]

_OUT = ("full_observation_spec", "full_reward_spec", "full_done_spec")
_IN = ("full_action_spec", "full_state_spec")


def _prune_spec(spec: Composite, prefix: tuple, removed: list) -> None:
    """Deletes the Composite entries of ``spec`` without leaves (recursively); records their keys."""
    for key in list(spec.keys()):
        sub = spec[key]
        if isinstance(sub, Composite):
            _prune_spec(sub, (*prefix, key), removed)
            if not list(sub.keys()):
                spec.del_(key)
                removed.append((*prefix, key))


def _prune_td(td: TensorDictBase) -> TensorDictBase:
    """Deletes the sub-TensorDicts of ``td`` without entries (recursively)."""
    for key in list(td.keys()):
        sub = td.get(key)
        if is_tensor_collection(sub):
            _prune_td(sub)
            if not list(sub.keys()):
                td.del_(key)
    return td


class RemoveEmptySpecs(Transform):
    """Removes the empty ``Composite`` specs of an env and the empty TensorDicts in its data.

    Specs with no leaf (e.g. ``Composite(another=Composite())``) are dropped from the
    observation, reward, done, action and state specs; the matching empty sub-TensorDicts
    are dropped from reset and step outputs (and, in ``forward``, from any TensorDict).
    On the way in, the empty input entries the env declared are put back, so the env
    receives the structure it expects.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs.transforms import RemoveEmptySpecs
        >>> td = TensorDict({"a": torch.zeros(2), "b": TensorDict({"c": {}}, [2])}, batch_size=[2])
        >>> list(RemoveEmptySpecs()(td).keys())
        ['a']
    """

    _check_spec_in_keys = False

    def __init__(self, in_keys: Any = None, out_keys: Any = None, in_keys_inv: Any = None,
                 out_keys_inv: Any = None) -> None:
        for name, v in (("in_keys", in_keys), ("out_keys", out_keys), ("in_keys_inv", in_keys_inv),
                        ("out_keys_inv", out_keys_inv)):
            refuse_unless_default("RemoveEmptySpecs", name, v, None,
                                  "it removes every empty Composite, whatever its key")
        super().__init__()
        self.__dict__["_removed_inputs"] = []

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return _prune_td(tensordict)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        return _prune_td(tensordict_reset)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return _prune_td(tensordict)

    @property
    def _has_inv(self) -> bool:
        return bool(self.__dict__.get("_removed_inputs"))

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        bs = tensordict.batch_size
        for key in self.__dict__["_removed_inputs"]:
            if tensordict.get(key, None) is None:
                tensordict.set(key, TensorDict({}, batch_size=bs, device=tensordict.device))
        return tensordict

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        for part in _OUT:
            _prune_spec(output_spec[part], (), [])
        return output_spec

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        removed: list = []
        for part in _IN:
            _prune_spec(input_spec[part], (), removed)
        self.__dict__["_removed_inputs"] = [k[0] if len(k) == 1 else k for k in removed]
        return input_spec

    def __repr__(self) -> str:
        return "RemoveEmptySpecs()"
