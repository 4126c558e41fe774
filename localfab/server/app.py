"""The llama-server compatible HTTP API as a Starlette app: `create_app(model, settings)`.

Endpoints, request fields, response fields, status codes, error bodies and SSE framing follow
llama.cpp's tools/server (server.cpp, server-context.cpp, server-http.cpp) of the same version as
the installed llama-cpp-python. One engine thread serves a FIFO queue (see `worker`), running
the jobs on parallel slots together with `-np` > 1 (see `slots`); the handlers
prepare each request (parse, validate, render the chat template, tokenize, fit the window) in a
worker thread, so the event loop only moves bytes, then await what the engine emits.

The parts: `gate` (Host, CORS, loading state, API key), `plumbing` (bodies, SSE, errors),
`dialects` (one per response shape), `generation` (jobs to responses), the handlers by area
(`completions`, `info`) and `metrics`.

A prompt that does not fit the context is llama-server's 400 `exceed_context_size_error`. With
`--context-shift`, a chat that does not fit leaves out whole oldest turns instead (the system
prompt stays), before and during the reply, and says so in `context_shift`; llama-server's
shift cuts at a token (keep `n_keep`, drop half the rest), which can split a turn in two. A
plain completion under `--context-shift` shifts as llama-server does.

Deliberate differences, all on bad input (llama-server answers these with 500 or 200):
malformed JSON and non-object bodies are 400 `invalid_request_error`; bodies over
`max_body_bytes` are 413; bodies slower than `read_timeout` are 408; empty `messages`, unknown
roles, more than 256 results in one request, negative `n_probs` or more than 1000, malformed
`logit_bias` entries and token ids outside the vocabulary are 400; a string holding a lone
surrogate is 400; grammars and JSON schemas beyond the documented size, nesting and expansion
limits are 400. And on exposure: on a loopback bind, a Host header that is not a loopback name
is 403 (DNS rebinding), and an Origin that is not loopback or allowed with `--allowed-origins`
is 403 with no CORS headers (llama-server echoes any Origin with credentials allowed).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from localfab.server import completions, info
from localfab.server.errors import ApiError
from localfab.server.gate import Gate, KeyCheck
from localfab.server.model_info import ModelInfo, model_info
from localfab.server.params import Generation
from localfab.server.plumbing import not_found, read_json, wrap
from localfab.server.settings import ServerSettings
from localfab.server.worker import EngineWorker, SlotView

if TYPE_CHECKING:
    from localfab.engine import Engine
    from localfab.ledger import LedgerWriter
    from localfab.runtime import LoadedModel

__all__ = ["Gate", "Server", "create_app"]

log = logging.getLogger("localfab.server")

# Prompts this long are tokenized in a thread so the event loop keeps answering.
_TOKENIZE_INLINE_MAX = 32 * 1024


class Server:
    """State shared by the handlers: settings, the engine worker and the model's facts."""

    def __init__(self, worker: EngineWorker, settings: ServerSettings) -> None:
        self.worker = worker
        self.settings = settings
        self.info: ModelInfo | None = None
        self.key_ok = KeyCheck(settings.api_keys)

    @property
    def model(self) -> LoadedModel:
        assert self.worker.model is not None
        return self.worker.model

    @property
    def slot_n_ctx(self) -> int:
        """The context each slot has: -c split over the slots (unless --kv-unified)."""
        return self.model.engine.n_ctx

    @property
    def n_processing(self) -> int:
        return self.worker.n_processing

    async def read_json(self, request: Request) -> dict[str, Any]:
        """The body as a JSON object, within the size and time limits (see `plumbing`)."""
        return await read_json(request, self.settings)

    def verbose(self, gen: Generation) -> bool:
        """Whether answers carry `__verbose` (--verbose, or the request's `verbose`)."""
        return self.settings.verbose if gen.verbose is None else gen.verbose

    def prompt_text(self, tokens: Sequence[int]) -> str:
        return self.model.engine.detokenize(tokens, special=True)

    async def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        engine = self.model.engine
        if len(text) <= _TOKENIZE_INLINE_MAX:
            return engine.tokenize(text, add_special=add_special, parse_special=parse_special)
        return await asyncio.to_thread(
            engine.tokenize, text, add_special=add_special, parse_special=parse_special
        )

    def check_prompt(self, tokens: list[int]) -> None:
        engine = self.model.engine
        if any(not 0 <= t < engine.n_vocab for t in tokens):
            raise ApiError("Prompt contains invalid tokens")
        if tokens and len(tokens) >= engine.n_ctx:
            raise ApiError.exceed_context(len(tokens), engine.n_ctx)

    def check_bias(self, gen: Generation) -> None:
        n_vocab = self.model.engine.n_vocab
        for tok, _ in gen.sampling.logit_bias:
            if not 0 <= tok < n_vocab:
                raise ApiError(
                    f"Field 'logit_bias': token id {tok} is out of the vocabulary "
                    f"(0..{n_vocab - 1})"
                )

    def slot_json(self, i: int) -> dict[str, Any]:
        """/slots' entry for slot `i`: its current (or last) task, as llama-server shows it."""
        slot = self.worker.slots[i] if i < len(self.worker.slots) else SlotView()
        data: dict[str, Any] = {
            "id": i,
            "n_ctx": self.slot_n_ctx,
            "speculative": self.model.engine.speculation is not None,
            "is_processing": slot.processing,
        }
        if slot.id_task < 0:
            return data
        n_remain = -1 if slot.n_predict < 0 else max(slot.n_predict - slot.n_decoded, 0)
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
                        "n_remain": n_remain,
                        "n_decoded": slot.n_decoded,
                    }
                ],
                "prompt": self.prompt_text(list(slot.prompt)),
                "generated": slot.generated,
            }
        )
        return data


Handler = Callable[["Server", Request], Awaitable[Response]]

# path, method, handler
ROUTES: tuple[tuple[str, str, Handler], ...] = (
    ("/health", "GET", info.health),
    ("/v1/health", "GET", info.health),
    ("/metrics", "GET", info.metrics),
    ("/props", "GET", info.props),
    ("/props", "POST", info.props_post),
    ("/models", "GET", info.models),
    ("/v1/models", "GET", info.models),
    ("/completion", "POST", completions.completion),
    ("/completions", "POST", completions.completion),
    ("/v1/completions", "POST", completions.completions_oai),
    ("/chat/completions", "POST", completions.chat_completions),
    ("/v1/chat/completions", "POST", completions.chat_completions),
    ("/apply-template", "POST", completions.apply_template),
    ("/tokenize", "POST", info.tokenize),
    ("/detokenize", "POST", info.detokenize),
    ("/slots", "GET", info.slots),
    ("/embedding", "POST", info.embeddings),
    ("/embeddings", "POST", info.embeddings),
    ("/v1/embeddings", "POST", info.embeddings),
    ("/rerank", "POST", info.rerank),
    ("/reranking", "POST", info.rerank),
    ("/v1/rerank", "POST", info.rerank),
    ("/v1/reranking", "POST", info.rerank),
)


def create_app(
    model: LoadedModel | Engine | Callable[[], LoadedModel],
    settings: ServerSettings | None = None,
    *,
    close_model: bool | None = None,
    ledger: LedgerWriter | None = None,
) -> Starlette:
    """The ASGI app for one model: a LoadedModel, a bare Engine, or a loader run at startup.

    With a loader, the app answers 503 `Loading model` (also on /health) until it has loaded.
    The worker thread starts with the app's lifespan and stops (cancelling every job) with it;
    a model passed in stays open, a model the loader made is closed on shutdown (unless
    `close_model` says otherwise). Each reply is recorded in `ledger` (the usage ledger), which
    is closed on shutdown.
    """
    if close_model is None:
        close_model = callable(model) and not hasattr(model, "tokenize")
    settings = settings or ServerSettings()
    source = _as_source(model)
    worker = EngineWorker(
        source, context_shift=settings.context_shift, ledger=ledger, n_parallel=settings.n_parallel
    )
    if not settings.model_name:
        path = getattr(source, "path", None)
        if path is not None:
            settings = replace(settings, model_name=str(path))
    server = Server(worker, settings)

    def on_ready() -> None:
        if worker.model is not None:
            name = settings.public_model_name or str(worker.model.path)
            server.info = model_info(worker.model, replace(settings, model_name=name))

    worker.on_ready = on_ready

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        worker.start()
        try:
            yield
        finally:
            worker.stop()
            if ledger is not None:
                ledger.close()
            if close_model and worker.model is not None:
                worker.model.close()

    routes = [
        Route(path, wrap(functools.partial(handler, server)), methods=[method])
        for path, method, handler in ROUTES
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={404: not_found, 405: not_found},
    )
    app.add_middleware(Gate, server=server)
    app.state.server = server
    app.state.worker = worker
    return app


def _as_source(model: Any) -> Any:
    """A LoadedModel as is; a bare Engine wrapped with a PromptBuilder; a loader as is."""
    from localfab.runtime import LoadedModel

    if isinstance(model, LoadedModel) or (callable(model) and not hasattr(model, "tokenize")):
        return model
    from localfab.chat.prompt import PromptBuilder

    prompts = PromptBuilder(model)
    notices = [prompts.notice] if prompts.notice else []
    return LoadedModel(engine=model, prompts=prompts, path=Path(model.path), notices=notices)
