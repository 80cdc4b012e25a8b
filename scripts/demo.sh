#!/usr/bin/env bash
# The main job on the bundled default: solve the partial plan of a small GPT-2 on 4 CPU processes,
# check the solved plan against its model, print rank 1's generated program, then train 3 steps under it
# on 4 gloo processes next to a single-process run from the same seed (`planlang verify`).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
out=${PLANLANG_DEMO_OUT:-build/demo}
mkdir -p "$out"
echo "== planlang solve examples/partial/gpt2_cpu_partial.plan -o $out/gpt2_cpu.plan"
.venv/bin/planlang solve examples/partial/gpt2_cpu_partial.plan -o "$out/gpt2_cpu.plan"
cat "$out/gpt2_cpu.plan"
echo "== planlang check --model $out/gpt2_cpu.plan"
.venv/bin/planlang check --model "$out/gpt2_cpu.plan"
echo "== planlang estimate $out/gpt2_cpu.plan"
.venv/bin/planlang estimate "$out/gpt2_cpu.plan"
echo "== planlang lower $out/gpt2_cpu.plan --rank 1 (first 25 lines)"
.venv/bin/planlang lower "$out/gpt2_cpu.plan" --rank 1 | head -25
echo "== planlang verify $out/gpt2_cpu.plan (3 training steps on 4 CPU processes vs one process)"
.venv/bin/planlang verify "$out/gpt2_cpu.plan" --steps 3 2> "$out/verify.log" || { cat "$out/verify.log" >&2; exit 1; }
echo "== planlang check examples stdlib; fmt --check"
.venv/bin/planlang check examples stdlib
.venv/bin/planlang fmt --check examples stdlib
