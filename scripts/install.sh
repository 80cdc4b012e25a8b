#!/usr/bin/env bash
# Create .venv (if absent) and install planlang with its dev extra, CPU torch pinned by constraints.txt.
# Quiet on success; prints pip's log on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! .venv/bin/python -m pip install --disable-pip-version-check -c constraints.txt -e '.[dev,hf]' >"$log" 2>&1; then
    cat "$log" >&2
    echo "install.sh: pip install failed (log above)" >&2
    exit 1
fi
# editor tooling for the TextMate grammar tests (npm; skipped when node is absent)
if [ -x scripts/install_editors.sh ]; then ./scripts/install_editors.sh; fi
