"""Code actions that fill a plan's holes with `planlang solve`'s choices: "Fill this hole" on the `?` under
the cursor and "Fill every hole" when the document has several.

Listing them is cheap (the `?`s of the text, outside comments and strings); the solve runs only when the
user picks one (codeAction/resolve), on the model worker thread, in-process: the same search as `planlang
solve` (planlang.solve.driver, the time objective) on the document's current text, validated against its
model as `check --model` does, the search within TIME_LIMIT seconds (anytime: the best plan priced by then,
and a message says the search was cut). Its edit replaces just the picked `?` (or every `?`) with the text
`planlang solve` writes there (planlang.solve.holes); the rest of the document is left as the user wrote it
(solve's output is also formatted and gets a header; the action does neither).

A client that cannot resolve an action's edit (codeAction.resolveSupport without "edit") is not offered
these actions: computing the edit while listing would run the solver at every cursor move. When the
solve cannot fill the hole (no model, errors in the plan, no plan fits the budget, nothing priced in time,
the document changed meanwhile), the resolved action has no edit and `disabled.reason` says why.
"""
from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from dataclasses import dataclass
from typing import Any, Callable

from lsprotocol import types as L

from planlang.lang.diagnostics import Severity
from planlang.lang.lexical import inside
from planlang.solve.holes import HoleOutsidePlan, edits, written  # torch-free: the text solve writes

from .analysis import reader
from .model_checks import model_layer_available
from .positions import LineIndex

log = logging.getLogger("planlang.lsp")
FILL = "refactor.rewrite.fill.planlang"  # a sub-kind of refactor.rewrite: a client asking for refactors gets it
TIME_LIMIT = 10.0  # seconds for one solve: an editor action, not a full search (`planlang solve` runs longer)
FILL_ONE = "Fill this hole (planlang solve)"
FILL_ALL = "Fill every hole (planlang solve)"
_MARK = "planlang.fill"  # the key of the action's data that says it is one of these


class FillRefused(Exception):
    """The solve cannot fill the holes; the message says why (shown to the user, no traceback)."""


@dataclass(frozen=True)
class Filled:
    """A solve's text edits (offsets into the text it solved) and a note for the user (a cut search)."""

    edits: tuple[tuple[int, int, str], ...]
    note: str | None = None


def hole_offsets(text: str) -> list[int]:
    """The offsets of the `?`s of `text` outside comments and strings (each a hole)."""
    out = []
    for m in re.finditer(r"\?", text):
        line_start = text.rfind("\n", 0, m.start()) + 1
        if inside(text, m.start(), line_start) is None:
            out.append(m.start())
    return out


def fill_actions(text: str, doc_uri: str, version: int | None, rng: L.Range, encoding: str) -> list[L.CodeAction]:
    """The fill actions at `rng` (none away from a hole), without edits: `data` says what to fill."""
    holes = hole_offsets(text)
    if not holes:
        return []
    index = LineIndex(text, encoding)
    start, end = index.offset(rng.start), index.offset(rng.end)
    here = [q for q in holes if q <= end and start <= q + 1]  # a cursor just after the `?` is on it too
    if not here:
        return []
    data = {_MARK: True, "uri": doc_uri, "version": version}
    out = [L.CodeAction(title=FILL_ONE, kind=FILL, data=data | {"holes": here[:1]})]
    if len(holes) > 1:
        out.append(L.CodeAction(title=FILL_ALL + f" ({len(holes)})", kind=FILL, data=data | {"holes": holes}))
    return out


def is_fill(action: L.CodeAction) -> bool:
    return bool(_data(action).get(_MARK))


def _data(action: L.CodeAction) -> dict:
    return action.data if isinstance(action.data, dict) else {}


def solve_fills(text: str, path: str, holes: list[int], read: Callable[[str], str] | None = None,
                time_limit: float = TIME_LIMIT) -> Filled:
    """The edits that put `planlang solve`'s choice in place of each `?` at `holes` (offsets into
    `text`, the plan file `path`); FillRefused says why there are none. Imports torch (the model layer)."""
    # lazy: the model layer and the solver import torch: only when the user picks a fill
    from planlang.model.capture.load import ModelLoadError
    from planlang.model.validation import validate_file
    from planlang.runtime.program_memory import measure
    from planlang.solve.driver import Infeasible, SolveError, solve

    try:
        v = validate_file(path, text=text, program=measure, read=read)  # what `solve` checks first
        res = v.check
        errors = [d for d in res.diagnostics if d.severity is Severity.ERROR]
        if errors or res.plan is None:
            first = errors[0] if errors else None
            said = f" ({first.code} at line {first.span.line}: {first.message})" if first else ""
            raise FillRefused(f"the plan has errors; fix them first{said}")
        if res.plan.model is None:
            raise FillRefused("the plan declares no model; solve needs one to price plans")
        # the search `planlang solve` runs, its result's fills placed in the text it read; the limit counts
        # from here: the first validation's torch import and model build vary with the machine
        result = solve(path, "time", log.debug, time_limit=time_limit, started=time.monotonic(), validated=v)
        where = edits(res.sources[path].text if path in res.sources else text, path, result.fills)
    except FillRefused:
        raise
    except Infeasible as err:
        raise FillRefused(str(err)) from None
    except (SolveError, ModelLoadError, HoleOutsidePlan) as err:
        raise FillRefused((getattr(err, "message", None) or str(err)).split("\n", 1)[0]) from None
    out = []
    for q in holes:
        f = where.get((q, q + 1))
        if f is None:
            line = text.count("\n", 0, q)
            col = q - (text.rfind("\n", 0, q) + 1)
            raise FillRefused(f"planlang solve chose no value for the hole at line {line + 1}, column {col + 1}")
        out.append(_edit(text, q, written(f), f.drop_line))
    note = None
    if result.cut is not None:
        note = (f"planlang solve stopped at the editor's {time_limit:g} s limit ({result.cut}): this is the best "
                "plan it priced; run `planlang solve` for the full search")
    return Filled(tuple(out), note)


def _edit(text: str, q: int, value: str, drop_line: str) -> tuple[int, int, str]:
    """The edit of one `?` as `planlang.solve.holes.fill_holes` makes it, before solve formats the file."""
    line_start = text.rfind("\n", 0, q) + 1
    line_end = text.find("\n", q)
    line_end = len(text) if line_end < 0 else line_end
    line = text[line_start:line_end].rstrip("\r")
    indent = line[:len(line) - len(line.lstrip())]
    if drop_line:  # the statement becomes a comment saying why (e.g. no checkpointing)
        return line_start, line_start + len(line), f"{indent}# {drop_line}"
    return q, q + 1, value.replace("\n", "\n" + indent)  # statements on lines of their own, indented alike


def resolved(action: L.CodeAction, text: str, encoding: str, outcome: Filled | str) -> L.CodeAction:
    """`action` with its edit (the fills, on `text`), or disabled with the reason (`outcome` a str)."""
    if isinstance(outcome, str):
        action.disabled = L.CodeActionDisabled(reason=outcome)
        action.edit = None
        return action
    index = LineIndex(text, encoding)
    doc_uri = _data(action)["uri"]
    action.edit = L.WorkspaceEdit(changes={doc_uri: [L.TextEdit(index.offset_range(s, e), t)
                                                     for s, e, t in outcome.edits]})
    return action


def stale(action: L.CodeAction, version: int | None) -> str | None:
    """Why the action no longer applies to the document at `version`, or None."""
    if _data(action).get("version") != version:
        return "the document changed since the action was offered; ask for code actions again"
    return None


async def resolve(ls: Any, action: L.CodeAction) -> L.CodeAction:
    """codeAction/resolve for a fill action: solve on the model worker thread (`ls.model_pool`), then the
    action with its edit, or disabled with the reason, which window/showMessage also tells the user (a
    client applies a resolved action without showing why it has no edit)."""
    data = _data(action)
    doc_uri = data.get("uri")
    st = ls.docs.get(doc_uri)
    why = None if st is not None else "the document is no longer open"
    if st is not None:
        st = ls.state(doc_uri)
        why = stale(action, st.version)
    if why is None and not model_layer_available():
        why = "filling a hole runs planlang solve, which needs the model layer (torch); it is not installed here"
    filled: Filled | None = None
    if why is None:
        analysis = st.analysis
        texts = {os.path.realpath(p): s.text for p, s in analysis.result.sources.items()}  # as diagnostics read them
        read = reader(lambda p: texts.get(os.path.realpath(p)))
        try:
            filled = await asyncio.get_running_loop().run_in_executor(
                getattr(ls, "model_pool", None), solve_fills, analysis.text, analysis.path,
                list(data.get("holes", [])), read)
        except FillRefused as err:
            why = str(err)
        except Exception as err:  # noqa: BLE001 - a bug in the solver: keep serving, say so
            log.exception("planlang solve failed for %s", doc_uri)
            why = f"planlang solve failed: {err!r}"
        if why is None and (doc_uri not in ls.docs or ls.docs[doc_uri].version != st.version):
            why = "the document changed while planlang solve ran; pick the action again"
    if why is not None or filled is None:
        why = why or "planlang solve filled nothing"
        what = "the hole" if len(data.get("holes", [])) == 1 else "the holes"
        ls.window_show_message(L.ShowMessageParams(L.MessageType.Warning, f"planlang: cannot fill {what}: {why}"))
        return resolved(action, "", ls.encoding, why)
    if filled.note:
        ls.window_show_message(L.ShowMessageParams(L.MessageType.Info, f"planlang: {filled.note}"))
    return resolved(action, st.analysis.text, ls.encoding, filled)
