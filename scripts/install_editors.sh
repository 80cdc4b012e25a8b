#!/usr/bin/env bash
# Install the editor tooling that tests/editors and scripts/package_vscode.sh use, each from a pinned file:
#   * the tree-sitter Python bindings (tests/editors/requirements-tree-sitter.txt, hash-checked) into
#     build/editors/python, with .venv's python (PLANLANG_PYTHON overrides; skipped when it is missing).
#     They load the committed parser of editors/tree-sitter-planlang for its tests: no tree-sitter CLI.
#   * the npm packages of the VS Code extension (editors/vscode/package-lock.json): vscode-tmgrammar-test
#     (the TextMate grammar tests), @vscode/vsce (packaging) and vscode-languageclient (the extension's).
#     Skipped without node and npm (the tests that need them then skip, except under CI=true).
# Each step runs only when its pinned file changed since it last ran (a stamp records the file's hash).
# Quiet on success; prints the tool's log on failure. ./scripts/install.sh calls this.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# the stamp's content is the sha256 of the pinned file the step installed from
current() { [ -f "$1" ] && [ "$(cat "$1")" = "$(sha256sum "$2" | cut -d' ' -f1)" ]; }

# ---------------------------------------------------------------- tree-sitter Python bindings
py=${PLANLANG_PYTHON:-$root/.venv/bin/python}
req=$root/tests/editors/requirements-tree-sitter.txt
target=$root/build/editors/python
if [ -x "$py" ] && ! current "$target/.planlang-requirements.sha256" "$req"; then
    rm -rf "$target"
    if ! "$py" -m pip install --disable-pip-version-check --no-deps --require-hashes \
            --target "$target" -r "$req" >"$log" 2>&1; then
        cat "$log" >&2
        echo "install_editors.sh: installing the tree-sitter bindings failed (log above)" >&2
        exit 1
    fi
    sha256sum "$req" | cut -d' ' -f1 >"$target/.planlang-requirements.sha256"
fi

# ---------------------------------------------------------------- npm packages of editors/vscode
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    exit 0
fi
cd "$root/editors/vscode"
stamp=node_modules/.planlang-lock.sha256
if [ -x node_modules/.bin/vscode-tmgrammar-test ] && [ -x node_modules/.bin/vsce ] && current "$stamp" package-lock.json; then
    exit 0
fi
if ! npm ci --no-audit --no-fund --loglevel=error >"$log" 2>&1; then
    cat "$log" >&2
    echo "install_editors.sh: npm ci failed in editors/vscode (log above)" >&2
    exit 1
fi
sha256sum package-lock.json | cut -d' ' -f1 >"$stamp"
