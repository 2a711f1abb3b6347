"""Loss-battery cases (see ``_cases.py``) for the multi-agent losses: MAPPO, IPPO (with a
value normalizer) and QMixer (QMIX and VDN mixers), on group-keyed batches.

The networks start with a layer shared by every agent (``input_layer``: lazy inside the
battery's lazy variant), then a :class:`~steersman.modules.MultiAgentMLP`.
"""

from __future__ import annotations

import torch
from torch import nn

from steersman.modules import (
    IndependentNormal,
    MultiAgentMLP,
    NormalParamExtractor,
    PopArtValueNorm,
    QMixer,
    VDNMixer,
)
from steersman.objectives import IPPOLoss, MAPPOLoss, QMixerLoss
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import (
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
)
from tests.objectives._cases import LossCase, input_layer

N, OBS, HIDDEN, ACT, N_ACT, STATE = 3, 4, 8, 2, 5, 6
G = "agents"
PPO_KEYS = dict(action=(G, "action"), sample_log_prob=(G, "action_log_prob"), value=(G, "state_value"),
                advantage=(G, "advantage"), value_target=(G, "value_target"), reward=(G, "reward"))


def _trunk(n_out: int, centralized: bool, share_params: bool) -> nn.Module:
    return nn.Sequential(input_layer(OBS, HIDDEN), nn.Tanh(),
                         MultiAgentMLP(HIDDEN, n_out, N, centralized=centralized, share_params=share_params,
                                       depth=1, num_cells=HIDDEN))


def actor() -> ProbabilisticTensorDictSequential:
    net = nn.Sequential(_trunk(2 * ACT, False, False), NormalParamExtractor())
    return ProbabilisticTensorDictSequential(
        TensorDictModule(net, [(G, "observation")], [(G, "loc"), (G, "scale")]),
        ProbabilisticTensorDictModule({"loc": (G, "loc"), "scale": (G, "scale")}, [(G, "action")], IndependentNormal,
                                      distribution_kwargs={"validate_args": False}, return_log_prob=True,
                                      log_prob_key=(G, "action_log_prob")))


def critic(centralized: bool) -> TensorDictModule:
    return TensorDictModule(_trunk(1, centralized, centralized), [(G, "observation")], [(G, "state_value")])


def _flags(shape):
    term = torch.zeros(*shape, 1, dtype=torch.bool)
    trunc = torch.zeros(*shape, 1, dtype=torch.bool)
    if len(shape) > 1:
        term[..., shape[-1] // 3, :] = True
        trunc[..., (2 * shape[-1]) // 3, :] = True
    else:
        term[1] = True
        trunc[2] = True
    return term, trunc


def _transitions(shape, team_reward: bool) -> TensorDict:
    term, trunc = _flags(shape)

    def step():
        return {G: TensorDict({"observation": torch.randn(*shape, N, OBS)}, [*shape, N]),
                "state": torch.randn(*shape, STATE)}

    nxt = {**step(), "done": term | trunc, "terminated": term, "truncated": trunc}
    if team_reward:
        nxt["reward"] = torch.randn(*shape, 1)
    else:
        nxt[G].set("reward", torch.randn(*shape, N, 1))
    return TensorDict({**step(), "next": nxt}, list(shape))


def ppo_batch(loss, shape) -> TensorDict:
    """Actions with log-probs of a slightly older policy (ratios != 1, some clipped)."""
    td = _transitions(tuple(shape), team_reward=False)
    td[G, "action"] = torch.rand(*shape, N, ACT) * 1.8 - 0.9
    with torch.no_grad():
        dist = loss.actor_network.get_dist(td.copy())
        td[G, "action_log_prob"] = dist.log_prob(td[G, "action"]) + 0.3 * torch.randn(*shape, N)
    return td


def qmix_batch(loss, shape) -> TensorDict:
    td = _transitions(tuple(shape), team_reward=True)
    td[G, "action"] = torch.randint(N_ACT, (*shape, N))
    return td


def local_net() -> TensorDictModule:
    return TensorDictModule(_trunk(N_ACT, False, True), [(G, "observation")], [(G, "action_value")])


def mixer(kind: str) -> TensorDictModule:
    if kind == "vdn":
        return TensorDictModule(VDNMixer(N), [(G, "chosen_action_value")], ["chosen_action_value"])
    return TensorDictModule(QMixer(state_shape=(STATE,), mixing_embed_dim=8, n_agents=N),
                            [(G, "chosen_action_value"), "state"], ["chosen_action_value"])


PPO_GRADS = {"loss_objective": {"actor_network."}, "loss_entropy": {"actor_network."},
             "loss_critic": {"critic_network."}}
# (VDN's mixer has no parameters, which the battery's parameter-attribute checks need; VDN is
# checked against its reference in test_multiagent.py)
# a value normalizer is state updated by every call; with beta=0 it holds the statistics of the
# last batch, so repeated calls on one batch agree (the battery's determinism checks)
CASES = [
    LossCase("MAPPOLoss-gae", lambda: MAPPOLoss(actor(), critic(True)).set_keys(**PPO_KEYS), ppo_batch, PPO_GRADS,
             batch_shapes=[(4, 6)]),
    LossCase("IPPOLoss-gae-value-norm",
             lambda: IPPOLoss(actor(), critic(False), value_norm=PopArtValueNorm(beta=0.0)).set_keys(**PPO_KEYS),
             ppo_batch, PPO_GRADS, batch_shapes=[(4, 6)]),
    LossCase("QMixerLoss-qmix", lambda: QMixerLoss(local_net(), mixer("qmix")), qmix_batch,
             {"loss": {"local_value_network.", "mixer_network."}}),
]
