#!/usr/bin/env bash
# Build the docs site (README, architecture, tour, API pages from the docstrings) into
# build/site, offline. Needs the docs extra (`pip install -e '.[docs]'`, part of `dev`,
# which scripts/setup.sh installs). Open build/site/index.html.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
"$PY" docs/build.py "$@"
echo "docs: $(pwd)/build/site/index.html"
