#!/usr/bin/env bash
# Build the VS Code extension (editors/vscode) as a release would, from its lock: `npm ci`, the extension's
# own tests (`npm test`: the TextMate grammar against tests/*.plan), then `vsce package` (scripts/package_vscode.sh)
# into dist/, and check the result: a zip whose manifest and package.json name planlang at the version of
# planlang/lang/version.py. `.ci/run` calls it after ./scripts/test.sh.
#   ./scripts/build_vsix.sh            -> dist/planlang-<version>.vsix (its path on stdout)
#   ./scripts/build_vsix.sh DIR        -> DIR/planlang-<version>.vsix
# Needs node and npm (exit 2 with a message without them). Progress on stderr; each tool's log only on failure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ext=$root/editors/vscode
say() { echo "build_vsix: $*" >&2; }
missing=()
for tool in node npm; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
    say "needs node and npm to build the VS Code extension; not found on PATH: ${missing[*]}"
    exit 2
fi
PY=${PYTHON:-python3}
[ -x "$root/.venv/bin/python" ] && PY=$root/.venv/bin/python
version=$("$PY" -c 'import ast, sys; t = ast.parse(open(sys.argv[1]).read())
print(next(n.value.value for n in t.body if isinstance(n, ast.Assign) and n.targets[0].id == "__version__"))' \
    "$root/planlang/lang/version.py")
ext_version=$(node -p 'require(process.argv[1]).version' "$ext/package.json")
if [ "$ext_version" != "$version" ]; then
    say "editors/vscode/package.json says version $ext_version, planlang/lang/version.py $version: make them agree"
    exit 1
fi
dist=${1:-$root/dist}
mkdir -p "$dist"
out=$(cd "$dist" && pwd)/planlang-$version.vsix
log=$(mktemp)
trap 'rm -f "$log"' EXIT
run() {  # run quietly in editors/vscode; print the log and fail when the command fails
    local what=$1; shift
    if ! (cd "$ext" && "$@" </dev/null >"$log" 2>&1); then
        cat "$log" >&2
        say "$what failed (log above)"
        exit 1
    fi
}
start=$SECONDS
say "npm ci (editors/vscode/package-lock.json)"
run "npm ci" npm ci --no-audit --no-fund --loglevel=error
# the same stamp scripts/install_editors.sh writes after its npm ci, so the next install does not redo it
sha256sum "$ext/package-lock.json" | cut -d' ' -f1 >"$ext/node_modules/.planlang-lock.sha256"
say "npm test (the TextMate grammar tests)"
run "npm test" npm test
tail -n 3 "$log" | sed 's/^/build_vsix:   /' >&2
say "vsce package"
rm -f "$out"
"$root/scripts/package_vscode.sh" "$out" >/dev/null
# the .vsix is a zip holding the VSIX manifest and the extension's package.json at this version
"$PY" - "$out" "$version" <<'PYEOF'
import json, sys, zipfile
path, version = sys.argv[1], sys.argv[2]
if not zipfile.is_zipfile(path):
    sys.exit(f"build_vsix: {path} is not a zip")
with zipfile.ZipFile(path) as z:
    bad = z.testzip()
    if bad is not None:
        sys.exit(f"build_vsix: {path}: {bad} is corrupt")
    names = set(z.namelist())
    need = {"extension.vsixmanifest", "[Content_Types].xml", "extension/package.json", "extension/extension.js",
            "extension/syntaxes/plan.tmLanguage.json", "extension/node_modules/vscode-languageclient/package.json"}
    if need - names:
        sys.exit(f"build_vsix: {path} lacks {sorted(need - names)}")
    manifest = z.read("extension.vsixmanifest").decode()
    package = json.loads(z.read("extension/package.json"))
if f'Version="{version}"' not in manifest or 'Id="planlang"' not in manifest:
    sys.exit(f"build_vsix: the manifest of {path} does not name planlang {version}")
if (package["name"], package["version"]) != ("planlang", version):
    sys.exit(f"build_vsix: {path} holds {package['name']} {package['version']}, not planlang {version}")
PYEOF
say "ok: $(basename "$out") ($(( $(stat -c %s "$out") / 1024 )) KiB) in $(( SECONDS - start )) s"
echo "$out"
