"""What ZeRO and the optimizer step hold, beyond a device's parameters and saved activations (the
estimator's formulas, planlang.model.price.estimate):

    STATE_ELEMENTS, STEP_COUNTER   optimizer state per parameter element, and the optimizers that keep a
                                   step counter per tensor
    zero1_state_bytes              ZeroRedundancyOptimizer's fullest rank (whole parameters, greedy by size)
    optimizer_temporaries          what the optimizer step allocates beside its states (per-tensor on CPU,
                                   multi-tensor on accelerators), or the data-parallel sum's flat copy
    zero_blocks_peak               ZeRO-2/3 with one FSDP2 unit per repeated block: the most live beside
                                   the kept shards, part by part of the simulated step
"""
from __future__ import annotations

import math

from planlang.plan import types as T
from planlang.plan.complete import CompletePlan

from planlang.model.price.local_model import LocalParam

STATE_ELEMENTS = {  # optimizer state elements per parameter element (fp32)
    "adam": 2, "adamw": 2, "lion": 1, "momentum": 1, "rmsprop": 1, "adagrad": 1, "sgd": 0, "adafactor": 0,
}
STEP_COUNTER = {"adam", "adamw", "adagrad", "rmsprop"}  # a float32 scalar tensor per parameter tensor


def zero_blocks_peak(sim, facts, params: dict[str, LocalParam], shards: int, zero: int,
                      prec: T.Precision | None = None, gloo: bool = False) -> int | None:
    """The most bytes live beside the kept parameter shards and optimizer state in a step of ZeRO-2/3 with
    one FSDP2 unit per repeated block (planlang.runtime.zero_blocks; the blocks are `facts.blocks`, the
    outermost nn.ModuleList entries), or None without a block holding parameters of its own (the whole
    model is then one unit). Each part of the simulated step (`StepMemory.segments`: a block's forward,
    the root code after it, the backward from a block's output on) at its own peak, plus what FSDP2 holds
    there (`B[i]`: block i's parameters, local pieces before FSDP2's shard; `R`: the root unit's). ZeRO-3:

        forward of block i     R + 2 B[i] + B[i+1]   its parameters gathered, its all-gather output (FSDP2
                                                     keeps it until the next all-gather), the next block's
                                                     prefetched
        root code after i      R + B[i] + B[i+1]     block i resharded; both all-gather outputs held
        backward of the head   R + B[n-1]            the last block's all-gather output
        backward of block i    R + B[i] + B[i-1]     gathered again, the block before it prefetched,
                               + G[i+1]              the reduce-scatter input of the block after it (kept
                                                     until the next reduce-scatter)
        its reduce-scatter     R + B[i-1] + G[i]     at the end of its backward (what the simulated step
                               (+ G[i]) + G[i]/n     holds then, `StepMemory.segment_starts`): block i
                                                     resharded and the input before freed first; its
                                                     gradients copied into the input, and while they are
                                                     freed the output is made (with gloo, whose
                                                     reduce-scatter all-reduces a copy of the input, the
                                                     copy too)

    ZeRO-2 (not resharded after forward) keeps every block gathered from its forward until its backward
    has run: the parameters of blocks 0..i take the place of the gathered block, without prefetch in
    backward.

    With precision fields (`prec`), FSDP2 gathers in `params` (B and R in that dtype), keeps the
    reduce-scatter input in `reduce` and the reduce-scattered gradients in `master`, while the simulated
    step holds gradients in `params`: G[i+1] is scaled by reduce/params and the done gradients by
    master/params; the reduce-scatter's input, its copy and its output (the G[i] of that row but the first,
    and G[i]/n) are in `reduce`.

    In the backward of block i, the simulated step still holds the whole gradients of the blocks after
    it; FSDP2 has reduce-scattered them to 1/shards (`G[j]`: block j's gradients). The simulation follows
    what is saved and freed op by op, so a peak inside a block's backward, with part of its activations
    and part of its gradients live, is where it falls. Against MemTracker through planlang.apply
    (bench/zero_blocks.py, GPT-2 in four shapes on dp 4): ZeRO-3 within 0.1 %, ZeRO-2 within 3 %; the
    zoo's four architectures in bf16, autocast and f32 within 4 % (bench/precision_memory.py). The
    runtime keeps a block in the root unit when the program interleaves it with other code or shares its
    parameters; this counts every block holding unshared parameters."""
    if not sim.segments:
        return None
    names = list(getattr(facts, "blocks", ()))

    def block_of(name: str) -> int | None:
        return next((i for i, b in enumerate(names) if name.startswith(b + ".")), None)

    shared = {n for group in facts.shared for n in group if len({block_of(m) for m in group}) > 1}
    B = [0] * len(names)
    R = 0
    mixed = prec if prec is not None and prec.mixed else None
    rr = mixed.bytes("reduce") / mixed.bytes("params") if mixed else 1.0  # the reduce-scatter input's dtype
    mr = mixed.bytes("master") / mixed.bytes("params") if mixed else 1.0  # the sharded gradients' dtype
    for p in params.values():
        i = block_of(p.name)
        size = math.prod(p.local) * (mixed.bytes("params") if mixed else p.itemsize)
        if i is None or p.name in shared:
            R += size
        else:
            B[i] += size
    if not any(B):
        return None
    G = list(sim.block_grads) + [0] * (len(names) - len(sim.block_grads))
    n = len(names)

    def at(i: int) -> int:
        return B[i] if 0 <= i < n else 0

    def reduce_scatter(i: int, gathered: int) -> int:
        """What FSDP2 holds beside the simulated step's tensors when block i's backward is done and its
        gradients are reduce-scattered (foreach_reduce): the block resharded (`gathered` parameters are
        still held), the previous reduce-scatter's input freed first (one input buffer at a time), the
        gradients copied into the reduce-scatter input (in `reduce`) and then freed, the output (and with
        gloo, whose reduce-scatter all-reduces a copy of its input, that copy); the blocks done are sharded."""
        done = sum(G[j] for j in range(i + 1, n))
        mine = int(G[i] * rr)
        base = R + gathered - G[i] - done + int(done * mr) // shards
        return base + mine + max(G[i], (mine if gloo else 0) + mine // shards)

    out = 0
    for (kind, i), live in sim.segments.items():
        if kind == "B" and i < n and ("B", i - 1) in sim.segment_starts:  # block i's backward done
            out = max(out, sim.segment_starts[("B", i - 1)] + reduce_scatter(i, sum(B[:i]) if zero == 2 else at(i - 1)))
        if zero == 2:  # parameters stay gathered from a block's forward until its backward has run
            kept = sum(B[: max(i, -1) + 1]) if kind != "B" else sum(B[: min(i, n - 1) + 1])
            if kind == "F":
                extra = R + kept + (at(i) + at(i + 1) if i >= 0 else 0)
            elif kind == "F+":
                extra = R + kept + at(i) + at(i + 1)
            elif i >= n:
                extra = R + kept + at(n - 1)
            else:
                done = sum(G[j] for j in range(i + 1, n))
                extra = R + kept + int((G[i + 1] if i + 1 < n else 0) * rr) - done + int(done * mr) // shards
            out = max(out, live + extra)
            continue
        if kind == "F":
            extra = R + (2 * at(i) + at(i + 1) if i >= 0 else 0)
        elif kind == "F+":
            extra = R + at(i) + at(i + 1)
        elif i >= n:  # the head's backward, before the last block's
            extra = R + at(n - 1)
        else:
            done = sum(G[j] for j in range(i + 1, n))
            extra = R + at(i) + at(i - 1) + int((G[i + 1] if i + 1 < n else 0) * rr) - done + int(done * mr) // shards
        out = max(out, live + extra)
    return out


def zero1_state_bytes(mine: list[LocalParam], trained: set[str], states: int, counter: bool, ranks: int,
                       itemsize: int = 4) -> int:
    """Optimizer-state bytes of the fullest rank under ZeroRedundancyOptimizer's partition: whole
    parameters, largest first, each to the rank holding the fewest elements so far (a greedy balance;
    Rajbhandari et al. 2020 §5.1 P_os with tensor granularity). Only `trained` parameters (those that
    get a gradient) have state."""
    load = [0] * ranks
    state = [0] * ranks
    for p in sorted(mine, key=lambda p: -math.prod(p.local)):
        r = load.index(min(load))
        n = math.prod(p.local)
        load[r] += n
        if p.name in trained:
            state[r] += states * n * itemsize + (4 if counter else 0)
    return max(state)


def optimizer_temporaries(plan: CompletePlan, mine: list[LocalParam], states: int, shards: int, whole: bool = False,
                           itemsize: int = 4) -> int:
    """Bytes the optimizer step allocates on top of its states. torch's Adam-family optimizers run the
    per-tensor implementation on CPU (two temporaries of one parameter's size at a time: sqrt of the
    second moment, then its scaled copy) and the multi-tensor (foreach) one on accelerators (one
    temporary per parameter, all alive together). `shards` ranks share the step: FSDP2 slices every
    tensor, ZeroRedundancyOptimizer (`whole`) gives each rank whole tensors, so the per-tensor path's
    temporaries are those of a whole parameter (a rank holds the largest) and the multi-tensor path's
    are about 1/shards of the sum. The result is what is live beside the gradients after backward."""
    return _step_temporaries(plan, mine, states, shards, whole, itemsize)


def _step_temporaries(plan: CompletePlan, mine: list[LocalParam], states: int, shards: int, whole: bool,
                      itemsize: int = 4) -> int:
    """`itemsize`: bytes per element of the state (the precision's master dtype)."""
    if not states or not mine:
        return 0
    dev = plan.mesh.device.name if plan.mesh and plan.mesh.device else ""
    if "cpu" in dev:
        return 2 * max(math.prod(p.local) * itemsize for p in mine) // (1 if whole else shards)
    return sum(math.prod(p.local) * itemsize for p in mine) // shards
