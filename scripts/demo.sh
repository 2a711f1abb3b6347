#!/usr/bin/env bash
# The main job: set up .venv, then train PPO on CartPole-v1 with the `steersman` command.
# Shows a progress bar; writes a run directory under runs/ (config, metrics.csv,
# TensorBoard events, plots/learning_curve.png, checkpoints, export/policy.pt2) and
# prints where everything went. Extra arguments are passed on, e.g.
#   bash scripts/demo.sh total_frames=50000 seed=1
#   bash scripts/demo.sh sac            # SAC on Pendulum-v1
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ $# -eq 0 ] || [[ "$1" == *=* ]]; then
    set -- ppo "$@"
fi
exec .venv/bin/python -m steersman train "$@"
