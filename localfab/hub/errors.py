"""Hub failures as `HubError`s that say what went wrong and what to do next.

The library's public error types (`huggingface_hub.errors`) decide the kind; the HTTP status
(`HfHubHTTPError.response`) the details. Server-chosen text is escaped before it is shown.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from localfab.errors import HubError, LocalfabError
from localfab.hub._hf import network_errors, status_of
from localfab.hub.files import FileMeta, RemoteFile, has_quant
from localfab.hub.refs import DEFAULT_ENDPOINT, DEFAULT_QUANT, DEFAULT_REVISION, HubConfig
from localfab.store import has_control_chars, printable, quant_from_name
from localfab.units import format_bytes

# Lists a repo's files for a 404 message (`Hub.list_files`); None when no listing is wanted.
Lister = Callable[[str, str], Sequence[RemoteFile]]
TOKENS_PAGE = f"{DEFAULT_ENDPOINT}/settings/tokens"


@dataclass(frozen=True)
class _Context:
    config: HubConfig
    repo: str
    file: str | None
    revision: str
    status: int | None
    keep: str
    lister: Lister | None

    @property
    def what(self) -> str:
        return f"{self.repo}/{self.file}" if self.file else self.repo

    @property
    def page(self) -> str:
        return self.config.page_url(self.repo)


def hub_error(
    exc: BaseException,
    config: HubConfig,
    *,
    repo: str,
    file: str | None = None,
    lister: Lister | None = None,
    revision: str = DEFAULT_REVISION,
    kept: int = 0,
) -> LocalfabError:
    """Turn a `huggingface_hub`/network exception into a HubError that says what to do next."""
    if isinstance(exc, LocalfabError):
        return exc
    keep = (
        f"; the {format_bytes(kept, precise=True)} already downloaded are kept and the next "
        "pull resumes"
        if kept
        else ""
    )
    ctx = _Context(config, repo, file, revision, status_of(exc), keep, lister)
    error = _classify(exc, ctx)
    # Server-chosen text (error headers, file names) must not reach the terminal raw.
    message = printable(str(error))
    if config.anonymous and ctx.status in (401, 403):
        message += (
            f" (no token was sent: localfab sends HF_TOKEN / --token only to the configured hub, "
            f"HF_ENDPOINT; set HF_ENDPOINT={config.endpoint} if you trust this server with it)"
        )
    return HubError(message)


def _classify(exc: BaseException, ctx: _Context) -> HubError:
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(exc, OfflineModeIsEnabled):
        return HubError(
            f"offline mode is on (HF_HUB_OFFLINE): unset it to download {ctx.what}; models "
            f"already on this machine still work (`localfab list`)"
        )
    if isinstance(exc, GatedRepoError):
        return _gated(ctx)
    if isinstance(exc, RevisionNotFoundError):
        return HubError(
            f"{ctx.repo} has no revision {ctx.revision!r} (HTTP 404): check the branch or tag"
        )
    if isinstance(exc, RemoteEntryNotFoundError) or (ctx.status == 404 and ctx.file is not None):
        return HubError(f"{ctx.file} is not in {ctx.repo} (HTTP 404){_available_files(ctx)}")
    if isinstance(exc, RepositoryNotFoundError) or ctx.status == 404:
        return _no_repo(ctx)
    if isinstance(exc, HfHubHTTPError) and ctx.status is not None:
        return _http_status(ctx, ctx.status)
    return _local_failure(exc, ctx)


def _gated(ctx: _Context) -> HubError:
    token = ctx.config.token
    if ctx.status == 403 or (ctx.status != 401 and token):
        return HubError(
            f"{ctx.repo} is a gated model and your token has no access (HTTP 403): accept its "
            f"licence at {ctx.page} with the account the token belongs to (some need "
            f"approval), and use a read token (fine-grained tokens need access to public gated "
            f"repos)"
        )
    if token:
        return HubError(
            f"{ctx.repo} is a gated model and the token was refused (HTTP 401): accept its "
            f"licence at {ctx.page}, then check HF_TOKEN / --token is a valid read token "
            f"(also check the computer's clock and any proxy)"
        )
    return HubError(
        f"{ctx.repo} is a gated model (HTTP 401): accept its licence at {ctx.page}, create a "
        f"read token at {TOKENS_PAGE} and set HF_TOKEN (or pass --token)"
    )


def _no_repo(ctx: _Context) -> HubError:
    if ctx.status == 401 and not ctx.config.token:
        return HubError(
            f"{ctx.repo} was not found, or it is private or gated (HTTP 401): check the name; "
            f"if it is private or gated, set HF_TOKEN (or pass --token) and accept its licence "
            f"at {ctx.page}"
        )
    return HubError(
        f"there is no repo {ctx.repo} on {ctx.config.endpoint} (HTTP {ctx.status or 404}): "
        f"check the spelling; `localfab list --catalog` shows curated models"
    )


def _http_status(ctx: _Context, status: int) -> HubError:
    if status == 401 and not ctx.config.token:
        return HubError(
            f"{ctx.what} needs a Hugging Face login (HTTP 401): it may be private or gated; "
            f"create a read token at {TOKENS_PAGE}, set HF_TOKEN (or pass --token), and accept "
            f"the licence at {ctx.page} if it is gated"
        )
    if status == 401:
        return HubError(
            f"the hub refused the token for {ctx.what} (HTTP 401): check HF_TOKEN / --token is "
            f"a valid read token, the computer's clock, and any proxy"
        )
    if status == 403:
        return HubError(
            f"access to {ctx.what} is forbidden (HTTP 403): make sure your token can read "
            f"{ctx.repo} and that you accepted its licence at {ctx.page}"
        )
    if status == 429:
        return HubError(f"the hub is rate-limiting requests (HTTP 429): wait a minute{ctx.keep}")
    return HubError(
        f"{ctx.config.endpoint} answered HTTP {status} for {ctx.what}: try again later{ctx.keep}"
    )


def _local_failure(exc: BaseException, ctx: _Context) -> HubError:
    if isinstance(exc, network_errors()):
        return HubError(
            f"network failure while talking to {ctx.config.endpoint} "
            f"({type(exc).__name__}: {exc}): check the connection or proxy (HF_ENDPOINT sets a "
            f"mirror), then run the same command again{ctx.keep}"
        )
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return HubError(
            f"the disk filled up while downloading {ctx.what}: free some space (`localfab rm` "
            f"unused models) or set LOCALFAB_HOME to a bigger disk, then pull again{ctx.keep}"
        )
    return HubError(f"download of {ctx.what} failed ({type(exc).__name__}: {exc}){ctx.keep}")


def _available_files(ctx: _Context) -> str:
    """`; Q4_K_M .gguf files there: ...` for a 404 message (empty if the listing fails too)."""
    if ctx.lister is None:
        return ""
    try:
        files = ctx.lister(ctx.repo, ctx.revision)
    except LocalfabError:
        return ""
    ggufs = [
        f.path for f in files if f.path.lower().endswith(".gguf") and not has_control_chars(f.path)
    ]
    wanted = [p for p in ggufs if has_quant(p, DEFAULT_QUANT)]
    if wanted:
        return f"; {DEFAULT_QUANT} .gguf files there: {', '.join(wanted)}"
    quants = sorted({q for p in ggufs if (q := quant_from_name(p))})
    if quants:
        return f"; it has no {DEFAULT_QUANT} file; quants there: {', '.join(quants)}"
    return "; it has no .gguf files at all"


def file_metadata(
    config: HubConfig,
    repo: str,
    file: str,
    *,
    revision: str = DEFAULT_REVISION,
    lister: Lister | None = None,
) -> FileMeta:
    """HEAD the file: commit, sha256 (X-Linked-Etag/ETag), size (X-Linked-Size), location;
    a failure is the hub error that says why (`hub_error`)."""
    config.check_online(f"{repo}/{file}")
    from huggingface_hub import get_hf_file_metadata

    try:
        meta = get_hf_file_metadata(
            config.file_url(repo, file, revision=revision),
            token=config.auth,
            endpoint=config.endpoint,
            retry_on_errors=True,
        )
    except Exception as exc:
        raise hub_error(
            exc, config, repo=repo, file=file, lister=lister, revision=revision
        ) from exc
    return FileMeta(
        commit=meta.commit_hash,
        etag=(meta.etag or "").lower() or None,
        size=meta.size,
        location=meta.location,
    )
