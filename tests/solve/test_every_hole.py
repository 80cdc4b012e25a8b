"""Every hole docs/language.md §19 documents is one `planlang solve` fills. The test walks the rows of that
section's table, builds a small plan for each (GPT-2 with 2 layers, hidden 64, on 4 CPU processes),
solves it with the library call the CLI makes (the runtime's traffic as the communication time) and
checks the result: no hole left, no error (`planlang check`, and against the model). A row added to the
table without a case here fails, and so does a case whose row is gone."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from planlang.lang.render import render
from planlang.plan.checker import check_file, check_text
from planlang.solve.driver import solve

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "language.md"


def documented_holes() -> list[str]:
    """The `Where` cell of each row of the table in §19 ("Holes `?`")."""
    text = DOC.read_text()
    start = text.index("## 19. Holes")
    end = text.index("\n## ", start + 1)
    rows = []
    for line in text[start:end].splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] and cells[0] != "Where" and not set(cells[0]) <= set("-: "):
            rows.append(cells[0])
    return rows


HEAD = '''use hardware
model gpt2 = "examples.gpt2.model:build"(layers = 2, hidden = 64, heads = 4, vocab = 128, seq = 16)
input idx : i64[batch = 8, seq = 16]
'''
DP_TP = "mesh ranks of 4 x hardware.cpu {\n    dp = 2 over hardware.loopback\n    tp = 2 over hardware.loopback\n}\n"
PP_DP = "mesh ranks of 4 x hardware.cpu {\n    pp = 2 over hardware.loopback\n    dp = 2 over hardware.loopback\n}\n"
PP_TP = "mesh ranks of 4 x hardware.cpu {\n    pp = 2 over hardware.loopback\n    tp = 2 over hardware.loopback\n}\n"
REST = "budget 2 GiB per device\noptimizer adamw(lr = 0.001)\n"
DATA = "data idx : [dp, _]\n"
STAGES = "    stage wte, wpe, drop, h[0]\n    stage h[1], ln_f, lm_head\n"
MLP = '''template mlp(t: axis) {
    shard c_fc.weight   : [_, t]
    shard c_fc.bias     : [t]
    shard c_proj.weight : [t, _]
}
template blocks(n: int) {
    checkpoint ln_1, attn, ln_2, mlp every n
}
'''

# the row's `Where` -> (the kind of hole the resolver makes, as `Hole.what` starts; the plan)
CASES: dict[str, tuple[str, str]] = {
    "mesh axis size": ("mesh axis size", DP_TP.replace("= 2", "= ?") + REST + DATA),
    "ZeRO stage": ("ZeRO stage", DP_TP + "budget 2 GiB per device\noptimizer adamw(lr = 0.001) {\n"
                   "    zero = ? over dp\n}\n" + DATA),
    "ZeRO axis": ("ZeRO axis", DP_TP + "budget 2 GiB per device\noptimizer adamw(lr = 0.001) {\n"
                  "    zero = 1 over ?\n}\n" + DATA),
    "data spec": ("data spec", DP_TP + REST + "data idx : ?\n"),
    "data spec entry": ("spec entry", DP_TP + REST + "data idx : [?, _]\n"),
    "shard spec": ("spec", DP_TP + REST + DATA + "shard h[*].mlp.c_fc.weight : ?\n"
                   "shard output of h[*].mlp.c_proj : ?\n"),
    "shard spec entry": ("spec entry", DP_TP + REST + DATA + "shard h[*].attn.c_attn.weight : [_, ?]\n"
                         "shard output of h[*].attn.c_proj : [_, _, ?]\n"),
    "pipeline axis": ("pipeline axis", PP_DP + REST + DATA + "pipeline over ? schedule 1f1b microbatches 2 {\n"
                      + STAGES + "}\n"),
    "schedule": ("schedule", PP_DP + REST + DATA + "pipeline over pp schedule ? microbatches 4 {\n" + STAGES + "}\n"),
    "chunks": ("chunks", PP_DP + REST + DATA + "pipeline over pp schedule interleaved chunks ? microbatches 2 { ? }\n"),
    "microbatches": ("microbatches", PP_DP + REST + DATA + "pipeline over pp schedule 1f1b microbatches ? {\n"
                     + STAGES + "}\n"),
    "accumulation microbatches": ("microbatches", DP_TP + REST + DATA + "microbatches ?\n"),
    "stage list": ("stages", PP_DP + REST + DATA + "pipeline over pp schedule 1f1b microbatches 2 { ? }\n"),
    "stage degree": ("stage degree", PP_TP + REST + "pipeline over pp schedule 1f1b microbatches 2 {\n"
                     "    stage wte, wpe, drop, h[0] with tp = ?\n    stage h[1], ln_f, lm_head\n}\n"),
    "checkpoint group size": ("checkpoint every", DP_TP + REST + DATA + "checkpoint h[*] every ?\n"),
    "checkpoint groups": ("checkpoint groups", DP_TP + REST + DATA + "checkpoint ?\n"),
    "template argument": ("template argument", DP_TP + REST + DATA + MLP + "apply mlp(?) to h[*].mlp\n"
                          "apply blocks(?) to h[*]\n"),
}


def _solved(tmp_path: Path, text: str) -> tuple[str, str]:
    path = tmp_path / "partial.plan"
    path.write_text(HEAD + text)
    res = solve(str(path))
    out = tmp_path / "solved.plan"
    out.write_text(res.text)
    return str(path), str(out)


def _assert_complete(path: str) -> None:
    # lazy: torch loads only when this runs
    from planlang.model.validation import check_with_model

    checked = check_file(path)  # `planlang check`
    assert not checked.errors, render(list(checked.diagnostics), checked.sources, "concise")
    assert checked.plan is not None and not checked.plan.holes()
    with_model = check_with_model(path)  # `planlang check --model`
    assert not with_model.errors, render(list(with_model.diagnostics), with_model.sources, "concise")


def test_the_cases_are_the_documented_rows():
    rows = documented_holes()
    assert len(rows) >= 16
    missing = [r for r in rows if r not in CASES]
    assert not missing, f"docs/language.md §19 documents holes no case here solves: {missing}; add a case"
    stale = [c for c in CASES if c not in rows]
    assert not stale, f"cases for rows §19 no longer has: {stale}"


@pytest.mark.parametrize("where", documented_holes())
def test_documented_hole_is_solved(where, tmp_path):
    assert where in CASES, f"docs/language.md §19 documents holes in `{where}` but no case here solves one"
    what, text = CASES[where]
    given = check_text(HEAD + text, str(tmp_path / "partial.plan"))
    assert not given.errors, render(list(given.diagnostics), given.sources, "concise")
    assert any(h.what.startswith(what) for h in given.plan.holes()), [h.what for h in given.plan.holes()]
    _, out = _solved(tmp_path, text)
    _assert_complete(out)


def test_spec_entry_keeps_the_written_entries(tmp_path):
    _, out = _solved(tmp_path, DP_TP + REST + DATA + "shard h[*].mlp.c_fc.weight : [?, tp]\n"
                     "shard h[*].mlp.c_proj.weight : [tp, ?]\n")
    lines = {line.split(":")[0].strip(): line.split(":")[1].strip() for line in Path(out).read_text().splitlines()
             if line.startswith("shard ")}
    assert lines == {"shard h[*].mlp.c_fc.weight": "[_, tp]", "shard h[*].mlp.c_proj.weight": "[tp, _]"}


def test_data_spec_splits_the_batch_only(tmp_path):
    _, out = _solved(tmp_path, DP_TP + REST + "data idx : [?, ?]\nshard h[*].attn.c_attn.weight : [_, tp]\n")
    data = [line for line in Path(out).read_text().splitlines() if line.startswith("data ")]
    assert data == ["data idx : [dp, _]"]  # tp splits a parameter: not a data axis; the sequence stays whole


def test_template_argument_is_written_at_the_apply(tmp_path):
    path, out = _solved(tmp_path, DP_TP + REST + DATA + MLP + "apply mlp(?) to h[*].mlp\napply blocks(?) to h[*]\n")
    text = Path(out).read_text()
    assert "apply mlp(tp) to h[*].mlp" in text  # dp is the data axis
    assert any(f"apply blocks({n}) to h[*]" in text for n in (1, 2, 4))
    assert "shard c_fc.weight   : [_, t]" in text  # the template is unchanged


def test_every_keeps_groups_inside_stages(tmp_path):
    _, out = _solved(tmp_path, PP_DP + REST + DATA + "pipeline over pp schedule 1f1b microbatches 2 {\n" + STAGES
                     + "}\ncheckpoint h[*].attn, h[*].mlp every ?\n")
    line = next(x for x in Path(out).read_text().splitlines() if x.startswith("checkpoint "))
    assert line in ("checkpoint h[*].attn, h[*].mlp every 1", "checkpoint h[*].attn, h[*].mlp every 2"), line


SECTION_19 = '''use hardware
model gpt2 = "examples.gpt2.model:build"(layers = 2, hidden = 64, heads = 4, vocab = 128, seq = 16)
input idx : i64[batch = 8, seq = 16]

mesh cluster of 4 x hardware.cpu {
    pp = ? over hardware.loopback
    dp = ? over hardware.loopback
    tp = ? over hardware.loopback
}
budget 2 GiB per device
optimizer adamw(lr = 0.001) {
    zero = ? over dp
}
data idx : [dp, _]
pipeline over pp schedule ? microbatches ? { ? }
shard h[*].mlp.c_fc.weight : ?
shard h[*].attn.c_attn.weight : [_, ?]
checkpoint ?
'''


def test_the_section_example_through_the_cli(tmp_path):
    """§19's example plan (on the small model): `planlang solve X -o Y && planlang check Y`."""
    src, out = tmp_path / "holes.plan", tmp_path / "solved.plan"
    src.write_text(SECTION_19)
    env = {**os.environ, "COLUMNS": "80"}
    solved = subprocess.run([sys.executable, "-m", "planlang.cli", "solve", str(src), "-o", str(out)],
                            capture_output=True, text=True, cwd=REPO, timeout=600, env=env)
    assert solved.returncode == 0, solved.stderr[-2000:]
    checked = subprocess.run([sys.executable, "-m", "planlang.cli", "check", str(out)], capture_output=True,
                             text=True, cwd=REPO, timeout=600, env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "?" not in "".join(line for line in out.read_text().splitlines() if not line.startswith("#"))
