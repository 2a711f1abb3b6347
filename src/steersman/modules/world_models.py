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
DreamerV3's networks (categorical latents, straight-through samples, unimix, block GRU):
:class:`RSSMPriorV3`, :class:`RSSMPosteriorV3`, :class:`RSSMRolloutV3`,
:class:`RSSMStateEstimatorV3`.
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
    "RSSMPriorV3",
    "RSSMPosteriorV3",
    "RSSMRolloutV3",
    "RSSMStateEstimatorV3",
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


# ----------------------------------------------------------------------------------------
# DreamerV3 (Hafner et al. 2023, "Mastering Diverse Domains through World Models"): the
# stochastic state is ``num_categoricals`` one-hot vectors of ``num_classes`` classes,
# sampled with a straight-through gradient from logits mixed with ``unimix`` uniform mass.
# ----------------------------------------------------------------------------------------


def _unimix_probs(logits: Tensor, unimix: float) -> Tensor:
    """``(1 - unimix) * softmax(logits) + unimix / num_classes`` over the last dim."""
    probs = logits.softmax(-1)
    if unimix > 0:
        probs = (1.0 - unimix) * probs + unimix / logits.shape[-1]
    return probs


def _straight_through_sample(logits: Tensor, unimix: float, uniform: Tensor | None = None) -> Tensor:
    """A one-hot sample of ``Cat(_unimix_probs(logits))`` whose gradient is that of the
    probabilities. ``uniform`` ``[..., num_categoricals]`` in ``[0, 1)`` fixes the draw
    (inverse CDF: the class is the number of cumulative probabilities ``<= u``)."""
    probs = _unimix_probs(logits, unimix)
    if uniform is None:
        uniform = torch.rand(probs.shape[:-1], device=probs.device, dtype=probs.dtype)
    index = (probs.cumsum(-1) <= uniform.unsqueeze(-1)).sum(-1).clamp_max(probs.shape[-1] - 1)
    one_hot = torch.nn.functional.one_hot(index, probs.shape[-1]).to(probs.dtype)
    return probs + (one_hot - probs).detach()


def _check_unimix(cls: type, unimix: float) -> float:
    if not 0.0 <= unimix < 1.0:
        raise ValueError(f"{cls.__name__}: unimix must be in [0, 1), got {unimix}")
    return float(unimix)


class _RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dim (no shift)."""

    def __init__(self, features: int, eps: float, device: Any = None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(features, device=device))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _v3_init(module: nn.Module) -> None:
    # DreamerV3's linear init: truncated normal, std 1.1368 / sqrt(fan_in), zero bias.
    if isinstance(module, nn.Linear):
        std = 1.1368 / module.in_features ** 0.5
        nn.init.trunc_normal_(module.weight, std=std, a=-2 * std, b=2 * std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, _BlockLinear):
        std = 1.1368 / module.weight.shape[1] ** 0.5
        nn.init.trunc_normal_(module.weight, std=std, a=-2 * std, b=2 * std)
        nn.init.zeros_(module.bias)


def _dense(in_dim: int, out_dim: int, eps: float, device: Any) -> list[nn.Module]:
    return [nn.Linear(in_dim, out_dim, device=device), _RMSNorm(out_dim, eps, device), nn.SiLU()]


class _BlockLinear(nn.Module):
    """A block-diagonal linear map: ``[*B, G, in/G] -> [*B, G, out/G]``, one weight per block."""

    def __init__(self, in_features: int, out_features: int, num_blocks: int, device: Any = None) -> None:
        super().__init__()
        if in_features % num_blocks or out_features % num_blocks:
            raise ValueError(f"block linear: {in_features} and {out_features} features must be divisible by "
                             f"num_blocks={num_blocks}")
        self.weight = nn.Parameter(torch.empty(num_blocks, in_features // num_blocks, out_features // num_blocks,
                                               device=device))
        self.bias = nn.Parameter(torch.zeros(num_blocks, out_features // num_blocks, device=device))

    def forward(self, x: Tensor) -> Tensor:
        return torch.einsum("...gi,gio->...go", x, self.weight) + self.bias


class _BlockGRU(nn.Module):
    """DreamerV3's block GRU. With ``h`` the belief split in ``G`` blocks and
    ``f = [SiLU(RMS(W_h h)), SiLU(RMS(W_s s)), SiLU(RMS(W_a a'))]`` (``a' = a / max(1, |a|)``)
    given to every block: ``x = SiLU(RMS(Block([h_g, f])))`` (``num_layers`` times), then
    ``r, c, u = Block(x)``, ``r = sigmoid(r)``, ``c = tanh(r * c)``, ``u = sigmoid(u - 1)`` and
    ``h' = u * c + (1 - u) * h``."""

    def __init__(self, state_dim: int, action_dim: int, hidden_dim: int, belief_dim: int, num_blocks: int,
                 num_layers: int, eps: float, device: Any = None) -> None:
        super().__init__()
        if num_blocks < 1 or belief_dim % num_blocks:
            raise ValueError(f"block GRU: rnn_hidden_dim ({belief_dim}) must be divisible by num_blocks "
                             f"({num_blocks})")
        if num_layers < 1:
            raise ValueError(f"block GRU: num_layers must be >= 1, got {num_layers}")
        self.num_blocks = num_blocks
        self.belief_in = nn.Sequential(*_dense(belief_dim, hidden_dim, eps, device))
        self.state_in = nn.Sequential(*_dense(state_dim, hidden_dim, eps, device))
        self.action_in = nn.Sequential(*_dense(action_dim, hidden_dim, eps, device))
        width = belief_dim + 3 * hidden_dim * num_blocks
        self.layers = nn.ModuleList()
        self.norms = nn.ModuleList()
        for _ in range(num_layers):
            self.layers.append(_BlockLinear(width, belief_dim, num_blocks, device))
            self.norms.append(_RMSNorm(belief_dim, eps, device))
            width = belief_dim
        self.gates = _BlockLinear(belief_dim, 3 * belief_dim, num_blocks, device)
        self.apply(_v3_init)

    def forward(self, state: Tensor, belief: Tensor, action: Tensor) -> Tensor:
        action = action / action.detach().abs().clamp_min(1.0)
        feats = torch.cat([self.belief_in(belief), self.state_in(state), self.action_in(action)], -1)
        g = self.num_blocks
        batch = belief.shape[:-1]
        x = torch.cat([belief.reshape(*batch, g, -1), feats.unsqueeze(-2).expand(*batch, g, feats.shape[-1])], -1)
        for layer, norm in zip(self.layers, self.norms):
            x = nn.functional.silu(norm(layer(x).reshape(*batch, -1))).reshape(*batch, g, -1)
        reset, cand, update = self.gates(x).chunk(3, dim=-1)  # each [*B, G, H/G]
        reset, cand, update = (t.reshape(*batch, -1) for t in (reset, cand, update))
        reset = torch.sigmoid(reset)
        cand = torch.tanh(reset * cand)
        update = torch.sigmoid(update - 1.0)
        return update * cand + (1.0 - update) * belief


class RSSMPriorV3(nn.Module):
    """DreamerV3's prior: ``h_t = f(h_{t-1}, z_{t-1}, a_{t-1})`` and ``z_t ~ Cat(MLP(h_t))``.

    The stochastic state ``z`` is ``num_categoricals`` one-hot vectors of ``num_classes``
    classes, flattened to ``S = num_categoricals * num_classes``; it is sampled from
    ``(1 - unimix) * softmax(logits) + unimix / num_classes`` with a straight-through gradient
    (forward: the one-hot sample; backward: the gradient of the probabilities).

    Args:
        action_spec: an action spec (only its shape is read; exclusive with ``action_shape``).
        hidden_dim: the MLP width (default 512).
        rnn_hidden_dim: the belief size ``H`` (default 512).
        num_categoricals, num_classes: the latent's layout (default 32 x 32).
        action_dim: the action size (``None``: a lazy first layer, ``"gru"`` only).
        device: where the parameters are made.

    Keyword Args:
        action_shape: the action shape (exclusive with ``action_spec``).
        recurrent_model: ``"gru"`` (``GRUCell(SiLU(W [z, a]), h)``, TorchRL's default) or
            ``"block_gru"`` (DreamerV3's grouped GRU with RMS-normalised layers, ``num_blocks``
            groups, ``num_layers`` block layers; the prior head then has ``prior_num_layers``
            RMS-normalised layers).
        norm_eps: the RMS-norm epsilon (default ``1e-4``).
        unimix: uniform mass mixed into the categorical (default 0; DreamerV3 uses 0.01).

    ``forward(state [*B, S], belief [*B, H], action [*B, A]) -> (prior_logits [*B, C, K],
    state [*B, S], belief [*B, H])``.

    Example:
        >>> import torch
        >>> prior = RSSMPriorV3(action_shape=(2,), hidden_dim=16, rnn_hidden_dim=8, num_categoricals=4,
        ...                     num_classes=4, action_dim=2, recurrent_model="block_gru", num_blocks=2)
        >>> logits, state, belief = prior(torch.zeros(3, 16), torch.zeros(3, 8), torch.randn(3, 2))
        >>> logits.shape, state.shape, belief.shape, state.view(3, 4, 4).sum(-1).eq(1).all().item()
        (torch.Size([3, 4, 4]), torch.Size([3, 16]), torch.Size([3, 8]), True)
    """

    def __init__(self, action_spec: Any = None, hidden_dim: int = 512, rnn_hidden_dim: int = 512,
                 num_categoricals: int = 32, num_classes: int = 32, action_dim: int | None = None,
                 device: Any = None, *, action_shape: Any = None, recurrent_model: str = "gru",
                 num_blocks: int = 8, num_layers: int = 1, prior_num_layers: int = 2, norm_eps: float = 1e-4,
                 unimix: float = 0.0) -> None:
        super().__init__()
        if action_spec is not None and action_shape is not None:
            raise ValueError("RSSMPriorV3: pass action_spec or action_shape, not both")
        if recurrent_model not in ("gru", "block_gru"):
            raise ValueError(f"RSSMPriorV3: recurrent_model must be 'gru' or 'block_gru', got {recurrent_model!r}")
        if recurrent_model == "block_gru" and action_dim is None:
            raise ValueError("RSSMPriorV3: recurrent_model='block_gru' needs action_dim")
        shape = action_spec.shape if action_spec is not None else action_shape
        self.action_shape = torch.Size(shape) if shape is not None else None
        self.unimix = _check_unimix(type(self), unimix)
        self.num_categoricals, self.num_classes = num_categoricals, num_classes
        self.rnn_hidden_dim, self.recurrent_model = rnn_hidden_dim, recurrent_model
        state_dim = num_categoricals * num_classes
        if recurrent_model == "block_gru":
            self.rnn: nn.Module = _BlockGRU(state_dim, action_dim, hidden_dim, rnn_hidden_dim, num_blocks,
                                            num_layers, norm_eps, device)
            layers: list[nn.Module] = []
            width = rnn_hidden_dim
            for _ in range(prior_num_layers):
                layers += _dense(width, hidden_dim, norm_eps, device)
                width = hidden_dim
            self.rnn_to_prior_projector = nn.Sequential(*layers, nn.Linear(width, state_dim, device=device))
            self.rnn_to_prior_projector.apply(_v3_init)
            self.action_state_projector = None
        else:
            first = (nn.Linear(state_dim + action_dim, hidden_dim, device=device) if action_dim is not None
                     else nn.LazyLinear(hidden_dim, device=device))
            self.action_state_projector = nn.Sequential(first, nn.SiLU())
            self.rnn = nn.GRUCell(hidden_dim, rnn_hidden_dim, device=device)
            self.rnn_to_prior_projector = nn.Sequential(
                nn.Linear(rnn_hidden_dim, hidden_dim, device=device), nn.SiLU(),
                nn.Linear(hidden_dim, state_dim, device=device))

    def update_belief(self, state: Tensor, belief: Tensor, action: Tensor) -> Tensor:
        """The recurrent step only: ``h_t`` from ``(z_{t-1}, h_{t-1}, a_{t-1})``."""
        if not action.is_floating_point():
            action = action.to(belief.dtype)
        if self.action_state_projector is None:
            return self.rnn(state, belief, action)
        x = self.action_state_projector(torch.cat([state, action], -1))
        batch = x.shape[:-1]
        with torch.autocast(x.device.type, enabled=False):  # the GRU in fp32
            h = self.rnn(x.reshape(-1, x.shape[-1]).float(), belief.reshape(-1, belief.shape[-1]).float())
        return h.reshape(*batch, -1).to(x.dtype)

    def forward(self, state: Tensor, belief: Tensor, action: Tensor, *,
                _uniform: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """One prior step (see the class docstring); ``_uniform`` ``[*B, C]`` fixes the draw."""
        belief = self.update_belief(state, belief, action)
        logits = self.rnn_to_prior_projector(belief).unflatten(-1, (self.num_categoricals, self.num_classes))
        state = _straight_through_sample(logits, self.unimix, _uniform).flatten(-2)
        return logits, state, belief


class RSSMPosteriorV3(nn.Module):
    """DreamerV3's posterior: ``z_t ~ Cat(MLP([h_t, e_t]))`` (categorical latent, straight-
    through sample, ``unimix`` as in :class:`RSSMPriorV3`).

    Args:
        hidden_dim: the MLP width (default 512).
        num_categoricals, num_classes: the latent's layout (default 32 x 32).
        rnn_hidden_dim, obs_embed_dim: the belief and embedding sizes (both given: an explicit
            first layer; otherwise a lazy one).
        device: where the parameters are made.

    Keyword Args:
        use_rms_norm: build the MLP from ``num_layers`` RMS-normalised SiLU layers (needs both
            sizes) instead of one SiLU layer.
        num_layers, norm_eps, unimix: see above and :class:`RSSMPriorV3`.

    ``forward(belief [*B, H], obs_embedding [*B, E]) -> (posterior_logits [*B, C, K],
    state [*B, C * K])``.

    Example:
        >>> import torch
        >>> post = RSSMPosteriorV3(hidden_dim=16, num_categoricals=4, num_classes=4, rnn_hidden_dim=8,
        ...                        obs_embed_dim=12)
        >>> logits, state = post(torch.randn(3, 8), torch.randn(3, 12))
        >>> logits.shape, state.shape
        (torch.Size([3, 4, 4]), torch.Size([3, 16]))
    """

    def __init__(self, hidden_dim: int = 512, num_categoricals: int = 32, num_classes: int = 32,
                 rnn_hidden_dim: int | None = None, obs_embed_dim: int | None = None, device: Any = None, *,
                 use_rms_norm: bool = False, num_layers: int = 1, norm_eps: float = 1e-4,
                 unimix: float = 0.0) -> None:
        super().__init__()
        self.unimix = _check_unimix(type(self), unimix)
        self.num_categoricals, self.num_classes = num_categoricals, num_classes
        explicit = rnn_hidden_dim is not None and obs_embed_dim is not None
        out = num_categoricals * num_classes
        if use_rms_norm:
            if not explicit:
                raise ValueError("RSSMPosteriorV3: use_rms_norm=True needs rnn_hidden_dim and obs_embed_dim")
            layers: list[nn.Module] = []
            width = rnn_hidden_dim + obs_embed_dim
            for _ in range(num_layers):
                layers += _dense(width, hidden_dim, norm_eps, device)
                width = hidden_dim
            self.obs_rnn_to_post_projector = nn.Sequential(*layers, nn.Linear(width, out, device=device))
            self.obs_rnn_to_post_projector.apply(_v3_init)
        else:
            first = (nn.Linear(rnn_hidden_dim + obs_embed_dim, hidden_dim, device=device) if explicit
                     else nn.LazyLinear(hidden_dim, device=device))
            self.obs_rnn_to_post_projector = nn.Sequential(first, nn.SiLU(), nn.Linear(hidden_dim, out, device=device))

    def logits(self, belief: Tensor, obs_embedding: Tensor) -> Tensor:
        """The posterior logits ``[*B, C, K]``, without sampling."""
        flat = self.obs_rnn_to_post_projector(torch.cat([belief, obs_embedding], -1))
        return flat.unflatten(-1, (self.num_categoricals, self.num_classes))

    def forward(self, belief: Tensor, obs_embedding: Tensor, *,
                _uniform: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """One posterior step (see the class docstring); ``_uniform`` ``[*B, C]`` fixes the draw."""
        logits = self.logits(belief, obs_embedding)
        return logits, _straight_through_sample(logits, self.unimix, _uniform).flatten(-2)


def _reset_mask(reset: Tensor, like: Tensor) -> Tensor:
    """``reset`` (``[*B]`` or ``[*B, 1]``) broadcastable against ``like`` ``[*B, F]``."""
    reset = reset.bool()
    while reset.ndim > like.ndim - 1 and reset.shape[-1] == 1:
        reset = reset.squeeze(-1)
    return reset.unsqueeze(-1)


class RSSMRolloutV3(RSSMRollout):
    """Runs the DreamerV3 RSSM (prior then posterior) along the last (time) dim of ``[*B, T]``.

    As :class:`RSSMRollout`: step ``t + 1`` reads the ``("next", "state")`` and
    ``("next", "belief")`` written at step ``t``; the batch's ``"state"``/``"belief"`` are
    read at ``t = 0``. Where ``reset_key`` is true (the first transition of an episode) the
    state, the belief and the action are zeroed before the prior runs, per batch entry.

    Args:
        rssm_prior: a TensorDict module around :class:`RSSMPriorV3` (in keys ``"state"``,
            ``"belief"`` and the action; out keys the prior logits, ``("next", "state")``,
            ``("next", "belief")``).
        rssm_posterior: a TensorDict module around :class:`RSSMPosteriorV3` (writes
            ``("next", "state")``).
        reset_key: the boolean reset entry (default ``"is_init"``; ``None``: no resets).
        action_key: the action entry zeroed on resets (default: the prior's in key that is
            not ``"state"`` or ``"belief"``).

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> prior = TensorDictModule(RSSMPriorV3(action_shape=(2,), hidden_dim=8, rnn_hidden_dim=8,
        ...     num_categoricals=4, num_classes=4, action_dim=2), ["state", "belief", "action"],
        ...     [("next", "prior_logits"), ("next", "state"), ("next", "belief")])
        >>> post = TensorDictModule(RSSMPosteriorV3(hidden_dim=8, num_categoricals=4, num_classes=4,
        ...     rnn_hidden_dim=8, obs_embed_dim=6), [("next", "belief"), ("next", "encoded_latents")],
        ...     [("next", "posterior_logits"), ("next", "state")])
        >>> td = TensorDict({"state": torch.zeros(2, 4, 16), "belief": torch.zeros(2, 4, 8),
        ...     "action": torch.randn(2, 4, 2), "next": {"encoded_latents": torch.randn(2, 4, 6)}}, [2, 4])
        >>> out = RSSMRolloutV3(prior, post)(td)
        >>> out.shape, out["next", "posterior_logits"].shape
        (torch.Size([2, 4]), torch.Size([2, 4, 4, 4]))
    """

    def __init__(self, rssm_prior: nn.Module, rssm_posterior: nn.Module, reset_key: Any = "is_init",
                 action_key: Any = None) -> None:
        super().__init__(rssm_prior, rssm_posterior)
        if action_key is None:
            others = [k for k in rssm_prior.in_keys if k not in ("state", "belief")]
            if len(others) != 1:
                raise ValueError(f"RSSMRolloutV3: cannot tell the action key from the prior's in_keys "
                                 f"{list(rssm_prior.in_keys)}; pass action_key=")
            action_key = others[0]
        self.reset_key, self.action_key = reset_key, action_key
        if reset_key is not None and reset_key not in self.in_keys:
            self.in_keys = [*self.in_keys, reset_key]

    def _step(self, td: TensorDictBase) -> TensorDictBase:
        reset = td.get(self.reset_key, None) if self.reset_key is not None else None
        if reset is not None:
            for key in ("state", "belief", self.action_key):
                value = td.get(key)
                td.set(key, torch.where(_reset_mask(reset, value), torch.zeros((), dtype=value.dtype), value))
        return super()._step(td)


class RSSMStateEstimatorV3(TensorDictModuleBase):
    """The acting-time DreamerV3 state update: from the previous state, belief and action
    and the encoded current observation, the new belief (prior's recurrent step, the prior
    head skipped) and a posterior sample. Where the reset flag is true the previous state,
    belief and action are zeroed first (per batch entry).

    Args:
        prior: the (shared, trained) :class:`RSSMPriorV3`.
        posterior: the (shared, trained) :class:`RSSMPosteriorV3`.

    Keyword Args:
        in_keys: five keys: previous state, previous belief, previous action, encoded
            observation, reset flag (default ``["state", "belief", "previous_action",
            "encoded_latents", "is_init"]``; a reset flag may omit its trailing singleton dim).
        out_keys: the posterior state and the new belief (default ``["state", "belief"]``);
            written as float32.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> prior = RSSMPriorV3(action_shape=(2,), action_dim=2, hidden_dim=8, rnn_hidden_dim=8,
        ...                     num_categoricals=2, num_classes=4)
        >>> post = RSSMPosteriorV3(hidden_dim=8, rnn_hidden_dim=8, obs_embed_dim=6, num_categoricals=2,
        ...                        num_classes=4)
        >>> td = TensorDict({"state": torch.randn(2, 8), "belief": torch.randn(2, 8),
        ...     "previous_action": torch.randn(2, 2), "encoded_latents": torch.randn(2, 6),
        ...     "is_init": torch.tensor([True, False])}, [2])
        >>> out = RSSMStateEstimatorV3(prior, post)(td)
        >>> out["state"].reshape(2, 2, 4).sum(-1).eq(1).all().item(), out["belief"].shape
        (True, torch.Size([2, 8]))
    """

    def __init__(self, prior: RSSMPriorV3, posterior: RSSMPosteriorV3, *, in_keys: list | None = None,
                 out_keys: list | None = None) -> None:
        super().__init__()
        in_keys = ["state", "belief", "previous_action", "encoded_latents", "is_init"] if in_keys is None else in_keys
        out_keys = ["state", "belief"] if out_keys is None else out_keys
        if len(in_keys) != 5:
            raise ValueError(f"RSSMStateEstimatorV3: in_keys needs 5 keys (state, belief, action, encoded "
                             f"observation, reset), got {len(in_keys)}: {in_keys}")
        if len(out_keys) != 2:
            raise ValueError(f"RSSMStateEstimatorV3: out_keys needs 2 keys (state, belief), got {len(out_keys)}: "
                             f"{out_keys}")
        self.prior, self.posterior = prior, posterior
        self.in_keys, self.out_keys = list(in_keys), list(out_keys)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Writes the new state and belief into ``tensordict`` and returns it."""
        state, belief, action, embed, reset = (tensordict.get(k) for k in self.in_keys)
        mask = _reset_mask(reset, state)
        state = torch.where(mask, torch.zeros((), dtype=state.dtype), state)
        belief = torch.where(mask, torch.zeros((), dtype=belief.dtype), belief)
        if not action.is_floating_point():
            action = action.to(belief.dtype)
        action = torch.where(mask, torch.zeros((), dtype=action.dtype), action)
        belief = self.prior.update_belief(state, belief, action)
        _, state = self.posterior(belief, embed)
        tensordict.set(self.out_keys[0], state.float())
        tensordict.set(self.out_keys[1], belief.float())
        return tensordict
