"""examples/train_hf.py launched by `planlang run` under its four plans (examples/train_hf/: dp 4, dp 2 x tp 2
and ZeRO-3 over dp 4, each with 2 accumulation microbatches; pp 2 x dp 2 under 1F1B), on 4 gloo processes
each, against the same script's one-process loop (`reference`, run here in f32 and f64).

The dp run trains STEPS steps from scratch (evaluating and saving every 2); each other plan resumes from
one of dp's checkpoints (RESUMES) and trains to the end, so every plan's steps, evaluations and saves run,
and every resumed step is also a step of an uninterrupted run. The three resumed runs are launched
together (they only read dp's checkpoints). Every loss, evaluation loss and gradient norm is judged
against `planlang verify`'s bound, max(1e-5, 10 x one process's own error against float64), as
tests/runtime/test_clip_save_gloo.py does.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train_hf.py"
PLANS = ROOT / "examples" / "train_hf"
DOC = ROOT / "docs" / "byom.md"
STEPS = 8
RESUMES = {"pp_dp": 2, "zero3": 4, "dp_tp": 6}  # plan -> the step of dp's checkpoint it resumes from
TOL = 1e-5
TIMEOUT_S = 900


def _script():
    spec = importlib.util.spec_from_file_location("train_hf_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse(text: str) -> dict[str, dict[int, dict[str, str]]]:
    """The script's lines, `EVENT key=value ...`, by event and step."""
    out: dict[str, dict[int, dict[str, str]]] = {}
    for line in text.splitlines():
        m = re.match(r"^(train|eval|saved|resumed) (step=\d+( \w+=\S+)*)$", line)
        if m:
            words = dict(w.split("=", 1) for w in m.group(2).split())
            out.setdefault(m.group(1), {})[int(words["step"])] = words
    return out


def _command(plan: str, ckpt: Path, resume: Path | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "planlang.cli", "run", str(PLANS / f"{plan}.plan"), "--", str(SCRIPT),
           "--steps", str(STEPS), "--checkpoint-dir", str(ckpt / plan)]
    return cmd + (["--resume", str(resume)] if resume is not None else [])


def _finished(name: str, proc: subprocess.CompletedProcess | subprocess.Popen, out: str, err: str,
              folder: Path) -> str:
    (folder / f"{name}.out").write_text(out)  # what rank 0 printed, beside the checkpoints
    assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{out}\n{err[-4000:]}"
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Any]:
    ckpt = tmp_path_factory.mktemp("train_hf")
    env = {**os.environ, "PLANLANG_QUIET": "1"}
    first = subprocess.run(_command("dp", ckpt), cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=TIMEOUT_S)
    out: dict[str, Any] = {"dp": parse(_finished("dp", first, first.stdout, first.stderr, ckpt))}
    procs = {name: subprocess.Popen(_command(name, ckpt, ckpt / "dp" / f"step-{at}"), cwd=ROOT, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, at in RESUMES.items()}
    try:
        for name, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
            out[name] = parse(_finished(name, proc, stdout, stderr, ckpt))
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    out["ckpt"] = ckpt
    return out


@pytest.fixture(scope="module")
def reference() -> dict[str, dict]:
    script = _script()
    args = script.arguments(["--steps", str(STEPS)])
    return {"f32": parse("\n".join(script.reference(args))),
            "f64": parse("\n".join(script.reference(args, torch.float64))),
            "untrained": untrained_losses(script, args)}


def untrained_losses(script, args) -> dict[int, float]:
    """The loss of the initial model on each step's batch: what a resumed run would print had it loaded nothing."""
    torch.manual_seed(args.seed)
    model = script.build()
    with torch.no_grad():
        return {s + 1: float(script.loss(model(b["input_ids"]), b["labels"]))
                for s in range(STEPS) for b in [script.batch(s, args.batch, args.seq)]}


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def bound(ref: dict, event: str, step: int, key: str) -> float:
    """verify's bound: max(TOL, 10 x one process's own relative error against float64)."""
    return max(TOL, 10 * rel(float(ref["f32"][event][step][key]), float(ref["f64"][event][step][key])))


@pytest.mark.parametrize("plan", ["dp", *RESUMES])
def test_losses_equal_one_process(runs, reference, plan):
    got = runs[plan]
    first = RESUMES.get(plan, 0) + 1
    assert sorted(got["train"]) == list(range(first, STEPS + 1))
    assert sorted(got["eval"]) == [s for s in range(first, STEPS + 1) if s % 2 == 0]
    for event, keys in (("train", ("loss", "grad_norm")), ("eval", ("loss",))):
        for step, row in got[event].items():
            want = reference["f32"][event][step]
            for key in keys:
                err, lim = rel(float(row[key]), float(want[key])), bound(reference, event, step, key)
                assert err <= lim, f"{plan} {event} step {step}: {key} {row[key]} vs {want[key]}: {err:.2e} > {lim:.2e}"
            if event == "train":
                assert row["lr"] == want["lr"]  # warmup + cosine, restored exactly on resume
    assert all(float(r["grad_norm"]) > 1.0 for r in got["train"].values())  # every step clipped (max 1.0)


@pytest.mark.parametrize("plan", list(RESUMES))
def test_resumed_run_continues_the_uninterrupted_one(runs, reference, plan):
    at = RESUMES[plan]
    got, dp = runs[plan], runs["dp"]
    assert got["resumed"][at]["path"].endswith(f"dp{os.sep}step-{at}")
    for step, row in got["train"].items():
        lim = 2 * bound(reference, "train", step, "loss")  # both runs within one bound of one process
        assert rel(float(row["loss"]), float(dp["train"][step]["loss"])) <= lim
    # what it matched came from the checkpoint: the initial weights give another loss by far
    assert rel(reference["untrained"][at + 1], float(dp["train"][at + 1]["loss"])) > 100 * TOL


@pytest.mark.parametrize("plan", ["dp", *RESUMES])
def test_checkpoints_written(runs, plan):
    saved = sorted(runs[plan]["saved"])
    assert saved == [s for s in range(RESUMES.get(plan, 0) + 1, STEPS + 1) if s % 2 == 0]
    for step in saved:
        assert (runs["ckpt"] / plan / f"step-{step}" / ".metadata").exists()


def test_the_guide_quotes_the_script():
    """docs/byom.md's walk through train_hf.py: every Python block of that section is in the script as written."""
    section = DOC.read_text().split("## 6. A complete training script", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks
    text = SCRIPT.read_text()
    for block in blocks:
        assert block in text, block
