"""The VS Code extension's TextMate grammar (editors/vscode/syntaxes/plan.tmLanguage.json): its syntax tests
(vscode-tmgrammar-test), and its tokens against the real parser and the checker's lists."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from planlang.lang.fmt import format_text
from planlang.plan import resolve, types
from planlang.plan.units import UNITS

from .grammar_facts import (
    GRAMMAR_TESTS_DIR, ROOT, VSCODE_DIR, grammar_keywords, keyword_positions, parseable_corpus, word_starts,
)

PACKAGE = json.loads((VSCODE_DIR / "package.json").read_text())
TM_GRAMMAR = json.loads((VSCODE_DIR / "syntaxes" / "plan.tmLanguage.json").read_text())
LANGUAGE_CONFIG = json.loads((VSCODE_DIR / "language-configuration.json").read_text())


def tokenize(texts: dict[str, str]) -> dict[str, list[tuple[int, int, int, str]]]:
    """name -> [(line, start, end, scopes)] from vscode-textmate, as VS Code tokenises."""
    proc = subprocess.run(["node", str(ROOT / "tests" / "editors" / "tm_tokens.js")], input=json.dumps(texts),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return {k: [tuple(t) for t in v] for k, v in json.loads(proc.stdout).items()}


def _is_keyword_scope(scopes: str) -> bool:
    names = scopes.split()
    return not any(n.startswith("comment.") for n in names) and any(
        n.startswith("keyword.") and not n.startswith(("keyword.operator.", "keyword.other.unit"))
        for n in names)


# ------------------------------------------------------------------ the extension's manifest


def test_package_contributes_language_grammar_and_settings():
    contributes = PACKAGE["contributes"]
    (language,) = contributes["languages"]
    assert language["id"] == "plan" and language["extensions"] == [".plan"]
    assert (VSCODE_DIR / language["configuration"]).is_file()
    (grammar,) = contributes["grammars"]
    assert grammar["language"] == "plan" and grammar["scopeName"] == "source.plan"
    assert (VSCODE_DIR / grammar["path"]).resolve() == (VSCODE_DIR / "syntaxes" / "plan.tmLanguage.json")
    assert TM_GRAMMAR["scopeName"] == "source.plan"
    settings = contributes["configuration"]["properties"]
    assert settings["planlang.path"]["type"] == "string" and settings["planlang.path"]["default"] == "planlang"
    assert settings["planlang.modelChecks"]["type"] == "boolean"
    assert (VSCODE_DIR / PACKAGE["main"]).is_file()
    assert PACKAGE["devDependencies"]["vscode-tmgrammar-test"] == "0.1.3"
    lock = json.loads((VSCODE_DIR / "package-lock.json").read_text())
    assert lock["packages"]["node_modules/vscode-tmgrammar-test"]["version"] == "0.1.3"
    assert "node_modules/" in (VSCODE_DIR / ".gitignore").read_text().split()


def test_language_configuration_comments_and_brackets():
    assert LANGUAGE_CONFIG["comments"] == {"lineComment": "#"}
    assert sorted(map(tuple, LANGUAGE_CONFIG["brackets"])) == [("(", ")"), ("[", "]"), ("{", "}")]
    opens = {p["open"] for p in LANGUAGE_CONFIG["autoClosingPairs"]}
    assert opens == {"{", "[", "(", '"'}


def test_indentation_rules_reproduce_the_formatter():
    """VS Code indents a new line one level deeper after a line matching increaseIndentPattern and one
    level back on a line matching decreaseIndentPattern; applied line by line to every corpus plan in
    `planlang fmt` layout, that must give the formatter's indentation."""
    increase = re.compile(LANGUAGE_CONFIG["indentationRules"]["increaseIndentPattern"])
    decrease = re.compile(LANGUAGE_CONFIG["indentationRules"]["decreaseIndentPattern"])
    checked = 0
    for name, text in parseable_corpus():
        prev = None
        for lineno, line in enumerate(format_text(text, name).split("\n"), start=1):
            if not line.strip():
                continue
            if prev is not None:
                want = len(prev) - len(prev.lstrip()) + (4 if increase.search(prev) else 0)
                if decrease.search(line):
                    want -= 4
                assert len(line) - len(line.lstrip()) == max(want, 0), f"{name}:{lineno}: {line!r}"
                checked += 1
            prev = line
    assert checked > 1000


# ------------------------------------------------------------------ the syntax tests


def test_grammar_syntax_tests_pass(node_modules):
    """editors/vscode/tests/*.plan: `# ^^^ scope` assertions, run by vscode-tmgrammar-test."""
    files = sorted(GRAMMAR_TESTS_DIR.glob("*.plan"))
    assert len(files) >= 6
    proc = subprocess.run([str(node_modules / ".bin" / "vscode-tmgrammar-test"), "--compact", "tests/*.plan"],
                          cwd=VSCODE_DIR, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for f in files:  # every file ran (a glob that matched nothing would also exit 0)
        assert f"tests/{f.name}" in proc.stdout, proc.stdout


def _assertions(path):
    """(word, scope, negative) for each `^` assertion of a grammar test file."""
    out, source = [], None
    for line in path.read_text().split("\n"):
        m = re.match(r"#(\s*)(\^+)\s+(-\s+)?(\S+)", line)
        n = re.match(r"#\s*<(-+)\s+(-\s+)?(\S+)", line)
        if m:
            col = 1 + len(m.group(1))
            out.append((source[col:col + len(m.group(2))], m.group(4), bool(m.group(3))))
        elif n:
            out.append((source[:len(n.group(1))], n.group(3), bool(n.group(2))))
        else:
            source = line
    return out


def test_grammar_tests_cover_every_keyword_as_keyword_and_as_name():
    """Each grammar keyword is asserted to be a keyword somewhere, and (soft keywords) asserted NOT to be
    a keyword somewhere it is a name."""
    positive, negative = set(), set()
    for path in GRAMMAR_TESTS_DIR.glob("*.plan"):
        for word, scope, neg in _assertions(path):
            if scope.startswith("keyword") and not scope.startswith(("keyword.operator", "keyword.other.unit")):
                (negative if neg else positive).add(word)
    assert grammar_keywords() <= positive, sorted(grammar_keywords() - positive)
    assert grammar_keywords() <= negative, sorted(grammar_keywords() - negative)


# ------------------------------------------------------------------ against the parser and the checker


def test_keywords_where_the_parser_sees_keywords(node_modules):
    """On every parseable plan of the repository (examples, stdlib, the language reference's blocks,
    the grammar tests, the checker's corpus), the grammar scopes as keywords exactly the tokens the
    parser reads as keywords: soft keywords used as names (`attention.output.dense`) are not."""
    corpus = dict(parseable_corpus())
    assert len(corpus) > 50
    tokens = tokenize(corpus)
    for name, text in corpus.items():
        words = word_starts(text)
        marked = {(line, start) for line, start, _end, scopes in tokens[name]
                  if _is_keyword_scope(scopes) and (line, start) in words}
        expected = {(line, col) for line, col, _w in keyword_positions(text)}
        lines = text.split("\n")
        assert marked == expected, (
            f"{name}: marked but not a keyword: {[(l, lines[l - 1]) for l, c in sorted(marked - expected)]}; "
            f"keyword but not marked: {[(l, lines[l - 1]) for l, c in sorted(expected - marked)]}")


def _scope_of(tokens, line, word, text_lines):
    col = re.search(rf"(?<![\w/]){re.escape(word)}(?![\w/])", text_lines[line - 1]).start()
    return next(s for l, a, b, s in tokens if l == line and a <= col < b)


def test_units_dtypes_schedules_optimizers_and_kinds_match_the_checker(node_modules):
    units = sorted(UNITS)
    dtypes = sorted(resolve.DTYPES)
    lines = [f"budget 1 {u}" for u in units] + [f"input a : {d}[n = 1]" for d in dtypes]
    lines += [f"pipeline over pp schedule {s} microbatches 1 {{ ? }}" for s in types.SCHEDULES]
    lines += [f"optimizer {o}" for o in types.OPTIMIZERS]
    lines += [f"template t(p: {k}) {{ checkpoint a }}" for k in resolve.PARAM_KINDS]
    lines += ["budget 1 kB", "budget 1 Gib", "input a : f31[n = 1]", "optimizer adamx",
              "pipeline over pp schedule zigzag microbatches 1 { ? }", "template t(p: float) { checkpoint a }"]
    text = "\n".join(lines)
    toks = tokenize({"t": text})["t"]
    tl = text.split("\n")
    n = 0
    for u in units:
        n += 1
        assert "keyword.other.unit.plan" in _scope_of(toks, n, u, tl), u
    for d in dtypes:
        n += 1
        assert "support.type.dtype.plan" in _scope_of(toks, n, d, tl), d
    for s in types.SCHEDULES:
        n += 1
        assert "support.constant.schedule.plan" in _scope_of(toks, n, s, tl), s
    for o in types.OPTIMIZERS:
        n += 1
        assert "support.constant.optimizer.plan" in _scope_of(toks, n, o, tl), o
    for k in resolve.PARAM_KINDS:
        n += 1
        assert "support.type.kind.plan" in _scope_of(toks, n, k, tl), k
    for word, scope in [("kB", "unit"), ("Gib", "unit"), ("f31", "dtype"), ("adamx", "support.constant"),
                        ("zigzag", "support.constant"), ("float", "support.type")]:
        n += 1
        assert scope not in _scope_of(toks, n, word, tl), word


# ------------------------------------------------------------------ scripts/install_editors.sh


def test_install_editors_does_nothing_without_npm(tmp_path):
    """Without node and npm on PATH the npm step is skipped: exit 0, no output, node_modules untouched
    (PLANLANG_PYTHON points nowhere, so the tree-sitter bindings' step is skipped too)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "sha256sum", "cut", "cat", "mktemp", "rm"):
        found = shutil.which(tool)
        if found:
            os.symlink(found, bin_dir / tool)
    stamp = VSCODE_DIR / "node_modules" / ".planlang-lock.sha256"
    before = stamp.stat().st_mtime_ns if stamp.exists() else None
    proc = subprocess.run([shutil.which("bash"), str(ROOT / "scripts" / "install_editors.sh")],
                          env={"PATH": str(bin_dir), "PLANLANG_PYTHON": str(tmp_path / "no-python")},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr == ""
    assert (stamp.stat().st_mtime_ns if stamp.exists() else None) == before
    assert not (tmp_path / "no-python").exists()


def test_install_editors_is_quiet_and_idempotent_when_installed(tmp_path):
    """Run again over a finished install (what CI's install step did), the script changes nothing and
    prints nothing: both stamps match their pinned files."""
    py_stamp = ROOT / "build" / "editors" / "python" / ".planlang-requirements.sha256"
    npm_stamp = VSCODE_DIR / "node_modules" / ".planlang-lock.sha256"
    if not py_stamp.exists() or (shutil.which("npm") and not npm_stamp.exists()):
        if os.environ.get("CI"):
            pytest.fail("scripts/install_editors.sh has not run")
        pytest.skip("scripts/install_editors.sh has not run")
    before = {p: p.stat().st_mtime_ns for p in (py_stamp, npm_stamp) if p.exists()}
    proc = subprocess.run([str(ROOT / "scripts" / "install_editors.sh")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr == ""
    assert {p: p.stat().st_mtime_ns for p in before} == before


def test_install_editors_is_executable_and_called_by_install():
    script = ROOT / "scripts" / "install_editors.sh"
    assert os.access(script, os.X_OK)
    assert "scripts/install_editors.sh" in (ROOT / "scripts" / "install.sh").read_text()


@pytest.mark.parametrize("word", sorted(grammar_keywords()))
def test_tm_grammar_mentions_every_keyword(word):
    """Every grammar keyword appears as a word in some pattern of the TextMate grammar."""
    regexes = []

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("match", "begin", "end") and isinstance(value, str):
                    regexes.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(TM_GRAMMAR)
    assert any(re.search(rf"(?<![A-Za-z0-9_\\]){word}(?![A-Za-z0-9_])", r) for r in regexes)
