"""Model-zoo conformance without processes: every architecture of examples/zoo (Hugging Face Llama,
Qwen2, Mistral, GPT-2, BERT, ViT, T5, Falcon, GPT-J, Gemma2, Phi, DistilBERT, BART and ConvNeXt from
configs, a CNN with BatchNorm and GroupNorm) under data parallelism over 4 devices checks clean against
its model, and its lowered per-rank program keeps the batch split: no op runs on the whole batch
(PL364), every activation whose dim 0 is the batch holds batch / 4 samples on a rank, and no conversion
gathers over the data axis."""
from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="the zoo's Hugging Face models need transformers")

from planlang.cost.ops import registry  # noqa: E402
from planlang.model.validation import check_with_model  # noqa: E402
from planlang.model.capture.load import build_model  # noqa: E402
from planlang.model.program.lowering import Convert, Run  # noqa: E402
from planlang.model.program.pipeline_program import cut_program, microbatch_plan  # noqa: E402
from planlang.plan.complete import complete  # noqa: E402
from planlang.runtime.apply import lower_plan  # noqa: E402
from tests.zoo.plans import BATCH, ZOO, plan_text  # noqa: E402


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("zoo")
    for model in ZOO:
        for layout in ("dp4", "dp2tp2"):
            (d / f"{model}_{layout}.plan").write_text(plan_text(model, layout))
    return d


# T5's attention adds its learned relative-position bias (split over tp with the heads) as the mask of
# scaled-dot-product attention, which has no rule for a mask from the data: the attention and the `where`
# that combines the bias with the causal mask run whole on each tp rank (PL367 says so)
WHOLE_OVER_TP = {"t5": {"scaled_dot_product_attention", "where"}}


@pytest.mark.parametrize("layout", ["dp4", "dp2tp2"])
@pytest.mark.parametrize("model", list(ZOO))
def test_checks_clean_and_keeps_the_batch_split(zoo_dir, model, layout):
    """Every zoo model under data parallelism and under Megatron tensor parallelism with data
    parallelism: no diagnostic but the ops a plan runs whole over tp (PL367, `WHOLE_OVER_TP`), and every
    activation whose dim 0 is the batch holds the rank's share of it (dim 0 split over dp, and only over
    dp) in the lowered program."""
    res = check_with_model(str(zoo_dir / f"{model}_{layout}.plan"))
    whole = WHOLE_OVER_TP.get(model, set()) if layout == "dp2tp2" else set()
    assert [str(d) for d in res.diagnostics if d.code != "PL367"] == []
    assert {d.message.split("`")[1] for d in res.diagnostics if d.code == "PL367"} == whole
    plan = complete(res.plan)
    prog = lower_plan(build_model(plan.model, plan.path), plan)
    assert prog.fallbacks == []
    assert {n.op.kind for n in prog.graph.nodes} - set(registry()) <= {"opaque"}  # the front end's kinds have rules
    batch_values = 0
    for ins in prog.instructions:
        if isinstance(ins, Run) and ins.node.op.output and ins.node.op.output[0] == BATCH:
            batch_values += 1
            assert ins.output.axes_of(0) == ("dp",), f"{ins.node.name} ({ins.node.op.kind}) is {ins.output}"
        if isinstance(ins, Convert):
            gathers = [s for s in ins.path.steps if s.axis == "dp" and s.kind in ("all_gather", "all_to_all")]
            assert gathers == [], f"{ins} gathers over the data axis"
    assert batch_values >= 10  # the check above saw the model's activations


@pytest.mark.parametrize("model", list(ZOO))
def test_pipeline_x_tensor_parallel_cuts_the_program_into_the_plans_stages(tmp_path, model):
    """Every zoo model under pp2 x tp2: no error, and its program (one microbatch, tensor-parallel layouts)
    cuts into the two stages the plan names: each Run of a selected module in that module's stage, the
    parameters of the second stage's blocks on the second stage only, the loss in the tail."""
    path = tmp_path / f"{model}_pp2tp2.plan"
    path.write_text(plan_text(model, "pp2tp2"))
    res = check_with_model(str(path))
    assert not res.errors, [str(d) for d in res.diagnostics]
    plan = complete(res.plan)
    prog = lower_plan(build_model(plan.model, plan.path), microbatch_plan(plan))
    cut = cut_program(prog, plan)
    where = cut.stage_of()
    second = plan.pipeline.stages[1].modules

    def in_second(module: str) -> bool:  # the module or one above it is selected by the second stage
        parts = module.split(".")
        return any(sel.select([".".join(parts[:k])]) for sel in second for k in range(1, len(parts) + 1))

    for k, ins in enumerate(prog.instructions):
        if isinstance(ins, Run) and ins.node.module and in_second(ins.node.module):
            assert where[k] == 1, (ins.node.name, ins.node.module)
    assert cut.tail and all(where[k] == 1 for k in cut.tail)
    assert not set(cut.stages[0].params) & {p for p in cut.stages[1].params if ".layer" in p or ".h." in p}


def test_a_model_op_without_a_rule_is_reported_not_silent(tmp_path):
    """cumsum has no rule and is not per sample: PL364 names it and what it costs, the program marks it,
    and the lowering splits the batch again right after it."""
    (tmp_path / "cum.py").write_text(
        "import torch\nfrom torch import nn\n\n\nclass Cum(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.fc1 = nn.Linear(16, 32)\n"
        "        self.fc2 = nn.Linear(32, 4)\n\n    def forward(self, x):\n"
        "        return self.fc2(torch.cumsum(torch.relu(self.fc1(x)), dim=-1))\n\n\n"
        "def build():\n    return Cum()\n")
    (tmp_path / "cum.plan").write_text(
        'use hardware\nmodel cum = "cum:build"()\ninput x : f32[batch = 8, features = 16]\n'
        "mesh cluster of 2 x hardware.cpu {\n    dp = 2 over hardware.loopback\n}\nbudget 1 GiB per device\n"
        "optimizer sgd(lr = 0.1)\ndata x : [dp, _]\n")
    res = check_with_model(str(tmp_path / "cum.plan"))
    assert [d.code for d in res.diagnostics] == ["PL364"]
    d = res.diagnostics[0]
    assert "`cumsum`" in d.message and "gathered over dp" in d.message and "per rank per step" in d.message
    assert d.span.line == 9  # the data line
    plan = complete(res.plan)
    prog = lower_plan(build_model(plan.model, plan.path), plan)
    assert [fb.target for fb in prog.fallbacks] == ["cumsum"]
    fc2 = next(i for i in prog.instructions if isinstance(i, Run) and i.node.name == "model_fc2")
    assert fc2.output.axes_of(0) == ("dp",)  # split again after the gather


def test_batch_norm_in_a_pipeline_with_microbatches_is_reported(tmp_path):
    """Each microbatch goes through a stage alone, so BatchNorm's statistics would be per microbatch:
    PL466 before anything runs (one microbatch: no PL466, only the idle-stage warning PL403)."""
    def plan(microbatches: int) -> str:
        return ('use hardware\nmodel cnn = "examples.zoo.cnn:resnet"()\n'
                "input images : f32[batch = 8, c = 3, h = 16, w = 16]\n"
                "mesh cluster of 2 x hardware.cpu {\n    pp = 2 over hardware.loopback\n}\n"
                "budget 1 GiB per device\noptimizer sgd(lr = 0.1)\n"
                f"pipeline over pp schedule gpipe microbatches {microbatches} {{\n"
                "    stage stem, bn, blocks[0]\n    stage blocks[1], pool, fc\n}\n")
    (tmp_path / "four.plan").write_text(plan(4))
    (tmp_path / "one.plan").write_text(plan(1))
    found = check_with_model(str(tmp_path / "four.plan")).diagnostics
    assert [d.code for d in found] == ["PL466"]
    assert "3 BatchNorm module(s) (`bn`, `blocks[0].bn`, `blocks[1].bn`)" in found[0].message
    assert [d.code for d in check_with_model(str(tmp_path / "one.plan")).diagnostics] == ["PL403"]


def _llama_cut(tmp_path, layout: str):
    """Llama under `layout`, checked clean with its model, and the stages split_stages cuts it into."""
    import torch

    from planlang.model.program.stages import split_stages

    (tmp_path / "pp.plan").write_text(plan_text("llama", layout))
    res = check_with_model(str(tmp_path / "pp.plan"))
    assert [d.code for d in res.diagnostics] == []
    plan = complete(res.plan)
    torch.manual_seed(0)
    model = build_model(plan.model, plan.path, device="cpu")
    return model, split_stages(model, plan)


def _chained_logits(stages, ids):
    """The stages run one after the other, each on what the one before returned; the model's output."""
    from planlang.model.program.stages import OUT_SPEC
    from torch.utils._pytree import tree_unflatten

    sent = (ids,)
    for stage in stages:
        out = stage(*sent)
        sent = out if isinstance(out, tuple) else (out,)
    return tree_unflatten(list(sent), getattr(stages[-1], OUT_SPEC)).logits


def test_a_hugging_face_pipeline_is_cut_from_torch_export(tmp_path):
    """fx cannot trace Hugging Face forwards between stage modules; the stages are cut from torch.export
    instead (torch.distributed.pipelining's tracer), keeping the model's parameter names, and compose to
    the model; the last stage returns the logits, which the loss gets back as the model's output."""
    import torch

    model, (first, last) = _llama_cut(tmp_path, "pp2dp2")
    assert {n for n, _ in first.named_parameters()} >= {"model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight"}
    assert "lm_head.weight" in {n for n, _ in last.named_parameters()}
    ids = torch.randint(0, 256, (2, 16))  # one microbatch: 8 / dp 2 / 2 microbatches
    assert torch.allclose(_chained_logits([first, last], ids), model(ids).logits, atol=1e-6)


def test_a_value_a_later_stage_reads_is_passed_through_the_stages_between(tmp_path):
    """Llama's rotary embeddings and mask are made with the embedding (stage 0) and read by every decoder
    layer (stages 1 and 2): torch.export's cut reads them from stage 0, but a pipeline stage receives only
    what the stage before it sends, so stage 1 passes them on. The four stages compose to the model."""
    import torch

    model, stages = _llama_cut(tmp_path, "pp2dp2i")
    assert len(stages) == 4
    ids = torch.randint(0, 256, (1, 16))  # one microbatch: 8 / dp 2 / 4 microbatches
    assert torch.allclose(_chained_logits(stages, ids), model(ids).logits, atol=1e-6)


def test_a_pipeline_the_model_cannot_be_cut_into_is_refused_before_launch(tmp_path, monkeypatch):
    """When torch.export cannot cut the model either (here its tracer is made to fail), `check --model`
    (so every command that runs a plan) says so with PL467, naming both tracers' reasons, instead of an
    error after launch."""
    import torch.distributed.pipelining as pipelining  # stages.py imports its tracer when it cuts

    def refuse(*args, **kwargs):
        raise RuntimeError("no split for you")

    monkeypatch.setattr(pipelining, "pipeline", refuse)
    (tmp_path / "pp.plan").write_text(plan_text("llama", "pp2dp2"))
    found = check_with_model(str(tmp_path / "pp.plan")).diagnostics
    assert [d.code for d in found] == ["PL467"]
    assert "torch.fx cannot trace the model between its stage modules" in found[0].message
    assert "torch.export could not cut it either: RuntimeError: no split for you" in found[0].message


@pytest.mark.parametrize("model", ["llama", "t5"])
def test_lower_prints_every_rank_of_a_hugging_face_pipeline(tmp_path, model):
    """`planlang lower` of a pipeline shows each rank's stages from the cut the runtime makes (torch.export's
    for a Hugging Face model, which torch.fx cannot trace between its stage modules): no second trace that
    fails where the run would not."""
    from planlang.runtime.launch import coords_of, pipeline_source, world_size

    path = tmp_path / f"{model}_pp2dp2.plan"
    path.write_text(plan_text(model, "pp2dp2"))
    res = check_with_model(str(path))
    assert [d.code for d in res.diagnostics] == ([] if model == "llama" else ["PL463"])  # T5: lm_head tied to shared
    plan = complete(res.plan)
    net = build_model(plan.model, plan.path)
    texts = [pipeline_source(net, plan, r, coords_of(r, plan.mesh)) for r in range(world_size(plan))]
    assert [t.splitlines()[1] for t in texts] == ["# holds stages [0]"] * 2 + ["# holds stages [1]"] * 2
    for t in texts:
        header = next(line for line in t.splitlines() if line.startswith("# stage "))
        inputs, outputs = header.split(": (", 1)[1].split(") -> (")
        assert inputs and outputs.rstrip(")"), header  # what crosses the boundary is named
        assert "def forward(" in t


def test_batch_norm_inlined_by_an_exported_cut_under_data_parallelism_is_reported(tmp_path):
    """A model fx cannot trace between its stages is cut from torch.export, which inlines BatchNorm: its
    statistics cannot be synced over dp there, so each rank would normalize its own samples - PL466."""
    (tmp_path / "untraceable.py").write_text(
        "import torch\nfrom torch import nn\n\n\nclass Net(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.conv = nn.Conv2d(3, 4, 3, padding=1)\n"
        "        self.bn = nn.BatchNorm2d(4)\n        self.fc = nn.Linear(4, 2)\n\n"
        "    def forward(self, x):\n        channels = int(x.shape[1])  # fx cannot trace int() of a size\n"
        "        y = self.bn(self.conv(x))\n        return self.fc(y.mean(dim=(2, 3)) * channels)\n\n\n"
        "def build():\n    return Net()\n")
    text = ('use hardware\nmodel net = "untraceable:build"()\n'
            "input x : f32[batch = 8, c = 3, h = 8, w = 8]\n"
            "mesh cluster of 4 x hardware.cpu {\n    pp = 2 over hardware.loopback\n    dp = 2 over hardware.loopback\n}\n"
            "budget 1 GiB per device\noptimizer sgd(lr = 0.1)\ndata x : [dp, _, _, _]\n"
            "pipeline over pp schedule gpipe microbatches 1 {\n    stage conv, bn\n    stage fc\n}\n")
    (tmp_path / "p.plan").write_text(text)
    found = [d for d in check_with_model(str(tmp_path / "p.plan")).diagnostics if d.code != "PL403"]
    assert [d.code for d in found] == ["PL466"], [str(d) for d in found]
    assert "inlined" in found[0].message and "`bn`" in found[0].message


def test_torch_rms_norm_keeps_the_batch_split(tmp_path):
    """torch.nn.RMSNorm (the T5 example's norms) lowers to the rms_norm op, which has a rule: under data
    parallelism it runs on the local batch (it was an opaque module that gathered the batch, PL364)."""
    text = ('use hardware\nmodel t5 = "examples.t5.model:build"(layers = 1, d_model = 32, heads = 2, d_ff = 64, '
            'vocab = 64)\ninput input_ids : i64[batch = 8, src = 8]\ninput decoder_input_ids : i64[batch = 8, tgt = 8]\n'
            "mesh cluster of 2 x hardware.cpu {\n    dp = 2 over hardware.loopback\n}\n"
            "budget 1 GiB per device\noptimizer sgd(lr = 0.1)\ndata input_ids : [dp, _]\ndata decoder_input_ids : [dp, _]\n")
    (tmp_path / "t5.plan").write_text(text)
    res = check_with_model(str(tmp_path / "t5.plan"))
    assert [str(d) for d in res.diagnostics] == []
    plan = complete(res.plan)
    prog = lower_plan(build_model(plan.model, plan.path), plan)
    norms = [i for i in prog.instructions if isinstance(i, Run) and i.node.op.kind == "rms_norm"]
    assert prog.fallbacks == [] and len(norms) == 7  # encoder: attention, feed-forward, final; decoder: + cross
    assert all(i.output.axes_of(0) == ("dp",) for i in norms)
