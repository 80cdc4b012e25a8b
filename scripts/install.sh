#!/usr/bin/env bash
# Create .venv (if absent) and install planlang with its dev extra, CPU torch pinned by constraints.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install --quiet -c constraints.txt -e '.[dev]'
