"""Symbolic profile of a model: per-module flops and memory classes, on the meta device.

One forward and one backward run on meta tensors (no compute, no memory), observed three ways
(map-memory-aware-auto-parallel §4.1, Fig. 3):

* flops of every aten op, from torch.utils.flop_counter's formulas, attributed to the innermost module
  running it — in forward through forward hooks, in backward through module backward hooks;
* the bytes every other op reads and writes (its tensor inputs and outputs; views move none), attributed
  the same way: what a memory-bound op (a norm, an activation, a softmax, dropout, a cast) costs on a
  device with a declared memory bandwidth (the roofline of docs/step_time.md);
* the tensors autograd saves for backward (`saved_tensors_hooks`), attributed to the module whose forward
  saved them and deduplicated by storage (a tensor saved by two ops is held once) — the module's
  `fwd_in` in map's terms, parameters excluded;
* the bytes of each module's output (`fwd_out`) and of the gradients its backward produces for its
  inputs (`bwd_out`).

Transient memory (`fwd_tmp`, `bwd_tmp`) is the largest live tensor set inside one op call beyond its
inputs and outputs; here it is approximated by the op's output bytes that are not saved (freed right
after), which bounds the temporaries of composite ops from below.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from planlang.model.capture.simulate import DEVICE, Existing, MetaOpCache, fused_attention
from planlang.model.capture.trace import bind_inputs
from planlang.model.capture.valueless import meta_or_fake


@dataclass
class ModuleProfile:
    path: str
    type: str
    params: int = 0  # parameter elements owned directly or below (shared counted once, at first owner)
    param_bytes: int = 0
    fwd_flops: int = 0  # flops of ops run directly in this module (not in children)
    bwd_flops: int = 0
    fwd_bytes: int = 0  # bytes read and written by ops with no flop formula (memory-bound), run directly here
    bwd_bytes: int = 0
    saved_bytes: int = 0  # fwd_in: activations saved for backward by ops run directly in this module
    out_bytes: int = 0  # fwd_out
    grad_in_bytes: int = 0  # bwd_out: gradients w.r.t. the module's tensor inputs
    calls: int = 0


@dataclass
class Profile:
    modules: dict[str, ModuleProfile]  # execution order ("" is the root)
    total_fwd_flops: int = 0
    total_bwd_flops: int = 0
    total_saved_bytes: int = 0
    param_bytes: int = 0
    total_fwd_bytes: int = 0
    total_bwd_bytes: int = 0
    notes: list[str] = field(default_factory=list)

    def subtree(self, path: str) -> ModuleProfile:
        """Aggregate of a module and everything below it."""
        agg = ModuleProfile(path, self.modules[path].type if path in self.modules else "?")
        prefix = path + "." if path else ""
        for name, m in self.modules.items():
            if name == path or name.startswith(prefix):
                agg.fwd_flops += m.fwd_flops
                agg.bwd_flops += m.bwd_flops
                agg.fwd_bytes += m.fwd_bytes
                agg.bwd_bytes += m.bwd_bytes
                agg.saved_bytes += m.saved_bytes
        if path in self.modules:
            me = self.modules[path]
            agg.params, agg.param_bytes, agg.out_bytes, agg.calls = me.params, me.param_bytes, me.out_bytes, me.calls
            agg.grad_in_bytes = me.grad_in_bytes
        return agg


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


_aten = torch.ops.aten
# the CPU flash-attention ops (what `fused_attention` routes meta calls to) count like the CUDA flash ops
_FLOP_ALIASES = {
    _aten._scaled_dot_product_flash_attention_for_cpu: _aten._scaled_dot_product_flash_attention,
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: None,
}


def _cpu_flash_backward_flops(args) -> int:
    # a fused attention backward recomputes QK^T and runs 4 more matmuls (dV, dP, dQ, dK): 5 bmms in all,
    # torch.utils.flop_counter's count for the fused backward ops

    grad_out, q, k, v = args[:4]
    return int(sdpa_backward_flop_count(tuple(grad_out.shape), tuple(q.shape), tuple(k.shape), tuple(v.shape)))


# ops that allocate or relabel storage without reading or writing it
_NO_TRAFFIC = frozenset({_aten._unsafe_view, _aten.empty, _aten.empty_like, _aten.empty_strided,
                         _aten.new_empty, _aten.new_empty_strided, _aten.lift_fresh, _aten.detach})


def _is_view(func) -> bool:
    """Whether every output of `func` aliases an input without writing it (a view: no data moved)."""
    rets = func._schema.returns
    return bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write for r in rets)


def _traffic(func, args, kwargs, out) -> int:
    """Bytes a memory-bound op moves: each tensor it reads and each it writes (an in-place op both reads
    and writes its input). Every argument counts, with no deduplication by storage or identity: the
    count must not depend on which fake tensors a cache handed out. An embedding reads only the rows it
    gathers (as many bytes as it writes), not its whole table."""
    if func._overloadpacket in _NO_TRAFFIC or _is_view(func):
        return 0
    written = sum(_nbytes(t) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
    if func._overloadpacket is _aten.embedding:
        return 2 * written + _nbytes(args[1])
    return written + sum(_nbytes(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor))


class _FlopMode(TorchDispatchMode):
    """Counts each op's flops (ops with a formula) or, for the others, the bytes it moves, into
    `sink(flops, bytes)` (bytes always 0 unless `traffic`)."""

    def __init__(self, sink, existing: Existing, traffic: bool = True):
        super().__init__()
        self.sink = sink
        self.existing = existing
        self.traffic = traffic

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is DEVICE:
            return func(*args)
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.existing.is_view_of_existing(func, args, kwargs, out):
            return out
        packet = func._overloadpacket
        if packet is _aten._scaled_dot_product_flash_attention_for_cpu_backward:
            self.sink(_cpu_flash_backward_flops(args), 0)
            return out
        fn = flop_registry.get(_FLOP_ALIASES.get(packet) or packet)
        if fn is not None:
            q, k, v = args[:3] if packet is _aten._scaled_dot_product_flash_attention_for_cpu else (None,) * 3
            if q is not None:
                self.sink(int(sdpa_flop_count(tuple(q.shape), tuple(k.shape), tuple(v.shape))), 0)
            else:
                self.sink(int(fn(*args, **kwargs, out_val=out)), 0)
        elif self.traffic:
            self.sink(0, _traffic(func, args, kwargs, out))
        return out


def profile_model(module: torch.nn.Module, inputs: dict[str, torch.Tensor], loss=None) -> Profile:
    """Profile one training step's forward and backward of `module` (its tensors should be on meta).

    `loss(output, inputs) -> scalar` defaults to the sum of the first output. Models that modify a module's
    output in place (ReLU(inplace=True) after a BatchNorm) cannot take module backward hooks; for them
    backward flops are attributed to the root module (totals unchanged), with a note."""

    try:
        return meta_or_fake(lambda: _profile(module, inputs, loss, backward_hooks=True))
    except RuntimeError as err:
        if "BackwardHookFunction" not in str(err):
            raise
        prof = meta_or_fake(lambda: _profile(module, inputs, loss, backward_hooks=False))
        prof.notes.append("backward flops attributed to the whole model (in-place ops on module outputs)")
        return prof


def _profile(module: torch.nn.Module, inputs: dict[str, torch.Tensor], loss, backward_hooks: bool) -> Profile:
    names = {id(m): n for n, m in module.named_modules(remove_duplicate=False)}
    profiles: dict[str, ModuleProfile] = {}
    stack: list[str] = []
    param_storages = Existing(module.parameters())
    seen_saved: set[int] = set()
    handles = []

    def current() -> ModuleProfile:
        return profiles[stack[-1]] if stack else profiles[""]

    def pre(mod, args):
        name = names.get(id(mod), "")
        if name not in profiles:
            profiles[name] = ModuleProfile(name, type(mod).__name__)
        profiles[name].calls += 1
        stack.append(name)

    def post(mod, args, out):
        name = stack.pop() if stack else ""
        p = profiles[name]
        if p.calls == 1:
            p.out_bytes = sum(_nbytes(t) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))

    def bwd_pre(mod, grad_out):
        stack.append(names.get(id(mod), ""))

    def bwd_post(mod, grad_in, grad_out):
        name = stack.pop() if stack else ""
        p = profiles.get(name)
        if p is not None and p.grad_in_bytes == 0:
            p.grad_in_bytes = sum(_nbytes(g) for g in grad_in if isinstance(g, torch.Tensor))

    def pack(t: torch.Tensor):
        key = t.untyped_storage()._cdata
        if key not in param_storages and key not in seen_saved:
            seen_saved.add(key)
            current().saved_bytes += t.untyped_storage().nbytes()
        return t

    phase = {"bwd": False}

    def count(flops: int, moved: int) -> None:
        p = current()
        if phase["bwd"]:
            p.bwd_flops += flops
            p.bwd_bytes += moved
        else:
            p.fwd_flops += flops
            p.fwd_bytes += moved

    profiles[""] = ModuleProfile("", type(module).__name__)
    for m in {id(m): m for m in module.modules()}.values():
        if m is module:
            continue
        handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
        if backward_hooks:
            handles += [m.register_full_backward_pre_hook(bwd_pre), m.register_full_backward_hook(bwd_post)]
    notes: list[str] = []
    # gradients left by an earlier run (the simulation's) would make backward add into them (an op that
    # moves bytes) where a first backward only sets them: the profile starts without any, so it prices
    # the same backward whatever ran before it
    held = [(p, p.grad) for p in module.parameters()]
    for p, _ in held:
        p.grad = None
    try:
        args, kwargs = bind_inputs(module, inputs)
        with MetaOpCache(), _FlopMode(count, param_storages), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), fused_attention(), \
                warnings.catch_warnings():
            # a module returning a ModelOutput (Hugging Face) gets no backward hook call: its backward is
            # counted in the enclosing module's, and torch's warning about it is not the user's concern
            warnings.filterwarnings("ignore", message="For backward hooks to be called")
            out = module(*args, **kwargs)
        first = next((t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)), None)
        profiles[""].out_bytes = _nbytes(first) if first is not None else 0
        scalar = loss(out, inputs) if loss is not None else (first.float().sum() if first is not None else None)
        if scalar is not None and scalar.requires_grad:
            phase["bwd"] = True

            with MetaOpCache(), _FlopMode(count, param_storages), warnings.catch_warnings(), fused_attention():
                # the first module sees no input that requires grad; its hook still reports, as intended
                warnings.filterwarnings("ignore", message="Full backward hook is firing")
                scalar.backward()
        else:
            notes.append("no backward: the output does not require grad")
    finally:
        for h in handles:
            h.remove()
        for p, g in held:
            p.grad = g
    # parameters: attribute each (shared ones once) to the module that owns it directly
    seen_params: set[int] = set()
    for name, mod in module.named_modules():
        prof = profiles.get(name)
        for p in mod.parameters(recurse=False):
            if id(p) in seen_params:
                continue
            seen_params.add(id(p))
            if prof is None:
                prof = profiles.setdefault(name, ModuleProfile(name, type(mod).__name__))
            prof.params += p.numel()
            prof.param_bytes += _nbytes(p)
    # roll parameter counts up the tree
    for name in sorted(profiles, key=lambda n: -n.count(".") if n else 1):
        if not name:
            continue
        parent = name.rsplit(".", 1)[0] if "." in name else ""
        while parent not in profiles and parent:
            parent = parent.rsplit(".", 1)[0] if "." in parent else ""
        profiles[parent].params += profiles[name].params
        profiles[parent].param_bytes += profiles[name].param_bytes
    return Profile(
        modules=profiles,
        total_fwd_flops=sum(p.fwd_flops for p in profiles.values()),
        total_bwd_flops=sum(p.bwd_flops for p in profiles.values()),
        total_saved_bytes=sum(p.saved_bytes for p in profiles.values()),
        param_bytes=profiles[""].param_bytes,
        total_fwd_bytes=sum(p.fwd_bytes for p in profiles.values()),
        total_bwd_bytes=sum(p.bwd_bytes for p in profiles.values()),
        notes=notes,
    )
