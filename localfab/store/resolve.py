"""From what the user typed to a GGUF file: paths, names, repos, catalog names, suggestions."""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from localfab.errors import LocalfabError, ModelError, ModelNotFound
from localfab.store.catalog import REPO_RE, Catalog, load_catalog
from localfab.store.entry import ModelEntry
from localfab.store.files import existing_file
from localfab.store.registry import Models, Registry, find_key
from localfab.units import format_bytes


class StoreView(Protocol):
    """What resolving a name reads of the store (`localfab.store.core.Store` is the one)."""

    registry: Registry

    def virtuals(self) -> list[ModelEntry]: ...

    def virtual(self, name: str) -> ModelEntry | None: ...

    def materialise(self, entry: ModelEntry) -> Path: ...

    def missing_virtual(self, name: str) -> str | None: ...


def looks_like_path(text: str) -> bool:
    """Whether `text` is meant as a file path rather than a name (`OWNER/REPO` is a name)."""
    repo_like = bool(REPO_RE.match(text.partition(":")[0])) and not text.endswith(".gguf")
    return not repo_like and (
        os.sep in text
        or "/" in text
        or text.lower().endswith(".gguf")
        or text.startswith((".", "~"))
    )


def resolve(store: StoreView, name: str) -> Path:
    """The GGUF file to open for `name`: a path, a registered or virtual name, a repo or
    catalog name that was downloaded; `ModelNotFound` with the next step otherwise."""
    text = name.strip()
    if looks_like_path(text):
        return existing_file(Path(text).expanduser())
    models = store.registry.read()
    key = find_key(models, text)
    if key is not None:
        try:
            return present_path(ModelEntry.from_json(key, models[key]))
        except ValueError as exc:
            raise ModelError(
                f"the registry entry {ascii(key)} is damaged ({exc}): `localfab rm {key}` "
                f"forgets it; then `localfab add PATH` or `localfab pull` registers the "
                f"model again"
            ) from exc
    virtual = store.virtual(text)
    if virtual is not None:
        return store.materialise(virtual)
    entries = store.registry.entries(models).values()
    found = by_repo(entries, text) or by_catalog(entries, text)
    if found is not None:
        return present_path(found)
    if os.path.lexists(text) and not Path(text).is_dir():
        return existing_file(Path(text))  # a FIFO or a device is named as such, not "unknown"
    raise ModelNotFound(not_found_message(store, text, models))


def by_repo(entries: Iterable[ModelEntry], text: str) -> ModelEntry | None:
    """A download found by `OWNER/REPO[:QUANT]` (default quant Q4_K_M)."""
    repo, _, quant = text.partition(":")
    if not REPO_RE.match(repo):
        return None
    quant = (quant or "Q4_K_M").upper()
    for entry in entries:
        if (entry.repo or "").casefold() == repo.casefold() and (entry.quant or "") == quant:
            return entry
    return None


def by_catalog(entries: Iterable[ModelEntry], text: str) -> ModelEntry | None:
    """A download registered under another name but pulled from this catalog entry."""
    catalog = _catalog()
    item = catalog.get(text) if catalog is not None else None
    if item is None:
        return None
    for entry in entries:
        if entry.repo == item.repo and entry.files and entry.files[0].name == item.files[0]:
            return entry
    return None


def not_found_message(store: StoreView, text: str, models: Models) -> str:
    """What to do when nothing is called `text`: pull it, or did you mean a close name."""
    missing = store.missing_virtual(text)
    if missing is not None:
        return missing
    known = [*store.registry.entries(models), *(e.name for e in store.virtuals())]
    message = f"no model called {text!r} on this machine"
    catalog = _catalog()
    item = catalog.get(text) if catalog is not None else None
    if item is not None:
        return (
            f"{message}; it is in the catalog ({item.title}, "
            f"{format_bytes(item.size_bytes)}): run `localfab pull {item.name}`"
        )
    names = known + list(catalog.names if catalog is not None else [])
    close = difflib.get_close_matches(text, names, 3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return (
        f"{message}{hint}: `localfab list` shows the models you have; `localfab pull NAME` "
        f"downloads one (a catalog name, OWNER/REPO[:QUANT] or a Hugging Face URL), "
        f"`localfab add PATH` registers a .gguf file you already have"
    )


def present_path(entry: ModelEntry) -> Path:
    """The entry's path if every file is there, else `ModelNotFound` saying how to fix it."""
    missing = [p for p in entry.files if not p.is_file()]
    if missing:
        again = f"localfab pull {entry.repo}" if entry.repo else f"localfab add {missing[0]}"
        raise ModelNotFound(
            f"model {entry.name!r} is registered but {missing[0]} is gone: run `{again}` to get "
            f"it back, or `localfab rm {entry.name}` to forget it"
        )
    return entry.path


def _catalog() -> Catalog | None:
    try:
        return load_catalog()
    except LocalfabError:
        return None
