"""The report's index.html: the plan's summary, both charts and the tables behind them.

The page is self-contained (inline style, no scripts, nothing fetched) except for the chart images,
which it references by file name next to it.
"""
from __future__ import annotations

import html
import math

from planlang.plan import types as T
from planlang.plan.units import format_bytes

from .build import ReportData
from planlang.lang.render import render

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1150px;
       color: #222; padding: 0 1em; line-height: 1.45; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.2em; margin-top: 1.8em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.92em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.num, td:first-child { white-space: nowrap; }
th { background: #f3f3f3; } .over { color: #c0392b; font-weight: 600; } .ok { color: #2e7d32; }
img { max-width: 100%; border: 1px solid #eee; } .muted { color: #666; font-size: 0.9em; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
code { background: #f3f3f3; padding: 0 0.2em; }
"""


def _e(x) -> str:
    return html.escape(str(x))


def _row(cells, head: bool = False, nums: tuple[int, ...] = ()) -> str:
    tag = "th" if head else "td"
    return "<tr>" + "".join(f"<{tag}{' class=num' if i in nums else ''}>{c}</{tag}>"
                            for i, c in enumerate(cells)) + "</tr>"


def _seconds(t: float) -> str:
    if not isinstance(t, float) or not math.isfinite(t):
        return "–"
    return f"{t * 1e3:.3g} ms" if t < 10 else f"{t:.3g} s"  # as the step's parts (StepTime) print


def memory_limit(plan: T.Plan) -> tuple[int | None, str]:
    """The line the memory chart draws: the plan's budget, else the device's memory (with its name)."""
    if plan.budget is not None:
        return plan.budget.bytes, "budget"
    if plan.mesh is not None and plan.mesh.device is not None and plan.mesh.device.memory:
        return plan.mesh.device.memory, "device memory"
    return None, ""


def _summary(data: ReportData) -> str:
    plan = data.plan
    mesh = plan.mesh
    rows = [("plan", f"<code>{_e(plan.path)}</code>")]
    if plan.model is not None:
        rows.append(("model", f"<code>{_e(plan.model)}</code>"))
    if plan.inputs:
        rows.append(("inputs", "<br>".join(f"<code>{_e(i)}</code>" for i in plan.inputs)))
    if mesh is not None:
        axes = ", ".join(f"{_e(a.name)} = {_e(a.size)}" + (f" over {_e(a.link.name)}" if a.link else "")
                         for a in mesh.axes)
        rows.append(("mesh", f"<code>{_e(mesh.name)}</code>: {axes}"))
        if mesh.device is not None:
            rows.append(("device", _e(mesh.device)))
        rows.append(("world size", _e(mesh.size)))
    rows.append(("budget", _e(plan.budget) if plan.budget else "none (the device's memory is the limit)"))
    if plan.optimizer is not None:
        rows.append(("optimizer", _e(plan.optimizer)))
    if plan.data:
        rows.append(("data", "<br>".join(_e(d) for d in plan.data)))
    if plan.pipeline is not None:
        rows.append(("pipeline", _e(plan.pipeline)))
    if plan.checkpoints:
        rows.append(("checkpointing", "<br>".join(_e(c) for c in plan.checkpoints)))
    if plan.shards:
        rows.append(("shard rules", f"{len(plan.shards)} (after templates and loops)"))
    return "<table>" + "".join(_row((f"<b>{k}</b>", v)) for k, v in rows) + "</table>"


def _memory_table(data: ReportData) -> str:
    limit, what = memory_limit(data.plan)
    head = ("device", "parameters", "gradients", "optimizer state", "buffers", "activations", "transient",
            "peak", "peak in", what or "limit", "step time", "of which bubble")
    nums = tuple(range(1, 8)) + (10, 11)
    out = [_row(head, head=True, nums=nums)]
    for r, bar in zip(data.estimates, data.bars):
        fit = "–" if limit is None else ('<span class="ok">fits</span>' if r.peak <= limit else
                                         f'<span class="over">over by {_e(format_bytes(r.peak - limit))}</span>')
        bubble = _seconds(r.step.bubble) if r.step is not None else "–"
        # gradients kept in a bucketed sum's buckets are gradients (as the estimate's table shows them)
        shown = (r.parameters, r.gradients + r.grad_buckets, r.optimizer, r.buffers - r.grad_buckets,
                 r.activations, r.transient)
        out.append(_row((_e(r.device), *(_e(format_bytes(v)) for v in shown),
            f"<b>{_e(format_bytes(r.peak))}</b>", _e(bar.phase), fit, _seconds(r.step_time), bubble), nums=nums))
    return "<table>" + "".join(out) + "</table>"


def _step_lines(data: ReportData) -> str:
    """Each row's step time by the parts of the step-time model's formula, as `planlang estimate` prints it."""
    items = "".join(f"<li>{_e(r.device)}: {_e(r.step)}</li>" for r in data.estimates if r.step is not None)
    return f"<ul>{items}</ul>" if items else ""


def _stage_table(data: ReportData) -> str:
    p = data.plan.pipeline
    if p is None:
        return ""
    sched = data.schedule
    ranks = sched.simulated.ranks if sched else len(p.stages)
    # each stage's rank: s mod p, but for the V schedules' (zbv, dualpipev: stages r and 2p - 1 - r on rank r)
    placed = T.stage_ranks(sched.simulated.kind, ranks, sched.simulated.chunks) if sched else ()
    nums = (1, 4, 5)
    out = [_row(("stage", "rank", "modules", "sub-mesh degrees", "forward / microbatch", "backward / microbatch"),
                head=True, nums=nums)]
    for st in p.stages:
        f = _seconds(sched.forward[st.index]) if sched and st.index < len(sched.forward) else "–"
        b = _seconds(sched.backward[st.index]) if sched and st.index < len(sched.backward) else "–"
        degrees = ", ".join(f"{k} = {v}" for k, v in st.degrees) or "mesh sizes"
        rank = placed[st.index] if st.index < len(placed) else st.index % ranks
        out.append(_row((_e(st.index), _e(rank), "<code>" + _e(", ".join(map(str, st.modules))) + "</code>",
                         _e(degrees), f, b), nums=nums))
    return "<table>" + "".join(out) + "</table>"


def _image(stem: str, formats) -> str:
    shown = next((f for f in ("png", "svg") if f in formats), None)  # what an <img> can show
    links = " · ".join(f'<a href="{stem}.{f}">{f.upper()}</a>' for f in formats)
    img = f'<p><img src="{stem}.{shown}" alt="{_e(stem)} chart"></p>' if shown else ""
    return f'{img}<p class="muted">{"as " if shown else "chart: "}{links}</p>'


def render_page(data: ReportData, images: dict[str, str], formats) -> str:
    """The HTML text; `images` maps "memory"/"schedule" to the file stem written (absent: not drawn)."""
    title = f"planlang report: {data.name}"
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{_e(title)}</title>",
             f"<style>{STYLE}</style>\n</head>\n<body>", f"<h1>{_e(title)}</h1>",
             '<p class="muted">Estimated by <code>planlang estimate</code> from the model traced on the meta device; '
             "the step time and the pipeline schedule are its step-time model's.</p>",
             "<h2>Plan</h2>", _summary(data), "<h2>Peak memory per device</h2>"]
    if "memory" in images:
        parts.append(_image(images["memory"], formats))
    parts.append(_memory_table(data))
    parts.append('<p class="muted">Each bar is one device class of the estimate (every device of a pipeline stage '
                 "holds the same). Its segments are the classes present at the moment of the peak: parameters, "
                 "optimizer state and DDP gradient buckets always; then either the backward pass's saved activations "
                 "and transient tensors (gradients produced so far, temporaries, recomputation), or, when the "
                 "optimizer step is the higher point, all gradients plus the optimizer's temporaries. The table's "
                 "<i>transient</i> column is both transients together, as the estimator reports it. Its <i>step "
                 "time</i> is <code>planlang estimate</code>'s: compute, the collectives on the critical path, the "
                 "gradient sums and ZeRO's collectives that compute does not hide, and in a pipeline the "
                 "<i>bubble</i>, the device's idle time in the schedule, which the last column shows on its own.</p>")
    parts.append(_step_lines(data))
    parts.append("<h2>Pipeline schedule</h2>")
    sched = data.schedule
    if sched is not None and "schedule" in images:
        sim = sched.simulated
        parts.append(_image(images["schedule"], formats))
        parts.append(f"<p>Schedule span (every forward and backward of every microbatch): "
                     f"<b>{_e(_seconds(sim.makespan))}</b>; idle share of all ranks' time in it (the bubble): "
                     f"<b>{sim.bubble_ratio:.1%}</b>. A rank's step time is this span plus the gradient sums and "
                     "ZeRO's collectives that run after its last backward.</p>")
        parts.append('<p class="muted">Each stage\'s forward and backward of one microbatch are those of the step-time '
                     "model (planlang.model.price.step_time): its compute at the device's throughput, its collectives "
                     "on the critical path, ZeRO-3's gathers of its parameters; sends between stages are taken as "
                     "free.</p>")
    else:
        parts.append(f"<p>{_e(data.schedule_note or 'No schedule chart.')}</p>")
    parts.append(_stage_table(data))
    notes = sorted({n for r in data.estimates for n in r.notes})
    if notes:
        parts.append("<h2>Estimator notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>")
    if data.diagnostics:
        text = render(list(data.diagnostics), data.sources, "human")
        parts.append(f"<h2>Check findings</h2><pre>{_e(text)}</pre>")
    parts.append("</body>\n</html>\n")
    return "\n".join(parts)
