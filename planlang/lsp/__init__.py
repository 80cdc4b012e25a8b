"""The planlang language server (LSP over stdio, built on pygls).

`planlang lsp` / `python -m planlang.lsp` call `planlang.lsp.server.main`. The feature modules are
plain functions of an `Analysis` (hover, definition, completion, tokens, formatting, diagnostics),
tested without a server. Importing this package never imports torch: the model layer is loaded only
when model checks are enabled.
"""
