"""Hugging Face downloads that survive bad networks, through the real `huggingface_hub` library.

`pull()` turns `NAME | OWNER/REPO[:QUANT] | URL` into the GGUF file(s) to fetch (default quant
Q4_K_M; split `*-00001-of-0000N.gguf` models fetch every part), checks free disk space, downloads
with a progress callback, and registers the model in the `Store` only once every file's sha256
matches the one the hub publishes (the LFS oid, sent as `X-Linked-Etag` / `ETag`).

Resuming is done here, not left to `huggingface_hub`: since 2.x its `hf_hub_download` writes to a
process-unique temporary file and deletes it on failure, so an interrupted download restarts from
zero on the next run. localfab keeps the partial file in the store (`<repo>/.partial/`, keyed by
the file's sha256) and hands it to `huggingface_hub.file_download.http_get` with `resume_size`,
which sends `Range: bytes=N-` and retries dropped connections itself. The hub metadata (HEAD with
`X-Repo-Commit`, `X-Linked-Etag`, `X-Linked-Size`, redirects to the CDN), the tree listing, auth
headers, `HF_ENDPOINT` mirrors and the error types all come from the library.

`HF_ENDPOINT`, `HF_TOKEN` and `HF_HUB_OFFLINE` are read when a `HubConfig` is made, not when
`huggingface_hub` is imported, so a changed environment (or a test) takes effect at once.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote, unquote, urlsplit

from localfab.catalog import REPO_RE, SPLIT_RE, Catalog, CatalogEntry, load_catalog
from localfab.errors import HubError, LocalfabError, UsageError
from localfab.store import (
    ModelEntry,
    Store,
    default_name,
    disk_free,
    quant_from_name,
    safe_file_name,
    validate_name,
)

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_QUANT = "Q4_K_M"
DEFAULT_REVISION = "main"
# Room left on the disk beyond the download itself (the registry, logs, a little slack).
DISK_MARGIN = 64 << 20
_HUB_HOSTS = {"huggingface.co", "www.huggingface.co", "hf.co"}
_QUANT_RE = re.compile(r"^[A-Za-z0-9_]{2,32}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_SHA1_RE = re.compile(r"^[0-9a-f]{40}$")


# configuration ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class HubConfig:
    """Where to reach the hub and as whom; built from the environment at call time."""

    endpoint: str = DEFAULT_ENDPOINT
    token: str | None = None
    offline: bool = False

    @classmethod
    def from_env(
        cls,
        *,
        token: str | None = None,
        endpoint: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> HubConfig:
        """Settings from the environment: `token` beats `HF_TOKEN`, `endpoint` `HF_ENDPOINT`."""
        env = os.environ if env is None else env
        endpoint = (endpoint or env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        token = token or env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN") or None
        offline = any(
            env.get(k, "").strip().upper() in {"1", "ON", "YES", "TRUE"}
            for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
        )
        return cls(endpoint=endpoint, token=token, offline=offline)

    def page_url(self, repo: str) -> str:
        """The model page, where a gated model's licence is accepted."""
        base = DEFAULT_ENDPOINT if self.endpoint == DEFAULT_ENDPOINT else self.endpoint
        return f"{base}/{repo}"


# what the user asked for ------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelRef:
    """A parsed `NAME | OWNER/REPO[:QUANT] | URL`: a repo plus a quant or an exact file."""

    repo: str
    quant: str | None = None
    file: str | None = None
    revision: str = DEFAULT_REVISION
    name: str | None = None
    endpoint: str | None = None
    catalog: CatalogEntry | None = field(default=None, compare=False)

    @property
    def wanted_quant(self) -> str:
        return self.quant or (quant_from_name(self.file) if self.file else None) or DEFAULT_QUANT


def parse_ref(text: str, *, catalog: Catalog | None = None) -> ModelRef:
    """Parse what `localfab pull` accepts into a `ModelRef`; `UsageError` says what is accepted."""
    spec = text.strip()
    if not spec:
        raise UsageError("give a model to pull: a catalog name, OWNER/REPO[:QUANT] or a URL")
    lowered = spec.lower()
    if lowered.startswith(("http://", "https://")) or lowered.startswith(
        tuple(f"{h}/" for h in _HUB_HOSTS)
    ):
        return _parse_url(spec)
    if catalog is None:
        with contextlib.suppress(LocalfabError):
            catalog = load_catalog()
    entry = catalog.get(spec) if catalog is not None else None
    if entry is not None:
        return ModelRef(
            repo=entry.repo,
            quant=entry.quant,
            file=entry.files[0],
            name=entry.name,
            catalog=entry,
        )
    head, _, quant = spec.partition(":")
    parts = head.split("/")
    if len(parts) > 2 and head.lower().endswith(".gguf"):
        repo, file = "/".join(parts[:2]), "/".join(parts[2:])
        safe_file_name(file)
        return ModelRef(repo=_check_repo(repo), file=file)
    if REPO_RE.match(head) and ".." not in head:
        return ModelRef(repo=head, quant=_check_quant(quant) if quant else None)
    raise UsageError(
        f"{spec!r} is neither a catalog name, OWNER/REPO[:QUANT] nor a Hugging Face URL: "
        f"`localfab list --catalog` shows the catalog, e.g. `localfab pull qwen2.5:7b` or "
        f"`localfab pull bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M`"
    )


def _parse_url(spec: str) -> ModelRef:
    if not spec.lower().startswith(("http://", "https://")):
        spec = "https://" + spec
    url = urlsplit(spec)
    host = (url.hostname or "").lower()
    endpoint = None if host in _HUB_HOSTS else f"{url.scheme}://{url.netloc}"
    path = unquote(url.path).strip("/")
    quant = None
    if ":" in path.split("/")[-1] and "/resolve/" not in path and "/blob/" not in path:
        path, _, quant = path.rpartition(":")
    parts = path.split("/")
    if (
        parts and parts[0] == "models"
    ):  # https://huggingface.co/models/OWNER/REPO is not a repo page
        parts = parts[1:]
    if len(parts) < 2:
        raise UsageError(
            f"{spec!r} does not name a repo: expected https://huggingface.co/OWNER/REPO"
        )
    repo = _check_repo("/".join(parts[:2]))
    rest = parts[2:]
    if len(rest) >= 3 and rest[0] in ("resolve", "blob"):
        file = "/".join(rest[2:])
        safe_file_name(file)
        return ModelRef(repo=repo, file=file, revision=rest[1], endpoint=endpoint)
    if len(rest) >= 2 and rest[0] == "tree":
        return ModelRef(repo=repo, revision=rest[1], quant=_check_quant(quant), endpoint=endpoint)
    if rest:
        raise UsageError(
            f"{spec!r}: expected a repo URL or a .../resolve/REVISION/FILE.gguf file URL"
        )
    return ModelRef(repo=repo, quant=_check_quant(quant), endpoint=endpoint)


def _check_repo(repo: str) -> str:
    if not REPO_RE.match(repo) or ".." in repo:
        raise UsageError(f"{repo!r} is not a Hugging Face repo id (OWNER/NAME)")
    return repo


def _check_quant(quant: str | None) -> str | None:
    if quant is None or quant == "":
        return None
    if not _QUANT_RE.match(quant):
        raise UsageError(f"{quant!r} is not a quant name such as Q4_K_M, Q5_K_M or Q8_0")
    return quant.upper()


# what the hub has -------------------------------------------------------------------------------
@dataclass(frozen=True)
class RemoteFile:
    """A file in a hub repo, as the tree listing or a HEAD describes it."""

    path: str
    size: int | None
    sha256: str | None


@dataclass(frozen=True)
class ResolvedModel:
    """The exact file(s) a `ModelRef` means, in part order, at a given revision."""

    repo: str
    revision: str
    quant: str | None
    files: tuple[RemoteFile, ...]
    name: str

    @property
    def total_size(self) -> int | None:
        sizes = [f.size for f in self.files]
        return None if any(s is None for s in sizes) else sum(cast(list[int], sizes))


@dataclass(frozen=True)
class FileMeta:
    """What a HEAD on `/{repo}/resolve/{rev}/{file}` tells: commit, checksum, size, where to GET."""

    commit: str | None
    etag: str | None
    size: int | None
    location: str

    @property
    def sha256(self) -> str | None:
        return self.etag if self.etag and _SHA256_RE.match(self.etag) else None


@dataclass(frozen=True)
class DownloadProgress:
    """One progress report: bytes on disk of the whole model, speed of this run, time left.

    `stage` is "download" while bytes arrive and "verify" while the sha256 is computed (then
    `done`/`total` count bytes hashed).
    """

    file: str
    file_index: int
    file_count: int
    done: int
    total: int | None
    speed: float
    eta: float | None
    resumed: int
    stage: str = "download"


ProgressCallback = Callable[[DownloadProgress], None]


@dataclass(frozen=True)
class PullResult:
    """The outcome of `pull`: the registered entry and what it took to get there."""

    entry: ModelEntry
    resolved: ResolvedModel
    downloaded: int
    resumed: int
    already_present: bool
    verified: bool


# errors -----------------------------------------------------------------------------------------
def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _hub_error(
    exc: BaseException,
    config: HubConfig,
    *,
    repo: str,
    file: str | None = None,
    hub: Hub | None = None,
    revision: str = DEFAULT_REVISION,
    kept: int = 0,
) -> LocalfabError:
    """Turn a `huggingface_hub`/network exception into a HubError that says what to do next."""
    import httpx2
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(exc, LocalfabError):
        return exc
    status = _status(exc)
    page = config.page_url(repo)
    what = f"{repo}/{file}" if file else repo
    keep = (
        f"; the {kept / 2**20:.1f} MiB already downloaded are kept and the next pull resumes"
        if kept
        else ""
    )
    if isinstance(exc, OfflineModeIsEnabled):
        return HubError(
            f"offline mode is on (HF_HUB_OFFLINE): unset it to download {what}; models already "
            f"on this machine still work (`localfab list`)"
        )
    if isinstance(exc, GatedRepoError) or (status in (401, 403) and "gated" in str(exc).lower()):
        if status == 403 or (status != 401 and config.token):
            return HubError(
                f"{repo} is a gated model and your token has no access (HTTP 403): accept its "
                f"licence at {page} with the account the token belongs to (some need approval), "
                f"and use a read token (fine-grained tokens need access to public gated repos)"
            )
        if config.token:
            return HubError(
                f"{repo} is a gated model and the token was refused (HTTP 401): accept its "
                f"licence at {page}, then check HF_TOKEN / --token is a valid read token "
                f"(also check the computer's clock and any proxy)"
            )
        return HubError(
            f"{repo} is a gated model (HTTP 401): accept its licence at {page}, create a read "
            f"token at {DEFAULT_ENDPOINT}/settings/tokens and set HF_TOKEN (or pass --token)"
        )
    if isinstance(exc, RevisionNotFoundError):
        return HubError(f"{repo} has no revision {revision!r} (HTTP 404): check the branch or tag")
    if isinstance(exc, RemoteEntryNotFoundError) or (status == 404 and file is not None):
        return HubError(
            f"{file} is not in {repo} (HTTP 404){_available_files(hub, repo, revision)}"
        )
    if isinstance(exc, RepositoryNotFoundError) or status == 404:
        if status == 401 and not config.token:
            return HubError(
                f"{repo} was not found, or it is private or gated (HTTP 401): check the name; if "
                f"it is private or gated, set HF_TOKEN (or pass --token) and accept its licence "
                f"at {page}"
            )
        return HubError(
            f"there is no repo {repo} on {config.endpoint} (HTTP {status or 404}): check the "
            f"spelling; `localfab list --catalog` shows curated models"
        )
    if isinstance(exc, HfHubHTTPError) and status is not None:
        if status == 401 and not config.token:
            return HubError(
                f"{what} needs a Hugging Face login (HTTP 401): it may be private or gated; "
                f"create a read token at {DEFAULT_ENDPOINT}/settings/tokens, set HF_TOKEN (or "
                f"pass --token), and accept the licence at {page} if it is gated"
            )
        if status == 401:
            return HubError(
                f"the hub refused the token for {what} (HTTP 401): check HF_TOKEN / --token is a "
                f"valid read token, the computer's clock, and any proxy"
            )
        if status == 403:
            return HubError(
                f"access to {what} is forbidden (HTTP 403): make sure your token can read {repo} "
                f"and that you accepted its licence at {page}"
            )
        if status == 429:
            return HubError(f"the hub is rate-limiting requests (HTTP 429): wait a minute{keep}")
        return HubError(
            f"{config.endpoint} answered HTTP {status} for {what}: try again later{keep}"
        )
    if isinstance(exc, httpx2.HTTPError | ConnectionError | TimeoutError):
        return HubError(
            f"network failure while talking to {config.endpoint} ({type(exc).__name__}: {exc}): "
            f"check the connection or proxy (HF_ENDPOINT sets a mirror), then run the same "
            f"command again{keep}"
        )
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return HubError(
            f"the disk filled up while downloading {what}: free some space (`localfab rm` unused "
            f"models) or set LOCALFAB_HOME to a bigger disk, then pull again{keep}"
        )
    return HubError(f"download of {what} failed ({type(exc).__name__}: {exc}){keep}")


def _available_files(hub: Hub | None, repo: str, revision: str) -> str:
    """`; Q4_K_M .gguf files there: ...` for a 404 message (empty if the listing fails too)."""
    if hub is None:
        return ""
    try:
        files = hub.list_files(repo, revision=revision)
    except LocalfabError:
        return ""
    ggufs = [f.path for f in files if f.path.lower().endswith(".gguf")]
    wanted = [p for p in ggufs if _has_quant(p, DEFAULT_QUANT)]
    if wanted:
        return f"; {DEFAULT_QUANT} .gguf files there: {', '.join(wanted)}"
    quants = sorted({q for p in ggufs if (q := quant_from_name(p))})
    if quants:
        return f"; it has no {DEFAULT_QUANT} file; quants there: {', '.join(quants)}"
    return "; it has no .gguf files at all"


# the hub ----------------------------------------------------------------------------------------
class Hub:
    """Talks to one hub endpoint (huggingface.co or a mirror) through `huggingface_hub`."""

    def __init__(self, config: HubConfig | None = None) -> None:
        self.config = HubConfig.from_env() if config is None else config
        self._meta: dict[tuple[str, str, str], FileMeta] = {}  # one HEAD per file per pull

    def _token(self) -> str | None:
        # None lets huggingface_hub fall back to a token saved by `hf auth login`.
        return self.config.token

    def _check_online(self, what: str) -> None:
        if self.config.offline:
            raise HubError(
                f"offline mode is on (HF_HUB_OFFLINE): cannot reach the hub for {what}; unset "
                f"HF_HUB_OFFLINE to download; models already on this machine still work"
            )

    def file_url(self, repo: str, file: str, *, revision: str = DEFAULT_REVISION) -> str:
        """`{endpoint}/{repo}/resolve/{revision}/{file}`."""
        return f"{self.config.endpoint}/{repo}/resolve/{quote(revision, safe='')}/{quote(file)}"

    def list_files(self, repo: str, *, revision: str = DEFAULT_REVISION) -> list[RemoteFile]:
        """Every file in the repo (recursive tree listing), with sizes and LFS sha256."""
        from huggingface_hub import HfApi
        from huggingface_hub.hf_api import RepoFile

        self._check_online(repo)
        api = HfApi(endpoint=self.config.endpoint, token=self._token())
        try:
            items = list(api.list_repo_tree(repo, recursive=True, revision=revision))
        except Exception as exc:
            raise _hub_error(exc, self.config, repo=repo, revision=revision) from exc
        files = []
        for item in items:
            if isinstance(item, RepoFile):
                sha = item.lfs.sha256 if item.lfs is not None else None
                files.append(RemoteFile(path=item.path, size=item.size, sha256=sha))
        return files

    def metadata(self, repo: str, file: str, *, revision: str = DEFAULT_REVISION) -> FileMeta:
        """HEAD the file: commit, sha256 (X-Linked-Etag/ETag), size (X-Linked-Size), location."""
        from huggingface_hub import get_hf_file_metadata

        cached = self._meta.get((repo, file, revision))
        if cached is not None:
            return cached
        self._check_online(f"{repo}/{file}")
        try:
            meta = get_hf_file_metadata(
                self.file_url(repo, file, revision=revision),
                token=self._token(),
                endpoint=self.config.endpoint,
                retry_on_errors=True,
            )
        except Exception as exc:
            raise _hub_error(
                exc, self.config, repo=repo, file=file, hub=self, revision=revision
            ) from exc
        result = FileMeta(
            commit=meta.commit_hash,
            etag=(meta.etag or "").lower() or None,
            size=meta.size,
            location=meta.location,
        )
        self._meta[(repo, file, revision)] = result
        return result

    def resolve(self, ref: ModelRef | str, *, name: str | None = None) -> ResolvedModel:
        """The file(s) `ref` means: an exact file (with split siblings) or the quant's file(s)."""
        ref = parse_ref(ref) if isinstance(ref, str) else ref
        if ref.file is not None and not SPLIT_RE.match(ref.file.split("/")[-1]):
            # One known file: a HEAD gives size and checksum; no listing needed.
            meta = self.metadata(ref.repo, ref.file, revision=ref.revision)
            files: tuple[RemoteFile, ...] = (RemoteFile(ref.file, meta.size, meta.sha256),)
            quant = quant_from_name(ref.file) or ref.quant
        else:
            listing = self.list_files(ref.repo, revision=ref.revision)
            files = _pick_files(ref, listing, self.config)
            quant = quant_from_name(files[0].path) or ref.wanted_quant
        model_name = name or ref.name or default_name(Path(files[0].path.split("/")[-1]))
        return ResolvedModel(
            repo=ref.repo,
            revision=ref.revision,
            quant=quant,
            files=files,
            name=validate_name(model_name),
        )

    # downloading -------------------------------------------------------------------------------
    def pull(
        self,
        ref: ModelRef | str,
        *,
        store: Store,
        name: str | None = None,
        progress: ProgressCallback | None = None,
    ) -> PullResult:
        """Download (or resume) the model's files, verify them, then register it in `store`."""
        ref = parse_ref(ref) if isinstance(ref, str) else ref
        if name is not None:
            validate_name(name)
        if ref.endpoint and ref.endpoint != self.config.endpoint:
            return Hub(
                HubConfig(
                    endpoint=ref.endpoint, token=self.config.token, offline=self.config.offline
                )
            ).pull(ref, store=store, name=name, progress=progress)
        have = _already_registered(store, ref, name)
        if have is not None:
            resolved = ResolvedModel(
                repo=ref.repo,
                revision=have.revision or ref.revision,
                quant=have.quant,
                files=tuple(RemoteFile(p.name, None, None) for p in have.files),
                name=have.name,
            )
            return PullResult(have, resolved, 0, 0, already_present=True, verified=True)

        resolved = self.resolve(ref, name=name)
        existing = store.get(resolved.name)
        first = store.download_path(resolved.repo, resolved.files[0].path)
        if existing is not None and existing.path != first:
            raise UsageError(
                f"the name {resolved.name!r} is taken by {existing.path}: pull with --name "
                f"NEW_NAME, or `localfab rm {resolved.name}` first"
            )
        metas = [
            self.metadata(resolved.repo, f.path, revision=resolved.revision) for f in resolved.files
        ]
        # Pin every part to the commit the first HEAD saw, so parts cannot mix revisions.
        commit = metas[0].commit or resolved.revision
        plan = [
            _FilePlan.make(store, resolved, f, m)
            for f, m in zip(resolved.files, metas, strict=True)
        ]
        self._check_disk(store, resolved, plan)

        tracker = _Tracker(progress, plan)
        downloaded = 0
        for index, item in enumerate(plan):
            tracker.start(index)
            if not item.final.is_file():
                downloaded += self._download(item, tracker, commit=commit)
            tracker.finish_file(index)
        verified = all(item.expected for item in plan)
        shas = [item.expected or "" for item in plan]
        entry = store.register_download(
            resolved.name,
            [item.final for item in plan],
            repo=resolved.repo,
            revision=commit,
            sha256=shas,
            quant=resolved.quant,
        )
        return PullResult(
            entry=entry,
            resolved=resolved,
            downloaded=downloaded,
            resumed=sum(item.resume for item in plan),
            already_present=downloaded == 0 and not any(item.resume for item in plan),
            verified=verified,
        )

    def _check_disk(self, store: Store, resolved: ResolvedModel, plan: Sequence[_FilePlan]) -> None:
        needed = sum(item.remaining for item in plan)
        if needed == 0:
            return
        folder = store.repo_dir(resolved.repo)
        free = disk_free(folder)
        if free < needed + DISK_MARGIN:
            raise HubError(
                f"not enough disk space for {resolved.name}: it needs {_gib(needed)} more, "
                f"{_gib(free)} is free on {folder}: free some space (`localfab rm` models you "
                f"do not use) or set LOCALFAB_HOME to a bigger disk"
            )

    def _download(self, item: _FilePlan, tracker: _Tracker, *, commit: str) -> int:
        """Fetch one file into its partial, verify it, move it into place; returns bytes fetched."""
        from huggingface_hub.file_download import http_get
        from huggingface_hub.utils import build_hf_headers

        self._check_online(item.remote.path)
        item.partial.parent.mkdir(parents=True, exist_ok=True)
        resume = item.partial.stat().st_size if item.partial.is_file() else 0
        if item.size is not None and resume > item.size:
            item.partial.unlink()
            resume = 0
        url = item.meta.location
        if url.startswith(self.config.endpoint):
            url = self.file_url(item.resolved.repo, item.remote.path, revision=commit)
        headers = build_hf_headers(token=self._token())
        if not _same_origin(url, self.config.endpoint):
            headers.pop("authorization", None)  # signed CDN URLs must not see the token
        tracker.set_file_done(resume)
        try:
            with open(item.partial, "ab") as f:
                http_get(
                    url,
                    f,
                    resume_size=resume,
                    headers=headers,
                    expected_size=item.size,
                    displayed_filename=item.final.name,
                    tqdm_class=cast(Any, tracker.bar_class()),
                )
        except BaseException as exc:
            kept = item.partial.stat().st_size if item.partial.is_file() else 0
            if isinstance(exc, KeyboardInterrupt):
                raise
            if isinstance(exc, OSError) and "Consistency check failed" in str(exc):
                if item.size is not None and kept > item.size:
                    item.partial.unlink(missing_ok=True)
                    kept = 0
                raise HubError(
                    f"the download of {item.remote.path} stopped early ({kept} of {item.size} "
                    f"bytes): run the same command again to resume"
                ) from exc
            raise _hub_error(
                exc,
                self.config,
                repo=item.resolved.repo,
                file=item.remote.path,
                hub=self,
                kept=kept,
            ) from exc
        tracker.emit(force=True)  # the download's last word, before verification starts
        fetched = item.partial.stat().st_size - resume
        self._verify_and_place(item, tracker)
        return max(fetched, 0)

    def _verify_and_place(self, item: _FilePlan, tracker: _Tracker) -> None:
        if item.expected:
            digest = _file_digest(item.partial, item.expected, tracker)
            if digest != item.expected:
                item.partial.unlink(missing_ok=True)
                raise HubError(
                    f"checksum mismatch for {item.remote.path}: the hub publishes sha256 "
                    f"{item.expected} but the download hashes to {digest}; the file was "
                    f"discarded and nothing was registered: pull again (if it repeats, the "
                    f"server at {self.config.endpoint} serves a damaged file)"
                )
        item.final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(item.partial, item.final)
        with contextlib.suppress(OSError):
            item.partial.parent.rmdir()  # only if no other partials are waiting

    # remote headers ----------------------------------------------------------------------------
    def range_source(
        self, repo: str, file: str, *, revision: str = DEFAULT_REVISION
    ) -> HttpRangeSource:
        """A ranged reader over the remote file, for reading its GGUF header before download."""
        self._check_online(f"{repo}/{file}")
        return HttpRangeSource(
            repo, file, revision=revision, endpoint=self.config.endpoint, token=self.config.token
        )

    def open_remote(self, ref: ModelRef | str) -> RemoteModel:
        """Resolve `ref` and open a ranged reader on each of its files (part 1 holds the header)."""
        ref = parse_ref(ref) if isinstance(ref, str) else ref
        hub = self
        if ref.endpoint and ref.endpoint != self.config.endpoint:
            hub = Hub(HubConfig(endpoint=ref.endpoint, token=self.config.token))
        resolved = hub.resolve(ref)
        sources = tuple(
            hub.range_source(resolved.repo, f.path, revision=resolved.revision)
            for f in resolved.files
        )
        for source, remote in zip(sources, resolved.files, strict=True):
            if remote.size is not None:
                source._size = remote.size
        return RemoteModel(resolved=resolved, sources=sources)


@dataclass(frozen=True)
class RemoteModel:
    """A resolved remote model and ranged readers over its files (for `localfab plan`)."""

    resolved: ResolvedModel
    sources: tuple[HttpRangeSource, ...]

    @property
    def bytes_fetched(self) -> int:
        return sum(s.bytes_fetched for s in self.sources)


# module-level conveniences ----------------------------------------------------------------------
def pull(
    spec: str,
    *,
    store: Store | None = None,
    name: str | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    progress: ProgressCallback | None = None,
) -> PullResult:
    """Download `spec` (catalog name, OWNER/REPO[:QUANT] or URL) and register it; see `Hub.pull`."""
    hub = Hub(HubConfig.from_env(token=token, endpoint=endpoint))
    return hub.pull(spec, store=store or Store(), name=name, progress=progress)


def open_remote(spec: str, *, token: str | None = None, endpoint: str | None = None) -> RemoteModel:
    """Resolve `spec` on the hub and open ranged readers on its files, without downloading."""
    return Hub(HubConfig.from_env(token=token, endpoint=endpoint)).open_remote(spec)


# helpers ----------------------------------------------------------------------------------------
def _has_quant(path: str, quant: str) -> bool:
    """Whether a repo path carries `quant` as a whole token (case-insensitive)."""
    pattern = rf"(?<![A-Za-z0-9]){re.escape(quant)}(?![A-Za-z0-9_])"
    return re.search(pattern, path, re.IGNORECASE) is not None


def _pick_files(
    ref: ModelRef, listing: Sequence[RemoteFile], config: HubConfig
) -> tuple[RemoteFile, ...]:
    """Choose the GGUF file(s) for `ref` from a repo listing; split models give every part."""
    ggufs = [f for f in listing if f.path.lower().endswith(".gguf")]
    for f in ggufs:
        safe_file_name(f.path)  # a hostile listing must not smuggle in a traversal
    if ref.file is not None:
        m = SPLIT_RE.match(ref.file.split("/")[-1])
        folder = ref.file.rpartition("/")[0]
        if m is None:
            chosen = [f for f in ggufs if f.path == ref.file]
        else:
            chosen = [
                f for f in ggufs if f.path.rpartition("/")[0] == folder and _same_split(f.path, m)
            ]
        if not chosen:
            raise HubError(
                f"{ref.file} is not in {ref.repo} (HTTP 404)"
                f"{_quant_files_message(ggufs, ref.wanted_quant)}"
            )
        return _complete_parts(chosen, ref.repo)
    quant = ref.wanted_quant
    candidates = [f for f in ggufs if _has_quant(f.path, quant) and "mmproj" not in f.path.lower()]
    if not candidates:
        quants = sorted({q for f in ggufs if (q := quant_from_name(f.path))})
        there = (
            f"; quants there: {', '.join(quants)} (pull {ref.repo}:QUANT)"
            if quants
            else "; it has no .gguf files: pick a repo whose name ends in -GGUF"
        )
        raise HubError(f"{ref.repo} has no {quant} .gguf file{there}")
    groups: dict[str, list[RemoteFile]] = {}
    for f in candidates:
        m = SPLIT_RE.match(f.path.split("/")[-1])
        key = f"{f.path.rpartition('/')[0]}/{m.group('stem')}" if m else f.path
        groups.setdefault(key, []).append(f)
    # Prefer files at the top of the repo, then the shortest (most plain) name.
    best = sorted(groups.values(), key=lambda g: (g[0].path.count("/"), len(g[0].path), g[0].path))
    return _complete_parts(best[0], ref.repo)


def _same_split(path: str, m: re.Match[str]) -> bool:
    other = SPLIT_RE.match(path.split("/")[-1])
    return bool(
        other
        and other.group("stem") == m.group("stem")
        and other.group("count") == m.group("count")
    )


def _complete_parts(files: Sequence[RemoteFile], repo: str) -> tuple[RemoteFile, ...]:
    """Single file as is; split parts sorted, and every part 1..N present."""
    first = SPLIT_RE.match(files[0].path.split("/")[-1])
    if first is None:
        return (files[0],)
    count = int(first.group("count"))
    by_part: dict[int, RemoteFile] = {}
    for f in files:
        m = SPLIT_RE.match(f.path.split("/")[-1])
        if m:
            by_part[int(m.group("part"))] = f
    missing = [i for i in range(1, count + 1) if i not in by_part]
    if missing:
        raise HubError(
            f"{repo} has a split model {first.group('stem')} of {count} parts but part(s) "
            f"{', '.join(str(i) for i in missing)} are missing from the repo: it cannot be loaded"
        )
    return tuple(by_part[i] for i in range(1, count + 1))


def _quant_files_message(ggufs: Sequence[RemoteFile], quant: str) -> str:
    wanted = [f.path for f in ggufs if _has_quant(f.path, quant)]
    if wanted:
        return f"; {quant} .gguf files there: {', '.join(wanted)}"
    return f"; .gguf files there: {', '.join(f.path for f in ggufs) or 'none'}"


def _already_registered(store: Store, ref: ModelRef, name: str | None) -> ModelEntry | None:
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


@dataclass
class _FilePlan:
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
    ) -> _FilePlan:
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
        return cls(resolved, remote, meta, final, partial, size, expected, resume)

    @property
    def remaining(self) -> int:
        if self.final.is_file():
            return 0
        return max((self.size or 0) - self.resume, 0)


class _Tracker:
    """Aggregates bytes across a model's files into `DownloadProgress` reports (throttled)."""

    def __init__(self, callback: ProgressCallback | None, plan: Sequence[_FilePlan]) -> None:
        self.callback = callback
        self.plan = plan
        sizes = [p.size for p in plan]
        self.total = None if any(s is None for s in sizes) else sum(cast(list[int], sizes))
        self.resumed = sum(p.resume for p in plan)
        self.index = 0
        self.file_done = 0
        self.completed = 0  # bytes of files already finished
        self.samples: deque[tuple[float, int]] = deque()
        self.session = 0  # bytes received in this run (for the speed)
        self.last_emit = 0.0

    def start(self, index: int) -> None:
        self.index = index
        self.file_done = 0

    def set_file_done(self, n: int) -> None:
        self.file_done = n
        self.emit(force=True)

    def finish_file(self, index: int) -> None:
        size = self.plan[index].size
        self.completed += size if size is not None else self.file_done
        self.file_done = 0

    def advance(self, n: int) -> None:
        self.file_done += n
        self.session += n
        now = time.monotonic()
        self.samples.append((now, self.session))
        while len(self.samples) > 2 and now - self.samples[0][0] > 5.0:
            self.samples.popleft()
        self.emit()

    def speed(self) -> float:
        if len(self.samples) < 2:
            return 0.0
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0

    def emit(
        self, *, force: bool = False, stage: str = "download", done: int | None = None
    ) -> None:
        if self.callback is None:
            return
        now = time.monotonic()
        if not force and now - self.last_emit < 0.2:
            return
        self.last_emit = now
        speed = self.speed() if stage == "download" else 0.0
        done_all = self.completed + self.file_done if done is None else done
        total = self.total if stage == "download" else self.plan[self.index].size
        eta = (total - done_all) / speed if total is not None and speed > 0 else None
        item = self.plan[min(self.index, len(self.plan) - 1)]
        self.callback(
            DownloadProgress(
                file=item.final.name,
                file_index=self.index,
                file_count=len(self.plan),
                done=done_all,
                total=total,
                speed=speed,
                eta=eta,
                resumed=self.resumed,
                stage=stage,
            )
        )

    def bar_class(self) -> type:
        """A tqdm stand-in for `http_get(tqdm_class=...)` that feeds this tracker."""
        tracker = self

        class _Bar:
            def __init__(self, *args: Any, initial: int = 0, **kwargs: Any) -> None:
                tracker.file_done = initial

            def update(self, n: float | None = 1) -> None:
                tracker.advance(int(n or 0))

            def close(self) -> None:
                pass

            def __enter__(self) -> _Bar:
                return self

            def __exit__(self, *exc: object) -> None:
                return None

        return _Bar


def _file_digest(path: Path, expected: str, tracker: _Tracker | None = None) -> str:
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


def _same_origin(url: str, other: str) -> bool:
    a, b = urlsplit(url), urlsplit(other)
    return (a.scheme, a.hostname, a.port) == (b.scheme, b.hostname, b.port)


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


# ranged reads -----------------------------------------------------------------------------------
class HttpRangeSource:
    """Byte ranges of a hub file over HTTP (`Range: bytes=a-b` on `/{repo}/resolve/{rev}/{file}`).

    Implements the `facts.RangeSource` protocol so a GGUF header can be read before download;
    `bytes_fetched` and `requests` count what it cost. Redirects to the CDN are followed (the
    token is sent to the hub only, never to another host).
    """

    def __init__(
        self,
        repo: str,
        file: str,
        *,
        revision: str = DEFAULT_REVISION,
        endpoint: str | None = None,
        token: str | None = None,
    ) -> None:
        self.repo = _check_repo(repo)
        safe_file_name(file)
        self.file = file
        self.revision = revision
        self.config = HubConfig.from_env(token=token, endpoint=endpoint)
        self.url = Hub(self.config).file_url(repo, file, revision=revision)
        self.label = f"{repo}/{file}"
        self.bytes_fetched = 0
        self.requests = 0
        self._size: int | None = None

    def __repr__(self) -> str:
        return f"HttpRangeSource({self.url!r})"

    def _headers(self) -> dict[str, str]:
        from huggingface_hub.utils import build_hf_headers

        headers = build_hf_headers(token=self.config.token)
        headers["Accept-Encoding"] = "identity"  # byte offsets must be of the file itself
        return headers

    def size(self) -> int | None:
        """Total size from a HEAD (`X-Linked-Size`), cached; None if the server does not say."""
        if self._size is None:
            meta = Hub(self.config).metadata(self.repo, self.file, revision=self.revision)
            self.requests += 1
            self._size = meta.size
        return self._size

    def read(self, offset: int, size: int) -> bytes:
        """Up to `size` bytes from `offset` (fewer only at the end of the file)."""
        from huggingface_hub.utils import hf_raise_for_status, http_backoff

        if size <= 0:
            return b""
        if self._size is not None and offset >= self._size:
            return b""
        headers = self._headers()
        headers["Range"] = f"bytes={offset}-{offset + size - 1}"
        try:
            response = http_backoff("GET", self.url, headers=headers, follow_redirects=True)
            self.requests += 1
            if response.status_code == 416:
                return b""
            hf_raise_for_status(response)
        except Exception as exc:
            raise _hub_error(exc, self.config, repo=self.repo, file=self.file) from exc
        data = response.content
        self.bytes_fetched += len(data)
        content_range = response.headers.get("Content-Range", "")
        if response.status_code == 206:
            total = content_range.rpartition("/")[2]
            if total.isdigit():
                self._size = int(total)
            return data[:size]
        # 200: the server ignored the range and sent the whole file.
        self._size = len(data)
        return data[offset : offset + size]
