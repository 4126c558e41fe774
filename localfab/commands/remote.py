"""`localfab remote`: the remote model servers of config.toml, and their keys in the system
keyring."""

from __future__ import annotations

import click

from localfab.errors import UsageError


@click.group("remote", invoke_without_command=True)
@click.pass_context
def remote(ctx: click.Context) -> None:
    """The remote model servers ([remotes.NAME] of config.toml): list, key."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_remotes)


@remote.command("list")
def list_remotes() -> None:
    """Each remote server and the models it serves (or why it could not be asked)."""
    from localfab.config import Config, default_paths
    from localfab.remote.listing import remote_rows
    from localfab.remote.named import named_remotes
    from localfab.textsafe import visible_controls

    paths = default_paths()
    remotes = named_remotes(Config.load(paths), str(paths.config_file))
    if not remotes:
        click.echo(
            f'No remote servers: add [remotes.NAME] with url = "http://host:8080" to '
            f"{paths.config_file}, or use `localfab chat --remote URL`."
        )
        return
    for label, where in remotes.items():
        click.echo(f"{label}  {where.url}")
        for row in remote_rows(label, where):
            text = f"{row.model}  {row.detail}" if row.model else row.detail
            click.echo(f"  {visible_controls(text)}")


@remote.command("key")
@click.argument("name")
@click.option("--delete", is_flag=True, help="Remove the stored key instead.")
def key(name: str, delete: bool) -> None:
    """Store the API key of remote NAME (a [remotes.NAME] of config.toml) in the system
    keyring, asked without echo; it is used when the table names no api_key_env."""
    try:
        import keyring
        from keyring.errors import KeyringError, PasswordDeleteError
    except ImportError as exc:  # a dependency, but a packager may leave it out
        raise UsageError("the keyring package is not installed: use api_key_env") from exc
    from localfab.config import Config, default_paths
    from localfab.remote.client import KEYRING_SERVICE
    from localfab.remote.named import named_remotes

    paths = default_paths()
    if not delete and name not in named_remotes(Config.load(paths), str(paths.config_file)):
        raise UsageError(
            f"no [remotes.{name}] in {paths.config_file}: add it (url = ...) first; a key is "
            "kept for a named remote"
        )
    try:
        if delete:
            try:
                keyring.delete_password(KEYRING_SERVICE, name)
            except PasswordDeleteError as exc:
                raise UsageError(f"no key is stored for {name}") from exc
            click.echo(f"Removed the key of {name} from the keyring.")
            return
        secret = click.prompt(f"API key for {name}", hide_input=True, confirmation_prompt=True)
        keyring.set_password(KEYRING_SERVICE, name, secret.strip())
    except (KeyringError, RuntimeError) as exc:
        raise UsageError(
            f"no system keyring to keep the key in ({exc or type(exc).__name__}); put it in an "
            "environment variable "
            "and name it with api_key_env instead"
        ) from exc
    click.echo(f"Stored the key of {name} in the system keyring ({keyring.get_keyring().name}).")
