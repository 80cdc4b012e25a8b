"""The collectives the step-time model prices for ZeRO plans are the ones a real step issues.

One gloo launch with 4 ranks runs two whole training steps (forward, backward, gradient sums, the
optimizer's step) of each plan under planlang.apply and records the second with CollectiveSpy. The
prediction is `planlang.model.price.step_time.lowered_traffic`, what `planlang estimate` and `planlang solve`
price: the lowered program's collectives, the gradient sums FSDP2 does not take over, and ZeRO's own
(planlang.model.price.traffic.zero_transfers): ZeRO-1's broadcast of every parameter after the step, FSDP2's
all-gathers per unit (one per block, then the root), ZeRO-3's second gathers of the blocks in backward, and the
reduce-scatters in the `reduce` dtype with dim 0 padded to the ZeRO axis. Compared on every rank, call
by call: the multiset of (kind, mesh axes, S).
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.runtime import traffic_worker

PLANS = Path(__file__).parent / "plans"
CONFIGS = ["gpt2_dp2_tp2_zero1", "gpt2_dp2_tp2_zero2", "gpt2_dp2_tp2_zero3", "gpt2_dp4_zero3_bf16",
           "gpt2_dp4_zero3_vocab130"]
DERIVED = {
    "gpt2_dp2_tp2_zero3": ("gpt2_dp2_tp2_zero2", "zero = 2 over dp", "zero = 3 over dp"),
    # 130 rows of the embedding and the head over 4 ranks: FSDP2 pads them to 132
    "gpt2_dp4_zero3_vocab130": ("gpt2_dp4_zero3", "vocab = 128", "vocab = 130"),
}


def _plan_path(config: str, out: Path) -> str:
    if config not in DERIVED:
        return str(PLANS / f"{config}.plan")
    base, old, new = DERIVED[config]
    text = (PLANS / f"{base}.plan").read_text()
    assert old in text, f"{base}.plan no longer contains {old!r}"
    path = out / f"{config}.plan"
    path.write_text(text.replace(old, new))
    return str(path)


def _calls(rows) -> Counter:
    return Counter((kind, tuple(axes), s) for kind, axes, s, *_ in rows)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from planlang.model.price.step_time import lowered_traffic

    out = tmp_path_factory.mktemp("zero_traffic")
    jobs, predicted = [], {}
    for c in CONFIGS:
        path = _plan_path(c, out)
        plan, _, inputs, targets = traffic_worker.lowered_with_batch(path)
        [traffic] = lowered_traffic(plan)
        predicted[c] = traffic_worker.rows(traffic)
        jobs.append((path, inputs, targets, "step"))
    data = traffic_worker.launch(jobs, str(out))
    return {Path(k).stem: {"predicted": predicted[Path(k).stem], "measured": v} for k, v in data.items()}


@pytest.mark.parametrize("config", CONFIGS)
def test_a_zero_step_issues_the_collectives_the_step_time_model_prices(results, config):
    r = results[config]
    pred = _calls(r["predicted"])
    zero = {k for k in pred if k[0] in ("all_gather", "reduce_scatter", "broadcast")}
    assert zero, "no ZeRO collective predicted: the test would prove nothing"
    for rank, m in enumerate(r["measured"]):
        assert "error" not in m, m.get("error")
        assert not m["unknown"], f"rank {rank}: collectives on groups that are no mesh axis: {m['unknown']}"
        meas = _calls(m["rows"])
        assert meas == pred, (f"rank {rank}: measured but not predicted {meas - pred}; "
                              f"predicted but not measured {pred - meas}")


def test_zero3_gathers_every_block_twice_the_root_once_and_reduce_scatters_each_once(results):
    rows = results["gpt2_dp2_tp2_zero3"]["predicted"]
    gathers = Counter(what for kind, _, _, _, _, what in rows if kind == "all_gather")
    scatters = Counter(what for kind, _, _, _, _, what in rows if kind == "reduce_scatter")
    assert gathers == {"h.0": 2, "h.1": 2, "root": 1}  # the root stays gathered from forward to backward
    assert set(scatters) == set(gathers) and set(scatters.values()) == {1}
