; planlang highlights for Helix, GENERATED from editors/tree-sitter-planlang/queries/highlights.scm
; (nvim-treesitter's capture names) by `python editors/tree-sitter-planlang/scripts/ts.py queries`,
; which renames the captures to Helix's. Edit that file and run the script; do not edit this one.
;
; Every token gets exactly one capture and only tokens are captured, so the result does not depend
; on the order in which an editor applies patterns (tests/editors/test_tree_sitter.py).

; ---------------------------------------------------------------- keywords
; Keywords are soft: a keyword used as a name is an (identifier), so these match only real keywords.

["use" "as"] @keyword.control.import

["for" "in"] @keyword.control.repeat

"template" @keyword.function

["of" "x" "over" "per" "to" "with" "every"] @keyword.operator

[
  "model"
  "input"
  "device"
  "link"
  "mesh"
  "budget"
  "optimizer"
  "data"
  "shard"
  "output"
  "partial"
  "pipeline"
  "schedule"
  "microbatches"
  "chunks"
  "stage"
  "checkpoint"
  "apply"
] @keyword

; ---------------------------------------------------------------- dotted names
; every part but the last names a plan module (`hardware.nvlink3`, `megatron.mlp`)
(dotted_name (identifier) @namespace . (identifier))

(use_statement module: (dotted_name (identifier) @namespace .))
(use_statement alias: (identifier) @namespace)

(mesh_declaration device: (dotted_name (identifier) @type .))
(mesh_alias preset: (dotted_name (identifier) @type .))
(axis_declaration link: (dotted_name (identifier) @type .))
(apply_statement template: (dotted_name (identifier) @function .))

; a value that names something: an axis (`zero = 1 over dp`, `apply t(tp)`), a declared constant
(keyword_argument value: (dotted_name (identifier) @variable .))
(field value: (dotted_name (identifier) @variable .))
(budget_statement value: (dotted_name (identifier) @variable .))
(list (dotted_name (identifier) @variable .))
(template_arguments (dotted_name (identifier) @variable .))

; ---------------------------------------------------------------- declarations and names
(model_declaration name: (identifier) @type)
(keyword_argument name: (identifier) @variable.parameter)

(input_declaration name: (identifier) @variable.parameter)
(input_declaration dtype: (identifier) @type.builtin)
(dimension name: (identifier) @variable.other.member)

(device_declaration name: (identifier) @type)
(link_declaration name: (identifier) @type)
(field key: (field_name (identifier) @variable.other.member))
(field axis: (identifier) @variable)

(mesh_declaration name: (identifier) @type)
(mesh_alias name: (identifier) @type)
(axis_declaration name: (identifier) @variable)

(optimizer_declaration name: (identifier) @constant.builtin)

(data_statement input: (identifier) @variable.parameter)

; mesh axes in specs
(spec (identifier) @variable)
(axis_tuple (identifier) @variable)
(partial (identifier) @variable)
(replicated) @constant.builtin

(pipeline_declaration axis: (identifier) @variable)
(schedule_name) @constant.builtin
(degree axis: (identifier) @variable)

(checkpoint_statement every: (identifier) @variable.parameter)

(template_declaration name: (identifier) @function)
(parameter name: (identifier) @variable.parameter)
(parameter kind: (identifier) @type.builtin)

(for_statement variable: (identifier) @variable.parameter)

; module paths: `h[*].mlp.c_fc.weight`, `**.bias`, `[0].weight`
(path (identifier) @variable.other.member)
(path (glob) @operator)
(star "*" @operator)

; ---------------------------------------------------------------- literals
(integer) @constant.numeric.integer
(float) @constant.numeric.float
(unit (identifier) @constant.numeric.integer)
(unit "/" @constant.numeric.integer)
(string) @string
(hole) @operator

((comment) @comment.line)

; ---------------------------------------------------------------- punctuation
"=" @operator

["(" ")" "[" "]" "{" "}"] @punctuation.bracket

["," "." ":" ";"] @punctuation.delimiter
