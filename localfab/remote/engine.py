"""`RemoteEngine`: a llama-server-like server (llama-server, `localfab serve`) driven token for
token, so that a chat session runs over it as over a model loaded here.

The prompt is built here with the server's own chat template (`/props`) and its tokenizer
(`/tokenize`, cached), and sent as token ids to `/completion`: the window, the shift of whole old
turns and the continuation of a cut reply work exactly as locally, and the server reuses its
cached prefix. A thinking model's reasoning and a reply's tool calls are split out of the text
here, by the same steps the local engine uses. The server's KV cache is its own: the engine
cannot shift it (`can_shift` is False; a moved window is processed again there).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

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
from localfab.errors import ContextOverflow, UsageError
from localfab.remote.client import NotLlamaServer, Remote, RemoteClient, RemoteError

TOKENIZE_CACHE = 4096  # texts whose tokens are kept (a prompt is rendered in many pieces)


@dataclass(frozen=True)
class ServerFacts:
    """What a llama-server-like server says of itself (`/props`, `/v1/models`)."""

    n_ctx: int
    chat_template: str | None
    bos_text: str
    eos_text: str
    model: str  # the model it serves, as it names it
    build: str = ""
    slots: int = 1


def read_facts(client: RemoteClient) -> ServerFacts:
    """The server's context, template and special tokens; a RemoteError where it is not a
    llama-server-like server (it has no `/props` with a context size)."""
    try:
        props = client.get("/props")
    except RemoteError as exc:
        if exc.status in (404, 405) or (exc.status == 0 and "not JSON" in str(exc)):
            raise NotLlamaServer(
                f"{client.remote.label} has no llama-server /props endpoint: it is not a "
                "llama-server or `localfab serve`",
                status=exc.status,
            ) from exc
        raise
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    if not isinstance(n_ctx, int) or n_ctx <= 0:
        raise NotLlamaServer(
            f"{client.remote.label}'s /props says no context size: is it a llama-server?"
        )
    model = str(props.get("model_alias") or "") or _model_file(str(props.get("model_path", "")))
    return ServerFacts(
        n_ctx=n_ctx,
        chat_template=props.get("chat_template") or None,
        bos_text=str(props.get("bos_token") or ""),
        eos_text=str(props.get("eos_token") or ""),
        model=model,
        build=str(props.get("build_info") or ""),
        slots=int(props.get("total_slots") or 1),
    )


def _model_file(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


class RemoteEngine:
    """A ChatEngine and a Tokenizer over a llama-server-like server (module docstring)."""

    can_shift = False
    n_threads = 0
    architecture = ""

    def __init__(self, client: RemoteClient, facts: ServerFacts) -> None:
        self.client = client
        self.facts = facts
        self.n_ctx = facts.n_ctx
        self._tokens: OrderedDict[tuple[str, bool, bool], list[int]] = OrderedDict()
        self._pieces: dict[int, bytes] = {}
        self.bos_token = self._single(facts.bos_text)
        self.eos_token = self._single(facts.eos_text)
        probe = self.tokenize("a", add_special=True, parse_special=False)
        self.add_bos = self.bos_token >= 0 and bool(probe) and probe[0] == self.bos_token

    @classmethod
    def connect(cls, remote: Remote) -> RemoteEngine:
        client = RemoteClient(remote)
        try:
            return cls(client, read_facts(client))
        except BaseException:
            client.close()
            raise

    def close(self) -> None:
        self.client.close()

    # --- the tokenizer -------------------------------------------------------------------------

    def _single(self, text: str) -> int:
        if not text:
            return -1
        tokens = self.tokenize(text, add_special=False, parse_special=True)
        return tokens[0] if len(tokens) == 1 else -1

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        key = (text, add_special, parse_special)
        cached = self._tokens.get(key)
        if cached is not None:
            self._tokens.move_to_end(key)
            return list(cached)
        reply = self.client.post(
            "/tokenize",
            {
                "content": text,
                "add_special": add_special,
                "parse_special": parse_special,
                "with_pieces": True,
            },
        )
        tokens: list[int] = []
        for item in reply.get("tokens", []) if isinstance(reply, dict) else []:
            if isinstance(item, dict):
                piece = item.get("piece", "")
                token = int(item["id"])
                self._pieces[token] = (
                    piece.encode("utf-8") if isinstance(piece, str) else bytes(piece)
                )
            else:
                token = int(item)
            tokens.append(token)
        self._tokens[key] = tokens
        if len(self._tokens) > TOKENIZE_CACHE:
            self._tokens.popitem(last=False)
        return list(tokens)

    def token_bytes(self, token: int, *, special: bool = True) -> bytes:
        if token < 0:  # no such token (a server whose model has no BOS or EOS)
            return b""
        piece = self._pieces.get(token)
        if piece is None:
            reply = self.client.post("/detokenize", {"tokens": [token]})
            piece = str(reply.get("content", "")).encode("utf-8")
            self._pieces[token] = piece
        return piece

    def token_text(self, token: int) -> str:
        if token == self.bos_token and self.facts.bos_text:
            return self.facts.bos_text
        if token == self.eos_token and self.facts.eos_text:
            return self.facts.eos_text
        return self.token_bytes(token).decode("utf-8", errors="replace")

    def chat_template(self) -> str | None:
        return self.facts.chat_template

    # --- generation ----------------------------------------------------------------------------

    def evaluate(self, tokens: Sequence[int]) -> int:
        """Nothing to do ahead here: the server processes the prompt with the next reply
        (and reuses what its slot still holds)."""
        return 0

    def shift_to(self, target: Sequence[int]) -> tuple[int, int]:
        return 0, 0

    def stream(
        self, prompt: Sequence[int], options: GenerationOptions | None = None
    ) -> Iterator[TokenEvent | Done]:
        """Generate after `prompt` on the server; the same events as the local engine's."""
        options = options or GenerationOptions()
        if not prompt:
            raise UsageError("the prompt is empty")
        if len(prompt) >= self.n_ctx:
            raise ContextOverflow(len(prompt), self.n_ctx)
        return _RemoteReply(self, list(prompt), options).run()


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


_FINISH: dict[str, tuple[FinishReason, StopType]] = {
    "eos": ("stop", "eos"),
    "word": ("stop", "word"),
    "limit": ("length", "limit"),
}


class _RemoteReply:
    """One reply streamed from the server, re-asked after a window that filled and moved."""

    def __init__(self, engine: RemoteEngine, prompt: list[int], options: GenerationOptions):
        self.engine = engine
        self.prompt = prompt
        self.n_prompt = len(prompt)
        self.opts = options
        self.generated: list[int] = []
        self.texts: list[str] = []
        self.thought = ThoughtStep(options.thinking) if options.thinking is not None else None
        self.tools = ToolStep(options.tools) if options.tools is not None else None
        self.t_start = time.perf_counter()
        self.t_first = 0.0
        self.timings: dict[str, Any] = {}
        self.stopping_word = ""

    def run(self) -> Iterator[TokenEvent | Done]:
        opts, cancel = self.opts, self.opts.cancel or threading.Event()
        finish: tuple[FinishReason, StopType] = ("length", "limit")
        while True:
            room = self.engine.n_ctx - len(self.prompt) - 1
            left = -1 if opts.max_tokens < 0 else opts.max_tokens - len(self.generated)
            n_predict = room if left < 0 else min(left, room)
            stop_type = ""
            for chunk in self.engine.client.events("/completion", self._body(n_predict), cancel):
                event = self._take(chunk)
                if event is not None:
                    yield event
                if chunk.get("stop") is True:
                    stop_type = str(chunk.get("stop_type") or "limit")
                    self.timings = chunk.get("timings") or {}
                    self.stopping_word = str(chunk.get("stopping_word") or "")
            if cancel.is_set():
                finish = ("cancelled", "cancel")
                break
            finish = _FINISH.get(stop_type, ("length", "limit"))
            full = stop_type == "limit" and (left < 0 or left > room)
            if not full:
                break
            moved = opts.on_context_full(list(self.generated)) if opts.on_context_full else None
            if moved is None:
                finish = ("length", "context")
                break
            self.prompt = list(moved)  # the window moved: the reply goes on after it
        yield from self._finish(*finish)

    def _body(self, n_predict: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": self.prompt + self.generated if self.generated else self.prompt,
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

    def _take(self, chunk: dict[str, Any]) -> TokenEvent | None:
        tokens = [int(t) for t in chunk.get("tokens") or ()]
        text = str(chunk.get("content") or "")
        if not tokens and not text:
            return None
        if not self.t_first:
            self.t_first = time.perf_counter()
        self.generated.extend(tokens)
        self.texts.append(text)
        token = tokens[-1] if tokens else (self.generated[-1] if self.generated else -1)
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
        thought, tools = self.thought, self.tools
        last = self.generated[-1] if self.generated else -1
        if thought is not None or tools is not None:
            parts: tuple[tuple[str, str], ...] = thought.finish("") if thought else ()
            calls: tuple[Any, ...] = ()
            if tools is not None:
                parts, calls = tools.take(parts, final=True)
            if parts or calls:
                yield TokenEvent(last, "", None, parts, calls)
        t = self.timings
        now = time.perf_counter()
        t_first = self.t_first or now
        n_cached = int(t.get("cache_n", 0) or 0)
        timings = Timings(
            cache_n=n_cached,
            prompt_n=int(t.get("prompt_n", self.n_prompt - n_cached) or 0),
            prompt_ms=float(t.get("prompt_ms", 0.0) or 0.0),
            predicted_n=int(t.get("predicted_n", len(self.generated)) or 0),
            predicted_ms=float(t.get("predicted_ms", (now - t_first) * 1e3) or 0.0),
            ttft_ms=(t_first - self.t_start) * 1e3,
        )
        done = Done(
            text="".join(self.texts),
            finish_reason=finish,
            stop_type=stop_type,
            tokens=tuple(self.generated),
            timings=timings,
            prompt_tokens=self.n_prompt,
            stopping_word=self.stopping_word,
        )
        if thought is not None:
            split = thought.split
            done = replace(
                done,
                reasoning=split.reasoning,
                content=split.content,
                reasoning_tokens=thought.n_reasoning,
                in_reasoning=split.state == "reasoning",
            )
        if tools is not None:
            done = replace(done, content=tools.parser.content, tool_calls=tuple(tools.parser.calls))
        yield done


def connect(remote: Remote) -> Any:
    """The engine for `remote`: token for token where it is a llama-server (or `localfab
    serve`), else through its OpenAI chat API (`chat_api.ChatApiEngine`)."""
    from localfab.remote.chat_api import ChatApiEngine

    try:
        return RemoteEngine.connect(remote)
    except NotLlamaServer:
        return ChatApiEngine.connect(remote)
