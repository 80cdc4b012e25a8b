#!/usr/bin/env node
// `npm test`: the corpus tests (test/corpus/*.txt) of the committed parser.
//
// With the tree-sitter CLI installed (the devDependency tree-sitter-cli, whose install script downloads the
// binary from GitHub's releases when `npm ci` runs), `tree-sitter test`. Where that download cannot happen
// (only package registries reachable, as on this project's CI: `npm ci --ignore-scripts` installs the
// package without its binary), the same corpus through scripts/ts.py and the tree-sitter Python bindings,
// and it says so on stderr. Neither there: a message saying how to get one, exit 1.
"use strict";

const fs = require("fs");
const path = require("path");
const { spawnSync } = require("child_process");

const grammarDir = path.resolve(__dirname, "..");
const root = path.resolve(grammarDir, "..", "..");
const extraArgs = process.argv.slice(2);

function run(cmd, args) {
  const res = spawnSync(cmd, args, { cwd: grammarDir, stdio: "inherit" });
  if (res.error) {
    console.error(`npm test: could not run ${cmd}: ${res.error.message}`);
    return 1;
  }
  return res.status === null ? 1 : res.status;
}

// the binary install.js writes next to cli.js (tree-sitter.exe on Windows)
const cliDir = path.join(grammarDir, "node_modules", "tree-sitter-cli");
const binary = path.join(cliDir, process.platform === "win32" ? "tree-sitter.exe" : "tree-sitter");
if (fs.existsSync(binary)) {
  process.exit(run(binary, ["test", ...extraArgs]));
}

const python = [process.env.PLANLANG_PYTHON, path.join(root, ".venv", "bin", "python"), "python3"]
  .find((p) => p && (p === "python3" || fs.existsSync(p)));
const bindings = path.join(root, "build", "editors", "python");
const probe = spawnSync(python, ["-c", "import sys; sys.path.append(sys.argv[1]); import tree_sitter", bindings],
  { stdio: "ignore" });
if (probe.error || probe.status !== 0) {
  console.error(
    "npm test: no way to run the corpus tests: the tree-sitter CLI's binary is not installed " +
    `(${path.relative(grammarDir, binary)}; \`npm ci\` downloads it from GitHub's releases), and the tree-sitter ` +
    `Python bindings do not import with ${python} (../../scripts/install_editors.sh installs them).`);
  process.exit(1);
}
const why = fs.existsSync(cliDir)
  ? "tree-sitter-cli is installed without its binary (its install script was skipped or could not download it)"
  : "tree-sitter-cli is not installed";
console.error(`npm test: ${why}; running the corpus with scripts/ts.py and the tree-sitter Python bindings instead`);
process.exit(run(python, [path.join("scripts", "ts.py"), "test", ...extraArgs]));
