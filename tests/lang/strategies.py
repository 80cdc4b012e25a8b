"""Hypothesis strategies for plan files: random ASTs and random (valid) texts that spell them.

`plan_asts()` draws a span-free `ast.Module` covering every statement kind of the grammar.
`plan_cases()` draws `(module, text)`: the module plus one random spelling of it — random spacing
(none, several spaces, tabs, line continuations), `;` or newlines between statements and block items,
blocks written inline or over several lines, line breaks inside ( ) and [ ], runs of blank lines and
comments in every position a comment can go (full-line, trailing, after `{`, inside brackets).
`parse(text).module == module` is expected to hold (AST equality ignores spans and literal text).
`plan_texts()` draws the text only. `render_module(module, seed)` spells a given module (the layout
choices come from a `random.Random(seed)`, one Hypothesis draw, which keeps generation fast; the tree
shrinks normally).

Importing this module has no side effects (no settings profiles are registered).

Known parser quirk the strategies steer around: an `optimizer` statement without a block whose
source text contains `{` anywhere (in a string or a comment) is parsed as having an empty block, so
generated strings and comments never contain `{`.
"""
from __future__ import annotations

import random
from functools import lru_cache

from hypothesis import strategies as st

from planlang.lang import ast as A

__all__ = [
    "SOFT_KEYWORDS", "names", "values", "paths", "specs", "statements", "plan_asts", "plan_cases",
    "plan_texts", "render_module",
]

# Every keyword of the grammar is "soft": it may also be used as a name.
SOFT_KEYWORDS = (
    "output", "input", "model", "data", "stage", "mesh", "device", "link", "budget", "optimizer",
    "pipeline", "checkpoint", "template", "use", "as", "of", "over", "per", "schedule", "microbatches",
    "chunks", "every", "with", "partial", "to", "in", "shard", "apply", "for", "x",
)
PLAIN_NAMES = ("h", "mlp", "attn", "c_fc", "weight", "bias", "tp", "dp", "pp", "gpu", "a100", "ib", "fp32", "L2")
UNITS = ("GiB", "GB", "MiB", "GB/s", "Gbit/s", "TFLOPS", "us", "ms", "s")
# every schedule the checker knows (planlang.plan.types.SCHEDULES), and one it does not (`zb_h1`, PL215): the
# parser takes any name after `schedule`, so the printer and the parser must round-trip an unknown one too
SCHEDULES = ("gpipe", "1f1b", "interleaved", "looped_bfs", "zero_bubble", "zbv", "dualpipev", "zb_h1")
GLOBS = ("*", "**", "attn*", "*_proj", "h*x*", "_*")
DTYPES = ("int64", "int32", "float16", "bf16")

_KW = set(SOFT_KEYWORDS)

# ------------------------------------------------------------------------------------------ leaves
_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_IDENT_TAIL = _LETTERS + "0123456789_"
# `x` + random tail; a keyword gets a `_` appended; `_` alone is never a name (it is the `_` of specs)
_idents = st.builds(
    lambda head, tail: head + tail if head + tail not in _KW else head + tail + "_",
    st.sampled_from(list(_LETTERS) + ["_a", "_0", "__"]),
    st.text(_IDENT_TAIL, max_size=6),
)
_name_text = st.one_of(st.sampled_from(PLAIN_NAMES), _idents, st.sampled_from(SOFT_KEYWORDS))


@lru_cache(maxsize=None)
def names() -> st.SearchStrategy[A.Name]:
    return _name_text.map(A.Name)


@lru_cache(maxsize=None)
def dotteds(max_parts: int = 3) -> st.SearchStrategy[A.Dotted]:
    return st.lists(names(), min_size=1, max_size=max_parts).map(lambda ps: A.Dotted(tuple(ps)))


def _digits(n: int, underscores: bool) -> str:
    text = str(n)
    if underscores and len(text) > 1:  # `1_024`, `1_0_2_4`
        text = text[0] + "".join(("_" if i % 2 else "") + c for i, c in enumerate(text[1:], 1))
    return text


_int_text = st.one_of(
    st.builds(_digits, st.integers(0, 99_999), st.booleans()),
    st.sampled_from(["0", "1", "2", "8", "1_024", "4096", "007", "0_0"]),
)


@lru_cache(maxsize=None)
def ints() -> st.SearchStrategy[A.Int]:
    return _int_text.map(lambda t: A.Int(int(t.replace("_", "")), text=t))


_float_text = st.one_of(
    st.builds(
        lambda a, b, e: f"{a}.{b}{e}", _int_text, _int_text,
        st.sampled_from(["", "", "e5", "E-3", "e+12", "e07"]),
    ),
    st.builds(lambda a, e: f"{a}{e}", _int_text, st.sampled_from(["e5", "E-3", "e+12", "e0"])),
    st.sampled_from(["3e-4", "0.5", "1.0e+3", "2E5", "0.999", "1_0.0_1"]),
)


@lru_cache(maxsize=None)
def floats() -> st.SearchStrategy[A.Float]:
    return _float_text.map(lambda t: A.Float(float(t.replace("_", "")), text=t))


_STR_CHARS = "abcxyz019 :./-_+=()[]}#*?,;'"
_ESCAPES = {'\\"': '"', "\\\\": "\\", "\\n": "\n", "\\t": "\t", "\\q": "q"}
_STR_PIECES = st.lists(st.one_of(st.sampled_from(list(_STR_CHARS)), st.sampled_from(list(_ESCAPES))), max_size=12)


@st.composite
def _strings(draw) -> A.Str:
    pieces = draw(_STR_PIECES)
    text = '"' + "".join(pieces) + '"'
    value = "".join(_ESCAPES.get(p, p) for p in pieces)
    return A.Str(value, text=text)


@lru_cache(maxsize=None)
def strings() -> st.SearchStrategy[A.Str]:
    return _strings()


@lru_cache(maxsize=None)
def numbers():
    return st.one_of(ints(), floats())


@lru_cache(maxsize=None)
def quantities():
    return st.builds(lambda n, u: A.Quantity(n, A.Unit(u)), numbers(), st.sampled_from(UNITS))


@lru_cache(maxsize=None)
def values(depth: int = 2) -> st.SearchStrategy:
    leaf = st.one_of(
        quantities(), ints(), floats(), strings(), dotteds().map(A.Ref), st.just(A.Hole()),
    )
    if depth <= 0:
        return leaf
    return st.one_of(
        leaf, st.lists(values(depth - 1), max_size=4).map(lambda xs: A.ListValue(tuple(xs)))
    )


_small = st.integers(min_value=0, max_value=64)


@lru_cache(maxsize=None)
def selectors():
    return st.one_of(
        _small.map(A.Index),
        st.builds(A.Slice, st.none() | _small, st.none() | _small),
        st.just(A.Star()),
    )


_SEGMENT_HEAD = st.one_of(_name_text, _name_text, st.sampled_from(GLOBS))
_SELECTOR_LISTS = (st.lists(selectors(), max_size=2), st.lists(selectors(), min_size=1, max_size=2))


@lru_cache(maxsize=None)
def _index(n: int) -> st.SearchStrategy[int]:
    return st.integers(0, n - 1)


@st.composite
def _segments(draw) -> A.Segment:
    head = draw(_SEGMENT_HEAD)
    sels = draw(_SELECTOR_LISTS[0])
    return A.Segment(head, tuple(sels))


@lru_cache(maxsize=None)
def segments() -> st.SearchStrategy[A.Segment]:
    return _segments()


_SEGMENT_LISTS = (st.lists(segments(), max_size=2), st.lists(segments(), min_size=1, max_size=4))


@st.composite
def _paths(draw) -> A.Path:
    if draw(_index(6)) == 0:  # rooted: `[0].weight`
        root = A.Segment("", tuple(draw(_SELECTOR_LISTS[1])))
        rest = draw(_SEGMENT_LISTS[0])
        return A.Path((root, *rest))
    return A.Path(tuple(draw(_SEGMENT_LISTS[1])))


@lru_cache(maxsize=None)
def paths() -> st.SearchStrategy[A.Path]:
    return _paths()


@lru_cache(maxsize=None)
def holes():
    return st.just(A.Hole())


@lru_cache(maxsize=None)
def int_or_hole():
    return st.one_of(ints(), holes())


@lru_cache(maxsize=None)
def spec_entries():
    return st.one_of(
        st.just(A.Replicated()),
        names().map(A.AxisEntry),
        st.lists(names(), min_size=1, max_size=3).map(lambda xs: A.AxisTuple(tuple(xs))),
        holes(),
    )


@lru_cache(maxsize=None)
def specs():
    spec = st.builds(
        lambda es, ps: A.Spec(tuple(es), tuple(ps)),
        st.lists(spec_entries(), max_size=4),
        st.one_of(st.just([]), st.lists(names(), min_size=1, max_size=2)),
    )
    return st.one_of(spec, spec, holes())


# ------------------------------------------------------------------------------------------ statements
@lru_cache(maxsize=None)
def kwargs(max_size=8):
    return st.lists(st.builds(A.KwArg, names(), values()), max_size=max_size).map(tuple)


@lru_cache(maxsize=None)
def fields():
    return st.builds(A.Field, dotteds(), values(), st.none() | names() | holes())


@lru_cache(maxsize=None)
def field_blocks():
    return st.lists(fields(), max_size=4).map(tuple)


@lru_cache(maxsize=None)
def uses():
    return st.builds(A.Use, st.one_of(dotteds(), strings()), st.none() | names())


@lru_cache(maxsize=None)
def models():
    return st.builds(A.ModelDecl, names(), strings(), st.none() | kwargs())


@lru_cache(maxsize=None)
def inputs():
    dims = st.lists(st.builds(A.DimDecl, names(), ints()), max_size=6).map(tuple)
    return st.builds(A.InputDecl, names(), st.one_of(st.sampled_from(DTYPES), _name_text).map(A.Name), dims)


@lru_cache(maxsize=None)
def devices():
    return st.builds(A.DeviceDecl, names(), field_blocks())


@lru_cache(maxsize=None)
def links():
    return st.builds(A.LinkDecl, names(), field_blocks())


@lru_cache(maxsize=None)
def meshes():
    axes = st.lists(st.builds(A.AxisDecl, names(), int_or_hole(), st.none() | dotteds()), max_size=4).map(tuple)
    return st.builds(A.MeshDecl, names(), st.none() | ints(), dotteds(), axes)


@lru_cache(maxsize=None)
def mesh_aliases():
    return st.builds(A.MeshAlias, names(), dotteds())


@lru_cache(maxsize=None)
def budgets():
    return st.builds(A.BudgetDecl, values(1), st.booleans())


@lru_cache(maxsize=None)
def accumulations():
    return st.builds(A.MicrobatchesDecl, int_or_hole())


@lru_cache(maxsize=None)
def optimizers():
    return st.builds(A.OptimizerDecl, names(), st.none() | kwargs(4), st.none() | field_blocks())


@lru_cache(maxsize=None)
def datas():
    return st.builds(A.DataDecl, names(), specs())


@lru_cache(maxsize=None)
def shards():
    target = st.one_of(paths(), paths(), st.builds(A.Activation, st.sampled_from(["output", "input"]), paths()))
    return st.builds(A.ShardStmt, target, specs())


@lru_cache(maxsize=None)
def pipelines():
    schedule = st.one_of(
        st.builds(A.Schedule, st.sampled_from(SCHEDULES).map(A.Name), st.none() | int_or_hole()),
        holes(),
    )
    degrees = st.lists(st.builds(A.Degree, names(), int_or_hole()), max_size=3).map(tuple)
    stage = st.builds(A.StageDecl, st.lists(paths(), min_size=1, max_size=3).map(tuple), degrees)
    stages = st.one_of(st.lists(stage, max_size=4).map(tuple), holes())
    return st.builds(A.PipelineDecl, st.one_of(names(), holes()), schedule, int_or_hole(), stages)


@lru_cache(maxsize=None)
def checkpoints():
    every = st.none() | ints() | holes() | names()
    return st.one_of(
        st.builds(A.CheckpointStmt, st.lists(paths(), min_size=1, max_size=3).map(tuple), every),
        st.just(A.CheckpointStmt(A.Hole(), None)),
    )


@lru_cache(maxsize=None)
def applies():
    return st.builds(A.ApplyStmt, dotteds(), st.none() | st.lists(values(1), max_size=4).map(tuple), paths())


@lru_cache(maxsize=None)
def body_statements(depth: int):
    simple = st.one_of(shards(), checkpoints(), applies())
    if depth <= 0:
        return simple
    return st.one_of(simple, simple, fors(depth - 1))


@lru_cache(maxsize=None)
def fors(depth: int = 1):
    return st.builds(
        A.ForStmt, names(), paths(), st.lists(body_statements(depth), max_size=3).map(tuple)
    )


@lru_cache(maxsize=None)
def templates():
    params = st.lists(st.builds(A.Param, names(), names()), max_size=3).map(tuple)
    return st.builds(A.TemplateDecl, names(), params, st.lists(body_statements(1), max_size=4).map(tuple))


@lru_cache(maxsize=None)
def statements():
    return st.one_of(
        uses(), models(), inputs(), devices(), links(), meshes(), mesh_aliases(), budgets(), optimizers(),
        datas(), shards(), shards(), pipelines(), accumulations(), checkpoints(), templates(), applies(), fors(1),
    )


@lru_cache(maxsize=None)
def plan_asts(max_statements: int = 8) -> st.SearchStrategy[A.Module]:
    # runs of consecutive `shard` statements are common in real plans (and exercise alignment)
    single = statements().map(lambda s: [s])
    chunk = st.one_of(single, single, single, st.lists(shards(), min_size=2, max_size=3))
    return st.lists(chunk, max_size=max_statements).map(
        lambda chunks: A.Module(tuple(s for c in chunks for s in c)[:max_statements])
    )


# ------------------------------------------------------------------------------------------ rendering
# A statement is rendered as a list of tokens and nested blocks; `_Block(items)` stands for `{ ... }`.
class _Block:
    def __init__(self, items: list, hole: bool = False):
        self.items = items  # each item: list of tokens (may contain nested _Block)
        self.hole = hole


def _value_toks(v) -> list:
    if isinstance(v, A.Quantity):
        unit = v.unit.text
        if "/" in unit:
            a, b = unit.split("/")
            return [str(v.number), a, "/", b]
        return [str(v.number), unit]
    if isinstance(v, (A.Int, A.Float, A.Str)):
        return [str(v)]
    if isinstance(v, A.Ref):
        return _dotted_toks(v.name)
    if isinstance(v, A.Hole):
        return ["?"]
    if isinstance(v, A.ListValue):
        return ["[", *_comma(_value_toks(i) for i in v.items), "]"]
    raise TypeError(v)


def _comma(groups, trailing: bool = False) -> list:
    out: list = []
    groups = list(groups)
    for i, g in enumerate(groups):
        if i:
            out.append(",")
        out.extend(g)
    if trailing and groups:
        out.append(",")
    return out


def _dotted_toks(d: A.Dotted) -> list:
    out: list = []
    for i, p in enumerate(d.parts):
        if i:
            out.append(".")
        out.append(p.text)
    return out


def _selector_toks(s) -> list:
    if isinstance(s, A.Index):
        return ["[", str(s.index), "]"]
    if isinstance(s, A.Star):
        return ["[", "*", "]"]
    return ["[", *([] if s.start is None else [str(s.start)]), ":", *([] if s.stop is None else [str(s.stop)]), "]"]


def _path_toks(p: A.Path) -> list:
    out: list = []
    for i, seg in enumerate(p.segments):
        if i:
            out.append(".")
        if seg.name:
            out.append(seg.name)
        for s in seg.selectors:
            out.extend(_selector_toks(s))
    return out


def _spec_toks(s) -> list:
    if isinstance(s, A.Hole):
        return ["?"]

    def entry(e):
        if isinstance(e, A.Replicated):
            return ["_"]
        if isinstance(e, A.AxisEntry):
            return [e.axis.text]
        if isinstance(e, A.AxisTuple):
            return ["(", *_comma([a.text] for a in e.axes), ")"]
        return ["?"]

    out = ["[", *_comma(entry(e) for e in s.entries), "]"]
    if s.partial:
        out += ["partial", "(", *_comma([p.text] for p in s.partial), ")"]
    return out


def _kwarg_toks(args) -> list:
    return ["(", *_comma([a.name.text, "=", *_value_toks(a.value)] for a in args), ")"]


def _field_toks(f: A.Field) -> list:
    out = [*_dotted_toks(f.key), "=", *_value_toks(f.value)]
    if f.over is not None:
        out += ["over", "?" if isinstance(f.over, A.Hole) else f.over.text]
    return out


def _ioh(x) -> str:
    return "?" if isinstance(x, A.Hole) else str(x)


def _stmt_toks(s) -> list:
    if isinstance(s, A.Use):
        tgt = [str(s.target)] if isinstance(s.target, A.Str) else _dotted_toks(s.target)
        return ["use", *tgt, *([] if s.alias is None else ["as", s.alias.text])]
    if isinstance(s, A.ModelDecl):
        return ["model", s.name.text, "=", str(s.factory), *([] if s.args is None else _kwarg_toks(s.args))]
    if isinstance(s, A.InputDecl):
        dims = _comma([d.name.text, "=", str(d.size)] for d in s.dims)
        return ["input", s.name.text, ":", s.dtype.text, "[", *dims, "]"]
    if isinstance(s, A.DeviceDecl):
        return ["device", s.name.text, _Block([_field_toks(f) for f in s.fields])]
    if isinstance(s, A.LinkDecl):
        return ["link", s.name.text, _Block([_field_toks(f) for f in s.fields])]
    if isinstance(s, A.MeshDecl):
        count = [] if s.count is None else [str(s.count), "x"]
        axes = [
            [a.name.text, "=", _ioh(a.size), *([] if a.link is None else ["over", *_dotted_toks(a.link)])]
            for a in s.axes
        ]
        return ["mesh", s.name.text, "of", *count, *_dotted_toks(s.device), _Block(axes)]
    if isinstance(s, A.MeshAlias):
        return ["mesh", s.name.text, "=", *_dotted_toks(s.target)]
    if isinstance(s, A.BudgetDecl):
        return ["budget", *_value_toks(s.amount), *(["per", "device"] if s.per_device else [])]
    if isinstance(s, A.MicrobatchesDecl):
        return ["microbatches", _ioh(s.count)]
    if isinstance(s, A.OptimizerDecl):
        out = ["optimizer", s.name.text]
        if s.args is not None:
            out += _kwarg_toks(s.args)
        if s.fields is not None:
            out.append(_Block([_field_toks(f) for f in s.fields]))
        return out
    if isinstance(s, A.DataDecl):
        return ["data", s.input.text, ":", *_spec_toks(s.spec)]
    if isinstance(s, A.ShardStmt):
        tgt = s.target
        tt = [tgt.kind, "of", *_path_toks(tgt.path)] if isinstance(tgt, A.Activation) else _path_toks(tgt)
        return ["shard", *tt, ":", *_spec_toks(s.spec)]
    if isinstance(s, A.PipelineDecl):
        if isinstance(s.schedule, A.Hole):
            sched = ["?"]
        else:
            sched = [s.schedule.name.text, *([] if s.schedule.chunks is None else ["chunks", _ioh(s.schedule.chunks)])]
        if isinstance(s.stages, A.Hole):
            block = _Block([], hole=True)
        else:
            stages = []
            for st_ in s.stages:
                toks = ["stage", *_comma(_path_toks(p) for p in st_.paths)]
                if st_.degrees:
                    toks += ["with", *_comma([d.axis.text, "=", _ioh(d.size)] for d in st_.degrees)]
                stages.append(toks)
            block = _Block(stages)
        return ["pipeline", "over", _ioh(s.axis), "schedule", *sched, "microbatches", _ioh(s.microbatches), block]
    if isinstance(s, A.CheckpointStmt):
        if isinstance(s.paths, A.Hole):
            return ["checkpoint", "?"]
        out = ["checkpoint", *_comma(_path_toks(p) for p in s.paths)]
        if s.every is not None:
            out += ["every", s.every.text if isinstance(s.every, A.Name) else _ioh(s.every)]
        return out
    if isinstance(s, A.TemplateDecl):
        params = _comma([p.name.text, ":", p.kind.text] for p in s.params)
        return ["template", s.name.text, "(", *params, ")", _Block([_stmt_toks(b) for b in s.body])]
    if isinstance(s, A.ApplyStmt):
        args = [] if s.args is None else ["(", *_comma(_value_toks(v) for v in s.args), ")"]
        return ["apply", *_dotted_toks(s.template), *args, "to", *_path_toks(s.target)]
    if isinstance(s, A.ForStmt):
        return ["for", s.var.text, "in", *_path_toks(s.selection), _Block([_stmt_toks(b) for b in s.body])]
    raise TypeError(s)


_WORDISH = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_\"*?")
_SEEDS = st.integers(0, 2**32 - 1)


_COMMENT_CHARS = " abcxyzAQ0189_.,:;()[]*?=#/\"'-"


class _Renderer:
    """Layout choices come from a `random.Random` seeded by one Hypothesis draw: far fewer draws per
    example (the tree itself still shrinks normally; the layout of a shrunk example is re-rolled)."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def choice(self, options):
        return options[self.rng.randrange(len(options))]

    def comment(self) -> str:
        rng = self.rng
        body = "".join(rng.choice(_COMMENT_CHARS) for _ in range(rng.randrange(21)))
        return "#" + body + rng.choice(["", "", "", " ", "\t", "  "])

    def indent(self) -> str:
        return self.choice(["", "", "  ", "    ", "\t", "   "])

    def sep(self, prev: str, tok: str, depth: int) -> str:
        need = prev[-1] in _WORDISH and tok[0] in _WORDISH
        opts = [" ", " ", " ", "  ", "\t", " \\\n"]
        if not need:
            opts += ["", "", ""]
        if depth > 0:
            opts += ["\n", "\n" + self.indent(), "\n\n  ", "COMMENT"]
        s = self.choice(opts)
        if s == "COMMENT":
            s = " " + self.comment() + "\n" + self.indent()
        return s

    def tokens(self, toks: list, level: int) -> str:
        out = ""
        depth = 0
        prev = None
        for tok in toks:
            if isinstance(tok, _Block):
                out += self.choice([" ", " ", "", "  ", " \\\n"]) if prev is not None else ""
                out += self.block(tok, level)
                prev = "}"
                continue
            if prev is not None:
                out += self.sep(prev, tok, depth)
            out += tok
            if tok in ("(", "["):
                depth += 1
            elif tok in (")", "]"):
                depth -= 1
            prev = tok
        return out

    def term(self, last: bool, level: int) -> str:
        """What follows a statement or block item: `;` or a line break, maybe with comments."""
        pad = self.indent() + "    " * level
        opts = [";", "; ", " ;", "\n", "\n", "\n", ";\n", "\n\n", "\n  \n\n", "TRAIL", "FULL", "TRAILFULL"]
        if last:
            opts += ["", " "]
        s = self.choice(opts)
        if s == "TRAIL":
            s = self.choice(["  ", " ", "", "; "]) + self.comment() + "\n"
        elif s == "FULL":
            s = "\n" + self.choice(["", "\n"]) + pad + self.comment() + "\n" + self.choice(["", "\n"])
        elif s == "TRAILFULL":
            s = "  " + self.comment() + "\n" + pad + self.comment() + "\n"
        if s.endswith("\n"):
            s += pad
        return s

    def items(self, items: list, level: int) -> str:
        out = ""
        for i, item in enumerate(items):
            out += self.tokens(item, level)
            out += self.term(i == len(items) - 1, level)
        return out

    def block(self, b: _Block, level: int) -> str:
        inner = "    " * (level + 1)
        if b.hole:
            opener = self.choice(["{ ", "{", "{\n" + inner, "{  " + "COMMENT"])
            if opener.endswith("COMMENT"):
                opener = opener[: -len("COMMENT")] + self.comment() + "\n" + inner
            closer = self.choice([" }", "}", "\n}", "  COMMENT}"])
            if "COMMENT" in closer:
                closer = "  " + self.comment() + "\n" + "    " * level + "}"
            return opener + "?" + closer
        opener = self.choice(["{", "{ ", "{\n" + inner, "{\n\n" + inner, "HEADER", "FULL"])
        if opener == "HEADER":
            opener = "{  " + self.comment() + "\n" + inner
        elif opener == "FULL":
            opener = "{\n" + inner + self.comment() + "\n" + inner
        body = self.items(b.items, level + 1)
        closer = self.choice(["}", "}", "\n" + "    " * level + "}", "DANGLING"])
        if closer == "DANGLING":
            closer = "\n" + inner + self.comment() + "\n" + "    " * level + "}"
        if not b.items and opener in ("{", "{ ") and closer.startswith("}"):
            return opener + closer
        return opener + body + closer


def render_module(module: A.Module, seed: int = 0) -> str:
    """One random spelling of `module`; the same seed gives the same text."""
    r = _Renderer(random.Random(seed))
    head = r.choice(["", "", "\n", "\n\n", "COMMENT", "  \n"])
    if head == "COMMENT":
        head = r.comment() + "\n" + r.choice(["", "\n"])
    items = [_stmt_toks(s) for s in module.statements]
    body = ""
    for i, item in enumerate(items):
        body += r.tokens(item, 0)
        if i < len(items) - 1:
            body += r.term(False, 0)
    tail = r.choice(["", "\n", "\n", "\n\n", "TRAIL", "FULL"])
    if tail == "TRAIL":
        tail = "  " + r.comment() + r.choice(["", "\n"])
    elif tail == "FULL":
        tail = "\n" + r.comment() + r.choice(["", "\n"])
    if not items and tail.startswith("  "):
        tail = tail.lstrip(" ")
    return head + body + tail


@st.composite
def plan_cases(draw, max_statements: int = 8) -> tuple[A.Module, str]:
    """(module, text): a random module and one random spelling of it."""
    module = draw(plan_asts(max_statements))
    return module, render_module(module, draw(_SEEDS))


@lru_cache(maxsize=None)
def plan_texts(max_statements: int = 8) -> st.SearchStrategy[str]:
    """Random valid plan texts covering every statement kind, with random layout and comments."""
    return plan_cases(max_statements).map(lambda case: case[1])
