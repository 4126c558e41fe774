"""Byte ranges of a hub file over HTTP: a GGUF header read before (or without) a download."""

from __future__ import annotations

from dataclasses import dataclass, replace

from localfab.hub._hf import auth_headers, ranged_get
from localfab.hub.errors import file_metadata, hub_error
from localfab.hub.files import ResolvedModel
from localfab.hub.refs import DEFAULT_REVISION, HubConfig, check_repo
from localfab.store import safe_file_name


class HttpRangeSource:
    """Byte ranges of a hub file over HTTP (`Range: bytes=a-b` on `/{repo}/resolve/{rev}/{file}`).

    Implements the `facts.RangeSource` protocol so a GGUF header can be read before download;
    `bytes_fetched` and `requests` count what it cost. Redirects to the CDN are followed (the
    token is sent to the hub only, never to another host). Without an explicit `token` or
    `config`, an `endpoint` other than the configured hub (HF_ENDPOINT) gets no token. Offline
    mode (HF_HUB_OFFLINE, or `config.offline`) refuses every read. `size`, when already known
    (from the repo listing), saves a HEAD.
    """

    def __init__(
        self,
        repo: str,
        file: str,
        *,
        revision: str = DEFAULT_REVISION,
        endpoint: str | None = None,
        token: str | None = None,
        config: HubConfig | None = None,
        size: int | None = None,
    ) -> None:
        self.repo = check_repo(repo)
        safe_file_name(file)
        self.file = file
        self.revision = revision
        if config is None:
            config = HubConfig.from_env(token=token)
            if endpoint is not None and token is None:
                config = config.for_endpoint(endpoint)
            elif endpoint is not None:
                config = replace(config, endpoint=endpoint.rstrip("/"))
        self.config = config
        self.url = config.file_url(repo, file, revision=revision)
        self.label = f"{repo}/{file}"
        self.bytes_fetched = 0
        self.requests = 0
        self._size = size

    def __repr__(self) -> str:
        return f"HttpRangeSource({self.url!r})"

    def size(self) -> int | None:
        """Total size from a HEAD (`X-Linked-Size`), cached; None if the server does not say."""
        if self._size is None:
            meta = file_metadata(self.config, self.repo, self.file, revision=self.revision)
            self.requests += 1
            self._size = meta.size
        return self._size

    def read(self, offset: int, size: int) -> bytes:
        """Up to `size` bytes from `offset` (fewer only at the end of the file)."""
        if size <= 0:
            return b""
        if self._size is not None and offset >= self._size:
            return b""
        self.config.check_online(self.label)
        headers = auth_headers(self.config.auth)
        headers["Accept-Encoding"] = "identity"  # byte offsets must be of the file itself
        headers["Range"] = f"bytes={offset}-{offset + size - 1}"
        try:
            response = ranged_get(self.url, headers)
        except Exception as exc:
            raise hub_error(exc, self.config, repo=self.repo, file=self.file) from exc
        self.requests += 1
        if response.status_code == 416:
            return b""
        data = response.content
        self.bytes_fetched += len(data)
        if response.status_code == 206:
            total = response.headers.get("Content-Range", "").rpartition("/")[2]
            if total.isdigit():
                self._size = int(total)
            return data[:size]
        # 200: the server ignored the range and sent the whole file.
        self._size = len(data)
        return data[offset : offset + size]


@dataclass(frozen=True)
class RemoteModel:
    """A resolved remote model and ranged readers over its files (for `localfab plan`)."""

    resolved: ResolvedModel
    sources: tuple[HttpRangeSource, ...]

    @property
    def bytes_fetched(self) -> int:
        return sum(s.bytes_fetched for s in self.sources)
