#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv and install steersman
# into it with the test, HDF5, Arrow/pandas, dev (ruff, docs), env extras (MuJoCo, Box2D, Atari, dm_control, EnvPool, PettingZoo, VMAS),
# Ray, and the W&B / MLflow / Slurm-launcher integrations: their tests run in CI. Idempotent; used by scripts/demo.sh and .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
# torch first and pinned: 2.13.0 resolves to the CPU wheel shipped on this kind of
# machine; an open spec (or a dependency pulling torch) would download a CUDA build.
"$PY" -m pip install -q --disable-pip-version-check torch==2.13.0
"$PY" -m pip install -q --disable-pip-version-check -e '.[test,h5,arrow,dev,mujoco,box2d,marl,ray,atari,dm-control,envpool,wandb,mlflow,slurm]'
