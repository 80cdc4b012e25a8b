"""Resolve a parsed plan into a `Plan`: load `use`d modules, bind names, expand templates and loops.

Resolution never executes code: `use` reads .plan files from stdlib/ and the plan's folder only.
Binding problems (unknown names, units, arity, cycles) are PL2xx diagnostics; everything that can
still be resolved is, so the checker sees as much of the plan as possible.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path as FsPath
from typing import Callable

from planlang.lang import ast as A
from planlang.lang.codes import CODES
from planlang.lang.diagnostics import Diagnostic, Label, did_you_mean
from planlang.lang.parser import ParseResult, no_cycle_collection, parse
from planlang.lang.source import SourceFile, Span, decode_plan

from . import types as T
from .selection import Selection
from .units import Kind, UNITS, example_units, unit_kind

# package data (in the wheel too); `stdlib/` at the top of the checkout links here
STDLIB_DIR = FsPath(__file__).resolve().parents[1] / "stdlib"
MAX_EXPANSION_DEPTH = 256  # template applications and `for` loops open at once (PL226): far beyond any
                           # real plan, and each level is one or two frames of the resolver's recursion, so
                           # a deeper (finite) chain is a coded error, not a RecursionError
MAX_EXPANSIONS = 100_000  # template applications in one plan (PL224), plus EXPANSIONS_PER_APPLY for each
EXPANSIONS_PER_APPLY = 100  # `apply` written in it: a chain applying the next twice per level doubles at
                            # each level, while a big plan's applications grow with its text
EXPANSION_CHARS = 256  # an application of a template whose text is longer counts once per this many
                        # characters: what expanding builds grows with the body (a 200 KB path expanded
                        # 100,000 times would build gigabytes)
MAX_QUANTITY = 1e30  # base units (bytes, B/s, s, FLOP/s): far beyond any machine, below float overflow

DTYPES = {
    "f64": "f64", "float64": "f64", "f32": "f32", "float32": "f32", "fp32": "f32", "f16": "f16",
    "float16": "f16", "fp16": "f16", "bf16": "bf16", "bfloat16": "bf16", "fp8": "fp8", "i64": "i64",
    "int64": "i64", "i32": "i32", "int32": "i32", "i16": "i16", "int16": "i16", "i8": "i8", "int8": "i8",
    "u8": "u8", "uint8": "u8", "bool": "bool", "tf32": "tf32",
}
PARAM_KINDS = ("axis", "int")
DECLARATIONS = (A.Use, A.DeviceDecl, A.LinkDecl, A.MeshDecl, A.MeshAlias, A.TemplateDecl)


def diag(code: str, message: str, span: Span, *, help: str | None = None, labels=(), notes=()) -> Diagnostic:
    """A diagnostic with the registry's default severity for `code`."""
    return Diagnostic(code, CODES[code].severity, message, span, tuple(labels), help, tuple(notes))


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


@dataclass(frozen=True)
class Resolution:
    plan: T.Plan | None
    diagnostics: tuple[Diagnostic, ...]
    sources: dict[str, SourceFile]
    modules: dict[str, A.Module]  # every parsed file, root included


@dataclass(frozen=True)
class _Ctx:
    """Expansion context for bodies of `for` and `template`."""

    ns: Namespace
    prefix: Selection | None = None
    loopvars: tuple[tuple[str, Selection], ...] = ()
    params: tuple[tuple[str, object], ...] = ()  # name -> str axis | int | T.Hole
    origin: tuple[Span, ...] = ()
    depth: int = 0  # templates being expanded
    scope: Selection | None = None  # the innermost `for` selection or pattern `apply` target
    active: tuple[tuple[int, str], ...] = ()  # (id(), name as applied) of each template being expanded,
                                              # outermost first
    nesting: int = 0  # templates being expanded and `for` loops open, together (MAX_EXPANSION_DEPTH)

    @cached_property
    def bound(self) -> dict[str, object]:
        """`params` as a dict (looked up for every axis name of every spec)."""
        return dict(self.params)


def _template_chain(names: list[str], ends: int = 3) -> str:
    """`a` -> `b` -> `c`, the middle of a long chain left out (a message, not a listing)."""
    shown = [f"`{n}`" for n in names]
    if len(shown) > 2 * ends + 1:
        shown = shown[:ends] + [f"... ({len(shown) - 2 * ends} more)"] + shown[-ends:]
    return " -> ".join(shown)


def _is_file(path: FsPath) -> bool:
    """`path.is_file()`, False where the name cannot be looked up at all (too long, a NUL in it)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


class Resolver:
    """Resolves one plan file and the modules it uses. `use` is confined (PL222): to the standard library,
    the root plan's folder and below, and the `search_paths` the user configured (`use-paths`)."""

    def __init__(self, read: Callable[[str], str] | None = None, stdlib: FsPath = STDLIB_DIR,
                 search_paths: tuple[str, ...] = ()):
        self.read = read or (lambda p: FsPath(p).read_text(encoding="utf-8"))
        self.stdlib = stdlib
        self.search_paths = tuple(FsPath(p) for p in search_paths)
        self.root: FsPath | None = None  # the root plan's folder, set by the first resolve_text
        self.diags: list[Diagnostic] = []
        self.sources: dict[str, SourceFile] = {}
        self.modules: dict[str, A.Module] = {}
        self.cache: dict[str, Namespace] = {}
        self.stack: list[str] = []
        self.expansions = 0  # template applications so far (PL224)
        self.expansion_budget: int | None = None  # set at the first application, when every file is read
        # a big plan repeats itself: the same template spec for each `apply`, the same `[_, tp]` on many
        # lines. Resolved specs are shared (by AST node and template arguments), and so are their dims.
        self._specs: dict[tuple, T.Spec] = {}
        self._dims: dict[tuple, tuple] = {}
        self._segments: dict[tuple, object] = {}  # for Selection.from_path
        self._spec_shapes: dict[str, tuple] = {}  # spec text -> _spec_shape
        self._unknown_modules: set[tuple[int, str]] = set()  # (namespace, alias) already reported (PL202)

    # ------------------------------------------------------------------ entry points
    def resolve_text(self, text: str, path: str) -> Resolution:
        with no_cycle_collection():  # a big plan resolves to millions of objects and no cycles
            return self._resolve_text(text, path)

    def _resolve_text(self, text: str, path: str) -> Resolution:
        if self.root is None:
            self.root = FsPath(path).parent.resolve()
        result = parse(text, path)
        self.sources[path] = result.source
        self.modules[path] = result.module
        if result.diagnostics:
            return Resolution(None, result.warnings + result.diagnostics, self.sources, self.modules)
        self.diags.extend(result.warnings)
        self.stack.append(_key(path))
        ns = Namespace(path)
        self._declare(result.module, ns, is_root=True)
        plan = self._build_plan(result.module, ns)
        self.stack.pop()
        for alias, span in ns.use_spans.items():
            if alias not in ns.used:
                self.diags.append(diag("PL218", f"`{alias}` is never used", span, help="remove this `use`"))
        ns.templates.clear()  # (decl, ns) entries make a cycle per template: freed now, not at the next collection
        return Resolution(plan, tuple(self.diags), self.sources, self.modules)

    def resolve_file(self, path: str) -> Resolution:
        try:
            text = self.read(path)
        except UnicodeDecodeError:  # PL105 at the first bad byte; nothing else can be said of the file
            source, bad = decode_plan(FsPath(path).read_bytes(), path)
            self.sources[path] = source
            return Resolution(None, (diag("PL105", "the file is not UTF-8 text: this byte is not valid UTF-8",
                                          source.span(*(bad or (0, 0))), help="save the file as UTF-8"),),
                              self.sources, self.modules)
        return self.resolve_text(text, path)

    # ------------------------------------------------------------------ modules
    def _find_module(self, use: A.Use, from_path: str) -> str | None:
        base = FsPath(from_path).parent
        if isinstance(use.target, A.Str):
            cand = base / use.target.value
            return str(cand) if _is_file(cand) else None
        rel = FsPath(*[p.text for p in use.target.parts]).with_suffix(".plan")
        for root in (self.stdlib, base, *self.search_paths):
            cand = root / rel
            if _is_file(cand):
                return str(cand)
        return None

    def allowed(self, path: str) -> bool:
        """Whether `use` may read `path`: a .plan file (links followed) inside the standard library, the
        root plan's folder or a configured search path."""
        real = FsPath(path).resolve()
        roots = [self.stdlib.resolve(), *(p.resolve() for p in self.search_paths)]
        roots.append(self.root if self.root is not None else FsPath.cwd().resolve())
        return real.suffix == ".plan" and any(real == r or r in real.parents for r in roots)

    def _load(self, use: A.Use, from_path: str) -> Namespace | None:
        found = self._find_module(use, from_path)
        target = str(use.target.value) if isinstance(use.target, A.Str) else str(use.target)
        if found is not None and not self.allowed(found):  # checked before the file is read
            shown = f'"{target}"' if isinstance(use.target, A.Str) else target
            inside = self.allowed(str(FsPath(found).resolve().with_suffix(".plan")))
            why = "is not a .plan file" if inside else "reaches outside the plan's folders"
            self.diags.append(diag(
                "PL222", f"`use {shown}` {why}", use.target.span,
                help="use stdlib modules, .plan files in the plan's folder or below, or add the folder to "
                     "`use-paths` in planlang.toml"))
            return None
        if found is None:
            where = "next to the plan" if isinstance(use.target, A.Str) else "in stdlib/ or next to the plan"
            modules = self.stdlib_modules()
            guess = self._module_guess(use)
            self.diags.append(diag(
                "PL203", f"module `{target}` not found", use.target.span,
                help=f"did you mean `use {guess}`?" if guess else
                f"no file {where}; available stdlib modules: {', '.join(modules) or 'none'}",
            ))
            return None
        key = _key(found)
        if key in self.stack:
            chain = " -> ".join(FsPath(p).name for p in self.stack[self.stack.index(key):] + [key])
            self.diags.append(diag("PL204", f"cyclic use: {chain}", use.span,
                                   help="move the shared declarations into a module both files use"))
            return None
        if key in self.cache:
            return self.cache[key]
        try:
            text = self.read(found)
        except (OSError, UnicodeDecodeError) as err:
            self.diags.append(diag("PL203", f"module `{target}` cannot be read: {err}", use.target.span))
            return None
        result: ParseResult = parse(text, found)
        self.sources[found] = result.source
        self.modules[found] = result.module
        self.diags.extend(result.warnings + result.diagnostics)
        ns = Namespace(found, unparsed=bool(result.diagnostics))
        self.cache[key] = ns
        self.stack.append(key)
        self._declare(result.module, ns, is_root=False)
        self.stack.pop()
        return ns

    def _module_guess(self, use: A.Use) -> str | None:
        """The stdlib module a `use` that found nothing probably meant (`use megatorn`: patterns.megatron)."""
        if isinstance(use.target, A.Str):
            return None
        target, modules = str(use.target), self.stdlib_modules()
        guess = did_you_mean(target, modules)
        if guess is None:
            by_last = {m.rpartition(".")[2]: m for m in modules}
            last = did_you_mean(target.rpartition(".")[2], by_last)
            guess = by_last.get(last) if last else None
        return guess

    def stdlib_modules(self) -> list[str]:
        if not self.stdlib.is_dir():
            return []
        out = []
        for p in sorted(self.stdlib.rglob("*.plan")):
            out.append(".".join(p.relative_to(self.stdlib).with_suffix("").parts))
        return out

    # ------------------------------------------------------------------ declarations
    def _declare(self, module: A.Module, ns: Namespace, is_root: bool) -> None:
        seen: dict[str, Span] = {}

        def claim(name: A.Name, what: str) -> bool:
            if name.text in seen:
                self.diags.append(diag(
                    "PL209", f"{what} `{name.text}` is declared twice", name.span,
                    labels=[Label(seen[name.text], "first declared here")], help="rename or remove one of them",
                ))
                return False
            seen[name.text] = name.span
            return True

        for st in module.statements:
            if isinstance(st, A.Use):
                alias = st.alias.text if st.alias else (
                    _stem(st.target.value) if isinstance(st.target, A.Str) else st.target.parts[-1].text)
                span = st.alias.span if st.alias else st.target.span
                if not claim(A.Name(alias, span=span), "name"):
                    continue
                loaded = self._load(st, ns.path)
                if loaded is None:
                    ns.broken.add(("modules", alias))
                    guess = None if st.alias else self._module_guess(st)
                    if guess:  # `use hardwre`, then `hardware.cpu` as meant: one error, at the `use`
                        ns.broken.add(("modules", guess.rpartition(".")[2]))
                else:
                    ns.modules[alias] = loaded
                    if is_root:
                        ns.use_spans[alias] = st.span
            elif not is_root and not isinstance(st, DECLARATIONS):
                kind = type(st).__name__.replace("Decl", "").replace("Stmt", "").lower()
                self.diags.append(diag(
                    "PL217", f"a `{kind}` statement in a used module has no effect", st.span,
                    help="only device, link, mesh and template declarations can be used from another file",
                ))
        # hardware first so meshes can refer to devices and links declared anywhere in the file
        for st in module.statements:
            if isinstance(st, A.DeviceDecl) and claim(st.name, "device"):
                dev = self._device(st)
                if dev:
                    ns.devices[st.name.text] = dev
                else:
                    ns.broken.add(("devices", st.name.text))
            elif isinstance(st, A.LinkDecl) and claim(st.name, "link"):
                link = self._link(st)
                if link:
                    ns.links[st.name.text] = link
                else:
                    ns.broken.add(("links", st.name.text))
            elif isinstance(st, A.TemplateDecl) and claim(st.name, "template"):
                self._check_template_params(st)
                ns.templates[st.name.text] = (st, ns)
        for st in module.statements:
            if isinstance(st, (A.MeshDecl, A.MeshAlias)) and not is_root and claim(st.name, "mesh"):
                mesh = self._mesh(st, ns)
                if mesh:
                    ns.meshes[st.name.text] = mesh
                else:
                    ns.broken.add(("meshes", st.name.text))

    def _check_template_params(self, st: A.TemplateDecl) -> None:
        seen: dict[str, Span] = {}
        for p in st.params:
            if p.kind.text not in PARAM_KINDS:
                guess = did_you_mean(p.kind.text, PARAM_KINDS)
                self.diags.append(diag(
                    "PL208", f"unknown parameter kind `{p.kind.text}`", p.kind.span,
                    help=f"did you mean `{guess}`?" if guess else "parameter kinds are `axis` and `int`",
                ))
            if p.name.text in seen:
                self.diags.append(diag("PL209", f"parameter `{p.name.text}` is declared twice", p.name.span,
                                       labels=[Label(seen[p.name.text], "first declared here")]))
            seen[p.name.text] = p.name.span

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
                guess = did_you_mean(unit, [u for u, (k, _) in UNITS.items() if k == kind])
                self.diags.append(diag(
                    "PL250", f"unknown unit `{unit}`", value.unit.span,
                    help=f"did you mean `{guess}`?" if guess else f"{kind.value} units: {example_units(kind)}",
                ))
                return None
            if unit_kind(unit) != kind:
                self.diags.append(diag(
                    "PL251", f"{what} needs a {kind.value} unit, but `{unit}` is a {unit_kind(unit).value} unit",
                    value.unit.span, help=f"{kind.value} units: {example_units(kind)}",
                ))
                return None
            if kind is Kind.MEMORY and unit in ("KB", "MB", "GB", "TB", "PB"):
                self.diags.append(diag(
                    "PL253", f"`{value}` is {value.number.value} x 10^{3 * 'KMGTP'.index(unit[0]) + 3} bytes",
                    value.unit.span, help=f"write `{value.number} {unit[0]}iB` for binary units (as device memory is sold)",
                ))
            return self._in_range(value, kind, what)
        if isinstance(value, (A.Int, A.Float)):
            self.diags.append(diag(
                "PL252", f"{what} `{value}` has no unit", value.span,
                help=f"add a {kind.value} unit, e.g. `{value} {example_units(kind).split(',')[0]}`",
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
            st.fields, lambda k: k in ("memory", "backend") or (k.startswith("flops.") and k.count(".") == 1),
            ["memory", "flops.bf16", "flops.f32", "backend"], "device",
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
        return T.Device(st.name.text, int(mem), tuple(sorted(flops)), backend, span=st.span)

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
            guess = did_you_mean(parts[-1] if len(parts) > 1 else str(name), candidates)
            if guess and len(parts) > 1:  # the name as it would be written here: `hardware.a100_80g`
                guess = ".".join(parts[:-1] + [guess])
            self.diags.append(diag(
                "PL205" if table == "templates" else "PL202", f"unknown {what} `{name}`", name.span,
                help=f"did you mean `{guess}`?" if guess else (
                    "declare it, or `use` the module that does (e.g. `use hardware`)"),
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

    # ------------------------------------------------------------------ the plan
    def _build_plan(self, module: A.Module, ns: Namespace) -> T.Plan:
        first: dict[type, A.Node] = {}
        once = (A.ModelDecl, A.BudgetDecl, A.OptimizerDecl, A.PipelineDecl)
        model = mesh = budget = optimizer = pipeline = None
        inputs: list[T.Input] = []
        input_spans: dict[str, Span] = {}
        data: list[T.DataSpec] = []
        shards: list[T.ShardRule] = []
        checkpoints: list[T.CheckpointGroup] = []
        checkpoint_hole = None
        ctx = _Ctx(ns)
        # an input may be declared after the `data` statement that splits it (declarations are not ordered)
        declared_inputs = {st.name.text for st in module.statements if isinstance(st, A.InputDecl)}
        # A file with several meshes and no model is a library of presets (stdlib/meshes.plan):
        # every mesh is checked and none is the plan's mesh.
        meshes = [s for s in module.statements if isinstance(s, (A.MeshDecl, A.MeshAlias))]
        library = len(meshes) > 1 and not any(isinstance(s, A.ModelDecl) for s in module.statements)
        if library:
            seen_mesh: dict[str, Span] = {}
            for st in meshes:
                if st.name.text in seen_mesh:
                    self.diags.append(diag("PL209", f"mesh `{st.name.text}` is declared twice", st.name.span,
                                           labels=[Label(seen_mesh[st.name.text], "first declared here")]))
                seen_mesh.setdefault(st.name.text, st.name.span)
                self._mesh(st, ns)

        for st in module.statements:
            if library and isinstance(st, (A.MeshDecl, A.MeshAlias)):
                continue
            kind = A.MeshDecl if isinstance(st, (A.MeshDecl, A.MeshAlias)) else type(st)
            if kind in once + (A.MeshDecl,):
                if kind in first:
                    word = {A.ModelDecl: "model", A.BudgetDecl: "budget", A.OptimizerDecl: "optimizer",
                            A.PipelineDecl: "pipeline", A.MeshDecl: "mesh"}[kind]
                    self.diags.append(diag(
                        "PL210", f"a plan has one `{word}`; this is a second one", st.span,
                        labels=[Label(first[kind].span, "the first one, which is used")],
                        help=f"remove one of the `{word}` statements",
                    ))
                    continue
                first[kind] = st
            if isinstance(st, A.ModelDecl):
                kwargs = tuple((kw.name.text, self._literal(kw.value, "a model argument")) for kw in st.args or ())
                self._no_duplicate_keys([kw.name for kw in st.args or ()], "argument")
                if ":" not in st.factory.value:
                    self.diags.append(diag(
                        "PL221", f'model factory "{st.factory.value}" is not of the form "module:callable"',
                        st.factory.span, help='for example "examples.mlp.model:build"',
                    ))
                model = T.ModelRef(st.name.text, st.factory.value, kwargs, span=st.span)
            elif isinstance(st, A.InputDecl):
                if st.name.text in input_spans:
                    self.diags.append(diag("PL209", f"input `{st.name.text}` is declared twice", st.name.span,
                                           labels=[Label(input_spans[st.name.text], "first declared here")]))
                    continue
                input_spans[st.name.text] = st.name.span
                if st.dtype.text not in DTYPES:
                    self._unknown_dtype(st.dtype.text, st.dtype.span)
                self._no_duplicate_keys([d.name for d in st.dims], "dim")
                dims = tuple((d.name.text, d.size.value) for d in st.dims)
                inputs.append(T.Input(st.name.text, DTYPES.get(st.dtype.text, st.dtype.text), dims, span=st.span))
            elif isinstance(st, (A.MeshDecl, A.MeshAlias)):
                mesh = self._mesh(st, ns)
            elif isinstance(st, A.BudgetDecl):
                amount = self._quantity(st.amount, Kind.MEMORY, "the budget")
                if amount is not None:
                    budget = T.Budget(int(amount), span=st.span)
            elif isinstance(st, A.OptimizerDecl):
                optimizer = self._optimizer(st)
            elif isinstance(st, A.DataDecl):
                if st.input.text not in declared_inputs:
                    guess = did_you_mean(st.input.text, declared_inputs)
                    self.diags.append(diag(
                        "PL211", f"unknown input `{st.input.text}`", st.input.span,
                        help=f"did you mean `{guess}`?" if guess else "declare it: `input idx : i64[batch=32, seq=512]`",
                    ))
                    continue
                data.append(T.DataSpec(st.input.text, self._spec(st.spec, ctx, "data spec"), span=st.span))
            elif isinstance(st, A.PipelineDecl):
                pipeline = self._pipeline(st)
            elif isinstance(st, A.CheckpointStmt) and isinstance(st.paths, A.Hole):
                checkpoint_hole = T.Hole("checkpoint groups", span=st.span)
            elif isinstance(st, (A.ShardStmt, A.CheckpointStmt, A.ApplyStmt, A.ForStmt)):
                self._body(st, ctx, shards, checkpoints)
        return T.Plan(
            path=module.path, model=model, inputs=tuple(inputs), mesh=mesh, budget=budget, optimizer=optimizer,
            data=tuple(data), shards=tuple(shards), pipeline=pipeline, checkpoints=tuple(checkpoints),
            checkpoint_hole=checkpoint_hole, devices=tuple(self._all(ns, "devices")),
            links=tuple(self._all(ns, "links")),
        )

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

    def _pipeline(self, st: A.PipelineDecl) -> T.Pipeline:
        axis = T.Hole("pipeline axis", span=st.axis.span) if isinstance(st.axis, A.Hole) else st.axis.text
        if isinstance(st.schedule, A.Hole):
            schedule: T.Schedule | T.Hole = T.Hole("schedule", span=st.schedule.span)
        else:
            name = st.schedule.name.text
            if name not in T.SCHEDULES:
                guess = did_you_mean(name, T.SCHEDULES)
                self.diags.append(diag(
                    "PL215", f"unknown schedule `{name}`", st.schedule.name.span,
                    help=f"did you mean `{guess}`?" if guess else "schedules: gpipe, 1f1b, interleaved chunks N",
                ))
            ch = st.schedule.chunks
            chunks = 1 if ch is None else (T.Hole("chunks", span=ch.span) if isinstance(ch, A.Hole) else ch.value)
            schedule = T.Schedule(name, chunks, span=st.schedule.span)
        micro = (T.Hole("microbatches", span=st.microbatches.span) if isinstance(st.microbatches, A.Hole)
                 else st.microbatches.value)
        if isinstance(st.stages, A.Hole):
            stages: tuple[T.Stage, ...] | T.Hole = T.Hole("stages", span=st.stages.span)
        else:
            out = []
            for i, sd in enumerate(st.stages):
                self._no_duplicate_keys([d.axis for d in sd.degrees], "axis")
                degrees = tuple(
                    (d.axis.text, T.Hole("stage degree", span=d.size.span) if isinstance(d.size, A.Hole) else d.size.value)
                    for d in sd.degrees
                )
                out.append(T.Stage(i, tuple(Selection.from_path(p) for p in sd.paths), degrees, span=A.raw_span(sd)))
            stages = tuple(out)
        return T.Pipeline(axis, schedule, micro, stages, span=st.span)

    # ------------------------------------------------------------------ specs and bodies
    def _axis_name(self, name: A.Name, ctx: _Ctx) -> str | T.Hole:
        bound = ctx.bound.get(name.text)
        if bound is None:
            return name.text
        if isinstance(bound, (str, T.Hole)):
            return bound
        self.diags.append(diag("PL207", f"`{name.text}` is an int parameter, used here as an axis", name.span))
        return T.Hole("spec entry", span=name.span)  # reported once; not also an unknown axis

    def _spec(self, spec, ctx: _Ctx, what: str) -> T.Spec | T.Hole:
        # spans are passed on as the parser stored them (A.raw_span): a big plan has millions
        if isinstance(spec, A.Hole):
            return T.Hole(what, span=A.raw_span(spec))
        # in a template, the same spec node with the same arguments resolves to the same Spec (holes
        # aside: a hole argument carries the span of its `apply`); not when resolving it reported something
        key = (None if not ctx.depth or any(isinstance(v, T.Hole) for _, v in ctx.params)
               else (id(spec), ctx.params))
        if key is not None and key in self._specs:
            return self._specs[key]
        reported = len(self.diags)
        out = self._spec_of(spec, ctx)
        if key is not None and len(self.diags) == reported:
            self._specs[key] = out
        return out

    def _spec_of(self, spec: A.Spec, ctx: _Ctx) -> T.Spec:
        text = A.spec_compact(spec)
        if text is not None:  # a parsed spec kept as text: resolved without building its nodes if it can be
            shape = self._spec_shapes.get(text)
            if shape is None:
                shape = self._spec_shapes[text] = _spec_shape(text)
            out = self._spec_from_shape(shape, spec, ctx)
            if out is not None:
                return out
        dims: list[tuple[str, ...] | T.Hole] = []
        for e in spec.entries:
            if isinstance(e, A.Replicated):
                dims.append(())
            elif isinstance(e, A.Hole):
                dims.append(T.Hole("spec entry", span=A.raw_span(e)))
            elif isinstance(e, A.AxisEntry):
                v = self._axis_name(e.axis, ctx)
                dims.append(T.Hole("spec entry", span=A.raw_span(e)) if isinstance(v, T.Hole) else (v,))
            else:
                vs = [self._axis_name(a, ctx) for a in e.axes]
                dims.append(T.Hole("spec entry", span=A.raw_span(e)) if any(isinstance(v, T.Hole) for v in vs)
                            else tuple(vs))
        partial = []
        for p in spec.partial:
            v = self._axis_name(p, ctx)
            if isinstance(v, str):
                partial.append(v)
            elif ctx.bound.get(p.text) is not None and isinstance(ctx.bound[p.text], T.Hole):
                self.diags.append(diag("PL221", f"`partial({p.text})` needs an axis, but `{p.text}` is a hole here",
                                       p.span, help="pass an axis name to the template; partial sums are not solved"))
        dims_t, partial_t = tuple(dims), tuple(partial)
        if not any(isinstance(d, T.Hole) for d in dims_t):
            dims_t = self._dims.setdefault(dims_t, dims_t)
        partial_t = self._dims.setdefault(partial_t, partial_t)
        return T.Spec(dims_t, partial_t, span=A.raw_span(spec),
                      dim_spans=tuple([A.raw_span(e) for e in spec.entries]),
                      partial_spans=tuple([A.raw_span(p) for p in spec.partial]))

    def _spec_from_shape(self, shape, spec: A.Spec, ctx: _Ctx) -> T.Spec | None:
        """`_spec_of` for a spec of that shape when it reports nothing and has no hole: every axis name
        free or bound to an axis by the template (None otherwise: the caller builds the nodes)."""
        entries, partial, names = shape
        bound = ctx.bound
        if entries is None or any(not isinstance(bound.get(n, ""), str) for n in names):
            return None
        dims = tuple(axes if not axes else tuple(bound.get(a, a) for a in axes) for axes in entries)
        dims = self._dims.setdefault(dims, dims)
        partial_t = tuple(bound.get(a, a) for a in partial)
        partial_t = self._dims.setdefault(partial_t, partial_t)
        # the entries' spans stay with the parsed spec until a diagnostic asks for them
        return T.Spec(dims, partial_t, span=A.raw_span(spec), dim_spans=spec, partial_spans=spec)

    def _selection(self, path: A.Path, ctx: _Ctx) -> Selection:
        sel = Selection.from_path(path, self._segments)
        head = sel.segments[0]  # the path's first segment (its name, whether it has selectors)
        for var, value in reversed(ctx.loopvars):
            if head.name == var:
                if head.sels:
                    self.diags.append(diag(
                        "PL220", f"loop variable `{var}` cannot take selectors", path.segments[0].span,
                        help=f"`{var}` is one module of the loop; select inside it with `{var}.child`",
                    ))
                replaced = sel.replace_head(var, value)
                if replaced is not None:
                    return replaced
        return sel.prefixed(ctx.prefix) if ctx.prefix is not None else sel

    def _body(self, st, ctx: _Ctx, shards: list, checkpoints: list) -> None:
        if isinstance(st, A.ShardStmt):
            if isinstance(st.target, A.Activation):
                target, kind = self._selection(st.target.path, ctx), st.target.kind
            else:
                target, kind = self._selection(st.target, ctx), "param"
            spec = self._spec(st.spec, ctx, "spec")
            shards.append(T.ShardRule(target, spec, kind, span=A.raw_span(st), origin=ctx.origin))
        elif isinstance(st, A.CheckpointStmt):
            if isinstance(st.paths, A.Hole):
                self.diags.append(diag("PL221", "`checkpoint ?` can only stand at the top level of a plan", st.span))
                return
            every = st.every
            if isinstance(every, A.Name):
                bound = ctx.bound.get(every.text)
                if isinstance(bound, (int, T.Hole)) and not isinstance(bound, bool):
                    every_v: int | T.Hole | None = bound
                else:
                    self.diags.append(diag("PL221", f"`every` needs a whole number or an int parameter, not `{every.text}`",
                                           every.span))
                    every_v = None
            elif isinstance(every, A.Hole):
                every_v = T.Hole("checkpoint every", span=A.raw_span(every))
            else:
                every_v = every.value if every is not None else None
            mods = tuple(self._selection(p, ctx) for p in st.paths)
            checkpoints.append(T.CheckpointGroup(mods, every_v, per=ctx.scope, span=A.raw_span(st), origin=ctx.origin))
        elif isinstance(st, A.ForStmt):
            if ctx.nesting >= MAX_EXPANSION_DEPTH:
                self._too_deep(st.span, ctx, f"`for {st.var.text}`")
                return
            sel = self._selection(st.selection, ctx)
            inner = _Ctx(ctx.ns, ctx.prefix, ctx.loopvars + ((st.var.text, sel),), ctx.params,
                         ctx.origin + (st.span,), ctx.depth, scope=sel, active=ctx.active,
                         nesting=ctx.nesting + 1)
            for b in st.body:
                self._body(b, inner, shards, checkpoints)
        elif isinstance(st, A.ApplyStmt):
            self._apply(st, ctx, shards, checkpoints)

    def _apply(self, st: A.ApplyStmt, ctx: _Ctx, shards: list, checkpoints: list) -> None:
        found = self._lookup(ctx.ns, st.template, "templates", "template")
        if found is None:
            return
        tdecl, tns = found
        # no template may apply itself, directly or through others (there are no conditions: it would
        # never end); caught at its first recursive `apply`, not after 2^32 expansions of a template
        # that applies itself twice. Only that is PL219: a deep chain of different templates ends.
        if any(active == id(tdecl) for active, _ in ctx.active):
            chain = _template_chain([name for _, name in ctx.active] + [str(st.template)])
            self.diags.append(diag("PL219", f"template `{st.template}` expands without end: {chain}", st.span,
                                   help="a template applies itself directly or through other templates"))
            return
        if ctx.nesting >= MAX_EXPANSION_DEPTH:
            self._too_deep(st.span, ctx, f"`{st.template}`")
            return
        args = st.args or ()
        if len(args) != len(tdecl.params):
            sig = ", ".join(f"{p.name.text}: {p.kind.text}" for p in tdecl.params)
            self.diags.append(diag(
                "PL206", f"template `{st.template}` takes {len(tdecl.params)} argument"
                f"{'s' if len(tdecl.params) != 1 else ''}, {len(args)} given", st.template.span,
                labels=[Label(tdecl.name.span, f"declared as `{tdecl.name.text}({sig})`")],
            ))
            return
        params: list[tuple[str, object]] = []
        outer = ctx.bound
        for p, a in zip(tdecl.params, args):
            value = self._argument(p, a, outer)
            if value is None:
                return
            params.append((p.name.text, value))
        if self.expansion_budget is None:
            written = sum(src.text.count("apply") for src in self.sources.values())  # a bound is enough
            self.expansion_budget = MAX_EXPANSIONS + EXPANSIONS_PER_APPLY * written
        budget = self.expansion_budget
        before = self.expansions
        span = tdecl.span
        self.expansions += 1 + ((span.end - span.start) // EXPANSION_CHARS if span is not None else 0)
        if self.expansions > budget:
            if before <= budget:  # reported once, at the outermost `apply`
                top = ctx.origin[0] if ctx.origin else st.span
                self.diags.append(diag(
                    "PL224", f"templates expand to more than {budget:,} applications", top,
                    labels=[Label(st.span, f"application {budget + 1:,}")] if top != st.span else [],
                    help="a template that applies others k times multiplies the count by k at every level (and a "
                         f"template longer than {EXPANSION_CHARS} characters counts once per {EXPANSION_CHARS}); "
                         "apply fewer templates per level, or flatten the chain"))
            return
        target = self._selection(st.target, ctx)
        scope = target if target.is_pattern else ctx.scope
        inner = _Ctx(tns, target, (), tuple(params), ctx.origin + (st.span,), ctx.depth + 1, scope=scope,
                     active=ctx.active + ((id(tdecl), str(st.template)),), nesting=ctx.nesting + 1)
        for b in tdecl.body:
            self._body(b, inner, shards, checkpoints)

    def _too_deep(self, where: Span, ctx: _Ctx, last: str) -> None:
        """PL226: a finite expansion nested deeper than MAX_EXPANSION_DEPTH, at the level (`last`: the
        template applied or the `for` opened there) that would pass it, naming the templates around it."""
        top = ctx.origin[0] if ctx.origin else where
        chain = " -> ".join(filter(None, (_template_chain([name for _, name in ctx.active]), last)))
        self.diags.append(diag(
            "PL226", f"templates and `for` loops nest more than {MAX_EXPANSION_DEPTH} levels deep: "
            f"{chain} would be level {ctx.nesting + 1}", where,
            labels=[Label(top, "level 1")] if top != where else [],
            help="flatten the chain: apply the inner templates side by side, not each inside the last"))

    def _argument(self, p: A.Param, a: A.Value, outer: dict) -> object:
        kind = p.kind.text
        if isinstance(a, A.Hole):
            return T.Hole(f"template argument {p.name.text}", span=a.span)
        if kind == "axis" and isinstance(a, A.Ref) and len(a.name.parts) == 1:
            name = a.name.parts[0].text
            bound = outer.get(name)
            return bound if isinstance(bound, (str, T.Hole)) else name
        if kind == "int":
            if isinstance(a, A.Int):
                return a.value
            if isinstance(a, A.Ref) and len(a.name.parts) == 1 and isinstance(outer.get(a.name.parts[0].text), int):
                return outer[a.name.parts[0].text]
        if kind not in PARAM_KINDS:
            return None  # already reported at the template
        want = "an axis name" if kind == "axis" else "a whole number"
        self.diags.append(diag(
            "PL207", f"parameter `{p.name.text}` takes {want}, not `{a}`", a.span,
            labels=[Label(p.span, f"declared `{p.name.text}: {kind}`")],
        ))
        return None


def _spec_shape(text: str) -> tuple:
    """(entries, partial, names) of a spec written `text` (as `ast.spec_text` prints it): entries as
    tuples of axis names (() for `_`), or None when one is a hole `?`; every name it uses."""
    close = text.index("]")
    body = text[1:close]
    entries = []
    for item in A._split_top(body) if body else ():
        if item == "?":
            entries = None
            break
        entries.append(() if item == "_" else tuple(item.strip("()").split(", ")))
    partial = tuple(text[close + len(" partial(") + 1:-1].split(", ")) if len(text) > close + 1 else ()
    names = {a for axes in entries or () for a in axes} | set(partial)
    return (None if entries is None else tuple(entries)), partial, names


def _key(path: str) -> str:
    return os.path.realpath(path)


def _stem(path: str) -> str:
    stem = FsPath(path).stem
    return "".join(c if c.isalnum() or c == "_" else "_" for c in stem) or "module"


def resolve_file(path: str, **kw) -> Resolution:
    return Resolver(**kw).resolve_file(path)


def resolve_text(text: str, path: str = "<plan>", **kw) -> Resolution:
    return Resolver(**kw).resolve_text(text, path)
