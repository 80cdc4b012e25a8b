"""`pm(*args, **kwargs)`: binding a call's arguments to the plan's inputs and targets, building what the
model returns from this rank's pieces, and gathering those pieces whole (`pm.whole`).

Shared by the runtimes that run a plan's forward (planlang.runtime.apply's ParallelModel, the pipelines):

    sig = CallSignature(inputs=("input_ids", "labels"), targets=(), shapes=..., batch_dims=...)
    step_args = bind_call(sig, args, kwargs)            # inputs then targets, in the program's order
    out = build_output(tree, leaves, loss, pieces)      # the model's ModelOutput / dict, or a PlanOutput
    full = whole(out, gather)                           # every registered piece gathered whole

Only `loss` carries autograd: it is the global loss (the same tensor `step` backpropagates); every
other tensor of the output is this rank's piece of the model's, detached. Each piece is registered
(weakly, by tensor identity) with its global shape and layout, so `whole` knows how to gather it
without the caller keeping the layouts beside the output.
"""
from __future__ import annotations

import dataclasses
import inspect
import types
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from planlang.lang.diagnostics import did_you_mean
from planlang.model.capture.graph_values import OutputTree, flatten_output
from planlang.model.program.lowering import Convert, Program
from planlang.plan.types import Spec
from planlang.runtime.programs import PlanError
from planlang.runtime.redistribute import redistribute

__all__ = ["CallSignature", "OutputTree", "Piece", "PlanOutput", "bind_call", "build_output", "flatten_output", "gather_whole", "sums_before_step",
           "model_own_loss", "output_pieces", "piece_of", "register", "target_names", "whole"]


@dataclasses.dataclass(frozen=True)
class CallSignature:
    """What a call of the plan's forward takes: the plan's `input` names (in the program's order), then
    the loss' targets, each under the names it may be passed by (the loss' parameter name, `target` /
    `targetN`), with every one's global shape and batch dim (-1: none) to refuse a larger batch.
    `shapes` / `batch_dims` may be empty (no shape check here)."""

    inputs: tuple[str, ...]
    targets: tuple[tuple[str, ...], ...] = ()
    shapes: tuple[tuple[int, ...], ...] = ()  # one per input then target: the plan's global shapes
    batch_dims: tuple[int, ...] = ()  # the dim of each that is the batch (-1: none, e.g. a scalar target)
    what: str = "pm"  # how the error messages name the callee

    @property
    def names(self) -> list[str]:
        return [*self.inputs, *(t[0] for t in self.targets)]


def bind_call(sig: CallSignature, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[torch.Tensor, ...]:
    """The step's tensors (inputs then targets, `sig`'s order) from a call's positional and keyword
    arguments: positionals fill the inputs then the targets in order; a keyword names an input, or a
    target by one of its names. A PlanError says what is wrong and how to fix it: an unknown keyword
    (declare it as an `input` of the plan, or leave it out), one given twice, one missing, too many
    positionals, a batch larger than the plan's."""
    slots: list[str] = sig.names
    alias = {n: n for n in sig.inputs}
    for t in sig.targets:
        for a in t:
            alias.setdefault(a, t[0])
    if len(args) > len(slots):
        raise PlanError(f"{sig.what}() takes {len(slots)} tensors ({', '.join(slots) or 'none'}), got {len(args)} "
                        "positional arguments")
    bound: dict[str, Any] = dict(zip(slots, args))
    for key, value in kwargs.items():
        slot = alias.get(key)
        if slot is None:
            guess = did_you_mean(key, list(alias))
            hint = f"did you mean `{guess}`? " if guess else ""
            raise PlanError(f"{sig.what}() got the keyword `{key}`, which is none of the plan's inputs "
                            f"({', '.join(sig.inputs) or 'none'}) or the loss' targets "
                            f"({', '.join('/'.join(t) for t in sig.targets) or 'none'}); {hint}declare it as an "
                            f"`input {key} ...` of the plan (with its `data` spec) or leave it out of the call")
        if slot in bound:
            raise PlanError(f"{sig.what}() got `{slot}` twice (positionally and as `{key}=`)")
        bound[slot] = value
    missing = [s for s in slots if bound.get(s) is None]
    if missing:
        raise PlanError(f"{sig.what}() is missing {', '.join(f'`{m}`' for m in missing)}: it takes "
                        f"{', '.join(slots)} (positionally in this order, or by name)")
    out = tuple(bound[s] for s in slots)
    for i, (name, t) in enumerate(zip(slots, out)):
        if not isinstance(t, torch.Tensor):
            raise PlanError(f"{sig.what}(): `{name}` is a {type(t).__name__}, not a tensor")
        if i < len(sig.shapes) and i < len(sig.batch_dims):
            _within(sig, name, tuple(t.shape), sig.shapes[i], sig.batch_dims[i])
    return out


def target_names(loss_fn: Callable | None, refs: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    """The names each of the loss' targets may be passed by: its Value's name (`target`, `target0`, ...)
    and the loss function's parameter for it (`labels` of `loss(output, labels)`)."""
    params: list[str] = []
    if loss_fn is not None:
        try:
            ps = list(inspect.signature(loss_fn).parameters.values())
            params = [p.name for p in ps if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][1:]
        except (TypeError, ValueError):
            params = []
    return tuple((ref, *([params[i]] if i < len(params) and params[i] != ref else []))
                 for i, ref in enumerate(refs))


def _within(sig: CallSignature, name: str, got: tuple[int, ...], plan: tuple[int, ...], b: int) -> None:
    """A PlanError when `got` is larger than the plan's in a dim (a shorter one, or this rank's piece, is
    for the runtime to judge)."""
    if len(got) != len(plan):
        return
    longer = [d for d in range(len(plan)) if d != b and got[d] > plan[d]]
    if longer:
        raise PlanError(f"{sig.what}(): `{name}` has shape {list(got)}, longer than the plan's {list(plan)} in dim "
                        f"{longer[0]}: a dim may be shorter than the plan declares, none longer; declare a larger "
                        "`input` in the plan")
    if 0 <= b < len(plan) and got[b] > plan[b]:
        raise PlanError(f"{sig.what}(): `{name}` has a batch of {got[b]} (shape {list(got)}), larger than the "
                        f"plan's {plan[b]} (shape {list(plan)}): the plan was checked for its batch's memory; "
                        f"split the batch into calls of at most {plan[b]}, or declare a larger `input` in the plan")


# ------------------------------------------------------------------------------ outputs
def model_own_loss(out: Any) -> Any:
    """The loss a model computed itself (HF's `labels=`: the output's scalar `loss` field), or None."""
    loss = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", None)
    return loss if isinstance(loss, torch.Tensor) and loss.dim() == 0 else None


@dataclasses.dataclass
class PlanOutput:
    """What `pm(...)` returns for a model whose output is a tensor or a tuple (no `loss` field): the
    global loss (with autograd) and the output, this rank's pieces, detached."""

    loss: torch.Tensor
    output: Any


@dataclasses.dataclass(frozen=True)
class Piece:
    """A tensor that is this rank's piece of a global one: its global shape and layout."""

    shape: tuple[int, ...]
    spec: Spec

    @property
    def is_whole(self) -> bool:
        return not self.spec.used_axes() and not self.spec.partial


# id(tensor) -> (a weak reference to it, its Piece); the entry leaves with the tensor (a tensor's `==` is
# elementwise, so a WeakKeyDictionary cannot hold tensors)
_PIECES: dict[int, tuple[weakref.ref, Piece]] = {}


def register(t: torch.Tensor, piece: Piece) -> None:
    """Record that `t` is this rank's `piece` (`whole` gathers it), for as long as `t` lives."""
    key = id(t)

    def gone(_: weakref.ref) -> None:
        _PIECES.pop(key, None)
    _PIECES[key] = (weakref.ref(t, gone), piece)


def output_pieces(prog: Program) -> list[Piece]:
    """The global shape and layout of each of the program's output values (`prog.outputs`)."""
    converted = {ins.out: ins.shape for ins in prog.instructions if isinstance(ins, Convert)}
    return [Piece(tuple(prog.graph.values[o].shape) if o in prog.graph.values else tuple(converted[o]),
                  prog.layouts[o]) for o in prog.outputs]


def piece_of(t: torch.Tensor) -> Piece | None:
    """The global shape and layout registered for `t` (None: not a piece, or whole)."""
    entry = _PIECES.get(id(t))
    return entry[1] if entry is not None and entry[0]() is t else None


def build_output(tree: OutputTree | None, leaves: Sequence[torch.Tensor], loss: torch.Tensor,
                 pieces: Sequence[Piece | None] = ()) -> Any:
    """The model's output from this rank's pieces `leaves` (in `tree`'s tensor order), each detached
    and registered with its Piece (None: whole), and the global `loss`: the model's own class (a
    ModelOutput or a dict) with `loss` set to it, else a PlanOutput(loss, output). `tree` None: the
    output is not known (a PlanOutput with output None)."""
    if tree is None:
        return PlanOutput(loss, None)
    if len(leaves) != tree.n_tensors:
        raise PlanError(f"the program returned {len(leaves)} output tensors; the model's output has {tree.n_tensors}")
    local = []
    for i, t in enumerate(leaves):
        d = t.detach()
        piece = pieces[i] if i < len(pieces) else None
        if piece is not None and not piece.is_whole:
            register(d, piece)
        local.append(d)
    it = iter(local)
    out = tree_unflatten([next(it) if x is None else x for x in tree.template], tree.spec)
    return with_loss(out, loss)


def with_loss(out: Any, loss: torch.Tensor) -> Any:
    """`out` with its `loss` field the global loss: a ModelOutput (a dataclass) rebuilt with it (the
    fields keep their order), a dict given it first; anything else wrapped in a PlanOutput."""
    if isinstance(out, Mapping) and dataclasses.is_dataclass(out) and \
            "loss" in {f.name for f in dataclasses.fields(out)}:
        return type(out)(**{**{k: v for k, v in out.items()}, "loss": loss})
    if isinstance(out, dict):
        rest = {k: v for k, v in out.items() if k != "loss"}
        return type(out)({"loss": loss, **rest}) if type(out) is dict else _set_loss(out, loss)
    return PlanOutput(loss, out)


def _set_loss(out: dict, loss: torch.Tensor) -> dict:
    out["loss"] = loss
    return out


def sums_before_step(opt: torch.optim.Optimizer, finish: Callable[[], None]) -> torch.optim.Optimizer:
    """`opt` whose `step` first calls `finish` (the runtime's deferred gradient sums, once due: after
    `out.loss.backward()` they must be complete before the update). On the instance, not a step
    pre-hook: the precision wrappers (planlang.runtime.precision's MasterWeights, ScaledOptimizer) read
    the gradients in their own `step`, which runs no hooks. A scheduler wraps this `step` in turn."""
    inner = opt.step

    def step(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        finish()
        return inner(*args, **kwargs)
    # a bound method, as torch's LRScheduler expects of `optimizer.step` (it rebinds its __func__)
    opt.step = types.MethodType(step, opt)  # type: ignore[method-assign]
    return opt


def gather_whole(mesh: Any, groups: Any) -> Callable[[torch.Tensor, Piece], torch.Tensor]:
    """`whole`'s gather on a mesh of process groups (planlang.runtime.redistribute): the piece converted
    to the replicated layout (all-gathers over the axes that split it, an all-reduce of a partial sum)."""
    def gather(t: torch.Tensor, piece: Piece) -> torch.Tensor:
        return redistribute(t, piece.shape, piece.spec, Spec(tuple(() for _ in piece.shape)), mesh, groups)
    return gather


def whole(out: Any, gather: Callable[[torch.Tensor, Piece], torch.Tensor]) -> Any:
    """A copy of `out` with every registered piece replaced by `gather(piece, its Piece)` (the whole
    tensor on every rank: all-gathered over the axes that split it, a partial sum summed); tensors that
    are no piece (the loss, whole outputs) are kept as they are. A collective on every rank: call it on
    all of them."""
    if isinstance(out, PlanOutput):
        return PlanOutput(out.loss, whole(out.output, gather))
    leaves, spec = tree_flatten(out)
    new = [gather(x, p) if isinstance(x, torch.Tensor) and (p := piece_of(x)) is not None else x for x in leaves]
    rebuilt = tree_unflatten(new, spec)
    if dataclasses.is_dataclass(out) and isinstance(out, Mapping) and type(rebuilt) is not type(out):
        return type(out)(**dict(rebuilt))
    return rebuilt
