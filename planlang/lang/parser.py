"""Parse plan text into the typed AST (`planlang.lang.ast`), with located syntax diagnostics.

Lark (LALR, contextual lexer) does the parsing; this module owns the boundary: it builds AST nodes with
spans, keeps comments for the formatter, and turns Lark's exceptions into PL1xx diagnostics that say in
words what was expected. After an error it blanks the offending line and parses again, so one run
reports several independent syntax errors.
"""
from __future__ import annotations

import threading
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path as FsPath

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from . import ast as A
from .diagnostics import Diagnostic, Severity
from .render._common import escape_char
from .source import SourceFile, Span
from .syntax_errors import describe_unexpected_token

# package data (in the wheel too); `grammar/` at the top of the checkout links here
GRAMMAR_PATH = FsPath(__file__).resolve().parents[1] / "grammar" / "planlang.lark"
MAX_SYNTAX_ERRORS = 20
MAX_NESTING = 64  # brackets open at once (PL106); every pass over the tree recurses once per level
MAX_DIGITS = 100  # digits of one number literal (PL107); int() refuses more than 4300


class PlanPostLex:
    """Newline handling: ignore newlines inside ( ) and [ ], fold runs of newlines into one."""

    always_accept = ("_NL",)

    def process(self, stream):
        # No lookahead here: the contextual lexer lexes each token in the parser state left by the
        # tokens already yielded, so a newline must be passed on before the next token is read.
        depth = 0
        last_nl = True  # newlines before the first statement are dropped too
        for tok in stream:
            if tok.type == "_NL":
                if depth == 0 and not last_nl:
                    last_nl = True
                    yield tok
                continue
            last_nl = False
            if tok.type in ("LPAR", "LSQB"):
                depth += 1
            elif tok.type in ("RPAR", "RSQB") and depth > 0:
                depth -= 1
            yield tok


class _CommentSink:
    """The COMMENT tokens of the parse running in this thread. Lark's lexer callbacks belong to the one
    cached parser, so the list is thread-local: parses in several threads (the language server's) do
    not see each other's comments, and need no lock."""

    def __init__(self) -> None:
        self._local = threading.local()

    @property
    def tokens(self) -> list[Token]:
        return self._local.__dict__.setdefault("tokens", [])

    @tokens.setter
    def tokens(self, value: list[Token]) -> None:
        self._local.tokens = value

    def __call__(self, tok: Token) -> Token:
        self.tokens.append(tok)
        return tok


_SINK = _CommentSink()


@lru_cache(maxsize=1)
def _lark() -> Lark:
    return Lark(
        GRAMMAR_PATH.read_text(),
        parser="lalr",
        lexer="contextual",
        postlex=PlanPostLex(),
        propagate_positions=True,
        maybe_placeholders=True,
        lexer_callbacks={"COMMENT": _SINK},
        cache=True,
    )


@dataclass(frozen=True)
class ParseResult:
    module: A.Module
    diagnostics: tuple[Diagnostic, ...]
    source: SourceFile

    @property
    def ok(self) -> bool:
        return not self.diagnostics


def parse(text: str, path: str = "<plan>") -> ParseResult:
    """Parse one file. Never raises for bad input: syntax errors come back as diagnostics."""
    source = SourceFile(path, text)
    empty = A.Module((), (), path, span=source.span(0, len(text)))
    too_deep = _nesting_diagnostic(source)
    if too_deep is not None:
        return ParseResult(empty, (too_deep,), source)
    parser = _lark()
    diags: list[Diagnostic] = []
    work = text
    blanked: dict[int, int] = {}  # line -> how much of it has been blanked (1: all but braces, 2: all)
    for _ in range(MAX_SYNTAX_ERRORS + 1):
        _SINK.tokens = []
        try:
            tree = parser.parse(work)
        except UnexpectedInput as err:
            diag = _diagnostic_for(err, source, work)
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
        comments = tuple(
            A.Comment(str(t), span=_tok_span(source, t)) for t in _SINK.tokens if _in_original(t, text)
        )
        if diags:
            return ParseResult(A.Module((), comments, path, span=source.span(0, len(text))), tuple(diags), source)
        builder = _ToAst(source)
        try:
            module = builder.transform(tree)
        except VisitError as err:  # a bug in the transformer, not the user's input
            raise err.orig_exc from err
        if builder.diags:
            return ParseResult(A.Module((), comments, path, span=empty.span), tuple(builder.diags), source)
        module = A.Module(module.statements, comments, path, span=source.span(0, len(text)))
        return ParseResult(module, (), source)
    return ParseResult(A.Module((), (), path, span=source.span(0, len(text))), tuple(diags), source)


def parse_file(path: str | FsPath) -> ParseResult:
    p = FsPath(path)
    return parse(p.read_text(encoding="utf-8"), str(path))


def _in_original(tok: Token, text: str) -> bool:
    return text[tok.start_pos:tok.end_pos] == str(tok)


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
    return "\n".join(lines)


def code_of(line: str) -> str:
    """A line without its comment and the contents of its strings (for counting braces and brackets)."""
    out, in_str = [], False
    for i, ch in enumerate(line):
        if in_str:
            in_str = not (ch == '"' and line[i - 1] != "\\")
            continue
        if ch == '"':
            in_str = True
        elif ch == "#":
            break
        else:
            out.append(ch)
    return "".join(out)


def _nesting_diagnostic(source: SourceFile) -> Diagnostic | None:
    """PL106 at the first bracket opened while MAX_NESTING are open (outside strings and comments), so
    that no later pass (the tree transformer, the resolver, the formatter) recurses without bound."""
    text = source.text
    if text.count("{") + text.count("(") + text.count("[") <= MAX_NESTING:
        return None
    depth = 0
    in_str = in_comment = False
    for i, ch in enumerate(text):
        if in_comment:
            in_comment = ch != "\n"
        elif in_str:
            if ch == "\n" or (ch == '"' and text[i - 1] != "\\"):
                in_str = False
        elif ch == "#":
            in_comment = True
        elif ch == '"':
            in_str = True
        elif ch in "{([":
            depth += 1
            if depth > MAX_NESTING:
                return Diagnostic(
                    "PL106", Severity.ERROR, f"brackets nested more than {MAX_NESTING} deep",
                    source.span(i, i + 1),
                    help=f"a plan nests a few levels; flatten this to at most {MAX_NESTING} open brackets",
                )
        elif ch in "})]" and depth > 0:
            depth -= 1
    return None


def _tok_span(source: SourceFile, tok: Token) -> Span:
    start = tok.start_pos or 0
    end = tok.end_pos if tok.end_pos is not None else start + len(str(tok))
    return source.span(start, end)


def _diagnostic_for(err: UnexpectedInput, source: SourceFile, work: str) -> Diagnostic:
    if isinstance(err, UnexpectedCharacters):
        pos = err.pos_in_stream
        ch = work[pos] if pos < len(work) else ""
        if ch == '"':
            end = work.find("\n", pos)
            end = len(work) if end < 0 else end
            return Diagnostic(
                "PL103", Severity.ERROR, "unterminated string", source.span(pos, end),
                help='close the string with `"` on the same line',
            )
        return Diagnostic(
            "PL102", Severity.ERROR, f"unexpected character {_describe_char(ch)}", source.span(pos, pos + 1),
            help=_char_help(ch),
        )
    if isinstance(err, UnexpectedEOF) or (isinstance(err, UnexpectedToken) and err.token.type == "$END"):
        return _eof_diagnostic(source, work)
    assert isinstance(err, UnexpectedToken)
    tok = err.token
    start = tok.start_pos if tok.start_pos is not None else 0
    end = tok.end_pos if tok.end_pos is not None else start + max(1, len(str(tok)))
    if tok.type == "_NL":
        end = start + 1
    expected = _accepted(err)
    names = {t.name: t.pattern.value for t in _lark().terminals}
    message, help_ = describe_unexpected_token(tok, expected, work, names)
    return Diagnostic("PL101", Severity.ERROR, message, source.span(start, end), help=help_)


def _accepted(err: UnexpectedToken) -> set[str]:
    """The terminals the parser really accepts here (LALR's `expected` set over-approximates after a
    reduction; the interactive parser tries each candidate)."""
    try:
        acc = set(err.interactive_parser.accepts()) if err.interactive_parser is not None else set()
    except Exception:  # accepts() replays the parser; fall back to Lark's own set
        acc = set()
    return acc or set(err.expected or ())


def _describe_char(ch: str) -> str:
    """`@`, or `\\u200b` (ZERO WIDTH SPACE): a character that is not plain ASCII is escaped if it prints
    nothing or passes for a space, and named (a Cyrillic `а` looks like a Latin `a`)."""
    if " " <= ch < "\x7f":
        return f"`{ch}`"
    shown = escape_char(ch) or ch
    name = unicodedata.name(ch, "")
    return f"`{shown}` ({name})" if name else f"`{shown}` (U+{ord(ch):04X})"


def _char_help(ch: str) -> str:
    if ch == "'":
        return 'strings use double quotes: "examples.mlp:build"'
    if ch in "-+":
        return "numbers in plans are never negative; arithmetic is not part of the language"
    if ch == "=":
        return "`==` is not an operator here; use `=` to give a value"
    return "remove it, or put it inside a comment (`# ...`) or a string"


def _eof_diagnostic(source: SourceFile, work: str) -> Diagnostic:
    """An unexpected end of file is almost always an unclosed bracket: point at the opener."""
    stack: list[tuple[str, int]] = []
    pairs = {"}": "{", ")": "(", "]": "["}
    in_str = in_comment = False
    for i, ch in enumerate(work):
        if in_comment:
            in_comment = ch != "\n"
            continue
        if in_str:
            if ch == '"' and work[i - 1] != "\\":
                in_str = False
            continue
        if ch == "#":
            in_comment = True
        elif ch == '"':
            in_str = True
        elif ch in "{([":
            stack.append((ch, i))
        elif ch in "})]" and stack and stack[-1][0] == pairs[ch]:
            stack.pop()
    end = len(source.text)
    if stack:
        ch, pos = stack[-1]
        closer = {"{": "}", "(": ")", "[": "]"}[ch]
        return Diagnostic(
            "PL104", Severity.ERROR, f"unexpected end of file: `{ch}` is never closed",
            source.span(pos, pos + 1), help=f"add the matching `{closer}`",
        )
    return Diagnostic(
        "PL104", Severity.ERROR, "unexpected end of file: the last statement is incomplete",
        source.span(max(0, end - 1), end), help="finish the statement or remove it",
    )


# ------------------------------------------------------------------------------------------- tree → AST
def _unescape(raw: str) -> str:
    body = raw[1:-1]
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            out.append({"n": "\n", "t": "\t"}.get(nxt, nxt))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


class _ToAst(Transformer):
    """Lark tree → AST. Every node gets the span of the text it came from."""

    def __init__(self, source: SourceFile):
        super().__init__(visit_tokens=False)
        self.src = source
        self.diags: list[Diagnostic] = []  # PL107

    def _number(self, tok: Token, convert):
        """`convert` of the literal's digits; PL107 (and 0) for a literal of more than MAX_DIGITS digits."""
        digits = str(tok).replace("_", "")
        mantissa = digits.lower().partition("e")[0] if convert is float else digits
        if sum(c.isdigit() for c in mantissa) > MAX_DIGITS:
            self.diags.append(Diagnostic(
                "PL107", Severity.ERROR, f"a number with {sum(c.isdigit() for c in mantissa)} digits",
                self._tspan(tok), help=f"a number literal has at most {MAX_DIGITS} digits",
            ))
            return convert(0)
        return convert(digits)

    def _int(self, tok: Token) -> int:
        return self._number(tok, int)

    # helpers -----------------------------------------------------------------------
    def _span(self, meta) -> Span:
        if getattr(meta, "empty", True):
            return Span(self.src.path, 0, 0, 0, 0)
        return self.src.span(meta.start_pos, meta.end_pos)

    def _tspan(self, tok: Token) -> Span:
        return _tok_span(self.src, tok)

    def _name(self, tok) -> A.Name:
        if isinstance(tok, A.Name):
            return tok
        return A.Name(str(tok), span=self._tspan(tok))

    def _intnode(self, tok) -> A.Int:
        if isinstance(tok, A.Int):
            return tok
        return A.Int(self._int(tok), text=str(tok), span=self._tspan(tok))

    def _coerce_every(self, x):
        if isinstance(x, Token):
            return self._intnode(x)
        return x

    @staticmethod
    def _present(items):
        return tuple(i for i in items if i is not None)

    # names and values ---------------------------------------------------------------
    @v_args(meta=True)
    def name(self, meta, items):
        return A.Name(str(items[0]), span=self._span(meta))

    @v_args(meta=True)
    def dotted(self, meta, items):
        return A.Dotted(tuple(items), span=self._span(meta))

    @v_args(meta=True)
    def hole(self, meta, items):
        return A.Hole(span=self._span(meta))

    @v_args(meta=True)
    def int(self, meta, items):
        return self._intnode(items[0])

    @v_args(meta=True)
    def float(self, meta, items):
        tok = items[0]
        return A.Float(self._number(tok, float), text=str(tok), span=self._tspan(tok))

    @v_args(meta=True)
    def string(self, meta, items):
        tok = items[0]
        return A.Str(_unescape(str(tok)), text=str(tok), span=self._tspan(tok))

    @v_args(meta=True)
    def unit(self, meta, items):
        text = str(items[0]) + ("" if items[1] is None else "/" + str(items[1]))
        return A.Unit(text, span=self._span(meta))

    @v_args(meta=True)
    def quantity(self, meta, items):
        return A.Quantity(items[0], items[1], span=self._span(meta))

    @v_args(meta=True)
    def ref(self, meta, items):
        return A.Ref(items[0], span=self._span(meta))

    @v_args(meta=True)
    def list(self, meta, items):
        return A.ListValue(self._present(items), span=self._span(meta))

    # paths ----------------------------------------------------------------------------
    @v_args(meta=True)
    def index(self, meta, items):
        return A.Index(self._int(items[0]), span=self._span(meta))

    @v_args(meta=True)
    def slice(self, meta, items):
        a, b = items
        return A.Slice(None if a is None else self._int(a), None if b is None else self._int(b), span=self._span(meta))

    @v_args(meta=True)
    def star(self, meta, items):
        return A.Star(span=self._span(meta))

    @v_args(meta=True)
    def segment(self, meta, items):
        head, *sels = items
        text = head.text if isinstance(head, A.Name) else str(head)
        return A.Segment(text, tuple(sels), span=self._span(meta))

    @v_args(meta=True)
    def path(self, meta, items):
        return A.Path(tuple(items), span=self._span(meta))

    @v_args(meta=True)
    def rooted_path(self, meta, items):
        sels = tuple(i for i in items if not isinstance(i, A.Segment))
        segs = tuple(i for i in items if isinstance(i, A.Segment))
        first_end = sels[-1].span
        root = A.Segment("", sels, span=sels[0].span.cover(first_end))
        return A.Path((root,) + segs, span=self._span(meta))

    @v_args(meta=True)
    def act_kind(self, meta, items):
        return str(items[0])

    @v_args(meta=True)
    def activation(self, meta, items):
        return A.Activation(items[0], items[1], span=self._span(meta))

    # specs -----------------------------------------------------------------------------
    @v_args(meta=True)
    def axis_entry(self, meta, items):
        return A.AxisEntry(items[0], span=self._span(meta))

    @v_args(meta=True)
    def axis_tuple(self, meta, items):
        return A.AxisTuple(tuple(items), span=self._span(meta))

    @v_args(meta=True)
    def replicated(self, meta, items):
        return A.Replicated(span=self._span(meta))

    @v_args(meta=True)
    def partial(self, meta, items):
        return tuple(items)

    @v_args(meta=True)
    def spec(self, meta, items):
        *entries, partial = items
        return A.Spec(self._present(entries), partial or (), span=self._span(meta))

    # statements -------------------------------------------------------------------------
    @v_args(meta=True)
    def use_alias(self, meta, items):
        return items[0]

    @v_args(meta=True)
    def use_stmt(self, meta, items):
        target, alias = items
        if isinstance(target, Token):
            target = A.Str(_unescape(str(target)), text=str(target), span=self._tspan(target))
        return A.Use(target, alias, span=self._span(meta))

    @v_args(meta=True)
    def kwarg(self, meta, items):
        return A.KwArg(items[0], items[1], span=self._span(meta))

    @v_args(meta=True)
    def call_args(self, meta, items):
        return self._present(items)

    @v_args(meta=True)
    def model_decl(self, meta, items):
        name, factory, args = items
        fac = A.Str(_unescape(str(factory)), text=str(factory), span=self._tspan(factory))
        return A.ModelDecl(name, fac, args, span=self._span(meta))

    @v_args(meta=True)
    def dim_decl(self, meta, items):
        return A.DimDecl(items[0], self._intnode(items[1]), span=self._span(meta))

    @v_args(meta=True)
    def input_decl(self, meta, items):
        name, dtype, *dims = items
        return A.InputDecl(name, dtype, self._present(dims), span=self._span(meta))

    @v_args(meta=True)
    def field_over(self, meta, items):
        return items[0]

    @v_args(meta=True)
    def field(self, meta, items):
        return A.Field(items[0], items[1], items[2], span=self._span(meta))

    @v_args(meta=True)
    def device_decl(self, meta, items):
        return A.DeviceDecl(items[0], self._present(items[1:]), span=self._span(meta))

    @v_args(meta=True)
    def link_decl(self, meta, items):
        return A.LinkDecl(items[0], self._present(items[1:]), span=self._span(meta))

    @v_args(meta=True)
    def mesh_count(self, meta, items):
        return self._intnode(items[0])

    @v_args(meta=True)
    def axis_link(self, meta, items):
        return items[0]

    @v_args(meta=True)
    def axis_decl(self, meta, items):
        return A.AxisDecl(items[0], items[1], items[2], span=self._span(meta))

    @v_args(meta=True)
    def mesh_decl(self, meta, items):
        name, count, device, *axes = items
        return A.MeshDecl(name, count, device, self._present(axes), span=self._span(meta))

    @v_args(meta=True)
    def mesh_alias(self, meta, items):
        return A.MeshAlias(items[0], items[1], span=self._span(meta))

    @v_args(meta=True)
    def per_device(self, meta, items):
        return True

    @v_args(meta=True)
    def budget_decl(self, meta, items):
        return A.BudgetDecl(items[0], bool(items[1]), span=self._span(meta))

    @v_args(meta=True)
    def optimizer_block(self, meta, items):
        return self._present(items)

    @v_args(meta=True)
    def optimizer_decl(self, meta, items):
        name, args, block = items
        return A.OptimizerDecl(name, args, block, span=self._span(meta))

    @v_args(meta=True)
    def data_decl(self, meta, items):
        return A.DataDecl(items[0], items[1], span=self._span(meta))

    @v_args(meta=True)
    def shard_stmt(self, meta, items):
        return A.ShardStmt(items[0], items[1], span=self._span(meta))

    @v_args(meta=True)
    def schedule_chunks(self, meta, items):
        return items[0]

    @v_args(meta=True)
    def schedule(self, meta, items):
        if isinstance(items[0], A.Hole):
            return items[0]
        tok, chunks = items
        return A.Schedule(A.Name(str(tok), span=self._tspan(tok)), chunks, span=self._span(meta))

    @v_args(meta=True)
    def degree(self, meta, items):
        return A.Degree(items[0], items[1], span=self._span(meta))

    @v_args(meta=True)
    def stage_with(self, meta, items):
        return tuple(items)

    @v_args(meta=True)
    def stage_decl(self, meta, items):
        *paths, degrees = items
        return A.StageDecl(tuple(paths), degrees or (), span=self._span(meta))

    @v_args(meta=True)
    def stages(self, meta, items):
        return self._present(items)

    @v_args(meta=True)
    def stages_hole(self, meta, items):
        return items[0]

    @v_args(meta=True)
    def pipeline_decl(self, meta, items):
        axis, schedule, micro, stages = items
        return A.PipelineDecl(axis, schedule, micro, stages, span=self._span(meta))

    @v_args(meta=True)
    def checkpoint_every(self, meta, items):
        return self._coerce_every(items[0])

    @v_args(meta=True)
    def checkpoint_stmt(self, meta, items):
        *paths, every = items
        return A.CheckpointStmt(tuple(paths), every, span=self._span(meta))

    @v_args(meta=True)
    def checkpoint_hole(self, meta, items):
        return A.CheckpointStmt(items[0], None, span=self._span(meta))

    @v_args(meta=True)
    def param(self, meta, items):
        return A.Param(items[0], items[1], span=self._span(meta))

    @v_args(meta=True)
    def block(self, meta, items):
        return self._present(items)

    @v_args(meta=True)
    def template_decl(self, meta, items):
        name, *rest = items
        body = rest[-1]
        params = self._present(rest[:-1])
        return A.TemplateDecl(name, params, body, span=self._span(meta))

    @v_args(meta=True)
    def template_args(self, meta, items):
        return self._present(items)

    @v_args(meta=True)
    def apply_stmt(self, meta, items):
        return A.ApplyStmt(items[0], items[1], items[2], span=self._span(meta))

    @v_args(meta=True)
    def for_stmt(self, meta, items):
        return A.ForStmt(items[0], items[1], items[2], span=self._span(meta))

    @v_args(meta=True)
    def start(self, meta, items):
        return A.Module(self._present(items), span=self._span(meta))
