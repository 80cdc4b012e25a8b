"""How deep templates may nest: PL219 is a template that applies itself (directly or through others),
never a deep chain that ends; a finite chain deeper than MAX_EXPANSION_DEPTH (templates and `for` loops
together) is PL226, which names the depth and the chain, never a RecursionError."""
from __future__ import annotations

from planlang.plan.checker import check_text
from planlang.plan.resolve import MAX_EXPANSION_DEPTH

MESH = "device gpu { memory = 80 GiB }\nlink nv { bandwidth = 300 GB/s }\nmesh m of 8 x gpu { tp = 8 over nv }\n"


def chain(applications: int, loops: int = 0) -> str:
    """t0 applies t1 applies ... : `applications` nested applications of different templates (the last,
    a template that shards `w`), each inside `loops` nested `for` loops."""
    lines = []
    for i in range(applications - 1):
        body = f"apply t{i + 1}(a) to x"
        for j in range(loops):
            body = f"for b{j} in h[*] {{ {body} }}"
        lines.append(f"template t{i}(a: axis) {{ {body} }}")
    lines.append(f"template t{applications - 1}(a: axis) {{ shard w : [a] }}")
    return MESH + "\n".join(lines) + "\napply t0(tp) to h\n"


def test_33_nested_applications_of_different_templates_expand():
    res = check_text(chain(33), "t.plan")
    assert [d.code for d in res.diagnostics] == []
    (rule,) = res.plan.shards
    assert str(rule.target).endswith(".w") and len(rule.origin) == 33  # every level's `apply`


def test_the_deepest_chain_allowed_expands():
    res = check_text(chain(MAX_EXPANSION_DEPTH), "t.plan")
    assert [d.code for d in res.diagnostics] == [] and len(res.plan.shards) == 1


def test_one_level_deeper_is_pl226_naming_the_depth_and_the_chain():
    depth = MAX_EXPANSION_DEPTH + 1
    res = check_text(chain(depth), "t.plan")
    (d,) = res.diagnostics
    assert d.code == "PL226"
    assert d.message.startswith(f"templates and `for` loops nest more than {MAX_EXPANSION_DEPTH} levels deep: ")
    assert d.message.endswith(f"`t{depth - 2}` -> `t{depth - 1}` would be level {depth}")
    assert "`t0` -> `t1`" in d.message and "more)" in d.message  # the middle of the chain left out
    assert d.span.line == 3 + depth - 1  # the `apply` in the template at level depth - 1
    assert d.labels[0].span.line == 3 + depth + 1  # the outermost `apply`, level 1


def test_for_loops_count_toward_the_depth_and_never_overflow_the_stack():
    # 32 templates, each applying the next inside 40 nested loops (b39 outermost): 1,300 levels, once a
    # RecursionError; level 257 is t6's 11th loop
    res = check_text(chain(32, loops=40), "t.plan")
    (d,) = res.diagnostics
    assert d.code == "PL226" and d.message.endswith(f"`t6` -> `for b30` would be level {MAX_EXPANSION_DEPTH + 1}")


def test_a_template_applying_itself_through_others_is_still_pl219_with_its_cycle():
    text = MESH + ("template a(x: axis) { apply b(x) to p }\ntemplate b(x: axis) { apply c(x) to q }\n"
                   "template c(x: axis) { apply a(x) to r }\napply a(tp) to h\n")
    (d,) = check_text(text, "t.plan").diagnostics
    assert d.code == "PL219" and d.span.line == 6
    assert d.message == "template `a` expands without end: `a` -> `b` -> `c` -> `a`"
