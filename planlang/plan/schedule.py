"""Microbatches in flight, defined once: how many microbatches' activations a pipeline stage holds at
its peak under a schedule, for the estimator and the stage partitioners of the solver."""
from __future__ import annotations

from .types import SCHEDULES


def in_flight(schedule: str, stages: int, stage: int, microbatches: int, *, chunks: int = 1, extra: int = 0) -> int:
    """Microbatches whose activations stage `stage` (0-based) of `stages` holds at once.

    GPipe runs every forward before any backward: all m. 1F1B (PipeDream-Flush, Narayanan et al. 2021,
    §2.2) warms stage i up with p − i forwards before its first backward and then alternates: min(p − i,
    m). Interleaved 1F1B with v `chunks` per rank (§2.2.1) warms up further: min(p + (p − 1 − i) // v, m).
    `extra` adds microbatches at the peak (torch.distributed.pipelining's Schedule1F1B runs the next
    forward before the backward that frees one)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule {schedule!r}: choose one of {', '.join(SCHEDULES)}")
    if not 0 <= stage < stages or microbatches < 1:
        raise ValueError(f"stage {stage} of {stages} with {microbatches} microbatches is out of range")
    if schedule == "gpipe":
        return microbatches
    if schedule == "interleaved":
        return min(stages + (stages - 1 - stage) // max(1, chunks) + extra, microbatches)
    return min(stages - stage + extra, microbatches)
