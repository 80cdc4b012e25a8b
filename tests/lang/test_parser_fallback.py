"""The fast driver reads names Lark does not promise to keep: when building or running it fails (as after a
Lark release that changed them), every parse falls back to Lark's own parser, with the same AST, comments
and diagnostics, and says so once, at debug level, on the `planlang` logger; never on stdout."""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from planlang.lang import parser as P
from planlang.lang.driver import FastParser
from tests.lang.repo_plans import repo_plans

ROOT = Path(__file__).resolve().parents[2]

# syntax errors of several kinds (recovery repairs and blanks them, and parses again)
BROKEN = [
    "shard h[0 : [dp]\n", "mesh m of 4 x gpu { tp = }\n", "shard a : [dp] ]\n", "'x'\n", "shard",
    "shard a : [dp]\nshard b : [tp] shard c : [_]\n", "device d {\n  memory = 1 GiB\n", "use \"x\n",
    "stage a, h[0:6\nstage h[6:12]\n", "shard a : [dp]\n  shard b : [tp]\n}\n",
    "for b in h[*] { shard b.x : [tp] \n", "checkpoint h[0] every\n",
    "budget 1" + "0" * 120 + " GiB\n",  # PL107, from the builder
]


def _plans() -> list[tuple[str, str]]:
    return repo_plans() + [(f"broken{i}.plan", text) for i, text in enumerate(BROKEN)]


PLANS = _plans()


def _walk(x):
    """Every field of every node, spans and literal text included."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return (type(x).__name__,) + tuple((f.name, _walk(getattr(x, f.name))) for f in dataclasses.fields(x))
    if isinstance(x, (tuple, list)):
        return tuple(_walk(i) for i in x)
    return x


def _everything(res: P.ParseResult) -> tuple:
    return _walk(res.module), _walk(res.module.comments), res.diagnostics, res.warnings


@pytest.fixture(scope="module")
def by_fast_driver() -> dict[str, tuple]:
    assert P._fast(True) is not None and P._fast(False) is not None
    return {path: _everything(P.parse(text, path)) for path, text in PLANS}


@pytest.fixture
def fresh(monkeypatch):
    """No fast driver built yet, nothing logged yet (as in a new process, with no parser cache: one
    written by this Lark would not be read under another, tests/lang/test_parser_cache.py)."""
    monkeypatch.setattr(P, "_FAST", {})
    monkeypatch.setattr(P, "_FROM_LARK", {})
    monkeypatch.setenv("PLANLANG_PARSER_CACHE", "0")
    monkeypatch.setattr(P, "_FELL_BACK", [])


def _fallback_logged(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("planlang") and "Lark's own parser" in r.getMessage()]


def test_the_corpus_has_plans_and_broken_ones(by_fast_driver):
    assert len(PLANS) > 100
    assert sum(1 for got in by_fast_driver.values() if got[2]) >= len(BROKEN)


def test_a_driver_that_cannot_be_built_falls_back_to_larks_parser(by_fast_driver, fresh, monkeypatch, caplog,
                                                                 capsys):
    def changed_lark(self, lark, build=True):
        raise TypeError("Lark changed: _parse_table is gone")

    monkeypatch.setattr(FastParser, "__init__", changed_lark)
    with caplog.at_level(logging.DEBUG, logger="planlang"):
        for path, text in PLANS:
            assert _everything(P.parse(text, path)) == by_fast_driver[path], path
    assert P._FAST == {True: None, False: None}  # tried once each, not at every parse
    logged = _fallback_logged(caplog)
    assert len(logged) == 1 and logged[0].levelno == logging.DEBUG and "building" in logged[0].getMessage()
    assert capsys.readouterr().out == ""


def test_a_driver_that_fails_while_parsing_falls_back_to_larks_parser(by_fast_driver, fresh, monkeypatch,
                                                                     caplog, capsys):
    calls = []

    def broken(self, text, builder):
        calls.append(text)
        raise AttributeError("'ParserState' object has no attribute 'position'")

    monkeypatch.setattr(FastParser, "parse", broken)
    with caplog.at_level(logging.DEBUG, logger="planlang"):
        for path, text in PLANS:
            assert _everything(P.parse(text, path)) == by_fast_driver[path], path
    assert len(calls) <= 2  # once with the tree built and once without, then never again
    assert len(_fallback_logged(caplog)) == 1
    assert capsys.readouterr().out == ""


def test_a_driver_that_cannot_raise_larks_exception_falls_back(by_fast_driver, fresh, monkeypatch):
    # the driver builds Lark's exception from Lark's parser state (more names Lark may change)
    def changed(*args, **kwargs):
        raise TypeError("ParserState() takes other arguments")

    monkeypatch.setattr(FastParser, "_parser_error", changed)
    monkeypatch.setattr(FastParser, "_lexer_error", changed)
    for path, text in PLANS:
        if path.startswith("broken"):
            assert _everything(P.parse(text, path)) == by_fast_driver[path], path


def test_syntax_errors_are_the_texts_not_a_fallback(fresh, caplog):
    with caplog.at_level(logging.DEBUG, logger="planlang"):
        for text in BROKEN:
            assert not P.parse(text).ok
    assert P._FAST[True] is not None and P._FAST[False] is not None
    assert _fallback_logged(caplog) == []


@pytest.fixture
def lark_without_reductions(monkeypatch):
    """Lark's parser as it would be if the reductions could not be installed in it (a Lark release that
    moved `parser.parser.parser.callbacks` or changed `maybe_create_child_filter`)."""
    from planlang.lang import lark_parser as LP

    def changed_lark(lark, builder):
        raise TypeError("maybe_create_child_filter() takes 3 positional arguments")

    monkeypatch.setattr(LP, "install_builders", changed_lark)
    LP.lark_parser.cache_clear()
    yield
    LP.lark_parser.cache_clear()  # built again, with the reductions


def test_without_the_reductions_larks_tree_gives_the_same_ast(by_fast_driver, fresh, lark_without_reductions,
                                                               monkeypatch, caplog, capsys):
    def changed_lark(self, lark, build=True):
        raise TypeError("Lark changed: _parse_table is gone")

    monkeypatch.setattr(FastParser, "__init__", changed_lark)
    with caplog.at_level(logging.DEBUG, logger="planlang"):
        for path, text in PLANS:
            assert _everything(P.parse(text, path)) == by_fast_driver[path], path
    assert any("cannot be installed" in r.getMessage() for r in caplog.records)
    assert capsys.readouterr().out == ""
