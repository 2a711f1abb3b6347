"""Decision Transformer (Chen et al. 2021) and Online Decision Transformer (Zheng et al. 2022).

A trajectory of ``L`` steps becomes ``3L`` tokens ``(R_1, s_1, a_1, R_2, s_2, a_2, ...)``
(return-to-go, state, action, each embedded by its own linear layer); a causal GPT-2-style
transformer reads them, and the hidden state at each *state* token predicts that step's
action: it has seen every earlier step and the return still to collect, not the action.

- :class:`DecisionTransformer`: the token embedding and the transformer, written here in
  plain torch (TorchRL builds Hugging Face's ``GPT2Model``: ``transformers`` is not needed
  here; the architecture is the same: learned position embeddings, pre-LayerNorm blocks of
  causal self-attention and an MLP, a final LayerNorm);
- :class:`DTActor`: a linear head on it, the deterministic action (offline DT);
- :class:`OnlineDTActor`: mean and standard deviation heads (online DT's Gaussian policy);
- :class:`DecisionTransformerInferenceWrapper`: runs a DT policy in an environment: masks
  the context window and serves the last step's action.

Shapes: ``observation [*B, L, state_dim]``, ``action [*B, L, action_dim]``,
``return_to_go [*B, L, 1]``; outputs ``[*B, L, ...]``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..tensordict import TensorDictBase
from ..tensordict.nn import TensorDictModuleWrapper

__all__ = ["DecisionTransformer", "DTActor", "OnlineDTActor", "DecisionTransformerInferenceWrapper"]

_ACTIVATIONS = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "gelu_new": lambda: nn.GELU(approximate="tanh"),
    "gelu_pytorch_tanh": lambda: nn.GELU(approximate="tanh"),
    "tanh": nn.Tanh,
    "silu": nn.SiLU,
    "swish": nn.SiLU,
    "elu": nn.ELU,
}


class _CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, attn_pdrop: float, resid_pdrop: float) -> None:
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"DecisionTransformer: n_embd ({n_embd}) must be a multiple of n_head ({n_head})")
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.attn_pdrop = attn_pdrop
        self.resid_drop = nn.Dropout(resid_pdrop)

    def forward(self, x: Tensor) -> Tensor:
        n, t, c = x.shape
        q, k, v = self.qkv(x).view(n, t, 3, self.n_head, c // self.n_head).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_pdrop if self.training else 0.0,
                                           is_causal=True)
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(n, t, c)))


class _Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, n_inner: int, activation: str, attn_pdrop: float,
                 resid_pdrop: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = _CausalSelfAttention(n_embd, n_head, attn_pdrop, resid_pdrop)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, n_inner), _ACTIVATIONS[activation](), nn.Linear(n_inner, n_embd),
                                 nn.Dropout(resid_pdrop))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class DecisionTransformer(nn.Module):
    """The Decision Transformer's trunk: ``(observation, action, return_to_go) -> hidden``.

    Args:
        state_dim: the observation size.
        action_dim: the action size.
        config: a :class:`DecisionTransformer.DTConfig` or a dict with its fields (default
            :meth:`default_config`): ``n_embd`` (token size), ``n_layer``, ``n_head``,
            ``n_inner`` (MLP width), ``activation`` (``"relu"``, ``"gelu"``, ``"gelu_new"``,
            ``"tanh"``, ``"silu"``...), ``n_positions`` (the most tokens: ``3L <= n_positions``),
            ``resid_pdrop`` (dropout on the embeddings and residual branches), ``attn_pdrop``
            (dropout on the attention weights).
        device: where the parameters are made.

    ``forward(observation [*B, L, state_dim], action [*B, L, action_dim], return_to_go
    [*B, L, 1]) -> [*B, L, n_embd]``: the hidden state at each step's state token (it sees
    every earlier token, the step's return-to-go and state, not its action).

    Example:
        >>> import torch
        >>> config = DecisionTransformer.DTConfig(n_embd=16, n_layer=1, n_head=2, n_inner=32)
        >>> model = DecisionTransformer(state_dim=4, action_dim=2, config=config)
        >>> out = model(torch.randn(3, 5, 10, 4), torch.randn(3, 5, 10, 2), torch.randn(3, 5, 10, 1))
        >>> out.shape
        torch.Size([3, 5, 10, 16])
        >>> DecisionTransformer.default_config()
        DTConfig(n_embd: 256, n_layer: 4, n_head: 4, n_inner: 1024, activation: relu, n_positions: 1024, resid_pdrop: 0.1, attn_pdrop: 0.1)
    """

    @dataclass
    class DTConfig:
        """The transformer's architecture (see :class:`DecisionTransformer`)."""

        n_embd: Any = 256
        n_layer: Any = 4
        n_head: Any = 4
        n_inner: Any = 1024
        activation: Any = "relu"
        n_positions: Any = 1024
        resid_pdrop: Any = 0.1
        attn_pdrop: Any = 0.1

        def __repr__(self) -> str:
            body = ", ".join(f"{f.name}: {getattr(self, f.name)}" for f in dataclasses.fields(self))
            return f"{type(self).__name__}({body})"

    @classmethod
    def default_config(cls) -> DecisionTransformer.DTConfig:
        """The default architecture (4 layers of width 256, as in TorchRL)."""
        return cls.DTConfig()

    def __init__(
        self,
        state_dim: int,
        action_dim: int,
        config: dict | DecisionTransformer.DTConfig | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        cfg = _config_dict(config)
        if cfg["activation"] not in _ACTIVATIONS:
            raise ValueError(
                f"DecisionTransformer: activation must be one of {sorted(_ACTIVATIONS)}, got {cfg['activation']!r}"
            )
        self.state_dim, self.action_dim = int(state_dim), int(action_dim)
        self.hidden_size = n_embd = int(cfg["n_embd"])
        self.n_positions = int(cfg["n_positions"])
        with torch.device(device) if device is not None else contextlib.nullcontext():
            self.embed_return = nn.Linear(1, n_embd)
            self.embed_state = nn.Linear(self.state_dim, n_embd)
            self.embed_action = nn.Linear(self.action_dim, n_embd)
            self.embed_ln = nn.LayerNorm(n_embd)
            self.wpe = nn.Embedding(self.n_positions, n_embd)
            self.drop = nn.Dropout(float(cfg["resid_pdrop"]))
            self.blocks = nn.ModuleList(
                _Block(n_embd, int(cfg["n_head"]), int(cfg["n_inner"]), cfg["activation"], float(cfg["attn_pdrop"]),
                       float(cfg["resid_pdrop"]))
                for _ in range(int(cfg["n_layer"]))
            )
            self.ln_f = nn.LayerNorm(n_embd)
        self.apply(_gpt2_init)
        for name, p in self.named_parameters():  # GPT-2: residual projections scaled by depth
            if name.endswith(("attn.proj.weight", "mlp.2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * max(len(self.blocks), 1)))

    def forward(self, observation: Tensor, action: Tensor, return_to_go: Tensor) -> Tensor:
        """The hidden state at each state token: ``[*B, L, n_embd]``."""
        batch, length = observation.shape[:-2], observation.shape[-2]
        if action.shape[:-1] != observation.shape[:-1] or return_to_go.shape[:-1] != observation.shape[:-1]:
            raise ValueError(
                "DecisionTransformer: observation, action and return_to_go must share [*B, L]; got "
                f"{list(observation.shape)}, {list(action.shape)} and {list(return_to_go.shape)}"
            )
        if 3 * length > self.n_positions:
            raise ValueError(
                f"DecisionTransformer: {length} steps make {3 * length} tokens, more than n_positions="
                f"{self.n_positions}; shorten the context or raise n_positions"
            )
        obs = observation.reshape(-1, length, observation.shape[-1])
        act = action.reshape(-1, length, action.shape[-1])
        rtg = return_to_go.reshape(-1, length, return_to_go.shape[-1])
        tokens = torch.stack([self.embed_return(rtg), self.embed_state(obs), self.embed_action(act)], dim=2)
        x = self.embed_ln(tokens.reshape(obs.shape[0], 3 * length, self.hidden_size))
        x = self.drop(x + self.wpe.weight[: 3 * length])
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        state_tokens = x.reshape(obs.shape[0], length, 3, self.hidden_size)[:, :, 1]
        return state_tokens.reshape(*batch, length, self.hidden_size)


class DTActor(nn.Module):
    """The offline Decision Transformer's policy: a linear head on :class:`DecisionTransformer`.

    Args:
        state_dim, action_dim: the observation and action sizes.
        transformer_config: the trunk's config (default :meth:`default_config`: width 512).
        device: where the parameters are made.

    ``forward(observation, action, return_to_go) -> action [*B, L, action_dim]`` (unbounded;
    squash it with e.g. :class:`~steersman.modules.TanhDelta` or ``TanhModule``).

    Example:
        >>> import torch
        >>> actor = DTActor(4, 2, transformer_config=dict(n_embd=16, n_layer=1, n_head=2, n_inner=32,
        ...                 activation="relu", n_positions=60, resid_pdrop=0.1, attn_pdrop=0.1))
        >>> actor(torch.randn(32, 10, 4), torch.randn(32, 10, 2), torch.randn(32, 10, 1)).shape
        torch.Size([32, 10, 2])
    """

    def __init__(
        self,
        state_dim: int,
        action_dim: int,
        transformer_config: dict | DecisionTransformer.DTConfig | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        cfg = _config_dict(transformer_config if transformer_config is not None else self.default_config())
        self.transformer = DecisionTransformer(state_dim, action_dim, config=cfg, device=device)
        self.action_layer = nn.Linear(int(cfg["n_embd"]), action_dim, device=device)
        _orthogonal_head(self.action_layer)

    def forward(self, observation: Tensor, action: Tensor, return_to_go: Tensor) -> Tensor:
        """The predicted action at every step: ``[*B, L, action_dim]``."""
        return self.action_layer(self.transformer(observation, action, return_to_go))

    @classmethod
    def default_config(cls) -> DecisionTransformer.DTConfig:
        """Width 512, inner 2048, 4 layers and heads (TorchRL's default for the DT actors)."""
        return DecisionTransformer.DTConfig(n_embd=512, n_inner=2048)


class OnlineDTActor(nn.Module):
    """The online Decision Transformer's Gaussian policy head on :class:`DecisionTransformer`.

    Args: as :class:`DTActor`.

    ``forward(observation, action, return_to_go) -> (loc, scale)``, each
    ``[*B, L, action_dim]``; ``log(scale) = tanh(.)`` mapped onto ``[log_std_min,
    log_std_max] = [-5, 2]``. Feed them to a ``TanhNormal`` (a ``ProbabilisticActor`` with
    ``in_keys=["loc", "scale"]``).

    Example:
        >>> import torch
        >>> actor = OnlineDTActor(4, 2, transformer_config=dict(n_embd=16, n_layer=1, n_head=2, n_inner=32,
        ...                       activation="relu", n_positions=60, resid_pdrop=0.1, attn_pdrop=0.1))
        >>> loc, scale = actor(torch.randn(32, 10, 4), torch.randn(32, 10, 2), torch.randn(32, 10, 1))
        >>> loc.shape, bool(((scale >= 0.0067) & (scale <= 7.39)).all())
        (torch.Size([32, 10, 2]), True)
    """

    log_std_min: float = -5.0
    log_std_max: float = 2.0

    def __init__(
        self,
        state_dim: int,
        action_dim: int,
        transformer_config: dict | DecisionTransformer.DTConfig | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        cfg = _config_dict(transformer_config if transformer_config is not None else self.default_config())
        self.transformer = DecisionTransformer(state_dim, action_dim, config=cfg, device=device)
        self.action_layer_mean = nn.Linear(int(cfg["n_embd"]), action_dim, device=device)
        self.action_layer_logstd = nn.Linear(int(cfg["n_embd"]), action_dim, device=device)
        _orthogonal_head(self.action_layer_mean)
        _orthogonal_head(self.action_layer_logstd)

    def forward(self, observation: Tensor, action: Tensor, return_to_go: Tensor) -> tuple[Tensor, Tensor]:
        """``(loc, scale)``, each ``[*B, L, action_dim]``."""
        hidden = self.transformer(observation, action, return_to_go)
        squashed = torch.tanh(self.action_layer_logstd(hidden))
        log_std = self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (squashed + 1.0)
        return self.action_layer_mean(hidden), log_std.exp()

    @classmethod
    def default_config(cls) -> DecisionTransformer.DTConfig:
        """As :meth:`DTActor.default_config`."""
        return DecisionTransformer.DTConfig(n_embd=512, n_inner=2048)


class DecisionTransformerInferenceWrapper(TensorDictModuleWrapper):
    """Runs a Decision Transformer policy one environment step at a time.

    The input holds context windows ``observation [*B, L, obs]``, ``action [*B, L, act]``
    (the actions taken *before* each step: the window's last entry is the previous step's
    action) and ``return_to_go [*B, L, 1]``. Steps older than the last
    ``inference_context`` are zeroed; actions are shifted one step back so that step ``t``
    holds ``a_t`` (the current, unknown action is zero). The policy runs on that masked
    copy, and the output keeps only the last step's ``action`` (``[*B, act]``) and
    ``return_to_go`` (``[*B, 1]``); the observation window is returned unmasked. The input
    TensorDict is not modified.

    Args:
        policy: a TensorDict module reading the three windows and writing ``action``
            (e.g. a ``ProbabilisticActor`` around a :class:`DTActor`).

    Keyword Args:
        inference_context: how many of the last steps stay visible (default 5).
        spec: the action spec (kept as ``self.spec``); default: the policy's.
        device: where the spec goes.

    :meth:`set_tensor_keys` renames ``observation``, ``action``, ``return_to_go`` and
    ``out_action`` (the policy's output key).

    Example:
        >>> import torch
        >>> from steersman.modules import DTActor, ProbabilisticActor, TanhDelta
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> net = DTActor(4, 2, transformer_config=dict(n_embd=16, n_layer=1, n_head=2, n_inner=32,
        ...               activation="relu", n_positions=60, resid_pdrop=0.0, attn_pdrop=0.0))
        >>> actor = ProbabilisticActor(TensorDictModule(net, ["observation", "action", "return_to_go"], ["param"]),
        ...                            in_keys=["param"], distribution_class=TanhDelta)
        >>> policy = DecisionTransformerInferenceWrapper(actor, inference_context=5)
        >>> td = TensorDict({"observation": torch.randn(1, 20, 4), "action": torch.randn(1, 20, 2),
        ...                  "return_to_go": torch.randn(1, 20, 1)}, [1])
        >>> out = policy(td)
        >>> out["action"].shape, out["return_to_go"].shape, out["observation"].shape
        (torch.Size([1, 2]), torch.Size([1, 1]), torch.Size([1, 20, 4]))
    """

    def __init__(
        self,
        policy: nn.Module,
        *,
        inference_context: int = 5,
        spec: Any = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(policy)
        if int(inference_context) < 1:
            raise ValueError(f"DecisionTransformerInferenceWrapper: inference_context must be >= 1, got {inference_context}")
        self.inference_context = int(inference_context)
        self.observation_key: Any = "observation"
        self.action_key: Any = "action"
        self.out_action_key: Any = "action"
        self.return_to_go_key: Any = "return_to_go"
        spec = spec if spec is not None else getattr(policy, "spec", None)
        self._spec = spec.to(device) if spec is not None and device is not None else spec

    @property
    def spec(self) -> Any:
        return self._spec

    @property
    def in_keys(self) -> list:
        return [self.observation_key, self.action_key, self.return_to_go_key]

    @property
    def out_keys(self) -> list:
        keys = set(self.td_module.out_keys) | {self.observation_key, self.action_key, self.return_to_go_key}
        return sorted(keys, key=str)

    def set_tensor_keys(self, **kwargs: Any) -> None:
        """Renames ``observation``, ``action``, ``return_to_go`` and ``out_action``."""
        names = {"observation": "observation_key", "action": "action_key", "return_to_go": "return_to_go_key",
                 "out_action": "out_action_key"}
        unknown = sorted(set(kwargs) - set(names))
        if unknown:
            raise TypeError(f"DecisionTransformerInferenceWrapper.set_tensor_keys: unknown {unknown}; valid: {list(names)}")
        out_action = kwargs.get("out_action", self.out_action_key)
        if out_action not in self.td_module.out_keys:
            raise ValueError(
                f"DecisionTransformerInferenceWrapper: out_action {out_action!r} is not among the policy's out_keys "
                f"{self.td_module.out_keys}"
            )
        for name, key in kwargs.items():
            setattr(self, names[name], key)

    def step(self, frames: int = 1) -> None:
        """No exploration to anneal (kept for the exploration-module interface)."""

    def mask_context(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Zeroes the steps before the last ``inference_context`` and shifts the actions one
        step back (in ``tensordict``, on copies of its tensors); returns it."""
        obs = tensordict.get(self.observation_key)
        action = tensordict.get(self.action_key)
        rtg = tensordict.get(self.return_to_go_key)
        if not obs.shape[:-1] == action.shape[:-1] == rtg.shape[:-1]:
            raise ValueError(
                "DecisionTransformerInferenceWrapper: observation, action and return_to_go windows must share "
                f"[*B, L]; got {list(obs.shape)}, {list(action.shape)} and {list(rtg.shape)}"
            )
        length = obs.shape[-2]
        visible = torch.arange(length, device=obs.device) >= length - self.inference_context  # [L]
        keep = visible.unsqueeze(-1)
        shifted = torch.cat([action[..., 1:, :], torch.zeros_like(action[..., :1, :])], dim=-2)
        tensordict.set(self.observation_key, obs * keep)
        tensordict.set(self.action_key, shifted * keep)
        tensordict.set(self.return_to_go_key, rtg * keep)
        return tensordict

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """The policy on the masked windows; the last step's action and return-to-go."""
        td = tensordict.copy()
        obs = td.get(self.observation_key)
        td = self.td_module(self.mask_context(td))
        action = td.get(self.out_action_key)
        if td.batch_dims == action.dim() - 1:  # the time dim is one of the batch dims: drop it
            td.batch_size = td.batch_size[:-1]
        td.set(self.out_action_key, action[..., -1, :])
        td.set(self.return_to_go_key, td.get(self.return_to_go_key)[..., -1, :])
        td.set(self.observation_key, obs)
        return td


def _config_dict(config: Any) -> dict:
    """A :class:`DecisionTransformer.DTConfig`, a dict or ``None`` -> a full dict of fields."""
    defaults = dataclasses.asdict(DecisionTransformer.DTConfig())
    if config is None:
        return defaults
    if isinstance(config, DecisionTransformer.DTConfig):
        return dataclasses.asdict(config)
    try:
        given = dict(config)
    except (TypeError, ValueError) as err:
        raise TypeError(f"DecisionTransformer: config must be a DTConfig or a dict, got {type(config).__name__}") from err
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ValueError(f"DecisionTransformer: unknown config field(s) {unknown}; valid: {sorted(defaults)}")
    return {**defaults, **given}


def _gpt2_init(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)


def _orthogonal_head(layer: nn.Linear) -> None:
    nn.init.orthogonal_(layer.weight)
    nn.init.zeros_(layer.bias)
