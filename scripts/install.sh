#!/usr/bin/env bash
# Create .venv (if absent) and install planlang with its dev and hf extras from requirements/lock.txt:
# every dependency pinned with hashes (refresh: ./scripts/lock.sh), then planlang itself, editable.
# Quiet on success; prints pip's log on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
log=$(mktemp)
trap 'rm -f "$log"' EXIT
pip=(.venv/bin/python -m pip install --disable-pip-version-check)
# The pinned set first (hash-checked; it includes setuptools and wheel, so building planlang needs no
# unpinned download), then planlang on top of it with nothing more resolved.
if ! { "${pip[@]}" --require-hashes -r requirements/lock.txt \
       && "${pip[@]}" --no-deps --no-build-isolation -e .; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "install.sh: pip install failed (log above)" >&2
    exit 1
fi
# editor tooling for the TextMate grammar tests (npm; skipped when node is absent)
if [ -x scripts/install_editors.sh ]; then ./scripts/install_editors.sh; fi
