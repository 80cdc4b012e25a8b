"""Estimated vs measured peak memory of single-GPU training steps (run on a machine with CUDA).

Run: python bench/gpu_memory_check.py
For each case: one warm-up step, then one step measured two ways — torch.cuda.max_memory_allocated
(allocator bytes, 512-byte blocks) and torch's MemTracker (live tensor bytes) — against `planlang estimate`
of the same plan on an H100 mesh (the accelerator branch: foreach optimizer temporaries, fused attention).
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from planlang.model.price.estimate import estimate_plan  # noqa: E402
from planlang.plan.checker import check_text  # noqa: E402
from planlang.plan.complete import complete  # noqa: E402

PLAN = """use hardware
model m = "{ref}"({kw})
input {inp}
mesh g of 1 x hardware.h100_sxm {{ dp = 1 over hardware.nvlink4 }}
budget 70 GiB per device
optimizer adamw(lr = 0.001)
{extra}
"""

CASES = [
    ("gpt2 small b8 s1024", "examples.gpt2.model:build", dict(layers=12, hidden=768, heads=12, vocab=50257, seq=1024),
     "idx : i64[batch = 8, seq = 1024]", ""),
    ("gpt2 small ckpt", "examples.gpt2.model:build", dict(layers=12, hidden=768, heads=12, vocab=50257, seq=1024),
     "idx : i64[batch = 8, seq = 1024]", "checkpoint h[*] every 2"),
    ("bert base b16 s512", "examples.bert.model:build", dict(layers=12, hidden=768, heads=12, intermediate=3072,
                                                             vocab=30522, seq=512),
     "input_ids : i64[batch = 16, seq = 512]", ""),
    ("mlp 4096", "examples.mlp.model:build", dict(in_features=4096, hidden=16384, out_features=4096),
     "x : f32[batch = 512, features = 4096]", ""),
]


def measure(ref, kwargs, inp, extra):
    from torch.distributed._tools.mem_tracker import MemTracker

    module, fn = ref.split(":")
    mod = importlib.import_module(module)
    torch.manual_seed(0)
    model = getattr(mod, fn)(**kwargs).cuda()
    name, rest = inp.split(" : ")
    dtype, dims = rest.split("[")
    shape = [int(d.split("=")[1]) for d in dims.rstrip("]").split(",")]
    x = (torch.randint(0, 1000, shape) if dtype.startswith("i") else torch.randn(shape)).cuda()
    if "checkpoint" in extra:
        from planlang.model.program.recompute import wrap_chain

        every = int(extra.split()[-1])
        blocks = list(model.h)
        for i in range(0, len(blocks), every):
            wrap_chain(blocks[i:i + every])
    loss_fn = getattr(mod, "loss")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        out = model(x)
        target = x if not x.is_floating_point() else torch.zeros_like(out)
        loss = loss_fn(out, target)
        del out
        loss.backward()
        del loss
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    tracker = MemTracker()
    tracker.track_external(model, opt, x)
    with tracker:
        step()
    torch.cuda.synchronize()
    peak_alloc = torch.cuda.max_memory_allocated()
    snap = tracker.get_tracker_snapshot("peak")
    dev = [d for d in snap if d.type == "cuda"][0]
    tracked = snap[dev]["Total"]
    x_bytes = x.numel() * x.element_size()
    return peak_alloc - x_bytes, tracked - x_bytes, base


def main():
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}")
    print(f"{'case':22} {'allocator peak':>15} {'tracked peak':>13} {'estimate':>10} {'vs alloc':>9} {'vs tracked':>10}")
    for name, ref, kw, inp, extra in CASES:
        text = PLAN.format(ref=ref, kw=", ".join(f"{k} = {v}" for k, v in kw.items()), inp=inp, extra=extra)
        res = check_text(text, str(ROOT / "gpu.plan"))
        assert not res.errors, [str(d) for d in res.diagnostics]
        (est,) = estimate_plan(complete(res.plan))
        alloc, tracked, _ = measure(ref, kw, inp, extra)
        torch.cuda.empty_cache()
        print(f"{name:22} {alloc / 2**20:13.1f}Mi {tracked / 2**20:11.1f}Mi {est.peak / 2**20:8.1f}Mi "
              f"{100 * (est.peak - alloc) / alloc:+8.2f}% {100 * (est.peak - tracked) / tracked:+9.2f}%")


if __name__ == "__main__":
    main()
