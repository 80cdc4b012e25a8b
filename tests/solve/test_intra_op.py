"""The intra-op adapter: op graphs of small models -> ILP -> specs with the expected structure."""
import math

import pytest
import torch
from torch import nn

from planlang.cost.comm import Collective, collective_time, group
from planlang.cost.layout import conversion_path, enumerate_layouts, local_numel
from planlang.model.capture.opgraph import op_graph
from planlang.plan.types import Axis, Device, Hole, Link, Mesh, Spec
from planlang.solve.ilp import InfeasibleBudget, SolveOptions, evaluate, solve
from planlang.solve.intra_op import (
    IntraOpError, block_pattern, build_problem, costs_from, decode, solve_intra_op,
)

# stdlib/hardware.plan: a100 (f32 19.5 TFLOPS), nvlink3 300 GB/s 2 us, infiniband_200g 25 GB/s 5 us
A100 = Device("a100_80g", 80 * 2**30, (("f32", 19.5e12), ("bf16", 312e12)))
NVLINK = Link("nvlink3", 300e9, 2e-6)
IB = Link("infiniband_200g", 25e9, 5e-6)
MESH8 = Mesh("node", A100, (Axis("x", 8, NVLINK),))
MESH2D = Mesh("cluster", A100, (Axis("dp", 4, IB), Axis("tp", 4, NVLINK)))


def S(*dims, partial=()):
    return Spec(tuple(tuple(d) if isinstance(d, (tuple, list)) else ((d,) if d else ()) for d in dims), tuple(partial))


class MLP(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn)  # weight [ffn, hidden]: dim 0 = out features
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x):
        return self.fc2(nn.functional.gelu(self.fc1(x)))


def mlp_graph(batch: int, hidden: int, ffn: int):
    with torch.device("meta"):
        model = MLP(hidden, ffn)
    return op_graph(model, {"x": torch.empty(batch, hidden, device="meta")})


# ------------------------------------------------------------------------------ structure
def test_large_batch_small_hidden_is_data_parallel():
    sol = solve_intra_op(mlp_graph(16384, 64, 256), MESH8)
    assert sol.inputs["x"] == S("x", None)
    for fqn in ("fc1.weight", "fc2.weight"):
        assert sol.params[fqn] == S(None, None)
    assert all(not s.output.partial for s in sol.strategies.values())
    assert sol.result.metrics.reshard == 0


def dp_gradient_sync(graph, mesh, axis: str) -> float:
    """Ring all-reduce of every parameter's gradient over `axis`, once per step (plain DP)."""
    g = group(mesh, [axis])
    return sum(collective_time(Collective.ALL_REDUCE, g, math.prod(v.shape) * 4) for v in graph.params())


def test_data_parallel_gradient_sync_is_charged_once():
    graph = mlp_graph(16384, 64, 256)
    sol = solve_intra_op(graph, MESH8)
    # the only communication of plain data parallelism is one all-reduce per parameter gradient
    assert sol.result.metrics.comm == pytest.approx(dp_gradient_sync(graph, MESH8, "x"))


def test_small_batch_large_hidden_is_megatron_column_then_row():
    graph = mlp_graph(8, 2048, 8192)
    sol = solve_intra_op(graph, MESH8)
    assert sol.params["fc1.weight"] == S("x", None)  # column-parallel: split on out features
    assert sol.params["fc1.bias"] == S("x")
    assert sol.params["fc2.weight"] == S(None, "x")  # row-parallel: split on in features
    assert sol.inputs["x"] == S(None, None)
    assert sol.activations["gelu"] == S(None, "x")
    # one all-reduce in forward: the row-parallel output is a partial sum, reduced once at the end
    assert sol.activations["fc2"] == S(None, None, partial=("x",))
    forward = [c for s in sol.strategies.values() for c in s.forward]
    assert forward == [] and sol.result.metrics.reshard == 0
    # backward: the column-parallel layer would all-reduce its input gradient, but x is a model input
    # and needs none, so the only communication left is the output's all-reduce
    y = graph.values["fc2"]
    reduce_y = collective_time(Collective.ALL_REDUCE, group(MESH8, ["x"]), math.prod(y.shape) * 4)
    assert sol.result.metrics.comm == pytest.approx(reduce_y)


def test_inner_column_parallel_layer_all_reduces_its_input_gradient():
    with torch.device("meta"):
        model = Stack(2, 2048)
    graph = op_graph(model, {"x": torch.empty(8, 2048, device="meta")})
    sol = solve_intra_op(graph, MESH8)
    assert sol.params["h.1.fc1.weight"] == S("x", None) and sol.params["h.1.fc2.weight"] == S(None, "x")
    inner = sol.strategies[next(n.name for n in graph.nodes if n.module == "h.1.fc1")]
    assert [(c.kind, c.axes) for c in inner.backward] == [(Collective.ALL_REDUCE, ("x",))]


def test_slow_axis_data_parallel_fast_axis_tensor_parallel():
    sol = solve_intra_op(mlp_graph(16384, 1024, 4096), MESH2D)
    assert sol.inputs["x"] == S("dp", None)
    assert sol.params["fc1.weight"] == S("tp", None)
    assert sol.params["fc2.weight"] == S(None, "tp")
    assert sol.activations["gelu"] == S("dp", "tp")
    # the weights' gradients are all-reduced over the slow axis only on their tp shard
    dp_grads = [c for s in sol.strategies.values() for c in s.backward if c.axes == ("dp",)]
    assert dp_grads and all(c.size_bytes <= 1024 * 4096 * 4 / 4 for c in dp_grads)


# ------------------------------------------------------------------------------ memory
def test_peak_memory_is_params_grads_states_plus_saved_activations():
    graph = mlp_graph(16384, 64, 256)
    sol = solve_intra_op(graph, MESH8, optimizer="adamw")
    b, h, f, n = 16384 // 8, 64, 256, 4  # local rows, f32
    params = sum(math.prod(v.shape) for v in graph.params()) * (4 + 4 + 2 * 4)  # replicated
    # x (saved by fc1), fc1's output (saved by gelu), gelu's (saved by fc2), fc2's (the output)
    activations = (b * h + b * f + b * f + b * h) * n
    assert sol.result.metrics.peak == params + activations
    assert sol.result.metrics.peak_step == "fc2"


def test_a_tight_budget_shards_the_weights():
    graph = mlp_graph(16384, 64, 256)
    free = solve_intra_op(graph, MESH8)
    least = solve(build_problem(graph, MESH8).instance, "peak").value
    budget = (least + free.result.metrics.peak) / 2
    tight = solve_intra_op(graph, MESH8, budget=budget)
    assert tight.result.metrics.peak <= budget < free.result.metrics.peak
    assert tight.result.metrics.time > free.result.metrics.time
    assert any(spec.used_axes() for spec in tight.params.values())


def test_infeasible_budget_reports_the_smallest_one():
    graph = mlp_graph(8, 2048, 8192)
    with pytest.raises(InfeasibleBudget) as ei:
        solve_intra_op(graph, MESH8, budget=2**20)
    minimum = ei.value.minimum
    assert minimum > 2**20 and "peaks at step" in ei.value.cause
    sol = solve_intra_op(graph, MESH8, budget=minimum * (1 + 1e-6))
    assert sol.result.metrics.peak == pytest.approx(minimum)


def test_memory_objective_removes_redundancy():
    """min-memory-redundancy's objective stores every parameter split (ZeRO-3 style) in the data-
    parallel regime, where the time objective replicates them."""
    graph = mlp_graph(16384, 64, 256)
    fast = solve_intra_op(graph, MESH8, objective="time")
    lean = solve_intra_op(graph, MESH8, objective="memory")
    assert fast.result.metrics.redundancy > 0 and lean.result.metrics.redundancy == 0
    assert all(spec.used_axes() == ["x"] for spec in lean.params.values())
    assert lean.result.metrics.peak < fast.result.metrics.peak
    assert lean.result.metrics.time > fast.result.metrics.time


# ------------------------------------------------------------------------------ user specs
def test_fixed_param_spec_and_data_spec_are_kept():
    graph = mlp_graph(8, 2048, 8192)
    sol = solve_intra_op(graph, MESH8, fixed={"fc1.weight": S(None, "x")}, data={"x": S(None, "x")})
    assert sol.params["fc1.weight"] == S(None, "x") and sol.inputs["x"] == S(None, "x")
    free = solve_intra_op(graph, MESH8)
    assert sol.result.value >= free.result.value


def test_fixed_activation_spec_restricts_its_op():
    sol = solve_intra_op(mlp_graph(16384, 64, 256), MESH8, fixed={"gelu": S(None, "x")})
    assert sol.activations["gelu"] == S(None, "x")


@pytest.mark.parametrize("written", [S("x", None), S(None, "x"), S(None, None)])
@pytest.mark.parametrize("hole_at", [0, 1])
def test_spec_with_a_hole_entry_keeps_the_written_entry(written, hole_at):
    """`shard fc1.weight : [_, ?]`: the ILP chooses among the layouts that keep the written entry."""
    dims = list(written.dims)
    dims[hole_at] = Hole("spec entry")
    spec = Spec(tuple(dims))
    sol = solve_intra_op(mlp_graph(16384, 64, 256), MESH8, fixed={"fc1.weight": spec})
    kept = 1 - hole_at
    assert sol.params["fc1.weight"].axes_of(kept) == written.axes_of(kept)


@pytest.mark.parametrize("fixed, message", [
    ({"fc1.weight": S("x")}, r"fc1.weight: spec \[x\] has 1 entries but the tensor has 2 dims"),
    ({"fc1.weight": S("y", None)}, r"does not fit shape \[8192, 2048\]"),
    ({"fc9.weight": S("x", None)}, "no parameter, input or activation of that name"),
])
def test_bad_user_specs_are_clear_errors(fixed, message):
    with pytest.raises(IntraOpError, match=message):
        build_problem(mlp_graph(8, 2048, 8192), MESH8, fixed=fixed)


def test_mesh_without_throughput_is_a_clear_error():
    with pytest.raises(IntraOpError, match="no device throughput"):
        build_problem(mlp_graph(8, 64, 64), Mesh("m", None, (Axis("x", 2, NVLINK),)))


# ------------------------------------------------------------------------------ repeated blocks
class Stack(nn.Module):
    def __init__(self, n: int, hidden: int) -> None:
        super().__init__()
        self.h = nn.ModuleList(MLP(hidden, 4 * hidden) for _ in range(n))

    def forward(self, x):
        for blk in self.h:
            x = x + blk(x)
        return x


def test_repeated_blocks_share_one_choice():
    with torch.device("meta"):
        model = Stack(3, 512)
    graph = op_graph(model, {"x": torch.empty(64, 512, device="meta")})
    shared = build_problem(graph, MESH8)
    free = build_problem(graph, MESH8, share_blocks=False)
    assert any({shared.refs.get(m, m) for m in g} >= {"h.0.fc1.weight", "h.1.fc1.weight", "h.2.fc1.weight"}
               for g in shared.instance.groups)
    a = decode(shared, solve(shared.instance))
    b = decode(free, solve(free.instance))
    for i in (1, 2):
        assert a.params[f"h.{i}.fc1.weight"] == a.params["h.0.fc1.weight"]
    assert a.result.value >= b.result.value - 1e-12  # sharing restricts ...
    assert a.result.value == pytest.approx(b.result.value, rel=1e-3)  # ... and costs little here
    assert dict(a.result.stats)["classes"] < dict(b.result.stats)["classes"]
    assert block_pattern("h.12.mlp.c_fc.weight") == "h.*.mlp.c_fc.weight"


# ------------------------------------------------------------------------------ pieces
def test_costs_from_one_source_equal_conversion_paths():
    for shape in [(8, 4), (4, 8, 2)]:
        layouts = enumerate_layouts(shape, Mesh("m", None, (Axis("a", 2, IB), Axis("b", 2, NVLINK))))
        mesh = Mesh("m", None, (Axis("a", 2, IB), Axis("b", 2, NVLINK)))
        for src in layouts[::3]:
            reach = costs_from(shape, src, mesh, 4)
            for dst in layouts:
                assert reach[dst][0] == pytest.approx(conversion_path(shape, src, dst, mesh, 4).cost, abs=1e-15)


def test_problem_costs_agree_with_the_cost_model():
    graph = mlp_graph(64, 128, 256)
    prob = build_problem(graph, MESH8)
    inst = prob.instance
    sol = decode(prob, solve(inst))
    m = evaluate(inst, sol.result.choice)
    # recompute resharding from the chosen layouts with conversion_path
    reshard = 0.0
    for e in inst.edges:
        src = prob.output_spec(e.src, sol.result.choice[e.src])
        dst = prob.strategies[e.dst][sol.result.choice[e.dst]].inputs[e.slot]
        reshard += conversion_path(tuple(graph.values[e.src].shape), src, dst, MESH8, 4).cost
    assert m.reshard == pytest.approx(reshard)
    w = graph.values["fc1_weight"]
    k = prob.layouts["fc1_weight"].index(S("x", None))
    assert inst.node("fc1_weight").options[k].memory == local_numel(w.shape, S("x", None), MESH8) * 16


def test_gpt2_block_solves():
    from examples.gpt2.model import build

    with torch.device("meta"):
        model = build(layers=2, hidden=128, heads=4, vocab=512, seq=64)
    graph = op_graph(model, {"idx": torch.zeros(8, 64, dtype=torch.long, device="meta")})
    sol = solve_intra_op(graph, Mesh("m", A100, (Axis("x", 4, NVLINK),)), options=SolveOptions(time_limit=30))
    assert set(sol.params) == {v.ref for v in graph.params()}
    assert sol.result.status == "optimal"
    assert sol.params["h.0.mlp.c_fc.weight"] == sol.params["h.1.mlp.c_fc.weight"]
    assert all(line.startswith("shard ") for line in sol.shard_lines())


def test_a_plans_specs_mesh_and_budget_carry_over():
    """examples/mlp/mlp_2d.plan fixes a Megatron MLP on dp x tp: every spec it writes is kept."""
    from examples.mlp.model import build
    from planlang.plan.resolve import resolve_file
    from planlang.solve.intra_op import problem_args

    plan = resolve_file("examples/mlp/mlp_2d.plan").plan
    with torch.device("meta"):
        model = build(in_features=1024, hidden=4096, out_features=1024)
    graph = op_graph(model, {"x": torch.empty(64, 1024, device="meta")})
    args = problem_args(plan, graph)
    assert args["budget"] == 4 * 2**30 and args["optimizer"] == "adamw" and args["data"]["x"] == S("dp", None)
    assert set(args["fixed"]) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc1", "act", "fc2"}
    sol = solve_intra_op(graph, **args)
    assert sol.params == {"fc1.weight": S("tp", None), "fc1.bias": S("tp"), "fc2.weight": S(None, "tp"),
                          "fc2.bias": S(None)}
    assert sol.activations["fc2"] == S("dp", None, partial=("tp",)) and sol.inputs["x"] == S("dp", None)
    assert sol.shard_lines()[0] == "shard fc1.weight : [tp, _]"


def test_shard_lines_share_a_line_for_agreeing_blocks():
    with torch.device("meta"):
        model = Stack(2, 2048)
    sol = solve_intra_op(op_graph(model, {"x": torch.empty(8, 2048, device="meta")}), MESH8)
    assert "shard h[*].fc1.weight : [x, _]" in sol.shard_lines()


def test_model_size_does_not_grow_with_depth():
    """Repeated blocks share their variables, their edge matrices and (with equal direct terms) their
    memory rows: 4 layers give the LP the same size as 2. The reductions keep the optimum of the plain
    formulation (merge="none": every node a variable, every memory row, no lumped edge variables)
    under a budget that binds."""
    from examples.gpt2.model import build

    mesh = Mesh("m", A100, (Axis("x", 4, NVLINK),))
    sizes = {}
    for layers in (2, 4):
        with torch.device("meta"):
            model = build(layers=layers, hidden=128, heads=4, vocab=512, seq=64)
        graph = op_graph(model, {"idx": torch.zeros(8, 64, dtype=torch.long, device="meta")})
        inst = build_problem(graph, mesh).instance
        assert len({id(e.seconds) for e in inst.edges}) < len(inst.edges) / 2  # priced once per distinct edge
        least = solve(inst, "peak").value
        fast = solve(inst, "time", SolveOptions(merge="exact"))
        inst = inst.with_budget((least + fast.metrics.peak) / 2)
        exact = solve(inst, "time", SolveOptions(merge="exact"))
        plain = solve(inst, "time", SolveOptions(merge="none"))
        assert exact.value > fast.value and exact.metrics.peak <= inst.budget
        assert exact.value == pytest.approx(plain.value, rel=1e-9)
        st = dict(exact.stats)
        sizes[layers] = (st["classes"], st["variables"], st["lp_rows"])
        assert dict(plain.stats)["rows"] == len(graph.nodes) > st["rows"]
    assert sizes[2] == sizes[4], sizes
