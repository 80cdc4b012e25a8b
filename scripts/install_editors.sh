#!/usr/bin/env bash
# Install the npm packages of the VS Code extension (editors/vscode): vscode-tmgrammar-test, which runs
# the TextMate grammar tests (tests/editors), and vscode-languageclient, which the extension uses.
# Runs `npm ci` only when node_modules is missing or was installed from another package-lock.json.
# Without node and npm it does nothing (the grammar tests then skip, except under CI=true).
# Quiet on success; prints npm's log on failure.
set -euo pipefail
cd "$(dirname "$0")/../editors/vscode"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    exit 0
fi
stamp=node_modules/.planlang-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ -x node_modules/.bin/vscode-tmgrammar-test ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! npm ci --no-audit --no-fund --loglevel=error >"$log" 2>&1; then
    cat "$log" >&2
    echo "install_editors.sh: npm ci failed in editors/vscode (log above)" >&2
    exit 1
fi
echo "$want" >"$stamp"
