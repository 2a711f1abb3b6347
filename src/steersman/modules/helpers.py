"""Small helpers around modules: the env transforms a recurrent policy needs, contiguous
RNN inputs for several recurrent modules at once, and the distributions by name."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn

from ..tensordict import TensorDictBase
from . import distributions as _d
from .primers import get_primers_from_module

__all__ = ["get_env_transforms_from_module", "canonicalize_rnn_subset", "distributions_maps"]

#: The distributions of :mod:`steersman.modules.distributions` by lower-case class name
#: (``"tanhnormal"``, ``"delta"``...), e.g. to pick one from a config string. TorchRL keys
#: this dict by ``str(cls).lower()`` (``"<class 'torchrl.modules...tanhnormal'>"``), which no
#: config can spell; the class name is used here.
distributions_maps: dict[str, type] = {
    cls.__name__.lower(): cls
    for cls in (_d.Delta, _d.IndependentNormal, _d.TanhDelta, _d.TanhNormal, _d.TruncatedNormal, _d.MaskedCategorical,
                _d.MaskedOneHotCategorical, _d.OneHotCategorical, _d.Ordinal, _d.OneHotOrdinal)
}


def get_env_transforms_from_module(module: nn.Module, init_key: str = "is_init") -> Any:
    """The env transforms a policy needs: an ``InitTracker`` (writes ``init_key`` at episode
    starts) and, when the policy holds recurrent modules, their ``TensorDictPrimer``\\ s.

    Returns ``Compose(InitTracker, primers)``, or the bare ``InitTracker`` when there is no
    recurrent submodule; pass it to ``TransformedEnv``.

    Example:
        >>> from steersman.modules import GRUModule
        >>> gru = GRUModule(input_size=4, hidden_size=8, in_key="observation", out_key="features")
        >>> t = get_env_transforms_from_module(gru)
        >>> [type(x).__name__ for x in t]
        ['InitTracker', 'TensorDictPrimer']
    """
    from ..envs.transforms import Compose, InitTracker  # noqa: PLC0415 (same layer, lazy as in primers.py)

    tracker = InitTracker(init_key=init_key)
    primers = get_primers_from_module(module, warn=False)
    if primers is None:
        return tracker
    return Compose(tracker, *(primers if isinstance(primers, Compose) else [primers]))


def canonicalize_rnn_subset(data: TensorDictBase, modules: Iterable[nn.Module], *, inplace: bool = False) -> TensorDictBase:
    """Makes the entries the recurrent ``modules`` read or write contiguous (their
    ``canonical_keys``, or in_keys and out_keys), once for all of them; other entries are
    untouched. Returns a shallow copy, or ``data`` itself with ``inplace=True``.

    Example:
        >>> import torch
        >>> from steersman.modules import LSTMModule
        >>> from steersman.tensordict import TensorDict
        >>> actor = LSTMModule(input_size=3, hidden_size=4, in_key="obs", out_key="actor_h")
        >>> td = TensorDict({"obs": torch.zeros(5, 2, 3).transpose(0, 1)}, [2, 5])
        >>> td["obs"].is_contiguous(), canonicalize_rnn_subset(td, [actor])["obs"].is_contiguous()
        (False, True)
    """
    keys: list = []
    for module in modules:
        for key in getattr(module, "canonical_keys", None) or [*module.in_keys, *module.out_keys]:
            if key not in keys:
                keys.append(key)
    out = data if inplace else data.copy()
    for key in keys:
        value = data.get(key, None)
        if value is not None and hasattr(value, "contiguous"):
            out.set(key, value.contiguous())
    return out
