"""A small local stand-in for the Hugging Face hub, for tests that must not touch the network.

It speaks the endpoints `huggingface_hub` uses to find and download files:

- `GET /api/models/{repo}/tree/{rev}[/{path}]` - the file listing (size, git oid, LFS sha256),
- `GET /api/models/{repo}[/revision/{rev}]` - repo info (commit sha, siblings, gated),
- `HEAD`/`GET /{repo}/resolve/{rev}/{file}` - with `X-Repo-Commit`, `ETag`, `X-Linked-Etag`,
  `X-Linked-Size`, `Content-Length`, `Accept-Ranges` and ranged (206) replies; optionally a 302 to
  a "CDN" on another origin (`localhost` instead of `127.0.0.1`), as huggingface.co does for LFS.

and can misbehave on demand: drop the connection part-way through a file, answer an error status,
serve corrupt bytes, advertise a wrong size (`HostedFile.advertised`), hold every download until
released (`hold()`), or gate a repo behind a token (`Authorization: Bearer ...`: 401 without it,
403 for a token that has not accepted the licence). Every request is recorded with its headers
(Range included) and the body bytes sent, so tests can assert what was fetched.

Usage:
    with FakeHub() as hub:
        hub.add_file("owner/repo-GGUF", "model-Q4_K_M.gguf", data=b"...")
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import socket
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

_RANGE_RE = re.compile(r"^bytes=(\d*)-(\d*)$")


@dataclass
class HostedFile:
    """One file in a fake repo: bytes in memory or a path on disk, with its published sha256."""

    path: str
    data: bytes | None = None
    disk: Path | None = None
    sha256: str = ""
    size: int = 0
    lfs: bool = True
    corrupt: bool = False
    faults: deque[str] = field(default_factory=deque)
    advertised: int | None = None  # a wrong size for the listing and X-Linked-Size to claim

    @property
    def listed_size(self) -> int:
        """The size the hub claims (listing, X-Linked-Size); the bytes served stay `size`."""
        return self.size if self.advertised is None else self.advertised

    def read(self, start: int, end: int) -> bytes:
        """Bytes [start, end) as served (corrupted if asked)."""
        if self.data is not None:
            chunk = self.data[start:end]
        else:
            assert self.disk is not None
            with self.disk.open("rb") as f:
                f.seek(start)
                chunk = f.read(end - start)
        if self.corrupt and chunk:
            chunk = bytes(b ^ 0xFF for b in chunk[:16]) + chunk[16:]
        return chunk

    @property
    def git_oid(self) -> str:
        return hashlib.sha1(f"{self.path}:{self.size}".encode()).hexdigest()


@dataclass
class HostedRepo:
    """A fake model repo: files, its commit sha, and access rules."""

    repo: str
    commit: str
    files: dict[str, HostedFile] = field(default_factory=dict)
    token: str | None = None  # gated: requests must carry this bearer token
    denied_tokens: set[str] = field(default_factory=set)  # valid tokens that get 403
    status: int | None = None  # every request to the repo answers this status


@dataclass
class RecordedRequest:
    """A request the fake hub saw, and how many body bytes it sent back.

    Recorded when the request arrives; `status` and `sent` are filled in before each byte of the
    reply is written, so a client that has read the reply always finds its request here.
    """

    method: str
    path: str
    headers: dict[str, str]
    status: int = 0
    sent: int = 0

    @property
    def range(self) -> str | None:
        return self.headers.get("range")

    @property
    def range_start(self) -> int:
        m = _RANGE_RE.match(self.range or "")
        return int(m.group(1)) if m and m.group(1) else 0

    @property
    def authorization(self) -> str | None:
        return self.headers.get("authorization")


class FakeHub:
    """The fake hub server; start it with `with FakeHub() as hub:` (or `start()`/`stop()`)."""

    def __init__(self, *, cdn: bool = False) -> None:
        self.repos: dict[str, HostedRepo] = {}
        self.requests: list[RecordedRequest] = []
        self.cdn = cdn  # LFS files answer 302 to another origin, like huggingface.co
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        # While set (see `hold`), content GETs wait for this event before sending anything.
        self.held: threading.Event | None = None
        self._started = 0

    # set-up -------------------------------------------------------------------------------------
    def add_file(
        self,
        repo: str,
        path: str,
        *,
        data: bytes | None = None,
        disk: Path | None = None,
        sha256: str | None = None,
        lfs: bool = True,
    ) -> HostedFile:
        """Host a file; its sha256 is computed unless given (a wrong one fakes corruption)."""
        hosted = self.repos.setdefault(
            repo, HostedRepo(repo=repo, commit=hashlib.sha1(repo.encode()).hexdigest())
        )
        if data is not None:
            size = len(data)
            digest = sha256 or hashlib.sha256(data).hexdigest()
        else:
            assert disk is not None
            size = disk.stat().st_size
            digest = sha256 or _sha256_file(disk)
        f = HostedFile(path=path, data=data, disk=disk, sha256=digest, size=size, lfs=lfs)
        hosted.files[path] = f
        return f

    def gate(self, repo: str, token: str, *, denied: tuple[str, ...] = ()) -> None:
        """Require `Authorization: Bearer token` (401 otherwise; 403 for the `denied` tokens)."""
        self.repos[repo].token = token
        self.repos[repo].denied_tokens = set(denied)

    def fail(self, repo: str, status: int | None) -> None:
        """Answer `status` to every request about `repo` (None to stop)."""
        self.repos.setdefault(repo, HostedRepo(repo=repo, commit="0" * 40)).status = status

    def drop(self, repo: str, path: str, *, after: int, times: int = 1) -> None:
        """Close the connection after `after` body bytes, on the next `times` content GETs."""
        self.repos[repo].files[path].faults.extend([f"drop:{after}"] * times)

    def error_once(self, repo: str, path: str, status: int = 500) -> None:
        """Answer `status` to the next content GET of the file."""
        self.repos[repo].files[path].faults.append(f"status:{status}")

    def hold(self) -> threading.Event:
        """Make content GETs wait until the returned event is set (for concurrency tests)."""
        self.held = threading.Event()
        return self.held

    def started_gets(self) -> int:
        """Content GETs that arrived, including those still waiting at the gate."""
        with self._lock:
            return self._started

    # introspection ------------------------------------------------------------------------------
    def content_gets(self, path_suffix: str = "") -> list[RecordedRequest]:
        """GETs that served file content (resolve or CDN), optionally for one file."""
        return [
            r
            for r in self.requests
            if r.method == "GET"
            and ("/resolve/" in r.path or r.path.startswith("/cdn/"))
            and r.path.endswith(path_suffix)
        ]

    def bytes_sent(self, path_suffix: str = "") -> int:
        return sum(r.sent for r in self.content_gets(path_suffix))

    # server -------------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def cdn_url(self) -> str:
        return f"http://localhost:{self.port}"

    def start(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        # A short poll interval: shutdown() waits for the loop's next poll (0.5 s by default, at
        # the end of every test that starts a hub).
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)


class _Handler(BaseHTTPRequestHandler):
    fake: FakeHub
    _rec: RecordedRequest  # the request being handled (see `_handle`)
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def do_HEAD(self) -> None:
        self._handle(head=True)

    def do_GET(self) -> None:
        self._handle(head=False)

    # plumbing -----------------------------------------------------------------------------------
    def _reply(
        self,
        status: int,
        body: bytes = b"",
        *,
        headers: dict[str, str] | None = None,
        head: bool = False,
        length: int | None = None,
    ) -> int:
        self._rec.status = status
        self._rec.sent = 0 if head else len(body)
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if not head and body:
            self.wfile.write(body)
            return len(body)
        return 0

    def _json(
        self, status: int, payload: Any, *, head: bool, extra: dict[str, str] | None = None
    ) -> int:
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", **(extra or {})}
        return self._reply(status, body, headers=headers, head=head)

    def _error(self, status: int, code: str | None, message: str, *, head: bool) -> int:
        extra = {"X-Error-Message": message}
        if code:
            extra["X-Error-Code"] = code
        return self._json(status, {"error": message}, head=head, extra=extra)

    def _handle(self, *, head: bool) -> None:
        url = urlsplit(self.path)
        path = unquote(url.path)
        self._rec = RecordedRequest(
            method=self.command, path=path, headers={k.lower(): v for k, v in self.headers.items()}
        )
        self.fake._record(self._rec)
        status, sent = 500, 0
        try:
            status, sent = self._route(path, parse_qs(url.query), head=head)
        finally:
            self._rec.status, self._rec.sent = status, sent

    def _access(self, repo: HostedRepo, *, head: bool) -> tuple[int, int] | None:
        if repo.status is not None:
            codes = {401: None, 403: None, 404: "RepoNotFound"}
            return repo.status, self._error(
                repo.status, codes.get(repo.status), f"status {repo.status} on demand", head=head
            )
        if repo.token is None:
            return None
        auth = self.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else None
        if token is None or (token != repo.token and token not in repo.denied_tokens):
            message = (
                f"Access to model {repo.repo} is restricted. You must have access to it and be "
                f"authenticated to access it. Please log in."
            )
            return 401, self._error(401, "GatedRepo", message, head=head)
        if token in repo.denied_tokens:
            message = (
                f"Access to model {repo.repo} is restricted and you are not in the authorized "
                f"list. Visit https://huggingface.co/{repo.repo} to ask for access."
            )
            return 403, self._error(403, "GatedRepo", message, head=head)
        return None

    def _route(self, path: str, query: dict[str, list[str]], *, head: bool) -> tuple[int, int]:
        fake = self.fake
        m = re.match(r"^/api/models/([^/]+/[^/]+)(?:/(tree|revision)/([^/]+)(?:/(.*))?)?$", path)
        if m:
            repo = fake.repos.get(m.group(1))
            if repo is None:
                return 404, self._error(404, "RepoNotFound", "Repository not found", head=head)
            denied = self._access(repo, head=head)
            if denied:
                return denied
            rev = m.group(3)
            if rev is not None and rev not in ("main", repo.commit):
                return 404, self._error(404, "RevisionNotFound", "Invalid rev id", head=head)
            if m.group(2) == "tree":
                return 200, self._json(200, _tree(repo, m.group(4) or ""), head=head)
            info = {
                "id": repo.repo,
                "modelId": repo.repo,
                "sha": repo.commit,
                "private": False,
                "gated": "auto" if repo.token else False,
                "siblings": [{"rfilename": p} for p in repo.files],
            }
            return 200, self._json(200, info, head=head)

        m = re.match(r"^/cdn/([^/]+/[^/]+)/([0-9a-f]{64})$", path)
        if m:
            repo = fake.repos.get(m.group(1))
            hosted = next(
                (f for f in (repo.files.values() if repo else []) if f.sha256 == m.group(2)), None
            )
            if hosted is None:
                return 404, self._reply(404, b"no such blob", head=head)
            return self._serve(repo, hosted, head=head)  # type: ignore[arg-type]

        m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if m:
            repo = fake.repos.get(m.group(1))
            if repo is None:
                return 404, self._error(404, "RepoNotFound", "Repository not found", head=head)
            denied = self._access(repo, head=head)
            if denied:
                return denied
            if m.group(2) not in ("main", repo.commit):
                return 404, self._error(404, "RevisionNotFound", "Invalid rev id", head=head)
            hosted = repo.files.get(m.group(3))
            if hosted is None:
                headers = {"X-Repo-Commit": repo.commit}
                body = json.dumps({"error": "Entry not found"}).encode()
                self._rec.status, self._rec.sent = 404, 0 if head else len(body)
                self.send_response(404)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("X-Error-Message", "Entry not found")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)
                return 404, 0 if head else len(body)
            if fake.cdn and hosted.lfs:
                location = f"{fake.cdn_url}/cdn/{repo.repo}/{hosted.sha256}"
                headers = {
                    "Location": location,
                    "X-Repo-Commit": repo.commit,
                    "ETag": f'"{hosted.git_oid}"',
                    "X-Linked-Etag": f'"{hosted.sha256}"',
                    "X-Linked-Size": str(hosted.listed_size),
                }
                return 302, self._reply(302, b"", headers=headers, head=head)
            return self._serve(repo, hosted, head=head)

        return 404, self._reply(404, b"not a hub endpoint", head=head)

    def _serve(self, repo: HostedRepo, hosted: HostedFile, *, head: bool) -> tuple[int, int]:
        etag = hosted.sha256 if hosted.lfs else hosted.git_oid
        headers = {
            "X-Repo-Commit": repo.commit,
            "ETag": f'"{etag}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if hosted.lfs:
            headers["X-Linked-Etag"] = f'"{hosted.sha256}"'
            headers["X-Linked-Size"] = str(hosted.listed_size)
        if head:
            return 200, self._reply(200, headers=headers, head=True, length=hosted.size)

        with self.fake._lock:
            self.fake._started += 1
        if self.fake.held is not None:
            self.fake.held.wait(timeout=120)
        fault = hosted.faults.popleft() if hosted.faults else None
        if fault and fault.startswith("status:"):
            code = int(fault.split(":")[1])
            return code, self._error(code, None, f"status {code} on demand", head=False)

        start, end, status = 0, hosted.size, 200
        rng = self.headers.get("Range")
        if rng:
            m = _RANGE_RE.match(rng.strip())
            if not m or (not m.group(1) and not m.group(2)):
                return 416, self._reply(416, headers={"Content-Range": f"bytes */{hosted.size}"})
            if m.group(1):
                start = int(m.group(1))
                end = min(int(m.group(2)) + 1, hosted.size) if m.group(2) else hosted.size
            else:
                start, end = max(hosted.size - int(m.group(2)), 0), hosted.size
            if start >= hosted.size:
                return 416, self._reply(416, headers={"Content-Range": f"bytes */{hosted.size}"})
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{hosted.size}"

        self._rec.status = status
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        limit = end - start
        if fault and fault.startswith("drop:"):
            limit = min(limit, int(fault.split(":")[1]))
        sent = 0
        pos = start
        try:
            while sent < limit:
                chunk = hosted.read(pos, pos + min(1 << 20, limit - sent))
                if not chunk:
                    break
                self._rec.sent = sent + len(chunk)
                self.wfile.write(chunk)
                sent += len(chunk)
                pos += len(chunk)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            return status, sent
        if limit < end - start:
            # Drop the connection mid-body, as a flaky network would.
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
        return status, sent


def _tree(repo: HostedRepo, prefix: str) -> list[dict[str, Any]]:
    prefix = prefix.strip("/")
    items: list[dict[str, Any]] = []
    folders: set[str] = set()
    for f in repo.files.values():
        if prefix and not f.path.startswith(prefix + "/"):
            continue
        parts = f.path.split("/")
        for i in range(1, len(parts)):
            folders.add("/".join(parts[:i]))
        size = f.listed_size
        item: dict[str, Any] = {"type": "file", "oid": f.git_oid, "size": size, "path": f.path}
        if f.lfs:
            item["lfs"] = {"oid": f.sha256, "size": size, "pointerSize": 134}
        items.append(item)
    for folder in sorted(folders):
        items.append(
            {
                "type": "directory",
                "oid": hashlib.sha1(folder.encode()).hexdigest(),
                "size": 0,
                "path": folder,
            }
        )
    return items


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(4 << 20):
            h.update(chunk)
    return h.hexdigest()
