; TODO/FIXME/NOTE highlighting in comments (Neovim's `comment` parser, where installed)
((comment) @injection.content
  (#set! injection.language "comment"))
