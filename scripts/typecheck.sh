#!/usr/bin/env bash
# Type-check planlang/ with mypy (settings: pyproject.toml [tool.mypy]); CI runs it after the tests.
# Installs nothing: ./scripts/install.sh puts mypy in .venv (the dev extra).
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m mypy --config-file pyproject.toml "$@"
