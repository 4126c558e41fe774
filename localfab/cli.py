"""The `localfab` command line: a thin click layer over the library.

Errors a user can meet are `LocalfabError`s, printed here once as one line on stderr with the exit
code their type carries; nothing below this layer prints tracebacks for them.
"""

from __future__ import annotations

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


class LocalfabGroup(click.Group):
    """A group that turns LocalfabError into one stderr line and its exit code."""

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
    if ctx.invoked_subcommand is not None:
        return
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        # As click does for a group called without a command: the help, exit code 2.
        raise click.exceptions.NoArgsIsHelpError(ctx)
    from localfab.commands.chat import last_used_model, open_app

    open_app(last_used_model())


def _register() -> None:
    # Each module imports only click and light modules at import time (`--help` stays instant).
    from localfab.commands import benchmark, chat, models, planning, run, serve, stats

    cli.add_command(run.run)
    for module in (chat, planning, models, serve, stats, benchmark):
        for command in module.COMMANDS:
            cli.add_command(command)


_register()


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="localfab")
    sys.exit(0)
