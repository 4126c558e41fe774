"""The registry file: one JSON object of models, changed only through `Registry.update()`.

`update()` holds a cross-process lock (`filelock`, so it works on every OS), reads and checks the
file, lets the caller change the `models` mapping, and writes it back atomically (temporary file,
fsync, rename). A crash or a second localfab process never leaves it half-written, and a failed
write (disk full) leaves the old registry as it was.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from localfab.errors import LocalfabError
from localfab.store.entry import ModelEntry

REGISTRY_VERSION = 1
Models = dict[str, Any]

log = logging.getLogger("localfab.store")


class Registry:
    """Reads, checks and atomically rewrites the registry file at `path`."""

    def __init__(self, path: Path, *, models_dir: Path, lock_timeout: float = -1) -> None:
        self.path = path
        self.models_dir = models_dir  # named in messages: where downloads can be found again
        # Seconds to wait for another process's change; -1 waits as long as it takes.
        self.lock_timeout = lock_timeout
        self._warned: set[str] = set()  # damaged entries already reported by this instance

    @contextlib.contextmanager
    def update(self) -> Iterator[Models]:
        """Read-validate-modify-write under the lock: the caller changes the yielded mapping.

        Nothing is written if the body raises or leaves the mapping as it was. Raises
        `LocalfabError` if the registry cannot be locked, read or written, or is of a newer
        version (which must stay untouched).
        """
        with self._locked():
            models = self.read()
            before = copy.deepcopy(models)
            yield models
            if models != before:
                self._write(models)

    @property
    def lock_path(self) -> Path:
        """The lock file every registry change holds (`filelock`: POSIX and Windows alike)."""
        return self.path.with_name(self.path.name + ".lock")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        from filelock import FileLock, Timeout

        lock = FileLock(self.lock_path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock.acquire(timeout=self.lock_timeout)
        except Timeout as exc:
            raise LocalfabError(
                f"another localfab is changing the model registry {self.path} (it holds "
                f"{self.lock_path}): let it finish, then run the same command again"
            ) from exc
        except OSError as exc:
            raise LocalfabError(
                f"cannot lock the model registry {self.path} ({reason(exc)}): check the disk "
                f"and its permissions, or set LOCALFAB_HOME to another folder"
            ) from exc
        try:
            yield
        finally:
            lock.release()

    def read(self) -> Models:
        """The registry's raw `models` object; entries are checked by `entries`.

        Raises `LocalfabError` if the file is unreadable, not a registry, or of a newer version
        (which this version must neither misread nor rewrite).
        """
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            raise LocalfabError(
                f"cannot read the model registry {self.path} ({reason(exc)}): check its "
                f"permissions, or move it aside and re-register your models with "
                f"`localfab add PATH` (downloads are under {self.models_dir})"
            ) from exc
        try:
            version, models = _parse(text)
        except (ValueError, KeyError, TypeError) as exc:
            raise LocalfabError(
                f"the model registry {self.path} is damaged ({exc}): move it aside and "
                f"re-register your models with `localfab add PATH` (downloads are under "
                f"{self.models_dir})"
            ) from exc
        if version > REGISTRY_VERSION:
            raise LocalfabError(
                f"the model registry {self.path} is version {version}, written by a newer "
                f"localfab; this one reads version {REGISTRY_VERSION} and leaves it untouched: "
                f"upgrade localfab (pip install -U localfab)"
            )
        return models

    def entries(self, models: Models) -> dict[str, ModelEntry]:
        """The valid entries of `models`; damaged ones are skipped with one warning each."""
        entries: dict[str, ModelEntry] = {}
        for key, data in models.items():
            try:
                entries[key] = ModelEntry.from_json(key, data)
            except ValueError as exc:
                self._warn_damaged(key, exc)
        return entries

    def _warn_damaged(self, key: str, exc: Exception) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        log.warning(
            "skipping the damaged registry entry %s in %s (%s): `localfab rm %s` forgets it",
            ascii(key),
            self.path,
            exc,
            ascii(key),
        )

    def _write(self, models: Models) -> None:
        """Replace the registry atomically: a failed write (disk full) leaves the old one intact."""
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        payload = {"version": REGISTRY_VERSION, "models": dict(sorted(models.items()))}
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(payload, f, indent=2)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
            hint = (
                "free some disk space (`localfab rm` models you do not use)"
                if full
                else "check the folder's permissions"
            )
            raise LocalfabError(
                f"could not update the model registry {self.path} ({reason(exc)}): {hint}, then "
                f"run the same command again; the registry was left as it was"
            ) from exc
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)


def find_key(models: Models, name: str) -> str | None:
    """The key registered for `name`, compared case-insensitively."""
    if name in models:
        return name
    wanted = name.strip().casefold()
    return next((k for k in models if k.casefold() == wanted), None)


def _parse(text: str) -> tuple[int, Models]:
    data = json.loads(text)
    if not isinstance(data, dict):
        raise TypeError("it is not a JSON object")
    version = data.get("version", REGISTRY_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise TypeError(f"version is {version!r}")
    models = data["models"]
    if not isinstance(models, dict):
        raise TypeError("models is not an object")
    return version, models


def reason(exc: BaseException) -> str:
    """`No space left on device` for an OSError, else the exception's text."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
