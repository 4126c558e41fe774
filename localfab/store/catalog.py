"""The curated model catalog: short names (`qwen2.5:7b`) for known-good GGUF Q4_K_M files.

The catalog is data (`models/catalog.toml` at the top of the repository, shipped in the package
as `localfab._catalog`: see `localfab.resources`) so it can be reviewed and extended without
touching code. It is loaded and checked here: every entry must be complete, names must be unique
and safe, and file names must be plain `.gguf` names, because `localfab pull` trusts them to build
download paths.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localfab.errors import LocalfabError, UsageError
from localfab.resources import PackageDataError, catalog_text

# Model names: letters, digits and . _ - : +, starting with a letter or digit (`qwen2.5:7b`).
# `\Z`, not `$`: `$` also matches before a trailing newline, which would let "name\n" through.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,127}\Z")
# Hugging Face repo ids: owner/name with the characters the hub allows.
REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}\Z")


def is_repo_id(text: str) -> bool:
    """Whether `text` is a Hugging Face repo id (OWNER/NAME, no `..`): the one rule for all."""
    return bool(REPO_RE.match(text)) and ".." not in text


def check_repo_id(text: str) -> str:
    """`text` if it is a Hugging Face repo id, else the one `UsageError` every layer raises."""
    if not is_repo_id(text):
        raise UsageError(
            f"{text!r} is not a Hugging Face repo id: expected OWNER/NAME, e.g. "
            f"bartowski/Qwen2.5-7B-Instruct-GGUF"
        )
    return text


# A split GGUF part: `<stem>-00001-of-00003.gguf`.
SPLIT_RE = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf\Z", re.IGNORECASE)

_REQUIRED: dict[str, type] = {
    "name": str,
    "title": str,
    "repo": str,
    "files": list,
    "quant": str,
    "size_bytes": int,
    "params": str,
    "license": str,
    "context_length": int,
    "note": str,
}
_OPTIONAL: dict[str, type] = {"aliases": list, "vision": bool}


class CatalogError(LocalfabError):
    """The catalog file is missing or malformed (a packaging bug, not a user mistake)."""


@dataclass(frozen=True)
class CatalogEntry:
    """One curated model: where it lives on the hub and what to expect of it."""

    name: str
    title: str
    repo: str
    files: tuple[str, ...]
    quant: str
    size_bytes: int
    params: str
    license: str
    context_length: int
    note: str
    aliases: tuple[str, ...] = ()
    vision: bool = False  # reads images: `pull` also fetches the repo's projector (mmproj)

    @property
    def names(self) -> tuple[str, ...]:
        """The short name followed by its aliases."""
        return (self.name, *self.aliases)

    @property
    def page_url(self) -> str:
        """The model page on huggingface.co (where gated licences are accepted)."""
        return f"https://huggingface.co/{self.repo}"


@dataclass(frozen=True)
class Catalog:
    """All catalog entries, looked up by short name or alias (case-insensitive)."""

    entries: tuple[CatalogEntry, ...]
    path: Path | None = None  # None: the catalog shipped with localfab

    def get(self, name: str) -> CatalogEntry | None:
        """The entry called `name` (or with that alias), or None."""
        wanted = name.strip().casefold()
        for entry in self.entries:
            if any(n.casefold() == wanted for n in entry.names):
                return entry
        return None

    def __iter__(self) -> Iterator[CatalogEntry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.entries)


def load_catalog(path: Path | None = None) -> Catalog:
    """Read and validate the catalog (the shipped one unless `path` is given).

    Raise `CatalogError` naming the bad entry and field, or saying how to restore a missing one.
    """
    if path is None:
        try:
            text, source = catalog_text(), "localfab's model catalog"
        except PackageDataError as exc:
            raise CatalogError(
                f"{exc}; meanwhile pull models by repo, e.g. `localfab pull OWNER/REPO-GGUF`"
            ) from exc
    else:
        source = f"model catalog {path}"
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise CatalogError(f"{source} does not exist") from exc
        except UnicodeDecodeError as exc:
            raise CatalogError(f"{source} is not valid TOML: {exc}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{source} is not valid TOML: {exc}") from exc
    raw = data.get("model")
    if not isinstance(raw, list) or not raw:
        raise CatalogError(f"{source} has no [[model]] entries")
    entries = tuple(_entry(item, index, source) for index, item in enumerate(raw))
    seen: dict[str, str] = {}
    for entry in entries:
        for name in entry.names:
            key = name.casefold()
            if key in seen:
                raise CatalogError(
                    f"{source}: name {name!r} is used by both {seen[key]!r} and {entry.name!r}"
                )
            seen[key] = entry.name
    return Catalog(entries=entries, path=path)


def _check_fields(item: dict[str, Any], where: str) -> None:
    """Every required field present, non-empty and of its type; optional ones of theirs."""
    unknown = sorted(set(item) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise CatalogError(f"{where}: unknown field(s) {', '.join(unknown)}")
    for key, kind in _REQUIRED.items():
        value = item.get(key)
        if value is None:
            raise CatalogError(f"{where}: missing field {key!r}")
        if not isinstance(value, kind) or isinstance(value, bool):
            raise CatalogError(f"{where}: field {key!r} must be a {kind.__name__}")
        if isinstance(value, str) and not value.strip():
            raise CatalogError(f"{where}: field {key!r} is empty")
    for key, kind in _OPTIONAL.items():
        if key in item and not isinstance(item[key], kind):
            raise CatalogError(f"{where}: field {key!r} must be a {kind.__name__}")


def _check_names(item: dict[str, Any], where: str) -> None:
    for name in [item["name"], *item.get("aliases", [])]:
        if not isinstance(name, str) or not NAME_RE.match(name) or ".." in name:
            raise CatalogError(f"{where}: {name!r} is not a valid model name")
    try:
        check_repo_id(item["repo"])
    except UsageError as exc:
        raise CatalogError(f"{where}: {exc}") from None


def _check_files(files: list[Any], quant: str, where: str) -> None:
    """Plain .gguf names carrying the quant; several files only as the parts of one split."""
    if not files or not all(isinstance(f, str) for f in files):
        raise CatalogError(f"{where}: 'files' must list at least one file name")
    for file in files:
        if (
            "/" in file
            or "\\" in file
            or file.startswith(".")
            or not file.lower().endswith(".gguf")
        ):
            raise CatalogError(f"{where}: {file!r} is not a plain .gguf file name")
        if quant.casefold() not in file.casefold():
            raise CatalogError(f"{where}: {file!r} does not carry the quant {quant!r}")
    if len(files) > 1:
        parts = [SPLIT_RE.match(f) for f in files]
        if not all(parts) or [int(m.group("part")) for m in parts if m] != list(
            range(1, len(files) + 1)
        ):
            raise CatalogError(f"{where}: several files must be the parts -00001-of-N.. in order")


def _entry(item: Any, index: int, source: str) -> CatalogEntry:
    where = f"{source}, entry {index + 1}"
    if not isinstance(item, dict):
        raise CatalogError(f"{where} is not a table")
    if isinstance(item.get("name"), str):
        where += f" ({item['name']})"
    _check_fields(item, where)
    _check_names(item, where)
    _check_files(item["files"], item["quant"], where)
    if item["size_bytes"] <= 0 or item["context_length"] <= 0:
        raise CatalogError(f"{where}: size_bytes and context_length must be positive")
    return CatalogEntry(
        name=item["name"],
        title=item["title"],
        repo=item["repo"],
        files=tuple(item["files"]),
        quant=item["quant"],
        size_bytes=item["size_bytes"],
        params=item["params"],
        license=item["license"],
        context_length=item["context_length"],
        note=item["note"],
        aliases=tuple(item.get("aliases", ())),
        vision=bool(item.get("vision", False)),
    )
