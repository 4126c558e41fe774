"""What the user asked for and where to ask: `HubConfig` and `NAME | OWNER/REPO[:QUANT] | URL`.

`HF_ENDPOINT`, `HF_TOKEN` and `HF_HUB_OFFLINE` are read when a `HubConfig` is made, not when
`huggingface_hub` is imported, so a changed environment (or a test) takes effect at once.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from urllib.parse import quote, unquote, urlsplit

from localfab.errors import HubError, LocalfabError, UsageError
from localfab.hub.reach import check_reachable
from localfab.store import quant_from_name, safe_file_name
from localfab.store.catalog import Catalog, CatalogEntry, check_repo_id, is_repo_id, load_catalog

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_QUANT = "Q4_K_M"
DEFAULT_REVISION = "main"
_HUB_HOSTS = {"huggingface.co", "www.huggingface.co", "hf.co"}
_QUANT_RE = re.compile(r"^[A-Za-z0-9_]{2,32}$")
_TRUE = {"1", "ON", "YES", "TRUE"}


@dataclass(frozen=True)
class HubConfig:
    """Where to reach the hub and as whom; built from the environment at call time."""

    endpoint: str = DEFAULT_ENDPOINT
    token: str | None = None
    offline: bool = False
    # A server other than the configured endpoint (a URL the user pasted): never send a token.
    anonymous: bool = False

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
            env.get(k, "").strip().upper() in _TRUE
            for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
        )
        return cls(endpoint=endpoint, token=token, offline=offline)

    @property
    def auth(self) -> str | bool | None:
        """The `token` argument for huggingface_hub: False means "send none, not even a saved one"
        (None would let the library fall back to HF_TOKEN or the token of `hf auth login`)."""
        return False if self.anonymous else self.token

    def for_endpoint(self, endpoint: str) -> HubConfig:
        """Settings for talking to `endpoint`: the token goes to the configured host only; the
        offline setting holds everywhere."""
        endpoint = endpoint.rstrip("/")
        if same_origin(endpoint, self.endpoint):
            return replace(self, endpoint=endpoint)
        return HubConfig(endpoint=endpoint, token=None, offline=self.offline, anonymous=True)

    def page_url(self, repo: str) -> str:
        """The model page, where a gated model's licence is accepted."""
        return f"{self.endpoint}/{repo}"

    def file_url(self, repo: str, file: str, *, revision: str = DEFAULT_REVISION) -> str:
        """`{endpoint}/{repo}/resolve/{revision}/{file}`."""
        return f"{self.endpoint}/{repo}/resolve/{quote(revision, safe='')}/{quote(file)}"

    def check_online(self, what: str) -> None:
        """Raise `HubError` if offline mode (HF_HUB_OFFLINE) forbids reaching the hub, or if the
        endpoint cannot be reached at all (in about 2 s, not after the library's retries)."""
        if self.offline:
            raise HubError(
                f"offline mode is on (HF_HUB_OFFLINE): cannot reach the hub for {what}; unset "
                f"HF_HUB_OFFLINE to download; models already on this machine still work"
            )
        check_reachable(self.endpoint)


def same_origin(url: str, other: str) -> bool:
    """Whether two URLs share scheme, host and port (a token may go from one to the other)."""
    a, b = urlsplit(url), urlsplit(other)
    return (a.scheme, a.hostname, a.port) == (b.scheme, b.hostname, b.port)


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
            repo=entry.repo, quant=entry.quant, file=entry.files[0], name=entry.name, catalog=entry
        )
    head, _, quant = spec.partition(":")
    parts = head.split("/")
    if len(parts) > 2 and head.lower().endswith(".gguf"):
        repo, file = "/".join(parts[:2]), "/".join(parts[2:])
        safe_file_name(file)
        return ModelRef(repo=check_repo_id(repo), file=file)
    if is_repo_id(head):
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
    if parts and parts[0] == "models":  # https://huggingface.co/models/OWNER/REPO
        parts = parts[1:]
    if len(parts) < 2:
        raise UsageError(
            f"{spec!r} does not name a repo: expected https://huggingface.co/OWNER/REPO"
        )
    repo = check_repo_id("/".join(parts[:2]))
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


# The name `hub.remote` imports; the rule and its message are `catalog.check_repo_id`.
check_repo = check_repo_id


def _check_quant(quant: str | None) -> str | None:
    if quant is None or quant == "":
        return None
    if not _QUANT_RE.match(quant):
        raise UsageError(f"{quant!r} is not a quant name such as Q4_K_M, Q5_K_M or Q8_0")
    return quant.upper()
