"""`planlang inspect`: the module tree of a model as a plan author needs it.

For every module in execution order: its path as plans write it (`h[0].attn.c_attn`), type, parameter
count with the shapes of its own parameters, output shape, forward GFLOP and the activation bytes it
saves for backward — all from one symbolic run on the meta device.
"""
from __future__ import annotations

import json

from planlang.plan.types import Input, ModelRef
from planlang.plan.units import format_bytes

from planlang.plan.selection import to_plan_name
from .capture.load import build_model, meta_inputs
from .capture.profile import profile_model
from .capture.trace import probe_modules


def parse_input(text: str) -> Input:
    """`idx:i64[batch=4,seq=128]` -> Input."""
    name, _, rest = text.partition(":")
    dtype, _, dims = rest.partition("[")
    if not name or not dtype or not dims.endswith("]"):
        raise ValueError(f"an input looks like idx:i64[batch=4,seq=128], not {text!r}")
    pairs = []
    for part in dims[:-1].split(","):
        k, _, v = part.partition("=")
        if not v.strip().isdigit():
            raise ValueError(f"dim {part!r} of {text!r} needs a size: name=N")
        pairs.append((k.strip(), int(v)))
    return Input(name.strip(), dtype.strip(), tuple(pairs))


def inspect_model(ref: ModelRef, inputs: tuple[Input, ...], plan_path: str | None = None,
                  depth: int | None = None) -> dict:
    module = build_model(ref, plan_path)
    tensors = meta_inputs(inputs)
    facts = probe_modules(module, tensors)
    prof = profile_model(module, tensors)
    rows = []
    for name in facts.order:
        if depth is not None and name.count(".") - sum(p.isdigit() for p in name.split(".")) >= depth:
            continue
        call = facts.calls[name]
        agg = prof.subtree(name)
        own = {n.rsplit(".", 1)[1]: list(facts.params[n][0]) for n in facts.params
               if n.rsplit(".", 1)[0] == name and facts.canonical(n) == n}
        rows.append({
            "path": to_plan_name(name), "type": call.type, "params": agg.params,
            "param_shapes": own, "output": list(call.output) if call.output else None,
            "fwd_gflop": agg.fwd_flops / 1e9, "saved_bytes": agg.saved_bytes,
        })
    return {
        "model": str(ref), "inputs": [str(i) for i in inputs],
        "params": prof.param_bytes and prof.modules[""].params, "param_bytes": prof.param_bytes,
        "fwd_gflop": prof.total_fwd_flops / 1e9, "bwd_gflop": prof.total_bwd_flops / 1e9,
        "saved_bytes": prof.total_saved_bytes,
        "shared": [[to_plan_name(n) for n in g] for g in facts.shared],
        "modules": rows,
    }


def render_text(info: dict) -> str:
    lines = [
        f"model   {info['model']}",
        f"inputs  {', '.join(info['inputs'])}",
        f"params  {info['params']:,} ({format_bytes(info['param_bytes'])})   "
        f"forward {info['fwd_gflop']:.3f} GFLOP   backward {info['bwd_gflop']:.3f} GFLOP   "
        f"saved activations {format_bytes(info['saved_bytes'])}",
    ]
    if info["shared"]:
        lines.append("shared  " + "; ".join(" = ".join(g) for g in info["shared"]))
    lines.append("")
    head = f"{'module':34} {'type':16} {'params':>12} {'output':>18} {'GFLOP':>9} {'saved':>10}  parameters"
    lines += [head, "-" * len(head)]
    for r in info["modules"]:
        shapes = ", ".join(f"{k}{v}" for k, v in r["param_shapes"].items())
        out = "x".join(map(str, r["output"])) if r["output"] else "-"
        lines.append(f"{r['path']:34} {r['type']:16} {r['params']:>12,} {out:>18} {r['fwd_gflop']:>9.3f} "
                     f"{format_bytes(r['saved_bytes']):>10}  {shapes}".rstrip())
    return "\n".join(lines) + "\n"


def render_json(info: dict) -> str:
    return json.dumps(info, indent=2) + "\n"
