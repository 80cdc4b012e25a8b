"""Mechanical fixes (planlang.lang.fixes): applying edits, each producer's fix making its diagnostic go
away, `lint --fix` over the corpus of invalid plans (every fixable diagnostic fixed, the result clean and
stable under `fmt`), and the fixes as JSON and SARIF carry them. In process; one in-process CLI run."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planlang.lang.diagnostics import Diagnostic, Edit, Fix, Severity
from planlang.lang.fixes import apply_fixes, fix_to_fixed_point, guess_is_unique, suggest
from planlang.lang.fmt import FormatError, format_text
from planlang.lang.render import render
from planlang.lang.source import SourceFile
from planlang.plan.checker import check_text

REPO = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).resolve().parent / "corpus" / "invalid"
CORPUS_REL = CORPUS.relative_to(REPO)


def _diag(source: SourceFile, start: int, end: int, text: str, *, safe: bool = True, code: str = "PL900") -> Diagnostic:
    span = source.span(start, end)
    return Diagnostic(code, Severity.ERROR, "m", span, fix=Fix("f", (Edit(span, text),), safe))


# ------------------------------------------------------------------------------------------ applying edits
def test_edits_apply_back_to_front_and_overlaps_wait_for_the_next_pass():
    src = SourceFile("a", "alpha beta gamma")
    a = _diag(src, 0, 5, "A")
    b = _diag(src, 6, 10, "BETA!")
    over = _diag(src, 8, 12, "x")  # overlaps `b`: skipped, left for the next pass
    done = apply_fixes(src.text, [over, b, a])
    assert done.text == "A BETA! gamma"
    assert done.fixed == (a, b) and done.skipped == (over,)


def test_two_insertions_at_one_place_are_one_per_pass_and_the_same_fix_twice_applies_once():
    src = SourceFile("a", "ab")
    one, two = _diag(src, 1, 1, ","), _diag(src, 1, 1, ";")
    assert apply_fixes(src.text, [one, two]).text == "a,b"
    same = _diag(src, 0, 1, "A")
    assert apply_fixes(src.text, [same, _diag(src, 0, 1, "A")]).text == "Ab"


def test_unsafe_fixes_only_when_asked():
    src = SourceFile("a", "x = 1")
    d = _diag(src, 4, 5, "2", safe=False)
    assert apply_fixes(src.text, [d]).text == "x = 1"
    assert apply_fixes(src.text, [d], unsafe=True).text == "x = 2"


def test_fixed_point_is_bounded_and_stops_on_a_cycle():
    def flip(text: str) -> list[Diagnostic]:  # each pass turns `a` into `b` and back: never settles
        src = SourceFile("a", text)
        return [_diag(src, 0, 1, "b" if text[0] == "a" else "a")]

    result = fix_to_fixed_point("a", flip)
    assert result.passes <= 2 and result.text in ("a", "b")

    def grow(text: str) -> list[Diagnostic]:  # a new fix every pass: stopped by the bound
        src = SourceFile("a", text)
        return [_diag(src, len(text), len(text), "x")]

    assert fix_to_fixed_point("", grow, max_passes=3).text == "xxx"


def test_did_you_mean_is_safe_only_when_the_guess_is_unique():
    assert guess_is_unique("GIB", "GiB", ["GiB", "GB", "MiB"])  # case only
    assert guess_is_unique("latancy", "latency", ["bandwidth", "latency"])
    assert not guess_is_unique("dpp", "dp", ["dp", "pp", "tp"])  # `pp` is as close
    src = SourceFile("a", "dpp")
    guess, fix = suggest("dpp", ["dp", "pp"], src.span(0, 3))
    assert guess == "dp" and fix is not None and not fix.safe and fix.edits[0].text == "dp"
    assert suggest("zzz", ["dp"], src.span(0, 3)) == (None, None)


# ------------------------------------------------------------------------------------------ the corpus
def _corpus_texts() -> list[tuple[str, str]]:
    out = []
    for p in sorted(CORPUS.glob("*.plan")):
        try:
            out.append((str(CORPUS_REL / p.name), p.read_text(encoding="utf-8")))
        except UnicodeDecodeError:  # PL105: no text to fix
            pass
    return out


def _checker(path: str):
    def check(text: str) -> list[Diagnostic]:
        return [d for d in check_text(text, path).diagnostics if d.span.file == path]
    return check


# fixing one error lets the checker see past it: a plan whose only errors were syntax errors is resolved
# for the first time, and may show a different, unfixable problem that was there all along
UNCOVERED = {"syntax_unclosed_bracket_before_stage.plan": {"PL301"}}


@pytest.fixture(scope="module")
def corpus_fixed(request):
    """(path, original text, its diagnostics, the result of fixing with --unsafe-fixes) per corpus file
    with at least one fix."""
    monkey = pytest.MonkeyPatch()
    monkey.chdir(REPO)
    request.addfinalizer(monkey.undo)
    out = []
    for path, text in _corpus_texts():
        check = _checker(path)
        before = check(text)
        if any(d.fix is not None for d in before):
            out.append((path, text, before, fix_to_fixed_point(text, check, unsafe=True)))
    return out


def test_each_fix_removes_its_diagnostic(corpus_fixed):
    codes = set()
    for path, _, before, result in corpus_fixed:
        after = {(d.code, d.message) for d in result.remaining}
        for d in before:
            if d.fix is not None:
                codes.add(d.code)
                assert (d.code, d.message) not in after, f"{path}: {d} is still there after its fix"
    # the codes whose fixes the corpus exercises (more have fixes: these must keep theirs)
    assert {"PL101", "PL102", "PL104", "PL201", "PL202", "PL203", "PL205", "PL208", "PL211", "PL212", "PL214",
            "PL215", "PL216", "PL218", "PL225", "PL250", "PL252", "PL253", "PL417", "PL210", "PL404", "PL512"} <= codes


def test_lint_fix_on_the_corpus_fixes_everything_fixable_and_the_result_checks_clean(corpus_fixed):
    assert len(corpus_fixed) >= 25
    for path, _, before, result in corpus_fixed:
        assert not [d for d in result.remaining if d.fix is not None], f"{path}: a fixable diagnostic is left"
        if all(d.fix is not None for d in before):
            left = {d.code for d in result.remaining}
            assert left <= UNCOVERED.get(Path(path).name, set()), f"{path}: {[str(d) for d in result.remaining]}"


def test_the_fixed_corpus_round_trips_fmt(corpus_fixed):
    for path, text, _, result in corpus_fixed:
        try:
            formatted = format_text(result.text, path)
        except FormatError:
            assert any(d.code.startswith("PL1") for d in result.remaining), path  # only a syntax error left
            continue
        try:
            was_clean = format_text(text, path) == text
        except FormatError:
            was_clean = False
        if was_clean:
            assert formatted == result.text, f"{path}: fmt-clean before the fix, not after"
        assert format_text(formatted, path) == formatted


def test_safe_fixes_alone_leave_the_unsafe_ones(corpus_fixed):
    path, text = next((p, t) for p, t, before, _ in corpus_fixed
                      if any(d.fix is not None and not d.fix.safe for d in before) and Path(p).name.startswith("pl214"))
    result = fix_to_fixed_point(text, _checker(path))
    assert [d.code for d in result.remaining] == ["PL214"] and "`i65`" in result.remaining[0].message


# ------------------------------------------------------------------------------------------ outputs
def test_json_and_sarif_carry_the_edits(monkeypatch):
    monkeypatch.chdir(REPO)
    path = str(CORPUS_REL / "pl201_unknown_axis.plan")
    res = check_text((REPO / path).read_text(encoding="utf-8"), path)
    text = res.sources[path].text
    [entry] = json.loads(render(list(res.diagnostics), res.sources, "json"))
    fix = entry["fix"]
    assert fix["safe"] is True and fix["message"] == "replace `tpp` with `tp`"
    [edit] = fix["edits"]
    assert text[edit["start"]:edit["end"]] == "tpp" and edit["text"] == "tp"
    assert (edit["line"], edit["column"]) == (entry["line"], entry["column"])

    sarif = json.loads(render(list(res.diagnostics), res.sources, "sarif"))
    [result] = sarif["runs"][0]["results"]
    [change] = result["fixes"][0]["artifactChanges"]
    assert change["artifactLocation"]["uri"] == path
    [rep] = change["replacements"]
    assert rep["insertedContent"]["text"] == "tp"
    assert rep["deletedRegion"] == {"startLine": edit["line"], "startColumn": edit["column"],
                                    "endLine": edit["end_line"], "endColumn": edit["end_column"]}

    human = render(list(res.diagnostics), res.sources, "human")
    assert "= fix: replace `tpp` with `tp`" in human


def test_a_diagnostic_without_a_fix_has_no_fix_key(monkeypatch):
    monkeypatch.chdir(REPO)
    path = str(CORPUS_REL / "pl301_mesh_size_mismatch.plan")
    res = check_text((REPO / path).read_text(encoding="utf-8"), path)
    assert all("fix" not in d for d in json.loads(render(list(res.diagnostics), res.sources, "json")))
    assert all("fixes" not in r for r in json.loads(render(list(res.diagnostics), res.sources, "sarif"))["runs"][0]["results"])


# ------------------------------------------------------------------------------------------ the command
def test_lint_fix_rewrites_files_and_reports_what_remains(tmp_path, monkeypatch):
    from planlang.cli import app

    names = ["pl201_unknown_axis.plan", "pl214_unknown_dtype.plan", "pl301_mesh_size_mismatch.plan"]
    for n in names:
        shutil.copy(CORPUS / n, tmp_path / n)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()

    diff = runner.invoke(app, ["lint", "--diff"])
    assert diff.exit_code == 1
    assert "+shard h[*].mlp.c_fc.weight : [_, tp]" in diff.stdout and "Would fix 2 problems" in diff.stderr
    assert (tmp_path / names[0]).read_text() == (CORPUS / names[0]).read_text()  # --diff writes nothing

    first = runner.invoke(app, ["lint", "--fix"])  # no path: the working folder
    assert first.exit_code == 1  # PL301 and the unsafe PL214 remain
    assert "fixed pl201_unknown_axis.plan:9:34: PL201 replace `tpp` with `tp`" in first.stderr
    assert "Found 4 problems (2 fixed, 2 remaining)." in first.stderr
    assert "1 more fix with `--unsafe-fixes`" in first.stderr
    assert [line.split(":")[0] for line in first.stdout.splitlines()] == [
        "pl214_unknown_dtype.plan", "pl301_mesh_size_mismatch.plan"]
    assert "[_, tp]" in (tmp_path / names[0]).read_text()

    second = runner.invoke(app, ["lint", "--fix", "--unsafe-fixes", names[1]])
    assert second.exit_code == 0 and "(1 fixed, 0 remaining)" in second.stderr
    assert "i64[" in (tmp_path / names[1]).read_text()


def test_an_axis_passed_to_a_template_is_never_fixed_inside_the_template():
    # the unknown axis reaches the spec through the parameter `a`: replacing `a` in the template would be
    # wrong, so a fix, if any, edits the misspelt argument where it is written
    text = ("device gpu { memory = 80 GiB }\nlink nv { bandwidth = 300 GB/s }\n"
            "mesh m of 8 x gpu {\n    dp = 2 over nv\n    tp = 4 over nv\n}\n"
            "template mlp(a: axis) {\n    shard c_fc.weight : [_, a]\n}\n"
            "apply mlp(tpp) to h[0].mlp\n")
    diags = [d for d in check_text(text, "t.plan").diagnostics if d.code == "PL201"]
    assert diags
    for d in diags:
        for e in (d.fix.edits if d.fix is not None else ()):
            assert text[e.span.start:e.span.end] == "tpp"
