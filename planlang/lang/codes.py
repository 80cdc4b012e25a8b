"""The table of diagnostic codes: stable ids, default severity, a title and an explanation.

Ranges: PL1xx syntax · PL2xx names, values and units · PL3xx mesh and sharding specs ·
PL4xx pipeline and checkpointing · PL5xx memory and optimizer. Within each range, x60–x89 are reserved
for the model-aware rules (module paths, tensor shapes, stage coverage, estimated memory) that
`planlang.model.checks` runs. Their entries live in this table too, like every other code: the table
is plain data, complete on import, so `planlang explain`, the docs and the SARIF rules know every code
without importing the model layer (or torch).

`docs/diagnostics.md` is generated from this table (`python scripts/gen_diagnostics_doc.py`) and a test
keeps the two in sync; `planlang explain CODE` prints an entry.
"""
from __future__ import annotations


from .frozen import value_type
from .diagnostics import Severity

E, W, N = Severity.ERROR, Severity.WARNING, Severity.NOTE

#: Where planlang lives; links into its docs (e.g. SARIF rules' `helpUri`) are built from this.
REPOSITORY_URL = "https://github.com/planlang/planlang"
#: The generated reference of every code, relative to the repository root.
DIAGNOSTICS_DOC = "docs/diagnostics.md"


@value_type
class Code:
    code: str
    name: str
    severity: Severity
    title: str
    explanation: str

    def __str__(self) -> str:
        return f"{self.code} {self.name}"

    @property
    def model_aware(self) -> bool:
        """In a model-aware slot (x60–x89): reported only when the plan is checked against its model."""
        return 60 <= int(self.code[3:]) <= 89

    @property
    def explanation_text(self) -> str:
        """The explanation as one paragraph (the table wraps it at about 100 columns)."""
        return " ".join(line.strip() for line in self.explanation.splitlines()).strip()

    @property
    def anchor(self) -> str:
        """The fragment of this code's heading (`### PL301`) in docs/diagnostics.md, as GitHub renders it."""
        return self.code.lower()

    @property
    def doc_url(self) -> str:
        """This code's entry in docs/diagnostics.md on the repository's default branch."""
        return f"{REPOSITORY_URL}/blob/main/{DIAGNOSTICS_DOC}#{self.anchor}"


_ENTRIES: list[tuple[str, str, Severity, str, str]] = [
    # ------------------------------------------------------------------ PL1xx syntax
    ("PL101", "unexpected-token", E, "unexpected token",
     "The parser met a word or symbol that cannot stand there. The message lists what would have been\n"
     "accepted. Common causes: two block items on one line (separate them with a newline or `;`), `=`\n"
     "where a spec needs `:` (`shard w : [_, tp]`), or a missing keyword (`mesh c of dev { ... }`)."),
    ("PL102", "unexpected-character", E, "unexpected character",
     "A character that is not part of the language (for example `@`, `$`, `'` or `-`). Strings use\n"
     "double quotes; numbers are never negative. Put free text in a `#` comment."),
    ("PL103", "unterminated-string", E, "unterminated string",
     "A string opened with `\"` is not closed on the same line. Strings cannot span lines."),
    ("PL104", "unexpected-eof", E, "unexpected end of file",
     "The file ends inside a statement, usually because a `{`, `(` or `[` is never closed. The\n"
     "diagnostic points at the opening bracket. A bracket left open before a line that starts no deeper\n"
     "than the bracket's own line (the next statement, or the next `stage`) is reported the same way,\n"
     "once, and checking goes on from that line."),
    ("PL105", "not-utf8", E, "the file is not UTF-8 text",
     "Plans are UTF-8 text. The diagnostic points at the first byte that is not valid UTF-8 (shown as\n"
     "U+FFFD); the file is not checked further. Save it as UTF-8 (most editors: \"Save with encoding\")."),
    ("PL106", "nesting-too-deep", E, "brackets nested too deeply",
     "At most 64 brackets (`{`, `(`, `[`, counted together) may be open at once. Plans nest a few\n"
     "levels; a deeper nest is a generated or damaged file, and checking it would exhaust the checker's\n"
     "stack. The diagnostic points at the first bracket past the limit; the file is not checked further."),
    ("PL107", "number-too-long", E, "a number has too many digits",
     "A number literal has at most 100 digits. Every count, size and quantity in a plan is far smaller\n"
     "(quantities stay below 1e30 base units, PL223), so a longer literal is a typo or a damaged file.\n"
     "The file is not checked further."),
    # ------------------------------------------------------------------ PL2xx names and values
    ("PL201", "unknown-axis", E, "unknown mesh axis",
     "A spec, data spec, pipeline, optimizer or stage names an axis the mesh does not declare.\n"
     "Example: `mesh m of dev { dp = 2 }` then `shard w : [tp]`. Declare the axis or fix the name;\n"
     "the diagnostic suggests the closest declared axis."),
    ("PL202", "unknown-name", E, "unknown device, link or mesh",
     "A reference such as `hardware.a100_80g` or `hardware.nvlink3` names nothing visible: check the\n"
     "spelling and that the module is brought in with `use`."),
    ("PL203", "unknown-module", E, "module not found",
     "`use a.b` looks for `a/b.plan` in the standard library (stdlib/) and then next to the plan;\n"
     "`use \"file.plan\"` is relative to the plan's folder. Neither place has the file."),
    ("PL204", "use-cycle", E, "cyclic use",
     "Two or more files `use` each other. Modules are declarations only; move the shared declarations\n"
     "into a third module that both use."),
    ("PL205", "unknown-template", E, "unknown template",
     "`apply T(...)` names a template that is not declared in the file or in a used module."),
    ("PL206", "template-arity", E, "wrong number of template arguments",
     "A template was applied with more or fewer arguments than it declares parameters."),
    ("PL207", "template-argument-kind", E, "template argument of the wrong kind",
     "Each template parameter has a kind: `axis` takes an axis name (or `?`), `int` takes a whole\n"
     "number (or `?`). Example: `template mlp(tp: axis)` applied as `apply mlp(2) to h[0].mlp`."),
    ("PL208", "unknown-parameter-kind", E, "unknown template parameter kind",
     "Template parameters are declared `name: axis` or `name: int`."),
    ("PL209", "duplicate-declaration", E, "declared twice",
     "A name is declared twice in the same scope: an axis in a mesh, a device, link, mesh or template\n"
     "in a file, an input, a dim of an input, a field of a block, a `use` alias, or a template\n"
     "parameter. Remove or rename one of them."),
    ("PL210", "duplicate-statement", E, "statement may appear once",
     "A plan has at most one `model`, `mesh`, `budget`, `optimizer` and `pipeline`. The second one\n"
     "is reported; the first one is used."),
    ("PL211", "unknown-input", E, "unknown input",
     "`data NAME : [...]` names an input that no `input` statement declares."),
    ("PL212", "unknown-field", E, "unknown field",
     "A device block takes `memory`, `flops.<dtype>`, `memory_bandwidth` and `backend`; a link block\n"
     "takes `bandwidth` and `latency`; an optimizer block takes `zero`. Other fields are typos or\n"
     "unsupported."),
    ("PL213", "missing-field", E, "required field missing",
     "A device needs `memory`; a link needs `bandwidth` (its `latency` defaults to 0)."),
    ("PL214", "unknown-dtype", E, "unknown dtype",
     "Dtypes are written f64, f32, tf32, f16, bf16, fp8, i64, i32, i16, i8, u8 and bool (the long\n"
     "forms float32, bfloat16, int64, ... are accepted too)."),
    ("PL215", "unknown-schedule", E, "unknown pipeline schedule",
     "Pipeline schedules are `gpipe`, `1f1b`, `interleaved chunks N`, `looped_bfs chunks N`, `zero_bubble`\n"
     "(or `zero_bubble chunks N`) and the V schedules `zbv chunks 2` and `dualpipev chunks 2`, or `?`."),
    ("PL216", "unknown-optimizer", E, "unknown optimizer",
     "Known optimizers: sgd, momentum, adam, adamw, adagrad, rmsprop, adafactor, lion. The optimizer\n"
     "decides how many state bytes each parameter carries."),
    ("PL217", "not-a-declaration", E, "statement has no effect in a used module",
     "A module brought in with `use` may only declare devices, links, meshes and templates (and use\n"
     "other modules). Statements that configure a plan (model, shard, pipeline, ...) belong in the\n"
     "plan itself."),
    ("PL218", "unused-use", W, "unused use",
     "A module is brought in with `use` but nothing from it is referenced. Remove the line."),
    ("PL219", "template-recursion", E, "template applies itself",
     "Template expansion does not terminate: a template applies itself, directly or through others."),
    ("PL220", "loop-variable", E, "loop variable used with selectors",
     "Inside `for b in h[*] { ... }`, `b` stands for one selected module; write `b.attn`, not `b[0]`."),
    ("PL221", "invalid-value", E, "value of the wrong kind",
     "A field or argument got a value of the wrong kind, for example a string for `memory` or a\n"
     "quantity where a plain number is expected."),
    ("PL223", "quantity-out-of-range", E, "a quantity is zero or too large",
     "Memory, bandwidth, latency and throughput must be more than zero (a zero bandwidth would divide by\n"
     "zero when collectives are priced) and below 1e30 base units (bytes, B/s, seconds, FLOP/s): a\n"
     "number that large is a typo, and it would overflow the estimator's arithmetic."),
    ("PL222", "use-outside-project", E, "`use` reaches outside the plan's folders",
     "A plan may `use` the standard library, `.plan` files in its own folder and below, and files in\n"
     "the folders named by `use-paths` in planlang.toml (or `[tool.planlang]` of pyproject.toml). A\n"
     "target anywhere else (an absolute path, `../..`, a link out of the folder) or a file that is not a\n"
     "`.plan` file is refused before it is read, so a plan cannot show the content of other files."),
    ("PL224", "expansion-too-large", E, "templates expand to too many applications",
     "Templates applied inside templates multiply: one that applies another twice, which applies a\n"
     "third twice, and so on, doubles at every level. A plan may make at most 100,000 template\n"
     "applications, plus 100 for each `apply` written in it and the files it uses (so a big plan's\n"
     "budget grows with its text). The diagnostic points at the outermost `apply` (or `for`) of the\n"
     "expansion, and the expansion stops there. Apply fewer templates per level, or flatten the chain."),
    ("PL225", "bidi-control", W, "bidirectional control character",
     "The file holds a Unicode bidirectional control (U+202A-U+202E, U+2066-U+2069). Editors and\n"
     "review tools reorder the text around it, so what is shown is not what planlang reads: a comment\n"
     "can seem to end where it does not, or a name can seem to be another (\"Trojan Source\",\n"
     "CVE-2021-42574). planlang shows it escaped (`\\u202e`). Remove it; plans have no right-to-left text\n"
     "that needs one."),
    ("PL226", "template-nesting-too-deep", E, "templates and `for` loops nest too deep",
     "Templates applied inside templates, and `for` loops inside them, nest more than 256 levels deep\n"
     "(the resolver expands one level inside the last, so a limit keeps it well inside Python's stack).\n"
     "The expansion is finite (a template that applies itself is PL219): the message names the depth\n"
     "and the templates being expanded there. Flatten the chain: apply the inner templates side by side."),
    ("PL250", "unknown-unit", E, "unknown unit",
     "Units: memory B, KB, MB, GB, TB, PB, KiB, MiB, GiB, TiB, PiB; bandwidth B/s, GB/s, GiB/s, Gb/s, Gbps;\n"
     "time ns, us, ms, s; throughput GFLOPS, TFLOPS, PFLOPS. Units are case-sensitive (GiB, not gib)."),
    ("PL251", "wrong-unit-kind", E, "unit of the wrong kind",
     "The unit measures something else than the field: `budget 40 GB/s` is a bandwidth, not memory;\n"
     "`latency = 5 GB` is memory, not time."),
    ("PL252", "missing-unit", E, "missing unit",
     "Memory, bandwidth, time and throughput need a unit: `budget 40 GiB`, `bandwidth = 300 GB/s`."),
    ("PL253", "decimal-memory-unit", N, "decimal memory unit",
     "GB means 10^9 bytes and GiB 2^30 bytes (7% more). Accelerator memory is sold in GiB: an\n"
     "\"80 GB\" A100 has 80 GiB. This note reminds you which one you wrote; suppress it if you meant it."),
    # model-aware (planlang.model.checks)
    ("PL260", "model-import", E, "model cannot be imported",
     "The `model` statement's factory (\"package.module:callable\") cannot be imported. planlang looks on\n"
     "sys.path, then in the plan's folder and the folders above it, then the current directory."),
    ("PL261", "model-build", E, "model factory failed",
     "Calling the factory with the plan's arguments (on the meta device) raised an error, or returned\n"
     "something that is not an nn.Module; or running the model on the declared inputs raised one. Meta\n"
     "tensors hold no values: a model whose code reads one (`if x.sum() > 0:`, `.item()`) is run again\n"
     "as a trace, where `torch.compiler.is_compiling()` is True, then on fake tensors; when it reads one\n"
     "in every way, the message names the line. Make that code depend on shapes only, or skip it with\n"
     "`if not torch.compiler.is_compiling(): ...`."),
    # ------------------------------------------------------------------ PL3xx mesh and specs
    ("PL301", "mesh-size-mismatch", E, "mesh axes do not multiply to the device count",
     "With `mesh m of N x device { ... }`, the axis sizes must multiply to N. The message shows the\n"
     "product. Change a size, or write `?` and let `planlang solve` choose."),
    ("PL302", "axis-size-invalid", E, "axis size must be at least 1", "A mesh axis of size 0 holds no devices."),
    ("PL303", "axis-repeated", E, "axis used twice in one spec",
     "A spec may name each mesh axis once: `[tp, tp]` would split two dims over the same devices.\n"
     "Use a tuple to split one dim over several axes: `[(dp, tp), _]`."),
    ("PL304", "mesh-holes-need-count", E, "mesh with holes needs a device count",
     "`pp = ?` can only be solved when the number of devices is known: write\n"
     "`mesh m of 8 x device { ... }`."),
    ("PL305", "batch-not-divisible", E, "input dim not divisible by its axes and microbatches",
     "A data-parallel input dim is split over its axes, and the batch dim further into microbatches\n"
     "when the step runs several (a pipeline's `microbatches`, or a top-level `microbatches N`: gradient\n"
     "accumulation). The dim must divide evenly: the message shows the arithmetic, e.g.\n"
     "`batch 30 is not divisible by dp(4) * microbatches(2) = 8`, and a label points at the statement\n"
     "that sets the microbatches. Change the batch, the axes or the microbatches."),
    ("PL306", "spec-rank", E, "spec has the wrong number of entries",
     "A data spec needs one entry per dim of the input (`_` for a dim that is not split)."),
    ("PL307", "partial-not-allowed", E, "partial placement on a parameter or input",
     "`partial(axis)` says a value is an unreduced sum over an axis; only activations (`output of`,\n"
     "`input of`) can be partial. Parameters and inputs are sharded or replicated."),
    ("PL308", "pipeline-axis-in-spec", E, "pipeline axis used in a spec",
     "The pipeline axis separates stages; a tensor cannot also be split over it. Use another axis."),
    ("PL309", "axis-without-link", W, "axis has no link",
     "Without `over LINK` the cost model cannot price collectives on this axis. Name a link from\n"
     "stdlib/hardware.plan or one measured by `planlang probe`."),
    ("PL310", "conflicting-shard", E, "same target sharded twice",
     "Two shard statements name the same target with different specs, or two data statements give the\n"
     "same input different specs. Keep one. With the model (`check --model`), patterns are resolved\n"
     "against its real names: `shard fc*.weight : [tp, _]` and `shard fc2.weight : [_, tp]` both shard\n"
     "`fc2.weight`, and no statement takes precedence, so the later is reported, naming both and the\n"
     "parameters. Write the pattern as the names that need its spec, or give both the same spec."),
    ("PL311", "no-mesh", E, "no mesh declared",
     "The plan shards, splits data or pipelines over axes but declares no mesh."),
    ("PL312", "mesh-count-indivisible", E, "device count not divisible by the fixed axis sizes",
     "With holes in the mesh, the fixed sizes must divide the device count so the holes can be filled."),
    ("PL313", "batch-split-conflict", E, "inputs split their batch over different axes",
     "Every input's batch dim (the dim named `batch`, else the first) must be split over the same mesh\n"
     "axes: they are the plan's data axes, over which gradients are summed and ZeRO shards. Example:\n"
     "`data x : [dp, _]` and `data y : [tp]`. Split both over `dp`."),
    # model-aware (planlang.model.checks)
    ("PL360", "unknown-module-path", E, "path names nothing in the model",
     "A shard, stage or checkpoint path matches no module or parameter of the model. The diagnostic\n"
     "suggests the closest real name; `planlang inspect` lists them all."),
    ("PL361", "spec-rank-mismatch", E, "spec has the wrong number of entries for the tensor",
     "A spec needs one entry per dim of the tensor it shards (parameter, or the activation a module\n"
     "returns or receives)."),
    ("PL362", "dim-not-divisible", E, "sharded dim not divisible by its axes",
     "Every dim split over mesh axes must be divisible by the product of their sizes; the message shows\n"
     "the tensor, the dim and the arithmetic (`3072 is not divisible by tp(5) = 5`). An activation's\n"
     "batch dim is split over the data axes too, whether its spec names them or not: under\n"
     "`data x : [dp, _]` the spec `[tp, _]` is laid out as `[(dp, tp), _]`, so the batch must divide by\n"
     "dp * tp."),
    ("PL363", "shard-target-is-module", E, "shard target is a module, not a parameter",
     "`shard PATH : SPEC` shards parameters; PATH matched modules only. Name the parameters\n"
     "(`fc1.weight`), or shard the module's activation with `output of PATH`."),
    ("PL364", "batch-gathered", W, "an op runs on the whole batch under data parallelism",
     "An op of the model has no sharding rule and is not known to act on each sample alone, so the\n"
     "runtime runs it on the whole batch: its inputs are gathered over the data axes and it is repeated\n"
     "on every rank there, which costs the bytes and the compute the message names, and the memory of\n"
     "whole activations. `planlang lower` marks the line. `check --fail-on-warnings` and\n"
     "`lower/verify/run --strict` turn it into an error. Rewrite the op with one planlang has a rule for,\n"
     "or report it: planlang/cost/ops/per_sample.py lists the opaque calls run per sample."),
    ("PL365", "heads-not-divisible", W, "an attention split cuts through its heads",
     "A shard splits the weights of an attention module (or its activations' features) over axes whose\n"
     "size does not divide the module's number of heads (or key/value heads): some rank would hold part\n"
     "of a head. Megatron's split (stdlib/patterns/megatron.plan) requires the heads to divide evenly,\n"
     "so that each rank runs attention for whole heads of its own. planlang still runs such a plan\n"
     "correctly, because the lowering gathers the features before the heads are formed, but that\n"
     "costs the communication and memory the split was meant to save. Use a tensor-parallel size that\n"
     "divides the heads, or a model with a multiple of it."),
    ("PL366", "weight-gathered", W, "a sharded parameter is gathered every step",
     "The plan splits a parameter, but the op of the model that reads it has no strategy for that layout\n"
     "(a fused gate/up weight cut in two by `split`/`chunk`; a weight read by an op with no sharding rule),\n"
     "so the lowered program all-gathers it back to whole (or moves it to another split) before the op in\n"
     "every step: the collective the split was meant to save runs anyway, and every rank holds the whole\n"
     "weight while the op runs. The message names the parameter, the op and the bytes per rank per step;\n"
     "`planlang lower` shows the conversion. Shard it so that the op has a strategy (split a dim the op\n"
     "keeps whole), write the op as ops planlang has rules for when it has none (or report it), or leave\n"
     "the parameter replicated."),
    ("PL367", "op-replicated", W, "an op runs whole over tensor-parallel axes",
     "An op of the model has no sharding rule (an opaque call: attention whose mask is a tensor of the step,\n"
     "such as T5's learned position bias, is one, as is any call planlang has no rule for), and its\n"
     "activation inputs arrive split over axes that\n"
     "are not data axes (tensor parallelism): the lowered program gathers them over those axes and every\n"
     "device there runs the whole op, repeating its compute and holding its whole inputs and output. The\n"
     "message names the op, the axes and the bytes one rank receives per step; `planlang lower` shows the\n"
     "gathers. Write the op as ops planlang has rules for (an additive bias as an `add` before a softmax),\n"
     "keep its inputs whole over those axes in the plan, or report it. The batch stays split: an op gathered\n"
     "over the data axes is PL364."),
    ("PL368", "model-exited", E, "the model's code exited the process",
     "The model's factory (or its module while imported, or its forward while probed) called `sys.exit`,\n"
     "`exit` or `os._exit` instead of returning. planlang stops the exit and reports it: had the process\n"
     "ended there, `check --model` would have exited with that status and no output, and a CI gate would\n"
     "pass having checked nothing. Return the model; keep a script's entry point under\n"
     "`if __name__ == \"__main__\":` and raise an exception for a bad argument."),
    ("PL369", "plan-not-lowerable", E, "the plan cannot be lowered",
     "`check --model` lowers the plan as `planlang.apply` does on every rank (`lower`, `verify` and `run`\n"
     "too), and the lowering failed: an op of the model has no strategy for the layouts the plan gives its\n"
     "inputs, or shapes its rule does not accept, or the model has a construct the op graph does not\n"
     "take, or the loss accepts none of the targets planlang makes (or reads a tensor's value on each,\n"
     "which the message says, with the line), or the lowered program's memory\n"
     "cannot be estimated (so the budget is not checked). The message names the op, where it runs and\n"
     "the cause; the diagnostic points at the shard statement over that module's parameters, else at the\n"
     "model. Every rank would raise the same error at launch. Split the op's inputs another way, rewrite\n"
     "the op in the model, or report it."),
    ("PL370", "no-loss", N, "no loss: the step trains the sum of the output",
     "The model defines no loss where planlang looks for one (a function `loss(output, *targets)` in the\n"
     "factory's module, or a method `loss(self, output, *targets)` of the model; docs/byom.md) and its\n"
     "output is not a scalar, so check, estimate, verify, apply and run take the sum of the output as the\n"
     "loss, and a training step takes no targets. That is rarely what you train: define `loss`, or pass\n"
     "`loss_fn=` to `planlang.apply`."),
    # ------------------------------------------------------------------ PL4xx pipeline and checkpoint
    ("PL390", "compile-around", N, "part of the step runs eagerly under compile",
     "`planlang.apply(..., compile=True)` puts each rank's generated step under torch.compile\n"
     "(planlang.runtime.compiled). What torch.compile cannot take as planlang runs it is run eagerly\n"
     "instead, and said on rank 0's stderr with this note: a training step with dropout (its seed\n"
     "changes every step, so each step would compile again; the evaluation program compiles), a\n"
     "collective recorder, BatchNorm inside a checkpoint group, FSDP2's hooks under ZeRO-2/3 (compiled\n"
     "around: one graph per block), and a pipeline's stages under tensor parallelism, with checkpoint\n"
     "groups, FSDP2 units, mixed precision or dropout. The results are the same as eager; only the\n"
     "speed differs. Remove dropout for a compiled training step, or accept the eager parts."),
    ("PL401", "stage-count", E, "number of stages does not match the pipeline axis",
     "A pipeline over axis `pp` of size p needs p stages (p * chunks with the interleaved, looped_bfs and\n"
     "zero_bubble schedules, 2 * p with the V schedules zbv and dualpipev: rank r holds stages r and\n"
     "2p - 1 - r)."),
    ("PL402", "interleaved-microbatches", E,
     "interleaved and zero_bubble schedules need microbatches divisible by the pipeline size",
     "The interleaved 1F1B and zero_bubble schedules run microbatches in rounds of one per pipeline\n"
     "rank through each chunk: microbatches must be a multiple of the pipeline size."),
    ("PL403", "few-microbatches", W, "fewer microbatches than stages",
     "With m < p microbatches some stages always idle (bubble ratio (p - 1) / (m + p - 1) at best).\n"
     "Use at least as many microbatches as stages."),
    ("PL404", "chunks", E,
     "chunks only apply to the interleaved, looped_bfs, zero_bubble, zbv and dualpipev schedules",
     "`chunks N` is the number of model chunks per device of `interleaved` and `looped_bfs`, which need\n"
     "it with N >= 2, and of `zero_bubble`, which takes N >= 1 (one chunk when `chunks` is left out).\n"
     "The V schedules `zbv` and `dualpipev` hold exactly two stages per device (rank r holds stages r\n"
     "and 2p - 1 - r) and are written `chunks 2`, no other number and not left out. `gpipe` and `1f1b`\n"
     "hold one chunk per device."),
    ("PL405", "checkpoint-crosses-stage", E, "checkpoint group crosses a stage boundary",
     "A checkpoint group is recomputed inside one stage; it cannot span two stages."),
    ("PL406", "stages-overlap", E, "a module is in two stages", "Each module belongs to exactly one stage."),
    ("PL407", "stages-out-of-order", E, "stages out of execution order",
     "Stages run in order: a later stage must hold later modules."),
    ("PL408", "empty-selection", E, "empty or reversed index range",
     "`h[a:b]` needs a < b; `h[6:6]` selects nothing."),
    ("PL409", "every-invalid", E, "`every` must be at least 1", "`checkpoint h[*] every N` groups N modules."),
    ("PL410", "stage-degrees", E, "per-stage degrees are inconsistent",
     "`stage ... with tp = 4` sets the sub-mesh of one stage: it may name only non-pipeline axes, and\n"
     "the stages' device counts (the product of each stage's degrees) must add up to the mesh's device\n"
     "count, a chunked schedule's stages on one pipeline rank counted once. Each stage then runs on its\n"
     "rank's devices, so each needs exactly as many as a rank has (PL418)."),
    ("PL411", "microbatches-invalid", E, "microbatches must be at least 1",
     "`microbatches N` splits each step's batch into N microbatches that run one after another (through\n"
     "the pipeline, or, written at the top level, through the whole model with the gradients summed once);\n"
     "N = 0 leaves nothing to run. Write a whole number of at least 1 (in a pipeline, at least the\n"
     "number of stages to keep every stage busy), or `?` and let `planlang solve` choose."),
    ("PL413", "checkpoint-overlap", E, "a module is in two checkpoint groups",
     "Checkpoint groups must be disjoint."),
    ("PL415", "pipeline-zero-batch-axes", E, "ZeRO-2/3 in a pipeline with the batch over several axes",
     "In a pipeline, ZeRO-2/3 shard each stage with FSDP2 over the one ZeRO axis, which must then be the\n"
     "only axis of size > 1 the batch is split over. Split the batch over the ZeRO axis only, or use\n"
     "ZeRO-1."),
    ("PL416", "1f1b-microbatches", E, "1F1B or dualpipev with fewer microbatches than stages",
     "1F1B warms stage i up with p - i forwards before its first backward, so it needs at least as many\n"
     "microbatches as stages (torch.distributed.pipelining refuses fewer). Use more microbatches, or\n"
     "`schedule gpipe`. `dualpipev chunks 2` needs at least as many microbatches as its 2 * p model\n"
     "stages (torch's ScheduleDualPipeV refuses fewer); `zbv chunks 2` takes any number."),
    ("PL417", "microbatches-with-pipeline", E, "top-level `microbatches` in a plan with a pipeline",
     "A top-level `microbatches N` makes a step without a pipeline run each rank's batch as N microbatches\n"
     "in sequence, summing the gradients once (gradient accumulation). A pipeline already runs its\n"
     "microbatches in sequence and sums once: its `pipeline ... microbatches N` is the step's count, and a\n"
     "second statement could only repeat or contradict it. Remove the top-level statement; change the\n"
     "pipeline's `microbatches` to change the count."),
    ("PL418", "stage-degrees-not-run", E, "stages of their own degrees that do not run as written",
     "`stage ... with dp = 4, tp = 1` runs that stage on its pipeline rank's devices with its own sizes of\n"
     "the other axes (CAPTURE's and Alpa's heterogeneous stages, planlang/plan/stage_meshes.py): the rank's\n"
     "devices run the stage's program, and at a boundary each device passes on its share of its replica's\n"
     "rows to the device in the same place of the next rank. planlang refuses the stages that would not run\n"
     "so, rather than run them otherwise. (1) A chunked schedule (interleaved, looped_bfs, zbv, dualpipev)\n"
     "puts several stages on each rank's devices: use 1f1b, gpipe or zero_bubble, or remove the `with`.\n"
     "(2) A stage whose device count (the product of its degrees) is not its rank's (the mesh's devices\n"
     "over the pipeline axis' size): the counts may add up to the mesh (PL410) and still not give each\n"
     "rank one stage; trade data for tensor parallelism within the rank instead (dp = 4, tp = 1 or dp = 2,\n"
     "tp = 2 on 4 devices). (3) The pipeline axis not the mesh's first: a rank's devices are then not\n"
     "adjacent and cannot be laid out by the stage's sizes; declare it first. (4) Two stages under which a\n"
     "device of a rank holds different rows of a microbatch at a boundary (a data axis declared after a\n"
     "tensor axis, so that a replica's devices are not adjacent): declare the data axes before the other\n"
     "axes."),
    ("PL419", "split-backward-checkpoint", W, "a split backward recomputes checkpoints once per weight group",
     "`schedule zero_bubble` (and zbv; dualpipev for the backwards it splits) splits each backward into\n"
     "the input gradient (B) and the weight gradient (W, later). torch's W (`stage_backward_weight`) runs\n"
     "one backward per group of weights that share an operation, and in each a checkpoint group recomputes\n"
     "its whole forward again, keeping what that group did not use until the stage's graph is freed: for\n"
     "a GPT-2 block, six recomputations and 0.81 MB at W's peak against 0.31 MB without the checkpoint.\n"
     "The step computes more than the step time prices, and the estimate undercounts W's peak (gpt2 pp2 x\n"
     "tp2 with `checkpoint h[*] every 1`: -12.8 %). Training is correct. Remove the checkpoint groups, or\n"
     "use `schedule interleaved chunks N` with them."),
    # model-aware (planlang.model.checks)
    ("PL466", "batch-norm-microbatches", W, "BatchNorm inside a pipeline normalizes each microbatch",
     "A pipeline runs each microbatch through a stage on its own, so a BatchNorm in training computes\n"
     "its statistics over one microbatch, not the batch: training differs from one process (GPipe's\n"
     "behaviour), and `planlang verify` will report it. The data-parallel ranks' microbatches are\n"
     "normalized together (SyncBatchNorm's statistics), so with one microbatch (`schedule gpipe\n"
     "microbatches 1`; 1F1B needs one per stage) a stage's BatchNorm equals one process's. A model cut\n"
     "by torch.export (not traceable by torch.fx between its stages) has its BatchNorm inlined, and each\n"
     "data-parallel rank then normalizes its own samples: reported too. Otherwise replace BatchNorm\n"
     "with GroupNorm or LayerNorm, or accept per-microbatch statistics. Gradient accumulation (a top-level\n"
     "`microbatches N`) runs each microbatch through the whole model on its own: the same holds, and\n"
     "`microbatches 1` is the batch's statistics."),
    ("PL468", "zero-block-in-root-unit", W, "a repeated block ZeRO-2/3 cannot make an FSDP2 unit of its own",
     "ZeRO-2 and ZeRO-3 shard each repeated block (an outermost `nn.ModuleList` entry: GPT-2's `h.N`,\n"
     "Llama's `model.layers.N`) as an FSDP2 unit of its own, so that only the running block's parameters are\n"
     "gathered. A block whose instructions are interleaved with other modules' in the lowered program, whose\n"
     "parameters are shared with or read by another module, or that a checkpoint group crosses stays in the\n"
     "root unit, and its parameters are gathered with the root's for the whole step: more memory than the\n"
     "estimate of per-block units. The message says why for each block. Untie the parameter, move the\n"
     "checkpoint group inside the block, or accept the memory."),
    ("PL467", "stages-not-cut", E, "the model cannot be cut into the plan's stages",
     "planlang cuts the model into its pipeline stages with torch.fx before anything is launched; this\n"
     "model's code cannot be traced between the stage modules (Hugging Face models' forwards are not\n"
     "symbolically traceable), or a value other than a tensor would cross a stage boundary. The message\n"
     "says which. Move the stage boundaries, or run the model without a pipeline (data, tensor and ZeRO\n"
     "parallelism trace it with torch.export)."),
    ("PL460", "stage-coverage", E, "module in no stage",
     "With explicit stages, every module that holds parameters or runs computation must belong to\n"
     "exactly one stage. A parameter of the root module itself (no submodule holds it) is named in the\n"
     "stage whose code reads it: `stage wte, pos, h[0:6]`."),
    ("PL461", "module-in-two-stages", E, "module in two stages", "A module is selected by two stages."),
    ("PL462", "stage-order", E, "stages out of execution order",
     "Stage i+1 must run after stage i: a module of a later stage runs before a module of an earlier one."),
    ("PL463", "shared-parameter-split", W, "shared parameter split across stages",
     "Two modules share one parameter (e.g. tied input and output embeddings) but sit in different\n"
     "stages. Each stage that uses it keeps a copy, and after every backward the copies' gradients are\n"
     "summed over the pipeline axis so the optimizer keeps them equal (Megatron-LM's embedding group):\n"
     "one more copy of the parameter, its gradient and its optimizer state on the second stage, and one\n"
     "all-reduce of its size per step. Put the modules in one stage to avoid both, or untie the parameter."),
    ("PL464", "checkpoint-not-contiguous", E, "checkpoint group not contiguous",
     "A checkpoint group (without `every`) must be consecutive modules in execution order."),
    ("PL465", "checkpoint-crosses-stage", E, "checkpoint group crosses a stage boundary",
     "A checkpoint group must lie inside one pipeline stage."),
    # ------------------------------------------------------------------ PL5xx memory and optimizer
    ("PL501", "budget-exceeds-device", E, "budget exceeds the device's memory",
     "The per-device budget is larger than the memory of the mesh's device."),
    ("PL502", "zero-stage", E, "ZeRO stage must be 0, 1, 2 or 3",
     "1 shards optimizer state, 2 also gradients, 3 also parameters."),
    ("PL503", "zero-axis-missing", E, "ZeRO needs an axis",
     "Write `zero = 1 over dp`: the axis whose ranks share the optimizer state."),
    ("PL504", "zero-axis-not-data", E, "ZeRO over an axis that does not split the data",
     "ZeRO shards state across data-parallel replicas; over an axis that does not split any input's\n"
     "batch dim the replicas hold different gradients, so the runtime refuses it. Name a data axis:\n"
     "one the `data` statements split the batch over."),
    ("PL505", "no-budget", N, "no memory budget",
     "Without `budget N GiB per device` the memory checks use the device's full memory."),
    ("PL506", "optimizer-argument", E, "an optimizer argument its torch class refuses",
     "The optimizer's arguments are passed to its torch class (Lion: planlang's own) on every rank. An\n"
     "argument the class does not take (`adamw(momentum = 0.9)`), a value of the wrong kind (`lr = \"fast\"`,\n"
     "`betas = 0.9`) or out of range (`betas = [1.5, 0.999]`, Lion's `lr = 0`), or SGD's `nesterov = true`\n"
     "without momentum would stop the run after launch. The message names the argument and what it\n"
     "takes. Implementation switches (`fused`, `capturable`, `differentiable`) are the runtime's to set."),
    ("PL507", "zero-fsdp-axes", E, "ZeRO-2/3 over data axes FSDP2 cannot arrange",
     "Without a pipeline, ZeRO-2 and ZeRO-3 shard parameters, gradients and optimizer state with FSDP2\n"
     "over the ZeRO axis. The batch may be split over at most one more axis, which FSDP2 replicates over\n"
     "(HSDP), and that axis must come before the ZeRO axis in the mesh; and no `shard` may split a\n"
     "parameter over those axes itself (FSDP2 does). Otherwise the runtime refuses the plan on every rank.\n"
     "Split the batch over the ZeRO axis only, declare the replicate axis first\n"
     "(`mesh m of 4 x d { dp = 2; fs = 2 }` with `zero = 3 over fs`), or take the axis out of the spec."),
    ("PL508", "optimizer-not-shardable", E, "an optimizer that cannot step ZeRO-2/3's sharded parameters",
     "ZeRO-2 and ZeRO-3 give the optimizer FSDP2's sharded parameters (DTensors, one slice per rank). Not\n"
     "every torch optimizer can update those: Adafactor updates its factored second moments in place on\n"
     "row and column norms, which a sharded parameter holds as partial sums, and fails at its first step\n"
     "on every rank. Use ZeRO-1 (each rank steps whole parameters) or another optimizer. The same\n"
     "optimizer on a matrix that tensor parallelism splits over its last two dims would average the\n"
     "rank's piece only and step differently from one process: that is PL508 too."),
    ("PL509", "precision-dtype", E, "a dtype training state cannot be kept in",
     "The precision fields of the optimizer block (`precision`, `params`, `compute`, `reduce`,\n"
     "`master`) take f32, bf16 or f16. Integer dtypes, fp8 and tf32 (a matmul mode of f32, not a storage\n"
     "dtype) are names the language knows but not dtypes a step keeps parameters, gradients or master\n"
     "weights in. `precision = bf16` is the usual recipe: bf16 parameters and compute, f32 reduction and\n"
     "f32 master weights."),
    ("PL510", "precision-no-flops", E, "the device declares no throughput for the compute dtype",
     "The estimator prices the step's compute at the device's `flops.<dtype>` for the plan's compute dtype\n"
     "(`compute`, or `precision`), and a device without one cannot be priced in it. Declare the figure in\n"
     "the device (`flops.bf16 = 312 TFLOPS`; the standard library's devices declare bf16, f16, tf32 and\n"
     "f32) or compute in a dtype the device declares."),
    ("PL511", "f16-needs-loss-scale", E, "f16 without loss scaling",
     "f16 has 5 exponent bits: gradients below about 6e-8 flush to zero and small activations' gradients\n"
     "are lost, so training in f16 needs the loss multiplied before backward and the gradients divided\n"
     "after (Micikevicius et al. 2018). Add `loss_scale = dynamic` (start at 2^16, halve on an overflow and\n"
     "skip that step, double after 2000 clean steps) or a constant `loss_scale = 1024`. bf16 has f32's\n"
     "exponent range and needs none."),
    ("PL512", "master-narrower-than-params", E, "master weights narrower than the parameters",
     "The master copy is what the optimizer steps: a copy narrower than the parameters would round every\n"
     "update to the narrower dtype and then widen it again, losing what the wider parameters could hold.\n"
     "Keep `master` at least as wide as `params` (the usual: `params = bf16`, `master = f32`)."),
    ("PL513", "compute-wider-than-params", E, "compute wider than the parameters",
     "`compute` is the dtype `torch.autocast` runs matmuls in; autocast narrows, it never widens, so compute\n"
     "wider than `params` (bf16 parameters, f32 compute) would not run as written. Store the parameters\n"
     "in the compute dtype or wider (`params = f32`, `compute = bf16` is automatic mixed precision)."),
    # model-aware (planlang.model.checks)
    ("PL560", "over-budget", E, "estimated peak memory exceeds the budget",
     "The estimator (`planlang estimate`) predicts that a device's peak memory in a training step is above\n"
     "the plan's budget. The message gives the breakdown; shard more (tp, ZeRO), checkpoint, or use more\n"
     "microbatches or pipeline stages. `planlang solve` reports it when no candidate it priced fits, with\n"
     "the smallest peak it saw: raise the budget to that, or open more holes."),
    ("PL561", "search-cut", W, "the solver's search stopped at its time limit",
     "`planlang solve --time-limit S` returns the best complete plan it priced before the limit, and says\n"
     "how many candidates and meshes it priced and where it stopped. A longer search may find a faster or\n"
     "leaner plan: raise `--time-limit`, or fill more holes so that there is less to search."),
]

CODES: dict[str, Code] = {c: Code(c, n, s, t, x) for c, n, s, t, x in _ENTRIES}


def lookup(code: str) -> Code | None:
    return CODES.get(code.upper())


def explain(code: str) -> str | None:
    c = lookup(code)
    if c is None:
        return None
    text = f"{c.code} ({c.name}, {c.severity.value}): {c.title}\n"
    if c.explanation:
        text += "\n" + c.explanation + "\n"
    return text
