; TODO/FIXME/NOTE highlighting in comments (Helix's `comment` grammar)
((comment) @injection.content
  (#set! injection.language "comment"))
