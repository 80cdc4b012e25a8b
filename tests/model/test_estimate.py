"""The estimator against measured memory: one real training step tracked by torch's MemTracker."""
import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker

from planlang.model.price.estimate import estimate_plan
from planlang.plan.checker import check_text
from planlang.plan.complete import complete

PLAN = """use hardware
model m = "{ref}"({kw})
input {inp}
mesh r of 1 x hardware.cpu {{ dp = 1 over hardware.loopback }}
budget 20 GiB per device
optimizer adamw(lr = 0.001)
{extra}
"""

CASES = {
    "tinynet": ("tests.model.tinynet:build", {"hidden": 64, "layers": 4}, "idx : i64[batch = 8, seq = 32]",
                lambda: torch.randint(0, 96, (8, 32))),
    "gpt2": ("examples.gpt2.model:build", {"layers": 2, "hidden": 128, "heads": 4, "vocab": 1000, "seq": 64},
             "idx : i64[batch = 4, seq = 64]", lambda: torch.randint(0, 1000, (4, 64))),
    "mlp": ("examples.mlp.model:build", {"in_features": 256, "hidden": 1024, "out_features": 256},
            "x : f32[batch = 64, features = 256]", lambda: torch.randn(64, 256)),
}


def measured_peak(ref, kwargs, x, checkpointed):
    import importlib
    import torch.utils.checkpoint as cp

    module, fn = ref.split(":")
    torch.manual_seed(0)
    mod = importlib.import_module(module)
    model = getattr(mod, fn)(**kwargs)
    # the canonical loop the estimator assumes: the module's own loss (tokens score themselves), the
    # output dropped before backward, the loss after it
    loss_fn = getattr(mod, "loss", None)
    for name in checkpointed:
        mod = model.get_submodule(name)
        mod.forward = (lambda f: lambda *a, **k: cp.checkpoint(f, *a, use_reentrant=False, **k))(mod.forward)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        out = model(x)
        loss = loss_fn(out, x if not x.is_floating_point() else torch.zeros_like(out)) if loss_fn else out.sum()
        del out
        loss.backward()
        del loss
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # steady state: optimizer states exist
    tracker = MemTracker()
    tracker.track_external(model, opt)
    with tracker:
        step()
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


@pytest.mark.parametrize("case,checkpoint", [("tinynet", False), ("tinynet", True), ("gpt2", False),
                                             ("gpt2", True), ("mlp", False)])
def test_estimated_peak_matches_measured(case, checkpoint):
    ref, kwargs, inp, make = CASES[case]
    groups = ["h.0", "h.1"] if checkpoint else []
    extra = "checkpoint h[*] every 1" if checkpoint else ""
    text = PLAN.format(ref=ref, kw=", ".join(f"{k} = {v}" for k, v in kwargs.items()), inp=inp, extra=extra)
    res = check_text(text, "estimate.plan")
    assert not res.errors, res.diagnostics
    (est,) = estimate_plan(complete(res.plan))
    if checkpoint and case == "tinynet":
        groups = ["h.0", "h.1", "h.2", "h.3"]
    measured = measured_peak(ref, kwargs, make(), groups)
    assert abs(est.peak - measured) / measured < 0.01, (est, measured)


def test_checkpointing_lowers_the_estimate():
    ref, kwargs, inp, _ = CASES["gpt2"]
    kw = ", ".join(f"{k} = {v}" for k, v in kwargs.items())
    plain = complete(check_text(PLAN.format(ref=ref, kw=kw, inp=inp, extra=""), "a.plan").plan)
    ckpt = complete(check_text(PLAN.format(ref=ref, kw=kw, inp=inp, extra="checkpoint h[*] every 1"), "b.plan").plan)
    assert estimate_plan(ckpt)[0].activations < estimate_plan(plain)[0].activations


def test_zero2_divides_optimizer_state_and_gradients():
    # FSDP2 (ZeRO-2) slices every tensor over the ZeRO axis; the parameters rest as shards too, and the
    # whole model (one FSDP unit) is gathered while forward and backward run
    base = estimate_plan(_mlp_plan(dp=4))[0]
    z2 = estimate_plan(_mlp_plan(dp=4, opt="adamw(lr = 0.001) { zero = 2 over dp }"))[0]
    assert z2.optimizer == pytest.approx(base.optimizer / 4, rel=1e-3)
    assert z2.gradients == base.buffers // 4  # without ZeRO the gradients are slices of the buckets
    assert base.gradients == 0 and z2.buffers == 0
    assert z2.parameters == base.parameters // 4
    assert z2.peak >= z2.parameters + z2.optimizer + z2.activations + base.parameters  # the gathered unit


def _mlp_plan(extra: str = "", dp: int = 1, opt: str = "adamw(lr = 0.001)"):
    text = PLAN.format(ref="examples.mlp.model:build", kw="in_features = 256, hidden = 1024, out_features = 256",
                       inp="x : f32[batch = 64, features = 256]", extra="data x : [dp, _]\n" + extra)
    text = text.replace("1 x hardware.cpu { dp = 1", f"{dp} x hardware.cpu {{ dp = {dp}")
    res = check_text(text.replace("adamw(lr = 0.001)", opt), "mlp.plan")
    assert not res.errors, res.diagnostics
    return complete(res.plan)


def test_zero1_state_is_the_fullest_rank_of_torchs_partition():
    """ZeroRedundancyOptimizer gives each rank whole parameters; the estimate is the fullest rank's state
    under the partition torch itself makes (a fake process group of 4 ranks)."""
    import importlib
    import warnings

    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    z1 = estimate_plan(_mlp_plan(dp=4, opt="adamw(lr = 0.001) { zero = 1 over dp }"))[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.distributed.optim import ZeroRedundancyOptimizer
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
        try:
            model = importlib.import_module("examples.mlp.model").build(in_features=256, hidden=1024,
                                                                       out_features=256)
            zro = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3)
            parts = zro._partition_parameters()
        finally:
            dist.destroy_process_group()
    # AdamW: two fp32 moments per element and a 4-byte step counter per tensor
    per_rank = [sum(2 * p.numel() * 4 + 4 for p in groups[0]["params"]) for groups in parts]
    assert z1.optimizer == max(per_rank)
    assert z1.optimizer > sum(per_rank) / 4  # whole tensors: the fullest rank holds more than a quarter


def test_grad_sync_ddp_buckets_against_the_flat_all_reduce():
    plan = _mlp_plan(dp=2)
    flat, = estimate_plan(plan)
    ddp, = estimate_plan(plan, grad_sync="ddp")
    assert ddp.buffers == ddp.parameters  # DDP's buckets hold a copy of every gradient
    # planlang's buckets persist too, and the gradients are their slices: counted once, as buffers
    assert flat.buffers == ddp.parameters and flat.gradients == 0
    assert flat.peak >= flat.parameters + flat.optimizer + flat.buffers
    assert ddp.peak >= ddp.parameters + ddp.optimizer + ddp.buffers + ddp.gradients
    assert flat.peak < ddp.peak
    with pytest.raises(ValueError, match="grad_sync"):
        estimate_plan(plan, grad_sync="nccl")


def test_accumulated_backward_matches_measured():
    """The second backward of gradient accumulation (pipelines, from the second microbatch on): every
    gradient is live while autograd computes the next one. Simulated on meta vs measured by MemTracker."""
    import importlib

    from planlang.model.capture.simulate import simulate_step

    kwargs = {"layers": 2, "hidden": 128, "heads": 4, "vocab": 1000, "seq": 64}
    mod = importlib.import_module("examples.gpt2.model")
    torch.manual_seed(0)
    model = mod.build(**kwargs)
    x = torch.randint(0, 1000, (4, 64))

    def fwd_bwd():
        loss = mod.loss(model(x), x)
        loss.backward()

    fwd_bwd()  # the first microbatch: gradients exist afterwards
    tracker = MemTracker()
    tracker.track_external(model, x)
    with tracker:
        fwd_bwd()
    snap = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    measured = snap["Total"] - snap[_ref("Parameter")] - snap[_ref("Other")]

    with torch.device("meta"):
        meta_model = mod.build(**kwargs)
    sim = simulate_step(meta_model, {"idx": x.to("meta")}, lambda out, inp: mod.loss(out, inp["idx"]),
                        accumulate=True)
    grads = sum(p.numel() * 4 for p in model.parameters())
    assert sim.backward_peak_accum > sim.backward_peak  # the other gradients are live throughout
    assert sim.backward_peak_accum >= grads
    assert abs(sim.backward_peak_accum - measured) / measured < 0.01, (sim.backward_peak_accum, measured)


def _ref(name: str):
    from torch.distributed._tools.mem_tracker import _MemRefType

    return next(r for r in _MemRefType if r.value == name)


def _pipeline_plan(ranks: int, schedule: str) -> str:
    text = PLAN.format(ref="tests.model.tinynet:build", kw="hidden = 64, layers = 4",
                       inp="idx : i64[batch = 8, seq = 32]", extra="")
    text = text.replace("{ dp = 1 over hardware.loopback }", "{ pp = %d over hardware.loopback }" % ranks)
    text = text.replace("of 1 x", f"of {ranks} x")
    return text + f"""pipeline over pp schedule {schedule} microbatches 4 {{
    stage emb, h[0]
    stage h[1]
    stage h[2]
    stage h[3], head
}}
"""


def test_an_interleaved_schedule_is_estimated_per_pipeline_rank():
    """Interleaved 1F1B over 2 ranks with 2 chunks each: one row per rank, holding stages r and r + 2.
    Its kept classes are those of its two stages (priced alone by the 1F1B plan of the same four stages on
    4 ranks), and its activations are its peak over both chunks in its order of forwards and backwards -
    what each stage saves per microbatch, replayed by planlang.plan.schedule.activation_peaks."""
    from planlang.plan.schedule import activation_peaks, in_flight

    def rows(ranks, schedule):
        res = check_text(_pipeline_plan(ranks, schedule), "pp.plan")
        assert not res.errors, [str(d) for d in res.diagnostics]
        return estimate_plan(complete(res.plan))

    four = rows(4, "1f1b")
    two = rows(2, "interleaved chunks 2")
    assert [r.stages for r in two] == [(0, 2), (1, 3)]
    assert [r.device for r in two] == ["rank 0 (stages 0, 2)", "rank 1 (stages 1, 3)"]
    saved = [r.activations // in_flight("1f1b", 4, s, 4) for s, r in enumerate(four)]
    assert all(s > 0 for s in saved)
    peaks = activation_peaks("interleaved", 2, 4, saved, chunks=2)
    for r, row in enumerate(two):
        mine = [four[r], four[r + 2]]
        for k in ("parameters", "gradients", "optimizer", "grad_buckets"):
            assert getattr(row, k) == sum(getattr(x, k) for x in mine), k
        # receive buffers are the schedule's: torch's interleaved schedule receives ahead of a stage's
        # order (one of each per microbatch, planlang.runtime.recv_buffers), 1F1B its microbatches in flight
        assert row.buffers - row.grad_buckets > sum(x.buffers - x.grad_buckets for x in mine)
        assert row.activations == peaks[r]
        assert row.stage_times == pytest.approx(tuple(x.stage_times[0] for x in mine), rel=1e-12)
        # one device holds both chunks: more than either stage alone, and the rank's peak is never the
        # sum of its chunks' own peaks (their warm-ups overlap in time, not in full)
        assert row.peak > max(x.peak for x in mine)


def _gpt2_zero_plan(layers: int, zero: int):
    text = PLAN.format(ref="examples.gpt2.model:build",
                       kw=f"layers = {layers}, hidden = 128, heads = 4, vocab = 512, seq = 32",
                       inp="idx : i64[batch = 8, seq = 32]", extra="data idx : [dp, _]\n")
    text = text.replace("1 x hardware.cpu { dp = 1", "4 x hardware.cpu { dp = 4")
    res = check_text(text.replace("adamw(lr = 0.001)", f"adamw(lr = 0.001) {{ zero = {zero} over dp }}"), "g.plan")
    assert not res.errors, res.diagnostics
    return complete(res.plan)


def test_zero3_gathers_one_block_at_a_time():
    """planlang.apply shards each GPT-2 block as its own FSDP2 unit (bench/results/zero_blocks.txt measures
    it): under ZeRO-3 a block more adds its shards, optimizer state and activations to the peak, not its
    whole parameters; under ZeRO-2 every block stays gathered from forward to backward."""
    block = (12 * 128 * 128 + 13 * 128) * 4  # one block's parameters, whole
    z3 = [estimate_plan(_gpt2_zero_plan(n, 3))[0].peak for n in (4, 8)]
    z2 = [estimate_plan(_gpt2_zero_plan(n, 2))[0].peak for n in (4, 8)]
    # four more blocks add the same shards, state and activations under both; ZeRO-2 also holds them whole
    assert abs((z2[1] - z2[0]) - (z3[1] - z3[0]) - 4 * block) < 0.1 * 4 * block
    assert z3[1] < z2[1]
