"""Run one training step's forward and backward on meta tensors and follow every live tensor.

A dispatch mode sees each tensor an op creates; a finalizer on its storage sees it die. Tensors that
existed before the step (parameters, buffers, inputs) are not counted. The result is the live-bytes
curve of the step as eager PyTorch would run it — same ops, same frees, same autograd saving — with no
memory allocated (map-memory-aware-auto-parallel §4.1's meta execution, measured rather than modelled).
"""
from __future__ import annotations

import functools

import contextlib
import weakref
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from planlang.model.capture.autocast import active_meta_autocast
from planlang.model.capture.trace import bind_inputs
from planlang.model.capture.valueless import meta_or_fake


@contextlib.contextmanager
def fused_attention():
    """On meta, scaled_dot_product_attention falls back to the math path, which materialises and saves
    the attention matrix; real devices run a fused kernel (CPU flash attention, CUDA flash / memory
    efficient) that saves only the output and the log-sum-exp. Route meta calls to the CPU flash op so
    the simulated memory matches what the devices will do."""
    real = F.scaled_dot_product_attention

    def fused(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if (query.device.type == "meta" and dropout_p == 0.0 and not enable_gqa
                and query.dtype in (torch.float32, torch.bfloat16, torch.float16) and query.dim() == 4
                and _fused_mask(attn_mask, query, key)):
            if attn_mask is not None and attn_mask.dtype == torch.bool:
                # as torch's dispatcher does before a fused kernel: the boolean mask made additive, in the
                # query's dtype (a tensor of the mask's shape that the kernel then saves for backward)
                attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype, device=query.device).masked_fill(
                    attn_mask.logical_not(), float("-inf"))
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                query, key, value, 0.0, is_causal, attn_mask=attn_mask, scale=scale)[0]
        return real(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                    enable_gqa=enable_gqa)

    F.scaled_dot_product_attention = fused
    try:
        yield
    finally:
        F.scaled_dot_product_attention = real


def _fused_mask(mask, query, key) -> bool:
    """Whether a fused kernel takes `mask` (none, or one of query x key positions broadcast over the batch
    and heads: a Hugging Face model's mask under fake tensors, which would otherwise take the math path
    and materialise every head's scores, ~3x a long-sequence decoder's saved activations)."""
    if mask is None:
        return True
    if mask.dim() != 4 or mask.dtype not in (torch.bool, query.dtype) or mask.requires_grad:
        return False  # a learned bias (T5's positions): the fused kernels have no gradient for it
    b, h, q, k = query.shape[0], query.shape[1], query.shape[2], key.shape[2]
    return all(m in (1, n) for m, n in zip(mask.shape, (b, h, q, k))) and tuple(mask.shape[2:]) == (q, k)


class MetaOpCache(TorchDispatchMode):
    """Outputs of meta kernels, remembered by what they depend on (the op, its tensor arguments' shapes,
    strides and dtypes, its other arguments): a later call with the same key gets fresh tensors of the
    remembered shapes, strides and dtypes (`torch.empty_strided` on meta) without running the kernel
    again. On meta an op's result is a function of its arguments' metadata alone, and many aten meta
    kernels are Python (torch._refs, torch._decomp: a layer norm's backward takes ~5 ms of Python), so a
    step of a model of n identical blocks runs each block type's kernels once, not n times, and the
    solver's candidates that share shapes (most of them) share the kernels' work.

    Only what a fresh tensor reproduces exactly is remembered: out-of-place ops (no view, no mutation)
    on plain meta tensors (not fake, not complex, no symbolic sizes), whose outputs are new storages of
    exactly the bytes `empty_strided` allocates, at offset 0, none aliasing an argument or another
    output, with only tensors, ints, floats, bools and None among the results. Anything else runs the
    kernel every time. Enter it outside the observing modes (simulate.LiveBytes, profile._FlopMode):
    they see each op first and the cache answers their call, so they observe the same tensors, sizes
    and frees as without it (tests/model/test_meta_cache.py compares simulations and profiles)."""

    MAX_ENTRIES = 200_000  # emptied when full (entries are a few hundred bytes)
    enabled = True  # False: every kernel runs (the tests compare both)

    def __init__(self, table: dict | None = None) -> None:
        super().__init__()
        self.table = _META_OPS if table is None else table
        self.hits = 0
        self.misses = 0

    def __enter__(self):
        # under FakeTensorMode (valueless.meta_or_fake) every output is a fake tensor, never remembered: the
        # mode would only add a layer to each op's dispatch (about 7 us), so it is not entered
        self._idle = _fake_mode() is not None
        return self if self._idle else super().__enter__()

    def __exit__(self, *exc):
        return None if self._idle else super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        key = _op_key(func, args, kwargs) if self.enabled else None
        if key is None:
            return func(*args, **kwargs)
        got = self.table.get(key)
        if got is not None:
            if got is _UNCACHEABLE:
                return func(*args, **kwargs)
            self.hits += 1
            spec, leaves = got
            return tree_unflatten([torch.empty_strided(x[0], x[1], dtype=x[2], device="meta")
                                   if type(x) is _Meta else x for x in leaves], spec)
        self.misses += 1
        out = func(*args, **kwargs)
        if len(self.table) >= self.MAX_ENTRIES:
            self.table.clear()
        self.table[key] = _remembered(out, args, kwargs)
        return out


DEVICE = torch.ops.prim.device.default


class _Meta(tuple):
    """(shape, stride, dtype) of a remembered output."""


_UNCACHEABLE = object()
_META_OPS: dict = {}  # keys are pure op metadata (no model, no file): shared by every estimate of a process
_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout)


def _fake_mode():
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)


def _op_key(func, args, kwargs):
    if func.is_view or func._schema.is_mutable:
        return None
    try:
        return func, _key(args), _key(kwargs) if kwargs else ()
    except _NotRemembered:
        return None


class _NotRemembered(Exception):
    pass


def _key(x):
    t = type(x)
    if t is torch.Tensor or t is torch.nn.Parameter:
        if x.device.type != "meta" or x.is_complex() or x.layout != torch.strided:
            raise _NotRemembered
        return x.shape, x.stride(), x.dtype
    if t in _PLAIN:
        return t, x
    if t is tuple or t is list:
        return t, tuple(_key(v) for v in x)
    if t is dict:
        return t, tuple((k, _key(v)) for k, v in x.items())
    raise _NotRemembered  # a fake tensor, a SymInt, anything else: not remembered


def _remembered(out, args, kwargs):
    leaves, spec = tree_flatten(out)
    seen = {x.untyped_storage()._cdata for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)}
    kept = []
    for x in leaves:
        if type(x) is torch.Tensor:
            st = x.untyped_storage()
            if x.device.type != "meta" or x.storage_offset() != 0 or st._cdata in seen or x.layout != torch.strided:
                return _UNCACHEABLE
            seen.add(st._cdata)
            meta = _Meta((tuple(x.shape), tuple(x.stride()), x.dtype))
            if torch.empty_strided(meta[0], meta[1], dtype=meta[2], device="meta").untyped_storage().nbytes() != st.nbytes():
                return _UNCACHEABLE
            kept.append(meta)
        elif type(x) in (int, float, bool, type(None)):
            kept.append(x)
        else:
            return _UNCACHEABLE
    return spec, tuple(kept)


class Existing:
    """Storage keys of the tensors that exist before a simulated step (parameters, buffers, inputs),
    and of views of them while those views live. Under FakeTensorMode a meta parameter is converted to
    a fake tensor with a storage of its own each time an op reads it (a fresh one per op, so it cannot
    be listed in advance): a view of it (`weight.t()` for a linear layer, which autograd then saves)
    must count as the parameter, not as a new tensor of its size."""

    def __init__(self, tensors=()) -> None:
        self.keys = {t.untyped_storage()._cdata for t in tensors}
        self.views: set[int] = set()

    def __contains__(self, key: int) -> bool:
        return key in self.keys or key in self.views

    def add(self, key: int) -> None:
        self.keys.add(key)

    def is_view_of_existing(self, func, args, kwargs, out) -> bool:
        """Whether `out` of `func(*args, **kwargs)` views an existing tensor (and remember it if so)."""
        if not func.is_view or not any(isinstance(a, torch.Tensor) and a.untyped_storage()._cdata in self
                                       for a in tree_flatten((args, kwargs))[0]):
            return False
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and (key := t.untyped_storage()._cdata) not in self:
                self.views.add(key)
                weakref.finalize(t.untyped_storage(), self.views.discard, key)
        return True


class LiveBytes(TorchDispatchMode):
    """Live bytes of the tensors created under it, in total and per owner (a pipeline stage: whatever
    `self.owner` holds when a tensor is created)."""

    def __init__(self, ignore: Existing):
        super().__init__()
        self.ignore = ignore
        self.sizes: dict[int, int] = {}
        self.owners: dict[int, object] = {}
        self.live = 0
        self.peak = 0
        self.owner: object = None
        self.owner_live: dict[object, int] = {}
        self.owner_peak: dict[object, int] = {}
        # the part of the step running now (`enter`) and the most bytes live in each part
        self.segment: object = None
        self.segment_peak: dict[object, int] = {}
        self.segment_start: dict[object, int] = {}  # the bytes live when a part is first entered
        # the same peaks by phase too (0: forward, 1: backward, 2 and 3: the accumulated pass's), and the
        # bytes live when each phase began: what a folded run (fold_step) extrapolates part by part
        self.phase = 0
        self.phase_peak: dict[tuple[int, object], int] = {}
        self.phase_start: dict[int, int] = {0: 0}
        self.phase_entered: dict[tuple[int, object], int] = {}  # the bytes live when a part is first entered

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is DEVICE:  # a fake tensor's device, asked by autograd thousands of times: no tensor
            return func(*args)
        out = func(*args, **(kwargs or {}))
        if self.ignore.is_view_of_existing(func, args, kwargs, out):
            return out
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                key = st._cdata
                if key in self.ignore or key in self.sizes:
                    continue
                n = st.nbytes()
                self.sizes[key] = n
                self.owners[key] = self.owner
                self.live += n
                self.peak = max(self.peak, self.live)
                o = self.owner
                self.owner_live[o] = self.owner_live.get(o, 0) + n
                self.owner_peak[o] = max(self.owner_peak.get(o, 0), self.owner_live[o])
                if self.segment is not None:
                    if self.live > self.segment_peak.get(self.segment, 0):
                        self.segment_peak[self.segment] = self.live
                    at = (self.phase, self.segment)
                    if self.live > self.phase_peak.get(at, 0):
                        self.phase_peak[at] = self.live
                weakref.finalize(st, self._free, key)
        return out

    def _free(self, key: int) -> None:
        n = self.sizes.pop(key, 0)
        self.live -= n
        o = self.owners.pop(key, None)
        if n:
            self.owner_live[o] = self.owner_live.get(o, 0) - n

    def enter(self, segment: object) -> None:
        """The step's next part begins (what is live now counts toward its peak)."""
        self.segment = segment
        self.segment_peak[segment] = max(self.segment_peak.get(segment, 0), self.live)
        self.segment_start.setdefault(segment, self.live)
        at = (self.phase, segment)
        self.phase_peak[at] = max(self.phase_peak.get(at, 0), self.live)
        self.phase_entered.setdefault(at, self.live)

    def next_phase(self) -> None:
        self.phase += 1
        self.phase_start[self.phase] = self.live

    def reset_peak(self) -> None:
        self.peak = self.live
        self.owner_peak = dict(self.owner_live)


@dataclass(frozen=True)
class StepMemory:
    """Bytes of one simulated forward + backward (parameters and inputs excluded)."""

    saved: int  # live at the end of forward: activations autograd keeps, plus the output and loss
    forward_peak: int  # peak during forward
    backward_peak: int  # peak during backward, gradients included
    grads: int  # live after backward: the parameter gradients (.grad)
    output: int = 0  # bytes of the loss (freed after backward in the canonical loop)
    # per pipeline stage (when `stage_of` is given): saved at the end of forward, peak during backward,
    # of the tensors the stage's modules created
    stage_saved: dict = field(default_factory=dict)
    stage_backward_peak: dict = field(default_factory=dict)
    # with `accumulate`: the peak of a second backward run while the first one's parameter gradients are
    # still live (gradient accumulation over microbatches), in total and per stage; gradients included
    backward_peak_accum: int = 0
    stage_backward_peak_accum: dict = field(default_factory=dict)
    # bytes of the parameter gradients after backward, by the stage whose backward created them (a weight
    # tied across stages has one gradient here, owned by the stage that reached it first)
    stage_grads: dict = field(default_factory=dict)
    # with `blocks` (repeated blocks, in execution order): the most bytes live in each part of the step,
    # ("F", i) the forward of block i (-1: the root code before the first), ("F+", i) the root code after
    # it (the loss after the last), ("B", i) the backward from block i's output on (n: the head's and the
    # loss's); and each block's parameter gradients. What FSDP2 adds per part (ZeRO-3 per block) is the
    # estimator's (estimate._zero_blocks_peak)
    segments: dict = field(default_factory=dict)
    # the bytes live when each part began: ("B", i - 1)'s is what is live when block i's backward is done
    segment_starts: dict = field(default_factory=dict)
    block_grads: tuple[int, ...] = ()


def simulate_step(module: torch.nn.Module, inputs: dict[str, torch.Tensor], loss=None,
                  stage_of: dict[str, int] | None = None, accumulate: bool = False,
                  blocks: tuple[str, ...] = (), phases: dict | None = None,
                  tracker: type[LiveBytes] | None = None) -> StepMemory:
    """Forward, loss (sum of the first output unless `loss(out, inputs)` is given) and backward on meta
    (as a trace or on fake tensors, for models that read values: valueless.meta_or_fake). With `stage_of` (module
    name -> pipeline stage), bytes are also attributed to the stage whose module created them. With
    `accumulate`, a second forward and backward follow with the first one's gradients kept, as for the
    second and later microbatches of a pipeline: autograd then computes each parameter's gradient into
    a temporary and adds it to the live `.grad`, so every gradient is live throughout that backward.
    `phases` (with `blocks`), a dict, receives the peak of each part in each phase ("peak": (phase, part)
    -> bytes; phases 0 and 1 the forward and backward, 2 and 3 the accumulated pass's), the bytes live
    when each phase began ("start") and when each part was first entered in each phase ("entered"): what
    planlang.model.capture.fold_step extrapolates. `tracker`: the LiveBytes (sub)class that follows the
    tensors (planlang.model.price.stage_replay's records what it sees)."""
    return meta_or_fake(lambda: _simulate_once(module, inputs, loss, stage_of, accumulate, blocks, phases,
                                               tracker or LiveBytes))


def _stage_hooks(module: torch.nn.Module, mode: "LiveBytes", stage_of: dict[str, int]) -> list:
    """Module forward hooks that keep `mode.owner` at the stage of the running module, and in backward at
    the stage whose module output's gradient autograd is working on."""
    names = {id(m): n for n, m in module.named_modules(remove_duplicate=False)}
    stack: list[object] = []
    handles = []
    # code of the root module between stage modules (a functional relu after a stage's last module)
    # runs in the stage of the module that ran last, as torch.distributed.pipelining cuts each stage at
    # the beginning of its first module; before any module, in the first stage
    last = [min(stage_of.values())]
    mode.owner = last[0]

    def enter(mod, *_):
        s = stage_of.get(names.get(id(mod), ""))
        stack.append(mode.owner)
        if s is not None:
            mode.owner = last[0] = s

    def leave(mod, args, out):
        prev = stack.pop() if stack else None
        mode.owner = prev if stack else last[0]
        s = stage_of.get(names.get(id(mod), ""))
        if s is not None:
            # backward: a stage owns what is allocated from the backward of its module's output on, until
            # another stage's module output is reached. A hook on the output's autograd node, not a module
            # backward hook: those keep the module's output gradient alive until the module's whole
            # backward ends, which the real stage does not (it overstated a stage's backward peak)
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                    t.grad_fn.register_prehook(functools.partial(_own, mode, last, s))

    for m in {id(m): m for m in module.modules()}.values():
        if m is module:
            continue
        handles += [m.register_forward_pre_hook(enter), m.register_forward_hook(leave)]
    return handles


def _own(mode: "LiveBytes", last: list, stage: int, grad_outputs):
    mode.owner = last[0] = stage


def _block_hooks(module: torch.nn.Module, mode: "LiveBytes", blocks: tuple[str, ...]) -> list:
    """Hooks that name the part of the step running (`StepMemory.segments`): a block's forward, the root
    code after it, and in backward, from a block's output gradient on, that block's backward; from the
    first block's input gradient on, the root code's backward before it, ("B", -1)."""
    handles = []
    for i, name in enumerate(blocks):
        m = module.get_submodule(name)

        def before(_mod, args, i=i):
            mode.enter(("F", i))
            if i == 0:
                for t in tree_flatten(args)[0]:
                    if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                        t.grad_fn.register_prehook(lambda _g: mode.enter(("B", -1)))

        def after(_mod, _args, out, i=i):
            mode.enter(("F+", i))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                    t.grad_fn.register_prehook(lambda _g, i=i: mode.enter(("B", i)))

        handles += [m.register_forward_pre_hook(before), m.register_forward_hook(after)]
    return handles


def _simulate_once(module, inputs, loss, stage_of, accumulate: bool = False,
                   blocks: tuple[str, ...] = (), phases: dict | None = None,
                   tracker: type[LiveBytes] | None = None) -> StepMemory:
    ignore = Existing([*module.parameters(), *module.buffers(), *inputs.values()])
    for p in module.parameters():
        p.grad = None
    mode = (tracker or LiveBytes)(ignore)
    args, kwargs = bind_inputs(module, inputs)
    handles = _stage_hooks(module, mode, stage_of) if stage_of else []
    handles += _block_hooks(module, mode, blocks)
    last_stage = max(stage_of.values()) if stage_of else None
    try:
        with MetaOpCache(), fused_attention():  # the cache outside LiveBytes: see MetaOpCache
            if blocks:
                mode.enter(("F", -1))
            first = _run(module, args, kwargs, inputs, loss, mode, last_stage, len(blocks) if blocks else None)
            if blocks:
                grads: dict[int | None, int] = {}  # bytes per block (None: outside every block)
                for n, p in module.named_parameters():
                    if p.grad is not None:
                        b = next((i for i, name in enumerate(blocks) if n.startswith(name + ".")), None)
                        grads[b] = grads.get(b, 0) + p.grad.untyped_storage().nbytes()
                first = replace(first, segments=dict(mode.segment_peak), segment_starts=dict(mode.segment_start),
                                block_grads=tuple(grads.get(i, 0) for i in range(len(blocks))))
            if phases is not None:
                phases.update(peak=mode.phase_peak, start=mode.phase_start, entered=mode.phase_entered)
            if not accumulate:
                return first
            # the first pass's gradients stay live (owned by the stage whose backward made them)
            mode.next_phase()
            again = _run(module, args, kwargs, inputs, loss, mode, last_stage)
            return replace(first, backward_peak_accum=again.backward_peak,
                           stage_backward_peak_accum=dict(again.stage_backward_peak))
    finally:
        for h in handles:
            h.remove()


def _end_autocast_region() -> None:
    """The training loop's autocast region ends with the loss (the runtime's `torch.autocast` covers
    forward and loss): the weight casts it cached live on only where autograd saved them, and are freed
    by backward as it goes. The MetaAutocast around the simulation drops its cache here, as autocast does
    when its region ends (checkpoint recomputation casts in a region of its own: recompute.checkpoint)."""
    meta = active_meta_autocast()
    if meta is not None:
        meta.release()


def _run(module, args, kwargs, inputs, loss, mode: "LiveBytes", last_stage, blocks: int | None = None) -> StepMemory:
    # a pipeline (`last_stage` set) keeps each microbatch's output until that microbatch's backward has
    # run (torch.distributed.pipelining's fwd_cache hands it to the stage's backward): the last stage
    # holds its output (the logits) beside what autograd saves, which the canonical loop below drops
    keep_output = last_stage is not None
    if True:  # forward and backward: checkpoint recomputation must take the same path
        with mode:
            out = module(*args, **kwargs)
            first = next(t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
            mode.owner = last_stage  # the loss is computed on the last stage
            scalar = loss(out, inputs) if loss is not None else first.float().sum()
            # the canonical loop: `loss = loss_fn(model(x), y); loss.backward()` — the output itself is
            # dropped before backward (autograd keeps what it saved); the loss after it
            if not keep_output:
                del out
            del first
        saved, fwd_peak = mode.live, mode.peak
        stage_saved = dict(mode.owner_live)
        output = scalar.untyped_storage().nbytes()
        mode.reset_peak()
        mode.next_phase()
        if blocks is not None:
            mode.enter(("B", blocks))  # the loss's and the head's backward, before the last block's
        _end_autocast_region()
        with mode:
            scalar.backward()
        if blocks is not None:  # the first block's input has no gradient: its backward ends the step's
            mode.segment_start.setdefault(("B", -1), mode.live)
    del scalar
    if keep_output:
        del out
    bwd_peak = mode.peak
    grads = 0
    stage_grads: dict = {}
    for key, nbytes in {p.grad.untyped_storage()._cdata: p.grad.untyped_storage().nbytes()
                        for p in module.parameters() if p.grad is not None}.items():
        grads += nbytes
        o = mode.owners.get(key)
        stage_grads[o] = stage_grads.get(o, 0) + nbytes
    return StepMemory(saved, fwd_peak, bwd_peak, grads, output, stage_saved, dict(mode.owner_peak),
                      stage_grads=stage_grads)
