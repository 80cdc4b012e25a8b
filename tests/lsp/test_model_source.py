"""Model facts follow the model's source: when the factory's file, or a module it imports from the
plan's folder or its package, changes, the next model check builds the current code, and the server's
hover never shows numbers of the old model (planlang.model.capture.source.ModelSource)."""
import sys
import time

import pytest

torch = pytest.importorskip("torch")

from planlang.lsp.analysis import analyze  # noqa: E402
from planlang.lsp.hover import hover  # noqa: E402
from planlang.lsp.model_checks import CACHE_SIZE, ModelChecker  # noqa: E402
from planlang.model.capture.source import SOURCES, SOURCES_SIZE  # noqa: E402
from planlang.lsp.positions import LineIndex  # noqa: E402
from planlang.plan.units import format_bytes  # noqa: E402

from .client import LspClient  # noqa: E402
from .conftest import ROOT, at  # noqa: E402

PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable

MODEL = '''import torch
from {layers} import HIDDEN


class Mlp(torch.nn.Module):
    def __init__(self, width=64):
        super().__init__()
        self.fc1 = torch.nn.Linear(width, HIDDEN)
        self.act = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(HIDDEN, width)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def build(width=64):
    return Mlp(width)
'''
PLAN = '''use hardware
model m = "{factory}"
input x : f32[batch = 4, features = 64]
mesh c of 2 x hardware.cpu {{
    pp = 2 over hardware.loopback
}}
budget 1 GiB per device
pipeline over pp schedule gpipe microbatches 2 {{
    stage fc1, act
    stage fc2
}}
shard fc1.weight : [_, _]
'''


def _stage0_bytes(hidden, width=64):
    return format_bytes((width * hidden + hidden) * 4)  # fc1's weight and bias, float32


@pytest.fixture
def model_dir(tmp_path):
    """A plan and a model in a fresh folder: (folder, plan text, plan path, write_hidden(n))."""
    tag = "".join(c for c in tmp_path.name if c.isalnum())
    model, layers = f"grow_model_{tag}", f"grow_layers_{tag}"
    (tmp_path / f"{model}.py").write_text(MODEL.format(layers=layers))

    def write_hidden(n: int) -> None:  # three digits each time: the file keeps its size
        (tmp_path / f"{layers}.py").write_text(f"HIDDEN = {n:03d}\n")

    write_hidden(128)
    text = PLAN.format(factory=f"{model}:build")
    (tmp_path / "main.plan").write_text(text)
    yield tmp_path, text, str(tmp_path / "main.plan"), write_hidden
    for name in (model, layers):
        sys.modules.pop(name, None)


def _hover(text, path, insight, marker, delta):
    h = hover(analyze(text, path), at(text, marker, delta), insight, model_checks=True)
    return h.contents.value


def test_an_edited_module_imported_by_the_factory_is_built_again(model_dir):
    _, text, path, write_hidden = model_dir
    checker = ModelChecker()
    first = checker.run(text, path)
    assert first.facts.params["fc1.weight"][0] == (128, 64)
    assert f"| parameters | {_stage0_bytes(128)} |" in _hover(text, path, first, "stage fc1", 2)
    assert sorted(p.rsplit("/", 1)[-1].split("_")[1] for p in first.source.paths) == ["layers", "model"]
    assert not first.source_changed() and checker.run(text, path).facts is first.facts  # unchanged: cached

    write_hidden(512)  # the helper module, not the factory's file, in the same second, same size
    assert first.source_changed()
    second = checker.run(text, path)
    assert second.facts is not first.facts
    assert second.facts.params["fc1.weight"][0] == (512, 64)
    assert "float32 [512, 64]" in _hover(text, path, second, "shard fc1.weight", len("shard fc1."))
    assert f"| parameters | {_stage0_bytes(512)} |" in _hover(text, path, second, "stage fc1", 2)
    # the estimator's own cache was kept in step: a direct estimate agrees
    from planlang.model.price.estimate import estimate_plan
    from planlang.plan.complete import complete

    direct = {e.device: e for e in estimate_plan(complete(analyze(text, path).plan))}
    assert direct["stage 0"].parameters == second.estimate_for("stage 0").parameters

    # now the factory's own file: the stage estimate follows too (it kept the first model's numbers)
    factory = next(p for p in second.source.paths if "grow_model_" in p)
    with open(factory) as f:
        code = f.read()
    with open(factory, "w") as f:
        f.write(code.replace("Linear(width, HIDDEN)", "Linear(width, 2 * HIDDEN)")
                .replace("Linear(HIDDEN, width)", "Linear(2 * HIDDEN, width)"))
    third = checker.run(text, path)
    assert third.facts.params["fc1.weight"][0] == (1024, 64)
    assert f"| parameters | {_stage0_bytes(1024)} |" in _hover(text, path, third, "stage fc1", 2)


def test_a_factory_package_with_a_relative_import(tmp_path):
    tag = "".join(c for c in tmp_path.name if c.isalnum())
    pkg = tmp_path / f"growpkg_{tag}"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "model.py").write_text(MODEL.format(layers=".layers"))
    (pkg / "layers.py").write_text("HIDDEN = 100\n")
    plans = tmp_path / "plans"
    plans.mkdir()
    text = PLAN.format(factory=f"growpkg_{tag}.model:build")
    path = str(plans / "main.plan")
    checker = ModelChecker()
    try:
        first = checker.run(text, path)
        assert first.facts.params["fc1.weight"][0] == (100, 64)
        assert str((pkg / "layers.py").resolve()) in first.source.paths
        (pkg / "layers.py").write_text("HIDDEN = 300\n")
        assert checker.run(text, path).facts.params["fc1.weight"][0] == (300, 64)
    finally:
        for name in [n for n in sys.modules if n.startswith(f"growpkg_{tag}")]:
            sys.modules.pop(name, None)


def test_caches_are_bounded(model_dir):
    _, text, path, _ = model_dir
    checker = ModelChecker()
    for width in (8, 16, 24, 32, 40, 48):
        res = checker.run(text.replace(':build"', f':build"(width = {width})')
                          .replace("features = 64", f"features = {width}"), path)
        assert res.facts.params["fc2.weight"][0] == (width, 128)
    assert len(checker._facts) <= CACHE_SIZE and len(checker._estimates) <= CACHE_SIZE
    assert len(SOURCES.seen) <= SOURCES_SIZE


# ---------------------------------------------------------------------- through the server
def _pos(text, offset):
    p = LineIndex(text).position(offset)
    return {"line": p.line, "character": p.character}


def _hover_until(c, uri, text, offset, pred, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        h = c.request("textDocument/hover", {"textDocument": {"uri": uri}, "position": _pos(text, offset)})
        value = h["contents"]["value"] if h else ""
        if pred(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"hover never matched; last: {value!r}")
        time.sleep(0.1)


def test_server_hover_refreshes_after_the_model_changes(model_dir):
    folder, text, path, write_hidden = model_dir
    uri = (folder / "main.plan").as_uri()
    c = LspClient([PYTHON, "-m", "planlang.lsp", "--stdio"], cwd=str(folder))
    try:
        caps = {"workspace": {"didChangeWatchedFiles": {"dynamicRegistration": True}}}
        c.request("initialize", {"processId": None, "rootUri": None, "capabilities": caps,
                                 "initializationOptions": {"modelChecks": True, "modelCheckDelay": 0.1}})
        c.notify("initialized", {})
        c.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "planlang", "version": 1,
                                                           "text": text}})
        stage = at(text, "stage fc1", 2)
        old = f"| parameters | {_stage0_bytes(128)} |"
        _hover_until(c, uri, text, stage, lambda v: old in v)
        (reg,) = [r for r in c.server_requests if r["method"] == "client/registerCapability"]
        (watch,) = reg["params"]["registrations"]
        assert watch["method"] == "workspace/didChangeWatchedFiles"
        assert watch["registerOptions"]["watchers"] == [{"globPattern": "**/*.py"}]

        # the model grows; the plan is not touched. The next hover does not show the old numbers, and
        # starts the model checks again; a later one shows the new model
        write_hidden(512)
        value = c.request("textDocument/hover", {"textDocument": {"uri": uri}, "position": _pos(text, stage)})
        value = value["contents"]["value"]
        assert old not in value and "source changed" in value
        new = f"| parameters | {_stage0_bytes(512)} |"
        _hover_until(c, uri, text, stage, lambda v: new in v)

        # a watched-files notification re-checks without waiting for a hover
        write_hidden(256)
        mark = c.mark()
        c.notify("workspace/didChangeWatchedFiles", {"changes": [
            {"uri": (folder / f"grow_layers_{''.join(ch for ch in folder.name if ch.isalnum())}.py").as_uri(),
             "type": 2}]})
        c.wait_for("textDocument/publishDiagnostics", lambda p: p["uri"] == uri, after=mark, timeout=60)
        value = c.request("textDocument/hover", {"textDocument": {"uri": uri}, "position": _pos(text, stage)})
        assert f"| parameters | {_stage0_bytes(256)} |" in value["contents"]["value"]
    finally:
        assert c.close() == 0
    assert "Traceback" not in c.stderr_text()
