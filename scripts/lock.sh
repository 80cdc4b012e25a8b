#!/usr/bin/env bash
# Refresh requirements/lock.txt and lock-lang.txt: every direct and transitive dependency of planlang with all its extras,
# and what building planlang needs, pinned with sha256 hashes (pip-tools' pip-compile, itself pinned).
# pyproject.toml keeps honest lower bounds; the lock is what the README's install and CI use.
#   ./scripts/lock.sh            re-resolve within pyproject.toml and requirements/lock-constraints.txt
#   ./scripts/lock.sh --upgrade  also move every pin to the newest release allowed (pip-compile -U)
# Then run ./scripts/test.sh on the new pins; tests/test_lock.py checks they agree with pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
tool=$(mktemp -d)
trap 'rm -rf "$tool"' EXIT
"$PY" -m venv "$tool/venv"
"$tool/venv/bin/python" -m pip install --disable-pip-version-check -q pip-tools==7.6.2 >"$tool/pip.log" 2>&1 \
    || { cat "$tool/pip.log" >&2; echo "lock.sh: installing pip-tools failed" >&2; exit 1; }
# Two locks from one resolution's inputs: lock.txt (everything: the README's install and CI) and
# lock-lang.txt (the torch-free language install plus the test tools: CI's language job).
compile() {
    # CUSTOM_COMPILE_COMMAND: the header names this script, not the pip-compile line.
    CUSTOM_COMPILE_COMMAND="./scripts/lock.sh" "$tool/venv/bin/pip-compile" --quiet \
        --generate-hashes --allow-unsafe --strip-extras --all-build-deps \
        --no-emit-index-url --no-emit-find-links \
        -c requirements/lock-constraints.txt "$@" pyproject.toml
}
compile --extra torch --extra hf --extra dev -o requirements/lock.txt "$@"
# the language lock may not pick versions the full lock does not have
compile --extra dev -c requirements/lock.txt -o requirements/lock-lang.txt
for f in requirements/lock.txt requirements/lock-lang.txt; do
    echo "lock.sh: wrote $f ($(grep -c '==' "$f") pins)" >&2
done
