; scopes for config.toml's `not_in` (no auto-closed quote inside a string or a comment)
(string) @string
(comment) @comment
