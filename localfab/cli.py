"""The `localfab` command line: a thin click layer over the library.

Errors a user can meet are `LocalfabError`s, printed here once as one line on stderr with the exit
code their type carries; nothing below this layer prints tracebacks for them.
"""

from __future__ import annotations

import importlib
import logging
import sys

import click

from localfab import __version__
from localfab.errors import LocalfabError

EPILOG = """\b
Exit codes:
  0    success
  1    other error
  2    bad option or argument
  3    model missing, unknown, not GGUF, truncated or corrupt
  4    prompt does not fit in the context window
  5    download or hub failure
  6    the model does not fit in memory
  130  interrupted (Ctrl-C)
"""


# Each command's module, loaded when the command is run or listed (`localfab chat` does not wait
# for the other commands' imports).
# Each command: its module under localfab.commands, its name there, and the first paragraph
# of its help. `--help` lists the commands from this table without importing any of them (a
# test checks the summaries against the commands' own help).
COMMANDS = {
    "run": (
        "run",
        "run",
        "Answer PROMPT with MODEL (a .gguf path or a registered name), streaming to stdout.",
    ),
    "chat": (
        "chat",
        "chat",
        "Chat with MODEL in the terminal app (a registered name, a .gguf path or smollm2:135m).",
    ),
    "plan": (
        "planning",
        "plan",
        "Show how MODEL would be loaded: GPU layers, context, KV cache, memory, speed, and why.",
    ),
    "doctor": (
        "planning",
        "doctor",
        "Show the devices found, their memory, and the llama-cpp-python backend; say what to fix.",
    ),
    "pull": (
        "models",
        "pull",
        "Download MODEL: a catalog name, OWNER/REPO[:QUANT] or a Hugging Face URL.",
    ),
    "list": (
        "models",
        "list_models",
        "The models on this machine (or, with --catalog, the curated ones to pull).",
    ),
    "show": (
        "models",
        "show",
        "What NAME is: file, size, quant, origin, and the facts in its GGUF header.",
    ),
    "rm": (
        "models",
        "rm",
        "Remove NAME: delete a downloaded model's files, or forget a model added by path.",
    ),
    "add": ("models", "add", "Register the GGUF file PATH where it is, without copying it."),
    "serve": (
        "serve",
        "serve",
        "Serve MODEL over HTTP with llama-server's API (OpenAI-compatible and native endpoints).",
    ),
    "stats": (
        "stats",
        "stats",
        "Totals and medians per model, plan and day from the usage ledger.",
    ),
    "mcp": (
        "mcp",
        "mcp",
        "The MCP tool servers for the chat app: list, tools, call, import, revoke.",
    ),
    "remote": (
        "remote",
        "remote",
        "The remote model servers ([remotes.NAME] of config.toml): list, key.",
    ),
    "bench": ("benchmark", "bench", "Record a labelled baseline of MODEL; chart tok/s by depth."),
}


class LocalfabGroup(click.Group):
    """A group that turns LocalfabError into one stderr line and its exit code."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, name, _summary = COMMANDS[cmd_name]
            command = getattr(importlib.import_module(f"localfab.commands.{module}"), name)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands and their summaries, as click lists them, from `COMMANDS`."""
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [
            (name, click.Command(name, help=summary).get_short_help_str(limit))
            for name, (_module, _attr, summary) in COMMANDS.items()
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except LocalfabError as exc:
            from localfab.textsafe import visible_controls

            # A message can carry text from outside (a server's error, a file's name): a
            # control sequence in it is shown, never acted on by the terminal.
            click.echo(f"localfab: error: {visible_controls(str(exc))}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("", err=True)
            ctx.exit(130)


@click.group(
    cls=LocalfabGroup,
    epilog=EPILOG,
    context_settings={"help_option_names": ["-h", "--help"]},
    invoke_without_command=True,
)
@click.version_option(__version__, prog_name="localfab")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Run GGUF models well on small hardware.

    With no command on a terminal, opens the chat app on the last used model.
    """
    # The hub library's retry lines stay behind -v (commands that take it lower this).
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    if ctx.invoked_subcommand is not None:
        return
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        # As click does for a group called without a command: the help, exit code 2.
        raise click.exceptions.NoArgsIsHelpError(ctx)
    from localfab.commands.chat import attached, last_used_model, open_app

    model = last_used_model()
    open_app(model, remote=attached(model, None))


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="localfab")
    sys.exit(0)
