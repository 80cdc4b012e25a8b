"""Every code's worked example in docs/diagnostics.md: the failing plan yields that code, the fixed one
checks clean.

The format is the one the document's head describes. An entry's example sits between
`<!-- example PLxxx [MARK] -->` and `<!-- /example -->`; its fenced blocks carry
`LANG title="fails"|"fixed"|"both" [file="PATH"] [escapes]`. A role's first block is the plan that is
checked; its other blocks and the `both` blocks are written beside it under their `file` names (a used
module, the model's Python file). `escapes`: `\\xNN` is that byte and `\\uNNNN` that character (a plan
that is not UTF-8, a bidi control), so the document stays plain text.

MARK: none, the plan is checked without its model (`planlang check`), in process; `model`, with it
(`planlang check --model`, planlang.model.validation.check_with_model): models are tiny, built on meta;
`runtime-only` (only planlang/runtime reports the code, under torchrun) and `solve` (only `planlang solve`
reports it) are shown as commands and not run here; the marks must match the code's category.

The failing plan must yield the code at its registered severity, and no other code; the fixed plan no
diagnostic at all.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from planlang.lang.codes import CODES
from planlang.plan.checker import check_file

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "diagnostics.md"
PKG = ROOT / "planlang"

_EXAMPLE = re.compile(r"^<!-- example (PL\d{3})(?: ([a-z-]+))? -->\n(.*?)^<!-- /example -->$", re.M | re.S)
_FENCE = re.compile(r"^```(\w+)((?: [a-z]+(?:=\"[^\"]*\")?)*)\n(.*?)^```$", re.M | re.S)
_ATTR = re.compile(r' ([a-z]+)(?:="([^"]*)")?')
MARKS = {None, "model", "runtime-only", "solve"}
ROLES = ("fails", "fixed", "both")


@dataclass(frozen=True)
class Block:
    lang: str
    role: str
    file: str | None
    body: bytes


@dataclass(frozen=True)
class Example:
    code: str
    mark: str | None
    blocks: tuple[Block, ...]

    def files(self, role: str) -> list[tuple[str, bytes]]:
        """(path, content) of the plan checked for `role` (first) and of the files beside it."""
        own = [b for b in self.blocks if b.role == role]
        assert own and own[0].lang == "plan", f"{self.code}: no ```plan title=\"{role}\" block first"
        main = own[0].file or "plan.plan"
        rest = [b for b in own[1:] + [b for b in self.blocks if b.role == "both"]]
        assert all(b.file for b in rest), f"{self.code}: a block beside the checked plan needs file=\"...\""
        return [(main, own[0].body)] + [(b.file, b.body) for b in rest if b.file]


def _unescape(text: str) -> bytes:
    out = bytearray()
    for part in re.split(r"(\\x[0-9a-fA-F]{2}|\\u[0-9a-fA-F]{4})", text):
        if part.startswith("\\x") and len(part) == 4:
            out.append(int(part[2:], 16))
        elif part.startswith("\\u") and len(part) == 6:
            out += chr(int(part[2:], 16)).encode("utf-8")
        else:
            out += part.encode("utf-8")
    return bytes(out)


def parse_examples(text: str) -> dict[str, Example]:
    out: dict[str, Example] = {}
    for m in _EXAMPLE.finditer(text):
        code, mark, inner = m.groups()
        blocks = []
        for f in _FENCE.finditer(inner):
            lang, attrs, body = f.groups()
            kv = {k: v for k, v in _ATTR.findall(attrs)}
            if "title" not in kv:
                continue  # a command or an explanation shown, not a file
            assert kv["title"] in ROLES, f"{code}: title={kv['title']!r}"
            blocks.append(Block(lang, kv["title"], kv.get("file") or None,
                                _unescape(body) if "escapes" in kv else body.encode("utf-8")))
        assert code not in out, f"{code} has two examples"
        out[code] = Example(code, mark, tuple(blocks))
    return out


EXAMPLES = parse_examples(DOC.read_text(encoding="utf-8"))


def _quoted(paths) -> set[str]:
    return {c for p in paths for c in re.findall(r'"(PL\d{3})"', p.read_text(encoding="utf-8"))}


def _runtime_only() -> set[str]:
    """Codes quoted in planlang/runtime and nowhere else in the package (as tests/lang/test_corpus.py)."""
    runtime = _quoted((PKG / "runtime").rglob("*.py"))
    rest = _quoted(p for p in PKG.rglob("*.py") if "runtime" not in p.relative_to(PKG).parts
                   and p != PKG / "lang" / "codes.py")
    return runtime - rest


# model-aware codes whose message is made in a lower layer but said only when a plan is applied (the
# runtime calls the function that makes it): code -> that function
SAID_AT_APPLY = {"PL370": "sum_loss_note"}


def _said_at_apply() -> set[str]:
    """SAID_AT_APPLY's codes whose function is called (not only defined) in planlang/runtime alone."""
    out = set()
    for code, fn in SAID_AT_APPLY.items():
        calls = {p.relative_to(PKG).parts[0] for p in PKG.rglob("*.py")
                 if re.search(rf"(?<!def ){fn}\(", p.read_text(encoding="utf-8"))}
        if calls == {"runtime"}:
            out.add(code)
    return out


def _solve_only() -> set[str]:
    """Model-aware codes quoted in planlang/solve and not by the checks (planlang/model, plan, lang)."""
    checks = _quoted(p for d in ("model", "plan", "lang") for p in (PKG / d).rglob("*.py")
                     if p != PKG / "lang" / "codes.py")
    return {c for c in _quoted((PKG / "solve").rglob("*.py")) if CODES[c].model_aware} - checks


def test_every_code_has_one_example():
    assert sorted(EXAMPLES) == sorted(CODES), sorted(set(CODES) ^ set(EXAMPLES))
    assert {e.mark for e in EXAMPLES.values()} <= MARKS


def test_marks_match_the_codes_categories():
    runtime, solve = _runtime_only() | _said_at_apply(), _solve_only()
    assert runtime and solve and _said_at_apply() == set(SAID_AT_APPLY)
    for code, e in EXAMPLES.items():
        if code in runtime:
            assert e.mark == "runtime-only", code
        elif code in solve:
            assert e.mark == "solve", code
        elif CODES[code].model_aware:
            assert e.mark == "model", code
        else:
            assert e.mark is None, code


def _write(tmp_path: Path, files: list[tuple[str, bytes]]) -> Path:
    for path, body in files:
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(body)
    return tmp_path / files[0][0]


def _check(example: Example, role: str, tmp_path: Path, monkeypatch):
    folder = tmp_path / role
    folder.mkdir()
    plan = _write(folder, example.files(role))
    monkeypatch.chdir(folder)
    if example.mark != "model":
        return check_file(plan.name).diagnostics
    from planlang.model.validation import check_with_model

    monkeypatch.setattr(sys, "path", [str(ROOT), *sys.path])  # examples.* as `planlang check` finds it
    shown = [Path(b.file).stem for b in example.blocks if b.lang == "python" and b.file]
    try:
        return check_with_model(plan.name).diagnostics
    finally:  # an example's model module is imported from this folder only
        for name in shown:
            sys.modules.pop(name, None)


RUN = sorted(c for c, e in EXAMPLES.items() if e.mark in (None, "model"))


@pytest.mark.parametrize("code", RUN)
def test_the_failing_plan_yields_the_code_and_the_fixed_one_checks_clean(code, tmp_path, monkeypatch):
    example = EXAMPLES[code]
    fails = _check(example, "fails", tmp_path, monkeypatch)
    got = sorted({(d.code, d.severity.value) for d in fails})
    assert got == [(code, CODES[code].severity.value)], "\n".join(str(d) for d in fails) or "(nothing)"
    fixed = _check(example, "fixed", tmp_path, monkeypatch)
    assert not fixed, "\n".join(str(d) for d in fixed)


def _says_lint_fixes(code: str) -> str | None:
    """"safe" or "unsafe" where the entry says `planlang lint --fix` (with `--unsafe-fixes`) makes its fix."""
    m = re.search(rf"^<!-- example {code} -->\n(.*?)^<!-- /example -->$", DOC.read_text(encoding="utf-8"), re.M | re.S)
    if m is None or "`planlang lint --fix" not in m.group(1):
        return None
    return "unsafe" if "`planlang lint --fix --unsafe-fixes`" in m.group(1) else "safe"


LINT_FIXED = sorted(c for c in EXAMPLES if _says_lint_fixes(c))


def test_some_entries_say_lint_fixes_them():
    assert len(LINT_FIXED) >= 10 and {_says_lint_fixes(c) for c in LINT_FIXED} == {"safe", "unsafe"}


@pytest.mark.parametrize("code", LINT_FIXED)
def test_lint_fix_turns_the_failing_plan_into_the_fixed_one(code, tmp_path, monkeypatch):
    """Where an entry says `planlang lint --fix` makes the change, the diagnostics' own fixes, applied as
    lint --fix applies them (to a fixed point; unsafe ones only where the entry says --unsafe-fixes), turn
    the failing plan into the fixed plan, byte for byte; an entry that says --unsafe-fixes needs them."""
    from planlang.lang.fixes import fix_to_fixed_point
    from planlang.plan.checker import check_text

    example = EXAMPLES[code]
    assert example.mark is None and len(example.files("fails")) == 1, code
    monkeypatch.chdir(tmp_path)
    fails = example.files("fails")[0][1].decode("utf-8")
    fixed = example.files("fixed")[0][1].decode("utf-8")

    def check(text: str):
        return list(check_text(text, "plan.plan").diagnostics)

    unsafe = _says_lint_fixes(code) == "unsafe"
    assert fix_to_fixed_point(fails, check, unsafe=unsafe).text == fixed
    if unsafe:
        assert fix_to_fixed_point(fails, check).text != fixed, f"{code}: the safe fixes alone do it"


@pytest.mark.parametrize("code", sorted(c for c, e in EXAMPLES.items() if e.mark in ("runtime-only", "solve")))
def test_an_example_not_run_here_says_its_command(code):
    """Shown, not checked: the entry names the command that reports the code."""
    text = DOC.read_text(encoding="utf-8")
    m = re.search(rf"^<!-- example {code} [a-z-]+ -->\n(.*?)^<!-- /example -->$", text, re.M | re.S)
    assert m and re.search(r"planlang (solve|run|verify)|planlang\.apply", m.group(1)), code
