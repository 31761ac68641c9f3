"""Lines of text in the terminal's width: progress lines, `explain`'s breakdown, a study's closing lines.

    width = terminal_width()          # COLUMNS, else the terminal's; None for a pipe or a log
    for line in wrapped(text, width):  # broken at spaces, the rest indented under it; whole when width is None
        print(line)

Nothing is cut: a line longer than the width goes on under itself. Output that is no terminal (a pipe, a CI log)
and sets no COLUMNS keeps each line whole, so it can be searched line by line.
"""
from __future__ import annotations

import os
import sys
import textwrap

INDENT = "    "  # under a broken line: its own indentation and this much more
NARROWEST = 20  # a width below this (a misread COLUMNS) is not a terminal's


def terminal_width() -> int | None:
    """COLUMNS when set, else the width of the terminal standard output is; None when neither is known."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) >= NARROWEST:
        return int(columns)
    try:
        return os.get_terminal_size(sys.stdout.fileno()).columns if sys.stdout.isatty() else None
    except (OSError, ValueError):  # no file descriptor (a captured stream)
        return None


def wrapped(line: str, width: int | None) -> list[str]:
    """`line` as lines of at most `width` characters, broken at spaces (a word longer than the width is broken
    too), each after the first indented under it; [line] when `width` is None or it fits. Runs of spaces inside
    the line (a table's alignment) are kept."""
    if width is None or len(line) <= width:
        return [line]
    lead = line[:len(line) - len(line.lstrip(" "))]
    indent = (lead + INDENT)[:max(width // 2, 1)]
    return textwrap.wrap(line, width, initial_indent="", subsequent_indent=indent, break_on_hyphens=False,
                         drop_whitespace=True, replace_whitespace=False) or [line[:width]]
