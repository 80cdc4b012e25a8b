"""The package's version, in the bottom layer so every layer can name it (the SARIF renderer, the
language server, `planlang --version`) without importing the package root, which sits above them all."""

__version__ = "0.1.0"  # pyproject.toml's [project] version; tests/test_packaging.py checks they agree
