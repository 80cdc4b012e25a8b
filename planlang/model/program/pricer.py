"""What a lowering asks again and again, answered once per lowering: conversion paths and their costs, an
op's strategies, which of them use the parameters as stored and keep the batch split over the data axes
(planlang.model.program.lowering). Each is a pure function of shapes, dtypes, layouts and the mesh, so a
model's N identical blocks ask each question once, not N times."""
from __future__ import annotations

import math

from planlang.cost.layout import NoPath, Path, conversion_path, normalize
from planlang.cost.ops.base import DTYPE_BYTES, Strategy, strategies
from planlang.plan.types import Mesh, Spec


class Pricer:
    """Conversion paths, their costs and an op's strategies on one mesh, each computed once per lowering:
    a model's N identical blocks ask the same questions N times."""

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        dev = mesh.device
        self.peak = (dev.flops_for("f32") if dev is not None else None) or 1e12
        self._cache: dict = {}
        self._costs: dict = {}
        self._touches: dict = {}
        self._strategies: dict = {}
        self._kept: dict = {}
        self.daxes: set[str] = set()  # the plan's data axes (set by `lower`)

    def strategies(self, op) -> list[Strategy]:
        """planlang.cost.ops' strategies of `op` (an OpSpec: a pure function of it and the mesh)."""
        try:
            got = self._strategies.get(op)
        except TypeError:  # an attribute that does not hash: asked every time
            return strategies(op, self.mesh)
        if got is None:
            got = self._strategies[op] = strategies(op, self.mesh)
        return got

    def kept(self, op, in_vals, stored: list[Spec], now: list[Spec], fixed: list[int]):
        """Of `op`'s strategies, (those that use each parameter as stored, those of them that also
        convert no activation over a data axis), given each input's stored and current layout: a pure
        function of them, asked once per distinct question (the same for every block of N)."""
        key: tuple | None = (op, tuple((v.shape, v.dtype, k in fixed, stored[k] if k in fixed else now[k])
                                       for k, v in enumerate(in_vals)))
        try:
            got = self._kept.get(key)
        except TypeError:  # an attribute that does not hash
            key, got = None, None
        if got is None:
            cands = self.strategies(op)
            faithful = [s for s in cands if all(_uses_as_stored(stored[k], s.inputs[k], self.mesh) for k in fixed)]
            keeps_data = [s for s in faithful if not any(
                k not in fixed and self.touches(v, now[k], s.inputs[k]) for k, v in enumerate(in_vals))]
            got = (cands, faithful, keeps_data)
            if key is not None:
                self._kept[key] = got
        return got

    def touches(self, v, src: Spec, dst: Spec) -> bool:
        """Whether converting `v` from src to dst steps over a data axis (`_touches` over `daxes`)."""
        key = (v.shape, v.dtype, src, dst)
        got = self._touches.get(key)
        if got is None:
            got = self._touches[key] = _touches(self, v, src, dst, self.daxes)
        return got

    def path(self, shape, src: Spec, dst: Spec, itemsize: int) -> Path | None:
        key = (shape, src, dst, itemsize)
        if key not in self._cache:
            try:
                self._cache[key] = conversion_path(shape, src, dst, self.mesh, itemsize)
            except NoPath:
                self._cache[key] = None
        return self._cache[key]

    def cost(self, shape, src: Spec, dst: Spec, itemsize: int) -> float:
        key = (shape, src, dst, itemsize)
        got = self._costs.get(key)
        if got is None:
            if normalize(src, self.mesh) == normalize(dst, self.mesh):
                got = 0.0
            else:
                p = self.path(shape, src, dst, itemsize)
                got = math.inf if p is None else p.cost
            self._costs[key] = got
        return got


def _touches(pricer: Pricer, v, src: Spec, dst: Spec, axes: set[str]) -> bool:
    """Whether converting value `v` from src to dst takes a step over one of `axes`."""
    if not axes or normalize(src, pricer.mesh) == normalize(dst, pricer.mesh):
        return False
    p = pricer.path(v.shape, src, dst, DTYPE_BYTES.get(v.dtype, 4))
    # splitting a whole value again (a local slice) keeps the batch split; gathering it does not
    return p is None or any(st.axis in axes and st.kind != "shard" for st in p.steps)


def _uses_as_stored(stored: Spec, wanted: Spec, mesh: Mesh) -> bool:
    a, b = normalize(stored, mesh), normalize(wanted, mesh)
    return a.dims == b.dims and set(a.partial) <= set(b.partial)
