; planlang highlights for Zed, GENERATED from editors/tree-sitter-planlang/queries/highlights.scm
; (nvim-treesitter's capture names) by `python editors/tree-sitter-planlang/scripts/ts.py queries`,
; which renames the captures to Zed's. Edit that file and run the script; do not edit this one.
;
; Every token gets exactly one capture and only tokens are captured, so the result does not depend
; on the order in which an editor applies patterns (tests/editors/test_tree_sitter.py).

; ---------------------------------------------------------------- keywords
; Keywords are soft: a keyword used as a name is an (identifier), so these match only real keywords.

["use" "as"] @keyword

["for" "in"] @keyword

"template" @keyword

["of" "x" "over" "per" "to" "with" "every"] @keyword

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
(dotted_name (identifier) @type . (identifier))

(use_statement module: (dotted_name (identifier) @type .))
(use_statement alias: (identifier) @type)

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
(keyword_argument name: (identifier) @variable)

(input_declaration name: (identifier) @variable)
(input_declaration dtype: (identifier) @type)
(dimension name: (identifier) @property)

(device_declaration name: (identifier) @type)
(link_declaration name: (identifier) @type)
(field key: (field_name (identifier) @property))
(field axis: (identifier) @variable)

(mesh_declaration name: (identifier) @type)
(mesh_alias name: (identifier) @type)
(axis_declaration name: (identifier) @variable)

(optimizer_declaration name: (identifier) @constant)

(data_statement input: (identifier) @variable)

; mesh axes in specs
(spec (identifier) @variable)
(axis_tuple (identifier) @variable)
(partial (identifier) @variable)
(replicated) @constant

(pipeline_declaration axis: (identifier) @variable)
(schedule_name) @constant
(degree axis: (identifier) @variable)

(checkpoint_statement every: (identifier) @variable)

(template_declaration name: (identifier) @function)
(parameter name: (identifier) @variable)
(parameter kind: (identifier) @type)

(for_statement variable: (identifier) @variable)

; module paths: `h[*].mlp.c_fc.weight`, `**.bias`, `[0].weight`
(path (identifier) @property)
(path (glob) @operator)
(star "*" @operator)

; ---------------------------------------------------------------- literals
(integer) @number
(float) @number
(unit (identifier) @number)
(unit "/" @number)
(string) @string
(hole) @operator

((comment) @comment)

; ---------------------------------------------------------------- punctuation
"=" @operator

["(" ")" "[" "]" "{" "}"] @punctuation.bracket

["," "." ":" ";"] @punctuation.delimiter
