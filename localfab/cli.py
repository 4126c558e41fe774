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
COMMANDS = {
    "run": ("run", "run"),
    "chat": ("chat", "chat"),
    "plan": ("planning", "plan"),
    "doctor": ("planning", "doctor"),
    "pull": ("models", "pull"),
    "list": ("models", "list_models"),
    "show": ("models", "show"),
    "rm": ("models", "rm"),
    "add": ("models", "add"),
    "serve": ("serve", "serve"),
    "stats": ("stats", "stats"),
    "bench": ("benchmark", "bench"),
}


class LocalfabGroup(click.Group):
    """A group that turns LocalfabError into one stderr line and its exit code."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, name = COMMANDS[cmd_name]
            command = getattr(importlib.import_module(f"localfab.commands.{module}"), name)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except LocalfabError as exc:
            click.echo(f"localfab: error: {exc}", err=True)
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
    from localfab.commands.chat import last_used_model, open_app

    open_app(last_used_model())


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="localfab")
    sys.exit(0)
