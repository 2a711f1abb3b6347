"""Weight updaters: how ``update_policy_weights_()`` gets new weights into a collector's policy.

A collector holds one :class:`WeightUpdaterBase` (``collector.weight_updater``; pass your
own with ``weight_updater=``). ``collector.update_policy_weights_(weights)`` calls
``updater.push_weights(weights)``: the weights (given, or :meth:`~WeightUpdaterBase._get_server_weights`
when ``None``) are mapped with :meth:`~WeightUpdaterBase._maybe_map_weights`, then sent to
each worker with :meth:`~WeightUpdaterBase._sync_weights_with_worker`.

* :class:`VanillaWeightUpdater`: the default of :class:`~steersman.collectors.Collector`
  (copies into the policy of this process).
* :class:`MultiProcessedWeightUpdater`: the default of the multi-process collectors
  (writes once into the shared memory every worker reads before its next batch).
* :class:`RemoteModuleWeightUpdater`: the weights must be passed explicitly.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from steersman.tensordict import TensorDictBase

from ._policy import SharedWeights, as_weights, copy_weights_

__all__ = ["WeightUpdaterBase", "VanillaWeightUpdater", "MultiProcessedWeightUpdater",
           "RemoteModuleWeightUpdater"]


class WeightUpdaterBase:
    """Base class of the weight updaters (subclass it to send weights your own way).

    Subclasses implement :meth:`_sync_weights_with_worker` (and, where weights can be found
    without being given, :meth:`_get_server_weights`); :meth:`all_worker_ids` lists the
    workers to update (``None``: a single destination).

    Example:
        >>> import torch
        >>> from steersman.collectors import Collector, WeightUpdaterBase
        >>> from steersman.envs import CartPoleEnv
        >>> class Counting(WeightUpdaterBase):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.pushed = []
        ...     def _sync_weights_with_worker(self, *, worker_id=None, server_weights=None):
        ...         self.pushed.append(server_weights)
        >>> updater = Counting()
        >>> collector = Collector(CartPoleEnv(), None, frames_per_batch=8, weight_updater=updater)
        >>> collector.update_policy_weights_({"w": torch.ones(1)})
        >>> len(updater.pushed), updater.collector is collector
        (1, True)
    """

    def __init__(self) -> None:
        self._collector_ref: Any = None
        self._post_hooks: list[Callable[[], Any]] = []
        self.version = 0

    @classmethod
    def from_policy(cls, policy: Any) -> WeightUpdaterBase | None:
        """An updater built from the policy, or ``None`` (the collector then picks its default)."""
        return None

    def register_collector(self, collector: Any) -> None:
        """Binds the updater to its collector (done by the collector; kept as a weak reference)."""
        self._collector_ref = weakref.ref(collector)

    @property
    def collector(self) -> Any:
        """The collector this updater was registered with (``None`` if none, or gone)."""
        return None if self._collector_ref is None else self._collector_ref()

    def register_post_hook(self, hook: Callable[[], Any]) -> None:
        """Calls ``hook()`` after every push."""
        if not callable(hook):
            raise TypeError(f"register_post_hook: expected a callable, got {type(hook).__name__}")
        self._post_hooks.append(hook)

    def increment_version(self) -> None:
        """Counts one more update (done by :meth:`push_weights`)."""
        self.version += 1

    def _get_server_weights(self) -> Any:
        """The weights to push when none are given (default: none, so nothing is pushed)."""
        return None

    def _maybe_map_weights(self, server_weights: Any) -> TensorDictBase | None:
        """Turns a module, a TensorDict or a ``state_dict`` into a TensorDict of weights."""
        return None if server_weights is None else as_weights(server_weights)

    def all_worker_ids(self) -> list[int] | None:
        """The workers to update when no ``worker_ids`` are given (``None``: one destination)."""
        return None

    def _sync_weights_with_worker(self, *, worker_id: int | None = None, server_weights: Any = None) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement _sync_weights_with_worker")

    def push_weights(self, weights: Any = None, worker_ids: int | list[int] | None = None) -> None:
        """Sends ``weights`` (default: :meth:`_get_server_weights`) to ``worker_ids`` (default:
        :meth:`all_worker_ids`). Nothing is sent, and no version counted, without weights."""
        weights = self._maybe_map_weights(weights if weights is not None else self._get_server_weights())
        if weights is None:
            return
        ids = self.all_worker_ids() if worker_ids is None else worker_ids
        if ids is None:
            self._sync_weights_with_worker(worker_id=None, server_weights=weights)
        else:
            for i in [ids] if isinstance(ids, int) else ids:
                self._sync_weights_with_worker(worker_id=i, server_weights=weights)
        self.increment_version()
        for hook in self._post_hooks:
            hook()

    def __call__(self, weights: Any = None, worker_ids: int | list[int] | None = None) -> None:
        self.push_weights(weights, worker_ids)


class VanillaWeightUpdater(WeightUpdaterBase):
    """Copies new weights into the policy weights of this process.

    Keyword Args:
        weight_getter: returns the weights to push when none are given (``None``: pushing
            without weights does nothing).
        policy_weights: the policy's weights (a TensorDict of its own tensors, e.g.
            ``TensorDict.from_module(policy)``), written in place.

    Example:
        >>> import torch
        >>> from steersman.collectors import VanillaWeightUpdater
        >>> from steersman.tensordict import TensorDict
        >>> net = torch.nn.Linear(2, 1)
        >>> updater = VanillaWeightUpdater(policy_weights=TensorDict.from_module(net))
        >>> updater({"weight": torch.zeros(1, 2), "bias": torch.ones(1)})
        >>> net.bias.item(), updater.version
        (1.0, 1)
    """

    def __init__(self, *, weight_getter: Callable[[], Any] | None = None,
                 policy_weights: TensorDictBase | None) -> None:
        super().__init__()
        self.weight_getter = weight_getter
        self.policy_weights = policy_weights

    def _get_server_weights(self) -> Any:
        return None if self.weight_getter is None else self.weight_getter()

    def _sync_weights_with_worker(self, *, worker_id: int | None = None, server_weights: Any = None) -> None:
        if self.policy_weights is None:
            raise ValueError("update_policy_weights_: the collector's policy has no weights")
        copy_weights_(self.policy_weights, server_weights)


class MultiProcessedWeightUpdater(WeightUpdaterBase):
    """Publishes new weights to the workers of a multi-process collector.

    The workers share one copy of the weights (shared memory with a version counter):
    each push writes it once, and every worker copies it into its policy before its next
    batch. ``worker_ids`` is therefore accepted and ignored (every worker gets the update).

    Keyword Args:
        get_server_weights: returns the weights to push when none are given.
        policy_weights: where to write: the collector's shared weights (set by the
            collector), or a dict ``{device: TensorDict}`` of weights written in place.

    Example:
        >>> import functools, torch
        >>> from steersman.collectors import MultiSyncDataCollector, MultiProcessedWeightUpdater
        >>> from steersman.envs import CartPoleEnv
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> policy = TensorDictModule(torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.Softmax(-1)),
        ...                           ["observation"], ["probs"])
        >>> collector = MultiSyncDataCollector(CartPoleEnv, policy, num_workers=1, frames_per_batch=4,
        ...                                    trust_policy=True)
        >>> isinstance(collector.weight_updater, MultiProcessedWeightUpdater)
        True
        >>> collector.shutdown()
    """

    def __init__(self, *, get_server_weights: Callable[[], Any] | None,
                 policy_weights: SharedWeights | dict[Any, TensorDictBase] | None) -> None:
        super().__init__()
        self.get_server_weights = get_server_weights
        self.policy_weights = policy_weights

    def _get_server_weights(self) -> Any:
        return None if self.get_server_weights is None else self.get_server_weights()

    def _sync_weights_with_worker(self, *, worker_id: int | None = None, server_weights: Any = None) -> None:
        dst = self.policy_weights
        if dst is None:
            raise ValueError("update_policy_weights_: the collector's policy has no weights")
        if isinstance(dst, SharedWeights):
            dst.write(server_weights)
        else:
            for weights in dst.values():
                copy_weights_(weights, server_weights)


class RemoteModuleWeightUpdater(WeightUpdaterBase):
    """Pushes only weights given explicitly (for collectors whose policy this process does
    not hold, e.g. built by ``policy_factory`` in the workers); pushing without weights
    raises ``RuntimeError``. The weights go where the collector's own transport sends them.

    Example:
        >>> import torch
        >>> from steersman.collectors import Collector, RemoteModuleWeightUpdater
        >>> from steersman.envs import CartPoleEnv
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> net = torch.nn.Linear(4, 2)
        >>> policy = TensorDictModule(net, ["observation"], ["logits"])
        >>> collector = Collector(CartPoleEnv(), policy, frames_per_batch=4, trust_policy=True,
        ...                       weight_updater=RemoteModuleWeightUpdater())
        >>> collector.update_policy_weights_({"module.bias": torch.ones(2)})
        >>> net.bias.tolist()
        [1.0, 1.0]
    """

    def _get_server_weights(self) -> Any:
        raise RuntimeError(
            "RemoteModuleWeightUpdater: pass the weights explicitly, "
            "collector.update_policy_weights_(weights); this updater does not fetch them")

    def all_worker_ids(self) -> list[int] | None:
        return self._default().all_worker_ids()

    def _default(self) -> WeightUpdaterBase:
        collector = self.collector
        if collector is None:
            raise RuntimeError("RemoteModuleWeightUpdater: not registered with a collector")
        return collector._transport_weight_updater()

    def _sync_weights_with_worker(self, *, worker_id: int | None = None, server_weights: Any = None) -> None:
        self._default()._sync_weights_with_worker(worker_id=worker_id, server_weights=server_weights)
