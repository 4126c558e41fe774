"""Hugging Face downloads that survive bad networks, through the real `huggingface_hub` library.

`pull()` turns `NAME | OWNER/REPO[:QUANT] | URL` into the GGUF file(s) to fetch (default quant
Q4_K_M; split `*-00001-of-0000N.gguf` models fetch every part), checks free disk space, downloads
with a progress callback, and registers the model in the `Store` only once every file's sha256
matches the one the hub publishes. `open_remote()` reads a model's GGUF header without
downloading it.

Modules: `refs` (what the user asked for, `HubConfig`), `files` (which files a ref means),
`errors` (hub failures as messages with a next step), `client` (`Hub`: listing, HEAD, resolve),
`download` (resume, lock, verify, register), `progress`, `remote` (ranged header reads) and
`_hf` (the one adapter over `huggingface_hub` internals). `huggingface_hub` itself is imported
only when the network is used.
"""

from __future__ import annotations

from localfab.hub.client import Hub
from localfab.hub.download import PullResult
from localfab.hub.files import FileMeta, RemoteFile, ResolvedModel
from localfab.hub.progress import DownloadProgress, ProgressCallback
from localfab.hub.refs import (
    DEFAULT_ENDPOINT,
    DEFAULT_QUANT,
    DEFAULT_REVISION,
    HubConfig,
    ModelRef,
    parse_ref,
)
from localfab.hub.remote import HttpRangeSource, RemoteModel
from localfab.store import Store

__all__ = [
    "DEFAULT_ENDPOINT",
    "DEFAULT_QUANT",
    "DEFAULT_REVISION",
    "DownloadProgress",
    "FileMeta",
    "HttpRangeSource",
    "Hub",
    "HubConfig",
    "ModelRef",
    "ProgressCallback",
    "PullResult",
    "RemoteFile",
    "RemoteModel",
    "ResolvedModel",
    "open_remote",
    "parse_ref",
    "pull",
]


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
