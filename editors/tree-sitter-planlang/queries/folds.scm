; blocks and bracketed lists that span lines
[
  (field_block)
  (axis_block)
  (stage_block)
  (block)
  (arguments)
  (dimensions)
  (spec)
  (list)
] @fold
