"""What `check --model` knows of a plan's model before any rule runs: the module tree and shapes probed
on meta (planlang.model.capture.trace), each attention module's heads, and the facts the probe could not
compute (`LoweringFailure`, reported as PL369). `model_facts_for` builds and probes; a model that cannot
be built or run on the declared inputs is a PL26x/PL368 diagnostic instead."""
from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from planlang.lang.diagnostics import Diagnostic, Label
from planlang.plan import types as T
from planlang.plan.resolve import diag

from .capture.graph_values import OpNode
from .capture.load import (EXIT_HELP, ModelLoadError, build_model, exited, guess_targets, loss_value_read, meta_inputs,
                           no_exit, plan_loss)
from .capture.trace import ModuleFacts, Run, bind_inputs, probe_run
from .capture.valueless import VALUE_HELP, context, meta_or_fake, reads_a_value, value_read


@dataclass
class ModelFacts(ModuleFacts):
    """The probed facts plus what the rules read off the module objects: each attention module's heads
    (module name -> (heads, key/value heads or None))."""

    heads: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    failures: list["LoweringFailure"] = field(default_factory=list)  # facts the probe could not compute


_HEAD_ATTRS = ("num_heads", "n_head", "n_heads", "heads", "num_attention_heads")
_KV_ATTRS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads")


def _count(obj, names: tuple[str, ...]) -> int | None:
    for a in names:
        v = getattr(obj, a, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def attention_heads(module: nn.Module) -> dict[str, tuple[int, int | None]]:
    """Modules that declare a head count (`heads`, `num_heads`, `n_head`, ...: the examples, torch's
    MultiheadAttention, Hugging Face's attention modules, which may keep it in their `config`)."""
    out = {}
    for name, m in module.named_modules():
        if not name:
            continue
        heads, kv = _count(m, _HEAD_ATTRS), _count(m, _KV_ATTRS)
        cfg = getattr(m, "config", None)
        if heads is None and cfg is not None and "attention" in type(m).__name__.lower():
            heads, kv = _count(cfg, ("num_attention_heads", "n_head")), _count(cfg, _KV_ATTRS)
        if heads is not None:
            out[name] = (heads, kv if kv != heads else None)
    return out


@dataclass(frozen=True)
class LoweringFailure:
    """A fact `check --model` needed and could not compute (PL369), as data: `stage` is "graph" (the op
    graph of the model cannot be built), "lower" (no strategy for the layouts the plan gives an op),
    "targets" (the loss accepts no targets planlang makes), "loss-read" (it reads a tensor's value on each)
    or "estimate" (the lowered program's memory);
    `op` and `module` name the op being lowered, when known."""

    stage: str
    cause: str
    op: str | None = None
    module: str | None = None

    @classmethod
    def of(cls, err: BaseException, stage: str | None = None) -> "LoweringFailure":
        """The failure `err` is: the op it was raised for is the innermost `node` the op-graph builder or
        the lowering was working on (their loops name it so; the exception's message may not)."""
        op = module = None
        found = None
        tb = err.__traceback__
        while tb is not None:
            f = tb.tb_frame
            if f.f_globals.get("__name__", "").startswith("planlang.model.") and "node" in f.f_locals:
                found = f.f_locals["node"]
            tb = tb.tb_next
        if isinstance(found, OpNode):  # an OpNode of the graph: the lowering's
            spec = found.op
            op = str(spec.attr("target", spec.kind)) if spec.kind == "opaque" else spec.kind
            module, stage = found.module, stage or "lower"
        elif found is not None and hasattr(found, "target"):  # an fx node: building the graph
            op = getattr(found.target, "__name__", str(found.target))
            stage = stage or "graph"
        return cls(stage or "lower", f"{type(err).__name__}: {err}", op, module)


class NoTargets(Exception):
    """The loss (`found`: where) accepts none of the targets planlang makes (load.target_candidates);
    `read`: where it reads a tensor's value on every one of them (load.loss_value_read), when that is why."""

    def __init__(self, found: str, read: str | None = None):
        if read is None:
            super().__init__(f"{found} accepts none of the targets planlang makes for it (the model's integer "
                             "input, class indices over the output's leading dims, the output's shape, one value "
                             "per sample)")
        else:
            super().__init__(f"{found} reads a tensor's value" + (f" ({read})" if read else "")
                             + ": planlang runs it on meta tensors, which hold no values")
        self.found, self.read = found, read

    @property
    def stage(self) -> str:
        """Its LoweringFailure stage: "loss-read" when the loss reads a value, else "targets"."""
        return "targets" if self.read is None else "loss-read"


aten = torch.ops.aten


class StrictMeta(TorchDispatchMode):
    """What the meta kernels let through and the CPU and CUDA kernels refuse, raised while the model is
    probed on meta (so that PL261 reports it before anything launches):

      - a matrix product or convolution of operands of different dtypes (an f64 or integer input into
        f32 weights: meta's mm and convolution do not compare dtypes);
      - an embedding lookup past the end of its table with indices made by `arange` (positions: a
        sequence longer than the model's position embedding; meta tensors hold no values, but an
        arange's largest value is known from its arguments and kept through views);
      - a negative log-likelihood (cross-entropy) loss whose class indices are not int64."""

    PRODUCTS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default, aten.mv.default,
                aten.addmv.default, aten.dot.default, aten.convolution.default}
    VIEWS = {aten.unsqueeze.default, aten.view.default, aten._unsafe_view.default, aten.expand.default,
             aten.slice.Tensor, aten.reshape.default, aten.clone.default, aten._to_copy.default, aten.alias.default,
             aten.lift_fresh.default, aten.detach.default}

    def __init__(self):
        super().__init__()
        self._top: dict[int, tuple[weakref.ref, int]] = {}  # id(tensor) -> (the tensor, its largest value)

    def _largest(self, t) -> int | None:
        entry = self._top.get(id(t)) if isinstance(t, torch.Tensor) else None
        return entry[1] if entry is not None and entry[0]() is t else None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.PRODUCTS:
            dtypes = sorted({str(a.dtype).removeprefix("torch.") for a in args if isinstance(a, torch.Tensor)})
            if len(dtypes) > 1:
                raise RuntimeError(f"{func.overloadpacket.__name__} of {' and '.join(dtypes)} tensors: the CPU and "
                                   "CUDA kernels need operands of one dtype")
        if func.overloadpacket in (aten.nll_loss_forward, aten.nll_loss2d_forward) and len(args) >= 2:
            if isinstance(args[1], torch.Tensor) and args[1].dtype != torch.int64:
                raise RuntimeError(f"the loss's class indices are {str(args[1].dtype).removeprefix('torch.')} (the "
                                   "targets `planlang verify` makes: an integer input itself for a language model); "
                                   "the CPU and CUDA kernels need int64")
        if func.overloadpacket is aten.embedding and len(args) >= 2:
            top = self._largest(args[1])
            if top is not None and top >= args[0].shape[0]:
                raise IndexError(f"position {top} is past the end of an embedding of {args[0].shape[0]} rows "
                                 "(the input is longer than the model's positions)")
        out = func(*args, **kwargs)
        if func.overloadpacket is aten.arange and isinstance(out, torch.Tensor) and out.numel():
            nums = [a for a in args if isinstance(a, (int, float))]
            start, end, step = (0, nums[0], 1) if len(nums) == 1 else (nums[0], nums[1], nums[2] if len(nums) > 2 else 1)
            last = start + (out.numel() - 1) * step
            self._top[id(out)] = (weakref.ref(out), int(max(start, last)))
        elif isinstance(out, torch.Tensor) and args and self._largest(args[0]) is not None:
            top = self._largest(args[0])
            shift = args[1] * kwargs.get("alpha", 1) if len(args) > 1 and isinstance(args[1], (int, float)) else None
            if func in self.VIEWS:
                self._top[id(out)] = (weakref.ref(out), top)
            elif func.overloadpacket in (aten.add, aten.sub) and shift is not None:  # positions + an offset
                self._top[id(out)] = (weakref.ref(out), int(top + (shift if func.overloadpacket is aten.add else -shift)))
        return out


def _loss_on_verify_targets(module: nn.Module, plan: T.Plan, probed: Run | None = None,
                            strict: StrictMeta | None = None) -> None:
    """The plan's loss (load.plan_loss: its model module's `loss`, else the model's `loss` method) on the
    targets `planlang verify` and `planlang.apply` make (planlang.model.capture.load.guess_targets), under
    StrictMeta: what their first step would raise; NoTargets when the loss takes none of the targets made
    for it (apply would refuse the plan).

    `probed`: the probe's run of this module on the plan's inputs under StrictMeta `strict`. Its output is
    what the forward here would return (the same forward, on meta, without gradients; of a model cut to a
    few of its blocks, the whole model's structure and shapes: trace.probe_run), so the loss runs on it,
    in the same StrictMeta, and the forward is not run again; the targets are guessed on the same cut."""
    loss = plan_loss(plan, module)
    if loss is None:
        return
    if plan.model is None or getattr(loss, "__self__", None) is module:  # no `model` line: the model's own method
        found = f"the `loss` method of {type(module).__name__}"
    else:
        found = f"`loss` of `{plan.model.module}`"
    inputs = meta_inputs(plan.inputs)
    # the probe's forward, when it ran as a trace or under fake tensors, is the one guess_targets would run
    reused = probed if probed is not None and probed.how != "meta" else None
    targets = guess_targets(module, loss, inputs, probed.fold if probed is not None else None,
                            reused.output if reused else None, _mode_of(reused) if reused else None)
    if targets is None:  # why: said when it is that the loss reads a value (in the mode the guess ran in)
        mode = None if probed is None else _mode_of(probed) if probed.how != "meta" else context("fake")
        raise NoTargets(found, loss_value_read(module, loss, inputs, probed.output, mode)
                        if probed is not None and mode is not None else None)
    if not targets:
        return
    mode = _mode_of(probed) if probed is not None else None
    if probed is not None and strict is not None and mode is not None:
        try:
            with strict, mode, torch.no_grad():
                loss(probed.output, *targets)
            return
        except RuntimeError as err:
            if probed.how == "fake" or not reads_a_value(err):
                raise
        # the loss reads a value: forward and loss again, as meta_or_fake's next tries

    def run():
        args, kwargs = bind_inputs(module, inputs)
        with torch.no_grad():
            loss(module(*args, **kwargs), *targets)

    with StrictMeta():
        meta_or_fake(run)


def _mode_of(probed: Run) -> contextlib.AbstractContextManager | None:
    """The mode the probe's forward ran in, to run the loss in as meta_or_fake would have (valueless.HOWS):
    none on meta, a trace's, its FakeTensorMode under fake tensors (None when its output holds no fake
    tensor)."""
    if probed.how != "fake":
        return context(probed.how)
    mode = next((t.fake_mode for t in tree_flatten(probed.output)[0] if isinstance(t, FakeTensor)), None)
    return context("fake", mode) if mode is not None else None


def build_for_check(plan: T.Plan) -> tuple[nn.Module | None, list[Diagnostic]]:
    """The plan's model built on meta, once for a whole validation; a PL26x/PL368 diagnostic instead when
    its factory fails or exits."""
    if plan.model is None:
        return None, []
    try:
        return build_model(plan.model, plan.path), []
    except ModelLoadError as err:
        return None, [diag(err.code, err.message, plan.model.span, help=err.help)]


def probe_facts(plan: T.Plan, module: nn.Module) -> tuple[ModelFacts | None, list[Diagnostic]]:
    """The built `module` probed on the declared inputs; a PL26x diagnostic instead when its forward fails
    (PL368 when the model's code exits the process). A loss no target fits is a failure in the facts
    (PL369)."""
    assert plan.model is not None
    try:
        strict = StrictMeta()
        with no_exit(), strict:  # the forward is the model's code too: it must not end planlang
            probed, run = probe_run(module, meta_inputs(plan.inputs))
        facts = ModelFacts(**vars(probed), heads=attention_heads(module))
        try:
            with no_exit():
                _loss_on_verify_targets(module, plan, run, strict)
        except NoTargets as err:  # a fact of the plan, not a failed probe: the other checks still run
            facts.failures = [LoweringFailure(err.stage, str(err))]
    except ModelLoadError as err:
        return None, [diag(err.code, err.message, plan.model.span, help=err.help)]
    except SystemExit as err:  # sys.exit or os._exit in the forward or the loss
        return None, [diag("PL368", f"running the model on the declared inputs exited the process: {exited(err)}",
                           plan.model.span, help=EXIT_HELP)]
    except Exception as err:  # the model's forward failed on the declared inputs
        where = value_read(err)
        if where is not None:  # its code reads a tensor's value, in every way planlang runs it without values
            return None, [diag("PL261", "the model's code reads a tensor's value" + (f" ({where})" if where else "")
                               + ": planlang runs the model on meta tensors, which hold no values",
                               plan.model.span, help=VALUE_HELP)]
        return None, [diag("PL261", f"running the model on the declared inputs raised {type(err).__name__}: {err}",
                           plan.model.span, help="check the `input` declarations: names, dtypes and shapes",
                           labels=[Label(i.span, "declared here") for i in plan.inputs[:1]])]
    return facts, []


def model_facts_for(plan: T.Plan) -> tuple[ModelFacts | None, list[Diagnostic]]:
    """Build the plan's model on meta and probe it (`build_for_check`, then `probe_facts`)."""
    module, diags = build_for_check(plan)
    return (None, diags) if module is None else probe_facts(plan, module)
