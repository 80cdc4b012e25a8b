"""The pipeline schedules planlang knows and where each places its model stages on the pipeline ranks:
the one definition (planlang.plan.types re-exports it; planlang.plan.schedule orders the operations).
Imports nothing of planlang, so that every layer may read it."""
from __future__ import annotations

SCHEDULES = ("gpipe", "1f1b", "interleaved", "looped_bfs", "zero_bubble", "zbv", "dualpipev")
#: the schedules that hold `chunks` model stages on each pipeline rank: model stage s on rank s mod p, but for
#: the V-shaped ones (`stage_ranks`)
CHUNKED = ("interleaved", "looped_bfs", "zero_bubble", "zbv", "dualpipev")
#: the schedules that split a backward into the input gradient ("B") and the weight gradient ("W", later);
#: dualpipev runs some backwards whole ("BW", planlang.plan.schedule.Step)
SPLIT_BACKWARD = ("zero_bubble", "zbv", "dualpipev")
#: the V-shaped schedules: exactly two model stages per rank, rank r holding stages r and 2p - 1 - r
#: (torch's generate_stage_to_rank_mapping(style="v"); Qi et al. 2024 §6)
V_SHAPED = ("zbv", "dualpipev")
#: the fewest `chunks` a chunked schedule takes: zero bubble runs one stage per rank too (ZB-H1); the V
#: shapes take exactly 2 (`chunks 2`, so that `Schedule.chunks` is the stages per rank everywhere)
MIN_CHUNKS = {"interleaved": 2, "looped_bfs": 2, "zero_bubble": 1, "zbv": 2, "dualpipev": 2}


def stages_per_rank(kind: str, chunks: int) -> int:
    """Model stages one pipeline rank holds under `kind`: `chunks` for a chunked schedule (2 for a V-shaped
    one, whatever `chunks` says), else 1."""
    if kind in V_SHAPED:
        return 2
    return chunks if kind in CHUNKED else 1


def stage_ranks(kind: str, ranks: int, chunks: int = 1) -> tuple[int, ...]:
    """The pipeline rank of each model stage (p·v of them, v = stages_per_rank(kind, chunks)): the one
    definition of where a schedule places its stages.

    Looped placements (every schedule but the V shapes: gpipe and 1f1b with v = 1): model stage s on rank
    s mod p, chunk s // p of it. V shapes (zbv, dualpipev; v = 2): stage s < p on rank s, stage s >= p on
    rank 2p − 1 − s, so rank r holds stages r (its chunk 0) and 2p − 1 − r (its chunk 1) and the last rank
    holds the adjacent stages p − 1 and p (torch hands that activation over locally). Under both, model
    stage s is chunk s // p of its rank (`stages_on` lists a rank's stages by chunk).

    For the runtime and the estimate: wherever a rank's stages are taken as `parts[r::p]` or a stage's rank
    as `s % p`, read `stages_on(kind, p, chunks, r)` and `stage_ranks(kind, p, chunks)[s]` instead."""
    v = stages_per_rank(kind, chunks)
    if kind in V_SHAPED:
        return tuple(range(ranks)) + tuple(reversed(range(ranks)))
    return tuple(s % ranks for s in range(ranks * v))


def stages_on(kind: str, ranks: int, chunks: int, rank: int) -> tuple[int, ...]:
    """The model stages pipeline rank `rank` holds under `kind`, chunk by chunk (chunk c first at index c):
    (rank, rank + p, ...) looped, (rank, 2p − 1 − rank) V-shaped (`stage_ranks`)."""
    placed = stage_ranks(kind, ranks, chunks)
    return tuple(s for s in range(len(placed)) if placed[s] == rank)
