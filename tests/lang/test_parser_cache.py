"""The parser cache (planlang.lang.parser_cache): the driver read back from the file parses every plan of the
repository and the broken ones to the same AST, comments and diagnostics as the driver built from Lark; a
clean plan then loads no Lark parser; a file that does not fit is ignored and written again."""
from __future__ import annotations

import os
import time

import pytest

from planlang.lang import parser as P
from planlang.lang import parser_cache as PC
from tests.lang.test_parser_fallback import PLANS, _everything


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A new process's parser (no driver yet) with an empty cache directory."""
    monkeypatch.setenv("PLANLANG_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PLANLANG_PARSER_CACHE", raising=False)
    monkeypatch.setattr(P, "_FAST", {})
    monkeypatch.setattr(P, "_FROM_LARK", {})
    return tmp_path


def test_the_cached_driver_parses_as_the_one_built_from_lark(cache, monkeypatch):
    built = P._fast(True)
    assert type(built) is P.FastParser and PC.cache_path().is_file()  # built from Lark, then written
    expected = {path: _everything(P.parse(text, path)) for path, text in PLANS}

    monkeypatch.setattr(P, "_FAST", {})
    monkeypatch.setattr(P, "_FROM_LARK", {})
    loaded = P._fast(True)
    assert isinstance(loaded, PC.CachedFastParser)
    for path, text in PLANS:
        if not expected[path][2]:  # no syntax errors
            assert _everything(P.parse(text, path)) == expected[path], path
    assert P._FROM_LARK == {}  # clean plans: no driver built from Lark
    for path, text in PLANS:
        assert _everything(P.parse(text, path)) == expected[path], path
    assert P._FAST[True] is loaded  # a syntax error is said by the driver from Lark; the cached one stays


def test_a_cache_file_that_does_not_fit_is_ignored_and_written_again(cache, monkeypatch):
    path = PC.cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"not a marshal file")
    assert PC.load() is None
    assert type(P._fast(True)) is P.FastParser
    assert isinstance(PC.load(), PC.CachedFastParser)


def test_parser_cache_0_reads_and_writes_nothing(cache, monkeypatch):
    monkeypatch.setenv("PLANLANG_PARSER_CACHE", "0")
    assert type(P._fast(True)) is P.FastParser
    assert list(cache.iterdir()) == []


def _parsed_by(monkeypatch) -> list:
    calls: list = []
    parse = P.FastParser.parse

    def counting(self, text, builder):
        calls.append(self)
        return parse(self, text, builder)

    monkeypatch.setattr(P.FastParser, "parse", counting)
    return calls


BROKEN = "shard h[0 : [dp]\nmesh m of 4 x gpu { tp = }\n"


def test_a_syntax_error_is_raised_from_the_cached_parse_where_the_tables_are_larks(cache, monkeypatch):
    expected = _everything(P.parse(BROKEN, "b.plan"))  # by the driver built from Lark (and the cache written)
    monkeypatch.setattr(P, "_FAST", {})
    monkeypatch.setattr(P, "_FROM_LARK", {})
    calls = _parsed_by(monkeypatch)
    assert _everything(P.parse(BROKEN, "b.plan")) == expected
    assert isinstance(calls[0], PC.CachedFastParser) and P._FROM_LARK[True] not in calls  # not parsed again


def test_where_larks_tables_differ_the_text_is_parsed_again_by_larks_driver(cache, monkeypatch):
    expected = _everything(P.parse(BROKEN, "b.plan"))
    monkeypatch.setattr(P, "_FAST", {})
    monkeypatch.setattr(P, "_FROM_LARK", {})
    monkeypatch.setattr(PC, "same_tables", lambda a, b: False)
    calls = _parsed_by(monkeypatch)
    assert _everything(P.parse(BROKEN, "b.plan")) == expected
    assert isinstance(calls[0], PC.CachedFastParser) and calls[1] is P._FROM_LARK[True]


def test_the_cached_tables_are_larks():
    assert PC.same_tables(P._fast_from_lark(True), PC.CachedFastParser(PC._data(P._fast_from_lark(True))))


def test_writing_removes_other_keys_files_left_for_a_month(cache):
    cache.mkdir(exist_ok=True)
    old, recent = cache / "parser-old.pickle", cache / "parser-recent.pickle"
    for f in (old, recent):
        f.write_bytes(b"x")
    month_ago = time.time() - (PC.STALE_DAYS + 1) * 86400
    os.utime(old, (month_ago, month_ago))
    P._fast(True)
    assert PC.cache_path().is_file() and recent.is_file() and not old.exists()


def test_the_scanners_are_made_from_their_stored_programs_as_re_compiles_them(cache):
    import marshal
    import re

    from planlang.lang import regex_programs as R

    P._fast(True)
    specs = marshal.loads(PC.cache_path().read_bytes())["scanners"]
    assert specs and all(prog is not None for *_, prog in specs)  # CPython: every scanner's program stored
    for pattern, flags, _kinds, _special, prog in specs:
        assert R.pattern_of(pattern, flags, prog) == re.compile(pattern, flags)  # flags, text and program
    pattern, flags, *_, prog = specs[0]
    other_python = (prog[0] + 1, *prog[1:])
    broken = (prog[0], prog[1], [999_999], *prog[3:])  # a program the engine refuses
    for bad in (None, other_python, broken):
        assert R.pattern_of(pattern, flags, bad) == re.compile(pattern, flags)  # compiled as re does
