"""Every `scalelab …` command in the README's and docs/'s code blocks parses against the CLI as it is: the
command and sub-command exist and every flag is known (nothing runs)."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from typer.main import get_command

from scalelab.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def documented() -> list[tuple[str, int, str]]:
    """(page, line number, command line) for every line of a code block that starts with `scalelab `."""
    out = []
    for page in PAGES:
        inside = False
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if line.startswith("```"):
                inside = not inside
            elif inside and line.startswith("scalelab "):
                out.append((page.name, number, line))
    return out


def parse(args: list[str]) -> str:
    """Resolve `scalelab ARGS` down to its command and parse that command's flags; returns the command's name."""
    group = get_command(app)
    ctx = group.make_context("scalelab", list(args))
    command = group
    while hasattr(command, "resolve_command"):  # a group: its sub-command is what the parser left over
        rest = [*(getattr(ctx, "_protected_args", None) or getattr(ctx, "protected_args", None) or []), *ctx.args]
        name, command, rest = command.resolve_command(ctx, rest)
        ctx = command.make_context(name, rest, parent=ctx)
    return command.name


COMMANDS = documented()


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 40 and {page for page, _, _ in COMMANDS} >= {"README.md", "commands.md"}


@pytest.mark.parametrize("page,number,line", COMMANDS, ids=[f"{p}:{n}" for p, n, _ in COMMANDS])
def test_a_documented_command_parses(page, number, line):
    parse(shlex.split(line, comments=True)[1:])


def test_a_wrong_flag_does_not_parse():
    with pytest.raises(Exception, match="No such option"):
        parse(["train", "--no-such-flag"])
