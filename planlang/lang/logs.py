"""Debug logging that imports `logging` only when something is logged.

The language layer logs only where it falls back (a parser cache that cannot be read, a fast parser that
failed): rare, and `import logging` is ~3 ms of a ~0.15 CPU-s `planlang check`."""
from __future__ import annotations


def debug(name: str, msg: str, *args: object, exc_info: "bool | BaseException" = False) -> None:
    """`logging.getLogger(name).debug(msg, *args, exc_info=exc_info)`."""
    # lazy: logging loads only when a fallback is logged
    import logging

    logging.getLogger(name).debug(msg, *args, exc_info=exc_info)
