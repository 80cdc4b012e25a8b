"""The package's layers, enforced over its import graph (function-local imports included):

    lang -> plan -> cost -> model -> solve | runtime -> report | lsp -> cli

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
ORDER = {"lang": 0, "plan": 1, "cost": 2, "model": 3, "solve": 4, "runtime": 4, "report": 5, "lsp": 5, "cli": 6}
TORCH_FREE = ("lang", "plan", "cost")
TORCH_ALLOWED = {"planlang.cost.probe"}  # the link probe: run by torchrun, never imported by the checker


def _modules() -> dict[str, Path]:
    mods = {}
    for f in PKG.rglob("*.py"):
        parts = f.relative_to(PKG.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return mods


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import statement anywhere in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            out.append((base, node.lineno))
            out += [(f"{base}.{a.name}", node.lineno) for a in node.names if f"{base}.{a.name}" in MODULES]
    return out


GRAPH = nx.DiGraph()
for _name, _path in MODULES.items():
    GRAPH.add_node(_name)
    for _target, _line in _imports(_name, _path):
        if _target in MODULES and _target != _name and not _name.startswith(_target + "."):
            GRAPH.add_edge(_name, _target, line=_line)


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ORDER else None


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
