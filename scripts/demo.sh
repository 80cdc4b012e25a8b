#!/usr/bin/env bash
# The main job on the bundled defaults: check every example and stdlib plan, and verify they are
# formatted. (Once `planlang solve` and the runtime land this becomes solve -> check -> train -> verify.)
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
echo "== planlang check examples stdlib"
.venv/bin/planlang check examples stdlib
echo "== planlang fmt --check examples stdlib"
.venv/bin/planlang fmt --check examples stdlib
echo "== planlang check examples/gpt2/gpt2_3d.plan (human output)"
.venv/bin/planlang check --no-color examples/gpt2/gpt2_3d.plan
