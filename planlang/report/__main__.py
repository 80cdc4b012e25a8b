"""`python -m planlang.report PLAN -o DIR [--format png,svg]`: the report command without the CLI."""
from __future__ import annotations

import argparse
import sys

from . import report_command


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m planlang.report", description=__doc__)
    ap.add_argument("plan", help="a plan file with a model")
    ap.add_argument("-o", "--output", required=True, help="folder to write the report into")
    ap.add_argument("--format", default="png,svg", help="image formats, comma-separated (png, svg, pdf)")
    args = ap.parse_args(argv)
    return report_command(args.plan, args.output, args.format)


if __name__ == "__main__":
    sys.exit(main())
