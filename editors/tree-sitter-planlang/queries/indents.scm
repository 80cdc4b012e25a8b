; Neovim (nvim-treesitter): one level per open `{`, `[` or `(`, as `planlang fmt` indents (4 spaces:
; set shiftwidth=4).
[
  (field_block)
  (axis_block)
  (stage_block)
  (block)
  (arguments)
  (template_arguments)
  (parameters)
  (dimensions)
  (spec)
  (list)
  (axis_tuple)
  (partial)
] @indent.begin

(field_block "}" @indent.branch @indent.end)
(axis_block "}" @indent.branch @indent.end)
(stage_block "}" @indent.branch @indent.end)
(block "}" @indent.branch @indent.end)
(arguments ")" @indent.branch @indent.end)
(template_arguments ")" @indent.branch @indent.end)
(parameters ")" @indent.branch @indent.end)
(axis_tuple ")" @indent.branch @indent.end)
(partial ")" @indent.branch @indent.end)
(dimensions "]" @indent.branch @indent.end)
(spec "]" @indent.branch @indent.end)
(list "]" @indent.branch @indent.end)

(comment) @indent.auto

(ERROR) @indent.auto
