"""FunctionalUpdate: ClipPPOLoss with two small MLPs (a categorical actor, a critic) and the
functional Adam, as one pure step. It equals the eager torch.optim path (zero_grad,
backward, clip_grad_norm_, Adam), traces with no graph break, and compiles to one graph
that is reused across calls, annealed learning rates and clip ranges."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounter

from steersman.objectives import ClipPPOLoss
from steersman.objectives.functional_update import (
    CompiledUpdate,
    FunctionalUpdate,
    OptimizerState,
    flat_state_key,
)
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import (
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
)
from steersman.tensordict.nn.optim import SGD, Adam

OBS, N_ACT, H, B = 4, 2, 16, 32
MAX_NORM = 0.2


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _loss(seed: int = 0) -> ClipPPOLoss:
    torch.manual_seed(seed)
    pi = nn.Sequential(nn.Linear(OBS, H), nn.Tanh(), nn.Linear(H, H), nn.Tanh(), nn.Linear(H, N_ACT))
    v = nn.Sequential(nn.Linear(OBS, H), nn.Tanh(), nn.Linear(H, H), nn.Tanh(), nn.Linear(H, 1))
    actor = ProbabilisticTensorDictSequential(
        TensorDictModule(pi, ["observation"], ["logits"]),
        ProbabilisticTensorDictModule(["logits"], ["action"], torch.distributions.Categorical,
                                      {"validate_args": False}, return_log_prob=True),
    )
    critic = TensorDictModule(v, ["observation"], ["state_value"])
    return ClipPPOLoss(actor, critic, clip_epsilon=0.2, entropy_coeff=0.01, critic_coeff=0.5,
                       loss_critic_type="l2", diagnostics=False)


def _batches(n: int) -> list[TensorDict]:
    g = torch.Generator().manual_seed(1)
    return [TensorDict({"observation": torch.randn(B, OBS, generator=g),
                        "action": torch.randint(0, N_ACT, (B,), generator=g),
                        "action_log_prob": -torch.rand(B, generator=g) - 0.3,
                        "advantage": torch.randn(B, 1, generator=g),
                        "value_target": torch.randn(B, 1, generator=g)}, batch_size=[B]) for _ in range(n)]


def _eager_torch_optim(n: int, lr: float = 1e-2) -> dict[str, torch.Tensor]:
    loss_fn = _loss()
    params = [p for p in loss_fn.parameters() if p.requires_grad]
    optim = torch.optim.Adam(params, lr=lr, eps=1e-5, foreach=False)
    for mb in _batches(n):
        out = loss_fn(mb)
        total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
        optim.zero_grad()
        total.backward()
        nn.utils.clip_grad_norm_(params, MAX_NORM, foreach=False)
        optim.step()
    return {k: v.detach().clone() for k, v in loss_fn.named_parameters()}


def _functional(n: int, step=None, lr: float = 1e-2) -> tuple[FunctionalUpdate, dict[str, torch.Tensor]]:
    loss_fn = _loss()
    update = FunctionalUpdate(loss_fn, Adam(lr=lr, eps=1e-5), max_grad_norm=MAX_NORM)
    params, state = update.init()
    step = step or update
    for mb in _batches(n):
        params, state, metrics = step(params, state, mb)
    assert int(state["step"]) == n
    assert set(metrics.keys()) == {"loss_objective", "loss_critic", "loss_entropy", "loss", "grad_norm"}
    update.write_back(params)
    return update, {k: v.detach().clone() for k, v in loss_fn.named_parameters()}


def _assert_params_close(got: dict, expected: dict, **tol) -> None:
    assert got.keys() == expected.keys() and len(got) == 12
    start = dict(_loss().named_parameters())
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, msg=key, **tol)
        assert not torch.equal(value, start[key]), key  # the run moved it


def test_eager_functional_update_equals_torch_optim_after_100_updates():
    """Bitwise: torch.func's gradients are autograd's, and the functional Adam and clipping
    run torch.optim's (foreach=False) ops in the same order."""
    _, got = _functional(100)
    _assert_params_close(got, _eager_torch_optim(100), rtol=0.0, atol=0.0)


def test_metrics_are_the_loss_terms_and_the_unclipped_grad_norm():
    loss_fn = _loss()
    mb = _batches(1)[0]
    update = FunctionalUpdate(loss_fn, SGD(lr=0.0), max_grad_norm=MAX_NORM)
    params, state = update.init()
    _, _, metrics = update(params, state, mb)
    out = loss_fn(mb)
    total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
    total.backward()
    norm = nn.utils.clip_grad_norm_([p for p in loss_fn.parameters()], float("inf"))
    torch.testing.assert_close(metrics["loss"], total.detach())
    torch.testing.assert_close(metrics["grad_norm"], norm, rtol=1e-5, atol=1e-6)
    assert metrics["grad_norm"] > MAX_NORM  # so clipping was active in the tests above


def test_update_is_pure():
    update = FunctionalUpdate(_loss(), Adam(lr=1e-2), max_grad_norm=MAX_NORM)
    params, state = update.init()
    before = (params.clone(), state.clone(), dict((k, v.clone()) for k, v in update.loss_module.state_dict().items()))
    new_params, _, _ = update(params, state, _batches(1)[0])
    assert (params == before[0]).all() and (state == before[1]).all()
    for k, v in update.loss_module.state_dict().items():
        assert torch.equal(v, before[2][k]), k
    assert not (new_params == params).all()


@pytest.mark.parametrize("opt", [Adam(lr=1e-2, eps=1e-5, amsgrad=True), SGD(lr=1e-2, momentum=0.9)],
                         ids=["Adam-amsgrad", "SGD-momentum"])
def test_step_flat_equals_step_bitwise(opt):
    """The flat layouts CompiledUpdate traces (parameters by name, name-keyed optimizer
    state) give step()'s numbers bit for bit over 5 steps, every state leaf included."""
    update = FunctionalUpdate(_loss(), opt, max_grad_norm=MAX_NORM)
    params, state = update.init()
    keys = list(state.keys(True, True))
    flat_keys = [flat_state_key(k if isinstance(k, tuple) else (k,), update.names) for k in keys]
    assert ("exp_avg" if isinstance(opt, Adam) else "momentum_buffer", "actor_network.module.0.module.0.weight") \
        in flat_keys
    flat_params = {name: params.get(tuple(name.split("."))) for name in update.names}
    flat_state = TensorDict({}, [])
    for k, fk in zip(keys, flat_keys):
        flat_state.set(fk, state.get(k))
    for mb in _batches(5):
        params, state, metrics = update.step(params, state, mb)
        flat_params, flat_state, flat_metrics = update.step_flat(flat_params, flat_state, mb)
        assert metrics.keys() == flat_metrics.keys()
        for k in metrics:
            assert torch.equal(metrics[k], flat_metrics[k]), k
    for name in update.names:
        assert torch.equal(flat_params[name], params.get(tuple(name.split(".")))), name
    for k, fk in zip(keys, flat_keys):
        assert torch.equal(flat_state.get(fk), state.get(k)), k


def test_loss_swap_restores_the_module_when_the_loss_raises():
    """The step swaps its tensors into the loss module's registries for the call and puts
    the module's own back afterwards, also when the loss raises."""
    update = FunctionalUpdate(_loss(), Adam(lr=1e-2), max_grad_norm=MAX_NORM)
    params, state = update.init()
    before = {k: v for k, v in update.loss_module.named_parameters()}
    with pytest.raises(KeyError, match="action_log_prob"):
        update(params.apply(lambda t: t + 1), state, _batches(1)[0].exclude("action_log_prob"))
    after = dict(update.loss_module.named_parameters())
    assert after.keys() == before.keys()
    for k, v in before.items():
        assert after[k] is v, k  # the same Parameter objects, untouched
    assert all(isinstance(v, nn.Parameter) for v in after.values())


def test_fullgraph_no_graph_break_one_graph_no_recompile():
    """CompiledUpdate (flat tensors at the boundary, minibatches gathered in the graph)
    compiled with a counting backend: 6 calls (new minibatch indices, an annealed lr
    tensor and clip range) make one graph with the whole step in it, and give the eager
    step's parameters."""
    loss_fn = _loss()
    lr = torch.tensor(1e-2)
    update = FunctionalUpdate(loss_fn, Adam(lr=lr, eps=1e-5), max_grad_norm=MAX_NORM)
    params, state = update.init()
    full = torch.cat(_batches(3))  # [3 * B]: each step reads the B rows its index picks
    counter = CompileCounter()
    compiled = CompiledUpdate(update, OptimizerState(state.clone()), backend=counter)
    g = torch.Generator().manual_seed(3)
    for i in range(6):
        lr.fill_(1e-2 * (1 - i / 6))
        loss_fn.clip_epsilon.fill_(0.2 * (1 - i / 6))
        idx = torch.randperm(3 * B, generator=g)[:B]
        metrics = compiled(full, idx)
        params, state, eager_metrics = update(params, state, full[idx])
        torch.testing.assert_close(metrics["loss"], eager_metrics["loss"])
    assert compiled.compiled and counter.frame_count == 1
    assert counter.op_count > 50  # the whole step (forward, backward, Adam) is in that graph
    for key, value in params.items(True, True):
        torch.testing.assert_close(compiled.params.get(key), value, rtol=1e-6, atol=1e-7)
    compiled.sync()
    assert (compiled.opt_state.state == state).all()


@pytest.mark.slow
def test_inductor_compiled_update_equals_torch_optim():
    """The real compiler (inductor) behind CompiledUpdate: 20 updates within float
    tolerance of the eager torch.optim path (inductor fuses and reorders, so not bitwise)."""
    loss_fn = _loss()
    update = FunctionalUpdate(loss_fn, Adam(lr=1e-2, eps=1e-5), max_grad_norm=MAX_NORM)
    compiled = CompiledUpdate(update, OptimizerState(update.init()[1]))
    for mb in _batches(20):
        compiled(mb)
    assert compiled.compiled
    compiled.sync()
    assert int(compiled.opt_state.state["step"]) == 20
    _assert_params_close({k: v.detach().clone() for k, v in loss_fn.named_parameters()}, _eager_torch_optim(20),
                         rtol=1e-4, atol=1e-5)


def test_optimizer_state_round_trips_through_state_dict():
    update = FunctionalUpdate(_loss(), Adam(lr=1e-2), max_grad_norm=MAX_NORM)
    params, state = update.init()
    for mb in _batches(3):
        params, state, _ = update(params, state, mb)
    saved = OptimizerState(state).state_dict()
    holder = OptimizerState(update.init()[1])
    holder.load_state_dict(saved)
    assert int(holder.state["step"]) == 3
    assert (holder.state == state).all()


def test_optimizer_state_goes_through_a_recipe_checkpoint(tmp_path):
    """What the PPO recipe's compile mode tracks as ``optim``: saved and restored by the
    run checkpoints (torch.load(weights_only=True))."""
    from steersman.recipes.checkpoint import load_checkpoint, load_entry, save_checkpoint

    update = FunctionalUpdate(_loss(), Adam(lr=1e-2, amsgrad=True), max_grad_norm=MAX_NORM)
    params, state = update.init()
    for mb in _batches(2):
        params, state, _ = update(params, state, mb)
    save_checkpoint(tmp_path, {"optim": OptimizerState(state).state_dict()})
    holder = OptimizerState(update.init()[1])
    load_entry(holder, load_checkpoint(tmp_path), "optim")
    assert int(holder.state["step"]) == 2 and (holder.state == state).all()


def test_bad_input():
    with pytest.raises(ValueError, match="max_grad_norm must be > 0 or None, got 0.0"):
        FunctionalUpdate(_loss(), Adam(), max_grad_norm=0.0)
    frozen = _loss()
    frozen.requires_grad_(False)
    with pytest.raises(ValueError, match="ClipPPOLoss has no trainable parameter"):
        FunctionalUpdate(frozen, Adam())
    update = FunctionalUpdate(_loss(), Adam())
    params, state = update.init()
    with pytest.raises(KeyError, match="ClipPPOLoss needs 'action_log_prob'"):
        update(params, state, _batches(1)[0].exclude("action_log_prob"))


class _BreakingLoss(nn.Module):
    """A loss dynamo cannot trace whole (an explicit graph break)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(3, 1)

    def forward(self, td: TensorDict) -> TensorDict:
        y = self.net(td["x"])
        torch._dynamo.graph_break()
        return TensorDict({"loss_mse": (y - td["y"]).pow(2).mean(), "not_a_loss": y.mean()}, batch_size=[])


def test_compiled_update_falls_back_to_eager_with_one_warning_and_syncs():
    g = torch.Generator().manual_seed(0)
    batch = TensorDict({"x": torch.randn(8, 3, generator=g), "y": torch.randn(8, 1, generator=g)}, batch_size=[8])
    loss_fn = _BreakingLoss()
    update = FunctionalUpdate(loss_fn, SGD(lr=0.1))
    compiled = CompiledUpdate(update, OptimizerState(update.optimizer.init(update.params())))
    with pytest.warns(UserWarning, match=r"compile=true: the update of _BreakingLoss cannot be compiled \(Unsupported: "
                                         r".*\); running it eagerly") as record:
        metrics = compiled(batch)
        compiled(batch)
    assert len(record) == 1 and "\n" not in str(record[0].message)
    assert not compiled.compiled and set(metrics.keys()) == {"loss_mse", "not_a_loss", "loss"}

    reference = _BreakingLoss()
    optim = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(2):
        optim.zero_grad()
        reference(batch)["loss_mse"].backward()
        optim.step()
    before = loss_fn.net.weight.detach().clone()
    compiled.sync()
    assert not torch.equal(loss_fn.net.weight, before)
    for name, p in reference.named_parameters():
        torch.testing.assert_close(dict(loss_fn.named_parameters())[name], p, rtol=0, atol=0)
    assert int(compiled.opt_state.state["step"]) == 2


@pytest.mark.parametrize("name", ["Adam", "AdamW", "RMSprop", "SGD"])
def test_zero_dim_parameter_keeps_its_dtype_and_matches_torch_optim(name):
    """A 0-dim parameter (SAC's log_alpha) stays float32 (the float64 step-size scalars
    used to promote it) and follows torch.optim bit for bit, with a tensor lr too."""
    from steersman.tensordict.nn import optim as functional

    w = nn.Parameter(torch.tensor(0.3))
    kwargs = {"momentum": 0.9} if name == "SGD" else {}
    reference = getattr(torch.optim, name)([w], lr=1e-2, foreach=False, **kwargs)
    opt = getattr(functional, name)(lr=torch.tensor(1e-2, dtype=torch.float64), **kwargs)
    params = TensorDict({"w": torch.tensor(0.3)}, [])
    state = opt.init(params)
    for i in range(20):
        g = torch.tensor(0.1 * (i % 7) - 0.2)
        w.grad = g.clone()
        reference.step()
        params, state = opt.step(params, TensorDict({"w": g}, []), state)
    assert params["w"].dtype == torch.float32
    assert torch.equal(params["w"], w.detach()), (params["w"], w)


def test_call_skipping_guards_skips_after_the_first_call_and_retries_with_guards() -> None:
    """The first call of a signature runs with dynamo's guards, later ones without; when a
    skipped guard would have failed (torch raises), the call runs again with the guards."""
    from steersman.objectives.functional_update import call_skipping_guards

    calls, seen = [], set()
    fn = torch.compile(lambda x: x * 2, fullgraph=True, backend="eager")
    out = call_skipping_guards(lambda: fn(torch.ones(3)), ("f32", 3), seen)
    assert torch.equal(out, torch.full((3,), 2.0)) and seen == {("f32", 3)}

    def recording() -> str:
        calls.append(torch._dynamo.eval_frame._stance.skip_guard_eval_unsafe)  # the stance in force
        return "ok"

    assert call_skipping_guards(recording, ("f32", 3), seen) == "ok" and calls == [True]
    assert call_skipping_guards(recording, ("f64", 3), seen) == "ok" and calls == [True, False]

    attempts = []

    def stale() -> str:  # a guard that would fail under the skipped stance
        attempts.append(torch._dynamo.eval_frame._stance.skip_guard_eval_unsafe)
        if attempts[-1]:
            raise RuntimeError("recompile needed under skip_guard_eval_unsafe")
        return "recompiled"

    assert call_skipping_guards(stale, ("f32", 3), seen) == "recompiled" and attempts == [True, False]
    assert ("f32", 3) in seen  # seen again after the guarded call

    def broken() -> str:
        raise RuntimeError("something else")

    with pytest.raises(RuntimeError, match="something else"):
        call_skipping_guards(broken, ("f32", 3), seen)
