"""torch's lr schedulers drive the optimizers `pm.optimizer()` may return (planlang's MasterWeights and
ScaledOptimizer wrappers: the same lrs and the same steps as the plain optimizer), and
planlang.runtime.clip on one rank is torch.nn.utils.clip_grad_norm_ (the gloo suite, with sharded
models: tests/runtime/test_clip_save_gloo.py); planlang.save / load with a scheduler, and what they refuse."""
from __future__ import annotations

import copy
import math

import pytest
import torch

from planlang.runtime.clip import clip_grad_norm_, copy_weights
from planlang.runtime.precision import LossScale, MasterWeights, ScaledOptimizer
from tests.runtime.one_process import one_process_group


def _warmup_then_halve(step: int) -> float:
    return min(1.0, (step + 1) / 2) * 0.5 ** step


def test_lambda_lr_drives_the_wrappers_like_the_plain_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    models = [copy.deepcopy(model) for _ in range(3)]
    opts = [torch.optim.AdamW(models[0].parameters(), lr=0.1),
            MasterWeights(list(models[1].parameters()), torch.float32, lambda ps: torch.optim.AdamW(ps, lr=0.1)),
            ScaledOptimizer(torch.optim.AdamW(models[2].parameters(), lr=0.1), LossScale(4.0))]
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, _warmup_then_halve) for o in opts]
    x = torch.randn(5, 4)
    for _ in range(4):
        for i, (m, o, sc) in enumerate(zip(models, opts, scheds)):
            o.zero_grad()
            loss = m(x).pow(2).sum()
            (loss * 4.0 if i == 2 else loss).backward()  # ScaledOptimizer divides by its scale
            o.step()
            sc.step()
        lrs = [sc.get_last_lr()[0] for sc in scheds]
        assert lrs[0] == lrs[1] == lrs[2]
        assert opts[1].inner.param_groups[0]["lr"] == lrs[0]  # what the inner optimizer steps with
        for m in models[1:]:
            assert torch.allclose(m.weight, models[0].weight, rtol=0, atol=1e-7)
    assert scheds[1].state_dict()["last_epoch"] == 4


@pytest.mark.parametrize("norm_type", [1.0, 2.0, math.inf])
def test_clip_on_one_rank_is_torchs(norm_type):
    torch.manual_seed(0)
    a, b = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
    b.load_state_dict(a.state_dict())
    x = torch.randn(3, 8)
    for m in (a, b):
        m(x).pow(2).sum().backward()
    want = torch.nn.utils.clip_grad_norm_(a.parameters(), 0.5, norm_type)
    with one_process_group():
        named = list(b.named_parameters())
        weights = copy_weights(named, {}, groups=None)  # no layouts: no axis is read
        got = clip_grad_norm_(named, weights, 0.5, norm_type)
    assert weights == {n: 1.0 for n, _ in named}
    assert torch.allclose(got, want, rtol=1e-6)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-6)


def test_loss_scale_is_taken_out_of_the_norm():
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4)
    lin(torch.randn(3, 8)).pow(2).sum().backward()
    grads = [p.grad.clone() for p in lin.parameters()]
    want = torch.nn.utils.get_total_norm(grads)
    for p in lin.parameters():
        p.grad.mul_(1024.0)
    named = list(lin.named_parameters())
    got = clip_grad_norm_(named, {n: 1.0 for n, _ in named}, 0.1, loss_scale=1024.0)
    assert torch.allclose(got, want, rtol=1e-6)
    # the gradients keep the scale, times torch's factor: the optimizer's unscale gives clipped ones
    coef = 0.1 / (float(want) + 1e-6)
    for p, g in zip(lin.parameters(), grads):
        assert torch.allclose(p.grad / 1024.0, g * coef, rtol=1e-6)


# ------------------------------------------------------------------ planlang.save / load (one rank)
def _fake_pm(module, groups):
    """What planlang.save reads of a ParallelModel: its module, layouts and groups."""
    from types import SimpleNamespace

    return SimpleNamespace(module=module, layouts={}, groups=groups)


@pytest.fixture()
def groups():
    from planlang.plan.types import Axis, Mesh
    from planlang.runtime.redistribute import MeshGroups

    with one_process_group():
        yield MeshGroups(Mesh("m", None, (Axis("dp", 1),)))


def _trained():
    torch.manual_seed(1)
    m = torch.nn.Linear(3, 4)
    opt = torch.optim.AdamW(m.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _warmup_then_halve)
    for _ in range(3):
        opt.zero_grad()
        m(torch.randn(5, 3)).pow(2).mean().backward()
        opt.step()
        sched.step()
    return m, opt, sched


def test_save_load_restores_the_scheduler(groups, tmp_path):
    from planlang.runtime.save_load import load, save

    m, opt, sched = _trained()
    save(_fake_pm(m, groups), opt, tmp_path / "ck", scheduler=sched)
    m2 = torch.nn.Linear(3, 4)
    opt2 = torch.optim.AdamW(m2.parameters(), lr=0.1)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, _warmup_then_halve)
    load(_fake_pm(m2, groups), opt2, tmp_path / "ck", scheduler=sched2)
    assert sched2.last_epoch == 3 and sched2.get_last_lr() == sched.get_last_lr()
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    assert torch.equal(m2.weight, m.weight)
    assert torch.equal(opt2.state[m2.weight]["exp_avg"], opt.state[m.weight]["exp_avg"])


def test_load_asks_for_a_scheduler_the_checkpoint_lacks(groups, tmp_path):
    from planlang.runtime.checkpoint import CheckpointError
    from planlang.runtime.save_load import load, save

    m, opt, sched = _trained()
    save(_fake_pm(m, groups), opt, tmp_path / "ck")
    with pytest.raises(CheckpointError, match="holds no scheduler"):
        load(_fake_pm(m, groups), opt, tmp_path / "ck", scheduler=sched)


def test_pipeline_x_tensor_parallel_buffers_are_refused(groups, tmp_path):
    """pp x tp stages read the model's buffers, which every rank holds whole: no copy is known current."""
    from types import SimpleNamespace

    from planlang.runtime.checkpoint import CheckpointError
    from planlang.runtime.save_load import save

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    stage = SimpleNamespace(_rt=SimpleNamespace(modules=model))
    runner = SimpleNamespace(stage_modules={0: stage}, named_parameters=model.named_parameters)
    pm = SimpleNamespace(runner=runner, program=object(), layouts={}, groups=groups)
    with pytest.raises(CheckpointError, match="buffers"):
        save(pm, None, tmp_path / "ck")
