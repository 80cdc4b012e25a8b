"""The golden corpus of invalid plans (tests/lang/corpus/invalid/*.plan).

Each corpus file targets one diagnostic code (or one class of syntax error) and states what the
checker must report in header comments at the top of the file:

    # expect: PL305 14:13                   a diagnostic in this file, at line:column of its primary span
    # expect: PL204 lib/cycle_b.plan:2:1    a diagnostic in another file (path relative to this file)

The test checks the file and compares the set of (file, code, line, column) of *all* diagnostics
(errors, warnings and notes, in any file) with the set of `expect` lines: nothing may be missing and
nothing extra may appear. Helper modules for the `use` tests live in `corpus/invalid/lib/`; they are
not test cases themselves (only `corpus/invalid/*.plan` is collected).

Also here: every registered code has at least one corpus file; suppression comments; and the
human-rendering snapshots in `golden/human/` (regenerate with ``PLANLANG_UPDATE_GOLDEN=1`` and read
the diff before committing it).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from planlang.lang.codes import CODES
from planlang.lang.diagnostics import Severity
from planlang.lang.render import render
from planlang.plan.checker import check_file, check_text

REPO = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).resolve().parent / "corpus" / "invalid"
CORPUS_REL = CORPUS.relative_to(REPO)  # checked through relative paths, so output is stable
GOLDEN_HUMAN = Path(__file__).resolve().parent / "golden" / "human"
UPDATE = os.environ.get("PLANLANG_UPDATE_GOLDEN") == "1"

CORPUS_FILES = sorted(CORPUS.glob("*.plan"))

_EXPECT = re.compile(r"^#\s*expect:\s*(PL\d{3})\s+(?:(\S+):)?(\d+):(\d+)\s*$")


def expectations(path: Path) -> set[tuple[str, str, int, int]]:
    """(file relative to the corpus, code, line, column) from the header comments of `path`."""
    out = set()
    for raw in path.read_bytes().decode("utf-8", errors="replace").splitlines():  # PL105 is not UTF-8
        line = raw.strip()
        if not line.startswith("#"):
            break  # the header ends at the first line that is not a comment
        if re.match(r"^#\s*expect:", line):
            m = _EXPECT.match(line)
            assert m, f"{path.name}: malformed expect line {raw!r}"
            code, other, ln, col = m.groups()
            target = (path.parent / other) if other else path
            out.add((_corpus_key(target), code, int(ln), int(col)))
    return out


def _corpus_key(path: str | Path) -> str:
    p = Path(path)
    if not p.is_absolute():
        p = REPO / p
    return os.path.relpath(os.path.realpath(p), os.path.realpath(CORPUS))


@pytest.fixture
def at_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)


def check_corpus(name: str):
    return check_file(str(CORPUS_REL / name))


# ------------------------------------------------------------------------------------------ the corpus
def test_corpus_is_big_enough():
    assert len(CORPUS_FILES) >= 45


@pytest.mark.parametrize("path", CORPUS_FILES, ids=[p.name for p in CORPUS_FILES])
def test_corpus_file(path: Path, at_repo_root):
    expected = expectations(path)
    assert expected, f"{path.name} has no `# expect:` lines"
    result = check_corpus(path.name)
    got = {(_corpus_key(d.span.file), d.code, d.span.line, d.span.col) for d in result.diagnostics}
    listing = "\n".join(f"  {d}" for d in result.diagnostics) or "  (none)"
    assert got == expected, f"{path.name}: diagnostics differ from the expect lines; the checker said:\n{listing}"
    for d in result.diagnostics:
        assert d.code in CODES, f"{d.code} is not in the registry"
        assert d.severity is CODES[d.code].severity, f"{d}: severity differs from the registry's"
        assert d.message.strip(), f"{d}: empty message"


def test_syntax_files_report_only_syntax_errors(at_repo_root):
    for path in CORPUS_FILES:
        if path.name.startswith("syntax_"):
            codes = {code for _, code, _, _ in expectations(path)}
            assert codes and all(c.startswith("PL1") for c in codes), path.name


def test_recovery_reports_two_syntax_errors():
    two = [p for p in CORPUS_FILES if p.name.startswith("syntax_")
           and len({ln for _, _, ln, _ in expectations(p)}) >= 2]
    assert len(two) >= 4, "several syntax-error files should show that recovery reports both errors"


def _pristine_codes() -> set[str]:
    """The codes of `planlang.lang.codes` as imported on its own (the table is complete without any layer above)."""
    out = subprocess.run(
        [sys.executable, "-c", "import json; from planlang.lang.codes import CODES; print(json.dumps(sorted(CODES)))"],
        capture_output=True, text=True, check=True, cwd=REPO,
    )
    return set(json.loads(out.stdout))


def _runtime_only_codes() -> set[str]:
    """Codes only planlang/runtime reports (under torchrun, e.g. PL390 of compile=True), quoted nowhere
    else in the package: no checked plan can yield them."""
    pkg = REPO / "planlang"

    def quoted(paths) -> set[str]:
        return {c for p in paths for c in re.findall(r'"(PL\d{3})"', p.read_text(encoding="utf-8"))}

    runtime = quoted((pkg / "runtime").rglob("*.py"))
    return runtime - quoted(p for p in pkg.rglob("*.py") if "runtime" not in p.parts and p != pkg / "lang" / "codes.py")


def test_every_code_has_a_corpus_file():
    covered = set()
    for path in CORPUS_FILES:
        covered |= {code for _, code, _, _ in expectations(path)}
    codes = _pristine_codes()
    assert codes <= set(CODES)
    # model-aware codes (x60–x89) need the model; the corpus is checked without one, so cannot report them;
    # nor the runtime's own
    codes = {c for c in codes if not CODES[c].model_aware} - _runtime_only_codes()
    missing = sorted(codes - covered)
    assert not missing, f"codes without a corpus file in {CORPUS_REL}: {', '.join(missing)}"
    unknown = sorted(covered - set(CODES))
    assert not unknown, f"corpus files expect codes that are not registered: {', '.join(unknown)}"


def test_every_severity_is_exercised():
    sev = {CODES[code].severity for p in CORPUS_FILES for _, code, _, _ in expectations(p)}
    assert sev == {Severity.ERROR, Severity.WARNING, Severity.NOTE}


def test_lib_modules_are_not_test_cases():
    assert all(p.parent == CORPUS for p in CORPUS_FILES)
    assert (CORPUS / "lib").is_dir() and not any(p.parent.name == "lib" for p in CORPUS_FILES)


# ------------------------------------------------------------------------------------------ suppression
_MESH = """\
device gpu { memory = 80 GiB }
link nv { bandwidth = 300 GB/s }
mesh m of 8 x gpu {
    dp = 2 over nv
    tp = 4{tp_comment}
}
"""


def _mesh_plan(tp_comment: str = "", before: str = "", after: str = "") -> str:
    body = _MESH.replace("{tp_comment}", tp_comment)
    if before:
        body = body.replace("    tp = 4", before + "\n    tp = 4")
    return body + after


def _codes(text: str):
    res = check_text(text, "suppress.plan")
    return [(d.code, d.span.line) for d in res.diagnostics], res


def test_unsuppressed_baseline():
    codes, res = _codes(_mesh_plan())
    assert codes == [("PL309", 5)]
    assert res.suppressed == 0 and res.warnings == 1


def test_suppress_same_line():
    codes, res = _codes(_mesh_plan("  # plan: ignore[PL309]"))
    assert codes == []
    assert res.suppressed == 1


def test_suppress_own_line_before():
    codes, res = _codes(_mesh_plan(before="    # plan: ignore[PL309]"))
    assert codes == []
    assert res.suppressed == 1


def test_suppress_own_line_skips_further_comment_lines():
    codes, _ = _codes(_mesh_plan(before="    # plan: ignore[PL309]\n    # the tensor-parallel axis"))
    assert codes == []


def test_suppress_whole_file():
    codes, res = _codes(_mesh_plan(after="# plan: ignore-file[PL309]\n"))
    assert codes == []
    assert res.suppressed == 1


def test_suppress_several_codes_and_lowercase():
    assert _codes(_mesh_plan("  # plan: ignore[PL201, PL309]"))[0] == []
    assert _codes(_mesh_plan("  # plan: ignore[pl309]"))[0] == []


@pytest.mark.parametrize("comment", [
    "  # plan: ignore[PL201]",
    "  # plan: ignore-file[PL201]",
    "  # ignore[PL309]",  # not a suppression comment: the `plan:` prefix is required
])
def test_suppression_of_another_code_does_not_hide(comment):
    codes, res = _codes(_mesh_plan(comment))
    assert codes == [("PL309", 5)]
    assert res.suppressed == 0


def test_suppression_of_another_code_own_line_and_file():
    assert _codes(_mesh_plan(before="    # plan: ignore[PL201]"))[0] == [("PL309", 6)]
    assert _codes(_mesh_plan(after="# plan: ignore-file[PL301]\n"))[0] == [("PL309", 5)]


def test_suppression_covers_only_its_line():
    text = _mesh_plan().replace("dp = 2 over nv", "dp = 2 over nv  # plan: ignore[PL309]")
    assert _codes(text)[0] == [("PL309", 5)]


def test_suppressing_an_error():
    text = _mesh_plan().replace("tp = 4", "tp = 4 over nv") + "shard w : [_, tq]\n"
    codes, res = _codes(text)
    assert codes == [("PL201", 7)] and res.errors == 1
    codes, res = _codes(text.replace("[_, tq]", "[_, tq]  # plan: ignore[PL201]"))
    assert codes == [] and res.errors == 0 and res.suppressed == 1


def test_unresolved_link_is_not_also_a_missing_link(at_repo_root):
    # `over nvlink` with nvlink undeclared is PL202 only: the axis does name a link (no follow-on PL309)
    res = check_corpus("pl202_unknown_link.plan")
    assert [d.code for d in res.diagnostics] == ["PL202"]
    assert res.suppressed == 0


def test_syntax_errors_cannot_be_suppressed():
    codes, res = _codes("# plan: ignore-file[PL101]\nmodle net = \"a:b\"\n")
    assert codes == [("PL101", 2)] and res.suppressed == 0


# ------------------------------------------------------------------------------------------ human snapshots
HUMAN_SNAPSHOTS = [
    "syntax_colon_for_equals.plan",     # two syntax errors, both reported
    "syntax_keyword_typo_two.plan",     # two keyword typos, with did-you-mean help
    "pl301_mesh_size_mismatch.plan",
    "pl305_batch_not_divisible.plan",
    "pl201_unknown_axis.plan",          # did you mean `tp`?
    "pl206_template_arity.plan",        # label in another file (lib/templates.plan)
    "pl405_checkpoint_crosses_stage.plan",
    "pl501_budget_exceeds_device.plan",
    "pl250_unknown_unit.plan",
    "syntax_unclosed_brace_before_statement.plan",  # one error at the `{`, none per later line
    "syntax_missing_comma_wrapped.plan",            # missing `,` before `hidden`
    "pl225_bidi_control.plan",                      # the bidi character shown escaped
    "pl418_stage_degrees_not_run.plan",             # the stage whose positions hold other rows
    "pl305_stage_batch_not_divisible.plan",         # in stage 0, labelled with its degrees
]


@pytest.mark.parametrize("name", HUMAN_SNAPSHOTS)
def test_human_snapshot(name: str, at_repo_root):
    result = check_corpus(name)
    assert result.diagnostics
    out = render(result.diagnostics, result.sources, "human", color=False)
    golden = GOLDEN_HUMAN / (Path(name).stem + ".txt")
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(out, encoding="utf-8")
    assert golden.is_file(), f"missing snapshot {golden}; run with PLANLANG_UPDATE_GOLDEN=1"
    assert out == golden.read_text(encoding="utf-8")
    assert str(REPO) not in out  # paths are relative to the repository root
