"""Policy and value heads kept together: with a shared trunk (``ActorValueOperator``,
``ActorCriticOperator``) or without (``ActorCriticWrapper``).

Calling the operator runs everything (trunk, policy, value). ``get_policy_operator()``
and ``get_value_operator()`` return standalone sequences that share the modules (and so
the parameters) with the operator: use the first to collect data, the second in a loss.
"""

from __future__ import annotations

from ..tensordict.nn import (
    ProbabilisticTensorDictSequential,
    TensorDictModuleBase,
    TensorDictSequential,
)

__all__ = ["ActorValueOperator", "ActorCriticOperator", "ActorCriticWrapper"]


class ActorValueOperator(TensorDictSequential):
    """A shared trunk feeding a policy head and a state-value head.

    Args:
        common_operator: the trunk (e.g. ``"observation" -> "hidden"``).
        policy_operator: the policy head (e.g. a :class:`ProbabilisticActor` reading
            ``"hidden"``).
        value_operator: the value head (e.g. a :class:`ValueOperator` reading ``"hidden"``).

    Example:
        >>> import torch
        >>> from steersman.modules import Actor, ValueOperator
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> trunk = TensorDictModule(torch.nn.Linear(4, 8), ["observation"], ["hidden"])
        >>> op = ActorValueOperator(trunk, Actor(torch.nn.Linear(8, 2), in_keys=["hidden"]),
        ...                         ValueOperator(torch.nn.Linear(8, 1), in_keys=["hidden"]))
        >>> op.out_keys
        ['hidden', 'action', 'state_value']
        >>> policy = op.get_policy_operator()
        >>> td = policy(TensorDict(observation=torch.randn(3, 4), batch_size=[3]))
        >>> "state_value" in td.keys(), policy[0] is op[0]  # the trunk is shared
        (False, True)
    """

    def __init__(
        self,
        common_operator: TensorDictModuleBase,
        policy_operator: TensorDictModuleBase,
        value_operator: TensorDictModuleBase,
    ) -> None:
        super().__init__(common_operator, policy_operator, value_operator)

    def get_policy_operator(self) -> TensorDictSequential:
        """Trunk then policy head; a probabilistic sequence if the head is one."""
        head = self[1]
        if isinstance(head, ProbabilisticTensorDictSequential):
            return ProbabilisticTensorDictSequential(self[0], *head)
        return TensorDictSequential(self[0], head)

    def get_value_operator(self) -> TensorDictSequential:
        """Trunk then value head."""
        return TensorDictSequential(self[0], self[2])

    def get_policy_head(self) -> TensorDictModuleBase:
        return self[1]

    def get_value_head(self) -> TensorDictModuleBase:
        return self[2]


class ActorCriticOperator(ActorValueOperator):
    """A shared trunk feeding a policy head and a state-action value head (a critic).

    The critic reads the action written by the policy head, so calling the operator
    computes ``Q(s, pi(s))``. ``get_critic_operator()`` is the operator itself;
    ``get_value_operator()`` raises (the head is not a state value).

    Example:
        >>> import torch
        >>> from steersman.modules import MLP, Actor, ValueOperator
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> trunk = TensorDictModule(torch.nn.Linear(4, 8), ["observation"], ["hidden"])
        >>> critic = ValueOperator(MLP(in_features=10, out_features=1, num_cells=[8]),
        ...                        in_keys=["hidden", "action"])
        >>> op = ActorCriticOperator(trunk, Actor(torch.nn.Linear(8, 2), in_keys=["hidden"]), critic)
        >>> op(observation=torch.randn(3, 4))[-1].shape  # state_action_value
        torch.Size([3, 1])
    """

    def __init__(
        self,
        common_operator: TensorDictModuleBase,
        policy_operator: TensorDictModuleBase,
        value_operator: TensorDictModuleBase,
    ) -> None:
        super().__init__(common_operator, policy_operator, value_operator)
        if value_operator.out_keys and value_operator.out_keys[0] == "state_value":
            raise ValueError(
                "ActorCriticOperator: the value head writes 'state_value'; a critic reads the "
                "action and writes 'state_action_value'. Use ActorValueOperator for a state value."
            )

    def get_critic_operator(self) -> ActorCriticOperator:
        return self

    def get_value_operator(self) -> TensorDictSequential:
        raise RuntimeError(
            "ActorCriticOperator computes a state-action value: use get_critic_operator() (or "
            "ActorValueOperator for a state value)"
        )


class ActorCriticWrapper(TensorDictSequential):
    """A policy and a value network without shared modules, called together.

    Example:
        >>> import torch
        >>> from steersman.modules import Actor, ValueOperator
        >>> op = ActorCriticWrapper(Actor(torch.nn.Linear(4, 2)), ValueOperator(torch.nn.Linear(4, 1)))
        >>> op.get_policy_operator() is op[0], op.out_keys
        (True, ['action', 'state_value'])
    """

    def __init__(self, policy_operator: TensorDictModuleBase, value_operator: TensorDictModuleBase) -> None:
        super().__init__(policy_operator, value_operator)

    def get_policy_operator(self) -> TensorDictModuleBase:
        return self[0]

    def get_value_operator(self) -> TensorDictModuleBase:
        return self[1]

    get_policy_head = get_policy_operator
    get_value_head = get_value_operator
