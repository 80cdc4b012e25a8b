"""A model's repeated blocks, run as a few and extrapolated to all (issue #29: a transformer's N identical
layers are traced, profiled and priced once, not N times).

Every fact planlang computes by running a model on meta — the op graph, the profile's flops, the simulated
step's live bytes — is, for a stack of identical blocks, the same for every interior block, and affine in
the number of blocks where it sums over them (flops, saved activations, gradients) or follows one of them
(the live bytes while block i runs: the activations of the i blocks before it and the gradients of those
after it). So the model is run with its block list cut to its first `k` entries (`truncated`), for the
`FOLD_RUNS` counts, and each consumer extrapolates what it measured to the model's N blocks:

* `find_fold` finds the list (the largest nn.ModuleList of structurally identical entries: same classes,
  parameter and buffer shapes, plain attributes, an attribute that is the entry's own index excepted);
* `planlang.model.price.block_fold.plan_fold` says whether a plan treats every block alike (parameter specs and local shapes, activation
  rules, checkpoint groups, no pipeline: a stage boundary between blocks makes them differ), and why not;
* `truncated` cuts the list for one run and counts the kept blocks' calls, so a model whose forward does
  not run its list entry by entry (`for layer in self.layers`, HF's `self.layers[:n]`) is found out
  (`FoldError`) instead of extrapolated wrong.

A consumer that cannot fold runs the whole model; folding changes how long a fact takes, never its value
(the consumers' tests compare both on Llama, Qwen2, Mistral and GPT-2 configurations).
"""
from __future__ import annotations

import contextlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterator

from torch import nn

FOLD_RUNS = (3, 4)  # the truncated runs' block counts: first, interior and last blocks, twice
MIN_BLOCKS = 6  # a list of fewer blocks runs whole (the truncated runs would cost about as much)


class FoldError(Exception):
    """The truncated model did not run its kept blocks once each per forward: the facts cannot be
    extrapolated; the caller runs the whole model."""


@dataclass(frozen=True)
class Fold:
    """The repeated blocks `container.0` .. `container.{count-1}` of a model."""

    container: str  # the nn.ModuleList's path ("" when the root is the list)
    count: int

    def __str__(self) -> str:
        return f"{self.container or '<root>'} x{self.count}"

    def block(self, i: int) -> str:
        return f"{self.container}.{i}" if self.container else str(i)

    def split(self, name: str) -> tuple[int, str] | None:
        """(block index, path inside the block) of a module or parameter path in a block; None outside."""
        prefix = self.container + "." if self.container else ""
        if not name.startswith(prefix):
            return None
        head, _, rest = name[len(prefix):].partition(".")
        return (int(head), rest) if head.isdigit() else None

    def rename(self, name: str, i: int) -> str:
        """`name` moved to block `i` (unchanged outside the blocks)."""
        got = self.split(name)
        if got is None:
            return name
        return self.block(i) + ("." + got[1] if got[1] else "")


def affine(at: dict[int, int], n: int) -> int:
    """The value at `n` blocks of a quantity affine in the block count, from its values at two counts
    (`at`: count -> value, the FOLD_RUNS). Integer exact when the quantity is affine."""
    (k1, v1), (k2, v2) = sorted(at.items())[:2]
    step, rem = divmod(v2 - v1, k2 - k1)
    if rem:
        raise FoldError(f"not affine in the block count: {v1} at {k1} blocks, {v2} at {k2}")
    return v2 + (n - k2) * step


# ------------------------------------------------------------------ finding the blocks
_PLAIN = (int, float, str, bool, type(None))


def _plain(v) -> bool:
    return type(v) in _PLAIN or (type(v) is tuple and all(type(x) in _PLAIN for x in v))


def _signature(block: nn.Module) -> list[tuple]:
    """What makes two blocks alike: every submodule's class, parameters, buffers and plain attributes."""
    out = []
    for name, m in block.named_modules(remove_duplicate=False):
        attrs = tuple(sorted((k, v) for k, v in vars(m).items() if not k.startswith("_") and _plain(v)))
        params = tuple((n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in m.named_parameters(recurse=False))
        buffers = tuple((n, tuple(b.shape), b.dtype) for n, b in m.named_buffers(recurse=False))
        out.append((name, type(m), attrs, params, buffers))
    return out


def _without_index(sigs: list[list[tuple]]) -> list[list[tuple]]:
    """The signatures without the attributes that hold each block's own index in every block (HF's
    `layer_idx`): a block's place, not its kind."""
    index_attrs = set.intersection(*({(j, k) for j, sub in enumerate(sig) for k, v in sub[2] if type(v) is int
                                      and v == i} for i, sig in enumerate(sigs)))
    return [[(sub[0], sub[1], tuple(a for a in sub[2] if (j, a[0]) not in index_attrs), *sub[3:])
             for j, sub in enumerate(sig)] for sig in sigs]


def find_fold(module: nn.Module, min_blocks: int = MIN_BLOCKS) -> Fold | None:
    """The model's largest list of at least `min_blocks` structurally identical blocks, or None."""
    best: Fold | None = None
    for name, m in module.named_modules():
        if not isinstance(m, nn.ModuleList) or len(m) < min_blocks or (best and len(m) <= best.count):
            continue
        entries = list(m)
        if len({id(e) for e in entries}) != len(entries):
            continue  # one module at two places: not N blocks
        sigs = _without_index([_signature(e) for e in entries])
        if all(s == sigs[0] for s in sigs[1:]):
            best = Fold(name, len(m))
    return best


# ------------------------------------------------------------------ running the first k blocks
@dataclass
class BlockCalls:
    """Forward calls of each kept block during a truncated run."""

    kept: int
    calls: list[int] = field(default_factory=list)

    def check(self) -> None:
        """FoldError unless every kept block ran, each as often as the first."""
        if not self.calls or self.calls[0] == 0 or any(c != self.calls[0] for c in self.calls):
            raise FoldError(f"the model ran its first {self.kept} blocks {self.calls} times: it does not "
                            "run its block list entry by entry")


@contextlib.contextmanager
def truncated(module: nn.Module, fold: Fold, k: int) -> Iterator[BlockCalls]:
    """`module` with its block list cut to the first `k` entries (restored on exit)."""
    holder = module.get_submodule(fold.container) if fold.container else module
    saved = holder._modules
    kept = OrderedDict(list(saved.items())[:k])
    counts = BlockCalls(k, [0] * k)
    handles = []
    for i, block in enumerate(kept.values()):
        def count(_m, _a, i=i):
            counts.calls[i] += 1
        if block is not None:
            handles.append(block.register_forward_pre_hook(count))
    holder._modules = kept
    try:
        yield counts
    finally:
        holder._modules = saved
        for h in handles:
            h.remove()


__all__ = ["FOLD_RUNS", "MIN_BLOCKS", "Fold", "FoldError", "affine", "find_fold", "truncated"]
