#!/usr/bin/env bash
# Install (idempotent) and run the whole test suite. `.ci/run` calls exactly this.
# With no arguments (CI): first the package test (the wheel outside the checkout, a torch-free
# language job and a full job: scripts/test_package.sh), then the type checker over planlang/ (mypy,
# 0 errors: scripts/typecheck.sh), then pytest over tests/. Arguments go to
# pytest alone (e.g. ./scripts/test.sh tests/lang -x); PLANLANG_PACKAGE_TEST=0 skips the package test.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
if [ $# -eq 0 ] && [ "${PLANLANG_PACKAGE_TEST:-1}" != 0 ]; then
    ./scripts/test_package.sh
fi
if [ $# -eq 0 ]; then
    ./scripts/typecheck.sh
fi
exec .venv/bin/python -m pytest -q "$@"
