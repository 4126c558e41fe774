"""Remote servers by name: the `[remotes.NAME]` tables of config.toml, or a URL as given.

```toml
[remotes.box]
url = "http://192.168.1.20:8080"
api_key_env = "BOX_KEY"      # the variable that holds the key (never the key itself)
model = "qwen3-32b"          # what to ask for ("" or none: the server's own)
timeout = 600                # seconds to wait for the next bytes of an answer
context = 8192               # tokens, where the server cannot say (Ollama's num_ctx)
```
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from localfab.errors import UsageError
from localfab.remote.client import READ_TIMEOUT, Remote

if TYPE_CHECKING:
    from localfab.config import Config

_KEYS = {"url", "api_key_env", "model", "timeout", "context"}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_url(url: str, where: str) -> str:
    """`url` as given, unless it carries a password (it would be shown and stored)."""
    netloc = url.split("://", 1)[-1].split("/", 1)[0]
    if "@" in netloc:
        raise UsageError(
            f"{where}: a URL with a user or password ({netloc.split('@')[-1]}) would be shown and "
            "stored with every chat; put the key in an environment variable and name it with "
            "api_key_env (--api-key-env)"
        )
    return url


def named_remotes(config: Config, where: str = "config.toml") -> dict[str, Remote]:
    """Every `[remotes.NAME]` table, checked: a mistake is a UsageError naming the table."""
    out: dict[str, Remote] = {}
    for name, table in config.remotes:
        out[name] = _remote(name, table, f"{where}: [remotes.{name}]")
    return out


def _remote(name: str, table: Any, where: str) -> Remote:
    if not isinstance(table, dict):
        raise UsageError(f"{where} must be a table with url = ...")
    if "api_key" in table:
        raise UsageError(
            f"{where}: api_key is not kept in config.toml; put the key in an environment "
            'variable and name it: api_key_env = "NAME"'
        )
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise UsageError(
            f"{where}: unknown key(s) {', '.join(unknown)}; known: url, api_key_env, model, timeout"
        )
    url = table.get("url")
    if not isinstance(url, str) or not url.strip():
        raise UsageError(f'{where} needs url = "http://host:port"')
    key_env = table.get("api_key_env", "")
    if not isinstance(key_env, str) or (key_env and not _ENV_NAME.match(key_env)):
        raise UsageError(f"{where}: api_key_env must name an environment variable, not {key_env!r}")
    model = table.get("model", "")
    if not isinstance(model, str):
        raise UsageError(f"{where}: model must be a string")
    timeout = table.get("timeout", READ_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise UsageError(f"{where}: timeout must be a number of seconds above 0")
    context = table.get("context", 0)
    if isinstance(context, bool) or not isinstance(context, int) or context < 0:
        raise UsageError(f"{where}: context must be a number of tokens")
    url = check_url(url.strip(), where)
    return Remote(url, name, model, key_env, float(timeout), context, keyring=True)


def resolve_remote(
    spec: str, config: Config, *, model: str | None = None, api_key_env: str | None = None
) -> Remote:
    """The remote `spec` names: a `[remotes.NAME]` table, else a URL; `model` and
    `api_key_env` given on the command line win over the table's."""
    remotes = named_remotes(config)
    remote = remotes.get(spec)
    if remote is None:
        if "://" not in spec and ":" not in spec and "." not in spec and spec != "localhost":
            known = ", ".join(sorted(remotes)) or "none"
            raise UsageError(
                f"no remote named {spec!r} in config.toml ([remotes.NAME]; named: {known}), and "
                "it is not a URL such as http://host:8080"
            )
        remote = Remote(check_url(spec.strip(), "--remote"))
    if api_key_env is not None:
        if api_key_env and not _ENV_NAME.match(api_key_env):
            raise UsageError(
                f"--api-key-env must name an environment variable, not {api_key_env!r}"
            )
        remote = replace(remote, api_key_env=api_key_env)
    return replace(remote, model=model) if model else remote
