"""The model layer follows the model's source within one process (planlang.model.capture.source): an edited
model file is built again and estimated afresh, even when the edit keeps the file's size and mtime
second; the estimator's caches are keyed by that source and stay bounded."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")

from planlang.model.price import caches as C  # noqa: E402
from planlang.model.capture import source as S  # noqa: E402
from planlang.model.price.estimate import estimate_plan  # noqa: E402
from planlang.model.capture.load import build_model  # noqa: E402
from planlang.plan.checker import check_text  # noqa: E402
from planlang.plan.complete import complete  # noqa: E402

MODEL = '''import torch
from {helper} import SCALE


class Mlp(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc1 = torch.nn.Linear(width, {hidden} * SCALE)
        self.fc2 = torch.nn.Linear({hidden} * SCALE, width)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def build(width=16):
    return Mlp(width)
'''
PLAN = '''use hardware
model m = "{module}:build"
input x : f32[batch = 4, features = 16]
mesh c of 1 x hardware.cpu {{ dp = 1 over hardware.loopback }}
budget 1 GiB per device
optimizer adamw(lr = 0.001)
'''


def _param_bytes(hidden, scale=1, width=16):
    h = hidden * scale
    return (width * h + h + h * width + width) * 4  # float32


class Project:
    """A model package-less project in a folder: `<module>.py` (the factory), `<helper>.py` (SCALE),
    and main.plan next to them."""

    def __init__(self, folder, name):
        self.folder, self.module, self.helper = folder, f"srcmodel_{name}", f"srchelper_{name}"
        self.plan_path = str(folder / "main.plan")
        (folder / "main.plan").write_text(PLAN.format(module=self.module))
        self.write_helper(1)

    @property
    def model_file(self):
        return self.folder / f"{self.module}.py"

    def write_model(self, hidden: int, keep_stamp: bool = False) -> None:
        """Three digits each time: the file keeps its size. `keep_stamp`: and its mtime, to the
        nanosecond (what a coarse file-system clock gives two quick writes)."""
        f = self.model_file
        old = os.stat(f) if f.exists() else None
        f.write_text(MODEL.format(helper=self.helper, hidden=f"{hidden:3d}"))
        if keep_stamp and old is not None:
            os.utime(f, ns=(old.st_atime_ns, old.st_mtime_ns))

    def write_helper(self, scale: int) -> None:
        (self.folder / f"{self.helper}.py").write_text(f"SCALE = {scale}\n")

    def plan(self):
        res = check_text((self.folder / "main.plan").read_text(), self.plan_path)
        assert res.plan is not None, res.diagnostics
        return res.plan

    def parameters(self) -> int:
        (row,) = estimate_plan(complete(self.plan()))
        return row.parameters


@pytest.fixture
def project(tmp_path):
    made = []

    def make(name="a"):
        tag = "".join(c for c in tmp_path.name if c.isalnum()) + name
        folder = tmp_path / name
        folder.mkdir()
        p = Project(folder, tag)
        made.append(p)
        return p

    yield make
    for p in made:
        for name in (p.module, p.helper):
            sys.modules.pop(name, None)
            S.SOURCES.seen.pop(name, None)


def test_an_edited_model_is_estimated_afresh_in_one_process(project, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # bytecode is written, as by default
    p = project()
    p.write_model(100)
    assert p.parameters() == _param_bytes(100)
    facts_entries = len(C.MODEL_FACTS)
    assert p.parameters() == _param_bytes(100) and len(C.MODEL_FACTS) == facts_entries  # unchanged: cached

    p.write_model(400)  # bigger, same size, right away
    assert p.parameters() == _param_bytes(400)

    # the same size and the same mtime to the nanosecond: the content still counts, and the stale
    # bytecode (whose check is by mtime second and size) is not used
    p.write_model(700, keep_stamp=True)
    assert p.parameters() == _param_bytes(700)

    p.write_helper(3)  # a module the factory imports from the plan's folder
    assert p.parameters() == _param_bytes(700, 3)
    assert sorted(os.path.basename(f) for f in S.model_source(p.plan().model, p.plan_path).paths) == sorted(
        [f"{p.module}.py", f"{p.helper}.py"])


def test_the_source_keys_what_was_computed_from_it(project):
    p = project()
    p.write_model(100)
    plan = p.plan()
    first = S.model_source(plan.model, p.plan_path)
    assert p.parameters() == _param_bytes(100)
    built = S.model_source(plan.model, p.plan_path)
    assert built.files and not built.changed() and built == S.imported_source(plan.model)
    assert all(k[0] == built.files for k in C.MODEL_FACTS if k[1] == str(plan.model))
    p.write_model(200)
    assert built.changed() and S.model_source(plan.model, p.plan_path) != built
    assert p.parameters() == _param_bytes(200)
    p.write_model(100)  # back to the first content: its key, and its numbers
    assert S.model_source(plan.model, p.plan_path) == built and p.parameters() == _param_bytes(100)
    assert first.paths == (str(p.model_file.resolve()),)  # before any build: the factory's file alone


def test_build_model_follows_the_source(project, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    p = project()
    p.write_model(100)
    plan = p.plan()
    assert build_model(plan.model, p.plan_path).fc1.weight.shape == (100, 16)
    assert list((p.folder / "__pycache__").glob(f"{p.module}.*.pyc"))
    p.write_model(300, keep_stamp=True)
    assert build_model(plan.model, p.plan_path).fc1.weight.shape == (300, 16)


def test_a_module_imported_outside_a_build_is_taken_as_it_is(project):
    p = project()
    p.write_model(100)
    sys.path.insert(0, str(p.folder))
    try:
        import importlib

        mod = importlib.import_module(p.module)
    finally:
        sys.path.remove(str(p.folder))
    model = build_model(p.plan().model, p.plan_path)
    assert sys.modules[p.module] is mod and type(model) is mod.Mlp  # not imported a second time


def test_caches_stay_bounded_over_many_models(project):
    projects = [project(f"m{i}") for i in range(C.MODEL_FACTS.size + 4)]
    for i, p in enumerate(projects):
        p.write_model(10 + i)
        assert p.parameters() == _param_bytes(10 + i)
        assert len(C.MODEL_FACTS) <= C.MODEL_FACTS.size and len(C.SIMULATIONS) <= C.SIMULATIONS.size
    assert len(S.SOURCES.seen) <= S.SOURCES_SIZE
    assert projects[-1].parameters() == _param_bytes(10 + len(projects) - 1)  # the newest is still there


def test_quick_digests_reread_files_written_just_before(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("A = 1\n")
    first = S.digest(str(f), quick=True)
    st = os.stat(f)
    f.write_text("A = 2\n")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, inode and mtime
    assert S.digest(str(f), quick=True) != first  # its mtime was too close to the read to be trusted

    # a file last written well before it was read: its stamp is trusted (one stat, no read)
    old = st.st_mtime_ns - 10 * S.RACY_NS
    os.utime(f, ns=(st.st_atime_ns, old))
    second = S.digest(str(f), quick=True)
    f.write_text("A = 3\n")
    os.utime(f, ns=(st.st_atime_ns, old))
    assert S.digest(str(f), quick=True) == second
    assert S.digest(str(f)) != second  # a full read sees it


def test_a_module_path_resolves_as_path_resolve_does(tmp_path):
    """source._resolved resolves each folder once: a file that is a link, a folder that is one, a link to a
    link and a missing file still resolve as Path.resolve resolves them."""
    real = tmp_path / "real"
    real.mkdir()
    (real / "model.py").write_text("")
    (tmp_path / "linked").symlink_to(real)
    (real / "alias.py").symlink_to(real / "model.py")
    (real / "alias2.py").symlink_to(real / "alias.py")
    for f in ("real/model.py", "linked/model.py", "linked/alias.py", "real/alias2.py", "linked/missing.py"):
        path = str(tmp_path / f)
        assert S._resolved(path) == str((tmp_path / f).resolve()), f
