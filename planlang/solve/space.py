"""The candidates a plan's holes allow: the options of each choice, and a candidate's choices turned into
what fills each hole (`fills`: the value the search substitutes into the plan, printed once, when the
chosen plan is written, planlang.solve.holes).

A candidate is named by its choices, `(what, value)` pairs in a fixed order (`choices`): the mesh's axis
sizes and the choices made with them (`assign`: pipeline axis, schedule, chunks, data axes, stage degrees,
`every ?` and template arguments), microbatches, the stage partition's method, ZeRO, each spec hole's
spec, the checkpoint groups. A choice that is one of the plan's values (a schedule, data axes, a spec)
is that value; the others are short labels. Each prints as the header and the progress lines show it;
the value of each hole is built from them here, once per candidate (no plan text is read or written).
"""
from __future__ import annotations

import itertools
import math
from typing import Union

from planlang.plan import types as T
from planlang.plan.checkpoints import checkpoint_groups as expand_groups
from planlang.plan.data import batch_axes, batch_dim

from .checkpoint_plan import repeated_blocks
from .checkpoint_values import Checkpoints, star_value
from .classify import Holes, TemplateArguments, hole_key
from .holes import Fill, axes_text
from .substitute import Values


class SolveError(ValueError):
    """The plan cannot be solved (message names the cause and the fix)."""


PP_AXIS, SCHEDULE, CHUNKS, DATA_AXES, DEGREES = (  # choices besides axis sizes (a space: no axis is named so)
    "pipeline axis", "pipeline schedule", "schedule chunks", "data axes", "stage degrees")
#: the pipeline partitions a `stages ?` hole is filled by, each priced (docs/solve.md): min–max flops, min–max
#: saved activations, SageMaker's tree, CAPTURE's least predicted peak, Alpa's DP (the fastest cut that fits)
STAGE_METHODS = ("flops", "activations", "tree", "capture", "alpa")


def factorizations(n: int, k: int) -> list[tuple[int, ...]]:
    """Ordered k-tuples of positive integers with product n, in lexicographic order."""
    if k == 0:
        return [()] if n == 1 else []
    out = []
    for d in range(1, n + 1):
        if n % d == 0:
            out += [(d,) + rest for rest in factorizations(n // d, k - 1)]
    return out


class Axes(tuple[str, ...]):
    """Axes chosen together (the data axes), major to minor: a tuple that prints as a spec entry does
    (`_`, `dp`, `(dp, tp)`)."""

    def __str__(self) -> str:
        return axes_text(self)


#: the most combinations of per-stage degrees the solver prices jointly; past it, one stage at a time
DEGREE_COMBINATIONS = 64


class Degrees(tuple[int, ...]):
    """The degrees chosen for the `with AXIS = ?` holes, in their order: a tuple that prints comma-joined
    (`2,1`)."""

    def __str__(self) -> str:
        return ",".join(map(str, self))


#: a choice's value: a label (a number, an axis, `-`, a stage method, ...), or the value itself where
#: it is one of the plan's (a schedule, data axes, stage degrees, a spec); each prints as the header and
#: the progress lines show it
Choice = Union[str, Axes, Degrees, T.Schedule, T.Spec, Checkpoints]
Choices = tuple[tuple[str, Choice], ...]  # (what, value), in a fixed order


def choices_of(assign: dict, micro: int | None, zero: int, specs: dict[int, T.Spec], ckpt: Checkpoints | None,
               stages: str = "flops") -> Choices:
    out: list[tuple[str, Choice]] = [(f"axis {k}" if " " not in k else k,
                                      v if isinstance(v, (Axes, Degrees, T.Schedule)) else str(v)) for k, v in assign.items()]
    out.append(("microbatches", "-" if micro is None else str(micro)))
    out.append(("stages", stages))
    out.append(("zero", str(zero)))
    out += [(f"spec {k}", v) for k, v in sorted(specs.items())]
    out.append(("checkpoint", ckpt if ckpt else "none"))
    return tuple(out)


class Space:
    """The options of each hole of one plan (`plan`: the input's resolved plan; `holes`: classified;
    `facts`: a callable giving the solve's planlang.solve.facts.SolveFacts, built when first asked)."""

    def __init__(self, plan: T.Plan, holes: Holes, path: str, source: str, arguments: TemplateArguments,
                 facts) -> None:
        if plan.mesh is None:
            raise SolveError("the plan has no mesh")
        self.plan = plan
        self.mesh: T.Mesh = plan.mesh
        self.holes = holes
        self.path = path
        self.source = source
        self.arguments = arguments
        self.facts = facts
        self.int_arguments = {i for i, x in enumerate(holes.arguments) if arguments.takes_int(x)}
        self._stages: dict[tuple, tuple] = {}  # (stage count, method[, the candidate's]) -> (choices, stages value)
        h = holes
        # the choices besides axis sizes a candidate carries (assign's keys; each has a space, no axis does)
        self.outer_keys = ([PP_AXIS] if h.pp_axis else []) + ([SCHEDULE] if h.schedule else []) + \
            ([CHUNKS] if h.chunks else []) + ([DATA_AXES] if self._data_choice() else [])
        self.inner_keys = ([DEGREES] if h.degrees else []) + [f"every {i}" for i in range(len(h.every))] + \
            [f"argument {i}" for i in range(len(h.arguments))]

    # -- the mesh and the choices made with it (stage 1)
    def device_count(self) -> int:
        mesh = self.mesh
        fixed = math.prod(a.size for a in mesh.axes if isinstance(a.size, int))
        if mesh.device_count is not None:
            if mesh.device_count % fixed:
                raise SolveError(f"the fixed axis sizes ({fixed}) do not divide the mesh's {mesh.device_count} devices")
            return mesh.device_count // fixed
        if self.holes.axes:
            raise SolveError("the mesh leaves axis sizes `?` but not its device count; write `of N x DEVICE`")
        return 1

    def mesh_options(self) -> list[dict]:
        """Stage 1's candidates: each factorization of the devices over the `?` axes, times the choices
        that shape the rest of the search (pipeline axis, schedule, chunks, data axes), each with the
        other discrete choices at their defaults."""
        names = [n for n, _ in self.holes.axes]
        out = []
        for sizes in factorizations(self.device_count(), len(names)):
            for extra in self._outer_options(dict(zip(names, sizes))):
                assign = {**dict(zip(names, sizes)), **extra}
                if self._batch_divides(assign):
                    assign.update(self._inner_defaults(assign))
                    out.append(assign)
        return out

    def _batch_divides(self, assign: dict) -> bool:
        batch = {i.name: i.shape[batch_dim(i)] for i in self.plan.inputs if i.shape}
        return all(batch.get(inp, 1) % math.prod(self.size_of(assign, a) for a in axes) == 0
                   for inp, axes in self.input_data_axes(assign).items())

    def size_of(self, assign: dict, axis: str | None) -> int:
        for a in self.mesh.axes:
            if a.name == axis:
                return assign.get(axis, a.size) if T.is_hole(a.size) else a.size  # type: ignore[return-value]
        return 1

    def pp_axis(self, assign: dict) -> str | None:
        p = self.plan.pipeline
        if p is None:
            return None
        return assign.get(PP_AXIS) if T.is_hole(p.axis) else p.axis  # type: ignore[return-value]

    def schedule_of(self, assign: dict) -> tuple[str, int]:
        """The pipeline's schedule and chunks per rank (1 unless chunked: plan.types.CHUNKED)."""
        p = self.plan.pipeline
        if p is None:
            return "", 1
        if T.is_hole(p.schedule):
            chosen = assign.get(SCHEDULE, T.Schedule("1f1b"))
            return chosen.kind, T.stages_per_rank(chosen.kind, chosen.chunks)
        kind = p.schedule.kind  # type: ignore[union-attr]
        chunks = p.schedule.chunks  # type: ignore[union-attr]
        if T.is_hole(chunks):
            chunks = int(assign.get(CHUNKS, 2))
        return kind, T.stages_per_rank(kind, chunks)  # type: ignore[arg-type]

    def _written_axes(self) -> set[str]:
        """Axes a written spec uses: a parameter's, or an activation's on a dim other than the batch."""
        used: set[str] = set()
        for r in self.plan.shards:
            if isinstance(r.spec, T.Spec):
                dims = r.spec.dims if r.kind == "param" else r.spec.dims[1:]
                used.update(a for d in dims if not T.is_hole(d) for a in d)  # type: ignore[union-attr]
                used.update(r.spec.partial)
        return used

    def _data_choice(self) -> bool:
        """Is the batch split a choice: a `data` statement with a hole at the batch dim."""
        for d, holes in self.holes.data:
            bd = batch_dim(self.plan.input(d.input))
            if any(dim in (-1, bd) for dim, _ in holes):
                return True
        return False

    def input_data_axes(self, assign: dict) -> dict[str, tuple[str, ...]]:
        """Each `data` statement's input -> the axes its batch dim is split over (written or chosen)."""
        out = dict(batch_axes(self.plan))
        chosen = assign.get(DATA_AXES, Axes())
        for d, _ in self.holes.data:
            out.setdefault(d.input, chosen)
        return out

    def data_axes_of(self, assign: dict) -> tuple[str, ...]:
        axes = {a for split in self.input_data_axes(assign).values() for a in split}
        return tuple(a for a in self.mesh.names if a in axes)

    def _outer_options(self, sizes: dict) -> list[dict]:
        h, p = self.holes, self.plan.pipeline
        mesh = self.mesh
        size = {a.name: self.size_of(sizes, a.name) for a in mesh.axes}
        pps: list[str | None] = [None]
        if h.pp_axis is not None:  # not an axis a written spec or data split uses (PL308)
            banned = self._written_axes() | {a for split in batch_axes(self.plan).values() for a in split}
            free = [a for a in mesh.names if a not in banned]
            pps = [a for a in free if size[a] > 1] or free[:1]  # type: ignore[assignment]
        # not looped_bfs: the step-time model gives it interleaved's bubble (m >= p; sends are not priced,
        # where its fewer stage switches would tell) and more activations, so it never wins a `schedule ?`
        # and would only add a quarter more candidates; written, its `chunks ?` is solved as interleaved's.
        # zero_bubble with one chunk (ZB-H1): 1F1B's stages with the weight gradients in the bubbles, at the
        # cost of holding activations until them
        schedules: list[T.Schedule | None] = [T.Schedule("1f1b"), T.Schedule("gpipe"), T.Schedule("interleaved", 2),
                                              T.Schedule("zero_bubble", 1)] if h.schedule is not None else [None]
        kind = p.schedule.kind if p is not None and isinstance(p.schedule, T.Schedule) else ""
        least = T.MIN_CHUNKS.get(kind, 2)
        most = 2 if kind in T.V_SHAPED else 4  # a V holds exactly two stages per rank (PL404)
        chunks: list[str | None] = [str(c) for c in range(least, most + 1)] if h.chunks is not None else [None]
        out = []
        for pp in pps:
            for sched in schedules:
                for c in chunks:
                    extra: dict = {}
                    if pp is not None:
                        extra[PP_AXIS] = pp
                    if sched is not None:
                        extra[SCHEDULE] = sched
                    if c is not None:
                        extra[CHUNKS] = c
                    pp_size = self.size_of(sizes, pp or self.pp_axis(sizes))
                    if pp_size == 1 and sched is not None and sched.kind == "gpipe":
                        continue  # one stage: GPipe runs exactly as 1F1B (the same plan, priced once)
                    k = pp_size * self.schedule_of(extra)[1]
                    written = p.stages if p is not None and isinstance(p.stages, tuple) else None
                    if written is not None and k != len(written):
                        continue  # the stages written fix the stage count (PL401)
                    if DATA_AXES in self.outer_keys:
                        out += [{**extra, DATA_AXES: t} for t in self._data_options({**sizes, **extra})]
                    else:
                        out.append(extra)
        return out

    def _data_options(self, assign: dict) -> list[Axes]:
        """The data axes' candidates: every set (in mesh order) of axes of size > 1 that are not the
        pipeline's, not used by a written spec nor on another dim of a `data` spec; or none."""
        written = batch_axes(self.plan)
        if written:  # every input splits its batch over the same axes: one input's written split fixes it
            return [Axes(next(iter(written.values())))]
        banned = self._written_axes() | {self.pp_axis(assign)}
        for d, _ in self.holes.data:
            if isinstance(d.spec, T.Spec):
                banned.update(d.spec.used_axes())
        free = [a for a in self.mesh.names if a not in banned and self.size_of(assign, a) > 1]
        sets = [c for n in range(len(free), -1, -1) for c in itertools.combinations(free, n)]
        return [Axes(c) for c in sets]

    # -- the choices made after the rest (stage degrees, `every ?`, template arguments)
    def _inner_defaults(self, assign: dict) -> dict:
        """The values the main search holds the other discrete choices at: each stage's degree at the
        mesh's size (when that adds up), `every 1`, a template argument at the first axis that is neither
        the pipeline's nor a data axis."""
        out: dict = {}
        if self.holes.degrees:
            opts = self._degree_options(assign)
            same = Degrees(self.size_of(assign, ax) for _, ax, _ in self.holes.degrees)
            out[DEGREES] = same if same in opts or not opts else opts[0]
        for i in range(len(self.holes.every)):
            out[f"every {i}"] = "1"
        for i in range(len(self.holes.arguments)):
            out[f"argument {i}"] = self._argument_options(i, assign)[0]
        return out

    def _degree_options(self, assign: dict) -> list[Degrees]:
        """Per-stage degrees for the `with AXIS = ?` holes (in their order): the axes' sizes first, then the
        ways of laying each stage with holes over its pipeline rank's devices (the product of its sizes of
        the other axes equal to theirs, planlang.plan.stage_meshes): every combination of the stages' ways
        while there are at most DEGREE_COMBINATIONS, else one stage changed at a time from the mesh's sizes.
        The checker refuses, and the pricing skips, those a stage cannot run (PL305, PL418)."""
        holes = self.holes.degrees
        same = tuple(self.size_of(assign, ax) for _, ax, _ in holes)
        p = self.plan.pipeline
        pp = self.pp_axis(assign)
        if p is None or not isinstance(p.stages, tuple) or pp is None:
            return [Degrees(same)]
        others = [a for a in self.mesh.names if a != pp]
        devices = math.prod(self.size_of(assign, a) for a in others)
        divisors = [d for d in range(1, devices + 1) if devices % d == 0]
        ways: list[tuple[list[int], list[tuple[int, ...]]]] = []  # per stage: its holes' indices, their values
        for stage in sorted({s for s, _, _ in holes}):
            fixed = {ax: v for ax, v in p.stages[stage].degrees if isinstance(v, int)}
            mine = [i for i, (s, _, _) in enumerate(holes) if s == stage]
            named = {holes[i][1] for i in mine}
            rest = math.prod(fixed.get(a, self.size_of(assign, a)) for a in others if a not in named)
            ways.append((mine, [v for v in itertools.product(divisors, repeat=len(mine))
                                if rest * math.prod(v) == devices]))
        if math.prod(len(w) for _, w in ways) <= DEGREE_COMBINATIONS:
            combos = [tuple(zip((m for m, _ in ways), pick)) for pick in itertools.product(*(w for _, w in ways))]
        else:
            combos = [((mine, v),) for mine, w in ways for v in w]
        out = [Degrees(same)]
        for combo in combos:
            option = list(same)
            for mine, values in combo:
                for i, v in zip(mine, values):
                    option[i] = v
            if Degrees(tuple(option)) not in out:
                out.append(Degrees(tuple(option)))
        return out

    def _argument_options(self, i: int, assign: dict) -> list[str]:
        """A template's `?` argument: the mesh's axes but the pipeline's, those that are not data axes
        first (an int parameter: 1, 2, 4)."""
        if i in self.int_arguments:
            return ["1", "2", "4"]
        pp, data = self.pp_axis(assign), set(self.data_axes_of(assign))
        axes = [a for a in self.mesh.names if a != pp]
        first = [a for a in axes if a not in data and self.size_of(assign, a) > 1]
        return first + [a for a in axes if a not in first]

    def _every_options(self, i: int, cand) -> list[str]:
        """`every ?`: each divisor of the number of modules a group statement selects, when every group
        it cuts lies inside one pipeline stage of the candidate."""
        facts = self.facts().modules
        names, order = list(facts.all_modules), list(facts.order)
        hole = self.holes.every[i]
        groups = [g for g in self.plan.checkpoints
                  if isinstance(g.every, T.Hole) and hole_key(g.every) == hole_key(hole)]
        runs = expand_groups([_with_every(g, None) for g in groups], names, order)
        n = max((len(r) for r in runs), default=1)
        stage_sets: list[list[str]] = []
        plan = cand.plan
        if plan.pipeline is not None and isinstance(plan.pipeline.stages, tuple):
            stage_sets = [[m for sel in st.modules for m in sel.select(names)] for st in plan.pipeline.stages]

        def stage(m: str) -> int:
            return next((k for k, ms in enumerate(stage_sets) if any(m == s or m.startswith(s + ".") for s in ms)), -1)

        out = []
        for k in range(1, n + 1):
            if n % k:
                continue
            cut = expand_groups([_with_every(g, k) for g in groups], names, order)
            if all(len({stage(m) for m in grp}) <= 1 for grp in cut):
                out.append(str(k))
        return out or ["1"]

    def inner_options(self, key: str, cand) -> list[Choice]:
        assign = self.assign_of(cand.choices)
        if key == DEGREES:
            return list(self._degree_options(assign))
        if key.startswith("every "):
            return list(self._every_options(int(key.split()[1]), cand))
        return list(self._argument_options(int(key.split()[1]), assign))

    def assign_of(self, choices) -> dict:
        keys = set(self.outer_keys) | set(self.inner_keys)
        out: dict = {}
        for k, v in choices:
            if k.startswith("axis "):
                out[k[len("axis "):]] = int(v)
            elif k in keys:
                out[k] = v
        return out

    # -- microbatches, stages, specs, checkpoints
    def local_batch(self, assign: dict) -> int:
        b = min((i.shape[batch_dim(i)] for i in self.plan.inputs if i.shape), default=1)
        for a in self.data_axes_of(assign):
            b //= self.size_of(assign, a)
        return max(b, 1)

    def micro_options(self, assign: dict) -> list[int]:
        pp = self.size_of(assign, self.pp_axis(assign))
        kind, chunks = self.schedule_of(assign)
        lb = self.local_batch(assign)
        opts = [m for m in range(1, lb + 1) if lb % m == 0 and m >= pp * max(chunks, 1)
                and (kind not in ("interleaved", "zero_bubble") or m % pp == 0)]  # a multiple of the ranks (PL402)
        return opts or [lb]

    def stage_choices(self, assign: dict, method: str = "flops", micro: int | None = None, zero: int = 0) -> list:
        """The pipeline hole's stages: the min–max partition of per-layer flops or saved activations
        (planlang.solve.partition), SageMaker's tree partition of the module hierarchy, CAPTURE's
        memory-centric layer groups (pipeline_stages.capture_partition) or Alpa's DP on the mesh's
        degrees (pipeline_stages.alpa_partition)."""
        return list(self._stage_fill(assign, method, micro, zero)[0])

    def _stage_fill(self, assign: dict, method: str, micro: int | None = None, zero: int = 0) -> tuple:
        """(stage_choices, their value as the plan's stages), once per stage count and method: the flops,
        activations and tree partitions read only the stage count and the model's layers (every mesh of a
        pp degree shares them); CAPTURE's and Alpa's also the candidate's microbatches, data and tensor
        degrees and schedule (and Alpa's its ZeRO stage: the states its budget holds)."""
        # lazy: torch loads only when this runs
        from planlang.solve.pipeline_stages import stage_partition, to_stages

        k = self.stage_count(assign)
        key: tuple = (k, method)
        candidate: dict = {}
        if method in ("capture", "alpa"):
            pp, data = self.pp_axis(assign), self.data_axes_of(assign)
            dp = math.prod(self.size_of(assign, a) for a in data)
            tp = math.prod(self.size_of(assign, a) for a in self.mesh.names if a != pp and a not in data)
            candidate = {"microbatches": micro, "degrees": (dp, tp), "schedule": self.schedule_of(assign)[0] or None,
                         "zero": zero if method == "alpa" else 0}
            key += tuple(candidate.values())
        if key not in self._stages:
            chosen = stage_partition(self.plan, method, k, self.facts().layers, **candidate)
            self._stages[key] = (tuple(chosen), to_stages(chosen))
        return self._stages[key]

    def stage_count(self, assign: dict) -> int:
        """Pipeline stages of the mesh's candidates: the pipeline axis's size times the chunks per rank."""
        return self.size_of(assign, self.pp_axis(assign)) * max(self.schedule_of(assign)[1], 1)

    def literal(self, hole: T.Hole) -> bool:
        return hole.span.file != self.path or self.source[hole.span.start:hole.span.end].strip() == "?"

    def _data_axis(self, assign: dict) -> str:
        axes = self.data_axes_of(assign)
        return axes[0] if axes else self.mesh.names[0]

    def shape_of(self, rule: T.ShardRule) -> tuple[int, ...]:
        """The global shape of what a rule shards: its (first) parameter, or the module's output or input."""
        facts = self.facts().modules
        if rule.kind == "param":
            hits = rule.target.select(list(facts.params))
            if not hits:
                raise SolveError(f"`{rule.target}` matches no parameter of the model")
            return tuple(facts.params[hits[0]][0])
        for m in rule.target.select(list(facts.all_modules)):
            call = facts.calls.get(m)
            shape = None if call is None else call.output if rule.kind == "output" else \
                (call.inputs[0] if call.inputs else None)
            if shape is not None:
                return tuple(shape)
        raise SolveError(f"`{rule.kind} of {rule.target}` matches no module the model runs")

    def spec_options(self, rule: T.ShardRule, assign: dict) -> list[T.Spec]:
        """Candidate specs: replicated, or one axis (not a data or the pipeline axis) splitting one dim it
        divides (an activation's batch dim aside: the data axes split it). A spec with `?` entries keeps
        its written entries; each `?` is `_` or an axis the spec does not use that divides its dim (an
        entry a template argument leaves open stays its hole: the argument fills it)."""
        shape = self.shape_of(rule)
        skip = {self.pp_axis(assign)} | set(self.data_axes_of(assign))
        axes = [a for a in self.mesh.names if a not in skip and self.size_of(assign, a) > 1]
        spec = next(s for r, s in self.holes.specs if r is rule)
        if isinstance(spec, T.Hole):
            first = 0 if rule.kind == "param" else 1
            opts = [_replicated(len(shape))]
            for a in axes:
                for d in range(first, len(shape)):
                    if shape[d] % self.size_of(assign, a) == 0:
                        opts.append(T.Spec(tuple((a,) if i == d else () for i in range(len(shape)))))
            return opts
        used = set(spec.used_axes())
        per_dim: list[list[tuple[str, ...] | T.Hole]] = []
        for d, x in enumerate(spec.dims):
            if not isinstance(x, T.Hole):
                per_dim.append([x])
            elif not self.literal(x):
                per_dim.append([x])  # a template argument's entry: the argument fills it
            else:
                n = shape[d] if d < len(shape) else 1
                entry: list[tuple[str, ...] | T.Hole] = [()]
                per_dim.append(entry + [(a,) for a in axes if a not in used and n % self.size_of(assign, a) == 0])
        opts = []
        for combo in itertools.product(*per_dim):
            named = [e for e, x in zip(combo, spec.dims) if isinstance(x, T.Hole) and isinstance(e, tuple) and e]
            if len(named) == len(set(named)):
                opts.append(T.Spec(tuple(combo), spec.partial))
        return opts

    def ckpt_options(self) -> list[Checkpoints]:
        """`every k` groups over the model's longest list of repeated blocks (pipeline plans, whose
        activations the chain of the whole model does not describe per stage)."""
        found = repeated_blocks([n for n in self.facts().modules.all_modules if n])
        if found is None:
            return []
        head, n = found
        return [star_value(head, k) for k in (1, 2, 4) if k <= n] + [star_value(head, None)]

    # -- a candidate's fills: the value of each hole (substituted, and printed once when the plan is written)
    def fills(self, assign: dict, micro: int | None, zero: int, specs: dict[int, T.Spec],
              ckpt: Checkpoints | None, stages: str = "flops") -> dict[str, Fill]:
        h = self.holes
        fills: dict[str, Fill] = {}
        for name, hole in h.axes:
            fills[f"axis {name}"] = Fill(hole, int(assign[name]))
        if h.pp_axis is not None:
            fills[PP_AXIS] = Fill(h.pp_axis, str(assign[PP_AXIS]))
        if h.schedule is not None:
            fills[SCHEDULE] = Fill(h.schedule, assign[SCHEDULE])
        if h.chunks is not None:
            fills[CHUNKS] = Fill(h.chunks, int(assign[CHUNKS]))
        for j, (d, holes) in enumerate(h.data):
            inp = self.plan.input(d.input)
            split = tuple(self.input_data_axes(assign).get(d.input, ()))
            bd = batch_dim(inp)
            for dim, hole in holes:
                if dim < 0:  # the whole spec: the batch dim over the data axes, the others whole
                    rank = len(inp.shape) if inp is not None else 1
                    value: object = T.Spec(tuple(split if i == bd else () for i in range(rank)))
                else:
                    value = split if dim == bd else ()
                fills[f"data {j} {dim}"] = Fill(hole, value)
        if h.degrees:
            for (_, _, hole), degree in zip(h.degrees, assign[DEGREES]):
                fills[f"degree {hole_key(hole)}"] = Fill(hole, degree)
        for i, hole in enumerate(h.every):
            fills[f"every {i}"] = Fill(hole, int(assign[f"every {i}"]))
        for i, hole in enumerate(h.arguments):
            v = str(assign[f"argument {i}"])
            fills[f"argument {i}"] = Fill(hole, int(v) if i in self.int_arguments else v)
        if h.zero is not None:
            fills["zero"] = Fill(h.zero, zero)
        if h.zero_axis is not None:
            fills["zero axis"] = Fill(h.zero_axis, self._data_axis(assign))
        if h.micro is not None:
            fills["microbatches"] = Fill(h.micro, micro)
        if h.stages is not None:
            chosen, value = self._stage_fill(assign, stages, micro, zero)
            fills["stages"] = Fill(h.stages, value, text="\n" + "\n".join(str(c) for c in chosen) + "\n")
        for k, (rule, written) in enumerate(h.specs):
            spec = specs.get(k)
            if spec is None:
                spec = _replicated(len(self.shape_of(rule)))
            if isinstance(written, T.Hole):
                fills[f"spec {k}"] = Fill(written, spec)
            else:  # a spec with `?` entries: each entry from the chosen spec
                for dim, x in enumerate(written.dims):
                    if isinstance(x, T.Hole) and self.literal(x):
                        fills[f"spec {k} {dim}"] = Fill(x, spec.axes_of(dim))
        if h.checkpoint is not None:
            fills["checkpoint"] = Fill(h.checkpoint, ckpt.groups) if ckpt else \
                Fill(h.checkpoint, (), text="",
                     drop_line="checkpoint: none (planlang solve: the plan fits without recomputation)")
        return fills

    def fills_of(self, choices) -> dict[str, Fill]:
        """The fills of a candidate's choices (a Candidate, or its `choices`)."""
        choices = getattr(choices, "choices", choices)
        ch = dict(choices)
        assign = self.assign_of(choices)
        micro = int(ch["microbatches"]) if ch.get("microbatches", "-") != "-" else None
        specs = {int(k[len("spec "):]): v for k, v in ch.items() if isinstance(v, T.Spec)}
        ckpt = ch.get("checkpoint")
        return self.fills(assign, micro, int(str(ch.get("zero", 0))), specs,
                          ckpt if isinstance(ckpt, Checkpoints) else None, str(ch.get("stages", "flops")))

    def values(self, fills: dict[str, Fill]) -> Values:
        """What the fills put into the plan value (planlang.solve.substitute)."""
        out = Values()
        chosen_axes: dict[int, str] = {}
        for key, f in fills.items():
            if key == "checkpoint":
                out.checkpoints = f.value  # type: ignore[assignment]
            elif key.startswith("argument "):
                chosen_axes[int(key.split()[1])] = f.value  # type: ignore[assignment]
            else:
                out.at[hole_key(f.hole)] = f.value
        for hid, entry in self.arguments.entries.items():
            axis = chosen_axes.get(entry.argument)
            if isinstance(axis, str):
                out.entries[hid] = entry.axes(axis)
        return out


def _with_every(g: T.CheckpointGroup, every: int | None) -> T.CheckpointGroup:
    return T.CheckpointGroup(g.modules, every, per=g.per, span=g.span, origin=g.origin)


def _replicated(rank: int) -> T.Spec:
    return T.Spec(tuple(() for _ in range(rank)))

