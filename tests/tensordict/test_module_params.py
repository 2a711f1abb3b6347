"""from_module / to_module / from_modules / shared_copy, and soft target updates."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from steersman.tensordict import (
    LazyStackedTensorDict,
    TensorDict,
    TensorDictParams,
    from_module,
    from_modules,
    shared_copy,
)


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.BatchNorm1d(4), nn.Linear(4, 2))


def snapshot(module: nn.Module) -> dict:
    """Every registry entry: the object and a copy of its value."""
    out = {}
    for mname, m in module.named_modules():
        for reg in ("_parameters", "_buffers"):
            for k, v in getattr(m, reg).items():
                out[(mname, reg, k)] = (v, None if v is None else v.detach().clone())
    return out


def assert_unchanged(module: nn.Module, snap: dict) -> None:
    now = snapshot(module)
    assert now.keys() == snap.keys()
    for key, (obj, value) in snap.items():
        assert now[key][0] is obj, key
        if value is not None:
            assert torch.equal(now[key][1], value), key


# ----------------------------------------------------------------------------- from_module
class TestFromModule:
    def test_structure_and_identity(self):
        net = mlp()
        td = TensorDict.from_module(net)
        assert td.batch_size == ()
        assert set(td.keys()) == {"0", "2", "3"}  # the ReLU holds nothing
        assert set(td["2"].keys()) == {"weight", "bias", "running_mean", "running_var", "num_batches_tracked"}
        assert td["0", "weight"] is net[0].weight and td["2", "running_mean"] is net[2].running_mean
        assert not td.is_locked
        assert from_module(net, lock=True).is_locked
        assert "1" in from_module(net, filter_empty=False).keys()

    def test_as_module_and_state_dict(self):
        net = mlp()
        p = from_module(net, as_module=True)
        assert isinstance(p, TensorDictParams)
        assert p["0", "weight"] is net[0].weight
        assert set(dict(p.named_buffers())) == {"2.running_mean", "2.running_var", "2.num_batches_tracked"}
        sd = from_module(net, use_state_dict=True)
        assert torch.equal(sd["3", "bias"], net[3].bias) and not sd["3", "bias"].requires_grad
        assert sd["3", "bias"].data_ptr() == net[3].bias.data_ptr()

    def test_module_holding_params(self):
        holder = nn.Module()
        holder.params = TensorDictParams(TensorDict({"a": {"w": torch.ones(2)}}))
        holder.lin = nn.Linear(2, 2)
        td = from_module(holder)
        assert td["params", "a", "w"] is holder.params["a", "w"]
        assert td["lin", "weight"] is holder.lin.weight


# ----------------------------------------------------------------------------- to_module
class TestToModule:
    def test_swap_and_return_old(self):
        net = mlp().eval()
        orig = from_module(net)
        zeros = orig.detach().clone().zero_()
        old = zeros.to_module(net)
        assert net[0].weight is zeros["0", "weight"]
        assert old["0", "weight"] is orig["0", "weight"]
        assert torch.equal(net(torch.randn(5, 3)), torch.zeros(5, 2))
        old.to_module(net, return_swap=False)
        assert net[0].weight is orig["0", "weight"]

    def test_context_manager_restores_objects_even_on_error(self):
        net = mlp().eval()
        snap = snapshot(net)
        zeros = from_module(net).detach().clone().zero_()
        with zeros.to_module(net):
            assert torch.equal(net(torch.randn(2, 3)), torch.zeros(2, 2))
        assert_unchanged(net, snap)
        with pytest.raises(ZeroDivisionError):
            with zeros.to_module(net):
                1 / 0  # noqa: B018
        assert_unchanged(net, snap)

    def test_gradients_flow_to_the_tensordict(self):
        net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
        base = from_module(net).detach().clone().requires_grad_()
        scaled = base * 2  # non-leaf tensors go in as they are
        x = torch.randn(5, 3)
        with scaled.to_module(net):
            out = net(x)
        out.sum().backward()
        assert base["0", "weight"].grad is not None and base["0", "weight"].grad.abs().sum() > 0
        assert net[0].weight.grad is None

    def test_inplace(self):
        net = mlp().eval()
        w = net[0].weight
        before = w.detach().clone()
        zeros = from_module(net).detach().clone().zero_()
        with zeros.to_module(net, inplace=True) as old:
            assert net[0].weight is w and (w == 0).all()
            assert torch.equal(old["0", "weight"], before)
        assert net[0].weight is w and torch.equal(w, before)

    @pytest.mark.parametrize(
        "bad_key,path",
        [
            (("0", "weightx"), ("0", "weightx")),  # no such parameter
            (("9", "weight"), ("9",)),  # no such submodule
            (("0", "weight", "x"), ("0", "weight")),  # a tensor in the module, a sub-dict in td
            (("3",), ("3",)),  # a submodule in the module, a tensor in td
        ],
    )
    def test_mismatch_names_path_and_leaves_module_unchanged(self, bad_key, path):
        net = mlp().eval()
        snap = snapshot(net)
        td = from_module(net).detach().clone().zero_()
        if len(bad_key) == 3:
            td = td.exclude(bad_key[:2])
        td.set(bad_key, torch.zeros(1))
        sd_before = {k: v.clone() for k, v in net.state_dict().items()}
        with pytest.raises(KeyError) as err:
            td.to_module(net)
        assert repr(path) in str(err.value) and f"({'.'.join(path)})" in str(err.value)
        sd_after = net.state_dict()
        assert sd_before.keys() == sd_after.keys()
        assert all(torch.equal(sd_before[k], sd_after[k]) for k in sd_before)
        assert_unchanged(net, snap)

    def test_mismatch_after_valid_keys_changes_nothing(self):
        net = mlp().eval()
        snap = snapshot(net)
        td = from_module(net).detach().clone().zero_()
        td["3", "extra"] = torch.zeros(1)  # the last submodule: every key before it is valid
        with pytest.raises(KeyError, match="extra"):
            td.to_module(net)
        assert_unchanged(net, snap)

    def test_partial_and_none_slots(self):
        lin = nn.Linear(3, 2, bias=False)
        w = lin.weight
        td = TensorDict({"bias": torch.ones(2)})
        with td.to_module(lin) as old:
            assert torch.equal(lin.bias, torch.ones(2)) and lin.weight is w
            assert "bias" not in old.keys()
        assert lin.bias is None

    def test_shared_submodule(self):
        shared = nn.Linear(2, 2)
        net = nn.Sequential(shared, nn.Tanh(), shared)
        orig = shared.weight
        td = from_module(net).detach().clone().zero_()
        assert set(td.keys()) == {"0", "2"}
        with td.to_module(net) as old:
            assert old["0", "weight"] is orig and old["2", "weight"] is orig
        assert shared.weight is orig

    def test_into_params_holder(self):
        holder = nn.Module()
        holder.params = TensorDictParams(TensorDict({"w": torch.ones(2)}))
        original = holder.params["w"]
        new = TensorDict({"params": {"w": torch.zeros(2)}})
        with new.to_module(holder):
            assert torch.equal(holder.params["w"], torch.zeros(2))
            assert dict(holder.params.named_parameters())["w"] is new["params", "w"]
        assert holder.params["w"] is original and dict(holder.params.named_parameters())["w"] is original
        with pytest.raises(KeyError, match="nope"):
            TensorDict({"params": {"nope": torch.zeros(2)}}).to_module(holder)

    def test_use_state_dict(self):
        net = mlp().eval()
        w = net[0].weight
        before = w.detach().clone()
        zeros = from_module(net).detach().clone().zero_()
        with zeros.to_module(net, use_state_dict=True) as old:
            assert net[0].weight is w and (w == 0).all()
            assert torch.equal(old["0", "weight"], before)
        assert torch.equal(w, before)


# ----------------------------------------------------------------------------- from_modules
class TestFromModules:
    def test_dense(self):
        nets = [mlp() for _ in range(3)]
        p = TensorDict.from_modules(*nets)
        assert p.batch_size == (3,) and p.is_locked
        for i, n in enumerate(nets):
            assert torch.equal(p["0", "weight"][i], n[0].weight)
            assert torch.equal(p["2", "running_var"][i], n[2].running_var)
        assert isinstance(p["0", "weight"], nn.Parameter) and p["0", "weight"].is_leaf
        assert not isinstance(p["2", "running_var"], nn.Parameter)
        assert p["0", "weight"].data_ptr() != nets[0][0].weight.data_ptr()
        nets[0][0].weight.requires_grad_(False)
        assert not from_modules(*nets)["0", "weight"].requires_grad

    def test_as_module_lazy_and_expand(self):
        nets = [nn.Linear(2, 2) for _ in range(4)]
        p = from_modules(*nets, as_module=True)
        assert isinstance(p, TensorDictParams) and len(list(p.parameters())) == 2
        lazy = from_modules(*nets, lazy_stack=True)
        assert isinstance(lazy, LazyStackedTensorDict) and lazy.batch_size == (4,)
        with pytest.raises(ValueError, match="lazy_stack"):
            from_modules(*nets, lazy_stack=True, as_module=True)
        shared = nn.Linear(2, 2)
        e = from_modules(shared, shared, expand_identical=True)
        assert e["weight"].shape == (2, 2, 2) and e["weight"].stride(0) == 0

    def test_mismatch(self):
        with pytest.raises(ValueError, match="structure"):
            from_modules(nn.Linear(2, 2), nn.Linear(2, 2, bias=False))
        with pytest.raises(ValueError, match="shape"):
            from_modules(nn.Linear(2, 2), nn.Linear(2, 3))


# ----------------------------------------------------------------------------- shared_copy
class TestSharedCopy:
    def test_same_storage_and_modes(self):
        net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 2))
        twin = shared_copy(net)
        ptrs = {t.data_ptr() for t in list(net.parameters()) + list(net.buffers())}
        assert {t.data_ptr() for t in list(twin.parameters()) + list(twin.buffers())} == ptrs
        assert all(a is b for a, b in zip(net.parameters(), twin.parameters()))
        assert net.training and not twin.training and not twin[2].training
        x = torch.randn(16, 4)
        # the twin is deterministic (dropout off, running stats) while the original trains
        torch.testing.assert_close(twin(x), twin(x))
        mean_before = twin[1].running_mean.clone()
        net(x)  # a training step updates the running stats: the twin sees them
        assert not torch.equal(twin[1].running_mean, mean_before)
        assert twin[1].running_mean is net[1].running_mean
        net.eval()
        torch.testing.assert_close(twin(x), net(x))

    def test_optimizer_step_on_original_changes_twin(self):
        net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        twin = shared_copy(net, requires_grad=False)
        assert not any(p.requires_grad for p in twin.parameters())
        assert all(p.requires_grad for p in net.parameters())
        assert [p.data_ptr() for p in twin.parameters()] == [p.data_ptr() for p in net.parameters()]
        x = torch.randn(5, 4)
        before = twin(x).detach()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        net(x).pow(2).sum().backward()
        opt.step()
        after = twin(x)
        assert not torch.allclose(before, after)
        torch.testing.assert_close(after, net(x))
        assert not after.requires_grad

    def test_eval_mode_false_and_params_holder(self):
        holder = nn.Module()
        holder.params = TensorDictParams(TensorDict({"w": torch.ones(2)}))
        twin = shared_copy(holder, eval_mode=False)
        assert twin.training
        assert twin.params["w"] is holder.params["w"]
        assert dict(twin.params.named_parameters())["w"] is holder.params["w"]


# ----------------------------------------------------------------------------- soft updates
class TestSoftUpdate:
    def test_lerp_on_detached_views(self):
        online, target = nn.Linear(3, 2), nn.Linear(3, 2)
        old = target.weight.detach().clone()
        tp = from_module(target).detach()  # views of the target's storage, no autograd
        op = from_module(online)
        tp.lerp_(op, 0.1)
        torch.testing.assert_close(target.weight.detach(), old + 0.1 * (online.weight.detach() - old))
        assert target.weight.requires_grad and isinstance(target.weight, nn.Parameter)

    def test_lerp_under_no_grad_on_parameters(self):
        online, target = nn.Linear(3, 2), nn.Linear(3, 2)
        old = target.bias.detach().clone()
        tp, op = from_module(target), from_module(online)
        with torch.no_grad():
            tp.lerp_(op, 0.5)
        torch.testing.assert_close(target.bias.detach(), (old + online.bias.detach()) / 2)
        # the updated target still trains
        target(torch.randn(2, 3)).sum().backward()
        assert target.weight.grad is not None
