"""Google Cloud Vertex AI's custom-container contract, as llama-server serves it (`AIP_MODE`).

With `AIP_MODE=PREDICTION` in the environment, the server listens on `AIP_HTTP_PORT` and answers
`POST AIP_PREDICT_ROUTE` (default `/predict`): `{"instances": [...]}` becomes
`{"predictions": [...]}`, one per instance, in order. Each instance names the endpoint it is for
in `@requestFormat`, as a camel-case name (`chatCompletions`, `completion`, `tokenize`, ...) or a
path (`/v1/chat/completions`); the rest of it is that endpoint's request body, never streamed.
An instance's failure is its prediction (an `{"error": ...}` object), not the request's.
`AIP_HEALTH_ROUTE` answers as `/health`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from localfab.server.errors import ApiError, dumps
from localfab.server.plumbing import EventStream, json_response, read_json
from localfab.server.settings import ServerSettings

Endpoint = Callable[[Request], Awaitable[Response]]

MAX_INSTANCES = 128  # llama-server's bound


def enabled() -> bool:
    return os.environ.get("AIP_MODE", "") == "PREDICTION"


def port(given: int) -> int:
    """`AIP_HTTP_PORT` in prediction mode (Vertex AI chooses it), else the one given."""
    value = os.environ.get("AIP_HTTP_PORT", "")
    return int(value) if enabled() and value.isdigit() else given


def route(name: str, default: str | None) -> str | None:
    value = os.environ.get(name, "") or default
    if value is None:
        return None
    return value if value.startswith("/") else "/" + value


def camel_name(path: str) -> str:
    """llama-server's alias of a path: /v1/chat/completions -> chatCompletions."""
    path = path.removeprefix("/v1").lstrip("/")
    path = re.split(r"[:{]", path, maxsplit=1)[0].rstrip("/")
    return re.sub(r"[/_-]+(.)", lambda m: m.group(1).upper(), path)


class Predict:
    """The predict route over the app's other endpoints (path -> endpoint, first one wins)."""

    def __init__(self, endpoints: Iterable[tuple[str, Endpoint]], settings: ServerSettings):
        self.settings = settings
        self.by_path: dict[str, Endpoint] = {}
        self.by_name: dict[str, tuple[str, Endpoint]] = {}
        for path, endpoint in endpoints:
            self.by_path.setdefault(path, endpoint)
            self.by_name.setdefault(camel_name(path), (path, endpoint))

    async def __call__(self, request: Request) -> Response:
        body = await read_json(request, self.settings)
        instances = body.get("instances")
        if not isinstance(instances, list):
            raise ApiError("request body must include an array field named instances")
        if len(instances) > MAX_INSTANCES:
            raise ApiError(f"instances array exceeds maximum size of {MAX_INSTANCES}")
        gone = asyncio.Event()
        watcher = asyncio.create_task(_watch(request, gone))
        try:
            predictions = await asyncio.gather(*(self.one(i, gone) for i in instances))
        finally:
            watcher.cancel()
        return json_response({"predictions": predictions})

    async def one(self, instance: Any, gone: asyncio.Event) -> Any:
        if not isinstance(instance, dict):
            return _error("each instance must be a JSON object")
        fmt = instance.get("@requestFormat")
        if not isinstance(fmt, str):
            return _error("each instance must include a string @requestFormat")
        found = self.by_name.get(fmt) or ((fmt, self.by_path[fmt]) if fmt in self.by_path else None)
        if found is None:
            return _error(f"no handler registered for @requestFormat: {fmt}")
        body = {k: v for k, v in instance.items() if k != "@requestFormat"}
        if "stream" in body:
            body["stream"] = False
        path, endpoint = found
        response = await endpoint(_sub_request(path, dumps(body), gone))
        if isinstance(response, EventStream):
            await response.on_close()
            return _error("predict route does not support streaming responses")
        text = bytes(response.body).decode("utf-8", errors="replace")
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError:
            return text


def _error(message: str) -> dict[str, Any]:
    return {"error": ApiError(message).payload()}


async def _watch(request: Request, gone: asyncio.Event) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    gone.set()


def _sub_request(path: str, body: bytes, gone: asyncio.Event) -> Request:
    """A request for one instance: its body, then a disconnect when the client goes."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "query_string": b"",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
    }
    return Request(scope, receive)
