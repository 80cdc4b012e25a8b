"""The package's layers, enforced over its import graph (function-local imports included):

    lang -> plan -> cost -> model -> solve | runtime -> report | lsp -> cli -> the package root

and inside model, by what each part does:

    model.capture -> model.program -> model.price -> model (validation: checks, inspect)

A module imports only from its own layer or the layers before it; solve and runtime do not import each
other, nor do report and lsp; no two modules import each other, directly or round a longer cycle; and
the torch-free layers (lang, plan, cost outside its `probe`, which runs under torchrun) never import
torch, so `check`, `lint`, `fmt`, `explain` and the language server start without it."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

PKG = Path(__file__).resolve().parents[1] / "planlang"
ORDER = {"lang": 0, "plan": 1, "cost": 2, "model": 3, "solve": 4, "runtime": 4, "report": 5, "lsp": 5, "cli": 6,
         "root": 7}  # the root (`planlang.apply`, loaded on first use) sits above everything
MODEL_ORDER = {"capture": 0, "program": 1, "price": 2}  # model's own modules (validation) above all three
TORCH_FREE = ("lang", "plan", "cost")
TORCH_ALLOWED = {"planlang.cost.probe"}  # the link probe: run by torchrun, never imported by the checker


def _modules() -> dict[str, Path]:
    mods = {}
    for f in PKG.rglob("*.py"):
        parts = f.relative_to(PKG.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return mods


MODULES = _modules()


def _imports_of(name: str, path: Path, node) -> list[tuple[str, int]]:
    """(imported module, line) for one import statement of module `name`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    if isinstance(node, ast.Import):
        return [(a.name, node.lineno) for a in node.names]
    base = node.module or ""
    if node.level:
        up = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(up + ([node.module] if node.module else []))
    return [(base, node.lineno)] + [(f"{base}.{a.name}", node.lineno) for a in node.names
                                    if f"{base}.{a.name}" in MODULES]


def _imports(name: str, path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import statement anywhere in the file."""
    return [hit for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, (ast.Import, ast.ImportFrom))
            for hit in _imports_of(name, path, node)]


GRAPH = nx.DiGraph()
for _name, _path in MODULES.items():
    GRAPH.add_node(_name)
    for _target, _line in _imports(_name, _path):
        if _target in MODULES and _target != _name and not _name.startswith(_target + "."):
            GRAPH.add_edge(_name, _target, line=_line)


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if parts == ["planlang"]:
        return "root"
    return parts[1] if len(parts) > 1 and parts[1] in ORDER else None


def _model_floor(module: str) -> int | None:
    """A model module's floor: capture 0, program 1, price 2, validation (model's own modules) 3."""
    parts = module.split(".")
    if parts[:2] != ["planlang", "model"] or len(parts) < 3:
        return None
    return MODEL_ORDER.get(parts[2], 3)


def test_the_graph_is_the_packages():
    assert GRAPH.number_of_nodes() > 80 and GRAPH.number_of_edges() > 150


def test_no_import_cycles():
    cycles = sorted(sorted(c) for c in nx.simple_cycles(GRAPH))
    assert cycles == [], "import cycles (a module must not import one that imports it back): " + "; ".join(
        " <-> ".join(c) for c in cycles)


def test_layers_import_only_downwards():
    wrong = []
    for a, b, data in GRAPH.edges(data=True):
        la, lb = _layer(a), _layer(b)
        if la is None or lb is None or la == lb:
            continue
        if ORDER[lb] > ORDER[la] or ORDER[lb] == ORDER[la]:  # a later layer, or a sibling (solve/runtime)
            wrong.append(f"{a} (line {data['line']}) imports {b}: {la} may not import {lb}")
    assert wrong == []


def test_the_root_has_a_layer_and_nothing_imports_it():
    assert _layer("planlang") == "root"
    assert [a for a, b in GRAPH.edges() if b == "planlang"] == []


def test_model_floors_import_only_downwards():
    wrong = [f"{a} (line {data['line']}) imports {b}" for a, b, data in GRAPH.edges(data=True)
             if _model_floor(a) is not None and _model_floor(b) is not None and _model_floor(b) > _model_floor(a)]
    assert wrong == []


@pytest.mark.parametrize("layer", TORCH_FREE)
def test_torch_free_layers_never_import_torch(layer):
    found = [f"{name}:{line} imports {target}" for name, path in MODULES.items()
             if _layer(name) == layer and name not in TORCH_ALLOWED
             for target, line in _imports(name, path) if target.split(".")[0] == "torch"]
    assert found == []


def test_language_tools_load_without_torch():
    code = ("import sys, planlang, planlang.cli, planlang.lang.config, planlang.plan.checker, planlang.lsp.server, "
            "planlang.cost.comm\nprint(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'numpy', 'transformers')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------ function-local imports
# An import inside a function is there for one reason: importing its module at the top would load a
# third-party package (torch, matplotlib, the solver backend, the language server's packages) that this
# module otherwise does not load, on a path that must start without it. `planlang.cli` also loads each
# command's own modules when that command runs, so `check` and `fmt` start fast; an import that must sit
# under a warning filter (`with warnings.catch_warnings()`) stays where the filter is. Every such import
# says why in a `# lazy:` comment on its line or the line above its group.
STDLIB = set(sys.stdlib_module_names)
COMMAND_LAYERS = {"cost", "model", "solve", "runtime", "report", "lsp"}


def _split_imports(name: str, path: Path):
    """(top-level targets, [(import node, targets, under a `with`)] for imports inside functions)."""
    tree = ast.parse(path.read_text())
    parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    top, local = [], []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        targets = [t for t, _ in _imports_of(name, path, node)]
        p, in_function, in_with, type_only = parents.get(node), False, False, False
        while p is not None:
            in_function |= isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef))
            in_with |= isinstance(p, ast.With) and not in_function
            type_only |= isinstance(p, ast.If) and "TYPE_CHECKING" in ast.unparse(p.test)
            p = parents.get(p)
        if in_function:
            local.append((node, targets, in_with))
        elif not type_only:
            top.append(targets)
    parts = name.split(".")
    top.append([".".join(parts[:i]) for i in range(1, len(parts))])  # a module's packages load first
    return [t for ts in top for t in ts], local


SPLIT = {n: _split_imports(n, p) for n, p in MODULES.items()}


def _third_party(targets, seen=None) -> set[str]:
    """The third-party packages importing `targets` loads (through planlang modules' top-level imports)."""
    seen = set() if seen is None else seen
    out = set()
    for t in targets:
        root = t.split(".")[0]
        if root not in ("planlang", "__future__") and root not in STDLIB:
            out.add(root)
        elif t in MODULES and t not in seen:
            seen.add(t)
            out |= _third_party(SPLIT[t][0], seen)
    return out


def _planlang_closure(targets, seen=None) -> set[str]:
    """The planlang modules importing `targets` loads (through their top-level imports)."""
    seen = set() if seen is None else seen
    for t in targets:
        if t in MODULES and t not in seen:
            seen.add(t)
            _planlang_closure(SPLIT[t][0], seen)
    return seen


# The language's checker: the parser, resolver, rules and their dataclasses, most of the ~0.15 CPU-s of
# imports under `planlang check` (bench/check_time.py); Lark no longer loads with it (the parser cache)
CHECKER = {"planlang.plan.checker", "planlang.plan.resolve"}


# standard-library modules kept off `planlang check`'s imports (each 2-6 ms of a ~0.15 CPU-s check, needed
# only where a config file is read, git runs, the parser cache is written or a fallback is logged)
SLOW_STDLIB = {"logging", "subprocess", "tempfile", "tomllib", "traceback"}


def _lazy_reason(name: str, node, targets, in_with) -> str | None:
    """Why this function-local import is not at the top; None when nothing keeps it there."""
    if (_layer(name) == "lang" or name == "planlang.cli") and set(targets) <= SLOW_STDLIB:
        return "a slow standard-library module kept off the check's imports"
    if _third_party(targets) - _third_party(SPLIT[name][0] + [name]):
        return "loads a package the module does not"
    if CHECKER & (_planlang_closure(targets) - _planlang_closure(SPLIT[name][0] + [name])):
        return "loads the checker, which the module does not"
    if _layer(name) == "cli" and any(_layer(t) in COMMAND_LAYERS for t in targets):
        return "a command's own module"
    if in_with:
        return "under a warning filter"
    return None


def test_function_local_imports_keep_a_package_out():
    wrong = []
    for name, (_, local) in sorted(SPLIT.items()):
        for node, targets, in_with in local:
            if _lazy_reason(name, node, targets, in_with) is None:
                wrong.append(f"{MODULES[name].relative_to(PKG.parent)}:{node.lineno} {ast.unparse(node)}")
    assert wrong == [], ("function-local imports that load nothing the module does not already load; "
                         "move them to the top of the module:\n" + "\n".join(wrong))


def test_function_local_imports_say_why():
    silent = []
    for name, (_, local) in sorted(SPLIT.items()):
        lines = MODULES[name].read_text().splitlines()
        for node, _, _ in local:
            i = node.lineno - 1
            while i > 0 and lines[i - 1].lstrip().startswith(("from ", "import ")) and "# lazy:" not in lines[i]:
                i -= 1  # the comment may head a group of imports
            if "# lazy:" not in lines[i] and "# lazy:" not in lines[i - 1]:
                silent.append(f"{MODULES[name].relative_to(PKG.parent)}:{node.lineno} {ast.unparse(node)}")
    assert silent == [], "function-local imports without a `# lazy:` comment:\n" + "\n".join(silent)


def test_a_needless_local_import_is_found():
    """The check above is not vacuous: a stdlib import inside a function has no reason to be there."""
    src = "import os\n\ndef f():\n    import json\n    return json\n"
    tree = ast.parse(src)
    node = tree.body[1].body[0]
    assert _lazy_reason("planlang.lang.codes", node, ["json"], False) is None
    assert _lazy_reason("planlang.lang.codes", node, ["torch"], False) is not None
