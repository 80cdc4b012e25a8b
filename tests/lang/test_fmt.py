"""The canonical formatter: hand-written layouts checked character for character, plus properties
(idempotence, AST round trip, comment preservation) over random plans from `strategies.plan_cases`."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from planlang.lang import ast as A
from planlang.lang.fmt import FormatError, format_check, format_module, format_text, unified_diff
from planlang.lang.parser import parse

from .strategies import plan_asts, plan_cases, plan_texts

PROPERTY_SETTINGS = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


def comment_texts(text: str) -> list[str]:
    result = parse(text)
    assert result.ok, result.diagnostics
    return [c.text.rstrip() for c in result.module.comments]


def code_part(line: str) -> str:
    """`line` without its comment and with string literals blanked (to `""`)."""
    out, i = [], 0
    while i < len(line):
        c = line[i]
        if c == "#":
            break
        if c == '"':
            j = i + 1
            while line[j] != '"':
                j += 2 if line[j] == "\\" else 1
            out.append('""')
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out).rstrip()


def check(src: str, expected: str) -> None:
    """`src` formats to exactly `expected`, which is a fixed point and keeps meaning and comments."""
    got = format_text(src)
    assert got == expected, "\n" + got
    assert format_text(expected) == expected
    assert parse(got).module == parse(src).module
    assert comment_texts(got) == comment_texts(src)


# --------------------------------------------------------------------------------------------- examples
MESSY = """\
# plan header


use stdlib.patterns.megatron as mg;use "lib/extra.plan"



model   gpt2=  "examples.gpt:build" ( n_layer=12 , d_model = 1_024,lr=3e-4 )   # the model
input tokens:int64[batch=8,seq=1_024]
device a100 { memory = 80GiB ; flops.bf16=312 TFLOPS;}
link ib {bandwidth=25 GB / s
  latency = 5 us }
link nvlink {  # intra-node
    bandwidth = 300 GB/s  # per direction
\tlatency=1 us # measured   \t

}

mesh cluster of 8x a100 {dp=?over ib;tp=8 over nvlink}
mesh alias = cluster
budget 70GiB per device ; optimizer adamw(lr=3e-4,betas=[0.9,0.95]){state.dtype=fp32 over dp}
data tokens:[dp,_]
# sharding
shard h[*].mlp.c_fc.weight:[_,tp]  # column parallel
shard h[*].mlp.c_proj.weight : [tp , _]
# rows
shard output of h[0].attn:[(dp,tp),_]partial(tp)

shard **.bias : ?
pipeline over pp schedule interleaved chunks 2 microbatches 8 {
    # first half
    stage h[0:6] , wte with tp=2,dp = ?
    stage h[6:12]   # second half
}
pipeline over ? schedule ? microbatches ? {?}
checkpoint h[*].attn , h[*].mlp every 2;checkpoint ?
template tp_mlp ( m:module, ax : axis ) {

  shard m.c_fc.weight : [_, ax]
  shard m.c_proj.weight : [ax, _]
  for l in m.* { checkpoint l }
  # trailing note
}
apply mg.tp_mlp(tp, 4) to h[*]   ;   apply foo to [0].weight
# end of file


"""

MESSY_EXPECTED = """\
# plan header

use stdlib.patterns.megatron as mg
use "lib/extra.plan"

model gpt2 = "examples.gpt:build"(n_layer = 12, d_model = 1_024, lr = 3e-4)  # the model
input tokens : int64[batch = 8, seq = 1_024]
device a100 {
    memory = 80 GiB
    flops.bf16 = 312 TFLOPS
}
link ib {
    bandwidth = 25 GB/s
    latency = 5 us
}
link nvlink {  # intra-node
    bandwidth = 300 GB/s  # per direction
    latency = 1 us        # measured
}

mesh cluster of 8 x a100 {
    dp = ? over ib
    tp = 8 over nvlink
}
mesh alias = cluster
budget 70 GiB per device
optimizer adamw(lr = 3e-4, betas = [0.9, 0.95]) {
    state.dtype = fp32 over dp
}
data tokens : [dp, _]
# sharding
shard h[*].mlp.c_fc.weight   : [_, tp]  # column parallel
shard h[*].mlp.c_proj.weight : [tp, _]
# rows
shard output of h[0].attn    : [(dp, tp), _] partial(tp)

shard **.bias : ?
pipeline over pp schedule interleaved chunks 2 microbatches 8 {
    # first half
    stage h[0:6], wte with tp = 2, dp = ?
    stage h[6:12]  # second half
}
pipeline over ? schedule ? microbatches ? { ? }
checkpoint h[*].attn, h[*].mlp every 2
checkpoint ?
template tp_mlp(m: module, ax: axis) {
    shard m.c_fc.weight   : [_, ax]
    shard m.c_proj.weight : [ax, _]
    for l in m.* {
        checkpoint l
    }
    # trailing note
}
apply mg.tp_mlp(tp, 4) to h[*]
apply foo to [0].weight
# end of file
"""


def test_messy_plan():
    check(MESSY, MESSY_EXPECTED)


def test_semicolons_and_inline_blocks():
    check(
        "shard a:[_];shard bb : [tp]; checkpoint a\n"
        "for x in h[*] { shard x.w : [_, tp]; checkpoint x every 2 }\n",
        "shard a  : [_]\n"
        "shard bb : [tp]\n"
        "checkpoint a\n"
        "for x in h[*] {\n"
        "    shard x.w : [_, tp]\n"
        "    checkpoint x every 2\n"
        "}\n",
    )


def test_shard_alignment_runs():
    check(
        "shard a : [_]\n"
        "shard bbbb : [tp]\n"
        "# a comment does not break the run\n"
        "shard [0].weight : ?\n"
        "checkpoint a\n"
        "shard cc : [_]\n"
        "shard d : [_]\n"
        "\n"
        "shard eeeeeeee : [_]\n"
        "template t(p: module) {\n"
        "    shard p.w : [_]; shard p.bias : [tp]\n"
        "    apply u to p\n"
        "    shard p.x : [_]\n"
        "}\n",
        "shard a          : [_]\n"
        "shard bbbb       : [tp]\n"
        "# a comment does not break the run\n"
        "shard [0].weight : ?\n"
        "checkpoint a\n"
        "shard cc : [_]\n"
        "shard d  : [_]\n"
        "\n"
        "shard eeeeeeee : [_]\n"
        "template t(p: module) {\n"
        "    shard p.w    : [_]\n"
        "    shard p.bias : [tp]\n"
        "    apply u to p\n"
        "    shard p.x : [_]\n"
        "}\n",
    )


def test_activation_targets_align_with_paths():
    check(
        "shard input of h[0]:[dp,_]\nshard output of h[0].attn : [ (dp , tp) , _ ] partial( tp )\nshard w:?\n",
        "shard input of h[0]       : [dp, _]\n"
        "shard output of h[0].attn : [(dp, tp), _] partial(tp)\n"
        "shard w                   : ?\n",
    )


def test_trailing_comment_alignment():
    check(
        "device d {\n"
        "    a = 1 # one\n"
        "    bbbbbb = 2    # two\n"
        "\n"
        "    c = 3  # three\n"
        "    dd = 4\n"
        "    e = 5 # five\n"
        "}   # after the block\n"
        "mesh m = d # alias\n"
        "budget 1 GiB\n",
        "device d {\n"
        "    a = 1       # one\n"
        "    bbbbbb = 2  # two\n"
        "\n"
        "    c = 3  # three\n"
        "    dd = 4\n"
        "    e = 5  # five\n"
        "}           # after the block\n"
        "mesh m = d  # alias\n"
        "budget 1 GiB\n",
    )


def test_trailing_comments_of_different_blocks_are_not_aligned():
    check(
        "for a in b { # header\n"
        "  checkpoint a # inner\n"
        "} # outer\n",
        "for a in b {  # header\n"
        "    checkpoint a  # inner\n"
        "}  # outer\n",
    )


def test_comments_inside_constructs_become_leading():
    check(
        "use x\n"
        "\n"
        "# leading\n"
        'model m = "f"(\n'
        "    a = 1,  # first\n"
        "    # second\n"
        "    b = [1,\n"
        "         2],  # third\n"
        ")  # after\n"
        "template t(a: module, # param\n"
        "           b: axis) { # header\n"
        "    shard a.w : [  # bracket\n"
        "        _, b]\n"
        "}\n"
        "pipeline over pp schedule gpipe microbatches 4 {  # stages\n"
        "    stage h[0:2  # mid\n"
        "        ], h[2:4]\n"
        "}\n"
        "pipeline over pp schedule gpipe microbatches 4 { # only a hole\n"
        "    ?\n"
        "}\n",
        "use x\n"
        "\n"
        "# leading\n"
        "# first\n"
        "# second\n"
        "# third\n"
        'model m = "f"(a = 1, b = [1, 2])  # after\n'
        "# param\n"
        "template t(a: module, b: axis) {  # header\n"
        "    # bracket\n"
        "    shard a.w : [_, b]\n"
        "}\n"
        "pipeline over pp schedule gpipe microbatches 4 {  # stages\n"
        "    # mid\n"
        "    stage h[0:2], h[2:4]\n"
        "}\n"
        "# only a hole\n"
        "pipeline over pp schedule gpipe microbatches 4 { ? }\n",
    )


def test_blank_lines():
    check(
        "\n\n  \n# top\n\n\n\nuse a\n\n\n"
        "device d {\n\n\n    a = 1\n\n\n\n    # about b\n\n    b = 2\n\n\n}\n"
        "use b\n\n\n\n",
        "# top\n\nuse a\n\n"
        "device d {\n    a = 1\n\n    # about b\n\n    b = 2\n}\n"
        "use b\n",
    )


def test_empty_blocks_and_dangling_comments():
    check(
        "device d {}\n"
        "link l {\n\n}\n"
        "mesh m of d { }\n"
        "optimizer sgd\n"
        "optimizer sgd2 {\n}\n"
        "optimizer sgd3() {}\n"
        "template t() {\n}\n"
        "for x in h {}\n"
        "pipeline over pp schedule 1f1b microbatches 2 {}\n"
        "device e { # header only\n}\n"
        "device f {\n  # dangling\n\n  # another\n}\n"
        "device g {}  # trailing\n",
        "device d {}\n"
        "link l {}\n"
        "mesh m of d {}\n"
        "optimizer sgd\n"
        "optimizer sgd2 {}\n"
        "optimizer sgd3() {}\n"
        "template t() {}\n"
        "for x in h {}\n"
        "pipeline over pp schedule 1f1b microbatches 2 {}\n"
        "device e {  # header only\n"
        "}\n"
        "device f {\n"
        "    # dangling\n"
        "\n"
        "    # another\n"
        "}\n"
        "device g {}  # trailing\n",
    )


def test_literals_keep_their_text():
    check(
        'model m = "a\\"b\\\\c"(x = 1_024, y = 3e-4, z = 1.5E+3, w = 007, q = 0.000_1 TB/s, s = "")\n'
        "budget [80 GiB, 1_0, ?, fp32.x]\n",
        'model m = "a\\"b\\\\c"(x = 1_024, y = 3e-4, z = 1.5E+3, w = 007, q = 0.000_1 TB/s, s = "")\n'
        "budget [80 GiB, 1_0, ?, fp32.x]\n",
    )


def test_paths_holes_and_schedules():
    check(
        "shard [ 0 ] . weight : [ ]\n"
        "checkpoint h [ * ] . attn* , ** . bias , h[:], h[1:], h[:2] every layer\n"
        "checkpoint h every ?\n"
        "pipeline over ? schedule 1f1b microbatches ? { stage a with pp = ? }\n"
        "pipeline over pp schedule interleaved chunks ? microbatches 8 { stage a }\n"
        "pipeline over pp schedule looped_bfs chunks 2 microbatches 4 { stage a; stage b }\n"
        "pipeline over pp schedule zero_bubble microbatches 4 { stage a; stage b }\n"
        "pipeline over pp schedule zero_bubble chunks 2 microbatches 4 { stage a; stage b; stage c; stage d }\n"
        "pipeline over pp schedule zbv chunks 2 microbatches 3 { stage a; stage b; stage c; stage d }\n"
        "mesh c of 2 x d { dp = ? ; tp = 4 over nvlink.v3 }\n"
        "apply t() to h\n"
        "apply pkg.t to h\n"
        "use 'x'\n".replace("use 'x'\n", 'use "x" as y\n'),
        "shard [0].weight : []\n"
        "checkpoint h[*].attn*, **.bias, h[:], h[1:], h[:2] every layer\n"
        "checkpoint h every ?\n"
        "pipeline over ? schedule 1f1b microbatches ? {\n"
        "    stage a with pp = ?\n"
        "}\n"
        "pipeline over pp schedule interleaved chunks ? microbatches 8 {\n"
        "    stage a\n"
        "}\n"
        "pipeline over pp schedule looped_bfs chunks 2 microbatches 4 {\n"
        "    stage a\n"
        "    stage b\n"
        "}\n"
        "pipeline over pp schedule zero_bubble microbatches 4 {\n"
        "    stage a\n"
        "    stage b\n"
        "}\n"
        "pipeline over pp schedule zero_bubble chunks 2 microbatches 4 {\n"
        "    stage a\n"
        "    stage b\n"
        "    stage c\n"
        "    stage d\n"
        "}\n"
        "pipeline over pp schedule zbv chunks 2 microbatches 3 {\n"
        "    stage a\n"
        "    stage b\n"
        "    stage c\n"
        "    stage d\n"
        "}\n"
        "mesh c of 2 x d {\n"
        "    dp = ?\n"
        "    tp = 4 over nvlink.v3\n"
        "}\n"
        "apply t() to h\n"
        "apply pkg.t to h\n"
        'use "x" as y\n',
    )


def test_soft_keywords_as_names():
    src = "checkpoint every.every, every every every\napply to to to\nshard output of output : [output]\nmesh x of 8 x x {x = 1 over x}\n"
    check(
        src,
        "checkpoint every.every, every every every\n"
        "apply to to to\n"
        "shard output of output : [output]\n"
        "mesh x of 8 x x {\n"
        "    x = 1 over x\n"
        "}\n",
    )


LONG_MODEL = (
    'model gpt = "examples.gpt:build"(n_layer = 48, n_head = 25, d_model = 1_600, vocab = 50_257, seq = 1_024)'
)


def test_long_model_arguments_wrap():
    assert len(LONG_MODEL) > 100
    check(
        LONG_MODEL.replace(" = ", "=") + "  # big\n",
        'model gpt = "examples.gpt:build"(\n'
        "    n_layer = 48,\n"
        "    n_head = 25,\n"
        "    d_model = 1_600,\n"
        "    vocab = 50_257,\n"
        "    seq = 1_024,\n"
        ")  # big\n",
    )


def test_long_input_dims_wrap_and_short_ones_do_not():
    dims = ", ".join(f"dimension_{i} = {i}" for i in range(6))
    check(
        f"input tokens : int64[{dims}]\ninput t : int64[\n    a = 1,\n    b = 2,\n]\n",
        "input tokens : int64[\n"
        + "".join(f"    dimension_{i} = {i},\n" for i in range(6))
        + "]\n"
        "input t : int64[a = 1, b = 2]\n",
    )


def test_exactly_100_columns_does_not_wrap():
    line = 'model m = "f"(a = "' + "x" * 79 + '")'
    assert len(line) == 100
    check(line + "\n", line + "\n")
    check(line[:-2] + 'x")\n', 'model m = "f"(\n    a = "' + "x" * 80 + '",\n)\n')


def test_crlf_tabs_and_trailing_whitespace():
    check(
        "use a   \r\n\r\n\r\ndevice d {\r\n\tmemory = 1 GiB   # note  \r\n}\r\n",
        "use a\n\ndevice d {\n    memory = 1 GiB  # note\n}\n",
    )


def test_line_continuation():
    check("shard a \\\n  : [_] # c\nuse b\n", "shard a : [_]  # c\nuse b\n")


def test_comment_only_and_empty_files():
    assert format_text("") == ""
    assert format_text("\n\n   \n") == ""
    check("# only\n\n\n# comments", "# only\n\n# comments\n")
    check("\n\n# c   \n", "# c\n")


def test_last_statement_without_newline():
    check("use a  # c", "use a  # c\n")
    check("use a", "use a\n")


def test_format_check_and_diff():
    ok, out = format_check("use a\n")
    assert ok and out == "use a\n"
    ok, out = format_check("use   a;use b")
    assert not ok and out == "use a\nuse b\n"
    diff = unified_diff("use   a;use b", out, "p.plan")
    assert diff == (
        "--- p.plan (original)\n"
        "+++ p.plan (formatted)\n"
        "@@ -1 +1,2 @@\n"
        "-use   a;use b\n"
        "\\ No newline at end of file\n"
        "+use a\n"
        "+use b\n"
    )
    assert unified_diff(out, out, "p.plan") == ""


def test_syntax_errors_raise_format_error():
    with pytest.raises(FormatError) as info:
        format_text("shard a [_]\nuse b\nmesh {\n", "bad.plan")
    err = info.value
    assert err.diagnostics and all(d.code.startswith("PL1") for d in err.diagnostics)
    assert "bad.plan" in str(err)
    with pytest.raises(FormatError):
        format_check("device d {", "x.plan")


def test_unicode_comments_and_strings():
    check('use "pläne/ü.plan"   # grüße — ok\n', 'use "pläne/ü.plan"  # grüße — ok\n')


def test_format_module_of_a_tree_without_spans_or_text():
    tree = A.Module((
        A.ModelDecl(A.Name("m"), A.Str('a"b\\c\nd'), (A.KwArg(A.Name("lr"), A.Float(0.0003)),)),
        A.BudgetDecl(A.Quantity(A.Int(1024), A.Unit("GiB")), per_device=True),
    ))
    out = format_module(tree)
    assert out == 'model m = "a\\"b\\\\c\\nd"(lr = 0.0003)\nbudget 1024 GiB per device\n'
    assert parse(out).module == tree


def test_format_module_of_a_tree_without_spans():
    tree = A.Module((
        A.Use(A.Dotted((A.Name("a"), A.Name("b")))),
        A.ShardStmt(A.Path((A.Segment("h", (A.Star(),)),)), A.Spec((A.Replicated(), A.AxisEntry(A.Name("tp"))))),
        A.ShardStmt(A.Path((A.Segment("w"),)), A.Hole()),
        A.DeviceDecl(A.Name("d"), (A.Field(A.Dotted((A.Name("m"),)), A.Quantity(A.Int(80), A.Unit("GiB"))),)),
    ))
    assert format_module(tree) == (
        "use a.b\n"
        "shard h[*] : [_, tp]\n"
        "shard w    : ?\n"
        "device d {\n"
        "    m = 80 GiB\n"
        "}\n"
    )


def test_shared_nodes_in_a_hand_built_tree():
    short = A.ShardStmt(A.Path((A.Segment("w"),)), A.Hole())
    long_ = A.ShardStmt(A.Path((A.Segment("layers", (A.Slice(0, 4),)), A.Segment("w"))), A.Spec(()))
    tree = A.Module((short, long_, A.Use(A.Str("x")), short, A.CheckpointStmt(A.Hole())))
    assert format_module(tree) == (
        "shard w             : ?\n"
        "shard layers[0:4].w : []\n"
        'use "x"\n'
        "shard w : ?\n"
        "checkpoint ?\n"
    )


# --------------------------------------------------------------------------------------------- properties
@PROPERTY_SETTINGS
@given(plan_cases())
def test_round_trip(case):
    module, text = case
    parsed = parse(text)
    assert parsed.ok, parsed.diagnostics
    assert parsed.module == module  # the strategy spells the tree it drew
    out = format_text(text)
    reparsed = parse(out)
    assert reparsed.ok, (out, reparsed.diagnostics)
    assert reparsed.module == parsed.module


@PROPERTY_SETTINGS
@given(plan_texts())
def test_idempotent_and_well_shaped(text):
    out = format_text(text)
    assert format_text(out) == out
    assert format_check(out) == (True, out)
    if out:
        assert out.endswith("\n") and not out.endswith("\n\n") and not out.startswith("\n")
    lines = out.split("\n")[:-1]
    for i, line in enumerate(lines):
        assert line == line.rstrip()
        code = code_part(line)
        assert ";" not in code and "\t" not in code
        assert "  " not in code.strip() or code.strip().startswith("shard ")  # only shard alignment pads
        indent = len(line) - len(line.lstrip(" "))
        assert indent % 4 == 0
        if not line:
            assert lines[i - 1] and not code_part(lines[i - 1]).endswith("{")  # one blank line, never after `{`
            assert lines[i + 1] and lines[i + 1].strip() != "}"  # nor before `}`


@PROPERTY_SETTINGS
@given(plan_texts())
def test_comments_survive_in_order(text):
    assert comment_texts(format_text(text)) == comment_texts(text)


@PROPERTY_SETTINGS
@given(plan_asts())
def test_trees_without_spans_print_and_parse_back(module):
    out = format_module(module)
    reparsed = parse(out)
    assert reparsed.ok, (out, reparsed.diagnostics)
    assert reparsed.module == module
    assert format_text(out) == out



def test_a_parse_in_another_thread_leaves_this_parses_comments(monkeypatch):
    # the language server parses in threads; the parser (and its comment callback) is shared. Force the
    # worst interleaving: a whole parse in another thread while this one is between two comments. (Lark's
    # own parser collects comments with that callback; it parses where the fast parser gives up.)
    import threading

    from planlang.lang import parser as P

    class GivesUp:
        def parse(self, text, builder):
            raise P._Fallback

    monkeypatch.setattr(P, "_fast", lambda build=True: GivesUp())
    outer, inner = "# a\ndevice d { memory = 1 GiB }  # b\n", "# x\n"
    original, seen = P._CommentSink.__call__, {}

    def interleaved(self, tok):
        out = original(self, tok)
        if threading.current_thread() is threading.main_thread() and "inner" not in seen:
            seen["inner"] = None
            t = threading.Thread(target=lambda: seen.update(inner=P.parse(inner).module.comments))
            t.start()
            t.join()
        return out

    monkeypatch.setattr(P._CommentSink, "__call__", interleaved)
    assert [c.text for c in P.parse(outer).module.comments] == ["# a", "# b"]
    assert [c.text for c in seen["inner"]] == ["# x"]


def test_a_parse_in_another_thread_leaves_this_parses_tree(monkeypatch):
    # the parser's reductions build the tree with the builder of the parse running in their thread:
    # a whole parse in another thread between two reductions of this one changes neither tree
    import threading

    from planlang.lang import parser as P

    outer = "# a\ndevice d { memory = 1 GiB }  # b\nshard h[0].w : [dp, _]\n"
    inner = "# x\nmesh m of 4 x d { tp = 4 }\n"
    paths = {outer: "outer.plan", inner: "inner.plan"}
    alone = {text: P.parse(text, path) for text, path in paths.items()}
    original, seen = P.A.pack_span, {}

    def interleaved(*args):
        out = original(*args)
        if threading.current_thread() is threading.main_thread() and "inner" not in seen:
            seen["inner"] = None
            t = threading.Thread(target=lambda: seen.update(inner=P.parse(inner, paths[inner])))
            t.start()
            t.join()
        return out

    monkeypatch.setattr(P.A, "pack_span", interleaved)
    for got, text in ((P.parse(outer, paths[outer]), outer), (seen["inner"], inner)):
        assert got.ok and got.module == alone[text].module
        assert [c.text for c in got.module.comments] == [c.text for c in alone[text].module.comments]
        assert [s.span for s in got.module.statements] == [s.span for s in alone[text].module.statements]
