"""planlang diagnostics -> LSP diagnostics (planlang.lsp.diagnostics)."""
from pathlib import Path

from lsprotocol import types as L

from planlang.lsp.diagnostics import to_lsp
from planlang.lsp.positions import UTF8


MESH = "use hardware\nmesh m of 4 x hardware.cpu {\n    dp = 4\n}\n"


def test_range_is_exact_in_utf16_after_astral_characters(plan_in):
    text = MESH + 'model m = "pkg😀é.model:build"; input x : f32[b = 8]; data x : [dq, _]\n'
    a = plan_in(text)
    (d,) = [d for d in to_lsp(a) if d.code == "PL201"]
    line = text.split("\n")[4]
    col = line.index("dq")
    # everything before `dq` counts one UTF-16 unit per character, the emoji two
    assert d.range == L.Range(L.Position(4, col + 1), L.Position(4, col + 3))
    (d8,) = [d for d in to_lsp(a, encoding=UTF8) if d.code == "PL201"]
    assert d8.range.start.character == len(line[:col].encode("utf-8"))
    assert d.severity == L.DiagnosticSeverity.Error and d.source == "planlang"
    assert d.code_description.href.endswith("docs/diagnostics.md#pl201")
    assert Path(d.code_description.href.split("#")[0].removeprefix("file://")).is_file()
    assert "help: did you mean `dp`?" in d.message


def test_syntax_error_range(plan_in):
    text = "use hardware\nmesh m of 4 x hardware.cpu {\n    dp = 2 tp = 2\n}\n"
    a = plan_in(text)
    (d,) = to_lsp(a)
    assert d.code == "PL101"
    col = text.split("\n")[2].index("tp")
    assert d.range == L.Range(L.Position(2, col), L.Position(2, col + 2))


def test_labels_become_related_information(plan_in):
    a = plan_in(MESH.replace("    dp = 4\n", "    dp = 2\n    dp = 2\n"))
    (d,) = [d for d in to_lsp(a) if d.code == "PL209"]
    (rel,) = d.related_information
    assert rel.message == "first declared here"
    assert rel.location.range.start == L.Position(2, 4) and rel.location.uri.endswith("main.plan")


def test_diagnostic_in_a_used_module_is_shown_on_its_use(plan_in, tmp_path):
    a = plan_in("use hardware\nuse lib\n", lib__plan="template t(ax: axis) {\n    shard w : [ax\n}\n")
    lsp = to_lsp(a)
    d = next(d for d in lsp if d.code.startswith("PL1"))
    assert d.range.start.line == 1 and a.text.split("\n")[1][d.range.start.character:].startswith("use lib")
    assert d.message.startswith("lib.plan:")
    loc = d.related_information[0].location
    assert loc.uri == (tmp_path / "lib.plan").as_uri() and loc.range.start.line >= 1


def test_clean_plan_has_no_diagnostics(gpt2):
    # gpt2_3d.plan (pp x dp x tp) checks clean
    assert [d.code for d in to_lsp(gpt2)] == []


def test_notes_are_appended(plan_in):
    from planlang.lang.diagnostics import Diagnostic, Severity

    a = plan_in(MESH)
    d = Diagnostic("PL560", Severity.ERROR, "over", a.source.span(0, 3), notes=("parameters 1 GiB",))
    (out,) = to_lsp(a, [d])
    assert out.message == "over\nnote: parameters 1 GiB"
    assert out.range == L.Range(L.Position(0, 0), L.Position(0, 3))
