"""Resumable streams through the router (llama-server's router does the same).

A generation request with `X-Conversation-Id` is remembered with its model before it waits for
the model to load, so that `GET /v1/stream` and `DELETE /v1/stream` reach the model's server
that holds its session (see `streams`): a read while the model still loads is a 503 (retry), a
Stop while it loads cancels the waiting request (its answer: a 400 saying so), and the request
goes on to the model when its client dropped during the load, so the reply can be read back.

With several API keys a stream belongs to the key that started it (as in `streams`): the router
files conversations under their key, and a model's server (which has no keys) gets each id
scoped by its key (`key1/ID`), so that two keys' conversations of the same id are two sessions
there too; the scope is taken off what the lookup answers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
from starlette.requests import Request
from starlette.responses import Response

from localfab.server.errors import ApiError
from localfab.server.plumbing import json_response
from localfab.server.router_pool import Instance, Pool
from localfab.server.streams import conv_param, lookup_ids, owner_of

STOPPED = "request cancelled by a stop while the model was loading"
ASK_TIMEOUT = 5.0  # seconds a model's server has to answer a stop or a lookup


@dataclass
class _Conv:
    model: str
    ticket: int
    waiting: bool = True  # its request still waits for the model to load


Conv = tuple[str, str]  # a conversation: its owner (`streams.owner_of`) and its id


def scoped(conv: Conv) -> str:
    """The conversation's id as a model's server gets it: prefixed by its owner, if any (an
    owner holds no '/', so two owners' ids never meet)."""
    owner, name = conv
    return f"{owner}/{name}" if owner else name


class ConvModels:
    """Which model serves each conversation's stream (best effort: a stale entry answers 404)."""

    def __init__(self) -> None:
        self.convs: dict[Conv, _Conv] = {}
        self.tickets = 0

    def remember(self, conv: Conv, model: str) -> int:
        self.tickets += 1
        self.convs[conv] = _Conv(model, self.tickets)
        return self.tickets

    def alive(self, conv: Conv, ticket: int) -> bool:
        entry = self.convs.get(conv)
        return entry is not None and entry.ticket == ticket

    def settle(self, conv: Conv, ticket: int) -> None:
        if self.alive(conv, ticket):
            self.convs[conv].waiting = False

    def forget(self, conv: Conv) -> None:
        self.convs.pop(conv, None)


class Router(Protocol):
    """What these endpoints use of the router (`router.Router`)."""

    pool: Pool
    client: httpx.AsyncClient
    convs: ConvModels
    settings: Any
    autoload: bool
    key_ok: Any

    async def ready(
        self, name: str, autoload: bool, request: Request, gone: Callable[[], bool] | None = None
    ) -> tuple[Instance, str]: ...

    async def forward(
        self,
        request: Request,
        inst: Instance,
        body: bytes | None,
        note: str,
        *,
        conv: str | None = None,
    ) -> Response: ...


def conv_of(router: Router, name: str, request: Request) -> Conv:
    """The conversation `name` of the request's owner."""
    return owner_of(router, request), name


async def ready_for(
    router: Router, name: str, conv: Conv, request: Request
) -> tuple[Instance, str]:
    """The model's server for a request of conversation `conv`: only a Stop cancels the wait
    (not the client leaving)."""
    ticket = router.convs.remember(conv, name)

    def stopped() -> bool:
        return not router.convs.alive(conv, ticket)

    try:
        found = await router.ready(name, router.autoload, request, stopped)
    except ApiError:
        if stopped():
            raise ApiError(STOPPED) from None
        raise
    finally:
        router.convs.settle(conv, ticket)
    if stopped():
        raise ApiError(STOPPED)
    return found


def _holder(router: Router, conv: Conv) -> Instance | None:
    """The loaded model's server that holds the conversation's session."""
    entry = router.convs.convs.get(conv)
    inst = router.pool.instances.get(entry.model) if entry is not None else None
    if inst is None or inst.status != "loaded" or inst.stopping:
        return None
    return inst


def _auth(request: Request) -> dict[str, str]:
    key = request.headers.get("authorization")
    return {"authorization": key} if key else {}


async def stream_get(router: Router, request: Request) -> Response:
    """GET /v1/stream: passed on to the model that holds the session."""
    conv = conv_of(router, conv_param(request), request)
    inst = _holder(router, conv)
    if inst is None:
        entry = router.convs.convs.get(conv)
        loading = router.pool.instances.get(entry.model) if entry is not None else None
        if entry is not None and (
            entry.waiting or (loading is not None and loading.status == "loading")
        ):
            raise ApiError("Stream owner model is loading, retry later", "unavailable_error")
        raise ApiError("Stream not found or expired", "not_found_error")
    return await router.forward(request, inst, None, "", conv=scoped(conv))


async def stream_delete(router: Router, request: Request) -> Response:
    """DELETE /v1/stream: the Stop, passed on to the model's server; a request still waiting
    for its model to load is cancelled."""
    conv = conv_of(router, conv_param(request), request)
    inst = _holder(router, conv)
    router.convs.forget(conv)
    if inst is not None:
        url = f"http://127.0.0.1:{inst.port}/v1/stream"
        with contextlib.suppress(httpx.HTTPError):  # else gone with its server
            await router.client.delete(
                url,
                params={"conv_id": scoped(conv)},
                headers=_auth(request),
                timeout=ASK_TIMEOUT,
            )
    return Response(status_code=204, media_type="application/json")


async def streams_lookup(router: Router, request: Request) -> Response:
    """POST /v1/streams/lookup: asked of the models that hold the ids' sessions only."""
    owner = owner_of(router, request)
    by_model: dict[int, tuple[Instance, list[str]]] = {}
    for name in await lookup_ids(request, router.settings):
        conv = (owner, name)
        inst = _holder(router, conv)
        if inst is not None:
            by_model.setdefault(id(inst), (inst, []))[1].append(scoped(conv))
    scope = f"{owner}/" if owner else ""

    async def ask(inst: Instance, ids: list[str]) -> list[Any]:
        url = f"http://127.0.0.1:{inst.port}/v1/streams/lookup"
        try:
            answer = await router.client.post(
                url, json={"conversation_ids": ids}, headers=_auth(request), timeout=ASK_TIMEOUT
            )
            found = answer.json() if answer.status_code == 200 else []
        except (httpx.HTTPError, ValueError):
            return []
        if not isinstance(found, list):
            return []
        entries = [entry for entry in found if isinstance(entry, dict)]
        if not scope:
            return entries
        mine = []
        for entry in entries:
            name = entry.get("conversation_id")
            if isinstance(name, str) and name.startswith(scope):
                mine.append({**entry, "conversation_id": name[len(scope) :]})
        return mine

    answers = await asyncio.gather(*(ask(inst, ids) for inst, ids in by_model.values()))
    return json_response([entry for found in answers for entry in found])
