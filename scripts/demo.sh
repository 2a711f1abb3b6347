#!/usr/bin/env bash
# The main job for now: set up .venv and run the container tour.
# (Once the trainer lands, this becomes `steersman train`.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python examples/tensordict_tour.py "$@"
