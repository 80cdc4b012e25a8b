"""A Pygments lexer for planlang (`.plan` files), used by the docs (scripts/highlight_docs.py) and by any
Pygments-based tool once planlang is installed (entry point `pygments.lexers`: `planlang`).

grammar/planlang.lark is the one source of truth for the syntax; tests/editors checks this lexer against
it (every keyword, and the keyword/name decision at every token of the examples). All keywords are soft:
each is also an ordinary name (`attention.output.dense`, `for x in ...`), so the lexer follows the
statement structure — a keyword is only lexed as one where the grammar puts it — rather than matching
words anywhere. The constants below are written out here, not imported: planlang.lang sits below
planlang.plan, which holds the checked lists (dtypes, units, schedules, optimizers); the tests compare them.
"""
from __future__ import annotations

from pygments.lexer import RegexLexer, bygroups, default, include, words
from pygments.token import (
    Comment, Error, Keyword, Name, Number, Operator, Punctuation, String, Whitespace,
)

__all__ = ["PlanLexer", "KEYWORDS", "DTYPES", "SCHEDULES", "OPTIMIZERS", "PARAM_KINDS", "UNIT_PATTERN"]

# The literal words of grammar/planlang.lark (all soft keywords, listed in its `!name` rule).
KEYWORDS = (
    "use", "as", "model", "input", "device", "link", "mesh", "of", "x", "over", "budget", "per",
    "optimizer", "data", "shard", "output", "pipeline", "schedule", "microbatches", "chunks", "stage",
    "with", "checkpoint", "every", "template", "apply", "to", "for", "in", "partial",
)
DTYPES = (
    "f64", "float64", "f32", "float32", "fp32", "tf32", "f16", "float16", "fp16", "bf16", "bfloat16", "fp8",
    "i64", "int64", "i32", "int32", "i16", "int16", "i8", "int8", "u8", "uint8", "bool",
)
SCHEDULES = ("gpipe", "1f1b", "interleaved", "looped_bfs", "zero_bubble", "zbv", "dualpipev")
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "adagrad", "rmsprop", "adafactor", "lion")
PARAM_KINDS = ("axis", "int")
# memory (B, KB, KiB, ...), bandwidth (GB/s, GiB/s, Gb/s, Gbps), throughput (TFLOPS, TFLOP/s), time (us)
UNIT_PATTERN = (r"[KMGTP]i?B/s|[KMGTP]i?B|B/s|B|[KMGTP]b/s|[KMGTP]bps|[KMGTP]?FLOP/s|[KMGTP]?FLOPS"
                r"|[num]?s")

# Token types of our own, below standard ones so every style colours them.
Unit = Number.Unit
Hole = Keyword.Pseudo
Replicated = Name.Builtin.Pseudo

_ID = r"[A-Za-z_][A-Za-z0-9_]*"
_INT = r"[0-9](?:_?[0-9])*"
_FLOAT = r"[0-9](?:_?[0-9])*\.[0-9](?:_?[0-9])*(?:[eE][+-]?[0-9]+)?|[0-9](?:_?[0-9])*[eE][+-]?[0-9]+"
_START = r"(?:^|(?<=[;{]))([ \t]*)"  # statements start a line or follow `;` / `{` (grammar layout rules)
_GUARD = r"\b(?![.\[]|[ \t]*[=:,])"  # a keyword followed by these is a name: `model.layers`, `stage = 2`
_SOFT = r"(?<![\w.])"                # a contextual keyword is never part of a dotted name
_END = r"(?=[;}\n])"                 # a statement ends at a newline, `;` or the `}` of its block


def _nothing(lexer, match):
    """Action for a zero-width end-of-statement match: change state, emit no (empty) token."""
    return iter(())


def _stmt(word: str, state: str, token=Keyword):
    return (_START + f"({word})" + _GUARD, bygroups(Whitespace, token), state)


def _named_stmt(word: str, state: str, name_token, token=Keyword):
    """A statement whose keyword is followed by the name it declares."""
    return (_START + f"({word})" + _GUARD + rf"(?:([ \t]+)({_ID}))?", bygroups(Whitespace, token, Whitespace, name_token),
            state)


def _kw(word: str, token=Keyword):
    return (_SOFT + f"({word})" + r"\b(?![.\[]|[ \t]*[=:])", token)


class PlanLexer(RegexLexer):
    """planlang: declarative distributed-training plans (`.plan`)."""

    name = "planlang"
    aliases = ["plan", "planlang"]
    filenames = ["*.plan"]
    mimetypes = ["text/x-planlang"]

    tokens = {
        # ------------------------------------------------------------------ lexical pieces
        "space": [
            (r"\n", Whitespace),
            (r"[ \t\f\r]+", Whitespace),
            (r"(\\)([ \t]*)(?=\n)", bygroups(Punctuation, Whitespace), "continuation"),
            (r"#", Comment.Single, "comment"),
        ],
        "inline-space": [  # inside a statement: a newline ends it, unless inside ( ) or [ ] or after `\`
            (r"[ \t\f\r]+", Whitespace),
            (r"(\\)([ \t]*)(?=\n)", bygroups(Punctuation, Whitespace), "continuation"),
            (r"#", Comment.Single, "comment"),
        ],
        "continuation": [(r"\n", Whitespace, "#pop")],
        "comment": [
            (r"([ \t]*)(plan)(:)([ \t]*)(ignore-file|ignore)(\[)",
             bygroups(Comment.Single, Comment.Special, Comment.Special, Comment.Single, Comment.Special,
                      Comment.Special), "suppression"),
            (r"[^\n]+", Comment.Single),
            default("#pop"),
        ],
        "suppression": [
            (r"\]", Comment.Special, "#pop"),
            (r"[A-Za-z0-9_]+", Comment.Preproc),
            (r"[^\]\n]", Comment.Single),
            default("#pop"),
        ],
        "string": [
            (r'"', String.Double, "#pop"),
            (r"\\.", String.Escape),
            (r'[^"\\\n]+', String.Double),
            default("#pop"),  # unclosed at the end of the line (PL103)
        ],
        "illegal": [(r"[-+']", Error)],
        "number": [
            (rf"(?<![\w.])({_FLOAT})([ \t]*)({UNIT_PATTERN})(?![\w/])", bygroups(Number.Float, Whitespace, Unit)),
            (rf"(?<![\w.])({_INT})([ \t]*)({UNIT_PATTERN})(?![\w/])", bygroups(Number.Integer, Whitespace, Unit)),
            (rf"(?<![\w.])(?:{_FLOAT})(?![\w.])", Number.Float),
            (rf"(?<![\w.]){_INT}(?![\w.])", Number.Integer),
        ],
        "hole": [(r"\?", Hole)],
        "value": [
            (r'"', String.Double, "string"),
            include("number"),
            include("hole"),
            (r"\[", Punctuation, "list"),
            (r",", Punctuation),
            (r"(?<![\w.])(true|false|none)\b(?![ \t]*\.)", Keyword.Constant),
            (_ID, Name),
            (r"\.", Punctuation),
        ],
        "list": [include("space"), include("value"), (r"\]", Punctuation, "#pop")],
        "call-args": [
            include("space"),
            (rf"({_ID})([ \t]*)(=)", bygroups(Name.Attribute, Whitespace, Operator)),
            include("value"),
            (r"\)", Punctuation, "#pop"),
        ],
        "qualified": [  # a dotted reference: qualifiers are namespaces
            (rf"({_ID})([ \t]*)(\.)", bygroups(Name.Namespace, Whitespace, Punctuation)),
        ],
        # ------------------------------------------------------------------ paths and specs
        "path": [
            (r"\[", Punctuation, "selector"),
            (r"\*\*?", Operator),
            (r"[A-Za-z0-9_]+", Name),
            (r"[.,]", Punctuation),
        ],
        "selector": [
            (r"[ \t\n]+", Whitespace),
            (r"\*", Operator),
            (_INT, Number.Integer),
            (r":", Punctuation),
            (r"\]", Punctuation, "#pop"),
        ],
        "spec-tail": [  # after the `:` of shard and data: [entries] [partial(axes)], or ?
            include("inline-space"),
            (_END, _nothing, "#pop"),
            (r"\[", Punctuation, "spec"),
            (_SOFT + r"(partial)([ \t]*)(\()", bygroups(Keyword, Whitespace, Punctuation), "axis-list"),
            include("hole"),
        ],
        "spec": [
            include("space"),
            include("hole"),
            (r"(?<![\w.])_(?![\w.])", Replicated),
            (r"\(", Punctuation, "axis-list"),
            (_ID, Name.Variable),
            (r",", Punctuation),
            (r"\]", Punctuation, "#pop"),
        ],
        "axis-list": [
            include("space"),
            (_ID, Name.Variable),
            (r",", Punctuation),
            (r"\)", Punctuation, "#pop"),
        ],
        # ------------------------------------------------------------------ statements
        "statements": [
            _stmt("use", "use", Keyword.Namespace),
            _named_stmt("model", "model", Name.Class),
            _named_stmt("input", "input", Name.Variable),
            _named_stmt("device", "decl-block", Name.Class),
            _named_stmt("link", "decl-block", Name.Class),
            _named_stmt("mesh", "mesh", Name.Class),
            _stmt("budget", "budget"),
            (_START + r"(optimizer)" + _GUARD + rf"(?:([ \t]+)(?:({'|'.join(OPTIMIZERS)})\b|({_ID})))?",
             bygroups(Whitespace, Keyword, Whitespace, Name.Builtin, Name), "decl-block"),
            _named_stmt("data", "data", Name.Variable),
            _stmt("pipeline", "pipeline"),
            _stmt("microbatches", "microbatches"),
            _named_stmt("template", "template", Name.Function),
        ],
        "body-statements": [
            _stmt("shard", "shard-head"),
            _stmt("checkpoint", "checkpoint"),
            (_START + r"(apply)" + _GUARD + rf"(?:([ \t]+)((?:{_ID}[ \t]*\.[ \t]*)*)({_ID}))?",
             bygroups(Whitespace, Keyword, Whitespace, Name.Namespace, Name.Function), "apply"),
            _named_stmt("for", "for", Name.Variable),
        ],
        "root": [
            include("statements"),
            include("body-statements"),
            include("space"),
            (r";", Punctuation),
            include("illegal"),
            include("value"),
            (r"[{}()\]]", Punctuation),
        ],
        "use": [
            include("inline-space"),
            (_END, _nothing, "#pop"),
            (r'"', String.Double, "string"),
            (_SOFT + rf"(as)\b(?:([ \t]+)({_ID}))?", bygroups(Keyword.Namespace, Whitespace, Name.Namespace)),
            (_ID, Name.Namespace),
            (r"\.", Punctuation),
        ],
        "model": [
            include("inline-space"),
            (_END, _nothing, "#pop"),
            (r"=", Operator),
            (r'"', String.Double, "string"),
            (r"\(", Punctuation, "call-args"),
        ],
        "input": [
            include("inline-space"),
            (_END, _nothing, "#pop"),
            (r":", Punctuation),
            (words(DTYPES, prefix=r"(?<![\w.])", suffix=r"\b"), Keyword.Type),
            (_ID, Name),
            (r"\[", Punctuation, "dims"),
        ],
        "dims": [
            include("space"),
            (rf"({_ID})([ \t]*)(=)", bygroups(Name.Attribute, Whitespace, Operator)),
            include("number"),
            (r",", Punctuation),
            (r"\]", Punctuation, "#pop"),
        ],
        "decl-block": [  # device, link, optimizer: [call args] { field = value ... }
            include("inline-space"),
            (_END, _nothing, "#pop"),
            include("illegal"),
            (r"\(", Punctuation, "call-args"),
            (r"\{", Punctuation, "fields"),
        ],
        "fields": [  # block items first: they match their leading indentation (see _START)
            (_START + rf"({_ID})(?=[ \t]*(?:\.[ \t]*{_ID}[ \t]*)*=)", bygroups(Whitespace, Name.Attribute), "field-key"),
            include("space"),
            (r";", Punctuation),
            (r"\}", Punctuation, "#pop"),
        ],
        "field-key": [
            (r"[ \t]+", Whitespace),
            (words(DTYPES, prefix=r"(?<=\.)", suffix=r"\b"), Keyword.Type),
            (_ID, Name.Attribute),
            (r"\.", Punctuation),
            (r"=", Operator, ("#pop", "field")),
        ],
        "field": [
            include("inline-space"),
            (_END, _nothing, "#pop"),
            include("illegal"),
            (_SOFT + rf"(over)\b(?:([ \t]+)(?:({_ID})|(\?)))?", bygroups(Keyword, Whitespace, Name.Variable, Hole)),
            include("value"),
        ],
        "mesh": [
            include("inline-space"),
            (_END, _nothing, "#pop"),
            include("illegal"),
            _kw("of"),
            (rf"(?<![\w.])({_INT})([ \t]*)(x)\b", bygroups(Number.Integer, Whitespace, Keyword)),
            (rf"(=)([ \t]*)((?:{_ID}[ \t]*\.[ \t]*)*)({_ID})?", bygroups(Operator, Whitespace, Name.Namespace, Name.Class)),
            (r"\{", Punctuation, "axes"),
            include("qualified"),
            (_ID, Name.Class),
        ],
        "axes": [
            (_START + rf"({_ID})([ \t]*)(=)", bygroups(Whitespace, Name.Variable, Whitespace, Operator), "axis"),
            include("space"),
            (r";", Punctuation),
            (r"\}", Punctuation, "#pop"),
        ],
        "axis": [
            include("inline-space"),
            (_END, _nothing, "#pop"),
            include("illegal"),
            include("number"),
            include("hole"),
            _kw("over"),
            include("qualified"),
            (_ID, Name.Class),
        ],
        "budget": [
            include("inline-space"),
            (_END, _nothing, "#pop"),
            include("illegal"),
            (_SOFT + r"(per)([ \t]+)(device)\b(?![ \t]*\.)", bygroups(Keyword, Whitespace, Keyword)),
            include("value"),
        ],
        "microbatches": [  # `microbatches N` at the top level (gradient accumulation)
            include("inline-space"),
            (_END, _nothing, "#pop"),
            include("illegal"),
            include("value"),
        ],
        "data": [
            include("inline-space"),
            (_END, _nothing, "#pop"),
            (r":", Punctuation, ("#pop", "spec-tail")),
        ],
        "shard-head": [
            (r"([ \t]+)(output|input)([ \t]+)(of)\b", bygroups(Whitespace, Keyword, Whitespace, Keyword),
             ("#pop", "shard")),
            default(("#pop", "shard")),
        ],
        "shard": [
            include("inline-space"),
            (_END, _nothing, "#pop"),
            include("illegal"),
            (r":", Punctuation, ("#pop", "spec-tail")),
            include("path"),
        ],
        "pipeline": [
            include("inline-space"),
            (_END, _nothing, "#pop"),
            include("illegal"),
            (_SOFT + rf"(over)\b(?:([ \t]+)(?:({_ID})|(\?)))?", bygroups(Keyword, Whitespace, Name.Variable, Hole)),
            (_SOFT + rf"(schedule)\b(?:([ \t]+)(?:({'|'.join(SCHEDULES)})\b|(\?)|((?!(?:microbatches|chunks)\b)[A-Za-z0-9_]+)))?",
             bygroups(Keyword, Whitespace, Name.Constant, Hole, Name)),
            _kw("chunks"),
            _kw("microbatches"),
            include("number"),
            include("hole"),
            (r"\{", Punctuation, "stages"),
        ],
        "stages": [
            _stmt("stage", "stage"),
            include("space"),
            (r";", Punctuation),
            (r"\}", Punctuation, "#pop"),
            include("hole"),
        ],
        "stage": [
            include("inline-space"),
            (_END, _nothing, "#pop"),
            include("illegal"),
            _kw("with"),
            (rf"({_ID})([ \t]*)(=)", bygroups(Name.Variable, Whitespace, Operator)),
            include("number"),
            include("hole"),
            include("path"),
        ],
        "checkpoint": [
            include("inline-space"),
            (_END, _nothing, "#pop"),
            include("illegal"),
            (_SOFT + rf"(every)\b(?![.\[])(?:([ \t]+)(?:({_INT})\b|(\?)|({_ID})))?",
             bygroups(Keyword, Whitespace, Number.Integer, Hole, Name.Variable)),
            include("hole"),
            include("path"),
        ],
        "template": [
            include("inline-space"),
            (_END, _nothing, "#pop"),
            (r"\(", Punctuation, "params"),
            (r"\{", Punctuation, "body"),
        ],
        "params": [
            include("space"),
            (rf"({_ID})([ \t]*)(:)(?:([ \t]*)(?:({'|'.join(PARAM_KINDS)})\b|({_ID})))?",
             bygroups(Name.Variable, Whitespace, Punctuation, Whitespace, Keyword.Type, Name)),
            (r",", Punctuation),
            (r"\)", Punctuation, "#pop"),
        ],
        "body": [
            include("body-statements"),
            include("space"),
            (r";", Punctuation),
            (r"\}", Punctuation, "#pop"),
        ],
        "apply": [
            include("inline-space"),
            (_END, _nothing, "#pop"),
            include("illegal"),
            (r"\(", Punctuation, "apply-args"),
            _kw("to"),
            include("path"),
        ],
        "apply-args": [
            include("space"),
            include("number"),
            include("hole"),
            (_ID, Name.Variable),
            (r",", Punctuation),
            (r"\)", Punctuation, "#pop"),
        ],
        "for": [
            include("inline-space"),
            (_END, _nothing, "#pop"),
            include("illegal"),
            _kw("in"),
            (r"\{", Punctuation, "body"),
            include("path"),
        ],
    }

