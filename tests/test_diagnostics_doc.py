"""docs/diagnostics.md is generated from the table of codes and must stay in sync with it; `planlang
explain` answers for every code the document lists."""
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from planlang.lang.codes import CODES, REPOSITORY_URL, explain

from .lang.github_anchors import heading_anchors

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "diagnostics.md"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_diagnostics_doc", ROOT / "scripts" / "gen_diagnostics_doc.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def documented_codes() -> list[str]:
    """The codes docs/diagnostics.md has an entry (`### PLxxx`) for, in document order."""
    return re.findall(r"^### (PL\d{3})$", DOC.read_text(encoding="utf-8"), re.M)


def test_diagnostics_doc_matches_registry():
    doc = DOC.read_text(encoding="utf-8")
    assert doc == _generator().render(), "run: python scripts/gen_diagnostics_doc.py"


def test_generator_needs_no_model_layer():
    """The table is complete on import: generating the doc loads neither torch nor planlang.model."""
    code = (
        "import importlib.util, sys; "
        f"spec = importlib.util.spec_from_file_location('g', {str(ROOT / 'scripts' / 'gen_diagnostics_doc.py')!r}); "
        "g = importlib.util.module_from_spec(spec); spec.loader.exec_module(g); "
        f"assert g.render() == open({str(DOC)!r}, encoding='utf-8').read(); "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('planlang.model')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_every_code_has_a_doc_entry_and_explanation():
    doc = DOC.read_text(encoding="utf-8")
    for code, entry in CODES.items():
        assert f"### {code}" in doc
        assert entry.title
        assert entry.explanation.strip(), f"{code} has no explanation"
        assert explain(code).startswith(code)


def test_doc_lists_exactly_the_table():
    codes = documented_codes()
    assert len(codes) == len(set(codes))
    assert sorted(codes) == sorted(CODES)


def test_doc_anchors_are_the_codes_anchors():
    """`### PL301` renders on GitHub with the anchor `pl301`: the summary table's links and SARIF's
    helpUri (`Code.doc_url`) reach the entry."""
    doc = DOC.read_text(encoding="utf-8")
    anchors = heading_anchors(doc)
    assert len(anchors) == len(set(anchors))
    for code, entry in CODES.items():
        assert entry.anchor in anchors, code
        assert entry.doc_url == f"{REPOSITORY_URL}/blob/main/docs/diagnostics.md#{code.lower()}"
    links = re.findall(r"\]\(#([^)]+)\)", doc)
    assert len(links) == len(CODES)
    assert set(links) <= set(anchors)


def _planlang_command() -> list[str]:
    script = Path(sys.executable).with_name("planlang")  # the console script, as users run it
    return [str(script)] if script.exists() else [sys.executable, "-m", "planlang.cli"]


@pytest.mark.parametrize("code", documented_codes())
def test_explain_every_documented_code(code):
    r = subprocess.run([*_planlang_command(), "explain", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, (code, r.stdout, r.stderr)
    entry = CODES[code]
    assert r.stdout == explain(code)
    assert r.stdout.startswith(f"{code} ({entry.name}, {entry.severity.value}): {entry.title}\n")
    assert entry.explanation.splitlines()[0] in r.stdout


def test_explain_loads_no_model_layer():
    """Every documented code, through the typer app in a fresh interpreter: exit 0, and neither torch nor
    planlang.model was imported to get there (model-aware codes included)."""
    code = (
        "import json, sys; from typer.testing import CliRunner; from planlang.cli import app; "
        "codes = json.loads(sys.argv[1]); "
        "exits = {c: CliRunner().invoke(app, ['explain', c.lower()]).exit_code for c in codes}; "
        "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('planlang.model')); "
        "print(json.dumps({'exits': exits, 'loaded': loaded}))"
    )
    codes = documented_codes()
    out = subprocess.run([sys.executable, "-c", code, json.dumps(codes)], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["exits"] == {c: 0 for c in codes}
    assert got["loaded"] == []


def _quoted_codes(paths) -> set[str]:
    return {c for p in paths for c in re.findall(r'"(PL\d{3})"', p.read_text(encoding="utf-8"))}


def test_every_code_the_sources_name_is_in_the_table():
    """Whatever layer reports a code (the model layer too), its entry is in the one table; the model
    layer's codes, with those the solver reports (it prices plans against the model), are exactly the
    table's model-aware slots (x60–x89)."""
    pkg = ROOT / "planlang"
    sources = [p for p in pkg.rglob("*.py") if p != pkg / "lang" / "codes.py"]
    named = _quoted_codes(sources)
    assert named and not named - set(CODES), sorted(named - set(CODES))
    model = _quoted_codes((pkg / "model").rglob("*.py"))
    solver = {c for c in _quoted_codes((pkg / "solve").rglob("*.py")) if CODES[c].model_aware}
    assert model <= {c for c, e in CODES.items() if e.model_aware}
    assert model | solver == {c for c, e in CODES.items() if e.model_aware}


def test_codes_are_well_formed_and_in_their_range():
    ranges = {"1": "syntax", "2": "names", "3": "mesh", "4": "pipeline", "5": "memory"}
    for code, entry in CODES.items():
        assert code.startswith("PL") and len(code) == 5 and code[2] in ranges
        assert entry.name == entry.name.lower() and " " not in entry.name
