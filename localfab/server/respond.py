"""Running a request's generations on the engine thread and answering in a dialect.

A request holds one prompt or several, and asks for `n` results of each: every result is its
own job in the engine's queue, submitted together so they run back to back (the second of `n`
takes the prompt from the cache). Non-streamed, the answer comes once all results are done;
streamed, each result's chunks follow the previous result's, each with its `index`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from localfab.engine.types import Done, TokenProbs
from localfab.server import shapes, streams
from localfab.server.chat_window import ChatWindow
from localfab.server.dialects import Dialect
from localfab.server.errors import ApiError
from localfab.server.jobs import Job, Progress, Step
from localfab.server.params import Generation, generation_settings
from localfab.server.plumbing import (
    DISCONNECTED,
    Channel,
    EventStream,
    error_response,
    json_response,
    watch_disconnect,
)

if TYPE_CHECKING:
    from localfab.server.state import Server

# The most results one request may ask for (prompts x n): each is a queued job.
MAX_RESULTS = 256


@dataclass
class Prompt:
    """One prompt of a request; a chat's `window` fits it by whole turns."""

    tokens: list[int]
    window: ChatWindow | None = None


@dataclass
class _Result:
    """One job of a request and the channel its events come back on."""

    job: Job
    channel: Channel
    reply: shapes.ResultMeta
    tokens: list[int]
    probs: list[tuple[int, TokenProbs]] = field(default_factory=list)

    def placed(self) -> shapes.ResultMeta:
        """The reply's shared fields with the slot the job ran on (known once it is done)."""
        return replace(self.reply, slot=self.job.placed[0], shifted=self.job.shifted[0])


class _Batch:
    """The jobs of one request: submitted together, cancelled together."""

    def __init__(self, server: Server, results: list[_Result]) -> None:
        self.server = server
        self.results = results
        self.watcher: asyncio.Task[None] | None = None

    def cancel(self) -> None:
        for res in self.results:
            res.job.cancel.set()

    def on_disconnect(self) -> None:
        self.cancel()
        for res in self.results:
            res.channel.queue.put_nowait(DISCONNECTED)

    async def close(self) -> None:
        self.cancel()
        if self.watcher is not None:
            self.watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.watcher


def _check_count(n_prompts: int, gen: Generation) -> None:
    if n_prompts * gen.n_cmpl > MAX_RESULTS:
        raise ApiError(
            f"this request asks for {n_prompts * gen.n_cmpl} results ({n_prompts} prompts x "
            f"n = {gen.n_cmpl}); at most {MAX_RESULTS} are served per request: split it into "
            "several requests"
        )


def _copy_window(window: ChatWindow | None) -> ChatWindow | None:
    """A window of its own for each of `n` results: a reply may make it leave turns out."""
    if window is None:
        return None
    copy = ChatWindow.__new__(ChatWindow)
    copy.__dict__.update(window.__dict__)
    copy.left_out = dict(window.left_out)
    return copy


async def respond(
    server: Server,
    request: Request,
    prompts: Sequence[Prompt],
    gen: Generation,
    dialect: Dialect,
) -> Response:
    """Queue every result of the request and answer in `dialect`."""
    if not prompts:
        raise ApiError('"prompt" must not be empty')
    _check_count(len(prompts), gen)
    for prompt in prompts:
        server.check_prompt(prompt.tokens)
    server.check_bias(gen)
    results = _results(server, prompts, gen)
    batch = _Batch(server, results)
    for res in results:
        server.worker.submit(res.job)
    kept = getattr(request.state, "stream_session", None) if gen.stream else None
    if kept is None:
        batch.watcher = asyncio.create_task(watch_disconnect(request, batch.on_disconnect))
    else:  # a resumable stream: it outlives its client, and ends with the Stop
        batch.watcher = asyncio.create_task(streams.on_stop(kept, batch.on_disconnect))
    try:
        first = await results[0].channel.get()
    except BaseException:
        await batch.close()
        raise
    # As llama-server: an error before the first result is a plain error response.
    if first is DISCONNECTED or isinstance(first, ApiError):
        await batch.close()
        return error_response(first) if isinstance(first, ApiError) else Response(b"")
    if not gen.stream:
        try:
            return await _whole(server, batch, first, dialect)
        finally:
            await batch.close()
    return EventStream(_stream(batch, first, dialect), batch.close)


def _results(server: Server, prompts: Sequence[Prompt], gen: Generation) -> list[_Result]:
    """One job, its channel and its reply's shape for each of the `n` results of each prompt."""
    loop = asyncio.get_running_loop()
    completion_id = shapes.completion_id()
    params = generation_settings(gen, only_metrics=True)
    results: list[_Result] = []
    for prompt in prompts:
        job_group = server.worker.next_id()  # the `n` results of this prompt
        for j in range(gen.n_cmpl):
            window = prompt.window if j == 0 else _copy_window(prompt.window)
            channel = Channel(loop)
            job = Job(
                id=server.worker.next_id(),
                tokens=prompt.tokens,
                options=gen.options(),
                emit=channel.emit,
                cache_prompt=gen.cache_prompt,
                n_keep=gen.n_keep,
                window=window,
                params=params,
                return_progress=gen.return_progress and gen.stream,
                timings_per_token=gen.timings_per_token,
                t_max_predict_ms=gen.t_max_predict_ms,
                group=job_group if gen.n_cmpl > 1 else -1,
                id_slot=gen.id_slot,
            )
            reply = shapes.ResultMeta(
                id=completion_id,
                model=server.info.name if server.info else "",
                fingerprint=server.settings.build_info,
                n_prompt=len(prompt.tokens),
                index=len(results),
                context_shift=window.left_out if window is not None else None,
            )
            results.append(_Result(job, channel, reply, prompt.tokens))
    return results


async def _whole(server: Server, batch: _Batch, first: Any, dialect: Dialect) -> Response:
    answers = []
    item = first
    for i, res in enumerate(batch.results):
        if i > 0:
            item = await res.channel.get()
        while not isinstance(item, Done):
            if item is DISCONNECTED:
                return Response(b"")
            if isinstance(item, ApiError):
                return error_response(item)
            if isinstance(item, Step) and item.event.probs is not None:
                res.probs.append((item.event.token, item.event.probs))
            item = await res.channel.get()
        if item.stop_type == "word" and res.probs:
            # As llama-server: leave out the tokens of the stop string.
            stop = await server.tokenize(item.stopping_word, add_special=False, parse_special=False)
            del res.probs[max(0, len(res.probs) - len(stop)) :]
        answers.append(dialect.final(res.placed(), item, res.tokens, res.probs))
    return json_response(dialect.merge(answers))


async def _stream(batch: _Batch, first: Any, dialect: Dialect) -> AsyncIterator[bytes]:
    item = first
    for i, res in enumerate(batch.results):
        if i > 0:
            item = await res.channel.get()
        for chunk in dialect.start(res.reply):
            yield shapes.sse(chunk)
        n_decoded = 0
        while not isinstance(item, Done):
            if item is DISCONNECTED:
                return
            if isinstance(item, ApiError):
                yield shapes.sse({"error": item.payload()})
                return
            if isinstance(item, Progress):
                chunks = dialect.progress(res.reply, item)
            else:
                n_decoded += 1
                chunks = dialect.token(res.reply, item, n_decoded)
            for chunk in chunks:
                yield shapes.sse(chunk)
            item = await res.channel.get()
        for chunk in dialect.stream_end(res.placed(), item, res.tokens):
            yield shapes.sse(chunk)
    if dialect.done_event:
        yield dialect.done_event
