"""Standalone policy export: round trips in a process without steersman, and bad inputs."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from steersman.record import (
    EXPORT_FORMATS,
    ExportVerificationError,
    export_policy,
    verify_export,
)
from steersman.record.export import _NO_STEERSMAN
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import (
    ExplorationType,
    NormalParamExtractor,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TanhNormal,
    TensorDictModule,
    TensorDictSequential,
    set_exploration_type,
)

OBS_DIM = 5


def needs(fmt: str) -> None:
    if fmt == "onnx":
        pytest.importorskip("onnx")
        pytest.importorskip("onnxscript")


def has_onnxruntime() -> bool:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def mlp(out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(OBS_DIM, 32), nn.Tanh(), nn.Linear(32, out))


class Argmax(nn.Module):
    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return q.argmax(-1)


def deterministic_policy() -> nn.Module:
    return TensorDictModule(nn.Sequential(mlp(2), nn.Tanh()), ["observation"], ["action"])


def tanh_normal_policy() -> nn.Module:
    return ProbabilisticTensorDictSequential(
        TensorDictModule(nn.Sequential(mlp(4), NormalParamExtractor()), ["observation"], ["loc", "scale"]),
        ProbabilisticTensorDictModule(["loc", "scale"], ["action"], distribution_class=TanhNormal,
                                      distribution_kwargs={"low": -2.0, "high": 2.0},
                                      return_log_prob=True),
    )


def qvalue_policy() -> nn.Module:
    return TensorDictSequential(
        TensorDictModule(mlp(3), ["observation"], ["action_value"]),
        TensorDictModule(Argmax(), ["action_value"], ["action"]),
    )


POLICIES = {"deterministic": deterministic_policy, "tanh_normal": tanh_normal_policy, "qvalue": qvalue_policy}


@pytest.fixture(scope="module")
def policies() -> dict[str, nn.Module]:
    torch.manual_seed(0)
    return {name: make() for name, make in POLICIES.items()}


def run_file(path, obs: torch.Tensor) -> torch.Tensor:
    """Runs an exported file in this process (the subprocess check is verify_export's)."""
    if path.suffix == ".pt2":
        return torch.export.load(path).module()(obs)
    try:
        import onnxruntime
    except ImportError:
        from onnx.reference import ReferenceEvaluator

        return torch.from_numpy(ReferenceEvaluator(str(path)).run(None, {"observation": obs.numpy()})[0])
    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["observation"]
    assert [o.name for o in sess.get_outputs()] == ["action"]
    return torch.from_numpy(sess.run(None, {"observation": obs.numpy()})[0])


def live(policy: nn.Module, obs: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        return policy(TensorDict({"observation": obs}, obs.shape[:1]))["action"]


@pytest.mark.parametrize("fmt", EXPORT_FORMATS)
@pytest.mark.parametrize("name", list(POLICIES))
def test_round_trip_outputs(policies, tmp_path, name, fmt):
    needs(fmt)
    policy = policies[name]
    path = tmp_path / ("policy.pt2" if fmt == "torch-export" else "policy.onnx")
    rep = export_policy(policy, torch.randn(4, OBS_DIM), path, fmt, verify=False)
    assert rep.path == path and path.stat().st_size == rep.file_size > 0 and rep.verification is None
    expected_dtype = torch.int64 if name == "qvalue" else torch.float32
    assert rep.output_dtype == expected_dtype and rep.output_shape == ((4,) if name == "qvalue" else (4, 2))
    obs = torch.randn(17, OBS_DIM)  # another batch size than the example's
    got, want = run_file(path, obs), live(policy, obs)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert policy.training  # the caller's module is not switched to eval mode


@pytest.mark.parametrize("name, shapes", [
    ("qvalue", "observation [B, 5] -> action [B] int64"),
    ("deterministic", "observation [B, 5] -> action [B, 2] float32"),
])
def test_report_writes_the_batch_dimension(policies, tmp_path, name, shapes):
    rep = export_policy(policies[name], torch.randn(4, OBS_DIM), tmp_path / "policy.pt2", verify=False)
    assert f"(torch-export, {rep.file_size / 1024:.1f} KiB): {shapes}" in str(rep)


@pytest.mark.parametrize("fmt", EXPORT_FORMATS)
def test_export_verifies_without_steersman(policies, tmp_path, fmt):
    """verify=True runs the file in a fresh process where importing steersman fails."""
    needs(fmt)
    path = tmp_path / ("policy.pt2" if fmt == "torch-export" else "policy.onnx")
    obs = torch.randn(9, OBS_DIM)
    rep = export_policy(policies["tanh_normal"], torch.randn(4, OBS_DIM), path, fmt, observations=obs)
    v = rep.verification
    assert v is not None and v.num_observations == 9 and rep.max_abs_diff == v.max_abs_diff <= 1e-5
    onnx_runner = "onnxruntime" if has_onnxruntime() else "onnx.reference (onnxruntime not installed)"
    assert v.runner.startswith("torch.export.load" if fmt == "torch-export" else onnx_runner)
    assert "matches the live policy on 9 observations" in str(rep)


def test_runner_blocks_steersman():
    proc = subprocess.run([sys.executable, "-c", _NO_STEERSMAN + "import steersman.tensordict"],
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "must run without steersman" in proc.stderr


def test_stochastic_policy_exports_its_mode(policies, tmp_path):
    """The file holds the deterministic action: tanh-squashed loc, scaled to [-2, 2]."""
    policy = policies["tanh_normal"]
    rep = export_policy(policy, torch.randn(4, OBS_DIM), tmp_path / "p.pt2", verify=False)
    program = torch.export.load(rep.path).module()
    obs = torch.randn(6, OBS_DIM)
    td = policy[0](TensorDict({"observation": obs}, [6]))
    expected = 2.0 * torch.tanh(td["loc"])
    torch.testing.assert_close(program(obs), expected)
    with set_exploration_type(ExplorationType.RANDOM):  # the context at load time is irrelevant
        torch.testing.assert_close(program(obs), expected)


@pytest.mark.parametrize("batch", [1, 3])
def test_batch_of_one_example_keeps_batch_dynamic(policies, tmp_path, batch):
    rep = export_policy(policies["deterministic"], torch.randn(batch, OBS_DIM), tmp_path / "p.pt2", verify=False)
    program = torch.export.load(rep.path).module()
    for n in (1, 2, 9):
        assert program(torch.randn(n, OBS_DIM)).shape == (n, 2)


def test_onnx_reference_runner(policies, tmp_path):
    """Without onnxruntime the check runs the graph with onnx.reference (and says so)."""
    needs("onnx")
    path = tmp_path / "p.onnx"
    export_policy(policies["deterministic"], torch.randn(4, OBS_DIM), path, "onnx", verify=False)
    res = verify_export(path, policies["deterministic"], torch.randn(5, OBS_DIM), onnx_runner="onnx.reference")
    assert res.runner == "onnx.reference" and res.max_abs_diff <= 1e-5


def test_nested_keys(tmp_path):
    policy = TensorDictModule(mlp(2), [("agent", "obs")], [("agent", "act")])
    rep = export_policy(policy, torch.randn(4, OBS_DIM), tmp_path / "p.pt2",
                        in_key=("agent", "obs"), out_key=("agent", "act"), verify=False)
    x = torch.randn(3, OBS_DIM)
    torch.testing.assert_close(torch.export.load(rep.path).module()(x), policy.module(x))


# ---------------------------------------------------------------------- bad input
def test_unknown_format_lists_formats(policies, tmp_path):
    with pytest.raises(ValueError, match="unknown export format 'tflite'.*'torch-export', 'onnx'"):
        export_policy(policies["deterministic"], torch.randn(4, OBS_DIM), tmp_path / "p.x", "tflite")
    assert not list(tmp_path.iterdir())


def test_policy_without_out_key(policies, tmp_path):
    with pytest.raises(ValueError, match=r"did not write out_key='act'.*'action'"):
        export_policy(policies["qvalue"], torch.randn(4, OBS_DIM), tmp_path / "p.pt2", out_key="act")
    assert not list(tmp_path.iterdir())


def test_scalar_example_rejected(policies, tmp_path):
    with pytest.raises(ValueError, match=r"batch \[B, \*obs_shape\]"):
        export_policy(policies["deterministic"], torch.tensor(1.0), tmp_path / "p.pt2")


def test_verify_detects_a_different_policy(policies, tmp_path):
    needs("onnx")
    rep = export_policy(policies["deterministic"], torch.randn(4, OBS_DIM), tmp_path / "p.onnx", "onnx",
                        verify=False)
    other = deterministic_policy()
    with pytest.raises(ExportVerificationError, match="differs from the live policy: max abs diff"):
        verify_export(rep.path, other, torch.randn(8, OBS_DIM))


def test_verify_unreadable_file(policies, tmp_path):
    needs("onnx")
    bad = tmp_path / "p.onnx"
    bad.write_bytes(b"not a graph")
    with pytest.raises(ExportVerificationError, match="without steersman failed"):
        verify_export(bad, policies["deterministic"], torch.randn(2, OBS_DIM))


def test_categorical_policy_with_default_validation_exports(tmp_path):
    """torch.distributions validates arguments by default (a data-dependent check that
    torch.export cannot trace): export turns it off while tracing, and restores it."""
    from steersman.data import Categorical
    from steersman.modules import MLP, ProbabilisticActor
    from steersman.record import export_policy
    from steersman.tensordict.nn import TensorDictModule

    torch.manual_seed(0)
    logits = TensorDictModule(MLP(in_features=4, out_features=3, num_cells=[8]), ["observation"], ["logits"])
    policy = ProbabilisticActor(logits, ["logits"], spec=Categorical(3),
                                distribution_class=torch.distributions.Categorical)
    before = torch.distributions.Distribution._validate_args
    report = export_policy(policy, torch.randn(6, 4), tmp_path / "policy.pt2")  # verified in-process
    assert report.max_abs_diff == 0 and (tmp_path / "policy.pt2").stat().st_size > 0
    assert torch.distributions.Distribution._validate_args == before
