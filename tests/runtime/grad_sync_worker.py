"""Worker for tests/runtime/test_grad_sync_gloo.py: gradient sums overlapped with backward, and
gradient accumulation under `no_sync`, against one process."""
from __future__ import annotations

import os
import sys

PLAN = """use hardware
model mlp = "examples.mlp.model:build"(in_features = 256, hidden = 2048, out_features = 256)
input x : f32[batch = 8, features = 256]
mesh ranks of 2 x hardware.cpu {
    dp = 2 over hardware.loopback
}
optimizer sgd(lr = 0.1)
data x : [dp, _]
"""


def run(rank: int, world: int, port: int, out_dir: str) -> None:
    import json

    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    sys.path.insert(0, os.getcwd())
    from planlang.model.capture.load import build_model, plan_loss
    from planlang.plan.checker import check_text
    from planlang.runtime.apply import apply

    path = os.path.join(out_dir, "mlp_dp2_big.plan")
    if rank == 0:
        with open(path, "w") as f:
            f.write(PLAN)
    dist.barrier()
    plan = check_text(PLAN, path).plan
    torch.manual_seed(0)
    model = build_model(plan.model, plan.path, device="cpu")
    ref = build_model(plan.model, plan.path, device="cpu")
    ref.load_state_dict(model.state_dict())
    loss_fn = plan_loss(plan)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 256, generator=g), torch.randn(8, 256, generator=g)) for _ in range(2)]
    pm = apply(model, plan, loss_fn=loss_fn, targets=(torch.empty(8, 256, device="meta"),))
    out = {}

    # one step: do bucket sums start during backward?
    loss = pm(*batches[0]).loss
    loss.backward()
    # backward's seed gradient (ones_like) reads only the loss's shape: it leaves the loss all-reduce in flight
    out["loss_waited_in_backward"] = bool(getattr(loss, "completed", True))
    gs = pm._gradient_sums()
    out["buckets"] = len(gs.buckets)
    out["started_in_backward"] = sum(b.launched for b in gs.buckets)
    pm.sync_grads()
    # the gradients are views of the persistent buckets (no flat copy per step), and stay so
    buffers = {b.flat.untyped_storage().data_ptr() for b in gs.buckets}
    out["grads_are_bucket_views"] = all(p.grad.untyped_storage().data_ptr() in buffers for p in pm.parameters())
    grads = pm.full_grads()
    ref.zero_grad()
    ref_loss = loss_fn(ref(batches[0][0]), batches[0][1])
    ref_loss.backward()
    out["loss_err"] = abs(loss.detach().item() - ref_loss.item()) / abs(ref_loss.item())
    out["step_err"] = max(((grads[n] - p.grad).norm() / p.grad.norm()).item() for n, p in ref.named_parameters())

    # accumulation: the first backward inside no_sync starts nothing; the second one syncs the sum
    for p in pm.parameters():
        p.grad = None
    with pm.no_sync():
        pm(*batches[0]).loss.backward()
    out["started_in_no_sync"] = sum(b.launched for b in gs.buckets)
    pm(*batches[1]).loss.backward()
    pm.sync_grads()
    grads = pm.full_grads()
    ref.zero_grad()
    for x, y in batches:
        loss_fn(ref(x), y).backward()
    out["accumulated_err"] = max(((grads[n] - p.grad).norm() / p.grad.norm()).item()
                                 for n, p in ref.named_parameters())

    # accumulation without no_sync (each backward sums; DDP's loop without no_sync), then two steps before
    # the optimizer's: the gradients are the batches' sum all the same, not the first sum counted again
    for p in pm.parameters():
        p.grad = None
    pm(*batches[0]).loss.backward()
    pm(*batches[1]).loss.backward()
    pm.sync_grads()
    grads = pm.full_grads()
    out["accumulated_synced_err"] = max(((grads[n] - p.grad).norm() / p.grad.norm()).item()
                                        for n, p in ref.named_parameters())
    for p in pm.parameters():
        p.grad = None
    pm.step(*batches[0])
    pm.step(*batches[1])
    grads = pm.full_grads()
    out["two_steps_err"] = max(((grads[n] - p.grad).norm() / p.grad.norm()).item()
                               for n, p in ref.named_parameters())
    every = [None] * world
    dist.all_gather_object(every, out)
    if rank == 0:
        with open(os.path.join(out_dir, "grad_sync.json"), "w") as f:
            json.dump(every, f)
    from planlang.runtime.teardown import leave

    leave()  # barrier, destroy, exit without finalization (see teardown.py)
