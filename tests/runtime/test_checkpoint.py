"""Checkpoint round trips and errors in this process (a world of one gloo rank); the resharding across
plans and world sizes is in test_checkpoint_gloo.py."""
from __future__ import annotations


import pytest
import torch

from planlang.plan.types import Axis, Mesh, Spec
from planlang.runtime.checkpoint import CheckpointError, load_checkpoint, load_full_state, save_checkpoint
from planlang.runtime.placement import ParamLayout
from tests.runtime.one_process import one_process_group

MESH = Mesh("m", None, (Axis("dp", 1),))


@pytest.fixture(scope="module")
def groups():
    from planlang.runtime.redistribute import MeshGroups

    with one_process_group():
        yield MeshGroups(MESH)


def _trained(opt_cls, **kw):
    torch.manual_seed(1)
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    opt = opt_cls(m.parameters(), **kw)
    for _ in range(2):
        opt.zero_grad()
        m(torch.randn(5, 3)).pow(2).mean().backward()
        opt.step()
    return m, opt


@pytest.mark.parametrize("opt_cls, kw, keys", [
    (torch.optim.AdamW, {"lr": 0.1}, {"step", "exp_avg", "exp_avg_sq"}),
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, {"momentum_buffer"}),
])
def test_round_trip_of_parameters_buffers_and_state(groups, tmp_path, opt_cls, kw, keys):
    m, opt = _trained(opt_cls, **kw)
    save_checkpoint(tmp_path / "ck", m, opt, {}, groups)
    full = load_full_state(tmp_path / "ck")
    for name, t in m.state_dict().items():  # parameters and BatchNorm's running statistics
        assert torch.equal(full["model"][name], t), name
    for name, p in m.named_parameters():
        assert set(full["optim"]["state"][name]) == keys
        for k, v in opt.state[p].items():
            assert torch.equal(full["optim"]["state"][name][k], v)
    assert full["optim"]["param_groups"][0]["lr"] == 0.1
    m2, opt2 = _trained(opt_cls, lr=0.7, **{k: v for k, v in kw.items() if k != "lr"})
    torch.manual_seed(5)
    with torch.no_grad():
        for p in m2.parameters():
            p.normal_()
    opt2.state.clear()
    load_checkpoint(tmp_path / "ck", m2, opt2, {}, groups)
    for (name, a), b in zip(m.state_dict().items(), m2.state_dict().values()):
        assert torch.equal(a, b), name
    assert opt2.param_groups[0]["lr"] == 0.1
    for p, p2 in zip(m.parameters(), m2.parameters()):
        assert set(opt2.state[p2]) == keys
        assert all(torch.equal(opt.state[p][k], opt2.state[p2][k]) for k in keys)


def test_wrong_shape_and_missing_optimizer_are_clear_errors(groups, tmp_path):
    m, opt = _trained(torch.optim.AdamW, lr=0.1)
    save_checkpoint(tmp_path / "model_only", m, None, {}, groups)
    with pytest.raises(CheckpointError, match="saved without an optimizer"):
        load_checkpoint(tmp_path / "model_only", m, opt, {}, groups)
    other = torch.nn.Sequential(torch.nn.Linear(3, 6), torch.nn.BatchNorm1d(6))
    with pytest.raises(CheckpointError, match=r"0.weight of shape \[4, 3\], the model \[6, 3\]"):
        load_checkpoint(tmp_path / "model_only", other, None, {}, groups)
    bad = {"0.weight": ParamLayout("0.weight", (4, 3), Spec(((), ()))), "nope": ParamLayout("nope", (1,), Spec(((),)))}
    with pytest.raises(CheckpointError, match="lacks: nope"):
        save_checkpoint(tmp_path / "x", m, None, bad, groups)
