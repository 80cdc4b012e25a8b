"""Ground-truth memory cases: hand-written torch equivalents of planlang plans.

Each :class:`Case` is one training configuration (model, batch, world size, strategy). ``to_plan(case)``
writes the planlang plan that says the same thing; ``bench/memory_measure.py`` runs the torch version
(and, for the cases it lists in PLANLANG_CASES, the plan on the planlang runtime) on CPU/gloo ranks and
records the peak live tensor bytes per rank with ``torch.distributed._tools.mem_tracker.MemTracker``.

Strategies (what the torch side does; the plan side says the same):

* ``single``   one process, plain model.
* ``ddp``      ``DistributedDataParallel`` over all ranks; the batch is split over ``dp``.
* ``tp``       ``parallelize_module`` Megatron-style (``ColwiseParallel`` / ``RowwiseParallel``) over a
               1-D ``tp`` mesh, the whole batch on every rank. MLP (fc1/fc2), BERT (the HF BertLayer
               linears; heads split over tp), MoE (every expert's fc1/fc2), T5 (q/k/v/o, wi/wo).
* ``dp_tp``    a ``dp x tp`` mesh: TP as above on the ``tp`` sub-mesh, the batch split over ``dp`` and the
               gradients summed over ``dp`` after backward in one flat all-reduce (DDP does not take the
               DTensor parameters; the planlang runtime's sync_grads does the same).
* ``pp_1f1b`` / ``pp_gpipe``  ``torch.distributed.pipelining``: the model split by hand into
               ``world`` stages (``PipelineStage``), ``Schedule1F1B`` / ``ScheduleGPipe``, stepped with
               ``return_outputs=False`` (a training step needs the losses only, as in the planlang runtime).
* ``ckpt``     one process, ``torch.utils.checkpoint`` (non-reentrant) around every
               ``checkpoint_every`` consecutive blocks.
* ``zero1``    DDP + ``ZeroRedundancyOptimizer`` (AdamW states sharded over all ranks).
"""
from __future__ import annotations

from dataclasses import dataclass

STRATEGIES = ("single", "ddp", "tp", "dp_tp", "pp_1f1b", "pp_gpipe", "ckpt", "zero1")
OPTIMIZERS = ("adamw", "sgd", "momentum")


@dataclass(frozen=True)
class Case:
    name: str
    model: str                       # examples.<model>.model
    model_kwargs: tuple              # ((key, value), ...) passed to build()
    batch: int
    seq: int = 0                     # seq for gpt2/bert/moe, src_len for t5 (tgt_len = seq // 2); unused otherwise
    world: int = 1
    strategy: str = "single"
    microbatches: int = 1
    checkpoint_every: int = 0
    zero: int = 0
    optimizer: str = "adamw"
    tp_layout: str | None = None     # "megatron" for tp / dp_tp (the only layout)
    dp: int = 0                      # dp_tp only: the dp size (tp = world // dp)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}")

    @property
    def kwargs(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.model_kwargs}

    @property
    def dp_size(self) -> int:
        """Ranks the batch is split over."""
        if self.strategy in ("ddp", "zero1"):
            return self.world
        if self.strategy == "dp_tp":
            return self.dp
        return 1

    @property
    def tp_size(self) -> int:
        if self.strategy == "tp":
            return self.world
        if self.strategy == "dp_tp":
            return self.world // self.dp
        return 1


# ------------------------------------------------------------------------------------- models
# small configurations: every case runs in seconds on CPU

MODEL_KWARGS = {
    "mlp": (("in_features", 256), ("hidden", 1024), ("out_features", 256)),
    "gpt2": (("layers", 4), ("hidden", 128), ("heads", 4), ("vocab", 1000), ("seq", 64)),
    "bert": (("layers", 4), ("hidden", 128), ("heads", 4), ("intermediate", 512), ("vocab", 1000),
             ("seq", 64)),
    "t5": (("layers", 2), ("d_model", 128), ("heads", 4), ("d_ff", 512), ("vocab", 1000)),
    "resnet": (("blocks", (1, 1, 1, 1)), ("width", 16), ("num_classes", 10)),
    "moe": (("hidden", 128), ("experts", 4), ("ffn", 256), ("top_k", 2)),
    "ncf": (("users", 100_000), ("items", 10_000), ("factors", 32), ("mlp_layers", (64, 32, 16))),
}
DEFAULT_BATCH = {"mlp": 64, "gpt2": 8, "bert": 8, "t5": 8, "resnet": 16, "moe": 8, "ncf": 256}
DEFAULT_SEQ = {"gpt2": 64, "bert": 64, "t5": 64, "moe": 32}


def plan_inputs(case: Case) -> list[tuple[str, str, list[tuple[str, int]]]]:
    """The model's forward inputs as the plan declares them: (name, dtype, [(dim, size), ...])."""
    kw, b, s = case.kwargs, case.batch, case.seq
    if case.model == "mlp":
        return [("x", "f32", [("batch", b), ("features", kw["in_features"])])]
    if case.model == "gpt2":
        return [("idx", "i64", [("batch", b), ("seq", s)])]
    if case.model == "bert":
        return [("ids", "i64", [("batch", b), ("seq", s)])]
    if case.model == "t5":
        return [("input_ids", "i64", [("batch", b), ("seq", s)]),
                ("decoder_input_ids", "i64", [("batch", b), ("seq", s // 2)])]
    if case.model == "resnet":
        return [("images", "f32", [("batch", b), ("channels", 3), ("height", 32), ("width", 32)])]
    if case.model == "moe":
        return [("x", "f32", [("batch", b), ("seq", s), ("hidden", kw["hidden"])])]
    if case.model == "ncf":
        return [("users", "i64", [("batch", b)]), ("items", "i64", [("batch", b)])]
    raise ValueError(case.model)


def block_path(model: str) -> str:
    """The repeated blocks that `checkpoint ... every K` groups."""
    return {"gpt2": "h[*]", "bert": "encoder.layer[*]"}[model]


def pipeline_stages(case: Case) -> list[list[str]]:
    """The modules of each pipeline stage, as plan paths (the torch split in memory_measure uses the same)."""
    kw, n = case.kwargs, case.world
    if case.model == "mlp":
        if n != 2:
            raise ValueError("mlp pipelines have 2 stages")
        return [["fc1", "act"], ["fc2"]]
    if case.model == "gpt2":
        layers = kw["layers"]
        if layers % n:
            raise ValueError(f"{layers} layers do not split into {n} stages")
        per = layers // n
        stages = []
        for i in range(n):
            mods = [f"h[{i * per}:{(i + 1) * per}]" if per > 1 else f"h[{i * per}]"]
            if i == 0:
                mods = ["wte", "wpe", "drop"] + mods
            if i == n - 1:
                mods = mods + ["ln_f", "lm_head"]
            stages.append(mods)
        return stages
    raise ValueError(f"no pipeline split for {case.model}")


# --------------------------------------------------------------------------------- the cases

def _case(model: str, strategy: str = "single", world: int = 1, *, suffix: str = "", batch: int | None = None,
          seq: int | None = None, **kw) -> Case:
    name = f"{model}_{strategy}" + (f"_{world}" if world > 1 else "") + (f"_{suffix}" if suffix else "")
    if strategy in ("tp", "dp_tp"):
        kw.setdefault("tp_layout", "megatron")
    return Case(name=name, model=model, model_kwargs=MODEL_KWARGS[model],
                batch=DEFAULT_BATCH[model] if batch is None else batch,
                seq=DEFAULT_SEQ.get(model, 0) if seq is None else seq, world=world, strategy=strategy, **kw)


ALL_MODELS = ("mlp", "gpt2", "bert", "t5", "resnet", "moe", "ncf")

CASES: list[Case] = [
    # one process
    *[_case(m) for m in ALL_MODELS],
    _case("mlp", suffix="sgd", optimizer="sgd"),
    _case("gpt2", suffix="momentum", optimizer="momentum"),
    _case("gpt2", suffix="b16", batch=16),
    # data parallel
    *[_case(m, "ddp", 2) for m in ALL_MODELS],
    *[_case(m, "ddp", 4) for m in ("mlp", "gpt2", "resnet", "ncf")],
    # tensor parallel (nn.Linear models)
    *[_case(m, "tp", 2) for m in ("mlp", "bert", "moe", "t5")],
    *[_case(m, "tp", 4) for m in ("mlp", "bert")],
    # 2 x 2: data x tensor parallel
    *[_case(m, "dp_tp", 4, dp=2, suffix="dp2_tp2") for m in ("mlp", "bert")],
    # pipelines
    _case("gpt2", "pp_1f1b", 2, suffix="mb4", microbatches=4),
    _case("gpt2", "pp_gpipe", 2, suffix="mb4", microbatches=4),
    _case("gpt2", "pp_1f1b", 2, suffix="mb8", microbatches=8),
    _case("gpt2", "pp_gpipe", 2, suffix="mb8", microbatches=8),
    _case("mlp", "pp_1f1b", 2, suffix="mb4", microbatches=4),
    _case("mlp", "pp_gpipe", 2, suffix="mb4", microbatches=4),
    _case("gpt2", "pp_1f1b", 4, suffix="mb8", microbatches=8),
    _case("gpt2", "pp_gpipe", 4, suffix="mb8", microbatches=8),
    # activation checkpointing
    _case("gpt2", "ckpt", suffix="every1", checkpoint_every=1),
    _case("gpt2", "ckpt", suffix="every2", checkpoint_every=2),
    _case("bert", "ckpt", suffix="every1", checkpoint_every=1),
    _case("bert", "ckpt", suffix="every2", checkpoint_every=2),
    # ZeRO-1
    *[_case(m, "zero1", 2, zero=1) for m in ("mlp", "gpt2", "bert")],
    _case("gpt2", "zero1", 4, zero=1),
]
CASES_BY_NAME = {c.name: c for c in CASES}
assert len(CASES_BY_NAME) == len(CASES), "case names must be unique"


# ---------------------------------------------------------------------------------- to_plan

def _literal(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return f"{v:_}" if v >= 10_000 else str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_literal(x) for x in v) + "]"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if v is None:
        return "none"
    raise TypeError(v)


_OPT_TEXT = {"adamw": "adamw(lr = 0.001)", "sgd": "sgd(lr = 0.001)", "momentum": "momentum(lr = 0.001, momentum = 0.9)"}


def _tp_lines(case: Case) -> list[str]:
    """The shard statements of the Megatron split that memory_measure applies with parallelize_module."""
    if case.model == "mlp":
        return ["shard fc1.weight : [tp, _]", "shard fc1.bias : [tp]",
                "shard fc2.weight : [_, tp]", "shard fc2.bias : [_]",
                "shard output of fc2 : [_, _] partial(tp)"]
    if case.model == "moe":
        return ["for e in experts[*] {",
                "    shard e.fc1.weight : [tp, _]", "    shard e.fc1.bias : [tp]",
                "    shard e.fc2.weight : [_, tp]", "    shard e.fc2.bias : [_]",
                "    shard output of e.fc2 : [_, _, _] partial(tp)",
                "}"]
    if case.model == "bert":
        return ["for layer in encoder.layer[*] {", "    apply megatron.bert_layer(tp) to layer", "}"]
    if case.model == "t5":
        lines = []
        for stack, attn in (("encoder", ("layer[0].SelfAttention",)),
                            ("decoder", ("layer[0].SelfAttention", "layer[1].EncDecAttention"))):
            ff = "layer[1]" if stack == "encoder" else "layer[2]"
            lines.append(f"for b in {stack}.block[*] {{")
            for a in attn:
                lines += [f"    shard b.{a}.{p}.weight : [tp, _]" for p in "qkv"]
                lines += [f"    shard b.{a}.o.weight : [_, tp]"]
            lines += [f"    shard b.{ff}.DenseReluDense.wi.weight : [tp, _]",
                      f"    shard b.{ff}.DenseReluDense.wo.weight : [_, tp]", "}"]
        return lines
    raise ValueError(f"no tensor-parallel split for {case.model}")


def to_plan(case: Case) -> str:
    """The planlang plan equivalent to ``case`` (checked by tests/bench/test_memory_cases.py)."""
    s = case.strategy
    uses_megatron = s in ("tp", "dp_tp") and case.model == "bert"
    out = [f"# {case.name}: generated by bench/memory_cases.py", "use hardware"]
    if uses_megatron:
        out.append("use patterns.megatron")
    kw = ", ".join(f"{k} = {_literal(v)}" for k, v in case.model_kwargs)
    out.append(f'model m = "examples.{case.model}.model:build"({kw})')
    inputs = plan_inputs(case)
    for name, dtype, dims in inputs:
        out.append(f"input {name} : {dtype}[" + ", ".join(f"{d} = {n}" for d, n in dims) + "]")
    if s in ("single", "ckpt"):
        axes = [("dp", 1)]
    elif s in ("ddp", "zero1"):
        axes = [("dp", case.world)]
    elif s == "tp":
        axes = [("tp", case.world)]
    elif s == "dp_tp":
        axes = [("dp", case.dp), ("tp", case.world // case.dp)]
    else:  # pipelines
        axes = [("pp", case.world)]
    out.append(f"mesh ranks of {case.world} x hardware.cpu {{")
    out += [f"    {a} = {n} over hardware.loopback" for a, n in axes]
    out.append("}")
    out.append("budget 20 GiB per device")
    opt = _OPT_TEXT[case.optimizer]
    if case.zero:
        out.append(f"optimizer {opt} {{ zero = {case.zero} over dp }}")
    else:
        out.append(f"optimizer {opt}")
    if any(a == "dp" for a, _ in axes):
        for name, _, dims in inputs:
            out.append(f"data {name} : [" + ", ".join(["dp"] + ["_"] * (len(dims) - 1)) + "]")
    if s in ("tp", "dp_tp"):
        out += _tp_lines(case)
    if s.startswith("pp_"):
        sched = s.split("_", 1)[1]
        out.append(f"pipeline over pp schedule {sched} microbatches {case.microbatches} {{")
        out += ["    stage " + ", ".join(st) for st in pipeline_stages(case)]
        out.append("}")
    if s == "ckpt":
        out.append(f"checkpoint {block_path(case.model)} every {case.checkpoint_every}")
    return "\n".join(out) + "\n"


if __name__ == "__main__":  # print every plan
    for c in CASES:
        print(to_plan(c))
