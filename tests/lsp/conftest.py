"""Shared helpers for the language-server tests."""
from __future__ import annotations

from pathlib import Path

import pytest

from planlang.lsp.analysis import analyze

ROOT = Path(__file__).resolve().parents[2]
GPT2 = ROOT / "examples" / "gpt2" / "gpt2_3d.plan"
MLP = ROOT / "examples" / "mlp" / "mlp_2d.plan"


def at(text: str, marker: str, delta: int = 0, nth: int = 0) -> int:
    """The offset of the `nth` occurrence of `marker` in `text`, plus `delta`."""
    i = -1
    for _ in range(nth + 1):
        i = text.index(marker, i + 1)
    return i + delta


def line_of(path: Path, needle: str) -> int:
    """0-based line of the first line of a file that contains `needle`."""
    return next(i for i, line in enumerate(path.read_text().splitlines()) if needle in line)


@pytest.fixture(scope="session")
def gpt2():
    return analyze(GPT2.read_text(), str(GPT2))


@pytest.fixture
def plan_in(tmp_path):
    """Write files into a temporary folder and analyze the main one: plan_in(text, **other_files)."""

    def make(text: str, **files: str):
        for name, body in files.items():
            (tmp_path / name.replace("__", ".")).write_text(body)
        path = tmp_path / "main.plan"
        path.write_text(text)
        return analyze(text, str(path))

    return make
