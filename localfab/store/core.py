"""`Store`: the models on this machine, under which names, and where their files are."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from localfab.config import Paths, default_paths
from localfab.errors import LocalfabError, ModelNotFound, UsageError
from localfab.store import resolve as _resolve
from localfab.store import virtual as _virtual
from localfab.store.entry import ModelEntry, RemovedModel, with_disk_state
from localfab.store.files import PARTIAL_DIR, existing_file, remove_if_empty, split_parts
from localfab.store.naming import (
    default_name,
    gguf_summary,
    safe_file_name,
    safe_repo_dir,
    validate_name,
)
from localfab.store.registry import Models, Registry, find_key

log = logging.getLogger("localfab.store")


class Store:
    """The models on this machine: downloads under `paths.models_dir` and files added by path,
    plus virtual entries (the embedded test model) that need no registry entry."""

    def __init__(self, paths: Paths | None = None) -> None:
        self.paths = default_paths() if paths is None else paths
        self.registry = Registry(self.paths.registry_file, models_dir=self.paths.models_dir)

    # locations ---------------------------------------------------------------------------------
    @property
    def models_dir(self) -> Path:
        return self.paths.models_dir

    def repo_dir(self, repo: str) -> Path:
        """Where files downloaded from `repo` are kept."""
        return self.models_dir / safe_repo_dir(repo)

    def download_path(self, repo: str, repo_file: str) -> Path:
        """The final path of a repo file once downloaded and verified."""
        return self.repo_dir(repo) / safe_file_name(repo_file)

    def partial_path(self, repo: str, repo_file: str, sha256: str) -> Path:
        """Where an unfinished download of that exact file (by hash) is kept until complete."""
        tag = re.sub(r"[^0-9a-f]", "", sha256.lower())[:16] or "unknown"
        return self.repo_dir(repo) / PARTIAL_DIR / f"{safe_file_name(repo_file)}.{tag}.partial"

    def lock_path(self, repo: str, repo_file: str) -> Path:
        """The lock that lets one process at a time download (or check) that repo file."""
        return self.repo_dir(repo) / PARTIAL_DIR / f"{safe_file_name(repo_file)}.lock"

    def partial_files(self) -> list[Path]:
        """Unfinished downloads (kept so `localfab pull` can resume them)."""
        if not self.models_dir.is_dir():
            return []
        return sorted(self.models_dir.glob(f"*/{PARTIAL_DIR}/*.partial"))

    # virtual entries ---------------------------------------------------------------------------
    def virtuals(self) -> list[ModelEntry]:
        """Entries that need no registration (the embedded test model, when installed)."""
        return _virtual.virtual_entries(self.paths)

    def virtual(self, name: str) -> ModelEntry | None:
        """The virtual entry called `name` (case-insensitive), or None."""
        wanted = name.strip().casefold()
        return next((e for e in self.virtuals() if e.name.casefold() == wanted), None)

    def materialise(self, entry: ModelEntry) -> Path:
        """The file of a virtual entry, written out on first use."""
        return _virtual.materialise(entry, self.paths)

    def missing_virtual(self, name: str) -> str | None:
        """Why `name`, a virtual entry's name, is not available here, or None."""
        return _virtual.missing_virtual(name)

    # queries -----------------------------------------------------------------------------------
    def get(self, name: str) -> ModelEntry | None:
        """The entry called `name` (case-insensitive; registered first, then virtual), or None.

        A damaged registry entry is None here: `resolve` says so, `damaged` lets `rm` forget it.
        """
        models = self.registry.read()
        key = find_key(models, name)
        if key is None:
            return self.virtual(name)
        try:
            return with_disk_state(ModelEntry.from_json(key, models[key]))
        except ValueError:
            return None

    def damaged(self, name: str) -> str | None:
        """The registry key of a damaged entry called `name` (so `rm` can forget it), or None."""
        models = self.registry.read()
        key = find_key(models, name)
        if key is None:
            return None
        try:
            ModelEntry.from_json(key, models[key])
        except ValueError:
            return key
        return None

    def list(self) -> list[ModelEntry]:
        """Every registered model, plus the virtual ones no registered entry shadows."""
        entries = [with_disk_state(e) for e in self._entries().values()]
        names = {e.name.casefold() for e in entries}
        entries += [e for e in self.virtuals() if e.name.casefold() not in names]
        return sorted(entries, key=lambda e: e.name)

    def find(self, *, repo: str, files: Sequence[str]) -> ModelEntry | None:
        """The downloaded model made of exactly these repo files, if registered."""
        wanted = [safe_file_name(f) for f in files]
        for entry in self._entries().values():
            if entry.repo == repo and [p.name for p in entry.files] == wanted:
                return with_disk_state(entry)
        return None

    def resolve(self, name: str) -> Path:
        """The GGUF file to open for `name`: a path, a registered name, or a virtual entry.

        Raises `ModelNotFound` with the next step (`localfab list`, `localfab pull`) otherwise.
        """
        return _resolve.resolve(self, name)

    def _entries(self, models: Models | None = None) -> dict[str, ModelEntry]:
        return self.registry.entries(self.registry.read() if models is None else models)

    # changes -----------------------------------------------------------------------------------
    def add(self, path: str | os.PathLike[str], name: str | None = None) -> ModelEntry:
        """Register a GGUF file where it is (nothing is copied); returns the new entry.

        Raises `ModelError` if the file is missing or not a readable GGUF model, and `UsageError`
        if the name is invalid or already names another model.
        """
        file = existing_file(Path(path).expanduser())
        arch, quant = gguf_summary(file)
        files = split_parts(file)
        entry = ModelEntry(
            name=validate_name(name if name is not None else default_name(file)),
            path=file,
            files=files,
            size=sum(p.stat().st_size for p in files),
            quant=quant,
            arch=arch,
            source="local",
            added=time.time(),
        )
        return self._put(entry)

    def register_download(
        self,
        name: str,
        files: Sequence[Path],
        *,
        repo: str,
        revision: str | None,
        sha256: Sequence[str],
        quant: str | None = None,
        projector: Path | None = None,
    ) -> ModelEntry:
        """Register files that `hub` downloaded into this store and verified (`projector`:
        the model's vision projector, downloaded with it)."""
        paths = tuple(Path(f) for f in files)
        if not paths:
            raise ValueError("register_download needs at least one file")
        for p in paths:
            if not p.resolve().is_relative_to(self.models_dir.resolve()):
                raise UsageError(f"{p} is outside the model store {self.models_dir}")
        arch, header_quant = gguf_summary(paths[0])
        entry = ModelEntry(
            name=validate_name(name),
            path=paths[0],
            files=paths,
            size=sum(p.stat().st_size for p in paths),
            quant=header_quant or quant,
            arch=arch,
            source="hub",
            repo=repo,
            revision=revision,
            sha256=tuple(sha256),
            added=time.time(),
            projector=projector,
        )
        return self._put(entry)

    def _put(self, entry: ModelEntry) -> ModelEntry:
        if _virtual.is_virtual_name(entry.name):
            raise UsageError(f"{entry.name} is a built-in model: pick another name")
        with self.registry.update() as models:
            key = find_key(models, entry.name)
            old = self.registry.entries({key: models[key]}).get(key) if key is not None else None
            if old is not None and old.path != entry.path:
                raise UsageError(
                    f"the name {entry.name!r} is taken by {old.path}: choose another with "
                    f"--name, or `localfab rm {entry.name}` first"
                )
            if old is not None:
                entry = replace(entry, added=old.added or entry.added, last_used=old.last_used)
            if key is not None:
                del models[key]  # the same model again, or a damaged entry the new one replaces
            models[entry.name] = entry.to_json()
        return entry

    def remove(self, name: str) -> RemovedModel:
        """Unregister `name`; delete its files if the store owns them (downloads, the virtual
        test model), keep added ones. Raises `ModelNotFound` if no such model is known."""
        with self.registry.update() as models:
            key = find_key(models, name)
            data = models.pop(key) if key is not None else None
        if key is None:
            virtual = self.virtual(name)
            if virtual is None:
                raise ModelNotFound(
                    f"no model called {name!r} is registered: `localfab list` shows the names"
                )
            return self._delete_files(virtual, still_used=set())
        try:
            entry = ModelEntry.from_json(key, data)
        except ValueError:
            # A damaged entry is only forgotten: which files it owned cannot be trusted.
            return RemovedModel(name=key, deleted=(), kept=(), bytes_freed=0)
        if not entry.owned:
            return RemovedModel(name=entry.name, deleted=(), kept=entry.files, bytes_freed=0)
        still_used = {p for e in self._entries(models).values() for p in e.owned_files}
        return self._delete_files(entry, still_used=still_used)

    def _delete_files(self, entry: ModelEntry, *, still_used: set[Path]) -> RemovedModel:
        deleted: list[Path] = []
        freed = 0
        store_root = self.models_dir.resolve()
        for file in entry.owned_files:
            if file in still_used or not file.resolve().is_relative_to(store_root):
                continue
            with contextlib.suppress(FileNotFoundError):
                freed += file.stat().st_size
                file.unlink()
                deleted.append(file)
        for folder in {f.parent for f in entry.owned_files}:
            remove_if_empty(folder)
        return RemovedModel(name=entry.name, deleted=tuple(deleted), kept=(), bytes_freed=freed)

    def touch(self, name: str) -> None:
        """Record that `name` was just used (shown as "last used" in `localfab list`).

        Best effort: a damaged, newer or unwritable registry must not stop a model from running.
        """
        try:
            with self.registry.update() as models:
                key = find_key(models, name)
                if key is not None and key in self.registry.entries({key: models[key]}):
                    models[key]["last_used"] = time.time()
        except (LocalfabError, OSError) as exc:
            log.info("could not record the use of %s: %s", ascii(name), exc)
