"""The language's keywords, with the one-line syntax and meaning shown on hover and in completion.

Every keyword is also a valid name (soft keywords, docs/language.md §4.3): `output` may be a module.
Whether a word is used as a keyword is decided from the syntax tree, not from this list alone.
"""
from __future__ import annotations

from planlang.plan import types as T

# keyword -> (syntax, what it means, section of docs/language.md)
KEYWORDS: dict[str, tuple[str, str, str]] = {
    "use": ("use hardware | use patterns.megatron as mg | use \"presets.plan\"",
            "Brings in the declarations (devices, links, meshes, templates) of another plan module: "
            "stdlib/ first, then the plan's folder.", "§5"),
    "as": ("use MODULE as ALIAS", "Names a used module differently.", "§5"),
    "model": ("model NAME = \"package.module:callable\"(arg = value, ...)",
              "The factory that builds the nn.Module (called on the meta device for checks).", "§6"),
    "input": ("input NAME : DTYPE[dim = size, ...]  |  shard input of PATH : SPEC",
              "A model input with its dtype and named dims; in `shard`, the activation a module receives.",
              "§7"),
    "device": ("device NAME { memory = 80 GiB; flops.bf16 = 312 TFLOPS }",
               "A device profile: memory and peak throughput per dtype.", "§8"),
    "link": ("link NAME { bandwidth = 300 GB/s; latency = 1 us }",
             "An interconnect: one-direction bandwidth per device and latency (the alpha-beta model).", "§8"),
    "mesh": ("mesh NAME of N x DEVICE { axis = size over LINK ... }  |  mesh NAME = PRESET",
             "The device mesh: named axes, outermost first, each with a size and the link it runs over.", "§9"),
    "of": ("mesh NAME of N x DEVICE  |  output of PATH", "Names the mesh's device, or an activation's module.",
           "§9"),
    "x": ("mesh NAME of 8 x DEVICE", "The device count of a mesh.", "§9"),
    "over": ("AXIS = size over LINK  |  pipeline over AXIS  |  zero = 1 over AXIS",
             "The link an axis runs over, or the axis a pipeline or ZeRO uses.", "§9"),
    "budget": ("budget 40 GiB per device", "The memory each device may use at its peak.", "§10"),
    "per": ("budget AMOUNT per device", "The budget is per device.", "§10"),
    "optimizer": ("optimizer adamw(lr = 0.001) { zero = 1 over dp; precision = bf16 }",
                  "The optimizer, its ZeRO stage (0-3) and axis, and the precision of the step (dtypes of "
                  "parameters, compute, gradient reduction and master weights).", "§11"),
    "data": ("data INPUT : [dp, _]", "Which input dims are split over which axes (data parallelism).", "§12"),
    "shard": ("shard PATH : [axis | (a, b) | _ | ?, ...] partial(axis)",
              "A sharding spec for parameters (or an activation, `output of PATH`): one entry per tensor dim.",
              "§14"),
    "output": ("shard output of PATH : SPEC", "The activation a module returns.", "§14"),
    "partial": ("SPEC partial(axis)", "The value is a partial sum over these axes until reduced.", "§14.1"),
    "pipeline": ("pipeline over AXIS schedule 1f1b microbatches 8 { stage ...; stage ... }",
                 "Pipeline parallelism: the axis, the schedule, microbatches and stages in execution order.",
                 "§15"),
    "schedule": ("schedule gpipe | 1f1b | interleaved chunks N | looped_bfs chunks N | zero_bubble [chunks N] "
                 "| zbv chunks 2 | dualpipev chunks 2", "The pipeline schedule.", "§15"),
    "microbatches": ("microbatches 8", "Microbatches per step (the batch is split into them).", "§15"),
    "chunks": ("schedule interleaved chunks 2", "Model chunks (stages) per device: at least 2 for interleaved "
               "and looped_bfs, at least 1 for zero_bubble (1 when left out), exactly 2 for the V schedules zbv "
               "and dualpipev.", "§15"),
    "stage": ("stage PATH, PATH, ... [with axis = size, ...]",
              "One pipeline stage: consecutive modules in execution order; optional per-stage degrees.", "§15"),
    "with": ("stage PATH with tp = 4", "Per-stage sub-mesh degrees.", "§15"),
    "checkpoint": ("checkpoint PATH, ... [every N]  |  checkpoint ?",
                   "Activation checkpointing: modules recomputed together in backward.", "§16"),
    "every": ("checkpoint h[*] every 2", "Groups of N consecutive modules of a selection.", "§16"),
    "template": ("template NAME(param: axis, n: int) { shard ...; checkpoint ... }",
                 "A reusable group of statements with paths relative to where it is applied.", "§17"),
    "apply": ("apply TEMPLATE(args) to PATH", "Expands a template at a module.", "§17"),
    "to": ("apply TEMPLATE(args) to PATH", "The module a template is applied to.", "§17"),
    "for": ("for VAR in SELECTION { ... }", "Repeats statements for every module of a selection.", "§18"),
    "in": ("for VAR in SELECTION { ... }", "The selection a `for` loops over.", "§18"),
}

SCHEDULES = T.SCHEDULES  # the checker's list

# Statements that may start a line, by the block they are in (the header keyword of the block; "" = top).
STATEMENT_KEYWORDS: dict[str, tuple[str, ...]] = {
    "": ("use", "model", "input", "device", "link", "mesh", "budget", "optimizer", "data", "shard",
         "pipeline", "checkpoint", "template", "apply", "for"),
    "template": ("shard", "checkpoint", "apply", "for"),
    "for": ("shard", "checkpoint", "apply", "for"),
    "pipeline": ("stage",),
    "device": ("memory", "flops.bf16", "flops.f16", "flops.tf32", "flops.f32", "memory_bandwidth", "backend"),
    "link": ("bandwidth", "latency"),
    "optimizer": ("zero", "precision", "params", "compute", "reduce", "master", "loss_scale"),  # PRECISION_FIELDS
    "mesh": (),
}


def describe(word: str) -> str | None:
    """Markdown for a keyword's hover."""
    entry = KEYWORDS.get(word)
    if entry is None:
        return None
    syntax, meaning, section = entry
    return f"**{word}** (keyword)\n\n```plan\n{syntax}\n```\n\n{meaning} See docs/language.md {section}."
