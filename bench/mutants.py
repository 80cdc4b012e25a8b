"""Soundness as a tested invariant: mutants of the example plans, each either rejected by `check --model`
or run by the runtime; none accepted and then refused or crashed on (issue #17, item 1).

Run: .venv/bin/python bench/mutants.py [--seed 0] [--count 640] [--train 28] [--jobs 2] [--out FILE]

Seeds: the example plans of examples/ (mlp_2d, mlp_dp, gpt2_3d, bert_tp, gpt2_cpu_partial with its holes
filled), the 4-process plans the runtime tests train (tests/runtime/plans/) and two of the model zoo's
(tests/zoo/plans.py), and 13 more of the zoo's Hugging Face and CNN architectures (Qwen2, Mistral and Falcon
under dp x tp, GPT-J, Gemma2, DistilBERT, BART, T5, ConvNeXt and ResNet under dp, Phi as a pipeline, ViT
under dp x tp, BERT under ZeRO-3). Each mutant is a seed with one edit of one class (a share of them a second edit of
another class):

  mesh          axis sizes (every factorization of the device count, a size that breaks the product,
                twice the devices), axes swapped in mesh order
  spec          one entry of a `shard` or `data` spec replaced (by `_`, another axis, two axes), an entry
                dropped or added, `partial(axis)` added or taken away
  stages        a stage boundary moved (an index range shifted, a module moved to the next or previous
                stage), two stages swapped, a module left out or given to two stages
  microbatches  0, 1, 2, 3, 4, 8
  schedule      gpipe, 1f1b, interleaved (chunks 2)
  zero          every stage 0-4 over every mesh axis, and without an axis
  checkpoint    groups of 1, 2, 3 blocks, one block, two sub-modules (consecutive or not), a range, a path
                that is not there, `every 0`, the existing groups taken away
  input         batch sizes, other dims halved, doubled, made odd, dtypes swapped
  optimizer     every optimizer with plain and extra arguments; arguments the class lacks; values out of
                range
  model         the factory's arguments: heads, hidden size, layers, vocabulary
  precision     bf16, autocast (bf16 compute), f16 with a dynamic or a static loss scale (on a CPU device
                with f16 flops), f16 without a loss scale
  tie           GPT-2's lm_head tied to wte, alone, under ZeRO-2/3 over dp and (pipelines) under GPipe and
                interleaved 1F1B
  overlap       a glob shard beside an explicit shard of the same parameter (`fc*.weight` beside
                `fc1.weight`), with the same spec and with another
  implicit      the data axes left implicit (no `data` statement), alone and with a batch of 2

Each mutant goes the way a user's plan goes:

  1. `check --model` (planlang.model.checks.check_with_model, the one validation every command runs):
     an error is `rejected`.
  2. accepted: what `planlang verify` checks before it launches (`planlang.runtime.verify.preflight`);
     the program of every rank as `planlang lower --rank R` prints it (planlang.runtime.launch: the
     model built on meta, lowered once, each rank's code generated; a pipeline plan's stages cut and
     each rank's stages printed); the plan's optimizer built over the model's parameters; and for the
     4-process CPU plans `planlang.apply` on rank 0 under torch's fake process group, with one step and
     one optimizer step when there is no pipeline (`apply_rank0`). Any exception: `accepted-then-failed`,
     else `lowered`.
  3. a sample of the lowered 4-process CPU plans (--train, spread over the mutation classes):
     `planlang verify --steps 2` on 4 gloo processes. PASS is `trained`; anything else
     (FAIL, a refusal, a crash, a timeout) is `accepted-then-failed`.

The table goes to stdout and to bench/results/mutants.txt; the exit status is 1 when any mutant was
accepted and then failed. tests/bench/test_mutants_share.py runs a fixed-seed share in CI.
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CLASSES = ("mesh", "spec", "stages", "microbatches", "schedule", "zero", "checkpoint", "input", "optimizer",
           "model", "precision", "tie", "overlap", "implicit")


# ------------------------------------------------------------------------------------------ seeds
def _zoo(model: str, layout: str) -> str:
    from tests.zoo.plans import plan_text

    return plan_text(model, layout)


def _filled_partial() -> str:
    """examples/partial/gpt2_cpu_partial.plan with its holes filled as `solve` may fill them."""
    text = (ROOT / "examples/partial/gpt2_cpu_partial.plan").read_text()
    text = text.replace("dp = ? over", "dp = 2 over").replace("tp = ? over", "tp = 2 over")
    text = text.replace("shard h[*].mlp.c_fc.weight : ?", "shard h[*].mlp.c_fc.weight : [_, _]")
    return text.replace("checkpoint ?", "checkpoint h[*] every 1")


# name -> (text, the container of the model's blocks as a plan names it, sub-modules of a block)
def seeds() -> dict[str, tuple[str, str, tuple[str, ...]]]:
    rt = ROOT / "tests/runtime/plans"
    out = {
        "mlp_2d": ((ROOT / "examples/mlp/mlp_2d.plan").read_text(), "", ("fc1", "act", "fc2")),
        "mlp_dp": ((ROOT / "examples/mlp/mlp_dp.plan").read_text(), "", ("fc1", "act", "fc2")),
        "gpt2_3d": ((ROOT / "examples/gpt2/gpt2_3d.plan").read_text(), "h", ("attn", "mlp")),
        "bert_tp": ((ROOT / "examples/templates/bert_tp.plan").read_text(), "encoder.layer",
                    ("attention", "intermediate", "output")),
        "gpt2_cpu_partial": (_filled_partial(), "h", ("attn", "mlp")),
        "mlp_dp2_tp2": ((rt / "mlp_dp2_tp2.plan").read_text(), "", ("fc1", "act", "fc2")),
        "gpt2_dp2_tp2_zero1": ((rt / "gpt2_dp2_tp2_zero1.plan").read_text(), "h", ("attn", "mlp")),
        "gpt2_pp2_dp2_zero1": ((rt / "gpt2_pp2_dp2_zero1.plan").read_text(), "h", ("attn", "mlp")),
        "gpt2_pp2_dp2_zero2": ((rt / "gpt2_pp2_dp2_zero2.plan").read_text(), "h", ("attn", "mlp")),
        "gpt2_pp4_1f1b": ((rt / "gpt2_pp4_1f1b.plan").read_text(), "h", ("attn", "mlp")),
        "gpt2_dp2_fs2_hsdp": ((rt / "gpt2_dp2_fs2_hsdp.plan").read_text(), "h", ("attn", "mlp")),
        "bert_tp2_dp2": ((rt / "bert_tp2_dp2.plan").read_text(), "encoder.layer",
                         ("attention", "intermediate", "output")),
        "hf_gpt2_dp2_tp2": ((rt / "hf_gpt2_dp2_tp2.plan").read_text(), "transformer.h", ("attn", "mlp")),
        "llama_pp2dp2": (_zoo("llama", "pp2dp2"), "model.layers", ("self_attn", "mlp")),
        "resnet_zero3": (_zoo("resnet", "zero3"), "blocks", ()),
        # the model zoo's other Hugging Face architectures (issue 27): grouped- and multi-query attention
        # under tp, interleaved rotary, casts, encoder-decoders, a BatchNorm CNN under data parallelism
        "qwen2_dp2tp2": (_zoo("qwen2", "dp2tp2"), "model.layers", ("self_attn", "mlp")),
        "mistral_dp2tp2": (_zoo("mistral", "dp2tp2"), "model.layers", ("self_attn", "mlp")),
        "falcon_dp2tp2": (_zoo("falcon", "dp2tp2"), "transformer.h", ("self_attention", "mlp")),
        "gptj_dp4": (_zoo("gptj", "dp4"), "transformer.h", ("attn", "mlp")),
        "gemma2_dp4": (_zoo("gemma2", "dp4"), "model.layers", ("self_attn", "mlp")),
        "phi_pp2dp2": (_zoo("phi", "pp2dp2"), "model.layers", ("self_attn", "mlp")),
        "distilbert_dp4": (_zoo("distilbert", "dp4"), "distilbert.transformer.layer", ("attention", "ffn")),
        "bart_dp4": (_zoo("bart", "dp4"), "model.encoder.layers", ("self_attn", "fc1")),
        "t5_dp4": (_zoo("t5", "dp4"), "encoder.block", ("layer",)),
        "vit_dp2tp2": (_zoo("vit", "dp2tp2"), "vit.layers", ("attention", "mlp")),
        "bert_zero3": (_zoo("bert", "zero3"), "bert.encoder.layer", ("attention", "intermediate", "output")),
        "convnext_dp4": (_zoo("convnext", "dp4"), "convnext.encoder.stages", ()),
        "resnet_dp4": (_zoo("resnet", "dp4"), "blocks", ()),
    }
    return out


# ------------------------------------------------------------------------------------------ text helpers
_MESH_AXIS = re.compile(r"^(\s*)(\w+) = (\d+) over ", re.M)
_MESH_INLINE = re.compile(r"\{ (\w+) = (\d+) over ([\w.]+) \}")
_COUNT = re.compile(r"of (\d+) x ")


def _mesh_axes(text: str) -> list[tuple[str, int]]:
    block = _mesh_block(text)
    return [(m.group(2), int(m.group(3))) for m in _MESH_AXIS.finditer(block)] or \
           [(m.group(1), int(m.group(2))) for m in _MESH_INLINE.finditer(block)]


def _mesh_block(text: str) -> str:
    m = re.search(r"^mesh .*?(\{.*?\}|$)", text, re.M | re.S)
    return m.group(0) if m else ""


def _expand_inline_mesh(text: str) -> str:
    """`{ dp = 4 over link }` on the mesh line -> one axis per line (so every edit below finds it)."""
    return _MESH_INLINE.sub(lambda m: "{\n    %s = %s over %s\n}" % m.groups(), text)


def _set_axis_sizes(text: str, sizes: dict[str, int], count: int | None = None) -> str:
    text = _expand_inline_mesh(text)
    block = _mesh_block(text)
    new = _MESH_AXIS.sub(lambda m: f"{m.group(1)}{m.group(2)} = {sizes.get(m.group(2), m.group(3))} over ", block)
    if count is not None:
        new = _COUNT.sub(f"of {count} x ", new, count=1)
    return text.replace(block, new, 1)


def _split_entries(inner: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


_SPEC_LINE = re.compile(r"^(\s*(?:shard|data) [^:\n]+?\s*:\s*)\[([^\]\n]*)\]( partial\((\w+)\))?(.*)$", re.M)


def _factorizations(n: int, k: int) -> list[tuple[int, ...]]:
    if k == 1:
        return [(n,)]
    return [(d,) + rest for d in range(1, n + 1) if n % d == 0 for rest in _factorizations(n // d, k - 1)]


# ------------------------------------------------------------------------------------------ operators
# Each operator: (seed text, the seed's block container and sub-modules) -> [(description, mutant text)]

def op_mesh(text, blocks, subs):
    text = _expand_inline_mesh(text)
    axes = _mesh_axes(text)
    if not axes:
        return []
    names = [a for a, _ in axes]
    count = math.prod(s for _, s in axes)
    out = []
    for sizes in _factorizations(count, len(axes)):
        if list(sizes) != [s for _, s in axes]:
            out.append((f"mesh {dict(zip(names, sizes))}", _set_axis_sizes(text, dict(zip(names, sizes)))))
    for a, s in axes:
        out.append((f"mesh {a} = 3 (product no longer {count})", _set_axis_sizes(text, {a: 3})))
        out.append((f"mesh {a} = {2 * s}, {2 * count} devices", _set_axis_sizes(text, {a: 2 * s}, 2 * count)))
    if len(axes) >= 2:  # the first two axes in the other order
        block = _mesh_block(text)
        lines = block.split("\n")
        idx = [i for i, ln in enumerate(lines) if _MESH_AXIS.match(ln)]
        lines[idx[0]], lines[idx[1]] = lines[idx[1]], lines[idx[0]]
        out.append((f"mesh axes {names[1]} before {names[0]}", text.replace(block, "\n".join(lines), 1)))
    return out


def op_spec(text, blocks, subs):
    names = [a for a, _ in _mesh_axes(_expand_inline_mesh(text))]
    out = []
    for m in _SPEC_LINE.finditer(text):
        head, inner, part, part_axis, tail = m.group(1), m.group(2), m.group(3) or "", m.group(4), m.group(5)
        entries = _split_entries(inner)
        choices = ["_"] + names + ([f"({names[0]}, {names[1]})"] if len(names) >= 2 else [])

        def line(es, p=part):
            return f"{head}[{', '.join(es)}]{p}{tail}"

        variants = []
        for i, e in enumerate(entries):
            for c in choices:
                if c != e:
                    variants.append((f"entry {i} {e} -> {c}", line(entries[:i] + [c] + entries[i + 1:])))
        if entries:
            variants.append(("last entry dropped", line(entries[:-1])))
        variants.append(("an entry `_` added", line(entries + ["_"])))
        if "shard" in head:
            if part:
                variants.append(("partial taken away", line(entries, "")))
            else:
                for a in names:
                    variants.append((f"partial({a}) added", line(entries, f" partial({a})")))
        for what, new in variants:
            out.append((f"`{m.group(0).strip()}`: {what}", text[:m.start()] + new + text[m.end():]))
    return out


_PIPE = re.compile(r"^pipeline over (\w+) schedule (\w+(?: chunks \d+)?) microbatches (\d+) \{\n(.*?)\n\}", re.M | re.S)


def _stages(text):
    m = _PIPE.search(text)
    if not m:
        return None, []
    return m, [[x.strip() for x in ln.strip()[len("stage "):].split(",")] for ln in m.group(4).split("\n")
               if ln.strip().startswith("stage ")]


def _with_stages(text, m, stages):
    body = "\n".join("    stage " + ", ".join(s) for s in stages)
    return text[:m.start(4)] + body + text[m.end(4):]


_RANGE = re.compile(r"^(.*)\[(\d+):(\d+)\]$")


def op_stages(text, blocks, subs):
    m, stages = _stages(text)
    if not m:
        return []
    out = []
    n = len(stages)
    for i in range(n - 1):
        a, b = stages[i], stages[i + 1]
        if len(a) > 1:
            out.append((f"stage {i} last module `{a[-1]}` moved to stage {i + 1}",
                        _with_stages(text, m, stages[:i] + [a[:-1], [a[-1]] + b] + stages[i + 2:])))
        if len(b) > 1:
            out.append((f"stage {i + 1} first module `{b[0]}` moved to stage {i}",
                        _with_stages(text, m, stages[:i] + [a + [b[0]], b[1:]] + stages[i + 2:])))
        ra, rb = _RANGE.match(a[-1]), _RANGE.match(b[0])
        if ra and rb and ra.group(1) == rb.group(1):
            for d in (-1, 1):
                cut = int(ra.group(3)) + d
                na = a[:-1] + [f"{ra.group(1)}[{ra.group(2)}:{cut}]"]
                nb = [f"{rb.group(1)}[{cut}:{rb.group(3)}]"] + b[1:]
                out.append((f"boundary {ra.group(3)} -> {cut}", _with_stages(text, m, stages[:i] + [na, nb] + stages[i + 2:])))
            out.append(("ranges overlap by one", _with_stages(
                text, m, stages[:i] + [a[:-1] + [f"{ra.group(1)}[{ra.group(2)}:{int(ra.group(3)) + 1}]"], b] + stages[i + 2:])))
        out.append((f"stages {i} and {i + 1} swapped", _with_stages(text, m, stages[:i] + [b, a] + stages[i + 2:])))
        out.append((f"`{a[0]}` also in stage {i + 1}", _with_stages(text, m, stages[:i] + [a, b + [a[0]]] + stages[i + 2:])))
    last = stages[-1]
    if len(last) > 1:
        out.append((f"`{last[-1]}` in no stage", _with_stages(text, m, stages[:-1] + [last[:-1]])))
    out.append(("a stage fewer (last two merged)", _with_stages(text, m, stages[:-2] + [stages[-2] + stages[-1]])))
    return out


def op_microbatches(text, blocks, subs):
    m = _PIPE.search(text)
    if not m:
        return []
    return [(f"microbatches {k}", text[:m.start(3)] + str(k) + text[m.end(3):])
            for k in (0, 1, 2, 3, 4, 8) if str(k) != m.group(3)]


_GPT2_4 = ["wte, wpe, drop, h[0]", "h[1]", "h[2]", "h[3], ln_f, lm_head"]  # a 4-layer GPT-2 in 4 stages


def op_schedule(text, blocks, subs):
    m = _PIPE.search(text)
    if not m:
        return []
    out = [(f"schedule {s}", text[:m.start(2)] + s + text[m.end(2):])
           for s in ("gpipe", "1f1b", "interleaved chunks 2", "interleaved") if s != m.group(2)]
    # interleaved as it can run: two stages per pipeline rank (4 stages over pp = 2)
    if "examples.gpt2.model" in text and "layers = 4" in text and _mesh_axes(text)[0] == ("pp", 2):
        for mb in (2, 3, 4):
            body = "\n".join("    stage " + st for st in _GPT2_4)
            new = text[:m.start(2)] + f"interleaved chunks 2 microbatches {mb} {{\n{body}" + text[m.end(4):]
            out.append((f"schedule interleaved chunks 2, 4 stages, microbatches {mb}", new))
    return out


_OPT = re.compile(r"^optimizer (\w+)\(([^)]*)\)(?: *\{(.*?)\})?[ \t]*$", re.M | re.S)


def _set_optimizer(text, name=None, args=None, block=...):
    m = _OPT.search(text)
    assert m, "every seed has an optimizer"
    name = m.group(1) if name is None else name
    args = m.group(2) if args is None else args
    block = m.group(3) if block is ... else block
    new = f"optimizer {name}({args})" + (f" {{\n    {block.strip()}\n}}" if block else "")
    return text[:m.start()] + new + text[m.end():]


def op_zero(text, blocks, subs):
    names = [a for a, _ in _mesh_axes(_expand_inline_mesh(text))]
    m = _OPT.search(text)
    cur = (m.group(3) or "").strip()
    out = []
    for stage in (0, 1, 2, 3, 4):
        for axis in names + [None]:
            z = f"zero = {stage}" + (f" over {axis}" if axis else "")
            if z != cur and (axis is not None or stage in (0, 1, 3)):
                out.append((z, _set_optimizer(text, block=z)))
    if cur:
        out.append(("ZeRO taken away", _set_optimizer(text, block=None)))
    return out


def op_checkpoint(text, blocks, subs):
    base = re.sub(r"^checkpoint .*\n?", "", text, flags=re.M)
    base = re.sub(r"^for block in h\[\*\] \{\n    checkpoint [^\n]*\n\}\n?", "", base, flags=re.M)
    base = re.sub(r"^template recompute.*?^\}\n\napply recompute\(\d\) to encoder\n?", "", base, flags=re.M | re.S)
    out = []
    if base != text:
        out.append(("checkpoint groups taken away", base))
    base = base.rstrip("\n") + "\n"
    if blocks:
        b = blocks
        groups = [f"{b}[*] every 1", f"{b}[*] every 2", f"{b}[*] every 3", f"{b}[*] every 0", f"{b}[0]",
                  f"{b}[0], {b}[1]", f"{b}[0:2]", f"{b}[1:1]", f"{b}[*]", f"{b}[0].nothere"]
        if len(subs) >= 2:
            groups += [f"{b}[0].{subs[0]}, {b}[0].{subs[1]}", f"{b}[0].{subs[0]}, {b}[1].{subs[0]}",
                       f"{b}[*].{subs[-1]}"]
        groups.append(f"{b}[0] every 1\ncheckpoint {b}[0:2]")  # two groups over one block
    else:
        groups = [", ".join(subs[:2]), subs[0], subs[-1], f"{subs[0]}, {subs[2]}", ", ".join(subs), "nothere"]
    for g in groups:
        out.append((f"checkpoint {g}".replace("\n", "; "), base + f"checkpoint {g}\n"))
    return out


_INPUT = re.compile(r"^input (\w+) : (\w+)\[([^\]]*)\]", re.M)
_DTYPES = ("f32", "bf16", "f16", "f64", "i64", "i32", "u8", "bool")


def op_input(text, blocks, subs):
    m = _INPUT.search(text)
    if not m:
        return []
    dims = [(d.split("=")[0].strip(), int(d.split("=")[1])) for d in m.group(3).split(",")]

    def with_dims(ds, dtype=m.group(2)):
        inner = ", ".join(f"{n} = {v}" for n, v in ds)
        return text[:m.start()] + f"input {m.group(1)} : {dtype}[{inner}]" + text[m.end():]

    out = []
    batch = dims[0][1]
    for b in sorted({1, 2, 3, 4, 6, 12, 16, 2 * batch} - {batch}):
        out.append((f"batch {b}", with_dims([(dims[0][0], b)] + dims[1:])))
    for i, (name, v) in enumerate(dims[1:], 1):
        for nv in sorted({v // 2, 2 * v, v + 1, v - 1} - {v, 0}):
            out.append((f"{name} {nv}", with_dims(dims[:i] + [(name, nv)] + dims[i + 1:])))
    for dt in _DTYPES:
        if dt != m.group(2):
            out.append((f"dtype {dt}", with_dims(dims, dt)))
    out.append(("a dim dropped", with_dims(dims[:-1])))
    return out


OPTIMIZER_VARIANTS = [
    ("sgd", "lr = 0.1"), ("sgd", "lr = 0.1, momentum = 0.9, nesterov = true"), ("momentum", "lr = 0.05"),
    ("adam", "lr = 0.001"), ("adam", "lr = 0.001, betas = [0.9, 0.95], eps = 1e-6"),
    ("adamw", "lr = 0.001, weight_decay = 0.1"), ("adagrad", "lr = 0.1"), ("rmsprop", "lr = 0.01, alpha = 0.9"),
    ("adafactor", "lr = 0.01"), ("lion", "lr = 0.0001, weight_decay = 0.1"), ("lion", "lr = 0.0001"),
    # arguments the torch class does not take, and values it refuses
    ("adamw", "lr = 0.001, momentum = 0.9"), ("sgd", "lr = 0.1, betas = [0.9, 0.99]"),
    ("lion", "lr = 0"), ("adam", "lr = 0.001, betas = [1.5, 0.999]"), ("adamw", "lr = 0.001, betas = 0.9"),
    ("sgd", "lr = 0.1, nesterov = true"), ("adam", "lr = \"fast\""), ("adamw", ""),
]


def op_optimizer(text, blocks, subs):
    m = _OPT.search(text)
    return [(f"optimizer {n}({a})", _set_optimizer(text, n, a)) for n, a in OPTIMIZER_VARIANTS
            if (n, a) != (m.group(1), m.group(2))]


_MODEL = re.compile(r"^(model \w+ = \"[^\"]+\")\((.*?)\)$", re.M | re.S)


def op_model(text, blocks, subs):
    m = _MODEL.search(text)
    if not m or not m.group(2).strip():
        return []
    args = [(k.strip(), v.strip()) for k, v in (a.split("=") for a in m.group(2).replace("\n", "").split(",")
                                                  if "=" in a)]
    vals = dict(args)
    out = []

    def with_args(**kw):
        new = ", ".join(f"{k} = {kw.get(k, v)}" for k, v in args)
        return text[:m.start(2)] + new + text[m.end(2):]

    if "heads" in vals:
        hidden = int(vals["hidden"])
        for h in (1, 2, 3, 6, 8):
            if str(h) != vals["heads"] and hidden % h == 0:
                out.append((f"heads {h}", with_args(heads=h)))
        out.append(("hidden 48, heads 3", with_args(hidden=48, heads=3)))
        out.append(("hidden 96, heads 6", with_args(hidden=96, heads=6)))
        out.append(("heads 5 (hidden not a multiple)", with_args(heads=5)))
    if "layers" in vals:
        for n in (1, 3, int(vals["layers"]) + 2):
            if str(n) != vals["layers"]:
                out.append((f"layers {n}", with_args(layers=n)))
    if "vocab" in vals:
        out.append(("vocab odd", with_args(vocab=int(vals["vocab"]) + 1)))
    if "hidden" in vals and "heads" not in vals:  # the MLP
        h = int(vals["hidden"])
        for nh in (h + 1, h + 2, h // 2 + 1, 6):
            out.append((f"hidden {nh}", with_args(hidden=nh)))
        out.append(("in_features 12", with_args(in_features=12)))
    if "intermediate" in vals:
        out.append(("intermediate odd", with_args(intermediate=int(vals["intermediate"]) + 1)))
    return out


F16_DEVICE = ('device cpu_f16 {\n    memory = 24 GiB\n    flops.f32 = 100 GFLOPS\n    flops.f16 = 50 GFLOPS\n'
              '    backend = "gloo"\n}\n')


def _with_f16_device(text: str) -> str:
    """The plan on a CPU device that declares f16 flops (hardware.cpu declares f32 and bf16: PL510)."""
    return re.sub(r"^(use hardware\n)", r"\1" + F16_DEVICE.replace("\\", "\\\\"), text, count=1, flags=re.M) \
        .replace("x hardware.cpu", "x cpu_f16")


def op_precision(text, blocks, subs):
    """The optimizer block's precision fields: bf16, f16 with a dynamic or static loss scale (on a device
    with f16 flops), f16 without one (PL511), autocast only (f32 parameters, bf16 compute)."""
    m = _OPT.search(text)
    cur = (m.group(3) or "").strip()

    def block(*fields):
        return "\n    ".join([cur] + list(fields) if cur else list(fields))

    out = [("precision = bf16", _set_optimizer(text, block=block("precision = bf16"))),
           ("compute = bf16 (autocast)", _set_optimizer(text, block=block("compute = bf16"))),
           ("precision = f16 without a loss scale", _set_optimizer(text, block=block("precision = f16")))]
    if "hardware.cpu" in text:
        f16 = _with_f16_device(text)
        out += [("precision = f16, loss_scale = dynamic (cpu_f16)",
                 _set_optimizer(f16, block=block("precision = f16", "loss_scale = dynamic"))),
                ("precision = f16, loss_scale = 1024 (cpu_f16)",
                 _set_optimizer(f16, block=block("precision = f16", "loss_scale = 1024")))]
    return out


def op_tie(text, blocks, subs):
    """GPT-2's lm_head tied to wte: across pipeline stages, under ZeRO, with every other edit on top."""
    m = _MODEL.search(text)
    if not m or "examples.gpt2.model" not in m.group(1) or "tie_embeddings" in m.group(2):
        return []
    tied = text[:m.end(2)] + ", tie_embeddings = true" + text[m.end(2):]
    out = [("tie_embeddings = true", tied)]
    # the tied weight under each ZeRO stage over the data axis, and (a pipeline) under each schedule
    for what, z in op_zero(tied, blocks, subs):
        if re.fullmatch(r"zero = [123] over dp", what):
            out.append((f"tie_embeddings = true; {what}", z))
            out += [(f"tie_embeddings = true; {what}; {w2}", t2) for w2, t2 in op_schedule(z, blocks, subs)
                    if "4 stages" in w2 or w2 == "schedule gpipe"]
    return out


_SHARD_TARGET = re.compile(r"^(\s*)shard ([\w\[\]*.:]+?)(\d+)(\.\w+)\s*:\s*\[([^\]\n]*)\]", re.M)


def op_overlap(text, blocks, subs):
    """A glob beside an explicit shard of the same parameter (`shard fc*.weight` beside `shard fc2.weight`):
    the same spec (no conflict), a different one (PL310, against the model's parameter names)."""
    names = [a for a, _ in _mesh_axes(_expand_inline_mesh(text))]
    out = []
    for mt in _SHARD_TARGET.finditer(text):
        indent, stem, _, leaf, inner = mt.groups()
        glob = f"{stem}*{leaf}"
        entries = _split_entries(inner)
        other = ["_" if e != "_" else (names[-1] if names else "_") for e in entries]
        for what, spec in (("same spec", entries), ("another spec", other)):
            line = f"{indent}shard {glob} : [{', '.join(spec)}]\n"
            at = text.find("\n", mt.end()) + 1
            out.append((f"`{glob}` beside `{mt.group(0).strip()}` ({what})", text[:at] + line + text[at:]))
    return out


def op_implicit(text, blocks, subs):
    """The data axes left implicit (every `data` statement taken away), alone and with a batch of 2."""
    base = re.sub(r"^data [^\n]*\n?", "", text, flags=re.M)
    if base == text:
        return []
    out = [("data statements taken away (implicit data axes)", base)]
    m = _INPUT.search(base)
    if m:
        dims = m.group(3).split(",")
        name = dims[0].split("=")[0].strip()
        small = base[:m.start(3)] + ", ".join([f"{name} = 2"] + dims[1:]) + base[m.end(3):]
        out.append(("implicit data axes, batch 2", small))
    return out


OPERATORS = {"mesh": op_mesh, "spec": op_spec, "stages": op_stages, "microbatches": op_microbatches,
             "schedule": op_schedule, "zero": op_zero, "checkpoint": op_checkpoint, "input": op_input,
             "optimizer": op_optimizer, "model": op_model, "precision": op_precision, "tie": op_tie,
             "overlap": op_overlap, "implicit": op_implicit}


@dataclass
class Mutant:
    id: str
    seed: str
    cls: str
    what: str
    text: str
    # filled by evaluate()
    outcome: str = ""  # rejected | lowered | trained | accepted-then-failed
    codes: tuple[str, ...] = ()
    error: str = ""
    world: int = 0
    cpu: bool = False
    seconds: float = 0.0
    stage: str = ""  # where an accepted mutant failed: check, preflight, lower, optimizer, apply, verify


# Seeds whose mutants cost several seconds each (12-layer models at full width): fewer of them.
HEAVY = {"gpt2_3d": 0.35, "bert_tp": 0.35, "hf_gpt2_dp2_tp2": 0.5, "llama_pp2dp2": 0.6,
         **{z: 0.5 for z in ("qwen2_dp2tp2", "mistral_dp2tp2", "falcon_dp2tp2", "gptj_dp4", "gemma2_dp4",
                             "phi_pp2dp2", "distilbert_dp4", "bart_dp4", "t5_dp4", "vit_dp2tp2", "bert_zero3",
                             "convnext_dp4", "resnet_dp4")}}


def generate(count: int, seed: int = 0) -> list[Mutant]:
    """`count` mutants (fewer when there are not that many), the same for the same seed: every first-order
    mutant of every seed, thinned to fit, with second-order ones (two edits of different classes) making
    up the rest."""
    rng = random.Random(seed)
    first: list[Mutant] = []
    seen: set[str] = set()
    for name, (text, blocks, subs) in seeds().items():
        for cls, op in OPERATORS.items():
            for what, new in op(text, blocks, subs):
                h = hashlib.sha1(new.encode()).hexdigest()
                if new == text or h in seen:
                    continue
                seen.add(h)
                first.append(Mutant(f"{name}-{cls}-{h[:8]}", name, cls, what, new))
    keep = [m for m in first if rng.random() < HEAVY.get(m.seed, 1.0)]
    # spec edits are the most numerous (every entry x every axis): sample them to the size of the others
    by_cls: dict[str, list[Mutant]] = {}
    for m in keep:
        by_cls.setdefault(m.cls, []).append(m)
    quota = max(1, int(count * 0.8) // len(by_cls))
    chosen: list[Mutant] = []
    spare: list[Mutant] = []
    for cls in CLASSES:
        ms = by_cls.get(cls, [])
        rng.shuffle(ms)
        chosen += ms[:quota]
        spare += ms[quota:]
    rng.shuffle(spare)
    chosen += spare[:max(0, int(count * 0.8) - len(chosen))]
    # second order: an accepted-looking edit of one class on top of another
    all_seeds = seeds()
    tries = 0
    while len(chosen) < count and tries < 20 * count:
        tries += 1
        m = rng.choice(keep)
        text, blocks, subs = all_seeds[m.seed]
        cls2 = rng.choice([c for c in CLASSES if c != m.cls])
        options = OPERATORS[cls2](m.text, blocks, subs)
        if not options:
            continue
        what, new = rng.choice(options)
        h = hashlib.sha1(new.encode()).hexdigest()
        if h in seen:
            continue
        seen.add(h)
        chosen.append(Mutant(f"{m.seed}-{m.cls}+{cls2}-{h[:8]}", m.seed, f"{m.cls}+{cls2}", f"{m.what}; {what}", new))
    return sorted(chosen[:count], key=lambda m: m.id)


# ------------------------------------------------------------------------------------------ evaluation
def _short(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip()
    return text if len(text) < 600 else text[:600] + " ..."


def lower_every_rank(plan) -> None:
    """What `planlang lower --rank R` computes for every rank R (planlang.runtime.launch.lower_source),
    with the rank-independent part (the model built on meta, the program lowered) done once."""
    # lazy: torch loads only in the workers that evaluate
    from planlang.model.capture.load import build_model
    from planlang.runtime.apply import lower_plan, report_fallbacks
    from planlang.runtime.codegen import generate as generate_code
    from planlang.runtime.launch import coords_of, pipeline_source, world_size

    n = world_size(plan)
    model = build_model(plan.model, plan.path)
    if plan.pipeline is not None:
        for rank in range(n):
            pipeline_source(model, plan, rank, coords_of(rank, plan.mesh))
        return
    prog = lower_plan(model, plan)
    report_fallbacks(prog, False)
    for rank in range(n):
        generate_code(prog, rank, coords_of(rank, plan.mesh), title=plan.path)


def build_plan_optimizer(plan) -> None:
    """The plan's optimizer class with its arguments over the model's parameters (on meta), as every rank
    builds it (planlang.runtime.verify.reference_optimizer: the class and arguments, ZeRO aside)."""
    # lazy: torch loads only in the workers that evaluate
    from planlang.model.capture.load import build_model
    from planlang.runtime.verify import reference_optimizer

    reference_optimizer(build_model(plan.model, plan.path).parameters(), plan)


def apply_rank0(plan) -> None:
    """`planlang.apply` on rank 0 of the plan's world under torch's fake process group (collectives do
    nothing; torchtitan's dry run does the same), then one step and one optimizer step when the plan has
    no pipeline (a pipeline's schedule exchanges shapes with its neighbours, which a fake group cannot):
    what every rank does after lowering (shard the parameters, wrap ZeRO, FSDP2 or the pipeline stages,
    build the optimizer) without launching processes. Only the world's rank 0 runs here; ranks differ
    only in their coordinates, which `lower_every_rank` covers."""
    # lazy: torch loads only in the workers that evaluate
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from planlang.model.capture.load import build_model, plan_loss
    from planlang.runtime.apply import apply
    from planlang.runtime.launch import world_size
    from planlang.runtime.verify import make_batch, plan_optimizer

    dist.init_process_group("fake", rank=0, world_size=world_size(plan), store=FakeStore())
    try:
        torch.manual_seed(0)
        model = build_model(plan.model, plan.path, device="cpu")
        loss_fn = plan_loss(plan)
        inputs, targets = make_batch(model, plan, loss_fn, 1)
        pm = apply(model, plan, loss_fn=loss_fn, targets=tuple(t.to("meta") for t in targets) if targets else None)
        opt = plan_optimizer(pm, plan)
        if plan.pipeline is None:
            opt.zero_grad(set_to_none=True)
            pm.step(*inputs, *targets)
            opt.step()
    finally:
        dist.destroy_process_group()


def evaluate(m: Mutant, folder: str) -> Mutant:
    """Check the mutant with its model; lower an accepted one on every rank."""
    # lazy: torch loads only in the workers that evaluate
    import contextlib
    import io

    from planlang.lang.diagnostics import Severity
    from planlang.model.validation import check_with_model
    from planlang.plan.complete import IncompletePlan, complete as as_complete
    from planlang.runtime.launch import world_size
    from planlang.runtime.verify import preflight

    path = os.path.join(folder, f"{m.id}.plan")
    Path(path).write_text(m.text)
    t = time.perf_counter()
    quiet = io.StringIO()
    try:
        with contextlib.redirect_stderr(quiet):
            res = check_with_model(path)
    except Exception as err:  # noqa: BLE001 - the checker itself must not raise: a finding of its own
        m.outcome, m.stage, m.error = "accepted-then-failed", "check", _short(err) + "\n" + traceback.format_exc(limit=4)
        m.seconds = time.perf_counter() - t
        return m
    errors = [d for d in res.diagnostics if d.severity is Severity.ERROR]
    if errors or res.plan is None:
        m.outcome, m.codes = "rejected", tuple(sorted({d.code for d in errors}))
        m.seconds = time.perf_counter() - t
        return m
    try:
        plan = as_complete(res.plan)
    except IncompletePlan as err:
        m.outcome, m.stage, m.error = "accepted-then-failed", "complete", _short(err)
        m.seconds = time.perf_counter() - t
        return m
    m.world = world_size(plan)
    m.cpu = plan.mesh.device.name.startswith("cpu") or "hardware.cpu" in m.text
    stage = "preflight"
    try:
        with contextlib.redirect_stderr(quiet):
            preflight(path)
            stage = "lower"
            lower_every_rank(plan)
            stage = "optimizer"
            build_plan_optimizer(plan)
            if m.world == 4 and m.cpu:
                stage = "apply"
                apply_rank0(plan)
        m.outcome = "lowered"
    except Exception as err:  # noqa: BLE001 - what the runtime raises on an accepted plan is the finding
        m.outcome, m.stage, m.error = "accepted-then-failed", stage, _short(err)
    m.seconds = time.perf_counter() - t
    return m


def _evaluate_star(args):
    return evaluate(*args)


def train(m: Mutant, folder: str, steps: int = 2, timeout: int = 420) -> Mutant:
    """`planlang verify --steps 2` on 4 gloo processes; PASS is `trained`."""
    path = os.path.join(folder, f"{m.id}.plan")
    Path(path).write_text(m.text)
    t = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, "-m", "planlang.cli", "verify", path, "--steps", str(steps), "--quiet"],
                             cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, "PLANLANG_BACKEND": "gloo", "OMP_NUM_THREADS": "1"})
        ok = out.returncode == 0 and "PASS" in out.stdout
        detail = (out.stdout[-1500:] + out.stderr[-1500:]).strip()
    except subprocess.TimeoutExpired:
        ok, detail = False, f"verify did not finish in {timeout} s"
    m.seconds += time.perf_counter() - t
    if ok:
        m.outcome = "trained"
    else:
        m.outcome, m.stage, m.error = "accepted-then-failed", "verify", detail
    return m


def pick_for_training(ms: list[Mutant], n: int, seed: int = 0) -> list[Mutant]:
    """Up to `n` lowered 4-process CPU mutants, spread over the mutation classes (round robin)."""
    rng = random.Random(seed + 1)
    pool: dict[str, list[Mutant]] = {}
    for m in ms:
        if m.outcome == "lowered" and m.world == 4 and m.cpu:
            pool.setdefault(m.cls.split("+")[0], []).append(m)
    for v in pool.values():
        rng.shuffle(v)
    out: list[Mutant] = []
    for i in itertools.count():
        row = [v[i] for v in pool.values() if i < len(v)]
        if not row or len(out) >= n:
            break
        out += row[: n - len(out)]
    return out


def evaluate_all(ms: list[Mutant], folder: str, jobs: int = 2, progress=None) -> list[Mutant]:
    """`evaluate` every mutant, in `jobs` processes (spawned: each imports torch once)."""
    say = progress or (lambda msg: None)
    if jobs <= 1:
        return [evaluate(m, folder) for m in ms]
    import multiprocessing as mp

    done = []
    with mp.get_context("spawn").Pool(jobs) as pool:
        for i, m in enumerate(pool.imap(_evaluate_star, [(m, folder) for m in ms], chunksize=2)):
            done.append(m)
            if (i + 1) % 25 == 0:
                say(f"checked {i + 1}/{len(ms)}")
    return done


def run(count: int, seed: int = 0, n_train: int = 12, jobs: int = 2, progress=None) -> list[Mutant]:
    say = progress or (lambda msg: None)
    ms = generate(count, seed)
    say(f"{len(ms)} mutants of {len(seeds())} seeds")
    with tempfile.TemporaryDirectory(prefix="planlang-mutants-") as folder:
        ms = evaluate_all(ms, folder, jobs, say)
        picked = pick_for_training(ms, n_train, seed)
        for i, m in enumerate(picked):
            say(f"verify {i + 1}/{len(picked)}: {m.id} ({m.what})")
            train(m, folder)
    return ms


# ------------------------------------------------------------------------------------------ report
def table(ms: list[Mutant], seconds: float | None = None) -> str:
    outcomes = ("rejected", "lowered", "trained", "accepted-then-failed")
    rows = []
    for cls in CLASSES + ("second order",):
        sel = [m for m in ms if (m.cls == cls if cls != "second order" else "+" in m.cls)]
        c = Counter(m.outcome for m in sel)
        rows.append((cls, len(sel), *(c[o] for o in outcomes)))
    c = Counter(m.outcome for m in ms)
    rows.append(("all", len(ms), *(c[o] for o in outcomes)))
    head = ("class", "mutants", "rejected", "lowered", "trained", "accepted-then-failed")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    fmt = lambda r: "  ".join(str(x).ljust(widths[0]) if i == 0 else str(x).rjust(widths[i]) for i, x in enumerate(r))
    lines = [fmt(head), "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in rows[:-1]] + ["  ".join("-" * w for w in widths), fmt(rows[-1])]
    lines.append("")
    lines.append("lowered: accepted, preflight passed and every rank's program generated; trained: lowered and "
                 "`planlang verify --steps 2` passed on 4 gloo processes (lowered counts exclude them)")
    codes = Counter(code for m in ms if m.outcome == "rejected" for code in m.codes)
    lines.append("rejections by code: " + ", ".join(f"{k} {v}" for k, v in sorted(codes.items())))
    seeds_count = Counter(m.seed for m in ms)
    lines.append("mutants by seed: " + ", ".join(f"{k} {v}" for k, v in sorted(seeds_count.items())))
    if seconds is not None:
        lines.append(f"time: {seconds:.0f} s")
    bad = [m for m in ms if m.outcome == "accepted-then-failed"]
    if bad:
        lines.append("")
        lines.append(f"accepted-then-failed ({len(bad)}):")
        for m in bad:
            lines.append(f"- {m.id} [{m.stage}] {m.what}")
            lines += ["    " + ln for ln in m.error.strip().splitlines()[-12:]]
    trained = [m for m in ms if m.outcome == "trained"]
    if trained:
        lines.append("")
        lines.append("trained: " + "; ".join(f"{m.id} ({m.what})" for m in trained))
    lines.append("")
    lines.append("every mutant: id, outcome (rejected: its error codes; accepted-then-failed: where), the edit")
    for m in ms:
        how = ",".join(m.codes) if m.outcome == "rejected" else m.stage
        lines.append(f"{m.id}  {m.outcome}{' ' + how if how else ''}  {m.what}")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=640)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train", type=int, default=28, help="lowered 4-process mutants to train with verify")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench/results/mutants.txt"))
    ap.add_argument("--list", action="store_true", help="print the mutants and stop")
    args = ap.parse_args()
    if args.list:
        for m in generate(args.count, args.seed):
            print(f"{m.id}\t{m.what}")
        return 0
    t = time.perf_counter()
    ms = run(args.count, args.seed, args.train, args.jobs, progress=lambda s: print(s, file=sys.stderr, flush=True))
    text = (f"bench/mutants.py --count {args.count} --seed {args.seed} --train {args.train}\n\n"
            + table(ms, time.perf_counter() - t))
    sys.stdout.write(text)
    if args.out:
        Path(args.out).write_text(text)
    return 1 if any(m.outcome == "accepted-then-failed" for m in ms) else 0


if __name__ == "__main__":
    sys.exit(main())
