"""TorchRL's TensorDict form of Pendulum's physical parameters (``td_params``).

TorchRL's stateless ``PendulumEnv(td_params=...)`` takes its constants as a TensorDict
``{"params": {"max_speed", "max_torque", "dt", "g", "m", "l"}}`` made by
``PendulumEnv.gen_params``. Here the constants are a :class:`PendulumParams`
(Python numbers shared by every sub-env); these two functions convert between the forms.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from steersman.tensordict import TensorDict, TensorDictBase

from .pendulum import PendulumParams

__all__ = ["gen_pendulum_params", "pendulum_params_from_td"]

_TD_FIELDS = ("max_speed", "max_torque", "dt", "g", "m", "l")
#: every PendulumParams field (a NamedTuple: its annotations in field order)
_PARAM_NAMES = tuple(PendulumParams.__annotations__)


def gen_pendulum_params(g: float = 10.0, batch_size: Any = None, device: Any = None) -> TensorDictBase:
    """TorchRL's ``PendulumEnv.gen_params``: the default constants (gravity ``g``) as
    ``TensorDict({"params": {...}})``, expanded to ``batch_size``.

    Example:
        >>> td = gen_pendulum_params(g=9.81)
        >>> sorted(td["params"].keys()), float(td["params", "g"])
        (['dt', 'g', 'l', 'm', 'max_speed', 'max_torque'], 9.8100004196167)
    """
    d = PendulumParams(g=g)._asdict()
    params = TensorDict({k: torch.tensor(float(d[k]), device=device) for k in _TD_FIELDS}, batch_size=[])
    td = TensorDict({"params": params}, batch_size=[], device=device)
    if batch_size:
        td = td.expand(*torch.Size(batch_size)).contiguous()
    return td


def pendulum_params_from_td(td_params: Any, base: PendulumParams | None = None) -> PendulumParams:
    """The :class:`PendulumParams` of a ``td_params`` TensorDict (or dict), with or without
    the ``"params"`` level; fields it lacks keep ``base``'s (default: Gymnasium's) values.

    Every entry must hold one value: a batched TensorDict whose entries differ per
    element is refused (the constants here are shared by all sub-envs).

    Example:
        >>> pendulum_params_from_td(gen_pendulum_params(g=9.81)).g
        9.81
    """
    base = PendulumParams() if base is None else base
    src = td_params
    if isinstance(src, (TensorDictBase, dict)) and "params" in src.keys():
        src = src["params"]
    if not isinstance(src, (TensorDictBase, dict)):
        raise TypeError(f"td_params must be a TensorDict (or dict) of {list(_TD_FIELDS)}, got {type(td_params).__name__}")
    unknown = sorted(str(k) for k in src.keys() if k not in _PARAM_NAMES)
    if unknown:
        raise KeyError(f"td_params: unknown pendulum parameter(s) {unknown}; known: {list(_PARAM_NAMES)}")
    values = {}
    for key in src.keys():
        v = torch.as_tensor(src[key])
        if v.numel() != 1 and not bool((v == v.reshape(-1)[0]).all()):
            raise ValueError(
                f"td_params[{key!r}] differs across its {v.numel()} elements ({v.reshape(-1)[:4].tolist()}...); "
                "the pendulum constants are shared by every sub-env here"
            )
        x = v.reshape(-1)[0]
        # float32 storage: the shortest decimal that rounds to it (9.81, not 9.8100004)
        values[key] = float(str(np.float32(x.item()))) if x.dtype == torch.float32 else float(x)
    return base._replace(**values)
