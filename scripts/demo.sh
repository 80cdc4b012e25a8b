#!/usr/bin/env bash
# The main job on the bundled defaults: check every example and stdlib plan, verify they are formatted,
# check the examples against their models on the meta device, estimate and inspect.
# (Once `planlang solve` and the runtime land this becomes solve -> check -> train -> verify.)
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
echo "== planlang check examples stdlib"
.venv/bin/planlang check examples stdlib
echo "== planlang fmt --check examples stdlib"
.venv/bin/planlang fmt --check examples stdlib
echo "== planlang check --model examples (model-aware: paths, shapes, stages, memory vs budget)"
.venv/bin/planlang check --model examples
echo "== planlang estimate examples/gpt2/gpt2_3d.plan"
.venv/bin/planlang estimate examples/gpt2/gpt2_3d.plan
echo "== planlang inspect examples/mlp/mlp_2d.plan"
.venv/bin/planlang inspect examples/mlp/mlp_2d.plan
