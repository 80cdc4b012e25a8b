"""One diagnostic per mistake (issue #17 item 4): each mistake the issue lists, written small, gives the
one diagnostic that names it (with the help it should have), and no follow-on from what it broke; and
`planlang check` prints the same bytes whatever Python's string hashing.

The corpus (tests/lang/corpus/invalid/) pins codes and positions of the same cases; here are the
messages and help lines, and the cases that give no diagnostic at all.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from planlang.lang.parser import parse
from planlang.plan.checker import check_file, check_text

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "lang" / "corpus" / "invalid"

HEAD = """\
use hardware

model mlp = "examples.mlp.model:build"(in_features = 1024, hidden = 4096, out_features = 1024)
input x : f32[batch = 64, features = 1024]
"""
MESH = """\
mesh ranks of 4 x hardware.cpu {
    dp = 2 over hardware.loopback
    tp = 2 over hardware.loopback
}
"""
TAIL = """\
budget 4 GiB per device
data x : [dp, _]
shard fc1.weight : [tp, _]
shard fc2.weight : [_, tp]
"""


def diags(text: str, path: str = "plan.plan"):
    return [(d.code, d.span.line, d.message, d.help) for d in check_text(text, path).diagnostics]


def test_the_plan_the_cases_break_is_clean():
    assert diags(HEAD + MESH + TAIL) == []


# ------------------------------------------------------------------------------ syntax: recovery
def test_missing_closing_brace_is_one_error_at_the_brace():
    text = HEAD + MESH.replace("}\n", "\n") + TAIL  # before: PL104 and one "expected `=`" per later line
    (got,) = diags(text)
    assert got == ("PL104", 5, "`{` is never closed before `budget` on line 9", "add the matching `}` before line 9")


def test_missing_closing_brace_of_a_block_before_another_block():
    text = "device gpu {\n    memory = 80 GiB\nlink nv { bandwidth = 300 GB/s }\nmesh m of 8 x gpu {\n    dp = 8 over nv\n}\n"
    (got,) = diags(text)
    assert got[:3] == ("PL104", 1, "`{` is never closed before `link` on line 3")


def test_unclosed_bracket_in_a_stage_then_the_next_error_is_still_found():
    text = ("pipeline over pp schedule 1f1b microbatches 8 {\n    stage a, h[0:6\n    stage h[6:12], head\n}\n"
            "chekpoint h[*] every 2\n")
    got = diags(text)
    assert [(c, ln) for c, ln, _, _ in got] == [("PL104", 2), ("PL101", 5)]
    assert got[0][2] == "`[` is never closed before `stage` on line 3"
    assert got[1][3] == "did you mean `checkpoint`?"


def test_missing_comma_in_a_wrapped_list_is_one_error():
    # a line that starts deeper than the bracket's line is the list going on, not an unclosed bracket;
    # before: one "unexpected `=`" per later line of the list
    text = 'model m = "a:b"(\n    layers = 12\n    hidden = 768,\n    heads = 12,\n    seq = 1024,\n)\n'
    (got,) = diags(text)
    assert got == ("PL101", 3, "missing `,` before `hidden`",
                   "items that wrap over lines still need a `,` between them: end line 2 with one")


def test_a_list_missing_a_comma_and_broken_after_it_reports_both():
    text = 'model m = "a:b"(\n    layers = 12\n    hidden = 768,\n)\nbudget 4 GiB @ device\n'
    assert [(c, ln) for c, ln, _, _ in diags(text)] == [("PL101", 3), ("PL102", 5)]


def test_stray_closing_brace_is_one_error():
    # before: the `}` blanked with the one before it, then "`{` is never closed" at the block it closed
    text = "for b in h[*] {\n    shard b.w : [_]\n}}\nbudget 4 GiB per device\n"
    (got,) = diags(text)
    assert got == ("PL101", 3, "unexpected `}`: it closes no bracket", "remove it")


def test_missing_opening_brace_is_one_error():
    # before: one "expected a statement" per line of the block, and one at its `}`
    text = "device gpu { memory = 80 GiB }\nmesh m of 8 x gpu\n    dp = 2\n    tp = 4\n}\nbudget 4 GiB per device\n"
    (got,) = diags(text)
    assert got[:3] == ("PL101", 2, "unexpected line break: expected `{`")


@pytest.mark.parametrize("opener", ["pipeline over pp schedule 1f1b microbatches 4 {\n", 'model m = "a:b"(\n'])
def test_a_block_without_its_opening_line_is_one_error(opener):
    # before: "expected a statement" at every line of the body and at its closer
    text = ("use hardware\n" + opener + "    stage a, h[0]\n    stage h[1]\n}\n"
            if opener.startswith("pipeline") else "use hardware\n" + opener + "    layers = 2,\n    hidden = 4,\n)\n")
    text = text.replace(opener, "") + "budget 4 GiB per device\n"
    (got,) = diags(text)
    assert got[0] == "PL101" and got[1] == 2 and got[2].endswith("expected a statement")
    assert got[3].startswith("this line is indented like the body of a block")


def test_a_typo_inside_a_for_body_is_not_an_orphan_block():
    text = "for b in h[*] {\n    shard b.w : [_]\n    chekpoint b\n    shard b.v : [_]\n}\nbudget 4 GiB per device\n"
    (got,) = diags(text)
    assert got[:2] == ("PL101", 3) and got[3] == "did you mean `checkpoint`?"


def test_a_missing_use_is_said_once():
    text = "mesh m of 4 x hardware.cpu {\n    dp = 2 over hardware.loopback\n    tp = 2 over hardware.loopback\n}\n"
    assert [(c, ln, h) for c, ln, _, h in diags(text)] == [("PL202", 1, "bring it in with `use hardware`")]


def test_unterminated_string_in_a_wrapped_statement_is_one_error():
    text = 'model m = "a:b(\n    layers = 12,\n    hidden = 768,\n)\nbudget 4 GiB per device\n'
    (got,) = diags(text)
    assert got[:3] == ("PL103", 1, "unterminated string")


def test_a_block_at_the_end_of_the_file_still_says_end_of_file():
    (got,) = diags("device gpu {\n    memory = 80 GiB\n")
    assert got[:3] == ("PL104", 1, "unexpected end of file: `{` is never closed")


@pytest.mark.parametrize("line, guess", [
    ("budget 4 GiB per devic", "device"),
    ("pipeline over pp schedule 1f1b microbatchs 8 { stage a }", "microbatches"),
])
def test_keyword_typo_inside_a_statement_gets_did_you_mean(line, guess):
    (got,) = diags(line + "\n")
    assert got[0] == "PL101" and got[3] == f"did you mean `{guess}`?"


def test_keyword_typo_in_a_block_item():
    (got,) = diags("mesh m of 8 x gpu {\n    dp = 8 ovr nv\n}\n")
    assert got[0] == "PL101" and got[3] == "did you mean `over`?"


# ------------------------------------------------------------------------------ names: no follow-ons
def test_misspelt_use_is_one_error_with_the_right_help():
    # before: PL203, then a PL202 per reference whose help said `use megatorn`
    text = HEAD.replace("use hardware", "use hardware\nuse megatorn") + MESH + TAIL.replace(
        "shard fc1.weight : [tp, _]\nshard fc2.weight : [_, tp]\n",
        "apply megatorn.linear_mlp(tp) to fc1\napply megatorn.linear_mlp(tp) to fc2\n")
    (got,) = diags(text)
    assert got == ("PL203", 2, "module `megatorn` not found", "did you mean `use patterns.megatron`?")


def test_misspelt_use_then_the_right_name_is_one_error():
    # the plan goes on to write `hardware.cpu` and `megatron.mlp`, as meant: no PL202 at each
    text = ("use hardwre\nuse patterns.megatorn\nmesh m of 4 x hardware.cpu {\n    tp = 4 over hardware.loopback\n}\n"
            "apply megatron.mlp(tp) to h[0].mlp\n")
    assert [(c, ln, h) for c, ln, _, h in diags(text)] == [
        ("PL203", 1, "did you mean `use hardware`?"), ("PL203", 2, "did you mean `use patterns.megatron`?")]


def test_data_may_come_before_its_input():
    text = HEAD.replace('input x : f32[batch = 64, features = 1024]\n', "") + MESH + TAIL \
        + "input x : f32[batch = 64, features = 1024]\n"
    assert diags(text) == []  # before: PL211 unknown input `x`


def test_data_of_an_undeclared_input_still_gets_did_you_mean():
    got = diags(HEAD + MESH + TAIL.replace("data x", "data xx"))
    assert [(c, h) for c, _, _, h in got] == [("PL211", "did you mean `x`?")]


@pytest.mark.parametrize("field, code", [
    ("memory = 80 GiBs", "PL250"),      # unknown unit
    ("memory = 80", "PL252"),           # missing unit
    ("flops.bf16 = 300 TFLOPS", "PL213"),  # no memory at all
])
def test_a_device_that_failed_is_still_declared(field, code):
    text = f"use hardware\ndevice mygpu {{\n    {field}\n}}\nmesh m of 4 x mygpu {{\n    dp = 4 over hardware.loopback\n}}\n"
    assert [c for c, *_ in diags(text)] == [code]  # before: also PL202 unknown device `mygpu`


def test_a_link_that_failed_is_still_declared():
    text = ("device gpu { memory = 80 GiB }\nlink nv { bandwidth = 300 GBs }\n"
            "mesh m of 4 x gpu {\n    dp = 4 over nv\n}\n")
    assert [c for c, *_ in diags(text)] == ["PL250"]


def test_names_from_a_module_with_a_syntax_error_are_not_unknown(tmp_path):
    (tmp_path / "hw.plan").write_text("device gpu {\n    memory = 80 GiB,\n}\nlink nv { bandwidth = 300 GB/s }\n")
    plan = tmp_path / "p.plan"
    plan.write_text("use hw\nmesh m of 8 x hw.gpu {\n    dp = 8 over hw.nv\n}\n")
    got = [(Path(d.span.file).name, d.code) for d in check_file(str(plan)).diagnostics]
    assert got == [("hw.plan", "PL101")]  # before: also PL202 for `hw.gpu` and `hw.nv`


def test_unit_with_the_wrong_case_suggests_the_same_letters():
    (got,) = [d for d in diags(HEAD + MESH + TAIL.replace("4 GiB", "4 GIB")) if d[0] == "PL250"]
    assert got[3] == "did you mean `GiB`?"  # was `GB`: a closer spelling, another unit


def test_malformed_budget_is_not_also_no_budget():
    assert [c for c, *_ in diags(HEAD + MESH + TAIL.replace("4 GiB", "4 GIB"))] == ["PL250"]


# ------------------------------------------------------------------------------ text: Trojan Source
@pytest.mark.parametrize("ch", ["\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068",
                                "\u2069"])
def test_bidi_control_is_a_warning_and_checking_goes_on(ch):
    text = HEAD + MESH.replace("tp = 2 over hardware.loopback", f"tp = 2 over hardware.loopback  # {ch}x") + TAIL
    got = diags(text)
    assert [(c, ln) for c, ln, _, _ in got] == [("PL225", 7)]
    assert f"\\u{ord(ch):04x}" in got[0][2]  # shown escaped, never as itself
    assert check_text(text, "p.plan").plan is not None


def test_bidi_control_is_reported_beside_syntax_errors_and_once_per_line():
    text = "x = 1\n# \u202eone\u2066 two\u2069\n"
    result = parse(text)
    assert [d.code for d in result.diagnostics] == ["PL101"]
    assert [(d.code, d.span.line, d.span.col) for d in result.warnings] == [("PL225", 2, 3)]
    assert [d.code for d in check_text(text).diagnostics] == ["PL101", "PL225"]


def test_no_bidi_control_no_warning():
    assert parse(HEAD + MESH + TAIL).warnings == ()


# ------------------------------------------------------------------------------ deterministic output
def _check_output(args: list[str], seed: str) -> bytes:
    env = dict(os.environ, PYTHONHASHSEED=seed, NO_COLOR="1")
    env.pop("FORCE_COLOR", None)
    out = subprocess.run([sys.executable, "-m", "planlang.cli", "check", *args], capture_output=True,
                         cwd=REPO, env=env, timeout=300)
    assert out.returncode in (0, 1, 2), out.stderr.decode(errors="replace")
    return out.stdout + b"\n--- stderr\n" + out.stderr


def test_check_prints_the_same_bytes_under_any_string_hashing():
    """The whole invalid corpus (every code the checker reports without a model), in two processes."""
    files = [str(p.relative_to(REPO)) for p in sorted(CORPUS.glob("*.plan"))]
    first = _check_output(["--format", "human", *files], "1")
    assert b"error[PL" in first
    assert _check_output(["--format", "human", *files], "2") == first


def test_check_model_of_overlapping_stages_is_the_same_under_any_string_hashing(tmp_path):
    pytest.importorskip("torch")
    text = (REPO / "examples" / "gpt2" / "gpt2_3d.plan").read_text()
    text = text.replace("stage h[6:12], ln_f, lm_head", "stage h[5:12], ln_f, lm_head")
    plan = tmp_path / "overlap.plan"
    plan.write_text(text)
    first = _check_output(["--model", "--format", "concise", str(plan)], "1")
    assert b"PL460" not in first and b"PL461" not in first  # every module is in a stage; h[5] in two: PL406 alone
    assert _check_output(["--model", "--format", "concise", str(plan)], "2") == first


def test_did_you_mean_prefers_the_candidate_that_starts_alike():
    from planlang.lang.diagnostics import did_you_mean
    assert did_you_mean("dpp", ["pp", "dp", "tp"]) == "dp"  # was `pp` (difflib's tie goes to the last)
    assert did_you_mean("ppp", ["pp", "dp", "tp"]) == "pp"
    got = diags(HEAD + MESH.replace("    tp = 2", "    pp = 1 over hardware.loopback\n    tp = 2")
                + TAIL.replace("data x : [dp, _]", "data x : [dpp, _]"))
    assert [(c, h.split("?")[0]) for c, _, _, h in got] == [("PL201", "did you mean `dp`")]


def test_failed_mesh_alias_is_not_also_no_mesh():
    text = HEAD.replace("use hardware", "use meshes") + "mesh ranks = meshes.cpu44\ndata x : [rank, _]\n"
    got = diags(text)
    assert [(c, h) for c, _, _, h in got] == [("PL202", "did you mean `meshes.cpu4`?")]


def test_bidi_control_in_a_used_module_is_reported_there(tmp_path):
    (tmp_path / "hw.plan").write_text("device gpu { memory = 80 GiB }  # \u2067gpu\u2069\n")
    plan = tmp_path / "p.plan"
    plan.write_text("use hw\nmesh m of 8 x hw.gpu {\n    dp = 8\n}\n")
    got = [(Path(d.span.file).name, d.code) for d in check_file(str(plan)).diagnostics]
    assert ("hw.plan", "PL225") in got and ("p.plan", "PL202") not in got


def test_a_line_missing_its_opening_brace_is_one_error():
    text = ("use hardware\nmesh m of 4 x hardware.cpu { dp = 4 over hardware.loopback }\n"
            "optimizer adamw(lr = 0.001)  zero = 1 over dp }\nbudget 4 GiB per device\n")
    (got,) = diags(text)  # not also "`}` closes no bracket" on the same line
    assert got[:2] == ("PL101", 3) and got[2].startswith("unexpected `zero`")
