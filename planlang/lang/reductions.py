"""The grammar's reductions: for each rule of the grammar, the function that shapes its children as Lark's
tree would have them (`?rule` inlined, `_rule` spliced, filtered tokens dropped, `[ ]` placeholders as
None) and hands them to the AST builder's method named after the rule (`to_ast.ToAst`), with the
first and last tokens of the text the rule covers, for its span.

Two forms of each: `rule_callbacks(..., lark_tokens=False)` gives the fast driver's (`driver.py`) --
each written out as Python source for its rule's shape and compiled, since a big plan runs millions of
reductions -- and `install_builders` puts the general form into Lark's own LALR parser, whose tokens are
Lark `Token`s. The builder of the parse running in a thread is `BUILDER.ast` (parses are re-entrant).
"""
from __future__ import annotations

import threading
from types import CodeType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # Lark loads where its parser or tables are read, not for a parse from the parser cache
    from lark import Lark, Token, Tree

BUILDER = threading.local()  # `.ast`: the to_ast.ToAst of the parse running in this thread

# Tokens of the fast path are tuples: (type, value, start, end, line, column, end_line, end_column).
TYPE, VALUE, START, END, LINE, COL, ELINE, ECOL = range(8)


class Reduced:
    """A reduced rule on the parser's value stack: what it built and the first and last tokens of the text
    it covers (None, None for a rule that matched nothing). These are Lark's "container" positions
    (`propagate_positions`): tokens the tree leaves out still count, so a `shard` statement starts at
    `shard`, an index `[3]` covers its brackets and a `device` declaration ends at its `}`."""

    __slots__ = ("value", "first", "last")

    def __init__(self, value, first, last):
        self.value = value
        self.first = first
        self.last = last


def install_builders(lark: Lark, builder: type) -> None:
    """Replace the callbacks of Lark's LALR parser (which build a `Tree`, shaped by `?rule`, `_rule`,
    filtered tokens and `[ ]` placeholders) by ones that shape the children the same way and hand them to
    the `builder` method of the rule. Done once per process: the current builder is thread-local."""
    # ParsingFrontend -> LALR_Parser -> _Parser
    lark.parser.parser.parser.callbacks = rule_callbacks(lark, builder, lark_tokens=True)


def rule_callbacks(lark: Lark, builder: type, lark_tokens: bool) -> dict:
    """Grammar rule -> reduction callback calling the `builder` class's method for the rule. With
    `lark_tokens` the callbacks take Lark's `Token`s (Lark's own parser), else the fast driver's tuples."""
    # lazy: lark loads where Lark's parser or tables are read
    from lark.parse_tree_builder import ChildFilterLALR_NoPlaceholders, maybe_create_child_filter

    callbacks: dict[Any, Any] = {}
    for rule in lark.rules:
        opts = rule.options
        name = rule.alias or opts.template_source or rule.origin.name
        flt = maybe_create_child_filter(rule.expansion, opts.keep_all_tokens, False, list(opts.empty_indices))
        if flt is None:
            include = tuple((i, False, 0) for i in range(len(rule.expansion)))
            tail = 0
        elif flt.func is ChildFilterLALR_NoPlaceholders:
            include, tail = tuple((i, x, 0) for i, x in flt.args[0]), 0
        else:
            include, tail = tuple(flt.args[0]), flt.args[1]
        expand1 = bool(opts.expand1 and not rule.alias)
        method = getattr(builder, name, None)
        if name.startswith("_"):
            method = None  # spliced into the parent, as Lark's `_rule`
        elif method is None and not expand1:
            raise TypeError(f"no AST builder for grammar rule `{name}`")
        if expand1 and (tail or any(x or n for _, x, n in include)):
            raise TypeError(f"`?{rule.origin.name}` with inlined children or placeholders is not supported")
        if lark_tokens:
            callbacks[rule] = _callback(method, include, tail, expand1, lark_tokens)
        else:
            terminals = [sym.is_term for sym in rule.expansion]
            callbacks[rule] = _compiled_callback(method, include, tail, expand1, terminals)
    return callbacks


def _compiled_callback(method, include, tail, expand1, terminals):
    """`_callback` for the fast parser, written out for one rule (its children's shape is known): a
    reduction is run for every rule of every statement of a big plan."""
    size = len(terminals)
    body = []
    if expand1 and size == 1:  # `?rule: child`: the child itself, in the same container
        body.append("return children[0]")
    else:
        if size:  # positions: the first and last children that have one (Lark's container rule)
            body += ["c = children[0]",
                     "first = c.first if c.__class__ is Reduced else c",
                     "c = children[-1]",
                     "last = c.last if c.__class__ is Reduced else c",
                     "if first is None or last is None:",
                     "    first, last = _positions(children)"]
        else:
            body.append("first = last = None")
        if expand1:  # one child kept: the child itself, in this container
            (i, _, _), = include
            body += [f"c = children[{i}]",
                     "if c.__class__ is not Reduced:",
                     "    return c",
                     "return Reduced(c.value, first, last)"]
        else:
            def value(i: int) -> str:
                if terminals[i]:
                    return f"children[{i}]"
                return f"(children[{i}].value if children[{i}].__class__ is Reduced else children[{i}])"

            if not any(splice for _, splice, _ in include):
                parts = []
                for i, _, nones in include:
                    parts += ["None"] * nones + [value(i)]
                parts += ["None"] * tail
                body.append(f"items = [{', '.join(parts)}]")
            else:
                body.append("items = []")
                for i, splice, nones in include:
                    if nones:
                        body.append(f"items += [None] * {nones}")
                    if splice:  # a `_rule`: its items go into this rule's; left recursion grows one list
                        body += [f"s = children[{i}].value",
                                 "if items:",
                                 "    items += s",
                                 "else:",
                                 "    items = s"]
                    else:
                        body.append(f"items.append({value(i)})")
                if tail:
                    body.append(f"items += [None] * {tail}")
            if method is None:
                body.append("return Reduced(items, first, last)")
            else:
                body += ["node = Reduced(None, first, last)",
                         "node.value = method(BUILDER.ast, node, items)",
                         "return node"]
    source = "def reduce(children):\n" + "".join(f"    {line}\n" for line in body)
    code = _CODE.get(source)
    if code is None:  # rules of one shape share the code (85 shapes of 282 rules): compiling was most of the cost
        code = _CODE[source] = compile(source, "<reduction>", "exec")
    scope = {"Reduced": Reduced, "_positions": _positions, "BUILDER": BUILDER, "method": method}
    exec(code, scope)
    return scope["reduce"]


_CODE: dict[str, CodeType] = {}  # a reduction's source -> its compiled code


_NOTHING = Reduced(None, None, None)


def build_nothing(children) -> Reduced:
    return _NOTHING


def _positions(children) -> tuple:
    """(first, last) token of the children that have positions, or (None, None)."""
    first = last = None
    for c in children:
        if type(c) is Reduced:
            if c.first is not None:
                first = c.first
                break
        else:
            first = c
            break
    if first is not None:
        for c in reversed(children):
            if type(c) is Reduced:
                if c.last is not None:
                    last = c.last
                    break
            else:
                last = c
                break
    return first, last


def _callback(method, include, tail, expand1, lark_tokens):
    # lazy: lark loads where Lark's parser or tables are read
    from lark import Token

    def reduce(children):
        if lark_tokens:
            children = [lark_token(c) if isinstance(c, Token) else c for c in children]
        first, last = _positions(children)
        if expand1 and len(include) == 1:  # `?rule` with one child: the child itself, in this container
            c = children[include[0][0]]
            if type(c) is not Reduced:
                return c
            return Reduced(c.value, first, last)
        items = []
        for i, splice, nones in include:
            if nones:
                items += [None] * nones
            c = children[i]
            if splice:  # a `_rule`: its items go into this rule's (Lark's ChildFilterLALR)
                if items:
                    items += c.value
                else:
                    items = c.value  # left recursion (`x*`): the list grows in place, no copies
            else:
                items.append(c.value if type(c) is Reduced else c)
        if tail:
            items += [None] * tail
        if method is None:
            return Reduced(items, first, last)
        node = Reduced(None, first, last)
        node.value = method(BUILDER.ast, node, items)
        return node

    return reduce


def lark_token(t: Token) -> tuple:
    """A Lark token in the form the builders take (the fast driver's tokens)."""
    return (t.type, t.value, t.start_pos, t.end_pos, t.line, t.column, t.end_line, t.end_column)


def tree_to_ast(tree: Tree, builder: Any) -> Any:
    """What the reductions build, from the `Tree` Lark's parser builds without them (with
    `propagate_positions`): each rule's method of `builder`, with its children as they are in the tree
    (Lark shaped them) and its positions from the tree's `meta` (Lark's container positions, as
    `Reduced` holds them). Only Lark's public API: the last resort where `install_builders` cannot be."""
    # lazy: lark loads where Lark's parser or tables are read
    from lark import Token, Tree

    items = [tree_to_ast(c, builder) if isinstance(c, Tree) else lark_token(c) if isinstance(c, Token) else c
             for c in tree.children]
    meta = tree.meta
    if meta.empty:
        reduced = Reduced(None, None, None)
    else:
        reduced = Reduced(None, (None, None, meta.start_pos, None, meta.line, meta.column, None, None),
                          (None, None, None, meta.end_pos, None, None, meta.end_line, meta.end_column))
    name = str(tree.data)
    method = getattr(type(builder), name, None)
    if method is None or name.startswith("_"):
        raise TypeError(f"no AST builder for grammar rule `{name}`")
    return method(builder, reduced, items)
