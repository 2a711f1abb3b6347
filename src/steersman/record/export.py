"""Standalone policy files: observation tensor in, action tensor out, no steersman to run.

Two formats:

* ``"torch-export"`` (``.pt2``): a ``torch.export`` program. Load and run with torch only::

      program = torch.export.load("policy.pt2").module()
      action = program(observation)            # [B, *obs_shape] -> [B, *action_shape]
      one = program(single_observation[None])[0]   # one observation: a batch of one

* ``"onnx"`` (``.onnx``): the same graph through ``torch.onnx.export(dynamo=True)``; run
  with ONNX Runtime (or any ONNX runtime)::

      session = onnxruntime.InferenceSession("policy.onnx")
      action = session.run(None, {"observation": observation_numpy})[0]

The policy is exported deterministic (``ExplorationType.DETERMINISTIC``: the mode or
mean of a stochastic policy, the argmax of a Q-value policy), with a dynamic batch
dimension (any ``B >= 1``). The input always has the batch dimension: ``torch.export``
and ONNX fix the rank of a program's input, so an unbatched ``[*obs_shape]`` observation
is refused by the runtime (ONNX Runtime: "Invalid rank for input"; a torch-export
program: an ``IndexError``); pass ``obs[None]`` and take ``[0]`` of the answer. :func:`verify_export` checks a file in a fresh Python process in which
importing steersman fails, against the live policy.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from steersman.tensordict import TensorDict
from steersman.tensordict.nn import ExplorationType, set_exploration_type

from ._optional import import_optional

__all__ = [
    "EXPORT_FORMATS",
    "ExportReport",
    "ExportVerificationError",
    "VerificationResult",
    "export_policy",
    "verify_export",
]

EXPORT_FORMATS = ("torch-export", "onnx")
_SUFFIX = {"torch-export": ".pt2", "onnx": ".onnx"}


class ExportVerificationError(RuntimeError):
    """The exported file could not be run, or its outputs differ from the live policy."""


@dataclass
class VerificationResult:
    """What :func:`verify_export` compared: ``max_abs_diff`` over ``num_observations``
    observations, the file run by ``runner`` in a process without steersman."""

    max_abs_diff: float
    num_observations: int
    runner: str


@dataclass
class ExportReport:
    """What :func:`export_policy` wrote and how it was checked (``verification`` is None
    when ``verify=False``)."""

    path: Path
    format: str
    file_size: int
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    output_dtype: torch.dtype
    verification: VerificationResult | None

    @property
    def max_abs_diff(self) -> float | None:
        return None if self.verification is None else self.verification.max_abs_diff

    def __str__(self) -> str:
        size = f"{self.file_size / 1024:.1f} KiB"
        shapes = (f"observation {batch_shape(self.input_shape)} -> action {batch_shape(self.output_shape)} "
                  f"{str(self.output_dtype).replace('torch.', '')}")
        line = f"exported {self.path} ({self.format}, {size}): {shapes} (one observation: obs[None])"
        v = self.verification
        if v is not None:
            line += (f"; matches the live policy on {v.num_observations} observations "
                     f"(max abs diff {v.max_abs_diff:.2e}, run by {v.runner} without steersman)")
        return line


def batch_shape(shape: tuple[int, ...]) -> str:
    """A shape with its (dynamic) batch dimension written ``B``.

    Example:
        >>> batch_shape((8, 4)), batch_shape((8,)), batch_shape((8, 3, 64, 64))
        ('[B, 4]', '[B]', '[B, 3, 64, 64]')
    """
    return "[" + ", ".join(["B", *map(str, shape[1:])]) + "]"


class _ObservationToAction(nn.Module):
    """``observation -> action``: builds the TensorDict the policy reads, keeps one entry."""

    def __init__(self, policy: nn.Module, in_key: Any, out_key: Any) -> None:
        super().__init__()
        self.policy = policy
        self.in_key = in_key
        self.out_key = out_key

    def forward(self, observation: Tensor) -> Tensor:
        td = TensorDict({}, batch_size=observation.shape[:1])
        td.set(self.in_key, observation)
        with set_exploration_type(ExplorationType.DETERMINISTIC):
            return self.policy(td).get(self.out_key)


def export_policy(
    policy: nn.Module,
    example_observation: Tensor,
    path: str | os.PathLike,
    format: str = "torch-export",
    *,
    in_key: str | tuple[str, ...] = "observation",
    out_key: str | tuple[str, ...] = "action",
    verify: bool = True,
    observations: Tensor | None = None,
    atol: float = 1e-5,
) -> ExportReport:
    """Writes ``policy`` as a standalone file mapping an observation to an action.

    The policy is copied (the caller's module is not changed), moved to the CPU, put in
    eval mode and traced deterministic. The file takes a CPU batch ``[B, *obs_shape]``
    for any ``B`` (a loaded torch-export program can be moved with ``.to(device)``).

    Args:
        policy: a TensorDict module reading ``in_key`` and writing ``out_key``.
        example_observation: a batch ``[B, *obs_shape]`` of observations (dtype and
            shape of the file's input; a batch of one is repeated to two, since
            ``torch.export`` would fix a size-1 batch).
        path: the file to write (conventionally ``.pt2`` or ``.onnx``).
        format: one of :data:`EXPORT_FORMATS`.
        in_key / out_key: the policy's observation and action entries.
        verify: run the file in a fresh process and compare (:func:`verify_export`).
        observations: the observations to verify on (default: ``example_observation``).
        atol: the largest absolute difference accepted.

    Returns: an :class:`ExportReport` (path, file size, shapes, max abs difference).

    Raises: ``ValueError`` for an unknown format or a policy that does not write
    ``out_key``; :class:`ExportVerificationError` when the outputs differ.

    Example:
        >>> import tempfile, torch
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> policy = TensorDictModule(torch.nn.Linear(4, 2), ["observation"], ["action"])
        >>> rep = export_policy(policy, torch.randn(8, 4), tempfile.mkdtemp() + "/policy.pt2", verify=False)
        >>> rep.format, rep.output_shape, rep.file_size > 0
        ('torch-export', (8, 2), True)
        >>> program = torch.export.load(rep.path).module()
        >>> x = torch.randn(3, 4)
        >>> torch.allclose(program(x), policy.module(x))
        True
    """
    if format not in EXPORT_FORMATS:
        raise ValueError(f"unknown export format {format!r}: choose one of {', '.join(map(repr, EXPORT_FORMATS))}")
    example = torch.as_tensor(example_observation).detach().cpu()
    if example.ndim < 1 or example.shape[0] < 1:
        raise ValueError(f"example_observation must be a batch [B, *obs_shape], got shape {tuple(example.shape)}")
    if example.shape[0] == 1:
        example = torch.cat([example, example])
    program = _ObservationToAction(copy.deepcopy(policy).cpu().eval().requires_grad_(False), in_key, out_key)
    action = _check_output(program, example, in_key, out_key)
    dims = {0: torch.export.Dim("batch")}
    # distribution argument validation (torch's default) is a data-dependent check that
    # torch.export cannot trace: the exported program is deterministic, validate nothing
    previous = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(False)
    try:
        with torch.no_grad():
            ep = torch.export.export(program, (example,), dynamic_shapes=(dims,), strict=False)
    finally:
        torch.distributions.Distribution.set_default_validate_args(previous)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if format == "torch-export":
        torch.export.save(ep, path)
    else:
        import_optional("onnx", extra="record", purpose="ONNX export")
        import_optional("onnxscript", extra="record", purpose="ONNX export")
        with _quiet_onnx_logs():
            onx = torch.onnx.export(ep, (example,), dynamo=True, verbose=False,
                                    input_names=[_name(in_key)], output_names=[_name(out_key)])
        onx.save(str(path))
    result = None
    if verify:
        obs = example if observations is None else observations
        result = verify_export(path, policy, obs, atol=atol, in_key=in_key, out_key=out_key, format=format)
    return ExportReport(path=path, format=format, file_size=path.stat().st_size,
                        input_shape=tuple(example.shape), output_shape=tuple(action.shape),
                        output_dtype=action.dtype, verification=result)


def verify_export(
    path: str | os.PathLike,
    policy: nn.Module,
    observations: Tensor,
    *,
    atol: float = 1e-5,
    in_key: str | tuple[str, ...] = "observation",
    out_key: str | tuple[str, ...] = "action",
    format: str | None = None,
    onnx_runner: str = "auto",
) -> VerificationResult:
    """Runs the exported file on ``observations`` in a fresh Python process where
    ``import steersman`` fails, and compares with the live ``policy`` (deterministic, in
    eval mode, as exported).

    ONNX files run with onnxruntime when it is installed, else with ``onnx.reference``
    (slower, pure numpy); the result says which.

    Args:
        path: a file written by :func:`export_policy`.
        policy: the live policy.
        observations: a batch ``[B, *obs_shape]``.
        atol: the largest absolute difference accepted.
        in_key / out_key: the policy's observation and action entries.
        format: ``"torch-export"`` or ``"onnx"`` (default: from the suffix, ``.onnx`` or not).
        onnx_runner: ``"auto"`` (onnxruntime if installed, else ``onnx.reference``),
            ``"onnxruntime"`` or ``"onnx.reference"``.

    Raises: :class:`ExportVerificationError` when the file fails to run or differs.
    """
    path = Path(path)
    format = format or ("onnx" if path.suffix == ".onnx" else "torch-export")
    if format not in EXPORT_FORMATS:
        raise ValueError(f"unknown export format {format!r}: choose one of {', '.join(map(repr, EXPORT_FORMATS))}")
    if onnx_runner not in ("auto", "onnxruntime", "onnx.reference"):
        raise ValueError(f"onnx_runner must be 'auto', 'onnxruntime' or 'onnx.reference', got {onnx_runner!r}")
    obs = torch.as_tensor(observations).detach().cpu()
    live = copy.deepcopy(policy).cpu().eval()  # as exported (on CPU, dropout/batch-norm in eval mode)
    with torch.no_grad():
        expected = _ObservationToAction(live, in_key, out_key)(obs)
    with tempfile.TemporaryDirectory() as tmp:
        obs_path, out_path = Path(tmp) / "obs.pt", Path(tmp) / "out.pt"
        torch.save(obs.contiguous(), obs_path)
        proc = subprocess.run(
            [sys.executable, "-c", _RUNNER, format, str(path.absolute()), str(obs_path), str(out_path),
             onnx_runner],
            cwd=tmp, capture_output=True, text=True, timeout=600,
        )
        if proc.returncode != 0:
            raise ExportVerificationError(f"running {str(path)!r} without steersman failed:\n{proc.stderr[-3000:]}")
        got = torch.load(out_path, weights_only=True)
    runner = proc.stdout.strip().splitlines()[-1]
    if tuple(got.shape) != tuple(expected.shape):
        raise ExportVerificationError(f"{str(path)!r} returned shape {tuple(got.shape)}, "
                                      f"the live policy {tuple(expected.shape)}")
    diff = (got.double() - expected.double()).abs().max().item() if got.numel() else 0.0
    if not diff <= atol:
        raise ExportVerificationError(f"{str(path)!r} differs from the live policy: max abs diff {diff:.3e} "
                                      f"> atol {atol:.1e} (run by {runner})")
    return VerificationResult(max_abs_diff=diff, num_observations=int(obs.shape[0]), runner=runner)


def _check_output(program: _ObservationToAction, example: Tensor, in_key: Any, out_key: Any) -> Tensor:
    td = TensorDict({}, batch_size=example.shape[:1])
    td.set(in_key, example)
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        out = program.policy(td)
    keys = list(out.keys(include_nested=True, leaves_only=True))
    if out_key not in keys:
        raise ValueError(f"the policy did not write out_key={out_key!r}: after a call its entries are "
                         f"{keys} (pass out_key=... to export another one)")
    action = out.get(out_key)
    if not isinstance(action, Tensor):
        raise ValueError(f"the policy's {out_key!r} is a {type(action).__name__}, expected a tensor")
    return action


def _name(key: str | tuple[str, ...]) -> str:
    return key if isinstance(key, str) else ".".join(key)


@contextlib.contextmanager
def _quiet_onnx_logs() -> Iterator[None]:
    """Silences the exporter's per-run notes (e.g. about torchvision ops not installed)."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():  # torch-internal deprecation notes, nothing for the user
            warnings.filterwarnings("ignore", category=FutureWarning, message=".*LeafSpec")
            yield
    finally:
        logger.setLevel(level)


# Run in a fresh interpreter: loads the file with torch/onnxruntime only (steersman is
# blocked), runs it on the saved observations and saves the outputs.
_NO_STEERSMAN = r"""
import sys

class _NoSteersman:
    def find_spec(self, name, path=None, target=None):
        if name == "steersman" or name.startswith("steersman."):
            raise ModuleNotFoundError("an exported policy must run without steersman (imported " + name + ")")
        return None

sys.meta_path.insert(0, _NoSteersman())
"""

_RUNNER = _NO_STEERSMAN + r"""
import torch

fmt, model_path, obs_path, out_path, onnx_runner = sys.argv[1:6]
obs = torch.load(obs_path, weights_only=True)
if fmt == "torch-export":
    program = torch.export.load(model_path).module()
    with torch.no_grad():
        out = program(obs)
    runner = "torch.export.load"
else:
    onnxruntime = None
    if onnx_runner != "onnx.reference":
        try:
            import onnxruntime
        except ImportError:
            if onnx_runner == "onnxruntime":
                raise
    if onnxruntime is not None:
        sess = onnxruntime.InferenceSession(model_path, providers=["CPUExecutionProvider"])
        out = sess.run(None, {sess.get_inputs()[0].name: obs.numpy()})[0]
        runner = "onnxruntime " + onnxruntime.__version__
    else:
        import onnx
        from onnx.reference import ReferenceEvaluator
        model = onnx.load(model_path)
        onnx.checker.check_model(model)
        ref = ReferenceEvaluator(model)
        out = ref.run(None, {model.graph.input[0].name: obs.numpy()})[0]
        runner = "onnx.reference" + (" (onnxruntime not installed)" if onnx_runner == "auto" else "")
    out = torch.from_numpy(out)
torch.save(out, out_path)
print(runner)
"""
