"""What the editor integrations are checked against: the keywords of grammar/planlang.lark, where the real
parser sees a keyword (as opposed to a soft keyword used as a name), and the corpus of plan texts.

Every editor (TextMate, Pygments, vim, emacs) is held to the same two facts: its keyword list contains
every literal word of the grammar, and on every parseable plan of the repository it marks exactly the
tokens the parser reads as keywords — no more (a module called `output`), no fewer.
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from lark import Lark, Token, Tree
from lark.lexer import PatternStr

from planlang.lang.parser import GRAMMAR_PATH, PlanPostLex, parse

ROOT = Path(__file__).resolve().parents[2]
VSCODE_DIR = ROOT / "editors" / "vscode"
GRAMMAR_TESTS_DIR = VSCODE_DIR / "tests"

_FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def _grammar_text() -> str:
    # drop `//` comments: their prose quotes words that are not literals of the grammar
    return "\n".join(line.split("//", 1)[0] for line in GRAMMAR_PATH.read_text().splitlines())


@lru_cache(maxsize=1)
def grammar_keywords() -> frozenset[str]:
    """Every word written as a string literal in the grammar: `"shard"`, `"of"`, `"x"`, ..."""
    return frozenset(re.findall(r'"([A-Za-z][A-Za-z0-9_]*)"', _grammar_text()))


@lru_cache(maxsize=1)
def grammar_soft_keywords() -> frozenset[str]:
    """The words the grammar's `!name` rule also accepts as names."""
    m = re.search(r"^!name:(.*?)(?=^\S)", _grammar_text(), re.MULTILINE | re.DOTALL)
    assert m, "grammar/planlang.lark has no `!name` rule"
    return frozenset(re.findall(r'"([A-Za-z][A-Za-z0-9_]*)"', m.group(1)))


@lru_cache(maxsize=1)
def _lark_all_tokens() -> Lark:
    return Lark(GRAMMAR_PATH.read_text(), parser="lalr", lexer="contextual", postlex=PlanPostLex(),
                propagate_positions=True, maybe_placeholders=True, keep_all_tokens=True)


def keyword_positions(text: str) -> set[tuple[int, int, str]]:
    """(line, column, word), 1-based line and 0-based column, of every token the parser reads as a
    keyword: a literal of the grammar that does not stand inside the `name` rule."""
    lark = _lark_all_tokens()
    # the terminals that are keyword literals (Lark names most of them SHARD, OF, ...; `schedule` gets
    # an anonymous name because the SCHEDULE regex terminal took that one)
    literal_terminals = {t.name for t in lark.terminals
                         if isinstance(t.pattern, PatternStr) and t.pattern.value in grammar_keywords()}
    tree = lark.parse(text)
    found: set[tuple[int, int, str]] = set()

    def walk(node: Tree) -> None:
        for child in node.children:
            if isinstance(child, Tree):
                walk(child)
            elif isinstance(child, Token) and node.data != "name" and child.type in literal_terminals:
                found.add((child.line, child.column - 1, child.value))

    walk(tree)
    return found


def word_starts(text: str) -> dict[tuple[int, int], str]:
    """(line, column) -> word, for every identifier-like word of the text outside comments and strings
    (the candidates an editor could mark as a keyword)."""
    out: dict[tuple[int, int], str] = {}
    for lineno, line in enumerate(text.split("\n"), start=1):
        code = _strip_comment_and_strings(line)
        for m in re.finditer(r"(?<![A-Za-z0-9_])[A-Za-z_][A-Za-z0-9_]*", code):
            out[(lineno, m.start())] = m.group()
    return out


def _strip_comment_and_strings(line: str) -> str:
    out, in_str, i = [], False, 0
    while i < len(line):
        ch = line[i]
        if in_str:
            if ch == "\\" and i + 1 < len(line):
                out.append("  ")
                i += 2
                continue
            in_str = ch != '"'
            out.append(" ")
        elif ch == '"':
            in_str = True
            out.append(" ")
        elif ch == "#":
            break
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def doc_blocks(md: Path, tag: str = "plan") -> list[tuple[str, str]]:
    """(name, text) of each ```plan block of a markdown file."""
    text = md.read_text()
    out = []
    for m in _FENCE.finditer(text):
        if m.group("info").strip() == tag:
            line = text.count("\n", 0, m.start()) + 1
            out.append((f"{md.relative_to(ROOT)}:{line}", m.group("body")))
    return out


@lru_cache(maxsize=1)
def plan_corpus() -> tuple[tuple[str, str], ...]:
    """(name, text) of the example and stdlib plans and of the language reference's ```plan blocks."""
    files = sorted((ROOT / "examples").rglob("*.plan")) + sorted((ROOT / "stdlib").rglob("*.plan"))
    items = [(str(p.relative_to(ROOT)), p.read_text()) for p in files]
    items += doc_blocks(ROOT / "docs" / "language.md")
    return tuple(items)


@lru_cache(maxsize=1)
def parseable_corpus() -> tuple[tuple[str, str], ...]:
    """plan_corpus plus the TextMate grammar test files and the checker's invalid-plan corpus, keeping
    only texts without syntax errors (the files of tests/lang/corpus/invalid mostly break semantic
    rules; the grammar tests are full of soft keywords used as names)."""
    extra = sorted(GRAMMAR_TESTS_DIR.glob("*.plan")) + sorted((ROOT / "tests" / "lang" / "corpus").rglob("*.plan"))
    items = list(plan_corpus()) + [(str(p.relative_to(ROOT)), text) for p in extra if (text := utf8_text(p)) is not None]
    return tuple((name, text) for name, text in items if parse(text, name).ok)


def utf8_text(path: Path) -> str | None:
    """The file's text, or None when it is not UTF-8 (the checker's corpus has such a file on purpose:
    it is an encoding error, PL105, not a plan an editor could highlight)."""
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return None
