#!/usr/bin/env bash
# Install (idempotent) and run the whole test suite. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
exec .venv/bin/python -m pytest -q "$@"
