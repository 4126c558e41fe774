"""Downloads that survive bad networks: resume, one downloader per file, verify, then register.

Resuming is done here, not left to `huggingface_hub` (see `localfab.hub._hf`): the partial file
is kept in the store (`<repo>/.partial/`, keyed by the file's sha256) and the next pull asks only
for the bytes that are missing. A model is registered in the `Store` only once every file's
sha256 matches the one the hub publishes (the LFS oid, sent as `X-Linked-Etag` / `ETag`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from localfab.errors import HubError, UsageError
from localfab.hub._hf import auth_headers, download_into, has_byte_at, is_short_body, status_of
from localfab.hub.errors import hub_error
from localfab.hub.files import FileMeta, RemoteFile, ResolvedModel
from localfab.hub.progress import ProgressCallback, Tracker
from localfab.hub.refs import DEFAULT_REVISION, HubConfig, ModelRef, same_origin
from localfab.store import ModelEntry, Store, disk_free
from localfab.store.catalog import SPLIT_RE
from localfab.units import format_bytes


class HubAccess(Protocol):
    """What a pull asks of the hub (`localfab.hub.client.Hub` is the one in use)."""

    config: HubConfig

    def resolve(
        self, ref: ModelRef | str, *, name: str | None = None, projector: bool = True
    ) -> ResolvedModel: ...

    def metadata(self, repo: str, file: str, *, revision: str = DEFAULT_REVISION) -> FileMeta: ...

    def lister(self, repo: str, revision: str) -> Sequence[RemoteFile]: ...


# Room left on the disk beyond the download itself (the registry, logs, a little slack).
DISK_MARGIN = 64 << 20
_SHA1_RE = re.compile(r"^[0-9a-f]{40}$")

log = logging.getLogger("localfab.hub")


@dataclass(frozen=True)
class PullResult:
    """The outcome of `pull`: the registered entry and what it took to get there."""

    entry: ModelEntry
    resolved: ResolvedModel
    downloaded: int
    resumed: int
    already_present: bool
    verified: bool


@dataclass
class FilePlan:
    """One file to fetch: where it goes, what it must hash to, how much is already there."""

    resolved: ResolvedModel
    remote: RemoteFile
    meta: FileMeta
    final: Path
    partial: Path
    size: int | None
    expected: str | None
    resume: int

    @classmethod
    def make(
        cls, store: Store, resolved: ResolvedModel, remote: RemoteFile, meta: FileMeta
    ) -> FilePlan:
        expected = meta.sha256 or remote.sha256
        if meta.sha256 and remote.sha256 and meta.sha256 != remote.sha256:
            raise HubError(
                f"the hub disagrees with itself about {remote.path}: the listing says sha256 "
                f"{remote.sha256}, the file says {meta.sha256}; try again in a minute"
            )
        size = meta.size if meta.size is not None else remote.size
        final = store.download_path(resolved.repo, remote.path)
        partial = store.partial_path(resolved.repo, remote.path, expected or meta.etag or "x")
        resume = partial.stat().st_size if partial.is_file() and not final.is_file() else 0
        if size is not None and resume > size:
            resume = 0  # longer than the file: `_fetch` discards it and starts again
        return cls(resolved, remote, meta, final, partial, size, expected, resume)

    @property
    def name(self) -> str:
        return self.final.name

    @property
    def remaining(self) -> int:
        if self.final.is_file():
            return 0
        return max((self.size or 0) - self.resume, 0)


def already_registered(store: Store, ref: ModelRef, name: str | None) -> ModelEntry | None:
    """A complete registered copy of `ref`, found without the network (so pull works offline)."""
    candidates: list[ModelEntry] = []
    if ref.catalog is not None:
        found = store.find(repo=ref.repo, files=ref.catalog.files)
        candidates += [found] if found else []
    elif ref.file is not None and not SPLIT_RE.match(ref.file.split("/")[-1]):
        found = store.find(repo=ref.repo, files=[ref.file])
        candidates += [found] if found else []
    else:
        quant = ref.wanted_quant.upper()
        candidates += [
            e for e in store.list() if e.repo == ref.repo and (e.quant or "").upper() == quant
        ]
    for entry in candidates:
        if entry.present and (name is None or entry.name == name):
            return entry
    return None


def pull(
    hub: HubAccess,
    ref: ModelRef,
    *,
    store: Store,
    name: str | None,
    progress: ProgressCallback | None,
    projector: bool = True,
) -> PullResult:
    """Download (or resume) the model's files (and its vision projector, `projector`), verify
    them, then register it in `store`."""
    have = already_registered(store, ref, name)
    if have is not None and (have.projector is not None or not _wants_projector(ref, projector)):
        return _already_present(ref, have)

    resolved = hub.resolve(ref, name=name, projector=projector)
    existing = store.get(resolved.name)
    first = store.download_path(resolved.repo, resolved.files[0].path)
    if existing is not None and existing.path != first:
        raise UsageError(
            f"the name {resolved.name!r} is taken by {existing.path}: pull with --name "
            f"NEW_NAME, or `localfab rm {resolved.name}` first"
        )
    fetched = (*resolved.files, *([resolved.projector] if resolved.projector else []))
    metas = [hub.metadata(resolved.repo, f.path, revision=resolved.revision) for f in fetched]
    # Pin every part to the commit the first HEAD saw, so parts cannot mix revisions.
    commit = metas[0].commit or resolved.revision
    plan = [FilePlan.make(store, resolved, f, m) for f, m in zip(fetched, metas, strict=True)]
    check_disk(store, resolved, plan)

    fetcher = _Fetcher(hub, Tracker(progress, plan), commit)
    downloaded = 0
    for index, item in enumerate(plan):
        fetcher.tracker.start(index)
        with _download_lock(store, item, fetcher.tracker):
            if not _have_verified(item, fetcher.tracker):
                downloaded += fetcher.fetch(item)
        fetcher.tracker.finish_file(index)
    parts = plan[: len(resolved.files)]
    entry = store.register_download(
        resolved.name,
        [item.final for item in parts],
        repo=resolved.repo,
        revision=commit,
        sha256=[item.expected or "" for item in parts],
        quant=resolved.quant,
        projector=plan[-1].final if resolved.projector is not None else None,
    )
    return PullResult(
        entry=entry,
        resolved=resolved,
        downloaded=downloaded,
        resumed=sum(item.resume for item in plan),
        already_present=downloaded == 0 and not any(item.resume for item in plan),
        verified=all(item.expected for item in plan),
    )


def _wants_projector(ref: ModelRef, projector: bool) -> bool:
    """Whether a pull of `ref` looks for a projector (a catalog model that reads images)."""
    return projector and ref.catalog is not None and ref.catalog.vision


def _already_present(ref: ModelRef, have: ModelEntry) -> PullResult:
    """What a pull of a model that is already in the store reports: nothing to download."""
    resolved = ResolvedModel(
        repo=ref.repo,
        revision=have.revision or ref.revision,
        quant=have.quant,
        files=tuple(RemoteFile(p.name, None, None) for p in have.files),
        name=have.name,
    )
    return PullResult(have, resolved, 0, 0, already_present=True, verified=True)


def check_disk(store: Store, resolved: ResolvedModel, plan: Sequence[FilePlan]) -> None:
    """Refuse to start a download the disk cannot hold (plus `DISK_MARGIN`)."""
    needed = sum(item.remaining for item in plan)
    if needed == 0:
        return
    folder = store.repo_dir(resolved.repo)
    free = disk_free(folder)
    if free < needed + DISK_MARGIN:
        need, have = format_bytes(needed, precise=True), format_bytes(free, precise=True)
        raise HubError(
            f"not enough disk space for {resolved.name}: it needs {need} more, {have} is free "
            f"on {folder}: free some space (`localfab rm` models you do not use) or set "
            f"LOCALFAB_HOME to a bigger disk"
        )


def _have_verified(item: FilePlan, tracker: Tracker) -> bool:
    """Whether the file is already at its final path with the hub's sha256 (or size).

    A file there but not registered (a crash between placing and registering, another
    process's pull, a stale copy of an older revision) is checked before it is trusted; one
    that does not match is deleted and downloaded again.
    """
    if not item.final.is_file():
        return False
    item.resume = 0
    if item.expected:
        matches = file_digest(item.final, item.expected, tracker) == item.expected
    else:
        matches = item.size is None or item.final.stat().st_size == item.size
    if matches:
        return True
    log.warning(
        "%s does not match the hub's %s: downloading it again",
        item.final,
        "sha256" if item.expected else "size",
    )
    item.final.unlink()
    return False


@contextlib.contextmanager
def _download_lock(store: Store, item: FilePlan, tracker: Tracker) -> Iterator[None]:
    """Hold the file's download lock: two pulls of one model must not append to one partial.

    The second waits (saying so through the progress callback) and then finds the file in
    place, checks its sha256 and registers it, instead of downloading it again.
    """
    from filelock import FileLock, Timeout

    path = store.lock_path(item.resolved.repo, item.remote.path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        tracker.emit(force=True, stage="wait", done=0)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


class _Fetcher:
    """Fetches files of one pull from one hub, all pinned to one commit."""

    def __init__(self, hub: HubAccess, tracker: Tracker, commit: str) -> None:
        self.hub = hub
        self.config = hub.config
        self.tracker = tracker
        self.commit = commit

    def fetch(self, item: FilePlan) -> int:
        """Fetch one file into its partial, verify it, move it into place; returns bytes fetched."""
        self.config.check_online(item.remote.path)
        item.partial.parent.mkdir(parents=True, exist_ok=True)
        resume = item.partial.stat().st_size if item.partial.is_file() else 0
        if item.size is not None and resume > item.size:
            item.partial.unlink()  # longer than the file: not a prefix of it, start again
            resume = 0
        item.resume = resume  # what this run really resumes from (the message says so)
        url = item.meta.location
        if url.startswith(self.config.endpoint):
            url = self.config.file_url(item.resolved.repo, item.remote.path, revision=self.commit)
        headers = auth_headers(self.config.auth)
        if not same_origin(url, self.config.endpoint):
            headers.pop("authorization", None)  # signed CDN URLs must not see the token
        self.tracker.set_file_done(resume)
        exhausted = False
        if item.size is None or resume < item.size:
            exhausted = self._get(item, url, headers, resume)
        kept = item.partial.stat().st_size if item.partial.is_file() else 0
        if item.size is not None and kept != item.size:
            if kept < item.size and not exhausted and has_more(url, headers, kept):
                got, size = format_bytes(kept, precise=True), format_bytes(item.size, precise=True)
                raise HubError(
                    f"the download of {item.remote.path} stopped early ({got} of {size}): "
                    "run the same command again to resume"
                )
            # The server sent a different number of bytes than the hub advertises.
            self._settle_wrong_size(item, kept)
            return max(kept - resume, 0)
        self.tracker.emit(force=True)  # the download's last word, before verification starts
        self._verify_and_place(item)
        return max(kept - resume, 0)

    def _get(self, item: FilePlan, url: str, headers: dict[str, str], resume: int) -> bool:
        """Append the missing bytes to the partial; True if the server had none past `resume`.

        A body shorter or longer than expected is left for `fetch` to judge by the file's size.
        """
        try:
            with open(item.partial, "ab") as f:
                download_into(
                    url,
                    f,
                    resume=resume,
                    headers=headers,
                    on_bytes=self.tracker.advance,
                    on_start=self._on_start,
                )
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            # 416 on a resume: the server has nothing past what is on disk.
            exhausted = status_of(exc) == 416 and resume > 0
            if exhausted or is_short_body(exc):
                return exhausted
            kept = item.partial.stat().st_size if item.partial.is_file() else 0
            raise hub_error(
                exc,
                self.config,
                repo=item.resolved.repo,
                file=item.remote.path,
                lister=self.hub.lister,
                kept=kept,
            ) from exc
        return False

    def _on_start(self, initial: int) -> None:
        self.tracker.file_done = initial

    def _settle_wrong_size(self, item: FilePlan, kept: int) -> None:
        """The server's file is not the size the hub advertises: keep it only if the sha256
        matches (the advertised size was wrong), else discard it and say what happened."""
        if item.expected and item.partial.is_file():
            self.tracker.emit(force=True)
            if file_digest(item.partial, item.expected, self.tracker) == item.expected:
                log.warning(
                    "%s: the hub advertises %s bytes but the file has %s; its sha256 matches, "
                    "so it is kept",
                    item.remote.path,
                    item.size,
                    kept,
                )
                _place(item)
                return
        item.partial.unlink(missing_ok=True)
        diff = kept - (item.size or 0)
        how = f"{diff} more" if diff > 0 else f"{-diff} fewer"
        check = "its sha256 does not match" if item.expected else "no sha256 is published"
        raise HubError(
            f"the hub advertises {item.remote.path} as {item.size} bytes but the server sent "
            f"{kept} bytes ({how}) and {check}: the download was discarded and nothing was "
            f"registered; try again later (if it repeats, the server at {self.config.endpoint} "
            f"serves an inconsistent file: tell the repo owner, or set HF_ENDPOINT to another "
            f"mirror)"
        )

    def _verify_and_place(self, item: FilePlan) -> None:
        if item.expected:
            digest = file_digest(item.partial, item.expected, self.tracker)
            if digest != item.expected:
                item.partial.unlink(missing_ok=True)
                raise HubError(
                    f"checksum mismatch for {item.remote.path}: the hub publishes sha256 "
                    f"{item.expected} but the download hashes to {digest}; the file was "
                    f"discarded and nothing was registered: pull again (if it repeats, the "
                    f"server at {self.config.endpoint} serves a damaged file)"
                )
        _place(item)


def has_more(url: str, headers: dict[str, str], offset: int) -> bool:
    """Whether the server has bytes past `offset`, so a short download was a dropped connection
    rather than a file shorter than advertised."""
    try:
        return has_byte_at(url, headers, offset)
    except Exception:  # noqa: BLE001 - unknown: assume a network problem, resume later
        return True


def _place(item: FilePlan) -> None:
    item.final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(item.partial, item.final)


def file_digest(path: Path, expected: str, tracker: Tracker | None = None) -> str:
    """sha256 of the file (or the git blob sha1, when that is what the hub published)."""
    size = path.stat().st_size
    h = hashlib.sha1(f"blob {size}\0".encode()) if _SHA1_RE.match(expected) else hashlib.sha256()
    done = 0
    if tracker is not None:
        tracker.emit(force=True, stage="verify", done=0)
    with open(path, "rb") as f:
        while chunk := f.read(4 << 20):
            h.update(chunk)
            done += len(chunk)
            if tracker is not None:
                tracker.emit(stage="verify", done=done)
    if tracker is not None:
        tracker.emit(force=True, stage="verify", done=done)
    return h.hexdigest()
