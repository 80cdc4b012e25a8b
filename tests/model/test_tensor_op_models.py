"""Small models using each op issue 27 found falling back to the whole batch (PL364): under data
parallelism over 4 devices `check --model` reports nothing, the lowered program has no fallback, the op
runs under its rule (not as an opaque call) on each rank's own samples. The Hugging Face models that
use them (GPT-J, Gemma2, Falcon) are checked by tests/zoo/test_zoo.py."""
from __future__ import annotations

import textwrap

import pytest

from planlang.model.validation import check_with_model
from planlang.model.capture.load import build_model
from planlang.model.program.lowering import Run
from planlang.plan.complete import complete
from planlang.runtime.apply import lower_plan

MODELS = {
    # GPT-J's rotary: every second element, negated and interleaved back (slice step 2, stack, flatten)
    "rotary": ("""
        def forward(self, x):                       # x [B, S, 32]
            h = self.fc1(x).view(x.shape[0], x.shape[1], 4, 8)
            x1, x2 = h[..., ::2], h[..., 1::2]      # [B, S, 4, 4] each
            r = torch.stack((-x2, x1), dim=-1).flatten(-2)
            return self.fc2((h * 0.5 + r).flatten(2))
    """, {"slice", "stack"}),
    # Gemma2: attention probabilities in float64 here (float32 under a bf16 model), cast back with type_as
    "upcast_softmax": ("""
        def forward(self, x):
            h = self.fc1(x)
            p = torch.softmax(h, dim=-1, dtype=torch.float64).type_as(h)
            return self.fc2(p.type_as(h))           # the same dtype: no op at all
    """, {"softmax", "cast"}),
    # a shifted window along the sequence (Swin's torch.roll)
    "roll": ("""
        def forward(self, x):
            return self.fc2(torch.roll(self.fc1(x), shifts=3, dims=1))
    """, {"roll"}),
    # hand-written attention with einsum: the batch letter b is kept, so it is per sample
    "einsum_attention": ("""
        def forward(self, x):
            b, t = x.shape[0], x.shape[1]
            q = self.fc1(x).view(b, t, 4, 8)
            k = self.fc3(x).view(b, t, 4, 8)
            s = torch.einsum("bthd,bshd->bhts", q, k).softmax(-1)
            o = torch.einsum("bhts,bshd->bthd", s, k)
            return self.fc2(o.reshape(b, t, 32))
    """, {"einsum"}),
    # multi-query attention: one key/value head broadcast against the query's 4 (HF Falcon)
    "multi_query": ("""
        def forward(self, x):
            b, t = x.shape[0], x.shape[1]
            q = self.fc1(x).view(b, t, 4, 8).transpose(1, 2)
            kv = self.kv(x).view(b, t, 1, 8).transpose(1, 2)
            o = F.scaled_dot_product_attention(q, kv, kv, is_causal=True)
            return self.fc2(o.transpose(1, 2).reshape(b, t, 32))
    """, {"scaled_dot_product_attention"}),
}

HEADER = """
import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 32)
        self.fc3 = nn.Linear(32, 32)
        self.kv = nn.Linear(32, 8)
        self.fc2 = nn.Linear(32, 32)
"""

FOOTER = """

def build():
    return Net()


def loss(output, target):
    return F.mse_loss(output, target)
"""


def _plan(tmp_path, name: str, forward: str, devices: int = 4, mesh: str = "dp = 4", extra: str = "",
          seq: int = 16) -> str:
    (tmp_path / f"{name}.py").write_text(HEADER + textwrap.indent(textwrap.dedent(forward), "    ") + FOOTER)
    text = (f'use hardware\nmodel net = "{name}:build"()\ninput x : f32[batch = 8, seq = {seq}, features = 32]\n'
            f"mesh cluster of {devices} x hardware.cpu {{\n"
            + "".join(f"    {a} over hardware.loopback\n" for a in mesh.split(";"))
            + "}\nbudget 1 GiB per device\noptimizer sgd(lr = 0.1)\ndata x : [dp, _, _]\n" + extra)
    path = tmp_path / f"{name}.plan"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("name", list(MODELS))
def test_the_op_runs_on_each_ranks_samples_without_pl364(tmp_path, name):
    forward, kinds = MODELS[name]
    res = check_with_model(_plan(tmp_path, name, forward))
    assert [str(d) for d in res.diagnostics] == []
    plan = complete(res.plan)
    prog = lower_plan(build_model(plan.model, plan.path), plan)
    assert prog.fallbacks == []
    runs = [i for i in prog.instructions if isinstance(i, Run)]
    assert kinds <= {i.node.op.kind for i in runs}
    for i in runs:
        if i.node.op.kind in kinds | {"opaque"} and i.node.op.output and i.node.op.output[0] == 8:
            assert i.output.axes_of(0) == ("dp",), f"{i.node.name} ({i.node.op.kind}) is {i.output}"
    if name == "upcast_softmax":  # computed in float64; type_as back to float32 a cast, the second none
        assert [i.node.op.attr("dtype") for i in runs if i.node.op.kind == "softmax"] == ["f64"]
        assert [i.node.op.attr("dtype") for i in runs if i.node.op.kind == "cast"] == ["f32"]
        assert not [i for i in runs if i.node.op.kind == "opaque"]


def test_a_roll_along_the_batch_still_gathers_it_and_says_so(tmp_path):
    """Rolling dim 0 mixes samples across ranks: not per sample, so it stays an opaque call and PL364
    names it (the rule covers rolls along other dims only)."""
    forward = """
        def forward(self, x):
            return self.fc2(torch.roll(self.fc1(x), shifts=1, dims=0))
    """
    res = check_with_model(_plan(tmp_path, "roll_batch", forward))
    assert [d.code for d in res.diagnostics] == ["PL364"]
    assert "`roll`" in res.diagnostics[0].message


def test_multi_query_attention_under_tensor_parallelism_replicates_the_one_key_value_head(tmp_path):
    """dp2 x tp2 with the query heads split over tp (fc1 column-parallel, fc2 row-parallel) and the single
    key/value head whole: attention runs on each rank's 2 query heads with the shared head, no gather of
    the query heads or the batch (the lowering raised EquationError 'letter h has sizes 4 and 1'). A
    sequence of 128 makes attention's compute worth splitting (at 16 the lowering gathers the heads:
    two gradient sums of k and v cost more than the compute they save)."""
    forward, _ = MODELS["multi_query"]
    extra = ("shard fc1.weight : [tp, _]\nshard fc1.bias : [tp]\nshard fc2.weight : [_, tp]\n")
    res = check_with_model(_plan(tmp_path, "mqa_tp", forward, mesh="dp = 2;tp = 2", extra=extra, seq=128))
    assert [str(d) for d in res.diagnostics] == []
    plan = complete(res.plan)
    prog = lower_plan(build_model(plan.model, plan.path), plan)
    assert prog.fallbacks == []
    att = next(i for i in prog.instructions if isinstance(i, Run) and i.node.op.kind == "scaled_dot_product_attention")
    q, k, v = att.strategy.inputs
    assert q.axes_of(0) == ("dp",) and q.axes_of(1) == ("tp",)
    assert k.axes_of(1) == () and v.axes_of(1) == () and att.output.axes_of(1) == ("tp",)
