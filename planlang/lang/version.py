"""The package's version, in the bottom layer so every layer can name it (the SARIF renderer, the
language server, `planlang --version`) without importing the package root, which sits above them all."""

# The one place the version is written: pyproject.toml reads it ([tool.setuptools.dynamic]), so the wheel's
# metadata, `planlang --version` and the SARIF driver agree; CHANGELOG.md and the git tag vX.Y.Z follow it.
__version__ = "0.1.0"
