"""Compiled regular expressions kept as data, so that a new process does not compile them again.

`re.compile` parses a pattern and assembles its program in Python; the lexer's 74 per-state scanners
(parser_cache) cost ~15-20 ms of a 0.17 CPU-s `planlang check` that way. What the compile ends with is
plain data -- the program (a list of ints), the flags and the group names -- handed to the C engine
(`_sre.compile`). `program` returns that data for the parser cache to store; `pattern_of` makes the
pattern from it again in microseconds.

The program's layout belongs to the Python that wrote it (`_sre.MAGIC`, and the parser cache's key holds
`sys.version`), and `_sre.compile` is CPython's, not a public API: where either does not fit (another
Python, another implementation), `program` gives None and `pattern_of` compiles the pattern as `re` does.
"""
from __future__ import annotations

import re
from typing import Any, Optional

try:  # CPython's regular-expression engine and its compiler (what re.compile runs)
    import _sre
    from re import _compiler, _parser  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - another Python: every pattern is compiled by re
    _sre = None

Program = tuple  # (magic, flags, code, groups, groupindex, indexgroup)


def program(pattern: str, flags: int = 0) -> Optional[Program]:
    """The compiled program of `pattern` as data (as `re._compiler.compile` makes it), or None where this
    Python's compiler is not the one this reads."""
    if _sre is None:
        return None
    try:
        parsed = _parser.parse(pattern, flags)
        code = _compiler._code(parsed, flags)
        state = parsed.state
        indexgroup: list[Any] = [None] * state.groups
        for name, i in state.groupdict.items():
            indexgroup[i] = name
        made = (_sre.MAGIC, int(flags | state.flags), [int(c) for c in code], state.groups - 1, dict(state.groupdict),
                tuple(indexgroup))
        # opcodes are named int constants: stored as plain ints. The check that the data is what the engine
        # takes: the same pattern (flags, text, program) as re.compile makes
        if _from_program(pattern, made) != re.compile(pattern, flags):
            return None
        return made
    except Exception:  # noqa: BLE001 -- another compiler's internals: re compiles it in every process
        return None


def _from_program(pattern: str, prog: Program) -> re.Pattern:
    _magic, flags, code, groups, groupindex, indexgroup = prog
    return _sre.compile(pattern, flags, code, groups, groupindex, indexgroup)


def pattern_of(pattern: str, flags: int, prog: Optional[Program]) -> re.Pattern:
    """`re.compile(pattern, flags)`, made from `prog` (from `program`) where it fits this Python."""
    if prog is not None and _sre is not None and prog[0] == _sre.MAGIC:
        try:
            return _from_program(pattern, prog)
        except Exception:  # noqa: BLE001 -- a program this engine refuses: compiled as re does
            pass
    return re.compile(pattern, flags)
