"""Declarations and values of a plan: quantities in base units (`units.py`), literals, fields,
devices, links, meshes, the optimizer and its precision; names looked up across the `use`d modules
(did-you-mean on every miss). `ResolverBase` holds what one resolution builds up; planlang.plan.
resolve_body builds a plan's statements on it and planlang.plan.resolve loads the files.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from planlang.lang import ast as A
from planlang.lang.codes import CODES
from planlang.lang.diagnostics import Diagnostic, Fix, Label, did_you_mean
from planlang.lang.fixes import did_you_mean_fix, insert as insert_fix, replace as replace_fix
from planlang.lang.source import SourceFile, Span

from . import types as T
from .units import Kind, UNITS, example_units

MAX_QUANTITY = 1e30  # base units (bytes, B/s, s, FLOP/s): far beyond any machine, below float overflow

DTYPES = {
    "f64": "f64", "float64": "f64", "f32": "f32", "float32": "f32", "fp32": "f32", "f16": "f16",
    "float16": "f16", "fp16": "f16", "bf16": "bf16", "bfloat16": "bf16", "fp8": "fp8", "i64": "i64",
    "int64": "i64", "i32": "i32", "int32": "i32", "i16": "i16", "int16": "i16", "i8": "i8", "int8": "i8",
    "u8": "u8", "uint8": "u8", "bool": "bool", "tf32": "tf32",
}
PARAM_KINDS = ("axis", "int")


def diag(code: str, message: str, span: Span, *, help: str | None = None, labels=(), notes=(),
         fix: Fix | None = None) -> Diagnostic:
    """A diagnostic with the registry's default severity for `code`."""
    return Diagnostic(code, CODES[code].severity, message, span, tuple(labels), help, tuple(notes), fix)


@dataclass
class Namespace:
    """The declarations of one file, and the modules it uses (by alias)."""

    path: str
    devices: dict[str, T.Device] = field(default_factory=dict)
    links: dict[str, T.Link] = field(default_factory=dict)
    meshes: dict[str, T.Mesh] = field(default_factory=dict)
    templates: dict[str, tuple[A.TemplateDecl, "Namespace"]] = field(default_factory=dict)
    modules: dict[str, "Namespace"] = field(default_factory=dict)
    use_spans: dict[str, Span] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)
    # (table, name) of declarations that were written but failed (a `use` of a missing module, a device
    # without memory): already reported, so a reference to one is not "unknown" too
    broken: set[tuple[str, str]] = field(default_factory=set)
    unparsed: bool = False  # the file has syntax errors (reported): any name may have been declared in it


class ResolverBase:
    """What one resolution builds up: its diagnostics, the files read (source and parse), and the values
    a big plan shares (specs by AST node and template arguments, their dims, path segments)."""

    def __init__(self) -> None:
        self.diags: list[Diagnostic] = []
        self.sources: dict[str, SourceFile] = {}
        self.modules: dict[str, A.Module] = {}
        # a big plan repeats itself: the same template spec for each `apply`, the same `[_, tp]` on many
        # lines. Resolved specs are shared (by AST node and template arguments), and so are their dims.
        self._specs: dict[tuple, T.Spec] = {}
        self._dims: dict[tuple, tuple] = {}
        self._segments: dict[tuple, object] = {}  # for Selection.from_path
        self._spec_shapes: dict[str, tuple] = {}  # spec text -> _spec_shape
        self._unknown_modules: set[tuple[int, str]] = set()  # (namespace, alias) already reported (PL202)

    # ------------------------------------------------------------------ values
    def _in_range(self, value: A.Quantity, kind: Kind, what: str) -> float | None:
        """The quantity in base units when it is a positive, finite amount below MAX_QUANTITY; else PL223."""
        try:
            amount = float(value.number.value) * UNITS[value.unit.text][1]
        except OverflowError:  # an integer of hundreds of digits
            amount = math.inf
        if not amount < MAX_QUANTITY:
            self.diags.append(diag("PL223", f"{what} `{value}` is too large", value.span,
                                   help=f"a {kind.value} is at most {MAX_QUANTITY:.0e} base units; check the "
                                        "number and the unit"))
            return None
        if amount <= 0:
            self.diags.append(diag("PL223", f"{what} `{value}` is zero", value.span,
                                   help=f"a {kind.value} must be more than zero"))
            return None
        return amount

    def _quantity(self, value: A.Value, kind: Kind, what: str) -> float | None:
        """A quantity of the given kind in base units, or None after reporting why not."""
        if isinstance(value, A.Quantity):
            unit = value.unit.text
            if unit not in UNITS:
                units = [u for u, (k, _) in UNITS.items() if k == kind]
                guess = did_you_mean(unit, units)
                self.diags.append(diag(
                    "PL250", f"unknown unit `{unit}`", value.unit.span,
                    help=f"did you mean `{guess}`?" if guess else f"{kind.value} units: {example_units(kind)}",
                    fix=did_you_mean_fix(value.unit.span, unit, guess, units),
                ))
                return None
            if UNITS[unit][0] != kind:
                self.diags.append(diag(
                    "PL251", f"{what} needs a {kind.value} unit, but `{unit}` is a {UNITS[unit][0].value} unit",
                    value.unit.span, help=f"{kind.value} units: {example_units(kind)}",
                ))
                return None
            if kind is Kind.MEMORY and unit in ("KB", "MB", "GB", "TB", "PB"):
                self.diags.append(diag(
                    "PL253", f"`{value}` is {value.number.value} x 10^{3 * 'KMGTP'.index(unit[0]) + 3} bytes",
                    value.unit.span, help=f"write `{value.number} {unit[0]}iB` for binary units (as device memory is sold)",
                    # a different amount (10^9 is not 2^30): the user must mean it, so unsafe
                    fix=replace_fix(value.unit.span, f"{unit[0]}iB", f"replace `{unit}` with `{unit[0]}iB`", safe=False),
                ))
            return self._in_range(value, kind, what)
        if isinstance(value, (A.Int, A.Float)):
            unit = example_units(kind).split(',')[0]
            self.diags.append(diag(
                "PL252", f"{what} `{value}` has no unit", value.span,
                help=f"add a {kind.value} unit, e.g. `{value} {unit}`",
                # unsafe: which unit was meant is a guess (the first of the kind's units)
                fix=insert_fix(value.span, f" {unit}", f"add `{unit}`", after=True, safe=False),
            ))
            return None
        self.diags.append(diag("PL221", f"{what} must be a {kind.value} quantity, not `{value}`", value.span,
                               help=f"for example `80 {example_units(kind).split(',')[0]}`"))
        return None

    def _literal(self, value: A.Value, what: str) -> object:
        if isinstance(value, (A.Int, A.Float, A.Str)):
            return value.value
        if isinstance(value, A.Ref) and len(value.name.parts) == 1 and value.name.parts[0].text in ("true", "false", "none"):
            return {"true": True, "false": False, "none": None}[value.name.parts[0].text]
        if isinstance(value, A.ListValue):
            return tuple(self._literal(v, what) for v in value.items)
        self.diags.append(diag(
            "PL221", f"{what} must be a literal (number, string, true/false/none or a list), not `{value}`",
            value.span, help="model and optimizer arguments are passed to Python as literals",
        ))
        return None

    def _fields(self, fields: tuple[A.Field, ...], allowed: Callable[[str], bool], names: list[str], what: str):
        out: dict[str, A.Field] = {}
        for f in fields:
            key = str(f.key)
            if not allowed(key):
                guess = did_you_mean(key, names)
                self.diags.append(diag(
                    "PL212", f"unknown {what} field `{key}`", f.key.span,
                    help=f"did you mean `{guess}`?" if guess else f"{what} fields: {', '.join(names)}",
                    fix=did_you_mean_fix(f.key.span, key, guess, names),
                ))
                continue
            if key in out:
                self.diags.append(diag("PL209", f"field `{key}` is given twice", f.key.span,
                                       labels=[Label(out[key].key.span, "first given here")]))
                continue
            if f.over is not None and key != "zero":
                self.diags.append(diag("PL221", f"`over` does not apply to `{key}`", f.over.span))
            out[key] = f
        return out

    def _device(self, st: A.DeviceDecl) -> T.Device | None:
        fields = self._fields(
            st.fields, lambda k: k in ("memory", "memory_bandwidth", "backend")
            or (k.startswith("flops.") and k.count(".") == 1),
            ["memory", "flops.bf16", "flops.f32", "memory_bandwidth", "backend"], "device",
        )
        backend = "nccl"
        if "backend" in fields:
            value = fields["backend"].value
            if isinstance(value, A.Str) and value.value in T.BACKENDS:
                backend = value.value
            else:
                self.diags.append(diag("PL221", f"`backend` is one of {', '.join(map(repr, T.BACKENDS))}, not "
                                                f"`{value}`", value.span,
                                       help='write `backend = "gloo"` for CPU ranks, `"nccl"` (the default) for GPUs'))
        flops = []
        for key, f in fields.items():
            if key.startswith("flops."):
                dtype = key.split(".", 1)[1]
                if dtype not in DTYPES:
                    self._unknown_dtype(dtype, f.key.parts[-1].span)
                    continue
                v = self._quantity(f.value, Kind.THROUGHPUT, key)
                if v is not None:
                    flops.append((DTYPES[dtype], v))
        if "memory" not in fields:
            self.diags.append(diag("PL213", f"device `{st.name.text}` has no `memory`", st.name.span,
                                   help="add `memory = 80 GiB` (the device's memory)"))
            return None
        mem = self._quantity(fields["memory"].value, Kind.MEMORY, "memory")
        if mem is None:
            return None
        hbm = None
        if "memory_bandwidth" in fields:
            hbm = self._quantity(fields["memory_bandwidth"].value, Kind.BANDWIDTH, "memory_bandwidth")
        return T.Device(st.name.text, int(mem), tuple(sorted(flops)), backend, span=st.span, memory_bandwidth=hbm)

    def _link(self, st: A.LinkDecl) -> T.Link | None:
        fields = self._fields(st.fields, lambda k: k in ("bandwidth", "latency"), ["bandwidth", "latency"], "link")
        if "bandwidth" not in fields:
            self.diags.append(diag("PL213", f"link `{st.name.text}` has no `bandwidth`", st.name.span,
                                   help="add `bandwidth = 25 GB/s` (one direction, per device)"))
            return None
        bw = self._quantity(fields["bandwidth"].value, Kind.BANDWIDTH, "bandwidth")
        lat = self._quantity(fields["latency"].value, Kind.TIME, "latency") if "latency" in fields else 0.0
        if bw is None or lat is None:
            return None
        return T.Link(st.name.text, bw, lat, span=st.span)

    def _unknown_dtype(self, dtype: str, span: Span) -> None:
        guess = did_you_mean(dtype, DTYPES)
        self.diags.append(diag(
            "PL214", f"unknown dtype `{dtype}`", span,
            help=f"did you mean `{guess}`?" if guess else "dtypes: f32, bf16, f16, i64, i32, bool, ...",
            fix=did_you_mean_fix(span, dtype, guess, DTYPES),
        ))

    # ------------------------------------------------------------------ name lookup
    def _lookup(self, ns: Namespace, name: A.Dotted, table: str, what: str):
        """Find `a.b.c` in `ns`: leading parts walk `use` aliases, the last part is looked up in `table`."""
        cur = ns
        parts = [p.text for p in name.parts]
        for i, part in enumerate(parts[:-1]):
            nxt = cur.modules.get(part)
            if nxt is None:
                if ("modules", part) in cur.broken or cur.unparsed:  # its `use` failed, and said so
                    return None
                if (id(cur), part) in self._unknown_modules:  # one `use` is missing: said at its first name
                    return None
                self._unknown_modules.add((id(cur), part))
                guess = did_you_mean(part, list(cur.modules))
                self.diags.append(diag(
                    "PL202", f"unknown module `{part}` in `{name}`", name.parts[i].span,
                    help=f"did you mean `{guess}`?" if guess else f"bring it in with `use {part}`",
                    fix=did_you_mean_fix(name.parts[i].span, part, guess, list(cur.modules)),
                ))
                return None
            if cur is ns:
                ns.used.add(part)
            cur = nxt
        found = getattr(cur, table).get(parts[-1])
        if found is None and (table, parts[-1]) not in cur.broken and not cur.unparsed:
            candidates = list(getattr(cur, table))
            if len(parts) == 1:  # also offer qualified names from used modules
                candidates += [f"{a}.{n}" for a, m in ns.modules.items() for n in getattr(m, table)]
            word = parts[-1] if len(parts) > 1 else str(name)
            guess = did_you_mean(word, candidates)
            # the fix replaces the last part only (`hardware.a100_80gb`: `a100_80gb`), or the whole name
            fix = did_you_mean_fix(name.parts[-1].span if len(parts) > 1 else name.span, word, guess, candidates)
            if guess and len(parts) > 1:  # the name as it would be written here: `hardware.a100_80g`
                guess = ".".join(parts[:-1] + [guess])
            self.diags.append(diag(
                "PL205" if table == "templates" else "PL202", f"unknown {what} `{name}`", name.span,
                help=f"did you mean `{guess}`?" if guess else (
                    "declare it, or `use` the module that does (e.g. `use hardware`)"),
                fix=fix,
            ))
        return found

    # ------------------------------------------------------------------ mesh
    def _mesh(self, st, ns: Namespace) -> T.Mesh | None:
        if isinstance(st, A.MeshAlias):
            mesh = self._lookup(ns, st.target, "meshes", "mesh")
            if mesh is None:
                return None
            return T.Mesh(st.name.text, mesh.device, mesh.axes, mesh.device_count, span=st.span)
        device = self._lookup(ns, st.device, "devices", "device")
        axes: list[T.Axis] = []
        seen: dict[str, Span] = {}
        for ax in st.axes:
            if ax.name.text in seen:
                self.diags.append(diag("PL209", f"axis `{ax.name.text}` is declared twice", ax.name.span,
                                       labels=[Label(seen[ax.name.text], "first declared here")],
                                       help="each mesh axis needs its own name"))
                continue
            seen[ax.name.text] = ax.name.span
            size = T.Hole("mesh axis size", span=ax.size.span) if isinstance(ax.size, A.Hole) else ax.size.value
            link = self._lookup(ns, ax.link, "links", "link") if ax.link is not None else None
            axes.append(T.Axis(ax.name.text, size, link, span=ax.span,
                               link_ref=str(ax.link) if ax.link is not None else None))
        count = st.count.value if st.count is not None else None
        return T.Mesh(st.name.text, device, tuple(axes), count, span=st.span)

    def _all(self, ns: Namespace, table: str):
        seen, out = set(), []

        def walk(n: Namespace):
            if id(n) in seen:
                return
            seen.add(id(n))
            out.extend(getattr(n, table).values())
            for m in n.modules.values():
                walk(m)

        walk(ns)
        return out

    def _no_duplicate_keys(self, names: list[A.Name], what: str) -> None:
        seen: dict[str, Span] = {}
        for n in names:
            if n.text in seen:
                self.diags.append(diag("PL209", f"{what} `{n.text}` is given twice", n.span,
                                       labels=[Label(seen[n.text], "first given here")]))
            seen.setdefault(n.text, n.span)

    def _optimizer(self, st: A.OptimizerDecl) -> T.Optimizer:
        if st.name.text not in T.OPTIMIZERS:
            guess = did_you_mean(st.name.text, T.OPTIMIZERS)
            self.diags.append(diag(
                "PL216", f"unknown optimizer `{st.name.text}`", st.name.span,
                help=f"did you mean `{guess}`?" if guess else "known: " + ", ".join(T.OPTIMIZERS),
                fix=did_you_mean_fix(st.name.span, st.name.text, guess, T.OPTIMIZERS),
            ))
        self._no_duplicate_keys([kw.name for kw in st.args or ()], "argument")
        kwargs = tuple((kw.name.text, self._literal(kw.value, "an optimizer argument")) for kw in st.args or ())
        names = ["zero", *T.PRECISION_FIELDS]
        fields = self._fields(st.fields or (), lambda k: k in names, names, "optimizer")
        stage: int | T.Hole = 0
        axis: str | T.Hole | None = None
        if "zero" in fields:
            f = fields["zero"]
            if isinstance(f.value, A.Hole):
                stage = T.Hole("ZeRO stage", span=f.value.span)
            elif isinstance(f.value, A.Int):
                stage = f.value.value
            else:
                self.diags.append(diag("PL221", f"`zero` takes a stage number 0-3, not `{f.value}`", f.value.span))
            if isinstance(f.over, A.Hole):
                axis = T.Hole("ZeRO axis", span=f.over.span)
            elif f.over is not None:
                axis = f.over.text
        return T.Optimizer(st.name.text, kwargs, stage, axis, span=st.span, precision=self._precision(fields))

    def _precision(self, fields: dict[str, A.Field]) -> T.Precision | None:
        """The optimizer block's precision fields as a `Precision`; None when it has none.

        `precision = D` is the usual recipe in one word: parameters and compute in D, gradients reduced
        and the master copy (with the optimizer state) in f32. The other fields set one dtype each and
        win over it; without `precision`, each defaults to f32 but `compute`, which follows `params`."""
        given = {k: f for k, f in fields.items() if k in T.PRECISION_FIELDS}
        if not given:
            return None
        dtypes: dict[str, str] = {}
        for key in ("precision", "params", "compute", "reduce", "master"):
            f = given.get(key)
            if f is None:
                continue
            name = str(f.value) if isinstance(f.value, A.Ref) else None
            if name is None:
                self.diags.append(diag("PL221", f"`{key}` takes a dtype (f32, bf16, f16), not `{f.value}`",
                                       f.value.span))
            elif name not in DTYPES:
                self._unknown_dtype(name, f.value.span)
            else:
                dtypes[key] = DTYPES[name]
        base = dtypes.get("precision", "f32")
        params = dtypes.get("params", base)
        scale: str | float | None = None
        if "loss_scale" in given:
            v = given["loss_scale"].value
            if isinstance(v, A.Ref) and str(v) == "dynamic":
                scale = "dynamic"
            elif isinstance(v, (A.Int, A.Float)) and v.value > 0:
                scale = float(v.value)
            else:
                self.diags.append(diag("PL221", f"`loss_scale` takes `dynamic` or a positive number, not `{v}`",
                                       v.span))
        first = next(iter(given.values()))
        return T.Precision(params=params, compute=dtypes.get("compute", params if "precision" not in dtypes else base),
                           reduce=dtypes.get("reduce", "f32"), master=dtypes.get("master", "f32"),
                           loss_scale=scale, span=first.span,
                           field_spans=tuple((k, f.span) for k, f in given.items()))
