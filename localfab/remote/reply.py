"""One reply streamed from a llama-server-like server (`/completion` with token ids), with the
same events and `Done` as the local engine's, re-asked after the window filled and moved."""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from localfab.engine.steps import held_back, split_done
from localfab.engine.thought import ThoughtStep
from localfab.engine.toolcalls import ToolStep
from localfab.engine.types import (
    Done,
    FinishReason,
    GenerationOptions,
    SamplingParams,
    StopType,
    Timings,
    TokenEvent,
)
from localfab.remote.client import MAX_REPLY_CHARS, too_long

if TYPE_CHECKING:
    from localfab.remote.client import RemoteClient


class Server(Protocol):
    """What a reply needs of the engine it streams from (`engine.RemoteEngine`)."""

    client: RemoteClient
    n_ctx: int

    def settle(self, tokens: list[int], text: str) -> list[int]: ...


FINISH: dict[str, tuple[FinishReason, StopType]] = {
    "eos": ("stop", "eos"),
    "word": ("stop", "word"),
    "limit": ("length", "limit"),
}


def sampling_fields(sampling: SamplingParams) -> dict[str, Any]:
    """A request's sampling settings in llama-server's `/completion` fields."""
    fields: dict[str, Any] = {
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "min_p": sampling.min_p,
        "repeat_penalty": sampling.repeat_penalty,
        "repeat_last_n": sampling.repeat_last_n,
        "frequency_penalty": sampling.frequency_penalty,
        "presence_penalty": sampling.presence_penalty,
        "seed": sampling.seed,
        "ignore_eos": sampling.ignore_eos,
    }
    # A lazy grammar (tool calls the model may or may not make) is left out: not every such
    # server takes its triggers, and a grammar held from the first token would force a call.
    # The reply's calls are still read from its text.
    if sampling.grammar and not sampling.grammar_triggers:
        fields["grammar"] = sampling.grammar
    if sampling.logit_bias:
        fields["logit_bias"] = [[tok, bias] for tok, bias in sampling.logit_bias]
    return fields


class RemoteReply:
    """See the module's docstring; `run` is the stream."""

    def __init__(self, engine: Server, prompt: list[int], options: GenerationOptions):
        self.engine = engine
        self.prompt = prompt
        self.opts = options
        self.generated: list[int] = []  # the reply's ids, spelling `texts` exactly
        self.texts: list[str] = []
        self.size = 0  # characters in `texts`
        self.thought = ThoughtStep(options.thinking) if options.thinking is not None else None
        self.tools = ToolStep(options.tools) if options.tools is not None else None
        self.t_start = time.perf_counter()
        self.t_first = 0.0
        self.timings: dict[str, Any] = {}
        self.stopping_word = ""

    def run(self) -> Iterator[TokenEvent | Done]:
        """Stream the reply; when the server's window fills before the reply ends, ask the
        session for a moved window (as the local engine does) and go on after it."""
        opts, cancel = self.opts, self.opts.cancel or threading.Event()
        sent = self.prompt  # what the server's slot holds before this request's reply
        while True:
            room = self.engine.n_ctx - len(sent) + 1  # tokens until the window is full
            left = -1 if opts.max_tokens < 0 else opts.max_tokens - len(self.generated)
            n_predict = room if left < 0 else min(left, room)
            stop_type, got = yield from self._request(sent, n_predict, cancel)
            if not stop_type and cancel.is_set():
                finish: tuple[FinishReason, StopType] = ("cancelled", "cancel")
                break
            finish = FINISH.get(stop_type, ("length", "limit"))
            if not (stop_type == "limit" and n_predict == room and got >= room):
                break  # the reply ended, or max_tokens (or the server's own cap) ended it
            moved = opts.on_context_full(list(self.generated)) if opts.on_context_full else None
            if moved is None or len(moved) + 1 >= self.engine.n_ctx:
                finish = ("length", "context")
                break
            # The window moved: the slot is to hold `moved`, then the last token read.
            sent = list(moved) + self.generated[-1:]
        yield from self._finish(*finish)

    def _request(
        self, sent: list[int], n_predict: int, cancel: threading.Event
    ) -> Generator[TokenEvent, None, tuple[str, int]]:
        """One /completion: its events as they come; returns its stop type ("" when it never
        said: cancelled) and how many tokens it predicted. Its tokens join `generated`."""
        stop_type, ids, texts, predicted = "", [], [], 0
        body = self._body(sent, n_predict)
        for chunk in self.engine.client.events("/completion", body, cancel):
            ids += [int(t) for t in chunk.get("tokens") or ()]
            if len(ids) > MAX_REPLY_CHARS:  # a token spells a character or more
                raise too_long(self.engine.client.remote.label, "a reply", MAX_REPLY_CHARS)
            text = str(chunk.get("content") or "")
            if text:
                texts.append(text)
                yield self._event(text, ids)
            if chunk.get("stop") is True:
                stop_type = str(chunk.get("stop_type") or "limit")
                self.timings = chunk.get("timings") or {}
                self.stopping_word = str(chunk.get("stopping_word") or "")
                predicted = int(chunk.get("tokens_predicted") or len(ids))
        self.generated += self.engine.settle(ids, "".join(texts))
        return stop_type, predicted or len(ids)

    def _body(self, prompt: list[int], n_predict: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": prompt,
            "n_predict": n_predict,
            "stream": True,
            "return_tokens": True,
            "cache_prompt": True,
            "stop": list(self.opts.stop),
            **sampling_fields(self.opts.sampling),
        }
        if self.engine.client.remote.model:
            body["model"] = self.engine.client.remote.model
        return body

    def _event(self, text: str, ids: list[int]) -> TokenEvent:
        if not self.t_first:
            self.t_first = time.perf_counter()
        self.size += len(text)
        if self.size > MAX_REPLY_CHARS:
            raise too_long(self.engine.client.remote.label, "a reply", MAX_REPLY_CHARS)
        self.texts.append(text)
        token = ids[-1] if ids else -1
        thought, tools = self.thought, self.tools
        if thought is None and tools is None:
            return TokenEvent(token, text)
        parts: tuple[tuple[str, str], ...] = (
            thought.take(text, whole=True) if thought else (("content", text),)
        )
        if tools is None:
            return TokenEvent(token, text, None, parts)
        split, calls = tools.take(parts)
        return TokenEvent(token, text, None, split, calls)

    def _finish(self, finish: FinishReason, stop_type: StopType) -> Iterator[TokenEvent | Done]:
        parts, calls = held_back(self.thought, self.tools, "")
        if parts or calls:
            yield TokenEvent(self.generated[-1] if self.generated else -1, "", None, parts, calls)
        done = Done(
            text="".join(self.texts),
            finish_reason=finish,
            stop_type=stop_type,
            tokens=tuple(self.generated),
            timings=self._timings(),
            prompt_tokens=len(self.prompt),
            stopping_word=self.stopping_word,
        )
        yield split_done(done, self.thought, self.tools)

    def _timings(self) -> Timings:
        """The server's timings of the last request, TTFT as measured here."""
        t, now = self.timings, time.perf_counter()
        t_first = self.t_first or now
        n_cached = int(t.get("cache_n", 0) or 0)
        return Timings(
            cache_n=n_cached,
            prompt_n=int(t.get("prompt_n", len(self.prompt) - n_cached) or 0),
            prompt_ms=float(t.get("prompt_ms", 0.0) or 0.0),
            predicted_n=int(t.get("predicted_n", len(self.generated)) or 0),
            predicted_ms=float(t.get("predicted_ms", (now - t_first) * 1e3) or 0.0),
            ttft_ms=(t_first - self.t_start) * 1e3,
        )
