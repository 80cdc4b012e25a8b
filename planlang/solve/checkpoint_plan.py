"""Checkpoint groups for a plan: rotor's DP (planlang.solve.rotor.solve_groups) on the plan's local model.

map-memory-aware-auto-parallel §5.3 runs the activation-checkpoint solver on the graph the intra-op stage
has sharded; here that graph is the model with every parameter replaced by its local shard and the batch
each device sees (the estimator's local model, planlang.model.price.local_model), cut into a chain at the model's
longest list of repeated blocks (GPT-2's `h.0` .. `h.11`, plus what runs before and after them:
planlang.solve.linearize.chain_for_modules). Blocks are what a `checkpoint` line can name, so the groups
rotor chooses are written back as they are (`checkpoint h[0:4]`, one line per group).

The chain's memory is activations and temporaries only; parameters, gradients, optimizer states and
buffers come off the budget first (`activation_budget`). Time per stage is its flops at the device's
throughput, so the DP trades recomputed flops against memory exactly as the estimator prices them.
"""
from __future__ import annotations

from dataclasses import dataclass
from planlang.cost.comm import compute_time
from planlang.plan.complete import CompletePlan
from planlang.plan.data import data_degree

from .checkpoint_values import Checkpoints, checkpoint_value, every_value


class NoChain(ValueError):
    """The plan's model has no repeated blocks to checkpoint, or its chain cannot be measured."""


@dataclass(frozen=True)
class CheckpointChoice:
    value: Checkpoints  # the groups, as the plan holds them (empty: no recomputation)
    groups: tuple[tuple[int, int], ...]  # rotor's groups over the chain's stages
    recompute_seconds: float  # the schedule's makespan minus the chain's time without recomputation
    peak: float  # the chain's simulated peak bytes under the schedule

    def __str__(self) -> str:
        return str(self.value) if self.value else "no checkpointing"


def repeated_blocks(module_names: list[str]) -> tuple[str, int] | None:
    """The container with the most numbered children (`h`, 12 for GPT-2), ties by name; None if none."""
    lists: dict[str, int] = {}
    for name in module_names:
        head, _, last = name.rpartition(".")
        if last.isdigit():
            lists[head] = lists.get(head, 0) + 1
    if not lists:
        return None
    head = max(lists, key=lambda k: (lists[k], k))
    return head, lists[head]


def plan_chain(plan: CompletePlan, efficiency: float = 0.5, facts=None):
    """The LinearChain of the plan's local model over its repeated blocks (one microbatch). `facts`: the
    model's probe (planlang.model.capture.trace.ModuleFacts) when the caller has it (the solver's SolveFacts.modules)."""
    # lazy: torch loads only when this runs
    from planlang.model.price.local_model import local_inputs, local_params, with_local_params
    from planlang.model.capture.load import build_model, meta_inputs, model_loss
    from planlang.model.capture.trace import probe_modules

    # lazy: torch loads only when this runs
    from .linearize import chain_for_modules

    if plan.model is None or plan.mesh is None:
        raise NoChain("the plan needs a model and a mesh")
    device = plan.mesh.device
    if device is None or not device.flops:
        raise NoChain(f"mesh {plan.mesh.name} has no device throughput")
    module = build_model(plan.model, plan.path)
    if facts is None:
        facts = probe_modules(module, meta_inputs(plan.inputs))
    found = repeated_blocks([n for n in facts.all_modules if n])
    if found is None:
        raise NoChain("the model has no list of repeated blocks (a ModuleList) to checkpoint")
    head, n = found
    _, params = local_params(plan, facts)
    with_local_params(module, params)
    dp = data_degree(plan)
    micro = plan.pipeline.microbatches if plan.pipeline else 1
    inputs = local_inputs(plan, dp * micro)

    throughput = 1.0 / compute_time(1.0, plan.mesh, "f32", efficiency)
    stages = [f"{head}.{i}" for i in range(n)]
    try:
        return chain_for_modules(module, inputs, stages, throughput=throughput, loss=model_loss(plan.model)), head
    except (ValueError, RuntimeError) as e:
        raise NoChain(f"the model's chain over {head}[*] could not be measured: {e}") from e


def activation_budget(row, budget: int) -> int:
    """What a device has left for activations: its budget minus parameters, gradients, optimizer states
    and buffers (an estimator row, planlang.model.price.estimate.DeviceEstimate)."""
    return budget - row.parameters - row.gradients - row.optimizer - row.buffers


def choose_checkpoints(linear, budget: float, head: str) -> CheckpointChoice:
    """rotor's fastest contiguous grouping of the blocks of `head` within `budget` bytes of activations
    (no groups when the chain fits without recomputation); raises planlang.solve.rotor.InfeasibleBudget
    when even the leanest grouping does not fit."""
    # lazy: torch loads only when this runs
    from .linearize import group_modules
    from .rotor import group_ops, simulate, solve_groups

    chain = linear.chain
    base = simulate(group_ops(chain.length, ()), chain)
    if base.peak <= budget:
        return CheckpointChoice(Checkpoints(), (), 0.0, base.peak)
    # only the blocks: the stages before and after them run several modules on several tensors, which
    # torch.utils.checkpoint (and the estimator) would recompute module by module, not as rotor's group
    blocks = tuple(bool(s.modules) and all(m.startswith(head + ".") for m in s.modules) for s in linear.stages[:-1])
    found = solve_groups(chain, budget, checkpointable=blocks)
    value = _every(found.groups, linear, head) or checkpoint_value(group_modules(found.groups, linear))
    return CheckpointChoice(value, found.groups, max(0.0, found.schedule.makespan - base.makespan),
                            found.schedule.peak)


def leanest_checkpoints(linear, head: str, least: float) -> CheckpointChoice:
    """The grouping with the least memory: rotor at the least feasible budget `least` (exact bytes),
    loosened a little at a time for the discretisation's rounding (sizes round up to slots)."""
    # lazy: numpy loads only when this runs
    from .rotor import InfeasibleBudget

    budget = least
    for _ in range(8):
        budget *= 1.02
        try:
            return choose_checkpoints(linear, budget, head)
        except InfeasibleBudget:
            continue
    raise NoChain(f"no grouping found near the least budget {least:.0f} B")


def _every(groups, linear, head: str) -> Checkpoints | None:
    """One `checkpoint h[a:b] every k` statement when the groups are consecutive runs of k blocks (a plan
    reads better with one line than with one per group); None otherwise."""
    # lazy: torch loads only when this runs
    from .linearize import group_modules

    if len(groups) < 2:
        return None
    mods = group_modules(groups, linear)
    sizes = {len(g) for g in mods}
    flat = [m for g in mods for m in g]
    idx = [int(m.rpartition(".")[2]) for m in flat]
    if len(sizes) != 1 or any(not m.startswith(head + ".") or m.count(".") != head.count(".") + 1 for m in flat) \
            or idx != list(range(idx[0], idx[0] + len(idx))):
        return None
    return every_value(head, idx[0], idx[-1] + 1, sizes.pop())


def no_recompute_peak(linear) -> float:
    # lazy: numpy loads only when this runs
    from .rotor import group_ops, simulate

    return simulate(group_ops(linear.chain.length, ()), linear.chain).peak
