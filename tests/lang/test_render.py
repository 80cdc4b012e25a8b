"""Renderers over hand-built diagnostics: golden files for every format plus focused checks.

Regenerate the golden files with ``PLANLANG_UPDATE_GOLDEN=1 pytest tests/lang/test_render.py``
(and read the diff before committing it).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from planlang import __version__
from planlang.lang.codes import CODES, REPOSITORY_URL
from planlang.lang.diagnostics import Diagnostic, Label, Severity
from planlang.lang.render import FORMATS, render, summary_line
from planlang.lang.render.github import escape_data, escape_property
from planlang.lang.render.sarif import rule_descriptor
from planlang.lang.source import SourceFile, Span

from .github_anchors import heading_anchors

GOLDEN_DIR = Path(__file__).parent / "golden" / "render"
REPO = Path(__file__).resolve().parents[2]
DIAGNOSTICS_DOC_URL = f"{REPOSITORY_URL}/blob/main/docs/diagnostics.md"
UPDATE = os.environ.get("PLANLANG_UPDATE_GOLDEN") == "1"

MAIN_TEXT = (
    "use hardware\n"                                    # 1
    "\n"                                                # 2
    'model gpt2 = hub("gpt2")\n'                        # 3
    "\n"                                                # 4
    "mesh cluster of 8 x hardware.a100_80g {\n"         # 5
    "    pp = 2 over hardware.infiniband_200g\n"        # 6
    "    dp = 2\n"                                      # 7
    "    tp = 4\n"                                      # 8
    "}\n"                                               # 9
    "\n"                                                # 10
    "budget {\n"                                        # 11
    "\tmemory = 80GiB\t# per device\n"                  # 12
    "    steps = 1_000\n"                               # 13
    "}\n"                                               # 14
)                                                       # 15: empty, end of file
HW_TEXT = "device a100_80g {\n    memory = 80GiB\n}"  # no final newline

MAIN = SourceFile("plans/gpt.plan", MAIN_TEXT)
HW = SourceFile("plans/hw.plan", HW_TEXT)
GONE = "plans/gone.plan"  # never in `sources`
SOURCES = {MAIN.path: MAIN, HW.path: HW}


def sp(src: SourceFile | str, line: int, col: int, end_line: int, end_col: int) -> Span:
    if isinstance(src, str):
        return Span(src, line, col, end_line, end_col)
    return Span(src.path, line, col, end_line, end_col, src.offset(line, col), src.offset(end_line, end_col))


def eof(src: SourceFile) -> Span:
    n = len(src.text)
    return src.span(n, n)


def mesh_size() -> Diagnostic:
    primary = sp(MAIN, 5, 6, 5, 13)
    return Diagnostic(
        "PL301", Severity.ERROR, "mesh has 2 * 2 * 4 = 16 devices but 8 are declared", primary,
        labels=(
            Label(sp(MAIN, 6, 5, 6, 11), "this axis"),
            Label(primary, "16 devices"),
            Label(sp(MAIN, 8, 5, 8, 11), "and this one"),
        ),
        help="make the axis sizes multiply to 8, or change the device count",
        notes=("the mesh size is the product of its axis sizes",),
    )


def far_label() -> Diagnostic:  # a gap of several lines between labels -> `...`
    return Diagnostic(
        "PL302", Severity.WARNING, "model `gpt2` is never trained", sp(MAIN, 3, 7, 3, 11),
        labels=(Label(sp(MAIN, 13, 5, 13, 10), "no step uses it"),),
    )


def multi_file() -> Diagnostic:
    return Diagnostic(
        "PL210", Severity.WARNING, "device `a100_80g` has less memory than the budget asks for",
        sp(MAIN, 5, 21, 5, 38),
        labels=(
            Label(sp(HW, 2, 5, 2, 19), "declared here"),
            Label(sp(MAIN, 12, 11, 12, 16), "budget"),
        ),
        help="lower the budget or pick a larger device",
    )


def multi_line() -> Diagnostic:
    return Diagnostic(
        "PL120", Severity.ERROR, "mesh block is empty of links", sp(MAIN, 5, 1, 9, 2),
        labels=(Label(sp(MAIN, 5, 1, 9, 2), "this block"),),
    )


def end_of_file() -> list[Diagnostic]:
    return [
        Diagnostic(
            "PL101", Severity.ERROR, "unexpected end of file: expected `}`", eof(HW),
            labels=(Label(sp(HW, 1, 17, 1, 18), "this `{` is never closed"),),
            help="add the matching `}`",
        ),
        Diagnostic("PL103", Severity.NOTE, "file ends here", eof(MAIN)),
    ]


def tabs() -> Diagnostic:
    return Diagnostic(
        "PL401", Severity.WARNING, "memory budget `80GiB` equals the device memory", sp(MAIN, 12, 11, 12, 16),
        labels=(Label(sp(MAIN, 12, 17, 12, 29), "per device"), Label(sp(MAIN, 12, 2, 12, 8), "key")),
    )


def missing_file() -> Diagnostic:
    primary = sp(GONE, 4, 3, 4, 9)
    return Diagnostic(
        "PL900", Severity.NOTE, "imported from a file that could not be read", primary,
        labels=(
            Label(primary, "here"),
            Label(sp(GONE, 7, 1, 7, 4), "and here"),
            Label(sp(MAIN, 1, 1, 1, 4), "imported by this `use`"),
        ),
        notes=("the file was deleted or moved",),
    )


def same_line() -> list[Diagnostic]:
    return [
        Diagnostic(  # three non-overlapping marks on one line: connector rows
            "PL303", Severity.ERROR, "axis `pp` over a slow link", sp(MAIN, 6, 5, 6, 7),
            labels=(
                Label(sp(MAIN, 6, 5, 6, 7), "axis"),
                Label(sp(MAIN, 6, 10, 6, 11), "size 2"),
                Label(sp(MAIN, 6, 17, 6, 41), "200 Gb/s"),
            ),
        ),
        Diagnostic(  # overlapping marks: one row each
            "PL304", Severity.NOTE, "axis `dp` declared", sp(MAIN, 7, 5, 7, 11),
            labels=(Label(sp(MAIN, 7, 10, 7, 11), "size"),),
        ),
    ]


def all_diagnostics() -> list[Diagnostic]:
    diags = [
        mesh_size(), far_label(), multi_file(), multi_line(), *end_of_file(), tabs(), missing_file(),
        *same_line(),
    ]
    return diags[::-1]  # renderers sort; give them an unsorted list


def check_golden(name: str, actual: str) -> None:
    path = GOLDEN_DIR / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual, encoding="utf-8", newline="\n")
    assert path.exists(), f"missing golden file {path}; run with PLANLANG_UPDATE_GOLDEN=1"
    expected = path.read_text(encoding="utf-8")
    assert actual == expected, f"{name} differs from golden file (PLANLANG_UPDATE_GOLDEN=1 regenerates it)"


# ---- golden files ------------------------------------------------------------------------------

GOLDEN = [
    ("human", False, "human.txt"),
    ("human", True, "human_color.txt"),
    ("concise", False, "concise.txt"),
    ("json", False, "diagnostics.json"),
    ("sarif", False, "diagnostics.sarif"),
    ("github", False, "github.txt"),
]


@pytest.mark.parametrize("fmt,color,name", GOLDEN, ids=[g[2] for g in GOLDEN])
def test_golden(fmt, color, name):
    check_golden(name, render(all_diagnostics(), SOURCES, fmt, color=color))


@pytest.mark.parametrize("fmt", FORMATS)
def test_order_of_input_does_not_matter(fmt):
    diags = all_diagnostics()
    assert render(diags, SOURCES, fmt) == render(list(reversed(diags)), SOURCES, fmt)
    assert render(diags, SOURCES, fmt) == render(sorted(diags, key=lambda d: d.code), SOURCES, fmt)


def test_formats_and_unknown_format():
    assert FORMATS == ("human", "concise", "json", "sarif", "github")
    with pytest.raises(ValueError, match="unknown output format 'xml'"):
        render([], SOURCES, "xml")


def test_empty():
    assert render([], SOURCES, "human") == ""
    assert render([], SOURCES, "concise") == ""
    assert render([], SOURCES, "github") == ""
    assert json.loads(render([], SOURCES, "json")) == []
    sarif = json.loads(render([], SOURCES, "sarif"))
    assert sarif["runs"][0]["results"] == [] and sarif["runs"][0]["tool"]["driver"]["rules"] == []


def test_summary_line():
    assert summary_line([]) == "no problems"
    d = mesh_size()
    assert summary_line([d, d, d.with_severity(Severity.WARNING)]) == "2 errors, 1 warning"
    assert summary_line([d.with_severity(Severity.WARNING)]) == "1 warning"
    assert summary_line(all_diagnostics()) == "4 errors, 3 warnings, 3 notes"


def test_light_imports():
    code = (
        "import sys; import planlang.lang.render as r; "
        "from planlang.lang.render import human, concise, jsonfmt, sarif, github; "
        "bad = [m for m in ('torch', 'rich', 'lark', 'networkx') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# ---- human -------------------------------------------------------------------------------------

SPEC_TEXT = (
    "use hardware\n\nmodel gpt2 = hub(\"gpt2\")\n\n\n"
    "mesh cluster of 8 x hardware.a100_80g {\n"
    "    pp = 2 over hardware.infiniband_200g\n"
    "}\n"
)


def test_human_matches_the_documented_layout():
    src = SourceFile("examples/gpt2/gpt2_3d.plan", SPEC_TEXT)
    primary = sp(src, 6, 6, 6, 13)
    d = Diagnostic(
        "PL301", Severity.ERROR, "mesh has 2 * 2 * 4 = 16 devices but 8 are declared", primary,
        labels=(Label(primary, "16 devices"), Label(sp(src, 7, 5, 7, 11), "this axis")),
        help="make the axis sizes multiply to 8, or change the device count",
        notes=("the mesh size is the product of its axis sizes",),
    )
    assert render([d], {src.path: src}, "human") == (
        "error[PL301]: mesh has 2 * 2 * 4 = 16 devices but 8 are declared\n"
        "  --> examples/gpt2/gpt2_3d.plan:6:6\n"
        "   |\n"
        " 6 | mesh cluster of 8 x hardware.a100_80g {\n"
        "   |      ^^^^^^^ 16 devices\n"
        " 7 |     pp = 2 over hardware.infiniband_200g\n"
        "   |     ------ this axis\n"
        "   |\n"
        "   = help: make the axis sizes multiply to 8, or change the device count\n"
        "   = note: the mesh size is the product of its axis sizes\n"
    )


def test_human_primary_message_is_optional():
    d = Diagnostic("PL302", Severity.WARNING, "unused", sp(MAIN, 3, 7, 3, 11))
    assert render([d], SOURCES, "human") == (
        "warning[PL302]: unused\n"
        "  --> plans/gpt.plan:3:7\n"
        "   |\n"
        " 3 | model gpt2 = hub(\"gpt2\")\n"
        "   |       ^^^^\n"
    )


def test_human_gap_and_gutter_width():
    out = render([far_label()], SOURCES, "human")
    assert out == (
        "warning[PL302]: model `gpt2` is never trained\n"
        "   --> plans/gpt.plan:3:7\n"
        "    |\n"
        "  3 | model gpt2 = hub(\"gpt2\")\n"
        "    |       ^^^^\n"
        "...\n"
        " 13 |     steps = 1_000\n"
        "    |     ----- no step uses it\n"
    )


def test_human_one_line_gap_shows_the_line():
    out = render([mesh_size()], SOURCES, "human")
    assert " 7 |     dp = 2\n" in out and "..." not in out


def test_human_multi_line_span_underlines_to_end_of_first_line():
    out = render([multi_line()], SOURCES, "human")
    assert out == (
        "error[PL120]: mesh block is empty of links\n"
        "  --> plans/gpt.plan:5:1\n"
        "   |\n"
        " 5 | mesh cluster of 8 x hardware.a100_80g {\n"
        "   | " + "^" * len("mesh cluster of 8 x hardware.a100_80g {") + " this block\n"
    )


def test_human_span_at_end_of_file():
    hw_eof, main_eof = end_of_file()
    assert render([hw_eof], SOURCES, "human") == (
        "error[PL101]: unexpected end of file: expected `}`\n"
        "  --> plans/hw.plan:3:2\n"
        "   |\n"
        " 1 | device a100_80g {\n"
        "   |                 - this `{` is never closed\n"
        " 2 |     memory = 80GiB\n"
        " 3 | }\n"
        "   |  ^\n"
        "   |\n"
        "   = help: add the matching `}`\n"
    )
    assert render([main_eof], SOURCES, "human") == (
        "note[PL103]: file ends here\n"
        "   --> plans/gpt.plan:15:1\n"
        "    |\n"
        " 15 |\n"
        "    | ^\n"
    )


def test_human_tabs_expand_to_four_spaces_with_matching_marks():
    out = render([tabs()], SOURCES, "human")
    assert "\t" not in out
    lines = out.splitlines()
    assert lines[3] == " 12 |     memory = 80GiB    # per device"
    assert lines[4] == "    |     ------   ^^^^^    ------------ per device"
    assert lines[5] == "    |     |"
    assert lines[6] == "    |     key"
    text = lines[3][len(" 12 | "):]
    marks = lines[4][len("    | "):]
    assert text[marks.index("^"):marks.index("^") + 5] == "80GiB"
    assert text[marks.index("-"):marks.index("-") + 6] == "memory"


def test_human_wide_characters_keep_marks_aligned():
    src = SourceFile("w.plan", 'name = "模型" + x\n')
    d = Diagnostic("PL5", Severity.ERROR, "bad", sp(src, 1, 13, 1, 14))
    lines = render([d], {src.path: src}, "human").splitlines()
    assert lines[3] == ' 1 | name = "模型" + x'
    assert lines[4] == "   |               ^"


def test_human_same_line_labels():
    connected, overlapping = same_line()
    assert render([connected], SOURCES, "human") == (
        "error[PL303]: axis `pp` over a slow link\n"
        "  --> plans/gpt.plan:6:5\n"
        "   |\n"
        " 6 |     pp = 2 over hardware.infiniband_200g\n"
        "   |     ^^   -      ------------------------ 200 Gb/s\n"
        "   |     |    |\n"
        "   |     |    size 2\n"
        "   |     axis\n"
    )
    assert render([overlapping], SOURCES, "human") == (
        "note[PL304]: axis `dp` declared\n"
        "  --> plans/gpt.plan:7:5\n"
        "   |\n"
        " 7 |     dp = 2\n"
        "   |     ^^^^^^\n"
        "   |          - size\n"
    )


def test_human_labels_in_another_file_get_their_own_block():
    out = render([multi_file()], SOURCES, "human")
    assert out == (
        "warning[PL210]: device `a100_80g` has less memory than the budget asks for\n"
        "   --> plans/gpt.plan:5:21\n"
        "    |\n"
        "  5 | mesh cluster of 8 x hardware.a100_80g {\n"
        "    |                     ^^^^^^^^^^^^^^^^^\n"
        "...\n"
        " 12 |     memory = 80GiB    # per device\n"
        "    |              ----- budget\n"
        "    |\n"
        "   --> plans/hw.plan:2:5\n"
        "    |\n"
        "  2 |     memory = 80GiB\n"
        "    |     -------------- declared here\n"
        "    |\n"
        "    = help: lower the budget or pick a larger device\n"
    )


def test_human_file_missing_from_sources():
    out = render([missing_file()], SOURCES, "human")
    assert out == (
        "note[PL900]: imported from a file that could not be read\n"
        "  --> plans/gone.plan:4:3\n"
        "   |\n"
        "   = at 4:3: here\n"
        "   = at 7:1: and here\n"
        "   |\n"
        "  --> plans/gpt.plan:1:1\n"
        "   |\n"
        " 1 | use hardware\n"
        "   | --- imported by this `use`\n"
        "   |\n"
        "   = note: the file was deleted or moved\n"
    )
    # no sources at all: every block without an excerpt
    bare = render([mesh_size()], {}, "human")
    assert "|     " not in bare and "--> plans/gpt.plan:5:6" in bare


def test_human_color_only_when_asked():
    diags = all_diagnostics()
    assert "\x1b[" not in render(diags, SOURCES, "human")
    colored = render(diags, SOURCES, "human", color=True)
    assert "\x1b[1;31merror[PL301]\x1b[0m" in colored
    assert "\x1b[1;33mwarning[PL302]\x1b[0m" in colored
    assert "\x1b[1;36mnote[PL900]\x1b[0m" in colored
    assert "\x1b[1;34m  5 |\x1b[0m" in colored
    import re

    assert re.sub(r"\x1b\[[0-9;]*m", "", colored) == render(diags, SOURCES, "human")


# ---- concise / json ----------------------------------------------------------------------------

def test_concise():
    out = render([tabs(), mesh_size()], SOURCES, "concise")
    assert out == (
        "plans/gpt.plan:5:6: error[PL301] mesh has 2 * 2 * 4 = 16 devices but 8 are declared\n"
        "plans/gpt.plan:12:11: warning[PL401] memory budget `80GiB` equals the device memory\n"
    )


def test_json_fields_and_key_order():
    data = json.loads(render(all_diagnostics(), SOURCES, "json"))
    assert [d["code"] for d in data] == [
        "PL900", "PL302", "PL120", "PL301", "PL210", "PL303", "PL304", "PL401", "PL103", "PL101",
    ]
    first = data[0]
    assert list(first) == [
        "code", "severity", "message", "file", "line", "column", "end_line", "end_column",
        "labels", "help", "notes",
    ]
    assert list(first["labels"][0]) == ["file", "line", "column", "end_line", "end_column", "message"]
    mesh = next(d for d in data if d["code"] == "PL301")
    assert mesh["severity"] == "error" and (mesh["line"], mesh["column"], mesh["end_column"]) == (5, 6, 13)
    assert mesh["help"].startswith("make the axis") and mesh["notes"] == [
        "the mesh size is the product of its axis sizes"
    ]
    assert next(d for d in data if d["code"] == "PL302")["help"] is None


# ---- sarif -------------------------------------------------------------------------------------

def _is_pos_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def validate_sarif(doc: dict) -> None:
    """The parts of the SARIF 2.1.0 schema this output uses (jsonschema is not a dependency)."""
    assert doc["$schema"] == "https://json.schemastore.org/sarif-2.1.0.json"
    assert doc["version"] == "2.1.0"
    assert isinstance(doc["runs"], list) and len(doc["runs"]) == 1
    run = doc["runs"][0]
    driver = run["tool"]["driver"]
    assert driver["name"] == "planlang" and driver["version"] == __version__
    assert driver["informationUri"] == REPOSITORY_URL
    rule_ids = [r["id"] for r in driver["rules"]]
    assert len(rule_ids) == len(set(rule_ids))
    for rule in driver["rules"]:
        validate_rule(rule)
    assert run["columnKind"] in ("utf16CodeUnits", "unicodeCodePoints")

    def check_location(loc):
        phys = loc["physicalLocation"]
        art = phys["artifactLocation"]
        assert isinstance(art["uri"], str) and "\\" not in art["uri"] and not art["uri"].startswith("/")
        if "uriBaseId" in art:
            assert art["uriBaseId"] == "%SRCROOT%"
        region = phys["region"]
        for key in ("startLine", "startColumn", "endLine", "endColumn"):
            assert _is_pos_int(region[key]), (key, region)
        assert (region["endLine"], region["endColumn"]) >= (region["startLine"], region["startColumn"])

    for result in run["results"]:
        assert result["ruleId"] in rule_ids
        assert rule_ids[result["ruleIndex"]] == result["ruleId"]
        assert result["level"] in ("error", "warning", "note", "none")
        assert isinstance(result["message"]["text"], str) and result["message"]["text"]
        assert len(result["locations"]) == 1
        check_location(result["locations"][0])
        ids = set()
        for rel in result.get("relatedLocations", []):
            check_location(rel)
            assert _is_pos_int(rel["id"] + 1) and rel["id"] not in ids
            ids.add(rel["id"])
            if "message" in rel:
                assert isinstance(rel["message"]["text"], str)
        fps = result["partialFingerprints"]
        assert fps and all(isinstance(v, str) and v for v in fps.values())


def _text(message: dict) -> str:
    """A multiformatMessageString: `text` is required, `markdown` optional; both non-empty strings."""
    assert set(message) <= {"text", "markdown"}
    assert isinstance(message["text"], str) and message["text"].strip()
    if "markdown" in message:
        assert isinstance(message["markdown"], str) and message["markdown"].strip()
    return message["text"]


def validate_rule(rule: dict) -> None:
    """A reportingDescriptor with every field planlang fills in."""
    assert set(rule) <= {"id", "name", "shortDescription", "fullDescription", "help", "helpUri",
                         "defaultConfiguration"}
    assert isinstance(rule["id"], str) and rule["id"]
    _text(rule["shortDescription"])
    _text(rule["fullDescription"])
    _text(rule["help"])
    assert "markdown" in rule["help"]
    entry = CODES.get(rule["id"])
    if entry is not None:
        assert rule["helpUri"] == f"{DIAGNOSTICS_DOC_URL}#{rule['id'].lower()}"
        assert rule["name"] == entry.name
    else:
        assert rule["helpUri"] == DIAGNOSTICS_DOC_URL and "name" not in rule
    assert rule["defaultConfiguration"]["level"] in ("error", "warning", "note", "none")


def test_sarif_structure():
    doc = json.loads(render(all_diagnostics(), SOURCES, "sarif"))
    validate_sarif(doc)
    run = doc["runs"][0]
    assert [r["id"] for r in run["tool"]["driver"]["rules"]] == sorted(
        {d.code for d in all_diagnostics()}
    )
    mesh = next(r for r in run["results"] if r["ruleId"] == "PL301")
    assert mesh["level"] == "error"
    assert mesh["message"]["text"].startswith("mesh has 2 * 2 * 4 = 16 devices but 8 are declared\nhelp: ")
    assert mesh["locations"][0]["physicalLocation"] == {
        "artifactLocation": {"uri": "plans/gpt.plan", "uriBaseId": "%SRCROOT%"},
        "region": {"startLine": 5, "startColumn": 6, "endLine": 5, "endColumn": 13},
    }
    assert [r["message"]["text"] for r in mesh["relatedLocations"]] == ["this axis", "16 devices", "and this one"]
    levels = {r["ruleId"]: r["level"] for r in run["results"]}
    assert levels["PL302"] == "warning" and levels["PL900"] == "note"


def test_sarif_rule_titles_and_default_level():
    """Titles come from the table of codes; `rule_titles` (what the CLI passes) only names codes it lacks."""
    d = mesh_size()
    unknown = Diagnostic("PL999", Severity.NOTE, "m", d.span)
    doc = json.loads(render([d, d.with_severity(Severity.WARNING), unknown], SOURCES, "sarif",
                            rule_titles={"PL301": "mesh size mismatch", "PL999": "a code of another version"}))
    validate_sarif(doc)
    rule, other = doc["runs"][0]["tool"]["driver"]["rules"]
    assert rule["shortDescription"]["text"] == CODES["PL301"].title
    assert rule["defaultConfiguration"]["level"] == "error"
    assert other["shortDescription"]["text"] == "a code of another version"
    assert [r["level"] for r in doc["runs"][0]["results"]] == ["error", "warning", "note"]
    same = {c: e.title for c, e in CODES.items()}  # what the CLI passes: redundant, changes nothing
    assert render([d], SOURCES, "sarif", rule_titles=same) == render([d], SOURCES, "sarif")


def test_sarif_rules_are_described_from_the_table():
    diags = [
        mesh_size(),                                                                     # PL301 error
        Diagnostic("PL218", Severity.WARNING, "unused use", sp(MAIN, 1, 1, 1, 13)),       # warning
        Diagnostic("PL253", Severity.NOTE, "decimal unit", sp(MAIN, 12, 11, 12, 16)),     # note
        Diagnostic("PL101", Severity.ERROR, "unexpected token", sp(MAIN, 3, 1, 3, 6)),    # syntax
        Diagnostic("PL362", Severity.ERROR, "not divisible", sp(MAIN, 8, 5, 8, 11)),      # model-aware
    ]
    doc = json.loads(render(diags, SOURCES, "sarif"))
    validate_sarif(doc)
    rules = {r["id"]: r for r in doc["runs"][0]["tool"]["driver"]["rules"]}
    assert sorted(rules) == ["PL101", "PL218", "PL253", "PL301", "PL362"]
    for code, rule in rules.items():
        entry = CODES[code]
        one_paragraph = " ".join(entry.explanation.split("\n"))
        assert rule["name"] == entry.name
        assert rule["shortDescription"] == {"text": entry.title}
        assert rule["fullDescription"] == {"text": one_paragraph}
        assert rule["helpUri"] == f"{REPOSITORY_URL}/blob/main/docs/diagnostics.md#{code.lower()}"
        text, md = rule["help"]["text"], rule["help"]["markdown"]
        for body in (text, md):
            assert one_paragraph in body and entry.title in body
            assert f"planlang explain {code}" in body and rule["helpUri"] in body
        assert "How to fix:" in text and "#### How to fix" in md
        assert f"]({rule['helpUri']})" in md  # a markdown link to the entry
    assert "planlang check --model PLAN" in rules["PL362"]["help"]["markdown"]
    assert "planlang check PLAN" in rules["PL301"]["help"]["markdown"]
    assert "cannot be suppressed" in rules["PL101"]["help"]["text"]
    for code in ("PL218", "PL253"):  # warnings and notes may be meant: say how to suppress them
        assert f"`# plan: ignore[{code}]`" in rules[code]["help"]["markdown"]
        assert f"`# plan: ignore-file[{code}]`" in rules[code]["help"]["markdown"]


def test_sarif_every_code_of_the_table_gets_a_full_rule():
    for code, entry in CODES.items():
        rule = rule_descriptor(code, entry.severity.value)
        validate_rule(rule)
        assert rule["shortDescription"]["text"] == entry.title


def test_sarif_help_uris_reach_the_headings_of_the_docs():
    """helpUri is `<repo>/blob/main/docs/diagnostics.md#plxxx`: the file exists in this repository and its
    `### PLxxx` heading gets exactly that anchor when GitHub renders it."""
    doc = REPO / "docs" / "diagnostics.md"
    anchors = heading_anchors(doc.read_text(encoding="utf-8"))
    for code, entry in CODES.items():
        uri = rule_descriptor(code, "error")["helpUri"]
        base, _, fragment = uri.partition("#")
        assert base == f"{REPOSITORY_URL}/blob/main/docs/diagnostics.md"
        assert (REPO / base.removeprefix(f"{REPOSITORY_URL}/blob/main/")).is_file()
        assert fragment in anchors, f"{code}: no heading with anchor #{fragment} in docs/diagnostics.md"
    assert "planlang.dev" not in json.dumps(json.loads(render([mesh_size()], SOURCES, "sarif")))


def test_sarif_fingerprints_are_stable_and_position_independent():
    a = mesh_size()
    moved = Diagnostic(a.code, a.severity, a.message, sp(MAIN, 6, 1, 6, 3))
    other = Diagnostic(a.code, a.severity, "another message", a.span)
    fp = lambda d: json.loads(render([d], SOURCES, "sarif"))["runs"][0]["results"][0]["partialFingerprints"]
    assert fp(a) == fp(a) == fp(moved)
    assert fp(a) != fp(other)


def test_sarif_uris_are_relative_posix():
    d = Diagnostic("PL1", Severity.ERROR, "m", Span("plans\\sub dir\\x.plan", 1, 1, 1, 2))
    doc = json.loads(render([d], {}, "sarif"))
    art = doc["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]
    assert art == {"uri": "plans/sub%20dir/x.plan", "uriBaseId": "%SRCROOT%"}


def test_sarif_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    inside = Diagnostic("PL1", Severity.ERROR, "m", Span(str(tmp_path / "a" / "x.plan"), 1, 1, 1, 2))
    outside = Diagnostic("PL1", Severity.ERROR, "m", Span("/elsewhere/y.plan", 1, 1, 1, 2))
    doc = json.loads(render([inside, outside], {}, "sarif"))
    arts = [r["locations"][0]["physicalLocation"]["artifactLocation"] for r in doc["runs"][0]["results"]]
    assert {"uri": "file:///elsewhere/y.plan"} in arts
    assert {"uri": "a/x.plan", "uriBaseId": "%SRCROOT%"} in arts


# ---- github ------------------------------------------------------------------------------------

def test_github_escaping_helpers():
    assert escape_data("100% done\r\nnext: a, b") == "100%25 done%0D%0Anext: a, b"
    assert escape_property("a:b,c%d\ne") == "a%3Ab%2Cc%25d%0Ae"


def test_github_command():
    assert render([mesh_size()], SOURCES, "github") == (
        "::error file=plans/gpt.plan,line=5,col=6,endLine=5,endColumn=13,title=PL301::"
        "mesh has 2 * 2 * 4 = 16 devices but 8 are declared"
        "%0Ahelp: make the axis sizes multiply to 8, or change the device count\n"
    )


def test_github_severities_and_escaping_in_output():
    d = Diagnostic(
        "PL9", Severity.NOTE, "50% of: a,b\nsecond line", Span("dir,odd:name.plan", 2, 3, 2, 4),
        help="use 100%",
    )
    assert render([d], {}, "github") == (
        "::notice file=dir%2Codd%3Aname.plan,line=2,col=3,endLine=2,endColumn=4,title=PL9::"
        "50%25 of: a,b%0Asecond line%0Ahelp: use 100%25\n"
    )
    w = d.with_severity(Severity.WARNING)
    assert render([w], {}, "github").startswith("::warning ")


def test_github_multi_line_span_is_annotated_on_its_first_line():
    """The runner drops an annotation with columns over several lines (actions/runner#4167): a span over
    lines 5-9 is annotated from its column to the end of line 5 (endColumn only when the source is known)."""
    out = render([multi_line()], SOURCES, "github")
    width = len("mesh cluster of 8 x hardware.a100_80g {")
    assert out == (f"::error file=plans/gpt.plan,line=5,col=1,endLine=5,endColumn={width + 1},title=PL120::"
                   "mesh block is empty of links\n")
    assert render([multi_line()], {}, "github") == (
        "::error file=plans/gpt.plan,line=5,col=1,endLine=5,title=PL120::mesh block is empty of links\n")


# ---- invisible characters and long lines -------------------------------------------------------

LONG_LINE = "stage " + "h[0], " * 5000 + "h[1]"  # 30,010 characters
ODD_TEXT = (
    "\ufeffuse hardware\n"                         # 1: a byte order mark first
    "mesh m\u200bain of 8 x gpu {\n"               # 2: a zero-width space inside a name
    "    tp = 8 # \u202eevil\u202c\n"              # 3: a bidi override in a comment
    "budget\x00 80 GiB\x1b[31m\n"                  # 4: NUL, an ANSI escape
    "model\u00a0m = \"x\"\u2028\n"                 # 5: a no-break space, a line separator
    + LONG_LINE + "\n"                             # 6
    "\tx\u0085 = 1\n"                              # 7: a tab and a C1 control (NEL)
)
ODD = SourceFile("plans/odd.plan", ODD_TEXT)
ODD_SOURCES = {ODD.path: ODD}
N6 = len(LONG_LINE)


def odd_diagnostics() -> list[Diagnostic]:
    s = lambda *a: sp(ODD, *a)  # noqa: E731
    return [
        Diagnostic("PL102", Severity.ERROR, "unexpected character `\ufeff`", s(1, 1, 1, 2)),
        Diagnostic("PL102", Severity.ERROR, "unexpected character `\u200b`", s(2, 7, 2, 8),
                   labels=(Label(s(2, 6, 2, 11), "name `m\u200bain`"),)),
        Diagnostic("PL999", Severity.WARNING, "bidi control \u202e in a comment", s(3, 14, 3, 15),
                   labels=(Label(s(3, 14, 3, 15), "reorders the text after it"),)),
        Diagnostic("PL102", Severity.ERROR, "unexpected character `\x00`", s(4, 7, 4, 8),
                   labels=(Label(s(4, 16, 4, 21), "escape \x1b[31m"),), help="remove it\x1b[0m"),
        Diagnostic("PL102", Severity.ERROR, "unexpected character `\u00a0`", s(5, 6, 5, 7),
                   notes=("the line ends in \u2028",)),
        Diagnostic("PL408", Severity.ERROR, "in the middle of a long line", s(6, 15001, 6, 15005),
                   labels=(Label(s(6, 7, 6, 11), "far left"), Label(s(6, N6 - 3, 6, N6 + 1), "far right"))),
        Diagnostic("PL408", Severity.NOTE, "at the start of a long line", s(6, 1, 6, 6)),
        Diagnostic("PL408", Severity.NOTE, "at the end of a long line", s(6, N6 - 3, 6, N6 + 1)),
        Diagnostic("PL120", Severity.ERROR, "over two lines, the first long", s(6, 1, 7, 3)),
        Diagnostic("PL102", Severity.ERROR, "unexpected character `\x85`", s(7, 3, 7, 4)),
    ]


RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u00a0\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")

ODD_GOLDEN = [("human", "odd_human.txt"), ("concise", "odd_concise.txt"), ("github", "odd_github.txt")]


@pytest.mark.parametrize("fmt,name", ODD_GOLDEN, ids=[g[1] for g in ODD_GOLDEN])
def test_golden_invisible_characters_and_long_lines(fmt, name):
    out = render(odd_diagnostics(), ODD_SOURCES, fmt)
    assert not RAW.search(out.replace("\n", "")), "a control or format character is shown raw"
    check_golden(name, out)


def _excerpt_rows(out: str) -> list[str]:
    return [line for line in out.splitlines() if re.match(r" +\d+ \| ", line)]


def _row_and_marks(out: str) -> tuple[str, str]:
    lines = out.splitlines()
    i = next(i for i, line in enumerate(lines) if re.match(r" +\d+ \| ", line))
    gutter = lines[i].index("| ") + 2
    return lines[i][gutter:], lines[i + 1][gutter:]


@pytest.mark.parametrize("ch,shown", [
    ("\x00", "\\x00"), ("\x07", "\\x07"), ("\x1b", "\\x1b"), ("\x7f", "\\x7f"), ("\x85", "\\x85"),
    ("\r", "\\x0d"), ("\ufeff", "\\ufeff"), ("\u200b", "\\u200b"), ("\u200d", "\\u200d"), ("\u2060", "\\u2060"),
    ("\u00ad", "\\xad"), ("\u202e", "\\u202e"), ("\u2066", "\\u2066"), ("\u200f", "\\u200f"), ("\u061c", "\\u061c"),
    ("\u2028", "\\u2028"), ("\u2029", "\\u2029"), ("\u00a0", "\\xa0"), ("\u3000", "\\u3000"),
    ("\U000e0041", "\\U000e0041"), ("\ue000", "\\ue000"), ("\u0378", "\\u0378"),
])
def test_human_escapes_invisible_characters_and_underlines_them(ch, shown):
    src = SourceFile("c.plan", f"budget{ch} 8 GiB\n")
    d = Diagnostic("PL102", Severity.ERROR, f"unexpected character `{ch}`", sp(src, 1, 7, 1, 8),
                   labels=(Label(sp(src, 1, 9, 1, 10), "after"),))
    out = render([d], {src.path: src}, "human")
    assert ch not in out
    row, marks = _row_and_marks(out)
    assert row == f"budget{shown} 8 GiB"
    assert marks.startswith(" " * 6 + "^" * len(shown) + " -")  # the escape is underlined, what follows aligns
    assert row[marks.index("-")] == "8"
    assert f"error[PL102]: unexpected character `{shown}`" in out


@pytest.mark.parametrize("ch", ["a", "é", "模", "\u0301", "\t", "→", "\ufffd", "\U0001f600"])
def test_human_shows_printing_characters_as_they_are(ch):
    src = SourceFile("c.plan", f"x{ch}y\n")
    out = render([Diagnostic("PL1", Severity.ERROR, "m", sp(src, 1, 3, 1, 4))], {src.path: src}, "human")
    assert _row_and_marks(out)[0] == f"x{ch}y".replace("\t", "    ")


def test_messages_are_escaped_in_text_formats_and_kept_in_data_formats():
    d = odd_diagnostics()[3]  # NUL in the message, ESC in a label and in the help
    human = render([d], ODD_SOURCES, "human")
    assert "\x1b" not in human and "\x00" not in human
    assert "`\\x00`" in human and "escape \\x1b[31m" in human and "help: remove it\\x1b[0m" in human
    assert "`\\x00`" in render([d], ODD_SOURCES, "concise")
    assert "`\\x00`" in render([d], ODD_SOURCES, "github")
    data = json.loads(render([d], ODD_SOURCES, "json"))[0]
    assert data["message"] == "unexpected character `\x00`" and data["help"] == "remove it\x1b[0m"
    sarif = json.loads(render([d], ODD_SOURCES, "sarif"))
    assert sarif["runs"][0]["results"][0]["message"]["text"].startswith("unexpected character `\x00`")


def test_concise_keeps_one_line_per_diagnostic():
    d = Diagnostic("PL1", Severity.ERROR, "two\nlines\r", sp(MAIN, 1, 1, 1, 2))
    assert render([d], SOURCES, "concise") == "plans/gpt.plan:1:1: error[PL1] two\\nlines\\x0d\n"


def test_human_long_line_shows_a_window_around_the_span():
    from planlang.lang.render._common import MAX_LINE

    d = odd_diagnostics()[5]
    out = render([d], ODD_SOURCES, "human")
    rows = _excerpt_rows(out)
    assert len(rows) == 1 and len(out) < 1000
    row, marks = _row_and_marks(out)
    assert row.startswith("...") and row.endswith("...")
    assert len(row) <= MAX_LINE + 6
    caret = marks.index("^")
    assert marks.count("^") == 4 and row[caret:caret + 4] == LONG_LINE[15000:15004]
    assert marks.startswith("-")  # the label left of the window points at the leading ellipsis
    assert marks.rstrip().endswith("--- far right")  # the one right of it at the trailing ellipsis
    assert marks.index("---") == len(row) - 3


def test_human_long_line_window_at_its_start_and_end():
    start, end = odd_diagnostics()[6:8]
    row, marks = _row_and_marks(render([start], ODD_SOURCES, "human"))
    assert row.startswith("stage h[0]") and row.endswith("...") and marks == "^^^^^"
    row, marks = _row_and_marks(render([end], ODD_SOURCES, "human"))
    assert row.startswith("...") and row.endswith(", h[1]")
    assert row[marks.index("^"):] == "h[1]" and marks.count("^") == 4


def test_human_window_counts_columns_of_wide_characters_and_escapes():
    from planlang.lang.render._common import MAX_LINE, text_width

    for filler in ("模", "\u200b", "\t"):
        text = "x = " + filler * 20000 + " ?"
        src = SourceFile("w.plan", text)
        d = Diagnostic("PL1", Severity.ERROR, "m", sp(src, 1, 20006, 1, 20007))
        row, marks = _row_and_marks(render([d], {src.path: src}, "human"))
        assert row.startswith("...") and row.endswith("?")
        assert text_width(row) <= MAX_LINE + 3 and len(row) <= MAX_LINE + 3
        assert marks.endswith("^") and len(marks) == text_width(row)  # the caret is under the `?`


def test_human_window_cuts_a_run_of_combining_marks():
    """Combining marks take no column; the window still counts each as one, or a 30,000-mark line would
    be shown whole (found by bench/fuzz.py)."""
    from planlang.lang.render._common import MAX_LINE

    src = SourceFile("m.plan", "x = a" + "\u0301" * 30000 + " ?")
    d = Diagnostic("PL1", Severity.ERROR, "m", sp(src, 1, 30007, 1, 30008))
    row, marks = _row_and_marks(render([d], {src.path: src}, "human"))
    assert row.startswith("...") and row.endswith("?") and len(row) <= MAX_LINE + 3
    assert marks.endswith("^")


def test_human_span_past_the_end_of_a_cut_line():
    src = SourceFile("e.plan", "a" * 1000)
    d = Diagnostic("PL104", Severity.ERROR, "end", src.span(1000, 1000))
    row, marks = _row_and_marks(render([d], {src.path: src}, "human"))
    assert row.startswith("...") and not row.endswith("...") and marks == " " * len(row) + "^"


def test_github_always_has_col():
    out = render(all_diagnostics() + odd_diagnostics(), {**SOURCES, **ODD_SOURCES}, "github")
    assert out and all(",col=" in line for line in out.splitlines())
    assert render(all_diagnostics(), {}, "github").count(",col=") == len(all_diagnostics())
