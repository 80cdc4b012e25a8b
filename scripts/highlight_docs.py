#!/usr/bin/env python3
"""Render the docs' markdown to standalone HTML, with ```plan code blocks highlighted by planlang's
Pygments lexer (planlang.lang.pygments_lexer.PlanLexer).

    python scripts/highlight_docs.py                       # docs/language.md -> docs/html/language.html
    python scripts/highlight_docs.py --out DIR docs/*.md   # other files, another folder

Markdown is rendered by markdown-it-py (installed with rich); headings get GitHub-style ids so the
documents' `#section` links work.
"""
from __future__ import annotations

import argparse
import html
import re
import sys
from pathlib import Path

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from planlang.lang.pygments_lexer import PlanLexer  # noqa: E402

PLAN_TAGS = ("plan", "plan-invalid")  # plan-invalid: blocks that show a mistake on purpose
STYLE = "default"

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ max-width: 60rem; margin: 2rem auto; padding: 0 1rem; font-family: sans-serif; line-height: 1.5; }}
pre {{ background: #f8f8f8; padding: .75rem; overflow-x: auto; border-radius: 4px; }}
code {{ font-family: ui-monospace, monospace; }}
table {{ border-collapse: collapse; }}
th, td {{ border: 1px solid #ccc; padding: .2rem .5rem; }}
{css}
</style>
</head>
<body>
{body}
</body>
</html>
"""


def slug(text: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def _highlight(code: str, lang: str, _attrs: str) -> str:
    if lang.strip() in PLAN_TAGS:
        return highlight(code, PlanLexer(), HtmlFormatter(nowrap=True))
    return ""  # markdown-it escapes other blocks itself


def render_markdown(text: str, title: str) -> str:
    """One markdown document as a standalone HTML page."""
    md = MarkdownIt("commonmark", {"highlight": _highlight}).enable("table")
    tokens = md.parse(text)
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open":
            tok.attrSet("id", slug(tokens[i + 1].content.replace("`", "")))
    body = md.renderer.render(tokens, md.options, {})
    css = HtmlFormatter(style=STYLE).get_style_defs([f"code.language-{t}" for t in PLAN_TAGS])
    return _PAGE.format(title=html.escape(title), css=css, body=body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path, default=[ROOT / "docs" / "language.md"])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "html", help="output folder")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for md_file in args.files:
        if not md_file.is_file():
            print(f"highlight_docs: {md_file}: no such file", file=sys.stderr)
            return 2
        text = md_file.read_text(encoding="utf-8")
        first = re.search(r"^# (.+)$", text, re.MULTILINE)
        page = render_markdown(text, first.group(1) if first else md_file.stem)
        target = args.out / (md_file.stem + ".html")
        target.write_text(page, encoding="utf-8")
        print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
