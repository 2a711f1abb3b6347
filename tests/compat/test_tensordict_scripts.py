"""Short scripts written the way tensordict/TorchRL users write them, with only steersman
imports: a preallocated rollout buffer, the global switches at the top of a script, an
ensemble critic, a composite (hybrid) action head, a TensorClass batch, pytrees."""

from __future__ import annotations

import torch
from torch import distributions as D
from torch import nn

from steersman.tensordict import (
    TensorClass,
    TensorDict,
    assert_close,
    from_pytree,
    lazy_stack,
    set_list_to_stack,
)
from steersman.tensordict.nn import (
    AddStateIndependentNormalScale,
    CompositeDistribution,
    EnsembleModule,
    NormalParamExtractor,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictSequential,
    set_skip_existing,
)


def test_preallocated_rollout_buffer():
    T, N = 5, 3
    buffer = TensorDict({}, batch_size=[T, N])  # no keys yet: the first write allocates them
    obs = torch.zeros(N, 4)
    for t in range(T):
        step = TensorDict({"obs": obs, "action": torch.full((N,), t), "next": {"obs": obs + 1}}, [N])
        buffer[t] = step
        obs = obs + 1
    assert buffer["obs"].shape == (T, N, 4) and buffer["action"][:, 0].tolist() == [0, 1, 2, 3, 4]
    assert buffer["next", "obs"][-1, 0, 0] == 5
    # lazy stacks of per-env data take new keys the same way
    lz = lazy_stack([TensorDict({"obs": torch.zeros(T, 4)}, [T]) for _ in range(N)], 1)
    lz[0] = TensorDict({"obs": torch.ones(N, 4), "reward": torch.ones(N, 1)}, [N])
    assert lz["reward"].shape == (T, N, 1) and lz["reward"].sum() == N


def test_switches_at_the_top_of_a_script():
    set_list_to_stack(True).set()  # what tensordict scripts write first
    td = TensorDict({"frames": [torch.zeros(2, 2), torch.ones(2, 2)]}, batch_size=[2])
    assert td["frames"].shape == (2, 2, 2)


def test_actor_critic_with_skip_existing():
    actor_net = nn.Sequential(nn.Linear(4, 4), NormalParamExtractor())
    actor = ProbabilisticTensorDictSequential(
        TensorDictModule(actor_net, in_keys=["obs"], out_keys=["loc", "scale"]),
        ProbabilisticTensorDictModule(in_keys=["loc", "scale"], out_keys=["action"], distribution_class=D.Normal,
                                      return_log_prob=True),
    )
    calls = []
    value_net = nn.Linear(4, 1)
    value = TensorDictModule(lambda x: (calls.append(1), value_net(x))[1], in_keys=["obs"],
                             out_keys=["state_value"])
    td = actor(TensorDict(obs=torch.randn(8, 4), batch_size=[8]))
    value(td)
    with set_skip_existing(True):  # a loss that recomputes the value skips it when present
        value(td)
    assert len(calls) == 1 and td["action_log_prob"].shape == (8, 2)


def test_ensemble_critic_and_state_independent_scale():
    qnet = TensorDictModule(nn.Linear(6, 1), in_keys=["obs_action"], out_keys=["state_action_value"])
    critics = EnsembleModule(qnet, num_copies=2)
    td = TensorDict(obs_action=torch.randn(5, 6), batch_size=[5])
    q = critics(td)["state_action_value"]
    assert q.shape == (2, 5, 1) and q.min(0).values.shape == (5, 1)
    head = TensorDictModule(nn.Sequential(nn.Linear(4, 2), AddStateIndependentNormalScale(2)),
                            in_keys=["obs"], out_keys=["loc", "scale"])
    out = head(TensorDict(obs=torch.randn(3, 4), batch_size=[3]))
    assert out["scale"].shape == (3, 2) and torch.allclose(out["scale"], torch.ones(3, 2))


def test_hybrid_action_head_with_a_composite_distribution():
    params = TensorDictModule(
        lambda h: TensorDict({"cont": {"loc": h[..., :2], "scale": h[..., 2:4].exp()},
                              "disc": {"logits": h[..., 4:]}}, h.shape[:-1]),
        in_keys=["hidden"], out_keys=["params"],
    )
    policy = TensorDictSequential(params, ProbabilisticTensorDictModule(
        in_keys=["params"], out_keys=[("action", "cont"), ("action", "disc")],
        distribution_class=CompositeDistribution,
        distribution_kwargs={"distribution_map": {"cont": D.Normal, "disc": D.Categorical},
                             "name_map": {"cont": ("action", "cont"), "disc": ("action", "disc")}},
        return_log_prob=True,
    ))
    td = policy(TensorDict(hidden=torch.randn(6, 7), batch_size=[6]))
    assert td["action", "cont"].shape == (6, 2) and td["action", "disc"].shape == (6,)
    assert td["action", "disc_log_prob"].shape == (6,) and td["action", "cont_log_prob"].shape == (6,)


class Transition(TensorClass):
    obs: torch.Tensor
    reward: torch.Tensor
    done: torch.Tensor


def test_tensorclass_batches_and_pytrees():
    data = Transition(obs=torch.randn(10, 3), reward=torch.randn(10, 1), done=torch.zeros(10, 1, dtype=torch.bool),
                      batch_size=[10])
    batch = data[torch.tensor([0, 3, 5])]
    assert isinstance(batch, Transition) and batch.obs.shape == (3, 3)
    both = torch.cat([data, data])
    assert both.batch_size == (20,) and both[10:].reward.equal(data.reward)
    tree = {"obs": {"pixels": torch.zeros(4, 3, 8, 8), "state": torch.zeros(4, 5)}, "extras": [torch.ones(4)]}
    td = from_pytree(tree, batch_size=[4])
    assert_close(from_pytree(td.to_pytree(), batch_size=[4]), td)


def test_typed_state_shared_table_and_a_growing_dataset(tmp_path):
    """A typed rollout state with a shared (unbatched) lookup table, consolidated to ship
    it, appended to an on-disk dataset chunk by chunk, and a structure pasted from a log."""
    from steersman.tensordict import (
        TypedTensorDict,
        UnbatchedTensor,
        append_memmap,
        from_consolidated,
        load_memmap,
        parse_tensor_dict_string,
    )

    class Step(TypedTensorDict):
        obs: torch.Tensor
        reward: torch.Tensor

    table = UnbatchedTensor(torch.randn(10, 4))
    chunk = Step(obs=torch.randn(8, 3), reward=torch.zeros(8, 1), batch_size=[8])
    chunk["table"] = table
    first = chunk[:4]
    assert type(first) is Step and first["table"].data_ptr() == table.data_ptr()
    shipped = chunk.consolidate(filename=tmp_path / "chunk.bin")
    assert torch.equal(from_consolidated(tmp_path / "chunk.bin")["obs"], shipped.obs)
    data = chunk.exclude("table").to_tensordict()
    data.save(tmp_path / "ds")
    for _ in range(3):
        append_memmap(tmp_path / "ds", data)
    assert load_memmap(tmp_path / "ds").batch_size == (32,)
    logged = "TensorDict(batch_size=[8], fields={obs: f32[3], reward: f32[1]})"
    assert parse_tensor_dict_string(logged)["obs"].shape == (8, 3)
