"""Resolve a parsed plan into a `Plan`: load `use`d modules, bind names, expand templates and loops.

Resolution never executes code: `use` reads .plan files from stdlib/ and the plan's folder only.
Binding problems (unknown names, units, arity, cycles) are PL2xx diagnostics; everything that can
still be resolved is, so the checker sees as much of the plan as possible.

The resolver is split by what it holds: this module reads the files (`use`, confinement, cycles) and
their declarations and counts template expansions (PL224); planlang.plan.resolve_values gives the
values of declarations (units, devices, links, meshes, the optimizer), planlang.plan.resolve_body the
plan's statements (specs, `for`, `apply`).
"""
from __future__ import annotations

import os
from pathlib import Path as FsPath
from typing import Callable

from planlang.lang.frozen import value_type
from planlang.lang import ast as A
from planlang.lang.diagnostics import Diagnostic, Label, did_you_mean
from planlang.lang.fixes import delete_statement, did_you_mean_fix, guess_is_unique, replace as replace_fix
from planlang.lang.parser import ParseResult, no_cycle_collection, parse, parse_used
from planlang.lang.source import SourceFile, Span, decode_plan

from . import types as T
from .resolve_body import MAX_EXPANSION_DEPTH, PlanBuilder, _Ctx
from .resolve_values import DTYPES, MAX_QUANTITY, PARAM_KINDS, Namespace, diag

__all__ = ["DECLARATIONS", "DTYPES", "EXPANSION_CHARS", "EXPANSIONS_PER_APPLY", "MAX_EXPANSION_DEPTH",
           "MAX_EXPANSIONS", "MAX_QUANTITY", "PARAM_KINDS", "STDLIB_DIR", "Namespace", "Resolution", "Resolver",
           "diag", "resolve_file", "resolve_text"]

# package data (in the wheel too); `stdlib/` at the top of the checkout links here
STDLIB_DIR = FsPath(__file__).resolve().parents[1] / "stdlib"
MAX_EXPANSIONS = 100_000  # template applications in one plan (PL224), plus EXPANSIONS_PER_APPLY for each
EXPANSIONS_PER_APPLY = 100  # `apply` written in it: a chain applying the next twice per level doubles at
                            # each level, while a big plan's applications grow with its text
EXPANSION_CHARS = 256  # an application of a template whose text is longer counts once per this many
                        # characters: what expanding builds grows with the body (a 200 KB path expanded
                        # 100,000 times would build gigabytes)
DECLARATIONS = (A.Use, A.DeviceDecl, A.LinkDecl, A.MeshDecl, A.MeshAlias, A.TemplateDecl)


@value_type
class Resolution:
    plan: T.Plan | None
    diagnostics: tuple[Diagnostic, ...]
    sources: dict[str, SourceFile]
    modules: dict[str, A.Module]  # every parsed file, root included


def _is_file(path: FsPath) -> bool:
    """`path.is_file()`, False where the name cannot be looked up at all (too long, a NUL in it)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


class Resolver(PlanBuilder):
    """Resolves one plan file and the modules it uses. `use` is confined (PL222): to the standard library,
    the root plan's folder and below, and the `search_paths` the user configured (`use-paths`)."""

    def __init__(self, read: Callable[[str], str] | None = None, stdlib: FsPath = STDLIB_DIR,
                 search_paths: tuple[str, ...] = ()):
        super().__init__()
        self.read = read or (lambda p: FsPath(p).read_text(encoding="utf-8"))
        self.stdlib = stdlib
        self.search_paths = tuple(FsPath(p) for p in search_paths)
        self.root: FsPath | None = None  # the root plan's folder, set by the first resolve_text
        self.cache: dict[str, Namespace] = {}
        self.stack: list[str] = []
        self.expansions = 0  # template applications so far (PL224)
        self.expansion_budget: int | None = None  # set at the first application, when every file is read

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
                # safe: a `use` only brings in names, and none of its names is used; but not while a name's
                # module is unknown (`megatorn.x`): that may be this `use`, misspelt where it is used
                fix = None if self._unknown_modules else delete_statement(
                    self.sources.get(path), span, f"remove `use` of `{alias}`")
                self.diags.append(diag("PL218", f"`{alias}` is never used", span, help="remove this `use`", fix=fix))
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
                # a guess by the last part only (`use megatorn`: patterns.megatron) is less sure: unsafe
                fix=replace_fix(use.target.span, guess, f"replace `{target}` with `{guess}`",
                                safe=guess_is_unique(str(use.target), guess, modules)) if guess else None,
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
        result: ParseResult = parse_used(text, found)  # each used module's text parsed once per process
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

        def claim(name: A.Name | tuple[str, Span], what: str) -> bool:
            text, span = (name.text, name.span) if isinstance(name, A.Name) else name
            if text in seen:
                self.diags.append(diag(
                    "PL209", f"{what} `{text}` is declared twice", span,
                    labels=[Label(seen[text], "first declared here")], help="rename or remove one of them",
                ))
                return False
            seen[text] = span
            return True

        for st in module.statements:
            if isinstance(st, A.Use):
                alias = st.alias.text if st.alias else (
                    _stem(st.target.value) if isinstance(st.target, A.Str) else st.target.parts[-1].text)
                span = st.alias.span if st.alias else st.target.span
                if not claim((alias, span), "name"):
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
                    fix=did_you_mean_fix(p.kind.span, p.kind.text, guess, PARAM_KINDS),
                ))
            if p.name.text in seen:
                self.diags.append(diag("PL209", f"parameter `{p.name.text}` is declared twice", p.name.span,
                                       labels=[Label(seen[p.name.text], "first declared here")]))
            seen[p.name.text] = p.name.span


    # ------------------------------------------------------------------ the expansion budget
    def _within_budget(self, st: A.ApplyStmt, tdecl: A.TemplateDecl, ctx: _Ctx) -> bool:
        """Counts one application of `tdecl` (once per EXPANSION_CHARS of its text); False past the
        plan's budget, with PL224 at the outermost `apply` the first time."""
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
            return False
        return True


def _key(path: str) -> str:
    return os.path.realpath(path)


def _stem(path: str) -> str:
    stem = FsPath(path).stem
    return "".join(c if c.isalnum() or c == "_" else "_" for c in stem) or "module"


def resolve_file(path: str, **kw) -> Resolution:
    return Resolver(**kw).resolve_file(path)


def resolve_text(text: str, path: str = "<plan>", **kw) -> Resolution:
    return Resolver(**kw).resolve_text(text, path)
