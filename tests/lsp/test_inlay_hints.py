"""Inlay hints over stdio with model checks: each sharded parameter's local shape once the model is
probed, and each pipeline stage's estimated memory and step time (the model-free hint, an input's local
shape under its `data` spec, is tested in test_editing_requests.py's session)."""
import re
import time

import pytest

from .conftest import at
from .stdio import open_doc, pos, start

PLAN = """use hardware
model mlp = "examples.mlp.model:build"(in_features = 64, hidden = 256, out_features = 32)
input x : f32[batch = 16, features = 64]
mesh ranks of 8 x hardware.cpu {
    pp = 2 over hardware.loopback
    dp = 2 over hardware.loopback
    tp = 2 over hardware.loopback
}
budget 4 GiB per device
optimizer adamw(lr = 0.001)
data x : [dp, _]
pipeline over pp schedule gpipe microbatches 2 {
    stage fc1, act
    stage fc2
}
shard fc1.weight : [tp, _]
shard fc1.bias : [tp]
shard fc2.weight : [_, tp]
"""
WHOLE = {"start": {"line": 0, "character": 0}, "end": {"line": 99, "character": 0}}
CAPS = {"workspace": {"inlayHint": {"refreshSupport": True}}}
LIB = """template cols(ax: axis) {
    shard weight : [ax, _]
    shard bias : [ax]
}
"""
# no pipeline; fc2 sharded by a template of another file
APPLIED = """use hardware
use "lib.plan"
model mlp = "examples.mlp.model:build"(in_features = 64, hidden = 256, out_features = 32)
input x : f32[batch = 16, features = 64]
mesh ranks of 4 x hardware.cpu {
    dp = 2 over hardware.loopback
    tp = 2 over hardware.loopback
}
budget 4 GiB per device
optimizer adamw(lr = 0.001)
data x : [dp, _]
apply lib.cols(tp) to fc2
"""


def _hints(c, uri, rng=WHOLE):
    return c.request("textDocument/inlayHint", {"textDocument": {"uri": uri}, "range": rng})


def _at_end_of(marker, text=PLAN):
    line_end = text.index("\n", at(text, marker))
    return pos(text, line_end)


def _refreshed(c, n):
    """Wait for the server's n-th request to ask for inlay hints again (a model-aware run ended)."""
    end = time.monotonic() + 60
    while sum(r["method"] == "workspace/inlayHint/refresh" for r in c.server_requests) < n:
        assert time.monotonic() < end, "no inlay hint refresh after the model checks"
        time.sleep(0.1)


def _labels(hints):
    return {(h["position"]["line"], h["position"]["character"]): h["label"] for h in hints}


def test_with_model_checks_each_sharded_parameter_shows_its_local_shape(tmp_path):
    torch = pytest.importorskip("torch")
    path, applied = tmp_path / "main.plan", tmp_path / "applied.plan"
    (tmp_path / "lib.plan").write_text(LIB)
    c = start(CAPS, init_options={"modelChecks": True, "modelCheckDelay": 0.1})
    try:
        open_doc(c, path.as_uri(), PLAN)
        # the model-aware run (torch, the model on meta) ends with a request to ask for hints again
        _refreshed(c, 1)
        labels = _labels(_hints(c, path.as_uri()))
        stage_hover = c.request("textDocument/hover", {"textDocument": {"uri": path.as_uri()},
                                                       "position": pos(PLAN, at(PLAN, "stage fc1", 1))})
        open_doc(c, applied.as_uri(), APPLIED)
        _refreshed(c, 2)
        applied_labels = _labels(_hints(c, applied.as_uri()))
    finally:
        c.close()
    fc1, fc2 = torch.nn.Linear(64, 256), torch.nn.Linear(256, 32)  # what the model holds: weight [out, in]
    w1, w2 = tuple(fc1.weight.shape), tuple(fc2.weight.shape)
    assert labels[tuple(_at_end_of("shard fc1.weight").values())] == f"local [{w1[0] // 2}, {w1[1]}]"
    assert labels[tuple(_at_end_of("shard fc1.bias").values())] == f"local [{w1[0] // 2}]"
    assert labels[tuple(_at_end_of("shard fc2.weight").values())] == f"local [{w2[0]}, {w2[1] // 2}]"
    assert labels[tuple(_at_end_of("data x").values())] == "local [8, 64]"
    for stage in ("stage fc1", "stage fc2"):
        label = labels[tuple(_at_end_of(stage).values())]
        assert re.fullmatch(r"≈ [\d.]+ [KMG]?i?B peak, [\d.]+ ms/step", label), label
    # the figures the hover's estimate table shows for the stage
    peak = re.match(r"≈ (.*) peak, (.*) ms/step", labels[tuple(_at_end_of("stage fc1").values())])
    assert f"| peak | {peak.group(1)} |" in stage_hover["contents"]["value"]
    assert f"| step time | {peak.group(2)} ms |" in stage_hover["contents"]["value"]
    # a template from another file: its parameters on the `apply` line; no pipeline: the devices' estimate
    # on the budget line
    assert applied_labels[tuple(_at_end_of("apply lib.cols", APPLIED).values())] == \
        f"2 tensors, local [{w2[0] // 2}, {w2[1]}], [{w2[0] // 2}]"
    assert re.fullmatch(r"≈ [\d.]+ [KMG]?i?B peak, [\d.]+ ms/step",
                        applied_labels[tuple(_at_end_of("budget", APPLIED).values())])
