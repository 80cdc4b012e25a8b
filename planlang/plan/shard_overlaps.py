"""Shard statements whose selections overlap on the model's real names (PL310, model-aware).

Two statements with different texts can select the same parameter (`shard fc*.weight : [tp, _]` and
`shard fc2.weight : [_, tp]`). The language has no precedence between them (docs/language.md §14.1:
a target sharded twice with different specs is PL310), so the overlap is found against the names the
model really has, not the statements' texts. Torch-free: the names are plain strings (the model layer's
probe supplies them as `ctx.facts["model"]`).
"""
from __future__ import annotations


from planlang.lang.frozen import value_type
from . import types as T


@value_type
class Overlap:
    """`later` gives `names` (torch names, in the model's order) another spec than `earlier` did."""

    later: T.ShardRule
    earlier: T.ShardRule
    names: tuple[str, ...]


def plan_name(name: str) -> str:
    """`h.0.attn` -> `h[0].attn`: a torch name as a plan writes it."""
    out = ""
    for part in name.split("."):
        out += f"[{part}]" if part.isdigit() else ("." if out else "") + part
    return out


def shard_overlaps(shards, names_by_kind: dict[str, list[str]]) -> list[Overlap]:
    """Each later shard statement that selects a name an earlier one selected, with a different spec:
    one Overlap per (later, earlier) pair. `names_by_kind`: the model's parameter names for "param"
    rules, its module names for "output"/"input" rules. Rules with the same text are left to the
    model-free check (which also covers targets the model does not have)."""
    first: dict[tuple[str, str], T.ShardRule] = {}  # (kind, name) -> the first rule selecting it
    found: dict[tuple[int, int], list[str]] = {}
    pairs: dict[tuple[int, int], tuple[T.ShardRule, T.ShardRule]] = {}
    for r in shards:
        for name in r.target.select(names_by_kind.get(r.kind, ())):
            e = first.setdefault((r.kind, name), r)
            if e is r or e.spec == r.spec or e.target == r.target:
                continue
            key = (id(r), id(e))
            pairs[key] = (r, e)
            found.setdefault(key, []).append(name)
    return [Overlap(r, e, tuple(found[key])) for key, (r, e) in pairs.items()]
