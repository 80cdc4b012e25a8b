"""The conversions between a value's layouts, priced for the intra-op ILP's edges (planlang.solve.
intra_op): every layout of one shape on a mesh, numbered, with its one-step transforms (`LayoutGraph`),
and a search from each source layout over them (`costs_from`, `edge_matrices`), with the same transforms
and step costs as planlang.cost.layout.conversion_path.
"""
from __future__ import annotations

import heapq
import math
from functools import lru_cache

import numpy as np

from planlang.cost.comm import bytes_sent
from planlang.cost.layout import enumerate_layouts, local_numel, neighbors, normalize, step_comms
from planlang.plan.types import Mesh, Spec


def comm_volume(comms, mesh: Mesh) -> float:
    """Bytes a device sends for these collectives (the communication volume of min-memory-redundancy §3.4)."""
    return sum(bytes_sent(c.kind, math.prod(mesh.axis_size(a) or 1 for a in c.axes), c.size_bytes) for c in comms)



def edge_matrices(shape, itemsize, src_specs, dst_specs, mesh):
    """Seconds, bytes sent and bytes of the converted copy for every (source, target) layout pair."""
    g = layout_graph(tuple(shape), mesh, itemsize)
    srcs = [g.node(normalize(a, mesh)) for a in src_specs]
    dst = np.array([g.node(normalize(d, mesh)) for d in dst_specs], dtype=int)
    dst_bytes = np.array([local_numel(shape, d, mesh) * itemsize for d in dst_specs], dtype=float)
    rows = [g.reach(i) for i in srcs]
    sec = np.array([r[0][dst] for r in rows]).reshape(len(src_specs), len(dst_specs))
    vol = np.array([r[1][dst] for r in rows]).reshape(sec.shape)
    moved = np.array([r[2][dst] > 0 for r in rows]).reshape(sec.shape)
    return np.where(moved, sec, 0.0), np.where(moved, vol, 0.0), np.where(moved, dst_bytes[None, :], 0.0)



class LayoutGraph:
    """Every layout of one shape on a mesh (the states `conversion_path` searches), numbered, with each
    one-step transform as (target, seconds forward + backward, bytes sent per device). Built once per
    (shape, mesh, itemsize) so that a search from each source layout runs over integers."""

    def __init__(self, shape: tuple[int, ...], mesh: Mesh, itemsize: int) -> None:
        self.specs: list[Spec] = []
        self.index: dict[Spec, int] = {}
        self.adj: list[list[tuple[int, float, float]]] = []
        self._reach: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.shape, self.mesh, self.itemsize = shape, mesh, itemsize
        for spec in enumerate_layouts(shape, mesh, partial=True):
            self._add(normalize(spec, mesh))
        self._close()

    def node(self, spec: Spec) -> int:
        """The number of a normalized layout (one outside the enumeration is added with what it reaches)."""
        j = self.index.get(spec)
        if j is None:
            j = self._add(spec)
            self._close()
            self._reach.clear()  # searches so far did not see the new states
        return j

    def _add(self, spec: Spec) -> int:
        j = self.index.get(spec)
        if j is None:
            j = self.index[spec] = len(self.specs)
            self.specs.append(spec)
        return j

    def _close(self) -> None:
        """Transforms of every state not expanded yet (adding the states they lead to)."""
        shape, mesh, size = self.shape, self.mesh, self.itemsize
        while len(self.adj) < len(self.specs):
            spec = self.specs[len(self.adj)]
            out = []
            for st, nxt in neighbors(shape, spec, mesh):
                comms = [c for c in step_comms(shape, spec, st, mesh, size) if c]
                # seconds as planlang.cost.layout.step_cost sums them (forward, then backward)
                out.append((self._add(nxt), sum((c.seconds for c in comms), 0.0), comm_volume(comms, mesh)))
            self.adj.append(out)

    def reach(self, src: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(seconds, bytes sent, steps) of the cheapest conversion from `src` to every layout: Dijkstra
        with `conversion_path`'s order (cost, then steps, then discovery), so the seconds are equal."""
        got = self._reach.get(src)
        if got is not None:
            return got
        n = len(self.specs)
        dist = [math.inf] * n
        vol = [0.0] * n
        hops = [0] * n
        done = [False] * n
        dist[src] = 0.0
        heap = [(0.0, 0, 0, src)]
        counter = 1
        while heap:
            d, h, _, u = heapq.heappop(heap)
            if done[u]:
                continue
            done[u] = True
            for v, cost, volume in self.adj[u]:
                if done[v]:
                    continue
                nd = d + cost
                if dist[v] == math.inf or nd < dist[v] - 1e-15:
                    dist[v], vol[v], hops[v] = nd, vol[u] + volume, h + 1
                    heapq.heappush(heap, (nd, h + 1, counter, v))
                    counter += 1
        got = self._reach[src] = (np.array(dist), np.array(vol), np.array(hops))
        return got


@lru_cache(maxsize=1024)
def layout_graph(shape: tuple[int, ...], mesh: Mesh, itemsize: int) -> LayoutGraph:
    return LayoutGraph(shape, mesh, itemsize)


def costs_from(shape: tuple[int, ...], src: Spec, mesh: Mesh, itemsize: int) -> dict[Spec, tuple[float, float, int]]:
    """Cheapest conversion from `src` to every layout it reaches: normalized layout -> (seconds forward
    + backward, bytes sent per device, steps). One Dijkstra over the same transforms and step costs as
    `planlang.cost.layout.conversion_path` (so the seconds are equal), run once per source instead of
    once per pair."""
    g = layout_graph(tuple(shape), mesh, itemsize)
    dist, vol, hops = g.reach(g.node(normalize(src, mesh)))
    return {g.specs[j]: (float(dist[j]), float(vol[j]), int(hops[j])) for j in range(len(g.specs))
            if dist[j] < math.inf}
