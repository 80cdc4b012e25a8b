"""Semantic tokens (planlang.lsp.tokens)."""
from planlang.lsp.analysis import analyze
from planlang.lsp import tokens as token_module
from planlang.lsp.positions import UTF16
from planlang.lsp.positions import units_len as plain_units_len
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


def test_a_long_line_gets_every_token_at_its_column_reading_each_character_once(monkeypatch):
    # 20,000 tokens on one line: columns were counted from the line's start for every token (quadratic:
    # a 36 KB line took 79 s); they are counted on from the token before. Not timed (speed is bench's):
    # what is checked is how many characters have their code units counted
    n = 5_000
    text = "mesh m of 4 x gpu { dp = 4 }; " + "".join(f"shard h{i}.weight : [dp, _]; " for i in range(n)) + "\n"
    a = analyze(text, "p.plan")
    assert a.parses
    toks = tokens(a)
    counted = []

    def units_len(s, encoding=UTF16):
        counted.append(len(s))
        return plain_units_len(s, encoding)

    monkeypatch.setattr(token_module, "units_len", units_len)
    data = semantic_tokens(a).data
    assert sum(counted) <= len(text)  # each character at most once (it was about 10,000 times the text)
    assert len(data) == 5 * len(toks) and len(toks) >= 4 * n
    assert sum(1 for t in toks if text[t.start:t.end] == "shard") == n
    cols, col = [], 0
    for i in range(0, len(data), 5):
        assert data[i] == 0  # one line
        col += data[i + 1]
        cols.append((col, data[i + 2]))
    assert cols == [(t.start, t.end - t.start) for t in toks]  # ASCII: a column is an offset


def test_columns_after_astral_characters_on_the_same_line_count_utf16_units():
    line = 'model net = "😀x😀"(a = 1, b = 2)  # 😀'
    a = analyze(line + "\nuse hardware\n", "p.plan")
    data = semantic_tokens(a, UTF16).data
    tokens0 = [(col, text) for ln, col, text, _, _ in decode(a.text, data, UTF16) if ln == 0]

    def utf16_col(word: str) -> int:  # each emoji before `word` takes 2 UTF-16 units, 1 code point
        before = line[:line.index(word)]
        return len(before) + before.count("😀")

    words = ["model", "net", '"😀x😀"', "1", "2", "# 😀"]
    assert tokens0 == [(utf16_col(w), w) for w in words]
    assert data[2 * 5 + 2] == len('"😀x😀"') + 2  # the string's length in UTF-16 units
