"""`planlang verify PLAN`: a few training steps under the plan and in one process from the same seed,
compared step by step (loss, every gradient, every parameter after the optimizer step).

Run under torchrun with the plan's world size (`planlang verify` launches it); every rank also runs the
single-process reference (the models verify is for fit in one process). Data are random but the same on
every rank: integer inputs below the smallest embedding table, float inputs normal; targets of the shapes
the loss accepts (a language model's target is its own input).

How a step is judged (docs/runtime.md, "What verify judges"). Two runs in the same precision that add in
different orders differ by rounding, and an optimizer can amplify that: Adam turns a gradient that is
exactly zero, but rounding noise in practice, into a step of up to lr, and later steps start from
parameters that differ by that much. So each step is judged from the same start: before every step the
one-process model (and its float64 twin) takes the plan's parameters, so the loss and every gradient are
compared at the same point; and the update is judged by stepping the one-process optimizer with the
plan's own gradients (its state fed the same gradients every step), so the parameters after the step
differ only by the rounding of the optimizer's arithmetic, whatever Adam does with a noisy gradient.
Every error of the plan against the one-process run (loss, each gradient, each parameter after the
optimizer step) is judged against what rounding alone does to one process: the same steps are also run
in float64, and the plan's error on a quantity may be at most NOISE_FACTOR times the error of the
one-process run against float64 on that quantity, or `tol`, whichever is larger. A plan with a master
copy of its weights (mixed precision) cannot hand its parameters over (the master copy inside the
optimizer is no parameter): one process follows them instead, its master copy starting equal and stepping
the plan's gradients, and the float64 twin takes one process's parameters before each step. A correct plan passes whatever the optimizer; a wrong update
(a gradient summed twice, a missing gradient, a step on the wrong piece) is orders of magnitude above
rounding and fails. The float64 run measures rounding only when it computes the same function: when one
process's first loss differs from float64's by more than YARDSTICK_LIMIT (random ops), every error is
judged against `tol` alone. Dropout runs as the identity on both sides (planlang.runtime.no_dropout: the
plan's masks and one process's cannot be the same draws), counted and said above the table.

A plan with precision fields (bf16, f16) is compared against one process in the same precision
(planlang.runtime.precision: parameters cast, forward under autocast, the same master copy and loss
scale), and `tol` is raised to a few unit roundoffs of the narrowest dtype the step runs in
(`precision.tolerance`); the float64 run stays the yardstick, and YARDSTICK_LIMIT grows with the unit
roundoff of the compute dtype, since one bf16 process's loss differs from float64's by rounding alone.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import sys
from dataclasses import asdict, dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from planlang.cost.layout import local_shape
from planlang.model.capture.load import build_model, guess_targets, meta_inputs, plan_loss
from planlang.model.capture.graph_values import keyword_inputs
from planlang.plan.complete import CompletePlan
from planlang.runtime.apply import PlanError, apply, load_plan
from planlang.plan.complete import plan_model
from planlang.runtime.launch import Progress
from planlang.runtime.no_dropout import dropout_off
from planlang.runtime.precision import LossScale, UNIT_ROUNDOFF, autocast, reference_model, tolerance, wrap_optimizer
from planlang.runtime.teardown import leave
from planlang.runtime.zero import build_optimizer


# How many times one process's own rounding error (against float64) the plan's error may be.
NOISE_FACTOR = 10.0
# Above this relative difference of the first loss, float64 is not the same computation (a random model).
YARDSTICK_LIMIT = 1e-4


@dataclass(frozen=True)
class StepRow:
    step: int
    loss_plan: float
    loss_reference: float
    loss_rel_err: float
    grad_rel_err: float  # of the worst-judged gradient: |g - g_ref| / |g_ref| (Frobenius norms)
    worst_grad: str
    param_rel_err: float  # after the optimizer step, of the worst-judged parameter
    worst_param: str = ""
    loss_bound: float = math.inf  # what each error is judged against: max(tol, NOISE_FACTOR * rounding)
    grad_bound: float = math.inf
    param_bound: float = math.inf

    def ok(self, tol: float | None = None) -> bool:
        """Every error within its bound (the bounds already hold `tol`; see the module docstring)."""
        return (self.loss_rel_err <= self.loss_bound and self.grad_rel_err <= self.grad_bound
                and self.param_rel_err <= self.param_bound)


def bound(noise: float, tol: float) -> float:
    """The largest error accepted where one process's own rounding error (against float64) is `noise`."""
    return max(tol, NOISE_FACTOR * noise)


def judged(errors: dict[str, float], noise: dict[str, float], tol: float) -> tuple[str, float, float]:
    """(name, error, bound) of the quantity whose error is largest against its bound."""
    if not errors:
        return "", 0.0, bound(0.0, tol)
    worst = max(errors, key=lambda n: errors[n] / bound(noise.get(n, 0.0), tol))
    return worst, errors[worst], bound(noise.get(worst, 0.0), tol)


def rel(a: torch.Tensor, b: torch.Tensor, floor: float = 0.0) -> float:
    """|a - b| / max(|b|, floor) in Frobenius norms."""
    d = (a.double() - b.double()).norm().item()
    n = max(b.double().norm().item(), floor)
    return d / n if n > 0 else d


# A gradient whose norm is below this fraction of the whole model's gradient norm is compared against
# that floor: exact zeros (the key bias of attention: softmax ignores a constant shift) leave only
# rounding noise on both sides, and noise over noise is not a relative error.
GRAD_FLOOR = 1e-3


def make_batch(model: nn.Module, plan: CompletePlan, loss_fn,
               seed: int) -> tuple[list[torch.Tensor], tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(seed)
    vocab = min([m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding)] or [2])
    metas = meta_inputs(plan.inputs)
    inputs = []
    for t in metas.values():
        if t.dtype.is_floating_point:
            inputs.append(torch.randn(t.shape, generator=g, dtype=t.dtype))
        else:
            inputs.append(torch.randint(0, vocab, t.shape, generator=g, dtype=t.dtype))
    if loss_fn is None:
        return inputs, ()
    targets = []
    # the model as the step runs it: under the plan's autocast (an f32 image into a bf16 convolution with a
    # bias raised "Input type (float) and bias type (c10::BFloat16) should be the same" without it)
    with autocast(plan.precision, "cpu"):
        found = guess_targets(model, loss_fn, metas)
    for t in found or ():
        same = [x for x in inputs if x.shape == t.shape and x.dtype == t.dtype and not x.dtype.is_floating_point]
        if same:
            targets.append(same[0])
        elif t.dtype.is_floating_point:  # data come in f32: under autocast the output's f16 is no target's
            dtype = torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else t.dtype
            targets.append(torch.randn(t.shape, generator=g, dtype=dtype))
        else:
            targets.append(torch.randint(0, 2, t.shape, generator=g, dtype=t.dtype))
    return inputs, tuple(targets)


def reference_optimizer(params, plan: CompletePlan, precision: bool = False) -> torch.optim.Optimizer:
    """The plan's optimizer class and arguments without ZeRO (one process holds everything);
    AdamW(lr=1e-3) when the plan names none. With `precision`, in the plan's precision: the same master
    copy and loss scaling as `pm.optimizer()`."""

    def make(ps):
        if plan.optimizer is None:
            return torch.optim.AdamW(ps, lr=1e-3)
        return build_optimizer(ps, dataclasses.replace(plan.optimizer, zero_stage=0, zero_axis=None))

    params = [p for p in params if p.requires_grad]
    prec = plan.precision
    if not precision or not prec.mixed:
        return make(params)
    scale = None if prec.loss_scale is None else LossScale(prec.loss_scale)
    return wrap_optimizer(params, prec, make, fsdp=False, loss_scale=scale)


def plan_optimizer(pm, plan: CompletePlan) -> torch.optim.Optimizer:
    """`pm.optimizer()`, the plan's own (ZeRO included); AdamW(lr=1e-3) when the plan names none."""
    return pm.optimizer() if plan.optimizer is not None else pm.optimizer(torch.optim.AdamW, lr=1e-3)


def describe(pm, opt) -> dict:
    """What ran, for reports and tests: the model and optimizer classes, and how much of the gradients
    and of the optimizer state this rank holds (local elements) against its parameters' local elements
    before ZeRO sharding (a ZeRO-2/3 gradient is an FSDP2 shard; ZeRO-1 state covers some parameters)."""

    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t

    params = list(pm.parameters())
    inner = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer steps a local optimizer
    state = sum(local(v).numel() for st in inner.state.values() for k, v in st.items() if k == "exp_avg"
                or (k == "momentum_buffer" and v is not None))
    full = sum(math.prod(s) for s in _piece_shapes(pm)) if hasattr(pm, "layouts") else sum(p.numel() for p in params)
    scale = getattr(opt, "loss_scale", None)
    return {"model": type(pm).__name__, "optimizer": type(opt).__name__,
            "loss_scale": None if scale is None else scale.value,
            "fsdp_axes": list(getattr(pm, "fsdp_axes", ())),
            "checkpoint_groups": [list(g) for g in getattr(pm, "checkpoint_groups", ())],
            "grad_local_numel": sum(local(p.grad).numel() for p in params if p.grad is not None),
            "param_local_numel": full, "state_numel": state}


def _piece_shapes(pm):
    """The local piece shape of every parameter under the plan's specs (before any FSDP2 sharding)."""

    return [local_shape(lay.shape, lay.spec, pm.mesh) for lay in pm.layouts.values()]


def preflight(plan_path) -> None:
    """The checks `apply` makes that need no processes (for the CLI, before it launches torchrun): the
    plan loads without errors or holes (`load_plan`: the checker's rules, among them the ZeRO axis and
    what the pipeline runtime runs, PL401–PL416, PL502–PL507). Raises PlanError naming the cause and the fix."""
    load_plan(plan_path)


def call_model(model: torch.nn.Module, plan, inputs) -> object:
    """The single-process model on the plan's inputs, by name where its forward takes them so."""
    names = [i.name for i in plan.inputs]
    if keyword_inputs(model, names):
        return model(**dict(zip(names, inputs)))
    return model(*inputs)


def verify(plan_path: str, steps: int = 3, seed: int = 0, model: nn.Module | None = None,
           report: dict | None = None, progress: Callable[[str], None] | None = None,
           tol: float = 1e-5) -> list[StepRow]:
    """Run on every rank (process group initialised); returns the same rows on every rank. Pipeline
    plans run through the same `apply` (a PipelinedModel). `report`, when given, receives `describe`'s
    facts after the last step; `progress`, when given, each phase and each step as it completes (main
    passes one on rank 0 only)."""

    say = progress or (lambda msg: None)
    plan = load_plan(plan_path)
    torch.manual_seed(seed)
    if model is None:
        model_ref = plan_model(plan)
        say(f"building the model {model_ref.factory} on the CPU")
        model = build_model(model_ref, plan.path, device="cpu")
    loss_fn = plan_loss(plan, model)  # a `loss` method is bound to the model it reads
    prec = plan.precision
    ref = reference_model(copy.deepcopy(model), prec)  # one process in the plan's precision
    exact = copy.deepcopy(model).double()  # the rounding yardstick (module docstring)
    tol = tolerance(prec, tol)
    limit = max(YARDSTICK_LIMIT, 16 * UNIT_ROUNDOFF[prec.compute]) if prec.mixed else YARDSTICK_LIMIT
    batches = [make_batch(ref, plan, loss_fn, seed + 1 + s) for s in range(steps)]
    say("applying the plan: tracing the model, lowering it, placing this rank's pieces")
    pm = apply(model, plan, loss_fn=loss_fn,
               targets=tuple(t.to("meta") for t in batches[0][1]) if batches[0][1] else None)
    opt = plan_optimizer(pm, plan)
    ref_opt = reference_optimizer(ref.parameters(), plan, precision=True)
    ref_scale = getattr(ref_opt, "loss_scale", None)
    exact_opt = reference_optimizer(exact.parameters(), plan)
    # each twin's loss: a `loss` method reads its own model (settings and weights), not the plan's
    ref_loss_fn = plan_loss(plan, ref) or (lambda out: out.sum())
    exact_loss_fn = plan_loss(plan, exact) or (lambda out: out.sum())
    exact_params = dict(exact.named_parameters())
    yardstick = True  # until the first loss says the float64 run computes something else
    # module docstring: each step judged from the plan's parameters; a mixed-precision one-process run
    # follows them through the plan's gradients (its master copy starts equal and steps the same ones)
    same_start = not prec.mixed
    rows = []
    params: dict[str, torch.Tensor] = {}  # the plan's parameters after the last step (read from step 2 on)
    # one process cannot draw the plan's dropout masks: dropout off on both sides, counted and said
    with dropout_off() as dropped:
        for s, (inputs, targets) in enumerate(batches):
            if same_start and s:
                _start_from(params, model if plan.pipeline is None else None, (ref, exact))
            elif not same_start:  # float64 measures the one-process run's rounding at that run's own point
                _start_from({n: p.detach() for n, p in ref.named_parameters()}, ref, (exact,))
            opt.zero_grad(set_to_none=True)
            ref_opt.zero_grad(set_to_none=True)
            exact_opt.zero_grad(set_to_none=True)
            loss = pm.step(*inputs, *targets)
            ref_scaled_by = 1.0 if ref_scale is None else ref_scale.value
            plan_scaled_by = loss_scale_value(opt)
            with autocast(prec, "cpu"):
                ref_loss = ref_loss_fn(call_model(ref, plan, inputs), *targets)
            (ref_loss if ref_scale is None else ref_scale.scale(ref_loss)).backward()
            exact_loss = exact_loss_fn(call_model(exact, plan, _double(inputs)), *_double(targets))
            exact_loss.backward()
            lv, rv, xv = float(loss.detach()), float(ref_loss.detach()), float(exact_loss.detach())
            if s == 0 and abs(rv - xv) > limit * max(abs(xv), 1e-30):
                yardstick = False
                say(f"one process's first loss {rv:.8g} differs from float64's {xv:.8g} by more than rounding "
                    f"(a random model, e.g. dropout): every error is judged against --tol {tol:g} alone")
            grads = pm.full_grads()
            ref_grads = {n: p.grad for n, p in ref.named_parameters() if p.grad is not None}
            overflow = overflow_verdict(grads, ref_grads) if prec.loss_scale is not None else None
            if overflow is not None:  # a skipped step: its gradients are not numbers to compare
                worst, gerr, gbound = overflow, (0.0 if overflow.startswith("both") else 1.0), bound(0.0, tol)
            else:
                worst, gerr, gbound = _judge_grads(grads, ref_grads, exact_params, ref_scaled_by, tol, yardstick)
            if report is not None and s == len(batches) - 1:
                report.update(describe(pm, opt))  # gradients still there; optimizer state from earlier steps
            _take_grads(grads, ref, exact, plan_scaled_by)  # the one-process optimizers step the plan's gradients
            opt.step()
            ref_opt.step()
            if overflow is None:
                exact_opt.step()  # (an overflowed step is skipped by both runs in the plan's precision)
            params = pm.full_parameters()
            perrs = {n: rel(params[n], p.detach()) for n, p in ref.named_parameters() if n in params}
            pnoise = {n: rel(p.detach(), exact_params[n].detach()) for n, p in ref.named_parameters()
                      if yardstick and n in params}
            if plan.pipeline is None:  # and the state forward keeps: BatchNorm's running statistics
                mine, exact_bufs = dict(model.named_buffers()), dict(exact.named_buffers())
                for n, b in ref.named_buffers():
                    if b.is_floating_point() and n in mine:
                        perrs[n] = rel(mine[n].detach().cpu(), b)
                        if yardstick:
                            pnoise[n] = rel(b, exact_bufs[n])
            pworst, perr, pbound = judged(perrs, pnoise, tol)
            lnoise = abs(rv - xv) / max(abs(xv), 1e-30) if yardstick else 0.0
            rows.append(StepRow(s, lv, rv, abs(lv - rv) / max(abs(rv), 1e-30), gerr, worst, perr, pworst,
                                bound(lnoise, tol), gbound, pbound))
            r = rows[-1]
            say(f"step {s + 1}/{len(batches)}: loss {lv:.8g} under the plan, {rv:.8g} in one process "
                f"(relative error {r.loss_rel_err:.1e}); worst gradient error {r.grad_rel_err:.1e}"
                + (f" ({worst})" if worst else ""))
    if dropped.calls:
        say(f"dropout off on both sides: {dropped.calls} dropout call(s) with p > 0 ran as the identity on this "
            "rank, the one-process runs' included (the plan's masks and one process's cannot be the same draws; "
            "docs/runtime.md)")
    if report is not None:
        report["dropout_off"] = dropped.calls
    return rows


def loss_scale_value(opt) -> float:
    """The loss scale `opt` unscales its gradients by (1.0 without loss scaling)."""
    scale = getattr(opt, "loss_scale", None)
    return 1.0 if scale is None else scale.value


def _judge_grads(grads: dict[str, torch.Tensor], ref_grads: dict[str, torch.Tensor],
                 exact_params: dict[str, nn.Parameter], ref_scaled_by: float, tol: float,
                 yardstick: bool) -> tuple[str, float, float]:
    """(name, error, bound) of the worst-judged gradient: the plan's gradients against one process's (both
    multiplied by the same loss scale), each bounded by one process's own error against float64 (whose
    gradients are not scaled: one process's are divided by its scale to compare)."""
    total = math.sqrt(sum(float(g.double().norm()) ** 2 for g in ref_grads.values()))
    # a gradient the plan did not produce counts as a relative error of 1 (all of it missing)
    errs = {n: rel(grads[n], g, GRAD_FLOOR * total) if n in grads else 1.0 for n, g in ref_grads.items()}
    noise = {n: rel(g.double() / ref_scaled_by, xg, GRAD_FLOOR * total / ref_scaled_by)
             for n, g in ref_grads.items() if yardstick and (xg := exact_params[n].grad) is not None}
    for n, g in ref_grads.items():
        noise[n] = max(noise.get(n, 0.0), rounding_floor(g, total))
    return judged(errs, noise, tol)


def rounding_floor(grad: torch.Tensor, total: float) -> float:
    """The least rounding error a gradient can be expected to carry, relative to what it is compared
    against (its norm, or GRAD_FLOOR of the model's): one unit roundoff of its dtype times the model's
    gradient norm. A gradient that is zero in exact arithmetic (a bias before `x - x.mean(0)`) is the
    sum of terms of the model's scale that cancel; both runs keep rounding of that scale, and one
    process's own error against float64 may by chance be far below it (the bias's noise is noise over
    noise), so its own error alone is no bound. Capped at ROUNDING_FLOOR_CAP: in bf16 a gradient under
    GRAD_FLOOR is all rounding, yet a gradient the plan left out (error 1) must still fail."""
    unit = torch.finfo(grad.dtype).eps / 2 if grad.is_floating_point() else 0.0
    scale = max(float(grad.double().norm()), GRAD_FLOOR * total)
    return min(unit * total / scale, ROUNDING_FLOOR_CAP) if scale > 0 else 0.0


ROUNDING_FLOOR_CAP = 0.05  # NOISE_FACTOR times it stays below 1, the error of a missing gradient


def overflow_verdict(grads: dict[str, torch.Tensor], ref_grads: dict[str, torch.Tensor]) -> str | None:
    """Whether a step under a loss scale overflowed: None when neither run has a non-finite gradient, else
    the verdict that stands for the gradient comparison. Both runs overflowed: the step is skipped by
    both, as it should be. One run only: a wrong gradient, unless the other run's largest gradient
    element is within a factor 2 of its dtype's largest finite value (rounding decides at that edge)."""
    def overflowed(gs):
        return any(not bool(torch.isfinite(g).all()) for g in gs.values())

    def at_the_edge(gs):
        return any(float(g.detach().abs().max()) >= torch.finfo(g.dtype).max / 2 for g in gs.values() if g.numel())

    plan_over, ref_over = overflowed(grads), overflowed(ref_grads)
    if not plan_over and not ref_over:
        return None
    if plan_over and ref_over:
        return "both runs overflowed (the step skipped)"
    if at_the_edge(ref_grads if plan_over else grads):
        return "both runs at the edge of overflow (the step skipped in one)"
    return "overflow under the plan only" if plan_over else "overflow in one process only"


def _start_from(params: dict[str, torch.Tensor], buffers_of: nn.Module | None, twins: tuple[nn.Module, ...]) -> None:
    """Set each twin (the one-process model, its float64 twin) to `params` and, when `buffers_of` is
    given, to that module's floating buffers (BatchNorm's running statistics) before a step."""
    with torch.no_grad():
        for twin in twins:
            for n, p in twin.named_parameters():
                if n in params:
                    p.copy_(params[n].to(p.dtype))
            if buffers_of is not None:
                mine = dict(buffers_of.named_buffers())
                for n, b in twin.named_buffers():
                    if b.is_floating_point() and n in mine:
                        b.copy_(mine[n].detach().cpu().to(b.dtype))


def _take_grads(grads: dict[str, torch.Tensor], ref: nn.Module, exact: nn.Module, scaled_by: float) -> None:
    """The plan's gradients as the one-process optimizers' (a parameter the plan gave none: none); the
    float64 twin, which scales no loss, takes them divided by the plan's loss scale."""
    for twin, div in ((ref, 1.0), (exact, scaled_by)):
        for n, p in twin.named_parameters():
            p.grad = grads[n].detach().to(p.dtype) / div if n in grads else None  # a new tensor, not the plan's


def render(rows: list[StepRow], tol: float) -> str:
    """The table: each error with the bound it is judged against (`error/bound`), the worst-judged gradient
    and parameter, and the verdict."""
    def cell(err: float, lim: float) -> str:
        return f"{err:.1e}/{lim:.0e}" + ("" if err <= lim else " !")

    lines = [f"{'step':>4}  {'loss (plan)':>14}  {'loss (1 proc)':>14}  {'loss err/bound':>15}  "
             f"{'grad err/bound':>15}  {'param err/bound':>15}  worst gradient / parameter"]
    for r in rows:
        lines.append(f"{r.step:>4}  {r.loss_plan:>14.8f}  {r.loss_reference:>14.8f}  "
                     f"{cell(r.loss_rel_err, r.loss_bound):>15}  {cell(r.grad_rel_err, r.grad_bound):>15}  "
                     f"{cell(r.param_rel_err, r.param_bound):>15}  {r.worst_grad} / {r.worst_param}")
    ok = all(r.ok() for r in rows)
    rule = (f"each error ≤ max({tol:g}, {NOISE_FACTOR:g} × one process's own rounding error against float64)")
    lines.append(("PASS: " if ok else "FAIL (marked !): ") + rule)
    return "\n".join(lines) + "\n"


def _double(tensors) -> list:
    return [t.double() if t.is_floating_point() else t for t in tensors]


def main(argv: list[str] | None = None) -> int:
    """Entry point under torchrun: `python -m planlang.runtime.verify PLAN [STEPS] [TOL] [JSON_OUT]`."""
    argv = sys.argv[1:] if argv is None else argv
    plan_path = argv[0]
    steps = int(argv[1]) if len(argv) > 1 else 3
    tol = float(argv[2]) if len(argv) > 2 else 1e-5
    out = argv[3] if len(argv) > 3 else ""
    backend = "nccl" if torch.cuda.is_available() and os.environ.get("PLANLANG_BACKEND", "") != "gloo" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend)

    say = Progress("verify", quiet=None if dist.get_rank() == 0 else True)  # rank 0 speaks for all
    say(f"{dist.get_world_size()} processes joined the process group ({backend})")
    report: dict = {}
    try:
        rows = verify(plan_path, steps, report=report, progress=say, tol=tol)
        tol = tolerance(load_plan(plan_path).precision, tol)  # the floor the rows were judged against
    except PlanError as e:  # the plan cannot run here: every rank found the same, rank 0 says why
        if dist.get_rank() == 0:
            sys.stderr.write(f"error: {e}\n")
        dist.destroy_process_group()
        return _verdict("ERROR", 2)
    ok = all(r.ok() for r in rows)
    say(f"compared {len(rows)} steps with one process: " + ("PASS" if ok else "FAIL (an error above its bound)"))
    if dist.get_rank() == 0:
        sys.stdout.write(f"{report['model']} with {report['optimizer']}"
                         + (f" (FSDP2 over {', '.join(report['fsdp_axes'])})" if report["fsdp_axes"] else "")
                         + f", {dist.get_world_size()} processes\n")
        if report.get("dropout_off"):
            sys.stdout.write(f"dropout off on both sides: {report['dropout_off']} dropout call(s) with p > 0 ran as "
                             "the identity (random masks cannot match one process's)\n")
        sys.stdout.write(render(rows, tol))
        if out:
            with open(out, "w") as f:
                json.dump({"rows": [asdict(r) for r in rows], "dropout_off": report.get("dropout_off", 0)}, f, indent=2)
    dist.destroy_process_group()
    return _verdict("PASS" if ok else "FAIL", 0 if ok else 1)


# Where the launcher (`planlang verify`) wants the verdict: a worker that compared the steps exits 0 and
# the launcher turns FAIL into its own exit 1, so a FAIL ends after the table, not in torchrun's report
# of failed workers with its traceback.
VERDICT_ENV = "PLANLANG_VERIFY_VERDICT"


def _verdict(word: str, code: int) -> int:
    path = os.environ.get(VERDICT_ENV)
    if not path:
        return code
    if int(os.environ.get("RANK", "0")) == 0:
        with open(path, "w") as f:
            f.write(word)
    return 0


if __name__ == "__main__":
    leave(main())

