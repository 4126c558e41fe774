"""`ChatApiEngine`: a server that speaks only the OpenAI chat API (vLLM, SGLang, Ollama,
LM Studio, a hosted API), under the same chat session as a local model.

Such a server takes messages, not tokens, and keeps its tokenizer to itself. So the session's
prompt is built here with a template of this module's own, where each message is a marked turn
and one "token" is one character (`Chars`); the engine reads the turns back out of the prompt
and sends them as messages. The window is counted in characters, from the server's context in
tokens times `CHARS_PER_TOKEN` (a stated estimate: the model's own tokenizer is not known here),
and old turns leave it whole, as locally. A reply cut at the token limit is continued with vLLM's
`continue_final_message` where the server is vLLM; elsewhere the app says it cannot join the
text seamlessly. A thinking model's `reasoning_content` is its thought.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from localfab.engine.types import (
    Done,
    FinishReason,
    GenerationOptions,
    StopType,
    Timings,
    TokenEvent,
)
from localfab.errors import UsageError
from localfab.remote.client import (
    MAX_REPLY_CHARS,
    Remote,
    RemoteClient,
    RemoteError,
    ServerSideCache,
    too_long,
)

# Characters per token of the server's model, for the window (most tokenizers of 2026 average
# 3.5-4.5 characters of English per token: 3 leaves room).
CHARS_PER_TOKEN = 3
# The context assumed when the server says none (Ollama's default num_ctx).
DEFAULT_CONTEXT = 4096
ROLES = ("system", "user", "assistant", "tool")
SPECIAL_BASE = 0x110000  # past every Unicode code point
MARKS = tuple(f"<|lf:{role}|>" for role in ROLES) + ("<|lf:end|>",)
END = SPECIAL_BASE + len(ROLES)
TEMPLATE = (
    "{%- for m in messages -%}<|lf:{{ m.role }}|>{{ m.content }}<|lf:end|>{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|lf:assistant|>{%- endif -%}"
)
FINISH: dict[str, tuple[FinishReason, StopType]] = {
    "stop": ("stop", "eos"),
    "length": ("length", "limit"),
    "tool_calls": ("stop", "eos"),
    "content_filter": ("stop", "eos"),
}


@dataclass(frozen=True)
class ApiFacts:
    """What an OpenAI-compatible server says of itself."""

    model: str
    context: int  # tokens
    context_known: bool  # False: DEFAULT_CONTEXT, not the server's word
    vllm: bool  # it takes continue_final_message


def read_api_facts(client: RemoteClient) -> ApiFacts:
    """The model to ask for (the remote's, else the first the server lists), its context where
    the listing says it (vLLM's `max_model_len`, LM Studio's `max_context_length`), and whether
    the server is vLLM (`/version`)."""
    remote = client.remote
    listed = client.get("/v1/models")
    data = listed.get("data") if isinstance(listed, dict) else None
    models = (
        [m for m in data if isinstance(m, dict) and m.get("id")] if isinstance(data, list) else []
    )
    if not models and not remote.model:
        raise RemoteError(f"{remote.label} lists no models (/v1/models): name one with MODEL")
    # Ollama lists `llama3.2:latest` for `llama3.2`.
    wanted = (remote.model, f"{remote.model}:latest")
    chosen = next((m for m in models if m["id"] in wanted), None)
    names = ", ".join(str(m["id"]) for m in models[:8]) + (" ..." if len(models) > 8 else "")
    if remote.model and chosen is None and models:
        raise RemoteError(f"{remote.label} has no model {remote.model!r}; it serves: {names}")
    if not remote.model and len(models) > 1:
        raise RemoteError(f"{remote.label} serves several models: name one ({names})")
    entry = chosen or (models[0] if models else {})
    context = (
        entry.get("max_model_len") or entry.get("max_context_length") or entry.get("context_length")
    )
    try:
        version = client.get("/version")
        vllm = isinstance(version, dict) and "version" in version and len(version) <= 3
    except RemoteError:
        vllm = False
    if remote.context:
        context = remote.context  # the person's word wins where the server says none
    known = isinstance(context, int) and context > 0
    return ApiFacts(
        model=str(entry.get("id", "")) or remote.model,
        context=int(context) if known else DEFAULT_CONTEXT,  # type: ignore[arg-type]
        context_known=known,
        vllm=vllm,
    )


class ChatApiEngine(ServerSideCache):
    """A ChatEngine and a Tokenizer over a server's chat API (see the module's docstring)."""

    chars_per_token = CHARS_PER_TOKEN  # the window is counted in characters
    add_bos = False
    bos_token = -1
    eos_token = END

    def __init__(self, client: RemoteClient, facts: ApiFacts) -> None:
        self.client = client
        self.facts = facts
        self.n_ctx = facts.context * CHARS_PER_TOKEN
        self.slot_ctx = facts.context  # tokens, as the app shows the window
        self.continues = facts.vllm
        self.continue_problem = (
            f"{client.remote.label} cannot continue a reply seamlessly: its chat API has no "
            "raw completion of the prompt and no continue_final_message (vLLM's); regenerate, "
            "or ask it to go on"
        )

    @classmethod
    def connect(cls, remote: Remote) -> ChatApiEngine:
        client = RemoteClient(remote)
        try:
            return cls(client, read_api_facts(client))
        except BaseException:
            client.close()
            raise

    @property
    def window_note(self) -> str:
        """What the window's size rests on, for the load's notices."""
        if self.client.remote.context:
            how = f"{self.facts.context} tokens (as configured)"
        elif self.facts.context_known:
            how = f"{self.facts.context} tokens (the server's)"
        else:
            how = (
                f"{DEFAULT_CONTEXT} tokens (assumed: the server says none; set context in "
                "[remotes.NAME])"
            )
        return (
            f"{self.client.remote.label} speaks the OpenAI chat API only: the window is "
            f"estimated from {how} at {CHARS_PER_TOKEN} characters each"
        )

    def close(self) -> None:
        self.client.close()

    # --- the tokenizer: one character is one token; the turn marks are special ----------------

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        if not parse_special:
            return [ord(c) for c in text]
        out: list[int] = []
        i = 0
        while i < len(text):
            if text.startswith("<|lf:", i):
                mark = next((n for n, m in enumerate(MARKS) if text.startswith(m, i)), None)
                if mark is not None:
                    out.append(SPECIAL_BASE + mark)
                    i += len(MARKS[mark])
                    continue
            out.append(ord(text[i]))
            i += 1
        return out

    def token_bytes(self, token: int, *, special: bool = True) -> bytes:
        return self.token_text(token).encode("utf-8", "surrogatepass")

    def token_text(self, token: int) -> str:
        if token >= SPECIAL_BASE:
            return MARKS[token - SPECIAL_BASE] if token - SPECIAL_BASE < len(MARKS) else ""
        return chr(token) if token >= 0 else ""

    def chat_template(self) -> str:
        return TEMPLATE

    # --- generation -------------------------------------------------------------------------------

    def stream(
        self, prompt: Sequence[int], options: GenerationOptions | None = None
    ) -> Iterator[TokenEvent | Done]:
        options = options or GenerationOptions()
        if options.tools is not None:
            raise UsageError(
                f"tools through {self.client.remote.label}'s chat API are not supported yet: "
                "turn the chat's tools off (F5)"
            )
        if not any(t >= SPECIAL_BASE for t in prompt):
            raise UsageError(
                f"{self.client.remote.label} takes messages only (the OpenAI chat API): text "
                "completion (--raw) needs a llama-server or localfab serve"
            )
        messages, open_reply = read_turns(prompt)
        if not messages:
            raise UsageError("the prompt is empty")
        if open_reply and not self.continues:
            raise UsageError(self.continue_problem)
        return self._stream(messages, open_reply, len(prompt), options)

    def _body(
        self, messages: list[dict[str, str]], open_reply: bool, opts: GenerationOptions
    ) -> dict[str, Any]:
        s = opts.sampling
        body: dict[str, Any] = {
            "model": self.facts.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": s.temperature,
            "top_p": s.top_p,
        }
        if s.seed >= 0:
            body["seed"] = s.seed
        if s.frequency_penalty:
            body["frequency_penalty"] = s.frequency_penalty
        if s.presence_penalty:
            body["presence_penalty"] = s.presence_penalty
        if opts.max_tokens > 0:
            body["max_tokens"] = opts.max_tokens
        if opts.stop:
            body["stop"] = list(opts.stop)
        if open_reply:  # vLLM: the last message is the reply to go on with
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
        return body

    def _stream(
        self,
        messages: list[dict[str, str]],
        open_reply: bool,
        n_prompt: int,
        opts: GenerationOptions,
    ) -> Iterator[TokenEvent | Done]:
        cancel = opts.cancel or threading.Event()
        started = time.perf_counter()
        first = 0.0
        texts: list[str] = []
        thought: list[str] = []
        finish, usage = "", {}
        size = 0  # characters of text, thought and calls so far
        calls: dict[int, dict[str, str]] = {}
        body = self._body(messages, open_reply, opts)
        for chunk in self.client.events("/v1/chat/completions", body, cancel):
            if isinstance(chunk.get("usage"), dict):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                reasoning = str(delta.get("reasoning_content") or delta.get("reasoning") or "")
                content = str(delta.get("content") or "")
                finish = choice.get("finish_reason") or finish
                size += len(reasoning) + len(content) + _gather_calls(delta, calls)
                if size > MAX_REPLY_CHARS:
                    raise too_long(self.client.remote.label, "a reply", MAX_REPLY_CHARS)
                if not (reasoning or content):
                    continue
                first = first or time.perf_counter()
                parts = tuple(
                    (kind, text)
                    for kind, text in (("reasoning", reasoning), ("content", content))
                    if text
                )
                texts.append(content)
                thought.append(reasoning)
                last = ord(content[-1]) if content else -1
                yield TokenEvent(last, content, None, parts)
        if calls and not cancel.is_set():
            # No tools were offered (not through a chat API yet), so the calls are not run;
            # they stay in the reply as text, as a local model's unreadable call does.
            shown = ("\n\n" if any(texts) else "") + calls_text(calls.values())
            texts.append(shown)
            thought.append("")
            yield TokenEvent(ord(shown[-1]), shown, None, (("content", shown),))
        yield _done(texts, thought, finish, cancel.is_set(), usage, (started, first), n_prompt)


def _done(
    texts: list[str],
    thought: list[str],
    finish: str,
    cancelled: bool,
    usage: dict[str, Any],
    times: tuple[float, float],
    n_prompt: int,
) -> Done:
    """The reply's Done: its text and thought, why it ended (the server's `finish` reason,
    unless it was cancelled) and its timings from `times` (sent, first text; 0: none came)."""
    now = time.perf_counter()
    started, first = times
    text = "".join(texts)
    reason, stop_type = FINISH.get(finish, ("length", "limit"))
    if cancelled:
        reason, stop_type = "cancelled", "cancel"
    n_out = int(usage.get("completion_tokens") or 0) or max(1, len(text) // CHARS_PER_TOKEN)
    first = first or now
    timings = Timings(
        prompt_n=int(usage.get("prompt_tokens") or 0),
        prompt_ms=(first - started) * 1e3,
        predicted_n=n_out,
        predicted_ms=(now - first) * 1e3,
        ttft_ms=(first - started) * 1e3,
    )
    return Done(
        text=text,
        finish_reason=reason,
        stop_type=stop_type,
        tokens=tuple(ord(c) for c in text),
        timings=timings,
        prompt_tokens=n_prompt,
        reasoning="".join(thought) if any(thought) else None,
        content=text,
    )


def _gather_calls(delta: dict[str, Any], calls: dict[int, dict[str, str]]) -> int:
    """Add a delta's `tool_calls` pieces (OpenAI's stream: the name and id once, the
    arguments' text in pieces, by index) to `calls`; the characters they added."""
    added = 0
    pieces = delta.get("tool_calls")
    for n, piece in enumerate(pieces if isinstance(pieces, list) else ()):
        if not isinstance(piece, dict):
            continue
        index = piece.get("index", n)
        call = calls.setdefault(index if isinstance(index, int) else n, {"name": "", "args": ""})
        function = piece.get("function")
        if isinstance(function, dict):
            name, args = function.get("name"), function.get("arguments")
            if isinstance(name, str) and name:
                call["name"] += name
                added += len(name)
            if isinstance(args, str):
                call["args"] += args
                added += len(args)
    return added


def calls_text(calls: Iterable[dict[str, str]]) -> str:
    """The tool calls of a reply that asked for none, as a note each: a call is never dropped
    unseen, and one whose arguments are not JSON says so."""
    notes = []
    for call in calls:
        name = call["name"] or "(no name)"
        args = call["args"].strip() or "{}"
        try:
            json.loads(args)
            problem = ""
        except (ValueError, RecursionError):
            problem = "; its arguments are not valid JSON"
        notes.append(
            f"[tool call {name} {args}: not run{problem}; tools through a chat API are not "
            "supported yet]"
        )
    return "\n".join(notes)


def read_turns(prompt: Sequence[int]) -> tuple[list[dict[str, str]], bool]:
    """The messages a prompt of this module's template holds, and whether it ends inside an
    assistant reply with text (a continuation) rather than at a new one."""
    messages: list[dict[str, str]] = []
    role: str | None = None
    chars: list[str] = []
    for token in prompt:
        if token >= SPECIAL_BASE:
            mark = token - SPECIAL_BASE
            if mark < len(ROLES):
                role, chars = ROLES[mark], []
            elif role is not None:  # the end of a turn
                messages.append({"role": role, "content": "".join(chars)})
                role = None
        elif role is not None:
            chars.append(chr(token))
    open_reply = role == "assistant" and bool(chars)
    if open_reply:
        messages.append({"role": "assistant", "content": "".join(chars)})
    return messages, open_reply
