#!/usr/bin/env bash
# What a user of the released package gets, tested outside the checkout (CI runs it from test.sh):
#  1. the wheel is built (package data: grammar, stdlib);
#  2. the language job: a fresh venv with the torch-free install (requirements/lock-lang.txt + the
#     wheel) runs check, lint, fmt (files and stdin), explain and the language tests, and refuses
#     `estimate` with a message naming the torch extra;
#  3. the full job: a fresh venv with everything (requirements/lock.txt + the wheel) runs check, lint,
#     fmt, explain, solve and check --model on a copy of the examples, in a folder outside the checkout.
# Usage: scripts/test_package.sh [WORKDIR]  (default: a temporary folder, removed afterwards)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
if [ $# -gt 0 ]; then work=$1; mkdir -p "$work"; else work=$(mktemp -d); trap 'rm -rf "$work"' EXIT; fi
say() { echo "test_package: $*" >&2; }
quiet() {  # run quietly; print the log and fail when the command fails
    local log="$work/cmd.log"
    if ! "$@" >"$log" 2>&1; then cat "$log" >&2; say "failed: $*"; exit 1; fi
}
expect() {  # expect CODE CMD...: the command exits CODE
    local want=$1; shift
    set +e; "$@" >"$work/out.txt" 2>"$work/err.txt"; local got=$?; set -e
    if [ "$got" != "$want" ]; then
        cat "$work/out.txt" "$work/err.txt" >&2; say "expected exit $want, got $got: $*"; exit 1
    fi
}
pip_install() { "$1/bin/python" -m pip install --disable-pip-version-check "${@:2}"; }

say "building the wheel"
rm -rf "$work/dist" "$repo"/build/lib "$repo"/build/bdist.*  # no stale module from an earlier build
quiet "$repo/.venv/bin/python" -m pip wheel --no-deps --no-build-isolation -w "$work/dist" "$repo"
wheel=$(ls "$work"/dist/planlang-*.whl)
"$PY" - "$wheel" <<'PYEOF'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = ["planlang/grammar/planlang.lark", "planlang/stdlib/hardware.plan", "planlang/stdlib/meshes.plan",
        "planlang/stdlib/patterns/megatron.plan", "planlang/cli/__init__.py", "planlang/cli/__main__.py",
        "planlang/model/capture/load.py", "planlang/lang/config.py"]
missing = [n for n in need if n not in names]
sys.exit(f"test_package: not in the wheel: {missing}" if missing else 0)
PYEOF

# plans to work on, outside the checkout
plans="$work/project"
rm -rf "$plans"; mkdir -p "$plans"
cp -r "$repo/examples" "$plans/examples"
find "$plans" -name node_modules -prune -o -name __pycache__ -prune -exec rm -rf {} +
printf 'device gpu { memory = 80 GiB }\nmesh m of 8 x gpu {\n    dp = 2\n}\n' > "$plans/broken.plan"
cd "$plans"

say "language job: torch-free venv"
rm -rf "$work/lang"
"$PY" -m venv "$work/lang"
quiet pip_install "$work/lang" --require-hashes -r "$repo/requirements/lock-lang.txt"
quiet pip_install "$work/lang" --no-deps "$wheel"
L="$work/lang/bin"
expect 0 "$L/python" -c "import planlang, planlang.cli, planlang.lsp.server, sys; assert 'torch' not in sys.modules"
expect 1 "$L/python" -c "import torch"  # really absent
expect 0 "$L/planlang" check examples/mlp/mlp_2d.plan
expect 0 "$L/planlang" lint examples/mlp
expect 1 "$L/planlang" lint broken.plan
grep -q "broken.plan:2:1: error\[PL301\]" "$work/out.txt"
expect 0 "$L/planlang" fmt --check examples
expect 0 "$L/planlang" explain PL305
expect 0 sh -c "'$L/planlang' fmt - < examples/mlp/mlp_2d.plan | cmp - examples/mlp/mlp_2d.plan"
expect 1 sh -c "'$L/planlang' lint - --stdin-filename x.plan < broken.plan"
grep -q "^x.plan:2:1: error\[PL301\]" "$work/out.txt"
expect 2 "$L/planlang" estimate examples/mlp/mlp_2d.plan
grep -q "pip install 'planlang\[torch\]'" "$work/err.txt"
say "language job: tests without torch"
(cd "$repo" && "$L/python" -m pytest -q -p no:cacheprovider tests/lang tests/plan tests/test_cli_conventions.py \
    tests/test_diagnostics_doc.py >"$work/lang-tests.txt" 2>&1) || { cat "$work/lang-tests.txt" >&2; exit 1; }
tail -n 1 "$work/lang-tests.txt" >&2

say "full job: venv with every extra"
rm -rf "$work/full"
"$PY" -m venv "$work/full"
quiet pip_install "$work/full" --require-hashes -r "$repo/requirements/lock.txt"
quiet pip_install "$work/full" --no-deps "$wheel"
F="$work/full/bin"
expect 0 "$F/python" -c "import planlang, pathlib; assert 'site-packages' in pathlib.Path(planlang.__file__).parts"
expect 0 "$F/planlang" check examples/mlp/mlp_2d.plan
expect 0 "$F/planlang" lint examples
expect 0 "$F/planlang" check --model examples/gpt2/gpt2_3d.plan  # the README's 3-D plan, pp x dp x tp
expect 0 "$F/planlang" fmt --check examples
expect 0 "$F/planlang" explain PL501
expect 0 "$F/planlang" solve examples/partial/gpt2_cpu_partial.plan -o solved.plan --time-limit 300
expect 0 "$F/planlang" check --model solved.plan
expect 0 "$F/python" -c "import planlang; assert callable(planlang.apply)"
say "ok: wheel $(basename "$wheel"), language job and full job passed outside the checkout"
