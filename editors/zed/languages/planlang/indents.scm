; one level per open `{`, `[` or `(`, as `planlang fmt` indents (tab_size in config.toml)
(field_block "}" @end) @indent
(axis_block "}" @end) @indent
(stage_block "}" @end) @indent
(block "}" @end) @indent
(arguments ")" @end) @indent
(template_arguments ")" @end) @indent
(parameters ")" @end) @indent
(axis_tuple ")" @end) @indent
(partial ")" @end) @indent
(dimensions "]" @end) @indent
(spec "]" @end) @indent
(list "]" @end) @indent
