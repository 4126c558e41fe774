"""A registered model as the registry stores it, checked field by field when read back."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from localfab.store.naming import has_control_chars, is_valid_name

Source = Literal["hub", "local", "embedded"]
SOURCES: tuple[Source, ...] = ("hub", "local", "embedded")


@dataclass(frozen=True)
class ModelEntry:
    """A registered model. `path` is the file llama.cpp opens (the first part of a split model).

    `source` is "hub" for downloads (the store owns the files and `remove` deletes them), "local"
    for files added by path (left in place), or "embedded" for the bundled test model.
    """

    name: str
    path: Path
    files: tuple[Path, ...]
    size: int | None
    quant: str | None
    arch: str | None
    source: Source
    repo: str | None = None
    revision: str | None = None
    sha256: tuple[str, ...] = ()
    added: float | None = None
    last_used: float | None = None
    projector: Path | None = None  # its vision projector (mmproj), fetched with it
    present: bool = field(default=True, compare=False)

    @property
    def owned_files(self) -> tuple[Path, ...]:
        """The model's files and its projector's (what `remove` deletes, if owned)."""
        return (*self.files, *([self.projector] if self.projector else []))

    @property
    def vision(self) -> bool:
        """Whether it reads images: its projector came with it and is there."""
        return self.projector is not None and self.projector.is_file()

    @property
    def owned(self) -> bool:
        """Whether the store owns the files (and `remove` deletes them)."""
        return self.source in ("hub", "embedded")

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "files": [str(p) for p in self.files],
            "size": self.size,
            "quant": self.quant,
            "arch": self.arch,
            "source": self.source,
            "repo": self.repo,
            "revision": self.revision,
            "sha256": list(self.sha256),
            "added": self.added,
            "last_used": self.last_used,
            **({"projector": str(self.projector)} if self.projector else {}),
        }

    @classmethod
    def from_json(cls, name: str, data: Any) -> ModelEntry:
        """The entry from its registry JSON; `ValueError` says what is wrong with a bad one.

        The registry is a file users (and other versions) can edit: every field is checked, so a
        damaged entry is skipped with a warning instead of crashing whoever reads it.
        """
        if not is_valid_name(name):
            raise ValueError("the name is not a valid model name")
        if not isinstance(data, dict):
            raise ValueError(f"it is a {type(data).__name__}, not an object")
        path = _json_path(data.get("path"), "path")
        raw_files = data.get("files") or [str(path)]
        if not isinstance(raw_files, list):
            raise ValueError("files is not a list")
        files = tuple(_json_path(p, "files") for p in raw_files)
        sha256 = data.get("sha256") or []
        if not isinstance(sha256, list) or not all(isinstance(h, str) for h in sha256):
            raise ValueError("sha256 is not a list of strings")
        source = data.get("source", "local")
        if source not in SOURCES:
            raise ValueError(f"source is {source!r}, not one of {', '.join(SOURCES)}")
        return cls(
            name=name,
            path=path,
            files=files,
            size=_json_field(data, "size", int),
            quant=_json_field(data, "quant", str),
            arch=_json_field(data, "arch", str),
            source=cast(Source, source),
            repo=_json_field(data, "repo", str),
            revision=_json_field(data, "revision", str),
            sha256=tuple(sha256),
            added=_json_field(data, "added", float),
            last_used=_json_field(data, "last_used", float),
            projector=_json_path(data["projector"], "projector") if data.get("projector") else None,
        )


@dataclass(frozen=True)
class RemovedModel:
    """What `Store.remove` did: files deleted (and bytes freed), files left in place."""

    name: str
    deleted: tuple[Path, ...]
    kept: tuple[Path, ...]
    bytes_freed: int


def with_disk_state(entry: ModelEntry) -> ModelEntry:
    """`entry` with `present` (every file is there) and the size on disk when it is."""
    from dataclasses import replace

    present = all(p.is_file() for p in entry.files)
    size = sum(p.stat().st_size for p in entry.files) if present else entry.size
    return replace(entry, present=present, size=size)


def _json_path(value: Any, key: str) -> Path:
    if not isinstance(value, str) or not value or has_control_chars(value):
        raise ValueError(f"{key} is {_describe(value)}, not a file path")
    return Path(value)


def _json_field(data: dict[str, Any], key: str, kind: type) -> Any:
    value = data.get(key)
    if value is None:
        return None
    ok = (
        isinstance(value, int | float) and not isinstance(value, bool)
        if kind is float
        else isinstance(value, kind) and not isinstance(value, bool)
    )
    bad_text = kind is str and ok and has_control_chars(value)  # it is printed as it is
    if not ok or bad_text or (kind is int and value < 0):
        raise ValueError(f"{key} is {_describe(value)}")
    return value


def _describe(value: Any) -> str:
    if value is None:
        return "missing"
    shown = repr(value)
    return f"{type(value).__name__} {shown[:40]}{'...' if len(shown) > 40 else ''}"
