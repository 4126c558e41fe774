"""Model files on disk: split parts, leftovers of downloads, free space."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from localfab.errors import ModelError, ModelNotFound
from localfab.gguf.modelfile import check_model_file
from localfab.store.catalog import SPLIT_RE

PARTIAL_DIR = ".partial"


def split_parts(first: Path) -> tuple[Path, ...]:
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


def existing_file(path: Path) -> Path:
    """`path` resolved if it is a readable file; `ModelNotFound` if nothing is there, and
    `ModelError` saying what it is instead (a folder, a FIFO, a device, a dangling link, a
    file it may not read)."""
    if not os.path.lexists(path):
        raise ModelNotFound(
            f"{path} does not exist: check the path, or use a model name from `localfab list`"
        )
    check_model_file(path)
    return path.resolve()


def remove_if_empty(folder: Path) -> None:
    """Delete a download folder that holds nothing but (empty) leftovers and unused locks."""
    with contextlib.suppress(OSError):
        partial = folder / PARTIAL_DIR
        if partial.is_dir():
            _remove_idle_locks(partial)
        if partial.is_dir() and not any(partial.iterdir()):
            partial.rmdir()
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def _remove_idle_locks(folder: Path) -> None:
    """Delete download lock files nobody holds, when nothing but locks is left in `folder`."""
    from filelock import FileLock, Timeout

    items = list(folder.iterdir())
    if not items or any(p.suffix != ".lock" for p in items):
        return
    for path in items:
        lock = FileLock(path, timeout=0)
        try:
            with lock:
                path.unlink(missing_ok=True)
        except Timeout:  # a pull is waiting on it
            continue


def disk_free(path: Path) -> int:
    """Free bytes on the disk that holds `path` (or its nearest existing parent)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return shutil.disk_usage(candidate).free
    return shutil.disk_usage(Path.cwd()).free
