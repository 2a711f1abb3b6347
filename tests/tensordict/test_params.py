"""TensorDictParams: a TensorDict whose leaves are registered with an nn.Module."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

from steersman.tensordict import TensorDict, TensorDictBase, TensorDictParams


def make_td() -> TensorDict:
    return TensorDict(
        {
            "w": torch.randn(2, 3),
            "step": torch.zeros((), dtype=torch.long),
            "sub": {"b": torch.randn(3), "mask": torch.ones(3, dtype=torch.bool)},
        }
    )


class Holder(nn.Module):
    def __init__(self, params: TensorDictParams) -> None:
        super().__init__()
        self.params = params
        self.lin = nn.Linear(3, 1)


def test_registration_default_converts_floats():
    td = make_td()
    p = TensorDictParams(td)
    assert isinstance(p, TensorDictBase) and isinstance(p, nn.Module)
    named = dict(p.named_parameters())
    assert sorted(named) == ["sub.b", "w"]
    assert sorted(dict(p.named_buffers())) == ["step", "sub.mask"]
    # the TensorDict holds the very objects the module registered
    assert p["w"] is named["w"] and p["sub", "b"] is named["sub.b"]
    assert isinstance(p["w"], nn.Parameter) and p["w"].requires_grad
    assert not isinstance(p["step"], nn.Parameter)
    assert td["w"] is p["w"]  # a TensorDict is wrapped (and converted) in place


def test_no_convert_keeps_plain_tensors_as_buffers():
    weight = nn.Parameter(torch.randn(3))
    p = TensorDictParams(TensorDict({"weight": weight, "stat": torch.zeros(3)}), no_convert=True)
    assert dict(p.named_parameters()) == {"weight": weight}
    assert list(dict(p.named_buffers())) == ["stat"]
    assert not isinstance(p["stat"], nn.Parameter)


def test_optimizer_updates_the_tensordict():
    p = TensorDictParams(make_td())
    before = p["w"].detach().clone()
    opt = torch.optim.SGD(p.parameters(), lr=0.5)
    (p["w"].sum() + p["sub", "b"].sum()).backward()
    opt.step()
    torch.testing.assert_close(p["w"], before - 0.5)


def test_state_dict_round_trip_and_parent_module():
    p = TensorDictParams(make_td())
    sd = p.state_dict()
    assert sorted(sd) == ["step", "sub.b", "sub.mask", "w"]  # flat, no batch-size entries
    q = TensorDictParams(make_td())
    q.load_state_dict(sd)
    assert (q == p).all()
    holder = Holder(TensorDictParams(make_td()))
    hsd = holder.state_dict()
    assert sorted(hsd) == ["lin.bias", "lin.weight", "params.step", "params.sub.b", "params.sub.mask", "params.w"]
    other = Holder(TensorDictParams(make_td()))
    w_obj = other.params["w"]
    other.load_state_dict(hsd)
    assert other.params["w"] is w_obj  # copied in place
    torch.testing.assert_close(other.params["w"], holder.params["w"])
    assert len(list(holder.parameters())) == 4


def test_load_state_dict_strict_errors():
    p = TensorDictParams(make_td())
    sd = p.state_dict()
    sd.pop("sub.b")
    sd["extra"] = torch.zeros(1)
    with pytest.raises(RuntimeError, match="sub.b") as err:
        p.load_state_dict(sd)
    assert "extra" in str(err.value)
    bad = TensorDictParams(make_td()).state_dict()
    bad["w"] = torch.zeros(5)
    with pytest.raises(RuntimeError, match="size mismatch"):
        p.load_state_dict(bad)


def test_parent_to_updates_leaves():
    holder = Holder(TensorDictParams(make_td()))
    holder.double()
    p = holder.params
    assert p["w"].dtype == torch.float64 and p["sub", "b"].dtype == torch.float64
    assert p["step"].dtype == torch.long
    assert p["w"] is dict(p.named_parameters())["w"] and isinstance(p["w"], nn.Parameter)
    assert p["step"] is dict(p.named_buffers())["step"]


def test_to_on_the_object_returns_new_params():
    p = TensorDictParams(make_td())
    q = p.to(torch.float64)
    assert isinstance(q, TensorDictParams) and q is not p
    assert isinstance(q["w"], nn.Parameter) and q["w"].dtype == torch.float64
    assert p["w"].dtype == torch.float32
    assert p.to("cpu")["w"] is p["w"]  # nothing moves: the same leaves


def test_tensordict_behaviour():
    td = TensorDict({"a": torch.randn(4, 2), "n": {"b": torch.randn(4, 3)}}, batch_size=[4])
    p = TensorDictParams(td)
    assert p.batch_size == (4,) and p.shape == (4,)
    assert set(p.keys(True, True)) == {"a", ("n", "b")}
    sub = p[1:3]
    assert type(sub) is TensorDict and sub.batch_size == (2,)
    torch.testing.assert_close(sub["a"], p["a"][1:3])
    doubled = p.apply(lambda x: x * 2)
    assert type(doubled) is TensorDict
    torch.testing.assert_close(doubled["n", "b"], p["n", "b"] * 2)
    assert p.flatten_keys().keys() == {"a", "n.b"}  # forwarded to the TensorDict
    assert p.a is p["a"] and p.n is p["n"]


def test_writes_register_new_leaves():
    p = TensorDictParams(make_td())
    p["new"] = torch.zeros(2)
    p.set(("sub", "deeper", "c"), torch.ones(1))
    p["counts"] = torch.zeros(2, dtype=torch.long)
    names = dict(p.named_parameters())
    assert p["new"] is names["new"] and p["sub", "deeper", "c"] is names["sub.deeper.c"]
    assert "counts" in dict(p.named_buffers())
    del p["new"]
    assert "new" not in dict(p.named_parameters())
    p.update({"w2": torch.ones(3)})
    assert "w2" in dict(p.named_parameters())


def test_clone_detach_data_requires_grad():
    p = TensorDictParams(make_td())
    c = p.clone()
    assert isinstance(c, TensorDictParams) and isinstance(c["w"], nn.Parameter)
    assert c["w"].data_ptr() != p["w"].data_ptr() and torch.equal(c["w"], p["w"])
    shallow = p.clone(False)
    assert shallow["w"] is p["w"]
    assert not p.data["w"].requires_grad and p.data["w"].data_ptr() == p["w"].data_ptr()
    p.requires_grad_(False)
    assert not p["w"].requires_grad and not p["sub", "b"].requires_grad
    p.requires_grad_(True)
    assert p["w"].requires_grad


def test_grad_property():
    p = TensorDictParams(make_td())
    p["w"].sum().backward()
    g = p.grad
    assert torch.equal(g["w"], torch.ones(2, 3))


def test_deepcopy_and_pickle():
    p = TensorDictParams(make_td())
    c = copy.deepcopy(p)
    assert c["w"] is dict(c.named_parameters())["w"] and c["w"] is not p["w"]
    assert torch.equal(c["w"], p["w"])
    buf = io.BytesIO()
    torch.save(Holder(p), buf)
    buf.seek(0)
    h = torch.load(buf, weights_only=False)
    assert torch.equal(h.params["w"], p["w"])
    assert h.params["w"] is dict(h.params.named_parameters())["w"]


def test_lock():
    p = TensorDictParams(make_td(), lock=True)
    assert p.is_locked
    with pytest.raises(RuntimeError):
        p["new"] = torch.zeros(1)


def test_vmap_over_params():
    p = TensorDictParams(TensorDict({"w": torch.randn(5, 3)}, [5]))
    out = torch.vmap(lambda t: t["w"].sum())(p)
    torch.testing.assert_close(out, p["w"].sum(-1))
    out.sum().backward()
    assert torch.equal(p["w"].grad, torch.ones(5, 3))


def test_parent_device_move_keeps_registry_and_device():
    # "meta" stands in for another device: nn.Module._apply creates new Parameter objects
    holder = Holder(TensorDictParams(TensorDict(make_td().to_dict(), device="cpu"), lock=True))
    holder.to("meta")
    p = holder.params
    assert p.device == torch.device("meta") and p["sub", "mask"].device.type == "meta"
    assert p["w"] is dict(p.named_parameters())["w"] and isinstance(p["w"], nn.Parameter)
    assert p["step"] is dict(p.named_buffers())["step"]
    assert p.is_locked
