"""A plan whose pipeline stages run on degrees of their own (`stage ... with dp = 4, tp = 1`) is estimated
and checked stage by stage (planlang.model.price.stage_meshes, planlang.model.stage_sites), never as if
every stage ran the mesh's sizes.

The plans each stage runs as are written out here as plans of their own (the mesh's sizes the stage's, no
`with`), not derived with planlang.plan.stage_meshes.stage_plan: stage s's row of the heterogeneous plan
must be the row their estimate gives stage s."""
from __future__ import annotations

import pytest

from planlang.model.price.estimate import estimate_plan
from planlang.model.validation import check_with_model
from planlang.plan.checker import check_text
from planlang.plan.complete import complete

MEMORY = ("parameters", "gradients", "optimizer", "buffers", "activations", "transient", "peak")


def _text(mesh: tuple[int, int], withs: tuple[str, str] = ("", ""), hidden: int = 64, heads: int = 4) -> str:
    dp, tp = mesh
    return f"""use hardware
use patterns.megatron
model gpt = "examples.gpt2.model:build"(layers = 4, hidden = {hidden}, heads = {heads}, vocab = 128, seq = 16)
input idx : i64[batch = 16, seq = 16]
mesh ranks of {2 * dp * tp} x hardware.cpu {{
    pp = 2 over hardware.loopback
    dp = {dp} over hardware.loopback
    tp = {tp} over hardware.loopback
}}
optimizer adamw(lr = 0.001) {{
    zero = 1 over dp
}}
data idx : [dp, _]
pipeline over pp schedule 1f1b microbatches 2 {{
    stage wte, wpe, drop, h[0:2]{withs[0]}
    stage h[2:4], ln_f, lm_head{withs[1]}
}}
for block in h[*] {{
    apply megatron.attention(tp) to block.attn
    apply megatron.mlp(tp) to block.mlp
}}
"""


def _plan(text: str):
    res = check_text(text, "stage_meshes.plan")
    assert not res.errors, [str(d) for d in res.diagnostics]
    return complete(res.plan)


# (stage 0's, stage 1's) (dp, tp): the lead's two 8-rank plans (tests/runtime/plans/gpt2_pp2_hetero*.plan)
CASES = [((4, 1), (2, 2)), ((2, 2), (4, 1))]


@pytest.fixture(scope="module", params=CASES, ids=["dp4-then-dp2xtp2", "dp2xtp2-then-dp4"])
def estimated(request):
    first, second = request.param
    withs = tuple("" if sizes == (2, 2) else f" with dp = {sizes[0]}, tp = {sizes[1]}" for sizes in (first, second))
    plan = _plan(_text((2, 2), withs))  # the mesh is dp 2 x tp 2
    own = [estimate_plan(_plan(_text(sizes))) for sizes in (first, second)]
    return first, second, estimate_plan(plan), own, plan


def test_each_stage_row_is_its_own_plans_row(estimated):
    first, second, het, own, _ = estimated
    assert len(het) == 2
    for s in range(2):
        assert [getattr(het[s], k) for k in MEMORY] == [getattr(own[s][s], k) for k in MEMORY], s
    # the stage on dp 4 holds its blocks whole, the one on dp 2 x tp 2 half of each block's weights
    whole = 0 if first == (4, 1) else 1
    assert het[whole].parameters > het[1 - whole].parameters


def test_each_stage_priced_on_its_own_degrees(estimated):
    """Each stage's forward and backward of a microbatch are its own plan's; the stage on tp 2 that
    receives from (or sends to) a stage on dp 4 adds the row conversion's all-gather over tp (forward when it
    receives, backward when it sends); the stage on dp 4 runs no tensor-parallel collective at all."""
    first, second, het, own, _ = estimated
    sched = het[0].schedule
    assert sched is not None
    for s, sizes in enumerate((first, second)):
        mine = own[s][s].schedule
        assert mine is not None
        if sizes == (4, 1):
            assert (sched.forward[s], sched.backward[s]) == (mine.forward[s], mine.backward[s])
            assert het[s].step is not None and het[s].step.tensor == 0.0
        elif s == 1:  # receives: gathers its replica's rows in each forward
            assert sched.forward[s] > mine.forward[s] and sched.backward[s] == mine.backward[s]
        else:  # sends: gathers its output's gradient in each backward
            assert sched.backward[s] > mine.backward[s] and sched.forward[s] == mine.forward[s]
    # against the plan of the mesh's sizes for both stages, the stage on dp 4 runs without the in-line
    # tensor-parallel collectives that plan gives it
    mesh_plan = own[0] if first == (2, 2) else own[1]
    s = 0 if first == (4, 1) else 1
    assert mesh_plan[s].step is not None and het[s].step is not None
    assert het[s].step.tensor < mesh_plan[s].step.tensor


def test_check_model_flags_a_dim_only_a_stages_degrees_do_not_divide(tmp_path):
    """hidden 6, 2 heads: every weight the Megatron patterns split divides by the mesh's tp 2, but c_attn's
    output dim (3 x 6 = 18) does not by stage 0's tp 4; the diagnostic says which stage and its sizes."""
    het = tmp_path / "het.plan"
    het.write_text(_text((2, 2), (" with dp = 1, tp = 4", ""), hidden=6, heads=2))
    homo = tmp_path / "homo.plan"
    homo.write_text(_text((2, 2), hidden=6, heads=2))
    assert not [d for d in check_with_model(str(homo)).diagnostics if d.code in ("PL362", "PL365")]
    got = [d for d in check_with_model(str(het)).diagnostics if d.code == "PL362"]
    assert got and all(d.message.startswith("in stage 0 (dp = 1, tp = 4): ") for d in got), \
        [d.message for d in got]
    assert any("h[0]" in d.message or "h[1]" in d.message for d in got)
    assert not any("h[2]" in d.message or "h[3]" in d.message for d in got)  # stage 1 runs on tp 2


def test_the_solvers_steps_are_the_estimates(estimated):
    """The solver's step from the profile alone (estimate_steps) with each shape's lowered program is the
    estimate's; without the programs it is a lower bound."""
    from planlang.model.price.estimate import estimate_steps
    from planlang.model.price.stage_meshes import shape_plans
    from planlang.model.price.step_time import lowered_traffic

    *_, het, _, plan = estimated
    inputs = estimate_steps(plan)
    assert inputs is not None
    lowered = {sizes: lowered_traffic(sp) for sizes, sp in shape_plans(plan).items()}
    assert [st.total for st in inputs.steps(plan, lowered)] == [r.step_time for r in het]
    assert all(b.total <= r.step_time for b, r in zip(inputs.lower_bound(plan), het))
