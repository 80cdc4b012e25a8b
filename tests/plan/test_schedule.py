"""planlang.plan.schedule.in_flight against a simulation of each stage's order of forwards and backwards."""
import pytest

from planlang.plan.schedule import in_flight


def simulate(schedule: str, stages: int, stage: int, m: int) -> int:
    """Most microbatches a stage holds: forwards run minus backwards run, at its peak, replaying the
    stage's own op order (GPipe: all forwards then all backwards; 1F1B: p - i warm-up forwards, then one
    backward and one forward in turn, then the remaining backwards)."""
    if schedule == "gpipe":
        order = ["F"] * m + ["B"] * m
    else:
        warm = min(stages - stage, m)
        order = ["F"] * warm
        for _ in range(m - warm):
            order += ["B", "F"]
        order += ["B"] * warm
    held = peak = 0
    for op in order:
        held += 1 if op == "F" else -1
        peak = max(peak, held)
    assert held == 0 and order.count("F") == m
    return peak


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_in_flight_equals_the_simulated_peak(schedule):
    for stages in range(1, 7):
        for m in range(1, 13):
            for stage in range(stages):
                assert in_flight(schedule, stages, stage, m) == simulate(schedule, stages, stage, m)


def test_interleaved_warms_up_further_and_bad_input_is_refused():
    # 4 ranks' stages with 2 chunks each: stage 0 holds p + (p - 1) // v = 4 + 1 microbatches
    assert in_flight("interleaved", 4, 0, 8, chunks=2) == 5 and in_flight("interleaved", 4, 3, 8, chunks=2) == 4
    assert in_flight("1f1b", 4, 0, 8, extra=1) == 5
    with pytest.raises(ValueError, match="choose one of"):
        in_flight("zb", 2, 0, 4)
    with pytest.raises(ValueError, match="out of range"):
        in_flight("1f1b", 2, 2, 4)
