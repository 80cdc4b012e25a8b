#!/usr/bin/env python3
"""Work on the planlang tree-sitter grammar without the tree-sitter CLI.

The generated parser (src/parser.c) is committed, so a C compiler and the `tree-sitter` Python bindings
(PyPI, pinned in tests/editors/requirements-tree-sitter.txt; ./scripts/install_editors.sh installs them
into build/editors/python) are enough to build, test and query it:

    python editors/tree-sitter-planlang/scripts/ts.py test [--update] [-i NAME]   # run test/corpus/*.txt
    python editors/tree-sitter-planlang/scripts/ts.py parse FILE...               # print the syntax tree
    python editors/tree-sitter-planlang/scripts/ts.py highlight FILE              # print each capture
    python editors/tree-sitter-planlang/scripts/ts.py queries [--check]           # write the Helix and Zed queries

`test` reads the corpus format of `tree-sitter test` (a `===` header with the name and optional `:error` /
`:skip` lines, the input, a `---` line, the expected S-expression) and compares the same way: whitespace
is not significant, and field names are compared only when the expected tree has them. `--update` writes
the actual trees into the files (review the diff before committing).

Regenerating src/ after a change to grammar.js needs the tree-sitter CLI (docs/editors.md).
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

GRAMMAR_DIR = Path(__file__).resolve().parents[1]
ROOT = GRAMMAR_DIR.parents[1]
SRC = GRAMMAR_DIR / "src"
CORPUS_DIR = GRAMMAR_DIR / "test" / "corpus"
QUERIES_DIR = GRAMMAR_DIR / "queries"
PY_DEPS = ROOT / "build" / "editors" / "python"  # install_editors.sh puts the bindings here
BUILD_DIR = ROOT / "build" / "editors" / "tree-sitter"
LANGUAGE_NAME = "planlang"


# ------------------------------------------------------------------ building and loading


def import_tree_sitter():
    """The `tree_sitter` module: installed in the environment, or in build/editors/python."""
    try:
        import tree_sitter
    except ImportError:
        if not PY_DEPS.is_dir():
            raise
        sys.path.insert(0, str(PY_DEPS))
        import tree_sitter
    return tree_sitter


def c_sources(src: Path = SRC) -> list[Path]:
    return [src / "parser.c"] + [p for p in (src / "scanner.c",) if p.exists()]


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def build_library(out_dir: Path = BUILD_DIR, src: Path = SRC) -> Path:
    """Compile a generated parser (src/: parser.c, tree_sitter/parser.h) into a shared library, cached
    by the content of the sources."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc or clang) on PATH")
    digest = hashlib.sha256()
    for path in c_sources(src) + [src / "tree_sitter" / "parser.h"]:
        digest.update(path.read_bytes())
    out = out_dir / f"{LANGUAGE_NAME}-{digest.hexdigest()[:16]}.so"
    if out.exists():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        tmp_out = Path(tmp) / out.name
        cmd = [cc, "-shared", "-fPIC", "-O1", "-std=c11", "-I", str(src), *map(str, c_sources(src)), "-o", str(tmp_out)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr}")
        os.replace(tmp_out, out)  # atomic: concurrent builds of the same sources agree
    return out


_LOADED: list = []


def load_language(library: Path | None = None):
    ts = import_tree_sitter()
    lib = ctypes.CDLL(str(library or build_library()))
    entry = getattr(lib, f"tree_sitter_{LANGUAGE_NAME}")
    entry.restype = ctypes.c_void_p
    # tree_sitter.Language takes a PyCapsule named "tree_sitter.Language" (an int is deprecated)
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype = ctypes.py_object
    new_capsule.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
    language = ts.Language(new_capsule(entry(), b"tree_sitter.Language", None))
    _LOADED.append(lib)  # ctypes never unloads a library; keep the handle anyway
    return language


def parser_for(language):
    return import_tree_sitter().Parser(language)


# ------------------------------------------------------------------ the corpus format of `tree-sitter test`

_HEADER = re.compile(r"^={3,}\s*$")
_DIVIDER = re.compile(r"^-{3,}\s*$")
_ATTRIBUTE = re.compile(r"^:(skip|error|fail-fast|cst|language\([^)]*\)|platform\([^)]*\))\s*$")


@dataclass
class CorpusTest:
    name: str
    input: str
    expected: str
    path: Path
    line: int  # of the name, 1-based
    attributes: set[str] = field(default_factory=set)


def read_corpus(path: Path) -> list[CorpusTest]:
    lines = path.read_bytes().decode().split("\n")  # bytes: keep any \r of the inputs
    tests: list[CorpusTest] = []
    i = 0
    while i < len(lines):
        if not _HEADER.match(lines[i]):
            i += 1
            continue
        j = i + 1
        names, attributes = [], set()
        while j < len(lines) and not _HEADER.match(lines[j]):
            text = lines[j].strip()
            if _ATTRIBUTE.match(text):
                attributes.add(text[1:])
            elif text:
                names.append(text)
            j += 1
        if j >= len(lines):
            raise ValueError(f"{path}:{i + 1}: header not closed by a === line")
        body_start = j + 1
        k = body_start
        while k < len(lines) and not _DIVIDER.match(lines[k]):
            if _HEADER.match(lines[k]):
                raise ValueError(f"{path}:{i + 1}: no --- line before the next test")
            k += 1
        if k >= len(lines):
            raise ValueError(f"{path}:{i + 1}: no --- line")
        m = k + 1
        while m < len(lines) and not _HEADER.match(lines[m]):
            m += 1
        # the input is everything between the header and the divider but the last line break
        source = "\n".join(lines[body_start:k])
        tests.append(CorpusTest(name=" ".join(names), input=source, expected="\n".join(lines[k + 1:m]).strip(),
                                path=path, line=i + 2, attributes=attributes))
        i = m
    return tests


def corpus_files() -> list[Path]:
    return sorted(CORPUS_DIR.glob("*.txt"))


_SEXP_TOKEN = re.compile(r"\(|\)|[^\s()]+")


def sexp_tokens(sexp: str, fields: bool = True) -> list[str]:
    tokens = _SEXP_TOKEN.findall(sexp)
    return tokens if fields else [t for t in tokens if not t.endswith(":")]


def format_sexp(sexp: str) -> str:
    """One node per line, two spaces per level, `field: (node` kept together (as `tree-sitter test`)."""
    out: list[str] = []
    depth = 0
    pending_field = None
    for tok in _SEXP_TOKEN.findall(sexp):
        if tok == "(":
            out.append("\n" + "  " * depth + (pending_field + " " if pending_field else "") + "(")
            pending_field = None
            depth += 1
        elif tok == ")":
            out.append(")")
            depth -= 1
        elif tok.endswith(":"):
            pending_field = tok
        elif out and out[-1].endswith("("):
            out.append(tok)
        else:
            out.append(" " + tok)
    return "".join(out).strip()


@dataclass
class CorpusResult:
    test: CorpusTest
    ok: bool
    actual: str


def run_test(parser, test: CorpusTest) -> CorpusResult:
    tree = parser.parse(test.input.encode())
    actual = str(tree.root_node)
    if "error" in test.attributes:
        return CorpusResult(test, tree.root_node.has_error, actual)
    with_fields = any(t.endswith(":") for t in sexp_tokens(test.expected))
    ok = sexp_tokens(actual, with_fields) == sexp_tokens(test.expected, with_fields)
    return CorpusResult(test, ok, actual)


def run_corpus(language, include: str | None = None) -> list[CorpusResult]:
    parser = parser_for(language)
    results = []
    for path in corpus_files():
        for test in read_corpus(path):
            if "skip" in test.attributes or (include and include not in test.name):
                continue
            results.append(run_test(parser, test))
    return results


def update_corpus(language) -> int:
    """Rewrite every corpus file with the actual trees; returns the number of tests changed."""
    parser = parser_for(language)
    changed = 0
    for path in corpus_files():
        lines = path.read_bytes().decode().split("\n")
        for test in reversed(read_corpus(path)):
            if "error" in test.attributes or "skip" in test.attributes:
                continue
            result = run_test(parser, test)
            if result.ok:
                continue
            changed += 1
            # the expected block runs from the divider after the input to the next header
            divider = test.line + test.input.count("\n") + 2  # 0-based index of the --- line
            while not _DIVIDER.match(lines[divider]):
                divider += 1
            end = divider + 1
            while end < len(lines) and not _HEADER.match(lines[end]):
                end += 1
            block = ["", format_sexp(result.actual), ""]
            lines[divider + 1:end] = "\n".join(block).split("\n")
        path.write_bytes("\n".join(lines).encode())
    return changed


# ------------------------------------------------------------------ queries for the other editors

# queries/highlights.scm uses nvim-treesitter's capture names; Helix and Zed name the same things
# differently. Their highlights.scm are written from it with these maps (`queries` subcommand).
HELIX_CAPTURES = {
    "keyword": "keyword",
    "keyword.import": "keyword.control.import",
    "keyword.repeat": "keyword.control.repeat",
    "keyword.function": "keyword.function",
    "keyword.operator": "keyword.operator",
    "module": "namespace",
    "type": "type",
    "type.definition": "type",
    "type.builtin": "type.builtin",
    "function": "function",
    "function.call": "function",
    "variable": "variable",
    "variable.parameter": "variable.parameter",
    "variable.member": "variable.other.member",
    "property": "variable.other.member",
    "constant.builtin": "constant.builtin",
    "number": "constant.numeric.integer",
    "number.float": "constant.numeric.float",
    "string": "string",
    "comment": "comment.line",
    "character.special": "operator",
    "operator": "operator",
    "punctuation.bracket": "punctuation.bracket",
    "punctuation.delimiter": "punctuation.delimiter",
}

ZED_CAPTURES = {
    "keyword": "keyword",
    "keyword.import": "keyword",
    "keyword.repeat": "keyword",
    "keyword.function": "keyword",
    "keyword.operator": "keyword",
    "module": "type",
    "type": "type",
    "type.definition": "type",
    "type.builtin": "type",
    "function": "function",
    "function.call": "function",
    "variable": "variable",
    "variable.parameter": "variable",
    "variable.member": "property",
    "property": "property",
    "constant.builtin": "constant",
    "number": "number",
    "number.float": "number",
    "string": "string",
    "comment": "comment",
    "character.special": "operator",
    "operator": "operator",
    "punctuation.bracket": "punctuation.bracket",
    "punctuation.delimiter": "punctuation.delimiter",
}

# captures that do not highlight (Neovim's spell checking): dropped for the other editors
NVIM_ONLY_CAPTURES = {"spell", "nospell"}

HELIX_HIGHLIGHTS = ROOT / "editors" / "helix" / "runtime" / "queries" / LANGUAGE_NAME / "highlights.scm"
ZED_HIGHLIGHTS = ROOT / "editors" / "zed" / "languages" / LANGUAGE_NAME / "highlights.scm"

def translate_highlights(source: str, captures: dict[str, str], editor: str) -> str:
    """queries/highlights.scm with its capture names replaced through `captures` (comments kept, its
    opening comment block replaced by a note that the file is generated)."""
    lines = source.split("\n")
    while lines and lines[0].startswith(";"):
        lines.pop(0)
    out = [f"; planlang highlights for {editor}, GENERATED from editors/tree-sitter-planlang/queries/highlights.scm",
           f"; (nvim-treesitter's capture names) by `python editors/tree-sitter-planlang/scripts/ts.py queries`,",
           f"; which renames the captures to {editor}'s. Edit that file and run the script; do not edit this one.",
           ";",
           "; Every token gets exactly one capture and only tokens are captured, so the result does not depend",
           "; on the order in which an editor applies patterns (tests/editors/test_tree_sitter.py)."]
    for line in lines:
        code, sep, comment = _split_comment(line)

        def repl(m):
            name = m.group(2)
            if name in NVIM_ONLY_CAPTURES:
                return ""
            if name not in captures:
                raise KeyError(f"capture @{name} has no {editor} name: add it to ts.py")
            return m.group(1) + "@" + captures[name]

        code = re.sub(r"(\s*)@([A-Za-z_][A-Za-z0-9_.]*)", repl, code)
        out.append((code + sep + comment).rstrip())
    return "\n".join(out).rstrip("\n") + "\n"


def _split_comment(line: str) -> tuple[str, str, str]:
    """(code, ';' or '', comment) of a query line; a ';' inside a string is not a comment."""
    in_str = False
    i = 0
    while i < len(line):
        ch = line[i]
        if in_str:
            if ch == "\\":
                i += 2
                continue
            if ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch == ";":
            return line[:i], ";", line[i + 1:]
        i += 1
    return line, "", ""


def editor_highlights() -> dict[Path, str]:
    source = (QUERIES_DIR / "highlights.scm").read_text()
    return {
        HELIX_HIGHLIGHTS: translate_highlights(source, HELIX_CAPTURES, "Helix"),
        ZED_HIGHLIGHTS: translate_highlights(source, ZED_CAPTURES, "Zed"),
    }


# ------------------------------------------------------------------ command line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("test", help="run the corpus tests (test/corpus/*.txt)")
    t.add_argument("--update", action="store_true", help="write the actual trees into the corpus files")
    t.add_argument("-i", "--include", help="only tests whose name contains this")
    p = sub.add_parser("parse", help="print the syntax tree of files")
    p.add_argument("files", nargs="+", type=Path)
    h = sub.add_parser("highlight", help="print each highlight capture of a file")
    h.add_argument("file", type=Path)
    h.add_argument("--query", type=Path, default=QUERIES_DIR / "highlights.scm")
    q = sub.add_parser("queries", help="write the Helix and Zed highlight queries from queries/highlights.scm")
    q.add_argument("--check", action="store_true", help="only check that they are up to date")
    args = ap.parse_args(argv)

    if args.cmd == "queries":
        stale = []
        for path, text in editor_highlights().items():
            if not path.exists() or path.read_text() != text:
                stale.append(path)
                if not args.check:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(text)
        for path in stale:
            print(f"{'stale' if args.check else 'wrote'}: {path.relative_to(ROOT)}")
        return 1 if args.check and stale else 0

    language = load_language()
    if args.cmd == "test":
        if args.update:
            print(f"{update_corpus(language)} test(s) updated")
        results = run_corpus(language, args.include)
        for r in results:
            mark = "✓" if r.ok else "✗"
            print(f"  {mark} {r.test.path.name}:{r.test.line}: {r.test.name}")
        failed = [r for r in results if not r.ok]
        for r in failed:
            print(f"\n{r.test.path.relative_to(ROOT)}:{r.test.line}: {r.test.name}")
            if "error" in r.test.attributes:
                print("  expected a syntax error, parsed without one:")
            else:
                print("  expected:\n" + _indent(format_sexp(r.test.expected)) + "\n  actual:")
            print(_indent(format_sexp(r.actual)))
        print(f"\n{len(results) - len(failed)} passed, {len(failed)} failed")
        return 1 if failed else 0
    if args.cmd == "parse":
        parser = parser_for(language)
        status = 0
        for path in args.files:
            tree = parser.parse(path.read_bytes())
            print(f"{path}\n{format_sexp(str(tree.root_node))}")
            if tree.root_node.has_error:
                status = 1
        return status
    if args.cmd == "highlight":
        ts = import_tree_sitter()
        query = ts.Query(language, args.query.read_text())
        source = args.file.read_bytes()
        tree = parser_for(language).parse(source)
        rows = []
        for name, nodes in ts.QueryCursor(query).captures(tree.root_node).items():
            for node in nodes:
                rows.append((node.start_point, node.end_point, name, source[node.start_byte:node.end_byte].decode()))
        for start, end, name, text in sorted(rows):
            print(f"{start[0] + 1}:{start[1]}-{end[1]}\t@{name}\t{text!r}")
        return 0
    return 2


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.split("\n"))


if __name__ == "__main__":
    sys.exit(main())
