"""Go to definition and what the cursor is on (planlang.lsp.symbols)."""
from pathlib import Path

from planlang.lsp.symbols import definition, symbol_at, used_file
from planlang.plan.resolve import STDLIB_DIR

from .conftest import GPT2, at, line_of

MEGATRON = STDLIB_DIR / "patterns" / "megatron.plan"


def _def(analysis, offset):
    sym = symbol_at(analysis, offset)
    assert sym is not None
    return sym, definition(analysis, sym)


def test_apply_template_goes_to_the_template_in_stdlib(gpt2):
    text = gpt2.text
    sym, place = _def(gpt2, at(text, "megatron.attention", len("megatron.a")))
    assert (sym.kind, sym.name) == ("template", "megatron.attention")
    assert Path(place.path) == MEGATRON
    assert place.span.line - 1 == line_of(MEGATRON, "template attention(")
    assert MEGATRON.read_text()[place.span.start:place.span.end] == "attention"


def test_alias_part_of_a_dotted_name_goes_to_the_used_file(gpt2):
    sym, place = _def(gpt2, at(gpt2.text, "megatron.mlp", 2))
    assert sym.kind == "use" and Path(place.path) == MEGATRON and place.span.line == 1


def test_use_statement_goes_to_the_file(gpt2):
    _, place = _def(gpt2, at(gpt2.text, "use hardware", 6))
    assert Path(place.path) == STDLIB_DIR / "hardware.plan"


def test_axis_use_goes_to_its_declaration_in_the_mesh(gpt2):
    text = gpt2.text
    for marker in ("attention(tp)", "zero = 1 over dp", "pipeline over pp"):
        axis = {"attention(tp)": "tp", "zero = 1 over dp": "dp", "pipeline over pp": "pp"}[marker]
        sym, place = _def(gpt2, at(text, marker, marker.rindex(axis) + 1))
        assert sym.kind == "axis" and sym.name == axis
        assert place.path == str(GPT2)
        assert place.span.line - 1 == line_of(GPT2, f"    {axis} = 2 over")
        assert text[place.span.start:place.span.end] == axis


def test_device_and_link_go_to_their_profiles(gpt2):
    hw = STDLIB_DIR / "hardware.plan"
    _, dev = _def(gpt2, at(gpt2.text, "a100_80g", 2))
    assert Path(dev.path) == hw and dev.span.line - 1 == line_of(hw, "device a100_80g")
    _, link = _def(gpt2, at(gpt2.text, "infiniband_200g", 2))
    assert Path(link.path) == hw and link.span.line - 1 == line_of(hw, "link infiniband_200g")


def test_loop_variable_and_data_input(gpt2):
    text = gpt2.text
    sym, place = _def(gpt2, at(text, "to block.attn", 4))
    assert sym.kind == "loopvar" and text[place.span.start:place.span.end] == "block"
    assert place.span.line - 1 == line_of(GPT2, "for block in")
    sym, place = _def(gpt2, at(text, "data idx", 6))
    assert sym.kind == "input" and place.span.line - 1 == line_of(GPT2, "input idx")


def test_model_factory_goes_to_the_python_def(gpt2):
    _, place = _def(gpt2, at(gpt2.text, '"examples.gpt2', 3))
    model_py = GPT2.parent / "model.py"
    assert Path(place.path) == model_py and place.span.line - 1 == line_of(model_py, "def build(")


def test_preset_mesh_and_its_axes_go_to_stdlib_meshes(plan_in):
    meshes = STDLIB_DIR / "meshes.plan"
    a = plan_in("use meshes\nmesh c = meshes.dgx_a100_x2\nshard w : [node, gpu]\n")
    _, place = _def(a, at(a.text, "dgx_a100_x2", 1))
    assert Path(place.path) == meshes and place.span.line - 1 == line_of(meshes, "mesh dgx_a100_x2 ")
    _, place = _def(a, at(a.text, "gpu]", 1))
    lines = meshes.read_text().splitlines()
    decl = place.span.line - 1
    assert Path(place.path) == meshes and lines[decl].strip().startswith("gpu = 8")
    # the axis declared in the dgx_a100_x2 block, not in an earlier preset
    assert decl > line_of(meshes, "mesh dgx_a100_x2 ")


def test_template_parameter_goes_to_the_parameter(plan_in):
    a = plan_in("template t(ax: axis) {\n    shard w : [ax]\n}\n")
    sym, place = _def(a, at(a.text, "[ax]", 1))
    assert sym.kind == "param" and place.span.start == a.text.index("ax:")


def test_local_use_by_string_and_by_name(plan_in, tmp_path):
    a = plan_in('use "lib.plan"\nuse lib2\n', lib__plan="template t() {\n}\n", lib2__plan="")
    _, place = _def(a, at(a.text, "lib.plan", 1))
    assert Path(place.path) == tmp_path / "lib.plan"
    _, place = _def(a, at(a.text, "lib2", 1))
    assert Path(place.path) == tmp_path / "lib2.plan"


def test_used_file_finds_what_the_resolver_loaded(gpt2):
    from planlang.lang import ast as A

    for st in gpt2.module.statements:
        if isinstance(st, A.Use):
            assert used_file(st, gpt2.path) in gpt2.result.modules


def test_nothing_under_the_cursor_gives_no_definition(gpt2):
    assert symbol_at(gpt2, at(gpt2.text, "# examples/gpt2", 1)) is None  # an ordinary comment


def test_last_good_version_stands_in_while_another_line_is_broken(gpt2):
    from planlang.lsp.analysis import analyze, stand_in

    broken_text = gpt2.text.replace("budget 40 GiB per device", "budget 40 GiB per")
    broken = analyze(broken_text, gpt2.path)
    assert not broken.parses and symbol_at(broken, at(broken_text, "attention(tp)", 11)) is None
    analysis, offset = stand_in(broken, gpt2, at(broken_text, "attention(tp)", 11))
    assert analysis is gpt2 and offset == at(gpt2.text, "attention(tp)", 11)
    sym = symbol_at(analysis, offset)
    assert sym.kind == "axis" and definition(analysis, sym).span.line - 1 == line_of(GPT2, "    tp = 2 over")
    # the cursor's own line changed: no stand-in
    edited = broken_text.replace("apply megatron.attention(tp)", "apply megatron.attention(tp )")
    assert stand_in(analyze(edited, gpt2.path), gpt2, at(edited, "attention(tp", 11))[0] is not gpt2
