"""The solver when memory is tight (issue #29, Build 3): when the seed's defaults do not fit, stage 1 prices
each mesh at its leanest too (every block checkpointed over the most microbatches), and its defaults must
then beat that on step alone; the same plan as pricing every candidate in full (brute force). Pipelines
deeper than the model's layers are not enumerated, and the memory floor of an interleaved candidate is its
rank's (every chunk held at once), still below every priced peak."""
from __future__ import annotations

from planlang.solve import driver
from planlang.solve.pricing import memory_floor
from tests.solve.test_bounds import SMALL_3D, _same

TINY_GPT = '''use hardware
model gpt = "examples.gpt2.model:build"(layers = 2, hidden = 32, heads = 2, vocab = 64, seq = 8)
input idx : i64[batch = 16, seq = 8]
mesh cluster of 8 x hardware.a100_80g {
    pp = ? over hardware.infiniband_200g
    dp = ? over hardware.nvlink3
}
budget 40 GiB per device
optimizer adamw
data idx : [dp, _]
pipeline over pp schedule ? microbatches ? { ? }
'''


def test_a_tight_budget_prices_lean_meshes_in_stage_1_and_matches_brute_force(tmp_path):
    path = tmp_path / "small_3d_tight.plan"
    path.write_text(SMALL_3D.replace("BUDGET", "3 MiB"))  # the seed's defaults peak at 4.8 MiB
    search = driver._Search(str(path), "time", lambda s: None, prune=False)
    res = search.run()
    assert search.tight and res.best.fits
    lean = [c for c in res.tried if "every 1" in str(dict(c.choices)["checkpoint"])]
    assert len({tuple((k, v) for k, v in c.choices if k.startswith("axis")) for c in lean}) > 2  # several meshes
    _same(str(path))  # with bounds: the same plan, the same candidates met


def test_pipelines_deeper_than_the_model_are_not_enumerated(tmp_path):
    path = tmp_path / "tiny_gpt.plan"
    path.write_text(TINY_GPT)
    said: list[str] = []
    search = driver._Search(str(path), "time", said.append, prune=False)
    res = search.run()
    layers = len(search.facts().layers.layers.layers)  # wte, wpe, drop, h.0, h.1, ln_f, lm_head
    assert search.gate.deep is not None and search.gate.deep[1] == layers < 8
    for c in res.tried:
        assert search.space.stage_count(search.space.assign_of(c.choices)) <= layers
    assert any(int(str(dict(c.choices)["axis pp"])) == 4 for c in res.tried)  # 4 stages (8 interleaved): kept
    assert any("never enumerated" in s and f"model's {layers} layers" in s for s in said)


def test_an_interleaved_floor_is_its_ranks_and_below_every_priced_peak(tmp_path):
    path = tmp_path / "tiny_gpt.plan"
    path.write_text(TINY_GPT)
    search = driver._Search(str(path), "time", lambda s: None, prune=False)
    res = search.run()
    inter = [c for c in res.tried if c.plan.pipeline is not None and c.plan.pipeline.schedule.kind == "interleaved"]
    assert inter
    for c in res.tried:
        assert 0 < memory_floor(c.plan, search.facts()) <= c.peak
