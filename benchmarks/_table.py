"""The benchmarks' tables: a rich table on a terminal, a Markdown table (as in benchmarks/README.md) when
stdout is not a terminal or with ``--markdown``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text


def add_markdown_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--markdown",
        action="store_true",
        help="print tables as Markdown, for benchmarks/README.md (the default when stdout is not a terminal)",
    )


def print_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], *, title: str = "", markdown: bool = False
) -> None:
    """One table; cells are printed as ``str(cell)``, so format numbers before. Markdown when ``markdown``
    is set or stdout is not a terminal, else a rich table (first column left-aligned, the others right)."""
    cells = [[str(cell) for cell in row] for row in rows]
    if markdown or not sys.stdout.isatty():
        if title:
            print(f"\n{title}\n")
        widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)]
        print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
        print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
        for row in cells:
            print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
        sys.stdout.flush()
        return
    table = Table(title=Text(title) if title else None, title_justify="left")
    for i, header in enumerate(headers):
        table.add_column(Text(header), justify="left" if i == 0 else "right")
    for row in cells:
        table.add_row(*(Text(cell) for cell in row))  # Text: a "[...]" in a cell is not rich markup
    Console().print(table)
