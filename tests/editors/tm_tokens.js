'use strict';
// Tokenise plan texts with the extension's TextMate grammar, the way VS Code does (vscode-textmate +
// vscode-oniguruma, both installed with vscode-tmgrammar-test in editors/vscode/node_modules).
// stdin: {"name": "text", ...}; stdout: {"name": [[line (1-based), start, end, "scope scope ..."], ...]}.
const fs = require('fs');
const path = require('path');

const vscodeDir = path.resolve(__dirname, '..', '..', 'editors', 'vscode');
const need = (mod) => require(require.resolve(mod, { paths: [vscodeDir] }));
const vsctm = need('vscode-textmate');
const oniguruma = need('vscode-oniguruma');

async function main() {
    const wasm = fs.readFileSync(require.resolve('vscode-oniguruma/release/onig.wasm', { paths: [vscodeDir] }));
    await oniguruma.loadWASM(wasm.buffer.slice(wasm.byteOffset, wasm.byteOffset + wasm.byteLength));
    const registry = new vsctm.Registry({
        onigLib: Promise.resolve({
            createOnigScanner: (patterns) => new oniguruma.OnigScanner(patterns),
            createOnigString: (s) => new oniguruma.OnigString(s),
        }),
        loadGrammar: async () => {
            const file = path.join(vscodeDir, 'syntaxes', 'plan.tmLanguage.json');
            return vsctm.parseRawGrammar(fs.readFileSync(file, 'utf8'), file);
        },
    });
    const grammar = await registry.loadGrammar('source.plan');
    const texts = JSON.parse(fs.readFileSync(0, 'utf8'));
    const out = {};
    for (const [name, text] of Object.entries(texts)) {
        let stack = vsctm.INITIAL;
        const tokens = [];
        text.split('\n').forEach((line, i) => {
            const r = grammar.tokenizeLine(line, stack);
            stack = r.ruleStack;
            for (const t of r.tokens) tokens.push([i + 1, t.startIndex, Math.min(t.endIndex, line.length), t.scopes.join(' ')]);
        });
        out[name] = tokens;
    }
    process.stdout.write(JSON.stringify(out));
}

main().catch((err) => { console.error(err); process.exit(1); });
