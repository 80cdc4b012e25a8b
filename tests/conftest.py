"""Suite-wide fixtures."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _model_cache(tmp_path_factory, monkeypatch):
    """Model results kept on disk (planlang.model.capture.disk_cache) go to a fresh folder for every test:
    never into the user's ~/.cache, and no test reads what another computed (a command's counted builds and
    validations are its own). Subprocesses the test starts inherit it."""
    monkeypatch.setenv("PLANLANG_CACHE_DIR", str(tmp_path_factory.mktemp("planlang-cache")))
