"""``RayEvalWorker``: evaluates a policy in its own Ray actor while training goes on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from steersman.tensordict import TensorDictBase
from steersman.tensordict.nn import ExplorationType, set_exploration_type

from ._ray import init_ray, require_ray

__all__ = ["RayEvalWorker", "first_episode_returns"]


def first_episode_returns(rollout: TensorDictBase) -> torch.Tensor:
    """Return of the first episode of every sub-env of a rollout ``[*B, T]``: ``[prod(B)]``
    (the rewards up to and including each sub-env's first done).

    Example:
        >>> from steersman.envs import CartPoleEnv
        >>> env = CartPoleEnv(batch_size=[2], seed=0)
        >>> push_left = lambda td: td.set("action", torch.zeros(2, dtype=torch.long))
        >>> first_episode_returns(env.rollout(50, push_left, break_when_any_done=False))
        tensor([10.,  8.])
    """
    reward = rollout.get(("next", "reward")).reshape(-1, rollout.shape[-1])
    done = rollout.get(("next", "done")).reshape(-1, rollout.shape[-1]).long()
    before_end = (done.cumsum(-1) - done) == 0  # steps up to and including the first done
    return (reward * before_end).sum(-1)


class _EvalActor:
    def __init__(self, create_env_fn: Callable, policy: Any, policy_factory: Callable | None) -> None:
        torch.set_num_threads(1)
        self.env = create_env_fn()
        self.policy = policy_factory() if policy_factory is not None else policy

    def evaluate(self, weights: Any, max_steps: int, seed: int | None) -> dict:
        import ray

        if weights is not None:
            self.policy.load_state_dict(weights)
        if seed is not None:
            self.env.set_seed(seed)
        with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
            ro = self.env.rollout(max_steps, self.policy, break_when_any_done=False, break_when_all_done=True)
        return {"returns": first_episode_returns(ro), "node": ray.util.get_node_ip_address()}


class RayEvalWorker:
    """Evaluation in a separate Ray actor: ``submit`` returns at once, ``result`` waits.

    Args:
        create_env_fn: builds the eval env in the actor (one episode per sub-env).
        policy: an ``nn.Module`` (pickled once); or ``policy_factory`` builds it there.

    Keyword Args:
        remote_config: Ray actor options (default ``{"num_cpus": 0}``).
        ray_init_config: ``ray.init`` arguments if Ray is not running yet.

    Example (not run by the doctests: it starts Ray)::

        worker = RayEvalWorker(lambda: CartPoleEnv(batch_size=[4]), policy)
        worker.submit(policy.state_dict(), max_steps=500, seed=0)
        ...                                      # train on meanwhile
        returns = worker.result()                # [4]: one episode per sub-env
        worker.shutdown()
    """

    def __init__(self, create_env_fn: Callable, policy: nn.Module | None = None, *,
                 policy_factory: Callable | None = None, remote_config: dict | None = None,
                 ray_init_config: dict | None = None) -> None:
        ray = require_ray()
        if (policy is None) == (policy_factory is None):
            raise ValueError("RayEvalWorker: give exactly one of policy and policy_factory")
        init_ray(ray_init_config)
        opts = {"num_cpus": 0, **(remote_config or {})}
        self._actor = ray.remote(_EvalActor).options(**opts).remote(create_env_fn, policy, policy_factory)
        self._pending: Any = None
        self.node: str | None = None

    def submit(self, weights: Any = None, *, max_steps: int = 1000, seed: int | None = None) -> None:
        """Starts an evaluation with ``weights`` (a ``state_dict``; None: the current ones)."""
        if self._pending is not None:
            raise RuntimeError("RayEvalWorker.submit: an evaluation is still running; call result() first")
        if isinstance(weights, nn.Module):
            weights = weights.state_dict()
        if weights is not None:
            weights = {k: v.detach().cpu() for k, v in weights.items()}
        self._pending = self._actor.evaluate.remote(weights, max_steps, seed)

    def ready(self) -> bool:
        """Whether the submitted evaluation has finished."""
        import ray

        return self._pending is not None and bool(ray.wait([self._pending], timeout=0)[0])

    def result(self, timeout: float | None = None) -> torch.Tensor:
        """The returns ``[n_sub_envs]`` of the submitted evaluation (waits for it)."""
        import ray

        if self._pending is None:
            raise RuntimeError("RayEvalWorker.result: nothing was submitted")
        ref, self._pending = self._pending, None
        out = ray.get(ref, timeout=timeout)
        self.node = out["node"]
        return out["returns"]

    def shutdown(self) -> None:
        """Kills the actor (idempotent)."""
        actor, self._actor = self._actor, None
        if actor is not None:
            import ray

            if ray.is_initialized():
                ray.kill(actor, no_restart=True)
