"""What `planlang solve` prints: without -o stdout is the plan and nothing else (it parses and checks);
progress on stderr in plain, unwrapped lines when stderr is no terminal; solver banners and library
logging captured; the summary printed is the header written into the plan."""
from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from planlang.plan.checker import check_text
from planlang.solve.progress import SolveProgress, captured_output
from tests.solve.test_driver import MLP

REPO = Path(__file__).resolve().parents[2]
PARTIAL = MLP.replace("BUDGET", "1 GiB").replace("checkpoint ?\n", "")  # no checkpoint hole: a quicker solve


def planlang(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planlang.cli", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=600, env={**os.environ, "COLUMNS": "80", **(env or {})})


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    path = tmp_path_factory.mktemp("solve") / "mlp_partial.plan"
    path.write_text(PARTIAL)
    return path, planlang("solve", str(path))


def test_stdout_is_exactly_a_plan_that_checks(solved):
    path, out = solved
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("# a partial MLP plan\n# solved by `planlang solve")
    res = check_text(out.stdout, str(path))
    assert not res.errors and res.plan is not None and not res.plan.holes()
    assert "HiGHS" not in out.stdout and "planlang solve:" not in out.stdout


def test_progress_lines_are_plain_and_not_wrapped(solved):
    _, out = solved
    lines = out.stderr.splitlines()
    assert lines[0].startswith("planlang solve: checking ") and lines[0].endswith(" s]")
    progress = [line for line in lines if line.startswith("planlang solve: ")]
    candidates = [line for line in progress if ": candidate " in line]
    assert candidates and any(len(line) > 80 for line in candidates)  # COLUMNS=80 did not wrap them
    # a wrapped line would leave a piece without the prefix; only the summary's lines are unprefixed
    rest = [line for line in lines if not line.startswith("planlang solve: ")]
    assert rest and rest[0].startswith("solved by `planlang solve")
    assert all("peak" in line and "step" in line and line.endswith(" s]") for line in candidates)
    assert "\x1b[" not in out.stderr  # no terminal: no bar, no colour


def test_summary_printed_is_the_header_written(solved):
    _, out = solved
    summary = [line for line in out.stderr.splitlines() if not line.startswith("planlang solve: ")]
    header = [line[2:] for line in out.stdout.splitlines() if line.startswith("# ")][1:len(summary) + 1]
    assert summary == header


def test_output_file_leaves_stdout_empty(tmp_path):
    path = tmp_path / "mlp_partial.plan"
    path.write_text(PARTIAL)
    out = planlang("solve", str(path), "-o", str(tmp_path / "solved.plan"))
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""
    assert f"wrote {tmp_path / 'solved.plan'}" in out.stderr
    assert not check_text((tmp_path / "solved.plan").read_text(), str(path)).errors


# ------------------------------------------------------------------------------ the pieces
def test_captured_output_keeps_library_output_from_the_user(capfd):
    fake = logging.getLogger("torch._subclasses.fake_tensor")
    handler = logging.StreamHandler(sys.stderr)  # as torch's logging sets it up: the stream at import time
    fake.addHandler(handler)
    try:
        with captured_output() as (user, cap):
            fake.warning("fake tensor cache miss")
            warnings.warn("a library warning")
            os.write(1, b"Running HiGHS 1.x: Copyright (c) ...\n")  # C code on fd 1
            print("printed by a library")
            user.write("progress for the user\n")
    finally:
        fake.removeHandler(handler)
    seen = capfd.readouterr()
    assert seen.out == "" and seen.err == "progress for the user\n"
    for text in ("fake tensor cache miss", "a library warning", "Running HiGHS", "printed by a library"):
        assert text in cap.text


def test_plain_progress_writes_long_lines_whole():
    stream = io.StringIO()
    say = SolveProgress(stream, tty=False)
    say.message("x" * 300)
    (line,) = stream.getvalue().splitlines()
    assert line.startswith("planlang solve: " + "x" * 300) and line.endswith(" s]")


def test_driver_result_summary_matches_its_header(tmp_path):
    from planlang.solve.driver import solve

    path = tmp_path / "mlp_partial.plan"
    path.write_text(PARTIAL)
    res = solve(str(path))
    assert res.summary and all(f"# {line}" in res.text.splitlines() for line in res.summary)
    # the step in the header is the one the search ranked by
    assert f"step {res.best.step_time * 1e3:.2f} ms" in res.summary[-1]


def test_terminal_progress_is_one_bar_that_goes_away():
    class Candidate:
        peak, step_time, fits = 2**20, 0.002, True

        def __str__(self) -> str:
            return "a candidate"

    stream = io.StringIO()
    say = SolveProgress(stream, tty=True)
    say.t0 -= 5.0  # the command started 5 s ago
    say.message("stage 1: 2 mesh candidates")
    say.plan_work(3)
    say.priced(Candidate(), Candidate())
    say.advance("stage 1: mesh 2 of 2")
    (task,) = say._bar.tasks
    assert task.completed == 1 and task.total == 3 and task.fields["best"] == "1 MiB, 2.00 ms"
    assert task.elapsed >= 5.0
    say.close()
    assert "a candidate" not in stream.getvalue()  # candidates update the bar; no line each
