"""`python -m planlang.lsp`: serve the language server on stdio."""
from planlang.lsp.server import main

main()
