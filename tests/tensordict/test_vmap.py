"""TensorDict as a pytree, and ensembles with torch.vmap over stacked parameters.

The pattern under test (documented in ``steersman.tensordict.module_params``)::

    params = TensorDict.from_modules(*[MLP() for _ in range(N)])
    def f(p, x):
        with p.to_module(base):
            return base(x)
    torch.vmap(f, (0, None))(params, x)
"""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree
from torch import nn

from steersman.tensordict import (
    NonTensorData,
    TensorDict,
    ensemble_call,
    from_module,
    from_modules,
)


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))


def make_td() -> TensorDict:
    td = TensorDict(
        {"a": torch.randn(4, 3), "n": {"b": torch.randn(4, 2, 6)}, "s": NonTensorData("hi", batch_size=[4])},
        batch_size=[4],
        names=["env"],
    )
    td["n"].batch_size = [4, 2]
    return td


# ----------------------------------------------------------------------------- pytree
class TestPytree:
    def test_round_trip_keeps_metadata(self):
        td = make_td().lock_()
        leaves, spec = pytree.tree_flatten(td)
        assert len(leaves) == 2 and all(isinstance(t, torch.Tensor) for t in leaves)
        back = pytree.tree_unflatten(leaves, spec)
        assert type(back) is TensorDict
        assert back.batch_size == (4,) and back["n"].batch_size == (4, 2)
        assert back.names == ["env"] and back.is_locked and back["n"].is_locked
        assert back["s"] == "hi"
        assert back["a"] is td["a"]

    def test_tree_map(self):
        td = make_td()
        out = pytree.tree_map(lambda t: t * 2, td)
        assert isinstance(out, TensorDict) and out.batch_size == (4,)
        torch.testing.assert_close(out["n", "b"], td["n", "b"] * 2)
        # a map that changes shapes: the batch size follows the leaves
        first = pytree.tree_map(lambda t: t[:1], td)
        assert first.batch_size == (1,) and first["n"].batch_size == (1, 2)

    def test_vmap_slices_batch_dims(self):
        td = make_td()
        seen = []

        def f(t):
            seen.append((t.batch_size, t["n"].batch_size, t["s"]))
            return t["a"].sum() + t["n", "b"].sum()

        out = torch.vmap(f)(td)
        assert seen == [(torch.Size([]), torch.Size([2]), "hi")]
        torch.testing.assert_close(out, td["a"].sum(-1) + td["n", "b"].sum((-1, -2)))

    def test_vmap_returns_tensordict(self):
        td = make_td().exclude("s")
        out = torch.vmap(lambda t: t.apply(lambda x: x + 1))(td)
        assert out.batch_size == (4,) and out["n"].batch_size == (4, 2)
        torch.testing.assert_close(out["a"], td["a"] + 1)
        # in_dims on an inner batch dim; chunked
        td2 = TensorDict({"x": torch.arange(12.0).view(3, 4)}, [3, 4])
        seen = []
        out = torch.vmap(lambda t: seen.append(t.batch_size) or t, in_dims=1)(td2)
        assert seen == [torch.Size([3])] and out.batch_size == (4, 3)
        torch.testing.assert_close(out["x"], td2["x"].T)
        out = torch.vmap(lambda t: t * 2, chunk_size=1)(td2)
        assert out.batch_size == (3, 4)

    def test_func_grad(self):
        td = TensorDict({"w": torch.randn(3), "b": torch.randn(())})
        g = torch.func.grad(lambda p: (p["w"] * 2).sum() + p["b"] ** 2)(td)
        assert isinstance(g, TensorDict)
        torch.testing.assert_close(g["w"], torch.full((3,), 2.0))
        torch.testing.assert_close(g["b"], 2 * td["b"])


# ----------------------------------------------------------------------------- ensembles
def documented(base: nn.Module, params: TensorDict, x: torch.Tensor) -> torch.Tensor:
    def f(p, x):
        with p.to_module(base):
            return base(x)

    return torch.vmap(f, (0, None))(params, x)


@pytest.mark.parametrize("n", [1, 3, 8])
@pytest.mark.parametrize("how", ["documented", "ensemble_call"])
def test_ensemble_matches_loop_forward_and_backward(n, how):
    torch.manual_seed(n)
    nets = [mlp() for _ in range(n)]
    base = mlp()
    base_snapshot = {k: v for k, v in from_module(base).items(True, True)}
    params = TensorDict.from_modules(*nets)
    x = torch.randn(7, 5)
    out = documented(base, params, x) if how == "documented" else ensemble_call(base, params, x)
    ref = torch.stack([net(x) for net in nets])
    assert out.shape == (n, 7, 3)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)
    w = torch.randn_like(ref)
    (out * w).sum().backward()
    (ref * w).sum().backward()
    for i, net in enumerate(nets):
        for key, p in from_module(net).items(True, True):
            torch.testing.assert_close(params.get(key).grad[i], p.grad, atol=1e-6, rtol=1e-5)
    # the base module got its own parameters back and no gradient
    assert all(from_module(base).get(k) is v for k, v in base_snapshot.items())
    assert all(p.grad is None for p in base.parameters())


def test_per_member_inputs_and_buffers():
    torch.manual_seed(0)
    nets = [nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU()).eval() for _ in range(3)]
    for net in nets:  # distinct running stats
        net[1].running_mean.normal_()
        net[1].running_var.uniform_(0.5, 2.0)
    params = from_modules(*nets)
    xs = torch.randn(3, 10, 4)
    out = ensemble_call(nets[0], params, xs, input_dims=0)
    torch.testing.assert_close(out, torch.stack([net(x) for net, x in zip(nets, xs)]), atol=1e-6, rtol=1e-5)


def test_params_module_and_randomness():
    nets = [nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5)) for _ in range(3)]
    params = from_modules(*nets, as_module=True)  # a TensorDictParams: the generic path
    x = torch.randn(2, 4)
    out = ensemble_call(nets[0], params, x, randomness="different")
    assert out.shape == (3, 2, 8)
    out.sum().backward()
    assert params["0", "weight"].grad is not None
    for net in nets:
        net.eval()
    torch.testing.assert_close(ensemble_call(nets[0], params, x), torch.stack([n(x) for n in nets]))


def test_ensemble_mismatch_raises_before_vmap():
    params = from_modules(nn.Linear(2, 2), nn.Linear(2, 2))
    wrapped = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(KeyError, match="weight"):
        ensemble_call(wrapped, params, torch.zeros(2))


class ParamsNet(nn.Module):
    """A module that keeps its weights in a TensorDictParams."""

    def __init__(self) -> None:
        super().__init__()
        from steersman.tensordict import TensorDictParams

        self.params = TensorDictParams(TensorDict({"w": torch.randn(3, 2), "b": {"v": torch.randn(2)}}))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.params["w"] + self.params["b", "v"]


def test_ensemble_of_modules_holding_params():
    nets = [ParamsNet() for _ in range(3)]
    params = from_modules(*nets)
    assert params["params", "w"].shape == (3, 3, 2)
    x = torch.randn(4, 3)
    base = ParamsNet()
    w0 = base.params["w"]
    out = ensemble_call(base, params, x)
    torch.testing.assert_close(out, torch.stack([n(x) for n in nets]))
    out.sum().backward()
    assert params["params", "w"].grad.shape == (3, 3, 2)
    assert base.params["w"] is w0 and dict(base.params.named_parameters())["w"] is w0
    torch.testing.assert_close(documented(base, params, x), out)
