#!/usr/bin/env bash
# Type-check planlang/ with mypy (settings: pyproject.toml [tool.mypy]); ./scripts/test.sh (CI) runs it
# before pytest and fails on any error.
# Installs nothing: ./scripts/install.sh puts mypy in .venv (the dev extra).
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m mypy --config-file pyproject.toml "$@"
