"""`planlang diff A.plan B.plan`: what changes from plan A to plan B, side by side.

    summarize(plan, text) -> PlanSide      the numbers of one validated plan (estimator + traffic model)
    compare(a, b)         -> PlanDiff      pure: rows of (A, B, B - A, B / A), the formatted texts' diff
    render_diff(d, con)                    rich tables on a console; `diff_json(d)` for --format json

What is compared, per device class (`planlang estimate`'s rows: "all devices", or one per stage):

    memory       parameters, gradients, optimizer, buffers, activations, transient, peak (bytes;
                 planlang.model.price.estimate's classes, unchanged)
    step time    the estimator's step seconds
    collectives  per (kind, mesh axes): calls, bytes each rank sends and the cost model's seconds for one
                 training step as planlang.model.price.step_time prices it (the lowered program's collectives
                 and ZeRO's, what `planlang lower --traffic` prints; a pipeline's busiest stage); a
                 pipeline that runs the model's own modules says why instead of numbers
    text         a unified diff of the two plans' canonical formatting (planlang.lang.fmt), so layout and
                 spelling do not show, only what the plans say differently

Device classes pair by name when both plans have the same ones; otherwise (a pipeline against no
pipeline, another stage count) the device with the largest peak of each plan is compared as "peak device".
ratio = B / A, None where A is 0 (JSON null, "new" in the table when B is not 0).
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from planlang.cost.comm import collective_time, group
from planlang.lang.fmt import FormatError, format_text
from planlang.plan.stage_meshes import heterogeneous, shape_plans, stage_shapes
from planlang.plan.units import format_bytes

MEMORY = ("parameters", "gradients", "optimizer", "buffers", "activations", "transient", "peak")
PEAK_DEVICE = "peak device"


@dataclass(frozen=True)
class Collectives:
    """One (kind, axes) group of a step's collectives: calls, bytes each rank sends, cost-model seconds."""

    calls: int = 0
    bytes: float = 0.0
    seconds: float = 0.0


@dataclass(frozen=True)
class PlanSide:
    """What `compare` needs of one plan: plain numbers, no torch."""

    path: str
    text: str  # the plan's canonical formatting
    memory: dict[str, dict[str, int]]  # device class -> memory class -> bytes (MEMORY order)
    step_time: dict[str, float]  # device class -> seconds
    collectives: dict[tuple[str, str], Collectives] | None  # (kind, "ax1,ax2") -> totals; None: not modelled
    traffic_note: str = ""  # why `collectives` is None

    def peak_device(self) -> str:
        return max(self.memory, key=lambda d: (self.memory[d]["peak"], d)) if self.memory else ""


@dataclass(frozen=True)
class Row:
    section: str  # "memory", "time", "collectives"
    device: str  # device class ("" for collectives)
    what: str  # memory class, "step", or "all-reduce[dp] bytes"
    unit: str  # "B", "s", "calls"
    a: float | None  # None: this side has no such row (a kind of collective only one plan issues)
    b: float | None

    @property
    def delta(self) -> float:
        return (self.b or 0) - (self.a or 0)

    @property
    def ratio(self) -> float | None:
        a, b = self.a or 0, self.b or 0
        if a == 0:
            return 1.0 if b == 0 else None
        return b / a

    def as_dict(self) -> dict:
        return {"section": self.section, "device": self.device, "what": self.what, "unit": self.unit,
                "a": self.a, "b": self.b, "delta": self.delta, "ratio": self.ratio}


@dataclass(frozen=True)
class PlanDiff:
    a: PlanSide
    b: PlanSide
    rows: tuple[Row, ...]
    text_diff: str  # unified diff of the canonical texts, "" when they are equal
    pairing: dict[str, tuple[str, str]] = field(default_factory=dict)  # row device -> (A's, B's device)
    notes: tuple[str, ...] = ()

    def row(self, section: str, what: str, device: str = "") -> Row:
        for r in self.rows:
            if r.section == section and r.what == what and (not device or r.device == device):
                return r
        raise KeyError((section, what, device))


# ------------------------------------------------------------------------------ pure comparison
def _pairs(a: PlanSide, b: PlanSide) -> dict[str, tuple[str, str]]:
    """Row label -> (A's device class, B's): the same names when both plans have the same classes, else
    each plan's device with the largest peak."""
    if list(a.memory) == list(b.memory) and a.memory:
        return {d: (d, d) for d in a.memory}
    return {PEAK_DEVICE: (a.peak_device(), b.peak_device())}


def text_diff(a: PlanSide, b: PlanSide) -> str:
    lines = difflib.unified_diff(a.text.splitlines(keepends=True), b.text.splitlines(keepends=True),
                                 fromfile=a.path, tofile=b.path)
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def compare(a: PlanSide, b: PlanSide) -> PlanDiff:
    """Plan A against plan B: memory by class and step time per device class, collectives per (kind, axes),
    and the unified diff of the formatted texts."""
    pairs = _pairs(a, b)
    rows: list[Row] = []
    for label, (da, db) in pairs.items():
        ma, mb = a.memory.get(da, {}), b.memory.get(db, {})
        rows += [Row("memory", label, k, "B", ma.get(k), mb.get(k)) for k in MEMORY]
    for label, (da, db) in pairs.items():
        rows.append(Row("time", label, "step", "s", a.step_time.get(da), b.step_time.get(db)))
    notes = []
    if a.collectives is not None and b.collectives is not None:
        keys = sorted(set(a.collectives) | set(b.collectives))
        for key in keys:
            ca, cb = a.collectives.get(key), b.collectives.get(key)
            name = f"{key[0]}[{key[1]}]"
            for what, unit in (("calls", "calls"), ("bytes", "B"), ("seconds", "s")):
                rows.append(Row("collectives", "", f"{name} {what}", unit,
                                None if ca is None else getattr(ca, what), None if cb is None else getattr(cb, what)))
        for what, unit in (("calls", "calls"), ("bytes", "B"), ("seconds", "s")):
            rows.append(Row("collectives", "", f"total {what}", unit,
                            sum(getattr(c, what) for c in a.collectives.values()),
                            sum(getattr(c, what) for c in b.collectives.values())))
    for side, name in ((a, "A"), (b, "B")):
        if side.collectives is None:
            notes.append(f"collectives not compared: plan {name} ({side.path}): {side.traffic_note}")
    if PEAK_DEVICE in pairs:
        da, db = pairs[PEAK_DEVICE]
        notes.append(f"the plans have different device classes ({', '.join(a.memory) or 'none'} against "
                     f"{', '.join(b.memory) or 'none'}); compared: each plan's device with the largest peak "
                     f"(A: {da}, B: {db})")
    return PlanDiff(a, b, tuple(rows), text_diff(a, b), pairs, tuple(notes))


# ------------------------------------------------------------------------------ output
def _value(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "B":
        return format_bytes(v)
    if unit == "s":
        return f"{v * 1e3:.3f} ms"
    return f"{v:g}"


def _delta(r: Row) -> str:
    d = r.delta
    if d == 0:
        return "0"
    sign = "+" if d > 0 else "-"
    return sign + _value(abs(d), r.unit)


def _ratio(r: Row) -> str:
    q = r.ratio
    if q is None:
        return "new"
    return f"{q:.3f}x"


def _style(r: Row) -> str:
    """Less memory, time or traffic is better: green; more is red."""
    if r.delta == 0:
        return "dim"
    return "green" if r.delta < 0 else "red"


def diff_json(d: PlanDiff) -> dict:
    return {
        "a": d.a.path,
        "b": d.b.path,
        "devices": {label: {"a": da, "b": db} for label, (da, db) in d.pairing.items()},
        "rows": [r.as_dict() for r in d.rows],
        "collectives_note": {"a": d.a.traffic_note, "b": d.b.traffic_note},
        "notes": list(d.notes),
        "text_diff": d.text_diff,
    }


def render_diff(d: PlanDiff, console) -> None:
    """Tables (memory and step time per device class, collectives per kind and axes), notes, then the
    unified diff of the formatted plans, on a rich Console."""
    # lazy: rich loads only when a table is printed
    from rich.table import Table
    from rich.text import Text

    def table(title: str, rows: list[Row], first: str, label) -> Table:
        # every cell a Text: plan paths and `kind[axes]` are not rich markup
        t = Table(title=Text(title), title_justify="left", show_edge=False, pad_edge=False)
        t.add_column(Text(first))
        for head in (f"A {d.a.path}", f"B {d.b.path}", "B - A", "B / A"):
            t.add_column(Text(head), justify="right", overflow="fold")
        for r in rows:
            t.add_row(*(Text(c) for c in (label(r), _value(r.a, r.unit), _value(r.b, r.unit), _delta(r), _ratio(r))),
                      style=_style(r))
        return t

    for label in d.pairing:
        rows = [r for r in d.rows if r.device == label and r.section in ("memory", "time")]
        console.print(table(f"memory and step time per device ({label})", rows, "class", lambda r: r.what))
        console.print()
    coll = [r for r in d.rows if r.section == "collectives"]
    if coll:
        console.print(table("collectives per training step (sent per rank, cost-model time)", coll,
                            "kind[axes]", lambda r: r.what))
        console.print()
    for n in d.notes:
        console.print(Text(f"note: {n}"), soft_wrap=True)
    if not d.text_diff:
        console.print(Text("the formatted plans are identical"), soft_wrap=True)
        return
    console.print(Text("plan text (formatted):", style="bold"))
    for line in d.text_diff.splitlines():
        style = "green" if line.startswith("+") and not line.startswith("+++") else \
            "red" if line.startswith("-") and not line.startswith("---") else \
            "cyan" if line.startswith("@@") else ""
        console.print(Text(line, style=style), soft_wrap=True, highlight=False)


# ------------------------------------------------------------------------------ one plan's numbers
def summarize(plan, text: str, path: str, rows=None, traffic=None) -> PlanSide:
    """The numbers of one validated, complete plan (planlang.plan.complete.CompletePlan): the estimator's
    rows and the predicted traffic of one step. `text` is the plan file's text (formatted here). `rows`
    and `traffic`: what validation computed (planlang.model.validation.Validated's estimate and traffic),
    so the plan is neither estimated nor lowered again; computed here without them."""
    if rows is None:
        # lazy: torch loads only when this runs
        from planlang.model.price.estimate import estimate_plan
        from planlang.runtime.program_memory import measure

        rows = estimate_plan(plan, program=measure)
    try:
        formatted = format_text(text, path)
    except FormatError:  # validated plans parse; keep the text as written if formatting still fails
        formatted = text
    collectives, note = step_collectives(plan, traffic)
    return PlanSide(path, formatted, {r.device: {k: int(getattr(r, k)) for k in MEMORY} for r in rows},
                    {r.device: float(r.step_time) for r in rows}, collectives, note)


def step_collectives(plan, lowered=None) -> tuple[dict[tuple[str, str], Collectives] | None, str]:
    """Per (kind, axes): calls, bytes sent per rank and cost-model seconds of one step as the step-time
    model prices it (planlang.model.price.step_time.lowered_traffic: the lowered program's collectives and
    ZeRO's; a pipeline's busiest stage, each stage on its own sizes when it has degrees of its own), or
    (None, why). `lowered`: those collectives when validation computed them (lowered here otherwise)."""
    # lazy: torch loads only when this runs
    from planlang.model.price.step_time import lowered_traffic
    from planlang.model.price.traffic import unsupported

    why = unsupported(plan)
    if why:
        return None, why
    # (stage traffic, the mesh it runs on): stages of their own degrees each on its own sizes, from its
    # shape's program (planlang.model.price.stage_meshes; `lowered` then a dict by stage sizes)
    shapes = shape_plans(plan) if heterogeneous(plan) else {None: plan}
    stages = []
    try:
        for sizes, sp in shapes.items():
            if isinstance(lowered, dict):
                got = lowered[sizes] if sizes in lowered else lowered_traffic(sp)
            else:
                got = lowered if lowered is not None else lowered_traffic(sp)
            if got is not None:
                stages += [(st, sp.mesh) for s, st in enumerate(got)
                           if sizes is None or stage_shapes(plan)[s] == sizes]
    except ValueError as err:
        return None, str(err)
    if not stages:  # no program (`unsupported` says which plans): nothing lowered to count
        return None, "the plan has no lowered program to count collectives in"

    def seconds(t, mesh) -> float:
        return collective_time(t.kind, group(mesh, t.axes), t.full_bytes)

    traffic, mesh = max(stages, key=lambda st: sum(seconds(t, st[1]) for t in st[0].transfers))
    out: dict[tuple[str, str], Collectives] = {}
    for t in traffic.transfers:
        key = (t.kind.value, ",".join(t.axes))
        c = out.get(key, Collectives())
        out[key] = Collectives(c.calls + 1, c.bytes + t.bytes,
                               c.seconds + seconds(t, mesh))
    return out, ""
