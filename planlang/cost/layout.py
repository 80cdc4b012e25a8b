"""Tensor layouts on a mesh and the exact cheapest conversion between two of them.

A layout is a global shape plus a `Spec` (planlang.plan.types): for each dim the mesh axes that split
it, major to minor, and the axes over which the local values are partial sums. On a device with mesh
coordinates c, dim d split by axes (a1, ..., ak) holds the chunk with index
((c[a1] * n[a2] + c[a2]) * n[a3] + ...) of size shape[d] / (n[a1] * ... * n[ak]).

One-step transforms (each on one mesh axis `a` of size n):
    all_gather(a, d)       a is the minor-most axis of dim d -> removed      fwd all-gather,  bwd free (slice)
    shard(a, d)            a unused -> appended to dim d (a local slice)     fwd free,        bwd all-gather
    all_to_all(a, d, e)    a minor-most on d -> minor-most on e              fwd all-to-all,  bwd all-to-all
    all_reduce(a)          partial(a) -> replicated over a                   fwd all-reduce,  bwd free
    reduce_scatter(a, d)   partial(a) -> a appended to dim d                 fwd reduce-scatter, bwd all-gather
    to_partial(a)          unused a -> partial(a) (rank 0 of the group keeps the value, others zero)
                                                                             fwd free,        bwd free

Gradient convention (shared with planlang.runtime.redistribute): the gradient of a replicated or
partial value is whole on every device of the axis (an op whose local gradients are partial sums, such
as a column-parallel linear's input gradient, reduces them itself — op rules price that all-reduce). So
the backward of an all-gather keeps the local chunk of the replicated gradient and costs nothing, while
the backward of a shard must all-gather the gradient pieces.

`conversion_path` runs Dijkstra over layout states with edge weight = forward + backward time, so the
path is optimal for a training step; map-memory-aware-auto-parallel §4.3 searches greedily with a
heuristic (`greedy_path` reproduces it as the baseline). Results are cached by (shape, src, dst, mesh).
"""
from __future__ import annotations

import heapq
import itertools
import math
import threading
from dataclasses import dataclass
from functools import lru_cache

from planlang.plan.types import Hole, Mesh, Spec

from .comm import Collective, CommCost, price


# ------------------------------------------------------------------------------ layouts
def normalize(spec: Spec, mesh: Mesh) -> Spec:
    """The canonical form: partial axes in mesh order (their order carries no meaning)."""
    order = {a: i for i, a in enumerate(mesh.names)}
    return Spec(spec.dims, tuple(sorted(spec.partial, key=lambda a: order.get(a, len(order)))))


def replicated(rank: int) -> Spec:
    return Spec(tuple(() for _ in range(rank)))


def is_valid(shape: tuple[int, ...], spec: Spec, mesh: Mesh) -> bool:
    """Every axis used at most once, known, and every split dim divisible by its axes' product."""
    if len(shape) != spec.rank or any(isinstance(d, Hole) for d in spec.dims):
        return False
    used = spec.used_axes()
    if len(used) != len(set(used)) or any(mesh.axis_size(a) is None for a in used):
        return False
    return all(shape[i] % _factor(spec.axes_of(i), mesh) == 0 for i in range(len(shape)))


def _factor(axes: tuple[str, ...], mesh: Mesh) -> int:
    return math.prod(_size(mesh, a) for a in axes)


def _size(mesh: Mesh, axis: str) -> int:
    """The size of `axis` in a layout's mesh, where it is known (`is_valid` checks the layout's axes)."""
    n = mesh.axis_size(axis)
    if n is None:
        raise ValueError(f"the size of mesh axis `{axis}` is unknown (a hole, or not an axis of {mesh.name})")
    return n


def _axes(spec: Spec, d: int) -> tuple[str, ...]:
    """The axes splitting dim `d` of a layout's spec (a layout has no hole `?`, see `is_valid`)."""
    axes = spec.dims[d]
    if isinstance(axes, Hole):
        raise ValueError(f"dim {d} of {spec} is a hole `?`, not a layout")
    return axes


def enumerate_layouts(shape: tuple[int, ...], mesh: Mesh, partial: bool = True) -> list[Spec]:
    """Every valid layout of `shape` on `mesh`: each axis replicates, is partial, or splits one dim;
    axes splitting the same dim in every order. Sorted by str for stable test ids."""
    names = [a for a in mesh.names if (mesh.axis_size(a) or 1) > 1]
    choices: list[str | int] = ["R", *(["P"] if partial else []), *range(len(shape))]
    out: set[Spec] = set()
    for assign in itertools.product(choices, repeat=len(names)):
        per_dim: list[list[str]] = [[] for _ in shape]
        part = []
        for ax, c in zip(names, assign):
            if c == "P":
                part.append(ax)
            elif isinstance(c, int):  # not "R"
                per_dim[c].append(ax)
        for orders in itertools.product(*[itertools.permutations(d) for d in per_dim]):
            spec = Spec(tuple(tuple(o) for o in orders), tuple(part))
            if is_valid(shape, spec, mesh):
                out.add(spec)
    return sorted(out, key=str)


def local_shape(shape: tuple[int, ...], spec: Spec, mesh: Mesh) -> tuple[int, ...]:
    """The per-device shape (Spec.local_shape's rule); the spec and mesh must be complete."""
    out = spec.local_shape(tuple(shape), mesh)
    if out is None:
        raise ValueError(f"the local shape of {list(shape)} under {spec} is unknown (rank or mesh holes)")
    return out


def local_numel(shape: tuple[int, ...], spec: Spec, mesh: Mesh) -> int:
    return math.prod(local_shape(shape, spec, mesh))


def local_slices(shape: tuple[int, ...], spec: Spec, mesh: Mesh, coords: dict[str, int]) -> tuple[slice, ...]:
    """The slice of the global tensor a device with mesh coordinates `coords` holds."""
    out = []
    for i, n in enumerate(shape):
        index, count = 0, 1
        for a in _axes(spec, i):
            size = _size(mesh, a)
            index = index * size + coords[a]
            count *= size
        if n % count:  # the runtime holds even pieces only (the checker refuses uneven splits)
            raise ValueError(f"dim {i} of {list(shape)} does not split evenly over {count} devices under {spec}")
        chunk = n // count
        out.append(slice(index * chunk, (index + 1) * chunk))
    return tuple(out)


# ------------------------------------------------------------------------------ transforms
@dataclass(frozen=True)
class Step:
    kind: str  # all_gather | shard | all_to_all | all_reduce | reduce_scatter | to_partial
    axis: str
    dim: int | None = None
    dim2: int | None = None  # all_to_all: destination dim

    def __str__(self) -> str:
        if self.kind == "all_to_all":
            return f"all_to_all({self.axis}: {self.dim}->{self.dim2})"
        if self.dim is None:
            return f"{self.kind}({self.axis})"
        return f"{self.kind}({self.axis}, dim {self.dim})"


def _with_dim(spec: Spec, d: int, axes: tuple[str, ...]) -> Spec:
    dims = list(spec.dims)
    dims[d] = axes
    return Spec(tuple(dims), spec.partial)


def _step_dim(step: Step, dim: int | None) -> int:
    """`dim` (`step.dim` or `step.dim2`), which a step of its kind names."""
    if dim is None:
        raise ValueError(f"{step} names no dim")
    return dim


def apply_step(spec: Spec, step: Step) -> Spec:
    a = step.axis
    if step.kind == "all_gather":
        d = _step_dim(step, step.dim)
        return _with_dim(spec, d, _axes(spec, d)[:-1])
    if step.kind == "shard":
        d = _step_dim(step, step.dim)
        return _with_dim(spec, d, _axes(spec, d) + (a,))
    if step.kind == "all_to_all":
        d, e = _step_dim(step, step.dim), _step_dim(step, step.dim2)
        s = _with_dim(spec, d, _axes(spec, d)[:-1])
        return _with_dim(s, e, _axes(s, e) + (a,))
    if step.kind == "all_reduce":
        return Spec(spec.dims, tuple(p for p in spec.partial if p != a))
    if step.kind == "reduce_scatter":
        d = _step_dim(step, step.dim)
        s = Spec(spec.dims, tuple(p for p in spec.partial if p != a))
        return _with_dim(s, d, _axes(s, d) + (a,))
    if step.kind == "to_partial":
        return Spec(spec.dims, spec.partial + (a,))
    raise ValueError(step.kind)


@lru_cache(maxsize=262144)
def neighbors(shape: tuple[int, ...], spec: Spec, mesh: Mesh) -> tuple[tuple[Step, Spec], ...]:
    """Every valid one-step transform of a layout."""
    out: list[Step] = []
    used = set(spec.used_axes())
    for a in mesh.names:
        if (mesh.axis_size(a) or 1) <= 1:
            continue
        if a in spec.partial:
            out.append(Step("all_reduce", a))
            out += [Step("reduce_scatter", a, d) for d in range(len(shape))]
        elif a not in used:
            out += [Step("shard", a, d) for d in range(len(shape))]
            out.append(Step("to_partial", a))
    for d in range(spec.rank):
        axes = _axes(spec, d)
        if axes:
            a = axes[-1]
            out.append(Step("all_gather", a, d))
            out += [Step("all_to_all", a, d, e) for e in range(len(shape)) if e != d]
    res = []
    for st in out:
        nxt = normalize(apply_step(spec, st), mesh)
        if is_valid(shape, nxt, mesh):
            res.append((st, nxt))
    return tuple(res)


def step_comms(shape: tuple[int, ...], before: Spec, step: Step, mesh: Mesh,
               itemsize: int) -> tuple[CommCost | None, CommCost | None]:
    """(forward, backward) collectives of one step, priced; None where the direction is free."""
    after = apply_step(before, step)
    b_before = local_numel(shape, before, mesh) * itemsize
    b_after = local_numel(shape, after, mesh) * itemsize
    ax = (step.axis,)
    k = step.kind
    if k == "all_gather":
        return price(Collective.ALL_GATHER, mesh, ax, b_after), None
    if k == "shard":
        return None, price(Collective.ALL_GATHER, mesh, ax, b_before)
    if k == "all_to_all":
        return price(Collective.ALL_TO_ALL, mesh, ax, b_before), price(Collective.ALL_TO_ALL, mesh, ax, b_after)
    if k == "all_reduce":
        return price(Collective.ALL_REDUCE, mesh, ax, b_before), None
    if k == "reduce_scatter":
        return price(Collective.REDUCE_SCATTER, mesh, ax, b_before), price(Collective.ALL_GATHER, mesh, ax, b_before)
    if k == "to_partial":
        return None, None
    raise ValueError(k)


@lru_cache(maxsize=262144)
def step_cost(shape, before: Spec, step: Step, mesh: Mesh, itemsize: int) -> float:
    f, b = step_comms(shape, before, step, mesh, itemsize)
    return (f.seconds if f else 0.0) + (b.seconds if b else 0.0)


# ------------------------------------------------------------------------------ paths
@dataclass(frozen=True)
class Path:
    src: Spec
    dst: Spec
    steps: tuple[Step, ...]
    specs: tuple[Spec, ...]  # src, after step 1, ..., dst
    forward: tuple[CommCost, ...]
    backward: tuple[CommCost, ...]

    @property
    def backward_in_issue_order(self) -> tuple[CommCost, ...]:
        """`backward` lists collectives in forward step order; backward runs the steps reversed."""
        return tuple(reversed(self.backward))

    @property
    def cost(self) -> float:
        return sum(c.seconds for c in self.forward) + sum(c.seconds for c in self.backward)

    def __str__(self) -> str:
        if not self.steps:
            return f"{self.src} (no change)"
        return " -> ".join(str(s) for s in self.specs) + f"  [{self.cost * 1e6:.1f} us]"


def _build(shape, specs: list[Spec], steps: list[Step], mesh: Mesh, itemsize: int) -> Path:
    fwd, bwd = [], []
    for before, st in zip(specs, steps):
        f, b = step_comms(shape, before, st, mesh, itemsize)
        if f:
            fwd.append(f)
        if b:
            bwd.append(b)
    return Path(specs[0], specs[-1], tuple(steps), tuple(specs), tuple(fwd), tuple(bwd))


class NoPath(ValueError):
    pass


def conversion_path(shape: tuple[int, ...], src: Spec, dst: Spec, mesh: Mesh, itemsize: int = 4) -> Path:
    """The cheapest sequence of transforms from `src` to `dst` (forward + backward time), exact."""
    return _dijkstra(tuple(shape), normalize(src, mesh), normalize(dst, mesh), mesh, itemsize)


@lru_cache(maxsize=65536)
def _dijkstra(shape: tuple[int, ...], src: Spec, dst: Spec, mesh: Mesh, itemsize: int) -> Path:
    for s, what in ((src, "source"), (dst, "target")):
        if not is_valid(shape, s, mesh):
            raise NoPath(f"{what} layout {s} is not valid for shape {list(shape)} on mesh {mesh}")
    if src == dst:
        return _build(shape, [src], [], mesh, itemsize)
    got = _search(shape, src, mesh, itemsize).path_to(dst)
    if got is None:
        raise NoPath(f"no conversion from {src} to {dst}")
    return _build(shape, *got, mesh, itemsize)


@lru_cache(maxsize=1024)  # each holds its layouts' distances: bounded for a long-lived process (the LSP)
def _search(shape: tuple[int, ...], src: Spec, mesh: Mesh, itemsize: int) -> _Search:
    return _Search(shape, src, mesh, itemsize)


class _Search:
    """Dijkstra from one source, run as far as the targets asked so far need and resumed for the next: a
    lowering asks ~20 targets per (shape, source) (Llama-3-8B's: 619 paths, 30 sources). Layouts are
    settled in the order a search stopped at one target would settle them (it pops and relaxes the same
    until it pops that target; a settled layout's distance and step before it never change, as no cost
    is negative), so every path is the one that search finds."""

    def __init__(self, shape: tuple[int, ...], src: Spec, mesh: Mesh, itemsize: int) -> None:
        self.shape, self.src, self.mesh, self.itemsize = shape, src, mesh, itemsize
        self.lock = threading.Lock()  # a resumed search is state: one caller at a time (the language server)
        self._start()

    def _start(self) -> None:
        self.dist = {self.src: 0.0}
        self.prev: dict[Spec, tuple[Spec, Step]] = {}
        self.counter = itertools.count()  # tie-break without comparing Specs
        self.heap = [(0.0, 0, next(self.counter), self.src)]
        self.settled: set[Spec] = set()

    def path_to(self, dst: Spec) -> tuple[list[Spec], list[Step]] | None:
        """The layouts and steps from the source to `dst`; None if it cannot be reached."""
        with self.lock:
            try:
                if not self._settle(dst):
                    return None
            except BaseException:  # an interrupted relaxation would leave a layout half done: start again
                self._start()
                raise
            specs, steps = [dst], []
            cur = dst
            while cur != self.src:
                p, st = self.prev[cur]
                specs.append(p)
                steps.append(st)
                cur = p
            return specs[::-1], steps[::-1]

    def _settle(self, dst: Spec) -> bool:
        """Run the search until `dst` is settled (False: it cannot be reached)."""
        dist, prev, heap, settled = self.dist, self.prev, self.heap, self.settled
        nbrs, costs = _moves(self.shape, self.mesh, self.itemsize)
        while dst not in settled:
            if not heap:
                return False
            d, hops, _, spec = heapq.heappop(heap)
            if d > dist.get(spec, math.inf):
                continue
            settled.add(spec)
            moves = nbrs.get(spec)
            if moves is None:
                moves = nbrs[spec] = neighbors(self.shape, spec, self.mesh)
            for st, nxt in moves:
                c = costs.get((spec, st))
                if c is None:
                    c = costs[spec, st] = step_cost(self.shape, spec, st, self.mesh, self.itemsize)
                nd = d + c
                # prefer fewer steps among equal costs (free local steps otherwise make paths wander)
                if nd < dist.get(nxt, math.inf) - 1e-15:
                    dist[nxt] = nd
                    prev[nxt] = (spec, st)
                    heapq.heappush(heap, (nd, hops + 1, next(self.counter), nxt))
        return True


@lru_cache(maxsize=1024)
def _moves(shape: tuple[int, ...], mesh: Mesh, itemsize: int) -> tuple[dict, dict]:
    """`neighbors` and `step_cost` answers for one shape, mesh and itemsize, by layout (and step): the
    same answers, looked up without hashing the mesh (a dataclass of dataclasses, hashed field by field
    on every lookup of those caches: most of a path search's time)."""
    return {}, {}


def _heuristic(a: Spec, b: Spec) -> float:
    """map §4.3's dim-by-dim difference: all-gathers cost 2, shards 1, a step penalty of 1 when a dim
    needs both; partial axes to remove cost 2, to add 1."""
    total = 0.0
    for d in range(min(a.rank, b.rank)):
        x, y = _axes(a, d), _axes(b, d)
        p = 0
        while p < min(len(x), len(y)) and x[p] == y[p]:
            p += 1
        gathers, shards = len(x) - p, len(y) - p
        total += 2 * gathers + shards + (1 if gathers and shards else 0)
    total += 2 * len(set(a.partial) - set(b.partial)) + len(set(b.partial) - set(a.partial))
    return total


def greedy_path(shape: tuple[int, ...], src: Spec, dst: Spec, mesh: Mesh, itemsize: int = 4,
                max_steps: int = 32) -> Path | None:
    """The greedy heuristic search of map §4.3 (Algorithm 1): repeatedly take the one-step transform
    closest to the target by `_heuristic`. Returns None if it cycles without reaching the target."""
    src, dst = normalize(src, mesh), normalize(dst, mesh)
    specs: list[Spec] = [src]
    steps: list[Step] = []
    seen = {src}
    cur = src
    while cur != dst and len(steps) < max_steps:
        options = [(st, n) for st, n in neighbors(shape, cur, mesh) if n not in seen]
        if not options:
            return None
        st, nxt = min(options, key=lambda o: (_heuristic(o[1], dst), step_cost(shape, cur, o[0], mesh, itemsize)))
        specs.append(nxt)
        steps.append(st)
        seen.add(nxt)
        cur = nxt
    if cur != dst:
        return None
    return _build(shape, specs, steps, mesh, itemsize)


def brute_force_cost(shape: tuple[int, ...], src: Spec, dst: Spec, mesh: Mesh, itemsize: int = 4) -> float:
    """Exhaustive search over simple paths (branch and bound): the reference for `conversion_path`."""
    src, dst = normalize(src, mesh), normalize(dst, mesh)
    best = math.inf

    def dfs(spec: Spec, cost: float, visited: set[Spec]) -> None:
        nonlocal best
        if cost >= best - 1e-15:
            return
        if spec == dst:
            best = cost
            return
        for st, nxt in neighbors(shape, spec, mesh):
            if nxt not in visited:
                visited.add(nxt)
                dfs(nxt, cost + step_cost(shape, spec, st, mesh, itemsize), visited)
                visited.remove(nxt)

    dfs(src, 0.0, {src})
    return best
