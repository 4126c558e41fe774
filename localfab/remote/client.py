"""HTTP to a remote model server, and what each way of failing means to the person.

Every request goes through `RemoteClient`: JSON calls (`get`, `post`) and server-sent event
streams (`events`). A refused connection, a timeout, an HTTP error status, a stream that stops
before its end, a line that is not JSON, or an event or reply past its bound (`MAX_EVENT_BYTES`,
`MAX_REPLY_CHARS`: a stream is read in chunks, never a whole line first) all become a
`RemoteError` whose message says what happened and what to do; text a server wrote in it has
its control characters shown, not passed on. API keys come from the environment (named by
`api_key_env`), never from a file; TLS certificates are verified.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx2

from localfab.errors import LocalfabError
from localfab.textsafe import visible_controls

# How often a stream's reader looks at its cancel event (seconds).
CANCEL_POLL = 0.05
# Seconds to connect, and the longest wait for the next bytes of an answer (a prompt of
# thousands of tokens on a busy server can take minutes before its first token).
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 300.0
# The most one server-sent event line may hold, and the most text (answer and thought) one
# reply may hold: far above what a model writes (a 128k-token reply is about 0.5 MiB), low
# enough that a server sending without end cannot fill this machine's memory or the history.
MAX_EVENT_BYTES = 8 * 1024 * 1024
MAX_REPLY_CHARS = 4 * 1024 * 1024
# The most of an error body that is read (its message is cut to a line anyway).
MAX_ERROR_BYTES = 64 * 1024


class RemoteError(LocalfabError):
    """A remote server could not answer; the message says why and what to do.
    `status`: the HTTP status (0: none came); `dropped`: a stream ended before its end."""

    def __init__(self, message: str, *, status: int = 0, dropped: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.dropped = dropped


class ServerSideCache:
    """What a chat session asks of an engine whose KV cache is a server's own: nothing to
    prepare (the server processes the prompt with the next reply and reuses what its slot
    holds), and no shift (a moved window is processed again there)."""

    can_shift = False
    n_threads = 0
    architecture = ""

    def evaluate(self, tokens: Sequence[int]) -> int:
        return 0

    def shift_to(self, target: Sequence[int]) -> tuple[int, int]:
        return 0, 0


class NotLlamaServer(RemoteError):
    """The server answers, but not as a llama-server (no `/props` with a context size)."""


@dataclass(frozen=True)
class Remote:
    """Where a remote server is: its base URL (without `/v1`), a name to show, the model to
    ask for ("": the server's own), the environment variable that holds its API key, the
    longest wait for the next bytes of an answer, and its context where it cannot say."""

    url: str
    name: str = ""
    model: str = ""
    api_key_env: str = ""
    timeout: float = READ_TIMEOUT
    context: int = 0  # tokens, for a chat API that says none (0: ask the server)
    keyring: bool = False  # a remote of config.toml: its key may be in the system keyring

    @property
    def label(self) -> str:
        return self.name or self.url

    def api_key(self) -> str | None:
        return self.api_key_and_source()[0]

    def api_key_and_source(self) -> tuple[str | None, str]:
        """The key from the environment (a named variable that is unset is an error), else,
        for a remote of config.toml, the one `localfab remote key NAME` stored in the system
        keyring; and where it came from ("env", "keyring", "": none)."""
        if not self.api_key_env:
            key = keyring_key(self.name) if self.keyring and self.name else None
            return key, "keyring" if key else ""
        key = os.environ.get(self.api_key_env, "")
        if not key:
            raise RemoteError(
                f"the environment variable {self.api_key_env} holds no API key for "
                f"{self.label}: export it (export {self.api_key_env}=...) and start again"
            )
        return key, "env"


KEYRING_SERVICE = "localfab"


def keyring_key(label: str) -> str | None:
    """The key stored for `label` in the system keyring; None where there is none, or no
    keyring (the `keyring` package finds the OS's: macOS Keychain, Windows Credential Locker,
    the Secret Service on Linux desktops)."""
    try:
        import keyring
        from keyring.errors import KeyringError

        return keyring.get_password(KEYRING_SERVICE, label)
    except (ImportError, KeyringError, RuntimeError):
        return None


def base_url(url: str) -> str:
    """A server's URL as given (`http://host:8080`, `.../v1`, `.../v1/`) without `/v1`."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    return url.removesuffix("/v1")


@dataclass
class RemoteClient:
    """Requests to one remote server (see the module's docstring)."""

    remote: Remote
    _http: httpx2.Client | None = field(default=None, repr=False)
    keyed: str = ""  # where the key sent came from: "env", "keyring" or "" (none sent)

    @property
    def http(self) -> httpx2.Client:
        if self._http is None:
            headers = {"User-Agent": "localfab"}
            key, self.keyed = self.remote.api_key_and_source()
            if key:
                headers["Authorization"] = f"Bearer {key}"
            timeout = httpx2.Timeout(self.remote.timeout, connect=CONNECT_TIMEOUT)
            self._http = httpx2.Client(
                base_url=base_url(self.remote.url), headers=headers, timeout=timeout
            )
        return self._http

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    def get(self, path: str) -> Any:
        return self._json("GET", path, None)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return self._json("POST", path, body)

    def _json(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        try:
            response = self.http.request(method, path, json=body)
        except httpx2.HTTPError as exc:
            raise self._unreachable(exc, path) from exc
        if response.status_code >= 400:
            raise status_error(
                self.remote, path, response.status_code, response.text, response, keyed=self.keyed
            )
        try:
            return response.json()
        except ValueError as exc:
            raise RemoteError(
                f"{self.remote.label} answered {path} with something that is not JSON "
                f"({response.text[:80]!r}): is the URL a model server's?"
            ) from exc

    def events(
        self, path: str, body: dict[str, Any], cancel: threading.Event | None = None
    ) -> Iterator[dict[str, Any]]:
        """The JSON objects of a server-sent event stream, to its `[DONE]` or its end.

        The stream is read by a thread of its own, so setting `cancel` ends the iterator within
        a few milliseconds whatever the server is doing (queueing the request, processing a
        long prompt): the connection is then closed, at once or as soon as the server answers,
        and the server stops generating. A stream cut short raises a `RemoteError` with
        `dropped` set."""
        reader = _StreamReader(self, path, body)
        try:
            while True:
                if cancel is not None and cancel.is_set():
                    return  # whatever the reader still holds is not passed on
                try:
                    kind, value = reader.items.get(timeout=CANCEL_POLL)
                except queue.Empty:
                    continue
                if kind == "event":
                    yield value
                elif kind == "end":
                    return
                elif cancel is not None and cancel.is_set():
                    return  # the hang-up's own error
                else:
                    raise self._stream_error(value, path)
        finally:
            reader.hang_up()

    def _stream_error(self, exc: BaseException, path: str) -> BaseException:
        """What a failed stream means, as a RemoteError (others are passed on as they are)."""
        label = self.remote.label
        if not isinstance(exc, httpx2.HTTPError):
            return exc
        if isinstance(exc, httpx2.ConnectError | httpx2.ConnectTimeout):
            return self._unreachable(exc, path)
        if isinstance(exc, httpx2.TimeoutException):
            return RemoteError(
                f"{label} sent nothing for {self.remote.timeout:.0f} s: it may be overloaded "
                "or stuck; the reply so far is kept (continue it later)",
                dropped=True,
            )
        return RemoteError(
            f"the connection to {label} dropped in the middle of the reply ({exc}); "
            "the reply so far is kept: check the server, then continue it",
            dropped=True,
        )

    def _unreachable(self, exc: Exception, path: str) -> RemoteError:
        if isinstance(exc, httpx2.TimeoutException) and not isinstance(exc, httpx2.ConnectTimeout):
            return RemoteError(
                f"{self.remote.label} did not answer {path} within {self.remote.timeout:.0f} s: "
                "it may be overloaded; try again"
            )
        return RemoteError(
            f"cannot reach {base_url(self.remote.url)} ({type(exc).__name__}: {exc}): "
            "is the server running, and are the host and port right?"
        )


def status_error(
    remote: Remote, path: str, status: int, text: str, response: Any = None, *, keyed: str = ""
) -> RemoteError:
    """What an HTTP error status from a model server means, in one line (`keyed`: where the
    key sent came from, "" when none was)."""
    label, said = remote.label, error_message(text)
    said_part = f": {said}" if said else ""
    if status == 401:
        key = {
            "env": f"the key in ${remote.api_key_env}",
            "keyring": "the key in the system keyring",
        }.get(keyed, "no API key was sent")
        hint = "set --api-key-env NAME (or api_key_env in [remotes.NAME]) to the variable"
        msg = f"{label} refused the request (401, {key}){said_part}; {hint} that holds its key"
    elif status == 403:
        msg = f"{label} refused access (403){said_part}: the API key has no access to this"
    elif status == 404:
        model = (
            f" (is the model name {remote.model!r} right? `localfab models --remote` lists them)"
        )
        msg = f"{label} has no {path} (404){said_part}{model if remote.model else ''}"
    elif status == 429:
        wait = response.headers.get("retry-after") if response is not None else None
        after = f" (it asks to retry after {wait} s)" if wait else ""
        msg = f"{label} is overloaded or rate-limited (429){after}{said_part}; wait and try again"
    elif status == 503:
        msg = f"{label} is not ready (503){said_part}: it may still be loading the model; try again"
    elif status >= 500:
        msg = f"{label} failed ({status}){said_part}; its log says more"
    else:
        msg = f"{label} rejected the request ({status}){said_part}"
    return RemoteError(msg, status=status)


def error_message(text: str) -> str:
    """The message in an error body, in the shapes servers send (OpenAI's and llama-server's
    `{"error": {"message"}}`, Ollama's `{"error": "..."}`, FastAPI's `{"detail"}`), or the body
    itself cut short; a control character in it is shown, never passed on (it is printed on
    a terminal: `ESC ] 52` would write the clipboard)."""
    return visible_controls(_said(text))


def _said(text: str) -> str:
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
        return " ".join(text.split())[:200]
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body.get("message")))
        if isinstance(err, dict):
            err = err.get("message", err)
        if err is not None:
            return " ".join(str(err).split())[:300]
    return " ".join(text.split())[:200]


def too_long(label: str, what: str, limit: int) -> RemoteError:
    """The error that ends a stream holding more than `limit` (an event, a reply)."""
    return RemoteError(
        f"{label} sent {what} over {limit // (1024 * 1024)} MiB: stopped; the reply so far is "
        "kept (is the server a model server, and is it well?)",
        dropped=True,
    )


def _lines(chunks: Iterator[bytes], label: str) -> Iterator[str]:
    """The lines of a stream read in chunks (ended by LF, CRLF or CR, as SSE has them); a line
    over `MAX_EVENT_BYTES` raises before more of it is held."""
    pending = bytearray()
    for chunk in chunks:
        for part in chunk.splitlines(keepends=True):
            if len(pending) + len(part) > MAX_EVENT_BYTES + 2:  # its line end may follow
                raise too_long(label, "an event", MAX_EVENT_BYTES)
            pending += part
            if part.endswith((b"\n", b"\r")):
                # A CRLF split between chunks gives an empty line more: SSE skips it.
                yield pending.rstrip(b"\r\n").decode("utf-8", "replace")
                pending.clear()
    if pending:
        yield pending.decode("utf-8", "replace")


def _sse(lines: Iterator[str], label: str) -> Iterator[dict[str, Any]]:
    """The `data:` objects of an event stream; an `error:` event or an error object raises."""
    ended = False
    for line in lines:
        if not line or line.startswith(":"):
            continue
        field_name, _, value = line.partition(":")
        value = value.strip()
        if field_name == "data" and value == "[DONE]":
            ended = True
            break
        if field_name not in ("data", "error"):
            continue
        try:
            obj = json.loads(value)
        except ValueError as exc:
            raise RemoteError(
                f"{label} sent a malformed stream line ({line[:80]!r}): not JSON; the reply so "
                "far is kept. Is this a model server's OpenAI or llama-server API?",
                dropped=True,
            ) from exc
        if field_name == "error" or (isinstance(obj, dict) and "error" in obj and len(obj) <= 2):
            raise RemoteError(
                f"{label} stopped the reply with an error: {error_message(json.dumps(obj))}",
                dropped=True,
            )
        if not isinstance(obj, dict):
            raise RemoteError(f"{label} sent a stream event that is not an object: {line[:80]!r}")
        yield obj
        if obj.get("stop") is True:  # llama-server's /completion ends without [DONE]
            ended = True
            break
    if not ended:
        raise RemoteError(
            f"the stream from {label} ended before the reply did (the server may have "
            "stopped or crashed); the reply so far is kept: continue it once it is back",
            dropped=True,
        )


def _head(chunks: Iterator[bytes]) -> bytes:
    """The first `MAX_ERROR_BYTES` of a body (the rest is not read)."""
    head = bytearray()
    for chunk in chunks:
        head += chunk
        if len(head) >= MAX_ERROR_BYTES:
            break
    return bytes(head[:MAX_ERROR_BYTES])


class _StreamReader:
    """Reads one event stream on a daemon thread into `items`: ("event", obj), ("end", None)
    or ("error", exception). `hang_up` closes the connection (now, or as soon as the response
    begins) and makes the thread stop."""

    def __init__(self, client: RemoteClient, path: str, body: dict[str, Any]) -> None:
        self.items: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._client, self._path, self._body = client, path, body
        self._gone = threading.Event()
        self._lock = threading.Lock()
        self._response: httpx2.Response | None = None
        threading.Thread(target=self._run, name="localfab-remote-stream", daemon=True).start()

    def _run(self) -> None:
        client, path = self._client, self._path
        try:
            with client.http.stream("POST", path, json=self._body) as response:
                with self._lock:
                    self._response = response
                if self._gone.is_set():
                    self._shutdown()
                    return
                if response.status_code >= 400:
                    text = _head(response.iter_bytes()).decode("utf-8", "replace")
                    raise status_error(
                        client.remote,
                        path,
                        response.status_code,
                        text,
                        response,
                        keyed=client.keyed,
                    )
                lines = _lines(self._chunks(response), client.remote.label)
                for obj in _sse(lines, client.remote.label):
                    if self._gone.is_set():
                        return
                    self.items.put(("event", obj))
            self.items.put(("end", None))
        except BaseException as exc:  # every failure goes to the reader of the items
            self.items.put(("error", exc))

    def _chunks(self, response: httpx2.Response) -> Iterator[bytes]:
        """The response's bytes as they come, until the reader hangs up (a long event is not
        read to its end first)."""
        for chunk in response.iter_bytes():
            if self._gone.is_set():
                return
            yield chunk

    def hang_up(self) -> None:
        self._gone.set()
        with self._lock:
            if self._response is not None:
                self._shutdown()

    def _shutdown(self) -> None:
        response = self._response
        stream = response.extensions.get("network_stream") if response is not None else None
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
