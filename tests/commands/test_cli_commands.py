"""The command table: every command of every module is reachable, and loads only when used."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys

import click

import localfab.commands
from localfab.cli import COMMANDS, cli


def test_every_command_in_the_modules_is_in_the_table_and_resolves():
    commands: list[click.Command] = []
    for info in pkgutil.iter_modules(localfab.commands.__path__):
        module = importlib.import_module(f"localfab.commands.{info.name}")
        for value in vars(module).values():
            if isinstance(value, click.Command) and value.callback.__module__ == module.__name__:
                commands.append(value)
    # A group's subcommands (`localfab mcp list`, `localfab remote list`) are reached through
    # the group (and may share a name with a top-level command).
    subs = {id(sub) for c in commands if isinstance(c, click.Group) for sub in c.commands.values()}
    found = {c.name or "": c for c in commands if id(c) not in subs}
    assert set(found) == set(COMMANDS)
    ctx = click.Context(cli)
    for name, command in found.items():
        assert cli.get_command(ctx, name) is command
    assert cli.list_commands(ctx) == list(COMMANDS)
    assert cli.get_command(ctx, "nope") is None


def command_modules_after(step: str) -> list[str]:
    """The command modules a fresh interpreter holds after `step` (Python, with `cli` and
    `click` imported)."""
    code = (
        "import sys, click\n"
        "from localfab.cli import cli\n"
        f"{step}\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('localfab.commands.'))\n"
        "print(repr(loaded), file=sys.stderr)\n"
    )
    err = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stderr
    return list(ast.literal_eval(err.strip().splitlines()[-1]))


def test_a_command_loads_only_its_own_module():
    step = "cli.get_command(click.Context(cli), 'stats')"
    assert command_modules_after(step) == ["localfab.commands.stats"]


def test_help_lists_every_command():
    out = subprocess.run(
        [sys.executable, "-m", "localfab", "--help"], capture_output=True, text=True, check=True
    ).stdout
    listed = [line.split()[0] for line in out.split("Commands:")[1].splitlines() if line.strip()]
    assert listed[: len(COMMANDS)] == list(COMMANDS)


def test_the_table_summaries_are_the_commands_own_help():
    ctx = click.Context(cli)
    for name, (_module, _attr, summary) in COMMANDS.items():
        command = cli.get_command(ctx, name)
        assert command is not None and command.help is not None
        assert command.help.split("\n\n")[0].replace("\n", " ") == summary
        for limit in (30, 45, 80, 200):
            table = click.Command(name, help=summary).get_short_help_str(limit)
            assert table == command.get_short_help_str(limit)


def test_help_imports_no_command_module():
    step = "try:\n    cli(['--help'], prog_name='localfab')\nexcept SystemExit:\n    pass"
    assert command_modules_after(step) == []
