"""docs/diagnostics.md is generated from the code registry and must stay in sync with it."""
import importlib.util
from pathlib import Path

from planlang.lang.codes import CODES, explain

ROOT = Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_diagnostics_doc", ROOT / "scripts" / "gen_diagnostics_doc.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_diagnostics_doc_matches_registry():
    doc = (ROOT / "docs" / "diagnostics.md").read_text(encoding="utf-8")
    assert doc == _generator().render(), "run: python scripts/gen_diagnostics_doc.py"


def test_every_code_has_a_doc_entry_and_explanation():
    doc = (ROOT / "docs" / "diagnostics.md").read_text(encoding="utf-8")
    for code, entry in CODES.items():
        assert f"### {code}" in doc
        assert entry.title
        assert explain(code).startswith(code)


def test_codes_are_well_formed_and_in_their_range():
    ranges = {"1": "syntax", "2": "names", "3": "mesh", "4": "pipeline", "5": "memory"}
    for code, entry in CODES.items():
        assert code.startswith("PL") and len(code) == 5 and code[2] in ranges
        assert entry.name == entry.name.lower() and " " not in entry.name
