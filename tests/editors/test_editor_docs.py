"""The editor snippets of docs/editors.md and docs/lsp.md against the files they configure: mode, filetype
and grammar names, paths, settings, commands and pinned versions. (docs/lsp.md once told Emacs users to
use a `plan-mode` that does not exist.)"""
from __future__ import annotations

import json
import re
import tomllib

import pytest

from .grammar_facts import ROOT, VSCODE_DIR

DOCS = [ROOT / "docs" / "editors.md", ROOT / "docs" / "lsp.md"]
FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
ELISP = (ROOT / "editors" / "emacs" / "planlang-mode.el").read_text()
PACKAGE = json.loads((VSCODE_DIR / "package.json").read_text())
HELIX = tomllib.loads((ROOT / "editors" / "helix" / "languages.toml").read_text())


def blocks(lang: str) -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in FENCE.finditer(text):
            if m.group("info").strip() == lang:
                out.append((f"{doc.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}", m.group("body")))
    return out


def _elisp_definitions() -> set[str]:
    defined = set(re.findall(r"\((?:defun|defcustom|defvar|defconst|defgroup|define-derived-mode|defvar-local)\s+([^\s()]+)", ELISP))
    defined |= {f"{mode}-hook" for mode in re.findall(r"\(define-derived-mode\s+(\S+)", ELISP)}
    return defined


def test_elisp_snippets_name_the_real_mode_and_paths():
    snippets = blocks("elisp")
    assert len(snippets) >= 2
    provided = set(re.findall(r"\(provide '([^\s)]+)\)", ELISP))
    for where, body in snippets:
        assert "plan-mode" not in re.sub(r"planlang-mode", "", body), where
        for feature in re.findall(r"\(require '([^\s)]+)\)", body):
            assert feature in provided, (where, feature)
        for symbol in re.findall(r"(?<![\w-])(planlang-[\w-]+)", body):
            assert symbol in _elisp_definitions(), (where, symbol)
        for folder in re.findall(r'"/path/to/planlang/([^"]+)"', body):
            assert (ROOT / folder / "planlang-mode.el").is_file(), (where, folder)
        for mode, cmd in re.findall(r"'\((\S+-mode) (\"[^)]*\")\)", body):
            assert f"'({mode} {cmd})" in ELISP, (where, mode, cmd)


def test_lua_snippets_name_the_real_filetype_grammar_and_paths():
    ftdetect = (ROOT / "editors" / "vim" / "ftdetect" / "plan.vim").read_text()
    filetype = re.search(r"setfiletype (\w+)", ftdetect).group(1)
    grammar = json.loads((ROOT / "editors" / "tree-sitter-planlang" / "tree-sitter.json").read_text())["grammars"][0]
    snippets = blocks("lua")
    assert len(snippets) >= 3
    for where, body in snippets:
        for ft in re.findall(r'"FileType", \{ pattern = "(\w+)"', body) \
                + re.findall(r'extension = \{ plan = "(\w+)" \}', body) \
                + re.findall(r'filetype = "(\w+)"', body):
            assert ft == filetype, where
        for lang, ft in re.findall(r'language\.register\("(\w+)", "(\w+)"\)', body):
            assert (lang, ft) == (grammar["name"], filetype), where
        for name in re.findall(r'parsers?(?:"\)|\(\))?\.(\w+) = \{', body) + re.findall(r"parser_config\.(\w+) =", body):
            assert name == grammar["name"], where
        for key, rel in re.findall(r'(location|queries) = "([^"]+)"', body):
            assert (ROOT / rel).is_dir(), (where, rel)
            if key == "queries":
                assert (ROOT / rel / "highlights.scm").is_file(), where
        for location in re.findall(r'location = "([^"]+)"', body):
            for rel in re.findall(r'files = \{ "([^"]+)" \}', body):
                assert (ROOT / location / rel).is_file(), (where, rel)
        for cmd in re.findall(r"cmd = \{ ([^}]*) \}", body):
            assert cmd.strip() == '"planlang", "lsp"', where


def test_vim_snippets():
    snippets = blocks("vim")
    assert snippets
    for where, body in snippets:
        for folder in re.findall(r"runtimepath\+=/path/to/planlang/(\S+)", body):
            assert (ROOT / folder / "ftdetect" / "plan.vim").is_file(), where
        for allow in re.findall(r"'allowlist': \[([^\]]*)\]", body):
            assert allow == "'plan'", where


def test_toml_snippets_are_the_helix_configuration():
    snippets = blocks("toml")
    assert snippets
    (language,) = HELIX["language"]
    for where, body in snippets:
        config = tomllib.loads(body)
        for entry in config.get("language", []):
            assert {k: v for k, v in language.items() if k in entry} == entry, where
        for name, server in config.get("language-server", {}).items():
            assert HELIX["language-server"][name] == server, where


def test_json_snippets_are_extension_settings():
    settings = PACKAGE["contributes"]["configuration"]["properties"]
    snippets = blocks("json")
    assert snippets
    for where, body in snippets:
        for key in json.loads(body):
            assert key in settings, (where, key)


def _path_mentions(text: str) -> set[str]:
    found = set()
    for m in re.finditer(r"(?<![\w/.~-])(?:\./)?((?:scripts|editors|tests/editors)/[\w./+-]*[\w/])", text):
        if "*" not in m.group(1) and "<" not in m.group(1):
            found.add(m.group(1))
    return found


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_paths_in_the_docs_exist(doc):
    """Every `scripts/...`, `editors/...` and `tests/editors/...` path the page names, in code or in text
    (the table of the grammar's folder names its files relative to it)."""
    text = doc.read_text()
    grammar_dir = ROOT / "editors" / "tree-sitter-planlang"
    missing = sorted(p for p in _path_mentions(text) if not (ROOT / p).exists() and not (grammar_dir / p).exists())
    assert missing == []
    for script in re.findall(r"\./scripts/([\w.-]+\.sh)", text):
        assert (ROOT / "scripts" / script).stat().st_mode & 0o111, script


def test_pinned_versions_in_the_docs_are_the_pins():
    text = (ROOT / "docs" / "editors.md").read_text()
    requirements = (ROOT / "tests" / "editors" / "requirements-tree-sitter.txt").read_text()
    pins = {
        "@vscode/vsce": PACKAGE["devDependencies"]["@vscode/vsce"],
        "vscode-tmgrammar-test": PACKAGE["devDependencies"]["vscode-tmgrammar-test"],
        "tree-sitter": re.search(r"^tree-sitter==(\S+)", requirements, re.M).group(1),
    }
    assert f"`@vscode/vsce`\n{pins['@vscode/vsce']}" in text or f"`@vscode/vsce` {pins['@vscode/vsce']}" in text \
        or f"pinned ({pins['@vscode/vsce']})" in text
    assert f"`vscode-tmgrammar-test` {pins['vscode-tmgrammar-test']}" in text
    assert f"bindings](https://pypi.org/project/tree-sitter/) ({pins['tree-sitter']}" in text
    assert f"dist/planlang-{PACKAGE['version']}.vsix" in text
