"""planlang.model.capture.hf_import: transformers' package scan runs once, and answers as it did."""
from __future__ import annotations

import subprocess
import sys
import textwrap

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


def test_transformers_imports_with_one_scan_and_the_same_map():
    code = textwrap.dedent("""
        import os
        from planlang.model.capture.hf_import import dedupe_structure_scan
        assert dedupe_structure_scan()
        assert not dedupe_structure_scan()  # once per process
        import transformers
        from transformers import BertModel, LlamaForCausalLM  # the lazy map resolves both
        from transformers.utils import import_utils as iu
        once = iu.create_import_structure_from_path
        models = os.path.join(os.path.dirname(transformers.__file__), "models")
        assert os.path.abspath(models) in once.scans
        assert once.__wrapped__(models) == once(models)  # a fresh scan answers as the kept one
        print(LlamaForCausalLM.__name__, BertModel.__name__)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["LlamaForCausalLM", "BertModel"]
