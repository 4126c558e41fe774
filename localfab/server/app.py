"""The llama-server compatible HTTP API as a Starlette app: `create_app(model, settings)`.

Endpoints, request fields, response fields, status codes, error bodies and SSE framing follow
llama.cpp's tools/server (server.cpp, server-context.cpp, server-http.cpp) of the same version as
the installed llama-cpp-python. One engine thread serves a FIFO queue (see `worker`), running
the jobs on parallel slots together with `-np` > 1 (see `slots`); the handlers
prepare each request (parse, validate, render the chat template, tokenize, fit the window) in a
worker thread, so the event loop only moves bytes, then await what the engine emits.

The parts: `gate` (Host, CORS, loading state, API key), `plumbing` (bodies, SSE, errors),
`dialects` (one per response shape), `respond` (jobs to responses), the handlers by area
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

import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from localfab.errors import LocalfabError
from localfab.server import (
    anthropic,
    completions,
    gcp,
    infill,
    info,
    responses,
    slot_files,
    streams,
)
from localfab.server.gate import Gate
from localfab.server.model_info import model_info
from localfab.server.plumbing import not_found, wrap
from localfab.server.settings import ServerSettings
from localfab.server.state import Server
from localfab.server.streams import detaching
from localfab.server.worker import EngineWorker

if TYPE_CHECKING:
    from localfab.engine import Engine
    from localfab.ledger.writer import LedgerWriter
    from localfab.runtime import LoadedModel

__all__ = ["Gate", "Server", "create_app"]

log = logging.getLogger("localfab.server")

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
    ("/completion", "POST", detaching(completions.completion)),
    ("/completions", "POST", detaching(completions.completion)),
    ("/v1/completions", "POST", detaching(completions.completions_oai)),
    ("/chat/completions", "POST", detaching(completions.chat_completions)),
    ("/v1/chat/completions", "POST", detaching(completions.chat_completions)),
    ("/v1/messages", "POST", detaching(anthropic.messages)),
    ("/v1/messages/count_tokens", "POST", anthropic.count_tokens),
    ("/v1/responses", "POST", detaching(responses.responses)),
    ("/v1/responses/input_tokens", "POST", responses.input_tokens),
    ("/responses", "POST", detaching(responses.responses)),
    ("/responses/input_tokens", "POST", responses.input_tokens),
    ("/chat/completions/input_tokens", "POST", completions.chat_input_tokens),
    ("/v1/chat/completions/input_tokens", "POST", completions.chat_input_tokens),
    ("/infill", "POST", detaching(infill.infill)),
    ("/apply-template", "POST", completions.apply_template),
    ("/tokenize", "POST", info.tokenize),
    ("/detokenize", "POST", info.detokenize),
    ("/slots", "GET", info.slots),
    ("/slots/{id_slot}", "POST", slot_files.slot_action),
    ("/embedding", "POST", info.embeddings),
    ("/embeddings", "POST", info.embeddings),
    ("/v1/embeddings", "POST", info.embeddings),
    ("/rerank", "POST", info.rerank),
    ("/v1/stream", "GET", streams.stream_get),
    ("/v1/stream", "DELETE", streams.stream_delete),
    ("/v1/streams/lookup", "POST", streams.streams_lookup),
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
    worker = _worker(source, settings, ledger)
    if not settings.model_name:
        path = getattr(source, "path", None)
        if path is not None:
            settings = replace(settings, model_name=str(path))
    server = Server(worker, settings)

    def on_ready() -> None:
        if worker.model is not None:
            name = settings.public_model_name or str(worker.model.path)
            server.info = model_info(worker.model, replace(settings, model_name=name))
            server.remember(worker.model)

    worker.on_ready = on_ready

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        worker.start()
        try:
            yield
        finally:
            server.streams.close()
            worker.stop()
            if ledger is not None:
                ledger.close()
            if close_model and worker.model is not None:
                worker.model.close()

    app = Starlette(
        routes=_routes(server, settings),
        lifespan=lifespan,
        exception_handlers={404: not_found, 405: not_found},
    )
    app.add_middleware(Gate, server=server)
    app.state.server = server
    app.state.worker = worker
    return app


def _routes(server: Server, settings: ServerSettings) -> list[Route]:
    """The endpoints, each wrapped in llama-server's error answers (and Vertex AI's, if on)."""
    routes = [
        Route(path, wrap(functools.partial(handler, server)), methods=[method])
        for path, method, handler in ROUTES
    ]
    return routes + _gcp_routes(routes, settings) if gcp.enabled() else routes


def _gcp_routes(routes: list[Route], settings: ServerSettings) -> list[Route]:
    """Vertex AI's predict route (and its health route, if named) over the other endpoints."""
    taken = {r.path for r in routes}
    predict = gcp.route("AIP_PREDICT_ROUTE", "/predict")
    if predict in taken:
        raise LocalfabError(
            f"AIP_PREDICT_ROUTE={predict} conflicts with an existing llama-server route: "
            "choose another path"
        )
    endpoints = gcp.Predict(((r.path, r.endpoint) for r in routes), settings)
    added = [Route(str(predict), wrap(endpoints), methods=["POST"])]
    health = gcp.route("AIP_HEALTH_ROUTE", None)
    if health is not None and health not in taken:
        health_endpoint = next(r.endpoint for r in routes if r.path == "/health")
        added.append(Route(health, health_endpoint, methods=["GET"]))
    return added


def _worker(source: Any, settings: ServerSettings, ledger: LedgerWriter | None) -> EngineWorker:
    return EngineWorker(
        source,
        context_shift=settings.context_shift,
        ledger=ledger,
        n_parallel=settings.n_parallel,
        cache_ram=settings.cache_ram,
        cache_idle_slots=settings.cache_idle_slots,
        cache_disk=settings.cache_disk,
        sleep_idle=settings.sleep_idle_seconds,
    )


def _as_source(model: Any) -> Any:
    """A LoadedModel as is; a bare Engine wrapped with a PromptBuilder; a loader as is."""
    from localfab.runtime import LoadedModel

    if isinstance(model, LoadedModel) or (callable(model) and not hasattr(model, "tokenize")):
        return model
    from localfab.chat.prompt import PromptBuilder

    prompts = PromptBuilder(model)
    notices = [prompts.notice] if prompts.notice else []
    return LoadedModel(engine=model, prompts=prompts, path=Path(model.path), notices=notices)
