"""The vim files (editors/vim) and the emacs major mode (editors/emacs/planlang-mode.el): their word lists
against the grammar and the checker, and, where vim / emacs are installed, what they do in batch mode:
load without errors, highlight as keywords exactly what the parser reads as keywords, and indent every
corpus plan as `planlang fmt` does."""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from planlang.lang.fmt import format_text
from planlang.plan import resolve, types
from planlang.plan.units import UNITS

from .grammar_facts import ROOT, grammar_keywords, keyword_positions, parseable_corpus, word_starts

VIM_DIR = ROOT / "editors" / "vim"
EMACS_FILE = ROOT / "editors" / "emacs" / "planlang-mode.el"
VIM_SYNTAX = (VIM_DIR / "syntax" / "plan.vim").read_text()
ELISP = EMACS_FILE.read_text()

needs_vim = pytest.mark.skipif(shutil.which("vim") is None, reason="vim is not installed")
needs_emacs = pytest.mark.skipif(shutil.which("emacs") is None, reason="emacs is not installed")


# ------------------------------------------------------------------ word lists, read from the files


def _vim_list(name: str) -> list[str]:
    m = re.search(rf"^let s:{name} = \[(.*?)\]\n(?!\s*\\)", VIM_SYNTAX, re.MULTILINE | re.DOTALL)
    assert m, name
    return re.findall(r"'([^']*)'", m.group(1))


def _vim_dict_keys(name: str) -> list[str]:
    m = re.search(rf"^let s:{name} = \{{(.*?)\n\s*\\ \}}", VIM_SYNTAX, re.MULTILINE | re.DOTALL)
    assert m, name
    return re.findall(r"^\s*\\ '([^']*)':", m.group(1), re.MULTILINE)


def _vim_unit_regex() -> re.Pattern:
    m = re.search(r"^let s:unit_pattern = '(.*?)'\n\s*\\ \. '(.*?)'$", VIM_SYNTAX, re.MULTILINE)
    vim = m.group(1) + m.group(2)
    return re.compile(vim.replace(r"\%(", "(?:").replace(r"\)", ")").replace(r"\|", "|").replace(r"\=", "?"))


def _elisp_strings(const: str) -> list[str]:
    m = re.search(rf"\(defconst {const}\s*\n?\s*'\((.*?)\)\s*\n?\s*\"", ELISP, re.DOTALL)
    assert m, const
    return re.findall(r'"([^"]*)"', m.group(1))


def _elisp_alist_keys(const: str) -> list[str]:
    m = re.search(rf"\(defconst {const}\s*\n\s*'\((.*?)\)\n\s*\"", ELISP, re.DOTALL)
    assert m, const
    return re.findall(r'\("([^"]+)" \.', m.group(1))


def _elisp_unit_regex() -> re.Pattern:
    m = re.search(r'\(defconst planlang-unit-regexp\s*\(concat "(.*?)"\s*"(.*?)"\)', ELISP, re.DOTALL)
    el = (m.group(1) + m.group(2)).replace("\\\\", "\\")
    return re.compile(el.replace(r"\(?:", "(?:").replace(r"\)", ")").replace(r"\|", "|"))


def test_files_exist_and_register_the_filetype():
    assert "setfiletype plan" in (VIM_DIR / "ftdetect" / "plan.vim").read_text()
    assert "*.plan" in (VIM_DIR / "ftdetect" / "plan.vim").read_text()
    for part in ("syntax", "indent", "ftplugin"):
        assert (VIM_DIR / part / "plan.vim").is_file(), part
    assert "(define-derived-mode planlang-mode prog-mode" in ELISP
    assert """(add-to-list 'eglot-server-programs '(planlang-mode "planlang" "lsp"))""" in ELISP
    assert """(add-to-list 'auto-mode-alist '("\\\\.plan\\\\'" . planlang-mode))""" in ELISP


def test_vim_lists_contain_the_grammar_keywords_and_the_checker_names():
    words = set(_vim_list("statement_keywords")) | set(_vim_dict_keys("contextual_keywords"))
    assert grammar_keywords() <= words, sorted(grammar_keywords() - words)
    assert words <= grammar_keywords(), sorted(words - grammar_keywords())
    assert set(_vim_list("dtypes")) == set(resolve.DTYPES)
    assert tuple(_vim_list("schedules")) == types.SCHEDULES
    assert tuple(_vim_list("optimizers")) == types.OPTIMIZERS
    assert tuple(_vim_list("param_kinds")) == resolve.PARAM_KINDS
    unit = _vim_unit_regex()
    assert all(unit.fullmatch(u) for u in UNITS) and not unit.fullmatch("kB")


def test_emacs_lists_contain_the_grammar_keywords_and_the_checker_names():
    words = set(_elisp_strings("planlang-statement-keywords")) | set(_elisp_alist_keys("planlang-contextual-keywords"))
    assert grammar_keywords() <= words, sorted(grammar_keywords() - words)
    assert words <= grammar_keywords(), sorted(words - grammar_keywords())
    assert set(_elisp_strings("planlang-dtypes")) == set(resolve.DTYPES)
    assert tuple(_elisp_strings("planlang-schedules")) == types.SCHEDULES
    assert tuple(_elisp_strings("planlang-optimizers")) == types.OPTIMIZERS
    assert tuple(_elisp_strings("planlang-param-kinds")) == resolve.PARAM_KINDS
    unit = _elisp_unit_regex()
    assert all(unit.fullmatch(u) for u in UNITS) and not unit.fullmatch("kB")


# ------------------------------------------------------------------ batch runs


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory):
    """Each parseable corpus plan as written (for highlighting) and as `planlang fmt` lays it out (for
    indentation), in a temporary folder: {path: (name, text)}."""
    folder = tmp_path_factory.mktemp("plans")
    raw, formatted = {}, {}
    for i, (name, text) in enumerate(parseable_corpus()):
        raw_path, fmt_path = folder / f"raw{i:03d}.plan", folder / f"fmt{i:03d}.plan"
        raw_path.write_text(text)
        fmt_path.write_text(format_text(text, name))
        raw[str(raw_path)] = (name, text)
        formatted[str(fmt_path)] = (name, fmt_path.read_text())
    return raw, formatted


def _compare_keywords(name: str, text: str, marked: set[tuple[int, int]]) -> None:
    words = word_starts(text)
    marked = {p for p in marked if p in words}
    expected = {(line, col) for line, col, _w in keyword_positions(text)}
    lines = text.split("\n")
    assert marked == expected, (
        f"{name}: marked but not a keyword: {[(l, lines[l - 1]) for l, c in sorted(marked - expected)]}; "
        f"keyword but not marked: {[(l, lines[l - 1]) for l, c in sorted(expected - marked)]}")


VIM = ["vim", "-u", "NONE", "-i", "NONE", "-N", "-n", "-es", "--cmd", f"set rtp^={VIM_DIR}"]


@needs_vim
def test_vim_highlights_keywords_where_the_parser_sees_keywords(corpus_files, tmp_path):
    raw, _ = corpus_files
    out = tmp_path / "syntax.json"
    proc = subprocess.run(VIM + ["--cmd", f"let g:plan_dump_out = '{out}'",
                                 "-S", str(ROOT / "tests" / "editors" / "vim_syntax_dump.vim"), "-c", "qa!", *raw],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"vim reported an error (exit {proc.returncode}): {proc.stdout}{proc.stderr}"
    dump = json.loads(out.read_text())
    for path, (name, text) in raw.items():
        marked = {(line, col) for line, col, group in dump[path]
                  if group in ("planStatement", "planKeyword", "planInclude")}
        _compare_keywords(name, text, marked)


@needs_vim
def test_vim_indents_as_the_formatter(corpus_files):
    _, formatted = corpus_files
    proc = subprocess.run(VIM + ["-S", str(ROOT / "tests" / "editors" / "vim_reindent.vim"), "-c", "qa!", *formatted],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"vim reported an error (exit {proc.returncode}): {proc.stdout}{proc.stderr}"
    for path, (name, text) in formatted.items():
        got = open(path + ".reindented").read()
        assert got == text, f"{name}: vim's indentation differs from planlang fmt"


@needs_emacs
def test_emacs_mode_byte_compiles_without_warnings(tmp_path):
    copy = tmp_path / EMACS_FILE.name
    shutil.copy(EMACS_FILE, copy)
    proc = subprocess.run(["emacs", "--batch", "-Q", "--eval", "(setq byte-compile-error-on-warn t)",
                           "-f", "batch-byte-compile", str(copy)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


@needs_emacs
def test_emacs_highlights_keywords_and_indents_as_the_formatter(corpus_files, tmp_path):
    raw, formatted = corpus_files
    out = tmp_path / "emacs.json"
    proc = subprocess.run(["emacs", "--batch", "-Q", "-l", str(EMACS_FILE),
                           "-l", str(ROOT / "tests" / "editors" / "emacs_dump.el"), str(out), *raw, *formatted],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    dump = json.loads(out.read_text())
    for path, (name, text) in raw.items():
        marked = {(line, col) for line, col, face in dump[path]["faces"]
                  if face in ("font-lock-keyword-face", "font-lock-preprocessor-face")}
        _compare_keywords(name, text, marked)
    for path, (name, text) in formatted.items():
        assert dump[path]["reindented"] == text, f"{name}: emacs's indentation differs from planlang fmt"
