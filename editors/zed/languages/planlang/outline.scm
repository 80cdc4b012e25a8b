; the outline panel and `editor: toggle outline`: one item per declaration
(use_statement "use" @context module: (_) @name) @item
(model_declaration "model" @context name: (identifier) @name) @item
(input_declaration "input" @context name: (identifier) @name) @item
(device_declaration "device" @context name: (identifier) @name) @item
(link_declaration "link" @context name: (identifier) @name) @item
(mesh_declaration "mesh" @context name: (identifier) @name) @item
(mesh_alias "mesh" @context name: (identifier) @name) @item
(optimizer_declaration "optimizer" @context name: (identifier) @name) @item
(pipeline_declaration "pipeline" @name) @item
(template_declaration "template" @context name: (identifier) @name) @item
(stage "stage" @context . (path) @name) @item
