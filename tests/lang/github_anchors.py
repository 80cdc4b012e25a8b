"""The anchors GitHub gives a markdown file's headings (what `#fragment` links into a rendered file reach).

GitHub (github-slugger) lowercases the heading's text, drops every character that is not a letter, a
digit, a combining mark, `_`, `-` or a space, turns each space into `-`, and numbers repeats `-1`, `-2`, ...
(`### PL301` -> `pl301`, `## PL1xx — Syntax` -> `pl1xx--syntax`). Headings inside fenced code are not
headings. Only ATX headings (`#` ... `######`) are read; the generated docs use no other kind.
"""
from __future__ import annotations

import re
import unicodedata

_ATX = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")


def slug(heading: str) -> str:
    text = re.sub(r"`([^`]*)`", r"\1", heading).strip().lower()  # inline code renders as its text
    kept = "".join(ch for ch in text if ch in " -_" or ch.isalnum() or unicodedata.category(ch).startswith("M"))
    return kept.replace(" ", "-")


def heading_anchors(markdown: str) -> list[str]:
    """The anchors of the file's headings, in order, with GitHub's numbering of repeats."""
    seen: dict[str, int] = {}
    out: list[str] = []
    fence = None
    for line in markdown.splitlines():
        m = _FENCE.match(line)
        if m:
            fence = None if fence == m.group(1) else (fence or m.group(1))
            continue
        if fence:
            continue
        h = _ATX.match(line)
        if not h:
            continue
        base = slug(h.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.append(base if n == 0 else f"{base}-{n}")
    return out
