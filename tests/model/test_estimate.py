"""The estimator against measured memory: one real training step tracked by torch's MemTracker."""
import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker

from planlang.model.estimate import estimate_plan
from planlang.plan.checker import check_text

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
    (est,) = estimate_plan(res.plan)
    if checkpoint and case == "tinynet":
        groups = ["h.0", "h.1", "h.2", "h.3"]
    measured = measured_peak(ref, kwargs, make(), groups)
    assert abs(est.peak - measured) / measured < 0.01, (est, measured)


def test_checkpointing_lowers_the_estimate():
    ref, kwargs, inp, _ = CASES["gpt2"]
    kw = ", ".join(f"{k} = {v}" for k, v in kwargs.items())
    plain = check_text(PLAN.format(ref=ref, kw=kw, inp=inp, extra=""), "a.plan").plan
    ckpt = check_text(PLAN.format(ref=ref, kw=kw, inp=inp, extra="checkpoint h[*] every 1"), "b.plan").plan
    assert estimate_plan(ckpt)[0].activations < estimate_plan(plain)[0].activations


def test_zero_divides_optimizer_state():
    text = PLAN.format(ref="examples.mlp.model:build", kw="in_features = 256, hidden = 1024, out_features = 256",
                       inp="x : f32[batch = 64, features = 256]", extra="data x : [dp, _]")
    text = text.replace("1 x hardware.cpu { dp = 1", "4 x hardware.cpu { dp = 4")
    base = estimate_plan(check_text(text, "a.plan").plan)[0]
    z1 = estimate_plan(check_text(text.replace("adamw(lr = 0.001)", "adamw(lr = 0.001) { zero = 1 over dp }"),
                                  "b.plan").plan)[0]
    assert z1.optimizer == pytest.approx(base.optimizer / 4, rel=1e-3)
    assert z1.parameters == base.parameters and z1.gradients == base.gradients
