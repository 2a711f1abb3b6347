#!/usr/bin/env bash
# Create (or refresh) the anchor venv: the `tensordict` package beside torch 2.13.0, used
# only as the comparison column of the benchmarks. It is never a dependency of steersman.
#
#   bash benchmarks/setup_anchors.sh [VENV_PATH]
#
# VENV_PATH defaults to $STEERSMAN_ANCHORS_VENV, else ~/.cache/steersman/anchors-venv.
set -euo pipefail

VENV=${1:-${STEERSMAN_ANCHORS_VENV:-$HOME/.cache/steersman/anchors-venv}}
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"

# torch first and pinned in the same command as tensordict: 2.13.0 is the local CPU wheel;
# letting tensordict pick torch would download a multi-GB CUDA build.
"$PY" -m pip install -q torch==2.13.0
"$PY" -m pip install -q torch==2.13.0 tensordict numpy h5py gymnasium==1.4.0
# TorchRL for the replay-buffer, env and collector columns; it pins tensordict<0.15, so
# restore the newer tensordict afterwards (its uniform buffer and GymEnv still work).
"$PY" -m pip install -q torch==2.13.0 torchrl || echo "torchrl not installed: its columns will be n/a"
"$PY" -m pip install -q torch==2.13.0 "tensordict>=0.15"
"$PY" -c 'import torch, tensordict; print(f"torch {torch.__version__}, tensordict {tensordict.__version__}")'
