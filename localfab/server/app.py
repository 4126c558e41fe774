"""The llama-server compatible HTTP API as a Starlette app: `create_app(model, settings)`.

Endpoints, request fields, response fields, status codes, error bodies and SSE framing follow
llama.cpp's tools/server (server.cpp, server-context.cpp, server-http.cpp) of the same version as
the installed llama-cpp-python. One engine thread serves a FIFO queue (see `worker`); the handlers
prepare each request (parse, validate, render the chat template, tokenize, fit the window) in a
worker thread, so the event loop only moves bytes, then await what the engine emits.

Deliberate differences, all on bad input (llama-server answers these with 500 or 200):
malformed JSON and non-object bodies are 400 `invalid_request_error`; bodies over
`max_body_bytes` are 413; bodies slower than `read_timeout` are 408; empty `messages`, unknown
roles and several prompts in one request are 400; a string holding a lone surrogate is 400;
grammars and JSON schemas beyond the documented size, nesting and expansion limits are 400.
And on exposure: on a loopback bind, a Host header that is not a loopback name is 403 (DNS
rebinding), and an Origin that is not loopback or allowed with `--allowed-origins` is 403 with
no CORS headers (llama-server echoes any Origin with credentials allowed).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localfab.chat.session import REPLY_RESERVE_FRACTION
from localfab.engine.types import Done, TokenEvent, TokenProbs
from localfab.errors import LocalfabError, UsageError
from localfab.server import shapes
from localfab.server.chat_window import ChatWindow
from localfab.server.edge import OriginRule, host_allowed, lone_surrogate
from localfab.server.errors import ApiError, dumps
from localfab.server.params import Generation, generation_settings, parse_generation
from localfab.server.settings import ServerSettings
from localfab.server.worker import EngineWorker, Job
from localfab.templates import validate_messages

if TYPE_CHECKING:
    from localfab.engine import Engine
    from localfab.runtime import LoadedModel

log = logging.getLogger("localfab.server")

PUBLIC_PATHS = frozenset({"/health", "/v1/health"})
JSON_TYPE = "application/json; charset=utf-8"
CORS_METHODS = "GET, POST, DELETE, OPTIONS"
# Prompts this long are tokenized in a thread so the event loop keeps answering.
_TOKENIZE_INLINE_MAX = 32 * 1024
_PARSE_INLINE_MAX = 64 * 1024  # bytes of request body parsed on the event loop itself


def json_response(data: Any, status: int = 200, headers: Mapping[str, str] | None = None):
    return Response(dumps(data), status_code=status, media_type=JSON_TYPE, headers=headers)


def error_response(err: ApiError) -> Response:
    return Response(err.body(), status_code=err.code, media_type=JSON_TYPE)


# --- model facts shown by /props and /v1/models -------------------------------------------


@dataclass(frozen=True)
class ModelInfo:
    """Facts about the loaded model, read once after loading."""

    name: str
    path: str
    n_ctx: int
    n_ctx_train: int
    n_vocab: int
    n_embd: int
    n_params: int
    size: int
    vocab_type: int
    ftype: str
    bos_token: str
    eos_token: str
    chat_template: str


_VOCAB_TYPES = {"llama": 1, "gpt2": 2, "bert": 3, "t5": 4, "rwkv": 5, "plamo2": 6}


def _model_info(model: LoadedModel, settings: ServerSettings) -> ModelInfo:
    engine = model.engine
    meta = engine.metadata()
    arch = meta.get("general.architecture", "")
    n_params = size = 0
    ftype = ""
    try:
        from localfab.facts import read_facts

        facts = read_facts(model.path)
        for tensor in facts.tensors:
            count = 1
            for dim in tensor.shape:
                count *= dim
            n_params += count
            size += tensor.nbytes
        ftype = facts.file_type_name or ""
    except Exception as exc:  # facts are cosmetic here; never block serving on them
        log.warning("could not read model facts: %s", exc)
    return ModelInfo(
        name=settings.public_model_name or str(model.path),
        path=str(model.path),
        n_ctx=engine.n_ctx,
        n_ctx_train=engine.n_ctx_train,
        n_vocab=engine.n_vocab,
        n_embd=int(meta.get(f"{arch}.embedding_length", "0") or 0),
        n_params=n_params,
        size=size,
        vocab_type=_VOCAB_TYPES.get(meta.get("tokenizer.ggml.model", ""), 0),
        ftype=ftype,
        bos_token=engine.token_text(engine.bos_token),
        eos_token=engine.token_text(engine.eos_token),
        chat_template=model.prompts.template.source,
    )


# --- the gate: Host, CORS, OPTIONS, loading state, API key -------------------------------


class Gate:
    """Pure ASGI middleware doing what llama-server's pre-routing handler does, in its order,
    after two checks of its own: the Host name on a loopback bind, and the browser origin.

    llama-server echoes any Origin; here only loopback origins, the server's own origin and
    those named in `settings.allowed_origins` get CORS headers, and a request from any other
    origin is refused with 403, so a web page cannot read answers or start generations.
    """

    def __init__(self, app: ASGIApp, server: Server) -> None:
        self.app = app
        self.server = server
        self.origins = OriginRule(server.settings.allowed_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host = headers.get("host")
        if self.server.settings.check_host and not host_allowed(host):
            log.warning("refused a request for host %r", host)
            err = ApiError(
                f"Host {host!r} is not a loopback name: this server listens on a loopback "
                "address and answers only requests for localhost, 127.0.0.1 or [::1] "
                "(a guard against DNS rebinding); use one of those in the URL, or listen on "
                "another address with --host (and set --api-key)",
                "permission_error",
            )
            await _send_simple(send, err.code, err.body(), JSON_TYPE, [])
            return
        origin = headers.get("origin")
        cors: list[tuple[bytes, bytes]] = []
        if origin is not None:
            if not self.origins.allows(origin, host):
                log.warning("refused a request from origin %r", origin)
                err = ApiError(
                    f"origin {origin!r} may not use this server: start it with "
                    f"--allowed-origins {origin} (or set LOCALFAB_ORIGINS), or '*' for any "
                    "origin",
                    "permission_error",
                )
                await _send_simple(send, err.code, err.body(), JSON_TYPE, [(b"vary", b"Origin")])
                return
            cors += [
                (b"access-control-allow-origin", origin.encode("latin-1")),
                (b"vary", b"Origin"),
            ]
        if scope["method"] == "OPTIONS":
            if origin is not None:
                cors.append((b"access-control-allow-credentials", b"true"))
            cors += [
                (b"access-control-allow-methods", CORS_METHODS.encode()),
                (b"access-control-allow-headers", b"*"),
            ]
            await _send_simple(send, 200, b"", "text/html", cors)
            return
        if not self.server.worker.ready.is_set() or self.server.info is None:
            err = ApiError("Loading model", "unavailable_error")
            await _send_simple(send, err.code, err.body(), JSON_TYPE, cors)
            return
        if (
            self.server.settings.api_keys
            and scope["path"] not in PUBLIC_PATHS
            and not self.server.key_ok(headers)
        ):
            log.warning("unauthorized: Invalid API Key")
            err = ApiError("Invalid API Key", "authentication_error")
            await _send_simple(send, err.code, err.body(), JSON_TYPE, cors)
            return

        if not cors:
            await self.app(scope, receive, send)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = list(message.get("headers", [])) + cors
            await send(message)

        await self.app(scope, receive, send_with_cors)


async def _send_simple(
    send: Send, status: int, body: bytes, content_type: str, extra: list[tuple[bytes, bytes]]
) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# --- streaming ------------------------------------------------------------------------------


class EventStream(Response):
    """An SSE response whose chunks come from an async iterator; `on_close` always runs.

    Written as a plain ASGI response (not StreamingResponse) so that nothing else reads
    `receive`: the request's disconnect watcher owns it.
    """

    def __init__(
        self, chunks: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]]
    ) -> None:
        super().__init__(status_code=200, media_type="text/event-stream")
        self.chunks = chunks
        self.on_close = on_close
        self.raw_headers = [
            (k, v) for k, v in self.raw_headers if k not in (b"content-length", b"content-type")
        ] + [
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for chunk in self.chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the client went away mid-write
            pass
        finally:
            await self.on_close()


_DISCONNECTED = object()


class Channel:
    """Carries what the engine thread emits for one job to the event loop, in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[Any] = asyncio.Queue()

    def emit(self, item: Any) -> None:  # called on the engine thread
        with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    async def get(self) -> Any:
        return await self.queue.get()


async def _watch_disconnect(request: Request, job: Job, channel: Channel) -> None:
    """Cancel the job as soon as the client disconnects (the engine stops within a token)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel.set()
            channel.queue.put_nowait(_DISCONNECTED)
            return


# --- the server -------------------------------------------------------------------------------


class Server:
    """State shared by the handlers: settings, the engine worker and the model's facts."""

    def __init__(self, worker: EngineWorker, settings: ServerSettings) -> None:
        self.worker = worker
        self.settings = settings
        self.info: ModelInfo | None = None
        # Undecodable bytes from argv or the environment come back as they were given.
        self._keys = [k.encode("utf-8", "surrogateescape") for k in settings.api_keys]

    @property
    def model(self) -> LoadedModel:
        assert self.worker.model is not None
        return self.worker.model

    def key_ok(self, headers: Headers) -> bool:
        given = headers.get("authorization", "")
        if not given:
            given = headers.get("x-api-key", "")
        if given.startswith("Bearer "):
            given = given[len("Bearer ") :]
        raw = given.encode("latin-1")  # the header's bytes as sent (Headers decoded latin-1)
        ok = False
        for key in self._keys:  # compare against every key: time does not reveal which matched
            ok |= hmac.compare_digest(raw, key)
        return ok

    # --- request plumbing ------------------------------------------------------------------

    async def read_json(self, request: Request) -> dict[str, Any]:
        """The body as a JSON object, read within the size and time limits."""
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ApiError(
                f"request body of {declared} bytes is larger than the {limit} bytes allowed",
                code=413,
            )
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.settings.read_timeout):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise ApiError(
                            f"request body is larger than the {limit} bytes allowed", code=413
                        )
                    chunks.append(chunk)
        except TimeoutError as exc:
            raise ApiError("timed out reading the request body", code=408) from exc
        raw = b"".join(chunks)
        if len(raw) <= _PARSE_INLINE_MAX:
            data = _parse_body(raw)
        else:  # a large body takes milliseconds to parse and scan: not on the event loop
            data = await asyncio.to_thread(_parse_body, raw)
        if not isinstance(data, dict):
            raise ApiError(f"the request body must be a JSON object, not {_jtype(data)}")
        return data

    async def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        engine = self.model.engine
        if len(text) <= _TOKENIZE_INLINE_MAX:
            return engine.tokenize(text, add_special=add_special, parse_special=parse_special)
        return await asyncio.to_thread(
            engine.tokenize, text, add_special=add_special, parse_special=parse_special
        )

    async def prompt_tokens(self, prompt: Any) -> list[int]:
        """`prompt` of /completion: a string, token ids, or strings and ids mixed."""
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return await self.tokenize(prompt, add_special=True, parse_special=True)
        if isinstance(prompt, list):
            if any(isinstance(p, list) for p in prompt) or (
                len(prompt) > 1 and all(isinstance(p, str) for p in prompt)
            ):
                raise ApiError("several prompts in one request are not supported; send one")
            engine = self.model.engine

            def mixed(parts: list[Any]) -> list[int]:
                tokens: list[int] = []
                for i, part in enumerate(parts):
                    if isinstance(part, str):
                        tokens += engine.tokenize(part, add_special=i == 0, parse_special=True)
                    elif isinstance(part, int) and not isinstance(part, bool):
                        tokens.append(part)
                    else:
                        raise ApiError(_PROMPT_TYPES)
                return tokens

            # Many short strings add up: tokenized together in a thread, off the event loop.
            return await asyncio.to_thread(mixed, prompt)
        raise ApiError(_PROMPT_TYPES)

    def chat_messages(
        self, body: Mapping[str, Any]
    ) -> tuple[
        list[dict[str, Any]],
        Callable[[Sequence[Mapping[str, Any]]], str],
        Callable[[Sequence[Mapping[str, Any]]], list[int]],
    ]:
        """The request's validated `messages`, and how to render (part of) them with the chat
        template, as text and as prompt tokens; a final assistant message is continued.

        The prompt tokens hold the template's control tokens, and each message's content as
        plain text: a message cannot forge a turn by spelling out `<|im_start|>system`. CPU
        work: call from a thread, not the event loop."""
        if "messages" not in body:
            raise ApiError("'messages' is required")
        if not isinstance(body["messages"], list):
            raise ApiError("Expected 'messages' to be an array")
        try:
            messages = validate_messages(body["messages"])
        except UsageError as exc:
            raise ApiError(str(exc)) from exc
        add_generation_prompt = body.get("add_generation_prompt", True)
        if not isinstance(add_generation_prompt, bool):
            raise ApiError("Field 'add_generation_prompt' must be a boolean")
        prompts = self.model.prompts
        if [m["role"] for m in messages[-2:]] == ["assistant", "assistant"]:
            raise ApiError("Cannot have 2 or more assistant messages at the end of the list.")

        def render(window: Sequence[Mapping[str, Any]]) -> str:
            final = window[-1]["role"] == "assistant"
            try:
                return prompts.text(
                    window, continue_final=final, add_generation_prompt=add_generation_prompt
                )
            except UsageError as exc:
                raise ApiError(str(exc)) from exc

        def prompt(window: Sequence[Mapping[str, Any]]) -> list[int]:
            final = window[-1]["role"] == "assistant"
            try:
                return prompts.tokens(
                    window, continue_final=final, add_generation_prompt=add_generation_prompt
                )
            except UsageError as exc:
                raise ApiError(str(exc)) from exc

        return messages, render, prompt

    def check_prompt(self, tokens: list[int]) -> None:
        engine = self.model.engine
        if any(not 0 <= t < engine.n_vocab for t in tokens):
            raise ApiError("Prompt contains invalid tokens")
        if tokens and len(tokens) >= engine.n_ctx:
            raise ApiError.exceed_context(len(tokens), engine.n_ctx)

    # --- generation --------------------------------------------------------------------------

    async def generate(
        self,
        request: Request,
        tokens: list[int],
        gen: Generation,
        kind: str,
        *,
        window: ChatWindow | None = None,
    ):
        """Queue one generation and answer in `kind`'s dialect: native, cmpl or chat.

        A chat's `window` leaves out whole oldest turns when the conversation does not fit,
        before and during the reply; the engine moves the KV cells of the kept turns instead
        of processing them again, and the response's `context_shift` says what was left out.
        """
        self.check_prompt(tokens)
        loop = asyncio.get_running_loop()
        channel = Channel(loop)
        job = Job(
            id=self.worker.next_id(),
            tokens=tokens,
            n_predict=gen.n_predict,
            sampling=gen.sampling,
            stop=gen.stop,
            emit=channel.emit,
            cache_prompt=gen.cache_prompt,
            n_keep=gen.n_keep,
            n_probs=gen.n_probs,
            window=window,
            params=generation_settings(gen, only_metrics=True),
        )
        reply = shapes.Reply(
            id=shapes.completion_id(),
            model=self.info.name if self.info else "",
            fingerprint=self.settings.build_info,
            n_prompt=len(tokens),
            context_shift=window.left_out if window is not None else None,
        )
        self.worker.submit(job)
        watcher = asyncio.create_task(_watch_disconnect(request, job, channel))

        async def close() -> None:
            job.cancel.set()
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

        try:
            first = await channel.get()
        except BaseException:
            await close()
            raise
        # As llama-server: an error before the first token is a plain error response.
        if first is _DISCONNECTED or isinstance(first, ApiError):
            await close()
            return error_response(first) if isinstance(first, ApiError) else Response(b"")
        if not gen.stream:
            probs: list[tuple[int, TokenProbs]] = []
            try:
                item = first
                while not isinstance(item, Done):
                    if item is _DISCONNECTED:
                        return Response(b"")
                    if isinstance(item, ApiError):
                        return error_response(item)
                    if item.probs is not None:
                        probs.append((item.token, item.probs))
                    item = await channel.get()
            finally:
                await close()
            if item.stop_type == "word" and probs:
                # As llama-server: leave out the tokens of the stop string.
                stop = await self.tokenize(
                    item.stopping_word, add_special=False, parse_special=False
                )
                del probs[max(0, len(probs) - len(stop)) :]
            return json_response(self._final(kind, reply, item, gen, tokens, probs=probs))
        return EventStream(self._stream(kind, reply, first, channel, gen, tokens), close)

    async def _stream(
        self,
        kind: str,
        reply: shapes.Reply,
        first: Any,
        channel: Channel,
        gen: Generation,
        tokens: list[int],
    ) -> AsyncIterator[bytes]:
        if kind == "chat":
            yield shapes.sse(shapes.chat_role_chunk(reply))
        item = first
        n_decoded = 0
        held: list[tuple[int, TokenProbs]] = []  # chat: probs of tokens whose text is held back
        while True:
            if item is _DISCONNECTED:
                return
            if isinstance(item, ApiError):
                yield shapes.sse({"error": item.payload()})
                return
            if isinstance(item, Done):
                break
            assert isinstance(item, TokenEvent)
            n_decoded += 1
            probs = [(item.token, item.probs)] if item.probs is not None else []
            if kind == "native":
                yield shapes.sse(
                    shapes.native_partial(reply, item.text, item.token, n_decoded, item.probs)
                )
            elif kind == "cmpl":
                yield shapes.sse(shapes.cmpl_partial(reply, item.text, probs))
            else:
                held += probs
                if item.text:
                    yield shapes.sse(shapes.chat_chunk(reply, {"content": item.text}, None, held))
                    held = []
            item = await channel.get()
        done = item
        if kind == "native":
            yield shapes.sse(self._final(kind, reply, done, gen, tokens, stream=True))
            return
        if kind == "cmpl":
            yield shapes.sse(shapes.cmpl_final(reply, done, stream=True))
        else:
            for chunk in shapes.chat_final_chunks(reply, done, include_usage=gen.include_usage):
                yield shapes.sse(chunk)
        yield shapes.DONE_EVENT

    def _final(
        self,
        kind: str,
        reply: shapes.Reply,
        done: Done,
        gen: Generation,
        tokens: list[int],
        *,
        stream: bool = False,
        probs: Sequence[tuple[int, TokenProbs]] = (),
    ) -> dict[str, Any]:
        if kind == "cmpl":
            return shapes.cmpl_final(reply, done, stream=False, probs=probs)
        if kind == "chat":
            return shapes.chat_final(reply, done, probs)
        return shapes.native_final(
            reply,
            done,
            stream=stream,
            prompt_text=self.model.engine.detokenize(tokens, special=True),
            settings=gen.settings_json,
            return_tokens=gen.return_tokens,
            probs=probs,
        )

    # --- handlers ------------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        return json_response({"status": "ok"})

    async def completion(self, request: Request) -> Response:
        body = await self.read_json(request)
        # Off the event loop: a JSON schema becomes a grammar here.
        gen = await asyncio.to_thread(parse_generation, body, self.settings)
        if "prompt" not in body:
            raise ApiError("[json.exception.out_of_range.403] key 'prompt' not found")
        tokens = await self.prompt_tokens(body["prompt"])
        return await self.generate(request, tokens, gen, "native")

    async def completions_oai(self, request: Request) -> Response:
        body = await self.read_json(request)
        gen = await asyncio.to_thread(parse_generation, body, self.settings)
        if "prompt" not in body:
            raise ApiError("[json.exception.out_of_range.403] key 'prompt' not found")
        tokens = await self.prompt_tokens(body["prompt"])
        return await self.generate(request, tokens, gen, "cmpl")

    async def chat_completions(self, request: Request) -> Response:
        body = await self.read_json(request)
        n_ctx = self.model.engine.n_ctx

        def prepare() -> tuple[Generation, ChatWindow]:
            # Templates, tokenizing and fitting are CPU work that grows with the conversation:
            # done in a thread, so the event loop keeps answering (/health, other streams).
            # Tokenizing only reads the vocabulary, which the engine thread never changes.
            fields = _chat_to_completion_fields(body)
            gen = parse_generation(fields, self.settings)
            messages, _, prompt = self.chat_messages(fields)
            window = ChatWindow(messages, prompt, n_ctx)
            reserve = n_ctx // REPLY_RESERVE_FRACTION
            window.fit(n_ctx - (min(reserve, gen.n_predict) if gen.n_predict > 0 else reserve))
            return gen, window

        gen, window = await asyncio.to_thread(prepare)
        if window.left_out["turns"]:
            log.info(
                "context full: %d oldest turn(s) (%d tokens) left the window",
                window.left_out["turns"],
                window.left_out["tokens"],
            )
        return await self.generate(request, window.tokens, gen, "chat", window=window)

    async def apply_template(self, request: Request) -> Response:
        body = await self.read_json(request)

        def apply() -> str:
            messages, render, _ = self.chat_messages(body)
            return render(messages)

        return json_response({"prompt": await asyncio.to_thread(apply)})

    async def tokenize_endpoint(self, request: Request) -> Response:
        body = await self.read_json(request)
        if "content" not in body:
            return json_response({"tokens": []})
        add_special = _flag(body, "add_special", False)
        parse_special = _flag(body, "parse_special", True)
        with_pieces = _flag(body, "with_pieces", False)
        content = body["content"]
        if isinstance(content, str):
            tokens = await self.tokenize(
                content, add_special=add_special, parse_special=parse_special
            )
        elif isinstance(content, list):
            tokens = []
            for i, part in enumerate(content):
                if isinstance(part, str):
                    tokens += await self.tokenize(
                        part, add_special=add_special and i == 0, parse_special=parse_special
                    )
                elif isinstance(part, int) and not isinstance(part, bool):
                    tokens.append(part)
                else:
                    raise ApiError(_PROMPT_TYPES)
            self.check_tokens(tokens)
        else:
            raise ApiError("Field 'content' must be a string or an array")
        if not with_pieces:
            return json_response({"tokens": tokens})

        def pieces(model: LoadedModel) -> list[dict[str, Any]]:
            out = []
            for tok in tokens:
                raw = model.engine.token_bytes(tok, special=True)
                try:
                    piece: Any = raw.decode("utf-8")
                except UnicodeDecodeError:
                    piece = list(raw)
                out.append({"id": tok, "piece": piece})
            return out

        return json_response({"tokens": await asyncio.wrap_future(self.worker.call(pieces))})

    def check_tokens(self, tokens: list[Any]) -> None:
        n_vocab = self.model.engine.n_vocab
        for tok in tokens:
            if not isinstance(tok, int) or isinstance(tok, bool) or not 0 <= tok < n_vocab:
                raise ApiError(
                    f"token id {tok!r} is out of the vocabulary (0..{n_vocab - 1})"
                    if isinstance(tok, int)
                    else "'tokens' must be an array of token ids"
                )

    async def detokenize(self, request: Request) -> Response:
        body = await self.read_json(request)
        tokens = body.get("tokens")
        if tokens is None:
            return json_response({"content": ""})
        if not isinstance(tokens, list):
            raise ApiError("'tokens' must be an array of token ids")
        self.check_tokens(tokens)
        text = self.model.engine.detokenize(tokens, special=True)
        return json_response({"content": text})

    async def models(self, request: Request) -> Response:
        info = self.info
        assert info is not None
        return json_response(
            {
                "models": [
                    {
                        "name": info.name,
                        "model": info.name,
                        "modified_at": "",
                        "size": "",
                        "digest": "",
                        "type": "model",
                        "description": "",
                        "tags": [""],
                        "capabilities": ["completion"],
                        "parameters": "",
                        "details": {
                            "parent_model": "",
                            "format": "gguf",
                            "family": "",
                            "families": [""],
                            "parameter_size": "",
                            "quantization_level": "",
                        },
                    }
                ],
                "object": "list",
                "data": [
                    {
                        "id": info.name,
                        "aliases": [info.name],
                        "tags": [],
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "llamacpp",
                        "meta": {
                            "vocab_type": info.vocab_type,
                            "n_vocab": info.n_vocab,
                            "n_ctx": info.n_ctx,
                            "n_ctx_train": info.n_ctx_train,
                            "n_embd": info.n_embd,
                            "n_params": info.n_params,
                            "size": info.size,
                            "ftype": info.ftype,
                        },
                    }
                ],
            }
        )

    def _default_generation(self) -> Generation:
        return parse_generation({}, self.settings)

    async def props(self, request: Request) -> Response:
        info = self.info
        assert info is not None
        s = self.settings
        return json_response(
            {
                "default_generation_settings": {
                    "params": generation_settings(self._default_generation(), only_metrics=True),
                    "n_ctx": info.n_ctx,
                },
                "total_slots": s.n_parallel,
                "model_alias": info.name,
                "model_ftype": info.ftype,
                "model_path": info.path,
                "modalities": {"vision": False, "video": False, "audio": False},
                "endpoint_slots": s.slots,
                "endpoint_props": False,
                "endpoint_metrics": s.metrics,
                "ui": False,
                "chat_template": info.chat_template,
                "chat_template_caps": {},
                "bos_token": info.bos_token,
                "eos_token": info.eos_token,
                "build_info": s.build_info,
                "is_sleeping": False,
            }
        )

    async def props_post(self, request: Request) -> Response:
        raise ApiError(
            "This server does not support changing global properties",
            "not_supported_error",
        )

    async def slots(self, request: Request) -> Response:
        if not self.settings.slots:
            raise ApiError(
                "This server does not support slots endpoint. Start it with `--slots`",
                "not_supported_error",
            )
        slot = self.worker.slot
        n_ctx = self.model.engine.n_ctx
        out = []
        for i in range(self.settings.n_parallel):
            data: dict[str, Any] = {
                "id": i,
                "n_ctx": n_ctx,
                "speculative": False,
                "is_processing": i == 0 and slot.processing,
            }
            if i == 0 and slot.id_task >= 0:
                data.update(
                    {
                        "id_task": slot.id_task,
                        "n_prompt_tokens": slot.n_prompt_tokens,
                        "n_prompt_tokens_processed": slot.n_prompt_tokens_processed,
                        "n_prompt_tokens_cache": slot.n_prompt_tokens_cache,
                        "params": slot.params,
                        "next_token": [
                            {
                                "has_next_token": slot.processing,
                                "has_new_line": slot.has_new_line,
                                "n_remain": (
                                    -1
                                    if slot.n_predict < 0
                                    else max(slot.n_predict - slot.n_decoded, 0)
                                ),
                                "n_decoded": slot.n_decoded,
                            }
                        ],
                        "prompt": self.model.engine.detokenize(list(slot.prompt), special=True),
                        "generated": slot.generated,
                    }
                )
            out.append(data)
        if request.query_params.get("fail_on_no_slot") and all(s["is_processing"] for s in out):
            raise ApiError("no slot available", "unavailable_error")
        return json_response(out)

    async def metrics(self, request: Request) -> Response:
        if not self.settings.metrics:
            raise ApiError(
                "This server does not support metrics endpoint. Start it with `--metrics`",
                "not_supported_error",
            )
        m = self.worker.metrics
        processing = 1 if self.worker.slot.processing else 0
        counters = [
            ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens",
             m.prompt_tokens_total),
            ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache",
             m.prompt_tokens_cached_total),
            ("prompt_seconds_total", "Total time spent processing prompts",
             m.prompt_seconds_total),
            ("tokens_predicted_total", "Number of generation tokens processed",
             m.tokens_predicted_total),
            ("tokens_predicted_seconds_total", "Total time spent generating tokens",
             m.tokens_predicted_seconds_total),
            ("n_decode_total", "Total number of llama_decode() calls, excluding speculative "
             "decoding and multimodal decoding", m.n_decode_total),
            ("n_tokens_max", "Largest observed sequence length (prompt + generation)",
             m.n_tokens_max),
        ]  # fmt: skip
        gauges = [
            ("prompt_tokens_seconds", "Average prompt throughput in tokens/s",
             m.bucket_prompt_n / m.bucket_prompt_s if m.bucket_prompt_s else 0.0),
            ("predicted_tokens_seconds", "Average generation throughput in tokens/s",
             m.bucket_predicted_n / m.bucket_predicted_s if m.bucket_predicted_s else 0.0),
            ("requests_processing", "Number of requests processing", processing),
            ("requests_deferred", "Number of requests deferred", self.worker.queued),
            ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
             1 if m.n_decode_total else 0),
        ]  # fmt: skip
        m.bucket_prompt_n = m.bucket_predicted_n = 0
        m.bucket_prompt_s = m.bucket_predicted_s = 0.0
        lines = []
        for kind, items in (("counter", counters), ("gauge", gauges)):
            for name, help_, value in items:
                lines += [
                    f"# HELP llamacpp:{name} {help_}",
                    f"# TYPE llamacpp:{name} {kind}",
                    f"llamacpp:{name} {_prom(value)}",
                ]
        return Response(
            ("\n".join(lines) + "\n").encode(),
            media_type="text/plain; version=0.0.4",
            headers={"Process-Start-Time-Unix": str(int(m.t_start))},
        )

    async def embeddings(self, request: Request) -> Response:
        raise ApiError(
            "This server does not support embeddings: localfab serve runs one model for "
            "generation (completion and chat)",
            "not_supported_error",
        )

    async def rerank(self, request: Request) -> Response:
        raise ApiError(
            "This server does not support reranking: localfab serve runs one model for "
            "generation (completion and chat)",
            "not_supported_error",
        )


_PROMPT_TYPES = (
    '"prompt" elements must be a string, a list of tokens, a JSON object containing a prompt '
    "string, or a list of mixed strings & tokens."
)


def _prom(value: float) -> str:
    # C++ ostream prints doubles with 6 significant digits and integers without a fraction.
    return f"{value:g}"


def _jtype(value: Any) -> str:
    from localfab.server.params import json_type

    return json_type(value)


def _parse_body(raw: bytes) -> Any:
    """The request body as JSON; ApiError for invalid JSON or a lone surrogate in a string."""
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise ApiError(f"invalid JSON in the request body: {exc}") from exc
    bad = lone_surrogate(data)
    if bad is not None:
        where, char = bad
        raise ApiError(
            f"invalid JSON in the request body: {where} holds a lone surrogate ({char}), "
            "which is not Unicode text; send valid UTF-8 (surrogates only in pairs)"
        )
    return data


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _flag(body: Mapping[str, Any], name: str, default: bool) -> bool:
    from localfab.server.params import boolean

    return boolean(body, name, default)


def _chat_to_completion_fields(body: dict[str, Any]) -> dict[str, Any]:
    """OpenAI chat fields -> llama-server's completion fields (its oaicompat_chat_params_parse)."""
    body = dict(body)
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        raise ApiError("tools param requires --jinja flag", "server_error")
    if body.get("tool_choice") not in (None, "auto"):
        raise ApiError("tool_choice param requires --jinja flag", "server_error")
    if body.get("json_schema") is not None and body.get("grammar"):
        raise ApiError("Cannot use both json_schema and grammar")
    if "response_format" in body:
        fmt = body["response_format"]
        if fmt is not None and not isinstance(fmt, dict):
            raise ApiError("Field 'response_format' must be an object")
        fmt = fmt or {}
        kind = fmt.get("type") or ""
        if not isinstance(kind, str):
            raise ApiError("Field 'response_format.type' must be a string")
        if kind == "json_object":
            if "schema" in fmt or not body.get("json_schema"):
                body["json_schema"] = fmt.get("schema") or {}
        elif kind == "json_schema":
            wrapper = fmt.get("json_schema") or {}
            if not isinstance(wrapper, dict):
                raise ApiError("Field 'response_format.json_schema' must be an object")
            body["json_schema"] = wrapper.get("schema") or {}
        elif kind and kind != "text":
            raise ApiError(
                'response_format type must be one of "text" or "json_object", but got: ' + kind
            )
    if body.get("logprobs") is True:
        top = body.get("top_logprobs")
        body["n_probs"] = 20 if top is None else top  # llama-server's default
    elif body.get("top_logprobs") is not None:
        raise ApiError("top_logprobs requires logprobs to be set to true")
    return body


# --- routing and error wrapping ---------------------------------------------------------------


def _wrap(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Any]:
    """llama-server's ex_wrapper: every failure becomes its JSON error body."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as exc:
            return error_response(exc)
        except UsageError as exc:
            return error_response(ApiError(str(exc)))
        except LocalfabError as exc:
            return error_response(ApiError(str(exc), "server_error"))
        except Exception as exc:
            log.exception("request failed")
            return error_response(ApiError(f"{type(exc).__name__}: {exc}", "server_error"))

    return endpoint


async def _not_found(request: Request, exc: Exception) -> Response:
    return Response(
        dumps({"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}),
        status_code=404,
        media_type=JSON_TYPE,
    )


def create_app(
    model: LoadedModel | Engine | Callable[[], LoadedModel],
    settings: ServerSettings | None = None,
    *,
    close_model: bool | None = None,
) -> Starlette:
    """The ASGI app for one model: a LoadedModel, a bare Engine, or a loader run at startup.

    With a loader, the app answers 503 `Loading model` (also on /health) until it has loaded.
    The worker thread starts with the app's lifespan and stops (cancelling every job) with it;
    a model passed in stays open, a model the loader made is closed on shutdown (unless
    `close_model` says otherwise).
    """
    if close_model is None:
        close_model = callable(model) and not hasattr(model, "tokenize")
    settings = settings or ServerSettings()
    source = _as_source(model)
    worker = EngineWorker(source, context_shift=settings.context_shift)
    if not settings.model_name:
        path = getattr(source, "path", None)
        if path is not None:
            from dataclasses import replace

            settings = replace(settings, model_name=str(path))
    server = Server(worker, settings)

    def on_ready() -> None:
        if worker.model is not None:
            name = settings.public_model_name or str(worker.model.path)
            server.info = _model_info(worker.model, replace_name(settings, name))

    worker.on_ready = on_ready

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        worker.start()
        try:
            yield
        finally:
            worker.stop()
            if close_model and worker.model is not None:
                worker.model.close()

    s = server
    routes = [
        Route("/health", _wrap(s.health), methods=["GET"]),
        Route("/v1/health", _wrap(s.health), methods=["GET"]),
        Route("/metrics", _wrap(s.metrics), methods=["GET"]),
        Route("/props", _wrap(s.props), methods=["GET"]),
        Route("/props", _wrap(s.props_post), methods=["POST"]),
        Route("/models", _wrap(s.models), methods=["GET"]),
        Route("/v1/models", _wrap(s.models), methods=["GET"]),
        Route("/completion", _wrap(s.completion), methods=["POST"]),
        Route("/completions", _wrap(s.completion), methods=["POST"]),
        Route("/v1/completions", _wrap(s.completions_oai), methods=["POST"]),
        Route("/chat/completions", _wrap(s.chat_completions), methods=["POST"]),
        Route("/v1/chat/completions", _wrap(s.chat_completions), methods=["POST"]),
        Route("/apply-template", _wrap(s.apply_template), methods=["POST"]),
        Route("/tokenize", _wrap(s.tokenize_endpoint), methods=["POST"]),
        Route("/detokenize", _wrap(s.detokenize), methods=["POST"]),
        Route("/slots", _wrap(s.slots), methods=["GET"]),
        Route("/embedding", _wrap(s.embeddings), methods=["POST"]),
        Route("/embeddings", _wrap(s.embeddings), methods=["POST"]),
        Route("/v1/embeddings", _wrap(s.embeddings), methods=["POST"]),
        Route("/rerank", _wrap(s.rerank), methods=["POST"]),
        Route("/reranking", _wrap(s.rerank), methods=["POST"]),
        Route("/v1/rerank", _wrap(s.rerank), methods=["POST"]),
        Route("/v1/reranking", _wrap(s.rerank), methods=["POST"]),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={404: _not_found, 405: _not_found},
    )
    app.add_middleware(Gate, server=server)
    app.state.server = server
    app.state.worker = worker
    return app


def replace_name(settings: ServerSettings, name: str) -> ServerSettings:
    from dataclasses import replace

    return replace(settings, model_name=name)


def _as_source(model: Any) -> Any:
    """A LoadedModel as is; a bare Engine wrapped with a PromptBuilder; a loader as is."""
    from localfab.runtime import LoadedModel

    if isinstance(model, LoadedModel) or (callable(model) and not hasattr(model, "tokenize")):
        return model
    from localfab.chat.prompt import PromptBuilder

    prompts = PromptBuilder(model)
    notices = [prompts.notice] if prompts.notice else []
    return LoadedModel(engine=model, prompts=prompts, path=Path(model.path), notices=notices)
