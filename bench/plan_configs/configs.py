"""The papers' model configurations that bench/plan_quality.py compares plans on.

Each :class:`Config` is one model on one cluster, taken from a table of a paper in shared/papers/:

* min-memory-redundancy-ilp §4.2, Table 1: ONE Transformer encoder layer (BERT-Large, 1.7B, 3.6B, 7.5B
  hyper-parameters: batch, hidden, seq, heads) on 2, 4 and 8 A100s ("eight A100 GPUs", §4.1). The paper's
  peak memories reach 43.8 GB, so these are the 80 GB parts. Table 2 gives its own plan's memory relative
  to Megatron-LM's (`paper_ratio`).
* map-memory-aware-auto-parallel §7, Table 3: GPT-2 with 4 layers and sequence 1024, hidden 2048 / 4096 /
  8192 / 16384 on 1 / 2 / 4 / 8 A100 80GB, where "only 4 pairs of adjacent GPUs are connected via NVLink,
  others are connected via PCI-e" (so PCIe 4 links beyond 2 devices). The table gives no batch size or
  head count: batch 32 in 4 microbatches and 128-wide heads (GPT-3's head size) are this bench's choices.
  Table 4's PFLOPS give Megatron's step time relative to map's (`paper_ratio`, step).
* capture-memory-centric-partitioning §IV, Table I: GPT-3 2.6B and 6.7B (32 layers, batch 1024, 64 and 32
  microbatches) on 4 nodes of 4 A100 40GB joined by 100 Gb/s InfiniBand. Hidden sizes, heads, vocabulary
  (51200) and sequence (1024) are those of Alpa's GPT-3 benchmark suite that the paper ran; our GPT-2
  factory's untied head adds vocab x hidden parameters (2.78B and 6.86B in all). Table I's MoE and
  Wide-ResNet rows are not covered (see plan_quality.py's header).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """How plans address one kind of model: its factory, input, blocks and Megatron layout."""
    name: str
    factory: str
    blocks: str  # the container of repeated blocks, as a plan path ("h", "layer")
    before: tuple[str, ...]  # top-level modules before the blocks (the first pipeline stage's)
    after: tuple[str, ...]  # top-level modules after the blocks (the last stage's)


GPT = Family("gpt", "examples.gpt2.model:build", "h", ("wte", "wpe", "drop"), ("ln_f", "lm_head"))
ENCODER = Family("encoder", "bench.plan_configs.models:encoder_layers", "layer", (), ())


@dataclass(frozen=True)
class Config:
    paper: str  # "<paper file stem> <table>"
    label: str  # the table's row name
    family: Family
    layers: int
    hidden: int
    heads: int
    seq: int
    batch: int
    devices: int
    device: str  # a device of stdlib/hardware.plan
    budget_gib: int
    links: tuple[tuple[str, str], ...]  # (axis, link of stdlib/hardware.plan) for pp, dp, tp
    vocab: int = 50257
    microbatches: int | None = None  # every plan's microbatch count (None: no pipeline block at all)
    quick: bool = False  # in `--quick`
    paper_ratio: tuple[str, float] | None = None  # ("peak" | "step", the paper's own plan / Megatron-LM)

    @property
    def slug(self) -> str:
        name = "".join(c if c.isalnum() else "_" for c in self.label.lower())
        return f"{self.paper.split()[0].split('-')[0]}_{name}_{self.devices}dev"

    @property
    def title(self) -> str:
        model = (f"{self.layers} layer{'s' if self.layers > 1 else ''}, hidden {self.hidden}, {self.heads} heads, "
                 f"seq {self.seq}, batch {self.batch}")
        if self.microbatches:
            model += f" in {self.microbatches} microbatches"
        return f"{self.paper}: {self.label} ({model}) on {self.devices} x {self.device}, budget {self.budget_gib} GiB"

    def link(self, axis: str) -> str:
        return dict(self.links)[axis]

    def model_args(self) -> str:
        if self.family is GPT:
            return (f"layers = {self.layers}, hidden = {self.hidden}, heads = {self.heads}, vocab = {self.vocab}, "
                    f"seq = {self.seq}")
        return f"layers = {self.layers}, hidden = {self.hidden}, heads = {self.heads}"


def _same(link: str) -> tuple[tuple[str, str], ...]:
    return tuple((a, link) for a in ("pp", "dp", "tp"))


# min-memory-redundancy-ilp Table 1 (batch, hidden, seq, heads) and Table 2's "Relative MLM" column
_MMR = [("BERT-Large", 2, 1024, 512, 16), ("1.7B", 16, 2304, 2048, 24), ("3.6B", 16, 3072, 2048, 24),
        ("7.5B", 16, 4096, 2048, 32)]
_MMR_RATIO = {("BERT-Large", 2): 0.86, ("1.7B", 2): 0.73, ("3.6B", 2): 0.70, ("7.5B", 2): 0.54,
              ("BERT-Large", 4): 0.68, ("1.7B", 4): 0.34, ("3.6B", 4): 0.33, ("7.5B", 4): 0.42,
              ("BERT-Large", 8): 0.64, ("1.7B", 8): 0.71, ("3.6B", 8): 0.66, ("7.5B", 8): 0.63}

MMR = [Config("min-memory-redundancy-ilp Table 1", name, ENCODER, 1, hidden, heads, seq, batch, n, "a100_80g", 80,
              _same("nvlink3"), quick=(name, n) == ("BERT-Large", 2), paper_ratio=("peak", _MMR_RATIO[name, n]))
       for n in (2, 4, 8) for name, batch, hidden, seq, heads in _MMR]

# map Table 3 (experiment, GPUs, hidden); Table 4's PFLOPS (Megatron, map) turned into map's step / Megatron's
_MAP = [("alpha", 1, 2048, (0.161, 0.161)), ("beta", 2, 4096, (0.324, 0.332)), ("gamma", 4, 8192, (0.528, 0.604)),
        ("delta", 8, 16384, (0.728, 0.824))]
MAP = [Config("map-memory-aware-auto-parallel Table 3", name, GPT, 4, hidden, hidden // 128, 1024, 32, n, "a100_80g",
              80, _same("nvlink3" if n <= 2 else "pcie4"), microbatches=4, quick=name == "beta",
              paper_ratio=("step", round(mlm / ours, 3)))
       for name, n, hidden, (mlm, ours) in _MAP]

# capture Table I, GPT-3 rows (Alpa's suite: 2.6B hidden 2560, 6.7B hidden 4096; 32 layers, 32 heads)
_IB = (("pp", "infiniband_100g"), ("dp", "infiniband_100g"), ("tp", "nvlink3"))
CAPTURE = [Config("capture-memory-centric-partitioning Table I", name, GPT, 32, hidden, 32, 1024, 1024, 16,
                  "a100_40g", 40, _IB, vocab=51200, microbatches=micro)
           for name, hidden, micro in (("GPT-3 2.6B", 2560, 64), ("GPT-3 6.7B", 4096, 32))]

CONFIGS = MMR + MAP + CAPTURE
