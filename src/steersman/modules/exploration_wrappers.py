"""TorchRL's older exploration wrappers: a policy followed by an exploration module.

``EGreedyWrapper(policy, ...)`` is ``TensorDictSequential(policy, EGreedyModule(...))``
with the wrapper's ``step`` annealing the module; the same holds for
:class:`AdditiveGaussianWrapper` and :class:`OrnsteinUhlenbeckProcessWrapper`. TorchRL
deprecates these names in favour of the modules; new code should chain the modules of
:mod:`steersman.modules.exploration` itself. The action spec defaults to the policy's
``spec``.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ..data import TensorSpec
from ..tensordict.nn import TensorDictSequential
from .exploration import AdditiveGaussianModule, EGreedyModule, OrnsteinUhlenbeckProcessModule

__all__ = ["EGreedyWrapper", "AdditiveGaussianWrapper", "OrnsteinUhlenbeckProcessWrapper"]


def _policy_spec(policy: Any, spec: TensorSpec | None, owner: str, required: bool) -> TensorSpec | None:
    if spec is None:
        spec = getattr(policy, "spec", None)
    if spec is None and required:
        raise ValueError(f"{owner}: give spec= (the action spec); the policy {type(policy).__name__} has none")
    return spec


class _Wrapper(TensorDictSequential):
    @property
    def td_module(self) -> Any:
        """The wrapped policy."""
        return self[0]

    @property
    def exploration_module(self) -> Any:
        return self[1]

    def step(self, frames: int = 1) -> None:
        """Anneals the exploration factor by ``frames`` steps (see the module's ``step``)."""
        self[1].step(frames)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            explore = self._modules["module"][1] if "module" in self._modules else None
            if explore is not None and name in ("eps", "sigma", "eps_init", "eps_end", "sigma_init", "sigma_end"):
                return getattr(explore, name)
            raise


class EGreedyWrapper(_Wrapper):
    """``policy`` followed by :class:`EGreedyModule` (a random action with probability eps).

    Args:
        policy: the greedy policy (writes ``action_key``).

    Keyword Args:
        eps_init, eps_end, annealing_num_steps, action_key, action_mask_key: as in
            :class:`EGreedyModule`.
        spec: the action spec (default: ``policy.spec``).

    Example:
        >>> import torch
        >>> from steersman.data import Categorical
        >>> from steersman.modules import QValueActor
        >>> from steersman.tensordict import TensorDict
        >>> policy = QValueActor(torch.nn.Linear(3, 4), in_keys=["observation"], spec=Categorical(4))
        >>> explore = EGreedyWrapper(policy, eps_init=1.0, eps_end=0.0, annealing_num_steps=4)
        >>> explore(TensorDict({"observation": torch.randn(8, 3)}, [8]))["action"].shape
        torch.Size([8])
        >>> explore.step(4); float(explore.eps)
        0.0
    """

    def __init__(
        self,
        policy: Any,
        *,
        eps_init: float = 1.0,
        eps_end: float = 0.1,
        annealing_num_steps: int = 1000,
        action_key: Any = "action",
        action_mask_key: Any = None,
        spec: TensorSpec | None = None,
    ) -> None:
        spec = _policy_spec(policy, spec, "EGreedyWrapper", required=True)
        explore = EGreedyModule(spec, eps_init, eps_end, annealing_num_steps, action_key=action_key,
                                action_mask_key=action_mask_key)
        super().__init__(policy, explore)


class AdditiveGaussianWrapper(_Wrapper):
    """``policy`` followed by :class:`AdditiveGaussianModule` (annealed Gaussian noise).

    Args:
        policy: the deterministic policy (writes ``action_key``).

    Keyword Args:
        sigma_init, sigma_end, annealing_num_steps, mean, std, action_key, safe, device: as
            in :class:`AdditiveGaussianModule` (``safe=True`` projects onto the spec).
        spec: the action spec (default: ``policy.spec``).

    Example:
        >>> import torch
        >>> from steersman.data import Bounded
        >>> from steersman.modules import Actor
        >>> from steersman.tensordict import TensorDict
        >>> policy = Actor(torch.nn.Linear(3, 2), spec=Bounded(-1, 1, (2,)))
        >>> explore = AdditiveGaussianWrapper(policy, sigma_init=10.0)
        >>> a = explore(TensorDict({"observation": torch.randn(5, 3)}, [5]))["action"]
        >>> bool(a.abs().max() <= 1)
        True
    """

    def __init__(
        self,
        policy: Any,
        *,
        sigma_init: float = 1.0,
        sigma_end: float = 0.1,
        annealing_num_steps: int = 1000,
        mean: float = 0.0,
        std: float = 1.0,
        action_key: Any = "action",
        spec: TensorSpec | None = None,
        safe: bool | None = True,
        device: Any = None,
    ) -> None:
        spec = _policy_spec(policy, spec, "AdditiveGaussianWrapper", required=bool(safe))
        explore = AdditiveGaussianModule(spec, sigma_init, sigma_end, annealing_num_steps, mean, std,
                                         action_key=action_key, safe=bool(safe), device=device)
        super().__init__(policy, explore)


class OrnsteinUhlenbeckProcessWrapper(_Wrapper):
    """``policy`` followed by :class:`OrnsteinUhlenbeckProcessModule` (DDPG's noise).

    Args:
        policy: the deterministic policy (writes ``action_key``).

    Keyword Args:
        eps_init, eps_end, annealing_num_steps, theta, mu, sigma, dt, x0, sigma_min,
            n_steps_annealing, action_key, is_init_key, safe, device: as in
            :class:`OrnsteinUhlenbeckProcessModule`.
        spec: the action spec (default: ``policy.spec``).
        key: TorchRL's old name of ``action_key`` (used when given).

    Example:
        >>> import torch
        >>> from steersman.data import Bounded
        >>> from steersman.modules import Actor
        >>> from steersman.tensordict import TensorDict
        >>> policy = Actor(torch.nn.Linear(3, 2), spec=Bounded(-1, 1, (2,)))
        >>> explore = OrnsteinUhlenbeckProcessWrapper(policy)
        >>> explore(TensorDict({"observation": torch.randn(5, 3)}, [5]))["action"].shape
        torch.Size([5, 2])
    """

    def __init__(
        self,
        policy: Any,
        *,
        eps_init: float = 1.0,
        eps_end: float = 0.1,
        annealing_num_steps: int = 1000,
        theta: float = 0.15,
        mu: float = 0.0,
        sigma: float = 0.2,
        dt: float = 0.01,
        x0: Tensor | float | None = None,
        sigma_min: float | None = None,
        n_steps_annealing: int = 1000,
        action_key: Any = "action",
        is_init_key: Any = "is_init",
        spec: TensorSpec | None = None,
        safe: bool = True,
        key: Any = None,
        device: Any = None,
    ) -> None:
        spec = _policy_spec(policy, spec, "OrnsteinUhlenbeckProcessWrapper", required=True)
        explore = OrnsteinUhlenbeckProcessModule(
            spec, eps_init, eps_end, annealing_num_steps, theta, mu, sigma, dt, x0, sigma_min,
            n_steps_annealing, action_key=action_key if key is None else key, is_init_key=is_init_key,
            safe=safe, device=device,
        )
        super().__init__(policy, explore)
