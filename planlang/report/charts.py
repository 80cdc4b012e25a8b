"""The report's two charts, drawn with matplotlib's object API on the Agg canvas (no pyplot, so no global
backend is chosen for the caller). matplotlib is imported when a chart is drawn, not with the package.
"""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planlang.plan.units import format_bytes
from planlang.plan.types import SPLIT_BACKWARD, stages_on

from .memory import CLASSES, MemoryBar
from planlang.cost.schedule import SimulatedSchedule, closed_form_bubble

if TYPE_CHECKING:  # types only: matplotlib loads when a chart is drawn
    from matplotlib.typing import RcKeyType

COLORS = dict(zip(CLASSES, ("#4c72b0", "#8172b3", "#c44e52", "#937860", "#55a868", "#a6d4a0", "#dd8452", "#f2c09a",
                            "#e8b07a")))
# forward in blues, backward in oranges, a split backward's weight gradient (zero_bubble's W) in greens;
# one shade per chunk of a chunked schedule. A whole backward beside split ones (dualpipev's BW: input and
# weight gradients in one) takes the backward's shade, hatched to tell it from an input gradient B
FORWARD_SHADES = ("#3b6fb6", "#7fa6dc", "#b5cdee", "#1f3f6e")
BACKWARD_SHADES = ("#d9692b", "#f0a56f", "#f7cfae", "#8a3a10")
WEIGHT_SHADES = ("#3f8f54", "#8cc792", "#c5e6c8", "#1e5130")
SHADES = {"F": FORWARD_SHADES, "B": BACKWARD_SHADES, "W": WEIGHT_SHADES, "BW": BACKWARD_SHADES}  # by a box's kind
HATCHES = {"BW": "//"}  # by a box's kind; the others are plain
KINDS = ("F", "B", "W", "BW")  # the order of the legend
BUDGET_COLOR = "#c0392b"
LIGHT = {"backward transient", "optimizer-step temporaries", "step transient"}  # light segments take dark numbers
BREAK_BELOW = 0.4  # break the y axis when every peak is below this share of the budget
# fixed SVG ids and no date, so that a report written twice is byte-for-byte the same
RC: dict[RcKeyType, Any] = {"svg.fonttype": "none", "svg.hashsalt": "planlang-report", "font.size": 10}


def _save(fig, base: Path, formats) -> list[Path]:
    # lazy: matplotlib loads only when a chart is drawn
    import matplotlib

    out = []
    with matplotlib.rc_context(RC):
        for fmt in formats:
            path = base.with_suffix("." + fmt)
            meta = {"svg": {"Date": None}, "pdf": {"CreationDate": None}}.get(fmt, {})
            fig.savefig(path, format=fmt, dpi=110, metadata=meta)
            out.append(path)
    return out


def _unit(nbytes: float) -> tuple[str, float]:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= scale:
            return unit, scale
    return "B", 1


def draw_memory(bars: tuple[MemoryBar, ...], limit: int | None, limit_label: str, title: str,
                base: Path, formats, tick_labels: list[str] | None = None, note: str = "") -> list[Path]:
    """Stacked bars of each device class's peak by memory class, with the budget as a horizontal line.

    When every peak is far below the budget the y axis is broken: a short upper panel carries the
    budget line, and the bars keep the rest of the height, so their segments stay readable."""
    # lazy: matplotlib loads only when a chart is drawn
    import matplotlib
    from matplotlib.figure import Figure

    highest = max(b.peak for b in bars)
    lim = limit or 0  # 0: no line to draw
    broken = bool(lim) and highest < BREAK_BELOW * lim
    unit, scale = _unit(highest if broken or not lim else max(highest, lim))
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(max(6.5, 4.2 + 1.5 * len(bars)), 5.4), layout="constrained")
        if broken:
            grid = fig.add_gridspec(2, 1, height_ratios=(1, 6))
            top_ax = fig.add_subplot(grid[0])
            ax = fig.add_subplot(grid[1], sharex=top_ax)
        else:
            top_ax = ax = fig.add_subplot()
        ymax = (highest * 1.38 if broken or not lim else max(highest * 1.3, lim * 1.15)) / scale
        used: list[str] = []
        for x, bar in enumerate(bars):
            bottom = 0.0
            for name, nbytes in bar.segments:
                h = nbytes / scale
                if nbytes <= 0:
                    continue
                ax.bar(x, h, 0.6, bottom=bottom, color=COLORS[name], edgecolor="white", linewidth=0.6,
                       label=name if name not in used else None)
                used.append(name)
                if h >= 0.045 * ymax:  # label a segment only where the text fits inside it
                    ax.text(x, bottom + h / 2, f"{h:.3g}", ha="center", va="center", fontsize=8.5,
                            color="#222222" if name in LIGHT else "white")
                bottom += h
            share = f"\n{bar.peak / lim:.0%} of {limit_label}" if lim else ""
            over = bool(lim) and bar.peak > lim
            ax.text(x, bottom + 0.012 * ymax, f"{format_bytes(bar.peak)}{share}\npeak in {bar.phase}",
                    ha="center", va="bottom", fontsize=8.5, color=BUDGET_COLOR if over else "#222222")
        ax.set_ylim(0, ymax)
        if lim:
            top_ax.axhline(lim / scale, color=BUDGET_COLOR, linestyle="--", linewidth=1.4,
                           label=f"{limit_label}: {format_bytes(lim)}")
        if broken:
            top_ax.set_ylim(lim / scale * 0.9, lim / scale * 1.08)
            top_ax.set_yticks([lim / scale])
            top_ax.tick_params(bottom=False, labelbottom=False)
            top_ax.spines[["bottom", "top", "right"]].set_visible(False)
            ax.spines["top"].set_visible(False)
            # the usual break marks: a slash at each end of the cut in the y axis
            marks: dict[str, Any] = dict(marker=[(-1, -0.5), (1, 0.5)], markersize=10, linestyle="none", color="k", mec="k",
                         mew=1, clip_on=False)
            top_ax.plot([0], [0], transform=top_ax.transAxes, **marks)
            ax.plot([0], [1], transform=ax.transAxes, **marks)
        ax.set_xticks(range(len(bars)), tick_labels or [b.device for b in bars])
        ax.set_xlim(-0.6, len(bars) - 0.4)
        ax.set_ylabel(f"memory per device ({unit})")
        top_ax.set_title(textwrap.fill(title, 60))
        if note:
            ax.set_xlabel(textwrap.fill(note, 80), fontsize=9, color="#555555")
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        ax.spines[["top", "right"]].set_visible(False)
        handles, labels = ax.get_legend_handles_labels()
        if broken:
            h2, l2 = top_ax.get_legend_handles_labels()
            handles, labels = handles + h2, labels + l2
        order = sorted(range(len(labels)), key=lambda i: (CLASSES + (labels[i],)).index(labels[i]), reverse=True)
        fig.legend([handles[i] for i in order], [labels[i] for i in order], loc="outside right upper",
                   frameon=False, title="memory class")
    return _save(fig, base, formats)


def _time_unit(span: float) -> tuple[str, str, float]:
    """(axis label, unit, factor from seconds) for a step of `span` seconds."""
    for unit, k in (("s", 1.0), ("ms", 1e3), ("µs", 1e6)):
        if span * k >= 2:
            return f"time ({unit})", unit, k
    return "time (ns)", "ns", 1e9


def draw_schedule(sim: SimulatedSchedule, title: str, base: Path, formats) -> list[Path]:
    """One row per pipeline rank; a box per forward and backward of a microbatch, numbered, over time
    (under a split backward, zero_bubble, zbv and dualpipev, a box per input gradient B and weight gradient
    W, and dualpipev's whole backwards BW hatched in the backward's shade)."""
    # lazy: matplotlib loads only when a chart is drawn
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    p, v = sim.ranks, sim.chunks
    label, unit, k = _time_unit(sim.makespan)
    with matplotlib.rc_context(RC):
        width = 12.0
        fig = Figure(figsize=(width, 2.3 + 0.55 * p), layout="constrained")
        ax = fig.add_subplot()
        axis_points = width * 0.85 * 72  # roughly the axis width in points, to decide where numbers fit
        for b in sim.boxes:
            if b.end <= b.start:  # takes no time (zero_bubble's B on the model's first stage: all of it is W)
                continue
            shades = SHADES[b.kind]
            x0, w = b.start * k, (b.end - b.start) * k
            ax.broken_barh([(x0, w)], (b.rank - 0.38, 0.76), facecolors=shades[b.chunk % len(shades)],
                           edgecolor="white", linewidth=0.5, hatch=HATCHES.get(b.kind))
            text = str(b.microbatch)
            if (b.end - b.start) / sim.makespan * axis_points >= 7 * len(text) + 3:
                dark = b.chunk % len(shades) in (0, 3)
                ax.text(x0 + w / 2, b.rank, text, ha="center", va="center", fontsize=8,
                        color="white" if dark else "#222222")
        ax.set_ylim(p - 0.5, -0.5)  # rank 0 on top
        ax.set_xlim(0, sim.makespan * k)
        if v > 1:  # a rank's stages by chunk: r, r + p, ... looped; r and 2p − 1 − r in a V (zbv, dualpipev)
            ticks = [f"rank {r}\n(stages " + ", ".join(map(str, stages_on(sim.kind, p, v, r))) + ")" for r in range(p)]
        else:
            ticks = [f"stage {r}" for r in range(p)]
        ax.set_yticks(range(p), ticks)
        ax.set_xlabel(label)
        fig.suptitle(title)
        ax.spines[["top", "right"]].set_visible(False)
        reference = closed_form_bubble(sim.kind, p, sim.microbatches, v)
        split = sim.kind in SPLIT_BACKWARD
        # dualpipev's: (p − 1)/(3m + p − 1) over its two stages per rank (planlang.cost.schedule.closed_form_bubble)
        formula = f"({'3·' if split else ''}{'v·' if v > 1 and sim.kind != 'dualpipev' else ''}m+p−1)"
        equal = "equal stage times, backward = 2 × forward," if split else "equal stage times"
        closed = (f"{equal} would give (p−1)/{formula} = {reference:.1%}" if reference == reference
                  else "no closed form at these microbatches")  # (NaN: zbv with m < 2p − 1)
        ax.set_title(f"bubble (idle share of the span): {sim.bubble_ratio:.1%}    ·    {closed}    ·    "
                     f"span {sim.makespan * k:.4g} {unit}", loc="left", fontsize=9.5, color="#333333")
        names = {"F": "forward", "B": "input gradient (B)" if split else "backward", "W": "weight gradient (W)",
                 "BW": "whole backward (B+W)"}
        drawn = {b.kind for b in sim.boxes if b.end > b.start}
        kinds = [kind for kind in KINDS if kind in drawn]

        def patch(kind: str, c: int, label: str):
            return Patch(facecolor=SHADES[kind][c % 4], edgecolor="white", hatch=HATCHES.get(kind), label=label)
        if v > 1:
            handles = [patch(kind, c, f"{names[kind]}, chunk {c}") for kind in kinds for c in range(v)]
        else:
            handles = [patch(kind, 0, names[kind]) for kind in kinds]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False,
                  title="numbers: microbatch")
    return _save(fig, base, formats)
