"""Multi-agent networks and value mixers (TorchRL's names and semantics).

A multi-agent network maps per-agent inputs ``[*batch, n_agents, ...]`` to per-agent
outputs ``[*batch, n_agents, n_agent_outputs]``. Two switches:

* ``share_params``: one network for every agent (``True``), or one per agent (``False``:
  the agents' parameters are stacked along a leading ``[n_agents]`` dim and run with one
  ``torch.vmap`` of ``torch.func.functional_call``, never a Python loop over agents);
* ``centralized``: each agent's network reads every agent's input (flattened: the MLP
  reads ``[*batch, n_agents * n_agent_inputs]``, the ConvNet stacks the agents' images
  along the channels) and still writes one output per agent; ``False``: each agent reads
  its own input.

Mixers (:class:`VDNMixer`, :class:`QMixer`) turn the chosen per-agent values
``[*batch, n_agents, 1]`` (and the global state) into one team value ``[*batch, 1]``.

Example:
    >>> import torch
    >>> mlp = MultiAgentMLP(n_agent_inputs=4, n_agent_outputs=2, n_agents=3,
    ...                     centralized=False, share_params=False, depth=2, num_cells=32)
    >>> mlp(torch.randn(10, 3, 4)).shape   # [batch, agents, inputs] -> [batch, agents, outputs]
    torch.Size([10, 3, 2])
    >>> mixer = QMixer(state_shape=(5,), mixing_embed_dim=8, n_agents=3)
    >>> mixer(torch.randn(10, 3, 1), torch.randn(10, 5)).shape
    torch.Size([10, 1])
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..tensordict.nn import TensorDictModule
from .conv import ConvNet
from .mlp import MLP

__all__ = ["MultiAgentNetBase", "MultiAgentMLP", "MultiAgentConvNet", "Mixer", "VDNMixer", "QMixer",
           "CrossCriticGroupSpec", "CrossGroupCritic"]


def _flat_name(name: str) -> str:
    return name.replace(".", "__")


class MultiAgentNetBase(nn.Module):
    """Base of the multi-agent networks: builds one network per agent (or one shared) and
    runs them on ``[*batch, n_agents, ...]`` inputs in one call.

    Subclasses implement ``_build_single_net(device, **kwargs) -> nn.Module`` (one agent's
    network, reading ``[*batch, ...]``) and ``_pre_forward_check(x) -> Tensor`` (checks the
    input and, for a centralised network, merges the agents' inputs).

    Args:
        n_agents: number of agents.
        centralized: each agent's network reads every agent's input.
        share_params: one network (one set of parameters) for all agents.
        agent_dim: the agent dim of the input (``-2`` for vectors, ``-4`` for images).
        vmap_randomness: ``torch.vmap``'s ``randomness`` (``"different"``: dropout draws
            differ across agents).
        device: where the parameters are created.
        **kwargs: passed to ``_build_single_net``.

    With ``share_params=False`` the parameters live in ``self.params`` (a
    ``ParameterDict``; each entry ``[n_agents, *shape]``, named like the single network's
    parameter with ``.`` written ``__``); ``self.get_stateful_net(i)`` gives agent ``i``'s
    network as a plain module. With ``share_params=True`` the network is ``self.net``.
    """

    def __init__(
        self,
        *,
        n_agents: int,
        centralized: bool | None = None,
        share_params: bool | None = None,
        agent_dim: int = -2,
        vmap_randomness: str = "different",
        device: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if centralized is None or share_params is None:
            raise TypeError(f"{name} needs centralized=True|False and share_params=True|False (no default, as TorchRL)")
        if int(n_agents) < 1:
            raise ValueError(f"{name}: n_agents must be >= 1, got {n_agents}")
        self.n_agents = int(n_agents)
        self.centralized = bool(centralized)
        self.share_params = bool(share_params)
        self.agent_dim = int(agent_dim)
        self.vmap_randomness = vmap_randomness
        if self.share_params:
            self.net = self._build_single_net(device=device, **kwargs)
            return
        nets = [self._build_single_net(device=device, **kwargs) for _ in range(self.n_agents)]
        self._names = [n for n, _ in nets[0].named_parameters()]
        self._buffer_names = [n for n, _ in nets[0].named_buffers()]
        per_net = [dict(net.named_parameters()) for net in nets]
        self.params = nn.ParameterDict(
            {_flat_name(n): nn.Parameter(torch.stack([p[n].detach() for p in per_net])) for n in self._names}
        )
        for n in self._buffer_names:
            stacked = torch.stack([dict(net.named_buffers())[n] for net in nets])
            self.register_buffer("_stacked_" + _flat_name(n), stacked)
        # the template the stacked parameters are swapped into; not a submodule (its own
        # tensors are never used: functional_call replaces every parameter and buffer)
        object.__setattr__(self, "_template", nets[0])

    def _build_single_net(self, *, device: Any, **kwargs: Any) -> nn.Module:  # pragma: no cover - abstract
        raise NotImplementedError

    def _pre_forward_check(self, x: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _stacked(self) -> dict[str, Tensor]:
        out = {n: self.params[_flat_name(n)] for n in self._names}
        for n in self._buffer_names:
            out[n] = getattr(self, "_stacked_" + _flat_name(n))
        return out

    def get_stateful_net(self, agent: int = 0) -> nn.Module:
        """Agent ``agent``'s network as a plain module holding a copy of its parameters
        (the shared network itself with ``share_params=True``)."""
        if self.share_params:
            return self.net
        net = copy.deepcopy(self._template)
        with torch.no_grad():
            for n, t in self._stacked().items():
                own = net.get_parameter(n) if n in self._names else net.get_buffer(n)
                own.copy_(t[agent])
        return net

    def forward(self, *inputs: Tensor) -> Tensor:
        x = inputs[0] if len(inputs) == 1 else torch.cat(inputs, -1)
        x = self._pre_forward_check(x)
        if self.share_params:
            out = self.net(x)
            if self.centralized:  # the same output for every agent
                out = out.unsqueeze(-2).expand(*out.shape[:-1], self.n_agents, out.shape[-1])
            return out
        template = self._template

        def call(params: dict[str, Tensor], xi: Tensor) -> Tensor:
            return torch.func.functional_call(template, params, (xi,))

        in_dim = None if self.centralized else self.agent_dim
        return torch.vmap(call, in_dims=(0, in_dim), out_dims=-2, randomness=self.vmap_randomness)(self._stacked(), x)

    def _check_agents(self, x: Tensor, feature_dims: int, what: str) -> None:
        if x.ndim < feature_dims + 1 or x.shape[-feature_dims - 1] != self.n_agents:
            raise ValueError(
                f"{type(self).__name__}: expected input {what} with n_agents={self.n_agents} at dim "
                f"{-feature_dims - 1}, got shape {list(x.shape)}"
            )

    def extra_repr(self) -> str:
        return f"n_agents={self.n_agents}, centralized={self.centralized}, share_params={self.share_params}"


class MultiAgentMLP(MultiAgentNetBase):
    """Per-agent MLPs: ``[*batch, n_agents, n_agent_inputs] -> [*batch, n_agents, n_agent_outputs]``.

    Args:
        n_agent_inputs: input size of each agent (required: stacked parameters need it).
        n_agent_outputs: output size of each agent.
        n_agents: number of agents.
        centralized: each agent's MLP reads every agent's input, flattened to
            ``n_agents * n_agent_inputs`` (a centralised critic); the output stays per agent.
        share_params: one MLP for all agents; centralised + shared computes it once and
            gives every agent the same output.
        device: where the parameters are created.
        depth, num_cells, activation_class: as :class:`~steersman.modules.MLP`
            (defaults: depth 3 of 32 cells, ``nn.Tanh``, as TorchRL).
        **kwargs: other :class:`~steersman.modules.MLP` keywords (``activation_kwargs``,
            ``norm_class``, ``dropout``...).

    Inputs may have any number of batch dims; several inputs are concatenated along the
    last dim. An input whose agent dim (``-2``) is not ``n_agents``, or whose feature dim is
    not ``n_agent_inputs``, raises a ValueError naming both.

    Example:
        >>> import torch
        >>> critic = MultiAgentMLP(n_agent_inputs=4, n_agent_outputs=1, n_agents=3,
        ...                        centralized=True, share_params=True, depth=1, num_cells=16)
        >>> v = critic(torch.randn(5, 7, 3, 4))       # [5, 7] batch, 3 agents
        >>> v.shape, bool((v[..., 0, :] == v[..., 1, :]).all())
        (torch.Size([5, 7, 3, 1]), True)
    """

    def __init__(
        self,
        n_agent_inputs: int | None,
        n_agent_outputs: int,
        n_agents: int,
        *,
        centralized: bool | None = None,
        share_params: bool | None = None,
        device: Any = None,
        depth: int | None = None,
        num_cells: Sequence[int] | int | None = None,
        activation_class: type[nn.Module] | Callable[..., nn.Module] = nn.Tanh,
        vmap_randomness: str = "different",
        **kwargs: Any,
    ) -> None:
        if n_agent_inputs is None:
            raise ValueError(
                "MultiAgentMLP: n_agent_inputs=None (a lazy input size) is not supported; the agents' "
                "parameters are stacked at construction, so give the per-agent input size"
            )
        self.n_agent_inputs = int(n_agent_inputs)
        self.n_agent_outputs = int(n_agent_outputs)
        if num_cells is None and depth is None:
            depth, num_cells = 3, 32
        elif num_cells is None:
            num_cells = 32
        in_features = self.n_agent_inputs * (int(n_agents) if centralized else 1)
        super().__init__(
            n_agents=n_agents, centralized=centralized, share_params=share_params, agent_dim=-2,
            vmap_randomness=vmap_randomness, device=device, in_features=in_features, depth=depth,
            num_cells=num_cells, activation_class=activation_class, **kwargs,
        )

    def _build_single_net(self, *, device: Any, **kwargs: Any) -> nn.Module:
        return MLP(out_features=self.n_agent_outputs, device=device, **kwargs)

    def _pre_forward_check(self, x: Tensor) -> Tensor:
        self._check_agents(x, 1, f"[*batch, n_agents, {self.n_agent_inputs}]")
        if x.shape[-1] != self.n_agent_inputs:
            raise ValueError(
                f"MultiAgentMLP: expected n_agent_inputs={self.n_agent_inputs} features in the last dim, "
                f"got shape {list(x.shape)}"
            )
        if self.centralized:
            x = x.flatten(-2, -1)
        return x


class MultiAgentConvNet(MultiAgentNetBase):
    """Per-agent ConvNets: ``[*batch, n_agents, C, H, W] -> [*batch, n_agents, features]``.

    Args:
        n_agents: number of agents.
        centralized: each agent's ConvNet reads every agent's image, stacked along the
            channels (``n_agents * C`` input channels).
        share_params: one ConvNet for all agents.
        in_features: input channels of one agent (required: parameters are stacked).
        device: where the parameters are created.
        num_cells, kernel_sizes, strides, paddings, activation_class: as
            :class:`~steersman.modules.ConvNet` (defaults ``[32, 32, 32]``, 5, 2, 0,
            ``nn.ELU``, as TorchRL).
        **kwargs: other :class:`~steersman.modules.ConvNet` keywords.

    Example:
        >>> import torch
        >>> net = MultiAgentConvNet(n_agents=2, centralized=False, share_params=False, in_features=3,
        ...                         num_cells=[4], kernel_sizes=3, strides=1)
        >>> net(torch.randn(6, 2, 3, 8, 8)).shape   # 4 channels of 6x6 per agent
        torch.Size([6, 2, 144])
    """

    def __init__(
        self,
        n_agents: int,
        centralized: bool | None = None,
        share_params: bool | None = None,
        *,
        in_features: int | None = None,
        device: Any = None,
        num_cells: Sequence[int] | None = None,
        kernel_sizes: Sequence[int] | int = 5,
        strides: Sequence[int] | int = 2,
        paddings: Sequence[int] | int = 0,
        activation_class: type[nn.Module] | Callable[..., nn.Module] = nn.ELU,
        vmap_randomness: str = "different",
        **kwargs: Any,
    ) -> None:
        if in_features is None:
            raise ValueError(
                "MultiAgentConvNet: in_features=None (lazy channels) is not supported; the agents' "
                "parameters are stacked at construction, so give the channels of one agent's image"
            )
        self.in_features = int(in_features)
        channels = self.in_features * (int(n_agents) if centralized else 1)
        super().__init__(
            n_agents=n_agents, centralized=centralized, share_params=share_params, agent_dim=-4,
            vmap_randomness=vmap_randomness, device=device, in_features=channels,
            num_cells=[32, 32, 32] if num_cells is None else num_cells, kernel_sizes=kernel_sizes,
            strides=strides, paddings=paddings, activation_class=activation_class, **kwargs,
        )

    def _build_single_net(self, *, device: Any, **kwargs: Any) -> nn.Module:
        return ConvNet(device=device, **kwargs)

    def _pre_forward_check(self, x: Tensor) -> Tensor:
        self._check_agents(x, 3, f"[*batch, n_agents, {self.in_features}, H, W]")
        if x.shape[-3] != self.in_features:
            raise ValueError(
                f"MultiAgentConvNet: expected in_features={self.in_features} channels at dim -3, "
                f"got shape {list(x.shape)}"
            )
        if self.centralized:
            x = x.flatten(-4, -3)  # [*B, n * C, H, W]
        return x


# ---------------------------------------------------------------------- mixers
class Mixer(nn.Module):
    """Base of the value mixers: ``[*batch, n_agents, 1]`` chosen values (and the state
    ``[*batch, *state_shape]``) -> ``[*batch, 1]`` team value.

    Subclasses implement ``mix(chosen_action_value, state)`` on flat inputs
    ``[N, n_agents, 1]`` and ``[N, *state_shape]`` returning ``[N, 1]``; this class checks
    the shapes (a ValueError names expected vs actual) and handles the batch dims. Use it
    in a ``TensorDictModule`` with ``in_keys=[("agents", "chosen_action_value"), "state"]``
    (just the first without a state) and ``out_keys=["chosen_action_value"]``.

    Args:
        n_agents: number of agents.
        needs_state: whether ``mix`` reads the state.
        state_shape: the state's shape without batch dims.
        device: where the parameters are created.
    """

    def __init__(self, n_agents: int, needs_state: bool, state_shape: Sequence[int] | torch.Size | int = (),
                 device: Any = None) -> None:
        super().__init__()
        self.n_agents = int(n_agents)
        self.needs_state = bool(needs_state)
        self.state_shape = torch.Size([state_shape] if isinstance(state_shape, int) else state_shape)
        self.device = device

    def forward(self, *inputs: Tensor) -> Tensor:
        name = type(self).__name__
        if len(inputs) != 1 + int(self.needs_state):
            raise TypeError(f"{name} takes {'(chosen_action_value, state)' if self.needs_state else '(chosen_action_value)'}, "
                            f"got {len(inputs)} inputs")
        q = inputs[0]
        if q.ndim < 2 or q.shape[-2:] != (self.n_agents, 1):
            raise ValueError(f"{name}: chosen_action_value must be [*batch, n_agents={self.n_agents}, 1], got {list(q.shape)}")
        batch = q.shape[:-2]
        state = None
        if self.needs_state:
            state = inputs[1]
            if state.shape != (*batch, *self.state_shape):
                raise ValueError(f"{name}: state must be [*batch, *state_shape] = {[*batch, *self.state_shape]}, "
                                 f"got {list(state.shape)}")
            state = state.reshape(-1, *self.state_shape)
        return self.mix(q.reshape(-1, self.n_agents, 1), state).reshape(*batch, 1)

    def mix(self, chosen_action_value: Tensor, state: Tensor | None) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError


class VDNMixer(Mixer):
    """Value decomposition (Sunehag et al., 2017): ``Q_tot = sum_i Q_i``.

    Example:
        >>> import torch
        >>> VDNMixer(n_agents=2)(torch.tensor([[[1.0], [2.0]]]))
        tensor([[3.]])
    """

    def __init__(self, n_agents: int, device: Any = None) -> None:
        super().__init__(n_agents=n_agents, needs_state=False, device=device)

    def mix(self, chosen_action_value: Tensor, state: Tensor | None) -> Tensor:
        return chosen_action_value.sum(-2)


class QMixer(Mixer):
    """QMIX (Rashid et al., 2018): a monotonic mixing network whose weights come from
    hypernetworks of the state.

    ``h = elu(q @ |W1(s)| + b1(s))`` with ``q`` ``[N, 1, n_agents]``, ``W1(s)``
    ``[n_agents, embed]``; ``Q_tot = h @ |W2(s)| + V(s)``. The absolute values make
    ``Q_tot`` non-decreasing in every ``Q_i`` (so the argmax of each agent's ``Q_i`` is the
    argmax of ``Q_tot``). ``W1``, ``b1``, ``W2`` are linear maps of the flattened state;
    ``V`` is a two-layer MLP with a ReLU.

    Args:
        state_shape: the global state's shape (without batch dims).
        mixing_embed_dim: width of the mixing layer.
        n_agents: number of agents.
        device: where the parameters are created.

    Example:
        >>> import torch
        >>> mixer = QMixer(state_shape=(4,), mixing_embed_dim=8, n_agents=2)
        >>> mixer(torch.randn(3, 5, 2, 1), torch.randn(3, 5, 4)).shape
        torch.Size([3, 5, 1])
    """

    def __init__(self, state_shape: Sequence[int] | torch.Size | int, mixing_embed_dim: int, n_agents: int,
                 device: Any = None) -> None:
        super().__init__(n_agents=n_agents, needs_state=True, state_shape=state_shape, device=device)
        self.embed_dim = int(mixing_embed_dim)
        self.state_dim = int(torch.Size(self.state_shape).numel())
        self.hyper_w_1 = nn.Linear(self.state_dim, self.embed_dim * self.n_agents, device=device)
        self.hyper_w_final = nn.Linear(self.state_dim, self.embed_dim, device=device)
        self.hyper_b_1 = nn.Linear(self.state_dim, self.embed_dim, device=device)
        self.V = nn.Sequential(nn.Linear(self.state_dim, self.embed_dim, device=device), nn.ReLU(),
                               nn.Linear(self.embed_dim, 1, device=device))

    def mix(self, chosen_action_value: Tensor, state: Tensor | None) -> Tensor:
        s = state.reshape(-1, self.state_dim)
        q = chosen_action_value.transpose(-1, -2)                                  # [N, 1, n]
        w1 = self.hyper_w_1(s).abs().view(-1, self.n_agents, self.embed_dim)       # [N, n, E]
        b1 = self.hyper_b_1(s).view(-1, 1, self.embed_dim)                         # [N, 1, E]
        hidden = nn.functional.elu(torch.bmm(q, w1) + b1)                          # [N, 1, E]
        w2 = self.hyper_w_final(s).abs().view(-1, self.embed_dim, 1)               # [N, E, 1]
        v = self.V(s).view(-1, 1, 1)
        return (torch.bmm(hidden, w2) + v).view(-1, 1)


# ---------------------------------------------------------------------- critic over several groups
@dataclass
class CrossCriticGroupSpec:
    """One agent group read by :class:`CrossGroupCritic`.

    Args:
        obs_dim: the length of each agent's observation vector.
        n_agents: the group's number of agents.
        obs_key: where the group's observations ``[*B, n_agents, obs_dim]`` are read,
            e.g. ``("soldiers", "observation")``.
        value_key: where the group's values ``[*B, n_agents, 1]`` are written, e.g.
            ``("soldiers", "state_value")``.
    """

    obs_dim: int
    n_agents: int
    obs_key: Any
    value_key: Any


class _CrossGroupNet(nn.Module):
    """Per-group encoders -> the whole team's embeddings through one trunk -> a value per agent."""

    def __init__(self, specs: dict[str, CrossCriticGroupSpec], d_model: int, trunk_depth: int, trunk_cells: int,
                 activation_class: type[nn.Module], share_params: bool, detach: frozenset[str], device: Any) -> None:
        super().__init__()
        self.names = list(specs)
        self.specs = specs
        self.n_agents = [spec.n_agents for spec in specs.values()]
        self.n_total = sum(self.n_agents)
        self.detach = detach
        self.encoders = nn.ModuleDict({
            name: nn.Sequential(nn.Linear(spec.obs_dim, d_model, device=device), activation_class())
            for name, spec in specs.items()})
        team = self.n_total * d_model
        self.trunk = MLP(in_features=team, out_features=team, depth=trunk_depth, num_cells=trunk_cells,
                         activation_class=activation_class, device=device)
        if share_params:
            self.shared_head, self.group_heads = nn.Linear(d_model, 1, device=device), None
        else:
            self.shared_head = None
            self.group_heads = nn.ModuleDict({name: nn.Linear(d_model, 1, device=device) for name in specs})

    def forward(self, *group_obs: Tensor) -> tuple[Tensor, ...]:
        try:
            embedded = []
            for name, obs in zip(self.names, group_obs):
                e = self.encoders[name](obs)  # [*B, n_g, d_model]
                embedded.append(e.detach() if name in self.detach else e)
            team = self.trunk(torch.cat(embedded, -2).flatten(-2))  # [*B, n_total * d_model]
        except RuntimeError as err:  # shapes are checked only when something failed
            raise self._shape_error(group_obs) from err
        per_agent = team.unflatten(-1, (self.n_total, -1)).split(self.n_agents, -2)
        if self.shared_head is not None:
            return tuple(self.shared_head(x) for x in per_agent)
        return tuple(self.group_heads[name](x) for name, x in zip(self.names, per_agent))

    def _shape_error(self, group_obs: Sequence[Tensor]) -> ValueError:
        batch = None
        for name, obs in zip(self.names, group_obs):
            spec = self.specs[name]
            want = (spec.n_agents, spec.obs_dim)
            if obs.ndim < 2 or tuple(obs.shape[-2:]) != want:
                return ValueError(f"CrossGroupCritic: group {name!r} ({spec.obs_key!r}) has observations of shape "
                                  f"{list(obs.shape)}, expected [*B, {want[0]}, {want[1]}] (n_agents, obs_dim)")
            if batch is not None and obs.shape[:-2] != batch[1]:
                return ValueError(f"CrossGroupCritic: groups {batch[0]!r} and {name!r} have different batch dims "
                                  f"({list(batch[1])} and {list(obs.shape[:-2])})")
            batch = batch or (name, obs.shape[:-2])
        return ValueError("CrossGroupCritic: the groups' observations do not fit the network")


class CrossGroupCritic(TensorDictModule):
    """A centralised critic over several agent groups, each with its own observation size.

    :class:`MultiAgentMLP` centralises within one group. This critic reads every group in
    ``group_map``: each group's observations ``[*B, n_g, obs_dim_g]`` go through the group's
    own encoder (``Linear(obs_dim_g, d_model)`` and the activation), the embeddings of all
    agents of all groups, in the order of ``group_map``, are concatenated into one team
    vector ``[*B, (sum n_g) * d_model]`` that a shared MLP trunk (``trunk_depth`` hidden
    layers of ``trunk_cells``, output as wide as its input) maps to one ``d_model``
    embedding per agent, and a linear head gives each agent's value ``[*B, n_g, 1]`` at the
    group's ``value_key``. Every value therefore depends on every group's observations.

    A plain :class:`~steersman.tensordict.nn.TensorDictModule` (in_keys: the groups'
    ``obs_key``, out_keys: their ``value_key``): it is a critic for
    :class:`~steersman.objectives.MAPPOLoss`/:class:`~steersman.objectives.IPPOLoss` as is.

    Args:
        group_map: ``{group: CrossCriticGroupSpec}``, in the order the groups enter the team
            vector.

    Keyword Args:
        d_model: the embedding width of every agent (default 64).
        trunk_depth: hidden layers of the shared trunk (default 2).
        trunk_cells: width of the trunk's hidden layers (default 256).
        activation_class: activation of the encoders and the trunk (default ``nn.Tanh``).
        share_params: one value head for every group (``True``) or one per group
            (``False``, default). Encoders are always per group, the trunk always shared.
        detach_groups: groups whose embeddings are detached before the trunk: their
            observations still shape every value, but no gradient reaches their encoders
            (a group with a fixed policy whose observations inform the baseline).
        device: where the parameters live.

    Observations of the wrong shape raise a ``ValueError`` naming the group, its key and
    the expected ``[*B, n_agents, obs_dim]`` (checked only when the network fails).

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> critic = CrossGroupCritic({
        ...     "soldiers": CrossCriticGroupSpec(12, 3, ("soldiers", "observation"), ("soldiers", "state_value")),
        ...     "medics": CrossCriticGroupSpec(8, 2, ("medics", "observation"), ("medics", "state_value")),
        ... }, d_model=16, trunk_depth=1, trunk_cells=32)
        >>> td = TensorDict({"soldiers": TensorDict({"observation": torch.randn(4, 3, 12)}, [4, 3]),
        ...                  "medics": TensorDict({"observation": torch.randn(4, 2, 8)}, [4, 2])}, [4])
        >>> td = critic(td)
        >>> td["soldiers", "state_value"].shape, td["medics", "state_value"].shape
        (torch.Size([4, 3, 1]), torch.Size([4, 2, 1]))
    """

    def __init__(self, group_map: Mapping[str, CrossCriticGroupSpec], *, d_model: int = 64, trunk_depth: int = 2,
                 trunk_cells: int = 256, activation_class: type[nn.Module] = nn.Tanh, share_params: bool = False,
                 detach_groups: Iterable[str] | None = None, device: Any = None) -> None:
        specs = dict(group_map)
        if not specs:
            raise ValueError("CrossGroupCritic: group_map is empty; give at least one {group: CrossCriticGroupSpec}")
        for name, spec in specs.items():
            if not isinstance(spec, CrossCriticGroupSpec):
                raise TypeError(f"CrossGroupCritic: group {name!r} maps to a {type(spec).__name__}, expected a "
                                "CrossCriticGroupSpec")
            if spec.obs_dim < 1 or spec.n_agents < 1:
                raise ValueError(f"CrossGroupCritic: group {name!r} needs obs_dim >= 1 and n_agents >= 1, got "
                                 f"obs_dim={spec.obs_dim}, n_agents={spec.n_agents}")
        detach = frozenset(detach_groups or ())
        unknown = sorted(detach - set(specs))
        if unknown:
            raise ValueError(f"CrossGroupCritic: detach_groups names {unknown}, which are not in group_map "
                             f"({list(specs)})")
        net = _CrossGroupNet(specs, d_model, trunk_depth, trunk_cells, activation_class, share_params, detach, device)
        super().__init__(net, in_keys=[s.obs_key for s in specs.values()],
                         out_keys=[s.value_key for s in specs.values()])
        self.group_map = specs
