"""planlang.model.capture.hf_import: transformers' package scan runs once, and answers as it did."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from planlang.model.capture.hf_import import scanning_once


def test_a_folder_is_scanned_once_and_asked_by_a_file_in_it(tmp_path):
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "sub").mkdir()
    calls = []

    def scan(path):
        calls.append(str(path))
        return {"found": {str(path)}}

    once = scanning_once(scan)
    first = once(tmp_path)
    again = once(str(tmp_path / "__init__.py"))  # transformers.models' __init__ asks by its own file
    assert calls == [str(tmp_path)]
    assert again == first and again is not first
    again["found"].add("changed")  # a caller's changes stay its own
    assert once(tmp_path) == {"found": {str(tmp_path)}}
    once(tmp_path / "sub")  # another folder is scanned
    assert calls == [str(tmp_path), str(tmp_path / "sub")]


def _import_map(hook: bool) -> str:
    """transformers' lazy map of its models (and two names resolved through it), imported in a fresh
    process with or without the hook, as text."""
    pytest.importorskip("transformers")
    code = textwrap.dedent(f"""
        import os
        from planlang.model.capture.hf_import import dedupe_structure_scan
        if {hook}:
            assert dedupe_structure_scan()
            assert not dedupe_structure_scan()  # once per process
        import transformers
        from transformers import BertModel, LlamaForCausalLM  # the lazy map resolves both
        from transformers.utils import import_utils as iu
        models = os.path.join(os.path.dirname(transformers.__file__), "models")
        assert hasattr(iu.create_import_structure_from_path, "scans") == {hook}
        if {hook}:
            assert os.path.abspath(models) in iu.create_import_structure_from_path.scans
        got = iu.define_import_structure(models)  # the map transformers.models was made with (lru_cache)
        print(LlamaForCausalLM.__name__, BertModel.__name__, len(got))
        print(sorted((sorted(k), sorted((m, sorted(v)) for m, v in d.items())) for k, d in got.items()))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_transformers_imports_with_one_scan_and_the_same_map():
    hooked, plain = _import_map(True), _import_map(False)
    assert hooked.split()[:2] == ["LlamaForCausalLM", "BertModel"]
    assert hooked == plain


def test_the_finder_asks_the_finders_after_it(tmp_path):
    """A transformers another finder serves (an import hook, an editable install) is the one imported and
    memoised: the hook neither goes around that finder nor takes itself out of sys.meta_path mid-walk."""
    pkg = tmp_path / "transformers"
    (pkg / "utils").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .utils.import_utils import create_import_structure_from_path as scan\n")
    (pkg / "utils" / "__init__.py").write_text("")
    (pkg / "utils" / "import_utils.py").write_text("def create_import_structure_from_path(p):\n    return {'at': str(p)}\n")
    code = textwrap.dedent(f"""
        import importlib.abc, importlib.util, os, sys
        root = {str(tmp_path)!r}

        class Served(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] != "transformers":
                    return None
                base = os.path.join(root, *name.split("."))
                if os.path.isdir(base):
                    return importlib.util.spec_from_file_location(name, os.path.join(base, "__init__.py"),
                                                                  submodule_search_locations=[base])
                return importlib.util.spec_from_file_location(name, base + ".py")

        from planlang.model.capture.hf_import import dedupe_structure_scan
        assert dedupe_structure_scan()
        sys.meta_path.insert(1, Served())  # after the hook, before the path finder
        import transformers
        assert transformers.__file__.startswith(root)
        assert transformers.scan(root) == {{"at": root}} and root in transformers.scan.scans
        assert not any(type(f).__name__ == "_ScanOnce" for f in sys.meta_path)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"
