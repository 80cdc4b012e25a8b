"""A model's simulated step and profile from runs of its first few blocks (issue #29; planlang.model.capture.fold).

The model runs cut to each of `FOLD_RUNS` block counts (3 and 4). What it measured is moved to the model's N
blocks by the block each figure belongs to:

* block 0 and the last block are themselves at every count; an interior block i of N is the 4-block run's
  block 1 renamed. A figure of the root code (the embedding, the head, the loss) or of the model as a whole
  (a parent's parameter count, the saved activations, the gradients) is affine in the block count;
* the live bytes of each part of the step (`simulate.StepMemory.segments`: block i's forward, its backward,
  the root code around them), in each phase (forward, backward, the accumulated pass's), are affine in the
  block count and in i: while block i runs, the activations of the blocks before it are live, and in
  backward the gradients of those after it. A peak over the step is the largest of the extrapolated parts'
  (its part can move with N: not the runs' peaks extrapolated).

Anything the runs do not bear out (a different order of modules, an interior block unlike another, a
figure of the whole step that is not the largest of its parts') raises FoldError: the caller runs the
whole model. tests/model/test_fold_estimate.py compares both, field for field.
"""
from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass, fields, replace
from typing import Iterator

import torch

from planlang.model.capture.fold import FOLD_RUNS, Fold, FoldError, affine, truncated
from planlang.model.capture.profile import ModuleProfile, Profile, profile_model
from planlang.model.capture.simulate import StepMemory, simulate_step

ENABLED = True  # False: every consumer runs the whole model (the tests compare both)
# fewer blocks run whole: runs of 3 and 4 blocks, each with the root code, cost about as much as 9 blocks
# once (GPT-2 small, 12 blocks: 0.19 CPU-s folded against 0.22 whole; Llama-3-8B, 32: 2.25 against 9.0)
FOLD_FROM = 10
# the latest local models' runs: (the fold, None) when folded, (None, why not) when run whole
LOG: deque[tuple[Fold | None, str | None]] = deque(maxlen=64)


@dataclass(frozen=True)
class FoldedRun:
    """What the truncated runs give the estimate, moved to the model's N blocks."""

    sim: StepMemory | None
    profile: Profile | None
    trained: frozenset[str]  # parameters that got a gradient


def run_folded(module: torch.nn.Module, fold: Fold, inputs: dict, loss, *, simulate: bool, profile: bool,
               accumulate: bool = False, blocks: tuple[str, ...] = ()) -> FoldedRun:
    """`simulate_step` (with `accumulate`, `blocks`: the whole model's arguments; no stages) and
    `profile_model` of `module` as they would come out for all of its `fold.count` blocks, from runs of
    the first FOLD_RUNS of them. FoldError when they cannot be extrapolated."""
    every = tuple(fold.block(i) for i in range(fold.count))
    if blocks not in ((), every):
        raise FoldError("the step's blocks are not the folded list's")
    sims: dict[int, tuple[StepMemory, dict]] = {}
    profs: dict[int, Profile] = {}
    trained: dict[int, frozenset[str]] = {}
    holder = module.get_submodule(fold.container) if fold.container else module
    entries = list(holder._modules.values())
    for k in FOLD_RUNS:
        with truncated(module, fold, k) as calls, _cut_off(entries[k:]):
            if simulate:
                phases: dict = {}
                sims[k] = simulate_step(module, inputs, loss, None, accumulate=accumulate, blocks=every[:k],
                                        phases=phases), phases
                calls.check()
            if profile:
                profs[k] = profile_model(module, inputs, loss)
                calls.check()
            trained[k] = frozenset(n for n, p in module.named_parameters(remove_duplicate=False)
                                   if p.grad is not None)
    for p in module.parameters():
        p.grad = None  # what the runs left on the kept blocks (the caller reads `trained`, not .grad)
    n = fold.count
    return FoldedRun(_step_memory(sims, n, bool(blocks), accumulate) if simulate else None,
                     _profile(profs, fold) if profile else None,
                     frozenset(_names(trained, fold)))


@contextlib.contextmanager
def _cut_off(blocks: list) -> Iterator[None]:
    """FoldError if a module of `blocks` (those a truncated run left out) runs: code that holds on to them
    (a checkpoint chain's closure over every block's forward) would run them all in the cut model."""
    ran: list[str] = []
    handles = [m.register_forward_pre_hook(lambda mod, _a: ran.append(type(mod).__name__))
               for b in blocks if b is not None for m in b.modules()]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
    if ran:
        raise FoldError(f"a block the run left out ran ({ran[0]}): the model holds on to its blocks")


# ------------------------------------------------------------------ places of blocks
def _place(i: int, k: int) -> tuple[str, int]:
    """Where block index `i` of a `k`-block run sits: before the blocks ("pre", i < 0), after them ("post",
    offset from k), the first, the last, or an interior one ("mid", offset from 1)."""
    if i < 0:
        return "pre", i
    if i >= k:
        return "post", i - k
    if i == 0:
        return "first", 0
    if i == k - 1:
        return "last", 0
    return "mid", i - 1


def _index(place: tuple[str, int], n: int) -> int:
    """The block index at `n` blocks of a place other than an interior block's."""
    kind, off = place
    return {"pre": off, "post": n + off, "first": 0, "last": n - 1}[kind]


def _spread(runs: dict[int, dict[tuple, int]], n: int) -> dict[tuple, int]:
    """Figures keyed (family, block index) in each run (count -> figures) at `n` blocks: affine in the count
    at each place, and an interior block's affine in its index too (its slope from the larger run's two
    interior blocks: the runs are FOLD_RUNS, 3 and 4 blocks)."""
    k1, k2 = sorted(runs)
    if (k1, k2) != (3, 4):
        raise FoldError(f"runs of {k1} and {k2} blocks cannot place the interior ones")
    placed: dict[int, dict[tuple, int]] = {}
    for k, got in runs.items():
        placed[k] = {(fam, _place(i, k)): v for (fam, i), v in got.items()}
    mids1 = {key for key in placed[k2] if key[1] == ("mid", 1)}
    if {key for key in placed[k1]} != {key for key in placed[k2]} - mids1 \
            or {(fam, ("mid", 0)) for fam, _ in mids1} != {key for key in placed[k2] if key[1] == ("mid", 0)}:
        raise FoldError("the runs measured different parts")
    out: dict[tuple, int] = {}
    for (fam, place), v2 in placed[k2].items():
        if place == ("mid", 1):
            continue
        at_count = affine({k1: placed[k1][fam, place], k2: v2}, n)
        if place[0] != "mid":
            out[fam, _index(place, n)] = at_count
            continue
        step = placed[k2][fam, ("mid", 1)] - v2  # per interior block further on, at a fixed count
        for i in range(1, n - 1):
            out[fam, i] = at_count + step * (i - 1)
    return out


# ------------------------------------------------------------------ the simulated step
_TOTALS = ("saved", "grads", "output")


def _step_memory(sims: dict[int, tuple[StepMemory, dict]], n: int, with_blocks: bool,
                 accumulate: bool) -> StepMemory:
    peaks: dict[int, dict[tuple, int]] = {}
    starts: dict[int, dict[tuple, int]] = {}
    block_grads: dict[int, dict[tuple, int]] = {}
    for k, (sim, phases) in sims.items():
        _check_run(sim, phases)
        _check_interior(sim, phases, k)
        # a part ("F", i) of phase p is the family (p, "F") at block i; the phases' starts are root figures
        peaks[k] = {((p, seg[0]), seg[1]): v for (p, seg), v in phases["peak"].items()}
        peaks[k].update({(("start", p), -1): v for p, v in phases["start"].items()})
        starts[k] = {(seg[0], seg[1]): v for seg, v in sim.segment_starts.items()}
        block_grads[k] = {("g", i): v for i, v in enumerate(sim.block_grads)}
    at = _spread(peaks, n)
    first = sims[min(sims)][0]

    def most(phase: int) -> int:
        return max([v for ((p, _), _i), v in at.items() if p == phase] + [at[("start", phase), -1]])

    totals = {f: affine({k: getattr(s, f) for k, (s, _) in sims.items()}, n) for f in _TOTALS}
    forward, backward = most(0), most(1)
    accum = most(3) if accumulate else 0
    segments: dict[tuple, int] = {}
    for ((p, kind), i), v in at.items():
        if p in (0, 1):
            segments[kind, i] = max(segments.get((kind, i), 0), v)
    grads = _spread(block_grads, n)
    return replace(
        first, **totals, forward_peak=forward, backward_peak=backward, backward_peak_accum=accum,
        stage_saved=_whole(first.stage_saved, totals["saved"]),
        stage_backward_peak=_whole(first.stage_backward_peak, backward),
        stage_backward_peak_accum=_whole(first.stage_backward_peak_accum, accum),
        stage_grads=_whole(first.stage_grads, totals["grads"]),
        segments=segments if with_blocks else {},
        segment_starts=_spread(starts, n) if with_blocks else {},
        block_grads=tuple(grads["g", i] for i in range(n)) if with_blocks else ())


def _check_run(sim: StepMemory, phases: dict) -> None:
    """FoldError unless the run's figures of the whole step are what its parts make them: the peaks the
    largest of their phase's parts', the per-owner dicts (no stages: one owner) the totals."""
    def most(phase: int) -> int:
        return max([v for (p, _), v in phases["peak"].items() if p == phase] + [phases["start"].get(phase, 0)])

    want = {"forward_peak": most(0), "backward_peak": most(1),
            "backward_peak_accum": most(3) if 3 in phases["start"] else 0}
    if any(getattr(sim, f) != v for f, v in want.items()):
        raise FoldError(f"a peak of the step is not its parts': {want} against the run's")
    for d, total in ((sim.stage_saved, sim.saved), (sim.stage_backward_peak, sim.backward_peak),
                     (sim.stage_backward_peak_accum, sim.backward_peak_accum), (sim.stage_grads, sim.grads)):
        if d and d != {None: total}:
            raise FoldError("the step's bytes have owners other than the whole model")


def _check_interior(sim: StepMemory, phases: dict, k: int) -> None:
    """FoldError unless the run's interior blocks (1 .. k-2) are alike: in each phase each leaves as many
    bytes behind (the live bytes when each next part is entered step by one amount), each of their parts
    peaks as far above the same part of the block before as its entry is, and their gradients are of one
    size. (The extrapolation of an interior block's parts rests on these.)"""
    entered, peaks = phases["entered"], phases["peak"]
    for p in sorted({p for p, _ in entered}):
        for kind, order in (("F", range(1, k)), ("B", range(k - 2, -1, -1))):
            if any((p, (kind, i)) not in entered for i in order):
                continue
            vals = [entered[p, (kind, i)] for i in order]
            if len({b - a for a, b in zip(vals, vals[1:])}) > 1:
                raise FoldError(f"the interior blocks leave different bytes behind ({kind} in phase {p}: {vals})")
    for (p, (kind, i)), v in peaks.items():
        a, b = (p, (kind, i)), (p, (kind, i + 1))
        if 1 <= i < k - 2 and b in peaks and a in entered and b in entered \
                and peaks[b] - v != entered[b] - entered[a]:
            raise FoldError(f"the interior blocks' {kind} parts peak unalike in phase {p}")
    if len(set(sim.block_grads[1:k - 1])) > 1:
        raise FoldError(f"the interior blocks' gradients differ: {sim.block_grads}")


def _whole(d: dict, total: int) -> dict:
    return {None: total} if d else {}


# ------------------------------------------------------------------ the profile
_SUMMED = ("params", "param_bytes", "fwd_flops", "bwd_flops", "fwd_bytes", "bwd_bytes", "saved_bytes", "out_bytes", "grad_in_bytes", "calls")


def _runs_of(names: list[str], fold: Fold) -> list[tuple[int | None, list[str]]]:
    """`names` as runs of consecutive names of one block (None: outside the blocks)."""
    out: list[tuple[int | None, list[str]]] = []
    for name in names:
        got = fold.split(name)
        i = got[0] if got is not None else None
        if out and out[-1][0] == i:
            out[-1][1].append(name)
        else:
            out.append((i, [name]))
    return out


def _order(names: list[str], fold: Fold, k: int, n: int) -> list[tuple[str, str]]:
    """The modules of a `k`-block run's profile (`names`, in execution order) in a run of `n` blocks:
    (name at n, name in the run it is measured by). The interior blocks of the run must come one after
    another, each as the first does."""
    runs = _runs_of(names, fold)
    out: list[tuple[str, str]] = []
    j = 0
    while j < len(runs):
        i, run = runs[j]
        if i is None or i == 0 or i == k - 1:
            target = None if i is None else (0 if i == 0 else n - 1)
            out += [(fold.rename(m, target) if target is not None else m, m) for m in run]
            j += 1
            continue
        if i != 1 or j + k - 3 >= len(runs):
            raise FoldError("the interior blocks' modules do not run one block after another")
        for step in range(1, k - 2):
            other, later = runs[j + step]
            if other != 1 + step or later != [fold.rename(m, other) for m in run]:
                raise FoldError("the interior blocks' modules do not run one block after another")
        out += [(fold.rename(m, t), m) for t in range(1, n - 1) for m in run]
        j += k - 2
    return out


def _profile(profs: dict[int, Profile], fold: Fold) -> Profile:
    (k1, p1), (k2, p2) = sorted(profs.items())
    n = fold.count
    if p1.notes != p2.notes:
        raise FoldError("the runs' profiles differ in their notes")
    if [a for a, _ in _order(list(p2.modules), fold, k2, k1)] != list(p1.modules):
        raise FoldError("the runs' modules ran in different orders")

    modules: dict[str, ModuleProfile] = {}
    for target, source in _order(list(p2.modules), fold, k2, n):
        mine = p2.modules[source]
        got = fold.split(source)
        if got is None:  # the root code's and the parents': affine in the block count
            other = p1.modules[source]
            if other.type != mine.type:
                raise FoldError(f"{source} is of another type in a run of {k1} blocks")
            modules[target] = ModuleProfile(target, mine.type, **{
                f: affine({k1: getattr(other, f), k2: getattr(mine, f)}, n) for f in _SUMMED})
            continue
        # a block's own modules: the same in both runs at the same place, every interior block alike
        i = got[0]
        same = [p1.modules[fold.rename(source, 0 if i == 0 else k1 - 1)]] if i in (0, k2 - 1) else \
            [p2.modules[fold.rename(source, j)] for j in range(1, k2 - 1)] + [p1.modules[fold.rename(source, 1)]]
        if any(_figures(s) != _figures(mine) for s in same):
            raise FoldError(f"{source} measured differently in another run or block")
        modules[target] = replace(mine, path=target)
    return Profile(
        modules=modules,
        total_fwd_flops=sum(p.fwd_flops for p in modules.values()),
        total_bwd_flops=sum(p.bwd_flops for p in modules.values()),
        total_saved_bytes=sum(p.saved_bytes for p in modules.values()),
        param_bytes=modules[""].param_bytes if "" in modules else 0,
        total_fwd_bytes=sum(p.fwd_bytes for p in modules.values()),
        total_bwd_bytes=sum(p.bwd_bytes for p in modules.values()),
        notes=list(p2.notes),
    )


def _figures(m: ModuleProfile) -> tuple:
    return tuple(getattr(m, f.name) for f in fields(m) if f.name != "path")


# ------------------------------------------------------------------ trained parameters
def _names(trained: dict[int, frozenset[str]], fold: Fold) -> set[str]:
    """The parameter names with a gradient, at the model's N blocks."""
    (k1, t1), (k2, t2) = sorted(trained.items())
    n = fold.count

    def of(names: frozenset[str], block: int | None) -> set[str]:
        """Those of `block` (None: outside the blocks), named as block 0's."""
        out = set()
        for name in names:
            got = fold.split(name)
            if (got[0] if got is not None else None) == block:
                out.add(fold.rename(name, 0))
        return out

    outside, first, last = of(t2, None), of(t2, 0), of(t2, k2 - 1)
    mid = of(t2, 1)
    if (of(t1, None), of(t1, 0), of(t1, k1 - 1), of(t1, 1)) != (outside, first, last, mid) \
            or any(of(t2, j) != mid for j in range(2, k2 - 1)):
        raise FoldError("the runs trained different parameters at the same place")
    out = set(outside)
    for i in range(n):
        out |= {fold.rename(m, i) for m in (first if i == 0 else last if i == n - 1 else mid)}
    return out


__all__ = ["ENABLED", "FOLD_FROM", "LOG", "FoldedRun", "run_folded"]
