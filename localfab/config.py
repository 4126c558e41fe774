"""Where localfab keeps its files, and the user's settings.

Paths come from platformdirs; `LOCALFAB_HOME` puts everything (config, data, cache) under one
folder, which is how tests and portable installs redirect them. Settings come from `config.toml`
in the config folder, then from `LOCALFAB_*` environment variables, then from command-line options.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import platformdirs

from localfab.errors import UsageError

APP_NAME = "localfab"


@dataclass(frozen=True)
class Paths:
    """The folders localfab reads and writes."""

    config_dir: Path
    data_dir: Path
    cache_dir: Path

    @property
    def config_file(self) -> Path:
        return self.config_dir / "config.toml"

    @property
    def models_dir(self) -> Path:
        """Downloaded GGUF files, one folder per Hugging Face repo."""
        return self.data_dir / "models"

    @property
    def registry_file(self) -> Path:
        """The index of registered models (downloaded or added by path)."""
        return self.data_dir / "models.json"

    @property
    def sessions_db(self) -> Path:
        """Chat sessions (SQLite)."""
        return self.data_dir / "sessions.sqlite3"

    @property
    def themes_dir(self) -> Path:
        """User themes, in the same format as the built-in ones."""
        return self.config_dir / "themes"


def default_paths(env: Mapping[str, str] | None = None) -> Paths:
    """Paths for this user; `LOCALFAB_HOME` overrides all of them."""
    home = (os.environ if env is None else env).get("LOCALFAB_HOME")
    if home:
        root = Path(home).expanduser()
        return Paths(config_dir=root / "config", data_dir=root / "data", cache_dir=root / "cache")
    return Paths(
        config_dir=Path(platformdirs.user_config_dir(APP_NAME)),
        data_dir=Path(platformdirs.user_data_dir(APP_NAME)),
        cache_dir=Path(platformdirs.user_cache_dir(APP_NAME)),
    )


@dataclass(frozen=True)
class Config:
    """User settings. Each field can be set in config.toml or as LOCALFAB_<FIELD> (upper case)."""

    ctx_size: int = field(default=0, metadata={"doc": "context window; 0 lets the planner choose"})
    min_ctx: int = field(
        default=4096, metadata={"doc": "the planner never lowers the context below this"}
    )
    max_tokens: int = field(default=-1, metadata={"doc": "reply length limit; -1 means no limit"})
    temperature: float = field(default=0.8, metadata={"doc": "sampling temperature"})
    top_k: int = field(default=40, metadata={"doc": "top-k sampling; 0 disables"})
    top_p: float = field(default=0.95, metadata={"doc": "nucleus sampling; 1.0 disables"})
    min_p: float = field(default=0.05, metadata={"doc": "min-p sampling; 0.0 disables"})
    repeat_penalty: float = field(default=1.0, metadata={"doc": "1.0 disables"})
    threads: int = field(default=0, metadata={"doc": "CPU threads; 0 means physical cores"})
    max_continues: int = field(
        default=3, metadata={"doc": "times a reply cut at the token limit is continued"}
    )
    flash_attn: str = field(default="auto", metadata={"doc": "auto, on or off"})

    @classmethod
    def load(cls, paths: Paths, env: Mapping[str, str] | None = None) -> Config:
        """Read config.toml (if any) and apply environment overrides."""
        environ: Mapping[str, str] = os.environ if env is None else env
        values: dict[str, Any] = {}
        if paths.config_file.is_file():
            try:
                values.update(tomllib.loads(paths.config_file.read_text(encoding="utf-8")))
            except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
                raise UsageError(
                    f"{paths.config_file} is not valid TOML ({exc}): fix or delete it"
                ) from exc
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise UsageError(
                f"{paths.config_file}: unknown setting(s) {', '.join(unknown)}; "
                f"known: {', '.join(known)}"
            )
        for name in known:
            key = f"LOCALFAB_{name.upper()}"
            if key in environ:
                values[name] = environ[key]
        config = cls()
        converted: dict[str, Any] = {}
        for name, raw in values.items():
            kind = type(getattr(config, name))
            try:
                converted[name] = kind(raw)
            except (TypeError, ValueError) as exc:
                raise UsageError(f"setting {name}={raw!r} is not a valid {kind.__name__}") from exc
        return replace(config, **converted)
