"""to_safetensors / from_safetensors beyond the battery: plain files, names, errors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from steersman.tensordict import TensorDict, from_module, from_safetensors, to_safetensors


def test_plain_file_loads_nested_and_writes_into_a_module(tmp_path):
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    save_file(net.state_dict(), tmp_path / "m.safetensors")
    params = from_safetensors(tmp_path / "m.safetensors")
    assert params["0", "weight"].shape == (4, 3) and params["2", "bias"].shape == (2,)
    other = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    params.to_module(other)
    x = torch.randn(5, 3)
    assert torch.equal(other(x), net(x))
    to_safetensors(from_module(net), tmp_path / "ours.safetensors")   # state_dict names in the file
    assert set(load_file(tmp_path / "ours.safetensors")) == set(net.state_dict())


def test_names_shared_memory_and_dotted_keys(tmp_path):
    base = torch.arange(6.0)
    td = TensorDict({"x": base, "y": base[:3].clone(), "a.b": torch.ones(2),
                     "a": TensorDict(b=torch.zeros(2))}, batch_size=[])
    td["view"] = base  # the same memory twice
    td2 = TensorDict(obs=torch.zeros(2, 3), batch_size=[2, 3], names=["env", "time"])
    to_safetensors(td, tmp_path / "a.safetensors")
    to_safetensors(td2, tmp_path / "b.safetensors")
    back = from_safetensors(tmp_path / "a.safetensors")
    assert torch.equal(back["a.b"], torch.ones(2)) and torch.equal(back["a", "b"], torch.zeros(2))
    assert torch.equal(back["view"], base)
    assert from_safetensors(tmp_path / "b.safetensors").names == ["env", "time"]


def test_errors_name_the_problem(tmp_path):
    td = TensorDict(x=torch.zeros(2), batch_size=[2])
    td["obj"] = object()
    with pytest.raises(TypeError, match="obj.*not JSON"):
        to_safetensors(td, tmp_path / "x.safetensors")
    assert not (tmp_path / "x.safetensors").exists()
    with pytest.raises(FileNotFoundError, match="nope"):
        from_safetensors(tmp_path / "nope.safetensors")
    meta = {"steersman.tensordict": json.dumps({"version": 99, "root": {}})}
    save_file({"x": torch.zeros(1)}, tmp_path / "v.safetensors", metadata=meta)
    with pytest.raises(ValueError, match="version 99"):
        from_safetensors(tmp_path / "v.safetensors")
    meta = {"steersman.tensordict": json.dumps({"version": 1, "root": {
        "batch_size": [], "names": None, "entries": {"x": {"tensor": "missing"}}}})}
    save_file({"x": torch.zeros(1)}, tmp_path / "m.safetensors", metadata=meta)
    with pytest.raises(ValueError, match="does not match.*missing"):
        from_safetensors(tmp_path / "m.safetensors")
