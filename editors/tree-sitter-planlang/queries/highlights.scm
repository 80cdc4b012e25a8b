; planlang highlights, with nvim-treesitter's capture names (Neovim). The Helix and Zed queries
; (editors/helix/runtime/queries/planlang/, editors/zed/languages/planlang/) are generated from this file
; by `scripts/ts.py queries`, which renames the captures.
;
; Rules kept by tests/editors/test_tree_sitter.py, so the result does not depend on how an editor orders
; patterns: every token of a plan gets exactly one capture (line breaks aside), and only tokens are
; captured, never a node that contains others. The classes follow the language server's semantic tokens
; (planlang/lsp/tokens.py), so turning the server on does not recolour a plan.

; ---------------------------------------------------------------- keywords
; Keywords are soft: a keyword used as a name is an (identifier), so these match only real keywords.

["use" "as"] @keyword.import

["for" "in"] @keyword.repeat

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
(dotted_name (identifier) @module . (identifier))

(use_statement module: (dotted_name (identifier) @module .))
(use_statement alias: (identifier) @module)

(mesh_declaration device: (dotted_name (identifier) @type .))
(mesh_alias preset: (dotted_name (identifier) @type .))
(axis_declaration link: (dotted_name (identifier) @type .))
(apply_statement template: (dotted_name (identifier) @function.call .))

; a value that names something: an axis (`zero = 1 over dp`, `apply t(tp)`), a declared constant
(keyword_argument value: (dotted_name (identifier) @variable .))
(field value: (dotted_name (identifier) @variable .))
(budget_statement value: (dotted_name (identifier) @variable .))
(list (dotted_name (identifier) @variable .))
(template_arguments (dotted_name (identifier) @variable .))

; ---------------------------------------------------------------- declarations and names
(model_declaration name: (identifier) @type.definition)
(keyword_argument name: (identifier) @variable.parameter)

(input_declaration name: (identifier) @variable.parameter)
(input_declaration dtype: (identifier) @type.builtin)
(dimension name: (identifier) @property)

(device_declaration name: (identifier) @type.definition)
(link_declaration name: (identifier) @type.definition)
(field key: (field_name (identifier) @property))
(field axis: (identifier) @variable)

(mesh_declaration name: (identifier) @type.definition)
(mesh_alias name: (identifier) @type.definition)
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
(path (identifier) @variable.member)
(path (glob) @character.special)
(star "*" @character.special)

; ---------------------------------------------------------------- literals
(integer) @number
(float) @number.float
(unit (identifier) @number)
(unit "/" @number)
(string) @string
(hole) @operator

((comment) @comment @spell)

; ---------------------------------------------------------------- punctuation
"=" @operator

["(" ")" "[" "]" "{" "}"] @punctuation.bracket

["," "." ":" ";"] @punctuation.delimiter
