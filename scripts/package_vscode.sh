#!/usr/bin/env bash
# Package the VS Code extension (editors/vscode) as a .vsix with @vscode/vsce (pinned in
# editors/vscode/package-lock.json as a devDependency; ./scripts/install_editors.sh installs it, and this
# script runs it first when it is missing).
#   ./scripts/package_vscode.sh                 -> dist/planlang-<version>.vsix
#   ./scripts/package_vscode.sh PATH.vsix       -> that file
# Install the result with `code --install-extension dist/planlang-<version>.vsix`. The .vsix holds the
# extension, its grammar and configuration, and vscode-languageclient with its dependencies; the dev tooling
# and the grammar tests stay out (editors/vscode/.vscodeignore). Prints the path of the .vsix; vsce's log
# only on failure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ext=$root/editors/vscode
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "package_vscode.sh: needs node and npm" >&2
    exit 2
fi
if [ ! -x "$ext/node_modules/.bin/vsce" ]; then
    "$root/scripts/install_editors.sh"
fi
version=$(node -p "require(process.argv[1]).version" "$ext/package.json")
out=${1:-$root/dist/planlang-$version.vsix}
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# vsce asks before packaging without a repository or LICENSE; both are there, and stdin is closed so it
# can never wait for an answer
if ! (cd "$ext" && ./node_modules/.bin/vsce package --out "$out" </dev/null >"$log" 2>&1); then
    cat "$log" >&2
    echo "package_vscode.sh: vsce package failed (log above)" >&2
    exit 1
fi
echo "$out"
