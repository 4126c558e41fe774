"""The router's proxied answer: the model's busy count is given back however the answer ends,
also when the client is gone before the first byte (the body iterator never starts then)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from localfab.server.router import ProxiedAnswer


def test_closed_when_the_client_left_before_the_first_byte() -> None:
    started, closed = [], []

    async def body() -> AsyncIterator[bytes]:
        started.append(True)
        await asyncio.sleep(10)
        yield b"never"

    async def on_close() -> None:
        closed.append(True)

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        await asyncio.sleep(0.05)  # the client is slow, then gone

    answer = ProxiedAnswer(body(), 200, {}, on_close)
    scope = {"type": "http", "asgi": {"spec_version": "2.3"}, "method": "POST"}  # uvicorn's h11
    asyncio.run(asyncio.wait_for(answer(scope, receive, send), 5))
    assert closed == [True]


def test_closed_after_a_whole_answer() -> None:
    closed, sent = [], []

    async def body() -> AsyncIterator[bytes]:
        yield b"a"
        yield b"b"

    async def on_close() -> None:
        closed.append(True)

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(10)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message.get("body", b""))

    answer = ProxiedAnswer(body(), 200, {}, on_close)
    scope = {"type": "http", "asgi": {"spec_version": "2.3"}, "method": "POST"}  # uvicorn's h11
    asyncio.run(asyncio.wait_for(answer(scope, receive, send), 5))
    assert closed == [True] and b"".join(sent) == b"ab"
