"""Mechanical fixes: how producers build them, and how `planlang lint --fix` applies them to a text.

A producer attaches a `Fix` (planlang.lang.diagnostics) to a diagnostic when one replacement of source
text makes it go away. `apply_fixes` applies the fixes of one file's diagnostics back to front, skipping a
fix that overlaps one already taken (left for the next pass); `fix_to_fixed_point` re-checks and applies
again until nothing changes (bounded passes). Pure: no file system, no torch.

Safety of a did-you-mean fix: it is safe when the suggestion differs from the word in case only (`GIB`
is `GiB`), or is the *only* candidate close to the word; when several candidates are close (`dpp`: `dp`
and `pp`) picking one guesses the user's intent, so the fix is marked unsafe (`--unsafe-fixes`).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

from .frozen import value_type
from .diagnostics import Diagnostic, Edit, Fix, close_matches, did_you_mean
from .source import SourceFile, Span

# a fix may uncover another (a fixed name lets the checker see further; an unknown module is reported at
# its first use only, so each pass fixes one more use): as ruff, at most 100 passes. Each pass fixes at
# least one diagnostic or the loop stops, so a plan needs as many passes as it has chained fixes.
MAX_PASSES = 100


def replace(span: Span, text: str, message: str, *, safe: bool = True) -> Fix:
    """A fix of one edit: the text of `span` becomes `text`."""
    return Fix(message, (Edit(span, text),), safe)


def delete(span: Span, message: str, *, safe: bool = True) -> Fix:
    return Fix(message, (Edit(span, ""),), safe)


def insert(at: Span, text: str, message: str, *, after: bool = False, safe: bool = True) -> Fix:
    """Insert `text` before (or `after`) the span `at`."""
    pos = at.end if after else at.start
    line, col = (at.end_line, at.end_col) if after else (at.line, at.col)
    return Fix(message, (Edit(Span(at.file, line, col, line, col, pos, pos), text),), safe)


def delete_statement(source: SourceFile | None, span: Span, message: str, *, safe: bool = True) -> Fix:
    """Delete the statement at `span`: its whole line(s) with the line end, where nothing but white space
    and a comment shares them (so that no blank line is left behind), else just its text."""
    if source is None or span.start == span.end:
        return delete(span, message, safe=safe)
    text = source.text
    line_start = text.rfind("\n", 0, span.start) + 1
    line_end = text.find("\n", span.end)
    line_end = len(text) if line_end < 0 else line_end + 1
    rest = text[span.end:line_end].strip()
    if text[line_start:span.start].strip() or (rest and not rest.startswith("#")):
        return delete(span, message, safe=safe)  # another statement on the line (`;`): keep it
    return Fix(message, (Edit(source.span(line_start, line_end), ""),), safe)


def guess_is_unique(word: str, guess: str, candidates: Iterable[str]) -> bool:
    """True when `guess` is the only likely reading of `word`: it differs in case only, or no other
    candidate is close enough to be a did-you-mean."""
    if guess.lower() == word.lower():
        return True
    return [c for c in close_matches(word, candidates) if c != guess] == []


def suggest(word: str, candidates: Iterable[str], span: Span) -> tuple[str | None, Fix | None]:
    """`did_you_mean(word, candidates)` and the fix replacing `span` (the word as written) with it;
    safe only where the guess is unique (see the module docstring)."""
    cands = list(candidates)
    guess = did_you_mean(word, cands)
    if guess is None:
        return None, None
    return guess, replace(span, guess, f"replace `{word}` with `{guess}`", safe=guess_is_unique(word, guess, cands))


def did_you_mean_fix(span: Span, word: str, guess: str | None, candidates: Iterable[str]) -> Fix | None:
    """The fix for a did-you-mean a producer already computed (None when there was no guess)."""
    if guess is None:
        return None
    return replace(span, guess, f"replace `{word}` with `{guess}`", safe=guess_is_unique(word, guess, candidates))


# ------------------------------------------------------------------------------------------------ applying
@value_type
class Applied:
    """The result of one pass over one text: the new text and the diagnostics whose fixes were applied."""

    text: str
    fixed: tuple[Diagnostic, ...]
    skipped: tuple[Diagnostic, ...]  # fixable, but overlapping a fix taken in this pass


def wanted(diag: Diagnostic, unsafe: bool) -> bool:
    """Whether `diag` has a fix that this run applies (unsafe ones only with `unsafe`)."""
    return diag.fix is not None and bool(diag.fix.edits) and (diag.fix.safe or unsafe)


def apply_fixes(text: str, diags: Iterable[Diagnostic], *, unsafe: bool = False) -> Applied:
    """Apply the (safe, or all with `unsafe`) fixes of `diags` to `text`, which they were computed on.

    Fixes are taken in source order; one whose edits overlap an edit already taken (or each other) is
    skipped: the next pass, on the new text, reports it afresh. Two insertions at one offset overlap.
    Edits are then applied back to front so that earlier offsets stay valid."""
    taken: list[tuple[int, int]] = []
    edits: list[Edit] = []
    fixed: list[Diagnostic] = []
    skipped: list[Diagnostic] = []
    seen: set[tuple] = set()
    for d in sorted((d for d in diags if wanted(d, unsafe)), key=_first_edit):
        assert d.fix is not None
        key = tuple((e.span.start, e.span.end, e.text) for e in d.fix.edits)
        if key in seen:  # the same fix for two reports (one name reported twice): applied once
            fixed.append(d)
            continue
        ranges = [(e.span.start, e.span.end) for e in d.fix.edits]
        if any(not 0 <= a <= b <= len(text) for a, b in ranges) or _overlap(ranges, taken) or _overlap_self(ranges):
            skipped.append(d)
            continue
        seen.add(key)
        taken.extend(ranges)
        edits.extend(d.fix.edits)
        fixed.append(d)
    out = text
    for e in sorted(edits, key=lambda e: (e.span.start, e.span.end), reverse=True):
        out = out[:e.span.start] + e.text + out[e.span.end:]
    return Applied(out, tuple(fixed), tuple(skipped))


def _first_edit(d: Diagnostic) -> int:
    return min(e.span.start for e in d.fix.edits) if d.fix is not None else 0


def _overlap(ranges: list[tuple[int, int]], taken: list[tuple[int, int]]) -> bool:
    return any(_meets(r, t) for r in ranges for t in taken)


def _overlap_self(ranges: list[tuple[int, int]]) -> bool:
    return any(_meets(ranges[i], ranges[j]) for i in range(len(ranges)) for j in range(i + 1, len(ranges)))


def _meets(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Overlapping ranges, or two insertions (or an insertion and a range edge) at the same place."""
    if a[0] == a[1] or b[0] == b[1]:
        return a[0] == b[0] or (a[0] < b[0] < a[1]) or (b[0] < a[0] < b[1])
    return a[0] < b[1] and b[0] < a[1]


@value_type
class FixResult:
    """`fix_to_fixed_point`'s answer: the final text, every diagnostic fixed on the way, and the
    diagnostics of the final text (what remains)."""

    text: str
    fixed: tuple[Diagnostic, ...]
    remaining: tuple[Diagnostic, ...]
    passes: int


def fix_to_fixed_point(text: str, check: Callable[[str], list[Diagnostic]], *, unsafe: bool = False,
                       max_passes: int = MAX_PASSES) -> FixResult:
    """Check `text`, apply its fixes, and repeat on the new text until no fix applies (at most
    `max_passes` passes). `check` returns the diagnostics of a text (of this file only)."""
    fixed: list[Diagnostic] = []
    diags = check(text)
    passes = 0
    seen_texts = {text}
    while passes < max_passes:
        applied = apply_fixes(text, diags, unsafe=unsafe)
        if applied.text == text:
            break
        passes += 1
        fixed.extend(applied.fixed)
        text = applied.text
        diags = check(text)
        if text in seen_texts:  # two fixes undoing each other: stop rather than cycle
            break
        seen_texts.add(text)
    return FixResult(text, tuple(fixed), tuple(diags), passes)
