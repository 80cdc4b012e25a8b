"""Fused projections stored per head (planlang.model.program.head_blocks): which parameters the lowering blocks,
that the cut of a blocked value needs no gather, and the reordering the runtime shards and gathers by."""
from __future__ import annotations

import pytest
import torch

from planlang.model.program.head_blocks import Blocked, blocked_order, unblocked_order
from planlang.model.program.lowering import Convert, Run
from planlang.plan.checker import check_text
from planlang.plan.complete import complete
from planlang.runtime.apply import lower_plan

GPT2 = """use hardware
use patterns.megatron
model gpt2 = "examples.gpt2.model:build"(layers = 2, hidden = 64, heads = 4, vocab = 128, seq = 16)
input idx : i64[batch = 4, seq = 16]
mesh ranks of 4 x hardware.cpu {{ dp = 2 over hardware.loopback; tp = 2 over hardware.loopback }}
budget 1 GiB per device
optimizer adamw(lr = 0.001)
data idx : [dp, _]
for block in h[*] {{
    apply megatron.attention(tp) to block.attn
{mlp}}}
"""


def _program(text: str, path: str = "gpt2.plan"):
    res = check_text(text, path)
    assert not res.errors, [str(d) for d in res.diagnostics]
    plan = complete(res.plan)
    from planlang.model.capture.load import build_model

    return lower_plan(build_model(plan.model, plan.path), plan)


def test_gpt2_attention_runs_on_local_heads_with_one_all_reduce_per_block():
    prog = _program(GPT2.format(mlp="    apply megatron.mlp(tp) to block.mlp\n"))
    for i in range(2):
        assert prog.blocked[f"h.{i}.attn.c_attn.weight"] == Blocked(1, 3, ("tp",))
        assert prog.blocked[f"h.{i}.attn.c_attn.bias"] == Blocked(0, 3, ("tp",))
    assert not any("c_fc" in n or "c_proj" in n for n in prog.blocked)  # nothing cut after them
    steps = [(st.kind, st.axis) for ins in prog.instructions if isinstance(ins, Convert) for st in ins.path.steps]
    # Megatron's forward: one all-reduce of the row-parallel output per attention and per MLP; no gather
    assert [s for s in steps if s[1] == "tp" and s[0] != "to_partial"] == [("all_reduce", "tp")] * 4
    pieces = [ins for ins in prog.instructions if isinstance(ins, Run) and ins.node.op.kind == "split"]
    assert len(pieces) == 6 and all(p.output.axes_of(2) == ("tp",) for p in pieces)


def test_a_projection_read_whole_elsewhere_is_not_blocked(tmp_path):
    """When the fused output is also used uncut, the pieces cannot be local (contiguous split, gather);
    cut alone, it is blocked."""
    (tmp_path / "fused.py").write_text(
        "import torch\nfrom torch import nn\n\n\nclass Fused(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.qkv = nn.Linear(16, 48)\n"
        "        self.out = nn.Linear(16, 4)\n\n    def forward(self, x):\n        y = self.qkv(x)\n"
        "        q, k, v = y.split(16, dim=-1)\n        return self.out(q * k + v) + y.sum(-1, keepdim=True)\n\n\n"
        "def build():\n    return Fused()\n")
    text = f"""use hardware
model m = "fused:build"()
input x : f32[batch = 8, features = 16]
mesh ranks of 2 x hardware.cpu {{ tp = 2 over hardware.loopback }}
budget 1 GiB per device
optimizer sgd(lr = 0.1)
shard qkv.weight : [tp, _]
shard qkv.bias : [tp]
"""
    prog = _program(text, str(tmp_path / "fused.plan"))
    assert prog.blocked == {}
    # the same projection cut and nothing else: an nn.Linear stores its output features on dim 0
    (tmp_path / "fused.py").write_text((tmp_path / "fused.py").read_text().replace(
        " + y.sum(-1, keepdim=True)", ""))
    prog = _program(text, str(tmp_path / "fused.plan"))
    assert prog.blocked == {"qkv.weight": Blocked(0, 3, ("tp",)), "qkv.bias": Blocked(0, 3, ("tp",))}


def test_blocked_order_gives_each_device_its_share_of_every_block():
    b = Blocked(1, 3, ("tp",))
    w = torch.arange(2 * 12).reshape(2, 12)  # 3 blocks of 4 columns, over 2 devices: 2 columns each
    ordered = blocked_order(w, b, 2)
    assert ordered[:, :6].tolist() == torch.cat([w[:, 0:2], w[:, 4:6], w[:, 8:10]], 1).tolist()
    assert ordered[:, 6:].tolist() == torch.cat([w[:, 2:4], w[:, 6:8], w[:, 10:12]], 1).tolist()
    assert torch.equal(unblocked_order(ordered, b, 2), w)
    assert torch.equal(unblocked_order(blocked_order(w.T.contiguous(), Blocked(0, 3, ("tp",)), 2),
                                       Blocked(0, 3, ("tp",)), 2), w.T)


def test_the_estimate_runs_gpt2_attention_on_local_heads():
    """HF's GPT-2 cuts c_attn's output by the global size and views it by Conv1D's `nf`: the estimate's
    local simulation follows the runtime (local heads) instead of falling back to the unsharded model."""
    pytest.importorskip("transformers")
    from planlang.model.price.estimate import estimate_plan
    from tests.zoo.plans import plan_text

    res = check_text(plan_text("gpt2", "dp2tp2"), "/tmp/gpt2_dp2tp2.plan")
    (row,) = estimate_plan(complete(res.plan))
    assert not any("local simulation failed" in n for n in row.notes), row.notes
