"""A small llama-server look-alike on 127.0.0.1 that misbehaves on request, for the remote
client's fault tests: real sockets, real HTTP, no model.

It answers `/props`, `/tokenize` (one token per character: the id is the code point) and
`/detokenize` like llama-server, and `/completion` as `mode` says: "ok" streams a reply, a
number answers that HTTP status with an error body, "drop" closes the connection mid-reply,
"malformed" sends a line that is not JSON, "silent" stops sending (the client times out),
"error" sends llama-server's `error:` event, "truncated" ends the stream without its last
event, "huge" sends one event of `huge` bytes of text (in slices of a MiB, `huge_pause` seconds
apart), then its end. An error status's message is `message` where set; the chat API sends
`tool_calls` (its deltas) after its text. Every /completion body is kept in `requests`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TEMPLATE = (
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
REPLY = ("Hel", "lo", " there")


class FakeRemote:
    def __init__(self) -> None:
        # "llama": llama-server's endpoints; "openai": only the OpenAI API (as Ollama or LM
        # Studio), "vllm": that and vLLM's /version and max_model_len.
        self.flavor = "llama"
        self.think = False  # the chat API sends a thought (reasoning_content) first
        self.mode = "ok"
        self.chunks: list[str] = list(REPLY)  # the reply /completion streams
        self.n_ctx = 512
        self.model_path = "/models/fake-7b.gguf"
        self.models = ["fake-chat"]  # what an OpenAI-only server lists
        self.requests: list[dict[str, Any]] = []
        self.key: str | None = None  # when set, requests must carry it (else 401)
        self.disconnected = threading.Event()  # a client closed a stream early
        self.message: str | None = None  # an error status's message (None: a plain one)
        self.huge = 0  # bytes of the "huge" mode's one event
        self.huge_pause = 0.0  # seconds between its slices
        self.tool_calls: list[dict[str, Any]] = []  # the chat API's tool_calls deltas
        self.send_tokens = True  # /completion's events carry their token ids

    def pieces(self, text: str) -> list[dict[str, Any]]:
        return [{"id": ord(c), "piece": c} for c in text]


def _handler(fake: FakeRemote) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if fake.key and self.headers.get("Authorization") != f"Bearer {fake.key}":
                self._json(401, {"error": {"code": 401, "message": "Invalid API Key"}})
                return False
            return True

        def do_GET(self) -> None:  # noqa: N802
            if not self._authorized():
                return
            if self.path == "/version" and fake.flavor == "vllm":
                self._json(200, {"version": "0.11.0"})
            elif self.path == "/v1/models" and fake.flavor != "llama":
                listed = []
                for name in fake.models:
                    model: dict[str, Any] = {"id": name, "object": "model", "owned_by": "fake"}
                    if fake.flavor == "vllm":
                        model["max_model_len"] = fake.n_ctx
                    listed.append(model)
                self._json(200, {"object": "list", "data": listed})
            elif self.path == "/props" and fake.flavor != "llama":
                self._json(404, {"detail": "Not Found"})
            elif self.path == "/props":
                self._json(
                    200,
                    {
                        "default_generation_settings": {"n_ctx": fake.n_ctx},
                        "chat_template": TEMPLATE,
                        "bos_token": "",
                        "eos_token": "",
                        "model_path": fake.model_path,
                        "total_slots": 1,
                        "build_info": "fake",
                    },
                )
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": "fake-7b"}]})
            else:
                self._json(404, {"error": {"code": 404, "message": "File Not Found"}})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
            if not self._authorized():
                return
            if self.path == "/tokenize":
                content = body.get("content", "")
                if isinstance(content, list):  # token ids: their pieces
                    content = "".join(chr(t) for t in content)
                pieces = fake.pieces(content)
                tokens = pieces if body.get("with_pieces") else [p["id"] for p in pieces]
                self._json(200, {"tokens": tokens})
            elif self.path == "/detokenize":
                self._json(200, {"content": "".join(chr(t) for t in body.get("tokens", []))})
            elif self.path == "/completion":
                fake.requests.append(body)
                self._completion(fake.mode, n_predict=int(body.get("n_predict", -1)))
            elif self.path == "/v1/chat/completions" and fake.flavor != "llama":
                fake.requests.append(body)
                self._completion(fake.mode, chat=True)
            else:
                self._json(404, {"error": {"code": 404, "message": "File Not Found"}})

        def _completion(self, mode: str, *, chat: bool = False, n_predict: int = -1) -> None:
            if mode == "queued":  # every slot busy: no answer for a while
                time.sleep(3)
            if mode.isdigit():
                headers = {"Retry-After": "7"} if mode == "429" else {}
                message = fake.message or {"503": "Loading model"}.get(mode, f"failure {mode}")
                self._json(int(mode), {"error": {"code": int(mode), "message": message}}, headers)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                if mode == "huge":
                    self._huge()
                else:
                    self._chat_stream(mode) if chat else self._stream(mode, n_predict)
            except (BrokenPipeError, ConnectionResetError):
                fake.disconnected.set()

        def _chunk(self, text: str) -> None:
            data = text.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _huge(self) -> None:
            """One `data:` event of `fake.huge` bytes of text, a MiB at a time, and the end."""
            self._chunk('data: {"content": "')
            slice_ = "x" * (1 << 20)
            for _ in range(fake.huge >> 20):
                if fake.huge_pause:
                    time.sleep(fake.huge_pause)
                self._chunk(slice_)
            self._chunk('", "stop": false}\n\n')
            self._event({"content": "", "stop": True, "stop_type": "eos", "tokens_predicted": 1})
            self._chunk("")

        def _event(self, obj: dict[str, Any], field: str = "data") -> None:
            self._chunk(f"{field}: {json.dumps(obj)}\n\n")

        def _stream(self, mode: str, n_predict: int) -> None:
            """The reply's chunks, one token per character, cut at n_predict (stop "limit")."""
            left = n_predict if n_predict >= 0 else 1 << 30
            for i, whole in enumerate(fake.chunks):
                text = whole[:left]
                left -= len(text)
                if mode == "slow":
                    time.sleep(0.3)
                if text:
                    tokens = [ord(c) for c in text] if fake.send_tokens else []
                    self._event({"content": text, "tokens": tokens, "stop": False})
                if i == 0 and mode == "drop":
                    self.wfile.flush()
                    self.connection.shutdown(2)
                    return
                if i == 1:
                    if mode == "malformed":
                        self._chunk("data: {not json\n\n")
                    elif mode == "error":
                        self._event({"code": 500, "message": "slot crashed"}, "error")
                    elif mode == "silent":
                        time.sleep(3)
                        return
                    elif mode == "truncated":
                        self._chunk("")
                        return
                if left <= 0:
                    break
            n = (n_predict if n_predict >= 0 else 1 << 30) - left
            timings = {
                "cache_n": 0,
                "prompt_n": 9,
                "prompt_ms": 4.0,
                "predicted_n": n,
                "predicted_ms": 6.0,
            }
            stop_type = "limit" if left <= 0 else "eos"
            self._event(
                {
                    "content": "",
                    "tokens": [],
                    "stop": True,
                    "stop_type": stop_type,
                    "tokens_predicted": n,
                    "timings": timings,
                }
            )
            self._chunk("")

        def _chat_stream(self, mode: str) -> None:
            def delta(**fields: Any) -> dict[str, Any]:
                return {
                    "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": fields, "finish_reason": None}],
                }

            if fake.think:
                self._event(delta(reasoning_content="Thinking it over."))
            for i, text in enumerate(REPLY):
                self._event(delta(content=text))
                if i == 0 and mode == "drop":
                    self.wfile.flush()
                    self.connection.shutdown(2)
                    return
                if i == 1 and mode == "malformed":
                    self._chunk("data: {not json\n\n")
            if fake.tool_calls:
                self._event(delta(content="", tool_calls=fake.tool_calls))
            end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            self._event(end)
            self._event({"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 3}})
            self._chunk("data: [DONE]\n\n")
            self._chunk("")

    return Handler


@contextmanager
def fake_remote() -> Iterator[tuple[FakeRemote, str]]:
    fake = FakeRemote()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
