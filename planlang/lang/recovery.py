"""Error recovery: after a syntax error, repair or blank what is wrong and parse again, so that one run
reports the independent errors of a file (at most MAX_SYNTAX_ERRORS), one error for one mistake.

`recover` runs the attempts (`parser._attempt`: the fast driver, else Lark's parser). After an error:
a bracket left open before a line that starts no deeper than the bracket's line is one PL104 at the
bracket, and the unfinished statement is blanked; a closer that closes nothing is blanked alone; the
body of a block whose opening line is missing is one error and blanked; a `,` missing at the end of a
wrapped line is put in (when the text then parses past that line) and reported once; else the line is
blanked, first all but its braces, then entirely, with the lines that continue its statement.
Blanking keeps every offset, so later errors are located in the text as written.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import ast as A
from .diagnostics import Diagnostic, Severity
from .lexical import brackets, code_of
from .fixes import delete as delete_fix, insert as insert_fix
from .source import SourceFile
from .syntax_errors import (STATEMENT_KEYWORDS, accepted, close_bracket_fix, code_end, diagnostic_for,
                            quote_source, unexpected_input)

if TYPE_CHECKING:  # Lark's exceptions load when one is raised (a clean parse imports no Lark)
    from lark.exceptions import UnexpectedInput

MAX_SYNTAX_ERRORS = 20

# one parse of `work` (the text with repairs) for `source`, building the tree or not: (module, comments,
# builder) or Lark's exception for the first syntax error
Attempt = Callable[[SourceFile, str, bool], tuple[Any, list[A.Comment], Any]]


def recover(source: SourceFile, attempt: Attempt) -> tuple[A.Module | None, tuple[A.Comment, ...],
                                                           tuple[Diagnostic, ...]]:
    """(module, comments, ()) when the text parses, else (None, the comments of the text as written,
    its syntax diagnostics); the builder's own diagnostics (PL107) count as syntax errors."""
    text = source.text
    diags: list[Diagnostic] = []
    work = text
    blanked: dict[int, int] = {}  # line -> how much of it has been blanked (1: all but braces, 2: all)
    comma_tried: set[int] = set()  # offsets where a missing `,` was put in (at most once each)
    for _ in range(3 * (MAX_SYNTAX_ERRORS + 1)):  # up to three repairs per error: a `,`, then blanking twice
        if len(diags) >= MAX_SYNTAX_ERRORS:
            break
        try:
            # after a syntax error the tree is not wanted: only where the next error is (or that none is)
            module, comments, builder = attempt(source, work, not diags)
        except unexpected_input() as err:
            # lazy: lark loads when a parse raises its exception
            from lark.exceptions import UnexpectedEOF, UnexpectedToken

            unclosed = _unclosed_before(err, source, work)
            if unclosed is not None:
                # a bracket left open runs into the next statement: one error at the bracket, and the
                # unfinished statement blanked up to the line where the next one starts
                diag, first, stop = unclosed
                if len(diags) < MAX_SYNTAX_ERRORS:
                    diags.append(diag)
                work = _blank_lines(work, first, stop - 1)
                continue
            stray = _stray_closer(err, work)
            if stray is not None:  # a `}` that closes nothing: blank just it, the line around it may be fine
                # unsafe: the bracket may close a block whose opener is what is missing
                diag = Diagnostic("PL101", Severity.ERROR, f"unexpected `{work[stray]}`: it closes no bracket",
                                  source.span(stray, stray + 1), help="remove it",
                                  fix=delete_fix(source.span(stray, stray + 1), f"remove `{work[stray]}`",
                                                 safe=False))
                if all(d.span.line != diag.span.line for d in diags):  # not when its line's error left it alone
                    diags.append(diag)
                work = work[:stray] + " " + work[stray + 1:]
                continue
            orphan = _orphan_body(err, work)
            if orphan is not None:  # a block's lines without the line that opens it: one error, at the first
                first, last = orphan
                diag = diagnostic_for(err, source, work)
                diags.append(Diagnostic(diag.code, diag.severity, diag.message, diag.span, help=(
                    "this line is indented like the body of a block, but no block is open here: is the line "
                    "that opens it missing?")))
                work = _blank_lines(work, first, last)
                continue
            comma = _missing_comma(err, work, comma_tried)
            # items wrapped over lines with a `,` missing at a line's end (`err` is an UnexpectedToken then)
            if comma is not None and isinstance(err, UnexpectedToken):
                comma_tried.add(comma)
                retry = work[:comma] + "," + work[comma + 1:]
                if _parses_past(attempt, source, retry, work.find("\n", err.token.end_pos)):
                    line_start = work.rfind("\n", 0, comma) + 1
                    prev_end = len(work[:line_start - 1].rstrip())
                    word = work[comma + 1:].split(None, 1)[0] if work[comma + 1:].strip() else ""
                    at = code_end(source.text, line_start)  # after the previous line's code
                    diags.append(Diagnostic(
                        "PL101", Severity.ERROR, f"missing `,` before `{quote_source(word)}`",
                        source.span(comma + 1, comma + 1 + len(word)),
                        help=f"items that wrap over lines still need a `,` between them: end line "
                             f"{work.count(chr(10), 0, prev_end) + 1} with one",
                        fix=insert_fix(source.span(at, at), ",", "add `,`")))
                    work = retry
                    continue
            diag = diagnostic_for(err, source, work)
            if all(d.span.line != diag.span.line for d in diags) and len(diags) < MAX_SYNTAX_ERRORS:
                diags.append(diag)
            line = diag.span.line
            if isinstance(err, UnexpectedEOF) or (isinstance(err, UnexpectedToken) and err.token.type == "$END"):
                break
            level = blanked.get(line, 0) + 1
            if level > 2:
                break
            blanked[line] = level
            work = _blank_line(work, line, keep_braces=(level == 1))
            continue
        # the comments of the text as written, not of what was blanked
        kept = tuple(comments if work is text else [c for c in comments if _comment_in(c, text)])
        if diags or builder.diags:
            return None, kept, tuple(diags or builder.diags)
        return module, kept, ()
    return None, (), tuple(diags)


def _comment_in(comment: A.Comment, text: str) -> bool:
    start, end = A.span_offsets(A.raw_span(comment))
    return text[start:end] == comment.text


def _blank_line(text: str, line: int, keep_braces: bool) -> str:
    """Blank a line for error recovery. A line that opens a block is blanked through the block's `}`,
    so one broken statement yields one error rather than one per line of its body."""
    lines = text.split("\n")
    if keep_braces and 1 <= line <= len(lines):
        opened = code_of(lines[line - 1]).count("{") - code_of(lines[line - 1]).count("}")
        if opened > 0:
            depth, last = opened, line
            for j in range(line, len(lines)):
                code = code_of(lines[j])
                depth += code.count("{") - code.count("}")
                last = j + 1
                if depth <= 0:
                    break
            if depth <= 0:
                for k in range(line - 1, last):
                    lines[k] = " " * len(lines[k])
                return "\n".join(lines)
    if 1 <= line <= len(lines):
        old = lines[line - 1]
        lines[line - 1] = "".join(c if (keep_braces and c in "{}") else " " for c in old)
        # the statement's continuation: the lines after it that start deeper (inside its brackets, or the
        # body of a block whose `{` is missing), through a line at its depth of closers only (`)`, `}`)
        depth, j = _indent(old), line
        while j < len(lines) and (not code_of(lines[j]).strip() or _indent(lines[j]) > depth):
            j += 1
        closing = code_of(lines[j]).strip() if j < len(lines) else ""
        deeper = any(code_of(lines[k]).strip() for k in range(line, j))
        if deeper and closing and _indent(lines[j]) == depth and not closing.strip(")]},; \t"):
            for k in range(line, j + 1):
                lines[k] = " " * len(lines[k])
    return "\n".join(lines)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _parses_past(attempt: Attempt, source: SourceFile, work: str, pos: int) -> bool:
    """Whether `work` parses without error up to offset `pos` (-1: the end)."""
    try:
        attempt(source, work, False)
    except unexpected_input() as err:
        # lazy: lark loads when a parse raises its exception
        from lark.exceptions import UnexpectedToken

        at = getattr(err, "pos_in_stream", None)
        if isinstance(err, UnexpectedToken):
            at = err.token.start_pos
        return pos >= 0 and at is not None and at > pos
    return True


def _open_brackets(work: str, end: int) -> list[int]:
    """Offsets of the brackets still open at offset `end` (strings and comments skipped), innermost last."""
    stack: list[int] = []
    for ch, at in brackets(work, 0, end):
        if ch in _CLOSER:
            stack.append(at)
        elif stack and _CLOSER[work[stack[-1]]] == ch:
            stack.pop()
    return stack


def _stray_closer(err: UnexpectedInput, work: str) -> int | None:
    """The offset of the token of `err` when it is a `}`, `)` or `]` that closes no open bracket."""
    # lazy: lark loads when a parse raises its exception
    from lark.exceptions import UnexpectedToken

    if not isinstance(err, UnexpectedToken) or err.token.type not in ("RBRACE", "RPAR", "RSQB"):
        return None
    pos = err.token.start_pos
    if pos is None:
        return None
    stack = _open_brackets(work, pos)
    return pos if not stack or _CLOSER[work[stack[-1]]] != work[pos] else None


def _orphan_body(err: UnexpectedInput, work: str) -> tuple[int, int] | None:
    """(first, last) lines of a block body whose opening line is missing (deleted, commented out): `err`
    is at the first token of an indented line where a statement should start, outside every bracket, and
    the lines after it, as deep or deeper, end at a line of closers only (`}`, `)`) less deep."""
    # lazy: lark loads when a parse raises its exception
    from lark.exceptions import UnexpectedToken

    if not isinstance(err, UnexpectedToken) or err.token.start_pos is None or err.token.type == "$END":
        return None
    if sum(1 for e in accepted(err) if e.lower() in STATEMENT_KEYWORDS) < 8:
        return None
    pos = err.token.start_pos
    line_start = work.rfind("\n", 0, pos) + 1
    if line_start == 0 or work[line_start:pos].strip(" \t") or pos == line_start:
        return None
    depth = pos - line_start
    end = work.find("\n", pos)
    while end >= 0:
        nxt = work.find("\n", end + 1)
        line = work[end + 1:nxt if nxt >= 0 else len(work)]
        code = code_of(line).strip()
        if code and _indent(line) < depth:
            if code.strip(")]}, \t"):
                return None
            if _open_brackets(work, line_start):  # in a block, where statements may stand indented
                return None
            first = work.count("\n", 0, line_start) + 1
            return first, first + work.count("\n", line_start, end + 1)
        end = nxt
    return None


def _missing_comma(err: UnexpectedInput, work: str, tried: set[int]) -> int | None:
    """Where a `,` would go when `err` is on a line of a list wrapped over lines (a `,` accepted, no line
    break) and the line before has no `,` at its end: the last space of the line's indentation."""
    # lazy: lark loads when a parse raises its exception
    from lark.exceptions import UnexpectedToken

    if not isinstance(err, UnexpectedToken) or err.token.start_pos is None or err.token.type == "$END":
        return None
    expected = accepted(err)
    if "COMMA" not in expected or "_NL" in expected:
        return None
    pos = err.token.start_pos
    line_start = work.rfind("\n", 0, pos) + 1
    if line_start == 0:
        return None
    line = work[line_start:pos]
    indent = len(line) - len(line.lstrip(" \t"))
    if indent == 0 or line_start + indent - 1 in tried:
        return None
    before = code_of(work[work.rfind("\n", 0, line_start - 1) + 1:line_start - 1]).rstrip()
    if not before or before[-1] in ",([{":
        return None
    return line_start + indent - 1


def _blank_lines(text: str, first: int, last: int) -> str:
    """Lines `first`..`last` (1-based, inclusive) as spaces, newlines kept (offsets do not move)."""
    lines = text.split("\n")
    for k in range(first - 1, min(last, len(lines))):
        lines[k] = " " * len(lines[k])
    return "\n".join(lines)


_CLOSER = {"{": "}", "(": ")", "[": "]"}


def _unclosed_before(err: UnexpectedInput, source: SourceFile, work: str) -> tuple[Diagnostic, int, int] | None:
    """A syntax error on a line that starts no deeper than the line of a bracket still open there, in a
    file with more openers of that kind than closers: the bracket was never closed and the line begins
    the next statement (`mesh m of 8 x gpu {` ... then `budget 40 GiB per device` at the left margin,
    or `stage a, h[0:6` then `stage h[6:12]`). (PL104 at the bracket, the bracket's line, the error's
    line), else None."""
    # lazy: lark loads when a parse raises its exception
    from lark.exceptions import UnexpectedToken

    if not isinstance(err, UnexpectedToken) or err.token.type == "$END" or err.token.start_pos is None:
        return None
    code = code_of(work)
    short = {o for o, c in _CLOSER.items() if code.count(o) > code.count(c)}
    if not short:
        return None
    pos = err.token.start_pos
    line_start = work.rfind("\n", 0, pos) + 1
    line_end = work.find("\n", pos)
    line = work[line_start:line_end if line_end >= 0 else len(work)]
    margin = len(line) - len(line.lstrip(" \t"))
    for opener in reversed(_open_brackets(work, line_start)):
        ch = work[opener]
        start = work.rfind("\n", 0, opener) + 1
        indent = len(work[start:opener]) - len(work[start:opener].lstrip(" \t"))
        if ch in short and margin <= indent:
            first_line = work.count("\n", 0, start) + 1
            err_line = work.count("\n", 0, line_start) + 1
            words = line.split(None, 1)
            what = f"`{quote_source(words[0])}` on line {err_line}" if words else f"the end of line {err_line}"
            return Diagnostic(
                "PL104", Severity.ERROR, f"`{ch}` is never closed before {what}",
                source.span(opener, opener + 1), help=f"add the matching `{_CLOSER[ch]}` before line {err_line}",
                fix=close_bracket_fix(source, opener, line_start),
            ), first_line, err_line
        if margin > indent:
            break
    return None
