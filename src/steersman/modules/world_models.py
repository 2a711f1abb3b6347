"""World models (model-based RL): Dreamer's recurrent state-space model and composable
world-model containers.

Dreamer (Hafner et al. 2019, "Dream to Control") keeps a deterministic *belief* ``h_t``
(a GRU state) and a stochastic *state* ``s_t`` (diagonal Gaussian):

* :class:`RSSMPrior`: ``h_{t+1} = GRU(ELU(W [s_t, a_t]), h_t)``, ``p(s_{t+1} | h_{t+1}) =
  N(mu, sigma)`` from an MLP of ``h_{t+1}`` (``sigma = softplus(.) >= scale_lb``);
* :class:`RSSMPosterior`: ``q(s_{t+1} | h_{t+1}, e_{t+1}) = N(mu, sigma)`` from an MLP of the
  belief and the encoded observation ``e_{t+1}``;
* :class:`RSSMRollout`: runs prior then posterior along the time dim of a batch, the
  posterior sample of step ``t`` feeding the prior of step ``t + 1``;
* :class:`ObsEncoder` / :class:`ObsDecoder`: the convolutional pixel encoder
  (``[*B, C, 64, 64] -> [*B, 1024]`` with the defaults) and its transposed-convolution decoder
  (``(state, belief) -> [*B, 3, 64, 64]``).

:class:`WorldModel` composes encoder, dynamics and heads (with ``encode``/``step``/``decode``);
:class:`WorldModelWrapper` is TorchRL's older transition + reward pair.
:class:`SymExpTwoHot` is DreamerV3's categorical scalar head (two-hot on a symexp grid).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor, nn

from ..tensordict import TensorDictBase
from ..tensordict.nn import NormalParamExtractor, TensorDictModuleBase, TensorDictSequential
from .two_hot import symexp, two_hot_cross_entropy, two_hot_decode, two_hot_encode

__all__ = [
    "ObsEncoder",
    "ObsDecoder",
    "RSSMPrior",
    "RSSMPosterior",
    "RSSMRollout",
    "WorldModel",
    "WorldModelWrapper",
    "SymExpTwoHot",
]


def _channels(cls: type, channels: int, depth: int | None, num_layers: int) -> int:
    if depth is not None:
        warnings.warn(f"{cls.__name__}(depth=...) is TorchRL's old name of channels; use channels=",
                      DeprecationWarning, stacklevel=3)
        channels = depth
    if num_layers < 1:
        raise ValueError(f"{cls.__name__}: num_layers must be >= 1, got {num_layers}")
    return channels


class ObsEncoder(nn.Module):
    """Dreamer's pixel encoder: ``num_layers`` stride-2 4x4 convolutions with ReLU, the
    channels doubling from ``channels``; the output is flattened.

    Args:
        channels: the first layer's channels (default 32).
        num_layers: the depth (default 4).
        in_channels: the image channels (``None``: a lazy first layer).
        depth: TorchRL's deprecated name of ``channels``.
        device: where the parameters are made.

    ``forward(observation [*B, C, H, W]) -> [*B, features]`` (``[*B, 1024]`` for 64x64
    images and the defaults).

    Example:
        >>> import torch
        >>> ObsEncoder(in_channels=3)(torch.randn(2, 5, 3, 64, 64)).shape
        torch.Size([2, 5, 1024])
    """

    def __init__(self, channels: int = 32, num_layers: int = 4, in_channels: int | None = None,
                 depth: int | None = None, device: Any = None) -> None:
        super().__init__()
        channels = _channels(type(self), channels, depth, num_layers)
        first = (nn.Conv2d(in_channels, channels, 4, stride=2, device=device) if in_channels is not None
                 else nn.LazyConv2d(channels, 4, stride=2, device=device))
        layers: list[nn.Module] = [first, nn.ReLU()]
        for i in range(1, num_layers):
            layers += [nn.Conv2d(channels * 2 ** (i - 1), channels * 2 ** i, 4, stride=2, device=device), nn.ReLU()]
        self.encoder = nn.Sequential(*layers)

    def forward(self, observation: Tensor) -> Tensor:
        """``[*B, C, H, W] -> [*B, features]``."""
        batch = observation.shape[:-3]
        return self.encoder(observation.reshape(-1, *observation.shape[-3:])).reshape(*batch, -1)


class ObsDecoder(nn.Module):
    """Dreamer's pixel decoder: ``Linear -> [*B, 8 * channels * 4, 1, 1]`` then transposed
    convolutions (stride 2, ReLU between) halving the channels down to ``out_channels``.

    Args:
        channels: the channels before the last layer (default 32).
        num_layers: the depth (default 4).
        kernel_sizes: per layer, or one int (default ``[5, 5, 6, 6]`` for 4 layers, which
            gives 64x64 images; else 5 everywhere).
        latent_dim: ``state_dim + rnn_hidden_dim`` (``None``: a lazy first layer).
        out_channels: the image channels (default 3).
        depth: TorchRL's deprecated name of ``channels``.
        device: where the parameters are made.

    ``forward(state [*B, S], rnn_hidden [*B, H]) -> [*B, out_channels, H', W']``.

    Example:
        >>> import torch
        >>> ObsDecoder(latent_dim=30 + 200)(torch.randn(2, 5, 30), torch.randn(2, 5, 200)).shape
        torch.Size([2, 5, 3, 64, 64])
    """

    def __init__(self, channels: int = 32, num_layers: int = 4, kernel_sizes: int | list[int] | None = None,
                 latent_dim: int | None = None, out_channels: int = 3, depth: int | None = None,
                 device: Any = None) -> None:
        super().__init__()
        channels = _channels(type(self), channels, depth, num_layers)
        if kernel_sizes is None:
            kernel_sizes = [5, 5, 6, 6] if num_layers == 4 else 5
        if isinstance(kernel_sizes, int):
            kernel_sizes = [kernel_sizes] * num_layers
        if len(kernel_sizes) != num_layers:
            raise ValueError(f"ObsDecoder: {len(kernel_sizes)} kernel_sizes for {num_layers} layers")
        width = channels * 8 * 2 * 2
        first = nn.Linear(latent_dim, width, device=device) if latent_dim is not None else nn.LazyLinear(width,
                                                                                                          device=device)
        self.state_to_latent = nn.Sequential(first, nn.ReLU())
        # channels per layer output, from the first transposed conv to the last
        outs = [channels * 2 ** (num_layers - 2 - i) for i in range(num_layers - 1)] + [out_channels]
        layers: list[nn.Module] = []
        previous = width
        for i, (out, k) in enumerate(zip(outs, kernel_sizes)):
            layers.append(nn.ConvTranspose2d(previous, out, k, stride=2, device=device))
            if i < num_layers - 1:
                layers.append(nn.ReLU())
            previous = out
        self.decoder = nn.Sequential(*layers)

    def forward(self, state: Tensor, rnn_hidden: Tensor) -> Tensor:
        """``(state, belief) -> image [*B, C, H, W]``."""
        latent = self.state_to_latent(torch.cat([state, rnn_hidden], dim=-1))
        batch = latent.shape[:-1]
        image = self.decoder(latent.reshape(-1, latent.shape[-1], 1, 1))
        return image.reshape(*batch, *image.shape[-3:])


class RSSMPrior(nn.Module):
    """The RSSM's prior: the next belief and the state distribution it predicts.

    Args:
        action_spec: the action spec (its shape is kept as ``action_shape``).
        hidden_dim: width of the MLPs and the GRU input (default 200).
        rnn_hidden_dim: the belief size (default 200).
        state_dim: the stochastic state size (default 30).
        scale_lb: lower bound of the standard deviation (default 0.1).
        action_dim: the action size (``None``: a lazy first layer).
        device: where the parameters are made.

    ``forward(state [*B, S], belief [*B, H], action [*B, A], noise=None) -> (prior_mean,
    prior_std, state, belief)``: the state is ``mean + noise * std`` (``noise`` drawn from a
    standard normal unless given).

    Example:
        >>> import torch
        >>> from steersman.data import Bounded
        >>> prior = RSSMPrior(Bounded(-1.0, 1.0, shape=(2,)), hidden_dim=8, rnn_hidden_dim=6, state_dim=4,
        ...                   action_dim=2)
        >>> mean, std, state, belief = prior(torch.zeros(5, 4), torch.zeros(5, 6), torch.zeros(5, 2))
        >>> state.shape, belief.shape, bool((std >= 0.1).all())
        (torch.Size([5, 4]), torch.Size([5, 6]), True)
    """

    def __init__(self, action_spec: Any, hidden_dim: int = 200, rnn_hidden_dim: int = 200, state_dim: int = 30,
                 scale_lb: float = 0.1, action_dim: int | None = None, device: Any = None) -> None:
        super().__init__()
        first = (nn.Linear(state_dim + action_dim, hidden_dim, device=device) if action_dim is not None
                 else nn.LazyLinear(hidden_dim, device=device))
        self.action_state_projector = nn.Sequential(first, nn.ELU())
        self.rnn = nn.GRUCell(hidden_dim, rnn_hidden_dim, device=device)
        self.rnn_to_prior_projector = nn.Sequential(
            nn.Linear(rnn_hidden_dim, hidden_dim, device=device), nn.ELU(),
            nn.Linear(hidden_dim, 2 * state_dim, device=device),
            NormalParamExtractor(scale_mapping="softplus", scale_lb=scale_lb),
        )
        self.state_dim, self.rnn_hidden_dim = state_dim, rnn_hidden_dim
        self.action_shape = getattr(action_spec, "shape", None)

    def forward(self, state: Tensor, belief: Tensor | None, action: Tensor,
                noise: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One prior step (see the class docstring)."""
        x = self.action_state_projector(torch.cat([state, action], dim=-1))
        batch = x.shape[:-1]
        flat_belief = None if belief is None else belief.reshape(-1, belief.shape[-1]).float()
        with torch.autocast(x.device.type, enabled=False):  # the GRU in fp32 (bf16 autocast trips some cuBLAS)
            new_belief = self.rnn(x.reshape(-1, x.shape[-1]).float(), flat_belief)
        new_belief = new_belief.reshape(*batch, -1).to(x.dtype)
        mean, std = self.rnn_to_prior_projector(new_belief)
        noise = torch.randn_like(std) if noise is None else noise
        return mean, std, mean + noise * std, new_belief


class RSSMPosterior(nn.Module):
    """The RSSM's posterior: the state distribution given the belief and the observation.

    Args:
        hidden_dim: the MLP width (default 200).
        state_dim: the stochastic state size (default 30).
        scale_lb: lower bound of the standard deviation (default 0.1).
        rnn_hidden_dim, obs_embed_dim: the belief and embedding sizes (both given: an
            explicit first layer; otherwise a lazy one).
        device: where the parameters are made.

    ``forward(belief [*B, H], obs_embedding [*B, E], noise=None) -> (posterior_mean,
    posterior_std, state)``.

    Example:
        >>> import torch
        >>> post = RSSMPosterior(hidden_dim=8, state_dim=4, rnn_hidden_dim=6, obs_embed_dim=10)
        >>> mean, std, state = post(torch.zeros(5, 6), torch.zeros(5, 10), noise=torch.zeros(5, 4))
        >>> torch.equal(state, mean)
        True
    """

    def __init__(self, hidden_dim: int = 200, state_dim: int = 30, scale_lb: float = 0.1,
                 rnn_hidden_dim: int | None = None, obs_embed_dim: int | None = None, device: Any = None) -> None:
        super().__init__()
        first = (nn.Linear(rnn_hidden_dim + obs_embed_dim, hidden_dim, device=device)
                 if rnn_hidden_dim is not None and obs_embed_dim is not None
                 else nn.LazyLinear(hidden_dim, device=device))
        self.obs_rnn_to_post_projector = nn.Sequential(
            first, nn.ELU(), nn.Linear(hidden_dim, 2 * state_dim, device=device),
            NormalParamExtractor(scale_mapping="softplus", scale_lb=scale_lb),
        )
        self.hidden_dim = hidden_dim

    def forward(self, belief: Tensor, obs_embedding: Tensor, noise: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """One posterior step (see the class docstring)."""
        mean, std = self.obs_rnn_to_post_projector(torch.cat([belief, obs_embedding], dim=-1))
        noise = torch.randn_like(std) if noise is None else noise
        return mean, std, mean + noise * std


class RSSMRollout(TensorDictModuleBase):
    """Runs the RSSM along the last (time) dim of a batch ``[*B, T]``.

    At each step the prior module (reading ``"state"``, ``"belief"`` and the action, writing
    ``("next", "belief")`` and the prior's parameters) then the posterior module (reading
    ``("next", "belief")`` and the encoded observation, writing ``("next", "state")``) run;
    their ``("next", "state")`` and ``("next", "belief")`` become step ``t + 1``'s
    ``"state"`` and ``"belief"``. The batch's own ``"state"``/``"belief"`` are read at
    ``t = 0`` only (the primer). Returns a new TensorDict ``[*B, T]`` with every step's
    inputs and outputs.

    Args:
        rssm_prior: a TensorDict module around :class:`RSSMPrior`.
        rssm_posterior: a TensorDict module around :class:`RSSMPosterior`.
        use_scan: TorchRL's switch to a scan higher-order op; the results are the same
            and the Python loop runs here either way.
        compile_step: ``torch.compile`` the one-step function (``compile_backend``,
            ``compile_mode``).

    Example:
        >>> import torch
        >>> from steersman.data import Bounded
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> prior = TensorDictModule(RSSMPrior(Bounded(-1.0, 1.0, shape=(2,)), 8, 6, 4, action_dim=2),
        ...     ["state", "belief", "action"],
        ...     [("next", "prior_mean"), ("next", "prior_std"), "_", ("next", "belief")])
        >>> post = TensorDictModule(RSSMPosterior(8, 4, rnn_hidden_dim=6, obs_embed_dim=10),
        ...     [("next", "belief"), ("next", "encoded_latents")],
        ...     [("next", "posterior_mean"), ("next", "posterior_std"), ("next", "state")])
        >>> rollout = RSSMRollout(prior, post)
        >>> td = TensorDict({"state": torch.zeros(3, 7, 4), "belief": torch.zeros(3, 7, 6),
        ...                  "action": torch.randn(3, 7, 2),
        ...                  "next": {"encoded_latents": torch.randn(3, 7, 10)}}, [3, 7])
        >>> out = rollout(td)
        >>> out["next", "state"].shape, torch.equal(out["state"][:, 1], out["next", "state"][:, 0])
        (torch.Size([3, 7, 4]), True)
    """

    def __init__(self, rssm_prior: nn.Module, rssm_posterior: nn.Module, use_scan: bool = False,
                 compile_step: bool = False, compile_backend: str = "inductor", compile_mode: str | None = None) -> None:
        super().__init__()
        sequence = TensorDictSequential(rssm_prior, rssm_posterior)
        self.in_keys, self.out_keys = list(sequence.in_keys), list(sequence.out_keys)
        self.rssm_prior, self.rssm_posterior = rssm_prior, rssm_posterior
        self.use_scan = use_scan
        self.compile_step, self.compile_backend, self.compile_mode = compile_step, compile_backend, compile_mode
        self._compiled: Any = None

    def _step(self, td: TensorDictBase) -> TensorDictBase:
        self.rssm_prior(td)
        self.rssm_posterior(td)
        return td

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """The rollout of ``tensordict`` ``[*B, T]`` (see the class docstring)."""
        if tensordict.batch_dims < 1:
            raise ValueError("RSSMRollout: the batch needs a time dim (its last batch dim), got batch_size []")
        step = self._step
        if self.compile_step:
            if self._compiled is None:
                self._compiled = torch.compile(self._step, backend=self.compile_backend, mode=self.compile_mode)
            step = self._compiled
        steps = tensordict.exclude(*self.out_keys).unbind(-1)
        keys = [*steps[0].keys(include_nested=True, leaves_only=True), *self.out_keys]
        outputs = []
        carry: TensorDictBase | None = None
        for current in steps:
            if carry is not None:
                current.set("state", carry.get(("next", "state")))
                current.set("belief", carry.get(("next", "belief")))
            carry = step(current)
            outputs.append(carry.select(*keys, strict=False))
        return torch.stack(outputs, tensordict.batch_dims - 1)


class WorldModel(TensorDictModuleBase):
    """A world model from parts: ``encoder`` (observation -> latent), ``dynamics`` (latent,
    action -> next latent), ``reward_head`` (next latent -> ``("next", "reward")``), and
    optionally ``done_head`` and ``decoder``; each a TensorDict module.

    ``forward`` runs them all in that order; :meth:`encode`, :meth:`step` (dynamics and
    heads, no encoder: one imagined step from a latent) and :meth:`decode` run parts.
    ``step_module`` is the step sequence (for a model-based env).

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> encoder = TensorDictModule(torch.nn.Linear(8, 4), ["observation"], ["latent"])
        >>> dynamics = TensorDictModule(lambda z, a: z + a.sum(-1, keepdim=True), ["latent", "action"],
        ...                             [("next", "latent")])
        >>> reward = TensorDictModule(torch.nn.Linear(4, 1), [("next", "latent")], [("next", "reward")])
        >>> model = WorldModel(encoder, dynamics, reward)
        >>> out = model(TensorDict({"observation": torch.randn(2, 8), "action": torch.randn(2, 2)}, [2]))
        >>> out["next", "reward"].shape
        torch.Size([2, 1])
    """

    def __init__(self, encoder: nn.Module, dynamics: nn.Module, reward_head: nn.Module, *,
                 done_head: nn.Module | None = None, decoder: nn.Module | None = None) -> None:
        super().__init__()
        self.encoder, self.dynamics, self.reward_head = encoder, dynamics, reward_head
        self.done_head, self.decoder = done_head, decoder
        heads = [m for m in (done_head, decoder) if m is not None]
        self._full_seq = TensorDictSequential(encoder, dynamics, reward_head, *heads)
        self._step_seq = TensorDictSequential(dynamics, reward_head, *heads)
        self.in_keys, self.out_keys = list(self._full_seq.in_keys), list(self._full_seq.out_keys)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """encoder -> dynamics -> reward_head [-> done_head] [-> decoder]."""
        return self._full_seq(tensordict)

    def encode(self, tensordict: TensorDictBase) -> TensorDictBase:
        """The encoder alone."""
        return self.encoder(tensordict)

    def step(self, tensordict: TensorDictBase) -> TensorDictBase:
        """One imagined step from the latent in ``tensordict`` (no encoder)."""
        return self._step_seq(tensordict)

    def decode(self, tensordict: TensorDictBase) -> TensorDictBase:
        """The decoder alone (a RuntimeError without one)."""
        if self.decoder is None:
            raise RuntimeError("WorldModel.decode needs a decoder: pass decoder=<module> when building the WorldModel")
        return self.decoder(tensordict)

    @property
    def step_module(self) -> TensorDictSequential:
        """dynamics -> heads, as one module."""
        return self._step_seq


class WorldModelWrapper(TensorDictSequential):
    """A transition model followed by a reward model (TorchRL's older world-model container).

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> transition = TensorDictModule(torch.nn.Linear(3, 3), ["observation"], ["next_observation"])
        >>> reward = TensorDictModule(torch.nn.Linear(3, 1), ["next_observation"], ["reward"])
        >>> model = WorldModelWrapper(transition, reward)
        >>> model(TensorDict({"observation": torch.randn(4, 3)}, [4]))["reward"].shape
        torch.Size([4, 1])
        >>> model.get_reward_operator() is reward
        True
    """

    def __init__(self, transition_model: nn.Module, reward_model: nn.Module) -> None:
        super().__init__(transition_model, reward_model)

    def get_transition_model_operator(self) -> nn.Module:
        """The transition model."""
        return self.module[0]

    def get_reward_operator(self) -> nn.Module:
        """The reward model."""
        return self.module[1]


class SymExpTwoHot(nn.Module):
    """DreamerV3's categorical scalar head: logits over ``num_bins`` values ``symexp(g)``
    for ``g`` evenly spaced in ``[-20, 20]`` (exactly symmetric around 0).

    ``encode(x)`` gives the two-hot target ``[*B, num_bins]`` (interpolating between the
    two neighbouring values), ``decode(logits)`` the softmax expectation ``[*B]``,
    ``loss(logits, target)`` the cross-entropy to the encoded target ``[*B]``;
    ``forward(logits)`` is ``decode`` with a trailing ``[1]``.

    Example:
        >>> import torch
        >>> head = SymExpTwoHot(num_bins=5)
        >>> target = torch.tensor([-10.0, 0.0, 10.0])
        >>> torch.allclose(head.decode(head.encode(target).log()), target, atol=1e-3)
        True
    """

    def __init__(self, num_bins: int = 255) -> None:
        super().__init__()
        if num_bins < 2:
            raise ValueError(f"SymExpTwoHot: num_bins must be >= 2, got {num_bins}")
        self.num_bins = num_bins
        grid = torch.linspace(-20.0, 20.0, num_bins)
        self.register_buffer("bins", symexp((grid - grid.flip(0)) / 2))

    def encode(self, target: Tensor) -> Tensor:
        """Two-hot weights ``[*B, num_bins]`` of raw targets ``[*B]``."""
        return two_hot_encode(target, self.bins)

    def decode(self, logits: Tensor) -> Tensor:
        """The expected value ``[*B]`` of logits ``[*B, num_bins]``."""
        return two_hot_decode(logits, self.bins)

    def loss(self, logits: Tensor, target: Tensor) -> Tensor:
        """Cross-entropy ``[*B]`` of ``logits`` to the two-hot encoding of ``target``."""
        return two_hot_cross_entropy(logits, target, self.bins)

    def forward(self, logits: Tensor) -> Tensor:
        """``decode(logits)[..., None]``."""
        return self.decode(logits).unsqueeze(-1)
