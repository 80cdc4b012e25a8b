"""Semantic tokens (planlang.lsp.tokens)."""
from planlang.lsp.analysis import analyze
from planlang.lsp.positions import UTF16
from planlang.lsp.tokens import TOKEN_TYPES, decode, semantic_tokens, tokens


def _kinds(analysis):
    return {(text, kind) for _, _, text, kind, _ in decode(analysis.text, semantic_tokens(analysis).data)}


def test_classes_of_a_real_plan(gpt2):
    kinds = _kinds(gpt2)
    expected = {
        ("use", "keyword"), ("hardware", "namespace"), ("pp", "variable"), ("1f1b", "enumMember"),
        ("stage", "keyword"), ("wte", "property"), ("attention", "function"), ("block", "parameter"),
        ("40", "number"), ("GiB", "number"), ('"examples.gpt2.model:build"', "string"),
        ("a100_80g", "type"), ("adamw", "enumMember"),
    }
    assert expected <= kinds
    assert ("# recompute activations in groups of two blocks (3 groups per stage)", "comment") in kinds


def test_soft_keyword_used_as_a_module_name_is_a_path(plan_in):
    a = plan_in("shard output of output.dense : [_]\nshard input.weight : ?\n")
    toks = decode(a.text, semantic_tokens(a).data)
    words = [(t[2], t[3]) for t in toks]
    assert words[:4] == [("shard", "keyword"), ("output", "keyword"), ("of", "keyword"), ("output", "property")]
    assert ("input", "property") in words and ("?", "operator") in words


def test_tokens_are_ordered_and_never_overlap(gpt2):
    toks = tokens(gpt2)
    assert toks == sorted(toks)
    assert all(a.end <= b.start for a, b in zip(toks, toks[1:]))
    assert all(t.type in TOKEN_TYPES for t in toks)


def test_a_text_that_does_not_parse_gets_lexical_tokens():
    a = analyze('mesh m of 4 x d {\n    dp = \n}  # 😀 note\nuse "x', "p.plan")
    assert not a.parses
    kinds = _kinds(a)
    assert {("mesh", "keyword"), ("4", "number"), ("# 😀 note", "comment"), ('"x', "string")} <= kinds
    assert not any(kind == "variable" for _, kind in kinds)  # no tree: names are not classified


def test_encoding_counts_utf16_units_after_an_astral_character():
    a = analyze('# 😀\nuse hardware  # 😀 x\n', "p.plan")
    toks = decode(a.text, semantic_tokens(a, UTF16).data, UTF16)
    comment = next(t for t in toks if t[0] == 1 and t[3] == "comment")
    assert comment[1] == len("use hardware  ") and comment[2] == "# 😀 x"
    assert semantic_tokens(a, UTF16).data[2] == 4  # the first comment "# 😀" is 4 UTF-16 units long
