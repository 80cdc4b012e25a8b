from planlang.plan.selection import Selection, index_range

NAMES = [
    "", "wte", "wpe", "h", "h.0", "h.0.attn", "h.0.attn.c_attn", "h.0.mlp", "h.0.mlp.c_fc", "h.1", "h.1.attn",
    "h.1.mlp", "h.1.mlp.c_fc", "h.2", "h.2.mlp", "h.10", "h.10.mlp", "ln_f", "lm_head",
]


def sel(text):
    return Selection.parse(text)


def test_index_slice_star():
    assert sel("h[1]").select(NAMES) == ["h.1"]
    assert sel("h[0:2]").select(NAMES) == ["h.0", "h.1"]
    assert sel("h[1:]").select(NAMES) == ["h.1", "h.2", "h.10"]
    assert sel("h[:1]").select(NAMES) == ["h.0"]
    assert sel("h[*]").select(NAMES) == ["h.0", "h.1", "h.2", "h.10"]
    assert sel("h[*].mlp").select(NAMES) == ["h.0.mlp", "h.1.mlp", "h.2.mlp", "h.10.mlp"]


def test_globs():
    assert sel("h.*.mlp").select(NAMES) == ["h.0.mlp", "h.1.mlp", "h.2.mlp", "h.10.mlp"]
    assert sel("**.c_fc").select(NAMES) == ["h.0.mlp.c_fc", "h.1.mlp.c_fc"]
    assert sel("w*").select(NAMES) == ["wte", "wpe"]
    assert sel("l*").select(NAMES) == ["ln_f", "lm_head"]


def test_selector_needs_numeric_child():
    assert not sel("h[0]").matches("h.attn")
    assert sel("[0].weight").matches("0.weight")
    assert not sel("[1].weight").matches("0.weight")


def test_round_trip_text():
    for text in ["h[0:6].mlp", "h[*]", "[0].weight", "**.bias", "h[2:].attn.c_attn"]:
        assert str(sel(text)) == text


def test_index_range():
    assert index_range(sel("h[0:6]")) == ("h", 0, 6)
    assert index_range(sel("h[3]")) == ("h", 3, 4)
    assert index_range(sel("encoder.layer[2:]")) == ("encoder.layer", 2, None)
    assert index_range(sel("h[*].mlp")) is None
    assert index_range(sel("wte")) is None
