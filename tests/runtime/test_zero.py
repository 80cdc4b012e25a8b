"""Building the plan's optimizer, finding the data axes, and the placement helpers of checkpoint.py
(no processes; the distributed behaviour is in the *_gloo tests)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from planlang.plan.types import OPTIMIZERS, Axis, DataSpec, Input, Mesh, Optimizer, Plan, Spec
from planlang.runtime.checkpoint import CheckpointError, chunk_bounds, placements_with
from planlang.runtime.apply import PlanError, load_plan
from planlang.runtime.data_parallel import DataParallelError, wrap_data_parallel
from planlang.runtime.placement import ParamLayout
from planlang.runtime.zero import TORCH_OPTIMIZERS, OptimizerError, build_optimizer, optimizer_kwargs

ROOT = Path(__file__).resolve().parents[2]
MESH = Mesh("m", None, (Axis("dp", 2), Axis("tp", 2)))


def _plan(data=((("dp",), ()),), zero=0, axis=None, inputs=None, opt="adamw"):
    inputs = inputs or (Input("x", "f32", (("batch", 8), ("features", 4))),)
    return Plan("<t>", inputs=inputs, mesh=MESH, optimizer=Optimizer(opt, (("lr", 0.1),), zero, axis),
                data=tuple(DataSpec(i.name, Spec(d)) for i, d in zip(inputs, data)))


class _Groups:  # what build_optimizer needs of MeshGroups without a process group
    mesh = MESH

    def size(self, axis):
        return MESH.axis_size(axis)


# ------------------------------------------------------------------------------ optimizer
@pytest.mark.parametrize("name, cls", [("sgd", torch.optim.SGD), ("momentum", torch.optim.SGD),
                                       ("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW),
                                       ("adagrad", torch.optim.Adagrad), ("rmsprop", torch.optim.RMSprop)])
def test_builds_the_named_torch_optimizer(name, cls):
    m = torch.nn.Linear(3, 2)
    opt = build_optimizer(m, Optimizer(name, (("lr", 0.25),)))
    assert type(opt) is cls
    assert opt.param_groups[0]["lr"] == 0.25 and len(opt.param_groups[0]["params"]) == 2
    if name == "momentum":
        assert opt.param_groups[0]["momentum"] == 0.9


def test_plan_arguments_reach_torch_lists_as_tuples():
    opt = Optimizer("adamw", (("lr", 3e-4), ("betas", (0.9, 0.95)), ("weight_decay", 0.1), ("eps", 1e-6)))
    got = build_optimizer([("w", torch.nn.Parameter(torch.ones(2)))], opt).param_groups[0]
    assert (got["lr"], got["betas"], got["weight_decay"], got["eps"]) == (3e-4, (0.9, 0.95), 0.1, 1e-6)
    assert optimizer_kwargs(Optimizer("sgd", (("momentum", 0.5),))) == {"momentum": 0.5}


def test_unknown_optimizer_lists_the_known_ones():
    with pytest.raises(OptimizerError, match="known") as err:
        build_optimizer(torch.nn.Linear(2, 2), Optimizer("adamx"))
    assert all(name in str(err.value) for name in TORCH_OPTIMIZERS)
    # every optimizer the language accepts is built (lion by planlang itself: tests/runtime/test_lion.py)
    for name in OPTIMIZERS:
        assert build_optimizer(torch.nn.Linear(2, 2), Optimizer(name)) is not None


def test_unknown_argument_names_the_accepted_ones():
    with pytest.raises(OptimizerError, match="no argument `momentum`.*weight_decay"):
        build_optimizer(torch.nn.Linear(2, 2), Optimizer("adamw", (("momentum", 0.9),)))


def test_zero2_needs_fsdp_parameters():
    with pytest.raises(OptimizerError, match="wrap_data_parallel"):
        build_optimizer(torch.nn.Linear(2, 2), Optimizer("adamw", (), 2, "dp"), _Groups())
    with pytest.raises(OptimizerError, match="MeshGroups"):
        build_optimizer(torch.nn.Linear(2, 2), Optimizer("adamw", (), 1, "dp"))


def test_the_zero_stage_and_axis_are_the_checkers():
    # a ZeRO axis the mesh lacks, a stage that does not exist, a stage without an axis: refused with the
    # checker's codes when the plan loads (build_optimizer takes a validated plan's optimizer)
    for (stage, axis), code in [((1, "pp"), "PL201"), ((5, "dp"), "PL502"), ((2, None), "PL503")]:
        with pytest.raises(PlanError, match=rf"error\[{code}\]"):
            load_plan(_plan(zero=stage, axis=axis))


# ------------------------------------------------------------------------------ data axes
def test_data_axes_of_the_examples():
    # the runtime reads them from the validated plan's parallel dimensions (planlang.plan.parallel)
    assert load_plan(ROOT / "examples/mlp/mlp_2d.plan").dims.data == ("dp",)
    assert load_plan(ROOT / "examples/mlp/mlp_dp.plan").dims.data == ("rank",)
    gpt = load_plan(ROOT / "examples/gpt2/gpt2_3d.plan").dims
    assert gpt.data == ("dp",) and (gpt.zero_stage, gpt.zero_axis) == (1, "dp") and gpt.fsdp == ()


def test_data_axes_in_mesh_order_from_the_batch_dim():
    assert load_plan(_plan(data=((("dp", "tp"), ()),))).dims.data == ("dp", "tp")
    seq_first = (Input("x", "f32", (("seq", 4), ("batch", 8))),)
    assert load_plan(_plan(data=(((), ("tp",)),), inputs=seq_first)).dims.data == ("tp",)
    assert load_plan(_plan(data=(((), ("tp",)),))).dims.data == ()  # only a feature dim split


# what the runtime cannot run is refused by the checker's coded rules when the plan loads, not restated
# by the runtime in words of its own
def test_inputs_split_over_different_axes_are_pl313_when_the_plan_loads():
    two = (Input("x", "f32", (("batch", 8),)), Input("y", "f32", (("batch", 8),)))
    with pytest.raises(PlanError, match=r"error\[PL313\].*different axes"):
        load_plan(_plan(data=((("dp",),), (("tp",),)), inputs=two))


def test_zero_over_a_non_data_axis_is_pl504_when_the_plan_loads():
    with pytest.raises(PlanError, match=r"error\[PL504\]: ZeRO over `tp`"):
        load_plan(_plan(zero=1, axis="tp"))


def test_parameter_split_over_a_data_axis_is_refused():
    lay = {"w": ParamLayout("w", (4, 4), Spec((("dp",), ())))}
    with pytest.raises(DataParallelError, match="split over data axis `dp`"):
        wrap_data_parallel(torch.nn.Linear(4, 4), load_plan(_plan()), None, layouts=lay)


# ------------------------------------------------------------------------------ checkpoint placements
@pytest.mark.parametrize("n, parts", [(0, 2), (1, 2), (5, 2), (7, 3), (8, 4), (3, 4)])
def test_chunk_bounds_match_torch_chunk(n, parts):
    rows = torch.arange(n)
    got = [rows[slice(*chunk_bounds(n, parts, i))] for i in range(parts)]
    want = list(torch.chunk(rows, parts)) if n else []
    want += [rows[:0]] * (parts - len(want))  # torch.chunk drops empty trailing chunks
    assert [g.tolist() for g in got] == [w.tolist() for w in want]


def test_placements_with_minor_most_axis():
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    # dim 0 unsplit: dp simply shards it
    assert placements_with(Spec(((), ("tp",))), MESH, {"dp": 0}) == (Shard(0), Shard(1))
    # dim 0 split over tp first (later in the mesh): dp's slices interleave with tp's
    got = placements_with(Spec((("tp",), ())), MESH, {"dp": 0})
    assert got == (_StridedShard(0, split_factor=2), Shard(0))
    assert placements_with(Spec(((), ())), MESH, {}) == (Replicate(), Replicate())
    with pytest.raises(CheckpointError, match="already splits"):
        placements_with(Spec((("dp",), ())), MESH, {"dp": 0})
