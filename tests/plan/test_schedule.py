"""planlang.plan.schedule.in_flight against a simulation of each stage's order of forwards and backwards."""
import pytest

from planlang.plan.schedule import ScheduleError, activation_peaks, in_flight, rank_orders


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


def test_interleaved_counts_each_model_stage_in_its_ranks_order_and_bad_input_is_refused():
    # 2 ranks x 2 chunks (model stages 0..3, stage s on rank s % 2), 4 microbatches: rank 0 warms up
    # with (2 - 0 - 1)·2 + (2 - 1)·2 = 4 forwards (F0@0 F1@0 F0@2 F1@2), then F2@0 B0@2 F3@0 before
    # stage 0's first backward B0@0: stage 0 holds all 4 microbatches, stage 2 at most 2
    assert in_flight("interleaved", 4, 0, 4, chunks=2) == 4
    assert in_flight("interleaved", 4, 2, 4, chunks=2) == 2
    assert in_flight("1f1b", 4, 0, 8, extra=1) == 5
    with pytest.raises(ValueError, match="choose one of"):
        in_flight("zb", 2, 0, 4)
    with pytest.raises(ValueError, match="out of range"):
        in_flight("1f1b", 2, 2, 4)


def test_a_ranks_activation_peak_is_over_all_of_its_chunks():
    # equal chunks: rank r of p holds (p - r - 1)·2 + (v - 1)·p + 1 chunk-microbatches at its peak
    # (Narayanan et al. 2021 §2.2.2), capped at v·m
    for p, v, m in [(2, 2, 4), (4, 2, 8), (4, 3, 8), (2, 4, 2)]:
        peaks = activation_peaks("interleaved", p, m, [1] * (p * v), chunks=v)
        assert peaks == [min((p - r - 1) * 2 + (v - 1) * p + 1, v * m) for r in range(p)]
    # unequal chunks are weighed: rank 0's peak is at F3@0 (4 microbatches of stage 0 beside 1 of stage 2),
    # not at the end of its warm-up (3 of stage 0 and 2 of stage 2)
    assert activation_peaks("interleaved", 2, 4, [10, 0, 1, 0], chunks=2)[0] == 4 * 10 + 1 * 1
    # 1f1b and gpipe: stage i's peak is in_flight · its bytes
    for kind in ("1f1b", "gpipe"):
        assert activation_peaks(kind, 4, 6, [5, 5, 5, 5]) == [5 * in_flight(kind, 4, i, 6) for i in range(4)]
    with pytest.raises(ScheduleError, match="stage sizes"):
        activation_peaks("interleaved", 2, 4, [1, 1], chunks=2)


def test_interleaved_in_flight_is_each_stages_own_peak_in_its_ranks_replayed_order():
    # every stage at once (a deep pipeline's pricing replays the orders once) equals activation_peaks with
    # that stage's bytes 1 and the others' 0, one stage at a time
    for p in (1, 2, 3, 4):
        for v in (1, 2, 3):
            for m in range(p, 4 * p + 1, p):
                for s in range(p * v):
                    one = [1 if x == s else 0 for x in range(p * v)]
                    want = min(activation_peaks("interleaved", p, m, one, chunks=v)[s % p], m)
                    assert in_flight("interleaved", p * v, s, m, chunks=v) == want, (p, v, m, s)


def test_looped_bfs_holds_every_microbatch_on_every_stage_and_a_rank_all_of_its_chunks():
    # breadth-first: a chunk runs all m forwards before the next chunk starts, backwards only after them
    p, m, v = 3, 5, 2
    for stage in range(p * v):
        assert in_flight("looped_bfs", p * v, stage, m, chunks=v) == m
    saved = [10, 20, 30, 40, 50, 60]
    assert activation_peaks("looped_bfs", p, m, saved, v) == [m * (saved[r] + saved[r + p]) for r in range(p)]


def test_backward_peaks_replay_looped_bfs_and_take_every_other_gradient_elsewhere():
    from planlang.plan.schedule import backward_peaks

    saved, extra, grads = [10, 20, 30, 40], [1, 2, 3, 4], [100, 200, 300, 400]
    # looped BFS, p = 2, v = 2, m = 3: rank 0 runs F(0)x3 F(2)x3 then B(2)x3 B(0)x3. Its first backward
    # holds every activation and no gradient; stage 0's first backward holds stage 0's activations and
    # stage 2's gradients
    r0 = max(3 * 10 + 3 * 30 + 3, 3 * 10 + 1 + 300)
    r1 = max(3 * 20 + 3 * 40 + 4, 3 * 20 + 2 + 400)
    assert backward_peaks("looped_bfs", 2, 3, saved, extra, grads, 2) == [r0, r1]
    # interleaved (m a multiple of p): the activation peak beside every other chunk's gradients
    acts = activation_peaks("interleaved", 2, 4, saved, 2)
    assert backward_peaks("interleaved", 2, 4, saved, extra, grads, 2) == [
        acts[0] + max(1 + 300, 3 + 100), acts[1] + max(2 + 400, 4 + 200)]


def test_stage_degrees_count_a_chunked_schedules_stages_once_per_rank():
    """PL410 sums the stages' devices: under a chunked schedule each pipeline rank's `chunks` stages share
    its devices. The mesh's own sizes pass; another degree runs under one stage per rank (1f1b) and is
    PL418 under a chunked schedule (stages of their own degrees run one stage per pipeline rank)."""
    from planlang.plan.checker import check_text

    head = ("device gpu { memory = 80 GiB }\nlink nv { bandwidth = 300 GB/s }\n"
            "mesh m of 8 x gpu {\n    pp = 2 over nv\n    dp = 2 over nv\n    tp = 2 over nv\n}\n")

    def codes(schedule: str, first: str) -> list[str]:
        stages = [f"h[{3 * i}:{3 * i + 3}]" for i in range(4 if "chunks" in schedule else 2)]
        stages[0] += first
        body = "".join(f"    stage {s}\n" for s in stages)
        res = check_text(head + f"pipeline over pp schedule {schedule} microbatches 4 {{\n{body}}}\n", path="t.plan")
        return sorted(d.code for d in res.diagnostics if d.severity.name == "ERROR")

    for schedule in ("1f1b", "interleaved chunks 2", "looped_bfs chunks 2"):
        assert codes(schedule, " with tp = 2, dp = 2") == [], schedule
        assert codes(schedule, " with tp = 4, dp = 1") == ([] if schedule == "1f1b" else ["PL418"]), schedule
        assert codes(schedule, " with tp = 4") == ["PL410"], schedule  # 8 + 4 (+ 4 + 4): too many devices


# ------------------------------------------------------------------------------ the V shapes (zbv, dualpipev)
def test_v_placement_puts_stages_r_and_2p_minus_1_minus_r_on_rank_r_and_the_others_keep_s_mod_p():
    from planlang.plan.types import stage_ranks, stages_on, stages_per_rank

    for kind in ("zbv", "dualpipev"):
        assert stages_per_rank(kind, 1) == stages_per_rank(kind, 3) == 2  # whatever `chunks` says
        assert stage_ranks(kind, 3, 2) == (0, 1, 2, 2, 1, 0)  # the last rank holds the adjacent 2 and 3
        assert [stages_on(kind, 3, 2, r) for r in range(3)] == [(0, 5), (1, 4), (2, 3)]
    for kind, chunks in (("interleaved", 3), ("looped_bfs", 2), ("zero_bubble", 1), ("1f1b", 1)):
        p, v = 4, stages_per_rank(kind, chunks)
        assert stage_ranks(kind, p, chunks) == tuple(s % p for s in range(p * v))
        assert [stages_on(kind, p, chunks, r) for r in range(p)] == [tuple(range(r, p * v, p)) for r in range(p)]
    # each rank's order runs only its own stages (the orders and the placement agree)
    for kind in ("zbv", "dualpipev", "interleaved"):
        for r, order in enumerate(rank_orders(kind, 3, 6, 2)):
            assert {st.stage for st in order} == set(stages_on(kind, 3, 2, r)), (kind, r)


def test_zbv_holds_1f1bs_peak_on_every_rank_and_stage_s_holds_2p_minus_s():
    # ZB-V's activation memory is 1F1B's (the authors' summary, sail-sg/zero-bubble-pipeline-parallelism:
    # "1x"): 1F1B's first stage's p microbatches of a whole stage, 2p of a chunk, here on every rank, the W
    # freeing them; in torch's order model stage s holds 2p - s at once
    for p in (1, 2, 3, 5):
        for m in (2 * p - 1, 2 * p, 3 * p + 1):
            assert activation_peaks("zbv", p, m, [1] * (2 * p), chunks=2) == [min(2 * p, 2 * m)] * p, (p, m)
            assert [in_flight("zbv", 2 * p, s, m, chunks=2) for s in range(2 * p)] == \
                [min(2 * p - s, m) for s in range(2 * p)]
            # the chunks argument does not change where the V puts its stages
            assert in_flight("zbv", 2 * p, 0, m, chunks=1) == in_flight("zbv", 2 * p, 0, m, chunks=2)


def test_split_and_whole_backwards_free_what_they_hold():
    # zbv keeps a microbatch's activations until its W, and what its B leaves (pending) too: with the
    # activations 0 and 1 byte pending per B, a rank holds the Bs whose W it has not run
    for kind in ("zbv", "dualpipev"):
        for r, order in enumerate(rank_orders(kind, 3, 6, 2)):
            waiting = peak = 0
            for st in order:
                waiting += {"B": 1, "W": -1}.get(st.kind, 0)
                peak = max(peak, waiting)
            assert waiting == 0
            assert activation_peaks(kind, 3, 6, [0] * 6, chunks=2, pending=[1] * 6)[r] == peak
    # dualpipev's whole backwards (BW) free a microbatch at once: no W of theirs, nothing pending
    orders = rank_orders("dualpipev", 2, 4, 2)
    kinds = [st.kind for order in orders for st in order]
    assert kinds.count("F") == kinds.count("B") + kinds.count("BW") == 2 * 2 * 4
    assert kinds.count("W") == kinds.count("B") > 0
    # 2p + 1 chunk-microbatches (DeepSeek's "PP + 1" for PP = 2p stages): a pair's F runs before its BW
    assert activation_peaks("dualpipev", 2, 4, [1] * 4, chunks=2) == [5, 5]
    assert activation_peaks("dualpipev", 4, 11, [1] * 8, chunks=2) == [9] * 4


def test_backward_peaks_count_a_stages_gradients_on_the_rank_the_v_puts_it_on():
    from planlang.plan.schedule import backward_peaks

    p = 3
    for kind in ("zbv", "dualpipev"):
        zero = [0] * (2 * p)
        grads = [0] * (2 * p)
        grads[2 * p - 1] = 100  # the model's last stage: rank 0's second (s mod p would say rank p - 1)
        assert backward_peaks(kind, p, 2 * p, zero, zero, grads, 2) == [100, 0, 0], kind
        # a backward's own allocation shows on its rank, the activations held beside it
        extra = [1, 2, 3, 4, 5, 6]
        peaks = backward_peaks(kind, p, 2 * p, zero, extra, zero, 2)
        assert peaks == [6, 5, 4], kind  # rank r's larger of its stages r and 2p - 1 - r


def test_dualpipev_needs_a_microbatch_per_model_stage():
    with pytest.raises(ScheduleError, match="at least as many microbatches"):
        rank_orders("dualpipev", 3, 5, 2)
    assert len(rank_orders("zbv", 3, 1, 2)) == 3  # zbv takes any (torch leaves out what it padded)
