"""Router mode: one server, many models, each loaded on demand (llama-server's router).

`localfab serve` without a model routes: every request names its model (`"model"` in a POST
body, `?model=` on a GET), which is loaded on first use in its own `localfab serve` process and
proxied to. `GET /models` lists what can be loaded and each one's state; `POST /models/load` and
`/models/unload` do it by hand. See `router_pool` for the queue and what decides the room: the
planner's memory for each model against the budget (`--models-memory`, default the machine's
free memory at start), besides llama-server's `--models-max` count.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from localfab.server import router_streams
from localfab.server.errors import ApiError, dumps
from localfab.server.gate import Gate
from localfab.server.keys import KeyCheck
from localfab.server.plumbing import json_response, not_found, read_json, wrap
from localfab.server.router_models import RouterModel
from localfab.server.router_pool import Instance, Pool, unloaded_error
from localfab.server.router_streams import ConvModels
from localfab.server.settings import ServerSettings
from localfab.server.streams import HEADER, conv_id

log = logging.getLogger("localfab.server")

# Proxied to the model named in the body (POST) or in ?model= (GET), as llama-server's router.
POST_PATHS = (
    "/completion", "/completions", "/v1/completions", "/chat/completions",
    "/v1/chat/completions", "/v1/responses", "/responses", "/v1/messages",
    "/v1/messages/count_tokens", "/infill", "/embedding", "/embeddings", "/v1/embeddings",
    "/rerank", "/reranking", "/v1/rerank", "/v1/reranking", "/tokenize", "/detokenize",
    "/apply-template", "/chat/completions/input_tokens", "/v1/chat/completions/input_tokens",
    "/v1/responses/input_tokens", "/props", "/slots/{id_slot}",
)  # fmt: skip
GET_PATHS = ("/metrics", "/props", "/slots")
DROP_HEADERS = {"server", "transfer-encoding", "content-length", "keep-alive", "date"}


class _Awake:
    """What the Gate reads of a worker: a router is always ready and never sleeps."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.ready.set()
        self.load_error = None
        self.sleep_lock = threading.Lock()
        self.in_flight = 0
        self.last_activity = 0.0
        self.sleeping = False


class Router:
    """The router's state, as its endpoints and the Gate see it."""

    def __init__(
        self,
        pool: Pool,
        settings: ServerSettings,
        *,
        autoload: bool,
        rescan: Callable[[], dict[str, RouterModel]] | None = None,
    ) -> None:
        self.pool = pool
        self.rescan = rescan  # the sources read again (GET /models?reload=1)
        self.settings = settings
        self.autoload = autoload
        self.key_ok = KeyCheck(settings.api_keys)
        self.convs = ConvModels()  # which model serves each resumable stream
        self.worker = _Awake()
        self.info = True  # the Gate's "model loaded" check: a router answers at once
        # Loopback only: no proxy from the environment; as many connections as the router takes.
        limits = httpx.Limits(max_connections=settings.max_connections)
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=10), limits=limits, trust_env=False
        )
        self.created = int(time.time())

    async def wake(self) -> None:
        """A router never sleeps (its models' servers may, with --sleep-idle-seconds)."""

    def canonical(self, name: Any) -> str:
        """The model's id for a name or alias; llama-server's 400s for none or an unknown one."""
        if not isinstance(name, str) or not name:
            raise ApiError("model name is missing from the request")
        models = self.pool.models
        if name in models:
            return name
        for model in models.values():
            if name in model.aliases:
                return model.id
        raise ApiError(f"model '{name}' not found")

    async def ready(
        self, name: str, autoload: bool, request: Request, gone: Callable[[], bool] | None = None
    ) -> tuple[Instance, str]:
        """The model's server once loaded; the wait ends when `gone` says (by default, when
        the client disconnects)."""
        if not autoload and self.pool.status(name) not in ("loading", "loaded"):
            raise ApiError("model is not loaded")
        disconnected = None
        if gone is None:
            disconnected = _watch(request)
            gone = disconnected.is_set
        try:
            inst, note = await self.pool.ensure_ready(name, gone)
        finally:
            if disconnected is not None:
                disconnected.cancel()
        if inst.status != "loaded":
            raise ApiError(f"model name={name} is not running")
        return inst, note

    async def forward(
        self,
        request: Request,
        inst: Instance,
        body: bytes | None,
        note: str,
        *,
        conv: str | None = None,
    ) -> Response:
        """The request sent on to the model's server; its answer streamed back as it comes.
        `conv`: the conversation id the model's server gets in place of the request's (in its
        header, or its `conv_id` parameter), scoped by its owner (`router_streams.scoped`)."""
        inst.busy += 1
        inst.last_used = time.monotonic()
        released = False

        async def release() -> None:
            nonlocal released
            if not released:
                released = True
                inst.busy -= 1
                inst.last_used = time.monotonic()  # recency counts from a request's end
                if inst.busy == 0 and inst.model.id not in self.pool.models:
                    self.pool.unload(inst, "because it left the model sources")
                await self.pool.notify()

        try:
            if self.pool.fake_timing:
                await asyncio.sleep(2)
            url = f"http://127.0.0.1:{inst.port}{request.url.path}"
            headers, params = _upstream(request, conv)
            upstream = self.client.build_request(
                request.method, url, params=params, headers=headers, content=body
            )
            answer = await self.client.send(upstream, stream=True)
        except BaseException as exc:
            await release()
            if isinstance(exc, httpx.HTTPError) and inst.unloaded:
                raise unloaded_error(inst.model.id, inst, "was sent to it") from exc
            if isinstance(exc, httpx.HTTPError):
                msg = f"model {inst.model.id} did not answer: {exc}"
                raise ApiError(msg, "server_error") from exc
            raise
        out_headers = {
            k: v
            for k, v in answer.headers.items()
            if k not in DROP_HEADERS and not k.startswith("access-control-") and k != "vary"
        }
        if note:
            out_headers["x-localfab-router"] = note

        async def close() -> None:
            await release()
            await answer.aclose()

        return ProxiedAnswer(answer.aiter_raw(), answer.status_code, out_headers, close)


def _upstream(request: Request, conv: str | None) -> tuple[dict[str, str], Any]:
    """The headers and query a request goes on with to a model's server; the conversation id
    replaced by `conv` where it is given."""
    # The router answers CORS itself: the model's server sees no Origin.
    headers = {
        k: v for k, v in request.headers.items() if k not in ("host", "content-length", "origin")
    }
    params: Any = request.query_params
    if conv is not None:
        if HEADER in headers:
            headers[HEADER] = conv
        if "conv_id" in params:
            params = {**params, "conv_id": conv}
    return headers, params


class ProxiedAnswer(StreamingResponse):
    """A model's answer passed on; `on_close` runs however the response ends, also when the
    client leaves before its first byte (the body iterator then never starts)."""

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        status: int,
        headers: dict[str, str],
        on_close: Callable[[], Awaitable[None]],
    ) -> None:
        super().__init__(chunks, status, headers)
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.on_close()


class _Flag:
    """Set once the client has disconnected (watched on a task of its own)."""

    def __init__(self, task: asyncio.Task[None], state: list[bool]) -> None:
        self.task, self.state = task, state

    def is_set(self) -> bool:
        return self.state[0]

    def cancel(self) -> None:
        self.task.cancel()


def _watch(request: Request) -> _Flag:
    state = [False]

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        state[0] = True

    return _Flag(asyncio.get_running_loop().create_task(watch()), state)


# --- endpoints ----------------------------------------------------------------------------------


def _flag(value: str | None, default: bool) -> bool:
    return default if not value else value in ("true", "1")


async def proxy_post(router: Router, request: Request) -> Response:
    body = await read_json(request, router.settings)  # within the size and time limits
    name = router.canonical(body.get("model"))
    conv = conv_id(request)
    if conv:
        scope = router_streams.conv_of(router, conv, request)
        inst, note = await router_streams.ready_for(router, name, scope, request)
        return await router.forward(
            request, inst, dumps(body), note, conv=router_streams.scoped(scope)
        )
    inst, note = await router.ready(name, router.autoload, request)
    return await router.forward(request, inst, dumps(body), note)


async def proxy_get(router: Router, request: Request) -> Response:
    name = router.canonical(request.query_params.get("model"))
    autoload = _flag(request.query_params.get("autoload"), router.autoload)
    inst, note = await router.ready(name, autoload, request)
    return await router.forward(request, inst, None, note)


async def props(router: Router, request: Request) -> Response:
    if request.query_params.get("model"):
        return await proxy_get(router, request)
    return json_response(
        {
            "role": "router",
            "max_instances": router.pool.models_max,
            "models_autoload": router.autoload,
            "model_alias": "llama-server",
            "model_path": "none",
            "default_generation_settings": {"params": {}, "n_ctx": 0},
            "build_info": f"b0-{router.settings.build_info}",
            "memory_budget": router.pool.budget,
        }
    )


async def models(router: Router, request: Request) -> Response:
    if request.query_params.get("reload") and router.rescan is not None:
        await router.pool.replace_models(await asyncio.to_thread(router.rescan))
    data = []
    for model in router.pool.models.values():
        if model.hidden:
            continue
        inst = router.pool.instances.get(model.id)
        status: dict[str, Any] = {"value": inst.status if inst else "unloaded"}
        if inst is not None:
            status["args"] = inst.args
            failed = inst.exit_code not in (0, None, -15) and not inst.unloaded
            if inst.status == "unloaded" and failed:
                status.update(failed=True, exit_code=inst.exit_code)
            status["memory"] = inst.cost.devices
        data.append(
            {
                "id": model.id,
                "aliases": list(model.aliases),
                "tags": [],
                "object": "model",
                "owned_by": "llamacpp",
                "created": router.created,
                "status": status,
                "source": model.source,
                "path": str(model.path) if model.path else None,
            }
        )
    return json_response({"data": data, "object": "list"})


async def load(router: Router, request: Request) -> Response:
    body = await read_json(request, router.settings)
    name = body.get("model")
    if not isinstance(name, str) or name not in router.pool.models:
        raise ApiError("model is not found", "not_found_error")
    note = await router.pool.load_now(name)
    return json_response({"success": True, **({"note": note} if note else {})})


async def unload(router: Router, request: Request) -> Response:
    body = await read_json(request, router.settings)
    name = body.get("model")
    if not isinstance(name, str) or name not in router.pool.models:
        raise ApiError("model is not found")
    inst = router.pool.instances.get(name)
    if inst is None or not inst.running:
        raise ApiError("model is not running")
    router.pool.unload(inst, "by POST /models/unload")
    return json_response({"success": True})


async def health(router: Router, request: Request) -> Response:
    return json_response({"status": "ok"})


Handler = Callable[[Router, Request], Awaitable[Response]]
ROUTES: tuple[tuple[str, str, Handler], ...] = (
    ("/health", "GET", health),
    ("/v1/health", "GET", health),
    ("/props", "GET", props),
    ("/models", "GET", models),
    ("/v1/models", "GET", models),
    ("/models/load", "POST", load),
    ("/models/unload", "POST", unload),
    ("/v1/stream", "GET", router_streams.stream_get),
    ("/v1/stream", "DELETE", router_streams.stream_delete),
    ("/v1/streams/lookup", "POST", router_streams.streams_lookup),
    *(("/" + p.lstrip("/"), "GET", proxy_get) for p in GET_PATHS if p != "/props"),
    *((p, "POST", proxy_post) for p in POST_PATHS),
)


def create_router_app(
    pool: Pool,
    settings: ServerSettings,
    *,
    autoload: bool = True,
    rescan: Callable[[], dict[str, RouterModel]] | None = None,
) -> Starlette:
    """The ASGI app of a router over `pool`; its models' processes end with the app."""
    router = Router(pool, settings, autoload=autoload, rescan=rescan)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        pool.changed = asyncio.Condition()  # bound to the serving loop
        pool.reloading = asyncio.Lock()
        # Plans made while nothing is loaded (in the background: /health answers now).
        planning = asyncio.get_running_loop().create_task(pool.plan_all())
        try:
            for model in pool.models.values():
                if model.load_on_startup:
                    await pool.load_now(model.id)
            yield
        finally:
            planning.cancel()
            await pool.close()
            await router.client.aclose()

    routes = [
        Route(path, wrap(functools.partial(handler, router)), methods=[method])
        for path, method, handler in ROUTES
    ]
    app = Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found}
    )
    app.add_middleware(Gate, server=router)
    app.state.router = router
    return app
