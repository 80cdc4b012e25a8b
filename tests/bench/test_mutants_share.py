"""A fixed-seed share of bench/mutants.py (issue #17: soundness as a tested invariant): 60 mutants of the
example plans, drawn from the light seeds, each either rejected by `check --model` or preflighted,
lowered for every rank, its optimizer built and `planlang.apply` run on rank 0 with a step (fake process
group); one lowered mutant trained by `planlang verify` on 4 gloo processes. None may be accepted and
then fail.

The full run is `python bench/mutants.py` (640 mutants, 28 trained; results in bench/results/mutants.txt).
"""
from __future__ import annotations

import random
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import mutants  # noqa: E402

SHARE = 60
SEED = 20_261_125
# seeds whose mutants check in about a second (12-layer and Hugging Face models are the full run's)
LIGHT = ("mlp_2d", "mlp_dp", "mlp_dp2_tp2", "gpt2_dp2_tp2_zero1", "gpt2_pp2_dp2_zero1", "gpt2_pp2_dp2_zero2",
         "gpt2_pp4_1f1b", "gpt2_dp2_fs2_hsdp", "bert_tp2_dp2", "gpt2_cpu_partial", "resnet_zero3")


def _failures(ms) -> str:
    bad = [m for m in ms if m.outcome == "accepted-then-failed"]
    return "\n".join(f"{m.id} [{m.stage}] {m.what}:\n{m.error}\n--- the plan:\n{m.text}" for m in bad[:3])


def test_share_of_mutants_is_rejected_or_runs():
    every = mutants.generate(400, 0)
    share = random.Random(SEED).sample([m for m in every if m.seed in LIGHT], SHARE)
    with tempfile.TemporaryDirectory(prefix="planlang-mutants-") as folder:
        done = mutants.evaluate_all(share, folder, jobs=2)
        outcomes = Counter(m.outcome for m in done)
        assert outcomes["accepted-then-failed"] == 0, _failures(done)
        # the share is not trivially one-sided: some mutants are refused, some run
        assert outcomes["rejected"] >= 10 and outcomes["lowered"] >= 10, outcomes
        assert len({m.cls.split("+")[0] for m in done}) >= 8, "the share should span the mutation classes"
        # one of them trained (the cheapest: an MLP plan on 4 processes)
        light = sorted((m for m in done if m.outcome == "lowered" and m.world == 4 and m.cpu
                        and m.seed.startswith("mlp")), key=lambda m: m.id)
        assert light, "the share should hold a lowered 4-process MLP mutant"
        trained = mutants.train(light[0], folder)
        assert trained.outcome == "trained", _failures([trained])
