"""Model-aware editor features: checks, shapes on hover, stage memory, model paths in completion.

The model is examples/mlp (fc1 -> act -> fc2), built on the meta device; shapes are checked against
torch's own nn.Linear shapes, stage memory against the estimator called directly.
"""
import pytest

torch = pytest.importorskip("torch")

from planlang.lsp.analysis import analyze  # noqa: E402
from planlang.lsp.completion import completion  # noqa: E402
from planlang.lsp.hover import hover  # noqa: E402
from planlang.lsp.model_checks import ModelChecker  # noqa: E402
from planlang.plan.units import format_bytes  # noqa: E402

from .conftest import at  # noqa: E402

PLAN = """use hardware
model mlp = "examples.mlp.model:build"(in_features = 64, hidden = 256, out_features = 32)
input x : f32[batch = 16, features = 64]
mesh ranks of 4 x hardware.cpu {
    pp = 2 over hardware.loopback
    tp = 2 over hardware.loopback
}
budget 4 GiB per device
optimizer adamw(lr = 0.001)
pipeline over pp schedule gpipe microbatches 2 {
    stage fc1, act
    stage fc2
}
shard fc1.weight : [tp, _]
shard fc1.bias : [tp]
shard output of fc1 : [_, tp]
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("m") / "mlp.plan")
    checker = ModelChecker()
    return path, checker, checker.run(PLAN, path)


def _hover_text(path, insight, marker, delta):
    a = analyze(PLAN, path)
    h = hover(a, at(PLAN, marker, delta), insight, model_checks=True)
    return h.contents.value


def test_parameter_shape_and_local_shard(run):
    path, _, insight = run
    weight = torch.nn.Linear(64, 256).weight.shape  # what the model really holds: [out, in]
    text = _hover_text(path, insight, "shard fc1.weight", len("shard fc1."))
    assert f"float32 [{weight[0]}, {weight[1]}]" in text
    assert f"local [{weight[0] // 2}, {weight[1]}] per device under `[tp, _]`" in text


def test_activation_shape_and_local_shard(run):
    path, _, insight = run
    text = _hover_text(path, insight, "output of fc1", len("output of f"))
    assert "[16, 256]" in text and "local [16, 128]" in text


def test_stage_hover_shows_the_estimate_of_that_stage(run):
    from planlang.model.price.estimate import estimate_plan
    from planlang.plan.complete import complete

    path, _, insight = run
    reference = {e.device: e for e in estimate_plan(complete(analyze(PLAN, path).plan))}
    text = _hover_text(path, insight, "stage fc2", 2)
    assert text.startswith("**stage 1** of 2")
    assert f"| peak | {format_bytes(reference['stage 1'].peak)} |" in text
    assert f"| parameters | {format_bytes(reference['stage 1'].parameters)} |" in text


def test_completion_offers_the_models_paths(run):
    path, _, insight = run
    text = PLAN + "shard fc2.b"
    a = analyze(text, path)
    labels = [i.label for i in completion(a, len(text), analyze(PLAN, path), insight).items]
    assert {"fc2.bias", "fc2.weight", "fc1", "act"} <= set(labels)  # fc2.bias is not written in the plan


def test_model_aware_diagnostics_and_caching(run):
    path, checker, insight = run
    assert insight.facts is not None and {e.device for e in insight.estimates} == {"stage 0", "stage 1"}
    # the model-aware checks are clean, tp inside the pipeline included
    assert [d.code for d in insight.diagnostics] == []
    bad = PLAN + "shard fc2.weight : [tp, _, _]\nshard fc9.weight : [_]\n"
    again = checker.run(bad, path)
    assert again.facts is insight.facts  # same model declaration: probed once
    codes = {d.code: d for d in again.diagnostics}
    assert set(codes) == {"PL360", "PL361"}
    assert codes["PL361"].span.line == bad.count("\n") - 1
    assert "fc1" in codes["PL360"].help or "fc2" in codes["PL360"].help


def test_load_failure_is_reported_at_this_versions_model_line(run):
    path, checker, _ = run
    for prefix in ("", "\n\n"):
        text = prefix + PLAN.replace("examples.mlp.model:build", "examples.mlp.nope:build")
        res = checker.run(text, path)
        (d,) = [d for d in res.diagnostics if d.code == "PL260"]
        assert d.span.line == text.split("\n").index(next(s for s in text.split("\n") if s.startswith("model"))) + 1


def test_edited_factory_is_imported_again(tmp_path):
    import os
    import sys

    module = "lsp_edited_model_" + "".join(c for c in tmp_path.name if c.isalnum())
    factory = tmp_path / f"{module}.py"
    plan = (f'use hardware\nmodel m = "{module}:build"\ninput x : f32[batch = 2, features = 8]\n'
            "mesh c of 2 x hardware.cpu {\n    tp = 2 over hardware.loopback\n}\nbudget 1 GiB per device\n"
            "shard weight : [tp, _]\n")
    path = str(tmp_path / "p.plan")
    checker = ModelChecker()
    try:
        factory.write_text("import torch\n\ndef build():\n    return torch.nn.Linear(8, 4)\n")
        assert checker.run(plan, path).facts.params["weight"][0] == (4, 8)
        factory.write_text("import torch\n\ndef build():\n    return torch.nn.Linear(8, 6)\n")
        st = factory.stat()
        os.utime(factory, (st.st_atime, st.st_mtime + 5))
        assert checker.run(plan, path).facts.params["weight"][0] == (6, 8)
    finally:
        sys.modules.pop(module, None)
