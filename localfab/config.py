"""Where localfab keeps its files, and the user's settings.

Paths come from platformdirs; `LOCALFAB_HOME` puts everything (config, data, cache) under one
folder, which is how tests and portable installs redirect them. Settings come from `config.toml`
in the config folder, then from `LOCALFAB_*` environment variables, then from command-line options.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import platformdirs

from localfab.errors import UsageError
from localfab.units import SAMPLING

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
    def prompt_cache_dir(self) -> Path:
        """Saved KV states of prompts (the prompt cache's disk tier)."""
        return self.cache_dir / "prompts"

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
    max_tokens: int = field(
        default=-1,
        metadata={
            "doc": "reply length limit when -n is not given (a reply cut at it is continued "
            "max_continues times); -1 means no limit"
        },
    )
    temperature: float = field(
        default=SAMPLING.temperature, metadata={"doc": "sampling temperature"}
    )
    top_k: int = field(default=SAMPLING.top_k, metadata={"doc": "top-k sampling; 0 disables"})
    top_p: float = field(default=SAMPLING.top_p, metadata={"doc": "nucleus sampling; 1.0 disables"})
    min_p: float = field(default=SAMPLING.min_p, metadata={"doc": "min-p sampling; 0.0 disables"})
    repeat_penalty: float = field(default=SAMPLING.repeat_penalty, metadata={"doc": "1.0 disables"})
    threads: int = field(default=0, metadata={"doc": "CPU threads; 0 means physical cores"})
    max_continues: int = field(
        default=3, metadata={"doc": "times a reply cut at the token limit is continued"}
    )
    flash_attn: str = field(default="auto", metadata={"doc": "auto, on or off"})
    thinking: str = field(
        default="auto",
        metadata={
            "doc": "a thinking model's thinking in the chat app: on, off, or auto (the chat "
            "template's default); each chat can change it from the command palette"
        },
    )
    reasoning_budget: int = field(
        default=-1,
        metadata={
            "doc": "tokens a thinking model may think before its answer in the chat app "
            "(-1: no limit, 0: answer at once)"
        },
    )
    tool_rounds: int = field(
        default=5,
        metadata={
            "doc": "rounds of tool calls (MCP) one message may lead to in the chat app; then "
            "the model answers without tools"
        },
    )
    theme: str = field(
        default="", metadata={"doc": "the terminal app's theme by name; empty: localfab-dark"}
    )
    image_previews: str = field(
        default="auto",
        metadata={
            "doc": "pictures of a message's images in the chat app: auto (Sixel or kitty's "
            "graphics where the terminal draws them, else coloured half cells), halfcell, or "
            "off (the chips' names alone)"
        },
    )
    ledger: bool = field(
        default=True,
        metadata={
            "doc": "record every reply's figures (never its text) in the usage ledger "
            "(localfab stats); false turns it off"
        },
    )
    prompt_cache: bool = field(
        default=True,
        metadata={
            "doc": "keep prompts' KV states on disk (the cache folder) so that a reopened chat "
            "or another question about the same piped document is not processed again; "
            "false turns it off (run --no-prompt-cache for one run)"
        },
    )
    prompt_cache_disk: int = field(
        default=4096,
        metadata={"doc": "MiB the prompt cache may take on disk (the least recently used go)"},
    )
    keys: tuple[tuple[str, str], ...] = field(
        default=(),
        metadata={
            "doc": "the terminal app's keys by action id, from the [keys] table of config.toml "
            '(stop = "ctrl+x", or "chat.stop" = "ctrl+x"; several keys: "f2,ctrl+e"); '
            "not settable from the environment"
        },
    )

    speculative: tuple[tuple[str, Any], ...] = field(
        default=(),
        metadata={
            "doc": "speculative decoding, from the [speculative] table of config.toml, with "
            'the names of localfab run\'s flags: spec_type = "ngram-simple" (or none, '
            'draft-simple), model_draft = "FILE", draft_max, draft_min, draft_p_min, '
            "gpu_layers_draft, spec_exact (false: longer drafts, text may differ at near "
            "ties); not settable from the environment"
        },
    )

    mcp: tuple[tuple[str, Any], ...] = field(
        default=(),
        metadata={
            "doc": "MCP tool servers for the chat app, from the [mcp] table of config.toml: "
            "[mcp.servers.NAME] with command, args, env, cwd (a program) or url, headers, and "
            "timeout, enabled, tools (only these); files = [paths of mcpServers JSON files]; "
            "not settable from the environment"
        },
    )

    remotes: tuple[tuple[str, Any], ...] = field(
        default=(),
        metadata={
            "doc": "remote model servers for `localfab chat --remote NAME` and `run --remote "
            "NAME`, from [remotes.NAME] tables of config.toml: url, api_key_env (the "
            "environment variable holding its key; keys are never stored here), model, "
            "timeout; not settable from the environment"
        },
    )

    @classmethod
    def load(cls, paths: Paths, env: Mapping[str, str] | None = None) -> Config:
        """Read config.toml (if any) and apply environment overrides.

        Raises `UsageError` naming the file (or variable) and the setting for a value of the
        wrong type or out of range, so a typo never reaches the engine.
        """
        environ: Mapping[str, str] = os.environ if env is None else env
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        if paths.config_file.is_file():
            try:
                values.update(tomllib.loads(paths.config_file.read_text(encoding="utf-8")))
            except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
                raise UsageError(
                    f"{paths.config_file} is not valid TOML ({exc}): fix or delete it"
                ) from exc
            sources = {name: str(paths.config_file) for name in values}
        keys = parse_keys(values.pop("keys", {}), where=str(paths.config_file))
        speculative = parse_speculative(values.pop("speculative", {}), where=str(paths.config_file))
        mcp = values.pop("mcp", {})
        if not isinstance(mcp, dict):
            raise UsageError(f"{paths.config_file}: mcp must be a table ([mcp.servers.NAME])")
        remotes = values.pop("remotes", {})
        if not isinstance(remotes, dict):
            raise UsageError(f"{paths.config_file}: remotes must be tables ([remotes.NAME])")
        known = {f.name: f for f in fields(cls) if f.name not in _TABLES}
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
                sources[name] = key
        config = cls()
        converted: dict[str, Any] = {}
        for name, raw in values.items():
            where = sources[name]
            value = _convert(name, raw, type(getattr(config, name)), where)
            _check_range(name, value, where)
            converted[name] = value
        return replace(
            config,
            keys=keys,
            speculative=speculative,
            mcp=tuple(mcp.items()),
            remotes=tuple(remotes.items()),
            **converted,
        )


def parse_keys(raw: Any, *, where: str = "config.toml") -> tuple[tuple[str, str], ...]:
    """The [keys] table as (action id, keys) pairs, in the file's order.

    Dotted ids may be written quoted ("chat.stop" = ...) or as nested tables ([keys.chat]);
    both give "chat.stop". Only the shape is checked here: whether an id names an action and
    whether a key name exists is for the app to say (it knows its actions and keys).
    """
    if not isinstance(raw, dict):
        raise UsageError(
            f'{where}: keys must be a table of action ids and key names ([keys] stop = "ctrl+x"), '
            f"not {raw!r}"
        )
    out: list[tuple[str, str]] = []
    for name, value in raw.items():
        if isinstance(value, dict):
            out += [(f"{name}.{n}", v) for n, v in parse_keys(value, where=where)]
        elif isinstance(value, str) and value.strip():
            out.append((str(name), value.strip()))
        else:
            raise UsageError(
                f'{where}: keys.{name} must be key names such as "ctrl+x" or "f2,ctrl+e", '
                f"not {value!r}"
            )
    return tuple(out)


# Settings that are tables of config.toml rather than single values.
_TABLES = ("keys", "speculative", "mcp", "remotes")
# The [speculative] table: each key's type and allowed range (None: any value of the type).
SPECULATIVE_KEYS: dict[str, tuple[type, tuple[float, float] | None]] = {
    "spec_type": (str, None),
    "model_draft": (str, None),
    "draft_max": (int, (1, 64)),
    "draft_min": (int, (0, 64)),
    "draft_p_min": (float, (0.0, 1.0)),
    "gpu_layers_draft": (int, (-1, 1 << 16)),
    "spec_exact": (bool, None),
}
SPEC_TYPE_NAMES = ("none", "ngram-simple", "draft-simple")


def parse_speculative(raw: Any, *, where: str = "config.toml") -> tuple[tuple[str, Any], ...]:
    """The [speculative] table as (name, value) pairs, each value checked."""
    if not isinstance(raw, dict):
        raise UsageError(
            f'{where}: speculative must be a table ([speculative] spec_type = "ngram-simple"), '
            f"not {raw!r}"
        )
    out: list[tuple[str, Any]] = []
    for name, value in raw.items():
        if name not in SPECULATIVE_KEYS:
            raise UsageError(
                f"{where}: unknown setting speculative.{name}; known: {', '.join(SPECULATIVE_KEYS)}"
            )
        kind, limits = SPECULATIVE_KEYS[name]
        value = _convert(f"speculative.{name}", value, kind, where)
        if limits is not None and not limits[0] <= value <= limits[1]:
            raise UsageError(
                f"{where}: speculative.{name} must be {limits[0]} to {limits[1]}, not {value}"
            )
        if name == "spec_type" and value not in SPEC_TYPE_NAMES:
            raise UsageError(
                f"{where}: speculative.spec_type must be one of {', '.join(SPEC_TYPE_NAMES)}, "
                f"not {value!r}"
            )
        out.append((str(name), value))
    return tuple(out)


def check_setting(name: str, raw: Any, *, where: str = "config.toml") -> Any:
    """One setting's value converted and checked as `Config.load` does; `UsageError` if not."""
    known = {f.name: f for f in fields(Config) if f.name not in _TABLES}
    if name in _TABLES:
        raise UsageError(f"{where}: {name} are set in the [{name}] table of config.toml")
    if name not in known:
        raise UsageError(f"{where}: unknown setting {name}; known: {', '.join(known)}")
    value = _convert(name, raw, type(getattr(Config(), name)), where)
    _check_range(name, value, where)
    return value


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


_TABLE_HEADER = re.compile(r"^\s*\[")


def save_settings(paths: Paths, changes: Mapping[str, Any]) -> Config:
    """Write `changes` to config.toml, keeping every other line (comments and settings) as is.

    Each value is checked first, so nothing invalid is written: a `UsageError` names the
    setting. A setting already in the file has its line replaced; a new one is appended.
    Returns the settings as loaded from the file afterwards.
    """
    checked = {name: check_setting(name, raw) for name, raw in changes.items()}
    path = paths.config_file
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    if text:
        try:
            tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"{path} is not valid TOML ({exc}): fix or delete it") from exc
    lines = text.splitlines()
    for name, value in checked.items():
        line = f"{name} = {_toml_value(value)}"
        pattern = re.compile(rf"^\s*{re.escape(name)}\s*=")
        # Settings live above the first table ([keys]); a line below it belongs to the table.
        top = next((i for i, old in enumerate(lines) if _TABLE_HEADER.match(old)), len(lines))
        at = next((i for i, old in enumerate(lines[:top]) if pattern.match(old)), None)
        if at is not None:
            lines[at] = line
        elif top < len(lines):
            lines.insert(top, line)
        else:
            lines.append(line)
    new_text = "\n".join(lines) + "\n"
    tomllib.loads(new_text)  # what was written must read back
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".toml.tmp")
    tmp.write_text(new_text, encoding="utf-8")
    tmp.replace(path)
    return Config.load(paths)


def append_to_config(paths: Paths, block: str) -> None:
    """Append TOML `block` (tables) to config.toml; the file must read back afterwards, and a
    file that is not valid TOML before is left alone (`UsageError`)."""
    path = paths.config_file
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path} is not valid TOML ({exc}): fix or delete it") from exc
    new_text = (text.rstrip("\n") + "\n\n" if text.strip() else "") + block
    try:
        tomllib.loads(new_text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: the new settings do not fit with what is there ({exc})") from exc
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".toml.tmp")
    tmp.write_text(new_text, encoding="utf-8")
    tmp.replace(path)


# The most threads ggml can run (GGML_MAX_N_THREADS in ggml.h); more would overrun its arrays.
MAX_THREADS = 512
# Accepted ranges: (lowest, highest, what the message says is allowed).
_RANGES: dict[str, tuple[float, float, str]] = {
    "ctx_size": (0, 1 << 24, "0 (the planner chooses) or a number of tokens"),
    "min_ctx": (0, 1 << 24, "0 or a number of tokens"),
    "max_tokens": (-1, 1 << 31, "-1 (no limit) or a positive number of tokens"),
    "temperature": (0.0, 100.0, "a number from 0 (greedy) to 100"),
    "top_k": (0, 1 << 31, "0 (disabled) or a positive number"),
    "top_p": (0.0, 1.0, "a number from 0 to 1"),
    "min_p": (0.0, 1.0, "a number from 0 to 1"),
    "repeat_penalty": (0.0, 100.0, "a number from 0 to 100 (1.0 disables)"),
    "max_continues": (0, 1000, "0 (never continue) or a small positive number"),
    "tool_rounds": (1, 100, "a number of rounds, 1 to 100"),
    "prompt_cache_disk": (0, 1 << 30, "0 (nothing on disk) or a number of MiB"),
    "reasoning_budget": (-1, 1 << 31, "-1 (no limit), 0 or a number of tokens"),
}
_FLASH_ATTN = ("auto", "on", "off")
_PREVIEWS = ("auto", "halfcell", "off")  # localfab.tui.previews.detect's modes
_CHOICES = {"flash_attn": _FLASH_ATTN, "thinking": _FLASH_ATTN, "image_previews": _PREVIEWS}


def _convert(name: str, raw: Any, kind: type, where: str) -> Any:
    """`raw` (TOML value or environment string) as `kind`, refusing lossy or non-finite values."""
    shown = raw if isinstance(raw, str) else repr(raw)
    if kind is bool:
        return _convert_bool(name, raw, shown, where)
    if isinstance(raw, bool | dict | list):
        raise UsageError(f"{where}: {name} must be a {_KIND_WORDS[kind]}, not {shown}")
    try:
        if kind is int:
            if isinstance(raw, float):
                if not math.isfinite(raw) or not raw.is_integer():
                    raise ValueError(raw)
                return int(raw)
            return int(str(raw).strip())
        if kind is float:
            number = float(str(raw).strip()) if isinstance(raw, str) else float(raw)
            if not math.isfinite(number):
                raise ValueError(raw)
            return number
        text = str(raw).strip()
    except (TypeError, ValueError, OverflowError) as exc:
        raise UsageError(f"{where}: {name} must be a {_KIND_WORDS[kind]}, not {shown}") from exc
    choices = _CHOICES.get(name)
    if choices is None:
        return text
    if text.lower() not in choices:
        words = ", ".join(choices[:-1]) + f" or {choices[-1]}"
        raise UsageError(f"{where}: {name} must be {words}, not {shown}")
    return text.lower()


_KIND_WORDS: dict[type, str] = {
    int: "whole number",
    float: "finite number",
    str: "string",
    bool: "true or false",
}


def _convert_bool(name: str, raw: Any, shown: str, where: str) -> bool:
    """A TOML boolean, or an environment word: 1/true/yes/on, 0/false/no/off."""
    if isinstance(raw, bool):
        return raw
    word = str(raw).strip().lower() if isinstance(raw, str) else ""
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise UsageError(f"{where}: {name} must be true or false, not {shown}")


def _check_range(name: str, value: Any, where: str) -> None:
    if name == "threads":
        check_threads(value, source=f"{where}: threads")
        return
    limits = _RANGES.get(name)
    if limits is None:
        return
    low, high, allowed = limits
    if not low <= value <= high or (name == "max_tokens" and value == 0):
        raise UsageError(f"{where}: {name} must be {allowed}, not {value}")


def check_threads(value: int | None, *, source: str = "threads") -> int:
    """The one rule for CPU thread counts: 0 (auto) for None, 0 or -1, else 1..MAX_THREADS.

    -1 means "physical cores" as in llama.cpp; anything else below 1 or above `MAX_THREADS` is
    a `UsageError` (llama.cpp crashes on such values instead of refusing them).
    """
    if value is None or value in (0, -1):
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_THREADS:
        raise UsageError(
            f"{source} must be 1 to {MAX_THREADS}, or 0 or -1 for one thread per physical core, "
            f"not {value}"
        )
    return value
